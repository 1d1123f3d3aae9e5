"""Training-step speed of llmcourse's GPT2Model against transformers' GPT2LMHeadModel and llms-from-scratch.

One **training step** = forward, ``F.cross_entropy`` on the flattened logits (computed outside every
model), backward, and an AdamW step with the same parameter groups (matrices decayed, vectors not:
:func:`llmcourse.train.optim.configure_optimizer`, run by torch's fused AdamW for every implementation:
:func:`coursetools.bench.bench_optimizer`), then ``zero_grad(set_to_none=True)``.

Implementations, all built from **the same weights** (copied from one seeded ``GPT2LMHeadModel``), dropout
0, float32 on the CPU:

* ``llmcourse``: :class:`llmcourse.models.gpt2.GPT2Model` loaded with :func:`~llmcourse.models.gpt2.load_hf_gpt2`;
* ``hf-sdpa`` and ``hf-eager``: ``transformers.GPT2LMHeadModel`` with ``attn_implementation="sdpa"`` / ``"eager"``;
* ``llms-from-scratch``: ``llms_from_scratch.ch04.GPTModel`` (the peer package, installed by ``make bench``
  with ``--no-deps``), its untied ``out_head`` set to a copy of the token embedding; skipped with a note
  when the package is not installed.

Before any timing the command checks that all implementations give the same logits (``atol 1e-4``) and
stops with an error otherwise. Protocol: for each thread count and config, every implementation is warmed
up, then the implementations are **interleaved** over ``--rounds`` rounds of ``--steps`` timed steps each, taking
turns step by step inside a round (the first one rotates each round, so a slower spell of the machine falls on all
of them alike); an implementation's time is the median of all its timed steps
(≥ 10 by default). Configs: ``gpt2-char-tiny`` (B=32, T=64) and ``gpt2-vocab-6l``, a GPT-2-vocabulary
model (V 50,257, 6 layers, D 256, 8 heads, context 128; 17.6 M parameters; B=8, T=128).

Output: a Markdown table (ms/step, tokens/s, and per config × threads the **ratio** = the faster
transformers variant's ms ÷ llmcourse's ms; above 1 means llmcourse is faster), printed and written to
``test-artifacts/bench/train.md`` with a JSON copy (``train.json``, every step time). The last line is
``train: min ratio vs transformers: X.XX, geomean Y.YY``.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
from dataclasses import dataclass
from functools import partial

__all__ = ["BENCH_CONFIGS", "IMPLEMENTATIONS", "add_arguments", "build_models", "run", "run_train_bench"]

IMPLEMENTATIONS = ("llmcourse", "hf-sdpa", "hf-eager", "llms-from-scratch")
LABELS = {"llmcourse": "llmcourse GPT2Model", "hf-sdpa": "transformers GPT2LMHeadModel (sdpa)",
          "hf-eager": "transformers GPT2LMHeadModel (eager)", "llms-from-scratch": "llms-from-scratch ch04.GPTModel"}
LOGITS_ATOL = 1e-4


@dataclass(frozen=True)
class BenchConfig:
    name: str
    model: dict      # GPT2Config fields
    batch_size: int
    seq_len: int

    @property
    def label(self) -> str:
        return f"{self.name} (B={self.batch_size}, T={self.seq_len})"


BENCH_CONFIGS = {
    "gpt2-char-tiny": BenchConfig("gpt2-char-tiny", dict(vocab_size=65, context_length=64, d_model=128, n_heads=4,
                                                         n_layers=4, dropout=0.0), 32, 64),
    "gpt2-vocab-6l": BenchConfig("gpt2-vocab-6l", dict(vocab_size=50257, context_length=128, d_model=256, n_heads=8,
                                                       n_layers=6, dropout=0.0), 8, 128),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", nargs="+", default=list(BENCH_CONFIGS), choices=list(BENCH_CONFIGS))
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="torch.set_num_threads values")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--steps", type=int, default=4, help="timed steps per implementation per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per implementation before the rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for train.md / train.json (default test-artifacts/bench)")


# ------------------------------------------------------------------------------------------------ models


def _peer_available() -> bool:
    try:
        import llms_from_scratch.ch04  # noqa: F401
    except ImportError:
        return False
    return True


def _peer_from_hf(hf, cfg):
    """``llms_from_scratch.ch04.GPTModel`` with the HF model's weights (Conv1D weights transposed)."""
    import torch
    from llms_from_scratch.ch04 import GPTModel

    d = cfg.d_model
    peer = GPTModel({"vocab_size": cfg.vocab_size, "context_length": cfg.context_length, "emb_dim": d,
                     "n_heads": cfg.n_heads, "n_layers": cfg.n_layers, "drop_rate": 0.0, "qkv_bias": True})
    sd = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    with torch.no_grad():
        _copy_into_peer(peer, sd, d)
    return peer


