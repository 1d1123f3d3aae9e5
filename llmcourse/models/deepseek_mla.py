"""Multi-head latent attention (unit 13): DeepSeek's MLA, its latent cache, absorption and decoupled RoPE.

MLA replaces the per-head keys and values of the KV cache by one **latent** vector per token,
``c_KV = W_DKV x`` of width ``d_c`` (``kv_lora_rank``). Keys and values are reconstructed per head from
the latent (``k_h = W_UK,h c``, ``v_h = W_UV,h c``), so the cache holds ``d_c`` numbers per token and layer
instead of ``2·H·hd``.

Absorption (per head, row-vector math written with ``nn.Linear`` weights ``W (d_out, d_in)``)::

    score_h(i, j) = (W_Q,h x_i) · (W_UK,h c_j) = x_iᵀ (W_Q,hᵀ W_UK,h) c_j = x_iᵀ A_h c_j
    out_i        = Σ_h W_O[:, h] Σ_j p_h(i, j) W_UV,h c_j = Σ_h (W_O[:, h] W_UV,h) lat_h(i) = Σ_h B_h lat_h(i)

``A_h`` and ``B_h`` are ``(D, d_c)``: attention runs in latent space and K/V are never materialised.
A rotation ``R_i`` applied to the query and ``R_j`` to the key sits **between** ``W_Q,h`` and ``W_UK,h``
(``x_iᵀ W_Q,hᵀ R_{j−i} W_UK,h c_j``), so no single matrix absorbs it; DeepSeek therefore rotates only
separate, small slices: a per-head ``q_pe`` and one ``k_pe`` shared by every head (*decoupled RoPE*).

Classes and functions:

* :class:`LatentCache` — per-layer ``c_kv (B, T, d_c)`` and ``k_pe (B, T, d_R)``, appended on dim 1.
* :class:`SimpleMLA` — MLA without positions (keys ``W_q``, ``W_dkv``, ``W_uk``, ``W_uv``, ``W_o``).
* :func:`absorb_mla_weights`, :func:`absorbed_forward` — the per-head absorbed matrices and the
  attention computed with them.
* :class:`DeepSeekMLA` — DeepSeek-V3's layout (``transformers``' ``DeepseekV3Attention`` names), optional
  query compression, RMSNorm on the latent, decoupled RoPE in the interleaved or half-split layout, a
  latent cache and an absorbed decode path (``absorb=True``).
* :func:`mla_param_count`, :data:`DEEPSEEK_V3_MLA` — sizes for the lesson.

Masks follow the course convention: boolean, ``True`` = may attend, broadcasting to ``(B, H, T_q, T_k)``
(``None`` = attend to every key). An additive float mask (``0`` / ``−inf``) is accepted too.

Sources: DeepSeek-AI, "DeepSeek-V2" (2024), §2.1.2–2.1.3, eqs. (9)–(19) (low-rank KV compression,
decoupled RoPE) and App. C (absorption); "DeepSeek-V3 Technical Report" (2024), §2.1.1;
``transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention`` (5.x, eager), matched with
copied weights in ``tests/test_unit13_deepseek_mla.py`` for both ``rope_interleave`` settings.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .llama3 import RMSNorm, apply_rope, apply_rope_interleaved, rope_cos_sin, rope_inv_freq

__all__ = ["DEEPSEEK_V3_MLA", "DeepSeekMLA", "LatentCache", "SimpleMLA", "absorb_mla_weights", "absorbed_forward",
           "hf_deepseek_attention_config", "mla_param_count"]

# DeepSeek-V3's attention sizes (config.json of deepseek-ai/DeepSeek-V3).
DEEPSEEK_V3_MLA: dict = dict(d_model=7168, n_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                             qk_rope_head_dim=64, v_head_dim=128, n_layers=61)


# ------------------------------------------------------------------------------------------------
# the latent cache
# ------------------------------------------------------------------------------------------------


class LatentCache:
    """Per-layer cache of MLA: the normalised latent ``c_kv (B, T, d_c)`` and the rotated shared rope key
    ``k_pe (B, T, d_R)`` (``None`` for :class:`SimpleMLA`, which has no positions), grown along dim 1.

    Args:
        n_layers: number of attention layers.

    ``update(layer_idx, c_kv, k_pe=None)`` appends and returns the layer's full ``(c_kv, k_pe)``
    (``(B, T_old + T_new, ·)``; ``k_pe`` stays ``None`` when none was given). ``seq_len`` is the cached length
    of layer 0 (0 when empty): a model reads it **once**, before layer 0 appends. ``nbytes()`` counts the bytes
    of every cached tensor: ``n_layers · (d_c + d_R) · T · B · bytes_per_elem`` once every layer is filled.
    ``reset()`` empties the cache.

    Raises:
        ValueError: ``n_layers < 1``; tensors not 3-D; batch or width different from what the layer holds; a
            ``k_pe`` whose batch or length differs from ``c_kv``'s, or given for some calls and not others.
        IndexError: ``layer_idx`` outside ``0 … n_layers−1``.

    Source: the latent cache of ``transformers`` 5.x ``DeepseekV3Attention`` (it caches ``c_kv`` after the
    norm and ``k_pe`` after RoPE; releases before 5.0 cached the decompressed per-head K/V).
    """

    def __init__(self, n_layers: int):
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        self.n_layers = int(n_layers)
        self.c_kv: list[Tensor | None] = [None] * self.n_layers
        self.k_pe: list[Tensor | None] = [None] * self.n_layers

    def update(self, layer_idx: int, c_kv: Tensor, k_pe: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if not 0 <= layer_idx < self.n_layers:
            raise IndexError(f"layer_idx {layer_idx} outside 0..{self.n_layers - 1}")
        if c_kv.dim() != 3:
            raise ValueError(f"c_kv must be (B, T_new, d_c), got {tuple(c_kv.shape)}")
        if k_pe is not None and (k_pe.dim() != 3 or k_pe.shape[:2] != c_kv.shape[:2]):
            raise ValueError(f"k_pe must be (B, T_new, d_R) matching c_kv {tuple(c_kv.shape)}, got {tuple(k_pe.shape)}")
        old_c, old_k = self.c_kv[layer_idx], self.k_pe[layer_idx]
        if old_c is None:
            new_c, new_k = c_kv, k_pe
        else:
            if old_c.shape[0] != c_kv.shape[0] or old_c.shape[2] != c_kv.shape[2]:
                raise ValueError(f"layer {layer_idx} holds c_kv {tuple(old_c.shape)}; cannot append {tuple(c_kv.shape)}")
            if (old_k is None) != (k_pe is None):
                raise ValueError("k_pe must be given on every update of a layer or on none")
            new_c = torch.cat([old_c, c_kv], dim=1)
            new_k = None if k_pe is None else torch.cat([old_k, k_pe], dim=1)
        self.c_kv[layer_idx], self.k_pe[layer_idx] = new_c, new_k
        return new_c, new_k

    @property
    def seq_len(self) -> int:
        c = self.c_kv[0]
        return 0 if c is None else int(c.shape[1])

    def reset(self) -> None:
        self.c_kv = [None] * self.n_layers
        self.k_pe = [None] * self.n_layers

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.c_kv + self.k_pe if t is not None)

    def __repr__(self) -> str:
        c, k = self.c_kv[0], self.k_pe[0]
        return (f"LatentCache(n_layers={self.n_layers}, seq_len={self.seq_len}, "
                f"c_kv={None if c is None else tuple(c.shape)}, k_pe={None if k is None else tuple(k.shape)})")


def _masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last dim after applying a boolean (True = may attend) or additive mask."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores, dim=-1)


# ------------------------------------------------------------------------------------------------
# MLA without positions, and absorption
# ------------------------------------------------------------------------------------------------


class SimpleMLA(nn.Module):
    """Multi-head latent attention without positions, caching only the latent.

    Args:
        d_model: D. n_heads: H. head_dim: hd (queries, keys and values). kv_lora_rank: d_c, the latent width.

    Keys (no biases): ``W_q.weight (H·hd, D)``, ``W_dkv.weight (d_c, D)``, ``W_uk.weight (H·hd, d_c)``,
    ``W_uv.weight (H·hd, d_c)``, ``W_o.weight (D, H·hd)``; rows ``h·hd … h·hd+hd−1`` of ``W_q``, ``W_uk`` and
    ``W_uv`` (and the same columns of ``W_o``) belong to head ``h``.

    ``forward(x, mask, cache=None, layer_idx=0)``: ``x (B, T, D)``; ``mask`` boolean ``(T, T_total)``-broadcastable
    (True = may attend) or ``None``. ``c = W_dkv(x)`` ``(B, T, d_c)`` is appended to ``cache`` (when given);
    keys and values are rebuilt from every cached latent, ``k = W_uk(c_all)``, ``v = W_uv(c_all)``; the output is
    ``W_o(softmax(q kᵀ/√hd masked) v)`` with heads merged: ``(B, T, D)``.

    Source: DeepSeek-V2 (2024), eqs. (9)–(11) without RoPE.
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int, kv_lora_rank: int):
        super().__init__()
        self.d_model, self.n_heads, self.head_dim, self.kv_lora_rank = d_model, n_heads, head_dim, kv_lora_rank
        self.W_q = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.W_dkv = nn.Linear(d_model, kv_lora_rank, bias=False)
        self.W_uk = nn.Linear(kv_lora_rank, n_heads * head_dim, bias=False)
        self.W_uv = nn.Linear(kv_lora_rank, n_heads * head_dim, bias=False)
        self.W_o = nn.Linear(n_heads * head_dim, d_model, bias=False)

    def _heads(self, y: Tensor) -> Tensor:
        b, t, _ = y.shape
        return y.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, mask: Tensor | None, cache: LatentCache | None = None, layer_idx: int = 0) -> Tensor:
        b, t, _ = x.shape
        c = self.W_dkv(x)
        if cache is not None:
            c, _ = cache.update(layer_idx, c)
        q, k, v = self._heads(self.W_q(x)), self._heads(self.W_uk(c)), self._heads(self.W_uv(c))
        p = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), mask)
        out = (p @ v).transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)
        return self.W_o(out)


