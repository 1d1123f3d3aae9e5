# %% [markdown]
# # Unit 18 — Beyond one machine: exercises
#
# Six graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# Everything here runs on real process groups: `launch(fn, 2)` (from `llmcourse.parallel`) starts 2 processes
# ("ranks") on this machine, joins them into one `torch.distributed` group with the `gloo` backend, runs
# `fn(rank, world_size)` in each, and returns one result per rank: its return value (`.value`), what it printed
# (`.output`), the collectives it called (`.calls`) and, if it failed, its error (`.error`) and the collective it was
# waiting in (`.pending`). A rank that hangs is killed after a timeout, so a wrong collective never freezes the
# notebook. Your functions are called **inside** the ranks: they call `dist.all_reduce(...)` and friends directly.
#
# The grader starts its own ranks (2, or 4 for the ring and for ZeRO) and runs your code in every one of them. It
# compares with one process doing the whole job: the sum of the ranks' tensors, one model on the whole batch,
# `torch.optim.AdamW`, the full `nn.Linear`, the full SwiGLU block, the full `DeepSeekMoE`. It also checks the idea of each exercise where
# it happens: the ranks' process group records every message each rank sends (to whom, how many elements, by which
# operation), whichever function sent it, and each rank holds only its own inputs; the bytes each rank puts on its
# connections to the others are counted too, so a message sent around the group is seen. When a rank fails it names
# the rank and the collective; when your mistake is a known one it names it and gives a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/18_parallelism/18_parallelism.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `torch.distributed`, `math` and the standard library.

# %%
import math  # noqa: F401

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.models.deepseek_moe import DeepSeekMoE
from llmcourse.models.llama3 import SwiGLUFeedForward
from llmcourse.parallel import launch

cfg = llmcourse.setup_notebook("18")
TIMEOUT = cfg["rank_timeout_s"]

# %% [markdown]
# ## Exercise 1 — `ring_all_reduce` (3 points)
#
# ```python
# def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor: ...
# ```
#
# Called by every rank of the group with a tensor of the same shape (its number of elements divisible by the world
# size `p`). Afterwards every rank's `tensor` holds the **sum** of all ranks' tensors, written in place, and the
# function returns that same tensor, as `dist.all_reduce(tensor)` does. Use only point-to-point messages
# (`dist.isend`/`dist.irecv`, `dist.batch_isend_irecv`, or `dist.send`/`dist.recv`), no collective. Organise the
# messages as a ring: each rank talks only to its two neighbours and sends `2(p−1)/p` of its tensor in all (the
# grader counts the elements each rank sends, and to whom, on 4 ranks). Watch out for deadlocks: two ranks that both
# wait in a blocking `send` to each other never finish.

# %% tags=["solution:18.ring_all_reduce"]
def ring_all_reduce(tensor):
    """Sum ``tensor`` over all ranks in place with a ring of point-to-point messages; returns ``tensor``."""
    ### BEGIN SOLUTION
    p, r = dist.get_world_size(), dist.get_rank()
    parts = tensor.view(-1).chunk(p)
    incoming = torch.empty_like(parts[0])
    for gather in (0, 1):                 # reduce-scatter, then all-gather
        for s in range(p - 1):
            out_k, in_k = (r - s + gather) % p, (r - s - 1 + gather) % p
            reqs = [dist.isend(parts[out_k].contiguous(), (r + 1) % p), dist.irecv(incoming, (r - 1) % p)]
            for req in reqs:
                req.wait()
            if gather:
                parts[in_k].copy_(incoming)
            else:
                parts[in_k].add_(incoming)
    return tensor
    ### END SOLUTION


# %% tags=["tests:18.ring_all_reduce"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("18.ring_all_reduce")  # noqa: E702
### END HIDDEN TESTS
def _ring_rank(rank, world_size):
    x = torch.arange(6.0) + 10 * rank
    out = ring_all_reduce(x)
    return out is x, x


