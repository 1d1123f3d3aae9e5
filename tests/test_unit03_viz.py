"""Unit 03 widgets (llmcourse.viz.attention): compute functions against the syllabus fixtures and
torch built-ins, clear errors, static fallbacks and live redrawing.

Expected numbers come from the syllabus (F03.1–F03.5, the data layer's fact sheet) or from
independent computations (``F.scaled_dot_product_attention``, ``torch.softmax``, formulas), never
from the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from llmcourse.viz import attention as A
from llmcourse.viz.base import StaticFigure, StaticPNG, css_class

# syllabus fixtures
F03_2_X = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                        [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
F03_3_WQ = torch.tensor([[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]])
F03_3_WK = torch.tensor([[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]])
F03_3_WV = torch.tensor([[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274]])
F03_3_K = torch.tensor([[0.3669, 0.7646], [0.4433, 1.1419], [0.4361, 1.1156],
                        [0.2408, 0.6706], [0.1827, 0.3292], [0.3275, 0.9642]])
F03_3_WEIGHTS_ROW1 = torch.tensor([0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820])
F03_4_CONTEXT = torch.tensor([[0.1855, 0.8812], [0.3116, 0.9549], [0.3395, 0.9652],
                              [0.3129, 0.8747], [0.2865, 0.7897], [0.2990, 0.8040]])
F03_5_SOFTMAX_ZERO_SUMS = torch.tensor([0.1551, 0.3764, 0.5952, 0.7024, 0.8248, 1.0000])
F03_5_ZERO_FILL_ROW0 = torch.tensor([0.2775, 0.1445, 0.1445, 0.1445, 0.1445, 0.1445])
VERDICT_FIRST_IDS = [40, 367, 2885, 1464, 1807, 3619, 402, 271, 10899, 2138]


def _qkv():
    ex = A.six_token_example()
    x = ex["x"]
    return x @ ex["W_query"], x @ ex["W_key"], x @ ex["W_value"]


# ---------------------------------------------------------------- the running example


def test_six_token_example_matches_f03_2_and_f03_3():
    ex = A.six_token_example()
    assert ex["tokens"] == ["Your", "journey", "starts", "with", "one", "step"]
    assert torch.equal(ex["x"], F03_2_X)
    assert torch.allclose(ex["W_query"], F03_3_WQ, atol=1e-4)
    assert torch.allclose(ex["W_key"], F03_3_WK, atol=1e-4)
    assert torch.allclose(ex["W_value"], F03_3_WV, atol=1e-4)


def test_six_token_example_leaves_global_rng_alone():
    state = torch.get_rng_state()
    A.six_token_example()
    assert torch.equal(state, torch.get_rng_state())


def test_token_label():
    assert A.token_label(" a") == "␣a"
    assert A.token_label("\n") == "⏎"
    assert A.token_label("--") == "--"
    assert A.token_label("") == "∅"


# ---------------------------------------------------------------- W03.1 masking methods and probe


def test_neg_inf_method_matches_torch_sdpa_and_f03_4():
    q, k, v = _qkv()
    ctx, w = A.masked_attention(q, k, v, "neg_inf", scale=True, causal=True)
    assert torch.allclose(ctx, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
    assert torch.allclose(ctx, F03_4_CONTEXT, atol=1e-4)
    assert torch.allclose(w[2], torch.tensor([0.2526, 0.3791, 0.3683, 0, 0, 0]), atol=1e-4)


def test_masking_variants_match_f03_5():
    q, k, v = _qkv()
    _, w_neg = A.masked_attention(q, k, v, "neg_inf")
    _, w_zero = A.masked_attention(q, k, v, "zero_fill")
    _, w_sz = A.masked_attention(q, k, v, "softmax_zero")
    _, w_rn = A.masked_attention(q, k, v, "softmax_zero_renorm")
    assert torch.allclose(w_sz.sum(-1), F03_5_SOFTMAX_ZERO_SUMS, atol=1e-4)
    assert torch.allclose(w_zero[0], F03_5_ZERO_FILL_ROW0, atol=1e-4)
    assert float((w_rn - w_neg).abs().max()) < 1e-6
    assert torch.allclose(w_zero.sum(-1), torch.ones(6), atol=1e-6)   # zero-fill keeps row sums at 1


def test_unmasked_and_unscaled_match_torch():
    q, k, v = _qkv()
    for method in A.MASK_METHODS:
        ctx, _ = A.masked_attention(q, k, v, method, scale=True, causal=False)
        assert torch.allclose(ctx, F.scaled_dot_product_attention(q, k, v), atol=1e-6)
    _, w = A.masked_attention(q, k, v, "neg_inf", scale=False, causal=False)
    assert torch.allclose(w, torch.softmax(q @ k.T, dim=-1), atol=1e-6)


def test_masked_attention_unknown_method():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="unknown mask method"):
        A.masked_attention(q, k, v, "triu")


@pytest.mark.parametrize("method, leaking", [("neg_inf", []), ("zero_fill", [0, 1, 2, 3, 4]),
                                             ("softmax_zero", [0, 1, 2, 3, 4]), ("softmax_zero_renorm", [])])
def test_leakage_probe(method, leaking):
    ex = A.six_token_example()
    changed, diff = A.leakage_probe(ex["x"], ex["W_query"], ex["W_key"], ex["W_value"], method)
    assert changed.dtype == torch.bool and changed.shape == (6,) and diff.shape == (6,)
    assert bool(changed[-1])                       # the perturbed token's own row changes
    assert [i for i in range(5) if changed[i]] == leaking


def test_leakage_probe_without_mask_changes_every_row():
    ex = A.six_token_example()
    changed, _ = A.leakage_probe(ex["x"], ex["W_query"], ex["W_key"], ex["W_value"], causal=False)
    assert changed.all()


def test_leakage_probe_rejects_batched_input():
    ex = A.six_token_example()
    with pytest.raises(ValueError, match=r"\(T, d_in\)"):
        A.leakage_probe(ex["x"][None], ex["W_query"], ex["W_key"], ex["W_value"])


def test_attention_lab_data():
    d = A.attention_lab("softmax_zero", probe=True)
    assert torch.allclose(d["row_sums"], F03_5_SOFTMAX_ZERO_SUMS, atol=1e-4)
    assert d["changed"][:5].all()
    assert A.attention_lab()["changed"] is None


# ---------------------------------------------------------------- W03.2 softmax sharpness


def test_softmax_sharpness_f03_1():
    p1, h1 = A.softmax_sharpness(1)
    p8, h8 = A.softmax_sharpness(8)
    assert torch.allclose(p1, torch.tensor([0.1925, 0.1426, 0.2351, 0.1426, 0.2872]), atol=1e-4)
    assert torch.allclose(p8, torch.tensor([0.0326, 0.0030, 0.1615, 0.0030, 0.8000]), atol=1e-4)
    assert h8 < h1 < math.log(5)


def test_softmax_sharpness_entropy_formula():
    _, h = A.softmax_sharpness(1.0, logits=(0.0, 0.0, 0.0, 0.0))
    assert h == pytest.approx(math.log(4), abs=1e-9)
    p, h = A.softmax_sharpness(2.0, logits=(1.0, 0.0))
    e = math.exp(2.0)
    q = e / (e + 1)
    assert float(p[0]) == pytest.approx(q, abs=1e-6)
    assert h == pytest.approx(-(q * math.log(q) + (1 - q) * math.log(1 - q)), abs=1e-9)


def test_softmax_sharpness_rejects_inf():
    with pytest.raises(ValueError):
        A.softmax_sharpness(float("inf"))


# ---------------------------------------------------------------- W03.3 variance vs dimension


@pytest.mark.parametrize("d", [2, 64, 512])
def test_dot_product_variance_f03_8(d):
    raw, scaled = A.dot_product_samples(d, n_samples=100_000, seed=0)
    assert raw.shape == (100_000,)
    assert abs(float(raw.var()) / d - 1) < 0.05
    assert abs(float(scaled.var()) - 1) < 0.05
    assert torch.allclose(scaled, raw / math.sqrt(d))


def test_dot_product_samples_chunking_and_seed():
    a, _ = A.dot_product_samples(16, n_samples=5000, seed=3, chunk_elems=1000)   # many small chunks
    b, _ = A.dot_product_samples(16, n_samples=5000, seed=3, chunk_elems=1000)
    assert a.shape == (5000,) and torch.equal(a, b)
    assert abs(float(a.var()) / 16 - 1) < 0.1


def test_dot_product_samples_errors():
    with pytest.raises(ValueError):
        A.dot_product_samples(0)
    with pytest.raises(ValueError):
        A.dot_product_samples(4, n_samples=1)


def test_dot_product_variance_curve():
    dims, var_raw, var_scaled = A.dot_product_variance(dims=(1, 8, 128), n_samples=20_000)
    assert list(dims) == [1, 8, 128]
    assert all(abs(v / d - 1) < 0.1 for v, d in zip(var_raw, dims))
    assert all(abs(v - 1) < 0.1 for v in var_scaled)


# ---------------------------------------------------------------- W03.4 geometry


def test_query_geometry_journey_is_f03_3():
    g = A.query_geometry(1, scale=True)
    assert torch.allclose(g["keys"], F03_3_K, atol=1e-4)
    assert torch.allclose(g["weights"], F03_3_WEIGHTS_ROW1, atol=1e-4)
    assert torch.allclose(g["scores"], torch.tensor([1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440]) / math.sqrt(2),
                          atol=1e-4)
    unscaled = A.query_geometry(1, scale=False)
    assert torch.allclose(unscaled["weights"], torch.softmax(unscaled["scores"], 0))


def test_query_geometry_errors():
    with pytest.raises(ValueError, match="query_index"):
        A.query_geometry(6)
    ex = A.six_token_example()
    ex["W_key"] = torch.rand(3, 3)
    with pytest.raises(ValueError, match="d_out = 2"):
        A.query_geometry(0, example=ex)


# ---------------------------------------------------------------- W03.5 dropout on weights


def test_dropout_on_weights_properties():
    w = torch.softmax(torch.randn(64, 64), dim=-1)
    d = A.dropout_on_weights(w, p=0.5, seed=0)
    keep = d["keep"]
    assert torch.equal(d["dropped"][keep], 2 * w[keep])           # survivors exactly 2x
    assert (d["dropped"][~keep] == 0).all()
    assert torch.allclose(d["row_sums"], d["dropped"].sum(-1))
    assert not torch.allclose(d["row_sums"], torch.ones(64))        # no longer a distribution
    frac = float((~keep).float().mean())
    assert abs(frac - 0.5) < 4 * math.sqrt(0.25 / keep.numel())


def test_dropout_on_weights_is_unbiased_and_seeded():
    w = torch.full((200, 200), 0.3)
    means = torch.stack([A.dropout_on_weights(w, 0.25, seed=s)["dropped"] for s in range(5)]).mean()
    assert abs(float(means) - 0.3) < 4 * 0.3 * math.sqrt(0.25 / 0.75 / (5 * w.numel()))
    a, b = A.dropout_on_weights(w, 0.25, seed=7), A.dropout_on_weights(w, 0.25, seed=7)
    assert torch.equal(a["keep"], b["keep"])
    assert torch.equal(A.dropout_on_weights(w, 0.0)["dropped"], w)


def test_dropout_on_weights_errors_and_rng():
    state = torch.get_rng_state()
    A.dropout_on_weights(torch.ones(3, 3), 0.5, seed=1)
    assert torch.equal(state, torch.get_rng_state())
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            A.dropout_on_weights(torch.ones(2, 2), p)


# ---------------------------------------------------------------- W03.6 real sentence


def test_sentence_tokens_the_verdict():
    from llmcourse import gpt2_encoding, load_text

    enc = gpt2_encoding()
    first_line = load_text("the-verdict").split("\n", 1)[0]
    ids, toks = A.sentence_tokens(first_line, max_tokens=30, encoding=enc)
    assert ids[:10] == VERDICT_FIRST_IDS
    assert len(ids) == len(toks) == 30
    assert toks[0] == "I" and toks[3] == " always"
    assert "".join(toks) == enc.decode(ids)
    with pytest.raises(ValueError, match="no tokens"):
        A.sentence_tokens("", encoding=enc)
    with pytest.raises(ValueError):
        A.sentence_tokens("hi", max_tokens=0, encoding=enc)


def test_untrained_head_qk():
    ids = [10, 20, 10, 30]
    q, k = A.untrained_head_qk(ids, d_model=64, seed=0)
    assert q.shape == k.shape == (4, 64)
    assert torch.equal(k[0], k[2]) and torch.equal(q[0], q[2])      # same token, same vectors
    assert not torch.equal(k[0], k[1])
    q2, _ = A.untrained_head_qk([10], d_model=64, seed=0)
    assert torch.allclose(q2[0], q[0], atol=1e-6)                       # independent of the other tokens
    big_q, big_k = A.untrained_head_qk(list(range(400)), d_model=64, seed=1)
    assert 0.7 < float(big_q.var()) < 1.3 and 0.7 < float(big_k.var()) < 1.3
    with pytest.raises(ValueError):
        A.untrained_head_qk(ids, d_model=0)


def test_attention_map_against_torch():
    torch.manual_seed(0)
    q, k, v = torch.randn(7, 16), torch.randn(7, 16), torch.randn(7, 5)
    w = A.attention_map(q, k, scale=True, causal=True, temperature=1.0)
    assert torch.allclose(w @ v, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
    assert torch.allclose(w.sum(-1), torch.ones(7), atol=1e-6) and (w.triu(1) == 0).all()
    w_t = A.attention_map(q, k, scale=False, causal=False, temperature=0.5)
    assert torch.allclose(w_t, torch.softmax(q @ k.T / 0.5, dim=-1), atol=1e-6)
    w_s = A.attention_map(q, k, scale=True, causal=False, temperature=2.0)
    assert torch.allclose(w_s, torch.softmax(q @ k.T / (4.0 * 2.0), dim=-1), atol=1e-6)


def test_attention_map_errors():
    q = torch.randn(3, 4)
    with pytest.raises(ValueError, match="temperature"):
        A.attention_map(q, q, temperature=0.0)
    with pytest.raises(ValueError, match="same width"):
        A.attention_map(q, torch.randn(3, 5))


# ---------------------------------------------------------------- heatmap helper and drawing


def test_attention_heatmap():
    w = torch.softmax(torch.randn(4, 4), -1)
    out = A.attention_heatmap(w, list("abcd"), title="t")
    assert isinstance(out, StaticPNG) and isinstance(out.figure, Figure)
    assert out._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="2-D"):
        A.attention_heatmap(w[None], list("abcd"))
    with pytest.raises(ValueError, match="labels"):
        A.attention_heatmap(w, list("abc"))


STATIC_SHOWS = [("W03.1", A.show_attention_lab), ("W03.2", A.show_softmax_sharpness),
                ("W03.3", A.show_variance_vs_dim), ("W03.4", A.show_query_geometry),
                ("W03.5", A.show_dropout_on_weights), ("W03.6", A.show_sentence_attention)]


@pytest.mark.parametrize("widget_id, show", STATIC_SHOWS)
def test_static_fallbacks(widget_id, show):
    out = show(static=True)
    assert isinstance(out, StaticFigure) and out.widget_id == widget_id
    html = out._repr_html_()
    assert f'data-widget="{widget_id}"' in html and "llmcourse-static" in html


def test_sentence_attention_validates_q_k():
    q = torch.randn(3, 8)
    with pytest.raises(ValueError, match="both"):
        A.show_sentence_attention("Hello there world", q=q, static=True)
    with pytest.raises(ValueError, match="one row per token"):
        A.show_sentence_attention("Hello there world", q=q, k=q[:2], static=True)


# ---------------------------------------------------------------- live widgets: draw on creation, redraw on change


@pytest.fixture
def recorder(monkeypatch):
    """Replace redrawing_output so every redraw is recorded as PNG bytes (no kernel needed)."""
    import ipywidgets as widgets

    from llmcourse.viz.base import render_png

    calls = []

    def fake_redrawing_output(draw):
        def update(**controls):
            calls.append((controls, render_png(draw(**controls), dpi=30)))
        return widgets.Output(), update

    monkeypatch.setattr(A, "redrawing_output", fake_redrawing_output)
    return calls


def _find(widget, cls, description=None):
    import ipywidgets as widgets

    if isinstance(widget, cls) and (description is None or getattr(widget, "description", None) == description):
        return widget
    if isinstance(widget, widgets.Box):
        for child in widget.children:
            found = _find(child, cls, description)
            if found is not None:
                return found
    return None


def test_live_widgets_have_dom_classes(recorder):
    for widget_id, show in STATIC_SHOWS:
        w = show(static=False)
        assert "llmcourse-widget" in w._dom_classes and css_class(widget_id) in w._dom_classes
    assert len(recorder) == len(STATIC_SHOWS)   # each drew once on creation


def test_live_sentence_attention_redraws_on_temperature_and_mask(recorder):
    import ipywidgets as widgets

    w = A.show_sentence_attention(static=False)
    assert "llmcourse-w03-6" in w._dom_classes
    assert len(recorder) == 1
    temp = _find(w, widgets.FloatSlider)
    causal = _find(w, widgets.Checkbox, "causal mask")
    temp.value = 0.3
    assert len(recorder) == 2 and recorder[-1][0]["temperature"] == 0.3
    assert recorder[-1][1] != recorder[0][1]
    causal.value = False
    assert len(recorder) == 3 and recorder[-1][0]["causal"] is False
    assert recorder[-1][1] != recorder[-2][1]


def test_live_attention_lab_probe_and_method(recorder):
    import ipywidgets as widgets

    w = A.show_attention_lab(static=False)
    method = _find(w, widgets.Dropdown)
    probe = _find(w, widgets.ToggleButton)
    assert set(method.options) == {(label, key) for key, label in A.MASK_METHODS.items()}
    method.value = "zero_fill"
    probe.value = True
    assert [c[0]["method"] for c in recorder] == ["neg_inf", "zero_fill", "zero_fill"]
    assert recorder[-1][0]["probe"] is True and recorder[-1][1] != recorder[-2][1]


def test_live_dropout_reseed(recorder):
    import ipywidgets as widgets

    w = A.show_dropout_on_weights(static=False)
    _find(w, widgets.Button).click()
    assert [c[0]["seed"] for c in recorder] == [0, 1]
    assert recorder[0][1] != recorder[1][1]


@pytest.mark.parametrize("draw, kwargs", [
    (A.draw_attention_lab, {"method": "softmax_zero", "probe": True}),
    (A.draw_softmax_sharpness, {"s": 4.0}),
    (A.draw_variance_vs_dim, {"d_k": 8, "n_samples": 2000, "curve": A.dot_product_variance((1, 2), 500)}),
    (A.draw_query_geometry, {"query_index": 4, "scale": False}),
    (A.draw_dropout_on_weights, {"p": 0.2, "seed": 3}),
])
def test_draw_functions_return_figures(draw, kwargs):
    assert isinstance(draw(**kwargs), Figure)


def test_sentence_attention_with_own_tokens_shows_the_given_head():
    """tokens + q, k (e.g. a trained character model): the static figure's default map is softmax(q kᵀ/√d_k)
    under the causal mask, computed here with torch's own attention routine."""
    torch.manual_seed(0)
    q, k = torch.randn(5, 8), torch.randn(5, 8)
    out = A.show_sentence_attention(q=q, k=k, tokens=list("hello"), unit="characters", static=True)
    assert isinstance(out, StaticFigure)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(q, k, torch.eye(5), attn_mask=causal)   # weights via identity values
    assert torch.allclose(A.attention_map(q, k, scale=True, causal=True), expected, atol=1e-6)
    with pytest.raises(ValueError, match="tokens needs q and k"):
        A.show_sentence_attention(tokens=list("hello"), static=True)
    with pytest.raises(ValueError, match="one row per token"):
        A.show_sentence_attention(q=q, k=k, tokens=list("hi"), static=True)
