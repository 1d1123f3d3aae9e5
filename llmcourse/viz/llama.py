"""Unit 11 widgets: RoPE as rotating pairs, its relative-position property, Llama 3's frequency
smoothing, the GQA head map and the GPT-2 → Llama parameter diff.

Each widget has a pure compute function (unit-tested in ``tests/test_unit11_llama3_viz.py``), a draw
function that paints a matplotlib ``Figure`` and ``show_*(static=None)`` (see :mod:`llmcourse.viz.base`).
All numbers come from the library's own functions (:mod:`llmcourse.models.llama3`).
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure

from ..models.llama3 import (
    Llama3Config,
    apply_rope,
    apply_rope_interleaved,
    llama3_param_breakdown,
    rope_cos_sin,
    rope_inv_freq,
)
from .base import figure, live_or_static, redrawing_output

__all__ = [
    "gqa_head_map", "llama_vs_gpt_params", "relative_scores", "rope_pair_angles", "smoothing_bands",
    "show_gqa_map", "show_llama_param_diff", "show_rope_relative", "show_rope_rotation", "show_rope_smoothing",
]

# ============================================================================ W11.1 rotating pair


def rope_pair_angles(positions, pairs, head_dim: int = 16, theta: float = 10000.0) -> dict:
    """Angles ``m·θ_i`` (radians) of pair ``i`` at position ``m``, and where the unit vector ``(1, 0)`` lands.

    Returns ``{"angles": (len(positions), len(pairs)), "points": (..., 2), "inv_freq": (head_dim/2,)}``.
    """
    inv = rope_inv_freq(head_dim, theta)
    pos = torch.tensor(list(positions), dtype=torch.float32)
    ang = pos[:, None] * inv[list(pairs)][None, :]
    return {"angles": ang, "points": torch.stack((ang.cos(), ang.sin()), -1), "inv_freq": inv}


def draw_rope_rotation(position: int = 5, pair: int = 0, head_dim: int = 16) -> Figure:
    fig, axes = figure(1, 2, figsize=(9, 4))
    ax, ax2 = axes
    info = rope_pair_angles(range(position + 1), [pair], head_dim)
    pts = info["points"][:, 0]
    t = torch.linspace(0, 2 * math.pi, 200)
    ax.plot(t.cos(), t.sin(), color="#ccc", lw=1)
    ax.plot(pts[:, 0], pts[:, 1], "o", color="#9ecae1", ms=4, label="positions 0 … m−1")
    ax.annotate("", xy=(float(pts[-1, 0]), float(pts[-1, 1])), xytext=(0, 0),
                arrowprops=dict(arrowstyle="->", color="#d62728", lw=2))
    ax.annotate("", xy=(1, 0), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="#555", lw=1))
    ax.set_aspect("equal")
    ax.set_xlim(-1.2, 1.2)
    ax.set_ylim(-1.2, 1.2)
    theta_i = float(info["inv_freq"][pair])
    ax.set_title(f"pair {pair}: θ = {theta_i:.3g} rad/position\nposition {position}: angle "
                 f"{position * theta_i:.3g} rad")
    ax.legend(loc="lower left", fontsize=8)
    ax2.bar(range(head_dim // 2), (position * info["inv_freq"]) % (2 * math.pi), color="#6baed6")
    ax2.bar([pair], [(position * theta_i) % (2 * math.pi)], color="#d62728")
    ax2.set_xlabel("pair index i")
    ax2.set_ylabel("angle m·θ_i mod 2π")
    ax2.set_title(f"every pair at position {position}: fast pairs spin, slow pairs creep")
    return fig


def draw_rope_rotation_grid(positions=(0, 1, 5, 20), pairs=(0, 3, 7), head_dim: int = 16) -> Figure:
    """Static fallback: the rotated unit vector for each (pair, position)."""
    fig, axes = figure(1, len(pairs), figsize=(3.2 * len(pairs), 3.4))
    info = rope_pair_angles(positions, pairs, head_dim)
    t = torch.linspace(0, 2 * math.pi, 200)
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    for j, (ax, p) in enumerate(zip(axes, pairs)):
        ax.plot(t.cos(), t.sin(), color="#ccc", lw=1)
        for k, m in enumerate(positions):
            x, y = info["points"][k, j].tolist()
            ax.annotate("", xy=(x, y), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color=colours[k % 5], lw=1.6))
            ax.text(1.08 * x, 1.08 * y, f"m={m}", fontsize=7, color=colours[k % 5])
        ax.set_aspect("equal")
        ax.set_xlim(-1.35, 1.35)
        ax.set_ylim(-1.35, 1.35)
        ax.set_title(f"pair {p} (θ = {float(info['inv_freq'][p]):.2g})", fontsize=9)
    return fig


def show_rope_rotation(static: bool | None = None, head_dim: int = 16):
    """W11.1: sliders for position m and pair i; the pair's 2-D vector turns by ``m·θ_i``.

    Static fallback: m ∈ {0, 1, 5, 20} for pairs i ∈ {0, 3, 7} (head_dim 16, θ = 10,000).
    """

    def build_live():
        import ipywidgets as widgets

        pos = widgets.IntSlider(value=5, min=0, max=200, description="position m")
        pair = widgets.IntSlider(value=0, min=0, max=head_dim // 2 - 1, description="pair i")
        out, update = redrawing_output(draw_rope_rotation)

        def refresh(_change=None):
            update(position=pos.value, pair=pair.value, head_dim=head_dim)

        for c in (pos, pair):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([pos, pair]), out])

    return live_or_static("W11.1", build_live, lambda: draw_rope_rotation_grid(head_dim=head_dim), static,
                          caption="positions 0, 1, 5, 20 for pairs 0, 3, 7 (head_dim 16, θ = 10,000).")


# ============================================================================ W11.2 relative property


def relative_scores(q: torch.Tensor | None = None, k: torch.Tensor | None = None, offsets=(0, 37, 150),
                    max_distance: int = 40, mismatched: bool = False, theta: float = 10000.0) -> dict:
    """``⟨R_m q, R_n k⟩`` against ``m − n`` (0 … max_distance) for several absolute offsets ``n``.

    With the same convention on both sides the curves coincide (the score depends on ``m − n`` only).
    ``mismatched=True`` rotates the query with the interleaved layout and the key with the half-split one:
    the curves separate. Returns ``{"distance": (D,), "scores": (len(offsets), D), "spread": float}``
    (spread = max over distances of the range across offsets).
    """
    hd = 32
    g = torch.Generator().manual_seed(0)
    q = torch.randn(hd, generator=g) if q is None else q
    k = torch.randn(hd, generator=g) if k is None else k
    hd = q.shape[-1]
    total = max(offsets) + max_distance + 1
    cos, sin = rope_cos_sin(rope_inv_freq(hd, theta), torch.arange(total))
    rot_q = apply_rope_interleaved if mismatched else apply_rope
    dist = torch.arange(max_distance + 1)
    rows = []
    for n in offsets:
        kn = apply_rope(k, cos[n], sin[n])
        rows.append(torch.stack([rot_q(q, cos[n + d], sin[n + d]) @ kn for d in dist.tolist()]))
    scores = torch.stack(rows)
    return {"distance": dist, "scores": scores, "spread": float((scores.max(0).values - scores.min(0).values).max())}


def draw_rope_relative(mismatched: bool = False, offsets=(0, 37, 150)) -> Figure:
    r = relative_scores(offsets=offsets, mismatched=mismatched)
    fig, ax = figure(figsize=(7, 3.8))
    for n, row in zip(offsets, r["scores"]):
        ax.plot(r["distance"], row, marker="o", ms=3, label=f"key at n = {n}")
    ax.set_xlabel("m − n (query position minus key position)")
    ax.set_ylabel("⟨R_m q, R_n k⟩")
    title = "interleaved query vs half-split key: curves separate" if mismatched else \
        "same convention: one curve, whatever the absolute positions"
    ax.set_title(f"{title}\n(largest gap between curves: {r['spread']:.2e})", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def show_rope_relative(static: bool | None = None):
    """W11.2: scores vs ``m − n`` for keys at three absolute positions, with a "mismatched conventions" toggle.

    Static fallback: both settings side by side would double the figure; it shows the matched case and the
    mismatched case stacked.
    """

    def build_live():
        import ipywidgets as widgets

        toggle = widgets.Checkbox(value=False, description="mismatched conventions")
        out, update = redrawing_output(draw_rope_relative)
        toggle.observe(lambda _c: update(mismatched=toggle.value), names="value")
        update(mismatched=False)
        return widgets.VBox([toggle, out])

    def build_static():
        fig, axes = figure(2, 1, figsize=(7, 6.5))
        for ax, mism in zip(axes, (False, True)):
            r = relative_scores(mismatched=mism)
            for n, row in zip((0, 37, 150), r["scores"]):
                ax.plot(r["distance"], row, marker="o", ms=2, label=f"key at n = {n}")
            ax.set_title(("mismatched conventions" if mism else "same convention") +
                         f": largest gap {r['spread']:.2e}", fontsize=10)
            ax.set_ylabel("score")
            ax.legend(fontsize=7)
        axes[-1].set_xlabel("m − n")
        return fig

    return live_or_static("W11.2", build_live, build_static, static,
                          caption="top: one convention; bottom: interleaved query, half-split key.")


# ============================================================================ W11.3 frequency smoothing


def smoothing_bands(head_dim: int = 128, theta: float = 500000.0, factor: float = 32.0, low_freq_factor: float = 1.0,
                    high_freq_factor: float = 4.0, original_max_position_embeddings: int = 8192) -> dict:
    """Original and smoothed inverse frequencies per pair, their wavelengths and each pair's band.

    ``band`` per pair: ``"kept"`` (wavelength < orig/high), ``"divided"`` (> orig/low) or ``"smoothed"``.
    """
    scaling = {"factor": factor, "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
               "original_max_position_embeddings": original_max_position_embeddings}
    inv = rope_inv_freq(head_dim, theta)
    new = rope_inv_freq(head_dim, theta, scaling)
    wl = 2 * math.pi / inv
    lo, hi = original_max_position_embeddings / low_freq_factor, original_max_position_embeddings / high_freq_factor
    band = ["kept" if w < hi else "divided" if w > lo else "smoothed" for w in wl.tolist()]
    return {"inv_freq": inv, "smoothed": new, "wavelength": wl, "band": band, "limits": (hi, lo)}


def draw_rope_smoothing(head_dim: int = 128, factor: float = 32.0, low_freq_factor: float = 1.0,
                        high_freq_factor: float = 4.0, original_max_position_embeddings: int = 8192) -> Figure:
    r = smoothing_bands(head_dim, 500000.0, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    fig, ax = figure(figsize=(7.5, 4))
    i = torch.arange(len(r["band"]))
    colours = {"kept": "#c7e9c0", "smoothed": "#fdd0a2", "divided": "#c6dbef"}
    for j, b in enumerate(r["band"]):
        ax.axvspan(j - 0.5, j + 0.5, color=colours[b], lw=0)
    ax.semilogy(i, r["inv_freq"], "k-", label="original θ_i")
    ax.semilogy(i, r["smoothed"], "r--", label="Llama 3 θ_i")
    counts = {b: r["band"].count(b) for b in ("kept", "smoothed", "divided")}
    ax.set_xlabel("pair index i")
    ax.set_ylabel("inverse frequency (rad / position)")
    ax.set_title(f"green: kept ({counts['kept']}), orange: smoothed ({counts['smoothed']}), blue: divided by "
                 f"{factor:g} ({counts['divided']})\nband limits: wavelengths {r['limits'][0]:,.0f} and "
                 f"{r['limits'][1]:,.0f} positions", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def show_rope_smoothing(static: bool | None = None):
    """W11.3: original vs Llama 3 inverse frequencies with the three bands shaded; sliders for ``factor``,
    ``low_freq_factor``, ``high_freq_factor`` and the original context. Static: 8,192 / 32 / 1 / 4, head_dim 128.
    """

    def build_live():
        import ipywidgets as widgets

        factor = widgets.FloatLogSlider(value=32, base=2, min=0, max=7, description="factor")
        low = widgets.FloatSlider(value=1.0, min=0.5, max=4.0, step=0.5, description="low_freq_factor")
        high = widgets.FloatSlider(value=4.0, min=1.0, max=16.0, step=0.5, description="high_freq_factor")
        orig = widgets.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768], value=8192,
                                       description="original context")
        out, update = redrawing_output(draw_rope_smoothing)

        def refresh(_change=None):
            h = max(high.value, low.value + 0.5)
            update(factor=factor.value, low_freq_factor=low.value, high_freq_factor=h,
                   original_max_position_embeddings=orig.value)

        for c in (factor, low, high, orig):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([factor, orig]), widgets.HBox([low, high]), out])

    return live_or_static("W11.3", build_live, draw_rope_smoothing, static,
                          caption="head_dim 128, θ = 500,000, factor 32, low 1, high 4, original context 8,192.")


# ============================================================================ W11.4 GQA map


def gqa_head_map(n_heads: int = 8, n_kv_heads: int = 2, interleave: bool = True) -> list[int]:
    """KV head read by each query head: ``h // (H/KV)`` (``repeat_interleave``) or ``h % KV`` (``repeat``).

    Computed by repeating a tensor of KV-head ids, the way the attention code does it.
    """
    ids = torch.arange(n_kv_heads).view(1, n_kv_heads, 1, 1)
    rep = n_heads // n_kv_heads
    out = torch.repeat_interleave(ids, rep, dim=1) if interleave else ids.repeat(1, rep, 1, 1)
    return out.flatten().tolist()


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_elem: int = 2) -> int:
    """K and V of one token in every layer: ``2 · L · KV · hd · bytes``."""
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_elem


def draw_gqa_map(n_heads: int = 8, n_kv_heads: int = 2, interleave: bool = True) -> Figure:
    m = gqa_head_map(n_heads, n_kv_heads, interleave)
    fig, ax = figure(figsize=(7, 3.6))
    grid = torch.zeros(n_kv_heads, n_heads)
    for h, kv in enumerate(m):
        grid[kv, h] = 1
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=1.3, aspect="auto")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_kv_heads))
    ax.set_xlabel("query head")
    ax.set_ylabel("KV head")
    per_tok = kv_bytes_per_token(16, n_kv_heads, 64)
    mha = kv_bytes_per_token(16, n_heads, 64)
    how = "repeat_interleave (contiguous groups)" if interleave else "repeat (strided: wrong for Llama checkpoints)"
    ax.set_title(f"H = {n_heads}, KV = {n_kv_heads}: {how}\nKV cache per token (16 layers, hd 64, bf16): "
                 f"{per_tok / 1024:g} KiB vs {mha / 1024:g} KiB with one KV head per query head", fontsize=9)
    return fig


def show_gqa_map(static: bool | None = None):
    """W11.4: H and KV sliders, the query-head → KV-head grid, a ``repeat_interleave`` vs ``repeat`` toggle,
    and the KV-cache bytes per token. Static: H = 8, KV = 2, ``repeat_interleave``."""

    def build_live():
        import ipywidgets as widgets

        h = widgets.Dropdown(options=[4, 8, 12, 16, 24, 32], value=8, description="H")
        kv = widgets.Dropdown(options=[1, 2, 4, 8], value=2, description="KV")
        mode = widgets.ToggleButtons(options=["repeat_interleave", "repeat"], value="repeat_interleave")
        out, update = redrawing_output(draw_gqa_map)

        def refresh(_change=None):
            k = kv.value if h.value % kv.value == 0 else 1
            update(n_heads=h.value, n_kv_heads=k, interleave=mode.value == "repeat_interleave")

        for c in (h, kv, mode):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([h, kv, mode]), out])

    return live_or_static("W11.4", build_live, lambda: draw_gqa_map(8, 2, True), static,
                          caption="H = 8, KV = 2: heads 0–3 read KV head 0, heads 4–7 KV head 1.")


# ============================================================================ W11.5 GPT-2 → Llama diff


def llama_vs_gpt_params(gpt_preset: str = "gpt2-char-tiny", llama_preset: str = "llama3-tiny") -> list[tuple]:
    """Rows ``(component, GPT-2 count, Llama count)`` from both formula breakdowns, last row the totals."""
    from ..models.gpt2 import GPT2Config, gpt2_param_breakdown

    g = gpt2_param_breakdown(GPT2Config.preset(gpt_preset))
    ll = llama3_param_breakdown(Llama3Config.preset(llama_preset))
    rows = [("token embedding", g["token_embedding"], ll["token_embedding"]),
            ("position embedding", g["position_embedding"], 0),
            ("attention", g["attention"], ll["attention"]),
            ("feed-forward", g["ffn"], ll["ffn"]),
            ("norms in blocks", g["block_norms"], ll["block_norms"]),
            ("final norm", g["final_norm"], ll["final_norm"]),
            ("lm_head (untied)", g["lm_head"], ll["lm_head"]),
            ("total", g["total"], ll["total"])]
    return rows


def draw_llama_param_diff(gpt_preset: str = "gpt2-char-tiny", llama_preset: str = "llama3-tiny") -> Figure:
    rows = llama_vs_gpt_params(gpt_preset, llama_preset)
    fig, ax = figure(figsize=(7.5, 3.3))
    ax.axis("off")
    cells = [[name, f"{a:,}", f"{b:,}", f"{b - a:+,}"] for name, a, b in rows]
    table = ax.table(cellText=cells, colLabels=["component", gpt_preset, llama_preset, "change"], loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.3)
    ax.set_title("parameters by component (formula)", fontsize=10)
    return fig


def show_llama_param_diff(static: bool | None = None):
    """W11.5: the parameter breakdown of a GPT-2 preset and a Llama 3 preset side by side.
    Static: ``gpt2-char-tiny`` vs ``llama3-tiny``."""

    def build_live():
        import ipywidgets as widgets

        from ..models.gpt2 import GPT2_PRESETS
        from ..models.llama3 import LLAMA3_PRESETS

        gp = widgets.Dropdown(options=list(GPT2_PRESETS), value="gpt2-char-tiny", description="GPT-2")
        lp = widgets.Dropdown(options=list(LLAMA3_PRESETS), value="llama3-tiny", description="Llama 3")
        out, update = redrawing_output(draw_llama_param_diff)

        def refresh(_change=None):
            update(gpt_preset=gp.value, llama_preset=lp.value)

        for c in (gp, lp):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([gp, lp]), out])

    return live_or_static("W11.5", build_live, draw_llama_param_diff, static,
                          caption="gpt2-char-tiny vs llama3-tiny.")
