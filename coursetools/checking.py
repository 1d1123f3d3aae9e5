"""``course check`` in one process: the report of one notebook's verdicts and its text.

Used by the ``course`` command's cold path (:mod:`coursetools.cli`), by the warm check server
(:mod:`coursetools.checkserver`, which runs :func:`check_command` per request) and by ``course progress``.
It has its own module so that the CLI and the check server both import it and not each other.
"""

from __future__ import annotations

import contextlib
import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

def verdict_record(v) -> dict:
    """A verdict as plain JSON data (what ``course check --json`` and ``llmcourse.check()`` show)."""
    return {"exercise_id": v.exercise_id, "status": v.status, "message": v.message, "bug_id": v.bug_id,
            "hint": v.hint, "points": v.points, "max_points": v.max_points, "notes": list(v.notes)}


def check_report(unit, verdicts, notebook: str) -> dict:
    """``course check``'s result as plain data: the text report and the JSON report are both made from it."""
    counts = {s: sum(1 for v in verdicts if v.status == s) for s in ("passed", "failed", "not_attempted")}
    counts["failed"] += len(verdicts) - sum(counts.values())  # missing / grader errors count as failed
    return {
        "unit": unit.id, "title": unit.title, "notebook": str(notebook),
        "problems": list(dict.fromkeys(n for v in verdicts for n in v.notes)),
        "verdicts": [verdict_record(v) for v in verdicts],
        "earned": sum(v.points for v in verdicts), "total": sum(v.max_points for v in verdicts),
        "counts": counts, "passed": all(v.passed for v in verdicts),
    }


def render_check_report(report: dict) -> str:
    """The text of ``course check`` from :func:`check_report`'s data."""
    from grader.core import Verdict

    out = [f"Unit {report['unit']} {report['title']}: {report['notebook']}", ""]
    if report["problems"]:
        out.append("Problems while loading your notebook (only imports, functions and classes are loaded):")
        out += [f"  - {p}" for p in report["problems"]] + [""]
    for rec in report["verdicts"]:
        out += [Verdict(**rec).render(notes=False), ""]
    c = report["counts"]
    out.append(f"{c['passed']} passed, {c['failed']} failed, {c['not_attempted']} not attempted "
               f"— {report['earned']}/{report['total']} points")
    return "\n".join(out)


def check_command(notebook: str, as_json: bool, server: str | None = None, cache: str | None = None) -> int:
    """``course check`` in this process (the cold path, and what the warm check server runs): prints the
    report (text or JSON) and returns the exit code.

    With ``server`` (the check server key, :func:`coursetools.checkserver.server_key`, computed by the ``course``
    command or sent by the client) the report is also stored in the check-result cache
    (:mod:`coursetools.resultcache`) that ``course progress`` reuses, in the folder ``cache`` (default: this
    process's setting; the server gets its client's).
    """
    import json

    from grader.forkserver import start_forkserver

    start_forkserver()  # first thing: the learner processes' parent preloads torch while this process imports its own
    from grader.runner import check_notebook

    try:
        unit, verdicts = check_notebook(notebook)
    except (FileNotFoundError, ValueError) as exc:
        if as_json:
            print(json.dumps({"error": str(exc)}))
        print(f"course check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = check_report(unit, verdicts, notebook)
    if server is not None:
        from .resultcache import result_key, store

        with contextlib.suppress(Exception):
            store(result_key(notebook, unit, server), report, cache)
    print(json.dumps(report, indent=1) if as_json else render_check_report(report))
    return EXIT_OK if report["passed"] else EXIT_FAIL
