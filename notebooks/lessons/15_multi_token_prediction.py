# %% [markdown]
# # Unit 15 — Multi-token prediction
#
# A language model is trained to predict the next token. DeepSeek-V3 adds a small chain of **multi-token
# prediction (MTP)** modules: at position `i`, module `k` predicts token `i+k+1`, but it also reads the tokens up
# to `i+k`, so what it predicts is always the next token after what it has seen, from a cheaper computation than
# the main model's (section 1 makes this precise). They are used during training only, or kept as a cheap drafter for speculative decoding.
# This lesson builds the idea step by step:
#
# 1. next-token vs multi-token objectives; parallel heads vs DeepSeek's sequential chain;
# 2. the index bookkeeping: which hidden state, which embedded token, which target;
# 3. the module: two norms, a concatenation, a projection, one Transformer block, a norm; shared embedding and
#    head;
# 4. the concatenation order;
# 5. the loss and its weighting;
# 6. leakage tests: which logits may move when a future token changes;
# 7. inference: dropping the modules, or drafting with them (self-speculative decoding);
# 8. a training comparison with and without MTP at the same token budget.
#
# We use the course's trained character MTP model: unit 11's `llama3-tiny` with one MTP module, trained on
# Shakespeare (`llmcourse.train.mtp_char`), and the finished classes of `llmcourse.models.mtp`. The exercise
# notebook (`exercises/15_multi_token_prediction/15_multi_token_prediction.ipynb`) asks you to write the
# alignment, the module, the model and speculative decoding yourself.
#
# Cells marked **Spot the bug** show a mistake from popular write-ups: run the buggy cell, see which
# property breaks, then repair it in the cell marked **Your fix** and run the self-check below it.

# %%
import math
import time

import torch
import torch.nn.functional as F

import llmcourse
from llmcourse.data.corpus import char_corpus, get_batch
from llmcourse.models.llama3 import Llama3Block, Llama3Config, llama3_param_count
from llmcourse.models.llama3_cached import generate_uncached
from llmcourse.models.mtp import (
    MTPLanguageModel,
    MTPModule,
    draft_agreement,
    mtp_inputs_and_targets,
    mtp_param_count,
    speculative_trace,
)
from llmcourse.train.mtp_char import compare_mtp, load_mtp_char_tiny
from llmcourse.viz import mtp as viz

cfg = llmcourse.setup_notebook("15")
model, tok = load_mtp_char_tiny()          # trains a small substitute if the asset is missing
encode, decode = tok.encode, tok.decode
mcfg = model.cfg
info = model.checkpoint_info
n_main = sum(p.numel() for p in model.model.parameters())
n_mtp = sum(p.numel() for p in model.mtp.parameters())
print(f"trained MTP model: {n_main:,} main-model parameters + {n_mtp:,} in {model.mtp_depth} MTP module(s); "
      f"context {mcfg.context_length}; validation loss {info['val_loss']:.3f} (main), "
      f"{info.get('val_loss_mtp', float('nan')):.3f} (the depth-1 module)")
corpus = char_corpus("tinyshakespeare")
cfg

# %% [markdown]
# ## 1. Next-token vs multi-token objectives
#
# With next-token prediction, a window of `T` tokens gives `T` training targets: position `i` predicts token
# `i+1`. A multi-token objective also asks position `i` for tokens `i+2, i+3, …`: more targets from the same
# text (a denser signal), and a push for hidden states that carry information about more than the next token.
#
# Two designs exist. **Parallel heads** (Gloeckle et al., 2024) put `D` independent output heads on the trunk's
# last hidden state: head `k` guesses token `i+k+1` from `h_i` alone, without knowing which tokens come in
# between. DeepSeek-V3 uses a **sequential chain**: depth `k` combines the previous depth's state at position `i`
# with the *embedding of token `i+k`* (the token the previous depth was asked to predict), so every depth keeps
# a complete causal chain: it knows every token up to `i+k` and predicts `i+k+1`.
#
# So "depth 1 predicts two tokens ahead" is the wrong picture. Depth `k` at position `i` has **the same
# information** as the main head at position `i+k` (all tokens `≤ i+k`) and **the same target** (token `i+k+1`);
# what differs is the computation: one extra block on top of the trunk state at `i` instead of the whole trunk at
# `i+k`. The best loss either could reach is the same (the entropy of the next token given the prefix), so the
# depth-`k` loss is bounded below by what the main head can reach, and in practice `L_k ≥ L_main`: section 5
# lets you check it. The training signal comes from asking the trunk state at `i` to carry what the module needs.
#
# How many targets does a window give? Depth `k` keeps `T − k` positions:

# %%
T_ctx = cfg["context_length"]
for D in (0, 1, 2, 3):
    targets = T_ctx + sum(T_ctx - k for k in range(1, D + 1))
    print(f"D = {D}: {targets:4d} targets per window of {T_ctx} tokens ({targets / T_ctx:.2f}× next-token)")

# %% [markdown]
# ## 2. Index bookkeeping
#
# Take a window of 9 tokens `w = [10, 11, …, 18]`, inputs `x = w[:-1]` and targets `y = w[1:]` (`T = 8`), and
# a chain of depth `D = 2`. At depth `k` the course's `mtp_inputs_and_targets(x, y, k)` returns the tokens the
# depth embeds and the tokens it predicts; the hidden states come from the previous depth at positions
# `0 … T−k−1`:

# %%
w = torch.arange(10, 19)[None]
x, y = w[:, :-1], w[:, 1:]
print(f"{'depth':>6} | {'hidden states (positions)':>26} | {'embedded tokens':>24} | {'targets':>24}")
print(f"{'main':>6} | {'—':>26} | {str(x[0].tolist()):>24} | {str(y[0].tolist()):>24}")
for k in (1, 2):
    e, t = mtp_inputs_and_targets(x, y, k)
    hidden = f"h{k - 1}[0…{x.shape[1] - k - 1}]"
    print(f"{k:>6} | {hidden:>26} | {str(e[0].tolist()):>24} | {str(t[0].tolist()):>24}")
    for i in range(e.shape[1]):
        assert e[0, i] == w[0, i + k] and t[0, i] == w[0, i + k + 1]
print("at every depth k and position i: embedded token = w[i+k], target = w[i+k+1]")

# %% [markdown]
# The table below does this for any `T` and `D`: each cell shows the hidden state it reads (blue), the token it
# embeds (orange) and its target (green). Pick a cell: the tokens shaded red are the only ones that can influence
# its prediction: `x_0 … x_{i+k}`. Its target `x_{i+k+1}` is never among them.

# %% tags=["nbval-ignore-output"]
viz.show_alignment_table(T=8, D=2)

# %% [markdown]
# ## 3. The module
#
# One MTP depth (course class `MTPModule`) computes, for `T'` positions at once,
#
# $$h'_i = \mathrm{eh\_proj}\big([\,\mathrm{enorm}(e_{i+k});\ \mathrm{hnorm}(h^{(k-1)}_i)\,]\big),\quad
#   h^{(k)} = \mathrm{post\_norm}\big(\mathrm{block}(h', \cos, \sin, \text{causal mask})\big),$$
#
# and the logits are `lm_head(h^(k))`. `enorm`, `hnorm`, `post_norm` are RMSNorms (unit 11), `eh_proj` is a
# `2D → D` linear map without bias, and the block is one Transformer layer, here unit 11's `Llama3Block`.
#
# Which `h^(0)`? The report's equations do not settle whether depth 1 reads the trunk's last hidden state before
# or after the main model's final norm. This course feeds the state **before** the final norm (`model.trunk`) and
# chains each module's output after its `post_norm`. vLLM's DeepSeek-V3 MTP code feeds the state **after** the
# final norm and chains the block output before the head's norm. Both are complete causal chains (`hnorm`
# normalises the input either way, up to its learned gains); a trained module works with the convention it was
# trained with, and the exercise's check accepts both. The
# embedding `e` and the head are the main model's, shared. Both inputs are normalised separately: the trunk's
# hidden state and a raw embedding live on very different scales. In the trained model:

# %%
xb, yb = get_batch(corpus.val, 8, T_ctx, torch.Generator().manual_seed(0))
with torch.no_grad():
    h0 = model.trunk(xb)
    emb = model.model.embed_tokens(xb)
rms = lambda t: t.pow(2).mean(-1).sqrt().mean().item()  # noqa: E731
print(f"RMS of the trunk state h0: {rms(h0):.3f}; RMS of a token embedding: {rms(emb):.3f} "
      f"(ratio {rms(h0) / rms(emb):.1f})")

