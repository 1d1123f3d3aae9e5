# %% [markdown]
# # Unit 14 — DeepSeek mixture-of-experts
#
# A transformer block spends most of its parameters and most of its arithmetic in the feed-forward
# network. A mixture-of-experts (MoE) layer keeps many feed-forward networks ("experts") and lets a small
# router pick a few of them for each token: the model stores many parameters but each token only pays
# for the ones it uses. This lesson builds the idea up to DeepSeek-V3's version and checks every step
# with numbers:
#
# 1. where the parameters are; total vs active parameters;
# 2. experts and a router;
# 3. softmax top-k routing;
# 4. dispatch and combine: sorted, gathered, one grouped product per projection, equal to a dense reference;
# 5. load imbalance, the auxiliary balancing loss (batch-wise and sequence-wise), expert capacity and dropped
#    tokens (with a spot-the-bug);
# 6. DeepSeek-V3 routing: sigmoid affinities, a bias that only chooses, the sign update;
# 7. shared experts (with a spot-the-bug);
# 8. fine-grained experts and the number of combinations;
# 9. group-limited (node-limited) routing: why a group is scored by its two best experts, and what can go
#    wrong when excluded groups are masked;
# 10. parity with Hugging Face's DeepSeek-V3 layer;
# 11. the balance experiment, dropped tokens of the trained models, and where the time of an MoE layer goes.
#
# The exercise notebook (`exercises/14_deepseek_moe/14_deepseek_moe.ipynb`) asks you to write the routing
# functions and the layer. Here we use the finished versions from `llmcourse` and check every claim.

# %%
import math
import time

import torch

import llmcourse
from llmcourse.models import deepseek_moe as M
from llmcourse.models.llama3 import SwiGLUFeedForward, llama3_param_breakdown
from llmcourse.train import moe_char
from llmcourse.viz import moe as vmoe

cfg = llmcourse.setup_notebook("14")
print(dict(cfg))

# %% [markdown]
# ## 1. Where the parameters are
#
# Take the small character Llama of unit 11 (with SwiGLU width three times the model width). Count its
# parameters per part: the feed-forward networks hold the largest share of the blocks.

# %%
dense_cfg = moe_char.dense_char_model().cfg
parts = llama3_param_breakdown(dense_cfg)
block = parts["attention"] + parts["ffn"] + parts["block_norms"]
print({k: v for k, v in parts.items()})
print(f"feed-forward share of the block parameters: {parts['ffn'] / block:.1%}")

# %% [markdown]
# Replace each feed-forward network by an MoE layer with `E` routed experts of width `I`, `S` shared experts
# and top-`k` routing. The layer stores all experts but runs only `k` routed ones plus the shared ones per
# token. With the sizes of this unit's tiny model:

# %%
sizes = dict(d_model=128, moe_intermediate_size=128, n_routed_experts=8, n_shared_experts=1, top_k=2)
counts = M.moe_param_counts(**sizes)
layer = M.DeepSeekMoE(**sizes)
print(counts)
print("parameters of the module:", sum(p.numel() for p in layer.parameters()), "(formula:", counts["total"], ")")
print(f"active / total per token: {counts['active'] / counts['total']:.1%}")
# DeepSeek-V3 as reported in its technical report (not computed here)
V3 = dict(total=671e9, active=37e9, routed=256, top_k=8, shared=1, n_group=8, topk_group=4, scale=2.5, dense_layers=3)
print(f"DeepSeek-V3 (reported): {V3['active'] / V3['total']:.1%} of its parameters active per token; "
      f"{V3['routed']} routed experts, top-{V3['top_k']}, {V3['shared']} shared")

# %% [markdown]
# ## 2. Experts and a router
#
# Each expert is unit 11's SwiGLU network. The router is a linear map from the token's hidden state to one
# score per expert, `gate.weight` of shape `(E, D)`, with no bias. In DeepSeek-V3 the router's product is
# computed in float32.

# %%
print(layer.gate)
print(layer.experts[0])
print({k: tuple(v.shape) for k, v in list(layer.state_dict().items())[:5]}, "...")

# %% [markdown]
# ## 3. Softmax top-k routing
#
# The classic router (Switch Transformer, GShard, Mixtral) applies a softmax over all experts, keeps the `k`
# most probable, and (optionally) renormalises the kept probabilities. Renormalising the top-k probabilities
# gives exactly a softmax over the `k` selected logits, because the common denominator cancels.

# %%
example = torch.tensor([[2.0, 1.0, 0.5, 0.0]])
w, idx, probs = M.softmax_topk_route(example, 2)
print("probs", probs.numpy().round(4), "indices", idx.tolist(), "weights", w.numpy().round(4))
many = torch.randn(1000, 8, generator=torch.Generator().manual_seed(0))
w, idx, probs = M.softmax_topk_route(many, 3)
gap = (w - torch.softmax(many.gather(1, idx), -1)).abs().max().item()
print(f"renormalised weights vs softmax of the selected logits: max |Δ| = {gap:.1e}")

