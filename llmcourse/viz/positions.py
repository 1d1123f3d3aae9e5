"""Widgets of unit 02 (embeddings and positions): 5 widgets.

Each widget follows :mod:`llmcourse.viz.base`: a pure compute function (tested by pytest), a draw
function that returns a matplotlib ``Figure``, and ``show_<name>(..., static=None)``, which returns the
live ipywidgets UI or, under the ``ci`` profile (or with ``static=True``), one static figure.

=======  ===============================  ====================================  ==============================
widget   compute                          draw                                  show
=======  ===============================  ====================================  ==============================
1        :func:`pe_heatmap_data`          :func:`draw_pe_heatmap`               :func:`show_pe_heatmap`
2        :func:`frequency_curves`         :func:`draw_frequency_curves`         :func:`show_frequency_explorer`
3        :func:`shift_rotation`           :func:`draw_shift_rotation`           :func:`show_shift_rotation`
4        :func:`candidate_encodings`,     :func:`draw_candidates`               :func:`show_candidate_comparison`
         :func:`requirements_checklist`
5        :func:`position_similarity`      :func:`draw_position_similarity`      :func:`show_position_similarity`
=======  ===============================  ====================================  ==============================

The sinusoidal table always comes from :func:`llmcourse.nn.positions.sinusoidal_pe` (interleaved: sine on
even dims, cosine on odd dims); the float64 identities use :func:`~llmcourse.nn.positions.inverse_frequencies`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from ..nn.positions import inverse_frequencies, shift_matrix, sinusoidal_pe
from .base import figure, linked_controls, live_or_static, redrawing_output

__all__ = [
    "CANDIDATES", "REQUIREMENTS", "candidate_encodings", "draw_candidates", "draw_frequency_curves",
    "draw_pe_heatmap", "draw_position_similarity", "draw_shift_rotation", "frequency_curves",
    "pe_heatmap_data", "position_similarity", "requirements_checklist", "show_candidate_comparison",
    "show_frequency_explorer", "show_pe_heatmap", "show_position_similarity", "show_shift_rotation",
    "shift_rotation", "sinusoidal_pe_float64",
]

_GOOD, _BAD = "#2e7d32", "#c62828"
_GOOD_BG, _BAD_BG = "#e3f2e1", "#fbe3e1"


def sinusoidal_pe_float64(n_positions: int, d_model: int) -> Tensor:
    """The sinusoidal table in float64 (same layout as :func:`sinusoidal_pe`), for identities to ~1e-14."""
    omega = inverse_frequencies(d_model)
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * omega[None, :]
    pe = torch.empty(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
    return pe


def _even(d_model: int) -> int:
    return max(2, int(d_model) // 2 * 2)


# ============================================================================ W02.1 PE heatmap


def pe_heatmap_data(max_len: int = 100, d_model: int = 64, dims: tuple[int, ...] | None = None) -> dict:
    """The table for the heatmap and a few per-dimension curves.

    Args:
        max_len: number of positions (≥ 1).
        d_model: even width.
        dims: the dimensions to plot as curves; default: the fastest pair (0, 1), a middle sine and the slowest
            sine (``D−2``).

    Returns:
        dict with ``pe`` (``(max_len, d_model)`` float32, :func:`sinusoidal_pe`), ``dims`` (tuple of ints) and
        ``periods`` (the wavelength ``2π/ω`` of each plotted dim, in positions).

    Raises:
        ValueError: odd ``d_model``, ``max_len < 1``, or a dim outside ``[0, d_model)``.
    """
    pe = sinusoidal_pe(max_len, d_model)
    if dims is None:
        dims = tuple(sorted({0, 1, (d_model // 4) // 2 * 2, d_model - 2}))
    dims = tuple(int(d) for d in dims)
    if any(d < 0 or d >= d_model for d in dims):
        raise ValueError(f"dims must lie in [0, {d_model}), got {dims}")
    omega = inverse_frequencies(d_model)
    periods = tuple(float(2 * math.pi / omega[d // 2]) for d in dims)
    return {"pe": pe, "dims": dims, "periods": periods}


def draw_pe_heatmap(max_len: int = 100, d_model: int = 64, dim: int | None = None) -> Figure:
    """Heatmap positions × dims (top) and the curves ``PE[:, j]`` of a few dims (bottom).

    ``dim`` adds one chosen dimension to the default curves (the live widget's slider).
    """
    d_model = _even(d_model)
    data = pe_heatmap_data(max_len, d_model)
    dims = data["dims"] if dim is None else tuple(sorted(set(data["dims"]) | {min(int(dim), d_model - 1)}))
    data = pe_heatmap_data(max_len, d_model, dims)
    pe = data["pe"].numpy()
    fig, (ax, ax2) = figure(2, 1, figsize=(8, 6.4), height_ratios=[3, 2])
    im = ax.imshow(pe, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xlabel("dimension j (even: sin, odd: cos)")
    ax.set_ylabel("position p")
    ax.set_title(f"Sinusoidal PE, {max_len} positions × d_model={d_model}: fast dims on the left, slow on the right",
                 fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
    for j, period in zip(data["dims"], data["periods"]):
        kind = "sin" if j % 2 == 0 else "cos"
        ax2.plot(np.arange(max_len), pe[:, j], lw=1.4, label=f"dim {j} ({kind}, period {period:.3g})")
    ax2.set_xlabel("position p")
    ax2.set_ylabel("PE[p, j]")
    ax2.set_ylim(-1.1, 1.1)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="lower left", ncol=2)
    return fig


def show_pe_heatmap(max_len: int = 100, d_model: int = 64, static: bool | None = None):
    """The PE heatmap: sliders ``max_len`` (16–1024) and ``d_model`` (8–512, even) and one extra dim to plot.

    Static fallback: 100 positions × 64 dims with curves of dims 0, 1, 16 and 62.
    """

    def build_live():
        import ipywidgets as widgets

        controls = {
            "max_len": widgets.IntSlider(value=max_len, min=16, max=1024, step=16, description="max_len"),
            "d_model": widgets.IntSlider(value=d_model, min=8, max=512, step=2, description="d_model"),
            "dim": widgets.IntSlider(value=2, min=0, max=511, description="extra dim"),
        }
        return linked_controls(controls, draw_pe_heatmap)

    return live_or_static("W02.1", build_live, lambda: draw_pe_heatmap(max_len, d_model), static,
                          caption=f"{max_len} positions × {d_model} dims.")


# ============================================================================ W02.2 frequency explorer


def frequency_curves(i: int, d_model: int = 768, n_positions: int = 1024) -> dict:
    """One sinusoidal pair over positions ``0 … n_positions−1``.

    Args:
        i: pair index, ``0 ≤ i < d_model/2`` (dims ``2i`` and ``2i+1``).
        d_model: even width.
        n_positions: number of positions (≥ 1).

    Returns:
        dict with ``positions`` (float64), ``sin`` and ``cos`` (float64 arrays), ``omega`` (``10000^(−2i/D)``),
        ``period`` (``2π/ω``, in positions), ``cycles`` (``n_positions/period``: full turns over the range) and
        ``last`` (``(sin, cos)`` at the last position).

    Raises:
        ValueError: odd ``d_model``, ``i`` out of range or ``n_positions < 1``.
    """
    omega_all = inverse_frequencies(d_model)
    if not 0 <= i < d_model // 2:
        raise ValueError(f"pair index i must lie in [0, {d_model // 2}) for d_model={d_model}, got {i}")
    if n_positions < 1:
        raise ValueError(f"n_positions must be ≥ 1, got {n_positions}")
    omega = float(omega_all[i])
    p = np.arange(n_positions, dtype=np.float64)
    s, c = np.sin(omega * p), np.cos(omega * p)
    period = 2 * math.pi / omega
    return {"positions": p, "sin": s, "cos": c, "omega": omega, "period": period,
            "cycles": n_positions / period, "last": (float(s[-1]), float(c[-1]))}


def draw_frequency_curves(pairs: tuple[int, ...] = (0, 1, 50, 150, 250), d_model: int = 768,
                          n_positions: int = 1024) -> Figure:
    """One panel per pair: sin (solid) and cos (dashed) over positions, with period and cycle count."""
    d_model = _even(d_model)
    pairs = tuple(p for p in pairs if 0 <= p < d_model // 2) or (0,)
    fig, axes = figure(len(pairs), 1, figsize=(8, 1.55 * len(pairs) + 0.6), sharex=True, squeeze=False)
    for ax, i in zip(axes[:, 0], pairs):
        c = frequency_curves(i, d_model, n_positions)
        ax.plot(c["positions"], c["sin"], lw=1.1, label=f"sin (dim {2 * i})")
        ax.plot(c["positions"], c["cos"], lw=1.1, ls="--", label=f"cos (dim {2 * i + 1})")
        ax.set_ylim(-1.15, 1.15)
        ax.set_ylabel(f"pair {i}")
        ax.text(1.0, 1.02, f"period 2π·10000^({2 * i}/{d_model}) = {c['period']:.2f} positions; {c['cycles']:.2f} "
                f"cycles over {n_positions}; at p={n_positions - 1}: sin {c['last'][0]:.3f}, cos {c['last'][1]:.3f}",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8, loc="lower left", ncol=2)
    axes[-1, 0].set_xlabel("position p")
    return fig


def show_frequency_explorer(i: int = 0, d_model: int = 768, n_positions: int = 1024, static: bool | None = None):
    """The frequency explorer: a pair-index slider ``i``; sin/cos of that pair over positions with its period printed.

    Static fallback: pairs 0, 1, 50, 150 and 250 at D=768 over 1,024 positions.
    """

    def build_live():
        import ipywidgets as widgets

        controls = {
            "i": widgets.IntSlider(value=i, min=0, max=d_model // 2 - 1, description="pair i"),
            "d_model": widgets.IntSlider(value=d_model, min=8, max=1024, step=2, description="d_model"),
            "n_positions": widgets.IntSlider(value=n_positions, min=16, max=4096, step=16, description="positions"),
        }

        def on_width(change):
            controls["i"].max = change["new"] // 2 - 1

        controls["d_model"].observe(on_width, names="value")

        def draw(i, d_model, n_positions):
            return draw_frequency_curves((min(i, d_model // 2 - 1),), d_model, n_positions)

        return linked_controls(controls, draw)

    return live_or_static("W02.2", build_live, lambda: draw_frequency_curves((0, 1, 50, 150, 250), d_model, n_positions),
                          static, caption=f"Pairs 0, 1, 50, 150 and 250 of a D={d_model} table.")


# ============================================================================ W02.3 shift as rotation


def shift_rotation(p: float, k: float, i: int, d_model: int = 16) -> dict:
    """Pair ``i`` at position ``p``, its image under ``M_k`` and the pair at ``p + k`` (float64).

    Returns:
        dict with ``omega``, ``M`` (``(2, 2)`` float64 :func:`shift_matrix`), ``start`` = ``(sin ωp, cos ωp)``,
        ``rotated`` = ``M_k @ start`` and ``target`` = ``(sin ω(p+k), cos ω(p+k))`` (float64 arrays), and
        ``error`` = ``max |rotated − target|`` (≈ 1e-16).

    Raises:
        ValueError: odd ``d_model`` or ``i`` out of ``[0, d_model/2)``.
    """
    omega_all = inverse_frequencies(d_model)
    if not 0 <= i < d_model // 2:
        raise ValueError(f"pair index i must lie in [0, {d_model // 2}) for d_model={d_model}, got {i}")
    omega = float(omega_all[i])
    m = shift_matrix(k, omega, dtype=torch.float64).numpy()
    start = np.array([math.sin(omega * p), math.cos(omega * p)])
    target = np.array([math.sin(omega * (p + k)), math.cos(omega * (p + k))])
    rotated = m @ start
    return {"omega": omega, "M": m, "start": start, "rotated": rotated, "target": target,
            "error": float(np.abs(rotated - target).max())}


def draw_shift_rotation(p: float = 3, k: float = 5, pairs: tuple[int, ...] = (0, 4), d_model: int = 16) -> Figure:
    """One unit-circle panel per pair: the point at p, the arc of angle ωk, and M_k·point on top of PE(p+k)."""
    d_model = _even(d_model)
    pairs = tuple(i for i in pairs if 0 <= i < d_model // 2) or (0,)
    fig, axes = figure(1, len(pairs), figsize=(4.4 * len(pairs), 4.9), squeeze=False)
    t = np.linspace(0, 2 * math.pi, 256)
    for ax, i in zip(axes[0], pairs):
        r = shift_rotation(p, k, i, d_model)
        ax.plot(np.cos(t), np.sin(t), color="#bbbbbb", lw=1)
        # the point (sin ωq, cos ωq) sits at angle π/2 − ωq in the plane (x = sin, y = cos)
        a0 = math.pi / 2 - r["omega"] * p
        arc = np.linspace(a0, a0 - r["omega"] * k, 100)
        ax.plot(0.85 * np.cos(arc), 0.85 * np.sin(arc), color="#777777", lw=1)
        ax.plot(*r["start"], "o", color="#1f77b4", ms=9, label=f"PE(p={p:g}) pair {i}")
        ax.plot(*r["target"], "s", color="#2ca02c", ms=13, mfc="none", mew=2, label=f"PE(p+k={p + k:g})")
        ax.plot(*r["rotated"], "x", color="#d62728", ms=10, mew=2, label="M_k · PE(p)")
        for point, color in ((r["start"], "#1f77b4"), (r["rotated"], "#d62728")):
            ax.plot([0, point[0]], [0, point[1]], color=color, lw=1)
        m = r["M"]
        ax.set_aspect("equal")
        ax.set_xlim(-1.25, 1.25)
        ax.set_ylim(-1.25, 1.25)
        ax.set_ylabel(f"cos(ω p)   (dim {2 * i + 1})")
        ax.set_title(f"pair {i}: ω = {r['omega']:.4g}, rotation by ωk = {r['omega'] * k:.3g} rad", fontsize=9)
        ax.set_xlabel(f"sin(ω p)   (dim {2 * i})\nM_k = [[{m[0, 0]:.3f}, {m[0, 1]:.3f}], [{m[1, 0]:.3f}, {m[1, 1]:.3f}]]\n"
                      f"|M_k·PE(p) − PE(p+k)| = {r['error']:.1e}", fontsize=8.5)
        ax.legend(fontsize=7.5, loc="lower left")
        ax.grid(alpha=0.2)
    return fig


def show_shift_rotation(p: int = 3, k: int = 5, i: int = 0, d_model: int = 16, static: bool | None = None):
    """The shift rotation: sliders p, k and i; the point of pair i at p, its rotation by M_k, and the point at p+k.

    Static fallback: p=3, k=5 for pairs i=0 and i=4 at D=16.
    """

    def build_live():
        import ipywidgets as widgets

        controls = {
            "p": widgets.IntSlider(value=p, min=0, max=100, description="p"),
            "k": widgets.IntSlider(value=k, min=-50, max=50, description="k"),
            "i": widgets.IntSlider(value=i, min=0, max=d_model // 2 - 1, description="pair i"),
        }

        def draw(p, k, i):
            return draw_shift_rotation(p, k, (i,), d_model)

        return linked_controls(controls, draw)

    return live_or_static("W02.3", build_live, lambda: draw_shift_rotation(p, k, (0, 4), d_model), static,
                          caption=f"p={p}, k={k}, pairs 0 and 4 at D={d_model}.")


# ============================================================================ W02.4 candidate comparison

CANDIDATES = ("integer", "p/N", "binary", "sine only", "sinusoidal")
REQUIREMENTS = {
    "R1": "unique per position, independent of sequence length",
    "R2": "a shift by k is one linear map (same for every p)",
    "R3": "extends to longer sequences, values in the range seen",
    "R4": "simple and deterministic",
    "R5": "works for any even d_model",
}


def candidate_encodings(n_positions: int, d_model: int, seq_len: int | None = None) -> dict[str, Tensor]:
    """The position codes of the lesson's candidates, each ``(n_positions, d_model)`` float64.

    * ``integer``: every dim holds ``p``;
    * ``p/N``: every dim holds ``p / (N − 1)`` with ``N = seq_len`` (default ``n_positions``): it depends on the
      length of the sequence;
    * ``binary``: dim j holds bit ``d_model−1−j`` of ``p`` (most significant bit first; wraps after ``2^D``);
    * ``sine only``: dim j holds ``sin(p · 10000^(−j/D))`` (one frequency per dim, no cosine partner);
    * ``sinusoidal``: the course's table (:func:`sinusoidal_pe_float64`).

    Raises:
        ValueError: odd ``d_model`` or ``n_positions < 1``.
    """
    if n_positions < 1:
        raise ValueError(f"n_positions must be ≥ 1, got {n_positions}")
    inverse_frequencies(d_model)  # raises ValueError for an odd or non-positive d_model
    n = n_positions if seq_len is None else seq_len
    p = torch.arange(n_positions, dtype=torch.float64)[:, None]
    bits = torch.arange(d_model - 1, -1, -1)
    binary = ((torch.arange(n_positions)[:, None] >> bits.clamp(max=62)) & 1).to(torch.float64)
    binary[:, bits > 62] = 0.0
    single = 10000.0 ** (-torch.arange(d_model, dtype=torch.float64) / d_model)
    return {
        "integer": p.expand(n_positions, d_model).clone(),
        "p/N": (p / max(n - 1, 1)).expand(n_positions, d_model).clone(),
        "binary": binary,
        "sine only": torch.sin(p * single[None, :]),
        "sinusoidal": sinusoidal_pe_float64(n_positions, d_model),
    }


def _unique_rows(code: Tensor) -> bool:
    return torch.unique(code.round(decimals=9), dim=0).shape[0] == code.shape[0]


def _linear_shift_residual(code: Tensor, k: int = 1) -> float:
    """Relative residual of the best single matrix A with code[p+k] ≈ code[p] @ A for all p (least squares)."""
    x, y = code[:-k], code[k:]
    if x.shape[0] == 0:
        return 0.0
    sol = torch.linalg.lstsq(x, y, driver="gelsd").solution
    return float((x @ sol - y).norm() / y.norm().clamp_min(1e-300))


def requirements_checklist(n_positions: int = 64, d_model: int = 16) -> dict[str, dict[str, bool]]:
    """Test R1–R5 numerically for every candidate of :func:`candidate_encodings`.

    * R1: the ``n_positions`` codes are distinct, and a sequence twice as long gives the same first codes;
    * R2: one matrix maps every code to the code one position later (relative least-squares residual < 1e-6);
    * R3: 4× more positions (with the length used for the first ``n_positions``) keep distinct codes whose
      values stay within the range of the first ``n_positions``, up to 1 % (no new magnitudes for the model);
    * R4: two computations are bitwise identical;
    * R5: R1's distinctness holds for D ∈ {2, 4, 8} as well.

    Returns:
        ``{candidate: {"R1": bool, …, "R5": bool}}``.
    """
    out = {}
    base = candidate_encodings(n_positions, d_model)
    longer = candidate_encodings(4 * n_positions, d_model, seq_len=n_positions)  # trained on n_positions
    double = candidate_encodings(2 * n_positions, d_model, seq_len=2 * n_positions)
    again = candidate_encodings(n_positions, d_model)
    small = {d: candidate_encodings(n_positions, d) for d in (2, 4, 8)}
    for name in CANDIDATES:
        code = base[name]
        lo, hi = float(code.min()), float(code.max())
        ext = longer[name][n_positions:]
        r1 = _unique_rows(code) and bool(torch.allclose(double[name][:n_positions], code, atol=1e-12))
        r2 = _linear_shift_residual(code) < 1e-6
        slack = 0.01 * (hi - lo)
        r3 = _unique_rows(longer[name]) and bool(((ext >= lo - slack) & (ext <= hi + slack)).all())
        r4 = bool(torch.equal(code, again[name]))
        r5 = all(_unique_rows(s[name]) for s in small.values())
        out[name] = {"R1": r1, "R2": r2, "R3": r3, "R4": r4, "R5": r5}
    return out


@functools.lru_cache(maxsize=16)
def _cached_checklist(n_positions: int, d_model: int) -> dict[str, dict[str, bool]]:
    return requirements_checklist(n_positions, d_model)


def draw_candidates(n_positions: int = 64, d_model: int = 16, names: tuple[str, ...] = CANDIDATES) -> Figure:
    """One heatmap (positions × dims) per candidate, above a table of the R1–R5 checks (pass / FAIL)."""
    d_model = _even(d_model)
    codes = candidate_encodings(n_positions, d_model)
    checks = _cached_checklist(n_positions, d_model)
    width = max(3.0 * len(names), 7.5)
    fig, axes = figure(2, len(names), figsize=(width, 6.2), squeeze=False, height_ratios=[3, 1.5])
    grid = axes[0, 0].get_gridspec()
    for ax in axes[1]:
        ax.remove()
    for col, name in enumerate(names):
        ax = axes[0, col]
        code = codes[name].numpy()
        im = ax.imshow(code, aspect="auto", cmap="viridis" if name in {"integer", "p/N", "binary"} else "RdBu_r",
                       interpolation="nearest")
        fig.colorbar(im, ax=ax, shrink=0.8, pad=0.02)
        ax.set_title(f"{name}\nvalues in [{code.min():.3g}, {code.max():.3g}]", fontsize=9)
        ax.set_xlabel("dim")
        if col == 0:
            ax.set_ylabel("position")
    ax_t = fig.add_subplot(grid[1, :])
    ax_t.axis("off")
    cells = [[f"{rid}: {text}"] + ["pass" if checks[name][rid] else "FAIL" for name in names]
             for rid, text in REQUIREMENTS.items()]
    table = ax_t.table(cellText=cells, colLabels=["requirement"] + list(names), loc="center", cellLoc="center",
                       colWidths=[0.4] + [0.6 / len(names)] * len(names))
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.25)
    for r, rid in enumerate(REQUIREMENTS, start=1):
        for c, name in enumerate(names, start=1):
            ok = checks[name][rid]
            table[r, c].set_facecolor(_GOOD_BG if ok else _BAD_BG)
            table[r, c].set_text_props(color=_GOOD if ok else _BAD, fontweight="bold")
    fig.suptitle(f"Candidate position codes, {n_positions} positions × {d_model} dims (R1–R5 tested numerically)",
                 fontsize=10)
    return fig


def show_candidate_comparison(n_positions: int = 64, d_model: int = 16, static: bool | None = None):
    """The candidate comparison: one tab per candidate (integer / p/N / binary / sine only / sinusoidal), each a heatmap plus
    its R1–R5 checklist; sliders for the number of positions and d_model.

    Static fallback: all candidates side by side in one figure.
    """

    def build_live():
        import ipywidgets as widgets

        sliders = {
            "n_positions": widgets.IntSlider(value=n_positions, min=8, max=256, step=8, description="positions"),
            "d_model": widgets.IntSlider(value=d_model, min=2, max=64, step=2, description="d_model"),
        }
        outputs, updates = [], []
        for name in CANDIDATES:
            out, update = redrawing_output(lambda n_positions, d_model, name=name:
                                           draw_candidates(n_positions, d_model, (name,)))
            outputs.append(out)
            updates.append(update)
        tabs = widgets.Tab(children=outputs)
        for j, name in enumerate(CANDIDATES):
            tabs.set_title(j, name)
        stale = [True] * len(CANDIDATES)

        def render(j):  # only the visible tab is drawn; the others when they are opened
            updates[j](**{k: s.value for k, s in sliders.items()})
            stale[j] = False

        def refresh(_change=None):
            stale[:] = [True] * len(CANDIDATES)
            render(tabs.selected_index or 0)

        def on_tab(change):
            if change["new"] is not None and stale[change["new"]]:
                render(change["new"])

        for s in sliders.values():
            s.observe(refresh, names="value")
        tabs.observe(on_tab, names="selected_index")
        refresh()
        return widgets.VBox([widgets.HBox(list(sliders.values())), tabs])

    return live_or_static("W02.4", build_live, lambda: draw_candidates(n_positions, d_model), static,
                          caption=f"{n_positions} positions × {d_model} dims.")


# ============================================================================ W02.5 position similarity


def position_similarity(n_positions: int = 64, d_model: int = 128) -> dict:
    """Dot products between sinusoidal codes, in float64.

    ``PE(p)·PE(p+k) = Σ_i [sin ω_i p · sin ω_i(p+k) + cos ω_i p · cos ω_i(p+k)] = Σ_i cos(ω_i k)``: it depends on
    the offset k only, never on p, and is largest (``D/2``) at k = 0.

    Returns:
        dict with ``sim`` (``(N, N)`` float64 ``PE PEᵀ``), ``ks`` (offsets ``0 … N−1``), ``by_k`` (``Σ_i cos ω_i k``,
        the formula), ``mean_by_k`` (the mean of ``PE(p)·PE(p+k)`` over all p with ``p+k < N``) and ``spread``
        (``max − min`` of those dot products over p, for each k: ~1e-13).
    """
    pe = sinusoidal_pe_float64(n_positions, d_model)
    sim = pe @ pe.T
    omega = inverse_frequencies(d_model)
    ks = torch.arange(n_positions, dtype=torch.float64)
    by_k = torch.cos(ks[:, None] * omega[None, :]).sum(-1)
    diag = [torch.diagonal(sim, offset=k) for k in range(n_positions)]
    mean_by_k = torch.stack([d.mean() for d in diag])
    spread = torch.stack([d.max() - d.min() for d in diag])
    return {"sim": sim, "ks": ks, "by_k": by_k, "mean_by_k": mean_by_k, "spread": spread}


def draw_position_similarity(n_positions: int = 64, d_model: int = 128, p_marks: tuple[int, ...] = (0, 16, 40)) -> Figure:
    """Left: the ``PE·PEᵀ`` heatmap. Right: ``PE(p)·PE(p+k)`` against k for a few p, on top of ``Σ_i cos(ω_i k)``."""
    d_model = _even(d_model)
    r = position_similarity(n_positions, d_model)
    fig, (ax, ax2) = figure(1, 2, figsize=(10, 4.2))
    im = ax.imshow(r["sim"].numpy(), cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, shrink=0.85)
    ax.set_xlabel("position q")
    ax.set_ylabel("position p")
    ax.set_title(f"PE(p)·PE(q), D={d_model}: constant along each diagonal", fontsize=9.5)
    ks = r["ks"].numpy()
    ax2.plot(ks, r["by_k"].numpy(), color="black", lw=3, alpha=0.3, label="Σ_i cos(ω_i k) (formula)", zorder=5)
    pe = sinusoidal_pe_float64(n_positions, d_model)
    for p in p_marks:
        if p >= n_positions:
            continue
        k = np.arange(n_positions - p)
        ax2.plot(k, (pe[p] @ pe[p:].T).numpy(), lw=1, marker=".", ms=3, label=f"p = {p}")
    ax2.axhline(0, color="#999999", lw=0.8)
    ax2.set_xlabel("offset k")
    ax2.set_ylabel("PE(p)·PE(p+k)")
    ax2.set_title(f"depends on k only (max spread over p: {float(r['spread'].max()):.1e}); peak D/2 = {d_model // 2}",
                  fontsize=9.5)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    return fig


def show_position_similarity(n_positions: int = 64, d_model: int = 128, static: bool | None = None):
    """The position similarity: the ``PE·PEᵀ`` heatmap and ``PE(p)·PE(p+k)`` against k; sliders for positions, d_model and p.

    Static fallback: 64 positions, D=128, curves for p = 0, 16 and 40.
    """

    def build_live():
        import ipywidgets as widgets

        controls = {
            "n_positions": widgets.IntSlider(value=n_positions, min=8, max=512, step=8, description="positions"),
            "d_model": widgets.IntSlider(value=d_model, min=2, max=512, step=2, description="d_model"),
            "p": widgets.IntSlider(value=16, min=0, max=511, description="p"),
        }

        def draw(n_positions, d_model, p):
            return draw_position_similarity(n_positions, d_model, (0, min(p, n_positions - 1)))

        return linked_controls(controls, draw)

    return live_or_static("W02.5", build_live, lambda: draw_position_similarity(n_positions, d_model), static,
                          caption=f"{n_positions} positions, D={d_model}.")
