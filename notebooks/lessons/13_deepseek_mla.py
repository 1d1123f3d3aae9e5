# %% [markdown]
# # Unit 13 — DeepSeek multi-head latent attention (MLA)
#
# Unit 12 made decoding fast with a KV cache and made the cache smaller by sharing key/value heads (GQA,
# MQA). DeepSeek-V2 and V3 go further with **multi-head latent attention**: every head keeps its own keys and
# values, yet the cache stores one short **latent** vector per token from which all of them are rebuilt. This
# lesson builds MLA step by step and proves every claim numerically:
#
# 1. motivation: the cache at long context, and low-rank structure in real keys and values (against controls);
# 2. `SimpleMLA` without positions: down-projection, latent, up-projections, a latent-only cache;
# 3. absorption: the per-head algebra, when it pays, and a popular wrong form;
# 4. why RoPE breaks absorption;
# 5. decoupled RoPE: a per-head `q_pe`, one shared `k_pe`, and the scale;
# 6. DeepSeek-V3's layout: query compression, `kv_a_proj_with_mqa`, RMSNorm on the latent, `kv_b_proj`;
# 7. cached decoding with `(c_KV, k_pe)` and the absorbed decode path (and a decode driver to debug);
# 8. memory: MHA, GQA, MQA and MLA side by side, DeepSeek-V3's real sizes; bytes read and multiply–adds per cached
#    token, and why absorbed decoding is multi-query attention over the latent;
# 9. parity with `transformers`' `DeepseekV3Attention` for both RoPE layouts.
#
# The finished pieces come from `llmcourse.models.deepseek_mla`; the exercise notebook
# (`exercises/13_deepseek_mla/13_deepseek_mla.ipynb`) asks you to write the latent cache, `SimpleMLA`, the
# absorbed attention, `DeepSeekMLA` and the cache-size formula yourself.
#
# Cells marked **Spot the bug** show a mistake from popular write-ups: run the buggy cell, see which property
# breaks, then repair it in the cell marked **Your fix** and run the self-check below it.

# %%
import time

import torch
from tqdm.auto import tqdm

import llmcourse
from llmcourse.models.deepseek_mla import (
    DEEPSEEK_V3_MLA,
    DeepSeekMLA,
    LatentCache,
    SimpleMLA,
    absorb_mla_weights,
    absorbed_forward,
    mla_param_count,
)
from llmcourse.models.llama3 import GroupedQueryAttention, RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq
from llmcourse.nn.kv_cache import KV_PRESETS, attn_cache_elems_per_token, kv_cache_bytes, mla_cache_bytes
from llmcourse.nn.masks import causal_mask
from llmcourse.viz import mla as viz

cfg = llmcourse.setup_notebook("13")
cfg

# %% [markdown]
# ## 1. Motivation: the cache at long context, and low rank in keys and values
#
# Recall unit 12's formula: a cache holds `2 · L · KV · hd` numbers per token. For a real model at a long
# context this overtakes the weights themselves:

# %%
p = KV_PRESETS["Llama-3-8B"]
for n_tokens in (8192, 131072):
    cache_b = kv_cache_bytes(p["n_layers"], p["n_kv_heads"], p["head_dim"], n_tokens)
    print(f"Llama-3-8B (GQA, {p['n_kv_heads']} KV heads), bf16, {n_tokens:>7,} tokens: cache {cache_b / 2**30:6.2f} GiB, "
          f"weights {2 * p['n_params'] / 2**30:.2f} GiB")

# %% [markdown]
# GQA shrinks the cache by dropping heads: query heads in a group are forced to read the same keys. MLA keeps a
# key and a value **per head** but writes them, stacked over heads, as a fixed linear map applied to a much
# shorter vector. Is that plausible? Take the course's trained character Llama (unit 11), run Shakespeare through
# it, and collect each layer's keys and values for every token (all KV heads side by side, before RoPE). The
# singular values of that token × feature matrix say how many directions carry the signal. A count alone proves
# little, so it comes with two controls on the **same text**: an untrained Llama of the same shape (seeded random
# initialisation), and Gaussian noise of the same size (what "no structure" looks like).

# %%
from llmcourse.models.llama3 import Llama3Model  # noqa: E402
from llmcourse.train.llama_char import load_llama_char_tiny  # noqa: E402

llama, tok = load_llama_char_tiny(retrain=False)
text = llmcourse.load_text("tinyshakespeare")[: 8 * llama.cfg.context_length]
ids = torch.tensor(tok.encode(text)).view(8, -1)
torch.manual_seed(0)
untrained = Llama3Model(llama.cfg).eval()       # same shape, random initialisation, never trained


def kv_directions(model, ids, share):
    """Per layer: how many singular directions of the centred (tokens × [keys | values]) matrix hold `share`."""
    captured, hooks = {}, []
    for i, layer in enumerate(model.layers):
        for name in ("k_proj", "v_proj"):
            hooks.append(getattr(layer.self_attn, name).register_forward_hook(
                lambda m, inp, out, key=(i, name): captured.__setitem__(key, out.detach().reshape(-1, out.shape[-1]))))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    counts = []
    for i in range(len(model.layers)):
        kv = torch.cat([captured[(i, "k_proj")], captured[(i, "v_proj")]], dim=1)
        e = (torch.linalg.svdvals(kv - kv.mean(0)) ** 2).cumsum(0)
        counts.append(int((e / e[-1] < share).sum()) + 1)
    return counts, kv.shape


