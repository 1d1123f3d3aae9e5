# %% [markdown]
# # Unit 00 — PyTorch essentials for transformers
#
# Every model in this course, from the first self-attention layer to the DeepSeek capstone, is built
# from a small set of PyTorch tools. This lesson collects them in one place, each with the exact
# behaviour that matters later and the traps that catch people:
#
# 1. tensors, dtypes, devices and autograd;
# 2. `nn.Module`: parameters, `state_dict`, loading weights;
# 3. `nn.Embedding` as a table lookup;
# 4. buffers (`register_buffer`), persistent or not;
# 5. shape surgery: `view`, `reshape`, `transpose`, `unsqueeze`, `contiguous`, and the full shape trace
#    of multi-head attention;
# 6. `masked_fill`, `tril`/`triu` and the course's **one** mask convention;
# 7. `nn.ModuleList`, and `train()` vs `eval()` with dropout;
# 8. the three tools of a greedy decoding loop: `torch.full`, `argmax`, `cat`;
# 9. cross-entropy on flattened logits, `ignore_index`, label smoothing;
# 10. `einsum` for attention products;
# 11. `no_grad` for inference, checkpoint dictionaries;
# 12. optimizers, `LambdaLR` and the Noam schedule (and its base-lr trap), `TensorDataset`/`DataLoader`.
#
# Nothing here trains for long: the whole lesson runs in well under a minute on a laptop CPU. Claims are
# checked in the open: when the text says two things are equal, a cell computes both and asserts it.
# Cells marked **Spot the bug** run a short wrong snippet and show which property breaks; you then write
# the fix in the cell marked `TODO`, and the self-check under it prints `✓` once the property holds (or
# `✗ not yet` while it does not). A collapsed cell after it holds a reference fix: open it after trying.
# Parts marked **Reference — come back in unit NN** are used only later (label smoothing and the Noam
# schedule in unit 06, PyTorch's transformer layers in unit 05, the mask offset of a KV cache in unit 12):
# read them once now and return when that unit needs them. The exercise notebook of this unit asks you to write six of these tools yourself; after
# that, the course imports the finished versions from `llmcourse`.

# %%
import math
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.viz.essentials import (
    show_dropout_clicker,
    show_label_smoothing,
    show_noam_curve,
    show_shape_tracer,
    trace_head_shapes,
)

cfg = llmcourse.setup_notebook("00")

# %% [markdown]
# ## 1. Tensors, dtypes, devices, and autograd
#
# A tensor is an n-dimensional array with three properties you should always know: its **shape**, its
# **dtype** (the number format of each entry) and its **device** (CPU memory or a GPU's). The course
# uses `float32` for activations and weights, and `int64` (`torch.long`) for token ids, because
# embedding lookups and `cross_entropy` targets require integer indices.

# %%
ids = torch.tensor([[5, 17, 3], [8, 8, 1]])          # token ids: a (B, T) = (2, 3) batch
x = torch.randn(2, 3, 4)                              # activations: (B, T, D)
print("ids:", ids.shape, ids.dtype, ids.device)
print("x:  ", x.shape, x.dtype, x.device)
print("profile device:", cfg["device"])
assert ids.dtype == torch.int64 and x.dtype == torch.float32

# %% [markdown]
# Lower-precision formats save memory but have a much smaller range. `torch.finfo` tells you the
# limits; note how small the largest `float16` number is compared with `float32`'s. (We come back to
# this when masks fill blocked positions with a large negative number.)

# %%
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    info = torch.finfo(dtype)
    print(f"{str(dtype):15s} max {info.max:.4g}   smallest normal {info.tiny:.4g}   eps {info.eps:.3g}")

# %% [markdown]
# **Autograd.** A tensor created with `requires_grad=True` records every operation applied to it.
# Calling `.backward()` on a scalar result walks that record backwards and stores
# `∂result/∂tensor` in each leaf tensor's `.grad`.
#
# For `loss = Σ_i v_i · w_i` the partial derivatives are `∂loss/∂v = w` and `∂loss/∂w = v`: each vector's
# gradient is the other vector; the seeded example below checks it.

# %%
torch.manual_seed(42)
w = torch.randn(3)
print("w =", w)
assert torch.allclose(w, torch.tensor([0.3367, 0.1288, 0.2345]), atol=1e-4)

w.requires_grad_(True)
v = torch.tensor([0.2, -0.4, 0.6], requires_grad=True)
loss = (v * w).sum()
loss.backward()
print("v.grad =", v.grad, "  w.grad =", w.grad)
assert torch.equal(v.grad, w.detach()) and torch.equal(w.grad, v.detach())

# %% [markdown]
# Gradients **accumulate**: a second `backward()` adds to `.grad` instead of replacing it. That is why
# every training loop calls `optimizer.zero_grad()` (or sets `.grad` to `None`) before each backward
# pass.

# %%
loss = (v * w).sum()
loss.backward()
print("after a second backward, v.grad =", v.grad)
assert torch.allclose(v.grad, 2 * w.detach())
v.grad = None
w.grad = None

# %% [markdown]
# ## 2. `nn.Module` anatomy
#
# A module bundles **parameters** (tensors the optimizer updates), **buffers** (tensors that are part of
# the state but not trained) and **submodules**. Assigning an `nn.Parameter` or an `nn.Module` to an
# attribute inside `__init__` registers it; that is all it takes. The smallest useful module: one
# trainable scale factor.

# %%
class Scaler(nn.Module):
    """y = scale * x with one trainable number."""

    def __init__(self, init: float = 1.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([init]))

    def forward(self, x):
        return self.scale * x


scaler = Scaler(2.0)
print(list(scaler.named_parameters()))
print(scaler.state_dict())
print(scaler(torch.tensor([1.0, -3.0])))

# %% [markdown]
# `state_dict()` maps names to tensors; it is what you save and load. `load_state_dict` copies values
# into an existing module with the same names and shapes (and complains loudly about a missing or
# unexpected key: a useful safety net when loading real checkpoints later in the course).

# %%
fresh = Scaler()
print("before:", fresh.scale.item())
fresh.load_state_dict(scaler.state_dict())
print("after: ", fresh.scale.item())
assert fresh.scale.item() == 2.0
try:
    fresh.load_state_dict({"weight": torch.ones(1)})
except RuntimeError as err:
    print("load_state_dict with a wrong key:", " ".join(line.strip() for line in str(err).splitlines()))

# %% [markdown]
# Counting parameters is the first sanity check of any model. A linear layer `d_in → d_out` has
# `d_in·d_out` weights plus `d_out` biases; a `BatchNorm1d(n)` has `2n` (a scale and a shift per
# feature; its running statistics are buffers, not parameters). For a classifier
# 20 → 128 → 64 → 32 → 5 with BatchNorm after each hidden layer, the count is the sum below (the cell
# prints it next to PyTorch's own count):
#
# (20·128 + 128) + 2·128 + (128·64 + 64) + 2·64 + (64·32 + 32) + 2·32 + (32·5 + 5).