# %% [markdown]
# ## 4. Dispatch and combine
#
# A dense reference runs every expert on every token and multiplies by a gate matrix that is zero outside the
# chosen experts. The sparse version runs each expert only on the tokens routed to it. The library's layer does
# this without a Python loop over experts: it sorts the `N·k` (token, slot) assignments by expert once, gathers
# the rows of the routed tokens into one expert-sorted block, runs **one grouped matrix product per projection**
# over the blocks (`torch.nn.functional.grouped_mm`: expert `e` multiplies only its own rows), weights the rows
# and adds them back at their tokens. Both give the same output; only the sparse one saves work. Below, the
# library's layer is compared with a dense computation written from the definition.

# %%
torch.manual_seed(0)
x = torch.randn(4, 16, 128)
layer.eval()
with torch.no_grad():
    sparse = layer(x)
    flat = x.reshape(-1, 128)
    _, weights, chosen = layer.gate(flat)
    gate_matrix = torch.zeros(flat.shape[0], 8).scatter(1, chosen, weights)        # (N, E), zero off the top-k
    every_expert = torch.stack([e(flat) for e in layer.experts], 1)                # (N, E, D): all experts, all tokens
    dense = (gate_matrix.unsqueeze(-1) * every_expert).sum(1) + layer.shared_experts(flat)
print(f"sparse vs dense: max |Δ| = {(sparse.reshape(-1, 128) - dense).abs().max().item():.1e}")
print("tokens per expert:", M.expert_counts(chosen, 8).tolist(), "of", chosen.numel(), "assignments")

# %% [markdown]
# ## 5. Load imbalance and the auxiliary loss
#
# Nothing forces a router to spread tokens. Early preferences get reinforced: an expert that receives more
# tokens is trained more, becomes better, and receives even more. In the extreme ("collapse") a few experts
# do everything and the others are dead weight; with experts spread over devices, the busiest one sets the pace.
#
# The Switch/GShard remedy adds `α·Σ_i f_i·P_i` to the loss, where `f_i` is expert `i`'s share of the
# assignments (normalised so that a balanced router has `f_i = 1`) and `P_i` its mean router probability. The
# counts carry no gradient; the gradient pushes probability away from over-used experts. A uniform router
# with balanced assignments gives exactly `α`; total collapse onto one expert gives `α·E`.

# %%
alpha, n_exp = 0.01, 4
uniform = torch.full((8, n_exp), 1 / n_exp)
balanced = torch.tensor([[0, 1], [2, 3]] * 4)
collapsed = torch.zeros(8, n_exp)
collapsed[:, 0] = 1
print("uniform, balanced:", M.load_balancing_loss(uniform, balanced, n_exp, alpha).item(), " α =", alpha)
print("collapsed:", M.load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long), n_exp, alpha).item(),
      " α·E =", alpha * n_exp)
torch.manual_seed(1)
init_logits = torch.randn(512, 8) * 0.02
w, idx, probs = M.softmax_topk_route(init_logits, 2)
print(f"a freshly initialised router: loss {M.load_balancing_loss(probs, idx, 8, alpha).item():.5f} (close to α)")

# %% [markdown]
# The catch: this loss competes with the language-modelling loss. Too small and it does not balance, too
# large and it hurts quality.
#
# **Batch-wise or sequence-wise?** The loss above measures balance over all the tokens of a batch. A batch can be
# balanced while every sequence in it is not: below, two sequences of eight tokens, the first sent entirely to
# experts 0 and 1, the second to experts 2 and 3, with a router that is equally sure of its choices. DeepSeek-V3
# keeps a tiny **sequence-wise** version of the loss (the same product per sequence, with the affinities
# normalised per token, averaged over sequences) next to its main, loss-free balancing: it guards against a
# single sequence piling onto a few experts.

# %%
seq_idx = torch.tensor([[[0, 1]] * 8, [[2, 3]] * 8])                       # (B=2, T=8, k=2)
seq_scores = torch.full((2, 8, n_exp), 0.1).scatter(2, seq_idx, 0.9)      # sure of its two experts
flat_probs = (seq_scores / seq_scores.sum(-1, keepdim=True)).reshape(-1, n_exp)
batch_loss = M.load_balancing_loss(flat_probs, seq_idx.reshape(-1, 2), n_exp, alpha)
seq_loss = M.sequence_balance_loss(seq_scores, seq_idx, n_exp, alpha)
print(f"batch-wise loss {batch_loss.item():.4f} (α = {alpha}: looks balanced); sequence-wise loss "
      f"{seq_loss.item():.4f} = {seq_loss.item() / alpha:.2f}·α (each sequence uses {2} of {n_exp} experts)")
assert seq_loss > 1.5 * batch_loss

