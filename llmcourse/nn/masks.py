"""Attention masks: the course's single convention.

A mask is a **boolean** tensor in which ``True`` means "this query may attend to this key", the
convention of the boolean ``attn_mask`` of ``torch.nn.functional.scaled_dot_product_attention``.
(It is the opposite of ``nn.MultiheadAttention``, whose boolean masks mean "blocked"; unit 04
teaches the conversion.) Masks broadcast to ``(B, H, T_q, T_k)``: a causal mask is ``(T_q, T_k)``,
a key-padding mask ``(B, 1, 1, T_k)``; combine them with ``&``.

Unit 00 builds :func:`causal_mask` (exercise ``00.causal_mask``); every later unit imports it from
here, so there is exactly one source of causal masks in the course.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask", "padding_mask"]


def causal_mask(t_q: int, t_k: int | None = None, offset: int | None = None,
                device: torch.device | str | None = None) -> Tensor:
    """Boolean causal mask, ``True`` = may attend.

    Query row ``i`` sits at absolute position ``offset + i``; key ``j`` is allowed iff
    ``j <= offset + i``. The default ``offset = t_k - t_q`` aligns the queries with the *end* of the
    key sequence (bottom-right), which is what a KV cache needs. The result equals
    ``torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=offset)``.

    Args:
        t_q: number of queries (rows), ≥ 0.
        t_k: number of keys (columns), default ``t_q``.
        offset: absolute position of query 0, default ``t_k - t_q``.
        device: device of the result.

    Returns:
        Tensor ``(t_q, t_k)``, dtype ``torch.bool``.

    Raises:
        ValueError: if ``t_q`` or ``t_k`` is negative.

    Examples (F00.2): ``causal_mask(3, 5)`` is ``[[T,T,T,F,F],[T,T,T,T,F],[T,T,T,T,T]]`` (three new
    queries after two cached keys); ``causal_mask(1, 5)`` is all ``True`` (one decoding step sees the
    whole prefix); ``causal_mask(4)`` is ``tril(ones(4, 4))``. ``offset=0`` gives the top-left
    alignment ``tril(ones(t_q, t_k))``.
    """
    t_k = t_q if t_k is None else t_k
    if t_q < 0 or t_k < 0:
        raise ValueError(f"t_q and t_k must be non-negative, got {t_q}, {t_k}")
    offset = t_k - t_q if offset is None else offset
    i = torch.arange(t_q, device=device).unsqueeze(1)
    j = torch.arange(t_k, device=device).unsqueeze(0)
    return j <= i + offset


def padding_mask(lengths: Tensor, t_k: int | None = None) -> Tensor:
    """Key-padding mask ``(B, 1, 1, T_k)``, ``True`` for real (non-pad) keys; padding is on the right.

    Args:
        lengths: ``(B,)`` long, the number of real tokens of each sequence (≥ 1).
        t_k: padded length, default ``lengths.max()``.
    """
    t_k = int(lengths.max()) if t_k is None else t_k
    keep = torch.arange(t_k, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
    return keep[:, None, None, :]