# %%
classifier = nn.Sequential(
    nn.Linear(20, 128), nn.BatchNorm1d(128), nn.ReLU(),
    nn.Linear(128, 64), nn.BatchNorm1d(64), nn.ReLU(),
    nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(),
    nn.Linear(32, 5),
)
n_classifier = sum(p.numel() for p in classifier.parameters())
by_formula = (20 * 128 + 128) + 2 * 128 + (128 * 64 + 64) + 2 * 64 + (64 * 32 + 32) + 2 * 32 + (32 * 5 + 5)
print(f"classifier parameters: {n_classifier:,} (formula: {by_formula:,})")
assert n_classifier == by_formula == 13_637

# %% [markdown]
# ### Spot the bug: a LayerNorm that will not build
#
# A common snippet writes `nn.LayerNorm(d_model=512)`. Run it: PyTorch's argument is called
# `normalized_shape` (the trailing shape to normalise over), so the keyword is rejected.

# %%
try:
    nn.LayerNorm(d_model=512)
    print("built (unexpected)")
except TypeError as err:
    print("TypeError:", err)

# %% [markdown]
# **Your turn.** Fix `make_norm` so that it builds a layer normalising the last dimension of size
# `d_model`. The self-check feeds rows with mean 1 and standard deviation 3: after the layer every row
# must have mean ≈ 0 and (biased) variance ≈ 1.

# %%
def make_norm(d_model):
    # TODO: build the layer (the keyword above does not exist)
    return nn.LayerNorm(d_model=d_model)


def self_check_norm(make):
    try:
        norm = make(512)
        with torch.no_grad():
            out = norm(torch.randn(4, 512) * 3 + 1)
    except Exception as err:  # noqa: BLE001 - the learner's cell may raise anything
        print(f"✗ not yet: {type(err).__name__}: {err}")
        return False
    ok = torch.allclose(out.mean(-1), torch.zeros(4), atol=1e-5) and torch.allclose(
        out.var(-1, unbiased=False), torch.ones(4), atol=1e-3)
    print("✓ every row now has mean 0 and variance 1" if ok else
          f"✗ not yet: row means {out.mean(-1).tolist()}, variances {out.var(-1, unbiased=False).tolist()}")
    return ok


self_check_norm(make_norm)

# %% jupyter={"source_hidden": true}
# Reference fix: PyTorch's argument is `normalized_shape` (the trailing shape), given positionally here.
def make_norm_reference(d_model):
    return nn.LayerNorm(d_model)


assert self_check_norm(make_norm_reference)

# %% [markdown]
# ## 3. `nn.Embedding` is a table lookup
#
# `nn.Embedding(num_embeddings, embedding_dim)` holds a `(num_embeddings, embedding_dim)` weight matrix;
# calling it on integer ids returns the rows with those indices. A `(B, T)` batch of ids becomes a
# `(B, T, D)` batch of vectors. The same result comes from multiplying one-hot vectors by the table,
# which is why an embedding is "a linear layer on one-hot inputs", only much cheaper. Unit 02 builds
# on this.

# %%
torch.manual_seed(0)
emb = nn.Embedding(10, 4)
batch_ids = torch.tensor([[1, 5, 5], [0, 9, 2]])
vectors = emb(batch_ids)
print("ids", tuple(batch_ids.shape), "->", tuple(vectors.shape))
assert torch.equal(vectors, emb.weight[batch_ids])
one_hot = F.one_hot(batch_ids, num_classes=10).float()
assert torch.allclose(one_hot @ emb.weight, vectors)
assert torch.equal(vectors[0, 1], vectors[0, 2]), "the same id always gives the same row"

# %% [markdown]
# ## 4. Buffers: state that is not trained
#
# Some tensors belong to a module without being trained: a causal mask, running statistics, a table
# of positional encodings. `register_buffer(name, tensor)` registers them so they follow the module
# through `.to(...)` and `.cuda()`. With `persistent=True` (the default) a buffer is also saved in the
# `state_dict`; with `persistent=False` it is rebuilt by `__init__` and never saved (the right choice
# for anything you can recompute, such as a mask). A **plain attribute** holding a tensor is neither
# moved nor saved.

# %%
class WithState(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2))
        self.register_buffer("running_mean", torch.zeros(2))                     # saved, moved
        self.register_buffer("mask", torch.ones(3, 3).tril(), persistent=False)  # moved, not saved
        self.plain = torch.ones(2)                                               # neither


m = WithState()
print("parameters:", [n for n, _ in m.named_parameters()])
print("buffers:   ", [n for n, _ in m.named_buffers()])
print("state_dict:", list(m.state_dict()))
m = m.to(torch.float64)   # .to() converts parameters and floating buffers, never plain attributes
print("after .to(float64): weight", m.weight.dtype, "| running_mean", m.running_mean.dtype,
      "| mask", m.mask.dtype, "| plain", m.plain.dtype)
assert list(m.state_dict()) == ["weight", "running_mean"]
assert m.mask.dtype == torch.float64 and m.plain.dtype == torch.float32

# %% [markdown]
# On a GPU the same thing happens with devices: after `model.to("cuda")` the plain attribute would still
# sit in CPU memory and the first forward pass would fail with a device-mismatch error.
#
# ## 5. Shape surgery
#
# A tensor is a block of memory plus a **stride** per dimension: how many elements to skip to move one
# step along that dimension. Many shape operations only change shape and strides, without copying:
#
# - `view(new_shape)` reinterprets the memory; it needs a layout where the requested shape is possible
#   without copying, otherwise it raises;
# - `reshape(new_shape)` is `view` when possible and a copy otherwise;
# - `transpose(a, b)` swaps two dimensions by swapping their strides, so the result is usually **not
#   contiguous** (not laid out row by row);
# - `contiguous()` copies into row-major order if needed;
# - `unsqueeze(i)` inserts a dimension of size 1 (for broadcasting).

# %%
a = torch.arange(6).view(2, 3)
print(a, "stride", a.stride(), "contiguous", a.is_contiguous())
at = a.transpose(0, 1)
print(at, "stride", at.stride(), "contiguous", at.is_contiguous())
assert at.data_ptr() == a.data_ptr(), "transpose shares memory with the original (no copy)"

# %% [markdown]
# Now the classic error. After a transpose, merging two dimensions with `view` is impossible without a
# copy, and `view` never copies:

# %%
try:
    at.view(6)
    raise AssertionError("view after transpose should have failed")
except RuntimeError as err:
    message = str(err)
    print("RuntimeError:", message)
assert "view size is not compatible with input tensor's size and stride" in message
print("reshape works:", at.reshape(6), "| contiguous().view works:", at.contiguous().view(6))
assert torch.equal(at.reshape(6), torch.tensor([0, 3, 1, 4, 2, 5]))