# %% [markdown]
# ### Capacity and dropped tokens
#
# Switch Transformer and GShard bound the work of each expert: an expert accepts at most
# `C = ⌊capacity factor · k·N/E⌋` assignments of a batch (`k·N/E` is its share under perfect balance). Switch
# (k = 1) serves the assignments in token order; GShard's Algorithm 1 first fills every token's first choice, then
# the second choices, and keeps a second choice only with probability proportional to 2·g₂ (its gate weight). The
# library's `capacity_mask` serves in token order. The assignments beyond `C` are **dropped** (the token skips that expert and the residual connection
# carries it on). A capacity factor above 1 leaves slack for imbalance at the price of padded, idle slots.
# DeepSeek-V3 drops no tokens at all, in training or inference: it relies on its routing staying balanced. (How
# many tokens the trained models would drop is measured after the balance experiment of section 11.)
#
# ### Spot the bug: a capacity that drops tokens of a perfectly balanced router
#
# The function below computes which assignments an expert keeps. On a perfectly balanced routing (every expert
# receives exactly its share) at capacity factor 1.0 it should drop nothing. It drops some. Read it and find why:

# %%
def keep_within_capacity_buggy(indices, num_experts, capacity_factor):
    """(N, k) expert indices -> (kept (N, k) bool, capacity): each expert serves its first C assignments."""
    n_tokens, k = indices.shape
    capacity = math.floor(capacity_factor * n_tokens / num_experts)
    served = [0] * num_experts
    kept = torch.zeros(n_tokens, k, dtype=torch.bool)
    for t in range(n_tokens):                   # token order: earlier tokens are served first
        for j in range(k):
            e = int(indices[t, j])
            if served[e] < capacity:
                kept[t, j] = True
                served[e] += 1
    return kept, capacity


def dropped_share(kept):
    return 1.0 - kept.float().mean().item()


n_tok, e_cap, k_cap = 64, 8, 2
balanced_idx = torch.arange(n_tok * k_cap).remainder(e_cap).view(n_tok, k_cap)  # every expert gets k·N/E
print("assignments per expert:", M.expert_counts(balanced_idx, e_cap).tolist())
for cf in (1.0, 1.25):
    kept_b, cap_b = keep_within_capacity_buggy(balanced_idx, e_cap, cf)
    print(f"capacity factor {cf}: C = {cap_b}, dropped {dropped_share(kept_b):.0%} of the assignments")

# %% [markdown]
# **Your fix.** Correct `keep_within_capacity` below (one expression is wrong), then run the self-check. It
# compares your function with an independent count on the balanced routing (nothing dropped at 1.0) and on a
# skewed one.

# %%
def keep_within_capacity(indices, num_experts, capacity_factor):
    # TODO: fix the capacity (what is an expert's share of the N·k assignments under perfect balance?)
    n_tokens, k = indices.shape
    capacity = math.floor(capacity_factor * n_tokens / num_experts)
    served = [0] * num_experts
    kept = torch.zeros(n_tokens, k, dtype=torch.bool)
    for t in range(n_tokens):
        for j in range(k):
            e = int(indices[t, j])
            if served[e] < capacity:
                kept[t, j] = True
                served[e] += 1
    return kept, capacity


def self_check_capacity(fn):
    skewed = torch.tensor([[0, 1]] * 24 + [[2, 3]] * 8)           # experts 0, 1 get 24 each; C = 8 at factor 1
    try:
        ok = (dropped_share(fn(balanced_idx, e_cap, 1.0)[0]) == 0.0
              and fn(skewed, 8, 1.0)[1] == 8 and int(fn(skewed, 8, 1.0)[0].sum()) == 8 + 8 + 8 + 8)
    except Exception as exc:  # noqa: BLE001 - a learner's error is a "not yet", never a crash
        print(f"✗ not yet: {type(exc).__name__}: {exc}")
        return False
    print("✓ a balanced router loses nothing at capacity 1.0, and the skewed one keeps C per expert" if ok else
          "✗ not yet: at capacity factor 1.0 a perfectly balanced routing must keep every assignment")
    return ok


self_check_capacity(keep_within_capacity);

# %% jupyter={"source_hidden": true}
# Reference fix: a token sends k assignments, so the N tokens make N·k assignments and an expert's share under
# perfect balance is k·N/E, not N/E; the capacity is floor(factor · k·N/E). The library's capacity_mask computes
# the same with a cumulative count instead of a loop; the self-check runs on it.
assert self_check_capacity(M.capacity_mask)

# %% [markdown]
#
# ## 6. DeepSeek-V3 routing
#
# DeepSeek-V3 changes three things:
#
# - **sigmoid affinities** `s = sigmoid(logits)` instead of a softmax; the selected ones are normalised to sum
#   to one (`norm_topk_prob`) and multiplied by `routed_scaling_factor`;
# - a **per-expert bias** `b` (`e_score_correction_bias`) is added to the affinities **only to choose** the
#   experts: the gate weights still come from the unbiased `s`, so the bias steers traffic without changing
#   what a chosen expert contributes;
# - the bias is changed **outside autograd** after each step: `b_i ← b_i + γ·sign(c̄ − c_i)`, down for
#   experts that got more than the mean load `c̄`, up for the others ("auxiliary-loss-free balancing").
#
# Below, a token whose two best experts are 0 and 1. Raising expert 3's bias makes it chosen instead of
# expert 1, but the weights are still the normalised unbiased scores of the chosen experts.

