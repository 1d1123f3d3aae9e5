"""Training and evaluation of the unit-06 translation Transformer.

The recipe of the original paper at a tiny scale: Adam (β₁ = 0.9, β₂ = 0.98, ε = 1e-9), the Noam schedule
(:func:`~llmcourse.train.schedules.make_noam_scheduler`) with an **explicit** factor (base lr), and
label-smoothed cross-entropy (:func:`~llmcourse.train.losses.label_smoothed_cross_entropy`, ε = 0.1) that
ignores PAD targets. Losses are **means per target token**, never sums over batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..data.translation import PAD_ID, make_translation_batch, sample_batches
from .decoding import greedy_translate
from .losses import label_smoothed_cross_entropy
from .metrics import chrf
from .schedules import make_noam_scheduler

__all__ = [
    "TRANSLATE_TINY_RECIPE", "evaluate_chrf", "evaluate_loss", "load_translate_tiny", "noam_factor_for_peak",
    "save_translate_tiny", "train_translate_tiny", "train_translation", "translate_tiny_path",
]


def noam_factor_for_peak(peak_lr: float, d_model: int, warmup: int) -> float:
    """The Noam factor whose schedule peaks at ``peak_lr`` (at step ``warmup``): ``peak_lr·√(d_model·warmup)``.

    F06.5: ``noam_factor_for_peak(1e-3, 128, 400) = 0.22627``. The factor is the optimizer's base lr under
    ``make_noam_scheduler``; leaving the usual ``lr=1e-4`` there instead gives a peak lr near 1e-7 (a known bug).
    """
    if peak_lr <= 0 or d_model < 1 or warmup < 1:
        raise ValueError(f"need peak_lr > 0, d_model ≥ 1, warmup ≥ 1; got {peak_lr}, {d_model}, {warmup}")
    return peak_lr * math.sqrt(d_model * warmup)


@torch.no_grad()
def evaluate_loss(model, encoded: Sequence, batch_size: int, max_len: int, label_smoothing: float = 0.0,
                  pad_id: int = PAD_ID) -> float:
    """Mean per-token loss over all of ``encoded`` (in order, eval mode, previous mode restored).

    Sums the token losses of every batch and divides by the number of non-PAD target tokens, so batches
    with more tokens weigh more (a mean of batch means would not).
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(encoded), batch_size):
            src, tgt_in, tgt_out = make_translation_batch(list(encoded[i:i + batch_size]), max_len, pad_id)
            logits = model(src, tgt_in)
            n = int((tgt_out != pad_id).sum())
            total += float(label_smoothed_cross_entropy(logits, tgt_out, label_smoothing, ignore_index=pad_id)) * n
            count += n
    finally:
        model.train(was_training)
    return total / max(count, 1)


def evaluate_chrf(model, pairs: Sequence, src_tok, tgt_tok, max_len: int, batch_size: int = 64,
                  limit: int | None = None) -> tuple[float, list[str]]:
    """Greedy-translate the English side of ``pairs`` and score the Hindi outputs with corpus chrF.

    Returns ``(chrF in [0, 100], hypotheses)``; ``limit`` keeps the first pairs only.
    """
    pairs = list(pairs)[:limit] if limit else list(pairs)
    hyps = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        src, _, _ = make_translation_batch([(src_tok.encode(p.en) or [3], [0]) for p in chunk], max_len)
        out = greedy_translate(model, src, max_len)
        hyps += [tgt_tok.decode(row) for row in out.tolist()]
    return chrf(hyps, [p.hi for p in pairs]), hyps


