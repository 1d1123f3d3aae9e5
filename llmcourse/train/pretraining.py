"""The pretraining loop of unit 10: resumable, reproducible, measured.

One optimizer step (:func:`train_step`)::

    zero_grad -> logits = model(x) -> lm_loss(logits, y) -> backward -> clip_grad_norm(max_norm) -> step

:func:`train_steps` runs steps ``start_step … start_step + n_steps − 1``. Step ``s`` draws its batch with
``get_batch(data, B, T, torch.Generator().manual_seed(seed + s))`` and uses the learning rate
``lr_fn(s)`` on every parameter group, so the whole run is a function of ``(initial weights, seed, step)``:
stopping after any step, saving a checkpoint (:mod:`llmcourse.train.checkpoints`: model, optimizer,
step, RNG) and resuming in a fresh process reproduces the uninterrupted run exactly, dropout included.

:func:`estimate_loss` is the validation pass: ``eval()`` and ``no_grad()``, a fixed set of batches (the
same every time, so successive estimates are comparable), the mean of their losses, and the previous
mode restored (a loop that forgets to switch back trains the rest of the run without dropout).

:func:`pretrain` is the full run used by the lesson and the reference pipeline: AdamW with parameter
groups (:func:`~llmcourse.train.optim.configure_optimizer`), warm-up + cosine
(:func:`~llmcourse.train.schedules.warmup_cosine_lr`), periodic evaluation, text samples over time,
weight snapshots, a tqdm bar and an optional live dashboard (``callback``).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from ..data.corpus import get_batch
from .losses import lm_loss
from .optim import clip_grad_norm, configure_optimizer
from .schedules import warmup_cosine_lr

__all__ = ["EVAL_SEED", "accumulate_gradients", "budget_recipe", "estimate_loss", "pretrain", "sample_text", "train_step", "train_steps"]

EVAL_SEED = 10_000  # validation batch i uses torch.Generator().manual_seed(EVAL_SEED + i) in pretrain()


def _autocast(x: Tensor, dtype: torch.dtype | None):
    return torch.autocast(x.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def accumulate_gradients(model: nn.Module, x: Tensor, y: Tensor, micro_batches: int,
                         autocast_dtype: torch.dtype | None = None) -> float:
    """Backward of the mean next-token loss of ``(x, y)``, run as ``micro_batches`` micro-batches.

    The rows are split with ``torch.tensor_split(·, micro_batches)`` (sizes differ by at most one); each
    micro-batch's mean loss is weighted by its share of the rows, ``size / B``, before its backward, so the
    gradients that add up in ``.grad`` equal those of the whole batch's mean loss (up to float rounding)
    and the optimizer step is the same. Unweighted, the sum would be about ``micro_batches`` times too
    large. ``.grad`` is added to, not reset: zero it before.

    Args:
        x, y: ``(B, T)`` long inputs and targets.
        micro_batches: ``1 ≤ micro_batches ≤ B``.
        autocast_dtype: when given, each forward and loss run under ``torch.autocast`` in that dtype.

    Returns:
        float, the whole batch's mean loss (nats per token).

    Raises:
        ValueError: ``micro_batches`` outside ``[1, B]``.
    """
    if not 1 <= micro_batches <= len(x):
        raise ValueError(f"micro_batches must be in [1, {len(x)}] for a batch of {len(x)} rows, got {micro_batches}")
    total = 0.0
    for xb, yb in zip(torch.tensor_split(x, micro_batches), torch.tensor_split(y, micro_batches)):
        share = len(xb) / len(x)
        with _autocast(x, autocast_dtype):
            loss = lm_loss(model(xb), yb)
        (loss * share).backward()
        total += loss.item() * share
    return total


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor, lr: float,
               max_norm: float, micro_batches: int = 1, autocast_dtype: torch.dtype | None = None
               ) -> tuple[float, float]:
    """One optimizer step on the batch ``(x, y)`` at learning rate ``lr``; returns ``(loss, grad_norm)``.

    ``grad_norm`` is the global gradient norm **before** clipping (the number worth logging: it shows
    how often and how hard the clip acts). ``micro_batches > 1`` computes the same gradient in that many
    pieces (:func:`accumulate_gradients`: less activation memory, the same step). ``autocast_dtype``
    (e.g. ``torch.bfloat16``): the forward pass and the loss run under ``torch.autocast`` on the data's
    device type (matrix products in that dtype, the weights, their gradients and AdamW's state stay
    float32); backward, clipping and the update run outside it, as the autocast documentation asks.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    if micro_batches == 1:
        with _autocast(x, autocast_dtype):
            loss = lm_loss(model(x), y)
        loss.backward()
        loss_value = loss.item()
    else:
        loss_value = accumulate_gradients(model, x, y, micro_batches, autocast_dtype)
    norm = clip_grad_norm(model.parameters(), max_norm)
    optimizer.step()
    return loss_value, norm


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, data: Tensor, n_steps: int, start_step: int,
                batch_size: int, context_length: int, lr_fn: Callable[[int], float], max_norm: float,
                seed: int, micro_batches: int = 1, autocast_dtype: torch.dtype | None = None) -> list[float]:
    """Train for ``n_steps`` steps starting at step ``start_step``; return the loss of each step.

    Step ``s`` (for ``s`` in ``range(start_step, start_step + n_steps)``): batch
    ``get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + s))``, learning
    rate ``lr_fn(s)`` on every parameter group, then :func:`train_step` (with ``micro_batches`` and
    ``autocast_dtype``). The model is put in train mode.

    Returns:
        list of ``n_steps`` floats (the mean training loss of each step's batch, before its update).
    """
    model.train()
    losses = []
    for s in range(start_step, start_step + n_steps):
        x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
        loss, _ = train_step(model, optimizer, x, y, lr_fn(s), max_norm, micro_batches, autocast_dtype)
        losses.append(loss)
    return losses