results = launch(_ring_rank, 2, timeout_s=TIMEOUT)
for res in results:
    assert res.ok, res.describe()
    same, x = res.value
    assert same, "return the tensor you were given (the sum is written into it)"
    assert torch.equal(x, torch.arange(6.0) * 2 + 10), f"rank {res.rank}: expected 2·arange(6) + 10, got {x}"
    assert not any(c.startswith(("all_reduce", "reduce", "all_gather", "broadcast")) for c in res.calls), res.calls
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `attach_data_parallel` (5 points)
#
# ```python
# def attach_data_parallel(module: nn.Module, seed: int) -> None: ...
# ```
#
# Every rank calls it once on its own copy of the same architecture, right after building it, then trains on its
# own shard of each batch with ordinary `loss.backward()` and an optimizer step. Make that equal to one process
# training on the whole batch:
#
# - after the call, every rank's parameters and buffers equal **rank 0's** (each rank may have initialised its copy
#   from a different random state);
# - after each `loss.backward()`, every parameter's `.grad` is the **mean over ranks** of the rank-local gradients,
#   with nothing to call after backward (attach hooks; decide which hook fires at the right moment);
# - random draws after the call (dropout masks) **differ between ranks** and are a function of `seed`: the same
#   `seed` gives the same draws whatever random state the rank had before the call, another `seed` other draws
#   (the grader makes every rank's random state identical just before calling you).
#
# Evidence: 2 ranks with 4 examples each give the gradients and, after two SGD steps, the weights of one process
# with all 8 examples (the visible test checks one backward).

# %% tags=["solution:18.attach_data_parallel"]
def attach_data_parallel(module, seed):
    """Broadcast rank 0's weights, seed each rank differently, average gradients over ranks in backward hooks."""
    ### BEGIN SOLUTION
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)
    torch.manual_seed(seed + dist.get_rank())
    p = dist.get_world_size()

    def average(param):
        dist.all_reduce(param.grad)
        param.grad.div_(p)

    for param in module.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)
    ### END SOLUTION


# %% tags=["tests:18.attach_data_parallel"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("18.attach_data_parallel")  # noqa: E702
### END HIDDEN TESTS
X_DP = torch.randn(8, 6, generator=torch.Generator().manual_seed(0))
Y_DP = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))


def _dp_rank(rank, world_size):
    torch.manual_seed(rank)                                   # different initial weights on purpose
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    attach_data_parallel(model, seed=7)
    draw = torch.rand(4)
    F.mse_loss(model(X_DP[rank * 4:(rank + 1) * 4]), Y_DP[rank * 4:(rank + 1) * 4]).backward()
    return [p.grad for p in model.parameters()], draw


torch.manual_seed(0)                                          # rank 0's initial weights, in one process
whole = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
F.mse_loss(whole(X_DP), Y_DP).backward()
results = launch(_dp_rank, 2, timeout_s=TIMEOUT)
assert all(res.ok for res in results), [res.describe() for res in results if not res.ok]
for res in results:
    for g, p in zip(res.value[0], whole.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=1e-5, msg=f"rank {res.rank}: gradient differs")
assert not torch.equal(results[0].value[1], results[1].value[1]), "both ranks drew the same random numbers"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `ShardedAdamW` (4 points)
#
# ```python
# class ShardedAdamW:
#     def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2): ...
#     def step(self) -> None: ...
#     def state_numel(self) -> int: ...
# ```
#
# ZeRO stage 1. Every rank builds it on its own replica (same parameters, same order) and calls `step()` after a
# backward that left **rank-local** gradients in `.grad` (nobody averaged them: that is `step`'s job). After
# `step()` every rank holds the same parameters, equal to `torch.optim.AdamW` with the same hyper-parameters
# stepped on the gradient averaged over ranks. But each rank keeps AdamW's two moments **only for its share** of
# the parameters: `state_numel()` returns the number of moment elements this rank holds, at most `2·⌈Ψ/p⌉` for `Ψ`
# parameters (plain AdamW keeps `2Ψ`); the grader itself counts the tensors your optimizer object holds. And a step
# costs no more traffic than data parallelism: at most one all-reduce's `2(p−1)/p·Ψ` elements sent per rank (each
# collective counted as it runs bandwidth-optimally). How you cut the parameters into shares, and which collectives
# bring each rank its gradient share and everyone the updated parameters, is yours to choose (the lesson measured
# the traffic of each collective). The update is AdamW's: decoupled weight decay `θ ← θ(1 − lr·λ)`, then
# `θ ← θ − lr·m̂/(√v̂ + eps)` with bias-corrected moments.