# %% [markdown]
# ### The shape trace of multi-head attention
#
# Multi-head attention (units 04 on) runs `H` attentions side by side on slices of width
# `head_dim = D / H`. The activations `(B, T, D)` are projected, **split** into heads
# (`view` to `(B, T, H, hd)`, then `transpose(1, 2)` to `(B, H, T, hd)`, so that the head axis sits next
# to the batch axis and everything after broadcasts over both), attended, and **merged** back. Here is
# the full trace for `B=2, T=5, D=64, H=8`, computed from real tensors:

# %%
for i, row in enumerate(trace_head_shapes(batch=2, seq=5, d_model=64, n_heads=8), start=1):
    flag = "contiguous" if row["contiguous"] else "NOT contiguous"
    print(f"{i}. {row['step']:15s} {row['code']:34s} {str(row['shape']):16s} {flag}")

# %% [markdown]
# Two steps produce non-contiguous tensors: both transposes. The merge therefore needs `.contiguous()`
# before `.view` (or `.reshape`). The widget below lets you change `B`, `T`, `d_model` and
# `n_heads`; try a `d_model` that `n_heads` does not divide.

# %% tags=["nbval-ignore-output"]
show_shape_tracer()

# %% [markdown]
# The split and merge are two of the tools you write in the exercises (`split_heads`, `merge_heads`);
# the finished versions live in `llmcourse`. A small example checks the shapes, and the round trip must
# give back the input **exactly**.

# %%
x = torch.randn(2, 6, 16)
viewed = x.view(2, 6, 4, 4)
heads = viewed.transpose(1, 2)
merged = heads.contiguous().view(2, 6, 16)
print(tuple(x.shape), "->", tuple(viewed.shape), "->", tuple(heads.shape), "->", tuple(merged.shape))
assert heads.shape == (2, 4, 6, 4) and merged.shape == (2, 6, 16)
assert torch.equal(llmcourse.split_heads(x, 4), heads)
assert torch.equal(llmcourse.merge_heads(heads), x)
try:
    llmcourse.split_heads(torch.randn(2, 6, 15), 4)
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# **Broadcasting a padding mask.** A key-padding mask says, per sequence, which keys are real tokens. It
# starts as `(B, T)` (or `(T,)` for one sequence); attention scores are `(B, H, T_q, T_k)`. Adding the
# missing axes with `unsqueeze` gives `(B, 1, 1, T_k)`, which broadcasts over heads and queries.
# For one sequence of length 6:

# %%
pad = torch.ones(6)
pad4 = pad.unsqueeze(0).unsqueeze(1).unsqueeze(2)
print(tuple(pad.shape), "->", tuple(pad4.shape))
assert pad4.shape == (1, 1, 1, 6)

lengths = torch.tensor([6, 4])                                  # the second sequence has 2 padding tokens
key_mask = llmcourse.nn.padding_mask(lengths)                   # (B, 1, 1, T_k), True = real token
scores = torch.randn(2, 3, 6, 6)                                # (B, H, T_q, T_k)
masked = scores.masked_fill(~key_mask, float("-inf"))
print("key mask", tuple(key_mask.shape), "broadcast against scores", tuple(scores.shape))
assert torch.isinf(masked[1, :, :, 4:]).all() and torch.isfinite(masked[0]).all()

# %% [markdown]
# ## 6. Masks: `masked_fill`, `tril`/`triu`, and the course convention
#
# `tril` keeps the lower triangle (everything on or below a diagonal) and zeroes the rest; `triu` keeps
# the upper triangle. The `diagonal` argument shifts the dividing line: `diagonal=0` is the main
# diagonal, `diagonal=1` one step above it, `-1` one step below.

# %%
ones = torch.ones(4, 4, dtype=torch.int64)
for name, t in [("tril(0)", ones.tril(0)), ("tril(-1)", ones.tril(-1)), ("triu(1)", ones.triu(1))]:
    print(name, t.tolist())

# %% [markdown]
# **The course convention (used in every unit):** a mask is a **boolean** tensor in which
# **`True` means "this query may attend to this key"**, exactly like the boolean `attn_mask` of
# `F.scaled_dot_product_attention`. (`nn.MultiheadAttention` uses the opposite: `True` = blocked. Unit 04
# shows the conversion, which is a single `~`.) Blocked scores are filled with `-inf` before the softmax
# with `scores.masked_fill(~mask, float("-inf"))`.
#
# A **causal** mask lets query `i` see keys `0 … i`. *Reference — come back in unit 12:* when the queries
# are only the last `t_q` of `t_k` positions (generation with a cache), query row `i` sits at absolute position `offset + i` with
# `offset = t_k − t_q`, and key `j` is allowed iff `j ≤ offset + i`. That is
# `torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=offset)`. `llmcourse.causal_mask` is the single
# source of causal masks in the course (you write it in the exercises). A few cases:

# %%
m35 = llmcourse.causal_mask(3, 5)
print(m35.int())
T_, F_ = True, False
assert m35.tolist() == [[T_, T_, T_, F_, F_], [T_, T_, T_, T_, F_], [T_, T_, T_, T_, T_]]
assert llmcourse.causal_mask(1, 5).all()
assert torch.equal(llmcourse.causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())
assert torch.equal(llmcourse.causal_mask(3, 5, offset=0), torch.ones(3, 5, dtype=torch.bool).tril())

# %% [markdown]
# **What to fill with.** A row whose keys are *all* blocked has no valid softmax: with `-inf` every entry
# becomes NaN. With `-1e9` the same row becomes uniform (every score equally hopeless). In `float16`,
# `-1e9` does not fit (the most negative finite `float16` is printed below), and
# `scores.masked_fill(mask, -1e9)` on a `float16` tensor **raises** a `RuntimeError` (only converting the
# number itself, `torch.tensor(-1e9).half()`, rounds it to `-inf`). `torch.finfo(dtype).min` is the safe
# "very negative" number for any dtype. In this course every query
# always sees at least one key (itself), so these rows never occur in graded code; rows with at least one
# allowed key get identical weights from all three fills in `float32`.

# %%
all_blocked = torch.full((3,), float("-inf"))
print("softmax of an all -inf row:", torch.softmax(all_blocked, -1))
print("softmax of an all -1e9 row:", torch.softmax(torch.full((3,), -1e9), -1))
print("-1e9 in float16:", torch.tensor(-1e9).half(), "| finfo(float16).min:", torch.finfo(torch.float16).min)
assert torch.isnan(torch.softmax(all_blocked, -1)).all()
row = torch.tensor([0.3, 1.2, -0.5, 2.0])
keep = torch.tensor([True, True, False, False])
fills = [row.masked_fill(~keep, f).softmax(-1) for f in (float("-inf"), torch.finfo(torch.float32).min, -1e9)]
assert torch.equal(fills[0], fills[1]) and torch.equal(fills[0], fills[2])
half_scores = row.half()
try:
    half_scores.masked_fill(~keep, -1e9)
    raised = None
except RuntimeError as err:
    raised = str(err)
print("float16 masked_fill with -1e9 raises:", raised)
print("float16 with finfo.min:", half_scores.masked_fill(~keep, torch.finfo(torch.float16).min).softmax(-1))
assert raised is not None and torch.isinf(torch.tensor(-1e9).half())

