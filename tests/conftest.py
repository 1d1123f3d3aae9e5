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


# ------------------------------------------------------------------ hostile learner code (supervision tests)

HOSTILE_KINDS = ("stop_parent", "kill_parent", "term_parent", "stop_group", "kill_group", "term_group", "daemon",
                 "setsid_sleep", "close_pipe", "garbage_pipe")

_HOSTILE = '''\
def _hostile(kind):
    """Attack the processes that run this code; only ever processes below the test's grading process."""
    import os
    import signal
    import stat
    import time

    root, marks = {root}, {marks!r}

    def ppid_pgid(p):
        with open(f"/proc/{{p}}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[2])

    def inside(p):  # a strict descendant of the test's own grading process (never it, never init)
        if p in (0, 1, root):
            return False
        for _ in range(64):
            try:
                p = ppid_pgid(p)[0]
            except (OSError, ValueError, IndexError):
                return False
            if p == root:
                return True
            if p <= 1:
                return False
        return False

    def send(p, sig):
        if inside(p):
            try:
                os.kill(p, sig)
            except OSError:
                pass

    sig = {{"stop": signal.SIGSTOP, "kill": signal.SIGKILL, "term": signal.SIGTERM}}.get(kind.split("_")[0])
    if kind.endswith("_parent"):
        send(os.getppid(), sig)
    elif kind.endswith("_group"):  # killpg(0, sig), member by member, each checked, itself last
        me, group = os.getpid(), os.getpgrp()
        members = []
        for name in os.listdir("/proc"):
            try:
                if name.isdigit() and int(name) != me and ppid_pgid(int(name))[1] == group:
                    members.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
        for p in members:
            send(p, sig)
        send(me, sig)
    elif kind == "daemon":  # double fork, setsid: a grandchild that outlives its session and records its pid
        if os.fork() == 0:
            try:
                os.setsid()
                if os.fork() == 0:
                    try:
                        with open(os.path.join(marks, f"daemon-{{os.getpid()}}"), "w") as fh:
                            fh.write(str(os.getpid()))
                    finally:
                        time.sleep(600)
            finally:
                os._exit(0)
        time.sleep(0.5)
    elif kind == "setsid_sleep":
        try:
            os.setsid()
        except OSError:
            pass
        time.sleep(3600)
    elif kind in ("close_pipe", "garbage_pipe"):
        for fd in range(3, 1024):
            try:
                mode = os.fstat(fd).st_mode
                if kind == "close_pipe":
                    os.close(fd)
                elif stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
                    os.write(fd, b"\\x00\\x00\\x00\\x10not a reply, garbage" * 4)
            except OSError:
                pass
'''


def hostile_code(marks: Path, root: int | None = None) -> str:
    """A cell defining ``_hostile(kind)`` (``kind`` in :data:`HOSTILE_KINDS`).

    The attacks only signal processes whose parent chain reaches ``root`` (this test process by default)
    and never ``root`` itself; a daemon writes its pid into ``marks`` (made writable for a worker that runs
    as ``nobody``).
    """
    marks.mkdir(parents=True, exist_ok=True)
    marks.chmod(0o777)
    return _HOSTILE.format(root=os.getpid() if root is None else int(root), marks=str(marks))


def surviving_daemons(marks: Path) -> list[int]:
    """Pids recorded by hostile daemons that are still running (zombies count as gone)."""
    alive = []
    for f in marks.glob("daemon-*"):
        pid = int(f.name.split("-", 1)[1])
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive
