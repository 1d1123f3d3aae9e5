"""``course grade`` without re-execution (the default) against ``course grade --execute`` (issue 44).

A small seeded class of unit 03 (right, partly right, wrong and broken notebooks from the solution and the bug
catalog; two named mistakes planted, one the wrong alternative of a decision, so that their hints reach a feedback
page) plus hostile submissions: a kernel that kills nbgrader above it (only the executing path runs it), a checking worker that kills
its own process group (cut short, checked again alone), a submission whose check writes into the grading code, and a
notebook saved with outputs of its own (a forged verdict in a grade cell, a huge print, text that imitates the
grader). It is graded twice, with ``jobs=2``: as saved and executed.

Equal in both: every score and exercise's points, every note that is not about the notebook's run or outputs (the
executing path's others are each one of the run's known forms), each grade cell's verdict text in the graded
notebook, and that verdict text in the feedback page. The saved path starts no kernel and its feedback shows the
outputs the student saved (capped, the forged verdict replaced). Every feedback page passes the leak scan: no hidden
check source, no solution markers, no catalogue ids, and no withheld form of a decision (``grader.strength.leaks``)
in what the course wrote into it (everything but the student's answer cells).
"""

from __future__ import annotations

import copy
import html
import re
from pathlib import Path

import nbformat
import pytest
from test_grading_jobs import _hostile_submission
from test_grading_tamper import _tamperer

from coursetools.bench.class_grading import _answer_cells, _bound_names, build_class, mutant_source
from coursetools.grading import OUTPUT_CAP_CHARS, TAMPER_NOTE, grade
from grader.worker import NOBODY_ENV

pytestmark = pytest.mark.slow

FORGED = "03.softmax_stable: PASSED (99/99 points)"
IMITATION = "from grader import grade  # grader/checks/u03_self_attention.py BEGIN HIDDEN TESTS"


def _planted(course, unit, folder: Path, bug_ids: list[str]) -> None:
    """The solution with each catalogued mutant of ``bug_ids`` defined after its answer (so it is the one in force)."""
    from grader.core import BUGS
    from grader.runner import load_unit

    load_unit(unit.id)
    solution = nbformat.read(course.root / unit.solution, as_version=4)
    answers = _answer_cells(solution)
    code = [c.source for c in solution.cells if c.cell_type == "code"]
    for e in unit.exercises:
        for b in BUGS.get(e.id, []):
            if b.id in bug_ids:
                parts = [mutant_source(obj, name, _bound_names(code), code) for name, obj in b.impl.items()]
                assert parts and all(parts), b.id
                answers[f"{e.grade_id}_answer"] += "\n\n\n" + "\n\n".join(parts)
    nb = copy.deepcopy(nbformat.read(course.root / unit.exercise, as_version=4))
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / Path(unit.exercise).name)


def _saved_outputs(course, unit, folder: Path) -> None:
    """Every answer right, saved with outputs: a forged verdict in each grade cell, a huge print, grader imitation."""
    answers = _answer_cells(nbformat.read(course.root / unit.solution, as_version=4))
    nb = copy.deepcopy(nbformat.read(course.root / unit.exercise, as_version=4))
    first = True
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = answers[meta["grade_id"]]
        if cell.cell_type != "code":
            continue
        if meta.get("grade"):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=FORGED + "\n")]
        elif first:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * (3 * OUTPUT_CAP_CHARS)),
                            nbformat.v4.new_output("stream", name="stdout", text=IMITATION + "\n")]
            first = False
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / Path(unit.exercise).name)


