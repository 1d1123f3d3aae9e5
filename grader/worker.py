"""Learner code runs here, in a worker process of its own; the checker only ever sees plain data.

Two sides:

* **checker side** — :class:`LearnerProcess` starts one worker per exercise from a *forkserver*
  whose process has ``torch`` and ``llmcourse`` preloaded (forking it costs ≈ 20 ms, a fresh
  interpreter ≈ 1.5 s). The forkserver is a fresh interpreter, never a fork of the checker, so a
  worker's memory holds no expected values, fixtures or reference outputs. Requests go down a
  dedicated pipe as pickles made by the checker (trusted direction); replies come back up the same
  pipe as ``torch.save`` bytes read with ``torch.load(weights_only=True)`` (:mod:`grader.plain`).
  The worker's stdout and stderr are ``/dev/null``: nothing it prints can reach a verdict.
* **worker side** — :func:`serve`: blocks ``import grader.checks`` / ``grader.bugs`` (the modules
  that hold expected values), disables the exercise's own reference in ``llmcourse`` (see
  :func:`block_reference`), extracts the learner's definitions (imports/defs/classes, as
  :mod:`grader.extract` always did), then runs each probe it receives on them and replies with
  :func:`grader.plain.plain` of the result or an error record.

A worker that dies, hangs or runs out of memory (``RLIMIT_AS``; ``LLMCOURSE_WORKER_MEMORY_MB``,
default 4096 MiB above what the preloaded interpreter maps) fails that exercise with a message that
says so; the next exercise gets a fresh worker. Facts observed in the worker can only make a check
fail: every pass is decided by the checker on returned data.

Supervision (:mod:`grader.supervise`): a worker runs in its own session, as a child subreaper, as
``nobody`` when the grading runs as root (it cannot signal the checker or the forkserver), and dies
with the forkserver. The checker never blocks without a deadline: a stopped, killed or hung worker or
forkserver is detected while it waits; after every exercise the worker's session, its descendants and
any orphan under the forkserver are killed; a forkserver found stopped or dead is replaced and the
exercise scores 0 with "the submission stopped the grading process".
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import socket
import struct
import sys
import threading
import time
import types

import torch

from . import supervise as _supervise
from .core import (
    BLOCK_MARK,
    CheckFailure,
    Impl,
    LearnerError,
    NotAttempted,
    TimeLimitExceeded,
    blocked_reference,
)
from .extract import extract_namespace
from .forkserver import PRELOAD, start_forkserver  # noqa: F401 - re-exported
from .forkserver import context as _context
from .forkserver import healthy as _forkserver_healthy
from .forkserver import pid as _forkserver_pid
from .forkserver import replace as _replace_forkserver
from .forkserver import without_main as _without_main
from .plain import dumps, loads, plain

__all__ = ["LearnerProcess", "WorkerDied", "block_reference", "serve"]

MEMORY_ENV = "LLMCOURSE_WORKER_MEMORY_MB"
THREADS_ENV = "LLMCOURSE_WORKER_THREADS"
# "0": a worker keeps the grading user's identity even as root (tests of the supervision without the drop)
NOBODY_ENV = "LLMCOURSE_WORKER_NOBODY"
LOAD_TIME_LIMIT_S = 60.0
START_TIME_LIMIT_S = 120.0  # a fresh forkserver preloads torch first (seconds; more on a loaded machine)
NO_DEADLINE_S = 3600.0  # a request without a deadline of its own (direct use of LearnerProcess)
POLL_S = 0.25  # how often a waiting checker looks at the worker's and the forkserver's state
MAX_REPLY_BYTES = 512 * 1024 * 1024
_BLOCKED_PACKAGES = ("grader.checks", "grader.bugs")


class WorkerDied(CheckFailure):
    """The learner's process ended before answering (killed, out of memory, ``os._exit``)."""


# ============================================================================ checker side

def _register_checks_by_value() -> None:
    """Probes defined in grader.checks travel by value: the worker cannot import those modules."""
    import cloudpickle

    import grader.checks

    cloudpickle.register_pickle_by_value(grader.checks)


