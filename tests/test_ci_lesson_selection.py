"""One execution per lesson in ``make test``, and never none: the nbval step's selection (root conftest.py).

The browser suite lists the lessons that ran clean in ``test-artifacts/browser-lessons.json``; with
``LLMCOURSE_BROWSER_LESSONS`` naming that file, nbval leaves exactly those out. Without the file (browser tests
skipped: no Chromium) or without the variable (``make test-notebooks``) every lesson is executed by nbval.
The hook is called on stand-in items; one real ``pytest --collect-only`` of unit 00's notebooks checks the
wiring end to end (nothing is executed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSON = "lessons/00_pytorch_essentials.ipynb"
LAB = "lessons/02_embeddings_and_positions_lab.ipynb"
SOLUTION = "solutions/00_pytorch_essentials/00_pytorch_essentials.ipynb"


def _root_conftest():
    spec = importlib.util.spec_from_file_location("_root_conftest_under_test", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Hooks:
    def __init__(self):
        self.deselected = []

    def pytest_deselected(self, items):
        self.deselected += items


def _select(record: Path | None, monkeypatch) -> tuple[list[str], list[str], str]:
    """(kept node ids, deselected node ids, what the hook said) for a lesson, a lab and a solution."""
    monkeypatch.setenv("LLMCOURSE_PROFILE", "ci")
    if record is None:
        monkeypatch.delenv("LLMCOURSE_BROWSER_LESSONS", raising=False)
    else:
        monkeypatch.setenv("LLMCOURSE_BROWSER_LESSONS", str(record))
    said: list[str] = []
    reporter = SimpleNamespace(write_line=said.append)
    hooks = _Hooks()
    config = SimpleNamespace(rootpath=ROOT, hook=hooks,
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: reporter))
    items = [SimpleNamespace(nodeid=f"{nb}::Cell {i}") for nb in (LESSON, LAB, SOLUTION) for i in range(2)]
    _root_conftest().pytest_collection_modifyitems(None, config, items)
    return [i.nodeid for i in items], [i.nodeid for i in hooks.deselected], "\n".join(said)


@pytest.fixture
def record(tmp_path) -> Path:
    path = tmp_path / "browser-lessons.json"
    path.write_text(json.dumps({"profile": "ci", "parallel": 3,
                                "notebooks": {LESSON: {"kernel_s": 12.5, "wall_s": 20.0, "cells": 30}}}))
    return path


def test_lessons_run_in_the_browser_are_not_run_again(record, monkeypatch):
    kept, dropped, said = _select(record, monkeypatch)
    assert {k.split("::")[0] for k in kept} == {LAB, SOLUTION} and {d.split("::")[0] for d in dropped} == {LESSON}
    assert "already executed in the browser" in said and "00_pytorch_essentials" in said, said


def test_every_lesson_runs_when_the_browser_ran_none(tmp_path, monkeypatch):
    kept, dropped, said = _select(tmp_path / "absent.json", monkeypatch)  # the browser tests were skipped
    assert len(kept) == 6 and not dropped and "nbval executes every lesson" in said, said


def test_a_record_of_another_profile_or_unreadable_is_ignored(tmp_path, record, monkeypatch):
    other = tmp_path / "laptop.json"
    other.write_text(record.read_text().replace('"ci"', '"laptop"'))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for path in (other, broken):
        kept, dropped, said = _select(path, monkeypatch)
        assert len(kept) == 6 and not dropped and "nbval executes every lesson" in said, said


def test_without_the_variable_nothing_is_left_out(monkeypatch):
    kept, dropped, said = _select(None, monkeypatch)
    assert len(kept) == 6 and not dropped and not said


def test_the_makefile_wires_it_and_nbval_collection_obeys(record):
    make = (ROOT / "Makefile").read_text()
    target = make[make.index("\ntest-notebooks:"):].split("\n\n", 1)[0]
    assert "LLMCOURSE_BROWSER_LESSONS= " in target, target  # the budget measurement executes everything
    test = make[make.index("\ntest:"):].split("\n\n", 1)[0]
    assert test.index("rm -f $(BROWSER_LESSONS)") < test.index("-m pytest --durations"), test  # no stale record
    assert "LLMCOURSE_BROWSER_LESSONS=$(BROWSER_LESSONS)" in test and "--nbval-lax" in test, test
    env = {**os.environ, "LLMCOURSE_PROFILE": "ci", "LLMCOURSE_BROWSER_LESSONS": str(record)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--nbval-lax", "--nbval-current-env",
                           "-p", "no:cacheprovider", LESSON, SOLUTION], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = {ln.split("::", 1)[0] for ln in proc.stdout.splitlines() if "::" in ln}
    assert files == {SOLUTION} and "already executed in the browser" in proc.stdout, proc.stdout
