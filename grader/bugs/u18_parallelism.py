"""Bug catalog of unit 18 (parallelism with torch.distributed): the classic mistakes, each a runnable mutant.

Named by the output they produce on the check's ranks (``detect="mutant"``: gradients summed instead of averaged,
gradients averaged before backward produced them all, replicas never synchronised, ZeRO's gradient shard summed,
the row-parallel bias added on every rank) or by a property the check names (``detect="detector"``: equal random
draws on every rank; a rank failing inside ``all_to_all_single`` because the split sizes do not fit).
"""

from __future__ import annotations

import functools
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

        grad_shard = torch.empty(self.stop - self.start, dtype=self.dtype, device=self.device)
        dist.reduce_scatter_single(grad_shard, self._flat([q.grad for q in self.params]))
        param_shard = self._flat(list(self.params))[self.start:self.stop].clone()
        self.step_count += 1
        beta1, beta2 = self.betas
        param_shard.mul_(1 - self.lr * self.weight_decay)
        self.exp_avg.lerp_(grad_shard, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad_shard, grad_shard, value=1 - beta2)
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** self.step_count)).add_(self.eps)
        param_shard.addcdiv_(self.exp_avg, denom, value=-self.lr / (1 - beta1 ** self.step_count))
        full = torch.empty(self.world_size * param_shard.numel(), dtype=self.dtype, device=self.device)
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


def _tp_block(x, ff, rank, world_size, *, dx="sum", reduce_input=False, output_backward_sum=False, gather=False,
              entry_per_layer=False):
    """The TP SwiGLU block with one thing changed: ``dx`` "sum" | "none" | "mean" (what backward does to ∂x where x
    enters), ``reduce_input`` (x all-reduced in forward instead), ``output_backward_sum`` (the output's all-reduce
    differentiable, so backward sums the gradient again), ``gather`` (the weight shards all-gathered, dense block),
    ``entry_per_layer`` (gate and up each enter through their own ``f``: ∂x summed twice, once per layer)."""
    import torch.distributed as dist

    class Enter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            if reduce_input:
                t = t.clone()
                dist.all_reduce(t)
                return t
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            if reduce_input or dx == "none":
                return grad
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad / world_size if dx == "mean" else grad

    class Leave(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            t = t.clone()
            dist.all_reduce(t)
            return t

        @staticmethod
        def backward(ctx, grad):
            if output_backward_sum:
                grad = grad.clone()
                dist.all_reduce(grad)
            return grad

    n = ff.gate_proj.out_features // world_size
    mine = slice(rank * n, (rank + 1) * n)
    if gather:
        def full(w, dim):
            own = w[mine] if dim == 0 else w[:, mine]
            parts = [torch.empty_like(own) for _ in range(world_size)]
            dist.all_gather(parts, own.detach().contiguous())
            parts[rank] = own
            return torch.cat(parts, dim)

        gate, up, down = full(ff.gate_proj.weight, 0), full(ff.up_proj.weight, 0), full(ff.down_proj.weight, 1)
        return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)
    xin = Enter.apply(x)
    h = F.silu(F.linear(xin, ff.gate_proj.weight[mine])) * F.linear(Enter.apply(x) if entry_per_layer else xin,
                                                                      ff.up_proj.weight[mine])
    return Leave.apply(F.linear(h, ff.down_proj.weight[:, mine]))


TP = f"{U}.tp_swiglu"
bug_group("B18.tp_dx_partial", TP, "Forward is right but ∂x is only the part that flows through this rank's slice of "
          "the hidden features: every rank computed gate and up from the same x, so the gradient of x is the sum of "
          "the ranks' parts. Something where x enters the column-parallel layers must sum it in the backward pass.",
          {"tp_swiglu": functools.partial(_tp_block, dx="none")})
bug_group("B18.tp_input_reduced_forward", TP, "x is all-reduced on its way into the column-parallel layers, so they "
          "see p·x: every rank already holds the whole x, nothing needs summing in the forward pass there. The "
          "communication that belongs where x enters is the one of its gradient.",
          {"tp_swiglu": functools.partial(_tp_block, reduce_input=True)})
