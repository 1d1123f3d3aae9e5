"""Instructor workflows over nbgrader: release exercises, autograde submissions, write feedback.

Both run nbgrader as a subprocess in a *work root* (a temporary or ``.grading/`` folder laid out like
the course: ``solutions/``, ``exercises/``, ``.grading/``) with the course's
``grader/nbgrader_config.py``, so the repository itself is never modified by nbgrader.

* :func:`release` regenerates ``exercises/`` from ``solutions/``. It records the SHA-256 of every
  notebook it writes in ``exercises/.release.json``; a notebook whose bytes no longer match was edited
  in place (by a student) and is never overwritten: release refuses and says how to proceed.
* :func:`grade` grades a folder of submissions laid out as nbgrader's
  ``submitted/<student>/<assignment>/<notebook>.ipynb``. Scores come from the course's checker
  (a process started from a hashed copy of the grading code, where learner code never runs; see
  ``grader/worker.py``); nbgrader executes the notebooks, keeps the gradebook and writes feedback
  HTML (hidden checks stripped by ``grader.feedback``). Only these scores are trusted: nbgrader's
  own Autograde button runs the hidden cells inside the student's kernel.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmcourse.manifest import Unit, load_course

__all__ = ["ReleaseResult", "GradeReport", "generate_exercises", "release", "grade"]

MANIFEST_NAME = ".release.json"


def _config_path(course_root: Path) -> Path:
    return course_root / "grader" / "nbgrader_config.py"


def _write_config(work: Path, course_root: Path) -> None:
    """``work/nbgrader_config.py`` loading the course's config; replaced atomically, and only when it differs (the
    parallel nbgrader runs of ``course grade --jobs`` start while it is in place: never a half-written file)."""
    path = work / "nbgrader_config.py"
    text = f"c = get_config()\nload_subconfig({str(_config_path(course_root))!r})\n"
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    tmp = path.with_name(f".nbgrader_config.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _nbgrader(args: list[str], work: Path, course_root: Path, timeout: float | None = None,
              env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m nbgrader <args>`` in ``work`` with the course config."""
    _write_config(work, course_root)
    env = _nbgrader_env(work, course_root, env_extra)
    return subprocess.run([*_nbgrader_command(), *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)


# `python -m nbgrader`, less a second and a half of CPU per start: nbformat's jsonschema imports rfc3987_syntax when
# it is installed (a dependency of jupyter-events) for its "iri" format checks, and that module compiles some forty
# lark grammars at import (measured with cProfile: most of nbgrader's start-up). No notebook schema nbgrader validates
# uses those formats, and jsonschema skips a format checker whose module cannot be imported.
_NBGRADER_MAIN = ("import sys; sys.modules['rfc3987_syntax'] = None; sys.argv[0] = 'nbgrader'; "
                  "from nbgrader.apps.nbgraderapp import main; main()")


def _nbgrader_command() -> list[str]:
    return [sys.executable, "-c", _NBGRADER_MAIN]


def _nbgrader_env(work: Path, course_root: Path, env_extra: dict | None = None) -> dict:
    return {**os.environ, "LLMCOURSE_NBGRADER_ROOT": str(work), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(course_root), os.environ.get("PYTHONPATH")])),
            # nbgrader runs the `alembic` executable: make this interpreter's scripts folder findable
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            **(env_extra or {})}


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
        # one nbgrader run for every unit (its assignment id is a glob over solutions/); a unit whose release
        # is missing afterwards is generated again alone, so that the error names it
        batch = _nbgrader(["generate_assignment", "*", "--force"], work, course.root) if len(units) > 1 else None
        for u in units:
            produced = work / "exercises" / u.name / Path(u.exercise).name
            if batch is None or batch.returncode != 0 or not produced.exists():
                proc = _nbgrader(["generate_assignment", u.name, "--force"], work, course.root)
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
    timings: dict = field(default_factory=dict)  # seconds per phase of the run (where the time went)
    tampering: list[str] = field(default_factory=list)  # one line per submission that changed the grading code
    class_report: Path | str | None = None  # report.html (coursetools/report.py), or why it was not written
    executed: bool = False  # the notebooks were run in nbgrader (grade(execute=True))
    jobs: int = 1

    def phase_table(self) -> str:
        """Where the time went: one line per phase of :attr:`timings`, the rest of the wall time as "other".

        Phases marked "beside" ran at the same time as another phase and are not counted in "other".
        """
        if not self.timings:
            return ""
        total = self.timings.get(TOTAL_PHASE)
        n = len(self.rows)
        how = "notebooks run in nbgrader (--execute)" if self.executed else "notebooks as saved, nothing re-run"
        lines = [f"where the time went ({n} submission{'s' * (n != 1)}, --jobs {self.jobs}, {how}):",
                 f"  {'phase':52} {'seconds':>8}"]
        counted = 0.0
        for phase, seconds in self.timings.items():
            if phase == TOTAL_PHASE:
                continue
            lines.append(f"  {phase:52} {seconds:8.1f}")
            if "beside" not in phase:
                counted += seconds
        if total is not None:
            lines.append(f"  {'other':52} {max(total - counted, 0.0):8.1f}")
            per = f" ({total / n:.2f} s per submission)" if n else ""
            lines.append(f"  {TOTAL_PHASE:52} {total:8.1f}{per}")
        return "\n".join(lines)

    def render(self) -> str:
        lines = [f"{'student':20} {'assignment':28} {'score':>9}  notes"]
        for r in self.rows:
            score = f"{r['score']:g}/{r['max_score']:g}"
            lines.append(f"{r['student']:20} {r['assignment']:28} {score:>9}  {r['notes']}")
        lines += self.tampering
        lines.append(f"grades: {self.grades_csv}")
        lines.append(f"feedback: {self.out_dir / '.grading' / 'feedback'}")
        if self.class_report is not None:
            lines.append(f"class report: {self.class_report}")
        table = self.phase_table()
        return "\n".join(lines + ([table] if table else []))


def _submitted_root(path: Path) -> Path:
    return path / "submitted" if (path / "submitted").is_dir() else path


class GradingTampered(RuntimeError):
    """The grading could not go on with trusted grading code (a fresh copy of it did not verify): nothing is kept."""


TAMPER_NOTE = "the submission modified the grading code"
TOTAL_PHASE = "total (wall clock)"
SNAPSHOT_ITEMS = ("grader", "llmcourse", "course.toml", "assets")
RESTORE_HINT = "git checkout -- grader llmcourse course.toml assets"


def _skipped(rel_parts) -> bool:
    return "__pycache__" in rel_parts


def _read_tree(root: Path, items=SNAPSHOT_ITEMS) -> dict[str, bytes]:
    """``{relative path: bytes}`` of every file under ``items`` (bytecode caches ignored)."""
    out: dict[str, bytes] = {}
    for item in items:
        base = root / item
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.exists() else []
        for f in files:
            if _skipped(f.parts) or f.suffix == ".pyc":
                continue
            out[str(f.relative_to(root))] = f.read_bytes()
    return out


