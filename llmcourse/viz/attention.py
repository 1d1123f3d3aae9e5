"""Widgets of unit 03 (self-attention): 6 widgets, each with a static matplotlib fallback.

Every widget follows :mod:`llmcourse.viz.base`: a pure **compute** function (tensors in, tensors
out; tested in ``tests/test_unit03_viz.py``), a **draw** function that paints a matplotlib
``Figure``, and ``show_<name>(..., static=None)``, which returns the live ipywidgets UI or one
static figure for the default controls.

| #     | function                        | what it shows                                                        |
|-------|---------------------------------|----------------------------------------------------------------------|
| 1     | :func:`show_attention_lab`      | the six-token sentence; scaling, causal mask, 4 masking methods, leakage probe |
| 2     | :func:`show_softmax_sharpness`  | ``softmax(s · z)`` as ``s`` grows, with its entropy                     |
| 3     | :func:`show_variance_vs_dim`    | the spread of ``q·k`` with and without ``÷√d_k``                        |
| 4     | :func:`show_query_geometry`     | keys and one query in 2-D (``d_out = 2``), coloured by attention weight |
| 5     | :func:`show_dropout_on_weights` | inverted dropout on attention weights; row sums                       |
| 6     | :func:`show_sentence_attention` | attention map over the GPT-2 tokens of a real sentence                |

The running example is the syllabus's six-token sentence "Your journey starts with one step":
3-d inputs and ``W_query, W_key, W_value`` drawn with ``torch.rand(3, 2)``
after seed 123 (row-vector convention ``q = x W_q``, ``W_q`` of shape ``(d_in, d_out)``).

Masks follow the course convention: boolean, ``True`` = may attend (:func:`llmcourse.causal_mask`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle
from torch import Tensor

from ..nn.masks import causal_mask
from .base import StaticPNG, figure, live_or_static, redrawing_output

__all__ = [
    "MASK_METHODS", "SHARPNESS_LOGITS", "SIX_TOKENS",
    "attention_heatmap", "attention_lab", "attention_map", "dot_product_samples", "dot_product_variance",
    "dropout_on_weights", "leakage_probe", "masked_attention", "query_geometry", "sentence_tokens",
    "six_token_example", "softmax_sharpness", "token_label", "untrained_head_qk",
    "draw_attention_lab", "draw_dropout_on_weights", "draw_query_geometry", "draw_sentence_attention",
    "draw_softmax_sharpness", "draw_variance_vs_dim",
    "show_attention_lab", "show_dropout_on_weights", "show_query_geometry", "show_sentence_attention",
    "show_softmax_sharpness", "show_variance_vs_dim",
]

SIX_TOKENS = ("Your", "journey", "starts", "with", "one", "step")
_SIX_TOKEN_INPUTS = [[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                     [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]]

#: The four ways of applying a causal mask compared in W03.1 (key -> label shown in the dropdown).
MASK_METHODS = {
    "neg_inf": "−∞ before softmax",
    "zero_fill": "fill 0 before softmax",
    "softmax_zero": "softmax → zero the future",
    "softmax_zero_renorm": "softmax → zero → renormalise",
}

#: The logits of W03.2 (fixture F03.1): softmax(z) = [0.1925, 0.1426, 0.2351, 0.1426, 0.2872].
SHARPNESS_LOGITS = (0.1, -0.2, 0.3, -0.2, 0.5)


# ====================================================================== shared pieces


def six_token_example() -> dict:
    """The running example of unit 03, built without touching global RNG.

    Returns:
        dict with ``tokens`` (6 strings), ``x`` ``(6, 3)`` float32 inputs, and ``W_query``, ``W_key``,
        ``W_value`` ``(3, 2)``: three ``torch.rand(3, 2)`` draws, in that order, from a generator seeded
        with 123 (the same numbers as ``torch.manual_seed(123)`` followed by the three draws).
    """
    g = torch.Generator().manual_seed(123)
    w_q, w_k, w_v = (torch.rand(3, 2, generator=g) for _ in range(3))
    return {"tokens": list(SIX_TOKENS), "x": torch.tensor(_SIX_TOKEN_INPUTS),
            "W_query": w_q, "W_key": w_k, "W_value": w_v}


def token_label(token: str) -> str:
    """A printable axis label for a token string: leading space -> ``␣``, newline -> ``⏎``, tab -> ``⇥``."""
    out = token.replace("\n", "⏎").replace("\t", "⇥")
    if out.startswith(" "):
        out = "␣" + out[1:]
    return out if out else "∅"


def _heatmap(ax, weights: np.ndarray, row_labels, col_labels, annotate: bool, vmax: float | None = 1.0,
             cmap: str = "Blues") -> object:
    t_q, t_k = weights.shape
    finite = weights[np.isfinite(weights)]
    vmax = vmax if vmax is not None else max(float(finite.max()) if finite.size else 1.0, 1e-12)
    im = ax.imshow(weights, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
    ax.set_xticks(range(t_k))
    ax.set_yticks(range(t_q))
    fs = 9 if max(t_q, t_k) <= 8 else (7 if max(t_q, t_k) <= 32 else 6)
    ax.set_xticklabels(col_labels, rotation=90, fontsize=fs)
    ax.set_yticklabels(row_labels, fontsize=fs)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    if annotate:
        for i in range(t_q):
            for j in range(t_k):
                w = weights[i, j]
                txt = "nan" if np.isnan(w) else f"{w:.2f}"
                ax.text(j, i, txt, ha="center", va="center", fontsize=7,
                        color="white" if (np.isfinite(w) and w > 0.6 * vmax) else "black")
    return im


def _row_sum_column(ax, sums: np.ndarray, flags: np.ndarray | None = None) -> None:
    """A one-column panel: each row's sum, green when it is 1 (to 1e-5), orange otherwise."""
    ok = np.isclose(sums, 1.0, atol=1e-5)
    cmap = ListedColormap(["#f6c28b", "#cfe8c0"])
    ax.imshow(ok.astype(float)[:, None], cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for i, s in enumerate(sums):
        label = "nan" if np.isnan(s) else f"{s:.4f}"
        if flags is not None and flags[i]:
            label += "\nleak"
        ax.text(0, i, label, ha="center", va="center", fontsize=7,
                color="crimson" if (flags is not None and flags[i]) else "black")
    ax.set_xticks([0])
    ax.set_xticklabels(["row sum"], fontsize=8)
    ax.set_yticks([])


def attention_heatmap(weights: Tensor, query_labels, key_labels=None, title: str = "",
                      annotate: bool | None = None, figsize: tuple[float, float] = (7, 6)) -> StaticPNG:
    """A displayable heatmap of one ``(T_q, T_k)`` weight matrix (e.g. ``model.attn.last_weights[0]``).

    Args:
        weights: ``(T_q, T_k)`` float tensor or array.
        query_labels: ``T_q`` strings (formatted with :func:`token_label`); key_labels default to them.
        annotate: print each weight in its cell (default: only when both sides are ≤ 12).

    Returns:
        a :class:`~llmcourse.viz.base.StaticPNG` (its ``.figure`` is the matplotlib ``Figure``).

    Raises:
        ValueError: if ``weights`` is not 2-D or the label counts do not match its shape.
    """
    w = torch.as_tensor(weights).detach().float().cpu().numpy()
    key_labels = query_labels if key_labels is None else key_labels
    if w.ndim != 2:
        raise ValueError(f"weights must be a 2-D (T_q, T_k) matrix, got shape {w.shape}; "
                         "pick one batch element, e.g. last_weights[0]")
    if len(query_labels) != w.shape[0] or len(key_labels) != w.shape[1]:
        raise ValueError(f"{len(query_labels)} query labels and {len(key_labels)} key labels do not match "
                         f"weights of shape {w.shape}")
    annotate = (max(w.shape) <= 12) if annotate is None else annotate
    fig, ax = figure(figsize=figsize)
    im = _heatmap(ax, w, [token_label(s) for s in query_labels], [token_label(s) for s in key_labels], annotate)
    fig.colorbar(im, ax=ax, shrink=0.8, label="attention weight")
    if title:
        ax.set_title(title, fontsize=10)
    return StaticPNG(fig)


def _controls_box(controls, out, header: str | None = None):
    import ipywidgets as widgets

    children = []
    if header:
        children.append(widgets.HTML(header))
    children.append(widgets.HBox(list(controls)))
    children.append(out)
    return widgets.VBox(children)


# ====================================================================== W03.1 attention lab


def masked_attention(q: Tensor, k: Tensor, v: Tensor, method: str = "neg_inf", scale: bool = True,
                     causal: bool = True) -> tuple[Tensor, Tensor]:
    """Attention with one of the four causal-masking methods of the attention lab.

    Methods (``causal=True``; with ``causal=False`` all four are plain softmax attention):

    * ``"neg_inf"``: ``masked_fill(~mask, -inf)`` before the softmax (the correct one);
    * ``"zero_fill"``: ``masked_fill(~mask, 0)`` before the softmax (a known mistake: future keys
      keep weight ``exp(0)/Z`` and their values leak into the context);
    * ``"softmax_zero"``: softmax, then zero the future, no renormalisation (a known mistake:
      rows sum to less than 1, and the denominators still contain the future scores);
    * ``"softmax_zero_renorm"``: softmax, zero the future, divide each row by its sum; equal to
      ``"neg_inf"`` up to rounding, because the common denominator cancels.

    Args:
        q: ``(..., T_q, d_k)``; k: ``(..., T_k, d_k)``; v: ``(..., T_k, d_v)``.
        scale: divide the scores by ``√d_k`` (``d_k = k.shape[-1]``).

    Returns:
        ``(context (..., T_q, d_v), weights (..., T_q, T_k))``.

    Raises:
        ValueError: for an unknown ``method``.
    """
    if method not in MASK_METHODS:
        raise ValueError(f"unknown mask method {method!r}; choose one of {list(MASK_METHODS)}")
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(k.shape[-1])
    if not causal:
        weights = torch.softmax(scores, dim=-1)
    else:
        allowed = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        if method == "neg_inf":
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        elif method == "zero_fill":
            weights = torch.softmax(scores.masked_fill(~allowed, 0.0), dim=-1)
        else:
            weights = torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)
            if method == "softmax_zero_renorm":
                weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights @ v, weights


