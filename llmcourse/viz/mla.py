"""Unit 13 widgets: the MLA data flow with live shapes, cache sizes of MHA/GQA/MQA/MLA, the absorption check and
why RoPE breaks absorption.

Each widget has a pure compute function (unit-tested in ``tests/test_unit13_deepseek_mla_viz.py``), a draw
function that paints a matplotlib ``Figure`` and ``show_*(static=None)`` (see :mod:`llmcourse.viz.base`).
Every number comes from the library (:mod:`llmcourse.models.deepseek_mla`, :mod:`llmcourse.nn.kv_cache`) or from
modules built here with seeded weights.
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from ..models.deepseek_mla import DEEPSEEK_V3_MLA, SimpleMLA, absorbed_forward
from ..models.llama3 import rope_cos_sin, rope_inv_freq
from ..nn.kv_cache import attn_cache_elems_per_token
from .base import figure, linked_controls, live_or_static, redrawing_output

__all__ = [
    "CACHE_PRESETS", "absorption_errors", "cache_comparison", "decode_macs", "mla_flow_shapes", "rope_absorption",
    "show_absorption_check", "show_cache_comparison", "show_mla_flow", "show_rope_absorption",
]

_CACHED, _PLAIN, _BAD = "#e6550d", "#6baed6", "#d62728"

# ============================================================================ W13.1 MLA flow


def mla_flow_shapes(d_model: int = 7168, n_heads: int = 128, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
                    qk_nope_head_dim: int = 128, v_head_dim: int = 128) -> dict:
    """Per-token shapes along DeepSeek's attention (no query compression shown) and what is cached.

    Returns ``{"shapes": {name: tuple}, "cached": d_c + d_R, "mha_equivalent": H·(d_nope + d_R + d_v),
    "ratio": mha_equivalent / cached}`` (elements per token and layer).
    """
    h, dc, dr, dn, dv = n_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim
    shapes = {"x": (d_model,), "c_kv": (dc,), "k_pe": (dr,), "k_nope": (h, dn), "v": (h, dv), "q_nope": (h, dn),
              "q_pe": (h, dr), "keys": (h, dn + dr), "out": (h * dv,)}
    cached = dc + dr
    mha = h * (dn + dr + dv)
    return {"shapes": shapes, "cached": cached, "mha_equivalent": mha, "ratio": mha / cached}


def draw_mla_flow(d_model=7168, n_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                  v_head_dim=128) -> Figure:
    info = mla_flow_shapes(d_model, n_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim)
    s = info["shapes"]
    fig, ax = figure(figsize=(10, 4.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6)
    ax.axis("off")

    def box(x, y, text, color, w=2.0, h=0.8):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05", fc=color, ec="#333",
                                    alpha=0.9))
        ax.text(x, y, text, ha="center", va="center", fontsize=8.5)

    def arrow(x0, y0, x1, y1, label=""):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", color="#444"))
        if label:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, label, fontsize=7, ha="center", color="#444")

    box(1.1, 3.0, f"x\n{s['x']}", "#eee")
    box(3.8, 4.6, f"c_KV (RMSNorm)\n{s['c_kv']}  cached", _CACHED)
    box(3.8, 3.2, f"k_pe (RoPE)\n{s['k_pe']}  cached, shared", _CACHED)
    box(3.8, 1.2, f"q_nope {s['q_nope']}\nq_pe {s['q_pe']} (RoPE)", _PLAIN, w=2.4)
    box(6.8, 4.6, f"k_nope {s['k_nope']}\nv {s['v']}", _PLAIN, w=2.2)
    box(6.8, 2.6, f"keys [k_nope; k_pe]\n{s['keys']}", _PLAIN, w=2.2)
    box(9.0, 2.6, f"attention\n→ o_proj {s['out']}", "#eee", w=1.8)
    arrow(2.1, 3.2, 2.8, 4.5, "kv_a_proj_with_mqa")
    arrow(2.1, 3.0, 2.8, 3.2)
    arrow(2.1, 2.8, 2.6, 1.3, "q_proj / q_a→q_b")
    arrow(4.8, 4.6, 5.7, 4.6, "kv_b_proj")
    arrow(6.8, 4.2, 6.8, 3.0)
    arrow(4.8, 3.2, 5.7, 2.7)
    arrow(5.0, 1.3, 8.1, 2.4)
    arrow(7.9, 2.6, 8.1, 2.6)
    ax.set_title(f"cached per token and layer: d_c + d_R = {info['cached']:,} elements; per-head K and V would be "
                 f"{info['mha_equivalent']:,} ({info['ratio']:.1f}×)", fontsize=10)
    return fig


def show_mla_flow(static: bool | None = None):
    """W13.1: sliders for D, H, d_c, d_R, d_nope, d_v; the block diagram with live shapes and the cached boxes
    highlighted. Static: DeepSeek-V3's sizes."""

    def build_live():
        import ipywidgets as widgets

        v3 = DEEPSEEK_V3_MLA
        controls = {
            "d_model": widgets.SelectionSlider(options=[128, 512, 1024, 2048, 4096, 5120, 7168], value=v3["d_model"],
                                               description="D"),
            "n_heads": widgets.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128], value=v3["n_heads"],
                                               description="H"),
            "kv_lora_rank": widgets.SelectionSlider(options=[16, 32, 64, 128, 256, 512, 1024],
                                                    value=v3["kv_lora_rank"], description="d_c"),
            "qk_rope_head_dim": widgets.SelectionSlider(options=[8, 16, 32, 64, 128], value=v3["qk_rope_head_dim"],
                                                        description="d_R"),
            "qk_nope_head_dim": widgets.SelectionSlider(options=[16, 32, 64, 128, 256],
                                                        value=v3["qk_nope_head_dim"], description="d_nope"),
            "v_head_dim": widgets.SelectionSlider(options=[16, 32, 64, 128, 256], value=v3["v_head_dim"],
                                                  description="d_v"),
        }
        names = list(controls)
        return linked_controls(controls, draw_mla_flow, rows=[names[:3], names[3:]])

    return live_or_static("W13.1", build_live, draw_mla_flow, static, caption="DeepSeek-V3's attention sizes.")


