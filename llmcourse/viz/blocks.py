"""Widgets of unit 05 (transformer blocks): W05.1–W05.5, each with a static matplotlib fallback.

Every widget follows :mod:`llmcourse.viz.base`: a pure **compute** function (tested in
``tests/test_unit05_transformer_blocks.py``), a **draw** function painting a matplotlib ``Figure``
and ``show_<name>(..., static=None)`` returning the live ipywidgets UI or one static figure.

| id    | function                         | what it shows                                                     |
|-------|----------------------------------|-------------------------------------------------------------------|
| W05.1 | :func:`show_layernorm`           | one token's features before/after LayerNorm, with γ and β         |
| W05.2 | :func:`show_activations`         | ReLU, GELU (exact), GELU (tanh) and exact − tanh (×10³)           |
| W05.3 | :func:`show_residual_gradients`  | per-layer mean abs gradient with and without shortcuts (log scale) |
| W05.4 | :func:`show_pre_post_ln`         | residual-stream RMS and gradient norm per layer, pre-LN vs post-LN |
| W05.5 | :func:`show_block_diagram`       | encoder/decoder block with tensor shapes for (B, T, D, H, d_ff)    |
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.patches import FancyBboxPatch
from torch import nn

from ..nn.blocks import EncoderBlock
from ..nn.feedforward import gelu
from ..nn.norms import LayerNorm
from .base import figure, live_or_static, redrawing_output

__all__ = [
    "ACTIVATION_CHOICES",
    "activation_curves", "block_cost", "block_shapes", "layernorm_demo", "pre_post_ln_profile",
    "residual_gradient_profile",
    "draw_activations", "draw_block_diagram", "draw_layernorm", "draw_pre_post_ln", "draw_residual_gradients",
    "show_activations", "show_block_diagram", "show_layernorm", "show_pre_post_ln", "show_residual_gradients",
]

#: activations of the W05.3 dropdown (name -> module factory)
ACTIVATION_CHOICES = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "gelu": nn.GELU}


def _controls_box(controls, out):
    import ipywidgets as widgets

    return widgets.VBox([widgets.HBox(list(controls)), out])


# ====================================================================== W05.1 LayerNorm


def layernorm_demo(gamma: float = 1.0, beta: float = 0.0, token: int = 0, seq_len: int = 8, d_model: int = 16,
                   seed: int = 0) -> dict:
    """A random ``(seq_len, d_model)`` batch (scale 3, shift 2) through ``LayerNorm`` with weight γ, bias β.

    Returns:
        dict with ``x`` and ``y`` ``(seq_len, d_model)``, and for the selected ``token``:
        ``mean_in``, ``std_in``, ``mean_out``, ``std_out`` (biased std, floats). With γ=1, β=0 the
        output has mean 0 and biased std ``sqrt(1 − eps/(σ²+eps)) ≈ 1``; in general mean β and std |γ|.

    Raises:
        ValueError: when ``token`` is not in ``[0, seq_len)``.
    """
    if not 0 <= token < seq_len:
        raise ValueError(f"token must be in [0, {seq_len}), got {token}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(seq_len, d_model, generator=g) * 3.0 + 2.0
    ln = LayerNorm(d_model)
    with torch.no_grad():
        ln.weight.fill_(gamma)
        ln.bias.fill_(beta)
        y = ln(x)
    xi, yi = x[token], y[token]
    return {"x": x, "y": y, "mean_in": xi.mean().item(), "std_in": xi.std(unbiased=False).item(),
            "mean_out": yi.mean().item(), "std_out": yi.std(unbiased=False).item()}


def _draw_ln_axes(ax_in, ax_out, gamma, beta, token):
    d = layernorm_demo(gamma, beta, token)
    bins = np.linspace(-8, 10, 37)
    ax_in.hist(d["x"][token].numpy(), bins=bins, color="#9ecae1", edgecolor="k")
    ax_in.set_title(f"token {token} before: mean {d['mean_in']:.3f}, std {d['std_in']:.3f}", fontsize=9)
    ax_out.hist(d["y"][token].numpy(), bins=bins, color="#fdae6b", edgecolor="k")
    ax_out.set_title(f"after (γ={gamma:g}, β={beta:g}): mean {d['mean_out']:.3f}, std {d['std_out']:.3f}",
                     fontsize=9)
    for ax in (ax_in, ax_out):
        ax.set_xlabel("feature value")
    ax_in.set_ylabel("count of features")


def draw_layernorm(gamma: float = 1.0, beta: float = 0.0, token: int = 0):
    """W05.1 for one setting: histograms of the token's 16 features before and after."""
    fig, (a, b) = figure(1, 2, figsize=(10, 3.2))
    _draw_ln_axes(a, b, gamma, beta, token)
    return fig


