"""The instructor's class report: which mistakes the class made, after a ``course grade`` run.

``course grade`` writes the run's own records into its work folder (:func:`write_record`: ``grading-record.json``,
the checkers' verdicts per submission and exercise, the scores, notes and tampering lines); :func:`write_report`
(``course report [GRADING_DIR]``, also called at the end of ``course grade``) turns them into

* ``report.html``: one self-contained page (no script, style, font or image from elsewhere; opens offline) with,
  per assignment, each exercise's attempt rate, pass rate and score distribution (a plot and a table); the named
  mistakes ranked by how many students made them (a student who made one in several exercises, e.g. in an answer a
  later exercise builds on, counts once; its exercises are listed), as a plot and a table with each one's hint and
  the lesson section it points to (``grader/sections/uNN.toml``, :mod:`coursetools.sections`); the unnamed
  failures grouped by the message of the property that broke; a students x exercises heat map (passed / failed,
  named mistake / failed / not attempted / error or limit), as a plot with the lowest scores first and as a table
  sortable by clicking a column head; the students to follow up (below :data:`FOLLOW_UP_FRACTION` of the points,
  or the same named mistake in several units) and the submissions that hit a limit (timeout, stopped process,
  tampering); a comparison across assignments when the run graded several. The plots are matplotlib figures
  inlined as SVG (vector, text kept as text), as the lessons draw theirs: nothing to load, so they render offline;
* ``report.json`` (the same numbers) and ``report-exercises.csv``, ``report-mistakes.csv``, ``report-students.csv``.

Only what a student's own feedback shows reaches it: verdict messages, mistake names (``no_scale``, never the
catalogue id) and hints; no check source, no reference code.
"""

from __future__ import annotations

import csv
import html
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

__all__ = ["RECORD_NAME", "FOLLOW_UP_FRACTION", "write_record", "load_record", "summarize", "write_report"]

RECORD_NAME = "grading-record.json"
FOLLOW_UP_FRACTION = 0.5  # a submission below this share of its points is listed to follow up

# what a note says when a submission hit a limit of the run (grading.py's and grader.supervise's notes)
_LIMIT_MARKS = {"stopped the grading process": "stopped a grading process", "timed out": "a cell timed out",
                "did not answer within": "the checker's deadline", "kernel died": "the kernel died",
                "modified the grading code": "modified the grading code"}


def write_record(work: Path, rows: list[dict], verdicts: dict, causes: dict, units: dict,
                 tampering: list[str]) -> Path:
    """``work/grading-record.json``: what the run decided, for the report (nothing the feedback does not show).

    Args:
        rows: :attr:`GradeReport.rows` (student, assignment, score, max_score, per_exercise, notes).
        verdicts: ``{(student, assignment): [verdict dicts]}`` from the checkers.
        causes: ``{(student, assignment): why no verdict}``.
        units: ``{assignment: unit}`` (course.toml's units, for the exercises and their points).
        tampering: the run summary's tampering lines.
    """
    from grader.core import bug_name

    subs = []
    sections: dict[str, str | None] = {}

    def section(bug_id: str | None) -> str | None:
        """The lesson section the mistake points to (grader/sections/uNN.toml); the grades never wait on it."""
        if not bug_id:
            return None
        if bug_id not in sections:
            try:
                from .sections import section_of

                sections[bug_id] = section_of(bug_id)
            except Exception:  # noqa: BLE001 - a missing or malformed map leaves the report without the section
                sections[bug_id] = None
        return sections[bug_id]

    for r in rows:
        key = (r["student"], r["assignment"])
        got = {v["exercise_id"]: v for v in verdicts.get(key) or []}
        exercises = []
        for e in units[r["assignment"]].exercises:
            v = got.get(e.id)
            exercises.append({
                "id": e.id, "points": float(r["per_exercise"].get(e.grade_id, 0.0)), "max_points": float(e.points),
                "status": v["status"] if v else "error",
                "mistake": bug_name(v["bug_id"]) if v and v.get("bug_id") else None,
                "hint": v.get("hint") if v else None,
                "section": section(v.get("bug_id")) if v else None,
                "message": (v.get("message") or "") if v else (causes.get(key) or "no verdict")})
        subs.append({"student": r["student"], "assignment": r["assignment"], "score": r["score"],
                     "max_score": r["max_score"], "notes": r["notes"], "exercises": exercises})
    path = work / RECORD_NAME
    path.write_text(json.dumps({"submissions": subs, "tampering": list(tampering)}, indent=1) + "\n",
                    encoding="utf-8")
    return path


