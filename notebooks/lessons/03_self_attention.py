# %% [markdown]
# # Unit 03 — Self-attention from scratch
#
# Attention is the one operation every model in this course is built around, from the 2017
# Transformer to DeepSeek-V3. In this lesson we build it up from nothing, one idea at a time, and we
# check every claim with a number you can see:
#
# 1. why attention exists at all;
# 2. attention **without** trainable weights on a six-word sentence;
# 3. softmax, and how to compute it without overflowing;
# 4. trainable query, key and value projections;
# 5. why the scores are divided by $\sqrt{d_k}$;
# 6. context vectors and the shapes of everything;
# 7. why initialisation matters (`nn.Parameter(torch.rand(...))` vs `nn.Linear`);
# 8. causal masking, four ways, with a probe that catches leaks from the future;
# 9. dropout on the attention weights;
# 10. a batched `CausalSelfAttention` module with a mask buffer;
#
# and, in the companion **lab** notebook (`lessons/03_self_attention_lab.ipynb`), we **train** a one-layer
# attention-only language model on Shakespeare and look at what its attention learned.
#
# The companion exercise notebook (`exercises/03_self_attention/03_self_attention.ipynb`) asks you to
# write `softmax_stable`, `simple_attention`, `scaled_dot_product_attention`, `SelfAttention` and
# `CausalSelfAttention` yourself. Here we develop the ideas, the math and the tests that pin them down,
# and call the finished library versions where a result is needed; the code is yours to write in the
# exercises. From unit 04 on, the course imports the finished versions from `llmcourse.nn`.
#
# Cells marked **Spot the bug** show mistakes that appear in popular write-ups. Run the buggy cell and
# read which property breaks; then write your fix in the **TODO** cell and run its self-check (it prints
# "not yet" until the fix is right). A reference fix follows in a collapsed cell (click its margin to
# expand it); it runs with the rest of the notebook, so later cells work either way.
#
# **Conventions used everywhere in the course**
#
# * Row vectors: a token is a row `x` and a projection is `q = x W_q` with `W_q` of shape
#   `(d_in, d_out)`. `nn.Linear(d_in, d_out).weight` stores the transpose, shape `(d_out, d_in)`.
# * Masks are boolean and **`True` means "this query may attend to this key"**, as in
#   `torch.nn.functional.scaled_dot_product_attention`.
# * Names: **raw scores** $QK^\top$, **scaled scores** $QK^\top/\sqrt{d_k}$, **attention weights** (the
#   softmax output, rows sum to 1), **context vectors** (weights times values). The trainable *weight
#   parameters* $W_q, W_k, W_v$ are something else again.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.nn import CausalSelfAttention, SelfAttention, causal_mask, scaled_dot_product_attention, softmax_stable
from llmcourse.viz import attention as viz

cfg = llmcourse.setup_notebook("03")
cfg

# %% [markdown]
# ## 1. Why attention?
#
# Before 2014, neural machine translation used an **encoder–decoder** pair of recurrent networks
# (RNNs). The encoder read the source sentence one word at a time and squeezed everything it had
# read into one fixed-size vector, its final hidden state. The decoder then had to produce the
# whole translation from that single vector. Short sentences worked; long ones did not, because a
# few hundred numbers cannot hold an arbitrarily long sentence. This is the **fixed-size
# bottleneck**.
#
# Bahdanau, Cho and Bengio (2014) removed it: at every output step the decoder looks back at **all**
# encoder states and takes a weighted average of them, with weights that depend on what it is
# currently producing. Plotting those weights for a translation shows an **alignment**: when the
# decoder writes a French word, most of the weight sits on the English word(s) it translates, and
# the alignment can cross over when word order differs between the languages.
#
# Two flavours of this idea matter for the rest of the course:
#
# * **cross-attention**: the queries come from one sequence (the decoder's output so far) and the
#   keys and values from another (the encoded source sentence). Unit 06 uses it for translation.
# * **self-attention**: queries, keys and values all come from the **same** sequence, so every token
#   builds its new representation from the other tokens of its own sentence. Vaswani et al. (2017)
#   showed that stacks of self-attention, with no recurrence at all, are enough. This lesson is about
#   self-attention.

# %% [markdown]
# ## 2. Attention without trainable weights
#
# Our running example is the six-token sentence **"Your journey starts with one step"**, each token
# given a made-up 3-dimensional embedding (real models use hundreds or thousands of dimensions).
#
# The recipe for one token, the **query**, say "journey":
#
# 1. **scores**: the dot product of the query with every token (including itself). A large dot
#    product means the two vectors point the same way.
# 2. **weights**: turn the scores into positive numbers that sum to 1 (softmax, section 3).
# 3. **context vector**: the weighted sum of all the token vectors. It is a new representation of
#    "journey" that mixes in the tokens most similar to it.

# %%
tokens = ["Your", "journey", "starts", "with", "one", "step"]
inputs = torch.tensor([[0.43, 0.15, 0.89],   # Your
                       [0.55, 0.87, 0.66],   # journey
                       [0.57, 0.85, 0.64],   # starts
                       [0.22, 0.58, 0.33],   # with
                       [0.77, 0.25, 0.10],   # one
                       [0.05, 0.80, 0.55]])  # step

query = inputs[1]  # "journey"
scores_journey = torch.empty(len(tokens))
for j, x_j in enumerate(inputs):          # one dot product per token, written out
    scores_journey[j] = torch.dot(query, x_j)
print("scores of 'journey':", scores_journey)
assert torch.allclose(scores_journey, inputs @ query)  # the loop is one matrix-vector product

weights_journey = torch.softmax(scores_journey, dim=0)
context_journey = weights_journey @ inputs  # = sum_j weights[j] * inputs[j]
print("weights of 'journey':", weights_journey, "sum =", float(weights_journey.sum()))
print("context of 'journey':", context_journey)

# %% [markdown]
# Doing this for all six queries at once is two matrix products. Stack the inputs as the rows of
# $X$ (shape `(T, d)` = `(6, 3)`):
#
# $$\text{weights} = \operatorname{softmax}(X X^\top) \quad (T\times T),\qquad \text{context} = \text{weights}\; X \quad (T \times d).$$
#
# Row $i$ of $XX^\top$ holds the scores of query $i$ against every key, so the softmax runs along
# the **last** dimension (`dim=-1`): each *row* sums to 1. We check the result against reference
# values computed independently, to four decimals.

# %%
attn_scores = inputs @ inputs.T              # (6, 3) @ (3, 6) -> (6, 6)
attn_weights = torch.softmax(attn_scores, dim=-1)
all_context = attn_weights @ inputs          # (6, 6) @ (6, 3) -> (6, 3)
print(attn_weights)
print(all_context)