def leakage_probe(x: Tensor, W_query: Tensor, W_key: Tensor, W_value: Tensor, method: str = "neg_inf",
                  scale: bool = True, causal: bool = True, position: int = -1, delta: Tensor | None = None,
                  atol: float = 1e-5) -> tuple[Tensor, Tensor]:
    """Perturb the input token at ``position`` and report which context rows changed.

    With a correct causal mask only rows ``≥ position`` may change (for the last token: only the last
    row). Any earlier row that changes has seen the future.

    Args:
        x: ``(T, d_in)`` inputs; ``W_*``: ``(d_in, d_out)`` projections (row-vector convention).
        position: the token to perturb (default: the last).
        delta: what to add to that token (default: ``[1, -1, 1, …]``).
        atol: a row counts as changed when its largest absolute change exceeds ``atol`` (rounding in
            the renormalised method is ~1e-7).

    Returns:
        ``(changed (T,) bool, max_abs_change (T,) float)``.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be (T, d_in), got shape {tuple(x.shape)}")
    delta = torch.tensor([(-1.0) ** i for i in range(x.shape[-1])]) if delta is None else delta
    x2 = x.clone()
    x2[position] = x2[position] + delta

    def ctx(inp):
        return masked_attention(inp @ W_query, inp @ W_key, inp @ W_value, method, scale, causal)[0]

    diff = (ctx(x2) - ctx(x)).abs().amax(dim=-1)
    return diff > atol, diff


def attention_lab(method: str = "neg_inf", scale: bool = True, causal: bool = True, probe: bool = False,
                  example: dict | None = None) -> dict:
    """Everything the attention lab draws for one setting of its controls (pure; default: the six-token example).

    Returns:
        dict with ``tokens``, ``weights (T, T)``, ``context (T, d_out)``, ``row_sums (T,)``, and, when
        ``probe`` is true, ``changed (T,) bool`` and ``change (T,)`` from :func:`leakage_probe` (else None).
    """
    ex = six_token_example() if example is None else example
    x = ex["x"]
    q, k, v = x @ ex["W_query"], x @ ex["W_key"], x @ ex["W_value"]
    context, weights = masked_attention(q, k, v, method, scale, causal)
    changed = change = None
    if probe:
        changed, change = leakage_probe(x, ex["W_query"], ex["W_key"], ex["W_value"], method, scale, causal)
    return {"tokens": ex["tokens"], "weights": weights, "context": context, "row_sums": weights.sum(-1),
            "changed": changed, "change": change}


def _draw_lab_panel(ax_map, ax_sum, data: dict, title: str) -> None:
    w = data["weights"].numpy()
    labels = data["tokens"]
    _heatmap(ax_map, w, labels, labels, annotate=True)
    flags = None
    if data["changed"] is not None:
        flags = data["changed"].numpy().copy()
        flags[-1] = False  # the perturbed token's own row may change: that is not a leak
        for i in np.flatnonzero(data["changed"].numpy()):
            color = "crimson" if flags[i] else "darkorange"
            ax_map.add_patch(Rectangle((-0.5, i - 0.5), w.shape[1], 1, fill=False, edgecolor=color, lw=2.5))
        n_leak = int(flags.sum())
        title += f"\nprobe: {n_leak} earlier row(s) changed" + (" — LEAK" if n_leak else " — no leak")
    ax_map.set_title(title, fontsize=9)
    _row_sum_column(ax_sum, data["row_sums"].numpy(), flags)


def draw_attention_lab(method: str = "neg_inf", scale: bool = True, causal: bool = True,
                       probe: bool = False):
    """The attention lab for one setting: the weight heatmap with a row-sum column (and probe highlights)."""
    data = attention_lab(method, scale, causal, probe)
    fig, (ax_map, ax_sum) = figure(1, 2, figsize=(7, 4.6), gridspec_kw={"width_ratios": [6, 1.1]})
    setting = f"{MASK_METHODS[method] if causal else 'no mask'}; {'÷√d_k' if scale else 'unscaled'}"
    _draw_lab_panel(ax_map, ax_sum, data, setting)
    if probe:
        fig.suptitle("leakage probe: last token perturbed; boxed rows changed (red = leak from the future)",
                     fontsize=9)
    return fig


def draw_attention_lab_static():
    """The static attention lab: the four masking methods side by side (scaled, causal, probe on)."""
    fig, axes = figure(1, 8, figsize=(17, 4.4), gridspec_kw={"width_ratios": [6, 1.2] * 4})
    for n, method in enumerate(MASK_METHODS):
        data = attention_lab(method, scale=True, causal=True, probe=True)
        _draw_lab_panel(axes[2 * n], axes[2 * n + 1], data, MASK_METHODS[method])
    fig.suptitle("causal masking four ways (÷√d_k). Boxes: rows whose context changed when the "
                 "last token was perturbed.", fontsize=10)
    return fig


def show_attention_lab(static: bool | None = None):
    """The attention lab attention lab: toggles for ``÷√d_k`` and the causal mask, a mask-method dropdown, the weight
    heatmap with row sums, and a leakage-probe button (perturbs the last token and boxes the rows whose
    context changed). Static fallback: four panels, one per masking method, probe on."""

    def build_live():
        import ipywidgets as widgets

        scale = widgets.Checkbox(value=True, description="scale by √d_k", indent=False)
        causal = widgets.Checkbox(value=True, description="causal mask", indent=False)
        method = widgets.Dropdown(options=[(label, key) for key, label in MASK_METHODS.items()],
                                  value="neg_inf", description="mask method")
        probe = widgets.ToggleButton(value=False, description="leakage probe", icon="search",
                                     tooltip="perturb the last token and box the rows that changed")
        out, update = redrawing_output(draw_attention_lab)

        def redraw(_=None):
            update(method=method.value, scale=scale.value, causal=causal.value, probe=probe.value)

        for c in (scale, causal, method, probe):
            c.observe(redraw, names="value")
        redraw()
        return _controls_box([scale, causal, method, probe], out)

    return live_or_static("W03.1", build_live, draw_attention_lab_static, static,
                          caption="The six-token sentence; four masking methods with the leakage probe.")


# ====================================================================== W03.2 softmax sharpness


def softmax_sharpness(s: float, logits=SHARPNESS_LOGITS) -> tuple[Tensor, float]:
    """``softmax(s · z)`` and its entropy in nats (``ln 5 ≈ 1.609`` is the uniform maximum for 5 entries).

    Multiplying scores by ``s`` is dividing by a temperature ``1/s`` (unit 09): large ``s`` -> one-hot.

    Raises:
        ValueError: if ``s`` is not a finite number.
    """
    if not math.isfinite(float(s)):
        raise ValueError(f"s must be a finite number, got {s!r}")
    z = torch.as_tensor(logits, dtype=torch.float64)
    p = torch.softmax(float(s) * z, dim=-1)
    entropy = float(-(p * torch.log(p.clamp_min(1e-300))).sum())
    return p.float(), entropy


def _draw_sharpness_ax(ax, s: float, logits=SHARPNESS_LOGITS) -> None:
    p, h = softmax_sharpness(s, logits)
    idx = np.arange(len(p))
    bars = ax.bar(idx, p.numpy(), color="#4c72b0")
    bars[int(p.argmax())].set_color("#dd8452")
    for i, val in enumerate(p.numpy()):
        ax.text(i, val + 0.01, f"{val:.3f}", ha="center", fontsize=8)
    ax.set_xticks(idx)
    ax.set_xticklabels([f"{v:+.1f}" for v in logits])
    ax.set_xlabel("logit z")
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("softmax(s·z)")
    ax.set_title(f"s = {s:g}: entropy {h:.3f} nats (uniform: {math.log(len(p)):.3f})", fontsize=9)


def draw_softmax_sharpness(s: float = 1.0):
    """The softmax-sharpness widget for one ``s``: bar chart of ``softmax(s·z)`` with its entropy."""
    fig, ax = figure(figsize=(5.5, 3.4))
    _draw_sharpness_ax(ax, s)
    return fig


def draw_softmax_sharpness_static():
    fig, axes = figure(1, 2, figsize=(10, 3.4))
    for ax, s in zip(axes, (1, 8)):
        _draw_sharpness_ax(ax, s)
    fig.suptitle("softmax sharpness: the same scores ×8 give a nearly one-hot distribution", fontsize=10)
    return fig


def show_softmax_sharpness(static: bool | None = None):
    """The softmax-sharpness widget: a slider ``s ∈ [1, 16]`` for ``softmax(s·[0.1, −0.2, 0.3, −0.2, 0.5])`` with its entropy.
    Static fallback: ``s ∈ {1, 8}``."""

    def build_live():
        import ipywidgets as widgets

        s = widgets.FloatSlider(value=1.0, min=1.0, max=16.0, step=0.5, description="scale s",
                                continuous_update=False)
        out, update = redrawing_output(draw_softmax_sharpness)
        s.observe(lambda _: update(s=s.value), names="value")
        update(s=s.value)
        return _controls_box([s], out)

    return live_or_static("W03.2", build_live, draw_softmax_sharpness_static, static,
                          caption="softmax(s·z) for s = 1 and s = 8.")


# ====================================================================== W03.3 variance vs dimension


def dot_product_samples(d_k: int, n_samples: int = 100_000, seed: int = 0,
                        chunk_elems: int = 1 << 22) -> tuple[Tensor, Tensor]:
    """``n_samples`` values of ``q·k`` for ``q, k`` with i.i.d. N(0, 1) components, and the same ÷ √d_k.

    ``Var(q·k) = d_k`` (a sum of ``d_k`` independent products, each of variance 1) and
    ``Var(q·k/√d_k) = 1``. Drawn in chunks of at most ``chunk_elems`` numbers from a
    ``torch.Generator`` seeded with ``seed``, so memory stays small (100,000 × 512 needs no 400 MB).

    Returns:
        ``(raw, scaled)``: two ``(n_samples,)`` float32 tensors.

    Raises:
        ValueError: if ``d_k < 1`` or ``n_samples < 2``.
    """
    if int(d_k) < 1 or int(n_samples) < 2:
        raise ValueError(f"need d_k >= 1 and n_samples >= 2, got d_k={d_k}, n_samples={n_samples}")
    g = torch.Generator().manual_seed(seed)
    rows = max(1, chunk_elems // d_k)
    parts = []
    done = 0
    while done < n_samples:
        n = min(rows, n_samples - done)
        q = torch.randn(n, d_k, generator=g)
        k = torch.randn(n, d_k, generator=g)
        parts.append((q * k).sum(-1))
        done += n
    raw = torch.cat(parts)
    return raw, raw / math.sqrt(d_k)


def dot_product_variance(dims=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), n_samples: int = 4000,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Monte-Carlo ``Var(q·k)`` and ``Var(q·k/√d_k)`` for each ``d_k`` in ``dims`` -> ``(dims, var_raw, var_scaled)``."""
    dims = np.asarray(dims, dtype=int)
    var_raw, var_scaled = [], []
    for d in dims:
        raw, scaled = dot_product_samples(int(d), n_samples, seed)
        var_raw.append(float(raw.var()))
        var_scaled.append(float(scaled.var()))
    return dims, np.array(var_raw), np.array(var_scaled)