trained_90, (n_rows, width) = kv_directions(llama, ids, 0.90)
untrained_90, _ = kv_directions(untrained, ids, 0.90)
noise = torch.randn(n_rows, width, generator=torch.Generator().manual_seed(0))
e_noise = (torch.linalg.svdvals(noise - noise.mean(0)) ** 2).cumsum(0)
noise_90 = int((e_noise / e_noise[-1] < 0.90).sum()) + 1
print(f"{ids.numel():,} tokens of Shakespeare, keys and values side by side = {width} features per layer")
print(f"directions holding 90% of the variance, per layer: trained {trained_90}, untrained {untrained_90}; "
      f"Gaussian noise of the same size: {noise_90}")
fewer_everywhere = all(a < b for a, b in zip(trained_90, untrained_90))
print("the trained model needs fewer directions than the untrained one in every layer:", fewer_everywhere)

# %% [markdown]
# Read the three rows together. Noise spreads its variance over most of the features. The **untrained** model is
# already far from full rank on this text: it sees only 65 distinct symbols, and random projections of few
# distinct inputs are low rank by construction, so a small count is not in itself evidence of anything learned.
# The honest claim is the comparison: training concentrates keys and values further (the printed flag says
# whether it does in every layer of this model). Neither count shows that a model loses nothing when its keys
# and values are forced through a narrow latent; MLA does not rely on structure found after training: it builds
# the bottleneck into the architecture and trains the model with it from the start.
#
# ## 2. `SimpleMLA`: a latent-only cache, without positions
#
# Per token, MLA computes a **latent** `c = W_DKV x` of width `d_c` (DeepSeek's `kv_lora_rank`). Keys and values
# of every head are **reconstructed** from it, `k_h = W_UK,h c` and `v_h = W_UV,h c`; queries are ordinary,
# `q_h = W_Q,h x`. Only `c` is cached: `d_c` numbers per token and layer, instead of `2·H·hd`.
#
# The course's `SimpleMLA(d_model, n_heads, head_dim, kv_lora_rank)` has the five bias-free maps `W_q`, `W_dkv`,
# `W_uk`, `W_uv` and `W_o`. Its cache, `LatentCache`, appends the latents of each layer along the time axis.
# The flow and its shapes (DeepSeek's full layout, with the rope part we add in section 5):

# %% tags=["nbval-ignore-output"]
viz.show_mla_flow()

# %%
torch.manual_seed(0)
simple = SimpleMLA(d_model=64, n_heads=4, head_dim=16, kv_lora_rank=8).eval()
x = torch.randn(2, 12, 64)
cache = LatentCache(n_layers=1)
with torch.no_grad():
    full = simple(x, causal_mask(12))
    steps = [simple(x[:, :5], causal_mask(5), cache=cache)]                       # prefill 5 tokens
    steps += [simple(x[:, t:t + 1], None, cache=cache) for t in range(5, 12)]     # then one at a time
gap = (torch.cat(steps, dim=1) - full).abs().max().item()
print(f"cached decoding vs full forward: max |Δ| = {gap:.1e}")
print(f"the cache holds {tuple(cache.c_kv[0].shape)} (B, T, d_c) and nothing else: {cache.nbytes()} bytes; "
      f"multi-head K and V of the same heads would take {2 * 2 * 12 * 4 * 16 * 4} bytes")
assert gap < 1e-5 and cache.c_kv[0].shape == (2, 12, 8)

# %% [markdown]
# ## 3. Absorption: attention in latent space
#
# Decoding with a latent cache as written above rebuilds the keys and values of **every cached token** at every
# step, `W_UK c_j` and `W_UV c_j` for all `j`: that is more work than a plain KV cache, not less. The fix is
# algebra. Write one head's raw score between query token `i` and key token `j`, with the `nn.Linear` weights
# `W_Q,h (hd, D)` and `W_UK,h (hd, d_c)` (the rows of head `h`):
#
# $$ q_{h,i} \cdot k_{h,j} = (W_{Q,h} x_i)^\top (W_{UK,h} c_j) = x_i^\top \underbrace{W_{Q,h}^\top W_{UK,h}}_{A_h\ (D \times d_c)} c_j . $$
#
# The same happens on the output side: head `h`'s context is `Σ_j p_{h,ij} W_UV,h c_j = W_UV,h (Σ_j p_{h,ij} c_j)`,
# and `o_proj` applies head `h`'s piece `W_O,h` to it, so the output is `Σ_h B_h lat_{h,i}` with
# `B_h = W_O,h W_UV,h (D × d_c)` and the **latent context** `lat_{h,i} = Σ_j p_{h,ij} c_j`. Keys and values
# never exist: each head scores its query against the cached latents directly. Both matrices are **per head**,
# and the full `x` (all `D` dims) enters every head.

# %%
A, Bo = absorb_mla_weights(simple)
print(f"A: {tuple(A.shape)} (H, D, d_c), Bo: {tuple(Bo.shape)}")
torch.manual_seed(0)
m64 = SimpleMLA(32, 4, 8, 6).double()
with torch.no_grad():
    for name in ("W_q", "W_dkv", "W_uk", "W_uv", "W_o"):
        getattr(m64, name).weight.copy_(torch.randn(getattr(m64, name).weight.shape, dtype=torch.float64))
x64 = torch.randn(2, 5, 32, dtype=torch.float64)
with torch.no_grad():
    naive64 = m64(x64, causal_mask(5))
    absorbed64 = absorbed_forward(m64, x64, m64.W_dkv(x64), causal_mask(5))
absorb_gap = (absorbed64 - naive64).abs().max().item()
print(f"float64, randn weights: max |absorbed − naive| = {absorb_gap:.1e} (outputs of size up to "
      f"{naive64.abs().max().item():.0f})")
assert absorb_gap < 1e-9

