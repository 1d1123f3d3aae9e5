"""Unit 17: the trained DeepSeek asset is plain data, float16, under 5 MB, and its stored numbers describe it."""

from __future__ import annotations

import pytest
import torch


def test_deepseek_char_tiny_asset():
    from llmcourse.models.deepseek import _val_loss
    from llmcourse.train.deepseek_char import deepseek_char_tiny_path, load_deepseek_char_tiny

    p = deepseek_char_tiny_path()
    if not p.exists():
        pytest.skip("assets/deepseek_char_tiny.pt not built (python -m llmcourse.train.deepseek_char)")
    assert p.stat().st_size < 5_000_000
    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    dtypes = {k: v.dtype for k, v in ckpt["model"].items()}
    assert all(d == torch.float16 for k, d in dtypes.items() if "e_score_correction_bias" not in k)
    assert all(dtypes[f"layers.{i}.mlp.gate.e_score_correction_bias"] == torch.float32 for i in (1, 2, 3))
    assert {"fp8", "fp8_check", "val_loss", "recipe", "history"} <= set(ckpt)
    model, tok = load_deepseek_char_tiny(retrain=False, verbose=False)
    assert model.checkpoint_info["substitute"] is False
    assert tok.decode(tok.encode("ROMEO:")) == "ROMEO:"
    # the stored FP8 calibration of the grader is reproduced by the stored weights (3 batches of 32 x 64)
    from llmcourse.data.corpus import char_corpus

    val = char_corpus("tinyshakespeare").val
    got = _val_loss(model, val, 32, 64, 3, 10_000)
    assert got == pytest.approx(ckpt["fp8_check"]["val_loss_fp32"], abs=1e-5)
    assert got < 2.6, "the trained model must have learned the characters' statistics"


def test_deepseek_char_tiny_sample_inside_trained_window():
    """The stored sample is what the current generation settings produce: greedy after the prompt, cut to the
    trained window (the old one ran 100 tokens, past the 64-token training windows)."""
    from llmcourse.train.deepseek_char import (
        SAMPLE_PROMPT,
        SAMPLE_TOKENS,
        asset_sample,
        deepseek_char_tiny_path,
        load_deepseek_char_tiny,
    )

    p = deepseek_char_tiny_path()
    if not p.exists():
        pytest.skip("assets/deepseek_char_tiny.pt not built (python -m llmcourse.train.deepseek_char)")
    model, tok = load_deepseek_char_tiny(retrain=False, verbose=False)
    info = model.checkpoint_info
    window = info["recipe"]["context_length"]
    n_prompt = len(tok.encode(SAMPLE_PROMPT))
    stored = info["sample"]
    assert len(tok.encode(stored)) == min(SAMPLE_TOKENS, window - n_prompt), \
        "stored sample length does not match the generation settings (run `python -m llmcourse.train.deepseek_char sample`)"
    assert n_prompt + len(tok.encode(stored)) <= window < model.cfg.context_length
    fresh = asset_sample(model, tok, window)
    # greedy decoding is deterministic; allow a late argmax flip from float rounding on another CPU
    common = next((i for i, (a, b) in enumerate(zip(stored, fresh)) if a != b), len(stored))
    assert len(fresh) == len(stored) and common >= len(stored) // 2, (stored, fresh)
    with pytest.raises(ValueError):
        asset_sample(model, tok, n_prompt)
