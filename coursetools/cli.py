"""The ``course`` command (also ``python -m coursetools``; ``python -m llmcourse`` is an alias).

  course doctor            [OK]/[FAIL] per requirement; exit 1 on a failure
  course list              units and exercises from course.toml, with availability
  course check [--json] NOTEBOOK
                           self-check an exercise notebook: passed / failed (+ diagnosis) / not attempted
                           (answered by a warm per-user check server when it can: coursetools/checkserver.py)
  course check --stop-server
                           stop this user's warm check servers
  course progress [FOLDER] [--json]
                           points, passed / failed / not attempted and the most common bug per unit
                           over a folder of exercise notebooks (default exercises/)
  course release [--check] [--force] [UNIT ...]
                           regenerate exercises/ from solutions/ through nbgrader
  course grade DIR [--out OUT] [--timeout S] [--roster CSV] [--jobs N] [--execute] [--profile P] [--quiet]
                           autograde nbgrader-style submissions, write feedback HTML, grades.csv and the report
  course report [GRADING_DIR]
                           the class report of a grading run: report.html (offline) + JSON/CSV (coursetools/report.py)
  course exchange release|collect|feedback UNIT --root EXCHANGE [--into CLASS] [--work WORK]
                           nbgrader's exchange around course grade (coursetools/exchange.py)
  course hub [--port 8000]  a local JupyterHub on 127.0.0.1 with test users: `make hub` (coursetools/hub.py)
  course map               print the course map (Markdown), as in README.md

Exit codes: 0 success; 1 a check/validation failed; 2 bad usage (wrong path, unknown notebook).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import sys
from pathlib import Path

from .checking import (  # noqa: F401
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    check_command,
    check_report,
    render_check_report,
    verdict_record,
)


def _course():
    from llmcourse.manifest import load_course

    return load_course()


# ------------------------------------------------------------------------------------------ doctor


def _requirements(root: Path) -> list[tuple[str, str]]:
    pins = []
    for line in (root / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins.append((name.strip(), version.strip()))
    return pins


def cmd_doctor(args) -> int:
    import platform

    results: list[tuple[bool, str]] = []

    def report(ok: bool, text: str):
        results.append((ok, text))
        print(f"[{'OK' if ok else 'FAIL'}] {text}")

    report(sys.version_info[:2] == (3, 11), f"Python {platform.python_version()} (course pins 3.11)")
    try:
        course = _course()
        report(True, f"course.toml: {len(course.units)} units, {len(course.available_units)} available")
    except Exception as exc:
        report(False, f"course.toml: {exc}")
        return EXIT_FAIL
    for name, version in _requirements(course.root):
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            report(False, f"{name}=={version}: not installed (run `make lab` or `pip install -r requirements.txt`)")
            continue
        ok = have.split("+", 1)[0] == version
        report(ok, f"{name}=={version}" + ("" if ok else f": installed {have}"))
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        specs = KernelSpecManager().find_kernel_specs()
        kname = course.meta.get("kernel_name", "llmcourse")
        report(kname in specs, f"Jupyter kernel '{kname}'" + ("" if kname in specs else ": not registered (`make lab`)"))
    except Exception as exc:
        report(False, f"Jupyter kernels: {exc}")
    from llmcourse.data import DATASETS, DataNotFoundError, data_path
    from llmcourse.data.resolve import MIRROR_ENV

    mirror = os.environ.get(MIRROR_ENV)
    print(f"       data mirror {MIRROR_ENV}={mirror or '(unset)'}")
    for ds in DATASETS.values():
        for f in ds.files:
            try:
                p = data_path(ds.id, f.path, download=False)
                report(True, f"data {ds.id}: {f.path} ({p.parent})")
            except DataNotFoundError:
                report(False, f"data {ds.id}: {f.path} not found offline (set {MIRROR_ENV}, or run once online)")
    try:
        from llmcourse.data import gpt2_encoding

        enc = gpt2_encoding()
        ids = enc.encode("Hello, world")
        ok = ids == [15496, 11, 995] and enc.n_vocab == 50257
        report(ok, f"GPT-2 tokenizer offline: 'Hello, world' -> {ids}, n_vocab {enc.n_vocab}")
    except Exception as exc:
        report(False, f"GPT-2 tokenizer offline: {exc}")
    failed = sum(1 for ok, _ in results if not ok)
    print(f"{len(results) - failed} OK, {failed} FAIL")
    return EXIT_FAIL if failed else EXIT_OK


# ------------------------------------------------------------------------------------------ list / map


def cmd_list(args) -> int:
    course = _course()
    print(course.meta["title"])
    for u in course.units:
        mark = "available" if u.available else "not yet available"
        print(f"\n{u.id} {u.slug} — {u.title} [{mark}] ({u.points} points; ci {u.minutes.get('ci')} / "
              f"laptop {u.minutes.get('laptop')} min)")
        if u.available:
            print(f"   lesson:   {u.lesson}\n   exercise: {u.exercise}")
        for e in u.exercises:
            print(f"   - {e.id} ({e.points} pts)")
    return EXIT_OK


def cmd_map(args) -> int:
    from .dev.nbbuild import course_map_markdown

    print(course_map_markdown(_course()))
    return EXIT_OK


# ------------------------------------------------------------------------------------------ check


def cmd_check(args) -> int:
    from .checkserver import client_check, client_warm, stop_servers

    if args.warm and args.notebook is None:
        pid = client_warm()
        print(f"check server ready (pid {pid})" if pid else "no check server (switched off or could not start)")
        return EXIT_OK
    if args.stop_server:
        n = stop_servers()
        print(f"stopped {n} check server{'s' if n != 1 else ''}")
        if args.notebook is None:
            return EXIT_OK
    if args.notebook is None:
        print("course check: give a notebook (or --stop-server)", file=sys.stderr)
        return EXIT_USAGE
    # a warm check server answers when it can (coursetools/checkserver.py; LLMCOURSE_CHECK_SERVER=0: never)
    answer = client_check(args.notebook, args.json)
    if answer is not None:
        out, err, code = answer
        sys.stdout.write(out)
        sys.stderr.write(err)
        sys.stdout.flush()
        return code
    return check_command(args.notebook, args.json, server=_cache_server_key())


def _cache_server_key() -> str | None:
    """The check server key that check results are stored under (:mod:`coursetools.resultcache`), or None when the
    cache is off or the key cannot be computed (nothing is stored or reused then)."""
    from .resultcache import cache_dir

    if cache_dir() is None:
        return None
    try:
        from .checkserver import server_key

        return server_key()["key"]
    except Exception:  # noqa: BLE001 - the cache is best effort
        return None


def find_unit_notebook(folder: Path, unit) -> Path | None:
    """The exercise notebook of ``unit`` in a student's folder: ``NN_slug/NN_slug.ipynb`` or ``NN_slug.ipynb``."""
    name = Path(unit.exercise).name
    for candidate in (folder / Path(unit.exercise).parent.name / name, folder / name):
        if candidate.is_file():
            return candidate
    return None


