"""The course's trained character-level DeepSeek (``assets/deepseek_char_tiny.pt``) and the pipeline that makes it.

DeepSeek-tiny (unit 17: :class:`~llmcourse.models.deepseek.DeepSeekConfig` defaults — V 65, D 128, 4 layers with a
dense first layer and 3 MoE layers of 8 routed + 1 shared expert, k 2, MLA d_c 64 / d_R 16, one MTP module) trained
on the first 90 % of tinyshakespeare with :func:`~llmcourse.models.deepseek.train_step` (MTP loss, clipping, AdamW,
router-bias update after every step) on the seeded batches of unit 10 (``get_batch`` with generator ``seed + step``)
and unit 10's warm-up + cosine schedule, with :data:`DEEPSEEK_CHAR_TINY_RECIPE`. Re-create it with::

    python -m llmcourse.train.deepseek_char        # several minutes on an idle 2-core CPU
    python -m llmcourse.train.deepseek_char sample # only regenerate the stored sample (weights unchanged)

The file holds plain data only (``torch.load(..., weights_only=True)``), weights in **float16** (float32 would be
about 8 MB)::

    {"model": state_dict (float16; router biases float32), "config": DeepSeekConfig fields,
     "tokenizer": {"kind": "char", "chars": ...}, "recipe": ..., "val_loss": float (of the float16-stored weights),
     "train_loss": float, "seconds": float, "ms_per_step": float, "history": {"step", "loss", "loss_main",
     "loss_mtp", "max_mean_load"} (every 10th step), "fp8": fp8_eval of the stored weights (recipe batches),
     "fp8_check": the same on the grader's 3 batches, "sample": str (:func:`asset_sample`: greedy, after
     "ROMEO:", inside the trained window)}

:func:`load_deepseek_char_tiny` builds the model in float32 from it; when the asset is missing it trains a small
substitute (:data:`SUBSTITUTE_RECIPE`, 150 steps) and says so.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

__all__ = ["DEEPSEEK_CHAR_TINY_RECIPE", "FP8_CHECK_BATCHES", "SAMPLE_PROMPT", "SAMPLE_TOKENS", "SUBSTITUTE_RECIPE",
           "asset_sample", "calibrate_fp8_check", "deepseek_char_tiny_path", "load_deepseek_char_tiny", "refresh_sample",
           "train_deepseek_char_tiny"]

DEEPSEEK_CHAR_TINY_RECIPE = dict(steps=800, batch_size=32, context_length=64, max_lr=3e-3, min_lr=3e-4,
                                 warmup_steps=30, weight_decay=0.1, max_norm=1.0, seed=0, eval_batches=20,
                                 eval_seed=10_000, fp8_batches=10)
SUBSTITUTE_RECIPE = dict(DEEPSEEK_CHAR_TINY_RECIPE, steps=150, eval_batches=10)
FP8_CHECK_BATCHES = 3   # the grader's fp8 check: fp8_eval(model, val, 3, 10_000) with B 32, T 64
SAMPLE_PROMPT = "ROMEO:"
SAMPLE_TOKENS = 100     # greedy tokens of the stored sample, cut to the trained window (prompt + tokens <= T)


def asset_sample(model, tok, context_length: int, prompt: str = SAMPLE_PROMPT, max_tokens: int = SAMPLE_TOKENS) -> str:
    """The asset's stored sample: greedy latent-cached decoding after ``prompt`` of
    ``min(max_tokens, context_length − len(prompt))`` tokens, so prompt + sample stay inside the trained window of
    ``context_length`` tokens (positions beyond it never occurred in training). Returns the new text only."""
    from ..models.deepseek import generate_latent_cached

    ids = torch.tensor([tok.encode(prompt)])
    n = min(max_tokens, context_length - ids.shape[1])
    if n < 1:
        raise ValueError(f"prompt of {ids.shape[1]} tokens leaves no room in a {context_length}-token window")
    with torch.no_grad():
        out = generate_latent_cached(model, ids, n)[0]
    return tok.decode(out[0, ids.shape[1]:].tolist())


def refresh_sample(path: str | Path | None = None) -> str:
    """Regenerate ``"sample"`` of an existing asset with :func:`asset_sample` at its recipe's context length and
    save it; the weights and every other entry are written back unchanged (bit-identical tensors). Returns it."""
    p = Path(path) if path else deepseek_char_tiny_path()
    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    model, tok = load_deepseek_char_tiny(p, retrain=False, verbose=False)
    ckpt["sample"] = asset_sample(model, tok, ckpt["recipe"]["context_length"])
    torch.save(ckpt, p)
    return ckpt["sample"]


def calibrate_fp8_check(path: str | Path | None = None) -> dict:
    """Add ``"fp8_check"`` (``fp8_eval`` of the stored weights on :data:`FP8_CHECK_BATCHES` validation batches,
    generator seed 10,000, B 32, T 64: the grader's calibration) to an existing asset; returns it."""
    from ..data.corpus import char_corpus
    from ..models.deepseek import fp8_eval

    p = Path(path) if path else deepseek_char_tiny_path()
    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    model, _ = load_deepseek_char_tiny(p, retrain=False, verbose=False)
    ckpt["fp8_check"] = fp8_eval(model, char_corpus("tinyshakespeare").val, FP8_CHECK_BATCHES, 10_000)
    torch.save(ckpt, p)
    return ckpt["fp8_check"]


def deepseek_char_tiny_path() -> Path:
    """``<course>/assets/deepseek_char_tiny.pt``."""
    return Path(__file__).resolve().parents[2] / "assets" / "deepseek_char_tiny.pt"


def train_deepseek_char_tiny(save: bool = False, progress: bool = True, path: str | Path | None = None,
                             **overrides) -> tuple:
    """Train DeepSeek-tiny with :data:`DEEPSEEK_CHAR_TINY_RECIPE` (updated by ``overrides``).

    ``torch.manual_seed(seed)`` before building the model; AdamW with unit 10's two parameter groups (the router
    biases are buffers, in no group); step ``s`` uses ``get_batch(train, B, T, Generator(seed + s))`` and
    ``warmup_cosine_lr(s, …)``. ``save=True`` writes the asset (weights rounded to float16; the stored validation
    loss and the FP8 delta are measured on those rounded weights). Returns ``(model, tokenizer, info)``, the model
    in eval mode with the weights as stored.
    """
    from ..data.corpus import char_corpus, get_batch
    from ..models.deepseek import (
        DeepSeekConfig,
        DeepSeekLM,
        _val_loss,
        fp8_eval,
        train_step,
    )
    from .optim import configure_optimizer
    from .schedules import warmup_cosine_lr

    r = {**DEEPSEEK_CHAR_TINY_RECIPE, **overrides}
    corpus = char_corpus("tinyshakespeare")
    tok = corpus.tokenizer
    cfg = DeepSeekConfig(vocab_size=corpus.vocab_size)
    torch.manual_seed(r["seed"])
    model = DeepSeekLM(cfg)
    opt = configure_optimizer(model, r["max_lr"], weight_decay=r["weight_decay"])
    hist = {"step": [], "loss": [], "loss_main": [], "loss_mtp": [], "max_mean_load": []}
    it = range(r["steps"])
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="deepseek-tiny")
    t0 = time.perf_counter()
    for s in it:
        x, y = get_batch(corpus.train, r["batch_size"], r["context_length"], torch.Generator().manual_seed(r["seed"] + s))
        for g in opt.param_groups:
            g["lr"] = warmup_cosine_lr(s, r["max_lr"], r["min_lr"], r["warmup_steps"], r["steps"])
        rec = train_step(model, opt, x, y, r["max_norm"])
        if s % 10 == 0 or s == r["steps"] - 1:
            loads = torch.stack(rec["expert_load"]).float()
            hist["step"].append(s)
            hist["loss"].append(rec["loss"])
            hist["loss_main"].append(rec["loss_main"])
            hist["loss_mtp"].append(rec["loss_mtp"][0] if rec["loss_mtp"] else float("nan"))
            hist["max_mean_load"].append(float((loads.max(1).values / loads.mean(1)).mean()))
    seconds = time.perf_counter() - t0
    # round to the stored precision first, so every stored number describes the stored weights
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    model.eval()
    val = _val_loss(model, corpus.val, r["batch_size"], r["context_length"], r["eval_batches"], r["eval_seed"])
    train = _val_loss(model, corpus.train, r["batch_size"], r["context_length"], r["eval_batches"], r["eval_seed"])
    fp8 = fp8_eval(model, corpus.val, r["fp8_batches"], r["eval_seed"], batch_size=r["batch_size"],
                   context_length=r["context_length"])
    fp8_check = fp8_eval(model, corpus.val, FP8_CHECK_BATCHES, r["eval_seed"])
    sample = asset_sample(model, tok, r["context_length"])   # stays inside the trained window
    info = {"config": cfg.to_dict(), "recipe": r, "val_loss": val, "train_loss": train, "seconds": seconds,
            "ms_per_step": 1000 * seconds / max(r["steps"], 1), "history": hist, "fp8": fp8, "fp8_check": fp8_check,
            "sample": sample}
    if save:
        out = Path(path) if path else deepseek_char_tiny_path()
        out.parent.mkdir(parents=True, exist_ok=True)
        sd = {k: (v.detach().half() if v.is_floating_point() and "e_score_correction_bias" not in k else v.detach())
              .clone() for k, v in model.state_dict().items()}
        torch.save({"model": sd, "tokenizer": {"kind": "char", "chars": "".join(tok.chars)}, **info}, out)
    return model, tok, info


