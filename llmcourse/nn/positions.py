"""Fixed sinusoidal positional encodings and the shift-as-rotation matrix (unit 02).

The course's convention (syllabus §4.3) is the interleaved layout of the original Transformer:
sine on **even** dimensions, cosine on **odd** dimensions, one frequency per pair::

    PE[p, 2i]   = sin(p · ω_i)          ω_i = 10000^(−2i/D),  i = 0 … D/2 − 1
    PE[p, 2i+1] = cos(p · ω_i)

Pair ``i`` is the point ``(sin ω_i p, cos ω_i p)`` on the unit circle; moving from position ``p``
to ``p + k`` rotates it by the fixed angle ``ω_i k`` (:func:`shift_matrix`), whatever ``p`` is.
Wavelengths ``2π/ω_i`` grow geometrically from ``2π`` (pair 0) to almost ``2π·10000``.

Source: Vaswani et al., "Attention Is All You Need" (2017), §3.5. Learned absolute position
embeddings (GPT-2) live in :mod:`llmcourse.nn.embeddings`; RoPE (units 11–13) has its own module.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

__all__ = ["PositionalEncoding", "inverse_frequencies", "shift_matrix", "sinusoidal_pe"]

PE_BASE = 10000.0


def _check_sizes(max_len, d_model) -> None:
    for name, value in (("max_len", max_len), ("d_model", d_model)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    if d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even number (one sine and one cosine per frequency), "
                         f"got {d_model}")


def inverse_frequencies(d_model: int, base: float = PE_BASE, dtype: torch.dtype = torch.float64) -> Tensor:
    """The angular frequencies ``ω_i = base^(−2i/d_model)`` of the ``d_model/2`` pairs.

    Args:
        d_model: even model width D.
        base: 10000 in the original Transformer.
        dtype: result dtype (float64 by default, so lessons can check identities to ~1e-14).

    Returns:
        Tensor ``(d_model // 2,)``: ``ω_0 = 1`` down to ``base^(−(D−2)/D)``. Wavelength of pair i: ``2π/ω_i``.

    Raises:
        ValueError: if ``d_model`` is not a positive even int.
    """
    _check_sizes(1, d_model)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    return (base ** (-two_i / d_model)).to(dtype)


def sinusoidal_pe(max_len: int, d_model: int) -> Tensor:
    """The sinusoidal positional-encoding table, interleaved (sine on even dims, cosine on odd dims).

    ``PE[p, 2i] = sin(p / 10000^(2i/D))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/D))`` for positions
    ``p = 0 … max_len−1``. The angles are computed in float64 and the table is rounded once to float32,
    so every entry is within float32 rounding (6e-8) of the exact value even at position 2047; a
    pure-float32 computation drifts by up to ~5e-4 there (the argument ``p·ω`` itself is rounded).

    Args:
        max_len: number of positions (≥ 1).
        d_model: model width D, even (≥ 2).

    Returns:
        Tensor ``(max_len, d_model)``, float32. Example: ``sinusoidal_pe(4, 4)[1]`` is
        ``[0.8415, 0.5403, 0.0100, 0.99995]`` (inverse frequencies ``[1, 0.01]``).

    Raises:
        ValueError: if ``d_model`` is odd or not positive, or ``max_len < 1``.

    Source: Vaswani et al. (2017), §3.5.
    """
    _check_sizes(max_len, d_model)
    positions = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    angles = positions * inverse_frequencies(d_model).unsqueeze(0)    # (max_len, D/2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.to(torch.float32)


def _real(value, name: str) -> float:
    if (isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex
            and value.dtype != torch.bool):
        return float(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"k and omega must be real numbers (or one-element tensors); got {name}={value!r}")


def shift_matrix(k: float, omega: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """The rotation ``M_k`` that moves one sinusoidal pair from position p to position p + k.

    ``M_k = [[cos ωk, sin ωk], [−sin ωk, cos ωk]]`` acts on the column ``[sin ωp, cos ωp]ᵀ`` and gives
    ``[sin ω(p+k), cos ω(p+k)]ᵀ`` (the angle-addition formulas). It depends on the offset k and the
    frequency ω only, never on p; it is orthogonal with determinant 1.

    Args:
        k: position offset (any real; negative k shifts back).
        omega: angular frequency of the pair (``ω_i`` from :func:`inverse_frequencies`).
        dtype: result dtype (float64 to verify the identity to ~1e-14).

    Returns:
        Tensor ``(2, 2)``.

    Raises:
        ValueError: if ``k`` or ``omega`` is not a real number (or a one-element tensor).
    """
    angle = _real(omega, "omega") * _real(k, "k")
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, s], [-s, c]], dtype=dtype)


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to a batch of embeddings, then applies dropout to the sum.

    ``forward(x) = dropout(x + pe[:, :T])``. The table is a **buffer** ``pe`` of shape
    ``(1, max_len, d_model)`` registered with ``persistent=False``: it follows ``.to(...)``/``.cuda()``
    like a parameter, but it is not trained (not in ``parameters()``) and not saved (``state_dict()`` is
    empty), because it can always be recomputed. The module has 0 parameters.

    Args:
        d_model: model width D (even).
        max_len: the longest sequence the module accepts.
        dropout: dropout probability on the sum (0.1 in the original Transformer).

    Shapes: ``x (B, T, D)`` -> ``(B, T, D)``, dtype of ``x`` (promoted with the buffer's).

    Raises:
        ValueError: odd ``d_model`` (at construction); in ``forward``, an input that is not 3-D, whose last
            dim is not ``d_model``, or whose length T exceeds ``max_len``.

    Used by the encoder–decoder Transformer of unit 06. Source: Vaswani et al. (2017), §3.5 and §5.4
    (dropout on the sums of embeddings and positional encodings).
    """

    def __init__(self, d_model: int, max_len: int, dropout: float = 0.1):
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_pe(max_len, d_model).unsqueeze(0), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3:
            raise ValueError(f"PositionalEncoding expects x of shape (B, T, d_model), got {tuple(x.shape)}")
        t, d = x.shape[1], x.shape[2]
        if d != self.d_model:
            raise ValueError(f"last dim of x is {d}, but this PositionalEncoding has d_model={self.d_model}")
        if t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds max_len={self.max_len}; build the module with a larger "
                             "max_len (the table is fixed, so a longer one costs no parameters)")
        return self.dropout(x + self.pe[:, :t])

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"
