"""Moving between ``(B, T, D)`` activations and ``(B, H, T, head_dim)`` per-head tensors."""

from __future__ import annotations

from torch import Tensor

__all__ = ["split_heads", "merge_heads"]


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, D)`` -> ``(B, H, T, D // H)``: ``x.view(B, T, H, hd).transpose(1, 2)``.

    Raises:
        ValueError: if ``D`` is not divisible by ``n_heads``.
    """
    b, t, d = x.shape
    if d % n_heads != 0:
        raise ValueError(f"d_model={d} is not divisible by n_heads={n_heads}")
    return x.reshape(b, t, n_heads, d // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, H, T, hd)`` -> ``(B, T, H * hd)``, contiguous (inverse of :func:`split_heads`)."""
    b, h, t, hd = x.shape
    return x.transpose(1, 2).contiguous().view(b, t, h * hd)
