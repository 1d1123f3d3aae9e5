"""nbgrader's exchange around ``course grade``: release to students, collect their submissions, return feedback.

On JupyterHub (or any machine where each student is a user with a home of their own) nbgrader moves notebooks
through an *exchange*: a folder every user can reach (nbgrader's default ``/srv/nbgrader/exchange``; set with
``--root``). The instructor's side of one assignment, with this module's three actions:

1. ``course exchange release 03 --root EX``: ``nbgrader release_assignment`` of the released exercise
   (``exercises/03_self_attention/``, what ``course release`` generates) into ``EX/llmcourse/outbound/``.
2. Students fetch, work and submit from JupyterLab's Assignments tab (or ``nbgrader fetch_assignment`` /
   ``nbgrader submit``); their submissions land in ``EX/llmcourse/inbound/``.
3. ``course exchange collect 03 --root EX --into CLASS``: ``nbgrader collect`` into
   ``CLASS/.grading/submitted/<student>/<assignment>/`` (the newest submission of each student, with nbgrader's
   ``timestamp.txt`` and ``submission_secret.txt``).
4. ``course grade CLASS/.grading/submitted --out WORK``: the course's grading (scores from the isolated checker;
   see :mod:`coursetools.grading`), feedback HTML in ``WORK/.grading/feedback/``.
5. ``course exchange feedback 03 --root EX --work WORK``: ``nbgrader release_feedback`` from the graded work root.
   Each feedback file is stored under a hash of its submission's secret, so a student's ``fetch_feedback`` finds
   only the feedback of submissions made from their own account (tests/test_exchange.py checks that).

Every action runs nbgrader in a subprocess with the course's configuration (:func:`coursetools.grading._nbgrader`)
and raises :class:`ExchangeError` with nbgrader's last log lines when it fails.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from llmcourse.manifest import load_course

from .grading import _nbgrader

__all__ = ["ExchangeError", "collect", "release", "release_feedback"]

COURSE_ID = "llmcourse"  # c.CourseDirectory.course_id in grader/nbgrader_config.py


class ExchangeError(RuntimeError):
    """An nbgrader exchange command failed; the message ends with its last log lines."""


def _assignment(unit_id: str, course) -> str:
    unit = course.unit(unit_id)
    if not unit.exercises:
        raise ValueError(f"unit {unit_id} has no graded exercise")
    return unit.name


def _run(args: list[str], work: Path, course, what: str) -> str:
    proc = _nbgrader(args, work, course.root, timeout=600)
    log = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0 or "[ERROR]" in log or "CRITICAL" in log:
        tail = "\n".join(log.strip().splitlines()[-8:])
        raise ExchangeError(f"nbgrader {what} failed (exit {proc.returncode}):\n{tail}")
    return log


def release(unit_id: str, root: str | Path, course=None) -> Path:
    """Put unit ``unit_id``'s released exercise into the exchange ``root``; returns its outbound folder.

    Raises:
        FileNotFoundError: the exercise was never released (run ``course release`` first).
        ExchangeError: nbgrader refused (for example: already released; nbgrader never overwrites).
    """
    course = course or load_course()
    name = _assignment(unit_id, course)
    source = course.root / "exercises" / name
    if not source.is_dir():
        raise FileNotFoundError(f"exercises/{name} does not exist: run `course release {unit_id}` first")
    with tempfile.TemporaryDirectory(prefix="llmcourse-exchange-") as tmp:  # nbgrader never runs in the checkout
        work = Path(tmp)
        shutil.copytree(source, work / "exercises" / name, ignore=shutil.ignore_patterns(".*"))
        _run(["release_assignment", name, f"--Exchange.root={Path(root).resolve()}"], work, course,
             "release_assignment")
    return Path(root).resolve() / COURSE_ID / "outbound" / name


def collect(unit_id: str, root: str | Path, into: str | Path, course=None) -> Path:
    """Collect every student's newest submission of unit ``unit_id`` from the exchange into
    ``into/.grading/submitted``; returns that folder (the argument ``course grade`` takes)."""
    course = course or load_course()
    name = _assignment(unit_id, course)
    into = Path(into).resolve()
    (into / ".grading").mkdir(parents=True, exist_ok=True)
    _run(["collect", name, f"--Exchange.root={Path(root).resolve()}", "--update"], into, course, "collect")
    return into / ".grading" / "submitted"


def release_feedback(unit_id: str, root: str | Path, work: str | Path, course=None) -> list[Path]:
    """Release the feedback ``course grade`` wrote in ``work`` for unit ``unit_id`` to the exchange; returns the
    released files (one per graded submission).

    Raises:
        FileNotFoundError: ``work`` holds no feedback for that unit (grade first).
    """
    course = course or load_course()
    name = _assignment(unit_id, course)
    work = Path(work).resolve()
    if not list((work / ".grading" / "feedback").glob(f"*/{name}/*.html")):
        raise FileNotFoundError(f"no feedback for {name} in {work}/.grading/feedback: run `course grade` first")
    outbound = Path(root).resolve() / COURSE_ID / "feedback"
    before = set(outbound.glob("*.html")) if outbound.is_dir() else set()
    _run(["release_feedback", name, f"--Exchange.root={Path(root).resolve()}"], work, course, "release_feedback")
    return sorted(set(outbound.glob("*.html")) - before)
