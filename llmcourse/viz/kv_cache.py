"""Widgets of unit 12 (the KV cache): the cache animation, the memory calculator and the speed plot.

* W12.1 :func:`show_cache_animation` — a step button through prefill and decoding of a real cache-aware model:
  the K/V stacks of every layer grow, one new query row per decoding step, and that row's attention weights
  (layer 0, head 0) over every cached key. Data: :func:`cache_animation_frames`.
* W12.2 :func:`show_memory_calculator` — cache bytes for a preset (:data:`llmcourse.nn.kv_cache.KV_PRESETS`)
  at a sequence length and batch, in fp32/bf16/fp8, as MHA, GQA or MQA, against the model's weight size.
  Data: :func:`cache_memory`.
* W12.3 :func:`show_speed_plot` — measured ms per generated token with and without the cache
  (:func:`measure_decode_speed`), never asserted.
"""

from __future__ import annotations

import math
import time

import torch

from ..nn.kv_cache import KV_PRESETS, KVCache, kv_cache_bytes
from .base import figure, linked_controls, live_or_static, redrawing_output

__all__ = ["DTYPE_BYTES", "cache_animation_frames", "cache_memory", "draw_cache_frame", "draw_memory",
           "draw_speed", "measure_decode_speed", "show_cache_animation", "show_memory_calculator",
           "show_speed_plot"]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1}
_OLD, _NEW, _Q = "#90a4ae", "#ef6c00", "#1565c0"


# ------------------------------------------------------------------------------------------------ W12.1


@torch.no_grad()
def cache_animation_frames(model, idx: torch.Tensor, n_steps: int, head: int = 0) -> list[dict]:
    """Run prefill on ``idx (1, T0)`` and ``n_steps − 1`` greedy decoding steps of a cache-aware model.

    ``model(ids, cache=KVCache)`` must follow :class:`llmcourse.models.llama3_cached.CachedLlama3Model`.
    Returns one dict per call: ``step`` (0 = prefill), ``new`` (list of the new positions), ``cache_len`` (per
    layer, after the call), ``tokens`` (ids so far) and ``weights`` ``(T_new, T_total)`` float32: the attention
    of the new queries of layer 0, query head ``head``, over every cached key (recomputed from the cached keys
    and the layer's own projections; masked entries are 0).
    """
    model.eval()
    cache = KVCache(len(model.layers))
    frames, ids, feed = [], idx, idx
    attn0 = model.layers[0].self_attn
    for step in range(n_steps):
        start = cache.seq_len
        T = feed.shape[1]
        logits = model(feed, cache=cache)
        x = model.layers[0].input_layernorm(model.embed_tokens(feed))
        q, _, _ = attn0.project(x, model.rope_cos[start:start + T], model.rope_sin[start:start + T])
        kv_head = head // attn0.n_rep
        k = cache.keys[0][0, kv_head]
        scores = q[0, head] @ k.T / math.sqrt(attn0.head_dim)
        mask = model.causal[start:start + T, :start + T]
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        frames.append({"step": step, "new": list(range(start, start + T)), "tokens": ids[0].tolist(),
                       "cache_len": [int(kk.shape[2]) for kk in cache.keys], "weights": weights.float()})
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        feed = nxt
    return frames


