"""A BERT-style encoder classifier (unit 07).

``ids (B, L)`` → :class:`BertEmbeddings` (token + learned position + segment, LayerNorm, dropout) →
``n_layers`` pre-LN :class:`~llmcourse.nn.blocks.EncoderBlock` (GELU, key-padding mask) → a final
LayerNorm → pooling (the ``[CLS]`` state at position 0, or the masked mean over real tokens) → a
linear classifier → logits ``(B, num_classes)``.

Attention is bidirectional: the only mask is the key-padding mask ``(B, 1, 1, L)`` built from
``attention_mask`` (True = real token = may be attended to, the course convention), so no token
attends to ``[PAD]`` and appending padding changes no logit.

Sources: Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers" (2019), §3 and
Fig. 2 (input = token + segment + position embeddings; ``[CLS]`` for classification). Unlike BERT
(post-LN, 512 positions, 30k WordPiece vocabulary) this model is pre-LN with a final norm, and uses
GPT-2's BPE compacted to the training vocabulary (:mod:`llmcourse.data.sentiment`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..nn.blocks import EncoderBlock
from ..nn.norms import LayerNorm

__all__ = ["BertEmbeddings", "EncoderClassifier", "attention_maps", "encoder_classifier_param_count"]

POOLINGS = ("cls", "mean")


class BertEmbeddings(nn.Module):
    """Token + learned absolute position + segment embeddings, then LayerNorm and dropout.

    Args:
        vocab_size: V (including the 4 specials; ``[PAD]`` = 0).
        d_model: D.
        max_len: number of learned positions (the longest sequence, ``[CLS]``/``[SEP]`` included).
        type_vocab_size: number of segments (2: sentence A/B, as in BERT).
        dropout: dropout on the normalised sum.

    ``state_dict`` keys: ``tok.weight`` (V, D) (``padding_idx=0``: the ``[PAD]`` row starts at 0 and
    receives no gradient), ``pos.weight`` (max_len, D), ``seg.weight`` (type_vocab_size, D),
    ``norm.weight``/``norm.bias`` (D,) (llmcourse's :class:`~llmcourse.nn.norms.LayerNorm`).

    ``forward(ids, segment_ids=None)``: ``ids`` (B, L) long with L ≤ max_len; ``segment_ids`` (B, L)
    long or ``None`` (all segment 0). Returns ``dropout(norm(tok(ids) + pos(0 … L−1) + seg(segment_ids)))``,
    shape (B, L, D).

    Raises:
        ValueError: L > max_len, ``ids`` not 2-D, or ``segment_ids`` of another shape.
    """

    def __init__(self, vocab_size: int, d_model: int, max_len: int, type_vocab_size: int = 2, dropout: float = 0.1):
        super().__init__()
        self.max_len = max_len
        self.tok = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.pos = nn.Embedding(max_len, d_model)
        self.seg = nn.Embedding(type_vocab_size, d_model)
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: Tensor, segment_ids: Tensor | None = None) -> Tensor:
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (B, L), got {tuple(ids.shape)}")
        length = ids.shape[1]
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len={self.max_len}; truncate in encode_batch")
        if segment_ids is None:
            segment_ids = torch.zeros_like(ids)
        elif segment_ids.shape != ids.shape:
            raise ValueError(f"segment_ids must have the shape of ids {tuple(ids.shape)}, got {tuple(segment_ids.shape)}")
        positions = torch.arange(length, device=ids.device)
        x = self.tok(ids) + self.pos(positions) + self.seg(segment_ids)
        return self.dropout(self.norm(x))


class EncoderClassifier(nn.Module):
    """A BERT-style sequence classifier over a compact GPT-2 vocabulary.

    Args:
        vocab_size: V. d_model: D. num_heads: H (D divisible by H). d_ff: FFN width.
        n_layers: number of encoder blocks. max_len: learned positions.
        num_classes: C. dropout: embedding, attention and residual dropout.
        pooling: ``"cls"`` (the final-normed state at position 0, ``[CLS]``) or ``"mean"`` (the mean of
            the final-normed states over real tokens only, ``attention_mask`` True).

    ``state_dict`` keys: ``embeddings.*`` (:class:`BertEmbeddings`), ``layers.{i}.*``
    (:class:`~llmcourse.nn.blocks.EncoderBlock` with ``norm_first=True, activation="gelu"``),
    ``final_norm.{weight,bias}``, ``classifier.weight`` (C, D), ``classifier.bias`` (C,).
    Parameter count: :func:`encoder_classifier_param_count`; ``64·V + 104,578`` for the defaults.

    ``forward(ids, attention_mask)``: ``ids`` (B, L) long, ``attention_mask`` (B, L) bool (True = real
    token). The attention mask is ``attention_mask[:, None, None, :]`` (B, 1, 1, L). Returns logits
    (B, C) (no softmax).

    Raises:
        ValueError: unknown pooling; ``attention_mask`` not bool or not the shape of ``ids``; from the
            blocks: D not divisible by H.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, d_ff: int = 256, n_layers: int = 2,
                 max_len: int = 64, num_classes: int = 2, dropout: float = 0.1, pooling: str = "cls"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.pooling = pooling
        self.embeddings = BertEmbeddings(vocab_size, d_model, max_len, dropout=dropout)
        self.layers = nn.ModuleList(
            EncoderBlock(d_model, num_heads, d_ff, dropout, norm_first=True, activation="gelu")
            for _ in range(n_layers))
        self.final_norm = LayerNorm(d_model)
        self.classifier = nn.Linear(d_model, num_classes)

    def encode(self, ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The final-normed hidden states (B, L, D)."""
        if attention_mask.dtype != torch.bool:
            raise ValueError(f"attention_mask must be bool (True = real token), got dtype {attention_mask.dtype}")
        if attention_mask.shape != ids.shape:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must have the shape of ids {tuple(ids.shape)}")
        mask = attention_mask[:, None, None, :]
        h = self.embeddings(ids)
        for layer in self.layers:
            h = layer(h, mask)
        return self.final_norm(h)

    def forward(self, ids: Tensor, attention_mask: Tensor) -> Tensor:
        h = self.encode(ids, attention_mask)
        if self.pooling == "cls":
            pooled = h[:, 0]
        else:
            keep = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.classifier(pooled)


def encoder_classifier_param_count(vocab_size: int, d_model: int = 64, d_ff: int = 256, n_layers: int = 2,
                                   max_len: int = 64, num_classes: int = 2, type_vocab_size: int = 2) -> int:
    """Parameters of :class:`EncoderClassifier` from the formula (all biases on).

    embeddings ``V·D + max_len·D + type_vocab_size·D + 2D``; per block ``4D² + 4D`` (attention)
    ``+ 2·D·d_ff + d_ff + D`` (FFN) ``+ 4D`` (two norms); final norm ``2D``; classifier ``C·D + C``.
    For the defaults: ``64·V + 104,578`` (49,984 per block).
    """
    d = d_model
    embeddings = vocab_size * d + max_len * d + type_vocab_size * d + 2 * d
    block = 4 * d * d + 4 * d + 2 * d * d_ff + d_ff + d + 4 * d
    return embeddings + n_layers * block + 2 * d + num_classes * d + num_classes


@torch.no_grad()
def attention_maps(model: EncoderClassifier, ids: Tensor, attention_mask: Tensor) -> list[Tensor]:
    """Attention weights of every layer for one batch, in eval mode.

    Returns:
        list (one per layer) of (B, H, L, L) post-softmax weights (``[:, h, 0]`` is ``[CLS]``'s row).
        The model's mode and the layers' ``store_weights`` flags are restored afterwards.
    """
    was_training = model.training
    flags = [layer.self_attn.store_weights for layer in model.layers]
    model.eval()
    try:
        for layer in model.layers:
            layer.self_attn.store_weights = True
        model(ids, attention_mask)
        return [layer.self_attn.last_weights.clone() for layer in model.layers]
    finally:
        for layer, flag in zip(model.layers, flags):
            layer.self_attn.store_weights = flag
        model.train(was_training)
