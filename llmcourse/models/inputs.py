"""Input validation shared by the course's decoder models (GPT-2, Llama 3, and the models built on them)."""

from __future__ import annotations

from torch import Tensor


def token_ids_length(idx: Tensor, context_length: int, model: str) -> int:
    """``T`` of a batch of token ids ``idx`` ``(B, T)``, after checking it fits the model.

    Args:
        idx: token ids ``(B, T)`` (an integer tensor).
        context_length: the longest sequence the model accepts.
        model: the model's name, for the error message.

    Raises:
        ValueError: ``idx`` is not a 2-D tensor, or ``T > context_length``.
    """
    if not isinstance(idx, Tensor) or idx.dim() != 2:
        shape = tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__
        raise ValueError(f"{model} expects token ids of shape (B, T), got {shape}")
    t = idx.shape[1]
    if t > context_length:
        raise ValueError(f"sequence length {t} exceeds context_length={context_length}: crop the "
                         f"input to its last {context_length} tokens")
    return t
