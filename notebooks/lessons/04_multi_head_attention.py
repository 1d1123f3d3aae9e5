# %% [markdown]
# # Unit 04 — Multi-head attention
#
# In unit 03 one attention head turned every token into a weighted average of the value vectors of
# the tokens it may see. One head computes **one** set of weights per query. Real models run many
# heads side by side, each with its own small query/key/value projections, and glue their outputs
# together. This lesson builds that in two ways and proves they are the same function:
#
# 1. why one head is not enough;
# 2. the simple way: a list of independent causal heads, concatenated (`MultiHeadAttentionWrapper`);
# 3. the efficient way: one big projection per Q/K/V, **split** into heads with `view` + `transpose`;
# 4. all heads at once: batched scores of shape `(B, H, T, T)`, one mask for every head;
# 5. **merging** heads back, and the classic merge bug, visualised;
# 6. the equivalence proof: stack the heads' weights, set the output projection to the identity;
# 7. cross-attention (`T_q ≠ T_k`) and key-padding masks of shape `(B, 1, 1, T_k)`;
# 8. PyTorch interop: `F.scaled_dot_product_attention` and `nn.MultiheadAttention`, and how their
#    mask conventions differ from ours;
# 9. parameter counts and a cost sketch.
#
# The exercise notebook (`exercises/04_multi_head_attention/04_multi_head_attention.ipynb`) asks you
# to write `MultiHeadAttentionWrapper`, `MultiHeadAttention`, `mha_from_wrapper`, `to_torch_mha` and
# `mha_forward_sdpa`. Here we take them apart in the open; the finished versions live in
# `llmcourse.nn` and every later unit imports them from there.
#
# **Names.** In the wrapper, `head_dim` is the width of **one** head. In `MultiHeadAttention`, `d_out`
# is the **total** width and `head_dim = d_out / num_heads`. (Some write-ups use `d_out` for both in the
# same chapter; we never do.) Masks are boolean with **`True` = may attend**, as in unit 03.
#
# Cells marked **Spot the bug** show mistakes from popular write-ups: run the buggy cell, see which
# property breaks, write your fix in the **TODO** cell and run its self-check (it prints "not yet" until
# the fix is right). A reference fix follows in a collapsed cell (click its margin to expand); it runs
# with the rest of the notebook, so later cells work either way.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.nn import (
    CausalSelfAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    causal_mask,
    merge_heads,
    mha_forward_sdpa,
    mha_from_wrapper,
    mha_param_count,
    padding_mask,
    split_heads,
    to_torch_attn_mask,
    to_torch_mha,
)
from llmcourse.viz import multihead as viz

cfg = llmcourse.setup_notebook("04")
cfg

# %% [markdown]
# ## 1. One head, one view
#
# Take the sentence *"The artist painted the portrait of a woman with a brush"*. Who holds the
# brush? Grammatically "with a brush" can attach to *painted* (the tool) or to *woman* (she is holding
# one). A model reading "brush" may want to look at **several** earlier words for **different reasons**
# at once: at the verb, to settle the tool reading; at the nouns, to track who is who; at the
# previous word, for local syntax.
#
# One head cannot do that. Its weights for a query are a single probability distribution over the
# keys, and the context vector is a single average. If the head puts 0.5 on *painted* and 0.5 on
# *woman*, the result is a blend of the two value vectors, not two separate pieces of information.
# Several heads, each with its own projections, can each specialise on one relation, and the layer
# keeps all their outputs side by side.
#
# Here is the sentence as GPT-2 sees it:

# %%
sentence = "The artist painted the portrait of a woman with a brush"
enc = llmcourse.gpt2_encoding()
ids = enc.encode(sentence)
tokens = [enc.decode([i]) for i in ids]
print(len(ids), "tokens:", tokens)

# %% [markdown]
# What do several heads do in a **trained** model? The course ships a small character-level GPT trained
# on Shakespeare (4 layers × 4 heads, `d_model = 128`; you build this model in unit 08 and train one
# like it in unit 10; here it is a black box whose attention layers are this unit's
# `MultiHeadAttention`). It reads characters, not GPT-2 tokens, so we feed it a line of Shakespeare and
# measure, for every head, the mean weight its queries put on the key 0, 1 and 2 characters back.

# %%
from llmcourse.train.char_model import load_gpt_char_tiny  # noqa: E402

char_gpt, char_tok = load_gpt_char_tiny()
line = "ROMEO:\nBut soft, what light through yonder window breaks?"
w_heads = viz.model_head_weights(char_gpt, char_tok.encode(line))       # (layers, heads, T, T)
print("weights:", tuple(w_heads.shape), "(layers, heads, queries, keys)")
profile = torch.stack([w_heads.diagonal(-d, dim1=-2, dim2=-1).mean(-1) for d in range(3)], dim=-1)  # (L, H, 3)
for layer in range(profile.shape[0]):
    print(f"layer {layer}: mean weight at distance 0/1/2 per head:",
          [[round(v, 2) for v in profile[layer, hh].tolist()] for hh in range(profile.shape[1])])
spread = (profile.amax(1) - profile.amin(1)).max().item()
print(f"largest difference between two heads of one layer at one distance: {spread:.2f}")
assert torch.allclose(w_heads.sum(-1), torch.ones(w_heads.shape[:-1]), atol=1e-5) and spread > 0.05

# %% [markdown]
# The heads of one layer do not agree: with the same input, some concentrate near the diagonal (the
# current or previous character), others spread their weight over the line. Explore them below: pick a
# layer and a head, or type your own text (at most 48 characters are shown). The model's own causal mask
# applies, so the upper triangle stays empty.

# %% tags=["nbval-ignore-output"]
viz.show_trained_head_viewer(char_gpt, char_tok, line)

