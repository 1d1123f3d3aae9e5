# %% [markdown]
# # Unit 11 — Llama 3: exercises
#
# Five graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: outputs compared with Hugging Face's Llama pieces
# (`LlamaRMSNorm`, `LlamaMLP`, the rotary embedding, `LlamaAttention`, `LlamaForCausalLM`) on small
# random configurations, torch's own RMSNorm and attention, the relative-position property of RoPE,
# exact parameter counts of the released Llama 3.2 sizes and causality. When something fails it
# tells you what was expected, what came back and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/11_llama3/11_llama3.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Later exercises use your earlier answers (the model
# is built from your norm, MLP, RoPE and attention), so finish them in order.

# %%
import math  # noqa: F401
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: F401
from torch import Tensor, nn  # noqa: F401

import llmcourse

cfg = llmcourse.setup_notebook("11")

# %% [markdown]
# ## Exercise 1 — `RMSNorm` (3 points)
#
# ```python
# class RMSNorm(nn.Module):
#     def __init__(self, d: int, eps: float = 1e-5): ...   # one parameter: weight (d,), initialised to ones
#     def forward(self, x: Tensor) -> Tensor: ...          # (..., d) -> (..., d)
# ```
#
# `y = weight · x / sqrt(mean(x², over the last dim) + eps)`: no mean subtraction, no bias, ε inside
# the square root. Compute the statistics in **float32** whatever the input dtype, cast the normalised
# value back to the input's dtype, then multiply by `weight`.

# %% tags=["solution:11.RMSNorm"]
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        ### BEGIN SOLUTION
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)
        ### END SOLUTION


# %% tags=["tests:11.RMSNorm"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("11.RMSNorm")  # noqa: E702
### END HIDDEN TESTS
norm = RMSNorm(8)
assert [n for n, _ in norm.named_parameters()] == ["weight"], "RMSNorm has one parameter, `weight` (no bias)"
x = torch.randn(3, 8)
assert torch.allclose(norm(x), torch.nn.RMSNorm(8, eps=1e-5)(x), atol=1e-6), "RMSNorm must equal torch.nn.RMSNorm"
assert torch.allclose(norm(2.5 * x), norm(x), atol=1e-5), "scaling a row must not change the output"
assert not torch.allclose(norm(x + 1.0), norm(x), atol=1e-3), "adding a constant must change the output (no centring)"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `SwiGLUFeedForward` (2 points)
#
# ```python
# class SwiGLUFeedForward(nn.Module):
#     def __init__(self, d_model: int, hidden_dim: int): ...
#     def forward(self, x: Tensor) -> Tensor: ...     # (..., d_model) -> (..., d_model)
# ```
#
# Three bias-free linear layers with the `state_dict` keys `gate_proj.weight (hidden, D)`,
# `up_proj.weight (hidden, D)` and `down_proj.weight (D, hidden)`. The output is
# `down_proj(silu(gate_proj(x)) ⊙ up_proj(x))` with `silu(z) = z·sigmoid(z)`. Write the SiLU yourself
# (the grader makes `F.silu` unavailable during its checks).

# %% tags=["solution:11.SwiGLUFeedForward"]
class SwiGLUFeedForward(nn.Module):
    def __init__(self, d_model, hidden_dim):
        super().__init__()
        ### BEGIN SOLUTION
        self.gate_proj = nn.Linear(d_model, hidden_dim, bias=False)
        self.up_proj = nn.Linear(d_model, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, d_model, bias=False)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        g = self.gate_proj(x)
        return self.down_proj(g * torch.sigmoid(g) * self.up_proj(x))
        ### END SOLUTION


# %% tags=["tests:11.SwiGLUFeedForward"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("11.SwiGLUFeedForward")  # noqa: E702
### END HIDDEN TESTS
mlp = SwiGLUFeedForward(16, 40)
shapes = {k: tuple(v.shape) for k, v in mlp.state_dict().items()}
assert shapes == {"gate_proj.weight": (40, 16), "up_proj.weight": (40, 16), "down_proj.weight": (16, 40)}, shapes
x = torch.randn(2, 5, 16)
assert mlp(x).shape == (2, 5, 16)
with torch.no_grad():
    mlp.up_proj.weight.zero_()
