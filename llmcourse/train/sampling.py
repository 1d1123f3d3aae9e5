"""Turning next-token logits into tokens (unit 09): temperature, top-k, top-p (nucleus), sampling, and the
autoregressive ``generate`` loop for decoder-only language models.

The rules are exact, because they decide which tokens may ever be drawn:

* **temperature** divides the *logits* by ``T > 0`` before the softmax: ``softmax(z / T)``. ``T → 0``
  approaches argmax (greedy), ``T → ∞`` the uniform distribution; ``T = 1`` leaves the model's
  distribution as it is. ``T = 0`` is accepted by :func:`sample_next_token` and :func:`generate` and means
  greedy decoding (argmax; the filters are ignored).
* **top-k** keeps, in each row, every logit ``≥`` the row's k-th largest value; **ties with the k-th value
  are kept**, so more than k tokens can survive. Everything else becomes ``-inf``.
* **top-p** (nucleus sampling; Holtzman et al., "The Curious Case of Neural Text Degeneration", ICLR 2020)
  sorts the probabilities in descending order with a *stable* sort (equal probabilities keep their
  vocabulary order) and keeps sorted token ``i`` iff the probability mass **before** it is ``< p``. The
  token that crosses ``p`` is kept, so the kept mass is ``≥ p`` and the top-1 token always survives.
* **order**: temperature, then top-k, then top-p (on the renormalised survivors of top-k), then softmax
  and one ``torch.multinomial(probs, 1, generator=generator)`` draw for the whole batch.

Masked logits are ``-inf`` (their probability is exactly 0); a filter never modifies its input tensor.
:func:`generate` feeds at most the last ``context_length`` tokens to the model, uses only the logits of
the **last** position, freezes a row once it has produced ``eos_id`` (it keeps emitting ``eos_id``) and
stops when every row has; it runs in eval mode under ``torch.no_grad()`` and restores the model's mode.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = [
    "apply_temperature", "entropy", "filtered_probs", "generate", "generate_batched", "padded_batch",
    "sample_next_token", "top_k_filter", "top_p_filter",
]


def _check_logits(logits: Tensor, name: str = "logits") -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got "
                        f"{getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., V) with V ≥ 1, got {tuple(logits.shape)}")


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """Divide logits by the temperature: ``softmax(apply_temperature(z, T)) = softmax(z / T)``.

    Args:
        logits: ``(..., V)`` float.
        temperature: ``T > 0``. ``T < 1`` sharpens the distribution, ``T > 1`` flattens it; the argmax
            never changes.

    Returns:
        ``(..., V)`` float, ``logits / temperature`` (a new tensor).

    Raises:
        ValueError: ``temperature ≤ 0`` (use argmax for greedy decoding: :func:`sample_next_token` with
            ``temperature=0``). TypeError: ``logits`` not a floating-point tensor.
    """
    _check_logits(logits)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r} (temperature 0 means greedy: take the "
                         f"argmax instead of dividing by 0)")
    return logits / temperature


def top_k_filter(logits: Tensor, k: int | None) -> Tensor:
    """Keep each row's k largest logits **and every logit tied with the k-th**; the rest become ``-inf``.

    Args:
        logits: ``(..., V)`` float; each row (last dimension) is filtered independently.
        k: the number of tokens to keep, ``k ≥ 1``; ``None`` or ``k ≥ V`` returns the logits unchanged.

    Returns:
        ``(..., V)`` float: ``logits`` where ``logits ≥ kth_largest(row)``, ``-inf`` elsewhere (a new tensor;
        kept entries are bit-identical to the input).

    Raises:
        ValueError: ``k < 1``. TypeError: ``logits`` not a floating-point tensor.

    Example (the tie rule): ``[3., 1., 1., 0.]`` with ``k=2`` keeps indices 0, 1 and 2.
    """
    _check_logits(logits)
    if k is None or k >= logits.shape[-1]:
        return logits.clone()
    if int(k) != k or k < 1:
        raise ValueError(f"top_k must be a positive integer or None, got {k!r}")
    kth = torch.topk(logits, int(k), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float | None) -> Tensor:
    """Nucleus filter: keep the smallest prefix of the sorted distribution whose mass reaches ``p``.

    ``probs = softmax(logits)``; sort each row in descending order with a stable sort (ties keep their
    vocabulary order); keep sorted token ``i`` iff ``sum(sorted_probs[:i]) < p``, and the top-1 always (so
    ``p = 0`` keeps the most likely token alone, as ``transformers``' ``TopPLogitsWarper`` with its default
    ``min_tokens_to_keep=1``). So the token that crosses ``p`` is kept and the kept mass is ``≥ p``. Everything else becomes ``-inf``;
    the result is in the original vocabulary order.

    Args:
        logits: ``(..., V)`` float (may already contain ``-inf``, e.g. after :func:`top_k_filter`).
        p: ``0 ≤ p``; ``None`` or ``p ≥ 1`` returns the logits unchanged; ``p = 0`` keeps the top-1 only.

    Returns:
        ``(..., V)`` float, a new tensor; kept entries are bit-identical to the input.

    Raises:
        ValueError: ``p < 0``. TypeError: ``logits`` not a floating-point tensor.

    Example: ``z = [2, 1, 0.5, 0, -1]`` has probabilities ``[0.563, 0.207, 0.126, 0.076, 0.028]``;
    ``p = 0.5`` keeps only token 0 (its mass 0.563 already crosses 0.5), ``p = 0.8`` keeps tokens 0–2.
    """
    _check_logits(logits)
    if p is None or p >= 1:
        return logits.clone()
    if not p >= 0:
        raise ValueError(f"top_p must be in [0, 1] or None, got {p!r}")
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    cum = sorted_probs.cumsum(dim=-1)
    before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)  # mass strictly before i
    keep_sorted = before < p
    keep_sorted[..., 0] = True  # the most likely token always survives (p = 0 included)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def filtered_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """The distribution :func:`sample_next_token` draws from: temperature → top-k → top-p → softmax.

    ``temperature == 0`` gives the one-hot distribution of the argmax (first index on ties).

    Args:
        logits: ``(..., V)`` float.

    Returns:
        ``(..., V)`` float probabilities (each row sums to 1; filtered tokens are exactly 0).

    Raises:
        ValueError: ``temperature < 0``, or a bad ``top_k``/``top_p`` (see the filters).
    """
    _check_logits(logits)
    if temperature == 0:
        return torch.zeros_like(logits).scatter(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    z = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
    return torch.softmax(z, dim=-1)


def sample_next_token(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token per row from the filtered next-token distribution.

    ``temperature == 0``: the argmax of each row (greedy; ``top_k``/``top_p`` are ignored and no random
    number is drawn). Otherwise ``apply_temperature`` → ``top_k_filter`` → ``top_p_filter`` → softmax →
    ``torch.multinomial(probs, 1, generator=generator)`` (one call for the whole batch, so a seeded
    ``generator`` makes the draw reproducible).

    Args:
        logits: ``(B, V)`` float, the logits of the last position.
        temperature: ``≥ 0``.
        top_k, top_p: see :func:`top_k_filter` and :func:`top_p_filter` (``None`` = off).
        generator: a ``torch.Generator`` for reproducible draws (``None``: torch's global generator).

    Returns:
        ``(B, 1)`` long token ids.

    Raises:
        ValueError: ``logits`` not 2-D, ``temperature < 0``, bad ``top_k``/``top_p``.
    """
    _check_logits(logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}; take logits[:, -1] of the "
                         f"model's (B, T, V) output")
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    z = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
    probs = torch.softmax(z, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy in nats over the last dimension, ``-Σ p ln p`` (terms with ``p = 0`` count 0).

    Args:
        probs: ``(..., V)`` probabilities.

    Returns:
        ``(...)`` float. The uniform distribution over V tokens has entropy ``ln V``.
    """
    logp = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logp).sum(dim=-1)


@torch.no_grad()
def generate(model: nn.Module, idx: Tensor, max_new_tokens: int, context_length: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
             generator: torch.Generator | None = None) -> Tensor:
    """Autoregressive generation with a decoder-only language model (greedy by default).

    Each step feeds ``idx[:, -context_length:]`` (the most recent ``context_length`` tokens: a model with
    learned positions cannot read more), takes the logits of the **last** position ``(B, V)`` and appends
    :func:`sample_next_token` of them. A row that has produced ``eos_id`` keeps emitting ``eos_id``; the
    loop stops early once every row has produced it. Runs under ``torch.no_grad()`` in eval mode (dropout
    off) and restores the model's previous mode, also when the model raises.

    Args:
        model: maps ``(B, T)`` long ids to ``(B, T, V)`` logits, for ``T ≤ context_length``.
        idx: ``(B, T0)`` long prompt ids (``T0 ≥ 1``; it may be longer than ``context_length``).
        max_new_tokens: ``≥ 0``, the most tokens to append.
        context_length: ``≥ 1``, the window fed to the model.
        temperature, top_k, top_p, generator: as for :func:`sample_next_token` (``temperature=0``: greedy).
        eos_id: the end-of-sequence id, or ``None`` to always generate ``max_new_tokens``.

    Returns:
        ``(B, T0 + n)`` long, the prompt followed by ``n ≤ max_new_tokens`` new tokens.

    Raises:
        ValueError: ``idx`` not a non-empty 2-D integer tensor, ``max_new_tokens < 0``, ``context_length < 1``.
    """
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.is_floating_point() or idx.dtype == torch.bool \
            or idx.shape[1] < 1:
        raise ValueError(f"idx must be a (B, T0) tensor of token ids with T0 ≥ 1, got "
                         f"{getattr(idx, 'dtype', type(idx).__name__)} of shape {tuple(getattr(idx, 'shape', ()))}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    if context_length < 1:
        raise ValueError(f"context_length must be ≥ 1, got {context_length}")
    was_training = model.training
    model.eval()
    try:
        done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
        for _ in range(max_new_tokens):
            logits = model(idx[:, -context_length:])[:, -1, :]
            nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
            if eos_id is not None:
                nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
                done = done | (nxt[:, 0] == eos_id)
            idx = torch.cat([idx, nxt], dim=1)
            if eos_id is not None and bool(done.all()):
                break
    finally:
        model.train(was_training)
    return idx


def padded_batch(prompts: list[list[int]], pad_id: int = 0, side: str = "left") -> tuple[Tensor, Tensor, Tensor]:
    """Stack prompts of different lengths into one batch for a decoder: ids, attention mask and position ids.

    Args:
        prompts: ``B ≥ 1`` non-empty lists (or 1-D tensors) of token ids.
        pad_id: the id written into the padding slots (its value never matters when the mask is used).
        side: ``"left"`` (the padding before each prompt, so every row's last real token is in the last column,
            as ``transformers``' ``generate`` wants for decoder-only models) or ``"right"``.

    Returns:
        ``(idx, attention_mask, position_ids)``, each ``(B, T)`` with ``T`` the longest prompt: ``idx`` long,
        ``attention_mask`` bool (``True`` = a real token), ``position_ids`` long: ``0, 1, …`` along each row's
        real tokens (a real token's position is the number of real tokens before it, so a prompt gets the
        positions it has when run alone) and ``0`` in the padding slots (any valid row would do: padded keys are
        masked, padded queries' outputs are never used).

    Raises:
        ValueError: no prompts, an empty prompt, or ``side`` not ``"left"``/``"right"``.
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    rows = [torch.as_tensor(p, dtype=torch.long).flatten() for p in prompts]
    if not rows or any(r.numel() == 0 for r in rows):
        raise ValueError("padded_batch needs at least one prompt and no empty prompt")
    t = max(r.numel() for r in rows)
    idx = torch.full((len(rows), t), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), t, dtype=torch.bool)
    for b, r in enumerate(rows):
        cols = slice(t - r.numel(), t) if side == "left" else slice(0, r.numel())
        idx[b, cols], mask[b, cols] = r, True
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    return idx, mask, positions


@torch.no_grad()
def generate_batched(model: nn.Module, prompts: list[list[int]], max_new_tokens: int, context_length: int,
                     pad_id: int = 0, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                     eos_id: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Generate for prompts of different lengths in one batch, equal to generating for each prompt alone.

    The prompts are left-padded (:func:`padded_batch`), so the last column holds every row's newest token; the
    model gets ``attention_mask`` (padding is never attended to) and ``position_ids`` that count each row's real
    tokens from 0, and every step appends one column (mask ``True``, the row's next position). This is how
    ``transformers``' ``generate`` batches a decoder-only model (its ``GPT2LMHeadModel.prepare_inputs_for_generation``
    derives the positions from the mask the same way). The whole sequence is fed at every step (no cache).

    Args:
        model: maps ``(idx, attention_mask=..., position_ids=...)``, each ``(B, T)``, to logits ``(B, T, V)``
            (:class:`~llmcourse.models.gpt2.GPT2Model`).
        prompts: ``B`` non-empty lists of token ids.
        max_new_tokens: ``≥ 0``.
        context_length: the model's window; the longest prompt plus ``max_new_tokens`` must fit in it.
        pad_id, temperature, top_k, top_p, eos_id, generator: as for :func:`generate` (one
            :func:`sample_next_token` draw per step for the whole batch; a row that produced ``eos_id`` keeps
            emitting it and the loop stops once every row has).

    Returns:
        ``(B, n)`` long, the ``n ≤ max_new_tokens`` new tokens of each row. Greedy (``temperature=0``), row ``b``
        equals ``generate(model, prompts[b] as (1, T_b), n, context_length)[0, T_b:]`` (frozen on ``eos_id``).

    Raises:
        ValueError: bad prompts, ``max_new_tokens < 0``, or the longest prompt + ``max_new_tokens`` >
            ``context_length``.
    """
    idx, mask, positions = padded_batch(prompts, pad_id, "left")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    if idx.shape[1] + max_new_tokens > context_length:
        raise ValueError(f"the longest prompt ({idx.shape[1]} tokens) plus max_new_tokens={max_new_tokens} exceeds "
                         f"context_length={context_length}")
    was_training = model.training
    model.eval()
    try:
        t0 = idx.shape[1]
        done = torch.zeros(idx.shape[0], dtype=torch.bool)
        for _ in range(max_new_tokens):
            logits = model(idx, attention_mask=mask, position_ids=positions)[:, -1, :]
            nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
            if eos_id is not None:
                nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
                done = done | (nxt[:, 0] == eos_id)
            idx = torch.cat([idx, nxt], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
            if eos_id is not None and bool(done.all()):
                break
    finally:
        model.train(was_training)
    return idx[:, t0:]