# %% [markdown]
# **When does it pay?** Count the multiply–adds of one decoded token reading `S` latents. Both paths compute the
# new latent (`D·d_c`). The naive path maps the query (`D·H·hd`), multiplies **every** cached latent by `W_UK`
# and `W_UV` (`2·S·d_c·H·hd`), scores and mixes (`2·S·H·hd`), and maps the heads out with `W_O` (`H·hd·D`). The
# absorbed path maps the query into latent space once (`D·H·d_c`, through `A`), spends `2·S·H·d_c` on scores and
# the latent context, and maps the `H` latent contexts out with `Bo` (`H·d_c·D`): its output map works on
# `d_c`-wide contexts, so it costs `d_c/hd` times the naive one. Only the terms in `S` grow with the cache.
# Prefill is different:
# there every token is new, keys are needed once anyway, and the naive path (with ordinary attention kernels)
# is the natural choice. The widget compares the two paths for one decoded token as the cache grows, and the
# accuracy of a popular wrong form discussed next.

# %% tags=["nbval-ignore-output"]
viz.show_absorption_check()

# %%
d_, h_, hd_, dc_ = 128, 4, 32, 64
for n_cached in (16, 4096):
    s_ = n_cached + 1
    terms = {"naive": {"latent": d_ * dc_, "query": d_ * h_ * hd_, "rebuild K,V": 2 * s_ * dc_ * h_ * hd_,
                       "scores+mix": 2 * s_ * h_ * hd_, "output W_O": h_ * hd_ * d_},
             "absorbed": {"latent": d_ * dc_, "query via A": d_ * h_ * dc_, "scores+mix": 2 * s_ * h_ * dc_,
                          "output via Bo": h_ * dc_ * d_}}
    for path, parts in terms.items():
        print(f"S = {s_:5d} {path:9s}: " + ", ".join(f"{k} {v:,}" for k, v in parts.items()))
        assert sum(parts.values()) == viz.decode_macs(n_cached, d_, h_, hd_, dc_)[path]
for n_cached in (16, 256, 4096):
    c = viz.decode_macs(n_cached, d_model=d_, n_heads=h_, head_dim=hd_, kv_lora_rank=dc_)
    print(f"{n_cached:5d} cached tokens: naive {c['naive']:>12,} multiply–adds, absorbed {c['absorbed']:>10,} "
          f"({c['naive'] / c['absorbed']:.1f}×)")

# %% [markdown]
# ### Spot the bug: "absorbing" the full matrices
#
# A widespread implementation multiplies the **full** weight matrices, `W_q.weight @ W_uk.weight`, reshapes
# the product into heads, and applies head `h`'s slice to head `h`'s slice of the **input** `x`. It has the
# right shapes whenever `D = H·hd`, and a model built on it still trains, but it is a different bilinear form:
# it is not the attention the naive module computes. Run it and compare the scores with the naive ones:

# %%
def naive_scores(mla, x, c):
    """Raw per-head scores q·k, (B, H, T, S), from rebuilt keys (the reference we must reproduce)."""
    b, t, _ = x.shape
    q = mla.W_q(x).view(b, t, mla.n_heads, mla.head_dim).transpose(1, 2)
    k = mla.W_uk(c).view(b, c.shape[1], mla.n_heads, mla.head_dim).transpose(1, 2)
    return q @ k.transpose(-2, -1)


def absorbed_scores_buggy(mla, x, c):
    b, t, _ = x.shape
    merged = (mla.W_q.weight @ mla.W_uk.weight).view(mla.n_heads, mla.head_dim, -1)   # (H, hd, d_c)
    x_heads = x.view(b, t, mla.n_heads, mla.head_dim).transpose(1, 2)                  # x cut into heads
    return torch.einsum("bhte,hec,bsc->bhts", x_heads, merged, c)


with torch.no_grad():
    c64 = m64.W_dkv(x64)
    wrong_gap = (absorbed_scores_buggy(m64, x64, c64) - naive_scores(m64, x64, c64)).abs().max().item()
print(f"head-split 'absorption': scores differ from the naive ones by up to {wrong_gap:.0f}")

# %% [markdown]
# **Your fix.** Rewrite `absorbed_scores` so that it returns the naive raw scores `(B, H, T, S)` **without**
# building per-head keys: map the query tokens into latent space per head and score them against `c`. Then run
# the self-check.

# %%
def absorbed_scores(mla, x, c):
    # TODO: absorb per head; the whole x (all D dims) enters every head
    b, t, _ = x.shape
    merged = (mla.W_q.weight @ mla.W_uk.weight).view(mla.n_heads, mla.head_dim, -1)
    x_heads = x.view(b, t, mla.n_heads, mla.head_dim).transpose(1, 2)
    return torch.einsum("bhte,hec,bsc->bhts", x_heads, merged, c)


def self_check_absorbed_scores(fn=None):
    fn = fn or absorbed_scores
    g = torch.Generator().manual_seed(1)
    m = SimpleMLA(32, 4, 8, 6).double()
    with torch.no_grad():
        for w in m.parameters():
            w.copy_(torch.randn(w.shape, generator=g, dtype=torch.float64))
        xs = torch.randn(2, 7, 32, generator=g, dtype=torch.float64)
        cs = m.W_dkv(xs)
        try:
            ok = torch.allclose(fn(m, xs, cs), naive_scores(m, xs, cs), atol=1e-8)
        except Exception as exc:  # noqa: BLE001 - a learner's error is a "not yet", never a crash
            print(f"✗ not yet: {type(exc).__name__}: {exc}")
            return False
    print("✓ absorbed scores equal the naive ones" if ok else
          "✗ not yet: the scores must equal q·k of the naive module for every head")
    return ok