def absorb_mla_weights(mla: SimpleMLA) -> tuple[Tensor, Tensor]:
    """The absorbed matrices of a :class:`SimpleMLA`, per head: ``A, Bo``, each ``(H, D, d_c)``.

    ``A[h] = W_q[h]ᵀ @ W_uk[h]`` with ``W_q[h] = W_q.weight[h·hd:(h+1)·hd]`` ``(hd, D)`` and ``W_uk[h]`` the same
    rows of ``W_uk.weight`` ``(hd, d_c)``: ``x @ A[h] @ c = (W_q[h] x)·(W_uk[h] c)``, the raw score of head ``h``.
    ``Bo[h] = W_o[:, h] @ W_uv[h]`` with ``W_o[:, h] = W_o.weight[:, h·hd:(h+1)·hd]`` ``(D, hd)``: maps a latent
    context of head ``h`` straight to the output. Computed from the current weights on every call (gradients
    flow; nothing is stored on the module, so an optimizer step is never served stale matrices).

    Source: DeepSeek-V2 (2024), §2.1.2 ("W_UK can be absorbed into W_Q, and W_UV into W_O").
    """
    h, hd = mla.n_heads, mla.head_dim
    wq = mla.W_q.weight.view(h, hd, -1)          # (H, hd, D)
    wuk = mla.W_uk.weight.view(h, hd, -1)        # (H, hd, d_c)
    wuv = mla.W_uv.weight.view(h, hd, -1)        # (H, hd, d_c)
    wo = mla.W_o.weight.view(-1, h, hd).transpose(0, 1)   # (H, D, hd)
    return wq.transpose(1, 2) @ wuk, wo @ wuv


