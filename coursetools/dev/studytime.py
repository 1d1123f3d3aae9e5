"""Expected study time of each unit (lesson + exercise, for a learner who knows Python), by a stated rule.

Not measured with learners: the estimate counts what a unit asks a learner to do, from its notebook sources,

* reading: the lesson's and the exercise's prose (markdown words) at ``WORDS_PER_MINUTE`` (technical text
  with formulas is read slowly);
* running: ``MINUTES_PER_CODE_CELL`` for each lesson code cell (run it, read its output);
* spot-the-bug fixes: ``MINUTES_PER_TODO`` for each ``# TODO`` cell of the lesson (fixes and the optional
  extension);
* exercises: ``MINUTES_PER_POINT`` for each point of the unit's graded exercises;

rounded up to the next half hour. Compute minutes (``minutes`` in course.toml: how long the notebooks run)
are a separate number. ``course.toml``'s ``study_hours`` holds the value this rule gives;
``python -m coursetools.dev.studytime`` prints the table and ``--check`` fails when they disagree.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from llmcourse.manifest import load_course

WORDS_PER_MINUTE = 120
MINUTES_PER_CODE_CELL = 1.5
MINUTES_PER_TODO = 10
MINUTES_PER_POINT = 8

__all__ = ["estimate", "main", "percent_cells"]


def percent_cells(path: Path) -> list[tuple[str, str]]:
    """(header, source) of each `# %%` cell of a jupytext percent script (also used by tests/test_lesson_rules.py)."""
    out: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("# %%"):
            out.append((line, []))
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(body)) for h, body in out]


def estimate(unit, root: Path) -> dict:
    """``{"read", "run", "fix", "exercise", "hours"}`` for ``unit`` (minutes, and the rounded hours)."""
    words = cells = todos = 0
    sources = [root / "notebooks" / "lessons" / f"{unit.name}.py", root / "notebooks" / "solutions" / f"{unit.name}.py"]
    for k, src in enumerate(sources):
        if not src.exists():
            continue
        for head, body in percent_cells(src):
            if "[markdown]" in head:
                words += len(re.findall(r"[A-Za-z0-9]+", body))
            elif k == 0:
                cells += 1
                todos += "# TODO" in body
    parts = {"read": words / WORDS_PER_MINUTE, "run": cells * MINUTES_PER_CODE_CELL,
             "fix": todos * MINUTES_PER_TODO, "exercise": unit.points * MINUTES_PER_POINT}
    parts["hours"] = math.ceil(sum(parts.values()) / 30) / 2
    return parts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    course = load_course()
    bad = []
    print("unit  read  run  fix  exercise (min)  estimate (h)  course.toml (h)")
    for u in course.units:
        if not u.available:
            continue
        e = estimate(u, course.root)
        print(f"{u.id}  {e['read']:5.0f} {e['run']:4.0f} {e['fix']:4.0f} {e['exercise']:9.0f}  {e['hours']:12.1f}  "
              f"{u.study_hours if u.study_hours is not None else '-':>15}")
        if u.study_hours != e["hours"]:
            bad.append(u.id)
    if "--check" in argv and bad:
        print(f"study_hours differ from the rule for units {bad}: set them to the estimate")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