def draw_cache_frame(frames: list[dict], step: int, decode=None):
    """Left: the cached K and V of every layer (grey: already cached, orange: appended by this call).
    Right: the new query rows' attention weights over the cached keys."""
    f = frames[min(step, len(frames) - 1)]
    total = max(len(fr["new"]) + fr["new"][0] for fr in frames)
    fig, (ax1, ax2) = figure(1, 2, figsize=(10, 3.6), width_ratios=[1, 1.3])
    n_layers = len(f["cache_len"])
    first_new = f["new"][0]
    for layer in range(n_layers):
        for j, kind in enumerate(("K", "V")):
            y = layer * 2.6 + j * 1.1
            ax1.barh(y, first_new, color=_OLD, height=0.9)
            ax1.barh(y, len(f["new"]), left=first_new, color=_NEW, height=0.9)
            ax1.text(-0.4, y, f"L{layer} {kind}", ha="right", va="center", fontsize=8)
    ax1.set_xlim(-4, total + 0.5)
    ax1.set_yticks([])
    ax1.set_xlabel("cached positions")
    phase = "prefill" if f["step"] == 0 else f"decode step {f['step']}"
    ax1.set_title(f"{phase}: cache length {f['cache_len'][0]} in every layer", fontsize=10)
    w = f["weights"]
    img = torch.full((w.shape[0], total), float("nan"))
    img[:, : w.shape[1]] = w
    ax2.imshow(img.numpy(), aspect="auto", cmap="Oranges", vmin=0, vmax=float(w.max()))
    ax2.set_xlabel("key position (cached)")
    ax2.set_ylabel("new query position")
    ax2.set_yticks(range(w.shape[0]), [str(p) for p in f["new"]])
    if decode is not None:
        ax2.set_xticks(range(len(f["tokens"])), [repr(decode([t]))[1:-1] for t in f["tokens"]], fontsize=6)
    ax2.set_title(f"{w.shape[0]} new quer{'y' if w.shape[0] == 1 else 'ies'} × {w.shape[1]} keys "
                  "(layer 0, head 0)", fontsize=10)
    return fig


def show_cache_animation(frames: list[dict], decode=None, static: bool | None = None):
    """W12.1: a step button through prefill and decoding. Static: steps 0, 1 and 5."""

    def build_live():
        import ipywidgets as widgets

        out, update = redrawing_output(lambda step: draw_cache_frame(frames, step, decode))
        step = widgets.IntSlider(value=0, min=0, max=len(frames) - 1, description="call")
        nxt = widgets.Button(description="next step")

        def advance(_):
            step.value = (step.value + 1) % len(frames)

        nxt.on_click(advance)
        step.observe(lambda ch: update(step=ch["new"]), names="value")
        update(step=0)
        return widgets.VBox([widgets.HBox([nxt, step]), out])

    def build_static():
        shown = [s for s in (0, 1, 5) if s < len(frames)]
        fig, axes = figure(len(shown), 1, figsize=(9, 1.9 * len(shown)), squeeze=False)
        total = max(len(fr["new"]) + fr["new"][0] for fr in frames)
        for ax, s in zip(axes[:, 0], shown):
            w = frames[s]["weights"]
            img = torch.full((w.shape[0], total), float("nan"))
            img[:, : w.shape[1]] = w
            ax.imshow(img.numpy(), aspect="auto", cmap="Oranges", vmin=0, vmax=float(w.max()))
            ax.set_ylabel("new query")
            ax.set_yticks(range(w.shape[0]), [str(p) for p in frames[s]["new"]], fontsize=6)
            phase = "prefill" if s == 0 else f"decode step {s}"
            ax.set_title(f"{phase}: cache {frames[s]['cache_len'][0]} positions per layer, "
                         f"{w.shape[0]} new quer{'y' if w.shape[0] == 1 else 'ies'}", fontsize=9)
        axes[-1, 0].set_xlabel("key position")
        return fig

    return live_or_static("W12.1", build_live, build_static, static,
                          caption="Attention of the new queries over the cached keys: steps 0, 1 and 5.")


# ------------------------------------------------------------------------------------------------ W12.2


