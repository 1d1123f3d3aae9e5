# %% [markdown]
# # Unit 13 — DeepSeek multi-head latent attention: exercises
#
# Four graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: sequences of cache updates in several layers and dtypes,
# your attention against an explicit head-by-head computation in float32 and float64, cached decoding, the
# absorbed matrices and the absorbed attention on a float64 example and with a cache longer than the
# queries, a weight change between two calls, `DeepSeekMLA` against `transformers`' `DeepseekV3Attention`
# with copied weights for six configurations (with and without query compression, both RoPE layouts, unequal
# head widths, another RoPE base), the absorbed and cached paths, shifted positions, what your module writes
# into the cache, that a forward changes no parameter or buffer, and cache sizes of real models. The absorbed
# paths are also graded by their **structure**: they must never turn the cached latents into per-head keys or
# values (the grader makes the up-projections unusable as modules and scales the weights so that such keys would
# overflow float32). When something fails it tells you what was expected, what came back, and, if your mistake
# is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/13_deepseek_mla/13_deepseek_mla.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `math`, the standard library and unit 11's
# pieces from `llmcourse.models.llama3` (`RMSNorm`, `rope_inv_freq`, `rope_cos_sin`, `apply_rope`,
# `apply_rope_interleaved`).
#
# **Conventions.** Activations are `(B, T, D)`, per-head tensors `(B, H, T, ·)`. A boolean mask is `True` where
# a query may attend and broadcasts to `(B, H, T_q, T_k)`; `mask=None` means every key may be read (a single
# decoding step). `nn.Linear.weight` has shape `(out, in)`; rows `h·hd … (h+1)·hd − 1` of a per-head
# projection belong to head `h`.

# %%
import math  # noqa: F401

import torch
from torch import nn  # noqa: F401

import llmcourse
from llmcourse.models import llama3 as L11  # noqa: F401
from llmcourse.nn.masks import causal_mask

cfg = llmcourse.setup_notebook("13")

# %% [markdown]
# ## Exercise 1 — `LatentCache` and `SimpleMLA` (5 points)
#
# ```python
# class LatentCache:
#     def __init__(self, n_layers: int): ...
#     def update(self, layer_idx: int, c_kv: Tensor, k_pe: Tensor | None = None) -> tuple[Tensor, Tensor | None]: ...
#     @property
#     def seq_len(self) -> int: ...
#     def nbytes(self) -> int: ...
#
# class SimpleMLA(nn.Module):
#     def __init__(self, d_model: int, n_heads: int, head_dim: int, kv_lora_rank: int): ...
#     def forward(self, x, mask, cache=None, layer_idx=0) -> Tensor: ...
# ```
#
# **The cache** keeps, per layer, the latents `c_kv (B, T, d_c)` and (later, for DeepSeek's layout) the rope
# keys `k_pe (B, T, d_R)`. `update` appends the new ones **along dim 1** after what the layer holds and returns
# the layer's full `(c_kv, k_pe)`; when it is never given a `k_pe`, the second item is `None`. `seq_len` is the
# cached length of layer 0 (0 when empty); `nbytes()` the bytes of every cached tensor (`numel · element_size`).
#
# **The attention** has no positions and no biases. Keys: `W_q.weight (H·hd, D)`, `W_dkv.weight (d_c, D)`,
# `W_uk.weight (H·hd, d_c)`, `W_uv.weight (H·hd, d_c)`, `W_o.weight (D, H·hd)`; keep the constructor arguments
# as attributes `d_model`, `n_heads`, `head_dim`, `kv_lora_rank` (exercise 2 reads them). For `x (B, T, D)`:
# the latent `c = W_dkv(x)` `(B, T, d_c)` is the only thing that goes into the cache (slot `layer_idx`); keys
# and values of every head are rebuilt from all latents the layer then holds, `W_uk(c_all)` and `W_uv(c_all)`;
# each head attends with scale `1/√hd`, the heads are merged and `W_o` maps back to `(B, T, D)`.

