"""Greedy decoding speed with and without a KV cache: llmcourse vs transformers and llms-from-scratch.

Model (``--config bench``): Llama-style, vocabulary 65, 8 layers, d_model 512, 8 heads, 2 KV heads, SwiGLU
width 1,536, context 1,024, θ 10,000, untied embeddings (24.2 M parameters). The weights come from **one**
seeded ``transformers.LlamaForCausalLM`` (:func:`llmcourse.models.llama3.random_hf_llama`) and are copied into
every implementation; equal prefill logits are asserted before any timing.

Implementations, greedy, float32 on the CPU:

* ``llmcourse cached``: :func:`llmcourse.models.llama3_cached.generate_cached` on
  :class:`~llmcourse.models.llama3_cached.CachedLlama3Model` (one prefill call, then one call per token);
* ``llmcourse uncached``: :func:`~llmcourse.models.llama3_cached.generate_uncached` on unit 11's cache-free
  :class:`~llmcourse.models.llama3.Llama3Model` (the whole sequence every step);
* ``transformers cached``: ``LlamaForCausalLM.generate(use_cache=True, do_sample=False)`` (sdpa attention)
  with ``generation_config.eos_token_id = None`` (a random model would otherwise stop at the default EOS id;
  ``min_new_tokens`` is never used, since it changes greedy choices) and an all-ones ``attention_mask``;
* ``llms-from-scratch cached``: ``llms_from_scratch.kv_cache.llama3.Llama3Model`` with
  ``llms_from_scratch.kv_cache.generate.generate_text_simple(use_cache=True)``, when the package is
  installed (``make bench`` installs it with ``--no-deps``); skipped with a note otherwise.

Protocol: ``--new-tokens`` (512) greedy tokens after a ``--prompt-len`` (32) token prompt at each batch size
(1 and 8). Every cached path's tokens must equal llmcourse's **uncached** greedy tokens or the command fails:
at batch 1 by a full uncached run, at batch > 1 by one teacher-forced uncached forward over the generated
sequence (every argmax must be the next token). The uncached batch > 1 time is integrated over the
generated lengths from ``--uncached-samples`` (5) timed forwards at evenly spaced lengths (a full run
takes minutes). Every time is the median of ``--repeats`` (3) runs, the cached paths interleaved in a
rotating order; ``--uncached-repeats`` (default: ``--repeats``) sets the uncached runs at batch 1 and the timings
per sampled length at batch > 1 separately (``course bench all`` uses 1 there to fit its time budget; the single
uncached batch-1 run is still the token reference). Per-step times come from a forward hook on each model (the time between consecutive model
calls).

Output: a Markdown table (wall time for all new tokens, ms per step, tokens/s, speedup = uncached ÷ cached
wall time at the same batch size, ratio = llmcourse cached tokens/s ÷ transformers cached tokens/s, prefill
included, and for the cached rows the **roofline fraction**: the time one step must take at the machine's
measured memory read bandwidth — the bytes a cached decoding step reads, every weight matrix once plus the
batch's K/V cache at its current length, averaged over the generated lengths — divided by the measured ms per
step; 1.0 would mean decoding runs at the memory bandwidth), printed and written to ``test-artifacts/bench/decode.md`` with ``decode.json`` and a plot of
ms/token against generated length (``decode.png``). The last line is
``decode: min cached speedup: X.X, min ratio vs transformers: Y.YY`` (minimum over the batch sizes). Not a
test: measure on an idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmcourse.nn.kv_cache import decode_step_bytes
from llmcourse.runtime import read_bandwidth

__all__ = ["CONFIGS", "add_arguments", "build_models", "decode_step_bytes", "markdown", "read_bandwidth", "run",
           "run_decode_bench"]

CONFIGS = {
    "bench": dict(vocab_size=65, d_model=512, n_layers=8, n_heads=8, n_kv_heads=2, intermediate_size=1536,
                  context_length=1024, rope_theta=10000.0, tie_word_embeddings=False),
    # format smoke test only (tests/test_bench_decode.py)
    "tiny": dict(vocab_size=65, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=128,
                 context_length=128, rope_theta=10000.0, tie_word_embeddings=False),
}
CACHED = ("llmcourse", "transformers", "llms-from-scratch")
LABELS = {"llmcourse": "llmcourse generate_cached", "transformers": "transformers generate(use_cache=True)",
          "llms-from-scratch": "llms-from-scratch kv_cache.llama3", "uncached": "llmcourse uncached"}
LOGITS_RTOL = 1e-4   # max |Δlogit| ≤ LOGITS_RTOL · (1 + max |logit|)
WEIGHT_STD = 0.1     # large enough that greedy choices have clear margins (no float-round-off ties)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="bench", choices=list(CONFIGS))
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3, help="runs per implementation; the median is reported")
    p.add_argument("--uncached-repeats", type=int, default=None,
                   help="runs (B=1) and timings per sampled length (B>1) of the uncached path (default: --repeats)")
    p.add_argument("--uncached-samples", type=int, default=5,
                   help="timed lengths for the uncached time at batch sizes > 1")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plot", action="store_true", help="skip decode.png")
    p.add_argument("--out", default=None, help="folder for decode.md / .json / .png (default test-artifacts/bench)")


# ------------------------------------------------------------------------------------------------ models


def _peer_available() -> bool:
    try:
        import llms_from_scratch.kv_cache.generate  # noqa: F401
        import llms_from_scratch.kv_cache.llama3  # noqa: F401
    except Exception:   # noqa: BLE001 - any import problem means "not available"
        return False
    return True


def _peer_from_course(cfg, sd: dict):
    from llms_from_scratch.kv_cache.llama3 import Llama3Model as PeerLlama

    peer = PeerLlama({"vocab_size": cfg.vocab_size, "context_length": cfg.context_length, "emb_dim": cfg.d_model,
                      "n_heads": cfg.n_heads, "n_layers": cfg.n_layers, "hidden_dim": cfg.intermediate_size,
                      "n_kv_groups": cfg.n_kv_heads, "rope_base": cfg.rope_theta, "dtype": torch.float32,
                      "rope_freq": None})
    names = {"tok_emb.weight": "embed_tokens.weight", "final_norm.weight": "norm.weight",
             "out_head.weight": "lm_head.weight"}
    parts = {"att.W_query": "self_attn.q_proj", "att.W_key": "self_attn.k_proj", "att.W_value": "self_attn.v_proj",
             "att.out_proj": "self_attn.o_proj", "ff.fc1": "mlp.gate_proj", "ff.fc2": "mlp.up_proj",
             "ff.fc3": "mlp.down_proj", "norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
    for i in range(cfg.n_layers):
        for a, b in parts.items():
            names[f"trf_blocks.{i}.{a}.weight"] = f"layers.{i}.{b}.weight"
    peer.load_state_dict({k: sd[v] for k, v in names.items()})
    return peer.eval()


def build_models(cfg_name: str = "bench", seed: int = 0, with_peer: bool | None = None) -> dict:
    """``{name: model}`` for ``llmcourse`` (cached), ``uncached``, ``transformers`` and (if installed)
    ``llms-from-scratch``, all with the weights of one seeded ``LlamaForCausalLM``; eval mode."""
    from llmcourse.models.llama3 import Llama3Config, Llama3Model, load_hf_llama, random_hf_llama
    from llmcourse.models.llama3_cached import CachedLlama3Model

    cfg = Llama3Config(**CONFIGS[cfg_name])
    hf = random_hf_llama(cfg, seed=seed, std=WEIGHT_STD, attn_implementation="sdpa")
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0      # never used: no EOS, no padding
    hf_state = hf.state_dict()
    models = {"llmcourse": load_hf_llama(CachedLlama3Model(cfg), hf_state).eval(),
              "uncached": load_hf_llama(Llama3Model(cfg), hf_state).eval(),
              "transformers": hf}
    with_peer = _peer_available() if with_peer is None else with_peer
    if with_peer:
        models["llms-from-scratch"] = _peer_from_course(cfg, models["llmcourse"].state_dict())
    return models


@torch.no_grad()
def prefill_logits(models: dict, idx: torch.Tensor) -> dict:
    """Each implementation's logits ``(B, T, V)`` on the prompt ``idx``."""
    out = {"llmcourse": models["llmcourse"](idx, cache=models["llmcourse"].new_cache()),
           "uncached": models["uncached"](idx),
           "transformers": models["transformers"](input_ids=idx).logits}
    if "llms-from-scratch" in models:
        out["llms-from-scratch"] = models["llms-from-scratch"](idx)
    return out


