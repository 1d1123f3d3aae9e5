"""Imported only by the grader's forkserver (first in its preload list; see :mod:`grader.forkserver`).

Makes the forkserver a child subreaper: a process that a worker spawned and detached (double fork,
``setsid``) is re-parented to the forkserver when the worker ends, not to init, so the checker finds it
below the forkserver and kills it (:func:`grader.supervise.kill_tree`). The forkserver reaps such orphans
itself; the warning it would print for each is silenced.
"""

import warnings

from grader.supervise import set_subreaper

warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
set_subreaper()
