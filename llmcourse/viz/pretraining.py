"""Widgets of unit 10 (pretraining): W10.1 training dashboard, W10.2 schedule explorer, W10.3 checkpoint sampler.

Each widget follows :mod:`llmcourse.viz.base`: a pure compute function (tested by pytest), a draw
function that returns a matplotlib ``Figure``, and ``show_<name>(..., static=None)``, which returns the
live ipywidgets UI or, under the ``ci`` profile (or with ``static=True``), one static figure.

=========  ============================  ==========================  ==================================
widget     compute                       draw                        show
=========  ============================  ==========================  ==================================
W10.1      :func:`dashboard_summary`     :func:`draw_dashboard`      :func:`show_training_dashboard`
                                                                     (:func:`make_training_dashboard`
                                                                     redraws it during training)
W10.2      :func:`schedule_curve`        :func:`draw_schedule`       :func:`show_schedule_explorer`
W10.3      :func:`checkpoint_samples`    :func:`draw_sample_table`   :func:`show_checkpoint_sampler`
=========  ============================  ==========================  ==================================

The dashboard reads the history dict of :func:`llmcourse.train.pretraining.pretrain` (per-step ``loss``,
``lr``, ``grad_norm``, ``tokens_per_s``; per-evaluation ``eval_step``, ``train_loss_eval``, ``val_loss``;
``samples``; ``max_norm``).
"""

from __future__ import annotations

import html
import math
import statistics
import textwrap

import numpy as np
import torch

from ..train.schedules import warmup_cosine_lr
from .base import css_class, figure, live_or_static, redrawing_output

__all__ = [
    "checkpoint_samples", "dashboard_summary", "draw_dashboard", "draw_sample_table", "draw_schedule",
    "make_training_dashboard", "schedule_curve", "show_checkpoint_sampler", "show_schedule_explorer",
    "show_training_dashboard", "smooth",
]


# ============================================================================ W10.1 training dashboard


