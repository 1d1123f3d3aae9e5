"""The red-team corpus: wrong and lazy answers the grader must withstand (kept apart from the bug catalog).

The bug catalog (``grader/bugs``) is what a student is *told*; this corpus is what the hidden checks must *withstand*.
Each unit has a module ``tests/redteam/uNN.py`` defining ``ANSWERS = [Answer(...), ...]``
(``from tests.redteam import Answer``). An answer is the source
of one or more notebook cells, written as a student would write them (by someone who has read only the student's
notebook, or taken from an issue that named it); it replaces the reference solution's definitions of the same
names. ``tests/test_redteam.py`` runs each through the exercise's check (the solution's other definitions around
it) and requires that it loses points and that the feedback names the mistake: ``bug`` (a catalogued id) or, for a
mistake outside the catalog, ``says`` (a regular expression the message must match: the property that broke).
``open`` marks a known hole that the check does not catch yet (the reason; the test is an expected failure, and
fails once the hole is closed so that the mark is removed).

Write ``source`` as an edit of the reference solution (``tests/redteam/edits.py``: ``edited(unit, name, (old, new))``),
never as a pasted copy of a solution definition. The answer is executed over a *copy* of the solution's namespace:
the definitions it does not give stay the solution's, and those keep calling the solution's own helpers (their
globals are the solution's namespace, not the copy). An answer whose mistake lies in a helper must therefore also
give each graded definition that should call it (``solution_def(unit, name)`` brings the solution's text unchanged;
see the stale-memo answer of tests/redteam/u13.py).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Answer:
    exercise: str  # "NN.name"
    title: str  # the mistake in a few words
    source: str  # notebook cell(s) replacing the solution's definitions of the same names
    bug: str | None = None  # the catalogued bug id the feedback must name
    says: str | None = None  # else: a regex the failure message must match (the broken property)
    origin: str = "red team"  # "red team" (read only the student's notebook) or "issue NN"
    open: str | None = None  # a known hole: why it still earns full points

    def __post_init__(self):
        if (self.bug is None) == (self.says is None) and self.open is None:
            raise ValueError(f"{self.exercise} {self.title!r}: give exactly one of bug= or says=")


def load(unit_id: str) -> list[Answer]:
    """The answers of one unit (``[]`` when it has no module yet)."""
    path = HERE / f"u{unit_id}.py"
    if not path.exists():
        return []
    if str(HERE.parents[1]) not in sys.path:  # the modules import ``tests.redteam.Answer``
        sys.path.insert(0, str(HERE.parents[1]))
    spec = importlib.util.spec_from_file_location(f"redteam_u{unit_id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.ANSWERS)


def load_all(unit_ids) -> list[Answer]:
    return [a for u in unit_ids for a in load(u)]
