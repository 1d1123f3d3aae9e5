# %% [markdown]
# # Unit 08 — The GPT-2 model
#
# Units 04 and 05 built multi-head attention, LayerNorm, the feed-forward network and the
# transformer block. This lesson assembles them into **GPT-2**, the decoder-only language model
# OpenAI released in 2019, and proves the assembly right by loading Hugging Face's GPT-2 weights and
# reproducing its logits to within float32 rounding.
#
# 1. from the encoder–decoder to decoder-only: what goes, what comes;
# 2. a config and the presets (small, medium, large, XL and the course's character model);
# 3. the embedding path: token + **learned** position, dropout;
# 4. the GPT-2 block: pre-LN, causal attention with Q/K/V biases, a tanh-GELU feed-forward network;
# 5. the full model: initialisation, weight tying, the loss before training;
# 6. parameter accounting: the formula, a breakdown, memory, models built on the `meta` device;
# 7. Hugging Face's layout: `transformer.h.{i}`, fused `c_attn`, `Conv1D`;
# 8. the loader, parity with `GPT2LMHeadModel`, and finding the first layer that diverges;
# 9. (optional) the real 124M weights, when you have a local copy.
#
# The exercise notebook (`exercises/08_gpt2_model/08_gpt2_model.ipynb`) asks you to write
# `GPT2Config.preset`, `GPT2Model`, `gpt2_param_count` with `count_parameters`, and `load_hf_gpt2`.
# Here we use the finished versions from `llmcourse` and check every claim with a number. Cells
# marked **Spot the bug** start from a mistake found in popular write-ups; you run it, see what
# breaks, and fix it.

# %%
import dataclasses
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.models import (
    GPT2_PRESETS,
    GPT2Block,
    GPT2Config,
    GPT2Model,
    count_parameters,
    find_pretrained_gpt2,
    gpt2_param_breakdown,
    gpt2_param_count,
    hf_gpt2_config,
    load_hf_gpt2,
    load_pretrained_gpt2,
    pretrained_gpt2_dir,
    random_hf_gpt2,
)
from llmcourse.nn import FeedForward
from llmcourse.nn.blocks import DecoderBlock
from llmcourse.viz import figure
from llmcourse.viz import gpt2 as viz

cfg = llmcourse.setup_notebook("08")
cfg

# %% [markdown]
# ## 1. From the encoder–decoder to decoder-only
#
# The translator of unit 06 had an encoder, a decoder and cross-attention between them. A language
# model has no source sentence: it reads a prefix and predicts the next token. GPT-2 therefore keeps
# **one causal stack** and drops
#
# * the encoder, and with it every **cross-attention** sublayer (and its LayerNorm);
#
# and adds
#
# * a **final LayerNorm** after the last block (a pre-LN stack never normalises its residual stream
#   otherwise), and
# * an output head **tied** to the token embedding: the same `(V, D)` matrix reads tokens in and
#   scores them out.
#
# What the missing cross-attention saves per block, at GPT-2 small's width (models built on the
# `meta` device: shapes without memory):

# %%
D, H = 768, 12
with torch.device("meta"):
    decoder_block = DecoderBlock(D, H, 4 * D, dropout=0.1, activation="gelu_tanh")
    gpt2_block = GPT2Block(GPT2Config())
n_dec, n_gpt = count_parameters(decoder_block), count_parameters(gpt2_block)
cross = (4 * D * D + 4 * D) + 2 * D   # cross-attention (Q, K, V, out with biases) + its LayerNorm
print(f"encoder-decoder's decoder block: {n_dec:,} parameters; GPT-2 block: {n_gpt:,}; "
      f"difference {n_dec - n_gpt:,} = cross-attention + its norm ({cross:,})")
assert n_dec - n_gpt == cross

# %% [markdown]
# ## 2. A config and the presets
#
# `GPT2Config` is a dataclass with GPT-2 small's values as defaults: a vocabulary of 50,257 tokens
# (50,000 BPE merges, 256 byte tokens and `<|endoftext|>`), 1,024 learned positions, width 768, 12 heads,
# 12 layers, dropout 0.1, Q/K/V biases, LayerNorm ε = 1e-5, a tied head. `GPT2Config.preset(name)`
# returns the four released sizes and the course's own small character model, which later units train
# on Shakespeare:

# %%
print(f"{'preset':15s} {'V':>6s} {'C':>5s} {'D':>5s} {'H':>3s} {'head_dim':>8s} {'L':>3s} {'dropout':>7s}")
for name in GPT2_PRESETS:
    c = GPT2Config.preset(name)
    print(f"{name:15s} {c.vocab_size:6d} {c.context_length:5d} {c.d_model:5d} {c.n_heads:3d} "
          f"{c.d_model // c.n_heads:8d} {c.n_layers:3d} {c.dropout:7.1f}")