# %% [markdown]
# ### Spot the bug: a mask with the wrong polarity
#
# The snippet below builds the "future" positions with `triu(…, diagonal=1)` (True above the diagonal)
# and passes it where the course expects `True = may attend`. Run it and look at the property that
# matters: **no attention weight above the diagonal** (no peeking at the future).

# %%
def attention_weights(scores, mask):
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


scores = torch.randn(4, 4)
wrong_mask = torch.ones(4, 4, dtype=torch.bool).triu(diagonal=1)      # True = future = *blocked* intent
w_wrong = attention_weights(scores, wrong_mask)
print(w_wrong)
print("weight above the diagonal:", w_wrong.triu(1).sum().item(), "| NaN rows:",
      torch.isnan(w_wrong).any(-1).tolist())

# %% [markdown]
# Query 0 may look only at the future, and the last row is NaN (it may attend to nothing). **Your turn:**
# fix `future_mask_fixed` so that it returns a `(t, t)` mask in the course's polarity (`True` = may
# attend), without calling `llmcourse.causal_mask`.

# %%
def future_mask_fixed(t):
    # TODO: return a boolean (t, t) mask in which True means "may attend"
    return torch.ones(t, t, dtype=torch.bool).triu(diagonal=1)


def self_check_mask(make_mask):
    w = attention_weights(scores, make_mask(4))
    ok = bool(torch.isfinite(w).all() and (w.triu(1) == 0).all() and torch.allclose(w.sum(-1), torch.ones(4)))
    print("✓ no weight above the diagonal, every row sums to 1" if ok else
          f"✗ not yet: weight above the diagonal {w.triu(1).nan_to_num().sum().item():.3f}, "
          f"NaN rows {torch.isnan(w).any(-1).tolist()}")
    return ok


self_check_mask(future_mask_fixed)

# %% jupyter={"source_hidden": true}
# Reference fix: flip the polarity of the "future" mask (or call llmcourse.causal_mask).
def future_mask_reference(t):
    return ~torch.ones(t, t, dtype=torch.bool).triu(diagonal=1)


assert self_check_mask(future_mask_reference)

# %% [markdown]
# ## 7. `nn.ModuleList`, and `train()` vs `eval()`
#
# A model with a variable number of layers keeps them in a container. It must be an `nn.ModuleList`
# (or `nn.Sequential`): a plain Python list is invisible to PyTorch, so its layers have no entries in
# `parameters()` (the optimizer never updates them), no keys in `state_dict()` (they are never saved), and
# `.to()` does not move them.

# %%
class ListStack(nn.Module):
    def __init__(self, d, n, use_module_list: bool):
        super().__init__()
        layers = [nn.Linear(d, d) for _ in range(n)]
        self.layers = nn.ModuleList(layers) if use_module_list else layers


for flag in (False, True):
    model = ListStack(16, 4, use_module_list=flag)
    count = sum(p.numel() for p in model.parameters())
    print(f"use_module_list={flag!s:5s}: {count:5d} parameters, {len(model.state_dict())} state_dict keys")
assert sum(p.numel() for p in ListStack(16, 4, False).parameters()) == 0

# %% [markdown]
# `llmcourse.nn.ResidualStack` (an exercise of this unit) is the pattern in its final form: a
# `ModuleList` of `Linear` layers, each adding a branch to the running stream,
# `x = x + dropout(layer(x))`. It has `n·(d² + d)` parameters; the cell below counts them for `d = 16, n = 4`
# and compares with the formula.

# %%
stack = llmcourse.nn.ResidualStack(16, 4, dropout=0.1)
n_stack = sum(p.numel() for p in stack.parameters())
print(f"ResidualStack(16, 4): {n_stack:,} parameters = 4·(16² + 16) = {4 * (16 * 16 + 16):,}; "
      f"keys {list(stack.state_dict())[:4]} …")
assert n_stack == 4 * (16 * 16 + 16) == 1_088

# %% [markdown]
# **Dropout** zeroes each entry with probability `p` during training and scales the survivors by
# `1/(1−p)`, so the expected value of every entry is unchanged ("inverted dropout"). After
# `model.eval()` it is the identity. `train()` and `eval()` flip the `training` flag of the module and
# of all its submodules. The exact pattern of zeros depends on the random generator (and on the CPU
# build), so the course never compares dropout masks bit for bit; it checks properties instead.

# %%
torch.manual_seed(123)
drop = nn.Dropout(0.5)
pattern = drop(torch.ones(6, 6))                         # display only: the zeros depend on the generator
print(pattern)
assert set(pattern.unique().tolist()) <= {0.0, 2.0}
drop.eval()
assert torch.equal(drop(torch.ones(6, 6)), torch.ones(6, 6)), "eval() makes dropout the identity"
stack.eval()
x16 = torch.randn(3, 16)
assert torch.equal(stack(x16), stack(x16)), "in eval mode two calls agree"

# %% [markdown]
# Click through the dropout widget: switch between `train` and `eval` and press *run again*.

# %% tags=["nbval-ignore-output"]
show_dropout_clicker()

# %% [markdown]
# ### Spot the bug: dropout that never turns off
#
# The functional form `F.dropout(x, p)` has a third argument, `training`, which defaults to `True`. A
# module that calls it without passing `self.training` keeps dropping entries after `model.eval()`.
# Property to test: in eval mode, two calls on the same input must agree.

# %%
class LeakyDropoutBlock(nn.Module):
    def __init__(self, d, p):
        super().__init__()
        self.fc, self.p = nn.Linear(d, d), p

    def forward(self, x):
        return x + F.dropout(self.fc(x), self.p)               # bug: training flag not passed


block = LeakyDropoutBlock(16, 0.5).eval()
print("eval-mode calls agree?", torch.equal(block(x16), block(x16)))

# %% [markdown]
# **Your turn:** fix `forward` below. The self-check wants two things: eval mode is deterministic, and
# train mode still drops (two calls differ).

# %%
class MyDropoutBlock(LeakyDropoutBlock):
    def forward(self, x):
        # TODO: dropout must follow the module's train/eval mode
        return x + F.dropout(self.fc(x), self.p)


def self_check_dropout(cls):
    block = cls(16, 0.5)
    with torch.no_grad():
        eval_ok = torch.equal(block.eval()(x16), block(x16))
        train_ok = not torch.equal(block.train()(x16), block(x16))
    ok = eval_ok and train_ok
    print("✓ deterministic in eval mode, still dropping in train mode" if ok else
          f"✗ not yet: eval mode deterministic {eval_ok}, train mode drops {train_ok}")
    return ok


self_check_dropout(MyDropoutBlock)

# %% jupyter={"source_hidden": true}
# Reference fix: pass the module's flag, F.dropout(..., training=self.training) (or use an nn.Dropout child).
class FixedDropoutBlock(LeakyDropoutBlock):
    def forward(self, x):
        return x + F.dropout(self.fc(x), self.p, training=self.training)


assert self_check_dropout(FixedDropoutBlock)