def _draw_hist_ax(ax, d_k: int, n_samples: int, seed: int) -> None:
    raw, scaled = dot_product_samples(d_k, n_samples, seed)
    lim = float(max(raw.abs().quantile(0.995), 4.0))
    bins = np.linspace(-lim, lim, 61)
    ax.hist(raw.numpy(), bins=bins, alpha=0.6, color="#dd8452", label=f"q·k  (var {raw.var():.1f})")
    ax.hist(scaled.numpy(), bins=bins, alpha=0.6, color="#4c72b0", label=f"q·k/√d_k  (var {scaled.var():.2f})")
    ax.set_title(f"d_k = {d_k}", fontsize=9)
    ax.set_xlabel("dot product")
    ax.legend(fontsize=7, loc="upper right")


def _draw_curve_ax(ax, curve, mark: int | None = None) -> None:
    dims, var_raw, var_scaled = curve
    ax.loglog(dims, dims, "k:", label="y = d_k")
    ax.loglog(dims, var_raw, "o-", color="#dd8452", label="Var(q·k)")
    ax.loglog(dims, var_scaled, "o-", color="#4c72b0", label="Var(q·k/√d_k)")
    if mark is not None:
        ax.axvline(mark, color="gray", lw=1)
    ax.set_xlabel("d_k")
    ax.set_ylabel("variance")
    ax.set_title("variance grows like d_k; scaling fixes it at 1", fontsize=9)
    ax.legend(fontsize=7)