# %%
logits4 = torch.logit(torch.tensor([[0.9, 0.8, 0.3, 0.2]]))
for b in (torch.zeros(4), torch.tensor([0.0, 0.0, 0.0, 0.7])):
    w, idx = M.deepseek_route(logits4, b, top_k=2, n_group=1, topk_group=1)
    print("bias", b.tolist(), "-> experts", idx.tolist(), "weights", w.numpy().round(4))

# %% [markdown]
# A popular mistake gathers the weights from the biased scores. Then the bias, which is meant only for load
# balancing, also changes the mixture the model computes, and a negative bias can even produce negative or
# inverted weights:

# %%
s4 = torch.sigmoid(logits4)
neg_bias = torch.tensor([-1.0, -1.0, -1.5, -1.5])
_, idx = M.deepseek_route(logits4, neg_bias, 2, 1, 1)
wrong = (s4 + neg_bias).gather(1, idx)
print("weights from the biased scores:", (wrong / wrong.sum(-1, keepdim=True)).numpy().round(4),
      " from the unbiased ones:", M.deepseek_route(logits4, neg_bias, 2, 1, 1)[0].numpy().round(4))

# %% [markdown]
# The sign update on a worked example: four tokens, two experts each, loads `[5, 1, 1, 1]`, mean 2:

# %%
idx_example = torch.tensor([[0, 0], [0, 0], [0, 1], [2, 3]])
print("loads", M.expert_counts(idx_example, 4).tolist(), "-> Δbias",
      (M.update_bias(torch.zeros(4), idx_example, 4, gamma=1e-3)).tolist())

# %% [markdown]
# Why the bias lives in **float32** and outside the optimizer: it is a buffer (saved with the model, never
# given a gradient) and its steps are tiny. In bfloat16 a step of `γ = 1e-3` next to 1 is lost to rounding:

# %%
one_bf16 = torch.ones(1, dtype=torch.bfloat16)
print("bfloat16: 1 + 1e-3 =", (one_bf16 + 1e-3).item(), "  float32:", (torch.ones(1) + 1e-3).item())
print("bias is a parameter?", "gate.e_score_correction_bias" in dict(layer.named_parameters()),
      "| in the state_dict?", "gate.e_score_correction_bias" in layer.state_dict(),
      "| dtype:", layer.gate.e_score_correction_bias.dtype)

# %% [markdown]
# ### The routing explorer
#
# A sentence through the first MoE layer of the tiny character model trained by the course's reference
# pipeline (with the bias update). Each row is a character, each column an expert; colour is the sigmoid
# affinity, red boxes are the chosen experts. Pick an expert and move its bias: the choices change, the
# colours (the affinities that become gate weights) do not. With more than one group, whole groups are
# masked (hatched).

# %%
runs = moe_char.load_moe_load_runs()
probe = runs["runs"]["g1e-3"]
print("probe sentence:", repr(runs["probe_text"]), "| router logits (layers, T, E):", tuple(probe["router_logits"].shape))

# %% tags=["nbval-ignore-output"]
vmoe.show_routing_explorer(probe["router_logits"][0], list(runs["probe_text"]), probe["final_bias"][0])

# %% [markdown]
# ## 7. Shared experts
#
# DeepSeekMoE also keeps `S` **shared experts** that every token uses, summed to the routed output. `S`
# experts of width `I` that always run together are the same as one SwiGLU network of width `S·I`: stack their
# `gate_proj` and `up_proj` rows and their `down_proj` columns. That is why the layer stores a single
# `shared_experts` block of width `I·S`.
#
# ### Spot the bug: averaged shared experts
#
# The function below combines `S` narrow shared experts by averaging them. Run it and compare with the wide
# network built from the same weights.

# %%
S, D_, I_ = 3, 32, 16
torch.manual_seed(2)
narrow = [SwiGLUFeedForward(D_, I_) for _ in range(S)]
wide = SwiGLUFeedForward(D_, S * I_)
with torch.no_grad():
    wide.gate_proj.weight.copy_(torch.cat([e.gate_proj.weight for e in narrow], 0))
    wide.up_proj.weight.copy_(torch.cat([e.up_proj.weight for e in narrow], 0))
    wide.down_proj.weight.copy_(torch.cat([e.down_proj.weight for e in narrow], 1))
xs = torch.randn(5, D_)


def shared_output_buggy(x, experts):
    return torch.stack([e(x) for e in experts]).mean(0)


