"""Transformer blocks: encoder block, decoder block and the projection to logits (unit 05).

Every sublayer ``f`` (self-attention, cross-attention, feed-forward) sits on a residual path with a
LayerNorm and residual dropout, in one of two placements (syllabus §4.4):

* **pre-LN** (``norm_first=True``, GPT-2 and later; the course default): ``x = x + dropout(f(norm(x)))``.
  The residual stream itself is never normalised, so a pre-LN *stack* ends with one final norm
  (the model that stacks the blocks owns it, e.g. unit 06's ``Transformer``).
* **post-LN** (``norm_first=False``, the original Transformer): ``x = norm(x + dropout(f(x)))``.

Attention is llmcourse's :class:`~llmcourse.nn.multihead.MultiHeadAttention` (unit 04); masks follow
the course convention (boolean, **True = may attend**, broadcastable to ``(B, H, T_q, T_k)``).

Sources: Vaswani et al., "Attention Is All You Need" (2017), §3.1 and Fig. 1 (post-LN);
Xiong et al., "On Layer Normalization in the Transformer Architecture" (2020), Fig. 1 (pre-LN).
Both placements match ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer``
(``batch_first=True``, ``norm_first=...``) loaded with the same weights; see
:func:`to_torch_encoder_layer` and :func:`to_torch_decoder_layer`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .feedforward import FeedForward
from .multihead import MultiHeadAttention
from .norms import LayerNorm

__all__ = ["DecoderBlock", "EncoderBlock", "ProjectionLayer", "to_torch_decoder_layer", "to_torch_encoder_layer"]


def _check_width(name: str, x: Tensor, d_model: int) -> None:
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{name} expects activations of shape (B, T, {d_model}); got {tuple(x.shape)}")


class EncoderBlock(nn.Module):
    """One encoder layer: self-attention (padding mask) and a feed-forward network.

    Args:
        d_model: width ``D`` of the residual stream.
        num_heads: attention heads ``H`` (``D`` must be divisible by ``H``).
        d_ff: hidden width of the feed-forward network.
        dropout: residual dropout after each sublayer and dropout on the attention weights
            (``0 ≤ p < 1``; 0.0 in every numerical comparison).
        norm_first: ``True`` for pre-LN, ``False`` for post-LN.
        activation: ``"relu"``, ``"gelu"`` or ``"gelu_tanh"`` (see :class:`FeedForward`).
        qkv_bias: whether the Q/K/V projections have biases (``True`` as in ``nn.MultiheadAttention``).

    Attributes and ``state_dict`` keys: ``self_attn.{W_query,W_key,W_value,out_proj}.{weight,bias}``
    (``MultiHeadAttention(D, D, H, dropout, qkv_bias)``), ``norm1.*``, ``norm2.*`` (:class:`LayerNorm`),
    ``ffn.fc1.*``, ``ffn.fc2.*`` (:class:`FeedForward`); ``dropout`` is an ``nn.Dropout``. With all
    biases ``4·D² + 4·D`` (attention) ``+ 2·D·d_ff + d_ff + D`` (FFN) ``+ 4·D`` (norms) parameters:
    3,152,384 for ``D = 512, H = 8, d_ff = 2048``, the same as ``nn.TransformerEncoderLayer``.

    ``forward(x, mask=None)``:
        pre-LN : ``x = x + dropout(self_attn(norm1(x), mask=mask)); x = x + dropout(ffn(norm2(x)))``
        post-LN: ``x = norm1(x + dropout(self_attn(x, mask=mask))); x = norm2(x + dropout(ffn(x)))``

        ``x`` ``(B, T, D)``; ``mask`` boolean, True = may attend, broadcastable to ``(B, H, T, T)``
        (typically the key-padding mask ``(B, 1, 1, T)``). Returns ``(B, T, D)``.

    Raises:
        ValueError: when ``D`` is not divisible by ``H`` (from ``MultiHeadAttention``), for an unknown
            activation, or when ``x`` is not ``(B, T, D)``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1, norm_first: bool = True,
                 activation: str = "relu", qkv_bias: bool = True):
        super().__init__()
        self.d_model, self.norm_first = d_model, bool(norm_first)
        self.self_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        _check_width("EncoderBlock", x, self.d_model)
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask))
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)))
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"


