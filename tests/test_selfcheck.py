"""``llmcourse.check()`` (the in-notebook check), ``course check --json`` and ``course progress``.

One notebook, unit 03's released exercise with one correct answer (``softmax_stable``) and one known
mistake (``simple_attention`` normalising over the queries, bug ``B03.softmax_dim``), is checked three
ways: ``course check`` (text), ``llmcourse.check`` (a separate ``course check --json`` process, rendered
in the kernel) and ``course progress`` over a folder holding it. The three must agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from llmcourse import selfcheck
from llmcourse.manifest import load_course

ROOT = Path(__file__).resolve().parents[1]
UNIT = "03"
CORRECT = ("def softmax_stable(x, dim=-1):\n    shifted = x - x.amax(dim=dim, keepdim=True)\n    e = shifted.exp()\n"
           "    return e / e.sum(dim=dim, keepdim=True)\n")
WRONG = ("def simple_attention(x):\n    scores = x @ x.transpose(-2, -1)\n    w = torch.softmax(scores, dim=-2)\n"
         "    return w @ x, w\n")


def half_done_notebook(dest: Path) -> Path:
    """Unit 03's exercise with one correct and one wrong answer, written to ``dest/<NN_slug>.ipynb``."""
    unit = load_course(ROOT).unit(UNIT)
    nb = nbformat.read(str(ROOT / unit.exercise), as_version=4)
    answers = {"ex03_softmax_stable_answer": CORRECT, "ex03_simple_attention_answer": WRONG}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers.pop(gid)
    assert not answers, f"{unit.exercise} has no answer cells {sorted(answers)}"
    path = dest / Path(unit.exercise).name
    nbformat.write(nb, str(path))
    return path