def load_deepseek_char_tiny(path: str | Path | None = None, retrain: bool = True, verbose: bool = True) -> tuple:
    """The course's trained character DeepSeek and its tokenizer: ``(model, tokenizer)``, model in eval mode,
    float32 (built from the stored config; the float16 weights are widened). ``model.checkpoint_info`` holds the
    recipe, losses, history, the FP8 calibration and ``substitute``.

    When the file does not exist and ``retrain`` is true, a substitute is trained with :data:`SUBSTITUTE_RECIPE`
    (150 steps) and a message says so; with ``retrain=False`` a ``FileNotFoundError`` names the command."""
    from ..data.tokenizers import CharTokenizer
    from ..models.deepseek import DeepSeekConfig, DeepSeekLM

    p = Path(path) if path else deepseek_char_tiny_path()
    command = "python -m llmcourse.train.deepseek_char"
    if not p.exists():
        if not retrain:
            raise FileNotFoundError(f"{p} is missing; re-create it with `{command}`")
        if verbose:
            print(f"{p.name} not found: training a small substitute instead ({SUBSTITUTE_RECIPE['steps']} steps). "
                  f"Re-create the real asset with `{command}`.")
        model, tok, info = train_deepseek_char_tiny(progress=verbose, **SUBSTITUTE_RECIPE)
        model.checkpoint_info = dict(info, substitute=True)
        return model, tok
    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    model = DeepSeekLM(DeepSeekConfig(**ckpt["config"]))
    model.load_state_dict({k: v.float() for k, v in ckpt["model"].items()})
    model.checkpoint_info = {k: v for k, v in ckpt.items() if k != "model"} | {"substitute": False}
    return model.eval(), CharTokenizer(list(ckpt["tokenizer"]["chars"]))


if __name__ == "__main__":  # python -m llmcourse.train.deepseek_char   (re-creates assets/deepseek_char_tiny.pt)
    import os
    import sys

    torch.set_num_threads(int(os.environ.get("LLMCOURSE_THREADS", "2")))
    if sys.argv[1:] == ["sample"]:
        print(f"{SAMPLE_PROMPT}{refresh_sample()}")
        sys.exit(0)
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else DEEPSEEK_CHAR_TINY_RECIPE["steps"]
    _model, _tok, _info = train_deepseek_char_tiny(save=True, steps=steps)
    p = deepseek_char_tiny_path()
    print(f"val loss {_info['val_loss']:.4f} (train {_info['train_loss']:.4f}) after {_info['seconds']:.0f} s "
          f"({_info['ms_per_step']:.0f} ms/step); fp8 delta {_info['fp8']['delta']:+.4f}; {p} is "
          f"{p.stat().st_size / 1e6:.2f} MB\nROMEO:{_info['sample']}")
