"""Release consistency: exercises are current, leak nothing, and release never destroys a student's work."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from coursetools.grading import MANIFEST_NAME, release
from llmcourse.manifest import load_course

ROOT = Path(__file__).resolve().parents[1]


def _solution_lines(unit) -> set[str]:
    """Non-trivial code lines inside BEGIN/END SOLUTION regions of a unit's solution notebook."""
    nb = nbformat.read(ROOT / unit.solution, as_version=4)
    lines = set()
    for cell in nb.cells:
        for block in re.findall(r"### BEGIN SOLUTION(.*?)### END SOLUTION", cell.source, re.S):
            lines |= {ln.strip() for ln in block.splitlines() if len(ln.strip()) > 25}
    return lines


def test_exercises_contain_no_solution_code_and_no_hidden_tests(unit):
    nb = nbformat.read(ROOT / unit.exercise, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "from grader import", "grade("):
        assert marker not in text, f"{unit.exercise} contains {marker!r}"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")  # task statements may quote the API
    leaked = [ln for ln in _solution_lines(unit) if ln in code]
    assert not leaked, f"solution lines in {unit.exercise}: {leaked[:3]}"
    graded = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"].get("points") for c in nb.cells
              if c.metadata.get("nbgrader", {}).get("grade")}
    assert graded == {e.grade_id: e.points for e in unit.exercises}
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


@pytest.mark.slow
def test_committed_exercises_are_current():
    result = release(check=True)
    assert result.ok, f"stale exercises (run `course release`): {result.stale}"


@pytest.fixture()
def temp_course(tmp_path):
    """A throwaway copy of the course (manifest, grader, solutions, exercises) for release tests."""
    for name in ("course.toml", "grader", "solutions", "exercises"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, tmp_path / name)
    return load_course(tmp_path)


@pytest.mark.slow
def test_release_refuses_to_overwrite_an_edited_exercise(temp_course):
    unit = temp_course.unit("03")
    target = temp_course.root / unit.exercise
    solution = temp_course.root / unit.solution
    # the instructor changes the source; a student has edited the released copy in place
    nb = nbformat.read(solution, as_version=4)
    nb.cells[0].source += "\n\nA new sentence from the instructor."
    nbformat.write(nb, solution)
    student = nbformat.read(target, as_version=4)
    student.cells[3].source = "# my work in progress"
    nbformat.write(student, target)
    before = target.read_text()
    result = release(course=temp_course, unit_ids=["03"])
    assert result.refused == [unit.exercise] and not result.written
    assert target.read_text() == before, "the student's edited notebook was modified"
    # --force overwrites deliberately; afterwards the manifest records the new release
    result = release(course=temp_course, unit_ids=["03"], force=True)
    assert result.written == [unit.exercise]
    assert "A new sentence from the instructor." in target.read_text()
    manifest = json.loads((temp_course.root / "exercises" / MANIFEST_NAME).read_text())
    assert unit.exercise in manifest
    # an unedited copy is simply updated
    nb = nbformat.read(solution, as_version=4)
    nb.cells[0].source += " Again."
    nbformat.write(nb, solution)
    assert release(course=temp_course, unit_ids=["03"]).written == [unit.exercise]
