"""The grader proves itself: solutions pass, stubs are "not attempted", every mutant is named.

Parametrized over every available unit in course.toml (see conftest.py), so a new unit is covered
as soon as it is marked available.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from grader.core import CHECKS
from grader.extract import code_cells_of_notebook, extract_namespace
from grader.runner import load_unit, run_check, run_unit

ROOT = Path(__file__).resolve().parents[1]
_CACHE: dict = {}


def namespace_of(rel: str):
    """A trusted namespace (the reference solution's definitions), for running mutants in-process."""
    if rel not in _CACHE:
        _CACHE[rel] = extract_namespace(sources_of(rel))
    return _CACHE[rel]


def sources_of(rel: str) -> list[str]:
    return code_cells_of_notebook(nbformat.read(ROOT / rel, as_version=4))


def test_every_exercise_has_a_check(exercise):
    load_unit(exercise.unit_id)
    assert exercise.id in CHECKS, f"no check registered for {exercise.id}"


def test_solution_passes_every_check(unit, monkeypatch):
    """And without running one mutant: the bug catalog is for naming a failure (``Tester.diagnose``), and a right
    answer must not pay for it (a warm `course progress` and a class's grading check many right answers)."""
    from grader.core import Tester

    diagnosed = []
    real = Tester.diagnose

    def recording(self, probe, *args, **kwargs):
        diagnosed.append(self.spec.exercise_id)
        return real(self, probe, *args, **kwargs)

    monkeypatch.setattr(Tester, "diagnose", recording)
    verdicts = run_unit(unit.id, sources_of(unit.solution))  # isolated: learner code in worker processes
    assert not diagnosed, f"checks that ran the bug catalog on a right answer: {sorted(set(diagnosed))}"
    notes = [n for v in verdicts for n in v.notes]
    assert not notes, notes
    failing = [v.render() for v in verdicts if not v.passed]
    assert not failing, "\n".join(failing)
    assert sum(v.points for v in verdicts) == unit.points


def test_untouched_stub_is_not_attempted(unit):
    verdicts = run_unit(unit.id, sources_of(unit.exercise))
    wrong = [v.render() for v in verdicts if v.status != "not_attempted"]
    assert not wrong, "\n".join(wrong)


def test_every_mutant_fails_and_is_diagnosed_by_its_own_name(bug_case):
    exercise_id, bug = bug_case
    unit_id = exercise_id[:2]
    from llmcourse.manifest import load_course

    base = namespace_of(load_course().unit(unit_id).solution).namespace
    verdict = run_check(exercise_id, namespace={**base, **bug.impl})
    assert verdict.status == "failed", verdict.render()
    assert verdict.bug_id == bug.id, f"expected diagnosis {bug.id}, got:\n{verdict.render()}"
    assert bug.hint in verdict.render()


def test_every_bug_catalog_entry_has_a_hint_and_a_known_exercise(course):
    from grader.core import BUGS

    for u in course.available_units:
        load_unit(u.id)
    known = {e.id for u in course.available_units for e in u.exercises}
    for exercise_id, bugs in BUGS.items():
        assert exercise_id in known
        for b in bugs:
            assert b.id.startswith(f"B{exercise_id[:2]}.") and b.hint and b.detect in {"mutant", "detector", "name_error"}


# ---------------------------------------------------------------- robustness (unit 03 as the example)

SOLUTION_03 = "solutions/03_self_attention/03_self_attention.ipynb"


def _sources_with(replacement: str, name: str) -> list[str]:
    nb = nbformat.read(ROOT / SOLUTION_03, as_version=4)
    cells = code_cells_of_notebook(nb)
    return [replacement if (c.lstrip().startswith(f"def {name}") or c.lstrip().startswith(f"class {name}")) else c
            for c in cells]


def test_syntax_error_costs_only_that_exercise():
    verdicts = {v.exercise_id: v for v in run_unit("03", _sources_with("def softmax_stable(x, dim=-1)\n    return x",
                                                                         "softmax_stable"))}
    assert any("syntax error" in n for v in verdicts.values() for n in v.notes)
    assert verdicts["03.softmax_stable"].status == "missing"
    assert "syntax error" in verdicts["03.softmax_stable"].render()
    assert all(v.passed for k, v in verdicts.items() if k != "03.softmax_stable")


def test_infinite_loop_is_stopped_and_reported(monkeypatch):
    import grader.runner

    monkeypatch.setattr(grader.runner, "CHECK_TIME_LIMIT_S", 2.0)
    v = run_check("03.softmax_stable", _sources_with("def softmax_stable(x, dim=-1):\n    while True:\n        pass\n",
                                                     "softmax_stable"))
    assert v.status == "failed" and "did not finish" in v.message


def test_notebook_global_is_diagnosed_in_a_fresh_namespace():
    src = ("class SelfAttention(nn.Module):\n"
           "    def __init__(self, d_in, d_out, qkv_bias=False):\n"
           "        super().__init__()\n"
           "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
           "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
           "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
           "    def forward(self, x):\n"
           "        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)\n"
           "        return torch.softmax(q @ k.transpose(-2, -1) / d_out ** 0.5, dim=-1) @ v\n"
           "d_out = 2\n")
    v = run_check("03.SelfAttention", _sources_with(src, "SelfAttention"))
    assert v.status == "failed" and v.bug_id == "B03.scale_global"
    assert "line 9 of your code cell" in v.message


def test_importing_the_reference_is_refused():
    sources = _sources_with("from llmcourse.nn.attention import softmax_stable\n", "softmax_stable")
    v = run_check("03.softmax_stable", sources)
    assert v.status == "failed" and "course library" in v.message


def test_builtin_softmax_is_refused():
    sources = _sources_with("def softmax_stable(x, dim=-1):\n    return torch.softmax(x, dim=dim)\n", "softmax_stable")
    v = run_check("03.softmax_stable", sources)
    assert v.status == "failed" and "torch.softmax" in v.message


def test_verdicts_never_show_grader_source():
    from grader.core import BUGS

    load_unit("03")
    base = namespace_of(SOLUTION_03).namespace
    for exercise_id, bugs in BUGS.items():
        if not exercise_id.startswith("03."):
            continue
        for b in bugs:
            text = run_check(exercise_id, namespace={**base, **b.impl}).render()
            for leak in ("grader/", "def check_", "Traceback", "t.compare", "impl."):
                assert leak not in text, f"{b.id}: verdict shows {leak!r}:\n{text}"


def test_grade_raises_a_one_line_failure():
    from grader.runner import GradeFailed, grade

    ns = dict(namespace_of(SOLUTION_03).namespace)
    ns["softmax_stable"] = lambda x, dim=-1: x
    with pytest.raises(GradeFailed) as err:
        grade("03.softmax_stable", namespace=ns)
    assert err.value._render_traceback_() == ["GradeFailed: 03.softmax_stable did not pass (see the report above)"]
