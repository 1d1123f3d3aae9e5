"""The course's trained character-level Llama (``assets/llama_char_tiny.pt``) and the pipeline that makes it.

``llama3-tiny`` (unit 11: V 65, D 128, L 4, H 4, KV 2, I 384, θ 10,000, tied) with a context of **128**
characters, trained on the first 90 % of tinyshakespeare by unit 10's
:func:`~llmcourse.train.pretraining.pretrain` with :data:`LLAMA_CHAR_TINY_RECIPE` (the data, batch size,
context and schedule shape of the character GPT of :mod:`llmcourse.train.char_model`, 500 steps instead of
2,500: it was trained on a shared, heavily loaded machine). Re-create it with::

    python -m llmcourse.train.llama_char          # tens of minutes on a 2-core CPU (the asset stores its time, `seconds`)

The file holds plain data only (``torch.load(..., weights_only=True)``), no optimizer state::

    {"model": state_dict (float32, tied head stored once per key), "config": Llama3Config fields
     (context_length 128), "tokenizer": {"kind": "char", "chars": the 65 characters in id order},
     "recipe": the training settings, "val_loss": float, "train_loss": float, "seconds": float,
     "samples": [(step, text), ...]}

Units 12, 15 and 16 call :func:`load_llama_char_tiny`; when the asset is missing it trains a small
substitute with unit 10's ``ci`` settings (context 64, 300 steps; about a minute) and says so.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["LLAMA_CHAR_TINY_RECIPE", "llama_char_tiny_path", "load_llama_char_tiny", "train_llama_char_tiny"]

LLAMA_CHAR_TINY_RECIPE = dict(preset="llama3-tiny", context_length=128, steps=500, batch_size=32, max_lr=3e-3,
                              min_lr=3e-4, warmup_steps=30, weight_decay=0.1, max_norm=1.0, seed=0, eval_every=125,
                              eval_batches=10)
SUBSTITUTE_RECIPE = dict(LLAMA_CHAR_TINY_RECIPE, context_length=64, steps=300, warmup_steps=30, eval_every=100)


def llama_char_tiny_path() -> Path:
    """``<course>/assets/llama_char_tiny.pt``."""
    return Path(__file__).resolve().parents[2] / "assets" / "llama_char_tiny.pt"


def _build(config: dict):
    from ..models.llama3 import Llama3Config, Llama3Model

    return Llama3Model(Llama3Config(**config))


def train_llama_char_tiny(save: bool = False, progress: bool = True, path: str | Path | None = None,
                          **overrides) -> tuple:
    """Train the character Llama with :data:`LLAMA_CHAR_TINY_RECIPE` (updated by ``overrides``).

    Seeds ``torch.manual_seed(seed)`` before building the model (``N(0, 0.02²)`` weights), sets the
    config's ``context_length`` to the training context, then runs
    :func:`~llmcourse.train.pretraining.pretrain` on :func:`~llmcourse.data.corpus.char_corpus`.
    ``save=True`` writes the asset (``path``, default :func:`llama_char_tiny_path`).

    Returns:
        ``(model, tokenizer, history)``; the model in eval mode.
    """
    from ..models.llama3 import Llama3Config
    from .char_model import train_char_lm

    def make_config(r, vocab_size):
        cfg = Llama3Config.preset(r["preset"])
        cfg.context_length, cfg.vocab_size = r["context_length"], vocab_size
        return cfg

    return train_char_lm(make_config, _build, {**LLAMA_CHAR_TINY_RECIPE, **overrides}, progress,
                         (Path(path) if path else llama_char_tiny_path()) if save else None)


def load_llama_char_tiny(path: str | Path | None = None, retrain: bool = True, verbose: bool = True) -> tuple:
    """The course's trained character Llama and its tokenizer: ``(model, tokenizer)``, model in eval mode.

    Reads ``assets/llama_char_tiny.pt`` (or ``path``) with ``torch.load(..., map_location="cpu",
    weights_only=True)`` and builds a :class:`~llmcourse.models.llama3.Llama3Model` from the stored config
    (context 128). The tokenizer is a :class:`~llmcourse.data.CharTokenizer` over the stored characters.
    ``model.checkpoint_info`` holds the recipe, the final losses and ``substitute``.

    When the file does not exist and ``retrain`` is true, a substitute is trained with unit 10's ``ci``
    settings (context 64, 300 steps) and a message says so; with ``retrain=False`` a ``FileNotFoundError``
    names the command that re-creates the asset.
    """
    from .char_model import load_char_lm

    p = Path(path) if path else llama_char_tiny_path()
    return load_char_lm(p, _build, train_llama_char_tiny, SUBSTITUTE_RECIPE, "python -m llmcourse.train.llama_char",
                        retrain, verbose)


if __name__ == "__main__":  # python -m llmcourse.train.llama_char   (re-creates assets/llama_char_tiny.pt)
    import os

    torch.set_num_threads(int(os.environ.get("LLMCOURSE_THREADS", "2")))
    from .char_model import report_char_lm

    _model, _tok, _hist = train_llama_char_tiny(save=True)
    report_char_lm(_hist, llama_char_tiny_path())
