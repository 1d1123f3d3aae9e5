"""Bug catalog of unit 13 (multi-head latent attention): one known-wrong implementation per syllabus entry.

Each mutant is the reference (:mod:`llmcourse.models.deepseek_mla`) with exactly one mistake. Named by their
outputs on the failing probe (``detect="mutant"``), except three named by a property the checks test
(``detect="detector"``): absorbed matrices stored on the module and served stale after a weight change, one rope
key per head (the width of ``kv_a_proj_with_mqa``), per-head keys/values in the cache (the cached shapes), and three
absorbed paths with the right outputs but the wrong structure (``absorbed_forward`` calling ``W_uk``/``W_uv``; a
``DeepSeekMLA`` that ignores ``absorb=True``; one that rebuilds K/V with ``F.linear``), named by the structural
probes (modules answering NaN when called, weights scaled so that a per-head key overflows float32).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from llmcourse.models.deepseek_mla import DeepSeekMLA, SimpleMLA, _masked_softmax, absorb_mla_weights
from llmcourse.models.llama3 import apply_rope, rope_cos_sin, rope_inv_freq

from ..core import bug_group

U = "13"


# ---------------------------------------------------------------- absorb


def _absorb_head_split(mla: SimpleMLA):
    """The popular wrong form: one (H·hd, d_c) product of the full matrices, cut into heads of the input."""
    h, hd = mla.n_heads, mla.head_dim
    m = (mla.W_q.weight @ mla.W_uk.weight).view(h, hd, -1)          # needs D == H·hd
    return m, absorb_mla_weights(mla)[1]


def _forward_head_split(mla: SimpleMLA, x, c_all, mask):
    b, t, _ = x.shape
    m, _ = _absorb_head_split(mla)
    xs = x.view(b, t, mla.n_heads, mla.head_dim).transpose(1, 2)        # (B, H, T, hd): the head-split input
    q_lat = torch.einsum("bhte,hec->bhtc", xs, m)
    scores = q_lat @ c_all.unsqueeze(1).transpose(-2, -1) / math.sqrt(mla.head_dim)
    lat = _masked_softmax(scores, mask) @ c_all.unsqueeze(1)
    _, bo = absorb_mla_weights(mla)
    return torch.einsum("bhtc,hdc->btd", lat, bo)


def _absorb_stale(mla: SimpleMLA):
    if not hasattr(mla, "_absorbed"):
        with torch.no_grad():
            mla._absorbed = tuple(w.clone() for w in absorb_mla_weights(mla))   # computed once, never refreshed
    return mla._absorbed


def _forward_stale(mla: SimpleMLA, x, c_all, mask):
    a, bo = _absorb_stale(mla)
    q_lat = torch.einsum("btd,hdc->bhtc", x, a)
    scores = q_lat @ c_all.unsqueeze(1).transpose(-2, -1) / math.sqrt(mla.head_dim)
    lat = _masked_softmax(scores, mask) @ c_all.unsqueeze(1)
    return torch.einsum("bhtc,hdc->btd", lat, bo)


bug_group("B13.absorb_head_split", f"{U}.absorb", "Absorb per head: `W_q[h]ᵀ W_uk[h]` maps the **full** x (D) to the "
          "latent (d_c); do not multiply the full matrices and cut the input into heads.",
          {"absorb_mla_weights": _absorb_head_split, "absorbed_forward": _forward_head_split})
def _absorb_per_head(mla: SimpleMLA):
    """The right absorbed matrices, written out here (the library's function is the exercise's blocked reference)."""
    h, hd = mla.n_heads, mla.head_dim
    a = torch.stack([mla.W_q.weight[i * hd:(i + 1) * hd].T @ mla.W_uk.weight[i * hd:(i + 1) * hd] for i in range(h)])
    bo = torch.stack([mla.W_o.weight[:, i * hd:(i + 1) * hd] @ mla.W_uv.weight[i * hd:(i + 1) * hd] for i in range(h)])
    return a, bo


def _forward_rebuilds(mla: SimpleMLA, x, c_all, mask):
    """Equal outputs, wrong structure: keys and values of every latent rebuilt by calling W_uk and W_uv."""
    b, t, _ = x.shape
    h, hd = mla.n_heads, mla.head_dim
    q = mla.W_q(x).view(b, t, h, hd).transpose(1, 2)
    k = mla.W_uk(c_all).view(b, -1, h, hd).transpose(1, 2)
    v = mla.W_uv(c_all).view(b, -1, h, hd).transpose(1, 2)
    out = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(hd), mask) @ v
    return mla.W_o(out.transpose(1, 2).reshape(b, t, h * hd))


bug_group("B13.absorbed_forward_rebuilds_kv", f"{U}.absorb", "Absorption never builds per-head keys or values: score "
          "the queries against the latents through `A` and map the latent context out through `Bo`.",
          {"absorb_mla_weights": _absorb_per_head, "absorbed_forward": _forward_rebuilds}, detect="detector")
bug_group("B13.absorb_cached_stale", f"{U}.absorb", "Recompute (or invalidate) the absorbed weights after the weights "
          "change.", {"absorb_mla_weights": _absorb_stale, "absorbed_forward": _forward_stale}, detect="detector")


# ---------------------------------------------------------------- DeepSeekMLA


class _MLA(DeepSeekMLA):
    """The reference with one mistake, chosen by ``variant``."""

    variant = "ok"

    def __init__(self, d_model, n_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                 rope_theta=10000.0, rope_interleave=True, rms_norm_eps=1e-6):
        if self.variant == "convention":
            rope_interleave = False                       # the flag is ignored: always the half-split layout
        super().__init__(d_model, n_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                         rope_theta, rope_interleave, rms_norm_eps)
        if self.variant == "k_pe_per_head":
            self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_lora_rank + n_heads * qk_rope_head_dim, bias=False)
        if self.variant == "scale_nope":
            self.scaling = qk_nope_head_dim ** -0.5
        if self.variant == "scale_v":
            self.scaling = v_head_dim ** -0.5
        if self.variant == "scale_none":
            self.scaling = 1.0

    def project(self, x, positions):
        b, t, _ = x.shape
        v = self.variant
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            qa = self.q_a_proj(x)
            q = self.q_b_proj(qa if v == "q_norm_missing" else self.q_a_layernorm(qa))
        q = q.view(b, t, self.n_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        full = self.kv_a_proj_with_mqa(x)
        if v == "k_pe_per_head":
            c_kv, k_pe = full.split([self.kv_lora_rank, self.n_heads * self.qk_rope_head_dim], dim=-1)
            k_pe = k_pe[..., :self.qk_rope_head_dim]
        else:
            c_kv, k_pe = full.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        if v == "norm_on_k_pe":
            r = torch.rsqrt(full.float().pow(2).mean(-1, keepdim=True) + self.kv_a_layernorm.eps).to(x.dtype)
            c_kv, k_pe = self.kv_a_layernorm.weight * (c_kv * r), k_pe * r
        elif v != "no_kv_norm":
            c_kv = self.kv_a_layernorm(c_kv)
        cos, sin = self.rope_tables(positions)
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]
        q_pe = self.rotate(q_pe, cos, sin)
        k_pe = self.rotate(k_pe[:, None], cos, sin)[:, 0]
        if v == "rope_on_latent":                     # the latent is rotated too (absorption is then impossible)
            cl, sl = rope_cos_sin(rope_inv_freq(self.kv_lora_rank, self.rope_theta), positions.reshape(-1))
            c_kv = apply_rope(c_kv, cl.view(*positions.shape, -1), sl.view(*positions.shape, -1))
        return q_nope, q_pe, c_kv, k_pe

    def forward(self, x, positions, mask, cache=None, layer_idx=0, absorb=False):
        v = self.variant
        if v == "absorb_ignored":                     # absorb=True runs the naive path
            return super().forward(x, positions, mask, cache, layer_idx, False)
        if v == "rebuild_linear" and absorb:          # "absorbed" by name: K and V rebuilt with F.linear
            b, t, _ = x.shape
            h, dn, dv = self.n_heads, self.qk_nope_head_dim, self.v_head_dim
            q_nope, q_pe, c_kv, k_pe = self.project(x, positions)
            if cache is not None:
                c_kv, k_pe = cache.update(layer_idx, c_kv, k_pe)
            kv = nn.functional.linear(c_kv, self.kv_b_proj.weight).view(b, c_kv.shape[1], h, dn + dv).transpose(1, 2)
            scores = q_nope @ kv[..., :dn].transpose(-2, -1) + q_pe @ k_pe.unsqueeze(1).transpose(-2, -1)
            out = _masked_softmax(scores * self.scaling, mask) @ kv[..., dn:]
            return self.o_proj(out.transpose(1, 2).reshape(b, t, h * dv))
        if v not in ("kvb_block", "decompressed"):
            return super().forward(x, positions, mask, cache, layer_idx, absorb)
        b, t, _ = x.shape
        h, dn, dv = self.n_heads, self.qk_nope_head_dim, self.v_head_dim
        q_nope, q_pe, c_kv, k_pe = self.project(x, positions)
        if v == "decompressed":
            kv = self.kv_b_proj(c_kv).view(b, t, h, dn + dv)
            k = torch.cat([kv[..., :dn], k_pe[:, :, None].expand(b, t, h, -1)], -1).reshape(b, t, -1)
            k, vals = cache.update(layer_idx, k, kv[..., dn:].reshape(b, t, -1)) if cache is not None else (
                k, kv[..., dn:].reshape(b, t, -1))
            s = k.shape[1]
            k = k.view(b, s, h, -1).transpose(1, 2)
            vals = vals.view(b, s, h, dv).transpose(1, 2)
            scores = torch.cat([q_nope, q_pe], -1) @ k.transpose(-2, -1)
        else:
            if cache is not None:
                c_kv, k_pe = cache.update(layer_idx, c_kv, k_pe)
            s = c_kv.shape[1]
            kv = self.kv_b_proj(c_kv)
            k_nope = kv[..., :h * dn].view(b, s, h, dn).transpose(1, 2)    # [all heads' K; all heads' V]
            vals = kv[..., h * dn:].view(b, s, h, dv).transpose(1, 2)
            scores = q_nope @ k_nope.transpose(-2, -1) + q_pe @ k_pe.unsqueeze(1).transpose(-2, -1)
        out = _masked_softmax(scores * self.scaling, mask) @ vals
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * dv))


def _ds(bug_id, variant, hint, detect="mutant"):
    cls = type(f"DeepSeekMLA_{variant}", (_MLA,), {"variant": variant})
    bug_group(bug_id, f"{U}.DeepSeekMLA", hint, {"DeepSeekMLA": cls}, detect=detect)


_ds("B13.kvb_block_layout", "kvb_block", "The layout of `kv_b_proj`'s rows is per head: `[k_nope_h; v_h]` for each "
    "head in turn.")
_ds("B13.rope_on_latent", "rope_on_latent", "Only the decoupled slices `q_pe` and `k_pe` are rotated; the latent "
    "stays position-free.")
_ds("B13.k_pe_per_head", "k_pe_per_head", "`k_pe` is a single head shared by all query heads.", detect="detector")
_ds("B13.scale_nope_only", "scale_nope", "Which vectors' dot product is the score? Count every dimension that enters "
    "it.")
_ds("B13.scale_v_dim", "scale_v", "The softmax scale comes from the width of the query·key dot product "
    "(`d_nope + d_R`), not from the value width.")
_ds("B13.scale_missing", "scale_none", "Scale the scores by the inverse square root of the query·key width "
    "`d_nope + d_R`, as `DeepseekV3Attention` does.")
_ds("B13.absorb_ignored", "absorb_ignored", "With `absorb=True` never call `kv_b_proj` on the latents: map `q_nope` "
    "into latent space with the K rows of its weight and map the latent context out with the V rows.",
    detect="detector")
_ds("B13.absorb_rebuilds_kv", "rebuild_linear", "The absorbed path must not build per-head keys or values from "
    "`c_kv` (however they are computed): score the latent query against `c_kv` directly.", detect="detector")
_ds("B13.no_kv_norm", "no_kv_norm", "RMS-normalise the latent before up-projecting and caching it.")
_ds("B13.norm_on_k_pe", "norm_on_k_pe", "The latent's RMSNorm covers `c_kv` only, not the rope key.")
_ds("B13.rope_convention", "convention", "DeepSeek checkpoints rotate interleaved pairs `(2i, 2i+1)`; honour "
    "`rope_interleave` (False: the half-split pairs of Llama).")
_ds("B13.q_norm_missing", "q_norm_missing", "The compressed query is RMS-normalised too (`q_a_layernorm`).")
_ds("B13.cache_decompressed", "decompressed", "MLA's point is to cache only `c_kv` and the shared `k_pe`, not "
    "per-head keys and values.", detect="detector")