# %% tags=["solution:18.ShardedAdamW"]
class ShardedAdamW:
    """AdamW whose two moments are kept, on each rank, only for that rank's share of the parameters."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        ### BEGIN SOLUTION
        self.params = list(params)
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.p, self.r = dist.get_world_size(), dist.get_rank()
        self.total = sum(q.numel() for q in self.params)
        self.size = -(-self.total // self.p)                 # ceil: the last share is padded with zeros
        self.m = torch.zeros(self.size)
        self.v = torch.zeros(self.size)
        self.t = 0
        ### END SOLUTION

    def state_numel(self):
        ### BEGIN SOLUTION
        return self.m.numel() + self.v.numel()
        ### END SOLUTION

    @torch.no_grad()
    def step(self):
        ### BEGIN SOLUTION
        def flat(tensors):
            out = torch.zeros(self.size * self.p)
            out[:self.total] = torch.cat([t.reshape(-1) for t in tensors])
            return out

        g = torch.empty(self.size)
        dist.reduce_scatter_single(g, flat([q.grad if q.grad is not None else torch.zeros_like(q)
                                            for q in self.params]))
        g /= self.p
        lo = self.r * self.size
        theta = flat([q.detach() for q in self.params])[lo:lo + self.size]
        self.t += 1
        b1, b2 = self.betas
        theta *= 1 - self.lr * self.wd
        self.m.mul_(b1).add_(g, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        m_hat, v_hat = self.m / (1 - b1 ** self.t), self.v / (1 - b2 ** self.t)
        theta -= self.lr * m_hat / (v_hat.sqrt() + self.eps)
        full = torch.empty(self.size * self.p)
        dist.all_gather_single(full, theta.contiguous())
        offset = 0
        for q in self.params:
            q.copy_(full[offset:offset + q.numel()].view_as(q))
            offset += q.numel()
        ### END SOLUTION


# %% tags=["tests:18.ShardedAdamW"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("18.ShardedAdamW")  # noqa: E702
### END HIDDEN TESTS
def _zero_rank(rank, world_size):
    torch.manual_seed(0)
    model = nn.Linear(6, 3)                                   # 21 parameters: shares of 11 and 10 (+1 padding)
    opt = ShardedAdamW(model.parameters(), lr=0.01)
    F.mse_loss(model(X_DP[rank * 4:(rank + 1) * 4]), Y_DP[rank * 4:(rank + 1) * 4]).backward()
    opt.step()
    return [p.detach() for p in model.parameters()], opt.state_numel()


torch.manual_seed(0)
whole = nn.Linear(6, 3)
adamw = torch.optim.AdamW(whole.parameters(), lr=0.01)
F.mse_loss(whole(X_DP), Y_DP).backward()
adamw.step()
results = launch(_zero_rank, 2, timeout_s=TIMEOUT)
assert all(res.ok for res in results), [res.describe() for res in results if not res.ok]
for res in results:
    weights, numel = res.value
    assert numel <= 2 * 11, f"rank {res.rank} keeps {numel} moment elements; ZeRO-1 allows 2·⌈21/2⌉ = 22"
    for a, b in zip(weights, whole.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), atol=1e-6, rtol=1e-5, msg=f"rank {res.rank}: weights differ")
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `row_parallel_linear` (2 points)
#
# ```python
# def row_parallel_linear(x: torch.Tensor, linear: nn.Linear, rank: int, world_size: int) -> torch.Tensor: ...
# ```
#
# Every rank gets the same input `x` `(…, in_features)` and the same full `linear` (with a bias), and returns
# `linear(x)` `(…, out_features)`, computed Megatron's row-parallel way: rank `r` uses only its slice
# `r·in/p … (r+1)·in/p − 1` of the input features (and the matching part of the weight), and the ranks combine their
# partial results with exactly **one** collective. `in_features` is divisible by `world_size`. The grader makes the
# weight columns and input features outside rank `r`'s slice NaN in rank `r`. The layer is trained, so the output
# must be differentiable: a backward through it gives each rank the full layer's gradients for its input features,
# its weight columns and the bias. Where does the bias go?

# %% tags=["solution:18.row_parallel_linear"]
def row_parallel_linear(x, linear, rank, world_size):
    """``linear(x)`` from this rank's slice of the input features and one collective."""
    ### BEGIN SOLUTION
    width = linear.in_features // world_size
    mine = slice(rank * width, (rank + 1) * width)
    partial = x[..., mine] @ linear.weight[:, mine].T
    dist.all_reduce(partial)
    return partial + linear.bias
    ### END SOLUTION


