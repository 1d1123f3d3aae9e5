# %% [markdown]
# # Unit 02 — Embeddings and positional encodings: exercises
#
# Six graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: other shapes and seeds, comparisons with
# `torch.nn.functional.embedding` and with an exact float64 formula, the rotation property of the
# sinusoidal table, the structure of your modules (`state_dict` keys, buffers versus parameters) and the
# behaviour of dropout. When something fails it tells you what was expected, what came back, and, if your
# mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/02_embeddings_and_positions/02_embeddings_and_positions.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use only `torch`, `math` and the standard library.
# Conventions (from the lesson): token ids are `torch.long`; activations are `(B, T, D)` with
# `D = d_model`; the sinusoidal table puts **sine on even dimensions and cosine on odd dimensions**.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse

cfg = llmcourse.setup_notebook("02")

# %% [markdown]
# ## Exercise 1 — `embedding_lookup` and `one_hot_matmul` (3 points)
#
# An embedding table `weight` has shape `(V, D)`: one row per token id. Write two functions that turn
# integer `ids` of **any** shape into vectors of shape `ids.shape + (D,)`:
#
# - `embedding_lookup(ids, weight)`: select the rows by indexing;
# - `one_hot_matmul(ids, weight)`: build the one-hot vectors `F.one_hot(ids, V)`, convert them to the
#   table's dtype (`F.one_hot` returns integers) and multiply them by `weight`.
#
# Both must return the table's dtype and let gradients flow into `weight`. Do **not** call
# `F.embedding` or `nn.Embedding` here: the point is to see what they do.

# %% tags=["solution:02.embedding_lookup"]
def embedding_lookup(ids, weight):
    """ids: integer tensor of any shape; weight: (V, D) -> ids.shape + (D,)."""
    ### BEGIN SOLUTION
    return weight[ids]
    ### END SOLUTION


def one_hot_matmul(ids, weight):
    """The same lookup as a matrix product: one_hot(ids, V) @ weight."""
    ### BEGIN SOLUTION
    one_hot = F.one_hot(ids, num_classes=weight.shape[0]).to(weight.dtype)
    return one_hot @ weight
    ### END SOLUTION


# %% tags=["tests:02.embedding_lookup"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("02.embedding_lookup")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(123)
table = torch.randn(5, 3)
ids = torch.tensor([[0, 1, 4], [4, 4, 2]])
out = embedding_lookup(ids, table)
assert out.shape == (2, 3, 3), f"ids (2, 3) and a (5, 3) table must give (2, 3, 3), got {tuple(out.shape)}"
assert torch.allclose(out[0, :2], torch.tensor([[-0.1115, 0.1204, -0.3696], [-0.2404, -1.1969, 0.2093]]),
                      atol=1e-4), f"rows 0 and 1 of the seed-123 table expected, got {out[0, :2]}"
assert torch.allclose(one_hot_matmul(ids, table), out), "one_hot_matmul must give exactly the rows of the lookup"
w = table.clone().requires_grad_(True)
one_hot_matmul(ids, w).sum().backward()
assert torch.equal(w.grad[:, 0], torch.tensor([1.0, 1.0, 1.0, 0.0, 3.0])), \
    f"weight.grad[r] must be count(r)·ones(D): row 4 is used 3 times, row 3 never; got {w.grad[:, 0]}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `InputEmbeddings` (3 points)
#
# The token embedding of the original Transformer: look the ids up in a trainable table and multiply by
# `√d_model`.
#
# ```python
# InputEmbeddings(vocab_size, d_model)
# ```
#
# - one submodule `self.embedding = nn.Embedding(vocab_size, d_model)` (so the `state_dict` key is
#   `embedding.weight`, shape `(vocab_size, d_model)`);
# - `forward(ids)`: `(B, T)` long → `(B, T, d_model)`, equal to `embedding(ids) * √d_model`, in float32.

# %% tags=["solution:02.InputEmbeddings"]
class InputEmbeddings(nn.Module):
    def __init__(self, vocab_size, d_model):
        super().__init__()
        ### BEGIN SOLUTION
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        ### END SOLUTION

    def forward(self, ids):
        ### BEGIN SOLUTION
        return self.embedding(ids) * math.sqrt(self.d_model)
        ### END SOLUTION


