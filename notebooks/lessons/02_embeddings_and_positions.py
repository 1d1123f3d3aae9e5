# %% [markdown]
# # Unit 02 — Embeddings and positional encodings
#
# A language model reads **token ids**: integers such as `3797` for `" cat"` (unit 01). Before any
# attention layer can work, each id has to become a vector of `d_model` numbers, and the model has to learn
# *where* in the sequence each token sits. This unit builds both pieces.
#
# By the end you will be able to:
#
# 1. explain why one-hot vectors carry no notion of similarity, and how trained word vectors get one (the lab);
# 2. show that an embedding layer is a table lookup, equal to `one_hot(ids) @ W`, and that its gradient
#    touches only the rows that were used;
# 3. build the Transformer's input embedding with its `×√d_model` scale, and say why GPT-2 has none;
# 4. derive the **sinusoidal positional encoding** from a list of requirements, including the property
#    that moving from position `p` to `p + k` is one fixed rotation `M_k` in every pair of dimensions;
# 5. build GPT-2's **learned** position embeddings and explain their context-length limit.
#
# Vocabulary used throughout: an *embedding* is a learned lookup table; a *positional encoding* is a fixed
# (computed) table; a *positional embedding* is a learned one. Shapes follow the course convention:
# ids `(B, T)`, activations `(B, T, D)` with `D = d_model`.
#
# The exercises of this unit are in `exercises/02_embeddings_and_positions/02_embeddings_and_positions.ipynb`.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.nn import (
    GPTEmbedding,
    InputEmbeddings,
    PositionalEncoding,
    embedding_lookup,
    inverse_frequencies,
    one_hot_matmul,
    shift_matrix,
    sinusoidal_pe,
)
from llmcourse.viz import (
    show_candidate_comparison,
    show_frequency_explorer,
    show_pe_heatmap,
    show_position_similarity,
    show_shift_rotation,
)
from llmcourse.viz.positions import candidate_encodings, position_similarity, sinusoidal_pe_float64

cfg = llmcourse.setup_notebook("02")
enc = llmcourse.gpt2_encoding()
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. From ids to vectors
#
# The GPT-2 tokenizer turns text into ids. An id is just a row number in a vocabulary of 50,257 entries:
# id 3797 is not "closer" to 3798 than to 12, and nothing about the number says what the token means.

# %%
sentence = "the cat chased the mouse"
ids = enc.encode(sentence)
print(ids, [enc.decode([i]) for i in ids])
cat, dog, the = enc.encode(" cat")[0], enc.encode(" dog")[0], enc.encode(" the")[0]
print(f"' cat' = {cat}, ' dog' = {dog}, ' the' = {the}; vocabulary size {enc.n_vocab:,}")

# %% [markdown]
# The simplest vector for an id is its **one-hot** vector: 50,257 zeros with a single 1 at the id's position.
# One-hot vectors are all orthogonal, so the cosine similarity of any two different tokens is exactly 0:
# `" cat"` is as far from `" dog"` as from `" the"`. They also waste memory: one float per vocabulary entry.

# %%
one_hot = F.one_hot(torch.tensor([cat, dog, the]), num_classes=enc.n_vocab).float()
cosine = F.normalize(one_hot, dim=-1) @ F.normalize(one_hot, dim=-1).T
print("cosine similarities of ' cat', ' dog', ' the' as one-hot vectors:\n", cosine)
assert torch.equal(cosine, torch.eye(3)), "distinct one-hot vectors are orthogonal"

# %% [markdown]
# Instead, a model keeps a **table** of shape `(V, D)` and gives each token its own row of `D` learned
# numbers, with `D` in the hundreds or thousands instead of 50,257. The table is not free. GPT-3 uses
# `D = 12,288`; how many parameters does its token table alone hold?

# %%
V_gpt3, D_gpt3 = 50_257, 12_288
n_params = V_gpt3 * D_gpt3
n_bytes = 4 * n_params  # float32
print(f"GPT-3 token table: {V_gpt3:,} × {D_gpt3:,} = {n_params:,} parameters "
      f"= {n_bytes / 1e9:.2f} GB = {n_bytes / 2**30:.2f} GiB in float32")
assert n_params == 617_558_016
assert round(n_bytes / 1e9, 2) == 2.47 and round(n_bytes / 2**30, 2) == 2.30

# %% [markdown]
# ### 1.1 The distributional idea: similar contexts, similar vectors
#
# What should the rows contain? The classic answer (Harris, 1954; Firth, 1957) is *distributional*: a word is
# characterised by the words around it. If we train vectors so that a word's vector predicts its neighbours,
# words used in similar contexts (`he`/`she`, `day`/`night`) end up with similar vectors. Inside a transformer
# the table is trained by the language-modelling loss instead, but the effect is similar.
#
# The lab notebook of this unit, `lessons/02_embeddings_and_positions_lab.ipynb`, trains such vectors from
# scratch: a tiny **skip-gram model with negative sampling** (Mikolov et al., 2013) on Tiny Shakespeare, in
# seconds. Run it after this lesson: it prints the nearest neighbours of a few words,
# compares related pairs (`he`/`she`, `king`/`queen`) with random pairs, and draws a 2-D picture of the vectors.
# Nobody tells that model that "thou" is a pronoun; it only sees which words occur near which.

# %% [markdown]
# ## 2. An embedding layer is a lookup, and a one-hot product
#
# `nn.Embedding(V, D)` stores a `(V, D)` weight and returns rows of it. With a seed, its weight is exactly a
# `torch.randn(V, D)` draw:

# %%
torch.manual_seed(123)
emb = nn.Embedding(5, 3)
torch.manual_seed(123)
same_draw = torch.randn(5, 3)
print(emb.weight.data)
assert torch.equal(emb.weight.data, same_draw)
assert torch.allclose(emb.weight[0], torch.tensor([-0.1115, 0.1204, -0.3696]), atol=1e-4)

