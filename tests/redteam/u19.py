"""Red-team answers for unit 19 (post-training: reward, SFT loss, GRPO advantages, log-probs, loss, update).

Written from the released exercise notebook only (origin "red team"), then the answers issue 41 names; each is an
edit of the reference solution (:func:`tests.redteam.edits.edited`).
"""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "19"
R, S, A, L, G, UP = ("addition_reward", "sft_loss", "group_relative_advantages", "per_token_logps", "grpo_loss",
                     "grpo_update")

_HEAD_CHECK = ('    if not head.isdigit() or not head.isascii() or (len(head) > 1 and head[0] == "0"):\n'
               '        return 0.0\n')
_SFT_MASK = "    keep = (targets != pad_id)\n    keep[:, : prompt_len - 1] = False\n"
_GROUPED = "    grouped = rewards.float().reshape(-1, group_size)\n"
_FLAT = "    flat = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)   # not spread == 0: rounding\n"
_LOGP = ("    logits = model(sequences).float()\n"
         "    logp = torch.log_softmax(logits[:, prompt_len - 1:T - 1], dim=-1)\n"
         "    return torch.gather(logp, 2, sequences[:, prompt_len:, None])[..., 0]\n")
_RHO = "    rho = (logps - old_logps.detach()).exp()\n"
_CLIP = "rho.clamp(1.0 - clip_eps, 1.0 + clip_eps) * a"
_LOGQ = "    log_q = ref_logps.detach() - logps               # log(π_ref / π_θ)\n"
_K3 = "    k3 = log_q.exp() - log_q - 1.0\n"
_MIN = "torch.min(unclipped, clipped)"
_ROW = "w.sum(1).clamp_min(1.0)"
_OLD = "        before = per_token_logps(policy, sequences, prompt_len=prompt_len)\n"
_LOSS = ("        loss = grpo_loss(per_token_logps(policy, sequences, prompt_len=prompt_len), before, anchor, advantages, mask,\n"
         "                         clip_eps=clip_eps, beta=beta)\n")

