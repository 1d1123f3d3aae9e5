# %% [markdown]
# # Unit 19 — From a pretrained model to a reasoning model: exercises
#
# Six graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# You write the pieces of post-training that the lesson used from the library: the rule-based reward, the
# fine-tuning loss, the three parts of the GRPO objective, and the update that puts them together. The grader runs more checks than you see here:
# many completions and batches, rows of different lengths, groups with and without spread, a tiny Llama with
# random weights compared with a position-by-position forward, log-probabilities far from each other (so that
# the clip acts), the gradients of the loss, and the arguments at values other than their defaults. When
# something fails it tells you what was expected, what came back, and, if your mistake is a known one, its name
# and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/19_post_training/19_post_training.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `torch.nn.functional`, `math`, `re` and the
# standard library.
#
# **Conventions** (the lesson's addition task). Prompts look like `<bos><user>07+35<assistant>`, the ideal
# completion is `42<eos>`; a batch of GRPO completions holds `B` prompts × `G` completions, the group of prompt
# `b` in rows `b·G … b·G + G − 1`.

# %%
import math  # noqa: F401
import re  # noqa: F401

import torch
import torch.nn.functional as F  # noqa: F401

import llmcourse
from llmcourse.post import AdditionTask
from llmcourse.post.run import build_post_model

cfg = llmcourse.setup_notebook("19")
task = AdditionTask(n_digits=2, n_test=cfg["n_test"], seed=0)
tok = task.tokenizer

# %% [markdown]
# ## Exercise 1 — `addition_reward` (3 points)
#
# ```python
# def addition_reward(completion: str, answer: int, correct_weight: float = 1.0,
#                     format_weight: float = 0.1) -> float: ...
# ```
#
# The reward of one decoded completion (the text after the prompt, e.g. `"42<eos><eos>"`) for the question whose
# true sum is `answer`. Read the completion up to its **first** `<eos>`; what follows it does not count.
#
# - *well-formed*: an `<eos>` is there, and the text before it is a decimal number without leading zeros (`0`
#   itself is allowed; `042`, `4 2`, an empty answer and `4+2` are not). A completion cut off before any
#   `<eos>` is not well-formed.
# - *correct*: well-formed and the number equals `answer`.
#
# Return `correct_weight · correct + format_weight · well_formed` as a Python float (with the defaults: 0.0,
# 0.1 or 1.1).

# %% tags=["solution:19.addition_reward"]
def addition_reward(completion, answer, correct_weight=1.0, format_weight=0.1):
    """Rule-based reward: correctness plus a format bonus for a well-formed answer ended by <eos>."""
    ### BEGIN SOLUTION
    if "<eos>" not in completion:
        return 0.0
    head = completion.split("<eos>", 1)[0]
    if not head.isdigit() or not head.isascii() or (len(head) > 1 and head[0] == "0"):
        return 0.0
    score = float(format_weight)
    if int(head) == int(answer):
        score += float(correct_weight)
    return score
    ### END SOLUTION


# %% tags=["tests:19.addition_reward"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("19.addition_reward")  # noqa: E702
### END HIDDEN TESTS
assert abs(addition_reward("42<eos>", 42) - 1.1) < 1e-9, \
    "a correct, well-formed answer earns correct_weight + format_weight"
assert abs(addition_reward("41<eos>", 42) - 0.1) < 1e-9, "a well-formed wrong answer earns format_weight only"
assert addition_reward("42", 42) == 0.0, "without <eos> the completion is not well-formed"
assert isinstance(addition_reward("42<eos>", 42), float), "return a Python float"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `sft_loss` (3 points)
#
# ```python
# def sft_loss(logits: Tensor, ids: Tensor, prompt_len: int, pad_id: int) -> Tensor: ...
# ```
#
# `ids (B, T)` long holds prompts of length `prompt_len` (all the same length) followed by their ideal completions
# (answer digits and one `<eos>`), right-padded with `pad_id`; `logits (B, T, V) = model(ids)`. Return the
# scalar fine-tuning loss: the **mean next-token cross-entropy over the tokens the model must learn to write**.
#
# Evidence it must meet (the grader tests each one):
#
# - changing the logits at any position whose prediction is not one of those tokens leaves the loss unchanged
#   (and gives them zero gradient);
# - a model that never predicts the `<eos>` after an answer is penalised for it;
# - it is one mean over all those tokens of the batch: a row with a longer answer weighs more.
#
# Raise `ValueError` when `logits.shape[:2] != ids.shape`. (Deciding exactly which logits score which tokens is
# part of the exercise.)