# %% tags=["solution:13.SimpleMLA"]
class LatentCache:
    """Per-layer latents (B, T, d_c) and rope keys (B, T, d_R), appended on dim 1."""

    def __init__(self, n_layers):
        ### BEGIN SOLUTION
        self.c_kv = [None] * n_layers
        self.k_pe = [None] * n_layers
        ### END SOLUTION

    def update(self, layer_idx, c_kv, k_pe=None):
        ### BEGIN SOLUTION
        if self.c_kv[layer_idx] is not None:
            c_kv = torch.cat([self.c_kv[layer_idx], c_kv], dim=1)
            if k_pe is not None:
                k_pe = torch.cat([self.k_pe[layer_idx], k_pe], dim=1)
        self.c_kv[layer_idx], self.k_pe[layer_idx] = c_kv, k_pe
        return c_kv, k_pe
        ### END SOLUTION

    @property
    def seq_len(self):
        ### BEGIN SOLUTION
        return 0 if self.c_kv[0] is None else self.c_kv[0].shape[1]
        ### END SOLUTION

    def nbytes(self):
        ### BEGIN SOLUTION
        return sum(t.numel() * t.element_size() for t in self.c_kv + self.k_pe if t is not None)
        ### END SOLUTION


class SimpleMLA(nn.Module):
    """Latent attention without positions: only c = W_dkv(x) is cached."""

    def __init__(self, d_model, n_heads, head_dim, kv_lora_rank):
        super().__init__()
        ### BEGIN SOLUTION
        self.d_model, self.n_heads, self.head_dim, self.kv_lora_rank = d_model, n_heads, head_dim, kv_lora_rank
        self.W_q = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.W_dkv = nn.Linear(d_model, kv_lora_rank, bias=False)
        self.W_uk = nn.Linear(kv_lora_rank, n_heads * head_dim, bias=False)
        self.W_uv = nn.Linear(kv_lora_rank, n_heads * head_dim, bias=False)
        self.W_o = nn.Linear(n_heads * head_dim, d_model, bias=False)
        ### END SOLUTION

    def forward(self, x, mask, cache=None, layer_idx=0):
        ### BEGIN SOLUTION
        B, T, _ = x.shape
        c = self.W_dkv(x)
        if cache is not None:
            c, _ = cache.update(layer_idx, c)
        S = c.shape[1]
        q = self.W_q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.W_uk(c).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.W_uv(c).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.W_o(out.transpose(1, 2).reshape(B, T, -1))
        ### END SOLUTION


# %% tags=["tests:13.SimpleMLA"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("13.SimpleMLA")  # noqa: E702
### END HIDDEN TESTS
c = LatentCache(2)
assert c.seq_len == 0 and c.nbytes() == 0, "an empty cache has length 0 and holds 0 bytes"
a, b = torch.randn(1, 3, 6), torch.randn(1, 2, 6)
c.update(0, a)
got, pe = c.update(0, b)
assert got.shape == (1, 5, 6) and torch.equal(got, torch.cat([a, b], 1)) and pe is None, "append on dim 1"
assert c.seq_len == 5 and c.nbytes() == 5 * 6 * 4, f"seq_len {c.seq_len}, nbytes {c.nbytes()}"
torch.manual_seed(0)
mla = SimpleMLA(32, 4, 8, 6).eval()
assert {k: tuple(v.shape) for k, v in mla.state_dict().items()} == {
    "W_q.weight": (32, 32), "W_dkv.weight": (6, 32), "W_uk.weight": (32, 6), "W_uv.weight": (32, 6),
    "W_o.weight": (32, 32)}, "state_dict keys and shapes"
x = torch.randn(2, 7, 32)
cache = LatentCache(1)
with torch.no_grad():
    full = mla(x, causal_mask(7))
    steps = [mla(x[:, :4], causal_mask(4), cache=cache)] + [mla(x[:, i:i + 1], None, cache=cache) for i in range(4, 7)]
