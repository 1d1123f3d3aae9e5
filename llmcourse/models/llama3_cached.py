"""Llama 3 with a KV cache (unit 12): the cache-aware classes and cached greedy generation.

Unit 11's :class:`~llmcourse.models.llama3.Llama3Model` and
:class:`~llmcourse.models.llama3.GroupedQueryAttention` stay cache-free. This module holds **separate**
classes with exactly the same ``state_dict`` keys (``embed_tokens.weight``,
``layers.{i}.input_layernorm.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.post_attention_layernorm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight``) and the same three non-persistent model-level buffers (``rope_cos``,
``rope_sin``, ``causal``), so one set of weights loads into both. Units 13–17 and ``course bench decode``
use these classes.

A forward with a cache:

* ``start = cache.seq_len`` is read **once**, before any layer appends;
* the new tokens sit at absolute positions ``start … start+T−1``: RoPE reads ``rope_cos[start:start+T]``
  (slices of the model's buffers) and the mask is the bottom-right ``causal[start:start+T, :start+T]``,
  which equals :func:`llmcourse.nn.masks.causal_mask` ``(T, start+T)``;
* each layer rotates the new keys at their own positions, appends them (after RoPE, with the ``KV`` key/value
  heads, before any head repetition) and attends with ``F.scaled_dot_product_attention(..., enable_gqa=True)``,
  which shares each KV head with its ``H/KV`` query heads without materialising repeated keys.

Equality with the uncached model is the contract: logits at every step equal the uncached forward on the
whole sequence (prefill, one-token decode, chunked prefill), up to float32 round-off.

Source: the decoding loop of ``transformers``' ``LlamaForCausalLM`` with ``DynamicCache`` (cache after RoPE,
per-layer ``(B, KV, T, hd)`` tensors), matched numerically in ``tests/test_unit12_cached_model.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.kv_cache import KVCache
from .llama3 import GroupedQueryAttention, Llama3Block, Llama3Model, RMSNorm

__all__ = ["CachedGroupedQueryAttention", "CachedLlama3Block", "CachedLlama3Model", "generate_cached", "time_decode_step",
           "generate_uncached"]


class CachedGroupedQueryAttention(GroupedQueryAttention):
    """Unit 11's grouped-query attention, able to read and extend a :class:`~llmcourse.nn.kv_cache.KVCache`.

    Same constructor and keys as :class:`~llmcourse.models.llama3.GroupedQueryAttention`
    (``q_proj.weight (H·hd, D)``, ``k_proj.weight (KV·hd, D)``, ``v_proj.weight (KV·hd, D)``,
    ``o_proj.weight (D, H·hd)``; no biases).

    ``forward(x, cos, sin, mask, cache=None, layer_idx=None)``: ``x (B, T, D)``; ``cos``/``sin`` ``(T, hd)``,
    the RoPE tables at the new tokens' absolute positions; ``mask`` a boolean ``(T, T_total)`` (True = may
    attend; ``None`` = attend to every key, as for a single decoding step). With a cache, the rotated keys
    and the values (``(B, KV, T, hd)``) are appended to layer ``layer_idx`` and attention runs over all
    ``T_total`` cached positions with ``F.scaled_dot_product_attention(..., enable_gqa=True)``. Returns
    ``(B, T, D)``.

    Raises:
        ValueError: a cache without ``layer_idx``.
    """

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: KVCache | None = None, layer_idx: int | None = None) -> Tensor:
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            if layer_idx is None:
                raise ValueError("a cache needs the layer_idx of this attention layer")
            k, v = cache.update(layer_idx, k, v)
        B, _, T, hd = q.shape
        gqa = self.n_rep > 1
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        elif k.shape[2] == T:   # no cached prefix: the square causal mask is SDPA's own is_causal
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * hd))


def _rms_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """``norm(x)`` for unit 11's :class:`~llmcourse.models.llama3.RMSNorm` in one ``F.rms_norm`` call (the same
    ``x·rsqrt(mean(x²) + eps)·weight`` in float32 without a Python-level op per step; a decoding step runs 2·L + 1
    norms); any other module is called as it is."""
    if type(norm) is RMSNorm and x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (norm.d,), norm.weight, norm.eps)
    return norm(x)


class CachedLlama3Block(Llama3Block):
    """Unit 11's Llama block with :class:`CachedGroupedQueryAttention` (same keys); passes the cache through."""

    attention_class = CachedGroupedQueryAttention

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: KVCache | None = None, layer_idx: int | None = None) -> Tensor:
        x = x + self.self_attn(_rms_norm(self.input_layernorm, x), cos, sin, mask, cache, layer_idx)
        return x + self.mlp(_rms_norm(self.post_attention_layernorm, x))


