"""Token embeddings and learned absolute position embeddings (unit 02).

An embedding layer is a table ``W`` of shape ``(vocab_size, d_model)``: token id ``r`` selects row
``r``. Selecting rows is the same as multiplying one-hot vectors by the table
(:func:`one_hot_matmul`), which is why the gradient of an embedding touches only the rows that were
used. Two ways to add positions live here and in :mod:`llmcourse.nn.positions`:

* :class:`InputEmbeddings` scales the looked-up rows by ``√d_model`` (Vaswani et al., 2017, §3.4);
  the encoder–decoder of unit 06 adds the fixed sinusoidal table to it.
* :class:`GPTEmbedding` adds a **learned** position table (GPT-2: ``wte(idx) + wpe(arange(T))``, no
  scaling), which limits the model to ``context_length`` positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GPTEmbedding", "InputEmbeddings", "embedding_lookup", "one_hot_matmul"]


def _check_ids(ids, vocab_size: int, what: str = "ids") -> None:
    """ValueError for non-integer ids, and (on CPU) for ids outside ``[0, vocab_size)``."""
    if not isinstance(ids, Tensor):
        raise ValueError(f"{what} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{what} must be an integer tensor (torch.long), got {ids.dtype}; "
                         "token ids are indices into the table, not values")
    if ids.numel() and ids.device.type == "cpu":  # on CUDA the check would force a sync; torch asserts anyway
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{what} must lie in [0, {vocab_size}) for a table of {vocab_size} rows; "
                             f"got values from {lo} to {hi}")


def _check_weight(weight) -> None:
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a 2-D table (vocab_size, d_model), got {shape}")


def embedding_lookup(ids: Tensor, weight: Tensor) -> Tensor:
    """Row lookup: ``weight[ids]``.

    Args:
        ids: integer tensor of any shape, values in ``[0, V)``.
        weight: ``(V, D)`` float table.

    Returns:
        ``ids.shape + (D,)``, dtype of ``weight``; equal to ``F.embedding(ids, weight)``. Gradients flow
        to ``weight`` only through the rows that were selected (row r receives the sum of its upstream
        gradients, once per occurrence of r).

    Raises:
        ValueError: non-integer ids, ids out of range, or a weight that is not 2-D.
    """
    _check_weight(weight)
    _check_ids(ids, weight.shape[0])
    return weight[ids]


def one_hot_matmul(ids: Tensor, weight: Tensor) -> Tensor:
    """The same lookup as a matrix product: ``F.one_hot(ids, V).to(weight.dtype) @ weight``.

    Costs ``V·D`` multiply-adds per token instead of a copy of ``D`` numbers, which is why frameworks
    index instead; the result (and its gradient) is identical to :func:`embedding_lookup`.

    Args:
        ids: integer tensor of any shape, values in ``[0, V)``.
        weight: ``(V, D)`` float table.

    Returns:
        ``ids.shape + (D,)``, dtype of ``weight``.

    Raises:
        ValueError: non-integer ids, ids out of range, or a weight that is not 2-D.
    """
    _check_weight(weight)
    _check_ids(ids, weight.shape[0])
    return F.one_hot(ids.long(), weight.shape[0]).to(weight.dtype) @ weight


class InputEmbeddings(nn.Module):
    """Token embedding scaled by ``√d_model``, as in the original Transformer.

    ``forward(ids) = embedding(ids) * sqrt(d_model)``. The paper gives no reason; a common reading is
    that with a table initialised at std ``d_model^−½`` (as in the authors' tensor2tensor code) the scale brings
    token vectors to RMS ≈ 1, the same footing as the sinusoidal encoding added next (RMS ``1/√2``).
    GPT-2, which learns its positions and initialises both tables with small values, uses no scale.

    Args:
        vocab_size: V.
        d_model: D.

    State dict: ``embedding.weight (vocab_size, d_model)``.

    Shapes: ``ids (B, T)`` (any shape of integer ids) -> ``ids.shape + (D,)``, float32 (the parameter's dtype).

    Raises:
        ValueError: non-integer ids or ids outside ``[0, vocab_size)``.

    Source: Vaswani et al. (2017), §3.4 ("we multiply those weights by √d_model").
    """

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)

    def forward(self, ids: Tensor) -> Tensor:
        _check_ids(ids, self.vocab_size)
        return self.embedding(ids) * math.sqrt(self.d_model)


class GPTEmbedding(nn.Module):
    """GPT-2's input layer: token embedding plus a **learned** absolute position embedding.

    ``forward(idx) = dropout(tok_emb(idx) + pos_emb(arange(T)))``; positions start at 0 and the
    ``(T, D)`` position rows broadcast over the batch. There is no ``√d_model`` scale. Because the
    position table has ``context_length`` rows, the model cannot read longer sequences.

    Args:
        vocab_size: V (50,257 for GPT-2).
        context_length: number of learned positions C (1,024 for GPT-2).
        d_model: D.
        dropout: dropout probability on the sum (GPT-2's ``embd_pdrop``).

    State dict: ``tok_emb.weight (V, D)``, ``pos_emb.weight (C, D)``.

    Shapes: ``idx (B, T)`` long -> ``(B, T, D)`` float32.

    Raises:
        ValueError: ``idx`` not 2-D integer, ids out of range, or ``T > context_length``.

    Matches the embedding part of ``transformers``' ``GPT2Model`` (``wte``, ``wpe``, ``drop``): with the same
    weights, the first entry of its ``hidden_states`` equals this module's output.
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int, dropout: float = 0.0):
        super().__init__()
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.d_model = d_model
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, idx: Tensor) -> Tensor:
        if not isinstance(idx, Tensor) or idx.dim() != 2:
            shape = tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__
            raise ValueError(f"GPTEmbedding expects token ids of shape (B, T), got {shape}")
        _check_ids(idx, self.vocab_size, "idx")
        t = idx.shape[1]
        if t > self.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length={self.context_length}: the learned "
                             f"position table has only {self.context_length} rows (crop to the last "
                             f"{self.context_length} tokens)")
        positions = torch.arange(t, device=idx.device)
        return self.dropout(self.tok_emb(idx) + self.pos_emb(positions))
