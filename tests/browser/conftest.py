"""Fixtures of the browser tests: Debian's Chromium through Playwright, and JupyterLab servers.

Chromium is /usr/bin/chromium (``make browser-deps`` installs Debian's package; Playwright's own browser
downloads are never used). When it or Playwright is missing, every browser test is skipped with the
reason. Servers serve temporary copies of the course, never the repository's notebooks.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from jlab import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, ROOT, LabServer


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def _skip_reason() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"Playwright is not installed ({exc}); run `make setup` (requirements-dev.txt pins it)"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return (f"Chromium not found at {CHROMIUM}: run `make browser-deps` (apt-get install chromium, as root) "
                "or set LLMCOURSE_CHROMIUM to a Chromium binary")
    return None


@pytest.fixture(scope="session")
def browser():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    except Exception as exc:  # a broken install: say so instead of failing every test
        pw.stop()
        pytest.skip(f"Chromium at {CHROMIUM} could not be started by Playwright: {exc}")
    yield b
    b.close()
    pw.stop()


class Shots:
    """Pages to photograph into test-artifacts/ when the test fails (or always, with :meth:`save`)."""

    def __init__(self, name: str):
        self.name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        self.pages: list[tuple[str, object]] = []

    def watch(self, page, label: str = "") -> None:
        self.pages.append((label, page))

    def save(self, page, label: str = "") -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{self.name}{'-' + label if label else ''}.png"
        page.screenshot(path=str(path))
        return path


@pytest.fixture
def shots(request):
    s = Shots(request.node.name)
    yield s
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for label, page in s.pages:
            try:
                s.save(page, (label + "-" if label else "") + "FAILED")
            except Exception:  # the page may be gone; the failure itself is what matters
                pass


def _copy_course(dest: Path) -> Path:
    """The parts of the course a learner opens in JupyterLab, copied to ``dest``."""
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    for folder in ("lessons", "exercises"):
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)
    for name in ("course_home.ipynb", "nbgrader_config.py"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    # nbgrader_config.py loads grader/nbgrader_config.py relative to itself (course root = this copy)
    (dest / "grader").mkdir(exist_ok=True)
    shutil.copy2(ROOT / "grader" / "nbgrader_config.py", dest / "grader" / "nbgrader_config.py")
    return dest


@pytest.fixture(scope="session")
def course_copy(tmp_path_factory) -> Path:
    return _copy_course(tmp_path_factory.mktemp("course"))


@pytest.fixture(scope="session")
def lab(browser, course_copy):
    """One JupyterLab server for the session on a copy of the course (live widgets, ci profile)."""
    env = {}
    if os.environ.get("LLMCOURSE_DATA_MIRROR"):
        env["LLMCOURSE_DATA_MIRROR"] = os.environ["LLMCOURSE_DATA_MIRROR"]
    server = LabServer(course_copy, env=env, name="course").start()
    try:
        yield server
    finally:
        server.stop()
