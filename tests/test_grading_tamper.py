"""A submission that writes into the grading code costs only itself (issue 43).

Fast: the snapshot's bookkeeping (:class:`coursetools.grading.GradingSnapshot`: what changed where, fresh copies,
the checkout never written, restore advice only for the checkout) and the CLI's answer when the grading itself
cannot go on (one line, exit 1).

Slow (three ``course grade`` runs of unit 03): a class of three ordinary submissions (generated from the solution
and the bug catalog) graded alone, then with one submission whose check appends to ``grader/core.py``, the unit's
checks and ``course.toml`` and plants a file beside them, with ``jobs=1`` (the API) and ``jobs=2`` (the CLI).
The others' scores, notes and verdicts equal the clean run's; the tamperer scores 0 with the note; the run ends
with exit 0 and one summary line for it; the checkout is unchanged, so no restore is asked for. The run's class
report (coursetools/report.py, issue 42) names the planted mistakes and shows the tamperer.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import shutil
from pathlib import Path

import nbformat
import pytest

from coursetools.grading import TAMPER_NOTE, GradingSnapshot, GradingTampered, _tree_digest
from grader.worker import NOBODY_ENV


def _mini_course(root: Path) -> Path:
    for rel, text in {"grader/core.py": "X = 1\n", "grader/checks/u01.py": "Y = 2\n", "llmcourse/__init__.py": "",
                      "course.toml": "[course]\n", "assets/data.bin": "abc"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_changed_copy_is_named_and_replaced_and_the_checkout_is_never_written(tmp_path):
    root = _mini_course(tmp_path / "course")
    before = _tree_digest(root)
    snap = GradingSnapshot(root)
    try:
        assert snap.check("at first") is None
        first = snap.path
        with open(first / "grader" / "core.py", "a") as fh:
            fh.write("# every check passes now\n")
        (first / "grader" / "checks" / "planted.py").write_text("Z = 3\n")
        change = snap.check("while a submission ran")
        assert change is not None and change.checkout == []
        assert change.copies == ["(checker copy) grader/checks/planted.py", "(checker copy) grader/core.py"]
        assert "while a submission ran" in str(change)
        snap.repair()
        assert snap.path != first and _tree_digest(snap.path) == before
        assert snap.check("after the repair") is None
        (snap.path / "grader" / "__pycache__").mkdir()  # the checkers write no bytecode: a .pyc is planted
        (snap.path / "grader" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0" * 16)
        change = snap.check("while another submission ran")
        assert change.copies == ["(checker copy) grader/__pycache__/core.cpython-311.pyc"], change
        snap.repair()
        assert snap.check("after the second repair") is None
        assert snap.nbgrader_root == root and snap.restore_advice() is None  # the checkout never changed
        assert _tree_digest(root) == before
    finally:
        snap.cleanup()
    assert not snap.path.exists()


def test_a_changed_checkout_is_reported_once_and_nbgrader_moves_to_a_verified_copy(tmp_path):
    root = _mini_course(tmp_path / "course")
    snap = GradingSnapshot(root)
    try:
        (root / "course.toml").write_text("[course]\nhacked = true\n")
        change = snap.check("while a submission ran")
        assert change is not None and change.checkout == ["course.toml"] and change.copies == []
        assert snap.check("later") is None  # seen once: the next change is someone else's
        snap.repair()
        copy_root = snap.nbgrader_root
        assert copy_root != root and (copy_root / "course.toml").read_text() == "[course]\n"
        assert (root / "course.toml").read_text() == "[course]\nhacked = true\n"  # reported, not restored
        advice = snap.restore_advice()
        assert "course.toml" in advice and "git checkout" in advice
        (copy_root / "grader" / "core.py").write_text("X = 99\n")  # a kernel writes into nbgrader's copy
        change = snap.check("while nbgrader ran")
        assert change.copies == ["(nbgrader copy) grader/core.py"]
        snap.repair()
        assert (snap.nbgrader_root / "grader" / "core.py").read_text() == "X = 1\n"
    finally:
        snap.cleanup()


def test_when_the_grading_cannot_go_on_the_cli_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    import coursetools.grading as grading
    from coursetools.cli import main

    def fails(*args, **kwargs):
        raise GradingTampered("course grade stopped: a fresh copy of the grading code changed while it was written")

    monkeypatch.setattr(grading, "grade", fails)
    (tmp_path / "alice" / "03_self_attention").mkdir(parents=True)
    assert main(["grade", str(tmp_path), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fresh copy" in err[0] and "Traceback" not in err[0], err


# ------------------------------------------------------------------------------ a class with one tamperer

TAMPER = """\
def _tamper():
    import grader
    from pathlib import Path
    root = Path(grader.__file__).resolve().parents[1]
    for rel in ("grader/core.py", "grader/checks/u03_self_attention.py", "course.toml"):
        try:
            with open(root / rel, "a") as fh:
                fh.write("\\n# every check passes now\\n")
        except OSError:
            pass
    try:
        (root / "grader" / "checks" / "zz_planted.py").write_text("PLANTED = True\\n")
    except OSError:
        pass
