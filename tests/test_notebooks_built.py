"""Committed notebooks are current with their sources, clean (no outputs) and normalised."""

from __future__ import annotations

from pathlib import Path

import nbformat

from coursetools.dev.nbbuild import build_all

ROOT = Path(__file__).resolve().parents[1]


def test_lessons_and_solutions_are_built_from_their_sources():
    stale = build_all(check=True)
    assert not stale, f"notebooks differ from notebooks/*.py: {stale}; run `make notebooks`"


def test_committed_notebooks_are_clean_and_use_the_course_kernel(course):
    paths = [ROOT / p for u in course.available_units for p in u.notebooks()] + [ROOT / course.meta["home"]]
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata.get("kernelspec", {}).get("name") == course.meta["kernel_name"], path
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path}: a code cell has outputs"
