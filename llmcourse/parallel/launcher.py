"""Start a function on ``N`` ranks of a real ``torch.distributed`` process group on this machine.

:func:`launch` is a tiny ``torchrun`` for notebooks, tests and checks: it starts ``world_size`` processes on
127.0.0.1, each joins one process group (``gloo`` on CPU) through a ``TCPStore`` that the caller holds on a
port the operating system chose (so two launches never race for a port), runs ``fn(rank, world_size,
*args)``, and sends back its return value, what it printed, and the collectives it called. It **never hangs**:
the caller waits with a deadline, the group's collectives carry the same timeout, and on expiry every rank that
is still running is killed (``SIGKILL``) and reported with the collective it was waiting in. A rank that raises
is reported with its rank and error; the others, stuck in a collective that can no longer complete, are
killed at the deadline or fail when their peer's socket closes.

Two start methods:

* ``"fork"`` (default on Linux): the ranks are forks of the caller, so ``fn`` may be any callable, also one
  defined in a notebook cell, and nothing is imported again (≈ 50 ms per launch). Made with ``os.fork``, so it
  also works inside a daemonic process (a grading worker); each rank asks Linux to kill it when its parent
  dies (``PR_SET_PDEATHSIG``).
* ``"spawn"`` (``torch.multiprocessing``; the default elsewhere): fresh interpreters, ``fn`` must be a
  module-level function of an importable module (a notebook can write one to a file), each rank imports torch
  again (seconds). This is how ``torchrun`` starts ranks, and the only method on macOS/Windows.

The same ``fn`` runs unchanged under ``torchrun --nnodes N --nproc_per_node 8`` with ``nccl``:
:func:`run_torchrun_entry` reads ``RANK``/``WORLD_SIZE`` from the environment torchrun sets.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

__all__ = ["COLLECTIVES", "RankFailure", "RankResult", "launch", "run_ranks", "free_port", "run_torchrun_entry"]

#: the ``torch.distributed`` functions whose calls each rank records (name, tensor shapes), in call order
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_single", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_single", "reduce_scatter_tensor", "broadcast", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter", "barrier",
               "send", "recv", "batch_isend_irecv")   # not isend/irecv: dist.P2POp checks their identity

_BOARD_SLOT = 240   # bytes per rank of the shared "pending collective" board


@dataclass
class RankResult:
    """What one rank sent back (or what is known about it when it sent nothing).

    Attributes:
        rank: the rank, ``0 … world_size−1``.
        value: ``fn``'s return value (``None`` on error).
        error: ``None``, or one line ``"<ExceptionType>: <message>"``, ``"killed by SIGKILL"``,
            ``"timed out after 20 s"``, ``"exited with status 3 before answering"``.
        traceback: the formatted traceback of a raised exception (``""`` otherwise).
        output: what the rank printed to ``sys.stdout``/``sys.stderr``.
        calls: the collectives it called, in order, e.g. ``["all_reduce(float32 (4, 8), op=SUM)"]``.
        pending: the collective it was inside when it failed or was killed (``None`` when none).
        traffic: with ``backend="gloo_recorded"``, what the rank's process groups carried (one dict per call:
            operation, elements, peer; :mod:`llmcourse.parallel.traffic`), else ``[]``. A group of another
            backend that ``fn`` made adds ``{"op": "unrecorded_group", ...}``.
        wire_sent: with ``backend="gloo_recorded"`` on Linux, the bytes this rank's process really sent on its TCP
            connections while ``fn`` ran (the rendezvous store's excluded; :func:`~.traffic.wire_bytes_sent`),
            whichever route they took; else ``None``.
        barriers: with ``backend="gloo_recorded"``, the barriers ``fn`` ran through the recording groups.
    """

    rank: int
    value: Any = None
    error: str | None = None
    traceback: str = ""
    output: str = ""
    calls: list[str] = field(default_factory=list)
    pending: str | None = None
    traffic: list[dict] = field(default_factory=list)
    wire_sent: int | None = None
    barriers: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        """One line: ``"rank 1: RuntimeError: … (inside all_reduce(float32 (4,), op=SUM))"``."""
        where = f" (inside {self.pending})" if self.pending else ""
        return f"rank {self.rank}: {self.error}{where}"


class RankFailure(RuntimeError):
    """Raised by :func:`run_ranks` when a rank failed; ``results`` holds every rank's :class:`RankResult`."""

    def __init__(self, results: list[RankResult]):
        self.results = results
        bad = [r for r in results if not r.ok]
        first = bad[0]
        tb = f"\n{first.traceback.rstrip()}" if first.traceback else ""
        super().__init__("; ".join(r.describe() for r in bad) + tb)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read the port, close). Another process may take
    it before you bind again: :func:`launch` avoids that race by holding its ``TCPStore`` open instead."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------ inside a rank


