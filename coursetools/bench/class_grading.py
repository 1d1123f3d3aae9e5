"""A class of submissions for one unit, graded with ``course grade --jobs 1`` and ``--jobs N`` (a benchmark-style
script: it prints times and memory, asserts nothing).

    python -m coursetools.bench.class_grading UNIT [--students 60] [--jobs 1 2] [--paths saved executed]
                                                   [--seed 0] [--timeout 600]

The class is generated, seeded, from the unit's solution and its bug catalog (:func:`build_class`):

* **right**: every answer cell from the solution;
* **partly right**: some answer cells left as the released stub (``NotImplementedError``);
* **wrong**: one or two exercises answered by a catalogued mutant (a known mistake, defined after the
  solution's definition in the same answer cell, so it replaces it), the rest right;
* **broken**: a notebook that is not valid JSON, or an answer cell with a syntax error.

Each ``--paths`` value (``saved``: ``course grade``'s default, the notebooks as saved, nothing re-run;
``executed``: ``course grade --execute``, every notebook run in nbgrader) and each ``--jobs`` value grades the same
class in a fresh work folder. Printed per run: total seconds, seconds per
submission, the peak resident memory of this process and everything below it (the checkers, their forkservers and
workers, nbgrader and its kernels; sampled every 0.2 s), where the time went (``GradeReport.timings``), the busy
CPU time of the machine meanwhile (how many cores were busy on average; meaningful on an idle machine), the CPU
time of the run's own processes (sampled with the memory: an estimate that other load inflates less),
whether the scores and verdicts (each grade cell's verdict text in the graded notebook) equal those of the
first run, and the time to write the class report (:mod:`coursetools.report`) again from the run's record. Before
the runs (with ``executed``) it times one start of the course's Jupyter
kernel running the notebook's first code cell (what nbgrader pays per submission before any answer runs).
Timings depend on the machine and its load: report them with both.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import copy
import inspect
import os
import random
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

KINDS = ("right", "partly right", "wrong", "broken")
WEIGHTS = (0.25, 0.25, 0.35, 0.15)


def _answer_cells(solution) -> dict[str, str]:
    """``{answer cell grade id: the solution's code}`` (BEGIN/END SOLUTION markers removed)."""
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(
        ln for ln in c.source.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
        for c in solution.cells if c.metadata.get("nbgrader", {}).get("solution")}


def _top_level(sources) -> Iterator[ast.stmt]:
    """The top-level statements of every source that parses (a cell with a syntax error is left out)."""
    for src in sources:
        try:
            yield from ast.parse(src).body
        except SyntaxError:
            continue


def _bound_names(sources: list[str]) -> set[str]:
    """Top-level names the notebook's code binds (imports, defs, classes, assignments)."""
    names: set[str] = set()
    for node in _top_level(sources):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


PLAIN = (str, int, float, bool, type(None))


def mutant_source(obj, name: str, available: set[str], solution_code: list[str] = ()) -> str | None:
    """Source code defining the catalogued mutant ``obj`` under the learner's ``name``; None when it cannot be written.

    The helpers it uses from its bug-catalog module (functions, base classes) come first under their own names; a
    closure's plain values (e.g. ``variant = 'no_scale'``) are set at the top of the function. A mutant that needs any
    other name the notebook does not define (a module constant: the extractor keeps only imports, defs and classes)
    is skipped. Where the mutant or a helper calls ``name`` itself meaning the course's reference (as in its
    bug-catalog module, e.g. a mutant ``rope_inv_freq`` whose helper starts from the reference ``rope_inv_freq``),
    the call goes to ``_reference_<name>``: a copy of the solution's definition of ``name`` (found in
    ``solution_code``, the solution's code cells) under that name, written first. Without it the pasted mutant would
    call itself for ever; a mutant that needs it and has no such definition is skipped.
    """
    parts: list[str] = []
    seen: set[int] = set()
    alias = f"_reference_{name}"
    aliased = [False]

    class _ToReference(ast.NodeTransformer):
        def visit_Name(self, node):  # noqa: N802 - ast's naming
            if node.id == name and isinstance(node.ctx, ast.Load):
                aliased[0] = True
                return ast.copy_location(ast.Name(alias, ast.Load()), node)
            return node

    def emit(o, new_name: str | None) -> bool:
        if id(o) in seen:
            return True
        seen.add(id(o))
        if not (inspect.isfunction(o) or inspect.isclass(o)) or o.__name__ == "<lambda>":
            return False
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(o)))
        except (OSError, TypeError, SyntaxError):
            return False
        node = tree.body[0]
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return False
        node.decorator_list = []
        node.name = new_name or o.__name__
        closure = {}
        if inspect.isfunction(o) and o.__closure__:
            for var, cell in zip(o.__code__.co_freevars, o.__closure__):
                value = cell.cell_contents
                if isinstance(value, PLAIN):
                    closure[var] = value
                elif inspect.isfunction(value) or inspect.isclass(value):
                    if not emit(value, var if value.__name__ != var else None):
                        return False
                else:
                    return False
            node.body[:0] = [ast.parse(f"{k} = {v!r}").body[0] for k, v in closure.items()]
        local = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        # a function's own (new) name is not local to it: in its body, ``name`` means the reference (a mutant
        # ``load_hf_deepseek`` that ends with ``return load_hf_deepseek(model, sd)`` calls the course's, not itself)
        local |= {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                  and not (n is node and isinstance(node, ast.FunctionDef))}
        free = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        module = sys.modules.get(o.__module__)
        scope = vars(module) if module is not None else {}
        for var in sorted(free - local - available - set(dir(builtins)) - set(closure)):
            helper = scope.get(var)
            if helper is None or getattr(helper, "__module__", None) != o.__module__ or not emit(helper, None):
                return False
        if name in free - local and scope.get(name) is not obj:  # `name` there is the reference, not this mutant
            node = _ToReference().visit(node)
        parts.append(ast.unparse(node))
        return True

    if not emit(obj, name):
        return None
    if aliased[0]:
        defs = [n for n in _top_level(solution_code) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name]
        if not defs:
            return None
        defs[-1].name = alias  # the notebook's last definition is the one in force
        parts.insert(0, ast.unparse(defs[-1]))
    return "\n\n\n".join(parts)