# %% [markdown]
# ## 2. The simple way: a list of heads
#
# The most direct multi-head layer is literally a list of the unit-03 `CausalSelfAttention` modules,
# each mapping `d_in → head_dim`, run one after the other, their outputs concatenated along the last
# dimension:
#
# $$\text{MultiHead}(X) = \big[\,\text{head}_0(X)\;\big|\;\text{head}_1(X)\;\big|\;\dots\;\big|\;\text{head}_{H-1}(X)\,\big]
# \in \mathbb{R}^{T \times H\cdot\text{head\_dim}}$$
#
# With `d_in = 3`, `head_dim = 2` and two heads on the six-token sentence of unit 03 ("Your journey
# starts with one step"), stacked into a batch of two:

# %%
inputs = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                       [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
batch = torch.stack([inputs, inputs])

torch.manual_seed(123)
wrapper = MultiHeadAttentionWrapper(d_in=3, head_dim=2, context_length=6, dropout=0.0, num_heads=2)
context_wrapper = wrapper(batch)
print(wrapper)
print("output shape:", tuple(context_wrapper.shape))
print(context_wrapper[0])

# %% [markdown]
# Two checks of what we just claimed. Item 0 matches reference values computed independently, and the first two columns are exactly what a **single** seed-123 `CausalSelfAttention(3, 2, 6)`
# gives: creating the wrapper under the same seed builds head 0 first, with the same random draws.

# %%
ref_wrapper = torch.tensor([[-0.4519, 0.2216, 0.4772, 0.1063], [-0.5874, 0.0058, 0.5891, 0.3257],
                     [-0.6300, -0.0632, 0.6202, 0.3860], [-0.5675, -0.0843, 0.5478, 0.3589],
                     [-0.5526, -0.0981, 0.5321, 0.3428], [-0.5299, -0.1081, 0.5077, 0.3493]])
assert torch.allclose(context_wrapper[0], ref_wrapper, atol=1e-4)
torch.manual_seed(123)
single = CausalSelfAttention(3, 2, 6)
diff = (single(batch)[0] - context_wrapper[0, :, :2]).abs().max().item()
print(f"head 0 of the wrapper vs a lone seed-123 head: max difference {diff}")
assert diff == 0.0

# %% [markdown]
# This works, but it is slow in a way that matters: `H` separate small matrix products for each of
# Q, K and V, `H` separate softmaxes, a Python loop. Hardware is fastest with a few **big** matrix
# products. The parameter count also tells us something: the wrapper has exactly `3 · d_in · head_dim · H`
# weights and **no output projection**.

# %%
n_wrapper = sum(p.numel() for p in wrapper.parameters())
print("wrapper parameters:", n_wrapper, "= 3·d_in·head_dim·H =", 3 * 3 * 2 * 2)
assert n_wrapper == 3 * 3 * 2 * 2

# %% [markdown]
# ## 3. The efficient way: one projection, split into heads
#
# Stack the `H` query matrices of the heads side by side and you get one `(d_in, H·head_dim)` matrix:
# a single `nn.Linear(d_in, d_out)` with `d_out = H · head_dim`. Its output for a token is the
# concatenation of the `H` per-head queries. So we project **once** and then **cut** the last
# dimension into `H` slices of width `head_dim = d_out / H`:
#
# `(B, T, d_out)` → `view(B, T, H, head_dim)` → `transpose(1, 2)` → `(B, H, T, head_dim)`
#
# The `view` only reinterprets the last axis (no data moves): features `0 … hd−1` are head 0, the next
# `hd` are head 1, and so on. The `transpose` moves the head axis next to the batch axis so that
# everything after it (scores, softmax, `@ V`) treats `(B, H)` as batch dimensions. Here are the
# shapes for `x (1, 3, 6)`, `d_out = 6`, `H = 2`, so `head_dim = 3`:

# %%
b, t, d_out, h = 1, 3, 6, 2
hd = d_out // h
x_demo = torch.arange(18.0).view(b, t, d_out)
viewed = x_demo.view(b, t, h, hd)
split = viewed.transpose(1, 2)
scores_demo = split @ split.transpose(-2, -1)
ctx_demo = torch.softmax(scores_demo, -1) @ split
back = ctx_demo.transpose(1, 2)
merged = back.contiguous().view(b, t, d_out)
trace = [tuple(s.shape) for s in (x_demo, viewed, split, scores_demo, ctx_demo, back, merged)]
for name, shape in zip(["x", "view", "transpose", "scores", "context", "transpose back", "merged"], trace):
    print(f"{name:>15}: {shape}")
assert trace == [(1, 3, 6), (1, 3, 2, 3), (1, 2, 3, 3), (1, 2, 3, 3), (1, 2, 3, 3), (1, 3, 2, 3), (1, 3, 6)]
print("head 1 of token 0 holds features", split[0, 1, 0].tolist(), "= x[0, 0, 3:6]")
assert torch.equal(split[0, 1, 0], x_demo[0, 0, 3:6])

# %% [markdown]
# `llmcourse.split_heads` and `merge_heads` (unit 00) are exactly these two reshapes.

# %%
assert torch.equal(split_heads(x_demo, 2), split)
assert torch.equal(merge_heads(split), x_demo)

# %% [markdown]
# ### Spot the bug: `view(B, H, T, hd)`
#
# A tempting shortcut is to view straight into the target shape, `view(B, H, T, hd)`. It has the right
# **shape**, so nothing crashes, but it cuts the memory in the wrong order: it takes the first `T·hd`
# numbers of the batch element (which belong to the first tokens) and calls them "head 0".

# %%
wrong = x_demo.view(b, h, t, hd)
print("wrong 'head 0':\n", wrong[0, 0])
print("right head 0:\n", split[0, 0])
tokens_in_wrong_head0 = sorted({int(v) // d_out for v in wrong[0, 0].flatten().tolist()})
print("tokens whose features ended up in the wrong 'head 0':", tokens_in_wrong_head0)
assert not torch.equal(wrong, split)

# %% [markdown]
# The property that fails: **head `h` of token `t` must hold features `h·hd … (h+1)·hd − 1` of token `t`**.
#
# **Your fix.** Rewrite `to_heads(x, num_heads)`: `(B, T, D)` → `(B, H, T, D/H)` with that property.
# Then run the self-check.

# %%
def to_heads(x, num_heads):
    # TODO: cut the feature axis into heads, then move the head axis next to the batch axis
    b_, t_, d_ = x.shape
    return x.view(b_, num_heads, t_, d_ // num_heads)


def self_check_to_heads():
    xs = torch.randn(2, 5, 12)
    ok = True
    for heads in (1, 2, 3, 4):
        out = to_heads(xs, heads)
        hd_ = 12 // heads
        ok = ok and out.shape == (2, heads, 5, hd_) and all(
            torch.equal(out[:, hh, tt], xs[:, tt, hh * hd_:(hh + 1) * hd_]) for hh in range(heads) for tt in range(5))
    print("✓ every head holds its own feature slice of every token" if ok else
          "✗ not yet: head h of token t must hold features h·hd … (h+1)·hd − 1 of token t")
    return ok


fixed_view = self_check_to_heads()

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed). Running it replaces your version of to_heads.
def to_heads(x, num_heads):
    b_, t_, d_ = x.shape
    return x.view(b_, t_, num_heads, d_ // num_heads).transpose(1, 2)


assert self_check_to_heads() and torch.equal(to_heads(x_demo, h), split)

# %% [markdown]
# ### Spot the bug: a width the heads cannot share
#
# `head_dim = d_out / num_heads` must be an integer. A miniature encoder in one popular write-up is
# configured with `dim=256, heads=6` and trips its own assertion. Silently flooring instead is worse:
# `256 // 6 = 42`, and `6 · 42 = 252`, so either the `view` fails later with a confusing message or four
# features quietly belong to no head. The course module refuses at construction time, with a message
# that says why:

# %%
print("256 // 6 =", 256 // 6, "and 6 * 42 =", 6 * 42)
try:
    torch.zeros(1, 3, 256).view(1, 3, 6, 256 // 6)
except RuntimeError as err:
    print("floored view:", str(err).splitlines()[0])
try:
    MultiHeadAttention(256, 256, num_heads=6)
except ValueError as err:
    print("ValueError:", err)
ok_heads = [h_ for h_ in range(1, 17) if 256 % h_ == 0]
print("head counts that divide 256:", ok_heads)
assert 6 not in ok_heads and MultiHeadAttention(256, 256, num_heads=8).head_dim == 32

# %% [markdown]
# **Your fix.** Repair such a configuration before the module is built: `heads_for(d_out, wanted)` returns
# the largest head count that is at most `wanted` and divides `d_out`. The self-check tries several widths.

# %%
def heads_for(d_out, wanted):
    # TODO: the largest head count <= wanted that divides d_out
    return wanted


def self_check_heads_for(fn):
    for d_out, wanted in [(256, 6), (256, 8), (768, 10), (512, 7), (12, 5), (7, 3)]:
        got = fn(d_out, wanted)
        ok = isinstance(got, int) and 1 <= got <= wanted and d_out % got == 0
        ok = ok and not any(d_out % h_ == 0 for h_ in range(got + 1, wanted + 1))
        if not ok:
            print(f"✗ not yet: heads_for({d_out}, {wanted}) returned {got!r}")
            return False
    print("✓ every configuration gets the largest head count that divides its width")
    return True


self_check_heads_for(heads_for)

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed): count down from the wanted number until one divides the width (1 always does).
def heads_for_reference(d_out, wanted):
    return next(h_ for h_ in range(wanted, 0, -1) if d_out % h_ == 0)


assert self_check_heads_for(heads_for_reference)
assert MultiHeadAttention(256, 256, num_heads=heads_for_reference(256, 6)).head_dim == 64

# %% [markdown]
# ## 4. All heads at once
#
# With `q, k, v` of shape `(B, H, T, hd)`, one matrix product gives every head's raw scores:
# `q @ k.transpose(-2, -1)` has shape `(B, H, T_q, T_k)`. The scale is `1/√head_dim`, because each
# head's dot product sums `head_dim` terms (the variance argument of unit 03 applies per head). A
# `(T, T)` causal mask broadcasts over `(B, H)`, so one mask serves every head. Softmax over the last
# dim, dropout on the weights, `@ v`: exactly unit 03's recipe, with two batch dimensions.
#
# Take the raw scores of two heads for a three-token input (lower triangles, given below). We put
# deliberately huge numbers above the diagonal: the causal mask must make them irrelevant.

# %%
raw = torch.full((1, 2, 3, 3), 99.0)        # the future: must be masked away
lower = [[[-8.2252], [-1.3722, -7.0720], [-5.8961, -2.7236, -1.0160]],
         [[4.6567], [-1.3167, 1.3964], [2.3820, 2.7213, 0.8448]]]
for head in range(2):
    for i, row in enumerate(lower[head]):
        raw[0, head, i, :len(row)] = torch.tensor(row)
mask = causal_mask(3)
weights_two_heads = torch.softmax((raw / math.sqrt(3)).masked_fill(~mask, float("-inf")), dim=-1)
print(weights_two_heads)
expected_two_heads = torch.tensor([[[1, 0, 0], [0.9641, 0.0359, 0], [0.0417, 0.2604, 0.6979]],
                              [[1, 0, 0], [0.1727, 0.8273, 0], [0.3805, 0.4628, 0.1566]]])
assert torch.allclose(weights_two_heads[0], expected_two_heads, atol=1e-3)

# %% [markdown]
# Scale matters here too (the exact numbers depend on the random generator, the picture does not): the three
# integer-valued tokens `[1..6]`, `[6..1]`, `[1]*6` with `torch.randn(6, 6)` projections give scaled
# scores in the tens and hundreds, and the softmax turns every row into (nearly) a one-hot vector: each
# head looks at exactly one token and no gradient flows to the others. Large inputs and unscaled random
# weights saturate attention; that is why inputs are normalised and `nn.Linear` initialises with small
# weights.

# %%
x_big = torch.tensor([[[1.0, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], [1, 1, 1, 1, 1, 1]]])
torch.manual_seed(123)
Wq, Wk, Wv = (torch.randn(6, 6) for _ in range(3))
q3 = (x_big @ Wq).view(1, 3, 2, 3).transpose(1, 2)
k3 = (x_big @ Wk).view(1, 3, 2, 3).transpose(1, 2)
scaled3 = q3 @ k3.transpose(-2, -1) / math.sqrt(3)
print("largest |scaled score|:", round(scaled3.abs().max().item(), 1))
print("largest weight of each row (per head):\n", torch.softmax(scaled3, -1).amax(-1))

# %% [markdown]
# ### Spot the bug: `transpose(1, 2)` on 4-D tensors
#
# In unit 03 keys were `(B, T, d)`, and `keys.transpose(1, 2)` swapped the last two axes. Copied into a
# multi-head layer, where keys are `(B, H, T, hd)`, the same call swaps **heads and tokens** instead.

# %%
q4 = torch.randn(2, 2, 5, 3)   # (B, H, T, hd)
k4 = torch.randn(2, 2, 5, 3)
try:
    q4 @ k4.transpose(1, 2)
    print("no error?!")
except RuntimeError as err:
    print("RuntimeError:", str(err).splitlines()[0])

# %% [markdown]
# Here it crashes; with `T = hd` the shapes would even line up and the scores would be silently wrong.
# The property: entry `[b, h, i, j]` of the scores is the dot product of query `i` and key `j` **of the
# same head**.
#
# **Your fix.** Rewrite `head_scores(q, k)` for `q (B, H, T_q, hd)` and `k (B, H, T_k, hd)`, returning the
# raw scores `(B, H, T_q, T_k)`. Then run the self-check (it uses `T = hd`, where the bug does not crash).

# %%
def head_scores(q, k):
    # TODO: transpose the right axes of k
    return q @ k.transpose(1, 2)


def self_check_head_scores():
    qs_, ks_ = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)     # T = hd = 4, H = 3
    try:
        got = head_scores(qs_, ks_)
    except RuntimeError as err:
        print("✗ not yet:", str(err).splitlines()[0])
        return False
    expected = torch.einsum("bhid,bhjd->bhij", qs_, ks_)
    ok = got.shape == expected.shape and torch.allclose(got, expected, atol=1e-5)
    print("✓ every score pairs a query and a key of the same head" if ok else
          "✗ not yet: the scores mix heads and tokens")
    return ok


fixed_transpose = self_check_head_scores()

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed): swap the LAST two axes. Running it replaces your version.
def head_scores(q, k):
    return q @ k.transpose(-2, -1)


assert self_check_head_scores() and head_scores(q4, k4).shape == (2, 2, 5, 5)

# %% [markdown]
# ## 5. Merging the heads, and the classic merge bug
#
# After attention the context has shape `(B, H, T, hd)`. To hand each token one vector again we undo
# the split: `transpose(1, 2)` back to `(B, T, H, hd)`, then `contiguous()`, then `view(B, T, d_out)`.
# The `contiguous()` is needed because `transpose` only changes strides, and `view` refuses to fuse
# axes that are not adjacent in memory. Finally the **output projection** `out_proj`, a
# `nn.Linear(d_out, d_out)`, mixes the heads: without it, each block of `hd` output features would only
# ever contain one head's information.
#
# A labelled context makes the layout visible: `context[0, h, t, :] = 100·h + 10·t + [0, 1, 2]`, so every
# number says which head (hundreds) and token (tens) it came from.

# %%
ctx = viz.tagged_head_context()            # (B=1, H=2, T=3, hd=3)
good = ctx.transpose(1, 2).contiguous().view(1, 3, 6)
bad = ctx.reshape(1, 3, 6)          # the bug: merge without transposing back
print("correct merge:\n", good[0].int())
print("no-transpose merge:\n", bad[0].int())
assert good[0].int().tolist() == [[0, 1, 2, 100, 101, 102], [10, 11, 12, 110, 111, 112], [20, 21, 22, 120, 121, 122]]
assert bad[0].int().tolist() == [[0, 1, 2, 10, 11, 12], [20, 21, 22, 100, 101, 102], [110, 111, 112, 120, 121, 122]]

# %% [markdown]
# With the bug, row 0 ("token 0") holds token 0 **and token 1** of head 0; token 1's row mixes tokens 2
# and 0. The shapes are right and nothing crashes, which is why this layout shows up in printed outputs
# of popular write-ups. The widget below colours each merged slot by its head and labels it with its
# token; a red label is a slot that belongs to another token. Try other `B`, `T`, `H`.

# %% tags=["nbval-ignore-output"]
viz.show_merge_visualiser()

# %% [markdown]
# ### The finished module
#
# `llmcourse.nn.MultiHeadAttention(d_in, d_out, num_heads, dropout, qkv_bias, causal, context_length,
# d_kv)` packages sections 3–5. Its `state_dict` keys are `W_query`, `W_key`, `W_value` (each
# `(d_out, d_in)`) and `out_proj`; a causal module also owns a non-persistent bool buffer `causal_mask`.
# Setting `store_weights = True` keeps the last `(B, H, T_q, T_k)` attention weights.

# %%
torch.manual_seed(0)
mha = MultiHeadAttention(d_in=8, d_out=8, num_heads=2, causal=True, context_length=16).eval()
print(mha)
print({k: tuple(v.shape) for k, v in mha.state_dict().items()})
x8 = torch.randn(2, 6, 8)
mha.store_weights = True
out8 = mha(x8)
print("output", tuple(out8.shape), "weights", tuple(mha.last_weights.shape))
assert torch.allclose(mha.last_weights.sum(-1), torch.ones(2, 2, 6))

# %% [markdown]
# ### Spot the bug: row 0 moves
#
# A widely copied efficient `MultiHeadAttention` computes its causal weights as in the cell below. Apply
# unit 03's future-perturbation probe to it: change only the **last** token's key and value and measure
# how far output row 0 (the first token, which may see only itself) moves. It must not move at all.

# %%
def causal_scores_buggy(q, k, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


qp, kp, vp = (split_heads(torch.randn(1, 5, 8), 2) for _ in range(3))
kp2, vp2 = kp.clone(), vp.clone()
kp2[:, :, -1] += 3.0                                   # change only the last token's key and value
vp2[:, :, -1] -= 3.0
m5 = causal_mask(5)


def row0_moves(weights_fn):
    """Self-check helper: how far output row 0 moves when only the last token changes (must be 0)."""
    before = (weights_fn(qp, kp, m5) @ vp)[..., 0, :]
    after = (weights_fn(qp, kp2, m5) @ vp2)[..., 0, :]
    return (after - before).abs().max().item()


print(f"buggy: output row 0 moved by {row0_moves(causal_scores_buggy):.4f} when only the last token changed")
assert row0_moves(causal_scores_buggy) > 0

# %% [markdown]
# **Your fix.** Rewrite `causal_scores(q, k, mask)` (same contract: scaled, masked, softmaxed weights,
# `mask` bool with `True` = may attend) so that the future cannot move an earlier row. Then run the
# self-check.

# %%
def causal_scores(q, k, mask):
    # TODO: row 0 must not depend on any later token
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def self_check_causal_scores():
    moved = row0_moves(causal_scores)
    w = causal_scores(qp, kp, m5)
    ok = moved == 0 and bool((w.triu(1) == 0).all()) and torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]))
    print("✓ the future no longer reaches row 0" if ok else f"✗ not yet: row 0 moved by {moved:.4f}")
    return ok


fixed_mask_apply = self_check_causal_scores()

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed; masked attention is part of exercise 2, so here in words): `masked_fill` is not
# in-place, it *returns* the masked scores; keep its result (or use `masked_fill_`) before the softmax.
# Running this cell replaces your version by unit 03's finished attention, which passes the self-check.
from llmcourse.nn.attention import scaled_dot_product_attention


