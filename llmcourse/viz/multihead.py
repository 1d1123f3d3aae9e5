"""Unit 04 widgets: per-head attention maps, the head-merge layout, and the mask translator.

* W04.1 :func:`show_head_viewer`: per-head attention maps over the GPT-2 tokens of a real sentence, for
  a small **untrained, seeded** stack of llmcourse :class:`~llmcourse.nn.multihead.MultiHeadAttention`
  layers (residual connections, no norms, no FFN), with layer and head selectors and a causal toggle.
  The patterns are not linguistic (nothing was trained); they show that every head computes its own
  ``(T, T)`` map from its own slice of the projections, and that layer 2 sees mixed inputs.
* W04.2 :func:`show_merge_visualiser`: which (token, head) block fills each slot of the merged
  ``(B, T, H·hd)`` tensor, for the correct ``transpose → contiguous → view`` merge and for the
  no-transpose bug (F04.4).
* W04.3 :func:`show_mask_translator`: one causal mask in four conventions: the course mask (bottom-right,
  ``True`` = attend), ``nn.MultiheadAttention``'s ``attn_mask`` (``~mask``, ``True`` = blocked), and
  SDPA's ``is_causal`` (top-left) next to the bottom-right mask a KV cache needs.

Compute functions are pure and unit-tested; draw functions paint a matplotlib ``Figure``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.colors import ListedColormap
from torch import Tensor

from ..nn.masks import causal_mask
from ..nn.multihead import MultiHeadAttention
from ..nn.positions import sinusoidal_pe
from .attention import _controls_box, _default_sentence, _heatmap, sentence_tokens, token_label
from .base import figure, live_or_static, redrawing_output

__all__ = [
    "head_viewer_weights", "draw_head_viewer", "show_head_viewer", "model_head_weights", "show_trained_head_viewer",
    "tagged_head_context", "merge_layout", "draw_merge_layout", "show_merge_visualiser",
    "mask_translation", "draw_mask_translation", "show_mask_translator",
]

# ====================================================================== W04.1 head viewer


def head_viewer_weights(ids, n_layers: int = 2, num_heads: int = 4, d_model: int = 64, causal: bool = True,
                        seed: int = 0, qk_gain: float = 3.0) -> Tensor:
    """Attention weights of every head of a seeded, untrained stack of ``MultiHeadAttention`` layers.

    Input: each token id gets a fixed N(0, 1) embedding (generator seeded with ``seed·1_000_003 + id``,
    so repeated tokens share a vector), plus the sinusoidal positional encoding. Layer ``l`` is
    ``MultiHeadAttention(d_model, d_model, num_heads, causal=causal)`` created after
    ``torch.manual_seed(seed + l)``, with ``W_query``/``W_key`` multiplied by ``qk_gain`` (default init
    gives nearly uniform maps at this size); the stream is ``x ← x + mha(x)``. Runs under ``no_grad``
    and restores the global RNG state.

    Args:
        ids: ``T`` token ids (``T ≥ 1``).
        n_layers, num_heads, d_model: sizes; ``d_model`` even and divisible by ``num_heads``.
        causal: use causal layers.
        qk_gain: factor on the query and key projections (> 0).

    Returns:
        ``(n_layers, num_heads, T, T)`` float32 weights; every row sums to 1.

    Raises:
        ValueError: empty ``ids``, sizes < 1, ``qk_gain <= 0``, or sizes ``MultiHeadAttention`` rejects.
    """
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("ids is empty: pass at least one token id")
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    if not qk_gain > 0:
        raise ValueError(f"qk_gain must be > 0, got {qk_gain}")
    if d_model % 2:
        raise ValueError(f"d_model must be even (sinusoidal positions), got {d_model}")
    t = len(ids)
    rows = [torch.randn(d_model, generator=torch.Generator().manual_seed(int(seed) * 1_000_003 + i)) for i in ids]
    x = (torch.stack(rows) + sinusoidal_pe(t, d_model)).unsqueeze(0)
    out = []
    with torch.random.fork_rng(), torch.no_grad():
        for layer in range(n_layers):
            torch.manual_seed(int(seed) + layer)
            mha = MultiHeadAttention(d_model, d_model, num_heads, causal=causal,
                                     context_length=t if causal else None).eval()
            mha.W_query.weight.mul_(qk_gain)
            mha.W_key.weight.mul_(qk_gain)
            mha.store_weights = True
            x = x + mha(x)
            out.append(mha.last_weights[0])
    return torch.stack(out)


def draw_head_viewer(tokens, weights: Tensor, layer: int = 0, head: int | str = "all", kind: str = "untrained, seeded"):
    """W04.1 for one setting: one head's ``(T, T)`` map, or (``head="all"``) a grid of the layer's heads."""
    n_layers, n_heads = weights.shape[:2]
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer must be in 0..{n_layers - 1}, got {layer}")
    labels = [token_label(s) for s in tokens]
    if head == "all":
        cols = 2 if n_heads <= 4 else math.ceil(math.sqrt(n_heads))
        rows = math.ceil(n_heads / cols)
        fig, axes = figure(rows, cols, figsize=(5.2 * cols, 4.8 * rows), squeeze=False)
        for h in range(rows * cols):
            ax = axes[h // cols][h % cols]
            if h >= n_heads:
                ax.set_axis_off()
                continue
            _heatmap(ax, weights[layer, h].numpy(), labels, labels, annotate=False)
            ax.set_title(f"layer {layer}, head {h}", fontsize=10)
        return fig
    h = int(head)
    if not 0 <= h < n_heads:
        raise ValueError(f"head must be in 0..{n_heads - 1} or 'all', got {head}")
    fig, ax = figure(figsize=(8, 7))
    im = _heatmap(ax, weights[layer, h].numpy(), labels, labels, annotate=False)
    fig.colorbar(im, ax=ax, shrink=0.8, label="attention weight")
    ax.set_title(f"layer {layer}, head {h} ({kind})", fontsize=10)
    return fig


def model_head_weights(model, ids) -> Tensor:
    """Attention weights of every head of a trained GPT-style model on one sequence.

    ``model`` has ``model.blocks[l].attn``, each a :class:`~llmcourse.nn.MultiHeadAttention` (as
    :class:`~llmcourse.models.gpt2.GPT2Model`); the forward pass runs under ``no_grad`` with
    ``store_weights`` switched on and restored afterwards. ``ids``: ``T`` token ids, ``1 ≤ T ≤`` the
    model's context length.

    Returns:
        ``(n_layers, num_heads, T, T)`` float32 weights (post-softmax, the model's own causal mask).

    Raises:
        ValueError: empty ``ids``.
    """
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("ids is empty: pass at least one token id")
    attns = [blk.attn for blk in model.blocks]
    saved = [a.store_weights for a in attns]
    was_training = model.training
    try:
        model.eval()
        for a in attns:
            a.store_weights = True
        with torch.no_grad():
            model(torch.tensor([ids]))
        return torch.stack([a.last_weights[0].float().cpu() for a in attns])
    finally:
        for a, s_ in zip(attns, saved):
            a.store_weights = s_
        model.train(was_training)


def show_trained_head_viewer(model, tokenizer, text: str, max_chars: int = 48, static: bool | None = None):
    """The head viewer on a **trained** model: text box, layer and head selectors (no causal toggle: the
    model's own causal mask applies). ``tokenizer`` has ``encode``/``decode`` (e.g. the character
    tokenizer of the course's trained character GPT); the text is cut to ``max_chars`` tokens.
    Static fallback: the grid of layer 0's heads.
    """
    n_layers, num_heads = len(model.blocks), model.blocks[0].attn.num_heads

    def tokens_of(t):
        ids = tokenizer.encode(t)[:max_chars]
        return ids, [tokenizer.decode([i]) for i in ids]

    def draw(text=text, layer=0, head="all"):
        ids, toks = tokens_of(text if text.strip() else " ")
        return draw_head_viewer(toks, model_head_weights(model, ids), layer, head, kind="trained")

    def build_live():
        import ipywidgets as widgets

        box = widgets.Text(value=text, description="text", continuous_update=False,
                           layout=widgets.Layout(width="60%"))
        layer = widgets.Dropdown(options=list(range(n_layers)), value=0, description="layer")
        head = widgets.Dropdown(options=["all"] + list(range(num_heads)), value="all", description="head")
        for w, cls in ((box, "sentence"), (layer, "layer"), (head, "head")):
            w.add_class(f"llmcourse-{cls}")
        out, update = redrawing_output(draw)

        def redraw(_=None):
            update(text=box.value, layer=layer.value, head=head.value)

        for c in (box, layer, head):
            c.observe(redraw, names="value")
        redraw()
        header = (f"<b>Per-head attention maps of a trained model</b>: {n_layers} layers × {num_heads} heads, "
                  f"first {max_chars} characters")
        return _controls_box([box, layer, head], out, header=header)

    return live_or_static("W04.4", build_live, lambda: draw(), static,
                          caption=f"Layer 0, all {num_heads} heads of the trained model.")


def show_head_viewer(text: str | None = None, max_tokens: int = 16, n_layers: int = 2, num_heads: int = 4,
                     d_model: int = 64, seed: int = 0, static: bool | None = None):
    """W04.1 head viewer: sentence box, layer and head selectors, causal toggle.

    The text (default: the first line of "the-verdict") is cut to ``max_tokens`` GPT-2 tokens; the maps
    come from :func:`head_viewer_weights` (an untrained seeded stack, not a trained model). Static
    fallback: the 2×2 grid of layer 0's four heads, causal.
    """
    text = _default_sentence() if text is None else text
    ids, tokens = sentence_tokens(text, max_tokens)
    head_viewer_weights(ids[:1], n_layers, num_heads, d_model, True, seed)  # validate sizes early

    def draw(text=text, layer=0, head="all", causal=True):
        ids_, tokens_ = sentence_tokens(text, max_tokens) if text.strip() else (ids, tokens)
        w = head_viewer_weights(ids_, n_layers, num_heads, d_model, causal, seed)
        return draw_head_viewer(tokens_, w, layer, head)

    def build_live():
        import ipywidgets as widgets

        box = widgets.Text(value=text, description="sentence", continuous_update=False,
                           layout=widgets.Layout(width="60%"))
        layer = widgets.Dropdown(options=list(range(n_layers)), value=0, description="layer")
        head = widgets.Dropdown(options=["all"] + list(range(num_heads)), value="all", description="head")
        causal = widgets.Checkbox(value=True, description="causal", indent=False)
        for w, cls in ((box, "sentence"), (layer, "layer"), (head, "head"), (causal, "causal")):
            w.add_class(f"llmcourse-{cls}")
        out, update = redrawing_output(draw)

        def redraw(_=None):
            update(text=box.value, layer=layer.value, head=head.value, causal=causal.value)

        for c in (box, layer, head, causal):
            c.observe(redraw, names="value")
        redraw()
        header = (f"<b>Per-head attention maps</b>: {n_layers} untrained seeded MultiHeadAttention layers, "
                  f"{num_heads} heads, d_model {d_model}, first {max_tokens} GPT-2 tokens")
        return _controls_box([box, layer, head, causal], out, header=header)

    return live_or_static("W04.1", build_live, lambda: draw(), static,
                          caption=f"Layer 0, all {num_heads} heads, causal, {len(tokens)} GPT-2 tokens "
                                  "(untrained seeded layers).")


# ====================================================================== W04.2 merge visualiser


def tagged_head_context(batch: int = 1, n_heads: int = 2, t: int = 3, head_dim: int = 3) -> Tensor:
    """A per-head context whose entries say where they come from, shape ``(B, H, T, hd)``:
    ``context[b, h, t, :] = 1000·b + 100·h + 10·t + [0, 1, …, head_dim−1]`` (the lesson's merge example)."""
    b = torch.arange(batch).view(-1, 1, 1, 1) * 1000
    h = torch.arange(n_heads).view(1, -1, 1, 1) * 100
    tt = torch.arange(t).view(1, 1, -1, 1) * 10
    return (b + h + tt + torch.arange(head_dim).view(1, 1, 1, -1)).float()


def merge_layout(batch: int = 1, t: int = 3, n_heads: int = 2, head_dim: int = 3, bug: bool = False) -> dict:
    """Where each ``(token, head)`` block lands after merging ``(B, H, T, hd)`` into ``(B, T, H·hd)``.

    The context tensor is tagged so that each entry knows its token and head; the merge is either the
    correct ``transpose(1, 2).contiguous().view(B, T, H·hd)`` or (``bug=True``) the no-transpose
    ``reshape(B, T, H·hd)``.

    Returns:
        ``{"token": (B, T, H·hd) long, "head": (B, T, H·hd) long, "merged": (B, T, H·hd) float}``, where
        ``merged`` is the merge of :func:`tagged_head_context` (F04.4 for the defaults).

    Raises:
        ValueError: if a size is < 1.
    """
    for name, v in (("batch", batch), ("t", t), ("n_heads", n_heads), ("head_dim", head_dim)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    token = torch.arange(t).view(1, 1, t, 1).expand(batch, n_heads, t, head_dim)
    head = torch.arange(n_heads).view(1, n_heads, 1, 1).expand(batch, n_heads, t, head_dim)
    ctx = tagged_head_context(batch, n_heads, t, head_dim)

    def merge(z):
        if bug:
            return z.reshape(batch, t, n_heads * head_dim)
        return z.transpose(1, 2).contiguous().view(batch, t, n_heads * head_dim)

    return {"token": merge(token), "head": merge(head), "merged": merge(ctx)}


def draw_merge_layout(batch: int = 1, t: int = 3, n_heads: int = 2, head_dim: int = 3):
    """W04.2: the correct merge and the no-transpose bug side by side (batch element 0)."""
    fig, axes = figure(1, 2, figsize=(11, 1.2 + 0.55 * t))
    colours = ListedColormap(["#8fb9e3", "#f2b36f", "#9ed29a", "#d99ad6", "#e8e27a", "#9ad6d3", "#e39a9a",
                              "#b6a0e0"])
    for ax, bug in zip(axes, (False, True)):
        lay = merge_layout(batch, t, n_heads, head_dim, bug)
        heads = lay["head"][0].numpy()
        tokens = lay["token"][0].numpy()
        ax.imshow(heads % 8, cmap=colours, vmin=0, vmax=7, aspect="auto")
        if n_heads * head_dim <= 24:
            for i in range(t):
                for j in range(n_heads * head_dim):
                    ax.text(j, i, f"t{tokens[i, j]}\nh{heads[i, j]}", ha="center", va="center", fontsize=7,
                            color="crimson" if tokens[i, j] != i else "black")
        ax.set_yticks(range(t))
        ax.set_yticklabels([f"row of token {i}" for i in range(t)], fontsize=8)
        ax.set_xlabel("merged feature slot (colour = head)")
        wrong = int((tokens != np.arange(t)[:, None]).sum())
        title = ("no-transpose reshape (bug)" if bug else "transpose → contiguous → view") + \
                f": {wrong} slots hold another token"
        ax.set_title(title, fontsize=10)
    return fig


def show_merge_visualiser(static: bool | None = None):
    """W04.2 merge visualiser: B, T and H sliders (head_dim 3). Static: F04.4 (B=1, T=3, H=2)."""

    def build_live():
        import ipywidgets as widgets

        b = widgets.IntSlider(value=1, min=1, max=3, description="B", continuous_update=False)
        t = widgets.IntSlider(value=3, min=1, max=8, description="T", continuous_update=False)
        h = widgets.IntSlider(value=2, min=1, max=6, description="H", continuous_update=False)
        for w, cls in ((b, "batch"), (t, "seq"), (h, "heads")):
            w.add_class(f"llmcourse-{cls}")
        out, update = redrawing_output(lambda batch, t, n_heads: draw_merge_layout(batch, t, n_heads, 3))

        def redraw(_=None):
            update(batch=b.value, t=t.value, n_heads=h.value)

        for c in (b, t, h):
            c.observe(redraw, names="value")
        redraw()
        return _controls_box([b, t, h], out, header="<b>Merging heads</b>: which (token t, head h) fills each slot")

    return live_or_static("W04.2", build_live, lambda: draw_merge_layout(1, 3, 2, 3), static,
                          caption="B=1, T=3, H=2, head_dim=3.")


# ====================================================================== W04.3 mask translator


def mask_translation(t_q: int = 2, t_k: int = 5) -> dict:
    """One causal mask in the conventions unit 04 meets, each ``(t_q, t_k)`` bool.

    Returns:
        ``{"course": causal_mask(t_q, t_k)`` (bottom-right, True = attend),
        ``"torch_mha": ~course`` (``nn.MultiheadAttention`` attn_mask, True = blocked),
        ``"is_causal": tril(ones(t_q, t_k))`` (what SDPA's ``is_causal=True`` applies: top-left, True = attend),
        ``"differs": course != is_causal}``.

    Raises:
        ValueError: if ``t_q < 1``, ``t_k < 1`` or ``t_q > t_k`` (a query row would see nothing).
    """
    if t_q < 1 or t_k < 1:
        raise ValueError(f"t_q and t_k must be >= 1, got {t_q}, {t_k}")
    if t_q > t_k:
        raise ValueError(f"t_q={t_q} > t_k={t_k}: the first queries would have no key to attend to")
    course = causal_mask(t_q, t_k)
    top_left = torch.ones(t_q, t_k, dtype=torch.bool).tril()
    return {"course": course, "torch_mha": ~course, "is_causal": top_left, "differs": course != top_left}


def draw_mask_translation(t_q: int = 2, t_k: int = 5):
    """W04.3: the three masks side by side; cells where is_causal differs from the course mask are outlined."""
    m = mask_translation(t_q, t_k)
    fig, axes = figure(1, 3, figsize=(13, 1.6 + 0.45 * t_q))
    attend = ListedColormap(["#e6e6e6", "#4c8bd6"])
    panels = [("course mask (True = attend)\nbottom-right: causal_mask(t_q, t_k)", m["course"], "T", attend),
              ("nn.MultiheadAttention attn_mask = ~mask\n(True = BLOCKED)", m["torch_mha"], "T",
               ListedColormap(["#e6e6e6", "#d65c4c"])),
              ("SDPA is_causal=True (top-left)\nTrue = attend", m["is_causal"], "T", attend)]
    for ax, (title, mask, _, cmap) in zip(axes, panels):
        arr = mask.numpy()
        ax.imshow(arr.astype(float), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for i in range(t_q):
            for j in range(t_k):
                ax.text(j, i, "T" if arr[i, j] else "F", ha="center", va="center", fontsize=8)
                if mask is m["is_causal"] and bool(m["differs"][i, j]):
                    ax.add_patch(_outline(j, i))
        ax.set_xticks(range(t_k))
        ax.set_yticks(range(t_q))
        ax.set_xlabel("key position")
        ax.set_ylabel("query row")
        ax.set_title(title, fontsize=9)
    n = int(m["differs"].sum())
    fig.suptitle(f"T_q={t_q}, T_k={t_k}: is_causal disagrees with the bottom-right mask in {n} cells (outlined)",
                 fontsize=10)
    return fig


def _outline(x, y):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="crimson", linewidth=2)


def show_mask_translator(static: bool | None = None):
    """W04.3 mask translator: T_q and T_k sliders. Static: T_q=2, T_k=5."""

    def build_live():
        import ipywidgets as widgets

        tq = widgets.IntSlider(value=2, min=1, max=8, description="T_q", continuous_update=False)
        tk = widgets.IntSlider(value=5, min=1, max=8, description="T_k", continuous_update=False)
        tq.add_class("llmcourse-tq")
        tk.add_class("llmcourse-tk")
        out, update = redrawing_output(draw_mask_translation)

        def redraw(_=None):
            if tq.value > tk.value:  # keep T_q <= T_k
                tk.value = tq.value
                return
            update(t_q=tq.value, t_k=tk.value)

        for c in (tq, tk):
            c.observe(redraw, names="value")
        redraw()
        return _controls_box([tq, tk], out, header="<b>One causal mask, three conventions</b>")

    return live_or_static("W04.3", build_live, lambda: draw_mask_translation(2, 5), static,
                          caption="T_q=2 queries after T_k=5 keys.")