self_check_absorbed_scores();

# %% jupyter={"source_hidden": true}
# Reference fix, in words: for each head h take the rows h·hd … (h+1)·hd − 1 of W_q.weight and of W_uk.weight,
# form A_h = W_q,hᵀ W_uk,h of shape (D, d_c), map every query token through it (x_i A_h, all D dims of x), and take
# the dot product with each cached latent c_j. The course's absorb_mla_weights returns exactly these A_h; the
# self-check below runs on it.
def scores_from_library(mla, x, c):
    per_head_a, _ = absorb_mla_weights(mla)
    return torch.einsum("btd,hdc,bsc->bhts", x, per_head_a, c)


assert self_check_absorbed_scores(scores_from_library)

# %% [markdown]
# One more trap from the same family: computing `A` and `Bo` once and storing them on the module. After an
# optimizer step the stored matrices describe the **old** weights. The course's functions recompute them from
# the current weights on every call (a cache of them must be invalidated whenever the weights change):

# %%
with torch.no_grad():
    before = absorbed_forward(m64, x64, m64.W_dkv(x64), causal_mask(5))
    m64.W_uk.weight.mul_(1.1)                                    # "an optimizer step"
    after = absorbed_forward(m64, x64, m64.W_dkv(x64), causal_mask(5))
    stale_gap = (after - m64(x64, causal_mask(5))).abs().max().item()
print(f"after the weight change: max |absorbed − naive| = {stale_gap:.1e}; the output moved by "
      f"{(after - before).abs().max().item():.2f}")

# %% [markdown]
# ## 4. Why RoPE breaks absorption
#
# Add RoPE to the keys and queries of section 3. Query `i` is rotated by `R_i`, key `j` by `R_j`, and their
# product becomes
#
# $$ (R_i W_{Q,h} x_i)^\top (R_j W_{UK,h} c_j) = x_i^\top W_{Q,h}^\top R_{j-i}\, W_{UK,h}\, c_j , $$
#
# since `R_iᵀ R_j = R_{j−i}` (unit 11). A rotation that depends on the **pair** of positions now sits between
# `W_Q,h` and `W_UK,h`: no single `A_h` can be precomputed; there would be one per offset. The slider shows the
# effective matrix for one head as the offset changes; the decoupled design of the next section keeps the
# position-free product fixed.

# %% tags=["nbval-ignore-output"]
viz.show_rope_absorption()

# %%
r = viz.rope_absorption([0, 1, 8, 64])
for o, ch in zip(r["offsets"], r["change"]):
    print(f"offset j − i = {o:2d}: ‖W_Qᵀ R W_UK − W_Qᵀ W_UK‖ / ‖W_Qᵀ W_UK‖ = {ch:.3f}")
# numerically: scoring rotated keys through ONE precomputed matrix fails unless the offset is 0
g = torch.Generator().manual_seed(3)
wq, wuk = torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randn(8, 6, generator=g, dtype=torch.float64)
xi, cj = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
cos, sin = rope_cos_sin(rope_inv_freq(8, 10000.0), torch.tensor([3, 10]))
true_score = apply_rope(wq @ xi, cos[0].double(), sin[0].double()) @ apply_rope(wuk @ cj, cos[1].double(), sin[1].double())
one_matrix = xi @ (wq.T @ wuk) @ cj
print(f"query at 3, key at 10: true score {true_score.item():.3f}, one fixed absorbed matrix gives {one_matrix.item():.3f}")

# %% [markdown]
# ## 5. Decoupled RoPE
#
# DeepSeek's answer is to keep position information out of the part that is absorbed. Each head's query and key
# get two pieces:
#
# - `q_nope`, `k_nope` (`qk_nope_head_dim` = `d_nope` dims): the latent path, **no rotation**, absorbable;
# - `q_pe` (per head) and `k_pe` (`qk_rope_head_dim` = `d_R` dims): rotated with RoPE. `k_pe` is computed
#   directly from `x` and is **one head shared by all query heads**, so it adds only `d_R` numbers per token
#   to the cache.
#
# The score of head `h` is the sum of both dot products, `q_nope·k_nope + q_pe·k_pe`, scaled before the softmax
# by the rule of unit 03 (the inverse square root of the width of the dot product; which width that is here, with
# three different head widths around, is a decision the exercise leaves to you). Since only `q_pe` and `k_pe`
# are rotated, scores depend on positions only through `j − i`: shifting every position leaves the output
# unchanged. The course's `DeepSeekMLA` implements this; check the shift and the absorbed path:

# %%
torch.manual_seed(0)
tiny_kw = dict(d_model=128, n_heads=4, q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
               v_head_dim=32)
mla = DeepSeekMLA(**tiny_kw).eval()
xt = torch.randn(2, 16, 128)
with torch.no_grad():
    base = mla(xt, torch.arange(16), causal_mask(16))
    shifted = mla(xt, torch.arange(16) + 1000, causal_mask(16))
    absorbed = mla(xt, torch.arange(16), causal_mask(16), absorb=True)
print(f"positions + 1000: max |Δ| = {(shifted - base).abs().max().item():.1e}")
print(f"absorb=True vs naive: max |Δ| = {(absorbed - base).abs().max().item():.1e}")

