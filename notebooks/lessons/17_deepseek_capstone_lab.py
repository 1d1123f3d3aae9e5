# %% [markdown]
# # Unit 17 lab — the three-way comparison on TinyStories
#
# **Expected time**: about 15 minutes on an idle 2-core laptop under the `laptop` profile (three models, two
# seeds, plus a shorter DeepSeek run without the bias update); under `ci` a smoke run of a few steps of the same
# code (well under a minute). A step here costs more than in the lesson (a vocabulary of thousands of tokens, a
# longer context), and a token is several characters: the number of characters of text each run reads is printed
# below, to compare with the lesson's character-level runs.
#
# The lesson compared a GPT-2-style, a Llama-style and a DeepSeek-style model on Shakespeare's characters. This
# lab repeats the comparison on **subword tokens**: the TinyStories sample of unit 10's lab, tokenized with GPT-2's
# byte-level BPE and a **compacted** vocabulary (unit 07's method: only the GPT-2 ids that occur in the training
# stories get a row). The three models keep their tiny trunks and only change their vocabulary
# (and context), so the comparison asks the same question on a more realistic kind of data:
#
# * **identical batches and token budgets**: the library's `compare_models` draws step `s`'s batch with a generator
#   seeded `seed + s` for every model, uses the same schedule, optimizer and clipping, and trains DeepSeek with its
#   `train_step` (MTP loss, then the router-bias update after the optimizer step);
# * **longer runs** than the lesson's (in time and in characters of text read), and **a second seed**, so that we
#   can see how much of a gap between two models is just the run-to-run noise;
# * one thing is new: with a vocabulary of thousands of tokens the **embedding** (tied to the output head) becomes
#   the largest single matrix of every model. We count it, and say what it does to the comparison.
#
# Every number in the discussion is printed by the notebook from this run.

# %%
import dataclasses
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import llmcourse
from llmcourse.data import corpus as C
from llmcourse.models import GPT2Config, GPT2Model, Llama3Config, Llama3Model
from llmcourse.models.deepseek import (
    DeepSeekConfig,
    DeepSeekLM,
    cache_elems_per_token,
    compare_models,
    forward_time_breakdown,
    generate_latent_cached,
    greedy_uncached,
    model_logits,
    param_counts,
)
from llmcourse.train.schedules import warmup_cosine_lr
from llmcourse.viz import capstone as viz

cfg = llmcourse.setup_notebook("17")
torch.set_num_threads(cfg["lab_torch_threads"])
STEPS, B, T = cfg["lab_steps"], cfg["lab_batch_size"], cfg["lab_context_length"]
SEEDS = list(range(cfg["seed"], cfg["seed"] + cfg["lab_seeds"]))
print({k: cfg[k] for k in cfg if k.startswith("lab_")})

# %% [markdown]
# ## The data
#
# `tinystories_corpus()` splits the file into stories, repairs a few mis-decoded quotes, appends `<|endoftext|>` to
# each story, encodes with GPT-2's BPE and renumbers the GPT-2 ids seen in the training stories (a few low ids are
# reserved; an id never seen in training becomes `[UNK]`). The last stories of the file validate.

# %%
ts = C.tinystories_corpus()
tok = ts.tokenizer
V = tok.vocab_size
print(f"{ts.n_tokens:,} GPT-2 tokens; train {ts.train.numel():,}, validation {ts.val.numel():,}")
print(f"compact vocabulary V = {V:,} (of GPT-2's {tok.enc.n_vocab:,}); validation tokens unseen in training: "
      f"{(ts.val == tok.UNK).float().mean():.2%}")
tokens_per_step = B * T
passes = STEPS * tokens_per_step / ts.train.numel()
chars_per_token = ts.n_chars / ts.n_tokens
print(f"each model sees {STEPS:,} steps × {B} × {T} = {STEPS * tokens_per_step:,} tokens per seed "
      f"= {passes:.2f} passes over the training stories; at {chars_per_token:.2f} characters per token that is about "
      f"{STEPS * tokens_per_step * chars_per_token:,.0f} characters of text")

