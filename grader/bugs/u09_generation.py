"""Bug catalog of unit 09 (generation and sampling): one known-wrong implementation per syllabus entry.

Each mutant is the reference (``llmcourse.train.sampling``) with exactly one mistake. ``detect="mutant"``
entries are named by matching the learner's output on the failing probe (for sampling: the frequencies of
20,000 draws from the same seeded ``torch.Generator``); ``detect="detector"`` entries by a property the
check names (ties kept at the k-th value, a prompt longer than the window, rows frozen after EOS,
repeated greedy runs of a dropout model agree).
"""

from __future__ import annotations

import torch

from llmcourse.train.sampling import (
    apply_temperature,
    generate,
    sample_next_token,
    top_k_filter,
    top_p_filter,
)

from ..core import bug_group

U = "09"
NEG_INF = float("-inf")

# ---------------------------------------------------------------- apply_temperature


def _temp_on_probs_divided(logits, temperature):
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(logits, dim=-1) / temperature


def _temp_on_probs_power(logits, temperature):
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(logits, dim=-1) ** (1.0 / temperature)


HINT_TEMP = "Temperature divides the **logits** before the softmax."
bug_group("B09.temp_on_probs", f"{U}.apply_temperature", HINT_TEMP, {"apply_temperature": _temp_on_probs_divided})
bug_group("B09.temp_on_probs", f"{U}.apply_temperature", HINT_TEMP, {"apply_temperature": _temp_on_probs_power})

# ---------------------------------------------------------------- top_k_filter


def _topk_zero_fill(logits, k):
    if k is None or k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, 0.0)


def _topk_exact_k(logits, k):
    if k is None or k >= logits.shape[-1]:
        return logits.clone()
    vals, ids = torch.topk(logits, k, dim=-1)
    return torch.full_like(logits, NEG_INF).scatter(-1, ids, vals)


def _topk_global(logits, k):
    if k is None or k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits.flatten(), k).values[-1]  # one threshold for the whole batch
    return logits.masked_fill(logits < kth, NEG_INF)


bug_group("B09.topk_zero_fill", f"{U}.top_k_filter", "Masked logits must be −inf; 0 is still a likely logit.",
          {"top_k_filter": _topk_zero_fill})
bug_group("B09.topk_exact_k", f"{U}.top_k_filter", "The course keeps every logit equal to the k-th value.",
          {"top_k_filter": _topk_exact_k}, detect="detector")
bug_group("B09.topk_global", f"{U}.top_k_filter", "Filter each row independently.", {"top_k_filter": _topk_global})

# ---------------------------------------------------------------- top_p_filter


def _topp_strict(logits, p):
    if p is None or p >= 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep_sorted = sorted_probs.cumsum(dim=-1) <= p  # the crossing token is dropped
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, NEG_INF)


def _topp_before_le(logits, p):
    if p is None or p >= 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) <= p  # a token with exactly p before it is kept
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, NEG_INF)


def _topp_unsorted(logits, p):
    if p is None or p >= 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    cum = probs.cumsum(dim=-1)  # in vocabulary order, not by probability
    keep = (cum - probs) < p
    return logits.masked_fill(~keep, NEG_INF)


bug_group("B09.topp_strict", f"{U}.top_p_filter", "Keep the token that crosses p; the top-1 always survives.",
          {"top_p_filter": _topp_strict})
bug_group("B09.topp_not_strict", f"{U}.top_p_filter",
          "A token whose mass before it is exactly p is not needed: the prefix already reaches p without it.",
          {"top_p_filter": _topp_before_le})
bug_group("B09.topp_unsorted", f"{U}.top_p_filter", "Sort probabilities in descending order first.",
          {"top_p_filter": _topp_unsorted})

# ---------------------------------------------------------------- sample_next_token


def _sample_variant(variant: str):
    def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        if variant == "p_before_k":
            z = top_k_filter(top_p_filter(apply_temperature(logits, temperature), top_p), top_k)
        elif variant == "filters_before_temperature":
            z = apply_temperature(top_p_filter(top_k_filter(logits, top_k), top_p), temperature)
        else:  # temp_on_probs: the filters on the raw logits, then the probabilities divided by T
            z = top_p_filter(top_k_filter(logits, top_k), top_p)
        probs = torch.softmax(z, dim=-1)
        if variant == "temp_on_probs":
            probs = probs / temperature
        return torch.multinomial(probs, 1, generator=generator)

    return sample_next_token


HINT_ORDER = "Order: temperature, then top-k, then top-p."
bug_group("B09.filter_order", f"{U}.sample_next_token", HINT_ORDER,
          {"sample_next_token": _sample_variant("p_before_k")})
bug_group("B09.filter_order", f"{U}.sample_next_token", HINT_ORDER,
          {"sample_next_token": _sample_variant("filters_before_temperature")})
bug_group("B09.temp_on_probs", f"{U}.sample_next_token", HINT_TEMP,
          {"sample_next_token": _sample_variant("temp_on_probs")})

# ---------------------------------------------------------------- generate


