"""Loading a learner's definitions without running their notebook.

The grader never executes a notebook top to bottom: it takes the code cells, keeps only the
top-level ``import``, ``from … import``, ``def`` and ``class`` statements (AST extraction), and
executes those in a fresh namespace. Training loops, prints and scratch cells never run, a
notebook-global variable that a function relies on is *not* defined (which is how B03.scale_global
is caught), and a cell with a syntax error loses only its own definitions.

Statements are compiled with the file name ``<cell N>`` (N counts code cells from 1); the cell is
named for the learner by what it defines or by its first line (:func:`cell_label`: "your code cell
that defines `softmax_stable`"), since JupyterLab shows no cell numbers.
"""

from __future__ import annotations

import ast
import linecache
from dataclasses import dataclass, field

from .cellnames import CELL_PREFIX, cell_filename, cell_label, labels

__all__ = ["Extracted", "extract_namespace", "code_cells_of_notebook", "restore_locked_cells", "CELL_PREFIX",
           "cell_label"]

_KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass
class Extracted:
    """The namespace built from a learner's cells and what went wrong while building it."""

    namespace: dict
    problems: list[str] = field(default_factory=list)  # human-readable, about the learner's own code
    defined_in: dict[str, int] = field(default_factory=dict)  # name -> code cell number of its last definition


def code_cells_of_notebook(nb) -> list[str]:
    """Sources of the code cells of an ``nbformat`` notebook, in order."""
    return [c.source for c in nb.cells if c.cell_type == "code"]


def restore_locked_cells(nb, release) -> object:
    """A copy of a submitted notebook with its locked cells restored from the released one.

    As nbgrader's autograde does (``OverwriteCells``): a cell whose nbgrader ``grade_id`` is locked
    in the release (test cells, read-only cells) gets the released source and cell type back, so
    code typed into a test cell never counts. Answer (solution) cells keep what the student wrote,
    including their cell type: an answer turned into markdown is not code. Both ``course check``
    and ``course grade`` grade the code cells of this restored notebook.
    """
    import copy

    released = {}
    for cell in release.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") and meta.get("locked") and not meta.get("solution"):
            released[meta["grade_id"]] = cell
    out = copy.deepcopy(nb)
    for cell in out.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in released:
            cell.source = released[gid].source
            cell.cell_type = released[gid].cell_type
    return out


def _strip_magics(source: str) -> str:
    # IPython line magics and shell escapes are not Python; blank them out (keeping line numbers).
    lines = []
    for line in source.splitlines():
        stripped = line.lstrip()
        lines.append("" if stripped.startswith(("%", "!")) else line)
    return "\n".join(lines)


def extract_namespace(sources: list[str], base: dict | None = None, time_limit_s: float = 20.0) -> Extracted:
    """Execute the import/def/class statements of ``sources`` in a fresh namespace.

    Args:
        sources: code cell sources in notebook order (later definitions override earlier ones).
        base: names to pre-populate (e.g. ``{"__name__": "learner"}``).
        time_limit_s: wall-clock limit for each statement (a class body or decorator could loop).

    Returns:
        :class:`Extracted`; problems mention only the learner's cells, never grader code.
    """
    import sys
    import types

    from .core import TimeLimitExceeded, time_limit

    # a real module, registered in sys.modules: @dataclass (and typing) look classes' modules up there
    module = types.ModuleType("__learner__")
    sys.modules["__learner__"] = module
    ns: dict = module.__dict__
    ns["__builtins__"] = __builtins__
    if base:
        ns.update(base)
    out = Extracted(namespace=ns)
    for index, source in enumerate(sources, start=1):
        filename = cell_filename(index)
        text = _strip_magics(source)
        where = labels()[filename] = cell_label(text)
        try:
            tree = ast.parse(text, filename=filename)
        except SyntaxError as exc:
            out.problems.append(f"your {where} has a syntax error (line {exc.lineno}): {exc.msg}; "
                                "its definitions were skipped")
            continue
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        for node in tree.body:
            if not isinstance(node, _KEEP):
                continue
            module = ast.Module(body=[node], type_ignores=[])
            try:
                with time_limit(time_limit_s):
                    exec(compile(module, filename, "exec"), ns)  # noqa: S102 (learner code, by design)
            except TimeLimitExceeded:
                out.problems.append(f"your {where}, line {node.lineno}: the statement did not finish "
                                    f"within {time_limit_s:.0f} s")
                continue
            except Exception as exc:  # a failing import, a decorator that raises, ...
                from .core import blocked_reference

                label = blocked_reference(exc)
                if label is not None:
                    out.problems.append(f"your {where}, line {node.lineno}: this definition builds on the course "
                                        f"library's own answer to this exercise ({label}); write your own")
                else:
                    text = str(exc).splitlines()[0][:300] if str(exc) else ""
                    out.problems.append(f"your {where}, line {node.lineno}: {type(exc).__name__}: {text}")
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.defined_in[node.name] = index
            else:
                for alias in node.names:
                    out.defined_in[(alias.asname or alias.name).split(".")[0]] = index
    return out