def _tree_digest(root: Path, items=SNAPSHOT_ITEMS, bytecode: bool = False) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``items`` (bytecode caches ignored unless ``bytecode``).

    The checker's copy is digested with ``bytecode``: its checkers run with ``-B`` (they write no bytecode), so a
    ``.pyc`` there was planted (Python would load it in place of an unchanged source of the same size and mtime).
    """
    out: dict[str, str] = {}
    for item in items:
        base = root / item
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.exists() else []
        for f in files:
            if not bytecode and (_skipped(f.parts) or f.suffix == ".pyc"):
                continue
            try:
                out[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
            except OSError:  # made unreadable: a change all the same
                out[str(f.relative_to(root))] = "unreadable"
    return out


def _diff(now: dict[str, str], then: dict[str, str]) -> list[str]:
    return sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))


def _shown(files: list[str], n: int = 4) -> str:
    return ", ".join(files[:n]) + (f" and {len(files) - n} more" if len(files) > n else "")


@dataclass
class Tampering:
    """A change to the grading files seen at one verification: ``checkout`` (the course's own files, changed since
    the last verification) and ``copies`` (the run's copies, ``"(checker copy) grader/core.py"``)."""

    during: str
    checkout: list[str]
    copies: list[str]

    @property
    def files(self) -> list[str]:
        return [*self.checkout, *self.copies]

    def __str__(self) -> str:
        return f"{_shown(self.files)} changed {self.during}"


class GradingSnapshot:
    """The grading code as it was before the first submission ran, held in memory, and the run's copies of it.

    The files of ``grader/``, ``llmcourse/``, ``course.toml`` and ``assets/`` are read once, into this process's
    memory (where no learner code runs), and written into the checker's copy (``path``); the checker processes
    import the grading code from there. :meth:`check` compares the checkout and every copy with the digests
    of those bytes; :meth:`repair` writes a fresh copy for each one that changed. The checkout itself is never
    written: a change to it is reported (:attr:`checkout_changed`) and, from then on, nbgrader runs from a
    verified copy too (:attr:`nbgrader_root`).
    """

    def __init__(self, course_root: Path):
        self.course_root = Path(course_root)
        self._files = _read_tree(self.course_root)
        self.original_digest = {k: hashlib.sha256(v).hexdigest() for k, v in self._files.items()}
        self.digest = self.original_digest
        self._seen_checkout = dict(self.original_digest)
        self.checkout_changed: set[str] = set()  # every checkout file seen changed during the run
        self._copies: dict[str, Path] = {}  # label -> its folder
        self._old: list[Path] = []  # replaced copies, removed at cleanup (a running nbgrader may still read one)
        self._lock = threading.RLock()
        self.path = self._write_copy("checker")

    def _write_copy(self, label: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"llmcourse-{label}-"))
        for rel, data in self._files.items():
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if _tree_digest(path, bytecode=label == "checker") != self.digest:
            raise GradingTampered(f"course grade stopped: a fresh copy of the grading code ({path}) changed while it "
                                  "was written: something outside the graded submissions writes there. No scores "
                                  "were written.")
        self._copies[label] = path
        return path

    @property
    def nbgrader_root(self) -> Path:
        """The course root nbgrader runs with: the checkout, or a verified copy once the checkout has changed."""
        with self._lock:
            if not self.checkout_changed:
                return self.course_root
            if "nbgrader" not in self._copies:
                self._write_copy("nbgrader")
            return self._copies["nbgrader"]

    def check(self, during: str) -> Tampering | None:
        """What changed since the last check (the checkout) and against the digests (the copies), or None."""
        with self._lock:
            now = _tree_digest(self.course_root)
            checkout = _diff(now, self._seen_checkout)
            self._seen_checkout = now
            self.checkout_changed.update(checkout)
            copies = [f"({label} copy) {k}" for label, path in sorted(self._copies.items())
                      for k in _diff(_tree_digest(path, bytecode=label == "checker"), self.digest)]
            return Tampering(during, checkout, copies) if checkout or copies else None

    def repair(self) -> None:
        """A fresh copy in place of each copy that changed (the checker's ``path`` moves; restart its checkers)."""
        with self._lock:
            for label, path in sorted(self._copies.items()):
                if _tree_digest(path, bytecode=label == "checker") != self.digest:
                    self._old.append(path)
                    new = self._write_copy(label)
                    if label == "checker":
                        self.path = new
            if self.checkout_changed and "nbgrader" not in self._copies:
                self._write_copy("nbgrader")

    def restore_advice(self) -> str | None:
        """One line for the instructor when the checkout's grading files changed during the run, else None."""
        if not self.checkout_changed:
            return None
        files = sorted(self.checkout_changed)
        return (f"the grading files of the checkout {self.course_root} changed during the run ({_shown(files, 6)}): the "
                f"grading used the copy taken before the first submission ran; restore them (e.g. `{RESTORE_HINT}` "
                "and delete any file that `git status` shows as new there) before you grade again")

    def cleanup(self) -> None:
        for path in [*self._copies.values(), *self._old]:
            shutil.rmtree(path, ignore_errors=True)


