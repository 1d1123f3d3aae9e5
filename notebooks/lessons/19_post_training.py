# %% [markdown]
# # Unit 19 — From a pretrained model to a reasoning model: SFT and GRPO
#
# The models of this course so far learn to continue text. DeepSeek-R1 became famous for what came *after*
# pre-training: reinforcement learning with rewards that a program checks, using **group relative policy
# optimisation** (GRPO, introduced with DeepSeekMath in 2024). This lesson runs the whole pipeline at tiny scale,
# on a CPU:
#
# 1. a task whose answers a program verifies (addition), and a reward made of correctness and format;
# 2. supervised fine-tuning (SFT) with a chat template and a loss on the answer tokens only;
# 3. GRPO from scratch: groups of sampled completions, group-relative advantages, per-token log-probabilities,
#    the clipped surrogate and a KL penalty against a frozen reference model;
# 4. the run, watched live: reward, accuracy, completion length and KL; accuracy before SFT, after SFT and after
#    GRPO over several seeds; what reward hacking looks like;
# 5. where this sits: PPO vs GRPO, R1-Zero vs R1, rejection-sampling SFT.
#
# The finished pieces come from `llmcourse.post`. The exercise notebook
# (`exercises/19_post_training/19_post_training.ipynb`) asks you to write the reward, the SFT loss and the three
# parts of the GRPO objective yourself.

# %%
import copy
import math
import time

import torch
from IPython.display import display

import llmcourse
from llmcourse.post import (
    AdditionTask,
    addition_reward,
    completion_mask,
    evaluate_accuracy,
    frozen_copy,
    group_relative_advantages,
    grpo_loss,
    grpo_step,
    kl_k3,
    per_token_logps,
    sample_completions,
    sft_batch,
    sft_labels,
    sft_train,
)
from llmcourse.post.run import (
    POST_MODEL,
    POST_RECIPE,
    build_post_model,
    load_grpo_runs,
    load_sft_models,
    paired_change,
    run_post_training,
)
from llmcourse.viz import post as viz

cfg = llmcourse.setup_notebook("19")
SEEDS = list(cfg["seeds"])
G = cfg["group_size"]
cfg

# %% [markdown]
# ## 1. A task with a checkable answer
#
# Reinforcement learning needs a reward. For open-ended chat it comes from a *learned* reward model, which a policy
# can learn to fool. For mathematics and code, DeepSeek-R1 used **rule-based rewards** instead: a program checks
# the final answer (accuracy) and the layout of the response (format). Our task is the smallest such problem:
# add two 2-digit numbers. Every question is a prompt in a fixed chat template; the ideal completion is the sum
# followed by the end-of-sequence token.

# %%
task = AdditionTask(n_digits=2, n_test=cfg["n_test"], seed=0)
tok = task.tokenizer
a0, b0 = task.test_pairs[0].tolist()
print("prompt     ", task.prompt_text(a0, b0), "→ ids", tok.encode(task.prompt_text(a0, b0)))
print("completion ", task.answer_text(a0, b0), "→ ids", tok.encode(task.answer_text(a0, b0)))
print(f"vocabulary of {tok.vocab_size} tokens: {list(tok.tokens)}")
print(f"{10 ** 4} ordered pairs; {len(task.test_pairs)} held out for testing, never drawn for training")
drawn = task.sample_train(20_000, torch.Generator().manual_seed(1))
print(f"test pairs among 20,000 training draws: {int(task.is_test(drawn).sum())}")

# %% [markdown]
# The reward reads a completion up to its first `<eos>`. It is **well-formed** when an `<eos>` is there and the text
# before it is a number written without leading zeros; it is **correct** when it is well-formed and equals the sum.
# The reward is `correct_weight · correct + format_weight · well_formed`. The format term pays a little for a tidy
# answer even when it is wrong, which helps a model that has not yet learnt to stop.

# %%
for text in ("42<eos>", "41<eos>", "042<eos>", "42", "42<eos>17<eos>", "4+2<eos>"):
    print(f"{text!r:>18}  reward {addition_reward(text, 42):.1f}")

# %% [markdown]
# ## 2. Supervised fine-tuning: learn the format, and some answers
#
# A fresh model has never seen the template. SFT trains it on prompt + ideal completion, with the ordinary
# next-token loss, but **only on what the model will have to write**: the answer digits and the `<eos>`. The
# prompt is given at inference time; teaching the model to produce questions would waste capacity and, in a
# real chat model, teach it to talk like its users. Below, each row of a small batch and, under it, which
# positions the loss reads (`·` = not in the loss); the logit at position `p − 1` scores the token at `p`.

# %%
demo_pairs = torch.tensor([[7, 35], [99, 99], [0, 4]])
ids = sft_batch(task, demo_pairs)
labels = sft_labels(ids, task.prompt_len, tok.pad_id)
for row, lab in zip(ids, labels):
    print("tokens ", " ".join(f"{tok.tokens[int(i)]:>5}" for i in row))
    print("target ", " ".join(f"{'·':>5}" if int(v) < 0 else f"{tok.tokens[int(v)]:>5}" for v in
                              torch.cat([torch.tensor([-100]), lab])))
print(f"answer tokens in the loss: {int((labels >= 0).sum())} of {ids.numel()} positions")

# %% [markdown]
# The model is unit 11's Llama (with unit 12's KV cache for generation), tiny: the configuration below. Before
# fine-tuning it answers nothing correctly; a short SFT run shows the loss fall and the first correct answers
# appear (greedy decoding on the held-out pairs).

# %%
model = build_post_model(SEEDS[0])
n_params = sum(p.numel() for p in model.parameters())
print(POST_MODEL, f"→ {n_params:,} parameters")
acc_untrained = evaluate_accuracy(model, task, task.test_pairs)
t0 = time.perf_counter()
demo_losses = sft_train(model, task, cfg["sft_demo_steps"], batch_size=cfg["sft_demo_batch"], lr=POST_RECIPE["sft_lr"],
                        seed=1_000_003 * SEEDS[0])