class LearnerProcess:
    """One worker process holding one learner's extracted definitions.

    Args:
        sources: the code cells of the notebook, in order.
        blocked: ``(module, qualname)`` of the course objects that are this exercise's answer.
        deadline: ``time.monotonic()`` value after which a pending request is abandoned.

    Supervised (:mod:`grader.supervise`): nothing here blocks without a deadline. Starting a worker
    has one (a stopped forkserver is killed and replaced); a request is sent and its reply read on a
    socket with timeouts, polling the worker's and the forkserver's state meanwhile; a reply framed
    wrongly (garbage written to the pipe) or over :data:`MAX_REPLY_BYTES` ends the worker. After the
    worker, everything it spawned is killed (:meth:`close`). ``harmed`` is True when the forkserver was
    found stopped or dead meanwhile: the checker then scores the exercise 0 with
    :data:`grader.supervise.STOPPED_NOTE`, and a fresh forkserver serves the next exercise.
    """

    _live: set[int] = set()  # pids of this process's live workers (spared when orphans are killed)

    def __init__(self, sources: list[str], blocked: list[tuple[str, str]] | None = None,
                 deadline: float | None = None):
        _register_checks_by_value()
        self.harmed = False
        self.deadline = deadline
        self._sock = None
        self._proc = None
        self._pid = None
        self._start()
        try:
            info = self._request({"op": "load", "sources": list(sources), "blocked": list(blocked or [])},
                                 timeout=LOAD_TIME_LIMIT_S)
        except BaseException:
            self.close()
            if self.harmed:
                raise WorkerDied(f"{_supervise.STOPPED_NOTE[0].upper()}{_supervise.STOPPED_NOTE[1:]} while your "
                                 "notebook was loaded.") from None
            raise
        self.problems = [str(p) for p in info.get("problems", [])] if isinstance(info, dict) else []

    # -- starting, with a deadline -------------------------------------------------------------
    def _start(self) -> None:
        if not _forkserver_healthy():
            _replace_forkserver()
        for attempt in range(2):
            start_forkserver()  # with this process's sys.path (see grader.forkserver); at once when running
            ctx = _context()
            conn, child = ctx.Pipe(duplex=True)
            settings = {"memory_mb": int(os.environ.get(MEMORY_ENV, "4096")),
                        "threads": int(os.environ.get(THREADS_ENV, "1")),
                        "nobody": os.environ.get(NOBODY_ENV, "1") != "0"}
            proc = ctx.Process(target=serve, args=(child, settings), daemon=True, name="llmcourse-learner")
            error: list[BaseException] = []

            def start(proc=proc, error=error):
                try:
                    with _without_main():
                        proc.start()
                except BaseException as exc:  # noqa: BLE001 - reported below
                    error.append(exc)

            thread = threading.Thread(target=start, daemon=True)
            thread.start()
            limit = time.monotonic() + START_TIME_LIMIT_S
            while thread.is_alive() and time.monotonic() < limit:
                thread.join(0.1)
                if thread.is_alive() and not _forkserver_healthy():
                    break
            if thread.is_alive() or error:
                # the forkserver never answered (stopped, dead, hung): kill it; the start fails with EOF
                _replace_forkserver()
                thread.join(5.0)
                child.close()
                conn.close()
                if attempt == 0:
                    continue
                raise WorkerDied("The grader could not start a process for your code (its forkserver did not "
                                 "answer).")
            child.close()
            self._proc, self._pid = proc, proc.pid
            LearnerProcess._live.add(proc.pid)
            self._sock = socket.socket(fileno=os.dup(conn.fileno()))
            self._sock.setblocking(False)
            conn.close()
            return

    # -- protocol ----------------------------------------------------------------------------
    def _limit(self, timeout: float | None) -> float:
        if timeout is not None:
            return time.monotonic() + timeout
        if self.deadline is not None:
            return max(self.deadline, time.monotonic() + 0.01)
        return time.monotonic() + NO_DEADLINE_S

    def _watch(self) -> None:
        """Between waits: a stopped worker is killed; a stopped or dead forkserver marks the exercise harmed."""
        if not _forkserver_healthy():
            self.harmed = True
        if _supervise.stopped(self._pid):
            self.close()
            raise WorkerDied(f"The process running your code was stopped (SIGSTOP?): {_supervise.STOPPED_NOTE}.")

    def _wait(self, until: float, write: bool = False) -> bool:
        """Poll the socket in short slices until it is ready (True) or ``until`` passes (False)."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return False
            r, w, _ = select.select([] if write else [self._sock], [self._sock] if write else [], [],
                                    min(left, POLL_S))
            if r or w:
                return True
            self._watch()

    def _send_frame(self, data: bytes, until: float) -> None:
        n = len(data)
        header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!i", -1) + struct.pack("!Q", n)
        view = memoryview(header + data)
        while view:
            if not self._wait(until, write=True):
                raise TimeoutError
            try:
                sent = self._sock.send(view[:1 << 20])
            except BlockingIOError:
                continue
            view = view[sent:]

    def _recv_exact(self, n: int, until: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if not self._wait(until):
                raise TimeoutError
            try:
                chunk = self._sock.recv(min(n - len(buf), 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def _recv_frame(self, until: float) -> bytes:
        (n,) = struct.unpack("!i", self._recv_exact(4, until))
        if n == -1:
            (n,) = struct.unpack("!Q", self._recv_exact(8, until))
        if n < 0 or n > MAX_REPLY_BYTES:
            raise _BadFrame
        return self._recv_exact(n, until)

    def _request(self, message: dict, timeout: float | None = None):
        if self._proc is None:
            raise WorkerDied("The process running your code had already stopped.")
        import cloudpickle

        until = self._limit(timeout)
        limit_s = timeout if timeout is not None else max(until - time.monotonic(), 0.0)
        try:
            self._send_frame(cloudpickle.dumps(message), until)
            data = self._recv_frame(until)
        except TimeoutError:
            self.close()
            raise TimeLimitExceeded(f"did not finish within {limit_s:.0f} s") from None
        except _BadFrame:
            self.close()
            raise CheckFailure("Your code wrote something into the grader's channel that is not a reply; it was "
                               "refused.") from None
        except (EOFError, OSError):
            raise self._died() from None
        try:
            reply = loads(data)
        except Exception:  # noqa: BLE001 - anything that is not plain data is refused
            self.close()  # the channel cannot be trusted any more
            raise CheckFailure("Your code sent back something that is not plain data; it was refused.") from None
        return _unpack(reply)

    def _died(self) -> WorkerDied:
        proc = self._proc
        if proc is not None and _forkserver_healthy():
            proc.join(2.0)  # its exit status comes from the forkserver
        code = proc.exitcode if proc is not None else None
        self.close()
        if code is not None and code < 0:
            import signal

            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            cause = f"it was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        elif code is not None:
            cause = f"it exited with status {code} (os._exit or sys.exit in your code?)"
        else:
            cause = "it stopped answering"
        return WorkerDied(f"The process running your code ended before answering: {cause}.")

    def call(self, probe):
        """Run ``probe(learner impl)`` in the worker; its result as plain data, or the learner's error."""
        import cloudpickle

        try:
            blob = cloudpickle.dumps(probe)
        except Exception as exc:  # a grader bug: a probe that captured something unpicklable
            raise RuntimeError(f"probe cannot be sent to the worker: {exc}") from exc
        return self._request({"op": "probe", "probe": blob})

    def close(self) -> None:
        """End the worker and kill everything it spawned: its session, its descendants, and any orphan left
        under the forkserver; replace the forkserver when it was stopped or killed meanwhile."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        pid = self._pid
        try:
            if _forkserver_healthy() and not _supervise.stopped(pid) and proc.is_alive():
                with contextlib.suppress(OSError):
                    self._sock.setblocking(False)
                    self._sock.send(struct.pack("!i", len(_EXIT)) + _EXIT)
                proc.join(0.2)
        except (OSError, ValueError):
            pass
        finally:
            LearnerProcess._live.discard(pid)
            with contextlib.suppress(OSError):
                self._sock.close()
            _supervise.kill_tree(pid, session=pid, include_root=True)
            fs = _forkserver_pid()
            if fs is not None:  # orphans re-parented to the forkserver (a subreaper)
                _supervise.kill_tree(fs, keep=LearnerProcess._live)
            if not _forkserver_healthy():
                self.harmed = True
                _replace_forkserver()
            else:
                proc.join(2.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class _BadFrame(Exception):
    pass


_EXIT = pickle.dumps({"op": "exit"})


def _unpack(reply):
    """Turn a reply record into a value or the matching exception (all fields plain strings)."""
    if not isinstance(reply, dict) or "ok" not in reply:
        raise CheckFailure("Your code's process sent back an unexpected reply.")
    if reply["ok"] is True:
        return reply.get("value")
    status = str(reply.get("status", "failed"))
    message = str(reply.get("message", ""))
    if status == "not_attempted":
        raise NotAttempted(message)
    if status == "learner_error":
        raise LearnerError("", message=message, etype=str(reply.get("etype", "")), etext=str(reply.get("etext", "")))
    if status == "probe_error":
        raise CheckFailure(f"While your code was being checked: {message}")
    bug_id = reply.get("bug_id")
    raise CheckFailure(message, bug_id=str(bug_id) if isinstance(bug_id, str) else None,
                       status=status if status in {"failed", "missing", "not_attempted"} else "failed")


# ============================================================================ worker side


class _GraderImportBlocker:
    """A meta-path finder that refuses the grader's check and bug modules inside the worker."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(_BLOCKED_PACKAGES):
            raise ImportError(f"{fullname} is not available to learner code")
        return None