# %% [markdown]
# ## 6. DeepSeek-V3's layout
#
# The DeepSeek-V3 attention module (named as in `transformers`' `DeepseekV3Attention`, so its weights load
# unchanged):
#
# - **queries**: one `q_proj`, or with query compression `q_a_proj` (D → `q_lora_rank`) → RMSNorm
#   `q_a_layernorm` → `q_b_proj` (→ `H·(d_nope + d_R)`); compression saves parameters and activation memory in
#   training, not cache;
# - **`kv_a_proj_with_mqa`**: D → `d_c + d_R`, split into the latent `c_KV` and the shared rope key `k_pe`
#   ("with MQA": one key head for all queries);
# - **`kv_a_layernorm`**: RMSNorm on `c_KV` only; the normalised latent is what is cached (with the rotated `k_pe`);
# - **`kv_b_proj`**: `d_c → H·(d_nope + d_v)`, laid out **per head** as `[k_nope_h; v_h]`.
#
# Every shape at DeepSeek-V3's real sizes, on the `meta` device (nothing is allocated, nothing is run):

# %%
v3 = {k: v for k, v in DEEPSEEK_V3_MLA.items() if k != "n_layers"}
with torch.device("meta"):
    v3_attn = DeepSeekMLA(**v3)
for name, t in v3_attn.state_dict().items():
    print(f"{name:28s} {tuple(t.shape)}")
print(f"{mla_param_count(**v3):,} parameters per layer")

# %% [markdown]
# MLA spends parameters to save cache. At `D = 128`, four heads of 32, compare the tiny MLA above with GQA
# (two KV heads, unit 11) and plain multi-head attention with biases (`nn.MultiheadAttention`):

# %%
n_mla = sum(t.numel() for t in mla.parameters())
n_gqa = sum(t.numel() for t in GroupedQueryAttention(128, 4, 2).parameters())
n_mha = sum(t.numel() for t in torch.nn.MultiheadAttention(128, 4, bias=True).parameters())
for name, n, per_token in [("MLA", n_mla, 64 + 16), ("GQA", n_gqa, 2 * 2 * 32), ("MHA", n_mha, 2 * 4 * 32)]:
    print(f"{name}: {n:6,} parameters, caches {per_token:3d} numbers per token and layer")
assert n_mla == mla_param_count(**tiny_kw)

# %% [markdown]
# ## 7. Cached decoding and the absorbed path
#
# A small stack of four DeepSeek-style attention layers (pre-norm residual blocks, `d_c = 64`, `d_R = 16`)
# decodes through one `LatentCache`. Three properties: cached decoding equals the full forward; the absorbed
# decode path equals the naive one; and the cache holds exactly `n_layers · (d_c + d_R)` numbers per token.

# %%
class TinyMLAStack(torch.nn.Module):
    """Four pre-norm residual blocks of DeepSeekMLA (attention only), for cache experiments."""

    def __init__(self, n_layers=4, **kw):
        super().__init__()
        self.norms = torch.nn.ModuleList(RMSNorm(kw["d_model"], 1e-6) for _ in range(n_layers))
        self.attn = torch.nn.ModuleList(DeepSeekMLA(**kw) for _ in range(n_layers))

    def forward(self, x, cache=None, absorb=False):
        start = cache.seq_len if cache is not None else 0
        t = x.shape[1]
        pos = torch.arange(start, start + t)
        mask = causal_mask(t, start + t)
        for i, (norm, attn) in enumerate(zip(self.norms, self.attn)):
            x = x + attn(norm(x), pos, mask, cache=cache, layer_idx=i, absorb=absorb)
        return x


torch.manual_seed(0)
stack = TinyMLAStack(**tiny_kw).eval()
xs = torch.randn(1, 40, 128)
with torch.no_grad():
    full = stack(xs)
    results = {}
    for absorb in (False, True):
        cache = LatentCache(4)
        outs = [stack(xs[:, :8], cache)] + [stack(xs[:, t:t + 1], cache, absorb=absorb) for t in range(8, 40)]
        results[absorb] = ((torch.cat(outs, 1) - full).abs().max().item(), cache)
for absorb, (gap, _) in results.items():
    print(f"decode {'absorbed' if absorb else 'naive   '}: max |cached − full| = {gap:.1e}")
cache = results[True][1]
per_token = cache.nbytes() / cache.seq_len
formula = mla_cache_bytes(4, 64, 16, seq_len=1, bytes_per_elem=4)
print(f"cache of the tiny stack: {cache.nbytes():,} bytes for {cache.seq_len} tokens = {per_token:.0f} bytes per token; "
      f"formula n_layers·(d_c + d_R)·4 bytes = {formula}")
assert per_token == formula == 4 * (64 + 16) * 4

# %% [markdown]
# ### Spot the bug: a decode loop that drifts after the prompt
#
# The function below drives the same stack by hand: it prefills a prompt into a `LatentCache`, then feeds the
# remaining tokens one at a time (absorbed path), and reports the cache it filled. The rows of the prompt agree
# with the full forward; every decoded row disagrees. The module is fine (its own cached decoding above agrees);
# the bug is in the driver. Run it, read the per-row gaps, and find the line.

# %%
def drive_cached_buggy(stack, x, n_prompt, absorb=True):
    """Prompt of n_prompt tokens, then one token per step; returns (outputs (B, T, D), cache, steps taken)."""
    n_layers = len(stack.attn)
    cache = LatentCache(n_layers)
    outs, steps = [], 0
    chunks = [(0, n_prompt)] + [(t, t + 1) for t in range(n_prompt, x.shape[1])]
    for start, end in chunks:
        h = x[:, start:end]
        n_new = end - start
        positions = torch.arange(n_new)
        mask = causal_mask(n_new, start + n_new)          # bottom-right: new rows see every cached key
        for i in range(n_layers):
            h = h + stack.attn[i](stack.norms[i](h), positions, mask, cache=cache, layer_idx=i,
                                  absorb=absorb and n_new == 1)
        outs.append(h)
        steps += 1
        assert cache.seq_len == end, "the cache must hold every token fed so far"
    return torch.cat(outs, dim=1), cache, steps