# %% tags=["solution:19.sft_loss"]
def sft_loss(logits, ids, prompt_len, pad_id):
    """Mean next-token cross-entropy over the completions' tokens (answer + <eos>), prompt and padding masked."""
    ### BEGIN SOLUTION
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(ids.shape):
        raise ValueError(f"logits {tuple(logits.shape)} do not match ids {tuple(ids.shape)}")
    targets = ids[:, 1:]
    scoring = logits[:, :-1]
    keep = (targets != pad_id)
    keep[:, : prompt_len - 1] = False
    nll = -torch.log_softmax(scoring.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (nll * keep).sum() / keep.sum()
    ### END SOLUTION


# %% tags=["tests:19.sft_loss"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("19.sft_loss")  # noqa: E702
### END HIDDEN TESTS
pairs_v = torch.tensor([[7, 35], [99, 99]])
ids_v = torch.tensor([tok.encode(task.prompt_text(a, b) + task.answer_text(a, b)) + [tok.pad_id] * (c - len(str(a + b)))
                      for (a, b), c in zip(pairs_v.tolist(), (3, 3))])
logits_v = torch.randn(*ids_v.shape, tok.vocab_size, generator=torch.Generator().manual_seed(0))
loss_v = sft_loss(logits_v, ids_v, task.prompt_len, tok.pad_id)
assert loss_v.dim() == 0, f"the loss is a scalar; got shape {tuple(loss_v.shape)}"
changed = logits_v.clone()
changed[:, 0] += 5.0                         # position 0 predicts a prompt token
assert torch.allclose(sft_loss(changed, ids_v, task.prompt_len, tok.pad_id), loss_v), \
    "the logits that predict a prompt token must not change the loss"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `group_relative_advantages` (3 points)
#
# ```python
# def group_relative_advantages(rewards: Tensor, group_size: int) -> Tensor: ...
# ```
#
# `rewards (N,)`, `N = B·G` with `G = group_size`, grouped as in the conventions above. Return the `(N,)` GRPO
# advantages with outcome supervision: each reward measured against **its own group**, centred on the group's mean
# and divided by the group's standard deviation (DeepSeekMath §4.1.2).
#
# Evidence: one group of 4 with rewards `[1.1, 0.1, 0.1, 0.1]` has the advantages `[1.5, −0.5, −0.5, −0.5]`. A
# group whose completions all earned the same reward says nothing about which of them is better: it must not move
# the policy at all, and nothing you return is ever NaN or infinite. Raise `ValueError` when `rewards` is not 1-D,
# when `group_size < 2`, or when `N` is not a multiple of `group_size`.

# %% tags=["solution:19.group_relative_advantages"]
def group_relative_advantages(rewards, group_size):
    """(r − group mean) / group sample std; a group without spread gets zeros."""
    ### BEGIN SOLUTION
    if rewards.dim() != 1:
        raise ValueError("rewards must be 1-D")
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size} (G >= 2)")
    grouped = rewards.float().reshape(-1, group_size)
    spread = grouped.std(dim=1, unbiased=True, keepdim=True)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    flat = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)   # not spread == 0: rounding
    out = centred / torch.where(flat, torch.ones_like(spread), spread)
    return out.masked_fill(flat, 0.0).reshape(-1)
    ### END SOLUTION