demo_seconds = time.perf_counter() - t0
acc_demo = evaluate_accuracy(model, task, task.test_pairs)
q = max(1, len(demo_losses) // 10)
print(f"SFT: {len(demo_losses)} steps of {cfg['sft_demo_batch']} examples in {demo_seconds:.1f} s; loss "
      f"{sum(demo_losses[:q]) / q:.3f} (first steps) → {sum(demo_losses[-q:]) / q:.3f} (last steps)")
print(f"held-out accuracy: {acc_untrained:.3f} before SFT, {acc_demo:.3f} after")

# %% [markdown]
# Learning to carry takes this model far longer than a lesson should spend waiting. The course stores the models
# of the full SFT recipe (printed below) for several seeds (`assets/post_sft_tiny.pt`, re-created by
# `python -m llmcourse.post.run --save-sft`); they start GRPO below. The recipe is a **cold start** in the manner of
# DeepSeek-R1 (§2.3.1): SFT sees only a small fixed set of worked examples, many times, and leaves the rest of the
# task to reinforcement learning on fresh prompts, which need no answers, only the verifier. Their accuracies are
# measured here, on this notebook's held-out pairs.

# %%
stored = load_sft_models()
sft_models, acc_sft = {}, {}
for seed in SEEDS:
    m = build_post_model(seed)
    m.load_state_dict(stored["models"][seed])
    sft_models[seed] = m
    acc_sft[seed] = evaluate_accuracy(m, task, task.test_pairs)
print(f"stored SFT recipe: {stored['recipe']['sft_steps']} steps of {stored['recipe']['sft_batch']} examples drawn "
      f"from a fixed set of {stored['recipe']['sft_pool']} training pairs"
      + (" (a substitute: the asset was missing)" if stored["substitute"] else ""))
for seed in SEEDS:
    print(f"seed {seed}: held-out accuracy after SFT {acc_sft[seed]:.3f}")
print(f"recorded when the models were stored ({stored['recipe']['n_test']} held-out pairs), every stored seed:",
      {s: round(v, 3) for s, v in stored["acc_sft"].items()})

# %% [markdown]
# ## 3. GRPO from scratch
#
# ### Groups of completions
#
# GRPO asks the current policy for a **group** of `G` completions per prompt, sampled at temperature 1 with the
# KV-cached decoding loop of unit 12 (each of the `G` copies of a prompt gets its own draws). The verifier scores
# each completion; the scores are then compared **within the group**: a completion is good if it beat its
# siblings on the same question. Below, one group of the fine-tuned model of the first seed.

# %%
policy0 = sft_models[SEEDS[0]]
gen = torch.Generator().manual_seed(7)
pairs = task.sample_train(8, gen)
prompts = task.prompts(pairs).repeat_interleave(G, dim=0)
seqs = sample_completions(policy0, prompts, task.max_new_tokens, tok.eos_id, temperature=1.0, generator=gen)
completions = seqs[:, task.prompt_len:]
rewards = task.rewards(pairs.repeat_interleave(G, dim=0), completions)
advantages = group_relative_advantages(rewards, G)
a1, b1 = pairs[0].tolist()
print(f"prompt {task.prompt_text(a1, b1)} (answer {a1 + b1}), G = {G}:")
for i in range(G):
    print(f"  {tok.decode(completions[i]):<22} reward {rewards[i].item():.1f}  advantage {advantages[i].item():+.3f}")

# %% [markdown]
# The advantage is the reward standardised inside its group: minus the group's mean, divided by the group's
# standard deviation (the sample one, as TRL's `GRPOTrainer` computes it). Every token of a completion gets its
# completion's advantage ("outcome supervision"). The group mean plays the part that a learned value model plays
# in PPO: a baseline, so that only *better than usual* is reinforced.
#
# A group whose completions all earned the same reward has no spread. It says nothing about which completion is
# better, so its advantages are zero (dividing by its zero standard deviation would give `0/0`) and its clipped
# surrogate contributes nothing. It is not quite inert: its tokens still pay the KL penalty `β·k3`, which pulls them
# back toward the reference model, and its completions still count in the `1/N` that averages the batch, so the
# more such groups a batch holds, the smaller the step the informative groups get. Such groups are common when a
# question is far too easy or far too hard:

# %%
spread = rewards.view(-1, G).std(dim=1)
flat = (advantages.view(-1, G) == 0).all(dim=1)
print("group reward std:", [round(s, 3) for s in spread.tolist()])
print(f"groups without spread: {int(flat.sum())} of {len(spread)}; their advantages:",
      advantages.view(-1, G)[flat].abs().max().item() if bool(flat.any()) else "none here")

# %% [markdown]
# The KL term on such a group, measured: a group with one reward for all, whose policy sits half a nat per token
# from the reference, still has a loss and a gradient.

# %%
flat_logps = torch.full((G, 3), -1.0, requires_grad=True)
flat_adv = group_relative_advantages(torch.full((G,), 0.1), G)
flat_loss = grpo_loss(flat_logps, flat_logps.detach(), flat_logps.detach() - 0.5, flat_adv,
                      torch.ones(G, 3, dtype=torch.bool))
flat_loss.backward()
print(f"largest advantage {flat_adv.abs().max().item():.1f}; loss {flat_loss.item():+.5f}, gradient norm "
      f"{flat_logps.grad.norm().item():.5f} (from β·k3 alone, β = {POST_RECIPE['beta']})")

# %% [markdown]
# ### The format term, amplified
#
# The format term is meant as a small nudge: `format_weight` against 1 for a correct answer. Standardising within
# the group undoes that. Division by the group's standard deviation gives every group with any spread advantages
# of the same size, whatever the size of the reward differences. A group of wrong answers, all tidy but one, is
# reinforced as strongly as a group in which one completion is right:

# %%
fw = POST_RECIPE["format_weight"]
for name, r in (("all wrong, one of them malformed", torch.tensor([fw] * (G - 1) + [0.0])),
                ("one correct, the others tidy wrong", torch.tensor([1.0 + fw] + [fw] * (G - 1)))):
    a = group_relative_advantages(r, G)
    print(f"{name:>34}: rewards {sorted({round(x, 2) for x in r.tolist()})}, advantages "
          f"{sorted({round(x, 3) for x in a.tolist()})}")
groups = rewards.view(-1, G)
right = task.correct(pairs.repeat_interleave(G, dim=0), completions).view(-1, G)
format_only = ~flat & ~right.any(dim=1)
print(f"in the batch above, {int(format_only.sum())} of {len(groups)} groups have spread from the format term alone")

# %% [markdown]
# Two ways out. **Gate** the format term on correctness (`gate_format=True`, the choice of the course's recipe
# below: a tidy wrong answer then earns what a malformed one does, so a group of wrong answers has no spread), or
# **do not divide by the std** (`scale_rewards="none"`, the choice of Dr. GRPO, Liu et al. 2025): the advantages
# keep the reward's units, and the format term stays `format_weight` small next to correctness. The mean size of
# the advantages on the same batch, in its groups whose spread is the format term alone and in its groups with a
# correct completion:

# %%
gated = task.rewards(pairs.repeat_interleave(G, dim=0), completions, gate_format=True)
with_right = right.any(dim=1) & ~flat
for name, adv in (("group std (the default)", group_relative_advantages(rewards, G)),
                  ("format gated on correctness", group_relative_advantages(gated, G)),
                  ("no std (scale_rewards='none')", group_relative_advantages(rewards, G, scale_rewards="none"))):
    size = adv.view(-1, G).abs().mean(dim=1)
    fmt = f"{size[format_only].mean().item():.3f}" if bool(format_only.any()) else "none here"
    cor = f"{size[with_right].mean().item():.3f}" if bool(with_right.any()) else "none here"
    print(f"{name:>30}: mean |advantage| in format-only groups {fmt}, in groups with a correct completion {cor}")

# %% [markdown]
# ### Which tokens belong to a completion?
#
# The sampler pads a finished row with more `<eos>` tokens until every row is done. Only the tokens up to and
# including a row's **first** `<eos>` are the completion: the model chose them. The `<eos>` itself counts, since
# choosing to stop is part of the answer. Everything after it is filler that the policy never chose.
#
# ### Spot the bug: a mask that forgets to stop
#
# The mask below is meant to mark each completion's own tokens. Run it on three rows and compare with what it
# should mark.

# %%
def mask_buggy(completions, eos_id):
    """True on each row's tokens up to and including its first eos_id."""
    return completions != eos_id


rows = torch.tensor([[tok.ids["4"], tok.ids["2"], tok.eos_id, tok.eos_id],
                     [tok.ids["7"], tok.eos_id, tok.eos_id, tok.eos_id],
                     [tok.ids["1"], tok.ids["0"], tok.ids["5"], tok.ids["3"]]])


def self_check_mask(fn) -> bool:
    """✓ when fn marks each row's tokens up to and including its first eos, and nothing after it."""
    want = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    cases = [(rows, want), (torch.full((1, 3), tok.eos_id), torch.tensor([[True, False, False]]))]
    try:
        for x, w in cases:
            got = torch.as_tensor(fn(x, tok.eos_id)).bool()
            if got.shape != w.shape or not torch.equal(got, w):
                print(f"✗ not yet: for rows {x.tolist()} it marks {got.int().tolist()}; expected {w.int().tolist()}")
                return False
    except Exception as exc:   # a self-check never raises
        print(f"✗ not yet: it raised {type(exc).__name__}: {exc}")
        return False
    print("✓ each completion's tokens, its first <eos> included, and nothing after it")
    return True


print("rows:", [tok.decode(r) for r in rows])
print("marked:", mask_buggy(rows, tok.eos_id).int().tolist())

# %% [markdown]
# **Your turn.** Fix the copy below and run the self-check. A model trained with the buggy mask gets no signal for
# the one token that ends its answer.

# %%
# TODO: fix the mask
def mask_fixed(completions, eos_id):
    """TODO: True on each row's tokens up to and including its first eos_id, False after it."""
    return completions != eos_id


self_check_mask(mask_fixed);

# %% jupyter={"source_hidden": true}
# Reference fix: count, at each position, how many eos tokens came strictly before it; the completion is where
# that count is still 0 (the first eos itself has none before it).
def mask_reference(completions, eos_id):
    """True on each row's tokens up to and including its first eos_id."""
    hits = (completions == eos_id).long()
    return (hits.cumsum(dim=1) - hits) == 0


assert self_check_mask(mask_reference)
assert self_check_mask(completion_mask)

# %% [markdown]
# ### The objective
#
# For each completion token, the policy `π_θ` being trained, the policy `π_old` that sampled the group, and the
# frozen **reference** model `π_ref` (the SFT model GRPO started from) each give a log-probability: one forward
# pass over prompt + completion, keeping the completion's positions (the logit at `p − 1` scores the token at
# `p`). With the probability ratio `ρ = π_θ / π_old = exp(log π_θ − log π_old)`, DeepSeekMath's eq. 3 maximises
#
# `J(θ) = 1/G Σ_i 1/|o_i| Σ_t [ min(ρ_{i,t} Â_i, clip(ρ_{i,t}, 1 − ε, 1 + ε) Â_i) − β·D_KL ]`
#
# - **the clipped surrogate** (from PPO): once a token's ratio has moved past `1 ± ε` in the direction its
#   advantage favours, the term stops growing, so an update cannot run away from the policy that produced the
#   samples;
# - **the KL penalty** keeps the policy near the reference, estimated per token from the samples themselves.
#
# The table shows the surrogate term for a few ratios and both signs of the advantage, with the recipe's `ε`.

# %%
eps_clip = POST_RECIPE["clip_eps"]
ratios = torch.tensor([0.5, 0.8, 1.0, 1.1, 1.2, 1.5, 2.0])
for adv_sign in (1.0, -1.0):
    term = torch.minimum(ratios * adv_sign, ratios.clamp(1 - eps_clip, 1 + eps_clip) * adv_sign)
    print(f"Â = {adv_sign:+.0f}:", "  ".join(f"ρ={r:.1f}→{v:+.2f}" for r, v in zip(ratios.tolist(), term.tolist())))

# %% [markdown]
# The log-probabilities come from `log_softmax`, which works in the log domain, not from the log of a softmax:
# a token the model finds very unlikely has a probability below float32's smallest positive number, its softmax
# rounds to 0, and the log of 0 is `-inf` (then `ρ = exp(−inf − …)` and its gradient are lost). Two logits 120 apart:

# %%
two_logits = torch.tensor([0.0, -120.0])
print(f"e^-120 = {math.exp(-120.0):.1e}; the smallest float32 above 0 is 2^-149 = {2.0 ** -149:.1e}")
print("log(softmax):", torch.softmax(two_logits, dim=-1).log().tolist(), "  log_softmax:",
      torch.log_softmax(two_logits, dim=-1).tolist())
assert torch.isinf(torch.softmax(two_logits, dim=-1).log()[1]) and torch.isfinite(torch.log_softmax(two_logits, -1)).all()

# %% [markdown]
# Where the term is flat, its gradient is zero: a positive-advantage token whose ratio already exceeds `1 + ε`, or a
# negative-advantage token already below `1 − ε`, gets no further push. The other side is not clipped: a token the
# advantage says to make rarer keeps its full (growing) penalty.
#
# ### The KL estimator k3
#
# `KL(q ‖ p) = E_{x∼q}[log q(x)/p(x)]`. With samples from `q` and `r = p(x)/q(x)`, the naive estimate `−log r` is
# unbiased but can be negative and noisy. Schulman's **k3** adds `r − 1`, whose expectation under `q` is
# `Σ q·p/q − 1 = 0`: so `k3 = (r − 1) − log r` is still unbiased, and since `log r ≤ r − 1` every single sample is
# `≥ 0`. GRPO takes `q = π_θ` (the samples come from the policy) and `p = π_ref`. Below, two random distributions
# over the task's vocabulary: the exact expectation of k3 against `torch`'s KL, then the spread of the two
# estimators over samples.

# %%
gk = torch.Generator().manual_seed(3)
log_q = torch.log_softmax(torch.randn(tok.vocab_size, generator=gk), dim=0)
log_p = torch.log_softmax(log_q + 0.5 * torch.randn(tok.vocab_size, generator=gk), dim=0)
exact = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=log_q),
                                          torch.distributions.Categorical(logits=log_p)).item()
