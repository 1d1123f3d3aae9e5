"""ZeRO stage 1: AdamW whose moments are sharded over the data-parallel ranks.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §5.1 and Fig. 1:
plain data parallelism keeps a full copy of the optimizer state on every rank; ZeRO-1 ("P_os") keeps on rank
``r`` only the state of parameter shard ``r``. One step of :class:`ZeRO1AdamW`:

1. the parameters (and their **local**, un-averaged gradients) are viewed as one flat vector of ``Ψ`` elements,
   zero-padded to a multiple of ``p``; rank ``r`` owns elements ``r·Ψ/p … (r+1)·Ψ/p − 1``;
2. ``reduce_scatter_single`` sums the flat gradients over ranks and hands rank ``r`` its shard, divided by ``p``
   (the same mean an all-reduce would give, for half the traffic: ``(p−1)/p·Ψ`` per rank);
3. rank ``r`` applies AdamW (``torch.optim.AdamW``'s update, decoupled weight decay) to its shard only;
4. ``all_gather_single`` reassembles the updated parameters on every rank (another ``(p−1)/p·Ψ``).

Total traffic = one all-reduce's ``2(p−1)/p·Ψ``; optimizer memory per rank drops from ``KΨ`` to ``KΨ/p``
(:func:`zero_memory_per_rank`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["ZeRO1AdamW", "zero_memory_per_rank", "shard_range"]


def zero_memory_per_rank(num_params: float, world_size: int, stage: int = 1, param_bytes: float = 2,
                         grad_bytes: float = 2, optimizer_bytes: float = 12) -> float:
    """Model-state bytes per rank under ZeRO stage ``0…3`` (ZeRO paper, Fig. 1).

    Defaults are the paper's mixed-precision Adam (``2Ψ`` fp16 parameters, ``2Ψ`` fp16 gradients, ``K = 12``:
    fp32 master weights, momentum, variance): stage 0 ``(2+2+K)Ψ``; 1 ``(2+2)Ψ + KΨ/p``; 2 ``2Ψ + (2+K)Ψ/p``;
    3 ``(2+2+K)Ψ/p``. Example: ``Ψ = 7.5e9, p = 64`` → 120, 31.4, 16.6, 1.9 GB. For fp32 AdamW as in this
    course use ``param_bytes=4, grad_bytes=4, optimizer_bytes=8``.

    Raises:
        ValueError: ``stage`` not in 0…3 or ``world_size < 1``.
    """
    if stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(f"need stage in 0..3 and world_size ≥ 1, got stage={stage}, world_size={world_size}")
    p, g, k = param_bytes * num_params, grad_bytes * num_params, optimizer_bytes * num_params
    return {0: p + g + k, 1: p + g + k / world_size, 2: p + (g + k) / world_size,
            3: (p + g + k) / world_size}[stage]


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s shard of a flat vector of ``numel`` elements padded to a multiple of
    ``world_size`` (``stop`` may exceed ``numel``: the padding)."""
    size = math.ceil(numel / world_size)
    return rank * size, (rank + 1) * size


class ZeRO1AdamW:
    """AdamW with optimizer state sharded over the default process group (ZeRO stage 1).

    Args:
        params: an iterable of parameters (one group; same shapes and order on every rank).
        lr, betas, eps, weight_decay: as ``torch.optim.AdamW`` (defaults 1e-3, (0.9, 0.999), 1e-8, 1e-2).

    ``step()`` expects each rank's **local** gradients (of its own mean loss); it averages them over ranks itself
    (reduce-scatter), so do not all-reduce them first. A parameter without ``.grad`` counts as a zero gradient.
    After ``step()`` every rank holds identical parameters, equal (within fp32 rounding) to
    ``torch.optim.AdamW`` stepped with the gradient averaged over ranks.

    Attributes:
        exp_avg, exp_avg_sq: this rank's moment shards, float32 ``(ceil(Ψ/p),)``; ``step_count``.

    Raises:
        RuntimeError: no default process group; ValueError: invalid hyper-parameters.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("ZeRO1AdamW needs torch.distributed.init_process_group first")
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid hyper-parameters lr={lr}, betas={betas}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        self.params: list[nn.Parameter] = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.start, self.stop = shard_range(self.numel, self.rank, self.world_size)
        size = self.stop - self.start
        # the state lives where the parameters live, in their dtype (fp32 for lower-precision parameters, as the
        # master copy of mixed-precision training): NCCL needs GPU buffers, float64 parameters keep their precision
        first = self.params[0] if self.params else torch.empty(0)
        self.device = first.device
        self.dtype = first.dtype if first.dtype in (torch.float32, torch.float64) else torch.float32
        self.exp_avg = torch.zeros(size, dtype=self.dtype, device=self.device)
        self.exp_avg_sq = torch.zeros(size, dtype=self.dtype, device=self.device)
        self.step_count = 0

    def state_bytes(self) -> int:
        """Bytes of optimizer state held by this rank (the two moment shards)."""
        return (self.exp_avg.numel() + self.exp_avg_sq.numel()) * self.exp_avg.element_size()

    def state_numel(self) -> int:
        """Elements of optimizer state held by this rank: ``2·ceil(Ψ/p)`` (plain AdamW keeps ``2Ψ``)."""
        return self.exp_avg.numel() + self.exp_avg_sq.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def _flat(self, tensors: list[Tensor | None]) -> Tensor:
        padded = self.world_size * (self.stop - self.start)
        flat = torch.zeros(padded, dtype=self.dtype, device=self.device)
        offset = 0
        for p, t in zip(self.params, tensors, strict=True):
            n = p.numel()
            if t is not None:
                flat[offset:offset + n] = t.detach().reshape(-1).to(self.dtype)
            offset += n
        return flat

    @torch.no_grad()
    def step(self) -> None:
        import torch.distributed as dist

        p = self.world_size
        grad_shard = torch.empty(self.stop - self.start, dtype=self.dtype, device=self.device)
        dist.reduce_scatter_single(grad_shard, self._flat([q.grad for q in self.params]), op=dist.ReduceOp.SUM)
        grad_shard.div_(p)
        param_shard = self._flat(list(self.params))[self.start:self.stop].clone()
        self.step_count += 1
        beta1, beta2 = self.betas
        # torch.optim.AdamW's single-tensor update, in the same order of operations
        param_shard.mul_(1 - self.lr * self.weight_decay)
        self.exp_avg.lerp_(grad_shard, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad_shard, grad_shard, value=1 - beta2)
        bias1 = 1 - beta1 ** self.step_count
        bias2_sqrt = math.sqrt(1 - beta2 ** self.step_count)
        denom = (self.exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps)
        param_shard.addcdiv_(self.exp_avg, denom, value=-self.lr / bias1)
        full = torch.empty(p * param_shard.numel(), dtype=self.dtype, device=self.device)
        dist.all_gather_single(full, param_shard)
        offset = 0
        for q in self.params:
            n = q.numel()
            q.copy_(full[offset:offset + n].view_as(q))
            offset += n