assert all(GPT2Config.preset(n).d_model // GPT2Config.preset(n).n_heads == 64 for n in GPT2_PRESETS[:4])
enc = llmcourse.gpt2_encoding()
byte_tokens = {enc.encode_single_token(bytes([b])) for b in range(256)}
n_special = len(enc.special_tokens_set)
print(f"GPT-2's BPE: {enc.n_vocab:,} ids = {len(byte_tokens)} single bytes + "
      f"{enc.n_vocab - len(byte_tokens) - n_special:,} merges + {n_special} special token (<|endoftext|>)")
assert enc.n_vocab == GPT2Config().vocab_size and len(byte_tokens) == 256

# %% [markdown]
# Every released size keeps `head_dim = 64`: growing the width adds heads, not wider heads. An unknown
# name raises `KeyError`.
#
# ## 3. The embedding path: token + learned position
#
# `x₀ = dropout(E_tok[idx] + E_pos[0 … T−1])`. Both tables are `nn.Embedding`s: GPT-2's positions are
# **learned** parameters, not the fixed sinusoids of the 2017 Transformer (unit 02). A popular
# write-up attributes sinusoidal positions to GPT-2; the model's own parameters say otherwise:

# %%
torch.manual_seed(0)
tiny_cfg = GPT2Config.preset("gpt2-char-tiny")
tiny = GPT2Model(tiny_cfg)
print("pos_emb is a", type(tiny.pos_emb).__name__, "| trainable:", tiny.pos_emb.weight.requires_grad,
      "| shape", tuple(tiny.pos_emb.weight.shape))
assert tiny.pos_emb.weight.requires_grad and "pos_emb.weight" in dict(tiny.named_parameters())

# %% [markdown]
# At initialisation the table is random noise: its rows are nearly orthogonal, so position 5 is no more
# like position 6 than like position 60. Nothing tells the model that positions are *ordered*; training
# has to discover it. The course's trained character model (`assets/gpt_char_tiny.pt`, trained in unit 10
# with a context of 128 characters) shows what it found: the cosine similarity between every pair of its
# learned position vectors, and the same for a freshly initialised table of the same shape.

# %%
from llmcourse.train.char_model import load_gpt_char_tiny  # noqa: E402

trained, _ = load_gpt_char_tiny()
fresh = GPT2Model(trained.cfg)


def position_similarity(table):
    unit = F.normalize(table.detach(), dim=-1)
    return unit @ unit.T


def mean_at_distance(sim, lo, hi):
    dist = (torch.arange(sim.shape[0])[:, None] - torch.arange(sim.shape[0])[None, :]).abs()
    return sim[(dist >= lo) & (dist <= hi)].mean().item()


sim_trained, sim_fresh = position_similarity(trained.pos_emb.weight), position_similarity(fresh.pos_emb.weight)
n_pos = sim_trained.shape[0]
bands = [(1, 1), (2, 8), (9, 32), (33, n_pos // 2), (n_pos // 2 + 1, n_pos - 1)]
for lo, hi in bands:
    print(f"positions {lo:3d}–{hi:3d} apart: mean cosine similarity trained {mean_at_distance(sim_trained, lo, hi):+.3f}, "
          f"at initialisation {mean_at_distance(sim_fresh, lo, hi):+.3f}")
norms = trained.pos_emb.weight.detach().norm(dim=-1)
print(f"row norms of the trained table: position 0 {norms[0]:.2f}, median {norms.median():.2f}")
fig, axes = figure(ncols=2, figsize=(8, 3.6))
for ax, sim, title in ((axes[0], sim_fresh, "at initialisation"), (axes[1], sim_trained, "after training")):
    im = ax.imshow(sim.numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_title(f"cosine similarity of positions, {title}", fontsize=8)
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
fig.colorbar(im, ax=axes, shrink=0.8)
assert mean_at_distance(sim_trained, 1, 1) > 0.5 > abs(mean_at_distance(sim_fresh, 1, 1))
assert mean_at_distance(sim_trained, 1, 1) > mean_at_distance(sim_trained, *bands[-1])
fig

# %% [markdown]
# Training turned noise into a smooth code of order: neighbouring positions point the same way, and the
# similarity falls with distance until far-apart positions point in *opposite* directions; a band along
# the diagonal, as in the sinusoidal table of unit 02, but learned. Position 0, which always starts the
# window and never has context, ended up with a much larger vector than the rest.

# %% [markdown]
# Because the table has `context_length` rows, the model cannot read a longer sequence: the forward
# raises `ValueError`, and generation (unit 09) crops the input to its last `context_length` tokens.
# Dropout acts on the sum in training mode and is the identity in eval mode:

# %%
idx = torch.randint(0, tiny_cfg.vocab_size, (4, tiny_cfg.context_length))
try:
    tiny(torch.zeros(1, tiny_cfg.context_length + 1, dtype=torch.long))
except ValueError as err:
    print("ValueError:", err)
drop_cfg = dataclasses.replace(tiny_cfg, dropout=0.1)
dropping = GPT2Model(drop_cfg)
clean = dropping.tok_emb(idx) + dropping.pos_emb(torch.arange(idx.shape[1]))
dropped = dropping.train().embed(idx)
zero_fraction = (dropped == 0).float().mean().item()
print(f"train mode: {zero_fraction:.3f} of the embedding entries are zero (p = 0.1); survivors are × 1/(1 − p):",
      torch.allclose(dropped[dropped != 0], clean[dropped != 0] / 0.9))
print("eval mode is the identity:", torch.equal(dropping.eval().embed(idx), clean))
assert abs(zero_fraction - 0.1) < 0.02

# %% [markdown]
# ## 4. The GPT-2 block
#
# Each of the `L` blocks is **pre-LN** (normalise the input of a sublayer, add its output to the
# untouched residual stream):
#
# $$x \leftarrow x + \text{Dropout}\big(\text{Attn}(\text{LN}_1(x))\big), \qquad
#   x \leftarrow x + \text{Dropout}\big(\text{FFN}(\text{LN}_2(x))\big)$$
#
# * `attn`: llmcourse's `MultiHeadAttention` (unit 04) with `causal=True` and **biases** on `W_query`,
#   `W_key`, `W_value` (GPT-2 has them; many later models drop them);
# * `ffn`: `fc1` (D → 4D), GELU in its **tanh approximation**, `fc2` (4D → D), the unit-05
#   `FeedForward(D, 4D, activation="gelu_tanh")`;
# * `norm1`, `norm2`: LayerNorm with ε = 1e-5; dropout on each sublayer's output.
#
# The architecture map below runs a whole model on the `meta` device and reports every output shape
# and parameter count (choose a preset; the attention weights are `(B, H, T, T)` per layer):

# %% tags=["nbval-ignore-output"]
viz.show_architecture_map()

# %% [markdown]
# Causality is a property we can test: change the tokens from position 10 on and the logits before
# position 10 must not move.

# %%
tiny.eval()
changed = idx.clone()
changed[:, 10:] = torch.randint(0, tiny_cfg.vocab_size, changed[:, 10:].shape)
with torch.no_grad():
    before, after = tiny(idx), tiny(changed)
past = (before[:, :10] - after[:, :10]).abs().max().item()
future = (before[:, 10:] - after[:, 10:]).abs().max().item()
print(f"max change of the logits at positions < 10: {past:.1e}; at positions ≥ 10: {future:.3f}")
assert past < 1e-6 and future > 1e-3

# %% [markdown]
# ## 5. The full model
#
# `GPT2Model` = embeddings → `L` blocks → `final_norm` → `lm_head`, where `lm_head` is an `nn.Linear(D, V,
# bias=False)`. Its logits `(B, T, V)` score every vocabulary entry at every position; the loss
# (unit 00) is the cross-entropy between the logits at position `t` and the token at `t + 1`.
#
# **Initialisation** has two sources. The N(0, 0.02²) draw for every linear and embedding weight (biases 0,
# LayerNorms 1 and 0) is GPT-1's (Radford et al. 2018, §4.1); GPT-2's paper (§2.3) keeps it and adds one
# change: the weights of the **residual layers** are scaled at initialisation by 1/√N, where N is the
# number of residual layers. A residual layer is a sublayer whose output is added to the residual stream:
# in each block `attn.out_proj` and `ffn.fc2` write into it, so N = 2L and their standard deviation is
# 0.02/√(2L). (OpenAI's paper states the factor; the layers it applies to follow from where the adds are,
# counted below on the model.) Measured on the tiny model:

# %%
writers = [name for name, _ in tiny.named_modules() if name.endswith(("attn.out_proj", "ffn.fc2"))]
n_residual = len(writers)
print(f"{n_residual} layers write into the residual stream ({writers[0]}, {writers[1]}, …) = 2·L = "
      f"2·{tiny_cfg.n_layers}")
assert n_residual == 2 * tiny_cfg.n_layers
resid_std = 0.02 / math.sqrt(n_residual)
for key in ("tok_emb.weight", "pos_emb.weight", "blocks.0.attn.W_query.weight", "blocks.0.ffn.fc1.weight",
            "blocks.0.attn.out_proj.weight", "blocks.0.ffn.fc2.weight"):
    print(f"{key:32s} std {tiny.state_dict()[key].std():.5f}")
print(f"target for the residual projections: 0.02/√N = 0.02/√{n_residual} = {resid_std:.5f}")
assert abs(tiny.blocks[0].ffn.fc2.weight.std().item() - resid_std) < 0.1 * resid_std

# %% [markdown]
# Why scale by 1/√(2L)? Each block **adds** two sublayer outputs to the residual stream, so `2L`
# random contributions pile up. With the scaled init their total variance no longer grows with depth.
# Here is the residual stream's standard deviation after each block of a deep, narrow GPT at
# initialisation, with and without the scaling:

# %%
def residual_growth(n_layers, scaled, seed=0):
    torch.manual_seed(seed)
    c = GPT2Config(vocab_size=65, context_length=64, d_model=128, n_heads=4, n_layers=n_layers, dropout=0.0)
    m = GPT2Model(c).eval()
    if not scaled:
        with torch.no_grad():
            for b in m.blocks:
                nn.init.normal_(b.attn.out_proj.weight, 0.0, 0.02)
                nn.init.normal_(b.ffn.fc2.weight, 0.0, 0.02)
    with torch.no_grad():
        states = m.hidden_states(torch.randint(0, 65, (4, 32), generator=torch.Generator().manual_seed(1)))
    return [s.std().item() for s in states]


depth = cfg["depth_layers"]
scaled, unscaled = residual_growth(depth, True), residual_growth(depth, False)
fig, ax = figure(figsize=(6, 3))
ax.plot(scaled, marker="o", ms=3, label="out_proj, fc2 ~ N(0, 0.02/√(2L))")
ax.plot(unscaled, marker="o", ms=3, label="out_proj, fc2 ~ N(0, 0.02)")
ax.set_xlabel("block")
ax.set_ylabel("std of the residual stream")
ax.legend(fontsize=8)
fig

# %%
print(f"after {depth} blocks the residual stream's std grew by {scaled[-1] / scaled[0]:.2f}× with the scaled "
      f"init and by {unscaled[-1] / unscaled[0]:.2f}× without")
assert unscaled[-1] / unscaled[0] > scaled[-1] / scaled[0]

# %% [markdown]
# **Weight tying.** When `tie_weights`, `lm_head.weight` *is* `tok_emb.weight`: one Parameter with two
# names. It appears twice in `state_dict()` but once in `parameters()`, and a gradient step moves both
# views at once.
#
# ### Spot the bug: tying by copy
#
# `lm_head.weight = nn.Parameter(tok_emb.weight.clone())` looks tied (the values are equal at first)
# but creates a second tensor. One optimiser step on a toy loss shows the difference:

# %%
def one_step(model):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    x = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    return (model.lm_head.weight - model.tok_emb.weight).abs().max().item()


torch.manual_seed(0)
tied = GPT2Model(tiny_cfg)
torch.manual_seed(0)
copied = GPT2Model(tiny_cfg)
copied.lm_head.weight = nn.Parameter(copied.tok_emb.weight.detach().clone())
print("same storage:", tied.lm_head.weight.data_ptr() == tied.tok_emb.weight.data_ptr(), "(tied) vs",
      copied.lm_head.weight.data_ptr() == copied.tok_emb.weight.data_ptr(), "(copied)")
print(f"max |head − embedding| after one step: tied {one_step(tied):.1e}, copied {one_step(copied):.3f}")
print(f"parameters: tied {count_parameters(tied):,}, copied {count_parameters(copied):,}")

# %% [markdown]
# **The loss before training.** With small random weights the logits are nearly equal, so the
# predicted distribution is nearly uniform and the cross-entropy is close to ln V. On real
# Shakespeare characters with the tiny model (V = 65):

# %%
text = llmcourse.load_text("tinyshakespeare")
chars = llmcourse.CharTokenizer.from_text(text)
data = torch.tensor(chars.encode(text[:200_000]), dtype=torch.long)
g = torch.Generator().manual_seed(0)
T = tiny_cfg.context_length
starts = torch.randint(0, len(data) - T - 1, (cfg["loss_batch"],), generator=g)
x = torch.stack([data[s:s + T] for s in starts])
y = torch.stack([data[s + 1:s + T + 1] for s in starts])
torch.manual_seed(0)
with torch.no_grad():
    loss0 = F.cross_entropy(GPT2Model(tiny_cfg).eval()(x).flatten(0, 1), y.flatten()).item()
print(f"initial loss on Shakespeare: {loss0:.3f}; ln 65 = {math.log(65):.3f}")
assert abs(loss0 - math.log(65)) < 0.1

# %% [markdown]
# And with GPT-2's vocabulary on *The Verdict* (tokenised with GPT-2's BPE). On the `laptop` profile
# this builds the full 124M-parameter GPT-2 small (about half a gigabyte of float32); the `ci` profile
# uses a narrow model with the same vocabulary. "Close to ln V" has a correction worth knowing: the
# final LayerNorm gives each feature a variance near 1, so the tied head's logits are random with
# variance σ² ≈ D·0.02², and random logits raise the expected cross-entropy to about ln V + σ²/2. For
# a narrow model that is invisible; at D = 768 it adds about 0.15.

# %%
verdict = torch.tensor(enc.encode(llmcourse.load_text("the-verdict")), dtype=torch.long)
n = cfg["loss_context"]
x, y = verdict[:n].view(1, n), verdict[1:n + 1].view(1, n)
big_cfg = GPT2Config() if cfg["build_small"] else GPT2Config(d_model=64, n_heads=4, n_layers=2)
torch.manual_seed(0)
start = time.perf_counter()
big = GPT2Model(big_cfg).eval()
built_s = time.perf_counter() - start
with torch.no_grad():
    logits = big(x)
    loss_v = F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
sigma2 = logits.var().item()
print(f"built a {count_parameters(big):,}-parameter model (D = {big_cfg.d_model}) in {built_s:.1f} s")
print(f"initial loss {loss_v:.3f}; ln 50257 = {math.log(50257):.3f}; logit variance σ² = {sigma2:.3f} "
      f"(D·0.02² = {big_cfg.d_model * 0.02**2:.3f}); ln V + σ²/2 = {math.log(50257) + sigma2 / 2:.3f}")
assert abs(loss_v - (math.log(50257) + sigma2 / 2)) < 0.05
print(f"for D = 768 the predicted excess is 768·0.02²/2 = {768 * 0.02**2 / 2:.3f}")
del big, logits

# %% [markdown]
# ## 6. Parameter accounting
#
# Every parameter of GPT-2 is listed in its `state_dict` table: the token and position tables, per block
# the attention projections, the feed-forward layers and two LayerNorms, then the final norm; a tied head is
# the token table again. Summing that table gives a closed formula in V, C, D and L (you derive it in the
# exercise; the library's `gpt2_param_count` holds it). Here we only *measure*: `count_parameters` walks a
# model and counts each tensor once, and built on the `meta` device even GPT-2 XL costs no memory. The two
# columns must agree:

# %%
millions, shares = {}, {}
print(f"{'preset':15s} {'formula':>15s} {'counted (meta)':>15s} {'token table':>12s} {'fp32':>10s} {'bf16':>10s}")
for name in GPT2_PRESETS:
    c = GPT2Config.preset(name)
    with torch.device("meta"):
        model = GPT2Model(c)
    counted, formula = count_parameters(model), gpt2_param_count(c)
    share = c.vocab_size * c.d_model / formula
    print(f"{name:15s} {formula:15,d} {counted:15,d} {100 * share:11.1f}% {formula * 4 / 1e6:8.1f}MB "
          f"{formula * 2 / 1e6:8.1f}MB")
    assert counted == formula and next(model.parameters()).is_meta
    millions[name] = round(formula / 1e6)
    shares[name] = share

# %% [markdown]
# The token table is about a third of GPT-2 small and only a few per cent of XL: the vocabulary is
# fixed while the blocks grow with `L·D²`. The released sizes, rounded to millions:

# %%
print(millions)
assert [millions[n] for n in GPT2_PRESETS[:4]] == [124, 355, 774, 1558]
assert round(100 * shares["gpt2-small"], 1) == 31.0 and shares["gpt2-xl"] < 0.06

# %% [markdown]
# A breakdown of GPT-2 small:

# %%
small = GPT2Config()
parts = gpt2_param_breakdown(small)
per_block = {k: parts[k] // small.n_layers for k in ("attention", "ffn", "block_norms")}
print({k: f"{v:,}" for k, v in parts.items()})
print(f"one block: {sum(per_block.values()):,} = attention {per_block['attention']:,} + FFN {per_block['ffn']:,}"
      f" + norms {per_block['block_norms']:,}")
print(f"weights in fp32: {parts['total'] * 4 / 1e6:.1f} MB = {parts['total'] * 4 / 2**20:.1f} MiB; "
      f"in bf16 half that: {parts['total'] * 2 / 1e6:.1f} MB")
untied = gpt2_param_count(dataclasses.replace(small, tie_weights=False))
print(f"with the head counted separately (untied, or a tied tensor counted twice): {untied:,}")
assert parts["total"] == 124_439_808 and untied == 163_037_184

# %% [markdown]
# **"117M" or 124M?** The GPT-2 paper's table lists the smallest model as 117M parameters, but the
# released checkpoint has the count printed above with the head tied (and the larger one if the
# head is counted twice). OpenAI's own repository later named the downloads by their counts rounded
# to millions, as computed above: 124M, 355M, 774M and 1558M.
#
# Explore the split by component (the toggles untie the head or drop the Q/K/V biases):

# %% tags=["nbval-ignore-output"]
viz.show_param_sunburst()

# %% [markdown]
# ### A compute and memory budget
#
# What does training cost per token? Nearly all the arithmetic is matrix multiplication. A weight matrix
# with `n` entries costs `2n` floating-point operations per token in the forward pass (a multiply and an
# add per entry) and twice that in the backward pass (the gradient with respect to the input and with
# respect to the weight), so **6 FLOPs per matrix entry per token**. Embedding lookups are not
# multiplications; the tied head is. Attention adds the score and mixing products, which grow with the
# context `T`: per layer and token, `T·D` multiply-adds (`2·T·D` FLOPs) for `QKᵀ` and as many for the
# weighted sum of the values (computed for all `T` keys, masked or not), `4·T·D` FLOPs forward, ×3 for
# training, `12·L·T·D` FLOPs in all (the cell below checks the attention term against the measured count). Memory has three
# parts: the weights, one gradient per weight and AdamW's two moment estimates (four float32 numbers,
# 16 bytes per parameter), plus the **activations** autograd keeps for the backward pass, which grow with
# batch × context. Both are *measured* below on `meta` models (shapes only, no memory, no arithmetic):
# `FlopCounterMode` counts the matmul FLOPs of a forward and backward pass, and a saved-tensor hook adds up
# what autograd keeps.

# %%
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402


def training_budget(config, batch, context):
    """Measured FLOPs per token (forward + backward) and bytes autograd saves, on the meta device."""
    with torch.device("meta"):
        model = GPT2Model(dataclasses.replace(config, dropout=0.0))
        ids = torch.zeros(batch, context, dtype=torch.long)
    saved = [0]

    def keep(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with FlopCounterMode(display=False) as counter:
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
    matmul_entries = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return {"params": count_parameters(model), "matmul_entries": matmul_entries,
            "flops_per_token": counter.get_total_flops() / (batch * context), "saved_bytes": saved[0]}


opt_probe = nn.Linear(3, 4)
probe_opt = torch.optim.AdamW(opt_probe.parameters())
opt_probe(torch.ones(1, 3)).sum().backward()
probe_opt.step()
state_numbers = sum(v.numel() for st in probe_opt.state.values() for v in st.values() if v.dim() > 0)
n_probe = sum(p.numel() for p in opt_probe.parameters())
bytes_per_param = 4 * (n_probe + n_probe + state_numbers) / n_probe   # weights + gradients + AdamW state
print(f"AdamW in float32 keeps {state_numbers // n_probe} numbers per parameter: {bytes_per_param:.0f} bytes per "
      "parameter with the weight and its gradient")

for name, batch, context in (("gpt2-char-tiny", 32, 64), ("gpt2-small", 8, 1024)):
    c = GPT2Config.preset(name)
    b = training_budget(c, batch, context)
    predicted = 6 * b["matmul_entries"] + 12 * c.n_layers * context * c.d_model
    tokens = batch * context
    print(f"{name} (batch {batch} × {context}): {b['params']:,} parameters, {b['matmul_entries']:,} in matmuls")
    print(f"  FLOPs per token: measured {b['flops_per_token'] / 1e6:,.2f} M; 6·(matmul entries) + 12·L·T·D = "
          f"{predicted / 1e6:,.2f} M; 6N alone = {6 * b['params'] / 1e6:,.2f} M")
    print(f"  per step of {tokens:,} tokens: {b['flops_per_token'] * tokens / 1e12:.3f} TFLOP; memory: "
          f"{b['params'] * bytes_per_param / 2**20:,.1f} MiB weights + gradients + AdamW state, "
          f"{b['saved_bytes'] / 2**20:,.1f} MiB of saved activations")
    assert abs(b["flops_per_token"] - predicted) < 1e-6 * predicted
    # the attention term alone: measured FLOPs minus the weight matrices' 6 per entry, per layer, forward only
    attn_fwd = (b["flops_per_token"] - 6 * b["matmul_entries"]) / (3 * c.n_layers)
    print(f"  attention products per layer and token, forward: {attn_fwd:,.0f} FLOPs = 4·T·D = "
          f"{4 * context * c.d_model:,} (2·T·D for QKᵀ, 2·T·D for the weighted sum)")
    assert abs(attn_fwd - 4 * context * c.d_model) < 1e-6 * predicted

# %% [markdown]
# The measured count and the prediction agree exactly. The popular shortcut "6N per token" counts the
# position table (a lookup, no arithmetic) and misses attention's own products, whose share grows with the
# context; for short contexts it is close, for GPT-2 small at its full context it is visibly low. Activations,
# not weights, dominate a GPT-2 small step at this batch size.

# %% [markdown]
# ## 7. Hugging Face's layout
#
# `transformers.GPT2LMHeadModel` computes the same function with other names and another layout
# (shapes of GPT-2 small, built on `meta`):

# %%
from transformers import GPT2LMHeadModel  # noqa: E402

with torch.device("meta"):
    hf_small = GPT2LMHeadModel(hf_gpt2_config(GPT2Config()))
for key, value in hf_small.state_dict().items():
    if key.startswith(("transformer.wte", "transformer.wpe", "transformer.h.0.", "transformer.ln_f", "lm_head")):
        print(f"{key:40s} {tuple(value.shape)}")
print("lm_head tied to wte:", hf_small.lm_head.weight is hf_small.transformer.wte.weight)
assert tuple(hf_small.state_dict()["transformer.h.0.attn.c_attn.weight"].shape) == (768, 2304)

# %% [markdown]
# Three differences matter for loading:
#
# 1. **names**: `transformer.wte/wpe` are the two embeddings, `h.{i}` the blocks (`ln_1`, `attn`, `ln_2`,
#    `mlp`), `ln_f` the final norm;
# 2. a **fused** `c_attn` computes query, key and value in one matrix, `3D` outputs per position; which
#    outputs belong to which of the three is what the exercise's loader must get right (the logits tell);
# 3. GPT-2's layers are `Conv1D`s, a name from OpenAI's TensorFlow code. A `Conv1D(nf, nx)` computes
#    `y = x @ W + b` with `W` stored **`(in, out)`**, the transpose of `nn.Linear.weight`'s `(out, in)`.
#
# ### Spot the bug: copying a `Conv1D` weight into `nn.Linear`
#
# Run the helper below. It copies the weight as it is; the shape guard of `copy_` stops a wide layer,
# but a **square** layer (like `attn.c_proj`, `D×D`) loads silently and computes something else:

# %%
from transformers.pytorch_utils import Conv1D  # noqa: E402


def random_conv1d(n_in, n_out, seed):
    conv = Conv1D(n_out, n_in)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g))
        conv.bias.copy_(torch.randn(conv.bias.shape, generator=g))
    return conv


def conv1d_check(to_linear):
    """Max |nn.Linear − Conv1D| on random inputs, for a square and a wide layer (None: loading failed)."""
    result = {}
    for what, conv in (("square 8→8", random_conv1d(8, 8, 0)), ("wide 8→32", random_conv1d(8, 32, 1))):
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
        try:
            with torch.no_grad():
                result[what] = (to_linear(conv)(x) - conv(x)).abs().max().item()
        except RuntimeError:
            result[what] = None
    return result


def linear_from_conv1d_buggy(conv):
    n_in, n_out = conv.weight.shape          # Conv1D stores (in, out)
    lin = nn.Linear(n_in, n_out)
    with torch.no_grad():
        lin.weight.copy_(conv.weight)        # nn.Linear wants (out, in)
        lin.bias.copy_(conv.bias)
    return lin


print("buggy:", conv1d_check(linear_from_conv1d_buggy))

# %% [markdown]
# The square layer "loads" and is wrong by whole units; the wide one fails to load. **Your turn:** fix
# the helper in the cell below, then run the self-check. Both layers must agree with `Conv1D` to
# float32 rounding.

# %%
def linear_from_conv1d(conv):
    # TODO: fix this copy (it is the buggy version above)
    n_in, n_out = conv.weight.shape
    lin = nn.Linear(n_in, n_out)
    with torch.no_grad():
        lin.weight.copy_(conv.weight)
        lin.bias.copy_(conv.bias)
    return lin


# %%
def self_check_conv1d(to_linear):
    try:
        gaps = conv1d_check(to_linear)
    except Exception as err:  # noqa: BLE001 - a self-check reports, it never raises
        print(f"✗ not yet: {type(err).__name__}: {err}")
        return False
    ok = all(v is not None and v < 1e-5 for v in gaps.values())
    print(f"✓ both layers agree with Conv1D: {gaps}" if ok else
          f"✗ not yet: {gaps} (None: loading failed); which layout does nn.Linear store?")
    return ok


self_check_conv1d(linear_from_conv1d)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): Conv1D stores (in, out) and computes x @ W; nn.Linear stores (out, in) and
# computes x @ W.T, so the weight goes in transposed.
def linear_from_conv1d_reference(conv):
    n_in, n_out = conv.weight.shape
    lin = nn.Linear(n_in, n_out)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.T)
        lin.bias.copy_(conv.bias)
    return lin


assert self_check_conv1d(linear_from_conv1d_reference)

# %% [markdown]
# ## 8. Loading Hugging Face weights, and proving it
#
# The loader renames every key, splits `c_attn` along its output columns into query, key and value,
# transposes every `Conv1D` weight, and copies into the existing tensors so the head stays tied. You
# write it in the exercise; here we use the library's `load_hf_gpt2`.
#
# A parity test is only as good as its weights. `GPT2LMHeadModel`'s own initialisation sets the
# LayerNorms to 1 and 0 and the biases to 0, which hides mistakes in them. So we re-draw **every**
# tensor at random (standard deviation 0.2; LayerNorm weights around 1) before comparing, on two small
# configurations:

# %%
idx = torch.randint(0, 1000, (2, 17), generator=torch.Generator().manual_seed(0))
for d, h, n_layers in ((64, 4, 2), (48, 3, 3)):
    c = GPT2Config(vocab_size=1000, context_length=128, d_model=d, n_heads=h, n_layers=n_layers, dropout=0.0)
    hf = random_hf_gpt2(c, seed=0)
    ours = load_hf_gpt2(GPT2Model(c).eval(), hf.state_dict())
    with torch.no_grad():
        diff = (ours(idx) - hf(idx).logits).abs().max().item()
        scale = hf(idx).logits.abs().max().item()
    print(f"D={d}, H={h}, L={n_layers}: max |logits − transformers| = {diff:.1e} (logits up to {scale:.1f}); "
          f"head still tied: {ours.lm_head.weight is ours.tok_emb.weight}")
    assert diff < 1e-4

# %% [markdown]
# When a loader is wrong, *where* does the disagreement start? The divergence finder loads a random
# GPT-2, injects one mistake into the course model and compares the residual stream after every
# block with `transformers`' hidden states. The first bar above the threshold names the culprit's
# layer: a missing transpose or a post-LN block breaks block 1, an untied random head only the logits.

# %% tags=["nbval-ignore-output"]
viz.show_divergence_finder()

# %% [markdown]
# ### Spot the bug: "the differences are just floating point"
#
# A common report: "my GPT-2 matches Hugging Face to about 1e-3; the rest is floating-point noise".
# Float32 rounding in these models stays at a few 1e-6 (see the parity above). A gap of 1e-3 is a real
# difference, and the usual one is the GELU: GPT-2 uses the **tanh approximation** (`gelu_new` in
# transformers), not the exact erf form. Compare one feed-forward layer with Hugging Face's `GPT2MLP`:

# %%
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP  # noqa: E402

mlp_cfg = GPT2Config(vocab_size=1000, context_length=128, d_model=64, n_heads=4, n_layers=1, dropout=0.0)
hf_mlp = GPT2MLP(4 * 64, hf_gpt2_config(mlp_cfg)).eval()
with torch.no_grad():
    for p in hf_mlp.parameters():
        p.copy_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
x = torch.randn(2, 17, 64, generator=torch.Generator().manual_seed(3))


def mlp_gap(activation):
    ffn = FeedForward(64, 256, activation=activation).eval()
    with torch.no_grad():
        ffn.fc1.weight.copy_(hf_mlp.c_fc.weight.T)
        ffn.fc1.bias.copy_(hf_mlp.c_fc.bias)
        ffn.fc2.weight.copy_(hf_mlp.c_proj.weight.T)
        ffn.fc2.bias.copy_(hf_mlp.c_proj.bias)
        return (ffn(x) - hf_mlp(x)).abs().max().item()


print(f"FeedForward with activation='gelu' (exact): max gap {mlp_gap('gelu'):.1e}")

# %% [markdown]
# **Your turn:** set the activation name so that the course's `FeedForward` reproduces `GPT2MLP`
# (the choices are `"relu"`, `"gelu"` and `"gelu_tanh"`), then run the self-check.

# %%
GPT2_ACTIVATION = "gelu"  # TODO: which activation does GPT-2 use?

# %%
def self_check_activation(name):
    try:
        gap = mlp_gap(name)
    except Exception as err:  # noqa: BLE001 - a self-check reports, it never raises
        print(f"✗ not yet: {type(err).__name__}: {err}")
        return False
    print(f"✓ max gap {gap:.1e}: float32 rounding" if gap < 1e-5 else
          f"✗ not yet: max gap {gap:.1e} (≥ 1e-5 is not rounding)")
    return gap < 1e-5


self_check_activation(GPT2_ACTIVATION)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): GPT-2 uses GELU's tanh approximation (`gelu_new` in transformers).
assert self_check_activation("gelu_tanh")

# %% [markdown]
# ### Spot the bug: a parity gap in a hand-written forward
#
# A from-scratch GPT-2 forward pass, written straight from a `state_dict` (course keys), is a common way to
# check one's understanding. The one below runs, returns logits of the right shape, and disagrees with the
# course's `GPT2Model` holding the same weights. **One line is wrong**; nothing marks it. Symptom first:

# %%
diag_cfg = GPT2Config(vocab_size=50, context_length=32, d_model=32, n_heads=4, n_layers=2, dropout=0.0)
torch.manual_seed(5)
diag_model = GPT2Model(diag_cfg).eval()
with torch.no_grad():
    for prm in diag_model.parameters():
        prm.add_(0.2 * torch.randn(prm.shape))
diag_sd = {k: v.detach() for k, v in diag_model.state_dict().items()}
diag_idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(6))