k3_all = kl_k3(log_q, log_p)               # per outcome, with q the sampling policy
print(f"KL(q‖p) = {exact:.6f}; E_q[k3] = {(log_q.exp() * k3_all).sum().item():.6f}; min over outcomes of k3 = "
      f"{k3_all.min().item():.4f}")
draws = torch.multinomial(log_q.exp(), 20_000, replacement=True, generator=gk)
k1 = (log_q - log_p)[draws]
k3 = k3_all[draws]
print(f"over {len(draws):,} samples: naive mean {k1.mean().item():.4f} (std {k1.std().item():.4f}, "
      f"{(k1 < 0).float().mean().item():.0%} negative); k3 mean {k3.mean().item():.4f} (std {k3.std().item():.4f})")

# %% [markdown]
# `grpo_loss` returns `−J`. One call of `grpo_step` samples the groups, computes rewards and advantages, the old and
# reference log-probabilities without gradients, and takes one optimiser step. With a single optimiser step per
# batch, `π_θ = π_old` at that step: every ratio is exactly 1, the clip never acts and the surrogate's gradient is
# the advantage-weighted gradient of the log-likelihood. The clip matters when the same samples serve several
# steps (`inner_steps > 1`). Both, on copies of the same fine-tuned model, from the same samples:

# %%
for inner in (1, 2):
    pol = copy.deepcopy(policy0)
    opt = torch.optim.AdamW(pol.parameters(), lr=1e-3, weight_decay=0.0)
    st = grpo_step(pol, frozen_copy(policy0), opt, task, pairs, group_size=G, inner_steps=inner,
                   generator=torch.Generator().manual_seed(11))
    print(f"inner_steps {inner}: loss at the first step {st['loss']:+.4f}, share of tokens clipped at the last step "
          f"{st['clip_fraction']:.3f}, mean reward {st['reward']:.3f}")

