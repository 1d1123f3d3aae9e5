"""The forkserver that learner processes are started from (see :mod:`grader.worker`).

Kept free of torch imports so that the ``course`` command can start it first thing: its preloading
(torch, torch._dynamo, sympy, llmcourse: ≈ 4 s of CPU) then overlaps the checker's own imports
instead of following them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import types

# torch._dynamo: imported by the first optimizer constructor/step and by meta-device ops; symbolic_shapes (and
# sympy): imported by the first torch.broadcast_shapes (masked attention). Seconds each: preloaded once here
# instead of in every worker
PRELOAD = ["torch", "torch._dynamo", "torch.fx.experimental.symbolic_shapes", "grader.worker", "llmcourse", "llmcourse.nn",
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


def start_forkserver() -> None:
    """Start the forkserver now (its preloading overlaps with the caller's own imports)."""
    from multiprocessing import forkserver

    context()
    with without_main():
        forkserver.ensure_running()