gap = (torch.cat(steps, 1) - full).abs().max().item()
assert gap < 1e-5, f"prefill + single-token steps differ from the full forward by {gap:.2e}"
assert cache.c_kv[0].shape == (2, 7, 6), f"the cache holds only the latent (2, 7, 6); got {tuple(cache.c_kv[0].shape)}"
print(f"max |cached - full| = {gap:.1e}; cache: {cache.nbytes()} bytes for 7 tokens")
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — absorption (5 points)
#
# ```python
# def absorb_mla_weights(mla: SimpleMLA) -> tuple[Tensor, Tensor]: ...   # A, Bo, each (H, D, d_c)
# def absorbed_forward(mla: SimpleMLA, x: Tensor, c_all: Tensor, mask) -> Tensor: ...   # (B, T, D)
# ```
#
# The contract is a property, the algebra is yours. `A[h]` `(D, d_c)` is head `h`'s score as a bilinear form:
# for every token vector `x_i` (all `D` dims) and latent `c_j`, `x_i @ A[h] @ c_j` equals the raw score
# `q_{h,i} · k_{h,j}` that `SimpleMLA` computes for head `h` (before the `1/√hd` scale). `Bo[h]` `(D, d_c)` maps a
# latent context `lat` of head `h` to that head's contribution to the output: `Bo[h] @ lat` equals what `W_o`
# makes of head `h`'s context `W_uv`-rebuilt from `lat` (the other heads' columns of `W_o` seeing zeros). Which
# rows and columns of which weights form head `h`'s piece is for you to work out from `SimpleMLA`; the check runs
# the float64 example of the lesson, where a plausible-looking shortcut is off by hundreds.
#
# `absorbed_forward` computes the same attention **without ever rebuilding keys or values**: for the queries
# `x (B, T, D)` and the latents `c_all (B, S, d_c)` they may read, score each head's query against the latents
# through `A[h]` (scaled as `SimpleMLA` scales), take the masked softmax over `j`, weight the **latents**
# themselves (a latent context per head, `(B, H, T, d_c)`), and sum over heads what `Bo[h]` makes of it. The
# result must equal `mla(x, mask)` when `c_all = mla.W_dkv(x)`, and must follow the module's **current** weights
# on every call. Calling `mla.W_uk` or `mla.W_uv` (or multiplying the latents by their weights) rebuilds
# per-head keys/values: the grader checks that your function does not.

# %% tags=["solution:13.absorb"]
def absorb_mla_weights(mla):
    """A (H, D, d_c): head h's score as a bilinear form; Bo (H, D, d_c): head h's latent context to the output."""
    ### BEGIN SOLUTION
    H, hd = mla.n_heads, mla.head_dim
    wq = mla.W_q.weight.view(H, hd, -1)
    wuk = mla.W_uk.weight.view(H, hd, -1)
    wuv = mla.W_uv.weight.view(H, hd, -1)
    wo = mla.W_o.weight.view(-1, H, hd).permute(1, 0, 2)
    return wq.transpose(1, 2) @ wuk, wo @ wuv
    ### END SOLUTION


def absorbed_forward(mla, x, c_all, mask):
    """SimpleMLA's attention in latent space: (B, T, D) queries over (B, S, d_c) latents -> (B, T, D)."""
    ### BEGIN SOLUTION
    A, Bo = absorb_mla_weights(mla)
    q_lat = torch.einsum("btd,hdc->bhtc", x, A)
    scores = torch.einsum("bhtc,bsc->bhts", q_lat, c_all) / math.sqrt(mla.head_dim)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lat = torch.einsum("bhts,bsc->bhtc", torch.softmax(scores, dim=-1), c_all)
    return torch.einsum("bhtc,hdc->btd", lat, Bo)
    ### END SOLUTION


# %% tags=["tests:13.absorb"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("13.absorb")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
m64 = SimpleMLA(32, 4, 8, 6).double().eval()
x64 = torch.randn(2, 5, 32, dtype=torch.float64)
A, Bo = absorb_mla_weights(m64)
assert A.shape == (4, 32, 6) and Bo.shape == (4, 32, 6), f"A {tuple(A.shape)}, Bo {tuple(Bo.shape)}: (H, D, d_c)"
with torch.no_grad():
    gap = (absorbed_forward(m64, x64, m64.W_dkv(x64), causal_mask(5)) - m64(x64, causal_mask(5))).abs().max().item()
