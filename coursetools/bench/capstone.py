"""Training-step speed of the capstone DeepSeek-tiny against transformers' DeepseekV3ForCausalLM, and cache bytes.

**Part 1, the training step.** Model: the course's DeepSeek-tiny (:class:`~llmcourse.models.deepseek.DeepSeekConfig`
defaults: V 65, D 128, 4 layers, the first dense, MLA with d_c 64 and d_R 16, 8 routed experts top-2 in 4 groups
(top-2 groups), 1 shared expert) with the **main path only** (``mtp_depth = 0``). The weights come from one seeded
``transformers.DeepseekV3ForCausalLM`` (:func:`~llmcourse.models.deepseek.random_hf_deepseek`) and are copied into
every implementation:

* ``llmcourse``: :class:`~llmcourse.models.deepseek.DeepSeekLM` loaded with
  :func:`~llmcourse.models.deepseek.load_hf_deepseek`;
* ``hf-<attention>-<experts>``: ``DeepseekV3ForCausalLM`` for every attention implementation (``eager``, ``sdpa``)
  × every experts implementation of ``transformers``' experts interface (``eager``: a loop over the hit experts;
  ``batched_mm``: one ``bmm`` over per-assignment gathered weights; ``grouped_mm``: tokens sorted by expert and
  ``torch.nn.functional.grouped_mm``) that runs a forward and a backward on this machine (a variant that raises
  is reported, not timed). ``use_cache=False`` (no ``DynamicCache`` is built during training).

One **training step** = forward on ``x (B, T)``, ``F.cross_entropy`` of the logits (computed outside every model),
backward, an AdamW step (:func:`llmcourse.train.optim.configure_optimizer`'s two groups in torch's fused AdamW:
:func:`coursetools.bench.bench_optimizer`), ``zero_grad``. The
router-bias update ``b ← b + γ·sign(c̄ − c)`` follows every step **outside** the timed part, for every
implementation (transformers' routing is read by a forward hook on each router). Batches: ``B = 32``, ``T = 64``,
seeded random token ids, the same for every implementation. Before timing, the command checks equal logits
(max |Δ| ≤ 1e-4) and equal losses (≤ 1e-5) for every implementation and stops otherwise. Protocol: warm-up steps,
then ``--rounds`` (3) interleaved rounds of ``--steps`` timed steps per implementation; inside a round the
implementations take turns **step by step** (the first one rotates from round to round), so a slower spell of the
machine falls on all of them alike; an implementation's time is the median of its timed steps. A variant whose first step takes over 4× llmcourse's (``batched_mm`` in training:
it gathers one ``(2I, D)`` weight matrix per token-expert pair) is timed after the rounds, ``--rounds`` single steps
(its gigabyte allocations would otherwise slow whichever implementation follows it). **Ratio** = the fastest transformers variant's ms ÷ llmcourse's ms (above 1:
llmcourse is faster).

**Part 2, cache bytes per generated token** of the three course models (the trained assets ``gpt_char_tiny``,
``llama_char_tiny``, ``deepseek_char_tiny``): a short greedy generation with a cache, then ``cache.nbytes()`` ÷
(cached positions × batch), which must equal the formulas (float32): GPT-2 ``2·L·D·4``, Llama ``2·L·KV·hd·4``,
DeepSeek ``L·(d_c + d_R)·4``; the generated tokens must equal uncached greedy decoding. The GPT-2 model has no
cache-aware forward in the course, so this benchmark runs its blocks with unit 12's ``KVCache`` (keys and values
appended per layer; the tokens check proves it right); Llama uses unit 12's ``CachedLlama3Model`` and DeepSeek
:func:`~llmcourse.models.deepseek.generate_latent_cached`. The command fails if a size or a token differs.

Output: Markdown + JSON (``capstone.md``, ``capstone.json``) and a bar plot (``capstone.png``) under
``test-artifacts/bench/``; the last line is ``capstone: ratio vs transformers: X.XX``. Not a test: measure on an
idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from functools import partial

__all__ = ["ATTN_IMPLEMENTATIONS", "EXPERTS_IMPLEMENTATIONS", "add_arguments", "build_models", "cache_bytes_table",
           "markdown", "run", "run_capstone_bench", "summary_line"]

ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
EXPERTS_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")
LOGITS_ATOL = 1e-4
LOSS_ATOL = 1e-5
SLOW_FACTOR = 4.0
WEIGHT_STD = 0.05


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--steps", type=int, default=5, help="timed steps per implementation per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per implementation before the rounds")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--config", default="tiny", choices=["tiny", "smoke"],
                   help="tiny = the course's DeepSeek-tiny; smoke = a 2-layer model for the format test")
    p.add_argument("--new-tokens", type=int, default=24, help="greedy tokens of the cache-bytes part")
    p.add_argument("--no-cache-bytes", action="store_true", help="skip the cache-bytes part")
    p.add_argument("--no-plot", action="store_true", help="skip capstone.png")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for capstone.md / .json / .png (default test-artifacts/bench)")


# ------------------------------------------------------------------------------------------------ models


def bench_config(name: str = "tiny"):
    """The :class:`DeepSeekConfig` of the benchmark: the course default with ``mtp_depth = 0``; ``smoke`` is a
    2-layer version (one dense, one MoE layer) for the format test."""
    from llmcourse.models.deepseek import DeepSeekConfig

    cfg = dataclasses.replace(DeepSeekConfig(), mtp_depth=0)
    if name == "smoke":
        cfg = dataclasses.replace(cfg, n_layers=2, context_length=64)
    return cfg


def _hf_variant(cfg, attn: str, experts: str, state: dict):
    from transformers import DeepseekV3ForCausalLM

    from llmcourse.models.deepseek import hf_deepseek_config

    config = hf_deepseek_config(cfg, attn_implementation=attn)
    config.use_cache = False
    model = DeepseekV3ForCausalLM(config)
    model.set_experts_implementation(experts)
    model.load_state_dict(state)
    got = model.config._experts_implementation
    if got != experts:
        raise RuntimeError(f"transformers chose experts implementation {got!r} instead of {experts!r}")
    return model


def build_models(cfg, seed: int = 0) -> tuple[dict, dict]:
    """``({name: model}, {name: reason})``: llmcourse and every transformers variant that could be built, all with
    the weights of one seeded ``DeepseekV3ForCausalLM``; the second dict names the variants that failed to build."""
    from llmcourse.models.deepseek import DeepSeekLM, load_hf_deepseek, random_hf_deepseek

    base = random_hf_deepseek(cfg, seed=seed, std=WEIGHT_STD, attn_implementation="eager")
    state = {k: v.detach().clone() for k, v in base.state_dict().items()}
    models = {"llmcourse": load_hf_deepseek(DeepSeekLM(cfg), state)}
    failed = {}
    for attn in ATTN_IMPLEMENTATIONS:
        for experts in EXPERTS_IMPLEMENTATIONS:
            name = f"hf-{attn}-{experts}"
            try:
                models[name] = _hf_variant(cfg, attn, experts, state)
            except Exception as err:   # noqa: BLE001 - an unavailable variant is reported, not fatal
                failed[name] = f"{type(err).__name__}: {err}"
    for m in models.values():
        m.train()
    return models, failed


def _logits(name: str, model, x):
    if name == "llmcourse":
        return model(x)["logits"]
    return model(input_ids=x, use_cache=False).logits


class _HFRouting:
    """Forward hooks on every ``DeepseekV3TopkRouter`` of a transformers model: the last routing per router, and the
    sign update of its ``e_score_correction_bias`` (the same rule as ``DeepSeekLM.update_router_biases``)."""

    def __init__(self, model, gamma: float):
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

        self.gamma = gamma
        self.routers = [m for m in model.modules() if isinstance(m, DeepseekV3TopkRouter)]
        self.last = {}
        self.handles = [r.register_forward_hook(self._hook) for r in self.routers]

    def _hook(self, module, _inputs, output):
        self.last[id(module)] = output[2].detach()

    def update(self) -> None:
        import torch

        from llmcourse.models.deepseek_moe import update_bias

        with torch.no_grad():
            for r in self.routers:
                idx = self.last.pop(id(r), None)
                if idx is not None:
                    r.e_score_correction_bias.copy_(update_bias(r.e_score_correction_bias, idx, r.num_experts,
                                                                self.gamma))


def _make_step(name: str, model, gamma: float):
    """``step(x, y) -> seconds`` (timed: forward, loss, backward, AdamW step, zero_grad), then the untimed
    router-bias update."""
    import torch.nn.functional as F

    from . import bench_optimizer

    opt = bench_optimizer(model, 1e-4)
    routing = None if name == "llmcourse" else _HFRouting(model, gamma)

    def step(x, y) -> float:
        t0 = time.perf_counter()
        logits = _logits(name, model, x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if routing is None:
            model.update_router_biases()
        else:
            routing.update()
        return dt

    return step


def _batch(cfg, batch_size: int, seq_len: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (batch_size, seq_len + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def _differences(models: dict, x, y) -> dict:
    """``{name: (max |Δ logits|, |Δ loss|)}`` against llmcourse (eval mode, no grad)."""
    import torch
    import torch.nn.functional as F

    out = {}
    with torch.no_grad():
        for m in models.values():
            m.eval()
        ref = _logits("llmcourse", models["llmcourse"], x)
        ref_loss = float(F.cross_entropy(ref.flatten(0, 1), y.flatten()))
        for name, m in models.items():
            lg = _logits(name, m, x)
            out[name] = (float((lg - ref).abs().max()), abs(float(F.cross_entropy(lg.flatten(0, 1), y.flatten()))
                                                            - ref_loss))
        for m in models.values():
            m.train()
    return out


# ------------------------------------------------------------------------------------------------ part 1


def run_capstone_bench(config: str = "tiny", batch_size: int = 32, seq_len: int = 64, rounds: int = 3, steps: int = 5,
                       warmup: int = 3, seed: int = 0, log=print) -> dict:
    """The training-step part (see the module docstring); returns the JSON-able results.

    Raises:
        AssertionError: an implementation's logits or loss differ from llmcourse's (nothing is timed then).
    """
    import torch

    from llmcourse.models.deepseek import param_counts

    from . import interleaved_times
    from .train import _environment

    cfg = bench_config(config)
    models, failed = build_models(cfg, seed)
    x, y = _batch(cfg, batch_size, seq_len, seed + 1)
    diffs = _differences(models, x, y)
    bad = {k: v for k, v in diffs.items() if not (v[0] <= LOGITS_ATOL and v[1] <= LOSS_ATOL)}
    assert not bad, f"logits or loss differ from llmcourse's (max |Δ logits|, |Δ loss|): {bad}"
    log("max |Δ logits| vs llmcourse: " + ", ".join(f"{k} {v[0]:.1e}" for k, v in diffs.items() if k != "llmcourse"))
    steps_fn = {name: _make_step(name, m, cfg.bias_update_speed) for name, m in models.items()}
    # a variant that cannot run a training step here (e.g. a kernel without a CPU backward) is reported, not timed;
    # one whose first step takes over SLOW_FACTOR× llmcourse's (batched_mm gathers a (2I, D) weight matrix per
    # token-expert pair: 0.5 GB per projection at B=32, T=64) gets 1 warm-up step and is timed after the rounds
    first, slow = {}, []
    for name in list(steps_fn):
        try:
            first[name] = steps_fn[name](x, y)
            n_more = warmup - 1
            if name != "llmcourse" and first[name] > SLOW_FACTOR * first["llmcourse"]:
                slow.append(name)
                n_more = 0
            for _ in range(n_more):
                steps_fn[name](x, y)
        except Exception as err:   # noqa: BLE001
            if name == "llmcourse":
                raise
            failed[name] = f"{type(err).__name__}: {err}"
            del steps_fn[name], models[name]
    # the slow variants run after the interleaved rounds of the others: a batched_mm step maps and frees gigabytes,
    # which would slow whichever implementation happens to follow it in a round
    order = [k for k in steps_fn if k not in slow]
    times = interleaved_times(
        {k: partial(steps_fn[k], x, y) for k in order}, rounds, steps,
        lambda r, t: log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {1000 * statistics.median(v):.1f} ms"
                                                                  for k, v in t.items())))
    for k in slow:
        times[k] = [steps_fn[k](x, y) for _ in range(rounds)]
        log(f"{k} (slow): {1000 * statistics.median(times[k]):.1f} ms")
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    hf = {k: v for k, v in ms.items() if k != "llmcourse"}
    if not hf:
        raise RuntimeError(f"no transformers variant could run a training step: {failed}")
    fastest = min(hf, key=hf.get)
    counts = param_counts(models["llmcourse"])
    return {"config": {"name": config, **cfg.to_dict()}, "batch_size": batch_size, "seq_len": seq_len,
            "parameters": counts, "rounds": rounds, "steps_per_round": steps, "warmup": warmup,
            "threads": torch.get_num_threads(), "ms_per_step": ms,
            "tokens_per_s": {k: batch_size * seq_len / (v / 1000) for k, v in ms.items()},
            "fastest_transformers": fastest, "ratio": hf[fastest] / ms["llmcourse"],
            "max_abs_logits_diff": {k: v[0] for k, v in diffs.items()},
            "abs_loss_diff": {k: v[1] for k, v in diffs.items()},
            "unavailable": failed, "slow": slow, "step_seconds": times, "env": _environment()}


# ------------------------------------------------------------------------------------------------ part 2


def _gpt2_cached_logits(model, idx, cache):
    """GPT-2 (:class:`~llmcourse.models.gpt2.GPT2Model`) forward on new tokens ``idx (B, T)`` continuing ``cache``:
    per layer the new keys and values ``(B, H, T, hd)`` are appended to unit 12's ``KVCache`` and the queries attend
    to every cached position (bottom-right causal mask). Returns logits ``(B, T, V)``."""
    import torch
    import torch.nn.functional as F

    start, t = cache.seq_len, idx.shape[1]
    b = idx.shape[0]
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(start, start + t))
    for i, blk in enumerate(model.blocks):
        a = blk.attn
        h = blk.norm1(x)
        q, k, v = a._split(a.W_query(h)), a._split(a.W_key(h)), a._split(a.W_value(h))
        k, v = cache.update(i, k, v)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=a.causal_mask[start:start + t, :start + t])
        x = x + a.out_proj(o.transpose(1, 2).reshape(b, t, a.d_out))
        x = x + blk.ffn(blk.norm2(x))
    return model.lm_head(model.final_norm(x))


def _greedy_with_cache(forward, cache, idx, n: int):
    """One prefill call, then ``n − 1`` one-token calls; returns ``(tokens (B, T0 + n), cache)``."""
    import torch

    out = [idx]
    logits = forward(idx, cache)
    for s in range(n):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        if s < n - 1:
            logits = forward(nxt, cache)
    return torch.cat(out, dim=1), cache


def cache_bytes_table(new_tokens: int = 24, prompt: str = "ROMEO:\nWhat light") -> list[dict]:
    """Part 2: one row per course model with the measured and the formula bytes per generated token.

    Raises:
        AssertionError: a measured size differs from its formula, or cached tokens differ from uncached greedy ones.
    """
    import torch

    from llmcourse.models.deepseek import generate_latent_cached, greedy_uncached
    from llmcourse.models.llama3_cached import CachedLlama3Model, generate_cached
    from llmcourse.nn.kv_cache import KVCache
    from llmcourse.train.char_model import load_gpt_char_tiny
    from llmcourse.train.deepseek_char import load_deepseek_char_tiny
    from llmcourse.train.llama_char import load_llama_char_tiny

    rows = []
    with torch.no_grad():
        gpt, tok = load_gpt_char_tiny(retrain=False, verbose=False)
        idx = torch.tensor([tok.encode(prompt)])
        ref = greedy_uncached(gpt, idx, new_tokens)
        got, cache = _greedy_with_cache(lambda i, c: _gpt2_cached_logits(gpt, i, c), KVCache(len(gpt.blocks)), idx,
                                        new_tokens)
        c = gpt.cfg
        rows.append(_row("gpt2-char-tiny (GPT-2, MHA)", cache, idx.shape[0], got, ref, 2 * c.n_layers * c.d_model * 4,
                         f"2·L·D·4 = 2·{c.n_layers}·{c.d_model}·4"))

        llama, tok = load_llama_char_tiny(retrain=False, verbose=False)
        cached = CachedLlama3Model(llama.cfg)
        cached.load_state_dict(llama.state_dict())
        cached.eval()
        idx = torch.tensor([tok.encode(prompt)])
        ref = greedy_uncached(llama, idx, new_tokens)
        assert torch.equal(generate_cached(cached, idx, new_tokens), ref), "llama3: generate_cached != uncached greedy"
        got, cache = _greedy_with_cache(lambda i, c_: cached(i, cache=c_), cached.new_cache(), idx, new_tokens)
        c = llama.cfg
        hd = c.d_model // c.n_heads if getattr(c, "head_dim", None) is None else c.head_dim
        rows.append(_row("llama3-tiny (Llama 3, GQA)", cache, idx.shape[0], got, ref, 2 * c.n_layers * c.n_kv_heads * hd * 4,
                         f"2·L·KV·hd·4 = 2·{c.n_layers}·{c.n_kv_heads}·{hd}·4"))

        ds, tok = load_deepseek_char_tiny(retrain=False, verbose=False)
        idx = torch.tensor([tok.encode(prompt)])
        ref = greedy_uncached(ds, idx, new_tokens)
        got, cache = generate_latent_cached(ds, idx, new_tokens)
        c = ds.cfg
        rows.append(_row("DeepSeek-tiny (MLA)", cache, idx.shape[0], got, ref,
                         c.n_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 4,
                         f"L·(d_c + d_R)·4 = {c.n_layers}·({c.kv_lora_rank} + {c.qk_rope_head_dim})·4"))
    return rows


def _row(name, cache, batch, got, ref, formula: int, how: str) -> dict:
    import torch

    assert torch.equal(got, ref), f"{name}: cached greedy tokens differ from uncached greedy tokens"
    positions = cache.seq_len
    measured = cache.nbytes() / (positions * batch)
    assert measured == formula, f"{name}: {measured:g} bytes per token in the cache, formula {how} = {formula}"
    return {"model": name, "cached_positions": positions, "cache_nbytes": cache.nbytes(),
            "bytes_per_token": measured, "formula_bytes": formula, "formula": how}


# ------------------------------------------------------------------------------------------------ output


def summary_line(results: dict) -> str:
    return f"capstone: ratio vs transformers: {results['ratio']:.2f}"


def markdown(results: dict) -> str:
    c = results["config"]
    p = results["parameters"]
    lines = [f"## Capstone training step: DeepSeek-tiny (B={results['batch_size']}, T={results['seq_len']})", "",
             f"Main path only (no MTP): V {c['vocab_size']}, D {c['d_model']}, {c['n_layers']} layers "
             f"({c['first_k_dense_replace']} dense), MLA d_c {c['kv_lora_rank']} d_R {c['qk_rope_head_dim']}, "
             f"{c['n_routed_experts']} routed experts top-{c['num_experts_per_tok']} + {c['n_shared_experts']} shared; "
             f"{p['total']:,} parameters ({p['active']:,} active per token); float32, CPU, "
             f"{results['threads']} threads. Step = forward, cross-entropy outside the model, backward, AdamW, "
             "zero_grad; the router-bias update runs after each step, untimed.", "",
             "| implementation | ms/step | tokens/s | max abs diff of logits vs llmcourse |", "|---|---:|---:|---:|"]
    for k, v in sorted(results["ms_per_step"].items(), key=lambda kv: kv[1]):
        label = "llmcourse DeepSeekLM" if k == "llmcourse" else \
            "transformers DeepseekV3ForCausalLM (attention {}, experts {})".format(*k.split("-", 2)[1:])
        if k in results.get("slow", ()):
            label += f" (over {SLOW_FACTOR:g}× slower at warm-up: timed after the rounds, one step per round)"
        lines.append(f"| {label} | {v:.1f} | {results['tokens_per_s'][k]:,.0f} | "
                     f"{results['max_abs_logits_diff'][k]:.1e} |")
    for k, why in results["unavailable"].items():
        lines.append(f"| {k} | not available here | | {why[:120]} |")
    lines += ["", f"Fastest transformers variant: {results['fastest_transformers']}; ratio = its ms ÷ llmcourse's ms. "
              f"Median of {results['rounds']}×{results['steps_per_round']} timed steps per implementation after "
              f"{results['warmup']} warm-up steps, interleaved step by step over {results['rounds']} rounds. "
              f"torch {results['env']['torch']}, transformers {results['env']['transformers']}; "
              f"{results['env']['cpu_count']} CPUs ({results['env']['machine']})."]
    if results.get("cache_bytes"):
        lines += ["", "### Cache bytes per generated token (float32, read from each model's cache object)", "",
                  "| model | cached positions | cache bytes | bytes per token | formula |", "|---|---:|---:|---:|---|"]
        for r in results["cache_bytes"]:
            lines.append(f"| {r['model']} | {r['cached_positions']} | {r['cache_nbytes']:,} | "
                         f"{r['bytes_per_token']:,.0f} | {r['formula']} = {r['formula_bytes']:,} |")
        lines.append("")
        lines.append("Every measured size equals its formula; every cached generation equals uncached greedy decoding.")
    lines += ["", summary_line(results)]
    return "\n".join(lines)


def plot(results: dict, path) -> None:
    """Horizontal bars: ms/step per implementation."""
    from matplotlib.figure import Figure

    items = sorted(results["ms_per_step"].items(), key=lambda kv: kv[1])
    fig = Figure(figsize=(7.5, 0.45 * len(items) + 1.2), layout="constrained")
    ax = fig.subplots()
    ax.barh([k for k, _ in items], [v for _, v in items],
            color=["tab:orange" if k == "llmcourse" else "tab:blue" for k, _ in items])
    ax.invert_yaxis()
    ax.set_xlabel("ms per training step (median)")
    ax.set_title(f"DeepSeek-tiny training step, B={results['batch_size']}, T={results['seq_len']}")
    fig.savefig(path, dpi=110)


def run(args) -> int:
    """``course bench capstone``."""

    import torch

    from . import write_outputs

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        results = run_capstone_bench(args.config, args.batch_size, args.seq_len, args.rounds, args.steps, args.warmup,
                                     args.seed)
        results["cache_bytes"] = [] if args.no_cache_bytes else cache_bytes_table(args.new_tokens)
    except AssertionError as err:
        print(f"course bench capstone: {err}")
        return 1
    write_outputs("capstone", results, markdown(results), args.out, None if args.no_plot else plot)
    return 0
