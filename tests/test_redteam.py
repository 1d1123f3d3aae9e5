"""The red-team corpus (tests/redteam/): every wrong or lazy answer loses points, and the feedback names the mistake.

Each answer is run as the bug catalog's mutants are: its cells executed over the reference solution's definitions
(trusted code, in this process), then the exercise's check. See tests/redteam/__init__.py for the format.
"""

from __future__ import annotations

import re

import pytest

from tests.redteam import load_all


def _answers():
    from llmcourse.manifest import load_course

    units = [u.id for u in load_course().available_units]
    return load_all(units)


ANSWERS = _answers()


def _namespace(answer):
    from llmcourse.manifest import load_course
    from tests.test_grader_selftest import namespace_of

    unit = load_course().unit(answer.exercise[:2])
    ns = dict(namespace_of(unit.solution).namespace)
    exec(compile(answer.source, f"<red team: {answer.title}>", "exec"), ns)  # noqa: S102 (course-written code)
    return ns


def verdict_of(answer):
    from grader.runner import run_check

    return run_check(answer.exercise, namespace=_namespace(answer))


def caught(answer, verdict) -> tuple[bool, str]:
    """Whether ``verdict`` shows ``answer`` caught as the corpus requires, and why not."""
    if verdict.points >= verdict.max_points or verdict.status == "passed":
        return False, f"earns {verdict.points}/{verdict.max_points}"
    if verdict.status != "failed":
        return False, f"status {verdict.status!r}, not a named failure:\n{verdict.render()}"
    if answer.bug is not None and verdict.bug_id != answer.bug:
        return False, f"named {verdict.bug_id!r}, expected {answer.bug!r}:\n{verdict.render()}"
    if answer.says is not None and not re.search(answer.says, verdict.render(), flags=re.IGNORECASE | re.DOTALL):
        return False, f"the message does not match /{answer.says}/:\n{verdict.render()}"
    return True, ""


@pytest.mark.parametrize("answer", ANSWERS, ids=[f"{a.exercise}:{a.title}" for a in ANSWERS])
def test_red_team_answer_loses_points_and_is_named(answer):
    verdict = verdict_of(answer)
    ok, why = caught(answer, verdict)
    if answer.open is not None:
        if verdict.points < verdict.max_points:
            pytest.fail(f"a hole listed as open is closed now ({why or 'caught'}): remove open= and give bug=/says=")
        pytest.xfail(f"open hole: {answer.open}")
    assert ok, why


def test_answer_names_exist():
    from grader.core import BUGS
    from grader.runner import load_unit

    wrong = []
    for a in ANSWERS:
        load_unit(a.exercise[:2])
        if a.bug is not None and a.bug not in {b.id for b in BUGS.get(a.exercise, [])}:
            wrong.append(f"{a.exercise} {a.title!r}: {a.bug} is not a catalogued bug of that exercise")
    assert not wrong, "\n".join(wrong)