ids = torch.tensor([0, 1])
print("emb([0, 1]) =\n", emb(ids))
assert torch.equal(emb(ids), emb.weight[ids])

# %% [markdown]
# The lookup `W[ids]` equals the product of the one-hot matrix with the table: row `r` of `one_hot(ids)` has a
# single 1, in column `ids[r]`, so the product copies that row of `W`. The library's
# `llmcourse.nn.embedding_lookup` and `one_hot_matmul` (exercise 1) are these two forms, for `ids` of any shape.

# %%
batch_ids = torch.tensor([[0, 4, 4], [2, 1, 0]])                          # (B=2, T=3)
as_lookup = emb.weight[batch_ids]                                          # (2, 3, 3)
as_product = F.one_hot(batch_ids, num_classes=5).float() @ emb.weight      # (2, 3, 5) @ (5, 3) -> (2, 3, 3)
print("shapes:", tuple(batch_ids.shape), "->", tuple(as_lookup.shape))
assert torch.allclose(as_lookup, as_product)
assert torch.allclose(embedding_lookup(batch_ids, emb.weight), emb(batch_ids))
assert torch.allclose(one_hot_matmul(batch_ids, emb.weight), emb(batch_ids))

# %% [markdown]
# Both give the same numbers, but not at the same price: the product performs `V·D` multiply-adds per token
# (mostly multiplications by zero), the lookup copies `D` numbers. For GPT-3's table that is as many
# multiply-adds per token as the table has parameters (the count printed in section 1) against `D` copies.
# Frameworks therefore index.
#
# **Gradient sparsity.** Because the output is a copy of some rows, the gradient reaches only those rows. For
# `loss = out.sum()`, every entry of a used row receives 1 per occurrence; rows that were not used get 0.

# %%
w = emb.weight.detach().clone().requires_grad_(True)
out = F.embedding(batch_ids, w)
out.sum().backward()
print("ids:", batch_ids.tolist())
print("weight.grad =\n", w.grad)
counts_per_row = torch.bincount(batch_ids.flatten(), minlength=5).float()
assert torch.equal(w.grad, counts_per_row[:, None].expand(5, 3)), "grad of row r = count(r)"
assert torch.equal(w.grad[3], torch.zeros(3)), "row 3 was never used"

# %% [markdown]
# Row 4 appears twice, so its gradient is 2; row 3 never appears, so it stays 0. With a real vocabulary most
# rows get no gradient in a given batch (`nn.Embedding(..., sparse=True)` can even store it sparsely). Rare
# tokens are therefore updated rarely, one reason why their vectors stay poor.
#
# ## 3. The input embedding of the Transformer: `× √d_model`
#
# The original Transformer multiplies the looked-up rows by `√d_model` (Vaswani et al., 2017, §3.4). The
# library version is `llmcourse.nn.InputEmbeddings` (exercise 2). Its shapes:
#
# | step | shape |
# |---|---|
# | token ids | `(B, T)`, long |
# | `embedding(ids)` | `(B, T, D)`, float32 |
# | `× √D` | `(B, T, D)` |

# %%
torch.manual_seed(0)
tok = InputEmbeddings(vocab_size=50_257, d_model=16)
x_ids = torch.tensor([enc.encode("the cat chased the mouse"), enc.encode("the mouse chased the cat")])
x = tok(x_ids)
print(tuple(x_ids.shape), x_ids.dtype, "->", tuple(x.shape), x.dtype)
assert torch.allclose(x, tok.embedding(x_ids) * 4.0)  # √16 = 4

# %% [markdown]
# Why scale? The paper does not say. A common reading: the authors' code (tensor2tensor) initialises the table
# with standard deviation `D^−½`, so a row has entries of RMS `D^−½`, tiny next to the sinusoidal encoding that
# is added next, whose entries have RMS exactly `1/√2` (each sine/cosine pair has `sin² + cos² = 1`). The scale
# brings the tokens back to RMS 1. With PyTorch's default `N(0, 1)` initialisation the same scale would do the
# opposite and drown the positions, so the scale only makes sense together with its initialisation.

# %%
D = 512
small_init = InputEmbeddings(1000, D)
nn.init.normal_(small_init.embedding.weight, std=D ** -0.5)
some_ids = torch.arange(1000)
rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
pe_512 = sinusoidal_pe(1000, D)
print(f"token rows, std D^-1/2 init: RMS {rms(small_init.embedding(some_ids)):.3f} unscaled, "
      f"{rms(small_init(some_ids)):.3f} after × √D")
print(f"sinusoidal encoding: RMS {rms(pe_512):.4f} (1/√2 = {1 / math.sqrt(2):.4f})")
default_init = InputEmbeddings(1000, D)
print(f"PyTorch's default N(0, 1) init: RMS {rms(default_init(some_ids)):.1f} after × √D")
assert abs(rms(pe_512) - 1 / math.sqrt(2)) < 1e-5
assert abs(rms(small_init(some_ids)) - 1.0) < 0.02

# %% [markdown]
# **GPT-2 has no such scale.** It learns its positions (section 9) and initialises both tables with small random
# values of similar size (standard deviation 0.02 or less), so tokens and positions start on the same footing and
# are trained together, without any factor.
#
# ### Weight tying, and a common explanation of `× √d_model`
#
# A language model ends with a linear layer that turns each hidden vector `h` (size `D`) into one score per
# vocabulary entry: `logits = h Wᵀ` with a `(V, D)` matrix `W`, the same shape as the embedding table. **Weight
# tying** (Press and Wolf, 2017; Inan et al., 2017) uses one matrix for both: the row of a token is its input
# vector *and* the vector its output score is measured against. It saves `V·D` parameters (a third of GPT-2
# small), and GPT-2 ties its tables; unit 06 offers it as an option for the translation model. In PyTorch,
# tying is assigning the **same `Parameter`** to both modules:

