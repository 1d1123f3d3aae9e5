"""The forkserver that learner processes are started from (see :mod:`grader.worker`).

Kept free of torch imports so that the ``course`` command can start it first thing: its preloading
(torch, torch._dynamo, sympy, llmcourse: ≈ 4 s of CPU) then overlaps the checker's own imports
instead of following them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
import types

# torch._dynamo: imported by the first optimizer constructor/step and by meta-device ops; symbolic_shapes (and
# sympy): imported by the first torch.broadcast_shapes (masked attention). Seconds each: preloaded once here
# instead of in every worker
PRELOAD = ["grader._forkserver_init", "torch", "torch._dynamo", "torch.fx.experimental.symbolic_shapes", "grader.worker", "llmcourse", "llmcourse.nn",
           "llmcourse.models", "llmcourse.train", "llmcourse.data"]

_CONTEXT = None


def context():
    """The ``forkserver`` multiprocessing context with :data:`PRELOAD` set."""
    global _CONTEXT
    if _CONTEXT is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _CONTEXT = ctx
    return _CONTEXT


@contextlib.contextmanager
def without_main():
    """Hide ``__main__`` while a worker starts: multiprocessing would re-import the checker's main
    script (the ``course`` CLI, a kernel launcher, a test file) in every worker otherwise."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


@contextlib.contextmanager
def _our_sys_path():
    """Start the forkserver with this process's ``sys.path``.

    CPython 3.11's forkserver ignores the ``sys_path`` it is handed and inherits ``-I`` from a checker
    started with it (``course grade``): it would import ``grader`` and ``llmcourse`` from the installed
    copy, not from the snapshot the checker runs. Its ``-c`` command is prefixed with this process's path.
    """
    from multiprocessing import util

    original = util.spawnv_passfds

    def spawnv_passfds(path, args, passfds):
        args = list(args)
        if "-c" in args:
            i = args.index("-c") + 1
            args[i] = f"import sys; sys.path[:] = {list(map(str, sys.path))!r}; " + args[i]
        return original(path, args, passfds)

    util.spawnv_passfds = spawnv_passfds
    try:
        yield
    finally:
        util.spawnv_passfds = original


def start_forkserver() -> None:
    """Start the forkserver now, unless it runs (its preloading overlaps with the caller's own imports)."""
    from multiprocessing import forkserver

    context()
    with without_main(), _our_sys_path():
        forkserver.ensure_running()


def pid() -> int | None:
    """The pid of this process's forkserver, or None when none was started (CPython's own bookkeeping)."""
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def healthy() -> bool:
    """False when the forkserver was started and is now stopped (SIGSTOP), dead or a zombie."""
    from .supervise import state

    p = pid()
    return p is None or state(p) not in (None, "T", "t", "Z")


def replace() -> None:
    """Kill this process's forkserver (stopped, dead or hung) and what it left, and start a fresh one.

    CPython's ``ensure_running`` would take a stopped forkserver for a live one and wait for it for ever:
    its bookkeeping is reset here after the old one is gone.
    """
    from multiprocessing import forkserver

    from .supervise import kill_tree

    fs = forkserver._forkserver
    with fs._lock:
        old = fs._forkserver_pid
        if old is not None:
            kill_tree(old, include_root=True)
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                try:
                    done, _ = os.waitpid(old, os.WNOHANG)
                except ChildProcessError:
                    break
                if done:
                    break
                time.sleep(0.02)
            with contextlib.suppress(OSError, TypeError):
                os.close(fs._forkserver_alive_fd)
            fs._forkserver_address = None
            fs._forkserver_alive_fd = None
            fs._forkserver_pid = None
    start_forkserver()
