"""Widget of unit 19 (post-training): W19.1, the GRPO run dashboard.

==========  ===========================  ============================  ==============================
widget      compute                      draw                          show
==========  ===========================  ============================  ==============================
W19.1       :func:`grpo_series`          :func:`draw_grpo_dashboard`   :func:`show_grpo_dashboard`
==========  ===========================  ============================  ==============================

The history is the list of dicts :func:`llmcourse.post.grpo.grpo_step` returns, one per iteration (keys
``reward``, ``accuracy``, ``length``, ``kl``, optionally ``test_accuracy``). During a run,
:func:`make_grpo_dashboard` returns ``(widget, callback)``; after it, :func:`show_grpo_dashboard` shows the
four panels with a smoothing slider (static fallback: the final figure).
"""

from __future__ import annotations

import math

import numpy as np

from .base import css_class, figure, live_or_static, redrawing_output
from .pretraining import smooth

__all__ = ["draw_grpo_dashboard", "grpo_series", "make_grpo_dashboard", "show_grpo_dashboard"]

_PANELS = (("reward", "mean reward of the sampled group"), ("accuracy", "accuracy"),
           ("length", "completion length (tokens)"), ("kl", "KL to the reference (k3, per token)"))


def grpo_series(history: list[dict], window: int = 1) -> dict:
    """Per-iteration arrays for the dashboard.

    Returns:
        dict with ``step`` (1-based iteration numbers), for each of ``reward``, ``accuracy``, ``length``,
        ``kl`` the raw values and a ``<key>_smooth`` trailing mean over ``window`` iterations, and
        ``test_step`` / ``test_accuracy`` for the iterations that carry a held-out accuracy.

    Raises:
        KeyError: an entry without one of the four keys.
    """
    out = {"step": np.arange(1, len(history) + 1)}
    for key, _ in _PANELS:
        raw = np.array([float(h[key]) for h in history], dtype=float)
        out[key] = raw
        out[key + "_smooth"] = smooth(raw, window)
    tests = [(i + 1, float(h["test_accuracy"])) for i, h in enumerate(history) if "test_accuracy" in h]
    out["test_step"] = np.array([s for s, _ in tests], dtype=int)
    out["test_accuracy"] = np.array([a for _, a in tests], dtype=float)
    return out


def draw_grpo_dashboard(history: list[dict], window: int = 10, acc_sft: float | None = None):
    """Four panels over the GRPO iterations: reward, accuracy (sampled groups; held-out greedy when
    recorded; the SFT model's held-out accuracy as a line), completion length, KL to the reference."""
    s = grpo_series(history, window)
    fig, axes = figure(2, 2, figsize=(10, 6))
    for ax, (key, label) in zip(axes.flat, _PANELS):
        if len(s["step"]):
            ax.plot(s["step"], s[key], alpha=0.25, lw=0.8, color="tab:blue")
            ax.plot(s["step"], s[key + "_smooth"], lw=1.6, color="tab:blue", label="sampled groups (smoothed)")
        ax.set_xlabel("GRPO iteration")
        ax.set_ylabel(label)
        last = s[key + "_smooth"][-1] if len(s["step"]) else math.nan
        ax.set_title(f"{label}: {last:.3f}", fontsize=9)
    ax = axes.flat[1]
    if len(s["test_step"]):
        ax.plot(s["test_step"], s["test_accuracy"], "o-", color="tab:red", ms=3, label="held-out, greedy")
    if acc_sft is not None:
        ax.axhline(acc_sft, color="grey", ls=":", lw=1, label=f"after SFT (held-out) {acc_sft:.3f}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return fig


def make_grpo_dashboard(total_iters: int | None = None, acc_sft: float | None = None, static: bool | None = None):
    """W19.1 during a run: ``(widget, callback)``; call ``callback(history)`` after each iteration.

    Returns ``(None, None)`` when widgets are static (``ci``): show the final figure with
    :func:`show_grpo_dashboard` instead.
    """
    from ..runtime import widgets_live

    if static is None:
        static = not widgets_live()
    if static:
        return None, None
    import ipywidgets as widgets

    stats = widgets.HTML()
    out, update = redrawing_output(lambda h: draw_grpo_dashboard(h, acc_sft=acc_sft))
    box = widgets.VBox([stats, out])
    box.add_class("llmcourse-widget")
    box.add_class(css_class("W19.1"))

    def callback(history: list[dict]) -> None:
        h = history[-1]
        done = f"{len(history)}" + (f" / {total_iters}" if total_iters else "")
        stats.value = (f"<b>iteration {done}</b> · reward {h['reward']:.3f} · accuracy {h['accuracy']:.3f} · "
                       f"length {h['length']:.2f} · KL {h['kl']:.4f}")
        update(h=list(history))

    return box, callback


def show_grpo_dashboard(history: list[dict], acc_sft: float | None = None, static: bool | None = None):
    """W19.1 after a run: the four panels with a smoothing slider. Static fallback: the final figure."""
    def build_live():
        import ipywidgets as widgets

        window = widgets.IntSlider(value=10, min=1, max=max(len(history), 1), description="smoothing")
        out, update = redrawing_output(lambda w: draw_grpo_dashboard(history, w, acc_sft))

        def refresh(_change=None):
            update(w=window.value)

        window.observe(refresh, names="value")
        refresh()
        return widgets.VBox([window, out])

    return live_or_static("W19.1", build_live, lambda: draw_grpo_dashboard(history, acc_sft=acc_sft), static,
                          caption="GRPO: mean reward and accuracy of the sampled groups, completion length and "
                                  "KL to the frozen reference per iteration; held-out accuracy where recorded.")
