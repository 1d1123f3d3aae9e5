"""The file names learner cells are compiled under (``<cell 3>``), shared by the extractor and the verdicts,
and the names learners read for those cells ("your code cell that defines `softmax_stable`": JupyterLab
shows no cell numbers).

A leaf module so that :mod:`grader.extract` (which compiles the cells) and :mod:`grader.core` (which finds
a learner's frame in a traceback) both import it and not each other.
"""

import re

CELL_PREFIX = "<cell "
# "<cell N>" -> how the learner recognises that cell; filled by the extractor (like linecache)
_LABELS: dict[str, str] = {}


def cell_filename(index: int) -> str:
    """``<cell N>``: the compile-time file name of the notebook's N-th code cell (1-based)."""
    return f"{CELL_PREFIX}{index}>"


def cell_label(source: str) -> str:
    """'code cell that defines `name`' (its first top-level def/class), else 'code cell starting `first line`'."""
    first = ""
    for line in source.splitlines():
        m = re.match(r"(?:async\s+def|def|class)\s+([A-Za-z_]\w*)", line)
        if m:
            return f"code cell that defines `{m.group(1)}`"
        stripped = line.strip()
        if not first and stripped and not stripped.startswith("#"):
            first = stripped
    if not first:
        first = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    if not first:
        return "empty code cell"
    return f"code cell starting `{first if len(first) <= 60 else first[:57] + '...'}`"


def labels() -> dict[str, str]:
    """The registry ``{"<cell N>": label}`` the extractor fills."""
    return _LABELS


def where_cell(filename: str) -> str:
    """The learner-facing name of the cell compiled as ``filename`` ('code cell N' when unknown)."""
    return _LABELS.get(filename) or f"code cell {filename[len(CELL_PREFIX):-1]}"
