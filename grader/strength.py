"""The grader's strength, declared beside each check: what an exercise exists to teach, and what it leaves to the student.

Two kinds of declaration, made in the unit's check module (``grader/checks/uNN_slug.py``) next to the check:

``defining_property(exercise_id, statement, probe)``
    The idea the exercise exists to teach (e.g. "ring all-reduce: each rank exchanges 2(p-1)/p*n elements with its
    two neighbours only") and the probe that observes it *in the learner's code* (communication counted, modules
    recorded, state measured), never a value the answer reports about itself. ``tests/test_grading_strength.py``
    fails when a graded exercise of ``course.toml`` has none.

``decision(exercise_id, what, forms, wrong=())``
    A choice the exercise leaves to the student: ``what`` says what is decided (shown to instructors, never a hint),
    ``forms`` are the ways the answer could be written down (regular expressions, matched case-insensitively on
    text whose whitespace is collapsed and whose Unicode minus/times signs are ASCII), ``wrong`` the bug-catalog ids
    of the wrong alternatives the hidden check names. The leak scan (:func:`leaks`) fails where a form appears in
    what a student reads before solving: the released exercise notebook (task text, stub docstrings, visible
    tests), the unit's lessons and labs (their summaries included) and README.md.

Mutants of a reference answer that cannot change any observable behaviour are listed, with a one-line reason, in
``grader/equivalent/uNN.toml`` (read by ``python -m coursetools.dev.mutation``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class DefiningProperty:
    exercise_id: str
    statement: str  # the idea, as a property of the learner's code
    probe: str  # how the check observes it (what is counted, recorded or measured)


@dataclass(frozen=True)
class Decision:
    exercise_id: str
    what: str  # what the student decides (for instructors and the strength report; never shown as a hint)
    forms: tuple[str, ...]  # regexes: the answer written down
    wrong: tuple[str, ...] = field(default=())  # bug ids of the wrong alternatives the check names


DEFINING: dict[str, DefiningProperty] = {}
DECISIONS: dict[str, list[Decision]] = {}


def defining_property(exercise_id: str, statement: str, probe: str) -> None:
    """Declare what ``exercise_id`` exists to teach and how its check observes it (one per exercise)."""
    if not statement.strip() or not probe.strip():
        raise ValueError(f"{exercise_id}: a defining property needs a statement and a probe")
    DEFINING[exercise_id] = DefiningProperty(exercise_id, statement.strip(), probe.strip())


def decision(exercise_id: str, what: str, forms, wrong=()) -> None:
    """Declare a decision ``exercise_id`` leaves to the student (see the module docstring)."""
    forms = (forms,) if isinstance(forms, str) else tuple(forms)
    if not forms:
        raise ValueError(f"{exercise_id}: a decision needs at least one written form of its answer")
    for f in forms:
        re.compile(f)
    new = Decision(exercise_id, what, forms, tuple(wrong))
    existing = DECISIONS.setdefault(exercise_id, [])
    for i, d in enumerate(existing):
        if d.what == what:  # a module loaded again (the warm server reloads): its current declaration counts
            existing[i] = new
            return
    existing.append(new)


# -- the leak scan ------------------------------------------------------------------------------------------------

_TRANSLATE = str.maketrans({"\u2212": "-", "\u2013": "-", "\u00d7": "*", "\u00b7": "*", "\u2009": " ", "\u00a0": " "})


def normalise(text: str) -> str:
    """Text as the forms are matched against: ASCII minus/times, whitespace collapsed."""
    return re.sub(r"\s+", " ", text.translate(_TRANSLATE))


def _notebook_text(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    parts = []
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        parts.append("".join(src) if isinstance(src, list) else src)
    return "\n".join(parts)


def student_texts(unit, root: Path = ROOT) -> dict[str, str]:
    """What a student reads before solving ``unit``'s exercises: ``{label: text}``.

    The released exercise notebook (stubs, task text, visible tests), the unit's lesson and labs, README.md.
    """
    out: dict[str, str] = {}
    paths = [unit.exercise, unit.lesson, *getattr(unit, "extra_lessons", ())]
    for rel in paths:
        p = root / rel
        if p.exists():
            out[str(rel)] = _notebook_text(p)
    readme = root / "README.md"
    if readme.exists():
        out["README.md"] = readme.read_text(encoding="utf-8")
    return out


def leaks(decisions, texts: dict[str, str]) -> list[str]:
    """Every place where a withheld form appears: ``"<exercise>: <what> -- form /re/ in <label>: ...context..."``."""
    found = []
    flat_texts = {label: normalise(text) for label, text in texts.items()}
    for d in decisions:
        for label, flat in flat_texts.items():
            for form in d.forms:
                m = re.search(form, flat, flags=re.IGNORECASE)
                if m:
                    a, b = max(0, m.start() - 60), min(len(flat), m.end() + 60)
                    found.append(f"{d.exercise_id}: {d.what} -- form /{form}/ in {label}: ...{flat[a:b]}...")
    return found
