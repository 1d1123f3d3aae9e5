"""Widgets of unit 16 (FP8 quantisation): the number line, the scaling lab, the accumulation lab, the model report.

* W16.1 :func:`show_number_line` — every finite positive E4M3 and E5M2 value on a log axis; zoom to a decade range
  and pick a value to read its bits, value and the gap to the next value. Data: :func:`number_line`.
* W16.2 :func:`show_scaling_lab` — an outlier factor (1–1e5, log) on one channel of real-looking activations and
  a scaling mode (per tensor / per 1×128 tile): histograms of the original and dequantised values and a
  per-(row, tile) error heatmap. Data: :func:`scaling_lab`.
* W16.3 :func:`show_accumulation_lab` — accumulator mantissa bits (8–24), promotion interval (32–4,096) and K
  (256–16,384): worst relative error of the running sum against float64, with and without promotion.
  Data: :func:`accumulation_curves`.
* W16.4 :func:`show_model_report` — per-layer relative output error of a converted model and its validation loss
  before and after. Data: :func:`llmcourse.quant.fp8.linear_layer_errors` and
  :func:`llmcourse.quant.fp8.fp8_loss_delta`.
"""

from __future__ import annotations

import math

import torch

from ..quant.fp8 import (
    dequantize_act_tiles,
    dequantize_per_tensor,
    fp8_table,
    quantize_act_tiles,
    quantize_per_tensor,
    round_mantissa,
)
from .base import figure, live_or_static, redrawing_output

__all__ = ["accumulation_curves", "draw_accumulation", "draw_model_report", "draw_number_line", "draw_scaling_lab",
           "number_line", "scaling_lab", "show_accumulation_lab", "show_model_report", "show_number_line",
           "show_scaling_lab"]

FORMATS = {"E4M3": torch.float8_e4m3fn, "E5M2": torch.float8_e5m2}
_COLORS = {"E4M3": "#1565c0", "E5M2": "#ef6c00", "sequential": "#c62828", "promoted": "#2e7d32"}


# ------------------------------------------------------------------------------------------------ W16.1


def number_line(name: str) -> list[dict]:
    """Finite positive values of format ``name`` ("E4M3" or "E5M2") in increasing order:
    ``{"value", "bits", "kind", "gap"}`` with ``gap`` the distance to the next value (``nan`` for the largest)."""
    rows = [r for r in fp8_table(FORMATS[name]) if r["kind"] in ("normal", "subnormal") and r["code"] < 128]
    rows.sort(key=lambda r: r["value"])
    for a, b in zip(rows, rows[1:] + [None]):
        a["gap"] = b["value"] - a["value"] if b is not None else float("nan")
    return rows


def draw_number_line(lo: float = -17.0, hi: float = 16.0, pick: float | None = None):
    """Both formats on one log2 axis between ``2**lo`` and ``2**hi``; ``pick`` marks the value nearest to it."""
    fig, ax = figure(1, 1, figsize=(10, 2.8))
    lines = []
    for y, name in enumerate(FORMATS):
        rows = [r for r in number_line(name) if 2.0 ** lo <= r["value"] <= 2.0 ** hi]
        xs = [math.log2(r["value"]) for r in rows]
        sub = [r["kind"] == "subnormal" for r in rows]
        ax.scatter([x for x, s in zip(xs, sub) if not s], [y] * (len(xs) - sum(sub)), marker="|", s=180,
                   color=_COLORS[name], label=f"{name} normal")
        ax.scatter([x for x, s in zip(xs, sub) if s], [y] * sum(sub), marker="|", s=180, color="#9e9e9e",
                   label=f"{name} subnormal" if y == 0 else None)
        if pick is not None and rows:
            best = min(rows, key=lambda r: abs(math.log2(r["value"]) - math.log2(pick)))
            ax.scatter([math.log2(best["value"])], [y], s=60, facecolors="none", edgecolors="k")
            lines.append(f"{name}: {best['bits']} = {best['value']:.6g} (next value +{best['gap']:.3g})")
    ax.set_yticks([0, 1], list(FORMATS))
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlabel("log2(value)  (positive half; the negative half mirrors it)")
    ax.set_xlim(lo, hi)
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    if lines:
        ax.set_title("   ".join(lines), fontsize=8)
    else:
        ax.set_title("Every finite positive FP8 value: equal steps inside each binade, a new step size per binade",
                     fontsize=9)
    return fig


