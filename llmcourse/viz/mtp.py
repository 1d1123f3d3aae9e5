"""Widgets of unit 15 (multi-token prediction): the alignment table, the speculative-decoding stepper and the
with/without-MTP loss curves.

* W15.1 :func:`show_alignment_table` — T and D sliders and a selected cell: a grid of depths × positions saying
  which hidden state, which embedded token and which target each cell uses, and every token that can influence
  the selected cell's prediction. Data: :func:`alignment_table`.
* W15.2 :func:`show_speculative_stepper` — a step button through a recorded run of
  :func:`llmcourse.models.mtp.speculative_trace`: drafts amber, accepted green, rejected red, with the running
  acceptance rate and the main-model calls saved. Data: :func:`speculative_steps`.
* W15.3 :func:`show_mtp_loss_curves` — the main loss with and without MTP at equal steps, plus the MTP loss,
  from :func:`llmcourse.train.mtp_char.compare_mtp` histories.
"""

from __future__ import annotations

from .base import figure, live_or_static, redrawing_output

__all__ = ["alignment_table", "draw_alignment_table", "draw_mtp_loss_curves", "draw_speculative_step",
           "show_alignment_table", "show_mtp_loss_curves", "show_speculative_stepper", "speculative_steps"]

_H, _E, _T, _INF = "#90caf9", "#ffcc80", "#a5d6a7", "#ef9a9a"
_AMBER, _GREEN, _RED, _GREY = "#ffb300", "#43a047", "#e53935", "#b0bec5"


# ------------------------------------------------------------------------------------------------ W15.1


def alignment_table(T: int, D: int) -> list[dict]:
    """One dict per (depth, position) of a window of ``T`` tokens ``x_0 … x_{T-1}`` followed by the last target
    ``x_T``: depth ``k`` (0 = the main model) at position ``i`` (``i < T − k``) reads ``hidden`` = the state of depth
    ``k−1`` at position ``i`` (None at depth 0), embeds ``embed`` = absolute position ``i+k``, predicts ``target`` =
    ``i+k+1``, and can be influenced by the tokens at ``influence`` = ``[0 … i+k]`` (never by ``i+k+1`` or later).

    Raises:
        ValueError: ``T < 2`` or ``D`` not in ``0 … T−1``.
    """
    if T < 2 or not 0 <= D < T:
        raise ValueError(f"need T ≥ 2 and 0 ≤ D < T; got T={T}, D={D}")
    rows = []
    for k in range(D + 1):
        for i in range(T - k):
            rows.append({"depth": k, "position": i, "hidden": None if k == 0 else i, "embed": i + k,
                         "target": i + k + 1, "influence": list(range(i + k + 1))})
    return rows


def draw_alignment_table(T: int = 8, D: int = 2, depth: int | None = None, position: int = 0):
    """The grid of :func:`alignment_table`; the selected cell's influencing tokens are shaded along the top row."""
    rows = alignment_table(T, D)
    depth = D if depth is None else min(depth, D)
    position = min(position, T - depth - 1)
    fig, ax = figure(1, 1, figsize=(max(6.0, 0.95 * (T + 1)), 1.0 + 0.85 * (D + 2)))
    sel = next(r for r in rows if r["depth"] == depth and r["position"] == position)
    for j in range(T + 1):   # the token row
        color = _INF if j in sel["influence"] else ("#ffffff" if j != sel["target"] else _T)
        ax.add_patch(_rect(j, D + 1, color))
        ax.text(j + 0.5, D + 1.5, f"x{j}", ha="center", va="center", fontsize=9)
    for r in rows:
        y = D - r["depth"]
        edge = 2.5 if (r["depth"], r["position"]) == (depth, position) else 0.6
        ax.add_patch(_rect(r["position"], y, "#fafafa", lw=edge))
        h = "emb" if r["depth"] == 0 else f"h{r['depth'] - 1}[{r['hidden']}]"
        ax.text(r["position"] + 0.5, y + 0.72, h, ha="center", va="center", fontsize=7, color="#1565c0")
        if r["depth"]:
            ax.text(r["position"] + 0.5, y + 0.47, f"+e(x{r['embed']})", ha="center", va="center", fontsize=7,
                    color="#e65100")
        ax.text(r["position"] + 0.5, y + 0.2, f"→x{r['target']}", ha="center", va="center", fontsize=7,
                color="#2e7d32")
    ax.set_xlim(-1.6, T + 1.1)
    ax.set_ylim(-0.1, D + 2.1)
    for k in range(D + 1):
        ax.text(-0.2, D - k + 0.5, "main" if k == 0 else f"depth {k}", ha="right", va="center", fontsize=9)
    ax.text(-0.2, D + 1.5, "tokens", ha="right", va="center", fontsize=9)
    ax.set_axis_off()
    name = "main model" if depth == 0 else f"depth {depth}"
    ax.set_title(f"T={T}, D={D}: {name} at position {position} predicts x{sel['target']} from "
                 f"x0…x{sel['influence'][-1]} (red)", fontsize=10)
    return fig


