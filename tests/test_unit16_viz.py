"""Unit 16 widgets: the number line lists exactly the formats' finite values, the scaling lab reproduces the
outlier errors, the accumulation curves reproduce the promoted/unpromoted gap, the model report draws the rows;
every widget has a static fallback and a live version."""

from __future__ import annotations

import math

import torch

from llmcourse.quant import fp8 as Q
from llmcourse.viz import fp8 as V

PNG = b"\x89PNG"


def test_number_line_values_and_gaps():
    for name, dt, count in (("E4M3", torch.float8_e4m3fn, 126), ("E5M2", torch.float8_e5m2, 123)):
        rows = V.number_line(name)
        vals = torch.arange(256, dtype=torch.uint8).view(dt).float()
        want = sorted(v for v in vals.tolist() if math.isfinite(v) and v > 0)
        assert [r["value"] for r in rows] == want and len(rows) == count
        assert all(r["gap"] == b["value"] - r["value"] for r, b in zip(rows, rows[1:]))
    assert V.number_line("E4M3")[-1]["value"] == 448.0
    assert V.show_number_line(static=True)._repr_png_()[:4] == PNG
    assert type(V.show_number_line(static=False)).__name__ == "VBox"


def test_scaling_lab_matches_outlier_errors():
    torch.manual_seed(0)
    x = torch.randn(256, 512)
    for f in (1.0, 1e5):
        want = Q.outlier_errors(x, f)
        assert abs(V.scaling_lab(x, f, "tensor")["error"] - want["per_tensor"]) < 1e-9
        r = V.scaling_lab(x, f, "tile")
        assert abs(r["error"] - want["per_tile"]) < 1e-9
        assert r["tile_error"].shape == (256, 4)
    assert V.scaling_lab(x, 1e5, "tensor")["tile_error"].mean() > 5 * V.scaling_lab(x, 1e5, "tile")["tile_error"].mean()
    small = x[:32]
    assert V.show_scaling_lab(small, static=True)._repr_png_()[:4] == PNG
    assert type(V.show_scaling_lab(small, static=False)).__name__ == "VBox"


def test_accumulation_curves_promotion_helps():
    c = V.accumulation_curves(11, 128, 2048, rows=8, points=8)
    assert c["k"][-1] == 2048 and len(c["k"]) == len(c["sequential"]) == len(c["promoted"])
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(8, 2048, generator=g), torch.rand(8, 2048, generator=g)
    exact = (a.double() * b.double()).sum(1)
    for key, interval in (("sequential", None), ("promoted", 128)):
        worst = ((Q.accumulate_limited(a, b, 11, interval) - exact).abs() / exact).max().item()
        assert abs(c[key][-1] - worst) <= 1e-12 + 1e-9 * worst
    assert c["sequential"][-1] > 10 * c["promoted"][-1]
    full = V.accumulation_curves(24, 4096, 256, rows=4, points=4)
    assert max(full["sequential"]) < 1e-6          # float32-sized accumulator on a short sum
    assert V.show_accumulation_lab(rows=4, static=True)._repr_png_()[:4] == PNG
    assert type(V.show_accumulation_lab(rows=4, static=False)).__name__ == "VBox"


def test_model_report_draws_layer_errors():
    from llmcourse.models.llama3 import Llama3Config, Llama3Model

    torch.manual_seed(0)
    model = Llama3Model(Llama3Config.preset("llama3-tiny")).eval()
    import copy

    conv = Q.convert_linears_to_fp8(copy.deepcopy(model))
    rows = Q.linear_layer_errors(model, conv, torch.randint(0, 65, (1, 32)))
    assert len(rows) == 4 * 7 and all(0 < r["rel_error"] < 0.1 for r in rows)
    losses = {"val_loss": 4.2, "val_loss_fp8": 4.21, "delta": 0.01}
    assert V.show_model_report(rows, losses, static=True)._repr_png_()[:4] == PNG
    assert type(V.show_model_report(rows, losses, static=False)).__name__ == "VBox"
