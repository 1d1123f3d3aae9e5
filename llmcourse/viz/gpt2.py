"""Widgets of unit 08 (GPT-2): W08.1 parameter sunburst, W08.2 divergence finder, W08.3 architecture map.

Each widget follows :mod:`llmcourse.viz.base`: a pure compute function (tested by pytest), a draw
function that returns a matplotlib ``Figure``, and ``show_<name>(..., static=None)``, which returns the
live ipywidgets UI or, under the ``ci`` profile (or with ``static=True``), one static figure.

=========  ============================  ==========================  ===========================
widget     compute                       draw                        show
=========  ============================  ==========================  ===========================
W08.1      :func:`param_groups`          :func:`draw_param_sunburst` :func:`show_param_sunburst`
W08.2      :func:`layer_divergence`      :func:`draw_divergence`     :func:`show_divergence_finder`
W08.3      :func:`architecture_shapes`   :func:`draw_architecture`   :func:`show_architecture_map`
=========  ============================  ==========================  ===========================

The divergence finder runs a real comparison: a ``transformers.GPT2LMHeadModel`` with every tensor
re-drawn at random, the course's :class:`~llmcourse.models.gpt2.GPT2Model` loaded from it with
:func:`~llmcourse.models.gpt2.load_hf_gpt2`, then one mistake injected into the course model; the bars
are the per-layer max |Δ hidden state| between the two.
"""

from __future__ import annotations

import dataclasses

import torch
from matplotlib.figure import Figure

from ..models.gpt2 import (
    GPT2_PRESETS,
    GPT2Config,
    GPT2Model,
    gpt2_param_breakdown,
    load_hf_gpt2,
    random_hf_gpt2,
)
from .base import figure, live_or_static, redrawing_output

__all__ = [
    "BUGS_TO_INJECT", "architecture_shapes", "draw_architecture", "draw_divergence", "draw_param_sunburst",
    "layer_divergence", "param_groups", "show_architecture_map", "show_divergence_finder", "show_param_sunburst",
]

# ============================================================================ W08.1 parameter sunburst

_GROUP_COLOURS = {"embeddings": "#4C72B0", "blocks": "#DD8452", "final norm": "#55A868", "untied head": "#C44E52"}


def param_groups(cfg: GPT2Config) -> list[tuple[str, str, int]]:
    """The parameters of ``GPT2Model(cfg)`` by component, for the sunburst.

    Returns ``(group, component, count)`` rows, in drawing order: group ``"embeddings"`` (token, position),
    ``"blocks"`` (attention, FFN, norms; all ``n_layers`` blocks together), ``"final norm"``, and
    ``"untied head"`` when ``cfg.tie_weights`` is False. The counts sum to
    :func:`~llmcourse.models.gpt2.gpt2_param_count` (from :func:`~llmcourse.models.gpt2.gpt2_param_breakdown`).
    """
    b = gpt2_param_breakdown(cfg)
    rows = [("embeddings", "token embedding", b["token_embedding"]),
            ("embeddings", "position embedding", b["position_embedding"]),
            ("blocks", "attention", b["attention"]), ("blocks", "feed-forward", b["ffn"]),
            ("blocks", "block norms", b["block_norms"]), ("final norm", "final norm", b["final_norm"])]
    if b["lm_head"]:
        rows.append(("untied head", "lm_head", b["lm_head"]))
    return rows


