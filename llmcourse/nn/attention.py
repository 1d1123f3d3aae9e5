"""Scaled dot-product attention and the single-head attention modules of unit 03.

Conventions (syllabus §4): masks are boolean with ``True`` = may attend; the order inside
attention is raw scores ``Q Kᵀ`` -> scale by ``1/√d_k`` -> ``masked_fill(~mask, -inf)`` ->
softmax over the **last** dim -> dropout on the weights -> ``@ V``.

Source: Vaswani et al., "Attention Is All You Need" (2017), eq. (1):
``Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .masks import causal_mask

__all__ = ["softmax_stable", "simple_attention", "scaled_dot_product_attention", "SelfAttention", "CausalSelfAttention"]


def softmax_stable(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax: ``exp(x - max) / sum(exp(x - max))`` along ``dim``.

    Subtracting the maximum leaves the result unchanged (the factor ``exp(-max)`` cancels) and keeps
    ``exp`` from overflowing for large inputs (``[1000, 1001]`` -> ``[0.2689, 0.7311]``).
    ``-inf`` entries get weight 0; a slice that is entirely ``-inf`` gives NaN, like ``torch.softmax``.

    Args:
        x: float tensor of any shape.
        dim: the dimension to normalise.

    Returns:
        Tensor of ``x``'s shape and dtype whose slices along ``dim`` sum to 1.
    """
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def simple_attention(x: Tensor) -> tuple[Tensor, Tensor]:
    """Attention without trainable weights: ``weights = softmax(x xᵀ)`` (no scaling), ``context = weights x``.

    Args:
        x: ``(T, d)`` or ``(B, T, d)`` float.

    Returns:
        ``(context, weights)`` with shapes ``(..., T, d)`` and ``(..., T, T)``.
    """
    scores = x @ x.transpose(-2, -1)
    weights = torch.softmax(scores, dim=-1)
    return weights @ x, weights


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 dropout: nn.Module | None = None) -> tuple[Tensor, Tensor]:
    """``softmax(q kᵀ / √d_k) v`` with an optional boolean mask and dropout on the weights.

    Args:
        q: ``(..., T_q, d_k)`` queries.
        k: ``(..., T_k, d_k)`` keys.
        v: ``(..., T_k, d_v)`` values.
        mask: bool, broadcastable to ``(..., T_q, T_k)``; ``True`` = may attend. Every query row must
            allow at least one key (an all-blocked row gives NaN, as in ``torch``).
        dropout: a module applied to the weights before they multiply ``v`` (e.g. ``nn.Dropout``).

    Returns:
        ``(context, weights)``: context ``(..., T_q, d_v)``; weights ``(..., T_q, T_k)`` post-softmax,
        **pre**-dropout, so each row sums to 1.

    Matches ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` for the context.
    """
    d_k = k.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    used = dropout(weights) if dropout is not None else weights
    return used @ v, weights


class SelfAttention(nn.Module):
    """Single-head self-attention with trainable projections (no mask, no dropout).

    ``W_query``, ``W_key``, ``W_value`` are ``nn.Linear(d_in, d_out, bias=qkv_bias)``; their
    ``.weight`` has shape ``(d_out, d_in)`` (it stores ``Wᵀ`` of the row-vector math ``q = x W_q``).
    Scores are scaled by ``1/√d_out``, the key width of this module.

    Shapes: ``(T, d_in)`` or ``(B, T, d_in)`` -> ``(..., T, d_out)``.
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: Tensor) -> Tensor:
        context, _ = scaled_dot_product_attention(self.W_query(x), self.W_key(x), self.W_value(x))
        return context


class CausalSelfAttention(nn.Module):
    """Single-head causal self-attention for batches, with dropout on the attention weights.

    State: ``W_query``, ``W_key``, ``W_value`` (``nn.Linear(d_in, d_out, bias=qkv_bias)``),
    ``dropout`` (``nn.Dropout(dropout)``) and the buffer ``mask``: ``(context_length, context_length)``
    bool, lower-triangular (``True`` = may attend), registered with ``persistent=False`` so it follows
    ``.to()`` but is not saved in the ``state_dict``.

    ``forward``: ``(B, T, d_in)`` -> ``(B, T, d_out)``; the mask is sliced to ``[:T, :T]``. After each
    call ``self.last_weights`` holds the ``(B, T, T)`` attention weights (detached, pre-dropout).

    Raises:
        ValueError: if ``T > context_length``.
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float = 0.0, qkv_bias: bool = False):
        super().__init__()
        self.d_out = d_out
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", causal_mask(context_length), persistent=False)
        self.last_weights: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[-2]
        if t > self.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length={self.context_length}")
        context, weights = scaled_dot_product_attention(
            self.W_query(x), self.W_key(x), self.W_value(x), mask=self.mask[:t, :t], dropout=self.dropout
        )
        self.last_weights = weights.detach()
        return context