# %% [markdown]
# **Parameter count.** One module on `llama3-tiny`, part by part, against the main model:

# %%
tiny = Llama3Config.preset("llama3-tiny")
one = MTPModule(tiny.d_model, Llama3Block(tiny), tiny.rms_norm_eps)
parts = {"enorm": one.enorm, "hnorm": one.hnorm, "eh_proj": one.eh_proj, "block": one.mtp_block,
         "post_norm": one.post_norm}
for name, part in parts.items():
    print(f"{name:>9}: {sum(p.numel() for p in part.parameters()):>8,}")
total_mtp = sum(p.numel() for p in one.parameters())
assert total_mtp == mtp_param_count(tiny)
print(f"{'total':>9}: {total_mtp:>8,} = {total_mtp / llama3_param_count(tiny):.0%} of the main model's "
      f"{llama3_param_count(tiny):,} — a training-time cost only")

# %% [markdown]
# **Shared embedding and head.** The MTP modules own no embedding and no head: the course's `MTPLanguageModel`
# calls `model.embed_tokens` and `model.lm_head`, the same objects. Its `state_dict` has `model.*` and `mtp.0.*`
# and nothing twice:

# %%
sd_keys = list(model.state_dict())
print(f"{len(sd_keys)} keys; prefixes: {sorted({k.split('.')[0] for k in sd_keys})}")
print("MTP module keys:", sorted({k.split('.', 2)[2].split('.')[0] for k in sd_keys if k.startswith('mtp.')}))
print("parameters counted once:", len({id(p) for p in model.parameters()}) == len(list(model.parameters())))

# %% [markdown]
# ## 4. The concatenation order
#
# DeepSeek-V3's paper writes the concatenation in one order, while its released checkpoints (whose `eh_proj`
# weights define the order) use the other; the course's trained model follows the checkpoints, and which order
# that is you can read off the trained weights (the exercise asks you to). `transformers` has no MTP layer in the installed version, so there is no library to compare
# against here: the order is a convention, and a trained projection only works with the order it was trained
# with. Swap the two halves on the trained model and measure the depth-1 loss:

# %%
mod = model.mtp[0]
with torch.no_grad():
    normal = model(xb, yb)["loss_mtp"][0].item()
    Dm = mcfg.d_model
    saved = mod.eh_proj.weight.clone()
    mod.eh_proj.weight.copy_(torch.cat([saved[:, Dm:], saved[:, :Dm]], dim=1))   # as if fed the other order
    swapped = model(xb, yb)["loss_mtp"][0].item()
    mod.eh_proj.weight.copy_(saved)
print(f"depth-1 loss with the order it was trained with: {normal:.3f}; with the halves swapped: {swapped:.3f} "
      f"(uniform guessing: {math.log(mcfg.vocab_size):.3f})")

# %% [markdown]
# ## 5. The loss
#
# With `D` depths the training loss is
#
# $$L = L_\text{main} + \frac{\lambda}{D}\sum_{k=1}^{D} L_k ,$$
#
# the main loss untouched and the MTP losses averaged over depths and weighted by `λ`. DeepSeek-V3 used
# `D = 1` with `λ = 0.3` for most of its training and `0.1` at the end. On the trained model (`D = 1`, `λ = 0.3`):

# %%
with torch.no_grad():
    out = model(xb, yb)
print(f"L_main = {out['loss_main']:.4f}, L_1 = {out['loss_mtp'][0]:.4f}, "
      f"L = {out['loss']:.4f} = L_main + {model.mtp_lambda / model.mtp_depth:g}·L_1")
for D, lam in ((1, 0.3), (2, 0.3), (4, 0.1)):
    print(f"D = {D}, λ = {lam}: each MTP loss enters with weight λ/D = {lam / D:g}")

# %% [markdown]
# Normalisation: `L_k` here is the mean cross-entropy over the `T − k` positions depth `k` predicts. The V3 report
# writes it as a sum over those positions divided by `T`, which is `(T − k)/T` times ours (printed below for the
# windows of this lesson): a detail for long windows, a visible factor for short ones.

# %%
for k in (1, 2):
    print(f"T = {T_ctx}, depth {k}: V3's 1/T loss = {(T_ctx - k) / T_ctx:.4f} × the per-position mean")