ref_weights = torch.tensor([[0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452],
                              [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
                              [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565],
                              [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
                              [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295],
                              [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896]])
ref_context = torch.tensor([[0.4421, 0.5931, 0.5790], [0.4419, 0.6515, 0.5683], [0.4431, 0.6496, 0.5671],
                              [0.4304, 0.6298, 0.5510], [0.4671, 0.5910, 0.5266], [0.4177, 0.6503, 0.5645]])
assert torch.allclose(attn_weights, ref_weights, atol=1e-4)
assert torch.allclose(all_context, ref_context, atol=1e-4)
assert torch.allclose(attn_weights[1], weights_journey) and torch.allclose(all_context[1], context_journey)
assert torch.allclose(attn_weights.sum(dim=-1), torch.ones(6))
# the same computation is in the course library (and is exercise 03.simple_attention):
lib_context, lib_weights = llmcourse.nn.simple_attention(inputs)
assert torch.allclose(lib_weights, attn_weights) and torch.allclose(lib_context, all_context)
print("weights and context match the reference values to 1e-4")

# %% [markdown]
# ## 3. Softmax, and computing it safely
#
# Why softmax, $\operatorname{softmax}(z)_i = e^{z_i} / \sum_j e^{z_j}$, and not simply dividing the
# scores by their sum? Three reasons:
#
# * it works for **negative** scores (dot products can be negative; plain normalisation could then
#   give negative "weights" or divide by zero);
# * it is **shift-invariant**: adding the same constant to every score changes nothing, because
#   $e^{z_i + c} = e^c e^{z_i}$ and $e^c$ cancels;
# * it **exaggerates differences**: a difference of $\Delta$ in scores becomes a factor of
#   $e^{\Delta}$ in weights. In `[1, 2, 3, 6]` the scores of 6 and 1 differ by 5, so their weights differ
#   by a factor $e^5 \approx 148.4$, whereas plain normalisation gives a factor of 6.

# %%
z = torch.tensor([1.0, 2.0, 3.0, 6.0])
p_soft = torch.softmax(z, dim=0)
p_plain = z / z.sum()
print("softmax:             ", p_soft)
print("simple normalisation:", p_plain)
ratio = float(p_soft[3] / p_soft[0])
print(f"weight(6) / weight(1) = {ratio:.1f}   e^5 = {math.exp(5):.1f}")
assert torch.allclose(p_soft, torch.tensor([0.0063, 0.0170, 0.0463, 0.9304]), atol=1e-4)
assert torch.allclose(p_plain, torch.tensor([0.0833, 0.1667, 0.25, 0.5]), atol=1e-4)
assert abs(ratio - 148.4) < 0.05 and abs(math.exp(5) - 148.4) < 0.05
assert torch.allclose(torch.softmax(z + 100.0, dim=0), p_soft)   # shift invariance

# %% [markdown]
# **Overflow.** $e^{1000}$ is far beyond the largest float32 (about $3.4\times10^{38}$), so the
# textbook formula gives `inf / inf = nan` for `[1000, 1001]`, although the answer is perfectly
# ordinary. Shift invariance is the cure: $\operatorname{softmax}(z) = \operatorname{softmax}(z - c)$ for any
# constant $c$ (the cell above checked $c = -100$), so a well-chosen shift keeps every exponent small without
# changing the result. Which shift, taken along which axis, is yours to decide in exercise 1. Entries equal to
# $-\infty$ become $e^{-\infty} = 0$, which is exactly what masking will need.
#
# Below, `softmax_stable` is the library's version (you write your own in the exercises). The tests it
# must pass: no `nan` for huge inputs, the same values as `torch.softmax`, weight 0 for $-\infty$, and
# the reference values of a few cases computed independently.

# %%
def softmax_naive(x, dim=-1):
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


big = torch.tensor([1000.0, 1001.0])
print("naive :", softmax_naive(big))
print("stable:", softmax_stable(big))
assert torch.isnan(softmax_naive(big)).all()
assert torch.allclose(softmax_stable(big), torch.tensor([0.2689, 0.7311]), atol=1e-4)

# reference cases (computed independently), each also compared with torch.softmax
cases = {
    (2.0, 3.0, 5.0): [0.0420, 0.1142, 0.8438],
    (2.0, 3.0, -math.inf): [0.2689, 0.7311, 0.0],
    (11.0, 10.2, 10.1, 10.4, 11.2): [0.2758, 0.1239, 0.1121, 0.1513, 0.3368],
    (0.1, -0.2, 0.3, -0.2, 0.5): [0.1925, 0.1426, 0.2351, 0.1426, 0.2872],
    (0.8, -1.6, 2.4, -1.6, 4.0): [0.0326, 0.0030, 0.1615, 0.0030, 0.8000],   # the line above, ×8
}
for values, expected in cases.items():
    x = torch.tensor(values)
    got = softmax_stable(x)
    print(f"{str(values):34s} -> {[round(v, 4) for v in got.tolist()]}")
    assert torch.allclose(got, torch.tensor(expected), atol=1e-4)
    assert torch.allclose(got, torch.softmax(x, dim=0), atol=1e-6)

# %% [markdown]
# **Rows with nothing allowed.** When every entry of a row is $-\infty$ (a query that may attend to
# no key at all), the softmax is $0/0 =$ `nan`. Some code fills blocked scores with a large negative
# number such as `-1e9` instead; an all-blocked row then becomes *uniform*, which hides the problem.
# `-1e9` is also out of range for float16 (its largest magnitude is 65504): `masked_fill(mask, -1e9)`
# on a float16 tensor **raises** an overflow error, and only an explicit conversion such as
# `torch.tensor(-1e9).half()` rounds it to $-\infty$ (both printed below). If you need a finite fill,
# use `torch.finfo(dtype).min`. In this course every query always has at least one allowed key
# (itself), so we use $-\infty$.

# %%
all_blocked = torch.full((4,), -math.inf)
print("all -inf  ->", torch.softmax(all_blocked, dim=0))
print("all -1e9  ->", torch.softmax(torch.full((4,), -1e9), dim=0))
print("torch.tensor(-1e9).half() ->", torch.tensor(-1e9).half(), "; finfo(float16).min =", torch.finfo(torch.float16).min)
half_scores, half_block = torch.zeros(4, dtype=torch.float16), torch.tensor([False, True, True, True])
try:
    half_scores.masked_fill(half_block, -1e9)
    fp16_fill_raises = False
except RuntimeError as err:
    fp16_fill_raises = True
    print("float16 masked_fill(mask, -1e9) -> RuntimeError:", str(err).splitlines()[0])
assert fp16_fill_raises
print("float16 masked_fill(mask, finfo.min) ->", half_scores.masked_fill(half_block, torch.finfo(torch.float16).min))
assert torch.isnan(torch.softmax(all_blocked, dim=0)).all()
assert torch.allclose(torch.softmax(torch.full((4,), -1e9), dim=0), torch.full((4,), 0.25))
assert torch.isinf(torch.tensor(-1e9, dtype=torch.float16))
# with at least one allowed key, -inf, finfo.min and -1e9 fills give the same weights in float32:
s = torch.tensor([0.3, 1.2, 0.7, -0.4])
allowed = torch.tensor([True, True, False, False])
fills = [s.masked_fill(~allowed, v).softmax(0) for v in (-math.inf, torch.finfo(torch.float32).min, -1e9)]
assert all(torch.equal(fills[0], f) for f in fills[1:])

# %% [markdown]
# ## 4. Trainable queries, keys and values
#
# Attention without weights has nothing to learn: a token's scores depend only on how similar the raw
# embeddings are. Self-attention gives every token three *roles*, each a learned linear projection:
#
# * **query** $q = x W_q$: what this token is looking for;
# * **key** $k = x W_k$: what this token offers to be found by;
# * **value** $v = x W_v$: what this token hands over once it is attended to.
#
# Separating query from key matters: with $W_q = W_k$ the score matrix would be symmetric, and a
# token would typically score highest against itself. With separate projections "journey" can look
# for something quite different from what it advertises.
#
# We project from $d_{in} = 3$ to $d_{out} = 2$, with weights drawn by a fixed recipe so that every
# number below is reproducible: `torch.manual_seed(123)`, then `torch.rand(3, 2)` three times, in the
# order query, key, value.
# (`requires_grad=False` only because we are not training yet.)

# %%
torch.manual_seed(123)
W_query, W_key, W_value = [nn.Parameter(torch.rand(3, 2), requires_grad=False) for _ in range(3)]
print("W_query =", W_query.data, "\nW_key =", W_key.data, "\nW_value =", W_value.data, sep="\n")
assert torch.allclose(W_query, torch.tensor([[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]]), atol=1e-4)
assert torch.allclose(W_key, torch.tensor([[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]]), atol=1e-4)
assert torch.allclose(W_value, torch.tensor([[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274]]), atol=1e-4)

queries = inputs @ W_query    # (6, 3) @ (3, 2) -> (6, 2)
keys = inputs @ W_key
values = inputs @ W_value
print("Q =", queries, "K =", keys, "V =", values, sep="\n")
assert torch.allclose(queries, torch.tensor([[0.2309, 1.0966], [0.4306, 1.4551], [0.4300, 1.4343],
                                              [0.2355, 0.7990], [0.2983, 0.6565], [0.2568, 1.0533]]), atol=1e-4)
assert torch.allclose(keys, torch.tensor([[0.3669, 0.7646], [0.4433, 1.1419], [0.4361, 1.1156],
                                          [0.2408, 0.6706], [0.1827, 0.3292], [0.3275, 0.9642]]), atol=1e-4)
assert torch.allclose(values, torch.tensor([[0.1855, 0.8812], [0.3951, 1.0037], [0.3879, 0.9831],
                                            [0.2393, 0.5493], [0.1492, 0.3346], [0.3221, 0.7863]]), atol=1e-4)

# %% [markdown]
# The raw scores of query 2 ("journey", row index 1) against all six keys, then the whole $6\times6$
# score matrix. Watch the shapes: $Q K^\top$ is `(T, d_out) @ (d_out, T) -> (T, T)`, one row per
# query, one column per key. (A popular write-up labels this product `(d_in, d_out) @ (d_out, d_in) ->
# (d_in, d_in)`; that is wrong: the result is indexed by **tokens**, not by feature dimensions.)

# %%
scores_2 = queries[1] @ keys.T             # (2,) @ (2, 6) -> (6,)
print("raw scores of 'journey':", scores_2)
assert torch.allclose(scores_2, torch.tensor([1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440]), atol=1e-4)

raw_scores = queries @ keys.T              # (6, 2) @ (2, 6) -> (6, 6)
assert raw_scores.shape == (len(tokens), len(tokens))
assert torch.allclose(raw_scores[1], scores_2)
print(raw_scores)

# Regenerate numbers from code: recomputing from Q and K cut to two decimals is already visibly off.
q_cut, k_cut = queries.mul(100).trunc().div(100), keys.mul(100).trunc().div(100)
score_cut = float(q_cut[0] @ k_cut[0])
print(f"score(0, 0) from full-precision Q, K: {raw_scores[0, 0]:.4f}; from 2-decimal Q, K: {score_cut:.4f}")
assert abs(float(raw_scores[0, 0]) - 0.9231) < 1e-4 and abs(score_cut - 0.9112) < 1e-4

# %% [markdown]
# ## 5. Why divide by $\sqrt{d_k}$?
#
# The Transformer paper's formula is
#
# $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V,$$
#
# where $d_k$ is the width of the **keys** (and queries). Two experiments show why.
#
# **The variance experiment.** A dot product $q\cdot k = \sum_{i=1}^{d_k} q_i k_i$ adds up $d_k$
# terms. If the components are independent with mean 0 and variance 1, each product $q_i k_i$ has
# variance 1, and variances of independent terms add: $\operatorname{Var}(q\cdot k) = d_k$, so the
# typical size of a score grows like $\sqrt{d_k}$. Dividing by $\sqrt{d_k}$ brings the variance back to 1
# whatever the width. Even with no randomness the growth is plain: $0.1\cdot\mathbf 1_d$ dotted with
# itself is $0.01\,d$.

# %%
for d, expected in [(2, 0.02), (100, 1.0), (1000, 10.0)]:
    v = torch.full((d,), 0.1)
    print(f"d = {d:4d}: (0.1·1)·(0.1·1) = {float(v @ v):.4f}")
    assert abs(float(v @ v) - expected) < 1e-4

# Monte Carlo with 100,000 samples per d (drawn in chunks so memory stays small)
for d in (2, 64, 512):
    raw, scaled = viz.dot_product_samples(d, n_samples=100_000, seed=0)
    var_raw, var_scaled = float(raw.var()), float(scaled.var())
    print(f"d_k = {d:3d}: Var(q·k) = {var_raw:8.2f} (expected {d}),  Var(q·k/√d_k) = {var_scaled:.3f} (expected 1)")
    assert abs(var_raw / d - 1) < 0.05 and abs(var_scaled - 1) < 0.05

print(f"\nat d_k = 512 scaling multiplies every score by 1/√512 = 1/{math.sqrt(512):.2f} = {1 / math.sqrt(512):.4f}")
assert abs(math.sqrt(512) - 22.63) < 0.005

# %% [markdown]
# **The sharpness experiment.** Why would large scores hurt? Softmax turns score *differences* into
# weight *ratios* exponentially. Multiply the same scores by 8 (what 64-times-wider keys do to typical
# unscaled scores, since $\sqrt{64} = 8$) and the softmax collapses onto its largest entry. A nearly one-hot
# softmax has nearly zero gradient with respect to all its inputs, so the query and key projections
# stop learning. Scaling keeps the softmax in its responsive range at initialisation.
#
# Multiplying scores by $s$ is the same as dividing by a **temperature** $1/s$; unit 09 uses exactly this
# knob when sampling text. Move the slider (the static version shows $s = 1$ and $s = 8$).

# %%
base = torch.tensor([0.1, -0.2, 0.3, -0.2, 0.5])
for s in (1, 8):
    probs, entropy = viz.softmax_sharpness(s)
    print(f"s = {s}: softmax = {[round(v, 4) for v in probs.tolist()]}, entropy = {entropy:.3f} nats")
assert torch.allclose(viz.softmax_sharpness(8)[0], torch.tensor([0.0326, 0.0030, 0.1615, 0.0030, 0.8000]), atol=1e-4)
# gradient of the largest weight with respect to the scores: it shrinks as the softmax saturates
for s in (1, 8, 64):
    zz = (s * base).requires_grad_()
    torch.softmax(zz, 0)[4].backward()
    print(f"s = {s:2d}: largest |d softmax_max / d score| = {float(zz.grad.abs().max()):.2e}")

# %% tags=["nbval-ignore-output"]
viz.show_softmax_sharpness()

# %% [markdown]
# The same spread, as histograms: raw dot products get wider and wider with $d_k$, the scaled ones keep
# unit variance. The curve on the right is $\operatorname{Var}(q\cdot k)$ against $d_k$ on log axes; it
# follows the line $y = d_k$.

# %% tags=["nbval-ignore-output"]
viz.show_variance_vs_dim()

# %% [markdown]
# **$\sqrt{d_k}$, not $d_k$, and not $\sqrt{d_{model}}$.** Dividing by $d_k$ over-corrects: the variance
# becomes $1/d_k$, so all scores look alike and the softmax is nearly uniform for wide keys. And the
# width that matters is that of the vectors being dotted. With a single head $d_k = d_{out}$; with
# several heads (unit 04), each head's keys have width `head_dim`, which is smaller than `d_model`. Some
# write-ups announce "divide by $\sqrt{d_{model}}$" and then divide by $\sqrt{d_k}$ in the code; the code is
# right. Here is what the wrong divisors would do to the score variance for a head of width 64 in a
# model of width 512:

# %%
raw64, _ = viz.dot_product_samples(64, n_samples=100_000, seed=1)
for name, divisor in [("√d_k = 8", 8.0), ("d_k = 64", 64.0), ("√d_model = √512", math.sqrt(512))]:
    print(f"divide by {name:16s}: Var = {float((raw64 / divisor).var()):.4f}")
assert abs(float((raw64 / 8).var()) - 1) < 0.05
assert float((raw64 / 64).var()) < 0.02 and float((raw64 / math.sqrt(512)).var()) < 0.15

# %% [markdown]
# Back to our example: the attention weights are the softmax of the scaled scores, with $d_k = 2$
# (checked against reference values computed independently).

# %%
d_k = keys.shape[-1]
attn_weights = torch.softmax(raw_scores / math.sqrt(d_k), dim=-1)
print(attn_weights)
ref_scaled_weights = torch.tensor([[0.1551, 0.2104, 0.2059, 0.1413, 0.1074, 0.1799],
                              [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820],
                              [0.1503, 0.2256, 0.2192, 0.1315, 0.0914, 0.1819],
                              [0.1591, 0.1994, 0.1962, 0.1477, 0.1206, 0.1769],
                              [0.1610, 0.1949, 0.1923, 0.1501, 0.1265, 0.1752],
                              [0.1557, 0.2092, 0.2048, 0.1419, 0.1089, 0.1794]])
assert torch.allclose(attn_weights, ref_scaled_weights, atol=1e-4)

# %% [markdown]
# ## 6. Context vectors
#
# The context vectors are the attention-weighted sums of the **value** vectors: $Z = A V$, one row per
# query. (A common slip is to multiply the weights by the inputs $X$ or the queries instead; the whole
# point of $W_v$ is to choose what a token passes on.)
#
# | tensor | math | shape here | shape in general |
# |---|---|---|---|
# | inputs $X$ | | `(6, 3)` | `(T, d_in)` or `(B, T, d_in)` |
# | $W_q, W_k, W_v$ | | `(3, 2)` | `(d_in, d_out)` (`nn.Linear.weight`: `(d_out, d_in)`) |
# | $Q, K, V$ | $XW_q, XW_k, XW_v$ | `(6, 2)` | `(..., T, d_out)` |
# | raw scores | $QK^\top$ | `(6, 6)` | `(..., T_q, T_k)` |
# | weights $A$ | $\operatorname{softmax}(QK^\top/\sqrt{d_k})$ | `(6, 6)` | `(..., T_q, T_k)`, rows sum to 1 |
# | context $Z$ | $AV$ | `(6, 2)` | `(..., T_q, d_v)` |

# %%
context_vecs = attn_weights @ values      # (6, 6) @ (6, 2) -> (6, 2)
print(context_vecs)
ref_scaled_context = torch.tensor([[0.2996, 0.8053], [0.3061, 0.8210], [0.3058, 0.8203],
                              [0.2948, 0.7939], [0.2927, 0.7891], [0.2990, 0.8040]])
assert torch.allclose(context_vecs, ref_scaled_context, atol=1e-4)
# the library function (exercise 03.scaled_dot_product_attention) and PyTorch's built-in agree
ctx_lib, w_lib = scaled_dot_product_attention(queries, keys, values)
assert torch.allclose(ctx_lib, context_vecs, atol=1e-6) and torch.allclose(w_lib, attn_weights, atol=1e-6)
assert torch.allclose(F.scaled_dot_product_attention(queries, keys, values), context_vecs, atol=1e-6)
print("context vectors match the reference values, llmcourse and F.scaled_dot_product_attention")

# %% [markdown]
# With $d_{out} = 2$ we can draw the geometry. Each key is a point in the plane and the query is an
# arrow; a key's score is its projection onto the query direction times the query's length, so keys
# lying far along the arrow get the largest weights. Pick other query tokens in the dropdown.

# %% tags=["nbval-ignore-output"]
viz.show_query_geometry()

# %% [markdown]
# ## 7. A `SelfAttention` module, and why initialisation matters
#
# Wrapping the projections in a module is a few lines. A first version stores the three matrices as
# `nn.Parameter(torch.rand(d_in, d_out))`, exactly the recipe we used above, so it reproduces the
# context vectors of section 6.

# %%
class SelfAttentionRand(nn.Module):
    """Self-attention with weights initialised by torch.rand (uniform on [0, 1)): for demonstration."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
        return weights @ v


torch.manual_seed(123)
sa_rand = SelfAttentionRand(3, 2)
with torch.no_grad():
    out_rand = sa_rand(inputs)
assert torch.allclose(out_rand, ref_scaled_context, atol=1e-4)

# The library's SelfAttention uses nn.Linear layers. nn.Linear computes x @ weight.T, so to load the
# same matrices we store their transposes, shape (d_out, d_in).
sa = SelfAttention(3, 2)
with torch.no_grad():
    sa.W_query.weight.copy_(sa_rand.W_query.T)
    sa.W_key.weight.copy_(sa_rand.W_key.T)
    sa.W_value.weight.copy_(sa_rand.W_value.T)
    out_linear = sa(inputs)
print(out_linear)
assert torch.allclose(out_linear, out_rand, atol=1e-6)
print("state_dict keys:", list(sa.state_dict()), "| W_query.weight shape:", tuple(sa.W_query.weight.shape))

# %% [markdown]
# So why does the library use `nn.Linear`? Because `torch.rand` is a poor initialisation once the
# dimensions are realistic. All its entries are positive with mean 0.5, so every projected component is
# a sum of $d_{in}$ positive terms and every dot product a sum of $d_{out}$ large positive terms.
#
# Even without projections, 512-dimensional `torch.rand` inputs already give huge scores, and a softmax
# that is one-hot:

# %%
torch.manual_seed(123)
inputs_512 = torch.rand(4, 512)
scores_q2 = inputs_512 @ inputs_512[2]
print("scores of query 2:", scores_q2)
print("softmax:", torch.softmax(scores_q2, dim=0))
print("Gram diagonal:", torch.diagonal(inputs_512 @ inputs_512.T))
assert torch.allclose(scores_q2, torch.tensor([134.1449, 129.8451, 177.2513, 130.5724]), atol=1e-3)
assert torch.allclose(torch.softmax(scores_q2, dim=0), torch.tensor([1.9016e-19, 2.5808e-21, 1.0, 5.3406e-21]),
                      rtol=1e-3, atol=0)
assert torch.allclose(torch.diagonal(inputs_512 @ inputs_512.T),
                      torch.tensor([172.0800, 169.7252, 177.2513, 168.5083]), atol=1e-3)

# %% [markdown]
# Now add `torch.rand(512, 64)` projections. Each query and key component is about
# $512 \times 0.5 \times 0.5 = 128$, so a score is about $64 \times 128^2 \approx 10^6$. Dividing by
# $\sqrt{64} = 8$ cannot rescue that: neighbouring scores differ by thousands and the softmax is
# **exactly** one-hot in float32. `nn.Linear` draws its weights from $U(-1/\sqrt{d_{in}}, 1/\sqrt{d_{in}})$,
# centred on zero and scaled to the input width, and the same computation gives well-spread weights.

# %%
torch.manual_seed(123)
inputs_512 = torch.rand(4, 512)
Wq_rand, Wk_rand = torch.rand(512, 64), torch.rand(512, 64)
scores_rand = (inputs_512 @ Wq_rand) @ (inputs_512 @ Wk_rand).T
weights_rand = torch.softmax(scores_rand / 8, dim=-1)
print(f"torch.rand projections: scores between {scores_rand.min():.3e} and {scores_rand.max():.3e}")
print(weights_rand)

lin_q, lin_k = nn.Linear(512, 64, bias=False), nn.Linear(512, 64, bias=False)
with torch.no_grad():
    weights_lin = torch.softmax(lin_q(inputs_512) @ lin_k(inputs_512).T / 8, dim=-1)
print("nn.Linear projections:")
print(weights_lin)
assert 5e5 < float(scores_rand.min()) and float(scores_rand.max()) < 2e6
assert torch.equal(weights_rand.max(dim=-1).values, torch.ones(4))          # exactly one-hot
assert float(weights_lin.max()) < 0.9 and float(weights_lin.min()) > 0.01    # every key gets some weight

# %% [markdown]
# ### Spot the bug 1: a scale that comes from outside
#
# A widely copied version divides the scores by `d_out**0.5`, where `d_out` is a *global variable*
# defined a few cells earlier for the toy example. It gives the right numbers as long as every key
# happens to have that width. The property to test: attention built on these scores must equal
# PyTorch's `F.scaled_dot_product_attention` **for any key width**. Run it with widths 2 and 5:

# %%
d_out = 2   # a notebook-level variable left over from the toy example


def scaled_scores_global(q, k):
    return q @ k.transpose(-2, -1) / d_out**0.5   # <- which d_out is this?


def matches_pytorch(scores_fn, width, seed=0):
    """Self-check: softmax(scores_fn(q, k)) @ v equals F.scaled_dot_product_attention for keys of this width."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(6, width, generator=g) for _ in range(3))
    ours = torch.softmax(scores_fn(q, k), dim=-1) @ v
    return bool(torch.allclose(ours, F.scaled_dot_product_attention(q, k, v), atol=1e-5))


for width in (2, 5):
    print(f"global-scale scores, key width {width}: matches PyTorch? {matches_pytorch(scaled_scores_global, width)}")

# %% [markdown]
# It passes for width 2 and fails for width 5. (The grader builds your modules with other widths in a
# fresh namespace, where the global does not even exist.)
#
# **Your fix.** Rewrite `scaled_scores(q, k)` so that it returns the raw scores over the last two axes,
# divided by the square root of the width of *these* keys, for `q (..., T_q, d_k)` and
# `k (..., T_k, d_k)`. Then run the self-check.

# %%
def scaled_scores(q, k):
    # TODO: divide by the square root of the key width of this call, not by a global
    return q @ k.transpose(-2, -1) / d_out**0.5


def self_check_scaled_scores():
    ok = all(matches_pytorch(scaled_scores, w, seed) for w in (1, 2, 5, 64) for seed in (0, 1))
    print("✓ scaled_scores is fixed" if ok else "✗ not yet: the scale must come from the keys themselves")
    return ok


fixed_1 = self_check_scaled_scores()

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed). Running it replaces your version of scaled_scores.
def scaled_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])