def _isolate_io() -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def _limit_memory(extra_mb: int) -> None:
    try:
        import resource

        with open("/proc/self/status") as fh:
            vm = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:")), 0)
        limit = vm + extra_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError, ImportError):  # not Linux: no limit
        pass


def _raiser_code(nfree: int, label: str) -> types.CodeType:
    """A code object that raises the block error, with ``nfree`` free variables (to fit any closure)."""
    params = ", ".join(f"_f{i}" for i in range(nfree))
    uses = "".join(f"        _f{i}\n" for i in range(nfree))
    src = (f"def _outer({params}):\n    def _blocked(*args, **kwargs):\n{uses}"
           f"        raise RuntimeError({(BLOCK_MARK + ' ' + label)!r})\n    return _blocked\n")
    scope: dict = {}
    exec(compile(src, "<blocked>", "exec"), scope)  # noqa: S102 - our own constant source
    return scope["_outer"](*range(nfree)).__code__


def _block_function(fn, label: str) -> None:
    if isinstance(fn, types.FunctionType):
        fn.__code__ = _raiser_code(len(fn.__code__.co_freevars), label)


def _block_object(obj, label: str) -> None:
    if isinstance(obj, type):
        for value in list(vars(obj).values()):
            if isinstance(value, (staticmethod, classmethod)):
                _block_function(value.__func__, label)
            elif isinstance(value, property):
                for f in (value.fget, value.fset, value.fdel):
                    _block_function(f, label)
            else:
                _block_function(value, label)

        def _no_subclass(cls, **kwargs):
            raise RuntimeError(f"{BLOCK_MARK} {label}")

        obj.__init_subclass__ = classmethod(_no_subclass)
    else:
        _block_function(getattr(obj, "__wrapped__", None), label)
        _block_function(obj, label)


