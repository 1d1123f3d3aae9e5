"""A gloo process group that records every message it carries: who sent how many elements to whom, by which operation.

``launch(fn, p, backend="gloo_recorded")`` (or ``init_process_group("gloo_recorded", ...)``) makes the default group
a :class:`RecordingProcessGroup`: a Python ``torch.distributed.ProcessGroup`` that forwards each operation to a real
``ProcessGroupGloo`` and appends one record to :data:`TRAFFIC` (a list per process). Because the group itself
records, every route to the wire is seen: ``dist.all_reduce``, ``torch.distributed.distributed_c10d.all_reduce``,
``group.allreduce(...)`` called on the group object, ``dist.isend``/``irecv``/``batch_isend_irecv``,
``send``/``recv``. (Wrapping the ``dist.*`` functions would miss the last routes.) Groups made with
``dist.new_group()`` use the same backend and record into the same list.

Each record is a dict: ``op`` (the group's method: ``"send"``, ``"recv"``, ``"allreduce"``, ``"all_to_all_single"``,
…), ``numel`` (elements of the tensors this rank contributes), ``dtype``, ``peer`` (for ``send``/``recv``: the
peer's rank, ``None`` for a receive from any source) and, for all-to-alls, ``input`` (a copy of the tensor sent)
and ``input_splits`` (rows sent to each rank; ``None`` for even splits).

**What the group cannot see.** A Python object holding the real gloo group is reachable from Python, however it is
stored (an attribute, a closure cell, the garbage collector's lists), so code can always find it and send through it
unrecorded. That route is caught one level lower, where code cannot avoid it: :func:`wire_bytes_sent` reads from the
kernel (Linux ``TCP_INFO``, ``tcpi_bytes_sent``) the bytes this process really sent on each TCP connection; the
launcher takes it before and after the rank's function (the rendezvous store's connection excluded) and unit 18's
checks compare it with what the recorded messages can account for (gloo's headers and algorithms included, with a
margin). Unrecorded traffic larger than that margin fails; traffic padded with recorded decoys, a connection opened
and closed inside the function, or a platform without ``TCP_INFO`` (then ``None``, the comparison skipped) is not
caught. :data:`BARRIERS` counts barriers (they carry no data and are not records).

Used by unit 18's checks to count what a rank really sent (the ring sends ``2(p−1)/p·n`` elements to its right
neighbour) and what an expert-parallel all-to-all carried. Communication semantics are gloo's, unchanged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["BACKEND", "BARRIERS", "TRAFFIC", "RecordingProcessGroup", "register", "sent_by_peer", "wire_bytes_sent"]

BACKEND = "gloo_recorded"

#: what this process's recording groups carried, in call order (cleared by :func:`reset`)
TRAFFIC: list[dict] = []


#: barriers this process's recording groups ran (one element: a list so that it is shared, not rebound)
BARRIERS: list[int] = [0]


def reset() -> None:
    TRAFFIC.clear()
    BARRIERS[0] = 0


_TCPI_BYTES_SENT = 200     # offset of tcpi_bytes_sent (u64) in Linux's struct tcp_info (include/uapi/linux/tcp.h, ≥ 4.19)


def wire_bytes_sent(exclude_port: int | None = None) -> dict[tuple[int, int], int] | None:
    """Bytes this process has sent on each of its connected TCP sockets, ``{(local port, peer port): bytes}``, read
    from the kernel (``getsockopt(TCP_INFO)``: ``tcpi_bytes_sent``, retransmissions included; on loopback there are
    none). Sockets with ``exclude_port`` (the rendezvous store's) at either end are left out. ``None`` where the
    platform has no ``TCP_INFO`` with that field (not Linux, or a kernel older than 4.19)."""
    import os
    import socket
    import struct

    if not hasattr(socket, "TCP_INFO") or not os.path.isdir("/proc/self/fd"):
        return None
    out: dict[tuple[int, int], int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            try:
                peer = sock.getpeername()[1]
            except OSError:          # a listening or unconnected socket
                continue
            if exclude_port is not None and exclude_port in (peer, sock.getsockname()[1]):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if len(info) < _TCPI_BYTES_SENT + 8:
                return None
            out[(sock.getsockname()[1], peer)] = struct.unpack_from("Q", info, _TCPI_BYTES_SENT)[0]
        except OSError:
            continue
        finally:
            sock.close()             # closes the duplicate descriptor only: the connection stays open
    return out


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _dtype(tensors) -> str | None:
    return str(tensors[0].dtype).replace("torch.", "") if tensors else None


def _record(op: str, contributed, **extra) -> None:
    ts = _tensors(contributed)
    TRAFFIC.append({"op": op, "numel": sum(t.numel() for t in ts), "dtype": _dtype(ts), "peer": None, **extra})


class RecordingProcessGroup(dist.ProcessGroup):
    """A ``ProcessGroup`` forwarding to ``ProcessGroupGloo(store, rank, size, timeout)`` and recording each call in
    :data:`TRAFFIC` (see the module docstring). CPU tensors only, as gloo."""

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        from torch._C._distributed_c10d import ProcessGroupGloo

        self._inner = ProcessGroupGloo(store, rank, size, timeout)
        self._rank_, self._size_ = rank, size

    def size(self):
        return self._size_

    def rank(self):
        return self._rank_

    def getBackendName(self):
        return BACKEND

    @property
    def group_name(self):
        return dist.distributed_c10d._world.pg_names[self]

    # -- point to point: the peer is known
    def send(self, tensors, dst, tag=0):
        TRAFFIC.append({"op": "send", "numel": sum(t.numel() for t in tensors), "dtype": _dtype(tensors),
                        "peer": int(dst)})
        return self._inner.send(tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        TRAFFIC.append({"op": "recv", "numel": sum(t.numel() for t in tensors), "dtype": _dtype(tensors),
                        "peer": int(src)})
        return self._inner.recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        _record("recv", tensors)
        return self._inner.recv_anysource(tensors, tag)

    # -- collectives: this rank's contribution
    def allreduce(self, tensors, *args, **kwargs):
        _record("allreduce", tensors)
        return self._inner.allreduce(tensors, *args, **kwargs)

    def allreduce_coalesced(self, tensors, *args, **kwargs):
        _record("allreduce", tensors)
        return self._inner.allreduce_coalesced(tensors, *args, **kwargs)

    def broadcast(self, tensors, *args, **kwargs):
        _record("broadcast", tensors)
        return self._inner.broadcast(tensors, *args, **kwargs)

    def reduce(self, tensors, *args, **kwargs):
        _record("reduce", tensors)
        return self._inner.reduce(tensors, *args, **kwargs)

    def allgather(self, outputs, inputs, *args, **kwargs):
        _record("allgather", inputs)
        return self._inner.allgather(outputs, inputs, *args, **kwargs)

    def allgather_coalesced(self, outputs, inputs, *args, **kwargs):
        _record("allgather", inputs)
        return self._inner.allgather_coalesced(outputs, inputs, *args, **kwargs)

    def all_gather_single(self, output, input, *args, **kwargs):  # noqa: A002 - torch's name
        _record("allgather", input)
        return self._inner._allgather_base(output, input, *args, **kwargs)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, *args, **kwargs):
        work = None
        for o, i in zip(outputs, inputs, strict=True):
            work = self.all_gather_single(o, i, *args, **kwargs)
            if work is not None:
                work.wait()
        return work

    def gather(self, outputs, inputs, *args, **kwargs):
        _record("gather", inputs)
        return self._inner.gather(outputs, inputs, *args, **kwargs)

    def scatter(self, outputs, inputs, *args, **kwargs):
        _record("scatter", inputs)
        return self._inner.scatter(outputs, inputs, *args, **kwargs)

    def reduce_scatter(self, outputs, inputs, *args, **kwargs):
        _record("reduce_scatter", inputs)
        return self._inner.reduce_scatter(outputs, inputs, *args, **kwargs)

    def reduce_scatter_single(self, output, input, *args, **kwargs):  # noqa: A002
        _record("reduce_scatter", input)
        return self._inner._reduce_scatter_base(output, input, *args, **kwargs)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, *args, **kwargs):
        work = None
        for o, i in zip(outputs, inputs, strict=True):
            work = self.reduce_scatter_single(o, i, *args, **kwargs)
            if work is not None:
                work.wait()
        return work

    def alltoall(self, outputs, inputs, *args, **kwargs):
        _record("all_to_all", inputs, input=[t.detach().clone() for t in inputs], input_splits=None)
        return self._inner.alltoall(outputs, inputs, *args, **kwargs)

    def all_to_all_single(self, output, input, output_splits, input_splits, *args, **kwargs):  # noqa: A002
        splits = [int(s) for s in input_splits] if input_splits else None
        _record("all_to_all_single", input, input=input.detach().clone(), input_splits=splits)
        return self._inner.alltoall_base(output, input, output_splits, input_splits, *args, **kwargs)

    alltoall_base = all_to_all_single

    def barrier(self, *args, **kwargs):
        BARRIERS[0] += 1
        return self._inner.barrier(*args, **kwargs)

    def monitored_barrier(self, *args, **kwargs):
        BARRIERS[0] += 1
        return self._inner.monitored_barrier(*args, **kwargs)


def _create(store, rank, size, timeout):
    return RecordingProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Make ``"gloo_recorded"`` a backend name (idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


def sent_by_peer(traffic: list[dict]) -> dict[int, int]:
    """Elements this rank sent point-to-point, per destination rank."""
    out: dict[int, int] = {}
    for rec in traffic:
        if rec["op"] == "send":
            out[rec["peer"]] = out.get(rec["peer"], 0) + rec["numel"]
    return out
