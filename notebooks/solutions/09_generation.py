# %% [markdown]
# # Unit 09 — Generation and sampling: exercises
#
# Six graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: the worked example below for every setting, ties and
# exact thresholds, batches and other vocabulary orders, 20,000 seeded draws compared with the filtered
# probabilities, and generation with the course's trained character model (long prompts, end-of-sequence
# tokens, a model with dropout). When something fails it tells you what was expected, what came back,
# and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/09_generation/09_generation.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `math` and the standard library.
#
# **The worked example** used throughout: the logits `z = [2.0, 1.0, 0.5, 0.0, -1.0]` over a vocabulary
# of five tokens have probabilities `softmax(z) ≈ [0.5630, 0.2071, 0.1256, 0.0762, 0.0280]`.
#
# **Conventions.** Logits have shape `(..., V)`, the vocabulary along the last dimension. A filtered-out
# token gets the logit `float("-inf")`, so its probability after the softmax is exactly 0. A filter
# returns a **new** tensor (the caller's logits are not modified) and leaves the kept logits exactly
# as they were.

# %%
import math  # noqa: F401

import torch
from torch import nn  # noqa: F401

import llmcourse
from llmcourse.train.char_model import load_gpt_char_tiny

cfg = llmcourse.setup_notebook("09")
z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])

# %% [markdown]
# ## Exercise 1 — `apply_temperature` (1 point)
#
# ```python
# apply_temperature(logits: Tensor, temperature: float) -> Tensor
# ```
#
# Return the logits scaled by the temperature `T`, so that `softmax(apply_temperature(z, T))` is the
# tempered distribution `softmax(z / T)`. Same shape `(..., V)`. For `T ≤ 0` raise `ValueError` (greedy
# decoding, "T = 0", is handled by the sampler in exercise 4, not here).
#
# Example: `softmax(apply_temperature(z, 0.5)) ≈ [0.8292, 0.1122, 0.0413, 0.0152, 0.0021]`.

# %% tags=["solution:09.apply_temperature"]
def apply_temperature(logits, temperature):
    """(..., V) logits -> (..., V) tempered logits; ValueError for temperature <= 0."""
    ### BEGIN SOLUTION
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return logits / temperature
    ### END SOLUTION


# %% tags=["tests:09.apply_temperature"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("09.apply_temperature")  # noqa: E702
### END HIDDEN TESTS
p_half = torch.softmax(apply_temperature(z, 0.5), dim=-1)
assert p_half.shape == (5,), f"expected shape (5,), got {tuple(p_half.shape)}"
assert torch.allclose(p_half, torch.tensor([0.8292, 0.1122, 0.0413, 0.0152, 0.0021]), atol=1e-4), p_half
batch = torch.randn(3, 10)
assert torch.equal(apply_temperature(batch, 3.0).argmax(-1), batch.argmax(-1)), "the argmax must not change"
try:
    apply_temperature(z, 0.0)
    raise AssertionError("temperature 0 must raise ValueError")
except ValueError:
    pass
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `top_k_filter` (3 points)
#
# ```python
# top_k_filter(logits: Tensor, k: int | None) -> Tensor
# ```
#
# In each row (last dimension), keep the `k` largest logits and give every entry **below the row's k-th
# largest value** `-inf`. With `k=None` or `k ≥ V` the logits come back unchanged. Rows are independent: each
# row has its own k-th value.
#
# **What happens to logits equal to the k-th largest value is your decision**, from two properties the hidden
# check tests: the result must not depend on the vocabulary order (permuting a row's logits permutes its result
# the same way), and a row is never left with fewer than `k` tokens. Try `[3.0, 1.0, 1.0, 0.0]` with `k = 2`.
#
# Example: `top_k_filter(z, 2)` → `[2.0, 1.0, -inf, -inf, -inf]` (probabilities `[0.7311, 0.2689, 0, 0, 0]`).

# %% tags=["solution:09.top_k_filter"]
def top_k_filter(logits, k):
    """(..., V) -> (..., V): entries below the row's k-th largest value -> -inf."""
    ### BEGIN SOLUTION
    if k is None or k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))
    ### END SOLUTION