def _block_in(module, module_name: str, qualname: str) -> None:
    obj = module
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return
    _block_object(obj, f"{module_name}.{qualname}")


class _BlockOnImport:
    """A meta-path finder that blocks course objects of a module not imported yet, as soon as it is.

    Blocking a sibling in a module the forkserver did not preload (``llmcourse.viz.*`` pulls in
    matplotlib) would otherwise cost every worker that import; this way only a learner who imports
    the module pays for it, and gets the blocked objects.
    """

    def __init__(self):
        self.pending: dict[str, list[str]] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _BlockingLoader(spec.loader, self.pending.pop(fullname))
                return spec
        return None


class _BlockingLoader:
    """Wraps a module's loader: runs the module, then blocks the pending objects in it."""

    def __init__(self, loader, qualnames: list[str]):
        self._loader, self._qualnames = loader, qualnames

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for qualname in self._qualnames:
            _block_in(module, module.__name__, qualname)


_BLOCK_ON_IMPORT = _BlockOnImport()


def block_reference(module_name: str, qualname: str) -> None:
    """Make the course object ``module_name.qualname`` unusable in this process, under every alias.

    Functions get a code object that raises; a class gets every function in its body replaced the
    same way and an ``__init_subclass__`` that raises, so calling it, instantiating it, wrapping it,
    subclassing it or fetching it from ``sys.modules`` or ``gc`` all end in the same error, which
    :func:`grader.core.run_learner` reports as "uses the course library's own answer". A module that
    is not imported yet is not imported here: its objects are blocked when something imports it
    (:class:`_BlockOnImport`). ``qualname`` may name a method (``"Class.method"``).
    """
    module = sys.modules.get(module_name)
    if module is None:
        if _BLOCK_ON_IMPORT not in sys.meta_path:
            sys.meta_path.insert(0, _BLOCK_ON_IMPORT)
        _BLOCK_ON_IMPORT.pending.setdefault(module_name, []).append(qualname)
        return
    _block_in(module, module_name, qualname)


