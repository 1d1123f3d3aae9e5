"""Training checkpoints that resume exactly and load with ``torch.load(..., weights_only=True)``.

A checkpoint is a plain dict of state dicts, numbers and strings, never a pickled module::

    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": int, "config": dict,
     "torch_rng": torch.get_rng_state()}

* the **optimizer** state holds Adam's two moment estimates and its step counters: without them the
  resumed run restarts Adam from zero moments and takes different steps;
* the **RNG state** drives dropout: without it the resumed run draws different dropout masks;
* the batches need no state at all when each step draws its batch from a generator seeded with
  ``seed + step`` (:func:`~llmcourse.train.pretraining.train_steps`).

``torch.save(model)`` pickles the class by reference; from torch 2.6 on ``torch.load`` defaults to
``weights_only=True`` and refuses such files, and they break whenever the class moves. State dicts
and plain data load anywhere.
"""

from __future__ import annotations

import os

import torch
from torch import nn

__all__ = ["CHECKPOINT_KEYS", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_KEYS = ("model", "optimizer", "step", "config", "torch_rng")


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, step: int,
                    config: dict) -> None:
    """Write ``{"model", "optimizer", "step", "config", "torch_rng"}`` to ``path`` with ``torch.save``.

    Args:
        path: the file to write (its folder must exist).
        model, optimizer: their ``state_dict()`` is saved.
        step: optimizer steps taken so far, i.e. the ``start_step`` of the run that resumes from here.
        config: plain data (numbers, strings, bools, lists, dicts) describing the run.
    """
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": int(step),
                "config": config, "torch_rng": torch.get_rng_state()}, path)


def load_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore ``model``, ``optimizer`` and torch's CPU RNG from a :func:`save_checkpoint` file.

    Reads with ``torch.load(path, map_location="cpu", weights_only=True)`` (no code runs while loading).

    Returns:
        the saved ``step``.

    Raises:
        KeyError: the file lacks one of the keys above; the errors of ``load_state_dict`` on mismatches.
    """
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    missing = [k for k in CHECKPOINT_KEYS if k not in ckpt]
    if missing:
        raise KeyError(f"checkpoint {path} lacks {missing}; expected the keys {list(CHECKPOINT_KEYS)}")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["torch_rng"])
    return int(ckpt["step"])