def _fmt(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else (f"{n / 1e3:.1f}k" if n >= 1e3 else str(n))


def draw_param_sunburst(preset: str = "gpt2-small", tie_weights: bool = True, qkv_bias: bool = True) -> Figure:
    """Two rings: groups inside, components outside; labels give counts and shares of the total."""
    cfg = dataclasses.replace(GPT2Config.preset(preset), tie_weights=tie_weights, qkv_bias=qkv_bias)
    rows = param_groups(cfg)
    total = sum(n for _, _, n in rows)
    groups: dict[str, int] = {}
    for g, _, n in rows:
        groups[g] = groups.get(g, 0) + n
    fig, (ax, legend_ax) = figure(1, 2, figsize=(8.5, 4.6), gridspec_kw={"width_ratios": [1.1, 1.0]})
    ax.pie(list(groups.values()), radius=0.65, colors=[_GROUP_COLOURS[g] for g in groups], startangle=90,
           counterclock=False, wedgeprops={"width": 0.35, "edgecolor": "white"},
           labels=[f"{g}\n{100 * n / total:.1f} %" if n / total > 0.04 else "" for g, n in groups.items()],
           labeldistance=0.73, textprops={"fontsize": 8, "color": "white", "ha": "center", "weight": "bold"})
    shades, seen = [], {}
    for g, _, _ in rows:  # components of one group: the group's colour, lighter for each further one
        k = seen[g] = seen.get(g, -1) + 1
        shades.append(_lighter(_GROUP_COLOURS[g], 0.28 * k))
    wedges, _ = ax.pie([n for _, _, n in rows], radius=1.0, colors=shades, startangle=90, counterclock=False,
                       wedgeprops={"width": 0.33, "edgecolor": "white"})
    ax.set_aspect("equal")
    legend_ax.axis("off")
    legend_ax.legend(wedges, [f"{c}: {n:,} ({100 * n / total:.1f} %)" for _, c, n in rows], loc="center left",
                     fontsize=8.5, frameon=False)
    fig.suptitle(f"{preset} ({'tied' if tie_weights else 'untied'} head, {'with' if qkv_bias else 'no'} "
                 f"Q/K/V bias): {total:,} parameters", fontsize=10)
    return fig


def _lighter(colour: str, amount: float) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def show_param_sunburst(static: bool | None = None):
    """W08.1: a preset dropdown and tied / Q/K/V-bias toggles over the parameter sunburst.

    Static fallback: GPT-2 small with a tied head and Q/K/V biases.
    """

    def build_live():
        import ipywidgets as widgets

        preset = widgets.Dropdown(options=list(GPT2_PRESETS), value="gpt2-small", description="preset")
        tied = widgets.Checkbox(value=True, description="tied head")
        bias = widgets.Checkbox(value=True, description="Q/K/V bias")
        out, update = redrawing_output(draw_param_sunburst)

        def refresh(_change=None):
            update(preset=preset.value, tie_weights=tied.value, qkv_bias=bias.value)

        for c in (preset, tied, bias):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([preset, tied, bias]), out])

    return live_or_static("W08.1", build_live, lambda: draw_param_sunburst("gpt2-small", True, True), static,
                          caption="GPT-2 small, tied head, with Q/K/V biases.")


# ============================================================================ W08.2 divergence finder

BUGS_TO_INJECT = ("none", "no transpose", "exact GELU", "untied", "post-LN")
DIVERGENCE_CONFIG = dict(vocab_size=1000, context_length=128, d_model=64, n_heads=4, n_layers=4, dropout=0.0)


def _forward_states(model: GPT2Model, idx: torch.Tensor, post_ln: bool = False) -> list[torch.Tensor]:
    """Residual stream after the embedding and each block; the last entry goes through ``final_norm``."""
    x = model.embed(idx)
    states = [x]
    for block in model.blocks:
        if post_ln:
            x = block.norm1(x + block.attn(x))
            x = block.norm2(x + block.ffn(x))
        else:
            x = block(x)
        states.append(x)
    states[-1] = model.final_norm(states[-1])
    return states


@torch.no_grad()
def layer_divergence(bug: str = "none", cfg: GPT2Config | None = None, seed: int = 0, threshold: float = 1e-4) -> dict:
    """Where a course GPT-2 with one injected mistake starts to disagree with ``transformers``.

    A random ``GPT2LMHeadModel`` (:func:`~llmcourse.models.gpt2.random_hf_gpt2`, every tensor re-drawn,
    eager attention, eval mode) is loaded into a :class:`GPT2Model` with the course loader; then ``bug``
    (one of :data:`BUGS_TO_INJECT`) is injected: ``"no transpose"`` leaves every attention ``c_proj``
    weight in Conv1D's ``(in, out)`` layout, ``"exact GELU"`` uses the erf form in every FFN,
    ``"untied"`` replaces the head by an independent random matrix, ``"post-LN"`` normalises after each
    residual add instead of before each sublayer. Both models run ``idx = randint(0, V, (2, 16))``.

    Returns:
        dict with ``labels`` (``"embeddings"``, ``"block 1"`` … ``"block L (+ final norm)"``, ``"logits"``),
        ``diffs`` (max |Δ| per entry, floats), ``first`` (index of the first entry above ``threshold``,
        or ``None``), ``threshold`` and ``bug``.

    Raises:
        ValueError: unknown ``bug``.
    """
    if bug not in BUGS_TO_INJECT:
        raise ValueError(f"bug must be one of {BUGS_TO_INJECT}, got {bug!r}")
    cfg = cfg or GPT2Config(**DIVERGENCE_CONFIG)
    hf = random_hf_gpt2(cfg, seed=seed)
    torch.manual_seed(seed)
    model = load_hf_gpt2(GPT2Model(cfg).eval(), hf.state_dict())
    if bug == "no transpose":
        for block in model.blocks:
            block.attn.out_proj.weight.copy_(block.attn.out_proj.weight.T.clone())
    elif bug == "exact GELU":
        for block in model.blocks:
            block.ffn.activation = "gelu"
    elif bug == "untied":
        g = torch.Generator().manual_seed(seed + 1)
        model.lm_head.weight = torch.nn.Parameter(0.2 * torch.randn(model.lm_head.weight.shape, generator=g))
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
    out = hf(idx, output_hidden_states=True)
    ours = _forward_states(model, idx, post_ln=(bug == "post-LN"))
    diffs = [float((a - b).abs().max()) for a, b in zip(ours, out.hidden_states)]
    diffs.append(float((model.lm_head(ours[-1]) - out.logits).abs().max()))
    n = cfg.n_layers
    labels = ["embeddings"] + [f"block {i}" for i in range(1, n)] + [f"block {n} (+ final norm)", "logits"]
    first = next((i for i, d in enumerate(diffs) if d > threshold), None)
    return {"labels": labels, "diffs": diffs, "first": first, "threshold": threshold, "bug": bug}


