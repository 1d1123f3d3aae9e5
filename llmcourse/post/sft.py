"""Supervised fine-tuning with a loss on the answer tokens only (unit 19).

An SFT example is a prompt followed by its ideal completion (:mod:`llmcourse.post.task`'s chat template).
The model reads the whole sequence, but only the completion is what it should learn to *write*: the
cross-entropy is taken over the completion's tokens (its ``<eos>`` included, so the model learns to stop),
and the prompt's tokens and the padding contribute nothing (InstructGPT, Ouyang et al. 2022, and every chat
SFT recipe since; in ``transformers`` these positions carry the label ``-100``).

With ``ids (B, T)`` and ``logits = model(ids)``, position ``t − 1`` predicts token ``t``; the loss is the mean,
over all pairs ``(row, t)`` with ``t ≥ prompt_len`` and ``ids[row, t] ≠ pad_id``, of
``−log softmax(logits[row, t − 1])[ids[row, t]]``: one mean over the batch's answer tokens (not a mean of
per-row means).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..train.optim import clip_grad_norm
from ..train.schedules import warmup_cosine_lr

__all__ = ["sft_batch", "sft_labels", "sft_loss", "sft_train"]


def sft_batch(task, pairs: Tensor) -> Tensor:
    """``(B, T)`` long: prompt + ideal completion of each ``(B, 2)`` pair, right-padded with ``<pad>``.

    ``T = task.prompt_len + `` the longest completion in the batch (answer digits + ``<eos>``).
    """
    tok = task.tokenizer
    rows = [tok.encode(task.prompt_text(a, b) + task.answer_text(a, b)) for a, b in pairs.tolist()]
    T = max(len(r) for r in rows)
    return torch.tensor([r + [tok.pad_id] * (T - len(r)) for r in rows], dtype=torch.long)


def _check(ids: Tensor, prompt_len: int) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ValueError(f"ids must be a (B, T) tensor of token ids, got {getattr(ids, 'shape', type(ids).__name__)}")
    if not 1 <= int(prompt_len) < ids.shape[1]:
        raise ValueError(f"prompt_len must be in [1, T) = [1, {ids.shape[1]}), got {prompt_len}")


def sft_labels(ids: Tensor, prompt_len: int, pad_id: int, ignore_index: int = -100) -> Tensor:
    """``(B, T − 1)`` long: the target of each logit position ``0 … T − 2``.

    ``labels[:, t − 1] = ids[:, t]`` for answer tokens (``t ≥ prompt_len`` and not ``pad_id``), else
    ``ignore_index``. Feed ``logits[:, :-1]`` and these labels to a cross-entropy with that ``ignore_index``.

    Raises:
        ValueError: ``ids`` not a 2-D integer tensor, or ``prompt_len`` outside ``[1, T)``.
    """
    _check(ids, prompt_len)
    targets = ids[:, 1:].clone()
    targets[:, : int(prompt_len) - 1] = ignore_index
    targets[targets == pad_id] = ignore_index
    return targets


def sft_loss(logits: Tensor, ids: Tensor, prompt_len: int, pad_id: int) -> Tensor:
    """Mean next-token cross-entropy over the answer tokens only (see the module docstring).

    Args:
        logits: ``(B, T, V)`` float, ``model(ids)``.
        ids: ``(B, T)`` long, prompts of length ``prompt_len`` followed by completions, right-padded.
        prompt_len: the prompts' common length, ``1 ≤ prompt_len < T``.
        pad_id: the padding token (never a target).

    Returns:
        Scalar tensor (``logits``' dtype). NaN when the batch has no answer token.

    Raises:
        ValueError: ``logits.shape[:2] != ids.shape`` or an argument as in :func:`sft_labels`.
    """
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(ids.shape):
        raise ValueError(f"logits must be (B, T, V) with (B, T) = ids.shape {tuple(ids.shape)}, "
                         f"got {tuple(logits.shape)}")
    labels = sft_labels(ids, prompt_len, pad_id)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def sft_train(model: nn.Module, task, steps: int, batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
              warmup_steps: int = 20, weight_decay: float = 0.0, max_norm: float = 1.0,
              callback=None, pool: Tensor | None = None) -> list[float]:
    """Fine-tune ``model`` on freshly drawn training pairs for ``steps`` AdamW steps; return each step's loss.

    Step ``s`` draws ``batch_size`` pairs with ``torch.Generator().manual_seed(seed + s)``: uniformly from the
    task's training pairs (never a test pair), or, when ``pool`` (``(n, 2)`` pairs) is given, with replacement
    from that fixed set (a small SFT set, as the "cold start" data of DeepSeek-R1). It builds :func:`sft_batch`, minimises :func:`sft_loss` with unit 10's warm-up + cosine schedule
    (``lr`` down to ``lr/10``) and global-norm clipping at ``max_norm``. ``callback(step, loss)`` is called
    after every step when given. The model is left in eval mode.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))
    tok = task.tokenizer
    losses = []
    model.train()
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = warmup_cosine_lr(s, lr, lr / 10, min(warmup_steps, max(steps - 1, 0)), max(steps, 1))
        g = torch.Generator().manual_seed(seed + s)
        pairs = (task.sample_train(batch_size, g) if pool is None
                 else pool[torch.randint(len(pool), (batch_size,), generator=g)])
        ids = sft_batch(task, pairs)
        loss = sft_loss(model(ids), ids, task.prompt_len, tok.pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(model.parameters(), max_norm)
        opt.step()
        losses.append(loss.item())
        if callback is not None:
            callback(s, losses[-1])
        if not math.isfinite(losses[-1]):
            break
    model.eval()
    return losses