def show_number_line(static: bool | None = None):
    """W16.1: both formats on a log axis; live: zoom (log2 range) and a value picker that reads out the bits."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda lo, hi, pick: draw_number_line(lo, hi, 2.0 ** pick))
        rng = widgets.FloatRangeSlider(value=[-17.0, 16.0], min=-17.0, max=16.0, step=0.5, description="log2 range")
        pick = widgets.FloatSlider(value=0.0, min=-16.0, max=15.8, step=0.05, description="log2 value")

        def redraw(_=None):
            update(lo=rng.value[0], hi=rng.value[1], pick=pick.value)

        rng.observe(redraw, names="value")
        pick.observe(redraw, names="value")
        redraw()
        return widgets.VBox([widgets.HBox([rng, pick]), out])

    return live_or_static("W16.1", build_live, lambda: draw_number_line(), static,
                          caption="All finite positive E4M3 and E5M2 values (log2 axis).")


# ------------------------------------------------------------------------------------------------ W16.2


def scaling_lab(x: torch.Tensor, factor: float, mode: str, column: int = 7, tile: int = 128) -> dict:
    """Quantise ``x (M, K)`` with column ``column`` multiplied by ``factor``, per ``mode`` ("tensor" or "tile").

    Returns ``{"x", "xhat"}`` (the scaled input and its dequantised copy, float32), ``"tile_error" (M, K/tile)``
    (relative error of each row's tile, the outlier column left out) and ``"error"`` (relative error of every
    other column).
    """
    x = x.float().clone()
    x[:, column] *= factor
    if mode == "tensor":
        q, s = quantize_per_tensor(x)
        xhat = dequantize_per_tensor(q, s)
    elif mode == "tile":
        q, s = quantize_act_tiles(x, tile)
        xhat = dequantize_act_tiles(q, s, tile)
    else:
        raise ValueError(f"mode must be 'tensor' or 'tile', got {mode!r}")
    keep = torch.ones(x.shape[1], dtype=torch.bool)
    keep[column] = False
    diff = ((xhat - x) * keep).double()
    M, K = x.shape
    nt = -(-K // tile)
    num = torch.nn.functional.pad(diff ** 2, (0, nt * tile - K)).view(M, nt, tile).sum(-1)
    den = torch.nn.functional.pad((x * keep).double() ** 2, (0, nt * tile - K)).view(M, nt, tile).sum(-1)
    err = float(diff.norm() / (x * keep).double().norm())
    return {"x": x, "xhat": xhat, "tile_error": (num / den.clamp(min=1e-300)).sqrt().float(), "error": err}


def draw_scaling_lab(x: torch.Tensor, factor: float, mode: str):
    """Histograms of log10|value| before and after the round trip, and the per-(row, tile) error heatmap."""
    r = scaling_lab(x, factor, mode)
    fig, (ax1, ax2) = figure(1, 2, figsize=(10, 3.4), width_ratios=[1.2, 1])
    bins = torch.linspace(-6, 6, 80)
    for data, label, color in ((r["x"], "original", "#90a4ae"), (r["xhat"], "dequantised", "#1565c0")):
        v = data.abs().flatten()
        logs = torch.where(v > 0, v.clamp(min=1e-30).log10(), torch.full_like(v, -6.0))
        ax1.hist(logs.clamp(-6, 6).numpy(), bins=bins.numpy(), alpha=0.55, label=label, color=color)
    ax1.set_xlabel("log10 |value|  (exact zeros at −6)")
    ax1.set_ylabel("count")
    ax1.legend(fontsize=8)
    ax1.set_title(f"outlier ×{factor:g}, per-{mode} scaling: other columns' error {r['error']:.4f}", fontsize=9)
    im = ax2.imshow(r["tile_error"].numpy(), aspect="auto", cmap="magma", vmin=0, vmax=max(0.05, float(
        r["tile_error"].max())))
    ax2.set_xlabel("K tile")
    ax2.set_ylabel("row (token)")
    ax2.set_title("relative error per (row, tile)", fontsize=9)
    fig.colorbar(im, ax=ax2)
    return fig


def show_scaling_lab(x: torch.Tensor, static: bool | None = None):
    """W16.2: outlier factor (log slider) and scaling mode. Static: errors for f ∈ {1, 1e4, 1e5}, both modes."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda factor, mode: draw_scaling_lab(x, factor, mode))
        factor = widgets.FloatLogSlider(value=1e4, base=10, min=0, max=5, step=0.25, description="outlier factor")
        mode = widgets.ToggleButtons(options=[("per tensor", "tensor"), ("per 1×128 tile", "tile")], value="tensor",
                                     description="scaling")

        def redraw(_=None):
            update(factor=factor.value, mode=mode.value)

        factor.observe(redraw, names="value")
        mode.observe(redraw, names="value")
        redraw()
        return widgets.VBox([widgets.HBox([factor, mode]), out])

    def build_static():
        fig, axes = figure(2, 3, figsize=(11, 5), squeeze=False)
        for j, f in enumerate((1.0, 1e4, 1e5)):
            for i, mode in enumerate(("tensor", "tile")):
                r = scaling_lab(x, f, mode)
                axes[i, j].imshow(r["tile_error"].numpy(), aspect="auto", cmap="magma", vmin=0, vmax=0.1)
                axes[i, j].set_title(f"×{f:g}, per {mode}: error {r['error']:.4f}", fontsize=9)
                axes[i, j].set_xlabel("K tile")
                axes[i, j].set_ylabel("row")
        return fig

    return live_or_static("W16.2", build_live, build_static, static,
                          caption="Relative error per (row, tile), outlier column left out; colour scale 0–0.1.")