# ------------------------------------------------------------------------------------------------ roofline


# read_bandwidth and decode_step_bytes live in the library (unit 12's lesson uses them too), imported above


def roofline_ms_per_step(cfg, n_params: int, batch_size: int, prompt_len: int, new_tokens: int,
                         bandwidth: float) -> float:
    """Mean over the generated lengths of :func:`decode_step_bytes` ÷ ``bandwidth``, in ms."""
    total = sum(decode_step_bytes(cfg, n_params, batch_size, prompt_len + i + 1) for i in range(new_tokens))
    return 1000 * total / new_tokens / bandwidth


# ------------------------------------------------------------------------------------------------ runs


class _StepClock:
    """Forward hook recording ``time.perf_counter()`` after every model call."""

    def __init__(self, model):
        self.stamps: list[float] = []
        self.handle = model.register_forward_hook(lambda *_: self.stamps.append(time.perf_counter()))

    def close(self):
        self.handle.remove()


def _generate(name: str, model, idx: torch.Tensor, n: int) -> torch.Tensor:
    from llmcourse.models.llama3_cached import generate_cached, generate_uncached

    if name == "llmcourse":
        return generate_cached(model, idx, n)
    if name == "uncached":
        return generate_uncached(model, idx, n)
    if name == "transformers":
        return model.generate(input_ids=idx, attention_mask=torch.ones_like(idx), max_new_tokens=n,
                              do_sample=False, use_cache=True, temperature=None, top_p=None, top_k=None)
    if name == "llms-from-scratch":
        from llms_from_scratch.kv_cache.generate import generate_text_simple

        return generate_text_simple(model, idx, n, use_cache=True)
    raise KeyError(name)


