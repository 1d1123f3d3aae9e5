"""``llmcourse.check()``: check an exercise notebook from inside JupyterLab, as ``course check`` does.

The check runs in a **separate process** (``python -m coursetools check --json NOTEBOOK``), on the
notebook **as last saved**: the kernel never imports the grader's checks, and what is graded is
exactly what ``course check`` (and the instructor's ``course grade``) would read from the file. The
verdicts come back as JSON and are shown as a table (HTML in JupyterLab, text elsewhere); the text
form is line for line the output of ``course check`` on the same file.

Which notebook: an explicit path, else the notebook of this kernel's JupyterLab session
(``__session__`` / ``JPY_SESSION_NAME``, set by ipykernel >= 6.10 for kernels that jupyter_server
starts for a notebook; VS Code's ``__vsc_ipynb_file__`` also works). A kernel started by a tool
(nbval, nbgrader's Validate and autograder) has neither, so the call prints one line instead of
guessing a file; under ``course grade`` (``LLMCOURSE_DEFER_CHECKS=1``) it only prints a note.

Unsaved changes: when ``llmcourse`` is imported in an IPython kernel it records the time and the
source of every cell run afterwards (an IPython ``pre_run_cell`` hook; nothing else is kept). A cell
that ran *after* the file was last written and whose source is not a code cell of the saved file is
code the check did not see, and the table says so at the top. Re-running unchanged cells after a save
raises no warning. What this cannot see: a cell edited but neither run nor saved (the kernel never
received it); the warning and the notebook's own introduction therefore tell the student to save first.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CheckResult", "check", "check_result", "render_text"]

DEFER_ENV = "LLMCOURSE_DEFER_CHECKS"  # same switch as grader.runner.DEFER_ENV (course grade's kernels)
TIMEOUT_S = 900

_LABELS = {"passed": "passed", "failed": "FAILED", "not_attempted": "not attempted",
           "missing": "FAILED (missing)", "error": "ERROR (grader)"}

# (time.time(), raw source) of every cell run in this kernel since llmcourse was imported
_RUNS: list[tuple[float, str]] = []


def _record(info) -> None:
    _RUNS.append((time.time(), getattr(info, "raw_cell", "") or ""))
    del _RUNS[:-2000]


def install_history_hook() -> None:
    """Record each cell run from now on (called when ``llmcourse`` is imported; a no-op outside IPython)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001
        return
    if shell is None or getattr(shell, "_llmcourse_history_hook", False):
        return
    try:
        shell.events.register("pre_run_cell", _record)
        shell._llmcourse_history_hook = True
    except Exception:  # noqa: BLE001 - an unusual shell: no unsaved-change warning, nothing else changes
        pass


# ------------------------------------------------------------------------------------------ which notebook


def _shell_ns() -> dict:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return {}
    return getattr(shell, "user_ns", {}) if shell is not None else {}


def this_notebook() -> Path | None:
    """The file of the notebook this kernel runs, or None when the kernel was not started for one."""
    ns = _shell_ns()
    for name in (ns.get("__session__"), os.environ.get("JPY_SESSION_NAME"), ns.get("__vsc_ipynb_file__")):
        if not name or not str(name).endswith(".ipynb"):
            continue
        p = Path(name)
        if p.is_absolute() and p.is_file():
            return p
        # jupyter_server passes the path relative to its root when it gives no name; the kernel's working
        # directory is the notebook's folder
        for candidate in (Path.cwd() / p, Path.cwd() / p.name):
            if candidate.is_file():
                return candidate.resolve()
    return None


# ------------------------------------------------------------------------------------------ unsaved changes


def _saved_code_cells(path: Path) -> set[str] | None:
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    out = set()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            out.add(("".join(src) if isinstance(src, list) else src).strip())
    return out


def unsaved_cells(path: Path, runs: list[tuple[float, str]] | None = None) -> list[str]:
    """Sources of cells run after ``path`` was last written that are not code cells of the saved file.

    The last recorded run (the cell calling the check) is left out.
    """
    runs = list(_RUNS if runs is None else runs)[:-1]
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return []
    saved = _saved_code_cells(path)
    if saved is None:
        return []
    late = [src.strip() for t, src in runs if t > mtime and src.strip()]
    return list(dict.fromkeys(s for s in late if s not in saved))