def row_gaps(fn):
    with torch.no_grad():
        got, _, _ = fn(stack, xs, 8)
    return (got - full).abs().amax(dim=(0, 2))                  # max |Δ| per position


gaps = row_gaps(drive_cached_buggy)
print(f"prompt rows 0-7: max |Δ| = {gaps[:8].max().item():.1e}; decoded rows 8-39: max |Δ| = "
      f"{gaps[8:].max().item():.2f}, smallest {gaps[8:].min().item():.2f}")

# %% [markdown]
# **Your fix.** Repair `drive_cached` (one line is wrong) and run the self-check: every row must equal the full
# forward.

# %%
def drive_cached(stack, x, n_prompt, absorb=True):
    # TODO: fix the driver so that decoded rows equal the full forward
    n_layers = len(stack.attn)
    cache = LatentCache(n_layers)
    outs, steps = [], 0
    chunks = [(0, n_prompt)] + [(t, t + 1) for t in range(n_prompt, x.shape[1])]
    for start, end in chunks:
        h = x[:, start:end]
        n_new = end - start
        positions = torch.arange(n_new)
        mask = causal_mask(n_new, start + n_new)
        for i in range(n_layers):
            h = h + stack.attn[i](stack.norms[i](h), positions, mask, cache=cache, layer_idx=i,
                                  absorb=absorb and n_new == 1)
        outs.append(h)
        steps += 1
    return torch.cat(outs, dim=1), cache, steps


def self_check_driver(fn):
    try:
        g = row_gaps(fn)
    except Exception as exc:  # noqa: BLE001 - a learner's error is a "not yet", never a crash
        print(f"✗ not yet: {type(exc).__name__}: {exc}")
        return False
    ok = bool(g.max() < 1e-4)
    print("✓ every decoded row equals the full forward" if ok else
          f"✗ not yet: the first wrong row is position {int((g >= 1e-4).nonzero()[0])}")
    return ok


self_check_driver(drive_cached);

# %% jupyter={"source_hidden": true}
# Reference fix: RoPE rotates each token by its absolute position. The prompt sits at 0 … n_prompt−1, but every
# decoded token was rotated as if it were at position 0 again, so its scores against the cached (correctly
# rotated) rope keys saw the wrong offsets j − i. The positions of a chunk are start … end−1.
def drive_cached_reference(stack, x, n_prompt, absorb=True):
    cache = LatentCache(len(stack.attn))
    outs = []
    for start in [0] + list(range(n_prompt, x.shape[1])):
        end = n_prompt if start == 0 else start + 1
        h = x[:, start:end]
        for i, (norm, attn) in enumerate(zip(stack.norms, stack.attn)):
            h = h + attn(norm(h), torch.arange(start, end), causal_mask(end - start, end), cache=cache,
                         layer_idx=i, absorb=absorb and end - start == 1)
        outs.append(h)
    return torch.cat(outs, dim=1), cache, len(outs)


assert self_check_driver(drive_cached_reference)

# %% [markdown]
# Decode timing: one new token reading `S` cached tokens, naive (rebuild keys and values from every cached
# latent) against absorbed, on one layer of the tiny size. Timings depend on the machine and its load; they are
# printed, never asserted. At this tiny size fixed per-call costs blur the difference; the multiply–add counts of
# section 3 show where the trend goes.

# %%
def time_decode(layer, n_cached, absorb, repeats):
    cache_t = LatentCache(1)
    with torch.no_grad():
        layer(torch.randn(1, n_cached, 128), torch.arange(n_cached), causal_mask(n_cached), cache=cache_t)
        x1 = torch.randn(1, 1, 128)
        pos = torch.tensor([n_cached])
        best = float("inf")
        for _ in range(repeats):
            c_kv, k_pe = cache_t.c_kv[0], cache_t.k_pe[0]
            probe = LatentCache(1)
            probe.update(0, c_kv, k_pe)
            t0 = time.perf_counter()
            layer(x1, pos, None, cache=probe, absorb=absorb)
            best = min(best, time.perf_counter() - t0)
    return 1e3 * best


timings = []
for n_cached in tqdm(cfg["decode_lengths"], desc="decode timing"):
    timings.append((n_cached, time_decode(mla, n_cached, False, cfg["decode_repeats"]),
                    time_decode(mla, n_cached, True, cfg["decode_repeats"])))
for n_cached, t_naive, t_abs in timings:
    print(f"{n_cached:5d} cached tokens: naive {t_naive:.3f} ms, absorbed {t_abs:.3f} ms (best of {cfg['decode_repeats']})")

# %% [markdown]
# ## 8. Memory: MHA, GQA, MQA and MLA
#
# Elements cached per token (all layers) by design: MHA `L·H·(dk + dv)`, GQA `L·KV·(dk + dv)`, MQA `L·(dk + dv)`,
# MLA `L·(d_c + d_R)`. For DeepSeek-V3 (61 layers, `d_c = 512`, `d_R = 64`; its MHA equivalent has 128 heads
# with keys of 192 and values of 128):

# %%
L, H = DEEPSEEK_V3_MLA["n_layers"], DEEPSEEK_V3_MLA["n_heads"]
mla_elems = attn_cache_elems_per_token("mla", L, kv_lora_rank=512, qk_rope_head_dim=64)
mha_elems = attn_cache_elems_per_token("mha", L, n_heads=H, k_head_dim=192, v_head_dim=128)
print(f"MLA: {mla_elems:,} elements = {2 * mla_elems:,} bytes per token in bf16 ({2 * mla_elems / 1024:.1f} KiB)")
print(f"MHA with the same heads: {mha_elems:,} elements ({2 * mha_elems / 2**20:.2f} MiB), "
      f"{mha_elems / mla_elems:.1f}× larger")
