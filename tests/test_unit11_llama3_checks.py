"""Unit 11: the stored transformers oracle of the checks is current, and the library matches it.

``assets/oracles/u11_hf_llama.pt`` is read by ``grader/checks/u11_llama3.py`` instead of importing
transformers in ``course check``; here it is rebuilt with transformers and compared.
"""

from __future__ import annotations

import torch


def test_the_stored_transformers_oracle_of_the_checks_is_current():
    from grader.checks.u11_llama3 import ORACLE_ASSET, build_hf_oracle
    from grader.oracles import assert_oracle_is_current

    stored = assert_oracle_is_current(ORACLE_ASSET, build_hf_oracle)
    assert stored


def test_library_matches_the_stored_oracle():
    from grader.checks.u11_llama3 import oracle
    from llmcourse.models.llama3 import Llama3Config, Llama3Model, rope_inv_freq

    o = oracle()
    assert torch.equal(rope_inv_freq(16, 500000.0), o["inv_freq"]["default"])
    for case in o["models"]:
        m = Llama3Model(Llama3Config(**case["config"])).eval()
        m.load_state_dict(case["state"])
        with torch.no_grad():
            torch.testing.assert_close(m(case["idx"]), case["logits"], atol=1e-5, rtol=1e-5)
