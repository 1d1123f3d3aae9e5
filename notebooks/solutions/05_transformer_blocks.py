# %% [markdown]
# # Unit 05 — Transformer blocks: exercises
#
# Six graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: `nn.LayerNorm` and `F.gelu` as oracles, PyTorch's
# own `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer` loaded with your block's weights in
# **both** norm placements, and properties (train and eval agree, padding and the future never leak,
# the decoder listens to the encoder memory). When something fails it tells you what was expected,
# what came back, and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/05_transformer_blocks/05_transformer_blocks.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a class must not rely on a
# variable defined elsewhere in the notebook. Use only `torch`, `math` and the standard library, plus
# the course's finished multi-head attention from unit 04 (`MultiHeadAttention`, imported below).
# When the grader checks your blocks it plugs in the course's `LayerNorm` and `FeedForward`, so a
# mistake in exercise 1 is not counted again in exercises 4 and 5.
#
# Conventions (from the lesson): activations are `(B, T, D)`; masks are **boolean, `True` = may
# attend**, broadcastable to `(B, H, T_q, T_k)`; a key-padding mask is `(B, 1, 1, T_k)`.

# %%
import math

import torch
from torch import nn

import llmcourse
from llmcourse.nn import MultiHeadAttention, causal_mask

cfg = llmcourse.setup_notebook("05")

# %% [markdown]
# ## Exercise 1 — `LayerNorm` (4 points)
#
# ```python
# class LayerNorm(nn.Module):
#     def __init__(self, d_model, eps=1e-5): ...   # parameters weight (d_model,) = 1 and bias (d_model,) = 0
#     def forward(self, x): ...                    # x (..., d_model) -> same shape
# ```
#
# For each token (over the **last** dimension only): the mean `μ`, the **biased** variance
# `σ² = mean((x − μ)²)`, then `(x − μ) / sqrt(σ² + eps) * weight + bias`. `eps` goes **inside** the
# square root. No running statistics: `train()` and `eval()` must give the same result, and the module
# has no buffers. Name the parameters `weight` and `bias` (then your `state_dict` loads into
# `nn.LayerNorm`). Do not call `F.layer_norm` or `nn.LayerNorm`.

