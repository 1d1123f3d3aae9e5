"""Repository-level pytest hooks: time notebook execution (nbval) per notebook and per unit.

``make test`` runs ``pytest --nbval-lax lessons solutions`` under the ``ci`` profile. This hook sums
the cell times of each notebook, prints a table at the end, writes
``test-artifacts/notebook-times.json``, and fails the run when a unit's notebooks together exceed
the ``ci`` cap (3 minutes per unit, lab notebooks included).

Budget accounting (the course's rule: "the unit's notebooks (lesson and solution) … finish in ≤ 3
minutes together"; the optional lab notebooks, ``extra_lessons`` in course.toml, have their own
expected time stated at their top):

- ``units``: every notebook of the unit, labs included: this is what the 180 s cap checks.
- ``budget``: lesson + solution (+ exercise if run) only, i.e. the time a learner's unit takes; it is
  compared with the unit's own ``minutes`` in course.toml for the active profile, and units over it are
  printed and listed under ``over_budget`` (a report, not a failure: timings on a loaded machine vary
  several-fold; the cap above is the hard limit).
- ``labs``: the lab notebooks' times, reported separately.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

UNIT_CAP_S = float(os.environ.get("LLMCOURSE_UNIT_CAP_S", "180"))
_times: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _times[path] += report.duration


def _units_by_notebook(root: Path) -> dict:
    """File name -> (unit, is_lab) for every notebook named in course.toml (empty if it cannot be read)."""
    try:
        from llmcourse.manifest import load_course

        course = load_course(root)
    except Exception:  # the timing report must never break a test run
        return {}
    return {Path(p).name: (u, p in u.extra_lessons) for u in course.units for p in u.notebooks()}


def pytest_sessionfinish(session, exitstatus):
    if not _times:
        return
    profile = os.environ.get("LLMCOURSE_PROFILE", "laptop")
    root = Path(session.config.rootpath)
    owners = _units_by_notebook(root)
    by_unit: dict[str, float] = defaultdict(float)
    budget: dict[str, float] = defaultdict(float)
    labs: dict[str, float] = defaultdict(float)
    for path, seconds in _times.items():
        unit_id = Path(path).name[:2]
        by_unit[unit_id] += seconds
        unit, is_lab = owners.get(Path(path).name, (None, False))
        (labs if is_lab else budget)[unit_id] += seconds
    allowed = {u.id: 60.0 * float(u.minutes[profile]) for u, _ in owners.values() if profile in u.minutes}
    over_budget = {u: round(s, 1) for u, s in budget.items() if u in allowed and s > allowed[u]}
    lines = ["", f"notebook execution times (profile {profile}):"]
    lines += [f"  {seconds:7.1f} s  {path}" for path, seconds in sorted(_times.items())]
    for u, s in sorted(by_unit.items()):
        own = f"lesson + solution {budget.get(u, 0.0):.1f} s"
        if u in allowed:
            own += f" (unit budget {allowed[u]:.0f} s{', OVER' if u in over_budget else ''})"
        lab = f", labs {labs[u]:.1f} s" if u in labs else ""
        lines.append(f"  unit {u}: {s:.1f} s (cap {UNIT_CAP_S:.0f} s): {own}{lab}")
    lines.append(f"  all notebooks: {sum(_times.values()) / 60:.1f} min")
    print("\n".join(lines))
    out = root / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "notebook-times.json").write_text(json.dumps(
        {"profile": profile, "notebooks": _times, "units": by_unit, "budget": budget, "labs": labs,
         "budget_s": {u: allowed[u] for u in sorted(allowed) if u in budget}, "over_budget": over_budget},
        indent=1))
    if over_budget:
        print(f"note: units over their own `minutes` budget (lesson + solution, profile {profile}): {over_budget}")
    over = {u: s for u, s in by_unit.items() if s > UNIT_CAP_S}
    if over and profile == "ci":
        print(f"FAILED: units over the ci cap of {UNIT_CAP_S:.0f} s: {over}")
        session.exitstatus = 1
