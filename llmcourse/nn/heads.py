"""Moving between ``(B, T, D)`` activations and ``(B, H, T, head_dim)`` per-head tensors.

Multi-head attention runs ``H`` attentions side by side on slices of width ``head_dim = D // H``
of the model dimension. :func:`split_heads` cuts the last dimension into ``(H, head_dim)`` and moves
the head axis next to the batch axis, so that every later operation (scores, softmax, ``@ V``)
broadcasts over ``(B, H)``; :func:`merge_heads` undoes it. Unit 00 builds both (exercise
``00.split_merge_heads``); units 04, 08, 11 and later import them from here.

Why ``contiguous`` in :func:`merge_heads`: ``transpose`` only swaps strides, so the transposed tensor
is not laid out row by row in memory, and ``.view`` (which never copies) refuses to merge two axes that
are not adjacent in memory ("view size is not compatible with input tensor's size and stride").
``.contiguous()`` copies into row-major order first (``.reshape`` does the same only when needed).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["split_heads", "merge_heads"]


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, D)`` -> ``(B, H, T, D // H)``, i.e. ``x.view(B, T, H, hd).transpose(1, 2)``.

    Head ``h`` holds the features ``h·hd … (h+1)·hd − 1`` of every token. The result is a view of ``x``
    (no copy; not contiguous); any input layout works, contiguous or not.

    Args:
        x: ``(B, T, D)`` activations, any dtype.
        n_heads: number of heads ``H`` ≥ 1; must divide ``D``.

    Returns:
        Tensor ``(B, H, T, D // H)``.

    Raises:
        ValueError: if ``x`` is not 3-D, ``n_heads < 1``, or ``D`` is not divisible by ``n_heads``.
    """
    if x.dim() != 3:
        raise ValueError(f"split_heads expects x of shape (B, T, D), got {x.dim()}-D shape {tuple(x.shape)}")
    if n_heads < 1:
        raise ValueError(f"n_heads must be at least 1, got {n_heads}")
    b, t, d = x.shape
    if d % n_heads != 0:
        raise ValueError(f"d_model={d} is not divisible by n_heads={n_heads}: "
                         f"head_dim = d_model / n_heads must be an integer")
    return x.reshape(b, t, n_heads, d // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, H, T, hd)`` -> ``(B, T, H * hd)``, contiguous (the inverse of :func:`split_heads`).

    ``merge_heads(split_heads(x, H))`` equals ``x`` exactly. The result is always contiguous, so a
    later ``.view`` works on it.

    Args:
        x: ``(B, H, T, hd)`` per-head tensor (e.g. attention context vectors), any layout.

    Returns:
        Tensor ``(B, T, H * hd)``, contiguous.

    Raises:
        ValueError: if ``x`` is not 4-D.
    """
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects x of shape (B, H, T, head_dim), got {x.dim()}-D shape "
                         f"{tuple(x.shape)}")
    b, h, t, hd = x.shape
    return x.transpose(1, 2).contiguous().view(b, t, h * hd)