def draw_variance_vs_dim(d_k: int = 64, n_samples: int = 20_000, seed: int = 0, curve=None):
    """The variance-vs-dimension widget for one ``d_k``: histograms of ``q·k`` raw and scaled, and the variance-vs-d_k curve."""
    curve = dot_product_variance() if curve is None else curve
    fig, (ax_h, ax_c) = figure(1, 2, figsize=(10, 3.6))
    _draw_hist_ax(ax_h, d_k, n_samples, seed)
    _draw_curve_ax(ax_c, curve, mark=d_k)
    return fig


def draw_variance_vs_dim_static(n_samples: int = 20_000, seed: int = 0):
    fig, axes = figure(1, 4, figsize=(16, 3.6))
    for ax, d in zip(axes[:3], (2, 64, 512)):
        _draw_hist_ax(ax, d, n_samples, seed)
    _draw_curve_ax(axes[3], dot_product_variance(seed=seed))
    fig.suptitle("variance vs dimension (q, k with i.i.d. N(0,1) components)", fontsize=10)
    return fig


def show_variance_vs_dim(static: bool | None = None):
    """The variance-vs-dimension widget: a ``d_k`` slider (1–1024), histograms of ``q·k`` with and without ``÷√d_k``, and the variance
    curve. Static fallback: ``d_k ∈ {2, 64, 512}``."""

    def build_live():
        import ipywidgets as widgets

        curve = dot_product_variance()
        d = widgets.IntSlider(value=64, min=1, max=1024, description="d_k", continuous_update=False)
        out, update = redrawing_output(lambda d_k: draw_variance_vs_dim(d_k, curve=curve))
        d.observe(lambda _: update(d_k=d.value), names="value")
        update(d_k=d.value)
        return _controls_box([d], out)

    return live_or_static("W03.3", build_live, draw_variance_vs_dim_static, static,
                          caption="Histograms for d_k = 2, 64, 512 and the variance curve.")


