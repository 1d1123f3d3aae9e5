"""Unit 17: the stored transformers oracle of the checks is current, and the library matches it.

``assets/oracles/u17_hf_deepseek.pt`` is read by ``grader/checks/u17_deepseek_capstone.py`` instead of importing
transformers in ``course check``; here it is rebuilt with transformers and compared.
"""

from __future__ import annotations

import torch


def test_the_stored_transformers_oracle_of_the_checks_is_current():
    from grader.checks.u17_deepseek_capstone import ORACLE_ASSET, build_hf_oracle
    from grader.oracles import assert_oracle_is_current

    stored = assert_oracle_is_current(ORACLE_ASSET, build_hf_oracle)
    assert stored["idx"].numel() > 0


def test_library_matches_the_stored_oracle_through_the_converter():
    from grader.checks.u17_deepseek_capstone import course_state, hf_layout, oracle
    from llmcourse.models.deepseek import (
        DeepSeekConfig,
        DeepSeekLM,
        deepseek_state_dict_from_hf,
        load_hf_deepseek,
    )

    hf_state = hf_layout(course_state())
    assert "model.layers.1.mlp.experts.gate_up_proj" in hf_state
    assert hf_state["model.layers.1.mlp.experts.gate_up_proj"].shape == (8, 256, 128)
    back = deepseek_state_dict_from_hf(hf_state)
    for k, v in course_state().items():
        assert torch.equal(back[k], v), k
    model = load_hf_deepseek(DeepSeekLM(DeepSeekConfig()), hf_state).eval()
    o = oracle()
    with torch.no_grad():
        torch.testing.assert_close(model(o["idx"])["logits"], o["logits"], atol=1e-4, rtol=0)