def forward_gap(forward_fn):
    """Max |forward_fn − GPT2Model| over the logits, on the same weights and tokens."""
    with torch.no_grad():
        return (forward_fn(diag_sd, diag_idx, diag_cfg.n_heads) - diag_model(diag_idx)).abs().max().item()


def gpt2_forward_buggy(sd, idx, n_heads, eps=1e-5):
    n_batch, n_tok = idx.shape
    x = sd["tok_emb.weight"][idx] + sd["pos_emb.weight"][:n_tok]
    width = x.shape[-1]
    head = width // n_heads
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    allowed = torch.ones(n_tok, n_tok, dtype=torch.bool).tril()

    def norm(h, name):
        return F.layer_norm(h, (width,), sd[name + ".weight"], sd[name + ".bias"], eps)

    def affine(h, name):
        return h @ sd[name + ".weight"].T + sd[name + ".bias"]

    def heads(h):
        return h.view(n_batch, n_tok, n_heads, head).transpose(1, 2)

    for i in range(depth):
        pre = f"blocks.{i}."
        h = norm(x, pre + "norm1")
        q, k, v = (heads(affine(h, pre + "attn." + w)) for w in ("W_query", "W_key", "W_value"))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(width)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        mixed = (weights @ v).transpose(1, 2).reshape(n_batch, n_tok, width)
        x = x + affine(mixed, pre + "attn.out_proj")
        inner = F.gelu(affine(norm(x, pre + "norm2"), pre + "ffn.fc1"), approximate="tanh")
        x = x + affine(inner, pre + "ffn.fc2")
    return norm(x, "final_norm") @ sd["tok_emb.weight"].T


