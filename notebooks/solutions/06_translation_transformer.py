# %% [markdown]
# # Unit 06 — The encoder–decoder Transformer: exercises
#
# Five graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: other batches and pad ids, a comparison of your
# model with `torch.nn.Transformer` holding the same weights, the future-perturbation and
# padding-invariance probes, greedy decoding on the course's small trained model, and the chrF
# fixtures. When something fails it says what was expected and what came back, and, if your mistake
# is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/06_translation_transformer/06_translation_transformer.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on a
# variable defined elsewhere in the notebook. Conventions: masks are **boolean, `True` = may attend**;
# special ids `[PAD]=0, [SOS]=1, [EOS]=2, [UNK]=3`; padding is on the right.
#
# You may import the finished pieces of earlier units from `llmcourse` (they are imported below):
# `causal_mask` (unit 00), `InputEmbeddings` and `PositionalEncoding` (unit 02), `EncoderBlock`,
# `DecoderBlock`, `ProjectionLayer` and `LayerNorm` (unit 05).

# %%
import math
from collections import Counter

import torch
from torch import nn

import llmcourse
from llmcourse.nn import (
    DecoderBlock,
    EncoderBlock,
    InputEmbeddings,
    LayerNorm,
    PositionalEncoding,
    ProjectionLayer,
    causal_mask,
)

cfg = llmcourse.setup_notebook("06")

# %% [markdown]
# ## Exercise 1 — `make_src_mask` and `make_tgt_mask` (4 points)
#
# ```python
# make_src_mask(src, pad_id=0)     # (B, S) long -> (B, 1, 1, S) bool, True = real token
# make_tgt_mask(tgt_in, pad_id=0)  # (B, T) long -> (B, 1, T, T) bool = key padding & causal
# ```
#
# - The source mask is a **key** mask: it must broadcast over heads and queries, hence the two
#   singleton axes in the middle. It serves both the encoder's self-attention and the decoder's
#   cross-attention.
# - The target mask allows a key only if it is a real token of `tgt_in` **and** not in the future
#   (`causal_mask(T)`, unit 00).
#
# Example: `make_tgt_mask(torch.tensor([[1, 8, 9, 0]]))[0, 0]` has rows `[T,F,F,F]`,
# `[T,T,F,F]`, `[T,T,T,F]`, `[T,T,T,F]`. Note that no row is empty: the PAD query still sees SOS.

# %% tags=["solution:06.make_masks"]
def make_src_mask(src, pad_id=0):
    """(B, S) ids -> (B, 1, 1, S) bool, True where src is a real token."""
    ### BEGIN SOLUTION
    return (src != pad_id)[:, None, None, :]
    ### END SOLUTION


def make_tgt_mask(tgt_in, pad_id=0):
    """(B, T) ids -> (B, 1, T, T) bool: key padding & causal."""
    ### BEGIN SOLUTION
    t = tgt_in.shape[1]
    return make_src_mask(tgt_in, pad_id) & causal_mask(t, device=tgt_in.device)
    ### END SOLUTION


# %% tags=["tests:06.make_masks"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("06.make_masks")  # noqa: E702
### END HIDDEN TESTS
m = make_src_mask(torch.tensor([[5, 6, 7, 0, 0]]))
assert m.dtype == torch.bool, f"the mask must be bool, got {m.dtype}"
assert m.shape == (1, 1, 1, 5), f"a key mask has shape (B, 1, 1, S) = (1, 1, 1, 5), got {tuple(m.shape)}"
assert m.flatten().tolist() == [True, True, True, False, False], f"got {m.flatten().tolist()}"
tm = make_tgt_mask(torch.tensor([[1, 8, 9, 0]]))
assert tm.shape == (1, 1, 4, 4), f"the target mask has shape (B, 1, T, T) = (1, 1, 4, 4), got {tuple(tm.shape)}"
expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
assert torch.equal(tm[0, 0], expected), f"expected\n{expected.int()}\ngot\n{tm[0, 0].int()}"
assert tm.any(-1).all(), "every row must keep at least one key"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `make_translation_batch` (3 points)
#
# ```python
# make_translation_batch(pairs, max_len, pad_id=0, sos_id=1, eos_id=2) -> (src, tgt_in, tgt_out)
# ```
#
# `pairs` is a list of `(source ids, target ids)` lists without special tokens. For each pair:
#
# - source row: `x[:max_len]`;
# - with `y' = y[:max_len - 1]`: `tgt_in` row `[SOS] + y'` (what the decoder reads) and `tgt_out` row
#   `y' + [EOS]` (what it must predict, one step ahead: teacher forcing);
# - right-pad every row with `pad_id` to the longest row of its tensor. Return three `torch.long` tensors.
#
# Example: pairs `([5,6,7],[8,9])` and `([5],[8,9,10,11])`, `max_len=8` give
# `src = [[5,6,7],[5,0,0]]`, `tgt_in = [[1,8,9,0,0],[1,8,9,10,11]]`, `tgt_out = [[8,9,2,0,0],[8,9,10,11,2]]`.