def train_translation(model, train_encoded: Sequence, steps: int, batch_size: int, max_len: int, warmup: int,
                      factor: float, label_smoothing: float = 0.1, val_encoded: Sequence | None = None,
                      eval_every: int = 50, seed: int = 0, progress: bool = True,
                      callback: Callable[[dict], None] | None = None, pad_id: int = PAD_ID,
                      patience: int | None = None) -> dict:
    """Train ``model`` in place for at most ``steps`` optimizer steps and return the history.

    Batches come from :func:`~llmcourse.data.translation.sample_batches` with
    ``torch.Generator().manual_seed(seed)``. Each step: forward (teacher forcing) -> label-smoothed CE with
    ``ignore_index=pad_id`` -> backward -> Adam(0.9, 0.98, 1e-9) step -> Noam scheduler step.
    Every ``eval_every`` steps (and at the end) the validation loss (plain CE per token) is recorded when
    ``val_encoded`` is given, and ``callback(history)`` is called (the W06.2 monitor).

    Early stopping (``patience`` given, needs ``val_encoded``): the weights with the lowest validation loss
    seen so far are kept (a copy of the state dict); training stops once ``patience`` evaluations in a row
    did not improve on it, or at ``steps``, and the kept weights are loaded back into ``model``.
    ``patience=None`` (default) trains all ``steps`` and keeps the last weights.

    Returns:
        ``{"step": [...], "loss": [...], "lr": [...], "val_step": [...], "val_loss": [...], "seconds": float}``;
        with ``patience`` also ``"best_step"`` and ``"best_val_loss"`` (the weights returned) and
        ``"stopped_step"`` (the last step trained).

    Raises:
        ValueError: ``patience`` given without ``val_encoded``, or ``patience < 1``.
    """
    import copy
    import time

    from tqdm.auto import tqdm

    if patience is not None and (val_encoded is None or patience < 1):
        raise ValueError(f"early stopping needs val_encoded and patience ≥ 1; got patience={patience}, "
                         f"val_encoded={'given' if val_encoded is not None else None}")
    optimizer = torch.optim.Adam(model.parameters(), lr=factor, betas=(0.9, 0.98), eps=1e-9)
    scheduler = make_noam_scheduler(optimizer, model.d_model, warmup, factor)
    batches = sample_batches(train_encoded, batch_size, max_len, torch.Generator().manual_seed(seed))
    hist = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": [], "seconds": 0.0}
    best_state, best_val, best_step, bad_evals = None, math.inf, 0, 0
    model.train()
    start = time.perf_counter()
    bar = tqdm(range(1, steps + 1), desc="training", disable=not progress, mininterval=1.0)
    for step in bar:
        src, tgt_in, tgt_out = next(batches)
        logits = model(src, tgt_in)
        loss = label_smoothed_cross_entropy(logits, tgt_out, label_smoothing, ignore_index=pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        hist["step"].append(step)
        hist["loss"].append(loss.item())
        hist["lr"].append(lr)
        if step % eval_every == 0 or step == steps:
            if val_encoded is not None:
                hist["val_step"].append(step)
                hist["val_loss"].append(evaluate_loss(model, val_encoded, 64, max_len, 0.0, pad_id))
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.2e}")
            if callback is not None:
                callback(hist)
            if patience is not None:
                if hist["val_loss"][-1] < best_val:
                    best_val, best_step, bad_evals = hist["val_loss"][-1], step, 0
                    best_state = copy.deepcopy(model.state_dict())
                else:
                    bad_evals += 1
                    if bad_evals >= patience:
                        break
    hist["seconds"] = time.perf_counter() - start
    if patience is not None:
        model.load_state_dict(best_state)
        hist.update(best_step=best_step, best_val_loss=best_val, stopped_step=hist["step"][-1])
    model.eval()
    return hist


# ------------------------------------------------------------------ the shipped checkpoint

TRANSLATE_TINY_RECIPE = dict(num_merges=2000, d_model=128, num_heads=4, d_ff=512, n_enc=2, n_dec=2, max_len=32,
                             dropout=0.1, steps=2500, batch_size=64, warmup=400, peak_lr=1e-3,
                             label_smoothing=0.1, seed=0, eval_every=100, patience=5)


def translate_tiny_path():
    """``assets/translate_tiny.pt``: the model of :func:`train_translate_tiny` (weights stored in float16)."""
    from pathlib import Path

    return Path(__file__).resolve().parents[2] / "assets" / "translate_tiny.pt"


