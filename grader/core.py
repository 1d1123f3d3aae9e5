"""The grader's machinery: verdicts, the check and bug registries, and the diagnosis.

A **check** (one per graded exercise id, registered with :func:`check`) receives a :class:`Tester`
bound to the learner's namespace. It compares the learner's objects with the reference (the
``llmcourse`` library), with independent oracles (torch built-ins, ``transformers``) and with
properties. The first failure stops the check.

A **bug** (registered with :func:`bug`) is a known-wrong implementation from the syllabus's bug
catalog, with an id (``B03.no_scale``) and a hint that names the concept, never the code. When a
comparison fails, the same probe is re-run on every mutant of the exercise; if the learner's
result matches a mutant's, the verdict names that bug. Some bugs are recognised by a detector
instead (a property such as "columns sum to 1"): the check then names the bug explicitly.

Messages say what was expected, what came back, and the max abs difference (or the property that
broke). They never contain grader source or reference code.

Isolation (see ``grader/worker.py``): the learner's code runs only in a worker process. A **probe**
(``impl -> plain data``) is the unit of work that crosses over: for the learner it is shipped by
value to the worker and its result comes back as plain data (``grader/plain.py``); for the
reference and the mutants it runs here, in the checker, through the same :func:`~grader.plain.plain`
conversion. Everything else in a check (expected values, comparisons, the verdict) runs here only.

**Tolerances: which one a check author uses when** (the one place this is written; docs/adding-a-unit.md and
:mod:`grader.oracles` point here). A correct float32 answer does not give the same bits on every CPU: ATen picks
its kernels by processor (generic, AVX2, AVX-512, NEON; ``ATEN_CPU_CAPABILITY`` forces one), and BLAS and thread
counts change the order of reductions. The differences are a few ulps *of the output's scale* (measured, issue 35:
unit 11's attention output, values up to 17, differs by 1.58e-5 = 7.8 ulps of 17 between the generic and the
AVX-512 kernels), so a small element beside large ones can miss an elementwise ``rtol``. A wrong answer differs at
the output's own scale (a missing scale, mask or norm: relative 1e-2 and more), so none of the allowances below lets
a catalogued mutant pass.

1. **Nothing to add, ever: the float32 floor.** Every inexact comparison (``Tester.compare``, the diagnosis, the
   failure's description, :func:`grader.oracles.assert_same`) allows :func:`float32_floor` of the expected value,
   ``FLOAT32_ULPS`` (32) ulps at its largest finite magnitude, on top of the check's own ``atol + rtol*|expected|``
   (32 = the measured 7.8 with a margin of 4 for other processors). An exact comparison (``atol = rtol = 0``:
   integers, booleans, results that must be bit-identical) stays exact. A check that calls ``torch.allclose`` or
   compares by hand gets no floor: compare through ``t.compare`` (or add ``float32_floor`` yourself).
2. **The check's own atol/rtol: sized by the computation compared.** Short paths over O(1) values (an activation,
   a softmax, one attention head): the default 1e-5; sums of O(1) products over a few hundred terms (gradients,
   :mod:`grader.gradcheck`): 1e-4. Write the reason beside a tolerance that is not the default.
3. **A long path against a reference computed elsewhere: :func:`grader.oracles.float32_atol`.** When the expected
   value comes from another route (a stored ``transformers`` oracle, another kernel, another op order) through
   reductions of summed length ``n`` (a whole model's forward: units 08 and 11), rounding errors grow like
   ``sqrt(n)`` ulps of the scale (a random walk; Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2):
   pass ``atol=float32_atol(expected, n)`` (8 ulps × ``sqrt(n)`` at the expected value's scale, at least 1e-5), with
   ``n`` counted from the path (see ``gpt2_reduction`` in unit 08, ``model_reduction`` in unit 11). It exceeds the
   fixed floor once ``n > 16``; the floor still applies on top.

Every catalogued mutant must still fail under each: ``tests/test_cpu_portability.py`` runs the self-test under
``ATEN_CPU_CAPABILITY=default`` and ``=avx2`` with 1 and 3 threads.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "BLOCK_MARK", "BUGS", "CHECKS", "Bug", "CheckSpec", "CheckFailure", "InstanceGuard", "LearnerError",
    "LocalLearner", "NotAttempted", "Tester", "TimeLimitExceeded", "run_learner",
    "Verdict", "bug", "bug_name", "check", "forbid", "module_facts", "nonfinite_report", "reference_memo", "state_change",
    "time_limit",
]

# The message prefix of the error raised by a course reference that is blocked in the worker
# (grader/worker.py swaps its code): recognised in run_learner to say what happened.
BLOCK_MARK = "llmcourse-reference-blocked:"


def blocked_reference(exc: BaseException) -> str | None:
    """The label of the blocked course object an exception came from (see :data:`BLOCK_MARK`), else None."""
    text = str(exc)
    return text.split(BLOCK_MARK, 1)[1].strip() if BLOCK_MARK in text else None

CHECK_TIME_LIMIT_S = 30.0  # per check; each is designed to finish in well under 10 s on 2 cores


# --------------------------------------------------------------------------------------------
# verdicts and control flow
# --------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    exercise_id: str
    status: str  # "passed" | "failed" | "not_attempted" | "missing" | "error"
    message: str = ""
    bug_id: str | None = None
    hint: str | None = None
    points: int = 0
    max_points: int = 0
    notes: list[str] = field(default_factory=list)  # e.g. syntax errors elsewhere in the notebook

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def render(self, notes: bool = True) -> str:
        """Plain-text report for a learner (no grader source, no reference code)."""
        label = {
            "passed": "passed", "failed": "FAILED", "not_attempted": "not attempted",
            "missing": "FAILED (missing)", "error": "ERROR (grader)",
        }[self.status]
        lines = [f"{self.exercise_id}: {label} ({self.points}/{self.max_points} points)"]
        if self.message:
            lines += ["  " + line for line in self.message.splitlines()]
        if self.bug_id:
            lines.append(f"  Diagnosis: {bug_name(self.bug_id)}: {self.hint}")
        if notes and not self.passed:
            lines += [f"  Note: {n}" for n in self.notes]
        return "\n".join(lines)


def bug_name(bug_id: str) -> str:
    """What a learner reads for a catalogued mistake: its name without the internal unit prefix
    (``B03.no_scale`` -> ``no_scale``); ids never reach a learner."""
    return bug_id.split(".", 1)[1] if "." in bug_id else bug_id


class CheckFailure(Exception):
    """Raised inside a check when the learner's code fails; carries the message and diagnosis."""

    def __init__(self, message: str, bug_id: str | None = None, status: str = "failed"):
        super().__init__(message)
        self.message = message
        self.bug_id = bug_id
        self.status = status