# %% tags=["solution:05.LayerNorm"]
class LayerNorm(nn.Module):
    """Per-token normalisation over the last dim with the biased variance; learnable weight (γ) and bias (β)."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        ### BEGIN SOLUTION
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
        ### END SOLUTION


# %% tags=["tests:05.LayerNorm"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("05.LayerNorm")  # noqa: E702
### END HIDDEN TESTS
ln = LayerNorm(16)
assert {k: tuple(v.shape) for k, v in ln.state_dict().items()} == {"weight": (16,), "bias": (16,)}, \
    f"state_dict must have weight (16,) and bias (16,); got {list(ln.state_dict())}"
x = torch.randn(2, 4, 16) * 3 + 1
y = ln(x)
assert y.shape == x.shape, f"LayerNorm must keep the shape; got {tuple(y.shape)}"
assert abs(y.std().item() - 1.00393) < 1e-4, f"std of all 128 outputs should be 1.00393, got {y.std():.5f}"
ref = nn.LayerNorm(16)
assert torch.allclose(y, ref(x), atol=1e-5), "your LayerNorm differs from nn.LayerNorm with weight 1 and bias 0"
assert torch.equal(ln.train()(x), ln.eval()(x)), "train() and eval() must give the same output"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `gelu` (2 points)
#
# ```python
# def gelu(x, approximate="none"): ...
# ```
#
# - `"none"`: the exact GELU `0.5·x·(1 + erf(x/√2))` (use `torch.erf`);
# - `"tanh"`: GPT-2's approximation `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
#
# Raise a `ValueError` for any other value. Do not call `F.gelu` or `nn.GELU`.

# %% tags=["solution:05.gelu"]
def gelu(x, approximate="none"):
    """GELU: exact (erf) for approximate='none', the tanh approximation for 'tanh'."""
    ### BEGIN SOLUTION
    if approximate == "none":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if approximate == "tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    ### END SOLUTION


# %% tags=["tests:05.gelu"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("05.gelu")  # noqa: E702
### END HIDDEN TESTS
m3 = torch.tensor([-3.0])
assert abs(gelu(m3).item() - (-0.00405)) < 1e-5, f"gelu(-3) should be -0.00405, got {gelu(m3).item():.5f}"
assert abs(gelu(m3, "tanh").item() - (-0.00364)) < 1e-5, \
    f"gelu(-3, 'tanh') should be -0.00364, got {gelu(m3, 'tanh').item():.5f}"
xs = torch.linspace(-8, 8, 1601)
assert gelu(xs).shape == xs.shape, "gelu must keep the shape"
assert torch.allclose(gelu(xs), torch.nn.functional.gelu(xs), atol=1e-6), "the exact GELU differs from F.gelu"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `FeedForward` (3 points)
#
# ```python
# class FeedForward(nn.Module):
#     def __init__(self, d_model, d_ff, activation="relu"): ...   # "relu" | "gelu" | "gelu_tanh"
#     def forward(self, x): ...                                    # fc2(act(fc1(x)))
# ```
#
# Two linear layers with biases, `fc1 = nn.Linear(d_model, d_ff)` and `fc2 = nn.Linear(d_ff, d_model)`,
# with the activation in between: `"relu"` is `torch.relu`, `"gelu"` your exact `gelu`, `"gelu_tanh"`
# your `gelu(·, "tanh")`; any other name raises `ValueError`. **No dropout inside** (the block that uses it does
# the regularising).
# `state_dict` keys: `fc1.weight (d_ff, d_model)`, `fc1.bias`, `fc2.weight (d_model, d_ff)`, `fc2.bias`.

# %% tags=["solution:05.FeedForward"]
class FeedForward(nn.Module):
    """Position-wise feed-forward network D -> d_ff -> D."""

    def __init__(self, d_model, d_ff, activation="relu"):
        super().__init__()
        ### BEGIN SOLUTION
        if activation not in ("relu", "gelu", "gelu_tanh"):
            raise ValueError(f"unknown activation {activation!r}")
        self.activation = activation
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        h = self.fc1(x)
        if self.activation == "relu":
            h = torch.relu(h)
        elif self.activation == "gelu":
            h = gelu(h)
        else:
            h = gelu(h, approximate="tanh")
        return self.fc2(h)
        ### END SOLUTION


# %% tags=["tests:05.FeedForward"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("05.FeedForward")  # noqa: E702
### END HIDDEN TESTS
ffn = FeedForward(512, 2048)
n_params = sum(p.numel() for p in ffn.parameters())
assert n_params == 2_099_712, f"FeedForward(512, 2048) should have 2,099,712 parameters, got {n_params:,}"
ffn = FeedForward(8, 32, "gelu")
assert sorted(ffn.state_dict()) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"], list(ffn.state_dict())
x = torch.randn(2, 5, 8)
perm = torch.tensor([4, 2, 0, 1, 3])
assert torch.allclose(ffn(x)[:, perm], ffn(x[:, perm]), atol=1e-6), "the FFN must act on each position alone"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `EncoderBlock` (5 points)
#
# ```python
# class EncoderBlock(nn.Module):
#     def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=True, activation="relu",
#                  qkv_bias=True): ...
#     def forward(self, x, mask=None): ...   # x (B, T, D), mask bool (True = attend) -> (B, T, D)
# ```
#
# Submodules (their names are the `state_dict` keys):
# `self_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)` (from unit 04),
# `norm1`, `norm2` = `LayerNorm(d_model)`, `ffn = FeedForward(d_model, d_ff, activation)`,
# `dropout = nn.Dropout(dropout)`.
#
# Two sublayers, `f1(h) = self_attn(h, mask=mask)` then `f2(h) = ffn(h)`:
# - pre-LN (`norm_first=True`): each updates the stream as `x ← x + f_i(norm_i(x))`;
# - post-LN (`norm_first=False`): each as `x ← norm_i(x + f_i(x))`.
#
# Both with **residual dropout** (`self.dropout`, active in `train()` only), as in the original
# Transformer (Vaswani et al., 2017, §5.4 "Residual Dropout"): one dropout per sublayer. Where it acts
# in the update is yours to decide from the paper; the grader reads it off a train-mode output.

# %% tags=["solution:05.EncoderBlock"]
class EncoderBlock(nn.Module):
    """Self-attention + feed-forward, each with residual, LayerNorm (pre or post) and residual dropout."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=True, activation="relu", qkv_bias=True):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.dropout = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x, mask=None):
        ### BEGIN SOLUTION
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask))
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)))
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x
        ### END SOLUTION


