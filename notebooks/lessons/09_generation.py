# %% [markdown]
# # Unit 09 — Generation: greedy decoding and sampling
#
# Unit 08 built GPT-2: token ids in, one vector of **logits** per position out. A language model does
# not write text by itself. Something has to turn logits into a chosen token, append it, and ask again.
# That something is the **decoding loop**, and its knobs (temperature, top-k, top-p) decide whether the
# output is dull, lively or nonsense. In this lesson:
#
# 1. the generation loop, and why only the last position's logits matter;
# 2. greedy decoding and why it repeats itself;
# 3. sampling with `torch.multinomial` and a seeded `torch.Generator`;
# 4. temperature: `softmax(z / T)`, its limits, and its cousin in attention;
# 5. top-k and top-p (nucleus) filtering, with their exact tie and threshold rules;
# 6. the order of the operations, end-of-sequence tokens in a batch, and prompts of different lengths in one
#    batch (left padding, an attention mask and per-row positions);
# 7. an interactive next-token explorer.
#
# Everything runs on the course's **own trained model**: a small GPT-2 (unit 08's `gpt2-char-tiny`
# architecture, one token per character) that unit 10's pretraining pipeline trained on Shakespeare; the
# first cell prints its size, context length and validation loss. The exercise notebook (`exercises/09_generation/09_generation.ipynb`) asks
# you to write `apply_temperature`, `top_k_filter`, `top_p_filter`, `sample_next_token`, `generate` and
# `generate_batched`;
# here we use the finished versions from `llmcourse.train.sampling` and check every claim with a number.
#
# Cells marked **Spot the bug** show mistakes from popular write-ups: run the buggy cell, see which
# property breaks, then repair it in the cell marked **Your fix** and run the self-check below it.

# %%
import math

import matplotlib.pyplot as plt
import torch

import llmcourse
from llmcourse.train.char_model import load_gpt_char_tiny
from llmcourse.train.sampling import (
    apply_temperature,
    entropy,
    filtered_probs,
    generate,
    sample_next_token,
    top_k_filter,
    top_p_filter,
)
from llmcourse.viz import generation as viz

cfg = llmcourse.setup_notebook("09")
model, tok = load_gpt_char_tiny()
C = model.cfg.context_length
V = model.cfg.vocab_size
n_params = sum(p.numel() for p in model.parameters())
info = model.checkpoint_info
print(f"{n_params:,} parameters, vocabulary {V} characters, context {C} characters; "
      f"validation loss {info['val_loss']:.3f} nats per character")
cfg

# %% [markdown]
# ## 1. The generation loop
#
# The model maps a `(B, T)` batch of token ids to `(B, T, V)` logits: at every position `t` a score for
# each of the `V` possible **next** tokens, given tokens `0 … t`. To continue a text we need the token
# after the **last** position only:

# %%
prompt_text = "ROMEO:"
prompt = torch.tensor([tok.encode(prompt_text)])
with torch.no_grad():
    logits = model(prompt)
probs_last = torch.softmax(logits[0, -1], dim=-1)
top5 = torch.topk(probs_last, 5)
print("prompt ids", prompt.tolist(), "-> logits", tuple(logits.shape))
print("after 'ROMEO:' the model expects:",
      ", ".join(f"{viz.display_token(tok.decode([i]))} {p:.3f}" for p, i in zip(top5.values.tolist(), top5.indices.tolist())))

# %% [markdown]
# The loop is short. Repeat `max_new_tokens` times:
#
# 1. feed the model the most recent tokens, **at most `context_length` of them**;
# 2. keep the logits of the last position, shape `(B, V)`;
# 3. turn them into one token per row (argmax, or a draw from a filtered distribution);
# 4. append it to the sequence.
#
# Two rules hold around the loop. The model runs in **evaluation mode**: with dropout active, two greedy runs of
# the same prompt could pick different tokens. And it runs **without gradient tracking**: generation never calls
# `backward`, so recording the graph of every step would only cost memory. A model handed over in training mode
# goes back to training mode when the loop is done: the caller's training run must not find dropout switched off.
#
# The other `T − 1` rows of logits are thrown away. They are not wrong, just **already known**: because
# the model is causal, position `t` only sees tokens `0 … t`, so appending a token cannot change the
# logits of the earlier positions. Let us check, and count how much work the loop repeats.

# %%
with torch.no_grad():
    longer = torch.cat([prompt, top5.indices[:1].view(1, 1)], dim=1)
    again = model(longer)
drift = (again[0, :-1] - logits[0]).abs().max().item()
print(f"logits of the first {prompt.shape[1]} positions after appending one token: max change {drift:.1e}")
assert drift < 1e-4

n_new = 200
fed = sum(min(prompt.shape[1] + s, C) for s in range(n_new))
print(f"generating {n_new} tokens from a {prompt.shape[1]}-token prompt feeds {fed:,} token positions through the "
      f"model, {fed / n_new:.0f}× the {n_new} that are new")

# %% [markdown]
# Almost all of that work recomputes what the previous step already knew. Unit 12 stores each layer's keys
# and values (the **KV cache**) so that every step processes one new token. Until then, `generate`
# recomputes, which is simple and fast enough for a model this small.
#
# The window matters too. GPT-2 has **learned absolute positions**: a table with one row per position,
# `context_length` rows in all. A longer input has no row for its last positions and cannot be embedded,
# so the loop must **crop** to the last `context_length` tokens. The stepper below uses a deliberately
# small window (its `window` argument) so you can watch it slide along as tokens are appended (framed: the
# tokens fed to the model; orange: the token appended at that step).