"""


def _tamperer(course, unit, folder: Path) -> None:
    """Every answer right (so a 0 is the cost of tampering); softmax_stable writes into the grading code when called
    (the checker runs a notebook's definitions and imports, and the answers when it calls them)."""
    from coursetools.bench.class_grading import _answer_cells

    answers = _answer_cells(nbformat.read(course.root / unit.solution, as_version=4))
    nb = copy.deepcopy(nbformat.read(course.root / unit.exercise, as_version=4))
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[gid]
            if gid == "ex03_softmax_stable_answer":
                cell.source = cell.source.replace("):\n", "):\n    _tamper()\n", 1)
                assert "_tamper()" in cell.source
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first + 1, nbformat.v4.new_code_cell(TAMPER))
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / Path(unit.exercise).name)


def _verdict_lines(work: Path, student: str, assignment: str) -> list[str]:
    out = []
    for nb_path in sorted((work / ".grading" / "autograded" / student / assignment).glob("*.ipynb")):
        for c in nbformat.read(nb_path, as_version=4).cells:
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"):
                out.append("".join(o.get("text", "") for o in c.get("outputs", [])))
    return out


@pytest.fixture(scope="module")
def tampered_class(tmp_path_factory, course_copy):
    from coursetools.bench.class_grading import build_class
    from coursetools.cli import main
    from coursetools.grading import grade

    course = course_copy(("03",))
    unit = course.unit("03")
    tmp = tmp_path_factory.mktemp("tamper")
    clean = tmp / "clean" / "submitted"
    planted: dict[str, list[str]] = {}
    build_class(unit, 3, clean, seed=5, course=course, planted=planted)
    submitted = tmp / "class" / "submitted"
    shutil.copytree(clean, submitted)
    _tamperer(course, unit, submitted / "tamperer" / unit.name)
    checkout = _tree_digest(course.root)
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        # the checking workers run as the grading user, as when an ordinary user grades: as `nobody` (grading as
        # root) they could not write into the checker's copy, and the change would be made by nbgrader's kernel
        mp.setenv(NOBODY_ENV, "0")
        # executed in nbgrader (the path with the most places to tamper; the default path, the notebooks as saved,
        # is graded with a tamperer in test_grading_saved.py)
        runs = {"clean": grade(clean, out_dir=tmp / "clean-run", cell_timeout=60, course=course, execute=True),
                "jobs1": grade(submitted, out_dir=tmp / "jobs1", cell_timeout=60, course=course, execute=True)}
        mp.setenv("LLMCOURSE_ROOT", str(course.root))  # the CLI grades with the private copy's grading code
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["grade", str(submitted), "--out", str(tmp / "jobs2"), "--timeout", "60", "--jobs", "2",
                       "--execute", "--quiet"])
    cli = {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}
    return course, unit, tmp, runs, cli, checkout, planted