# %% tags=["solution:06.make_translation_batch"]
def make_translation_batch(pairs, max_len, pad_id=0, sos_id=1, eos_id=2):
    """-> (src (B, S), tgt_in (B, T), tgt_out (B, T)), torch.long, right-padded."""
    ### BEGIN SOLUTION
    srcs, tins, touts = [], [], []
    for x, y in pairs:
        x, y = list(x)[:max_len], list(y)[:max_len - 1]
        srcs.append(x)
        tins.append([sos_id] + y)
        touts.append(y + [eos_id])

    def pad(rows):
        width = max(len(r) for r in rows)
        return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)

    return pad(srcs), pad(tins), pad(touts)
    ### END SOLUTION


# %% tags=["tests:06.make_translation_batch"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("06.make_translation_batch")  # noqa: E702
### END HIDDEN TESTS
src, tgt_in, tgt_out = make_translation_batch([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])], max_len=8)
assert src.tolist() == [[5, 6, 7], [5, 0, 0]], f"src: {src.tolist()}"
assert tgt_in.tolist() == [[1, 8, 9, 0, 0], [1, 8, 9, 10, 11]], f"tgt_in: {tgt_in.tolist()}"
assert tgt_out.tolist() == [[8, 9, 2, 0, 0], [8, 9, 10, 11, 2]], f"tgt_out: {tgt_out.tolist()}"
assert src.dtype == tgt_in.dtype == tgt_out.dtype == torch.long, "all three must be torch.long"
both = (tgt_in[:, 1:] != 0) & (tgt_out[:, :-1] != 0)
assert (tgt_in[:, 1:][both] == tgt_out[:, :-1][both]).all(), "tgt_in must be tgt_out shifted right by one"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `Transformer` (6 points)
#
# ```python
# Transformer(src_vocab, tgt_vocab, d_model=128, num_heads=4, d_ff=512, n_enc=2, n_dec=2, max_len=64,
#             dropout=0.1, norm_first=True, pad_id=0)
# ```
#
# Attributes (they fix the `state_dict` keys the grader loads):
#
# | attribute | module |
# |---|---|
# | `src_embed`, `tgt_embed` | `InputEmbeddings(vocab, d_model)` (embedding ×√D) |
# | `pos` | `PositionalEncoding(d_model, max_len, dropout)`, shared by both sides (a buffer only) |
# | `encoder.layers` | `nn.ModuleList` of `n_enc` × `EncoderBlock(d_model, num_heads, d_ff, dropout, norm_first)` |
# | `encoder.norm` | `LayerNorm(d_model)` **only if** `norm_first` (a pre-LN stack ends with a norm) |
# | `decoder.layers`, `decoder.norm` | the same with `n_dec` × `DecoderBlock` |
# | `projection` | `ProjectionLayer(d_model, tgt_vocab)` |
#
# Methods:
#
# - `encode(src, src_mask)`: `pos(src_embed(src))` through the encoder blocks (each gets `src_mask`),
#   then `encoder.norm` → memory `(B, S, D)`.
# - `decode(tgt_in, memory, src_mask, tgt_mask)`: `pos(tgt_embed(tgt_in))` through the decoder blocks
#   (unit 05's `DecoderBlock(x, memory, tgt_mask=..., memory_mask=...)`: which mask goes where is yours to
#   decide), then `decoder.norm` → `(B, T, D)`.
# - `forward(src, tgt_in)`: build both masks with your exercise-1 functions and `self.pad_id`, encode,
#   decode, project → logits `(B, T, tgt_vocab)`.
#
# Two small container modules `Encoder` / `Decoder` (each with `layers` and `norm`) give the right keys.
# Optional: initialise every parameter with `dim() > 1` by `nn.init.xavier_uniform_` (as
# `nn.Transformer` does); the grader loads its own weights into your model.

# %% tags=["solution:06.Transformer"]
class Encoder(nn.Module):
    def __init__(self, n_layers, d_model, num_heads, d_ff, dropout, norm_first):
        super().__init__()
        ### BEGIN SOLUTION
        self.layers = nn.ModuleList(EncoderBlock(d_model, num_heads, d_ff, dropout, norm_first)
                                    for _ in range(n_layers))
        self.norm = LayerNorm(d_model) if norm_first else None
        ### END SOLUTION

    def forward(self, x, mask):
        ### BEGIN SOLUTION
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x) if self.norm is not None else x
        ### END SOLUTION


