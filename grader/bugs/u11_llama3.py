"""Bug catalog of unit 11 (Llama 3): one known-wrong implementation per syllabus entry.

Each mutant is the reference (:mod:`llmcourse.models.llama3`) with exactly one mistake. Detectors (named by
the checks): a norm that ignores a constant added to a row (``rms_mean_subtracted``), a bfloat16 result far
from transformers' (``rms_low_precision``), buffers inside the layers (``buffers_per_layer``), a rotated first
position (``rope_positions_from_one``, also a mutant), ``repeat`` instead of ``repeat_interleave`` (F11.4
grouping, also a mutant), projections sized with d_model // n_heads whatever head_dim says
(``gqa_ignores_head_dim``). The wrong blends between the smoothing limits are mutants of ``rope_inv_freq``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from llmcourse.models.llama3 import (
    GroupedQueryAttention,
    Llama3Block,
    Llama3Model,
    RMSNorm,
    SwiGLUFeedForward,
    _head_dim,
    apply_rope,
    apply_rope_interleaved,
    repeat_kv,
    rope_cos_sin,
    rope_inv_freq,
)

from ..core import bug, bug_group

U = "11"

# ---------------------------------------------------------------- RMSNorm


class RMSNormMeanSubtracted(RMSNorm):
    def forward(self, x):
        xf = x.float()
        xf = xf - xf.mean(-1, keepdim=True)
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class RMSNormEpsOutside(RMSNorm):
    def forward(self, x):
        xf = x.float()
        return self.weight * (xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)).to(x.dtype)


class RMSNormLowPrecision(RMSNorm):
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


for _id, _cls, _hint, _detect in [
    ("B11.rms_mean_subtracted", RMSNormMeanSubtracted, "RMSNorm only rescales; it never centres.", "detector"),
    ("B11.rms_eps_outside", RMSNormEpsOutside, "ε goes inside the square root.", "mutant"),
    ("B11.rms_low_precision", RMSNormLowPrecision, "Compute the statistics in float32, then cast back.", "detector"),
]:
    bug_group(_id, f"{U}.RMSNorm", _hint, {"RMSNorm": _cls}, _detect)

# ---------------------------------------------------------------- SwiGLU


class SwiGLUSwapped(SwiGLUFeedForward):
    def forward(self, x):
        return self.down_proj(F.silu(self.up_proj(x)) * self.gate_proj(x))


class SwiGLUGelu(SwiGLUFeedForward):
    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))


bug_group("B11.swiglu_swapped", f"{U}.SwiGLUFeedForward", "The SiLU gate is applied to `gate_proj(x)`.",
          {"SwiGLUFeedForward": SwiGLUSwapped})
bug_group("B11.swiglu_gelu", f"{U}.SwiGLUFeedForward", "Llama uses SiLU (swish) in its gated MLP.",
          {"SwiGLUFeedForward": SwiGLUGelu})

# ---------------------------------------------------------------- RoPE


@bug("B11.rope_interleaved", f"{U}.rope", "This unit (and transformers' Llama) pairs i with i + hd/2.",
     name="apply_rope")
def apply_rope_interleaved_pairs(x, cos, sin):
    return apply_rope_interleaved(x, cos, sin)


@bug("B11.rope_theta", f"{U}.rope", "Llama-3 uses θ = 500,000.", name="rope_inv_freq")
def rope_inv_freq_theta_10k(head_dim, theta=10000.0, scaling=None):
    return rope_inv_freq(head_dim, theta, scaling)


@bug("B11.rope_no_smoothing", f"{U}.rope", "Apply the Llama-3 frequency bands (pairs 4–7 in the worked example change).",
     name="rope_inv_freq")
def rope_inv_freq_no_smoothing(head_dim, theta=500000.0, scaling=None):
    return rope_inv_freq(head_dim, theta, None)


@bug("B11.rope_bands_swapped", f"{U}.rope", "Short wavelengths (fast pairs) stay; the slow pairs, with wavelengths "
     "above the long-wavelength limit, have their frequency divided by `factor` (their wavelength multiplied by it).",
     name="rope_inv_freq")
def rope_inv_freq_bands_swapped(head_dim, theta=500000.0, scaling=None):
    inv = rope_inv_freq(head_dim, theta, None)
    if scaling is None:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen < orig / high, inv / factor, inv)
    s = (orig / wavelen - low) / (high - low)
    smoothed = (1 - s) * scaled / factor + s * scaled
    medium = ~(wavelen < orig / high) * ~(wavelen > orig / low)
    return torch.where(medium, smoothed, scaled)


def _smoothed(head_dim, theta, scaling, blend):
    """Llama 3's bands with another rule between the limits (``blend(inv, wavelen, s_freq) -> inv``)."""
    inv = rope_inv_freq(head_dim, theta, None)
    if scaling is None:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > orig / low, inv / factor, inv)
    medium = ~(wavelen < orig / high) * ~(wavelen > orig / low)
    return torch.where(medium, blend(inv, wavelen, scaling), out)


