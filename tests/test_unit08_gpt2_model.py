"""Unit 08: GPT-2 config, model, parameter counts and the Hugging Face loader.

Oracles: ``transformers.GPT2LMHeadModel`` with every tensor re-drawn (logits and per-layer hidden
states), the syllabus's literal parameter counts (independent of the formula code), torch's
``F.scaled_dot_product_attention`` / ``F.layer_norm`` / ``F.gelu`` vs the explicit unit-03/05 formulas.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from llmcourse.models import (
    GPT2Config,
    GPT2Model,
    count_parameters,
    gpt2_param_breakdown,
    gpt2_param_count,
    load_hf_gpt2,
    random_hf_gpt2,
)

PARITY_CONFIGS = [
    GPT2Config(vocab_size=1000, context_length=128, d_model=64, n_heads=4, n_layers=2, dropout=0.0),
    GPT2Config(vocab_size=1000, context_length=128, d_model=48, n_heads=3, n_layers=3, dropout=0.0),
]


def _idx():
    return torch.randint(0, 1000, (2, 17), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- config and structure


def test_presets():
    small = GPT2Config.preset("gpt2-small")
    assert (small.vocab_size, small.context_length, small.d_model, small.n_heads, small.n_layers) == \
        (50257, 1024, 768, 12, 12)
    assert small.qkv_bias and small.tie_weights and small.dropout == 0.1 and small.layer_norm_eps == 1e-5
    assert small == GPT2Config()
    for name, (n_layers, d_model, n_heads) in {"gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20),
                                               "gpt2-xl": (48, 1600, 25)}.items():
        c = GPT2Config.preset(name)
        assert (c.n_layers, c.d_model, c.n_heads, c.vocab_size, c.context_length) == (n_layers, d_model, n_heads,
                                                                                      50257, 1024)
    tiny = GPT2Config.preset("gpt2-char-tiny")
    assert (tiny.vocab_size, tiny.context_length, tiny.d_model, tiny.n_heads, tiny.n_layers, tiny.dropout) == \
        (65, 64, 128, 4, 4, 0.0)
    with pytest.raises(KeyError):
        GPT2Config.preset("gpt3")
    assert GPT2Config(**tiny.to_dict()) == tiny
    # presets are fresh objects
    tiny.n_layers = 1
    assert GPT2Config.preset("gpt2-char-tiny").n_layers == 4


def test_state_dict_keys_and_tying():
    cfg = GPT2Config(vocab_size=50, context_length=16, d_model=32, n_heads=4, n_layers=2, dropout=0.0)
    model = GPT2Model(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    d = 32
    expected = {"tok_emb.weight": (50, d), "pos_emb.weight": (16, d), "final_norm.weight": (d,),
                "final_norm.bias": (d,), "lm_head.weight": (50, d)}
    for i in range(2):
        p = f"blocks.{i}."
        for n in ("norm1", "norm2"):
            expected[p + n + ".weight"] = (d,)
            expected[p + n + ".bias"] = (d,)
        for n in ("W_query", "W_key", "W_value", "out_proj"):
            expected[p + f"attn.{n}.weight"] = (d, d)
            expected[p + f"attn.{n}.bias"] = (d,)
        expected.update({p + "ffn.fc1.weight": (4 * d, d), p + "ffn.fc1.bias": (4 * d,),
                         p + "ffn.fc2.weight": (d, 4 * d), p + "ffn.fc2.bias": (d,)})
    assert shapes == expected
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.lm_head.bias is None
    untied = GPT2Model(GPT2Config(**{**cfg.to_dict(), "tie_weights": False}))
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert count_parameters(untied) == count_parameters(model) + 50 * d
    no_bias = GPT2Model(GPT2Config(**{**cfg.to_dict(), "qkv_bias": False}))
    assert "blocks.0.attn.W_query.bias" not in no_bias.state_dict()
    assert "blocks.0.attn.out_proj.bias" in no_bias.state_dict()


# ---------------------------------------------------------------- parameter counts (F08.1, F08.2)


@pytest.mark.parametrize("name,tied,bias,expected", [
    ("gpt2-small", True, True, 124_439_808), ("gpt2-small", False, True, 163_037_184),
    ("gpt2-small", True, False, 124_412_160), ("gpt2-small", False, False, 163_009_536),
    ("gpt2-medium", True, True, 354_823_168), ("gpt2-large", True, True, 774_030_080),
    ("gpt2-xl", True, True, 1_557_611_200),
    ("gpt2-char-tiny", True, True, 809_856), ("gpt2-char-tiny", False, True, 818_176),
])
def test_param_counts_on_meta(name, tied, bias, expected):
    cfg = GPT2Config.preset(name)
    cfg.tie_weights, cfg.qkv_bias = tied, bias
    assert gpt2_param_count(cfg) == expected
    assert gpt2_param_breakdown(cfg)["total"] == expected
    with torch.device("meta"):
        model = GPT2Model(cfg)
    assert model.tok_emb.weight.is_meta
    assert count_parameters(model) == expected


def test_breakdown_small():
    parts = gpt2_param_breakdown(GPT2Config.preset("gpt2-small"))
    assert parts["token_embedding"] == 38_597_376
    assert parts["position_embedding"] == 786_432
    per_block = (parts["attention"] + parts["ffn"] + parts["block_norms"]) // 12
    assert per_block == 7_087_872
    assert parts["attention"] // 12 == 2_362_368 and parts["ffn"] // 12 == 4_722_432
    assert parts["block_norms"] // 12 == 3_072 and parts["final_norm"] == 1_536
    assert round(100 * parts["token_embedding"] / parts["total"], 1) == 31.0
    assert round(parts["total"] * 4 / 1e6, 1) == 497.8 and round(parts["total"] * 4 / 2**20, 1) == 474.7


# ---------------------------------------------------------------- forward, causality, init


def test_forward_shapes_and_errors():
    model = GPT2Model(GPT2Config.preset("gpt2-char-tiny")).eval()
    idx = torch.randint(0, 65, (3, 64))
    logits = model(idx)
    assert logits.shape == (3, 64, 65) and logits.dtype == torch.float32
    with pytest.raises(ValueError, match="context_length"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError):
        model(torch.zeros(5, dtype=torch.long))


def test_causality():
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config.preset("gpt2-char-tiny")).eval()
    idx = torch.randint(0, 65, (2, 20))
    changed = idx.clone()
    changed[:, 12:] = (changed[:, 12:] + 7) % 65
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], atol=1e-6, rtol=0)
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3


def test_init_statistics_and_initial_loss():
    torch.manual_seed(0)
    cfg = GPT2Config.preset("gpt2-char-tiny")
    model = GPT2Model(cfg)
    resid = 0.02 / math.sqrt(2 * cfg.n_layers)
    for i, block in enumerate(model.blocks):
        assert abs(block.attn.out_proj.weight.std().item() - resid) < 0.1 * resid
        assert abs(block.ffn.fc2.weight.std().item() - resid) < 0.1 * resid
        assert abs(block.attn.W_query.weight.std().item() - 0.02) < 0.002
        assert block.attn.W_query.bias.abs().max() == 0 and block.ffn.fc1.bias.abs().max() == 0
        assert torch.equal(block.norm1.weight, torch.ones(cfg.d_model))
    assert abs(model.tok_emb.weight.std().item() - 0.02) < 0.002
    assert abs(model.pos_emb.weight.std().item() - 0.02) < 0.002
    idx = torch.randint(0, 65, (16, 65), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    assert abs(loss.item() - math.log(65)) < 0.1


# ---------------------------------------------------------------- Hugging Face parity (F08.4)


@pytest.mark.parametrize("cfg", PARITY_CONFIGS, ids=["d64-L2", "d48-L3"])
def test_load_hf_parity(cfg):
    hf = random_hf_gpt2(cfg, seed=3)
    model = load_hf_gpt2(GPT2Model(cfg).eval(), hf.state_dict())
    assert model.lm_head.weight is model.tok_emb.weight
    idx = _idx()
    with torch.no_grad():
        out = hf(idx, output_hidden_states=True)
        logits = model(idx)
        ours = model.hidden_states(idx)
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)
    for a, b in zip(ours[:-1], out.hidden_states[:-1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.final_norm(ours[-1]), out.hidden_states[-1], atol=1e-5, rtol=1e-5)


def test_load_hf_accepts_bare_keys_and_old_buffers():
    cfg = PARITY_CONFIGS[0]
    hf = random_hf_gpt2(cfg, seed=4)
    sd = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    sd["h.0.attn.bias"] = torch.ones(1, 1, 128, 128, dtype=torch.bool)
    sd["h.0.attn.masked_bias"] = torch.tensor(-1e4)
    model = load_hf_gpt2(GPT2Model(cfg).eval(), sd)
    with torch.no_grad():
        torch.testing.assert_close(model(_idx()), hf(_idx()).logits, atol=1e-5, rtol=1e-5)


def test_load_hf_errors():
    cfg = PARITY_CONFIGS[0]
    sd = dict(random_hf_gpt2(cfg, seed=5).state_dict())
    bad = dict(sd)
    bad["transformer.h.1.mlp.c_fc.weight"] = bad["transformer.h.1.mlp.c_fc.weight"].T.contiguous()
    with pytest.raises(ValueError):
        load_hf_gpt2(GPT2Model(cfg), bad)
    with pytest.raises(ValueError):
        load_hf_gpt2(GPT2Model(PARITY_CONFIGS[1]), sd)
    del sd["transformer.ln_f.bias"]
    with pytest.raises(KeyError):
        load_hf_gpt2(GPT2Model(cfg), sd)


def test_untied_loading_uses_lm_head():
    cfg = GPT2Config(**{**PARITY_CONFIGS[0].to_dict(), "tie_weights": False})
    hf = random_hf_gpt2(cfg, seed=6)
    assert hf.lm_head.weight is not hf.transformer.wte.weight
    model = load_hf_gpt2(GPT2Model(cfg).eval(), hf.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(_idx()), hf(_idx()).logits, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the fast library path


def test_fast_path_equals_explicit_path():
    """store_weights switches MultiHeadAttention to the explicit formula; both give the same function."""
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config.preset("gpt2-char-tiny")).eval()
    idx = torch.randint(0, 65, (2, 40))
    with torch.no_grad():
        fast = model(idx)
        for block in model.blocks:
            block.attn.store_weights = True
        slow = model(idx)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    w = model.blocks[0].attn.last_weights
    assert w.shape == (2, 4, 40, 40)
    assert torch.all(w.triu(1) == 0)


# ---------------------------------------------------------------- widgets (compute functions + static fallbacks)


def test_param_groups_sum_to_the_formula():
    from llmcourse.viz.gpt2 import param_groups

    for tied in (True, False):
        cfg = GPT2Config.preset("gpt2-small")
        cfg.tie_weights = tied
        rows = param_groups(cfg)
        assert sum(n for _, _, n in rows) == (124_439_808 if tied else 163_037_184)
        assert ("untied head" in {g for g, _, _ in rows}) == (not tied)
    rows = param_groups(GPT2Config.preset("gpt2-small"))
    assert dict((c, n) for _, c, n in rows)["token embedding"] == 38_597_376


def test_layer_divergence_locates_each_injected_bug():
    from llmcourse.viz.gpt2 import BUGS_TO_INJECT, layer_divergence

    expected_first = {"none": None, "no transpose": 1, "exact GELU": 1, "untied": 5, "post-LN": 1}
    assert set(expected_first) == set(BUGS_TO_INJECT)
    for bug, first in expected_first.items():
        r = layer_divergence(bug)
        assert len(r["diffs"]) == len(r["labels"]) == 6  # embeddings, 4 blocks, logits
        assert r["first"] == first, (bug, r["diffs"])
        assert r["diffs"][0] < 1e-6  # the embeddings never differ
    # the exact-GELU gap is small but far above float noise: the "≈1e-3 is rounding" claim is wrong
    gelu = layer_divergence("exact GELU")["diffs"]
    clean = layer_divergence("none")["diffs"]
    assert max(clean) < 3e-5 and 1e-4 < max(gelu) < 0.1
    with pytest.raises(ValueError):
        layer_divergence("typo")


def test_architecture_shapes_from_meta_run():
    from llmcourse.viz.gpt2 import architecture_shapes

    cfg = GPT2Config.preset("gpt2-char-tiny")
    rows = {r["name"]: r for r in architecture_shapes(cfg, batch=2, seq=10)}
    assert rows["tok_emb"]["shape"] == (2, 10, 128) and rows["pos_emb"]["shape"] == (10, 128)
    assert rows["blocks.0.ffn.fc1"]["shape"] == (2, 10, 512)
    assert rows["blocks.0.attn.weights"]["shape"] == (2, 4, 10, 10)
    assert rows["lm_head"]["shape"] == (2, 10, 65)
    assert rows["blocks.0"]["params"] == 12 * 128**2 + 13 * 128
    assert rows["blocks.1 … blocks.3"]["params"] == 3 * rows["blocks.0"]["params"]
    big = {r["name"]: r for r in architecture_shapes(GPT2Config.preset("gpt2-xl"), batch=1)}
    assert big["lm_head"]["shape"] == (1, 1024, 50257)
    with pytest.raises(ValueError):
        architecture_shapes(cfg, seq=65)


def test_widgets_static_fallbacks_render():
    from llmcourse.viz import gpt2 as V
    from llmcourse.viz.base import StaticFigure

    for show in (V.show_param_sunburst, V.show_architecture_map, V.show_divergence_finder):
        out = show(static=True)
        assert isinstance(out, StaticFigure)
        assert out._repr_png_()[:4] == b"\x89PNG"
        assert "llmcourse-static" in out._repr_html_()


def test_widgets_live_build():
    pytest.importorskip("ipywidgets")
    from llmcourse.viz import gpt2 as V

    for show, cls in ((V.show_param_sunburst, "llmcourse-w08-1"), (V.show_architecture_map, "llmcourse-w08-3")):
        w = show(static=False)
        assert cls in w._dom_classes


# ---------------------------------------------------------------- optional real weights: the loader on a saved checkpoint


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_load_pretrained_from_a_saved_hf_checkpoint(tmp_path, monkeypatch, safe):
    from llmcourse.models import find_pretrained_gpt2, load_pretrained_gpt2, pretrained_gpt2_dir

    monkeypatch.setenv("LLMCOURSE_CACHE", str(tmp_path / "cache"))
    assert find_pretrained_gpt2() is None
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pretrained_gpt2()
    cfg = PARITY_CONFIGS[1]
    hf = random_hf_gpt2(cfg, seed=9)
    hf.save_pretrained(pretrained_gpt2_dir(), safe_serialization=safe)
    assert find_pretrained_gpt2() is not None
    model = load_pretrained_gpt2()
    assert (model.cfg.d_model, model.cfg.n_layers, model.cfg.vocab_size) == (48, 3, 1000)
    assert not model.training and model.lm_head.weight is model.tok_emb.weight
    with torch.no_grad():
        torch.testing.assert_close(model(_idx()), hf(_idx()).logits, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the library's fused kernels vs the explicit formulas


def _explicit_mha(mha, x_q, x_kv=None, mask=None):
    """The unit-03/04 formula written out here: scores, scale, mask, softmax, @ V, merge, out_proj."""
    x_kv = x_q if x_kv is None else x_kv
    b, t_q, _ = x_q.shape
    t_k = x_kv.shape[1]
    h, hd = mha.num_heads, mha.head_dim
    q = mha.W_query(x_q).view(b, t_q, h, hd).transpose(1, 2)
    k = mha.W_key(x_kv).view(b, t_k, h, hd).transpose(1, 2)
    v = mha.W_value(x_kv).view(b, t_k, h, hd).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    allowed = torch.ones(t_q, t_k, dtype=torch.bool)
    if mha.causal:
        allowed = allowed.tril(diagonal=t_k - t_q)
    if mask is not None:
        allowed = allowed & mask
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return mha.out_proj((weights @ v).transpose(1, 2).reshape(b, t_q, h * hd))


def test_mha_fast_path_matches_the_formula():
    from llmcourse.nn import MultiHeadAttention

    torch.manual_seed(0)
    causal = MultiHeadAttention(16, 16, 4, qkv_bias=True, causal=True, context_length=12).eval()
    cross = MultiHeadAttention(16, 16, 2, d_kv=8).eval()
    x = torch.randn(2, 10, 16)
    keep = torch.tensor([[True] * 10, [True] * 7 + [False] * 3])[:, None, None, :]
    mem = torch.randn(2, 5, 8)
    rand = torch.rand(2, 2, 10, 5) > 0.4
    rand[..., 0] = True
    cases = [(causal, (x,), {}), (causal, (x,), {"mask": keep}), (causal, (x[:, 6:], x), {}),
             (causal, (x[:, 4:], x), {"mask": keep}), (cross, (x, mem), {}), (cross, (x, mem), {"mask": rand})]
    with torch.no_grad():
        for mha, args, kw in cases:
            fast = mha(*args, **kw)
            torch.testing.assert_close(fast, _explicit_mha(mha, *args, **kw), atol=1e-6, rtol=1e-5)
            mha.store_weights = True
            torch.testing.assert_close(mha(*args, **kw), fast, atol=1e-6, rtol=1e-5)
            assert mha.last_weights is not None
            mha.store_weights, mha.last_weights = False, None
            mha(*args, **kw)
            assert mha.last_weights is None  # the fast path materialises no weights


def test_mha_fast_path_dropout_in_train_mode_only():
    from llmcourse.nn import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 16, 4, dropout=0.5, causal=True, context_length=32)
    x = torch.randn(4, 32, 16)
    with torch.no_grad():
        a, b = mha.train()(x), mha(x)
        e1, e2 = mha.eval()(x), mha(x)
    assert not torch.allclose(a, b) and torch.equal(e1, e2)
    torch.testing.assert_close(e1, _explicit_mha(mha, x), atol=1e-6, rtol=1e-5)


def test_layernorm_and_gelu_kernels_match_the_formulas():
    from llmcourse.nn import LayerNorm, gelu

    torch.manual_seed(0)
    ln = LayerNorm(24, eps=1e-5)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = 3 * torch.randn(5, 7, 24) + 1
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    torch.testing.assert_close(ln(x), (x - mean) / torch.sqrt(var + 1e-5) * ln.weight + ln.bias, atol=1e-5, rtol=1e-5)
    z = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    exact = 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))
    tanh = 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    torch.testing.assert_close(gelu(z), exact, atol=1e-12, rtol=0)
    torch.testing.assert_close(gelu(z, "tanh"), tanh, atol=1e-12, rtol=0)
    with pytest.raises(ValueError):
        gelu(z, "fast")


def test_the_stored_transformers_oracle_of_the_checks_is_current():
    """assets/oracles/u08_hf_gpt2.pt (read by the unit-08 checks instead of importing transformers)
    equals what transformers' GPT2LMHeadModel gives now."""
    from grader.checks.u08_gpt2_model import ORACLE_ASSET, _parity_cfg, build_hf_oracle, logits_atol
    from grader.oracles import assert_same, float32_atol, oracle_path

    # currency is asserted at the checks' own tolerance: logits at logits_atol (float32 rounding at their scale
    # through the forward's reductions), the stored weights (drawn with torch.randn, whose kernels differ by CPU)
    # at float32 rounding of their own scale
    stored = torch.load(oracle_path(ORACLE_ASSET), weights_only=True)
    rebuilt = build_hf_oracle()
    assert len(stored["cases"]) == 2
    for i, (a, b) in enumerate(zip(stored["cases"], rebuilt["cases"])):
        assert_same({k: v for k, v in a.items() if k not in ("logits", "hf_state_dict")},
                    {k: v for k, v in b.items() if k not in ("logits", "hf_state_dict")}, f"oracle.cases[{i}]")
        cfg = _parity_cfg(a["d_model"], a["n_heads"], a["n_layers"])
        torch.testing.assert_close(b["logits"], a["logits"], atol=logits_atol(cfg, a["logits"]), rtol=1e-5)
        assert a["hf_state_dict"].keys() == b["hf_state_dict"].keys()
        for k, w in a["hf_state_dict"].items():
            if not w.is_floating_point():
                assert torch.equal(b["hf_state_dict"][k], w), k
                continue
            torch.testing.assert_close(b["hf_state_dict"][k], w, atol=float32_atol(w, 1, floor=1e-6), rtol=1e-5,
                                       msg=lambda m, k=k: f"oracle.cases[{i}].hf_state_dict.{k}: {m}")
