"""Widgets of unit 06 (translation): W06.1 alignment explorer, W06.2 training monitor, W06.3 translation box.

Matplotlib has no Devanagari font here and does not shape Indic scripts, so figure labels show Hindi
tokens **romanised** (:func:`romanize`, a simplified IAST-style transliteration); text outputs and the
live widgets' text show the Devanagari itself.
"""

from __future__ import annotations

import torch

from .base import figure, live_or_static, redrawing_output

__all__ = [
    "alignment_view", "draw_alignment", "draw_training_curves", "romanize", "show_alignment_explorer",
    "make_training_monitor", "show_training_monitor", "show_translation_box", "translation_view",
]

# ---------------------------------------------------------------- romanisation (labels only)

_VOWELS = dict(zip("अआइईउऊऋएऐओऔ", ["a", "ā", "i", "ī", "u", "ū", "ṛ", "e", "ai", "o", "au"]))
_SIGNS = dict(zip("ािीुूृेैोौ", ["ā", "i", "ī", "u", "ū", "ṛ", "e", "ai", "o", "au"]))
_CONS = dict(zip("कखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसह",
                 ["k", "kh", "g", "gh", "ṅ", "c", "ch", "j", "jh", "ñ", "ṭ", "ṭh", "ḍ", "ḍh", "ṇ", "t", "th", "d", "dh",
                  "n", "p", "ph", "b", "bh", "m", "y", "r", "l", "v", "ś", "ṣ", "s", "h"]))
_NUKTA = {"क": "q", "ख": "x", "ग": "ġ", "ज": "z", "ड": "ṛ", "ढ": "ṛh", "फ": "f"}
_OTHER = {"ं": "ṃ", "ँ": "̃", "ः": "ḥ", "।": ".", "॥": "..", "ॉ": "o", "ऑ": "o"}


def romanize(text: str) -> str:
    """Devanagari -> Latin letters for plot labels (inherent ``a`` after consonants, virama drops it).

    ``romanize("नमस्ते") == "namaste"``; other scripts pass through unchanged. For display only.
    """
    import unicodedata

    text = unicodedata.normalize("NFD", text)
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch in _CONS:
            base = _CONS[ch]
            if i + 1 < len(text) and text[i + 1] == "\u093c":
                base = _NUKTA.get(ch, base)
                i += 1
            nxt = text[i + 1] if i + 1 < len(text) else ""
            if nxt == "\u094d":
                out.append(base)
                i += 2
                continue
            if nxt in _SIGNS:
                out.append(base + _SIGNS[nxt])
                i += 2
                continue
            out.append(base + "a")
        elif ch in _VOWELS:
            out.append(_VOWELS[ch])
        elif ch in _OTHER:
            out.append(_OTHER[ch])
        elif ch == "\u093c":
            pass
        else:
            out.append(ch)
        i += 1
    return unicodedata.normalize("NFC", "".join(out))


def _label(symbol: str) -> str:
    return romanize(symbol.replace("</w>", "_"))


# ---------------------------------------------------------------- W06.1 alignment explorer


def alignment_view(model, src_tok, tgt_tok, sentence: str, layer: int = -1, head: int | None = None,
                   max_len: int | None = None) -> dict:
    """Greedy-translate ``sentence`` and return its cross-attention map.

    Returns ``{"src_tokens": [...], "tgt_tokens": [...], "weights": (L, S) tensor, "translation": str,
    "probs": (L,)}``: row ``i`` is the decoding step that produced target token ``i`` (its EOS included),
    columns are the source BPE tokens; ``head=None`` averages over heads. Rows sum to 1.
    """
    from ..data.translation import make_translation_batch
    from ..train.decoding import greedy_translate_verbose

    max_len = max_len or model.max_len
    ids = src_tok.encode(sentence)[:max_len] or [3]
    src, _, _ = make_translation_batch([(ids, [0])], max_len)
    v = greedy_translate_verbose(model, src, max_len)
    toks = v["tokens"][0].tolist()
    n = toks.index(2) + 1 if 2 in toks else len(toks)
    w = v["cross_weights"][layer][0]                  # (H, L, S)
    w = w.mean(0) if head is None else w[head]
    return {"src_tokens": [src_tok.itos[i] for i in ids], "tgt_tokens": [tgt_tok.itos[i] for i in toks[:n]],
            "weights": w[:n], "translation": tgt_tok.decode(toks), "probs": v["probs"][0, :n]}