class NotAttempted(CheckFailure):
    def __init__(self, message: str = "The stub still raises NotImplementedError."):
        super().__init__(message, status="not_attempted")


class TimeLimitExceeded(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`TimeLimitExceeded` in the block after ``seconds`` (main thread only; else no limit)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def on_alarm(signum, frame):
        raise TimeLimitExceeded(f"did not finish within {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    old_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_timer[0] > 0:  # restore an enclosing timer (approximately)
            signal.setitimer(signal.ITIMER_REAL, max(old_timer[0] - seconds, 0.01))


@contextlib.contextmanager
def forbid(*targets: tuple[Any, str], reason: str) -> Iterator[None]:
    """Temporarily replace attributes (e.g. ``(torch, "softmax")``) with functions that raise.

    Used when an exercise asks the learner to implement something a built-in already does.
    """

    saved = []

    def make(name):
        def blocked(*args, **kwargs):
            raise CheckFailure(f"Your code called {name}, which this exercise asks you not to use: {reason}")

        return blocked

    for owner, attr in targets:
        saved.append((owner, attr, getattr(owner, attr)))
        label = f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}"
        setattr(owner, attr, make(label))
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


# --------------------------------------------------------------------------------------------
# registries
# --------------------------------------------------------------------------------------------


@dataclass
class CheckSpec:
    exercise_id: str
    names: tuple[str, ...]  # what the learner must define
    func: Callable[[Tester], None]
    reference: Callable[[], dict]  # -> {name: reference object}, imported lazily from llmcourse


@dataclass
class Bug:
    id: str  # "B03.no_scale"
    exercise_id: str
    hint: str
    impl: dict  # {name: wrong object}; names not given come from the reference
    # "mutant": the learner's output matches this mutant's on the failing probe;
    # "detector": a property the check names explicitly;
    # "name_error": the learner's code raised NameError in the grader's fresh namespace (a notebook global)
    detect: str = "mutant"


CHECKS: dict[str, CheckSpec] = {}
BUGS: dict[str, list[Bug]] = {}


def check(exercise_id: str, names: tuple[str, ...] | list[str], reference: Callable[[], dict]):
    """Decorator registering ``func(t: Tester)`` as the check of ``exercise_id``."""

    def deco(func):
        CHECKS[exercise_id] = CheckSpec(exercise_id, tuple(names), func, reference)
        return func

    return deco


def bug(bug_id: str, exercise_id: str, hint: str, detect: str = "mutant", name: str | None = None):
    """Decorator registering a known-wrong implementation (a mutant) for ``exercise_id``.

    The decorated function or class stands for the learner object called ``name`` (default: its
    own ``__name__``). For exercises with several names, stack several registrations through
    :func:`bug_group`.
    """

    def deco(obj):
        key = name or obj.__name__
        BUGS.setdefault(exercise_id, []).append(Bug(bug_id, exercise_id, hint, {key: obj}, detect))
        return obj

    return deco


def bug_group(bug_id: str, exercise_id: str, hint: str, impl: dict, detect: str = "mutant") -> None:
    """Register a mutant made of several objects (``{"split_heads": f, "merge_heads": g}``)."""
    BUGS.setdefault(exercise_id, []).append(Bug(bug_id, exercise_id, hint, dict(impl), detect))


def bug_by_id(bug_id: str) -> Bug:
    for bugs in BUGS.values():
        for b in bugs:
            if b.id == bug_id:
                return b
    raise KeyError(bug_id)


# --------------------------------------------------------------------------------------------
# the tester
# --------------------------------------------------------------------------------------------


class Impl:
    """Attribute access to one implementation (the learner's, the reference or a mutant).

    For the learner, calls are wrapped so that NotImplementedError means "not attempted", a missing
    name means "missing", and any other exception becomes a failure that cites the learner's own
    cell and line (never a grader frame).
    """

    def __init__(self, objects: dict, learner: bool, problems: list[str] | None = None):
        self._objects = objects
        self._learner = learner
        self._problems = problems or []

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._objects:
            if self._learner:
                extra = (" Problems while loading your notebook: " + "; ".join(self._problems)) if self._problems else ""
                raise CheckFailure(f"`{name}` is not defined in your notebook (renamed or deleted?).{extra}",
                                   status="missing")
            raise AttributeError(name)
        obj = self._objects[name]
        if not self._learner:
            return obj
        _reject_reference(name, obj)
        return _guard(obj, name)


# where the course's own code lives (the student library, and the tooling whose benchmarks hold copies of some
# answers): an object from there is never accepted as the learner's own. Names only; nothing is imported.
COURSE_PACKAGES = ("llmcourse", "coursetools")


def _reject_reference(name: str, obj) -> None:
    module = getattr(obj, "__module__", "") or ""
    if module.split(".")[0] in COURSE_PACKAGES:
        raise CheckFailure(f"`{name}` is the course library's version (imported from {module}); "
                           "this exercise asks you to write your own.")


def learner_frame(exc: BaseException) -> str:
    """'line L of your code cell that defines `f`: <source line>' for the innermost learner frame, or ''."""
    from .cellnames import CELL_PREFIX, where_cell

    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith(CELL_PREFIX):
            where = f" (line {frame.lineno} of your {where_cell(frame.filename)}: `{(frame.line or '').strip()}`)"
    return where


def _guard(obj, name: str):
    """Wrap a learner callable (function or class) so its failures become CheckFailures."""
    if isinstance(obj, type):
        return _guard_class(obj, name)
    if not callable(obj):
        return obj

    def call(*args, **kwargs):
        return run_learner(obj, name, args, kwargs)

    call.__wrapped__ = obj
    return call


def run_learner(fn, name, args, kwargs):
    try:
        return fn(*args, **kwargs)
    except (CheckFailure, TimeLimitExceeded):
        raise
    except NotImplementedError as exc:
        raise NotAttempted(f"`{name}` still raises NotImplementedError (the stub is not filled in).") from exc
    except NameError as exc:
        raise CheckFailure(
            f"`{name}` raised NameError: {exc}{learner_frame(exc)}. The grader loads only your imports, "
            "functions and classes: a variable defined elsewhere in the notebook does not exist here.",
            bug_id="name_error",
        ) from exc
    except Exception as exc:
        if isinstance(exc, MemoryError) or "allocate memory" in str(exc):
            raise CheckFailure(f"`{name}` ran out of memory{learner_frame(exc)}: the process running your code "
                               "has a memory limit; are you building a far larger tensor than the task needs?") from None
        label = blocked_reference(exc)
        if label is not None:
            raise CheckFailure(f"`{name}` uses the course library's own answer to this exercise ({label}): calling, "
                               "wrapping or subclassing it is not allowed here; write your own.") from None
        raise LearnerError(name, exc) from exc


class LearnerError(CheckFailure):
    """The learner's code raised. ``etype``/``etext`` (type name, first line of the message) let a
    mutant that raises the same way match; they are plain strings, so they cross from the worker."""

    def __init__(self, name: str, exc: BaseException | None = None, *, message: str | None = None,
                 etype: str = "", etext: str = ""):
        if exc is not None:
            etype, etext = type(exc).__name__, _error_text(exc)
            message = f"`{name}` raised {etype}: {_first_lines(exc)}{learner_frame(exc)}"
        self.etype, self.etext = etype, etext
        super().__init__(message or f"`{name}` raised {etype}: {etext}")


def _first_lines(exc: BaseException, n: int = 3, limit: int = 500) -> str:
    text = "\n".join(str(exc).splitlines()[:n])
    return text if len(text) <= limit else text[:limit] + "…"


def _guard_class(cls, name: str):
    """A subclass-free proxy: instances are created and their methods called through run_learner."""

    class Proxy:
        def __new__(_proxy_cls, *args, **kwargs):  # noqa: N804
            inst = run_learner(cls, name, args, kwargs)
            return InstanceGuard(inst, name)

    Proxy.__name__ = cls.__name__
    Proxy.__wrapped__ = cls
    return Proxy


class InstanceGuard:
    """Wraps a learner module instance: calls and method calls go through run_learner."""

    def __init__(self, inst, name):
        object.__setattr__(self, "_inst", inst)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        return run_learner(self._inst, f"{self._name}.forward", args, kwargs)

    def __getattr__(self, attr):
        value = getattr(self._inst, attr)
        if callable(value) and not isinstance(value, (torch.nn.Module, torch.Tensor)):
            return lambda *a, **k: run_learner(value, f"{self._name}.{attr}", a, k)
        return value

    def __setattr__(self, attr, value):
        setattr(self._inst, attr, value)

    @property
    def unwrapped(self):
        return self._inst


def unwrap(x):
    """The learner object behind a guard (for isinstance/structure checks)."""
    return x.unwrapped if isinstance(x, InstanceGuard) else x


# Every inexact float comparison of a check also allows FLOAT32_ULPS ulps of float32 at the scale of the expected
# value, on top of the check's own atol + rtol*|expected| (why 32, and when a check uses grader.oracles.float32_atol
# instead: "Tolerances" in this module's docstring). An exact comparison (atol = rtol = 0) stays exact.
FLOAT32_ULPS = 32
FLOAT32_EPS = float(torch.finfo(torch.float32).eps)


def float32_scale(expected) -> float:
    """The scale float32 rounding is measured at: the largest finite magnitude of ``expected`` (a floating tensor or
    a number); 0.0 for an empty, non-floating or non-numeric value."""
    if isinstance(expected, torch.Tensor):
        if not (expected.is_floating_point() or expected.is_complex()) or expected.numel() == 0:
            return 0.0
        mags = expected.detach().abs().double()
        mags = mags[torch.isfinite(mags)]
        return float(mags.max()) if mags.numel() else 0.0
    try:
        scale = abs(float(expected))
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if scale != scale or scale == float("inf") else scale


def float32_floor(expected) -> float:
    """The tolerance every inexact comparison allows on top of its own: FLOAT32_ULPS ulps at ``expected``'s scale."""
    return FLOAT32_ULPS * FLOAT32_EPS * float32_scale(expected)


def _same(a, b, atol: float, rtol: float) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return False
        if a.dtype == torch.bool or b.dtype == torch.bool or not a.is_floating_point():
            return bool(torch.equal(a, b))
        if atol or rtol:
            atol = atol + float32_floor(b)
        return bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol, equal_nan=True))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y, atol, rtol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        try:
            floor = float32_floor(b) if (atol or rtol) else 0.0
            return abs(float(a) - float(b)) <= atol + floor + rtol * abs(float(b))
        except (TypeError, ValueError):
            return False
    return a == b