# %% [markdown]
# ## The three models, and where their parameters are
#
# The lesson's three configurations with the compact vocabulary (and a context that fits the lab's windows). The
# head is tied to the token embedding in all three, so the vocabulary costs `V × D` parameters once. We count, from
# the built models: total and active parameters (active = what one token uses: DeepSeek's router picks `k` of its
# `E` routed experts per MoE layer), the share of the active parameters that is the embedding, and the cached
# elements per generated token.

# %%
def build_models(seed):
    """The three models with vocabulary V, built from one seed (the same seed gives the same initial weights)."""
    torch.manual_seed(seed)
    gpt = GPT2Model(dataclasses.replace(GPT2Config.preset("gpt2-char-tiny"), vocab_size=V, context_length=T))
    llama = Llama3Model(dataclasses.replace(Llama3Config.preset("llama3-tiny"), vocab_size=V,
                                            context_length=max(T, 256)))
    deepseek = DeepSeekLM(DeepSeekConfig(vocab_size=V, context_length=max(T, 256)))
    return {"gpt2-tiny": gpt, "llama3-tiny": llama, "deepseek-tiny": deepseek}


def mtp_params(model):
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp."))


accounting = {}
for name, m in build_models(SEEDS[0]).items():
    c = param_counts(m)
    emb = m.cfg.vocab_size * m.cfg.d_model
    accounting[name] = {"total": c["total"], "active": c["active"], "embedding": emb,
                        "trunk_active": c["active"] - emb, "mtp": mtp_params(m), "cache": cache_elems_per_token(m)}
    a = accounting[name]
    print(f"{name:>14}: total {a['total']:>9,}  active {a['active']:>9,}  embedding (= tied head) {emb:>9,} "
          f"= {emb / a['active']:.0%} of active  non-embedding active {a['trunk_active']:>9,}  "
          f"cache elements/token {a['cache']:,}")
print(f"DeepSeek's MTP module (training only, not counted above): {accounting['deepseek-tiny']['mtp']:,} parameters")
act = [a["active"] for a in accounting.values()]
trunk = [a["trunk_active"] for a in accounting.values()]
print(f"active counts: largest / smallest = {max(act) / min(act):.2f}; without the embedding: "
      f"{max(trunk) / min(trunk):.2f}")

# %% [markdown]
# What this means for the comparison:
#
# * the models have similar **active** counts (the ratio of the largest to the smallest is printed), which is the
#   fair match; DeepSeek's **total** is larger because it stores `E` routed experts per MoE layer and uses `k` of
#   them per token;
# * the embedding is the same `V × D` matrix in all three and a large share of every active count (printed above):
#   the part in which the architectures differ — attention, feed-forward or experts, norms — is the rest, so the
#   matching is really a matching of the non-embedding parts, whose ratio is printed on the last line;
# * the output head is a `D × V` matrix multiplication for every position, the same for all three models, and
#   DeepSeek's MTP module runs that head a second time during training. A rough count of multiply-adds per token
#   (one per active weight, attention scores ignored) shows how much of each step is the head:

# %%
for name, a in accounting.items():
    heads = 2 if name == "deepseek-tiny" else 1
    mtp_trunk = a["mtp"] if name == "deepseek-tiny" else 0
    head_share = heads * a["embedding"] / (heads * a["embedding"] + a["trunk_active"] + mtp_trunk)
    print(f"{name:>14}: output head(s) ≈ {head_share:.0%} of the weight multiply-adds of a forward pass")

