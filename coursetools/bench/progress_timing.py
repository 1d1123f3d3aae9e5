"""Timing of ``course progress``, cold and with the warm check server (a benchmark-style script: it prints
times, asserts nothing).

    python -m coursetools.bench.progress_timing [FOLDER] [--units 01,07]

FOLDER holds filled-in exercise notebooks (``NN_slug/NN_slug.ipynb``); default: the course's ``solutions/``
(every unit filled in). With ``--units`` only those units' notebooks are copied to a temporary folder and
timed. Three runs, each ``course progress --json`` in a fresh process:

1. cold: ``LLMCOURSE_CHECK_SERVER=0`` (every unit checked in that one process);
2. warm, first: no server running (the first unit starts it);
3. warm, again: the server is up and has served every unit once.

It prints the wall time of each and whether the three reports agree (the same rows: points, counts and
most common mistake per unit). Timings depend on the machine and its load: report them with both.
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
        env = dict(os.environ, LLMCOURSE_CHECK_SERVER_DIR=str(sockets))
        cold_s, cold = _progress(folder, dict(env, LLMCOURSE_CHECK_SERVER="0"))
        first_s, first = _progress(folder, dict(env, LLMCOURSE_CHECK_SERVER="1"))
        warm_s, warm = _progress(folder, dict(env, LLMCOURSE_CHECK_SERVER="1"))
        n = len(_rows(cold))
        print(f"course progress over {n} filled-in units ({folder}), {os.cpu_count()} CPUs:")
        print(f"  cold (no server)            {cold_s:7.1f} s")
        print(f"  warm server, first run      {first_s:7.1f} s  (starts the server)")
        print(f"  warm server, again          {warm_s:7.1f} s")
        same = _rows(cold) == _rows(first) == _rows(warm)
        print(f"  identical results: {same}  (earned {cold['earned']}/{cold['available']})")
        subprocess.run([sys.executable, "-m", "coursetools", "check", "--stop-server"], cwd=ROOT, env=env,
                       capture_output=True, timeout=120)  # only the server of this run (its own folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
