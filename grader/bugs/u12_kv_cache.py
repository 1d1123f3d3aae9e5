"""Bug catalog of unit 12 (the KV cache): one known-wrong implementation per syllabus entry.

The cached-forward mutants are the reference classes (``llmcourse.models.llama3_cached``) with exactly one
mistake in where positions, masks or cached keys come from; they are named by matching the learner's logits on
the failing probe (``detect="mutant"``) or, for the cache layout, by the shape of the cached keys
(``detect="detector"``). ``generate_cached`` mutants are named by their tokens, or by the recorded call pattern
(recomputing every token without a cache).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmcourse.models.llama3 import apply_rope, repeat_kv
from llmcourse.models.llama3_cached import CachedGroupedQueryAttention, CachedLlama3Model
from llmcourse.nn.kv_cache import KVCache
from llmcourse.nn.masks import causal_mask

from ..core import bug_group

U = "12"


# ---------------------------------------------------------------- cached_forward


class _Attn(CachedGroupedQueryAttention):
    """Attention that always uses the mask it is given; ``None`` = bottom-right over the cached keys."""

    variant = "plain"

    def forward(self, x, cos, sin, mask, cache=None, layer_idx=None):
        B, T, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        if self.variant == "prerope":
            hd = self.head_dim
            k = self.k_proj(x).view(B, T, self.n_kv_heads, hd).transpose(1, 2)   # raw keys cached
        if self.variant == "after_repeat":
            k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
        if cache is not None:
            k, v = cache.update(layer_idx, k, v)
        if self.variant == "prerope":
            k = apply_rope(k, cos[-1:], sin[-1:])    # every key rotated at the current position
        if mask is None:
            mask = causal_mask(T, k.shape[2], device=x.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


def _model(attn_variant: str, positions: str = "ok", mask: str = "ok"):
    attn_cls = type(f"GroupedQueryAttention_{attn_variant}", (_Attn,), {"variant": attn_variant})

    class Llama3Model(CachedLlama3Model):
        def __init__(self, cfg):
            super().__init__(cfg)
            for layer in self.layers:
                layer.self_attn = attn_cls(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.hd)

        def forward(self, idx, cache=None):
            T = idx.shape[1]
            start = cache.seq_len if cache is not None else 0
            if start + T > self.cfg.context_length:
                raise ValueError("too long")
            x = self.embed_tokens(idx)
            for i, layer in enumerate(self.layers):
                if positions == "after_update":
                    s = cache.seq_len if cache is not None else 0   # read again after earlier layers appended
                elif positions == "restart":
                    s = 0
                else:
                    s = start
                cos, sin = self.rope_cos[s:s + T], self.rope_sin[s:s + T]
                m = causal_mask(T, start + T, offset=0) if mask == "top_left" else None
                x = layer(x, cos, sin, m, cache, i)
            return self.lm_head(self.norm(x))

    return attn_cls, Llama3Model


def _cf(bug_id, hint, detect="mutant", **kw):
    attn, model = _model(**kw)
    bug_group(bug_id, f"{U}.cached_forward", hint, {"GroupedQueryAttention": attn, "Llama3Model": model},
              detect=detect)


_cf("B12.positions_restart", "New tokens sit at absolute positions `start + i`.", attn_variant="plain",
    positions="restart")
_cf("B12.start_after_update", "Read the cache length once, before the first layer.", attn_variant="plain",
    positions="after_update")
_cf("B12.mask_top_left", "Align the causal mask bottom-right: offset = cached length.", attn_variant="plain",
    mask="top_left")
_cf("B12.cache_after_repeat", "Cache the KV heads; repeat only for the matmul.", detect="detector",
    attn_variant="after_repeat")
_cf("B12.cache_prerope_rerotated", "Rotate each key once, at its own position, before caching.",
    attn_variant="prerope")


# ---------------------------------------------------------------- generate_cached


@torch.no_grad()
def _gen_no_cache(model, idx, max_new_tokens, eos_id=None):
    model.eval()
    for _ in range(max_new_tokens):   # recomputes keys and values of every token at every step
        nxt = model(idx)[:, -1, :].argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


@torch.no_grad()
def _gen_no_reset(model, idx, max_new_tokens, eos_id=None):
    model.eval()
    cache = getattr(model, "_kept_cache", None)
    if cache is None:
        cache = model._kept_cache = KVCache(len(model.layers))   # one cache for every prompt
    out = [idx]
    if max_new_tokens == 0:
        return idx
    logits = model(idx, cache=cache)
    for step in range(max_new_tokens):
        nxt = logits[:, -1, :].argmax(-1, keepdim=True)
        out.append(nxt)
        if step < max_new_tokens - 1:
            logits = model(nxt, cache=cache)
    return torch.cat(out, dim=1)


@torch.no_grad()
def _gen_prefill_twice(model, idx, max_new_tokens, eos_id=None):
    model.eval()
    cache = KVCache(len(model.layers))
    out = [idx]
    if max_new_tokens == 0:
        return idx
    logits = model(idx, cache=cache)
    for step in range(max_new_tokens):
        nxt = logits[:, -1, :].argmax(-1, keepdim=True)
        out.append(nxt)
        if step < max_new_tokens - 1:
            feed = torch.cat([idx[:, -1:], nxt], dim=1) if step == 0 else nxt   # the last prompt token again
            logits = model(feed, cache=cache)
    return torch.cat(out, dim=1)


def _gen_eos(rule):
    """Cached greedy generation whose EOS handling follows ``rule``: "ignore" (runs to max_new_tokens, no fill),
    "first_row" (stops as soon as any row produced eos) or "no_fill" (finished rows go on with ordinary tokens)."""
    @torch.no_grad()
    def generate_cached(model, idx, max_new_tokens, eos_id=None):
        model.eval()
        if max_new_tokens == 0:
            return idx
        cache = KVCache(len(model.layers))
        done = torch.zeros(idx.shape[0], dtype=torch.bool)
        logits = model(idx, cache=cache)
        for step in range(max_new_tokens):
            nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            if eos_id is not None and rule != "ignore":
                if rule == "first_row" or rule == "no_fill":   # no eos_id written into finished rows
                    done = done | (nxt[:, 0] == eos_id)
            idx = torch.cat([idx, nxt], dim=1)
            stop = bool(done.any()) if rule == "first_row" else bool(done.all())
            if step == max_new_tokens - 1 or (eos_id is not None and rule != "ignore" and stop):
                break
            logits = model(nxt, cache=cache)
        return idx
    return generate_cached


bug_group("B12.eos_ignored", f"{U}.generate_cached", "With an eos_id, a row that has produced it is finished: it "
          "keeps emitting eos_id, and the loop ends when every row is finished.", {"generate_cached": _gen_eos("ignore")})
bug_group("B12.eos_stops_at_first_row", f"{U}.generate_cached", "One finished row does not end the batch: the loop "
          "stops only when every row has produced eos_id.", {"generate_cached": _gen_eos("first_row")})
bug_group("B12.eos_no_fill", f"{U}.generate_cached", "A finished row keeps emitting eos_id while the other rows go "
          "on (its greedy tokens after eos_id are not part of the answer).", {"generate_cached": _gen_eos("no_fill")})
bug_group("B12.cache_queries", f"{U}.generate_cached", "Pass the KV cache to every model call: the keys and "
          "values of past tokens are computed once, stored, and reused.", {"generate_cached": _gen_no_cache},
          detect="detector")


@torch.no_grad()
def _gen_rerun_sequence(model, idx, max_new_tokens, eos_id=None):
    model.eval()
    cache = KVCache(len(model.layers))
    for _ in range(max_new_tokens):   # the whole sequence again at every step, through a cache emptied first
        cache.reset()
        nxt = model(idx, cache=cache)[:, -1, :].argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


bug_group("B12.rerun_sequence", f"{U}.generate_cached", "After the prefill, each step feeds only the token generated "
          "last (T = 1): the cache already holds the keys and values of every earlier token, so running the whole "
          "sequence again recomputes them all.", {"generate_cached": _gen_rerun_sequence}, detect="detector")
bug_group("B12.no_reset", f"{U}.generate_cached", "Reset (or create) the cache per prompt.",
          {"generate_cached": _gen_no_reset})
bug_group("B12.prefill_twice", f"{U}.generate_cached", "After prefill, feed only the newly generated token.",
          {"generate_cached": _gen_prefill_twice})


# ---------------------------------------------------------------- kv_cache_bytes


def _bytes_no_factor2(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):
    return n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_elem


bug_group("B12.bytes_no_factor2", f"{U}.kv_cache_bytes", "There are two tensors (K and V) per layer.",
          {"kv_cache_bytes": _bytes_no_factor2})


def _bytes_ignores_batch(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * bytes_per_elem


bug_group("B12.bytes_ignores_batch", f"{U}.kv_cache_bytes", "Every sequence of the batch keeps keys and values of "
          "its own: the cache grows with the batch as it grows with the length.",
          {"kv_cache_bytes": _bytes_ignores_batch})
# No "uses n_heads" mutant: kv_cache_bytes receives the number of KV heads and nothing else about heads, so a
# function that names its second parameter n_heads computes the right bytes for every call (it used to be
# catalogued; it was not a bug). Confusing H with KV is a mistake of the caller: the lesson's memory table
# prints both.


# ---------------------------------------------------------------- mha_to_gqa


def _gqa_strided(k_proj_weight, v_proj_weight, n_heads, n_kv_heads):
    out = []
    for w in (k_proj_weight, v_proj_weight):
        rows, d = w.shape
        hd = rows // n_heads
        out.append(w.reshape(n_heads // n_kv_heads, n_kv_heads, hd, d).mean(0).reshape(n_kv_heads * hd, d))
    return out[0], out[1]


bug_group("B12.gqa_strided_groups", f"{U}.mha_to_gqa", "Groups are contiguous, as in `repeat_interleave`.",
          {"mha_to_gqa": _gqa_strided})