# %% [markdown]
# In the character-level lesson the head was a tiny matrix; here it is a large cost that every model pays at every
# position, and DeepSeek pays it twice while training (its MTP module has its own pass through the head). These are
# rough counts; the measured ms/step in the table below is the real answer.
#
# ## Training on identical batches
#
# For each seed: the three models are built from that seed, then `compare_models` trains them one after the other
# on the same batches (step `s` uses the generator seeded `batch_seed + s`; each seed has its own, far-apart
# `batch_seed`, so the second seed changes both the initial weights and the order of the batches), with warm-up plus
# cosine decay of the learning rate. A callback records every step's training loss (DeepSeek's next-token loss, and its MTP loss separately), the
# expert-load imbalance (max/mean of each MoE layer's loads, averaged over the layers) and, every `lab_eval_every`
# steps, the validation loss on a fixed set of validation batches — the ones `compare_models` itself scores at the
# end (generators `10_000 + i`), so the last point of each curve must equal the table's value.

# %%
def batch_seed(seed):
    return 100_000 * (seed + 1)


def lr_fn(s):
    return warmup_cosine_lr(s, cfg["max_lr"], cfg["min_lr"], cfg["lab_warmup_steps"], STEPS)


val_batches = [C.get_batch(ts.val, B, T, torch.Generator().manual_seed(10_000 + i))
               for i in range(cfg["lab_eval_batches"])]


def val_loss(model):
    """Mean validation loss over `val_batches` (called during training: back to train mode afterwards)."""
    model.train(False)
    with torch.no_grad():
        per_batch = [F.cross_entropy(model_logits(model, xv).flatten(0, 1), yv.flatten()).item()
                     for xv, yv in val_batches]
    model.train(True)
    return sum(per_batch) / len(per_batch)


def imbalance_of(loads):
    lo = torch.stack(loads).float()
    return float((lo.max(1).values / lo.mean(1)).mean())


def make_recorder(models, log):
    def on_step(name, step, r):
        log["train"][name].append(r.get("loss_main", r["loss"]))
        if "expert_load" in r:
            log["mtp"].append(r["loss_mtp"][0])
            log["imbalance"].append(imbalance_of(r["expert_load"]))
        if (step + 1) % cfg["lab_eval_every"] == 0 or step + 1 == STEPS:
            log["val"][name].append(((step + 1) * tokens_per_step, val_loss(models[name])))
    return on_step


runs = {}
for seed in SEEDS:
    models = build_models(seed)
    log = {"train": {n: [] for n in models}, "val": {n: [] for n in models}, "mtp": [], "imbalance": []}
    t0 = time.perf_counter()
    rows = compare_models(models, ts.train, ts.val, STEPS, B, T, lr_fn, seed=batch_seed(seed),
                          eval_batches=cfg["lab_eval_batches"], on_step=make_recorder(models, log), progress=True)
    runs[seed] = {"models": models, "rows": rows, "log": log, "seconds": time.perf_counter() - t0}
    print(f"seed {seed}: 3 models × {STEPS} steps in {runs[seed]['seconds'] / 60:.1f} min")
    for r in rows:
        assert math.isclose(r["val_loss"], log["val"][r["name"]][-1][1], rel_tol=1e-5), r["name"]

# %% [markdown]
# The DeepSeek model once more, from the first seed and on the same batches, with the bias update switched off
# (`bias_update_speed = 0`), for a shorter run: how unevenly do the experts get used without it?

# %%
torch.manual_seed(SEEDS[0])
no_bias = DeepSeekLM(DeepSeekConfig(vocab_size=V, context_length=max(T, 256), bias_update_speed=0.0))
off = []
compare_models({"deepseek, no bias update": no_bias}, ts.train, ts.val, cfg["lab_nobias_steps"], B, T, lr_fn,
               seed=batch_seed(SEEDS[0]), eval_batches=1,
               on_step=lambda name, step, r: off.append(imbalance_of(r["expert_load"])), progress=True)
k = cfg["lab_nobias_steps"]
on = runs[SEEDS[0]]["log"]["imbalance"][:k]
print(f"expert load max/mean over the first {k} steps: {sum(on) / k:.2f} with the bias update, "
      f"{sum(off) / k:.2f} without")
