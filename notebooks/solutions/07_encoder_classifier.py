# %% [markdown]
# # Unit 07 — A BERT-style encoder classifier: exercises
#
# Six graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: worked examples, comparisons with the
# course's reference with shared weights, and properties (appending `[PAD]` changes no logit,
# `[SEP]` survives truncation, evaluating twice gives the same numbers). When something fails it
# tells you what was expected, what came back, and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/07_encoder_classifier/07_encoder_classifier.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `math`, the standard library and the
# course pieces imported below. Conventions (from the lesson): specials
# `[PAD]=0, [CLS]=1, [SEP]=2, [UNK]=3`; masks are **boolean, `True` = real token / may attend**.

# %%
import math  # noqa: F401
from collections import Counter  # noqa: F401

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.nn.blocks import EncoderBlock
from llmcourse.nn.norms import LayerNorm

cfg = llmcourse.setup_notebook("07")
enc = llmcourse.gpt2_encoding()

# %% [markdown]
# ## Exercise 1 — `build_compact_vocab` (3 points)
#
# GPT-2 has 50,257 token ids, but our three thousand sentences use only a few thousand of them. Map
# every GPT-2 id that occurs at least `min_freq` times (total count over all lists) to a **new** id,
# starting at 4 because ids 0–3 are the specials:
#
# ```python
# build_compact_vocab(token_id_lists: list[list[int]], min_freq: int = 1) -> dict[int, int]
# ```
#
# Assign the new ids 4, 5, 6, … in **increasing GPT-2-id order** (not by frequency, not by first
# appearance), so the result does not depend on the order of the lists.
#
# Example: `"Great phone!"` → `[13681, 3072, 0]` and `"Bad battery."` → `[22069, 6555, 13]` give
# `{0: 4, 13: 5, 3072: 6, 6555: 7, 13681: 8, 22069: 9}`. (GPT-2 id 0 is the token `"!"`, an
# ordinary token: it must not collide with `[PAD]`.)

# %% tags=["solution:07.build_compact_vocab"]
def build_compact_vocab(token_id_lists, min_freq=1):
    """{gpt2_id: new_id} for ids with total count ≥ min_freq; new ids 4, 5, … in increasing gpt2_id order."""
    ### BEGIN SOLUTION
    counts = Counter(i for ids in token_id_lists for i in ids)
    kept = sorted(i for i, c in counts.items() if c >= min_freq)
    return {gpt2_id: 4 + k for k, gpt2_id in enumerate(kept)}
    ### END SOLUTION


# %% tags=["tests:07.build_compact_vocab"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("07.build_compact_vocab")  # noqa: E702
### END HIDDEN TESTS
vocab = build_compact_vocab([enc.encode("Great phone!"), enc.encode("Bad battery.")])
assert vocab == {0: 4, 13: 5, 3072: 6, 6555: 7, 13681: 8, 22069: 9}, f"vocabulary of the example: got {vocab}"
assert build_compact_vocab([[5, 9], [9, 7]], min_freq=2) == {9: 4}, "min_freq counts over all lists"
assert build_compact_vocab([[9, 7], [5]]) == build_compact_vocab([[5], [7, 9]]), "must not depend on order"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `encode_batch` (3 points)
#
# Turn a list of sentences into a padded batch:
#
# ```python
# encode_batch(texts: list[str], enc, vocab: dict[int, int], max_len: int) -> tuple[Tensor, Tensor]
# ```
#
# Each row is `[CLS]` (1), then the sentence's GPT-2 ids (`enc.encode`) mapped through `vocab` (an id
# missing from `vocab` becomes `[UNK]` = 3), then `[SEP]` (2). A row holds at most `max_len` ids and
# always ends its real tokens with `[SEP]`: what does not fit is the **end** of the content. Rows are
# right-padded with `[PAD]` (0) to `L`, the length of the longest row (`L ≤ max_len`).
#
# Return `ids` `(B, L)` long and `attention_mask` `(B, L)` **bool**, True for real tokens (including
# `[CLS]` and `[SEP]`), False for padding.

# %% tags=["solution:07.encode_batch"]
def encode_batch(texts, enc, vocab, max_len):
    """(ids (B, L) long, attention_mask (B, L) bool): rows [CLS] content [SEP] [PAD]…, at most max_len ids each."""
    ### BEGIN SOLUTION
    rows = []
    for text in texts:
        content = [vocab.get(i, 3) for i in enc.encode(text)][: max_len - 2]
        rows.append([1] + content + [2])
    length = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = True
    return ids, mask
    ### END SOLUTION


