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


def _solution_namespace(unit_rel: str) -> dict:
    from pathlib import Path

    import nbformat

    from grader.extract import code_cells_of_notebook, extract_namespace

    root = Path(__file__).resolve().parents[1]
    return extract_namespace(code_cells_of_notebook(nbformat.read(root / unit_rel, as_version=4))).namespace


def test_a_forward_that_changes_its_parameters_fails_the_side_effect_probe():
    """The side-effect probes can fail: outputs right, but the module's gain is changed by every call."""
    from grader.runner import run_check

    base = _solution_namespace("solutions/11_llama3/11_llama3.ipynb")

    class RMSNorm(base["RMSNorm"]):
        def forward(self, x):
            y = super().forward(x)
            with torch.no_grad():
                self.weight.mul_(1.5)
            return y

    verdict = run_check("11.RMSNorm", namespace={**base, "RMSNorm": RMSNorm})
    assert verdict.status == "failed" and "changed the module's parameters" in verdict.render(), verdict.render()