# %% [markdown]
# ## 4. The run
#
# Each seed's fine-tuned model now runs GRPO on fresh training prompts (no answers are needed, only the verifier):
# `prompts_per_step` prompts × `G` completions per iteration, a small learning rate with a short warm-up, the KL
# weight `β` and the clip `ε` of the recipe. The dashboard shows, per iteration, the mean reward and the accuracy of
# the sampled groups, the completion length and the KL to the reference; red dots are the held-out accuracy
# (greedy) every few iterations, the dotted line the fine-tuned model's.

# %%
run_cfg = dict(n_test=cfg["n_test"], grpo_iters=cfg["grpo_iters"], prompts_per_step=cfg["prompts_per_step"],
               group_size=G, eval_every=cfg["eval_every"])
print({k: POST_RECIPE[k] for k in ("grpo_lr", "grpo_warmup", "temperature", "clip_eps", "beta", "gate_format")}
      | run_cfg)
runs = {}
for seed in SEEDS:
    history = []
    box, update = viz.make_grpo_dashboard(cfg["grpo_iters"], acc_sft=acc_sft[seed]) if seed == SEEDS[0] else (None, None)
    if box is not None:
        display(box)

    def on_step(phase, step, stats, history=history, update=update):
        if phase == "grpo":
            history.append(stats)
            if update is not None:
                update(history)

    runs[seed] = run_post_training(seed, callback=on_step, sft_state=stored["models"][seed], **run_cfg)
    print(f"seed {seed}: GRPO {len(runs[seed]['grpo'])} iterations in {runs[seed]['seconds_grpo']:.1f} s")

# %% tags=["nbval-ignore-output"]
viz.show_grpo_dashboard(runs[SEEDS[0]]["grpo"], acc_sft=runs[SEEDS[0]]["acc_sft"])

# %% [markdown]
# The held-out accuracies of every seed (greedy decoding on the test pairs, which neither SFT nor GRPO ever saw):

# %%
print("seed   before SFT   after SFT   after GRPO   change")
for seed in SEEDS:
    r = runs[seed]
    print(f"{seed:4d}   {r['acc_before']:10.3f}   {r['acc_sft']:9.3f}   {r['acc_grpo']:10.3f}   "
          f"{r['acc_grpo'] - r['acc_sft']:+.3f}")
