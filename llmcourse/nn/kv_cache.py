"""The key/value cache of autoregressive decoding (unit 12).

During greedy or sampled decoding, every step feeds one new token. Its query attends to the keys and
values of **all** earlier positions, which never change (a causal model's past does not see the future),
so they are computed once and kept: the *KV cache*. Past queries are never used again, so queries are not
cached. Keys are cached **after** RoPE (each key rotated once, at its own absolute position) and with the
model's ``n_kv_heads`` heads (before any ``repeat_kv``), so a grouped-query model caches ``H / KV`` times
less than multi-head attention.

Memory of the cache (per model, in bytes)::

    2 · n_layers · n_kv_heads · head_dim · seq_len · batch_size · bytes_per_elem

(the 2 counts K and V). :data:`KV_PRESETS` lists the models the lesson's memory calculator knows.

Sources: the cache layout of ``transformers``' ``DynamicCache`` (a list of ``(B, KV, T, hd)`` tensors per
layer, appended on dim 2); GQA head grouping and MHA→GQA mean-pooling as in Ainslie et al. 2023,
"GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", section 2.1.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KV_PRESETS", "KVCache", "attn_cache_elems_per_token", "decode_step_bytes", "kv_cache_bytes",
           "kv_elements_per_token", "mha_to_gqa", "mla_cache_bytes"]


class KVCache:
    """Per-layer cache of keys and values, each ``(B, KV, T, hd)``, grown along dim 2.

    Args:
        n_layers: number of decoder layers (one K and one V tensor each).

    ``update(layer_idx, k, v)`` appends ``k`` and ``v`` (``(B, KV, T_new, hd)``) to layer ``layer_idx`` and
    returns the layer's full ``(keys, values)``, ``(B, KV, T_old + T_new, hd)``. ``seq_len`` is the cached
    length read from layer 0 (0 when empty): a model reads it **once**, before layer 0 appends. ``reset()``
    empties every layer; ``nbytes()`` is the number of bytes held by the cached K and V tensors (it equals
    :func:`kv_cache_bytes` for the cached length).

    Raises:
        IndexError: for a ``layer_idx`` outside ``0 … n_layers−1``.
        ValueError: when ``k``/``v`` are not 4-D with equal shapes, or batch, heads or head size differ from
            what the layer holds.
    """

    def __init__(self, n_layers: int):
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        self.n_layers = int(n_layers)
        self.keys: list[Tensor | None] = [None] * self.n_layers
        self.values: list[Tensor | None] = [None] * self.n_layers

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if not 0 <= layer_idx < self.n_layers:
            raise IndexError(f"layer_idx {layer_idx} outside 0..{self.n_layers - 1}")
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"k and v must both be (B, KV, T_new, hd); got {tuple(k.shape)} and {tuple(v.shape)}")
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        if old_k is None:
            new_k, new_v = k, v
        else:
            if old_k.shape[:2] != k.shape[:2] or old_k.shape[3] != k.shape[3]:
                raise ValueError(f"layer {layer_idx} holds {tuple(old_k.shape)}; cannot append {tuple(k.shape)}")
            new_k, new_v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.keys[layer_idx], self.values[layer_idx] = new_k, new_v
        return new_k, new_v

    @property
    def seq_len(self) -> int:
        k = self.keys[0]
        return 0 if k is None else int(k.shape[2])

    def reset(self) -> None:
        self.keys = [None] * self.n_layers
        self.values = [None] * self.n_layers

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)

    def __repr__(self) -> str:
        k = self.keys[0]
        shape = None if k is None else tuple(k.shape)
        return f"KVCache(n_layers={self.n_layers}, seq_len={self.seq_len}, layer0_shape={shape})"


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch_size: int = 1,
                   bytes_per_elem: int = 2) -> int:
    """Bytes of a KV cache: ``2 · n_layers · n_kv_heads · head_dim · seq_len · batch_size · bytes_per_elem``.

    ``bytes_per_elem`` is 4 for float32, 2 for bfloat16/float16 (default), 1 for fp8. Example: GPT-2 small
    (12 layers, 12 heads of 64) in bf16 caches 36,864 bytes per token, 36 MiB at 1,024 tokens.

    Raises:
        ValueError: if any argument is negative.
    """
    args = dict(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, seq_len=seq_len,
                batch_size=batch_size, bytes_per_elem=bytes_per_elem)
    bad = {k: v for k, v in args.items() if v < 0}
    if bad:
        raise ValueError(f"arguments must be non-negative, got {bad}")
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_elem


def decode_step_bytes(cfg, n_params: int, batch_size: int, length: int, dtype_bytes: int = 4) -> int:
    """Bytes one cached decoding step of a Llama-style model reads with ``length`` positions in its cache.

    Every weight once plus the K and V cache of every layer for ``length`` positions
    (:func:`kv_cache_bytes` with ``cfg.n_kv_heads`` heads of ``cfg.d_model // cfg.n_heads``). The token-embedding
    table: with a tied head (``cfg.tie_word_embeddings``) the head's matmul reads the whole ``(V, D)`` table every
    step (the looked-up rows are part of it), so every parameter counts; untied, only the ``batch_size`` looked-up
    rows of the embedding are read, and the head, part of ``n_params``, is read whole. Activations, the
    new K/V writes and the logits are small next to these and left out. Divided by a read bandwidth (bytes/s,
    :func:`llmcourse.runtime.read_bandwidth`) it is the shortest time a step can take when it is memory-bound:
    the roofline bound of unit 12 and ``course bench decode``.

    Args:
        cfg: a config with ``vocab_size``, ``d_model``, ``n_heads``, ``n_kv_heads``, ``n_layers`` and
            ``tie_word_embeddings`` (absent: untied) (:class:`~llmcourse.models.llama3.Llama3Config`).
        n_params: the model's parameter count (tied weights counted once).
        batch_size, length: sequences decoded together, and the cached positions of each.
        dtype_bytes: bytes per weight and per cached element (4 for float32).
    """
    if getattr(cfg, "tie_word_embeddings", False):
        weights = n_params * dtype_bytes  # the tied head reads the whole embedding table
    else:
        weights = (n_params - cfg.vocab_size * cfg.d_model + batch_size * cfg.d_model) * dtype_bytes
    head_dim = cfg.d_model // cfg.n_heads
    return weights + kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, head_dim, length, batch_size, dtype_bytes)


def kv_elements_per_token(n_layers: int, n_kv_heads: int, head_dim: int) -> int:
    """Cached elements per token and sequence: ``2 · n_layers · n_kv_heads · head_dim``."""
    return 2 * n_layers * n_kv_heads * head_dim


def attn_cache_elems_per_token(kind: str, n_layers: int, n_heads: int = 0, n_kv_heads: int = 0, head_dim: int = 0,
                               kv_lora_rank: int = 0, qk_rope_head_dim: int = 0,
                               k_head_dim: int | None = None, v_head_dim: int | None = None) -> int:
    """Cached elements per token (one sequence, all layers) for four attention designs.

    ``kind`` (case-insensitive):

    * ``"mha"``: ``L·H·(dk + dv)`` — every head caches its key and value;
    * ``"gqa"``: ``L·KV·(dk + dv)`` — ``n_kv_heads`` shared key/value heads;
    * ``"mqa"``: ``L·(dk + dv)`` — one shared key/value head;
    * ``"mla"``: ``L·(kv_lora_rank + qk_rope_head_dim)`` — the latent ``c_KV`` and the shared rope key ``k_pe``.

    ``dk``/``dv`` default to ``head_dim`` (``k_head_dim``/``v_head_dim`` override them: DeepSeek-V3's MHA
    equivalent has dk = 192, dv = 128). Multiply by the bytes per element and the token count for bytes. Examples:
    DeepSeek-V3 (61 layers, d_c 512, d_R 64): 35,136; MHA with the same heads (128 × (192 + 128)): 2,498,560.

    Raises:
        ValueError: an unknown ``kind`` or a negative size.

    Sources: Shazeer 2019 (MQA); Ainslie et al. 2023 (GQA); DeepSeek-V2 (2024), §2.1 and Table 1.
    """
    sizes = dict(n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                 kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim)
    bad = {k: v for k, v in sizes.items() if v < 0}
    if bad:
        raise ValueError(f"sizes must be non-negative, got {bad}")
    dk = head_dim if k_head_dim is None else k_head_dim
    dv = head_dim if v_head_dim is None else v_head_dim
    kind = kind.lower()
    if kind == "mha":
        return n_layers * n_heads * (dk + dv)
    if kind == "gqa":
        return n_layers * n_kv_heads * (dk + dv)
    if kind == "mqa":
        return n_layers * (dk + dv)
    if kind == "mla":
        return n_layers * (kv_lora_rank + qk_rope_head_dim)
    raise ValueError(f"unknown attention kind {kind!r}; choose 'mha', 'gqa', 'mqa' or 'mla'")


def mla_cache_bytes(n_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, seq_len: int, batch_size: int = 1,
                    bytes_per_elem: int = 2) -> int:
    """Bytes of a multi-head latent attention cache (unit 13):
    ``n_layers · (kv_lora_rank + qk_rope_head_dim) · seq_len · batch_size · bytes_per_elem``.

    It equals ``LatentCache.nbytes()`` of a filled cache. DeepSeek-V3 in bf16: 70,272 bytes per token.
    """
    return attn_cache_elems_per_token("mla", n_layers, kv_lora_rank=kv_lora_rank,
                                      qk_rope_head_dim=qk_rope_head_dim) * seq_len * batch_size * bytes_per_elem


def mha_to_gqa(k_proj_weight: Tensor, v_proj_weight: Tensor, n_heads: int, n_kv_heads: int) -> tuple[Tensor, Tensor]:
    """Convert multi-head K/V projections to grouped-query ones by mean-pooling each group of heads.

    Args:
        k_proj_weight, v_proj_weight: ``(H·hd, D)`` weights of ``nn.Linear`` key/value projections, whose rows
            ``h·hd … h·hd+hd−1`` belong to head ``h``.
        n_heads: ``H``; n_kv_heads: ``KV``, a divisor of ``H``.

    Returns:
        ``(KV·hd, D)`` weights: KV head ``g`` is the mean of heads ``g·r … g·r+r−1`` with ``r = H / KV``
        (contiguous groups, the grouping of ``repeat_interleave``/``repeat_kv``). ``KV == H`` returns the
        inputs' values; ``KV == 1`` the mean over all heads (MQA).

    Raises:
        ValueError: if ``H`` is not a multiple of ``KV`` or the row count is not a multiple of ``H``.

    Source: Ainslie et al. 2023 (GQA), section 2.1 ("mean-pooled" key and value heads).
    """
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
    out = []
    for w in (k_proj_weight, v_proj_weight):
        rows, d = w.shape
        if rows % n_heads:
            raise ValueError(f"weight rows {rows} are not a multiple of n_heads={n_heads}")
        hd = rows // n_heads
        out.append(w.reshape(n_kv_heads, n_heads // n_kv_heads, hd, d).mean(dim=1).reshape(n_kv_heads * hd, d))
    return out[0], out[1]


# The memory calculator's models: layers, query heads, KV heads, head size and parameter count (for the weight
# size). Real models from their published configs; the course's tiny models from their presets (units 10, 11).
KV_PRESETS: dict[str, dict] = {
    "GPT-2 small": dict(n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64, n_params=124_439_808),
    "Llama-3.2-1B": dict(n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, n_params=1_235_814_400),
    "Llama-3.2-3B": dict(n_layers=28, n_heads=24, n_kv_heads=8, head_dim=128, n_params=3_212_749_824),
    "Llama-3-8B": dict(n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, n_params=8_030_261_248),
    "llama3-tiny": dict(n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, n_params=795_904),
    "gpt2-char-tiny": dict(n_layers=4, n_heads=4, n_kv_heads=4, head_dim=32, n_params=809_856),
}
