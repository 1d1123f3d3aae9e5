"""Shared test setup: offline switches, the ci profile, the data mirror, and course fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("LLMCOURSE_PROFILE", "ci")
# `course check` runs cold in the tests (and leaves no warm check server behind); only
# tests/test_check_server.py switches the server on, in a private socket folder, and stops it
os.environ["LLMCOURSE_CHECK_SERVER"] = "0"
# nor does any test read or fill the user's check-result cache (tests/test_check_cache.py uses a temporary one)
os.environ["LLMCOURSE_CHECK_CACHE"] = "0"
_shared = ROOT.parent / "shared" / "data"
if "LLMCOURSE_DATA_MIRROR" not in os.environ and (_shared / "MANIFEST.md").exists():
    os.environ["LLMCOURSE_DATA_MIRROR"] = str(_shared)


@pytest.fixture(scope="session")
def course():
    from llmcourse.manifest import load_course

    return load_course(ROOT)


def _ids(units):
    return [u.id for u in units]


def pytest_generate_tests(metafunc):
    """Parametrize over available units / exercises / bugs when a test asks for them."""
    if not {"unit", "exercise", "bug_case"} & set(metafunc.fixturenames):
        return
    from llmcourse.manifest import load_course

    course = load_course(ROOT)
    units = course.available_units
    if "unit" in metafunc.fixturenames:
        metafunc.parametrize("unit", units, ids=_ids(units))
    elif "exercise" in metafunc.fixturenames:
        exercises = [e for u in units for e in u.exercises]
        metafunc.parametrize("exercise", exercises, ids=[e.id for e in exercises])
    elif "bug_case" in metafunc.fixturenames:
        from grader.core import BUGS
        from grader.runner import load_unit

        for u in units:
            load_unit(u.id)
        cases = [(ex_id, b) for u in units for e in u.exercises for ex_id in [e.id] for b in BUGS.get(ex_id, [])]
        metafunc.parametrize("bug_case", cases, ids=[f"{ex}:{b.id}" for ex, b in cases])


def copy_course(dest: Path, units: tuple[str, ...] = ("03",)) -> Path:
    """A private copy of the course (grading code, manifest, assets, the given units' notebooks).

    The grading tests run ``course grade`` on such a copy (the three packages travel with it): its snapshot/tamper checks hash the copy,
    so nothing else editing the repository can disturb them, and a hostile notebook can only ever
    write to the copy.
    """
    import shutil

    from llmcourse.manifest import load_course

    course = load_course(ROOT)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for item in ("grader", "llmcourse", "coursetools"):
        shutil.copytree(ROOT / item, dest / item, ignore=ignore)
    for item in ("course.toml", "nbgrader_config.py", "pyproject.toml"):
        shutil.copy2(ROOT / item, dest / item)
    shutil.copytree(ROOT / "assets", dest / "assets", ignore=ignore)
    (dest / "exercises").mkdir()
    shutil.copy2(ROOT / "exercises" / ".release.json", dest / "exercises" / ".release.json")
    for uid in units:
        u = course.unit(uid)
        for rel in (u.solution, u.exercise):
            shutil.copytree((ROOT / rel).parent, (dest / rel).parent, ignore=ignore)
    return dest


@pytest.fixture(scope="session")
def course_copy(tmp_path_factory):
    """``make(units=("03",))`` -> a loaded private copy of the course (see :func:`copy_course`)."""
    from llmcourse.manifest import load_course

    def make(units: tuple[str, ...] = ("03",)):
        return load_course(copy_course(tmp_path_factory.mktemp("course"), units))

    return make

