"""What a submitted notebook lost on the way, and what can be put back, for both views of grading.

* :func:`read_submission`: the notebook, or a one-line cause with the parse position when the file
  is not valid JSON (a hand-edited or truncated ``.ipynb``).
* :func:`repair_nbgrader_metadata`: some editors strip cell metadata, and with it nbgrader's ids.
  Locked cells are recognised by their released source; an answer cell is the first new code cell
  (preferably one with a ``def``/``class``) after the graded cell that precedes it in the release.
  The learner's sources are never changed, only the metadata comes back, so nbgrader can restore
  test cells and record every answer.
* :func:`answer_cell_notes`: answer cells turned into markdown (not code: they earn nothing).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

__all__ = ["read_submission", "repair_nbgrader_metadata", "answer_cell_notes"]


def read_submission(path: str | Path):
    """``(notebook, None)`` or ``(None, cause)``; the cause names the JSON parse position."""
    import nbformat

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        return None, f"{p.name} is not UTF-8 text (byte {exc.start}); nothing in it could be graded"
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return None, (f"{p.name} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); the file "
                      "was damaged after it was saved, so nothing in it could be graded")
    try:
        return nbformat.reads(text, as_version=4), None
    except Exception as exc:  # noqa: BLE001 - valid JSON, not a notebook
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        return None, f"{p.name} is JSON but not a Jupyter notebook ({type(exc).__name__}: {first})"


def _gid(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def repair_nbgrader_metadata(nb, release):
    """``(notebook, restored_count)``: nbgrader metadata put back on cells that lost it."""
    present = {_gid(c) for c in nb.cells if _gid(c)}
    rel = [c for c in release.cells if _gid(c)]
    missing = [c for c in rel if _gid(c) not in present]
    if not missing:
        return nb, 0
    out = copy.deepcopy(nb)
    bare = [i for i, c in enumerate(out.cells) if not _gid(c)]
    restored = 0
    # 1. locked cells (tests, read-only text): identical source in the release
    for rc in missing:
        meta = rc.metadata["nbgrader"]
        if meta.get("solution"):
            continue
        for i in bare:
            c = out.cells[i]
            if c.cell_type == rc.cell_type and c.source.strip() == rc.source.strip() and not _gid(c):
                c.metadata["nbgrader"] = copy.deepcopy(meta)
                restored += 1
                break
    # 2. answer cells: the first unrecognised cell of the same type after the released predecessor
    position = {_gid(c): i for i, c in enumerate(out.cells) if _gid(c)}
    fixed = {c.source.strip() for c in release.cells if not c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    for rc in missing:
        meta = rc.metadata["nbgrader"]
        if not meta.get("solution"):
            continue
        k = rel.index(rc)
        prev = next((position[_gid(r)] for r in reversed(rel[:k]) if _gid(r) in position), -1)
        nxt = next((position[_gid(r)] for r in rel[k + 1:] if _gid(r) in position), len(out.cells))
        window = [i for i in range(prev + 1, nxt) if not _gid(out.cells[i])
                  and out.cells[i].cell_type == rc.cell_type and out.cells[i].source.strip() not in fixed]
        # a scratch cell may sit next to the answer: prefer one that defines something
        defining = [i for i in window if any(ln.startswith(("def ", "class ")) for ln in out.cells[i].source.splitlines())]
        if defining or window:
            i = (defining or window)[0]
            out.cells[i].metadata["nbgrader"] = copy.deepcopy(meta)
            position[meta["grade_id"]] = i
            restored += 1
    return out, restored


def answer_cell_notes(nb, unit) -> dict[str, str]:
    """``{exercise_id: note}`` for exercises whose answer cell is no longer a code cell."""
    out = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id", "")
        if not meta.get("solution") or cell.cell_type == "code":
            continue
        for e in unit.exercises:
            if gid in (e.grade_id, f"{e.grade_id}_answer"):
                out[e.id] = (f"your answer cell {gid!r} is a {cell.cell_type} cell, not code: nothing in it runs or "
                             "earns points (change its type back to Code)")
    return out