# %% tags=["tests:18.row_parallel_linear"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("18.row_parallel_linear")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
LIN = nn.Linear(4, 2)
X_ROW = torch.randn(3, 4)


def _row_rank(rank, world_size):
    with torch.no_grad():
        return row_parallel_linear(X_ROW, LIN, rank, world_size)


results = launch(_row_rank, 2, timeout_s=TIMEOUT)
for res in results:
    assert res.ok, res.describe()
    torch.testing.assert_close(res.value, LIN(X_ROW).detach(), msg=f"rank {res.rank}: output differs from linear(x)")
    assert len(res.calls) == 1, f"rank {res.rank} called {res.calls}; one collective is enough"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `tp_swiglu` (3 points)
#
# ```python
# def tp_swiglu(x: torch.Tensor, ff: SwiGLUFeedForward, rank: int, world_size: int) -> torch.Tensor: ...
# ```
#
# Unit 11's SwiGLU block `down_proj(silu(gate_proj(x)) ⊙ up_proj(x))` (bias-free) split Megatron's way over the
# ranks: `gate_proj` and `up_proj` are **column-parallel** (rank `r` owns rows `r·h/p … (r+1)·h/p − 1` of their
# weights: its slice of the `h` hidden features) and `down_proj` is **row-parallel** (rank `r` owns the matching
# columns of its weight). Every rank gets the same input `x` `(…, D)` and a full `ff` in which only its own shards
# are usable (the grader fills the rest with NaN), and returns `ff(x)` `(…, D)`; `h` is divisible by `world_size`.
# The block is trained, so it must be right backward too: a backward through the output gives every rank the
# **full** gradient of `x` (what the layer below needs, the same on every rank) and, for its own shards, the dense
# block's weight gradients (rows of `gate_proj`/`up_proj`, columns of `down_proj`). The ranks communicate only with
# all-reduces of `(…, D)`-sized tensors, as few as the block needs; the grader counts them separately in the
# forward and in the backward pass. Which communication happens when, and how to make one happen in the backward
# pass (a `torch.autograd.Function` defines its own backward), is yours to work out.

