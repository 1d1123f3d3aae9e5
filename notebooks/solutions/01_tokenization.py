# %% [markdown]
# # Unit 01 — Tokenization: exercises
#
# Five graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: the worked examples, random corpora of chunks (recording
# which chunks your code reads), a replay of your merges (each one must have had the highest count at its
# step), texts with special tokens, GPT-2's ids on real text and every item of several window datasets.
# When something fails it tells you what was expected, what came back and, if your mistake is a known one,
# its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/01_tokenization/01_tokenization.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook (`GPT2_PATTERN` is imported in the first cell, `full_count` is a
# function: both count). Use only `torch`, `math`, `regex` and the standard library.

# %%
import math
from collections import Counter

import regex
import torch
from torch.utils.data import DataLoader, Dataset

import llmcourse
from llmcourse.data import GPT2_PATTERN

cfg = llmcourse.setup_notebook("01")
verdict = llmcourse.load_text("the-verdict")
shakespeare = llmcourse.load_text("tinyshakespeare")
print(f"the-verdict: {len(verdict):,} characters; tinyshakespeare: {len(shakespeare):,} characters")

# %% [markdown]
# ## Exercise 1 — `CharTokenizer` (3 points)
#
# A character-level tokenizer:
#
# ```python
# tok = CharTokenizer(chars)          # the id of a character is its position in `chars`
# tok = CharTokenizer.from_text(text) # chars = sorted(set(text))
# tok.vocab_size                      # number of characters (an int attribute or property)
# tok.encode(s) -> list[int]
# tok.decode(ids) -> str
# ```
#
# - Sort the vocabulary in `from_text`: ids must not depend on where a character first appears.
# - `encode` of a string with a character outside the vocabulary raises `ValueError` whose message
#   contains that character (the first unknown one).
# - `decode(encode(s)) == s` for every string made of known characters.

# %% tags=["solution:01.CharTokenizer"]
class CharTokenizer:
    def __init__(self, chars):
        ### BEGIN SOLUTION
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        ### END SOLUTION

    @classmethod
    def from_text(cls, text):
        ### BEGIN SOLUTION
        return cls(sorted(set(text)))
        ### END SOLUTION

    @property
    def vocab_size(self):
        ### BEGIN SOLUTION
        return len(self.chars)
        ### END SOLUTION

    def encode(self, s):
        ### BEGIN SOLUTION
        for c in s:
            if c not in self.stoi:
                raise ValueError(f"character {c!r} is not in the vocabulary")
        return [self.stoi[c] for c in s]
        ### END SOLUTION

    def decode(self, ids):
        ### BEGIN SOLUTION
        return "".join(self.chars[i] for i in ids)
        ### END SOLUTION


# %% tags=["tests:01.CharTokenizer"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("01.CharTokenizer")  # noqa: E702
### END HIDDEN TESTS
tok = CharTokenizer.from_text(shakespeare)
assert tok.vocab_size == 65, f"tinyshakespeare has 65 distinct characters, got vocab_size={tok.vocab_size}"
assert tok.encode("\n !Aaz") == [0, 1, 2, 13, 39, 64], f"ids of '\\n !Aaz' are {tok.encode(chr(10) + ' !Aaz')}"
assert tok.decode(tok.encode("Hello, world!")) == "Hello, world!", "decode(encode(s)) must give s back"
try:
    tok.encode("snow ☃")
    raise AssertionError("encode('snow ☃') must raise ValueError: ☃ is not in the vocabulary")
except ValueError as err:
    assert "☃" in str(err), f"the error message should name the unknown character; it was: {err}"
print("visible tests passed")

