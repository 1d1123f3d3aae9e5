"""Unit 12 reference: the cache-aware Llama classes equal the cache-free model (prefill, decode, chunked prefill),
keep unit 11's keys, cache (B, KV, T, hd) rotated keys, and generate the same greedy tokens as transformers."""

from __future__ import annotations

import pytest
import torch

from llmcourse.models.llama3 import Llama3Config, Llama3Model, load_hf_llama, random_hf_llama
from llmcourse.models.llama3_cached import CachedLlama3Model, generate_cached, generate_uncached
from llmcourse.nn.kv_cache import KVCache


@pytest.fixture(scope="module")
def pair():
    cfg = Llama3Config.preset("llama3-tiny")
    torch.manual_seed(0)
    plain = Llama3Model(cfg).eval()
    cached = CachedLlama3Model(cfg).eval()
    cached.load_state_dict(plain.state_dict())
    return plain, cached


def test_same_keys_and_buffers(pair):
    plain, cached = pair
    assert list(plain.state_dict()) == list(cached.state_dict())
    assert [n for n, _ in cached.named_buffers()] == ["rope_cos", "rope_sin", "causal"]
    assert cached.lm_head.weight is cached.embed_tokens.weight


@torch.no_grad()
def test_same_seed_same_weights_as_the_cache_free_model():
    """The cached model builds unit 11's layer structure once (no second initialisation): same seed, same weights."""
    cfg = Llama3Config.preset("llama3-tiny")
    torch.manual_seed(3)
    plain = Llama3Model(cfg)
    torch.manual_seed(3)
    cached = CachedLlama3Model(cfg)
    a, b = plain.state_dict(), cached.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert type(cached.layers[0].self_attn).__name__ == "CachedGroupedQueryAttention"


def test_prefill_decode_and_chunks_equal_uncached(pair):
    plain, cached = pair
    idx = torch.randint(0, 65, (3, 24), generator=torch.Generator().manual_seed(1))
    full = plain(idx)
    for chunks in ([24], [8] + [1] * 16, [3, 1, 5, 2, 13]):
        cache = KVCache(4)
        outs, pos = [], 0
        for n in chunks:
            outs.append(cached(idx[:, pos:pos + n], cache))
            pos += n
        torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=0)
        assert cache.seq_len == 24 and cache.keys[3].shape == (3, 2, 24, 32)
    with pytest.raises(ValueError):
        cached(torch.zeros(1, 2, dtype=torch.long), _full_cache(cached))


def _full_cache(model):
    cache = KVCache(4)
    model(torch.zeros(1, 255, dtype=torch.long), cache)
    return cache


@torch.no_grad()
def test_cached_keys_are_rotated_at_their_positions(pair):
    _, cached = pair
    idx = torch.randint(0, 65, (1, 6), generator=torch.Generator().manual_seed(2))
    cache = KVCache(4)
    cached(idx, cache)
    attn = cached.layers[0].self_attn
    x = cached.layers[0].input_layernorm(cached.embed_tokens(idx))
    _, k, v = attn.project(x, cached.rope_cos[:6], cached.rope_sin[:6])
    torch.testing.assert_close(cache.keys[0], k)
    torch.testing.assert_close(cache.values[0], v)


def test_generate_cached_equals_uncached_and_transformers():
    cfg = Llama3Config.preset("llama3-tiny")
    hf = random_hf_llama(cfg, seed=4, std=0.1, attn_implementation="sdpa")
    model = load_hf_llama(CachedLlama3Model(cfg), hf.state_dict()).eval()
    idx = torch.randint(0, 65, (2, 7), generator=torch.Generator().manual_seed(3))
    ours = generate_cached(model, idx, 30)
    assert ours.shape == (2, 37) and torch.equal(ours, generate_uncached(model, idx, 30))
    hf.generation_config.eos_token_id = None
    theirs = hf.generate(input_ids=idx, attention_mask=torch.ones_like(idx), max_new_tokens=30, do_sample=False,
                         use_cache=True, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_generate_cached_eos_and_edge_cases(pair):
    _, cached = pair
    idx = torch.randint(0, 65, (2, 5), generator=torch.Generator().manual_seed(5))
    free = generate_cached(cached, idx, 12)
    eos = int(free[0, 7])
    out = generate_cached(cached, idx, 12, eos_id=eos)
    assert torch.equal(out, generate_uncached(cached, idx, 12, eos_id=eos))
    assert (out[0, 8:] == eos).all()
    assert torch.equal(generate_cached(cached, idx, 0), idx)
    with pytest.raises(ValueError):
        generate_cached(cached, idx.float(), 3)
