"""Unit 13: the stored transformers oracle of the checks is current, and the library matches it.

``assets/oracles/u13_hf_mla.pt`` is read by ``grader/checks/u13_deepseek_mla.py`` instead of importing
transformers in ``course check``; here it is rebuilt with transformers and compared.
"""

from __future__ import annotations

import torch


def test_the_stored_transformers_oracle_of_the_checks_is_current():
    from grader.checks.u13_deepseek_mla import ORACLE_ASSET, build_hf_oracle
    from grader.oracles import assert_oracle_is_current

    stored = assert_oracle_is_current(ORACLE_ASSET, build_hf_oracle)
    assert len(stored["cases"]) == 4


def test_library_matches_the_stored_oracle_naive_absorbed_and_cached():
    from grader.checks.u13_deepseek_mla import TINY, oracle
    from llmcourse.models.deepseek_mla import DeepSeekMLA, LatentCache

    for case in oracle()["cases"]:
        q = None if case["q_lora_rank"] < 0 else case["q_lora_rank"]
        m = DeepSeekMLA(**TINY, q_lora_rank=q, rope_interleave=case["rope_interleave"]).eval()
        m.load_state_dict(case["state"], strict=True)
        x, y = case["x"], case["y"]
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        with torch.no_grad():
            torch.testing.assert_close(m(x, torch.arange(t), mask), y, atol=1e-5, rtol=0)
            torch.testing.assert_close(m(x, torch.arange(t), mask, absorb=True), y, atol=1e-5, rtol=0)
            cache = LatentCache(1)
            outs = [m(x[:, :4], torch.arange(4), mask[:4, :4], cache=cache)]
            outs += [m(x[:, i:i + 1], torch.arange(i, i + 1), None, cache=cache, absorb=True) for i in range(4, t)]
            torch.testing.assert_close(torch.cat(outs, 1), y, atol=1e-5, rtol=0)
