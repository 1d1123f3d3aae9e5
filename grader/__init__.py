"""The course grader: one check per graded exercise, the bug catalog, and the grading runner.

Hidden test cells call :func:`grade`; ``course check`` calls :func:`check_notebook`;
``course grade`` drives nbgrader with ``grader/nbgrader_config.py``. See ``grader/core.py`` for how
checks, mutants and diagnosis fit together.

The names below are imported on first use (PEP 562), so ``import grader.forkserver`` stays free of
torch and the ``course`` command can start its worker pool first.
"""

from __future__ import annotations

import importlib

_WHERE = {"Verdict": "core", "GradeFailed": "runner", "check_notebook": "runner", "grade": "runner",
          "run_check": "runner", "run_unit": "runner"}

__all__ = ["GradeFailed", "Verdict", "check_notebook", "grade", "run_check", "run_unit"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