# ============================================================================ W13.2 cache comparison

# Attention sizes for the cache comparison: real configs and the course's tiny models (4 layers, D = 128).
# GQA uses ``n_kv_heads`` key/value heads of the MHA head sizes; MLA the model's own (or a tiny) latent.
CACHE_PRESETS: dict[str, dict] = {
    "DeepSeek-V3": dict(n_layers=61, n_heads=128, n_kv_heads=8, k_head_dim=192, v_head_dim=128, kv_lora_rank=512,
                        qk_rope_head_dim=64),
    "course tiny models": dict(n_layers=4, n_heads=4, n_kv_heads=2, k_head_dim=32, v_head_dim=32, kv_lora_rank=64,
                               qk_rope_head_dim=16),
}


def cache_comparison(preset: str = "DeepSeek-V3", seq_len: int = 32768, bytes_per_elem: int = 2) -> dict:
    """Elements per token and total bytes at ``seq_len`` (one sequence) for MHA, GQA, MQA and MLA.

    Returns ``{"kinds": [...], "per_token": [...], "bytes": [...], "gqa_groups_equal_to_mla": g}`` where ``g`` is
    the number of GQA key/value heads that would cache as much as MLA (``(d_c + d_R) / (dk + dv)``).
    """
    p = CACHE_PRESETS[preset]
    common = dict(n_layers=p["n_layers"], k_head_dim=p["k_head_dim"], v_head_dim=p["v_head_dim"])
    per = [attn_cache_elems_per_token("mha", n_heads=p["n_heads"], **common),
           attn_cache_elems_per_token("gqa", n_kv_heads=p["n_kv_heads"], **common),
           attn_cache_elems_per_token("mqa", **common),
           attn_cache_elems_per_token("mla", p["n_layers"], kv_lora_rank=p["kv_lora_rank"],
                                      qk_rope_head_dim=p["qk_rope_head_dim"])]
    groups = (p["kv_lora_rank"] + p["qk_rope_head_dim"]) / (p["k_head_dim"] + p["v_head_dim"])
    return {"kinds": ["MHA", f"GQA ({p['n_kv_heads']} KV heads)", "MQA", "MLA"], "per_token": per,
            "bytes": [n * seq_len * bytes_per_elem for n in per], "gqa_groups_equal_to_mla": groups}


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def draw_cache_comparison(preset: str = "DeepSeek-V3", seq_len: int = 32768, lengths=None) -> Figure:
    lengths = [seq_len] if lengths is None else list(lengths)
    fig, axes = figure(1, 1 + len(lengths), figsize=(4.2 * (1 + len(lengths)), 3.8))
    r = cache_comparison(preset, lengths[0])
    colors = [_PLAIN, _PLAIN, _PLAIN, _CACHED]
    ax = axes[0]
    bars = ax.bar(range(4), r["per_token"], color=colors)
    for b, n in zip(bars, r["per_token"]):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{n:,}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(4), r["kinds"], fontsize=7, rotation=15)
    ax.set_yscale("log")
    ax.set_title(f"{preset}: cached elements per token\nMLA = GQA with {r['gqa_groups_equal_to_mla']:.2f} KV heads",
                 fontsize=9)
    for ax, n in zip(axes[1:], lengths):
        rb = cache_comparison(preset, n)
        bars = ax.bar(range(4), rb["bytes"], color=colors)
        for b, v in zip(bars, rb["bytes"]):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), _gib(v), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(4), rb["kinds"], fontsize=7, rotation=15)
        ax.set_yscale("log")
        ax.set_title(f"bf16 cache of one {n:,}-token sequence", fontsize=9)
    return fig


def show_cache_comparison(static: bool | None = None):
    """W13.2: preset dropdown and a sequence-length slider; bars of elements per token and total bytes.
    Static: DeepSeek-V3 at 32K and 128K tokens."""

    def build_live():
        import ipywidgets as widgets

        preset = widgets.Dropdown(options=list(CACHE_PRESETS), value="DeepSeek-V3", description="model")
        length = widgets.SelectionSlider(options=[2**i for i in range(8, 18)], value=32768, description="tokens")
        out, update = redrawing_output(draw_cache_comparison)

        def refresh(_=None):
            update(preset=preset.value, seq_len=length.value)

        preset.observe(refresh, names="value")
        length.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([preset, length]), out])

    return live_or_static("W13.2", build_live,
                          lambda: draw_cache_comparison("DeepSeek-V3", lengths=(32768, 131072)), static,
                          caption="DeepSeek-V3 (bf16) at 32,768 and 131,072 tokens.")


# ============================================================================ W13.3 absorption check


def decode_macs(cache_len: int, d_model: int, n_heads: int, head_dim: int, kv_lora_rank: int) -> dict:
    """Multiply–adds of :class:`~llmcourse.models.deepseek_mla.SimpleMLA` for one decoded token reading ``cache_len``
    cached latents (plus its own).

    ``naive`` rebuilds every key and value from the latents: ``D·d_c`` (down-projection) ``+ D·H·hd`` (query)
    ``+ 2·S·d_c·H·hd`` (up-projections) ``+ 2·S·H·hd`` (scores, weighted sum) ``+ H·hd·D`` (output), with
    ``S = cache_len + 1``. ``absorbed`` uses ``A`` and ``Bo``: ``D·d_c + D·H·d_c + 2·S·H·d_c + H·d_c·D``.
    """
    s, d, h, hd, dc = cache_len + 1, d_model, n_heads, head_dim, kv_lora_rank
    naive = d * dc + d * h * hd + 2 * s * dc * h * hd + 2 * s * h * hd + h * hd * d
    absorbed = d * dc + d * h * dc + 2 * s * h * dc + h * dc * d
    return {"naive": naive, "absorbed": absorbed}


def _head_split_forward(mla: SimpleMLA, x, c_all, mask):
    """The common wrong absorption: ``(W_q.weight @ W_uk.weight)`` cut into heads and applied to head-split x."""
    b, t, _ = x.shape
    h, hd = mla.n_heads, mla.head_dim
    wrong = (mla.W_q.weight @ mla.W_uk.weight).view(h, hd, -1)
    q_lat = torch.einsum("bhte,hec->bhtc", x.view(b, t, h, hd).transpose(1, 2), wrong)
    scores = (q_lat @ c_all.unsqueeze(1).transpose(-2, -1) / math.sqrt(hd)).masked_fill(~mask, float("-inf"))
    lat = torch.softmax(scores, -1) @ c_all.unsqueeze(1)
    bo = torch.stack([mla.W_o.weight[:, i * hd:(i + 1) * hd] @ mla.W_uv.weight[i * hd:(i + 1) * hd] for i in range(h)])
    return torch.einsum("bhtc,hdc->btd", lat, bo)


