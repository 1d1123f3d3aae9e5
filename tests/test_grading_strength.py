"""The grader's declared strength (grader/strength.py): a defining property per graded exercise, at least two
declared decisions per unit, decisions that stay withheld (the leak scan), and two red-team answers per exercise."""

from __future__ import annotations

import pytest

from grader.strength import DECISIONS, DEFINING, Decision, leaks, student_texts


def _load(unit_id):
    from grader.runner import load_unit

    load_unit(unit_id)


def test_every_graded_exercise_states_its_defining_property(unit):
    _load(unit.id)
    missing = [e.id for e in unit.exercises if e.id not in DEFINING]
    assert not missing, f"no defining_property(...) declared for {missing}"


def test_every_unit_leaves_at_least_two_decisions_to_the_student(unit):
    _load(unit.id)
    declared = [d for e in unit.exercises for d in DECISIONS.get(e.id, [])]
    assert len(declared) >= 2, f"unit {unit.id} declares {len(declared)} decision(s): {[d.what for d in declared]}"


def test_declared_wrong_alternatives_are_catalogued(unit):
    from grader.core import BUGS

    _load(unit.id)
    bad = [f"{d.exercise_id}: {w}" for e in unit.exercises for d in DECISIONS.get(e.id, [])
           for w in d.wrong if w not in {b.id for b in BUGS.get(e.id, [])}]
    assert not bad, f"wrong alternatives that are not bugs of their exercise: {bad}"


def test_withheld_decisions_stay_withheld(unit):
    """The leak scan: no declared form of a decision's answer in the exercise notebook, the lessons or README."""
    _load(unit.id)
    declared = [d for e in unit.exercises for d in DECISIONS.get(e.id, [])]
    found = leaks(declared, student_texts(unit))
    assert not found, "withheld decisions handed over:\n" + "\n".join(found)


def test_the_leak_scan_finds_a_planted_leak(course):
    unit = course.unit("03")
    texts = student_texts(unit)
    assert any(k.endswith(".ipynb") for k in texts) and "README.md" in texts
    planted = Decision("03.x", "how to scale the scores", (r"divide (the scores )?by (the )?sqrt\(?d_?k",))
    assert leaks([planted], texts) == []
    texts[unit.exercise] += "\n# Hint: divide the scores by  sqrt(d_k) before the softmax"
    found = leaks([planted], texts)
    assert len(found) == 1 and unit.exercise in found[0], found


def test_every_graded_exercise_has_two_red_team_answers(unit):
    from tests.redteam import load

    answers = load(unit.id)
    few = [e.id for e in unit.exercises if sum(a.exercise == e.id for a in answers) < 2]
    assert not few, f"fewer than two red-team answers (tests/redteam/u{unit.id}.py) for {few}"


@pytest.mark.parametrize("form", [r"x\s*-\s*max", r"exp\(x - m\)"])
def test_normalise_makes_unicode_minus_ascii(form):
    import re

    from grader.strength import normalise

    assert re.search(form, normalise("softmax is exp(x \u2212 m)/sum, with x \u2212 max"), flags=re.I)
