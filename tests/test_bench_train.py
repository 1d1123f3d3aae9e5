"""`course bench train` runs and prints its table (a smoke test on the tiny config; no timing claims)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from coursetools.bench import train as bench
from coursetools.cli import main

SUMMARY = re.compile(r"^train: min ratio vs transformers: \d+\.\d{2}, geomean \d+\.\d{2}$")


def test_bench_train_command_prints_the_table(tmp_path, capsys):
    code = main(["bench", "train", "--configs", "gpt2-char-tiny", "--threads", "1", "--rounds", "1", "--steps", "1",
                 "--warmup", "0", "--out", str(tmp_path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert SUMMARY.match(out[-1]), out[-1]
    assert any(line.startswith("| gpt2-char-tiny (B=32, T=64) | 1 | llmcourse GPT2Model |") for line in out)
    results = json.loads((tmp_path / "train.json").read_text())
    (cell,) = results["cells"]
    assert {"llmcourse", "hf-sdpa", "hf-eager"} <= set(cell["ms_per_step"])
    assert all(v <= bench.LOGITS_ATOL for v in cell["max_abs_logits_diff"].values())
    assert (tmp_path / "train.md").read_text().strip().splitlines()[-1] == out[-1]


def test_all_implementations_share_weights_and_logits():
    models = bench.build_models(bench.BENCH_CONFIGS["gpt2-char-tiny"], seed=3)
    x, _ = bench._batch(bench.BENCH_CONFIGS["gpt2-char-tiny"], 4)
    diffs = bench.logits_differences(models, x)
    assert set(diffs) >= {"llmcourse", "hf-sdpa", "hf-eager"} and max(diffs.values()) < 1e-5
    course = models["llmcourse"][0]
    assert course.lm_head.weight is course.tok_emb.weight
    if "llms-from-scratch" in models:   # installed by `make bench`
        peer = models["llms-from-scratch"][0]
        assert peer.out_head.weight is not peer.tok_emb.weight
        assert torch.equal(peer.out_head.weight, peer.tok_emb.weight)


def test_bench_refuses_to_time_different_models(tmp_path, monkeypatch, capsys):
    original = bench.build_models

    def broken(bc, seed=0, with_peer=None):
        models = original(bc, seed, with_peer)
        with torch.no_grad():
            models["hf-eager"][0].transformer.ln_f.bias.add_(0.1)
        return models

    monkeypatch.setattr(bench, "build_models", broken)
    code = main(["bench", "train", "--configs", "gpt2-char-tiny", "--threads", "1", "--rounds", "1", "--steps", "1",
                 "--warmup", "0", "--out", str(tmp_path)])
    assert code == 1 and "logits differ" in capsys.readouterr().out
    assert not (tmp_path / "train.json").exists()


@pytest.mark.parametrize("ratios,expected", [([1.0, 1.0], (1.0, 1.0)), ([0.5, 2.0], (0.5, 1.0))])
def test_summary_line_format(ratios, expected):
    results = {"cells": [], "notes": [], "env": {"torch": "t", "transformers": "x", "llms_from_scratch": "y",
                                                 "machine": "m", "cpu_count": 2},
               "min_ratio": min(ratios), "geomean_ratio": (ratios[0] * ratios[1]) ** 0.5}
    last = bench.markdown(results).splitlines()[-1]
    assert SUMMARY.match(last) and last.endswith(f"{expected[0]:.2f}, geomean {expected[1]:.2f}")