class CheckerProcess:
    """``grader.checker`` started from a snapshot; verdicts come back over a dedicated pipe.

    Supervised: a reply is awaited with a deadline (:data:`CHECKER_S_PER_EXERCISE` per exercise), polling
    the checker's state meanwhile. A checker found stopped, dead or past its deadline is killed with
    everything below it (its forkserver and workers), a fresh one is started from the same snapshot, and
    that submission scores 0 with its cause (fail closed); the run goes on with the next one.
    """

    def __init__(self, snapshot: GradingSnapshot, log_path: Path):
        self._snapshot, self._log_path = snapshot, log_path
        self._start()

    def _start(self) -> None:
        snapshot, log_path = self._snapshot, self._log_path
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        code = (f"import sys; sys.path.insert(0, {str(snapshot.path)!r}); "
                "from grader.checker import main; sys.exit(main())")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update({"LLMCOURSE_ROOT": str(snapshot.path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        self._log = open(log_path, "ab")  # noqa: SIM115
        # -B: no bytecode written into the snapshot, where any .pyc is then a planted one (see _tree_digest)
        self.proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", code, str(req_r), str(rep_w)],
                                     pass_fds=(req_r, rep_w),
                                     cwd=snapshot.path, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log, start_new_session=True)
        os.close(req_r)
        os.close(rep_w)
        os.set_blocking(self._req_w, False)
        self._buf = b""
        hello = self._read(time.monotonic() + CHECKER_START_S)
        if not isinstance(hello, dict) or not hello.get("ready") or \
                Path(hello.get("root", "")).resolve() != snapshot.path.resolve():
            self._kill()
            raise RuntimeError(f"the checker process did not start from the snapshot (see {log_path})")

    def _read(self, until: float) -> dict | str:
        """The next reply line as a dict, or why none came: "stopped", "ended" or "timeout"."""
        from grader.supervise import stopped

        while b"\n" not in self._buf:
            left = until - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self._rep_r], [], [], min(left, 0.25))
            if ready:
                chunk = os.read(self._rep_r, 1 << 20)
                if not chunk:
                    return "ended"
                self._buf += chunk
            elif stopped(self.proc.pid):
                return "stopped"
            elif self.proc.poll() is not None:
                return "ended"
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return "ended"

    def _send(self, line: str, until: float) -> str | None:
        """Write a request line without blocking past ``until``; None, or why it could not be sent."""
        from grader.supervise import stopped

        data = memoryview(line.encode("utf-8"))
        while data:
            left = until - time.monotonic()
            if left <= 0:
                return "timeout"
            _, ready, _ = select.select([], [self._req_w], [], min(left, 0.25))
            if ready:
                try:
                    data = data[os.write(self._req_w, data[:1 << 16]):]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    return "ended"
            elif stopped(self.proc.pid):
                return "stopped"
            elif self.proc.poll() is not None:
                return "ended"
        return None

    def verdicts(self, key: list[str], unit_id: str, sources: list[str],
                 n_exercises: int = 1) -> tuple[list[dict] | None, str]:
        """``(verdict dicts, "")``, or ``(None, cause)`` when none could be computed (fail closed)."""
        from grader.supervise import STOPPED_NOTE

        until = time.monotonic() + CHECKER_S_PER_EXERCISE * max(n_exercises, 1) + 60
        try:
            reply = self._send(json.dumps({"key": key, "unit": unit_id, "sources": sources}) + "\n", until)
            reply = reply or self._read(until)
        except (OSError, ValueError) as exc:
            reply = f"failed ({type(exc).__name__})"
        if isinstance(reply, dict) and "verdicts" in reply:
            return reply["verdicts"], ""
        if isinstance(reply, dict) and "error" in reply:
            return None, f"the checker failed: {reply['error']}"
        cause = {"stopped": f"{STOPPED_NOTE} (the checker was found stopped)",
                 "ended": f"{STOPPED_NOTE} (the checker process ended unexpectedly)",
                 "timeout": "the checker did not answer within its deadline"}.get(reply, f"the checker {reply}")
        self.restart()
        return None, cause

    def _kill(self) -> None:
        from grader.supervise import kill_tree

        kill_tree(self.proc.pid, session=self.proc.pid, include_root=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(OSError, ValueError):
            self._log.close()
        for fd in (self._req_w, self._rep_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def restart(self) -> None:
        """Kill this checker and everything below it; start a fresh one from the same snapshot."""
        self._kill()
        self._start()

    def close(self) -> None:
        from grader.supervise import kill_tree

        with contextlib.suppress(OSError, ValueError):
            self._send(json.dumps({"op": "exit"}) + "\n", time.monotonic() + 5)
        with contextlib.suppress(OSError):
            os.close(self._req_w)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid, include_root=True)
            self.proc.wait(timeout=10)
        kill_tree(self.proc.pid, session=self.proc.pid)  # anything the checker's children left
        with contextlib.suppress(OSError):
            os.close(self._rep_r)
        self._log.close()


CHECKER_START_S = 300.0  # the checker imports every unit's checks and references first
CHECKER_S_PER_EXERCISE = 150.0  # a backstop: a worker's own limits (load 60 s, check 30 s) end far sooner


def _submission_sources(path: Path, unit) -> tuple[list[str], list[str], object]:
    """The graded code cells of a submitted notebook (locked cells restored), notes, and the notebook.

    The notebook (None when unreadable) has its stripped nbgrader metadata put back, so that nbgrader
    can run it too; the notes say in one line what was wrong with the file.
    """
    from grader.repair import read_submission, repair_nbgrader_metadata
    from grader.runner import notebook_sources, release_notebook

    nb, cause = read_submission(path)
    if nb is None:
        return [], [cause], None
    notes = []
    release = release_notebook(unit)
    if release is not None:
        nb, restored = repair_nbgrader_metadata(nb, release)
        if restored:
            notes.append(f"{restored} cell(s) had lost their nbgrader metadata (stripped by an editor?); it was put "
                         "back from the release by matching the cells, and every answer was graded")
    return notebook_sources(nb, unit), notes, nb


def check_kernel(course) -> None:
    """Raise ValueError with the one-line fix when the course's Jupyter kernel is not registered."""
    from jupyter_client.kernelspec import KernelSpecManager

    name = course.meta.get("kernel_name", "llmcourse")
    if name not in KernelSpecManager().find_kernel_specs():
        raise ValueError(f"the course's Jupyter kernel {name!r} is not registered, so nbgrader cannot run any "
                         f"submission: run `make kernel` (or `{Path(sys.executable).name} -m ipykernel install "
                         f"--sys-prefix --name {name}`) and grade again")


def read_roster(path: str | os.PathLike) -> dict[str, dict]:
    """nbgrader's student-import CSV (``id,first_name,last_name,email``) as ``{id: fields}``.

    Raises:
        ValueError: no ``id`` column.
    """
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if rows and "id" not in rows[0]:
        raise ValueError(f"{path}: a roster needs the columns id,first_name,last_name,email (nbgrader's student "
                         "import format)")
    return {r["id"].strip(): {k: (r.get(k) or "").strip() or None for k in ("first_name", "last_name", "email")}
            for r in rows if (r.get("id") or "").strip()}


def grade(submissions: str | os.PathLike, out_dir: str | os.PathLike | None = None, cell_timeout: int | None = None,
          course=None, roster: str | os.PathLike | None = None, jobs: int = 1, progress: bool = False,
          profile: str | None = "ci", execute: bool = False) -> GradeReport:
    """Grade every ``<student>/<assignment>/`` under ``submissions``; write gradebook, feedback and grades.

    The scores are decided by the course's checker, never by code that ran next to a submission:

    1. ``grader/``, ``llmcourse/``, ``course.toml`` and ``assets/`` are read into memory, hashed and copied
       (:class:`GradingSnapshot`) before anything of a submission runs.
    2. Every submission is read into memory; its locked cells are restored from the release.
    3. A checker process started from the snapshot (:class:`CheckerProcess`) computes one verdict
       per exercise; learner definitions run only in its worker processes (supervised: see
       :mod:`grader.supervise`); a checker that stops answering is replaced and that submission scores 0.
    4. nbgrader releases each assignment into the work root (beside step 3, from the course's solutions) and
       records the submissions. By default (``execute=False``) it records each notebook as the student saved it,
       without running anything (:func:`_record_as_saved`: one ``nbgrader autograde`` run without execution that
       keeps the saved outputs); the feedback is that notebook with the checker's verdict in each grade cell.
       With ``execute=True`` it autogrades the submissions, one ``nbgrader autograde <assignment>`` run per
       assignment (and job) (execution, gradebook entries, formgrader), each kernel forked from a pre-imported
       state by a fork server below that nbgrader run (``grader/kernelfork.py``; :func:`_kernel_env`), or launched
       the normal way where it cannot be; the hidden cells' in-kernel output there is instant feedback only, never
       a score. A submission nbgrader could not run is recorded again on its own,
       without execution. Each run is supervised (:func:`_autograde`): a kernel that stops, kills or
       hangs nbgrader ends that run, its submission is recorded without execution ("the submission
       stopped the grading process") and the others run on in a new batch; what kernels leave running
       is killed after every run.
    5. The checkout and the copies are verified after the checker's every submission, each time nbgrader starts
       a notebook and after every nbgrader run. A submission that changed them (:class:`_Tampering`: the one
       that ran since the last clean check, or of several run in parallel, each one that changes them again
       when run alone) scores 0 on every exercise of its notebook with the note ":data:`TAMPER_NOTE` (what
       changed)" and is recorded in nbgrader without running; the changed copies are replaced by fresh ones
       written from memory, the checkers restarted from them, and the run goes on. The checkout is never
       written: a change to it is named in the summary with the advice to restore it, and nbgrader runs from a
       verified copy from then on. Then each grade cell's score in the gradebook is set
       from the verdicts held in this process (manual scores cleared, max scores from course.toml),
       each grade cell's outputs in the autograded notebook are replaced by the rendered verdict,
       and nbgrader generates the feedback.

    A verdict that cannot be computed scores 0 with its cause (fail closed).

    Args:
        submissions: nbgrader's ``submitted/`` folder, or a folder containing one.
        out_dir: the work root (default ``<course>/.grading/run``); it is recreated.
        cell_timeout: seconds per cell (default ``$LLMCOURSE_CELL_TIMEOUT`` or 600).
        roster: nbgrader's student-import CSV (``id,first_name,last_name,email``): names in the
            gradebook and formgrader. Without it (or for ids it lacks) a student is listed under the id.
        jobs: parallel jobs (:func:`_check_all`, :class:`_NotebookRuns`): that many checker processes (each with
            its own forkserver and workers) share the submissions, then that many supervised nbgrader runs, each
            with its own gradebook copy, autograded folder and run token; their rows and notebooks are then moved into
            the one gradebook (:func:`_merge_gradebook`). Without ``execute``: that many checkers, then that many
            nbgrader runs that record the notebooks as saved, merged the same way. A submission whose check or
            nbgrader run was cut short in a parallel job (a neighbour's process may be the cause) is run again
            alone afterwards, so the scores and notes are those of ``jobs=1``.
        progress: tqdm progress bars on stderr (checked; run in nbgrader).
        profile: the run-time profile (``LLMCOURSE_PROFILE``, :mod:`llmcourse.runtime`) of the kernels nbgrader runs
            the submissions in. Default ``"ci"``, the smallest: what those kernels compute (the visible cells'
            training runs) is feedback only, never a score, and it is most of a class's grading time. None: the
            environment's own (default ``laptop``). The checker's verdicts do not depend on it.
        execute: run every notebook top to bottom in a fresh kernel in nbgrader (after the checks, never beside
            them) and show those outputs in the feedback, with notes on what failed in the run; default False: the
            notebooks as saved, nothing run. The scores, the verdicts and every note not about the run are the same
            either way (each row's ``run_notes`` lists the notes that come from the run or the outputs).

    Returns:
        :class:`GradeReport`: a row per submission with score, max score, notes and run notes; ``timings``: seconds
        per phase (:meth:`GradeReport.phase_table`); ``tampering``: a line per
        submission that changed the grading code, per change no submission explains, and the restore advice
        when the checkout changed.

    Raises:
        FileNotFoundError: ``submissions`` does not exist. ValueError: it holds no known assignment, the
            roster is malformed, or the course's Jupyter kernel is not registered (the message says how).
        GradingTampered: the grading could not go on with trusted grading code (a fresh copy did not verify:
            something outside the graded submissions keeps writing there); no score is kept.
    """
    from grader.repair import answer_cell_notes
    from grader.supervise import STOPPED_NOTE

    course = course or load_course()
    check_kernel(course)
    names = read_roster(roster) if roster else {}
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
    if profile is not None:
        from llmcourse.runtime import PROFILE_ENV

        if profile not in course.profiles:
            raise ValueError(f"unknown profile {profile!r}; course.toml defines {', '.join(sorted(course.profiles))}")
        env_extra[PROFILE_ENV] = profile
    # the hidden cells' in-kernel checks would be replaced by the checker's verdicts: skip them there
    env_extra["LLMCOURSE_DEFER_CHECKS"] = "1"
    # every process nbgrader starts carries this run's token: what a kernel left running is found by it
    token = f"{os.getpid()}-{os.urandom(8).hex()}"
    env_extra[RUN_TOKEN_ENV] = token
    # the kernels' Unix sockets (grader/nbgrader_config.py says why not TCP): one private folder per run
    sockets = tempfile.mkdtemp(prefix="llmk-")
    env_extra["LLMCOURSE_KERNEL_SOCKETS"] = sockets

    n_jobs = max(1, int(jobs))
    if n_jobs > 1 and execute:
        # N kernels at once: each gets its share of the CPUs. Two torch threads per kernel on two cores made the
        # kernels wait on each other (spinning OpenMP threads keep the cores busy while nothing advances)
        from . import usable_cpus

        share = str(max(1, usable_cpus() // n_jobs))
        env_extra.setdefault("LLMCOURSE_MAX_TORCH_THREADS", os.environ.get("LLMCOURSE_MAX_TORCH_THREADS") or share)
        env_extra.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS") or share)
    timings: dict[str, float] = {}
    clock = started = time.monotonic()
    bars = _progress_bars(len(pairs), progress, "run in nbgrader" if execute else "recorded in nbgrader")
    snapshot = GradingSnapshot(course.root)
    tampering = _Tampering(snapshot)

    def look(during: str) -> None:  # no submission runs now: a change is reported, its copies replaced
        change = snapshot.check(during)
        if change is not None:
            tampering.unexplain([], change)
            snapshot.repair()

    try:
        # 2. every submission in memory before any of them runs
        subs: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        answer_notes: dict[tuple[str, str], dict[str, str]] = {}
        unreadable: set[tuple[str, str]] = set()  # replaced by the release for nbgrader
        for student, assignment in pairs:
            u = known[assignment]
            path = work / ".grading" / "submitted" / student / assignment / Path(u.exercise).name
            if not path.exists():
                subs[(student, assignment)] = ([], [f"{Path(u.exercise).name} is missing from the submission"])
                continue
            sources, notes, nb = _submission_sources(path, u)
            answer_notes[(student, assignment)] = answer_cell_notes(nb, u) if nb is not None else {}
            notes += list(answer_notes[(student, assignment)].values())
            subs[(student, assignment)] = (sources, notes)
            if nb is None:
                unreadable.add((student, assignment))
            _prepare_for_nbgrader(path, nb, u, course)
        timings["snapshot + read the submissions"] = time.monotonic() - clock
        # 4a. nbgrader's release into the work root (the assignment in the gradebook), from the course's solutions
        #     (no submission runs in it): in a thread, while the checkers start and check
        def generate() -> float:
            started = time.monotonic()
            for assignment in sorted({a for _, a in pairs}):
                u = known[assignment]
                shutil.copytree(course.root / Path(u.solution).parent, work / "solutions" / assignment)
                proc = _nbgrader(["generate_assignment", assignment, "--force"], work, snapshot.nbgrader_root)
                if proc.returncode != 0:
                    raise RuntimeError(f"nbgrader generate_assignment {assignment} failed:\n{proc.stdout}\n"
                                       f"{proc.stderr}")
            return time.monotonic() - started

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as background:
            released = background.submit(generate)
            # 3. verdicts from the checker processes (learner code only in their workers)
            clock = time.monotonic()
            verdicts, causes = _check_all(snapshot, work, subs, known, answer_notes, n_jobs, bars, timings, tampering)
            timings["checks (course checker)"] = time.monotonic() - clock - timings.get("checker start", 0.0)
            timings["nbgrader generate_assignment (beside the checks)"] = released.result()
        # 4b. nbgrader autograde (execution + gradebook rows). One `nbgrader autograde <assignment>` run per
        #    assignment and job executes its share of the submissions (one nbgrader start instead of one per
        #    student); the grading files are verified after each such batch. A submission nbgrader could not run
        #    (its autograded notebook is missing) is recorded again on its own without execution, and its note
        #    names the cause read from its part of the batch's log.
        report = GradeReport(out_dir=work)
        nb_notes: dict[tuple[str, str], list[str]] = {}
        run_notes: dict[tuple[str, str], list[str]] = {}  # the notes that come from running the notebook
        timeout_s = int(cell_timeout or os.environ.get("LLMCOURSE_CELL_TIMEOUT") or 600)
        # limits of a notebook in nbgrader (its cells have timeout_s each): the whole notebook, and silence
        limits = {"per_notebook_s": 120 + 6 * timeout_s, "idle_s": timeout_s + 60}
        for assignment in sorted({a for _, a in pairs}):
            students = [s for s, a in pairs if a == assignment]
            if not execute:  # 4b'. the notebooks as saved, recorded: no kernel, nothing of a submission runs
                _record_as_saved(assignment, students, work, env_extra, token, limits, snapshot, timings, n_jobs,
                                 bars.get("nbgrader"))
                for student in students:
                    nb_notes[(student, assignment)] = list(subs[(student, assignment)][1])
                    run_notes[(student, assignment)] = []
                look(f"while nbgrader recorded {assignment}")
                continue
            name = Path(known[assignment].exercise).name
            skip = {s for s in students if (s, assignment) in tampering.by}  # scored 0: not run
            run = _NotebookRuns(assignment, name, students, work, _kernel_env(env_extra, known[assignment], course),
                                token, limits, snapshot, tampering, skip, bars.get("nbgrader"))
            logs, failed, culprits, missing = run.all(n_jobs, timings)
            for student in students:
                notes = list(subs[(student, assignment)][1])
                ran: list[str] = []
                run_notes[(student, assignment)] = ran
                nb_notes[(student, assignment)] = notes
                graded_nb = work / ".grading" / "autograded" / student / assignment / name
                if (student, assignment) in tampering.by:
                    if student in skip:
                        ran.append("it was recorded in nbgrader without running it")
                    continue
                if (student, assignment) in unreadable:
                    continue  # nbgrader ran the release's stubs: nothing to report
                if student in culprits:
                    ran.append(f"{STOPPED_NOTE} in nbgrader ({culprits[student]}); it was recorded without running "
                               "it and its answers were graded by the checker all the same")
                elif student in missing or student in failed:
                    if student in missing:
                        how = "could not be run" if graded_nb.exists() else "could not be recorded"
                    else:
                        how = "ran with errors"
                    ran.append(f"the notebook {how} in nbgrader ({_autograde_cause(logs[student])}); its answers "
                               "were graded by the checker all the same")
                ran += _execution_notes(work / ".grading" / "autograded" / student / assignment)
        for bar in bars.values():
            bar.close()
        clock = time.monotonic()
        # 5. scores and verdicts from this process, then feedback
        look("before the scores were written")
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{work / '.grading' / 'gradebook.db'}") as gb:  # one session for the class
            for key in pairs:
                student, assignment = key
                u = known[assignment]
                if key in tampering.by:  # whatever it earned was computed beside a change to the grading code
                    verdicts.pop(key, None)
                    causes[key] = f"{TAMPER_NOTE} ({tampering.by[key]})"
                per = _verdict_points(u, verdicts.get(key), causes.get(key))
                notes = list(nb_notes[key])
                ran = list(run_notes[key])
                after = [f"scored 0: {causes[key]}"] if key in causes else []
                stopped_in = [v["exercise_id"] for v in verdicts.get(key) or []
                              if STOPPED_NOTE in v["message"].lower()]
                if stopped_in:
                    after.append(f"{STOPPED_NOTE} while {', '.join(stopped_in)} ran: scored 0")
                # the feedback's grade cells say why, without the changed files' paths (the feedback filter drops a
                # line that names grader files; the notes and grades.csv name them for the instructor)
                shown = TAMPER_NOTE if key in tampering.by else causes.get(key)
                written, cut = _write_scores(work, student, assignment, u, per, verdicts.get(key), shown,
                                             names.get(student), gb=gb)
                after += written
                ran_after = cut
                listed = notes + ran + after + ran_after
                report.rows.append({
                    "student": student, "assignment": assignment, "notes": "; ".join(listed),
                    "score": float(sum(per.values())), "max_score": float(u.points), "per_exercise": per,
                    "note_list": listed,
                    # the notes that come from the notebook's run or outputs (none without execution but cut
                    # outputs): the others are the same whether the notebooks were executed or not
                    "run_notes": ran + ran_after})
            gb.db.commit()
        timings["gradebook scores"] = time.monotonic() - clock
        clock = time.monotonic()
        # feedback: one `nbgrader generate_feedback <assignment>` run per assignment and job (each job excludes
        # the others' students; they only read the gradebook); a student whose feedback is missing after it is
        # run again alone, so that the note gives that student's own error
        for assignment in sorted({a for _, a in pairs}):
            students = [s for s, a in pairs if a == assignment]
            k = max(1, min(n_jobs, len(students)))
            groups = [students[i::k] for i in range(k)]

            def feedback(group: list[str], assignment=assignment, students=students) -> tuple[set, bool]:
                others = sorted(set(students) - set(group))
                extra = [f"--CourseDirectory.student_id_exclude={','.join(others)}"] if others else []
                proc = _nbgrader(["generate_feedback", assignment, "--force", *extra], work, snapshot.nbgrader_root)
                return set(group), proc.returncode == 0

            with ThreadPoolExecutor(k) as pool:
                done = [g for g, ok in pool.map(feedback, groups) if ok]
            ran_ok = set().union(*done) if done else set()
            html = Path(known[assignment].exercise).with_suffix(".html").name
            for student in students:
                if student in ran_ok and (work / ".grading" / "feedback" / student / assignment / html).exists():
                    continue
                one = _nbgrader(["generate_feedback", assignment, f"--student={student}", "--force"], work,
                                snapshot.nbgrader_root)
                if one.returncode != 0:
                    row = next(r for r in report.rows if (r["student"], r["assignment"]) == (student, assignment))
                    row["note_list"].append("feedback failed: " + _last_error(one))
                    row["notes"] = "; ".join(row["note_list"])
        look("while the feedback was generated")
        timings["feedback (nbgrader generate_feedback)"] = time.monotonic() - clock
    except GradingTampered:
        db = work / ".grading" / "gradebook.db"
        if db.exists():  # nbgrader's own in-kernel scores are not trusted: keep none of them
            db.replace(db.with_name("gradebook.db.untrusted"))
        raise
    finally:
        snapshot.cleanup()
        shutil.rmtree(sockets, ignore_errors=True)
        for bar in bars.values():
            bar.close()
    report.tampering = tampering.lines()
    clock = time.monotonic()
    report.grades_csv = _write_grades(work, report.rows, course)
    from .report import write_record, write_report

    write_record(work, report.rows, verdicts, causes, known, report.tampering)
    try:
        report.class_report = write_report(work)["html"]
    except Exception as exc:  # noqa: BLE001 - the grades stand without it; `course report WORK` says what failed
        report.class_report = f"not written ({type(exc).__name__}: {exc}); run `course report {work}`"
    timings["grades.csv + class report"] = time.monotonic() - clock
    timings[TOTAL_PHASE] = time.monotonic() - started
    report.timings = timings
    report.executed = execute
    report.jobs = n_jobs
    return report


def _kernel_env(env_extra: dict, unit, course) -> dict:
    """nbgrader's environment for executing ``unit``'s notebooks: kernels forked from a pre-imported state
    (``grader/kernelfork.py``: ipykernel, torch, numpy, llmcourse and the modules the unit's release imports, once per
    nbgrader run) unless ``$LLMCOURSE_KERNEL_FORKSERVER=0``."""
    from grader.kernelfork import ENABLE_ENV, PRELOAD_ENV, release_imports

    if os.environ.get(ENABLE_ENV) == "0":
        return {**env_extra, ENABLE_ENV: "0"}
    try:
        preload = release_imports(course.root / unit.exercise)
    except Exception:  # noqa: BLE001 - the base preload only
        preload = []
    return {**env_extra, ENABLE_ENV: "1", PRELOAD_ENV: ",".join(preload)}


def _progress_bars(total: int, enabled: bool, nbgrader: str = "run in nbgrader") -> dict:
    """``{"checks": bar, "nbgrader": bar}`` (tqdm on stderr) or ``{}``."""
    if not enabled:
        return {}
    from tqdm import tqdm

    return {"checks": tqdm(total=total, desc="checked", unit="nb", file=sys.stderr, position=0),
            "nbgrader": tqdm(total=total, desc=nbgrader, unit="nb", file=sys.stderr, position=1)}


# a verdict that supervision cut short: in a parallel run a neighbour may have caused it, so it is run again alone
_CUT_SHORT = ("stopped the grading process", "ended before answering", "did not finish within", "(sigstop?)")


def _cut_short(got: list[dict] | None, cause: str) -> bool:
    return got is None or bool(cause) or any(any(m in (v.get("message") or "").lower() for m in _CUT_SHORT)
                                             for v in got)


class _Tampering:
    """The run's record of changes to the grading code: who changed it (scored 0), and changes no submission explains.

    A change is seen by :meth:`GradingSnapshot.check` after a submission ran; the changed copies are rebuilt at once
    (:meth:`GradingSnapshot.repair`). The submissions that ran since the last clean check are the suspects: one
    suspect changed it; of several (parallel jobs), each is run again alone and the one that changes it again is
    blamed.
    """

    def __init__(self, snapshot: GradingSnapshot):
        self.snapshot = snapshot
        self.by: dict[tuple[str, str], str] = {}  # (student, assignment) -> what changed, and when
        self.unexplained: list[str] = []
        self._lock = threading.Lock()

    def blame(self, key: tuple[str, str], change: Tampering) -> None:
        with self._lock:
            self.by.setdefault(key, str(change))

    def unexplain(self, suspects, change: Tampering) -> None:
        with self._lock:
            who = ", ".join(f"{s}/{a}" for s, a in sorted(suspects)) or "no submission was running"
            self.unexplained.append(f"{change} ({who}; run again alone, none changed them: their scores were kept)"
                                    if suspects else f"{change} ({who})")

    def lines(self) -> list[str]:
        """The run summary's lines: one per tampering submission, then what no submission explains, then advice."""
        out = [f"TAMPERED {s}/{a}: {TAMPER_NOTE} ({what}); it scored 0 on every exercise of that notebook and the "
               "others were graded with a fresh copy of the grading code" for (s, a), what in sorted(self.by.items())]
        out += [f"grading files changed: {line}; they were replaced by a fresh copy" for line in self.unexplained]
        advice = self.snapshot.restore_advice()
        return out + ([f"RESTORE {advice}"] if advice else [])


def _check_all(snapshot: GradingSnapshot, work: Path, subs: dict, known: dict, answer_notes: dict, n_jobs: int,
               bars: dict, timings: dict, tampering: _Tampering) -> tuple[dict, dict]:
    """Verdicts of every submission: ``({key: verdict dicts}, {key: cause of no verdict})``.

    ``n_jobs`` checker processes (each its own forkserver and workers, all from the one snapshot) take the
    submissions from a shared queue, each driven by a thread of this process with its own deadlines (a checker
    that a submission stops or hangs is replaced by its own thread; the others go on). In a parallel run a
    submission that was cut short (no verdict, or an exercise stopped, killed or timed out) is checked again alone
    afterwards by one checker, as ``n_jobs=1`` would have: a worker of one job can signal another job's processes
    (the same user, or both ``nobody``), and load can push a neighbour past a time limit.

    The grading files are checked after every submission. A change (:class:`Tampering`) stops the jobs; the
    submissions that were being checked since the last clean check are the suspects; the copies are rebuilt and
    the checkers restarted from them; a lone suspect changed the files and is recorded in ``tampering`` (no
    verdict); several are checked again alone, one after the other, each one that changes the files again
    recorded, the others' verdicts (from a clean copy) kept; then the jobs go on with the rest.
    """
    import queue

    verdicts: dict[tuple[str, str], list[dict]] = {}
    causes: dict[tuple[str, str], str] = {}
    keys = list(subs)
    lock = threading.Lock()
    bar = bars.get("checks")

    def check(checker: CheckerProcess, key) -> tuple[list[dict] | None, str, Tampering | None]:
        student, assignment = key
        got, cause = checker.verdicts([student, assignment], known[assignment].id, subs[key][0],
                                      len(known[assignment].exercises))
        return got, cause, snapshot.check(f"while the checker ran {student}/{assignment}")

    def record(key, got, cause) -> None:
        with lock:
            verdicts.pop(key, None)
            causes.pop(key, None)
            if got is None:
                causes[key] = cause
            else:
                for v in got:  # "your answer cell is markdown": the same note as in course check
                    extra = answer_notes.get(key, {}).get(v["exercise_id"])
                    if extra:
                        v["notes"] = [extra, *(v.get("notes") or [])]
                verdicts[key] = got

    def tick() -> None:
        if bar is not None:
            bar.update(1)

    def alone(key) -> bool:
        """Check ``key`` with the first checker, nothing beside it; True when it changed the grading files."""
        got, cause, change = check(checkers[0], key)
        if change is None:
            record(key, got, cause)
            return False
        tampering.blame(key, change)
        with lock:
            verdicts.pop(key, None)
            causes.pop(key, None)
        snapshot.repair()
        checkers[0].restart()  # its processes ran beside the change: a fresh one, from the fresh copy
        return True

    def settle(suspects: list, change: Tampering) -> None:
        """A change seen while ``suspects`` were checked in parallel: repaired, the suspects checked again alone."""
        snapshot.repair()
        checkers[0].restart()  # fresh processes from the fresh copy; the other jobs' are started again after
        for i in range(1, k):
            if checkers[i] is not None:
                checkers[i].close()
                checkers[i] = None
        if len(suspects) == 1:
            tampering.blame(suspects[0], change)
            return
        if not [key for key in sorted(suspects) if alone(key)]:
            tampering.unexplain(suspects, change)

    k = max(1, min(n_jobs, len(keys)))
    clock = time.monotonic()
    checkers: list[CheckerProcess | None] = [None] * k
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            log = work / ".grading" / ("checker.log" if i == 0 else f"checker-{i + 1}.log")
            checkers[i] = CheckerProcess(snapshot, log)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(exc)

    def start_all() -> None:
        starters = [threading.Thread(target=start, args=(i,)) for i in range(k) if checkers[i] is None]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        if errors:
            raise errors[0]

    try:
        start_all()
        timings["checker start"] = time.monotonic() - clock
        if k == 1:
            for key in keys:
                alone(key)
                tick()
            return verdicts, causes
        todo: queue.Queue = queue.Queue()
        for key in keys:
            todo.put(key)
        retry: list = []
        running: dict[int, tuple] = {}  # thread index -> the key it checks
        suspects: list = []
        seen: list[Tampering] = []
        stop = threading.Event()

        def drive(i: int) -> None:
            while not errors and not stop.is_set():
                try:
                    key = todo.get_nowait()
                except queue.Empty:
                    return
                with lock:
                    running[i] = key
                try:
                    got, cause, change = check(checkers[i], key)
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    errors.append(exc)
                    return
                with lock:
                    running.pop(i, None)
                    if change is not None and not stop.is_set():
                        # every submission being checked since the last clean check is a suspect
                        suspects.extend([key, *running.values()])
                        seen.append(change)
                        stop.set()
                    if stop.is_set():
                        if key not in suspects:
                            suspects.append(key)
                        return
                record(key, got, cause)
                if _cut_short(got, cause):
                    with lock:
                        retry.append(key)
                else:
                    tick()

        while not todo.empty():
            start_all()
            running.clear()
            suspects.clear()
            seen.clear()
            stop.clear()
            threads = [threading.Thread(target=drive, args=(i,)) for i in range(k)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            if seen:
                settle(sorted(set(suspects)), seen[0])
                for _ in set(suspects):
                    tick()
        for c in checkers[1:]:  # alone from here on
            if c is not None:
                c.close()
        checkers[1:] = [None] * (k - 1)
        for key in sorted(retry):
            if key not in tampering.by:
                alone(key)
            tick()
        return verdicts, causes
    finally:
        for c in checkers:
            if c is not None:
                c.close()


class _NotebookRuns:
    """nbgrader's runs of one assignment's submissions: ``all(n_jobs)`` -> ``(logs, failed, culprits, missing)``.

    With one job: supervised batches in the work root, as described in :func:`grade`. With ``n_jobs > 1`` the
    students are dealt round-robin to jobs; each job runs the same supervised batches in a thread of this process,
    with its own gradebook (a copy of the work root's, holding the released assignment), its own autograded folder
    under ``.grading/jobs/`` and its own run token (what one job's kernels leave is killed by that job; no job kills
    another's processes). A student whose run was ended abnormally in a job is run again alone after the jobs (a
    neighbour's kernel may have signalled it). Finally the jobs' gradebook rows and autograded notebooks (outputs and
    all) are moved into the work root's gradebook and autograded folder (:func:`_merge_gradebook`, no nbgrader run),
    which is then exactly what one job would have left.

    The students in ``skip`` (their check changed the grading code) are recorded without running. The grading files
    are checked each time a notebook starts and after every run (:meth:`_look`): the notebooks that ran since the
    last clean check are the suspects of a change; a lone suspect is recorded in ``tampering``, several are run again
    alone after the jobs and each one that changes the files again is recorded.
    """

    def __init__(self, assignment: str, name: str, students: list[str], work: Path, env_extra: dict, token: str,
                 limits: dict, snapshot: GradingSnapshot, tampering: _Tampering, skip=(), bar=None):
        self.assignment, self.name, self.students, self.work = assignment, name, students, work
        self.env_extra, self.token, self.limits = env_extra, token, limits
        self.snapshot, self.tampering, self.skip, self.bar = snapshot, tampering, set(skip), bar
        self._lock = threading.Lock()
        self._running: dict[str, str] = {}  # job label -> the student its nbgrader runs now
        self._since_clean: set[str] = set()  # students that ran since the last clean check
        self._suspects: set[str] = set()
        self._changes: list[Tampering] = []

    def _look(self, during: str) -> None:
        """Check the grading files; on a change, every student that ran since the last clean check is a suspect."""
        change = self.snapshot.check(during)
        with self._lock:
            running = set(self._running.values())
            if change is not None:
                self._suspects |= self._since_clean | running
                self._changes.append(change)
            self._since_clean = running
        if change is not None:
            self.snapshot.repair()

    def _run(self, group: list[str], autograded: str, token: str, extra_args: tuple[str, ...] = (), label: str = "1"):
        """Supervised batches over ``group`` (autograded notebooks under ``work/autograded``)."""
        assignment, name, work = self.assignment, self.name, self.work
        env_extra = {**self.env_extra, RUN_TOKEN_ENV: token}
        logs: dict[str, str] = {s: "" for s in group}
        failed: set[str] = set()
        culprits: dict[str, str] = {}
        todo, force = [s for s in group if s not in self.skip], True
        bar, counted = self.bar, [0]

        def on_started(started: list[str]) -> None:
            n = len(started)
            if bar is not None and n > counted[0]:
                with self._lock:
                    bar.update(n - counted[0])
            counted[0] = max(counted[0], n)
            with self._lock:  # the one starting now is a suspect too: its kernel may have run already
                self._running[label] = started[-1]
                self._since_clean.add(started[-1])
            self._look(f"while nbgrader ran {assignment} ({_batch_name(started[-2:], assignment)})")

        # supervised batches: a batch that a kernel stopped, killed or hung is ended, the submission it was
        # running is set aside (recorded below without execution), and the rest run on in a new batch
        while todo:
            counted[0] = 0
            proc, abnormal = _autograde(assignment, work, self.snapshot.nbgrader_root, env_extra, token, force=force,
                                        exclude=sorted(set(self.students) - set(todo)), extra_args=extra_args,
                                        on_started=on_started, **self.limits)
            self._look(f"while nbgrader ran {_batch_name(todo, assignment)}")
            with self._lock:
                self._running.pop(label, None)
            part, bad = _split_autograde_log(proc, todo)
            for s in todo:
                logs[s] += part[s]
            failed |= bad
            started = _started(proc, todo)
            if started and bar is not None and len(started) > counted[0]:
                with self._lock:
                    bar.update(len(started) - counted[0])
            if abnormal is None or not started:  # done (or nobody to blame: the rest are recorded below)
                break
            # nbgrader takes the submissions one after the other: the last one it started ended the run
            culprits[started[-1]] = abnormal
            todo, force = [s for s in todo if s not in started], False
        # record without running them (the verdicts never depended on the run): what nbgrader could not
        # run, what ended a run (its autograded copy was written before it ran), and what changed the grading code
        missing = [s for s in group if not (work / autograded / s / assignment / name).exists() or s in culprits
                   or s in self.skip]
        if missing:
            _autograde(assignment, work, self.snapshot.nbgrader_root, env_extra, token, force=True, execute=False,
                       exclude=sorted(set(self.students) - set(missing)), extra_args=extra_args, **self.limits)
            self._look(f"while nbgrader recorded {_batch_name(missing, assignment)}")
        return logs, failed, culprits, missing

    def _job(self, label: str, group: list[str]):
        root = Path(".grading") / "jobs" / f"{self.assignment}-{label}"
        (self.work / root).mkdir(parents=True)
        shutil.copy2(self.work / ".grading" / "gradebook.db", self.work / root / "gradebook.db")
        args = (f"--CourseDirectory.db_url=sqlite:///{self.work / root / 'gradebook.db'}",
                f"--CourseDirectory.autograded_directory={root / 'autograded'}")
        return root / "autograded", self._run(group, str(root / "autograded"), f"{self.token}-{label}", args, label)

    def _settle(self, run_alone) -> None:
        """Blame the suspects of the changes seen: a lone one, or each that changes the files again when run alone."""
        with self._lock:
            suspects, changes = sorted(self._suspects), list(self._changes)
            self._suspects, self._changes = set(), []
        if not changes:
            return
        if len(suspects) == 1:
            self.tampering.blame((suspects[0], self.assignment), changes[0])
            return
        blamed = False
        for s in suspects:
            run_alone(s)
            with self._lock:
                again, self._suspects, self._changes = self._changes, set(), []
            if again:
                self.tampering.blame((s, self.assignment), again[0])
                blamed = True
        if not blamed:
            self.tampering.unexplain([(s, self.assignment) for s in suspects], changes[0])

    def all(self, n_jobs: int, timings: dict):
        clock = time.monotonic()
        k = max(1, min(n_jobs, len(self.students)))
        if k == 1:
            out = self._run(self.students, ".grading/autograded", self.token)
            found: dict[str, tuple] = {}

            def alone(s: str) -> None:
                found[s] = self._run([s], ".grading/autograded", self.token)

            self._settle(alone)
            logs, failed, culprits, missing = out
            for s, (lg, fl, cu, mi) in found.items():  # run again alone: that run is the one recorded
                logs[s] = lg[s]
                failed.discard(s)
                culprits.pop(s, None)
                if s in missing:
                    missing.remove(s)
                failed |= fl
                culprits.update(cu)
                missing += mi
            timings["nbgrader autograde"] = timings.get("nbgrader autograde", 0.0) + time.monotonic() - clock
            return logs, failed, culprits, missing
        from concurrent.futures import ThreadPoolExecutor

        groups = [self.students[i::k] for i in range(k)]
        with ThreadPoolExecutor(k) as pool:
            results = list(pool.map(lambda ig: self._job(str(ig[0] + 1), ig[1]), enumerate(groups)))
        logs, failed, culprits, missing, where = {}, set(), {}, [], {}
        for autograded, (lg, fl, cu, mi) in results:
            logs.update(lg)
            failed |= fl
            culprits.update(cu)
            missing += mi
            where.update({s: autograded for s in lg})

        def replace(group: list[str], autograded, lg, fl, cu, mi) -> None:
            for s in group:
                logs[s], where[s] = lg[s], autograded
                failed.discard(s)
                culprits.pop(s, None)
                if s in missing:
                    missing.remove(s)
            failed.update(fl)
            culprits.update(cu)
            missing.extend(mi)

        again = sorted(culprits)
        if again:  # ended abnormally beside other jobs: run again alone, as one job would have
            autograded, out = self._job("again", again)
            replace(again, autograded, *out)
        n_alone = [0]

        def alone(s: str) -> None:  # a suspect of a change, run again with nothing beside it
            n_alone[0] += 1
            autograded, out = self._job(f"alone{n_alone[0]}", [s])
            replace([s], autograded, *out)

        self._settle(alone)
        timings["nbgrader autograde"] = timings.get("nbgrader autograde", 0.0) + time.monotonic() - clock
        clock = time.monotonic()
        # one gradebook: the jobs' rows and autograded notebooks moved into the work root's (no nbgrader run); a
        # student none of whose jobs left a notebook is recorded from the submission, without running it
        have = {s: (self.work / where[s]).parent for s in self.students if (self.work / where[s] / s /
                                                                            self.assignment).is_dir()}
        _merge_gradebook(self.work, self.assignment, have)
        rest = [s for s in self.students if s not in have]
        if rest:
            _autograde(self.assignment, self.work, self.snapshot.nbgrader_root,
                       {**self.env_extra, RUN_TOKEN_ENV: self.token}, self.token, force=True, execute=False,
                       exclude=sorted(set(self.students) - set(rest)), extra_args=("--ClearOutput.enabled=False",),
                       **self.limits)
        self._look(f"while the jobs' notebooks of {self.assignment} were recorded")
        self._settle(lambda s: None)  # nothing ran: a change here has no suspect but what ran before
        for folder in (self.work / ".grading" / "jobs").glob(f"*{self.assignment}*"):  # recorded: only copies left
            shutil.rmtree(folder, ignore_errors=True)
        timings["jobs' gradebooks merged (jobs > 1)"] = timings.get("jobs' gradebooks merged (jobs > 1)", 0.0) + \
            time.monotonic() - clock
        return logs, failed, culprits, missing


def _record_as_saved(assignment: str, students: list[str], work: Path, env_extra: dict, token: str, limits: dict,
                     snapshot: GradingSnapshot, timings: dict, n_jobs: int = 1, bar=None) -> None:
    """Record ``students``' notebooks of ``assignment`` in the gradebook as they were saved, running nothing.

    A supervised ``nbgrader autograde`` run without execution and without clearing outputs: the autograded
    notebook is the submission (locked cells restored from the gradebook, outputs as the student left them), the
    grade cells' outputs are then replaced by the checker's verdicts (:func:`_write_scores`). No kernel starts.
    With ``n_jobs > 1`` the students are dealt to that many such runs at once, each with its own copy of the
    gradebook and its own autograded folder, merged into the work root's afterwards (:func:`_merge_gradebook`).
    """
    clock = time.monotonic()
    k = max(1, min(n_jobs, len(students)))
    extra = ("--ClearOutput.enabled=False",)
    if k == 1:
        _autograde(assignment, work, snapshot.nbgrader_root, env_extra, token, force=True, execute=False,
                   exclude=[], extra_args=extra, **limits)
    else:
        from concurrent.futures import ThreadPoolExecutor

        groups = [students[i::k] for i in range(k)]
        roots = [Path(".grading") / "jobs" / f"{assignment}-saved-{i + 1}" for i in range(k)]
        for root in roots:
            (work / root).mkdir(parents=True)
            shutil.copy2(work / ".grading" / "gradebook.db", work / root / "gradebook.db")

        def one(i: int) -> None:
            args = (f"--CourseDirectory.db_url=sqlite:///{work / roots[i] / 'gradebook.db'}",
                    f"--CourseDirectory.autograded_directory={roots[i] / 'autograded'}", *extra)
            _autograde(assignment, work, snapshot.nbgrader_root, env_extra, f"{token}-saved-{i + 1}", force=True,
                       execute=False, exclude=sorted(set(students) - set(groups[i])), extra_args=args, **limits)

        with ThreadPoolExecutor(k) as pool:
            list(pool.map(one, range(k)))
        _merge_gradebook(work, assignment, {s: roots[i] for i, g in enumerate(groups) for s in g})
    if bar is not None:
        bar.update(len(students))
    timings[RECORD_PHASE] = timings.get(RECORD_PHASE, 0.0) + time.monotonic() - clock


def _merge_gradebook(work: Path, assignment: str, where: dict[str, Path]) -> None:
    """Move each student's submission of ``assignment`` from a job's gradebook and folder into the work root's.

    ``where``: ``{student: the job's folder under work}`` (``gradebook.db`` and ``autograded/`` there). Every job's
    gradebook is a copy of the work root's taken after the assignment was released, so the assignment, notebook and
    cell rows are the same rows (the same ids); a student's rows (student, submitted assignment and notebooks,
    grades, comments) replace any the work root's gradebook holds for that student and assignment. What one
    ``nbgrader autograde`` run over every student would have left, without running nbgrader again. A student whose
    job recorded nothing is left out (its notes say so).
    """
    import sqlite3

    db = sqlite3.connect(work / ".grading" / "gradebook.db")
    try:
        (assignment_id,) = db.execute("SELECT id FROM assignment WHERE name = ?", (assignment,)).fetchone()
        for root in sorted(set(where.values())):
            group = sorted(s for s, r in where.items() if r == root)
            marks = ",".join("?" * len(group))
            db.execute("ATTACH DATABASE ? AS job", (str(work / root / "gradebook.db"),))
            try:
                for schema in ("main", "job"):  # the submissions of the group: main's to be replaced, job's to copy
                    db.execute(f"CREATE TEMP TABLE sub_{schema} AS SELECT sa.id AS sa, sn.id AS sn FROM "
                               f"{schema}.submitted_assignment sa LEFT JOIN {schema}.submitted_notebook sn ON "
                               f"sn.assignment_id = sa.id WHERE sa.assignment_id = ? AND sa.student_id IN ({marks})",
                               (assignment_id, *group))
                for table in ("grade", "comment"):
                    db.execute(f"DELETE FROM main.{table} WHERE notebook_id IN (SELECT sn FROM sub_main)")
                db.execute("DELETE FROM main.submitted_notebook WHERE id IN (SELECT sn FROM sub_main)")
                db.execute("DELETE FROM main.submitted_assignment WHERE id IN (SELECT sa FROM sub_main)")
                db.execute(f"INSERT OR REPLACE INTO main.student SELECT * FROM job.student WHERE id IN ({marks})",
                           group)
                db.execute("INSERT INTO main.submitted_assignment SELECT * FROM job.submitted_assignment WHERE id IN "
                           "(SELECT sa FROM sub_job)")
                db.execute("INSERT INTO main.submitted_notebook SELECT * FROM job.submitted_notebook WHERE id IN "
                           "(SELECT sn FROM sub_job)")
                for table in ("grade", "comment"):
                    db.execute(f"INSERT INTO main.{table} SELECT * FROM job.{table} WHERE notebook_id IN "
                               "(SELECT sn FROM sub_job)")
                db.commit()
            finally:
                db.execute("DROP TABLE IF EXISTS sub_main")
                db.execute("DROP TABLE IF EXISTS sub_job")
                db.commit()
                db.execute("DETACH DATABASE job")
            for s in group:
                src = work / root / "autograded" / s / assignment
                dest = work / ".grading" / "autograded" / s / assignment
                if dest.exists():
                    shutil.rmtree(dest)
                if src.is_dir():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copytree(src, dest)
    finally:
        db.close()
    for root in set(where.values()):
        shutil.rmtree(work / root, ignore_errors=True)


RECORD_PHASE = "nbgrader record (notebooks as saved)"


RUN_TOKEN_ENV = "LLMCOURSE_GRADING_RUN"
# nbclient's log line for a cell timeout. With interrupt_on_timeout it interrupts the kernel and waits again:
# a kernel that no longer answers (its sockets closed or garbled) is waited for without end. A notebook is
# ended at its third timeout (its answers are graded by the checker all the same).
_TIMEOUT_LINE = "Timeout waiting for execute reply"
MAX_CELL_TIMEOUTS = 3


def _autograde(assignment: str, work: Path, course_root: Path, env_extra: dict, token: str, *, force: bool,
               exclude: list[str], per_notebook_s: float, idle_s: float, execute: bool = True,
               extra_args: tuple[str, ...] | list[str] = (), on_started=None
               ) -> tuple[subprocess.CompletedProcess, str | None]:
    """One supervised ``nbgrader autograde <assignment>`` run; ``(its result, None or why it was ended)``.

    nbgrader runs in a session of its own, its output goes to files (never a pipe that could fill up),
    and this process polls it: stopped (a kernel sent SIGSTOP to its parent), killed by a signal (SIGKILL,
    SIGTERM from a kernel), one notebook running past ``per_notebook_s`` (counted from the log line that
    starts it), :data:`MAX_CELL_TIMEOUTS` cell timeouts in one notebook, or ``idle_s`` without a log line
    or half a second of CPU time in nbgrader and its kernel (a kernel whose channels were garbled: nbgrader
    waits for it without a timeout) ends the run. A process that carries this run's ``token`` in its environment but has left
    nbgrader's process tree (a kernel's daemon: double fork, ``setsid``) is killed on sight; when the run
    ends, everything below nbgrader and everything carrying the token is killed.

    ``extra_args`` go to nbgrader's command line (a parallel job's own gradebook and autograded folder);
    ``on_started(ids)`` is called when the log shows that the run has started another notebook (``ids``: the
    students started so far, in order).
    """
    from grader.supervise import descendants, kill_tree, processes_with_env, state

    args = ["autograde", assignment, "--create"] + (["--force"] if force else [])
    if not execute:
        args.append("--Execute.enabled=False")
    if exclude:
        args.append(f"--CourseDirectory.student_id_exclude={','.join(exclude)}")
    args += list(extra_args)
    _write_config(work, course_root)
    env = _nbgrader_env(work, course_root, env_extra)
    needle = f"{RUN_TOKEN_ENV}={token}"
    abnormal = None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([*_nbgrader_command(), *args], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
        started, notebook_until, last_scan = -1, time.monotonic() + per_notebook_s, 0.0
        idle_since, cpu_at, log_size = time.monotonic(), 0, 0
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if state(proc.pid) in ("T", "t"):
                    abnormal = "a kernel stopped nbgrader"
                elif now - last_scan > 1.0:
                    last_scan = now
                    log = os.pread(err.fileno(), os.fstat(err.fileno()).st_size, 0).decode("utf-8", "replace")
                    n = len(_STUDENT_LINE.findall(log))
                    if n != started:  # the next notebook started: its own deadline
                        started, notebook_until = n, now + per_notebook_s
                        if on_started is not None and n:
                            on_started([m.group("id") for m in _STUDENT_LINE.finditer(log)])
                    timeouts = log[log.rfind("Creating/updating student"):].count(_TIMEOUT_LINE)
                    if timeouts >= MAX_CELL_TIMEOUTS:  # nbclient interrupts a silent kernel for ever
                        abnormal = f"{timeouts} cell timeouts: its kernel stopped answering"
                    tree = {proc.pid, *descendants(proc.pid)}
                    # no CPU time and no log line in nbgrader and its kernel for idle_s: it waits for ever
                    cpu, size = _cpu_ticks(tree), len(log)
                    if cpu - cpu_at > 50 or size != log_size:
                        idle_since, cpu_at, log_size = now, cpu, size
                    elif now - idle_since > idle_s:
                        abnormal = f"nbgrader and its kernel made no progress for {idle_s:.0f} s"
                    escaped = set(processes_with_env(needle)) - tree
                    if escaped:  # a kernel nbgrader started after `tree` was read is in its tree now: not escaped
                        escaped -= {proc.pid, *descendants(proc.pid)}
                    for pid in escaped:  # escaped from nbgrader's tree: killed
                        kill_tree(pid, include_root=True)
                    if now > notebook_until and not abnormal:
                        abnormal = f"a notebook did not finish within {per_notebook_s:.0f} s"
                if abnormal:
                    kill_tree(proc.pid, include_root=True, env_token=needle)
                    proc.wait()
                    break
                time.sleep(0.25)
        finally:
            if proc.poll() is None:  # interrupted: leave nothing running
                kill_tree(proc.pid, include_root=True, env_token=needle)
                proc.wait()
            kill_tree(proc.pid, session=proc.pid, env_token=needle)  # what the kernels left
        if abnormal is None and proc.returncode < 0:
            import signal

            try:
                name = signal.Signals(-proc.returncode).name
            except ValueError:
                name = f"signal {-proc.returncode}"
            abnormal = f"nbgrader was killed by {name}"
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out.read().decode("utf-8", "replace"),
                                             err.read().decode("utf-8", "replace"))
    return result, abnormal


def _cpu_ticks(pids) -> int:
    """User + system CPU time of ``pids`` in clock ticks (``/proc/<pid>/stat``; 0 for what cannot be read)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total


def _started(proc: subprocess.CompletedProcess, students: list[str]) -> list[str]:
    """The students nbgrader started in a run, in order (its log's "Creating/updating student" lines)."""
    text = (proc.stderr or "") + (proc.stdout or "")
    return [m.group("id") for m in _STUDENT_LINE.finditer(text) if m.group("id") in students]


def _verdict_points(unit, verdicts: list[dict] | None, cause: str | None) -> dict[str, float]:
    """``{grade_id: points}`` from the checker's verdicts (0 for an exercise without one)."""
    by_id = {v["exercise_id"]: v for v in verdicts or []}
    return {e.grade_id: float(by_id[e.id]["points"]) if e.id in by_id and by_id[e.id]["status"] == "passed" else 0.0
            for e in unit.exercises}


def _render(v: dict) -> str:
    from grader.core import Verdict

    fields = {k: v.get(k) for k in ("exercise_id", "status", "message", "bug_id", "hint", "points", "max_points")}
    return Verdict(**fields, notes=list(v.get("notes") or [])).render()


def _write_scores(work: Path, student: str, assignment: str, unit, per: dict[str, float],
                  verdicts: list[dict] | None, cause: str | None, name: dict | None = None,
                  gb=None) -> tuple[list[str], list[str]]:
    """Set the gradebook's scores from ``per`` and put each verdict into its grade cell's output.

    Also names the student (``name`` from the roster, else the id) and caps every output. ``gb``: an open
    :class:`nbgrader.api.Gradebook` (the caller commits), else the work root's is opened and committed here.

    Returns:
        ``(notes, output notes)``: the second are about the notebook's outputs (cut), which differ between a
        notebook as saved and one executed.
    """
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry

    out_notes: list[str] = []
    nb_name = Path(unit.exercise).stem
    with contextlib.ExitStack() as stack:
        own = gb is None
        if own:
            gb = stack.enter_context(Gradebook(f"sqlite:///{work / '.grading' / 'gradebook.db'}"))
        for e in unit.exercises:
            try:
                g = gb.find_grade(e.grade_id, nb_name, assignment, student)
            except MissingEntry:
                continue
            g.auto_score = per[e.grade_id]
            g.manual_score = None
            g.extra_credit = None
            g.needs_manual_grade = False
            g.cell.max_score = float(e.points)
        named = bool(name and (name.get("first_name") or name.get("last_name")))
        fields = name if named else {"first_name": None, "last_name": student, "email": (name or {}).get("email")}
        gb.update_or_create_student(student, **fields)
        if own:
            gb.db.commit()
    path = work / ".grading" / "autograded" / student / assignment / Path(unit.exercise).name
    if not path.exists():
        return ["no autograded notebook (nbgrader could not record it); scores are in grades.csv"], []
    by_id = {v["exercise_id"]: v for v in verdicts or []}
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        e = next((x for x in unit.exercises if x.grade_id == gid), None)
        if e is None or cell.cell_type != "code" or not cell.metadata["nbgrader"].get("grade"):
            continue
        text = _render(by_id[e.id]) if e.id in by_id else f"{e.id}: not graded (0/{e.points} points): {cause}"
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text + "\n")]
    if cap_outputs(nb):
        out_notes.append(f"printed output over {OUTPUT_CAP_CHARS:,} characters per cell was cut in the graded "
                         "notebook and the feedback")
    nbformat.write(nb, path)
    return [], out_notes


OUTPUT_CAP_CHARS = 20_000


def cap_outputs(nb, limit: int = OUTPUT_CAP_CHARS) -> bool:
    """Cut every code cell's outputs to ``limit`` characters in all (text kept, rich data dropped past it)."""
    cut = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        budget, kept = limit, []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = out.get("text", "")
                if len(text) > budget:
                    out["text"] = text[:max(budget, 0)] + f"\n... [output cut: {len(text):,} characters]\n"
                    cut = True
                budget -= len(out["text"])
            elif out.get("output_type") in ("execute_result", "display_data"):
                size = sum(len(str(v)) for v in out.get("data", {}).values())
                if size > budget:
                    out["data"] = {"text/plain": f"[output cut: {size:,} characters]"}
                    cut = True
                budget -= min(size, 100)
            elif out.get("output_type") == "error":
                tb = out.get("traceback", [])
                if sum(len(t) for t in tb) > budget:
                    out["traceback"] = [t[:2000] for t in tb[:3]] + ["... [traceback cut]"] + [t[:2000] for t in tb[-3:]]
                    cut = True
            if budget < -limit:  # far past the cap: drop the rest of this cell's outputs
                cut = True
                break
            kept.append(out)
        if len(kept) != len(cell.get("outputs", [])):
            cell.outputs = kept + [{"output_type": "stream", "name": "stdout", "text": "... [further outputs cut]\n"}]
    return cut


def _prepare_for_nbgrader(path: Path, nb, unit, course) -> None:
    """Give nbgrader a notebook it can take: metadata repaired, or the release when the file is unreadable."""
    import nbformat

    if nb is None:  # invalid JSON: nbgrader records the untouched release (no answers), so the student is listed
        shutil.copy2(course.root / unit.exercise, path)
    else:
        nbformat.write(nb, path)


def _batch_name(students: list[str], assignment: str, shown: int = 6) -> str:
    """``a/NN_x, b/NN_x`` (the first ``shown``, then how many more): the submissions of one nbgrader run."""
    names = [f"{s}/{assignment}" for s in students]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


_STUDENT_LINE = re.compile(r"Creating/updating student with ID '(?P<id>[^']*)'")
_FAILED_LINE = re.compile(r"There was an error processing assignment '[^']*' for student '(?P<id>[^']*)'")


def _split_autograde_log(proc: subprocess.CompletedProcess, students: list[str]) -> tuple[dict[str, str], set[str]]:
    """One ``nbgrader autograde <assignment>`` run's log cut into each student's part, and who failed.

    nbgrader logs ``Creating/updating student with ID '<id>'`` when it starts a student and ends a run that
    had failures with ``There was an error processing assignment '<a>' for student '<id>'`` lines. The parts
    only shape the notes (the cause of a failure), never a score: a kernel that writes to nbgrader's stderr
    could at worst blur its own note.
    """
    text = (proc.stderr or "") + (proc.stdout or "")
    parts: dict[str, list[str]] = {s: [] for s in students}
    failed: set[str] = set()
    current: str | None = None
    for line in text.splitlines():
        m = _FAILED_LINE.search(line)
        if m:
            failed.add(m.group("id"))
            current = None  # the run's closing summary belongs to nobody's part
            continue
        m = _STUDENT_LINE.search(line)
        if m:
            current = m.group("id") if m.group("id") in parts else None
        if current is not None:
            parts[current].append(line)
    return {s: "\n".join(lines) for s, lines in parts.items()}, failed & set(students)


def _autograde_cause(text: str) -> str:
    """One line naming why nbgrader could not run a notebook, from that notebook's part of the log."""
    if "DeadKernelError" in text or "Kernel died" in text:
        return "the kernel died: os._exit, a crash in native code, or out of memory"
    if "Timeout" in text:
        return "a cell timed out"
    return _last_line_with_error(text)


def _last_error(proc: subprocess.CompletedProcess) -> str:
    return _last_line_with_error(proc.stderr or "")


def _last_line_with_error(text: str) -> str:
    text = text.strip().splitlines()
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
