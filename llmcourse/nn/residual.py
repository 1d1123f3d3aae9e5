"""``ResidualStack``: a stack of residual branches, the skeleton of every transformer.

Each layer adds a *branch* to a running stream: ``x = x + dropout(layer(x))``. The identity path
carries ``x`` through untouched; only the branch is dropped out ("residual dropout", syllabus §4.4),
so in ``train()`` mode a dropped branch leaves ``x`` exactly as it was, and in ``eval()`` mode dropout
is the identity. Unit 00 builds it (exercise ``00.ResidualStack``) to practise ``nn.ModuleList``
(layers in a plain Python list are invisible to ``parameters()``, ``state_dict()`` and ``.to()``)
and ``train()``/``eval()``; the transformer blocks of unit 05 have the same shape with attention and
feed-forward sublayers in place of the ``Linear`` layers.

Source: He et al., "Deep Residual Learning for Image Recognition" (2016), eq. (1) ``y = F(x) + x``;
residual dropout as in Vaswani et al., "Attention Is All You Need" (2017), §5.4.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["ResidualStack"]


class ResidualStack(nn.Module):
    """``n_layers`` residual ``Linear`` branches: ``x = x + dropout(layers[i](x))`` for ``i = 0 … n−1``.

    Args:
        d_model: feature size ``D`` (input and output), ≥ 1.
        n_layers: number of layers ``n``, ≥ 0.
        dropout: dropout probability on each branch, ``0 ≤ p < 1``.

    Attributes:
        layers: ``nn.ModuleList`` of ``nn.Linear(d_model, d_model)``.
        dropout: ``nn.Dropout(dropout)``.

    ``state_dict`` keys: ``layers.{i}.weight`` ``(D, D)`` and ``layers.{i}.bias`` ``(D,)``;
    ``n·(D² + D)`` parameters (1,088 for ``D = 16, n = 4``).

    Shapes: ``forward(x)`` maps ``(..., D)`` to the same shape and dtype.

    Raises:
        ValueError: for ``d_model < 1``, ``n_layers < 0`` or ``dropout`` outside ``[0, 1)``; in
            ``forward``, when the last dimension of ``x`` is not ``d_model``.
    """

    def __init__(self, d_model: int, n_layers: int, dropout: float = 0.0):
        super().__init__()
        if d_model < 1 or n_layers < 0:
            raise ValueError(f"need d_model ≥ 1 and n_layers ≥ 0, got d_model={d_model}, n_layers={n_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout is a probability in [0, 1), got {dropout}")
        self.d_model = d_model
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"ResidualStack(d_model={self.d_model}) got input with last dimension "
                             f"{x.shape[-1]} (shape {tuple(x.shape)})")
        for layer in self.layers:
            x = x + self.dropout(layer(x))
        return x
