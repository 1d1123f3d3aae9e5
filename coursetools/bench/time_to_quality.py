"""Time to quality: validation loss against wall time for nanoGPT's CPU recipe and unit 10's laptop recipe.

Three steps, so that the part that needs an idle machine is short and the long part survives load::

    python -m coursetools.bench.time_to_quality curves --nanogpt --course-steps 600 1200   # long; any load
    python -m coursetools.bench.time_to_quality speed                                      # ~1 min; IDLE machine
    python -m coursetools.bench.time_to_quality curves --for-budgets 1 2 3 5 10             # the missing course runs
    python -m coursetools.bench.time_to_quality report --budgets 1 2 3 5 10

A script, not a test. Both recipes train the course's ``gpt2-char-tiny`` (:class:`llmcourse.models.gpt2.GPT2Model`:
4 layers, width 128, 4 heads, biases, dropout 0) on tinyshakespeare characters (the first 90 % of the file), with
the course's AdamW groups (:func:`llmcourse.train.optim.configure_optimizer`: matrices decayed by 0.1, vectors
not), clipping at 1.0 and the course's warm-up + cosine (:func:`llmcourse.train.schedules.warmup_cosine_lr`). What
differs is the recipe's numbers:

* ``nanoGPT``: the published CPU settings of nanoGPT's character-level Shakespeare example (batch 12 × 64, 2,000
  steps, lr 1e-3 warmed up over 100 steps and decayed to 1e-4 at step 2,000, Adam betas (0.9, 0.99)). The run
  has a fixed length: after its 2,000 steps it stays at its final loss whatever the budget.
* ``course``: :func:`llmcourse.train.pretraining.budget_recipe`, the laptop recipe of unit 10, whose schedule is
  tied to the budget: it trains ``minutes · 60,000 / (ms per step)`` steps and its cosine ends at the last one.
  One run per step count.

Method. The validation loss against the **optimizer step** is deterministic (seeded initial weights and batches,
fixed evaluation windows; another CPU or thread count changes it by float rounding only), so ``curves`` computes it
on any machine under any load and stores it, run by run, in
``docs/time-to-quality/curves.json`` (every step's training loss, the validation loss every ``eval_every`` steps;
written after every evaluation, and a run interrupted resumes from ``test-artifacts/bench/ttq/`` where it stopped,
bit for bit). The **milliseconds per step** of each recipe are a property of the machine: ``speed`` measures them,
interleaved step by step in one process (:func:`measure_ms_per_step`, medians), and stores them with the machine's
description in ``docs/time-to-quality/speed.json``; only this measurement needs an idle machine. ``report`` maps each
budget to steps (nanoGPT: ``min(2,000, minutes · 60,000 / ms)``; the course: ``budget_recipe``'s step count) and
reads the stored curves: nanoGPT's validation loss at its step (linear between evaluations), the course's final
loss of the run with that many steps. A course run of fewer steps (at least 90 % of them) also fits the budget and
may stand in for it (said in the row); a budget without such a run, or beyond nanoGPT's stored curve, is listed as
not computed, with the command that computes it. Evaluation time is not counted (both recipes are scored alike):
20 fixed validation batches of 32 windows of 64 characters (the context both recipes can read).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass, replace

__all__ = ["NANOGPT", "Recipe", "course_recipe", "loss_at", "main", "measure_ms_per_step", "report_rows",
           "run_curve", "wall_curve"]

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


def course_recipe(steps: int) -> Recipe:
    """Unit 10's laptop recipe (:func:`llmcourse.train.pretraining.budget_recipe`) for a run of ``steps`` steps."""
    from llmcourse.train.pretraining import budget_recipe

    return Recipe(f"course {steps}", **budget_recipe(steps, 60_000.0))   # steps minutes at 60 s/step = steps steps