# %% [markdown]
# ## 8. The greedy loop: `torch.full`, `argmax`, `cat`
#
# Generating text is a loop: feed the tokens so far, take the scores (logits) for the next token, pick
# one, append it, repeat. Three tools do the bookkeeping: `torch.full((B, 1), start_id)` starts every
# sequence with the same token, `argmax(dim=-1, keepdim=True)` picks the highest-scoring next token per
# row as a `(B, 1)` tensor, and `torch.cat([idx, nxt], dim=1)` appends it along the time axis.
#
# As a stand-in for a language model we use a fixed random table of "next-token logits" indexed by the
# last token (a bigram model). Units 06 and 09 run the same loop with real models.

# %%
torch.manual_seed(0)
vocab_size, batch, steps = 12, 3, 6
bigram_logits = torch.randn(vocab_size, vocab_size)           # row = current token, entries = next-token logits

idx = torch.full((batch, 1), 0, dtype=torch.long)             # start token 0 for every row
idx[1, 0], idx[2, 0] = 4, 7                                   # different start tokens for rows 1 and 2
with torch.no_grad():
    for _ in range(steps):
        logits = bigram_logits[idx[:, -1]]                    # (B, V): scores for the next token
        nxt = logits.argmax(dim=-1, keepdim=True)             # (B, 1)
        idx = torch.cat([idx, nxt], dim=1)                    # (B, T + 1)
print(idx)
assert idx.shape == (batch, 1 + steps) and idx.dtype == torch.long
assert all(idx[b, t + 1] == bigram_logits[idx[b, t]].argmax() for b in range(batch) for t in range(steps))

# %% [markdown]
# ## 9. Cross-entropy, `ignore_index` and label smoothing
#
# A language model outputs logits `(B, T, V)`: one score per vocabulary entry at every position. The
# targets are `(B, T)` token ids. `F.cross_entropy` expects the class axis in position 1, so the usual
# move is to flatten: logits to `(B·T, V)`, targets to `(B·T,)`. (Passing `logits.transpose(1, 2)` of
# shape `(B, V, T)` gives the same number.) Cross-entropy takes **raw logits**: it applies
# `log_softmax` itself.
#
# A worked example: logits `[2.0, 1.0, 0.1]` and target class 0.

# %%
z = torch.tensor([[2.0, 1.0, 0.1]])
log_p = z.log_softmax(dim=-1)
ce = F.cross_entropy(z, torch.tensor([0]))
print("log-softmax:", log_p, " CE:", round(ce.item(), 4))
assert torch.allclose(log_p, torch.tensor([[-0.4170, -1.4170, -2.3170]]), atol=1e-4)
assert abs(ce.item() - 0.4170) < 1e-4 and abs(ce.item() + log_p[0, 0].item()) < 1e-6

# %%
B, T, V = 2, 5, 7
logits = torch.randn(B, T, V)
targets = torch.randint(0, V, (B, T))
flat = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))
class_axis_1 = F.cross_entropy(logits.transpose(1, 2), targets)
print(f"flattened: {flat.item():.5f}   (B, V, T) form: {class_axis_1.item():.5f}")
assert torch.allclose(flat, class_axis_1)

# %% [markdown]
# **`ignore_index`.** Padding positions must not count. Targets equal to `ignore_index` (default `-100`)
# contribute nothing, and the mean is taken over the **remaining** positions only: dividing by all
# positions would make the loss depend on how much padding a batch happens to have.

# %%
padded = targets.clone()
padded[1, 3:] = -100                                            # the second sequence ends after 3 tokens
loss_ignored = F.cross_entropy(logits.reshape(-1, V), padded.reshape(-1))
per_token = F.cross_entropy(logits.reshape(-1, V), padded.reshape(-1), reduction="none")
kept = padded.reshape(-1) != -100
print(f"mean over {int(kept.sum())} real tokens: {loss_ignored.item():.5f}; "
      f"wrongly divided by all {kept.numel()}: {(per_token.sum() / kept.numel()).item():.5f}")
assert torch.allclose(loss_ignored, per_token[kept].mean())
assert (per_token[~kept] == 0).all()

# %% [markdown]
# **Label smoothing** (*reference — come back in unit 06*, whose translation model trains with it) trains against a softened target: the true class gets `1 − ε` and the remaining
# mass `ε` is spread **uniformly over all `C` classes, the true class included**. The loss per position is
#
# $$(1-\varepsilon)\,(-\log p_y) \;+\; \frac{\varepsilon}{C}\sum_{c=1}^{C} (-\log p_c),$$
#
# which is what `F.cross_entropy(..., label_smoothing=ε)` computes. The cell below evaluates it for the
# worked example with ε = 0.1 term by term (the second term uses the mean of the three `−log p_c`).
# `llmcourse.label_smoothed_cross_entropy` is the course's version, written from `log_softmax` (an
# exercise of this unit); it takes the class axis **last**, so 3-D logits need no flattening.

# %%
eps = 0.1
smoothed_torch = F.cross_entropy(z, torch.tensor([0]), label_smoothing=eps)
by_hand = (1 - eps) * (-log_p[0, 0]) + eps * (-log_p[0]).mean()
ours = llmcourse.label_smoothed_cross_entropy(z, torch.tensor([0]), eps=eps)
print(f"(1 - ε)·(-log p_y) + ε·mean_c(-log p_c) = {1 - eps:.1f} · {-log_p[0, 0].item():.4f} + {eps:.1f} · "
      f"{(-log_p[0]).mean().item():.4f} = {by_hand.item():.4f}")
print(f"F.cross_entropy: {smoothed_torch.item():.4f}  by hand: {by_hand.item():.4f}  llmcourse: {ours.item():.4f}")
assert abs(smoothed_torch.item() - 0.5137) < 1e-4
assert torch.allclose(smoothed_torch, by_hand) and torch.allclose(smoothed_torch, ours)
assert torch.allclose(llmcourse.label_smoothed_cross_entropy(logits, padded, eps=0.1),
                      F.cross_entropy(logits.reshape(-1, V), padded.reshape(-1), label_smoothing=0.1))

# %% [markdown]
# Two wrong versions to recognise. Spreading ε over the `C − 1` *wrong* classes only is a different
# (also published) recipe, but not PyTorch's; and feeding probabilities instead of logits applies the
# softmax twice:

# %%
others = (-log_p[0]).sum() - (-log_p[0, 0])
excludes_target = (1 - eps) * (-log_p[0, 0]) + eps / 2 * others
on_probs = F.cross_entropy(z.softmax(-1), torch.tensor([0]))
print(f"ε over wrong classes only: {excludes_target.item():.4f}  (PyTorch: {smoothed_torch.item():.4f})")
print(f"softmax fed to cross_entropy: {on_probs.item():.4f}  (correct: {ce.item():.4f})")
assert not torch.allclose(excludes_target, smoothed_torch, atol=1e-3)
assert not torch.allclose(on_probs, ce, atol=1e-3)