# %% tags=["nbval-ignore-output"]
viz.show_generation_stepper(model, tok, prompt_text, window=8, n_steps=cfg["stepper_steps"])

# %% [markdown]
# ### Spot the bug: a loop that never crops
#
# A loop that always feeds the whole history works for a while, then fails as soon as the sequence is
# longer than the position table. Run it:

# %%
def feed_everything(ids):
    return ids  # the bug: no crop


ids = torch.randint(0, V, (1, C + 1), generator=torch.Generator().manual_seed(0))
try:
    with torch.no_grad():
        model(feed_everything(ids))
    print("no error?")
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# A second, quieter way to get it wrong: crop from the **wrong end**. `ids[:, :C]` keeps the *first*
# `C` tokens, so once the text is longer than the window the model never sees what it just wrote, and the
# prediction stops changing. The property that catches it: **the next-token distribution must depend on
# the most recent token**.

# %%
def crop_wrong_end(ids, context_length):
    return ids[:, :context_length]


def depends_on_last_token(crop) -> bool:
    """Change only the last token of a long sequence: the next-token distribution must move."""
    a = torch.randint(0, V, (1, C + 20), generator=torch.Generator().manual_seed(1))
    b = a.clone()
    b[0, -1] = (a[0, -1] + 1) % V
    with torch.no_grad():
        pa, pb = (torch.softmax(model(crop(x, C))[0, -1], -1) for x in (a, b))
    return (pa - pb).abs().max().item() > 1e-4


print("prediction depends on the last token:", depends_on_last_token(crop_wrong_end))

# %% [markdown]
# **Your fix.** Rewrite `crop` so it returns the last `context_length` tokens of every row (shape
# `(B, min(T, context_length))`), then run the self-check.

# %%
def crop(ids, context_length):
    # TODO: return the most recent context_length tokens of each row
    return ids[:, :context_length]


def self_check_crop(crop_fn):
    short = torch.tensor([[5, 6, 7]])
    try:
        ok = (torch.equal(crop_fn(short, 8), short)
              and torch.equal(crop_fn(torch.arange(10)[None], 4), torch.arange(6, 10)[None])
              and depends_on_last_token(crop_fn))
    except Exception as err:  # noqa: BLE001 - a self-check reports, it never raises
        ok, why = False, f"{type(err).__name__}: {err}"
    else:
        why = "crop must keep the LAST context_length tokens of every row"
    print("✓ crop is fixed" if ok else f"✗ not yet: {why}")
    return ok


self_check_crop(crop)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): the window is the *end* of each row, from position max(T − C, 0) to T, so a
# row shorter than the window comes back whole. The exercise's `generate` needs exactly this window, so the
# code stays out of the lesson; here the self-check runs on the window that the library's `generate` feeds
# its model, read off with a stand-in model that records its input.
def window_fed_by_library(ids, context_length):
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, x):
            seen.append(x.clone())
            return torch.zeros(x.shape[0], x.shape[1], V)

    generate(Recorder(), ids, 1, context_length)
    return seen[0]


assert self_check_crop(window_fed_by_library)

# %% [markdown]
# ## 2. Greedy decoding and its repetition problem
#
# The simplest rule is **greedy**: always take the most likely token (`temperature=0` in `generate`).
# Here is the model's greedy continuation of `"ROMEO:"`:

# %%
greedy = generate(model, prompt, 60, C)
greedy_text = tok.decode(greedy[0].tolist())
print(f"{greedy.shape[1] - prompt.shape[1]} new characters:")
print(repr(greedy_text))

# %% [markdown]
# Greedy decoding is deterministic: the same prompt always gives the same text. That is also its
# weakness. Run it longer and count how much of the text is new: the fraction of distinct 8-character
# windows among all 8-character windows (1.0 means no window ever repeats).

# %%
def distinct_ngrams(text: str, n: int = 8) -> float:
    grams = [text[i:i + n] for i in range(len(text) - n + 1)]
    return len(set(grams)) / max(len(grams), 1)


def repeated_lines(text: str) -> tuple[int, int]:
    """(complete lines that repeat an earlier line exactly, complete lines)."""
    lines = [ln for ln in text.split("\n")[1:-1] if ln.strip()]  # drop the unfinished first and last lines
    return sum(ln in lines[:i] for i, ln in enumerate(lines)), len(lines)


n_long = cfg["repetition_tokens"]
long_greedy = tok.decode(generate(model, prompt, n_long, C)[0, prompt.shape[1]:].tolist())
long_sampled = tok.decode(generate(model, prompt, n_long, C, temperature=1.0,
                                   generator=torch.Generator().manual_seed(0))[0, prompt.shape[1]:].tolist())
for name, sample in (("greedy", long_greedy), ("sampled at T=1", long_sampled)):
    rep, n_lines = repeated_lines(sample)
    print(f"{n_long} {name} characters: {distinct_ngrams(sample):.2f} distinct 8-grams; {rep} of {n_lines} complete "
          f"lines repeat an earlier line word for word")