def _describe_arg(a) -> str:
    import torch

    if isinstance(a, torch.Tensor):
        return f"{str(a.dtype).replace('torch.', '')} {tuple(a.shape)}"
    if isinstance(a, (list, tuple)) and a and all(isinstance(x, torch.Tensor) for x in a):
        return f"[{len(a)} × {_describe_arg(a[0])}]"
    if isinstance(a, (list, tuple)):
        return repr(list(a)) if len(a) <= 8 else f"[{len(a)} items]"
    return repr(a)


def _describe_call(name: str, args, kwargs) -> str:
    parts = [_describe_arg(a) for a in args[:3]]
    for key in ("op", "src", "dst", "output_split_sizes", "input_split_sizes"):
        if key in kwargs and kwargs[key] is not None:
            value = kwargs[key]
            parts.append(f"{key}={str(value).replace('RedOpType.', '')}" if key == "op"
                         else f"{key}={_describe_arg(value)}")
    return f"{name}({', '.join(parts)})"


def _install_recorder(calls: list[str], board, rank: int) -> None:
    """Wrap the collectives of ``torch.distributed`` in this process: each call is appended to ``calls`` and
    written to the shared board while it runs (so the parent can say where a killed rank was waiting)."""
    import torch.distributed as dist

    def wrap(name, fn):
        def recorded(*args, **kwargs):
            text = _describe_call(name, args, kwargs)
            calls.append(text)
            _board_write(board, rank, f"{text} [call {len(calls)}]")
            out = fn(*args, **kwargs)      # on an exception the board keeps the call (the rank's report names it)
            _board_write(board, rank, "")
            return out
        recorded.__wrapped__ = fn
        recorded.__name__ = name
        recorded._llmcourse_recorded = True
        return recorded

    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "_llmcourse_recorded", False):
            setattr(dist, name, wrap(name, fn))


def _board_write(board, rank: int, text: str) -> None:
    data = text.encode()[: _BOARD_SLOT - 1]
    start = rank * _BOARD_SLOT
    board[start:start + _BOARD_SLOT] = data + b"\0" * (_BOARD_SLOT - len(data))


def _board_read(board, rank: int) -> str | None:
    start = rank * _BOARD_SLOT
    text = bytes(board[start:start + _BOARD_SLOT]).split(b"\0", 1)[0].decode(errors="replace")
    return text or None


