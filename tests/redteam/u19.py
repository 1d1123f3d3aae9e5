"""Red-team answers for unit 19 (post-training: reward, SFT loss, GRPO advantages, log-probs, loss).

Written from the released exercise notebook only (origin "red team"), then the answers issue 41 names.
"""

from tests.redteam import Answer

ANSWERS = [
    # -- 19.addition_reward -----------------------------------------------------------------------------------------
    Answer(
        "19.addition_reward",
        "int() parses the answer: leading zeros, spaces and underscores accepted",
        '''
def addition_reward(completion, answer, correct_weight=1.0, format_weight=0.1):
    if "<eos>" not in completion:
        return 0.0
    text = completion.split("<eos>")[0]
    try:
        value = int(text)
    except ValueError:
        return 0.0
    return float(correct_weight * (value == answer) + format_weight)
''',
        bug="B19.lax_format",
    ),
    Answer(
        "19.addition_reward",
        "the first number anywhere, <eos> not required",
        '''
def addition_reward(completion, answer, correct_weight=1.0, format_weight=0.1):
    m = re.search(r"\\d+", completion)
    if m is None:
        return 0.0
    return float(correct_weight * (int(m.group()) == answer) + format_weight)
''',
        bug="B19.no_eos_required",
    ),
    Answer(
        "19.addition_reward",
        "the text before the last <eos> (all <eos> stripped from the end)",
        '''
def addition_reward(completion, answer, correct_weight=1.0, format_weight=0.1):
    if "<eos>" not in completion:
        return 0.0
    text = completion.rsplit("<eos>", 1)[0].replace("<eos>", "")
    ok = re.fullmatch(r"0|[1-9][0-9]*", text) is not None
    return float(correct_weight * (ok and int(text) == answer) + format_weight * ok)
''',
        bug="B19.reads_past_eos",
    ),
    Answer(
        "19.addition_reward",
        "correctness by substring: the answer anywhere in the completion",
        '''
def addition_reward(completion, answer, correct_weight=1.0, format_weight=0.1):
    head, sep, _ = completion.partition("<eos>")
    ok = bool(sep) and re.fullmatch(r"0|[1-9][0-9]*", head) is not None
    correct = str(answer) in completion
    return float(correct_weight * correct + format_weight * ok)
''',
        bug="B19.sum_found_in_text",
    ),
    # -- 19.sft_loss --------------------------------------------------------------------------------------------------
    Answer(
        "19.sft_loss",
        "no shift: the logits at position p score the token at p",
        '''
def sft_loss(logits, ids, prompt_len, pad_id):
    if logits.shape[:2] != ids.shape:
        raise ValueError("shape")
    target = ids[:, prompt_len:]
    return F.cross_entropy(logits[:, prompt_len:].reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=pad_id)
''',
        bug="B19.no_shift",
    ),
    Answer(
        "19.sft_loss",
        "the <eos> after the answer is not learned (masked like padding)",
        '''
def sft_loss(logits, ids, prompt_len, pad_id):
    if logits.shape[:2] != ids.shape:
        raise ValueError("shape")
    target = ids[:, prompt_len:].clone()
    eos = target.gather(1, (target != pad_id).sum(1, keepdim=True) - 1)
    target[target == eos] = pad_id
    return F.cross_entropy(logits[:, prompt_len - 1:-1].reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=pad_id)
''',
        bug="B19.eos_not_learned",
    ),
    Answer(
        "19.sft_loss",
        "a mean per row, then a mean over rows (every row weighs the same)",
        '''
def sft_loss(logits, ids, prompt_len, pad_id):
    if logits.shape[:2] != ids.shape:
        raise ValueError("shape")
    pred = logits[:, prompt_len - 1:-1]
    target = ids[:, prompt_len:]
    mask = (target != pad_id).float()
    ce = F.cross_entropy(pred.transpose(1, 2), target, reduction="none")
    return ((ce * mask).sum(1) / mask.sum(1)).mean()
''',
        bug="B19.mean_of_row_means",
    ),
    Answer(
        "19.sft_loss",
        "padding is learned too (no mask)",
        '''
def sft_loss(logits, ids, prompt_len, pad_id):
    if logits.shape[:2] != ids.shape:
        raise ValueError("shape")
    return F.cross_entropy(logits[:, prompt_len - 1:-1].reshape(-1, logits.shape[-1]),
                           ids[:, prompt_len:].reshape(-1))
''',
        bug="B19.pad_in_loss",
    ),
    # -- 19.group_relative_advantages ------------------------------------------------------------------------------
    Answer(
        "19.group_relative_advantages",
        "one mean and std over the whole batch, not per group",
        '''
def group_relative_advantages(rewards, group_size):
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError("bad rewards")
    std = rewards.std()
    if std == 0:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / std
''',
        bug="B19.not_per_group",
    ),
    Answer(
        "19.group_relative_advantages",
        "groups read as columns (reshape(G, B)): the interleaved grouping",
        '''
def group_relative_advantages(rewards, group_size):
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError("bad rewards")
    r = rewards.view(group_size, -1)
    m, s = r.mean(0, keepdim=True), r.std(0, keepdim=True)
    return torch.where(s > 0, (r - m) / s.clamp_min(1e-12), torch.zeros_like(r)).reshape(-1)
''',
        bug="B19.strided_groups",
    ),
    Answer(
        "19.group_relative_advantages",
        "the population std (divide by G)",
        '''
def group_relative_advantages(rewards, group_size):
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError("bad rewards")
    r = rewards.view(-1, group_size)
    m, s = r.mean(1, keepdim=True), r.std(1, keepdim=True, unbiased=False)
    return torch.where(s > 0, (r - m) / s.clamp_min(1e-12), torch.zeros_like(r)).reshape(-1)
''',
        bug="B19.population_std",
    ),
    Answer(
        "19.group_relative_advantages",
        "a tiny epsilon added to the std instead of a zero for a group without spread",
        '''
def group_relative_advantages(rewards, group_size):
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError("bad rewards")
    r = rewards.view(-1, group_size)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-8)).reshape(-1)
''',
        says=r"float32 mean is not exactly",
    ),
    Answer(
        "19.group_relative_advantages",
        "no spread tested as std == 0 (rounding noise divided by a std of 1e-8)",
        '''
def group_relative_advantages(rewards, group_size):
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError("bad rewards")
    r = rewards.view(-1, group_size)
    m, s = r.mean(1, keepdim=True), r.std(1, keepdim=True)
    return torch.where(s == 0, torch.zeros_like(r), (r - m) / torch.where(s == 0, torch.ones_like(s), s)).reshape(-1)
''',
        bug="B19.spread_by_rounding",
        origin="red team (found while fixing issue 41: the course's own reference did this)",
    ),
    Answer(
        "19.group_relative_advantages",
        "no ValueError on bad input",
        '''
def group_relative_advantages(rewards, group_size):
    r = rewards.reshape(-1, group_size)
    m, s = r.mean(1, keepdim=True), r.std(1, keepdim=True)
    flat = r.amax(1, keepdim=True) == r.amin(1, keepdim=True)
    return torch.where(flat, torch.zeros_like(r), (r - m) / s.clamp_min(1e-12)).reshape(-1)
''',
        says=r"must raise ValueError",
    ),
    # -- 19.per_token_logps -------------------------------------------------------------------------------------------
    Answer(
        "19.per_token_logps",
        "computed under no_grad (no gradient to the model)",
        '''
def per_token_logps(model, sequences, prompt_len):
    if not 1 <= prompt_len < sequences.shape[1]:
        raise ValueError("prompt_len")
    with torch.no_grad():
        logp = torch.log_softmax(model(sequences)[:, prompt_len - 1:-1], dim=-1)
    return logp.gather(2, sequences[:, prompt_len:, None])[..., 0]
''',
        says=r"no gradient reached the model",
    ),
    Answer(
        "19.per_token_logps",
        "one forward per completion position (right values, T_c forwards)",
        '''
def per_token_logps(model, sequences, prompt_len):
    if not 1 <= prompt_len < sequences.shape[1]:
        raise ValueError("prompt_len")
    cols = []
    for p in range(prompt_len, sequences.shape[1]):
        logp = torch.log_softmax(model(sequences[:, :p])[:, -1], dim=-1)
        cols.append(logp.gather(1, sequences[:, p:p + 1]))
    return torch.cat(cols, dim=1)
''',
        bug="B19.forward_per_position",
    ),
    Answer(
        "19.per_token_logps",
        "log of softmax (underflows to -inf for unlikely tokens)",
        '''
def per_token_logps(model, sequences, prompt_len):
    if not 1 <= prompt_len < sequences.shape[1]:
        raise ValueError("prompt_len")
    probs = torch.softmax(model(sequences)[:, prompt_len - 1:-1], dim=-1)
    return torch.log(probs.gather(2, sequences[:, prompt_len:, None])[..., 0])
''',
        bug="B19.log_of_softmax",
    ),
    # -- 19.grpo_loss ---------------------------------------------------------------------------------------------------
    Answer(
        "19.grpo_loss",
        "the ratio reversed (old / new)",
        '''
def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    if not (logps.shape == old_logps.shape == ref_logps.shape == mask.shape) or advantages.shape != logps.shape[:1]:
        raise ValueError("shapes")
    old, ref, m = old_logps.detach(), ref_logps.detach(), mask.float()
    ratio = torch.exp(old - logps)
    a = advantages[:, None]
    surr = torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    kl = torch.exp(ref - logps) - (ref - logps) - 1
    per_tok = (surr - beta * kl) * m
    return -(per_tok.sum(1) / m.sum(1).clamp_min(1)).mean()
''',
        bug="B19.ratio_reversed",
    ),
    Answer(
        "19.grpo_loss",
        "no detach on old_logps and ref_logps",
        '''
def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    if not (logps.shape == old_logps.shape == ref_logps.shape == mask.shape) or advantages.shape != logps.shape[:1]:
        raise ValueError("shapes")
    m = mask.float()
    ratio = torch.exp(logps - old_logps)
    a = advantages[:, None]
    surr = torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    per_tok = (surr - beta * kl) * m
    return -(per_tok.sum(1) / m.sum(1).clamp_min(1)).mean()
''',
        bug="B19.ref_not_frozen",
    ),
    Answer(
        "19.grpo_loss",
        "an empty mask row divides by zero (NaN)",
        '''
def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    if not (logps.shape == old_logps.shape == ref_logps.shape == mask.shape) or advantages.shape != logps.shape[:1]:
        raise ValueError("shapes")
    old, ref, m = old_logps.detach(), ref_logps.detach(), mask.float()
    ratio = torch.exp(logps - old)
    a = advantages[:, None]
    surr = torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    kl = torch.exp(ref - logps) - (ref - logps) - 1
    per_tok = (surr - beta * kl) * m
    return -(per_tok.sum(1) / m.sum(1)).mean()
''',
        says=r"non-finite|NaN",
    ),
    Answer(
        "19.grpo_loss",
        "k3 with the roles of the two policies swapped",
        '''
def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    if not (logps.shape == old_logps.shape == ref_logps.shape == mask.shape) or advantages.shape != logps.shape[:1]:
        raise ValueError("shapes")
    old, ref, m = old_logps.detach(), ref_logps.detach(), mask.float()
    ratio = torch.exp(logps - old)
    a = advantages[:, None]
    surr = torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    kl = torch.exp(logps - ref) - (logps - ref) - 1
    per_tok = (surr - beta * kl) * m
    return -(per_tok.sum(1) / m.sum(1).clamp_min(1)).mean()
''',
        bug="B19.kl_reversed",
    ),
    Answer(
        "19.grpo_loss",
        "the clipped ratio alone, without the min (the pessimistic bound dropped)",
        '''
def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    if not (logps.shape == old_logps.shape == ref_logps.shape == mask.shape) or advantages.shape != logps.shape[:1]:
        raise ValueError("shapes")
    old, ref, m = old_logps.detach(), ref_logps.detach(), mask.float()
    ratio = torch.exp(logps - old)
    surr = ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages[:, None]
    kl = torch.exp(ref - logps) - (ref - logps) - 1
    per_tok = (surr - beta * kl) * m
    return -(per_tok.sum(1) / m.sum(1).clamp_min(1)).mean()
''',
        bug="B19.clip_without_min",
    ),
    # the two the issue names
    Answer(
        "19.grpo_loss",
        "KL estimated by k1 (log-ratio) instead of k3",
        '''
def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    if not (logps.shape == old_logps.shape == ref_logps.shape == mask.shape) or advantages.shape != logps.shape[:1]:
        raise ValueError("shapes")
    old, ref, m = old_logps.detach(), ref_logps.detach(), mask.float()
    ratio = torch.exp(logps - old)
    a = advantages[:, None]
    surr = torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    kl = logps - ref
    per_tok = (surr - beta * kl) * m
    return -(per_tok.sum(1) / m.sum(1).clamp_min(1)).mean()
''',
        bug="B19.kl_k1",
        origin="issue 41",
    ),
    Answer(
        "19.grpo_loss",
        "a one-sided clip (only 1 + eps)",
        '''
def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):
    if not (logps.shape == old_logps.shape == ref_logps.shape == mask.shape) or advantages.shape != logps.shape[:1]:
        raise ValueError("shapes")
    old, ref, m = old_logps.detach(), ref_logps.detach(), mask.float()
    ratio = torch.exp(logps - old)
    a = advantages[:, None]
    surr = torch.min(ratio * a, ratio.clamp(max=1 + clip_eps) * a)
    kl = torch.exp(ref - logps) - (ref - logps) - 1
    per_tok = (surr - beta * kl) * m
    return -(per_tok.sum(1) / m.sum(1).clamp_min(1)).mean()
''',
        bug="B19.one_sided_clip",
        origin="issue 41",
    ),
]