def self_check_shared(fn):
    with torch.no_grad():
        gap = (fn(xs, narrow) - wide(xs)).abs().max().item()
    print(f"✓ equal to the wide network (max |Δ| = {gap:.1e})" if gap < 1e-5 else
          f"✗ not yet: max |Δ| to the wide network = {gap:.3f}")
    return gap


self_check_shared(shared_output_buggy)

# %% [markdown]
# **Your turn:** fix the combination in the next cell, then run it. The self-check prints ✓ when the result
# equals the wide network.

# %%
def shared_output_fixed(x, experts):
    # TODO: combine the shared experts the way one wide network does
    return torch.stack([e(x) for e in experts]).mean(0)


self_check_shared(shared_output_fixed)

# %% jupyter={"source_hidden": true}
# Reference fix: the wide network's down projection adds the contributions of its column blocks, so the
# shared experts are summed, not averaged.
def shared_output_reference(x, experts):
    return sum(e(x) for e in experts)


assert self_check_shared(shared_output_reference) < 1e-5

# %% [markdown]
# The same comparison for one to four shared experts: the parameters are identical, the sum agrees with the
# wide network to float32 rounding and the mean does not (except for a single expert).

# %%
for s_count in (1, 2, 4):
    eq = vmoe.shared_equivalence(s_count)
    print(f"S = {s_count}: max |sum − wide| = {eq['sum']:.1e}, max |mean − wide| = {eq['mean']:.3f}, "
          f"parameters {eq['params_narrow']:,} vs {eq['params_wide']:,}")

# %% tags=["nbval-ignore-output"]
vmoe.show_shared_equivalence()

# %% [markdown]
# ## 8. Fine-grained experts
#
# DeepSeekMoE also makes experts **smaller and more numerous**: split each of `E` experts of width `I` into `m`
# experts of width `I/m` and route to `m·k` of them. Parameters and compute stay the same (the router grows a
# little), but the number of expert combinations a token can use explodes:

# %%
for m in (1, 4):
    r = vmoe.expert_combinatorics(16, 2, m, d_model=128, intermediate=512)
    print(f"split {m}: {r['experts']} experts of width {r['width']}, top-{r['active']}: "
          f"C({r['experts']},{r['active']}) = {r['combinations']:,} combinations; "
          f"total {r['total_params']:,}, active {r['active_params']:,} parameters")

# %% tags=["nbval-ignore-output"]
vmoe.show_combinatorics()

# %% [markdown]
# ## 9. Group-limited routing
#
# DeepSeek-V3's 256 routed experts are spread over the GPUs of 8 nodes, and sending a token's hidden state to
# another node is the expensive part of expert parallelism. So V3 limits **nodes**: the experts form `n_group`
# groups, one per node, and each token may use experts on at most `M = topk_group` of them. Routing then has two
# stages: choose the groups, then the usual top-`k` inside the chosen groups (no expert outside them may be
# chosen).
#
# How should a group be scored? A token picks `K_r = top_k` experts in at most `M` groups, so a chosen group
# contributes `K_r / M` experts on average. V3 therefore scores a group by the **sum of its `K_r/M` largest
# biased scores**: what the group would contribute if the token's experts were spread evenly over its `M` nodes.
# With V3's configuration that number is:

# %%
per_group = V3["routed"] // V3["n_group"]
print(f"DeepSeek-V3: {V3['routed']} routed experts in {V3['n_group']} groups (one per node) of {per_group}; "
      f"top_k K_r = {V3['top_k']}, at most M = {V3['topk_group']} groups per token -> K_r/M = "
      f"{V3['top_k'] // V3['topk_group']} experts per chosen group: a group is scored by the sum of its "
      f"top-{V3['top_k'] // V3['topk_group']}")
assert V3["top_k"] % V3["topk_group"] == 0 and V3["top_k"] // V3["topk_group"] == 2

# %% [markdown]
# DeepSeek-V2 limited **devices** differently: it kept the `M` devices whose single best expert had the highest
# affinity (a device scored by its maximum), then took the top-`k` inside them. The two rules disagree when one
# group has one standout expert and another has two good ones. With two groups of four, one group kept and two
# experts per token:

# %%
affin = torch.tensor([[0.95, 0.10, 0.10, 0.10, 0.70, 0.68, 0.10, 0.10]])   # group 0 | group 1
w_v3, idx_v3 = M.deepseek_route(torch.logit(affin), torch.zeros(8), top_k=2, n_group=2, topk_group=1)
best_single = affin.view(2, 4).max(-1).values                                # V2-style: a group's best expert
v2_group = int(best_single.argmax())
v2_experts = (affin.view(2, 4)[v2_group].topk(2).indices + 4 * v2_group).tolist()
print(f"sum-of-top-2 group scores {affin.view(2, 4).topk(2, -1).values.sum(-1).numpy().round(2)} -> experts "
      f"{sorted(idx_v3[0].tolist())}, affinity used {affin[0, idx_v3[0]].sum().item():.2f}")
print(f"best-single-expert group scores {best_single.numpy().round(2)} -> experts {sorted(v2_experts)}, "
      f"affinity used {affin[0, v2_experts].sum().item():.2f}")