def draw_layernorm_static():
    fig, axes = figure(2, 2, figsize=(10, 6))
    for row, (g, b) in enumerate(((1.0, 0.0), (2.0, 1.0))):
        _draw_ln_axes(axes[row, 0], axes[row, 1], g, b, 0)
    fig.suptitle("LayerNorm: each token is standardised over its features, then scaled by γ and shifted "
                 "by β", fontsize=10)
    return fig


def show_layernorm(static: bool | None = None):
    """W05.1: γ and β sliders and a token selector over a random ``(8, 16)`` batch. Static: (γ, β) = (1, 0), (2, 1)."""

    def build_live():
        import ipywidgets as widgets

        g = widgets.FloatSlider(value=1.0, min=-3.0, max=3.0, step=0.25, description="γ (weight)",
                                continuous_update=False)
        b = widgets.FloatSlider(value=0.0, min=-3.0, max=3.0, step=0.25, description="β (bias)",
                                continuous_update=False)
        t = widgets.IntSlider(value=0, min=0, max=7, description="token", continuous_update=False)
        out, update = redrawing_output(draw_layernorm)

        def redraw(_=None):
            update(gamma=g.value, beta=b.value, token=t.value)

        for w in (g, b, t):
            w.observe(redraw, names="value")
        redraw()
        return _controls_box([g, b, t], out)

    return live_or_static("W05.1", build_live, draw_layernorm_static, static,
                          caption="Token 0 with γ=1, β=0 (top) and γ=2, β=1 (bottom).")


# ====================================================================== W05.2 activations


def activation_curves(lo: float = -4.0, hi: float = 4.0, n: int = 801) -> dict:
    """ReLU, exact GELU and tanh-GELU on ``linspace(lo, hi, n)`` (float64), and exact − tanh.

    Returns:
        dict of numpy arrays ``x``, ``relu``, ``gelu``, ``gelu_tanh``, ``diff`` (= gelu − gelu_tanh).
    """
    x = torch.linspace(lo, hi, n, dtype=torch.float64)
    exact, approx = gelu(x, "none"), gelu(x, "tanh")
    return {"x": x.numpy(), "relu": torch.relu(x).numpy(), "gelu": exact.numpy(), "gelu_tanh": approx.numpy(),
            "diff": (exact - approx).numpy()}


def draw_activations():
    """W05.2: the three activations, and their difference ×10³ on a second panel."""
    c = activation_curves()
    fig, (a, b) = figure(1, 2, figsize=(10, 3.4))
    a.plot(c["x"], c["relu"], label="ReLU", color="0.4")
    a.plot(c["x"], c["gelu"], label="GELU (exact, erf)", lw=2.5)
    a.plot(c["x"], c["gelu_tanh"], "--", label="GELU (tanh)", color="tab:red")
    a.axhline(0, color="k", lw=0.5)
    a.legend(fontsize=8)
    a.set_title("activations on [−4, 4]", fontsize=9)
    b.plot(c["x"], 1e3 * c["diff"], color="tab:purple")
    i = int(np.argmax(np.abs(c["diff"])))
    b.plot([c["x"][i]], [1e3 * c["diff"][i]], "o", color="k")
    b.annotate(f"max |diff| {abs(c['diff'][i]):.2e}\nat x = {c['x'][i]:.2f}", (c["x"][i], 1e3 * c["diff"][i]),
               textcoords="offset points", xytext=(10, -10), fontsize=8)
    b.axhline(0, color="k", lw=0.5)
    b.set_title("GELU exact − GELU tanh (×10³)", fontsize=9)
    for ax in (a, b):
        ax.set_xlabel("x")
    return fig