_UPDATE_HEAD = '''
def grpo_update(policy, ref_model, optimizer, sequences, prompt_len, rewards, mask, group_size, clip_eps=0.2,
                beta=0.04, inner_steps=1):
    if inner_steps < 1:
        raise ValueError("inner_steps")
    adv = group_relative_advantages(rewards, group_size)
'''

ANSWERS += [
    Answer(
        "19.grpo_update",
        "old log-probabilities taken inside the loop (ratio always 1)",
        _UPDATE_HEAD + '''
    with torch.no_grad():
        ref = per_token_logps(ref_model, sequences, prompt_len)
    out = []
    for _ in range(inner_steps):
        logps = per_token_logps(policy, sequences, prompt_len)
        loss = grpo_loss(logps, logps.detach(), ref, adv, mask, clip_eps, beta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out
''',
        bug="B19.old_each_step",
    ),
    Answer(
        "19.grpo_update",
        "gradients never cleared",
        _UPDATE_HEAD + '''
    with torch.no_grad():
        old = per_token_logps(policy, sequences, prompt_len)
        ref = per_token_logps(ref_model, sequences, prompt_len)
    out = []
    for _ in range(inner_steps):
        loss = grpo_loss(per_token_logps(policy, sequences, prompt_len), old, ref, adv, mask, clip_eps, beta)
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out
''',
        bug="B19.no_zero_grad",
    ),
    Answer(
        "19.grpo_update",
        "zero_grad between backward and step (no update at all)",
        _UPDATE_HEAD + '''
    with torch.no_grad():
        old = per_token_logps(policy, sequences, prompt_len)
        ref = per_token_logps(ref_model, sequences, prompt_len)
    out = []
    for _ in range(inner_steps):
        loss = grpo_loss(per_token_logps(policy, sequences, prompt_len), old, ref, adv, mask, clip_eps, beta)
        loss.backward()
        optimizer.zero_grad()
        optimizer.step()
        out.append(loss.item())
    return out
''',
        bug="B19.step_on_cleared_gradients",
    ),
    Answer(
        "19.grpo_update",
        "clip_eps and beta not passed on (the defaults always)",
        _UPDATE_HEAD + '''
    with torch.no_grad():
        old = per_token_logps(policy, sequences, prompt_len)
        ref = per_token_logps(ref_model, sequences, prompt_len)
    out = []
    for _ in range(inner_steps):
        loss = grpo_loss(per_token_logps(policy, sequences, prompt_len), old, ref, adv, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out
''',
        says=r"clip_eps 0\.1, beta 0\.3",
    ),
]

ANSWERS += [
    Answer(
        "19.grpo_update",
        "the loss written inline with the ratio reversed (the lesson's spot-the-bug)",
        _UPDATE_HEAD + '''
    with torch.no_grad():
        old = per_token_logps(policy, sequences, prompt_len)
        ref = per_token_logps(ref_model, sequences, prompt_len)
    out, w = [], mask.float()
    for _ in range(inner_steps):
        now = per_token_logps(policy, sequences, prompt_len)
        ratio = torch.exp(old - now)
        a = adv[:, None]
        surr = torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
        kl = torch.exp(ref - now) - (ref - now) - 1
        loss = -(((surr - beta * kl) * w).sum(1) / w.sum(1).clamp(min=1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out
''',
        says=r"losses of each step|parameters after the update",
        origin="issue 41",
    ),
]