class Decoder(nn.Module):
    def __init__(self, n_layers, d_model, num_heads, d_ff, dropout, norm_first):
        super().__init__()
        ### BEGIN SOLUTION
        self.layers = nn.ModuleList(DecoderBlock(d_model, num_heads, d_ff, dropout, norm_first)
                                    for _ in range(n_layers))
        self.norm = LayerNorm(d_model) if norm_first else None
        ### END SOLUTION

    def forward(self, x, memory, src_mask, tgt_mask):
        ### BEGIN SOLUTION
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=src_mask)
        return self.norm(x) if self.norm is not None else x
        ### END SOLUTION


class Transformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d_model=128, num_heads=4, d_ff=512, n_enc=2, n_dec=2, max_len=64,
                 dropout=0.1, norm_first=True, pad_id=0):
        super().__init__()
        ### BEGIN SOLUTION
        self.d_model, self.max_len, self.pad_id = d_model, max_len, pad_id
        self.src_embed = InputEmbeddings(src_vocab, d_model)
        self.tgt_embed = InputEmbeddings(tgt_vocab, d_model)
        self.pos = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(n_enc, d_model, num_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(n_dec, d_model, num_heads, d_ff, dropout, norm_first)
        self.projection = ProjectionLayer(d_model, tgt_vocab)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        ### END SOLUTION

    def encode(self, src, src_mask):
        ### BEGIN SOLUTION
        return self.encoder(self.pos(self.src_embed(src)), src_mask)
        ### END SOLUTION

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        ### BEGIN SOLUTION
        return self.decoder(self.pos(self.tgt_embed(tgt_in)), memory, src_mask, tgt_mask)
        ### END SOLUTION

    def forward(self, src, tgt_in):
        ### BEGIN SOLUTION
        src_mask = make_src_mask(src, self.pad_id)
        memory = self.encode(src, src_mask)
        return self.projection(self.decode(tgt_in, memory, src_mask, make_tgt_mask(tgt_in, self.pad_id)))
        ### END SOLUTION


# %% tags=["tests:06.Transformer"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("06.Transformer")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
model = Transformer(30, 40, d_model=32, num_heads=4, d_ff=64, max_len=16, dropout=0.0).eval()
keys = set(model.state_dict())
for k in ("src_embed.embedding.weight", "tgt_embed.embedding.weight", "encoder.norm.weight", "decoder.norm.bias",
          "encoder.layers.1.self_attn.W_query.weight", "decoder.layers.0.cross_attn.W_key.weight",
          "projection.proj.weight"):
    assert k in keys, f"state_dict key {k!r} is missing"
assert not any(k.startswith("pos") for k in keys), "pos holds only a non-persistent buffer"
src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 0, 0, 0]])
tgt = torch.tensor([[1, 11, 12, 13], [1, 14, 15, 0]])
logits = model(src, tgt)
assert logits.shape == (2, 4, 40), f"expected logits (B, T, tgt_vocab) = (2, 4, 40), got {tuple(logits.shape)}"
changed = tgt.clone()
changed[:, 2:] = 20
assert torch.allclose(model(src, changed)[:, :2], logits[:, :2], atol=1e-5), "future target tokens changed the past"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `greedy_translate` (4 points)
#
# ```python
# @torch.no_grad()
# greedy_translate(model, src, max_len, sos_id=1, eos_id=2, pad_id=0) -> (B, L) long
# ```
#
# - Each generated token is the argmax of the model's next-token logits (`model.projection` of the
#   decoder output) given `[SOS]` and the tokens generated before it; the source is encoded **once**.
# - A row ends at its first EOS (included); afterwards it holds `pad_id`. Generation stops when every row
#   has ended or after `max_len` generated tokens.
# - Returns the generated tokens **without** `[SOS]`: `(B, L)` long, `L ≤ max_len`.
# - Dropout never makes a translation random (eval mode), and the model is left in the mode it was in.

# %% tags=["solution:06.greedy_translate"]
@torch.no_grad()
def greedy_translate(model, src, max_len, sos_id=1, eos_id=2, pad_id=0):
    """Greedy decoding; returns the tokens after SOS, each row ending at its first EOS, then pad_id."""
    ### BEGIN SOLUTION
    was_training = model.training
    model.eval()
    src_mask = make_src_mask(src, pad_id)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.shape[0], 1), sos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        hidden = model.decode(ys, memory, src_mask, make_tgt_mask(ys, pad_id))
        nxt = model.projection(hidden[:, -1]).argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done = done | (nxt == eos_id)
        if done.all():
            break
    model.train(was_training)
    return ys[:, 1:]
    ### END SOLUTION