def _timed_generate(name, model, idx, n):
    clock = _StepClock(model)
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            tokens = _generate(name, model, idx, n)
        wall = time.perf_counter() - t0
    finally:
        clock.close()
    stamps = [t0] + clock.stamps
    steps_ms = [1000 * (b - a) for a, b in zip(stamps, stamps[1:])]
    return tokens, wall, steps_ms


@torch.no_grad()
def _teacher_forced_mismatches(model, tokens: torch.Tensor, t0: int) -> int:
    """Positions where the uncached model's argmax differs from the generated next token."""
    pred = model(tokens[:, :-1]).argmax(-1)[:, t0 - 1:]
    return int((pred != tokens[:, t0:]).sum())


@torch.no_grad()
def _uncached_integrated(model, idx, n, samples: int, repeats: int) -> tuple[float, list]:
    """Estimated wall time of ``n`` uncached greedy steps: per-step times at ``samples`` lengths, integrated
    (trapezoid, linear interpolation) over the lengths ``T0 … T0+n−1``."""
    t0 = idx.shape[1]
    lengths = sorted({round(t0 + i * (n - 1) / max(samples - 1, 1)) for i in range(samples)})
    g = torch.Generator().manual_seed(123)
    points = []
    for length in lengths:
        x = torch.randint(0, model.cfg.vocab_size, (idx.shape[0], length), generator=g)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(x)[:, -1, :].argmax(-1)
            times.append(time.perf_counter() - start)
        points.append((length, 1000 * statistics.median(times)))
    total_ms = 0.0
    for step in range(n):
        length = t0 + step
        for (a, fa), (b, fb) in zip(points, points[1:]):
            if a <= length <= b:
                total_ms += fa if b == a else fa + (fb - fa) * (length - a) / (b - a)
                break
        else:
            total_ms += points[-1][1]
    return total_ms / 1000, points


