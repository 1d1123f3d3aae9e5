"""Bug catalog of unit 19 (post-training): the classic mistakes of a reward, an SFT loss and GRPO, each a runnable
mutant.

Named by the output they produce on the check's probes (``detect="mutant"``): a reward that accepts cut-off or
zero-padded answers, reads past the first ``<eos>`` or has no format term; an SFT loss over the prompt tokens, over
the padding, without the shift, without the first answer token, without the ``<eos>``, or a mean of per-row means;
advantages normalised over the whole batch instead of per group, over strided groups, with the population std,
without the std, or divided by a zero std; log-probabilities without the shift, probabilities instead of logs, the
log of a softmax, or every position instead of the completion's; a GRPO loss with the KL sign flipped, the KL
estimator reversed, k1 instead of k3, a quotient of log-probabilities or the inverse as the ratio, no clipping, a
one-sided clip, the clipped term without the min, or the mask ignored; and the two published normalisations that
are not the one the exercise asks for (DAPO's token-level mean, Dr. GRPO's constant), named as alternatives. By a
property the check names (``detect="detector"``): a gradient reaching the reference model's log-probabilities; a
cut-off completion paid as correct, a sum found as a substring, a lax format (``int()``); one model call per
position.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from ..core import bug

U = "19"
REWARD, SFT, ADV, LOGPS, LOSS = (f"{U}.{n}" for n in ("addition_reward", "sft_loss", "group_relative_advantages",
                                                      "per_token_logps", "grpo_loss"))


# ---------------------------------------------------------------- the reward


def _reward(completion, answer, correct_weight=1.0, format_weight=0.1, *, need_eos=True, zeros_ok=False,
            format_term=True, past_eos=False):
    if need_eos and "<eos>" not in completion:
        return 0.0
    head = completion.replace("<eos>", "") if past_eos else completion.split("<eos>", 1)[0]
    pattern = r"[0-9]+" if zeros_ok else r"0|[1-9][0-9]*"
    if not re.fullmatch(pattern, head):
        return 0.0
    right = int(head) == int(answer)
    return float(correct_weight) * right + (float(format_weight) if format_term else 0.0)


@bug("B19.no_eos_required", REWARD, "A completion cut off before its end-of-sequence token is counted as "
     "well-formed: the model is never taught to stop.", name="addition_reward")
def _no_eos(completion, answer, correct_weight=1.0, format_weight=0.1):
    return _reward(completion, answer, correct_weight, format_weight, need_eos=False)


@bug("B19.leading_zeros", REWARD, "An answer with leading zeros (042) is counted as well-formed: the format "
     "asks for the number as it is normally written.", name="addition_reward")
def _leading_zeros(completion, answer, correct_weight=1.0, format_weight=0.1):
    return _reward(completion, answer, correct_weight, format_weight, zeros_ok=True)


@bug("B19.no_format_term", REWARD, "The format term is missing: a well-formed wrong answer earns nothing, so "
     "the reward cannot tell a tidy wrong answer from garbage.", name="addition_reward")
def _no_format(completion, answer, correct_weight=1.0, format_weight=0.1):
    return _reward(completion, answer, correct_weight, format_weight, format_term=False)


@bug("B19.reads_past_eos", REWARD, "Text after the first end-of-sequence token is read as part of the answer; "
     "the answer ends at the first one.", name="addition_reward")
def _past_eos(completion, answer, correct_weight=1.0, format_weight=0.1):
    return _reward(completion, answer, correct_weight, format_weight, past_eos=True)


@bug("B19.correct_without_format", REWARD, "A completion cut off before its <eos> is paid as correct: the sum "
     "is there, but correct means well-formed and equal to the sum, and well-formed needs the <eos>.",
     detect="detector", name="addition_reward")
def _correct_without_format(completion, answer, correct_weight=1.0, format_weight=0.1):
    head, sep, _ = completion.partition("<eos>")
    well_formed = bool(sep) and re.fullmatch(r"0|[1-9][0-9]*", head) is not None
    right = (head if sep else completion) == str(answer)
    return float(correct_weight) * right + float(format_weight) * well_formed


@bug("B19.sum_found_in_text", REWARD, "A completion is paid as correct because the sum appears somewhere in it "
     "(1980 holds 198): correctness compares the whole answer, read up to the first <eos>, with the sum.",
     detect="detector", name="addition_reward")
def _sum_found_in_text(completion, answer, correct_weight=1.0, format_weight=0.1):
    head, sep, _ = completion.partition("<eos>")
    well_formed = bool(sep) and re.fullmatch(r"0|[1-9][0-9]*", head) is not None
    return float(correct_weight) * (well_formed and str(answer) in head) + float(format_weight) * well_formed


@bug("B19.lax_format", REWARD, "A text that is not a number written the usual way (a sign, a space, a digit "
     "separator or leading zeros) is counted as well-formed: converting it with int() accepts all of these. "
     "Well-formed means digits only, without leading zeros.", detect="detector", name="addition_reward")
def _lax_format(completion, answer, correct_weight=1.0, format_weight=0.1):
    head, sep, _ = completion.partition("<eos>")
    if not sep:
        return 0.0
    try:
        value = int(head)
    except ValueError:
        return 0.0
    return float(correct_weight) * (value == int(answer)) + float(format_weight)


# ---------------------------------------------------------------- the SFT loss


def _sft(logits, ids, prompt_len, pad_id, *, prompt=False, pads=False, shift=True, first=True, row_means=False,
         eos=True):
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(ids.shape):
        raise ValueError("logits and ids do not match")
    if shift:
        scores, targets = logits[:, :-1], ids[:, 1:]
        start = 0 if prompt else prompt_len - 1 + (0 if first else 1)
    else:
        scores, targets = logits, ids
        start = 0 if prompt else prompt_len
    keep = torch.ones_like(targets, dtype=torch.bool)
    keep[:, :start] = False
    if not pads:
        keep &= targets != pad_id
    if not eos:  # the last non-padding token of each row (its <eos>) dropped
        last = (ids != pad_id).long().sum(1) - 1 - (1 if shift else 0)
        keep[torch.arange(keep.shape[0]), last.clamp(min=0)] = False
    nll = F.cross_entropy(scores.reshape(-1, scores.shape[-1]), targets.reshape(-1), reduction="none")
    nll = nll.view(targets.shape) * keep
    if row_means:
        return (nll.sum(1) / keep.sum(1).clamp(min=1)).mean()
    return nll.sum() / keep.sum()


@bug("B19.loss_on_prompt", SFT, "The loss also covers the prompt's tokens: the model is trained to write the "
     "questions as well as the answers. Only the completion is what it must learn to write.", name="sft_loss")
def _loss_on_prompt(logits, ids, prompt_len, pad_id):
    return _sft(logits, ids, prompt_len, pad_id, prompt=True)


@bug("B19.pad_in_loss", SFT, "Padding positions are scored: the model learns to predict padding after its "
     "answer, and short answers weigh by the padding they carry.", name="sft_loss")
def _pad_in_loss(logits, ids, prompt_len, pad_id):
    return _sft(logits, ids, prompt_len, pad_id, pads=True)


@bug("B19.no_shift", SFT, "Each logit is scored against the token at its own position: a causal model's "
     "logit at a position predicts the next token.", name="sft_loss")
def _no_shift(logits, ids, prompt_len, pad_id):
    return _sft(logits, ids, prompt_len, pad_id, shift=False)


@bug("B19.first_answer_token_missed", SFT, "The first answer token is not in the loss: it is predicted by the "
     "logit of the last prompt position, which the mask dropped.", name="sft_loss")
def _first_missed(logits, ids, prompt_len, pad_id):
    return _sft(logits, ids, prompt_len, pad_id, first=False)


@bug("B19.mean_of_row_means", SFT, "Each row's loss is averaged first and the rows then averaged: a token of "
     "a short answer weighs more than one of a long answer. Take one mean over all answer tokens.", name="sft_loss")
def _row_means(logits, ids, prompt_len, pad_id):
    return _sft(logits, ids, prompt_len, pad_id, row_means=True)


@bug("B19.eos_not_learned", SFT, "The end-of-sequence token after each answer is left out of the loss: the "
     "model learns the digits but not to stop, and a completion that runs on is never well-formed.",
     name="sft_loss")
def _eos_not_learned(logits, ids, prompt_len, pad_id):
    return _sft(logits, ids, prompt_len, pad_id, eos=False)


# ---------------------------------------------------------------- advantages


def _adv(rewards, group_size, *, per_group=True, unbiased=True, divide=True, guard=True, strided=False,
         exact_equal=True):
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError("bad rewards or group size")
    if strided:  # groups read as columns of (G, B): rows i, i + B, i + 2B, ...
        return _adv(rewards.float().view(group_size, -1).t().reshape(-1), group_size).view(-1, group_size).t() \
            .reshape(-1)
    r = rewards.float().view(-1, group_size) if per_group else rewards.float().view(1, -1)
    centred = r - r.mean(dim=1, keepdim=True)
    if not divide:
        return centred.reshape(-1)
    std = r.std(dim=1, keepdim=True, unbiased=unbiased)
    if not guard:
        return (centred / std).reshape(-1)
    spread = (r.amax(dim=1, keepdim=True) > r.amin(dim=1, keepdim=True)) if exact_equal else std > 0
    return torch.where(spread, centred / torch.where(spread, std, torch.ones_like(std)),
                       torch.zeros_like(centred)).reshape(-1)


@bug("B19.not_per_group", ADV, "The advantages are normalised over the whole batch, not within each prompt's "
     "group: an easy prompt's completions then all look good and a hard one's all bad. GRPO's baseline is the "
     "group of the same prompt.", name="group_relative_advantages")
def _not_per_group(rewards, group_size):
    return _adv(rewards, group_size, per_group=False)


@bug("B19.population_std", ADV, "The spread is the population standard deviation (divide by G); GRPO's "
     "convention here is the sample one (divide by G − 1), as the stated evidence shows.",
     name="group_relative_advantages")
def _population_std(rewards, group_size):
    return _adv(rewards, group_size, unbiased=False)


@bug("B19.no_std_division", ADV, "The rewards are centred on the group mean but not divided by the group's "
     "standard deviation.", name="group_relative_advantages")
def _no_std(rewards, group_size):
    return _adv(rewards, group_size, divide=False)


@bug("B19.spread_by_rounding", ADV, "A group is taken to have spread when its standard deviation is not exactly "
     "0. In float32 the mean of equal rewards is not always exactly their value (eight rewards 0.1 in a group of "
     "their own), their std then comes out near 1e-8, and dividing the rounding noise by it gives every "
     "completion an advantage near ±0.94: a group without spread moves the policy. Decide 'no spread' from the "
     "rewards themselves.", name="group_relative_advantages")
def _spread_by_rounding(rewards, group_size):
    return _adv(rewards, group_size, exact_equal=False)


@bug("B19.zero_std_nan", ADV, "A group whose rewards are all equal has standard deviation 0, and dividing by it "
     "gives NaN. Such a group carries no preference: its advantages are 0.", name="group_relative_advantages")
def _zero_std(rewards, group_size):
    return _adv(rewards, group_size, guard=False)


@bug("B19.strided_groups", ADV, "The groups are read with a stride (rows b, b + B, b + 2B, …) instead of as "
     "consecutive blocks: each completion is compared with completions of other prompts. The group of prompt b "
     "is rows b·G … b·G + G − 1.", name="group_relative_advantages")
def _strided(rewards, group_size):
    return _adv(rewards, group_size, strided=True)


# ---------------------------------------------------------------- per-token log-probabilities


def _logps(model, sequences, prompt_len, *, shift=True, logs=True, everything=False, log_of_softmax=False):
    T = sequences.shape[1]
    if not 1 <= prompt_len < T:
        raise ValueError("prompt_len out of range")
    logits = model(sequences).float()
    lp = torch.log_softmax(logits, -1) if logs else torch.softmax(logits, -1)
    if log_of_softmax:
        lp = torch.log(torch.softmax(logits, -1))
    if everything:
        return lp[:, :-1].gather(-1, sequences[:, 1:, None])[..., 0]
    rows = lp[:, prompt_len - 1:-1] if shift else lp[:, prompt_len:]
    return rows.gather(-1, sequences[:, prompt_len:, None])[..., 0]


@bug("B19.logps_unshifted", LOGPS, "Each completion token is scored by the logit at its own position, which has "
     "already read it; the logit one position earlier predicts it.", name="per_token_logps")
def _unshifted(model, sequences, prompt_len):
    return _logps(model, sequences, prompt_len, shift=False)


@bug("B19.probs_not_logs", LOGPS, "Probabilities are returned instead of log-probabilities (softmax, not "
     "log-softmax).", name="per_token_logps")
def _probs(model, sequences, prompt_len):
    return _logps(model, sequences, prompt_len, logs=False)


@bug("B19.logps_include_prompt", LOGPS, "The prompt's tokens are scored too; the policy is judged on the "
     "completion only, so return the completion's positions.", name="per_token_logps")
def _include_prompt(model, sequences, prompt_len):
    return _logps(model, sequences, prompt_len, everything=True)


@bug("B19.log_of_softmax", LOGPS, "The log is taken of the softmax's probabilities: a token whose probability "
     "underflows to 0 in float32 gets log 0 = −inf. The log-softmax computes the same value without forming the "
     "probability.", name="per_token_logps")
def _log_of_softmax(model, sequences, prompt_len):
    return _logps(model, sequences, prompt_len, log_of_softmax=True)


@bug("B19.forward_per_position", LOGPS, "The model is run once per completion position, on the prefix before "
     "it: the right numbers, at T_c times the cost. A causal model's single forward over the whole sequence "
     "already gives the prediction at every position, each from the tokens before it.", detect="detector",
     name="per_token_logps")
def _forward_per_position(model, sequences, prompt_len):
    T = sequences.shape[1]
    if not 1 <= prompt_len < T:
        raise ValueError("prompt_len out of range")
    cols = [torch.log_softmax(model(sequences[:, :p])[:, -1].float(), -1).gather(1, sequences[:, p:p + 1])
            for p in range(prompt_len, T)]
    return torch.cat(cols, dim=1)


# ---------------------------------------------------------------- the GRPO loss


def _loss(logps, old, ref, adv, mask, clip_eps=0.2, beta=0.04, *, kl_sign=-1.0, kl_reversed=False,
          logp_quotient=False, clip=True, token_mean=False, use_mask=True, detach_ref=True, k1=False, clip_low=True,
          clip_high=True, ratio_reversed=False, use_min=True, constant_norm=False):
    if logps.dim() != 2 or any(tuple(x.shape) != tuple(logps.shape) for x in (old, ref, mask)) \
            or tuple(adv.shape) != (logps.shape[0],):
        raise ValueError("shapes do not match")
    old = old.detach()
    ref = ref.detach() if detach_ref else ref
    if logp_quotient:
        ratio = logps / old
    else:
        ratio = torch.exp(old - logps) if ratio_reversed else torch.exp(logps - old)
    a = adv.detach().to(logps.dtype)[:, None]
    clipped = torch.clamp(ratio, 1 - clip_eps if clip_low else None, 1 + clip_eps if clip_high else None)
    if not clip:
        surrogate = ratio * a
    elif not use_min:
        surrogate = clipped * a
    else:
        surrogate = torch.minimum(ratio * a, clipped * a)
    d = (logps - ref) if kl_reversed else (ref - logps)
    kl = -d if k1 else torch.exp(d) - d - 1
    per_token = surrogate + kl_sign * beta * kl
    m = mask.to(logps.dtype) if use_mask else torch.ones_like(logps)
    if token_mean:
        return -(per_token * m).sum() / m.sum().clamp(min=1)
    if constant_norm:
        return -(per_token * m).sum() / m.numel()
    return -((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()


@bug("B19.kl_sign", LOSS, "The KL term has the wrong sign: the objective then rewards moving away from the "
     "reference model instead of penalising it. The loss must rise as the policy drifts.", name="grpo_loss")
def _kl_sign(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, kl_sign=1.0)


@bug("B19.kl_reversed", LOSS, "The k3 estimator is built from π_θ/π_ref instead of π_ref/π_θ: that estimates the "
     "other KL direction, not the one of the samples drawn from the policy.", name="grpo_loss")
def _kl_reversed(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, kl_reversed=True)


@bug("B19.ratio_of_logps", LOSS, "The ratio is a quotient of log-probabilities. The importance ratio is one of "
     "probabilities, π_θ/π_old: the exponential of the difference of the log-probabilities.", name="grpo_loss")
def _ratio_of_logps(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, logp_quotient=True)


@bug("B19.no_clip", LOSS, "The ratio is not clipped: far from the sampling policy, a single update can move it "
     "arbitrarily. Take the smaller of the plain and the clipped term.", name="grpo_loss")
def _no_clip(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, clip=False)


@bug("B19.token_mean", LOSS, "One mean over every token of the batch. That is DAPO's normalisation (TRL's "
     "loss_type \"dapo\", its default): a published alternative in which each token weighs the same, so long "
     "completions weigh more. This exercise asks for DeepSeekMath's eq. 3 (TRL's \"grpo\"): each completion's "
     "tokens averaged first, then the completions.", name="grpo_loss")
def _token_mean(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, token_mean=True)


@bug("B19.constant_normaliser", LOSS, "The masked sum divided by a constant, the number of rows times the slots "
     "per row. That is Dr. GRPO's normalisation (TRL's loss_type \"dr_grpo\"), a published alternative without a "
     "length bias; this exercise asks for DeepSeekMath's eq. 3: each completion's tokens averaged over its own "
     "length, then the completions.", name="grpo_loss")
def _constant_normaliser(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, constant_norm=True)


@bug("B19.kl_k1", LOSS, "The KL term is the plain log-ratio log π_θ − log π_ref (Schulman's k1): unbiased, but "
     "negative on many tokens and noisy, and its gradient does not pull the policy back toward the reference. "
     "The objective uses k3, which is never negative.", name="grpo_loss")
def _kl_k1(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, k1=True)


@bug("B19.one_sided_clip", LOSS, "The ratio is clipped on one side only: the clip range has two bounds, 1 − ε "
     "and 1 + ε, and a token whose ratio left it on the other side still gets an unbounded update.",
     name="grpo_loss")
def _one_sided_clip(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, clip_low=False)


@bug("B19.one_sided_clip_low", LOSS, "The ratio is clipped on one side only: the clip range has two bounds, 1 − ε "
     "and 1 + ε, and a token whose ratio left it on the other side still gets an unbounded update.",
     name="grpo_loss")
def _one_sided_clip_low(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, clip_high=False)


@bug("B19.ratio_reversed", LOSS, "The ratio is π_old / π_θ, the inverse of the importance ratio: raising a "
     "token's probability then lowers the surrogate of a positive advantage. The ratio is π_θ / π_old.",
     name="grpo_loss")
def _ratio_reversed(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, ratio_reversed=True)


@bug("B19.clip_without_min", LOSS, "Only the clipped term is kept, without the minimum with the unclipped one: "
     "the objective is then no longer a pessimistic bound, and a ratio outside the range on the unfavourable "
     "side is not penalised in full.", name="grpo_loss")
def _clip_without_min(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, use_min=False)


@bug("B19.mask_ignored", LOSS, "The slots after a completion's end are counted as its tokens; the mask says "
     "which tokens belong to it.", name="grpo_loss")
def _mask_ignored(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, use_mask=False)


@bug("B19.ref_not_frozen", LOSS, "The gradient reaches the reference model's log-probabilities, so the "
     "reference would be updated with the policy and the KL penalty would chase a moving target. Treat them "
     "as constants.", detect="detector", name="grpo_loss")
def _ref_not_frozen(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    return _loss(logps, old_logps, ref_logps, advantages, mask, clip_eps, beta, detach_ref=False)


# ---------------------------------------------------------------- the update on fixed samples

UPDATE = f"{U}.grpo_update"


def _update(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps=0.2, beta=0.04,
            inner_steps=1, *, old_each_step=False, zero_grad=True, step_first=False, ref_is_old=False,
            batch_groups=False):
    from llmcourse.post.grpo import group_relative_advantages, grpo_loss, per_token_logps

    if inner_steps < 1:
        raise ValueError("inner_steps must be >= 1")
    adv = group_relative_advantages(rewards, rewards.numel() if batch_groups else group_size)
    with torch.no_grad():
        old = per_token_logps(policy, sequences, prompt_len)
        ref = old if ref_is_old else per_token_logps(ref_model, sequences, prompt_len)
    losses = []
    for _ in range(inner_steps):
        if old_each_step:
            with torch.no_grad():
                old = per_token_logps(policy, sequences, prompt_len)
        loss = grpo_loss(per_token_logps(policy, sequences, prompt_len), old, ref, adv, mask, clip_eps, beta)
        if zero_grad:
            optimizer.zero_grad()
        if step_first:
            optimizer.step()
            loss.backward()
        else:
            loss.backward()
            optimizer.step()
        losses.append(float(loss.detach()))
    return losses


@bug("B19.old_each_step", UPDATE, "The old log-probabilities are recomputed at every inner step, so π_old is the "
     "current policy, every ratio is 1 and the clip never acts. π_old is the policy that sampled the batch: "
     "compute its log-probabilities once, before the first step.", name="grpo_update")
def _old_each_step(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps=0.2,
                   beta=0.04, inner_steps=1):
    return _update(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps, beta,
                   inner_steps, old_each_step=True)


@bug("B19.no_zero_grad", UPDATE, "The gradients are not cleared between steps: each step adds the previous "
     "steps' gradients to its own.", name="grpo_update")
def _no_zero_grad(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps=0.2,
                  beta=0.04, inner_steps=1):
    return _update(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps, beta,
                   inner_steps, zero_grad=False)


@bug("B19.step_on_cleared_gradients", UPDATE, "The policy never moves: the optimizer steps while the gradients "
     "are cleared (the step comes before the backward pass, or the gradients are zeroed between backward and "
     "step). Each step: clear the gradients, backward, then step.", name="grpo_update")
def _step_on_cleared_gradients(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size,
                          clip_eps=0.2, beta=0.04, inner_steps=1):
    return _update(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps, beta,
                   inner_steps, step_first=True)


@bug("B19.ref_is_policy", UPDATE, "The reference log-probabilities are taken from the policy instead of the frozen "
     "reference model: the KL penalty then measures the drift since sampling, not from the model GRPO started "
     "from.", name="grpo_update")
def _ref_is_policy(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps=0.2,
                   beta=0.04, inner_steps=1):
    return _update(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps, beta,
                   inner_steps, ref_is_old=True)


@bug("B19.update_one_group", UPDATE, "The advantages are computed over the whole batch as one group: group_size "
     "says which completions answer the same prompt.", name="grpo_update")
def _update_one_group(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps=0.2,
                      beta=0.04, inner_steps=1):
    return _update(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps, beta,
                   inner_steps, batch_groups=True)