def cache_memory(preset: str, seq_len: int, batch_size: int = 1, dtype: str = "bf16",
                 attention: str | None = None) -> dict:
    """Cache and weight sizes of a :data:`KV_PRESETS` model, in bytes.

    ``attention``: ``None`` (the model's own), ``"MHA"`` (KV = H), ``"GQA"`` (the model's KV, or H/4 for an MHA
    model) or ``"MQA"`` (KV = 1). Returns ``{"cache", "per_token", "weights", "n_kv_heads", "ratio"}`` with
    ``ratio`` = cache ÷ weights (weights in the same dtype).
    """
    p = KV_PRESETS[preset]
    kv = {"MHA": p["n_heads"], "MQA": 1, None: p["n_kv_heads"],
          "GQA": p["n_kv_heads"] if p["n_kv_heads"] < p["n_heads"] else max(1, p["n_heads"] // 4)}[attention]
    b = DTYPE_BYTES[dtype]
    cache = kv_cache_bytes(p["n_layers"], kv, p["head_dim"], seq_len, batch_size, b)
    weights = p["n_params"] * b
    return {"cache": cache, "per_token": kv_cache_bytes(p["n_layers"], kv, p["head_dim"], 1, 1, b),
            "weights": weights, "n_kv_heads": kv, "ratio": cache / weights}


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f}"


def draw_memory(preset: str = "Llama-3.2-3B", seq_len: int = 8192, batch_size: int = 1, dtype: str = "bf16",
                attention: str = "model"):
    """Bars: the cache of MHA/GQA/MQA at ``seq_len`` vs the weights. Curves: cache size against length."""
    att = None if attention == "model" else attention
    fig, (ax1, ax2) = figure(1, 2, figsize=(10.5, 3.8))
    kinds = ["MHA", "GQA", "MQA"]
    sizes = [cache_memory(preset, seq_len, batch_size, dtype, k)["cache"] for k in kinds]
    mine = cache_memory(preset, seq_len, batch_size, dtype, att)
    bars = ax1.bar(kinds + ["weights"], [s / 2**20 for s in sizes] + [mine["weights"] / 2**20],
                   color=[_OLD, _OLD, _OLD, "#6d4c41"])
    chosen = {"MHA": 0, "MQA": 2, "GQA": 1}.get(att) if att else (
        0 if mine["n_kv_heads"] == KV_PRESETS[preset]["n_heads"] else 2 if mine["n_kv_heads"] == 1 else 1)
    bars[chosen].set_color(_NEW)
    for bar, s in zip(bars, sizes + [mine["weights"]]):
        ax1.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), _human(s), ha="center", va="bottom", fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("MiB")
    ax1.set_title(f"{preset}, {dtype}, batch {batch_size}, {seq_len:,} tokens", fontsize=10)
    lengths = [2**i for i in range(0, 18)]
    for k in kinds:
        ax2.plot(lengths, [cache_memory(preset, n, batch_size, dtype, k)["cache"] / 2**20 for n in lengths], label=k)
    ax2.axhline(mine["weights"] / 2**20, color="#6d4c41", ls="--", label="weights")
    ax2.axvline(seq_len, color=_NEW, lw=0.8)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("sequence length (tokens)")
    ax2.set_ylabel("cache, MiB")
    ax2.legend(fontsize=8)
    ax2.set_title(f"{_human(mine['per_token'])} per token ({mine['n_kv_heads']} KV heads); "
                  f"cache / weights = {mine['ratio']:.2f}", fontsize=10)
    return fig


def show_memory_calculator(preset: str = "Llama-3.2-3B", static: bool | None = None):
    """W12.2: preset dropdown, sequence length (log slider 1–131,072), batch (1–64), dtype, attention type.
    Static: Llama-3.2-3B, bf16, batch 1 at 8,192 tokens."""

    def build_live():
        import ipywidgets as widgets

        controls = {
            "preset": widgets.Dropdown(options=list(KV_PRESETS), value=preset, description="model"),
            "seq_len": widgets.SelectionSlider(options=[2**i for i in range(18)], value=8192, description="tokens"),
            "batch_size": widgets.IntSlider(value=1, min=1, max=64, description="batch"),
            "dtype": widgets.Dropdown(options=list(DTYPE_BYTES), value="bf16", description="dtype"),
            "attention": widgets.Dropdown(options=["model", "MHA", "GQA", "MQA"], value="model",
                                          description="attention"),
        }
        names = list(controls)
        return linked_controls(controls, draw_memory, rows=[names[:3], names[3:]])

    return live_or_static("W12.2", build_live, lambda: draw_memory(preset), static,
                          caption=f"{preset}, bf16, batch 1, 8,192 tokens.")


