"""The course's trained character-level MTP model (``assets/mtp_char_tiny.pt``), its trainer and the
with/without-MTP comparison of unit 15.

``llama3-tiny`` (unit 11, 795,904 parameters) with one MTP module (unit 15, 230,016 parameters: about 1.03M
in all), context **128**, trained on the first 90 % of tinyshakespeare with the loss
``L_main + λ·L_1`` (λ = 0.3, D = 1) by :func:`train_mtp`, unit 10's loop with the MTP loss: AdamW with
parameter groups, warm-up + cosine, gradient clipping, batch ``s`` drawn with
``get_batch(…, torch.Generator().manual_seed(seed + s))``. Re-create it with::

    python -m llmcourse.train.mtp_char          # a few minutes on an idle 2-core CPU

The file holds plain data only (``torch.load(..., weights_only=True)``), no optimizer state::

    {"model": state_dict (float32), "config": Llama3Config fields + "mtp_depth", "mtp_lambda",
     "tokenizer": {"kind": "char", "chars": …}, "recipe": …, "val_loss": float (main path),
     "val_loss_mtp": float (depth 1), "train_loss": float, "seconds": float, "samples": [(step, text), ...]}

:func:`load_mtp_char_tiny` reads it (unit 15's speculative-decoding demo and widget, its grader); when the file
is missing it trains a small substitute (context 64, 300 steps; about a minute) and says so.

:func:`compare_mtp` trains the same trunk with and without the MTP module (``mtp_depth`` 1 vs 0, the same
seed, hence the same initial trunk weights, and the same batches): an equal token budget for the main model.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["MTP_CHAR_TINY_RECIPE", "compare_mtp", "load_mtp_char_tiny", "mtp_char_tiny_path", "train_mtp",
           "train_mtp_char_tiny"]

MTP_CHAR_TINY_RECIPE = dict(preset="llama3-tiny", context_length=128, steps=500, batch_size=32, max_lr=3e-3,
                            min_lr=3e-4, warmup_steps=30, weight_decay=0.1, max_norm=1.0, seed=0, eval_every=125,
                            eval_batches=10, mtp_depth=1, mtp_lambda=0.3)
SUBSTITUTE_RECIPE = dict(MTP_CHAR_TINY_RECIPE, context_length=64, steps=300, warmup_steps=30, eval_every=100)


def mtp_char_tiny_path() -> Path:
    """``<course>/assets/mtp_char_tiny.pt``."""
    return Path(__file__).resolve().parents[2] / "assets" / "mtp_char_tiny.pt"


def _build(config: dict):
    from ..models.llama3 import Llama3Config
    from ..models.mtp import MTPLanguageModel

    c = dict(config)
    depth, lam = c.pop("mtp_depth", 1), c.pop("mtp_lambda", 0.3)
    return MTPLanguageModel(Llama3Config(**c), mtp_depth=depth, mtp_lambda=lam)


@torch.no_grad()
def _estimate(model, data: Tensor, batch_size: int, context_length: int, n_batches: int, seed: int) -> tuple:
    """(main loss, depth-1 loss or nan) over fixed batches, eval mode, mode restored."""
    from ..data.corpus import get_batch

    was = model.training
    model.eval()
    try:
        main = mtp = 0.0
        for i in range(n_batches):
            x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + i))
            out = model(x, y)
            main += out["loss_main"].item()
            mtp += out["loss_mtp"][0].item() if out["loss_mtp"] else math.nan
        return main / n_batches, mtp / n_batches
    finally:
        model.train(was)


def train_mtp(model, train_data: Tensor, val_data: Tensor, *, steps: int, batch_size: int, context_length: int,
              max_lr: float, min_lr: float, warmup_steps: int, weight_decay: float = 0.1, max_norm: float = 1.0,
              seed: int = 0, eval_every: int = 100, eval_batches: int = 10, sample_fn=None, progress: bool = True,
              desc: str = "training") -> dict:
    """Train an :class:`~llmcourse.models.mtp.MTPLanguageModel` in place on ``model(x, y)["loss"]``.

    Unit 10's recipe (:func:`~llmcourse.train.pretraining.pretrain`) with the MTP loss: AdamW
    (:func:`~llmcourse.train.optim.configure_optimizer`), ``warmup_cosine_lr``, clipping at ``max_norm``; batch
    ``s`` from ``get_batch(train_data, B, T, torch.Generator().manual_seed(seed + s))``, so two models trained with
    the same ``seed`` see identical batches. Evaluation (main-path and depth-1 losses on ``eval_batches`` fixed
    batches, ``EVAL_SEED``) before the first step, every ``eval_every`` steps and after the last.

    Returns:
        dict with per-step lists ``step``, ``loss`` (the total), ``loss_main``, ``loss_mtp`` (depth 1, nan without
        MTP), ``lr``; per-evaluation lists ``eval_step``, ``train_loss_eval``, ``val_loss`` (main path),
        ``val_loss_mtp``; ``samples``; ``seconds`` (training time without evaluation), ``ms_per_step``,
        ``tokens_per_step``.
    """
    from tqdm.auto import tqdm

    from ..data.corpus import get_batch
    from .optim import clip_grad_norm, configure_optimizer
    from .pretraining import EVAL_SEED
    from .schedules import warmup_cosine_lr

    optimizer = configure_optimizer(model, max_lr, weight_decay)
    hist = {"step": [], "loss": [], "loss_main": [], "loss_mtp": [], "lr": [], "eval_step": [],
            "train_loss_eval": [], "val_loss": [], "val_loss_mtp": [], "samples": [], "seconds": 0.0,
            "ms_per_step": math.nan, "tokens_per_step": batch_size * context_length}

    def evaluate(done):
        hist["eval_step"].append(done)
        hist["train_loss_eval"].append(_estimate(model, train_data, batch_size, context_length, eval_batches,
                                                 EVAL_SEED)[0])
        main, mtp = _estimate(model, val_data, batch_size, context_length, eval_batches, EVAL_SEED)
        hist["val_loss"].append(main)
        hist["val_loss_mtp"].append(mtp)
        if sample_fn is not None:
            hist["samples"].append((done, sample_fn(model)))

    evaluate(0)
    model.train()
    bar = tqdm(range(steps), desc=desc, disable=not progress, mininterval=1.0)
    for s in bar:
        t0 = time.perf_counter()
        x, y = get_batch(train_data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
        lr = warmup_cosine_lr(s, max_lr, min_lr, warmup_steps, steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        out = model(x, y)
        out["loss"].backward()
        clip_grad_norm(model.parameters(), max_norm)
        optimizer.step()
        hist["seconds"] += time.perf_counter() - t0
        done = s + 1
        hist["step"].append(done)
        hist["loss"].append(out["loss"].item())
        hist["loss_main"].append(out["loss_main"].item())
        hist["loss_mtp"].append(out["loss_mtp"][0].item() if out["loss_mtp"] else math.nan)
        hist["lr"].append(lr)
        if done % eval_every == 0 or done == steps:
            evaluate(done)
            model.train()
            bar.set_postfix(main=f"{hist['loss_main'][-1]:.3f}", val=f"{hist['val_loss'][-1]:.3f}")
    hist["ms_per_step"] = 1000 * hist["seconds"] / max(steps, 1)
    model.eval()
    return hist


def _sample(model, tok, prompt: str = "ROMEO:", n: int = 120) -> str:
    from .pretraining import sample_text

    return sample_text(model.model, tok, prompt, n, temperature=0.8, seed=0,
                       context_length=model.cfg.context_length)


def train_mtp_char_tiny(save: bool = False, progress: bool = True, path: str | Path | None = None,
                        **overrides) -> tuple:
    """Train the character MTP model with :data:`MTP_CHAR_TINY_RECIPE` (updated by ``overrides``).

    Seeds ``torch.manual_seed(seed)`` before building the model (trunk first, then the MTP module),
    trains with :func:`train_mtp` on tinyshakespeare's characters and, with ``save=True``, writes the asset.

    Returns:
        ``(model, tokenizer, history)``; the model in eval mode.
    """
    from ..data.corpus import char_corpus
    from ..models.llama3 import Llama3Config

    r = {**MTP_CHAR_TINY_RECIPE, **overrides}
    corpus = char_corpus("tinyshakespeare")
    cfg = Llama3Config.preset(r["preset"])
    cfg.context_length, cfg.vocab_size = r["context_length"], corpus.vocab_size
    config = cfg.to_dict() | {"mtp_depth": r["mtp_depth"], "mtp_lambda": r["mtp_lambda"]}
    torch.manual_seed(r["seed"])
    model = _build(config)
    tok = corpus.tokenizer
    hist = train_mtp(model, corpus.train, corpus.val, steps=r["steps"], batch_size=r["batch_size"],
                     context_length=r["context_length"], max_lr=r["max_lr"], min_lr=r["min_lr"],
                     warmup_steps=r["warmup_steps"], weight_decay=r["weight_decay"], max_norm=r["max_norm"],
                     seed=r["seed"], eval_every=r["eval_every"], eval_batches=r["eval_batches"],
                     sample_fn=lambda m: _sample(m, tok), progress=progress)
    if save:
        out = Path(path) if path else mtp_char_tiny_path()
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": {k: v.detach().clone() for k, v in model.state_dict().items()}, "config": config,
                    "tokenizer": {"kind": "char", "chars": "".join(tok.chars)}, "recipe": r,
                    "val_loss": hist["val_loss"][-1], "val_loss_mtp": hist["val_loss_mtp"][-1],
                    "train_loss": hist["train_loss_eval"][-1], "seconds": hist["seconds"],
                    "samples": hist["samples"]}, out)
    return model.eval(), tok, hist


def load_mtp_char_tiny(path: str | Path | None = None, retrain: bool = True, verbose: bool = True) -> tuple:
    """The course's trained character MTP model and its tokenizer: ``(model, tokenizer)``, model in eval mode.

    Reads ``assets/mtp_char_tiny.pt`` (or ``path``) with ``weights_only=True`` and builds an
    :class:`~llmcourse.models.mtp.MTPLanguageModel` from the stored config (context 128, one MTP module);
    ``model.checkpoint_info`` holds the recipe, the losses and ``substitute``. A missing file with ``retrain``
    trains a substitute (context 64, 300 steps) and says so; with ``retrain=False`` a ``FileNotFoundError``
    names the command that re-creates the asset.
    """
    from .char_model import load_char_lm

    p = Path(path) if path else mtp_char_tiny_path()
    return load_char_lm(p, _build, train_mtp_char_tiny, SUBSTITUTE_RECIPE, "python -m llmcourse.train.mtp_char",
                        retrain, verbose)


def compare_mtp(steps: int, batch_size: int, context_length: int, max_lr: float = 3e-3, min_lr: float = 3e-4,
                warmup_steps: int = 30, eval_every: int = 50, eval_batches: int = 5, seed: int = 0,
                mtp_lambda: float = 0.3, preset: str = "llama3-tiny", progress: bool = True) -> dict:
    """Train ``preset`` twice on identical batches: with one MTP module (``L_main + λ·L_1``) and without
    (``mtp_depth = 0``, ``L_main``). The trunk starts from the same weights in both (same seed; the trunk is built
    before the MTP module). Returns ``{"mtp": history, "plain": history}`` (:func:`train_mtp` histories); the
    main validation losses are comparable: same batches, same main-model token budget."""
    from ..data.corpus import char_corpus
    from ..models.llama3 import Llama3Config

    corpus = char_corpus("tinyshakespeare")
    cfg = Llama3Config.preset(preset)
    cfg.context_length, cfg.vocab_size = context_length, corpus.vocab_size
    out = {}
    for name, depth in (("plain", 0), ("mtp", 1)):
        torch.manual_seed(seed)
        model = _build(cfg.to_dict() | {"mtp_depth": depth, "mtp_lambda": mtp_lambda})
        out[name] = train_mtp(model, corpus.train, corpus.val, steps=steps, batch_size=batch_size,
                              context_length=context_length, max_lr=max_lr, min_lr=min_lr,
                              warmup_steps=warmup_steps, seed=seed, eval_every=eval_every,
                              eval_batches=eval_batches, progress=progress,
                              desc="with MTP" if depth else "without MTP")
    return out


if __name__ == "__main__":  # python -m llmcourse.train.mtp_char   (re-creates assets/mtp_char_tiny.pt)
    import os

    torch.set_num_threads(int(os.environ.get("LLMCOURSE_THREADS", "2")))
    from .char_model import report_char_lm

    _model, _tok, _hist = train_mtp_char_tiny(save=True)
    report_char_lm(_hist, mtp_char_tiny_path())
    print(f"depth-1 validation loss {_hist['val_loss_mtp'][-1]:.4f}")