print("--- the last 120 greedy characters:\n" + long_greedy[-120:])
assert distinct_ngrams(long_greedy) < distinct_ngrams(long_sampled)

# %% [markdown]
# Why loops are hard to escape: the greedy model is a fixed function of its window. Once the window's
# content repeats, everything after it repeats too, and the most likely continuation of a phrase is often
# the phrase itself. Large models loop less, but greedy decoding of long texts is well known to
# degenerate into repetition (Holtzman et al., *The Curious Case of Neural Text Degeneration*, 2020).
# The cure is to **sample**.
#
# ## 3. Sampling, reproducibly
#
# `torch.multinomial(probs, 1)` draws one index per row with the given probabilities. Every draw uses a
# random number generator; passing our own `torch.Generator` seeded with a fixed value makes a demo
# reproducible without touching torch's global random state. Take the worked example of this unit, the
# five logits `z`:

# %%
z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
p = torch.softmax(z, dim=-1)
print("softmax(z)            ", [round(v, 4) for v in p.tolist()])
print("cumulative            ", [round(v, 4) for v in p.cumsum(0).tolist()])
print(f"entropy               {entropy(p).item():.4f} nats (uniform over 5 would be ln 5 = {math.log(5):.4f})")
assert torch.allclose(p, torch.tensor([0.5630, 0.2071, 0.1256, 0.0762, 0.0280]), atol=1e-4)
assert abs(entropy(p).item() - 1.2065) < 1e-4

g = torch.Generator().manual_seed(0)
first = torch.multinomial(p, 10, replacement=True, generator=g)
again = torch.multinomial(p, 10, replacement=True, generator=torch.Generator().manual_seed(0))
print("ten draws, seed 0:", first.tolist(), "| again with seed 0:", again.tolist())
assert torch.equal(first, again)

# %% [markdown]
# A single draw proves nothing about the distribution; many draws do. With `N` independent draws the
# observed frequency of a token with probability `p` has standard error `√(p(1 − p)/N)`, so almost all
# frequencies land within 4 standard errors of `p`. The course's `sample_next_token` draws one token per
# row of a `(B, V)` batch; a batch of `N` copies of `z` gives `N` draws in one call.

# %%
n_draws = cfg["freq_draws"]
draws = sample_next_token(z.expand(n_draws, 5), temperature=1.0, generator=torch.Generator().manual_seed(0))
freq = torch.bincount(draws.flatten(), minlength=5).double() / n_draws
se = (p.double() * (1 - p.double()) / n_draws).sqrt()
zscores = (freq - p.double()) / se
print(f"{n_draws:,} draws")
print("frequency ", [round(v, 4) for v in freq.tolist()])
print("probability", [round(v, 4) for v in p.tolist()])
print("z-scores  ", [round(v, 2) for v in zscores.tolist()])
assert bool((zscores.abs() < 4).all())

fig, ax = plt.subplots(figsize=(6, 2.6))
x = torch.arange(5).numpy()
ax.bar(x - 0.2, p.numpy(), width=0.4, color="#c7c7c7", label="softmax(z)")
ax.bar(x + 0.2, freq.numpy(), width=0.4, color="#4c72b0", label=f"frequency of {n_draws:,} draws")
ax.set_xticks(x, [f"token {i}" for i in range(5)])
ax.legend()
plt.show()

# %% [markdown]
# ## 4. Temperature
#
# Temperature `T > 0` divides the logits before the softmax: `softmax(z / T)`. `T < 1` sharpens the
# distribution (the likely tokens get likelier), `T > 1` flattens it. The order of the tokens never
# changes, so the argmax is the same at every temperature. The worked example at three temperatures:

# %%
for t in (0.5, 1.0, 2.0):
    pt = torch.softmax(apply_temperature(z, t), dim=-1)
    print(f"T = {t:3}: {[round(v, 4) for v in pt.tolist()]}  entropy {entropy(pt).item():.4f} nats")
assert torch.allclose(torch.softmax(apply_temperature(z, 0.5), -1),
                      torch.tensor([0.8292, 0.1122, 0.0413, 0.0152, 0.0021]), atol=1e-4)
assert torch.allclose(torch.softmax(apply_temperature(z, 2.0), -1),
                      torch.tensor([0.3745, 0.2272, 0.1769, 0.1378, 0.0836]), atol=1e-4)

# %% [markdown]
# The two limits: as `T → 0` the gaps `(z_i − z_max) / T` of every other token go to `−∞`, so the
# distribution becomes one-hot on the argmax (greedy decoding; that is why `temperature=0` *means*
# greedy in `sample_next_token`, which never divides by zero). As `T → ∞` every `z_i / T → 0` and the
# distribution becomes uniform, entropy `ln V`. The entropy falls monotonically as `T` falls:

# %%
temps = torch.logspace(-2, 2, 81)
ents = torch.stack([entropy(torch.softmax(z / t, -1)) for t in temps])
assert bool((ents[1:] >= ents[:-1] - 1e-7).all())      # entropy never decreases with T
print(f"T = {temps[0]:.2f}: entropy {ents[0]:.2e} nats; T = {temps[-1]:.0f}: {ents[-1]:.4f} nats (ln 5 = {math.log(5):.4f})")