# %% tags=["tests:06.greedy_translate"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("06.greedy_translate")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
toy = Transformer(30, 40, d_model=32, num_heads=4, d_ff=64, max_len=16, dropout=0.3)
with torch.no_grad():
    toy.projection.proj.bias[2] += 2.0          # make EOS likely, so that some rows stop early
toy.train()
src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 0, 0, 0]])
out = greedy_translate(toy, src, max_len=8)
assert out.dtype == torch.long and out.shape[0] == 2 and out.shape[1] <= 8, f"got {out.dtype}, {tuple(out.shape)}"
assert torch.equal(out, greedy_translate(toy, src, max_len=8)), "two calls differ: is dropout still on?"
assert toy.training, "the model was in train mode and must be restored to it"
for row in out.tolist():
    if 2 in row:
        assert all(x == 0 for x in row[row.index(2) + 1:]), f"a row continues after EOS: {row}"
print(out)
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `chrf` (3 points)
#
# ```python
# chrf(hypotheses, references, n=6, beta=2.0) -> float in [0, 100]
# ```
#
# Corpus-level character n-gram F-score:
#
# 1. Remove **all** whitespace from every string.
# 2. For k = 1…n, sum over all sentence pairs: the clipped matches `Σ_g min(H_k[g], R_k[g])` (`H_k`, `R_k`
#    are the k-gram counts of the hypothesis and the reference; `collections.Counter` helps), the number of
#    hypothesis k-grams and the number of reference k-grams.
# 3. Skip orders where both counts are 0. Otherwise `P_k = matches / hyp_count` (0 if no hypothesis
#    k-grams) and `R_k = matches / ref_count` (0 if none).
# 4. `P`, `R` = the means of the `P_k` and `R_k`; `chrF = 100·(1+β²)·P·R / (β²·P + R)` (0 if `P + R = 0`, and
#    0 when every order was skipped: empty strings).
#
# Sum the statistics over the corpus **before** dividing; averaging sentence scores gives a different number.
#
# Examples: `chrf(["the cat sat"], ["the cat sat on the mat"])` = 49.5935; the reverse = 79.7386;
# `chrf(["the cat", "a dog"], ["the cat", "the dog"])` = 63.8322.

# %% tags=["solution:06.chrf"]
def chrf(hypotheses, references, n=6, beta=2.0):
    """Corpus chrF (0-100), whitespace removed, statistics summed over the corpus."""
    ### BEGIN SOLUTION
    totals = [[0, 0, 0] for _ in range(n)]
    for hyp, ref in zip(hypotheses, references):
        hyp, ref = "".join(hyp.split()), "".join(ref.split())
        for k in range(1, n + 1):
            h = Counter(hyp[i:i + k] for i in range(len(hyp) - k + 1))
            r = Counter(ref[i:i + k] for i in range(len(ref) - k + 1))
            totals[k - 1][0] += sum(min(c, r[g]) for g, c in h.items())
            totals[k - 1][1] += sum(h.values())
            totals[k - 1][2] += sum(r.values())
    ps, rs = [], []
    for matches, hyp_count, ref_count in totals:
        if hyp_count == 0 and ref_count == 0:
            continue
        ps.append(matches / hyp_count if hyp_count else 0.0)
        rs.append(matches / ref_count if ref_count else 0.0)
    if not ps:
        return 0.0
    p, r = sum(ps) / len(ps), sum(rs) / len(rs)
    if p + r == 0:
        return 0.0
    return 100.0 * (1 + beta ** 2) * p * r / (beta ** 2 * p + r)
    ### END SOLUTION


# %% tags=["tests:06.chrf"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("06.chrf")  # noqa: E702
### END HIDDEN TESTS
assert abs(chrf(["the cat sat"], ["the cat sat"]) - 100.0) < 1e-6, "identical sentences must score 100"
assert abs(chrf(["the cat sat"], ["the cat sat on the mat"]) - 49.5935) < 1e-4, \
    f"expected 49.5935, got {chrf(['the cat sat'], ['the cat sat on the mat']):.4f}"
assert abs(chrf(["a b"], ["ab"]) - 100.0) < 1e-6, "chrF ignores whitespace"
two = chrf(["the cat", "a dog"], ["the cat", "the dog"])
assert abs(two - 63.8322) < 1e-4, f"two sentences: expected 63.8322, got {two:.4f}; sum statistics first"
print("visible tests passed")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
# The lesson trains this model on English→Hindi pairs, decodes with
# `greedy_translate`, scores with `chrf` and draws the cross-attention alignments.
