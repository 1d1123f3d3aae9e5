"""Layer normalisation (unit 05).

``LayerNorm`` normalises **each token over its features** (the last dimension): per-token mean and
**biased** variance, ``ε`` inside the square root, then a learnable per-feature scale ``weight`` (γ)
and shift ``bias`` (β). Unlike BatchNorm it keeps no running statistics: ``train()`` and ``eval()``
compute exactly the same function, and the module has no buffers.

Source: Ba, Kiros and Hinton, "Layer Normalization" (2016), eq. (4); matches ``torch.nn.LayerNorm``
(``elementwise_affine=True``): same ``state_dict`` keys ``weight``/``bias``, same ``eps = 1e-5``.
The forward runs ``F.layer_norm`` (torch's fused kernel), which computes that formula.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LayerNorm"]


class LayerNorm(nn.Module):
    """``y = (x − μ) / sqrt(σ² + eps) · weight + bias`` over the last dimension.

    ``μ`` and ``σ²`` are the mean and the **biased** variance (divide by ``D``, not ``D − 1``) of
    each token's ``D`` features.

    Args:
        d_model: number of features ``D`` (the size of the last dimension), ≥ 1.
        eps: added to the variance **inside** the square root, > 0 (default ``1e-5``, as ``nn.LayerNorm``).

    Attributes:
        weight: ``nn.Parameter`` ``(D,)``, initialised to ones (γ, the scale).
        bias: ``nn.Parameter`` ``(D,)``, initialised to zeros (β, the shift).

    ``state_dict`` keys ``weight`` and ``bias`` (interchangeable with ``nn.LayerNorm(D)``); ``2·D``
    parameters, no buffers.

    Shapes: ``forward(x)`` maps ``(..., D)`` floating point to the same shape and dtype.

    Raises:
        ValueError: for ``d_model < 1`` or ``eps <= 0``; in ``forward``, when the last dimension
            of ``x`` is not ``d_model``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        if int(d_model) < 1:
            raise ValueError(f"LayerNorm needs d_model ≥ 1, got {d_model}")
        if not eps > 0:
            raise ValueError(f"LayerNorm needs eps > 0 (it keeps the square root away from 0), got {eps}")
        self.d_model = int(d_model)
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(self.d_model))
        self.bias = nn.Parameter(torch.zeros(self.d_model))

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"LayerNorm(d_model={self.d_model}) got input with last dimension {x.shape[-1]} "
                             f"(shape {tuple(x.shape)}): it normalises each token over its features")
        # torch's fused kernel computes exactly the formula of the class docstring (biased variance,
        # eps inside the square root) in one pass
        return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps:g}"