bug_group("B18.tp_dx_averaged", TP, "∂x is averaged over the ranks, so it is 1/p of the dense block's: the ranks' "
          "parts are pieces of one gradient (different hidden features), not estimates of the same one. Sum them.",
          {"tp_swiglu": functools.partial(_tp_block, dx="mean")})
bug_group("B18.tp_output_reduced_backward", TP, "Every gradient is p times the dense block's: the all-reduce of the "
          "output also sums in the backward pass, but the output's gradient is already the same on every rank (each "
          "holds the whole output). That all-reduce passes the gradient through unchanged.",
          {"tp_swiglu": functools.partial(_tp_block, output_backward_sum=True)})
bug_group("B18.tp_gather_weights", TP, "The weight shards are all-gathered and the dense block runs on every rank: "
          "nothing is split, every rank holds and multiplies the whole block. Tensor parallelism keeps the weights "
          "where they are and moves only activations and their gradients.",
          {"tp_swiglu": functools.partial(_tp_block, gather=True)},
          detect="detector")
bug_group("B18.tp_dx_summed_per_layer", TP, "The values are right, but the backward pass sums a gradient of x twice, "
          "once for gate's input and once for up's: twice the traffic the block needs. Both layers read the same x, "
          "so their contributions can be added locally and summed over the ranks once, where x enters the block.",
          {"tp_swiglu": functools.partial(_tp_block, entry_per_layer=True)}, detect="detector")


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


# ---------------------------------------------------------------- issue 40: the shortcuts that skip each idea