@pytest.mark.slow
def test_the_tamperer_scores_zero_with_the_note_and_the_others_as_in_a_clean_run(tampered_class):
    course, unit, tmp, runs, _, checkout, _ = tampered_class
    clean = {r["student"]: r for r in runs["clean"].rows}
    got = {r["student"]: r for r in runs["jobs1"].rows}
    assert set(got) == set(clean) | {"tamperer"}
    assert len({r["score"] for r in clean.values()}) >= 2, clean  # the comparison below can fail
    for student, want in clean.items():
        have = got[student]
        assert (have["score"], have["per_exercise"], have["notes"]) == \
            (want["score"], want["per_exercise"], want["notes"]), student
        assert _verdict_lines(tmp / "jobs1", student, unit.name) == _verdict_lines(tmp / "clean-run", student,
                                                                                   unit.name), student
    t = got["tamperer"]
    assert t["score"] == 0 and set(t["per_exercise"].values()) == {0.0}, t
    assert TAMPER_NOTE in t["notes"] and "grader/core.py" in t["notes"], t["notes"]
    lines = runs["jobs1"].tampering
    assert len(lines) == 1 and "tamperer/03_self_attention" in lines[0] and TAMPER_NOTE in lines[0], lines
    assert "while the checker ran tamperer" in lines[0], lines  # caught in its check: never run in nbgrader
    assert "recorded in nbgrader without running it" in t["notes"], t["notes"]
    assert "git checkout" not in runs["jobs1"].render()  # only the copy changed: nothing to restore
    assert _tree_digest(course.root) == checkout and not (course.root / "grader/checks/zz_planted.py").exists()


@pytest.mark.slow
def test_the_class_report_is_written_and_shows_the_tamperer(tampered_class):
    import json

    from grader.core import bug_name

    _, _, tmp, runs, _, _, planted = tampered_class
    summary = json.loads((tmp / "jobs1" / "report.json").read_text(encoding="utf-8"))
    named = {m["mistake"]: m["students"] for m in summary["assignments"]["03_self_attention"]["named_mistakes"]}
    assert planted, "the seeded class has a wrong submission"
    for student, bugs in planted.items():  # every planted mistake is in the report, named, with its student
        for b in bugs:
            assert student in named.get(bug_name(b), []), (student, b, named)
    assert summary["tampering"] == runs["jobs1"].tampering
    heat = {r["student"]: r for r in summary["assignments"]["03_self_attention"]["heat_map"]}
    assert set(heat["tamperer"]["cells"].values()) == {"error or limit"}, heat["tamperer"]
    assert heat["tamperer"]["limits"] == ["modified the grading code"]
    for r in runs["jobs1"].rows:  # the report's scores are the run's
        assert heat[r["student"]]["score"] == r["score"]
    assert str(runs["jobs1"].class_report).endswith("report.html") and (tmp / "jobs1" / "report.html").exists()
    from coursetools.cli import main

    (tmp / "jobs1" / "report.html").unlink()
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", str(tmp / "jobs1")]) == 0  # again, from the run's record
    assert (tmp / "jobs1" / "report.html").exists()


@pytest.mark.slow
def test_two_jobs_keep_the_guarantee_and_the_cli_exits_zero_with_one_line(tampered_class):
    course, _, tmp, runs, cli, checkout, _ = tampered_class
    assert cli["rc"] == 0 and "Traceback" not in cli["out"] + cli["err"], cli
    tampered = [ln for ln in cli["out"].splitlines() if ln.startswith("TAMPERED")]
    assert len(tampered) == 1 and "tamperer/03_self_attention" in tampered[0], cli["out"]
    assert "git checkout" not in cli["out"] + cli["err"], cli["out"]
    with (tmp / "jobs2" / "grades.csv").open(newline="", encoding="utf-8") as fh:
        rows = {r["student"]: r for r in csv.DictReader(fh)}
    for r in runs["clean"].rows:
        have = rows[r["student"]]
        assert float(have["score"]) == r["score"] and have["notes"] == r["notes"], (r["student"], have, r)
        assert {g: float(have[g]) for g in r["per_exercise"]} == r["per_exercise"], r["student"]
    assert float(rows["tamperer"]["score"]) == 0.0 and TAMPER_NOTE in rows["tamperer"]["notes"], rows["tamperer"]
    assert _tree_digest(course.root) == checkout