assert torch.equal(mlp(x), torch.zeros(2, 5, 16)), "a zero up_proj must give a zero output (the product gates it)"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — rotary position embeddings (5 points)
#
# ```python
# def rope_inv_freq(head_dim: int, theta: float = 500000.0, scaling: dict | None = None) -> Tensor: ...
# def rope_cos_sin(inv_freq: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]: ...
# def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor: ...
# def interleaved_to_half_split_perm(head_dim: int) -> Tensor: ...
# ```
#
# - `rope_inv_freq`: float32 `(head_dim // 2,)`, entry `i` is `theta ** (-2i / head_dim)` (compute it as
#   `1 / theta ** (arange(0, head_dim, 2) / head_dim)` in float32). With `scaling` (keys `factor`,
#   `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings` = `orig`) apply Llama 3's
#   smoothing, judged per pair by its wavelength `2π / θ_i` against two limits, `orig / high_freq_factor`
#   (the short one) and `orig / low_freq_factor` (the long one): a pair below the short limit keeps its
#   frequency; a pair above the long limit must turn `factor` times more slowly; a pair between the limits
#   moves from one behaviour to the other. **Which blend** is yours to work out: the required values below
#   (those of `transformers`' `llama3` rope type) admit one natural form, continuous at both limits. The
#   next cell prints them.
# - `rope_cos_sin`: positions `(T,)` -> `cos, sin` of shape `(T, head_dim)`: the angles
#   `positions[:, None] · inv_freq[None, :]`, concatenated with themselves along the last dim.
# - `apply_rope`: `x` `(B, H, T, head_dim)` -> same shape, rotated with the tables of `rope_cos_sin`.
#   **Which dimensions form a pair** is yours to decide: the result must equal what `transformers`' Llama
#   does with the same tables (`apply_rotary_pos_emb` in `transformers.models.llama.modeling_llama`), so
#   that a checkpoint of `LlamaForCausalLM` gives the same logits in your model. The test cell compares
#   with it.
# - `interleaved_to_half_split_perm`: long `(head_dim,)`: `[0, 2, 4, …, 1, 3, 5, …]`, the row order that
#   turns a projection trained with neighbouring pairs `(2i, 2i+1)` into one for pairs `(i, i + hd/2)`.

# %%
# the required values: rope_inv_freq(16, 500000.0, scaling) must return these (rtol 1e-4)
SMOOTHING_EXAMPLE = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
REQUIRED = {  # pair: (wavelength without scaling, θ without scaling, θ required with scaling)
    3: (861.58, 7.2927e-3, 7.2927e-3),
    4: (4442.9, 1.4142e-3, 4.2956e-4),
    5: (22910.6, 2.7425e-4, 8.5703e-6),
}
for i, (wl, before, after) in REQUIRED.items():
    print(f"pair {i}: wavelength {wl:>9,.1f}  θ {before:.5g} -> {after:.5g}  (ratio {after / before:.5f})")

# %% tags=["solution:11.rope"]
def rope_inv_freq(head_dim, theta=500000.0, scaling=None):
    ### BEGIN SOLUTION
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling is None:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > orig / low, inv / factor, inv)
    s = (orig / wavelen - low) / (high - low)
    smoothed = (1 - s) * out / factor + s * out
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return torch.where(medium, smoothed, out)
    ### END SOLUTION


def rope_cos_sin(inv_freq, positions):
    ### BEGIN SOLUTION
    angles = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()
    ### END SOLUTION


def rotate_half(x):
    ### BEGIN SOLUTION
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    ### END SOLUTION


def apply_rope(x, cos, sin):
    ### BEGIN SOLUTION
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)
    ### END SOLUTION


def interleaved_to_half_split_perm(head_dim):
    ### BEGIN SOLUTION
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    ### END SOLUTION