# ====================================================================== W03.4 2-D geometry


def query_geometry(query_index: int = 1, scale: bool = True, example: dict | None = None) -> dict:
    """Keys, one query and its attention weights in the 2-D projection space of the six-token example.

    Returns:
        dict with ``tokens``, ``keys (T, 2)``, ``query (2,)``, ``scores (T,)`` (``q·k_j``, scaled by
        ``1/√2`` when ``scale``) and ``weights (T,)`` (their softmax).

    Raises:
        ValueError: if ``query_index`` is out of range or the projections are not 2-D.
    """
    ex = six_token_example() if example is None else example
    x = ex["x"]
    t = x.shape[0]
    if not -t <= query_index < t:
        raise ValueError(f"query_index must be in [0, {t}), got {query_index}")
    keys = x @ ex["W_key"]
    if keys.shape[-1] != 2:
        raise ValueError(f"the geometry view needs d_out = 2, got {keys.shape[-1]}")
    query = x[query_index] @ ex["W_query"]
    scores = keys @ query
    if scale:
        scores = scores / math.sqrt(keys.shape[-1])
    return {"tokens": ex["tokens"], "keys": keys, "query": query, "scores": scores,
            "weights": torch.softmax(scores, dim=-1), "query_index": query_index % t}


def draw_query_geometry(query_index: int = 1, scale: bool = True):
    """The query geometry for one query: key points coloured (and sized) by weight, the query as an arrow."""
    g = query_geometry(query_index, scale)
    keys, q, w = g["keys"].numpy(), g["query"].numpy(), g["weights"].numpy()
    fig, ax = figure(figsize=(6.2, 4.8))
    sc = ax.scatter(keys[:, 0], keys[:, 1], c=w, cmap="viridis", s=60 + 1200 * w, vmin=0, vmax=float(w.max()),
                    edgecolors="k", zorder=3)
    for j, tok in enumerate(g["tokens"]):
        right = j % 2 == 0
        ax.annotate(f"{tok} {w[j]:.3f}", keys[j], textcoords="offset points", xytext=(10 if right else -10, 0),
                    ha="left" if right else "right", va="center", fontsize=8)
    ax.annotate("", xy=q, xytext=(0, 0), arrowprops={"arrowstyle": "-|>", "color": "crimson", "lw": 2})
    ax.text(q[0], q[1], f"  query: {g['tokens'][g['query_index']]}", color="crimson", fontsize=9)
    pts = np.vstack([keys, q, np.zeros((1, 2))])
    lo, hi = pts.min(0), pts.max(0)
    pad = 0.15 * float((hi - lo).max() + 1e-3)
    ax.set_xlim(lo[0] - 2 * pad, hi[0] + 2 * pad)
    ax.set_ylim(lo[1] - pad, hi[1] + pad)
    ax.axhline(0, color="gray", lw=0.5)
    ax.axvline(0, color="gray", lw=0.5)
    ax.set_aspect("equal")
    ax.set_xlabel("dimension 0")
    ax.set_ylabel("dimension 1")
    ax.set_title("keys coloured by attention weight; weight grows with the projection on the query"
                 + ("" if scale else " (unscaled)"), fontsize=9)
    fig.colorbar(sc, ax=ax, shrink=0.8, label="weight")
    return fig