# %% [markdown]
# Finally, numerical stability: `torch.log(torch.softmax(x))` underflows to `log(0) = -inf` for large
# logits, while `log_softmax` subtracts the maximum first and stays finite.

# %%
huge = torch.tensor([[1e4, 0.0, -1e4]])
print("log(softmax):", torch.log(torch.softmax(huge, -1)), " log_softmax:", huge.log_softmax(-1))
assert torch.isinf(torch.log(torch.softmax(huge, -1))).any() and torch.isfinite(huge.log_softmax(-1)).all()
assert torch.isfinite(llmcourse.label_smoothed_cross_entropy(huge, torch.tensor([2]), eps=0.1))

# %% [markdown]
# Move the ε slider and the target class in the widget and watch both the target distribution and the loss.

# %% tags=["nbval-ignore-output"]
show_label_smoothing()

# %% [markdown]
# ## 10. `einsum` for attention products
#
# `torch.einsum` names each axis with a letter. Letters that appear in the inputs but not in the output
# are **summed over**; all others are kept (and matched across inputs). Two products on batches of
# matrices show the rule: a batched matrix product `A B` is `"bij,bjk->bik"` (the shared letter `j` is
# summed), and `A Bᵀ` is `"bij,bkj->bik"` (the same letter `j` on the *last* axis of both inputs: no
# transpose needed). Attention's two products are the same pattern with one more batch letter for the
# heads; writing them is exercise 3, and the course's versions are `llmcourse.nn.attention_scores_einsum`
# and `llmcourse.nn.attention_output_einsum`.

# %%
torch.manual_seed(1)
a, b_, c_ = torch.randn(2, 5, 8), torch.randn(2, 8, 3), torch.randn(2, 7, 8)
assert torch.allclose(torch.einsum("bij,bjk->bik", a, b_), a @ b_, atol=1e-6)
assert torch.allclose(torch.einsum("bij,bkj->bik", a, c_), a @ c_.transpose(1, 2), atol=1e-6)
q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 3)
scores_m = q @ k.transpose(-2, -1)
weights = (scores_m / math.sqrt(8)).softmax(-1)
scores_e = llmcourse.nn.attention_scores_einsum(q, k)
ctx_e = llmcourse.nn.attention_output_einsum(weights, v)
print("scores", tuple(scores_e.shape), "context", tuple(ctx_e.shape))
assert torch.allclose(scores_e, scores_m, atol=1e-6)
assert torch.allclose(ctx_e, weights @ v, atol=1e-6)

# %% [markdown]
# ### Spot the bug: the right shape, the wrong numbers
#
# A popular write-up computes the context with the einsum below. The output has the right shape, so
# nothing crashes. The cell compares it with `weights @ v` and prints what every query received; find
# why.

# %%
ctx_bug = torch.einsum("bhqk,bhvd->bhqd", weights, v)
print("shape", tuple(ctx_bug.shape), "matches weights @ v?", torch.allclose(ctx_bug, weights @ v, atol=1e-5))
all_values = v.sum(dim=-2, keepdim=True)                         # (B, H, 1, d_v)
print("every query got (its row sum) × (the sum of all value vectors)?",
      torch.allclose(ctx_bug, weights.sum(-1, keepdim=True) * all_values, atol=1e-5))
print("queries 0 and 1 got the same vector?", torch.allclose(ctx_bug[..., 0, :], ctx_bug[..., 1, :], atol=1e-6))

# %% [markdown]
# **Your turn:** fix the equation string in `context_fixed` (the self-check compares with `weights @ v`).

# %%
def context_fixed(weights, v):
    # TODO: every query must get its own weighted mix of the values
    return torch.einsum("bhqk,bhvd->bhqd", weights, v)


def self_check_context(fn):
    ok = torch.allclose(fn(weights, v), weights @ v, atol=1e-5)
    print("✓ every query now gets its own weighted mix of the values" if ok else
          "✗ not yet: the result differs from weights @ v")
    return ok


self_check_context(context_fixed)

# %% jupyter={"source_hidden": true}
# Reference fix: in "bhqk,bhvd->bhqd" the key axis of the weights (k) and of the values (v) carry different
# letters, so einsum sums over each separately: every query gets (sum of its weights) x (sum of all value
# vectors). Give both key axes the same letter (the course's finished version is
# llmcourse.nn.attention_output_einsum; writing it is exercise 3).
assert self_check_context(llmcourse.nn.attention_output_einsum)

# %% [markdown]
# **A claim to check: "dot products grow: E[q·k] ∝ d_k".** For random `q`, `k` with independent
# standard-normal entries, the **mean** of `q·k` is 0 for every `d_k`; what grows linearly with `d_k`
# is the **variance** (a sum of `d_k` products, each of variance 1). That is why attention divides the
# scores by `√d_k`: it brings their standard deviation back to 1. Measured:

# %%
gen = torch.Generator().manual_seed(0)
n_samples = 20_000
print(" d_k    mean(q·k)   var(q·k)   var/d_k   var after /√d_k")
for d_k in (4, 16, 64, 256):
    qs = torch.randn(n_samples, d_k, generator=gen)
    ks = torch.randn(n_samples, d_k, generator=gen)
    dots = (qs * ks).sum(-1)
    mean, var = dots.mean().item(), dots.var().item()
    print(f"{d_k:4d}   {mean:+9.3f}   {var:8.2f}   {var / d_k:7.3f}   {(dots / math.sqrt(d_k)).var().item():8.3f}")
    assert abs(mean) < 5 * math.sqrt(d_k / n_samples), "the mean stays at 0"
    assert abs(var / d_k - 1) < 0.1, "the variance grows like d_k"

# %% [markdown]
# ## 11. `no_grad` for inference; checkpoints
#
# Inside `with torch.no_grad():` PyTorch does **not** build the computation graph: results have no
# `grad_fn`, and the intermediate activations that backward would need are not kept. So inference under
# `no_grad` uses *less* memory; it does not "store gradients and activations", as one write-up has it. It
# also does not switch dropout off: that is `eval()`'s job, and inference uses both.

# %%
layer = nn.Linear(4, 4)
inp = torch.randn(2, 4)
with_graph = layer(inp)
with torch.no_grad():
    without_graph = layer(inp)
print("normal:   requires_grad", with_graph.requires_grad, " grad_fn", with_graph.grad_fn)
print("no_grad:  requires_grad", without_graph.requires_grad, " grad_fn", without_graph.grad_fn)
assert without_graph.grad_fn is None and not without_graph.requires_grad
assert torch.equal(with_graph.detach(), without_graph)

# %% [markdown]
# Another claim that circulates: "GELU is stochastic". It is not: GELU is the deterministic function
# `x · Φ(x)`, with `Φ` the standard normal CDF (`Φ(x) = ½(1 + erf(x/√2))`). Its *motivation* involves a
# random gate, but the function itself returns the same output for the same input, every time.

