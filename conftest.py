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

One execution per lesson in ``make test``: the browser suite (tests/browser/test_browser_lessons.py) runs every
lesson in real JupyterLab and lists each one that ran clean, with the kernel time JupyterLab recorded for its
cells, in ``test-artifacts/browser-lessons.json``. When ``LLMCOURSE_BROWSER_LESSONS`` names that file (the
Makefile's ``test`` target sets it and removes the file before ``pytest tests``), the nbval step deselects the
notebooks listed there and says so; every other notebook (solutions, labs, and every lesson when the browser
tests were skipped, e.g. without Chromium) is executed by nbval as before. ``make test-notebooks`` never sets it:
it executes everything (the budget measurement).

The cap with lessons in the browser: the 180 s cap (a failure) applies to the notebooks timed sequentially by
nbval. A lesson's browser time is the sum of its cells' kernel times, measured while ``PARALLEL`` (3) lessons
share the 2 cores, so it is inflated by up to ~2x: it is reported per unit (``browser`` in the JSON, marked
"(browser)") together with the unit's nbval times, and a unit whose browser + nbval total exceeds the cap is
printed as a note, never failed on; the browser test itself fails a lesson that does not finish within its own
bound (max(240 s, 8 x its ci minutes) x PARALLEL). Budgets are measured with ``make test-notebooks`` on an
idle machine.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

UNIT_CAP_S = float(os.environ.get("LLMCOURSE_UNIT_CAP_S", "180"))
_times: dict[str, float] = defaultdict(float)
_browser: dict[str, float] = {}  # notebooks executed by the browser suite instead (kernel seconds)


def _browser_record(config) -> tuple[dict | None, str]:
    """The browser suite's record named by $LLMCOURSE_BROWSER_LESSONS, or None with the reason."""
    name = os.environ.get("LLMCOURSE_BROWSER_LESSONS")
    if not name:
        return None, ""
    path = Path(name) if Path(name).is_absolute() else Path(config.rootpath) / name
    if not path.exists():
        return None, (f"no lesson ran in the browser in this run ({name} is absent: Chromium missing, or the "
                      "browser tests were skipped or deselected): nbval executes every lesson")
    try:
        data = json.loads(path.read_text())
        notebooks = {str(k): float(v["kernel_s"]) for k, v in data["notebooks"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"{name} is unreadable ({exc}): nbval executes every lesson"
    profile = os.environ.get("LLMCOURSE_PROFILE", "laptop")
    if data.get("profile") != profile:
        return None, f"{name} was written under profile {data.get('profile')}, not {profile}: nbval executes every lesson"
    return notebooks, ""


def pytest_collection_modifyitems(session, config, items):
    """Leave out the notebooks the browser suite already executed in this `make test` run (see above)."""
    record, why = _browser_record(config)
    if record is None and not why:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter else print
    if record is None:
        say(why)
        return
    keep, drop = [], []
    for item in items:
        (drop if item.nodeid.split("::", 1)[0] in record else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    ran = sorted({i.nodeid.split("::", 1)[0] for i in drop})
    _browser.update({nb: record[nb] for nb in ran})
    lessons = sorted({i.nodeid.split("::", 1)[0] for i in keep if i.nodeid.startswith("lessons/")})
    say(f"{len(ran)} notebook(s) already executed in the browser in this run, not again by nbval: "
        + ", ".join(Path(n).stem for n in ran))
    say(f"lessons executed by nbval: {', '.join(Path(n).stem for n in lessons) or 'none'}")


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
    if not _times and not _browser:
        return
    profile = os.environ.get("LLMCOURSE_PROFILE", "laptop")
    root = Path(session.config.rootpath)
    owners = _units_by_notebook(root)
    by_unit: dict[str, float] = defaultdict(float)  # nbval only: what the cap checks
    whole: dict[str, float] = defaultdict(float)  # nbval + browser: every notebook of the unit
    budget: dict[str, float] = defaultdict(float)
    labs: dict[str, float] = defaultdict(float)
    for path, seconds in [*_times.items(), *_browser.items()]:
        unit_id = Path(path).name[:2]
        whole[unit_id] += seconds
        if path not in _browser:
            by_unit[unit_id] += seconds
        unit, is_lab = owners.get(Path(path).name, (None, False))
        (labs if is_lab else budget)[unit_id] += seconds
    allowed = {u.id: 60.0 * float(u.minutes[profile]) for u, _ in owners.values() if profile in u.minutes}
    over_budget = {u: round(s, 1) for u, s in budget.items() if u in allowed and s > allowed[u]}
    lines = ["", f"notebook execution times (profile {profile}; (browser): kernel time in JupyterLab, lessons run "
                 "3 at a time, inflated):"]
    lines += [f"  {seconds:7.1f} s  {path}" for path, seconds in sorted(_times.items())]
    lines += [f"  {seconds:7.1f} s  {path} (browser)" for path, seconds in sorted(_browser.items())]
    for u, s in sorted(whole.items()):
        own = f"lesson + solution {budget.get(u, 0.0):.1f} s"
        if u in allowed:
            own += f" (unit budget {allowed[u]:.0f} s{', OVER' if u in over_budget else ''})"
        lab = f", labs {labs[u]:.1f} s" if u in labs else ""
        part = f", nbval {by_unit.get(u, 0.0):.1f} s" if s != by_unit.get(u, 0.0) else ""
        lines.append(f"  unit {u}: {s:.1f} s{part} (cap {UNIT_CAP_S:.0f} s): {own}{lab}")
    lines.append(f"  all notebooks: {sum(_times.values()) / 60:.1f} min by nbval"
                 + (f", {sum(_browser.values()) / 60:.1f} min in the browser" if _browser else ""))
    print("\n".join(lines))
    out = root / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "notebook-times.json").write_text(json.dumps(
        {"profile": profile, "notebooks": _times, "browser": _browser, "units": whole, "nbval_units": by_unit,
         "budget": budget, "labs": labs, "budget_s": {u: allowed[u] for u in sorted(allowed) if u in budget},
         "over_budget": over_budget}, indent=1))
    if over_budget:
        print(f"note: units over their own `minutes` budget (lesson + solution, profile {profile}): {over_budget}")
    browser_over = {u: round(s, 1) for u, s in whole.items() if s > UNIT_CAP_S and by_unit.get(u, 0.0) <= UNIT_CAP_S}
    if browser_over and profile == "ci":
        print(f"note: units over the ci cap of {UNIT_CAP_S:.0f} s with their lesson's time in the browser (3 lessons "
              f"at once, not a failure; `make test-notebooks` on an idle machine measures the budget): {browser_over}")
    over = {u: s for u, s in by_unit.items() if s > UNIT_CAP_S}
    if over and profile == "ci":
        print(f"FAILED: units over the ci cap of {UNIT_CAP_S:.0f} s: {over}")
        session.exitstatus = 1