def train_translate_tiny(save: bool = False, progress: bool = True, **overrides) -> tuple:
    """Train the course's tiny EN→HI model with :data:`TRANSLATE_TINY_RECIPE` (the laptop recipe of the syllabus).

    Seeds ``torch.manual_seed(seed)`` before building the model; batches use ``Generator().manual_seed(seed)``.
    Early-stopped on the validation split: the validation loss is measured every ``eval_every`` steps, the
    best weights are kept, and training stops after ``patience`` evaluations without improvement (or at
    ``steps``). ``save=True`` writes ``assets/translate_tiny.pt`` (float16 weights, < 5 MB) with the config,
    the recipe, the history, ``"best_step"`` / ``"best_val_loss"`` / ``"stopped_step"`` (the chosen weights and
    where training stopped) and the validation chrF of the chosen weights. Returns ``(model, history, val_chrf)``.
    About 5–20 minutes on 2 CPU cores.
    """
    from ..data.translation import encode_pairs, load_tatoeba_tokenizers, load_translation_pairs, split_pairs
    from ..models.transformer import Transformer

    r = {**TRANSLATE_TINY_RECIPE, **overrides}
    en_tok, hi_tok = load_tatoeba_tokenizers(r["num_merges"])
    train, val, _ = split_pairs(load_translation_pairs())
    torch.manual_seed(r["seed"])
    model = Transformer(en_tok.vocab_size, hi_tok.vocab_size, r["d_model"], r["num_heads"], r["d_ff"], r["n_enc"],
                        r["n_dec"], r["max_len"], r["dropout"])
    hist = train_translation(model, encode_pairs(train, en_tok, hi_tok), r["steps"], r["batch_size"], r["max_len"],
                             r["warmup"], noam_factor_for_peak(r["peak_lr"], r["d_model"], r["warmup"]),
                             r["label_smoothing"], encode_pairs(val, en_tok, hi_tok), eval_every=r["eval_every"],
                             seed=r["seed"], progress=progress, patience=r["patience"])
    score, _ = evaluate_chrf(model, val, en_tok, hi_tok, r["max_len"])
    if save:
        save_translate_tiny(model, hist, r, score)
    return model, hist, score


def save_translate_tiny(model, history: dict, recipe: dict, val_chrf: float, path=None):
    """Write the checkpoint format of ``assets/translate_tiny.pt`` (``path`` defaults to it).

    Keys: ``model`` (state dict, floating tensors in float16), ``config``, ``recipe``, ``val_chrf``,
    ``best_step`` / ``best_val_loss`` / ``stopped_step`` (from an early-stopped ``history``; ``None``
    otherwise), ``history`` (per-step and per-evaluation lists) and ``seconds``. Returns the path.
    """
    path = translate_tiny_path() if path is None else path
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    keep = ("step", "loss", "lr", "val_step", "val_loss")
    torch.save({"model": state, "config": model.config, "recipe": dict(recipe), "val_chrf": val_chrf,
                "best_step": history.get("best_step"), "best_val_loss": history.get("best_val_loss"),
                "stopped_step": history.get("stopped_step"),
                "history": {k: history[k] for k in keep}, "seconds": history["seconds"]}, path)
    return path


def load_translate_tiny(path=None):
    """The shipped model (eval mode, float32) and its checkpoint dict, or ``None`` if the asset is missing."""
    from ..models.transformer import Transformer

    path = translate_tiny_path() if path is None else path
    if not path.exists():
        return None
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = Transformer(**ckpt["config"])
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ckpt["model"].items()})
    return model.eval(), ckpt


if __name__ == "__main__":  # python -m llmcourse.train.seq2seq  (re-creates assets/translate_tiny.pt)
    _, _h, _s = train_translate_tiny(save=True)
    print(f"kept step {_h['best_step']} (val loss {_h['best_val_loss']:.4f}), stopped at {_h['stopped_step']}; "
          f"val chrF {_s:.2f} after {_h['seconds']:.0f} s")