# %% tags=["tests:02.InputEmbeddings"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("02.InputEmbeddings")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(123)
emb = InputEmbeddings(5, 3)
assert list(emb.state_dict()) == ["embedding.weight"], f"state_dict keys: {list(emb.state_dict())}"
out = emb(torch.tensor([[0, 1], [2, 2]]))
assert out.shape == (2, 2, 3) and out.dtype == torch.float32, f"got {tuple(out.shape)} {out.dtype}"
assert torch.allclose(out[0], emb.embedding.weight[:2] * math.sqrt(3)), "rows must be scaled by √d_model = √3"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `sinusoidal_pe` (5 points)
#
# The fixed positional-encoding table of the original Transformer, for positions `p = 0 … max_len−1` and
# pairs `i = 0 … D/2 − 1`:
#
# $$PE[p, 2i] = \sin\!\left(\frac{p}{10000^{2i/D}}\right), \qquad PE[p, 2i+1] = \cos\!\left(\frac{p}{10000^{2i/D}}\right)$$
#
# - return a float32 tensor of shape `(max_len, d_model)`;
# - **interleave**: sine in the even columns (`pe[:, 0::2]`), cosine in the odd columns (`pe[:, 1::2]`); both
#   columns of a pair share one frequency `10000^(−2i/D)`;
# - raise `ValueError` when `d_model` is odd.
#
# Example: `sinusoidal_pe(4, 4)[1]` is `[0.8415, 0.5403, 0.0100, 0.99995]`.

# %% tags=["solution:02.sinusoidal_pe"]
def sinusoidal_pe(max_len, d_model):
    """(max_len, d_model) float32: sin on even dims, cos on odd dims, frequency 10000^(-2i/d_model) per pair."""
    ### BEGIN SOLUTION
    if d_model % 2 != 0:
        raise ValueError(f"d_model must be even, got {d_model}")
    positions = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)             # (max_len, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)  # (d_model/2,)
    angles = positions * inv_freq                                                    # (max_len, d_model/2)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe
    ### END SOLUTION


# %% tags=["tests:02.sinusoidal_pe"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("02.sinusoidal_pe")  # noqa: E702
### END HIDDEN TESTS
pe = sinusoidal_pe(4, 4)
assert pe.shape == (4, 4) and pe.dtype == torch.float32, f"got {tuple(pe.shape)} {pe.dtype}"
expected = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.8415, 0.5403, 0.0100, 0.99995],
                         [0.9093, -0.4161, 0.0200, 0.9998], [0.1411, -0.9900, 0.0300, 0.99955]])
assert torch.allclose(pe, expected, atol=1e-4), f"sinusoidal_pe(4, 4) expected\n{expected}\ngot\n{pe}"
big = sinusoidal_pe(50, 64)
assert torch.allclose(big[:, 0::2] ** 2 + big[:, 1::2] ** 2, torch.ones(50, 32), atol=1e-5), \
    "each pair (dims 2i, 2i+1) must be (sin, cos) of the same angle, so sin² + cos² = 1"
try:
    sinusoidal_pe(4, 5)
    raise AssertionError("sinusoidal_pe(4, 5) must raise ValueError (odd d_model)")
except ValueError:
    pass
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `PositionalEncoding` (4 points)
#
# A module that adds the table to a batch of embeddings:
#
# ```python
# PositionalEncoding(d_model, max_len, dropout=0.1)
# ```
#
# - the table (from your `sinusoidal_pe` of exercise 3) is an attribute `pe` of shape `(1, max_len, d_model)`
#   that follows `.to(...)` (device and dtype); the module has **no** parameters and an **empty** `state_dict`
#   (the table can always be recomputed);
# - `forward(x)`: `x (B, T, d_model)` → `(B, T, d_model)`. In eval mode it returns `x + PE[:T]`; in train mode
#   dropout with probability `dropout` acts on the **sum** (each entry is 0 or `(x + pe)/(1 − p)`). Raise
#   `ValueError` when `T > max_len`.

# %% tags=["solution:02.PositionalEncoding"]
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        ### BEGIN SOLUTION
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_pe(max_len, d_model).unsqueeze(0), persistent=False)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        t = x.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds max_len={self.max_len}")
        return self.dropout(x + self.pe[:, :t])
        ### END SOLUTION


# %% tags=["tests:02.PositionalEncoding"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("02.PositionalEncoding")  # noqa: E702
### END HIDDEN TESTS
pos = PositionalEncoding(d_model=8, max_len=20, dropout=0.1)
assert len(list(pos.parameters())) == 0, "the table must not be a parameter"
assert len(pos.state_dict()) == 0, f"the table must not be saved: state_dict keys {list(pos.state_dict())}"
assert PositionalEncoding(8, 20).to(torch.float64).pe.dtype == torch.float64, "the table must follow .to(torch.float64)"
assert pos.pe.shape == (1, 20, 8), f"pe must have shape (1, max_len, d_model), got {tuple(pos.pe.shape)}"
x = torch.randn(2, 5, 8)
pos.eval()
assert torch.allclose(pos(x), x + sinusoidal_pe(5, 8)), "in eval mode the output is x + pe[:, :T]"
try:
    pos(torch.randn(1, 21, 8))
    raise AssertionError("T = 21 > max_len = 20 must raise ValueError")
