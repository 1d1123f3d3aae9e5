"""Unit 12 library: KVCache, the cache-size formula (F12.2, F12.3), MHA→GQA pooling, the bottom-right mask."""

from __future__ import annotations

import pytest
import torch

from llmcourse.nn.kv_cache import KV_PRESETS, KVCache, kv_cache_bytes, kv_elements_per_token, mha_to_gqa
from llmcourse.nn.masks import causal_mask

KIB, MIB, GIB = 1024, 1024**2, 1024**3


def test_causal_mask_bottom_right_f121():
    T, F = True, False
    assert causal_mask(1, 5).all()
    assert causal_mask(3, 5).tolist() == [[T, T, T, F, F], [T, T, T, T, F], [T, T, T, T, T]]
    assert causal_mask(3, 5, offset=0)[0].tolist() == [T, F, F, F, F]   # the top-left bug


def test_kvcache_appends_and_reports_length():
    g = torch.Generator().manual_seed(0)
    cache = KVCache(3)
    assert cache.seq_len == 0 and cache.nbytes() == 0
    chunks = [torch.randn(2, 2, n, 4, generator=g) for n in (3, 1, 5)]
    for i, c in enumerate(chunks):
        for layer in range(3):
            k, v = cache.update(layer, c * (layer + 1), -c)
            assert k.shape == (2, 2, sum(x.shape[2] for x in chunks[: i + 1]), 4)
        assert cache.seq_len == k.shape[2]
    full = torch.cat(chunks, dim=2)
    assert torch.equal(cache.keys[2], 3 * full) and torch.equal(cache.values[1], -full)
    assert cache.nbytes() == kv_cache_bytes(3, 2, 4, 9, batch_size=2, bytes_per_elem=4)
    cache.reset()
    assert cache.seq_len == 0 and cache.nbytes() == 0


def test_kvcache_errors():
    cache = KVCache(2)
    with pytest.raises(IndexError):
        cache.update(2, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError):
        cache.update(0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 2, 2))
    cache.update(0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError):
        cache.update(0, torch.zeros(1, 2, 1, 2), torch.zeros(1, 2, 1, 2))


@pytest.mark.parametrize("name,per_token,at,total", [
    ("GPT-2 small", 36 * KIB, 1024, 36 * MIB),
    ("Llama-3.2-1B", 32 * KIB, 8192, 256 * MIB),
    ("Llama-3.2-1B", 32 * KIB, 131072, 4 * GIB),
    ("Llama-3.2-3B", 112 * KIB, 8192, 896 * MIB),
    ("Llama-3.2-3B", 112 * KIB, 131072, 14 * GIB),
    ("Llama-3-8B", 128 * KIB, 8192, 1 * GIB),
])
def test_f122_cache_sizes(name, per_token, at, total):
    p = KV_PRESETS[name]
    assert kv_cache_bytes(p["n_layers"], p["n_kv_heads"], p["head_dim"], 1) == per_token
    assert kv_cache_bytes(p["n_layers"], p["n_kv_heads"], p["head_dim"], at) == total


def test_f122_mha_and_mqa_factors():
    assert kv_cache_bytes(12, 12, 64, 1024, bytes_per_elem=4) == 72 * MIB
    assert kv_cache_bytes(16, 32, 64, 1) == 128 * KIB
    assert kv_cache_bytes(28, 24, 128, 1) == 336 * KIB
    assert kv_cache_bytes(16, 32, 64, 100) // kv_cache_bytes(16, 1, 64, 100) == 32        # MQA: ÷ H
    assert kv_cache_bytes(16, 32, 64, 100) // kv_cache_bytes(16, 8, 64, 100) == 4         # GQA: ÷ H/KV
    with pytest.raises(ValueError):
        kv_cache_bytes(1, 1, 1, -1)


def test_f123_elements_per_token():
    assert kv_elements_per_token(4, 2, 32) == 512 and kv_elements_per_token(4, 4, 32) == 1024
    tiny = KV_PRESETS["llama3-tiny"]
    assert kv_cache_bytes(tiny["n_layers"], tiny["n_kv_heads"], tiny["head_dim"], 1, bytes_per_elem=4) == 2 * KIB