# %% tags=["tests:07.encode_batch"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("07.encode_batch")  # noqa: E702
### END HIDDEN TESTS
example_vocab = {0: 4, 13: 5, 3072: 6, 6555: 7, 13681: 8, 22069: 9}
ids, mask = encode_batch(["Great phone!", "Not bad at all, great value."], enc, example_vocab, max_len=8)
assert ids.shape == (2, 8) and ids.dtype == torch.long, f"ids: expected (2, 8) long, got {tuple(ids.shape)} {ids.dtype}"
assert ids.tolist() == [[1, 8, 6, 4, 2, 0, 0, 0], [1, 3, 3, 3, 3, 3, 3, 2]], f"ids of the example: got {ids.tolist()}"
assert mask.dtype == torch.bool and mask.sum(1).tolist() == [5, 8], f"mask: True for real tokens, got {mask}"
short, _ = encode_batch(["a very long sentence indeed, much longer than four"], enc, example_vocab, max_len=4)
assert short[0, -1] == 2, f"[SEP] must survive truncation; got {short.tolist()}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `BertEmbeddings` (3 points)
#
# BERT's input layer: three learned embeddings summed and normalised, with a dropout.
#
# ```python
# BertEmbeddings(vocab_size, d_model, max_len, type_vocab_size=2, dropout=0.1)
# forward(ids, segment_ids=None) -> (B, L, d_model)
# ```
#
# - `self.tok = nn.Embedding(vocab_size, d_model, padding_idx=0)` (`[PAD]` = 0),
#   `self.pos = nn.Embedding(max_len, d_model)`, `self.seg = nn.Embedding(type_vocab_size, d_model)`,
#   `self.norm = LayerNorm(d_model)` (imported above; `nn.LayerNorm` has the same keys),
#   `self.dropout = nn.Dropout(dropout)`.
# - Positions are `0, 1, …, L−1`; `segment_ids=None` means segment 0 everywhere.
# - The output is BERT's input embedding (Devlin et al., 2019; the lesson's section 5), built from these five
#   modules. Where the dropout acts is yours to decide: BERT's code answers it (`BertEmbeddings.forward`, in
#   Google's release or in `transformers`). The check compares the eval-mode output with its own computation
#   after loading the same `state_dict` into your module, and reads a train-mode output with `dropout=0.5`.

# %% tags=["solution:07.BertEmbeddings"]
class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, d_model, max_len, type_vocab_size=2, dropout=0.1):
        super().__init__()
        ### BEGIN SOLUTION
        self.tok = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.pos = nn.Embedding(max_len, d_model)
        self.seg = nn.Embedding(type_vocab_size, d_model)
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, ids, segment_ids=None):
        ### BEGIN SOLUTION
        if segment_ids is None:
            segment_ids = torch.zeros_like(ids)
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.dropout(self.norm(self.tok(ids) + self.pos(positions) + self.seg(segment_ids)))
        ### END SOLUTION


# %% tags=["tests:07.BertEmbeddings"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("07.BertEmbeddings")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
emb = BertEmbeddings(10, 8, max_len=6).eval()
assert sorted(emb.state_dict()) == ["norm.bias", "norm.weight", "pos.weight", "seg.weight", "tok.weight"], \
    sorted(emb.state_dict())