# %% [markdown]
# ## Byte-level BPE on integer ids (exercises 2–4)
#
# GPT-2's tokenizer works on **bytes**: a text is cut into chunks by a regular expression (words with their
# leading space, numbers, punctuation runs, whitespace runs), each chunk becomes its UTF-8 bytes, the ids 0–255,
# and every merge creates a new id. Merges never cross a chunk boundary. `GPT2_PATTERN`, imported in the first cell,
# is GPT-2's pattern (the `regex` package reads `\p{L}` as "a letter" and `\p{N}` as "a digit").
#
# Training keeps the corpus as a list of **distinct chunks** and two maps, which it updates at every merge
# instead of counting every pair again:
#
# - `words[i]`: chunk `i` as a list of ids; `counts[i]`: how many times chunk `i` occurs in the text;
# - `pair_counts[(a, b)]`: how often ids `a`, `b` stand side by side in the corpus: every adjacent position of
#   every chunk, weighted by the chunk's count (so `[7, 7, 7]` holds `(7, 7)` twice); only pairs with a positive
#   count are keys;
# - `where[(a, b)]`: the set of the indexes `i` of the chunks holding the pair; only pairs that occur are keys.

# %%
print(GPT2_PATTERN)


def full_count(words, counts):
    """pair_counts and where of a corpus, counted from scratch (a helper for the visible tests)."""
    totals, holders = Counter(), {}
    for index, chunk in enumerate(words):
        for two in zip(chunk, chunk[1:]):
            totals[two] += counts[index]
            holders[two] = holders.get(two, set()) | {index}
    return dict(totals), holders


# %% [markdown]
# ## Exercise 2 — `merge_step` (4 points)
#
# ```python
# merge_step(words, counts, pair_counts, where, pair, new_id) -> None
# ```
#
# - In every chunk that holds `pair`, replace each non-overlapping occurrence of it, scanning left to right, by
#   the single id `new_id` (`[7, 7, 7]` with the pair `(7, 7)` becomes `[new_id, 7]`). Store the result in
#   `words[i]`.
# - Update `pair_counts` and `where` **in place** so that afterwards they are exactly what a full count of the
#   new `words` would give (`full_count` above), without doing one: **read only the chunks listed in
#   `where[pair]`** (and their `counts`). The grader hands you a corpus that records which chunks your function
#   reads; touching any other chunk, e.g. to recount, fails.
# - A `pair` that is not a key of `where` changes nothing. Return `None`.

# %% tags=["solution:01.merge_step"]
def merge_step(words, counts, pair_counts, where, pair, new_id):
    ### BEGIN SOLUTION
    a, b = pair
    changed = set()
    for i in list(where.get(pair, ())):
        old = words[i]
        new, k = [], 0
        while k < len(old):
            if k + 1 < len(old) and old[k] == a and old[k + 1] == b:
                new.append(new_id)
                k += 2
            else:
                new.append(old[k])
                k += 1
        for p in zip(old, old[1:]):
            pair_counts[p] -= counts[i]
            changed.add(p)
            where[p].discard(i)
        for p in zip(new, new[1:]):
            pair_counts[p] = pair_counts.get(p, 0) + counts[i]
            where.setdefault(p, set()).add(i)
        words[i] = new
    for p in changed:
        if pair_counts.get(p) == 0:
            del pair_counts[p]
        if p in where and not where[p]:
            del where[p]
    ### END SOLUTION


# %% tags=["tests:01.merge_step"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("01.merge_step")  # noqa: E702
### END HIDDEN TESTS
words = [[1, 2, 3], [7, 7, 7], [1, 2, 1, 2], [9]]
counts = [5, 2, 3, 4]
pc, wh = full_count(words, counts)
assert pc[(7, 7)] == 4 and pc[(1, 2)] == 11 and wh[(1, 2)] == {0, 2}, (pc, wh)
merge_step(words, counts, pc, wh, (1, 2), 256)
assert words == [[256, 3], [7, 7, 7], [256, 256], [9]], f"chunks after merging (1, 2): {words}"
assert (pc, wh) == full_count(words, counts), f"pair_counts/where must equal a full count of the new chunks; got {pc}, {wh}"
merge_step(words, counts, pc, wh, (7, 7), 257)
assert words[1] == [257, 7], f"[7, 7, 7] merges left to right into [257, 7]; got {words[1]}"
assert (pc, wh) == full_count(words, counts), (pc, wh)
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `byte_bpe_train` (4 points)
#
# ```python
# byte_bpe_train(text, num_merges, special_tokens=(), pattern=GPT2_PATTERN) -> list[tuple[int, int]]
# ```
#
# 1. **Special tokens** (strings such as `"<|endoftext|>"`) are not text: cut the text at every occurrence of
#    each of them, exactly as written, and drop them, so that no chunk contains a special token or a piece of one.
#    Where two special tokens overlap in the text, the longer one counts.
# 2. Cut each remaining part into chunks with `regex.findall(pattern, part)`. Each **distinct** chunk becomes one
#    entry of `words` (its UTF-8 bytes as ids 0–255), with its number of occurrences in `counts`.
# 3. Count the pairs once (`full_count`), then for `k = 0, 1, …`: take the pair with the highest count, ties
#    going to the **smallest pair** (`min` over the tied `(a, b)` tuples of ints); call
#    `merge_step(words, counts, pair_counts, where, pair, 256 + k)`; append the pair to the result.
# 4. Stop after `num_merges` merges, or earlier when no pair is left. Return the merges in order.
#
# Between two merges your loop reads the counts, never the chunks: the grader runs it with the course's
# `merge_step` (so a mistake in exercise 2 costs nothing here) and watches the chunks between calls.