class DecoderBlock(nn.Module):
    """One decoder layer: masked self-attention, cross-attention to the encoder memory, feed-forward.

    Args: as :class:`EncoderBlock`. The causal mask is **not** built in: it arrives in ``tgt_mask``
    (so the same block serves teacher forcing with padding, ``causal_mask(T) & pad``).

    Attributes and ``state_dict`` keys: ``self_attn.*``, ``cross_attn.*`` (two
    ``MultiHeadAttention(D, D, H, dropout, qkv_bias)``), ``norm1.*``, ``norm2.*``, ``norm3.*``, ``ffn.*``;
    ``dropout``. 4,204,032 parameters for ``D = 512, H = 8, d_ff = 2048`` (as ``nn.TransformerDecoderLayer``).

    ``forward(x, memory, tgt_mask=None, memory_mask=None)``, pre-LN::

        x = x + dropout(self_attn(norm1(x), mask=tgt_mask))
        x = x + dropout(cross_attn(norm2(x), memory, mask=memory_mask))   # K, V from memory, not re-normalised
        x = x + dropout(ffn(norm3(x)))

    post-LN: the same three sublayers, each followed by its norm after the residual add.

        ``x`` ``(B, T_tgt, D)``; ``memory`` ``(B, T_src, D)`` (the encoder output, already normalised by
        the encoder's final norm in a pre-LN stack); ``tgt_mask`` broadcastable to ``(B, H, T_tgt, T_tgt)``;
        ``memory_mask`` broadcastable to ``(B, H, T_tgt, T_src)`` (typically the source key-padding mask
        ``(B, 1, 1, T_src)``); both boolean, True = may attend. Returns ``(B, T_tgt, D)``.

    Raises:
        ValueError: as :class:`EncoderBlock`, and when ``memory`` is not ``(B, T_src, D)``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1, norm_first: bool = True,
                 activation: str = "relu", qkv_bias: bool = True):
        super().__init__()
        self.d_model, self.norm_first = d_model, bool(norm_first)
        self.self_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)
        self.cross_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.norm3 = LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        _check_width("DecoderBlock", x, self.d_model)
        _check_width("DecoderBlock (memory)", memory, self.d_model)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(f"DecoderBlock: memory batch size {memory.shape[0]} differs from x's {x.shape[0]}")
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=tgt_mask))
            x = x + self.dropout(self.cross_attn(self.norm2(x), memory, mask=memory_mask))
            x = x + self.dropout(self.ffn(self.norm3(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, mask=tgt_mask)))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, mask=memory_mask)))
            x = self.norm3(x + self.dropout(self.ffn(x)))
        return x

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"


class ProjectionLayer(nn.Module):
    """The final linear map from the residual stream to vocabulary **logits**.

    Args:
        d_model: width ``D``; vocab_size: ``V``.

    ``state_dict`` keys ``proj.weight`` ``(V, D)``, ``proj.bias`` ``(V,)``.

    ``forward(x)``: ``(B, T, D)`` → logits ``(B, T, V)``. No softmax or log-softmax: ``F.cross_entropy``
    applies log-softmax itself (numerically stable), and sampling/argmax work on logits.
    """

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        if d_model < 1 or vocab_size < 1:
            raise ValueError(f"ProjectionLayer needs d_model ≥ 1 and vocab_size ≥ 1, got {d_model}, {vocab_size}")
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.proj.in_features:
            raise ValueError(f"ProjectionLayer(d_model={self.proj.in_features}) got input with last dimension "
                             f"{x.shape[-1]} (shape {tuple(x.shape)})")
        return self.proj(x)


# ------------------------------------------------------------------------------------------------
# interop with torch's built-in layers (the oracles of unit 05's checks)
# ------------------------------------------------------------------------------------------------

_ACT_TO_TORCH = {"relu": "relu", "gelu": "gelu"}


def _copy_mha(dst: nn.MultiheadAttention, src: nn.Module) -> None:
    d = src.W_query.weight.shape[0]
    dst.in_proj_weight.copy_(torch.cat([src.W_query.weight, src.W_key.weight, src.W_value.weight], 0))
    biases = [getattr(src, n).bias for n in ("W_query", "W_key", "W_value")]
    if dst.in_proj_bias is not None:
        dst.in_proj_bias.copy_(torch.cat([b if b is not None else torch.zeros(d) for b in biases], 0))
    dst.out_proj.weight.copy_(src.out_proj.weight)
    dst.out_proj.bias.copy_(src.out_proj.bias)


def _torch_kwargs(block: nn.Module) -> dict:
    act = block.ffn.activation
    if act not in _ACT_TO_TORCH:
        raise ValueError(f"torch's Transformer layers take activation 'relu' or 'gelu' (exact), not {act!r}")
    return {"dropout": 0.0, "activation": _ACT_TO_TORCH[act], "batch_first": True, "norm_first": block.norm_first}


@torch.no_grad()
def to_torch_encoder_layer(block: EncoderBlock) -> nn.TransformerEncoderLayer:
    """An ``nn.TransformerEncoderLayer`` (``batch_first=True``, dropout 0, same ``norm_first``) with ``block``'s weights.

    ``self_attn.in_proj_weight = cat([W_query, W_key, W_value])``, ``linear1 = ffn.fc1``, ``linear2 = ffn.fc2``,
    ``norm1/norm2`` copied. Call it as ``layer(x, src_key_padding_mask=~keep)`` where ``keep`` ``(B, T)`` is
    True for real tokens (torch's boolean masks mean *blocked*). Returned in eval mode.
    """
    d = block.d_model
    layer = nn.TransformerEncoderLayer(d, block.self_attn.num_heads, block.ffn.d_ff, **_torch_kwargs(block))
    _copy_mha(layer.self_attn, block.self_attn)
    for mine, theirs in ((block.ffn.fc1, layer.linear1), (block.ffn.fc2, layer.linear2),
                         (block.norm1, layer.norm1), (block.norm2, layer.norm2)):
        theirs.weight.copy_(mine.weight)
        theirs.bias.copy_(mine.bias)
    return layer.eval()


@torch.no_grad()
def to_torch_decoder_layer(block: DecoderBlock) -> nn.TransformerDecoderLayer:
    """An ``nn.TransformerDecoderLayer`` with ``block``'s weights (``multihead_attn`` = ``cross_attn``).

    Call it as ``layer(x, memory, tgt_mask=~causal, memory_key_padding_mask=~src_keep)``. Eval mode.
    """
    d = block.d_model
    layer = nn.TransformerDecoderLayer(d, block.self_attn.num_heads, block.ffn.d_ff, **_torch_kwargs(block))
    _copy_mha(layer.self_attn, block.self_attn)
    _copy_mha(layer.multihead_attn, block.cross_attn)
    for mine, theirs in ((block.ffn.fc1, layer.linear1), (block.ffn.fc2, layer.linear2), (block.norm1, layer.norm1),
                         (block.norm2, layer.norm2), (block.norm3, layer.norm3)):
        theirs.weight.copy_(mine.weight)
        theirs.bias.copy_(mine.bias)
    return layer.eval()
