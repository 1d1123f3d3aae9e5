"""The course grader: one check per graded exercise, the bug catalog, and the grading runner.

Hidden test cells call :func:`grade`; ``course check`` calls :func:`check_notebook`;
``course grade`` drives nbgrader with ``grader/nbgrader_config.py``. See ``grader/core.py`` for how
checks, mutants and diagnosis fit together.
"""

from .core import Verdict
from .runner import GradeFailed, check_notebook, grade, run_check, run_unit

__all__ = ["GradeFailed", "Verdict", "check_notebook", "grade", "run_check", "run_unit"]