def draw_alignment(views: list[dict], highlight: int | None = None, titles: list[str] | None = None):
    """One heatmap per view (target steps × source tokens); ``highlight`` outlines that decoding step."""
    fig, axes = figure(1, len(views), figsize=(4.2 * len(views), 4.0), squeeze=False)
    for k, (ax, v) in enumerate(zip(axes[0], views)):
        w = v["weights"].numpy()
        ax.imshow(w, cmap="Blues", vmin=0, vmax=max(float(w.max()), 1e-6), aspect="auto")
        ax.set_xticks(range(len(v["src_tokens"])), [_label(s) for s in v["src_tokens"]], rotation=70, fontsize=8)
        ax.set_yticks(range(len(v["tgt_tokens"])), [_label(s) for s in v["tgt_tokens"]], fontsize=8)
        ax.set_xlabel("source (English BPE tokens)")
        ax.set_ylabel("generated Hindi tokens (romanised)")
        if highlight is not None and 0 <= highlight < w.shape[0]:
            ax.add_patch(__import__("matplotlib.patches").patches.Rectangle(
                (-0.5, highlight - 0.5), w.shape[1], 1, fill=False, edgecolor="crimson", linewidth=2))
        if titles:
            ax.set_title(titles[k], fontsize=9)
    return fig


def show_alignment_explorer(model, src_tok, tgt_tok, sentences: list[str], static: bool | None = None):
    """W06.1: sentence dropdown, decoder-layer and head selectors (or mean), decoding-step slider.

    Static fallback: the first three sentences, last layer, mean over heads.
    """
    n_layers = len(model.decoder.layers)
    n_heads = model.decoder.layers[0].cross_attn.num_heads

    def build_static():
        views = [alignment_view(model, src_tok, tgt_tok, s) for s in sentences[:3]]
        return draw_alignment(views, titles=[s[:40] for s in sentences[:3]])

    def build_live():
        import ipywidgets as widgets

        sent = widgets.Dropdown(options=sentences, value=sentences[0], description="sentence")
        layer = widgets.Dropdown(options=list(range(n_layers)), value=n_layers - 1, description="layer")
        head = widgets.Dropdown(options=[("mean over heads", -1)] + [(f"head {h}", h) for h in range(n_heads)],
                                value=-1, description="head")
        step = widgets.IntSlider(value=0, min=0, max=0, description="step")
        text = widgets.HTML()
        out, update = redrawing_output(lambda view, hl: draw_alignment([view], hl))

        def refresh(_change=None):
            v = alignment_view(model, src_tok, tgt_tok, sent.value, layer.value,
                               None if head.value < 0 else head.value)
            step.max = max(len(v["tgt_tokens"]) - 1, 0)
            i = min(step.value, step.max)
            tok = v["tgt_tokens"][i] if v["tgt_tokens"] else ""
            text.value = (f"<b>{v['translation']}</b><br>step {i}: token <code>{tok}</code>, "
                          f"p = {float(v['probs'][i]) if len(v['probs']) else 0:.2f}")
            update(view=v, hl=i)

        for c in (sent, layer, head, step):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([sent, layer, head]), step, text, out])

    return live_or_static("W06.1", build_live, build_static, static,
                          caption="Cross-attention of the last decoder layer, mean over heads.")


# ---------------------------------------------------------------- W06.2 training monitor


def draw_training_curves(history: dict, chrf_score: float | None = None, smooth: int = 20, log_y: bool = False):
    """Train loss (raw and moving average), validation loss, and the learning rate per step."""
    fig, (ax, ax_lr) = figure(1, 2, figsize=(10, 3.6))
    steps, loss = history["step"], torch.tensor(history["loss"])
    ax.plot(steps, loss.numpy(), color="0.75", linewidth=0.8, label="train (per batch)")
    if len(loss) >= smooth > 1:
        avg = loss.unfold(0, smooth, 1).mean(1)
        ax.plot(steps[smooth - 1:], avg.numpy(), color="tab:blue", label=f"train (mean of {smooth})")
    if history.get("val_loss"):
        ax.plot(history["val_step"], history["val_loss"], "o-", color="tab:orange", label="validation (no smoothing)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss per target token")
    if log_y:
        ax.set_yscale("log")
    title = "loss" + (f"   (val chrF {chrf_score:.1f})" if chrf_score is not None else "")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax_lr.plot(steps, history["lr"], color="tab:green")
    ax_lr.set_xlabel("step")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_title("Noam schedule")
    return fig


