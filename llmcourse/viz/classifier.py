"""Widgets of unit 07 (encoder classifier): W07.1 confusion matrix, W07.2 ``[CLS]`` attention,
W07.3 training curves.

Each widget follows :mod:`llmcourse.viz.base`: a pure compute function (tested by pytest), a draw
function that returns a matplotlib ``Figure``, and ``show_<name>(..., static=None)``, which returns the
live ipywidgets UI or, under the ``ci`` profile (or with ``static=True``), one static figure.

=========  ============================  ==========================  ===========================
widget     compute                       draw                        show
=========  ============================  ==========================  ===========================
W07.1      :func:`confusion_view`        :func:`draw_confusion`      :func:`show_confusion`
W07.2      :func:`cls_attention`         :func:`draw_cls_attention`  :func:`show_cls_attention`
W07.3      :func:`best_epoch`            :func:`draw_training`       :func:`show_training_curves`
=========  ============================  ==========================  ===========================
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure

from ..data.sentiment import SOURCES, encode_batch
from ..models.encoder_classifier import attention_maps
from ..train.classification import accuracy, confusion_matrix
from .base import figure, live_or_static, redrawing_output

__all__ = [
    "CLASS_NAMES", "DEFAULT_SENTENCES", "best_epoch", "cls_attention", "confusion_view", "draw_cls_attention",
    "draw_confusion", "draw_training", "show_cls_attention", "show_confusion", "show_training_curves",
]

CLASS_NAMES = ("negative", "positive")
DEFAULT_SENTENCES = (
    "The battery life is great and the screen is sharp.",
    "Not good at all, I want my money back.",
    "The food was not bad, but the service was slow.",
    "I have never been so bored in a movie theater.",
)

# ============================================================================ W07.1 confusion matrix


def confusion_view(predictions: dict, split: str = "test", source: str = "all", num_classes: int = 2) -> dict:
    """The confusion matrix and accuracy of one split, optionally restricted to one source.

    Args:
        predictions: ``{split: {"y_true": (N,) long, "y_pred": (N,) long, "source": list of N str}}``.
        split: a key of ``predictions``. source: ``"all"`` or one of ``amazon``/``imdb``/``yelp``.
        num_classes: C.

    Returns:
        dict with ``confusion`` ((C, C) long, rows = true), ``accuracy`` (float) and ``n`` (int).

    Raises:
        ValueError: unknown split or source, or no example of that source in the split.
    """
    if split not in predictions:
        raise ValueError(f"unknown split {split!r}; choose from {sorted(predictions)}")
    if source != "all" and source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose 'all' or one of {list(SOURCES)}")
    p = predictions[split]
    y_true, y_pred = torch.as_tensor(p["y_true"]), torch.as_tensor(p["y_pred"])
    if source != "all":
        keep = torch.tensor([s == source for s in p["source"]], dtype=torch.bool)
        if not keep.any():
            raise ValueError(f"split {split!r} has no example from {source!r}")
        y_true, y_pred = y_true[keep], y_pred[keep]
    return {"confusion": confusion_matrix(y_true, y_pred, num_classes), "accuracy": accuracy(y_true, y_pred),
            "n": len(y_true)}


def _heatmap(ax, cm: torch.Tensor, title: str) -> None:
    data = cm.numpy()
    ax.imshow(data, cmap="Blues", vmin=0)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            ax.text(j, i, str(int(data[i, j])), ha="center", va="center",
                    color="white" if data[i, j] > 0.6 * max(data.max(), 1) else "black", fontsize=11)
    ticks = range(data.shape[0])
    ax.set_xticks(ticks, CLASS_NAMES[: data.shape[0]])
    ax.set_yticks(ticks, CLASS_NAMES[: data.shape[0]])
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=10)


def draw_confusion(predictions: dict, split: str = "test", sources: Sequence[str] = ("all",)) -> Figure:
    """One heatmap per source (counts annotated; rows = true labels, columns = predictions)."""
    fig, axes = figure(1, len(sources), figsize=(3.2 * len(sources), 3.2), squeeze=False)
    for ax, source in zip(axes[0], sources):
        view = confusion_view(predictions, split, source)
        _heatmap(ax, view["confusion"], f"{split} / {source}: acc {view['accuracy']:.3f} (n={view['n']})")
    return fig


def show_confusion(predictions: dict, static: bool | None = None):
    """W07.1: split and source selectors over a confusion-matrix heatmap.

    Static fallback: the test split, all sources and each source separately.
    """

    def build_live():
        import ipywidgets as widgets

        split = widgets.Dropdown(options=list(predictions), value="test" if "test" in predictions else None,
                                 description="split")
        source = widgets.Dropdown(options=["all", *SOURCES], value="all", description="source")
        out, update = redrawing_output(draw_confusion)

        def refresh(_change=None):
            update(predictions=predictions, split=split.value, sources=(source.value,))

        for c in (split, source):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([widgets.HBox([split, source]), out])

    return live_or_static("W07.1", build_live, lambda: draw_confusion(predictions, "test", ("all", *SOURCES)),
                          static, caption="Test split: all sources, then Amazon, IMDb and Yelp.")


# ============================================================================ W07.2 [CLS] attention


def _display_tokens(text: str, enc, vocab: dict[int, int], max_len: int) -> list[str]:
    pieces = [enc.decode([i]) if i in vocab else "[UNK]" for i in enc.encode(text)][: max_len - 2]
    return ["[CLS]", *pieces, "[SEP]"]


def cls_attention(model, enc, vocab: dict[int, int], text: str, max_len: int = 64) -> dict:
    """Where ``[CLS]`` looks, in every layer and head, and the model's prediction for one sentence.

    Args:
        model: an :class:`~llmcourse.models.encoder_classifier.EncoderClassifier` (run in eval mode;
            its mode is restored).
        enc, vocab, max_len: as for :func:`~llmcourse.data.sentiment.encode_batch`.
        text: the sentence.

    Returns:
        dict with ``tokens`` (list of L display strings, ``[CLS]`` … ``[SEP]``), ``weights`` ((n_layers,
        H, L) float: row 0 of every attention matrix, each summing to 1), and ``probs`` ((C,) float).

    Raises:
        ValueError: an empty text.
    """
    if not text.strip():
        raise ValueError("type a sentence first")
    ids, mask = encode_batch([text], enc, vocab, max_len)
    maps = attention_maps(model, ids, mask)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            probs = torch.softmax(model(ids, mask), dim=-1)[0]
    finally:
        model.train(was_training)
    weights = torch.stack([m[0, :, 0, :] for m in maps])  # (n_layers, H, L)
    return {"tokens": _display_tokens(text, enc, vocab, max_len), "weights": weights, "probs": probs}


def _bars(ax, view: dict, layer: int, head: int | str, title: str) -> None:
    w = view["weights"][layer]
    w = w.mean(0) if head == "mean" else w[head]
    ax.bar(range(len(w)), w.numpy(), color="#4c72b0")
    ax.set_xticks(range(len(w)), view["tokens"], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("[CLS] attention")
    ax.set_ylim(0, max(float(w.max()) * 1.15, 0.05))
    ax.set_title(title, fontsize=9)


def draw_cls_attention(views: Sequence[dict], layer: int = -1, head: int | str = "mean") -> Figure:
    """One bar chart of ``[CLS]``'s attention per sentence, titled with the predicted probabilities."""
    fig, axes = figure(len(views), 1, figsize=(8, 2.6 * len(views)), squeeze=False)
    n_layers = views[0]["weights"].shape[0]
    layer_no = layer % n_layers
    for ax, view in zip(axes[:, 0], views):
        p = view["probs"]
        title = (f"layer {layer_no}, head {head}: P(negative) = {float(p[0]):.2f}, "
                 f"P(positive) = {float(p[1]):.2f}")
        _bars(ax, view, layer_no, head, title)
    return fig