def _error_text(exc: BaseException) -> str:
    # first line only: messages that embed shapes identify the mistake; tensor reprs are dropped
    return str(exc).splitlines()[0] if str(exc) else ""


def _tensors(x, limit: int = 256) -> list[torch.Tensor]:
    """The floating-point tensors in plain data (nested lists/tuples/dicts), in order."""
    out: list[torch.Tensor] = []

    def walk(v):
        if len(out) >= limit:
            return
        if isinstance(v, torch.Tensor):
            if v.is_floating_point() or v.is_complex():
                out.append(v.detach())
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)
        elif isinstance(v, dict):
            for item in v.values():
                walk(item)

    walk(x)
    return out


_NONFINITE_ADVICE = ("look for a division by zero, a log or sqrt of a non-positive number, an overflowing exp, "
                     "or an uninitialised tensor (torch.empty)")


def nonfinite_report(actual, expected=None, nan_only: bool = False) -> str | None:
    """'N NaN and M inf among K values, first at index i (…)' for non-finite values in ``actual``
    where ``expected`` (same structure, or None: anywhere) is finite; None when there are none.

    ``nan_only`` ignores ±inf (a masked score of −inf is a legitimate output where nothing is known).
    """
    return _nonfinite(actual, expected, nan_only)[0]


def _nonfinite(actual, expected=None, nan_only: bool = False) -> tuple[str | None, bool]:
    """(:func:`nonfinite_report`'s text, whether every value that should be finite is not)."""
    got = _tensors(actual)
    want = _tensors(expected) if expected is not None else []
    paired = len(want) == len(got) and all(a.shape == e.shape for a, e in zip(got, want))
    nan = inf = total = 0
    first = None
    for k, a in enumerate(got):
        a = a.to(torch.complex128) if a.is_complex() else a.double()
        bad_nan, bad_inf = torch.isnan(a), torch.isinf(a)
        if nan_only:
            bad_inf = torch.zeros_like(bad_nan)
        should = torch.ones_like(bad_nan)
        if paired:
            should = torch.isfinite(want[k].double() if not want[k].is_complex() else want[k])
            bad_nan, bad_inf = bad_nan & should, bad_inf & should
        n_nan, n_inf = int(bad_nan.sum()), int(bad_inf.sum())
        if (n_nan or n_inf) and first is None:
            idx = tuple(int(i) for i in torch.nonzero(bad_nan | bad_inf)[0])
            first = (k, idx, a[idx].item() if a.dim() else a.item(), len(got) > 1)
        nan, inf, total = nan + n_nan, inf + n_inf, total + int(should.sum())
    if not (nan or inf):
        return None, False
    counts = " and ".join(p for p in (f"{nan} NaN" if nan else "", f"{inf} inf" if inf else "") if p)
    k, idx, value, several = first
    where = f"first at index {idx}" + (f" of returned tensor {k + 1}" if several else "")
    scope = f"of the {total} values that should be finite" if paired else f"among its {total} values"
    return f"your result contains non-finite values: {counts} {scope} ({where}: {value})", nan + inf == total