# %% tags=["tests:11.rope"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("11.rope")  # noqa: E702
### END HIDDEN TESTS
inv = rope_inv_freq(16, 500000.0)
assert inv.shape == (8,) and inv.dtype == torch.float32
assert torch.allclose(inv[:3], torch.tensor([1.0, 0.19392, 0.037606]), rtol=1e-4), inv
cos, sin = rope_cos_sin(rope_inv_freq(4, 10000.0), torch.arange(2))
assert cos.shape == (2, 4)
v = torch.tensor([[[[1.0, 2.0, 3.0, 4.0]]]])
assert torch.equal(apply_rope(v, cos[:1], sin[:1]), v), "position 0 must not rotate"
print("position 1:", apply_rope(v, cos[1:], sin[1:]).flatten().tolist())
smoothed = rope_inv_freq(16, 500000.0, SMOOTHING_EXAMPLE)
for i, (_, _, after) in REQUIRED.items():
    assert abs(smoothed[i].item() / after - 1) < 1e-4, f"pair {i}: required {after:.5g}, got {smoothed[i].item():.5g}"
qk = torch.randn(2, 1, 2, 5, 16)
c5, s5 = rope_cos_sin(rope_inv_freq(16, 10000.0), torch.arange(5))
with torch.no_grad():  # transformers' Llama rotates the same q with the same tables
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    hf_q, _ = apply_rotary_pos_emb(qk[0], qk[1], c5[None], s5[None])
assert torch.allclose(apply_rope(qk[0], c5, s5), hf_q, atol=1e-5), "apply_rope must pair dimensions as transformers' Llama does"
assert interleaved_to_half_split_perm(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
q, k = torch.randn(2, 64)
c, s = rope_cos_sin(rope_inv_freq(64, 10000.0), torch.arange(100))
score = lambda m, n: (apply_rope(q, c[m], s[m]) @ apply_rope(k, c[n], s[n])).item()  # noqa: E731
assert abs(score(7, 3) - score(57, 53)) < 1e-4, "the score must depend only on the distance m - n"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `repeat_kv` and `GroupedQueryAttention` (4 points)
#
# ```python
# def repeat_kv(x: Tensor, n_rep: int) -> Tensor: ...   # (B, KV, T, hd) -> (B, KV·n_rep, T, hd)
# class GroupedQueryAttention(nn.Module):
#     def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int | None = None): ...
#     def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor: ...   # (B, T, D) -> (B, T, D)
# ```
#
# - `repeat_kv`: `n_rep` copies of every KV head, `KV·n_rep` heads out. **Which query heads share a KV head**
#   is yours to decide: the attention below must equal `transformers`' `LlamaAttention` (the layout of every
#   released checkpoint), and torch's `F.scaled_dot_product_attention(..., enable_gqa=True)` follows the same
#   rule; the test cell compares with torch.
# - `GroupedQueryAttention`: bias-free `q_proj.weight (H·hd, D)`, `k_proj.weight (KV·hd, D)`,
#   `v_proj.weight (KV·hd, D)`, `o_proj.weight (D, H·hd)` with `hd = head_dim`, an argument of its own
#   (`d_model // n_heads` when it is `None`; Llama 3.2 style configs may set it to anything).
#   Split the projections into heads, apply your `apply_rope` to queries and keys (not values), let each
#   query head attend with its KV head (through `repeat_kv`), scale the scores by `1/√head_dim`, apply `mask`
#   (bool, broadcastable to `(B, H, T, T)`, True = may attend), softmax, merge the heads and project with
#   `o_proj`. `F.scaled_dot_product_attention` may be used (without `enable_gqa`: the grouping is your part).

# %% tags=["solution:11.GroupedQueryAttention"]
def repeat_kv(x, n_rep):
    ### BEGIN SOLUTION
    b, kv, t, hd = x.shape
    return x[:, :, None].expand(b, kv, n_rep, t, hd).reshape(b, kv * n_rep, t, hd)
    ### END SOLUTION


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, head_dim=None):
        super().__init__()
        ### BEGIN SOLUTION
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = head_dim if head_dim is not None else d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        ### END SOLUTION

    def forward(self, x, cos, sin, mask):
        ### BEGIN SOLUTION
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
        ### END SOLUTION


