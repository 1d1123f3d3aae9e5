"""Repository-level pytest hooks: time notebook execution (nbval) per notebook and per unit.

``make test`` runs ``pytest --nbval-lax lessons solutions`` under the ``ci`` profile. This hook sums
the cell times of each notebook, prints a table at the end, writes
``test-artifacts/notebook-times.json``, and fails the run when a unit's notebooks together exceed
the syllabus's ``ci`` cap (3 minutes per unit).
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


def pytest_sessionfinish(session, exitstatus):
    if not _times:
        return
    by_unit: dict[str, float] = defaultdict(float)
    for path, seconds in _times.items():
        by_unit[Path(path).name[:2]] += seconds
    lines = ["", "notebook execution times (profile %s):" % os.environ.get("LLMCOURSE_PROFILE", "laptop")]
    lines += [f"  {seconds:7.1f} s  {path}" for path, seconds in sorted(_times.items())]
    lines += [f"  unit {u}: {s:.1f} s (cap {UNIT_CAP_S:.0f} s)" for u, s in sorted(by_unit.items())]
    print("\n".join(lines))
    out = Path(session.config.rootpath) / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "notebook-times.json").write_text(json.dumps({"notebooks": _times, "units": by_unit}, indent=1))
    over = {u: s for u, s in by_unit.items() if s > UNIT_CAP_S}
    if over and os.environ.get("LLMCOURSE_PROFILE") == "ci":
        print(f"FAILED: units over the ci cap of {UNIT_CAP_S:.0f} s: {over}")
        session.exitstatus = 1