def run_curve(r: Recipe, train, val, eval_every: int, seed: int = 0, log=None, checkpoint=None, save=None) -> dict:
    """Train a fresh model with recipe ``r``; the training loss of every step and the validation loss at step 0,
    every ``eval_every`` steps and at the end.

    ``checkpoint``: a file (``.pt``) where the model, the optimizer and the curve so far are kept after each
    evaluation; a run that finds it resumes there (the batches are seeded by the step, so the result is the same).
    ``save(curve)`` is called after each evaluation (to store the partial curve).

    Returns ``{"step": [...], "val_loss": [...], "train_loss": [...], "done": int, "complete": bool,
    "train_seconds": float}`` (``train_seconds``: wall time of the training steps, on a loaded machine meaningless).
    """
    import torch

    from llmcourse.train.pretraining import EVAL_SEED, estimate_loss, train_steps

    model = _model(r.context_length, seed)
    opt = _optimizer(model, r)
    lr = _lr_fn(r)
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        out = state["curve"]
    else:
        out = {"step": [0], "val_loss": [estimate_loss(model, val, EVAL_BATCH, EVAL_CONTEXT, EVAL_BATCHES, EVAL_SEED)],
               "train_loss": [], "done": 0, "complete": r.steps == 0, "train_seconds": 0.0}
    while out["done"] < r.steps:
        n = min(eval_every, r.steps - out["done"])
        t0 = time.perf_counter()
        out["train_loss"] += train_steps(model, opt, train, n, out["done"], r.batch_size, r.context_length, lr,
                                         r.max_norm, seed)
        out["train_seconds"] += time.perf_counter() - t0
        out["done"] += n
        out["step"].append(out["done"])
        out["val_loss"].append(estimate_loss(model, val, EVAL_BATCH, EVAL_CONTEXT, EVAL_BATCHES, EVAL_SEED))
        out["complete"] = out["done"] == r.steps
        if checkpoint is not None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "curve": out}, checkpoint)
        if save is not None:
            save(out)
        if log:
            log(f"  {r.name}: step {out['done']}/{r.steps} val {out['val_loss'][-1]:.4f}")
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


def _paths(out):
    from pathlib import Path

    from llmcourse.manifest import course_root

    folder = Path(out) if out else course_root() / "docs" / "time-to-quality"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "curves.json", folder / "speed.json", folder / "report.md"


def _read(path) -> dict:
    import json

    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _write(path, data: dict) -> None:
    import json

    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def report_rows(curves: dict, speed: dict, budgets) -> list[dict]:
    """One row per budget (minutes): the steps each recipe gets in it on the machine of ``speed`` and the validation
    loss the stored curves give there, or what is missing. ``curves``/``speed``: the contents of curves.json and
    speed.json. A row: ``minutes``, ``nanoGPT_steps``, ``nanoGPT`` (loss or None), ``course_steps`` (the budget's),
    ``course_run`` (the steps of the stored run used, or None), ``course`` (loss or None), ``ahead`` ("course",
    "nanoGPT" or None when a number is missing), ``missing`` (what to compute)."""
    from llmcourse.train.pretraining import budget_recipe

    ms = speed["ms_per_step"]
    runs = curves.get("runs", {})
    nano = runs.get("nanoGPT")
    rows = []
    for minutes in budgets:
        row = {"minutes": minutes, "missing": []}
        n_nano = min(NANOGPT.steps, int(minutes * 60_000 / ms["nanoGPT"]))
        row["nanoGPT_steps"] = n_nano
        if nano is not None and nano["step"][-1] >= n_nano:
            row["nanoGPT"] = loss_at(list(zip(nano["step"], nano["val_loss"])), n_nano)
        else:
            row["nanoGPT"] = None
            row["missing"].append("curves --nanogpt")
        n_course = budget_recipe(minutes, ms["course"])["steps"]
        row["course_steps"] = n_course
        fits = [r["steps"] for r in runs.values() if r.get("recipe") == "course" and r.get("complete")
                and 0.9 * n_course <= r["steps"] <= n_course]
        row["course_run"] = max(fits) if fits else None
        row["course"] = runs[f"course {row['course_run']}"]["val_loss"][-1] if fits else None
        if not fits:
            row["missing"].append(f"curves --course-steps {n_course}")
        row["ahead"] = None if None in (row["course"], row["nanoGPT"]) else (
            "course" if row["course"] < row["nanoGPT"] else "nanoGPT")
        rows.append(row)
    return rows