# ------------------------------------------------------------------------------------------------ W16.3


def accumulation_curves(bits: int, interval: int, K: int, rows: int = 16, seed: int = 1, points: int = 32,
                        rounding: str = "nearest") -> dict:
    """Worst relative error (over ``rows`` rows) of ``Σ_k a_k b_k`` (``a, b ~ U[0, 1)``, seeded) against float64,
    after ``k`` terms, for an accumulator of ``bits`` significant bits that rounds ``rounding`` (``"nearest"`` or
    ``"truncate"``, see :func:`~llmcourse.quant.fp8.round_mantissa`) after every addition: ``"sequential"``
    (never promoted) and ``"promoted"`` (the partial sum moved into a float32 total every ``interval`` terms).
    Returns ``{"k": [..], "sequential": [..], "promoted": [..]}`` at ``points`` log-spaced ``k``."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.rand(rows, K, generator=g), torch.rand(rows, K, generator=g)
    prod = a.double() * b.double()
    exact = prod.cumsum(1)
    marks = sorted({max(1, int(round(v))) for v in torch.logspace(0, math.log10(K), points).tolist()} | {K})
    seq = torch.zeros(rows, dtype=torch.float64)
    part = torch.zeros(rows, dtype=torch.float64)
    total = torch.zeros(rows, dtype=torch.float32)
    out = {"k": [], "sequential": [], "promoted": []}
    mset = set(marks)
    for k in range(K):
        seq = round_mantissa(seq + prod[:, k], bits, rounding)
        part = round_mantissa(part + prod[:, k], bits, rounding)
        if (k + 1) % interval == 0:
            total, part = total + part.float(), torch.zeros_like(part)
        if k + 1 in mset:
            ex = exact[:, k]
            out["k"].append(k + 1)
            out["sequential"].append(float(((seq - ex).abs() / ex).max()))
            out["promoted"].append(float((((total.double() + part) - ex).abs() / ex).max()))
    return out


def draw_accumulation(curves: list[tuple[str, dict]]):
    """Worst relative error against K for each ``(label, accumulation_curves(...))``."""
    fig, ax = figure(1, 1, figsize=(8, 3.8))
    styles = ["-", "--", ":", "-."]
    for i, (label, c) in enumerate(curves):
        ls = styles[i % len(styles)]
        ax.plot(c["k"], [max(v, 1e-12) for v in c["sequential"]], ls, color=_COLORS["sequential"],
                label=f"{label}: never promoted")
        ax.plot(c["k"], [max(v, 1e-12) for v in c["promoted"]], ls, color=_COLORS["promoted"],
                label=f"{label}: promoted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("K (products summed)")
    ax.set_ylabel("worst relative error")
    ax.legend(fontsize=8)
    return fig


def show_accumulation_lab(rows: int = 16, static: bool | None = None, curves: dict | None = None):
    """W16.3: accumulator bits, rounding mode (nearest / truncate), promotion interval, K. Static: 11 and 14 bits
    rounding to nearest, promotion every 128, K = 4,096 (or the precomputed ``curves``: ``{label:
    accumulation_curves(...)}``; an int label ``m`` reads "m bits")."""

    def build_live():
        import ipywidgets as widgets

        def draw(bits, interval, K, rounding):
            return draw_accumulation([(f"{bits} bits ({rounding}), every {interval}",
                                       accumulation_curves(bits, interval, K, rows, rounding=rounding))])

        out, update = redrawing_output(draw)
        bits = widgets.IntSlider(value=14, min=8, max=24, description="accumulator bits")
        interval = widgets.Dropdown(options=[32, 64, 128, 256, 512, 1024, 2048, 4096], value=128,
                                    description="promote every")
        K = widgets.Dropdown(options=[256, 1024, 4096, 16384], value=4096, description="K")
        rounding = widgets.Dropdown(options=["nearest", "truncate"], value="nearest", description="rounding")

        def redraw(_=None):
            update(bits=bits.value, interval=interval.value, K=K.value, rounding=rounding.value)

        for w in (bits, interval, K, rounding):
            w.observe(redraw, names="value")
        redraw()
        return widgets.VBox([widgets.HBox([bits, rounding, interval, K]), out])

    def build_static():
        if curves is not None:
            return draw_accumulation([(f"{m} bits" if isinstance(m, int) else str(m), c) for m, c in curves.items()])
        return draw_accumulation([(f"{m} bits", accumulation_curves(m, 128, 4096, rows)) for m in (11, 14)])

    return live_or_static("W16.3", build_live, build_static, static,
                          caption="Worst relative error of a limited-precision running sum, with and without "
                                  "promotion every 128 terms.")


# ------------------------------------------------------------------------------------------------ W16.4


def draw_model_report(rows: list[dict], losses: dict, sort: str = "order"):
    """Bars of per-layer relative output error (``rows`` from ``linear_layer_errors``) and the losses in the title."""
    rows = sorted(rows, key=lambda r: -r["rel_error"]) if sort == "error" else list(rows)
    fig, ax = figure(1, 1, figsize=(10, 3.8))
    names = [r["name"].replace("layers.", "L").replace("self_attn.", "").replace("mlp.", "") for r in rows]
    colors = ["#1565c0" if "proj" in r["name"] and r["name"].split(".")[-1] in ("q_proj", "k_proj", "v_proj",
                                                                               "o_proj") else "#ef6c00" for r in rows]
    ax.bar(range(len(rows)), [r["rel_error"] for r in rows], color=colors)
    ax.set_xticks(range(len(rows)), names, rotation=90, fontsize=7)
    ax.set_ylabel("relative output error")
    ax.set_title(f"validation loss {losses['val_loss']:.4f} → {losses['val_loss_fp8']:.4f} after conversion "
                 f"(Δ {losses['delta']:+.4f} nats); blue: attention, orange: MLP", fontsize=9)
    return fig


def show_model_report(rows: list[dict], losses: dict, static: bool | None = None):
    """W16.4: per-layer errors and the loss before/after; live: order by layer or by error. Static: the table."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda sort: draw_model_report(rows, losses, sort))
        sort = widgets.ToggleButtons(options=[("layer order", "order"), ("largest error first", "error")],
                                     value="order", description="sort")
        sort.observe(lambda ch: update(sort=ch["new"]), names="value")
        update(sort="order")
        return widgets.VBox([sort, out])

    return live_or_static("W16.4", build_live, lambda: draw_model_report(rows, losses), static,
                          caption="Per-layer relative output error of the converted model.")