fig, ax = plt.subplots(figsize=(6, 2.8))
ax.semilogx(temps.numpy(), ents.numpy())
ax.axhline(math.log(5), color="grey", ls="--", lw=1)
ax.text(temps[0].item(), math.log(5) + 0.03, "ln 5 (uniform)", fontsize=8)
ax.set_xlabel("temperature T")
ax.set_ylabel("entropy of softmax(z / T) (nats)")
plt.show()

# %% [markdown]
# You met this knob in unit 03 without its name. Scaled dot-product attention computes
# `softmax(q·k / √d_k)`: a softmax at temperature `√d_k`. There the division keeps the softmax from
# saturating as `d_k` grows; here we turn the same knob on purpose. The identity, numerically:

# %%
d_k = 64
q, k = torch.randn(d_k, generator=torch.Generator().manual_seed(2)), torch.randn(10, d_k,
                                                                                 generator=torch.Generator().manual_seed(3))
scores = k @ q
gap = (torch.softmax(scores / math.sqrt(d_k), -1) - torch.softmax(apply_temperature(scores, math.sqrt(d_k)), -1)).abs()
print(f"attention weights vs softmax at T = √d_k = {math.sqrt(d_k):.0f}: max difference {gap.max().item():.1e}")
assert gap.max() < 1e-7

# %% [markdown]
# On the character model, one seeded sample per temperature, with two numbers each: the average
# negative log-likelihood per character **under the model itself** (low means "the model finds this very
# predictable") and the fraction of distinct 4-character windows (low means repetitive).

# %%
sweep = viz.temperature_sweep(model, tok, prompt_text, (0.2, 0.8, 1.2, 2.0), cfg["sweep_tokens"], seed=0)
for row in sweep:
    print(f"T = {row['temperature']:3}: {row['nll']:.2f} nats/char under the model, {row['distinct']:.0%} distinct 4-grams")
assert sweep[0]["nll"] < sweep[-1]["nll"]

# %% tags=["nbval-ignore-output"]
viz.show_temperature_sweep(model, tok, prompt_text, n_tokens=cfg["sweep_tokens"], rows=sweep)

# %% [markdown]
# Low temperature gives text the model finds easy (a low NLL), which over longer stretches turns repetitive,
# as greedy decoding did in section 2; high temperature draws so many unlikely characters that the words
# fall apart. Useful settings sit in between.
#
# ### Spot the bug: a continuation scorer that finds greedy text surprising
#
# Scoring a continuation under the model (how surprised is it by each new token?) is how the NLL numbers
# above are made, and how one compares samples. Here is a scorer written in one forward pass, with a
# per-token report. Two facts give a symptom: greedy decoding picks the most likely token at every step,
# so the model's own greedy continuation must score **low**; and real Shakespeare must score far below
# the uniform guess `ln V`. One line of the scorer is wrong; nothing marks it.

# %%
def continuation_report_buggy(model, prompt_ids, new_ids):
    """Per-token negative log-likelihood (nats) of new_ids (N,) after prompt_ids (P,), one forward pass."""
    ids = torch.cat([prompt_ids, new_ids])[None]               # (1, P + N)
    n_prompt, n_new = len(prompt_ids), len(new_ids)
    if n_prompt < 1:
        raise ValueError("the first scored token needs at least one token before it")
    if ids.shape[1] > model.cfg.context_length:
        raise ValueError("prompt + continuation must fit in the window")
    with torch.no_grad():
        logits = model(ids)[0]                                  # (P + N, V): row t scores the token after t
    logp = torch.log_softmax(logits, dim=-1)
    rows = logp[n_prompt:n_prompt + n_new]                      # the rows that score the N new tokens
    nll = -rows.gather(1, new_ids[:, None])[:, 0]               # (N,)
    worst = int(nll.argmax())
    return {
        "nll": nll,
        "mean": nll.mean().item(),
        "perplexity": math.exp(nll.mean().item()),
        "most_surprising": (worst, tok.decode([int(new_ids[worst])]), nll[worst].item()),
    }


score_prompt = prompt[0]
greedy_new = generate(model, prompt, 40, C)[0, len(score_prompt):]
val_start = len(llmcourse.load_text("tinyshakespeare")) * 9 // 10
real_new = torch.tensor(tok.encode(llmcourse.load_text("tinyshakespeare")[val_start:val_start + 40]))
for label, new_ids in (("greedy continuation", greedy_new), ("validation text", real_new)):
    r = continuation_report_buggy(model, score_prompt, new_ids)
    print(f"{label:20s}: {r['mean']:.2f} nats per character (ln V = {math.log(V):.2f})")

# %% [markdown]
# The greedy text, made of the model's favourite characters, scores worse than guessing uniformly. Find the
# wrong line (print `rows.shape`, try a one-character continuation by hand, or compare with a slow scorer
# that runs the model once per new token), fix the copy below, and run the self-check.