def _rect(x, y, color, lw=0.6):
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.03, y + 0.03), 0.94, 0.94, facecolor=color, edgecolor="#37474f", lw=lw)


def show_alignment_table(T: int = 8, D: int = 2, static: bool | None = None):
    """W15.1: sliders for T, D and the selected cell (depth, position). Static: T=8, D=2, depth 2, position 0."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda **c: draw_alignment_table(**c))
        t = widgets.IntSlider(value=T, min=3, max=16, description="T")
        d = widgets.IntSlider(value=D, min=0, max=4, description="D")
        k = widgets.IntSlider(value=D, min=0, max=4, description="depth")
        i = widgets.IntSlider(value=0, min=0, max=T - 1, description="position")

        def redraw(_=None):
            d.max = min(4, t.value - 1)
            k.max = d.value
            i.max = t.value - k.value - 1
            update(T=t.value, D=d.value, depth=k.value, position=i.value)

        for w in (t, d, k, i):
            w.observe(redraw, names="value")
        redraw()
        return widgets.VBox([widgets.HBox([t, d]), widgets.HBox([k, i]), out])

    return live_or_static("W15.1", build_live, lambda: draw_alignment_table(8, 2, 2, 0), static,
                          caption="T = 8, D = 2: the deepest cell at position 0 and the tokens it may read.")


# ------------------------------------------------------------------------------------------------ W15.2


def speculative_steps(trace: dict, decode=None, n_tokens: int | None = None) -> list[dict]:
    """Frames of a :func:`~llmcourse.models.mtp.speculative_trace` record: after each event, the shown tokens as
    ``(text, kind)`` pairs (kind ``main``, ``accept`` or ``reject``), the drafts and accepted drafts so far and the
    main-model calls made vs the calls plain greedy decoding would have made. ``n_tokens`` stops after that many
    generated tokens."""
    frames, shown = [], []
    drafts = accepted = generated = 0
    for kind, tok in trace["events"]:
        text = decode([tok]) if decode else str(tok)
        generated += kind != "reject"
        drafts += kind != "main"
        accepted += kind == "accept"
        shown.append((text, kind))
        # one call for the first token, then one verification call per draft
        frames.append({"tokens": list(shown), "drafts": drafts, "accepted": accepted, "generated": generated,
                       "calls": 1 + drafts, "greedy_calls": generated})
        if n_tokens is not None and generated >= n_tokens:
            break
    return frames


def draw_speculative_step(frames: list[dict], step: int):
    """Tokens in boxes: main-model tokens grey, accepted drafts green, rejected drafts red; the newest draft
    outlined amber. Title: running acceptance rate and main-model calls saved."""
    f = frames[min(step, len(frames) - 1)]
    per_row = 20
    n = len(f["tokens"])
    fig, ax = figure(1, 1, figsize=(10, 0.9 + 0.55 * (n // per_row + 1)))
    for j, (text, kind) in enumerate(f["tokens"]):
        x, y = j % per_row, -(j // per_row)
        color = {"main": _GREY, "accept": _GREEN, "reject": _RED}[kind]
        edge = _AMBER if (j == n - 1 and kind != "main") else "#37474f"
        ax.add_patch(_rect(x, y, color, lw=2.5 if edge == _AMBER else 0.6))
        ax.patches[-1].set_edgecolor(edge)
        ax.text(x + 0.5, y + 0.5, repr(text)[1:-1].replace(" ", "␣"), ha="center", va="center", fontsize=8,
                color="white" if kind != "main" else "black")
    rows = n // per_row + 1
    ax.set_xlim(0, per_row)
    ax.set_ylim(-rows + 0.9, 1.05)
    ax.set_axis_off()
    rate = f["accepted"] / f["drafts"] if f["drafts"] else 0.0
    ax.set_title(f"{f['generated']} tokens: {f['accepted']}/{f['drafts']} drafts accepted ({rate:.0%}); "
                 f"{f['calls']} main-model calls instead of {f['greedy_calls']} "
                 f"(grey: main model, green: accepted draft, red: rejected draft)", fontsize=9)
    return fig


def show_speculative_stepper(frames: list[dict], static: bool | None = None):
    """W15.2: step through a recorded run. Static: the state after the first 20 generated tokens."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda step: draw_speculative_step(frames, step))
        step = widgets.IntSlider(value=0, min=0, max=len(frames) - 1, description="event")
        nxt = widgets.Button(description="next event")

        def advance(_):
            step.value = (step.value + 1) % len(frames)

        nxt.on_click(advance)
        step.observe(lambda ch: update(step=ch["new"]), names="value")
        update(step=0)
        return widgets.VBox([widgets.HBox([nxt, step]), out])

    def build_static():
        last = next((i for i, f in enumerate(frames) if f["generated"] >= 20), len(frames) - 1)
        return draw_speculative_step(frames, last)

    return live_or_static("W15.2", build_live, build_static, static,
                          caption="Self-speculative decoding: the first 20 generated tokens.")


