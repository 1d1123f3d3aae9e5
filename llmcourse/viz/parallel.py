"""Unit 18 widgets: the ring all-reduce, step by step.

W18.1 :func:`show_ring_all_reduce`: ``p`` ranks in a ring, each tensor cut into ``p`` chunks; a step slider (and a
play button) walks through the ``p−1`` reduce-scatter steps and the ``p−1`` all-gather steps. Each cell shows how
many ranks' contributions the chunk holds; the arrows of the step say which chunk goes to which neighbour; the
title counts the elements each rank has sent against ``2(p−1)/p · n``.
"""

from __future__ import annotations

import torch

from ..parallel.collectives import ring_all_reduce_schedule, ring_all_reduce_volume
from .base import figure, live_or_static, redrawing_output

__all__ = ["ring_contributions", "draw_ring_step", "draw_ring_overview", "show_ring_all_reduce"]


def ring_contributions(p: int) -> list[dict]:
    """The ring all-reduce of :func:`~llmcourse.parallel.ring_all_reduce_schedule` on ``p`` ranks, as contribution
    counts: rank ``r`` starts with ``2^r`` in every chunk, so after any step a cell's value is the bit mask of the
    ranks summed into it.

    Returns:
        ``2(p−1) + 1`` dicts: ``phase``, ``step``, ``counts`` ``(p, p)`` long (ranks × chunks, 1 … p),
        ``sends`` (``(src, dst, chunk)``), ``sent_chunks`` (per rank, cumulative).

    Raises:
        ValueError: ``p`` outside 2 … 16.
    """
    if not 2 <= p <= 16:
        raise ValueError(f"p must be in 2..16, got {p}")
    x = (2.0 ** torch.arange(p, dtype=torch.float64))[:, None].expand(p, p).contiguous()
    out = []
    for state in ring_all_reduce_schedule(x):
        masks = state["data"].round().long()
        counts = torch.zeros_like(masks)
        for bit in range(p):
            counts += (masks >> bit) & 1
        out.append({"phase": state["phase"], "step": state["step"], "counts": counts, "sends": state["sends"],
                    "sent_chunks": state["sent_elements"]})
    return out


def draw_ring_step(p: int = 4, step: int = 0, ax=None):
    """One state of the ring (``step`` clamped to ``0 … 2(p−1)``): the ranks × chunks grid and the step's sends."""
    states = ring_contributions(p)
    state = states[max(0, min(step, len(states) - 1))]
    fig = None
    if ax is None:
        fig, ax = figure(figsize=(6.4, 0.55 * p + 1.6))
    counts = state["counts"].numpy()
    ax.imshow(counts, cmap="Blues", vmin=0, vmax=p, aspect="auto")
    for r in range(p):
        for k in range(p):
            ax.text(k, r, f"{counts[r, k]}/{p}", ha="center", va="center", fontsize=8,
                    color="white" if counts[r, k] > p / 2 else "black")
    for src, dst, k in state["sends"]:
        ax.annotate("", xy=(k + 0.25, dst), xytext=(k + 0.25, src),
                    arrowprops={"arrowstyle": "->", "color": "tab:red", "lw": 1.2,
                                "connectionstyle": "arc3,rad=0.4" if dst < src else "arc3,rad=0"})
    ax.set_xticks(range(p), [f"chunk {k}" for k in range(p)], fontsize=8)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)], fontsize=8)
    sent = state["sent_chunks"]
    formula = ring_all_reduce_volume(p, p)          # in chunks of n/p: n = p chunks
    ax.set_title(f"{state['phase']}, step {state['step']} of {len(states) - 1}: each rank has sent {sent} of "
                 f"2(p−1)/p·n = {formula:g} chunks", fontsize=9)
    return fig if fig is not None else ax.figure


def draw_ring_overview(p: int = 4):
    """Every step of the ring on ``p`` ranks side by side (the static fallback)."""
    states = ring_contributions(p)
    fig, axes = figure(1, len(states), figsize=(2.0 * len(states), 0.45 * p + 1.4))
    for ax, state in zip(axes, states, strict=True):
        ax.imshow(state["counts"].numpy(), cmap="Blues", vmin=0, vmax=p, aspect="auto")
        for r in range(p):
            for k in range(p):
                ax.text(k, r, str(int(state["counts"][r, k])), ha="center", va="center", fontsize=7)
        ax.set_xticks([])
        ax.set_yticks(range(p), [f"r{r}" for r in range(p)] if ax is axes[0] else [], fontsize=7)
        ax.set_title(f"{state['phase']}\nstep {state['step']}, sent {state['sent_chunks']}", fontsize=7)
    return fig


def show_ring_all_reduce(p: int = 4, static: bool | None = None):
    """W18.1: a ring all-reduce on ``p`` ranks (2 … 8), animated step by step (play button and step slider).
    Static: every step of the ring on ``p`` ranks in one figure."""

    def build_live():
        import ipywidgets as widgets

        ranks = widgets.IntSlider(value=p, min=2, max=8, description="ranks p")
        step = widgets.IntSlider(value=0, min=0, max=2 * (p - 1), description="step")
        play = widgets.Play(value=0, min=0, max=2 * (p - 1), interval=900, description="play")
        widgets.jslink((play, "value"), (step, "value"))
        out, update = redrawing_output(lambda p, step: draw_ring_step(p, step))

        def refresh(_change=None):
            step.max = play.max = 2 * (ranks.value - 1)
            update(p=ranks.value, step=min(step.value, step.max))

        ranks.observe(refresh, names="value")
        step.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([ranks, play, step]), out])

    return live_or_static("W18.1", build_live, lambda: draw_ring_overview(p), static,
                          caption=f"Ring all-reduce on {p} ranks: counts of ranks summed into each chunk.")
