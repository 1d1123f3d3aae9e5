# %% [markdown]
# # Unit 03 — Self-attention: exercises
#
# Five graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: other shapes and seeds, comparisons with
# `torch.nn.functional.scaled_dot_product_attention`, and properties (rows sum to 1, the future
# never leaks, dropout is unbiased). When something fails it tells you what was expected, what came
# back, and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/03_self_attention/03_self_attention.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use only `torch`, `math` and the standard library.
# Conventions (from the lesson): masks are **boolean, `True` = may attend**; scores are scaled by
# `1/√d_k` where `d_k` is the key width; every function and module returns tensors of its input's dtype
# (float32 in, float32 out).

# %%
import math

import torch
from torch import nn

import llmcourse

cfg = llmcourse.setup_notebook("03")

# %% [markdown]
# ## Exercise 1 — `softmax_stable` (3 points)
#
# Write `softmax_stable(x, dim=-1)`: the softmax of `x` along `dim` (same shape as `x`), finite for any
# finite input however large. Entries equal to `-inf` must get weight 0. Do **not** call
# `torch.softmax`, `Tensor.softmax` or `F.softmax`.
#
# Example: `softmax_stable(torch.tensor([1000., 1001.]))` is `[0.2689, 0.7311]`, where the naive
# `exp(x) / exp(x).sum()` gives `nan`.

# %% tags=["solution:03.softmax_stable"]
def softmax_stable(x, dim=-1):
    """Softmax of x along dim (same shape as x), finite for every finite x; -inf entries get weight 0."""
    ### BEGIN SOLUTION
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)
    ### END SOLUTION


# %% tags=["tests:03.softmax_stable"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("03.softmax_stable")  # noqa: E702
### END HIDDEN TESTS
out = softmax_stable(torch.tensor([1.0, 2.0, 3.0, 6.0]))
assert out.shape == (4,), f"expected shape (4,), got {tuple(out.shape)}"
assert torch.allclose(out, torch.tensor([0.0063, 0.0170, 0.0463, 0.9304]), atol=1e-4), f"softmax([1,2,3,6]) gave {out}"
big = softmax_stable(torch.tensor([1000.0, 1001.0]))
assert torch.isfinite(big).all(), f"softmax([1000, 1001]) gave {big}: exp overflows float32 for inputs this large"
x = torch.randn(3, 5)
assert torch.allclose(softmax_stable(x, dim=0).sum(0), torch.ones(5)), "with dim=0 the columns must sum to 1"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `simple_attention` (3 points)
#
# Attention without trainable weights, as in the first part of the lesson. For inputs `x` of shape
# `(T, d)` or `(B, T, d)`:
#
# - scores: every token's dot product with every token, `x xᵀ` (no scaling);
# - weights: the softmax of the scores over the last dimension (you may use `torch.softmax` here);
# - context: `weights @ x`.
#
# Return the tuple `(context, weights)`, shapes `(..., T, d)` and `(..., T, T)`. Use
# `x.transpose(-2, -1)`, which works for both shapes.

# %% tags=["solution:03.simple_attention"]
def simple_attention(x):
    """x (T, d) or (B, T, d) -> (context (..., T, d), weights (..., T, T)); weights = softmax(x xᵀ)."""
    ### BEGIN SOLUTION
    scores = x @ x.transpose(-2, -1)
    weights = torch.softmax(scores, dim=-1)
    return weights @ x, weights
    ### END SOLUTION


# %% tags=["tests:03.simple_attention"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("03.simple_attention")  # noqa: E702
### END HIDDEN TESTS
inputs = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                       [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
context, weights = simple_attention(inputs)
assert weights.shape == (6, 6) and context.shape == (6, 3), f"got shapes {weights.shape}, {context.shape}"
assert torch.allclose(weights[1], torch.tensor([0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]), atol=1e-4), \
    f"weights for 'journey' (row 1) are {weights[1]}"
assert torch.allclose(weights.sum(-1), torch.ones(6)), "each row of the weights must sum to 1"
c_b, w_b = simple_attention(torch.randn(2, 4, 3))
assert c_b.shape == (2, 4, 3) and w_b.shape == (2, 4, 4), "batched input (2, 4, 3) must work"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `scaled_dot_product_attention` (5 points)
#
# The core of every transformer in this course:
#
# $$\text{Attention}(Q, K, V) = \text{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V$$
#
# ```python
# scaled_dot_product_attention(q, k, v, mask=None, dropout=None) -> (context, weights)
# ```
#
# - `q (..., T_q, d_k)`, `k (..., T_k, d_k)`, `v (..., T_k, d_v)`; any number of leading dimensions.
# - `mask`: `None` or a bool tensor broadcastable to `(..., T_q, T_k)`, **`True` = may attend**. Fill the
#   blocked scores with `float("-inf")` **before** the softmax.
# - `dropout`: `None` or a module (such as `nn.Dropout`) applied to the weights before they multiply `v`.
# - Return `context (..., T_q, d_v)` and `weights (..., T_q, T_k)`, the softmax output **before** dropout.
#
# - Scores are scaled by `1/√d_k` with `d_k = k.shape[-1]`; blocked keys get weight exactly 0; each row
#   of `weights` sums to 1 over the keys it may see; dropout, when given, acts only on the weights that
#   multiply `v`.

# %% tags=["solution:03.scaled_dot_product_attention"]
def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):
    """softmax(q kᵀ / √d_k) v with an optional boolean mask (True = may attend) and dropout on the weights."""
    ### BEGIN SOLUTION
    d_k = k.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    used = dropout(weights) if dropout is not None else weights
    return used @ v, weights
    ### END SOLUTION