assert gap < 1e-10, f"absorbed and naive differ by {gap:.2e} in float64"
print(f"max |absorbed - naive| = {gap:.1e} (float64)")
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `DeepSeekMLA` (7 points)
#
# ```python
# class DeepSeekMLA(nn.Module):
#     def __init__(self, d_model, n_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
#                  v_head_dim, rope_theta=10000.0, rope_interleave=True, rms_norm_eps=1e-6): ...
#     def forward(self, x, positions, mask, cache=None, layer_idx=0, absorb=False) -> Tensor: ...
# ```
#
# DeepSeek-V3's attention, with the parameter names of `transformers`' `DeepseekV3Attention` so that its
# `state_dict()` loads with `strict=True`. With `d_nope = qk_nope_head_dim`, `d_R = qk_rope_head_dim`,
# `d_c = kv_lora_rank`, `d_v = v_head_dim` and no biases anywhere:
#
# | key | shape |
# |---|---|
# | `q_proj.weight` (only when `q_lora_rank is None`) | `(H·(d_nope+d_R), D)` |
# | `q_a_proj.weight`, `q_a_layernorm.weight`, `q_b_proj.weight` (otherwise) | `(q_lora_rank, D)`, `(q_lora_rank,)`, `(H·(d_nope+d_R), q_lora_rank)` |
# | `kv_a_proj_with_mqa.weight` | `(d_c + d_R, D)` |
# | `kv_a_layernorm.weight` | `(d_c,)` |
# | `kv_b_proj.weight` | `(H·(d_nope+d_v), d_c)` |
# | `o_proj.weight` | `(D, H·d_v)` |
#
# `forward` takes `x (B, T, D)`, the absolute `positions` of the new tokens (long, `(T,)`), a boolean `mask`
# `(T, T_total)` or `None`, and returns `(B, T, D)`:
#
# - **queries**: `q_proj(x)`, or with query compression `q_b_proj(q_a_layernorm(q_a_proj(x)))` (both layernorms
#   are RMSNorms with `rms_norm_eps`); per head the first `d_nope` dims are `q_nope`, the last `d_R` are `q_pe`;
# - **latent and rope key**: `kv_a_proj_with_mqa(x)` splits into `c_kv` (first `d_c`) and `k_pe` (last `d_R`);
#   only `c_kv` is normalised by `kv_a_layernorm`; `k_pe` is **one** head shared by all query heads;
# - **RoPE** (base `rope_theta`) on `q_pe` and `k_pe` only, at `positions`: interleaved pairs `(2i, 2i+1)` when
#   `rope_interleave`, half-split pairs `(i, i + d_R/2)` otherwise;
# - **cache**: `cache.update(layer_idx, c_kv, k_pe)` with the normalised `c_kv (B, T, d_c)` and the rotated
#   `k_pe (B, T, d_R)`; attend over everything it returns;
# - **keys, values, scores**: `kv_b_proj(c_kv)` gives, **per head**, `d_nope` key dims followed by `d_v` value dims;
#   a head's raw score is `q_nope·k_nope + q_pe·k_pe`, scaled before the masked softmax; weighted sum of values,
#   heads merged, `o_proj`;
# - **the scale is your decision**: the module must equal `transformers`' `DeepseekV3Attention` (default RoPE, no
#   YaRN) loaded with the same weights, and the grader compares with it on configurations where `d_nope`, `d_R`
#   and `d_v` differ, so only one choice passes. Think about which vectors' dot product the score is;
# - **`absorb=True`**: the same result computed in latent space — map `q_nope` through each head's key rows of
#   `kv_b_proj.weight`, score against `c_kv` directly (plus the rope part), and map the latent context out with
#   the head's value rows. It must **never** build per-head keys or values from `c_kv`: the grader makes
#   `kv_b_proj` unusable as a module in this path and scales the weights so that such keys would overflow float32.