def absorbed_forward(mla: SimpleMLA, x: Tensor, c_all: Tensor, mask: Tensor | None) -> Tensor:
    """:class:`SimpleMLA`'s attention computed in latent space with :func:`absorb_mla_weights`.

    Args:
        x: ``(B, T, D)`` the query tokens. c_all: ``(B, S, d_c)`` every latent the queries may read (cached and
            new). mask: boolean ``(T, S)``-broadcastable (True = may attend) or ``None``.

    ``scores[b,h,i,j] = (x[b,i] @ A[h]) · c_all[b,j] / √hd``; ``lat[b,h,i] = Σ_j softmax(scores)[b,h,i,j] c_all[b,j]``;
    ``out[b,i] = Σ_h Bo[h] @ lat[b,h,i]``. Returns ``(B, T, D)``, equal to ``mla(x, mask)`` when ``c_all`` holds the
    latents of the same tokens (float64: ~1e-13). Per decoded token it costs ``H·(D·d_c + 2·S·d_c + D·d_c)``
    multiply–adds instead of rebuilding ``2·S·H·hd·d_c`` key/value entries.
    """
    a, bo = absorb_mla_weights(mla)
    q_lat = torch.einsum("btd,hdc->bhtc", x, a)                      # (B, H, T, d_c)
    scores = q_lat @ c_all.unsqueeze(1).transpose(-2, -1) / math.sqrt(mla.head_dim)
    lat = _masked_softmax(scores, mask) @ c_all.unsqueeze(1)          # (B, H, T, d_c)
    return torch.einsum("bhtc,hdc->btd", lat, bo)


