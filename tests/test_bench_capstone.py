"""`course bench capstone` on tiny sizes: format, refusal of different models, cache-size formulas (no timing claims)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from coursetools.bench import capstone as bench
from coursetools.cli import main
from llmcourse.nn.kv_cache import KVCache

SUMMARY = re.compile(r"^capstone: ratio vs transformers: \d+\.\d{2}$")
SMOKE = ["--config", "smoke", "--batch-size", "4", "--seq-len", "8", "--rounds", "1", "--steps", "1", "--warmup", "1"]


def test_bench_capstone_command_prints_the_table(tmp_path, capsys):
    code = main(["bench", "capstone", *SMOKE, "--new-tokens", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert SUMMARY.match(out[-1]), out[-1]
    results = json.loads((tmp_path / "capstone.json").read_text())
    assert "llmcourse" in results["ms_per_step"]
    hf = [k for k in results["ms_per_step"] if k.startswith("hf-")]
    assert {"hf-eager-eager", "hf-sdpa-eager"} <= set(hf) <= {f"hf-{a}-{e}" for a in bench.ATTN_IMPLEMENTATIONS
                                                              for e in bench.EXPERTS_IMPLEMENTATIONS}
    assert len(hf) + len(results["unavailable"]) == len(bench.ATTN_IMPLEMENTATIONS) * len(bench.EXPERTS_IMPLEMENTATIONS)
    assert results["ratio"] == pytest.approx(min(results["ms_per_step"][k] for k in hf) / results["ms_per_step"]["llmcourse"])
    assert all(v <= bench.LOGITS_ATOL for v in results["max_abs_logits_diff"].values())
    sizes = {r["model"].split()[0]: r["bytes_per_token"] for r in results["cache_bytes"]}
    assert sizes == {"gpt2-char-tiny": 2 * 4 * 128 * 4, "llama3-tiny": 2 * 4 * 2 * 32 * 4, "DeepSeek-tiny": 4 * (64 + 16) * 4}
    assert (tmp_path / "capstone.md").read_text().strip().splitlines()[-1] == out[-1]
    assert (tmp_path / "capstone.png").stat().st_size > 1000


def test_bench_refuses_to_time_different_models(tmp_path, monkeypatch, capsys):
    original = bench.build_models

    def broken(cfg, seed=0):
        models, failed = original(cfg, seed)
        with torch.no_grad():
            models["hf-sdpa-eager"].model.norm.weight.mul_(1.01)
        return models, failed

    monkeypatch.setattr(bench, "build_models", broken)
    code = main(["bench", "capstone", *SMOKE, "--no-cache-bytes", "--no-plot", "--out", str(tmp_path)])
    assert code == 1 and "differ" in capsys.readouterr().out
    assert not (tmp_path / "capstone.json").exists()


def test_the_hf_routing_hook_applies_the_sign_rule():
    models, _ = bench.build_models(bench.bench_config("smoke"), seed=1)
    hf, ours = models["hf-eager-eager"], models["llmcourse"]
    routing = bench._HFRouting(hf, gamma=ours.cfg.bias_update_speed)
    before = ours.moe_layers()[0].gate.e_score_correction_bias.clone()
    x, _ = bench._batch(bench.bench_config("smoke"), 3, 8, 2)
    hf(input_ids=x, use_cache=False)
    ours(x)
    routing.update()
    ours.update_router_biases()
    (router,) = routing.routers
    torch.testing.assert_close(router.e_score_correction_bias, ours.moe_layers()[0].gate.e_score_correction_bias)
    assert not torch.equal(before, router.e_score_correction_bias)


def test_a_cache_size_off_its_formula_fails():
    cache = KVCache(1)
    cache.update(0, torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8))
    tokens = torch.zeros(1, 6, dtype=torch.long)
    assert bench._row("m", cache, 1, tokens, tokens, 2 * 2 * 8 * 4, "2·KV·hd·4")["bytes_per_token"] == 128
    with pytest.raises(AssertionError, match="formula"):
        bench._row("m", cache, 1, tokens, tokens, 2 * 8 * 4, "2·hd·4")
    with pytest.raises(AssertionError, match="tokens differ"):
        bench._row("m", cache, 1, tokens, tokens + 1, 128, "")


def test_deepseek_moe_grouped_path_equals_the_per_expert_loop(monkeypatch):
    from llmcourse.models.deepseek_moe import DeepSeekMoE

    torch.manual_seed(0)
    moe = DeepSeekMoE(16, 8, 8, 1, 2, n_group=4, topk_group=2).train()
    x = torch.randn(3, 5, 16)
    results = []
    for grouped in (False, True):
        monkeypatch.setattr(DeepSeekMoE, "use_grouped_mm", grouped)
        assert moe._grouped_ok(x.reshape(-1, 16)) == (grouped and hasattr(torch.nn.functional, "grouped_mm"))
        moe.zero_grad(set_to_none=True)
        y = moe(x)
        y.pow(2).sum().backward()
        results.append((y.detach(), [p.grad.clone() for p in moe.parameters()]))
    (y0, g0), (y1, g1) = results
    torch.testing.assert_close(y1, y0, atol=1e-6, rtol=1e-5)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
    moe.experts[2].up_proj.register_forward_hook(lambda *_: None)   # a hooked expert is called as a module
    assert not moe._grouped_ok(x.reshape(-1, 16))
