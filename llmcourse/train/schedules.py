"""Learning-rate schedules.

**The Noam schedule** (Vaswani et al., "Attention Is All You Need", 2017, eq. (3)):

    lr(step) = d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)

a linear warm-up for ``warmup`` steps, then decay as ``1/√step``; the peak, at ``step = warmup``, is
``(d_model · warmup)^−0.5`` (6.987712e-04 for ``d_model = 512, warmup = 4000``).

**``LambdaLR`` multiplies.** ``torch.optim.lr_scheduler.LambdaLR(optimizer, f)`` sets each group's lr to
``base_lr · f(epoch)``, where ``base_lr`` is the lr the optimizer had when the scheduler was built.
To get the paper's numbers the base lr must therefore be ``1.0`` (or a deliberate ``factor``); an
optimizer built with ``lr=1e-4`` makes every value 10⁴ times smaller (peak 6.99e-08): the
"base-lr trap" (``B00.noam_base_lr``). :func:`make_noam_scheduler` sets the base lr itself.

**Step numbering.** ``LambdaLR`` evaluates ``f(0)`` when it is built, and ``f(n)`` after the n-th
``scheduler.step()``. With the usual loop (``optimizer.step()`` then ``scheduler.step()``), the n-th
optimizer step (n = 1, 2, …) therefore uses ``f(n − 1)``, so the lambda must be ``noam_lambda(e + 1, …)``
for the n-th update to use step n. ``noam_lambda(e, …)`` uses λ(1) twice (``B00.noam_off_by_one``).
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["noam_lambda", "make_noam_scheduler", "warmup_cosine_lr"]


def noam_lambda(step: int, d_model: int, warmup: int) -> float:
    """The Noam multiplier ``d_model^−0.5 · min(s^−0.5, s · warmup^−1.5)`` with ``s = max(step, 1)``.

    Args:
        step: optimizer step, counting from 1 (``0`` is treated as ``1``).
        d_model: model width, ≥ 1.
        warmup: warm-up steps, ≥ 1.

    Returns:
        float (a multiplier of the optimizer's base lr; the lr itself when the base lr is 1).
        F00.3 (``d_model=512, warmup=4000``): λ(1) = 1.746928e-07, λ(4000) = 6.987712e-04 (the peak),
        λ(16000) = 3.493856e-04.

    Raises:
        ValueError: if ``step < 0``, ``d_model < 1`` or ``warmup < 1``.
    """
    if step < 0:
        raise ValueError(f"step must be ≥ 0, got {step}")
    if d_model < 1 or warmup < 1:
        raise ValueError(f"d_model and warmup must be ≥ 1, got d_model={d_model}, warmup={warmup}")
    s = max(step, 1)
    return d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)


def make_noam_scheduler(optimizer: torch.optim.Optimizer, d_model: int, warmup: int,
                        factor: float = 1.0) -> LambdaLR:
    """A ``LambdaLR`` that drives ``optimizer`` along the Noam schedule, scaled by ``factor``.

    Sets every param group's lr (its base lr for the scheduler) to ``factor``, so that the lr used by the
    n-th ``optimizer.step()`` (n = 1, 2, …) is ``factor · noam_lambda(n, d_model, warmup)``, provided
    ``scheduler.step()`` is called once after each ``optimizer.step()``.

    Args:
        optimizer: any ``torch.optim`` optimizer; its current lr values are overwritten.
        d_model: model width, ≥ 1.
        warmup: warm-up steps, ≥ 1.
        factor: overall scale, > 0 (1.0 reproduces the paper).

    Returns:
        ``torch.optim.lr_scheduler.LambdaLR``.

    Raises:
        TypeError: if ``optimizer`` is not a ``torch.optim.Optimizer``.
        ValueError: if ``d_model < 1``, ``warmup < 1`` or ``factor <= 0``.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if d_model < 1 or warmup < 1:
        raise ValueError(f"d_model and warmup must be ≥ 1, got d_model={d_model}, warmup={warmup}")
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    for group in optimizer.param_groups:
        group["lr"] = factor
        group["initial_lr"] = factor  # the base lr LambdaLR multiplies (also if a scheduler was attached before)

    def lr_lambda(epoch: int) -> float:
        return noam_lambda(epoch + 1, d_model, warmup)   # LambdaLR's counter starts at 0

    return LambdaLR(optimizer, lr_lambda)


def warmup_cosine_lr(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up, then a half cosine from ``max_lr`` down to the floor ``min_lr`` (unit 10).

    With ``s = step`` (0-based optimizer step), ``W = warmup_steps``, ``N = total_steps``::

        s < W:        max_lr · (s + 1) / W                       (the first step already uses max_lr / W)
        W ≤ s ≤ N:    min_lr + ½ (max_lr − min_lr) (1 + cos(π (s − W) / (N − W)))
        s > N:        min_lr                                     (held; the cosine is not continued)

    Continuous at ``s = W`` (both give ``max_lr``) and non-increasing after it. The shape of the cosine
    schedule is Loshchilov & Hutter, "SGDR" (ICLR 2017), eq. (5), without restarts; warm-up as in
    GPT-2/GPT-3 training recipes. Example (``max_lr=1e-3, min_lr=1e-4, W=10, N=100``): step 0 → 1e-4,
    9 → 1e-3, 10 → 1e-3, 55 → 5.5e-4, 100 → 1e-4, 150 → 1e-4.

    Raises:
        ValueError: ``step < 0``, ``warmup_steps < 0`` or ``total_steps <= warmup_steps``.
    """
    if step < 0 or warmup_steps < 0 or total_steps <= warmup_steps:
        raise ValueError(f"need step ≥ 0 and 0 ≤ warmup_steps < total_steps; got step={step}, "
                         f"warmup_steps={warmup_steps}, total_steps={total_steps}")
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
