"""Hostile learner code for the supervision tests (tests/test_grader_supervision.py, tests/test_grading_attacks.py).

Every attack only signals processes whose parent chain reaches the test's own process (given by pid in the
generated code), never that process itself, never init, never anything outside the grading run.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def invalid_json(text: str) -> str:
    """``text`` (a notebook's JSON) with ten characters cut from the first ``"cell_type"`` key after character 5000:
    invalid JSON whatever the cells' text says (a cut at a fixed offset can fall inside a string and stay valid)."""
    cut = text.index('"cell_type"', 5000)
    return text[:cut] + text[cut + 10:]
