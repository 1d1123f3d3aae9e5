"""Supervising the processes that run learner code: states, process trees, and a worker's confinement.

Kept free of torch imports (the forkserver preloads it, ``course grade`` uses it before its checker starts).

What a grading run does with it (see :mod:`grader.worker` and ``course grade``):

* **Confinement of a worker** (:func:`confine_worker`, first thing in every learner process): its own
  session and process group (``os.setsid``: ``kill(0, …)`` and ``killpg(getpgrp(), …)`` reach only the
  worker and what it spawned); a child subreaper (orphans of what it spawns stay below it, so they can be
  found and killed); where the grading runs as root, the worker drops to the user ``nobody`` (65534),
  keeping only the file-access capabilities (it still reads the course, the assets and the environment,
  which may sit in private folders, and writes the data sets' cache locks as before), with ``no_new_privs``
  set: ``kill()`` on the checker or the forkserver fails with EPERM; finally a parent-death signal
  (SIGKILL when the forkserver dies; set last, since a change of credentials clears it).
* **End of an exercise** (:func:`kill_tree`): every process of the worker's session, every descendant of
  the worker, and every process left under the forkserver that is not a live worker (orphans: the
  forkserver is a child subreaper too, see :mod:`grader._forkserver_init`) is SIGKILLed, in rounds until
  none is left. That is a scan of ``/proc``, not a cgroup.
* **Deadlines**: the parent never blocks on a pipe or a wait without one; it polls and looks at the
  child's state (:func:`state`: ``T`` is a stopped process, which is killed and replaced).

Linux only where it says so; elsewhere these functions do what they can (no ``/proc``: nothing is found).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

__all__ = ["NOBODY", "STOPPED_NOTE", "confine_worker", "descendants", "kill_tree", "processes_with_env", "set_subreaper",
           "state", "stopped"]

NOBODY = 65534
STOPPED_NOTE = "the submission stopped the grading process"

PR_SET_PDEATHSIG = 1
PR_SET_KEEPCAPS = 8
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
CAP_DAC_OVERRIDE = 1
CAP_DAC_READ_SEARCH = 2
CAP_FOWNER = 3
_CAP_VERSION_3 = 0x20080522


def _libc():
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _libc().prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_subreaper() -> bool:
    """Make this process a child subreaper: orphans below it are re-parented to it, not to init."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """``(state, ppid, pgid, sid)`` from ``/proc/<pid>/stat``, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def state(pid: int | None) -> str | None:
    """The process state letter (``R``, ``S``, ``D``, ``T`` stopped, ``t`` traced, ``Z`` zombie...), or None if gone.

    Without ``/proc``: ``"?"`` while ``kill(pid, 0)`` finds the process.
    """
    if pid is None:
        return None
    st = _stat(pid)
    if st is not None:
        return st[0]
    if os.path.isdir("/proc/self"):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "?"
    return "?"


def stopped(pid: int | None) -> bool:
    """True when the process is stopped (SIGSTOP, SIGTSTP...) or traced."""
    return state(pid) in ("T", "t")


def _table() -> dict[int, tuple[str, int, int, int]]:
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def descendants(pid: int, table: dict | None = None) -> list[int]:
    """Every process whose parent chain leads to ``pid`` (not ``pid`` itself)."""
    table = _table() if table is None else table
    children: dict[int, list[int]] = {}
    for p, (_, ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out and c != pid:
                out.append(c)
                todo.append(c)
    return out


def processes_with_env(token: str) -> list[int]:
    """Pids of the processes whose initial environment holds ``token`` (``NAME=value``), this process excluded.

    Finds what a kernel forked and detached (``setsid``, re-parented to init) as long as it did not
    ``exec`` with a cleaned environment; only processes this user may inspect are seen.
    """
    needle = token.encode()
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    me = os.getpid()
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(name))
    return out


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def kill_tree(root: int | None, *, session: int | None = None, include_root: bool = False,
              keep: set[int] | frozenset[int] = frozenset(), env_token: str | None = None, rounds: int = 20) -> int:
    """SIGKILL what ``root`` left behind; the number of processes killed.

    Killed, in rounds until a scan finds none (a process that forks meanwhile is caught by the next round):
    every descendant of ``root`` (and ``root`` itself with ``include_root``), every process of the
    session or process group ``session``, and every process whose environment holds ``env_token``.
    Descendants of a pid in ``keep`` (and ``keep`` itself) are spared. Never this process or its ancestors.
    """
    me = os.getpid()
    spared = {me, 0, 1}
    p = me
    for _ in range(64):  # this process's ancestors
        st = _stat(p)
        if st is None or st[1] in (0, p):
            break
        p = st[1]
        spared.add(p)
    killed: set[int] = set()
    for _ in range(rounds):
        table = _table()
        kept = set(keep)
        for k in keep:
            kept.update(descendants(k, table))
        targets = set()
        if root is not None:
            targets.update(descendants(root, table))
            if include_root and root in table and table[root][0] != "Z":
                targets.add(root)
        if session is not None:
            targets.update(p for p, (_, _, pgid, sid) in table.items() if session in (pgid, sid))
        if env_token is not None:
            targets.update(processes_with_env(env_token))
        targets = {p for p in targets - spared - kept if table.get(p, ("?",))[0] != "Z"}
        if not targets:
            break
        for p in targets:
            _kill(p)
        killed |= targets
    return len(killed)


def reap_children() -> None:
    """Collect the exit status of any child of this process that has ended (orphans re-parented to a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except (ChildProcessError, OSError):
            return
        if pid == 0:
            return


def _drop_to_nobody() -> bool:
    """As root: become uid/gid 65534 keeping only the file-access capabilities.

    CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER: the worker reads and writes files as the grading
    user could (the course in a private folder, the data sets' cache and its lock files under root's home),
    but without CAP_KILL and with another uid, ``kill()`` on the checker or the forkserver fails (EPERM), and
    it cannot ptrace them or read their memory.
    """
    import ctypes

    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    keep = (1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH) | (1 << CAP_FOWNER)
    data = (Data * 2)(Data(keep, keep, 0), Data(0, 0, 0))
    libc.capset(ctypes.byref(Header(_CAP_VERSION_3, 0)), data)  # best effort: without it, nobody's own rights
    libc.prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0)
    return True


def confine_worker(parent: int | None = None, drop: bool = True) -> dict:
    """Confine this (freshly forked) learner process; what was done, for the record.

    Own session, child subreaper, no new privileges, ``nobody`` when root, then SIGKILL on the
    parent's death (exits at once when the parent, ``parent`` pid if given, is already gone).
    """
    done = {}
    try:
        os.setsid()
        done["setsid"] = True
    except OSError:
        done["setsid"] = False
    done["subreaper"] = set_subreaper()
    done["no_new_privs"] = _prctl(PR_SET_NO_NEW_PRIVS, 1)
    try:
        done["nobody"] = drop and _drop_to_nobody()
    except OSError:
        done["nobody"] = False
    done["pdeathsig"] = _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if parent is not None and os.getppid() != parent:
        os._exit(70)  # the parent died before the death signal was armed
    return done