# %% tags=["tests:03.scaled_dot_product_attention"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("03.scaled_dot_product_attention")  # noqa: E702
### END HIDDEN TESTS
import torch.nn.functional as F  # noqa: E402

q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 5)
context, weights = scaled_dot_product_attention(q, k, v)
assert context.shape == (2, 4, 5) and weights.shape == (2, 4, 6), f"got {context.shape}, {weights.shape}"
assert torch.allclose(weights.sum(-1), torch.ones(2, 4), atol=1e-6), "rows of the weights must sum to 1"
assert torch.allclose(context, F.scaled_dot_product_attention(q, k, v), atol=1e-5), "differs from PyTorch's built-in"
causal = torch.ones(4, 4, dtype=torch.bool).tril()
_, w_masked = scaled_dot_product_attention(q[:, :, :], k[:, :4], v[:, :4], mask=causal)
assert (w_masked[:, 0, 1:] == 0).all(), "masked (future) weights must be exactly 0"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `SelfAttention` (3 points)
#
# A module with three trainable projections, `W_query`, `W_key` and `W_value`, each
# `nn.Linear(d_in, d_out, bias=qkv_bias)` (their `.weight` has shape `(d_out, d_in)`). `forward(x)`
# takes `(T, d_in)` or `(B, T, d_in)` and returns the context `(..., T, d_out)`, scaling the scores by
# `1/√d_out`. No mask, no dropout. You may call your `scaled_dot_product_attention`.
#
# Use the width of *this* module (or `k.shape[-1]`), not a variable from elsewhere in the notebook: the
# grader builds your class with a different `d_out` in a fresh namespace.

# %% tags=["solution:03.SelfAttention"]
class SelfAttention(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        context, _ = scaled_dot_product_attention(self.W_query(x), self.W_key(x), self.W_value(x))
        return context
        ### END SOLUTION


# %% tags=["tests:03.SelfAttention"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("03.SelfAttention")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(123)
sa = SelfAttention(3, 2)
assert sorted(sa.state_dict()) == ["W_key.weight", "W_query.weight", "W_value.weight"], sorted(sa.state_dict())
assert sa.W_query.weight.shape == (2, 3), "nn.Linear(d_in, d_out).weight has shape (d_out, d_in)"
assert sa(inputs).shape == (6, 2) and sa(inputs.expand(4, 6, 3)).shape == (4, 6, 2), "unbatched and batched inputs"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `CausalSelfAttention` (6 points)
#
# The batched, causal, dropout-equipped version used by GPT-style models:
#
# ```python
# CausalSelfAttention(d_in, d_out, context_length, dropout=0.0, qkv_bias=False)
# ```
#
# - Projections `W_query`, `W_key`, `W_value` as in exercise 4; `self.dropout = nn.Dropout(dropout)`.
# - A buffer `mask`: the `(context_length, context_length)` **bool** lower-triangular matrix (`True` = may
#   attend), registered with `self.register_buffer("mask", ..., persistent=False)` so it moves with the
#   module but is not saved in the `state_dict`.
# - `forward(x)`: `x (B, T, d_in)` with any `T ≤ context_length` → `(B, T, d_out)`; query `t` attends to
#   keys `0 … t` only; raise `ValueError` if `T > context_length`. Dropout acts on the attention weights
#   (so it is active only in `train()` mode).
# - After each call store the `(B, T, T)` weights (post-softmax, pre-dropout) in `self.last_weights`,
#   detached from the graph (`.detach()`).

# %% tags=["solution:03.CausalSelfAttention"]
class CausalSelfAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout=0.0, qkv_bias=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        mask = torch.ones(context_length, context_length, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)
        self.last_weights = None
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        t = x.shape[1]
        if t > self.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length={self.context_length}")
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        context, weights = scaled_dot_product_attention(q, k, v, mask=self.mask[:t, :t], dropout=self.dropout)
        self.last_weights = weights.detach()
        return context
        ### END SOLUTION


# %% tags=["tests:03.CausalSelfAttention"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("03.CausalSelfAttention")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
ca = CausalSelfAttention(3, 2, context_length=8, dropout=0.1).eval()
batch = inputs.expand(2, 6, 3)
out = ca(batch)
assert out.shape == (2, 6, 2), f"expected (2, 6, 2), got {tuple(out.shape)}"
assert "mask" in dict(ca.named_buffers()) and "mask" not in ca.state_dict(), "mask: a non-persistent buffer"
w = ca.last_weights
assert w.shape == (2, 6, 6) and torch.allclose(w.sum(-1), torch.ones(2, 6)), "last_weights rows must sum to 1"
assert (w.triu(1) == 0).all(), "no weight may sit above the diagonal (the future)"
changed = batch.clone()
changed[:, 3:] = 0.0
assert torch.allclose(ca(changed)[:, :3], out[:, :3]), "changing tokens 3.. must not change outputs 0..2"
print("visible tests passed")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
# In the lesson's last section the same `CausalSelfAttention` is
# trained on Shakespeare; from unit 04 on, the course imports the finished version from `llmcourse`.