def course(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "coursetools", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def half_done(tmp_path_factory) -> Path:
    return half_done_notebook(tmp_path_factory.mktemp("student"))


@pytest.mark.slow
def test_in_notebook_check_reports_what_course_check_reports(half_done):
    text = course("check", str(half_done))
    result = selfcheck.check_result(half_done)
    assert text.returncode == 1, text.stdout + text.stderr
    # the same report, line for line (the kernel renders course check's JSON without importing the grader)
    assert selfcheck.render_text(result.report) == text.stdout.rstrip("\n")
    status = {v["exercise_id"]: v["status"] for v in result.verdicts}
    assert status == {"03.softmax_stable": "passed", "03.simple_attention": "failed",
                      "03.scaled_dot_product_attention": "not_attempted", "03.SelfAttention": "not_attempted",
                      "03.CausalSelfAttention": "not_attempted"}
    wrong = next(v for v in result.verdicts if v["exercise_id"] == "03.simple_attention")
    assert wrong["bug_id"] == "B03.softmax_dim" and wrong["hint"]
    assert (result.report["earned"], result.report["total"]) == (3, 20)

    page = result._repr_html_()
    assert page.count('data-status="passed"') == 1 and page.count('data-status="failed"') == 1
    assert page.count('data-status="not_attempted"') == 3
    assert "<code>softmax_dim</code>" in page and "3/20" in page and "Unsaved changes" not in page
    assert "B03." not in page and "B03." not in result.text()  # the mistake's name, never its internal id
    # never the hidden checks' source or the reference code
    for secret in ("grader.checks", "def check", "t.compare", "### BEGIN HIDDEN TESTS", "amax(dim=dim"):
        assert secret not in page and secret not in result.text(), secret


@pytest.mark.slow
def test_progress_table_over_a_folder(half_done, tmp_path):
    r = course("progress", str(half_done.parent), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    rows = {row["unit"]: row for row in report["units"]}
    course_ = load_course(ROOT)
    assert set(rows) == {u.id for u in course_.available_units if u.exercises}
    row = rows[UNIT]
    assert (row["earned"], row["available"], row["passed"], row["failed"], row["not_attempted"]) == (3, 20, 1, 1, 3)
    assert row["common_bug"] == "softmax_dim"  # its name, not its internal id
    for uid, other in rows.items():
        if uid != UNIT:
            assert other["error"] == "no notebook" and other["earned"] == 0
    assert report["earned"] == 3
    text = course("progress", str(half_done.parent))
    assert "softmax_dim" in text.stdout and "B03." not in text.stdout and "3/20" in text.stdout and "no notebook" in text.stdout
    assert course("progress", str(tmp_path / "missing")).returncode == 2


def test_no_unsaved_warning_when_the_kernel_runs_another_notebook(tmp_path, monkeypatch):
    """llmcourse.check("exercises/…") from another notebook: that kernel's cells are not the checked file's."""
    checked, other = tmp_path / "07_encoder_classifier.ipynb", tmp_path / "scratch.ipynb"
    for p in (checked, other):
        nbformat.write(nbformat.v4.new_notebook(), str(p))
    later = checked.stat().st_mtime + 10
    monkeypatch.setattr(selfcheck, "_RUNS", [(later, "def mine():\n    return 1"), (later + 1, "llmcourse.check(...)")])
    monkeypatch.setattr(selfcheck, "this_notebook", lambda: other.resolve())
    assert selfcheck.unsaved_for(checked) == []
    monkeypatch.setattr(selfcheck, "this_notebook", lambda: checked.resolve())  # its own notebook: warned
    assert selfcheck.unsaved_for(checked) == ["def mine():\n    return 1"]
    monkeypatch.setattr(selfcheck, "this_notebook", lambda: None)  # unknown: as before, warned
    assert selfcheck.unsaved_for(checked) == ["def mine():\n    return 1"]


def test_unsaved_cells_are_the_ones_run_after_the_save_and_missing_from_the_file(tmp_path):
    path = tmp_path / "03_self_attention.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch"), nbformat.v4.new_code_cell("def f():\n    return 1")]
    nbformat.write(nb, str(path))
    saved = path.stat().st_mtime
    before, after = saved - 10, saved + 10
    check_cell = (after + 1, "llmcourse.check()")
    # run before the save, even if not in the file (an older version of a cell): no warning
    assert selfcheck.unsaved_cells(path, [(before, "def f():\n    return 0"), check_cell]) == []
    # re-running an unchanged cell after the save: no warning
    assert selfcheck.unsaved_cells(path, [(after, "import torch\n"), check_cell]) == []
    # a cell edited and run after the save: warned, once
    edited = "def f():\n    return 2"
    assert selfcheck.unsaved_cells(path, [(after, edited), (after, edited), check_cell]) == [edited]
    # the cell that calls the check is never counted
    assert selfcheck.unsaved_cells(path, [(after, "x = 1")]) == []
    report = {"unit": "03", "title": "t", "notebook": str(path), "problems": [], "verdicts": [], "earned": 0,
              "total": 0, "counts": {"passed": 0, "failed": 0, "not_attempted": 0}, "passed": True}
    page = selfcheck.CheckResult(report, path, unsaved=[edited])._repr_html_()
    assert "Unsaved changes: a cell you ran since the last save is not in the saved file" in page


def test_check_outside_jupyterlab_prints_one_line_and_checks_nothing(capsys, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.delenv(selfcheck.DEFER_ENV, raising=False)
    start = time.monotonic()
    assert selfcheck.check() is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "nothing was checked" in out
    monkeypatch.setenv(selfcheck.DEFER_ENV, "1")
    assert selfcheck.check() is None
    assert "course grade checks this notebook" in capsys.readouterr().out
    assert time.monotonic() - start < 2
    assert selfcheck.check(ROOT / "no-such.ipynb") is None
    assert "no such notebook" in capsys.readouterr().out


def test_session_name_finds_the_notebook(tmp_path, monkeypatch):
    path = tmp_path / "03_self_attention.ipynb"
    path.write_text("{}")
    monkeypatch.setenv("JPY_SESSION_NAME", str(path))
    assert selfcheck.this_notebook() == path
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JPY_SESSION_NAME", "exercises/03_self_attention/03_self_attention.ipynb")  # relative form
    assert selfcheck.this_notebook() == path.resolve()
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "other.ipynb"))
    assert selfcheck.this_notebook() is None


