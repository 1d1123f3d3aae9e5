"""Course tooling: the ``course`` command and everything an instructor or CI runs around the student library.

The three layers of the repository and the one direction they depend in::

    coursetools/  ->  grader/  ->  llmcourse/

- :mod:`llmcourse` is the student library (what students build and import in a notebook). It imports
  neither of the others; ``llmcourse.check()`` runs ``python -m coursetools check`` as a command.
- :mod:`grader` holds the checks, the bug catalogs and the isolated runner (worker, forkserver); it imports
  ``llmcourse`` for the reference implementations, never this package.
- this package: the CLI (:mod:`coursetools.cli`), the one-process check (:mod:`coursetools.checking`), the
  warm check server (:mod:`coursetools.checkserver`), nbgrader release and grading
  (:mod:`coursetools.grading`), the speed benchmarks (:mod:`coursetools.bench`) and the notebook and README
  builders (:mod:`coursetools.dev`). Nothing imports it back (tests/test_layout.py).
"""

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it, else the machine's count); at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