# %%
xs = torch.linspace(-4, 4, 101)
gelu_by_hand = xs * 0.5 * (1 + torch.erf(xs / math.sqrt(2)))
assert torch.equal(F.gelu(xs), F.gelu(xs))
assert torch.allclose(F.gelu(xs), gelu_by_hand, atol=1e-6)
print("GELU(1.0) =", F.gelu(torch.tensor(1.0)).item(), "= 1·Φ(1) =", (0.5 * (1 + math.erf(1 / math.sqrt(2)))))

# %% [markdown]
# **Checkpoints** are dictionaries: the model's `state_dict`, the optimizer's `state_dict` (Adam's
# moment estimates are part of training state), and the step counter. Saving the dictionary and loading
# it back with `weights_only=True` (which refuses to unpickle arbitrary objects) restores everything.

# %%
torch.manual_seed(0)
net = nn.Linear(3, 2)
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
for _ in range(3):
    opt.zero_grad()
    net(torch.randn(5, 3)).pow(2).mean().backward()
    opt.step()
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "checkpoint.pt"
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": 3}, path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
net2 = nn.Linear(3, 2)
opt2 = torch.optim.Adam(net2.parameters(), lr=1e-2)
net2.load_state_dict(ckpt["model"])
opt2.load_state_dict(ckpt["optimizer"])
print("keys:", list(ckpt), "| step", ckpt["step"], "| Adam state entries:", len(opt2.state_dict()["state"]))
assert all(torch.equal(a, b) for a, b in zip(net.parameters(), net2.parameters()))
assert ckpt["step"] == 3 and len(opt2.state_dict()["state"]) == 2

# %% [markdown]
# ## 12. Optimizers, `LambdaLR` and the Noam schedule; `DataLoader`
#
# *The Noam part is reference — come back in unit 06, whose translation model trains with it.*
#
# An optimizer holds **param groups**, each with its own hyperparameters; `optimizer.param_groups[0]["lr"]`
# is the learning rate the next `optimizer.step()` will use. A **learning-rate scheduler** changes those
# values as training goes on.
#
# The original Transformer used the **Noam schedule**: a linear warm-up, then decay like `1/√step`,
#
# $$\text{lr}(s) = d_\text{model}^{-0.5}\cdot\min\!\left(s^{-0.5},\; s\cdot \text{warmup}^{-1.5}\right),$$
#
# with its peak at `s = warmup`, where both terms are equal: `lr = (d_model · warmup)^{-0.5}`.
# `llmcourse.noam_lambda` computes it (with `s = max(step, 1)`). The table below holds its values for
# `d_model=512, warmup=4000`, written down as reference values computed separately from the formula:

# %%
NOAM_TABLE = {1: 1.746928e-07, 100: 1.746928e-05, 1000: 1.746928e-04, 4000: 6.987712e-04, 8000: 4.941059e-04,
        16000: 3.493856e-04}
print(" step    noam_lambda")
for step, expected in NOAM_TABLE.items():
    value = llmcourse.noam_lambda(step, 512, 4000)
    print(f"{step:5d}   {value:.6e}")
    assert math.isclose(value, expected, rel_tol=2e-6)
assert math.isclose(llmcourse.noam_lambda(4000, 512, 4000), (512 * 4000) ** -0.5)

# %% [markdown]
# **`LambdaLR` multiplies.** `torch.optim.lr_scheduler.LambdaLR(optimizer, f)` does not set the lr to
# `f(step)`; it sets it to `base_lr · f(step)`, where `base_lr` is the lr the optimizer had when the
# scheduler was created. A demo that builds `Adam(lr=1e-4)` and attaches the Noam lambda, while its text
# promises a warm-up "to 1e-4", actually trains with learning rates 10⁴ times smaller than the table. Let us drive a real
# optimizer for 16,000 steps and record the lr each step uses (no gradients are needed to watch the
# schedule; `step()` simply skips parameters without one).

# %%
def lrs_used(optimizer, scheduler, record_at, n_steps):
    """The lr of param group 0 used by optimizer step n (n = 1, 2, …), for n in record_at."""
    seen = {}
    for n in range(1, n_steps + 1):
        if n in record_at:
            seen[n] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
    return seen


param = nn.Parameter(torch.zeros(1))
trap_opt = torch.optim.Adam([param], lr=1e-4)
trap_sched = torch.optim.lr_scheduler.LambdaLR(trap_opt, lambda e: llmcourse.noam_lambda(e, 512, 4000))
trap = lrs_used(trap_opt, trap_sched, set(range(1, 16_001)), 16_000)
trap_peak_step = max(trap, key=trap.get)
print(f"largest lr used: {trap[trap_peak_step]:.6e} (at step {trap_peak_step}); the schedule's peak is "
      f"{NOAM_TABLE[4000]:.6e}; ratio {trap[trap_peak_step] / NOAM_TABLE[4000]:.0e}")
assert math.isclose(trap[trap_peak_step], 1e-4 * NOAM_TABLE[4000], rel_tol=1e-5)

# %% [markdown]
# The largest lr this optimizer ever uses is the schedule's peak times `1e-4` (the ratio printed above):
# ten thousand times too small, and the model would barely move. Whatever `f` returns is scaled by the lr
# the optimizer was created with; the exercise asks for a scheduler that is right whatever that lr was.
#
# **The step counter.** `LambdaLR` calls the lambda with its own counter, which is `0` when the
# scheduler is created and advances by one at each `scheduler.step()`. With the usual order
# (`optimizer.step()` then `scheduler.step()`), the n-th optimizer step uses `f` of the counter's value at
# that moment. The cell below records the counter values the lambda receives and the lr of the first four
# steps when the lambda passes its counter straight to `noam_lambda`.

# %%
def first_lrs(make_lambda, n=4):
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, make_lambda)
    return list(lrs_used(opt, sched, set(range(1, n + 1)), n).values())


counter_values = []


def recording(e):
    counter_values.append(e)
    return llmcourse.noam_lambda(e, 512, 4000)


straight = first_lrs(recording)
wanted = [llmcourse.noam_lambda(n, 512, 4000) for n in range(1, 5)]
print("counter values seen by the lambda:", counter_values)
print("lr of steps 1…4, lambda e: λ(e):", [f"{x:.3e}" for x in straight])
print("wanted λ(1…4):                  ", [f"{x:.3e}" for x in wanted])
assert straight[0] == straight[1] and straight != wanted

# %% [markdown]
# Steps 1 and 2 both use λ(1) (`max(step, 1)` turns the counter's first value into 1), and every later
# step uses the value meant for the step before it. `llmcourse.make_noam_scheduler(optimizer, d_model,
# warmup, factor=1.0)`, an exercise of this unit, handles both traps. Even with an optimizer created with
# `lr=1e-4`, the learning rates it produces reproduce the table:

# %%
fixed_opt = torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=1e-4)
fixed_sched = llmcourse.make_noam_scheduler(fixed_opt, d_model=512, warmup=4000)
fixed = lrs_used(fixed_opt, fixed_sched, set(NOAM_TABLE), 16_000)
for step, value in fixed.items():
    assert math.isclose(value, NOAM_TABLE[step], rel_tol=1e-5), (step, value)