# %%
def continuation_report(model, prompt_ids, new_ids):
    # TODO: one line of this copy of continuation_report_buggy is wrong; fix it
    ids = torch.cat([prompt_ids, new_ids])[None]
    n_prompt, n_new = len(prompt_ids), len(new_ids)
    if n_prompt < 1:
        raise ValueError("the first scored token needs at least one token before it")
    if ids.shape[1] > model.cfg.context_length:
        raise ValueError("prompt + continuation must fit in the window")
    with torch.no_grad():
        logits = model(ids)[0]
    logp = torch.log_softmax(logits, dim=-1)
    rows = logp[n_prompt:n_prompt + n_new]
    nll = -rows.gather(1, new_ids[:, None])[:, 0]
    worst = int(nll.argmax())
    return {
        "nll": nll,
        "mean": nll.mean().item(),
        "perplexity": math.exp(nll.mean().item()),
        "most_surprising": (worst, tok.decode([int(new_ids[worst])]), nll[worst].item()),
    }


def slow_nll(prompt_ids, new_ids):
    """One forward per new token: the model's last-position log-probability of that token (the slow route)."""
    out = []
    with torch.no_grad():
        for i in range(len(new_ids)):
            before = torch.cat([prompt_ids, new_ids[:i]])[None]
            out.append(-torch.log_softmax(model(before)[0, -1], -1)[new_ids[i]])
    return torch.stack(out)


def self_check_report(report_fn):
    try:
        ok = all(torch.allclose(report_fn(model, score_prompt, ids_)["nll"], slow_nll(score_prompt, ids_), atol=1e-4)
                 for ids_ in (greedy_new[:12], real_new[:12]))
    except Exception as err:  # noqa: BLE001 - a self-check reports, it never raises
        print(f"✗ not yet: the scorer raised {type(err).__name__}: {err}")
        return False
    print("✓ the scorer agrees with one forward per token" if ok else
          "✗ not yet: the per-token NLL differs from the slow route (which row scores which token?)")
    return ok


self_check_report(continuation_report)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): row t of the logits scores the token at t + 1, so the first new token (at
# position P) is scored by row P − 1; the buggy slice starts one row late and scores every new token with
# the distribution of the token *after* it. The fixed scorer, derived from the buggy one by that change only:
import inspect  # noqa: E402

exec(inspect.getsource(continuation_report_buggy)  # noqa: S102 - defines continuation_report_reference
     .replace("logp[n_prompt:n_prompt + n_new]", "logp[n_prompt - 1:n_prompt - 1 + n_new]")
     .replace("def continuation_report_buggy", "def continuation_report_reference"))
assert self_check_report(continuation_report_reference)  # noqa: F821
fixed_greedy = continuation_report_reference(model, score_prompt, greedy_new)["mean"]  # noqa: F821
fixed_real = continuation_report_reference(model, score_prompt, real_new)["mean"]  # noqa: F821
print(f"fixed: greedy continuation {fixed_greedy:.2f}, validation text {fixed_real:.2f} nats per character")
assert fixed_greedy < fixed_real < math.log(V)

# %% [markdown]
# ### Spot the bug: temperature on the probabilities
#
# A frequent slip applies the temperature **after** the softmax, dividing the probabilities by `T`.
# `torch.multinomial` accepts unnormalised weights and rescales them itself, so dividing every weight by
# the same `T` changes nothing at all. Property: at `T = 0.5` token 0 must be drawn far more often than
# at `T = 1`.

# %%
def tempered_weights_buggy(logits, temperature):
    return torch.softmax(logits, dim=-1) / temperature


def token0_frequency(weights_fn, temperature, n=n_draws):
    w = weights_fn(z, temperature).expand(n, 5)
    return (torch.multinomial(w, 1, generator=torch.Generator().manual_seed(0)) == 0).double().mean().item()


print(f"buggy: P(token 0) at T=1 {token0_frequency(tempered_weights_buggy, 1.0):.4f}, "
      f"at T=0.5 {token0_frequency(tempered_weights_buggy, 0.5):.4f} (the same draws)")

# %% [markdown]
# **Your fix.** Make `tempered_weights` return the tempered distribution, then run the self-check. (Raising
# the probabilities to the power `1/T` and renormalising is mathematically the same thing; dividing them
# by `T` is not.)

# %%
def tempered_weights(logits, temperature):
    # TODO: apply the temperature where it belongs
    return torch.softmax(logits, dim=-1) / temperature


def self_check_temperature(weights_fn):
    want = torch.softmax(z.double() * 2, -1).float()      # T = 0.5 multiplies the logits by 2
    try:
        w = weights_fn(z, 0.5)
        ok = torch.allclose(w / w.sum(), want, atol=1e-4)
    except Exception:  # noqa: BLE001 - a self-check reports, it never raises
        ok = False
    print("✓ temperature is fixed" if ok else "✗ not yet: at T = 0.5 the weights must be proportional to "
          f"{[round(v, 4) for v in want.tolist()]}")
    return ok


self_check_temperature(tempered_weights)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): the temperature acts on the logits, before the softmax; a constant factor on
# the probabilities is undone by the sampler's renormalisation. That is the exercise's `apply_temperature`,
# so the check runs on the library's version instead of showing it.
assert self_check_temperature(lambda logits, t: torch.softmax(apply_temperature(logits, t), dim=-1))

# %% [markdown]
# ## 5. Top-k and top-p
#
# Temperature reshapes the whole distribution, including its long tail of unlikely tokens. Each of them
# is improbable, but together they are drawn surprisingly often, and one bad character can derail a word.
# Two filters cut the tail off before sampling; a removed token gets the logit `−∞`, which the softmax
# turns into probability exactly 0.
#
# **Top-k** keeps the `k` largest logits of each row; what happens to logits tied with the k-th largest is
# the exercise's question (the answer must not depend on an arbitrary order). **Top-p** (nucleus sampling) keeps the smallest set of most
# likely tokens whose total probability reaches `p` (the tokens sorted from largest to smallest
# probability, ties in vocabulary order); exactly where that prefix ends is the exercise's question. On the
# worked example, with the library's filter:

