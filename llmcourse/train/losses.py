"""Losses.

:func:`label_smoothed_cross_entropy` is cross-entropy on raw logits with PyTorch's label smoothing and
``ignore_index`` (unit 00, exercise ``00.label_smoothed_cross_entropy``), written from ``log_softmax``
so that every term is visible.

Label smoothing (Szegedy et al., "Rethinking the Inception Architecture for Computer Vision", 2016,
§7; used by Vaswani et al., 2017, §5.4 with ε = 0.1) trains against the target distribution
``q = (1 − ε)·onehot(y) + ε/C`` instead of ``onehot(y)``: the ε mass is spread uniformly over **all**
``C`` classes, the target included. The cross-entropy ``−Σ_c q_c log p_c`` is then, per position,

    (1 − ε)·(−log p_y) + (ε / C)·Σ_c (−log p_c)

which is exactly what ``torch.nn.functional.cross_entropy(..., label_smoothing=ε)`` computes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["label_smoothed_cross_entropy", "lm_loss", "perplexity"]


def label_smoothed_cross_entropy(logits: Tensor, targets: Tensor, eps: float = 0.0,
                                 ignore_index: int = -100) -> Tensor:
    """Mean label-smoothed cross-entropy over the non-ignored targets.

    Args:
        logits: ``(N, C)`` or ``(B, T, C)`` float, raw scores (**not** probabilities); the class axis is
            the **last** one (``F.cross_entropy`` wants it second, so for ``(B, T, C)`` call it on the
            flattened ``(B·T, C)`` logits).
        targets: ``(N,)`` or ``(B, T)`` integer class ids in ``[0, C)``, or ``ignore_index``.
        eps: label smoothing ε in ``[0, 1]``; ``0`` gives plain cross-entropy.
        ignore_index: target value whose positions contribute nothing, neither to the sum nor to the count.

    Returns:
        Scalar tensor (float, ``logits``' dtype): the sum over non-ignored positions of
        ``(1 − ε)·(−log p_y) + (ε/C)·Σ_c (−log p_c)``, divided by their **number**. NaN when every
        target is ignored (as ``F.cross_entropy``). Finite for logits of any magnitude (``log_softmax``
        subtracts the row maximum).

    Raises:
        ValueError: if ``targets``' shape is not ``logits.shape[:-1]``, ``targets`` is not an integer
            tensor, ``eps`` is outside ``[0, 1]``, or a non-ignored target is outside ``[0, C)``.

    Matches ``F.cross_entropy(logits.reshape(-1, C), targets.reshape(-1), label_smoothing=eps,
    ignore_index=ignore_index)``.
    """
    if logits.dim() < 2:
        raise ValueError(f"logits must be (N, C) or (B, T, C), got shape {tuple(logits.shape)}")
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"targets must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])} (the class axis "
                         f"is the last axis of logits), got {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer class ids (torch.long), got dtype {targets.dtype}")
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"label smoothing eps must be in [0, 1], got {eps}")
    n_classes = logits.shape[-1]
    log_probs = logits.reshape(-1, n_classes).log_softmax(dim=-1)
    y = targets.reshape(-1)
    keep = y != ignore_index
    if bool(((y[keep] < 0) | (y[keep] >= n_classes)).any()):
        bad = y[keep][(y[keep] < 0) | (y[keep] >= n_classes)][0].item()
        raise ValueError(f"target {bad} is outside [0, {n_classes}) and is not ignore_index={ignore_index}")
    safe_y = torch.where(keep, y, torch.zeros_like(y))
    nll = -log_probs.gather(1, safe_y.unsqueeze(1)).squeeze(1)   # −log p_y
    uniform = -log_probs.mean(dim=-1)                             # (1/C)·Σ_c −log p_c
    per_position = (1.0 - eps) * nll + eps * uniform
    per_position = torch.where(keep, per_position, torch.zeros_like(per_position))
    return per_position.sum() / keep.sum()


def lm_loss(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """Next-token cross-entropy of a language model: the mean over every (non-ignored) position.

    ``F.cross_entropy`` wants the class axis at dim 1: on a 3-D ``(B, T, V)`` input it would read ``T`` as
    the classes. So both tensors are flattened first, ``(B·T, V)`` and ``(B·T,)``, and every position of
    every sequence weighs the same. A model that predicts the uniform distribution scores ``ln V``.

    Args:
        logits: ``(B, T, V)`` float, raw scores.
        targets: ``(B, T)`` long, the next token of every position (``ignore_index`` entries are skipped).

    Returns:
        0-d float tensor: the mean loss in nats per token.

    Raises:
        ValueError: shapes that do not match ``(B, T, V)`` and ``(B, T)``.
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"expected logits (B, T, V) and targets (B, T); got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)


def perplexity(mean_loss: float) -> float:
    """``exp(mean_loss)``: the effective number of equally likely choices per token.

    Only meaningful for a **mean** loss in nats per token (a summed loss gives an astronomically large
    number). Uniform over V tokens: loss ``ln V``, perplexity ``V``.
    """
    return math.exp(float(mean_loss))