def _copy_into_peer(peer, sd: dict, d: int) -> None:
    peer.tok_emb.weight.copy_(sd["wte.weight"])
    peer.pos_emb.weight.copy_(sd["wpe.weight"])
    for i, blk in enumerate(peer.trf_blocks):
        h = f"h.{i}."
        for lin, w, b in zip((blk.att.W_query, blk.att.W_key, blk.att.W_value),
                             sd[h + "attn.c_attn.weight"].split(d, dim=1), sd[h + "attn.c_attn.bias"].split(d)):
            lin.weight.copy_(w.T)
            lin.bias.copy_(b)
        blk.att.out_proj.weight.copy_(sd[h + "attn.c_proj.weight"].T)
        blk.att.out_proj.bias.copy_(sd[h + "attn.c_proj.bias"])
        blk.norm1.scale.copy_(sd[h + "ln_1.weight"])
        blk.norm1.shift.copy_(sd[h + "ln_1.bias"])
        blk.norm2.scale.copy_(sd[h + "ln_2.weight"])
        blk.norm2.shift.copy_(sd[h + "ln_2.bias"])
        blk.ff.layers[0].weight.copy_(sd[h + "mlp.c_fc.weight"].T)
        blk.ff.layers[0].bias.copy_(sd[h + "mlp.c_fc.bias"])
        blk.ff.layers[2].weight.copy_(sd[h + "mlp.c_proj.weight"].T)
        blk.ff.layers[2].bias.copy_(sd[h + "mlp.c_proj.bias"])
    peer.final_norm.scale.copy_(sd["ln_f.weight"])
    peer.final_norm.shift.copy_(sd["ln_f.bias"])
    peer.out_head.weight.copy_(sd["wte.weight"])  # the peer's head is untied: a copy of the embedding


def build_models(bc: BenchConfig, seed: int = 0, with_peer: bool | None = None) -> dict:
    """``{implementation: (model, forward)}`` with identical weights; ``forward(idx) -> logits (B, T, V)``."""
    import torch
    from transformers import GPT2LMHeadModel

    from llmcourse.models.gpt2 import GPT2Config, GPT2Model, hf_gpt2_config, load_hf_gpt2

    cfg = GPT2Config(**bc.model)
    torch.manual_seed(seed)
    hf_sdpa = GPT2LMHeadModel(hf_gpt2_config(cfg, attn_implementation="sdpa")).train()
    state = {k: v.clone() for k, v in hf_sdpa.state_dict().items()}
    hf_eager = GPT2LMHeadModel(hf_gpt2_config(cfg, attn_implementation="eager"))
    hf_eager.load_state_dict(state)
    course = load_hf_gpt2(GPT2Model(cfg), state)
    models = {"llmcourse": (course, course), "hf-sdpa": (hf_sdpa, lambda idx: hf_sdpa(idx).logits),
              "hf-eager": (hf_eager, lambda idx: hf_eager(idx).logits)}
    if with_peer is None:
        with_peer = _peer_available()
    if with_peer:
        peer = _peer_from_hf(hf_sdpa, cfg)
        models["llms-from-scratch"] = (peer, peer)
    for model, _ in models.values():
        model.train()  # dropout is 0 everywhere: train mode only matters for the code paths taken
    return models


