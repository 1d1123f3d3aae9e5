"""The check-result cache (coursetools/resultcache.py): ``course check`` fills it, ``course progress`` reuses it.

Cached rows must equal uncached rows; an edit to a graded cell must be a miss (checked again); outputs are not
part of the key; the cache is off with ``LLMCOURSE_CHECK_CACHE=0``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coursetools.cli import main, progress_report
from coursetools.resultcache import CACHE_ENV, cache_dir

ROOT = Path(__file__).resolve().parents[1]
UNIT = "00"


@pytest.fixture
def student(tmp_path, course):
    unit = course.unit(UNIT)
    path = tmp_path / "work" / Path(unit.exercise).parent.name / Path(unit.exercise).name
    path.parent.mkdir(parents=True)
    shutil.copy2(ROOT / unit.solution, path)
    return unit, path


def _rows(report):
    return [r for r in report["units"] if r["notebook"]]


def _no_checks(monkeypatch):
    import grader.runner

    def refuse(*_a, **_k):
        raise AssertionError("checked again: the cache was not used")

    monkeypatch.setattr(grader.runner, "check_notebook", refuse)


def _edit_first_answer(path: Path, source: str) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    cell["source"] = source
    path.write_text(json.dumps(nb), encoding="utf-8")


def test_check_fills_progress_reuses_and_an_edit_is_checked_again(tmp_path, monkeypatch, student, course, capsys):
    unit, path = student
    folder = path.parent.parent
    monkeypatch.setenv(CACHE_ENV, "0")
    assert cache_dir() is None
    plain = _rows(progress_report(folder, course=course))
    assert plain and plain[0]["earned"] == plain[0]["available"] > 0, plain

    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    assert main(["check", "--json", str(path)]) == 0  # `course check` (cold here) stores the report
    capsys.readouterr()
    assert len(list(cache.glob("*.json"))) == 1
    with monkeypatch.context() as m:
        _no_checks(m)
        assert _rows(progress_report(folder, course=course)) == plain  # from the cache, identical
        nb = json.loads(path.read_text(encoding="utf-8"))  # outputs and counts are not graded: still a hit
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                c["execution_count"] = 7
                c["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
        path.write_text(json.dumps(nb), encoding="utf-8")
        assert _rows(progress_report(folder, course=course)) == plain

    _edit_first_answer(path, "# YOUR CODE HERE\nraise NotImplementedError()")
    with monkeypatch.context() as m:
        _no_checks(m)
        with pytest.raises(AssertionError, match="checked again"):
            progress_report(folder, course=course)  # the edit is a miss
    edited = _rows(progress_report(folder, course=course))  # checked and stored
    assert edited[0]["earned"] < plain[0]["earned"], edited
    monkeypatch.setenv(CACHE_ENV, "0")
    assert _rows(progress_report(folder, course=course)) == edited  # the same rows without the cache
    monkeypatch.setenv(CACHE_ENV, str(cache))
    with monkeypatch.context() as m:
        _no_checks(m)
        assert _rows(progress_report(folder, course=course)) == edited


def test_a_foreign_or_open_cache_folder_is_not_used(tmp_path, monkeypatch):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    monkeypatch.setenv(CACHE_ENV, str(folder))
    assert cache_dir() is None