# %% tags=["tests:09.top_k_filter"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("09.top_k_filter")  # noqa: E702
### END HIDDEN TESTS
out = top_k_filter(z, 2)
assert out.shape == (5,), f"expected shape (5,), got {tuple(out.shape)}"
assert torch.equal(out, torch.tensor([2.0, 1.0, float("-inf"), float("-inf"), float("-inf")])), \
    f"top_k_filter(z, 2): expected [2, 1, -inf, -inf, -inf], got {out.tolist()}"
assert torch.equal(top_k_filter(z, None), z), "k=None must leave the logits unchanged"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `top_p_filter` (5 points)
#
# ```python
# top_p_filter(logits: Tensor, p: float | None) -> Tensor
# ```
#
# Nucleus filtering, row by row: keep the most likely tokens, a prefix of the tokens ordered by probability
# (largest first; equal probabilities keep their vocabulary order, so use a **stable** sort:
# `torch.sort(..., descending=True, stable=True)`), and give every other token `-inf`. Return the result in the
# **original vocabulary order**. With `p=None` or `p ≥ 1` the logits come back unchanged. The input may
# already contain `-inf` (after top-k).
#
# **Where the prefix ends is your decision.** It must satisfy every one of these (the hidden check tests them
# and more, on batches and shuffled vocabularies):
#
# - the kept tokens carry a total probability of at least `p`, and the prefix is the shortest one that does;
# - the most likely token always survives, whatever `p`, `p = 0` included (a row is never emptied);
# - on `z`: `p=0.5` keeps only token 0 (probability 0.5630); `p=0.8` keeps tokens 0–2 (probabilities after the
#   softmax `[0.6285, 0.2312, 0.1402, 0, 0]`);
# - four equally likely tokens with `p = 0.5` keep exactly **two**, and with `p = 0.5001` three.
#
# Work out, for the token in sorted position `i`, which quantity you compare with `p`, and whether the
# comparison is strict.

# %% tags=["solution:09.top_p_filter"]
def top_p_filter(logits, p):
    """(..., V) -> (..., V): each row's nucleus kept, every other logit -inf, in vocabulary order."""
    ### BEGIN SOLUTION
    if p is None or p >= 1:
        return logits.clone()
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = before < p
    keep_sorted[..., 0] = True  # the most likely token always survives, p = 0 included
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))
    ### END SOLUTION


# %% tags=["tests:09.top_p_filter"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("09.top_p_filter")  # noqa: E702
### END HIDDEN TESTS
probs_08 = torch.softmax(top_p_filter(z, 0.8), dim=-1)
assert probs_08.shape == (5,), f"expected shape (5,), got {tuple(probs_08.shape)}"
assert torch.allclose(probs_08, torch.tensor([0.6285, 0.2312, 0.1402, 0.0, 0.0]), atol=1e-4), probs_08
assert torch.isfinite(top_p_filter(z, 0.5)).tolist() == [True, False, False, False, False], \
    "p=0.5: the top token (probability 0.563) crosses p and must be kept"
shuffled = z[torch.tensor([3, 0, 4, 1, 2])]
assert torch.isfinite(top_p_filter(shuffled, 0.8)).tolist() == [False, True, False, True, True], \
    "the result must be in the original vocabulary order"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `sample_next_token` (3 points)
#
# ```python
# sample_next_token(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
#                   top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor
# ```
#
# `logits` has shape `(B, V)`; return one token id per row, shape `(B, 1)`, dtype `torch.long`.
#
# - `temperature == 0` means greedy: the argmax of each row (the filters are ignored).
# - Otherwise apply, **in this order**, your `apply_temperature`, `top_k_filter`, `top_p_filter`, then the
#   softmax, and draw with **one** call `torch.multinomial(probs, 1, generator=generator)` for the whole
#   batch. Passing the `generator` on makes a seeded draw reproducible.

# %% tags=["solution:09.sample_next_token"]
def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """(B, V) -> (B, 1) long: argmax for temperature 0, else temperature -> top-k -> top-p -> multinomial."""
    ### BEGIN SOLUTION
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    filtered = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
    probs = torch.softmax(filtered, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)
    ### END SOLUTION


