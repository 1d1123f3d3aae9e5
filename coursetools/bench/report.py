"""Every benchmark and one Markdown report (``course bench all``; what ``make bench`` runs).

Runs ``course bench train`` (its defaults), ``course bench decode`` and ``course bench capstone`` (its defaults) one
after the other, each in a fresh Python process (no part inherits another's allocator, thread-pool or import state)
with glibc's large-block reuse settings :data:`coursetools.bench.ALLOCATOR_ENV` (the same for every implementation;
without them page faults on the fresh 200 MB logits buffers took ~30 % of a gpt2-vocab-6l step), each writing its
own files under ``test-artifacts/bench/``, then writes
``report.md``: the settings, each part's wall time, the three tables and the plots (``decode.png``,
``capstone.png``). The decode part keeps the median of ``--decode-repeats`` (3) runs for every cached row but runs
the uncached path ``--uncached-repeats`` (1) time(s) (at batch 1 that single full run is also the token reference;
at batch 8 each of the ``--uncached-samples`` lengths is timed once): the uncached batch-1 run alone takes about
90 s on an idle 2-core machine, and the issue-10 protocol (``course bench decode`` without options, median of 3
everywhere) takes over 15 minutes. The last line of the report and of the output is
``bench: train X.XX, decode X.X/Y.YY, capstone Z.ZZ``: train = the train benchmark's geomean ratio vs
transformers, decode = the minimum cached speedup over uncached / the minimum ratio vs transformers, capstone =
the capstone ratio vs transformers. Exit code: that of the first part that failed (every part still runs), else 0.
``--smoke`` runs every part on tiny sizes (format test only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

__all__ = ["PARTS", "add_arguments", "part_arguments", "run", "summary_line"]

PARTS = ("train", "decode", "capstone")
SMOKE = {"train": ["--configs", "gpt2-char-tiny", "--threads", "1", "--rounds", "1", "--steps", "1", "--warmup", "0"],
         "decode": ["--config", "tiny", "--batch-sizes", "1", "2", "--prompt-len", "4", "--new-tokens", "4",
                    "--repeats", "1", "--uncached-repeats", "1", "--uncached-samples", "2"],
         "capstone": ["--config", "smoke", "--batch-size", "4", "--seq-len", "8", "--rounds", "1", "--steps", "1",
                      "--warmup", "1", "--new-tokens", "3"]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decode-repeats", type=int, default=3, help="decode: runs per cached implementation (median)")
    p.add_argument("--uncached-repeats", type=int, default=1, help="decode: runs of the uncached path")
    p.add_argument("--uncached-samples", type=int, default=5, help="decode: sampled lengths of the uncached B>1 time")
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="run only these parts")
    p.add_argument("--smoke", action="store_true", help="tiny sizes everywhere (format test; no timing claims)")
    p.add_argument("--out", default=None, help="folder for every file (default test-artifacts/bench)")


def part_arguments(part: str, args) -> list[str]:
    """The command-line arguments the report passes to ``course bench <part>``."""
    if args.smoke:
        argv = list(SMOKE[part])
    elif part == "decode":
        argv = ["--repeats", str(args.decode_repeats), "--uncached-repeats", str(args.uncached_repeats),
                "--uncached-samples", str(args.uncached_samples)]
    else:
        argv = []
    return argv


def summary_line(train: dict | None, decode: dict | None, capstone: dict | None) -> str:
    def num(d, key, fmt):
        return format(d[key], fmt) if d else "nan"

    return (f"bench: train {num(train, 'geomean_ratio', '.2f')}, decode {num(decode, 'min_speedup', '.1f')}/"
            f"{num(decode, 'min_ratio', '.2f')}, capstone {num(capstone, 'ratio', '.2f')}")


def _run_part(part: str, argv: list[str], out: Path) -> tuple[int, float]:
    """Run ``course bench <part> <argv> --out <out>`` in a fresh Python process (its output goes straight to ours);
    returns its exit code and wall time."""
    import os
    import subprocess
    import sys

    from llmcourse.manifest import course_root

    from . import ALLOCATOR_ENV

    print(f"\n===== course bench {part} {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    try:
        code = subprocess.run([sys.executable, "-m", "coursetools", "bench", part, *argv, "--out", str(out)],
                              cwd=course_root(), env={**os.environ, **ALLOCATOR_ENV}, check=False).returncode
    except OSError as err:   # one failing part must not stop the others
        print(f"course bench {part}: {type(err).__name__}: {err}")
        code = 1
    return code, time.perf_counter() - t0


def run(args) -> int:
    """``course bench all``."""
    from . import artifacts_dir
    from .train import _environment

    out = Path(args.out) if args.out else artifacts_dir()
    out.mkdir(parents=True, exist_ok=True)
    files = {"train": "train.json", "decode": "decode.json", "capstone": "capstone.json"}
    for part in args.only:                      # never report a stale result of an earlier run
        with contextlib.suppress(FileNotFoundError):
            (out / files[part]).unlink()
    codes, walls, argvs = {}, {}, {}
    t_all = time.perf_counter()
    for part in args.only:
        argvs[part] = part_arguments(part, args)
        codes[part], walls[part] = _run_part(part, argvs[part], out)
    total = time.perf_counter() - t_all
    results = {}
    for part in PARTS:
        path = out / files[part]
        results[part] = json.loads(path.read_text()) if part in args.only and path.exists() else None
    line = summary_line(results["train"], results["decode"], results["capstone"])

    env = _environment()
    lines = ["# Benchmarks", "",
             f"torch {env['torch']}, transformers {env['transformers']}, llms-from-scratch {env['llms_from_scratch']}, "
             f"Python {env['python']}; {env['cpu_count']} CPUs ({env['machine']}). Speed depends on the machine and "
             "on what else runs on it: these numbers mean something only on an otherwise idle machine.", "",
             "| part | command | exit code | wall time |", "|---|---|---:|---:|"]
    for part in args.only:
        command = " ".join(["course bench", part, *argvs[part]])
        lines.append(f"| {part} | `{command}` | {codes[part]} | {walls[part] / 60:.1f} min ({walls[part]:.0f} s) |")
    lines += [f"| all | | | {total / 60:.1f} min ({total:.0f} s) |", ""]
    if "decode" in args.only and not args.smoke:
        lines += [f"Decode settings: cached rows are the median of {args.decode_repeats} runs; the uncached path runs "
                  f"{args.uncached_repeats} time(s) (batch 1: one full run, also the token reference; batch 8: "
                  f"{args.uncached_samples} sampled lengths). `course bench decode` without options runs the full "
                  "protocol (median of 3 everywhere).", ""]
    titles = {"train": "Training step: GPT-2 (`course bench train`)",
              "decode": "Greedy decoding with a KV cache (`course bench decode`)",
              "capstone": "Capstone: DeepSeek-tiny training step and cache bytes (`course bench capstone`)"}
    for part in args.only:
        lines += [f"## {titles[part]}", ""]
        md = out / f"{part}.md"
        if codes[part] == 0 and md.exists():   # the part's own headings one level down
            text = md.read_text(encoding="utf-8").strip()
            lines += ["#" + line if line.startswith("#") else line for line in text.splitlines()] + [""]
            png = out / f"{part}.png"
            if png.exists():
                lines += [f"![{part}]({png.name})", ""]
        else:
            lines += [f"**Failed** (exit code {codes[part]}): see the command's output.", ""]
    lines.append(line)
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"\nreport: {out / 'report.md'} ({total / 60:.1f} min)")
    print(line)
    failed = [codes[p] for p in args.only if codes[p] != 0]
    return failed[0] if failed else 0
