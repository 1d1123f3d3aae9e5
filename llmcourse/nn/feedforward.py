"""The position-wise feed-forward network and the GELU activation (unit 05).

``FeedForward`` applies the same two-layer MLP ``D → d_ff → D`` to every position independently:
``fc2(act(fc1(x)))``. There is no dropout inside it; a transformer block drops out its *output*
before the residual add ("residual dropout", syllabus §4.4).

Sources: Vaswani et al., "Attention Is All You Need" (2017), eq. (2) ``FFN(x) = max(0, xW1 + b1)W2 + b2``;
Hendrycks and Gimpel, "Gaussian Error Linear Units (GELUs)" (2016), §2: the exact form
``x·Φ(x)`` and the tanh approximation used by GPT-2. ``gelu`` matches ``torch.nn.functional.gelu``
with ``approximate="none"`` / ``"tanh"`` and runs it (torch's fused kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "FeedForward", "gelu", "relu"]



def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian Error Linear Unit, element-wise.

    ``"none"``: ``0.5·x·(1 + erf(x/√2))`` (exact, ``x·Φ(x)``);
    ``"tanh"``: ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` (GPT-2's, ``gelu_new`` in transformers).
    The two differ by at most 4.74e-4 (at x ≈ −2.70).

    Args:
        x: floating-point tensor of any shape.
        approximate: ``"none"`` or ``"tanh"``.

    Returns:
        tensor of the same shape and dtype.

    Raises:
        ValueError: for any other ``approximate``.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    # torch's fused kernel evaluates exactly the two formulas above, in one pass over memory
    return F.gelu(x, approximate=approximate)


def relu(x: Tensor) -> Tensor:
    """``max(0, x)`` element-wise (``torch.relu``)."""
    return torch.relu(x)


ACTIVATIONS = {
    "relu": relu,
    "gelu": lambda x: F.gelu(x, approximate="none"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``fc2(act(fc1(x)))``.

    Args:
        d_model: input and output width ``D``, ≥ 1.
        d_ff: hidden width, ≥ 1 (``4·D`` in GPT-2, 2048 for ``D = 512`` in the original Transformer).
        activation: ``"relu"`` (original Transformer), ``"gelu"`` (exact erf form) or
            ``"gelu_tanh"`` (GPT-2).

    Attributes:
        fc1: ``nn.Linear(d_model, d_ff)``; fc2: ``nn.Linear(d_ff, d_model)``.

    ``state_dict`` keys: ``fc1.weight`` ``(d_ff, D)``, ``fc1.bias`` ``(d_ff,)``, ``fc2.weight``
    ``(D, d_ff)``, ``fc2.bias`` ``(D,)``; ``2·D·d_ff + d_ff + D`` parameters (2,099,712 for
    ``D = 512, d_ff = 2048``).

    Shapes: ``forward(x)`` maps ``(..., D)`` to ``(..., D)``; each position is transformed alone,
    so permuting the positions permutes the outputs in the same way.

    Raises:
        ValueError: for non-positive sizes or an unknown ``activation``; in ``forward``, when the
            last dimension of ``x`` is not ``d_model``.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        if d_model < 1 or d_ff < 1:
            raise ValueError(f"FeedForward needs d_model ≥ 1 and d_ff ≥ 1, got d_model={d_model}, d_ff={d_ff}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"FeedForward: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"FeedForward(d_model={self.d_model}) got input with last dimension {x.shape[-1]} "
                             f"(shape {tuple(x.shape)})")
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