def show_cls_attention(model, enc, vocab: dict[int, int], max_len: int = 64,
                       sentences: Sequence[str] = DEFAULT_SENTENCES, static: bool | None = None):
    """W07.2: a text box plus layer and head selectors; a bar chart of ``[CLS]``'s attention.

    Static fallback: the four ``sentences``, last layer, mean over heads.
    """
    n_layers = len(model.layers)
    n_heads = model.layers[0].self_attn.num_heads

    def build_live():
        import ipywidgets as widgets

        text = widgets.Text(value=sentences[0], description="sentence", layout=widgets.Layout(width="90%"),
                            continuous_update=False)
        layer = widgets.Dropdown(options=list(range(n_layers)), value=n_layers - 1, description="layer")
        head = widgets.Dropdown(options=["mean", *range(n_heads)], value="mean", description="head")

        def draw(text, layer, head):
            try:
                view = cls_attention(model, enc, vocab, text, max_len)
            except ValueError as err:
                fig, ax = figure(figsize=(6, 1))
                ax.axis("off")
                ax.text(0, 0.5, str(err))
                return fig
            return draw_cls_attention([view], layer, head)

        out, update = redrawing_output(draw)

        def refresh(_change=None):
            update(text=text.value, layer=layer.value, head=head.value)

        for c in (text, layer, head):
            c.observe(refresh, names="value")
        refresh()
        return widgets.VBox([text, widgets.HBox([layer, head]), out])

    def build_static():
        return draw_cls_attention([cls_attention(model, enc, vocab, s, max_len) for s in sentences])

    return live_or_static("W07.2", build_live, build_static, static,
                          caption="Last layer, mean over heads, four fixed sentences.")


