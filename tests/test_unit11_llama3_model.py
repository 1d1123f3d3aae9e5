"""Unit 11: the Llama 3 library pieces (RMSNorm, SwiGLU, RoPE, GQA, the model, the transformers loader).

Oracles: ``transformers``' ``LlamaForCausalLM`` / ``LlamaRotaryEmbedding`` / ``apply_rotary_pos_emb`` /
``LlamaMLP`` / ``LlamaRMSNorm`` with re-drawn weights, ``torch.nn.RMSNorm``, ``torch.repeat_interleave``,
an explicit softmax attention, and the syllabus's literal numbers (F11.1–F11.5), independent of the code.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from llmcourse.models import (
    GroupedQueryAttention,
    Llama3Config,
    Llama3Model,
    RMSNorm,
    SwiGLUFeedForward,
    apply_rope,
    apply_rope_interleaved,
    count_parameters,
    interleaved_to_half_split_perm,
    llama3_param_count,
    llama_parity_configs,
    load_hf_llama,
    random_hf_llama,
    repeat_kv,
    rope_cos_sin,
    rope_inv_freq,
    rotate_half,
)

SCALING = {"factor": 32, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}


def test_inv_freq_fixture():
    plain = rope_inv_freq(16, 500000)
    want = torch.tensor([1.0, 0.19392, 0.037606, 0.0072927, 0.0014142, 2.7425e-4, 5.3183e-5, 1.0313e-5])
    torch.testing.assert_close(plain, want, rtol=1e-4, atol=0)
    wl = 2 * math.pi / plain
    torch.testing.assert_close(wl, torch.tensor([6.28, 32.4, 167.1, 861.6, 4442.9, 22910.6, 118142.8, 609226.3]),
                               rtol=1e-3, atol=0)
    smooth = rope_inv_freq(16, 500000, SCALING)
    want = torch.tensor([1.0, 0.19392, 0.037606, 0.0072927, 4.2956e-4, 8.5703e-6, 1.6620e-6, 3.2229e-7])
    torch.testing.assert_close(smooth, want, rtol=1e-4, atol=0)
    s = (8192 / wl[4] - 1) / (4 - 1)
    assert abs(float(s) - 0.28128) < 1e-4


@pytest.mark.parametrize("scaling", [None, SCALING])
def test_inv_freq_equals_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = {"rope_type": "llama3" if scaling else "default", "rope_theta": 500000.0, **(scaling or {})}
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=131072, rope_parameters=rope)
    hf = LlamaRotaryEmbedding(cfg)
    assert torch.equal(rope_inv_freq(32, 500000.0, scaling), hf.inv_freq)
    x = torch.randn(1, 10, 128)
    pos = torch.arange(10)[None]
    cos_hf, sin_hf = hf(x, pos)
    cos, sin = rope_cos_sin(rope_inv_freq(32, 500000.0, scaling), torch.arange(10))
    torch.testing.assert_close(cos, cos_hf[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sin, sin_hf[0], atol=1e-6, rtol=1e-5)


def test_rope_fixture_f112_and_properties():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.equal(rotate_half(x), torch.tensor([-3.0, -4.0, 1.0, 2.0]))
    inv = rope_inv_freq(4, 10000.0)
    torch.testing.assert_close(inv, torch.tensor([1.0, 0.01]))
    cos, sin = rope_cos_sin(inv, torch.arange(2))
    torch.testing.assert_close(apply_rope(x, cos[1], sin[1]), torch.tensor([-1.9841, 1.9599, 2.4624, 4.0198]),
                               atol=1e-4, rtol=0)
    torch.testing.assert_close(apply_rope_interleaved(x, cos[1], sin[1]),
                               torch.tensor([-1.1426, 1.9221, 2.9599, 4.0298]), atol=1e-4, rtol=0)
    assert torch.equal(apply_rope(x, cos[0], sin[0]), x)
    assert interleaved_to_half_split_perm(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    # relative property and norm preservation on random vectors
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 64, generator=g)
    cos, sin = rope_cos_sin(rope_inv_freq(64, 10000.0), torch.arange(200))

    def score(m, n):
        return float(apply_rope(q, cos[m], sin[m]) @ apply_rope(k, cos[n], sin[n]))

    for m, n, s in [(5, 2, 40), (17, 30, 100), (0, 9, 150)]:
        assert abs(score(m, n) - score(m + s, n + s)) < 1e-4
    torch.testing.assert_close(apply_rope(q, cos[77], sin[77]).norm(), q.norm())


def test_apply_rope_equals_transformers_and_perm_makes_scores_equal():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 2, 3, 9, 16, generator=g)
    cos, sin = rope_cos_sin(rope_inv_freq(16, 10000.0), torch.arange(9))
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    torch.testing.assert_close(apply_rope(q, cos, sin), q_hf, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(apply_rope(k, cos, sin), k_hf, atol=1e-6, rtol=1e-5)
    # scores of an "interleaved checkpoint": permuting the head dims turns them into half-split scores
    perm = interleaved_to_half_split_perm(16)
    s_inter = apply_rope_interleaved(q, cos, sin) @ apply_rope_interleaved(k, cos, sin).transpose(-1, -2)
    s_half = apply_rope(q[..., perm], cos, sin) @ apply_rope(k[..., perm], cos, sin).transpose(-1, -2)
    torch.testing.assert_close(s_half, s_inter, atol=1e-5, rtol=1e-5)
    s_wrong = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-1, -2)
    assert (s_wrong - s_inter).abs().max() > 1e-2


def test_rmsnorm_and_swiglu_oracles():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 24, generator=g) * 3 + 1
    ours = RMSNorm(24)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(24, generator=g))
    ref = torch.nn.RMSNorm(24, eps=1e-5)
    ref.load_state_dict(ours.state_dict())
    hf = LlamaRMSNorm(24, eps=1e-5)
    hf.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x), ref(x), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours(x), hf(x), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.bfloat16()(x.bfloat16()), hf.bfloat16()(x.bfloat16()), atol=1e-2, rtol=0)
    mlp = SwiGLUFeedForward(24, 40)
    cfg = LlamaConfig(hidden_size=24, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2)
    hf_mlp = LlamaMLP(cfg)
    hf_mlp.load_state_dict(mlp.state_dict())
    torch.testing.assert_close(mlp(x), hf_mlp(x), atol=1e-6, rtol=1e-5)


def test_repeat_kv_and_gqa_against_explicit_attention():
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(2, 2, 5, 4, generator=g)
    assert torch.equal(repeat_kv(kv, 4), torch.repeat_interleave(kv, 4, dim=1))
    assert torch.equal(repeat_kv(kv, 4)[:, 3], kv[:, 0]) and torch.equal(repeat_kv(kv, 4)[:, 4], kv[:, 1])
    attn = GroupedQueryAttention(32, 8, 2)
    x = torch.randn(2, 7, 32, generator=g)
    cos, sin = rope_cos_sin(rope_inv_freq(4, 10000.0), torch.arange(7))
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    out = attn(x, cos, sin, mask)
    # explicit route
    q = attn.q_proj(x).view(2, 7, 8, 4).transpose(1, 2)
    k = attn.k_proj(x).view(2, 7, 2, 4).transpose(1, 2)
    v = attn.v_proj(x).view(2, 7, 2, 4).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = torch.repeat_interleave(k, 4, 1), torch.repeat_interleave(v, 4, 1)
    w = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~mask, float("-inf")).softmax(-1)
    ref = attn.o_proj((w @ v).transpose(1, 2).reshape(2, 7, 32))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_presets_counts_and_structure():
    for name, want in [("llama3.2-1b", 1_235_814_400), ("llama3.2-3b", 3_212_749_824), ("llama3-tiny", 795_904)]:
        cfg = Llama3Config.preset(name)
        with torch.device("meta"):
            m = Llama3Model(cfg)
        assert count_parameters(m) == want == llama3_param_count(cfg)
    with pytest.raises(KeyError):
        Llama3Config.preset("llama4")
    tiny = Llama3Config.preset("llama3-tiny")
    assert Llama3Config(**tiny.to_dict()) == tiny
    m = Llama3Model(tiny)
    assert m.lm_head.weight is m.embed_tokens.weight
    assert sorted(n for n, _ in m.named_buffers()) == ["causal", "rope_cos", "rope_sin"]
    assert "rope_cos" not in m.state_dict() and "causal" not in m.state_dict()
    keys = set(m.state_dict())
    for i in range(4):
        for part in ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                     "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                     "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]:
            assert f"layers.{i}.{part}" in keys
    assert {"embed_tokens.weight", "norm.weight", "lm_head.weight"} <= keys
    assert m.state_dict()["layers.0.self_attn.k_proj.weight"].shape == (64, 128)
    with pytest.raises(ValueError):
        m(torch.zeros(1, 257, dtype=torch.long))


def test_causality():
    m = Llama3Model(Llama3Config.preset("llama3-tiny")).eval()
    idx = torch.randint(0, 65, (1, 20), generator=torch.Generator().manual_seed(4))
    idx2 = idx.clone()
    idx2[0, 12:] = (idx2[0, 12:] + 7) % 65
    with torch.no_grad():
        a, b = m(idx), m(idx2)
    torch.testing.assert_close(a[:, :12], b[:, :12])
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-4


@pytest.mark.parametrize("which", [0, 1])
def test_logits_parity_with_transformers(which):
    cfg, overrides = llama_parity_configs()[which]
    hf = random_hf_llama(cfg, seed=which, **overrides)
    assert torch.equal(hf.model.rotary_emb.inv_freq, rope_inv_freq(cfg.hd, cfg.rope_theta, cfg.rope_scaling))
    m = load_hf_llama(Llama3Model(cfg), hf.state_dict()).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 50), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(m(idx), hf(idx).logits, atol=1e-5, rtol=1e-5)


def test_tied_loading_and_errors():
    cfg = Llama3Config(vocab_size=50, d_model=32, n_layers=1, n_heads=4, n_kv_heads=1, intermediate_size=48,
                       context_length=32, rope_theta=10000.0)
    hf = random_hf_llama(cfg, seed=3)
    m = load_hf_llama(Llama3Model(cfg), hf.state_dict()).eval()
    assert m.lm_head.weight is m.embed_tokens.weight
    idx = torch.randint(0, 50, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(m(idx), hf(idx).logits, atol=1e-5, rtol=1e-5)
    bare = {k[len("model."):]: v for k, v in hf.state_dict().items() if k.startswith("model.")}
    load_hf_llama(Llama3Model(cfg), bare)
    other = Llama3Config(**{**cfg.to_dict(), "d_model": 64})
    with pytest.raises(ValueError):
        load_hf_llama(Llama3Model(other), hf.state_dict())
    with pytest.raises(KeyError):
        load_hf_llama(Llama3Model(cfg), {"model.norm.weight": torch.ones(32)})


def test_sdpa_gqa_is_used_without_copies():
    # the fast path equals an expanded-KV SDPA call
    attn = GroupedQueryAttention(48, 6, 3)
    x = torch.randn(3, 11, 48)
    cos, sin = rope_cos_sin(rope_inv_freq(8, 10000.0), torch.arange(11))
    mask = torch.ones(11, 11, dtype=torch.bool).tril()
    q, k, v = attn.project(x, cos, sin)
    ref = F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask)
    ref = attn.o_proj(ref.transpose(1, 2).reshape(3, 11, 48))
    torch.testing.assert_close(attn(x, cos, sin, mask), ref, atol=1e-6, rtol=1e-5)


def test_swiglu_width_rule_reproduces_the_released_widths():
    """Meta's rule (int(8D/3), times ffn_dim_multiplier, up to multiple_of) gives each released config's width."""
    from llmcourse.models.llama3 import Llama3Config, llama_ffn_hidden_dim

    assert llama_ffn_hidden_dim(2048, 256, 1.5) == Llama3Config.preset("llama3.2-1b").intermediate_size == 8192
    assert llama_ffn_hidden_dim(3072, 256, 1.0) == Llama3Config.preset("llama3.2-3b").intermediate_size == 8192
    assert llama_ffn_hidden_dim(4096, 1024, 1.3) == 14336            # Llama 3 8B
    assert llama_ffn_hidden_dim(128, 128) == Llama3Config.preset("llama3-tiny").intermediate_size
    assert llama_ffn_hidden_dim(4096, 256) == 11008                   # Llama 2 7B: no multiplier


def test_smoothing_divides_slow_frequencies_and_multiplies_their_wavelengths():
    from llmcourse.models.llama3 import (
        LLAMA3_ROPE_SCALING,
        LLAMA31_ROPE_SCALING,
        LLAMA32_ROPE_SCALING,
        rope_inv_freq,
    )

    assert LLAMA3_ROPE_SCALING is LLAMA32_ROPE_SCALING and LLAMA32_ROPE_SCALING["factor"] == 32.0
    assert LLAMA31_ROPE_SCALING["factor"] == 8.0
    for sc in (LLAMA31_ROPE_SCALING, LLAMA32_ROPE_SCALING):
        plain, smooth = rope_inv_freq(128, 500000.0), rope_inv_freq(128, 500000.0, sc)
        wl, wl_new = 2 * math.pi / plain, 2 * math.pi / smooth
        slow = wl > sc["original_max_position_embeddings"] / sc["low_freq_factor"]
        fast = wl < sc["original_max_position_embeddings"] / sc["high_freq_factor"]
        assert slow.any() and fast.any()
        torch.testing.assert_close(smooth[slow], plain[slow] / sc["factor"])
        torch.testing.assert_close(wl_new[slow], wl[slow] * sc["factor"], rtol=1e-5, atol=0)
        assert torch.equal(smooth[fast], plain[fast])


def test_the_bands_swapped_hint_says_frequency_divided_wavelength_multiplied():
    from grader.core import BUGS
    from grader.runner import load_unit

    load_unit("11")
    hint = next(b.hint for b in BUGS["11.rope"] if b.id == "B11.rope_bands_swapped")
    assert "frequency divided by `factor`" in hint and "wavelength multiplied" in hint