# %% tags=["solution:18.tp_swiglu"]
def tp_swiglu(x, ff, rank, world_size):
    """``ff(x)`` computed from this rank's shards: gate/up column-parallel, down row-parallel."""
    ### BEGIN SOLUTION
    class EnterRegion(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    width = ff.gate_proj.out_features // world_size
    mine = slice(rank * width, (rank + 1) * width)
    xin = EnterRegion.apply(x)
    hidden = F.silu(xin @ ff.gate_proj.weight[mine].T) * (xin @ ff.up_proj.weight[mine].T)
    out = hidden @ ff.down_proj.weight[:, mine].T
    dist.all_reduce(out)
    return out
    ### END SOLUTION


# %% tags=["tests:18.tp_swiglu"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("18.tp_swiglu")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
FF = SwiGLUFeedForward(4, 6)
X_TP = torch.randn(3, 4)


def _tp_rank(rank, world_size):
    x = X_TP.clone().requires_grad_(True)
    out = tp_swiglu(x, FF, rank, world_size)
    out.pow(2).sum().backward()
    return out.detach(), x.grad


x_whole = X_TP.clone().requires_grad_(True)
want = FF(x_whole)
want.pow(2).sum().backward()
results = launch(_tp_rank, 2, timeout_s=TIMEOUT)
for res in results:
    assert res.ok, res.describe()
    out, grad_x = res.value
    torch.testing.assert_close(out, want.detach(), msg=f"rank {res.rank}: output differs from the full block")
    assert grad_x is not None, f"rank {res.rank}: no gradient reached x"
    torch.testing.assert_close(grad_x, x_whole.grad, msg=f"rank {res.rank}: ∂x differs from the full block's")
    assert all(c.startswith("all_reduce") for c in res.calls), f"rank {res.rank} called {res.calls}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 6 — `expert_parallel_moe` (3 points)
#
# ```python
# def expert_parallel_moe(x: torch.Tensor, moe: DeepSeekMoE, rank: int, world_size: int) -> torch.Tensor: ...
# ```
#
# Unit 14's `DeepSeekMoE` with its `E` routed experts split over the ranks: rank `r` owns experts
# `r·E/p … (r+1)·E/p − 1` (`E` divisible by `p`). Every rank calls the function with **its own tokens** `x`
# `(…, D)` and a `moe` in which only its own experts' weights are usable (the grader fills the others with NaN);
# the router (`moe.gate`) and the shared experts are replicated. Return `moe(x)` for this rank's tokens: route
# locally, send each (token, slot) to the rank owning its expert with `dist.all_to_all_single`, run the local
# experts on what arrives, send the results back the same way, and combine them with the gate weights and the
# shared experts. Forward only (called under `torch.no_grad()`). A rank does not know in advance how many rows the
# others will send it. The grader records what your all-to-alls carry: every other rank must receive exactly the
# token vectors routed to its experts (one row per (token, slot)), and no other collective may carry tokens.

# %% tags=["solution:18.expert_parallel_moe"]
def expert_parallel_moe(x, moe, rank, world_size):
    """DeepSeekMoE forward with the routed experts split over the ranks (all-to-all dispatch and combine)."""
    ### BEGIN SOLUTION
    per = moe.n_routed_experts // world_size
    tokens = x.reshape(-1, x.shape[-1])
    _, weights, experts = moe.gate(tokens)
    k = experts.shape[1]
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    send = torch.bincount(flat // per, minlength=world_size)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_l, recv_l = send.tolist(), recv.tolist()
    rows = torch.empty(sum(recv_l), tokens.shape[1])
    dist.all_to_all_single(rows, tokens[order // k].contiguous(), recv_l, send_l)
    ids = torch.empty(sum(recv_l), dtype=flat.dtype)
    dist.all_to_all_single(ids, flat[order].contiguous(), recv_l, send_l)
    results = torch.zeros_like(rows)
    for e in range(rank * per, (rank + 1) * per):
        hit = ids == e
        if hit.any():
            results[hit] = moe.experts[e](rows[hit])
    back = torch.empty(len(order), tokens.shape[1])
    dist.all_to_all_single(back, results, send_l, recv_l)
    out = torch.zeros_like(tokens).index_add_(0, order // k, back * weights.reshape(-1)[order, None])
    out = out.view_as(x)
    if moe.shared_experts is not None:
        out = out + moe.shared_experts(x)
    return out
    ### END SOLUTION


# %% tags=["tests:18.expert_parallel_moe"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("18.expert_parallel_moe")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
MOE = DeepSeekMoE(8, 8, n_routed_experts=4, n_shared_experts=1, top_k=2)
for prm in MOE.parameters():
    torch.nn.init.normal_(prm, std=0.3)
X_EP = torch.randn(2, 3, 8)                               # rank r's tokens: X_EP[r]


def _ep_rank(rank, world_size):
    with torch.no_grad():
        return expert_parallel_moe(X_EP[rank:rank + 1], MOE, rank, world_size)


with torch.no_grad():
    want = MOE(X_EP.unsqueeze(1))
results = launch(_ep_rank, 2, timeout_s=TIMEOUT)
for res in results:
    assert res.ok, res.describe()
    torch.testing.assert_close(res.value, want[res.rank], atol=1e-5, rtol=1e-5,
                               msg=f"rank {res.rank}: output differs from the single-process DeepSeekMoE")
    assert any(c.startswith("all_to_all") for c in res.calls), "use dist.all_to_all_single to move the tokens"
print("visible tests passed")