for n_tokens in (32768, 131072):
    print(f"{n_tokens:,} tokens: MLA {mla_cache_bytes(L, 512, 64, n_tokens) / 2**30:.2f} GiB, "
          f"MHA-equivalent {2 * mha_elems * n_tokens / 2**30:.0f} GiB")
# the same number read from a cache object filled with tensors of V3's cached shapes (no V3 layer is run)
v3_cache = LatentCache(L)
for layer in range(L):
    v3_cache.update(layer, torch.zeros(1, 3, 512, dtype=torch.bfloat16), torch.zeros(1, 3, 64, dtype=torch.bfloat16))
print(f"a LatentCache with 61 layers of bf16 (1, 3, 512) + (1, 3, 64) tensors: {v3_cache.nbytes() // 3:,} bytes per token")
assert v3_cache.nbytes() // 3 == 2 * mla_elems

# %% [markdown]
# The DeepSeek-V2 paper phrases the comparison in head units: with `d_c = 4·d_h` and `d_R = d_h/2`, MLA caches
# `4.5·d_h` per layer, as much as GQA with a small number of groups. With `d_h = 128`:

# %%
d_h = 128
groups = (4 * d_h + d_h // 2) / (2 * d_h)
print(f"MLA per layer: {4 * d_h + d_h // 2} = 4.5·d_h; GQA with g groups caches 2·g·d_h, so MLA ≈ GQA with "
      f"{groups:.2f} groups — while every one of the {H} heads keeps its own keys and values")
print("course tiny models, elements per token:",
      {"DeepSeek-tiny MLA": attn_cache_elems_per_token("mla", 4, kv_lora_rank=64, qk_rope_head_dim=16),
       "Llama-tiny GQA": attn_cache_elems_per_token("gqa", 4, n_kv_heads=2, head_dim=32),
       "GPT-tiny MHA": attn_cache_elems_per_token("mha", 4, n_heads=4, head_dim=32)})

# %% tags=["nbval-ignore-output"]
viz.show_cache_comparison()

# %% [markdown]
# **Absorbed decoding is multi-query attention over the latent.** In the absorbed path every head scores its
# latent query against the same cached vector `[c_KV; k_pe]` (width `d_c + d_R`) and mixes the same `c_KV`
# (width `d_c`): one shared key head and one shared value head, as in MQA, but much wider than a normal head, and
# read by all `H` query heads. So the cache read per token shrinks, while the work per cached token does not:
# each of the `H` heads does a `(d_c + d_R)`-wide dot product and a `d_c`-wide accumulation. Per layer, per cached
# token and per decoded token, at DeepSeek-V3's sizes (bf16; the GQA row keeps V3's heads with 8 key/value
# groups):

# %%
v3s = DEEPSEEK_V3_MLA
H3, dk3, dv3 = v3s["n_heads"], v3s["qk_nope_head_dim"] + v3s["qk_rope_head_dim"], v3s["v_head_dim"]
dc3, dr3, groups3 = v3s["kv_lora_rank"], v3s["qk_rope_head_dim"], 8
rows = {"MHA": (2 * H3 * (dk3 + dv3), H3 * (dk3 + dv3)),
        f"GQA ({groups3} groups)": (2 * groups3 * (dk3 + dv3), H3 * (dk3 + dv3)),
        "MLA absorbed": (2 * (dc3 + dr3), H3 * (dc3 + dr3) + H3 * dc3)}
print(f"{'':16s} {'bytes read':>11s} {'multiply-adds':>14s} {'MACs per byte':>14s}")
for name, (n_bytes, macs) in rows.items():
    print(f"{name:16s} {n_bytes:11,} {macs:14,} {macs / n_bytes:14.1f}")
ratio_mha = rows["MLA absorbed"][1] / rows["MLA absorbed"][0] / (rows["MHA"][1] / rows["MHA"][0])
print(f"absorbed MLA does {ratio_mha:.0f}× more arithmetic per byte read than MHA")
assert rows["MLA absorbed"][0] < rows[f"GQA ({groups3} groups)"][0] and rows["MLA absorbed"][1] > rows["MHA"][1]

# %% [markdown]
# MHA does one multiply–add per two bytes it reads: decoding is bound by memory bandwidth, the arithmetic units
# wait for the cache. GQA raises the ratio by the group size. Absorbed MLA reads the least and computes the most
# per cached token (its multiply–adds even exceed MHA's, since `d_c` is wider than a head), so its ratio is the
# factor printed above higher than MHA's: the bottleneck of decoding moves from bandwidth toward compute. How far?
# Place it against a GPU's ridge point (peak FLOP/s over memory bandwidth; an H800: about 989 dense BF16 TFLOP/s
# over 3.35 TB/s):

# %%
h800_flops, h800_bytes = 989e12, 3.35e12     # H800 SXM: dense BF16 FLOP/s, HBM bytes/s (NVIDIA's data sheet)
ridge = h800_flops / h800_bytes
mla_flop_per_byte = 2 * rows["MLA absorbed"][1] / rows["MLA absorbed"][0]   # a multiply-add is 2 FLOPs
print(f"ridge point {ridge:.0f} FLOP/B; absorbed MLA with one query token per sequence: {mla_flop_per_byte:.0f} "
      f"FLOP/B, {'below' if mla_flop_per_byte < ridge else 'above'} the ridge")
assert abs(ridge - 295) < 1

# %% [markdown]
# Batching requests does not change this ratio: every request reads its own latent cache, so bytes and
# multiply–adds grow together. Only several query tokens of the **same** sequence scoring the same cache raise it
# (the drafts of multi-token prediction or speculative decoding verified in one step, unit 15): with `n` query
# tokens the cache is read once for `n` times the arithmetic.

# %% [markdown]
# A note on long contexts: DeepSeek-V3 extends its context with YaRN, which rescales the RoPE frequencies and
# multiplies the attention scale by `mscale²` (`transformers` applies it when the config's `rope_parameters`
# carry `mscale_all_dim`). The course's modules implement the default RoPE only.
#
# ## 9. Parity with `transformers`' `DeepseekV3Attention`
#
# Build `transformers`' module from a tiny config for each combination of query compression and RoPE layout,
# re-draw every weight, load its `state_dict()` into the course's `DeepSeekMLA` with `strict=True` and compare
# outputs on the same input, causal mask and positions. (In `transformers` 5.x the interleaved path returns the
# rotated slice de-interleaved and the cache holds the compressed latent; releases before 5.0 cached
# decompressed keys and values. Compare outputs, not intermediates.)

# %%
if cfg["parity"]:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    from llmcourse.models.deepseek_mla import hf_deepseek_attention_config

    small = dict(d_model=64, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    xp = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(7))
    additive = torch.zeros(9, 9).masked_fill(~causal_mask(9), float("-inf"))[None, None]
    parity = {}
    for q_rank in (None, 24):
        for interleave in (True, False):
            hf_cfg = hf_deepseek_attention_config(q_lora_rank=q_rank, rope_interleave=interleave)
            hf = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()
            g = torch.Generator().manual_seed(11)
            with torch.no_grad():
                for w in hf.parameters():
                    w.copy_(0.2 * torch.randn(w.shape, generator=g))
                cos, sin = DeepseekV3RotaryEmbedding(hf_cfg)(xp, torch.arange(9)[None].expand(2, 9))
                y_hf = hf(xp, (cos, sin), additive)[0]
                ours = DeepSeekMLA(q_lora_rank=q_rank, rope_interleave=interleave, **small).eval()
                ours.load_state_dict(hf.state_dict(), strict=True)
                wrong = DeepSeekMLA(q_lora_rank=q_rank, rope_interleave=not interleave, **small).eval()
                wrong.load_state_dict(hf.state_dict(), strict=True)
                parity[(q_rank, interleave)] = ((ours(xp, torch.arange(9), causal_mask(9)) - y_hf).abs().max().item(),
                                                (wrong(xp, torch.arange(9), causal_mask(9)) - y_hf).abs().max().item())
    for (q_rank, interleave), (ok_gap, wrong_gap) in parity.items():
        print(f"q_lora_rank={q_rank!s:>4}, rope_interleave={interleave!s:5}: max |Δ| = {ok_gap:.1e}; "
              f"with the other RoPE layout {wrong_gap:.2f}")
    assert all(ok < 1e-5 for ok, _ in parity.values())
else:
    print("parity demo skipped in this profile (it imports transformers)")

# %% [markdown]
# ## Summary
#
# - MLA caches one latent `c_KV` (`d_c` numbers) and one shared rope key `k_pe` (`d_R`) per token and layer;
#   every head's keys and values are rebuilt from the latent.
# - Absorption moves `W_UK` into the query side and `W_UV` into the output side, **per head**
#   (`A_h = W_Q,hᵀ W_UK,h`, `B_h = W_O,h W_UV,h`); multiplying the full matrices and splitting the input into
#   heads is a different model. Recompute absorbed matrices after weights change.
# - RoPE between `W_Q` and `W_UK` makes the product depend on the offset, so DeepSeek rotates only separate
#   slices, `q_pe` per head and `k_pe` shared.
# - DeepSeek-V3: optional query compression, `kv_a_proj_with_mqa`, RMSNorm on the latent only, `kv_b_proj`
#   laid out per head as `[k_nope; v]`; the course's module equals `transformers`' for both RoPE layouts.
# - The cache is `L·(d_c + d_R)` numbers per token, in DeepSeek-V3 far below MHA with the same heads.
# - Absorbed decoding is MQA over a `(d_c + d_R)`-wide latent: it reads the fewest bytes per cached token and
#   does the most arithmetic per byte, so long-context decoding leans from bandwidth toward compute.
# - Low rank in a trained model's keys and values is only evidence next to a control: an untrained model on a
#   small vocabulary is low rank too.
#
# ## Going further (optional)
#
# GQA and MLA can be compared at an equal cache budget. Write `mla_equivalent_kv_heads(kv_lora_rank,
# qk_rope_head_dim, head_dim)` returning the (fractional) number of GQA key/value heads of size `head_dim` that
# cache as many numbers per token as MLA, then use it on the course's tiny models.

# %%
def mla_equivalent_kv_heads(kv_lora_rank, qk_rope_head_dim, head_dim):
    # TODO (optional): GQA with g KV heads caches 2·g·head_dim numbers per token and layer
    raise NotImplementedError


def self_check_equivalent_heads():
    try:
        ok = (abs(mla_equivalent_kv_heads(512, 64, 128) - (512 + 64) / 256) < 1e-9
              and abs(mla_equivalent_kv_heads(64, 16, 32) - 1.25) < 1e-9)
    except NotImplementedError:
        ok = False
    print("✓ equivalent GQA heads computed" if ok else "✗ not yet: optional extension")
    return ok


self_check_equivalent_heads();