def unsaved_for(path: Path) -> list[str]:
    """:func:`unsaved_cells` when ``path`` is the notebook this kernel runs (or the kernel does not know its
    notebook); ``[]`` when the kernel runs another notebook: the cells it ran are not cells of ``path``, so
    they say nothing about whether ``path`` was saved."""
    own = this_notebook()
    if own is not None and own.resolve() != Path(path).resolve():
        return []
    return unsaved_cells(Path(path))


# ------------------------------------------------------------------------------------------ a warm first check

SERVER_ENV = "LLMCOURSE_CHECK_SERVER"  # same switch as coursetools.checkserver.SERVER_ENV
KEEP_WARM_S = 300.0  # the heartbeat: well inside the check server's 10-minute idle timeout
_WARM_THREAD = None


def keep_check_server_warm(notebook: str | os.PathLike | None = None, interval: float = KEEP_WARM_S) -> bool:
    """In an exercise notebook opened in JupyterLab: start the check server now and keep it warm while this
    kernel runs, so that neither the first check nor the first one after a long pause waits for imports.

    Runs ``python -m coursetools check --warm`` (a separate process: the kernel imports neither the grader nor
    the tooling) at once and then every ``interval`` seconds from a daemon thread; the server is the one
    ``course check`` uses (same per-user socket, same fingerprint of the course files, same idle exit once
    the kernel is gone). Nothing happens outside ``exercises/NN_slug/*.ipynb``, under nbval, nbgrader or
    ``course grade`` (no notebook known to the kernel, or checks deferred), or with
    ``LLMCOURSE_CHECK_SERVER=0``. Returns whether the heartbeat runs.
    """
    global _WARM_THREAD
    if os.environ.get(SERVER_ENV, "1") == "0" or os.environ.get(DEFER_ENV) == "1":
        return False
    path = Path(notebook) if notebook is not None else this_notebook()
    if path is None or path.resolve().parent.parent.name != "exercises":
        return False
    if _WARM_THREAD is not None and _WARM_THREAD.is_alive():
        return True
    import threading

    stop = threading.Event()

    def beat():
        while not stop.is_set():
            try:
                subprocess.run([sys.executable, "-m", "coursetools", "check", "--warm"], cwd=str(path.parent),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=120)
            except Exception:  # noqa: BLE001 - best effort: a check still works cold
                pass
            stop.wait(interval)

    _WARM_THREAD = threading.Thread(target=beat, name="llmcourse-check-server-heartbeat", daemon=True)
    _WARM_THREAD.stop = stop
    _WARM_THREAD.start()
    return True


def stop_keeping_warm() -> None:
    """End this kernel's heartbeat (the server then exits after its idle timeout)."""
    global _WARM_THREAD
    if _WARM_THREAD is not None:
        _WARM_THREAD.stop.set()
        _WARM_THREAD.join(timeout=5)
        _WARM_THREAD = None


# ------------------------------------------------------------------------------------------ the result


@dataclass
class CheckResult:
    """The report of ``course check --json`` for one notebook, plus what the kernel knows about saving."""

    report: dict
    notebook: Path
    unsaved: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def verdicts(self) -> list[dict]:
        return self.report.get("verdicts", [])

    @property
    def passed(self) -> bool:
        return bool(self.report.get("passed"))

    def text(self) -> str:
        """Exactly ``course check``'s text (the unsaved-changes warning, if any, is the first line)."""
        out = render_text(self.report)
        if self.unsaved:
            out = _unsaved_message(len(self.unsaved)) + "\n\n" + out
        return out

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return render_html(self.report, self.unsaved, self.seconds)


def render_text(report: dict) -> str:
    """``course check``'s text from its JSON report (no grader import: this runs in the kernel)."""
    if "error" in report:
        return f"course check: {report['error']}"
    out = [f"Unit {report['unit']} {report['title']}: {report['notebook']}", ""]
    if report["problems"]:
        out.append("Problems while loading your notebook (only imports, functions and classes are loaded):")
        out += [f"  - {p}" for p in report["problems"]] + [""]
    for v in report["verdicts"]:
        lines = [f"{v['exercise_id']}: {_LABELS[v['status']]} ({v['points']}/{v['max_points']} points)"]
        if v["message"]:
            lines += ["  " + line for line in v["message"].splitlines()]
        if v["bug_id"]:
            lines.append(f"  Diagnosis: {bug_name(v['bug_id'])}: {v['hint']}")
        out += ["\n".join(lines), ""]
    c = report["counts"]
    out.append(f"{c['passed']} passed, {c['failed']} failed, {c['not_attempted']} not attempted "
               f"— {report['earned']}/{report['total']} points")
    return "\n".join(out)