gains = torch.tensor([runs[s]["acc_grpo"] - runs[s]["acc_sft"] for s in SEEDS])
sft_accs = torch.tensor([runs[s]["acc_sft"] for s in SEEDS])
print(f"mean change from GRPO over {len(SEEDS)} seed(s): {gains.mean().item():+.3f} (from {gains.min().item():+.3f} "
      f"to {gains.max().item():+.3f}); after SFT the seeds range from {sft_accs.min().item():.3f} to "
      f"{sft_accs.max().item():.3f}")

# %% [markdown]
# Is a change of a few points real? The spread of accuracies *between* seeds is the wrong yardstick: each seed's
# model is compared with itself, on the same held-out pairs. Count, item by item, the pairs GRPO **fixed** (wrong
# after SFT, right after GRPO) and those it **broke** (right → wrong); the pairs both models get right, or both
# wrong, say nothing about the change. If GRPO changed nothing systematic, each changed item would be fixed or
# broken with probability ½, so `fixed` would be Binomial(`fixed + broken`, ½): the **exact McNemar test** (McNemar
# 1947) is that binomial's two-sided tail. The net gain is a difference of two such counts, and both can be large.

# %%
print(f"this notebook's runs ({cfg['grpo_iters']} iterations, {cfg['n_test']} held-out pairs, one sample stream):")
print("seed   fixed   broken   change   McNemar p")
for seed in SEEDS:
    pc = paired_change(runs[seed]["correct_sft"], runs[seed]["correct_grpo"])
    print(f"{seed:4d}   {pc['fixed']:5d}   {pc['broken']:6d}   {pc['gain']:+.3f}   {pc['p']:9.2g}")

# %% [markdown]
# One run per seed also mixes two kinds of luck: the fine-tuned model (the seed) and the prompts and samples GRPO
# happened to draw. The course stores a run of the full recipe with two independent sample streams per stored
# model (`assets/post_grpo_runs.json`, re-created by `python -m llmcourse.post.run --store-runs`): the same model,
# other prompts and other draws.

# %%
stored_runs = load_grpo_runs()
rec = stored_runs["recipe"]
print(f"stored: {rec['grpo_iters']} GRPO iterations of {rec['prompts_per_step']} prompts × {rec['group_size']} "
      f"completions, {rec['n_test']} held-out pairs, streams {stored_runs['streams']}")
print("seed  stream   after SFT   after GRPO   fixed   broken   change   McNemar p")
for row in stored_runs["runs"]:
    print(f"{row['seed']:4d}  {row['stream']:6d}   {row['acc_sft']:9.3f}   {row['acc_grpo']:10.3f}   {row['fixed']:5d}   "
          f"{row['broken']:6d}   {row['gain']:+.3f}   {row['p']:9.2g}")
stored_gains = torch.tensor([row["gain"] for row in stored_runs["runs"]])
n_sig = sum(row["p"] < 0.05 for row in stored_runs["runs"])
print(f"gains from {stored_gains.min().item():+.3f} to {stored_gains.max().item():+.3f} (mean "
      f"{stored_gains.mean().item():+.3f}, std {stored_gains.std().item():.3f} over {len(stored_gains)} runs); "
      f"p < 0.05 in {n_sig} of {len(stored_runs['runs'])} runs, largest p {max(r['p'] for r in stored_runs['runs']):.2g}")
same = [s for s in SEEDS if rec["n_test"] == cfg["n_test"] and rec["grpo_iters"] == cfg["grpo_iters"]
        and rec["prompts_per_step"] == cfg["prompts_per_step"]]
for seed in same:
    row = next(r for r in stored_runs["runs"] if r["seed"] == seed and r["stream"] == 0)
    pc = paired_change(runs[seed]["correct_sft"], runs[seed]["correct_grpo"])
    print(f"seed {seed}: this notebook's run reproduces stream 0 of the stored run: "
          f"{(pc['fixed'], pc['broken']) == (row['fixed'], row['broken'])}")

# %% [markdown]
# Read the stored table row by row. The change is a small difference of two larger counts: GRPO fixes many items and
# breaks a good share as well, because every update moves the answers the model was unsure of in both directions.
# The p-value asks whether the fixed items outnumber the broken ones by more than that churn explains; the spread of
# the gains over seeds and streams says how much a single run can be trusted.
#
# ### Reward hacking
#
# The policy optimises the reward it is given, not the one we meant. Replace the format term by a bonus per token
# written before `<eos>` (a naive way to "encourage longer reasoning"): for a 2-digit sum, writing digits until the
# length limit now pays more than a correct answer.

# %%
hack = dict(format_weight=0.0, length_weight=0.6)
for text in ("42<eos>", "4242", "9<eos>"):
    print(f"{text!r:>10}: task reward {addition_reward(text, 42):.1f}, hacked reward {addition_reward(text, 42, **hack):.1f}")
best_seed = max(stored["seeds"], key=lambda s: stored["acc_sft"][s])     # the stored model that starts highest
hack_cfg = dict(run_cfg, grpo_iters=cfg["hack_iters"], grpo_lr=cfg["hack_lr"], eval_every=0)
hacked = run_post_training(best_seed, sft_state=stored["models"][best_seed], **hack_cfg, **hack)
honest = run_post_training(best_seed, sft_state=stored["models"][best_seed], **hack_cfg)
print(f"seed {best_seed}, {cfg['hack_iters']} iterations at learning rate {cfg['hack_lr']:g}, held-out accuracy after "
      f"SFT {honest['acc_sft']:.3f}:")
for name, res in (("length bonus, no format term", hacked), ("the task's reward", honest)):
    print(f"  {name:>29}: completion length {res['grpo'][0]['length']:.2f} → {res['grpo'][-1]['length']:.2f} tokens, "
          f"mean reward {res['grpo'][0]['reward']:.2f} → {res['grpo'][-1]['reward']:.2f}, held-out accuracy "
          f"{res['acc_grpo']:.3f}")