# %% tags=["tests:11.GroupedQueryAttention"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("11.GroupedQueryAttention")  # noqa: E702
### END HIDDEN TESTS
attn = GroupedQueryAttention(32, 8, 2)
shapes = {k: tuple(v.shape) for k, v in attn.state_dict().items()}
assert shapes == {"q_proj.weight": (32, 32), "k_proj.weight": (8, 32), "v_proj.weight": (8, 32),
                  "o_proj.weight": (32, 32)}, shapes
x = torch.randn(2, 6, 32)
c, s = rope_cos_sin(rope_inv_freq(4, 10000.0), torch.arange(6))
mask = torch.ones(6, 6, dtype=torch.bool).tril()
y = attn(x, c, s, mask)
assert y.shape == (2, 6, 32)
x2 = x.clone()
x2[:, 4:] += 1
assert torch.allclose(attn(x2, c, s, mask)[:, :4], y[:, :4], atol=1e-6), "outputs must not depend on later positions"
with torch.no_grad():   # torch's grouped attention on your projections: the grouping must agree
    b_, t_ = x.shape[:2]
    q_ = apply_rope(attn.q_proj(x).view(b_, t_, 8, 4).transpose(1, 2), c, s)
    k_ = apply_rope(attn.k_proj(x).view(b_, t_, 2, 4).transpose(1, 2), c, s)
    v_ = attn.v_proj(x).view(b_, t_, 2, 4).transpose(1, 2)
    ctx = torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, enable_gqa=True)
    torch_out = attn.o_proj(ctx.transpose(1, 2).reshape(b_, t_, 32))
    assert torch.allclose(y, torch_out, atol=1e-5), "your grouping differs from torch's enable_gqa=True"
assert GroupedQueryAttention(48, 4, 2, head_dim=16).q_proj.weight.shape == (64, 48), "head_dim sets the head width"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `Llama3Config` and `Llama3Model` (6 points)
#
# ```python
# @dataclass
# class Llama3Config:
#     vocab_size: int; d_model: int; n_layers: int; n_heads: int; n_kv_heads: int; intermediate_size: int
#     context_length: int; rope_theta: float = 500000.0; rope_scaling: dict | None = None
#     rms_norm_eps: float = 1e-5; tie_word_embeddings: bool = True; head_dim: int | None = None
#
#     @classmethod
#     def preset(cls, name: str) -> "Llama3Config": ...
#
# class Llama3Model(nn.Module):
#     def __init__(self, cfg: Llama3Config): ...
#     def forward(self, idx: Tensor) -> Tensor: ...    # (B, T) long -> logits (B, T, V)
# ```
#
# `preset(name)` returns a new config (any other name raises `KeyError`):
#
# | name | V | D | L | H | KV | hd | I | context | θ | scaling |
# |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
# | `"llama3.2-1b"` | 128,256 | 2,048 | 16 | 32 | 8 | 64 | 8,192 | 131,072 | 500,000 | 32 / 1 / 4 / 8,192 |
# | `"llama3.2-3b"` | 128,256 | 3,072 | 28 | 24 | 8 | 128 | 8,192 | 131,072 | 500,000 | 32 / 1 / 4 / 8,192 |
# | `"llama3-tiny"` | 65 | 128 | 4 | 4 | 2 | (None) | 384 | 256 | 10,000 | none |
#
# (scaling = `{"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
# "original_max_position_embeddings": 8192}`; the two Llama 3.2 presets set `head_dim` explicitly.)
#
# The model (pre-norm blocks, no dropout, no biases) has exactly these `state_dict` keys:
#
# ```
# embed_tokens.weight (V, D)
# layers.{i}.input_layernorm.weight (D)            layers.{i}.post_attention_layernorm.weight (D)
# layers.{i}.self_attn.{q,k,v,o}_proj.weight       layers.{i}.mlp.{gate,up,down}_proj.weight
# norm.weight (D)
# lm_head.weight (V, D)   (the same Parameter as embed_tokens.weight when tie_word_embeddings)
# ```
#
# Each layer computes `x = x + self_attn(input_layernorm(x), cos, sin, mask)` then
# `x = x + mlp(post_attention_layernorm(x))`; after the last layer, `norm` then `lm_head`. The model
# owns exactly three **non-persistent** buffers, registered on the model itself: `rope_cos` and
# `rope_sin` `(context_length, head_dim)` for positions `0 … context_length − 1`, and `causal`
# `(context_length, context_length)` bool (True = may attend). `forward` slices them to `T` and raises
# `ValueError` when `T > context_length`. The model must build on the `meta` device.

