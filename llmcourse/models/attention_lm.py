"""A one-layer, attention-only language model: the smallest model that trains unit 03's attention.

``AttentionOnlyLM`` is token embeddings + learned absolute position embeddings, one
:class:`~llmcourse.nn.CausalSelfAttention` head with a residual connection, and a linear head to
the vocabulary::

    x = tok_emb(idx) + pos_emb(0 … T-1)          (B, T, D)
    h = x + attn(x)                               (B, T, D)   attn: d_in = d_out = D, causal
    logits = lm_head(h)                           (B, T, V)

There is no feed-forward network, no LayerNorm and only one head: units 04–05 add those. The
residual path lets the current token's own embedding reach the head directly (so the model can
learn bigram statistics without attending to itself), and frees the attention to look at earlier
tokens. This is the "one-layer attention-only transformer" of Elhage et al., "A Mathematical
Framework for Transformer Circuits" (2021), without its multiple heads.

Unit 03's lesson trains it on characters of tinyshakespeare for about a minute under the
``laptop`` profile and shows what its attention learned (``model.attn.last_weights``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..nn.attention import CausalSelfAttention

__all__ = ["AttentionOnlyLM"]


class AttentionOnlyLM(nn.Module):
    """One causal self-attention layer between an embedding and an output projection.

    Args:
        vocab_size: number of token ids V (≥ 1).
        d_model: embedding width D; the attention has ``d_in = d_out = D`` (≥ 1).
        context_length: maximum sequence length T (≥ 1); also the size of the position table.
        dropout: dropout on the attention weights (training mode only).

    ``state_dict`` keys: ``tok_emb.weight (V, D)``, ``pos_emb.weight (C, D)``,
    ``attn.W_query.weight / W_key.weight / W_value.weight (D, D)``, ``lm_head.weight (V, D)``,
    ``lm_head.bias (V)``. The causal mask is a non-persistent buffer of ``attn``.

    Raises:
        ValueError: for a non-positive size.
    """

    def __init__(self, vocab_size: int, d_model: int, context_length: int, dropout: float = 0.0):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("context_length", context_length)):
            if int(value) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.attn = CausalSelfAttention(d_model, d_model, context_length, dropout=dropout)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, idx: Tensor) -> Tensor:
        """``idx`` ``(B, T)`` long token ids -> logits ``(B, T, V)`` float.

        After the call ``self.attn.last_weights`` holds the ``(B, T, T)`` attention weights.

        Raises:
            ValueError: if ``idx`` is not a 2-D integer tensor, if ``T > context_length``, or if an id
                is outside ``[0, vocab_size)``.
        """
        if idx.dim() != 2 or idx.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"idx must be (B, T) integer token ids, got shape {tuple(idx.shape)} "
                             f"and dtype {idx.dtype}")
        t = idx.shape[1]
        if t > self.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length={self.context_length}; "
                             f"feed at most the last {self.context_length} tokens")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got min {int(idx.min())}, "
                             f"max {int(idx.max())}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        h = x + self.attn(x)
        return self.lm_head(h)

    @torch.no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> Tensor:
        """Sample ``max_new_tokens`` ids after ``idx`` ``(B, T0)``; returns ``(B, T0 + max_new_tokens)`` long.

        Each step feeds the last ``context_length`` ids, divides the last position's logits by
        ``temperature`` and draws from the softmax with ``torch.multinomial(..., generator=generator)``.
        Runs in eval mode and restores the previous mode. (Unit 09 builds the full ``generate`` with
        top-k and top-p filters.)

        Raises:
            ValueError: if ``temperature <= 0`` or ``max_new_tokens < 0``.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                logits = self(idx[:, -self.context_length:])[:, -1] / temperature
                probs = torch.softmax(logits, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
                idx = torch.cat([idx, nxt], dim=1)
        finally:
            self.train(was_training)
        return idx