def _all_nonfinite(actual) -> bool:
    got = _tensors(actual)
    return bool(got) and all(not torch.isfinite(a).any() for a in got if a.numel())


def describe_difference(actual, expected, atol: float, rtol: float) -> str:
    """'expected shape …, got …' or 'max abs difference d at index i: expected e, got a'."""
    if not isinstance(actual, torch.Tensor):
        return f"expected {_short(expected)}, got {_short(actual)} (type {type(actual).__name__})"
    if not isinstance(expected, torch.Tensor):
        return f"expected {_short(expected)}, got a tensor of shape {tuple(actual.shape)}"
    if actual.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}"
    if actual.dtype != expected.dtype and (actual.dtype == torch.bool or expected.dtype == torch.bool):
        return f"expected dtype {expected.dtype}, got {actual.dtype}"
    a, e = actual.detach().double(), expected.detach().double()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if (nan_a & ~nan_e).any():
        idx = tuple(int(i) for i in torch.nonzero(nan_a & ~nan_e)[0])
        return f"your result has NaN at index {idx} where {e[idx].item():.4g} was expected"
    diff = (a - e).abs().nan_to_num(nan=0.0, posinf=float("inf"))
    floor = float32_floor(expected) if (atol or rtol) else 0.0
    bad = diff > atol + floor + rtol * e.abs().nan_to_num(nan=0.0)
    if not bad.any():
        return "values match within tolerance"
    flat = int(torch.argmax(torch.where(bad, diff, torch.zeros_like(diff))))
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    first = tuple(int(i) for i in torch.nonzero(bad)[0])
    return (f"max abs difference {diff[idx].item():.3g} at index {idx}: expected {e[idx].item():.6g}, "
            f"got {a[idx].item():.6g} (first differing index {first}; tolerance atol={atol:g}"
            + (f" + {floor:.2g} (float32 rounding at the output's scale)" if floor else "") + f", rtol={rtol:g})")