def smooth(values, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` points (the first points average what exists so far)."""
    v = np.asarray(values, dtype=float)
    if window <= 1 or v.size == 0:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    idx = np.arange(1, v.size + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def dashboard_summary(hist: dict) -> dict:
    """The numbers the dashboard prints: progress, last losses, perplexity, lr, gradient norms, speed.

    Returns:
        dict with ``steps`` (done), ``loss`` (last training step), ``val_loss`` and ``val_perplexity``
        (last evaluation; NaN before the first), ``lr``, ``grad_norm`` (last, before clipping),
        ``clipped_fraction`` (share of steps whose norm exceeded ``max_norm``), ``tokens_per_s`` (median
        over the steps so far) and ``ms_per_step`` (median).
    """
    steps = len(hist.get("step", []))
    val = hist.get("val_loss", [])
    norms = hist.get("grad_norm", [])
    tps = hist.get("tokens_per_s", [])
    max_norm = hist.get("max_norm", math.inf)
    tokens_per_step = hist.get("tokens_per_step", 0)
    med = statistics.median(tps) if tps else math.nan
    return {
        "steps": steps,
        "loss": hist["loss"][-1] if steps else math.nan,
        "val_loss": val[-1] if val else math.nan,
        "val_perplexity": math.exp(val[-1]) if val else math.nan,
        "lr": hist["lr"][-1] if steps else math.nan,
        "grad_norm": norms[-1] if norms else math.nan,
        "clipped_fraction": (sum(n > max_norm for n in norms) / len(norms)) if norms else math.nan,
        "tokens_per_s": med,
        "ms_per_step": 1000 * tokens_per_step / med if tps and tokens_per_step else math.nan,
    }


def draw_dashboard(hist: dict, window: int = 25, log_loss: bool = False, vocab_size: int | None = None):
    """Four panels: losses (with a perplexity axis), learning rate, gradient norm and clip line, tokens/s."""
    fig, axes = figure(2, 2, figsize=(11, 6.4))
    (ax_loss, ax_lr), (ax_norm, ax_speed) = axes
    steps = np.asarray(hist.get("step", []))
    s = dashboard_summary(hist)
    if steps.size:
        ax_loss.plot(steps, hist["loss"], color="tab:blue", alpha=0.25, lw=0.8)
        ax_loss.plot(steps, smooth(hist["loss"], window), color="tab:blue", lw=1.6, label="train (per step, smoothed)")
    if hist.get("eval_step"):
        ax_loss.plot(hist["eval_step"], hist["train_loss_eval"], "o-", color="tab:green", ms=3, lw=1,
                     label="train (eval batches)")
        ax_loss.plot(hist["eval_step"], hist["val_loss"], "o-", color="tab:red", ms=3, lw=1.4, label="validation")
    if vocab_size:
        ax_loss.axhline(math.log(vocab_size), color="grey", ls=":", lw=1, label=f"ln V = {math.log(vocab_size):.2f}")
    if log_loss:
        ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (nats/token)")
    if ax_loss.get_legend_handles_labels()[0]:
        ax_loss.legend(fontsize=7, loc="upper right")
    ax_loss.set_title(f"loss {s['loss']:.3f} · val {s['val_loss']:.3f} (perplexity {s['val_perplexity']:.2f})",
                      fontsize=9)
    ppl = ax_loss.secondary_yaxis("right", functions=(np.exp, lambda p: np.log(np.maximum(p, 1e-12))))
    ppl.set_ylabel("perplexity")

    if steps.size:
        ax_lr.plot(steps, hist["lr"], color="tab:purple")
        ax_norm.plot(steps, hist["grad_norm"], color="tab:orange", alpha=0.35, lw=0.8)
        ax_norm.plot(steps, smooth(hist["grad_norm"], window), color="tab:orange", lw=1.4)
        ax_speed.plot(steps, smooth(hist["tokens_per_s"], window), color="tab:cyan")
    ax_lr.set_xlabel("step")
    ax_lr.set_ylabel("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax_lr.set_title(f"lr {s['lr']:.2e}", fontsize=9)
    max_norm = hist.get("max_norm")
    if max_norm is not None and math.isfinite(max_norm):
        ax_norm.axhline(max_norm, color="black", ls="--", lw=1, label=f"clip at {max_norm:g}")
        ax_norm.legend(fontsize=7)
    ax_norm.set_xlabel("step")
    ax_norm.set_ylabel("gradient norm (before clipping)")
    ax_norm.set_title(f"last {s['grad_norm']:.3f}; clipped on {100 * s['clipped_fraction']:.0f} % of steps"
                      if steps.size else "gradient norm", fontsize=9)
    ax_speed.set_xlabel("step")
    ax_speed.set_ylabel("tokens / s")
    ax_speed.set_title(f"median {s['tokens_per_s']:,.0f} tokens/s ({s['ms_per_step']:.0f} ms/step)"
                       if steps.size else "throughput", fontsize=9)
    return fig


def _samples_html(hist: dict, index: int | None = None) -> str:
    samples = hist.get("samples", [])
    if not samples:
        return "<em>no samples yet</em>"
    step, text = samples[-1 if index is None else index]
    return (f"<b>sample after {step} steps</b><pre style='white-space:pre-wrap;font-size:small;margin:2px'>"
            f"{html.escape(text)}</pre>")


def _stats_html(hist: dict, total_steps: int | None = None) -> str:
    s = dashboard_summary(hist)
    done = f"{s['steps']}" + (f" / {total_steps}" if total_steps else "")
    return (f"<b>step {done}</b> · loss {s['loss']:.3f} · val loss {s['val_loss']:.3f} · lr {s['lr']:.2e} · "
            f"grad norm {s['grad_norm']:.3f} · {s['tokens_per_s']:,.0f} tokens/s")


def make_training_dashboard(total_steps: int | None = None, vocab_size: int | None = None,
                            static: bool | None = None):
    """W10.1 during training: ``(widget, callback)``; pass ``callback`` to ``pretrain(..., callback=...)``.

    Display ``widget`` before training; every call of ``callback(history)`` redraws the four panels and
    updates the stats line and the latest text sample. Returns ``(None, None)`` when widgets are static
    (``ci``): show the final figure with :func:`show_training_dashboard` instead.
    """
    from ..runtime import widgets_live

    if static is None:
        static = not widgets_live()
    if static:
        return None, None
    import ipywidgets as widgets

    stats, sample = widgets.HTML(), widgets.HTML()
    out, update = redrawing_output(lambda h: draw_dashboard(h, vocab_size=vocab_size))
    box = widgets.VBox([stats, out, sample])
    box.add_class("llmcourse-widget")
    box.add_class(css_class("W10.1"))

    def callback(hist: dict) -> None:
        stats.value = _stats_html(hist, total_steps)
        sample.value = _samples_html(hist)
        update(h=hist)

    return box, callback


def show_training_dashboard(hist: dict, vocab_size: int | None = None, static: bool | None = None):
    """W10.1 after training: the four panels with a smoothing slider and a log-scale toggle, and a slider
    over the text samples recorded during the run. Static fallback: the final figure."""
    def build_live():
        import ipywidgets as widgets

        window = widgets.IntSlider(value=25, min=1, max=200, description="smoothing (steps)")
        log = widgets.Checkbox(value=False, description="log loss axis")
        out, update = redrawing_output(lambda w, lg: draw_dashboard(hist, w, lg, vocab_size))
        n = len(hist.get("samples", []))
        pick = widgets.IntSlider(value=max(n - 1, 0), min=0, max=max(n - 1, 0), description="sample #")
        text = widgets.HTML(_samples_html(hist))

        def refresh(_change=None):
            update(w=window.value, lg=log.value)

        def refresh_sample(_change=None):
            text.value = _samples_html(hist, pick.value)

        window.observe(refresh, names="value")
        log.observe(refresh, names="value")
        pick.observe(refresh_sample, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([window, log]), widgets.HTML(_stats_html(hist)), out, pick, text])

    return live_or_static("W10.1", build_live, lambda: draw_dashboard(hist, vocab_size=vocab_size), static,
                          caption="Training loss (per step and on fixed evaluation batches), validation loss, "
                                  "learning rate, gradient norm before clipping, throughput.")


# ============================================================================ W10.2 schedule explorer


def schedule_curve(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int,
                   n_steps: int | None = None) -> list[float]:
    """``warmup_cosine_lr(s, …)`` for ``s = 0 … n_steps − 1`` (default: 20 % past ``total_steps``)."""
    n = n_steps if n_steps is not None else int(total_steps * 1.2) + 1
    return [warmup_cosine_lr(s, max_lr, min_lr, warmup_steps, total_steps) for s in range(n)]


def draw_schedule(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int):
    lrs = schedule_curve(max_lr, min_lr, warmup_steps, total_steps)
    fig, ax = figure(figsize=(8, 3.4))
    ax.plot(range(len(lrs)), lrs, color="tab:purple")
    ax.axvline(warmup_steps, color="grey", ls=":", lw=1)
    ax.axvline(total_steps, color="grey", ls=":", lw=1)
    ax.axhline(min_lr, color="tab:red", ls="--", lw=1, label=f"min_lr = {min_lr:.1e}")
    ax.annotate("warm-up ends", (warmup_steps, max_lr), fontsize=8, xytext=(4, -12), textcoords="offset points")
    ax.annotate("total_steps", (total_steps, max_lr), fontsize=8, xytext=(4, -12), textcoords="offset points")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax.legend(fontsize=8)
    ax.set_title(f"warm-up {warmup_steps} steps to {max_lr:.1e}, cosine to {min_lr:.1e} at step {total_steps}",
                 fontsize=9)
    return fig


def show_schedule_explorer(max_lr: float = 3e-3, min_lr: float = 3e-4, warmup_steps: int = 100,
                           total_steps: int = 1500, static: bool | None = None):
    """W10.2: sliders for max_lr, min_lr, warm-up and total steps. Static fallback: the given schedule."""
    def build_live():
        import ipywidgets as widgets

        hi = widgets.FloatLogSlider(value=max_lr, base=10, min=-5, max=-1, step=0.1, description="max_lr",
                                    readout_format=".1e")
        lo = widgets.FloatLogSlider(value=min_lr, base=10, min=-6, max=-1, step=0.1, description="min_lr",
                                    readout_format=".1e")
        warm = widgets.IntSlider(value=warmup_steps, min=0, max=max(total_steps // 2, 1), description="warmup_steps")
        total = widgets.IntSlider(value=total_steps, min=10, max=max(4 * total_steps, 100), description="total_steps")
        note = widgets.HTML()
        out, update = redrawing_output(draw_schedule)

        def refresh(_change=None):
            w, n = warm.value, max(total.value, warm.value + 1)
            note.value = "" if lo.value <= hi.value else "<em>min_lr is above max_lr: the 'decay' rises</em>"
            update(max_lr=hi.value, min_lr=lo.value, warmup_steps=w, total_steps=n)

        for control in (hi, lo, warm, total):
            control.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([hi, lo]), widgets.HBox([warm, total]), note, out])

    return live_or_static("W10.2", build_live, lambda: draw_schedule(max_lr, min_lr, warmup_steps, total_steps),
                          static, caption="Linear warm-up, then a half cosine to the floor min_lr, held after total_steps.")


# ============================================================================ W10.3 checkpoint sampler


@torch.no_grad()
def checkpoint_samples(snapshots: dict, build_model, tokenizer, prompt: str = "ROMEO:", n_chars: int = 160,
                       temperature: float = 0.8, seed: int = 0, val_losses: dict | None = None,
                       sampled: dict | None = None) -> list[dict]:
    """Greedy and sampled continuations of ``prompt`` from each weight snapshot.

    Args:
        snapshots: ``{step: state_dict}`` (``history["snapshots"]`` of ``pretrain``).
        build_model: a function returning a fresh model with the right config (weights are loaded into it).
        tokenizer: ``encode``/``decode``.
        prompt, n_chars: the prompt and the number of generated tokens.
        temperature, seed: the sampled continuation uses ``torch.Generator().manual_seed(seed)``.
        val_losses: optional ``{step: validation loss}`` to show next to each row.
        sampled: optional ``{step: text}`` already drawn with the same prompt, temperature, seed and length
            (``dict(history["samples"])`` of ``pretrain``); those steps skip the sampled generation.

    Returns:
        list (by step) of ``{"step", "greedy", "sampled", "val_loss"}`` (generated text only).
    """
    from ..train.pretraining import sample_text

    rows = []
    for step in sorted(snapshots):
        model = build_model()
        model.load_state_dict(snapshots[step])
        model.eval()
        drawn = (sampled or {}).get(step)
        rows.append({"step": int(step), "greedy": sample_text(model, tokenizer, prompt, n_chars, 0.0, seed),
                     "sampled": drawn if drawn is not None else sample_text(model, tokenizer, prompt, n_chars,
                                                                            temperature, seed),
                     "val_loss": (val_losses or {}).get(step, math.nan)})
    return rows


def _wrap(text: str, width: int = 86, lines: int = 4) -> str:
    out = []
    for para in text.replace("\t", " ").split("\n"):
        out += textwrap.wrap(para, width) or [""]
    return "\n".join(out[:lines]) + (" …" if len(out) > lines else "")


def draw_sample_table(rows: list[dict], prompt: str = "ROMEO:", temperature: float = 0.8):
    """One block per checkpoint: its step and validation loss, the greedy and the sampled continuation."""
    fig, ax = figure(figsize=(11, 1.9 * len(rows) + 0.3))
    ax.axis("off")
    y = 1.0
    step_h = 1.0 / max(len(rows), 1)
    for r in rows:
        head = f"after {r['step']} steps" + ("" if math.isnan(r["val_loss"]) else f"  (val loss {r['val_loss']:.3f})")
        ax.text(0.0, y, head, fontsize=9, weight="bold", va="top", transform=ax.transAxes)
        ax.text(0.0, y - 0.16 * step_h, f"greedy: {prompt}" + _wrap(r["greedy"], lines=3), fontsize=7.5,
                family="monospace", va="top", transform=ax.transAxes)
        ax.text(0.0, y - 0.55 * step_h, f"T={temperature}: {prompt}" + _wrap(r["sampled"], lines=3), fontsize=7.5,
                family="monospace", va="top", color="tab:blue", transform=ax.transAxes)
        y -= step_h
    return fig


def show_checkpoint_sampler(rows: list[dict], prompt: str = "ROMEO:", temperature: float = 0.8,
                            static: bool | None = None):
    """W10.3: a checkpoint dropdown (e.g. step 0 / 25 % / 50 % / 100 %) showing the greedy and the sampled
    continuation of each. Static fallback: all rows as one table."""
    def build_live():
        import ipywidgets as widgets

        pick = widgets.Dropdown(options=[(f"after {r['step']} steps", i) for i, r in enumerate(rows)],
                                value=len(rows) - 1, description="checkpoint")
        text = widgets.HTML()

        def refresh(_change=None):
            r = rows[pick.value]
            loss = "" if math.isnan(r["val_loss"]) else f" · validation loss {r['val_loss']:.3f}"
            text.value = (f"<b>after {r['step']} steps{loss}</b>"
                          f"<p><b>greedy</b></p><pre style='white-space:pre-wrap'>{html.escape(prompt + r['greedy'])}</pre>"
                          f"<p><b>temperature {temperature}</b></p>"
                          f"<pre style='white-space:pre-wrap'>{html.escape(prompt + r['sampled'])}</pre>")

        pick.observe(refresh, names="value")
        refresh()
        return widgets.VBox([pick, text])

    return live_or_static("W10.3", build_live, lambda: draw_sample_table(rows, prompt, temperature), static,
                          caption="Greedy and sampled continuations from weight snapshots taken during the run.")
