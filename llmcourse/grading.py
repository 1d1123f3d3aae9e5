"""Instructor workflows over nbgrader: release exercises, autograde submissions, write feedback.

Both run nbgrader as a subprocess in a *work root* (a temporary or ``.grading/`` folder laid out like
the course: ``solutions/``, ``exercises/``, ``.grading/``) with the course's
``grader/nbgrader_config.py``, so the repository itself is never modified by nbgrader.

* :func:`release` regenerates ``exercises/`` from ``solutions/``. It records the SHA-256 of every
  notebook it writes in ``exercises/.release.json``; a notebook whose bytes no longer match was edited
  in place (by a student) and is never overwritten: release refuses and says how to proceed.
* :func:`grade` autogrades a folder of submissions laid out as nbgrader's
  ``submitted/<student>/<assignment>/<notebook>.ipynb``, one student at a time, so a broken
  submission is recorded and the run goes on. It writes feedback HTML (hidden checks stripped by
  ``grader.feedback``) and ``grades.csv``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .manifest import Unit, load_course

__all__ = ["ReleaseResult", "GradeReport", "generate_exercises", "release", "grade"]

MANIFEST_NAME = ".release.json"


def _config_path(course_root: Path) -> Path:
    return course_root / "grader" / "nbgrader_config.py"


def _nbgrader(args: list[str], work: Path, course_root: Path, timeout: float | None = None,
              env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m nbgrader <args>`` in ``work`` with the course config."""
    (work / "nbgrader_config.py").write_text(
        f"c = get_config()\nload_subconfig({str(_config_path(course_root))!r})\n", encoding="utf-8")
    env = {**os.environ, "LLMCOURSE_NBGRADER_ROOT": str(work), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(course_root), os.environ.get("PYTHONPATH")])),
           # nbgrader runs the `alembic` executable: make this interpreter's scripts folder findable
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def generate_exercises(units: list[Unit] | None = None, course=None) -> dict[str, str]:
    """Generate the release notebooks in a temporary work root; ``{repo-relative path: text}``.

    Raises:
        RuntimeError: nbgrader failed (its log is included).
    """
    course = course or load_course()
    units = units if units is not None else course.available_units
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="llmcourse-release-") as tmp:
        work = Path(tmp)
        for u in units:
            src = course.root / Path(u.solution).parent
            shutil.copytree(src, work / "solutions" / u.name, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
            proc = _nbgrader(["generate_assignment", u.name, "--force"], work, course.root)
            produced = work / "exercises" / u.name / Path(u.exercise).name
            if proc.returncode != 0 or not produced.exists():
                raise RuntimeError(f"nbgrader generate_assignment {u.name} failed:\n{proc.stdout}\n{proc.stderr}")
            text = produced.read_text(encoding="utf-8")
            out[u.exercise] = text if text.endswith("\n") else text + "\n"
    return out


@dataclass
class ReleaseResult:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # --check: would change
    refused: list[str] = field(default_factory=list)  # edited in place: not overwritten

    @property
    def ok(self) -> bool:
        return not self.stale and not self.refused


def _load_manifest(course) -> dict:
    path = course.root / "exercises" / MANIFEST_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def release(check: bool = False, force: bool = False, unit_ids: list[str] | None = None, course=None) -> ReleaseResult:
    """Regenerate ``exercises/`` from ``solutions/`` (or, with ``check``, only report what is stale).

    A committed exercise notebook whose SHA-256 differs from the one recorded at its last release has
    been edited in place; it is listed in ``refused`` and left untouched unless ``force``.
    """
    course = course or load_course()
    units = [course.unit(u) for u in unit_ids] if unit_ids else course.available_units
    generated = generate_exercises(units, course)
    manifest = _load_manifest(course)
    result = ReleaseResult()
    for rel, text in generated.items():
        path = course.root / rel
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text and manifest.get(rel) == _sha(text):
            result.unchanged.append(rel)
            continue
        if check:
            result.stale.append(rel)
            continue
        edited = current is not None and current != text and manifest.get(rel) != _sha(current)
        if edited and not force:
            result.refused.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        manifest[rel] = _sha(text)
        result.written.append(rel)
    if check:
        listed = {u.exercise for u in course.available_units}
        extra = sorted(set(manifest) - listed)
        result.stale += [f"{MANIFEST_NAME} lists {rel}, which is not an available unit's exercise" for rel in extra]
    elif result.written:
        (course.root / "exercises" / MANIFEST_NAME).write_text(
            json.dumps(dict(sorted(manifest.items())), indent=1) + "\n", encoding="utf-8")
    return result


# ------------------------------------------------------------------------------------------ grading


@dataclass
class GradeReport:
    out_dir: Path
    rows: list[dict] = field(default_factory=list)  # one per (student, assignment)
    grades_csv: Path | None = None

    def render(self) -> str:
        lines = [f"{'student':20} {'assignment':28} {'score':>9}  notes"]
        for r in self.rows:
            score = f"{r['score']:g}/{r['max_score']:g}"
            lines.append(f"{r['student']:20} {r['assignment']:28} {score:>9}  {r['notes']}")
        lines.append(f"grades: {self.grades_csv}")
        lines.append(f"feedback: {self.out_dir / '.grading' / 'feedback'}")
        return "\n".join(lines)


def _submitted_root(path: Path) -> Path:
    return path / "submitted" if (path / "submitted").is_dir() else path


def grade(submissions: str | os.PathLike, out_dir: str | os.PathLike | None = None, cell_timeout: int | None = None,
          course=None) -> GradeReport:
    """Autograde every ``<student>/<assignment>/`` under ``submissions`` and write feedback and grades.

    Args:
        submissions: nbgrader's ``submitted/`` folder, or a folder containing one.
        out_dir: the work root (default ``<course>/.grading/run``); it is recreated.
        cell_timeout: seconds per cell (default ``$LLMCOURSE_CELL_TIMEOUT`` or 600).

    Returns:
        :class:`GradeReport`: a row per submission with score, max score and notes (an nbgrader
        failure, cells that errored or timed out). Never raises for a broken submission.

    Raises:
        FileNotFoundError: ``submissions`` does not exist. ValueError: it holds no known assignment.
    """
    course = course or load_course()
    src = _submitted_root(Path(submissions))
    if not src.is_dir():
        raise FileNotFoundError(f"no such folder: {submissions}")
    known = {u.name: u for u in course.units if u.exercises}
    pairs = sorted((s.name, a.name) for s in src.iterdir() if s.is_dir() for a in s.iterdir()
                   if a.is_dir() and a.name in known)
    if not pairs:
        raise ValueError(f"{submissions} holds no submissions in the layout <student>/<assignment>/ for any of "
                         f"{sorted(known)}")
    work = Path(out_dir) if out_dir else course.root / ".grading" / "run"
    if work.exists():
        shutil.rmtree(work)
    (work / ".grading").mkdir(parents=True)
    shutil.copytree(src, work / ".grading" / "submitted")
    env_extra = {"LLMCOURSE_CELL_TIMEOUT": str(cell_timeout)} if cell_timeout else {}
    report = GradeReport(out_dir=work)
    for assignment in sorted({a for _, a in pairs}):
        u = known[assignment]
        shutil.copytree(course.root / Path(u.solution).parent, work / "solutions" / assignment)
        proc = _nbgrader(["generate_assignment", assignment, "--force"], work, course.root)
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment {assignment} failed:\n{proc.stdout}\n{proc.stderr}")
        for student in sorted(s for s, a in pairs if a == assignment):
            notes = []
            proc = _nbgrader(["autograde", assignment, f"--student={student}", "--create", "--force"], work,
                             course.root, env_extra=env_extra)
            if proc.returncode != 0:
                notes.append("autograde reported errors: " + _last_error(proc))
            fb = _nbgrader(["generate_feedback", assignment, f"--student={student}", "--force"], work, course.root)
            if fb.returncode != 0:
                notes.append("feedback failed: " + _last_error(fb))
            notes += _execution_notes(work / ".grading" / "autograded" / student / assignment)
            report.rows.append({"student": student, "assignment": assignment, "notes": "; ".join(notes),
                                **_scores(work, student, assignment, u.points)})
    report.grades_csv = _write_grades(work, report.rows, course)
    return report


def _last_error(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or "").strip().splitlines()
    lines = [ln for ln in text if "ERROR" in ln or "Error" in ln] or text or ["unknown error"]
    return lines[-1][:200]


def _execution_notes(folder: Path) -> list[str]:
    import nbformat

    notes = []
    for nb_path in folder.glob("*.ipynb"):
        try:
            nb = nbformat.read(nb_path, as_version=4)
        except Exception:
            notes.append(f"{nb_path.name} could not be read")
            continue
        timeouts = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                       if o.get("output_type") == "error" and "Timeout" in str(o.get("ename", "")))
        errors = sum(1 for c in nb.cells if c.cell_type == "code" and any(
            o.get("output_type") == "error" for o in c.get("outputs", [])))
        if timeouts:
            notes.append(f"{timeouts} cell(s) timed out")
        if errors:
            notes.append(f"{errors} cell(s) raised errors")
    return notes


def _scores(work: Path, student: str, assignment: str, max_points: int) -> dict:
    """Total and per-exercise scores of one submission, from nbgrader's gradebook (0 when none recorded)."""
    from nbgrader.api import Gradebook, MissingEntry

    per: dict[str, float] = {}
    try:
        with Gradebook(f"sqlite:///{work / '.grading' / 'gradebook.db'}") as gb:
            submission = gb.find_submission(assignment, student)
            for nb in submission.notebooks:
                for g in nb.grades:
                    per[g.name] = float(g.score or 0.0)
    except MissingEntry:
        pass
    return {"score": float(sum(per.values())), "max_score": float(max_points), "per_exercise": per}


def _write_grades(work: Path, rows: list[dict], course) -> Path:
    path = work / "grades.csv"
    grade_ids = [e.grade_id for u in course.units for e in u.exercises
                 if any(r["assignment"] == u.name for r in rows)]
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["student", "assignment", "score", "max_score", *grade_ids, "notes"])
        for r in rows:
            w.writerow([r["student"], r["assignment"], r["score"], r["max_score"],
                        *[r["per_exercise"].get(g, "") for g in grade_ids], r["notes"]])
    return path