# %% [markdown]
# **Check the bound yourself.** Section 1 argued that `L_1` cannot beat what the main head reaches on the same
# targets. The main loss printed above averages over all `T` positions, while depth 1 predicts tokens `2 … T`
# only; compare like with like. Write `main_loss_same_targets(out, y)`: the main head's cross-entropy on exactly
# the targets depth 1 predicts, from `out["logits"]` and `y`.

# %%
def main_loss_same_targets(out, y):
    # TODO: the main head's cross-entropy on the targets depth 1 predicts (not all T positions)
    return F.cross_entropy(out["logits"].reshape(-1, out["logits"].shape[-1]), y.reshape(-1))


def self_check_bound(fn=None):
    fn = fn or main_loss_same_targets
    with torch.no_grad():
        o = model(xb, yb)
        got = float(fn(o, yb))
        want = F.cross_entropy(o["logits"][:, 1:].reshape(-1, mcfg.vocab_size), yb[:, 1:].reshape(-1)).item()
    ok = abs(got - want) < 1e-5
    l1 = o["loss_mtp"][0].item()
    print(f"✓ on the same targets: L_main = {got:.4f} ≤ L_1 = {l1:.4f}: {got <= l1}" if ok else
          "✗ not yet: the main loss is not taken over the targets depth 1 predicts")
    return ok


self_check_bound();

# %% jupyter={"source_hidden": true}
# Reference fix: drop the first position, whose target (token 1) depth 1 never predicts.
def main_loss_same_targets_reference(out, y):
    lg = out["logits"][:, 1:]
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y[:, 1:].reshape(-1))


assert self_check_bound(main_loss_same_targets_reference)

# %% [markdown]
# A common write-up presents `(1 − w)·L_main + w·L_mtp` as DeepSeek's objective. That objective shrinks the
# main loss's weight (and its gradient) by `1 − w`, which is a different training recipe: the MTP term is an
# *addition* to next-token training, not a replacement for part of it.
#
# ## 6. Leakage tests
#
# Depth `k` at position `i` may read tokens `0 … i+k` and must not read `i+k+1` (its target) or anything later.
# The test: change one token at a time and record which logits move. Each panel shows, for one depth, the
# positions (rows) whose logits changed when the token in a column was changed; a correct chain gives a
# staircase that stops exactly one column before the target.

# %%
Tl = 12
wl = get_batch(corpus.val, 1, Tl + 1, torch.Generator().manual_seed(1))[0]
xl, yl = wl[:, :-1], wl[:, 1:]
with torch.no_grad():
    base = model(xl, yl)["mtp_logits"][0]
    moved = torch.zeros(Tl - 1, Tl + 1)
    for j in range(Tl + 1):
        w2 = wl.clone()
        w2[0, j] = (w2[0, j] + 1) % mcfg.vocab_size
        pert = model(w2[:, :-1], w2[:, 1:])["mtp_logits"][0]
        moved[:, j] = ((pert - base).abs().amax(-1)[0] > 0).float()
allowed = torch.tensor([[1.0 if j <= i + 1 else 0.0 for j in range(Tl + 1)] for i in range(Tl - 1)])
print(f"depth 1, {Tl - 1} positions × {Tl + 1} tokens: moved only where allowed: {bool((moved <= allowed).all())}; "
      f"moved when token i+1 changed (the embedded one): {bool(all(moved[i, i + 1] for i in range(Tl - 1)))}")
fig, ax = llmcourse.viz.figure(1, 1, figsize=(6, 3.2))
ax.imshow(moved.numpy(), cmap="Greens", vmin=0, vmax=1)
ax.plot(range(2, Tl + 1), range(0, Tl - 1), "rx", label="target token (must not move)")
ax.set_xlabel("token position changed")
ax.set_ylabel("depth-1 position")
ax.legend(fontsize=8, loc="lower left")
fig

# %% [markdown]
# ### Spot the bug: MTP as a loop over positions
#
# Some write-ups compute the MTP logits with a Python loop over positions, running the module on one position
# at a time. Attention over a length-1 sequence is trivial (the position sees only itself), so the block loses
# everything the earlier positions of its depth would give it, and the loop costs `T` interpreter iterations
# per depth. The course model's helpers are `model.trunk(x)` (the trunk output `h0` before the final norm) and
# `model.mtp_hidden(k, h_prev, tokens)` (depth `k` over a whole sequence of states and embedded tokens).