def build_class(unit, n: int, dest: Path, seed: int = 0, course=None, planted: dict | None = None) -> dict[str, str]:
    """Write ``n`` submissions of ``unit`` under ``dest/<student>/<assignment>/``; ``{student: kind}``.

    Seeded: the same ``(unit, n, seed)`` gives the same notebooks. ``planted``, if given, receives
    ``{student: [catalogued bug ids planted]}`` for the "wrong" submissions (of two mutants of one answer cell, only
    the later is in effect: its definitions replace the earlier's).
    """
    import nbformat

    from grader.core import BUGS
    from grader.runner import load_unit
    from llmcourse.manifest import load_course

    course = course or load_course()
    rng = random.Random(f"{unit.id}-{seed}")
    exercise = nbformat.read(course.root / unit.exercise, as_version=4)
    solution = nbformat.read(course.root / unit.solution, as_version=4)
    answers = _answer_cells(solution)
    code = [c.source for c in solution.cells if c.cell_type == "code"]
    available = _bound_names(code)
    load_unit(unit.id)
    mutants: list[tuple[str, str, str]] = []  # (answer cell grade id, code appended to it, bug id)
    for e in unit.exercises:
        cell = f"{e.grade_id}_answer"
        if cell not in answers:
            continue
        for b in BUGS.get(e.id, []):
            parts = [mutant_source(obj, name, available, code) for name, obj in b.impl.items()]  # one per name
            if parts and all(parts):
                mutants.append((cell, "\n\n".join(parts), b.id))
    stub_cells = [gid for gid in answers]
    kinds = rng.choices(KINDS, WEIGHTS, k=n)
    if n >= len(KINDS):  # every kind at least once
        kinds[:len(KINDS)] = list(KINDS)
        rng.shuffle(kinds)
    out: dict[str, str] = {}
    for i, kind in enumerate(kinds):
        student = f"student{i + 1:03d}"
        filled = dict(answers)
        broken_json = False
        if kind == "partly right":
            for gid in rng.sample(stub_cells, rng.randint(1, max(1, len(stub_cells) - 1))):
                filled[gid] = None  # the released stub
        elif kind == "wrong" and mutants:
            in_effect: dict[str, str] = {}  # two mutants of one cell: the later definition replaces the earlier
            for gid, extra, bug_id in rng.sample(mutants, min(len(mutants), rng.randint(1, 2))):
                filled[gid] = filled[gid] + "\n\n\n" + extra
                in_effect[gid] = bug_id
            if planted is not None:
                planted[student] = sorted(in_effect.values())
        elif kind == "wrong":
            kind = "partly right"
            filled[rng.choice(stub_cells)] = None
        elif kind == "broken":
            if rng.random() < 0.5:
                broken_json = True
            else:
                gid = rng.choice(stub_cells)
                filled[gid] = filled[gid].replace("):", ")", 1) if "):" in filled[gid] else "def (:\n"
        nb = copy.deepcopy(exercise)
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.metadata.get("nbgrader", {}).get("solution") and filled.get(gid) is not None:
                cell.source = filled[gid]
        folder = dest / student / unit.name
        folder.mkdir(parents=True)
        text = nbformat.writes(nb)
        if broken_json:
            text = text[:len(text) // 2]
        (folder / Path(unit.exercise).name).write_text(text, encoding="utf-8")
        out[student] = kind
    return out


def _tree_rss_kb(pid: int, cpu: dict | None = None) -> int:
    """Resident memory (KiB) of ``pid`` and its descendants; ``cpu``, if given, gets each one's CPU ticks so far
    (user + system, ``/proc/<pid>/stat``), the largest seen per process."""
    from grader.supervise import descendants

    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            with open(f"/proc/{p}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"VmRSS:"):
                        total += int(line.split()[1])
                        break
            if cpu is not None:
                with open(f"/proc/{p}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                cpu[p] = max(cpu.get(p, 0), int(fields[11]) + int(fields[12]))
        except (OSError, ValueError, IndexError):
            pass
    return total


class PeakRSS:
    """Peak resident memory (MiB) of this process and all its descendants, sampled in a thread; also their CPU time.

    ``cpu_seconds``: the CPU time of every process of the tree seen by a sample (a process's last ``every`` seconds
    before it ended are missed), less inflated by other load than the wall time: on an idle machine with N cores the
    run takes at least ``cpu_seconds / N`` seconds.
    """

    def __init__(self, every: float = 0.2):
        self.every, self.peak_kb = every, 0
        self._cpu: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, _tree_rss_kb(os.getpid(), self._cpu))
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def cpu_seconds(self) -> float:
        return sum(self._cpu.values()) / os.sysconf("SC_CLK_TCK")

    @property
    def peak_mib(self) -> float:
        return self.peak_kb / 1024


def kernel_start_seconds(unit, course) -> float:
    """Seconds to start the course's kernel, run the exercise's first code cell and shut it down."""
    import nbformat
    from jupyter_client.manager import start_new_kernel

    nb = nbformat.read(course.root / unit.exercise, as_version=4)
    first = next(c.source for c in nb.cells if c.cell_type == "code")
    started = time.perf_counter()
    km, kc = start_new_kernel(kernel_name=course.meta.get("kernel_name", "llmcourse"), cwd=str(course.root / Path(
        unit.exercise).parent))
    try:
        kc.execute_interactive(first, timeout=300, output_hook=lambda msg: None)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return time.perf_counter() - started


def _verdicts(work: Path, rows) -> dict:
    """``{(student, assignment): (score, per-exercise points)}`` plus each feedback notebook's verdict lines."""
    import nbformat

    out = {}
    for r in rows:
        path = work / ".grading" / "autograded" / r["student"] / r["assignment"]
        lines = []
        for nb_path in sorted(path.glob("*.ipynb")):
            nb = nbformat.read(nb_path, as_version=4)
            for c in nb.cells:
                if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"):
                    lines.append("".join(o.get("text", "") for o in c.get("outputs", [])))
        out[(r["student"], r["assignment"])] = (r["score"], dict(r["per_exercise"]), lines)
    return out


def _cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (``/proc/stat``: user, nice, system, irq, softirq, steal), or
    NaN where there is no ``/proc/stat``. Machine-wide: on an idle machine, the run's own use (the checkers'
    forkservers and workers are not children this process waits for, so its own rusage would miss them)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coursetools.bench.class_grading", description=__doc__.split("\n\n")[0])
    p.add_argument("unit", help="unit id, e.g. 03")
    p.add_argument("--students", type=int, default=60)
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--paths", nargs="+", choices=("saved", "executed"), default=["saved"],
                   help="saved: the notebooks as saved (course grade's default); executed: course grade --execute")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (course grade --timeout)")
    p.add_argument("--course", default=None, help="course root (default: this checkout)")
    p.add_argument("--no-kernel-probe", action="store_true", help="skip timing one kernel start")
    args = p.parse_args(argv)

    from coursetools.grading import grade
    from coursetools.report import write_report
    from llmcourse.manifest import load_course

    course = load_course(args.course) if args.course else load_course()
    unit = course.unit(args.unit)
    first = None
    with tempfile.TemporaryDirectory(prefix="llmcourse-class-") as tmp:
        submitted = Path(tmp) / "submitted"
        kinds = build_class(unit, args.students, submitted, seed=args.seed, course=course)
        counts = {k: sum(1 for v in kinds.values() if v == k) for k in KINDS}
        print(f"class of {len(kinds)} submissions of unit {unit.id} ({unit.name}), seed {args.seed}: "
              + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
        print(f"{os.cpu_count()} CPUs, load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        if not args.no_kernel_probe and "executed" in args.paths:
            print("one kernel start by the normal launch (the fork server's fallback) + the notebook's first cell: "
                  f"{kernel_start_seconds(unit, course):.1f} s", flush=True)
        for path, jobs in [(path, jobs) for path in args.paths for jobs in args.jobs]:
            work = Path(tmp) / f"work-{path}-jobs{jobs}"
            cpu_before = _cpu_seconds()
            with PeakRSS() as mem:
                started = time.perf_counter()
                report = grade(submitted, out_dir=work, cell_timeout=args.timeout, course=course, jobs=jobs,
                               progress=True, execute=path == "executed")
                wall = time.perf_counter() - started
            cpu, own = _cpu_seconds() - cpu_before, mem.cpu_seconds
            got = _verdicts(work, report.rows)
            first = first or got
            same = got == first
            scores = [r["score"] for r in report.rows]
            print(f"{path}, --jobs {jobs}: {wall:.1f} s total, {wall / len(report.rows):.2f} s per submission, peak "
                  f"RSS {mem.peak_mib:,.0f} MiB (process tree), mean score {sum(scores) / len(scores):.1f}/"
                  f"{report.rows[0]['max_score']:g}, same scores and verdicts as the first run: {same}", flush=True)
            print(report.phase_table(), flush=True)
            print(f"    CPU busy during the run (machine-wide): {cpu:,.0f} core-seconds, {cpu / wall:.2f} of "
                  f"{os.cpu_count()} cores on average", flush=True)
            print(f"    CPU time of the run's own processes (sampled every 0.2 s): {own:,.0f} core-seconds, "
                  f"{own / len(report.rows):.2f} per submission; idle with {os.cpu_count()} cores the run would take "
                  f"at least {own / os.cpu_count():,.0f} s", flush=True)
            started = time.perf_counter()
            written = write_report(work)  # the run wrote it already: this times it alone (`course report WORK`)
            print(f"    class report again (course report): {time.perf_counter() - started:.1f} s, report.html "
                  f"{written['html'].stat().st_size / 1024:,.0f} KiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
