"""Classification metrics and evaluation (unit 07): confusion matrix, accuracy, ``evaluate``.

Conventions: labels are class indices ``0 … C−1`` (long tensors); a confusion matrix has **rows =
true labels, columns = predictions** (the convention of scikit-learn's ``confusion_matrix``).
Losses are reported as the **mean over examples**, never as a sum of batch losses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["accuracy", "confusion_matrix", "evaluate"]


def _labels(y: Tensor, name: str) -> Tensor:
    y = torch.as_tensor(y)
    if y.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of class indices, got shape {tuple(y.shape)}")
    if y.is_floating_point() or y.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer class indices, got dtype {y.dtype}")
    return y.long()


def confusion_matrix(y_true: Tensor, y_pred: Tensor, num_classes: int) -> Tensor:
    """Counts of (true, predicted) pairs.

    Args:
        y_true, y_pred: (N,) integer class indices in ``[0, num_classes)``.
        num_classes: C.

    Returns:
        (C, C) long tensor ``M`` with ``M[i, j]`` = number of examples of true class ``i`` predicted as
        ``j`` (rows = true, columns = predicted). Its entries sum to N and ``trace / N`` is the accuracy.

    Raises:
        ValueError: shapes differ, tensors are not 1-D integer tensors, or a label is out of range.

    Example (F07.2): ``y_true=[0,0,1,1,1]``, ``y_pred=[0,1,1,1,0]`` → ``[[1, 1], [1, 2]]``.
    """
    t, p = _labels(y_true, "y_true"), _labels(y_pred, "y_pred")
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred must have the same length, got {len(t)} and {len(p)}")
    for name, y in (("y_true", t), ("y_pred", p)):
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise ValueError(f"{name} has labels outside [0, {num_classes}): min {int(y.min())}, max {int(y.max())}")
    return torch.bincount(t * num_classes + p, minlength=num_classes * num_classes).view(num_classes, num_classes)


def accuracy(y_true: Tensor, y_pred: Tensor) -> float:
    """Fraction of positions where ``y_pred == y_true`` (a Python float in [0, 1]).

    Raises:
        ValueError: shapes differ or the tensors are empty.
    """
    t, p = torch.as_tensor(y_true), torch.as_tensor(y_pred)
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred must have the same shape, got {tuple(t.shape)} and {tuple(p.shape)}")
    if t.numel() == 0:
        raise ValueError("accuracy of an empty set is undefined")
    return int((t == p).sum()) / t.numel()


@torch.no_grad()
def evaluate(model: nn.Module, loader) -> dict:
    """Mean loss, accuracy and confusion matrix of a classifier over a loader.

    Args:
        model: called as ``model(ids, attention_mask)`` and returning logits (B, C).
        loader: an iterable of ``(ids, attention_mask, labels)`` batches (e.g.
            :class:`llmcourse.data.sentiment.SentimentBatches`); batches may differ in size.

    Returns:
        ``{"loss": float, "accuracy": float, "confusion": (C, C) long}``, where ``loss`` is the
        cross-entropy averaged over **examples** (the sum of per-example losses over N, so a small last
        batch weighs by its size), and the confusion matrix has rows = true labels.

    The model runs in ``eval()`` mode (dropout off) and its previous mode is restored afterwards,
    also when an exception is raised.

    Raises:
        ValueError: the loader yields no batches.
    """
    was_training = model.training
    model.eval()
    try:
        total_loss, n = 0.0, 0
        trues, preds = [], []
        num_classes = None
        for ids, attention_mask, labels in loader:
            logits = model(ids, attention_mask)
            num_classes = logits.shape[-1]
            total_loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            n += len(labels)
            trues.append(labels)
            preds.append(logits.argmax(-1))
        if n == 0:
            raise ValueError("the loader yielded no batches")
        y_true, y_pred = torch.cat(trues), torch.cat(preds)
        return {"loss": total_loss / n, "accuracy": accuracy(y_true, y_pred),
                "confusion": confusion_matrix(y_true, y_pred, num_classes)}
    finally:
        model.train(was_training)
