"""Unit 14: the stored transformers oracle of the checks is current, and the library matches it.

``assets/oracles/u14_hf_deepseek_moe.pt`` is read by ``grader/checks/u14_deepseek_moe.py`` instead of importing
transformers in ``course check``; here it is rebuilt with transformers and compared.
"""

from __future__ import annotations

import pytest
import torch


def test_the_stored_transformers_oracle_of_the_checks_is_current():
    pytest.importorskip("transformers")
    from grader.checks.u14_deepseek_moe import ORACLE_ASSET, build_hf_oracle
    from grader.oracles import assert_oracle_is_current

    stored = assert_oracle_is_current(ORACLE_ASSET, build_hf_oracle)
    assert stored


def test_library_matches_the_stored_oracle():
    from grader.checks.u14_deepseek_moe import oracle
    from llmcourse.models.deepseek_moe import DeepSeekMoE, deepseek_route

    for case in oracle()["cases"]:
        kw = case["kw"]
        w, i = deepseek_route(case["router_logits"], case["bias"], kw["top_k"], kw["n_group"], kw["topk_group"],
                              kw["routed_scaling_factor"], kw["norm_topk_prob"])
        order = i.argsort(-1)
        assert torch.equal(i.gather(1, order), case["indices_sorted"])
        torch.testing.assert_close(w.gather(1, order), case["weights_sorted"], atol=1e-7, rtol=1e-6)
        m = DeepSeekMoE(**kw).eval()
        m.load_state_dict(case["state"])
        with torch.no_grad():
            torch.testing.assert_close(m(case["x"]), case["y"], atol=1e-5, rtol=1e-5)
        # the bias changes the choice in these cases, and masking with 0 would change it again
        _, i0 = deepseek_route(case["router_logits"], torch.zeros_like(case["bias"]), kw["top_k"], kw["n_group"],
                               kw["topk_group"])
        assert not torch.equal(i0.sort(-1).values, case["indices_sorted"])


def test_every_mutant_is_named_on_the_library_namespace():
    """The catalog against the library (the solution notebook's run is in test_grader_selftest)."""
    from grader.checks.u14_deepseek_moe import _ref, _ref_seq
    from grader.core import BUGS
    from grader.runner import load_unit, run_check

    load_unit("14")
    ref = {**_ref(), **_ref_seq()}
    ids = set()
    for exercise_id, bugs in BUGS.items():
        if not exercise_id.startswith("14."):
            continue
        for b in bugs:
            v = run_check(exercise_id, namespace={**ref, **b.impl})
            assert v.status == "failed" and v.bug_id == b.id, (b.id, v.render())
            ids.add(b.id)
    assert len(ids) == 24  # the catalog of unit 14 (a lost entry fails here)


def test_an_in_place_bias_update_fails():
    """update_bias that adds into the bias it was given (float32) returns the right values but mutates its input."""
    from grader.checks.u14_deepseek_moe import _ref
    from grader.runner import load_unit, run_check

    load_unit("14")

    @torch.no_grad()
    def update_bias(bias, indices, num_experts, gamma=0.001):
        c = torch.bincount(indices.reshape(-1), minlength=num_experts).float()
        step = gamma * torch.sign(c.mean() - c)
        return bias.add_(step) if bias.dtype == torch.float32 else bias.float() + step

    v = run_check("14.update_bias", namespace={**_ref(), "update_bias": update_bias})
    assert v.status == "failed" and "unchanged" in v.render(), v.render()
