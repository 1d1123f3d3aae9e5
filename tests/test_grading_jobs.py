"""``course grade --execute --jobs N``: the same scores, notes and verdicts as one job, one gradebook; the class script.

A small class of unit 03 generated from the solution and the bug catalog (right, partly right, wrong, broken;
seeded) plus two hostile submissions (one kernel kills nbgrader above it, one checking worker kills its own process
group) is graded with ``jobs=1`` and ``jobs=2``. Every score, exercise points, note and feedback
verdict must agree; the parallel run must leave one gradebook with every submission and no job folders.
"""

from __future__ import annotations

import copy
import re
import sqlite3
from pathlib import Path

import nbformat
import pytest
from hostile import hostile_code

from coursetools.bench.class_grading import KINDS, build_class, main
from coursetools.grading import grade

pytestmark = pytest.mark.slow


def _hostile_submission(course, unit, folder: Path, marks: Path, answer: str, kind: str) -> None:
    """The solution, with the function of ``answer`` running the attack ``kind`` first whenever it is called."""
    from coursetools.bench.class_grading import _answer_cells

    answers = _answer_cells(nbformat.read(course.root / unit.solution, as_version=4))
    nb = nbformat.read(course.root / unit.exercise, as_version=4)
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[gid]
            if gid == answer:
                cell.source = cell.source.replace("):\n", f"):\n    _hostile({kind!r})\n", 1)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first + 1, nbformat.v4.new_code_cell(hostile_code(marks)))
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / Path(unit.exercise).name)


def _verdict_lines(work: Path, row) -> list[str]:
    path = work / ".grading" / "autograded" / row["student"] / row["assignment"]
    out = []
    for nb_path in sorted(path.glob("*.ipynb")):
        for c in nbformat.read(nb_path, as_version=4).cells:
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"):
                out.append("".join(o.get("text", "") for o in c.get("outputs", [])))
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory, course_copy):
    course = course_copy(("03",))
    unit = course.unit("03")
    tmp = tmp_path_factory.mktemp("jobs")
    submitted = tmp / "submitted"
    kinds = build_class(unit, 6, submitted, seed=3, course=course)
    # nbgrader: the kernel kills nbgrader (the job's run ends, the rest go on); the checking worker is not harmed
    _hostile_submission(course, unit, submitted / "student998" / unit.name, tmp / "marks",
                        "ex03_softmax_stable_answer", "kill_parent")
    # the checking worker kills its own process group: that exercise is cut short (and run again alone)
    _hostile_submission(course, unit, submitted / "student999" / unit.name, tmp / "marks",
                        "ex03_simple_attention_answer", "kill_group")
    reports = {jobs: grade(submitted, out_dir=tmp / f"jobs{jobs}", cell_timeout=60, course=course, jobs=jobs,
                           execute=True) for jobs in (1, 2)}
    return kinds, reports, tmp, unit


def test_the_class_has_every_kind_and_different_scores(graded):
    kinds, reports, _, _ = graded
    assert set(kinds.values()) == set(KINDS), kinds
    scores = {r["student"]: r["score"] for r in reports[1].rows}
    assert len(set(scores.values())) >= 3, scores  # the comparison below can fail
    assert any(s == r["max_score"] for r in reports[1].rows for s in [r["score"]]), scores
    notes = {r["student"]: r["notes"] for r in reports[1].rows}
    assert "stopped the grading process in nbgrader" in notes["student998"], notes["student998"]
    assert scores["student999"] < reports[1].rows[0]["max_score"], "the attacked exercise must lose its points"


def test_two_jobs_give_the_same_scores_notes_and_verdicts(graded):
    _, reports, tmp, _ = graded
    one = {(r["student"], r["assignment"]): r for r in reports[1].rows}
    two = {(r["student"], r["assignment"]): r for r in reports[2].rows}
    assert one.keys() == two.keys()
    for key in one:
        a, b = one[key], two[key]
        assert (a["score"], a["per_exercise"]) == (b["score"], b["per_exercise"]), key
        assert a["notes"] == b["notes"], (key, a["notes"], b["notes"])
        assert _verdict_lines(tmp / "jobs1", a) == _verdict_lines(tmp / "jobs2", b), key


def test_two_jobs_leave_one_gradebook_and_every_feedback(graded):
    _, reports, tmp, unit = graded
    work = tmp / "jobs2"
    assert not list((work / ".grading" / "jobs").glob("*")), "the jobs' copies are removed once recorded"
    with sqlite3.connect(work / ".grading" / "gradebook.db") as db:
        rows = db.execute("select student.id, sum(coalesce(grade.auto_score, 0)) from grade "
                          "join submitted_notebook on grade.notebook_id = submitted_notebook.id "
                          "join submitted_assignment on submitted_notebook.assignment_id = submitted_assignment.id "
                          "join student on submitted_assignment.student_id = student.id group by student.id").fetchall()
    assert dict(rows) == {r["student"]: r["score"] for r in reports[2].rows}
    html = Path(unit.exercise).with_suffix(".html").name
    for r in reports[2].rows:
        one = (tmp / "jobs1" / ".grading" / "feedback" / r["student"] / r["assignment"] / html).read_text()
        two = (work / ".grading" / "feedback" / r["student"] / r["assignment"] / html).read_text()
        verdicts = lambda text: re.findall(r"\d+/\d+ points|not attempted|passed|failed", text)  # noqa: E731
        assert verdicts(one) == verdicts(two), r["student"]


def test_the_class_script_runs(course_copy, capsys):
    course = course_copy(("03",))
    assert main(["03", "--students", "3", "--jobs", "1", "2", "--paths", "saved", "executed", "--course",
                 str(course.root), "--no-kernel-probe"]) == 0
    out = capsys.readouterr().out
    assert "class of 3 submissions of unit 03" in out
    assert re.search(r"saved, --jobs 1: [\d.]+ s total, [\d.]+ s per submission, peak RSS [\d,]+ MiB", out), out
    for run in ("saved, --jobs 2:", "executed, --jobs 1:", "executed, --jobs 2:"):
        assert run in out, out
    assert out.count("same scores and verdicts as the first run: True") == 4, out
    assert "nbgrader autograde" in out and "checks (course checker)" in out and "total (wall clock)" in out, out
    assert "nbgrader record (notebooks as saved)" in out, out