def _short(x) -> str:
    if isinstance(x, torch.Tensor):
        if x.numel() <= 12:
            return str([round(v, 4) if isinstance(v, float) else v for v in x.flatten().tolist()])
        return f"tensor of shape {tuple(x.shape)}"
    text = repr(x)
    return text if len(text) < 200 else text[:200] + "…"


class LocalLearner:
    """Runs probes on a namespace in this process, through the same conversion as the worker.

    Only for trusted namespaces (mutants and the reference in the grader's self-tests, a live kernel
    namespace when nothing else is available). Learner submissions go to :class:`grader.worker.LearnerProcess`.
    """

    def __init__(self, namespace: dict, problems: list[str] | None = None):
        self.impl = Impl(namespace, learner=True, problems=problems)
        self.problems = list(problems or [])

    def call(self, probe: Callable[[Impl], Any]):
        from .plain import plain

        with torch.random.fork_rng():
            return plain(probe(self.impl))

    def close(self) -> None:
        pass


def _captured(probe) -> list:
    """Objects a probe closes over (its cells and defaults), one level deep."""
    out = [c.cell_contents for c in (getattr(probe, "__closure__", None) or ()) if _cell_filled(c)]
    out += list(getattr(probe, "__defaults__", None) or ())
    return out


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
        return True
    except ValueError:
        return False