# ------------------------------------------------------------------------------------------------
# DeepSeek-V3's MLA
# ------------------------------------------------------------------------------------------------


class DeepSeekMLA(nn.Module):
    """DeepSeek-V3 multi-head latent attention with decoupled RoPE, a latent cache and an absorbed path.

    Args:
        d_model: D. n_heads: H. q_lora_rank: width of the compressed query (``None``: one ``q_proj``).
        kv_lora_rank: d_c. qk_nope_head_dim: d_nope (query/key dims without RoPE). qk_rope_head_dim: d_R
        (rotated dims; the key's are shared by all heads). v_head_dim: d_v. rope_theta: RoPE base.
        rope_interleave: ``True`` rotates interleaved pairs ``(2i, 2i+1)`` (DeepSeek's checkpoints), ``False``
        the half-split pairs ``(i, i + d_R/2)`` of unit 11. rms_norm_eps: of both RMSNorms.

    Keys (``transformers`` ``DeepseekV3Attention`` names, no biases): ``q_proj.weight (H·(d_nope+d_R), D)`` when
    ``q_lora_rank`` is ``None``, else ``q_a_proj.weight (q_lora_rank, D)``, ``q_a_layernorm.weight (q_lora_rank,)``,
    ``q_b_proj.weight (H·(d_nope+d_R), q_lora_rank)``; ``kv_a_proj_with_mqa.weight (d_c+d_R, D)``,
    ``kv_a_layernorm.weight (d_c,)``, ``kv_b_proj.weight (H·(d_nope+d_v), d_c)``, ``o_proj.weight (D, H·d_v)``.
    No buffers (the RoPE angles are computed from ``positions`` on each call).

    ``forward(x, positions, mask, cache=None, layer_idx=0, absorb=False)``: ``x (B, T, D)``; ``positions`` long
    ``(T,)`` or ``(B, T)``, the absolute positions of the new tokens; ``mask`` boolean ``(T, T_total)``-broadcastable
    (True = may attend) or ``None``. Steps:

    1. ``q = q_proj(x)`` or ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` -> ``(B, H, T, d_nope+d_R)``, split into
       ``q_nope`` and ``q_pe``.
    2. ``[c_kv, k_pe] = kv_a_proj_with_mqa(x)`` split ``[d_c, d_R]``; ``c_kv = kv_a_layernorm(c_kv)``; ``k_pe`` is one
       head shared by all.
    3. RoPE on ``q_pe`` and ``k_pe`` only, at ``positions``.
    4. The cache stores ``c_kv (B, T, d_c)`` (after the norm) and ``k_pe (B, T, d_R)`` (after RoPE).
    5. Naive: ``kv_b_proj(c_kv)`` viewed ``(B, S, H, d_nope+d_v)``; per head the first d_nope are ``k_nope``, the
       next d_v are ``v``; ``scores = (q_nope·k_nopeᵀ + q_pe·k_peᵀ)·(d_nope+d_R)^−½``, masked softmax, ``@ v``,
       ``o_proj``. Absorbed (``absorb=True``): ``q_nope`` is mapped into latent space per head by the K rows of
       ``kv_b_proj``, scores read ``c_kv`` directly, the latent context is mapped out by the V rows. Same result.

    Returns ``(B, T, D)``. No YaRN scaling (DeepSeek-V3 multiplies the scale by ``mscale²`` for extended contexts).

    Raises:
        ValueError: odd ``qk_rope_head_dim``; ``positions`` whose last dim is not ``T``.

    Source: DeepSeek-V2 (2024), eqs. (12)–(19); ``transformers`` 5.x ``DeepseekV3Attention`` (eager), equal with
    copied weights for ``rope_interleave`` True and False, with and without ``q_lora_rank``.
    """

    def __init__(self, d_model: int, n_heads: int, q_lora_rank: int | None, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, rope_theta: float = 10000.0, rope_interleave: bool = True,
                 rms_norm_eps: float = 1e-6):
        super().__init__()
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs), got {qk_rope_head_dim}")
        self.d_model, self.n_heads, self.q_lora_rank, self.kv_lora_rank = d_model, n_heads, q_lora_rank, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_theta, self.rope_interleave = float(rope_theta), bool(rope_interleave)
        self.scaling = self.qk_head_dim ** -0.5
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(q_lora_rank, rms_norm_eps)
            self.q_b_proj = nn.Linear(q_lora_rank, n_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, rms_norm_eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, d_model, bias=False)

    def rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos, sin`` float32 ``(*positions.shape, d_R)`` (half-split tables of unit 11, θ = ``rope_theta``)."""
        inv = rope_inv_freq(self.qk_rope_head_dim, self.rope_theta).to(positions.device)
        cos, sin = rope_cos_sin(inv, positions.reshape(-1))
        return cos.view(*positions.shape, -1), sin.view(*positions.shape, -1)

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """RoPE on ``x (B, H, T, d_R)`` in this module's layout (``cos``/``sin`` broadcasting to it)."""
        return (apply_rope_interleaved if self.rope_interleave else apply_rope)(x, cos, sin)

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Steps 1–3: ``q_nope (B, H, T, d_nope)``, ``q_pe (B, H, T, d_R)`` (rotated), ``c_kv (B, T, d_c)``
        (normalised), ``k_pe (B, T, d_R)`` (rotated)."""
        b, t, _ = x.shape
        if positions.shape[-1] != t:
            raise ValueError(f"positions {tuple(positions.shape)} do not match the {t} tokens of x")
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, self.n_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)
        cos, sin = self.rope_tables(positions)
        if positions.dim() == 2:                      # (B, T, d_R) -> broadcast over heads
            cos, sin = cos[:, None], sin[:, None]
        q_pe = self.rotate(q_pe, cos, sin)
        k_pe = self.rotate(k_pe[:, None], cos, sin)[:, 0]
        return q_nope, q_pe, c_kv, k_pe

    def kv_b_heads(self) -> tuple[Tensor, Tensor]:
        """The K and V rows of ``kv_b_proj`` per head: ``W_UK (H, d_nope, d_c)``, ``W_UV (H, d_v, d_c)``."""
        w = self.kv_b_proj.weight.view(self.n_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def forward(self, x: Tensor, positions: Tensor, mask: Tensor | None, cache: LatentCache | None = None,
                layer_idx: int = 0, absorb: bool = False) -> Tensor:
        b, t, _ = x.shape
        q_nope, q_pe, c_kv, k_pe = self.project(x, positions)
        if cache is not None:
            c_kv, k_pe = cache.update(layer_idx, c_kv, k_pe)
        rope_scores = q_pe @ k_pe.unsqueeze(1).transpose(-2, -1)                  # (B, H, T, S), shared k_pe
        if absorb:
            w_uk, w_uv = self.kv_b_heads()
            q_lat = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)                   # (B, H, T, d_c)
            scores = q_lat @ c_kv.unsqueeze(1).transpose(-2, -1) + rope_scores
            lat = _masked_softmax(scores * self.scaling, mask) @ c_kv.unsqueeze(1)  # (B, H, T, d_c)
            out = torch.einsum("bhtc,hvc->bhtv", lat, w_uv)
        else:
            s = c_kv.shape[1]
            kv = self.kv_b_proj(c_kv).view(b, s, self.n_heads, self.qk_nope_head_dim + self.v_head_dim).transpose(1, 2)
            k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            scores = q_nope @ k_nope.transpose(-2, -1) + rope_scores
            out = _masked_softmax(scores * self.scaling, mask) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.v_head_dim))


def mla_param_count(d_model: int, n_heads: int, q_lora_rank: int | None, kv_lora_rank: int, qk_nope_head_dim: int,
                    qk_rope_head_dim: int, v_head_dim: int, **_ignored) -> int:
    """Parameters of :class:`DeepSeekMLA` (formula; equals ``sum(p.numel())``): query path
    ``D·H·(d_nope+d_R)`` or ``D·q + q + q·H·(d_nope+d_R)``; ``D·(d_c+d_R) + d_c + d_c·H·(d_nope+d_v) + H·d_v·D``.
    Extra keyword arguments (such as ``n_layers``) are ignored so a size dict can be passed whole."""
    h, d, qk = n_heads, d_model, qk_nope_head_dim + qk_rope_head_dim
    q = d * h * qk if q_lora_rank is None else d * q_lora_rank + q_lora_rank + q_lora_rank * h * qk
    return (q + d * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank
            + kv_lora_rank * h * (qk_nope_head_dim + v_head_dim) + h * v_head_dim * d)


def hf_deepseek_attention_config(d_model: int = 64, n_heads: int = 4, q_lora_rank: int | None = None,
                                 kv_lora_rank: int = 16, qk_nope_head_dim: int = 16, qk_rope_head_dim: int = 8,
                                 v_head_dim: int = 16, rope_theta: float = 10000.0, rope_interleave: bool = True,
                                 max_position_embeddings: int = 64, rms_norm_eps: float = 1e-6):
    """A ``transformers.DeepseekV3Config`` (eager attention) with these attention sizes; defaults are the tiny
    parity config. Needs ``transformers``; imported lazily."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(vocab_size=100, hidden_size=d_model, num_attention_heads=n_heads,
                            num_key_value_heads=n_heads, q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank,
                            qk_nope_head_dim=qk_nope_head_dim, qk_rope_head_dim=qk_rope_head_dim,
                            v_head_dim=v_head_dim, rope_interleave=rope_interleave,
                            max_position_embeddings=max_position_embeddings, rms_norm_eps=rms_norm_eps,
                            rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
                            attn_implementation="eager")
