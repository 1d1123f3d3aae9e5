"""Bug catalog of unit 10 (pretraining): one known-wrong implementation per syllabus entry.

Each mutant is the reference (``llmcourse.data.corpus``, ``llmcourse.train.{losses,schedules,optim,
checkpoints,pretraining}``) with exactly one mistake. ``detect="mutant"`` entries are named by matching the
learner's output on the failing probe; ``detect="detector"`` entries by a property the check computes
from returned tensors (targets shifted, update length under clipping, gradients not accumulated,
checkpoint contents and exact resumption, the mode after evaluation).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from llmcourse.data.corpus import get_batch
from llmcourse.train.losses import lm_loss
from llmcourse.train.optim import clip_grad_norm

from ..core import bug_group

U = "10"

# ---------------------------------------------------------------- get_batch


def _get_batch_plus_one(data, batch_size, context_length, generator):
    offsets = torch.randint(0, len(data) - context_length + 1, (batch_size,), generator=generator)
    x = torch.stack([data[o:o + context_length] for o in offsets.tolist()]).long()
    y = torch.stack([data[o + 1:o + context_length + 1] for o in offsets.tolist()]).long()
    return x, y


def _get_batch_unshifted(data, batch_size, context_length, generator):
    offsets = torch.randint(0, len(data) - context_length, (batch_size,), generator=generator)
    x = torch.stack([data[o:o + context_length] for o in offsets.tolist()]).long()
    return x, x.clone()


bug_group("B10.randint_call", f"{U}.get_batch",
          "Use exactly `torch.randint(0, len(data) − T, (B,), generator=g)`.", {"get_batch": _get_batch_plus_one})
bug_group("B10.target_not_shifted", f"{U}.get_batch", "Targets are the inputs shifted by one.",
          {"get_batch": _get_batch_unshifted}, detect="detector")

# ---------------------------------------------------------------- lm_loss


def _loss_unflattened(logits, targets, ignore_index=-100):
    return F.cross_entropy(logits, targets, ignore_index=ignore_index)


bug_group("B10.loss_unflattened", f"{U}.lm_loss",
          "Flatten to `(B·T, V)` and `(B·T,)`; for 3-D inputs PyTorch treats dim 1 as classes.",
          {"lm_loss": _loss_unflattened})

# ---------------------------------------------------------------- warmup_cosine_lr


def _schedule(variant):
    def warmup_cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps):
        if step < warmup_steps:
            return max_lr * (step if variant == "warmup_from_zero" else step + 1) / warmup_steps
        if step > total_steps and variant != "cosine_rises":
            return min_lr
        floor = 0.0 if variant == "cosine_to_zero" else min_lr
        if variant == "decay_from_step_zero":
            progress = step / total_steps
        else:
            progress = (step - warmup_steps) / (total_steps - warmup_steps)
        if variant == "linear_decay":
            return max_lr - (max_lr - floor) * progress
        return floor + 0.5 * (max_lr - floor) * (1 + math.cos(math.pi * progress))
    return warmup_cosine_lr


bug_group("B10.warmup_from_zero", f"{U}.warmup_cosine_lr", "The course schedule starts at `max_lr/warmup`.",
          {"warmup_cosine_lr": _schedule("warmup_from_zero")})
bug_group("B10.cosine_to_zero", f"{U}.warmup_cosine_lr", "Decay to the floor `min_lr`.",
          {"warmup_cosine_lr": _schedule("cosine_to_zero")})
bug_group("B10.linear_decay", f"{U}.warmup_cosine_lr",
          "The decay is flat at both ends and symmetric about its midpoint: not a straight line.",
          {"warmup_cosine_lr": _schedule("linear_decay")})
bug_group("B10.decay_from_step_zero", f"{U}.warmup_cosine_lr",
          "The decay starts where the warm-up ends: measure its progress from `warmup_steps`, not from step 0.",
          {"warmup_cosine_lr": _schedule("decay_from_step_zero")})
bug_group("B10.cosine_rises", f"{U}.warmup_cosine_lr", "Hold `min_lr` after `total_steps`.",
          {"warmup_cosine_lr": _schedule("cosine_rises")})

# ---------------------------------------------------------------- clip_grad_norm


@torch.no_grad()
def _clip_per_param(parameters, max_norm, eps=1e-6):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads))) if grads else 0.0
    for g in grads:
        n = float(g.norm())
        if n > max_norm:
            g.mul_(max_norm / (n + eps))
    return total


bug_group("B10.clip_per_param", f"{U}.clip_grad_norm", "Clip by the **global** norm over all gradients.",
          {"clip_grad_norm": _clip_per_param})

# ---------------------------------------------------------------- configure_optimizer


def _decay_everything(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": weight_decay}],
                             lr=lr, betas=betas)


def _tied_in_two_groups(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):
    # groups by module kind: the tied tensor is both an Embedding weight and a Linear (lm_head) weight
    emb, lin, rest = [], [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if p.dim() < 2:
                rest.append(p)
            elif isinstance(module, torch.nn.Embedding):
                emb.append(p)
            else:
                lin.append(p)
    return torch.optim.AdamW([{"params": emb, "weight_decay": weight_decay},
                              {"params": lin, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=betas)


def _decay_by_name(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):
    # "weights get decay, biases do not": LayerNorm gains are called weight too
    named = list(model.named_parameters())
    return torch.optim.AdamW([{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": weight_decay},
                              {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0}],
                             lr=lr, betas=betas)


bug_group("B10.decay_by_name", f"{U}.configure_optimizer",
          "A LayerNorm gain is named `weight` but acts on each feature alone: decide by what a tensor does "
          "(its number of dimensions), not by its name.", {"configure_optimizer": _decay_by_name}, detect="detector")
bug_group("B10.decay_everything", f"{U}.configure_optimizer", "Only matrices (ndim ≥ 2) get weight decay.",
          {"configure_optimizer": _decay_everything})
bug_group("B10.tied_in_two_groups", f"{U}.configure_optimizer",
          "Deduplicate parameters (tied weights are one tensor).", {"configure_optimizer": _tied_in_two_groups})

# ---------------------------------------------------------------- train_steps, checkpoints, estimate_loss


def _train_steps(variant):
    def train_steps(model, optimizer, data, n_steps, start_step, batch_size, context_length, lr_fn, max_norm, seed):
        if variant != "no_train_mode":
            model.train()
        losses = []
        if variant == "no_zero_grad":
            optimizer.zero_grad()
        for s in range(start_step, start_step + n_steps):
            x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
            for group in optimizer.param_groups:
                group["lr"] = lr_fn(s)
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            loss = lm_loss(model(x), y)
            loss.backward()
            if variant == "clip_after_step":
                optimizer.step()
                clip_grad_norm(model.parameters(), max_norm)
            else:
                clip_grad_norm(model.parameters(), max_norm)
                optimizer.step()
            losses.append(loss.item())
        return losses
    return train_steps


bug_group("B10.clip_after_step", f"{U}.train_steps", "Clip between `backward()` and `step()`.",
          {"train_steps": _train_steps("clip_after_step")}, detect="detector")
bug_group("B10.no_zero_grad", f"{U}.train_steps", "Call `optimizer.zero_grad()` every step.",
          {"train_steps": _train_steps("no_zero_grad")}, detect="detector")
bug_group("B10.no_train_mode", f"{U}.train_steps",
          "A model may arrive in eval mode (after an evaluation): training switches dropout on with `train()`.",
          {"train_steps": _train_steps("no_train_mode")}, detect="detector")


def _save_model_only(path, model, optimizer, step, config):
    torch.save({"model": model.state_dict(), "step": step, "config": config, "torch_rng": torch.get_rng_state()},
               path)


def _load_model_only(path, model, optimizer):
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    torch.set_rng_state(ckpt["torch_rng"])
    return ckpt["step"]


def _save_no_rng(path, model, optimizer, step, config):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "config": config},
               path)


def _load_no_rng(path, model, optimizer):
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt["step"]


bug_group("B10.ckpt_no_optimizer", f"{U}.train_steps", "Adam's moments must be restored too.",
          {"save_checkpoint": _save_model_only, "load_checkpoint": _load_model_only}, detect="detector")
bug_group("B10.ckpt_no_rng", f"{U}.train_steps", "Save and restore `torch.get_rng_state()`.",
          {"save_checkpoint": _save_no_rng, "load_checkpoint": _load_no_rng}, detect="detector")


@torch.no_grad()
def _estimate_loss_stays_eval(model, data, batch_size, context_length, n_batches, seed=0):
    model.eval()
    total = 0.0
    for i in range(n_batches):
        x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + i))
        total += lm_loss(model(x), y).item()
    return total / n_batches


bug_group("B10.eval_not_restored", f"{U}.train_steps", "Restore `train()` after evaluating.",
          {"estimate_loss": _estimate_loss_stays_eval}, detect="detector")


def _estimate_loss_variant(variant):
    def estimate_loss(model, data, batch_size, context_length, n_batches, seed=0):
        was_training = model.training
        if variant != "train_mode":
            model.eval()
        total = 0.0
        with torch.set_grad_enabled(variant == "with_grad"):
            for i in range(n_batches):
                x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + i))
                total += lm_loss(model(x), y).item()
        model.train(was_training)
        return total / n_batches
    return estimate_loss


bug_group("B10.eval_in_train_mode", f"{U}.train_steps", "Evaluate in `eval()` mode: dropout off.",
          {"estimate_loss": _estimate_loss_variant("train_mode")}, detect="detector")
bug_group("B10.eval_with_grad", f"{U}.train_steps", "Evaluate under `torch.no_grad()`: no graph is needed.",
          {"estimate_loss": _estimate_loss_variant("with_grad")}, detect="detector")
