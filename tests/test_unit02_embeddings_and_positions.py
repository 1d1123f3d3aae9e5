"""Unit 02 (embeddings and positions): the library pieces, the widget compute functions and clear errors.

Oracles are independent of the code under test: the syllabus's fixtures F02.1–F02.6 (literal numbers),
``torch.nn.functional.embedding``, a NumPy float64 formula for the sinusoidal table, the angle-addition
identity, and ``transformers``' ``GPT2Model`` for the learned position embedding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from llmcourse.nn import (
    GPTEmbedding,
    InputEmbeddings,
    PositionalEncoding,
    embedding_lookup,
    inverse_frequencies,
    one_hot_matmul,
    shift_matrix,
    sinusoidal_pe,
)
from llmcourse.viz import positions as VP

F021 = [[-0.1115, 0.1204, -0.3696], [-0.2404, -1.1969, 0.2093], [-0.9724, -0.7550, 0.3239],
        [-0.1085, 0.2103, -0.3908], [0.2350, 0.6653, 0.3528]]
F022 = [[0, 1, 0, 1], [0.8415, 0.5403, 0.0100, 0.99995], [0.9093, -0.4161, 0.0200, 0.9998],
        [0.1411, -0.9900, 0.0300, 0.99955]]
F023 = [0.8415, 0.5403, 0.3110, 0.9504, 0.0998, 0.9950, 0.0316, 0.9995, 0.0100, 0.99995, 0.0032, 1.0000, 0.0010,
        1.0000, 0.0003, 1.0000]


def numpy_pe(max_len, d_model):
    """Independent float64 oracle: PE[p, 2i] = sin(p/10000^(2i/D)), PE[p, 2i+1] = cos(...)."""
    pe = np.zeros((max_len, d_model))
    for i in range(d_model // 2):
        angle = np.arange(max_len) / 10000 ** (2 * i / d_model)
        pe[:, 2 * i] = np.sin(angle)
        pe[:, 2 * i + 1] = np.cos(angle)
    return pe


# ---------------------------------------------------------------- lookups


@pytest.mark.parametrize("fn", [embedding_lookup, one_hot_matmul])
@pytest.mark.parametrize("shape", [(), (7,), (2, 3), (2, 3, 4)])
def test_lookups_equal_f_embedding(fn, shape):
    g = torch.Generator().manual_seed(len(shape))
    weight = torch.randn(11, 6, generator=g)
    ids = torch.randint(0, 11, shape, generator=g)
    out = fn(ids, weight)
    assert out.shape == (*shape, 6)
    torch.testing.assert_close(out, F.embedding(ids, weight), atol=1e-6, rtol=0)
    assert fn(ids, weight.double()).dtype == torch.float64


def test_f021_fixture_and_lookup():
    torch.manual_seed(123)
    emb = torch.nn.Embedding(5, 3)
    torch.testing.assert_close(emb.weight.data, torch.tensor(F021), atol=1e-4, rtol=0)
    rows = embedding_lookup(torch.tensor([0, 1]), emb.weight.data)
    torch.testing.assert_close(rows, torch.tensor(F021[:2]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("fn", [embedding_lookup, one_hot_matmul])
def test_gradient_touches_only_used_rows(fn):
    ids = torch.tensor([[1, 4, 4], [7, 1, 4]])
    w = torch.randn(9, 5, requires_grad=True)
    fn(ids, w).sum().backward()
    expected = torch.zeros(9, 5)
    expected[1], expected[4], expected[7] = 2.0, 3.0, 1.0
    assert torch.equal(w.grad, expected)


@pytest.mark.parametrize("fn", [embedding_lookup, one_hot_matmul])
def test_lookup_bad_input_is_a_clear_value_error(fn):
    w = torch.randn(5, 3)
    with pytest.raises(ValueError, match="integer"):
        fn(torch.tensor([0.0, 1.0]), w)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        fn(torch.tensor([0, 5]), w)
    with pytest.raises(ValueError, match="2-D"):
        fn(torch.tensor([0]), torch.randn(5))


# ---------------------------------------------------------------- InputEmbeddings


def test_input_embeddings_f021_scaled_by_sqrt_d():
    torch.manual_seed(123)
    m = InputEmbeddings(5, 3)
    assert list(m.state_dict()) == ["embedding.weight"]
    out = m(torch.tensor([[0, 1]]))
    assert out.shape == (1, 2, 3) and out.dtype == torch.float32
    torch.testing.assert_close(out[0], torch.tensor(F021[:2]) * math.sqrt(3), atol=1e-3, rtol=0)


def test_input_embeddings_rejects_float_and_out_of_range_ids():
    m = InputEmbeddings(5, 3)
    with pytest.raises(ValueError, match="integer"):
        m(torch.tensor([[0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        m(torch.tensor([[0, 7]]))


# ---------------------------------------------------------------- sinusoidal_pe


def test_sinusoidal_fixtures_f022_f023():
    pe = sinusoidal_pe(4, 4)
    assert pe.shape == (4, 4) and pe.dtype == torch.float32
    torch.testing.assert_close(pe, torch.tensor(F022), atol=1e-4, rtol=0)
    torch.testing.assert_close(sinusoidal_pe(6, 16)[1], torch.tensor(F023), atol=1e-4, rtol=0)


@pytest.mark.parametrize("max_len,d_model", [(8, 512), (64, 512), (2048, 512), (10, 6), (1, 2)])
def test_sinusoidal_matches_float64_formula(max_len, d_model):
    # the reference rounds once from float64, so it is within float32 rounding even at position 2047
    np.testing.assert_allclose(sinusoidal_pe(max_len, d_model).double().numpy(), numpy_pe(max_len, d_model),
                               atol=1e-7, rtol=0)


@pytest.mark.parametrize("bad", [(4, 5), (4, 0), (0, 4), (4.0, 4), (4, 3.0), (True, 4)])
def test_sinusoidal_bad_sizes_raise_value_error(bad):
    with pytest.raises(ValueError):
        sinusoidal_pe(*bad)


def test_inverse_frequencies_f025():
    omega = inverse_frequencies(512)
    assert omega.shape == (256,) and omega[0] == 1.0
    ratio = omega[:-1] / omega[1:]
    assert torch.allclose(ratio, torch.full_like(ratio, 10000 ** (2 / 512)))
    assert round(float(ratio[0]), 6) == 1.036633
    with pytest.raises(ValueError, match="even"):
        inverse_frequencies(7)


# ---------------------------------------------------------------- shift_matrix


def test_shift_matrix_is_the_rotation_for_random_p_k_omega():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p, k, omega = rng.uniform(0, 500), rng.uniform(-50, 50), 10000 ** -rng.uniform(0, 1)
        m = shift_matrix(k, omega, dtype=torch.float64)
        assert torch.allclose(m @ m.T, torch.eye(2, dtype=torch.float64), atol=1e-12)
        assert abs(torch.linalg.det(m).item() - 1) < 1e-12
        got = m @ torch.tensor([math.sin(omega * p), math.cos(omega * p)], dtype=torch.float64)
        want = torch.tensor([math.sin(omega * (p + k)), math.cos(omega * (p + k))], dtype=torch.float64)
        assert torch.allclose(got, want, atol=1e-12)
    assert shift_matrix(1, 1.0).dtype == torch.float32


def test_f024_every_pair_rotates_by_m_k_in_float64():
    d, n = 512, 600
    pe = numpy_pe(n, d)
    worst = 0.0
    for k in (1, 13, 250):
        for i in range(d // 2):
            m = shift_matrix(k, 10000 ** (-2 * i / d), dtype=torch.float64).numpy()
            rotated = pe[:-k, 2 * i:2 * i + 2] @ m.T
            worst = max(worst, float(np.abs(rotated - pe[k:, 2 * i:2 * i + 2]).max()))
    assert worst < 1e-12  # F02.4: about 1e-14


def test_shift_matrix_rejects_non_numbers():
    with pytest.raises(ValueError, match="real numbers"):
        shift_matrix("3", 1.0)
    with pytest.raises(ValueError, match="real numbers"):
        shift_matrix(1, torch.ones(2))


# ---------------------------------------------------------------- PositionalEncoding


def test_positional_encoding_structure_and_memory():
    m = PositionalEncoding(512, 2048, dropout=0.1)
    assert sum(p.numel() for p in m.parameters()) == 0
    assert list(dict(m.named_buffers())) == ["pe"] and m.state_dict() == {}
    assert m.pe.shape == (1, 2048, 512) and m.pe.dtype == torch.float32
    assert m.pe.numel() * m.pe.element_size() == 4 * 2**20  # 4 MiB
    m.to(torch.float64)
    assert m.pe.dtype == torch.float64


def test_positional_encoding_eval_adds_and_train_drops_the_sum():
    m = PositionalEncoding(8, 10, dropout=0.5)
    x = 2.0 + torch.rand(4, 7, 8)
    table = torch.from_numpy(numpy_pe(10, 8)).float()
    torch.testing.assert_close(m.eval()(x), x + table[:7], atol=1e-6, rtol=0)
    torch.manual_seed(0)
    out = m.train()(x)
    clean = x + table[:7]
    assert bool(((out == 0) | torch.isclose(out, 2 * clean)).all())
    assert 0.3 < (out == 0).float().mean() < 0.7


def test_positional_encoding_clear_errors():
    m = PositionalEncoding(8, 10)
    with pytest.raises(ValueError, match="max_len"):
        m(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match="d_model"):
        m(torch.zeros(1, 5, 6))
    with pytest.raises(ValueError, match=r"\(B, T, d_model\)"):
        m(torch.zeros(5, 8))
    with pytest.raises(ValueError, match="even"):
        PositionalEncoding(7, 10)


# ---------------------------------------------------------------- GPTEmbedding


def test_gpt_embedding_matches_transformers_gpt2():
    from transformers import GPT2Config, GPT2Model

    hf = GPT2Model(GPT2Config(vocab_size=60, n_positions=12, n_embd=8, n_layer=1, n_head=2, embd_pdrop=0.0,
                              bos_token_id=0, eos_token_id=0)).eval()
    ours = GPTEmbedding(60, 12, 8).eval()
    ours.load_state_dict({"tok_emb.weight": hf.wte.weight.detach(), "pos_emb.weight": hf.wpe.weight.detach()})
    idx = torch.randint(0, 60, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(idx, output_hidden_states=True).hidden_states[0]
        torch.testing.assert_close(ours(idx), expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours(idx[:, :5]), expected[:, :5], atol=1e-6, rtol=0)


def test_gpt_embedding_structure_positions_from_zero_and_dropout_on_sum():
    m = GPTEmbedding(50, 8, 4, dropout=0.5)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {"tok_emb.weight": (50, 4),
                                                                     "pos_emb.weight": (8, 4)}
    with torch.no_grad():
        m.tok_emb.weight.zero_()
    out = m.eval()(torch.tensor([[3, 3, 3]]))
    assert torch.equal(out[0], m.pos_emb.weight[:3].detach())
    with torch.no_grad():
        m.tok_emb.weight.fill_(5.0)
    torch.manual_seed(0)
    out = m.train()(torch.randint(0, 50, (6, 8)))
    clean = 5.0 + m.pos_emb.weight.detach()
    assert bool(((out == 0) | torch.isclose(out, 2 * clean.expand_as(out))).all())


def test_gpt_embedding_clear_errors():
    m = GPTEmbedding(50, 8, 4)
    with pytest.raises(ValueError, match="context_length"):
        m(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        m(torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        m(torch.zeros(1, 3))


# ---------------------------------------------------------------- widget compute functions


@pytest.mark.parametrize("i,period,cycles", [(0, 6.28, 162.97), (1, 6.44, 159.11), (50, 20.85, 49.12),
                                             (150, 229.45, 4.46), (250, 2525.5, 0.41)])
def test_frequency_curves_f025(i, period, cycles):
    c = VP.frequency_curves(i, 768, 1024)
    assert abs(c["period"] - period) < 0.01 * max(1, period / 100)
    assert round(c["cycles"], 2) == cycles
    assert np.allclose(c["sin"] ** 2 + c["cos"] ** 2, 1.0)


def test_frequency_curves_pair_250_at_1023_and_errors():
    s, c = VP.frequency_curves(250, 768, 1024)["last"]
    assert (round(s, 3), round(c, 3)) == (0.562, -0.827)
    with pytest.raises(ValueError, match="pair index"):
        VP.frequency_curves(384, 768)


def test_shift_rotation_points_coincide():
    for i in (0, 4, 7):
        r = VP.shift_rotation(3, 5, i, 16)
        w = 10000 ** (-2 * i / 16)
        assert np.allclose(r["target"], [math.sin(8 * w), math.cos(8 * w)])
        assert r["error"] < 1e-12
    with pytest.raises(ValueError):
        VP.shift_rotation(3, 5, 8, 16)


def test_position_similarity_depends_on_offset_only():
    r = VP.position_similarity(64, 128)
    omega = 10000 ** (-np.arange(0, 128, 2) / 128)
    formula = np.cos(np.arange(64)[:, None] * omega[None, :]).sum(-1)
    assert np.allclose(r["by_k"].numpy(), formula)
    assert float(r["spread"].max()) < 1e-10
    assert np.allclose(r["mean_by_k"].numpy(), formula)
    assert r["by_k"][0] == pytest.approx(64.0)


def test_candidate_codes_f026_and_length_dependence():
    codes = VP.candidate_encodings(76, 8)
    binary = ["".join(str(int(b)) for b in row) for row in codes["binary"][64:76].tolist()]
    assert binary[0] == "01000000" and binary[-1] == "01001011"
    assert sum(a != b for a, b in zip(binary[3], binary[4])) == 3  # 67 -> 68
    short = VP.candidate_encodings(10, 4)["p/N"]
    long = VP.candidate_encodings(20, 4)["p/N"]
    assert short[5, 0] == pytest.approx(5 / 9) and long[5, 0] == pytest.approx(5 / 19)
    assert torch.equal(codes["integer"][:, 0], torch.arange(76, dtype=torch.float64))


def test_requirements_checklist_matches_the_lesson():
    checks = VP.requirements_checklist(64, 16)
    assert all(checks["sinusoidal"].values())
    assert not checks["p/N"]["R1"]                                     # depends on the sequence length
    assert not checks["integer"]["R3"]                                 # unbounded
    assert not checks["binary"]["R2"] and not checks["sine only"]["R2"]  # no single linear shift map
    assert checks["binary"]["R3"] and checks["integer"]["R1"]


def test_pe_heatmap_data_defaults_and_errors():
    d = VP.pe_heatmap_data(100, 64)
    assert d["pe"].shape == (100, 64) and d["dims"] == (0, 1, 16, 62)
    assert d["periods"][0] == pytest.approx(2 * math.pi)
    with pytest.raises(ValueError, match="dims"):
        VP.pe_heatmap_data(10, 8, dims=(8,))


@pytest.mark.parametrize("name,widget_id", [("show_pe_heatmap", "W02.1"), ("show_frequency_explorer", "W02.2"),
                                            ("show_shift_rotation", "W02.3"), ("show_candidate_comparison", "W02.4"),
                                            ("show_position_similarity", "W02.5")])
def test_widgets_static_and_live(name, widget_id, monkeypatch):
    from llmcourse.viz.base import StaticFigure, css_class

    show = getattr(VP, name)
    static = show(static=True)
    assert isinstance(static, StaticFigure) and static.widget_id == widget_id
    assert isinstance(static.figure, Figure)
    monkeypatch.setenv("LLMCOURSE_WIDGETS", "live")
    live = show()
    assert "llmcourse-widget" in live._dom_classes and css_class(widget_id) in live._dom_classes