assert self_check_scaled_scores()

# %% [markdown]
# The library's `SelfAttention` passes the same property for modules of width 2 and 5:

# %%
x_demo = torch.randn(6, 3)
for width in (2, 5):
    torch.manual_seed(0)
    sa_w = SelfAttention(3, width)
    with torch.no_grad():
        ok = torch.allclose(sa_w(x_demo), F.scaled_dot_product_attention(
            sa_w.W_query(x_demo), sa_w.W_key(x_demo), sa_w.W_value(x_demo)), atol=1e-5)
    print(f"llmcourse SelfAttention, d_out = {width}: matches PyTorch? {ok}")
    assert ok

# %% [markdown]
# ## 8. Causal masking
#
# A language model predicts token $t+1$ from tokens $0 \dots t$. During training it sees the whole
# sequence at once, so attention must be stopped from looking **ahead**: query $i$ may attend to keys
# $j \le i$ only. This is the **causal mask**, a lower-triangular boolean matrix, `True` = allowed.

# %%
mask = causal_mask(6)   # the course's single source of causal masks
print(mask)
assert torch.equal(mask, torch.ones(6, 6, dtype=torch.bool).tril())

# %% [markdown]
# There are four ways one sees this done. Take the scaled scores $S$ and:
#
# 1. **$-\infty$ before softmax**: `S.masked_fill(~mask, -inf)`, then softmax. Blocked entries get
#    $e^{-\infty} = 0$. This is the standard way.
# 2. **fill 0 before softmax**: `S.masked_fill(~mask, 0)`. Wrong: $e^0 = 1$, so the future keys still
#    get weight, and their **values** flow into the context.
# 3. **softmax, then zero the future**: each row keeps its old denominator, which includes the future
#    scores, so rows sum to less than 1.
# 4. **softmax, zero the future, renormalise** each row to sum 1. This equals method 1:
#
# $$\frac{e^{s_{ij}}/Z_i}{\sum_{j'\le i} e^{s_{ij'}}/Z_i} = \frac{e^{s_{ij}}}{\sum_{j'\le i} e^{s_{ij'}}},\qquad Z_i = \sum_{\text{all } j'} e^{s_{ij'}}:$$
#
# the full denominator $Z_i$, the only place the future entered, cancels. (So "masking after the
# softmax leaks the future" is true only *without* the renormalisation.)

