"""Widgets of unit 17 (the capstone): the training dashboard, the generation panel and the comparison table.

* W17.1 :func:`show_capstone_dashboard` — the three models' training losses on a shared token axis (moving
  average slider), DeepSeek's MTP loss, the expert-load max/mean ratio with and without the bias update, and the
  measured ms/step. Data: the per-step records of :func:`llmcourse.models.deepseek.compare_models` (``on_step``).
* W17.2 :func:`show_generation_panel` — a prompt box and a model selector: greedy output of the chosen model and
  the cache bytes each model would hold after that many tokens (read from the DeepSeek cache object; the
  formulas of unit 12 for the others). Static: the prompt ``"ROMEO:"`` for every model.
* W17.3 :func:`show_comparison_table` — the comparison rows (total/active parameters, ms/step, GFLOP/step when
  given, validation loss, cache elements per token) and the FP8 delta, sortable by a column.
"""

from __future__ import annotations

from .base import figure, live_or_static, redrawing_output

__all__ = ["draw_capstone_dashboard", "draw_comparison_table", "draw_generation", "generation_record",
           "show_capstone_dashboard", "show_comparison_table", "show_generation_panel", "smooth"]

_COLORS = {0: "#546e7a", 1: "#2e7d32", 2: "#1565c0", 3: "#ef6c00"}


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` values (``window = 1`` returns the values)."""
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


# ------------------------------------------------------------------------------------------------ W17.1


def draw_capstone_dashboard(curves: dict, loads: dict, ms: dict, tokens_per_step: int, window: int = 10):
    """Left: training loss vs tokens seen per model (``curves[name] = list of losses per step``), DeepSeek's MTP loss
    when ``curves`` has ``"mtp"``. Middle: expert-load max/mean per step for each entry of ``loads`` (e.g. bias on /
    off). Right: ms/step per model (``ms[name]``)."""
    fig, (a1, a2, a3) = figure(1, 3, figsize=(13.5, 3.6))
    for i, (name, ys) in enumerate(curves.items()):
        xs = [tokens_per_step * (s + 1) for s in range(len(ys))]
        a1.plot(xs, smooth(ys, window), label=name, color=_COLORS[i % 4], ls="--" if name == "mtp" else "-")
    a1.set_xlabel("tokens seen")
    a1.set_ylabel(f"training loss (mean of {window} steps)")
    a1.legend(fontsize=8)
    for i, (name, ys) in enumerate(loads.items()):
        a2.plot(range(len(ys)), smooth(ys, window), label=name, color=_COLORS[(i + 1) % 4])
    a2.axhline(1.0, color="#999", lw=0.8)
    a2.set_xlabel("step")
    a2.set_ylabel("expert load max / mean")
    a2.legend(fontsize=8)
    names = list(ms)
    a3.bar(names, [ms[n] for n in names], color=[_COLORS[i % 4] for i in range(len(names))])
    a3.set_ylabel("ms per training step (measured)")
    return fig


def show_capstone_dashboard(curves: dict, loads: dict, ms: dict, tokens_per_step: int, static: bool | None = None):
    """W17.1: a smoothing slider over the dashboard. Static: a 10-step average."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda window: draw_capstone_dashboard(curves, loads, ms, tokens_per_step,
                                                                              window))
        w = widgets.IntSlider(value=10, min=1, max=50, description="moving average")
        w.observe(lambda ch: update(window=ch["new"]), names="value")
        update(window=10)
        return widgets.VBox([w, out])

    return live_or_static("W17.1", build_live, lambda: draw_capstone_dashboard(curves, loads, ms, tokens_per_step),
                          static, caption="Three models on identical batches: loss per token seen, expert balance "
                                          "with and without the bias update, time per step.")


# ------------------------------------------------------------------------------------------------ W17.2


def generation_record(models: dict, tokenizer, prompt: str, max_new_tokens: int,
                      context_length: int | None = None) -> dict:
    """Greedy continuations of ``prompt`` by each model and the bytes of their caches per generated position.

    ``context_length`` (the window the models were **trained** on): when given, the continuation stops there
    (``min(max_new_tokens, context_length − len(prompt))`` new tokens, at least 0), so no model is asked for
    positions it never saw in training (``"new_tokens"`` in the record says how many were generated).

    ``models[name]`` is a course model (``DeepSeekLM``, ``Llama3Model``, ``GPT2Model``) in eval mode. The DeepSeek
    model generates with :func:`~llmcourse.models.deepseek.generate_latent_cached` and its bytes are read from the
    returned cache (``nbytes() / seq_len`` per position); the others decode without a cache and their bytes per
    position come from :func:`~llmcourse.models.deepseek.cache_elems_per_token` × 4 (float32).
    Returns ``{"text": {name: str}, "bytes_per_token": {name: int}, "measured": name or None}``.
    """
    import torch

    from ..models.deepseek import DeepSeekLM, cache_elems_per_token, generate_latent_cached, greedy_uncached

    ids = torch.tensor([tokenizer.encode(prompt)])
    if context_length is not None:
        ids = ids[:, -context_length:]
        max_new_tokens = max(0, min(max_new_tokens, context_length - ids.shape[1]))
    text, per_tok, measured = {}, {}, None
    for name, m in models.items():
        if isinstance(m, DeepSeekLM):
            toks, cache = generate_latent_cached(m, ids, max_new_tokens)
            per_tok[name] = cache.nbytes() // max(cache.seq_len, 1)
            measured = name
        else:
            toks = greedy_uncached(m, ids, max_new_tokens)
            per_tok[name] = 4 * cache_elems_per_token(m)
        text[name] = tokenizer.decode(toks[0, ids.shape[1]:].tolist())
    return {"text": text, "bytes_per_token": per_tok, "measured": measured, "prompt": prompt,
            "new_tokens": max_new_tokens}


def draw_generation(record: dict, selected: str | None = None, max_tokens: int = 2048):
    """Left: the continuation(s) as text. Right: cache bytes vs sequence length for every model."""
    fig, (a1, a2) = figure(1, 2, figsize=(12.5, 4.0), gridspec_kw={"width_ratios": [1.5, 1]})
    a1.axis("off")
    names = [selected] if selected else list(record["text"])
    y = 0.98
    for name in names:
        body = (record["prompt"] + record["text"][name]).replace("\n", " ⏎ ")
        lines = [body[i:i + 70] for i in range(0, min(len(body), 280), 70)]
        a1.text(0.0, y, f"{name}:", fontsize=9, weight="bold", va="top", transform=a1.transAxes)
        a1.text(0.0, y - 0.06, "\n".join(lines), fontsize=8, va="top", family="monospace", transform=a1.transAxes)
        y -= 0.08 + 0.055 * len(lines)
    xs = list(range(0, max_tokens + 1, max_tokens // 16))
    for i, (name, b) in enumerate(record["bytes_per_token"].items()):
        tag = " (read from the cache)" if name == record["measured"] else " (formula)"
        a2.plot(xs, [b * x / 1024 for x in xs], label=f"{name}: {b} B/token{tag}", color=_COLORS[i % 4])
    a2.set_xlabel("tokens in the cache")
    a2.set_ylabel("cache size (KiB, float32, one sequence)")
    a2.legend(fontsize=8)
    return fig


def show_generation_panel(models: dict, tokenizer, record: dict, max_new_tokens: int = 100,
                          static: bool | None = None, context_length: int | None = None):
    """W17.2: a prompt box, a model selector and a generate button. Static: ``record`` (the ``"ROMEO:"`` run).
    ``context_length``: the trained window; generation stops there (see :func:`generation_record`)."""

    def build_live():
        import ipywidgets as widgets

        state = {"record": record}
        out, update = redrawing_output(lambda selected: draw_generation(state["record"], selected or None))
        prompt = widgets.Text(value=record["prompt"], description="prompt")
        pick = widgets.Dropdown(options=["(all)"] + list(models), value="(all)", description="model")
        go = widgets.Button(description="generate")

        def run(_=None):
            state["record"] = generation_record(models, tokenizer, prompt.value or "\n", max_new_tokens,
                                                context_length)
            update(selected=None if pick.value == "(all)" else pick.value)

        go.on_click(run)
        pick.observe(lambda ch: update(selected=None if ch["new"] == "(all)" else ch["new"]), names="value")
        update(selected=None)
        return widgets.VBox([widgets.HBox([prompt, pick, go]), out])

    return live_or_static("W17.2", build_live, lambda: draw_generation(record), static,
                          caption="Greedy continuations and the cache each model holds per token.")


# ------------------------------------------------------------------------------------------------ W17.3


_COLUMNS = [("name", "model", "{}"), ("total_params", "total params", "{:,}"),
            ("active_params", "active params", "{:,}"), ("ms_per_step", "ms/step", "{:.0f}"),
            ("gflops_per_step", "GFLOP/step", "{:.2f}"),
            ("val_loss", "val loss", "{:.3f}"), ("cache_elems_per_token", "cache elems/token", "{:,}")]
_OPTIONAL = ("gflops_per_step",)   # shown when some row has it


def _columns(rows: list[dict]) -> list[tuple[str, str, str]]:
    return [c for c in _COLUMNS if c[0] not in _OPTIONAL or any(r.get(c[0]) is not None for r in rows)]


def draw_comparison_table(rows: list[dict], fp8_delta: float | None = None, sort_by: str = "name"):
    """The comparison rows as a table (sorted by ``sort_by``, rows without that value last), the FP8 delta of the
    DeepSeek model as a caption. A row may leave columns out (shown as "—"), e.g. a row that only measured the cost
    of a step; the GFLOP/step column appears when some row has ``gflops_per_step``."""
    rows = sorted(rows, key=lambda r: (r.get(sort_by) is None, r.get(sort_by) if r.get(sort_by) is not None else 0))
    cols = _columns(rows)
    fig, ax = figure(1, 1, figsize=(10.5 + 1.2 * (len(cols) - 6), 0.7 + 0.45 * (len(rows) + 1)))
    ax.axis("off")
    cells = [["—" if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in cols] for r in rows]
    table = ax.table(cellText=cells, colLabels=[label for _, label, _ in cols], loc="center", cellLoc="center")
    table.scale(1, 1.4)
    if fp8_delta is not None:
        ax.set_title(f"FP8 inference of the trained DeepSeek: validation loss {fp8_delta:+.4f} nats", fontsize=10)
    return fig


def show_comparison_table(rows: list[dict], fp8_delta: float | None = None, static: bool | None = None):
    """W17.3: the table with a sort selector. Static: sorted by name."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda sort_by: draw_comparison_table(rows, fp8_delta, sort_by))
        w = widgets.Dropdown(options=[(label, k) for k, label, _ in _columns(rows)], value="name",
                             description="sort by")
        w.observe(lambda ch: update(sort_by=ch["new"]), names="value")
        update(sort_by="name")
        return widgets.VBox([w, out])

    return live_or_static("W17.3", build_live, lambda: draw_comparison_table(rows, fp8_delta), static,
                          caption="Measured at this tiny scale on identical batches; differences of a few "
                                  "hundredths of a nat are within run-to-run noise.")