# %% [markdown]
# How do the experts of excluded groups drop out of the top-`k`? Masking them with 0 looks natural, but biased
# scores can be negative. In the example below (two groups of two, keep one, top-2) the first group wins; compare
# the library's choice with the masked-with-0 one, and ask what score an excluded expert must have instead:

# %%
w, idx = M.deepseek_route(logits4, neg_bias, top_k=2, n_group=2, topk_group=1)
print("biased scores:", (s4 + neg_bias).numpy().round(4))
print("correct: experts", sorted(idx[0].tolist()), "weights", w[0, idx[0].argsort()].numpy().round(4))
masked_zero = torch.where(torch.tensor([[True, True, False, False]]), s4 + neg_bias, torch.zeros(1, 4))
print("masked with 0 instead: experts", sorted(masked_zero.topk(2).indices[0].tolist()))
w25, _ = M.deepseek_route(logits4, neg_bias, 2, 2, 1, routed_scaling_factor=V3["scale"])
print(f"with routed_scaling_factor {V3['scale']}:", w25[0].sort(descending=True).values.numpy().round(4))

# %% [markdown]
# ## 10. Parity with Hugging Face's DeepSeek-V3
#
# `transformers` implements the same router (`DeepseekV3TopkRouter`) and layer (`DeepseekV3MoE`). Its experts are
# stored fused, as 3-D tensors: `experts.gate_up_proj` `(E, 2I, D)` (the first `I` rows of each expert are
# `gate_proj`, the rest `up_proj`) and `experts.down_proj` `(E, D, I)`. `moe_state_dict_from_hf` splits them
# into the per-expert names. With random weights and a random bias the outputs agree to float32 rounding.
# (This cell imports `transformers`; the `ci` profile skips it.)

# %%
if cfg["parity"]:
    kw = dict(d_model=16, moe_intermediate_size=8, n_routed_experts=8, n_shared_experts=2, top_k=3, n_group=4,
              topk_group=2, routed_scaling_factor=2.5)
    hf = M.random_hf_deepseek_moe(seed=0, std=0.3, bias_std=0.3, **kw)
    ours = M.load_hf_deepseek_moe(hf)
    xp = torch.randn(2, 10, 16)
    with torch.no_grad():
        print(f"DeepSeekMoE vs DeepseekV3MoE: max |Δ| = {(ours(xp) - hf(xp)).abs().max().item():.1e}")
        _, w_hf, i_hf = hf.gate(xp)
        _, w_us, i_us = ours.gate(xp)
    print("same experts chosen (as sets):", torch.equal(i_hf.sort(-1).values, i_us.sort(-1).values))
else:
    print("parity demo skipped in this profile (see tests/test_unit14_deepseek_moe.py)")

# %% [markdown]
# ## 11. The balance experiment
#
# A tiny character model with three MoE layers (the sizes of section 1) trains on Shakespeare twice from the
# same initial weights on the same batches: once without any balancing and once with the bias update. After
# every step the loads of every expert in every layer are recorded. The number to watch is the **max/mean
# load**, 1 when perfectly balanced. Its ceiling is not `E`: a token sends its `k` assignments to `k` *different*
# experts, so an expert receives at most one assignment per token (max ≤ N) while the mean is `k·N/E`. The ratio is
# at most `E/k`, reached when every token picks the same `k` experts. For this model:

# %%
E_moe, k_moe = moe_char.MOE_KW["n_routed_experts"], moe_char.MOE_KW["top_k"]
ceiling = E_moe / k_moe
worst = torch.tensor([[0, 1]] * 100)                                         # every token to experts 0 and 1
print(f"E = {E_moe}, k = {k_moe}: ceiling E/k = {ceiling:g}; every token on the same two experts gives "
      f"{moe_char.max_mean_ratio(M.expert_counts(worst, E_moe)).item():g}")

# %%
recipe = dict(steps=cfg["live_steps"], warmup_steps=cfg["warmup_steps"], batch_size=cfg["batch_size"],
              context_length=cfg["context_length"], max_lr=cfg["max_lr"], min_lr=cfg["min_lr"],
              eval_every=cfg["live_steps"], eval_batches=cfg["eval_batches"])
live, live_models = {}, {}
for name, gamma in (("live-none", 0.0), ("live-bias", cfg["live_gamma"])):
    live_models[name], hist = moe_char.train_moe_char(recipe, gamma=gamma, progress=True)
    live[name] = hist

