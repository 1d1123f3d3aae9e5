"""Unit 09 red-team corpus (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

_GEN_HEAD = '''
@torch.no_grad()
def generate(model, idx, max_new_tokens, context_length, temperature=0.0, top_k=None, top_p=None, eos_id=None,
             generator=None):
'''

_BATCHED_HEAD = '''
@torch.no_grad()
def generate_batched(model, prompts, max_new_tokens, context_length, pad_id=0, temperature=0.0, top_k=None,
                     top_p=None, eos_id=None, generator=None):
'''

ANSWERS = [
    # ---------------------------------------------------------------- 09.apply_temperature
    Answer("09.apply_temperature", "multiplies by the temperature", '''
def apply_temperature(logits, temperature):
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    return logits * temperature
''', says=r"the logits divided by T"),
    Answer("09.apply_temperature", "clamps temperature 0 to a tiny value instead of raising", '''
def apply_temperature(logits, temperature):
    return logits / max(temperature, 1e-8)
''', says=r"must raise ValueError"),
    # ---------------------------------------------------------------- 09.top_k_filter
    Answer("09.top_k_filter", "keeps exactly k indices with topk (ties dropped)", '''
def top_k_filter(logits, k):
    if k is None or k >= logits.shape[-1]:
        return logits.clone()
    idx = torch.topk(logits, k, dim=-1).indices
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(-1, idx, logits.gather(-1, idx))
''', bug="B09.topk_exact_k"),
    Answer("09.top_k_filter", "one threshold for the whole batch", '''
def top_k_filter(logits, k):
    if k is None or k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits.flatten(), k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))
''', bug="B09.topk_global"),
    # ---------------------------------------------------------------- 09.top_p_filter
    Answer("09.top_p_filter", "keeps tokens while the inclusive cumulative mass is < p", '''
def top_p_filter(logits, p):
    if p is None or p >= 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep_sorted = sorted_probs.cumsum(dim=-1) < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))
''', bug="B09.topp_strict"),
    Answer("09.top_p_filter", "returns the filtered logits in sorted order", '''
def top_p_filter(logits, p):
    if p is None or p >= 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    return logits.gather(-1, order).masked_fill(before >= p, float("-inf"))
''', says=r"original vocabulary order"),
    # ---------------------------------------------------------------- 09.sample_next_token
    Answer("09.sample_next_token", "filters before the temperature", '''
def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    filtered = apply_temperature(top_p_filter(top_k_filter(logits, top_k), top_p), temperature)
    return torch.multinomial(torch.softmax(filtered, dim=-1), 1, generator=generator)
''', bug="B09.filter_order"),
    Answer("09.sample_next_token", "ignores the generator", '''
def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    filtered = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
    return torch.multinomial(torch.softmax(filtered, dim=-1), 1)
''', says=r"pass `generator`"),
    Answer("09.sample_next_token", "no greedy branch (temperature 0 goes to apply_temperature)", '''
def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    filtered = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
    probs = torch.softmax(filtered, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)
''', says=r"raised ValueError: temperature must be > 0"),
    # ---------------------------------------------------------------- 09.generate
    Answer("09.generate", "crops to the first context_length tokens", _GEN_HEAD + '''
    was_training = model.training
    model.eval()
    done = torch.zeros(idx.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model(idx[:, :context_length])[:, -1, :]
        nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt[:, 0] == eos_id)
        idx = torch.cat([idx, nxt], dim=1)
        if eos_id is not None and bool(done.all()):
            break
    model.train(was_training)
    return idx
''', bug="B09.crop_wrong_end"),
    Answer("09.generate", "leaves the model in eval mode", _GEN_HEAD + '''
    model.eval()
    done = torch.zeros(idx.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1, :]
        nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt[:, 0] == eos_id)
        idx = torch.cat([idx, nxt], dim=1)
        if eos_id is not None and bool(done.all()):
            break
    return idx
''', says=r"restore the previous mode"),
    Answer("09.generate", "stops at the first EOS of any row", _GEN_HEAD + '''
    was_training = model.training
    model.eval()
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1, :]
        nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
        idx = torch.cat([idx, nxt], dim=1)
        if eos_id is not None and bool((nxt == eos_id).any()):
            break
    model.train(was_training)
    return idx
''', says=r"eos_id=.*expected shape"),
    # ---------------------------------------------------------------- 09.generate_batched
    Answer("09.generate_batched", "right padding, last column read", _BATCHED_HEAD + '''
    width = max(len(p) for p in prompts)
    if width + max_new_tokens > context_length:
        raise ValueError("too long")
    idx = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    real = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        idx[row, :len(p)] = torch.tensor(p)
        real[row, :len(p)] = True
    was_training = model.training
    model.eval()
    start = idx.shape[1]
    for _ in range(max_new_tokens):
        logits = model(idx, attention_mask=real)[:, -1, :]
        nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
        idx = torch.cat([idx, nxt], dim=1)
        real = torch.cat([real, torch.ones(len(prompts), 1, dtype=torch.bool)], dim=1)
    model.train(was_training)
    return idx[:, start:]
''', says=r"differ from generating each prompt alone"),
    Answer("09.generate_batched", "left padding with a mask but default positions", _BATCHED_HEAD + '''
    width = max(len(p) for p in prompts)
    if width + max_new_tokens > context_length:
        raise ValueError("too long")
    idx = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    real = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        idx[row, width - len(p):] = torch.tensor(p)
        real[row, width - len(p):] = True
    was_training = model.training
    model.eval()
    done = torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model(idx, attention_mask=real)[:, -1, :]
        nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt[:, 0] == eos_id)
        idx = torch.cat([idx, nxt], dim=1)
        real = torch.cat([real, torch.ones(len(prompts), 1, dtype=torch.bool)], dim=1)
        if eos_id is not None and bool(done.all()):
            break
    model.train(was_training)
    return idx[:, width:]
''', bug="B09.batch_positions_from_pad"),
    Answer("09.generate_batched", "top_p never passed on to the sampler", _BATCHED_HEAD + '''
    width = max(len(p) for p in prompts)
    if width + max_new_tokens > context_length:
        raise ValueError("too long")
    idx = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    real = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        idx[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
        real[row, width - len(p):] = True
    pos = (real.long().cumsum(dim=1) - 1).clamp(min=0)
    was_training = model.training
    model.eval()
    done = torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model(idx, attention_mask=real, position_ids=pos)[:, -1, :]
        nxt = sample_next_token(logits, temperature, top_k, None, generator)
        if eos_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt[:, 0] == eos_id)
        idx = torch.cat([idx, nxt], dim=1)
        real = torch.cat([real, torch.ones(len(prompts), 1, dtype=torch.bool)], dim=1)
        pos = torch.cat([pos, pos[:, -1:] + 1], dim=1)
        if eos_id is not None and bool(done.all()):
            break
    model.train(was_training)
    return idx[:, width:]
''', says=r"top_p=0\.01\) must equal greedy", origin="issue 38"),
]
