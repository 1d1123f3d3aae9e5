"""Optimizer set-up and gradient clipping for pretraining (unit 10).

**AdamW parameter groups.** AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR
2019, Algorithm 2) shrinks every parameter of a group by ``lr · weight_decay`` per step, separately from
the Adam update. The usual GPT recipe decays only the **matrices** (``ndim ≥ 2``: Linear and Embedding
weights) and leaves the vectors alone (biases, LayerNorm scales and shifts): pulling a LayerNorm scale
towards 0 or a bias towards 0 is not a useful prior. A tied weight is **one** tensor and must be listed
once; ``torch.optim`` refuses a parameter that appears in two groups.

For ``gpt2-char-tiny`` (809,856 parameters): 802,944 decayed (the two embeddings and every matrix) and
6,912 not decayed (biases and norms).

**Clipping by the global norm** (Pascanu et al., "On the difficulty of training recurrent neural
networks", ICML 2013, Algorithm 1): treat all gradients as one long vector ``g``; if ``‖g‖₂ > max_norm``,
rescale **every** gradient by ``max_norm / (‖g‖₂ + ε)``. The direction of the update is kept; only its
length is capped. Clipping each tensor on its own would change the direction.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["clip_grad_norm", "configure_optimizer", "parameter_groups"]


@torch.no_grad()
def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float, eps: float = 1e-6) -> float:
    """Clip gradients in place by their global L2 norm; return the norm **before** clipping.

    ``norm = sqrt(Σ_p ‖p.grad‖²)`` over the parameters that have a gradient (``p.grad is None`` is
    skipped). When ``norm > max_norm`` every gradient is multiplied by ``max_norm / (norm + eps)``.
    Same result as ``torch.nn.utils.clip_grad_norm_(parameters, max_norm)`` (which always multiplies by
    ``min(1, max_norm / (norm + 1e-6))``). Example: gradients ``[3, 4]`` and ``[0, 12]`` (norm 13),
    ``max_norm = 1``: returns 13.0 and leaves ``[0.2308, 0.3077]`` and ``[0, 0.9231]``.

    Args:
        parameters: an iterable of tensors (e.g. ``model.parameters()``), consumed once.
        max_norm: the largest allowed global norm (> 0).
        eps: added to the norm in the denominator.

    Returns:
        float: the global gradient norm before clipping (0.0 if no parameter has a gradient).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads]))
    total = float(norm)
    if total > max_norm:
        scale = max_norm / (total + eps)
        for g in grads:
            g.mul_(scale)
    return total


def parameter_groups(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """``(decay, no_decay)``: the named trainable parameters with ``ndim ≥ 2`` and those with ``ndim < 2``.

    ``named_parameters()`` yields a shared (tied) tensor once, under its first name (``tok_emb.weight``
    for a tied GPT-2).
    """
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append((name, p))
    return decay, no_decay


def configure_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1,
                        betas: tuple[float, float] = (0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW with two parameter groups: matrices decayed, vectors not.

    Group 0: every trainable parameter with ``ndim ≥ 2`` (Linear and Embedding weights), with
    ``weight_decay``; group 1: ``ndim < 2`` (biases, LayerNorm weights and biases) with
    ``weight_decay = 0.0``. Each tensor appears exactly once (a tied weight too); the order inside a
    group is ``model.named_parameters()`` order. ``betas=(0.9, 0.95)`` as in GPT-3's recipe.

    Returns:
        ``torch.optim.AdamW`` (eps 1e-8) with ``lr`` on both groups.
    """
    decay, no_decay = parameter_groups(model)
    groups = [{"params": [p for _, p in decay], "weight_decay": weight_decay},
              {"params": [p for _, p in no_decay], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)
