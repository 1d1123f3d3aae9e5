"""Expert parallelism for unit 14's DeepSeekMoE: the routed experts split over ranks, tokens moved by all-to-all.

DeepSeek-V3 technical report §3.2.2 ("Efficient implementation of cross-node all-to-all communication") and
§3.1 (64-way expert parallelism across 8 nodes); Lepikhin et al. 2020 (GShard) for the dispatch/combine pattern.
With ``p`` ranks and ``E`` routed experts, rank ``r`` holds experts ``r·E/p … (r+1)·E/p − 1``; the router and the
shared experts are replicated, and every rank brings its **own** tokens. One forward of
:class:`ExpertParallelMoE`:

1. **route** locally (the same :func:`~llmcourse.models.deepseek_moe.deepseek_route` as one process);
2. **dispatch**: sort the ``N·k`` (token, slot) assignments by expert, hence by owning rank; exchange the
   per-rank counts (an all-to-all of ``p`` integers: each rank learns how many rows it will receive), then
   ``all_to_all_single`` the rows with ``input_split_sizes`` = rows sent to each rank and ``output_split_sizes``
   = rows received from each rank;
3. run the local experts on the received rows;
4. **combine**: the reverse ``all_to_all_single`` (the two split lists swapped) brings each result back to the
   rank that owns the token, where it is weighted and summed as in one process, then the shared experts are added.

The all-to-alls are differentiable (backward = all-to-all with the splits swapped), so expert gradients land on
the expert's rank. With node-limited routing (``n_group`` = number of ranks/nodes, ``topk_group = M``) each token
reaches at most ``M`` ranks: :func:`dispatch_counts` measures it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models.deepseek_moe import DeepSeekMoE, DeepSeekTopkRouter

__all__ = ["all_to_all_rows", "dispatch_counts", "expert_parallel_moe", "ExpertParallelMoE"]


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits):
        import torch.distributed as dist

        ctx.splits = (output_splits, input_splits)
        out = x.new_empty((sum(output_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=output_splits, input_split_sizes=input_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        return _AllToAll.apply(grad.contiguous(), input_splits, output_splits), None, None


def all_to_all_rows(x: Tensor, input_splits: list[int], output_splits: list[int]) -> Tensor:
    """Differentiable ``dist.all_to_all_single`` on rows: rank ``r`` sends rows ``x[Σ_{j<i} in_j : …+in_i]`` to
    rank ``i`` and receives ``output_splits[i]`` rows from rank ``i``; returns ``(Σ output_splits, …)``.
    The backward pass is the same exchange with the two split lists swapped.

    Raises:
        RuntimeError (from torch): ``sum(input_splits) != x.shape[0]`` or lists that do not match the peers'.
    """
    return _AllToAll.apply(x, list(map(int, output_splits)), list(map(int, input_splits)))


def dispatch_counts(indices: Tensor, num_experts: int, world_size: int) -> dict[str, Tensor]:
    """How many rows and distinct tokens one rank sends to each rank, for routing ``indices`` ``(N, k)``.

    Returns:
        ``{"rows": (p,) long, "tokens": (p,) long, "ranks_per_token": (N,) long}``: assignments per destination
        rank (what :class:`ExpertParallelMoE` sends), distinct tokens per destination (what a sender that
        deduplicates, as DeepSeek-V3 does across nodes, sends), and the number of ranks each token reaches.

    Raises:
        ValueError: ``num_experts`` not divisible by ``world_size``.
    """
    if num_experts % world_size:
        raise ValueError(f"{num_experts} experts cannot be split evenly over {world_size} ranks")
    dest = indices // (num_experts // world_size)                      # (N, k) owning rank of each assignment
    rows = torch.bincount(dest.reshape(-1), minlength=world_size)
    hit = torch.zeros(indices.shape[0], world_size, dtype=torch.bool, device=indices.device).scatter_(1, dest, True)
    return {"rows": rows, "tokens": hit.sum(0), "ranks_per_token": hit.sum(1)}


class ExpertParallelMoE(nn.Module):
    """A :class:`~llmcourse.models.deepseek_moe.DeepSeekMoE` whose routed experts are split over the default group.

    Built with :meth:`from_moe` (this rank's share of a full layer's weights). ``forward(x)``: this rank's tokens
    ``(…, D)`` → ``(…, D)``, equal to the full layer applied to the same tokens. Keys: ``gate.*`` and
    ``shared_experts.*`` as the full layer; ``experts.{j}.*`` = global expert ``rank·E/p + j``.

    Attributes:
        last_send_rows: ``(p,)`` rows this rank sent to each rank in the last forward (its own share included);
        last_recv_rows: ``(p,)`` rows it received from each rank.

    Raises:
        ValueError: ``E`` not divisible by the world size; input whose last dimension is not ``D``.
    """

    def __init__(self, gate: DeepSeekTopkRouter, experts: list[nn.Module], shared_experts: nn.Module | None,
                 rank: int, world_size: int):
        super().__init__()
        e = gate.n_routed_experts
        if e % world_size:
            raise ValueError(f"{e} experts cannot be split evenly over {world_size} ranks")
        self.d_model, self.n_routed_experts, self.top_k = gate.d_model, e, gate.top_k
        self.rank, self.world_size, self.local_experts = rank, world_size, e // world_size
        self.gate = gate
        self.experts = nn.ModuleList(experts)
        self.shared_experts = shared_experts
        self.last_send_rows: Tensor | None = None
        self.last_recv_rows: Tensor | None = None

    @classmethod
    def from_moe(cls, moe: DeepSeekMoE, rank: int, world_size: int) -> ExpertParallelMoE:
        """This rank's share of ``moe`` (copies of the router, the shared experts and experts of this rank)."""
        import copy

        e = moe.n_routed_experts
        if e % world_size:
            raise ValueError(f"{e} experts cannot be split evenly over {world_size} ranks")
        n = e // world_size
        experts = [copy.deepcopy(moe.experts[rank * n + j]) for j in range(n)]
        return cls(copy.deepcopy(moe.gate), experts, copy.deepcopy(moe.shared_experts), rank, world_size)

    def forward(self, x: Tensor) -> Tensor:
        import torch.distributed as dist

        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected (..., {self.d_model}) inputs, got shape {tuple(x.shape)}")
        p, n_local = self.world_size, self.local_experts
        flat = x.reshape(-1, self.d_model)
        _, weights, indices = self.gate(flat)
        k = indices.shape[1]
        flat_e = indices.reshape(-1)
        order = torch.argsort(flat_e, stable=True)               # by expert, hence by owning rank
        token = order // k
        send_rows = torch.bincount(flat_e // n_local, minlength=p)
        recv_rows = torch.empty_like(send_rows)
        dist.all_to_all_single(recv_rows, send_rows)              # p integers: rows each peer will send me
        send_experts = flat_e.index_select(0, order)
        recv_experts = torch.empty(int(recv_rows.sum()), dtype=send_experts.dtype, device=send_experts.device)
        dist.all_to_all_single(recv_experts, send_experts, recv_rows.tolist(), send_rows.tolist())
        xs = all_to_all_rows(flat.index_select(0, token), send_rows.tolist(), recv_rows.tolist())
        # local experts on the received rows (grouped by expert, stable: sender order kept inside an expert)
        local = recv_experts - self.rank * n_local
        local_order = torch.argsort(local, stable=True)
        counts = torch.bincount(local, minlength=n_local).tolist()
        parts = xs.index_select(0, local_order).split(counts)
        ys_sorted = torch.cat([self.experts[j](part) for j, part in enumerate(parts)]) if xs.shape[0] else xs
        ys = torch.empty_like(ys_sorted).index_copy(0, local_order, ys_sorted)
        back = all_to_all_rows(ys, recv_rows.tolist(), send_rows.tolist())      # combine: the reverse exchange
        w = weights.reshape(-1).index_select(0, order)[:, None]
        out = torch.zeros_like(flat).index_add(0, token, (back * w).to(flat.dtype))
        self.last_send_rows, self.last_recv_rows = send_rows, recv_rows
        out = out.view_as(x)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


def expert_parallel_moe(x: Tensor, moe: DeepSeekMoE, rank: int, world_size: int) -> Tensor:
    """``moe(x)`` for this rank's tokens ``x`` ``(…, D)``, running only this rank's experts
    (``rank·E/p … (rank+1)·E/p − 1``) here and the others on their ranks (:class:`ExpertParallelMoE`).
    Every rank calls it with its own tokens and the same ``moe`` (only its own experts' weights are read)."""
    return ExpertParallelMoE.from_moe(moe, rank, world_size)(x)