# ------------------------------------------------------------------------------------------------ W12.3


@torch.no_grad()
def measure_decode_speed(cached_model, plain_model, idx: torch.Tensor, n_new: int, progress=None) -> dict:
    """Greedy decoding of ``n_new`` tokens after ``idx`` with and without a cache, timed per step.

    ``cached_model(ids, cache=KVCache)`` (prefill, then one token per call) and ``plain_model(ids)`` (the whole
    sequence every step) must hold the same weights. Returns ``{"length": [T0+1 …], "cached_ms": [...],
    "uncached_ms": [...], "same_tokens": bool}``: milliseconds of the step that produced each token (the first
    cached step includes the prefill).
    """
    cached_model.eval()
    plain_model.eval()
    cache = KVCache(len(cached_model.layers))
    out, c_ms = idx, []
    feed = idx
    steps = range(n_new) if progress is None else progress(range(n_new), desc="cached")
    for _ in steps:
        t0 = time.perf_counter()
        nxt = cached_model(feed, cache=cache)[:, -1].argmax(-1, keepdim=True)
        c_ms.append(1000 * (time.perf_counter() - t0))
        out = torch.cat([out, nxt], dim=1)
        feed = nxt
    ref, u_ms = idx, []
    steps = range(n_new) if progress is None else progress(range(n_new), desc="uncached")
    for _ in steps:
        t0 = time.perf_counter()
        nxt = plain_model(ref)[:, -1].argmax(-1, keepdim=True)
        u_ms.append(1000 * (time.perf_counter() - t0))
        ref = torch.cat([ref, nxt], dim=1)
    return {"length": list(range(idx.shape[1] + 1, idx.shape[1] + n_new + 1)), "cached_ms": c_ms,
            "uncached_ms": u_ms, "same_tokens": bool(torch.equal(out, ref))}


def draw_speed(result: dict, log: bool = True, smooth: int = 5):
    """ms per generated token against sequence length (moving median over ``smooth`` steps)."""

    def med(xs):
        return [sorted(xs[max(0, i - smooth + 1): i + 1])[len(xs[max(0, i - smooth + 1): i + 1]) // 2]
                for i in range(len(xs))]

    fig, ax = figure(figsize=(7, 3.6))
    ax.plot(result["length"], med(result["uncached_ms"]), label="without cache (whole sequence each step)")
    ax.plot(result["length"], med(result["cached_ms"]), label="with cache (one token each step)")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("sequence length after the step (tokens)")
    ax.set_ylabel("ms per generated token")
    total_c, total_u = sum(result["cached_ms"]), sum(result["uncached_ms"])
    ax.set_title(f"{len(result['length'])} tokens: {total_u / 1000:.2f} s without, {total_c / 1000:.2f} s with "
                 f"the cache ({total_u / total_c:.1f}×)", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def show_speed_plot(result: dict, static: bool | None = None):
    """W12.3: the measured speed plot (log-scale toggle and smoothing). Static: the recorded run."""

    def build_live():
        import ipywidgets as widgets

        log = widgets.Checkbox(value=True, description="log scale")
        smooth = widgets.IntSlider(value=5, min=1, max=25, description="smoothing")
        out, update = redrawing_output(lambda log, smooth: draw_speed(result, log, smooth))

        def refresh(_=None):
            update(log=log.value, smooth=smooth.value)

        log.observe(refresh, names="value")
        smooth.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([log, smooth]), out])

    return live_or_static("W12.3", build_live, lambda: draw_speed(result), static,
                          caption="Measured on this machine; timings vary from run to run.")