except ValueError:
    pass
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `shift_matrix` (2 points)
#
# In the lesson, pair `i` of the table at position `p` is the point `(sin ωp, cos ωp)` with
# `ω = 10000^(−2i/D)`. Moving to position `p + k` rotates this point by the fixed angle `ωk`. Write the
# matrix of that rotation:
#
# $$M_k = \begin{pmatrix} \cos \omega k & \sin \omega k \\ -\sin \omega k & \cos \omega k \end{pmatrix},
# \qquad M_k \begin{pmatrix} \sin \omega p \\ \cos \omega p \end{pmatrix} = \begin{pmatrix} \sin \omega (p+k) \\ \cos \omega (p+k) \end{pmatrix}$$
#
# `shift_matrix(k, omega)` takes two Python numbers and returns a `(2, 2)` float tensor. It must not
# depend on `p`.

# %% tags=["solution:02.shift_matrix"]
def shift_matrix(k, omega):
    """(2, 2) rotation taking (sin ωp, cos ωp) to (sin ω(p+k), cos ω(p+k)) for every p."""
    ### BEGIN SOLUTION
    c, s = math.cos(omega * k), math.sin(omega * k)
    return torch.tensor([[c, s], [-s, c]])
    ### END SOLUTION


# %% tags=["tests:02.shift_matrix"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("02.shift_matrix")  # noqa: E702
### END HIDDEN TESTS
M = shift_matrix(3, 0.5)
assert M.shape == (2, 2), f"expected a (2, 2) tensor, got {tuple(M.shape)}"
assert torch.allclose(M @ M.T, torch.eye(2), atol=1e-6), "a rotation is orthogonal: M Mᵀ = I"
for p in [0, 1, 7, 40]:
    start = torch.tensor([math.sin(0.5 * p), math.cos(0.5 * p)])
    target = torch.tensor([math.sin(0.5 * (p + 3)), math.cos(0.5 * (p + 3))])
    assert torch.allclose(M @ start, target, atol=1e-5), f"M_k must map position {p} to {p + 3}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 6 — `GPTEmbedding` (3 points)
#
# GPT-2 does not use sinusoids: it **learns** one vector per position. Write its input layer:
#
# ```python
# GPTEmbedding(vocab_size, context_length, d_model, dropout=0.0)
# ```
#
# - `state_dict` keys exactly `tok_emb.weight (V, D)` and `pos_emb.weight (context_length, D)`: a learned
#   token table and a learned position table (`nn.Embedding`s, default initialisation);
# - `forward(idx)`: `idx (B, T)` long → `(B, T, D)`: the token vector plus the vector of its position
#   `0, 1, …, T−1`, with dropout of probability `dropout` on the sum and no √d_model scale. Raise
#   `ValueError` when `T > context_length`. The module must work wherever it and `idx` live (after
#   `.to(device)`: a GPU, or PyTorch's `"meta"` device).

# %% tags=["solution:02.GPTEmbedding"]
class GPTEmbedding(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, dropout=0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.context_length = context_length
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.dropout = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, idx):
        ### BEGIN SOLUTION
        t = idx.shape[1]
        if t > self.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length={self.context_length}")
        positions = torch.arange(t, device=idx.device)
        return self.dropout(self.tok_emb(idx) + self.pos_emb(positions))
        ### END SOLUTION


# %% tags=["tests:02.GPTEmbedding"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("02.GPTEmbedding")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
gpt_emb = GPTEmbedding(vocab_size=50, context_length=8, d_model=4)
shapes = {k: tuple(v.shape) for k, v in gpt_emb.state_dict().items()}
assert shapes == {"tok_emb.weight": (50, 4), "pos_emb.weight": (8, 4)}, f"state_dict: {shapes}"
idx = torch.tensor([[3, 1, 4], [1, 5, 9]])
out = gpt_emb(idx)
assert out.shape == (2, 3, 4), f"idx (2, 3) must give (2, 3, 4), got {tuple(out.shape)}"
assert torch.allclose(out[1, 0], gpt_emb.tok_emb.weight[1] + gpt_emb.pos_emb.weight[0]), \
    "the first token must get position row 0 (positions start at 0)"
try:
    gpt_emb(torch.zeros(1, 9, dtype=torch.long))
    raise AssertionError("T = 9 > context_length = 8 must raise ValueError")
except ValueError:
    pass
print("visible tests passed")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
# From here on the course imports the finished pieces from `llmcourse`:
# `llmcourse.nn.InputEmbeddings` and `llmcourse.nn.PositionalEncoding` return in the encoder–decoder of
# unit 06, and GPT-2's learned positions in unit 08.
