"""The encoder–decoder Transformer of unit 06 (Vaswani et al., 2017), built from the course's pieces.

Embeddings ×√D (:class:`~llmcourse.nn.embeddings.InputEmbeddings`, unit 02) plus the fixed sinusoidal
encoding (:class:`~llmcourse.nn.positions.PositionalEncoding`, unit 02, shared by both sides; a buffer, not
in the ``state_dict``), ``n_enc`` :class:`~llmcourse.nn.blocks.EncoderBlock` and ``n_dec``
:class:`~llmcourse.nn.blocks.DecoderBlock` (unit 05), each stack closed by a final LayerNorm when the blocks
are pre-LN, and a :class:`~llmcourse.nn.blocks.ProjectionLayer` to target-vocabulary logits.

Masks follow the course convention (bool, True = may attend): the source key-padding mask
``(B, 1, 1, S)`` serves the encoder self-attention and the decoder cross-attention; the target mask
``(B, 1, T, T)`` is key-padding & causal (:func:`~llmcourse.data.translation.make_src_mask`,
:func:`~llmcourse.data.translation.make_tgt_mask`).

The stacks match ``torch.nn.Transformer(d_model, nhead, n_enc, n_dec, d_ff, dropout=0, batch_first=True,
norm_first=True)`` loaded with the same weights (:func:`to_torch_transformer`).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from ..data.translation import PAD_ID, make_src_mask, make_tgt_mask
from ..nn.blocks import (
    DecoderBlock,
    EncoderBlock,
    ProjectionLayer,
    to_torch_decoder_layer,
    to_torch_encoder_layer,
)
from ..nn.embeddings import InputEmbeddings
from ..nn.norms import LayerNorm
from ..nn.positions import PositionalEncoding

__all__ = ["Decoder", "Encoder", "Transformer", "to_torch_transformer", "transformer_param_count"]


class Encoder(nn.Module):
    """``n_layers`` encoder blocks and, for pre-LN blocks, a final ``norm``. Keys ``layers.{i}.*``, ``norm.*``.

    ``forward(x (B, S, D), mask (B, 1, 1, S) bool)`` -> memory ``(B, S, D)``.
    """

    def __init__(self, n_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float, norm_first: bool):
        super().__init__()
        self.layers = nn.ModuleList(EncoderBlock(d_model, num_heads, d_ff, dropout, norm_first)
                                    for _ in range(n_layers))
        self.norm = LayerNorm(d_model) if norm_first else None

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x) if self.norm is not None else x


class Decoder(nn.Module):
    """``n_layers`` decoder blocks and, for pre-LN blocks, a final ``norm``. Keys ``layers.{i}.*``, ``norm.*``.

    ``forward(x (B, T, D), memory (B, S, D), src_mask (B, 1, 1, S), tgt_mask (B, 1, T, T))`` -> ``(B, T, D)``.
    """

    def __init__(self, n_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float, norm_first: bool):
        super().__init__()
        self.layers = nn.ModuleList(DecoderBlock(d_model, num_heads, d_ff, dropout, norm_first)
                                    for _ in range(n_layers))
        self.norm = LayerNorm(d_model) if norm_first else None

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=src_mask)
        return self.norm(x) if self.norm is not None else x


class Transformer(nn.Module):
    """Encoder–decoder Transformer for translation (exercise ``06.Transformer``).

    Args:
        src_vocab, tgt_vocab: vocabulary sizes (V_src, V_tgt).
        d_model: D (even); num_heads: H (divides D); d_ff: FFN width; n_enc, n_dec: numbers of blocks.
        max_len: longest source or target sequence (size of the sinusoidal table).
        dropout: on the embedding sums, attention weights and sublayer outputs (0.1 by default).
        norm_first: pre-LN blocks and final norms (default) or post-LN blocks without final norms.
        pad_id: the padding id ``forward`` uses to build the masks.

    ``state_dict`` keys: ``src_embed.embedding.weight (V_src, D)``, ``tgt_embed.embedding.weight (V_tgt, D)``,
    ``encoder.layers.{i}.*``, ``encoder.norm.{weight,bias}`` (pre-LN only), ``decoder.layers.{i}.*``,
    ``decoder.norm.{weight,bias}`` (pre-LN only), ``projection.proj.{weight,bias}``. ``pos`` holds only the
    non-persistent buffer ``pe``. Parameters (defaults): ``(V_src + V_tgt)·128 + 2·198,272 + 2·264,576 + 2·256
    + 129·V_tgt`` (:func:`transformer_param_count`).

    Weight matrices (every parameter with ``dim > 1``, embeddings included) are initialised with
    ``xavier_uniform_``, as ``nn.Transformer`` does for its layers; with the default ``nn.Embedding``
    init (std 1) the ×√D scale would make token vectors ~11× larger than the positional encoding.

    Methods:
        ``encode(src (B, S) long, src_mask (B, 1, 1, S))`` -> memory ``(B, S, D)``;
        ``decode(tgt_in (B, T), memory, src_mask, tgt_mask (B, 1, T, T))`` -> ``(B, T, D)``, final-normed;
        ``forward(src, tgt_in)`` -> logits ``(B, T, V_tgt)`` (builds both masks from ``pad_id``).

    Raises:
        ValueError: sequences longer than ``max_len`` (from ``PositionalEncoding``), bad ids, bad widths.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, d_model: int = 128, num_heads: int = 4, d_ff: int = 512,
                 n_enc: int = 2, n_dec: int = 2, max_len: int = 64, dropout: float = 0.1,
                 norm_first: bool = True, pad_id: int = PAD_ID):
        super().__init__()
        self.config = dict(src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d_model, num_heads=num_heads,
                           d_ff=d_ff, n_enc=n_enc, n_dec=n_dec, max_len=max_len, dropout=dropout,
                           norm_first=norm_first, pad_id=pad_id)
        self.d_model, self.max_len, self.pad_id = d_model, max_len, pad_id
        self.src_embed = InputEmbeddings(src_vocab, d_model)
        self.tgt_embed = InputEmbeddings(tgt_vocab, d_model)
        self.pos = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(n_enc, d_model, num_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(n_dec, d_model, num_heads, d_ff, dropout, norm_first)
        self.projection = ProjectionLayer(d_model, tgt_vocab)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.encoder(self.pos(self.src_embed(src)), src_mask)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        return self.decoder(self.pos(self.tgt_embed(tgt_in)), memory, src_mask, tgt_mask)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        src_mask = make_src_mask(src, self.pad_id)
        tgt_mask = make_tgt_mask(tgt_in, self.pad_id)
        memory = self.encode(src, src_mask)
        return self.projection(self.decode(tgt_in, memory, src_mask, tgt_mask))


def transformer_param_count(src_vocab: int, tgt_vocab: int, d_model: int = 128, num_heads: int = 4,
                            d_ff: int = 512, n_enc: int = 2, n_dec: int = 2, norm_first: bool = True) -> int:
    """The parameter count of :class:`Transformer` from the formula (all biases on).

    Encoder block ``4(D² + D) + (2·D·d_ff + d_ff + D) + 4D``; decoder block adds a second attention and a
    third norm; final norms ``2D`` each (pre-LN); embeddings ``(V_src + V_tgt)·D``; projection ``(D + 1)·V_tgt``.
    For D=128, d_ff=512: 198,272 per encoder block, 264,576 per decoder block. ``num_heads`` does not matter.
    """
    attn = 4 * (d_model * d_model + d_model)
    ffn = 2 * d_model * d_ff + d_ff + d_model
    enc = attn + ffn + 2 * 2 * d_model
    dec = 2 * attn + ffn + 3 * 2 * d_model
    norms = 2 * 2 * d_model if norm_first else 0
    return (src_vocab + tgt_vocab) * d_model + n_enc * enc + n_dec * dec + norms + (d_model + 1) * tgt_vocab


@torch.no_grad()
def to_torch_transformer(model: Transformer) -> nn.Transformer:
    """``nn.Transformer(..., dropout=0, batch_first=True, norm_first=...)`` holding ``model``'s stacks (eval mode).

    Feed it the same embedded inputs, ``model.pos(model.src_embed(src))`` and ``model.pos(model.tgt_embed(tgt_in))``,
    with torch's mask convention (True = blocked): ``src_key_padding_mask = memory_key_padding_mask = src == pad``,
    ``tgt_mask = ~causal_mask(T)``; its output equals ``model.decode(...)`` (the oracle of ``06.Transformer``).
    """
    first_enc = model.encoder.layers[0]
    c = model.config
    with warnings.catch_warnings():   # "enable_nested_tensor is True, but ... norm_first was True": harmless
        warnings.simplefilter("ignore", UserWarning)
        tt = nn.Transformer(c["d_model"], first_enc.self_attn.num_heads, c["n_enc"], c["n_dec"], c["d_ff"],
                            dropout=0.0, batch_first=True, norm_first=c["norm_first"])
    for mine, theirs in zip(model.encoder.layers, tt.encoder.layers):
        theirs.load_state_dict(to_torch_encoder_layer(mine).state_dict())
    for mine, theirs in zip(model.decoder.layers, tt.decoder.layers):
        theirs.load_state_dict(to_torch_decoder_layer(mine).state_dict())
    for mine, theirs in ((model.encoder.norm, tt.encoder.norm), (model.decoder.norm, tt.decoder.norm)):
        if mine is not None:
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
    return tt.eval()
