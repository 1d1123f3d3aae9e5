"""The file names learner cells are compiled under (``<cell 3>``), shared by the extractor and the verdicts.

A leaf module so that :mod:`grader.extract` (which compiles the cells) and :mod:`grader.core` (which finds
a learner's frame in a traceback) both import it and not each other.
"""

CELL_PREFIX = "<cell "


def cell_filename(index: int) -> str:
    """``<cell N>``: the compile-time file name of the notebook's N-th code cell (1-based)."""
    return f"{CELL_PREFIX}{index}>"