def show_activations(static: bool | None = None):
    """W05.2: a figure with no controls; the live and static versions are the same plot."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(draw_activations)
        update()
        return widgets.VBox([out])

    return live_or_static("W05.2", build_live, draw_activations, static,
                          caption="The two GELUs differ by less than 5e-4 everywhere.")


# ====================================================================== W05.3 residual gradients


def residual_gradient_profile(depth: int = 8, shortcut: bool = False, activation: str = "sigmoid", d: int = 16,
                              seed: int = 123) -> list[float]:
    """Mean ``|grad|`` of each layer's weight in ``depth`` × [``Linear(d, d)``, activation] (fixture F05.4).

    Recipe: ``torch.manual_seed(seed)``; the layers are created in order; input ``ones(4, d)``; each layer
    maps ``x -> act(linear(x))``, or ``x -> x + act(linear(x))`` with ``shortcut``; loss ``mean(out²)``.
    The global torch generator is saved and restored, so calling this does not disturb a notebook's seeds.

    Returns:
        ``depth`` floats, first layer first. For ``depth=8`` and sigmoid: first layer ≈ 2.7e-08 without
        shortcuts and ≈ 1.5e-01 with them (F05.4).

    Raises:
        ValueError: for ``depth < 1`` or an activation not in :data:`ACTIVATION_CHOICES`.
    """
    if depth < 1:
        raise ValueError(f"depth must be ≥ 1, got {depth}")
    if activation not in ACTIVATION_CHOICES:
        raise ValueError(f"activation must be one of {sorted(ACTIVATION_CHOICES)}, got {activation!r}")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layers = [nn.Sequential(nn.Linear(d, d), ACTIVATION_CHOICES[activation]()) for _ in range(depth)]
    x = torch.ones(4, d)
    for layer in layers:
        x = x + layer(x) if shortcut else layer(x)
    (x ** 2).mean().backward()
    return [layer[0].weight.grad.abs().mean().item() for layer in layers]


def _draw_grad_ax(ax, depth, activation, which=("without", "with")):
    idx = np.arange(1, depth + 1)
    width = 0.4 if len(which) == 2 else 0.8
    for k, name in enumerate(which):
        g = residual_gradient_profile(depth, name == "with", activation)
        ax.bar(idx + (k - (len(which) - 1) / 2) * width, g, width=width, label=f"{name} shortcuts",
               color="tab:blue" if name == "with" else "tab:red")
    ax.set_yscale("log")
    ax.set_xlabel("layer (1 = closest to the input)")
    ax.set_ylabel("mean |∂loss/∂W|")
    ax.set_title(f"depth {depth}, {activation}", fontsize=9)
    ax.legend(fontsize=8)


def draw_residual_gradients(depth: int = 8, shortcut: bool = True, activation: str = "sigmoid"):
    """W05.3 for one setting: log-scale bars of per-layer mean |grad|."""
    fig, ax = figure(figsize=(7, 3.6))
    _draw_grad_ax(ax, depth, activation, which=("with",) if shortcut else ("without",))
    return fig


def draw_residual_gradients_static():
    fig, ax = figure(figsize=(8, 3.8))
    _draw_grad_ax(ax, 8, "sigmoid")
    fig.suptitle("gradient flow: without shortcuts the first layer's gradient vanishes", fontsize=10)
    return fig


def show_residual_gradients(static: bool | None = None):
    """W05.3: depth slider (2–32), shortcut toggle, activation dropdown. Static: depth 8, both variants."""

    def build_live():
        import ipywidgets as widgets

        depth = widgets.IntSlider(value=8, min=2, max=32, description="depth", continuous_update=False)
        sc = widgets.Checkbox(value=False, description="shortcuts")
        act = widgets.Dropdown(options=list(ACTIVATION_CHOICES), value="sigmoid", description="activation")
        out, update = redrawing_output(draw_residual_gradients)

        def redraw(_=None):
            update(depth=depth.value, shortcut=sc.value, activation=act.value)

        for w in (depth, sc, act):
            w.observe(redraw, names="value")
        redraw()
        return _controls_box([depth, sc, act], out)

    return live_or_static("W05.3", build_live, draw_residual_gradients_static, static,
                          caption="8 × [Linear(16,16), Sigmoid], input ones(4,16), loss mean(out²).")


# ====================================================================== W05.4 pre-LN vs post-LN


def pre_post_ln_profile(depth: int = 12, d_model: int = 32, num_heads: int = 4, d_ff: int = 64, seq_len: int = 16,
                        batch: int = 4, seed: int = 0) -> dict:
    """Residual-stream RMS and per-block gradient norms at initialisation, pre-LN vs post-LN.

    Both stacks are built from the same seed (identical weights, dropout 0). The pre-LN stack ends
    with a final :class:`LayerNorm`, as a pre-LN stack must. Input ``randn(batch, seq_len, d_model)``;
    loss ``mean(out²)`` of a fixed random linear read-out (so the gradient is not trivially zero
    after a final norm).

    Returns:
        ``{"pre": {"rms": [...], "grad": [...]}, "post": {...}}``: ``rms`` has ``depth + 1`` entries
        (the input, then the stream after each block), ``grad`` has ``depth`` entries (L2 norm of the
        gradient over each block's parameters, block 1 first). The pre-LN stream grows with depth
        (each block adds to it); the post-LN stream is renormalised to RMS ≈ 1 after every block.

    Raises:
        ValueError: for ``depth < 1``.
    """
    if depth < 1:
        raise ValueError(f"depth must be ≥ 1, got {depth}")
    result = {}
    with torch.random.fork_rng():
        for name, norm_first in (("pre", True), ("post", False)):
            torch.manual_seed(seed)
            blocks = [EncoderBlock(d_model, num_heads, d_ff, dropout=0.0, norm_first=norm_first)
                      for _ in range(depth)]
            final = LayerNorm(d_model)
            g = torch.Generator().manual_seed(seed + 1)
            x = torch.randn(batch, seq_len, d_model, generator=g)
            readout = torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model)
            rms = [x.pow(2).mean().sqrt().item()]
            for blk in blocks:
                x = blk(x)
                rms.append(x.detach().pow(2).mean().sqrt().item())
            out = final(x) if norm_first else x
            (out @ readout).pow(2).mean().backward()
            grads = [torch.sqrt(sum(p.grad.pow(2).sum() for p in blk.parameters())).item() for blk in blocks]
            result[name] = {"rms": rms, "grad": grads}
    return result


def draw_pre_post_ln(depth: int = 12):
    """W05.4: two panels (stream RMS per layer; gradient norm per block), both orderings."""
    prof = pre_post_ln_profile(depth)
    fig, (a, b) = figure(1, 2, figsize=(10, 3.6))
    for name, color in (("pre", "tab:blue"), ("post", "tab:orange")):
        a.plot(range(depth + 1), prof[name]["rms"], "o-", color=color, label=f"{name}-LN", ms=3)
        b.plot(range(1, depth + 1), prof[name]["grad"], "o-", color=color, label=f"{name}-LN", ms=3)
    a.set_xlabel("after block (0 = input)")
    a.set_ylabel("RMS of the residual stream")
    b.set_xlabel("block")
    b.set_ylabel("‖∂loss/∂θ_block‖")
    b.set_yscale("log")
    for ax in (a, b):
        ax.legend(fontsize=8)
    fig.suptitle(f"pre-LN vs post-LN at initialisation, {depth} encoder blocks (D=32, H=4, d_ff=64)",
                 fontsize=10)
    return fig


def show_pre_post_ln(static: bool | None = None):
    """W05.4: a depth slider (1–24). Static: depth 12."""

    def build_live():
        import ipywidgets as widgets

        depth = widgets.IntSlider(value=12, min=1, max=24, description="depth", continuous_update=False)
        out, update = redrawing_output(draw_pre_post_ln)
        depth.observe(lambda _: update(depth=depth.value), names="value")
        update(depth=depth.value)
        return _controls_box([depth], out)

    return live_or_static("W05.4", build_live, lambda: draw_pre_post_ln(12), static,
                          caption="Depth 12, same weights in both orderings.")


# ====================================================================== W05.5 block diagram


def block_shapes(kind: str = "encoder", B: int = 2, T: int = 10, D: int = 512, H: int = 8, d_ff: int = 2048,
                 S: int | None = None, norm_first: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    """The sublayers of one block, bottom to top, with the shape of the tensor each produces.

    ``kind`` is ``"encoder"`` or ``"decoder"`` (``S`` = source length of the memory, default ``T``).

    Raises:
        ValueError: for an unknown ``kind`` or ``D`` not divisible by ``H``.
    """
    if kind not in {"encoder", "decoder"}:
        raise ValueError(f"kind must be 'encoder' or 'decoder', got {kind!r}")
    if D % H:
        raise ValueError(f"D={D} is not divisible by H={H}")
    S = T if S is None else S
    hd = D // H
    rows = [("input x", (B, T, D))]

    def sub(name, extra):
        if norm_first:
            rows.append((f"LayerNorm → {name}", (B, T, D)))
        else:
            rows.append((name, (B, T, D)))
        rows.extend(extra)
        rows.append(("dropout, + residual" + ("" if norm_first else " → LayerNorm"), (B, T, D)))

    sub("self-attention" + (" (causal, tgt_mask)" if kind == "decoder" else " (padding mask)"),
        [("  per-head Q, K, V", (B, H, T, hd)), ("  attention weights", (B, H, T, T))])
    if kind == "decoder":
        sub("cross-attention (Q from x, K/V from memory)",
            [("  memory", (B, S, D)), ("  cross weights", (B, H, T, S))])
    sub("feed-forward", [("  fc1 → activation", (B, T, d_ff)), ("  fc2", (B, T, D))])
    return rows


def draw_block_diagram(kind: str = "encoder", B: int = 2, T: int = 10, D: int = 512, H: int = 8, d_ff: int = 2048,
                       norm_first: bool = True):
    """W05.5: boxes for each sublayer with its output shape."""
    rows = block_shapes(kind, B, T, D, H, d_ff, norm_first=norm_first)
    fig, ax = figure(figsize=(7, 0.45 * len(rows) + 0.8))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.5, len(rows) - 0.5)
    ax.axis("off")
    for i, (label, shape) in enumerate(rows):
        inner = label.startswith("  ")
        x0 = 1.2 if inner else 0.5
        color = "#eeeeee" if inner else ("#cfe8c0" if "residual" in label else "#c6dbef")
        ax.add_patch(FancyBboxPatch((x0, i - 0.35), 5.6 - (x0 - 0.5), 0.7, boxstyle="round,pad=0.02",
                                    facecolor=color, edgecolor="0.3"))
        ax.text(x0 + 0.15, i, label.strip(), va="center", fontsize=8)
        ax.text(6.4, i, "(" + ", ".join(str(s) for s in shape) + ")", va="center", fontsize=8, family="monospace")
    ax.set_title(f"{'pre' if norm_first else 'post'}-LN {kind} block  B={B}, T={T}, D={D}, H={H}, d_ff={d_ff}",
                 fontsize=9)
    return fig


def show_block_diagram(static: bool | None = None):
    """W05.5: block kind, B, T, D, H, d_ff and norm placement. Static: the encoder block for the defaults."""

    def build_live():
        import ipywidgets as widgets

        kind = widgets.Dropdown(options=["encoder", "decoder"], value="encoder", description="block")
        nf = widgets.Checkbox(value=True, description="pre-LN")
        sliders = {
            "B": widgets.IntSlider(value=2, min=1, max=8, description="B", continuous_update=False),
            "T": widgets.IntSlider(value=10, min=1, max=64, description="T", continuous_update=False),
            "D": widgets.Dropdown(options=[64, 128, 256, 512, 768], value=512, description="D"),
            "H": widgets.Dropdown(options=[1, 2, 4, 8, 16], value=8, description="H"),
            "d_ff": widgets.Dropdown(options=[256, 512, 1024, 2048, 3072], value=2048, description="d_ff"),
        }
        out, update = redrawing_output(draw_block_diagram)

        def redraw(_=None):
            update(kind=kind.value, norm_first=nf.value, **{k: w.value for k, w in sliders.items()})

        for w in [kind, nf, *sliders.values()]:
            w.observe(redraw, names="value")
        redraw()
        return widgets.VBox([widgets.HBox([kind, nf]), widgets.HBox(list(sliders.values())), out])

    return live_or_static("W05.5", build_live, draw_block_diagram, static,
                          caption="A pre-LN encoder block for B=2, T=10, D=512, H=8, d_ff=2048.")


# ====================================================================== cost accounting


def block_cost(seq_len: int, d_model: int, d_ff: int) -> dict:
    """Multiply–adds of one block's main matrix products for one sequence of length ``L``.

    ``projections`` = 4·L·D² (Q, K, V and output), ``attention`` = 2·L²·D (scores ``QKᵀ`` and the
    weighted sum), ``ffn`` = 2·L·D·d_ff. The attention term overtakes the FFN when ``L > d_ff``.

    Returns:
        dict of ints ``projections``, ``attention``, ``ffn``, ``total``.
    """
    L, D = int(seq_len), int(d_model)
    c = {"projections": 4 * L * D * D, "attention": 2 * L * L * D, "ffn": 2 * L * D * int(d_ff)}
    c["total"] = sum(c.values())
    return c