# %% tags=["tests:19.group_relative_advantages"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("19.group_relative_advantages")  # noqa: E702
### END HIDDEN TESTS
adv_v = group_relative_advantages(torch.tensor([1.1, 0.1, 0.1, 0.1, 0.0, 1.1, 0.0, 0.1]), 4)
assert adv_v.shape == (8,), f"one advantage per completion; got {tuple(adv_v.shape)}"
assert torch.allclose(adv_v[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-4), adv_v[:4]
assert abs(adv_v[4:].mean().item()) < 1e-6, "each group's advantages have mean 0"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `per_token_logps` (3 points)
#
# ```python
# def per_token_logps(model, sequences: Tensor, prompt_len: int) -> Tensor: ...
# ```
#
# `sequences (N, T)` long: prompts of length `prompt_len` followed by completions; `model(sequences)` returns
# logits `(N, T, V)`. Return `(N, T − prompt_len)` float: entry `[i, t]` is the log-probability the model gives
# the completion's token `t` of row `i` (the token at position `prompt_len + t`), given everything before it. One
# forward pass; gradients must flow to the model's parameters when grad mode is on. Raise `ValueError` when
# `prompt_len` is outside `[1, T)`.

# %% tags=["solution:19.per_token_logps"]
def per_token_logps(model, sequences, prompt_len):
    """log π(token at p | tokens before p) for every completion position p >= prompt_len."""
    ### BEGIN SOLUTION
    T = sequences.shape[1]
    if not 1 <= prompt_len < T:
        raise ValueError(f"prompt_len must be in [1, {T}), got {prompt_len}")
    logits = model(sequences).float()
    logp = torch.log_softmax(logits[:, prompt_len - 1:T - 1], dim=-1)
    return torch.gather(logp, 2, sequences[:, prompt_len:, None])[..., 0]
    ### END SOLUTION


# %% tags=["tests:19.per_token_logps"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("19.per_token_logps")  # noqa: E702
### END HIDDEN TESTS
model_v = build_post_model(seed=0)
seqs_v = torch.cat([task.prompts(pairs_v), torch.tensor([[4, 2, 2], [1, 9, 8]]) + 5], dim=1)
lp_v = per_token_logps(model_v, seqs_v, task.prompt_len)
assert lp_v.shape == (2, 3), f"one log-probability per completion token; got {tuple(lp_v.shape)}"
assert bool((lp_v <= 0).all()), "log-probabilities are never positive"
with torch.no_grad():
    first = torch.log_softmax(model_v(seqs_v[:, : task.prompt_len])[:, -1], dim=-1)
assert torch.allclose(lp_v[:, 0], first.gather(1, seqs_v[:, task.prompt_len:task.prompt_len + 1])[:, 0], atol=1e-5), \
    "the first completion token is scored by the model that has read the prompt only"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `grpo_loss` (5 points)
#
# ```python
# def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps: float = 0.2,
#               beta: float = 0.04) -> Tensor: ...
# ```
#
# The GRPO loss `−J(θ)` of DeepSeekMath eq. 3, on `N` completions of `T_c` token slots each:
#
# - `logps (N, T_c)`: the per-token log-probabilities of the policy being trained (they carry gradients);
#   `old_logps`, the same under the policy that sampled the completions; `ref_logps`, under the frozen reference
#   model; `advantages (N,)`, one per completion; `mask (N, T_c)` bool, True on the completion's own tokens (the
#   slots after its first `<eos>` are not part of it).
# - `J = 1/N Σ_i 1/|o_i| Σ_{t ∈ o_i} [ min(ρ_{i,t} Â_i, clip(ρ_{i,t}, 1−ε, 1+ε) Â_i) − β·KL_{i,t} ]`, where
#   `ρ_{i,t}` is the probability ratio π_θ / π_old of token `t` and `KL_{i,t}` is Schulman's **k3** estimate of
#   `KL(π_θ ‖ π_ref)` at that token (the lesson derives it; it is ≥ 0 and 0 where the two models agree). A row
#   whose mask is empty contributes 0.
# - No gradient may reach `old_logps` or `ref_logps`: the old and the reference policy are not trained.
#
# The normalisation is a choice, and this exercise asks for DeepSeekMath's: `1/|o_i|` inside each completion, then
# `1/N` (TRL's `loss_type="grpo"`). Two published alternatives are *not* what is asked here, though neither is a
# mistake in general: DAPO's one mean over all the batch's tokens (TRL's default, `"dapo"`) and Dr. GRPO's constant
# normaliser (`"dr_grpo"`); the lesson compares the three.
#
# Return the scalar loss. Raise `ValueError` when the four `(N, T_c)` tensors do not share one shape or
# `advantages` is not `(N,)`.

# %% tags=["solution:19.grpo_loss"]
def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    """−J(θ): clipped surrogate minus β·k3 KL, averaged per completion, then over completions."""
    ### BEGIN SOLUTION
    shape = tuple(logps.shape)
    if len(shape) != 2 or any(tuple(x.shape) != shape for x in (old_logps, ref_logps, mask)):
        raise ValueError("logps, old_logps, ref_logps and mask must share one (N, T_c) shape")
    if tuple(advantages.shape) != shape[:1]:
        raise ValueError(f"advantages must have shape ({shape[0]},)")
    rho = (logps - old_logps.detach()).exp()
    a = advantages.detach().to(logps.dtype).unsqueeze(1)
    unclipped, clipped = rho * a, rho.clamp(1.0 - clip_eps, 1.0 + clip_eps) * a
    log_q = ref_logps.detach() - logps               # log(π_ref / π_θ)
    k3 = log_q.exp() - log_q - 1.0
    objective = torch.min(unclipped, clipped) - beta * k3
    w = mask.to(logps.dtype)
    per_row = (objective * w).sum(1) / w.sum(1).clamp_min(1.0)
    return -per_row.mean()
    ### END SOLUTION


# %% tags=["tests:19.grpo_loss"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("19.grpo_loss")  # noqa: E702
### END HIDDEN TESTS
g_v = torch.Generator().manual_seed(1)
lp = (-torch.rand(4, 3, generator=g_v) * 2).requires_grad_()
mask_v = torch.tensor([[True, True, True], [True, True, False], [True, False, False], [True, True, True]])
adv_g = torch.tensor([1.0, -1.0, 0.5, -0.5])
same = grpo_loss(lp, lp.detach(), lp.detach(), adv_g, mask_v)
assert same.dim() == 0, "the loss is a scalar"
assert abs(same.item() - 0.0) < 1e-6, "ρ = 1 and KL = 0 everywhere: the loss is −mean(Â) = 0 here"
far = grpo_loss(lp, lp.detach() - 1.0, lp.detach(), adv_g, mask_v, beta=0.0)
assert abs(far.item() - (1.5 * math.e - 1.5 * 1.2) / 4) < 1e-5, \
    "ρ = e ≈ 2.72: positive advantages are clipped at 1 + ε, negative ones keep ρ"
assert grpo_loss(lp, lp.detach(), lp.detach() - 1.0, adv_g, mask_v, beta=1.0).item() > same.item(), \
    "moving away from the reference must raise the loss"
print("visible tests passed")

# %% [markdown]
# ## Exercise 6 — `grpo_update` (3 points)
#
# ```python
# def grpo_update(policy, ref_model, optimizer, sequences: Tensor, prompt_len: int, rewards: Tensor, mask: Tensor,
#                 group_size: int, clip_eps: float = 0.2, beta: float = 0.04, inner_steps: int = 1) -> list[float]: ...
# ```
#
# The update half of one GRPO iteration, on completions the policy has already sampled (DeepSeekMath's
# Algorithm 1 runs `μ = inner_steps` optimizer steps on each sampled batch). `sequences (N, T)` holds the prompts
# (length `prompt_len`) followed by the completions, grouped as in the conventions; `rewards (N,)` are their
# rewards; `mask (N, T − prompt_len)` marks each completion's own tokens. `optimizer` already holds the policy's
# parameters.
#
# - Turn the rewards into advantages, and compute the log-probabilities of the completions under the policy *as it
#   sampled them* (the old policy) and under the frozen `ref_model`.
# - Then take `inner_steps` optimizer steps on the GRPO loss with `clip_eps` and `beta`, each step starting from
#   clean gradients.
# - Return the list of the `inner_steps` losses (Python floats), each the loss the step was taken on.
#
# Use your `group_relative_advantages`, `per_token_logps` and `grpo_loss` (the grader runs your update on the
# course's own versions of these three, so a mistake there is not counted twice). Only the policy is trained:
# `ref_model` must come out unchanged. Raise `ValueError` when `inner_steps < 1`.

# %% tags=["solution:19.grpo_update"]
def grpo_update(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps=0.2,
                beta=0.04, inner_steps=1):
    """Advantages, old and reference log-probabilities, then inner_steps optimizer steps on the GRPO loss."""
    ### BEGIN SOLUTION
    if inner_steps < 1:
        raise ValueError(f"inner_steps must be >= 1, got {inner_steps}")
    with torch.no_grad():
        before = per_token_logps(policy, sequences, prompt_len=prompt_len)
        advantages = group_relative_advantages(rewards, group_size)
        anchor = per_token_logps(ref_model, sequences, prompt_len=prompt_len)
    history = []
    for _ in range(inner_steps):
        loss = grpo_loss(per_token_logps(policy, sequences, prompt_len=prompt_len), before, anchor, advantages, mask,
                         clip_eps=clip_eps, beta=beta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(float(loss.detach()))
    return history
    ### END SOLUTION


# %% tags=["tests:19.grpo_update"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("19.grpo_update")  # noqa: E702
### END HIDDEN TESTS
policy_v, ref_v = build_post_model(seed=3), build_post_model(seed=3)
seqs_u = torch.cat([task.prompts(pairs_v).repeat_interleave(2, dim=0), torch.tensor([[4, 2, 2], [1, 9, 8]] * 2) + 5],
                   dim=1)
rewards_u = torch.tensor([1.1, 0.1, 0.0, 1.1])
mask_u = torch.ones(4, 3, dtype=torch.bool)
w0 = [p.detach().clone() for p in policy_v.parameters()]
losses_u = grpo_update(policy_v, ref_v, torch.optim.SGD(policy_v.parameters(), lr=0.1), seqs_u, task.prompt_len,
                       rewards_u, mask_u, 2, inner_steps=2)
assert isinstance(losses_u, list) and len(losses_u) == 2, f"one loss per inner step; got {losses_u!r}"
assert all(isinstance(x, float) for x in losses_u), "the losses are Python floats"
assert any(not torch.equal(a, b) for a, b in zip(w0, policy_v.parameters())), "the policy's parameters must change"
assert all(torch.equal(a, b) for a, b in zip(build_post_model(seed=3).parameters(), ref_v.parameters())), \
    "the reference model must not change"
print("visible tests passed")

# %% [markdown]
# ## Your pieces at work
#
# One GRPO iteration made of your functions: a small Llama with random weights samples a group of completions per
# prompt, and your pieces turn them into rewards, advantages, log-probabilities and a loss whose gradient reaches
# the model.

# %%
from llmcourse.post import completion_mask, sample_completions  # noqa: E402

policy = build_post_model(seed=1)
G = cfg["group_size"]
pairs_w = task.sample_train(4, torch.Generator().manual_seed(5))
prompts_w = task.prompts(pairs_w).repeat_interleave(G, dim=0)
seqs_w = sample_completions(policy, prompts_w, task.max_new_tokens, tok.eos_id, 1.0, torch.Generator().manual_seed(6))
comps_w = seqs_w[:, task.prompt_len:]
rewards_w = torch.tensor([addition_reward(tok.decode(c), a + b) for (a, b), c in
                          zip(pairs_w.repeat_interleave(G, dim=0).tolist(), comps_w)])
adv_w = group_relative_advantages(rewards_w, G)
with torch.no_grad():
    old_w = per_token_logps(policy, seqs_w, task.prompt_len)
loss_w = grpo_loss(per_token_logps(policy, seqs_w, task.prompt_len), old_w, old_w, adv_w,
                   completion_mask(comps_w, tok.eos_id))
loss_w.backward()
grad_norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in policy.parameters() if p.grad is not None))
print(f"mean reward {rewards_w.mean().item():.3f}, loss {loss_w.item():.4f}, "
      f"gradient norm {grad_norm:.3g}")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