@torch.no_grad()
def estimate_loss(model: nn.Module, data: Tensor, batch_size: int, context_length: int, n_batches: int,
                  seed: int = 0) -> float:
    """Mean loss over ``n_batches`` fixed batches, in eval mode without gradients; the mode is restored.

    Batch ``i`` is ``get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + i))``;
    all batches have the same size, so the mean of the batch means is the mean over every position.

    Returns:
        float, nats per token (``perplexity(loss)`` turns it into a perplexity).
    """
    was_training = model.training
    model.eval()
    try:
        total = 0.0
        for i in range(n_batches):
            x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + i))
            total += lm_loss(model(x), y).item()
        return total / n_batches
    finally:
        model.train(was_training)


def sample_text(model: nn.Module, tokenizer, prompt: str = "\n", max_new_tokens: int = 200,
                temperature: float = 0.8, seed: int = 0, context_length: int | None = None) -> str:
    """A continuation of ``prompt`` (the generated part only), decoded; greedy when ``temperature == 0``.

    Uses :func:`llmcourse.train.sampling.generate` (unit 09) with a ``torch.Generator`` seeded by ``seed``;
    ``context_length`` defaults to the model's ``cfg.context_length``. On the CPU it decodes with one
    thread (restored afterwards): the matrices of a batch-1 step are too small to split across cores,
    and on a busy machine a second thread mostly waits.
    """
    from .sampling import generate

    ctx = context_length or model.cfg.context_length
    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        out = generate(model, idx, max_new_tokens, ctx, temperature=temperature,
                       generator=torch.Generator().manual_seed(seed))
    finally:
        torch.set_num_threads(threads)
    return tokenizer.decode(out[0, idx.shape[1]:].tolist())