# %%
INF = float("-inf")
print("top-k = 2          ", [round(v, 4) for v in torch.softmax(top_k_filter(z, 2), -1).tolist()])
for p_ in (0.5, 0.6, 0.8, 0.9):
    print(f"top-p = {p_}        ", [round(v, 4) for v in torch.softmax(top_p_filter(z, p_), -1).tolist()])
assert torch.equal(top_k_filter(z, 2), torch.tensor([2.0, 1.0, INF, INF, INF]))
assert torch.allclose(torch.softmax(top_p_filter(z, 0.8), -1), torch.tensor([0.6285, 0.2312, 0.1402, 0, 0]), atol=1e-4)
assert torch.isfinite(top_p_filter(z, 0.5)).tolist() == [True, False, False, False, False]
# both filters switched off leave the distribution exactly as it was
assert torch.equal(top_k_filter(z, None), z) and torch.equal(top_p_filter(z, 1.0), z)
assert torch.equal(filtered_probs(z, 1.0, None, 1.0), torch.softmax(z, -1))

# %% [markdown]
# Read `p = 0.5` carefully: token 0 alone has probability above 0.5 and is kept, although its own mass
# already exceeds `p`; nothing else is. And the boundary, four equally likely tokens:

# %%
uniform4 = torch.zeros(4)
print("uniform over 4, p = 0.5 keeps", int(torch.isfinite(top_p_filter(uniform4, 0.5)).sum()), "tokens;",
      "p = 0.5001 keeps", int(torch.isfinite(top_p_filter(uniform4, 0.5001)).sum()))

# %% [markdown]
# The difference between the two filters shows on real text. Top-k always keeps `k` tokens, whether the
# model is sure (mid-word, one continuation makes sense) or unsure (after a space, many do). Top-p adapts:
# it keeps few tokens where the model is confident and many where it is not. Over validation text:

# %%
text = llmcourse.load_text("tinyshakespeare")
val_text = text[int(0.9 * len(text)):]
n_pos = cfg["nucleus_positions"]
chunks = torch.tensor(tok.encode(val_text[: n_pos + 1]))
with torch.no_grad():  # windows of C characters; position i predicts character i + 1
    val_logits = torch.cat([model(chunks[s:s + C][None])[0] for s in range(0, n_pos, C)])
all_probs = torch.softmax(val_logits, -1)
kept_p = torch.isfinite(top_p_filter(val_logits, 0.9)).sum(-1)
ents_pos = entropy(all_probs)
after_space = torch.tensor([c == " " for c in val_text[:len(kept_p)]])
print(f"top-p = 0.9 over {len(kept_p)} positions: keeps {kept_p.min().item()} to {kept_p.max().item()} tokens, "
      f"median {kept_p.median().item()}")
print(f"after a space it keeps {kept_p[after_space].float().mean():.1f} tokens on average, "
      f"elsewhere {kept_p[~after_space].float().mean():.1f}")
rho = torch.corrcoef(torch.stack([kept_p.float(), ents_pos]))[0, 1].item()
print(f"correlation between the number kept and the model's entropy: {rho:.2f}")

fig, ax = plt.subplots(figsize=(6, 2.6))
ax.hist(kept_p.numpy(), bins=range(1, int(kept_p.max()) + 2), color="#4c72b0", align="left")
ax.axvline(5, color="#dd8452", ls="--", label="top-k = 5 keeps 5, always")
ax.set_xlabel("tokens kept by top-p = 0.9")
ax.set_ylabel("positions")
ax.legend()
plt.show()

# %% [markdown]
# ### Spot the bug: a nucleus that loses its first token
#
# A common nucleus filter keeps the sorted tokens whose **cumulative** probability, their own included, is
# `≤ p`. That drops the token that crosses `p`. When the top token alone has more than `p`, it drops
# everything, and the softmax of a row of `−∞` is NaN. The function below receives probabilities already
# sorted from largest to smallest (the worked example's are) and says which to keep.

# %%
def nucleus_keep_buggy(sorted_probs, p):
    return sorted_probs.cumsum(dim=-1) <= p


p_sorted = torch.softmax(z, dim=-1)                     # z is in descending order already
keep = nucleus_keep_buggy(p_sorted, 0.5)
print("buggy, p = 0.5 keeps", keep.tolist(), "->", torch.softmax(z.masked_fill(~keep, INF), -1).tolist())

# %% [markdown]
# **Your fix.** Make `nucleus_keep` keep the shortest sorted prefix whose mass reaches `p`, never an empty row;
# the self-check tries the worked example and the exact-threshold case.

# %%
def nucleus_keep(sorted_probs, p):
    # TODO: the shortest prefix whose mass reaches p
    return sorted_probs.cumsum(dim=-1) <= p


