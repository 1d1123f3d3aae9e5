"""Bug catalog of unit 18 (parallelism with torch.distributed): the classic mistakes, each a runnable mutant.

Named by the output they produce on the check's ranks (``detect="mutant"``: gradients summed instead of averaged,
gradients averaged before backward produced them all, replicas never synchronised, ZeRO's gradient shard summed,
the row-parallel bias added on every rank) or by a property the check names (``detect="detector"``: equal random
draws on every rank; a rank failing inside ``all_to_all_single`` because the split sizes do not fit).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from llmcourse.parallel.data_parallel import broadcast_parameters
from llmcourse.parallel.expert_parallel import ExpertParallelMoE
from llmcourse.parallel.zero import ZeRO1AdamW

from ..core import bug_group

U = "18"
DP = f"{U}.attach_data_parallel"


# ---------------------------------------------------------------- data parallelism


def _attach(module, seed, *, divide=True, broadcast=True, per_rank_seed=True, hook_all_on_first=False):
    import torch.distributed as dist

    if broadcast:
        broadcast_parameters(module)
    torch.manual_seed(seed + (dist.get_rank() if per_rank_seed else 0))
    p = dist.get_world_size()
    params = [q for q in module.parameters() if q.requires_grad]

    def hook(param):
        dist.all_reduce(param.grad)
        if divide:
            param.grad.div_(p)

    if hook_all_on_first:
        # averages every gradient present when the first one is ready: backward has not produced the others yet
        def early(_param):
            for q in params:
                if q.grad is not None:
                    dist.all_reduce(q.grad)
                    q.grad.div_(p)
        params[-1].register_post_accumulate_grad_hook(early)
        return
    for q in params:
        q.register_post_accumulate_grad_hook(hook)


def _sum_not_mean(module, seed):
    _attach(module, seed, divide=False)


def _reduce_before_backward(module, seed):
    _attach(module, seed, hook_all_on_first=True)


def _unsynced_init(module, seed):
    _attach(module, seed, broadcast=False)


def _same_dropout_seed(module, seed):
    _attach(module, seed, per_rank_seed=False)


bug_group("B18.sum_not_mean", DP, "Gradients are summed over ranks, not averaged: with p ranks each step is p times "
          "too large. The whole batch's mean loss has the mean of the ranks' gradients.",
          {"attach_data_parallel": _sum_not_mean})
bug_group("B18.reduce_before_backward", DP, "Gradients are averaged before backward has produced all of them: the "
          "gradients that arrive later stay local to each rank. Average each gradient once it is accumulated.",
          {"attach_data_parallel": _reduce_before_backward})
bug_group("B18.unsynced_init", DP, "The replicas start from different weights (each rank initialised its own copy): "
          "make every rank start from rank 0's parameters before training.",
          {"attach_data_parallel": _unsynced_init})
bug_group("B18.same_dropout_seed", DP, "Every rank uses the same seed, so dropout masks are identical on all ranks; "
          "seed each rank differently after the weights are made equal.",
          {"attach_data_parallel": _same_dropout_seed}, detect="detector")


# ---------------------------------------------------------------- ZeRO-1


class _SummedShardAdamW(ZeRO1AdamW):
    """The reduce-scatter sums the ranks' gradients but never divides by p."""


    @torch.no_grad()
    def step(self):
        import torch.distributed as dist

        grad_shard = torch.empty(self.stop - self.start, dtype=torch.float32)
        dist.reduce_scatter_single(grad_shard, self._flat([q.grad for q in self.params]))
        param_shard = self._flat(list(self.params))[self.start:self.stop].clone()
        self.step_count += 1
        beta1, beta2 = self.betas
        param_shard.mul_(1 - self.lr * self.weight_decay)
        self.exp_avg.lerp_(grad_shard, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad_shard, grad_shard, value=1 - beta2)
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** self.step_count)).add_(self.eps)
        param_shard.addcdiv_(self.exp_avg, denom, value=-self.lr / (1 - beta1 ** self.step_count))
        full = torch.empty(self.world_size * param_shard.numel())
        dist.all_gather_single(full, param_shard)
        offset = 0
        for q in self.params:
            q.copy_(full[offset:offset + q.numel()].view_as(q))
            offset += q.numel()


bug_group("B18.zero_sum_not_mean", f"{U}.ShardedAdamW", "The gradient shard is the sum over ranks, not the mean "
          "(Adam divides it out except where eps matters, so the steps are subtly wrong): divide the reduce-scatter by p.",
          {"ShardedAdamW": _SummedShardAdamW})


# ---------------------------------------------------------------- tensor parallelism


def _bias_every_rank(x, linear, rank, world_size):
    import torch.distributed as dist

    n = linear.in_features // world_size
    cols = slice(rank * n, (rank + 1) * n)
    y = F.linear(x[..., cols], linear.weight[:, cols], linear.bias)      # bias inside the sum: p·b
    dist.all_reduce(y)
    return y


bug_group("B18.bias_every_rank", f"{U}.row_parallel_linear", "The bias is added on every rank before the all-reduce, "
          "so the output carries it p times: add it once, after the partial products are summed.",
          {"row_parallel_linear": _bias_every_rank})


# ---------------------------------------------------------------- expert parallelism


class _SymmetricSplits(ExpertParallelMoE):
    """Receives as many rows from each rank as it sends to it (never exchanges the counts)."""

    def forward(self, x):
        import torch.distributed as dist

        from llmcourse.parallel.expert_parallel import all_to_all_rows

        flat = x.reshape(-1, self.d_model)
        _, weights, indices = self.gate(flat)
        k = indices.shape[1]
        flat_e = indices.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        token = order // k
        send = torch.bincount(flat_e // self.local_experts, minlength=self.world_size).tolist()
        xs = all_to_all_rows(flat.index_select(0, token), send, send)          # wrong: output splits = input splits
        recv_e = torch.empty(sum(send), dtype=flat_e.dtype)
        dist.all_to_all_single(recv_e, flat_e.index_select(0, order), send, send)
        local = recv_e - self.rank * self.local_experts
        ys = torch.zeros_like(xs)
        for j, expert in enumerate(self.experts):
            rows = (local == j).nonzero().squeeze(1)
            ys[rows] = expert(xs[rows])
        back = all_to_all_rows(ys, send, send)
        out = torch.zeros_like(flat).index_add(0, token, back * weights.reshape(-1)[order][:, None])
        return out.view_as(x) + self.shared_experts(x)


def _symmetric_splits(x, moe, rank, world_size):
    return _SymmetricSplits.from_moe(moe, rank, world_size)(x)


bug_group("B18.a2a_split_sizes", f"{U}.expert_parallel_moe", "The all-to-all's split sizes do not fit: a rank must "
          "receive from each peer exactly what that peer sends it. Exchange the per-rank counts first (an "
          "all-to-all of p integers) and use them as the output split sizes.",
          {"expert_parallel_moe": _symmetric_splits}, detect="detector")