def _unsaved_message(n: int) -> str:
    what, verb, obj = ("a cell", "is", "it") if n == 1 else (f"{n} cells", "are", "them")
    return (f"Unsaved changes: {what} you ran since the last save {verb} not in the saved file, so this check "
            f"did not see {obj}. Save the notebook (Ctrl+S) and run the check again.")


_STATUS_STYLE = {"passed": ("#1a7f37", "#e6f4ea", "passed"), "failed": ("#b3261e", "#fce8e6", "failed"),
                 "missing": ("#b3261e", "#fce8e6", "failed (missing)"),
                 "error": ("#8a5300", "#fff4e5", "grader error"),
                 "not_attempted": ("#5f6368", "#f1f3f4", "not attempted")}


def bug_name(bug_id: str) -> str:
    """A catalogued mistake's name as learners read it: the id without its unit prefix
    (``B03.no_scale`` -> ``no_scale``; same as ``grader.core.bug_name``, which the kernel does not import)."""
    return bug_id.split(".", 1)[1] if "." in bug_id else bug_id


def _inline(text: str) -> str:
    """``text`` escaped for HTML, with `backticked` spans shown as inline code."""
    return re.sub(r"`([^`\n]+)`", r"<code>\1</code>", html.escape(text))


def render_html(report: dict, unsaved: list[str] | None = None, seconds: float = 0.0) -> str:
    """The verdicts as an HTML table (every text escaped; nothing but the verdicts is shown)."""
    e = html.escape
    parts = ['<div class="llmcourse-check" style="font-family: var(--jp-ui-font-family, sans-serif)">']
    if unsaved:
        parts.append('<p class="llmcourse-check-unsaved" style="background:#fff4e5;border-left:4px solid #f29900;'
                     f'padding:6px 10px"><b>{e(_unsaved_message(len(unsaved)))}</b></p>')
    if "error" in report:
        parts.append(f'<p class="llmcourse-check-error"><b>The check could not run:</b> {e(report["error"])}</p></div>')
        return "".join(parts)
    parts.append(f'<p><b>Unit {e(report["unit"])} — {e(report["title"])}</b>: {e(Path(report["notebook"]).name)} '
                 f'as saved{f" (checked in {seconds:.0f} s)" if seconds else ""}</p>')
    if report["problems"]:
        parts.append("<p>Problems while loading your notebook (only imports, functions and classes are loaded):</p><ul>")
        parts += [f"<li>{_inline(p)}</li>" for p in report["problems"]]
        parts.append("</ul>")
    cell = 'style="text-align:left;vertical-align:top;padding:4px 8px;border-bottom:1px solid #ddd"'
    parts.append('<table class="llmcourse-check-table" style="border-collapse:collapse">'
                 f"<thead><tr><th {cell}>Exercise</th><th {cell}>Result</th><th {cell}>Points</th>"
                 f"<th {cell}>Feedback</th></tr></thead><tbody>")
    for v in report["verdicts"]:
        color, bg, label = _STATUS_STYLE.get(v["status"], _STATUS_STYLE["failed"])
        feedback = []
        if v["message"]:
            feedback.append(f'<div class="llmcourse-check-message" style="white-space:pre-wrap">{_inline(v["message"])}</div>')
        if v["bug_id"]:
            feedback.append(f'<div class="llmcourse-check-bug"><b>Known mistake: <code>{e(bug_name(v["bug_id"]))}</code></b>'
                            f'{" — " + _inline(v["hint"]) if v["hint"] else ""}</div>')
        parts.append(f'<tr class="llmcourse-check-row" data-exercise="{e(v["exercise_id"])}" data-status="{e(v["status"])}">'
                     f"<td {cell}><code>{e(v['exercise_id'])}</code></td>"
                     f'<td {cell}><span style="color:{color};background:{bg};padding:1px 6px;border-radius:3px">'
                     f"{e(label)}</span></td>"
                     f"<td {cell}>{v['points']}/{v['max_points']}</td><td {cell}>{''.join(feedback)}</td></tr>")
    c = report["counts"]
    parts.append(f'</tbody><tfoot><tr class="llmcourse-check-total"><td {cell}><b>Total</b></td>'
                 f"<td {cell}>{c['passed']} passed, {c['failed']} failed, {c['not_attempted']} not attempted</td>"
                 f"<td {cell}><b>{report['earned']}/{report['total']}</b></td><td {cell}></td></tr></tfoot></table>")
    parts.append("<p style=\"color:#5f6368\">Same checks as <code>course check</code> in a terminal and as the "
                 "grader's; your code ran in a separate process.</p></div>")
    return "".join(parts)