def show_query_geometry(static: bool | None = None):
    """The query geometry: the six keys as points in 2-D and the selected query as an arrow, keys coloured by their
    attention weight. Static fallback: query "journey"."""

    def build_live():
        import ipywidgets as widgets

        tok = widgets.Dropdown(options=[(t, i) for i, t in enumerate(SIX_TOKENS)], value=1, description="query")
        scale = widgets.Checkbox(value=True, description="scale by √d_k", indent=False)
        out, update = redrawing_output(draw_query_geometry)

        def redraw(_=None):
            update(query_index=tok.value, scale=scale.value)

        tok.observe(redraw, names="value")
        scale.observe(redraw, names="value")
        redraw()
        return _controls_box([tok, scale], out)

    return live_or_static("W03.4", build_live, lambda: draw_query_geometry(1, True), static,
                          caption='Query "journey".')


# ====================================================================== W03.5 dropout on weights


def dropout_on_weights(weights: Tensor, p: float = 0.5, seed: int = 0) -> dict:
    """Inverted dropout on attention weights, drawn from a seeded ``torch.Generator`` (global RNG untouched).

    Each entry survives with probability ``1 − p`` and is then multiplied by ``1/(1 − p)``, so the
    expectation is unchanged (what ``nn.Dropout`` does in training mode). The masks are random [RNG]:
    compare properties, not bits.

    Returns:
        dict with ``dropped`` (same shape), ``keep`` (bool), ``row_sums`` of ``dropped`` and ``p``.

    Raises:
        ValueError: unless ``0 ≤ p < 1``.
    """
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1), got {p}")
    g = torch.Generator().manual_seed(int(seed))
    keep = torch.rand(weights.shape, generator=g) >= p
    dropped = torch.where(keep, weights / (1.0 - p), torch.zeros_like(weights))
    return {"dropped": dropped, "keep": keep, "row_sums": dropped.sum(-1), "p": float(p)}