def causal_scores(q, k, mask):
    return scaled_dot_product_attention(q, k, k, mask=mask)[1]


assert self_check_causal_scores()

# %% [markdown]
# ## 6. The two implementations are the same function
#
# Why should the split module equal the list of heads? Write head `h`'s query projection as the rows
# `h·hd … (h+1)·hd − 1` of the big `W_query.weight` (remember `nn.Linear.weight` is `(d_out, d_in)`,
# the transpose of the row-vector matrix). Then "project with the big matrix and take slice `h`" is
# the same computation as "project with head `h`'s small matrix". Everything after the split is per
# head. So if we
#
# * place every head's `W_query.weight` in the big matrix exactly where head `h`'s slice of features
#   comes out (which part of a `(d_out, d_in)` weight produces features `h·hd … (h+1)·hd − 1`?), and
#   the same for `W_key` and `W_value`, and
# * set `out_proj` to the identity (the wrapper has no output projection),
#
# the fused module must reproduce the wrapper exactly. `mha_from_wrapper` does precisely this:

# %%
fused = mha_from_wrapper(wrapper).eval()
wrapper.eval()
print({k: tuple(v.shape) for k, v in fused.state_dict().items()})
diff = (fused(batch) - wrapper(batch)).abs().max().item()
print(f"max |fused(x) - wrapper(x)| = {diff:.2e}")
assert diff < 1e-6
assert torch.equal(fused.W_query.weight[2:4], wrapper.heads[1].W_query.weight)