# %% tags=["solution:01.byte_bpe_train"]
def byte_bpe_train(text, num_merges, special_tokens=(), pattern=GPT2_PATTERN):
    ### BEGIN SOLUTION
    parts = [text]
    if special_tokens:
        by_length = sorted(special_tokens, key=len, reverse=True)
        parts = regex.split("|".join(regex.escape(s) for s in by_length), text)
    chunk_counts = Counter(c for part in parts for c in regex.findall(pattern, part))
    words = [list(c.encode("utf-8")) for c in chunk_counts]
    counts = list(chunk_counts.values())
    pair_counts, where = full_count(words, counts)
    merges = []
    while pair_counts and len(merges) < num_merges:
        top = max(pair_counts.values())
        pair = min(p for p, c in pair_counts.items() if c == top)
        merge_step(words, counts, pair_counts, where, pair, 256 + len(merges))
        merges.append(pair)
    return merges
    ### END SOLUTION


# %% tags=["tests:01.byte_bpe_train"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("01.byte_bpe_train")  # noqa: E702
### END HIDDEN TESTS
toy_text = "low lower lowest, low lowest!"
toy_merges = byte_bpe_train(toy_text, 6)
assert isinstance(toy_merges, list) and all(isinstance(m, tuple) and len(m) == 2 for m in toy_merges), toy_merges
assert toy_merges[:3] == [(108, 111), (256, 119), (32, 257)], f"first merges 'l'+'o', 'lo'+'w', ' '+'low': {toy_merges}"
assert byte_bpe_train("aaaa<|endoftext|>aaaa", 5, special_tokens=["<|endoftext|>"]) == [(97, 97), (256, 256)], \
    "the special token is cut out: only 'aaaa' (twice) is left to merge"
verdict_merges = byte_bpe_train(verdict, 20)
assert len(verdict_merges) == 20 and verdict_merges[0] == (32, 116), f"the-verdict's first merge is ' '+'t'"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `gpt2_merges` and `byte_bpe_encode` (4 points)
#
# ```python
# gpt2_merges(path=None) -> tuple[list[int], dict[tuple[int, int], int]]    # (byte_ids, merges)
# byte_bpe_encode(text, merges, byte_ids=None, special_tokens=None, pattern=GPT2_PATTERN) -> list[int]
# ```
#
# **Encoding.** `merges[(a, b)]` is the id of the token merged from ids `a` and `b`; merged ids grow in the order
# the merges were learned (a list from `byte_bpe_train` becomes `{p: 256 + k for k, p in enumerate(merges)}`).
# Cut the text like the trainer, but keep each special token (`special_tokens`: `{text: id}`) as its id. Turn each
# chunk's bytes into ids with `byte_ids` (`byte_ids[b]` is the id of byte `b`; `None` means `b` itself), then
# repeatedly take the adjacent pair with the **lowest merged id** and merge all its non-overlapping occurrences
# left to right, until no adjacent pair is in `merges`.
#
# **GPT-2's merges.** The ranks file `gpt2.tiktoken` (`path=None`: `llmcourse.data_path("gpt2-bpe",
# "gpt2.tiktoken")`) has one `base64(token bytes) rank` per line; a token's rank is its id. It holds the 256 single
# bytes (not numbered in byte order: `byte_ids[b]` is the rank of `bytes([b])`) and 50,000 merged tokens, but not
# *which two tokens* each was merged from. Recover that pair for every token, so that
# `byte_bpe_encode(text, merges, byte_ids, {"<|endoftext|>": 50256})` gives GPT-2's ids, exactly those of
# `tiktoken`. Read the file yourself (`base64` is in the standard library); do not use `tiktoken` here.

