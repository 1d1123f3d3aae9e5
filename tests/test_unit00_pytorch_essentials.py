"""Unit 00 (PyTorch essentials): library pieces, widget compute functions, clear errors.

Oracles are independent of the code under test: the syllabus's fixture values (F00.1–F00.4), closed
formulas, and PyTorch built-ins (``view``/``transpose``, ``tril``, ``@``, ``F.cross_entropy``, a real
``LambdaLR`` driving an optimizer).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from llmcourse import (
    causal_mask,
    label_smoothed_cross_entropy,
    make_noam_scheduler,
    merge_heads,
    noam_lambda,
    split_heads,
)
from llmcourse.nn import ResidualStack, attention_output_einsum, attention_scores_einsum
from llmcourse.viz import essentials as E
from llmcourse.viz.base import StaticFigure

F003 = {1: 1.746928e-07, 100: 1.746928e-05, 1000: 1.746928e-04, 4000: 6.987712e-04, 8000: 4.941059e-04,
        16000: 3.493856e-04}


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- heads


def test_split_merge_shapes_f00_1():
    x = randn(2, 6, 16)
    h = split_heads(x, 4)
    assert h.shape == (2, 4, 6, 4)
    assert merge_heads(h).shape == (2, 6, 16)


@pytest.mark.parametrize("b,t,d,h", [(2, 6, 16, 4), (3, 5, 12, 3), (1, 7, 8, 8), (2, 4, 10, 1)])
def test_split_heads_equals_view_transpose(b, t, d, h):
    x = randn(b, t, d, seed=d)
    assert torch.equal(split_heads(x, h), x.view(b, t, h, d // h).transpose(1, 2))
    assert torch.equal(split_heads(x, h)[:, 0], x[..., : d // h])


def test_round_trip_exact_also_non_contiguous():
    for x in (randn(2, 6, 16), randn(6, 2, 16).transpose(0, 1), randn(2, 16, 6).transpose(1, 2)):
        out = merge_heads(split_heads(x, 4 if x.shape[-1] == 16 else 3))
        assert torch.equal(out, x) and out.is_contiguous()


def test_merge_heads_contiguous_input_and_output():
    y = randn(2, 4, 6, 4)  # contiguous: .view after transpose would fail here
    out = merge_heads(y)
    assert out.is_contiguous() and torch.equal(out, y.permute(0, 2, 1, 3).reshape(2, 6, 16))


def test_view_after_transpose_raises_but_reshape_works():
    y = randn(2, 4, 6, 4).transpose(1, 2)
    with pytest.raises(RuntimeError, match="view size is not compatible with input tensor's size and stride"):
        y.view(2, 6, 16)
    assert y.reshape(2, 6, 16).shape == (2, 6, 16)


@pytest.mark.parametrize("call,match", [
    (lambda: split_heads(randn(2, 6, 15), 4), "not divisible"),
    (lambda: split_heads(randn(6, 16), 4), r"\(B, T, D\)"),
    (lambda: split_heads(randn(2, 6, 16), 0), "at least 1"),
    (lambda: merge_heads(randn(2, 6, 16)), "head_dim"),
])
def test_heads_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- masks


def test_causal_mask_f00_2():
    T_, F_ = True, False
    assert causal_mask(3, 5).tolist() == [[T_, T_, T_, F_, F_], [T_, T_, T_, T_, F_], [T_, T_, T_, T_, T_]]
    assert causal_mask(1, 5).all() and causal_mask(1, 5).shape == (1, 5)
    assert torch.equal(causal_mask(4), torch.ones(4, 4).tril().bool())


def test_causal_mask_matches_tril_oracle():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        t_q = int(torch.randint(1, 8, (1,), generator=g))
        t_k = int(torch.randint(t_q, 11, (1,), generator=g))
        offset = int(torch.randint(-2, t_k + 1, (1,), generator=g))
        assert torch.equal(causal_mask(t_q, t_k, offset=offset), torch.ones(t_q, t_k).tril(offset).bool())
        assert torch.equal(causal_mask(t_q, t_k), torch.ones(t_q, t_k).tril(t_k - t_q).bool())


def test_causal_mask_dtype_device_and_errors():
    m = causal_mask(3, 5, device=torch.device("meta"))
    assert m.dtype == torch.bool and m.device.type == "meta"
    with pytest.raises(ValueError):
        causal_mask(-1)


# ----------------------------------------------------------------------------- einsum


@pytest.mark.parametrize("shape_q,t_k,d_v", [((2, 3, 5, 8), 7, 4), ((1, 4, 1, 16), 9, 6)])
def test_einsum_products_match_matmul(shape_q, t_k, d_v):
    b, h, t_q, d = shape_q
    q, k, v = randn(*shape_q, seed=1), randn(b, h, t_k, d, seed=2), randn(b, h, t_k, d_v, seed=3)
    w = (q @ k.transpose(-2, -1)).softmax(-1)
    assert torch.allclose(attention_scores_einsum(q, k), q @ k.transpose(-2, -1), atol=1e-6)
    assert torch.allclose(attention_output_einsum(w, v), w @ v, atol=1e-6)


def test_wrong_einsum_index_gives_row_sum_times_value_sum():
    # the documented bug: a fresh letter for the values' sequence axis
    w, v = randn(2, 2, 3, 5).softmax(-1), randn(2, 2, 5, 4)
    wrong = torch.einsum("bhqk,bhvd->bhqd", w, v)
    assert torch.allclose(wrong, w.sum(-1, keepdim=True) * v.sum(-2, keepdim=True), atol=1e-5)
    assert not torch.allclose(wrong, attention_output_einsum(w, v), atol=1e-3)


def test_einsum_clear_errors():
    with pytest.raises(ValueError, match="4-D"):
        attention_scores_einsum(randn(3, 4), randn(3, 4))
    with pytest.raises(ValueError, match="feature size"):
        attention_scores_einsum(randn(1, 2, 3, 4), randn(1, 2, 3, 5))
    with pytest.raises(ValueError, match="T_k"):
        attention_output_einsum(randn(1, 2, 3, 4), randn(1, 2, 5, 6))


# ----------------------------------------------------------------------------- label-smoothed cross-entropy


def test_lsce_f00_4():
    z, y = torch.tensor([[2.0, 1.0, 0.1]]), torch.tensor([0])
    assert abs(label_smoothed_cross_entropy(z, y).item() - 0.4170) < 1e-4
    assert abs(label_smoothed_cross_entropy(z, y, eps=0.1).item() - 0.5137) < 1e-4
    assert abs(0.9 * 0.4170 + 0.1 * 1.3837 - 0.5137) < 1e-4  # the syllabus's decomposition


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3, 1.0])
def test_lsce_matches_f_cross_entropy_2d_3d_with_ignored(eps):
    z2, y2 = randn(12, 7, seed=4) * 2, torch.randint(0, 7, (12,), generator=torch.Generator().manual_seed(5))
    y2[[1, 6]] = -100
    ref2 = F.cross_entropy(z2, y2, label_smoothing=eps)
    assert torch.allclose(label_smoothed_cross_entropy(z2, y2, eps=eps), ref2, atol=1e-6)
    z3 = randn(2, 5, 6, seed=6)
    y3 = torch.tensor([[1, 2, 3, 0, 0], [5, 4, 3, 2, 0]])
    ref3 = F.cross_entropy(z3.reshape(-1, 6), y3.reshape(-1), label_smoothing=eps, ignore_index=0)
    assert torch.allclose(label_smoothed_cross_entropy(z3, y3, eps=eps, ignore_index=0), ref3, atol=1e-6)


def test_lsce_properties():
    z = randn(4, 5, seed=7) * 1e4
    y = torch.tensor([0, 1, 2, 3])
    out = label_smoothed_cross_entropy(z, y, eps=0.1)
    assert out.dim() == 0 and torch.isfinite(out)
    assert torch.allclose(out, F.cross_entropy(z, y, label_smoothing=0.1), rtol=1e-5)
    all_ignored = label_smoothed_cross_entropy(randn(3, 4), torch.full((3,), -100))
    assert torch.isnan(all_ignored) and torch.isnan(F.cross_entropy(randn(3, 4), torch.full((3,), -100)))


@pytest.mark.parametrize("logits,targets,kw,match", [
    (randn(3, 4), torch.tensor([0, 1]), {}, "shape"),
    (randn(3, 4), torch.tensor([0.0, 1.0, 2.0]), {}, "integer"),
    (randn(3, 4), torch.tensor([0, 1, 2]), {"eps": 1.5}, r"\[0, 1\]"),
    (randn(3, 4), torch.tensor([0, 1, 4]), {}, "outside"),
    (randn(4), torch.tensor(0), {}, r"\(N, C\)"),
])
def test_lsce_clear_errors(logits, targets, kw, match):
    with pytest.raises(ValueError, match=match):
        label_smoothed_cross_entropy(logits, targets, **kw)


# ----------------------------------------------------------------------------- Noam schedule


def test_noam_lambda_f00_3_and_peak():
    for step, value in F003.items():
        assert math.isclose(noam_lambda(step, 512, 4000), value, rel_tol=2e-6)
    assert math.isclose(noam_lambda(4000, 512, 4000), (512 * 4000) ** -0.5, rel_tol=1e-12)
    assert noam_lambda(0, 512, 4000) == noam_lambda(1, 512, 4000)
    values = [noam_lambda(s, 512, 4000) for s in range(1, 8001)]
    assert values.index(max(values)) + 1 == 4000


def _lrs_before_steps(optimizer, scheduler, n):
    seen = []
    for _ in range(n):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return seen


@pytest.mark.parametrize("factor,d_model,warmup", [(1.0, 512, 4000), (2.0, 64, 3)])
def test_make_noam_scheduler_nth_step_uses_lambda_n(factor, d_model, warmup):
    p1, p2 = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([{"params": [p1]}, {"params": [p2], "lr": 0.5}], lr=1e-4)  # the base-lr trap
    sched = make_noam_scheduler(opt, d_model, warmup, factor=factor)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    seen = _lrs_before_steps(opt, sched, 7)
    for n, lrs in enumerate(seen, start=1):
        want = factor * d_model ** -0.5 * min(n ** -0.5, n * warmup ** -1.5)
        assert all(math.isclose(lr, want, rel_tol=1e-9) for lr in lrs), (n, lrs, want)


def test_make_noam_scheduler_peak_and_reattached_optimizer():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-4)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0)   # leaves initial_lr = 1e-4 behind
    sched = make_noam_scheduler(opt, 512, 4000)
    for _ in range(3999):
        opt.step()
        sched.step()
    assert math.isclose(opt.param_groups[0]["lr"], 6.987712e-04, rel_tol=1e-6)


def test_lambdalr_multiplies_base_lr_trap():
    # what the lesson demonstrates: with base lr 1e-4 every value is 1e4 times smaller
    opt = torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: noam_lambda(e + 1, 512, 4000))
    seen = _lrs_before_steps(opt, sched, 4000)
    assert math.isclose(seen[-1][0], 6.987712e-08, rel_tol=1e-6)


def test_schedule_clear_errors():
    with pytest.raises(ValueError):
        noam_lambda(-1, 512, 4000)
    with pytest.raises(ValueError):
        noam_lambda(1, 0, 4000)
    with pytest.raises(TypeError, match="Optimizer"):
        make_noam_scheduler([nn.Parameter(torch.zeros(1))], 512, 4000)
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="factor"):
        make_noam_scheduler(opt, 512, 4000, factor=0.0)
    with pytest.raises(ValueError, match="warmup"):
        make_noam_scheduler(opt, 512, 0)


# ----------------------------------------------------------------------------- ResidualStack


def test_residual_stack_structure():
    m = ResidualStack(16, 4)
    assert isinstance(m.layers, nn.ModuleList) and isinstance(m.dropout, nn.Dropout)
    assert sum(p.numel() for p in m.parameters()) == 4 * (16 * 16 + 16) == 1088
    keys = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert keys == {f"layers.{i}.{n}": ((16, 16) if n == "weight" else (16,)) for i in range(4) for n in ("weight", "bias")}


def test_residual_stack_forward_formula_and_modes():
    torch.manual_seed(0)
    m = ResidualStack(8, 3, dropout=0.5).eval()
    x = randn(2, 5, 8)
    expected = x
    for layer in m.layers:
        expected = expected + layer(expected)
    assert torch.allclose(m(x), expected, atol=1e-6)
    assert torch.equal(m(x), m(x))
    one = ResidualStack(8, 1, dropout=0.5).train()
    with torch.no_grad():
        one.layers[0].weight.zero_()
        one.layers[0].bias.fill_(1.0)
    xb = randn(64, 8)
    delta = one(xb) - xb
    assert bool(((delta.abs() < 1e-6) | ((delta - 2).abs() < 1e-6)).all())
    assert 0.3 < (delta.abs() < 1e-6).float().mean().item() < 0.7


def test_plain_list_registers_nothing():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(4, 4)]

    assert len(list(Plain().parameters())) == 0 and len(Plain().state_dict()) == 0


def test_residual_stack_clear_errors():
    with pytest.raises(ValueError):
        ResidualStack(0, 2)
    with pytest.raises(ValueError):
        ResidualStack(8, 2, dropout=1.0)
    with pytest.raises(ValueError, match="last dimension"):
        ResidualStack(8, 2)(randn(2, 7))


def test_classifier_parameter_count():
    # the lesson's second "number to verify": 20→128→64→32→5 with BatchNorm after each hidden layer
    model = nn.Sequential(nn.Linear(20, 128), nn.BatchNorm1d(128), nn.Linear(128, 64), nn.BatchNorm1d(64),
                          nn.Linear(64, 32), nn.BatchNorm1d(32), nn.Linear(32, 5))
    assert sum(p.numel() for p in model.parameters()) == 13_637


# ----------------------------------------------------------------------------- widgets: compute functions


def test_trace_head_shapes_w00_1():
    rows = E.trace_head_shapes(2, 6, 16, 4)
    shapes = [r["shape"] for r in rows]
    assert shapes == [(2, 6, 16), (2, 6, 16), (2, 6, 4, 4), (2, 4, 6, 4), (2, 4, 6, 6), (2, 4, 6, 4), (2, 6, 4, 4),
                      (2, 6, 16)]
    contiguous = {r["step"]: r["contiguous"] for r in rows}
    assert not contiguous["transpose"] and not contiguous["transpose back"] and contiguous["merge"]
    with pytest.raises(ValueError, match="not divisible"):
        E.trace_head_shapes(2, 6, 18, 4)


def test_noam_curve_w00_2_matches_real_scheduler():
    c = E.noam_curve(64, 10, base_lr=1.0, n_steps=40)
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 64 ** -0.5 * min((e + 1) ** -0.5, (e + 1) * 10 ** -1.5))
    real = [lrs[0] for lrs in _lrs_before_steps(opt, sched, 40)]
    assert list(c["steps"]) == list(range(1, 41))
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(c["lr"], real))
    full = E.noam_curve(512, 4000)
    assert full["peak_step"] == 4000 and math.isclose(full["peak_lr"], 6.987712e-04, rel_tol=1e-6)
    trap = E.noam_curve(512, 4000, base_lr=1e-4)
    assert math.isclose(trap["peak_lr"], 6.987712e-08, rel_tol=1e-6)
    assert len(full["steps"]) == 16000
    with pytest.raises(ValueError):
        E.noam_curve(512, 4000, base_lr=0.0)


def test_label_smoothing_view_w00_3():
    v = E.label_smoothing_view(0.1, 0)
    assert abs(v["loss"] - 0.5137) < 1e-4 and abs(v["nll"] - 0.4170) < 1e-4          # F00.4
    assert torch.allclose(torch.tensor(v["q"]), torch.tensor([0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3], dtype=torch.float64))
    z = torch.tensor([[2.0, 1.0, 0.1]], dtype=torch.float64)
    for eps, target in [(0.0, 0), (0.3, 2), (0.5, 1)]:
        v = E.label_smoothing_view(eps, target)
        assert math.isclose(sum(v["q"]), 1.0, rel_tol=1e-12)
        ref = F.cross_entropy(z, torch.tensor([target]), label_smoothing=eps).item()
        assert math.isclose(v["loss"], ref, rel_tol=1e-9)
    with pytest.raises(ValueError):
        E.label_smoothing_view(0.1, 3)
    with pytest.raises(ValueError):
        E.label_smoothing_view(-0.1, 0)


def test_dropout_runs_w00_4():
    state = torch.get_rng_state()
    rows = E.dropout_runs(("train", "train", "eval"), p=0.5, seed=0)
    assert torch.equal(torch.get_rng_state(), state), "a seeded run leaves the caller's RNG untouched"
    assert rows.shape == (3, 10)
    assert set(rows[:2].unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(rows[2], torch.ones(10))
    many = E.dropout_runs(("train",) * 200, p=0.25, width=10, seed=1)
    kept = many[many != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.75)), "survivors are scaled by 1/(1−p)"
    assert abs((many == 0).float().mean().item() - 0.25) < 0.03      # 2000 draws: se ≈ 0.01
    with pytest.raises(ValueError):
        E.dropout_runs(("test",))
    with pytest.raises(ValueError):
        E.dropout_runs(p=1.0)


# ----------------------------------------------------------------------------- widgets: rendering


@pytest.mark.parametrize("show,widget_id", [(E.show_shape_tracer, "W00.1"), (E.show_noam_curve, "W00.2"),
                                            (E.show_label_smoothing, "W00.3"), (E.show_dropout_clicker, "W00.4")])
def test_widgets_static_and_live(show, widget_id):
    static = show(static=True)
    assert isinstance(static, StaticFigure) and static.widget_id == widget_id
    assert static._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f'data-widget="{widget_id}"' in static._repr_html_()
    live = show(static=False)
    assert "llmcourse-widget" in live._dom_classes
    assert "llmcourse-" + widget_id.lower().replace(".", "-") in live._dom_classes


def test_shape_tracer_draws_divisor_message():
    fig = E.draw_shape_trace(2, 6, 18, 4)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("not divisible" in t for t in texts)