# %% [markdown]
# And on something bigger: 4 heads of width 16, `qkv_bias=True`, a batch of 3 sequences of 20 tokens.

# %%
torch.manual_seed(1)
big_wrapper = MultiHeadAttentionWrapper(d_in=32, head_dim=16, context_length=32, dropout=0.0, num_heads=4,
                                        qkv_bias=True).eval()
xb = torch.randn(3, 20, 32)
diff = (mha_from_wrapper(big_wrapper).eval()(xb) - big_wrapper(xb)).abs().max().item()
print(f"max difference: {diff:.2e}")
assert diff < 1e-6

# %% [markdown]
# ## 7. Cross-attention and padding masks
#
# Nothing in the computation requires queries and keys to come from the same sequence. In
# **cross-attention** (the decoder of unit 06 looking at the encoder's output) queries come from `x_q`
# `(B, T_q, d_in)` and keys/values from `x_kv` `(B, T_k, d_kv)`: the scores are `(B, H, T_q, T_k)` and
# the output has one row per **query**. The key/value input may even have another width, `d_kv`.

# %%
torch.manual_seed(2)
cross = MultiHeadAttention(d_in=8, d_out=12, num_heads=3, d_kv=5).eval()
cross.store_weights = True
decoder_states = torch.randn(2, 4, 8)    # T_q = 4
encoder_states = torch.randn(2, 7, 5)    # T_k = 7, d_kv = 5
out_cross = cross(decoder_states, encoder_states)
print("output", tuple(out_cross.shape), "weights", tuple(cross.last_weights.shape))
assert out_cross.shape == (2, 4, 12) and cross.last_weights.shape == (2, 3, 4, 7)