late = runs[SEEDS[0]]["log"]["imbalance"][-k:]
print(f"with the bias update over the last {len(late)} steps of the full run: {sum(late) / len(late):.2f} "
      f"(1.00 = perfectly even)")

# %% [markdown]
# ## Curves
#
# The lesson's dashboard for the first seed (training losses on a shared token axis, DeepSeek's MTP loss, the
# expert-load imbalance with and without the bias update, ms/step), then the validation losses of every seed on
# the same token axis.

# %%
first = runs[SEEDS[0]]
curves = dict(first["log"]["train"]) | {"mtp": first["log"]["mtp"]}
ms = {r["name"]: r["ms_per_step"] for r in first["rows"]}
viz.show_capstone_dashboard(curves, {"bias update on": first["log"]["imbalance"], "bias update off": off}, ms,
                            tokens_per_step)

# %%
colors = {"gpt2-tiny": "#2e7d32", "llama3-tiny": "#1565c0", "deepseek-tiny": "#ef6c00"}
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.8))
window = max(1, STEPS // 20)
for name, ys in first["log"]["train"].items():
    ax1.plot([tokens_per_step * (s + 1) for s in range(len(ys))], viz.smooth(ys, window), color=colors[name],
             alpha=0.5, lw=1, label=f"{name} train (mean of {window} steps, seed {SEEDS[0]})")
for i, seed in enumerate(SEEDS):
    for name, pts in runs[seed]["log"]["val"].items():
        ax1.plot(*zip(*pts), marker="o", ms=3, color=colors[name], ls="-" if i == 0 else ":",
                 label=f"{name} validation, seed {seed}")
        ax2.plot(*zip(*pts), marker="o", ms=3, color=colors[name], ls="-" if i == 0 else ":",
                 label=f"{name}, seed {seed}")
ax1.set_xlabel("tokens seen")
ax1.set_ylabel("loss (nats/token)")
ax1.legend(fontsize=7)
ax2.set_xlabel("tokens seen")
ax2.set_ylabel("validation loss (nats/token)")
tail = [v for s in SEEDS for pts in runs[s]["log"]["val"].values() for _, v in pts[len(pts) // 2:]]
ax2.set_ylim(min(tail) - 0.05, max(tail) + 0.05)
ax2.set_title("second half of the runs, zoomed in", fontsize=9)
ax2.legend(fontsize=7)
plt.show()

# %% [markdown]
# ## The table
#
# The comparison rows of the first seed (the lesson's table widget), then the validation losses of every seed.

# %%
viz.show_comparison_table(first["rows"])

# %%
names = [r["name"] for r in first["rows"]]
final = {seed: {r["name"]: r["val_loss"] for r in runs[seed]["rows"]} for seed in SEEDS}
print(f"{'model':>14} {'total':>10} {'active':>10} {'ms/step':>8} {'cache/token':>12}  "
      + "  ".join(f"val seed {s}" for s in SEEDS))
for r in first["rows"]:
    print(f"{r['name']:>14} {r['total_params']:>10,} {r['active_params']:>10,} {r['ms_per_step']:>8.0f} "
          f"{r['cache_elems_per_token']:>12,}  " + "  ".join(f"{final[s][r['name']]:>10.3f}" for s in SEEDS))
gaps = {s: max(final[s].values()) - min(final[s].values()) for s in SEEDS}
order = {s: sorted(final[s], key=final[s].get) for s in SEEDS}
for s in SEEDS:
    print(f"seed {s}: spread between the models {gaps[s]:.3f} nats; order from best: {' < '.join(order[s])}")
if len(SEEDS) > 1:
    seed_noise = max(max(final[s][n] for s in SEEDS) - min(final[s][n] for s in SEEDS) for n in names)
    print(f"largest change of one model's validation loss between seeds: {seed_noise:.3f} nats; "
          f"same order in every seed: {all(order[s] == order[SEEDS[0]] for s in SEEDS)}")
train_end = {n: sum(first["log"]["train"][n][-window:]) / window for n in names}
print("last-steps training loss minus final validation loss (seed "
      f"{SEEDS[0]}): " + ", ".join(f"{n} {train_end[n] - final[SEEDS[0]][n]:+.3f}" for n in names))
slow = max(first["rows"], key=lambda r: r["ms_per_step"])
fast = min(first["rows"], key=lambda r: r["ms_per_step"])
print(f"slowest per step: {slow['name']} ({slow['ms_per_step'] / fast['ms_per_step']:.2f}× the fastest, "
      f"{fast['name']})")

# %% [markdown]
# Where does DeepSeek's time go? One forward pass of the trained model on a validation batch (with targets, so the
# MTP module runs as in training), every operator's CPU time attributed to the part that ran it (timings of this
# machine):

# %%
parts = forward_time_breakdown(first["models"]["deepseek-tiny"].eval(), *val_batches[0])
for part, ms_part in parts.items():
    if part != "total":
        print(f"{part:>42}: {ms_part:7.1f} ms ({ms_part / parts['total']:5.1%})")

# %% [markdown]
# ## Samples
#
# Greedy continuations of the same prompt by each trained model (first seed): DeepSeek decodes with its **latent**
# cache (one call on the prompt, then one call per token), the two baselines without a cache. We check the cached
# DeepSeek tokens against decoding without a cache and read the cache's memory from the cache object.

# %%
prompt = "Once upon a time"
n_new = min(cfg["lab_gen_tokens"], T - len(tok.encode(prompt)))
trained = first["models"]
for m in trained.values():
    m.eval()
record = viz.generation_record(trained, tok, prompt, n_new, context_length=T)
for name, text in record["text"].items():
    print(f"--- {name}\n{prompt}{text}\n")
ids = torch.tensor([tok.encode(prompt)])
tokens, cache = generate_latent_cached(trained["deepseek-tiny"], ids, n_new)
print("DeepSeek: latent-cached tokens equal uncached greedy decoding:",
      torch.equal(tokens, greedy_uncached(trained["deepseek-tiny"], ids, n_new)))
print(f"cache holding {cache.seq_len} positions: {cache.nbytes():,} bytes = {cache.nbytes() // cache.seq_len} bytes "
      f"per position; the baselines would hold " + ", ".join(
          f"{n} {b} B" for n, b in record["bytes_per_token"].items() if n != "deepseek-tiny") + " per position")

# %%
viz.show_generation_panel(trained, tok, record, n_new, context_length=T)

# %% [markdown]
# ## What the numbers say — and what they do not
#
# Read the printed lines above, not a story about architectures:
#
# * **The gap between the models against the noise.** With more than one seed, compare the spread between the
#   models with the largest change of a single model between seeds, and check whether the order is the same in
#   every seed. A gap smaller than the seed-to-seed change, or an order that flips, is not a result. Even a stable
#   order at this size says little about large models: these are tiny trunks under a large shared embedding, on a
#   small corpus, for a short run.
# * **Memorisation.** The number of passes over the training stories printed at the top, and the train-minus-
#   validation line of the table, say whether the later steps still buy generalisation; a model that fits the
#   training stories faster can look better or worse depending on where the run stops.
# * **Speed.** The slowest model per step and its ratio to the fastest are printed under the table. When it is
#   DeepSeek, read the breakdown under it: the library's MoE layer has no Python loop over experts (one sort, one
#   gather, one grouped GEMM per projection, one scatter-add), but on a CPU the grouped GEMM still runs one small
#   product per expert; the shared expert, the router and the elementwise work come on top, and the MTP module
#   adds a block and a second pass through the large output head. Matching the active parameters does not make a
#   step as cheap on a CPU.
# * **What holds at every scale** is the accounting: total vs active parameters, and the cache per token — MLA's
#   latent cache is the smallest of the three, read from the cache object itself.