# %%
def depth1_logits_looped(model, x):
    h0 = model.trunk(x)
    cols = []
    for i in range(x.shape[1] - 1):       # one position at a time: attention sees a single token
        h1 = model.mtp_hidden(1, h0[:, i:i + 1], x[:, i + 1:i + 2])
        cols.append(model.model.lm_head(h1))
    return torch.cat(cols, dim=1)


def matches_model(fn) -> bool:
    with torch.no_grad():
        return torch.allclose(fn(model, xb), model(xb, yb)["mtp_logits"][0], atol=1e-4)


t0 = time.perf_counter()
with torch.no_grad():
    looped = depth1_logits_looped(model, xb)
dt = time.perf_counter() - t0
print(f"looped version equals the model's depth-1 logits: {matches_model(depth1_logits_looped)} "
      f"({xb.shape[1] - 1} block calls, {1000 * dt:.0f} ms)")

# %% [markdown]
# **Your fix.** Rewrite `depth1_logits` so that depth 1 runs over all positions at once (one call of
# `model.mtp_hidden` on the whole sequence), then run the self-check.

# %%
def depth1_logits(model, x):
    # TODO: one call over the whole sequence instead of a loop over positions
    return depth1_logits_looped(model, x)


def self_check_depth1(fn=None):
    fn = fn or depth1_logits
    ok = matches_model(fn)
    print("✓ depth 1 runs over the whole sequence" if ok else "✗ not yet: the depth-1 logits differ from the model's")
    return ok


self_check_depth1();

# %% jupyter={"source_hidden": true}
# Reference fix: h0 at positions 0…T-2 and the tokens at 1…T-1, in one call (the block's causal mask does the rest).
def depth1_logits_reference(model, x):
    return model.model.lm_head(model.mtp_hidden(1, model.trunk(x)[:, :-1], x[:, 1:]))


assert self_check_depth1(depth1_logits_reference)

# %% [markdown]
# ### Spot the bug: a depth-1 loss that is too good to be true
#
# A colleague wrote the training loss of a one-module MTP model out by hand, with accuracies for the log, and
# trained a small fresh model with it (same batches for every step, AdamW). Read the log it prints: section 1
# showed that a correct chain cannot make the depth-1 loss beat the main head for long (`L_1 ≥ L_main` is what a
# correct module reaches at best). Somewhere in the function one thing is wrong, and no comment marks it.

# %%
def mtp_losses(model, x, y, lam=0.3):
    """Main and depth-1 losses of a one-module MTP model, with top-1 accuracies for the training log."""
    B, T = x.shape
    h0 = model.trunk(x)                                       # (B, T, D), before the final norm
    main_logits = model.model.lm_head(model.model.norm(h0))
    loss_main = F.cross_entropy(main_logits.reshape(B * T, -1), y.reshape(-1))
    acc_main = (main_logits.argmax(-1) == y).float().mean()

    n = T - 1                                                 # depth 1 keeps T - 1 positions
    h_prev = h0[:, :n]
    emb = model.model.embed_tokens(x[:, 1:])                  # position i embeds token i+1
    target = y[:, 1:]                                         # and predicts token i+2
    cos = model.model.rope_cos[1:1 + n]
    sin = model.model.rope_sin[1:1 + n]
    visible = torch.ones(n, n, dtype=torch.bool).triu()
    h1 = model.mtp[0](h_prev, emb, cos, sin, visible)
    mtp_logits = model.model.lm_head(h1)
    loss_mtp = F.cross_entropy(mtp_logits.reshape(B * n, -1), target.reshape(-1))
    acc_mtp = (mtp_logits.argmax(-1) == target).float().mean()

    return {"loss": loss_main + lam * loss_mtp, "loss_main": loss_main, "loss_mtp": loss_mtp,
            "acc_main": acc_main.item(), "acc_mtp": acc_mtp.item(), "mtp_logits": mtp_logits}


def small_mtp_model():
    torch.manual_seed(0)
    return MTPLanguageModel(Llama3Config(vocab_size=mcfg.vocab_size, d_model=64, n_layers=1, n_heads=2,
                                         n_kv_heads=1, intermediate_size=128, context_length=64))


