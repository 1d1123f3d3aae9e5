"""Unit 04: llmcourse.nn.multihead and llmcourse.viz.multihead.

Expected values come from the syllabus (F04.1, F04.4, F04.5, parameter counts), from torch's own
``nn.MultiheadAttention`` and ``F.scaled_dot_product_attention`` loaded with the same weights, or from
a per-head loop written here; never from the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import nn

from llmcourse.nn import (
    CausalSelfAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    mha_forward_sdpa,
    mha_from_wrapper,
    mha_param_count,
    to_torch_attn_mask,
    to_torch_mha,
)
from llmcourse.viz import multihead as V
from llmcourse.viz.base import StaticFigure

X6 = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                   [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
F045 = torch.tensor([[-0.4519, 0.2216, 0.4772, 0.1063], [-0.5874, 0.0058, 0.5891, 0.3257],
                     [-0.6300, -0.0632, 0.6202, 0.3860], [-0.5675, -0.0843, 0.5478, 0.3589],
                     [-0.5526, -0.0981, 0.5321, 0.3428], [-0.5299, -0.1081, 0.5077, 0.3493]])
F044_CORRECT = [[0, 1, 2, 100, 101, 102], [10, 11, 12, 110, 111, 112], [20, 21, 22, 120, 121, 122]]
F044_BUG = [[0, 1, 2, 10, 11, 12], [20, 21, 22, 100, 101, 102], [110, 111, 112, 120, 121, 122]]


def _mha(*args, seed=0, **kwargs):
    torch.manual_seed(seed)
    m = MultiHeadAttention(*args, **kwargs).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.3)
    return m


def _torch_oracle(m):
    tm = nn.MultiheadAttention(m.d_out, m.num_heads, batch_first=True).eval()
    with torch.no_grad():
        tm.in_proj_weight.copy_(torch.cat([m.W_query.weight, m.W_key.weight, m.W_value.weight]))
        if m.W_query.bias is not None:
            tm.in_proj_bias.copy_(torch.cat([m.W_query.bias, m.W_key.bias, m.W_value.bias]))
        else:
            tm.in_proj_bias.zero_()
        tm.out_proj.load_state_dict(m.out_proj.state_dict())
    return tm


def _per_head(m, x_q, x_kv, mask):
    outs = []
    hd = m.head_dim
    for h in range(m.num_heads):
        r = slice(h * hd, (h + 1) * hd)
        q = x_q @ m.W_query.weight[r].T
        k = x_kv @ m.W_key.weight[r].T
        v = x_kv @ m.W_value.weight[r].T
        s = q @ k.transpose(-2, -1) / math.sqrt(hd)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        outs.append(torch.softmax(s, -1) @ v)
    return m.out_proj(torch.cat(outs, -1))


# ------------------------------------------------------------------ wrapper


def test_wrapper_f045_and_first_head_equals_single_head():
    torch.manual_seed(123)
    w = MultiHeadAttentionWrapper(d_in=3, head_dim=2, context_length=6, dropout=0.0, num_heads=2)
    out = w(torch.stack([X6, X6]))
    assert out.shape == (2, 6, 4)
    torch.testing.assert_close(out[0], F045, atol=1e-4, rtol=0)
    torch.testing.assert_close(out[1], F045, atol=1e-4, rtol=0)
    torch.manual_seed(123)
    single = CausalSelfAttention(3, 2, 6)
    torch.testing.assert_close(out[0, :, :2], single(X6[None])[0])


def test_wrapper_keys_and_parameter_count():
    w = MultiHeadAttentionWrapper(5, 4, 8, 0.1, 3)
    keys = {k: tuple(v.shape) for k, v in w.state_dict().items()}
    assert keys == {f"heads.{h}.W_{n}.weight": (4, 5) for h in range(3) for n in ("query", "key", "value")}
    assert sum(p.numel() for p in w.parameters()) == 3 * 5 * 4 * 3  # 3·d_in·hd·H, no output projection


# ------------------------------------------------------------------ MultiHeadAttention


def test_parameter_counts_match_syllabus():
    for d, bias, want in [(768, False, 2_360_064), (768, True, 2_362_368), (512, False, 1_049_088),
                          (512, True, 1_050_624)]:
        assert mha_param_count(d, d, qkv_bias=bias) == want
        m = MultiHeadAttention(d, d, 8, qkv_bias=bias)
        assert sum(p.numel() for p in m.parameters()) == want


def test_structure_keys_buffer_and_errors():
    m = MultiHeadAttention(6, 4, 2, qkv_bias=True, causal=True, context_length=8, d_kv=5)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"W_query.weight": (4, 6), "W_query.bias": (4,), "W_key.weight": (4, 5), "W_key.bias": (4,),
                      "W_value.weight": (4, 5), "W_value.bias": (4,), "out_proj.weight": (4, 4),
                      "out_proj.bias": (4,)}
    buf = dict(m.named_buffers())["causal_mask"]
    assert buf.dtype == torch.bool and torch.equal(buf, torch.ones(8, 8, dtype=torch.bool).tril())
    assert "causal_mask" not in m.state_dict()
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(256, 256, 6)  # the "dim=256, heads=6" known error
    with pytest.raises(ValueError, match="context_length"):
        MultiHeadAttention(8, 8, 2, causal=True)
    m2 = MultiHeadAttention(8, 8, 2, causal=True, context_length=4)
    with pytest.raises(ValueError, match="context_length"):
        m2(torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match="bool"):
        MultiHeadAttention(8, 8, 2)(torch.randn(1, 3, 8), mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match="broadcast"):
        MultiHeadAttention(8, 8, 2)(torch.randn(2, 3, 8), mask=torch.ones(3, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="d_in"):
        MultiHeadAttention(8, 8, 2)(torch.randn(2, 3, 7))
    with pytest.raises(ValueError, match="x_kv"):
        MultiHeadAttention(8, 8, 2, d_kv=5)(torch.randn(2, 3, 8))


@pytest.mark.parametrize("bias", [False, True])
def test_matches_nn_multiheadattention(bias):
    m = _mha(8, 8, 4, qkv_bias=bias, causal=True, context_length=10, seed=1)
    x = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(2))
    cm = torch.ones(7, 7, dtype=torch.bool).tril()
    with torch.no_grad():
        ref, ref_w = _torch_oracle(m)(x, x, x, attn_mask=~cm, need_weights=True, average_attn_weights=False)
        m.store_weights = True
        out = m(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m.last_weights, ref_w, atol=1e-6, rtol=1e-5)
    # key padding on a non-causal module
    nc = _mha(8, 8, 2, qkv_bias=bias, seed=3)
    keep = torch.tensor([[True] * 7, [True] * 5 + [False] * 2, [True] * 2 + [False] * 5])
    with torch.no_grad():
        ref = _torch_oracle(nc)(x, x, x, key_padding_mask=~keep, need_weights=False)[0]
        torch.testing.assert_close(nc(x, mask=keep[:, None, None, :]), ref, atol=1e-5, rtol=1e-5)


def test_cross_attention_and_bottom_right_causal_vs_per_head_loop():
    m = _mha(6, 8, 4, d_kv=5, seed=4)
    g = torch.Generator().manual_seed(5)
    xq, xkv = torch.randn(2, 3, 6, generator=g), torch.randn(2, 7, 5, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(m(xq, xkv), _per_head(m, xq, xkv, None), atol=1e-5, rtol=1e-5)
    c = _mha(8, 8, 2, causal=True, context_length=10, seed=6)
    x = torch.randn(2, 6, 8, generator=g)
    bottom_right = torch.ones(2, 6, dtype=torch.bool).tril(diagonal=4)
    with torch.no_grad():
        torch.testing.assert_close(c(x[:, 4:], x), _per_head(c, x[:, 4:], x, bottom_right), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(c(x[:, 4:], x), c(x)[:, 4:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="T_q"):
        c(x, x[:, :3])


def test_causal_future_perturbation_and_padding_invariance():
    m = _mha(8, 8, 2, causal=True, context_length=12, seed=7)
    x = torch.randn(1, 8, 8, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        base = m(x)
        for pos in range(7):
            x2 = x.clone()
            x2[:, pos + 1:] += 3.0
            torch.testing.assert_close(m(x2)[:, :pos + 1], base[:, :pos + 1], atol=1e-6, rtol=0)
    nc = _mha(8, 8, 2, seed=9)
    extra = torch.cat([x, 10 * torch.randn(1, 3, 8)], dim=1)
    keep = torch.tensor([[True] * 8 + [False] * 3])[:, None, None, :]
    with torch.no_grad():
        torch.testing.assert_close(nc(x[:, :2], extra, mask=keep), nc(x[:, :2], x), atol=1e-6, rtol=0)


def test_last_weights_only_when_asked_and_dropout_train_mode():
    m = _mha(8, 8, 2, causal=True, context_length=6, seed=10)
    x = torch.randn(2, 6, 8)
    m(x)
    assert m.last_weights is None
    m.store_weights = True
    m(x)
    w = m.last_weights
    assert w.shape == (2, 2, 6, 6) and not w.requires_grad
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 6))
    assert bool((w.triu(1) == 0).all())
    d = MultiHeadAttention(8, 8, 2, dropout=0.5)
    d.train()
    torch.manual_seed(0)
    a = d(x)
    b = d(x)
    assert not torch.allclose(a, b)  # dropout active in train mode (property, not mask comparison)
    d.eval()
    torch.testing.assert_close(d(x), d(x))


# ------------------------------------------------------------------ equivalence and interop


@pytest.mark.parametrize("bias", [False, True])
def test_mha_from_wrapper_same_function(bias):
    torch.manual_seed(11)
    w = MultiHeadAttentionWrapper(5, 3, 9, 0.2, 4, qkv_bias=bias).eval()
    m = mha_from_wrapper(w).eval()
    assert m.causal and m.d_out == 12 and m.context_length == 9 and m.dropout.p == 0.2
    assert torch.equal(m.out_proj.weight, torch.eye(12)) and bool((m.out_proj.bias == 0).all())
    torch.testing.assert_close(m.W_value.weight[3:6], w.heads[1].W_value.weight)
    x = torch.randn(2, 9, 5)
    torch.testing.assert_close(m(x), w(x), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError):
        mha_from_wrapper(nn.Linear(2, 2))


def test_to_torch_mha_and_mask_polarity():
    cm = torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.equal(to_torch_attn_mask(cm), ~cm)
    with pytest.raises(ValueError, match="bool"):
        to_torch_attn_mask(cm.float())
    m = _mha(8, 8, 2, qkv_bias=True, seed=12)
    tm = to_torch_mha(m).eval()
    assert tm.batch_first
    assert torch.equal(tm.in_proj_weight[8:16], m.W_key.weight)
    x = torch.randn(2, 4, 8)
    with torch.no_grad():
        out, avg = tm(x, x, x, attn_mask=to_torch_attn_mask(cm), need_weights=True, average_attn_weights=True)
        m.store_weights = True
        torch.testing.assert_close(out, m(x, mask=cm), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(avg, m.last_weights.mean(1), atol=1e-6, rtol=1e-5)
    assert torch.equal(to_torch_mha(_mha(8, 8, 2, seed=13)).in_proj_bias, torch.zeros(24))
    with pytest.raises(ValueError, match="d_in == d_kv == d_out"):
        to_torch_mha(MultiHeadAttention(6, 8, 2))


def test_mha_forward_sdpa_matches_forward_and_is_causal_is_top_left():
    m = _mha(8, 8, 2, qkv_bias=True, causal=True, context_length=10, seed=14)
    g = torch.Generator().manual_seed(15)
    x = torch.randn(2, 6, 8, generator=g)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]
    with torch.no_grad():
        for xq, xkv, mask in [(x, None, None), (x[:, 3:], x, keep), (x[:, 4:], x, None)]:
            torch.testing.assert_close(mha_forward_sdpa(m, xq, xkv, mask), m(xq, xkv, mask), atol=1e-5, rtol=1e-5)
        # SDPA's is_causal with T_q < T_k is top-left aligned: it disagrees with the module
        q = torch.randn(1, 2, 2, 4, generator=g)
        k = torch.randn(1, 2, 5, 4, generator=g)
        top_left = F.scaled_dot_product_attention(q, k, k, is_causal=True)
        explicit = F.scaled_dot_product_attention(q, k, k, attn_mask=torch.ones(2, 5, dtype=torch.bool).tril())
        torch.testing.assert_close(top_left, explicit)


# ------------------------------------------------------------------ widgets


def test_merge_layout_reproduces_f044():
    good = V.merge_layout(1, 3, 2, 3)
    bad = V.merge_layout(1, 3, 2, 3, bug=True)
    assert good["merged"][0].tolist() == F044_CORRECT
    assert bad["merged"][0].tolist() == F044_BUG
    assert torch.equal(good["token"][0], torch.arange(3).view(3, 1).expand(3, 6))
    assert good["head"][0, 0].tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError):
        V.merge_layout(0, 3, 2, 3)


def test_f041_shape_trace():
    x = torch.zeros(1, 3, 6)
    split = x.view(1, 3, 2, 3).transpose(1, 2)
    assert split.shape == (1, 2, 3, 3) and V.tagged_head_context().shape == (1, 2, 3, 3)


def test_mask_translation():
    m = V.mask_translation(2, 5)
    assert m["course"].tolist() == [[True, True, True, True, False], [True] * 5]
    assert torch.equal(m["torch_mha"], ~m["course"])
    assert m["is_causal"].tolist() == [[True, False, False, False, False], [True, True, False, False, False]]
    assert int(m["differs"].sum()) == 6
    assert not V.mask_translation(4, 4)["differs"].any()
    with pytest.raises(ValueError):
        V.mask_translation(5, 2)


def test_head_viewer_weights_rows_and_causality():
    ids = [40, 367, 2885, 1464, 1807, 3619]
    w = V.head_viewer_weights(ids, n_layers=2, num_heads=4, d_model=32)
    assert w.shape == (2, 4, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))
    assert bool((w.triu(1) == 0).all())
    assert not torch.allclose(w[0, 0], w[0, 1])  # heads differ
    torch.testing.assert_close(V.head_viewer_weights(ids, 2, 4, 32), w)  # deterministic
    nc = V.head_viewer_weights(ids, 1, 4, 32, causal=False)
    assert bool((nc.triu(1) > 0).any())
    with pytest.raises(ValueError):
        V.head_viewer_weights([], 1, 4, 32)
    with pytest.raises(ValueError):
        V.head_viewer_weights(ids, 1, 6, 32)


def test_static_fallbacks_render():
    for show in (V.show_merge_visualiser, V.show_mask_translator):
        s = show(static=True)
        assert isinstance(s, StaticFigure) and isinstance(s.figure, Figure)
        assert s._repr_png_().startswith(b"\x89PNG")
    fig = V.draw_head_viewer(["a", "b", "c"], V.head_viewer_weights([1, 2, 3], 1, 4, 16), layer=0, head=2)
    assert isinstance(fig, Figure)
    with pytest.raises(ValueError):
        V.draw_head_viewer(["a"], V.head_viewer_weights([1], 1, 2, 16), layer=3)


def test_head_viewer_static_and_live():
    pytest.importorskip("ipywidgets")
    s = V.show_head_viewer(text="The artist painted the portrait of a woman with a brush", static=True)
    assert isinstance(s, StaticFigure)
    live = V.show_head_viewer(text="The artist painted the portrait", static=False)
    assert "llmcourse-w04-1" in live._dom_classes
    head = next(c for c in live.children[1].children if "llmcourse-head" in c._dom_classes)
    head.value = 1  # redraws without error
    live3 = V.show_mask_translator(static=False)
    tq = live3.children[1].children[0]
    tq.value = 7  # T_q > T_k is pulled back into range
    assert live3.children[1].children[1].value == 7


def test_model_head_weights_match_a_recomputation_from_the_trained_weights():
    """The trained head viewer's maps: layer 0 recomputed by hand from the model's embeddings, norm1 and
    the query/key projections (torch's softmax and an explicit causal mask), for every head."""
    from llmcourse.train.char_model import load_gpt_char_tiny

    model, tok = load_gpt_char_tiny(retrain=False, verbose=False)
    ids = tok.encode("ROMEO:\nBut soft")
    w = V.model_head_weights(model, ids)
    n_layers, heads = len(model.blocks), model.blocks[0].attn.num_heads
    t = len(ids)
    assert w.shape == (n_layers, heads, t, t)
    assert not any(b.attn.store_weights for b in model.blocks)          # switched back off
    with torch.no_grad():
        x = model.tok_emb(torch.tensor([ids])) + model.pos_emb(torch.arange(t))
        h = model.blocks[0].norm1(x)
        a = model.blocks[0].attn
        hd = a.head_dim
        q = a.W_query(h).view(1, t, heads, hd).transpose(1, 2)
        k = a.W_key(h).view(1, t, heads, hd).transpose(1, 2)
        s = (q @ k.transpose(-2, -1) / math.sqrt(hd)).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
        expected = torch.softmax(s, -1)[0]
    assert torch.allclose(w[0], expected, atol=1e-5)
    assert isinstance(V.show_trained_head_viewer(model, tok, "ROMEO:\nBut soft", static=True), StaticFigure)
    with pytest.raises(ValueError, match="empty"):
        V.model_head_weights(model, [])