def _causal_six_token_weights() -> Tensor:
    ex = six_token_example()
    x = ex["x"]
    return masked_attention(x @ ex["W_query"], x @ ex["W_key"], x @ ex["W_value"], "neg_inf", True, True)[1]


def draw_dropout_on_weights(p: float = 0.5, seed: int = 0):
    """The dropout-on-weights widget: causal weights of the six-token example before and after inverted dropout, with row sums."""
    w = _causal_six_token_weights()
    d = dropout_on_weights(w, p, seed)
    fig, axes = figure(1, 4, figsize=(12, 4.2), gridspec_kw={"width_ratios": [6, 1.2, 6, 1.2]})
    vmax = 1.0 / (1.0 - p) if p < 1 else 1.0
    _heatmap(axes[0], w.numpy(), SIX_TOKENS, SIX_TOKENS, annotate=True, vmax=vmax)
    axes[0].set_title("weights (eval mode: dropout is the identity)", fontsize=9)
    _row_sum_column(axes[1], w.sum(-1).numpy())
    _heatmap(axes[2], d["dropped"].numpy(), SIX_TOKENS, SIX_TOKENS, annotate=True, vmax=vmax)
    axes[2].set_title(f"train mode, p = {p:g}: survivors ×{1 / (1 - p):.3g} [RNG seed {seed}]", fontsize=9)
    _row_sum_column(axes[3], d["row_sums"].numpy())
    fig.suptitle("dropout on attention weights: rows no longer sum to 1", fontsize=10)
    return fig


def show_dropout_on_weights(static: bool | None = None):
    """The dropout-on-weights widget: a ``p`` slider and a reseed button; heatmaps before/after inverted dropout with row sums.
    Static fallback: ``p = 0.5``, seed 0 (labelled [RNG])."""

    def build_live():
        import ipywidgets as widgets

        p = widgets.FloatSlider(value=0.5, min=0.0, max=0.9, step=0.05, description="p", continuous_update=False)
        reseed = widgets.Button(description="reseed", icon="refresh")
        state = {"seed": 0}
        out, update = redrawing_output(draw_dropout_on_weights)

        def redraw(_=None):
            update(p=p.value, seed=state["seed"])

        def on_reseed(_):
            state["seed"] += 1
            redraw()

        p.observe(redraw, names="value")
        reseed.on_click(on_reseed)
        redraw()
        return _controls_box([p, reseed], out)

    return live_or_static("W03.5", build_live, lambda: draw_dropout_on_weights(0.5, 0), static,
                          caption="p = 0.5, one random mask [RNG].")


# ====================================================================== W03.6 a real sentence


def sentence_tokens(text: str, max_tokens: int = 30, encoding=None) -> tuple[list[int], list[str]]:
    """The first ``max_tokens`` GPT-2 token ids of ``text`` and their strings (``enc.decode([id])``).

    Raises:
        ValueError: if ``text`` has no tokens or ``max_tokens < 1``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if encoding is None:
        from ..data import gpt2_encoding

        encoding = gpt2_encoding()
    ids = encoding.encode(text)[:max_tokens]
    if not ids:
        raise ValueError("the text produced no tokens; pass a non-empty sentence")
    return ids, [encoding.decode([i]) for i in ids]


def untrained_head_qk(ids, d_model: int = 64, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Queries and keys of an **untrained**, seeded attention head for the token ids ``ids``.

    Each token id gets a fixed random embedding ``x ~ N(0, I_D)`` (from a generator seeded with
    ``seed·1_000_003 + id``, so a repeated token gets the same vector and the result does not depend on
    the rest of the vocabulary). ``W_query`` and ``W_key`` are ``(D, D)`` with N(0, 1/D) entries
    (seed ``seed``), so ``q`` and ``k`` have roughly unit-variance components and ``Var(q·k) ≈ D``.
    There is no positional information: equal tokens get equal keys.

    Returns:
        ``(q, k)``: ``(T, D)`` float32 each.
    """
    if d_model < 1:
        raise ValueError(f"d_model must be >= 1, got {d_model}")
    rows = []
    for i in ids:
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(i))
        rows.append(torch.randn(d_model, generator=g))
    x = torch.stack(rows)
    g = torch.Generator().manual_seed(int(seed))
    w_q = torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model)
    w_k = torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model)
    return x @ w_q, x @ w_k


