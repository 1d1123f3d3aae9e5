"""The class report of a real ``course grade`` run equals what was planted: a seeded class of unit 03
(``coursetools.bench.class_grading.build_class``: right, partly right, wrong with catalogued mutants, broken) plus
hostile submissions is graded once per session; the report's named mistakes are exactly the planted mutants, student
by student and in their counts, each with its lesson section; the broken and hostile submissions appear as errors
or limits; nothing of the checks or the solution reaches the report's files.

The class has ``LLMCOURSE_REPORT_CLASS`` students (default 12, a few minutes; the issue's class of 60 is the same
test with ``LLMCOURSE_REPORT_CLASS=60``).
"""

from __future__ import annotations

import copy
import json
import os
from collections import Counter
from pathlib import Path

import nbformat
import pytest
from hostile import hostile_code

pytestmark = pytest.mark.slow

STUDENTS = int(os.environ.get("LLMCOURSE_REPORT_CLASS", "12"))
SEED = 0


def _hostile_submission(course, unit, folder: Path, marks: Path, answer: str, kind: str) -> None:
    """The solution, with the function of ``answer`` running the attack ``kind`` whenever it is called."""
    from coursetools.bench.class_grading import _answer_cells

    answers = _answer_cells(nbformat.read(course.root / unit.solution, as_version=4))
    nb = copy.deepcopy(nbformat.read(course.root / unit.exercise, as_version=4))
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