# %% tags=["tests:09.sample_next_token"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("09.sample_next_token")  # noqa: E702
### END HIDDEN TESTS
draws = sample_next_token(z.expand(4000, 5), temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
assert draws.shape == (4000, 1) and draws.dtype == torch.long, f"expected (4000, 1) long, got {draws.shape} {draws.dtype}"
freq = torch.bincount(draws.flatten(), minlength=5) / 4000
assert freq[2:].sum() == 0, f"top_k=2: only tokens 0 and 1 may be drawn; frequencies {freq.tolist()}"
assert abs(freq[0] - 0.7311) < 0.03, f"P(token 0) after top_k=2 is 0.7311; observed {freq[0]:.4f}"
greedy = sample_next_token(torch.randn(3, 7), temperature=0.0)
assert greedy.shape == (3, 1), "temperature 0 must also return (B, 1)"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `generate` (4 points)
#
# ```python
# @torch.no_grad()
# def generate(model, idx, max_new_tokens, context_length, temperature=0.0, top_k=None, top_p=None,
#              eos_id=None, generator=None) -> Tensor
# ```
#
# `model` maps token ids `(B, T)` to logits `(B, T, V)`, and accepts at most `T = context_length` tokens.
# `idx` is the `(B, T0)` prompt (`T0` may exceed `context_length`). Return `(B, T0 + n)` long: the prompt
# followed by `n ≤ max_new_tokens` new tokens.
#
# - Each step runs the model on the sequence so far and picks the next token from the logits of the **last
#   position**, with your `sample_next_token` (temperature, filters and generator passed on; the default
#   `temperature=0.0` is greedy). The model accepts **at most `context_length` tokens** per call, while the
#   sequence (prompt included) may be longer: you decide which tokens to feed it. The required behaviour:
#   the prediction always depends on the most recent token, and for a sequence that fits the window nothing
#   is dropped (the hidden check compares long prompts with the course's reference, token by token).
# - With an `eos_id`: a row that has **produced** `eos_id` keeps emitting `eos_id`; stop early as soon as
#   every row has produced it.
# - Generate in eval mode (dropout off) and without gradient tracking, and leave the model in the mode it
#   was in (`model.training` before the call = after the call).
#
# Below, the course's trained character model (a small GPT-2 trained on Shakespeare, one token per
# character) lets you try it: its greedy continuation of `"ROMEO:"` is printed in the test cell.

# %% tags=["solution:09.generate"]
@torch.no_grad()
def generate(model, idx, max_new_tokens, context_length, temperature=0.0, top_k=None, top_p=None, eos_id=None,
             generator=None):
    """(B, T0) -> (B, T0 + n) long; crop to the last context_length tokens; EOS rows frozen; eval mode inside."""
    ### BEGIN SOLUTION
    was_training = model.training
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
    model.train(was_training)
    return idx
    ### END SOLUTION


# %% tags=["tests:09.generate"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("09.generate")  # noqa: E702
### END HIDDEN TESTS
model, tok = load_gpt_char_tiny()
C = model.cfg.context_length
prompt = torch.tensor([tok.encode("ROMEO:")])
out = generate(model, prompt, 60, C)
assert out.shape == (1, 66) and out.dtype == torch.long, f"expected (1, 66) long, got {tuple(out.shape)} {out.dtype}"
assert torch.equal(out[:, :6], prompt), "the output starts with the prompt"
print(repr(tok.decode(out[0].tolist())))
long_prompt = torch.randint(0, tok.vocab_size, (2, C + 10))
assert generate(model, long_prompt, 3, C).shape == (2, C + 13), "prompts longer than context_length must work"
model.train()
assert torch.equal(generate(model, prompt, 10, C), out[:, :16]) and model.training, \
    "greedy output must not depend on the model's mode, and the mode must be restored"
model.eval()
eos = tok.encode("\n")[0]
stopped = generate(model, prompt, 60, C, eos_id=eos)
tail = stopped[0, 6:].tolist()
assert eos not in tail or all(t == eos for t in tail[tail.index(eos):]), "nothing but EOS may follow EOS"
print("visible tests passed")

# %% [markdown]
# ## Exercise 6 — `generate_batched` (4 points)
#
# ```python
# @torch.no_grad()
# def generate_batched(model, prompts, max_new_tokens, context_length, pad_id=0, temperature=0.0, top_k=None,
#                      top_p=None, eos_id=None, generator=None) -> Tensor
# ```
#
# Generate for `B` prompts of **different lengths** (`prompts`: a list of `B` non-empty lists of token ids) in one
# batch, one model call per step for the whole batch. Return the new tokens only, a `(B, n)` long tensor,
# `n ≤ max_new_tokens`.
#
# **The contract** (what the hidden check verifies):
#
# - Greedy (`temperature=0`), row `b` of the result is **exactly** what your `generate` produces for `prompts[b]`
#   alone: `generate(model, torch.tensor([prompts[b]]), n, context_length)[0, len(prompts[b]):]`. This must hold
#   for any mix of lengths, including a batch of one and prompts of equal length.
# - The id written into padding slots is `pad_id`, and it must not change any result.
# - `temperature`, `top_k`, `top_p` and `generator` go to your `sample_next_token`, one draw per step for the whole
#   batch; `eos_id` works as in `generate` (a finished row keeps emitting `eos_id`; stop when every row has).
# - The longest prompt plus `max_new_tokens` must fit in `context_length` (no cropping here): raise `ValueError`
#   otherwise. Eval mode inside, the caller's mode restored, as in `generate`.
#
# The model is the course's `GPT2Model`. Besides `model(idx)` it accepts two optional `(B, T)` tensors, with the
# meaning `transformers`' GPT-2 gives them:
#
# - `model(idx, attention_mask=mask)`: `mask` bool (or 0/1), `True` for a real token, `False` for a slot that no
#   token may attend to;
# - `model(idx, position_ids=pos)`: `pos` long, the learned position (a row of `pos_emb`, `0 … C−1`) each token
#   gets; without it every row gets `0, 1, …, T−1`. The model never infers positions from the mask.
#
# Where each prompt's tokens and its padding go in the batch, what you pass as `attention_mask` and
# `position_ids` at each step, and which positions the padding slots get are yours to decide: the equality with
# one-by-one generation decides for you. Print the gap between the batch's last-position logits and the prompts'
# own when you are unsure.

# %% tags=["solution:09.generate_batched"]
@torch.no_grad()
def generate_batched(model, prompts, max_new_tokens, context_length, pad_id=0, temperature=0.0, top_k=None,
                     top_p=None, eos_id=None, generator=None):
    """B prompts of different lengths -> (B, n) long new tokens, each row equal to its prompt generated alone."""
    ### BEGIN SOLUTION
    width = max(len(p) for p in prompts)
    if width + max_new_tokens > context_length:
        raise ValueError(f"{width} prompt tokens + {max_new_tokens} new ones exceed context_length={context_length}")
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
        nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
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
    ### END SOLUTION


# %% tags=["tests:09.generate_batched"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("09.generate_batched")  # noqa: E702
### END HIDDEN TESTS
texts = ["ROMEO:", "JULIET:\nO Romeo", "KING"]
batch_out = generate_batched(model, [tok.encode(s) for s in texts], 20, C)
assert batch_out.shape == (3, 20) and batch_out.dtype == torch.long, \
    f"expected (3, 20) long new tokens, got {tuple(batch_out.shape)} {batch_out.dtype}"
for row, s in enumerate(texts):
    alone = generate(model, torch.tensor([tok.encode(s)]), 20, C)[0, len(s):]
    print(f"{s!r:>20} -> batch {tok.decode(batch_out[row].tolist())!r} | alone {tok.decode(alone.tolist())!r}")
    assert torch.equal(batch_out[row], alone), f"row {row} ({s!r}) differs from the prompt generated alone"
print("visible tests passed")

# %% [markdown]
# ## Putting it together
#
# Not graded: your sampler on the character model, at three temperatures, with a seeded generator.

# %%
for temperature in (0.5, 1.0, 1.5):
    sample = generate(model, prompt, cfg["sample_chars"], C, temperature=temperature, top_k=cfg["top_k"],
                      generator=torch.Generator().manual_seed(0))
    print(f"--- T={temperature}, top_k={cfg['top_k']}:\n{tok.decode(sample[0].tolist())}\n")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
