"""Llama 3 (unit 11): RMSNorm, SwiGLU, rotary position embeddings (RoPE), grouped-query attention, the model.

Llama 3 is GPT-2 with four parts swapped and every bias removed:

=========================  ===========================================  ============================================
GPT-2 (unit 08)            Llama 3 (this module)                        what changes
=========================  ===========================================  ============================================
LayerNorm (mean, var, β)   :class:`RMSNorm`                             no centring, no bias, statistics in float32
GELU MLP ``4·D``           :class:`SwiGLUFeedForward`                   gated: ``down(silu(gate(x)) ⊙ up(x))``
learned positions          RoPE (:func:`apply_rope`) on q and k         rotation by ``m·θ_i``, relative by design
multi-head attention       :class:`GroupedQueryAttention`               KV heads shared by groups of query heads
=========================  ===========================================  ============================================

RoPE uses the **half-split** layout of ``transformers``' Llama: dimension ``i < hd/2`` is paired with
``i + hd/2``; ``cos``/``sin`` tables have shape ``(T, hd)`` = ``cat(f, f)`` with ``f = positions ⊗ inv_freq``.
:func:`interleaved_to_half_split_perm` converts checkpoints written for the interleaved layout
(pairs ``(2i, 2i+1)``, Meta's original code).

The unit-11 classes are **cache-free**: ``GroupedQueryAttention.forward(x, cos, sin, mask)`` and
``Llama3Model.forward(idx)``. Cache-aware subclasses (unit 12) reuse :meth:`GroupedQueryAttention.project`
(projection + head split + RoPE) and :meth:`GroupedQueryAttention.attend` (SDPA + merge + output
projection), and the model's buffers ``rope_cos``, ``rope_sin`` and ``causal``.

Sources: Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019), eq. (4); Shazeer, "GLU Variants
Improve Transformer" (2020), eq. (6) (SwiGLU); Su et al., "RoFormer" (2021), §3.2–3.4, eqs. (13)–(16);
Ainslie et al., "GQA" (2023), §2; Meta's Llama 3 (2024) and ``transformers.models.llama.modeling_llama``
plus ``transformers.modeling_rope_utils._compute_llama3_parameters`` (the code the parity tests match).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .inputs import token_ids_length

__all__ = [
    "LLAMA3_PRESETS", "GroupedQueryAttention", "Llama3Block", "Llama3Config", "Llama3Model", "RMSNorm",
    "SwiGLUFeedForward", "apply_rope", "apply_rope_interleaved", "hf_llama_config", "interleaved_to_half_split_perm",
    "LLAMA31_ROPE_SCALING", "LLAMA32_ROPE_SCALING", "LLAMA3_ROPE_SCALING", "llama3_param_breakdown",
    "llama3_param_count", "llama_ffn_hidden_dim", "llama_parity_configs", "load_hf_llama", "random_hf_llama",
    "repeat_kv", "rope_cos_sin", "rope_inv_freq", "rotate_half",
]

LLAMA3_PRESETS: tuple[str, ...] = ("llama3.2-1b", "llama3.2-3b", "llama3-tiny")

# Llama 3's frequency smoothing, as the ``rope_scaling`` of the released ``config.json`` files. The two
# generations differ in ``factor`` only:
# - Llama 3.2 1B and 3B (``meta-llama/Llama-3.2-1B``, ``-3B``): factor 32. The course's presets are these models,
#   so :data:`LLAMA3_ROPE_SCALING` (used by ``Llama3Config.preset``) is the Llama 3.2 dict;
# - Llama 3.1 8B, 70B and 405B (``meta-llama/Llama-3.1-8B``, ...): factor 8 (:data:`LLAMA31_ROPE_SCALING`).
LLAMA32_ROPE_SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}
LLAMA31_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}
LLAMA3_ROPE_SCALING = LLAMA32_ROPE_SCALING   # the presets' (Llama 3.2's) smoothing; kept under its old name


def llama_ffn_hidden_dim(d_model: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU width of Meta's Llama code: ``int(2·4D/3)``, times ``ffn_dim_multiplier`` (``int`` again),
    rounded **up** to a multiple of ``multiple_of``.

    Meta's ``params.json`` files carry ``multiple_of`` and ``ffn_dim_multiplier`` instead of the width; the
    ``intermediate_size`` of ``transformers``' configs is this function's result. Examples: Llama 3.2 1B
    (D 2,048, multiplier 1.5, multiple 256) -> 8,192; Llama 3.2 3B (3,072, 1.0, 256) -> 8,192; Llama 3 8B
    (4,096, 1.3, 1,024) -> 14,336.
    """
    hidden = int(2 * 4 * d_model / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


# ------------------------------------------------------------------------------------------------
# RMSNorm and SwiGLU
# ------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square normalisation: ``y = weight · x / sqrt(mean(x², -1) + eps)``.

    No mean subtraction and no bias (Zhang & Sennrich 2019, eq. 4). The statistics are computed in
    float32 whatever the input dtype; the normalised value is cast back to ``x.dtype`` before the gain
    (as ``transformers``' ``LlamaRMSNorm``), so the result has the module's dtype promotion with ``x``.

    Args:
        d: number of features (the last dimension).
        eps: added to the mean square **inside** the square root (1e-5 for Llama).

    Attributes:
        weight: ``(d,)`` gain, initialised to ones (``state_dict`` key ``weight``).

    Shapes: ``(..., d)`` -> ``(..., d)``. Equals ``torch.nn.RMSNorm(d, eps)`` in float32.
    """

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.d = int(d)
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(self.d))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


class SwiGLUFeedForward(nn.Module):
    """Llama's gated MLP: ``down_proj(silu(gate_proj(x)) ⊙ up_proj(x))``, ``silu(z) = z·sigmoid(z)``.

    Three bias-free linear maps (``3·D·hidden`` parameters); with ``hidden ≈ 8/3·D`` the count matches a
    ``4·D`` GELU MLP (Shazeer 2020, eq. 6 and §2). Keys: ``gate_proj.weight (hidden, D)``,
    ``up_proj.weight (hidden, D)``, ``down_proj.weight (D, hidden)``. Shapes ``(..., D) -> (..., D)``.
    Equals ``transformers``' ``LlamaMLP`` with the same weights.
    """

    def __init__(self, d_model: int, hidden_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden_dim, bias=False)
        self.up_proj = nn.Linear(d_model, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ------------------------------------------------------------------------------------------------
# RoPE
# ------------------------------------------------------------------------------------------------


def rope_inv_freq(head_dim: int, theta: float = 500000.0, scaling: dict | None = None) -> Tensor:
    """Inverse frequencies ``θ_i = theta^(−2i/head_dim)``, ``i = 0 … head_dim/2 − 1``: float32 ``(head_dim//2,)``.

    With ``scaling = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}``
    Llama 3's frequency smoothing is applied per pair, by wavelength ``λ = 2π/θ_i`` against the band limits
    ``lo = orig/low_freq_factor`` and ``hi = orig/high_freq_factor``: ``λ < hi`` keeps ``θ_i`` (fast pairs),
    ``λ > lo`` divides it by ``factor`` (slow pairs), and in between
    ``s = (orig/λ − low_freq_factor)/(high_freq_factor − low_freq_factor)``,
    ``θ_i ← (1 − s)·θ_i/factor + s·θ_i``. Dividing a frequency by ``factor`` **multiplies** its wavelength by
    ``factor`` (slow pairs then turn ``factor`` times more slowly and span a ``factor`` times longer context).

    The arithmetic follows ``transformers.modeling_rope_utils`` (``1/(theta^(2i/hd))`` in float32), so the
    result equals the ``inv_freq`` of ``LlamaRotaryEmbedding`` bit for bit. Example:
    ``rope_inv_freq(16)`` = ``[1.0, 0.19392, 0.037606, …, 1.0313e-5]``.

    Raises:
        ValueError: odd ``head_dim``; ``scaling`` missing a key or with ``high_freq_factor ≤ low_freq_factor``.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: head_dim must be even, got {head_dim}")
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    if scaling is None:
        return inv
    missing = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} - set(scaling)
    if missing:
        raise ValueError(f"rope scaling needs the keys {sorted(missing)}")
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    if not high > low:
        raise ValueError(f"high_freq_factor ({high}) must exceed low_freq_factor ({low})")
    low_wavelen, high_wavelen = orig / low, orig / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    s = (orig / wavelen - low) / (high - low)
    smoothed = (1 - s) * scaled / factor + s * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(inv_freq: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    """Cos/sin tables for the half-split layout: ``positions (T,) -> cos, sin (T, head_dim)`` float32.

    ``f = positions[:, None] · inv_freq[None, :]`` (angles ``m·θ_i``), then ``cat(f, f)`` so that
    dimension ``i`` and ``i + hd/2`` share the angle of pair ``i``.
    """
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    """``cat(−x[..., hd/2:], x[..., :hd/2])``: the 90° turn of every half-split pair. ``[1,2,3,4] -> [−3,−4,1,2]``."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each half-split pair ``(x_i, x_{i+hd/2})`` by its angle: ``x·cos + rotate_half(x)·sin``.

    ``x`` ``(B, H, T, hd)`` (any leading dims); ``cos``/``sin`` ``(T, hd)`` from :func:`rope_cos_sin` (or any
    shape broadcasting against ``x``). Returns the same shape and dtype as ``x`` (tables cast to it).
    Norms of every pair are preserved; position 0 is the identity. Equals ``transformers``'
    ``apply_rotary_pos_emb``.
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def apply_rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The **interleaved** layout (pairs ``(x_{2i}, x_{2i+1})``, Meta's original code), with the same
    half-split tables: pair ``i`` turns by the angle in ``cos[..., i]``. Shapes as :func:`apply_rope`.

    ``apply_rope_interleaved(x, …)[..., perm] == apply_rope(x[..., perm], …)`` for
    ``perm = interleaved_to_half_split_perm(hd)``.
    """
    h = x.shape[-1] // 2
    c, s = cos[..., :h].to(x.dtype), sin[..., :h].to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.stack((a * c - b * s, a * s + b * c), dim=-1)
    return out.flatten(-2)


def interleaved_to_half_split_perm(head_dim: int) -> Tensor:
    """Index permutation, long ``(head_dim,)``: ``[0, 2, 4, …, 1, 3, 5, …]``.

    Half-split position ``j < hd/2`` takes interleaved index ``2j``; ``j ≥ hd/2`` takes ``2(j − hd/2) + 1``.
    Applied per head to the rows of ``W_q`` and ``W_k`` of an interleaved checkpoint
    (``W.view(H, hd, D)[:, perm]``), it makes half-split RoPE give the same attention scores.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


# ------------------------------------------------------------------------------------------------
# grouped-query attention
# ------------------------------------------------------------------------------------------------


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, KV, T, hd) -> (B, KV·n_rep, T, hd)``: output head ``h`` is input head ``h // n_rep``.

    Query heads are grouped contiguously (heads ``0 … n_rep−1`` share KV head 0), exactly
    ``torch.repeat_interleave(x, n_rep, dim=1)``; computed with ``expand`` + ``reshape`` (one copy).
    ``n_rep == 1`` returns ``x`` itself.
    """
    if n_rep == 1:
        return x
    b, kv, t, hd = x.shape
    return x[:, :, None].expand(b, kv, n_rep, t, hd).reshape(b, kv * n_rep, t, hd)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with ``n_kv_heads`` key/value heads shared by ``n_heads`` query heads.

    Args:
        d_model: D. n_heads: H. n_kv_heads: KV (H divisible by KV; KV = H is MHA, KV = 1 is MQA).
        head_dim: hd (default ``D // H``).

    Keys (no biases): ``q_proj.weight (H·hd, D)``, ``k_proj.weight (KV·hd, D)``, ``v_proj.weight (KV·hd, D)``,
    ``o_proj.weight (D, H·hd)``. ``forward(x, cos, sin, mask)``: ``x (B, T, D)``, ``cos``/``sin`` ``(T, hd)``,
    ``mask`` bool broadcasting to ``(B, H, T, T)`` with True = may attend (or ``None``: no mask) ->
    ``(B, T, D)``. RoPE on queries and keys only; scores scaled by ``1/√hd``; query head ``h`` reads KV head
    ``h // (H/KV)``. Runs ``F.scaled_dot_product_attention(..., enable_gqa=True)`` (no KV copies); equals
    ``transformers``' ``LlamaAttention`` (eager) with the same weights.

    Cache-free by design: :meth:`project` and :meth:`attend` are the two halves a cache-aware subclass
    re-assembles around its cache.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int | None = None):
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass head_dim")
            head_dim = d_model // n_heads
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, head_dim
        self.n_rep = n_heads // n_kv_heads
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Projections, head split and RoPE: ``x (B, T, D)`` -> ``q (B, H, T, hd)``, ``k, v (B, KV, T, hd)``
        (``q`` and ``k`` rotated with ``cos``/``sin`` of the T positions; ``v`` untouched)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """``softmax(q kᵀ/√hd masked) v`` over KV heads shared by groups, merged and projected:
        ``q (B, H, T_q, hd)``, ``k, v (B, KV, T_k, hd)``, ``mask`` bool ``(T_q, T_k)``-broadcastable -> ``(B, T_q, D)``."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_rep > 1)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        q, k, v = self.project(x, cos, sin)
        return self.attend(q, k, v, mask)


# ------------------------------------------------------------------------------------------------
# config, block, model
# ------------------------------------------------------------------------------------------------


@dataclass
class Llama3Config:
    """Hyper-parameters of :class:`Llama3Model`.

    ``vocab_size`` V, ``d_model`` D, ``n_layers`` L, ``n_heads`` H, ``n_kv_heads`` KV, ``intermediate_size`` I
    (SwiGLU hidden width), ``context_length`` C (size of the RoPE tables and causal mask), ``rope_theta``
    (500,000 for Llama 3; 10,000 for the course's tiny model), ``rope_scaling`` (Llama 3 smoothing dict or
    ``None``), ``rms_norm_eps``, ``tie_word_embeddings``, ``head_dim`` (default ``D // H``; see :attr:`hd`).

    ``preset(name)``: ``"llama3.2-1b"`` (1,235,814,400 parameters), ``"llama3.2-3b"`` (3,212,749,824) and
    ``"llama3-tiny"`` (V 65, D 128, L 4, H 4, KV 2, I 384, C 256, θ 10,000; 795,904); ``KeyError`` otherwise.
    ``to_dict()`` / ``Llama3Config(**d)`` round-trip through plain Python types.
    """

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
    def preset(cls, name: str) -> Llama3Config:
        table = {
            "llama3.2-1b": dict(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                                intermediate_size=8192, context_length=131072, head_dim=64,
                                rope_scaling=dict(LLAMA3_ROPE_SCALING)),
            "llama3.2-3b": dict(vocab_size=128256, d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8,
                                intermediate_size=8192, context_length=131072, head_dim=128,
                                rope_scaling=dict(LLAMA3_ROPE_SCALING)),
            "llama3-tiny": dict(vocab_size=65, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
                                intermediate_size=384, context_length=256, rope_theta=10000.0),
        }
        if name not in table:
            raise KeyError(f"unknown Llama 3 preset {name!r}; choose one of {sorted(table)}")
        return cls(**table[name])

    @property
    def hd(self) -> int:
        """The head width actually used: ``head_dim`` or ``d_model // n_heads``."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    def to_dict(self) -> dict:
        """The fields as a plain dict (ints, floats, bools, a dict or None)."""
        d = dataclasses.asdict(self)
        if d["rope_scaling"] is not None:
            d["rope_scaling"] = dict(d["rope_scaling"])
        return d


def _head_dim(cfg) -> int:
    """``cfg.head_dim`` or ``d_model // n_heads`` (works for any config object with those fields)."""
    hd = getattr(cfg, "head_dim", None)
    return hd if hd is not None else cfg.d_model // cfg.n_heads


class Llama3Block(nn.Module):
    """One Llama layer (pre-norm, no dropout, no biases)::

        x = x + self_attn(input_layernorm(x), cos, sin, mask)
        x = x + mlp(post_attention_layernorm(x))

    Keys: ``input_layernorm.weight``, ``self_attn.{q,k,v,o}_proj.weight``, ``post_attention_layernorm.weight``,
    ``mlp.{gate,up,down}_proj.weight``. No buffers: the model passes the shared tables and mask.
    """

    attention_class = GroupedQueryAttention  # subclasses (unit 12's cached block) swap the attention class here

    def __init__(self, cfg: Llama3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.self_attn = self.attention_class(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, _head_dim(cfg))
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.mlp = SwiGLUFeedForward(cfg.d_model, cfg.intermediate_size)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama3Model(nn.Module):
    """Llama 3 with its language-modelling head (cache-free).

    ``state_dict`` keys::

        embed_tokens.weight (V, D)
        layers.{i}.input_layernorm.weight (D)              layers.{i}.post_attention_layernorm.weight (D)
        layers.{i}.self_attn.q_proj.weight (H·hd, D)       k_proj / v_proj (KV·hd, D)     o_proj (D, H·hd)
        layers.{i}.mlp.gate_proj.weight (I, D)             up_proj (I, D)                 down_proj (D, I)
        norm.weight (D)
        lm_head.weight (V, D)     (the same Parameter as embed_tokens.weight when tie_word_embeddings)

    Exactly three **non-persistent** buffers, on this module only: ``rope_cos``, ``rope_sin``
    ``(C, hd)`` float32 (positions ``0 … C−1``) and ``causal`` ``(C, C)`` bool (True = may attend);
    every layer receives slices of them. These are the names of ``transformers``' ``LlamaForCausalLM``
    without its ``model.`` prefix (:func:`load_hf_llama`).

    ``forward(idx)``: ``idx`` ``(B, T)`` long, ``T ≤ C`` -> logits ``(B, T, V)``. Weights: ``N(0, 0.02²)``
    for every linear map and the embedding, norms 1 (``transformers``' initialisation). Build on the ``meta``
    device to count parameters of the large presets (:func:`llama3_param_count` gives the formula).

    Raises:
        ValueError: ``idx`` not 2-D or ``T > context_length``.
    """

    block_class = Llama3Block  # subclasses (unit 12's cached model) swap the block class here

    def __init__(self, cfg: Llama3Config):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(self.block_class(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        inv = rope_inv_freq(_head_dim(cfg), cfg.rope_theta, cfg.rope_scaling)
        cos, sin = rope_cos_sin(inv, torch.arange(cfg.context_length))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        causal = torch.ones(cfg.context_length, cfg.context_length, dtype=torch.bool).tril()
        self.register_buffer("causal", causal, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Every linear and embedding weight ``~ N(0, std²)`` (global generator), RMSNorm gains 1; no-op on meta."""
        if self.embed_tokens.weight.is_meta:
            return
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def _check(self, idx: Tensor) -> int:
        return token_ids_length(idx, self.cfg.context_length, type(self).__name__)

    def forward(self, idx: Tensor) -> Tensor:
        t = self._check(idx)
        x = self.embed_tokens(idx)
        cos, sin, mask = self.rope_cos[:t], self.rope_sin[:t], self.causal[:t, :t]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


# ------------------------------------------------------------------------------------------------
# parameter accounting
# ------------------------------------------------------------------------------------------------


def llama3_param_breakdown(cfg: Llama3Config) -> dict[str, int]:
    """Parameter counts by component (formula): ``token_embedding`` V·D, ``attention``
    ``L·(2·H·hd·D + 2·KV·hd·D)``, ``ffn`` ``L·3·D·I``, ``block_norms`` ``L·2·D``, ``final_norm`` D,
    ``lm_head`` (0 when tied, else V·D) and ``total``."""
    v, d, n, hd = cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.hd
    parts = {
        "token_embedding": v * d,
        "attention": n * (2 * cfg.n_heads * hd * d + 2 * cfg.n_kv_heads * hd * d),
        "ffn": n * 3 * d * cfg.intermediate_size,
        "block_norms": n * 2 * d,
        "final_norm": d,
        "lm_head": 0 if cfg.tie_word_embeddings else v * d,
    }
    parts["total"] = sum(parts.values())
    return parts


def llama3_param_count(cfg: Llama3Config) -> int:
    """Exact number of parameters of ``Llama3Model(cfg)`` (tied head counted once), from the formula."""
    return llama3_param_breakdown(cfg)["total"]


# ------------------------------------------------------------------------------------------------
# transformers interop
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def load_hf_llama(model: Llama3Model, hf_state: dict[str, Tensor]) -> Llama3Model:
    """Copy a ``transformers`` Llama ``state_dict`` into ``model`` in place and return ``model``.

    Keys of ``LlamaForCausalLM`` (``model.embed_tokens.weight`` …, ``lm_head.weight``) or of the bare
    ``LlamaModel``: the ``model.`` prefix is stripped, everything else maps one to one (same names, same
    ``nn.Linear`` layout). A tied model takes ``embed_tokens`` (its head follows); an untied one takes
    ``lm_head.weight`` when present, else the embedding. ``rotary_emb.inv_freq`` buffers are ignored.

    Raises:
        KeyError: a parameter missing from ``hf_state``. ValueError: a shape mismatch.
    """
    sd = {(k[len("model."):] if k.startswith("model.") else k): v for k, v in hf_state.items()
          if not k.endswith("rotary_emb.inv_freq")}
    tied = model.lm_head.weight is model.embed_tokens.weight
    for name, param in model.named_parameters():
        if name == "lm_head.weight":
            if tied:
                continue
            value = sd.get("lm_head.weight", sd.get("embed_tokens.weight"))
            if value is None:
                raise KeyError("the Hugging Face state dict has neither 'lm_head.weight' nor 'embed_tokens.weight'")
        else:
            if name not in sd:
                raise KeyError(f"the Hugging Face state dict has no {name!r} (nor 'model.{name}'); is it Llama?")
            value = sd[name]
        if tuple(param.shape) != tuple(value.shape):
            raise ValueError(f"shape mismatch for {name}: the model has {tuple(param.shape)}, the checkpoint "
                             f"gives {tuple(value.shape)}")
        param.copy_(value.to(dtype=param.dtype, device=param.device))
    return model


def hf_llama_config(cfg: Llama3Config, attn_implementation: str = "eager", **overrides):
    """The ``transformers.LlamaConfig`` of the same model, for the installed major version.

    transformers ≥ 5 takes ``rope_parameters = {"rope_type": "default" | "llama3", "rope_theta", …scaling}``;
    4.x takes a top-level ``rope_theta`` and ``rope_scaling = {"rope_type": "llama3", …}``.
    ``max_position_embeddings`` defaults to ``context_length``; ``overrides`` go to the config unchanged
    (e.g. ``max_position_embeddings=131072``). Warns when ``original_max_position_embeddings ≥
    max_position_embeddings`` (the smoothing then only matters beyond the model's own context).
    """
    import transformers
    from transformers import LlamaConfig

    major = int(transformers.__version__.split(".")[0])
    kwargs = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.intermediate_size,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                  num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.hd, rms_norm_eps=cfg.rms_norm_eps,
                  max_position_embeddings=cfg.context_length, tie_word_embeddings=cfg.tie_word_embeddings,
                  attention_bias=False, mlp_bias=False, hidden_act="silu", attn_implementation=attn_implementation,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    scaling = dict(cfg.rope_scaling) if cfg.rope_scaling else None
    if major >= 5:
        rope = {"rope_type": "llama3" if scaling else "default", "rope_theta": float(cfg.rope_theta)}
        rope.update({k: v for k, v in (scaling or {}).items() if k != "rope_type"})
        kwargs["rope_parameters"] = rope
    else:
        kwargs["rope_theta"] = float(cfg.rope_theta)
        if scaling:
            kwargs["rope_scaling"] = {"rope_type": "llama3", **scaling}
    kwargs.update(overrides)
    if scaling and scaling["original_max_position_embeddings"] >= kwargs["max_position_embeddings"]:
        warnings.warn("original_max_position_embeddings >= max_position_embeddings: transformers may reject or "
                      "ignore this rope scaling", stacklevel=2)
    return LlamaConfig(**kwargs)


@torch.no_grad()
def random_hf_llama(cfg: Llama3Config, seed: int = 0, std: float = 0.2, attn_implementation: str = "eager",
                    **overrides):
    """A ``transformers.LlamaForCausalLM`` for ``cfg`` in eval mode with every parameter re-drawn.

    Parameters in ``named_parameters()`` order get ``std · N(0, 1)`` from ``torch.Generator().manual_seed(seed)``,
    RMSNorm gains ``1 + std · N(0, 1)``: large, asymmetric weights that make any layout or convention error
    visible far above ``1e-5``.
    """
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(hf_llama_config(cfg, attn_implementation=attn_implementation, **overrides))
    g = torch.Generator().manual_seed(seed)
    for name, p in hf.named_parameters():
        noise = std * torch.randn(p.shape, generator=g)
        p.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return hf.eval()


def llama_parity_configs() -> list[tuple[Llama3Config, dict]]:
    """The two tiny parity configurations: ``(course config, transformers overrides)``.

    V 257, D 64, I 176, H 4, KV 2, L 2, ε 1e-5, untied, θ 500,000 with Llama 3 smoothing (factor 32, low 1,
    high 4): (1) ``original_max_position_embeddings`` 8,192 and ``max_position_embeddings`` 131,072 on the
    transformers side; (2) 64 and 256, so that smoothing changes the angles at short positions. The course
    model keeps a 256-position context in both (its tables are position-wise identical).
    """
    out = []
    for orig, max_pos in ((8192, 131072), (64, 256)):
        scaling = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": orig}
        cfg = Llama3Config(vocab_size=257, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=176,
                           context_length=256, rope_theta=500000.0, rope_scaling=scaling, rms_norm_eps=1e-5,
                           tie_word_embeddings=False)
        out.append((cfg, {"max_position_embeddings": max_pos}))
    return out