# %% tags=["solution:01.byte_bpe_encode"]
def gpt2_merges(path=None):
    ### BEGIN SOLUTION
    import base64

    if path is None:
        path = llmcourse.data_path("gpt2-bpe", "gpt2.tiktoken")
    ranks = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    byte_ids = [ranks[bytes([b])] for b in range(256)]
    merges = {}
    for token, rank in ranks.items():
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            k = min(range(len(parts) - 1), key=lambda k: ranks.get(parts[k] + parts[k + 1], math.inf))
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
        merges[(ranks[parts[0]], ranks[parts[1]])] = rank
    return byte_ids, merges
    ### END SOLUTION


def byte_bpe_encode(text, merges, byte_ids=None, special_tokens=None, pattern=GPT2_PATTERN):
    ### BEGIN SOLUTION
    pieces = [text]
    if special_tokens:
        by_length = sorted(special_tokens, key=len, reverse=True)
        pieces = regex.split("(" + "|".join(regex.escape(s) for s in by_length) + ")", text)
    ids = []
    for j, piece in enumerate(pieces):
        if j % 2 == 1:
            ids.append(special_tokens[piece])
            continue
        for chunk in regex.findall(pattern, piece):
            seq = list(chunk.encode("utf-8"))
            if byte_ids is not None:
                seq = [byte_ids[b] for b in seq]
            while len(seq) > 1:
                found = [(merges[p], p) for p in zip(seq, seq[1:]) if p in merges]
                if not found:
                    break
                new_id, (a, b) = min(found)
                out, k = [], 0
                while k < len(seq):
                    if k + 1 < len(seq) and seq[k] == a and seq[k + 1] == b:
                        out.append(new_id)
                        k += 2
                    else:
                        out.append(seq[k])
                        k += 1
                seq = out
            ids.extend(seq)
    return ids
    ### END SOLUTION


# %% tags=["tests:01.byte_bpe_encode"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("01.byte_bpe_encode")  # noqa: E702
### END HIDDEN TESTS
toy_table = {p: 256 + k for k, p in enumerate(toy_merges)}
assert byte_bpe_encode(" lower", toy_table) == [259, 114], f"' lower' is ' lowe' + 'r': {byte_bpe_encode(' lower', toy_table)}"
assert byte_bpe_encode(" lowest", toy_table) == [261], f"' lowest' is one token: {byte_bpe_encode(' lowest', toy_table)}"
gpt2_byte_ids, gpt2_table = gpt2_merges()
assert len(gpt2_byte_ids) == 256 and len(gpt2_table) == 50_000, (len(gpt2_byte_ids), len(gpt2_table))
assert gpt2_byte_ids[ord("!")] == 0 and gpt2_byte_ids[ord(" ")] == 220, "byte_ids[b] is the rank of bytes([b])"
eot = {"<|endoftext|>": 50256}
assert byte_bpe_encode("hello world", gpt2_table, gpt2_byte_ids) == [31373, 995]
assert byte_bpe_encode("Hi<|endoftext|>", gpt2_table, gpt2_byte_ids, eot) == [17250, 50256]
verdict_ids = byte_bpe_encode(verdict, gpt2_table, gpt2_byte_ids, eot)
assert verdict_ids[:10] == [40, 367, 2885, 1464, 1807, 3619, 402, 271, 10899, 2138], verdict_ids[:10]
assert len(verdict_ids) == 5145, f"GPT-2 cuts the-verdict into 5,145 tokens; got {len(verdict_ids):,}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `GPTWindowDataset` and `create_dataloader` (5 points)
#
# Next-token training pairs from one long stream of token ids:
#
# ```python
# class GPTWindowDataset(torch.utils.data.Dataset):
#     def __init__(self, token_ids, context_length, stride): ...   # token_ids: list[int] or 1-D tensor
#     def __len__(self) -> int: ...
#     def __getitem__(self, i) -> tuple[Tensor, Tensor]: ...        # (x, y), each long (context_length,)
#
# def create_dataloader(token_ids, batch_size, context_length, stride, shuffle=True, drop_last=True, seed=0): ...
# ```
#
# - Window `i` starts at `s = i · stride` and is `x = ids[s : s+L]`, `y = ids[s+1 : s+L+1]` (the target
#   is the input shifted left by one token, `L = context_length`). The dataset holds **every complete
#   window and no more**.
# - Store the ids as one `torch.long` tensor; raise `ValueError` when there is no complete window.
# - `create_dataloader` returns a `torch.utils.data.DataLoader` over that dataset with the given
#   `batch_size`, `shuffle` and `drop_last`, loading in the main process; its order depends only on
#   `seed`: the same seed always gives the same batches.