# %%
tail = max(1, cfg["live_steps"] // 4)
for name, hist in live.items():
    ratio = moe_char.max_mean_ratio(hist["loads"][-tail:]).mean().item()
    print(f"{name}: max/mean load over the last {tail} steps {ratio:.3f} (1 = balanced, ceiling {ceiling:g}), "
          f"validation loss {hist['val_loss'][-1]:.3f}")
lower = (moe_char.max_mean_ratio(live["live-bias"]["loads"][-tail:]).mean()
         < moe_char.max_mean_ratio(live["live-none"]["loads"][-tail:]).mean()).item()
print("the bias update lowered the imbalance in this run:", lower)

# %% [markdown]
# Longer runs were recorded by the course's reference pipeline (`python -m llmcourse.train.moe_char`): no
# balancing, the auxiliary loss, and the bias update with three values of γ. Read on the right scale, from 1
# (balanced) to the ceiling `E/k`, the last column says how far each run sits from balance toward total collapse
# onto two experts. The widget replays them (and the live runs above): the max/mean ratio of every run against
# the ceiling, and for one run and layer the share of each expert over the steps.

# %%
recorded = {name: r["loads"] for name, r in runs["runs"].items()}
steps_recorded = len(next(iter(recorded.values())))
for name, r in runs["runs"].items():
    ratio = moe_char.max_mean_ratio(r["loads"][-50:].float()).mean().item()
    print(f"{name:6s}: max/mean load over the last 50 of {steps_recorded} steps {ratio:.3f} = "
          f"{(ratio - 1) / (ceiling - 1):5.1%} of the way from balance (1) to the ceiling ({ceiling:g}); "
          f"final validation loss {r['val_loss'][-1]:.3f}")
every_step = torch.cat([moe_char.max_mean_ratio(r["loads"].float()).flatten() for r in runs["runs"].values()])
print(f"largest ratio of any recorded step and layer: {every_step.max().item():.3f} (≤ {ceiling:g})")
assert every_step.max() <= ceiling + 1e-6

# %% tags=["nbval-ignore-output"]
vmoe.show_expert_loads({**recorded, **{k: h["loads"] for k, h in live.items()}}, ceiling=ceiling)

# %% [markdown]
# **Dropped tokens.** How many assignments would the two live models lose to a capacity limit (section 5)? Route
# one batch of validation text through each trained model, take the experts every MoE layer chose, and apply the
# capacity at factors 1.0 and 1.25. DeepSeek-V3 drops none by design; a model that drops tokens skips experts for
# exactly the tokens routed to the busiest ones.

# %%
from llmcourse.data.corpus import char_corpus  # noqa: E402

val_ids = char_corpus("tinyshakespeare").val[: cfg["batch_size"] * cfg["context_length"]]
val_ids = val_ids.view(cfg["batch_size"], cfg["context_length"])
for name, model in live_models.items():
    chosen = []
    hooks = [m.gate.register_forward_hook(lambda mod, inp, out: chosen.append(out[2])) for m in model.moe_layers()]
    with torch.no_grad():
        model(val_ids)
    for h in hooks:
        h.remove()
    drops = {cf: sum(1 - M.capacity_mask(c, E_moe, cf)[0].float().mean().item() for c in chosen) / len(chosen)
             for cf in (1.0, 1.25)}
    print(f"{name}: dropped assignments at capacity factor 1.0: {drops[1.0]:.1%}, at 1.25: {drops[1.25]:.1%} "
          f"(mean over the {len(chosen)} MoE layers)")

# %% [markdown]
# ### Where the time of an MoE layer goes on a CPU
#
# The MoE model above has the same number of **active** parameters per token as a dense model whose SwiGLU
# width is three experts' worth (two routed and one shared). Below both train for the same number of steps on
# the same batches, and the MoE model is compared with its dense twin.

# %%
timing = dict(recipe, steps=cfg["timing_steps"], warmup_steps=max(1, cfg["timing_steps"] // 5),
              eval_every=cfg["timing_steps"], eval_batches=1)
_, t_dense = moe_char.train_moe_char(timing, dense=True, progress=False)
_, t_moe = moe_char.train_moe_char(timing, progress=False)
print(f"dense twin: {t_dense['ms_per_step']:.0f} ms/step   MoE: {t_moe['ms_per_step']:.0f} ms/step   "
      f"MoE / dense = {t_moe['ms_per_step'] / t_dense['ms_per_step']:.2f}×  ({cfg['timing_steps']} steps each)")
print(f"recorded by the pipeline: MoE {runs['runs']['none']['ms_per_step']:.0f} ms/step vs dense "
      f"{runs['dense_ms_per_step']:.0f} ms/step")

# %% [markdown]
# The layer does not loop over experts in Python: routing, one sort, one gather, one grouped product per
# projection, one scatter. To see where the time goes, `profile_moe_forward` runs the steps of one forward of a
# trained MoE layer with a clock between them (best of a few repeats, on a training batch's worth of tokens) and
# checks that the staged run gives the layer's output. Next to it: the dense twin's feed-forward network on the
# same tokens, and the multiply–adds each does.

# %%
moe_layer = live_models["live-bias"].moe_layers()[0]
tokens_x = torch.randn(cfg["batch_size"], cfg["context_length"], 128, generator=torch.Generator().manual_seed(0))
prof = M.profile_moe_forward(moe_layer, tokens_x, repeats=5)
dense_ffn = moe_char.dense_char_model().layers[0].mlp
with torch.no_grad():
    dense_ms = min((lambda t0: (dense_ffn(tokens_x), time.perf_counter() - t0)[1])(time.perf_counter())
                   for _ in range(5)) * 1e3
stages = ["router", "sort", "gather", "pack", "gemm", "scatter", "shared"]
for st in stages:
    print(f"{st:8s} {prof[st]:7.3f} ms  {prof[st] / prof['total']:6.1%}")
print(f"{'total':8s} {prof['total']:7.3f} ms   (staged output vs the layer: max |Δ| = {prof['max_abs_diff']:.1e})")
n_tok_x, d_x, i_x = cfg["batch_size"] * cfg["context_length"], 128, moe_char.MOE_KW["moe_intermediate_size"]
routed_macs = n_tok_x * k_moe * 3 * d_x * i_x
dense_macs = n_tok_x * 3 * d_x * (3 * i_x)
top = max(stages, key=prof.get)
print(f"largest stage: {top}. The routed grouped products do {routed_macs / dense_macs:.0%} of the dense twin's "
      f"multiply–adds and take {prof['gemm'] / dense_ms:.2f}× its time ({dense_ms:.3f} ms): "
      f"{routed_macs / prof['gemm'] / 1e6:.1f} vs {dense_macs / dense_ms / 1e6:.1f} G multiply–adds per second")
print(f"routing and data movement (router + sort + gather + pack + scatter): "
      f"{sum(prof[st] for st in ('router', 'sort', 'gather', 'pack', 'scatter')) / prof['total']:.1%} of the layer")

# %% [markdown]
# Read the table (on this machine, in this run): the stage printed as the largest decides the gap. Where the
# grouped products run at a lower rate than one dense product of the same work, the slowdown is the kernel
# (many small matrices of a few hundred rows each), not Python; the router, the sort and the gather/scatter add
# the rest. MoE pays off when experts are large, batches fill them, and they are spread over many devices.

# %% [markdown]
# ## Summary
#
# - An MoE layer stores many experts and runs a few per token: total and active parameters part ways.
# - Softmax top-k with renormalisation equals a softmax over the selected logits; the sparse dispatch equals
#   the dense reference.
# - The auxiliary loss `α·Σ f_i·P_i` is `α` for a balanced router and `α·E` at collapse; its sequence-wise
#   form asks every sequence to be balanced, not only the batch.
# - DeepSeek-V3 uses sigmoid affinities, normalised and scaled; the correction bias only chooses experts and
#   is updated by the sign rule, in float32, outside the optimizer.
# - Shared experts are summed (one wide network); fine-grained experts multiply the combinations at equal
#   cost; groups are scored by their two best experts, and no expert of an excluded group may be chosen, whatever
#   the sign of the biased scores.
# - Group-limited routing is node-limited: `K_r/M` experts per chosen group explains the top-2 group score.
# - A capacity factor drops assignments of the busiest experts; DeepSeek-V3 drops none and balances instead.
#   The max/mean load of top-k routing lies between 1 and `E/k`.
# - The layer matches `transformers`' DeepSeek-V3 with converted weights; on a CPU the tiny MoE is slower
#   than its dense twin, and the profile says which stage costs most.
#
# ## Extension (optional)
#
# DeepSeek-V2's device-limited routing (section 9) scores a group by its **single best** affinity, keeps the
# `topk_group` best groups, then takes the `top_k` best experts inside them. Write `v2_device_limited_route(scores,
# top_k, n_group, topk_group)` returning the chosen expert indices `(N, top_k)` for affinities `scores (N, E)`; the
# self-check runs it on the two-group example of section 9 and on random affinities against an independent count.

# %%
def v2_device_limited_route(scores, top_k, n_group, topk_group):
    # TODO (optional): group score = max affinity in the group; keep topk_group groups; top_k inside them
    raise NotImplementedError


def self_check_v2_route(fn):
    try:
        got = fn(affin, 2, 2, 1)
        rnd = torch.rand(50, 12, generator=torch.Generator().manual_seed(4))
        got_rnd = fn(rnd, 3, 4, 2)
    except NotImplementedError:
        print("✗ not yet: optional extension")
        return False
    ok = sorted(got[0].tolist()) == sorted(v2_experts)
    for row, chosen in zip(rnd, got_rnd):
        groups = row.view(4, 3).max(-1).values.topk(2).indices.tolist()
        allowed = torch.cat([row[3 * g:3 * g + 3] for g in sorted(groups)])
        ids = torch.cat([torch.arange(3 * g, 3 * g + 3) for g in sorted(groups)])
        ok = ok and sorted(chosen.tolist()) == sorted(ids[allowed.topk(3).indices].tolist())
    print("✓ device-limited routing as in DeepSeek-V2" if ok else "✗ not yet: compare the chosen groups")
    return ok


self_check_v2_route(v2_device_limited_route);