def run_decode_bench(cfg_name="bench", batch_sizes=(1, 8), prompt_len=32, new_tokens=512, repeats=3,
                     uncached_samples=5, seed=0, with_peer=None, progress=print, uncached_repeats=None) -> dict:
    """Run the protocol of the module docstring; returns the results dict (see ``decode.json``).

    Raises:
        AssertionError: prefill logits differ, or a cached path's tokens differ from uncached greedy tokens.
    """
    from .train import _environment

    models = build_models(cfg_name, seed, with_peer)
    cfg = models["llmcourse"].cfg
    if prompt_len + new_tokens > cfg.context_length:
        raise ValueError(f"prompt {prompt_len} + new tokens {new_tokens} exceed the context {cfg.context_length}")
    cached = [name for name in CACHED if name in models]
    uncached_repeats = repeats if uncached_repeats is None else uncached_repeats
    results = {"config": {"name": cfg_name, **cfg.to_dict(),
                          "n_params": sum(p.numel() for p in models["llmcourse"].parameters())},
               "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": repeats,
               "uncached_repeats": uncached_repeats, "uncached_samples": uncached_samples, "rows": [], "curves": {},
               "notes": [], "env": _environment()}
    if "llms-from-scratch" not in models:
        results["notes"].append("llms-from-scratch not installed (make bench installs it): its row is skipped")
    g = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (max(batch_sizes), prompt_len), generator=g)

    bandwidth = read_bandwidth()
    results["read_bandwidth_gb_s"] = bandwidth / 1e9
    progress(f"memory read bandwidth: {bandwidth / 1e9:.1f} GB/s ({torch.get_num_threads()} threads)")
    n_params = results["config"]["n_params"]

    logits = prefill_logits(models, prompt)
    scale = 1.0 + float(logits["uncached"].abs().max())
    diffs = {k: float((v - logits["uncached"]).abs().max()) for k, v in logits.items()}
    results["prefill_max_abs_diff"] = diffs
    bad = {k: v for k, v in diffs.items() if v > LOGITS_RTOL * scale}
    assert not bad, f"prefill logits differ from llmcourse uncached (max |logit| {scale - 1:.3g}): {bad}"
    progress(f"prefill logits agree: {', '.join(f'{k} {v:.1e}' for k, v in diffs.items())}")

    summary = {}
    for B in batch_sizes:
        idx = prompt[:B].contiguous()
        walls = {name: [] for name in cached}
        steps = {}
        tokens = {}
        for r in range(repeats):
            order = cached[r % len(cached):] + cached[:r % len(cached)]
            for name in order:
                out, wall, step_ms = _timed_generate(name, models[name], idx, new_tokens)
                walls[name].append(wall)
                tokens.setdefault(name, out)
                steps.setdefault(name, []).append(step_ms)
                progress(f"B={B} {name}: {wall:.2f} s")
        if B == 1:
            u_walls, u_steps = [], []
            for _ in range(uncached_repeats):
                out, wall, step_ms = _timed_generate("uncached", models["uncached"], idx, new_tokens)
                u_walls.append(wall)
                u_steps.append(step_ms)
                ref = out
                progress(f"B={B} uncached: {wall:.2f} s")
            u_wall = statistics.median(u_walls)
            for name in cached:
                assert torch.equal(tokens[name], ref), f"B=1: {name}'s tokens differ from llmcourse uncached greedy " \
                    f"tokens (first difference at new token {int((tokens[name] != ref).nonzero()[0, 1]) - prompt_len})"
            u_curve = [[prompt_len + i, ms] for i, ms in enumerate(statistics.median(c) for c in zip(*u_steps))]
            u_how = "full runs"
        else:
            for name in cached:
                bad_positions = _teacher_forced_mismatches(models["uncached"], tokens[name], prompt_len)
                assert bad_positions == 0, f"B={B}: {name}'s tokens differ from llmcourse uncached greedy choices " \
                    f"at {bad_positions} positions (teacher-forced check)"
            u_wall, points = _uncached_integrated(models["uncached"], idx, new_tokens, uncached_samples, uncached_repeats)
            u_curve = [[length, ms] for length, ms in points]
            u_how = f"integrated from {len(points)} sampled lengths"
            progress(f"B={B} uncached (estimated): {u_wall:.2f} s")
        results["curves"][f"B={B}"] = {"uncached": u_curve}
        for name in cached:
            med = [statistics.median(c) for c in zip(*steps[name])]
            results["curves"][f"B={B}"][name] = [[prompt_len + i, ms] for i, ms in enumerate(med)]
        hf_wall = statistics.median(walls["transformers"])
        bound_ms = roofline_ms_per_step(cfg, n_params, B, prompt_len, new_tokens, bandwidth)
        for name in [*cached, "uncached"]:
            wall = u_wall if name == "uncached" else statistics.median(walls[name])
            results["rows"].append({
                "roofline_ms_per_step": bound_ms,
                "roofline_fraction": None if name == "uncached" else bound_ms / (1000 * wall / new_tokens),
                "batch_size": B, "implementation": name, "label": LABELS[name], "wall_s": wall,
                "ms_per_step": 1000 * wall / new_tokens, "tokens_per_s": B * new_tokens / wall,
                "speedup_vs_uncached": u_wall / wall, "ratio_vs_transformers": hf_wall / wall,
                "all_wall_s": u_walls if (name == "uncached" and B == 1) else ([] if name == "uncached"
                                                                                else walls[name]),
                "how": u_how if name == "uncached" else "median of runs"})
        summary[B] = (u_wall / statistics.median(walls["llmcourse"]), hf_wall / statistics.median(walls["llmcourse"]))
    results["min_speedup"] = min(s for s, _ in summary.values())
    results["min_ratio"] = min(r for _, r in summary.values())
    return results


