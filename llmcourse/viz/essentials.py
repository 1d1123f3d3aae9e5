"""Widgets of unit 00 (PyTorch essentials): the shape tracer, the Noam curve, the label-smoothing view
and the dropout clicker.

Each widget follows :mod:`llmcourse.viz.base`: a pure compute function (tested by pytest), a draw
function that returns a matplotlib ``Figure``, and ``show_<name>(..., static=None)``, which returns the
live ipywidgets UI or, under the ``ci`` profile (or with ``static=True``), one static figure.

=========  ======================  =============================  ==================================
widget     compute                 draw                           show
=========  ======================  =============================  ==================================
1          :func:`trace_head_shapes`  :func:`draw_shape_trace`     :func:`show_shape_tracer`
2          :func:`noam_curve`      :func:`draw_noam_curve`        :func:`show_noam_curve`
3          :func:`label_smoothing_view`  :func:`draw_label_smoothing`  :func:`show_label_smoothing`
4          :func:`dropout_runs`    :func:`draw_dropout_runs`      :func:`show_dropout_clicker`
=========  ======================  =============================  ==================================
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import nn

from ..train.losses import label_smoothed_cross_entropy
from .base import figure, live_or_static, redrawing_output

__all__ = [
    "DEFAULT_LOGITS", "dropout_runs", "draw_dropout_runs", "draw_label_smoothing", "draw_noam_curve",
    "draw_shape_trace", "label_smoothing_view", "noam_curve", "show_dropout_clicker", "show_label_smoothing",
    "show_noam_curve", "show_shape_tracer", "trace_head_shapes",
]

_GOOD, _BAD, _GREY = "#cdebc5", "#f6c9c4", "#eeeeee"


# ============================================================================ W00.1 shape tracer


def trace_head_shapes(batch: int = 2, seq: int = 6, d_model: int = 16, n_heads: int = 4) -> list[dict]:
    """Run the shape pipeline of multi-head attention on small tensors and record every step.

    The steps are: input, project (``x @ W_q``), ``view(B, T, H, hd)``, ``transpose(1, 2)``, raw scores
    ``q @ kᵀ``, ``weights @ v``, ``transpose(1, 2)`` back, and the merge ``contiguous().view(B, T, D)``.
    Shapes and contiguity come from real tensors (not from formulas).

    Args:
        batch, seq, d_model, n_heads: ``B``, ``T``, ``D``, ``H`` (all ≥ 1).

    Returns:
        list of dicts with keys ``step`` (short name), ``code`` (the PyTorch expression), ``shape``
        (tuple of ints) and ``contiguous`` (bool, ``Tensor.is_contiguous()``).

    Raises:
        ValueError: if a size is < 1 or ``d_model`` is not divisible by ``n_heads``.
    """
    if min(batch, seq, d_model, n_heads) < 1:
        raise ValueError(f"all sizes must be ≥ 1, got B={batch}, T={seq}, d_model={d_model}, n_heads={n_heads}")
    if d_model % n_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads} "
                         f"(head_dim would be {d_model / n_heads:.3g}); choose n_heads among "
                         f"{[h for h in range(1, d_model + 1) if d_model % h == 0]}")
    b, t, d, h = batch, seq, d_model, n_heads
    hd = d // h
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, t, d, generator=g)
    w_q, w_k, w_v = (torch.randn(d, d, generator=g) / d ** 0.5 for _ in range(3))
    rows = []

    def record(step, code, tensor):
        rows.append({"step": step, "code": code, "shape": tuple(tensor.shape), "contiguous": tensor.is_contiguous()})

    record("input", "x", x)
    q = x @ w_q
    record("project", "q = x @ W_q", q)
    q4 = q.view(b, t, h, hd)
    record("view", f"q.view(B, T, H, hd={hd})", q4)
    qh = q4.transpose(1, 2)
    record("transpose", "q.transpose(1, 2)", qh)
    kh = (x @ w_k).view(b, t, h, hd).transpose(1, 2)
    vh = (x @ w_v).view(b, t, h, hd).transpose(1, 2)
    scores = qh @ kh.transpose(-2, -1)
    record("scores", "q @ k.transpose(-2, -1)", scores)
    context = scores.softmax(dim=-1) @ vh
    record("weights @ V", "softmax(scores) @ v", context)
    back = context.transpose(1, 2)
    record("transpose back", "ctx.transpose(1, 2)", back)
    merged = back.contiguous().view(b, t, d)
    record("merge", "ctx.contiguous().view(B, T, D)", merged)
    return rows


def draw_shape_trace(batch: int = 2, seq: int = 6, d_model: int = 16, n_heads: int = 4) -> Figure:
    """A table figure: one row per step with its shape and an ``is_contiguous`` badge (green/red).

    An invalid ``(d_model, n_heads)`` pair draws the divisor-check message instead of raising.
    """
    fig, ax = figure(figsize=(8.2, 3.6))
    ax.axis("off")
    try:
        rows = trace_head_shapes(batch, seq, d_model, n_heads)
    except ValueError as err:
        ax.text(0.5, 0.5, "Divisor check failed:\n" + str(err), ha="center", va="center", wrap=True,
                fontsize=10, color="#a00000")
        return fig
    cells = [[str(i + 1), r["step"], r["code"], str(r["shape"]), "yes" if r["contiguous"] else "no"]
             for i, r in enumerate(rows)]
    table = ax.table(cellText=cells, colLabels=["#", "step", "code", "shape", "contiguous"], loc="center",
                     cellLoc="left", colWidths=[0.05, 0.17, 0.42, 0.2, 0.14])
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.35)
    for i, r in enumerate(rows, start=1):
        table[i, 4].set_facecolor(_GOOD if r["contiguous"] else _BAD)
    for j in range(5):
        table[0, j].set_facecolor(_GREY)
    ax.set_title(f"B={batch}, T={seq}, d_model={d_model}, n_heads={n_heads} (head_dim={d_model // n_heads}): "
                 "`.view` needs a contiguous tensor", fontsize=10)
    return fig


def show_shape_tracer(batch: int = 2, seq: int = 6, d_model: int = 16, n_heads: int = 4, static: bool | None = None):
    """The shape tracer: sliders for B, T, d_model and n_heads; a table of shapes through multi-head attention.

    Static fallback: the table for the given sizes (default B=2, T=6, D=16, H=4).
    """

    def build_live():
        import ipywidgets as widgets

        sliders = {
            "batch": widgets.IntSlider(value=batch, min=1, max=8, description="B"),
            "seq": widgets.IntSlider(value=seq, min=1, max=32, description="T"),
            "d_model": widgets.IntSlider(value=d_model, min=4, max=128, step=4, description="d_model"),
            "n_heads": widgets.IntSlider(value=n_heads, min=1, max=16, description="n_heads"),
        }
        out, update = redrawing_output(draw_shape_trace)

        def refresh(_change=None):
            update(**{k: s.value for k, s in sliders.items()})

        for s in sliders.values():
            s.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox(list(sliders.values())[:2]), widgets.HBox(list(sliders.values())[2:]), out])

    return live_or_static("W00.1", build_live, lambda: draw_shape_trace(batch, seq, d_model, n_heads), static,
                          caption=f"Shapes for B={batch}, T={seq}, d_model={d_model}, n_heads={n_heads}.")


# ============================================================================ W00.2 Noam curve


def noam_curve(d_model: int = 512, warmup: int = 4000, base_lr: float = 1.0, n_steps: int | None = None) -> dict:
    """The learning rate that ``LambdaLR`` with the Noam lambda gives at steps ``1 … n_steps``.

    ``lr(step) = base_lr · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)``: ``LambdaLR`` multiplies the
    optimizer's base lr by the lambda, so ``base_lr = 1e-4`` makes every value 10⁴ times smaller.

    Args:
        d_model, warmup: the schedule's parameters (≥ 1).
        base_lr: the optimizer's lr when the scheduler was built (> 0).
        n_steps: last step, default ``4 · warmup``.

    Returns:
        dict with ``steps`` (int64 array ``1 … n_steps``), ``lr`` (float64 array), ``peak_step`` and
        ``peak_lr`` (the maximum; at ``step = warmup`` when ``warmup ≤ n_steps``).

    Raises:
        ValueError: if ``d_model``, ``warmup`` or ``n_steps`` is < 1, or ``base_lr <= 0``.
    """
    n_steps = 4 * warmup if n_steps is None else n_steps
    if min(d_model, warmup, n_steps) < 1:
        raise ValueError(f"d_model, warmup and n_steps must be ≥ 1, got {d_model}, {warmup}, {n_steps}")
    if not base_lr > 0:
        raise ValueError(f"base_lr must be > 0, got {base_lr}")
    steps = np.arange(1, n_steps + 1, dtype=np.int64)
    s = steps.astype(np.float64)
    lr = base_lr * d_model ** -0.5 * np.minimum(s ** -0.5, s * float(warmup) ** -1.5)
    i = int(np.argmax(lr))
    return {"steps": steps, "lr": lr, "peak_step": int(steps[i]), "peak_lr": float(lr[i])}


def draw_noam_curve(d_model: int = 512, warmup: int = 4000, base_lrs: tuple[float, ...] = (1.0,),
                    log_y: bool = False) -> Figure:
    """lr vs step for each base lr, with the peak annotated."""
    fig, ax = figure(figsize=(7, 4))
    for base_lr in base_lrs:
        c = noam_curve(d_model, warmup, base_lr)
        ax.plot(c["steps"], c["lr"], label=f"base lr {base_lr:g}: peak {c['peak_lr']:.3e} at step {c['peak_step']}")
        ax.plot([c["peak_step"]], [c["peak_lr"]], "o", color="black", ms=4)
        ax.annotate(f"{c['peak_lr']:.3e}", (c["peak_step"], c["peak_lr"]), textcoords="offset points",
                    xytext=(6, 6), fontsize=9)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"Noam schedule, d_model={d_model}, warmup={warmup} (LambdaLR multiplies the base lr)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right" if log_y else "upper right")
    ax.grid(alpha=0.3)
    return fig


def show_noam_curve(d_model: int = 512, warmup: int = 4000, static: bool | None = None):
    """The Noam curve: sliders for d_model (64–1024) and warmup (100–8000), a base-lr dropdown {1.0, 1e-4}.

    Static fallback: d_model 512, warmup 4000, both base lrs on a log axis (the 10⁴ gap is visible).
    """

    def build_live():
        import ipywidgets as widgets

        d = widgets.IntSlider(value=d_model, min=64, max=1024, step=64, description="d_model")
        w = widgets.IntSlider(value=warmup, min=100, max=8000, step=100, description="warmup")
        base = widgets.Dropdown(options=[("1.0 (make_noam_scheduler)", 1.0), ("1e-4 (the trap)", 1e-4)], value=1.0,
                                description="base lr")
        log = widgets.Checkbox(value=False, description="log y axis")
        out, update = redrawing_output(draw_noam_curve)

        def refresh(_change=None):
            update(d_model=d.value, warmup=w.value, base_lrs=(base.value,), log_y=log.value)

        for c in (d, w, base, log):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([d, w]), widgets.HBox([base, log]), out])

    return live_or_static("W00.2", build_live, lambda: draw_noam_curve(d_model, warmup, (1.0, 1e-4), log_y=True),
                          static, caption="Base lr 1.0 vs 1e-4: the same curve, 10⁴ times lower.")


# ============================================================================ W00.3 label smoothing

DEFAULT_LOGITS = (2.0, 1.0, 0.1)  # F00.4


def label_smoothing_view(eps: float = 0.1, target: int = 0, logits=DEFAULT_LOGITS) -> dict:
    """The smoothed target distribution, the model's probabilities and the loss for fixed logits.

    Args:
        eps: label smoothing ε in ``[0, 1]``.
        target: the target class in ``[0, C)``.
        logits: ``C`` raw scores (default ``[2.0, 1.0, 0.1]``).

    Returns:
        dict with ``q`` (the target distribution ``(1−ε)·onehot + ε/C``, float64 array), ``p`` (softmax of
        the logits), ``loss`` (``−Σ q_c log p_c``, computed by
        :func:`~llmcourse.train.losses.label_smoothed_cross_entropy`) and ``nll`` (``−log p_target``).

    Raises:
        ValueError: if ``eps`` is outside ``[0, 1]`` or ``target`` outside ``[0, C)``.
    """
    z = torch.as_tensor(logits, dtype=torch.float64).flatten()
    n = z.numel()
    if not 0 <= target < n:
        raise ValueError(f"target must be a class in [0, {n}), got {target}")
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps must be in [0, 1], got {eps}")
    q = torch.full((n,), eps / n, dtype=torch.float64)
    q[target] += 1.0 - eps
    p = z.softmax(-1)
    loss = label_smoothed_cross_entropy(z[None], torch.tensor([target]), eps=eps)
    return {"q": q.numpy(), "p": p.numpy(), "loss": float(loss), "nll": float(-p[target].log())}


def draw_label_smoothing(eps_values=(0.1,), target: int = 0, logits=DEFAULT_LOGITS) -> Figure:
    """One bar panel per ε: target distribution ``q`` next to the model's probabilities ``p``."""
    eps_values = tuple(eps_values)
    fig, axes = figure(1, len(eps_values), figsize=(3.4 * len(eps_values) + 0.6, 3.4), squeeze=False)
    n = len(logits)
    x = np.arange(n)
    for ax, eps in zip(axes[0], eps_values):
        v = label_smoothing_view(eps, target, logits)
        ax.bar(x - 0.2, v["q"], width=0.4, label="target q", color="#4c72b0")
        ax.bar(x + 0.2, v["p"], width=0.4, label="model p", color="#dd8452")
        ax.set_xticks(x, [f"class {c}" + (" (y)" if c == target else "") for c in range(n)], fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"ε = {eps:g}: loss {v['loss']:.4f}", fontsize=10)
    axes[0][0].set_ylabel("probability")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"logits {list(logits)}, target class {target}; ε is spread over all {n} classes", fontsize=10)
    return fig