def _ring_whole_tensor(tensor):
    """The whole tensor passed around the ring p−1 times: right sum, (p−1)·n elements sent per rank."""
    import torch.distributed as dist

    r, p = dist.get_rank(), dist.get_world_size()
    acc, buf, got = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for _ in range(p - 1):
        ops = [dist.P2POp(dist.isend, buf, (r + 1) % p), dist.P2POp(dist.irecv, got, (r - 1) % p)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        buf = got.clone()
        acc += buf
    tensor.copy_(acc)
    return tensor


def _ring_star(tensor):
    """Every rank sends to rank 0, which sums and sends the result back: a star, not a ring."""
    import torch.distributed as dist

    r, p = dist.get_rank(), dist.get_world_size()
    if r == 0:
        buf = torch.empty_like(tensor)
        for src in range(1, p):
            dist.recv(buf, src)
            tensor += buf
        for dst in range(1, p):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor


RING = f"{U}.ring_all_reduce"
bug_group("B18.ring_whole_tensor", RING, "Each rank sends far more than a ring all-reduce needs: passing whole "
          "tensors around costs (p−1)·n per rank. Cut the tensor into p chunks: p−1 steps that each send one chunk "
          "and add the one received (reduce-scatter), then p−1 steps that pass the finished chunks on (all-gather).",
          {"ring_all_reduce": _ring_whole_tensor}, detect="detector")
bug_group("B18.ring_not_neighbours", RING, "A rank exchanges messages with ranks that are not its neighbours (a star "
          "through one rank, or every rank to every other): in a ring, rank r sends only to r+1 and receives only "
          "from r−1 (mod p), so every link carries the same load and no rank is a bottleneck.",
          {"ring_all_reduce": _ring_star}, detect="detector")


def _seed_ignored(module, seed):
    import torch.distributed as dist

    broadcast_parameters(module)
    p = dist.get_world_size()
    for q in module.parameters():
        if q.requires_grad:
            def hook(param):
                dist.all_reduce(param.grad)
                param.grad.div_(p)
            q.register_post_accumulate_grad_hook(hook)


def _averaged_twice(module, seed):
    import torch.distributed as dist

    broadcast_parameters(module)
    torch.manual_seed(seed + dist.get_rank())
    p = dist.get_world_size()
    for q in module.parameters():
        if q.requires_grad:
            def hook(param):
                param.grad.div_(p)
                dist.all_reduce(param.grad)
                param.grad.div_(p)
            q.register_post_accumulate_grad_hook(hook)


bug_group("B18.seed_ignored", DP, "The random draws after the call do not depend on `seed`: each rank's stream must be "
          "a function of the seed it is given (and of its rank), so that a run can be repeated.",
          {"attach_data_parallel": _seed_ignored}, detect="detector")
bug_group("B18.grads_averaged_twice", DP, "The gradients are divided by the number of ranks twice (p² in all): the "
          "mean over ranks is the sum divided by p once.",
          {"attach_data_parallel": _averaged_twice})


class _FullStateAdamW:
    """All-reduce the gradients, a full torch.optim.AdamW on every rank; state_numel reports the share."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.inner = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.numel = sum(q.numel() for q in self.params)

    def state_numel(self):
        import torch.distributed as dist

        return 2 * math.ceil(self.numel / dist.get_world_size())

    @torch.no_grad()
    def step(self):
        import torch.distributed as dist

        for q in self.params:
            dist.all_reduce(q.grad)
            q.grad.div_(dist.get_world_size())
        self.inner.step()


class _AllReduceShardAdamW(ZeRO1AdamW):
    """Sharded moments, but the whole flat gradient all-reduced (then sliced) instead of reduce-scattered."""

    @torch.no_grad()
    def step(self):
        import torch.distributed as dist

        flat = self._flat([q.grad for q in self.params])
        dist.all_reduce(flat)
        grad_shard = flat[self.start:self.stop] / self.world_size
        param_shard = self._flat(list(self.params))[self.start:self.stop].clone()
        self.step_count += 1
        beta1, beta2 = self.betas
        param_shard.mul_(1 - self.lr * self.weight_decay)
        self.exp_avg.lerp_(grad_shard, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad_shard, grad_shard, value=1 - beta2)
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** self.step_count)).add_(self.eps)
        param_shard.addcdiv_(self.exp_avg, denom, value=-self.lr / (1 - beta1 ** self.step_count))
        full = torch.empty(self.world_size * param_shard.numel(), dtype=self.dtype, device=self.device)
        dist.all_gather_single(full, param_shard)
        offset = 0
        for q in self.params:
            q.copy_(full[offset:offset + q.numel()].view_as(q))
            offset += q.numel()


bug_group("B18.zero_full_state", f"{U}.ShardedAdamW", "This rank still holds optimizer state for every parameter, "
          "whatever state_numel() reports: ZeRO-1's saving is that each rank keeps the AdamW moments of its own "
          "share only, and updates only that share.",
          {"ShardedAdamW": _FullStateAdamW}, detect="detector")
bug_group("B18.zero_all_reduce", f"{U}.ShardedAdamW", "A step sends more than data parallelism would: each rank "
          "needs only its share of the averaged gradient, so bringing everyone the whole averaged gradient costs "
          "1.5 times the traffic. The lesson's table of collective volumes shows which one delivers just a share.",
          {"ShardedAdamW": _AllReduceShardAdamW}, detect="detector")


def _row_full_product(x, linear, rank, world_size):
    import torch.distributed as dist

    y = x @ linear.weight.T / world_size
    dist.all_reduce(y)
    return y + linear.bias


bug_group("B18.row_full_product", f"{U}.row_parallel_linear", "Each rank computes with the whole weight (or the "
          "whole input) instead of its slice of the input features: nothing is split, the all-reduce only "
          "averages copies. Rank r owns input features r·in/p … (r+1)·in/p − 1 and the matching weight columns.",
          {"row_parallel_linear": _row_full_product}, detect="detector")


def _ep_no_all_to_all(x, moe, rank, world_size):
    import torch.distributed as dist

    d = moe.d_model
    flat = x.reshape(-1, d)
    parts = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(parts, flat)
    everything = torch.cat(parts)
    _, w, idx = moe.gate(everything)
    per = moe.n_routed_experts // world_size
    out = torch.zeros_like(everything)
    for e in range(rank * per, (rank + 1) * per):
        tok, slot = torch.where(idx == e)
        if len(tok):
            out.index_add_(0, tok, moe.experts[e](everything[tok]) * w[tok, slot, None])
    dist.all_reduce(out)
    n = flat.shape[0]
    return out[rank * n:(rank + 1) * n].view_as(x) + moe.shared_experts(x)


bug_group("B18.ep_no_all_to_all", f"{U}.expert_parallel_moe", "Every rank's tokens are sent to every rank (gathered, "
          "then the outputs all-reduced): the traffic grows with all tokens times all ranks. Expert parallelism "
          "moves each token only to the ranks that own its chosen experts, and back, with an all-to-all.",
          {"expert_parallel_moe": _ep_no_all_to_all}, detect="detector")