# ------------------------------------------------------------------------------------------ entry points


def check_result(notebook: str | os.PathLike | None = None, timeout: float = TIMEOUT_S) -> CheckResult:
    """Run ``course check --json`` on ``notebook`` (default: this kernel's notebook) in a new process.

    Raises:
        FileNotFoundError: no notebook given and this kernel does not know its notebook, or no such file.
        subprocess.TimeoutExpired: the check took longer than ``timeout`` seconds.
    """
    path = Path(notebook).expanduser() if notebook is not None else this_notebook()
    if path is None:
        raise FileNotFoundError("this kernel was not started by JupyterLab for a notebook, so its file is unknown; "
                                "pass the path: llmcourse.check('exercises/NN_name/NN_name.ipynb')")
    if not path.is_file():
        raise FileNotFoundError(f"no such notebook: {path}")
    path = path.resolve()
    unsaved = unsaved_for(path)
    env = dict(os.environ)
    env.pop(DEFER_ENV, None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "coursetools", "check", "--json", str(path)],
                          capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        report = {"error": f"course check exited with code {proc.returncode}: {tail[0]}"}
    return CheckResult(report=report, notebook=path, unsaved=unsaved, seconds=seconds)


def check(notebook: str | os.PathLike | None = None, timeout: float = TIMEOUT_S, display: bool = True):
    """Check this exercise notebook **as last saved** and show the verdicts as a table.

    Runs the same isolated checks as ``course check`` in a separate process (the kernel never imports
    them) and shows, per exercise, passed / failed (what went wrong, and for a known mistake its name
    and a hint) / not attempted, the points and the total. Save first (Ctrl+S): the check reads the
    file, and a warning at the top says when cells you ran since the last save are not in it (see
    the module docstring for what is and is not detected). Works offline.

    Args:
        notebook: the ``.ipynb`` to check; default the notebook of this JupyterLab kernel.
        timeout: seconds before the check is given up.
        display: show the table (HTML in JupyterLab) and return None; ``False`` returns the
            :class:`CheckResult` instead (its ``text()`` is ``course check``'s output).

    Under ``course grade`` (``LLMCOURSE_DEFER_CHECKS=1``) and in kernels that do not know their
    notebook (nbval, nbgrader's Validate and autograder) it prints one line and checks nothing.
    """
    if notebook is None and os.environ.get(DEFER_ENV) == "1":
        print("llmcourse.check(): skipped here; course grade checks this notebook outside its kernel")
        return None
    if notebook is None and this_notebook() is None:
        print("llmcourse.check(): this kernel was not started by JupyterLab for a notebook (nbval, nbgrader's "
              "Validate, a script), so nothing was checked. In JupyterLab, save and run this cell; elsewhere "
              "pass the notebook: llmcourse.check('NN_name.ipynb'), or run `course check NN_name.ipynb`.")
        return None
    try:
        result = check_result(notebook, timeout=timeout)
    except FileNotFoundError as exc:
        print(f"llmcourse.check(): {exc}")
        return None
    except subprocess.TimeoutExpired:
        print(f"llmcourse.check(): the check did not finish within {timeout:.0f} s")
        return None
    if not display:
        return result
    try:
        from IPython import get_ipython
        from IPython.display import HTML
        from IPython.display import display as show

        if get_ipython() is not None:
            show(HTML(result._repr_html_()), metadata={"llmcourse": "check"})
            return None
    except ImportError:
        pass
    print(result.text())
    return None
