"""Unit 14 widgets: the DeepSeek routing explorer, the expert-load heatmap over training, and the
combinatorics of fine-grained experts.

Each widget has a pure compute function (unit-tested in ``tests/test_unit14_viz.py``), a draw function that
paints a matplotlib ``Figure`` and ``show_*(static=None)`` (see :mod:`llmcourse.viz.base`). Routing uses the
library's :func:`~llmcourse.models.deepseek_moe.deepseek_route`; the loads are the ones recorded by
``python -m llmcourse.train.moe_char`` (``assets/moe_load_runs.pt``) or by a live run of the lesson.
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..models.deepseek_moe import deepseek_route, moe_param_counts
from .base import figure, live_or_static, redrawing_output

__all__ = ["routing_table", "load_ratio_curves", "expert_combinatorics", "draw_routing", "draw_load_runs",
           "draw_combinatorics", "show_routing_explorer", "show_expert_loads", "show_combinatorics",
           "shared_equivalence", "draw_shared_equivalence", "show_shared_equivalence"]

RUN_LABELS = {"none": "no balancing", "aux": "auxiliary loss α=0.01", "g1e-4": "bias update γ=1e-4",
              "g1e-3": "bias update γ=1e-3", "g1e-2": "bias update γ=1e-2", "live-none": "live run: no update",
              "live-bias": "live run: bias update"}

# ============================================================================ W14.1 routing explorer


def routing_table(router_logits: torch.Tensor, bias: torch.Tensor, top_k: int = 2, n_group: int = 1,
                  topk_group: int = 1) -> dict:
    """What DeepSeek routing does with ``router_logits`` ``(T, E)`` and ``bias`` ``(E,)``.

    Returns ``{"scores": sigmoid (T, E), "chosen": bool (T, E), "excluded": bool (T, E) (experts of groups
    that were not kept), "weights": (T, E) gate weight of each chosen expert (0 elsewhere), "loads": (E,)
    tokens per expert}``. The weights come from the unbiased scores, so moving the bias changes only which
    experts are chosen.
    """
    t, e = router_logits.shape
    scores = torch.sigmoid(router_logits.float())
    w, idx = deepseek_route(router_logits, bias, top_k, n_group, topk_group)
    chosen = torch.zeros(t, e, dtype=torch.bool).scatter_(1, idx, True)
    weights = torch.zeros(t, e).scatter_(1, idx, w)
    sb = (scores + bias.float()).view(t, n_group, e // n_group)
    gs = sb.topk(2, -1).values.sum(-1)
    keep = torch.zeros(t, n_group, dtype=torch.bool).scatter_(1, gs.topk(topk_group, -1).indices, True)
    excluded = ~keep.repeat_interleave(e // n_group, dim=1)
    return {"scores": scores, "chosen": chosen, "excluded": excluded, "weights": weights,
            "loads": chosen.sum(0)}


def draw_routing(router_logits: torch.Tensor, tokens: list[str], bias: torch.Tensor, top_k: int = 2,
                 n_group: int = 1, topk_group: int = 1, title: str = "") -> Figure:
    tab = routing_table(router_logits, bias, top_k, n_group, topk_group)
    t, e = router_logits.shape
    fig, (ax, ax2) = figure(1, 2, figsize=(10, max(3.5, 0.22 * t + 1.5)), gridspec_kw={"width_ratios": [3, 1]})
    ax.imshow(tab["scores"].numpy(), aspect="auto", cmap="Blues", vmin=0, vmax=1)
    for (i, j) in tab["chosen"].nonzero().tolist():
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#d62728", lw=1.6))
    for (i, j) in tab["excluded"].nonzero().tolist():
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#999", lw=0))
    ax.set_yticks(range(t))
    ax.set_yticklabels([repr(c)[1:-1] or "·" for c in tokens], fontsize=7, family="monospace")
    ax.set_xticks(range(e))
    ax.set_xticklabels([f"{j}\nb={float(bias[j]):+.2f}" for j in range(e)], fontsize=7)
    ax.set_xlabel("expert (and its bias)")
    ax.set_title(title or f"sigmoid affinities; red = chosen (top-{top_k}), hatched = group masked")
    ax2.barh(range(e), tab["loads"].numpy(), color="#6baed6")
    ax2.set_yticks(range(e))
    ax2.invert_yaxis()
    ax2.set_xlabel("tokens routed")
    ax2.set_ylabel("expert")
    ax2.set_title(f"loads (max/mean {float(tab['loads'].max()) / max(float(tab['loads'].float().mean()), 1e-9):.2f})")
    return fig


def show_routing_explorer(router_logits: torch.Tensor, tokens: list[str], bias: torch.Tensor | None = None,
                          top_k: int = 2, static: bool | None = None):
    """W14.1: tokens × experts affinities of one MoE layer for a sentence, chosen experts outlined, masked groups
    hatched; a bias slider per expert (pick the expert, move its bias) and the group settings.

    Static fallback: the sentence with the given bias, one group.
    """
    e = router_logits.shape[1]
    base = torch.zeros(e) if bias is None else bias.float().clone()

    def build_live():
        import ipywidgets as widgets

        current = base.clone()
        expert = widgets.Dropdown(options=list(range(e)), value=0, description="expert")
        value = widgets.FloatSlider(value=float(current[0]), min=-1.0, max=1.0, step=0.02, description="its bias")
        groups = widgets.Dropdown(options=[g for g in (1, 2, 4) if e % g == 0 and e // g >= 2], value=1,
                                  description="n_group")
        keep = widgets.IntSlider(value=1, min=1, max=1, description="topk_group")
        out, update = redrawing_output(draw_routing)

        def refresh(_change=None):
            keep.max = groups.value
            k = min(top_k, keep.value * (e // groups.value))
            update(router_logits=router_logits, tokens=tokens, bias=current.clone(), top_k=k, n_group=groups.value,
                   topk_group=keep.value)

        def on_expert(_change=None):
            value.value = float(current[expert.value])

        def on_value(_change=None):
            current[expert.value] = value.value
            refresh()

        expert.observe(on_expert, names="value")
        value.observe(on_value, names="value")
        for c in (groups, keep):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([expert, value]), widgets.HBox([groups, keep]), out])

    return live_or_static("W14.1", build_live, lambda: draw_routing(router_logits, tokens, base, top_k), static,
                          caption="one sentence through one MoE layer of the trained model (one group).")


# ============================================================================ W14.2 expert loads over training


def load_ratio_curves(loads: torch.Tensor, smooth: int = 10) -> dict:
    """``loads`` ``(steps, layers, E)`` -> ``{"ratio": (steps,) max/mean load averaged over layers,
    "smoothed": running mean over ``smooth`` steps, "share": (layers, E, steps) fraction of assignments}``."""
    x = loads.float()
    ratio = (x.max(-1).values / x.mean(-1).clamp_min(1e-9)).mean(-1)
    k = max(1, min(smooth, len(ratio)))
    c = torch.cumsum(torch.cat([torch.zeros(1), ratio]), 0)
    smoothed = torch.stack([(c[i + 1] - c[max(0, i + 1 - k)]) / (i + 1 - max(0, i + 1 - k)) for i in range(len(ratio))])
    share = (x / x.sum(-1, keepdim=True).clamp_min(1e-9)).permute(1, 2, 0)
    return {"ratio": ratio, "smoothed": smoothed, "share": share}


def draw_load_runs(runs: dict[str, torch.Tensor], run: str | None = None, layer: int = 0,
                   ceiling: float | None = None) -> Figure:
    """Left: max/mean load ratio over steps for every run (with the ``ceiling`` E/k of top-k routing when given);
    right: the expert-load heatmap of ``run``."""
    run = run or next(iter(runs))
    fig, (ax, ax2) = figure(1, 2, figsize=(11, 4))
    for name, loads in runs.items():
        cur = load_ratio_curves(loads)
        ax.plot(range(1, len(cur["smoothed"]) + 1), cur["smoothed"].numpy(), lw=2 if name == run else 1,
                label=RUN_LABELS.get(name, name))
    ax.axhline(1.0, color="#999", ls=":", lw=1)
    if ceiling is not None:
        ax.axhline(ceiling, color="#c00", ls="--", lw=1, label=f"ceiling E/k = {ceiling:g}")
    ax.set_xlabel("training step")
    ax.set_ylabel("max / mean expert load (mean over layers)")
    ax.set_title("load imbalance (1 = balanced)")
    ax.legend(fontsize=7)
    share = load_ratio_curves(runs[run])["share"][layer]
    im = ax2.imshow(share.numpy(), aspect="auto", cmap="magma", interpolation="nearest",
                    vmin=0, vmax=max(0.3, float(share.max())))
    ax2.set_xlabel("training step")
    ax2.set_ylabel("expert")
    ax2.set_title(f"{RUN_LABELS.get(run, run)}: layer {layer} load share")
    fig.colorbar(im, ax=ax2, fraction=0.04, label="share of assignments")
    return fig


def show_expert_loads(runs: dict[str, torch.Tensor], static: bool | None = None, ceiling: float | None = None):
    """W14.2: replays recorded per-step expert loads ``{run: (steps, layers, E)}``: the max/mean load ratio of
    every run (against the ``ceiling`` E/k of top-k routing when given) and the expert × step heatmap of the chosen
    run and layer.

    Static fallback: the first run's heatmap, layer 0, with every ratio curve.
    """
    names = list(runs)
    n_layers = next(iter(runs.values())).shape[1]

    def build_live():
        import ipywidgets as widgets

        run = widgets.Dropdown(options=[(RUN_LABELS.get(n, n), n) for n in names], value=names[0], description="run")
        layer = widgets.Dropdown(options=list(range(n_layers)), value=0, description="layer")
        out, update = redrawing_output(draw_load_runs)

        def refresh(_change=None):
            update(runs=runs, run=run.value, layer=layer.value, ceiling=ceiling)

        for c in (run, layer):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([run, layer]), out])

    return live_or_static("W14.2", build_live, lambda: draw_load_runs(runs, names[0], 0, ceiling), static,
                          caption="the recorded runs; heatmap of the first run, layer 0.")


# ============================================================================ W14.3 combinatorics and cost


def expert_combinatorics(n_experts: int = 16, top_k: int = 2, split: int = 1, d_model: int = 128,
                         intermediate: int = 512, n_shared: int = 0) -> dict:
    """Splitting each of ``n_experts`` experts ``split`` ways (width ``intermediate/split``, ``split·top_k`` active)
    keeps total and active parameters and multiplies the choices: ``C(split·E, split·k)`` combinations."""
    e, k, i = n_experts * split, top_k * split, intermediate // split
    counts = moe_param_counts(d_model, i, e, n_shared, k)
    return {"experts": e, "active": k, "width": i, "combinations": math.comb(e, k),
            "total_params": counts["total"], "active_params": counts["active"]}


def draw_combinatorics(n_experts: int = 16, top_k: int = 2, max_split: int = 8, d_model: int = 128,
                       intermediate: int = 512) -> Figure:
    splits = [m for m in range(1, max_split + 1) if intermediate % m == 0]
    rows = [expert_combinatorics(n_experts, top_k, m, d_model, intermediate) for m in splits]
    fig, (ax, ax2) = figure(1, 2, figsize=(10, 3.6))
    ax.semilogy(splits, [r["combinations"] for r in rows], "o-")
    ax.set_xlabel("split factor m")
    ax.set_ylabel("expert combinations per token")
    ax.set_title(f"{n_experts} experts, top-{top_k}, split m ways")
    for m, r in zip(splits, rows):
        ax.annotate(f"C({r['experts']},{r['active']})", (m, r["combinations"]), fontsize=7)
    ax2.plot(splits, [r["total_params"] / 1e6 for r in rows], "o-", label="total")
    ax2.plot(splits, [r["active_params"] / 1e6 for r in rows], "s-", label="active per token")
    ax2.set_xlabel("split factor m")
    ax2.set_ylabel("parameters (millions)")
    ax2.set_title("compute stays (router grows with the expert count)")
    ax2.legend(fontsize=8)
    return fig


def show_combinatorics(static: bool | None = None):
    """W14.3: sliders for E, k and the split factor m: the number of expert combinations and the total vs
    active parameters. Static fallback: 16 experts top-2 split 1…8 ways (16/2 vs 64/8 included)."""

    def build_live():
        import ipywidgets as widgets

        e = widgets.IntSlider(value=16, min=2, max=64, description="experts E")
        k = widgets.IntSlider(value=2, min=1, max=8, description="top-k")
        m = widgets.IntSlider(value=8, min=1, max=8, description="max split m")
        out, update = redrawing_output(draw_combinatorics)

        def refresh(_change=None):
            k.max = e.value
            update(n_experts=e.value, top_k=min(k.value, e.value), max_split=m.value)

        for c in (e, k, m):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([e, k, m]), out])

    return live_or_static("W14.3", build_live, draw_combinatorics, static,
                          caption="16 experts, top-2, each split m = 1…8 ways (m = 4 gives 64 experts, top-8).")


# ============================================================================ W14.4 shared experts = one wide MLP


def shared_equivalence(n_shared: int = 2, d_model: int = 32, width: int = 16, n_tokens: int = 64, seed: int = 0) -> dict:
    """``n_shared`` SwiGLU experts of width ``width`` vs one of width ``n_shared·width`` holding their stacked
    weights: ``{"sum": max |Σ experts − wide|, "mean": max |mean of experts − wide|, "params_narrow",
    "params_wide"}`` on ``n_tokens`` random tokens (the sum agrees to float32 rounding, the mean does not)."""
    from ..models.llama3 import SwiGLUFeedForward

    g = torch.Generator().manual_seed(seed)
    narrow = [SwiGLUFeedForward(d_model, width) for _ in range(n_shared)]
    wide = SwiGLUFeedForward(d_model, n_shared * width)
    with torch.no_grad():
        for e in narrow:
            for p in e.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        wide.gate_proj.weight.copy_(torch.cat([e.gate_proj.weight for e in narrow], 0))
        wide.up_proj.weight.copy_(torch.cat([e.up_proj.weight for e in narrow], 0))
        wide.down_proj.weight.copy_(torch.cat([e.down_proj.weight for e in narrow], 1))
        x = torch.randn(n_tokens, d_model, generator=g)
        outs = torch.stack([e(x) for e in narrow])
        ref = wide(x)
    return {"sum": (outs.sum(0) - ref).abs().max().item(), "mean": (outs.mean(0) - ref).abs().max().item(),
            "params_narrow": sum(p.numel() for e in narrow for p in e.parameters()),
            "params_wide": sum(p.numel() for p in wide.parameters())}


def draw_shared_equivalence(max_shared: int = 4, d_model: int = 32, width: int = 16) -> Figure:
    rows = [(s, shared_equivalence(s, d_model, width)) for s in range(1, max_shared + 1)]
    fig, ax = figure(1, 1, figsize=(7, 0.45 * len(rows) + 1.2))
    ax.axis("off")
    cells = [[str(s), f"{r['params_narrow']:,}", f"{r['params_wide']:,}", f"{r['sum']:.1e}", f"{r['mean']:.3f}"]
             for s, r in rows]
    table = ax.table(cellText=cells, colLabels=["S", "params, S narrow", "params, one wide", "max |Σ − wide|",
                                                "max |mean − wide|"], loc="center")
    table.scale(1, 1.4)
    ax.set_title(f"S shared experts of width {width} vs one SwiGLU of width S·{width} (D = {d_model})")
    return fig


def show_shared_equivalence(static: bool | None = None):
    """W14.4: S narrow shared experts vs one wide MLP with their stacked weights: parameters and max |Δ| of the
    sum (float32 rounding) and of the mean (wrong). Live: sliders for the largest S and the expert width.
    Static fallback: the table for S = 1…4."""

    def build_live():
        import ipywidgets as widgets

        s = widgets.IntSlider(value=4, min=1, max=8, description="largest S")
        w = widgets.IntSlider(value=16, min=4, max=64, step=4, description="expert width")
        out, update = redrawing_output(draw_shared_equivalence)

        def refresh(_change=None):
            update(max_shared=s.value, width=w.value)

        for c in (s, w):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([s, w]), out])

    return live_or_static("W14.4", build_live, draw_shared_equivalence, static,
                          caption="S = 1…4 shared experts of width 16, D = 32.")