def planted_exercises(course, unit, submitted: Path, planted: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """``{student: {exercise id: planted bug id}}``: the answer cell whose code ends with the planted mutant's code,
    written as ``build_class`` writes it (a cell with two mutants keeps the later: planted lists only that one)."""
    from coursetools.bench.class_grading import _answer_cells, _bound_names, mutant_source
    from grader.core import BUGS

    solution = nbformat.read(course.root / unit.solution, as_version=4)
    code = [c.source for c in solution.cells if c.cell_type == "code"]
    available = _bound_names(code)
    by_cell = {f"{e.grade_id}_answer": e.id for e in unit.exercises}
    assert _answer_cells(solution).keys() <= by_cell.keys()
    out = {}
    for student, planted_ids in planted.items():
        nb = nbformat.read(submitted / student / unit.name / Path(unit.exercise).name, as_version=4)
        cells = {by_cell[c.metadata["nbgrader"]["grade_id"]]: c.source for c in nb.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
        got = {}
        for bug_id in set(planted_ids):  # one mistake may be catalogued (and planted) for several exercises
            where = []
            for ex, src in cells.items():
                for b in BUGS.get(ex, []):
                    parts = [mutant_source(obj, name, available, code) for name, obj in b.impl.items()]
                    if b.id == bug_id and all(parts) and src.endswith("\n\n".join(parts)):
                        where.append(ex)
            assert len(where) == planted_ids.count(bug_id), (student, bug_id, where)
            got.update(dict.fromkeys(where, bug_id))
        out[student] = got
    return out


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory, course_copy):
    from coursetools.bench.class_grading import build_class
    from coursetools.grading import grade

    course = course_copy(("03",))
    unit = course.unit("03")
    tmp = tmp_path_factory.mktemp("report-class")
    submitted = tmp / "submitted"
    planted: dict[str, list[str]] = {}
    kinds = build_class(unit, STUDENTS, submitted, seed=SEED, course=course, planted=planted)
    where = planted_exercises(course, unit, submitted, planted)
    # a checking worker that kills its own process group: that exercise is cut short, never a crash of the run
    _hostile_submission(course, unit, submitted / "student999" / unit.name, tmp / "marks",
                        "ex03_simple_attention_answer", "kill_group")
    report = grade(submitted, out_dir=tmp / "run", cell_timeout=60, course=course, jobs=1)
    return course, unit, kinds, where, report, tmp / "run"


def _summary(work: Path) -> dict:
    return json.loads((work / "report.json").read_text(encoding="utf-8"))


def test_the_report_was_written_by_the_grading_run(graded_class):
    _, unit, kinds, _, report, work = graded_class
    assert report.class_report == work / "report.html", report.class_report
    a = _summary(work)["assignments"][unit.name]
    assert a["students"] == len(kinds) + 1
    assert {"right", "wrong", "partly right", "broken"} <= set(kinds.values()), kinds  # the counts below can fail


def check_planted(unit, kinds: dict, where: dict, summary: dict) -> list[str]:
    """The report against the planted mistakes (see the test below); returns the cascades it allows, one line each.

    Exact: each planted mistake is named, under its own exercise, for its student; the report's count of each
    (exercise, mistake) among the planted exercises equals the planted count; no mistake is named for a right or
    partly right submission. Allowed, and returned: a named mistake in a LATER exercise of a wrong or broken
    submission (its class calls the student's own earlier function: the unit's checks charge the earlier mistake
    again, or name the NameError of a definition that did not parse).
    """
    from grader.core import bug_name

    a = summary["assignments"][unit.name]
    order = [e.id for e in unit.exercises]
    heat = {r["student"]: r["cells"] for r in a["heat_map"]}
    named = {(ex, m["mistake"]): set(students) for m in a["named_mistakes"] for ex, students in
             m["by_exercise"].items()}
    got_planted = Counter()
    cascades = []
    for (ex, mistake), students in sorted(named.items()):
        for s in sorted(students):
            if where.get(s, {}).get(ex) and bug_name(where[s][ex]) == mistake:
                got_planted[(ex, mistake)] += 1
                continue
            kind = kinds.get(s, "hostile")
            first = min((order.index(e) for e in where.get(s, {})), default=None)
            if kind == "broken":
                first = min((order.index(e) for e, c in heat[s].items() if c == "error or limit"), default=None)
            assert kind in ("wrong", "broken") and first is not None and order.index(ex) > first, \
                (s, kind, ex, mistake, where.get(s), heat[s])
            cascades.append(f"{s} ({kind}, planted {where.get(s) or 'none'}): {mistake} named in {ex}")
    want = Counter((ex, bug_name(b)) for s in where.values() for ex, b in s.items())
    assert got_planted == want, (got_planted, want)
    for s, exs in where.items():
        for ex in exs:
            assert heat[s][ex] == "failed, named", (s, ex, heat[s])
    return cascades


def test_the_named_mistakes_are_exactly_the_planted_ones(graded_class):
    from coursetools.sections import section_of
    from grader.core import BUGS, bug_name

    _, unit, kinds, where, _, work = graded_class
    summary = _summary(work)
    cascades = check_planted(unit, kinds, where, summary)
    assert sum(len(x) for x in where.values()) >= 3, where  # the class has wrong answers to count
    if cascades:
        print("named in a later exercise (the unit's checks charge an earlier answer again):", *cascades, sep="\n  ")
    a = summary["assignments"][unit.name]
    counts = [len(m["students"]) for m in a["named_mistakes"]]
    assert counts == sorted(counts, reverse=True)  # ranked, each student once per mistake
    by_name = {bug_name(b.id): b.id for e in unit.exercises for b in BUGS.get(e.id, [])}
    for m in a["named_mistakes"]:
        for ex in m["exercises"]:
            assert by_name[m["mistake"]] in {b.id for b in BUGS.get(ex, [])}, m
        assert m["section"] and m["section"] == section_of(by_name[m["mistake"]]), m  # the checkout's lessons


def test_each_kind_of_submission_has_its_cells(graded_class):
    _, unit, kinds, _, _, work = graded_class
    heat = {r["student"]: r for r in _summary(work)["assignments"][unit.name]["heat_map"]}
    for student, kind in kinds.items():
        cells = set(heat[student]["cells"].values())
        if kind == "right":
            assert cells == {"passed"}, (student, cells)
        elif kind == "partly right":
            assert "not attempted" in cells and cells <= {"passed", "not attempted"}, (student, cells)
        elif kind == "wrong":
            assert "failed, named" in cells, (student, cells)
        else:  # broken: a notebook that does not load, or an answer cell that does not parse; not a crash
            assert "error or limit" in cells, (student, cells)


def test_a_hostile_submission_is_an_error_not_a_crash(graded_class):
    _, unit, _, _, _, work = graded_class
    s = _summary(work)
    row = next(r for r in s["assignments"][unit.name]["heat_map"] if r["student"] == "student999")
    assert row["cells"]["03.simple_attention"] in ("error or limit", "failed"), row
    assert row["cells"]["03.softmax_stable"] == "passed", row  # one attack costs its exercise
    page = (work / "report.html").read_text(encoding="utf-8")
    assert "student999" in page and page.count("<figure class='plot'") == 3 and "plot not drawn" not in page


def _hidden_lines(course, unit) -> set[str]:
    """Distinctive lines of the unit's checks, bug catalog and solution answers: none may reach the report."""
    from coursetools.bench.class_grading import _answer_cells

    texts = [p.read_text(encoding="utf-8") for p in (course.root / "grader" / "checks").glob(f"u{unit.id}_*.py")]
    texts += [p.read_text(encoding="utf-8") for p in (course.root / "grader" / "bugs").glob(f"u{unit.id}_*.py")]
    texts += list(_answer_cells(nbformat.read(course.root / unit.solution, as_version=4)).values())
    lines = set()
    for text in texts:
        for line in text.splitlines():
            line = line.strip()
            if len(line) >= 30 and not line.startswith(("#", '"', "'", "from ", "import ")) and ("(" in line or
                                                                                                 "=" in line):
                lines.add(line)
    return lines


def test_nothing_of_the_checks_or_the_solution_reaches_the_report(graded_class):
    course, unit, _, _, _, work = graded_class
    hidden = _hidden_lines(course, unit)
    assert len(hidden) > 50, len(hidden)  # the scan has something to find
    for name in ("report.html", "report.json", "report-exercises.csv", "report-mistakes.csv",
                 "report-students.csv"):
        text = (work / name).read_text(encoding="utf-8")
        leaked = sorted(line for line in hidden if line in text)
        assert not leaked, (name, leaked[:5])
        assert "B03." not in text and "BEGIN SOLUTION" not in text, name