print(f"max |hand-written − GPT2Model| = {forward_gap(gpt2_forward_buggy):.3f} (float32 rounding would be ~1e-6)")

# %% [markdown]
# Find it. Useful moves: compare intermediate results with the model's (`diag_model.hidden_states`, the
# embedding, one block), and ask which quantity each line depends on. Fix the copy below and run the
# self-check.

# %%
def gpt2_forward(sd, idx, n_heads, eps=1e-5):
    # TODO: one line of this copy of gpt2_forward_buggy is wrong; fix it
    n_batch, n_tok = idx.shape
    x = sd["tok_emb.weight"][idx] + sd["pos_emb.weight"][:n_tok]
    width = x.shape[-1]
    head = width // n_heads
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    allowed = torch.ones(n_tok, n_tok, dtype=torch.bool).tril()

    def norm(h, name):
        return F.layer_norm(h, (width,), sd[name + ".weight"], sd[name + ".bias"], eps)

    def affine(h, name):
        return h @ sd[name + ".weight"].T + sd[name + ".bias"]

    def heads(h):
        return h.view(n_batch, n_tok, n_heads, head).transpose(1, 2)

    for i in range(depth):
        pre = f"blocks.{i}."
        h = norm(x, pre + "norm1")
        q, k, v = (heads(affine(h, pre + "attn." + w)) for w in ("W_query", "W_key", "W_value"))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(width)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        mixed = (weights @ v).transpose(1, 2).reshape(n_batch, n_tok, width)
        x = x + affine(mixed, pre + "attn.out_proj")
        inner = F.gelu(affine(norm(x, pre + "norm2"), pre + "ffn.fc1"), approximate="tanh")
        x = x + affine(inner, pre + "ffn.fc2")
    return norm(x, "final_norm") @ sd["tok_emb.weight"].T