class CachedLlama3Model(Llama3Model):
    """Llama 3 decoder whose ``forward(idx, cache=None)`` prefills or extends a KV cache.

    Same ``state_dict`` keys, buffers and initialisation rule as :class:`llmcourse.models.llama3.Llama3Model`
    (built with the same seed, the two hold equal weights; ``load_state_dict`` moves weights between them).
    ``lm_head.weight`` is the embedding's Parameter when
    ``cfg.tie_word_embeddings``.

    ``forward(idx, cache=None)``: ``idx (B, T)`` long → logits ``(B, T, V)`` float32. Without a cache it is
    the ordinary causal forward over positions ``0 … T−1``. With a cache the tokens continue the cached
    sequence: positions ``start … start+T−1`` with ``start = cache.seq_len`` (read once, before layer 0
    appends), RoPE tables ``rope_cos[start:start+T]``, mask ``causal[start:start+T, :start+T]`` (=
    ``causal_mask(T, start+T)``, bottom-right), and every layer appends its rotated keys and values.

    Raises:
        ValueError: ``idx`` not 2-D, or ``start + T > cfg.context_length`` (the RoPE tables end there).
    """

    block_class = CachedLlama3Block

    def new_cache(self) -> KVCache:
        """An empty :class:`KVCache` with one slot per layer."""
        return KVCache(len(self.layers))

    def forward(self, idx: Tensor, cache: KVCache | None = None) -> Tensor:
        if not isinstance(idx, Tensor) or idx.dim() != 2:
            raise ValueError(f"expected token ids of shape (B, T), got {getattr(idx, 'shape', type(idx).__name__)}")
        T = idx.shape[1]
        start = cache.seq_len if cache is not None else 0
        if start + T > self.cfg.context_length:
            raise ValueError(f"positions {start}…{start + T - 1} exceed context_length={self.cfg.context_length}")
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        mask = None if T == 1 else self.causal[start:start + T, :start + T]
        x = self.embed_tokens(idx)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i)
        return self.lm_head(_rms_norm(self.norm, x))


class _PreallocatedKVCache(KVCache):
    """A :class:`~llmcourse.nn.kv_cache.KVCache` for a known final length (what :func:`generate_cached` uses).

    Each layer's keys and values are written into ``(B, KV, capacity, hd)`` buffers allocated at its first update;
    ``keys[i]`` / ``values[i]`` are views of the filled part, ``(B, KV, T, hd)``, with the contents, shapes,
    ``seq_len`` and ``nbytes()`` of a plain ``KVCache``. Each step copies only its new entries instead of the
    whole cache (``torch.cat`` copies ``O(T)`` per layer and step). An update past ``capacity`` falls back to
    ``torch.cat`` for that layer. Errors as :class:`~llmcourse.nn.kv_cache.KVCache`.
    """

    def __init__(self, n_layers: int, capacity: int):
        super().__init__(n_layers)
        self.capacity = int(capacity)
        self._buffers: list[tuple[Tensor, Tensor] | None] = [None] * self.n_layers

    def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if not 0 <= layer_idx < self.n_layers:
            raise IndexError(f"layer_idx {layer_idx} outside 0..{self.n_layers - 1}")
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"k and v must both be (B, KV, T_new, hd); got {tuple(k.shape)} and {tuple(v.shape)}")
        old = self.keys[layer_idx]
        start = 0 if old is None else old.shape[2]
        buf = self._buffers[layer_idx]
        if old is not None and (old.shape[:2] != k.shape[:2] or old.shape[3] != k.shape[3]):
            raise ValueError(f"layer {layer_idx} holds {tuple(old.shape)}; cannot append {tuple(k.shape)}")
        if start + k.shape[2] > self.capacity or (old is not None and buf is None):
            self._buffers[layer_idx] = None
            return super().update(layer_idx, k, v)
        if buf is None:
            b, kv, _, hd = k.shape
            buf = (k.new_empty(b, kv, self.capacity, hd), v.new_empty(b, kv, self.capacity, hd))
            self._buffers[layer_idx] = buf
        end = start + k.shape[2]
        buf[0][:, :, start:end] = k
        buf[1][:, :, start:end] = v
        self.keys[layer_idx], self.values[layer_idx] = buf[0][:, :, :end], buf[1][:, :, :end]
        return self.keys[layer_idx], self.values[layer_idx]

    def reset(self) -> None:
        super().reset()
        self._buffers = [None] * self.n_layers