# %% tags=["tests:05.EncoderBlock"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("05.EncoderBlock")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
blk = EncoderBlock(16, 4, 32, dropout=0.0).eval()
x = torch.randn(2, 6, 16)
assert blk(x).shape == (2, 6, 16), f"expected (2, 6, 16), got {tuple(blk(x).shape)}"
n_params = sum(p.numel() for p in EncoderBlock(512, 8, 2048).parameters())
assert n_params == 3_152_384, f"EncoderBlock(512, 8, 2048) should have 3,152,384 parameters, got {n_params:,}"
keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
x2 = x.clone()
x2[1, 4:] = 99.0  # change only padded positions
out1, out2 = blk(x, mask=keep[:, None, None, :]), blk(x2, mask=keep[:, None, None, :])
assert torch.allclose(out1[1, :4], out2[1, :4], atol=1e-5), "padded positions leaked into real ones: pass `mask`"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `DecoderBlock` (5 points)
#
# ```python
# class DecoderBlock(nn.Module):
#     def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=True, activation="relu",
#                  qkv_bias=True): ...
#     def forward(self, x, memory, tgt_mask=None, memory_mask=None): ...
# ```
#
# Submodules: `self_attn` and `cross_attn` (two `MultiHeadAttention(d_model, d_model, num_heads, dropout,
# qkv_bias)`), `norm1`, `norm2`, `norm3`, `ffn`, `dropout`. Three sublayers, each updating the stream
# like the encoder block's (same norm placement with `norm1`, `norm2`, `norm3`, same residual dropout):
#
# 1. self-attention: queries, keys and values from the decoder stream;
# 2. cross-attention: queries from the decoder stream, keys and values from `memory`;
# 3. the FFN.
#
# The causal mask is **not** built in. The block receives two masks, `tgt_mask` (broadcastable to
# `(B, H, T_tgt, T_tgt)`) and `memory_mask` (`(B, 1, 1, T_src)`, the source's padding); which attention
# takes which is yours to decide. `memory` `(B, T_src, D)` is the encoder's output and is used as it is
# (not normalised again); `T_src` may differ from the target length.

# %% tags=["solution:05.DecoderBlock"]
class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder memory, feed-forward; pre-LN or post-LN."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=True, activation="relu", qkv_bias=True):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)
        self.cross_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.norm3 = LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.dropout = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        ### BEGIN SOLUTION
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=tgt_mask))
            x = x + self.dropout(self.cross_attn(self.norm2(x), memory, mask=memory_mask))
            x = x + self.dropout(self.ffn(self.norm3(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, mask=tgt_mask)))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, mask=memory_mask)))
            x = self.norm3(x + self.dropout(self.ffn(x)))
        return x
        ### END SOLUTION


# %% tags=["tests:05.DecoderBlock"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("05.DecoderBlock")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
dec = DecoderBlock(16, 4, 32, dropout=0.0).eval()
tgt, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
out = dec(tgt, memory, tgt_mask=causal_mask(5))
assert out.shape == (2, 5, 16), f"expected (2, 5, 16) for T_tgt=5, T_src=7; got {tuple(out.shape)}"
tgt2 = tgt.clone()
tgt2[:, 3:] += 1.0
assert torch.allclose(dec(tgt2, memory, tgt_mask=causal_mask(5))[:, :3], out[:, :3], atol=1e-5), \
    "changing future target tokens changed earlier outputs: pass tgt_mask to the self-attention"
assert not torch.allclose(dec(tgt, memory + 1.0, tgt_mask=causal_mask(5)), out), \
    "the output ignores memory: cross-attention takes keys and values from memory"
print("visible tests passed")

# %% [markdown]
# ## Exercise 6 — `ProjectionLayer` (1 point)
#
# ```python
# class ProjectionLayer(nn.Module):
#     def __init__(self, d_model, vocab_size): ...   # proj = nn.Linear(d_model, vocab_size)
#     def forward(self, x): ...                      # (B, T, D) -> logits (B, T, V)
# ```
#
# Return **logits**: no softmax, no log-softmax (the loss applies log-softmax itself).

# %% tags=["solution:05.ProjectionLayer"]
class ProjectionLayer(nn.Module):
    """Linear map from d_model to vocabulary logits."""

    def __init__(self, d_model, vocab_size):
        super().__init__()
        ### BEGIN SOLUTION
        self.proj = nn.Linear(d_model, vocab_size)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return self.proj(x)
        ### END SOLUTION


# %% tags=["tests:05.ProjectionLayer"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("05.ProjectionLayer")  # noqa: E702
### END HIDDEN TESTS
proj = ProjectionLayer(16, 50)
logits = proj(torch.randn(2, 3, 16))
assert logits.shape == (2, 3, 50), f"expected (2, 3, 50), got {tuple(logits.shape)}"
assert sorted(proj.state_dict()) == ["proj.bias", "proj.weight"], list(proj.state_dict())
assert not torch.allclose(logits.exp().sum(-1), torch.ones(2, 3), atol=1e-4), "return logits, not log-probabilities"
print("visible tests passed")
