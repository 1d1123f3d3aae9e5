"""Unit 16: the simulated FP8 training step (llmcourse.quant.fp8_train) against an independent route.

The oracle quantises each tile with an explicit loop (scale = tile amax / 448, one cast per tile) and multiplies
the dequantised tiles in float64: a different route from the library's padded views, float32 products and the
autograd function."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from llmcourse.quant import fp8_train as FT


def _tile_oracle(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise-dequantise ``x`` in ``rows × cols`` tiles by looping over tiles; returns (x̂ float64, scales)."""
    x = x.detach().float()
    out = torch.empty_like(x, dtype=torch.float64)
    M, K = x.shape
    scales = torch.empty(-(-M // rows), -(-K // cols))
    for i in range(0, M, rows):
        for j in range(0, K, cols):
            t = x[i:i + rows, j:j + cols]
            s = max(float(t.abs().max()), 1e-12) / 448.0
            scales[i // rows, j // cols] = s
            q = (t / torch.tensor(s, dtype=torch.float32)).clamp(-448, 448).to(torch.float8_e4m3fn)
            out[i:i + rows, j:j + cols] = q.double() * s
    return out, scales


def _rel(a, b):
    return float((a.detach().double() - b.double()).norm() / b.double().norm())


@pytest.fixture
def operands():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 200, generator=g) * torch.logspace(-2, 2, 200)        # tile scales differ strongly
    w = torch.randn(260, 200, generator=g) * torch.logspace(1, -3, 260)[:, None]
    dy = torch.randn(300, 260, generator=g) * torch.logspace(-1, 1, 300)[:, None]
    return x, w, dy


def test_tile_scales_are_amax_over_448(operands):
    x, _, _ = operands
    for dim, shape in ((1, (1, 128)), (0, (128, 1))):
        q, s = FT.quantize_tiles(x, dim)
        want, s_ref = _tile_oracle(x, *shape)
        assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
        assert s.shape == s_ref.shape, (dim, s.shape, s_ref.shape)
        torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
        torch.testing.assert_close(FT.dequantize_tiles(q, s, dim).double(), want, rtol=1e-6, atol=0)
        assert q.float().abs().max() == 448.0
    # the two orientations really differ on this input (the test could tell them apart)
    assert not torch.equal(FT.dequantize_tiles(*FT.quantize_tiles(x, 0), 0), FT.dequantize_tiles(*FT.quantize_tiles(x, 1), 1))
    with pytest.raises(ValueError):
        FT.quantize_tiles(x, 2)


def test_fast_path_equals_quantize_dequantize(operands):
    x, w, dy = operands
    for t in (x, w, dy, x[:5, :7]):
        for dim in (0, 1):
            assert torch.equal(FT._fp8(t, dim, 128), FT.dequantize_tiles(*FT.quantize_tiles(t, dim), dim))


def test_forward_and_gradients_match_the_tiled_oracle(operands):
    x, w, dy = operands
    b = torch.randn(260)
    xr, wr, br = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    y = FT.fp8_linear(xr, wr, br)
    y.backward(dy)
    x_fwd, _ = _tile_oracle(x, 1, 128)          # Fprop: x in 1×128 tiles, w in 128×128 blocks
    w_blk, _ = _tile_oracle(w, 128, 128)
    assert _rel(y, x_fwd @ w_blk.T + b.double()) < 1e-6   # float32 products vs float64: rounding only
    dy_row, _ = _tile_oracle(dy, 1, 128)        # Dgrad contracts N: dy in 1×128 tiles
    assert _rel(xr.grad, dy_row @ w_blk) < 1e-6
    dy_col, _ = _tile_oracle(dy, 128, 1)        # Wgrad contracts M: dy and x in 128×1 tiles
    x_col, _ = _tile_oracle(x, 128, 1)
    assert _rel(wr.grad, dy_col.T @ x_col) < 1e-6
    torch.testing.assert_close(br.grad, dy.sum(0), rtol=1e-6, atol=1e-4)
    # and they are FP8-close to the float32 gradients, not equal to them (the backward is really quantised)
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    (xe @ we.T).backward(dy)
    for got, ref in ((xr.grad, xe.grad), (wr.grad, we.grad)):
        assert 1e-4 < _rel(got, ref) < 0.1


def test_wrong_tile_orientation_is_detected(operands):
    """A Wgrad with x in 1×128 tiles (the forward's tiles) is a different number: the oracle above can fail."""
    x, w, dy = operands
    dy_col, _ = _tile_oracle(dy, 128, 1)
    x_row, _ = _tile_oracle(x, 1, 128)
    wr = w.clone().requires_grad_()
    FT.fp8_linear(x, wr).backward(dy)
    assert _rel(wr.grad, dy_col.T @ x_row) > 1e-3


def test_fp8_linear_shapes_and_errors():
    x = torch.randn(2, 3, 16)
    w = torch.randn(8, 16)
    assert FT.fp8_linear(x, w).shape == (2, 3, 8)
    with pytest.raises(ValueError):
        FT.fp8_linear(x, torch.randn(8, 15))


def test_converter_shares_parameters_and_skips_head_and_tied():
    from llmcourse.models import Llama3Config, Llama3Model

    torch.manual_seed(0)
    m = Llama3Model(Llama3Config.preset("llama3-tiny"))
    params = {n: p for n, p in m.named_parameters()}
    state = torch.get_rng_state()
    FT.convert_linears_for_fp8_training(m)
    assert torch.equal(state, torch.get_rng_state()), "conversion must not draw new weights"
    after = dict(m.named_parameters())
    assert params.keys() == after.keys() and all(params[n] is after[n] for n in params)
    kinds = {n: type(mod) for n, mod in m.named_modules()}
    assert kinds["layers.0.mlp.gate_proj"] is FT.FP8TrainLinear
    assert m.lm_head.weight is m.embed_tokens.weight and type(m.lm_head) is not FT.FP8TrainLinear
    lin = nn.Sequential()
    lin.add_module("gate", nn.Linear(4, 4))
    lin.add_module("up", nn.Linear(4, 4))
    FT.convert_linears_for_fp8_training(lin)
    assert type(lin.gate) is nn.Linear and type(lin.up) is FT.FP8TrainLinear


def test_training_curves_track_fp32():
    from llmcourse.data.corpus import char_corpus
    from llmcourse.models import Llama3Config, Llama3Model

    corpus = char_corpus("tinyshakespeare")
    torch.manual_seed(0)
    cfg = Llama3Config.preset("llama3-tiny")
    m = Llama3Model(Llama3Config(**{**cfg.__dict__, "n_layers": 1}))
    before = copy.deepcopy(m.state_dict())
    r = FT.fp8_training_curves(m, corpus.train, corpus.val, 12, 8, 32, lambda s: 3e-3, eval_batches=2)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items()), "the model itself must not change"
    assert len(r["fp32"]) == len(r["fp8"]) == 12 and len(r["converted"]) == 7
    assert r["fp32"][0] == pytest.approx(r["fp8"][0], rel=0.01)      # same weights, same batch, FP8 noise only
    assert r["fp32"][-1] < r["fp32"][0] - 0.3 and r["fp8"][-1] < r["fp8"][0] - 0.3
    assert abs(r["rel_gap"]) < 0.05
    assert r["rel_gap"] == pytest.approx((r["val_fp8"] - r["val_fp32"]) / r["val_fp32"])