@torch.no_grad()
def time_decode_step(model: nn.Module, batch_size: int, length: int, steps: int = 5, seed: int = 0) -> float:
    """Median wall time in ms of one cached decoding step (``T = 1``) with ``length`` positions already cached.

    The cache of every layer is filled with seeded random keys and values ``(batch_size, KV, length, hd)``
    (what a step reads does not depend on their values, and no prefill is needed), preallocated for the
    ``steps + 1`` steps that follow; one untimed step warms up, then ``steps`` steps are timed one by one. The
    model is put in eval mode and its previous mode restored. For the decoding roofline of unit 12 (bytes per
    step ÷ bandwidth, :func:`llmcourse.nn.kv_cache.decode_step_bytes`).

    Args:
        model: a :class:`CachedLlama3Model`.
        batch_size, length, steps: ``≥ 1``; ``length + steps + 1 ≤ model.cfg.context_length``.

    Raises:
        ValueError: a size below 1, or a length that does not fit the model's context.
    """
    import statistics
    import time

    cfg = model.cfg
    if min(batch_size, length, steps) < 1 or length + steps + 1 > cfg.context_length:
        raise ValueError(f"need batch_size, length, steps ≥ 1 and length + steps + 1 ≤ {cfg.context_length}; got "
                         f"{batch_size}, {length}, {steps}")
    g = torch.Generator().manual_seed(seed)
    hd = cfg.d_model // cfg.n_heads
    cache = _PreallocatedKVCache(len(model.layers), length + steps + 1)
    for i in range(len(model.layers)):
        cache.update(i, torch.randn(batch_size, cfg.n_kv_heads, length, hd, generator=g),
                     torch.randn(batch_size, cfg.n_kv_heads, length, hd, generator=g))
    tok = torch.zeros(batch_size, 1, dtype=torch.long)
    was_training = model.training
    model.eval()
    try:
        model(tok, cache=cache)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            model(tok, cache=cache)
            times.append(time.perf_counter() - start)
    finally:
        model.train(was_training)
    return 1000 * statistics.median(times)


def _check_prompt(idx: Tensor, max_new_tokens: int) -> None:
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.is_floating_point() or idx.shape[1] < 1:
        raise ValueError(f"idx must be a (B, T0) tensor of token ids with T0 ≥ 1, got "
                         f"{getattr(idx, 'dtype', type(idx).__name__)} {tuple(getattr(idx, 'shape', ()))}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")


@torch.no_grad()
def generate_cached(model: nn.Module, idx: Tensor, max_new_tokens: int, eos_id: int | None = None) -> Tensor:
    """Greedy generation with a KV cache: one prefill call on ``idx``, then one call per new token (``T = 1``).

    Args:
        model: a cache-aware model, ``model(idx, cache=KVCache) -> (B, T, V)`` (e.g. :class:`CachedLlama3Model`);
            its number of layers is ``len(model.layers)``.
        idx: ``(B, T0)`` long prompt, ``T0 ≥ 1``; ``T0 + max_new_tokens`` must fit the model's context.
        max_new_tokens: ``≥ 0``.
        eos_id: a row that produced it keeps emitting it; the loop stops once every row has.

    Returns:
        ``(B, T0 + n)`` long: the prompt followed by ``n ≤ max_new_tokens`` greedy tokens, equal to the tokens
        of :func:`generate_uncached` on the same model.

    A fresh cache is made for every call (a second prompt never sees the first one's keys). The model is put
    in eval mode and its previous mode restored.
    """
    _check_prompt(idx, max_new_tokens)
    was_training = model.training
    model.eval()
    try:
        # the final length is known: one buffer per layer instead of a torch.cat of the whole cache every step
        cache = _PreallocatedKVCache(len(model.layers), idx.shape[1] + max_new_tokens)
        out = [idx]
        done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
        if max_new_tokens == 0:
            return idx
        logits = model(idx, cache=cache)
        for step in range(max_new_tokens):
            nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            if eos_id is not None:
                nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
                done = done | (nxt[:, 0] == eos_id)
            out.append(nxt)
            if step == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
                break
            logits = model(nxt, cache=cache)
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)


@torch.no_grad()
def generate_uncached(model: nn.Module, idx: Tensor, max_new_tokens: int, eos_id: int | None = None) -> Tensor:
    """Greedy generation without a cache: every step runs ``model(whole sequence)`` (the reference for equality).

    Same arguments, result and EOS rule as :func:`generate_cached`; ``model(idx)`` must accept the whole
    sequence (at most the context length).
    """
    from ..train.sampling import generate

    _check_prompt(idx, max_new_tokens)
    # unit 09's greedy loop; a window as long as the final sequence never crops (the model checks its context)
    return generate(model, idx, max_new_tokens, context_length=idx.shape[1] + max_new_tokens, temperature=0.0,
                    eos_id=eos_id)
