"""Widgets of unit 09 (generation and sampling): W09.1 next-token explorer, W09.2 temperature sweep,
W09.3 generation stepper.

All three are driven by a real language model: the lesson passes the course's trained character GPT
(:func:`llmcourse.train.char_model.load_gpt_char_tiny`) and its tokenizer (anything with ``encode(str) ->
list[int]`` and ``decode(list[int]) -> str``). Each widget follows :mod:`llmcourse.viz.base`: a pure compute
function (tested by pytest), a draw function that returns a matplotlib ``Figure``, and
``show_<name>(..., static=None)``, which returns the live ipywidgets UI or, under the ``ci`` profile (or
with ``static=True``), one static figure.

=========  ============================  =============================  ===============================
widget     compute                       draw                           show
=========  ============================  =============================  ===============================
W09.1      :func:`next_token_view`       :func:`draw_next_token`        :func:`show_next_token_explorer`
W09.2      :func:`temperature_sweep`     :func:`draw_temperature_sweep` :func:`show_temperature_sweep`
W09.3      :func:`generation_steps`      :func:`draw_generation_steps`  :func:`show_generation_stepper`
=========  ============================  =============================  ===============================
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Sequence

import torch
from matplotlib.figure import Figure

from ..train.sampling import entropy, filtered_probs, generate, sample_next_token
from .base import figure, live_or_static, redrawing_output

__all__ = [
    "display_token", "draw_generation_steps", "draw_next_token", "draw_temperature_sweep", "generation_steps",
    "model_context_length", "next_token_view", "show_generation_stepper", "show_next_token_explorer",
    "show_temperature_sweep", "temperature_sweep",
]

GREY, COLOUR, CHOSEN = "#c7c7c7", "#4c72b0", "#dd8452"


def display_token(piece: str) -> str:
    """A printable label for a token: ``"\\n"`` -> ``"⏎"``, ``" "`` -> ``"␣"``, other whitespace escaped."""
    return piece.replace("\n", "⏎").replace(" ", "␣").replace("\t", "⇥") if piece else "∅"


def model_context_length(model) -> int:
    """The model's maximum input length: ``model.cfg.context_length`` or ``model.context_length``.

    Raises:
        ValueError: the model exposes neither.
    """
    cfg = getattr(model, "cfg", None)
    for owner in (cfg, model):
        value = getattr(owner, "context_length", None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError("pass context_length: the model has neither cfg.context_length nor context_length")


def _encode(tokenizer, prompt: str) -> torch.Tensor:
    if not prompt:
        raise ValueError("type a prompt first (at least one character)")
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return torch.tensor([ids], dtype=torch.long)


@torch.no_grad()
def _last_logits(model, idx: torch.Tensor, context_length: int) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        return model(idx[:, -context_length:])[0, -1].float()
    finally:
        model.train(was_training)


# ============================================================================ W09.1 next-token explorer


def next_token_view(model, tokenizer, prompt: str, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None, n_top: int = 20, context_length: int | None = None) -> dict:
    """The model's next-token distribution after ``prompt``, before and after temperature and filters.

    Args:
        model: ``(1, T)`` long -> ``(1, T, V)`` logits (run in eval mode; its mode is restored).
        tokenizer: ``encode``/``decode``.
        prompt: the text so far (non-empty). Only its last ``context_length`` tokens are read.
        temperature: ``≥ 0`` (0 = greedy: the filtered distribution is one-hot at the argmax).
        top_k: ``None`` or ``0`` = off. top_p: ``None`` or ``≥ 1`` = off.
        n_top: how many tokens to list (the most likely under the model's own distribution).
        context_length: default :func:`model_context_length`.

    Returns:
        dict with ``ids`` (``(n,)`` long, by decreasing model probability), ``labels`` (n display strings),
        ``model_probs`` (``(n,)``: ``softmax(logits)``, temperature 1, no filter), ``sampling_probs``
        (``(n,)``: the distribution :func:`~llmcourse.train.sampling.sample_next_token` draws from),
        ``entropy_model`` / ``entropy_sampling`` (nats, over the whole vocabulary), ``n_kept`` (tokens with
        non-zero sampling probability), ``top_mass`` (the listed tokens' share of the model's probability),
        ``greedy`` (the argmax id) and ``logits`` (``(V,)``, for drawing samples).

    Raises:
        ValueError: empty prompt, ``temperature < 0``, a bad ``top_k``/``top_p``.
    """
    context_length = context_length or model_context_length(model)
    idx = _encode(tokenizer, prompt)
    logits = _last_logits(model, idx, context_length)
    k = None if not top_k else int(top_k)
    p_model = torch.softmax(logits, -1)
    p_sample = filtered_probs(logits, temperature, k, top_p)
    n = min(n_top, logits.shape[-1])
    order = torch.sort(p_model, descending=True, stable=True).indices[:n]
    return {
        "prompt": prompt, "temperature": float(temperature), "top_k": k, "top_p": top_p,
        "ids": order, "labels": [display_token(tokenizer.decode([int(i)])) for i in order],
        "model_probs": p_model[order], "sampling_probs": p_sample[order],
        "entropy_model": float(entropy(p_model)), "entropy_sampling": float(entropy(p_sample)),
        "n_kept": int((p_sample > 0).sum()), "top_mass": float(p_model[order].sum()),
        "greedy": int(logits.argmax()), "logits": logits,
    }


def _settings(view: dict) -> str:
    t = view["temperature"]
    parts = ["greedy (T=0)" if t == 0 else f"T={t:g}"]
    if view["top_k"]:
        parts.append(f"top-k {view['top_k']}")
    if view["top_p"] is not None and view["top_p"] < 1:
        parts.append(f"top-p {view['top_p']:g}")
    return ", ".join(parts)


FLOOR = 1e-6  # the bottom of the log-scale probability axis


def _bars(ax, view: dict, chosen: int | None = None, title: str | None = None) -> None:
    """Log-scale bars (a confident model puts 0.99 on one token; the tail is where the knobs act). A token
    the filters removed has probability 0 and no coloured bar."""
    n = len(view["labels"])
    x = torch.arange(n).numpy()
    ax.bar(x - 0.2, view["model_probs"].clamp_min(FLOOR).numpy(), width=0.4, color=GREY, label="model (T=1, no filter)",
           bottom=0)
    colours = [CHOSEN if chosen is not None and int(i) == chosen else COLOUR for i in view["ids"]]
    sampled = view["sampling_probs"]
    ax.bar(x + 0.2, torch.where(sampled > 0, sampled.clamp_min(FLOOR), torch.zeros_like(sampled)).numpy(), width=0.4,
           color=colours, label="sampled from (0 = filtered out)")
    ax.set_yscale("log")
    ax.set_ylim(FLOOR, 1.5)
    ax.set_xticks(x, view["labels"], fontsize=9)
    ax.set_ylabel("probability (log)")
    head = title or f"{_settings(view)}"
    ax.set_title(f"{head}: {view['n_kept']} token(s) kept, entropy {abs(view['entropy_sampling']):.2f} nats "
                 f"(model {view['entropy_model']:.2f})", fontsize=9)


def draw_next_token(views: Sequence[dict], chosen: int | None = None, labels: Sequence[str] | None = None) -> Figure:
    """One bar chart per view: the model's probabilities (grey) and the sampling distribution (colour) of the
    listed tokens; the ``chosen`` token id (if any) in orange."""
    fig, axes = figure(len(views), 1, figsize=(8.5, 2.3 * len(views)), squeeze=False)
    for i, (ax, view) in enumerate(zip(axes[:, 0], views)):
        _bars(ax, view, chosen, labels[i] if labels else None)
    axes[0, 0].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"next token after {view_prompt(views[0])}", fontsize=10)
    return fig


def view_prompt(view: dict, width: int = 40) -> str:
    text = view["prompt"]
    text = text if len(text) <= width else "…" + text[-width:]
    return repr(text)


STATIC_SETTINGS = ((0.5, None, None), (1.0, None, None), (1.5, None, None), (1.0, 5, None), (1.0, None, 0.8))


def show_next_token_explorer(model, tokenizer, prompt: str = "ROMEO:", context_length: int | None = None,
                             static: bool | None = None, seed: int = 0):
    """W09.1: a prompt box, temperature / top-k / top-p sliders, "sample" and "append" buttons over a bar
    chart of the 20 most likely next tokens (the model's own probabilities in grey, the distribution sampled
    from in colour, the drawn token in orange), with the entropy and the number of tokens kept.

    Static fallback: ``prompt`` at T ∈ {0.5, 1.0, 1.5}, then top-k 5 and top-p 0.8 (T = 1).
    """
    context_length = context_length or model_context_length(model)
    vocab = len(getattr(tokenizer, "chars", ())) or 65

    def build_static():
        views = [next_token_view(model, tokenizer, prompt, t, k, p, context_length=context_length)
                 for t, k, p in STATIC_SETTINGS]
        return draw_next_token(views)

    def build_live():
        import ipywidgets as w

        box = w.Textarea(value=prompt, description="prompt", layout=w.Layout(width="95%", height="70px"),
                         continuous_update=False)
        temp = w.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description="temperature (0 = greedy)")
        top_k = w.IntSlider(value=0, min=0, max=vocab, description="top-k (0 = off)")
        top_p = w.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top-p (1 = off)")
        sample_btn, append_btn = w.Button(description="sample", icon="random"), w.Button(description="append")
        status = w.HTML()
        state = {"chosen": None, "view": None, "gen": torch.Generator().manual_seed(seed)}

        def draw(view, chosen):
            return draw_next_token([view], chosen)

        out, update = redrawing_output(draw)

        def refresh(*_):
            try:
                view = next_token_view(model, tokenizer, box.value, temp.value, top_k.value,
                                       None if top_p.value >= 1 else top_p.value, context_length=context_length)
            except ValueError as exc:
                status.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
                return
            state["view"] = view
            update(view=view, chosen=state["chosen"])
            chosen = state["chosen"]
            picked = (f"; drawn: <b>{html.escape(display_token(tokenizer.decode([chosen])))}</b>"
                      if chosen is not None else "")
            status.value = (f"entropy {view['entropy_sampling']:.3f} nats, {view['n_kept']} token(s) kept, the 20 "
                            f"listed hold {view['top_mass']:.1%} of the model's probability{picked}")

        def on_change(*_):
            state["chosen"] = None
            refresh()

        def on_sample(_):
            view = state["view"]
            if view is None:
                return
            k = view["top_k"]
            nxt = sample_next_token(view["logits"][None], view["temperature"], k, view["top_p"], state["gen"])
            state["chosen"] = int(nxt)
            refresh()

        def on_append(_):
            view = state["view"]
            if view is None:
                return
            token = state["chosen"] if state["chosen"] is not None else view["greedy"]
            state["chosen"] = None
            box.value = box.value + tokenizer.decode([token])  # triggers on_change

        for c in (box, temp, top_k, top_p):
            c.observe(on_change, names="value")
        sample_btn.on_click(on_sample)
        append_btn.on_click(on_append)
        refresh()
        for slider in (temp, top_k, top_p):
            slider.layout = w.Layout(width="440px")
        status.layout = w.Layout(width="420px")
        controls = w.HBox([w.VBox([temp, top_k, top_p]), w.VBox([w.HBox([sample_btn, append_btn]), status])])
        return w.VBox([box, controls, out])

    return live_or_static("W09.1", build_live, build_static, static,
                          caption=f"{prompt!r}: T = 0.5, 1.0, 1.5, then top-k 5 and top-p 0.8 (T = 1). Grey: the "
                                  "model's probabilities; blue: the distribution sampled from.")


# ============================================================================ W09.2 temperature sweep


@torch.no_grad()
def temperature_sweep(model, tokenizer, prompt: str = "ROMEO:", temperatures: Sequence[float] = (0.2, 0.8, 1.2, 2.0),
                      n_tokens: int = 120, seed: int = 0, context_length: int | None = None, top_k: int | None = None,
                      top_p: float | None = None) -> list[dict]:
    """One seeded sample per temperature, and how likely the model itself finds it.

    Each sample uses ``torch.Generator().manual_seed(seed)`` (the same seed for every temperature).

    Returns:
        list of dicts: ``temperature``, ``text`` (the generated continuation, prompt excluded), ``ids``
        (``(n_tokens,)`` long), ``nll`` (mean negative log-likelihood per token of the continuation under the
        model at T = 1, in nats: low for timid, repetitive text, high for noise) and ``distinct`` (the
        fraction of distinct 4-token windows among all of them; repetition lowers it).

    Raises:
        ValueError: empty prompt, a temperature < 0.
    """
    context_length = context_length or model_context_length(model)
    idx = _encode(tokenizer, prompt)
    rows = []
    was_training = model.training
    model.eval()
    try:
        for t in temperatures:
            out = generate(model, idx, n_tokens, context_length, temperature=t, top_k=top_k, top_p=top_p,
                           generator=torch.Generator().manual_seed(seed))
            new = out[0, idx.shape[1]:]
            nll = _nll(model, out, idx.shape[1], context_length)
            grams = [tuple(new[i:i + 4].tolist()) for i in range(max(len(new) - 3, 0))]
            rows.append({"temperature": float(t), "ids": new, "text": tokenizer.decode(new.tolist()), "nll": nll,
                         "distinct": len(set(grams)) / max(len(grams), 1)})
    finally:
        model.train(was_training)
    return rows


def _nll(model, seq: torch.Tensor, start: int, context_length: int) -> float:
    """Mean −log p(token | the tokens before it, at most ``context_length``) over positions ``start …``.

    Causality makes one forward pass over the first ``context_length`` tokens give every prediction inside
    that window; later positions get their own cropped window.
    """
    logp = torch.log_softmax(model(seq[:, :context_length])[0].float(), -1)  # row t predicts token t + 1
    targets = list(range(max(start, 1), seq.shape[1]))
    total = 0.0
    for t in targets:
        if t <= context_length - 1:
            total -= float(logp[t - 1, seq[0, t]])
        else:
            row = torch.log_softmax(model(seq[:, t - context_length:t])[0, -1].float(), -1)
            total -= float(row[seq[0, t]])
    return total / max(len(targets), 1)


def draw_temperature_sweep(rows: Sequence[dict], prompt: str, width: int = 60) -> Figure:
    """The samples as wrapped monospace text, one panel per temperature, with their NLL and repetition."""
    heights = [2 + len(textwrap.wrap(prompt + "|" + r["text"].replace("\n", "⏎ "), width)) for r in rows]
    fig, axes = figure(len(rows), 1, figsize=(8.5, 0.17 * sum(heights) + 0.1), squeeze=False,
                       gridspec_kw={"height_ratios": heights})
    for ax, row in zip(axes[:, 0], rows):
        ax.axis("off")
        body = "\n".join(textwrap.wrap(prompt.replace("\n", "⏎ ") + "|" + row["text"].replace("\n", "⏎ "), width))
        ax.text(0, 1, body, family="monospace", fontsize=8.5, va="top", ha="left", transform=ax.transAxes)
        ax.set_title(f"T = {row['temperature']:g}: {row['nll']:.2f} nats/token under the model, "
                     f"{row['distinct']:.0%} distinct 4-grams", fontsize=9, loc="left")
    return fig


def show_temperature_sweep(model, tokenizer, prompt: str = "ROMEO:", temperatures: Sequence[float] = (0.2, 0.8, 1.2, 2.0),
                           n_tokens: int = 120, seed: int = 0, context_length: int | None = None,
                           static: bool | None = None, rows: Sequence[dict] | None = None):
    """W09.2: four seeded samples of ``n_tokens`` at T = 0.2, 0.8, 1.2 and 2.0 (⏎ marks a newline; ``|``
    separates the prompt). Live: a prompt box and a seed slider. Static: the default prompt and seed.

    ``rows``: the result of :func:`temperature_sweep` for ``prompt`` and ``seed``, if already computed (it is
    drawn instead of being recomputed).
    """
    first = {(prompt, seed): list(rows)} if rows is not None else {}

    def sweep_rows(text, s):
        if (text, s) not in first:
            first[(text, s)] = temperature_sweep(model, tokenizer, text, temperatures, n_tokens, s, context_length)
        return first[(text, s)]

    def build_static():
        return draw_temperature_sweep(sweep_rows(prompt, seed), prompt)

    def build_live():
        import ipywidgets as w

        box = w.Text(value=prompt, description="prompt", continuous_update=False, layout=w.Layout(width="60%"))
        seed_box = w.IntSlider(value=seed, min=0, max=99, description="seed", continuous_update=False)
        status = w.HTML()

        def draw(text, s):
            return draw_temperature_sweep(sweep_rows(text, s), text)

        out, update = redrawing_output(draw)

        def refresh(*_):
            if not box.value:
                status.value = "<span style='color:#b00'>type a prompt first</span>"
                return
            status.value = ""
            update(text=box.value, s=seed_box.value)

        box.observe(refresh, names="value")
        seed_box.observe(refresh, names="value")
        refresh()
        return w.VBox([w.HBox([box, seed_box]), status, out])

    return live_or_static("W09.2", build_live, build_static, static,
                          caption=f"{prompt!r}, seed {seed}: one sample per temperature.")


# ============================================================================ W09.3 generation stepper


@torch.no_grad()
def generation_steps(model, tokenizer, prompt: str = "ROMEO:", n_steps: int = 5, window: int = 8,
                     temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                     seed: int = 0, n_alternatives: int = 5) -> list[dict]:
    """What :func:`~llmcourse.train.sampling.generate` does, one step at a time, with a small window.

    ``window`` plays the role of ``context_length`` (at most the model's own), small enough that the crop is
    visible after a few steps.

    Returns:
        list of ``n_steps`` dicts: ``sequence`` (ids before the step, list), ``start`` (index of the first
        token fed to the model: ``max(0, len(sequence) − window)``), ``next`` (the id appended, drawn from the
        filtered distribution), ``p_next`` (its probability under the model's own distribution, T = 1, no
        filter), ``alternatives`` (``[(id, probability)]``, the ``n_alternatives`` most likely under the
        model's own distribution) and ``labels`` (display strings of ``sequence``).

    Raises:
        ValueError: empty prompt, ``window < 1`` or larger than the model's context length.
    """
    limit = model_context_length(model)
    if not 1 <= window <= limit:
        raise ValueError(f"window must be in 1 … {limit} (the model's context length), got {window}")
    idx = _encode(tokenizer, prompt)
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(n_steps):
        logits = _last_logits(model, idx, window)
        probs = torch.softmax(logits, dim=-1)
        nxt = int(sample_next_token(logits[None], temperature, top_k, top_p, gen))
        top = torch.topk(probs, min(n_alternatives, probs.shape[-1]))
        seq = idx[0].tolist()
        steps.append({"sequence": seq, "start": max(0, len(seq) - window), "next": nxt, "p_next": float(probs[nxt]),
                      "alternatives": [(int(i), float(p)) for p, i in zip(top.values, top.indices)],
                      "labels": [display_token(tokenizer.decode([i])) for i in seq],
                      "next_label": display_token(tokenizer.decode([nxt])),
                      "alt_labels": [display_token(tokenizer.decode([int(i)])) for i in top.indices]})
        idx = torch.cat([idx, torch.tensor([[nxt]])], dim=1)
    return steps


def _draw_step(ax, step: dict, show: int = 28) -> None:
    from matplotlib.patches import Rectangle

    labels, start = step["labels"], step["start"]
    first = max(0, len(labels) - show)
    ax.set_xlim(-0.5, show + 1.5)
    ax.set_ylim(-0.6, 0.8)
    ax.axis("off")
    for j, i in enumerate(range(first, len(labels))):
        inside = i >= start
        ax.add_patch(Rectangle((j - 0.45, -0.4), 0.9, 0.8, facecolor="#dbe7f5" if inside else "#f2f2f2",
                               edgecolor=COLOUR if inside else "#cccccc", lw=0.8))
        ax.text(j, 0, labels[i], ha="center", va="center", family="monospace", fontsize=9,
                color="black" if inside else "#999999")
    j = len(labels) - first
    ax.add_patch(Rectangle((j - 0.45, -0.4), 0.9, 0.8, facecolor="#fde0c5", edgecolor=CHOSEN, lw=1.2))
    ax.text(j, 0, step["next_label"], ha="center", va="center", family="monospace", fontsize=9, fontweight="bold")
    alts = ", ".join(f"{lab} {p:.3f}" for lab, (_, p) in zip(step["alt_labels"], step["alternatives"]))
    ax.text(-0.4, 0.62, f"window: tokens {step['start']}…{len(labels) - 1} ({len(labels) - step['start']} fed)  →  "
            f"next {step['next_label']!s} (model p = {step['p_next']:.3f});  model's top: {alts}", fontsize=8,
            va="center")


def draw_generation_steps(steps: Sequence[dict]) -> Figure:
    """One row per step: the sequence so far (the window fed to the model framed in blue, older tokens grey)
    and the appended token in orange, with the most likely alternatives."""
    fig, axes = figure(len(steps), 1, figsize=(9, 0.8 * len(steps) + 0.3), squeeze=False)
    for ax, step in zip(axes[:, 0], steps):
        _draw_step(ax, step)
    return fig


def show_generation_stepper(model, tokenizer, prompt: str = "ROMEO:", window: int = 8, n_steps: int = 30,
                            temperature: float = 0.0, static: bool | None = None):
    """W09.3: step through generation; the context window slides over the sequence as tokens are appended.

    Live: a step slider (0 … ``n_steps`` − 1), a window slider and a temperature slider (seeded draws).
    Static: the first 5 steps.
    """

    def build_static():
        return draw_generation_steps(generation_steps(model, tokenizer, prompt, 5, window, temperature))

    def build_live():
        import ipywidgets as w

        step = w.IntSlider(value=0, min=0, max=n_steps - 1, description="step")
        win = w.IntSlider(value=window, min=1, max=min(model_context_length(model), 64), description="window")
        temp = w.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.1, description="temperature")
        cache: dict = {}

        def draw(k, size, t):
            key = (size, t)
            if key not in cache:
                cache.clear()
                cache[key] = generation_steps(model, tokenizer, prompt, n_steps, size, t)
            steps = cache[key]
            return draw_generation_steps(steps[max(0, k - 2):k + 1])

        out, update = redrawing_output(draw)

        def refresh(*_):
            update(k=step.value, size=win.value, t=temp.value)

        for c in (step, win, temp):
            c.observe(refresh, names="value")
        refresh()
        return w.VBox([w.HBox([step, win, temp]), out])

    return live_or_static("W09.3", build_live, build_static, static,
                          caption=f"{prompt!r}, window {window}, T = {temperature:g}: the first 5 steps.")
