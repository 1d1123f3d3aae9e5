"""Unit 13 library: multi-head latent attention against transformers' DeepseekV3Attention and independent routes.

Oracles: ``DeepseekV3Attention`` (eager, transformers 5.x) with copied weights for both ``rope_interleave``
settings, with and without query compression; the absorbed path and the cache against the naive full forward;
the cache-size formulas against ``LatentCache.nbytes()`` of caches filled with tensors of the stated shapes.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmcourse.models.deepseek_mla import (
    DEEPSEEK_V3_MLA,
    DeepSeekMLA,
    LatentCache,
    SimpleMLA,
    absorb_mla_weights,
    absorbed_forward,
    hf_deepseek_attention_config,
    mla_param_count,
)
from llmcourse.nn.kv_cache import attn_cache_elems_per_token, mla_cache_bytes

TINY = dict(d_model=64, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


def _causal(t, s=None):
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)


def _hf_attention(q_lora_rank, rope_interleave, seed=0):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    cfg = hf_deepseek_attention_config(q_lora_rank=q_lora_rank, rope_interleave=rope_interleave)
    att = DeepseekV3Attention(cfg, layer_idx=0).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in att.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return cfg, att


def _hf_out(cfg, att, x):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    b, t, _ = x.shape
    cos, sin = DeepseekV3RotaryEmbedding(cfg)(x, torch.arange(t)[None].expand(b, t))
    add = torch.zeros(t, t).masked_fill(~_causal(t), float("-inf"))[None, None]
    with torch.no_grad():
        return att(x, (cos, sin), add)[0]


@pytest.mark.parametrize("q_lora_rank", [None, 24])
@pytest.mark.parametrize("rope_interleave", [True, False])
def test_deepseek_mla_matches_transformers(q_lora_rank, rope_interleave):
    cfg, att = _hf_attention(q_lora_rank, rope_interleave)
    x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(1))
    ref = _hf_out(cfg, att, x)
    m = DeepSeekMLA(q_lora_rank=q_lora_rank, rope_interleave=rope_interleave, **TINY).eval()
    m.load_state_dict(att.state_dict(), strict=True)
    assert set(m.state_dict()) == set(att.state_dict())
    with torch.no_grad():
        out = m(x, torch.arange(9), _causal(9))
        absorbed = m(x, torch.arange(9), _causal(9), absorb=True)
        batched_positions = m(x, torch.arange(9)[None].expand(2, 9), _causal(9))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(absorbed, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(batched_positions, out, atol=1e-6, rtol=0)
    # the other RoPE layout is a different model on the same weights
    other = DeepSeekMLA(q_lora_rank=q_lora_rank, rope_interleave=not rope_interleave, **TINY).eval()
    other.load_state_dict(att.state_dict())
    with torch.no_grad():
        assert (other(x, torch.arange(9), _causal(9)) - ref).abs().max() > 1e-3


@pytest.mark.parametrize("absorb", [False, True])
def test_cached_decoding_equals_the_full_forward_and_caches_only_the_latent(absorb):
    torch.manual_seed(0)
    m = DeepSeekMLA(q_lora_rank=24, **TINY).eval()
    x = torch.randn(2, 10, 64)
    cache = LatentCache(1)
    with torch.no_grad():
        full = m(x, torch.arange(10), _causal(10))
        parts = [m(x[:, :6], torch.arange(6), _causal(6), cache=cache, absorb=absorb)]
        for i in range(6, 10):
            parts.append(m(x[:, i:i + 1], torch.arange(i, i + 1), None, cache=cache, absorb=absorb))
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)
    assert cache.seq_len == 10
    assert cache.c_kv[0].shape == (2, 10, 16) and cache.k_pe[0].shape == (2, 10, 8)
    assert cache.nbytes() == 1 * (16 + 8) * 10 * 2 * 4


def test_position_shift_leaves_the_output_unchanged():
    torch.manual_seed(1)
    for il in (True, False):
        m = DeepSeekMLA(q_lora_rank=None, rope_interleave=il, **TINY).eval()
        x = torch.randn(1, 7, 64)
        with torch.no_grad():
            a = m(x, torch.arange(7), _causal(7))
            b = m(x, torch.arange(7) + 37, _causal(7))
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)


def _f131():
    torch.manual_seed(0)
    m = SimpleMLA(32, 4, 8, 6).double()
    with torch.no_grad():
        for name in ("W_q", "W_dkv", "W_uk", "W_uv", "W_o"):
            w = getattr(m, name).weight
            w.copy_(torch.randn(w.shape, dtype=torch.float64))
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    return m, x


def test_simple_mla_against_an_explicit_per_head_loop():
    m, x = _f131()
    mask = _causal(5)
    out = torch.zeros(2, 5, 32, dtype=torch.float64)
    with torch.no_grad():
        c = x @ m.W_dkv.weight.T
        for h in range(4):
            rows = slice(8 * h, 8 * h + 8)
            q, k, v = x @ m.W_q.weight[rows].T, c @ m.W_uk.weight[rows].T, c @ m.W_uv.weight[rows].T
            s = (q @ k.transpose(1, 2) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
            out += torch.softmax(s, -1) @ v @ m.W_o.weight[:, rows].T
        torch.testing.assert_close(m(x, mask), out, atol=1e-10, rtol=0)


def test_absorption_equals_naive_and_the_head_split_form_does_not():
    m, x = _f131()
    mask = _causal(5)
    with torch.no_grad():
        c = m.W_dkv(x)
        naive, absorbed = m(x, mask), absorbed_forward(m, x, c, mask)
        assert (naive - absorbed).abs().max() < 1e-10
        a, bo = absorb_mla_weights(m)
        assert a.shape == (4, 32, 6) and bo.shape == (4, 32, 6)
        torch.testing.assert_close(a[2], m.W_q.weight[16:24].T @ m.W_uk.weight[16:24])
        torch.testing.assert_close(bo[1], m.W_o.weight[:, 8:16] @ m.W_uv.weight[8:16])
        good = torch.einsum("btd,hdc,bjc->bhtj", x, a, c)
        wrong = torch.einsum("bthe,hec,bjc->bhtj", x.view(2, 5, 4, 8),
                             (m.W_q.weight @ m.W_uk.weight).view(4, 8, 6), c)
        assert (good - wrong).abs().max() > 100
    # recomputed from the current weights on every call
    with torch.no_grad():
        m.W_uk.weight.mul_(2)
        torch.testing.assert_close(absorbed_forward(m, x, m.W_dkv(x), mask), m(x, mask), atol=1e-10, rtol=0)


def test_simple_mla_cache_decode_equals_full_and_nbytes():
    torch.manual_seed(3)
    m = SimpleMLA(32, 4, 8, 6).eval()
    x = torch.randn(3, 8, 32)
    cache = LatentCache(2)
    with torch.no_grad():
        full = m(x, _causal(8))
        parts = [m(x[:, :5], _causal(5), cache=cache, layer_idx=1)]
        for i in range(5, 8):
            parts.append(m(x[:, i:i + 1], None, cache=cache, layer_idx=1))
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)
    assert cache.c_kv[1].shape == (3, 8, 6) and cache.k_pe[1] is None and cache.seq_len == 0
    assert cache.nbytes() == 6 * 8 * 3 * 4


def test_latent_cache_errors_and_reset():
    c = LatentCache(2)
    with pytest.raises(IndexError):
        c.update(2, torch.zeros(1, 1, 4))
    with pytest.raises(ValueError):
        c.update(0, torch.zeros(1, 4))
    with pytest.raises(ValueError):
        c.update(0, torch.zeros(1, 3, 4), torch.zeros(1, 2, 2))
    c.update(0, torch.zeros(1, 3, 4), torch.zeros(1, 3, 2))
    with pytest.raises(ValueError):
        c.update(0, torch.zeros(1, 1, 5), torch.zeros(1, 1, 2))
    assert c.seq_len == 3
    c.reset()
    assert c.seq_len == 0 and c.nbytes() == 0
    with pytest.raises(ValueError):
        LatentCache(0)


def test_cache_elements_per_token_formulas():
    v3 = DEEPSEEK_V3_MLA
    mla = attn_cache_elems_per_token("mla", v3["n_layers"], kv_lora_rank=512, qk_rope_head_dim=64)
    mha = attn_cache_elems_per_token("mha", 61, n_heads=128, k_head_dim=192, v_head_dim=128)
    assert mla == 35_136 and mla * 2 == 70_272
    assert mha == 2_498_560 and round(mha / mla, 1) == 71.1
    assert 576 / (2 * 128) == 2.25
    assert round(mla_cache_bytes(61, 512, 64, 131_072) / 2**30, 2) == 8.58
    assert round(mha * 2 * 131_072 / 2**30) == 610
    assert attn_cache_elems_per_token("MLA", 4, kv_lora_rank=64, qk_rope_head_dim=16) == 320
    assert attn_cache_elems_per_token("gqa", 4, n_heads=4, n_kv_heads=2, head_dim=32) == 512
    assert attn_cache_elems_per_token("mha", 4, n_heads=4, head_dim=32) == 1024
    assert attn_cache_elems_per_token("mqa", 4, head_dim=32) == 256
    with pytest.raises(ValueError):
        attn_cache_elems_per_token("mlp", 4)


def test_v3_shapes_and_cache_bytes_on_meta_and_filled_cache():
    v3 = DEEPSEEK_V3_MLA
    with torch.device("meta"):
        m = DeepSeekMLA(v3["d_model"], v3["n_heads"], v3["q_lora_rank"], v3["kv_lora_rank"], v3["qk_nope_head_dim"],
                        v3["qk_rope_head_dim"], v3["v_head_dim"])
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes["q_a_proj.weight"] == (1536, 7168) and shapes["q_b_proj.weight"] == (24576, 1536)
    assert shapes["kv_a_proj_with_mqa.weight"] == (576, 7168) and shapes["kv_b_proj.weight"] == (32768, 512)
    assert shapes["o_proj.weight"] == (7168, 16384) and m.scaling == 192 ** -0.5
    assert mla_param_count(**v3) == sum(p.numel() for p in m.parameters())
    cache = LatentCache(v3["n_layers"])
    for i in range(v3["n_layers"]):
        cache.update(i, torch.zeros(1, 3, 512, dtype=torch.bfloat16), torch.zeros(1, 3, 64, dtype=torch.bfloat16))
    assert cache.nbytes() == 3 * 70_272 == mla_cache_bytes(61, 512, 64, 3)


def test_parameter_counts_of_the_tiny_comparison():
    m = DeepSeekMLA(128, 4, None, 64, 32, 16, 32)
    assert sum(p.numel() for p in m.parameters()) == 67_648 == mla_param_count(128, 4, None, 64, 32, 16, 32)
