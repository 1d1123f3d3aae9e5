# %% [markdown]
# # Unit 01 — Tokenization: exercises
#
# Five graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: the worked examples of the lesson, 20 random small
# corpora, a replay of your merges (each one must have had the highest count at its step), the same
# corpus given in a different order, 200 random words, GPT-2's ids on real text and every item of
# several window datasets. When something fails it tells you what was expected, what came back and,
# if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/01_tokenization/01_tokenization.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use only `torch`, `math`, the standard library and,
# in exercise 4, `tiktoken`.

# %%
from collections import Counter

import tiktoken
import torch
from torch.utils.data import DataLoader, Dataset

import llmcourse

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
# ## Exercise 2 — `bpe_train` (6 points)
#
# ```python
# bpe_train(word_counts: dict[str, int], num_merges: int, end_of_word: str = "</w>") -> list[tuple[str, str]]
# ```
#
# The rules (exactly these; the grader replays them):
#
# 1. Each word starts as `list(word) + [end_of_word]`, e.g. `"old"` → `["o", "l", "d", "</w>"]`.
# 2. At each step, count every adjacent symbol pair over all words, **weighted by the word's count**.
#    Pairs never span two words.
# 3. Choose the pair with the highest count; **break ties by the lexicographically smallest pair**,
#    comparing `(left, right)` as Python string tuples (`min(tied_pairs)`). Do not rely on dict order.
# 4. Replace every non-overlapping occurrence of that pair by the merged symbol, scanning each word
#    left to right, and append the pair to the result.
# 5. Stop after `num_merges` merges, or earlier when no pair is left.
#
# Return the merges in the order they were learned.

# %% tags=["solution:01.bpe_train"]
def bpe_train(word_counts, num_merges, end_of_word="</w>"):
    ### BEGIN SOLUTION
    words = {w: list(w) + [end_of_word] for w in word_counts}
    merges = []
    for _ in range(num_merges):
        counts = Counter()
        for w, symbols in words.items():
            for pair in zip(symbols, symbols[1:]):
                counts[pair] += word_counts[w]
        if not counts:
            break
        top = max(counts.values())
        best = min(p for p, c in counts.items() if c == top)
        merges.append(best)
        for w, symbols in words.items():
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[w] = out
    return merges
    ### END SOLUTION


# %% tags=["tests:01.bpe_train"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("01.bpe_train")  # noqa: E702
### END HIDDEN TESTS
toy = {"old": 7, "older": 3, "finest": 9, "lowest": 4}
merges = bpe_train(toy, 100)
assert isinstance(merges, list) and all(isinstance(m, tuple) and len(m) == 2 for m in merges), \
    "return a list of (left, right) tuples"
assert merges[:3] == [("e", "s"), ("es", "t"), ("est", "</w>")], f"first three merges: {merges[:3]}"
assert merges[3] == ("l", "d"), (f"merge 4 is {merges[3]}: ('l', 'd') and ('o', 'l') tie at 10, and the rule takes "
                                 "the lexicographically smallest pair")
assert len(merges) == 15, f"the toy corpus needs 15 merges until every word is one symbol, got {len(merges)}"
assert bpe_train(dict(reversed(list(toy.items()))), 100) == merges, "the dict's order must not change the merges"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `bpe_encode_word` (3 points)
#
# ```python
# bpe_encode_word(word: str, merges: list[tuple[str, str]], end_of_word: str = "</w>") -> list[str]
# ```
#
# Start from `list(word) + [end_of_word]`. Repeatedly find, among the adjacent pairs of the current
# symbols, the one with the **lowest rank** (its index in `merges`), and merge all of its
# non-overlapping occurrences left to right. Stop when no adjacent pair is in `merges`. Words never
# seen in training work too: symbols that no merge covers simply stay apart.

# %% tags=["solution:01.bpe_encode_word"]
def bpe_encode_word(word, merges, end_of_word="</w>"):
    ### BEGIN SOLUTION
    ranks = {}
    for r, pair in enumerate(merges):
        ranks.setdefault(tuple(pair), r)
    symbols = list(word) + [end_of_word]
    while len(symbols) > 1:
        pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
        if not pairs:
            break
        best = min(pairs, key=lambda p: ranks[p])
        out, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                out.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out
    return symbols
    ### END SOLUTION


# %% tags=["tests:01.bpe_encode_word"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("01.bpe_encode_word")  # noqa: E702
### END HIDDEN TESTS
toy_merges = [("e", "s"), ("es", "t"), ("est", "</w>"), ("l", "d"), ("o", "ld"), ("f", "i"), ("fi", "n"),
              ("fin", "est</w>"), ("old", "</w>"), ("l", "o"), ("lo", "w"), ("low", "est</w>"), ("e", "r"),
              ("er", "</w>"), ("old", "er</w>")]
assert bpe_encode_word("lowest", toy_merges[:2]) == ["l", "o", "w", "est", "</w>"], bpe_encode_word("lowest", toy_merges[:2])
assert bpe_encode_word("newest", toy_merges) == ["n", "e", "w", "est</w>"], "an unseen word still gets subwords"
assert bpe_encode_word("aaa", [("a", "a")]) == ["aa", "a", "</w>"], "merge non-overlapping pairs, left to right"
for w in ["bold", "finer", "lowlands"]:
    assert "".join(bpe_encode_word(w, toy_merges)) == w + "</w>", "the symbols must spell the word plus the marker"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `load_gpt2_encoding` (3 points)
#
# ```python
# load_gpt2_encoding(path: str | None = None) -> tiktoken.Encoding
# ```
#
# Build GPT-2's tokenizer **without the network**, from the ranks file `gpt2.tiktoken` (one
# `base64(token) rank` per line: the 256 single bytes and 50,000 merges).
#
# - `path=None` means the course's copy, `llmcourse.data_path("gpt2-bpe", "gpt2.tiktoken")`.
# - The result is a `tiktoken.Encoding` named `"gpt2"` that encodes and decodes exactly like
#   `tiktoken.get_encoding("gpt2")`: the same ranks, GPT-2's pre-tokenisation pattern, the special token
#   `"<|endoftext|>"` with id 50256, and `n_vocab == 50257`.
# - Build the `Encoding` yourself (returning `llmcourse.gpt2_encoding()` does not count). tiktoken's own
#   modules (`tiktoken.load`, `tiktoken_ext.openai_public`) hold the pieces it is made of.

# %% tags=["solution:01.load_gpt2_encoding"]
def load_gpt2_encoding(path=None):
    ### BEGIN SOLUTION
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    if path is None:
        path = llmcourse.data_path("gpt2-bpe", "gpt2.tiktoken")
    ranks = load_tiktoken_bpe(str(path))
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    ### END SOLUTION


# %% tags=["tests:01.load_gpt2_encoding"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("01.load_gpt2_encoding")  # noqa: E702
### END HIDDEN TESTS
enc = load_gpt2_encoding()
assert enc.n_vocab == 50257 and enc.eot_token == 50256, f"n_vocab={enc.n_vocab}, eot_token={enc.eot_token}"
assert enc.encode("hello world") == [31373, 995], enc.encode("hello world")
assert enc.encode("Hi<|endoftext|>", allowed_special={"<|endoftext|>"})[-1] == 50256, "<|endoftext|> must be id 50256"
text = "naïve café 🙂"
assert enc.decode(enc.encode(text)) == text, "byte-level BPE round-trips any Unicode text"
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
# (`llmcourse.CharTokenizer`, `llmcourse.bpe_train`, `llmcourse.load_gpt2_encoding`,
# `llmcourse.create_dataloader`).