def _rank_main(fn, rank: int, world_size: int, args: tuple, kwargs: dict, host: str, port: int, backend: str,
               timeout_s: float, threads: int, board, send: Callable[[bytes], None]) -> None:
    """Body of one rank: join the group, run ``fn``, send back a pickled :class:`RankResult` (never raises).

    The result is sent as soon as ``fn`` returns; then the rank waits for its peers in a barrier before it leaves
    the group (a rank that left early would break a peer still joining or in a collective with it)."""
    result = RankResult(rank)
    buffer = io.StringIO()
    joined = finished = False
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(max(1, threads))
        recording = backend == "gloo_recorded"
        if recording:
            import llmcourse.parallel.traffic as traffic

            traffic.register()
            traffic.reset()
        barrier = dist.barrier                    # the launcher's own barrier is not one of fn's calls
        _install_recorder(result.calls, board, rank)
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            if backend == "nccl":
                # one GPU per rank, chosen before the group exists (torchrun's LOCAL_RANK when set)
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count()))))
            store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=timeout_s))
            joined = True
            wire_before = traffic.wire_bytes_sent(exclude_port=port) if recording else None
            try:
                result.value = fn(rank, world_size, *args, **kwargs)
                finished = True
            finally:
                if wire_before is not None:
                    wire_after = traffic.wire_bytes_sent(exclude_port=port)
                    if wire_after is not None:
                        result.wire_sent = sum(n - wire_before.get(k, 0) for k, n in wire_after.items())
    except BaseException as exc:  # noqa: BLE001 - reported to the caller with the rank
        text = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ""
        result.error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        result.traceback = traceback.format_exc()
        result.pending = _board_read(board, rank)
        result.value = None
    result.output = buffer.getvalue()
    if joined and recording:
        result.traffic = _traffic_of_rank()
        result.barriers = traffic.BARRIERS[0]
    try:
        blob = pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable return value
        result.value, result.error = None, f"the return value could not be sent back ({type(exc).__name__}: {exc})"
        blob = pickle.dumps(result)
    send(blob)
    if joined:
        with contextlib.suppress(Exception):
            if finished:
                barrier()
            dist.destroy_process_group()


def _traffic_of_rank() -> list[dict]:
    """The recording groups' log, plus one entry per process group of another backend (its traffic is unseen)."""
    import torch.distributed as dist

    import llmcourse.parallel.traffic as traffic

    out = list(traffic.TRAFFIC)
    for pg in list(dist.distributed_c10d._world.pg_map):
        if not isinstance(pg, traffic.RecordingProcessGroup):
            out.append({"op": "unrecorded_group", "numel": 0, "dtype": None, "peer": None,
                        "backend": type(pg).__name__})
    return out


