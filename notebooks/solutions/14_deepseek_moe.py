# %% [markdown]
# # Unit 14 — DeepSeek mixture-of-experts: exercises
#
# Six graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: your router and your layer are compared with Hugging
# Face's DeepSeek-V3 router (`DeepseekV3TopkRouter`) and mixture-of-experts layer (`DeepseekV3MoE`) with
# the same weights and random correction biases, the balance losses with their closed forms, boundary cases
# and gradients, the bias update with the sign rule, and the layer's structure (which tensors are parameters
# and which are buffers, which experts actually run, that a forward changes no parameter or buffer). When something fails it tells you what was expected, what
# came back and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/14_deepseek_moe/14_deepseek_moe.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. The layer of exercise 5 uses your routing function
# (exercise 3) and your bias update (exercise 4), so finish them in order.

# %%
import math  # noqa: F401

import torch
import torch.nn.functional as F  # noqa: F401
from torch import Tensor, nn  # noqa: F401

import llmcourse
from llmcourse.models import SwiGLUFeedForward  # unit 11's gated MLP: each expert is one of these

cfg = llmcourse.setup_notebook("14")

# %% [markdown]
# ## Exercise 1 — `softmax_topk_route` (2 points)
#
# ```python
# def softmax_topk_route(logits: Tensor, k: int, renormalize: bool = True) -> tuple[Tensor, Tensor, Tensor]: ...
# ```
#
# `logits` `(N, E)`: one row of router scores per token. Return `(weights (N, k), indices (N, k), probs (N, E))`:
# `probs` is the softmax over the `E` experts; `indices` are the `k` most probable experts of each token,
# by descending probability; `weights` are the probabilities of those experts, divided by their sum when
# `renormalize` is true (so that each row sums to 1).