# %% tags=["solution:11.Llama3Model"]
@dataclass
class Llama3Config:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    context_length: int
    rope_theta: float = 500000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    head_dim: int | None = None

    @classmethod
    def preset(cls, name):
        ### BEGIN SOLUTION
        scaling = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
        table = {
            "llama3.2-1b": dict(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                                intermediate_size=8192, context_length=131072, head_dim=64, rope_scaling=scaling),
            "llama3.2-3b": dict(vocab_size=128256, d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8,
                                intermediate_size=8192, context_length=131072, head_dim=128, rope_scaling=scaling),
            "llama3-tiny": dict(vocab_size=65, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
                                intermediate_size=384, context_length=256, rope_theta=10000.0),
        }
        if name not in table:
            raise KeyError(name)
        return cls(**table[name])
        ### END SOLUTION


class Llama3Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ### BEGIN SOLUTION
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.self_attn = GroupedQueryAttention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.mlp = SwiGLUFeedForward(cfg.d_model, cfg.intermediate_size)
        ### END SOLUTION

    def forward(self, x, cos, sin, mask):
        ### BEGIN SOLUTION
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
        ### END SOLUTION


class Llama3Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ### BEGIN SOLUTION
        self.cfg = cfg
        hd = cfg.head_dim if cfg.head_dim is not None else cfg.d_model // cfg.n_heads
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([Llama3Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_cos_sin(rope_inv_freq(hd, cfg.rope_theta, cfg.rope_scaling), torch.arange(cfg.context_length))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        causal = torch.ones(cfg.context_length, cfg.context_length, dtype=torch.bool).tril()
        self.register_buffer("causal", causal, persistent=False)
        ### END SOLUTION

    def forward(self, idx):
        ### BEGIN SOLUTION
        t = idx.shape[1]
        if t > self.cfg.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length={self.cfg.context_length}")
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, self.rope_cos[:t], self.rope_sin[:t], self.causal[:t, :t])
        return self.lm_head(self.norm(x))
        ### END SOLUTION


# %% tags=["tests:11.Llama3Model"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("11.Llama3Model")  # noqa: E702
### END HIDDEN TESTS
tiny = Llama3Config.preset("llama3-tiny")
model = Llama3Model(tiny).eval()
assert model.lm_head.weight is model.embed_tokens.weight, "the head must BE the token embedding (tied)"
assert sorted(n for n, _ in model.named_buffers()) == ["causal", "rope_cos", "rope_sin"]
n_params = sum(p.numel() for p in model.parameters())
assert n_params == 795_904, f"llama3-tiny has 795,904 parameters; got {n_params:,}"
# same weights in the course's model: same logits
reference = llmcourse.Llama3Model(llmcourse.Llama3Config.preset("llama3-tiny")).eval()
reference.load_state_dict(model.state_dict())
idx = torch.randint(0, 65, (2, 30))
with torch.no_grad():
    diff = (model(idx) - reference(idx)).abs().max().item()
print(f"max |your logits - the course model's logits| = {diff:.2e}")
assert diff < 1e-4
print("visible tests passed")