def show_training_monitor(history: dict, chrf_score: float | None = None, static: bool | None = None):
    """W06.2: the loss and lr curves of a finished run, with a smoothing slider and a log-scale toggle.

    ``train_translation(..., callback=...)`` can redraw during training (see the lab notebook).
    Static fallback: the final curves.
    """
    def build_live():
        import ipywidgets as widgets

        smooth = widgets.IntSlider(value=20, min=1, max=200, description="smoothing")
        log = widgets.Checkbox(value=False, description="log y axis")
        out, update = redrawing_output(lambda s, lg: draw_training_curves(history, chrf_score, s, lg))

        def refresh(_change=None):
            update(s=smooth.value, lg=log.value)

        smooth.observe(refresh, names="value")
        log.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([smooth, log]), out])

    return live_or_static("W06.2", build_live, lambda: draw_training_curves(history, chrf_score), static,
                          caption="Training and validation loss per target token; Noam learning rate.")


# ---------------------------------------------------------------- W06.3 translation box


def translation_view(model, src_tok, tgt_tok, text: str) -> dict:
    """``{"translation": str, "tokens": [symbols], "probs": [float]}`` for one English sentence (greedy)."""
    v = alignment_view(model, src_tok, tgt_tok, text)
    return {"translation": v["translation"], "tokens": v["tgt_tokens"], "probs": [float(p) for p in v["probs"]]}


def _draw_token_probs(rows: list[tuple[str, dict]]):
    fig, axes = figure(len(rows), 1, figsize=(9, 1.3 * len(rows) + 0.4), squeeze=False)
    for ax, (src, v) in zip(axes[:, 0], rows):
        ax.bar(range(len(v["probs"])), v["probs"], color="tab:purple")
        ax.set_xticks(range(len(v["tokens"])), [_label(t) for t in v["tokens"]], fontsize=8, rotation=30)
        ax.set_ylim(0, 1)
        ax.set_ylabel("p", fontsize=8)
        ax.set_title(f"{src}  ->  {romanize(v['translation'])}", fontsize=9, loc="left")
    return fig


def show_translation_box(model, src_tok, tgt_tok, examples: list[str], static: bool | None = None):
    """W06.3: type English, see the greedy Hindi output and each token's probability.

    Static fallback: the (first five) ``examples``, romanised in the figure.
    """
    def build_live():
        import ipywidgets as widgets

        box = widgets.Text(value=examples[0], description="English", layout=widgets.Layout(width="60%"))
        text = widgets.HTML()
        out, update = redrawing_output(lambda src, v: _draw_token_probs([(src, v)]))

        def refresh(_change=None):
            v = translation_view(model, src_tok, tgt_tok, box.value)
            text.value = f"<span style='font-size:large'>{v['translation']}</span>"
            update(src=box.value, v=v)

        box.observe(refresh, names="value")
        refresh()
        return widgets.VBox([box, text, out])

    def build_static():
        return _draw_token_probs([(s, translation_view(model, src_tok, tgt_tok, s)) for s in examples[:5]])

    return live_or_static("W06.3", build_live, build_static, static,
                          caption="Greedy translations; bars are the probability of each chosen token.")


def make_training_monitor(static: bool | None = None):
    """W06.2 during training: ``(widget, callback)``; pass ``callback`` to ``train_translation(..., callback=...)``
    and display ``widget`` before training; the curves are redrawn at every evaluation.

    Returns ``(None, None)`` when widgets are static (``ci``): show the final curves with
    :func:`show_training_monitor` instead.
    """
    from ..runtime import widgets_live
    from .base import css_class

    if static is None:
        static = not widgets_live()
    if static:
        return None, None
    import ipywidgets as widgets

    out, update = redrawing_output(lambda h: draw_training_curves(h))
    box = widgets.VBox([out])
    box.add_class("llmcourse-widget")
    box.add_class(css_class("W06.2"))
    return box, lambda hist: update(h=hist)
