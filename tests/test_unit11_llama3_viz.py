"""Unit 11: the widgets' compute functions, their static fallbacks and live builds, and the shipped
character Llama (assets/llama_char_tiny.pt).

References are independent of the code under test: ``torch.repeat_interleave`` / ``Tensor.repeat`` for the
head map, the closed-form band limits, the formula breakdowns of both models vs modules built on meta.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmcourse.models import GPT2Config, GPT2Model, Llama3Config, Llama3Model, count_parameters
from llmcourse.viz import llama as V


def test_rope_pair_angles():
    info = V.rope_pair_angles([0, 1, 5, 20], [0, 3, 7], head_dim=16, theta=10000.0)
    assert info["angles"].shape == (4, 3)
    assert torch.equal(info["angles"][0], torch.zeros(3))
    torch.testing.assert_close(info["angles"][2, 0], torch.tensor(5.0))
    torch.testing.assert_close(info["angles"][3, 1], torch.tensor(20 * 10000 ** (-6 / 16)))
    torch.testing.assert_close(info["points"].norm(dim=-1), torch.ones(4, 3))


def test_relative_scores_coincide_only_with_one_convention():
    same = V.relative_scores()
    mixed = V.relative_scores(mismatched=True)
    assert same["scores"].shape == (3, 41)
    assert same["spread"] < 1e-4
    assert mixed["spread"] > 0.1


def test_smoothing_bands_match_the_limits():
    r = V.smoothing_bands(head_dim=16)
    assert r["band"] == ["kept"] * 4 + ["smoothed"] + ["divided"] * 3
    hi, lo = r["limits"]
    assert (hi, lo) == (2048, 8192)
    wl = 2 * math.pi / r["inv_freq"]
    assert all((w < hi) == (b == "kept") for w, b in zip(wl.tolist(), r["band"]))
    torch.testing.assert_close(r["smoothed"][5:], r["inv_freq"][5:] / 32)


def test_gqa_head_map():
    assert V.gqa_head_map(8, 2, True) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert V.gqa_head_map(8, 2, False) == [0, 1, 0, 1, 0, 1, 0, 1]
    assert V.gqa_head_map(4, 4, True) == [0, 1, 2, 3]
    assert V.gqa_head_map(6, 1, False) == [0] * 6
    assert V.kv_bytes_per_token(16, 8, 64) == 32 * 1024   # Llama 3.2 1B, bf16


def test_param_diff_equals_modules_on_meta():
    rows = dict((name, (a, b)) for name, a, b in V.llama_vs_gpt_params())
    with torch.device("meta"):
        g = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
        ll = Llama3Model(Llama3Config.preset("llama3-tiny"))
    assert rows["total"] == (count_parameters(g), count_parameters(ll)) == (809_856, 795_904)
    assert rows["attention"][1] == 4 * 49_152
    assert rows["position embedding"][1] == 0


@pytest.mark.parametrize("name", ["show_rope_rotation", "show_rope_relative", "show_rope_smoothing", "show_gqa_map",
                                  "show_llama_param_diff"])
def test_widgets_static_and_live(name):
    from llmcourse.viz.base import StaticFigure

    fn = getattr(V, name)
    s = fn(static=True)
    assert isinstance(s, StaticFigure) and s._repr_png_().startswith(b"\x89PNG")
    w = fn(static=False)
    assert any(c.startswith("llmcourse-w11-") for c in w._dom_classes)


def test_shipped_llama_char_tiny():
    from llmcourse.train.llama_char import LLAMA_CHAR_TINY_RECIPE, llama_char_tiny_path, load_llama_char_tiny

    path = llama_char_tiny_path()
    assert path.exists(), "assets/llama_char_tiny.pt is missing: python -m llmcourse.train.llama_char"
    assert path.stat().st_size < 5e6
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert set(raw) >= {"model", "config", "tokenizer", "recipe", "val_loss"}
    model, tok = load_llama_char_tiny()
    assert isinstance(model, Llama3Model) and not model.training and model.checkpoint_info["substitute"] is False
    assert model.cfg.context_length == LLAMA_CHAR_TINY_RECIPE["context_length"] == 128
    assert len(tok.chars) == 65 and model.cfg.vocab_size == 65
    assert raw["val_loss"] < 2.2
    # the stored weights reproduce the stored validation loss's order of magnitude on real text
    ids = torch.tensor([tok.encode("ROMEO:\nWhat say you, my lord? I will not stay.\n")])
    with torch.no_grad():
        logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]).item()
    assert loss < 3.0


def test_missing_asset_without_retrain_names_the_command(tmp_path):
    from llmcourse.train.llama_char import load_llama_char_tiny

    with pytest.raises(FileNotFoundError, match="llmcourse.train.llama_char"):
        load_llama_char_tiny(tmp_path / "nope.pt", retrain=False)
