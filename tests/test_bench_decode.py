"""`course bench decode` runs on a tiny config and prints its table and summary line (format only; no timing claims)."""

from __future__ import annotations

import json
import re

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