def _set_parent_death_signal() -> None:
    """Linux: die with SIGKILL when the parent dies (a killed grading worker leaves no ranks behind)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG = 1


def _spawn_entry(rank, fn, world_size, args, kwargs, host, port, backend, timeout_s, threads, board, conn):
    """Entry of a spawned rank (module level: ``torch.multiprocessing`` pickles it by name)."""
    _set_parent_death_signal()
    _rank_main(fn, rank, world_size, args, kwargs, host, port, backend, timeout_s, threads, board.get_obj(),
               conn.send_bytes)
    conn.close()


# ------------------------------------------------------------------------------------------------ the caller


def launch(fn: Callable, world_size: int = 2, *args, backend: str = "gloo", timeout_s: float = 30.0,
           start_method: str | None = None, threads: int = 1, **kwargs) -> list[RankResult]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` ranks of one process group.

    Each rank joins with ``torch.distributed.init_process_group(backend, store=..., rank, world_size,
    timeout=timeout_s)`` before ``fn`` runs and leaves it afterwards, so ``fn`` calls collectives
    (``dist.all_reduce``…) directly. ``fn``'s return value must pickle (tensors, numbers, lists, dicts).

    Args:
        fn: the rank's body; with ``start_method="spawn"`` a module-level function of an importable module.
        world_size: number of ranks ``p ≥ 1``.
        backend: ``"gloo"`` (CPU; every collective used in the course) or ``"nccl"`` (one GPU per rank).
        timeout_s: wall-clock budget of the whole launch (start-up included) and of each collective.
        start_method: ``"fork"`` or ``"spawn"``; ``None``: fork on Linux, spawn elsewhere.
        threads: ``torch.set_num_threads`` in each rank.

    Returns:
        one :class:`RankResult` per rank, in rank order; never raises for a rank's failure (see
        :func:`run_ranks` for the raising form).

    Raises:
        ValueError: ``world_size < 1``, ``timeout_s ≤ 0`` or an unknown ``start_method``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be ≥ 1, got {world_size}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if start_method is None:
        start_method = "fork" if sys.platform.startswith("linux") else "spawn"
    if start_method not in ("fork", "spawn"):
        raise ValueError(f"start_method must be 'fork' or 'spawn', got {start_method!r}")
    import torch.distributed as dist

    host = "127.0.0.1"
    deadline = time.monotonic() + timeout_s

    def make_store():
        # the caller holds the rendezvous store on a port the OS picked: no race for a "free port"
        return dist.TCPStore(host, 0, None, is_master=True, wait_for_workers=False,
                             timeout=timedelta(seconds=timeout_s))

    if start_method == "fork":
        # the store is made after the forks: its server thread must not exist when a rank is forked (a fork copies
        # whatever lock that thread holds at that instant, and the rank would wait on it forever)
        return _launch_fork(fn, world_size, args, kwargs, host, make_store, backend, timeout_s, threads, deadline)
    store = make_store()
    try:
        return _launch_spawn(fn, world_size, args, kwargs, host, store.port, backend, timeout_s, threads, deadline)
    finally:
        del store


def _finish(blobs: dict[int, bytes], world_size: int, board, exitcodes: dict[int, int | None],
            timed_out: set[int], timeout_s: float) -> list[RankResult]:
    results = []
    for rank in range(world_size):
        blob = blobs.get(rank)
        result = None
        if blob:
            try:
                result = pickle.loads(blob)
            except Exception as exc:  # noqa: BLE001
                result = RankResult(rank, error=f"its result could not be read ({type(exc).__name__})")
        if result is None:
            code = exitcodes.get(rank)
            if rank in timed_out:
                error = f"timed out after {timeout_s:g} s"
            elif code is not None and code < 0:
                try:
                    error = f"killed by {signal.Signals(-code).name}"
                except ValueError:
                    error = f"killed by signal {-code}"
            else:
                error = f"exited with status {code} before answering"
            result = RankResult(rank, error=error, pending=_board_read(board, rank))
        results.append(result)
    return results


def _launch_fork(fn, world_size, args, kwargs, host, make_store, backend, timeout_s, threads, deadline):
    import mmap

    board = mmap.mmap(-1, _BOARD_SLOT * world_size)      # anonymous, shared with the forked ranks
    pids, fds, port_fds = {}, {}, {}
    store = None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for rank in range(world_size):
            r, w = os.pipe()
            port_r, port_w = os.pipe()       # the store's port, sent once the store exists
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the rank (coverage does not follow forks)
                code = 0
                try:
                    os.close(r)
                    os.close(port_w)
                    for other in (*fds.values(), *port_fds.values()):
                        os.close(other)
                    _set_parent_death_signal()
                    got = b""
                    while len(got) < 8:
                        part = os.read(port_r, 8 - len(got))
                        if not part:
                            raise RuntimeError("the launcher closed before sending the store's port")
                        got += part
                    os.close(port_r)
                    port = int.from_bytes(got, "little")
                    import faulthandler

                    faulthandler.disable()    # a rank that aborts is reported as killed by SIGABRT, not with a dump

                    def send(blob, w=w):
                        view = memoryview(len(blob).to_bytes(8, "little") + blob)     # length-prefixed
                        while view:
                            n = os.write(w, view)
                            view = view[n:]

                    _rank_main(fn, rank, world_size, args, kwargs, host, port, backend, timeout_s, threads,
                               board, send)
                except BaseException:  # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
            os.close(w)
            os.close(port_r)
            pids[rank], fds[rank], port_fds[rank] = pid, r, port_w
        store = make_store()
        for rank, fd in list(port_fds.items()):
            os.write(fd, store.port.to_bytes(8, "little"))
            os.close(fd)
            del port_fds[rank]
        chunks: dict[int, bytearray] = {rank: bytearray() for rank in fds}
        open_fds = dict(fds)
        while open_fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select(list(open_fds.values()), [], [], remaining)
            for rank, fd in list(open_fds.items()):
                if fd in ready:
                    data = os.read(fd, 1 << 20)
                    chunks[rank] += data
                    buf = chunks[rank]
                    # done at end of file, or once the whole result arrived (the rank may still be waiting
                    # for its peers in the closing barrier: it is ended below)
                    if not data or (len(buf) >= 8 and len(buf) >= 8 + int.from_bytes(buf[:8], "little")):
                        del open_fds[rank]
        timed_out = set(open_fds)
        for rank in timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[rank], signal.SIGKILL)
        exitcodes = {rank: _reap(pid, 2.0) for rank, pid in pids.items()}
        blobs = {r: bytes(c[8:8 + int.from_bytes(c[:8], "little")]) for r, c in chunks.items()
                 if len(c) >= 8 and len(c) >= 8 + int.from_bytes(c[:8], "little")}
        return _finish(blobs, world_size, board, exitcodes, timed_out, timeout_s)
    finally:
        for pid in pids.values():        # never leave a rank behind (e.g. KeyboardInterrupt while waiting)
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
        for fd in (*fds.values(), *port_fds.values()):
            with contextlib.suppress(OSError):
                os.close(fd)
        board.close()
        del store


def _reap(pid: int, wait_s: float) -> int | None:
    """Exit code of a child (negative: killed by that signal); kills it when it has not ended within wait_s."""
    end = time.monotonic() + wait_s
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)


def _launch_spawn(fn, world_size, args, kwargs, host, port, backend, timeout_s, threads, deadline):
    from multiprocessing.connection import wait

    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    board_array = ctx.Array("c", _BOARD_SLOT * world_size)
    procs, conns = {}, {}
    try:
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_spawn_entry, args=(rank, fn, world_size, args, kwargs, host, port, backend,
                                                       timeout_s, threads, board_array, send), daemon=True)
            p.start()
            send.close()
            procs[rank], conns[rank] = p, recv
        blobs: dict[int, bytes] = {}
        waiting = dict(conns)
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready = wait(list(waiting.values()), remaining)
            for rank, conn in list(waiting.items()):
                if conn in ready:
                    try:
                        blobs[rank] = conn.recv_bytes()
                    except (EOFError, OSError):
                        pass
                    del waiting[rank]
        timed_out = set(waiting)
        exitcodes = {}
        for rank, p in procs.items():
            if rank in timed_out:
                p.kill()
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join()
            exitcodes[rank] = p.exitcode
        return _finish(blobs, world_size, board_array.get_obj(), exitcodes, timed_out, timeout_s)
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
                p.join()
        for conn in conns.values():
            conn.close()


def run_ranks(fn: Callable, world_size: int = 2, *args, **kwargs) -> list:
    """:func:`launch`, then the ranks' return values in rank order.

    Raises:
        RankFailure: when any rank raised, died or timed out; its message names each failed rank, its error
            and the collective it was inside, followed by the first failed rank's traceback.
    """
    results = launch(fn, world_size, *args, **kwargs)
    if any(not r.ok for r in results):
        raise RankFailure(results)
    return [r.value for r in results]


def run_torchrun_entry(fn: Callable, *args, backend: str | None = None, **kwargs):
    """Run ``fn(rank, world_size, *args)`` in a process started by ``torchrun`` (reads ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``/``MASTER_PORT`` from the environment torchrun sets). Backend: ``nccl`` when CUDA is
    available, else ``gloo``. Example script body::

        if __name__ == "__main__":
            run_torchrun_entry(my_fn)     # torchrun --nnodes 1 --nproc_per_node 2 script.py
    """
    import torch
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))     # before the group: NCCL binds to it
    dist.init_process_group(backend)
    try:
        return fn(dist.get_rank(), dist.get_world_size(), *args, **kwargs)
    finally:
        dist.destroy_process_group()