# %%
V_tie, D_tie = 1000, 64
tied_emb = InputEmbeddings(V_tie, D_tie)
lm_head = nn.Linear(D_tie, V_tie, bias=False)
lm_head.weight = tied_emb.embedding.weight               # one Parameter, two uses
model_params = {id(p_): p_ for m in (tied_emb, lm_head) for p_ in m.parameters()}
print(f"separate tables: {2 * V_tie * D_tie:,} parameters; tied: {sum(p_.numel() for p_ in model_params.values()):,}")
h_tie = torch.randn(3, D_tie)
(lm_head(h_tie).sum() + tied_emb(torch.tensor([5, 7])).sum()).backward()
used_rows = (tied_emb.embedding.weight.grad.abs().sum(-1) > 0).sum().item()
print(f"rows with a gradient: {used_rows} of {V_tie} (the output layer reaches every row)")
assert lm_head.weight is tied_emb.embedding.weight and used_rows == V_tie
gpt2_saved = 50_257 * 768
print(f"GPT-2 small saves {gpt2_saved:,} parameters by tying ({gpt2_saved / 124_439_808:.0%} of its 124,439,808)")

# %% [markdown]
# The original Transformer ties its two embedding tables and the output layer, and multiplies the embeddings
# by `√d_model`, in the same section (§3.4), without giving a reason for the factor. A **common explanation**
# (not stated in the paper) links the two: a table that also serves as the output layer should be initialised
# small, about `N(0, 1/D)`, so that the logits `h·w` of a hidden vector with entries of size 1 start with a
# standard deviation near 1. Such rows are tiny as *inputs* (RMS `D^−½`), and `× √D` brings them back to RMS
# 1. With PyTorch's default `N(0, 1)` table, the logits would start `√D` times too large and the softmax
# saturated. Measured for `D = 512`:

# %%
D_s, V_s = 512, 2000
h_unit = torch.randn(256, D_s, generator=torch.Generator().manual_seed(0))   # hidden states, entries of size 1
for name, std in [("N(0, 1/D)", D_s ** -0.5), ("N(0, 1)", 1.0)]:
    table = torch.randn(V_s, D_s, generator=torch.Generator().manual_seed(1)) * std
    logits = h_unit @ table.T
    top_p = logits.softmax(-1).max(-1).values.mean().item()
    print(f"table {name:9}: logit std {logits.std().item():6.2f}, mean top probability {top_p:.3f} "
          f"(uniform: {1 / V_s:.4f}); input rows RMS {rms(table):.3f} raw, {rms(table * math.sqrt(D_s)):.2f} × √D")
small_table = torch.randn(V_s, D_s, generator=torch.Generator().manual_seed(1)) * D_s ** -0.5
assert abs((h_unit @ small_table.T).std().item() - 1) < 0.05 and abs(rms(small_table * math.sqrt(D_s)) - 1) < 0.02

# %% [markdown]
# ## 4. Attention is blind to order
#
# Unit 03 builds self-attention. A preview is enough to see the problem: in its simplest form, each output is a
# weighted average of all token vectors, with weights from dot products. Nothing in that computation knows
# which token came first. Compare "the cat chased the mouse" with "the mouse chased the cat": the two sentences
# contain the same tokens, so every token gets exactly the same output vector in both.

# %%
def bare_attention(x):
    """softmax(x xᵀ/√D) x for x (T, D): attention without weights or positions (a preview of unit 03)."""
    weights = torch.softmax(x @ x.T / math.sqrt(x.shape[-1]), dim=-1)
    return weights @ x


with torch.no_grad():
    out_a, out_b = bare_attention(x[0]), bare_attention(x[1])
tokens_a = [enc.decode([i]) for i in x_ids[0].tolist()]
tokens_b = [enc.decode([i]) for i in x_ids[1].tolist()]
i_cat_a, i_cat_b = tokens_a.index(" cat"), tokens_b.index(" cat")
print(f"' cat' is token {i_cat_a} in sentence A and token {i_cat_b} in sentence B")
print("max |difference| of the outputs for ' cat':", (out_a[i_cat_a] - out_b[i_cat_b]).abs().max().item())
assert torch.allclose(out_a[i_cat_a], out_b[i_cat_b], atol=1e-6), "no positions: identical outputs"
assert torch.allclose(out_a.mean(0), out_b.mean(0), atol=1e-6), "and identical sentence averages"

# %% [markdown]
# The model cannot tell who chased whom. Adding a vector that depends on the **position** fixes this: the same
# token at a different position becomes a different input.

# %%
pos16 = sinusoidal_pe(5, 16)
with torch.no_grad():
    out_a, out_b = bare_attention(x[0] + pos16), bare_attention(x[1] + pos16)
diff = (out_a[i_cat_a] - out_b[i_cat_b]).abs().max().item()
print(f"with positions: max |difference| for ' cat' = {diff:.3f}")
assert diff > 0.1

# %% [markdown]
# ## 5. What should a position code satisfy?
#
# Before writing a formula, list what we want from the vector `PE(p)` that is added to the token at position `p`:
#
# - **R1** — unique per position, and **independent of the sequence length**: position 5 gets the same code in
#   a 10-token and in a 1,000-token sequence.
# - **R2** — a shift is a **linear map**: for each offset `k` one matrix takes `PE(p)` to `PE(p + k)`, whatever `p`
#   is. Then "the token 3 places back" is something a linear layer (such as a query or key projection) can
#   express once, for all positions.
# - **R3** — extends to longer sequences, with values in the range seen during training (no new magnitudes).
# - **R4** — simple and deterministic: no parameters, the same values every time.
# - **R5** — works for any (even) `d_model`.
#
# ## 6. Candidates that fail
#
# **Integer positions**, `PE(p) = p` in every dimension. Unique, but the values grow without bound. Token vectors
# have entries of size about 1; at position 1,000 the position would be a thousand times larger and drown the
# token. A network would also meet larger values than it was trained on as soon as a sequence gets longer.