# %% [markdown]
# Batches of different-length sequences are **right-padded**. The pad positions must never be
# attended to, by any query of any head: that is a **key-padding mask** of shape `(B, 1, 1, T_k)`,
# `True` for real keys, which broadcasts over heads and queries. (`llmcourse.padding_mask(lengths)`
# builds it.) Combine it with a causal mask by `&`.

# %%
lengths = torch.tensor([7, 4])
keep = padding_mask(lengths)
print("key-padding mask", tuple(keep.shape), "\n", keep[:, 0, 0].int())
out_pad = cross(decoder_states, encoder_states, mask=keep)
w = cross.last_weights
print("weight on pad keys of sequence 1 (should be 0):", w[1, :, :, 4:].abs().max().item())
assert (w[1, :, :, 4:] == 0).all()

# %% [markdown]
# The property that matters: **padding invariance**. Whatever sits in the pad positions, the output is
# the same as if the sequence had never been padded.

# %%
short = cross(decoder_states[1:], encoder_states[1:, :4])
garbage = encoder_states[1:].clone()
garbage[:, 4:] = 100 * torch.randn(1, 3, 5)
long_ = cross(decoder_states[1:], garbage, mask=keep[1:])
diff = (short - long_).abs().max().item()
print(f"unpadded vs padded-with-garbage: max difference {diff:.2e}")
assert diff < 1e-5