def load_record(work: str | Path) -> dict:
    """The record :func:`write_record` left in a grading work folder.

    Raises:
        FileNotFoundError: no record there (not a ``course grade`` work folder, or one from before the report).
    """
    path = Path(work) / RECORD_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give the work folder of a `course grade` run "
                                "(default .grading/run), graded with this version of the course")
    return json.loads(path.read_text(encoding="utf-8"))


_CUT_SHORT = ("stopped the grading process", "did not finish within", "ended before answering", "timed out",
              "memory limit", "out of memory")


def _kind(ex: dict) -> str:
    """The heat map's class of one exercise of one submission (``missing``: the graded name is not defined, e.g. its
    cell does not parse: an error of the submission)."""
    if ex["status"] == "passed":
        return "passed"
    if ex["status"] == "not_attempted":
        return "not attempted"
    if ex["status"] in ("error", "missing") or any(m in (ex["message"] or "").lower() for m in _CUT_SHORT):
        return "error or limit"
    return "failed, named" if ex["mistake"] else "failed"


def _property(message: str) -> str:
    """The first line of a failure message with its numbers blanked: failures of one property group together."""
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else "(no message)"
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", first)[:200]


def _limits(notes: str) -> list[str]:
    low = (notes or "").lower()
    return [label for mark, label in _LIMIT_MARKS.items() if mark in low]


