"""Running checks: on a namespace, on a notebook file (``course check``), inside a kernel (nbgrader).

Hidden test cells in ``solutions/`` are one line::

    from grader import grade; grade("03.softmax_stable")

Inside the kernel, :func:`grade` rebuilds the learner's definitions from the cells executed so far
(IPython's input history, AST-extracted into a fresh namespace), runs the check, prints the verdict,
and raises :class:`GradeFailed` when it did not pass. That exception renders as a single line, so
the notebook (and nbgrader's feedback) never shows a grader traceback.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import time
import traceback
import warnings
from pathlib import Path

import torch

from .core import (
    BUGS,
    CHECK_TIME_LIMIT_S,
    CHECKS,
    COURSE_PACKAGES,
    CheckFailure,
    LocalLearner,
    Tester,
    TimeLimitExceeded,
    Verdict,
    time_limit,
)
from .extract import Extracted, code_cells_of_notebook, restore_locked_cells

__all__ = ["ALSO_BLOCKED", "GradeFailed", "also_blocked", "check_notebook", "grade", "load_unit", "run_check",
           "run_unit"]

DEBUG_ENV = "LLMCOURSE_GRADER_DEBUG"
DEFER_ENV = "LLMCOURSE_DEFER_CHECKS"  # set by course grade for nbgrader's kernels (see grade())


def load_unit(unit_id: str) -> None:
    """Import ``grader.checks.uNN_*`` and ``grader.bugs.uNN_*`` (registering their checks and bugs)."""
    for package in ("grader.checks", "grader.bugs"):
        pkg = importlib.import_module(package)
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name.startswith(f"u{unit_id}_"):
                importlib.import_module(f"{package}.{info.name}")


def _points(exercise_id: str) -> int:
    from llmcourse.manifest import load_course

    try:
        return load_course().exercise(exercise_id).points
    except KeyError:
        return 0


# exercise id -> ("module:qualname", ...): library siblings of the exercise's reference (see also_blocked)
ALSO_BLOCKED: dict[str, tuple[str, ...]] = {}


def also_blocked(exercise_id: str, *targets: str) -> None:
    """Declare course objects that give this exercise's answer under another name (its *siblings*).

    ``targets`` are ``"module:qualname"`` strings in ``llmcourse`` or ``coursetools`` (a benchmark's copy:
    ``"coursetools.bench.capstone:_greedy_with_cache"``; ``"llmcourse.train.optim:parameter_groups"``,
    ``"llmcourse.models.llama3_cached:CachedLlama3Model"``, or a method such as
    ``"llmcourse.nn.multihead:MultiHeadAttention._fused_qkv"``), resolved only in the worker, so declaring
    them imports nothing. They are blocked there exactly like the reference while the learner's code runs.
    Use it for a library function that returns the same answer without going through the reference (a
    helper the reference is built on, a fast path, an uncached twin, a later unit's copy); when the sibling
    can simply call the reference, prefer that. Never list an earlier unit's finished piece that the
    exercise builds on, nor anything the check's own probes use inside the worker.
    """
    for target in targets:
        module, sep, qualname = target.partition(":")
        if not (sep and module.split(".")[0] in COURSE_PACKAGES and qualname):
            raise ValueError(f"also_blocked wants 'llmcourse.module:qualname' (or a coursetools module), got {target!r}")
    ALSO_BLOCKED[exercise_id] = ALSO_BLOCKED.get(exercise_id, ()) + tuple(targets)


def blocked_references(spec) -> list[tuple[str, str]]:
    """``(module, qualname)`` of the course objects that answer this exercise (off limits in the worker):
    the reference objects named in the check's ``names``, then the siblings declared by :func:`also_blocked`."""
    out = []
    try:
        refs = spec.reference()
    except Exception:  # noqa: BLE001 - a broken reference is reported by the check itself
        refs = {}
    for name in spec.names:
        obj = refs.get(name)
        module = getattr(obj, "__module__", "") or ""
        qualname = getattr(obj, "__qualname__", "") or ""
        if module.startswith("llmcourse") and qualname and "<locals>" not in qualname:
            out.append((module, qualname))
    for target in ALSO_BLOCKED.get(spec.exercise_id, ()):
        module, _, qualname = target.partition(":")
        if (module, qualname) not in out:
            out.append((module, qualname))
    return out


def run_check(exercise_id: str, sources: list[str] | None = None, *, namespace: dict | None = None,
              problems: list[str] | None = None) -> Verdict:
    """Run the check of ``exercise_id``; never raises.

    Args:
        sources: the code cells of a learner's notebook. Their definitions are extracted and run
            only in a worker process (:class:`grader.worker.LearnerProcess`); this process decides.
        namespace: a *trusted* namespace run in this process instead (the grader's self-tests run
            the mutants this way); not for learner submissions.
        problems: notes about the notebook (trusted namespaces only; a worker reports its own).
    """
    used: list = []
    verdict = _run_check(exercise_id, sources, namespace, problems, used)
    if used and getattr(used[0], "harmed", False):
        # the forkserver (the worker's parent) was stopped or killed while this exercise ran: 0, one line
        from .supervise import STOPPED_NOTE

        verdict = Verdict(exercise_id, "failed", f"{STOPPED_NOTE[0].upper()}{STOPPED_NOTE[1:]} (it signalled the "
                          "process that supervises it); this exercise scores 0.", max_points=verdict.max_points,
                          notes=verdict.notes)
    return verdict


def _run_check(exercise_id: str, sources, namespace, problems, used: list) -> Verdict:
    load_unit(exercise_id[:2])
    max_points = _points(exercise_id)
    spec = CHECKS.get(exercise_id)
    if spec is None:
        return Verdict(exercise_id, "error", "No check is registered for this exercise.", max_points=max_points)
    if (sources is None) == (namespace is None):
        raise TypeError("run_check needs exactly one of sources= or namespace=")
    notes = list(problems or [])
    learner = None
    tester = None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # checks use tiny tensors: one thread is fastest, and on a busy box by far
    try:
        if namespace is not None:
            learner = LocalLearner(namespace, problems)
        else:
            from .worker import LearnerProcess

            learner = LearnerProcess(sources, blocked_references(spec))
            used.append(learner)
            notes = list(dict.fromkeys(learner.problems))
        # warnings would print grader file names and lines; learners get the verdict instead
        with warnings.catch_warnings(), time_limit(CHECK_TIME_LIMIT_S):
            warnings.simplefilter("ignore")
            if hasattr(learner, "deadline"):
                learner.deadline = time.monotonic() + CHECK_TIME_LIMIT_S
            tester = Tester(spec, learner, notes)
            spec.func(tester)
    except CheckFailure as failure:
        v = Verdict(exercise_id, failure.status, failure.message, max_points=max_points, notes=notes)
        bugs = BUGS.get(exercise_id, [])
        if failure.bug_id == "name_error":
            match = next((b for b in bugs if b.detect == "name_error"), None)
        else:
            match = next((b for b in bugs if b.id == failure.bug_id), None)
        if match:
            v.bug_id, v.hint = match.id, match.hint
        return v
    except TimeLimitExceeded:
        return Verdict(exercise_id, "failed", f"The check did not finish within {CHECK_TIME_LIMIT_S:.0f} s: "
                       "is there an infinite loop, or a very slow loop over elements?", max_points=max_points,
                       notes=notes)
    except Exception as exc:  # a bug in the grader itself: never show its traceback to a learner
        from llmcourse.data import DataNotFoundError

        if isinstance(exc, DataNotFoundError):  # the machine lacks a data set the check reads: say which, and where
            return Verdict(exercise_id, "error", f"This check reads a data set that is missing here: {exc}",
                           max_points=max_points, notes=notes)
        problem = tester.data_problem(exc) if tester is not None else None
        if problem is not None:  # the learner returned a wrong dtype/shape that the check could not compare
            return Verdict(exercise_id, "failed", problem, max_points=max_points, notes=notes)
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        return Verdict(exercise_id, "error", f"The grader itself failed ({type(exc).__name__}). Please report "
                       f"this to your instructor; set {DEBUG_ENV}=1 to see details.", max_points=max_points,
                       notes=notes)
    finally:
        torch.set_num_threads(threads)
        if learner is not None:
            learner.close()
    return Verdict(exercise_id, "passed", points=max_points, max_points=max_points, notes=notes)


def run_unit(unit_id: str, learner: list[str] | Extracted) -> list[Verdict]:
    """Every exercise of a unit (course.toml order).

    ``learner`` is the notebook's code cells (isolated: a fresh worker per exercise) or an
    :class:`Extracted` trusted namespace (copied per check, run in this process).
    """
    from llmcourse.manifest import load_course

    unit = load_course().unit(unit_id)
    if isinstance(learner, Extracted):
        return [run_check(e.id, namespace=dict(learner.namespace), problems=learner.problems) for e in unit.exercises]
    return [run_check(e.id, list(learner)) for e in unit.exercises]


def release_notebook(unit):
    """The released exercise notebook of ``unit`` (what locked cells are restored from), or None."""
    import nbformat

    from llmcourse.manifest import load_course

    path = load_course().root / unit.exercise
    try:
        return nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001
        return None


def notebook_sources(nb, unit) -> list[str]:
    """The code cells that are graded: the notebook's, after restoring locked cells from the release."""
    from .repair import repair_nbgrader_metadata

    release = release_notebook(unit)
    if release is not None:
        nb, _ = repair_nbgrader_metadata(nb, release)  # an editor may have stripped nbgrader's ids
        nb = restore_locked_cells(nb, release)
    return code_cells_of_notebook(nb)


def add_answer_notes(verdicts: list[Verdict], nb, unit) -> list[Verdict]:
    """Attach "your answer cell is markdown" notes to the verdicts they concern (both views)."""
    from .repair import answer_cell_notes

    notes = answer_cell_notes(nb, unit)
    for v in verdicts:
        if v.exercise_id in notes:
            v.notes = [notes[v.exercise_id], *v.notes]
    return verdicts


def check_notebook(path: str | os.PathLike) -> tuple[object, list[Verdict]]:
    """``course check``: the unit of an exercise notebook and a verdict per exercise.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a notebook, or a notebook the course does not know.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such file: {p}")
    if p.is_dir() or p.suffix != ".ipynb":
        raise ValueError(f"not a notebook (.ipynb): {p}")
    from .repair import read_submission

    nb, cause = read_submission(p)
    if nb is None:
        raise ValueError(cause)
    unit = unit_of_notebook(nb, p)
    if unit is None or not unit.exercises:
        raise ValueError(f"{p.name} is not an exercise notebook of this course (see `course list`)")
    return unit, add_answer_notes(run_unit(unit.id, notebook_sources(nb, unit)), nb, unit)


def unit_of_notebook(nb, path: Path | None = None):
    """The course unit a notebook belongs to: by file name, else by its graded cells (exNN_name)."""
    from llmcourse.manifest import exercise_id_from_grade_id, load_course

    course = load_course()
    unit = course.unit_for_notebook(path) if path is not None else None
    if unit is None:  # a renamed copy: recognise the unit by its graded cells (exNN_name)
        ids = {exercise_id_from_grade_id(c.metadata.get("nbgrader", {}).get("grade_id", "")) for c in nb.cells}
        units = {i[:2] for i in ids if i}
        unit = course.unit(units.pop()) if len(units) == 1 else None
    return unit


class GradeFailed(AssertionError):
    """Raised by :func:`grade` in a notebook; IPython renders it as one line, without a traceback."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.render())
        self.verdict = verdict

    def _render_traceback_(self):  # IPython hook: replaces the usual traceback
        return [f"{type(self).__name__}: {self.verdict.exercise_id} did not pass (see the report above)"]


def _kernel_sources(unit_id: str) -> tuple[list[str] | None, dict | None]:
    """The learner's cells as seen from inside a kernel: ``(sources, live_namespace)``.

    1. IPython's input history ``In`` (nbgrader and JupyterLab store it);
    2. else the unit's notebook file in the kernel's working directory (nbval executes with
       ``store_history=False``, so ``In`` stays empty there);
    3. else ``(None, user_ns)``: the live namespace, used as is.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return None, None
    shell = get_ipython()
    if shell is None:
        return None, None
    history = [cell for cell in (shell.user_ns.get("In") or []) if isinstance(cell, str) and cell.strip()]
    if history:
        return history, None
    try:
        import nbformat

        from llmcourse.manifest import load_course

        unit = load_course().unit(unit_id)
        for name in dict.fromkeys(Path(p).name for p in (unit.exercise, unit.solution)):
            candidate = Path.cwd() / name
            if candidate.is_file():
                return code_cells_of_notebook(nbformat.read(candidate, as_version=4)), None
    except Exception:  # noqa: BLE001 - fall through to the live namespace
        pass
    return None, dict(shell.user_ns)


def grade(exercise_id: str, namespace: dict | None = None) -> Verdict:
    """The hidden-test entry point: check ``exercise_id`` against the cells executed so far.

    Prints the verdict; raises :class:`GradeFailed` unless it passed (so nbgrader gives 0 points).
    ``namespace`` (mainly for tests) bypasses the kernel history.

    Under ``course grade`` (``LLMCOURSE_DEFER_CHECKS=1`` in nbgrader's kernels) the checks are not
    run in the kernel at all: the checker decides them outside it and replaces this cell's output.
    """
    if namespace is None and os.environ.get(DEFER_ENV) == "1":
        print(f"{exercise_id}: checked by course grade outside this notebook's kernel")
        return Verdict(exercise_id, "passed", "deferred to course grade")
    if namespace is not None:
        verdict = run_check(exercise_id, namespace=namespace)
    else:
        sources, live = _kernel_sources(exercise_id[:2])
        if sources is not None:
            # the current cell (this call) is among them; extraction keeps only imports/defs/classes
            verdict = run_check(exercise_id, sources)
        elif live is not None:
            verdict = run_check(exercise_id, namespace=live)
        else:
            raise RuntimeError("grade() without a namespace must run inside an IPython kernel")
    print(verdict.render())
    if not verdict.passed:
        raise GradeFailed(verdict)
    return verdict