class Tester:
    """What a check uses: the learner's objects (behind a probe), comparisons, properties, diagnosis.

    ``learner`` is the object that runs probes on the learner's code: a worker process
    (:class:`grader.worker.LearnerProcess`) for submissions, a :class:`LocalLearner` for trusted
    namespaces; either way its results are plain data.
    """

    def __init__(self, spec: CheckSpec, learner, problems: list[str] | None = None):
        if isinstance(learner, dict):  # a trusted namespace (tests)
            learner = LocalLearner(learner, problems)
        self.spec = spec
        self.exercise_id = spec.exercise_id
        self._learner = learner
        self.problems = list(problems or [])
        self.reference = Impl(spec.reference(), learner=False)
        self.returned: list[tuple[str, tuple]] = []  # (dtype, shape) of tensors the learner returned
        self._last: tuple | None = None  # (probe, plain result) of the latest learner run
        self._compared_ok = False  # a compare() of this check has passed

    def _note_returned(self, value) -> None:
        if isinstance(value, torch.Tensor):
            self.returned.append((str(value.dtype).replace("torch.", ""), tuple(value.shape)))
        elif isinstance(value, (list, tuple)):
            for v in value[:64]:
                self._note_returned(v)
        elif isinstance(value, dict):
            for v in list(value.values())[:64]:
                self._note_returned(v)

    def data_problem(self, exc: BaseException) -> str | None:
        """A learner-facing message when ``exc`` (raised while the check handled returned data) comes
        from a wrong dtype or shape in what the learner returned; None when it looks like a grader bug."""
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        odd = sorted({d for d, _ in self.returned if d in {"float64", "float16", "bfloat16", "complex64", "complex128"}})
        if odd and isinstance(exc, (RuntimeError, TypeError, ValueError)):
            return (f"your code returned {', '.join(odd)} tensors where the check expects float32 (the default "
                    f"dtype) and could not compare them ({first}); keep the input's dtype")
        words = ("shape", "size", "dimension", "dim ", "broadcast", "index", "must match")
        if isinstance(exc, (RuntimeError, IndexError, ValueError)) and any(w in first.lower() for w in words):
            seen = ", ".join(str(s) for _, s in self.returned[-3:])
            return (f"the shape of what your code returned does not fit the check ({first}); shapes returned: "
                    f"{seen or 'none'}. Compare them with the shapes in the exercise text")
        return None

    # -- diagnosis -------------------------------------------------------------------------
    def mutant_impls(self) -> Iterator[tuple[Bug, Impl]]:
        ref = self.spec.reference()
        for b in BUGS.get(self.exercise_id, []):
            if b.detect == "mutant":
                yield b, Impl({**ref, **b.impl}, learner=False)

    def diagnose(self, probe: Callable[[Impl], Any], actual, atol: float = 1e-5, rtol: float = 1e-4,
                 pick: Callable[[Any], Any] | None = None) -> str | None:
        """Id of the first mutant whose ``probe`` result matches ``actual`` (within tolerance), else None.

        Mutants are course code: they run here, in the checker, through the same plain conversion.
        """
        from .plain import plain

        if not isinstance(actual, LearnerError) and _all_nonfinite(actual):
            return None  # an output with no finite value carries no evidence of a particular mistake
        for b, impl in self.mutant_impls():
            try:
                with torch.random.fork_rng():
                    out = plain(probe(impl))
                if pick is not None:
                    out = pick(out)
            except Exception as exc:  # a mutant that raises matches a learner that raised the same way
                if (isinstance(actual, LearnerError) and type(exc).__name__ == actual.etype
                        and _error_text(exc) == actual.etext):
                    return b.id
                continue
            if not isinstance(actual, LearnerError) and _same(actual, out, atol, rtol):
                return b.id
        return None

    # -- comparisons -----------------------------------------------------------------------
    def run(self, probe: Callable[[Impl], Any]):
        """``probe(learner)`` in the learner's process; its result as plain data.

        When the learner's code raises, a mutant that raises the same way names the bug.
        """
        try:
            out = self._learner.call(probe)
        except LearnerError as err:
            bug_id = self.diagnose(probe, err)
            raise CheckFailure(err.message, bug_id=bug_id) from None
        self._note_returned(out)
        self._last = (probe, out)
        return out

    def compare(self, probe: Callable[[Impl], Any], expected, what: str, atol: float = 1e-5, rtol: float = 1e-5,
                pick: Callable[[Any], Any] | None = None):
        """Run ``probe`` on the learner, compare (optionally ``pick(result)``) with ``expected``.

        On mismatch the failure message names ``what`` and the difference; the probe is re-run on
        every mutant of the exercise to name a known bug. ``pick`` runs here, on plain data.
        """
        if any(obj is expected for obj in _captured(probe) if isinstance(obj, torch.Tensor)):
            raise RuntimeError(f"grader bug: the probe for {what!r} captures the expected value")
        actual = self.run(probe)
        got = pick(actual) if pick else actual
        if not _same(got, expected, atol, rtol):
            detail = describe_difference(got, expected, atol, rtol)
            bug_id = self.diagnose(probe, got, atol=max(atol, 1e-12), rtol=max(rtol, 1e-6), pick=pick)
            bad = nonfinite_report(got, expected)
            if bad:  # reported as such, before the bug catalog's diagnosis (if any)
                if bug_id is None:
                    bad = f"{bad}; {_NONFINITE_ADVICE}"
                detail = bad if "NaN at index" in detail or "match within" in detail else f"{bad}; {detail}"
            raise CheckFailure(f"{what}: {detail}", bug_id=bug_id)
        self._compared_ok = True
        return actual

    def raised(self, probe: Callable[[Impl], Any]) -> str:
        """Name of the exception the learner's code raises in ``probe`` (``"no error"`` if none).

        For contracts such as "raises ValueError when T > context_length". A stub still counts as
        not attempted.
        """
        error = self.raised_error(probe)
        return error[0] if error is not None else "no error"

    def raised_error(self, probe: Callable[[Impl], Any]) -> tuple[str, str] | None:
        """``(type name, first line of the message)`` of the learner's exception in ``probe``, or None."""
        try:
            self._learner.call(probe)
        except LearnerError as err:
            return err.etype, err.etext
        return None

    def expect(self, condition: bool, message: str, bug: str | None = None) -> None:
        """A property; ``bug`` names the catalog entry this property detects when it fails."""
        if not condition:
            self.fail(message, bug)

    def fail(self, message: str, bug: str | None = None):
        """Fail with ``message``. When the learner's latest result holds NaN where the reference's is
        finite, the failure says so first. When *no* value that should be finite is and no comparison of
        this check has passed yet, the failure is only that (the property and its diagnosis ``bug`` say
        nothing about a result that is NaN everywhere: an all-NaN RMSNorm must not be told it centres
        like LayerNorm; a softmax right on small inputs and NaN on [1000, 1001] does overflow)."""
        bad, everywhere = self._last_nonfinite()
        if bad and everywhere and not self._compared_ok:
            # the property that failed says nothing about a result without one finite value
            raise CheckFailure(f"{bad}; {_NONFINITE_ADVICE}")
        if bad:
            message = f"{bad}{'; ' + _NONFINITE_ADVICE if bug is None else ''}. {message}"
        raise CheckFailure(message, bug_id=bug)

    def _last_nonfinite(self) -> tuple[str | None, bool]:
        if self._last is None:
            return None, False
        probe, out = self._last
        if nonfinite_report(out, nan_only=True) is None:
            return None, False
        from .plain import plain

        try:
            with torch.random.fork_rng():
                ref = plain(probe(self.reference))
        except Exception:  # the reference cannot run this probe: judge the learner's result alone
            ref = None
        return _nonfinite(out, ref, nan_only=True)