def train_with(loss_fn, steps):
    small = small_mtp_model()
    opt = torch.optim.AdamW(small.parameters(), lr=3e-3)
    log = []
    for s in range(steps):
        xs, ys = get_batch(corpus.train, 16, 32, torch.Generator().manual_seed(s))
        out = loss_fn(small, xs, ys)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()
        log.append((out["loss_main"].item(), out["loss_mtp"].item(), out["acc_main"], out["acc_mtp"]))
    return log


diag_log = train_with(mtp_losses, cfg["diag_steps"])
for s in (0, len(diag_log) // 2, len(diag_log) - 1):
    lm_, l1_, am_, a1_ = diag_log[s]
    print(f"step {s:>3}: main loss {lm_:.3f} (top-1 {am_:.1%}), depth-1 loss {l1_:.3f} (top-1 {a1_:.1%})")
last = diag_log[-5:]
print(f"mean of the last 5 steps: depth-1 loss − main loss = "
      f"{sum(r[1] - r[0] for r in last) / len(last):+.3f} nats")

# %% [markdown]
# **Your fix.** Find the bug (section 6's test, run on `mtp_losses` instead of the model, is a good tool) and write
# the repaired function below. The self-check probes it for leakage on a fresh model (changing the token a
# position predicts, or any later one, must not move that position's depth-1 logits) and compares its losses
# with the trained model's own.

# %%
def mtp_losses_fixed(model, x, y, lam=0.3):
    # TODO: copy mtp_losses here and repair it
    return mtp_losses(model, x, y, lam)


def self_check_mtp_losses(fn=None):
    fn = fn or mtp_losses_fixed
    probe = small_mtp_model().eval()
    wp = get_batch(corpus.val, 1, 13, torch.Generator().manual_seed(5))[0]
    with torch.no_grad():
        base_lg = fn(probe, wp[:, :-1], wp[:, 1:])["mtp_logits"][0]
        leaks = []
        for j in range(2, 13):                                 # position i may read tokens 0 … i+1 only
            w2 = wp.clone()
            w2[0, j] = (w2[0, j] + 1) % mcfg.vocab_size
            moved = (fn(probe, w2[:, :-1], w2[:, 1:])["mtp_logits"][0] - base_lg).abs().amax(-1) > 1e-6
            leaks += [(i, j) for i in range(base_lg.shape[0]) if moved[i] and j > i + 1]
        got, want = fn(model, xb, yb), model(xb, yb)
    same = all(abs(got[k].item() - v.item()) < 1e-4 for k, v in (("loss_main", want["loss_main"]),
                                                                  ("loss_mtp", want["loss_mtp"][0])))
    ok = not leaks and same
    print("✓ no position reads its target, and the losses equal the trained model's" if ok else
          f"✗ not yet: {len(leaks)} (position, token) pairs leak, e.g. {leaks[:3]}; losses equal the model's: {same}")
    return ok


self_check_mtp_losses();

# %% jupyter={"source_hidden": true}
# Reference fix: the mask. A True entry marks what a position may attend to; the upper triangle lets position i of
# the depth-1 block attend to positions i+1, i+2, …, whose embedded tokens include token i+2, its own target. The
# block then learns to copy, which is why its loss beat the main head's. The lower triangle (the model's
# `model.model.causal[:n, :n]`) restores the chain: position i sees tokens 0 … i+1 only.
def mtp_losses_reference(model, x, y, lam=0.3):
    B, T = x.shape
    h0 = model.trunk(x)
    main_logits = model.model.lm_head(model.model.norm(h0))
    loss_main = F.cross_entropy(main_logits.reshape(B * T, -1), y.reshape(-1))
    acc_main = (main_logits.argmax(-1) == y).float().mean()
    n = T - 1
    h1 = model.mtp[0](h0[:, :n], model.model.embed_tokens(x[:, 1:]), model.model.rope_cos[1:1 + n],
                      model.model.rope_sin[1:1 + n], torch.ones(n, n, dtype=torch.bool).tril())
    mtp_logits = model.model.lm_head(h1)
    target = y[:, 1:]
    loss_mtp = F.cross_entropy(mtp_logits.reshape(B * n, -1), target.reshape(-1))
    acc_mtp = (mtp_logits.argmax(-1) == target).float().mean()
    return {"loss": loss_main + lam * loss_mtp, "loss_main": loss_main, "loss_mtp": loss_mtp,
            "acc_main": acc_main.item(), "acc_mtp": acc_mtp.item(), "mtp_logits": mtp_logits}


assert self_check_mtp_losses(mtp_losses_reference)

# %% [markdown]
# ## 7. Inference: drop the modules, or draft with them
#
# At inference the main model alone generates text: `model.model(ids)` is an ordinary Llama, and the MTP
# modules can be thrown away. Or they can be kept as a **drafter**. After the main model has chosen the next
# token `a`, depth 1 already knows everything it needs to guess the token after `a` (the trunk state at `a`'s
# predecessor and the embedding of `a`). One main-model call on `sequence + a + draft` then does two jobs: its
# prediction at `a`'s position verifies the draft (accepted only if it equals the main model's own argmax), and,
# if accepted, its last position already gives the following token. Every accepted draft saves one main-model
# call, and the output is exactly plain greedy decoding. DeepSeek-V3 reports 85–90 % acceptance for its second
# token and about 1.8× the tokens per second. On the trained character model:

# %%
prompt = torch.tensor([encode("ROMEO:\n")])
n_new = cfg["spec_tokens"]
t0 = time.perf_counter()
trace = speculative_trace(model, prompt, n_new)
t_spec = time.perf_counter() - t0
t0 = time.perf_counter()
greedy = generate_uncached(model.model, prompt, n_new)
t_greedy = time.perf_counter() - t0
same = torch.equal(trace["tokens"], greedy)
assert same, "speculative decoding must reproduce greedy decoding"
print(f"{n_new} tokens, identical to plain greedy decoding: {same}")
print(f"acceptance rate {trace['rate']:.1%} ({trace['accepted']}/{trace['drafts']} drafts); "
      f"{trace['calls']} main-model calls instead of {n_new}: "
      f"{100 * (n_new - trace['calls']) / n_new:.0f} calls saved per 100 tokens")
print(f"wall time (printed, not asserted): {t_spec:.2f} s speculative vs {t_greedy:.2f} s greedy")
print(repr(decode(trace["tokens"][0, prompt.shape[1]:].tolist())))

# %% [markdown]
# That rate is measured on the model's own greedy output, and greedy decoding of a small model soon repeats
# itself: once a phrase loops, the next token is fixed by the loop, and a drafter that has seen the loop in its
# context guesses it easily. So this rate overstates how well the drafter predicts text. Two fairer measures:
# the **teacher-forced agreement** on validation text (depth 1's argmax at `i` vs the main model's argmax at
# `i+1`, both predicting token `i+2` of real text) and the same agreement on text the main model **samples**
# (temperature 1) instead of decoding greedily. The share of repeated 8-character strings measures the looping:

# %%
def repeated_share(ids, n=8):
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1 - len(set(grams)) / max(len(grams), 1)


gen = torch.Generator().manual_seed(0)
sampled = prompt
with torch.no_grad():
    for _ in range(n_new):
        probs = torch.softmax(model.model(sampled)[:, -1], dim=-1)
        sampled = torch.cat([sampled, torch.multinomial(probs, 1, generator=gen)], dim=1)
val_x = get_batch(corpus.val, 8, T_ctx, torch.Generator().manual_seed(2))[0]
rates = {"greedy self-speculation (its own greedy text)": trace["rate"],
         "teacher-forced, validation text": draft_agreement(model, val_x),
         "teacher-forced, sampled text": draft_agreement(model, sampled)}
for what, r in rates.items():
    print(f"{what:>46}: {r:.1%}")
print(f"repeated 8-grams: {repeated_share(trace['tokens'][0].tolist()):.0%} of the greedy text, "
      f"{repeated_share(sampled[0].tolist()):.0%} of the sampled text, "
      f"{repeated_share(val_x[0].tolist()):.0%} of a validation window")
assert rates["greedy self-speculation (its own greedy text)"] > rates["teacher-forced, validation text"]
assert repeated_share(trace["tokens"][0].tolist()) > repeated_share(sampled[0].tolist())

# %% [markdown]
# The stepper replays the greedy run: grey tokens come from the main model, green ones are accepted drafts, red
# ones were drafted and thrown away (the main model's own token follows them).

# %% tags=["nbval-ignore-output"]
frames = viz.speculative_steps(trace, decode)
viz.show_speculative_stepper(frames)

# %% [markdown]
# Without a KV cache (as here) each verification call recomputes the whole sequence, one position longer
# than a plain step, so the wall time gained is smaller than the calls saved; with a cache (unit 12) the verify
# call costs about as much as a plain step, and the saved calls turn into speed.
#
# ## 8. Training with and without MTP at an equal budget
#
# Train `llama3-tiny` twice from the same initial weights on identical batches: once with one MTP module
# (`L_main + 0.3·L_1`) and once without. The main model sees the same tokens either way; the MTP run spends more
# compute per step on its extra module (the ratio is measured below).

# %%
runs = compare_mtp(steps=cfg["compare_steps"], batch_size=cfg["batch_size"], context_length=cfg["context_length"],
                   max_lr=cfg["max_lr"], min_lr=cfg["min_lr"], warmup_steps=cfg["warmup_steps"],
                   eval_every=cfg["eval_every"], eval_batches=cfg["eval_batches"])
p_loss, m_loss = runs["plain"]["val_loss"][-1], runs["mtp"]["val_loss"][-1]
print(f"{cfg['compare_steps']} steps of {cfg['batch_size']}×{cfg['context_length']} tokens: main validation loss "
      f"{p_loss:.4f} without MTP, {m_loss:.4f} with MTP ({m_loss - p_loss:+.4f}); depth-1 validation loss "
      f"{runs['mtp']['val_loss_mtp'][-1]:.4f}")
print(f"ms per step: {runs['plain']['ms_per_step']:.0f} without, {runs['mtp']['ms_per_step']:.0f} with MTP "
      f"({runs['mtp']['ms_per_step'] / runs['plain']['ms_per_step']:.2f}×)")

# %% tags=["nbval-ignore-output"]
viz.show_mtp_loss_curves(runs)

# %% [markdown]
# At this size and budget MTP may bring no gain in the main loss, or a small loss: the reported benefits come
# from large models trained on trillions of tokens, where the extra, denser training signal (every position also
# supervises a later token through the shared trunk) shapes representations that plan ahead. Note that depth `k`
# does not predict "further ahead" from the same input: it sees the token just before its target, like the main
# head, through less computation. A tiny character model on a few hundred steps is a test that the machinery works, not a
# measurement of that effect. What the module certainly gives, even here, is a drafter whose guesses the main
# model accepts often enough to save calls (section 7).
#
# ## Summary
#
# - Depth `k` at position `i` combines the previous depth's state at `i` with the embedding of token `i+k` and
#   predicts token `i+k+1`; embedded tokens `x[:, k:]`, targets `y[:, k:]`, states of positions `0 … T−k−1`.
#   It has the information the main head has at `i+k` (the tokens up to `i+k`) through less computation; that
#   `L_k ≥ L_main` on the same targets is an empirical regularity of trained models, not a consequence.
# - The module: separate RMSNorms on both inputs, the two halves in the checkpoints' order, a `2D → D` projection, one causal block over
#   the whole sequence, a final norm; the embedding and head are the main model's.
# - The loss is `L_main + λ/D·Σ L_k`.
# - Leakage tests perturb one token at a time: nothing at `≥ i+k+1` may move the depth-`k` logits at `i`.
# - The depth-1 module drafts for self-speculative decoding whose output equals greedy decoding; judge the drafter
#   by its agreement on real or sampled text, not by its acceptance on a greedy loop.
#
# ## Extension (optional)
#
# Train a model with **two** MTP depths (`MTPLanguageModel(cfg, mtp_depth=2)`) on the same data for a short run
# (for example with `llmcourse.train.mtp_char.train_mtp` and the sizes of section 8) and store its depth-2
# validation loss in `depth2_val_loss`. Is the depth-2 loss much higher than depth 1's? Both see the token just
# before their target; what differs is the computation their state was built with.

# %%
depth2_val_loss = None   # TODO (optional): a float, the depth-2 validation loss of your run


def self_check_extension():
    ok = isinstance(depth2_val_loss, float) and 0.0 < depth2_val_loss < math.log(mcfg.vocab_size) + 1.0
    print(f"✓ depth-2 validation loss {depth2_val_loss:.3f}" if ok else "✗ not yet: train a two-depth model and "
          "store its depth-2 validation loss")
    return ok


self_check_extension();