# %% tags=["solution:13.DeepSeekMLA"]
class DeepSeekMLA(nn.Module):
    """DeepSeek-V3 multi-head latent attention (DeepseekV3Attention's parameter names)."""

    def __init__(self, d_model, n_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                 v_head_dim, rope_theta=10000.0, rope_interleave=True, rms_norm_eps=1e-6):
        super().__init__()
        ### BEGIN SOLUTION
        self.n_heads, self.q_lora_rank, self.kv_lora_rank = n_heads, q_lora_rank, kv_lora_rank
        self.d_nope, self.d_rope, self.d_v = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.rope_theta, self.rope_interleave = rope_theta, rope_interleave
        qk = qk_nope_head_dim + qk_rope_head_dim
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=False)
            self.q_a_layernorm = L11.RMSNorm(q_lora_rank, rms_norm_eps)
            self.q_b_proj = nn.Linear(q_lora_rank, n_heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = L11.RMSNorm(kv_lora_rank, rms_norm_eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, d_model, bias=False)
        ### END SOLUTION

    def forward(self, x, positions, mask, cache=None, layer_idx=0, absorb=False):
        ### BEGIN SOLUTION
        B, T, _ = x.shape
        H, dn, dr, dv = self.n_heads, self.d_nope, self.d_rope, self.d_v
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, dn + dr).transpose(1, 2)
        q_nope, q_pe = q[..., :dn], q[..., dn:]
        kv_a = self.kv_a_proj_with_mqa(x)
        c_kv, k_pe = self.kv_a_layernorm(kv_a[..., :self.kv_lora_rank]), kv_a[..., self.kv_lora_rank:]
        cos, sin = L11.rope_cos_sin(L11.rope_inv_freq(dr, self.rope_theta), positions)
        rope = L11.apply_rope_interleaved if self.rope_interleave else L11.apply_rope
        q_pe, k_pe = rope(q_pe, cos, sin), rope(k_pe, cos, sin)
        if cache is not None:
            c_kv, k_pe = cache.update(layer_idx, c_kv, k_pe)
        S = c_kv.shape[1]
        scores = q_pe @ k_pe[:, None].transpose(-2, -1)
        w = self.kv_b_proj.weight.view(H, dn + dv, self.kv_lora_rank)
        if absorb:
            q_lat = torch.einsum("bhtn,hnc->bhtc", q_nope, w[:, :dn])
            scores = scores + q_lat @ c_kv[:, None].transpose(-2, -1)
        else:
            kv = self.kv_b_proj(c_kv).view(B, S, H, dn + dv).transpose(1, 2)
            k_nope, v = kv[..., :dn], kv[..., dn:]
            scores = scores + q_nope @ k_nope.transpose(-2, -1)
        scores = scores / math.sqrt(dn + dr)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        if absorb:
            out = torch.einsum("bhtc,hvc->bhtv", p @ c_kv[:, None], w[:, dn:])
        else:
            out = p @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * dv))
        ### END SOLUTION