# %%
scaled = raw_scores / math.sqrt(d_k)
w_neg_inf = torch.softmax(scaled.masked_fill(~mask, -math.inf), dim=-1)
w_zero_fill = torch.softmax(scaled.masked_fill(~mask, 0.0), dim=-1)
w_soft_zero = torch.softmax(scaled, dim=-1).masked_fill(~mask, 0.0)
w_renorm = w_soft_zero / w_soft_zero.sum(dim=-1, keepdim=True)
variants = {"-inf before softmax": w_neg_inf, "fill 0 before softmax": w_zero_fill,
            "softmax -> zero": w_soft_zero, "softmax -> zero -> renormalise": w_renorm}
for name, w in variants.items():
    print(f"{name:31s} row 0 = {[round(v, 4) for v in w[0].tolist()]}  row sums = {[round(v, 4) for v in w.sum(-1).tolist()]}")

# reference values (computed independently) for the -inf path and the other three
assert torch.allclose(w_neg_inf[1, :2], torch.tensor([0.3986, 0.6014]), atol=1e-4)
assert torch.allclose(w_neg_inf[2], torch.tensor([0.2526, 0.3791, 0.3683, 0, 0, 0]), atol=1e-4)
assert torch.allclose(w_neg_inf[3], torch.tensor([0.2265, 0.2839, 0.2794, 0.2103, 0, 0]), atol=1e-4)
assert torch.allclose(w_neg_inf[4], torch.tensor([0.1952, 0.2363, 0.2331, 0.1820, 0.1534, 0]), atol=1e-4)
assert torch.allclose(w_neg_inf[5], attn_weights[5])          # the last row sees everything anyway
assert torch.allclose(w_soft_zero.sum(-1), torch.tensor([0.1551, 0.3764, 0.5952, 0.7024, 0.8248, 1.0]), atol=1e-4)
assert torch.allclose(w_zero_fill[0], torch.tensor([0.2775, 0.1445, 0.1445, 0.1445, 0.1445, 0.1445]), atol=1e-4)
max_diff = float((w_renorm - w_neg_inf).abs().max())
print(f"renormalised vs -inf: max |difference| = {max_diff:.1e} (rounding only)")
assert max_diff < 1e-6