# %%
token_rms = rms(small_init(some_ids))
for p in [1, 10, 100, 1000]:
    print(f"position {p:5d}: |PE| / |token| = {p / token_rms:8.1f}")

# %% [markdown]
# **Length-normalised positions**, `PE(p) = p/(N−1)` for a sequence of `N` tokens. Bounded, but the code of a
# position depends on the length of the sequence (R1 fails): the same fifth token gets two different codes.

# %%
in_10, in_20 = 5 / (10 - 1), 5 / (20 - 1)
print(f"position 5 in a 10-token sequence: {in_10:.3f}; in a 20-token sequence: {in_20:.3f}")
assert in_10 != in_20

# %% [markdown]
# **Binary codes**: dimension `j` holds bit `j` of `p`. Bounded (0 or 1) and unique, but jumpy: neighbours can
# differ in many bits at once, and no single matrix maps the code of `p` to that of `p + 1`:

# %%
codes = {p: format(p, "08b") for p in range(64, 76)}
for p, c in codes.items():
    print(p, c)
flips = [sum(a != b for a, b in zip(codes[p], codes[p + 1])) for p in range(64, 75)]
print("bits flipped from p to p+1:", flips)
assert codes[64] == "01000000" and codes[75] == "01001011"
assert all(codes[p][-1] != codes[p + 1][-1] for p in range(64, 75)), "the least significant bit flips every step"
assert len({format(p, "08b")[0] for p in range(128)}) == 1, "the most significant bit is constant for 128 positions"
assert flips[67 - 64] == 3, "67 -> 68 flips three bits at once"

# %% [markdown]
# **Sine without cosine**, `PE(p)_j = sin(p·ω_j)` with one frequency per dimension. Smooth and bounded, but R2
# fails: `sin(ω(p+k)) = sin ωp · cos ωk + cos ωp · sin ωk` needs `cos ωp`, which the code does not contain. We
# can measure it: fit the best single matrix `A` with `PE(p+1) ≈ PE(p) A` over all positions by least squares,
# with and without the cosine partners.

# %%
def best_linear_shift_error(code, k=1):
    """Relative error of the best single matrix A with code[p+k] ≈ code[p] @ A for every p."""
    a = torch.linalg.lstsq(code[:-k], code[k:], driver="gelsd").solution
    return ((code[:-k] @ a - code[k:]).norm() / code[k:].norm()).item()


cands = candidate_encodings(64, 16)
for name in ["integer", "binary", "sine only", "sinusoidal"]:
    print(f"{name:>10}: relative error of the best linear shift map = {best_linear_shift_error(cands[name]):.2e}")
assert best_linear_shift_error(cands["sine only"]) > 0.1
assert best_linear_shift_error(cands["sinusoidal"]) < 1e-10

# %% [markdown]
# The widget below tests R1–R5 numerically for every candidate and shows its heatmap. Only the last one,
# the sinusoidal encoding with sine *and* cosine, passes everything. (The integer code fails R2 in a subtler
# way: `p ↦ p + k` adds a constant, which a matrix alone cannot do, since it maps the zero vector of position 0
# to zero.)

# %% tags=["nbval-ignore-output"]
show_candidate_comparison()

# %% [markdown]
# ## 7. The sinusoidal positional encoding
#
# The Transformer's answer (Vaswani et al., 2017, §3.5) gives every pair of dimensions `(2i, 2i+1)` one
# frequency `ω_i` and stores the sine and the cosine of `p·ω_i`:
#
# $$PE[p, 2i] = \sin(p\,\omega_i), \qquad PE[p, 2i+1] = \cos(p\,\omega_i), \qquad \omega_i = 10000^{-2i/D}$$
#
# Sines go in the **even** dimensions and cosines in the **odd** ones (interleaved; some code puts all sines in
# the first half instead, which is a different layout). Writing the table as one tensor computation is
# exercise 3; here we use the course's `sinusoidal_pe(max_len, d_model)` and check it entry by entry against the
# formula, with Python's `math.sin` and `math.cos`:

# %%
print("inverse frequencies for D = 4:", inverse_frequencies(4).tolist())
print("sinusoidal_pe(4, 4) =\n", sinusoidal_pe(4, 4))
print("sinusoidal_pe(6, 16)[1] =\n", sinusoidal_pe(6, 16)[1])
PE_4_BY_4 = torch.tensor([[0, 1, 0, 1], [0.8415, 0.5403, 0.0100, 0.99995], [0.9093, -0.4161, 0.0200, 0.9998],
                      [0.1411, -0.9900, 0.0300, 0.99955]])
PE_ROW_1_D16 = torch.tensor([0.8415, 0.5403, 0.3110, 0.9504, 0.0998, 0.9950, 0.0316, 0.9995, 0.0100, 0.99995, 0.0032,
                      1.0000, 0.0010, 1.0000, 0.0003, 1.0000])
assert torch.allclose(sinusoidal_pe(4, 4), PE_4_BY_4, atol=1e-4)
assert torch.allclose(sinusoidal_pe(6, 16)[1], PE_ROW_1_D16, atol=1e-4)
table_50 = sinusoidal_pe(50, 32)
by_formula = [(math.sin(p_ * 10000 ** (-2 * i / 32)), math.cos(p_ * 10000 ** (-2 * i / 32)))
              for p_ in range(50) for i in range(16)]
assert torch.allclose(table_50.view(50, 16, 2), torch.tensor(by_formula).view(50, 16, 2), atol=1e-6)

# %% [markdown]
# **Wavelengths.** Pair `i` repeats every `λ_i = 2π/ω_i = 2π·10000^{2i/D}` positions. The wavelengths form a
# geometric sequence from `2π ≈ 6.28` (pair 0) up to just under `2π·10000 ≈ 62,832`; consecutive ones differ by
# the factor `10000^{2/D}`. They do **not** run "from 1 to 10000", a claim some write-ups make.