assert emb.tok.padding_idx == 0, "the token table needs padding_idx=0"
out = emb(torch.tensor([[1, 5, 2, 0]]))
assert out.shape == (1, 4, 8), f"expected (1, 4, 8), got {tuple(out.shape)}"
assert torch.allclose(out.mean(-1), torch.zeros(1, 4), atol=1e-5), "each output vector is LayerNorm-ed (mean 0)"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `EncoderClassifier` (7 points)
#
# ```python
# EncoderClassifier(vocab_size, d_model=64, num_heads=4, d_ff=256, n_layers=2, max_len=64,
#                   num_classes=2, dropout=0.1, pooling="cls")
# forward(ids, attention_mask) -> logits (B, num_classes)
# ```
#
# - `self.embeddings = BertEmbeddings(vocab_size, d_model, max_len, dropout=dropout)`;
# - `self.layers = nn.ModuleList` of `n_layers` × `EncoderBlock(d_model, num_heads, d_ff, dropout,
#   norm_first=True, activation="gelu")` (the unit-05 block, imported above);
# - `self.final_norm = LayerNorm(d_model)`; `self.classifier = nn.Linear(d_model, num_classes)`.
#
# Forward: in every block, each position attends to the real tokens only (`attention_mask` True; the
# blocks take a boolean mask that broadcasts to `(B, H, L, L)`, True = may attend); the final norm is
# applied before pooling. `"cls"` pools the final state at position 0, `"mean"` the mean of the final
# states over the **real** tokens only.
# Return the classifier's logits (no softmax). With the defaults the model has `64·V + 104,578`
# parameters.

# %% tags=["solution:07.EncoderClassifier"]
class EncoderClassifier(nn.Module):
    def __init__(self, vocab_size, d_model=64, num_heads=4, d_ff=256, n_layers=2, max_len=64, num_classes=2,
                 dropout=0.1, pooling="cls"):
        super().__init__()
        ### BEGIN SOLUTION
        self.pooling = pooling
        self.embeddings = BertEmbeddings(vocab_size, d_model, max_len, dropout=dropout)
        self.layers = nn.ModuleList(
            [EncoderBlock(d_model, num_heads, d_ff, dropout, norm_first=True, activation="gelu")
             for _ in range(n_layers)])
        self.final_norm = LayerNorm(d_model)
        self.classifier = nn.Linear(d_model, num_classes)
        ### END SOLUTION

    def forward(self, ids, attention_mask):
        ### BEGIN SOLUTION
        mask = attention_mask[:, None, None, :]
        h = self.embeddings(ids)
        for layer in self.layers:
            h = layer(h, mask)
        h = self.final_norm(h)
        if self.pooling == "cls":
            pooled = h[:, 0]
        else:
            keep = attention_mask.unsqueeze(-1).float()
            pooled = (h * keep).sum(1) / keep.sum(1)
        return self.classifier(pooled)
        ### END SOLUTION


# %% tags=["tests:07.EncoderClassifier"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("07.EncoderClassifier")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
model = EncoderClassifier(100, dropout=0.0).eval()
n_params = sum(p.numel() for p in model.parameters())
assert n_params == 64 * 100 + 104_578, f"expected 64·V + 104,578 = 110,978 parameters, got {n_params:,}"
ids = torch.tensor([[1, 17, 42, 2, 0, 0], [1, 9, 8, 7, 6, 2]])
mask = ids != 0
with torch.no_grad():
    logits = model(ids, mask)
    shorter = model(ids[:1, :4], mask[:1, :4])
assert logits.shape == (2, 2), f"expected logits (2, 2), got {tuple(logits.shape)}"
assert torch.allclose(logits[0], shorter[0], atol=1e-5), "padding changed the logits: pass the mask to every block"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `confusion_matrix` and `accuracy` (2 points)
#
# ```python
# confusion_matrix(y_true, y_pred, num_classes) -> (C, C) long   # rows = true labels, columns = predictions
# accuracy(y_true, y_pred) -> float                              # fraction of equal entries
# ```
#
# Example: `y_true = [0, 0, 1, 1, 1]`, `y_pred = [0, 1, 1, 1, 0]` → `[[1, 1], [1, 2]]` and accuracy 0.6.

# %% tags=["solution:07.confusion_matrix"]
def confusion_matrix(y_true, y_pred, num_classes):
    """(C, C) long counts; entry [i, j] = examples of true class i predicted as j."""
    ### BEGIN SOLUTION
    cm = torch.zeros(num_classes, num_classes, dtype=torch.long)
    for t, p in zip(y_true.tolist(), y_pred.tolist()):
        cm[t, p] += 1
    return cm
    ### END SOLUTION


def accuracy(y_true, y_pred):
    """Fraction of predictions equal to the true labels, as a Python float."""
    ### BEGIN SOLUTION
    return (y_true == y_pred).float().mean().item()
    ### END SOLUTION