def _run_probe(probe, impl) -> dict:
    try:
        with torch.random.fork_rng():
            value = probe(impl)
            return {"ok": True, "value": plain(value)}
    except NotAttempted as exc:
        return {"ok": False, "status": "not_attempted", "message": exc.message}
    except LearnerError as exc:
        return {"ok": False, "status": "learner_error", "message": exc.message, "etype": exc.etype,
                "etext": exc.etext}
    except CheckFailure as exc:
        return {"ok": False, "status": exc.status, "message": exc.message, "bug_id": exc.bug_id}
    except MemoryError:
        return {"ok": False, "status": "failed", "message": "Your code ran out of memory."}
    except RecursionError:
        return {"ok": False, "status": "failed", "message": "Your code recursed too deeply (RecursionError)."}
    except BaseException as exc:  # noqa: BLE001 - the probe touched learner objects outside a guard
        if blocked_reference(exc) is not None:
            return {"ok": False, "status": "failed", "message": "Your code uses the course library's own answer to "
                    "this exercise; calling, wrapping or subclassing it is not allowed here; write your own."}
        text = str(exc).splitlines()[0][:300] if str(exc) else ""
        return {"ok": False, "status": "probe_error", "message": f"{type(exc).__name__}: {text}"}


def _encode(reply: dict) -> bytes:
    try:
        return dumps(reply)
    except Exception as exc:  # noqa: BLE001
        return dumps({"ok": False, "status": "probe_error", "message": f"the result could not be sent back "
                      f"({type(exc).__name__})"})


def _close_supervisor_fds() -> None:
    """Close what multiprocessing hands every forkserver child: the forkserver's "alive" pipe (data written
    to it ends the forkserver) and the resource tracker's pipe (garbage written to it ends the tracker)."""
    from multiprocessing import forkserver, resource_tracker

    for owner, attr in ((forkserver._forkserver, "_forkserver_alive_fd"), (resource_tracker._resource_tracker, "_fd")):
        fd = getattr(owner, attr, None)
        if isinstance(fd, int):
            with contextlib.suppress(OSError):
                os.close(fd)
            setattr(owner, attr, None)


def serve(conn, settings: dict) -> None:
    """The worker's main loop (runs in the forked process).

    First confined (:func:`grader.supervise.confine_worker`: own session, subreaper, ``nobody`` when
    root, death with the forkserver), before any learner code runs.
    """
    _supervise.confine_worker(parent=os.getppid(), drop=bool(settings.get("nobody", True)))
    _close_supervisor_fds()
    _isolate_io()
    _limit_memory(int(settings.get("memory_mb", 4096)))
    torch.set_num_threads(max(1, int(settings.get("threads", 1))))
    sys.meta_path.insert(0, _GraderImportBlocker())
    for name in [m for m in sys.modules if m.startswith(_BLOCKED_PACKAGES)]:
        del sys.modules[name]
    impl = None
    while True:
        try:
            request = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        op = request.get("op")
        if op == "exit":
            return
        if op == "load":
            for module_name, qualname in request.get("blocked", []):
                block_reference(module_name, qualname)
            try:
                extracted = extract_namespace(request["sources"])
                impl = Impl(extracted.namespace, learner=True, problems=extracted.problems)
                reply = {"ok": True, "value": {"problems": [str(p) for p in extracted.problems]}}
            except BaseException as exc:  # noqa: BLE001
                reply = {"ok": False, "status": "failed", "message": f"Your notebook could not be loaded "
                         f"({type(exc).__name__})."}
        elif op == "probe":
            if impl is None:
                reply = {"ok": False, "status": "probe_error", "message": "nothing loaded"}
            else:
                try:
                    probe = pickle.loads(request["probe"])
                except BaseException as exc:  # noqa: BLE001
                    reply = {"ok": False, "status": "probe_error", "message": f"probe not loadable: {exc}"}
                else:
                    reply = _run_probe(probe, impl)
        else:
            reply = {"ok": False, "status": "probe_error", "message": f"unknown request {op!r}"}
        try:
            conn.send_bytes(_encode(reply))
        except (BrokenPipeError, OSError):
            return