def draw_divergence(result: dict) -> Figure:
    """Bars of max |Δ| per layer on a log scale; the first diverging layer in red."""
    diffs, labels, first = result["diffs"], result["labels"], result["first"]
    fig, ax = figure(figsize=(7.5, 3.4))
    floor = 1e-9
    heights = [max(d, floor) for d in diffs]
    colours = ["#C44E52" if first is not None and i == first else ("#DD8452" if first is not None and i > first
               else "#55A868") for i in range(len(diffs))]
    ax.bar(range(len(diffs)), heights, color=colours)
    ax.set_yscale("log")
    ax.set_ylim(floor, max(max(heights) * 10, 1.0))
    ax.axhline(result["threshold"], color="grey", lw=1, ls="--")
    ax.text(len(diffs) - 0.5, result["threshold"] * 1.5, f"threshold {result['threshold']:g}", ha="right",
            fontsize=8, color="grey")
    ax.set_xticks(range(len(diffs)), labels, rotation=20, fontsize=8)
    ax.set_ylabel("max |course − transformers|")
    where = "no layer diverges" if first is None else f"first divergence: {labels[first]}"
    ax.set_title(f"injected bug: {result['bug']} — {where}", fontsize=10)
    return fig


def show_divergence_finder(static: bool | None = None, seed: int = 0):
    """W08.2: a "bug to inject" dropdown over the per-layer divergence bars.

    Static fallback: the "no transpose" bug.
    """

    def build_live():
        import ipywidgets as widgets

        choice = widgets.Dropdown(options=list(BUGS_TO_INJECT), value="no transpose", description="bug to inject")
        out, update = redrawing_output(lambda bug: draw_divergence(layer_divergence(bug, seed=seed)))

        def refresh(_change=None):
            update(bug=choice.value)

        choice.observe(refresh, names="value")
        refresh()
        return widgets.VBox([choice, out])

    return live_or_static("W08.2", build_live, lambda: draw_divergence(layer_divergence("no transpose", seed=seed)),
                          static, caption="Injected bug: the attention output projection loaded without transposing.")


# ============================================================================ W08.3 architecture map


def architecture_shapes(cfg: GPT2Config, batch: int = 1, seq: int | None = None) -> list[dict]:
    """Every module's output shape and own parameter count, from a forward pass on the ``meta`` device.

    The model is built and run on ``meta`` (shapes only, no memory), so GPT-2 XL costs nothing. Only
    the embeddings, the first block and the model's tail are listed (every block has the same shapes).

    Returns:
        a list of dicts ``{"name", "kind", "shape", "params"}`` in execution order; one row
        ``"blocks.0.attn.weights"`` gives the per-head attention weights ``(B, H, T, T)`` (computed inside
        the attention, not a module output), and a row ``{"name": "blocks.1 … blocks.{L−1}", "kind": "repeat"}``
        follows the first block when ``n_layers > 1``.
    """
    seq = cfg.context_length if seq is None else seq
    if not 1 <= seq <= cfg.context_length:
        raise ValueError(f"seq must be in 1 … context_length={cfg.context_length}, got {seq}")
    rows: list[dict] = []
    with torch.device("meta"):
        model = GPT2Model(cfg)
        names = {m: n for n, m in model.named_modules()}
        keep = ("tok_emb", "pos_emb", "blocks.0.norm1", "blocks.0.attn.W_query", "blocks.0.attn.W_key",
                "blocks.0.attn.W_value", "blocks.0.attn", "blocks.0.norm2", "blocks.0.ffn.fc1", "blocks.0.ffn.fc2",
                "blocks.0", "final_norm", "lm_head")

        def hook(module, _inputs, output):
            name = names[module]
            if name in keep:
                own = sum(p.numel() for p in module.parameters(recurse=name in ("blocks.0", "blocks.0.attn")))
                rows.append({"name": name, "kind": type(module).__name__, "shape": tuple(output.shape),
                             "params": own})

        for m in model.modules():  # the explicit path calls W_query/W_key/W_value as modules (the fast path fuses them)
            if hasattr(m, "store_weights"):
                m.store_weights = True
        handles = [m.register_forward_hook(hook) for m in model.modules()]
        try:
            model(torch.zeros(batch, seq, dtype=torch.long))
        finally:
            for h in handles:
                h.remove()
    value = next(i for i, r in enumerate(rows) if r["name"] == "blocks.0.attn.W_value")
    rows.insert(value + 1, {"name": "blocks.0.attn.weights", "kind": "attention weights",
                            "shape": (batch, cfg.n_heads, seq, seq), "params": 0})
    if cfg.n_layers > 1:
        block = next(r for r in rows if r["name"] == "blocks.0")
        rows.insert(rows.index(block) + 1, {"name": f"blocks.1 … blocks.{cfg.n_layers - 1}", "kind": "repeat",
                                            "shape": block["shape"], "params": block["params"] * (cfg.n_layers - 1)})
    return rows


