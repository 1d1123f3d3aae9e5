"""Decoding for encoder–decoder models (unit 06): greedy translation, with optional probabilities and
cross-attention weights for the alignment widgets.

Decoding always runs under ``model.eval()`` and ``torch.no_grad()`` (dropout off: the same input gives the
same translation) and restores the model's previous mode afterwards.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..data.translation import EOS_ID, PAD_ID, SOS_ID, make_src_mask, make_tgt_mask

__all__ = ["greedy_translate", "greedy_translate_verbose"]


def _check(model, src: Tensor, max_len: int) -> None:
    if not isinstance(src, Tensor) or src.dim() != 2 or src.is_floating_point() or src.dtype == torch.bool:
        raise ValueError(f"src must be a (B, S) tensor of token ids, got {getattr(src, 'dtype', type(src).__name__)} "
                         f"of shape {tuple(getattr(src, 'shape', ()))}")
    if max_len < 1:
        raise ValueError(f"max_len must be ≥ 1, got {max_len}")
    limit = getattr(model, "max_len", None)
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len={max_len} exceeds the model's max_len={limit} (its positional table)")


@torch.no_grad()
def greedy_translate(model, src: Tensor, max_len: int, sos_id: int = SOS_ID, eos_id: int = EOS_ID,
                     pad_id: int = PAD_ID) -> Tensor:
    """Greedy decoding with EOS stopping (exercise ``06.greedy_translate``).

    Encodes ``src`` once; starting from ``[SOS]``, appends at each step the argmax of the logits at the
    last position, given the source and the prefix. A row that has produced EOS is finished: later
    positions get ``pad_id``. Stops when every row is finished or after ``max_len`` tokens.

    Args:
        model: a :class:`~llmcourse.models.transformer.Transformer` (``encode``, ``decode``, ``projection``).
        src: ``(B, S)`` long, right-padded with ``pad_id``.
        max_len: the most tokens to generate (≤ the model's ``max_len``).

    Returns:
        ``(B, L)`` long with ``L ≤ max_len``: the generated tokens **without** SOS, each row ending at its
        first EOS (included), finished rows right-padded with ``pad_id``.

    Raises:
        ValueError: ``src`` not a 2-D integer tensor, ``max_len < 1`` or larger than the model's.
    """
    _check(model, src, max_len)
    was_training = model.training
    model.eval()
    try:
        src_mask = make_src_mask(src, pad_id)
        memory = model.encode(src, src_mask)
        ys = torch.full((src.shape[0], 1), sos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            hidden = model.decode(ys, memory, src_mask, make_tgt_mask(ys, pad_id))
            nxt = model.projection(hidden[:, -1]).argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
            done = done | (nxt == eos_id)
            if bool(done.all()):
                break
        return ys[:, 1:]
    finally:
        model.train(was_training)


@torch.no_grad()
def greedy_translate_verbose(model, src: Tensor, max_len: int, sos_id: int = SOS_ID, eos_id: int = EOS_ID,
                             pad_id: int = PAD_ID) -> dict:
    """:func:`greedy_translate` plus what the widgets show.

    Returns a dict:
        ``tokens`` ``(B, L)`` (as :func:`greedy_translate`);
        ``probs`` ``(B, L)`` float: the softmax probability of each chosen token (1.0 at padding);
        ``cross_weights``: list over decoder layers of ``(B, H, L, S)`` cross-attention weights, query ``i`` being
        the step that produced token ``i`` (decoder input ``[SOS] + tokens[:, :-1]``). Causality makes one
        teacher-forced pass over the generated prefix give exactly the weights of step-by-step decoding.
    """
    tokens = greedy_translate(model, src, max_len, sos_id, eos_id, pad_id)
    was_training = model.training
    model.eval()
    attns = [layer.cross_attn for layer in model.decoder.layers]
    saved = [a.store_weights for a in attns]
    try:
        for a in attns:
            a.store_weights = True
        src_mask = make_src_mask(src, pad_id)
        memory = model.encode(src, src_mask)
        prefix = torch.cat([torch.full_like(tokens[:, :1], sos_id), tokens[:, :-1]], dim=1)
        hidden = model.decode(prefix, memory, src_mask, make_tgt_mask(prefix, pad_id))
        probs = model.projection(hidden).softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
        probs = torch.where(tokens == pad_id, torch.ones_like(probs), probs)
        cross = [a.last_weights.clone() for a in attns]
    finally:
        for a, s in zip(attns, saved):
            a.store_weights = s
        model.train(was_training)
    return {"tokens": tokens, "probs": probs, "cross_weights": cross}
