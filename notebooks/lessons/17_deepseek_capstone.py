# %% [markdown]
# # Unit 17 — Capstone: a tiny DeepSeek-style model
#
# Every piece of a DeepSeek-V3-style model is now in the course library. This lesson puts them together into one
# small language model, checks it against `transformers`' implementation, trains it on Shakespeare next to the
# GPT-2 and Llama models of earlier units **on identical batches**, generates with the latent cache and runs it in
# FP8. The plan:
#
# 1. the architecture map: which unit supplies which part;
# 2. the block and the model;
# 3. parity with `transformers`' `DeepseekV3ForCausalLM` (weight conversion);
# 4. parameter accounting: total vs active; cache elements per token;
# 5. the training step: MTP loss, clipping, optimizer step, router-bias update;
# 6. the three-way comparison, measured honestly;
# 7. generation with the latent cache, inside the context the model was trained on;
# 8. FP8 inference;
# 9. what transfers from tiny scale, and what does not.
#
# The exercise notebook (`exercises/17_deepseek_capstone/17_deepseek_capstone.ipynb`) asks you to write the
# model, the cached generator, the training step, the comparison and the FP8 evaluation yourself; here we use the
# finished versions from `llmcourse.models.deepseek`.

# %%
import math
import time

import torch
import torch.nn.functional as F

import llmcourse
from llmcourse.data.corpus import char_corpus, get_batch
from llmcourse.models import GPT2Config, GPT2Model, Llama3Config, Llama3Model
from llmcourse.models.deepseek import (
    DeepSeekConfig,
    DeepSeekLM,
    cache_elems_per_token,
    compare_models,
    deepseek_param_breakdown,
    forward_time_breakdown,
    fp8_eval,
    generate_latent_cached,
    greedy_uncached,
    mtp_step_cost,
    param_counts,
    train_step,
    train_step_flops,
)
from llmcourse.train.deepseek_char import load_deepseek_char_tiny
from llmcourse.train.schedules import warmup_cosine_lr
from llmcourse.viz import capstone as viz

cfg = llmcourse.setup_notebook("17")
corpus = char_corpus("tinyshakespeare")
print(f"vocabulary {corpus.vocab_size}, train {len(corpus.train):,} and validation {len(corpus.val):,} characters")

# %% [markdown]
# ## 1. The architecture map
#
# | part | unit | DeepSeek-V3 name |
# |---|---|---|
# | RMSNorm, SwiGLU feed-forward, RoPE tables | 11 | `input_layernorm`, `mlp.{gate,up,down}_proj` |
# | multi-head latent attention with decoupled RoPE, latent cache | 13 | `self_attn.{q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}` |
# | DeepSeekMoE: shared + routed experts, sigmoid group-limited routing, bias balancing | 14 | `mlp.gate`, `mlp.experts.{e}`, `mlp.shared_experts` |
# | multi-token prediction module | 15 | `mtp.{k}.{enorm, hnorm, eh_proj, mtp_block, post_norm}` |
# | FP8 linear layers | 16 | — |
# | seeded batches, AdamW groups, schedule | 10 | — |
#
# The configuration mirrors `transformers`' `DeepseekV3Config` field by field (hidden size, latent rank, rope
# and non-rope head widths, experts, groups, the number of dense layers before the MoE layers).

# %%
ds_cfg = DeepSeekConfig()
for field, value in ds_cfg.to_dict().items():
    print(f"{field:>24} = {value}")

# %% [markdown]
# ## 2. The block and the model
#
# A block is pre-norm: `x + attention(norm(x))`, then `x + ffn(norm(x))`. The first `first_k_dense_replace` blocks
# use a dense SwiGLU feed-forward; the rest use DeepSeekMoE. Why dense first layers: the DeepSeekMoE paper kept
# its first layer dense because the load balance of a first-layer MoE converged slowly during training;
# DeepSeek-V3 keeps its first three layers dense (`first_k_dense_replace = 3`); our tiny model keeps one. The
# model is an embedding, the blocks, a final RMSNorm and a head tied to the embedding, plus one MTP module (used
# by the training loss only). Its block is a **dense** block: a simplification. DeepSeek-V3's MTP module holds
# a full block of the main model's later kind, MoE feed-forward included (its checkpoint stores routed and shared
# experts under the MTP layer), which we skip to keep the tiny model's extra cost small.

