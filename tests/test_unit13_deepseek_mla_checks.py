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
    assert len(stored["cases"]) == 6


def test_library_matches_the_stored_oracle_naive_absorbed_and_cached():
    from grader.checks.u13_deepseek_mla import _case_kwargs, oracle
    from llmcourse.models.deepseek_mla import DeepSeekMLA, LatentCache

    for case in oracle()["cases"]:
        m = DeepSeekMLA(**_case_kwargs(case)).eval()
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


def test_structural_probes_separate_absorbed_from_rebuilt_paths():
    """The overflow-scaled weights: the library's absorbed path stays finite and equals float64 naive; its naive
    path overflows (so a path that builds per-head keys cannot pass)."""
    from grader.checks.u13_deepseek_mla import (
        _case_kwargs,
        _causal,
        _expected_overflow,
        _overflow_state,
        oracle,
    )
    from llmcourse.models.deepseek_mla import DeepSeekMLA

    case = oracle()["cases"][0]
    kw = _case_kwargs(case)
    ovf = _overflow_state(case["state"], kw)
    m = DeepSeekMLA(**kw).eval()
    m.load_state_dict(ovf)
    x = case["x"]
    t = x.shape[1]
    with torch.no_grad():
        absorbed = m(x, torch.arange(t), _causal(t), absorb=True)
        naive = m(x, torch.arange(t), _causal(t))
    assert torch.isfinite(absorbed).all() and not torch.isfinite(naive).all()
    torch.testing.assert_close(absorbed, _expected_overflow(ovf, kw, x), atol=1e-5, rtol=1e-4)