def summarize(record: dict, follow_up: float = FOLLOW_UP_FRACTION) -> dict:
    """The report's numbers from a record (see the module docstring): JSON-ready."""
    subs = record["submissions"]
    by_assignment: dict[str, list[dict]] = defaultdict(list)
    for s in subs:
        by_assignment[s["assignment"]].append(s)
    assignments = {}
    mistakes_by_student: dict[str, set] = defaultdict(set)
    for assignment, group in sorted(by_assignment.items()):
        n = len(group)
        exercises = []
        for i, ex0 in enumerate(group[0]["exercises"]):
            col = [s["exercises"][i] for s in group]
            dist = Counter(e["points"] for e in col)
            exercises.append({
                "id": ex0["id"], "max_points": ex0["max_points"], "students": n,
                "attempted": sum(e["status"] != "not_attempted" for e in col),
                "passed": sum(e["status"] == "passed" for e in col),
                "attempt_rate": sum(e["status"] != "not_attempted" for e in col) / n,
                "pass_rate": sum(e["status"] == "passed" for e in col) / n,
                "score_distribution": {f"{p:g}": c for p, c in sorted(dist.items())}})
        order = [ex["id"] for ex in exercises]
        named: dict[str, dict] = {}  # by mistake: a student who made it in two exercises counts once
        unnamed: dict[tuple[str, str], dict] = {}
        heat = []
        for s in sorted(group, key=lambda s: s["student"]):
            limits = _limits(s["notes"])
            cells = {}
            for e in s["exercises"]:
                cells[e["id"]] = _kind(e)
                if e["status"] != "failed":
                    continue
                if e["mistake"]:
                    m = named.setdefault(e["mistake"], {"mistake": e["mistake"], "exercise": e["id"],
                                                        "hint": e["hint"], "section": e.get("section"),
                                                        "students": [], "by_exercise": {}})
                    if s["student"] not in m["students"]:
                        m["students"].append(s["student"])
                    m["by_exercise"].setdefault(e["id"], []).append(s["student"])
                    mistakes_by_student[s["student"]].add((assignment, e["mistake"]))
                else:
                    g = unnamed.setdefault((e["id"], _property(e["message"])),
                                           {"exercise": e["id"], "property": _property(e["message"]), "students": []})
                    g["students"].append(s["student"])
            heat.append({"student": s["student"], "score": s["score"], "max_score": s["max_score"], "cells": cells,
                         "limits": limits})
        scores = [s["score"] / s["max_score"] if s["max_score"] else 0.0 for s in group]
        assignments[assignment] = {
            "students": n, "mean_score_fraction": sum(scores) / n,
            "pass_rate": sum(e["passed"] for e in exercises) / max(1, n * len(exercises)),
            "exercises": exercises,
            "named_mistakes": sorted(({**m, "exercises": sorted(m["by_exercise"], key=order.index)}
                                      for m in named.values()),
                                     key=lambda m: (-len(m["students"]), order.index(m["exercise"]), m["mistake"])),
            "unnamed_failures": sorted(unnamed.values(), key=lambda g: (-len(g["students"]), g["exercise"])),
            "heat_map": heat}
    follow = []
    for s in subs:
        reasons = []
        if s["max_score"] and s["score"] < follow_up * s["max_score"]:
            reasons.append(f"{s['score']:g}/{s['max_score']:g} points")
        if reasons:
            follow.append({"student": s["student"], "assignment": s["assignment"], "why": "; ".join(reasons)})
    repeated: dict[str, list] = defaultdict(list)
    for student, pairs in mistakes_by_student.items():
        names = Counter(name for _, name in pairs)
        repeated[student] = sorted(name for name, c in names.items() if c > 1)
    follow += [{"student": st, "assignment": "several", "why": "the same mistake in several units: " + ", ".join(names)}
               for st, names in sorted(repeated.items()) if names]
    limited = [{"student": s["student"], "assignment": s["assignment"], "limits": _limits(s["notes"]),
                "notes": s["notes"]} for s in subs if _limits(s["notes"])]
    return {"assignments": assignments, "follow_up": follow, "limits": limited,
            "tampering": list(record.get("tampering") or [])}


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left}th{background:#f3f3f3;cursor:pointer}
.passed{background:#5aae61}.failed{background:#f4a582}.failed-named{background:#d6604d}
.not-attempted{background:#d9d9d9}.error-or-limit{background:#e6c229}.small{color:#666;font-size:12px}
figure.plot{margin:.5em 0}figure.plot svg{max-width:100%;height:auto}
"""

# click a column head: sort that table's rows by it (numbers as numbers); no library, nothing fetched
_JS = """
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click', function(){
var i=th.cellIndex, t=th.closest('table'), rows=Array.from(t.querySelectorAll('tr')).slice(1), dir=th.dataset.dir==='1'?-1:1;
th.dataset.dir=dir===1?'1':'-1';rows.sort(function(a,b){var x=a.children[i].dataset.v||a.children[i].textContent,
y=b.children[i].dataset.v||b.children[i].textContent,nx=parseFloat(x),ny=parseFloat(y);
return (isNaN(nx)||isNaN(ny)?x.localeCompare(y):nx-ny)*dir;});rows.forEach(function(r){t.appendChild(r);});});});
"""


def _e(text) -> str:
    return html.escape(str(text))


KINDS = ("passed", "failed, named", "failed", "not attempted", "error or limit")
KIND_COLORS = {"passed": "#5aae61", "failed, named": "#d6604d", "failed": "#f4a582", "not attempted": "#d9d9d9",
               "error or limit": "#e6c229"}


def _t(text) -> str:
    """Plain text for a matplotlib label: ``$`` escaped (never mathtext), long labels shortened."""
    text = str(text).replace("$", r"\$")
    return text if len(text) <= 60 else text[:57] + "..."


def _svg(fig) -> str:
    """The figure as an inline ``<svg>`` element: text kept as text, no date, no raster image inside."""
    import io
    import warnings

    buf = io.StringIO()
    with warnings.catch_warnings():  # a layout that cannot fit long labels still draws (bbox_inches="tight")
        warnings.simplefilter("ignore", UserWarning)
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # no pyplot: no backend, no global state

    return Figure(figsize=(width, height), dpi=72, layout="constrained")


def _plot_scores(a: dict) -> str:
    """Per exercise: how many students scored each number of points (a histogram per exercise)."""
    exs = a["exercises"]
    cols = min(4, len(exs))
    rows = -(-len(exs) // cols)
    fig = _figure(2.6 * cols, 2.0 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, ex in zip(axes.flat, exs):
        top = ex["max_points"]
        pts = [float(p) for p in ex["score_distribution"]]
        counts = list(ex["score_distribution"].values())
        colors = [KIND_COLORS["passed"] if p >= top else KIND_COLORS["failed, named"] if p == 0
                  else KIND_COLORS["failed"] for p in pts]
        ax.bar(pts, counts, width=max(0.4, top / 8), color=colors)
        ax.set_xlim(-0.5 - top / 16, top + 0.5 + top / 16)
        ax.set_xticks(sorted({0.0, top, *pts}))
        ax.set_ylim(0, ex["students"])
        ax.set_title(_t(f"{ex['id']}: {ex['pass_rate']:.0%} passed"), fontsize=9)
        ax.set_xlabel("points", fontsize=8)
        ax.tick_params(labelsize=7)
        for p, c in zip(pts, counts):
            ax.text(p, c, str(c), ha="center", va="bottom", fontsize=7)
    for ax in list(axes.flat)[len(exs):]:
        ax.set_visible(False)
    axes[0][0].set_ylabel("students", fontsize=8)
    return _svg(fig)


def _plot_mistakes(a: dict, top: int = 25) -> str:
    """The named mistakes, most frequent first (the ``top`` most frequent)."""
    ms = a["named_mistakes"][:top]
    fig = _figure(7.5, 1.4 + 0.28 * len(ms))
    ax = fig.subplots()
    ys = list(range(len(ms)))[::-1]
    counts = [len(m["students"]) for m in ms]
    ax.barh(ys, counts, color=KIND_COLORS["failed, named"])
    ax.set_yticks(ys, [_t(f"{m['mistake']} ({', '.join(x.split('.', 1)[-1] for x in m['exercises'])})")
                       for m in ms], fontsize=8)
    for y, c in zip(ys, counts):
        ax.text(c, y, f" {c}", va="center", fontsize=8)
    ax.set_xlabel("students who made it", fontsize=8)
    ax.set_xlim(0, max(counts) * 1.15)
    ax.tick_params(axis="x", labelsize=7)
    return _svg(fig)


def _plot_heat(a: dict) -> str:
    """Students x exercises, coloured by :data:`KINDS`; the lowest scores first."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ids = [ex["id"] for ex in a["exercises"]]
    rows = sorted(a["heat_map"], key=lambda r: (r["score"] / r["max_score"] if r["max_score"] else 0.0, r["student"]))
    grid = [[KINDS.index(r["cells"][i]) for i in ids] for r in rows]
    fig = _figure(1.6 + 0.55 * len(ids), 1.6 + 0.17 * len(rows))
    ax = fig.subplots()
    ax.pcolormesh(grid, cmap=ListedColormap([KIND_COLORS[k] for k in KINDS]), vmin=-0.5, vmax=len(KINDS) - 0.5,
                  edgecolors="white", linewidth=0.5)  # vector cells: no raster image in the page
    ax.set_xticks([i + 0.5 for i in range(len(ids))], [_t(i.split(".", 1)[-1]) for i in ids], rotation=45,
                  ha="left", rotation_mode="anchor", fontsize=7)
    ax.set_yticks([j + 0.5 for j in range(len(rows))], [_t(f"{r['student']} ({r['score']:g})") for r in rows],
                  fontsize=6)
    ax.invert_yaxis()
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in KINDS], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _svg(fig)