causal_context = w_neg_inf @ values
ref_causal_context = torch.tensor([[0.1855, 0.8812], [0.3116, 0.9549], [0.3395, 0.9652],
                              [0.3129, 0.8747], [0.2865, 0.7897], [0.2990, 0.8040]])
assert torch.allclose(causal_context, ref_causal_context, atol=1e-4)
assert torch.allclose(causal_context[0], values[0])   # token 0 can only see itself: its own value vector

# %% [markdown]
# **The leakage probe.** Row sums do not tell the whole story: method 2 has perfect row sums and still
# cheats. The reliable test is behavioural. Change the **last** token and recompute: with a correct
# causal mask, only the last row of the context may change, because no earlier query is allowed to see
# that token. Every other row that changes has read the future.

# %%
def context_with(method, x):
    q, k, v = x @ W_query, x @ W_key, x @ W_value
    s = (q @ k.T) / math.sqrt(k.shape[-1])
    if method == "-inf before softmax":
        w = torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1)
    elif method == "fill 0 before softmax":
        w = torch.softmax(s.masked_fill(~mask, 0.0), dim=-1)
    else:
        w = torch.softmax(s, dim=-1).masked_fill(~mask, 0.0)
        if method.endswith("renormalise"):
            w = w / w.sum(dim=-1, keepdim=True)
    return w @ v


