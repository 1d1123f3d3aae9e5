"""Unit 09 red-team corpus (see tests/redteam/__init__.py): each answer an edit of the reference solution."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "09"
_GB = "generate_batched"
_EOS_STEP = ("        if eos_id is not None:\n"
             "            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)\n"
             "            done = done | (nxt[:, 0] == eos_id)\n")
_TOPK_BODY = ("    kth = torch.topk(logits, k, dim=-1).values[..., -1:]\n"
              "    return logits.masked_fill(logits < kth, float(\"-inf\"))\n")
_TOPP_KEEP = ("    before = sorted_probs.cumsum(dim=-1) - sorted_probs\n"
              "    keep_sorted = before < p\n"
              "    keep_sorted[..., 0] = True  # the most likely token always survives, p = 0 included\n")

ANSWERS = [
    # ---------------------------------------------------------------- 09.apply_temperature
    Answer("09.apply_temperature", "multiplies by the temperature", edited(U, "apply_temperature",
           ("return logits / temperature", "return logits * temperature")), says=r"the logits divided by T"),
    Answer("09.apply_temperature", "clamps temperature 0 to a tiny value instead of raising", edited(
           U, "apply_temperature",
           ('    if temperature <= 0:\n        raise ValueError(f"temperature must be > 0, got {temperature}")\n', ""),
           ("return logits / temperature", "return logits / max(temperature, 1e-8)")), says=r"must raise ValueError"),
    # ---------------------------------------------------------------- 09.top_k_filter
    Answer("09.top_k_filter", "keeps exactly k indices with topk (ties dropped)", edited(U, "top_k_filter",
           (_TOPK_BODY, "    idx = torch.topk(logits, k, dim=-1).indices\n"
                        "    out = torch.full_like(logits, float(\"-inf\"))\n"
                        "    return out.scatter(-1, idx, logits.gather(-1, idx))\n")), bug="B09.topk_exact_k"),
    Answer("09.top_k_filter", "one threshold for the whole batch", edited(U, "top_k_filter",
           ("torch.topk(logits, k, dim=-1).values[..., -1:]", "torch.topk(logits.flatten(), k).values[-1]")),
           bug="B09.topk_global"),
    # ---------------------------------------------------------------- 09.top_p_filter
    Answer("09.top_p_filter", "keeps tokens while the inclusive cumulative mass is < p", edited(U, "top_p_filter",
           (_TOPP_KEEP, "    keep_sorted = sorted_probs.cumsum(dim=-1) < p\n")), bug="B09.topp_strict"),
    Answer("09.top_p_filter", "returns the filtered logits in sorted order", edited(U, "top_p_filter",
           ("    keep_sorted = before < p\n", ""),
           ("    keep_sorted[..., 0] = True  # the most likely token always survives, p = 0 included\n"
            "    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)\n"
            "    return logits.masked_fill(~keep, float(\"-inf\"))\n",
            "    return logits.gather(-1, order).masked_fill(before >= p, float(\"-inf\"))\n")),
           says=r"original vocabulary order"),
    Answer("09.top_p_filter", "no shortcut at p >= 1 (the nucleus computed at p = 1 too)", edited(U, "top_p_filter",
           ("if p is None or p >= 1:", "if p is None:")), says=r"p=1\.0"),
    # ---------------------------------------------------------------- 09.sample_next_token
    Answer("09.sample_next_token", "filters before the temperature", edited(U, "sample_next_token",
           ("top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)",
            "apply_temperature(top_p_filter(top_k_filter(logits, top_k), top_p), temperature)")),
           bug="B09.filter_order"),
    Answer("09.sample_next_token", "ignores the generator", edited(U, "sample_next_token",
           ("torch.multinomial(probs, 1, generator=generator)", "torch.multinomial(probs, 1)")),
           says=r"pass `generator`"),
    Answer("09.sample_next_token", "no greedy branch (temperature 0 goes to apply_temperature)", edited(
           U, "sample_next_token", ("    if temperature == 0:\n        return logits.argmax(dim=-1, keepdim=True)\n", "")),
           says=r"raised ValueError: temperature must be > 0"),
    # ---------------------------------------------------------------- 09.generate
    Answer("09.generate", "crops to the first context_length tokens", edited(U, "generate",
           ("idx[:, -context_length:]", "idx[:, :context_length]")), bug="B09.crop_wrong_end"),
    Answer("09.generate", "leaves the model in eval mode", edited(U, "generate",
           ("    was_training = model.training\n", ""), ("    model.train(was_training)\n", "")),
           says=r"restore the previous mode"),
    Answer("09.generate", "stops at the first EOS of any row", edited(U, "generate",
           ("    done = torch.zeros(idx.shape[0], dtype=torch.bool)\n", ""), (_EOS_STEP, ""),
           ("if eos_id is not None and bool(done.all()):", "if eos_id is not None and bool((nxt == eos_id).any()):")),
           says=r"eos_id=.*expected shape"),
    # ---------------------------------------------------------------- 09.generate_batched
    Answer("09.generate_batched", "right padding, last column read", edited(U, _GB,
           ("idx[row, width - len(p):]", "idx[row, :len(p)]"), ("real[row, width - len(p):]", "real[row, :len(p)]")),
           says=r"differ from generating each prompt alone"),
    Answer("09.generate_batched", "left padding with a mask but default positions", edited(U, _GB,
           ("model(idx, attention_mask=real, position_ids=pos)", "model(idx, attention_mask=real)")),
           bug="B09.batch_positions_from_pad"),
    Answer("09.generate_batched", "top_p never passed on to the sampler", edited(U, _GB,
           ("sample_next_token(logits, temperature, top_k, top_p, generator)",
            "sample_next_token(logits, temperature, top_k, None, generator)")),
           says=r"top_p=0\.01\) must equal greedy", origin="issue 38"),
    Answer("09.generate_batched", "finished rows frozen, but the loop runs all max_new_tokens steps", edited(U, _GB,
           ("        if eos_id is not None and bool(done.all()):\n            break\n", "")),
           bug="B09.batch_no_early_stop"),
]