def _generate_variant(variant: str):
    def generate(model, idx, max_new_tokens, context_length, temperature=0.0, top_k=None, top_p=None, eos_id=None,
                 generator=None):
        was_training = model.training
        if variant != "train_mode":
            model.eval()
        try:
            with torch.set_grad_enabled(variant == "train_mode"):
                done = torch.zeros(idx.shape[0], dtype=torch.bool)
                for _ in range(max_new_tokens):
                    window = (idx if variant == "no_crop" else idx[:, :context_length] if variant == "crop_wrong_end"
                              else idx[:, -context_length:])
                    logits = model(window)
                    last = logits[:, 0, :] if variant == "first_position" else logits[:, -1, :]
                    nxt = sample_next_token(last.detach(), temperature, top_k, top_p, generator)
                    if eos_id is not None and variant != "eos_ignored":
                        nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
                        done = done | (nxt[:, 0] == eos_id)
                    idx = torch.cat([idx, nxt], dim=1)
                    if eos_id is not None and variant != "eos_ignored" and bool(done.all()):
                        break
        finally:
            model.train(was_training)
        return idx

    return generate


for _bug, _variant, _hint, _detect in [
    ("B09.first_position", "first_position", "The next token comes from the **last** position.", "mutant"),
    ("B09.no_crop", "no_crop", "Crop the input to the last `context_length` tokens.", "detector"),
    ("B09.crop_wrong_end", "crop_wrong_end", "Feed the **most recent** context_length tokens: the prediction must "
     "depend on the token just written.", "mutant"),
    ("B09.eos_ignored", "eos_ignored", "Freeze finished rows and stop when all are done.", "detector"),
    ("B09.train_mode", "train_mode", "Run generate twice on a model with dropout left in train() mode: greedy "
     "decoding must give the same tokens both times, and no step of generation needs the graph that gradient "
     "tracking records.", "detector"),
]:
    bug_group(_bug, f"{U}.generate", _hint, {"generate": _generate_variant(_variant)}, _detect)

# ---------------------------------------------------------------- generate_batched


def _batched_variant(variant: str):
    def generate_batched(model, prompts, max_new_tokens, context_length, pad_id=0, temperature=0.0, top_k=None,
                         top_p=None, eos_id=None, generator=None):
        rows = [torch.as_tensor(p, dtype=torch.long).flatten() for p in prompts]
        t0 = max(r.numel() for r in rows)
        if t0 + max_new_tokens > context_length:
            raise ValueError(f"{t0} + {max_new_tokens} tokens exceed context_length={context_length}")
        idx = torch.full((len(rows), t0), pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), t0, dtype=torch.bool)
        for b, r in enumerate(rows):
            cols = slice(0, r.numel()) if variant == "right_pad" else slice(t0 - r.numel(), t0)
            idx[b, cols], mask[b, cols] = r, True
        if variant == "positions_from_pad":  # every column numbered from the batch's first column
            positions = torch.arange(t0).expand(len(rows), t0)
        elif variant == "pad_position_negative":  # the count of real tokens before, minus one: -1 in the padding
            positions = mask.long().cumsum(dim=1) - 1
        else:
            positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        if variant == "one_by_one":  # a loop over the prompts: right answers, but no batching
            new = [generate(model, r[None], max_new_tokens, context_length, temperature, top_k, top_p, eos_id,
                            generator)[0, r.numel():] for r in rows]
            n = max(x.numel() for x in new)
            return torch.stack([torch.cat([x, torch.full((n - x.numel(),), eos_id if eos_id is not None else pad_id)])
                                for x in new])
        was_training = model.training
        if variant != "train_mode":
            model.eval()
        try:
            with torch.no_grad():
                done = torch.zeros(len(rows), dtype=torch.bool)
                for _ in range(max_new_tokens):
                    kw = {} if variant == "no_mask" else {"attention_mask": mask}
                    logits = model(idx, position_ids=positions, **kw)[:, -1, :]
                    nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
                    if eos_id is not None:
                        nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
                        done = done | (nxt[:, 0] == eos_id)
                    idx = torch.cat([idx, nxt], dim=1)
                    mask = torch.cat([mask, torch.full_like(mask[:, :1], variant != "mask_not_extended")], dim=1)
                    positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
                    if eos_id is not None and bool(done.all()) and variant != "no_early_stop":
                        break
        finally:
            model.train(was_training)
        return idx[:, t0:]

    return generate_batched


for _bug, _variant, _hint, _detect in [
    ("B09.batch_right_pad", "right_pad", "A decoder reads the next token off the **last** column: pad on the side "
     "that keeps every row's newest token there.", "mutant"),
    ("B09.batch_positions_from_pad", "positions_from_pad", "A prompt's first real token has position 0, however much "
     "padding precedes it: count positions along the real tokens.", "mutant"),
    ("B09.batch_no_mask", "no_mask", "Padding slots must be invisible as keys: pass the attention mask.", "mutant"),
    ("B09.batch_mask_not_extended", "mask_not_extended", "The generated tokens are real tokens: the mask grows with a "
     "True column at every step.", "mutant"),
    ("B09.batch_pad_position_negative", "pad_position_negative", "Padding slots need a valid position too (any row "
     "of the position table: their outputs are never used); counting real tokens gives them −1.", "mutant"),
    ("B09.batch_no_early_stop", "no_early_stop", "The batch is done when every row has produced eos_id: the result "
     "ends at that step, not at max_new_tokens.", "detector"),
    ("B09.batch_one_by_one", "one_by_one", "Batch the prompts: one model call per step for all rows, which is the "
     "point of padding.", "detector"),
    ("B09.train_mode", "train_mode", "Use `eval()` and `no_grad()`.", "detector"),
]:
    bug_group(_bug, f"{U}.generate_batched", _hint, {"generate_batched": _batched_variant(_variant)}, _detect)