_LABELS = {
    "tok_emb": "token embedding", "pos_emb": "position embedding", "blocks.0.norm1": "norm1 (LayerNorm)",
    "blocks.0.attn.W_query": "W_query", "blocks.0.attn.W_key": "W_key", "blocks.0.attn.W_value": "W_value",
    "blocks.0.attn.weights": "attention weights per head, causal",
    "blocks.0.attn": "causal attention (+ out_proj)", "blocks.0.norm2": "norm2 (LayerNorm)",
    "blocks.0.ffn.fc1": "fc1 + GELU (tanh)", "blocks.0.ffn.fc2": "fc2", "blocks.0": "block 1 output (+ residuals)",
    "final_norm": "final norm", "lm_head": "lm_head (tied)",
}


def draw_architecture(preset: str = "gpt2-small", batch: int = 1, seq: int = 1024) -> Figure:
    """The stack as boxes, bottom to top, with each output shape and parameter count."""
    cfg = GPT2Config.preset(preset)
    rows = architecture_shapes(cfg, batch, min(seq, cfg.context_length))
    fig, ax = figure(figsize=(7.5, 0.42 * len(rows) + 1.0))
    ax.axis("off")
    n = len(rows)
    for i, row in enumerate(rows):
        y = i
        label = _LABELS.get(row["name"], row["name"])
        if row["name"] == "lm_head" and not cfg.tie_weights:
            label = "lm_head"
        in_block = row["name"].startswith("blocks.0.")
        colour = "#FBE3D6" if in_block else ("#F4D6A0" if row["kind"] == "repeat" else "#DCE6F2")
        x0 = 0.08 if in_block else 0.0
        ax.add_patch(_box(x0, y, 0.62 - x0, colour))
        ax.text(x0 + 0.02, y + 0.42, label, va="center", fontsize=8)
        ax.text(0.64, y + 0.42, "×".join(str(s) for s in row["shape"]), va="center", fontsize=8, family="monospace")
        params = "shared with token embedding" if (row["name"] == "lm_head" and cfg.tie_weights) else f"{row['params']:,}"
        ax.text(0.86, y + 0.42, params, va="center", fontsize=7, color="#555")
    ax.text(0.64, n + 0.1, "output shape", fontsize=8, weight="bold")
    ax.text(0.86, n + 0.1, "parameters", fontsize=8, weight="bold")
    ax.set_xlim(0, 1.08)
    ax.set_ylim(-0.3, n + 0.6)
    ax.set_title(f"{preset}: D={cfg.d_model}, H={cfg.n_heads} (head_dim {cfg.d_model // cfg.n_heads}), "
                 f"L={cfg.n_layers}, V={cfg.vocab_size:,}, input {batch}×{min(seq, cfg.context_length)}", fontsize=9)
    return fig


def _box(x0, y, width, colour):
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x0, y + 0.08), width, 0.7, boxstyle="round,pad=0.005,rounding_size=0.05",
                          facecolor=colour, edgecolor="#888", linewidth=0.6)


def show_architecture_map(static: bool | None = None):
    """W08.3: preset, batch and sequence-length controls over the architecture map (shapes from a meta-device run).

    Static fallback: GPT-2 small, batch 1, 1,024 tokens.
    """

    def build_live():
        import ipywidgets as widgets

        preset = widgets.Dropdown(options=list(GPT2_PRESETS), value="gpt2-small", description="preset")
        batch = widgets.BoundedIntText(value=1, min=1, max=64, description="batch")
        seq = widgets.IntSlider(value=1024, min=1, max=1024, description="tokens", continuous_update=False)
        out, update = redrawing_output(draw_architecture)

        def refresh(_change=None):
            seq.max = GPT2Config.preset(preset.value).context_length
            update(preset=preset.value, batch=batch.value, seq=seq.value)

        for c in (preset, batch, seq):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([preset, batch, seq]), out])

    return live_or_static("W08.3", build_live, lambda: draw_architecture("gpt2-small", 1, 1024), static,
                          caption="GPT-2 small, one sequence of 1,024 tokens.")