def _plot(kind: str, draw, a: dict) -> str:
    """One plot in a ``<figure>``; a plot that cannot be drawn says why instead (the numbers stay in the tables)."""
    try:
        return f"<figure class='plot' data-plot='{kind}'>{draw(a)}</figure>"
    except Exception as exc:  # noqa: BLE001 - the report's tables do not depend on matplotlib
        return f"<p class='small'>plot not drawn ({_e(type(exc).__name__)}: {_e(exc)})</p>"


def _ex(m: dict) -> str:
    """A named mistake's exercises, with how many students it failed in each when it failed several."""
    if len(m["exercises"]) == 1:
        return _e(m["exercises"][0])
    return "<br>".join(f"{_e(x)} ({len(m['by_exercise'][x])})" for x in m["exercises"])


def _table(heads: list[str], rows: list[str]) -> str:
    """A sortable table: ``heads`` (column heads, HTML) over ``rows`` (each row's cells, HTML); ``<p>none</p>`` when
    there are no rows."""
    if not rows:
        return "<p>none</p>"
    return ("<table class='sortable'><tr>" + "".join(f"<th>{h}</th>" for h in heads) + "</tr>" +
            "".join(f"<tr>{r}</tr>" for r in rows) + "</table>")


def _html(summary: dict, title: str) -> str:
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{_CSS}</style>"
           f"</head><body><h1>{_e(title)}</h1>"]
    if summary["tampering"]:
        out.append("<h2>Changes to the grading code</h2><ul>" +
                   "".join(f"<li>{_e(line)}</li>" for line in summary["tampering"]) + "</ul>")
    if len(summary["assignments"]) > 1:
        out.append("<h2>Across assignments</h2><table class='sortable'><tr><th>assignment</th><th>students</th>"
                   "<th>mean score</th><th>pass rate</th></tr>")
        for name, a in summary["assignments"].items():
            out.append(f"<tr><td>{_e(name)}</td><td>{a['students']}</td><td>{a['mean_score_fraction']:.0%}</td>"
                       f"<td>{a['pass_rate']:.0%}</td></tr>")
        out.append("</table>")
    for name, a in summary["assignments"].items():
        out.append(f"<h2>{_e(name)}: {a['students']} students, mean {a['mean_score_fraction']:.0%} of the points</h2>")
        out.append("<h3>Exercises</h3>" + _plot("scores", _plot_scores, a) +
                   "<table class='sortable'><tr><th>exercise</th><th>attempted</th><th>passed</th>"
                   "<th>score distribution (points: students)</th></tr>")
        for ex in a["exercises"]:
            dist = ", ".join(f"{_e(p)}: {c}" for p, c in ex["score_distribution"].items())
            out.append(f"<tr><td>{_e(ex['id'])}</td><td data-v='{ex['attempt_rate']}'>{ex['attempt_rate']:.0%}</td>"
                       f"<td data-v='{ex['pass_rate']}'>{ex['pass_rate']:.0%}</td><td>{dist}</td></tr>")
        out.append("</table><h3>Named mistakes, most frequent first</h3>")
        if a["named_mistakes"]:
            out.append(_plot("mistakes", _plot_mistakes, a))
        out.append(_table(["students", "exercise", "mistake", "hint", "lesson section", "who"], [
            f"<td>{len(m['students'])}</td><td>{_ex(m)}</td><td>{_e(m['mistake'])}</td><td>{_e(m['hint'] or '')}</td>"
            f"<td>{_e(m.get('section') or '')}</td><td class='small'>{_e(', '.join(m['students']))}</td>"
            for m in a["named_mistakes"]]))
        out.append("<h3>Other failures, by the property that broke</h3>")
        out.append(_table(["students", "exercise", "what broke", "who"], [
            f"<td>{len(g['students'])}</td><td>{_e(g['exercise'])}</td><td>{_e(g['property'])}</td>"
            f"<td class='small'>{_e(', '.join(g['students']))}</td>" for g in a["unnamed_failures"]]))
        ids = [ex["id"] for ex in a["exercises"]]
        out.append("<h3>Students &times; exercises</h3>" + _plot("heat", _plot_heat, a) + "<p class='small'>" + " ".join(
            f"<span class='{k.replace(' ', '-').replace(',', '')}'>&nbsp;{_e(k)}&nbsp;</span>"
            for k in KINDS) +
            " &mdash; click a column head to sort</p><table class='sortable heat'><tr><th>student</th><th>score</th>" +
            "".join(f"<th>{_e(i)}</th>" for i in ids) + "</tr>")
        for row in a["heat_map"]:
            out.append(f"<tr><td>{_e(row['student'])}</td><td data-v='{row['score']}'>{row['score']:g}/"
                       f"{row['max_score']:g}</td>" + "".join(
                           f"<td class='{row['cells'][i].replace(' ', '-').replace(',', '')}' "
                           f"data-v='{_e(row['cells'][i])}'>{_e(row['cells'][i])}</td>" for i in ids) + "</tr>")
        out.append("</table>")
    out.append("<h2>Students to follow up</h2>")
    out.append(_table(["student", "assignment", "why"], [
        f"<td>{_e(f['student'])}</td><td>{_e(f['assignment'])}</td><td>{_e(f['why'])}</td>"
        for f in summary["follow_up"]]))
    out.append("<h2>Submissions that hit a limit</h2>")
    out.append(_table(["student", "assignment", "limit", "notes"], [
        f"<td>{_e(s['student'])}</td><td>{_e(s['assignment'])}</td><td>{_e(', '.join(s['limits']))}</td>"
        f"<td class='small'>{_e(s['notes'])}</td>" for s in summary["limits"]]))
    out.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(out)


