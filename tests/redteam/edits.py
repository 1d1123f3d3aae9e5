"""Red-team answers written as edits of the reference solution (how a student's wrong answer usually looks: the
right code with one thing changed).

``solution_def("05", "EncoderBlock")`` is the source of that top-level ``def``/``class`` (decorators included) in the
unit's solution source ``notebooks/solutions/NN_*.py``; ``edited("05", "EncoderBlock", (old, new), ...)`` the same with
each ``old`` replaced by ``new``. An ``old`` that is not in the definition raises: an answer never silently becomes
the reference when the solution is reworded.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@cache
def _source(unit_id: str) -> str:
    (path,) = sorted((ROOT / "notebooks" / "solutions").glob(f"{unit_id}_*.py"))
    return path.read_text(encoding="utf-8")


def solution_def(unit_id: str, name: str) -> str:
    text = _source(unit_id)
    lines = text.splitlines()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return "\n".join(lines[first - 1:node.end_lineno]) + "\n"
    raise KeyError(f"no top-level def/class {name!r} in the solution of unit {unit_id}")


def edited(unit_id: str, name: str, *replacements: tuple[str, str]) -> str:
    src = solution_def(unit_id, name)
    for old, new in replacements:
        if old not in src:
            raise ValueError(f"{unit_id} {name}: {old!r} is not in the solution's definition")
        src = src.replace(old, new)
    return src