def test_every_exercise_notebook_ends_with_the_check_cell():
    course_ = load_course(ROOT)
    for unit in course_.available_units:
        if not unit.exercises:
            continue
        for rel in (unit.solution, unit.exercise):
            nb = nbformat.read(str(ROOT / rel), as_version=4)
            last = nb.cells[-1]
            assert last.cell_type == "code" and last.source == "llmcourse.check()", f"{rel}: last cell {last.source!r}"
            assert "nbgrader" not in last.metadata or not last.metadata["nbgrader"].get("grade"), rel
            assert "llmcourse.check()" in next(c for c in nb.cells if c.cell_type == "markdown").source, (
                f"{rel}: the introduction should name llmcourse.check() first")


@pytest.mark.slow
def test_a_real_kernel_knows_its_notebook_and_what_was_run_after_the_save(tmp_path):
    """ipykernel sets ``__session__`` from ``JPY_SESSION_NAME`` (what jupyter_server passes to a notebook's
    kernel); importing llmcourse records the cells run, so a cell run after the save is reported."""
    from jupyter_client.manager import start_new_kernel

    path = tmp_path / "03_self_attention.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import llmcourse")]
    nbformat.write(nb, str(path))
    env = {**os.environ, "JPY_SESSION_NAME": str(path)}
    outputs: list = []
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    try:
        def run(code):
            reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
            assert reply["content"]["status"] == "ok", reply["content"]

        run("import llmcourse")
        run("def f():\n    return 2")  # run after the file was written, and not in it
        run("import llmcourse")  # unchanged cell re-run: not reported
        reply = kc.execute_interactive(
            "from llmcourse import selfcheck\n"
            "print(repr((__session__, str(selfcheck.this_notebook()), selfcheck.unsaved_cells(selfcheck.this_notebook()))))",
            timeout=120, output_hook=lambda msg: outputs.append(msg))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok"
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    assert eval(text) == (str(path), str(path), ["def f():\n    return 2"])



def test_an_exercise_kernel_keeps_the_check_server_warm(tmp_path, monkeypatch):
    """setup_notebook in an exercise opened in JupyterLab starts `course check --warm` and repeats it; nothing
    happens for lessons, under nbval/nbgrader (no notebook known), with deferred checks or the server off."""
    exercise = tmp_path / "exercises" / "03_self_attention" / "03_self_attention.ipynb"
    lesson = tmp_path / "lessons" / "03_self_attention.ipynb"
    for p in (exercise, lesson):
        p.parent.mkdir(parents=True)
        nbformat.write(nbformat.v4.new_notebook(), str(p))
    calls = []
    monkeypatch.setattr(selfcheck.subprocess, "run", lambda cmd, **kw: calls.append((cmd, kw.get("cwd"))))
    monkeypatch.setattr(selfcheck, "_WARM_THREAD", None)
    monkeypatch.setenv("LLMCOURSE_CHECK_SERVER", "1")
    monkeypatch.delenv(selfcheck.DEFER_ENV, raising=False)
    monkeypatch.setattr(selfcheck, "this_notebook", lambda: None)
    assert not selfcheck.keep_check_server_warm()                      # nbval, nbgrader: no notebook
    assert not selfcheck.keep_check_server_warm(lesson)                # a lesson
    monkeypatch.setenv(selfcheck.DEFER_ENV, "1")
    assert not selfcheck.keep_check_server_warm(exercise)              # course grade's kernels
    monkeypatch.delenv(selfcheck.DEFER_ENV)
    monkeypatch.setenv("LLMCOURSE_CHECK_SERVER", "0")
    assert not selfcheck.keep_check_server_warm(exercise)              # switched off
    monkeypatch.setenv("LLMCOURSE_CHECK_SERVER", "1")
    assert not calls
    assert selfcheck.keep_check_server_warm(exercise, interval=0.05)
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert len(calls) >= 3, calls                                   # at once, then every interval
        assert calls[0] == ([sys.executable, "-m", "coursetools", "check", "--warm"], str(exercise.parent))
        thread = selfcheck._WARM_THREAD
        assert selfcheck.keep_check_server_warm(exercise) and selfcheck._WARM_THREAD is thread  # one per kernel
    finally:
        selfcheck.stop_keeping_warm()