# %% [markdown]
# A causal module with `T_q < T_k` (a few new tokens after a prefix, as with a KV cache in unit 12)
# aligns its queries with the **end** of the keys: query `i` sits at position `T_k − T_q + i`. This is
# the bottom-right causal mask `causal_mask(T_q, T_k)` of unit 00. The last two rows of full
# self-attention must equal two queries attending over all six keys:

# %%
torch.manual_seed(3)
causal_mha = MultiHeadAttention(8, 8, 2, causal=True, context_length=16).eval()
x6 = torch.randn(1, 6, 8)
full = causal_mha(x6)
last_two = causal_mha(x6[:, 4:], x6)
print(causal_mask(2, 6).int())
diff = (full[:, 4:] - last_two).abs().max().item()
print(f"last two rows of self-attention vs 2 queries over 6 keys: {diff:.2e}")
assert diff < 1e-6

# %% [markdown]
# ## 8. PyTorch interop
#
# PyTorch ships two attention tools. Both can reproduce our module exactly, **if** the masks are
# translated.
#
# ### `F.scaled_dot_product_attention`
#
# `F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)` takes
# `(..., T, hd)` tensors and a boolean `attn_mask` with the **same** polarity as ours (`True` = attend).
# It computes the attention only; the projections, split and merge stay ours. `mha_forward_sdpa`
# replaces the attention step of a module by this call:

# %%
keep6 = torch.tensor([[True] * 6])[:, None, None, :]
for desc, args in [("self-attention", (x6,)), ("2 queries after 6 keys", (x6[:, 4:], x6)),
                   ("with a key-padding mask", (x6, None, keep6))]:
    d = (mha_forward_sdpa(causal_mha, *args) - causal_mha(*args)).abs().max().item()
    print(f"{desc:>25}: max difference {d:.2e}")
    assert d < 1e-5

# %% [markdown]
# Its `is_causal=True` shortcut builds a causal mask for you, but **top-left** aligned:
# `tril(ones(T_q, T_k))`, so query `i` sees keys `0 … i`. For `T_q = T_k` that is the same as ours; for
# `T_q < T_k` it is not: the first new query would see only key 0 instead of the whole prefix. The
# mask translator shows the conventions side by side (move the sliders; `T_q = T_k` makes them agree).

# %% tags=["nbval-ignore-output"]
viz.show_mask_translator()

# %%
m_tr = viz.mask_translation(2, 5)
print("course (bottom-right):\n", m_tr["course"].int())
print("is_causal (top-left):\n", m_tr["is_causal"].int())
print("cells that differ:", int(m_tr["differs"].sum()))
qs, ks = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 5, 4)
top_left = F.scaled_dot_product_attention(qs, ks, ks, is_causal=True)
bottom_right = F.scaled_dot_product_attention(qs, ks, ks, attn_mask=causal_mask(2, 5))
print(f"is_causal vs explicit bottom-right mask, T_q=2, T_k=5: max difference "
      f"{(top_left - bottom_right).abs().max().item():.3f}")
assert int(m_tr["differs"].sum()) == 6 and not torch.allclose(top_left, bottom_right)

# %% [markdown]
# ### Spot the bug: passing both `attn_mask` and `is_causal=True`
#
# "I have a padding mask **and** I want causality, so I pass both." PyTorch's documentation says this
# combination is an error. What the installed version actually does is worth measuring rather than
# trusting. In torch 2.13 on the CPU it runs **without complaint** and ANDs your mask with the
# *top-left* causal mask, which is wrong whenever `T_q < T_k`. Either way, the fix is the same:
# combine the masks yourself (`causal_mask(T_q, T_k) & keep`) and pass only `attn_mask`.

# %%
keep5 = torch.tensor([[True, True, True, True, False]])   # (1, T_k): broadcasts over queries
try:
    both = F.scaled_dot_product_attention(qs, ks, ks, attn_mask=keep5, is_causal=True)
    right = F.scaled_dot_product_attention(qs, ks, ks, attn_mask=causal_mask(2, 5) & keep5)
    print(f"torch {torch.__version__} accepted both; difference from the correct result: "
          f"{(both - right).abs().max().item():.3f}")
except RuntimeError as err:
    print(f"torch {torch.__version__} refuses: {str(err).splitlines()[0]}")
fixed = F.scaled_dot_product_attention(qs, ks, ks, attn_mask=causal_mask(2, 5) & keep5)
assert torch.isfinite(fixed).all()

# %% [markdown]
# **Your fix.** `attend_causal_padded(q, k, v, keep)` takes `q` `(B, H, T_q, hd)`, `k` and `v`
# `(B, H, T_k, hd)` and a key-padding mask `keep` `(B, T_k)` bool (True = real token), and returns the
# attention output of `F.scaled_dot_product_attention` for "causal (bottom-right, as in the course) **and**
# not padding". The self-check compares with attention computed one query at a time, for `T_q = T_k` and
# `T_q < T_k`.

# %%
def attend_causal_padded(q, k, v, keep):
    # TODO: one boolean attn_mask, no is_causal
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :], is_causal=True)


