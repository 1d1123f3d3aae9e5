# %% [markdown]
# # Unit 04 — Multi-head attention: exercises
#
# Five graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: other sizes and seeds, comparisons with
# `nn.MultiheadAttention` and `F.scaled_dot_product_attention` loaded with the same weights, a
# per-head loop for cross-attention, and properties (the future never leaks, masked keys change
# nothing, heads are independent). When something fails it tells you what was expected, what came
# back, and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/04_multi_head_attention/04_multi_head_attention.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use only `torch`, `math` and the standard library
# (plus the finished unit-03 `CausalSelfAttention`, imported below). Conventions (from the lesson):
# masks are **boolean, `True` = may attend**, and broadcast to `(B, H, T_q, T_k)`; in
# `MultiHeadAttentionWrapper`, `head_dim` is the width of **one** head, in `MultiHeadAttention`,
# `d_out` is the **total** width.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.nn import CausalSelfAttention

cfg = llmcourse.setup_notebook("04")

# "Your journey starts with one step" (unit 03), one 3-d vector per token
inputs = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                       [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])

# %% [markdown]
# ## Exercise 1 — `MultiHeadAttentionWrapper` (3 points)
#
# Build multi-head attention the simple way: `num_heads` independent single-head causal attentions,
# run one after the other, their outputs concatenated along the last dimension.
#
# - `__init__(self, d_in, head_dim, context_length, dropout, num_heads, qkv_bias=False)`: store
#   `self.heads = nn.ModuleList([...])` holding `num_heads` **separate**
#   `CausalSelfAttention(d_in, head_dim, context_length, dropout, qkv_bias)` modules (create them in
#   head order). The `state_dict` keys are then `heads.{h}.W_query.weight` of shape `(head_dim, d_in)`,
#   and the same for `W_key`, `W_value`.
# - `forward(self, x)`: `(B, T, d_in)` → `(B, T, num_heads · head_dim)`; columns
#   `h·head_dim … (h+1)·head_dim − 1` come from head `h`.