# %% tags=["tests:13.DeepSeekMLA"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("13.DeepSeekMLA")  # noqa: E702
### END HIDDEN TESTS
sizes = dict(d_model=64, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
torch.manual_seed(0)
ds = DeepSeekMLA(q_lora_rank=24, **sizes).eval()
keys = {k: tuple(v.shape) for k, v in ds.state_dict().items()}
assert keys["kv_a_proj_with_mqa.weight"] == (24, 64) and keys["kv_b_proj.weight"] == (128, 16), keys
assert "q_a_layernorm.weight" in keys and "q_proj.weight" not in keys, "query compression: q_a_proj, q_a_layernorm, q_b_proj"
xd = torch.randn(2, 9, 64)
cache = LatentCache(1)
with torch.no_grad():
    full = ds(xd, torch.arange(9), causal_mask(9))
    absorbed = ds(xd, torch.arange(9), causal_mask(9), absorb=True)
    shifted = ds(xd, torch.arange(9) + 5, causal_mask(9))
    steps = [ds(xd[:, :5], torch.arange(5), causal_mask(5), cache=cache)]
    steps += [ds(xd[:, i:i + 1], torch.arange(i, i + 1), None, cache=cache, absorb=True) for i in range(5, 9)]
for name, other in [("absorb=True", absorbed), ("positions + 5", shifted), ("cached decoding", torch.cat(steps, 1))]:
    gap = (other - full).abs().max().item()
    assert gap < 1e-5, f"{name} differs from the full naive forward by {gap:.2e}"
assert cache.c_kv[0].shape == (2, 9, 16) and cache.k_pe[0].shape == (2, 9, 8), "cache only c_kv and the shared k_pe"
print("absorbed, shifted and cached outputs equal the naive full forward")
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — cache size per token (3 points)
#
# ```python
# def attn_cache_elems_per_token(kind, n_layers, n_heads=0, n_kv_heads=0, head_dim=0, kv_lora_rank=0,
#                                qk_rope_head_dim=0, k_head_dim=None, v_head_dim=None) -> int
# ```
#
# The number of cached elements for one token of one sequence, over all layers, for `kind` = `"mha"` (every
# head caches a key of width `dk` and a value of width `dv`), `"gqa"` (`n_kv_heads` shared key/value heads),
# `"mqa"` (one shared key/value head) or `"mla"` (the latent and the shared rope key). `dk` and `dv` default to
# `head_dim` unless `k_head_dim` / `v_head_dim` are given. Return an `int`.

# %% tags=["solution:13.mla_memory"]
def attn_cache_elems_per_token(kind, n_layers, n_heads=0, n_kv_heads=0, head_dim=0, kv_lora_rank=0,
                               qk_rope_head_dim=0, k_head_dim=None, v_head_dim=None):
    """Cached elements per token and sequence, all layers."""
    ### BEGIN SOLUTION
    dk = head_dim if k_head_dim is None else k_head_dim
    dv = head_dim if v_head_dim is None else v_head_dim
    per_layer = {"mha": n_heads * (dk + dv), "gqa": n_kv_heads * (dk + dv), "mqa": dk + dv,
                 "mla": kv_lora_rank + qk_rope_head_dim}[kind.lower()]
    return int(n_layers * per_layer)
    ### END SOLUTION


# %% tags=["tests:13.mla_memory"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("13.mla_memory")  # noqa: E702
### END HIDDEN TESTS
tiny_mla = attn_cache_elems_per_token("mla", 4, kv_lora_rank=64, qk_rope_head_dim=16)
tiny_gqa = attn_cache_elems_per_token("gqa", 4, n_heads=4, n_kv_heads=2, head_dim=32)
assert tiny_mla == 4 * (64 + 16), f"a 4-layer MLA model with d_c 64 and d_R 16: expected {4 * 80}, got {tiny_mla}"
assert tiny_gqa == 4 * 2 * 2 * 32, f"4 layers x 2 KV heads x (K + V) x 32: expected 512, got {tiny_gqa}"
print(f"per token: MLA {tiny_mla}, GQA {tiny_gqa} elements")
print("visible tests passed")

# %% [markdown]
# ## Putting it together
#
# Not graded: your `DeepSeekMLA` with DeepSeek-V3's real sizes, built on the `meta` device (no memory is
# allocated), and your cache filled with tensors of V3's cached shapes for 61 layers — the bytes your cache
# reports against your formula.

# %%
v3 = dict(d_model=7168, n_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
          qk_rope_head_dim=64, v_head_dim=128)
with torch.device("meta"):
    big = DeepSeekMLA(**v3)
for k, v in big.state_dict().items():
    print(f"{k:28s} {tuple(v.shape)}")
v3_cache = LatentCache(61)
for layer in range(61):
    v3_cache.update(layer, torch.zeros(1, 4, 512, dtype=torch.bfloat16), torch.zeros(1, 4, 64, dtype=torch.bfloat16))
per_token = v3_cache.nbytes() // 4
formula = 2 * attn_cache_elems_per_token("mla", 61, kv_lora_rank=512, qk_rope_head_dim=64)
print(f"DeepSeek-V3 latent cache: {per_token:,} bytes per token (bf16) from the cache object, {formula:,} from the formula")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
