"""Benchmarks behind ``course bench <name>``: one subcommand per benchmark.

Each benchmark module registers itself in :data:`BENCHMARKS` with a function that adds its options to an
``argparse`` parser and a function that runs it (returning the process exit code). Units add theirs by
writing ``coursetools/bench/<name>.py`` and listing it in :data:`MODULES`. Benchmarks are **not** tests:
they measure speed, which depends on the machine and on what else runs on it; measure on an idle machine.
Results are printed as a Markdown table and written, with a JSON copy, under ``test-artifacts/bench/``.

``make bench`` installs the peer implementations they compare against (``requirements-bench.txt``,
installed with ``--no-deps``) and runs every benchmark (each in its own process) with ``course bench all``
(:mod:`coursetools.bench.report`), which writes one report, ``test-artifacts/bench/report.md``.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["ALLOCATOR_ENV", "MODULES", "add_bench_parser", "artifacts_dir", "bench_optimizer", "interleaved_times",
           "write_outputs"]

# glibc malloc settings of every part that ``course bench all`` starts: no mmap for large blocks and no trimming, so a
# freed 200 MB logits buffer is reused by the next step instead of being unmapped and page-faulted in again (on the
# gpt2-vocab-6l train config that kernel work was ~30 % of a step and its run-to-run spread; measured here with 2
# threads: 1,250-1,474 ms per step and 19-21 s of system time per run by default, 955-1,045 ms and 2.3 s with these).
# The same for every implementation; other C libraries ignore them. Set them in the shell to reproduce a part alone.
ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(16 << 30), "MALLOC_TOP_PAD_": str(512 << 20)}

MODULES = {"train": "coursetools.bench.train", "decode": "coursetools.bench.decode",
           "capstone": "coursetools.bench.capstone", "all": "coursetools.bench.report"}  # name -> module with add_arguments(parser) and run(args) -> int


def artifacts_dir():
    """``<course>/test-artifacts/bench`` (created)."""
    from llmcourse.manifest import course_root

    out = course_root() / "test-artifacts" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    return out


def bench_optimizer(model, lr: float = 1e-4):
    """The AdamW of every training benchmark: :func:`llmcourse.train.optim.configure_optimizer`'s two groups (matrices
    decayed with its default weight decay, vectors not; the same lr, betas and eps) run by torch's **fused** AdamW
    kernel (``fused=True``: one pass over each group's tensors instead of ~10 tensor ops per parameter tensor).

    The same optimizer for every implementation; fused because the default for-loop AdamW costs a fixed time per
    parameter **tensor**, so it charges an implementation for how its weights are split (llmcourse's per-expert
    DeepSeek weights: 117 tensors, 8.8 ms per step, vs transformers' fused experts: 51 tensors, 5.4 ms; fused: 1.5 and
    1.0 ms), which is not the model's speed.
    """
    import torch

    from llmcourse.train.optim import configure_optimizer

    ref = configure_optimizer(model, lr)
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in ref.param_groups]
    return torch.optim.AdamW(groups, lr=lr, betas=ref.defaults["betas"], eps=ref.defaults["eps"], fused=True)


def interleaved_times(steps_fn: dict, rounds: int, steps: int, after_round=None) -> dict[str, list[float]]:
    """Time every implementation over ``rounds`` interleaved rounds of ``steps`` timed steps each: inside a round the
    implementations take turns **step by step** (the first one rotates from round to round), so a slower spell of a
    shared machine falls on all of them alike instead of on whichever block of steps it hit.

    ``steps_fn``: ``{name: fn}`` with ``fn()`` running one step and returning its seconds. ``after_round(r, times)``
    is called after round ``r`` (0-based). Returns ``{name: [seconds, …]}`` in the order run (``rounds·steps`` each).
    """
    order = list(steps_fn)
    times = {k: [] for k in order}
    for r in range(rounds):
        rotation = order[r % len(order):] + order[:r % len(order)]
        for _ in range(steps):
            for k in rotation:
                times[k].append(steps_fn[k]())
        if after_round is not None:
            after_round(r, times)
    return times


def write_outputs(name: str, results: dict, text: str, out=None, plot=None) -> None:
    """Write ``<name>.md`` (``text``), ``<name>.json`` (``results``) and, when ``plot`` is given, ``<name>.png``
    (``plot(results, path)``) into ``out`` (default :func:`artifacts_dir`), then print the table."""
    import json
    from pathlib import Path

    folder = Path(out) if out else artifacts_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(text + "\n", encoding="utf-8")
    (folder / f"{name}.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    if plot is not None:
        plot(results, folder / f"{name}.png")
    print()
    print(text)


def add_bench_parser(sub) -> None:
    """Add ``bench`` with one subcommand per entry of :data:`MODULES` to the ``course`` CLI's subparsers."""
    p = sub.add_parser("bench", help="speed benchmarks (e.g. `course bench train`); not tests",
                       description="Speed benchmarks against reference implementations. Measure on an idle machine.")
    bench_sub = p.add_subparsers(dest="benchmark", required=True)
    for name, module_name in MODULES.items():
        module = importlib.import_module(module_name)
        bp = bench_sub.add_parser(name, help=module.__doc__.strip().splitlines()[0],
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.add_arguments(bp)
        bp.set_defaults(func=module.run)