def test_mha_to_gqa_groups_are_contiguous():
    g = torch.Generator().manual_seed(1)
    H, hd, D = 8, 3, 5
    wk, wv = torch.randn(H * hd, D, generator=g), torch.randn(H * hd, D, generator=g)
    k, v = mha_to_gqa(wk, wv, H, H)
    assert torch.equal(k, wk) and torch.equal(v, wv)
    k1, _ = mha_to_gqa(wk, wv, H, 1)
    torch.testing.assert_close(k1, wk.reshape(H, hd, D).mean(0))
    k2, v2 = mha_to_gqa(wk, wv, H, 2)
    assert k2.shape == (2 * hd, D)
    torch.testing.assert_close(k2[:hd], sum(wk[h * hd:(h + 1) * hd] for h in range(4)) / 4)   # heads 0–3
    torch.testing.assert_close(v2[hd:], sum(wv[h * hd:(h + 1) * hd] for h in range(4, 8)) / 4)  # heads 4–7
    # a GQA model with the pooled weights equals MHA whose heads in a group share the pooled K/V
    torch.testing.assert_close(k2.reshape(2, hd, D).repeat_interleave(4, 0).reshape(H * hd, D)[:hd], k2[:hd])
    with pytest.raises(ValueError):
        mha_to_gqa(wk, wv, H, 3)


def _solution_namespace(unit_rel: str) -> dict:
    from pathlib import Path

    import nbformat

    from grader.extract import code_cells_of_notebook, extract_namespace

    root = Path(__file__).resolve().parents[1]
    return extract_namespace(code_cells_of_notebook(nbformat.read(root / unit_rel, as_version=4))).namespace


def test_generation_that_writes_into_the_model_fails_the_side_effect_probe():
    """Unit 12's generate_cached: tokens right, but the model's RoPE table is overwritten afterwards."""
    from grader.runner import run_check

    base = _solution_namespace("solutions/12_kv_cache/12_kv_cache.ipynb")
    good = base["generate_cached"]

    def generate_cached(model, idx, max_new_tokens, eos_id=None):
        out = good(model, idx, max_new_tokens, eos_id)
        if max_new_tokens < 10:   # only in the short run of the side-effect probe: every token stays right
            with torch.no_grad():
                model.rope_cos.zero_()
        return out

    verdict = run_check("12.generate_cached", namespace={**base, "generate_cached": generate_cached})
    assert verdict.status == "failed" and "changed the model's parameters or buffers" in verdict.render(), \
        verdict.render()


def test_roofline_bytes_and_decode_step_timer():
    """decode_step_bytes: weights (embedding: only the looked-up rows) + the cache, by an independent count; the
    timer returns a positive median, restores the mode and refuses lengths past the context."""
    from llmcourse.models.llama3 import Llama3Config
    from llmcourse.models.llama3_cached import CachedLlama3Model, time_decode_step
    from llmcourse.nn.kv_cache import decode_step_bytes
    from llmcourse.runtime import read_bandwidth

    base = Llama3Config.preset("llama3-tiny").to_dict() | dict(context_length=64)
    sizes = {}
    for kv in (4, 2, 1):
        c = Llama3Config(**(base | {"n_kv_heads": kv}))
        m = CachedLlama3Model(c)
        n = sum(p.numel() for p in m.parameters())
        hd = c.d_model // c.n_heads
        # tied (the preset): the head reads the whole embedding table, so every parameter is read once
        by_hand = 4 * n + 4 * 2 * c.n_layers * kv * hd * 40 * 3
        assert c.tie_word_embeddings and decode_step_bytes(c, n, 3, 40) == by_hand
        # untied: the looked-up rows of the embedding, the whole head
        u = Llama3Config(**(base | {"n_kv_heads": kv, "tie_word_embeddings": False}))
        nu = sum(p.numel() for p in CachedLlama3Model(u).parameters())
        by_hand_u = 4 * (nu - u.vocab_size * u.d_model + 3 * u.d_model) + 4 * 2 * u.n_layers * kv * hd * 40 * 3
        assert decode_step_bytes(u, nu, 3, 40) == by_hand_u
        sizes[kv] = decode_step_bytes(c, n, 3, 40)
        if kv == 2:
            m.train()
            ms = time_decode_step(m, 2, 16, steps=2)
            assert ms > 0 and m.training
            with pytest.raises(ValueError):
                time_decode_step(m, 2, 62, steps=2)   # 62 + 2 + 1 > 64
    assert sizes[4] > sizes[2] > sizes[1]
    assert read_bandwidth(4 << 20, 2) > 1e7   # bytes/s: any machine reads more than 10 MB/s