# %% tags=["solution:14.softmax_topk_route"]
def softmax_topk_route(logits, k, renormalize=True):
    ### BEGIN SOLUTION
    probs = torch.softmax(logits, dim=-1)
    weights, indices = probs.topk(k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, indices, probs
    ### END SOLUTION


# %% tags=["tests:14.softmax_topk_route"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("14.softmax_topk_route")  # noqa: E702
### END HIDDEN TESTS
w, i, p = softmax_topk_route(torch.tensor([[2.0, 1.0, 0.5, 0.0]]), 2)
assert w.shape == (1, 2) and i.shape == (1, 2) and p.shape == (1, 4), "shapes (N, k), (N, k), (N, E)"
assert i.tolist() == [[0, 1]], f"the two most probable experts are 0 and 1, got {i.tolist()}"
assert torch.allclose(w, torch.tensor([[0.7311, 0.2689]]), atol=1e-4), f"renormalised weights: {w}"
assert torch.allclose(w.sum(-1), torch.ones(1)), "renormalised weights sum to 1"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `load_balancing_loss` (3 points)
#
# ```python
# def load_balancing_loss(probs: Tensor, indices: Tensor, num_experts: int, alpha: float = 0.01) -> Tensor: ...
# ```
#
# `probs` `(N, E)` (rows sum to 1), `indices` `(N, k)` long: each token sent to `k` experts. Return the scalar
# `alpha · Σ_i f_i · P_i`, where `P_i` is the mean over tokens of `probs[t, i]` and `f_i` is proportional to the
# number of `(token, slot)` assignments to expert `i`. The normalisation of `f_i` is yours to choose; the grader
# holds it to two boundary cases, **for any `k`**:
#
# - a uniform router (`probs` all `1/E`) whose assignments are perfectly balanced gives **exactly `alpha`**;
# - a router that sends every token to expert 0 with probability 1 (`k = 1`) gives **`alpha · E`**.
#
# The counts carry no gradient; the loss must be differentiable in `probs`.

# %% tags=["solution:14.load_balancing_loss"]
def load_balancing_loss(probs, indices, num_experts, alpha=0.01):
    ### BEGIN SOLUTION
    n, k = indices.shape
    counts = torch.bincount(indices.reshape(-1), minlength=num_experts).to(probs.dtype)
    f = counts * num_experts / (k * n)
    return alpha * (f * probs.mean(dim=0)).sum()
    ### END SOLUTION


# %% tags=["tests:14.load_balancing_loss"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("14.load_balancing_loss")  # noqa: E702
### END HIDDEN TESTS
uniform = torch.full((8, 4), 0.25)
balanced = torch.tensor([[0, 1], [2, 3]] * 4)
loss = load_balancing_loss(uniform, balanced, 4, alpha=0.01)
assert loss.dim() == 0, "the loss is a scalar"
assert abs(loss.item() - 0.01) < 1e-7, f"a uniform, balanced router gives exactly alpha; got {loss.item()}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `deepseek_route` (6 points)
#
# ```python
# def deepseek_route(router_logits: Tensor, bias: Tensor, top_k: int, n_group: int, topk_group: int,
#                    routed_scaling_factor: float = 1.0, norm_topk_prob: bool = True) -> tuple[Tensor, Tensor]: ...
# ```
#
# DeepSeek-V3's routing, for `router_logits` `(N, E)` and `bias` `(E,)`:
#
# 1. affinities `s = sigmoid(router_logits)` in float32; scores for choosing `sb = s + bias`;
# 2. split the `E` experts into `n_group` contiguous groups; a group's score is the **sum of the two largest**
#    `sb` in it; keep the `topk_group` best groups; an expert outside them must never be chosen, whatever
#    its score (how to exclude it is your decision: see the worked example below);
# 3. `indices` = the `top_k` experts with the largest `sb` among those allowed (long);
# 4. `weights` = the **unbiased** `s` of those experts; if `norm_topk_prob`, divide them by their sum
#    (+1e-20); multiply by `routed_scaling_factor`.
#
# Return `(weights (N, top_k) float32, indices (N, top_k) long)`. The bias only decides *which* experts
# are chosen, never how much they count.
#
# **Worked example** (the visible test): affinities `[0.9, 0.8, 0.3, 0.2]`, bias `[−1.0, −1.0, −1.5, −1.5]`, two
# groups of two, keep one, `top_k = 2`. The biased scores `[−0.1, −0.2, −1.2, −1.3]` are all **negative**; group 0
# wins (`−0.3` against `−2.5`), so the answer is experts `{0, 1}` with weights `0.9/1.7` and `0.8/1.7`.

# %% tags=["solution:14.deepseek_route"]
def deepseek_route(router_logits, bias, top_k, n_group, topk_group, routed_scaling_factor=1.0,
                   norm_topk_prob=True):
    ### BEGIN SOLUTION
    n, e = router_logits.shape
    s = torch.sigmoid(router_logits.float())
    sb = s + bias.float()
    per_group = sb.view(n, n_group, e // n_group)
    group_scores = per_group.topk(2, dim=-1).values.sum(dim=-1)
    best_groups = group_scores.topk(topk_group, dim=-1).indices
    group_keep = torch.zeros(n, n_group, dtype=torch.bool).scatter(1, best_groups, True)
    expert_keep = group_keep.repeat_interleave(e // n_group, dim=1)
    sb = sb.masked_fill(~expert_keep, float("-inf"))
    indices = sb.topk(top_k, dim=-1).indices
    weights = s.gather(1, indices)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, indices
    ### END SOLUTION


# %% tags=["tests:14.deepseek_route"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("14.deepseek_route")  # noqa: E702
### END HIDDEN TESTS
logits = torch.logit(torch.tensor([[0.9, 0.8, 0.3, 0.2]]))
bias = torch.tensor([-1.0, -1.0, -1.5, -1.5])
w, i = deepseek_route(logits, bias, top_k=2, n_group=2, topk_group=1)
assert w.dtype == torch.float32 and i.dtype == torch.long, "weights float32, indices long"
assert sorted(i[0].tolist()) == [0, 1], f"the first group wins (scores −0.3 vs −2.5); got experts {i.tolist()}"
order = i[0].argsort()
assert torch.allclose(w[0, order], torch.tensor([0.9 / 1.7, 0.8 / 1.7]), atol=1e-4), \
    f"weights come from the unbiased scores 0.9 and 0.8, normalised; got {w}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `update_bias` (2 points)
#
# ```python
# @torch.no_grad()
# def update_bias(bias: Tensor, indices: Tensor, num_experts: int, gamma: float = 0.001) -> Tensor: ...
# ```
#
# `c_i` = the number of `(token, slot)` assignments to expert `i` in `indices`; `c̄` = the mean of `c`.
# Return a **new float32** tensor `bias + gamma · sign(c̄ − c)` (also for a bfloat16 `bias`):
# experts that got more than their share go down by `gamma`, the others go up, balanced ones stay.

# %% tags=["solution:14.update_bias"]
@torch.no_grad()
def update_bias(bias, indices, num_experts, gamma=0.001):
    ### BEGIN SOLUTION
    c = torch.bincount(indices.reshape(-1), minlength=num_experts).float()
    return bias.float() + gamma * torch.sign(c.mean() - c)
    ### END SOLUTION


# %% tags=["tests:14.update_bias"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("14.update_bias")  # noqa: E702
### END HIDDEN TESTS
idx = torch.tensor([[0, 0], [0, 0], [0, 1], [2, 3]])  # loads 5, 1, 1, 1
new = update_bias(torch.zeros(4), idx, 4, gamma=0.001)
assert new.dtype == torch.float32
assert torch.allclose(new, torch.tensor([-0.001, 0.001, 0.001, 0.001])), f"got {new}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `DeepSeekMoE` (5 points)
#
# ```python
# class DeepSeekMoE(nn.Module):
#     def __init__(self, d_model, moe_intermediate_size, n_routed_experts, n_shared_experts, top_k,
#                  n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
#                  bias_update_speed=0.001): ...
#     def forward(self, x: Tensor) -> Tensor: ...   # (B, T, D) -> (B, T, D)
#     def update_bias(self) -> None: ...
# ```
#
# `state_dict` keys (the names of Hugging Face's DeepSeek-V3, so its weights load directly):
#
# | key | shape |
# |---|---|
# | `gate.weight` | `(E, D)` (the router; no bias) |
# | `gate.e_score_correction_bias` | `(E,)` float32, a registered **buffer**, never a parameter |
# | `experts.{e}.gate_proj.weight`, `experts.{e}.up_proj.weight` | `(I, D)` |
# | `experts.{e}.down_proj.weight` | `(D, I)` |
# | `shared_experts.gate_proj.weight`, `shared_experts.up_proj.weight` | `(I·S, D)` |
# | `shared_experts.down_proj.weight` | `(D, I·S)` |
#
# Each expert and the shared block are SwiGLU MLPs (unit 11's `SwiGLUFeedForward` is imported above);
# `gate` is a small module of your own holding the router weight and the bias buffer.
# `forward`: router logits `x @ gate.weight.T` computed in float32, then your `deepseek_route`; the output
# for each token is `Σ_j weights_j · expert_{indices_j}(x) + shared_experts(x)` (no residual). Run each
# expert only on the tokens routed to it (an expert with no tokens is not called). In training mode keep
# the chosen indices of the last call in `self.last_indices` `(N, top_k)`; `update_bias()` replaces the
# bias buffer's values by your `update_bias(bias, self.last_indices, E, bias_update_speed)`.

# %% tags=["solution:14.DeepSeekMoE"]
class DeepSeekMoE(nn.Module):
    def __init__(self, d_model, moe_intermediate_size, n_routed_experts, n_shared_experts, top_k, n_group=1,
                 topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True, bias_update_speed=0.001):
        super().__init__()
        ### BEGIN SOLUTION
        self.d_model, self.num_experts, self.top_k = d_model, n_routed_experts, top_k
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor, self.norm_topk_prob = routed_scaling_factor, norm_topk_prob
        self.bias_update_speed = bias_update_speed
        self.gate = nn.Module()
        self.gate.weight = nn.Parameter(0.02 * torch.randn(n_routed_experts, d_model))
        self.gate.register_buffer("e_score_correction_bias", torch.zeros(n_routed_experts))
        self.experts = nn.ModuleList([SwiGLUFeedForward(d_model, moe_intermediate_size)
                                      for _ in range(n_routed_experts)])
        self.shared_experts = SwiGLUFeedForward(d_model, moe_intermediate_size * n_shared_experts)
        self.last_indices = None
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        flat = x.reshape(-1, self.d_model)
        logits = flat.float() @ self.gate.weight.float().T
        weights, indices = deepseek_route(logits, self.gate.e_score_correction_bias, self.top_k, self.n_group,
                                          self.topk_group, self.routed_scaling_factor, self.norm_topk_prob)
        if self.training:
            self.last_indices = indices.detach()
        out = torch.zeros_like(flat)
        for e in range(self.num_experts):
            token, slot = torch.where(indices == e)
            if token.numel() == 0:
                continue
            y = self.experts[e](flat[token]) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y.to(out.dtype))
        return out.view_as(x) + self.shared_experts(x)
        ### END SOLUTION

    @torch.no_grad()
    def update_bias(self):
        ### BEGIN SOLUTION
        b = self.gate.e_score_correction_bias
        b.copy_(update_bias(b, self.last_indices, self.num_experts, self.bias_update_speed))
        ### END SOLUTION


# %% tags=["tests:14.DeepSeekMoE"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("14.DeepSeekMoE")  # noqa: E702
### END HIDDEN TESTS
moe = DeepSeekMoE(16, 8, n_routed_experts=4, n_shared_experts=1, top_k=2)
keys = set(moe.state_dict())
assert "gate.e_score_correction_bias" in keys, "the bias is part of the state_dict (a persistent buffer)"
assert "gate.e_score_correction_bias" not in dict(moe.named_parameters()), "the bias must not be a parameter"
assert {"gate.weight", "experts.3.down_proj.weight", "shared_experts.up_proj.weight"} <= keys, sorted(keys)
x = torch.randn(2, 5, 16)
assert moe(x).shape == (2, 5, 16)
moe.train()
moe(x)
assert moe.last_indices.shape == (10, 2), "training mode stores the (N, top_k) routing"
print("visible tests passed")


# %% [markdown]
# ## Exercise 6 — `sequence_balance_loss` (2 points)
#
# ```python
# def sequence_balance_loss(scores: Tensor, indices: Tensor, num_experts: int, alpha: float = 0.0001) -> Tensor: ...
# ```
#
# DeepSeek-V3 adds to its loss-free balancing a tiny **sequence-wise** balance loss: the product of exercise 2,
# asked of every sequence on its own. `scores` `(B, T, E)` are a batch's non-negative affinities (DeepSeek-V3: the
# sigmoid scores, which do **not** sum to 1 over the experts) and `indices` `(B, T, k)` long the experts each token
# was sent to. For each sequence `b`, with its `T` tokens only:
#
# - `f_i` counts expert `i`'s assignments, normalised as in exercise 2 (a perfectly balanced sequence: `f_i = 1`);
# - `P_i` is the mean over the sequence's tokens of expert `i`'s **share of that token's total affinity**;
# - the sequence's loss is `alpha · Σ_i f_i · P_i`.
#
# Return the **mean** over the `B` sequences, a scalar differentiable in `scores` (the counts carry no gradient).
# Two properties the grader checks: a batch whose sequences are each balanced, with equal affinities for all
# experts (of any value), gives exactly `alpha`; a batch of two sequences collapsed onto different experts,
# balanced as a batch, is penalised as much as one such sequence alone.

# %% tags=["solution:14.sequence_balance_loss"]
def sequence_balance_loss(scores, indices, num_experts, alpha=0.0001):
    ### BEGIN SOLUTION
    b, t, k = indices.shape
    counts = torch.zeros(b, num_experts, dtype=scores.dtype)
    counts = counts.scatter_add(1, indices.reshape(b, -1), torch.ones(b, t * k, dtype=scores.dtype))
    shares = scores / scores.sum(dim=-1, keepdim=True)
    per_seq = (counts * num_experts / (k * t) * shares.mean(dim=1)).sum(dim=-1)
    return alpha * per_seq.mean()
    ### END SOLUTION


# %% tags=["tests:14.sequence_balance_loss"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("14.sequence_balance_loss")  # noqa: E702
### END HIDDEN TESTS
even = torch.tensor([[[0, 1], [2, 3]] * 4] * 2)                         # (B=2, T=8, k=2): balanced per sequence
flat_scores = torch.full((2, 8, 4), 0.37)                                # equal affinities, not summing to 1
loss = sequence_balance_loss(flat_scores, even, 4, alpha=0.01)
assert loss.dim() == 0, "the loss is a scalar"
assert abs(loss.item() - 0.01) < 1e-7, f"balanced sequences with equal affinities give exactly alpha; got {loss.item()}"
one = torch.rand(1, 12, 8, generator=torch.Generator().manual_seed(4))
one_idx = one.topk(2, -1).indices
single = load_balancing_loss((one / one.sum(-1, keepdim=True))[0], one_idx[0], 8, 0.001)
assert torch.allclose(sequence_balance_loss(one, one_idx, 8, 0.001), single, atol=1e-8), \
    "a batch of one sequence equals exercise 2's loss on the affinities normalised per token"
print("visible tests passed")