def budget_recipe(minutes: float, ms_per_step: float) -> dict:
    """Unit 10's laptop recipe for a budget of ``minutes`` of training on a machine that takes ``ms_per_step``
    milliseconds per step of this recipe's batch shape (measure it: it depends on the machine and its load).

    The schedule is tied to the budget: ``steps = minutes · 60,000 / ms_per_step`` steps, warm-up over the
    first 5 % of them (at most 100), then the cosine of :func:`~llmcourse.train.schedules.warmup_cosine_lr`
    down to ``min_lr`` exactly when the budget ends. The batch shape and learning rates were chosen from
    validation-loss curves against the step, composed with interleaved ms/step measurements, next to
    nanoGPT's published CPU recipe for the same model size (batch 12 × 64, lr 1e-3, 2,000 steps);
    ``python -m coursetools.bench.time_to_quality`` compares the two: step curves stored in
    ``docs/time-to-quality/``, budgets mapped to steps with ms/step measured on an idle machine.

    Returns:
        dict with ``batch_size``, ``context_length``, ``steps``, ``max_lr``, ``min_lr``, ``warmup_steps``,
        ``betas``, ``weight_decay``, ``max_norm``.

    Raises:
        ValueError: ``minutes`` or ``ms_per_step`` not positive, or a budget of fewer than 20 steps.
    """
    if minutes <= 0 or ms_per_step <= 0:
        raise ValueError(f"minutes and ms_per_step must be positive, got {minutes} and {ms_per_step}")
    steps = int(minutes * 60_000 / ms_per_step)
    if steps < 20:
        raise ValueError(f"a budget of {minutes} min at {ms_per_step} ms/step is only {steps} steps (need ≥ 20)")
    return {"batch_size": BUDGET_BATCH_SIZE, "context_length": BUDGET_CONTEXT_LENGTH, "steps": steps,
            "max_lr": BUDGET_MAX_LR, "min_lr": BUDGET_MIN_LR, "warmup_steps": min(100, max(1, steps // 20)),
            "betas": (0.9, 0.95), "weight_decay": 0.1, "max_norm": 1.0}


BUDGET_BATCH_SIZE, BUDGET_CONTEXT_LENGTH = 16, 64   # budget_recipe's batch shape
BUDGET_MAX_LR, BUDGET_MIN_LR = 3e-3, 3e-4            # and its learning rates (peak, floor)


def pretrain(model: nn.Module, train_data: Tensor, val_data: Tensor, *, steps: int, batch_size: int,
             context_length: int, max_lr: float, min_lr: float, warmup_steps: int, weight_decay: float = 0.1,
             max_norm: float = 1.0, seed: int = 0, eval_every: int = 100, eval_batches: int = 20,
             sample_fn: Callable[[nn.Module], str] | None = None, snapshot_steps: Iterable[int] = (),
             callback: Callable[[dict], None] | None = None, callback_every: int = 0,
             progress: bool = True, device: str | torch.device | None = None) -> dict:
    """Train ``model`` in place for ``steps`` steps and return the history of the run.

    AdamW (:func:`configure_optimizer`, betas (0.9, 0.95)) with the schedule
    ``warmup_cosine_lr(s, max_lr, min_lr, warmup_steps, steps)``; each step as in :func:`train_steps`
    (batch seeded by ``seed + s``). Evaluation (:func:`estimate_loss` on ``eval_batches`` fixed batches of
    the training and the validation stream) runs before the first step, after every ``eval_every``
    steps, at every snapshot step and after the last; ``sample_fn(model)`` is recorded at the same
    moments. ``snapshot_steps``: the step counts (0 = before training) at which a copy of the weights is
    kept in ``history["snapshots"]``.
    ``callback(history)`` is called after each evaluation and every ``callback_every`` steps (a live
    dashboard, :func:`llmcourse.viz.pretraining.make_training_dashboard`). ``device``: where to train
    (the model and both streams are moved there; batches are drawn on the CPU generator either way).

    Returns:
        dict with per-step lists ``step`` (1-based count of steps done), ``loss``, ``lr``, ``grad_norm``
        (before clipping), ``tokens_per_s``; per-evaluation lists ``eval_step``, ``train_loss_eval``,
        ``val_loss``; ``samples`` (list of ``(step, text)``); ``snapshots`` ({step: state_dict}); and
        ``max_norm``, ``tokens_per_step`` (B·T), ``seconds`` (training time without evaluation),
        ``ms_per_step``.
    """
    from tqdm.auto import tqdm

    if device is not None:
        model.to(device)
        train_data, val_data = train_data.to(device), val_data.to(device)
    optimizer = configure_optimizer(model, max_lr, weight_decay)
    snapshot_steps = set(snapshot_steps)
    hist = {"step": [], "loss": [], "lr": [], "grad_norm": [], "tokens_per_s": [], "eval_step": [],
            "train_loss_eval": [], "val_loss": [], "samples": [], "snapshots": {}, "max_norm": max_norm,
            "tokens_per_step": batch_size * context_length, "seconds": 0.0, "ms_per_step": math.nan}

    def evaluate(done: int) -> None:
        hist["eval_step"].append(done)
        hist["train_loss_eval"].append(estimate_loss(model, train_data, batch_size, context_length, eval_batches,
                                                     EVAL_SEED))
        hist["val_loss"].append(estimate_loss(model, val_data, batch_size, context_length, eval_batches, EVAL_SEED))
        if sample_fn is not None:
            hist["samples"].append((done, sample_fn(model)))
        model.train()

    def snapshot(done: int) -> None:
        if done in snapshot_steps:
            hist["snapshots"][done] = copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})

    snapshot(0)
    evaluate(0)
    if callback is not None:
        callback(hist)
    model.train()
    bar = tqdm(range(steps), desc="training", disable=not progress, mininterval=1.0)
    for s in bar:
        t0 = time.perf_counter()
        x, y = get_batch(train_data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
        lr = warmup_cosine_lr(s, max_lr, min_lr, warmup_steps, steps)
        loss, norm = train_step(model, optimizer, x, y, lr, max_norm)
        dt = time.perf_counter() - t0
        hist["seconds"] += dt
        done = s + 1
        hist["step"].append(done)
        hist["loss"].append(loss)
        hist["lr"].append(lr)
        hist["grad_norm"].append(norm)
        hist["tokens_per_s"].append(batch_size * context_length / dt)
        snapshot(done)
        evaluated = done % eval_every == 0 or done == steps or done in snapshot_steps
        if evaluated:
            evaluate(done)
            bar.set_postfix(loss=f"{loss:.3f}", val=f"{hist['val_loss'][-1]:.3f}", lr=f"{lr:.1e}")
        if callback is not None and (evaluated or (callback_every and done % callback_every == 0)):
            callback(hist)
    hist["ms_per_step"] = 1000 * hist["seconds"] / max(steps, 1)
    model.eval()
    return hist