# ------------------------------------------------------------------------------------------------ W15.3


def _smooth(values: list[float], window: int = 10) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def draw_mtp_loss_curves(runs: dict, window: int = 10):
    """Left: training main loss (moving average) with and without MTP, and the depth-1 loss. Right: validation
    main loss at the evaluation steps of both runs (and the depth-1 validation loss)."""
    fig, (ax1, ax2) = figure(1, 2, figsize=(10.5, 3.6))
    plain, mtp = runs["plain"], runs["mtp"]
    ax1.plot(plain["step"], _smooth(plain["loss_main"], window), label="main loss, without MTP", color="#546e7a")
    ax1.plot(mtp["step"], _smooth(mtp["loss_main"], window), label="main loss, with MTP", color="#1565c0")
    ax1.plot(mtp["step"], _smooth(mtp["loss_mtp"], window), label="depth-1 loss (predicts 2 ahead)",
             color="#ef6c00", ls="--")
    ax1.set_xlabel("step")
    ax1.set_ylabel(f"training loss (mean of {window} steps)")
    ax1.legend(fontsize=8)
    ax2.plot(plain["eval_step"], plain["val_loss"], "o-", label="without MTP", color="#546e7a")
    ax2.plot(mtp["eval_step"], mtp["val_loss"], "s-", label="with MTP", color="#1565c0")
    ax2.plot(mtp["eval_step"], mtp["val_loss_mtp"], "^--", label="depth 1 (with MTP)", color="#ef6c00")
    ax2.set_xlabel("step")
    ax2.set_ylabel("validation loss (nats/token)")
    ax2.legend(fontsize=8)
    ax2.set_title(f"final main val loss: {plain['val_loss'][-1]:.3f} without, {mtp['val_loss'][-1]:.3f} with MTP",
                  fontsize=10)
    return fig


def show_mtp_loss_curves(runs: dict, static: bool | None = None):
    """W15.3: a smoothing slider over the curves. Static: the recorded runs with a 10-step average."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda window: draw_mtp_loss_curves(runs, window))
        w = widgets.IntSlider(value=10, min=1, max=50, description="moving average")
        w.observe(lambda ch: update(window=ch["new"]), names="value")
        update(window=10)
        return widgets.VBox([w, out])

    return live_or_static("W15.3", build_live, lambda: draw_mtp_loss_curves(runs), static,
                          caption="Main loss with and without MTP at equal steps, and the MTP loss.")