perturbed = inputs.clone()
perturbed[-1] += torch.tensor([1.0, -1.0, 1.0])      # change "step" into something else
leaks = {}
for method in variants:
    change = (context_with(method, perturbed) - context_with(method, inputs)).abs().amax(dim=-1)
    leaks[method] = [i for i in range(5) if change[i] > 1e-5]   # rows 0..4 must not change
    print(f"{method:31s} rows that changed: {[i for i in range(6) if change[i] > 1e-5]}")
assert leaks == {"-inf before softmax": [], "fill 0 before softmax": [0, 1, 2, 3, 4],
                 "softmax -> zero": [0, 1, 2, 3, 4], "softmax -> zero -> renormalise": []}
# the library's widget helper runs the same probe
for key, method in zip(viz.MASK_METHODS, variants):
    changed, _ = viz.leakage_probe(inputs, W_query, W_key, W_value, key)
    assert [i for i in range(5) if changed[i]] == leaks[method]

# %% [markdown]
# The **attention lab** puts all of this in one place: toggle the scaling and the mask, pick the masking
# method, and press *leakage probe* to box the rows whose context changed when the last token was
# perturbed (red = a leak from the future). The side column shows each row's sum. The static version
# shows the four methods side by side with the probe on.

# %% tags=["nbval-ignore-output"]
viz.show_attention_lab()

# %% [markdown]
# Two more broken masks, and how they announce themselves. If the mask is inverted (`True` read as
# "blocked"), query $i$ sees only the *future*, and the last query sees nothing at all: `nan`. If the
# mask forgets the diagonal (built with `triu(..., 0)` instead of `triu(..., 1)` as the block pattern),
# the first query has no allowed key: `nan` again. A token must always be allowed to attend to itself.

# %%
w_inverted = torch.softmax(scaled.masked_fill(mask, -math.inf), dim=-1)
no_diag_block = torch.ones(6, 6, dtype=torch.bool).triu(0)       # blocks the diagonal too
w_no_diag = torch.softmax(scaled.masked_fill(no_diag_block, -math.inf), dim=-1)
print("inverted mask, last row:", w_inverted[-1], "| weight above the diagonal:", float(w_inverted.triu(1).sum()))
print("no diagonal, first row: ", w_no_diag[0])
assert torch.isnan(w_inverted[-1]).all() and torch.isnan(w_no_diag[0]).all()

# %% [markdown]
# ### Spot the bug 2: two mask conventions in one program
#
# Some write-ups first build a mask with `torch.triu(torch.ones(T, T), diagonal=1)`, where **1 means
# blocked**, and later pass it to attention code that blocks where `mask == 0` (that is, code written for
# the "1 = allowed" convention). Each half is fine alone; together they invert causality. The future
# perturbation test from above catches it:

# %%
def attention_blocking_zeros(q, k, v, mask01):
    """Attention code written for masks in which 1 = may attend (it blocks where mask == 0)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
    w = torch.softmax(s.masked_fill(mask01 == 0, -math.inf), dim=-1)
    return w @ v, w


def future_leaks(mask01):
    """Self-check: do rows 0..T-2 change when the last token changes? Returns the leaking rows."""
    out = attention_blocking_zeros(inputs @ W_query, inputs @ W_key, inputs @ W_value, mask01)[0]
    out2 = attention_blocking_zeros(perturbed @ W_query, perturbed @ W_key, perturbed @ W_value, mask01)[0]
    diff = (out2 - out).abs().amax(dim=-1).nan_to_num(nan=math.inf)
    return [i for i in range(len(out) - 1) if diff[i] > 1e-5]


block_mask = torch.triu(torch.ones(6, 6), diagonal=1)     # 1 = blocked
_, w_bad = attention_blocking_zeros(queries, keys, values, block_mask)
print("weights with the mismatched mask:\n", w_bad)
print("rows that see the future:", future_leaks(block_mask))

# %% [markdown]
# Row 0 now attends only to tokens 1–5, and the last row is `nan`. The cure is to convert the mask to the
# convention the code expects (better still: use one convention everywhere, the course's `causal_mask`,
# `True` = may attend).
#
# **Your fix.** Write `to_allowed(mask01)`: it takes a 0/1 mask in which 1 = blocked and returns the
# boolean mask the attention code above expects (`True` = may attend), same shape. Then run the
# self-check: no row may see the future.

# %%
def to_allowed(mask01):
    # TODO: convert "1 = blocked" into a bool mask with True = may attend
    return mask01


def self_check_to_allowed():
    m = to_allowed(block_mask)
    ok = m.dtype == torch.bool and future_leaks(m) == [] and torch.equal(m, causal_mask(6))
    print("✓ no row sees the future" if ok else
          f"✗ not yet: dtype {m.dtype}, rows that see the future: {future_leaks(m)}")
    return ok


fixed_2 = self_check_to_allowed()

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed). Running it replaces your version of to_allowed.
def to_allowed(mask01):
    return mask01 == 0


assert self_check_to_allowed() and future_leaks(causal_mask(6)) == []

# %% [markdown]
# ## 9. Dropout on the attention weights
#
# Dropout is a regulariser: during training it sets each entry to zero with probability $p$ and
# multiplies the survivors by $1/(1-p)$ ("inverted" dropout), so that every entry keeps its expected
# value. In attention it acts on the **weights**, after the softmax and before they multiply $V$: each
# query randomly ignores some keys on each step. In evaluation mode (`model.eval()`) dropout does
# nothing.
#
# Two claims from popular write-ups, checked:
#
# * "after dropout each row is still a probability distribution": **no**, the row sums scatter around 1;
# * "dropout is typically 0.5": p = 0.5 is fine for a demonstration, but GPT-style models use about
#   0.1 on the attention weights (GPT-2's `attn_pdrop = 0.1`).

# %% tags=["nbval-ignore-output"]
dropout = nn.Dropout(p=0.5)
torch.manual_seed(0)
dropout.train()
dropped = dropout(w_neg_inf)
print(dropped)
print("row sums after dropout:", dropped.sum(-1))

# %%
survived = dropped != 0
print("survivors are exactly 2x their old value:", torch.equal(dropped[survived], 2 * w_neg_inf[survived]))
print("every row still sums to 1:", bool(torch.allclose(dropped.sum(-1), torch.ones(6))))
assert torch.equal(dropped[survived], 2 * w_neg_inf[survived])
assert not torch.allclose(dropped.sum(-1), torch.ones(6))

# properties, not bits: the zero fraction is close to p, and the mean is unchanged
big_ones = torch.ones(1000, 1000)
frac_zero = float((dropout(big_ones) == 0).float().mean())
stderr = math.sqrt(0.5 * 0.5 / big_ones.numel())
print(f"fraction of zeros over 10^6 entries: {frac_zero:.4f} (p = 0.5, standard error {stderr:.4f})")
assert abs(frac_zero - 0.5) < 4 * stderr
n_passes = 2000
mean_of_dropped = torch.stack([dropout(w_neg_inf) for _ in range(n_passes)]).mean(0)
# inverted dropout is unbiased: each entry's mean is within 4 standard errors (w·sqrt(p/(1-p)/n)) of w
tolerance = 4 * w_neg_inf * math.sqrt(0.5 / 0.5 / n_passes) + 1e-6
assert ((mean_of_dropped - w_neg_inf).abs() <= tolerance).all()

dropout.eval()
assert torch.equal(dropout(w_neg_inf), w_neg_inf)              # evaluation: the identity
from transformers import GPT2Config  # noqa: E402  (configuration only; nothing is downloaded)

print("GPT-2's attention dropout:", GPT2Config().attn_pdrop)
assert GPT2Config().attn_pdrop == 0.1

# %% [markdown]
# Slide $p$ and reseed to see different random masks. The row sums in the side columns change with
# every mask; only their *expected value* is 1.

# %% tags=["nbval-ignore-output"]
viz.show_dropout_on_weights()

# %% [markdown]
# ## 10. `CausalSelfAttention`: batches, a mask buffer, and slicing
#
# The module used by GPT-style models combines everything: projections, scaling, the causal mask,
# dropout on the weights, and batches of shape `(B, T, d_in)`. Three details are new.
#
# **Batches.** With a batch dimension in front, the key transpose must swap the *last two* dimensions,
# `k.transpose(-2, -1)` (`k.T` would reverse all three dimensions), and the softmax must still run over
# the last dimension, the keys.
#
# **`register_buffer`.** The mask is not a parameter (nothing should train it), but it must move with
# the module when you call `.to("cuda")`. A **buffer** is exactly that: a tensor owned by the module,
# listed in `named_buffers()`, moved by `.to()`, and ignored by the optimiser. With `persistent=False` it
# is also left out of the `state_dict`, because it can always be rebuilt. A plain tensor attribute would
# stay behind on the CPU.
#
# **Shorter sequences.** The buffer is built once for the longest sequence, `context_length`, yet most
# batches are shorter. How a batch of `T < context_length` tokens uses it is a decision of exercise 5; the
# cell below shows the property it must keep (the first 4 outputs of a 6-token batch equal the outputs of
# its 4-token prefix). A batch longer than `context_length` is an error, raised with a clear message.
#
# Here is the library's module (you write your own in the exercises), with the weights of section 4
# loaded.

# %%
torch.manual_seed(0)
ca = CausalSelfAttention(d_in=3, d_out=2, context_length=6, dropout=0.0)
with torch.no_grad():
    ca.W_query.weight.copy_(W_query.T)
    ca.W_key.weight.copy_(W_key.T)
    ca.W_value.weight.copy_(W_value.T)

batch = torch.stack([inputs, inputs.flip(0)])        # (B=2, T=6, d_in=3): the sentence, and reversed
with torch.no_grad():
    out = ca(batch)
print("output shape:", tuple(out.shape), "| last_weights shape:", tuple(ca.last_weights.shape))
assert out.shape == (2, 6, 2) and ca.last_weights.shape == (2, 6, 6)
assert torch.allclose(out[0], ref_causal_context, atol=1e-4)              # section 8's causal context again, now batched
assert torch.allclose(ca.last_weights[0], w_neg_inf, atol=1e-6)

print("parameters:", [n for n, _ in ca.named_parameters()])
print("buffers:   ", [n for n, _ in ca.named_buffers()])
print("state_dict:", list(ca.state_dict()))
assert "mask" in dict(ca.named_buffers()) and "mask" not in ca.state_dict()
assert all(p is not ca.mask for p in ca.parameters())


class WithPlainAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.mask = causal_mask(4)        # not registered: the module does not know it owns this


assert "mask" not in dict(WithPlainAttribute().named_buffers())   # so .to(device) would not move it

# shorter sequences work; longer ones are refused
with torch.no_grad():
    out4 = ca(batch[:, :4])
assert torch.allclose(out4, out[:, :4], atol=1e-6)   # causal: the first 4 outputs do not depend on tokens 4, 5
try:
    ca(torch.randn(1, 7, 3))
except ValueError as err:
    print("T = 7 > context_length = 6 ->", err)

# what goes wrong without slicing: a (6, 6) mask cannot broadcast against (4, 4) scores
try:
    torch.randn(2, 4, 4).masked_fill(~ca.mask, -math.inf)
except RuntimeError as err:
    print("unsliced mask ->", str(err).splitlines()[0])

# %% [markdown]
# The **future-perturbation test** on every row: change the tokens from position $t$ on, and every output
# row before $t$ must stay exactly the same. In training mode with dropout the outputs are random, but
# they are right *on average*: the mean over many forward passes approaches the evaluation output.

# %%
ca.eval()
with torch.no_grad():
    base_out = ca(batch)
for t in range(1, 6):
    changed = batch.clone()
    changed[:, t:] = torch.randn(2, 6 - t, 3)
    assert torch.allclose(ca(changed)[:, :t], base_out[:, :t], atol=1e-6), f"rows before {t} changed"
print("future-perturbation test passed for t = 1..5")

ca_drop = CausalSelfAttention(3, 2, context_length=6, dropout=0.5)
ca_drop.load_state_dict(ca.state_dict())
ca_drop.eval()
with torch.no_grad():
    eval_out = ca_drop(batch)
ca_drop.train()
torch.manual_seed(1)
with torch.no_grad():
    train_outs = torch.stack([ca_drop(batch) for _ in range(400)])
mean_train, stderr_train = train_outs.mean(0), train_outs.std(0) / math.sqrt(400)
worst = float(((mean_train - eval_out).abs() / (stderr_train + 1e-12)).max())
print(f"largest |mean of 400 train passes - eval output| = {worst:.2f} standard errors")
assert worst < 4, "inverted dropout should be unbiased"

# %% [markdown]
# ### Spot the bug 3: a last row far too large
#
# One widely read notebook batches its causal attention, and the last row of its output looks far too
# large. Here is its weight computation, run on the projections of the module above. The cell prints the
# sums of the weights along each axis and the last output row next to the library module's: find the line
# that breaks the property.

# %%
def causal_weights_dim1(scores, mask):
    """(B, T, T) scaled scores and a (T, T) bool mask -> attention weights, as the buggy notebook does it."""
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=1)


with torch.no_grad():
    q_b, k_b, v_b = ca.W_query(batch), ca.W_key(batch), ca.W_value(batch)
scores_b = q_b @ k_b.transpose(-2, -1) / math.sqrt(k_b.shape[-1])
w_buggy = causal_weights_dim1(scores_b, causal_mask(6))
print("row sums    (should be 1):", w_buggy[0].sum(-1))
print("column sums (no reason to be 1):", w_buggy[0].sum(-2))
print("last row of the output, buggy vs correct:", (w_buggy @ v_b)[0, -1], base_out[0, -1])


def rows_are_distributions(weights):
    """Self-check: every row of the attention weights sums to 1 and nothing sits above the diagonal."""
    return bool(torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5)
                and (weights.triu(1) == 0).all())


print("rows are distributions?", rows_are_distributions(w_buggy))

# %% [markdown]
# **Your fix.** Rewrite `causal_weights(scores, mask)` (same inputs as above, any number of leading batch
# dimensions) so that every query's weights form a distribution over the keys it may see. The
# self-check also compares the resulting output with the library module's.

# %%
def causal_weights(scores, mask):
    # TODO: every query's weights must form a distribution over the keys it may see
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=1)


def self_check_causal_weights():
    w = causal_weights(scores_b, causal_mask(6))
    ok = rows_are_distributions(w) and torch.allclose(w @ v_b, base_out, atol=1e-6)
    print("✓ rows sum to 1 and the output matches llmcourse's CausalSelfAttention" if ok else
          "✗ not yet: the rows of the weights must sum to 1")
    return ok


fixed_3 = self_check_causal_weights()

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed): dim=1 of (B, T, T) scores is the query axis, so the columns were normalised:
# the last key, allowed for only one query, got weight 1 there, and token 5's whole value vector was added
# to the last output. Normalise over the keys, dim=-1. Running it replaces your version of causal_weights.
def causal_weights(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)


assert self_check_causal_weights()

# %% [markdown]
# ## Summary
#
# * Attention replaces a fixed-size summary with a weighted average over all positions; the weights come
#   from a softmax over query–key dot products, and the output mixes **value** vectors.
# * Compute softmax stably through its shift invariance; fill blocked scores with $-\infty$.
# * Divide the scores by $\sqrt{d_k}$, the key width of *this* attention: dot products of width-$d_k$ vectors
#   have variance $d_k$, and large scores saturate the softmax and kill its gradients.
# * Initialisation matters: `torch.rand` weights saturate attention at realistic widths; `nn.Linear`'s
#   init does not.
# * Causal masking: $-\infty$ before the softmax, or equivalently softmax → zero → renormalise. Filling with
#   0, or zeroing without renormalising, leaks the future. The leakage probe (perturb a later token,
#   watch earlier outputs) catches every variant.
# * Dropout acts on the attention weights in training mode only; rows then no longer sum to 1, and
#   survivors are scaled by $1/(1-p)$.
# * `CausalSelfAttention` keeps its mask in a non-persistent buffer and slices it to the batch length.
#
# Now do the exercises in `exercises/03_self_attention/03_self_attention.ipynb`, then open the lab,
# `lessons/03_self_attention_lab.ipynb`: it trains the smallest language model with attention in it, shows
# what its head learned on real text, and ends with an open-ended extension. From unit 04 on we import
# `scaled_dot_product_attention` and `CausalSelfAttention` from `llmcourse.nn` and build **multi-head**
# attention on top of them.