ANSWERS = [
    # -- 19.addition_reward -----------------------------------------------------------------------------------------
    Answer(f"{U}.{R}", "int() parses the answer: leading zeros, spaces and underscores accepted", edited(
        U, R, (_HEAD_CHECK, "    try:\n        int(head)\n    except ValueError:\n        return 0.0\n")),
        bug="B19.lax_format"),
    Answer(f"{U}.{R}", "the first number anywhere, <eos> not required", edited(
        U, R, ('    if "<eos>" not in completion:\n        return 0.0\n    head = completion.split("<eos>", 1)[0]\n',
               '    import re\n    found = re.search(r"\\d+", completion)\n    if found is None:\n        return 0.0\n'
               '    head = found.group()\n'), (_HEAD_CHECK, "")),
        bug="B19.no_eos_required"),
    Answer(f"{U}.{R}", "the text before the last <eos> (all <eos> stripped from the end)", edited(
        U, R, ('head = completion.split("<eos>", 1)[0]', 'head = completion.rsplit("<eos>", 1)[0].replace("<eos>", "")')),
        bug="B19.reads_past_eos"),
    Answer(f"{U}.{R}", "correctness by substring: the answer anywhere in the completion", edited(
        U, R, ("    if int(head) == int(answer):\n", "    if str(answer) in completion:\n")),
        bug="B19.sum_found_in_text"),
    # -- 19.sft_loss --------------------------------------------------------------------------------------------------
    Answer(f"{U}.{S}", "no shift: the logits at position p score the token at p", edited(
        U, S, ("    targets = ids[:, 1:]\n    scoring = logits[:, :-1]\n", "    targets = ids\n    scoring = logits\n"),
        ("keep[:, : prompt_len - 1] = False", "keep[:, :prompt_len] = False")),
        bug="B19.no_shift"),
    Answer(f"{U}.{S}", "the <eos> after the answer is not learned (masked like padding)", edited(
        U, S, (_SFT_MASK, _SFT_MASK + "    keep[targets == targets.gather(1, keep.sum(1, keepdim=True) + prompt_len - 2)] = False\n")),
        bug="B19.eos_not_learned"),
    Answer(f"{U}.{S}", "a mean per row, then a mean over rows (every row weighs the same)", edited(
        U, S, ("    return (nll * keep).sum() / keep.sum()\n", "    return ((nll * keep).sum(1) / keep.sum(1)).mean()\n")),
        bug="B19.mean_of_row_means"),
    Answer(f"{U}.{S}", "padding is learned too (no mask)", edited(
        U, S, ("    keep = (targets != pad_id)\n", "    keep = torch.ones_like(targets, dtype=torch.bool)\n")),
        bug="B19.pad_in_loss"),
    # -- 19.group_relative_advantages ------------------------------------------------------------------------------
    Answer(f"{U}.{A}", "one mean and std over the whole batch, not per group", edited(
        U, A, (_GROUPED, "    grouped = rewards.float().reshape(1, -1)\n")),
        bug="B19.not_per_group"),
    Answer(f"{U}.{A}", "groups read as columns (reshape(G, B)): the interleaved grouping", edited(
        U, A, (_GROUPED, "    grouped = rewards.float().reshape(group_size, -1).T\n"),
        ("return out.masked_fill(flat, 0.0).reshape(-1)", "return out.masked_fill(flat, 0.0).T.reshape(-1)")),
        bug="B19.strided_groups"),
    Answer(f"{U}.{A}", "the population std (divide by G)", edited(
        U, A, ("grouped.std(dim=1, unbiased=True, keepdim=True)", "grouped.std(dim=1, unbiased=False, keepdim=True)")),
        bug="B19.population_std"),
    Answer(f"{U}.{A}", "a tiny epsilon added to the std instead of a zero for a group without spread", edited(
        U, A, ("    out = centred / torch.where(flat, torch.ones_like(spread), spread)\n"
               "    return out.masked_fill(flat, 0.0).reshape(-1)\n",
               "    return (centred / (spread + 1e-8)).reshape(-1)\n")),
        says=r"float32 mean is not exactly"),
    Answer(f"{U}.{A}", "no spread tested as std == 0 (rounding noise divided by a std of 1e-8)", edited(
        U, A, (_FLAT, "    flat = spread == 0\n")),
        bug="B19.spread_by_rounding",
        origin="red team (found while fixing issue 41: the course's own reference did this)"),
    Answer(f"{U}.{A}", "no ValueError on bad input", edited(
        U, A, ('    if rewards.dim() != 1:\n        raise ValueError("rewards must be 1-D")\n', ""),
        ("    if group_size < 2 or rewards.numel() % group_size:\n"
         '        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size} (G >= 2)")\n', "")),
        says=r"must raise ValueError"),
    # -- 19.per_token_logps -------------------------------------------------------------------------------------------
    Answer(f"{U}.{L}", "computed under no_grad (no gradient to the model)", edited(
        U, L, ("    logits = model(sequences).float()\n",
               "    with torch.no_grad():\n        logits = model(sequences).float()\n")),
        says=r"no gradient reached the model"),
    Answer(f"{U}.{L}", "one forward per completion position (right values, T_c forwards)", edited(
        U, L, (_LOGP, "    cols = []\n    for p in range(prompt_len, T):\n"
                      "        logp = torch.log_softmax(model(sequences[:, :p])[:, -1].float(), dim=-1)\n"
                      "        cols.append(logp.gather(1, sequences[:, p:p + 1]))\n"
                      "    return torch.cat(cols, dim=1)\n")),
        bug="B19.forward_per_position"),
    Answer(f"{U}.{L}", "log of softmax (underflows to -inf for unlikely tokens)", edited(
        U, L, ("torch.log_softmax(logits[:, prompt_len - 1:T - 1], dim=-1)",
               "torch.log(torch.softmax(logits[:, prompt_len - 1:T - 1], dim=-1))")),
        bug="B19.log_of_softmax"),
    # -- 19.grpo_loss ---------------------------------------------------------------------------------------------------
    Answer(f"{U}.{G}", "the ratio reversed (old / new)", edited(
        U, G, (_RHO, "    rho = (old_logps.detach() - logps).exp()\n")),
        bug="B19.ratio_reversed"),
    Answer(f"{U}.{G}", "no detach on old_logps and ref_logps", edited(
        U, G, (_RHO, "    rho = (logps - old_logps).exp()\n"), (_LOGQ, "    log_q = ref_logps - logps\n")),
        bug="B19.ref_not_frozen"),
    Answer(f"{U}.{G}", "an empty mask row divides by zero (NaN)", edited(
        U, G, (_ROW, "w.sum(1)")),
        says=r"non-finite|NaN"),
    Answer(f"{U}.{G}", "k3 with the roles of the two policies swapped", edited(
        U, G, (_LOGQ, "    log_q = logps - ref_logps.detach()\n")),
        bug="B19.kl_reversed"),
    Answer(f"{U}.{G}", "the clipped ratio alone, without the min (the pessimistic bound dropped)", edited(
        U, G, (_MIN, "clipped")),
        bug="B19.clip_without_min"),
    # the two the issue names
    Answer(f"{U}.{G}", "KL estimated by k1 (log-ratio) instead of k3", edited(
        U, G, (_K3, "    k3 = -log_q\n")),
        bug="B19.kl_k1", origin="issue 41"),
    Answer(f"{U}.{G}", "a one-sided clip (only 1 + eps)", edited(
        U, G, (_CLIP, "rho.clamp(max=1.0 + clip_eps) * a")),
        bug="B19.one_sided_clip", origin="issue 41"),
    # -- 19.grpo_update -------------------------------------------------------------------------------------------------
    Answer(f"{U}.{UP}", "old log-probabilities taken inside the loop (ratio always 1)", edited(
        U, UP, (_OLD, ""), ("    for _ in range(inner_steps):\n",
                            "    for _ in range(inner_steps):\n        with torch.no_grad():\n    " + _OLD)),
        bug="B19.old_each_step"),
    Answer(f"{U}.{UP}", "gradients never cleared", edited(
        U, UP, ("        optimizer.zero_grad()\n", "")),
        bug="B19.no_zero_grad"),
    Answer(f"{U}.{UP}", "zero_grad between backward and step (no update at all)", edited(
        U, UP, ("        optimizer.zero_grad()\n        loss.backward()\n",
                "        loss.backward()\n        optimizer.zero_grad()\n")),
        bug="B19.step_on_cleared_gradients"),
    Answer(f"{U}.{UP}", "clip_eps and beta not passed on (the defaults always)", edited(
        U, UP, (_LOSS, "        loss = grpo_loss(per_token_logps(policy, sequences, prompt_len=prompt_len), before, anchor,"
                       " advantages, mask)\n")),
        says=r"clip_eps 0\.1, beta 0\.3"),
    Answer(f"{U}.{UP}", "the loss written inline with the ratio reversed (the lesson's spot-the-bug)", edited(
        U, UP, (_LOSS, "        now = per_token_logps(policy, sequences, prompt_len=prompt_len)\n"
                       "        ratio = torch.exp(before - now)\n"
                       "        a = advantages[:, None]\n"
                       "        surr = torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)\n"
                       "        kl = torch.exp(anchor - now) - (anchor - now) - 1\n"
                       "        w = mask.float()\n"
                       "        loss = -(((surr - beta * kl) * w).sum(1) / w.sum(1).clamp(min=1)).mean()\n")),
        says=r"losses of each step|parameters after the update", origin="issue 41"),
]