def self_check_nucleus(keep_fn):
    checks = [(p_sorted, 0.5, [True, False, False, False, False]),
              (p_sorted, 0.8, [True, True, True, False, False]),
              (torch.full((4,), 0.25), 0.5, [True, True, False, False])]
    try:
        ok = all(keep_fn(probs_, p_).tolist() == want for probs_, p_, want in checks)
    except Exception:  # noqa: BLE001 - a self-check reports, it never raises
        ok = False
    print("✓ the nucleus is fixed" if ok else "✗ not yet: p = 0.5 must keep token 0, and four equal tokens keep 2")
    return ok


self_check_nucleus(nucleus_keep)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): the buggy rule loses the token whose probability makes the mass reach p,
# and with it, when the top token alone exceeds p, the whole row. The right rule is the exercise's
# `top_p_filter`, so the check runs on the library's filter instead (logits = log-probabilities).
assert self_check_nucleus(lambda probs_, p_: torch.isfinite(top_p_filter(probs_.log(), p_)))

# %% [markdown]
# ### Spot the bug: "the model's distribution" from a top-20 list
#
# Some demos take a service's top-20 log-probabilities, renormalise them to sum to 1 and present the
# result as the model's full next-token distribution. Everything outside the top 20 silently gets
# probability 0 and every listed token is inflated. Our model is small enough to compare with the truth,
# at every validation position above (the second printed line uses a top-5 list, as some services return):

# %%
for n_top in (20, 5):
    top_vals = torch.topk(all_probs, n_top, dim=-1).values
    mass = top_vals.sum(-1)
    fake = top_vals / mass[:, None]
    true_ent, fake_ent = entropy(all_probs), entropy(fake)
    print(f"top-{n_top}: the listed tokens hold {mass.mean():.1%} of the probability on average "
          f"(lowest {mass.min():.1%}); renormalising inflates them by up to {(1 / mass).max():.2f}× and "
          f"understates the entropy by {(true_ent - fake_ent).mean():.3f} nats on average "
          f"(up to {(true_ent - fake_ent).max():.3f})")

# %% [markdown]
# With a vocabulary of only a few dozen characters, a top-20 list covers nearly everything; GPT-2's
# vocabulary has tens of thousands of tokens and a much longer tail, where the error is larger. The honest label for such a chart is "the 20 most likely
# tokens, renormalised among themselves". The explorer at the end of this lesson shows the model's true
# probabilities and says what share of the mass its 20 bars hold.
#
# ## 6. The order of the operations, and end-of-sequence tokens
#
# `sample_next_token` applies temperature, then top-k, then top-p (on the survivors of top-k, renormalised),
# then draws. The order changes the result. Temperature first means the temperature decides which tokens
# the nucleus keeps; top-k first means top-p measures mass among the `k` survivors only:

# %%
def kept(logits_):
    return torch.isfinite(logits_).nonzero().flatten().tolist()


print("T = 2, then top-p 0.8 keeps tokens", kept(top_p_filter(apply_temperature(z, 2.0), 0.8)),
      "| top-p 0.8, then T = 2 keeps", kept(apply_temperature(top_p_filter(z, 0.8), 2.0)))
print("top-k 2, then top-p 0.6 keeps tokens", kept(top_p_filter(top_k_filter(z, 2), 0.6)),
      "| top-p 0.6, then top-k 2 keeps", kept(top_k_filter(top_p_filter(z, 0.6), 2)))

# %% [markdown]
# The course's order is also the order of Hugging Face's `generate` (temperature, top-k, top-p warpers).
# Checked with `transformers`' own warpers on random logits:

# %%
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), TopPLogitsWarper(0.9)])
rand_logits = torch.randn(8, V, generator=torch.Generator().manual_seed(4)) * 2
hf_probs = torch.softmax(warpers(None, rand_logits.clone()), -1)
ours = filtered_probs(rand_logits, 0.7, 10, 0.9)
print(f"max difference to transformers' warpers: {(hf_probs - ours).abs().max().item():.1e}")
assert torch.allclose(hf_probs, ours, atol=1e-6)

# %% [markdown]
# **End of sequence.** Many models have a token that means "I am done" (GPT-2's `<|endoftext|>`). Our
# character model has none, so for a demo we treat the newline as the end: each prompt below is the start of
# a line, and we want the rest of that line. In a batch, rows finish at different steps. A finished row
# keeps emitting the end token (it becomes padding), and the loop stops once every row has finished:

# %%
starts = ["ROMEO: I ", "JULIET: O", "KING: Wha"]
batch = torch.tensor([tok.encode(s) for s in starts])
nl = tok.encode("\n")[0]
lines = generate(model, batch, 80, C, temperature=0.8, top_k=10, eos_id=nl,
                 generator=torch.Generator().manual_seed(1))
print(f"prompts {tuple(batch.shape)} -> output {tuple(lines.shape)} (the loop stopped after "
      f"{lines.shape[1] - batch.shape[1]} of at most 80 steps)")
for row in lines.tolist():
    new = row[batch.shape[1]:]
    end = new.index(nl) if nl in new else None
    pad = len(new) - end - 1 if end is not None else 0
    print(f"{tok.decode(row[:end + batch.shape[1]] if end is not None else row)!r:70} + newline + {pad} padding")
    assert end is None or all(t == nl for t in new[end:])

