"""Non-finite outputs are reported as such (how many, where) before the bug catalog is consulted.

An output that is NaN everywhere carries no evidence of a particular mistake: an all-NaN RMSNorm must
not be told "your norm removes the mean (LayerNorm)", an all-NaN softmax not "exp overflows". A partial
NaN pattern that a catalogued mistake produces keeps its diagnosis.
"""

from __future__ import annotations

import pytest
import torch

from grader.core import nonfinite_report
from grader.runner import run_check
from tests.test_grader_selftest import namespace_of


def _solution_ns(unit_id: str) -> dict:
    from llmcourse.manifest import load_course

    return dict(namespace_of(load_course().unit(unit_id).solution).namespace)


def test_report_counts_and_locates():
    text = nonfinite_report(torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]]), torch.ones(2, 2))
    assert "1 NaN and 1 inf" in text and "(0, 1)" in text and "4 values" in text
    assert nonfinite_report(torch.tensor([0.0, float("-inf")]), torch.tensor([0.0, float("-inf")])) is None
    assert nonfinite_report([torch.ones(2), {"a": torch.tensor([float("nan")])}]) is not None


def test_all_nan_rmsnorm_is_not_told_layernorm():
    ns = _solution_ns("11")
    base = ns["RMSNorm"]

    class RMSNorm(base):
        def forward(self, x):
            return torch.full_like(x, float("nan"))

    v = run_check("11.RMSNorm", namespace={**ns, "RMSNorm": RMSNorm})
    assert v.status == "failed"
    assert v.bug_id is None, v.render()
    assert "NaN" in v.message and "LayerNorm" not in v.render(), v.render()


def test_all_nan_softmax_is_not_told_overflow():
    ns = _solution_ns("03")
    v = run_check("03.softmax_stable", namespace={**ns, "softmax_stable": lambda x, dim=-1: torch.full_like(x, float("nan"))})
    assert v.status == "failed" and v.bug_id is None, v.render()
    assert "non-finite values" in v.message and "overflows" not in v.render(), v.render()


@pytest.mark.parametrize("inf", [float("inf"), float("-inf")])
def test_inf_output_is_reported_before_the_difference(inf):
    ns = _solution_ns("03")
    v = run_check("03.softmax_stable", namespace={**ns, "softmax_stable": lambda x, dim=-1: torch.full_like(x, inf)})
    assert v.status == "failed" and v.bug_id is None
    assert "inf" in v.message and "non-finite" in v.message, v.render()
