"""Unit 05 (transformer blocks): library pieces against torch's built-ins and the syllabus numbers.

Oracles are independent of the code under test: ``nn.LayerNorm``, ``F.gelu``, ``F.linear``,
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` (with a hand-written weight copy
here, not the library's converter), and the syllabus's fixtures F05.1–F05.4.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from llmcourse.nn import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    LayerNorm,
    ProjectionLayer,
    causal_mask,
    gelu,
)
from llmcourse.nn.blocks import to_torch_decoder_layer, to_torch_encoder_layer


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _n_params(m):
    return sum(p.numel() for p in m.parameters())


def _randomise(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            base = 1.0 if ("norm" in name and name.endswith("weight")) else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
    return module.eval()


# ---------------------------------------------------------------- LayerNorm


def test_layernorm_matches_nn_layernorm_with_same_state_dict():
    ln = LayerNorm(16)
    with torch.no_grad():
        ln.weight.copy_(_randn(16, seed=1))
        ln.bias.copy_(_randn(16, seed=2))
    ref = nn.LayerNorm(16)
    ref.load_state_dict(ln.state_dict())  # interchangeable keys
    for x in (_randn(3, 5, 16, seed=3), _randn(7, 16, seed=4) * 0.003, _randn(2, 2, 3, 16, seed=5) * 4 + 2):
        torch.testing.assert_close(ln(x), ref(x), atol=1e-6, rtol=1e-5)


def test_layernorm_structure_and_modes():
    ln = LayerNorm(8)
    assert {k: tuple(v.shape) for k, v in ln.state_dict().items()} == {"weight": (8,), "bias": (8,)}
    assert _n_params(ln) == 2 * 8 and list(ln.buffers()) == []
    assert _n_params(nn.LayerNorm(8)) == _n_params(ln) and list(nn.LayerNorm(8).buffers()) == []
    x = _randn(4, 6, 8, seed=6)
    assert torch.equal(ln.train()(x), ln.eval()(x))


def test_layernorm_fixture_f05_1_std_is_sqrt_128_over_127():
    for seed in range(3):
        x = _randn(2, 4, 16, seed=seed) * (seed + 1) + seed
        assert LayerNorm(16)(x).std().item() == pytest.approx(1.00393, abs=1e-4)
        assert LayerNorm(16)(x).std().item() == pytest.approx(math.sqrt(128 / 127), abs=1e-4)


def test_example_vector_biased_std():
    v = torch.tensor([-1.5, -0.5, 0.5, 1.5])
    assert v.std(unbiased=False).item() == pytest.approx(1.118, abs=1e-3)
    # LayerNorm makes its biased std 1 (up to eps)
    assert LayerNorm(4)(v).std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)


def test_layernorm_errors():
    with pytest.raises(ValueError, match="last dimension"):
        LayerNorm(8)(torch.randn(2, 7))
    with pytest.raises(ValueError):
        LayerNorm(0)
    with pytest.raises(ValueError):
        LayerNorm(4, eps=0.0)


# ---------------------------------------------------------------- gelu


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch(approximate):
    x = torch.linspace(-8, 8, 1601)
    torch.testing.assert_close(gelu(x, approximate), F.gelu(x, approximate=approximate), atol=1e-6, rtol=1e-5)


def test_gelu_fixture_f05_2():
    x = torch.linspace(-8, 8, 160_001, dtype=torch.float64)
    diff = (gelu(x, "none") - gelu(x, "tanh")).abs()
    assert diff.max().item() == pytest.approx(4.74e-4, abs=5e-6)
    assert x[diff.argmax()].item() == pytest.approx(-2.70, abs=0.02)
    m3 = torch.tensor([-3.0])
    assert gelu(m3).item() == pytest.approx(-0.00405, abs=1e-5)
    assert gelu(m3, "tanh").item() == pytest.approx(-0.00364, abs=1e-5)


def test_gelu_rejects_unknown_mode():
    with pytest.raises(ValueError, match="approximate"):
        gelu(torch.zeros(2), "sigmoid")


# ---------------------------------------------------------------- FeedForward


def test_feedforward_structure_and_counts():
    ffn = FeedForward(8, 32)
    assert {k: tuple(v.shape) for k, v in ffn.state_dict().items()} == {
        "fc1.weight": (32, 8), "fc1.bias": (32,), "fc2.weight": (8, 32), "fc2.bias": (8,)}
    assert _n_params(FeedForward(512, 2048)) == 2 * 512 * 2048 + 2048 + 512 == 2_099_712


@pytest.mark.parametrize("activation,fn", [("relu", F.relu), ("gelu", F.gelu),
                                           ("gelu_tanh", lambda z: F.gelu(z, approximate="tanh"))])
def test_feedforward_matches_linear_act_linear(activation, fn):
    torch.manual_seed(0)
    ffn = FeedForward(8, 32, activation).train()  # no dropout inside: train mode is deterministic
    x = _randn(2, 5, 8, seed=1)
    expected = F.linear(fn(F.linear(x, ffn.fc1.weight, ffn.fc1.bias)), ffn.fc2.weight, ffn.fc2.bias)
    torch.testing.assert_close(ffn(x), expected, atol=1e-6, rtol=1e-5)
    perm = torch.randperm(5)
    torch.testing.assert_close(ffn(x)[:, perm], ffn(x[:, perm]), atol=1e-6, rtol=1e-5)


def test_feedforward_errors():
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 32, "swish")
    with pytest.raises(ValueError, match="last dimension"):
        FeedForward(8, 32)(torch.randn(2, 3, 9))


# ---------------------------------------------------------------- blocks vs torch's layers


def _copy_into_torch_mha(dst, src):
    with torch.no_grad():
        dst.in_proj_weight.copy_(torch.cat([src.W_query.weight, src.W_key.weight, src.W_value.weight]))
        dst.in_proj_bias.copy_(torch.cat([src.W_query.bias, src.W_key.bias, src.W_value.bias]))
        dst.out_proj.weight.copy_(src.out_proj.weight)
        dst.out_proj.bias.copy_(src.out_proj.bias)


def _copy_common(layer, block, norms):
    with torch.no_grad():
        layer.linear1.weight.copy_(block.ffn.fc1.weight)
        layer.linear1.bias.copy_(block.ffn.fc1.bias)
        layer.linear2.weight.copy_(block.ffn.fc2.weight)
        layer.linear2.bias.copy_(block.ffn.fc2.bias)
        for n in norms:
            getattr(layer, n).weight.copy_(getattr(block, n).weight)
            getattr(layer, n).bias.copy_(getattr(block, n).bias)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_matches_torch_encoder_layer(norm_first, activation):
    torch.manual_seed(0)
    blk = _randomise(EncoderBlock(16, 4, 32, dropout=0.0, norm_first=norm_first, activation=activation), 1)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first)
    _copy_into_torch_mha(layer.self_attn, blk.self_attn)
    _copy_common(layer, blk, ("norm1", "norm2"))
    layer.eval()
    x = _randn(3, 7, 16, seed=2)
    keep = torch.arange(7)[None] < torch.tensor([7, 5, 2])[:, None]
    expected = layer(x, src_key_padding_mask=~keep)
    torch.testing.assert_close(blk(x, mask=keep[:, None, None, :]), expected, atol=1e-5, rtol=1e-5)
    # the other ordering gives a different result with the same weights
    blk.norm_first = not norm_first
    assert not torch.allclose(blk(x, mask=keep[:, None, None, :]), expected, atol=1e-3)
    # the library's converter builds the same oracle
    blk.norm_first = norm_first
    torch.testing.assert_close(to_torch_encoder_layer(blk)(x, src_key_padding_mask=~keep), expected,
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_matches_torch_decoder_layer(norm_first):
    torch.manual_seed(0)
    blk = _randomise(DecoderBlock(16, 4, 32, dropout=0.0, norm_first=norm_first), 3)
    layer = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    _copy_into_torch_mha(layer.self_attn, blk.self_attn)
    _copy_into_torch_mha(layer.multihead_attn, blk.cross_attn)
    _copy_common(layer, blk, ("norm1", "norm2", "norm3"))
    layer.eval()
    tgt, mem = _randn(2, 5, 16, seed=4), _randn(2, 7, 16, seed=5)
    keep = torch.arange(7)[None] < torch.tensor([7, 3])[:, None]
    cm = causal_mask(5)
    expected = layer(tgt, mem, tgt_mask=~cm, memory_key_padding_mask=~keep)
    got = blk(tgt, mem, tgt_mask=cm, memory_mask=keep[:, None, None, :])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(to_torch_decoder_layer(blk)(tgt, mem, tgt_mask=~cm, memory_key_padding_mask=~keep),
                               expected, atol=1e-6, rtol=1e-6)


def test_decoder_block_properties():
    torch.manual_seed(1)
    blk = _randomise(DecoderBlock(16, 4, 32, dropout=0.0), 6)
    tgt, mem = _randn(2, 6, 16, seed=7), _randn(2, 4, 16, seed=8)
    cm = causal_mask(6)
    keep = torch.tensor([[True, True, True, True], [True, True, False, False]])
    base = blk(tgt, mem, tgt_mask=cm, memory_mask=keep[:, None, None, :])
    tgt2 = tgt.clone()
    tgt2[:, 3:] += 2.0
    out = blk(tgt2, mem, tgt_mask=cm, memory_mask=keep[:, None, None, :])
    torch.testing.assert_close(out[:, :3], base[:, :3], atol=1e-5, rtol=1e-5)
    mem2 = mem.clone()
    mem2[1, 2:] = 77.0  # masked-out memory
    torch.testing.assert_close(blk(tgt, mem2, tgt_mask=cm, memory_mask=keep[:, None, None, :]), base)
    assert not torch.allclose(blk(tgt, mem + 1.0, tgt_mask=cm, memory_mask=keep[:, None, None, :]), base)


def test_parameter_counts_f05_3_equal_torch_layers():
    enc, dec = EncoderBlock(512, 8, 2048), DecoderBlock(512, 8, 2048)
    assert _n_params(enc) == 3_152_384 == _n_params(nn.TransformerEncoderLayer(512, 8, 2048))
    assert _n_params(dec) == 4_204_032 == _n_params(nn.TransformerDecoderLayer(512, 8, 2048))
    assert _n_params(enc.ffn) / _n_params(enc) == pytest.approx(0.666, abs=1e-3)
    keys = set(enc.state_dict())
    assert {"self_attn.W_query.weight", "self_attn.out_proj.bias", "norm1.weight", "norm2.bias",
            "ffn.fc1.weight", "ffn.fc2.bias"} <= keys
    assert {"cross_attn.W_key.bias", "norm3.weight"} <= set(dec.state_dict())


def test_blocks_eval_ignores_dropout_and_validate_inputs():
    torch.manual_seed(2)
    blk = EncoderBlock(16, 4, 32, dropout=0.5).eval()
    x = _randn(2, 5, 16, seed=9)
    assert torch.equal(blk(x), blk(x))
    with pytest.raises(ValueError, match="divisible"):
        EncoderBlock(256, 6, 512)
    with pytest.raises(ValueError, match=r"\(B, T, 16\)"):
        blk(torch.randn(2, 5, 8))
    dec = DecoderBlock(16, 4, 32)
    with pytest.raises(ValueError, match="memory"):
        dec(torch.randn(2, 5, 16), torch.randn(2, 3, 8))


def test_projection_layer_returns_logits():
    proj = ProjectionLayer(16, 50)
    assert {k: tuple(v.shape) for k, v in proj.state_dict().items()} == {"proj.weight": (50, 16), "proj.bias": (50,)}
    x = _randn(2, 3, 16, seed=10)
    out = proj(x)
    torch.testing.assert_close(out, F.linear(x, proj.proj.weight, proj.proj.bias))
    assert not torch.allclose(out.exp().sum(-1), torch.ones(2, 3), atol=1e-3)
    with pytest.raises(ValueError):
        proj(torch.randn(2, 3, 8))


# ---------------------------------------------------------------- widget compute functions


def test_residual_gradient_profile_f05_4():
    torch.manual_seed(999)
    before = torch.rand(1)
    from llmcourse.viz.blocks import residual_gradient_profile

    torch.manual_seed(999)
    plain = residual_gradient_profile(8, shortcut=False)
    short = residual_gradient_profile(8, shortcut=True)
    assert torch.equal(torch.rand(1), before)  # the global generator is left alone
    assert len(plain) == len(short) == 8
    assert 1e-8 < plain[0] < 1e-7 and 1e-1 < short[0] < 1  # ≈ 2.7e-08 and ≈ 1.5e-01
    assert 1e-3 < plain[-1] < 1e-2 and 1e-1 < short[-1] < 1  # ≈ 7.6e-03 and ≈ 4.5e-01
    assert short[0] / plain[0] > 1e4
    with pytest.raises(ValueError):
        residual_gradient_profile(0)
    with pytest.raises(ValueError):
        residual_gradient_profile(4, activation="softplus")


def test_activation_curves_and_layernorm_demo():
    from llmcourse.viz.blocks import activation_curves, layernorm_demo

    c = activation_curves()
    assert abs(c["diff"]).max() < 4.75e-4 and c["x"][0] == -4 and c["x"][-1] == 4
    torch.testing.assert_close(torch.from_numpy(c["gelu"]), F.gelu(torch.from_numpy(c["x"])))
    d = layernorm_demo(gamma=2.0, beta=1.0, token=3)
    assert d["mean_out"] == pytest.approx(1.0, abs=1e-5) and d["std_out"] == pytest.approx(2.0, abs=1e-4)
    torch.testing.assert_close(d["y"], 2.0 * F.layer_norm(d["x"], (16,)) + 1.0, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        layernorm_demo(token=8)


def test_pre_post_ln_profile_shapes_and_trends():
    from llmcourse.viz.blocks import pre_post_ln_profile

    p = pre_post_ln_profile(depth=6)
    assert len(p["pre"]["rms"]) == len(p["post"]["rms"]) == 7 and len(p["pre"]["grad"]) == 6
    # post-LN ends every block with a LayerNorm (weight 1, bias 0): RMS of each token = 1 (up to eps)
    for r in p["post"]["rms"][1:]:
        assert r == pytest.approx(1.0, abs=1e-3)
    # pre-LN adds every block's output to the stream: it grows
    assert p["pre"]["rms"][-1] > p["pre"]["rms"][0]
    assert all(g > 0 for g in p["pre"]["grad"] + p["post"]["grad"])


def test_block_shapes_and_cost():
    from llmcourse.viz.blocks import block_cost, block_shapes

    rows = dict(block_shapes("decoder", B=2, T=5, D=16, H=4, d_ff=32, S=7))
    assert rows["  cross weights"] == (2, 4, 5, 7) and rows["  fc1 → activation"] == (2, 5, 32)
    c = block_cost(100, 512, 2048)
    assert c["projections"] == 4 * 100 * 512**2 and c["attention"] == 2 * 100**2 * 512 and c["ffn"] == 2 * 100 * 512 * 2048
    # the quadratic term overtakes the FFN exactly when L > d_ff
    assert block_cost(2048, 512, 2048)["attention"] == block_cost(2048, 512, 2048)["ffn"]
    assert block_cost(2049, 512, 2048)["attention"] > block_cost(2049, 512, 2048)["ffn"]
    with pytest.raises(ValueError):
        block_shapes("middle")


def test_static_widgets_render_png():
    from llmcourse.viz import blocks as vb

    for show in (vb.show_layernorm, vb.show_activations, vb.show_residual_gradients, vb.show_block_diagram):
        fig = show(static=True)
        assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
        assert 'data-widget="W05.' in fig._repr_html_()


def test_live_widgets_build():
    pytest.importorskip("ipywidgets")
    from llmcourse.viz import blocks as vb

    for show in (vb.show_layernorm, vb.show_activations, vb.show_residual_gradients, vb.show_block_diagram):
        w = show(static=False)
        assert "llmcourse-widget" in w._dom_classes


def test_torch_converters_refuse_tanh_gelu():
    # nn.TransformerEncoderLayer has no tanh-GELU option: the converter says so instead of silently differing
    with pytest.raises(ValueError, match="gelu_tanh"):
        to_torch_encoder_layer(EncoderBlock(16, 4, 32, activation="gelu_tanh"))
