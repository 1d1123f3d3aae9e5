"""The two matrix products of attention written with ``torch.einsum``.

``einsum`` names every axis with a letter; a letter that appears in the inputs but not in the output
is summed over. For per-head tensors ``(B, H, T, hd)`` (letters ``b h q/k d``):

* raw scores ``S = Q Kᵀ``: ``"bhqd,bhkd->bhqk"``: the feature axis ``d`` is summed;
* context vectors ``C = W V``: ``"bhqk,bhkd->bhqd"``: the **key** axis ``k`` is summed, so the
  weights' last axis and the values' sequence axis must carry the *same* letter.

Writing ``"bhqk,bhvd->bhqd"`` (a fresh letter for the values' sequence axis) still gives the right
shape but sums ``k`` and ``v`` separately: every query receives ``(Σ_k w_qk) · Σ_v V_v``, the row sum of
its weights times the sum of all values (bug ``B00.einsum_v_index``).

Both functions equal the ``@`` forms ``q @ k.transpose(-2, -1)`` and ``weights @ v`` (unit 00,
exercise ``00.einsum_attention``). They compute **raw** scores: scaling by ``1/√d_k`` and masking
happen outside (see :mod:`llmcourse.nn.attention`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["attention_scores_einsum", "attention_output_einsum"]


def _check_4d(name: str, x: Tensor, axes: str) -> None:
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D {axes}, got shape {tuple(x.shape)}")


def attention_scores_einsum(q: Tensor, k: Tensor) -> Tensor:
    """Raw attention scores ``q · k`` for every query/key pair: ``einsum("bhqd,bhkd->bhqk")``.

    Args:
        q: ``(B, H, T_q, d)`` queries.
        k: ``(B, H, T_k, d)`` keys (same ``B``, ``H``, ``d``; ``T_k`` may differ from ``T_q``).

    Returns:
        ``(B, H, T_q, T_k)``, equal to ``q @ k.transpose(-2, -1)`` (no scaling, no mask).

    Raises:
        ValueError: if an input is not 4-D or the batch, head or feature sizes disagree.
    """
    _check_4d("q", q, "(B, H, T_q, d)")
    _check_4d("k", k, "(B, H, T_k, d)")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in B, H and the feature size d")
    return torch.einsum("bhqd,bhkd->bhqk", q, k)


def attention_output_einsum(weights: Tensor, v: Tensor) -> Tensor:
    """Context vectors: each query's weighted sum of the values, ``einsum("bhqk,bhkd->bhqd")``.

    Args:
        weights: ``(B, H, T_q, T_k)`` attention weights (post-softmax; any values work).
        v: ``(B, H, T_k, d_v)`` values.

    Returns:
        ``(B, H, T_q, d_v)``, equal to ``weights @ v``.

    Raises:
        ValueError: if an input is not 4-D, or ``B``, ``H`` or ``T_k`` disagree.
    """
    _check_4d("weights", weights, "(B, H, T_q, T_k)")
    _check_4d("v", v, "(B, H, T_k, d_v)")
    if weights.shape[:2] != v.shape[:2] or weights.shape[-1] != v.shape[-2]:
        raise ValueError(f"weights {tuple(weights.shape)} and v {tuple(v.shape)} must agree in B, H and T_k "
                         "(the weights' last axis is the values' sequence axis)")
    return torch.einsum("bhqk,bhkd->bhqd", weights, v)