@torch.no_grad()
def absorption_errors(seed: int = 0, batch: int = 2, seq: int = 5, d_model: int = 32, n_heads: int = 4,
                      head_dim: int = 8, kv_lora_rank: int = 6) -> dict:
    """Max ``|Δ|`` against naive :class:`SimpleMLA` (float64, weights ``randn``) of the correct per-head absorption
    and of the head-split form (which needs ``d_model == n_heads·head_dim``)."""
    g = torch.Generator().manual_seed(seed)
    m = SimpleMLA(d_model, n_heads, head_dim, kv_lora_rank).double()
    for p in m.parameters():
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    x = torch.randn(batch, seq, d_model, generator=g, dtype=torch.float64)
    mask = torch.ones(seq, seq, dtype=torch.bool).tril()
    naive, c = m(x, mask), m.W_dkv(x)
    return {"naive": 0.0, "absorbed": float((absorbed_forward(m, x, c, mask) - naive).abs().max()),
            "head-split bug": float((_head_split_forward(m, x, c, mask) - naive).abs().max())}


def draw_absorption(method: str = "absorbed", d_model: int = 128, n_heads: int = 4, head_dim: int = 32,
                    kv_lora_rank: int = 64, max_len: int = 4096) -> Figure:
    errs = absorption_errors()
    fig, (ax1, ax2) = figure(1, 2, figsize=(10, 3.6))
    names = list(errs)
    vals = [max(errs[n], 1e-18) for n in names]
    bars = ax1.bar(names, vals, color=[_PLAIN if n != method else (_BAD if "bug" in n else _CACHED) for n in names])
    for b, n in zip(bars, names):
        ax1.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{errs[n]:.1e}", ha="center", va="bottom", fontsize=8)
    ax1.set_yscale("log")
    ax1.set_title(f"max |output − naive| (float64): {method} = {errs[method]:.1e}", fontsize=9)
    lengths = [2**i for i in range(0, int(math.log2(max_len)) + 1)]
    costs = [decode_macs(t, d_model, n_heads, head_dim, kv_lora_rank) for t in lengths]
    ax2.plot(lengths, [c["naive"] for c in costs], label="naive (rebuild K, V)", color=_PLAIN)
    ax2.plot(lengths, [c["absorbed"] for c in costs], label="absorbed", color=_CACHED)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("cached tokens")
    ax2.set_ylabel("multiply–adds per decoded token")
    ax2.legend(fontsize=8)
    ax2.set_title(f"D={d_model}, H={n_heads}, hd={head_dim}, d_c={kv_lora_rank}", fontsize=9)
    return fig


def _absorption_table() -> Figure:
    errs = absorption_errors()
    fig, ax = figure(figsize=(7, 2.6))
    ax.axis("off")
    rows = [[n, f"{e:.1e}"] for n, e in errs.items()]
    for t in (16, 256, 4096):
        c = decode_macs(t, 128, 4, 32, 64)
        rows.append([f"multiply–adds per token, {t} cached (naive / absorbed)", f"{c['naive']:,} / {c['absorbed']:,}"])
    table = ax.table(cellText=rows, colLabels=["", "value"], loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.3)
    return fig


def show_absorption_check(static: bool | None = None):
    """W13.3: buttons "naive", "absorbed", "head-split bug": max ``|Δ|`` against naive and the decode cost per token
    against cache length. Static: a table."""

    def build_live():
        import ipywidgets as widgets

        buttons = widgets.ToggleButtons(options=["naive", "absorbed", "head-split bug"], value="absorbed")
        out, update = redrawing_output(draw_absorption)
        buttons.observe(lambda _c: update(method=buttons.value), names="value")
        update(method=buttons.value)
        return widgets.VBox([buttons, out])

    return live_or_static("W13.3", build_live, _absorption_table, static,
                          caption="errors against naive MLA (float64) and decode cost at D=128, H=4, hd=32, d_c=64.")


# ============================================================================ W13.4 why RoPE breaks absorption