def self_check_forward(forward_fn):
    try:
        gap = forward_gap(forward_fn)
    except Exception as err:  # noqa: BLE001 - a self-check reports, it never raises
        print(f"✗ not yet: the forward raised {type(err).__name__}: {err}")
        return False
    ok = gap < 1e-4
    print(f"✓ the forward matches GPT2Model (max gap {gap:.1e})" if ok else
          f"✗ not yet: max gap {gap:.3f}; which line differs from what unit 03 taught about the scores?")
    return ok


self_check_forward(gpt2_forward)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): the embedding, the norms, the projections and the feed-forward network all
# match; the gap starts in the attention scores, which are scaled by the square root of the width of what
# was multiplied: one head's width (D / H), not the model's width D. The wrong scale makes every head's
# softmax too flat. The fixed forward, derived from the buggy one by that single change:
import inspect  # noqa: E402

_fixed_source = inspect.getsource(gpt2_forward_buggy).replace("math.sqrt(width)", "math.sqrt(head)").replace(
    "def gpt2_forward_buggy", "def gpt2_forward_reference")
exec(_fixed_source)  # noqa: S102 - defines gpt2_forward_reference
assert self_check_forward(gpt2_forward_reference)  # noqa: F821

# %% [markdown]
# ## 9. (Optional) The real GPT-2 weights
#
# The course ships no pretrained weights and never downloads any. If you have the internet, put a
# Hugging Face GPT-2 checkpoint (`config.json` and `model.safetensors`) in the folder printed below, for
# example with `huggingface_hub.snapshot_download("openai-community/gpt2", local_dir=<that folder>)`;
# the next cell then loads it with the same `load_hf_gpt2` and continues a prompt greedily. Without a
# local copy it is skipped.