_REFERENCE_MEMO: dict = {}


def _digest_into(h, part) -> None:
    if isinstance(part, torch.Tensor):
        t = part.detach().contiguous()
        h.update(f"tensor{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.numpy().tobytes())
    elif isinstance(part, dict):
        h.update(b"dict")
        for k in sorted(part, key=repr):
            h.update(repr(k).encode())
            _digest_into(h, part[k])
    elif isinstance(part, (list, tuple)):
        h.update(f"seq{len(part)}".encode())
        for x in part:
            _digest_into(h, x)
    else:
        h.update(repr(part).encode())


def reference_memo(name: str, *parts, compute: Callable[[], Any]):
    """``compute()`` once per process for ``name`` and the *contents* of ``parts`` (tensors by their bytes, shape and
    dtype; dicts, lists and tuples element by element; anything else by ``repr``). For a check's reference runs: a
    warm check server or a grading checker answers many checks with the same weights and inputs. Callers must not
    modify what it returns (the same object every time)."""
    import hashlib

    h = hashlib.sha1(name.encode())
    for part in parts:
        _digest_into(h, part)
    key = h.hexdigest()
    if key not in _REFERENCE_MEMO:
        _REFERENCE_MEMO[key] = compute()
    return _REFERENCE_MEMO[key]


def state_change(module, call, eval_mode: bool = False) -> float:
    """Inside a probe: the largest change of any parameter or buffer of ``module`` caused by ``call()`` run under
    ``torch.no_grad()`` (after ``module.eval()`` when ``eval_mode``); 0.0 when nothing changed, ``inf`` when names
    or shapes changed. The side-effect probe of a graded module (a forward leaves its state alone)."""
    m = unwrap(module)
    if eval_mode:
        m.eval()
    before = {n: t.detach().clone() for n, t in [*m.named_parameters(), *m.named_buffers()]}
    with torch.no_grad():
        call()
    after = {n: t.detach() for n, t in [*m.named_parameters(), *m.named_buffers()]}
    if set(before) != set(after) or any(before[n].shape != after[n].shape for n in before):
        return float("inf")
    return max([float((before[n].float() - after[n].float()).abs().max()) for n in before if before[n].numel()]
               or [0.0])


def module_facts(obj) -> dict:
    """Plain facts about a learner object, for structure checks (call inside a probe).

    ``{"type": name, "is_module": bool, "state_dict": {key: shape}, "dtypes": {key: dtype},
    "parameters": [names], "buffers": {name: (dtype, shape)}, "children": {name: type name},
    "training": bool}``. These facts shape feedback only; a check passes on returned tensors.
    """
    obj = unwrap(obj)
    facts: dict = {"type": type(obj).__name__, "is_module": isinstance(obj, torch.nn.Module)}
    if not facts["is_module"]:
        return facts
    sd = obj.state_dict()
    facts["state_dict"] = {k: tuple(v.shape) for k, v in sd.items()}
    facts["dtypes"] = {k: v.dtype for k, v in sd.items()}
    facts["parameters"] = [n for n, _ in obj.named_parameters()]
    facts["buffers"] = {n: (b.dtype, tuple(b.shape)) for n, b in obj.named_buffers()}
    facts["children"] = {n: f"{type(c).__module__}.{type(c).__qualname__}" for n, c in obj.named_children()}
    facts["training"] = bool(obj.training)
    return facts