def attention_map(q: Tensor, k: Tensor, scale: bool = True, causal: bool = True,
                  temperature: float = 1.0) -> Tensor:
    """Attention weights ``softmax(q kᵀ / (√d_k if scale) / temperature)``, causally masked if asked.

    Args:
        q: ``(T_q, d_k)``; k: ``(T_k, d_k)``.
        temperature: > 0; below 1 sharpens, above 1 flattens (the same knob as in sampling, unit 09).

    Returns:
        ``(T_q, T_k)`` weights whose rows sum to 1.

    Raises:
        ValueError: if ``temperature <= 0`` or the widths of q and k differ.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k need the same width d_k, got {q.shape[-1]} and {k.shape[-1]}")
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(k.shape[-1])
    scores = scores / temperature
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], device=q.device), float("-inf"))
    return torch.softmax(scores, dim=-1)


def _default_sentence() -> str:
    from ..data import load_text

    text = load_text("the-verdict")
    return text.split("\n", 1)[0]


def draw_sentence_attention(tokens, q: Tensor, k: Tensor, scale: bool = True, causal: bool = True,
                            temperature: float = 1.0):
    """The sentence attention map for one setting: the ``(T, T)`` weight heatmap with the token strings as axis labels."""
    w = attention_map(q, k, scale, causal, temperature)
    labels = [token_label(s) for s in tokens]
    fig, ax = figure(figsize=(8.2, 7.2))
    im = _heatmap(ax, w.numpy(), labels, labels, annotate=False)
    fig.colorbar(im, ax=ax, shrink=0.75, label="attention weight")
    top = w.max(dim=-1).values.mean()
    ax.set_title(f"{'÷√d_k' if scale else 'unscaled'}, {'causal' if causal else 'no mask'}, "
                 f"temperature {temperature:g}: mean of each row's largest weight {top:.2f}", fontsize=9)
    return fig


def show_sentence_attention(text: str | None = None, max_tokens: int = 30, d_model: int = 64, seed: int = 0,
                            q: Tensor | None = None, k: Tensor | None = None, static: bool | None = None,
                            tokens: list[str] | None = None, unit: str = "GPT-2 tokens"):
    """The sentence attention map: an attention map over the GPT-2 tokens of a real sentence, with toggles for ``÷√d_k`` and the
    causal mask and a temperature slider. Static fallback: scaled, causal, temperature 1.

    By default the text is the first line of the bundled story "the-verdict", tokenised with
    :func:`llmcourse.gpt2_encoding`, and ``q``/``k`` come from :func:`untrained_head_qk` (a fixed,
    seeded, untrained head: the pattern itself is random; the controls show how scaling, masking and
    temperature reshape it). Pass ``q`` and ``k`` (``(T, d_k)``, with ``T`` = the number of tokens) to
    show another head, for example a trained one. ``tokens`` (with ``q`` and ``k``) replaces the GPT-2
    tokenisation by your own labels, one per row (e.g. the characters of a character-level model);
    ``unit`` names them in the header.

    Raises:
        ValueError: ``q`` without ``k`` (or the reverse), ``tokens`` without ``q``/``k``, or a row count
            that differs from the number of tokens.
    """
    if (q is None) != (k is None):
        raise ValueError("pass both q and k, or neither")
    if tokens is not None:
        if q is None:
            raise ValueError("tokens needs q and k (one row per token)")
        tokens = list(tokens)
    else:
        text = _default_sentence() if text is None else text
        ids, tokens = sentence_tokens(text, max_tokens)
    head_kind = "the head you passed" if q is not None else "an untrained seeded head"
    if q is None:
        q, k = untrained_head_qk(ids, d_model, seed)
    if q.shape[0] != len(tokens) or k.shape[0] != len(tokens):
        raise ValueError(f"q and k must have one row per token ({len(tokens)}), got {tuple(q.shape)}, {tuple(k.shape)}")

    def draw(scale=True, causal=True, temperature=1.0):
        return draw_sentence_attention(tokens, q, k, scale, causal, temperature)

    def build_live():
        import ipywidgets as widgets

        scale = widgets.Checkbox(value=True, description="scale by √d_k", indent=False)
        causal = widgets.Checkbox(value=True, description="causal mask", indent=False)
        temp = widgets.FloatSlider(value=1.0, min=0.1, max=4.0, step=0.1, description="temperature",
                                   continuous_update=False)
        temp.add_class("llmcourse-temperature")
        causal.add_class("llmcourse-causal")
        scale.add_class("llmcourse-scale")
        out, update = redrawing_output(draw)

        def redraw(_=None):
            update(scale=scale.value, causal=causal.value, temperature=temp.value)

        for c in (scale, causal, temp):
            c.observe(redraw, names="value")
        redraw()
        header = f"<b>Attention over {len(tokens)} {unit}</b> ({head_kind})"
        return _controls_box([scale, causal, temp], out, header=header)

    return live_or_static("W03.6", build_live, draw, static,
                          caption=f"{len(tokens)} {unit}; scaled, causal, temperature 1.")