@pytest.fixture(scope="module")
def both(tmp_path_factory, course_copy):
    course = course_copy(("03",))
    unit = course.unit("03")
    tmp = tmp_path_factory.mktemp("saved")
    submitted = tmp / "submitted"
    build_class(unit, 4, submitted, seed=7, course=course)
    _planted(course, unit, submitted / "named" / unit.name, ["B03.naive_softmax", "B03.scale_dk"])
    _saved_outputs(course, unit, submitted / "saved_outputs" / unit.name)
    _hostile_submission(course, unit, submitted / "kernel_kills_nbgrader" / unit.name, tmp / "marks",
                        "ex03_softmax_stable_answer", "kill_parent")
    _hostile_submission(course, unit, submitted / "worker_kills_group" / unit.name, tmp / "marks",
                        "ex03_simple_attention_answer", "kill_group")
    _tamperer(course, unit, submitted / "tamperer" / unit.name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(NOBODY_ENV, "0")  # the workers can write into the checker's copy (see test_grading_tamper.py)
        saved = grade(submitted, out_dir=tmp / "saved", cell_timeout=60, course=course, jobs=2)
        executed = grade(submitted, out_dir=tmp / "executed", cell_timeout=60, course=course, jobs=2, execute=True)
    return course, unit, tmp, saved, executed


def _rows(report) -> dict:
    return {(r["student"], r["assignment"]): r for r in report.rows}


def _verdict_lines(work: Path, key) -> list[str]:
    path = work / ".grading" / "autograded" / key[0] / key[1]
    return ["".join(o.get("text", "") for o in c.get("outputs", []))
            for nb_path in sorted(path.glob("*.ipynb")) for c in nbformat.read(nb_path, as_version=4).cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]


def _feedback(work: Path, key, unit, raw: bool = False) -> str:
    """The feedback page's HTML; unless ``raw``, with its character references resolved (``&#39;`` is ``'``, as a
    browser shows it: for finding text, never for parsing)."""
    page = (work / ".grading" / "feedback" / key[0] / key[1] / f"{unit.name}.html").read_text(encoding="utf-8")
    return page if raw else html.unescape(page)


# the executing path's notes about the run: each is one of these forms (so no other note can hide among them)
RUN_NOTE_FORMS = (r"in nbgrader \(", r"^\d+ cell\(s\) (raised errors|timed out)$", r"^it was recorded in nbgrader "
                  r"without running it$", r"^printed output over [\d,]+ characters per cell was cut")


def test_the_class_is_mixed_and_both_paths_grade_every_submission(both):
    _, _, _, saved, executed = both
    assert _rows(saved).keys() == _rows(executed).keys() and len(saved.rows) == 9
    scores = {r["student"]: r["score"] for r in saved.rows}
    assert len(set(scores.values())) >= 3 and scores["saved_outputs"] == 20, scores  # the comparison can fail
    assert scores["tamperer"] == 0 and TAMPER_NOTE in _rows(saved)[("tamperer", "03_self_attention")]["notes"]
    notes = {r["student"]: r["notes"] for r in executed.rows}
    assert "stopped the grading process in nbgrader" in notes["kernel_kills_nbgrader"], notes
    assert not saved.executed and executed.executed


def test_scores_points_and_the_notes_not_about_the_run_are_equal(both):
    _, _, _, saved, executed = both
    one, two = _rows(saved), _rows(executed)
    for key, s in one.items():
        e = two[key]
        assert (s["score"], s["per_exercise"]) == (e["score"], e["per_exercise"]), key
        for note in e["run_notes"]:
            assert any(re.search(f, note) for f in RUN_NOTE_FORMS), (key, note)
        kept = [n for n in e["note_list"] if n not in e["run_notes"]]
        assert [n for n in s["note_list"] if n not in s["run_notes"]] == kept, (key, s["note_list"], e["note_list"])
        assert s["notes"] == "; ".join(s["note_list"]) and e["notes"] == "; ".join(e["note_list"])
    assert any(r["run_notes"] for r in executed.rows), "the executing path reports on its run"
    # the saved path runs nothing: its only run note is a saved output that was cut
    assert {k: r["run_notes"] for k, r in one.items() if r["run_notes"]} == {
        ("saved_outputs", "03_self_attention"): [f"printed output over {OUTPUT_CAP_CHARS:,} characters per cell was "
                                                 "cut in the graded notebook and the feedback"]}


def test_the_verdicts_in_the_graded_notebook_and_the_feedback_are_equal(both):
    _, unit, tmp, saved, _ = both
    for key in _rows(saved):
        lines = _verdict_lines(tmp / "saved", key)
        assert lines and lines == _verdict_lines(tmp / "executed", key), key
        page, other = _feedback(tmp / "saved", key, unit), _feedback(tmp / "executed", key, unit)
        for line in lines:
            for text in line.strip().splitlines():
                assert text in page and text in other, (key, text)
        headers = _headers("".join(lines))  # "03.x: FAILED (0/3 points)", one per grade cell
        assert len(headers) == len(lines) and _headers(page) == _headers(other) == headers, key


def _headers(page: str) -> list[str]:
    return re.findall(r"\d\d\.\w+: (?:passed|FAILED|FAILED \(missing\)|not attempted|ERROR \(grader\)|not graded) "
                      r"\([\d.]+/[\d.]+ points\)", page)


def test_the_saved_path_shows_the_saved_outputs_with_the_checkers_verdicts(both):
    _, unit, tmp, saved, _ = both
    key = ("saved_outputs", unit.name)
    page = _feedback(tmp / "saved", key, unit)
    assert FORGED not in page and "99/99" not in page
    assert "xxxxxxxxxx" in page and "[output cut" in page, "the saved print is shown, cut"
    assert (tmp / "saved" / ".grading" / "feedback" / key[0] / key[1] / f"{unit.name}.html").stat().st_size < 1_500_000
    assert "nbgrader autograde" not in saved.timings and "nbgrader record (notebooks as saved)" in saved.timings


def _course_text(page: str, nb) -> str:
    """The text of a feedback page without the student's code: the answer cells and the cells the student added (no
    nbgrader metadata; e.g. the tamperer's own code names grader files), found by their code as the page shows it."""
    from bs4 import BeautifulSoup

    flat = lambda text: re.sub(r"\s+", " ", text).strip()  # noqa: E731
    answers = {flat(c.source) for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")}
    added = {flat(c.source) for c in nb.cells if c.cell_type == "code" and "nbgrader" not in c.metadata}
    soup = BeautifulSoup(page, "html.parser")
    removed = 0
    for area in soup.select("div.input_area"):
        if flat(area.get_text()) in answers | added:
            area.decompose()
            removed += 1
    assert removed >= len(answers), (removed, len(answers))  # every answer cell found: the scan can fail
    return soup.get_text()


def test_every_feedback_page_passes_the_leak_scan(both):
    from grader.runner import load_unit
    from grader.strength import DECISIONS, leaks

    _, unit, tmp, saved, _ = both
    load_unit(unit.id)
    decisions = [d for e in unit.exercises for d in DECISIONS.get(e.id, [])]
    assert len(decisions) >= 2
    for run in ("saved", "executed"):
        for key in _rows(saved):
            page = _feedback(tmp / run, key, unit, raw=True)
            graded = nbformat.read(tmp / run / ".grading" / "autograded" / key[0] / key[1] / f"{unit.name}.ipynb",
                                   as_version=4)
            text = _course_text(page, graded)  # what the course wrote: the student's own code may say anything
            for leak in ("BEGIN HIDDEN TESTS", "from grader import", "grader/checks", "grader/core", "def check_",
                         "t.compare", "BEGIN SOLUTION", "B03."):
                assert leak not in text, f"{run} {key}: feedback shows {leak!r}"
            if key[0] != "tamperer":
                assert "grader/checks" not in page and "BEGIN HIDDEN TESTS" not in page, (run, key)
            assert not leaks(decisions, {f"{run} feedback of {key[0]}": text}), leaks(decisions, {key[0]: text})
    tamperer = _feedback(tmp / "saved", ("tamperer", unit.name), unit)
    assert f"not graded (0/3 points): {TAMPER_NOTE}" in tamperer, "the tamperer's feedback says why it scored 0"
    named = _feedback(tmp / "saved", ("named", unit.name), unit)  # named mistakes, with their hints
    assert "Diagnosis: naive_softmax" in named and "Diagnosis: scale_dk" in named, "the planted are named"


def test_the_gradebook_holds_the_checkers_scores_in_both_paths(both):
    import sqlite3

    _, _, tmp, saved, executed = both
    for run, report in (("saved", saved), ("executed", executed)):
        with sqlite3.connect(tmp / run / ".grading" / "gradebook.db") as db:
            rows = db.execute(
                "SELECT student.id, SUM(COALESCE(grade.auto_score, 0)), COUNT(grade.manual_score) FROM grade "
                "JOIN submitted_notebook ON grade.notebook_id = submitted_notebook.id "
                "JOIN submitted_assignment ON submitted_notebook.assignment_id = submitted_assignment.id "
                "JOIN student ON submitted_assignment.student_id = student.id GROUP BY student.id").fetchall()
        assert {s: total for s, total, _ in rows} == {r["student"]: r["score"] for r in report.rows}, run
        assert all(manual == 0 for _, _, manual in rows), run  # the forged outputs earned nothing
        assert not list((tmp / run / ".grading" / "jobs").glob("*")), "the jobs' copies are removed once merged"