def _batch(bc: BenchConfig, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, bc.model["vocab_size"], (bc.batch_size, bc.seq_len + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def logits_differences(models: dict, x) -> dict:
    """Max |logits − llmcourse's logits| per implementation (same input, same weights)."""
    import torch

    with torch.no_grad():
        ref = models["llmcourse"][1](x)
        return {name: float((fwd(x) - ref).abs().max()) for name, (_, fwd) in models.items()}


def _step(model, forward, optimizer, x, y) -> float:
    import torch.nn.functional as F

    t0 = time.perf_counter()
    logits = forward(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------ run


def run_train_bench(configs=tuple(BENCH_CONFIGS), threads=(1, 2), rounds: int = 3, steps: int = 4, warmup: int = 3,
                    seed: int = 0, log=print) -> dict:
    """Run the benchmark; returns the JSON-able results (see the module docstring).

    Raises:
        AssertionError: the implementations' logits differ by more than ``1e-4`` (nothing is timed then).
    """
    import torch

    from . import bench_optimizer, interleaved_times

    results = {"cells": [], "notes": [], "env": _environment()}
    peer = _peer_available()
    if not peer:
        results["notes"].append("llms-from-scratch is not installed (`make bench` installs it): its column is skipped")
    previous_threads = torch.get_num_threads()
    try:
        for name in configs:
            bc = BENCH_CONFIGS[name]
            models = build_models(bc, seed, with_peer=peer)
            x, y = _batch(bc, seed + 1)
            diffs = logits_differences(models, x)
            bad = {k: v for k, v in diffs.items() if not v <= LOGITS_ATOL}
            assert not bad, f"{bc.label}: logits differ from llmcourse's by more than {LOGITS_ATOL}: {bad}"
            n_params = sum(p.numel() for p in models["llmcourse"][0].parameters())
            log(f"{bc.label}: {n_params:,} parameters; max |Δ logits| vs llmcourse "
                + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items() if k != "llmcourse"))
            for n_threads in threads:
                torch.set_num_threads(n_threads)
                # fresh models per thread count so the weights (and the optimizer states) start equal
                models = build_models(bc, seed, with_peer=peer)
                opts = {k: bench_optimizer(m, 1e-4) for k, (m, _) in models.items()}
                order = list(models)
                for k in order:
                    for _ in range(warmup):
                        _step(models[k][0], models[k][1], opts[k], x, y)
                times = interleaved_times({k: partial(_step, *models[k], opts[k], x, y) for k in order}, rounds, steps)
                ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
                tokens = bc.batch_size * bc.seq_len
                best_hf = min(ms["hf-sdpa"], ms["hf-eager"])
                cell = {"config": bc.name, "label": bc.label, "threads": n_threads, "parameters": n_params,
                        "tokens_per_step": tokens, "ms_per_step": ms,
                        "tokens_per_s": {k: tokens / (v / 1000) for k, v in ms.items()},
                        "ratio": best_hf / ms["llmcourse"], "step_seconds": times, "max_abs_logits_diff": diffs}
                results["cells"].append(cell)
                log(f"  {n_threads} thread(s): " + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items())
                    + f"; ratio {cell['ratio']:.2f}")
                del models, opts
    finally:
        torch.set_num_threads(previous_threads)
    ratios = [c["ratio"] for c in results["cells"]]
    results["min_ratio"] = min(ratios)
    results["geomean_ratio"] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return results


def markdown(results: dict) -> str:
    """The results as a Markdown table; the last line is the summary the issue's regex matches."""
    lines = ["| config | threads | implementation | ms/step | tokens/s | ratio (transformers ÷ llmcourse) |",
             "|---|---:|---|---:|---:|---:|"]
    for c in results["cells"]:
        for i, k in enumerate(c["ms_per_step"]):
            ratio = f"{c['ratio']:.2f}" if k == "llmcourse" else ""
            lines.append(f"| {c['label'] if i == 0 else ''} | {c['threads'] if i == 0 else ''} | {LABELS[k]} | "
                         f"{c['ms_per_step'][k]:.1f} | {c['tokens_per_s'][k]:,.0f} | {ratio} |")
    lines += [f"Note: {n}" for n in results["notes"]]
    env = results["env"]
    lines.append(f"torch {env['torch']}, transformers {env['transformers']}, llms-from-scratch "
                 f"{env['llms_from_scratch']}; {env['cpu_count']} CPUs ({env['machine']}). Median of "
                 f"{env.get('timed_steps', '?')} timed steps per implementation, interleaved step by step.")
    lines.append(f"train: min ratio vs transformers: {results['min_ratio']:.2f}, geomean {results['geomean_ratio']:.2f}")
    return "\n".join(lines)


def _environment() -> dict:
    import os
    from importlib import metadata

    import torch

    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {"torch": torch.__version__, "transformers": version("transformers"),
            "llms_from_scratch": version("llms-from-scratch"), "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}


def run(args) -> int:
    """``course bench train``."""
    from . import write_outputs

    try:
        results = run_train_bench(args.configs, args.threads, args.rounds, args.steps, args.warmup, args.seed)
    except AssertionError as err:
        print(f"course bench train: {err}")
        return 1
    results["env"]["timed_steps"] = args.rounds * args.steps
    write_outputs("train", results, markdown(results), args.out)
    return 0
