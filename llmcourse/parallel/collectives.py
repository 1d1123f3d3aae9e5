"""Collectives: what each one computes, what it costs, and a ring all-reduce built from point-to-point messages.

Cost model (bandwidth term only; Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters
of workstations"; Thakur, Rabenseifner and Gropp 2005, "Optimization of collective communication operations in
MPICH"): with ``p`` ranks and a tensor of ``n`` bytes per rank, each rank **sends**

====================  =====================  ===========================================================
collective            bytes sent per rank    algorithm
====================  =====================  ===========================================================
reduce-scatter        ``(p−1)/p · n``        ring: ``p−1`` steps of one ``n/p`` chunk
all-gather            ``(p−1)/p · n``        ring (``n`` = the gathered size)
all-reduce            ``2(p−1)/p · n``       ring = reduce-scatter then all-gather
broadcast             ``n`` (pipelined)      from the root; ``(p−1)/p · n`` per non-root rank with scatter +
                                             all-gather (the root sends ``2(p−1)/p · n``)
all-to-all            ``(p−1)/p · n``        each rank keeps its own ``1/p`` (even splits)
====================  =====================  ===========================================================

The all-reduce volume tends to ``2n`` as ``p`` grows: the bandwidth term does not grow with the number of ranks.
The latency term does: a ring takes ``2(p−1)`` sequential steps, each paying a message's start-up latency ``α``
(α–β model: ``T = 2(p−1)·α + 2(p−1)/p·n·β``; the two terms are equal at ``n = p·α/β``). :func:`ring_all_reduce_schedule` plays the ring algorithm on a ``(p, n)`` table (the
widget's compute function); :func:`ring_all_reduce` runs it for real with ``dist.isend``/``dist.irecv``.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

__all__ = ["collective_bytes_per_rank", "ring_all_reduce_volume", "ring_all_reduce_schedule", "ring_all_reduce",
           "measure_all_reduce"]


def ring_all_reduce_volume(n: float, p: int) -> float:
    """Bytes (or elements) **sent by each rank** in a ring all-reduce of ``n`` per rank: ``2(p−1)/p · n``.

    Example: ``n = 4 MB``, ``p = 2`` → 4 MB; ``p = 8`` → 7 MB; ``p → ∞`` → 8 MB.

    Raises:
        ValueError: ``p < 1`` or ``n < 0``.
    """
    if p < 1 or n < 0:
        raise ValueError(f"need p ≥ 1 and n ≥ 0, got p={p}, n={n}")
    return 2 * (p - 1) / p * n


def collective_bytes_per_rank(name: str, n: float, p: int) -> float:
    """Bytes sent per rank by the bandwidth-optimal algorithm of collective ``name`` (table of the module
    docstring); ``n`` is the full tensor size per rank (for all-gather: the gathered output). For ``broadcast``
    (scatter + all-gather) the value holds for the **non-root** ranks; the root sends ``2(p−1)/p · n`` (its scatter
    of ``(p−1)/p · n``, then its part of the all-gather).

    Raises:
        ValueError: an unknown ``name`` (``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast``,
            ``all_to_all``), ``p < 1`` or ``n < 0``.
    """
    if p < 1 or n < 0:
        raise ValueError(f"need p ≥ 1 and n ≥ 0, got p={p}, n={n}")
    share = (p - 1) / p * n
    table = {"all_reduce": 2 * share, "reduce_scatter": share, "all_gather": share, "all_to_all": share,
             "broadcast": share}
    if name not in table:
        raise ValueError(f"unknown collective {name!r}; expected one of {sorted(table)}")
    return table[name]


def ring_all_reduce_schedule(x: Tensor) -> list[dict]:
    """Play a ring all-reduce (sum) on ``x`` of shape ``(p, n)`` (row ``r`` = rank ``r``'s tensor), ``n``
    divisible by ``p``; each row is cut into ``p`` chunks.

    Step ``s`` of the **reduce-scatter** phase (``s = 0 … p−2``): rank ``r`` sends chunk ``(r − s) mod p`` to
    rank ``r+1``, which adds it to its own copy. After ``p−1`` steps rank ``r`` holds the full sum of chunk
    ``(r+1) mod p``. The **all-gather** phase (``p−1`` more steps) passes the finished chunks around the ring,
    each rank overwriting its copy. Every step each rank sends one chunk of ``n/p`` elements:
    ``2(p−1)·n/p`` in all (:func:`ring_all_reduce_volume`).

    Returns:
        ``2(p−1) + 1`` states; each a dict with ``phase`` (``"start"``, ``"reduce-scatter"``, ``"all-gather"``),
        ``step``, ``data`` (``(p, n)`` tensor after the step), ``sends`` (list of ``(src, dst, chunk)``),
        ``sent_elements`` (per rank, cumulative). The last ``data`` has every row equal to ``x.sum(0)``.

    Raises:
        ValueError: ``x`` not 2-D, or ``n`` not divisible by ``p``.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be (p, n), got shape {tuple(x.shape)}")
    p, n = x.shape
    if n % p:
        raise ValueError(f"n = {n} must be divisible by p = {p}")
    c = n // p
    data = x.clone()
    states = [{"phase": "start", "step": 0, "data": data.clone(), "sends": [], "sent_elements": 0}]
    sent = 0
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(p - 1):
            offset = 0 if phase == "reduce-scatter" else 1
            sends = [(r, (r + 1) % p, (r - s + offset) % p) for r in range(p)]
            payload = [data[src, k * c:(k + 1) * c].clone() for src, _, k in sends]
            for (_, dst, k), chunk in zip(sends, payload, strict=True):
                if phase == "reduce-scatter":
                    data[dst, k * c:(k + 1) * c] += chunk
                else:
                    data[dst, k * c:(k + 1) * c] = chunk
            sent += c
            states.append({"phase": phase, "step": len(states), "data": data.clone(), "sends": sends,
                           "sent_elements": sent})
    return states


def ring_all_reduce(tensor: Tensor) -> Tensor:
    """Sum ``tensor`` over all ranks **in place** with the ring algorithm, using only ``dist.isend``/``dist.irecv``
    (a teaching version of what ``dist.all_reduce`` does; same result up to float rounding order).

    Must be called by every rank of the default process group with tensors of equal shape and dtype; the
    flattened length must be divisible by the world size. Returns ``tensor``.

    Raises:
        ValueError: length not divisible by the world size.
    """
    import torch.distributed as dist

    p, r = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1)
    if flat.numel() % p:
        raise ValueError(f"ring_all_reduce needs numel divisible by the world size {p}, got {flat.numel()}")
    if p == 1:
        return tensor
    chunks = flat.chunk(p)
    right, left = (r + 1) % p, (r - 1) % p
    buf = torch.empty_like(chunks[0])
    for phase in (0, 1):
        for s in range(p - 1):
            send_k = (r - s + phase) % p
            recv_k = (r - s - 1 + phase) % p
            ops = [dist.P2POp(dist.isend, chunks[send_k].contiguous(), right),
                   dist.P2POp(dist.irecv, buf, left)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            if phase == 0:
                chunks[recv_k].add_(buf)
            else:
                chunks[recv_k].copy_(buf)
    return tensor


def measure_all_reduce(numel: int, repeats: int = 5, dtype: torch.dtype = torch.float32, device=None) -> dict:
    """Time ``dist.all_reduce`` of ``numel`` elements on the current group (call on every rank).

    Returns:
        ``{"bytes": n, "seconds": best time, "sent_bytes": 2(p−1)/p·n, "bus_bandwidth": sent_bytes/seconds}``
        (bytes/s each rank sends: NCCL-tests' "bus bandwidth"), the best of ``repeats`` calls after one warm-up.
    """
    import torch.distributed as dist

    p = dist.get_world_size()
    if device is None:   # NCCL moves GPU tensors only: this rank's current GPU (set from LOCAL_RANK by the launchers)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.ones(numel, dtype=dtype, device=device)
    dist.all_reduce(t)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        best = min(best, time.perf_counter() - start)
    n = numel * t.element_size()
    sent = ring_all_reduce_volume(n, p)
    return {"bytes": n, "seconds": best, "sent_bytes": sent, "bus_bandwidth": sent / best if best > 0 else 0.0}
