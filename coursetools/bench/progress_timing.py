"""Timing of ``course progress``, cold and with the warm check server (a benchmark-style script: it prints
times, asserts nothing).

    python -m coursetools.bench.progress_timing [FOLDER] [--units 01,07] [--profile]

FOLDER holds filled-in exercise notebooks (``NN_slug/NN_slug.ipynb``); default: the course's ``solutions/``
(every unit filled in). With ``--units`` only those units' notebooks are copied to a temporary folder and
timed. Five runs, each ``course progress --json`` in a fresh process; the first three without the check-result
cache (``LLMCOURSE_CHECK_CACHE=0``), the last two with a private one (:mod:`coursetools.resultcache`):

1. cold: ``LLMCOURSE_CHECK_SERVER=0`` (every unit checked in that one process);
2. warm, first: no server running (the first unit starts it);
3. warm, again: the server is up and has served every unit once;
4. warm, filling the cache: as 3, and every report is stored (what each ``course check`` does);
5. warm, from the cache: every notebook unchanged since it was checked (a student who ran each check cell).

It prints the wall time of each and whether the reports agree (the same rows: points, counts and most common
mistake per unit). With ``--profile`` it also prints, per unit, the seconds of one ``course check`` answered by
the warm server (where an uncached progress spends its time). Timings depend on the machine and its load: report
them with both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _progress(folder: Path, env: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "coursetools", "progress", str(folder), "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"course progress failed ({r.returncode}): {r.stderr[-2000:]}")
    return seconds, json.loads(r.stdout)


def _rows(report: dict) -> list:
    keys = ("unit", "earned", "available", "passed", "failed", "not_attempted", "common_bug", "common_bug_count", "error")
    return [{k: row[k] for k in keys} for row in report["units"] if row["notebook"]]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    units = None
    profile = "--profile" in argv
    argv = [a for a in argv if a != "--profile"]
    if "--units" in argv:
        i = argv.index("--units")
        units = set(argv[i + 1].split(","))
        argv = argv[:i] + argv[i + 2:]
    folder = Path(argv[0]) if argv else ROOT / "solutions"
    with tempfile.TemporaryDirectory() as tmp:
        if units:
            (Path(tmp) / "notebooks").mkdir()
            for sub in sorted(folder.iterdir()):
                if sub.is_dir() and sub.name[:2] in units:
                    shutil.copytree(sub, Path(tmp) / "notebooks" / sub.name)
            folder = Path(tmp) / "notebooks"
        sockets = Path(tmp) / "sockets"  # a private server folder: other check servers of this user are left alone
        sockets.mkdir(mode=0o700)
        cache = Path(tmp) / "cache"
        cache.mkdir(mode=0o700)
        env = dict(os.environ, LLMCOURSE_CHECK_SERVER_DIR=str(sockets), LLMCOURSE_CHECK_CACHE="0")
        cold_s, cold = _progress(folder, dict(env, LLMCOURSE_CHECK_SERVER="0"))
        first_s, first = _progress(folder, dict(env, LLMCOURSE_CHECK_SERVER="1"))
        warm_s, warm = _progress(folder, dict(env, LLMCOURSE_CHECK_SERVER="1"))
        cached_env = dict(env, LLMCOURSE_CHECK_SERVER="1", LLMCOURSE_CHECK_CACHE=str(cache))
        fill_s, fill = _progress(folder, cached_env)
        cached_s, cached = _progress(folder, cached_env)
        n = len(_rows(cold))
        print(f"course progress over {n} filled-in units ({folder}), {os.cpu_count()} CPUs, load average "
              f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}:")
        print(f"  cold (no server, no cache)  {cold_s:7.1f} s")
        print(f"  warm server, first run      {first_s:7.1f} s  (starts the server)")
        print(f"  warm server, again          {warm_s:7.1f} s")
        print(f"  warm, filling the cache     {fill_s:7.1f} s")
        print(f"  warm, from the cache        {cached_s:7.1f} s  (every notebook checked since its last edit)")
        same = _rows(cold) == _rows(first) == _rows(warm) == _rows(fill) == _rows(cached)
        print(f"  identical results: {same}  (earned {cold['earned']}/{cold['available']})")
        if profile:
            print("  one warm `course check` per unit (where an uncached progress spends its time):")
            for row in cold["units"]:
                if not row["notebook"]:
                    continue
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "coursetools", "check", "--json", row["notebook"]], cwd=ROOT,
                               env=dict(env, LLMCOURSE_CHECK_SERVER="1"), capture_output=True, timeout=3600)
                print(f"    {row['unit']}  {time.perf_counter() - started:6.1f} s  ({row['exercises']} exercises)")
        subprocess.run([sys.executable, "-m", "coursetools", "check", "--stop-server"], cwd=ROOT, env=env,
                       capture_output=True, timeout=120)  # only the server of this run (its own folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