# %% tags=["nbval-ignore-output"]
weights = find_pretrained_gpt2()
print("looking in", pretrained_gpt2_dir())
if weights is None:
    print("no local GPT-2 checkpoint: skipped (this cell is optional)")
else:
    gpt2 = load_pretrained_gpt2(weights.parent)
    print(f"loaded {count_parameters(gpt2):,} parameters from {weights.name}")
    ids = torch.tensor([enc.encode("The meaning of a transformer is")])
    with torch.no_grad():
        for _ in range(20):
            next_id = gpt2(ids[:, -gpt2.cfg.context_length:])[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
    print(enc.decode(ids[0].tolist()))

# %% [markdown]
# ## Summary
#
# * GPT-2 is a decoder-only stack: embeddings (token + **learned** position) → `L` pre-LN blocks (causal
#   attention with Q/K/V biases, a `4D` tanh-GELU feed-forward network) → a final LayerNorm → a head
#   **tied** to the token embedding.
# * Its parameters follow from the config (a formula you derive in the exercise); count a shared tensor
#   once. The `meta` device counts XL without memory.
# * Hugging Face stores the same model with fused Q/K/V and Conv1D layers in another layout. Prove a loader
#   with random weights in every tensor and a tight tolerance; a 1e-3 gap is a bug, not rounding.
#
# Unit 09 generates text from this model; unit 10 trains the `gpt2-char-tiny` preset on Shakespeare.