@torch.no_grad()
def rope_absorption(offsets, d_model: int = 16, head_dim: int = 8, kv_lora_rank: int = 6, seed: int = 0,
                    theta: float = 10000.0) -> dict:
    """The matrix between ``x_i`` and ``c_j`` in one head's score, per offset ``j − i``.

    With RoPE on the full key, ``score = x_iᵀ W_Qᵀ R_{j−i} W_UK c_j`` (half-split rotation ``R`` by the offset),
    so ``M(offset) = W_Qᵀ R_{j−i} W_UK`` ``(D, d_c)`` changes with the offset and cannot be precomputed once. In the
    decoupled design the non-rotated part uses ``W_Qᵀ W_UK`` for every offset. Returns ``{"offsets", "M": (n, D,
    d_c), "fixed": (D, d_c), "change": [‖M(o) − M(0)‖ / ‖M(0)‖]}`` with seeded ``randn`` weights.
    """
    g = torch.Generator().manual_seed(seed)
    wq = torch.randn(head_dim, d_model, generator=g, dtype=torch.float64)
    wuk = torch.randn(head_dim, kv_lora_rank, generator=g, dtype=torch.float64)
    offs = torch.tensor(list(offsets))
    cos, sin = rope_cos_sin(rope_inv_freq(head_dim, theta), offs)
    h = head_dim // 2
    mats = []
    for c, s in zip(cos.double(), sin.double()):
        r = torch.zeros(head_dim, head_dim, dtype=torch.float64)   # k ↦ rotated k, half-split pairs
        idx = torch.arange(h)
        r[idx, idx], r[idx, idx + h] = c[:h], -s[:h]
        r[idx + h, idx], r[idx + h, idx + h] = s[:h], c[:h]
        mats.append(wq.T @ r @ wuk)
    m = torch.stack(mats)
    fixed = wq.T @ wuk
    return {"offsets": offs.tolist(), "M": m, "fixed": fixed,
            "change": [float((mi - fixed).norm() / fixed.norm()) for mi in m]}


def draw_rope_absorption(offset: int = 3, max_offset: int = 64) -> Figure:
    r = rope_absorption(range(max_offset + 1))
    fig, axes = figure(1, 3, figsize=(11, 3.4))
    vmax = float(r["fixed"].abs().max())
    axes[0].imshow(r["fixed"].numpy(), cmap="RdBu", vmin=-vmax, vmax=vmax, aspect="auto")
    axes[0].set_title("decoupled: W_Qᵀ W_UK (every offset)", fontsize=9)
    axes[1].imshow(r["M"][offset].numpy(), cmap="RdBu", vmin=-vmax, vmax=vmax, aspect="auto")
    axes[1].set_title(f"RoPE on the key: W_Qᵀ R_{{{offset}}} W_UK", fontsize=9)
    for ax in axes[:2]:
        ax.set_xlabel("latent dim")
        ax.set_ylabel("model dim")
    axes[2].plot(r["offsets"], r["change"], color=_BAD)
    axes[2].axvline(offset, color="#555", lw=0.8)
    axes[2].axhline(0, color=_CACHED, lw=1.5, label="decoupled (always 0)")
    axes[2].set_xlabel("offset j − i")
    axes[2].set_ylabel("‖M(offset) − W_Qᵀ W_UK‖ / ‖W_Qᵀ W_UK‖")
    axes[2].legend(fontsize=7)
    axes[2].set_title(f"relative change at offset {offset}: {r['change'][offset]:.2f}", fontsize=9)
    return fig


def show_rope_absorption(static: bool | None = None):
    """W13.4: a slider for the offset ``j − i``; the effective matrix with RoPE changes, the decoupled one does not.
    Static: offsets 0, 3 and 40."""

    def build_live():
        import ipywidgets as widgets

        slider = widgets.IntSlider(value=3, min=0, max=64, description="offset j − i")
        out, update = redrawing_output(draw_rope_absorption)
        slider.observe(lambda _c: update(offset=slider.value), names="value")
        update(offset=slider.value)
        return widgets.VBox([slider, out])

    def build_static():
        r = rope_absorption([0, 3, 40])
        fig, axes = figure(1, 3, figsize=(10, 3.2))
        vmax = float(r["fixed"].abs().max())
        for ax, o, m, ch in zip(axes, r["offsets"], r["M"], r["change"]):
            ax.imshow(m.numpy(), cmap="RdBu", vmin=-vmax, vmax=vmax, aspect="auto")
            ax.set_title(f"W_Qᵀ R_{{{o}}} W_UK: change {ch:.2f}", fontsize=9)
        return fig

    return live_or_static("W13.4", build_live, build_static, static,
                          caption="the matrix between x and the latent at offsets 0, 3 and 40 (RoPE on the key).")