def _curves(args, log) -> int:
    import torch

    from llmcourse.data.corpus import char_corpus
    from llmcourse.train.pretraining import budget_recipe

    from . import artifacts_dir

    torch.set_num_threads(args.threads)
    curves_path, speed_path, _ = _paths(args.out)
    store = _read(curves_path) or {"about": "validation loss against the optimizer step (seeded: the same on any "
                                             "machine, under any load); coursetools.bench.time_to_quality",
                                   "eval": {"batches": EVAL_BATCHES, "batch_size": EVAL_BATCH, "context": EVAL_CONTEXT},
                                   "runs": {}}
    todo = []
    if args.nanogpt:
        todo.append((NANOGPT, "nanoGPT", 100))
    steps = list(args.course_steps or [])
    if args.for_budgets:
        speed = _read(speed_path)
        if not speed:
            raise SystemExit(f"--for-budgets needs {speed_path} (run the `speed` step on an idle machine first)")
        steps += [budget_recipe(m, speed["ms_per_step"]["course"])["steps"] for m in args.for_budgets]
    for n in sorted(set(steps)):
        todo.append((course_recipe(n), "course", max(1, n // 10)))
    corpus = char_corpus("tinyshakespeare")
    for r, kind, every in todo:
        key = r.name
        if store["runs"].get(key, {}).get("complete"):
            log(f"{key}: stored already")
            continue

        def save(curve, key=key, r=r, kind=kind, every=every):
            import fcntl

            lock_path = artifacts_dir() / "ttq" / "curves.lock"           # two `curves` processes may share the file
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            with open(lock_path, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                fresh = _read(curves_path) or store
                fresh["runs"][key] = {"recipe": kind, "steps": r.steps, "eval_every": every, "settings": asdict(r),
                                      "complete": curve["complete"], "step": curve["step"],
                                      "val_loss": [round(v, 5) for v in curve["val_loss"]],
                                      "train_loss": [round(v, 4) for v in curve["train_loss"]]}
                _write(curves_path, fresh)

        run_curve(r, corpus.train, corpus.val, every, log=log, save=save,
                  checkpoint=artifacts_dir() / "ttq" / f"{key.replace(' ', '_')}.pt")
    return 0


def _speed(args, log) -> int:
    import datetime
    import os
    import platform

    import torch

    from llmcourse.data.corpus import char_corpus

    torch.set_num_threads(args.threads)
    _, speed_path, _ = _paths(args.out)
    corpus = char_corpus("tinyshakespeare")
    ms = measure_ms_per_step([NANOGPT, replace(course_recipe(1000), name="course")], corpus.train,
                             rounds=args.rounds, steps=args.steps)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    speed = {"ms_per_step": {k: round(v, 2) for k, v in ms.items()}, "threads": args.threads,
             "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs",
             "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
             "load_average_before": load, "date": datetime.date.today().isoformat(),
             "note": "interleaved medians (coursetools.bench.time_to_quality speed); valid on an idle machine only"}
    _write(speed_path, speed)
    log(f"ms/step on this machine ({args.threads} threads, load average {load}): "
        + ", ".join(f"{k} {v:.1f}" for k, v in ms.items()) + f" -> {speed_path}")
    return 0


def _report(args, log) -> int:
    curves_path, speed_path, report_path = _paths(args.out)
    curves, speed = _read(curves_path), _read(speed_path)
    lines = ["# Time to quality: validation loss after a budget of training minutes", ""]
    runs = curves.get("runs", {})
    lines += ["Stored step curves (`curves.json`, validation loss against the optimizer step; seeded, so the same on "
              "any machine up to float rounding):", ""]
    for key, r in sorted(runs.items(), key=lambda kv: (kv[1]["recipe"] != "nanoGPT", kv[1]["steps"])):
        state = "complete" if r["complete"] else f"stopped at step {r['step'][-1]:,} of {r['steps']:,}"
        lines.append(f"- {key} ({state}): " + ", ".join(f"{s:,}: {v:.3f}" for s, v in zip(r["step"], r["val_loss"])))
    if not speed:
        lines += ["", f"No ms/step measured yet: run `python -m coursetools.bench.time_to_quality speed` on an idle "
                  f"machine (it writes {speed_path.name}); the budgets cannot be mapped to steps before."]
        report_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        log("\n".join(lines))
        return 1
    rows = report_rows(curves, speed, args.budgets)
    ms = speed["ms_per_step"]
    lines += ["", f"ms/step ({speed['machine']}, {speed['threads']} threads, {speed['date']}, interleaved medians): "
              f"nanoGPT {ms['nanoGPT']:.1f} (B={NANOGPT.batch_size}, T={NANOGPT.context_length}); course "
              f"{ms['course']:.1f}", "",
              "| minutes | nanoGPT steps | nanoGPT val loss | course steps (run used) | course val loss | ahead |",
              "|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        run = "" if r["course_run"] in (None, r["course_steps"]) else f" ({r['course_run']:,})"
        fmt = lambda v: "not computed" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {r['minutes']:g} | {r['nanoGPT_steps']:,} | {fmt(r['nanoGPT'])} | {r['course_steps']:,}{run} "
                     f"| {fmt(r['course'])} | {r['ahead'] or '-'} |")
    missing = list(dict.fromkeys(m for r in rows for m in r["missing"]))
    behind = [r["minutes"] for r in rows if r["ahead"] == "nanoGPT"]
    measured = [r["minutes"] for r in rows if r["ahead"] is not None]
    lines += [""]
    if behind:
        lines.append(f"nanoGPT's recipe is ahead at {', '.join(f'{m:g}' for m in behind)} min")
    if measured and not behind:
        lines.append(f"the course's recipe is ahead at {', '.join(f'{m:g}' for m in measured)} min"
                     + ("" if len(measured) == len(rows) else " (the other budgets are not computed)"))
    if missing:
        lines.append("not computed yet: " + "; ".join(f"`python -m coursetools.bench.time_to_quality {m}`"
                                                       for m in missing))
    report_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log("\n".join(lines))
    return 0 if not behind and not missing else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coursetools.bench.time_to_quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="folder of curves.json, speed.json, report.md "
                   "(default docs/time-to-quality)")
    p.add_argument("--quiet", action="store_true")
    sub = p.add_subparsers(dest="step", required=True)
    c = sub.add_parser("curves", help="compute and store step curves (long; valid under any load)")
    c.add_argument("--nanogpt", action="store_true", help="nanoGPT's 2,000-step run")
    c.add_argument("--course-steps", nargs="+", type=int, default=None, help="course runs of these step counts")
    c.add_argument("--for-budgets", nargs="+", type=float, default=None,
                   help="course runs for these budgets (minutes), mapped to steps with the stored speed.json")
    c.add_argument("--threads", type=int, default=1)
    sp = sub.add_parser("speed", help="measure ms/step of both recipes (short; an idle machine only)")
    sp.add_argument("--threads", type=int, default=2)
    sp.add_argument("--rounds", type=int, default=5)
    sp.add_argument("--steps", type=int, default=6)
    r = sub.add_parser("report", help="budgets -> steps -> stored losses; writes report.md")
    r.add_argument("--budgets", nargs="+", type=float, default=[1.0, 2.0, 3.0, 5.0, 10.0])
    args = p.parse_args(argv)
    log = (lambda m: None) if args.quiet else (lambda m: print(m, flush=True))
    return {"curves": _curves, "speed": _speed, "report": _report}[args.step](args, log)


if __name__ == "__main__":
    raise SystemExit(main())