def attention_one_query_at_a_time(q, k, v, keep):
    """Self-check oracle: query i sits at position T_k − T_q + i and sees the real keys up to it."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    out = torch.zeros(q.shape[:-1] + v.shape[-1:])
    for b_ in range(q.shape[0]):
        for i in range(t_q):
            allowed = (torch.arange(t_k) <= t_k - t_q + i) & keep[b_]
            w = torch.softmax(q[b_, :, i:i + 1] @ k[b_][:, allowed].transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
            out[b_, :, i] = (w @ v[b_][:, allowed])[:, 0]
    return out


def self_check_causal_padded(fn):
    torch.manual_seed(5)
    for t_q, t_k in [(5, 5), (2, 5), (1, 4)]:
        q_, k_, v_ = torch.randn(2, 2, t_q, 4), torch.randn(2, 2, t_k, 4), torch.randn(2, 2, t_k, 4)
        keep_ = torch.ones(2, t_k, dtype=torch.bool)
        keep_[1, -1] = False                               # the second sequence ends with a pad
        want = attention_one_query_at_a_time(q_, k_, v_, keep_)
        try:
            got = fn(q_, k_, v_, keep_)
        except RuntimeError as err:
            print(f"✗ not yet: T_q={t_q}, T_k={t_k}: {str(err).splitlines()[0]}")
            return False
        if got.shape != want.shape or not torch.allclose(got, want, atol=1e-5):
            print(f"✗ not yet: T_q={t_q}, T_k={t_k}: the output differs from causal-and-padding attention")
            return False
    print("✓ causal and padding masks combined, for T_q = T_k and T_q < T_k")
    return True


self_check_causal_padded(attend_causal_padded)

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed; this call is part of exercise 5, so here in words): AND the bottom-right causal
# mask `causal_mask(T_q, T_k)` with the padding mask broadcast over heads and queries
# (`keep[:, None, None, :]`), and pass that one boolean mask as `attn_mask`, without `is_causal`. Unit 03's
# finished attention, given the same combined mask, passes the self-check:
from llmcourse.nn.attention import scaled_dot_product_attention


def course_attention_causal_padded(q, k, v, keep):
    combined = causal_mask(q.shape[-2], k.shape[-2]) & keep[:, None, None, :]
    return scaled_dot_product_attention(q, k, v, mask=combined)[0]


assert self_check_causal_padded(course_attention_causal_padded)

# %% [markdown]
# ### `nn.MultiheadAttention`
#
# PyTorch's full layer differs from ours in three ways:
#
# 1. **Packed weights.** It stores one `in_proj_weight` of shape `(3·d, d)`: the rows of `W_query`,
#    then `W_key`, then `W_value` (and `in_proj_bias` likewise). `out_proj` is a normal `Linear`.
# 2. **Opposite mask polarity.** Its boolean `attn_mask` and `key_padding_mask` mean `True` =
#    **blocked**. A course mask `m` becomes `~m` (`to_torch_attn_mask`), and a key-padding mask
#    `(B, 1, 1, T_k)` becomes `key_padding_mask = ~keep[:, 0, 0]`, shape `(B, T_k)`.
# 3. **Layout.** It expects `(T, B, d)` unless created with `batch_first=True`.
#
# `to_torch_mha` copies our module into one:

# %%
torch.manual_seed(4)
course = MultiHeadAttention(16, 16, num_heads=4, qkv_bias=True).eval()
torch_mha = to_torch_mha(course).eval()
print(torch_mha)
print("in_proj_weight", tuple(torch_mha.in_proj_weight.shape))
x16 = torch.randn(2, 7, 16)
cm7 = causal_mask(7)
course.store_weights = True
ours = course(x16, mask=cm7)
theirs, theirs_w = torch_mha(x16, x16, x16, attn_mask=to_torch_attn_mask(cm7), need_weights=True,
                             average_attn_weights=True)
print(f"outputs: max difference {(ours - theirs).abs().max().item():.2e}")
print(f"weights (averaged over heads): max difference {(course.last_weights.mean(1) - theirs_w).abs().max().item():.2e}")
assert torch.allclose(ours, theirs, atol=1e-5) and torch.allclose(course.last_weights.mean(1), theirs_w, atol=1e-6)

lengths7 = torch.tensor([7, 5])
keep7 = padding_mask(lengths7)
theirs_pad = torch_mha(x16, x16, x16, key_padding_mask=~keep7[:, 0, 0], need_weights=False)[0]
d = (course(x16, mask=keep7) - theirs_pad).abs().max().item()
print(f"key padding: max difference {d:.2e}")
assert d < 1e-5

# %% [markdown]
# ### Spot the bug: the course mask passed unchanged
#
# Hand our causal mask straight to `nn.MultiheadAttention` and it blocks exactly what we wanted to
# allow. Query 0 now sees every key **except** itself (all of them in its future), and the last query
# is left with no key at all. What torch returns for such a row depends on the code path, and we
# measure all three below: with `need_weights=True` the weights row is NaN; with `need_weights=False`
# and autograd on, the context row is silently zero, so the output is just `out_proj.bias`; and under
# `torch.no_grad()` in `eval()` mode, where torch takes its fused fast path, the row is NaN again. All
# three are wrong, and the zero one does not even warn you.

# %%
unchanged, w_unchanged = torch_mha(x16, x16, x16, attn_mask=cm7, need_weights=True, average_attn_weights=True)
print("weights of query 0 with the unconverted mask:", w_unchanged[0, 0].detach().numpy().round(3))
print("weights of the last query:", w_unchanged[0, -1].detach().numpy())
fast = torch_mha(x16, x16, x16, attn_mask=cm7, need_weights=False)[0]
zero_gap = (fast[:, -1] - torch_mha.out_proj.bias).abs().max().item()
print("need_weights=False, autograd on: last row minus out_proj.bias:", zero_gap)
with torch.no_grad():
    fused = torch_mha(x16, x16, x16, attn_mask=cm7, need_weights=False)[0]
print("need_weights=False under torch.no_grad() (fused fast path): last row is NaN?",
      bool(torch.isnan(fused[:, -1]).all()))
assert w_unchanged[0, 0, 0] == 0 and w_unchanged[0, 0, 1:].sum() > 0.99   # query 0 attends only to the future
assert zero_gap < 1e-6 and torch.isnan(fused[:, -1]).all()

# %% [markdown]
# **Your fix.** Write `course_to_torch_mask(mask)`: it takes a course mask (bool, `True` = may attend) and
# returns the `attn_mask` that makes `nn.MultiheadAttention` compute the same attention. Then run the
# self-check: the layer's output must equal our module's.

# %%
def course_to_torch_mask(mask):
    # TODO: nn.MultiheadAttention reads True as "blocked"
    return mask


def self_check_torch_mask():
    with torch.no_grad():
        got = torch_mha(x16, x16, x16, attn_mask=course_to_torch_mask(cm7), need_weights=False)[0]
    ok = bool(torch.allclose(got, ours, atol=1e-5))
    print("✓ nn.MultiheadAttention now matches our module" if ok else
          "✗ not yet: the outputs differ (or are NaN) with this mask")
    return ok


fixed_torch_mask = self_check_torch_mask()

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed): invert the polarity, which is what to_torch_attn_mask does. Running it
# replaces your version.
def course_to_torch_mask(mask):
    return ~mask


assert self_check_torch_mask() and torch.equal(course_to_torch_mask(cm7), to_torch_attn_mask(cm7))

# %% [markdown]
# ## 9. Parameter counts and cost
#
# With `d_in = d_out = d`: three `d × d` projections, an output projection `d × d` with a bias, and
# optionally three `d`-sized qkv biases:
#
# $$N = 3\,d_{in}\,d_{out}\;(+\,3\,d_{out}) + d_{out}^2 + d_{out}$$
#
# The head count does **not** appear: splitting into heads reshapes the same matrices. One GPT-2 small
# attention layer (`d = 768`, 12 heads, qkv bias) has 2,362,368 parameters.

# %%
for d_model, bias, expected in [(768, False, 2_360_064), (768, True, 2_362_368), (512, False, 1_049_088),
                                (512, True, 1_050_624)]:
    counted = sum(p.numel() for p in MultiHeadAttention(d_model, d_model, 8, qkv_bias=bias).parameters())
    formula = 3 * d_model * d_model + (3 * d_model if bias else 0) + d_model * d_model + d_model
    print(f"d={d_model}, qkv_bias={bias!s:>5}: counted {counted:,}  formula {formula:,}  "
          f"mha_param_count {mha_param_count(d_model, d_model, bias):,}")
    assert counted == formula == expected == mha_param_count(d_model, d_model, bias)
heads_vary = {h_: sum(p.numel() for p in MultiHeadAttention(768, 768, h_).parameters()) for h_ in (1, 4, 12)}
print("independent of the head count:", heads_vary)
assert len(set(heads_vary.values())) == 1

# %% [markdown]
# **Cost.** For a sequence of `T` tokens, the projections cost about `4 · T · d²` multiply-adds (Q, K,
# V and the output), and the attention itself `2 · T² · d` (the scores `Q Kᵀ` over all heads together
# are `T · T · d`, and weights times values again `T · T · d`). The score tensor holds `H · T²` numbers
# per sequence. The `T²` terms win once `T` exceeds about `2d` (the crossover is computed below).
# Neither of two later tricks changes this `T²` term of one forward pass: the KV cache (unit 12) stops
# *recomputing* the keys and values of earlier tokens across decoding steps, and latent attention
# (unit 13) shrinks the *memory* that cache takes. Cutting the quadratic score computation itself
# needs other ideas (local or sparse attention, for example).

# %%
d_model = 768
for T in (128, 1024, 1536, 4096):
    proj, attn = 4 * T * d_model**2, 2 * T * T * d_model
    print(f"T={T:5d}: projections {proj / 1e9:6.2f} GMAC, attention {attn / 1e9:6.2f} GMAC, "
          f"score entries per head {T * T:,}")
crossover = next(T for T in range(1, 10 * d_model) if 2 * T * T * d_model >= 4 * T * d_model**2)
print(f"GPT-2 small (d = {d_model}): attention's T² term overtakes the projections at T = {crossover:,} tokens")
assert crossover == 2 * d_model

# %% [markdown]
# ## Summary
#
# * Multi-head attention runs `H` attentions on `H` slices of width `head_dim = d_out / H`; the scale
#   is `1/√head_dim`; an output projection mixes the heads.
# * The list of heads and the split module are the same function once each head's weights sit where
#   its feature slice comes out and `out_proj = I`.
# * Split with `view(B, T, H, hd).transpose(1, 2)`; merge with `transpose(1, 2).contiguous().view(B, T, d_out)`.
#   Transpose the **last two** axes for `Kᵀ`. Assign the result of `masked_fill`.
# * One mask convention (`True` = attend) for our module and SDPA; invert it for `nn.MultiheadAttention`;
#   build the bottom-right causal mask yourself when `T_q ≠ T_k`.
#
# Next, in unit 05, `MultiHeadAttention` goes inside a Transformer block with LayerNorm, a feed-forward
# network and residual connections.

# %% [markdown]
# ## Extension (ungraded, open-ended): which heads matter?
#
# A common way to ask what a head does is to **ablate** it: zero its context before the output
# projection and see how the layer's output changes. Write `ablate_head(mha, x, head)`: the output of the
# causal `MultiHeadAttention` `mha` on `x` when head `head`'s context is replaced by zeros (the other heads
# unchanged). Then explore: which head's ablation moves the output most, and does the answer depend on the
# input? The self-check tests one property that any correct ablation has: because `out_proj` is linear,
# the changes caused by ablating each head one at a time add up to the output minus `out_proj.bias`.
# (It prints "not attempted" while `ablate_head` is a stub.)

# %%
def ablate_head(mha, x, head):
    return None   # your code: (B, T, d_out), the output with this head's context set to zero


def self_check_ablation():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 8, num_heads=4, causal=True, context_length=6).eval()
    x = torch.randn(2, 6, 8)
    with torch.no_grad():
        full = m(x)
        ablated = [ablate_head(m, x, hh) for hh in range(4)]
    if any(a is None for a in ablated):
        print("not attempted (optional)")
        return
    total = sum(full - a for a in ablated)
    ok = torch.allclose(total, full - m.out_proj.bias, atol=1e-5)
    print("✓ the head ablations add up" if ok else "✗ the changes do not add up to output − out_proj.bias")


self_check_ablation()
