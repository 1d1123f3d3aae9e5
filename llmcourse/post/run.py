"""The whole post-training run of unit 19 at tiny scale: a small Llama, SFT, then GRPO (a reference pipeline).

``python -m llmcourse.post.run [--seeds 0 1 2] [--sft-steps 300] [--grpo-iters 100] [--json PATH]`` trains one
model per seed and prints the held-out accuracy (greedy decoding) before SFT, after SFT and after GRPO, with
the wall time of each phase. :data:`POST_RECIPE` holds the defaults; every key can be overridden.

The model is unit 11's Llama (:class:`~llmcourse.models.llama3_cached.CachedLlama3Model`, the same weights
as ``Llama3Model``) with a tiny config (V 16, D 64, L 2, H 4, KV 2, I 128, C 16), randomly initialised with
``torch.manual_seed(seed)``: "before SFT" is the accuracy of that untrained model.

GRPO step size: the update is a difference of many per-sequence gradients that mostly cancel, and a step
that an SFT run takes in its stride (Adam at ``lr`` 1e-4 on this model) moves the policy far enough to lower
the log-probability of *every* sampled completion, the rewarded ones included (second-order effects win).
Hence a small learning rate (3e-5) with a short linear warm-up, as RL fine-tuning recipes use.

``python -m llmcourse.post.run --save-sft`` trains only the SFT phase of each seed and writes
``assets/post_sft_tiny.pt`` (:func:`train_sft_models`; 34 s on an idle CPU with one torch thread, measured 2026-11-29):
the state dicts after SFT with the recipe and the accuracies, which unit 19's lesson loads
(:func:`load_sft_models`) so that GRPO starts without minutes of SFT.

``sft_pool = n > 0`` fine-tunes on a fixed set of ``n`` training pairs (a small "cold start" set, DeepSeek-R1
§2.3.1) instead of fresh pairs every step; GRPO always draws fresh training prompts (it needs no answers, only the
verifier). The recipe uses 500 pairs: the fine-tuned models then leave GRPO more to learn.

``python -m llmcourse.post.run --store-runs`` (:func:`grpo_significance`) runs GRPO from each stored SFT model with
two sample streams (``grpo_stream``) and writes ``assets/post_grpo_runs.json``: per run, the held-out items GRPO
fixed and broke and the exact McNemar p-value (:func:`mcnemar_exact`). Six GRPO runs of the recipe: 85 s on an idle
CPU with one torch thread (measured 2026-11-29; it reproduced the stored file exactly). Unit 19's lesson under the
laptop profile (three of these runs live, the reward-hacking pair, the 4 × 30-iteration ablation) ran in 141 s.

How the recipe was chosen (issue 41; results are deterministic given the seed; fixed/broken held-out items, exact
McNemar p, one sample stream unless two are given):

* fresh pairs for SFT, 500 held-out pairs, 100 iterations, format term not gated (SFT 0.126 / 0.628 / 0.410):
  54/31 (p 0.017), 45/33 (0.21), 36/26 (0.25). Seed 2 with the gate: 30/16 (0.054); with ``grpo_lr`` 1e-4
  (no gate): 43/57, worse than SFT.
* fresh pairs for SFT, 2000 held-out pairs, gated, 100 iterations (SFT 0.790 / 0.762 / 0.585): 138/125 (0.46),
  152/135 (0.34), 200/147 (0.005): a model that starts high leaves GRPO little but churn.
* cold start on 500 pairs, 2000 held-out pairs, gated, 100 iterations, two streams (SFT 0.514 / 0.173 / 0.238):
  172/72 and 172/74 (p < 1e-9); 114/86 (0.056) and 128/82 (0.002); 125/89 (0.017) and 94/75 (0.17).
  Seed 1, stream 0, with 64 prompts per step: 116/77 (0.006); with 200 iterations: 133/74 (5e-5).
* the recipe (cold start, gated, 200 iterations): ``assets/post_grpo_runs.json``, shown in unit 19's lesson.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from .grpo import evaluate_correct, frozen_copy, grpo_step
from .sft import sft_train
from .task import AdditionTask

__all__ = ["POST_MODEL", "POST_RECIPE", "build_post_model", "grpo_runs_path", "grpo_significance", "load_grpo_runs",
           "load_sft_models", "mcnemar_exact", "paired_change", "run_post_training", "sft_asset_path",
           "train_sft_models"]


def mcnemar_exact(fixed: int, broken: int) -> float:
    """Two-sided exact McNemar p-value of a paired change: ``fixed`` items went wrong → right, ``broken`` right →
    wrong (the concordant items carry no information). Under "no change" each of the ``n = fixed + broken``
    discordant items is fixed or broken with probability 1/2, so the p-value is
    ``min(1, 2 · P[Binomial(n, 1/2) ≤ min(fixed, broken)])`` (McNemar 1947; the exact binomial form), 1 when
    ``n = 0``. Computed with integers (``math.comb``), exact for any ``n``.

    Raises:
        ValueError: a negative count.
    """
    import math

    fixed, broken = int(fixed), int(broken)
    if fixed < 0 or broken < 0:
        raise ValueError(f"counts must be ≥ 0, got fixed={fixed}, broken={broken}")
    n = fixed + broken
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(fixed, broken) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def paired_change(before, after) -> dict:
    """The paired comparison of two per-item correctness records (sequences of bools, same items, same order):
    ``fixed`` (wrong → right), ``broken`` (right → wrong), ``gain`` (``(fixed − broken) / n``) and ``p``
    (:func:`mcnemar_exact`).

    Raises:
        ValueError: records of different lengths.
    """
    b, a = [bool(x) for x in before], [bool(x) for x in after]
    if len(a) != len(b):
        raise ValueError(f"records of different lengths: {len(b)} and {len(a)}")
    fixed = sum(1 for x, y in zip(b, a) if y and not x)
    broken = sum(1 for x, y in zip(b, a) if x and not y)
    return {"fixed": fixed, "broken": broken, "gain": (fixed - broken) / max(len(a), 1),
            "p": mcnemar_exact(fixed, broken)}

POST_MODEL = dict(vocab_size=16, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=128,
                  context_length=16, rope_theta=10000.0)
POST_RECIPE = dict(n_digits=2, n_test=2000, split_seed=0, sft_pool=500, sft_steps=300, sft_batch=256, sft_lr=3e-3,
                   grpo_iters=200, prompts_per_step=32, group_size=8, grpo_lr=3e-5, grpo_warmup=10,
                   temperature=1.0, clip_eps=0.2, beta=0.04, inner_steps=1, format_weight=0.1, length_weight=0.0,
                   gate_format=True, loss_type="grpo", scale_rewards="group", eval_every=0, grpo_stream=0)


def build_post_model(seed: int, **overrides):
    """The tiny cache-aware Llama of the run (``POST_MODEL`` updated by ``overrides``), seeded."""
    from ..models.llama3 import Llama3Config
    from ..models.llama3_cached import CachedLlama3Model

    torch.manual_seed(seed)
    return CachedLlama3Model(Llama3Config(**dict(POST_MODEL, **overrides))).eval()


def run_post_training(seed: int = 0, callback=None, sft_state: dict | None = None, **overrides) -> dict:
    """SFT then GRPO from a fresh model; returns the accuracies, the per-iteration GRPO stats and the times.

    ``sft_state``: a state dict of this seed's model after SFT (e.g. from :func:`load_sft_models`); when given,
    it replaces the SFT phase (``sft_losses`` is then empty and ``seconds_sft`` 0).

    ``callback(phase, step, stats)`` is called after every SFT step (``"sft"``, ``{"loss": ...}``) and GRPO
    iteration (``"grpo"``, the dict of :func:`~llmcourse.post.grpo.grpo_step`, plus ``"test_accuracy"``
    every ``eval_every`` iterations when that is > 0).

    Returns:
        dict with ``acc_before``, ``acc_sft``, ``acc_grpo`` (greedy accuracy on the held-out pairs),
        ``sft_losses``, ``grpo`` (list of stat dicts), ``seconds_sft``, ``seconds_grpo``, ``recipe``, ``model``
        (the policy after GRPO), ``sft_model`` (a frozen copy after SFT, also GRPO's reference).
    """
    r = dict(POST_RECIPE, **overrides)
    task = AdditionTask(r["n_digits"], r["n_test"], r["split_seed"])
    model = build_post_model(seed)
    acc = lambda m: int(evaluate_correct(m, task, task.test_pairs).sum()) / max(len(task.test_pairs), 1)  # noqa: E731
    out = {"recipe": r, "acc_before": acc(model)}
    t0 = time.perf_counter()
    cb = None if callback is None else (lambda s, loss: callback("sft", s, {"loss": loss}))
    if sft_state is not None:
        model.load_state_dict(sft_state)
        out["sft_losses"] = []
    else:
        pool = (task.sample_train(r["sft_pool"], torch.Generator().manual_seed(3_000_017 + seed))
                if r["sft_pool"] else None)
        out["sft_losses"] = sft_train(model, task, r["sft_steps"], batch_size=r["sft_batch"], lr=r["sft_lr"],
                                      seed=1_000_003 * seed, callback=cb, pool=pool)
    out["seconds_sft"] = 0.0 if sft_state is not None else time.perf_counter() - t0
    out["correct_sft"] = evaluate_correct(model, task, task.test_pairs).tolist()
    out["acc_sft"] = sum(out["correct_sft"]) / max(len(task.test_pairs), 1)
    ref = frozen_copy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=r["grpo_lr"], weight_decay=0.0)
    warm = max(int(r["grpo_warmup"]), 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    g = torch.Generator().manual_seed(2_000_003 + seed + 7_919 * int(r["grpo_stream"]))
    history = []
    t0 = time.perf_counter()
    for it in range(r["grpo_iters"]):
        stats = grpo_step(model, ref, opt, task, task.sample_train(r["prompts_per_step"], g),
                          group_size=r["group_size"], temperature=r["temperature"], clip_eps=r["clip_eps"],
                          beta=r["beta"], inner_steps=r["inner_steps"], generator=g,
                          reward_weights={"format_weight": r["format_weight"],
                                          "length_weight": r["length_weight"],
                                          "gate_format": r["gate_format"]},
                          loss_type=r["loss_type"], scale_rewards=r["scale_rewards"])
        sched.step()
        if r["eval_every"] and (it + 1) % r["eval_every"] == 0:
            stats["test_accuracy"] = acc(model)
        history.append(stats)
        if callback is not None:
            callback("grpo", it, stats)
    out["seconds_grpo"] = time.perf_counter() - t0
    out["correct_grpo"] = evaluate_correct(model, task, task.test_pairs).tolist()
    out["acc_grpo"] = sum(out["correct_grpo"]) / max(len(task.test_pairs), 1)
    out.update(grpo=history, model=model, sft_model=ref)
    return out


SFT_SEEDS = (0, 1, 2)
# the substitute trained when the asset is missing: a shorter SFT (about 15 s a seed on an idle 2-core CPU)
SUBSTITUTE_SFT = dict(sft_steps=120, sft_batch=128)


def sft_asset_path() -> Path:
    """``<course>/assets/post_sft_tiny.pt``."""
    return Path(__file__).resolve().parents[2] / "assets" / "post_sft_tiny.pt"


def train_sft_models(seeds=SFT_SEEDS, save: bool = False, path: str | Path | None = None, verbose: bool = True,
                     **overrides) -> dict:
    """The SFT phase of :func:`run_post_training` for each seed (``POST_RECIPE`` updated by ``overrides``).

    Returns (and with ``save=True`` writes, plain data only, loadable with ``torch.load(..., weights_only=True)``)::

        {"config": POST_MODEL, "recipe": the recipe, "seeds": [...], "models": {seed: state_dict (float32)},
         "acc_before": {seed: float}, "acc_sft": {seed: float}, "seconds": {seed: float}, "substitute": False}

    The accuracies are greedy, on the recipe's held-out pairs. Re-create the asset with
    ``python -m llmcourse.post.run --save-sft`` (34 s on an idle CPU with one torch thread).
    """
    r = dict(POST_RECIPE, **overrides)
    task = AdditionTask(r["n_digits"], r["n_test"], r["split_seed"])
    out = {"config": dict(POST_MODEL), "recipe": r, "seeds": [int(s) for s in seeds], "models": {},
           "acc_before": {}, "acc_sft": {}, "seconds": {}, "substitute": False}
    for seed in seeds:
        res = run_post_training(int(seed), **dict(r, grpo_iters=0))
        out["models"][int(seed)] = {k: v.detach().clone() for k, v in res["sft_model"].state_dict().items()}
        out["acc_before"][int(seed)] = res["acc_before"]
        out["acc_sft"][int(seed)] = res["acc_sft"]
        out["seconds"][int(seed)] = res["seconds_sft"]
        if verbose:
            print(f"seed {seed}: held-out accuracy before SFT {res['acc_before']:.3f}, after SFT "
                  f"{res['acc_sft']:.3f} ({res['seconds_sft']:.1f} s)", flush=True)
    if save:
        p = Path(path) if path else sft_asset_path()
        p.parent.mkdir(parents=True, exist_ok=True)
        torch.save(out, p)
    del task
    return out


def load_sft_models(path: str | Path | None = None, retrain: bool = True, verbose: bool = True) -> dict:
    """The fine-tuned models of the run's seeds (``assets/post_sft_tiny.pt``, see :func:`train_sft_models`).

    Returns the stored dict; ``models[seed]`` is a state dict for :func:`build_post_model`. A missing file with
    ``retrain`` trains a substitute (``SUBSTITUTE_SFT``: a shorter SFT, lower accuracies; ``substitute`` True) and
    says so; with ``retrain=False`` a ``FileNotFoundError`` names the command that re-creates the asset.
    """
    p = Path(path) if path else sft_asset_path()
    if p.exists():
        return torch.load(p, weights_only=True)
    if not retrain:
        raise FileNotFoundError(f"{p} is missing; re-create it with: python -m llmcourse.post.run --save-sft")
    if verbose:
        print(f"{p.name} is missing: training a shorter substitute (re-create the asset with "
              "python -m llmcourse.post.run --save-sft)", flush=True)
    out = train_sft_models(SFT_SEEDS, verbose=verbose, **SUBSTITUTE_SFT)
    out["substitute"] = True
    return out


def grpo_runs_path() -> Path:
    """``<course>/assets/post_grpo_runs.json``: the stored paired comparison of :func:`grpo_significance`."""
    return sft_asset_path().with_name("post_grpo_runs.json")


def grpo_significance(sft: dict | None = None, seeds=None, streams=(0, 1), verbose: bool = True,
                      **overrides) -> dict:
    """GRPO from each stored fine-tuned model (``sft``: :func:`load_sft_models`'s dict, default the asset) with
    several independent sample streams (``grpo_stream``: another seed of the prompts and samples, same model),
    each compared with its SFT model item by item on the held-out pairs (:func:`paired_change`).

    Returns (plain data, JSON-ready)::

        {"recipe": the recipe, "seeds": [...], "streams": [...], "sft_substitute": bool,
         "runs": [{"seed", "stream", "acc_sft", "acc_grpo", "fixed", "broken", "gain", "p", "final_kl"}, ...]}

    ``python -m llmcourse.post.run --store-runs`` writes it to :func:`grpo_runs_path` (six GRPO runs of the
    laptop recipe; 85 s on an idle CPU with one torch thread).
    """
    sft = load_sft_models(retrain=False) if sft is None else sft
    seeds = [int(s) for s in (sft["seeds"] if seeds is None else seeds)]
    r = dict(POST_RECIPE, **dict(overrides, n_test=sft["recipe"]["n_test"], split_seed=sft["recipe"]["split_seed"],
                                 n_digits=sft["recipe"]["n_digits"]))
    r.pop("grpo_stream")
    out = {"recipe": r, "seeds": seeds, "streams": [int(s) for s in streams],
           "sft_substitute": bool(sft.get("substitute", False)), "runs": []}
    for seed in seeds:
        for stream in streams:
            res = run_post_training(seed, sft_state=sft["models"][seed], grpo_stream=int(stream), **r)
            row = dict(seed=seed, stream=int(stream), acc_sft=res["acc_sft"], acc_grpo=res["acc_grpo"],
                       **paired_change(res["correct_sft"], res["correct_grpo"]),
                       final_kl=res["grpo"][-1]["kl"] if res["grpo"] else 0.0)
            out["runs"].append(row)
            if verbose:
                print(f"seed {seed} stream {stream}: held-out accuracy {row['acc_sft']:.3f} -> {row['acc_grpo']:.3f}, "
                      f"fixed {row['fixed']}, broken {row['broken']}, exact McNemar p = {row['p']:.2g}", flush=True)
    return out


def load_grpo_runs(path: str | Path | None = None) -> dict:
    """The stored :func:`grpo_significance` result (``assets/post_grpo_runs.json``).

    Raises:
        FileNotFoundError: the file is missing (the message names the command that re-creates it).
    """
    p = Path(path) if path else grpo_runs_path()
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing; re-create it with: python -m llmcourse.post.run --store-runs")
    return json.loads(p.read_text(encoding="utf-8"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--json", default=None, help="write the per-seed numbers (no models) to this file")
    p.add_argument("--save-sft", action="store_true",
                   help="train only the SFT phase of each seed and write assets/post_sft_tiny.pt")
    p.add_argument("--store-runs", action="store_true",
                   help="GRPO from the stored SFT models, streams --streams, paired tests; writes "
                        "assets/post_grpo_runs.json")
    p.add_argument("--streams", type=int, nargs="+", default=[0, 1])
    for k, v in POST_RECIPE.items():
        kind = (lambda text: text.lower() in ("1", "true", "yes")) if isinstance(v, bool) else type(v)
        p.add_argument("--" + k.replace("_", "-"), type=kind, default=v)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    overrides = {k: getattr(args, k) for k in POST_RECIPE}
    if args.save_sft:
        train_sft_models(args.seeds, save=True, **overrides)
        print(f"wrote {sft_asset_path()}")
        return 0
    if args.store_runs:
        keep = {k: v for k, v in overrides.items() if k not in ("n_digits", "n_test", "split_seed", "grpo_stream")}
        res = grpo_significance(seeds=args.seeds, streams=args.streams, **keep)
        grpo_runs_path().write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {grpo_runs_path()}")
        return 0
    rows = []
    print("seed  before  after SFT  after GRPO  SFT s  GRPO s", flush=True)
    for seed in args.seeds:
        res = run_post_training(seed, **overrides)
        row = {k: res[k] for k in ("acc_before", "acc_sft", "acc_grpo", "seconds_sft", "seconds_grpo")}
        row.update(seed=seed, final_kl=res["grpo"][-1]["kl"] if res["grpo"] else 0.0)
        rows.append(row)
        print(f"{seed:4d}  {row['acc_before']:6.3f}  {row['acc_sft']:9.3f}  {row['acc_grpo']:10.3f}  "
              f"{row['seconds_sft']:5.1f}  {row['seconds_grpo']:6.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"recipe": overrides, "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
