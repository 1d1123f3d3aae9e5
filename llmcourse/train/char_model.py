"""The course's trained character-level GPT (``assets/gpt_char_tiny.pt``) and the pipeline that makes it.

``gpt2-char-tiny`` (unit 08: V 65, D 128, H 4, L 4) with a context of **128** characters, trained on the
first 90 % of tinyshakespeare by :func:`~llmcourse.train.pretraining.pretrain` with
:data:`GPT_CHAR_TINY_RECIPE` (unit 10's ``laptop`` settings). Re-create the asset with::

    python -m llmcourse.train.char_model          # the run's wall time is stored in the file ("seconds")

The file holds plain data only (``torch.load(..., weights_only=True)``), no optimizer state::

    {"model": state_dict (float32), "config": GPT2Config fields (context_length 128),
     "tokenizer": {"kind": "char", "chars": the 65 characters in id order},
     "recipe": the training settings, "val_loss": float, "train_loss": float, "seconds": float,
     "samples": [(step, text), ...]}

Loaders build the model from the stored ``config`` (not from the 64-position preset). Units 09 and later
call :func:`load_gpt_char_tiny`; when the asset is missing it trains a small substitute with unit 10's
``ci`` settings (about a minute) and says so.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["GPT_CHAR_TINY_RECIPE", "load_gpt_char_tiny", "gpt_char_tiny_path", "train_gpt_char_tiny"]

GPT_CHAR_TINY_RECIPE = dict(preset="gpt2-char-tiny", context_length=128, dropout=0.0, steps=2500, batch_size=32,
                            max_lr=3e-3, min_lr=3e-4, warmup_steps=100, weight_decay=0.1, max_norm=1.0, seed=0,
                            eval_every=250, eval_batches=20)
# the substitute trained when the asset is missing: unit 10's ci run (context 64, 300 steps)
SUBSTITUTE_RECIPE = dict(GPT_CHAR_TINY_RECIPE, context_length=64, steps=300, warmup_steps=30, eval_every=100)


def gpt_char_tiny_path() -> Path:
    """``<course>/assets/gpt_char_tiny.pt``."""
    return Path(__file__).resolve().parents[2] / "assets" / "gpt_char_tiny.pt"


def _build(config: dict):
    from ..models.gpt2 import GPT2Config, GPT2Model

    return GPT2Model(GPT2Config(**config))


def train_char_lm(make_config, build, recipe: dict, progress: bool = True, save_to: str | Path | None = None) -> tuple:
    """Shared pipeline of the course's character models (GPT here, Llama in :mod:`llmcourse.train.llama_char`).

    ``make_config(recipe, vocab_size)`` returns the model's config (a dataclass with ``to_dict()``),
    ``build(config_dict)`` the model. Seeds ``torch.manual_seed(recipe["seed"])`` before building, runs
    :func:`~llmcourse.train.pretraining.pretrain` on tinyshakespeare's characters, and, when ``save_to`` is
    given, writes the asset (plain data: model state_dict, config, tokenizer characters, recipe, losses,
    seconds, samples). Returns ``(model, tokenizer, history)``, the model in eval mode.
    """
    from ..data.corpus import char_corpus
    from .pretraining import pretrain, sample_text

    r = recipe
    corpus = char_corpus("tinyshakespeare")
    cfg = make_config(r, corpus.vocab_size)
    torch.manual_seed(r["seed"])
    model = build(cfg.to_dict())
    tok = corpus.tokenizer
    hist = pretrain(model, corpus.train, corpus.val, steps=r["steps"], batch_size=r["batch_size"],
                    context_length=r["context_length"], max_lr=r["max_lr"], min_lr=r["min_lr"],
                    warmup_steps=r["warmup_steps"], weight_decay=r["weight_decay"], max_norm=r["max_norm"],
                    seed=r["seed"], eval_every=r["eval_every"], eval_batches=r["eval_batches"],
                    sample_fn=lambda m: sample_text(m, tok, "ROMEO:", 120, temperature=0.8, seed=0),
                    progress=progress)
    if save_to is not None:
        out = Path(save_to)
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    "config": cfg.to_dict(), "tokenizer": {"kind": "char", "chars": "".join(tok.chars)},
                    "recipe": r, "val_loss": hist["val_loss"][-1], "train_loss": hist["train_loss_eval"][-1],
                    "seconds": hist["seconds"], "samples": hist["samples"]}, out)
    return model.eval(), tok, hist


def load_char_lm(p: Path, build, train_substitute, substitute_recipe: dict, command: str, retrain: bool,
                 verbose: bool) -> tuple:
    """Shared loader of the course's character models: ``(model, tokenizer)`` from the asset ``p``
    (``weights_only=True``; the model built by ``build`` from the stored config), or, when ``p`` is missing and
    ``retrain``, a substitute from ``train_substitute(progress=..., **substitute_recipe)`` with a message naming
    ``command`` (``FileNotFoundError`` naming it when ``retrain`` is false). ``model.checkpoint_info`` holds the
    stored recipe and losses and ``substitute``.
    """
    from ..data.tokenizers import CharTokenizer

    if not p.exists():
        if not retrain:
            raise FileNotFoundError(f"{p} is missing; re-create it with `{command}`")
        if verbose:
            print(f"{p.name} not found: training a small substitute instead (unit 10's ci run: context 64, "
                  f"{substitute_recipe['steps']} steps, about a minute). Re-create the real asset with "
                  f"`{command}`.")
        model, tok, hist = train_substitute(progress=verbose, **substitute_recipe)
        model.checkpoint_info = {"recipe": dict(substitute_recipe), "val_loss": hist["val_loss"][-1],
                                 "substitute": True}
        return model, tok
    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    model = build(ckpt["config"])
    model.load_state_dict(ckpt["model"])
    model.checkpoint_info = {k: v for k, v in ckpt.items() if k not in ("model",)} | {"substitute": False}
    return model.eval(), CharTokenizer(list(ckpt["tokenizer"]["chars"]))


def report_char_lm(hist: dict, path: Path) -> None:
    """What ``python -m llmcourse.train.<name>`` prints after re-creating an asset."""
    print(f"val loss {hist['val_loss'][-1]:.4f} (train {hist['train_loss_eval'][-1]:.4f}) after "
          f"{hist['seconds']:.0f} s of training ({hist['ms_per_step']:.0f} ms/step); "
          f"{path} is {path.stat().st_size / 1e6:.2f} MB")
    for step, text in hist["samples"][-2:]:
        print(f"--- step {step}:\nROMEO:{text}")


def train_gpt_char_tiny(save: bool = False, progress: bool = True, path: str | Path | None = None,
                        **overrides) -> tuple:
    """Train the character GPT with :data:`GPT_CHAR_TINY_RECIPE` (updated by ``overrides``).

    Seeds ``torch.manual_seed(seed)`` before building the model (GPT-2 initialisation), then runs
    :func:`~llmcourse.train.pretraining.pretrain` on :func:`~llmcourse.data.corpus.char_corpus`.
    ``save=True`` writes the asset (``path``, default :func:`gpt_char_tiny_path`).

    Returns:
        ``(model, tokenizer, history)``; the model in eval mode.
    """
    from ..models.gpt2 import GPT2Config

    def make_config(r, vocab_size):
        cfg = GPT2Config.preset(r["preset"])
        cfg.context_length, cfg.dropout, cfg.vocab_size = r["context_length"], r["dropout"], vocab_size
        return cfg

    return train_char_lm(make_config, _build, {**GPT_CHAR_TINY_RECIPE, **overrides}, progress,
                         (Path(path) if path else gpt_char_tiny_path()) if save else None)


def load_gpt_char_tiny(path: str | Path | None = None, retrain: bool = True, verbose: bool = True) -> tuple:
    """The course's trained character GPT and its tokenizer: ``(model, tokenizer)``, model in eval mode.

    Reads ``assets/gpt_char_tiny.pt`` (or ``path``) with ``torch.load(..., map_location="cpu",
    weights_only=True)`` and builds a :class:`~llmcourse.models.gpt2.GPT2Model` from the stored config
    (context 128). The tokenizer is a :class:`~llmcourse.data.CharTokenizer` over the stored characters
    (tinyshakespeare's 65: ``"\\n"`` = 0, ``" "`` = 1, …). ``model.checkpoint_info`` holds the recipe and
    the final losses.

    When the file does not exist and ``retrain`` is true, a substitute is trained with unit 10's ``ci``
    settings (context 64, 300 steps; about a minute) and a message says so; with ``retrain=False`` a
    ``FileNotFoundError`` names the command that re-creates the asset.
    """
    p = Path(path) if path else gpt_char_tiny_path()
    return load_char_lm(p, _build, train_gpt_char_tiny, SUBSTITUTE_RECIPE, "python -m llmcourse.train.char_model",
                        retrain, verbose)


if __name__ == "__main__":  # python -m llmcourse.train.char_model   (re-creates assets/gpt_char_tiny.pt)
    import os

    torch.set_num_threads(int(os.environ.get("LLMCOURSE_THREADS", "2")))
    _model, _tok, _hist = train_gpt_char_tiny(save=True)
    report_char_lm(_hist, gpt_char_tiny_path())