# %% [markdown]
# **Prompts of different lengths.** The three prompts above have the same length on purpose: a batch is a
# rectangle. Real prompts differ, so the short ones are **padded** with filler slots, and three questions decide
# whether a padded row still computes what its prompt computes alone:
#
# - *Which side?* The loop reads the next token off the **last column**. Padding on the right puts filler in the
#   last column of every short row, so its "next token" would follow a pad. Padding on the **left** keeps every
#   row's newest token in the last column, and each step appends one column to all rows alike. That is why
#   `transformers` asks for `padding_side="left"` when a decoder-only model generates in batches.
# - *Who may look at a pad?* Nobody: real tokens must not attend to padding slots as keys. The model takes an
#   **attention mask** (`True` = real token) and ANDs it with its causal mask.
# - *Which position?* GPT-2 adds a learned position vector to every token. Run alone, a prompt's first character
#   sits at position 0. In a left-padded row it sits in a later column, so the positions must be counted along
#   the real tokens, not along the columns.
#
# The course's `GPT2Model` accepts both as optional arguments, with the meaning `transformers` gives them:
# `model(idx, attention_mask=mask, position_ids=pos)`. `padded_batch` builds the three tensors for a list of
# prompts; here is a left-padded batch of three prompts (`·` marks a padding slot):

# %%
from llmcourse.train.sampling import padded_batch  # noqa: E402

texts = ["ROMEO:", "JULIET:\nO Romeo, Romeo", "KING"]
prompts = [tok.encode(s) for s in texts]
ids_l, mask_l, pos_l = padded_batch(prompts, side="left")
for row in range(len(texts)):
    shown = "".join(tok.decode([i]) if m else "·" for i, m in zip(ids_l[row].tolist(), mask_l[row].tolist()))
    print(f"{shown.replace(chr(10), '⏎'):>22}   positions {pos_l[row].tolist()}")

# %% [markdown]
# How far is each batched setup from the prompts run one by one? For every prompt, the table compares the logits
# the batch produces for its next character with the logits of the prompt run alone (the largest absolute
# difference over the vocabulary, and whether the greedy choice agrees). Only the row without padding is
# safe in every setup.

# %%
with torch.no_grad():
    alone = [model(torch.tensor([p]))[0, -1] for p in prompts]
    ids_r, mask_r, pos_r = padded_batch(prompts, side="right")
    setups = {
        "right padding, mask and positions": model(ids_r, attention_mask=mask_r, position_ids=pos_r)[:, -1],
        "left padding, no mask": model(ids_l, position_ids=pos_l)[:, -1],
        "left padding, mask, positions by column": model(ids_l, attention_mask=mask_l)[:, -1],
        "left padding, mask, positions by token": model(ids_l, attention_mask=mask_l, position_ids=pos_l)[:, -1],
    }
print(f"{'setup':>40} " + " ".join(f"{t[:10].replace(chr(10), '⏎'):>16}" for t in texts))
for name, last in setups.items():
    cells = []
    for row in range(len(texts)):
        gap = (last[row] - alone[row]).abs().max().item()
        same = int(last[row].argmax()) == int(alone[row].argmax())
        cells.append(f"{gap:9.1e} {'same' if same else 'DIFF':>6}")
    print(f"{name:>40} " + " ".join(cells))
best = setups["left padding, mask, positions by token"]
assert all(torch.allclose(best[r], alone[r], atol=1e-4) for r in range(len(texts)))

# %% [markdown]
# Only the last setup reproduces every prompt (to float round-off, from summing in another order). The gaps of
# the others are far above round-off, and where the table says DIFF they change the most likely character. The exercise
# notebook asks you to write `generate_batched`, a loop that keeps this equality for every generated token, not
# only the first, and checks it against generating each prompt alone.

# %% [markdown]
# ## 7. The next-token explorer
#
# Type a prompt and move the sliders. Grey bars: the model's own probabilities (temperature 1, no filter)
# of the 20 most likely next characters. Blue bars: the distribution that would actually be sampled, after
# temperature, top-k and top-p (a filtered-out character has no blue bar). The axis is logarithmic: a
# trained model is often very sure of the next character, and the tail, where the knobs act, would
# otherwise be invisible. **sample** draws a character (orange), **append** adds it (or, before any
# draw, the greedy choice) to the prompt. Things to try: `T = 0`; a high temperature with and without
# top-p 0.9; the middle of a word vs just after a space; a name followed by `:` and a newline.

# %% tags=["nbval-ignore-output"]
viz.show_next_token_explorer(model, tok, prompt_text)

# %% [markdown]
# ## Summary
#
# * A decoder-only model generates by repeating one step: crop to the context window, run the model, keep
#   the last position's logits, choose a token, append it. Recomputing the earlier positions is wasted work
#   that unit 12's KV cache removes.
# * Greedy decoding is deterministic and tends to loop; sampling with a seeded `torch.Generator` is varied
#   and still reproducible.
# * Temperature divides the logits, not the probabilities. `T → 0` is greedy, `T → ∞` uniform.
# * Top-k and top-p cut the tail before sampling, each row on its own, and never empty a row. Order:
#   temperature, top-k, top-p.
# * Finished rows in a batch keep emitting the end token; the loop stops when all are finished.
# * Prompts of different lengths share a batch by left padding, an attention mask that hides the padding, and
#   positions counted along each row's real tokens; then every row computes what its prompt computes alone.
#
# Next, unit 10 shows how the model you used here was trained.