# %% tags=["solution:04.MultiHeadAttentionWrapper"]
class MultiHeadAttentionWrapper(nn.Module):
    """num_heads independent causal heads, concatenated on the last dim."""

    def __init__(self, d_in, head_dim, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.heads = nn.ModuleList(
            [CausalSelfAttention(d_in, head_dim, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return torch.cat([head(x) for head in self.heads], dim=-1)
        ### END SOLUTION


# %% tags=["tests:04.MultiHeadAttentionWrapper"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("04.MultiHeadAttentionWrapper")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(123)
wrapper = MultiHeadAttentionWrapper(d_in=3, head_dim=2, context_length=6, dropout=0.0, num_heads=2)
out = wrapper(torch.stack([inputs, inputs]))
assert out.shape == (2, 6, 4), f"2 heads of width 2 on a (2, 6, 3) batch: expected (2, 6, 4), got {tuple(out.shape)}"
assert torch.allclose(out[0, 0], torch.tensor([-0.4519, 0.2216, 0.4772, 0.1063]), atol=1e-4), \
    f"row 0 should be [-0.4519, 0.2216, 0.4772, 0.1063]; got {out[0, 0].tolist()} (heads created in order?)"
assert wrapper.heads[0] is not wrapper.heads[1], "each head must be its own module"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `MultiHeadAttention` (7 points)
#
# The efficient version: one projection per query/key/value for all heads at once, split into heads.
#
# `__init__(self, d_in, d_out, num_heads, dropout=0.0, qkv_bias=False, causal=False,
# context_length=None, d_kv=None)`:
# - `head_dim = d_out // num_heads`; raise `ValueError` if `d_out` is not divisible by `num_heads`.
#   Store `self.num_heads`, `self.head_dim`, `self.d_out`, `self.causal`.
# - `d_kv` (width of the key/value input, for cross-attention) defaults to `d_in`.
# - create, in this order, `self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)`,
#   `self.W_key = nn.Linear(d_kv, d_out, bias=qkv_bias)`, `self.W_value` (like `W_key`),
#   `self.out_proj = nn.Linear(d_out, d_out)`, and `self.dropout = nn.Dropout(dropout)`.
# - when `causal`: register a buffer `causal_mask`, `(context_length, context_length)` bool
#   lower-triangular, with `persistent=False`.
# - `self.store_weights = False` and `self.last_weights = None`.
#
# `forward(self, x_q, x_kv=None, mask=None)` returns `(B, T_q, d_out)`:
# - `x_q` is `(B, T_q, d_in)`; `x_kv` is `(B, T_k, d_kv)`, or `None` for self-attention (keys and values
#   come from `x_q`).
# - head `h` owns features `h·head_dim … (h+1)·head_dim − 1` of the projected queries, keys and values,
#   attends with scores scaled by `1/√head_dim`, and its context fills the same feature slice of the
#   result before `out_proj` (so with `out_proj = I` the output is the heads' contexts side by side).
# - `mask`: `None` or a bool tensor broadcastable to `(B, H, T_q, T_k)`, `True` = may attend; blocked
#   keys get weight exactly 0.
# - a causal module treats the `T_q` queries as the **last** `T_q` of the `T_k` positions: query `i` may
#   attend to keys `j ≤ T_k − T_q + i`, and, when `mask` is given, only where `mask` allows too.
# - when `self.store_weights` is true, `self.last_weights` holds the `(B, H, T_q, T_k)` weights after the
#   softmax and before dropout, detached; dropout acts on the weights (only in `train()` mode).

# %% tags=["solution:04.MultiHeadAttention"]
class MultiHeadAttention(nn.Module):
    """Multi-head attention with weight splitting (self-, causal and cross-attention)."""

    def __init__(self, d_in, d_out, num_heads, dropout=0.0, qkv_bias=False, causal=False, context_length=None,
                 d_kv=None):
        super().__init__()
        ### BEGIN SOLUTION
        if d_out % num_heads != 0:
            raise ValueError(f"d_out={d_out} is not divisible by num_heads={num_heads}")
        d_kv = d_in if d_kv is None else d_kv
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.causal = causal
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_kv, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_kv, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        if causal:
            mask = torch.ones(context_length, context_length, dtype=torch.bool).tril()
            self.register_buffer("causal_mask", mask, persistent=False)
        self.store_weights = False
        self.last_weights = None
        ### END SOLUTION

    def forward(self, x_q, x_kv=None, mask=None):
        ### BEGIN SOLUTION
        if x_kv is None:
            x_kv = x_q
        b, t_q, _ = x_q.shape
        t_k = x_kv.shape[1]
        q = self.W_query(x_q).view(b, t_q, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.W_key(x_kv).view(b, t_k, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.W_value(x_kv).view(b, t_k, self.num_heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if self.causal:
            causal = self.causal_mask[t_k - t_q:t_k, :t_k]
            mask = causal if mask is None else causal & mask
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if self.store_weights:
            self.last_weights = weights.detach()
        context = self.dropout(weights) @ v
        merged = context.transpose(1, 2).contiguous().view(b, t_q, self.d_out)
        return self.out_proj(merged)
        ### END SOLUTION


# %% tags=["tests:04.MultiHeadAttention"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("04.MultiHeadAttention")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
mha = MultiHeadAttention(d_in=8, d_out=8, num_heads=2, causal=True, context_length=10).eval()
x = torch.randn(2, 6, 8)
out = mha(x)
assert out.shape == (2, 6, 8), f"expected (2, 6, 8), got {tuple(out.shape)}"
assert set(mha.state_dict()) == {"W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight",
                                 "out_proj.bias"}, f"state_dict keys: {sorted(mha.state_dict())}"
changed = x.clone()
changed[:, 3:] = 0.0
assert torch.allclose(mha(changed)[:, :3], out[:, :3], atol=1e-6), \
    "changing tokens 3.. changed outputs 0..2: the causal mask is not applied (masked_fill is not in-place)"
mha.store_weights = True
mha(x)
assert mha.last_weights.shape == (2, 2, 6, 6), f"last_weights: expected (2, 2, 6, 6), got {mha.last_weights.shape}"
try:
    MultiHeadAttention(256, 256, num_heads=6)
    raise AssertionError("d_out=256 with 6 heads must raise ValueError")
except ValueError:
    pass
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `mha_from_wrapper` (3 points)
#
# Show that the two implementations compute the same function. Given a `MultiHeadAttentionWrapper`,
# return a causal `MultiHeadAttention` that gives the same output:
# - `num_heads = len(wrapper.heads)`, `d_out = num_heads · head_dim`, the same `d_in`, dropout
#   probability (`heads[0].dropout.p`), `context_length` (`heads[0].context_length`) and `qkv_bias`;
# - after the split into heads, head `h` of the returned module must compute exactly what
#   `wrapper.heads[h]` computes, for the query, key and value projections and their biases if any:
#   which rows of `W_query.weight` (shape `(d_out, d_in)`) does head `h` read? (the lesson's section 6);
# - the output projection must pass the concatenated heads through unchanged (the wrapper has none).
#
# Copy values inside `with torch.no_grad():` using `param.copy_(...)`.
# It builds **your** `MultiHeadAttention` from exercise 2, so finish that one first.

# %% tags=["solution:04.mha_from_wrapper"]
def mha_from_wrapper(wrapper):
    """A causal MultiHeadAttention computing what the wrapper computes (head h = wrapper.heads[h]), out_proj = I."""
    ### BEGIN SOLUTION
    heads = wrapper.heads
    first = heads[0]
    d_in, head_dim = first.W_query.in_features, first.W_query.out_features
    qkv_bias = first.W_query.bias is not None
    d_out = head_dim * len(heads)
    mha = MultiHeadAttention(d_in, d_out, len(heads), dropout=first.dropout.p, qkv_bias=qkv_bias, causal=True,
                             context_length=first.context_length)
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(mha, name).weight.copy_(torch.cat([getattr(h, name).weight for h in heads], dim=0))
            if qkv_bias:
                getattr(mha, name).bias.copy_(torch.cat([getattr(h, name).bias for h in heads], dim=0))
        mha.out_proj.weight.copy_(torch.eye(d_out))
        mha.out_proj.bias.zero_()
    return mha
    ### END SOLUTION


# %% tags=["tests:04.mha_from_wrapper"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("04.mha_from_wrapper")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(1)
w3 = MultiHeadAttentionWrapper(d_in=5, head_dim=4, context_length=8, dropout=0.0, num_heads=3).eval()
fused = mha_from_wrapper(w3).eval()
xb = torch.randn(2, 7, 5)
assert fused.W_query.weight.shape == (12, 5), f"W_query.weight: expected (12, 5), got {tuple(fused.W_query.weight.shape)}"
assert torch.equal(fused.out_proj.weight, torch.eye(12)), "out_proj.weight must be the identity"
diff = (fused(xb) - w3(xb)).abs().max().item()
assert diff < 1e-6, f"mha_from_wrapper(w)(x) differs from w(x) by {diff:.3g}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `to_torch_attn_mask` and `to_torch_mha` (4 points)
#
# Load a course `MultiHeadAttention` (the one from `llmcourse`, whose attributes are `W_query`,
# `W_key`, `W_value`, `out_proj`, `num_heads`, `d_out`, `d_in`, `d_kv`, `dropout`) into PyTorch's
# `nn.MultiheadAttention`.
#
# - `to_torch_attn_mask(mask)`: a course mask (`True` = may attend) → the boolean `attn_mask` of
#   `nn.MultiheadAttention`, where `True` means **blocked**.
# - `to_torch_mha(mha)`: raise `ValueError` unless `d_in == d_kv == d_out`; create
#   `nn.MultiheadAttention(d_out, num_heads, dropout=mha.dropout.p, bias=True, batch_first=True)` and
#   copy the weights: `in_proj_weight` `(3·d, d)` packs `W_query.weight`, `W_key.weight`,
#   `W_value.weight` one after the other **in that order**; `in_proj_bias` the three biases in the same order, or
#   zeros when the course module has no qkv bias; `out_proj.weight` and `out_proj.bias` copied.
#
# Then `torch_mha(x, x, x, attn_mask=to_torch_attn_mask(m), need_weights=False)[0]` equals `mha(x, mask=m)`.

# %% tags=["solution:04.to_torch_mha"]
def to_torch_attn_mask(mask):
    """Course mask (True = attend) -> nn.MultiheadAttention boolean attn_mask (True = blocked)."""
    ### BEGIN SOLUTION
    return ~mask
    ### END SOLUTION


def to_torch_mha(mha):
    """An nn.MultiheadAttention(batch_first=True) carrying mha's weights."""
    ### BEGIN SOLUTION
    if not (mha.d_in == mha.d_kv == mha.d_out):
        raise ValueError("nn.MultiheadAttention's packed in_proj needs d_in == d_kv == d_out")
    torch_mha = nn.MultiheadAttention(mha.d_out, mha.num_heads, dropout=mha.dropout.p, bias=True, batch_first=True)
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight], 0))
        if mha.W_query.bias is not None:
            torch_mha.in_proj_bias.copy_(torch.cat([mha.W_query.bias, mha.W_key.bias, mha.W_value.bias], 0))
        else:
            torch_mha.in_proj_bias.zero_()
        torch_mha.out_proj.weight.copy_(mha.out_proj.weight)
        torch_mha.out_proj.bias.copy_(mha.out_proj.bias)
    return torch_mha
    ### END SOLUTION


# %% tags=["tests:04.to_torch_mha"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("04.to_torch_mha")  # noqa: E702
### END HIDDEN TESTS
causal = llmcourse.causal_mask(5)
assert torch.equal(to_torch_attn_mask(causal), ~causal), "nn.MultiheadAttention's True means blocked: invert"
torch.manual_seed(2)
course_mha = llmcourse.nn.MultiHeadAttention(8, 8, num_heads=2, qkv_bias=True).eval()
torch_mha = to_torch_mha(course_mha).eval()
assert torch_mha.in_proj_weight.shape == (24, 8), f"in_proj_weight: expected (24, 8), got {torch_mha.in_proj_weight.shape}"
assert torch.equal(torch_mha.in_proj_weight[:8], course_mha.W_query.weight), "rows 0..7 of in_proj_weight are W_query"
xt = torch.randn(2, 5, 8)
ours = course_mha(xt, mask=causal)
theirs = torch_mha(xt, xt, xt, attn_mask=to_torch_attn_mask(causal), need_weights=False)[0]
assert torch.allclose(ours, theirs, atol=1e-5), f"max difference {(ours - theirs).abs().max():.3g}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `mha_forward_sdpa` (3 points)
#
# Recompute a course module's forward pass with PyTorch's fused kernel
# `F.scaled_dot_product_attention(q, k, v, attn_mask=...)`, which takes a boolean mask in the
# **course** polarity (`True` = attend).
#
# `mha_forward_sdpa(mha, x_q, x_kv=None, mask=None)`: use `mha.W_query`, `mha.W_key`, `mha.W_value`,
# `mha.num_heads`, `mha.head_dim`, `mha.out_proj`; when `mha.causal`, build the bottom-right causal
# mask from `mha.causal_mask` as in exercise 2 and AND it with `mask`. Pass that one boolean
# `attn_mask` and **never** `is_causal=True` (it is top-left aligned when `T_q ≠ T_k`). Call it with
# the module in eval mode (no dropout). Returns `(B, T_q, d_out)`, equal to `mha(x_q, x_kv, mask)`.

# %% tags=["solution:04.mha_forward_sdpa"]
def mha_forward_sdpa(mha, x_q, x_kv=None, mask=None):
    """mha(x_q, x_kv, mask) with the attention computed by F.scaled_dot_product_attention."""
    ### BEGIN SOLUTION
    if x_kv is None:
        x_kv = x_q
    b, t_q, _ = x_q.shape
    t_k = x_kv.shape[1]
    h, hd = mha.num_heads, mha.head_dim
    q = mha.W_query(x_q).view(b, t_q, h, hd).transpose(1, 2)
    k = mha.W_key(x_kv).view(b, t_k, h, hd).transpose(1, 2)
    v = mha.W_value(x_kv).view(b, t_k, h, hd).transpose(1, 2)
    if mha.causal:
        causal = mha.causal_mask[t_k - t_q:t_k, :t_k]
        mask = causal if mask is None else causal & mask
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return mha.out_proj(context.transpose(1, 2).contiguous().view(b, t_q, h * hd))
    ### END SOLUTION


# %% tags=["tests:04.mha_forward_sdpa"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("04.mha_forward_sdpa")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(3)
causal_mha = llmcourse.nn.MultiHeadAttention(8, 8, num_heads=2, causal=True, context_length=10).eval()
xs = torch.randn(2, 6, 8)
got = mha_forward_sdpa(causal_mha, xs)
assert got.shape == (2, 6, 8), f"expected (2, 6, 8), got {tuple(got.shape)}"
assert torch.allclose(got, causal_mha(xs), atol=1e-5), "self-attention: differs from mha(x)"
last2 = mha_forward_sdpa(causal_mha, xs[:, 4:], xs)
assert torch.allclose(last2, causal_mha(xs)[:, 4:], atol=1e-5), \
    "2 queries after 6 keys must equal the last 2 rows of full self-attention (bottom-right causal mask)"
print("visible tests passed")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
# From unit 05 on, the course imports the finished
# `MultiHeadAttention` from `llmcourse.nn`: it is the attention inside every block we build next.