# %%
torch.manual_seed(0)
model = DeepSeekLM(ds_cfg)
print(model.layers[0].mlp.__class__.__name__, "in layer 0;", model.layers[1].mlp.__class__.__name__, "in layer 1")
print("state_dict keys of the MoE layer 1 (first few):",
      [k for k in model.state_dict() if k.startswith("layers.1.")][:8])
print("router biases are buffers:", [n for n, _ in model.named_buffers() if "bias" in n])

# %% [markdown]
# ## 3. Parity with `transformers`
#
# `transformers`' `DeepseekV3ForCausalLM` has the same layer names under a `model.` prefix, with one difference:
# it stores each MoE layer's experts **fused** — `gate_up_proj` of shape `(E, 2I, D)` whose first `I` rows are the
# gate projection and the next `I` the up projection, and `down_proj` of shape `(E, D, I)`. We build its model
# from the same configuration with random weights, convert the state dict and compare the logits.

# %%
from llmcourse.models.deepseek import load_hf_deepseek, random_hf_deepseek  # noqa: E402

hf = random_hf_deepseek(ds_cfg, seed=0)
ours = load_hf_deepseek(DeepSeekLM(ds_cfg), hf.state_dict()).eval()
ids = torch.randint(0, ds_cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    diff = (ours(ids)["logits"] - hf(ids).logits).abs().max().item()
print(f"largest logit difference vs DeepseekV3ForCausalLM: {diff:.2e}")
assert diff < 1e-4

# %% [markdown]
# **Spot the bug.** Swap the two halves of the fused expert tensor while converting and the model still loads
# without complaint — every shape matches — but it computes something else:

# %%
swapped = {k: (torch.cat([v[:, v.shape[1] // 2:], v[:, :v.shape[1] // 2]], 1) if k.endswith("gate_up_proj") else v)
           for k, v in hf.state_dict().items()}
wrong = load_hf_deepseek(DeepSeekLM(ds_cfg), swapped).eval()
with torch.no_grad():
    print(f"with swapped halves: {(wrong(ids)['logits'] - hf(ids).logits).abs().max().item():.3f}")

# %% [markdown]
# **Your fix.** Rewrite `unswap` so that it turns `swapped` back into the original fused tensors (the gate rows
# first), then run the self-check.

# %%
def unswap(state):
    # TODO: put the gate rows back in front of the up rows of every gate_up_proj
    return dict(state)


def self_check_unswap(fn=None):
    fn = fn or unswap
    with torch.no_grad():
        got = load_hf_deepseek(DeepSeekLM(ds_cfg), fn(swapped)).eval()(ids)["logits"]
    ok = (got - hf(ids).logits).abs().max().item() < 1e-4
    print("✓ the converted model matches transformers again" if ok else "✗ not yet: the logits still differ")
    return ok


self_check_unswap();

# %% jupyter={"source_hidden": true}
# Reference fix: the second half of the swapped rows is the gate; move it back in front.
def unswap_reference(state):
    return {k: (torch.cat([v[:, v.shape[1] // 2:], v[:, :v.shape[1] // 2]], 1) if k.endswith("gate_up_proj") else v)
            for k, v in state.items()}


self_check_unswap(unswap_reference);

# %% [markdown]
# ## 4. Parameter accounting
#
# A mixture-of-experts model has **total** parameters (everything stored) and **active** parameters (what one token
# uses; which parts of an MoE layer count is the exercise's decision). Comparing
# an MoE model's total with a dense model's count, or its active count with nothing else, are both common mistakes.
# The counts below are read from the built models.

# %%
gpt = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
llama = Llama3Model(Llama3Config.preset("llama3-tiny"))
for name, m in [("gpt2-char-tiny", gpt), ("llama3-tiny", llama), ("deepseek-tiny", model)]:
    c = param_counts(m)
    print(f"{name:>15}: total {c['total']:>9,}  active {c['active']:>9,}  cache elements per token "
          f"{cache_elems_per_token(m):>5,}")
print("DeepSeek breakdown:", deepseek_param_breakdown(model))

# %% [markdown]
# The DeepSeek model stores about twice the parameters of the baselines but uses about as many per token; its
# cache per token is the smallest of the three because MLA stores one latent and one shared rope key per layer
# instead of per-head keys and values.
#
# ## 5. The training step
#
# One step: clear the gradients, compute `loss = loss_main + λ/D · Σ loss_mtp`, back-propagate, clip the global
# gradient norm, step AdamW, and **then** move each router's bias by `γ·sign(mean load − load)` using the loads of
# this step's forward pass. The bias is a buffer: the optimizer never sees it.
#
# One normalisation detail: each `loss_mtp` here is a mean over the `T − k` positions depth `k` predicts, while
# DeepSeek-V3's report writes its depth-`k` loss as a sum over those positions divided by `T`. The two differ by
# the factor `(T − k)/T`, printed below for our windows; it matters for short windows only.

# %%
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = get_batch(corpus.train, 8, 64, torch.Generator().manual_seed(0))
bias_before = model.layers[1].mlp.gate.e_score_correction_bias.clone()
rec = train_step(model, opt, x, y)
load = rec["expert_load"][0]
print(f"loss {rec['loss']:.4f} = main {rec['loss_main']:.4f} + {ds_cfg.mtp_lambda} × MTP {rec['loss_mtp'][0]:.4f}")
print("layer-1 expert loads:", load.tolist())
print("bias change        :", (model.layers[1].mlp.gate.e_score_correction_bias - bias_before).tolist())
T_win = x.shape[1]
print(f"depth-1 loss with V3's 1/T normalisation = {(T_win - 1) / T_win:.4f} × the mean over positions "
      f"(T = {T_win}): {rec['loss_mtp'][0] * (T_win - 1) / T_win:.4f}")

# %% [markdown]
# Overloaded experts went down by γ, underloaded ones up: the next batches route a little more evenly without
# any auxiliary loss term in the gradient.
#
# ### Spot the bug: a loss curve that stalls
#
# A teammate adds **gradient accumulation** to the capstone's training (each optimizer step sums the gradients of
# several smaller batches, the usual way to reach a large batch with little memory) and trains a small
# DeepSeek-style model. The log shows the symptom: the loss does not move from where it started, although the
# gradient norm it prints is far from zero and the expert-load imbalance changes. One thing in the function is
# wrong, and no comment marks it.

# %%
DIAG_CFG = dict(d_model=32, n_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                intermediate_size=64, moe_intermediate_size=16)


def train_accumulated(model, steps, micro_batches=2, batch_size=8, context_length=32, lr=3e-3, max_norm=1.0, seed=0):
    """Gradient accumulation: each optimizer step uses the summed gradients of `micro_batches` batches."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    log = {"loss": [], "grad_norm": [], "imbalance": []}
    for s in range(steps):
        step_loss = 0.0
        for mb in range(micro_batches):
            gen = torch.Generator().manual_seed(seed + s * micro_batches + mb)
            xm, ym = get_batch(corpus.train, batch_size, context_length, gen)
            out = model(xm, ym)
            (out["loss"] / micro_batches).backward()
            step_loss += out["loss_main"].item() / micro_batches
        loads = torch.stack(model.expert_loads()).float()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.zero_grad(set_to_none=True)
        opt.step()
        model.update_router_biases()
        log["loss"].append(step_loss)
        log["grad_norm"].append(float(norm))
        log["imbalance"].append(float((loads.max(1).values / loads.mean(1)).mean()))
    return log


torch.manual_seed(0)
diag_log = train_accumulated(DeepSeekLM(DeepSeekConfig(**DIAG_CFG)), cfg["diag_steps"])
for s in (0, len(diag_log["loss"]) // 2, len(diag_log["loss"]) - 1):
    print(f"step {s:>3}: loss {diag_log['loss'][s]:.3f}, gradient norm {diag_log['grad_norm'][s]:.3f}, "
          f"expert load max/mean {diag_log['imbalance'][s]:.2f}")
print(f"log(vocabulary size) = {math.log(ds_cfg.vocab_size):.3f}: the loss of a uniform guess")

# %% [markdown]
# **Your fix.** Find the bug (what does the optimizer see when it steps?) and write the repaired function below.
# The self-check trains a fresh small model with it for a few steps and checks that the loss falls.

# %%
def train_accumulated_fixed(model, steps, micro_batches=2, batch_size=8, context_length=32, lr=3e-3, max_norm=1.0,
                            seed=0):
    # TODO: copy train_accumulated here and repair it
    return train_accumulated(model, steps, micro_batches, batch_size, context_length, lr, max_norm, seed)


def self_check_accumulation(fn=None):
    fn = fn or train_accumulated_fixed
    torch.manual_seed(0)
    small = DeepSeekLM(DeepSeekConfig(**DIAG_CFG))
    before = [p.detach().clone() for p in small.parameters()]
    losses = fn(small, 12)["loss"]
    moved = any(not torch.equal(a, p.detach()) for a, p in zip(before, small.parameters()))
    drop = losses[0] - sum(losses[-3:]) / 3
    ok = moved and drop > 0.3
    print(f"✓ the weights move and the loss falls by {drop:.2f} nats in 12 steps" if ok else
          f"✗ not yet: weights changed: {moved}; loss drop over 12 steps {drop:.3f} nats (want > 0.3)")
    return ok


self_check_accumulation();

# %% jupyter={"source_hidden": true}
# Reference fix: `zero_grad` sat between the clipping and `opt.step()`, so every step found no gradients (set to
# None) and AdamW skipped every parameter: the clip had measured a real norm, and the router biases (buffers,
# updated outside the optimizer) still moved, which is why the log looked alive. The repair moves one line: clear
# the gradients once per optimizer step, before the first micro-batch's backward, and step on the accumulated sum.
# The repaired loop is the exercise's training step around an inner loop, so it is not printed here; the self-check
# runs the library's training step instead (one micro-batch of the same 16 rows per step).
def train_accumulated_reference(model, steps, micro_batches=1, batch_size=16, context_length=32, lr=3e-3,
                                max_norm=1.0, seed=0):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    return {"loss": [train_step(model, opt, *get_batch(corpus.train, batch_size, context_length,
                                                       torch.Generator().manual_seed(seed + s)), max_norm)["loss_main"]
                     for s in range(steps)]}


assert self_check_accumulation(train_accumulated_reference)

# %% [markdown]
# ## 6. The three-way comparison
#
# Three models, trained on **the same batches** (step `s` draws its batch with the generator seeded `seed + s`)
# for the same number of steps, with the same schedule and optimizer. We record every step's training loss and,
# for DeepSeek, the MTP loss and the expert-load imbalance (max/mean). A second, shorter DeepSeek run with the
# bias update switched off shows what the update buys.

# %%
torch.set_num_threads(cfg["torch_threads"])
steps, B, T = cfg["compare_steps"], cfg["batch_size"], cfg["context_length"]


def lr_fn(s):
    return warmup_cosine_lr(s, cfg["max_lr"], cfg["min_lr"], cfg["warmup_steps"], steps)


torch.manual_seed(0)
models = {"gpt2-char-tiny": GPT2Model(GPT2Config.preset("gpt2-char-tiny")),
          "llama3-tiny": Llama3Model(Llama3Config.preset("llama3-tiny")),
          "deepseek-tiny": DeepSeekLM(ds_cfg)}
curves = {name: [] for name in models} | {"mtp": []}
imbalance = {"bias update on": [], "bias update off": []}


def record(name, step, r):
    curves[name].append(r["loss_main"] if "loss_main" in r else r["loss"])
    if "expert_load" in r:
        curves["mtp"].append(r["loss_mtp"][0])
        loads = torch.stack(r["expert_load"]).float()
        imbalance["bias update on"].append(float((loads.max(1).values / loads.mean(1)).mean()))


t0 = time.perf_counter()
rows = compare_models(models, corpus.train, corpus.val, steps, B, T, lr_fn, seed=0, eval_batches=cfg["eval_batches"],
                      on_step=record, progress=True)
print(f"{steps} steps × 3 models in {time.perf_counter() - t0:.0f} s")

torch.manual_seed(0)
no_bias = DeepSeekLM(DeepSeekConfig(bias_update_speed=0.0))


def record_off(name, step, r):
    loads = torch.stack(r["expert_load"]).float()
    imbalance["bias update off"].append(float((loads.max(1).values / loads.mean(1)).mean()))


compare_models({"deepseek, no bias update": no_bias}, corpus.train, corpus.val, cfg["nobias_steps"], B, T, lr_fn, seed=0,
               eval_batches=1, on_step=record_off)
k = cfg["nobias_steps"]
on, off = imbalance["bias update on"][:k], imbalance["bias update off"][:k]
print(f"expert load max/mean over the first {k} steps: {sum(on) / k:.2f} with the bias update, "
      f"{sum(off) / k:.2f} without")

# %%
ms = {r["name"]: r["ms_per_step"] for r in rows}
viz.show_capstone_dashboard(curves, imbalance, ms, B * T)

# %%
for r in rows:
    print(f"{r['name']:>15}: val loss {r['val_loss']:.3f}, {r['ms_per_step']:.0f} ms/step, "
          f"{r['active_params']:,} active of {r['total_params']:,}")
spread = max(r["val_loss"] for r in rows) - min(r["val_loss"] for r in rows)
slowest = max(rows, key=lambda r: r["ms_per_step"])
print(f"spread of the validation losses: {spread:.3f} nats; slowest per step: {slowest['name']}")

# %% [markdown]
# How to read this table, honestly:
#
# * At this size and budget the spread printed above is not evidence about architectures: the runs are short,
#   early in training the ranking can change with the seed and the number of steps, and one seed is one sample.
#   Nothing here predicts how large models compare.
# * The MoE model is **not** faster on a CPU at this scale. The library's MoE layer dispatches once (one sort of
#   the token–expert assignments, one gather, one grouped GEMM per projection, one scatter-add): there is no
#   Python loop over experts. So where does the time go? The next cell profiles one forward pass of the trained
#   comparison model on one training batch and attributes every operator's CPU time to the part that ran it.
# * What does hold at every scale is the accounting: the cache per token (read off the table) and the active
#   parameters per token.
#
# %%
prof_x, prof_y = get_batch(corpus.train, B, T, torch.Generator().manual_seed(0))
parts = forward_time_breakdown(models["deepseek-tiny"].eval(), prof_x, prof_y)
n_moe = sum(1 for layer in models["deepseek-tiny"].layers if layer.mlp.__class__.__name__ == "DeepSeekMoE")
for part, ms_part in parts.items():
    if part != "total":
        print(f"{part:>42}: {ms_part:7.1f} ms ({ms_part / parts['total']:5.1%})")
moe_ms = sum(v for k, v in parts.items() if k.startswith("MoE")) / n_moe
print(f"one forward pass of {B}×{T} tokens: {parts['total']:.1f} ms; per MoE layer {moe_ms:.1f} ms vs "
      f"{parts['dense FFN']:.1f} ms for the dense feed-forward of layer 0 (timings of this machine, not asserted)")
print(f"rows per routed expert on average: B·T·k/E = {B * T * ds_cfg.num_experts_per_tok // ds_cfg.n_routed_experts}")

# %% [markdown]
# What the breakdown separates: the routed experts' GEMMs (on a CPU, torch's grouped GEMM still computes one matrix
# product per expert, with the rows per expert printed last, small products that run far below the CPU's peak);
# the shared expert; the router (a linear map, sigmoid, group and top-k selection); the dispatch (sort, gather,
# scatter); and the elementwise work of SwiGLU and the gate weights. Compare their sum per MoE layer with the dense
# feed-forward of layer 0, and the dispatch with the GEMMs: on this machine's numbers, which part would you
# optimise first? The MTP module, a whole extra block plus a second pass through the head, is paid on every
# training step and never at inference. MoE pays off when experts are large and spread over many accelerators,
# where each expert's GEMM is big enough to run near peak.
#
# ### The compute asymmetry: what MTP costs a training step
#
# Count the floating-point operations of one training step (forward and backward, matrix products and attention)
# with `torch.utils.flop_counter.FlopCounterMode`, for each model of the comparison on one batch. Then build
# DeepSeek-tiny twice from the same seed, with and without its MTP module, and time training steps of the two
# interleaved (one step of each per round, the order alternating, the median over the rounds), so that a change
# of the machine's load hits both alike.

# %%
flop_x, flop_y = get_batch(corpus.train, B, T, torch.Generator().manual_seed(0))
for r in rows:
    r["gflops_per_step"] = train_step_flops(models[r["name"]], flop_x, flop_y) / 1e9
mtp_rows = mtp_step_cost(ds_cfg, corpus.train, B, T, repeats=cfg["mtp_cost_repeats"])
for r in mtp_rows:
    r["gflops_per_step"] = r.pop("flops_per_step") / 1e9
    r["name"] = r["name"] + " (step cost)"
for r in rows + mtp_rows:
    print(f"{r['name']:>34}: {r['gflops_per_step']:6.2f} GFLOP/step, {r['ms_per_step']:6.0f} ms/step")
with_mtp, without_mtp = mtp_rows
print(f"MTP module: {with_mtp['gflops_per_step'] / without_mtp['gflops_per_step'] - 1:+.1%} FLOPs and "
      f"{with_mtp['ms_per_step'] / without_mtp['ms_per_step'] - 1:+.1%} time per training step "
      f"(median of {cfg['mtp_cost_repeats']} interleaved steps; timings of this machine, not asserted)")
flop_share = with_mtp["gflops_per_step"] / without_mtp["gflops_per_step"] - 1
time_share = with_mtp["ms_per_step"] / without_mtp["ms_per_step"] - 1
print(f"time share {'below' if time_share < flop_share else 'at or above'} the FLOP share on this machine")
assert with_mtp["gflops_per_step"] > without_mtp["gflops_per_step"]

# %% [markdown]
# The FLOPs are counts of the matrix products for this configuration, the same on every machine (PyTorch's counter
# has no formula for CPU's fused attention, which GPT-2 and Llama use, so `train_step_flops` adds it in closed form,
# `2·B·H·T²·(d_k + d_v)` forward and twice that backward, as MLA's explicit products are counted); the milliseconds
# belong to this machine. The MTP module adds one dense block, its input projection `eh_proj` and a second pass through the head,
# on `T − 1` positions: the FLOP share printed above, paid on every training step and never at inference (there the
# module is dropped, or drafts tokens as in unit 15). Its time share can differ from its FLOP share: a dense block
# multiplies larger matrices than the MoE layers' small per-expert products, which run further below the CPU's
# peak (the breakdown above), so a FLOP of the MTP module need not cost as much time as an average FLOP of the
# model. The last printed line says which way it goes here. Both rows join the comparison table of section 8.
#
# ## 7. Generation with the latent cache, inside the trained context
#
# Greedy generation: one call on the prompt, then one call per new token with `T = 1`; the MTP module is not used.
# We use the course's trained DeepSeek (`assets/deepseek_char_tiny.pt`), check that the cached tokens equal
# decoding without a cache, and read the memory from the cache object itself.
#
# One limit first. The configuration allows more positions than the asset was trained on (its RoPE tables are
# that long; both numbers are printed below): positions beyond the training windows never occurred in training.
# The per-position validation loss on windows as long as the configuration allows shows what that means:

# %%
trained, tok = load_deepseek_char_tiny()
trained_ctx = trained.checkpoint_info["recipe"]["context_length"]
long_x, long_y = get_batch(corpus.val, 8, trained.cfg.context_length, torch.Generator().manual_seed(3))
with torch.no_grad():
    lg = trained(long_x)["logits"]
per_pos = F.cross_entropy(lg.transpose(1, 2), long_y, reduction="none").mean(0)
print(f"configured context {trained.cfg.context_length}; trained on windows of {trained_ctx} tokens")
spans = [(0, trained_ctx), (trained_ctx, 2 * trained_ctx), (2 * trained_ctx, trained.cfg.context_length)]
for a, b in spans:
    print(f"positions {a:>3}–{b - 1:>3}: mean validation loss {per_pos[a:b].mean():.3f} nats")
fig, ax = llmcourse.viz.figure(1, 1, figsize=(7, 2.8))
ax.plot(per_pos.tolist())
ax.axvline(trained_ctx - 0.5, color="red", ls="--", label=f"trained window ({trained_ctx} tokens)")
ax.set_xlabel("position in the window")
ax.set_ylabel("validation loss (nats)")
ax.legend(fontsize=8)
inside, beyond = per_pos[:trained_ctx].mean().item(), per_pos[trained_ctx:].mean().item()
assert beyond > inside, "the loss beyond the trained window should exceed the loss inside it"
assert per_pos[trained_ctx:2 * trained_ctx].mean() < per_pos[2 * trained_ctx:].mean()
fig

# %% [markdown]
# Inside the trained window the loss stays near its training level; past it the loss climbs, the further the
# worse (the printed means). So we generate only as many tokens as fit in the trained window after the prompt:

# %%
prompt = torch.tensor([tok.encode("ROMEO:")])
n_gen = min(cfg["gen_tokens"], trained_ctx - prompt.shape[1])
assert prompt.shape[1] + n_gen <= trained_ctx
t0 = time.perf_counter()
tokens, cache = generate_latent_cached(trained, prompt, n_gen)
dt = time.perf_counter() - t0
same = torch.equal(tokens, greedy_uncached(trained, prompt, n_gen))
print(tok.decode(tokens[0].tolist()))
print(f"\nequal to uncached greedy decoding: {same}; {n_gen} tokens in {dt:.2f} s "
      f"(prompt + tokens = {tokens.shape[1]} ≤ {trained_ctx})")
print(f"cache: {cache}; {cache.nbytes():,} bytes = {cache.nbytes() // cache.seq_len} bytes per position")

# %% [markdown]
# The panel compares the three models of the comparison in section 6: same batches, same steps, same schedule,
# same windows, so none of them is better trained than the others (the asset above trained longer, see the
# printed steps, and is not in the panel). Each continuation stops at the trained window.

# %%
panel_models = {name: models[name].eval() for name in ("deepseek-tiny", "llama3-tiny", "gpt2-char-tiny")}
record = viz.generation_record(panel_models, tok, "ROMEO:", cfg["panel_tokens"], context_length=T)
print(f"{record['new_tokens']} tokens per model after the prompt (window {T}); panel models trained {steps} steps "
      f"each, the asset {trained.checkpoint_info['recipe']['steps']}")
viz.show_generation_panel(panel_models, tok, record, cfg["panel_tokens"], context_length=T)

# %% [markdown]
# ## 8. FP8 inference
#
# We convert a copy's linear layers to unit 16's block-scaled FP8 with the course's `fp8_eval` (which layers is the
# exercise's decision) and compare validation losses on the same batches.

# %%
res = fp8_eval(trained, corpus.val, cfg["fp8_batches"], seed=10_000)
print(f"validation loss {res['val_loss_fp32']:.4f} in float32, {res['val_loss_fp8']:.4f} with FP8 weights and "
      f"activations: delta {res['delta']:+.4f} nats")
info = trained.checkpoint_info
if not info.get("substitute"):
    print(f"stored calibration of the asset: delta {info['fp8']['delta']:+.4f} on {info['recipe']['fp8_batches']} "
          f"batches")

# %%
viz.show_comparison_table(rows + mtp_rows, res["delta"])

# %% [markdown]
# ## 9. What transfers, and what does not
#
# Not at this scale: expert and pipeline parallelism (DeepSeek-V3 spreads its experts over many GPUs and overlaps
# communication with computation), real FP8 speed (our FP8 is simulated on the CPU and slower than float32), long
# contexts with YaRN scaling, and any claim about which architecture is "better".
#
# What does transfer: the invariants we tested — parity with a reference implementation after weight conversion,
# causality, an MTP module that never sees the token it predicts, a bias update that follows the sign of the load
# imbalance, cached generation equal to uncached generation, cache bytes equal to their formula, and comparisons
# made on identical batches at equal token budgets.
