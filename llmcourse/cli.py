"""The ``course`` command (also ``python -m llmcourse``).

  course doctor            [OK]/[FAIL] per requirement; exit 1 on a failure
  course list              units and exercises from course.toml, with availability
  course check NOTEBOOK    self-check an exercise notebook: passed / failed (+ diagnosis) / not attempted
  course release [--check] [--force] [UNIT ...]
                           regenerate exercises/ from solutions/ through nbgrader
  course grade DIR [--out OUT] [--timeout S] [--roster CSV]
                           autograde nbgrader-style submissions, write feedback HTML and grades.csv
  course map               print the course map (Markdown), as in README.md

Exit codes: 0 success; 1 a check/validation failed; 2 bad usage (wrong path, unknown notebook).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _course():
    from .manifest import load_course

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
    from .data import DATASETS, DataNotFoundError, data_path
    from .data.resolve import MIRROR_ENV

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
        from .data import gpt2_encoding

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
    from grader.worker import start_forkserver

    start_forkserver()  # the learner processes' parent preloads torch while this process reads the notebook
    from grader.runner import check_notebook

    try:
        unit, verdicts = check_notebook(args.notebook)
    except (FileNotFoundError, ValueError) as exc:
        print(f"course check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"Unit {unit.id} {unit.title}: {args.notebook}\n")
    problems = list(dict.fromkeys(n for v in verdicts for n in v.notes))
    if problems:
        print("Problems while loading your notebook (only imports, functions and classes are loaded):")
        print("\n".join(f"  - {p}" for p in problems) + "\n")
    for v in verdicts:
        print(v.render(notes=False))
        print()
    earned = sum(v.points for v in verdicts)
    total = sum(v.max_points for v in verdicts)
    counts = {s: sum(1 for v in verdicts if v.status == s) for s in ("passed", "failed", "not_attempted")}
    other = len(verdicts) - sum(counts.values())
    print(f"{counts['passed']} passed, {counts['failed'] + other} failed, {counts['not_attempted']} not attempted "
          f"— {earned}/{total} points")
    return EXIT_OK if all(v.passed for v in verdicts) else EXIT_FAIL


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
    from .grading import grade

    try:
        report = grade(args.dir, out_dir=args.out, cell_timeout=args.timeout, roster=args.roster)
    except (FileNotFoundError, ValueError) as exc:
        print(f"course grade: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report.render())
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course", description="LLMs from scratch: course tools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check the installation, kernel, data and tokenizer").set_defaults(func=cmd_doctor)
    sub.add_parser("list", help="units and exercises").set_defaults(func=cmd_list)
    sub.add_parser("map", help="the course map as Markdown").set_defaults(func=cmd_map)
    p = sub.add_parser("check", help="self-check an exercise notebook")
    p.add_argument("notebook")
    p.set_defaults(func=cmd_check)
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
    p.set_defaults(func=cmd_grade)
    from .bench import add_bench_parser  # `course bench <name>`: speed benchmarks (llmcourse/bench/)

    add_bench_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