# %% tags=["nbval-ignore-output"]
viz.show_grpo_dashboard(hacked["grpo"], acc_sft=hacked["acc_sft"])

# %% [markdown]
# ### Normalisation and the format term: choices, measured
#
# Two more choices hide in the loss and the advantages. The average over tokens: DeepSeekMath's eq. 3 averages each
# completion over its own length, then over completions (`loss_type="grpo"`), so a token of a long completion
# weighs less; DAPO (Yu et al. 2025) takes one mean over all the batch's tokens (`"dapo"`, the default of TRL's
# `GRPOTrainer`); Dr. GRPO divides the masked sum by a constant, the number of completions times the length limit
# (`"dr_grpo"`), and also drops the std from the advantages. None of these is a bug; they weigh tokens differently.
# One short run of each from the same fine-tuned model, prompts and draws, and a fourth without the recipe's
# format gate (its cost, counted in GRPO iterations, is printed first):

# %%
abl_cfg = dict(run_cfg, grpo_iters=cfg["ablation_iters"], eval_every=0)
variants = {"grpo, group std": {}, "dapo, group std": dict(loss_type="dapo"),
            "dr_grpo, no std": dict(loss_type="dr_grpo", scale_rewards="none"),
            "grpo, format ungated": dict(gate_format=False)}
main_iters = len(SEEDS) * cfg["grpo_iters"]
print(f"cost: {len(variants)} × {cfg['ablation_iters']} = {len(variants) * cfg['ablation_iters']} GRPO iterations, "
      f"{len(variants) * cfg['ablation_iters'] / main_iters:.0%} of the main run's {main_iters}")
seed_a = SEEDS[0]
print(f"seed {seed_a}, {cfg['ablation_iters']} iterations each; held-out accuracy after SFT "
      f"{runs[seed_a]['acc_sft']:.3f}")
print(f"{'variant':>20}  after GRPO  change  final KL  groups without spread (last iteration)")
for name, kw in variants.items():
    res = run_post_training(seed_a, sft_state=stored["models"][seed_a], **abl_cfg, **kw)
    print(f"{name:>20}  {res['acc_grpo']:10.3f}  {res['acc_grpo'] - res['acc_sft']:+.3f}  {res['grpo'][-1]['kl']:8.5f}  "
          f"{res['grpo'][-1]['zero_std_groups']:.0%}")

# %% [markdown]
# Read this table as a demonstration that the switches run, not as a ranking: one short run per variant on one
# seed is no evidence that one normalisation trains better. Completions here are a few tokens long, so the three
# normalisations weigh tokens almost alike; the choice matters when lengths vary by hundreds of tokens, as in long
# chains of thought, where the per-completion mean lets long wrong answers off lightly (the length bias Dr. GRPO
# points out). With the format gate (the recipe's choice), a group of wrong answers has no spread however tidy some
# of them are: such groups no longer teach tidiness at full strength. Without it they do, and the share of groups
# without spread is the column to compare.

# %% [markdown]
# Compare the two runs: the same model, prompts and step size, only the reward differs. Paid for length, the
# policy drifts towards longer completions, and correctness, which the bonus outweighs, is no longer what it is
# trained for. Rule-based rewards are hard to hack only as long as the rule measures what we want. (A step size
# larger than the recipe's, printed with the run above, can cost the honest run accuracy too: the update of a
# policy-gradient step is a small difference of large terms, which is why the recipe's learning rate is small.)
#
# ### Spot the bug: GRPO that unlearns
#
# Here is one GRPO iteration written out by hand (sampling, rewards, advantages, log-probabilities, the objective
# and the update). Started from a fine-tuned model with the same optimiser, prompts and draws as the library's
# `grpo_step`, its mean reward and the held-out accuracy afterwards do not behave like the library's. One line is
# wrong, unmarked.

# %%
def grpo_iteration(policy, ref_model, optimizer, task, pairs, group_size, generator, clip_eps=0.2, beta=0.04):
    """One GRPO iteration on the (B, 2) pairs; returns the mean reward of the sampled groups."""
    tok = task.tokenizer
    P = task.prompt_len
    prompts = task.prompts(pairs).repeat_interleave(group_size, dim=0)
    seqs = sample_completions(policy, prompts, task.max_new_tokens, tok.eos_id, 1.0, generator)
    done = seqs[:, P:]
    keep = completion_mask(done, tok.eos_id).float()
    scores = task.rewards(pairs.repeat_interleave(group_size, dim=0), done)
    adv = group_relative_advantages(scores, group_size)[:, None]
    with torch.no_grad():
        before = per_token_logps(policy, seqs, P)
        anchor = per_token_logps(ref_model, seqs, P)
    policy.train()
    now = per_token_logps(policy, seqs, P)
    ratio = torch.exp(before - now)
    bounded = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    gain = torch.minimum(ratio * adv, bounded * adv)
    drift = torch.exp(anchor - now) - (anchor - now) - 1
    per_token = (gain - beta * drift) * keep
    objective = (per_token.sum(dim=1) / keep.sum(dim=1).clamp(min=1)).mean()
    optimizer.zero_grad(set_to_none=True)
    (-objective).backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    policy.eval()
    return scores.mean().item()


diag_model = build_post_model(best_seed)
diag_model.load_state_dict(stored["models"][best_seed])


def reward_curve(step_fn, iters):
    """Mean reward per iteration of step_fn from the fine-tuned model (same prompts and draws each time), and the
    held-out accuracy at the end."""
    pol = copy.deepcopy(diag_model)
    ref = frozen_copy(pol)
    opt = torch.optim.AdamW(pol.parameters(), lr=POST_RECIPE["grpo_lr"] * 3, weight_decay=0.0)
    g = torch.Generator().manual_seed(2024)
    out = []
    for _ in range(iters):
        out.append(step_fn(pol, ref, opt, task, task.sample_train(cfg["prompts_per_step"], g), G, g))
    return out, evaluate_accuracy(pol, task, task.test_pairs)


def library_iteration(policy, ref_model, optimizer, task, pairs, group_size, generator):
    return grpo_step(policy, ref_model, optimizer, task, pairs, group_size=group_size, generator=generator)["reward"]


