"""The `course` command as a learner and an instructor use it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def course(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "coursetools", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def in_process(capsys, *args):
    """``course ARGS`` in this process (no interpreter start-up): (exit code, stdout, stderr)."""
    from coursetools.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# The CLI's report format on a sample of units: every solution and every stub of every unit goes through the same
# checks in tests/test_grader_selftest.py (solution passes, stub "not attempted"); running all 36 notebooks here
# again only repeated that work (about a minute of CI).
CLI_SAMPLE = ("00", "07", "12", "17")


def _unit(unit_id):
    from llmcourse.manifest import load_course

    unit = load_course(ROOT).unit(unit_id)
    if not unit.available:
        pytest.skip(f"unit {unit_id} is not available")
    return unit


@pytest.mark.parametrize("unit_id", CLI_SAMPLE)
def test_check_untouched_exercise_reports_every_exercise_not_attempted(unit_id, capsys):
    unit = _unit(unit_id)
    code, out, err = in_process(capsys, "check", str(ROOT / unit.exercise))
    assert code == 1, out + err
    for e in unit.exercises:
        assert f"{e.id}: not attempted" in out
    assert f"0 passed, 0 failed, {len(unit.exercises)} not attempted" in out


@pytest.mark.parametrize("unit_id", CLI_SAMPLE)
def test_check_solution_reports_every_exercise_passed(unit_id, capsys):
    unit = _unit(unit_id)
    code, out, err = in_process(capsys, "check", str(ROOT / unit.solution))
    assert code == 0, out + err
    assert f"{len(unit.exercises)} passed, 0 failed, 0 not attempted — {unit.points}/{unit.points} points" in out


def test_check_as_a_learner_runs_it_from_a_shell():
    r = course("check", "exercises/03_self_attention/03_self_attention.ipynb")
    assert r.returncode == 1 and "03.softmax_stable: not attempted" in r.stdout, r.stdout + r.stderr


def test_check_bad_paths_give_one_line_and_exit_2(tmp_path):
    not_nb = tmp_path / "notes.txt"
    not_nb.write_text("hello")
    broken = tmp_path / "03_self_attention.ipynb"
    broken.write_text("{ not json")
    stranger = tmp_path / "my_notebook.ipynb"
    stranger.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    cases = [(tmp_path / "missing.ipynb", "no such file"), (not_nb, "not a notebook"),
             (tmp_path, "not a notebook"), (broken, "not valid JSON (line 1, column 3"),
             (stranger, "not an exercise notebook")]
    r = course("check", str(cases[0][0]))  # one real shell run: exit code and stderr as a learner sees them
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr, r.stderr
    from coursetools.cli import main

    for path, words in cases[1:]:
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["check", str(path)])
        assert code == 2, (path, err.getvalue())
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and words in lines[0], err.getvalue()
        assert "Traceback" not in err.getvalue()


def test_list_shows_every_unit_and_availability(course):
    r = subprocess.run([sys.executable, "-m", "llmcourse", "list"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0
    for u in course.units:
        assert f"{u.id} {u.slug}" in r.stdout
        for e in u.exercises:
            assert e.id in r.stdout
    lines = r.stdout.splitlines()
    for u in course.units:
        line = next(x for x in lines if x.startswith(f"{u.id} {u.slug}"))
        assert ("[available]" if u.available else "[not yet available]") in line, line


def test_doctor_passes_here():
    r = course("doctor")
    assert r.returncode == 0, r.stdout
    assert "[OK] GPT-2 tokenizer offline" in r.stdout and "[FAIL]" not in r.stdout


def test_doctor_fails_without_data(tmp_path):
    import os

    env = {**os.environ, "LLMCOURSE_DATA_MIRROR": str(tmp_path), "LLMCOURSE_CACHE": str(tmp_path / "c")}
    r = subprocess.run([sys.executable, "-m", "coursetools", "doctor"], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 1 and "[FAIL] data tinyshakespeare" in r.stdout


def test_check_recognises_a_renamed_copy(tmp_path):
    import shutil

    copy = tmp_path / "03_self_attention-Copy1.ipynb"
    shutil.copyfile(ROOT / "exercises/03_self_attention/03_self_attention.ipynb", copy)
    r = course("check", str(copy))
    assert r.returncode == 1 and "03.softmax_stable: not attempted" in r.stdout, r.stdout + r.stderr