print("peak lr used by step 4000:", f"{fixed[4000]:.6e}")

# %% [markdown]
# The widget draws the schedule; move `d_model` and `warmup`, and switch the base lr between
# `1.0` and the `1e-4` trap. The peak always sits at `step = warmup`.

# %% tags=["nbval-ignore-output"]
show_noam_curve()

# %% [markdown]
# **Datasets and loaders.** `TensorDataset(X, y)` pairs tensors along their first axis; `DataLoader` cuts
# it into batches (optionally shuffled with a seeded generator). `num_workers=0` loads in the main
# process, which is the right choice for small in-memory tensors (and required in some notebook
# environments). Below, 32 samples of 20 features in batches of 4: the cell prints how many batches come out
# and their shapes.

# %%
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

gen = torch.Generator().manual_seed(0)
features = torch.randn(32, 20, generator=gen)
labels = torch.randint(0, 5, (32,), generator=gen)
loader = DataLoader(TensorDataset(features, labels), batch_size=4, shuffle=True, generator=gen, num_workers=0)
shapes = [(tuple(xb.shape), tuple(yb.shape)) for xb, yb in loader]
print(f"{len(shapes)} batches (= 32 / 4); first: features {shapes[0][0]}, labels {shapes[0][1]}")
assert len(shapes) == 8 and all(s == ((4, 20), (4,)) for s in shapes)

# %% [markdown]
# Putting the pieces together, one epoch of training: `train()` mode, `zero_grad`, forward, loss,
# backward, step, and an evaluation under `eval()` and `no_grad()`.

# %%
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 5))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)


def evaluate(model):
    model.eval()
    with torch.no_grad():
        return F.cross_entropy(model(features), labels).item()


before = evaluate(model)
for _epoch in range(5):
    model.train()
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
after = evaluate(model)
print(f"training loss on the 32 samples: {before:.3f} -> {after:.3f}")
assert after < before

# %% [markdown]
# ## Two traps with PyTorch's built-in transformer layers
#
# *Reference — come back in unit 05, where PyTorch's layers check your own blocks.*
#
# `nn.TransformerEncoderLayer` defaults to `batch_first=False`: it reads its input as `(T, B, D)`. Feed it
# a `(B, T, D)` batch and nothing crashes, but attention now runs across the **batch** axis: sequence 0
# attends to the other sequences in the batch instead of to its own tokens. A property exposes it: changing
# one sequence must not change the outputs of another.

# %%
torch.manual_seed(0)
B_, T_len, D_ = 3, 5, 16
enc_default = nn.TransformerEncoderLayer(D_, nhead=2, dim_feedforward=32, dropout=0.0).eval()
enc_batch_first = nn.TransformerEncoderLayer(D_, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
enc_batch_first.load_state_dict(enc_default.state_dict())
batch_btd = torch.randn(B_, T_len, D_)
other_changed = batch_btd.clone()
other_changed[1] += 1.0                                         # change sequence 1 only
with torch.no_grad():
    leak_default = (enc_default(other_changed)[0] - enc_default(batch_btd)[0]).abs().max().item()
    leak_fixed = (enc_batch_first(other_changed)[0] - enc_batch_first(batch_btd)[0]).abs().max().item()
print(f"change in sequence 0's output: batch_first=False {leak_default:.3f}, batch_first=True {leak_fixed:.1e}")
assert leak_default > 1e-3 and leak_fixed < 1e-6

# %% [markdown]
# The second trap: a "character language model" built from encoder layers **without a causal mask** sees
# the future, so its training loss looks wonderful and its generations are nonsense. Changing a later
# token must never change an earlier position's output. `nn.TransformerEncoderLayer` takes a boolean
# `src_mask` with PyTorch's *opposite* convention (`True` = blocked), so the course mask is passed as
# `~causal_mask(T)`.

# %%
tokens = torch.randn(1, T_len, D_)
future_changed = tokens.clone()
future_changed[0, 3:] += 1.0                                    # change positions 3 and 4
course_mask = llmcourse.causal_mask(T_len)                      # True = may attend
with torch.no_grad():
    no_mask = (enc_batch_first(future_changed) - enc_batch_first(tokens))[0, :3].abs().max().item()
    masked = (enc_batch_first(future_changed, src_mask=~course_mask)
              - enc_batch_first(tokens, src_mask=~course_mask))[0, :3].abs().max().item()
print(f"change at positions 0-2 after editing positions 3-4: no mask {no_mask:.3f}, causal mask {masked:.1e}")
assert no_mask > 1e-3 and masked < 1e-6

# %% [markdown]
# ## Summary
#
# - Know every tensor's shape, dtype and device; gradients accumulate in `.grad` until you zero them.
# - Parameters, buffers and submodules register by assignment; a plain list or a plain tensor attribute
#   does not register.
# - `view` never copies and fails after `transpose`; use `.contiguous().view` or `.reshape`. Split heads
#   with `view(B, T, H, hd).transpose(1, 2)`; merge with the reverse.
# - Course masks are boolean with `True` = may attend; `causal_mask(t_q, t_k)` aligns queries to the end.
# - Cross-entropy takes raw logits; `ignore_index` positions leave both the sum and the count; label
#   smoothing spreads ε over all `C` classes.
# - In `einsum`, the summed axis must carry the same letter in both inputs.
# - `LambdaLR` scales the optimizer's own lr by `f(counter)`, and its counter starts at 0 before the first step.
#
# Next: the exercise notebook `exercises/00_pytorch_essentials/00_pytorch_essentials.ipynb`, then unit 01
# (tokenization).
#
# ## Open-ended extension (ungraded): a sliding-window causal mask
#
# Long-context models often let a query see only the last `w` keys (a *sliding window*, as in Mistral or
# Gemma's local layers). Write `sliding_window_mask(t_q, t_k, w)`: the causal mask of this lesson
# (queries aligned to the end of the keys) with the extra rule that key `j` is allowed only when
# `j > offset + i − w`. Then think about what it does to the cost of attention and to a KV cache (unit 12),
# and how information can still travel further than `w` positions through a stack of layers. The
# self-check compares your mask with a double loop on a few shapes.

# %%
def sliding_window_mask(t_q, t_k, w):
    # TODO (optional): a (t_q, t_k) bool mask, True = may attend
    return None


def self_check_window(fn):
    for t_q, t_k, w in [(4, 4, 2), (3, 7, 3), (1, 6, 4), (5, 5, 10)]:
        want = torch.tensor([[t_k - t_q + i - w < j <= t_k - t_q + i for j in range(t_k)] for i in range(t_q)])
        got = fn(t_q, t_k, w)
        if got is None or not (isinstance(got, torch.Tensor) and got.dtype == torch.bool and torch.equal(got, want)):
            print(f"✗ not yet: for t_q={t_q}, t_k={t_k}, w={w} expected\n{want.int()}")
            return False
    print("✓ the sliding-window mask matches the double loop")
    return True


self_check_window(sliding_window_mask)
