"""Time to quality: validation loss against wall time for nanoGPT's CPU recipe and unit 10's laptop recipe.

    python -m coursetools.bench.time_to_quality [--budgets 1 2 3 5 10] [--threads 2] [--out FOLDER]

A script, not a test: it prints, for every budget of minutes, the validation loss each recipe stands at after
that many minutes of training on the machine it runs on, and which one is ahead.

Both recipes train the course's ``gpt2-char-tiny`` (:class:`llmcourse.models.gpt2.GPT2Model`: 4 layers, width 128,
4 heads, biases, dropout 0) on tinyshakespeare characters (the first 90 % of the file), with the course's AdamW
groups (:func:`llmcourse.train.optim.configure_optimizer`: matrices decayed by 0.1, vectors not), clipping at 1.0
and the course's warm-up + cosine (:func:`llmcourse.train.schedules.warmup_cosine_lr`). What differs is the
recipe's numbers:

* ``nanoGPT``: the published CPU settings of nanoGPT's character-level Shakespeare example (batch 12 × 64, 2,000
  steps, lr 1e-3 warmed up over 100 steps and decayed to 1e-4 at step 2,000, Adam betas (0.9, 0.99)). The run
  has a fixed length: after its 2,000 steps it stays at its final loss whatever the budget.
* ``course``: :func:`llmcourse.train.pretraining.budget_recipe`, the laptop recipe of unit 10, whose schedule is
  tied to the budget: it trains ``minutes · 60 / (ms per step)`` steps and its cosine ends at the last one. One
  run per budget.

Method (wall time on a shared machine is unreliable; this survives load): the validation loss against the
**step** is deterministic (seeded batches and initial weights), so each run records its curve by step; the
**milliseconds per step** of every recipe are measured interleaved in one process (:func:`interleaved_times`:
the recipes alternate step by step, medians), so a busy spell falls on all of them alike. Loss against wall time
is the step curve composed with ``step × ms/step``. Evaluation time is not counted (both recipes are scored
alike): 20 fixed validation batches of 32 windows of 64 characters (the context both recipes can read), the
same windows for every run.

Cost on an idle 2-core CPU: the nanoGPT run (2,000 steps) plus one course run per budget (its minutes),
i.e. about 55 minutes for the default budgets 1–10; ``--budgets`` picks fewer.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass, replace

__all__ = ["NANOGPT", "Recipe", "loss_at", "main", "measure_ms_per_step", "run_curve", "wall_curve"]

EVAL_BATCHES, EVAL_BATCH, EVAL_CONTEXT = 20, 32, 64


@dataclass(frozen=True)
class Recipe:
    """The numbers of a training recipe (the model is always ``gpt2-char-tiny``)."""

    name: str
    batch_size: int
    context_length: int
    steps: int
    max_lr: float
    min_lr: float
    warmup_steps: int
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    max_norm: float = 1.0


# nanoGPT's README, "quick start", CPU: train_shakespeare_char config (lr 1e-3, min_lr 1e-4, warmup 100, beta2 0.99,
# weight decay 0.1, clip 1.0) with --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
# --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0
NANOGPT = Recipe("nanoGPT", 12, 64, 2000, 1e-3, 1e-4, 100, betas=(0.9, 0.99))


def _model(context_length: int, seed: int = 0):
    import torch

    from llmcourse.models.gpt2 import GPT2Config, GPT2Model

    cfg = GPT2Config(**{**GPT2Config.preset("gpt2-char-tiny").to_dict(), "context_length": context_length,
                        "dropout": 0.0})
    torch.manual_seed(seed)
    return GPT2Model(cfg)


def _optimizer(model, r: Recipe):
    from llmcourse.train.optim import configure_optimizer

    return configure_optimizer(model, r.max_lr, r.weight_decay, betas=r.betas)


def _lr_fn(r: Recipe):
    from llmcourse.train.schedules import warmup_cosine_lr

    return lambda s: warmup_cosine_lr(s, r.max_lr, r.min_lr, r.warmup_steps, r.steps)


def run_curve(r: Recipe, train, val, eval_every: int, seed: int = 0, log=None) -> dict:
    """Train a fresh model with recipe ``r``; the validation loss at step 0, every ``eval_every`` steps and at the
    end. Returns ``{"step": [...], "val_loss": [...], "train_seconds": float}``."""
    from llmcourse.train.pretraining import EVAL_SEED, estimate_loss, train_steps

    model = _model(r.context_length, seed)
    opt = _optimizer(model, r)
    lr = _lr_fn(r)
    out = {"step": [0], "val_loss": [estimate_loss(model, val, EVAL_BATCH, EVAL_CONTEXT, EVAL_BATCHES, EVAL_SEED)],
           "train_seconds": 0.0}
    done = 0
    while done < r.steps:
        n = min(eval_every, r.steps - done)
        t0 = time.perf_counter()
        train_steps(model, opt, train, n, done, r.batch_size, r.context_length, lr, r.max_norm, seed)
        out["train_seconds"] += time.perf_counter() - t0
        done += n
        out["step"].append(done)
        out["val_loss"].append(estimate_loss(model, val, EVAL_BATCH, EVAL_CONTEXT, EVAL_BATCHES, EVAL_SEED))
        if log:
            log(f"  {r.name}: step {done}/{r.steps} val {out['val_loss'][-1]:.4f}")
    return out


def measure_ms_per_step(recipes: list[Recipe], train, rounds: int = 5, steps: int = 6, warmup: int = 3,
                        seed: int = 0) -> dict[str, float]:
    """Median milliseconds per training step of each recipe, interleaved step by step in this process."""
    import torch

    from llmcourse.data.corpus import get_batch
    from llmcourse.train.pretraining import train_step

    from . import interleaved_times

    state = {}
    for r in recipes:
        model = _model(r.context_length, seed)
        state[r.name] = (r, model, _optimizer(model, r), _lr_fn(r), [0])

    def one(name):
        r, model, opt, lr, counter = state[name]
        s = counter[0] % r.steps
        counter[0] += 1
        x, y = get_batch(train, r.batch_size, r.context_length, torch.Generator().manual_seed(seed + s))
        t0 = time.perf_counter()
        model.train()
        train_step(model, opt, x, y, lr(s), r.max_norm)
        return time.perf_counter() - t0

    for name in state:
        for _ in range(warmup):
            one(name)
    times = interleaved_times({name: (lambda n=name: one(n)) for name in state}, rounds, steps)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def wall_curve(curve: dict, ms_per_step: float) -> list[tuple[float, float]]:
    """``[(seconds, val_loss), ...]``: the step curve composed with ``step × ms_per_step``."""
    return [(s * ms_per_step / 1000, v) for s, v in zip(curve["step"], curve["val_loss"])]


def loss_at(wall: list[tuple[float, float]], seconds: float) -> float:
    """The loss a run stands at after ``seconds`` of training: linear between evaluations, the last value once the
    run has finished (a finished run keeps its final weights)."""
    if seconds >= wall[-1][0]:
        return wall[-1][1]
    for (t0, v0), (t1, v1) in zip(wall, wall[1:]):
        if t0 <= seconds <= t1:
            return v0 + (v1 - v0) * (seconds - t0) / (t1 - t0)
    return wall[0][1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coursetools.bench.time_to_quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--budgets", nargs="+", type=float, default=[float(m) for m in range(1, 11)],
                   help="training budgets in minutes (one course run each)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--batch-size", type=int, default=None, help="override the course recipe's batch size")
    p.add_argument("--context-length", type=int, default=None, help="override the course recipe's context")
    p.add_argument("--max-lr", type=float, default=None, help="override the course recipe's max_lr")
    p.add_argument("--out", default=None, help="folder for time_to_quality.md/.json (default test-artifacts/bench)")
    p.add_argument("--nanogpt-steps", type=int, default=NANOGPT.steps,
                   help="shorten nanoGPT's run (its schedule too): for a smoke test of the script only")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    import platform

    import torch

    from llmcourse.data.corpus import char_corpus
    from llmcourse.train.pretraining import budget_recipe

    from . import ALLOCATOR_ENV, write_outputs  # noqa: F401 - the allocator settings are the shell's business

    torch.set_num_threads(args.threads)
    corpus = char_corpus("tinyshakespeare")
    log = None if args.quiet else (lambda m: print(m, flush=True))

    def course(minutes: float, ms: float) -> Recipe:
        kw = budget_recipe(minutes, ms)
        for key, val in (("batch_size", args.batch_size), ("context_length", args.context_length),
                         ("max_lr", args.max_lr)):
            if val is not None:
                kw[key] = val
        return Recipe(f"course {minutes:g} min", **kw)

    nano_recipe = replace(NANOGPT, steps=args.nanogpt_steps,
                          warmup_steps=min(NANOGPT.warmup_steps, args.nanogpt_steps // 2))
    probe = course(1.0, 100.0)
    ms = measure_ms_per_step([nano_recipe, replace(probe, name="course")], corpus.train)
    if log:
        log(f"ms/step, interleaved medians on this machine ({args.threads} threads): "
            + ", ".join(f"{k} {v:.1f}" for k, v in ms.items()))
    curves = {"nanoGPT": run_curve(nano_recipe, corpus.train, corpus.val, min(100, nano_recipe.steps), log=log)}
    walls = {"nanoGPT": wall_curve(curves["nanoGPT"], ms["nanoGPT"])}
    rows = []
    for minutes in args.budgets:
        try:
            r = course(minutes, ms["course"])
        except ValueError as err:          # a budget too short for this machine's speed: say so, go on
            if log:
                log(f"  budget {minutes:g} min skipped: {err}")
            continue
        curves[r.name] = run_curve(r, corpus.train, corpus.val, max(1, r.steps // 10), log=log)
        walls[r.name] = wall_curve(curves[r.name], ms["course"])
        nano = loss_at(walls["nanoGPT"], 60 * minutes)
        ours = curves[r.name]["val_loss"][-1]
        rows.append({"minutes": minutes, "course_steps": r.steps, "course": ours,
                     "nanoGPT_steps": min(nano_recipe.steps, int(60_000 * minutes / ms["nanoGPT"])), "nanoGPT": nano,
                     "ahead": "course" if ours < nano else "nanoGPT"})

    lines = [f"# Time to quality: validation loss after a budget of training minutes ({platform.processor() or platform.machine()}, "
             f"{args.threads} threads)", "",
             f"ms/step (interleaved medians): nanoGPT {ms['nanoGPT']:.1f} (B={NANOGPT.batch_size}, T={NANOGPT.context_length}); "
             f"course {ms['course']:.1f} (B={probe.batch_size}, T={probe.context_length})", "",
             "| minutes | course steps | course val loss | nanoGPT steps | nanoGPT val loss | ahead |",
             "|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['minutes']:g} | {r['course_steps']:,} | {r['course']:.3f} | {r['nanoGPT_steps']:,} | "
              f"{r['nanoGPT']:.3f} | {r['ahead']} |" for r in rows]
    behind = [r["minutes"] for r in rows if r["ahead"] != "course"]
    lines += ["", "the course's recipe is ahead at every budget" if not behind else
              f"nanoGPT's recipe is ahead at {', '.join(f'{m:g}' for m in behind)} min"]
    lines += ["", "validation loss against wall time (seconds, loss):"]
    for name, wall in walls.items():
        lines.append(f"- {name}: " + ", ".join(f"({t:.0f}, {v:.3f})" for t, v in wall))
    results = {"ms_per_step": ms, "threads": args.threads, "recipes": {"nanoGPT": asdict(nano_recipe)},
               "curves": curves, "rows": rows}
    write_outputs("time_to_quality", results, "\n".join(lines), out=args.out)
    return 0 if not behind else 1


if __name__ == "__main__":
    raise SystemExit(main())