# %% tags=["solution:01.GPTWindowDataset"]
class GPTWindowDataset(Dataset):
    def __init__(self, token_ids, context_length, stride):
        ### BEGIN SOLUTION
        self.ids = torch.as_tensor(token_ids, dtype=torch.long)
        if len(self.ids) <= context_length:
            raise ValueError(f"{len(self.ids)} tokens cannot fill one window of {context_length} + 1 tokens")
        self.context_length = context_length
        self.starts = range(0, len(self.ids) - context_length, stride)
        ### END SOLUTION

    def __len__(self):
        ### BEGIN SOLUTION
        return len(self.starts)
        ### END SOLUTION

    def __getitem__(self, i):
        ### BEGIN SOLUTION
        s = self.starts[i]
        L = self.context_length
        return self.ids[s: s + L], self.ids[s + 1: s + L + 1]
        ### END SOLUTION


def create_dataloader(token_ids, batch_size, context_length, stride, shuffle=True, drop_last=True, seed=0):
    ### BEGIN SOLUTION
    dataset = GPTWindowDataset(token_ids, context_length, stride)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=0,
                      generator=torch.Generator().manual_seed(seed))
    ### END SOLUTION


# %% tags=["tests:01.GPTWindowDataset"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("01.GPTWindowDataset")  # noqa: E702
### END HIDDEN TESTS
ids = llmcourse.gpt2_encoding().encode(verdict)
ds = GPTWindowDataset(ids, context_length=4, stride=1)
assert len(ds) == 5141, f"5,145 tokens, L=4, stride=1 give 5,141 windows; got {len(ds)}"
x, y = ds[0]
assert x.tolist() == [40, 367, 2885, 1464] and y.tolist() == [367, 2885, 1464, 1807], (x, y)
assert x.dtype == torch.long and x.shape == (4,), f"x must be long (4,), got {x.dtype} {tuple(x.shape)}"
assert len(GPTWindowDataset(ids, 4, 4)) == 1286, "with stride 4 there are 1,286 windows"
xb, yb = next(iter(create_dataloader(ids, batch_size=8, context_length=4, stride=4)))
assert xb.shape == (8, 4) and torch.equal(xb[:, 1:], yb[:, :-1]), "batches (8, 4) with y shifted by one"
xb2, _ = next(iter(create_dataloader(ids, batch_size=8, context_length=4, stride=4)))
assert torch.equal(xb, xb2), "the same seed must give the same batches"
print("visible tests passed")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
# From unit 02 on, the course imports the finished versions from `llmcourse`
# (`llmcourse.CharTokenizer`, `llmcourse.byte_bpe_train`, `llmcourse.gpt2_merges`, `llmcourse.byte_bpe_encode`,
# `llmcourse.create_dataloader`; `llmcourse.gpt2_encoding()` is GPT-2's tokenizer as a `tiktoken.Encoding`).