# ============================================================================ W07.3 training curves


def best_epoch(history: dict) -> int:
    """Index of the epoch with the highest validation accuracy (ties: the lowest validation loss, then
    the earliest epoch).

    Args:
        history: ``{"train_loss": [...], "val_loss": [...], "val_accuracy": [...]}``, one entry per epoch.

    Raises:
        ValueError: an empty history or lists of different lengths.
    """
    keys = ("train_loss", "val_loss", "val_accuracy")
    lengths = {len(history.get(k, [])) for k in keys}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"history needs equally long, non-empty lists {keys}; got lengths "
                         f"{[len(history.get(k, [])) for k in keys]}")
    acc, loss = history["val_accuracy"], history["val_loss"]
    return min(range(len(acc)), key=lambda e: (-acc[e], loss[e], e))


def draw_training(history: dict, upto: int | None = None) -> Figure:
    """Mean train and validation loss per epoch (left) and validation accuracy (right), best epoch marked."""
    n = len(history["train_loss"]) if upto is None else upto
    epochs = np.arange(1, n + 1)
    best = best_epoch({k: history[k][:n] for k in ("train_loss", "val_loss", "val_accuracy")})
    fig, (ax1, ax2) = figure(1, 2, figsize=(9, 3.2))
    ax1.plot(epochs, history["train_loss"][:n], "o-", ms=3, label="train (mean per example)")
    ax1.plot(epochs, history["val_loss"][:n], "s-", ms=3, label="validation")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("cross-entropy")
    ax1.legend(fontsize=8)
    ax2.plot(epochs, history["val_accuracy"][:n], "s-", ms=3, color="C1")
    for ax in (ax1, ax2):
        ax.axvline(best + 1, color="grey", ls="--", lw=1)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("validation accuracy")
    ax2.set_title(f"best epoch {best + 1}: {history['val_accuracy'][best]:.3f}", fontsize=10)
    return fig


def show_training_curves(history: dict, static: bool | None = None):
    """W07.3: an epoch slider replays the curves; the dashed line marks the best validation epoch so far.

    Static fallback: the final curves.
    """
    n = len(history["train_loss"])

    def build_live():
        import ipywidgets as widgets

        upto = widgets.IntSlider(value=n, min=1, max=n, description="epochs")
        out, update = redrawing_output(draw_training)

        def refresh(_change=None):
            update(history=history, upto=upto.value)

        upto.observe(refresh, names="value")
        refresh()
        return widgets.VBox([upto, out])

    return live_or_static("W07.3", build_live, lambda: draw_training(history), static,
                          caption="Final curves; the dashed line is the best validation epoch.")