# %% tags=["tests:07.confusion_matrix"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("07.confusion_matrix")  # noqa: E702
### END HIDDEN TESTS
cm = confusion_matrix(torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 1, 1, 1, 0]), 2)
assert cm.tolist() == [[1, 1], [1, 2]], f"expected [[1, 1], [1, 2]] (rows = true), got {cm.tolist()}"
acc = accuracy(torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 1, 1, 1, 0]))
assert isinstance(acc, float) and abs(acc - 0.6) < 1e-7, f"accuracy of the example is 0.6, got {acc!r}"
assert abs(cm.trace().item() / cm.sum().item() - acc) < 1e-7, "trace / N must equal the accuracy"
print("visible tests passed")

# %% [markdown]
# ## Exercise 6 — `evaluate` (2 points)
#
# ```python
# @torch.no_grad()
# def evaluate(model, loader) -> dict   # {"loss": float, "accuracy": float, "confusion": (C, C) long}
# ```
#
# `loader` is any iterable of `(ids, attention_mask, labels)` batches (batches may have different
# sizes); the model is called as `model(ids, attention_mask)` and returns logits `(B, C)`.
#
# - Evaluate with dropout off (eval mode); afterwards the model is in the mode it was in before the call.
# - `"loss"`: the cross-entropy **averaged over examples** (not a sum of batch losses, and not a plain
#   mean of batch means: a last batch of 2 weighs less than a batch of 32).
# - `"accuracy"` and `"confusion"`: over all examples, with your functions from exercise 5.

# %% tags=["solution:07.evaluate"]
@torch.no_grad()
def evaluate(model, loader):
    """Mean loss per example, accuracy and confusion matrix; eval mode inside, previous mode restored."""
    ### BEGIN SOLUTION
    was_training = model.training
    model.eval()
    total, n, trues, preds = 0.0, 0, [], []
    num_classes = 2
    for ids, attention_mask, labels in loader:
        logits = model(ids, attention_mask)
        num_classes = logits.shape[-1]
        total += F.cross_entropy(logits, labels, reduction="sum").item()
        n += len(labels)
        trues.append(labels)
        preds.append(logits.argmax(-1))
    model.train(was_training)
    y_true, y_pred = torch.cat(trues), torch.cat(preds)
    return {"loss": total / n, "accuracy": accuracy(y_true, y_pred),
            "confusion": confusion_matrix(y_true, y_pred, num_classes)}
    ### END SOLUTION


# %% tags=["tests:07.evaluate"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("07.evaluate")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
model = EncoderClassifier(100, d_model=16, num_heads=2, d_ff=32, n_layers=1, dropout=0.5).train()
loader = [(ids, mask, torch.tensor([1, 0])), (ids[:1], mask[:1], torch.tensor([1]))]
r1, r2 = evaluate(model, loader), evaluate(model, loader)
assert set(r1) >= {"loss", "accuracy", "confusion"}, f"keys: {sorted(r1)}"
assert model.training, "evaluate must restore train mode afterwards"
assert r1["loss"] == r2["loss"], "two evaluations differ: dropout is still on (call model.eval())"
model.eval()
with torch.no_grad():
    per_example = F.cross_entropy(torch.cat([model(i, m) for i, m, _ in loader]), torch.tensor([1, 0, 1]))
assert abs(r1["loss"] - per_example.item()) < 1e-5, f"loss {r1['loss']:.4f} is not the per-example mean " \
    f"{per_example.item():.4f}"
assert int(r1["confusion"].sum()) == 3, "the confusion matrix must count all 3 examples"
print("visible tests passed")

# %% [markdown]
# ## Putting it together
#
# Not graded: your pieces on the real data. The lesson trains this model; here we only check that a
# few UCI sentences flow through your functions.

# %%
from llmcourse.data.sentiment import load_sentiment, stratified_split  # noqa: E402

splits = stratified_split(load_sentiment())
train_vocab = build_compact_vocab([enc.encode(ex.text) for ex in splits["train"]])
sample = splits["test"][:4]
ids, mask = encode_batch([ex.text for ex in sample], enc, train_vocab, max_len=cfg["max_len"])
torch.manual_seed(0)
model = EncoderClassifier(len(train_vocab) + 4, max_len=cfg["max_len"])
print(f"{len(splits['train'])} training sentences, compact vocabulary {len(train_vocab)} + 4 specials")
print("batch", tuple(ids.shape), "->", evaluate(model, [(ids, mask, torch.tensor([ex.label for ex in sample]))]))

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