# ------------------------------------------------------------------------------------------------ output


def summary_line(results: dict) -> str:
    return (f"decode: min cached speedup: {results['min_speedup']:.1f}, "
            f"min ratio vs transformers: {results['min_ratio']:.2f}")


def markdown(results: dict) -> str:
    c = results["config"]
    lines = [f"## Greedy decoding: {results['new_tokens']} new tokens after a {results['prompt_len']}-token prompt",
             "",
             f"Model: V {c['vocab_size']}, L {c['n_layers']}, D {c['d_model']}, H {c['n_heads']}, KV {c['n_kv_heads']}, "
             f"I {c['intermediate_size']}, context {c['context_length']}, θ {c['rope_theta']:g}, untied "
             f"({c['n_params']:,} parameters); float32, CPU.", "",
             "| batch | implementation | wall s | ms/step | tokens/s | speedup vs uncached | ratio vs transformers "
             "| roofline ms/step | roofline fraction |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        note = " (estimated)" if r["how"].startswith("integrated") else ""
        frac = "–" if r.get("roofline_fraction") is None else f"{r['roofline_fraction']:.2f}"
        bound = f"{r['roofline_ms_per_step']:.2f}" if "roofline_ms_per_step" in r else "–"
        lines.append(f"| {r['batch_size']} | {r['label']}{note} | {r['wall_s']:.2f} | {r['ms_per_step']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['speedup_vs_uncached']:.1f} | {r['ratio_vs_transformers']:.2f} "
                     f"| {bound} | {frac} |")
    env = results["env"]
    lines += ["", f"torch {env['torch']}, transformers {env['transformers']}, llms-from-scratch "
              f"{env['llms_from_scratch']}; {env['cpu_count']} CPUs ({env['machine']}), {torch.get_num_threads()} "
              f"threads. Cached rows: median of {results['repeats']} runs; uncached: median of "
              f"{results.get('uncached_repeats', results['repeats'])} (at batch > 1 integrated from "
              f"{results.get('uncached_samples', '?')} sampled lengths, each timed that many times). Every cached "
              "path's tokens equal llmcourse's uncached greedy tokens.",
              "", f"Roofline: memory read bandwidth {results.get('read_bandwidth_gb_s', float('nan')):.1f} GB/s "
              "(best timed sum over a 256 MB float32 tensor, same threads); roofline ms/step = mean bytes a cached step "
              "reads (weights once + the K/V cache at its length) ÷ that bandwidth; fraction = roofline ms ÷ measured "
              "ms/step (prefill included in the measured time)."]
    lines += [f"Note: {n}" for n in results["notes"]]
    lines += ["", summary_line(results)]
    return "\n".join(lines)


def plot(results: dict, path) -> None:
    """ms/token against generated length, one panel per batch size, log scale."""
    from matplotlib.figure import Figure

    curves = results["curves"]
    fig = Figure(figsize=(5.2 * len(curves), 3.8), layout="constrained")
    axes = fig.subplots(1, len(curves), squeeze=False)[0]
    for ax, (key, per_impl) in zip(axes, curves.items()):
        for name, pts in per_impl.items():
            xs = [p[0] for p in pts[1:]] if name != "uncached" or key == "B=1" else [p[0] for p in pts]
            ys = [p[1] for p in pts[1:]] if name != "uncached" or key == "B=1" else [p[1] for p in pts]
            style = dict(marker="o") if (name == "uncached" and key != "B=1") else {}
            ax.plot(xs, ys, label=LABELS[name], lw=1, **style)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (prompt + generated)")
        ax.set_ylabel("ms per decoding step")
        ax.set_title(key)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)


def run(args) -> int:
    """``course bench decode``."""

    from . import write_outputs

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        results = run_decode_bench(args.config, tuple(args.batch_sizes), args.prompt_len, args.new_tokens,
                                   args.repeats, args.uncached_samples, args.seed,
                                   uncached_repeats=args.uncached_repeats)
    except AssertionError as err:
        print(f"course bench decode: {err}")
        return 1
    write_outputs("decode", results, markdown(results), args.out, None if args.no_plot else plot)
    return 0
