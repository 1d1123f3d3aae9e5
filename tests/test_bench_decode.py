"""`course bench decode` runs on a tiny config and prints its table and summary line (format only; no timing claims)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from coursetools.bench import decode as bench
from coursetools.cli import main

SUMMARY = re.compile(r"^decode: min cached speedup: \d+\.\d, min ratio vs transformers: \d+\.\d{2}$")


def test_bench_decode_command_prints_the_table(tmp_path, capsys):
    code = main(["bench", "decode", "--config", "tiny", "--batch-sizes", "1", "3", "--prompt-len", "8",
                 "--new-tokens", "6", "--repeats", "1", "--uncached-samples", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert SUMMARY.match(out[-1]), out[-1]
    assert any(line.startswith("| 1 | llmcourse generate_cached |") for line in out)
    assert any(line.startswith("| 3 | llmcourse uncached (estimated) |") for line in out)
    row = next(line for line in out if line.startswith("| 1 | llmcourse generate_cached |"))
    assert re.search(r"\| \d+\.\d{2} \| \d+\.\d{2} \|$", row), row   # roofline ms/step and fraction
    assert any(line.startswith("Roofline: memory read bandwidth") for line in out)
    results = json.loads((tmp_path / "decode.json").read_text())
    assert {r["implementation"] for r in results["rows"]} >= {"llmcourse", "transformers", "uncached"}
    assert (tmp_path / "decode.md").read_text().strip().splitlines()[-1] == out[-1]
    assert (tmp_path / "decode.png").stat().st_size > 1000


def test_all_implementations_share_weights_and_prefill_logits():
    models = bench.build_models("tiny", seed=3)
    idx = torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = bench.prefill_logits(models, idx)
    assert set(logits) >= {"llmcourse", "uncached", "transformers"}
    for name, value in logits.items():
        torch.testing.assert_close(value, logits["uncached"], atol=1e-4, rtol=1e-4, msg=name)


def test_bench_refuses_tokens_that_differ(tmp_path, monkeypatch, capsys):
    original = bench._generate

    def broken(name, model, idx, n):
        out = original(name, model, idx, n)
        if name == "transformers":
            out = out.clone()
            out[:, -1] = (out[:, -1] + 1) % 65
        return out

    monkeypatch.setattr(bench, "_generate", broken)
    code = main(["bench", "decode", "--config", "tiny", "--batch-sizes", "1", "--prompt-len", "4", "--new-tokens", "3",
                 "--repeats", "1", "--no-plot", "--out", str(tmp_path)])
    assert code == 1 and "tokens differ" in capsys.readouterr().out
    assert not (tmp_path / "decode.json").exists()


def test_decode_step_bytes_counts_the_weights_and_the_filled_cache():
    """Independent route: the HF model's non-embedding parameters, and the K/V tensors a real cache holds."""
    models = bench.build_models("tiny", seed=0, with_peer=False)
    hf, ours = models["transformers"], models["llmcourse"]
    n_params = sum(p.numel() for p in ours.parameters())
    B, T = 3, 11
    cache = ours.new_cache()
    with torch.no_grad():
        ours(torch.zeros(B, T, dtype=torch.long), cache=cache)
    if ours.cfg.tie_word_embeddings:  # the tied head reads the whole (V, D) table: every HF parameter once
        weights = sum(p.numel() for p in hf.parameters())
    else:
        weights = sum(p.numel() for n, p in hf.named_parameters() if "embed_tokens" not in n) + B * ours.cfg.d_model
    assert bench.decode_step_bytes(ours.cfg, n_params, B, T) == 4 * weights + cache.nbytes()
    # a longer cache costs more; the bound grows with the batch through the cache and the looked-up rows only
    assert bench.decode_step_bytes(ours.cfg, n_params, B, T + 1) > bench.decode_step_bytes(ours.cfg, n_params, B, T)
    assert bench.roofline_ms_per_step(ours.cfg, n_params, 1, 4, 3, 1e9) == pytest.approx(
        1000 * sum(bench.decode_step_bytes(ours.cfg, n_params, 1, 4 + i) for i in (1, 2, 3)) / 3 / 1e9)


def test_read_bandwidth_is_a_plausible_rate():
    bw = bench.read_bandwidth(nbytes=32 << 20, repeats=3)
    assert 1e8 < bw < 1e13