def _progress_from_servers(todo: list[tuple[str, str]]) -> dict:
    """``{unit id: (stdout, stderr, code)}``: the warm check servers' ``course check --json`` answers for ``todo``
    (``(unit id, notebook path)``, in course order), several servers at once
    (:func:`coursetools.checkserver.progress_slots`); a unit no server answered is left out (checked here)."""
    import queue
    import threading

    from .checkserver import client_check, progress_slots

    # the later units' checks take longest: they go first, so that the servers finish together
    pending: queue.Queue = queue.Queue()
    for item in reversed(todo):
        pending.put(item)
    answered: dict = {}

    def serve(slot: int) -> None:
        while True:
            try:
                unit_id, path = pending.get_nowait()
            except queue.Empty:
                return
            answer = client_check(path, True, slot=slot)
            if answer is not None:
                answered[unit_id] = answer

    threads = [threading.Thread(target=serve, args=(slot,), daemon=True) for slot in range(progress_slots(len(todo)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answered


def progress_report(folder: Path, course=None, warm: bool = False) -> dict:
    """``course progress``: every available unit's notebook in ``folder``, checked in this one process (one
    forkserver for all of them), or with ``warm`` by this user's warm check server where it answers (the same
    ``course check --json`` report; a unit it does not answer is checked here). Same rows either way."""
    import json
    from collections import Counter

    from llmcourse.selfcheck import bug_name  # grader.core's, without torch: a cached progress imports none

    from .resultcache import load, result_key, store

    server = _cache_server_key()  # reports `course check` stored for notebooks unchanged since (resultcache)

    course = course or _course()
    found = []  # (unit, notebook or None, cache key, cached report or None)
    for unit in course.available_units:
        if not unit.exercises:
            continue
        path = find_unit_notebook(folder, unit)
        key = result_key(path, unit, server, course.root) if path is not None and server is not None else None
        cached = load(key)
        found.append((unit, path, key, cached["report"] if cached is not None else None))
    todo = [(unit.id, str(path)) for unit, path, _, rep in found if path is not None and rep is None]
    answered = _progress_from_servers(todo) if warm and todo else {}
    rows = []
    for unit, path, key, rep in found:
        row = {"unit": unit.id, "title": unit.title, "notebook": None, "earned": 0,
               "available": sum(e.points for e in unit.exercises), "passed": 0, "failed": 0,
               "not_attempted": len(unit.exercises), "exercises": len(unit.exercises), "common_bug": None,
               "common_bug_count": 0, "error": None}
        if path is None:
            row["error"] = "no notebook"
            rows.append(row)
            continue
        row["notebook"] = str(path)
        if rep is None and unit.id in answered:
            try:
                rep = json.loads(answered[unit.id][0])
            except ValueError:
                rep = None
        if rep is None:
            from grader.runner import check_notebook

            try:
                checked_unit, verdicts = check_notebook(path)
                rep = check_report(unit, verdicts, str(path))
                if checked_unit.id == unit.id:
                    store(key, rep)
            except (FileNotFoundError, ValueError) as exc:
                rep = {"error": str(exc)}
        if "error" in rep:
            row["error"] = rep["error"]
            rows.append(row)
            continue
        row.update(earned=rep["earned"], available=rep["total"], passed=rep["counts"]["passed"],
                   failed=rep["counts"]["failed"], not_attempted=rep["counts"]["not_attempted"])
        bugs = Counter(bug_name(v["bug_id"]) for v in rep["verdicts"] if v["bug_id"])  # the name, never the id
        if bugs:
            row["common_bug"], row["common_bug_count"] = bugs.most_common(1)[0]
        rows.append(row)
    return {"folder": str(folder), "units": rows, "earned": sum(r["earned"] for r in rows),
            "available": sum(r["available"] for r in rows)}


def render_progress(report: dict) -> str:
    head = ["Unit", "Title", "Points", "Passed", "Failed", "Not attempted", "Most common bug"]
    body = []
    for r in report["units"]:
        if r["error"]:
            body.append([r["unit"], r["title"], f"0/{r['available']}", "-", "-", "-", r["error"]])
            continue
        bug = f"{r['common_bug']} (x{r['common_bug_count']})" if r["common_bug"] else "-"
        body.append([r["unit"], r["title"], f"{r['earned']}/{r['available']}", str(r["passed"]), str(r["failed"]),
                     str(r["not_attempted"]), bug])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [f"Progress in {report['folder']}", "", line(head), line(["-" * w for w in widths])]
    out += [line(r) for r in body]
    out += ["", f"Total: {report['earned']}/{report['available']} points"]
    return "\n".join(out)


def cmd_progress(args) -> int:
    import json

    folder = Path(args.folder) if args.folder else _course().root / "exercises"
    if not folder.is_dir():
        print(f"course progress: not a folder: {folder}", file=sys.stderr)
        return EXIT_USAGE
    warm = os.environ.get("LLMCOURSE_CHECK_SERVER", "1") != "0"
    if not warm:
        from grader.forkserver import start_forkserver

        start_forkserver()
    report = progress_report(folder, warm=warm)
    print(json.dumps(report, indent=1) if args.json else render_progress(report))
    return EXIT_OK


# ------------------------------------------------------------------------------------------ release / grade


def cmd_release(args) -> int:
    from .grading import release

    course = _course()
    try:
        unit_ids = [course.unit(u).id for u in args.units] if args.units else None
    except KeyError as exc:
        print(f"course release: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    result = release(check=args.check, force=args.force, unit_ids=unit_ids, course=course)
    for rel in result.written:
        print(f"released {rel}")
    for rel in result.stale:
        print(f"stale: {rel}")
    for rel in result.refused:
        print(f"refused: {rel} was edited since it was released (a student's work?). Nothing was overwritten.\n"
              f"  Keep the work: copy it elsewhere (e.g. cp {rel} {Path(rel).with_suffix('.mine.ipynb')}),\n"
              f"  then re-run `course release`; or overwrite it deliberately with `course release --force`.")
    if args.check:
        print("exercises are up to date" if not result.stale else "exercises are stale: run `course release`")
    elif not result.written and not result.refused:
        print("exercises are up to date")
    return EXIT_OK if result.ok else EXIT_FAIL


def cmd_grade(args) -> int:
    from .grading import GradingTampered, grade

    try:
        report = grade(args.dir, out_dir=args.out, cell_timeout=args.timeout, roster=args.roster, jobs=args.jobs,
                       progress=not args.quiet, profile=args.profile or None, execute=args.execute)
    except (FileNotFoundError, ValueError) as exc:
        print(f"course grade: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GradingTampered as exc:  # the grading itself could not go on: one line, no traceback
        print(f"course grade: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print(report.render())
    return EXIT_OK


def cmd_report(args) -> int:
    from .report import write_report

    work = Path(args.dir) if args.dir else Path(".grading") / "run"
    try:
        paths = write_report(work)
    except FileNotFoundError as exc:
        print(f"course report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"report: {paths['html']}")
    print(f"data: {paths['json']}, {paths['exercises'].name}, {paths['mistakes'].name}, {paths['students'].name}")
    return EXIT_OK


def cmd_exchange(args) -> int:
    from . import exchange

    try:
        if args.action == "release":
            print(f"released: {exchange.release(args.unit, args.root)}")
        elif args.action == "collect":
            if not args.into:
                print("course exchange collect: give --into FOLDER (the class folder)", file=sys.stderr)
                return EXIT_USAGE
            print(f"collected into {exchange.collect(args.unit, args.root, args.into)}: "
                  f"grade it with `course grade <that folder> --out WORK`")
        else:
            if not args.work:
                print("course exchange feedback: give --work WORK (the folder `course grade --out` wrote)",
                      file=sys.stderr)
                return EXIT_USAGE
            files = exchange.release_feedback(args.unit, args.root, args.work)
            print(f"released feedback for {len(files)} submission{'s' if len(files) != 1 else ''}")
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"course exchange {args.action}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except exchange.ExchangeError as exc:
        print(f"course exchange {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def cmd_hub(args) -> int:
    from .hub import main as hub_main

    return hub_main(port=args.port, state=args.state, units=tuple(args.release))


def _skip_slow_iri_validator() -> None:
    """Keep jsonschema from importing ``rfc3987_syntax`` in this process.

    nbformat imports jsonschema, whose format module imports ``rfc3987_syntax`` when it is installed (it is, as
    ``jsonschema[format-nongpl]`` of the Jupyter stack); that package compiles about 40 Lark grammars at import,
    2.4 s of CPU here (upstream: python-jsonschema/jsonschema#1428), only to validate the "iri" formats, which no
    notebook schema uses. Blocking the import leaves notebook validation unchanged.
    """
    sys.modules.setdefault("rfc3987_syntax", None)  # None in sys.modules: `import rfc3987_syntax` raises ImportError


def cmd_lab(args) -> int:
    """JupyterLab with the course's settings: for a conda environment, where `make lab` is not used."""
    import subprocess

    from .labconfig import lab_command

    return subprocess.call(lab_command(args.instructor))


def main(argv: list[str] | None = None) -> int:
    _skip_slow_iri_validator()
    parser = argparse.ArgumentParser(prog="course", description="LLMs from scratch: course tools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check the installation, kernel, data and tokenizer").set_defaults(func=cmd_doctor)
    sub.add_parser("list", help="units and exercises").set_defaults(func=cmd_list)
    sub.add_parser("map", help="the course map as Markdown").set_defaults(func=cmd_map)
    p = sub.add_parser("lab", help="start JupyterLab as `make lab` does (student tools; `course` in its terminal)")
    p.add_argument("--instructor", action="store_true", help="with nbgrader's instructor tools")
    p.set_defaults(func=cmd_lab)
    p = sub.add_parser("check", help="self-check an exercise notebook")
    p.add_argument("notebook", nargs="?", default=None)
    p.add_argument("--json", action="store_true", help="the same verdicts as JSON (for tools and llmcourse.check())")
    p.add_argument("--stop-server", action="store_true",
                   help="stop this user's warm check servers (see LLMCOURSE_CHECK_SERVER in the README)")
    p.add_argument("--warm", action="store_true",
                   help="start this user's check server if needed and reset its idle timer; checks nothing")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("progress", help="points per unit over a folder of exercise notebooks")
    p.add_argument("folder", nargs="?", default=None, help="default: the course's exercises/")
    p.add_argument("--json", action="store_true", help="the table as JSON")
    p.set_defaults(func=cmd_progress)
    p = sub.add_parser("release", help="regenerate exercises/ from solutions/ (nbgrader)")
    p.add_argument("units", nargs="*", help="unit ids (default: every available unit)")
    p.add_argument("--check", action="store_true", help="only report stale exercises; exit 1 if any")
    p.add_argument("--force", action="store_true", help="overwrite exercise notebooks edited in place")
    p.set_defaults(func=cmd_release)
    p = sub.add_parser("grade", help="autograde submissions (nbgrader submitted/<student>/<assignment>/ layout)")
    p.add_argument("dir")
    p.add_argument("--out", default=None, help="work folder (default .grading/run); recreated")
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default 600)")
    p.add_argument("--roster", default=None, help="nbgrader student-import CSV (id,first_name,last_name,email): "
                   "names in the gradebook")
    p.add_argument("--jobs", type=int, default=1, help="grade in N parallel jobs (checkers and nbgrader runs; the same "
                   "scores as one job; each job needs about one core and the memory of one checker and one kernel)")
    p.add_argument("--profile", default="ci", help="run-time profile of the kernels nbgrader runs the notebooks in "
                   "(default ci, the smallest: their training cells are feedback only, never a score; '' for "
                   "$LLMCOURSE_PROFILE)")
    p.add_argument("--execute", action="store_true", help="also run every notebook top to bottom in a fresh kernel "
                   "in nbgrader (after the checks) and show those outputs in the feedback; default: the notebooks as "
                   "saved, nothing re-run (the same scores, verdicts and notes, minutes sooner)")
    p.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    p.set_defaults(func=cmd_grade)
    p = sub.add_parser("report", help="the class report of a grading run (HTML + JSON/CSV; also written by grade)")
    p.add_argument("dir", nargs="?", default=None, help="the work folder of `course grade` (default .grading/run)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("exchange", help="nbgrader's exchange: release a unit, collect submissions, return feedback")
    p.add_argument("action", choices=["release", "collect", "feedback"])
    p.add_argument("unit", help="unit id, e.g. 03")
    p.add_argument("--root", default=os.environ.get("LLMCOURSE_EXCHANGE_ROOT") or "/srv/nbgrader/exchange",
                   help="the exchange folder (default: $LLMCOURSE_EXCHANGE_ROOT, set in `make hub`'s terminals, "
                        "else nbgrader's /srv/nbgrader/exchange)")
    p.add_argument("--into", default=None, help="collect: the class folder (submissions go to .grading/submitted)")
    p.add_argument("--work", default=None, help="feedback: the work folder `course grade --out` wrote")
    p.set_defaults(func=cmd_exchange)
    p = sub.add_parser("hub", help="a local JupyterHub on 127.0.0.1 with test users (`make hub`; coursetools/hub.py)")
    p.add_argument("--port", type=int, default=8000, help="the hub's port on 127.0.0.1 (default 8000)")
    p.add_argument("--state", default=None, help="the hub's state folder (default: .hub/ in the checkout)")
    p.add_argument("--release", nargs="*", default=["03"], metavar="UNIT",
                   help="units to release into the hub's exchange at start (default: 03)")
    p.set_defaults(func=cmd_hub)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] not in (["check"], ["progress"]):  # the bench modules import torch: these clients must stay cheap
        from .bench import add_bench_parser  # `course bench <name>`: speed benchmarks (coursetools/bench/)

        add_bench_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
