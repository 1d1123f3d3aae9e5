"""nbgrader round trip: release, a class of submissions, autograde, feedback, grades.

The submissions are made from the released unit-03 exercise notebook:

  correct   every stub filled with the reference answer                      -> 20
  stub      untouched                                                        -> 0
  mutant    correct, but scaled_dot_product_attention without 1/√d_k (B03.no_scale); SelfAttention
            and CausalSelfAttention call it, so they fail too                 -> 20 - 5 - 3 - 6 = 6
  syntax    correct, but the softmax_stable cell has a syntax error          -> 20 - 3 = 17
  loop      correct, but softmax_stable loops forever (cell timeout)         -> 17
  tampered  correct, one grade cell deleted and another retyped to `pass`    -> 20 (cells restored)
  crash     correct, but a cell kills the kernel                             -> 20 (the answers are graded by
            the checker, not in the kernel), reported, the run goes on
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import nbformat
import pytest

from llmcourse.grading import grade
from llmcourse.manifest import load_course

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.roundtrip, pytest.mark.slow]

EXPECTED = {"correct": 20, "stub": 0, "mutant": 6, "syntax": 17, "loop": 17, "tampered": 20, "crash": 20}


def _answers(solution) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in solution.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def _strip_markers(source: str) -> str:
    return "\n".join(ln for ln in source.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)


def _submission(exercise, answers, replace: dict[str, str] | None = None):
    nb = copy.deepcopy(exercise)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = (replace or {}).get(gid, _strip_markers(answers[gid]))
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory, course_copy):
    course = load_course(ROOT)
    unit = course.unit("03")
    exercise = nbformat.read(ROOT / unit.exercise, as_version=4)
    answers = _answers(nbformat.read(ROOT / unit.solution, as_version=4))
    no_scale = _strip_markers(answers["ex03_scaled_dot_product_attention_answer"]).replace(" / math.sqrt(d_k)", "")
    assert no_scale != _strip_markers(answers["ex03_scaled_dot_product_attention_answer"])
    subs = {
        "correct": _submission(exercise, answers),
        "stub": copy.deepcopy(exercise),
        "mutant": _submission(exercise, answers, {"ex03_scaled_dot_product_attention_answer": no_scale}),
        "syntax": _submission(exercise, answers, {"ex03_softmax_stable_answer": "def softmax_stable(x, dim=-1)\n    return x\n"}),
        "loop": _submission(exercise, answers, {"ex03_softmax_stable_answer":
                                                "def softmax_stable(x, dim=-1):\n    while True:\n        pass\n"}),
    }
    tampered = _submission(exercise, answers)
    tampered.cells = [c for c in tampered.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "ex03_SelfAttention"]
    for c in tampered.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == "ex03_CausalSelfAttention":
            c.source = "pass  # I did not like this test"
    subs["tampered"] = tampered
    crash = _submission(exercise, answers)
    crash.cells.insert(2, nbformat.v4.new_code_cell("import os\nos._exit(1)"))
    subs["crash"] = crash
    submitted = tmp_path_factory.mktemp("class") / "submitted"
    for student, nb in subs.items():
        folder = submitted / student / unit.name
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / Path(unit.exercise).name)
    out = tmp_path_factory.mktemp("grading")
    report = grade(submitted.parent, out_dir=out, cell_timeout=15, course=course_copy(("03",)))
    return report, out


def test_every_submission_is_graded_with_the_expected_score(graded):
    report, _ = graded
    scores = {r["student"]: r["score"] for r in report.rows}
    assert set(scores) == set(EXPECTED), report.render()
    for student, expected in EXPECTED.items():
        assert scores[student] == expected, f"{student}: {scores[student]} != {expected}\n{report.render()}"


def test_the_timeout_and_the_crash_are_reported(graded):
    report, _ = graded
    notes = {r["student"]: r["notes"] for r in report.rows}
    assert "timed out" in notes["loop"] or "errors" in notes["loop"], notes["loop"]
    assert notes["crash"], "a crashed submission must carry a note"


def test_grades_csv_has_totals_and_per_exercise_points(graded):
    report, _ = graded
    rows = {r["student"]: r for r in csv.DictReader(report.grades_csv.open())}
    assert float(rows["correct"]["score"]) == 20.0 and float(rows["correct"]["max_score"]) == 20.0
    assert float(rows["mutant"]["ex03_scaled_dot_product_attention"]) == 0.0
    assert float(rows["mutant"]["ex03_softmax_stable"]) == 3.0


def test_feedback_names_the_mutant_and_hides_the_checks(graded):
    _, out = graded
    feedback = sorted((out / ".grading" / "feedback").rglob("*.html"))
    students = {p.parts[-3] for p in feedback}
    assert {"correct", "stub", "mutant", "syntax", "loop", "tampered"} <= students
    for html_path in feedback:
        html = html_path.read_text(encoding="utf-8")
        for leak in ("BEGIN HIDDEN TESTS", "from grader import", "grader/checks", "grader/core", "def check_",
                     "t.compare", "BEGIN SOLUTION"):
            assert leak not in html, f"{html_path}: feedback shows {leak!r}"
    mutant = (out / ".grading" / "feedback" / "mutant" / "03_self_attention" / "03_self_attention.html").read_text()
    assert "B03.no_scale" in mutant and "Divide the scores by" in mutant