@bug("B11.rope_smooth_linear_in_wavelength", f"{U}.rope", "Between the two limits the weight of the kept frequency "
     "grows linearly with the pair's frequency (orig / wavelength), not with its wavelength: compare the required "
     "value of the pair that lies between the limits.", name="rope_inv_freq")
def rope_inv_freq_linear_in_wavelength(head_dim, theta=500000.0, scaling=None):
    def blend(inv, wl, sc):
        lo, hi = sc["original_max_position_embeddings"] / sc["low_freq_factor"], \
            sc["original_max_position_embeddings"] / sc["high_freq_factor"]
        s = (lo - wl) / (lo - hi)
        return (1 - s) * inv / sc["factor"] + s * inv
    return _smoothed(head_dim, theta, scaling, blend)


@bug("B11.rope_smooth_blends_wavelengths", f"{U}.rope", "Between the two limits, mix the two frequencies "
     "(θ/factor and θ), not the two wavelengths.", name="rope_inv_freq")
def rope_inv_freq_blends_wavelengths(head_dim, theta=500000.0, scaling=None):
    def blend(inv, wl, sc):
        s = (sc["original_max_position_embeddings"] / wl - sc["low_freq_factor"]) / (
            sc["high_freq_factor"] - sc["low_freq_factor"])
        return 2 * math.pi / ((1 - s) * wl * sc["factor"] + s * wl)
    return _smoothed(head_dim, theta, scaling, blend)


# ---------------------------------------------------------------- GQA


def repeat_kv_tiled(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)


class GQARepeat(GroupedQueryAttention):
    def attend(self, q, k, v, mask):
        k, v = repeat_kv_tiled(k, self.n_rep), repeat_kv_tiled(v, self.n_rep)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class GQARopeOnValues(GroupedQueryAttention):
    def forward(self, x, cos, sin, mask):
        q, k, v = self.project(x, cos, sin)
        return self.attend(q, k, apply_rope(v, cos, sin), mask)


class GQAScaleDModel(GroupedQueryAttention):
    def attend(self, q, k, v, mask):
        out = F.scaled_dot_product_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), attn_mask=mask,
                                             scale=1.0 / math.sqrt(self.d_model))
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class GQAIgnoresHeadDim(GroupedQueryAttention):
    def __init__(self, d_model, n_heads, n_kv_heads, head_dim=None):
        super().__init__(d_model, n_heads, n_kv_heads, None)   # always d_model // n_heads


bug_group("B11.gqa_ignores_head_dim", f"{U}.GroupedQueryAttention", "head_dim is an argument of its own (Llama 3.2 "
          "style configs set it apart from d_model / n_heads): the projections have H·head_dim and KV·head_dim rows.",
          {"GroupedQueryAttention": GQAIgnoresHeadDim}, "detector")
bug_group("B11.repeat_not_interleave", f"{U}.GroupedQueryAttention",
          "Query heads are grouped contiguously: use `repeat_interleave` (or expand + reshape).",
          {"repeat_kv": repeat_kv_tiled, "GroupedQueryAttention": GQARepeat})
bug_group("B11.rope_on_values", f"{U}.GroupedQueryAttention", "RoPE rotates queries and keys only.",
          {"GroupedQueryAttention": GQARopeOnValues})
bug_group("B11.gqa_scale_d_model", f"{U}.GroupedQueryAttention", "Scale by √head_dim.",
          {"GroupedQueryAttention": GQAScaleDModel})

# ---------------------------------------------------------------- the model


class Llama3ModelPositionsFromOne(Llama3Model):
    def __init__(self, cfg):
        super().__init__(cfg)
        if not self.rope_cos.is_meta:
            cos, sin = rope_cos_sin(rope_inv_freq(_head_dim(cfg), cfg.rope_theta, cfg.rope_scaling),
                                    torch.arange(1, cfg.context_length + 1))
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)


class _LayerWithBuffers(Llama3Block):
    def __init__(self, cfg):
        super().__init__(cfg)
        cos, sin = rope_cos_sin(rope_inv_freq(_head_dim(cfg), cfg.rope_theta, cfg.rope_scaling), torch.arange(cfg.context_length))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)


class Llama3ModelBuffersPerLayer(Llama3Model):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.layers = nn.ModuleList(_LayerWithBuffers(cfg) for _ in range(cfg.n_layers))
        self.init_weights()


bug_group("B11.rope_positions_from_one", f"{U}.Llama3Model",
          "The first position is 0, so its rotation is the identity.", {"Llama3Model": Llama3ModelPositionsFromOne},
          "detector")
bug_group("B11.buffers_per_layer", f"{U}.Llama3Model", "Compute them once per model and pass them to the layers.",
          {"Llama3Model": Llama3ModelBuffersPerLayer}, "detector")
