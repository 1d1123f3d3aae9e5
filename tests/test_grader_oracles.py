"""grader.oracles: the stored-transformers-oracle helper shared by the checks of units 08, 11, 13, 14 and 17."""

from __future__ import annotations

import pytest
import torch

from grader import oracles


def test_assert_same_accepts_equal_oracles_and_names_the_first_difference():
    a = {"cases": [{"x": torch.arange(3), "y": torch.ones(2), "n": 4}]}
    oracles.assert_same(a, {"cases": [{"x": torch.arange(3), "y": torch.ones(2) + 1e-8, "n": 4}]})
    for b, where in [({"cases": [{"x": torch.arange(3), "y": torch.ones(2) * 2, "n": 4}]}, "oracle.cases[0].y"),
                     ({"cases": [{"x": torch.tensor([0, 1, 3]), "y": torch.ones(2), "n": 4}]}, "oracle.cases[0].x"),
                     ({"cases": [{"x": torch.arange(3), "y": torch.ones(2), "n": 5}]}, "oracle.cases[0].n"),
                     ({"cases": [{"x": torch.arange(3), "y": torch.ones(2, dtype=torch.float64), "n": 4}]},
                      "oracle.cases[0].y"),
                     ({"cases": []}, "oracle.cases"), ({"other": 1}, "oracle")]:
        with pytest.raises(AssertionError, match=where.replace("[", r"\[").replace("]", r"\]")):
            oracles.assert_same(a, b)


def test_stored_oracle_loads_once_and_builds_when_the_asset_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(oracles, "oracle_path", lambda asset: tmp_path / asset)
    calls = []

    def build():
        calls.append(1)
        return {"y": torch.full((2,), float(len(calls)))}

    missing = oracles.stored_oracle("oracles/none.pt", build)
    assert torch.equal(missing()["y"], torch.ones(2)) and missing() is missing() and len(calls) == 1
    oracles.write_oracle("oracles/u99.pt", build)
    assert (tmp_path / "oracles/u99.pt").exists() and len(calls) == 2
    stored = oracles.stored_oracle("oracles/u99.pt", build)
    assert torch.equal(stored()["y"], torch.full((2,), 2.0)) and len(calls) == 2  # read, not rebuilt
    assert torch.equal(oracles.assert_oracle_is_current("oracles/u99.pt", lambda: {"y": torch.full((2,), 2.0)})["y"],
                       torch.full((2,), 2.0))