k = max(1, cfg["diag_iters"] // 3)
print(f"seed {best_seed}, held-out accuracy after SFT {evaluate_accuracy(diag_model, task, task.test_pairs):.3f}")
for name, fn in (("grpo_iteration", grpo_iteration), ("library grpo_step", library_iteration)):
    curve, acc_end = reward_curve(fn, cfg["diag_iters"])
    print(f"{name:>18}: mean reward {sum(curve[:k]) / k:.3f} over the first {k} iterations → "
          f"{sum(curve[-k:]) / k:.3f} over the last {k}; held-out accuracy afterwards {acc_end:.3f}")

# %% [markdown]
# **Your turn.** Find the wrong line and fix it in the copy below. The self-check runs one iteration of your copy and
# one of `grpo_step` on two copies of the same model, with the same samples and the same optimiser settings, and
# compares the weights afterwards.

# %%
def self_check_iteration(fn) -> bool:
    """✓ when one iteration of fn moves the weights as grpo_step does (same model, samples and optimiser)."""
    try:
        base = diag_model
        ref = frozen_copy(base)
        got, want = copy.deepcopy(base), copy.deepcopy(base)
        batch = task.sample_train(cfg["prompts_per_step"], torch.Generator().manual_seed(5))
        opt_a = torch.optim.AdamW(got.parameters(), lr=1e-3, weight_decay=0.0)
        opt_b = torch.optim.AdamW(want.parameters(), lr=1e-3, weight_decay=0.0)
        fn(got, ref, opt_a, task, batch, G, torch.Generator().manual_seed(6))
        grpo_step(want, ref, opt_b, task, batch, group_size=G, generator=torch.Generator().manual_seed(6))
        gap = max((a - b).abs().max().item() for a, b in zip(got.parameters(), want.parameters()))
        moved = max((a - b).abs().max().item() for a, b in zip(want.parameters(), base.parameters()))
    except Exception as exc:   # a self-check never raises
        print(f"✗ not yet: it raised {type(exc).__name__}: {exc}")
        return False
    ok = gap <= 1e-6 + 1e-3 * moved
    print(f"✓ the same update as grpo_step (largest weight difference {gap:.1e}; the step moved weights by up to "
          f"{moved:.1e})" if ok else f"✗ not yet: the weights differ from grpo_step's by up to {gap:.2e} after one "
          f"iteration (the step itself moved them by up to {moved:.2e})")
    return ok


# TODO: find the one wrong line and fix it in this copy
def grpo_iteration_fixed(policy, ref_model, optimizer, task, pairs, group_size, generator, clip_eps=0.2, beta=0.04):
    """TODO: the same iteration with its one bug fixed."""
    tok = task.tokenizer
    P = task.prompt_len
    prompts = task.prompts(pairs).repeat_interleave(group_size, dim=0)
    seqs = sample_completions(policy, prompts, task.max_new_tokens, tok.eos_id, 1.0, generator)
    done = seqs[:, P:]
    keep = completion_mask(done, tok.eos_id).float()
    scores = task.rewards(pairs.repeat_interleave(group_size, dim=0), done)
    adv = group_relative_advantages(scores, group_size)[:, None]
    with torch.no_grad():
        before = per_token_logps(policy, seqs, P)
        anchor = per_token_logps(ref_model, seqs, P)
    policy.train()
    now = per_token_logps(policy, seqs, P)
    ratio = torch.exp(before - now)
    bounded = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    gain = torch.minimum(ratio * adv, bounded * adv)
    drift = torch.exp(anchor - now) - (anchor - now) - 1
    per_token = (gain - beta * drift) * keep
    objective = (per_token.sum(dim=1) / keep.sum(dim=1).clamp(min=1)).mean()
    optimizer.zero_grad(set_to_none=True)
    (-objective).backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    policy.eval()
    return scores.mean().item()


self_check_iteration(grpo_iteration_fixed);

# %% jupyter={"source_hidden": true}
# Reference fix: the ratio is π_θ / π_old, i.e. exp(log π_θ − log π_old). The buggy line had the difference the
# other way round: the ratio is still 1 at the step, so the loss value looked right, but its gradient has the
# opposite sign. Every rewarded completion was made rarer and every penalised one more likely: GRPO unlearned.
def grpo_iteration_reference(policy, ref_model, optimizer, task, pairs, group_size, generator, clip_eps=0.2,
                             beta=0.04):
    """One GRPO iteration on the (B, 2) pairs; returns the mean reward of the sampled groups."""
    tok = task.tokenizer
    P = task.prompt_len
    prompts = task.prompts(pairs).repeat_interleave(group_size, dim=0)
    seqs = sample_completions(policy, prompts, task.max_new_tokens, tok.eos_id, 1.0, generator)
    done = seqs[:, P:]
    keep = completion_mask(done, tok.eos_id).float()
    scores = task.rewards(pairs.repeat_interleave(group_size, dim=0), done)
    adv = group_relative_advantages(scores, group_size)[:, None]
    with torch.no_grad():
        before = per_token_logps(policy, seqs, P)
        anchor = per_token_logps(ref_model, seqs, P)
    policy.train()
    now = per_token_logps(policy, seqs, P)
    ratio = torch.exp(now - before)
    bounded = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    gain = torch.minimum(ratio * adv, bounded * adv)
    drift = torch.exp(anchor - now) - (anchor - now) - 1
    per_token = (gain - beta * drift) * keep
    objective = (per_token.sum(dim=1) / keep.sum(dim=1).clamp(min=1)).mean()
    optimizer.zero_grad(set_to_none=True)
    (-objective).backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    policy.eval()
    return scores.mean().item()


assert self_check_iteration(grpo_iteration_reference)

# %% [markdown]
# ## 5. Where this sits: PPO, R1-Zero, R1
#
# **PPO vs GRPO.** PPO, the algorithm behind InstructGPT-style RLHF, uses the same clipped surrogate, but its
# advantage comes from a learned **value model** (a critic, usually as large as the policy) that predicts the
# expected reward from every prefix, trained alongside the policy; the KL to the reference is folded into the
# reward. GRPO drops the critic: the group's mean and spread are the baseline, and the KL enters the loss directly.
# The price is `G` samples per prompt. With a learned reward model, PPO keeps the policy, the value model, the
# reference and the reward model in memory; GRPO with a rule-based reward keeps the policy and the reference. For
# our model:

# %%
per_model = sum(p.numel() * p.element_size() for p in policy0.parameters())
print(f"one model: {per_model / 1024:.0f} KiB of float32 weights")
print(f"PPO with a learned reward model: 4 models = {4 * per_model / 1024:.0f} KiB, plus the optimiser state of two "
      f"(policy and value: {2 * 2 * per_model / 1024:.0f} KiB for AdamW's two moments)")
print(f"GRPO with a rule-based reward: 2 models = {2 * per_model / 1024:.0f} KiB, plus the policy's optimiser state "
      f"({2 * per_model / 1024:.0f} KiB)")

# %% [markdown]
# **R1-Zero** applied GRPO directly to the pre-trained base model, with no SFT at all, and reasoning behaviour
# (long chains of thought, self-checking) emerged from the accuracy and format rewards alone. That works only
# because a strong base model is sometimes right: a group needs at least one completion that scores differently
# from the others. Our untrained model shows the failure mode in its starkest form:

# %%
untrained = build_post_model(SEEDS[0])
g0 = torch.Generator().manual_seed(9)
p0 = task.sample_train(cfg["prompts_per_step"], g0)
s0 = sample_completions(untrained, task.prompts(p0).repeat_interleave(G, 0), task.max_new_tokens, tok.eos_id, 1.0, g0)
r0 = task.rewards(p0.repeat_interleave(G, 0), s0[:, task.prompt_len:])
flat0 = (group_relative_advantages(r0, G).view(-1, G) == 0).all(dim=1).float().mean().item()
print(f"untrained model: mean reward {r0.mean().item():.3f}, correct completions {int((r0 > 0.5).sum())} of {len(r0)}, "
      f"groups without spread {flat0:.0%}")
print(f"fine-tuned model (seed {SEEDS[0]}): groups without spread in the run's first iteration "
      f"{runs[SEEDS[0]]['grpo'][0]['zero_std_groups']:.0%}")

# %% [markdown]
# R1-Zero's outputs were also hard to read (mixed languages, no structure). **R1** therefore went in stages: a
# small "cold-start" SFT set of long, readable reasoning examples; GRPO on reasoning tasks (adding a reward for
# answering in one language); then **rejection sampling**: the RL model answers many prompts several times, a
# verifier (or a judge model) keeps only the good answers, and those become a large new SFT set, together with
# general, non-reasoning data; a fresh SFT on it; and a last RL stage for helpfulness and harmlessness as well as
# reasoning. The same SFT sets also distilled R1 into small dense models.
#
# Rejection sampling needs nothing new here: sample a group per prompt from the GRPO model, keep the correct
# completions. The kept pairs are SFT data whose answers the model itself wrote:

# %%
best = max(SEEDS, key=lambda s: runs[s]["acc_grpo"])
g5 = torch.Generator().manual_seed(17)
p5 = task.sample_train(cfg["prompts_per_step"], g5)
s5 = sample_completions(runs[best]["model"], task.prompts(p5).repeat_interleave(G, 0), task.max_new_tokens,
                        tok.eos_id, 1.0, g5)
ok5 = task.correct(p5.repeat_interleave(G, 0), s5[:, task.prompt_len:])
solved = ok5.view(-1, G).any(dim=1)
print(f"seed {best} after GRPO: {int(ok5.sum())} correct completions of {len(ok5)} kept; {int(solved.sum())} of "
      f"{len(p5)} prompts have at least one")

# %% [markdown]
# ## Summary
#
# - A verifiable task lets a program compute the reward: correctness plus format, no learned reward model.
# - SFT teaches the template and the answers with a loss on the answer tokens only (the `<eos>` included).
# - GRPO samples a group per prompt and standardises the rewards within the group; a group without spread gets
#   zero advantages (its tokens still pay the KL penalty). The loss is PPO's clipped surrogate on per-token ratios
#   `exp(log π_θ − log π_old)`, minus `β` times the k3 estimate of the KL to a frozen reference, averaged per
#   completion, then over completions (DAPO's token-level mean and Dr. GRPO's constant are the alternatives).
# - Dividing by the group's std amplifies a small format term to full strength: gate it on correctness, or keep
#   the rewards' scale.
# - GRPO sharpens what the fine-tuned model already sometimes gets right; judge its gain item by item against the
#   same model (fixed vs broken items, an exact McNemar test), over seeds and sample streams, not against the
#   spread between seeds.
# - A reward that pays for something other than the goal gets exploited.
# - R1-Zero: RL from the base model; R1: cold-start SFT, GRPO, rejection-sampling SFT, final RL.
#
# ## Extension (optional)
#
# **One round of rejection-sampling SFT.** Write `rejection_sft_pairs(model, pairs, G, generator)` that samples `G`
# completions per prompt and returns the `(a, b)` pairs of the prompts for which at least one completion was
# correct (a `(n, 2)` long tensor), ready for `sft_train(..., pool=...)`. Then fine-tune a copy of a model on them
# and compare its held-out accuracy with the original's.

# %%
def rejection_sft_pairs(model, pairs, G, generator):
    # TODO (optional): sample G completions per prompt; keep the pairs with at least one correct completion
    return None


def self_check_rejection(fn=None) -> bool:
    fn = fn or rejection_sft_pairs
    try:
        got = fn(runs[best]["model"], p5, G, torch.Generator().manual_seed(17))
        asked = {tuple(p) for p in p5.tolist()}
        ok = (isinstance(got, torch.Tensor) and got.dim() == 2 and got.shape[1] == 2 and len(got) > 0
              and all(tuple(p) in asked for p in got.tolist()))
    except Exception as exc:   # a self-check never raises
        print(f"✗ not yet: it raised {type(exc).__name__}: {exc}")
        return False
    print("✓ a non-empty (n, 2) set of training pairs" if ok else "✗ not yet: return the (n, 2) pairs of the solved prompts")
    return ok


self_check_rejection();