# %%
for d_model in [512, 768]:
    lam = 2 * math.pi / inverse_frequencies(d_model)
    ratio = (lam[1:] / lam[:-1]).unique()
    print(f"D={d_model}: wavelengths from {lam[0]:.4f} to {lam[-1]:,.1f} positions; "
          f"ratio of consecutive ones {ratio.mean():.6f}")
ratio_512 = 10000 ** (2 / 512)
assert round(ratio_512, 6) == 1.036633
assert abs(2 * math.pi / inverse_frequencies(512)[0] - 2 * math.pi) < 1e-12

# %% [markdown]
# ### Spot the bug 1: "the wavelengths go from 1 to 10000"
#
# The snippet below computes the wavelengths as `10000^{2i/D}` (no `2π`). A wavelength must be a period: after
# `λ` positions, sine and cosine return to their values. Run it and look at the property it prints.

# %%
def claimed_wavelengths(d_model):
    return 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)   # buggy: 2π missing


def is_period(lam, omega, p=3.0):
    """sin and cos of pair ω take the same values at p and p + λ."""
    return abs(math.sin(omega * (p + lam)) - math.sin(omega * p)) < 1e-9 and \
        abs(math.cos(omega * (p + lam)) - math.cos(omega * p)) < 1e-9


omega_64 = inverse_frequencies(64)
print("claimed λ_0 =", claimed_wavelengths(64)[0].item(), "is a period of pair 0:",
      is_period(claimed_wavelengths(64)[0].item(), omega_64[0].item()))

# %% [markdown]
# It is not: after 1 position pair 0 has turned by 1 radian, not by a full turn. **Your turn:** fix
# `wavelengths` so that `λ_i` is the period of pair `i`; the self-check tests every pair for `D = 64`.

# %%
def wavelengths(d_model):
    # TODO: the number of positions after which pair i returns to its values
    return 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)


def self_check_wavelengths(fn):
    bad = [i for i, (lam, om) in enumerate(zip(fn(64).tolist(), omega_64.tolist())) if not is_period(lam, om)]
    print("✓ every λ_i is a period of its pair" if not bad else
          f"✗ not yet: {len(bad)} of {len(omega_64)} wavelengths are not periods (first: pair {bad[0]})")
    return not bad


self_check_wavelengths(wavelengths)

# %% jupyter={"source_hidden": true}
# Reference fix: a full turn is 2π radians, so λ_i = 2π / ω_i = 2π · 10000^(2i/D).
def wavelengths_reference(d_model):
    return 2 * math.pi / inverse_frequencies(d_model).double()


assert self_check_wavelengths(wavelengths_reference)

# %% [markdown]
# The heatmap shows the whole table: fast pairs on the left change at every position, slow pairs on the
# right barely move over 100 positions. The curves underneath are single columns of the table.

# %% tags=["nbval-ignore-output"]
show_pe_heatmap()

# %% [markdown]
# **Fast and slow dimensions.** Take GPT-2's sizes, `D = 768` over 1,024 positions, purely as an example
# (GPT-2 itself does not use this table; see section 9). The table counts how many turns each pair makes over
# the range: pair 0 turns many times, pair 250 less than once, yet even it is far from constant:

# %%
print(f"{'pair':>5} {'period':>9} {'cycles in 1024':>15}")
for i in [0, 1, 50, 150, 250]:
    period = 2 * math.pi * 10000 ** (2 * i / 768)
    print(f"{i:5d} {period:9.2f} {1024 / period:15.2f}")
omega_250 = 10000 ** (-500 / 768)
s_1023, c_1023 = math.sin(1023 * omega_250), math.cos(1023 * omega_250)
print(f"pair 250 at position 1023: sin = {s_1023:.3f}, cos = {c_1023:.3f}")
cycles_150 = 1024 / (2 * math.pi * 10000 ** (300 / 768))
print(f"so pair 150 makes {cycles_150:.2f} cycles, and pair 250's cosine falls to {c_1023:.2f}")
assert round(1024 / (2 * math.pi * 10000 ** (300 / 768)), 2) == 4.46
assert round(s_1023, 3) == 0.562 and round(c_1023, 3) == -0.827

# %% [markdown]
# Two claims you may read elsewhere are therefore wrong for these sizes (the last line above gives the true
# values): "pair 150 makes 2–3 cycles", and "pair 250 barely moves, its cosine stays near 1". Explore any pair
# with the frequency explorer:

# %% tags=["nbval-ignore-output"]
show_frequency_explorer()

# %% [markdown]
# ### The shift is a rotation
#
# Here is the property that makes the sine–cosine pairs worth their cost. Write pair `i` at position `p` as the
# column `(sin ωp, cos ωp)ᵀ`, a point on the unit circle. The angle-addition formulas give
#
# $$\begin{pmatrix}\sin \omega(p+k) \\ \cos \omega(p+k)\end{pmatrix}
#  = \begin{pmatrix}\sin\omega p\cos\omega k + \cos\omega p\sin\omega k \\ \cos\omega p\cos\omega k - \sin\omega p\sin\omega k\end{pmatrix}
#  = \underbrace{\begin{pmatrix}\cos\omega k & \sin\omega k \\ -\sin\omega k & \cos\omega k\end{pmatrix}}_{M_k}
#    \begin{pmatrix}\sin\omega p \\ \cos\omega p\end{pmatrix}$$
#
# `M_k` is a rotation by the angle `ωk`. It depends on the offset `k` and the pair's frequency, **never on `p`**.
# That is requirement R2, pair by pair. `llmcourse.nn.shift_matrix(k, omega)` builds it (exercise 5). We verify the
# identity for **every** position, **every** pair and several offsets in float64:

# %%
N, D = 2048, 512
table64 = sinusoidal_pe_float64(N, D).view(N, D // 2, 2)          # (position, pair, [sin, cos])
omega = inverse_frequencies(D)
n_checked, worst = 0, 0.0
for k in [1, 7, 100, 1000]:
    M = torch.stack([shift_matrix(k, w, dtype=torch.float64) for w in omega.tolist()])  # (D/2, 2, 2)
    rotated = torch.einsum("iab,pib->pia", M, table64[:-k])                               # M_k · PE(p), all p, i
    err = (rotated - table64[k:]).abs().max().item()
    n_checked += table64[:-k].shape[0] * table64.shape[1]
    worst = max(worst, err)
    print(f"k={k:5d}: max |M_k·PE[p, 2i:2i+2] − PE[p+k, 2i:2i+2]| over all {N - k} positions and {D // 2} pairs "
          f"= {err:.1e}")
print(f"{n_checked:,} (position, pair) checks, worst error {worst:.1e}")
assert worst < 1e-11

# %% [markdown]
# Stacking the `D/2` rotations on the diagonal gives one `D × D` matrix that shifts the whole vector. With the
# course's row-vector convention `PE(p+k) = PE(p) A_k`, where `A_k` holds the transposed blocks `M_kᵀ`:

# %%
D_small = 16
table_small = sinusoidal_pe_float64(300, D_small)
A_5 = torch.block_diag(*[shift_matrix(5, w, dtype=torch.float64).T for w in inverse_frequencies(D_small).tolist()])
err = (table_small[:-5] @ A_5 - table_small[5:]).abs().max().item()
print(f"one {D_small}×{D_small} matrix maps PE(p) to PE(p+5) for all 295 positions: max error {err:.1e}")
assert err < 1e-12
assert torch.allclose(A_5 @ A_5.T, torch.eye(D_small, dtype=torch.float64)), "a rotation is orthogonal"

# %% [markdown]
# See it in the widget: the point of pair `i` at position `p`, its image under `M_k`, and the point at `p + k` coincide.
# The slow pair 4 turns by only `0.01·k` radians.

# %% tags=["nbval-ignore-output"]
show_shift_rotation()

# %% [markdown]
# **Similarity depends on distance only.** Because each pair is a point on a circle, the dot product of two
# codes only sees the angle between them:
#
# $$PE(p)\cdot PE(p+k) = \sum_i \big[\sin\omega_i p\,\sin\omega_i(p+k) + \cos\omega_i p\,\cos\omega_i(p+k)\big] = \sum_i \cos(\omega_i k)$$
#
# It does not depend on `p`, it is symmetric in `k`, and it is largest (`D/2`) at `k = 0`. We check it for every
# starting position:

# %%
sim = position_similarity(n_positions=64, d_model=128)
print(f"max over k of (largest − smallest PE(p)·PE(p+k) over p): {sim['spread'].max():.1e}")
print(f"max |mean over p − Σ_i cos(ω_i k)|: {(sim['mean_by_k'] - sim['by_k']).abs().max():.1e}")
print("PE(p)·PE(p+k) for k = 0, 1, 2, 5, 10, 30:", [round(sim["by_k"][k].item(), 2) for k in [0, 1, 2, 5, 10, 30]])
assert sim["spread"].max() < 1e-10
assert torch.allclose(sim["sim"], sim["sim"].T)
assert abs(sim["by_k"][0].item() - 64) < 1e-12

# %% [markdown]
# The curve is not monotone (it wiggles, because the fast pairs keep turning), but it falls off with distance
# overall. The widget below shows the whole `PE·PEᵀ` matrix, constant along each diagonal, and the curve against `k`:

# %% tags=["nbval-ignore-output"]
show_position_similarity()

# %% [markdown]
# **About longer sequences.** The formula is defined for any position, and the values stay in `[−1, 1]` (R3). That
# does *not* mean a model trained on short sequences works on long ones: beyond the training length the slow pairs
# reach angles, and the pairs together reach combinations, that training never showed. For `D = 768` trained on
# 1,024 positions, the cell below prints the lowest value pair 250's cosine took in training and its value at
# position 2,047, where it sits next to fast dimensions in combinations never seen. Whether a trained model
# generalises to such inputs is an empirical question, and in practice models with this encoding degrade beyond
# their training length. The table extends; the model's competence does not automatically follow (Press et al.,
# 2022, measure this for several position methods).

# %%
cos_250 = sinusoidal_pe(2048, 768)[:, 2 * 250 + 1]
print(f"pair 250's cosine: lowest over positions 0-1023 {cos_250[:1024].min().item():+.2f}, "
      f"at position 2047 {cos_250[2047].item():+.2f}")
assert cos_250[2047] > cos_250[:1024].min() + 1.0

# %% [markdown]
# ## 8. `PositionalEncoding`: a table that follows its module, and dropout on the sum
#
# The table is fixed: an optimizer must not change it. It still has to move with the module (`.to("cuda")`,
# `.to(torch.float64)`), and it need not be saved: it can be recomputed at any time, checkpoints stay small, and a
# checkpoint then loads into a module built with a different `max_len`. Unit 00 showed the ways a module can hold a
# tensor; which one gives these three properties is exercise 4's to decide. `llmcourse.nn.PositionalEncoding`
# (exercise 4) has them, and computes `dropout(x + pe[:, :T])`:

# %%
pos_enc = PositionalEncoding(d_model=512, max_len=2048, dropout=0.1)
n_par = sum(p.numel() for p in pos_enc.parameters())
buffers = dict(pos_enc.named_buffers())
pe_bytes = pos_enc.pe.numel() * pos_enc.pe.element_size()
mask_f32 = 2048 * 2048 * 4
mask_bool = 2048 * 2048 * torch.ones((), dtype=torch.bool).element_size()
print(f"parameters: {n_par}; buffers: {[(k, tuple(v.shape)) for k, v in buffers.items()]}; "
      f"state_dict keys: {list(pos_enc.state_dict())}")
print(f"pe buffer 2048 × 512 float32: {pe_bytes / 2**20:.0f} MiB; a 2048 × 2048 causal mask: "
      f"{mask_f32 / 2**20:.0f} MiB as float32, {mask_bool / 2**20:.0f} MiB as bool")
assert n_par == 0 and list(buffers) == ["pe"] and len(pos_enc.state_dict()) == 0
assert pe_bytes == 4 * 2**20 and mask_f32 == 16 * 2**20 and mask_bool == 4 * 2**20
pos_enc.to(torch.float64)
print("after .to(torch.float64) the buffer is", pos_enc.pe.dtype)
assert pos_enc.pe.dtype == torch.float64

# %% [markdown]
# **Dropout goes on the sum** `x + PE` (Vaswani et al., §5.4: "we apply dropout to the sums of the embeddings and
# the positional encodings"). In training mode with `p = 0.5`, every output entry is therefore either 0 or
# `2·(x + pe)`; in evaluation mode the module just adds.

# %%
torch.manual_seed(0)
pos_enc = PositionalEncoding(d_model=8, max_len=10, dropout=0.5)
x8 = 2.0 + 0.1 * torch.randn(3, 10, 8)
clean = x8 + pos_enc.pe


def dropout_on_sum(out, clean, p=0.5):
    """Every entry is 0 or clean/(1-p)."""
    return bool(((out == 0) | torch.isclose(out, clean / (1 - p))).all())


out_train = pos_enc.train()(x8)
print(f"train mode: {(out_train == 0).float().mean():.2f} of the entries dropped; "
      f"dropout acts on the sum: {dropout_on_sum(out_train, clean)}")
assert dropout_on_sum(out_train, clean)
assert torch.equal(pos_enc.eval()(x8), clean), "eval mode: x + pe, nothing dropped"

# %% [markdown]
# ### Spot the bug 2: dropout "on the positional encodings"
#
# A popular write-up comments that dropout is applied "to the positional encodings" next to code that applies it to
# the sum. Taking the comment literally gives the module below. Run the same property check.

# %%
class PositionalEncodingDropoutOnPE(PositionalEncoding):
    def forward(self, x):
        return x + self.dropout(self.pe[:, :x.shape[1]])  # apply dropout to the positional encodings


buggy = PositionalEncodingDropoutOnPE(8, 10, dropout=0.5).train()
torch.manual_seed(1)
out_buggy = buggy(x8)
print("dropout acts on the sum:", dropout_on_sum(out_buggy, clean))
print(f"entries equal to 0: {(out_buggy == 0).float().mean():.2f} (the token part x is never dropped)")

# %% [markdown]
# No entry is ever 0: the token signal passes untouched and only the position part is noised, so the dropout no
# longer regularises the embeddings. **Your turn:** fix `forward` below (the buffer `self.pe` and the
# `self.dropout` module are inherited); the self-check runs the property test in train mode and checks that eval
# mode just adds.

# %%
class MyPositionalEncoding(PositionalEncodingDropoutOnPE):
    def forward(self, x):
        # TODO: dropout on the sum of the token vectors and the positional encodings
        return x + self.dropout(self.pe[:, :x.shape[1]])


def self_check_pe_dropout(cls):
    module = cls(8, 10, dropout=0.5)
    torch.manual_seed(1)
    on_sum = dropout_on_sum(module.train()(x8), clean)
    eval_adds = torch.allclose(module.eval()(x8), clean)
    print("✓ every entry is 0 or 2·(x + pe), and eval mode just adds" if on_sum and eval_adds else
          f"✗ not yet: dropout acts on the sum {on_sum}, eval mode adds {eval_adds}")
    return on_sum and eval_adds


self_check_pe_dropout(MyPositionalEncoding)

# %% jupyter={"source_hidden": true}
# Reference fix: add first, then drop: dropout(x + pe[:, :T]). The course's PositionalEncoding (exercise 4)
# does exactly that, so it passes the same self-check.
assert self_check_pe_dropout(PositionalEncoding)

# %% [markdown]
# ### Spot the bug 3
#
# Here is a shorter module that adds the table. Move it to float64, as a model is moved to a GPU, and feed it a
# float64 batch: the cell prints what the module holds and what comes out.

# %%
class PEAttribute(nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        self.pe = sinusoidal_pe(max_len, d_model).unsqueeze(0)

    def forward(self, x):
        return x + self.pe[:, :x.shape[1]]


attr = PEAttribute(8, 10).to(torch.float64)
out64 = attr(torch.zeros(2, 5, 8, dtype=torch.float64))
print("module moved to float64; its table:", attr.pe.dtype, "; output of a float64 batch:", out64.dtype)
print("parameters:", len(list(attr.parameters())), "; state_dict keys:", list(attr.state_dict()))

# %% [markdown]
# **Your turn:** the module was moved to float64, yet its table was not (on a GPU the addition would fail
# outright). Find why, and fix `MyPETable` so that the table follows `.to()`, is not trained and is not saved.

# %%
class MyPETable(nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        # TODO: make the table move with the module, without adding it to the state_dict
        self.pe = sinusoidal_pe(max_len, d_model).unsqueeze(0)

    def forward(self, x):
        return x + self.pe[:, :x.shape[1]]


def self_check_table(cls):
    m = cls(8, 10).to(torch.float64)
    ok = m.pe.dtype == torch.float64 and len(m.state_dict()) == 0 and len(list(m.parameters())) == 0
    print("✓ the table follows .to() and is not saved" if ok else
          f"✗ not yet: dtype after .to(float64) {m.pe.dtype}, state_dict keys {list(m.state_dict())}, "
          f"{len(list(m.parameters()))} parameters")
    return ok


self_check_table(MyPETable)

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed): how the table is held is exercise 4's decision, so it is not shown here. The
# course's PositionalEncoding holds its table that way and passes the same self-check.
assert self_check_table(PositionalEncoding)

# %% [markdown]
# ## 9. Learned absolute positions (GPT-2)
#
# GPT-2 does not use sinusoids at all. It **learns** one vector per position: a second embedding table with
# `context_length` rows, added to the token vectors. Positions run from 0 to `T − 1`, and the `(T, D)` position rows
# broadcast over the batch. `llmcourse.nn.GPTEmbedding` (exercise 6) is this input layer.

# %%
torch.manual_seed(0)
gpt_in = GPTEmbedding(vocab_size=50_257, context_length=1024, d_model=768, dropout=0.1)
shapes = {k: tuple(v.shape) for k, v in gpt_in.state_dict().items()}
n_tok, n_pos = 50_257 * 768, 1024 * 768
print(shapes)
print(f"GPT-2 small: token table {n_tok:,} parameters, position table {n_pos:,}")
assert shapes == {"tok_emb.weight": (50_257, 768), "pos_emb.weight": (1024, 768)}
assert (n_tok, n_pos) == (38_597_376, 786_432)

# %% [markdown]
# The `transformers` library's `GPT2Model` is an independent implementation. Built with tiny random weights
# (nothing is downloaded), its position table `wpe` is an ordinary trainable `nn.Embedding`. This is the fact that
# write-ups get wrong when they illustrate sinusoidal encodings with "GPT-2's" 768 dimensions and 1,024 positions.
# Copying its two tables into our module reproduces the first hidden state it computes, `wte(idx) + wpe(positions)`:

# %%
from transformers import GPT2Config, GPT2Model  # noqa: E402

hf = GPT2Model(GPT2Config(vocab_size=100, n_positions=16, n_embd=12, n_layer=1, n_head=2, embd_pdrop=0.0,
                          bos_token_id=0, eos_token_id=0)).eval()
print("GPT-2's position table:", type(hf.wpe).__name__, tuple(hf.wpe.weight.shape),
      "trainable:", hf.wpe.weight.requires_grad)
ours = GPTEmbedding(vocab_size=100, context_length=16, d_model=12).eval()
ours.load_state_dict({"tok_emb.weight": hf.wte.weight.detach(), "pos_emb.weight": hf.wpe.weight.detach()})
idx = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    h0 = hf(idx, output_hidden_states=True).hidden_states[0]
    mine = ours(idx)
print("max |GPTEmbedding − transformers' first hidden state| =", (mine - h0).abs().max().item())
assert isinstance(hf.wpe, nn.Embedding) and hf.wpe.weight.requires_grad
assert torch.allclose(mine, h0, atol=1e-6)

# %% [markdown]
# The price of learning positions is a hard **context-length limit**: there is no row for position 1,024 in
# GPT-2's table, so longer inputs must be cropped (text generation keeps only the last 1,024 tokens; unit 09).
# The module refuses them
# with a clear error instead of an index error deep inside PyTorch:

# %%
try:
    ours(torch.zeros(1, 17, dtype=torch.long))
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ## Summary
#
# | | sinusoidal encoding (Transformer, units 05–06) | learned embedding (GPT-2, units 07–10) |
# |---|---|---|
# | parameters | 0 (a non-persistent buffer) | `context_length × D` |
# | token scale | `× √d_model` | none |
# | longer sequences | values defined, quality not guaranteed | impossible beyond `context_length` |
# | shift `p → p + k` | one rotation `M_k` per pair | whatever training learned |
#
# - An embedding is a row lookup, equal to a one-hot product, and its gradient reaches only the rows used.
# - Attention alone cannot see order; adding a position code per token fixes that.
# - Sinusoidal pairs are points on circles; a shift by `k` rotates every pair by `ω_i k`, for all positions at once,
#   so `PE(p)·PE(p+k)` depends on `k` only.
# - Dropout acts on the sum of token and position vectors; the fixed table is a buffer, not a parameter.
#
# - Weight tying shares the embedding table with the output layer; a common (unstated in the paper) reading of the
#   `× √d_model` factor is that a tied table is initialised small for the logits and scaled back up for the inputs.
#
# Units 11–13 return to the rotation idea: RoPE rotates queries and keys instead of adding a vector to the input.
# Now open the exercise notebook and build these pieces yourself.
#
# ## Open-ended extension (ungraded): relative positions from absolute codes
#
# Section 7 showed that `PE(p)·PE(p+k)` depends on `k` only. Can a *linear* read-out recover the offset between
# two positions from their codes? Write `offset_features(pe_p, pe_q)` that turns two rows of the table (each
# `(D,)`) into a feature vector from which `q − p` can be computed with one fixed linear map. Hint: look at the
# rotation of each pair. Then ask the same question for learned GPT-2-style position rows (random at first: what
# would training have to do?). The self-check draws random pairs of positions up to 3 apart, fits a least-squares
# map on half of them and asks for a small error on the other half.

# %%
def offset_features(pe_p, pe_q):
    # TODO (optional): a 1-D feature vector; q - p must be a linear function of it
    return None


def self_check_offsets(fn, d_model=32, max_len=64):
    table = sinusoidal_pe(max_len, d_model).double()
    gen = torch.Generator().manual_seed(0)
    pairs = torch.randint(0, max_len, (600, 2), generator=gen)
    pairs = pairs[(pairs[:, 1] - pairs[:, 0]).abs() <= 3]          # small offsets: a well-posed linear question
    feats = [fn(table[a], table[b]) for a, b in pairs.tolist()]
    if any(f is None for f in feats):
        print("✗ not yet: offset_features returns None")
        return False
    X = torch.stack([torch.as_tensor(f, dtype=torch.float64).flatten() for f in feats])
    X = torch.cat([X, torch.ones(len(X), 1, dtype=torch.float64)], 1)
    y = (pairs[:, 1] - pairs[:, 0]).double()[:, None]
    half = len(X) // 2
    w = torch.linalg.lstsq(X[:half], y[:half]).solution
    err = (X[half:] @ w - y[half:]).abs().max().item()
    print(f"✓ the offset is linear in your features (max error {err:.2e})" if err < 0.05 else
          f"✗ not yet: the best linear map misses the offset by up to {err:.2f}")
    return err < 0.05


self_check_offsets(offset_features)
