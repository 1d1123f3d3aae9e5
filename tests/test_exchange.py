"""nbgrader's exchange end to end, as a class on one machine uses it (JupyterHub's layout):

release (``course exchange release``) -> three students fetch into their own homes -> one solves unit 03,
one makes a named mistake, one submits a broken notebook -> submit -> ``course exchange collect`` ->
``course grade`` -> ``course exchange feedback`` -> each student's ``fetch_feedback`` finds exactly their own
feedback.

Students are simulated the way nbgrader does on JupyterHub: the OS user ``jovyan`` takes its name from
``JUPYTERHUB_USER`` (``nbgrader.utils.get_username``), and each student has a HOME of their own (nbgrader keeps
a student's submission cache, the key to their feedback, under it). The exchange is a folder in the test's
temporary directory. Runs nbgrader about ten times plus one ``course grade``: marked ``roundtrip``.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.roundtrip

STUDENT_RUNNER = '''import sys
import nbgrader.utils as utils
utils.get_osusername = lambda: "jovyan"   # on JupyterHub the single-user server runs as jovyan
from nbgrader.apps.nbgraderapp import NbGraderApp
sys.argv = ["nbgrader", *sys.argv[1:]]
NbGraderApp.launch_instance()
'''


def _answers(solution) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(
        ln for ln in c.source.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
        for c in solution.cells if c.metadata.get("nbgrader", {}).get("solution")}


def _filled(exercise, answers: dict[str, str]):
    nb = copy.deepcopy(exercise)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = answers[meta["grade_id"]]
    return nb


def _student(tmp: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    home = tmp / "homes" / name
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "JUPYTERHUB_USER": name,
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    for var in ("JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "XDG_DATA_HOME"):
        env.pop(var, None)
    runner = tmp / "student_nbgrader.py"
    runner.write_text(STUDENT_RUNNER)
    return subprocess.run([sys.executable, str(runner), *args, "--course", "llmcourse",
                           f"--Exchange.root={tmp / 'exchange'}"], cwd=home, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def class_run(tmp_path_factory, course_copy):
    from coursetools import exchange
    from coursetools.grading import grade

    course = course_copy(("03",))
    unit = course.unit("03")
    tmp = tmp_path_factory.mktemp("exchange")
    outbound = exchange.release("03", tmp / "exchange", course=course)
    assert (outbound / Path(unit.exercise).name).is_file()

    solution = nbformat.read(course.root / unit.solution, as_version=4)
    answers = _answers(solution)
    wrong = dict(answers)
    wrong["ex03_scaled_dot_product_attention_answer"] = answers["ex03_scaled_dot_product_attention_answer"].replace(
        "/ math.sqrt(d_k)", "").replace("/ d_k ** 0.5", "").replace("* d_k ** -0.5", "")
    assert wrong != answers, "the unscaled-attention mistake could not be made from the solution's text"
    for student in ("alice", "bob", "carol"):
        r = _student(tmp, student, "fetch_assignment", unit.name)
        assert r.returncode == 0, r.stderr[-2000:]
        path = tmp / "homes" / student / unit.name / Path(unit.exercise).name
        released = nbformat.read(path, as_version=4)
        if student == "alice":
            nbformat.write(_filled(released, answers), path)
        elif student == "bob":
            nbformat.write(_filled(released, wrong), path)
        else:
            path.write_text('{"cells": [ this is not a notebook')
        r = _student(tmp, student, "submit", unit.name)
        assert r.returncode == 0, r.stderr[-2000:]

    submitted = exchange.collect("03", tmp / "exchange", tmp / "class", course=course)
    work = tmp / "work"
    report = grade(submitted, out_dir=work, cell_timeout=60, course=course)
    released = exchange.release_feedback("03", tmp / "exchange", work, course=course)
    fetched = {}
    for student in ("alice", "bob", "carol"):
        r = _student(tmp, student, "fetch_feedback", unit.name)
        assert r.returncode == 0, r.stderr[-2000:]
        fetched[student] = sorted((tmp / "homes" / student / unit.name / "feedback").rglob("*.html"))
    return {"unit": unit, "submitted": submitted, "work": work, "report": report, "released": released,
            "fetched": fetched}


def test_collect_brings_every_students_submission(class_run):
    students = sorted(p.name for p in class_run["submitted"].iterdir() if p.is_dir())
    assert students == ["alice", "bob", "carol"]
    for s in students:
        folder = class_run["submitted"] / s / class_run["unit"].name
        assert (folder / "submission_secret.txt").is_file() and (folder / "timestamp.txt").is_file()


def test_grades_right_wrong_and_broken(class_run):
    scores = {row["student"]: row["score"] for row in class_run["report"].rows}
    assert scores["alice"] == 20
    assert 0 < scores["bob"] < 20, "the unscaled attention costs its own exercise (the modules built on it are graded on the course's function)"
    assert scores["carol"] == 0


def test_each_student_fetches_only_their_own_feedback(class_run):
    assert len(class_run["released"]) == 3
    work, name = class_run["work"], class_run["unit"].name
    for student, files in class_run["fetched"].items():
        assert len(files) == 1, f"{student} fetched {len(files)} feedback files: {files}"
        own = work / ".grading" / "feedback" / student / name / Path(class_run["unit"].exercise).with_suffix(".html").name
        assert files[0].read_bytes() == own.read_bytes(), f"{student} got someone else's feedback"