def write_report(work: str | Path, title: str = "Class report") -> dict[str, Path]:
    """Write ``report.html``, ``report.json`` and three CSV files into ``work``; ``{kind: path}``.

    Raises:
        FileNotFoundError: ``work`` holds no grading record (see :func:`load_record`).
    """
    work = Path(work)
    summary = summarize(load_record(work))
    paths = {"html": work / "report.html", "json": work / "report.json", "exercises": work / "report-exercises.csv",
             "mistakes": work / "report-mistakes.csv", "students": work / "report-students.csv"}
    paths["html"].write_text(_html(summary, title), encoding="utf-8")
    paths["json"].write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    with paths["exercises"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["assignment", "exercise", "students", "attempted", "passed", "attempt_rate", "pass_rate"])
        for name, a in summary["assignments"].items():
            for ex in a["exercises"]:
                w.writerow([name, ex["id"], ex["students"], ex["attempted"], ex["passed"], f"{ex['attempt_rate']:.4f}",
                            f"{ex['pass_rate']:.4f}"])
    with paths["mistakes"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["assignment", "exercise", "mistake", "students", "hint", "section", "who"])
        for name, a in summary["assignments"].items():
            for m in a["named_mistakes"]:
                w.writerow([name, " ".join(m["exercises"]), m["mistake"], len(m["students"]), m["hint"] or "",
                            m.get("section") or "", " ".join(m["students"])])
            for g in a["unnamed_failures"]:
                w.writerow([name, g["exercise"], "", len(g["students"]), g["property"], "", " ".join(g["students"])])
    with paths["students"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["assignment", "student", "score", "max_score", "limits", *["exercise", "status"]])
        for name, a in summary["assignments"].items():
            for row in a["heat_map"]:
                w.writerow([name, row["student"], row["score"], row["max_score"], "; ".join(row["limits"]),
                            *[x for i, k in row["cells"].items() for x in (i, k)]])
    return paths