def show_label_smoothing(logits=DEFAULT_LOGITS, static: bool | None = None):
    """The label-smoothing view: an ε slider (0–0.5) and a target-class selector over fixed logits.

    Static fallback: three panels, ε ∈ {0, 0.1, 0.3}, target class 0.
    """

    def build_live():
        import ipywidgets as widgets

        eps = widgets.FloatSlider(value=0.1, min=0.0, max=0.5, step=0.01, description="ε")
        target = widgets.Dropdown(options=list(range(len(logits))), value=0, description="target")
        out, update = redrawing_output(draw_label_smoothing)

        def refresh(_change=None):
            update(eps_values=(eps.value,), target=target.value, logits=logits)

        eps.observe(refresh, names="value")
        target.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([eps, target]), out])

    return live_or_static("W00.3", build_live, lambda: draw_label_smoothing((0.0, 0.1, 0.3), 0, logits), static,
                          caption="Label smoothing with ε = 0, 0.1, 0.3 (target class 0).")


# ============================================================================ W00.4 dropout clicker


def dropout_runs(modes=("train", "train", "eval"), p: float = 0.5, width: int = 10, seed: int | None = 0) -> torch.Tensor:
    """Pass ``ones(1, width)`` through one ``nn.Dropout(p)`` once per entry of ``modes``.

    Args:
        modes: a sequence of ``"train"`` / ``"eval"``; the module is switched with ``.train()`` /
            ``.eval()`` before each pass.
        p: dropout probability in ``[0, 1)``.
        width: number of entries per row.
        seed: seeds torch's generator inside a forked RNG state (the caller's stream is untouched);
            ``None`` uses (and advances) the global generator.

    Returns:
        ``(len(modes), width)`` float32: train rows hold only ``0`` and ``1/(1−p)``; eval rows are all ``1``.
        The exact zero pattern depends on the CPU build (never compare it bit for bit).

    Raises:
        ValueError: for ``p`` outside ``[0, 1)`` or an unknown mode.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p must be in [0, 1), got {p}")
    bad = [m for m in modes if m not in ("train", "eval")]
    if bad:
        raise ValueError(f"modes must be 'train' or 'eval', got {bad}")
    drop = nn.Dropout(p)
    x = torch.ones(1, width)

    def run():
        rows = []
        for m in modes:
            drop.train(m == "train")
            rows.append(drop(x)[0])
        return torch.stack(rows) if rows else torch.empty(0, width)

    if seed is None:
        return run()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return run()


def draw_dropout_runs(rows: torch.Tensor, labels, p: float = 0.5) -> Figure:
    """A grid: one row per pass, each cell showing its value (0 = dropped, 1/(1−p) = kept and scaled)."""
    rows = torch.as_tensor(rows)
    n, width = rows.shape
    fig, ax = figure(figsize=(7, 0.55 * max(n, 1) + 1.3))
    ax.imshow(rows.numpy(), cmap="Greens", vmin=0, vmax=max(2.0, 1 / (1 - p)), aspect="auto")
    for i in range(n):
        for j in range(width):
            value = rows[i, j].item()
            ax.text(j, i, f"{value:g}", ha="center", va="center", fontsize=9, color="white" if value > 1 else "black")
    ax.set_yticks(range(n), labels)
    ax.set_xticks(range(width), [str(j) for j in range(width)], fontsize=8)
    ax.set_title(f"nn.Dropout(p={p:g}) on ones(1, {width}): train drops and scales by 1/(1−p); eval is the identity",
                 fontsize=9)
    return fig


def show_dropout_clicker(p: float = 0.5, static: bool | None = None):
    """The dropout clicker: a train/eval toggle and a "run again" button; each click adds a pass over ``ones(1, 10)``.

    Static fallback: two train rows and one eval row (seed 0).
    """

    def build_live():
        import ipywidgets as widgets

        mode = widgets.ToggleButtons(options=["train", "eval"], value="train", description="mode")
        again = widgets.Button(description="run again", icon="refresh")
        prob = widgets.FloatSlider(value=p, min=0.0, max=0.9, step=0.1, description="p")
        out, update = redrawing_output(draw_dropout_runs)
        history: list[tuple[str, torch.Tensor]] = []

        def add_run(_=None):
            row = dropout_runs((mode.value,), p=prob.value, seed=None)[0]
            history.append((f"{mode.value} #{len(history) + 1} (p={prob.value:g})", row))
            del history[:-6]
            update(rows=torch.stack([r for _, r in history]), labels=[lab for lab, _ in history], p=prob.value)

        again.on_click(add_run)
        mode.observe(add_run, names="value")
        add_run()
        return widgets.VBox([widgets.HBox([mode, again]), prob, out])

    def build_static():
        rows = dropout_runs(("train", "train", "eval"), p=p, seed=0)
        return draw_dropout_runs(rows, ["train (run 1)", "train (run 2)", "eval"], p=p)

    return live_or_static("W00.4", build_live, build_static, static,
                          caption="Two passes in train() mode and one in eval() mode.")
