# %% [markdown]
# # Unit 01 — Tokenization: characters, BPE and GPT-2's tokenizer
#
# A language model never sees letters. It sees a sequence of **token ids**: integers that index rows
# of an embedding table (unit 02). A **tokenizer** is the pair of functions that turns text into ids
# and ids back into text, and the set of possible tokens is its **vocabulary**.
#
# In this unit you will
#
# 1. compare word, character and subword tokenizers on real text: vocabulary size, sequence length,
#    and what happens to a word the tokenizer has never seen;
# 2. train **byte-pair encoding** (BPE) from scratch, with an end-of-word marker and a tie-break rule
#    that is written down (you will see why it has to be), and encode new words with the learned merges;
# 3. use GPT-2's **byte-level** BPE through `tiktoken`, offline: 50,257 ids, `<|endoftext|>` = 50256,
#    and why it can encode any string at all;
# 4. cut a token stream into next-token training pairs with a **sliding window** and a `DataLoader`.
#
# Every number quoted in the text is computed and checked (`assert`) in the cell next to it.

# %%
import collections
import os
import re
import time

import tiktoken
import torch

import llmcourse
from llmcourse.data import (
    BPETokenizer,
    CharTokenizer,
    GPTWindowDataset,
    WordTokenizer,
    bpe_encode_word,
    bpe_trace,
    bpe_train,
    create_dataloader,
    encode_with_specials,
    load_gpt2_encoding,
)
from llmcourse.viz.tokenization import show_bpe_stepper, show_sliding_window, show_tokenizer_comparison

cfg = llmcourse.setup_notebook("01")
verdict = llmcourse.load_text("the-verdict")            # Edith Wharton, "The Verdict" (1908)
shakespeare = llmcourse.load_text("tinyshakespeare")    # 40,000 lines of Shakespeare's plays
print(f"the-verdict: {len(verdict):,} characters   tinyshakespeare: {len(shakespeare):,} characters")
assert len(verdict) == 20_479 and len(shakespeare) == 1_115_394

# %% [markdown]
# ## 1. Why integer ids, and the simplest idea: one id per word
#
# A neural network computes with numbers, so the first step of every language model is a lookup
# table from pieces of text to integers. The most obvious piece is the **word**. Split the text on
# whitespace and count:

# %%
words = verdict.split()
print(f"the-verdict: {len(words):,} whitespace-separated words, {len(set(words)):,} distinct")
print("most common:", collections.Counter(words).most_common(8))
assert len(words) == 3_634 and len(set(words)) == 1_485

# %% [markdown]
# Splitting on whitespace glues punctuation to words (`"it."`, `"it,"` and `"it"` are three different
# entries). A slightly better word tokenizer treats each punctuation mark as a token of its own, with the
# regular expression `\w+|[^\w\s]` ("a run of letters and digits, or one character that is neither a
# letter nor a space"). Here it is in a few lines, with a special `<|unk|>` token for words that were not
# in the training text:

# %%
def word_split(text):
    return re.findall(r"\w+|[^\w\s]", text)


word_vocab = ["<|unk|>"] + sorted(set(word_split(verdict)))
word_to_id = {w: i for i, w in enumerate(word_vocab)}


def word_encode(text):
    return [word_to_id.get(w, 0) for w in word_split(text)]


sentence = "I had always thought Jack was learning to paint."
ids = word_encode(sentence)
print(ids)
print([word_vocab[i] for i in ids])

# %% [markdown]
# This works for text that looks like the training text, and fails in three ways that matter:
#
# * **The vocabulary is huge.** Every distinct word needs its own row in the embedding table. One short
#   story already has over a thousand; a play collection has more than ten thousand; a real corpus has
#   millions (names, numbers, typos, other languages).
# * **Unseen words are lost.** A typo such as "runing", or any word the story does not use, becomes
#   `<|unk|>`, and the model cannot even tell which word it was.
# * **Related words are unrelated ids.** "learn" and "learning" get two ids that share nothing, so the
#   model must learn about each separately.

# %%
for w in ["paint", "painting", "learn", "learning", "runing", "transformer"]:
    print(f"{w!r:15} -> id {word_to_id.get(w, 0):5d}  {'(unknown)' if w not in word_to_id else ''}")

shakespeare_words = set(word_split(shakespeare))
unknown = [w for w in word_split(shakespeare) if w not in word_to_id]
print(f"\nvocabulary built from the-verdict: {len(word_vocab):,} entries;"
      f" tinyshakespeare alone would need {len(shakespeare_words):,}")
print(f"encoding tinyshakespeare with the-verdict's vocabulary: {len(unknown) / len(word_split(shakespeare)):.0%}"
      " of its words become <|unk|>")
assert "runing" not in word_to_id and word_to_id["paint"] != word_to_id["painting"]

# %% [markdown]
# The course library holds the same idea as `llmcourse.data.WordTokenizer` (it also reserves
# `<|endoftext|>`), which the comparison widget below uses.
#
# ## 2. The opposite extreme: one id per character
#
# With characters the vocabulary is tiny and nothing is ever unknown, as long as the text uses the same
# alphabet. `CharTokenizer.from_text` sorts the distinct characters, so ids do not depend on where a
# character first appears (you will write this class in exercise 1):

# %%
char_tok = CharTokenizer.from_text(shakespeare)
print(f"vocab_size = {char_tok.vocab_size}")
print(repr("".join(char_tok.chars)))
ids = char_tok.encode("Hello, world!")
print(ids, "->", repr(char_tok.decode(ids)))
assert char_tok.vocab_size == 65 and len(ids) == 13
assert [char_tok.stoi[c] for c in "\n !Aaz"] == [0, 1, 2, 13, 39, 64]  # F01.5

# %% [markdown]
# The price is **sequence length**. "Hello, world!" costs 13 tokens, and all of tinyshakespeare costs
# 1,115,394. A transformer's attention compares every token with every other one, so its cost grows with
# the square of the sequence length, and a fixed context window (say 1,024 tokens) holds only about 1,000
# characters of text. Characters are also a weak unit of meaning: the model has to learn spelling before
# it can learn anything about words.
#
# ## 3. Subwords: the middle ground
#
# Subword tokenizers keep frequent words whole and split rare words into frequent pieces. GPT-2's
# tokenizer (section 7) shows it well: common words are single tokens, and a long rare word becomes a
# few meaningful parts.

# %%
enc = llmcourse.gpt2_encoding()   # GPT-2's tokenizer, built offline from the course's data files
for text in ["the", " learning", "modernization", " tokenization", " runing", " unhappiness"]:
    ids = enc.encode(text)
    print(f"{text!r:17} -> {[enc.decode([i]) for i in ids]}  {ids}")
assert [enc.decode([i]) for i in enc.encode("modernization")] == ["modern", "ization"]
assert len(enc.encode(" runing")) == 2  # the typo still gets tokens: ' run' + 'ing'

# %% [markdown]
# The typo "runing" is no longer a problem: it becomes `' run' + 'ing'`, two pieces the model knows well.
# How does a tokenizer decide which pieces to keep? Byte-pair encoding learns them from data.
#
# ## 4. Byte-pair encoding by hand
#
# BPE (Sennrich, Haddow and Birch, 2016, after a 1994 compression algorithm by Gage) starts from
# characters and repeatedly **merges the most frequent adjacent pair of symbols** into a new symbol.
# The list of merges, in the order they were learned, *is* the tokenizer.
#
# Take a toy corpus of four words with their counts. Each word starts as its characters plus an
# **end-of-word marker** `</w>`, so that a piece at the end of a word (the "est" of "finest") is a
# different symbol from the same letters inside a word (the "est" of "esteem").

# %%
toy = {"old": 7, "older": 3, "finest": 9, "lowest": 4}
start = {w: list(w) + ["</w>"] for w in toy}
for w, symbols in start.items():
    print(f"{w:7} x{toy[w]}: {symbols}")
alphabet = {s for symbols in start.values() for s in symbols}
print(f"{len(alphabet)} initial symbols: {sorted(alphabet)}")
assert len(alphabet) == 12

# %% [markdown]
# Count every adjacent pair, **weighted by the word's count**: the pair `('e', 's')` occurs once in
# "finest" (9 times) and once in "lowest" (4 times), so its count is 13.

# %%
def count_pairs(segmentation, word_counts):
    counts = collections.Counter()
    for w, symbols in segmentation.items():
        for pair in zip(symbols, symbols[1:]):
            counts[pair] += word_counts[w]
    return counts


counts = count_pairs(start, toy)
for pair, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
    print(f"{pair[0]:>4} {pair[1]:<5} {c}")
expected = {("e", "s"): 13, ("s", "t"): 13, ("t", "</w>"): 13, ("l", "d"): 10, ("o", "l"): 10, ("f", "i"): 9,
            ("i", "n"): 9, ("n", "e"): 9, ("d", "</w>"): 7, ("l", "o"): 4, ("o", "w"): 4, ("w", "e"): 4,
            ("d", "e"): 3, ("e", "r"): 3, ("r", "</w>"): 3}
assert dict(counts) == expected

# %% [markdown]
# **Which pair is the most frequent?** Three pairs tie at 13: `es`, `st` and `t</w>`. Many write-ups
# present "es" as *the* most frequent first pair; it is only one of three, and the algorithm is not
# defined until a **tie-break rule** is written down. Different rules give different tokenizers.
#
# The course's rule: among the pairs with the highest count, take the **lexicographically smallest**
# `(left, right)` tuple of Python strings, i.e. `min(tied_pairs)`. It does not depend on the order in
# which words happen to be stored. A popular alternative, "the first tied pair met while scanning the
# words" (what `max(counts, key=counts.get)` does with a Python dict), depends on that order.
# `bpe_trace` records every step of training under either rule; the two agree for three merges and
# then part ways:

# %%
course_rule = bpe_trace(toy, 15, tie_break="lexmin")
first_seen = bpe_trace(toy, 15, tie_break="first_seen")
print("step  tied pairs (count)                          course rule       first seen")
for k in range(15):
    a, b = course_rule[k], first_seen[k]
    tied = ", ".join("".join(p) for p in a.tied)
    print(f"{k + 1:4}  {tied:30} ({a.counts[a.next_merge]:2})   {str(a.next_merge):17} {b.next_merge}"
          + ("   <- differ" if a.next_merge != b.next_merge else ""))
diverge = [k + 1 for k in range(15) if course_rule[-1].merges[k] != first_seen[-1].merges[k]]
print("the merge lists differ at merges", diverge)
assert [k + 1 for k in range(15) if len(course_rule[k].tied) > 1] == [1, 2, 4, 6, 7, 10, 11, 13, 14]
assert diverge[0] == 4 and first_seen[-1].merges[3] == ("o", "l")

# %% [markdown]
# At merge 4, `ld` and `ol` tie at 10. The course rule merges `('l', 'd')` (since `'l' < 'o'`) and then
# `('o', 'ld')`; the first-seen rule merges `('o', 'l')` first, because "old" is the first word in the dict
# and `ol` is its first pair. From merge 13 on they differ again (`old`+`e` versus `e`+`r`).
#
# Step through it yourself: the stepper below shows the pair counts (the pair merged next is filled, the
# pairs tied with it are outlined), the segmentation of every word and the merges so far. Edit the corpus
# or switch the tie-break rule and watch the merge list change.

# %% tags=["nbval-ignore-output"]
show_bpe_stepper(toy)

# %% [markdown]
# ## 5. BPE training in code
#
# Training repeats three steps: count the pairs, choose one by the rule, and replace it everywhere.
# Replacing has one subtlety: in `a a a` the pair `(a, a)` occurs twice, overlapping. The rule is to
# scan left to right and merge **non-overlapping** occurrences, giving `aa a`.

# %%
def merge_pair(symbols, pair):
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def smallest_top_pair(counts):
    top = max(counts.values())
    return min(pair for pair, c in counts.items() if c == top)


def train_bpe(word_counts, num_merges, choose=smallest_top_pair):
    segmentation = {w: list(w) + ["</w>"] for w in word_counts}
    merges = []
    for _ in range(num_merges):
        counts = count_pairs(segmentation, word_counts)
        if not counts:          # every word is a single symbol: nothing left to merge
            break
        pair = choose(counts)
        merges.append(pair)
        segmentation = {w: merge_pair(s, pair) for w, s in segmentation.items()}
    return merges, segmentation


print(merge_pair(["a", "a", "a", "</w>"], ("a", "a")))
merges, seg = train_bpe(toy, 100)
print(f"{len(merges)} merges:", ["".join(m) for m in merges])
print("final segmentation:", seg)
assert merges == bpe_train(toy, 100)            # the library's version (exercise 2) agrees
assert len(merges) == 15 and all(len(s) == 1 for s in seg.values())
assert train_bpe(toy, 2)[1]["finest"] == ["f", "i", "n", "est", "</w>"]
assert train_bpe(toy, 12)[1] == {"old": ["old</w>"], "older": ["old", "e", "r", "</w>"],
                                 "finest": ["finest</w>"], "lowest": ["lowest</w>"]}

# %% [markdown]
# The merge list is an **ordered rank table**: merge 0 has rank 0, merge 1 rank 1, and so on. The
# vocabulary is the initial symbols plus one new symbol per merge, so `num_merges` directly sets the
# vocabulary size, a hyperparameter you choose.
#
# On real text the word counts come from whitespace-separated words. The profile sets how many merges
# to learn on the-verdict (`bpe_merges`: 100 under `ci`, 500 on a laptop):

# %%
verdict_counts = collections.Counter(verdict.split())
t0 = time.perf_counter()
verdict_merges = bpe_train(dict(verdict_counts), cfg["bpe_merges"])
print(f"{len(verdict_merges)} merges on {len(verdict_counts):,} distinct words in {time.perf_counter() - t0:.2f} s")
print("first 20:", ["".join(m) for m in verdict_merges[:20]])
print("last 10: ", ["".join(m) for m in verdict_merges[-10:]])
assert len(verdict_merges) == cfg["bpe_merges"]

# %% [markdown]
# ### Spot the bug: "just take the most frequent pair"
#
# The function below picks the most frequent pair the way many tutorials do. Run the cell. It trains on
# the toy corpus and compares with the documented rule, then trains twice on a corpus of anagrams
# (every word has the same letters and count, so ties are everywhere), once with the words in reverse
# order. A tokenizer must not depend on how a dict happens to be ordered. Which properties fail, and why?

# %%
def most_frequent_pair_buggy(counts):
    return max(counts, key=counts.get)


buggy = train_bpe(toy, 15, choose=most_frequent_pair_buggy)[0]
print("toy corpus, same merges as the course rule?", buggy == bpe_train(toy, 15),
      "| merge 4:", buggy[3], "instead of", bpe_train(toy, 15)[3])
anagrams = {"listen": 3, "silent": 3, "enlist": 3, "tinsel": 3}
reordered = dict(reversed(list(anagrams.items())))
a = train_bpe(anagrams, 10, choose=most_frequent_pair_buggy)[0]
b = train_bpe(reordered, 10, choose=most_frequent_pair_buggy)[0]
print("anagrams, same merges for both orders?", a == b)
print("first difference (merge, one order, other order):",
      next(((k + 1, x, y) for k, (x, y) in enumerate(zip(a, b)) if x != y), None))

# %% [markdown]
# `max` returns the *first* maximal key in the dict's iteration order, so ties go to whichever pair was
# counted first, and that depends on the order of the words. The fix is the documented rule: among the
# tied pairs, take `min`. Self-check:

# %%
def most_frequent_pair_fixed(counts):
    top = max(counts.values())
    return min(p for p, c in counts.items() if c == top)


assert train_bpe(toy, 15, choose=most_frequent_pair_fixed)[0] == bpe_train(toy, 15)
a = train_bpe(anagrams, 10, choose=most_frequent_pair_fixed)[0]
b = train_bpe(reordered, 10, choose=most_frequent_pair_fixed)[0]
assert a == b == bpe_train(anagrams, 10), "the fixed rule must not depend on the dict's order"
print("fixed: the course rule on the toy corpus, and the same merges for both orders of the anagrams")

# %% [markdown]
# ## 6. Encoding a word with the merges
#
# To encode a new word, start again from its characters plus `</w>` and apply merges **in rank order**:
# among the adjacent pairs of the current symbols, take the one with the lowest rank, merge it, and
# repeat until no adjacent pair is in the table. Words never seen in training still work, because
# characters that no merge covers simply stay single symbols.

# %%
def encode_word(word, merges):
    rank = {pair: r for r, pair in reversed(list(enumerate(merges)))}   # the first occurrence wins
    symbols = list(word) + ["</w>"]
    while True:
        candidates = [p for p in zip(symbols, symbols[1:]) if p in rank]
        if not candidates:
            return symbols
        symbols = merge_pair(symbols, min(candidates, key=rank.get))


for word, k in [("lowest", 2), ("lowest", 3), ("lowest", 12), ("newest", 15), ("finer", 15), ("bold", 15),
                ("older", 12)]:
    print(f"{word:7} with the first {k:2} merges -> {encode_word(word, merges[:k])}")
assert encode_word("lowest", merges[:2]) == ["l", "o", "w", "est", "</w>"]      # F01.2
assert encode_word("lowest", merges[:3]) == ["l", "o", "w", "est</w>"]
assert encode_word("newest", merges) == ["n", "e", "w", "est</w>"]            # never seen in training
assert encode_word("finer", merges) == ["fin", "er</w>"] and encode_word("bold", merges) == ["b", "old</w>"]
assert encode_word("aaa", [("a", "a")]) == ["aa", "a", "</w>"] and encode_word("aaaa", [("a", "a")]) == ["aa", "aa", "</w>"]
for word in ["lowest", "newest", "bolder", "aaaa"]:
    assert encode_word(word, merges) == bpe_encode_word(word, merges)         # the library (exercise 3)

# %% [markdown]
# Why rank order and not "leftmost pair first"? Because training applied the merges in rank order: a
# later merge was learned on text where the earlier merges had *already* been applied. Applying them in
# a different order can produce segmentations training never saw. A two-merge example makes it visible:

# %%
toy_merges = [("b", "c"), ("a", "b")]
leftmost = ["ab", "c", "</w>"]                 # what "merge the leftmost known pair first" produces
print("rank order:", encode_word("abc", toy_merges), "  leftmost first:", leftmost)
assert encode_word("abc", toy_merges) == ["a", "bc", "</w>"]

# %% [markdown]
# The merges learned on the-verdict segment its own frequent words into few pieces and unseen words into
# more:

# %%
for word in ["the", "picture", "Gisburn", "transformer", "unpaintable"]:
    print(f"{word:12} -> {bpe_encode_word(word, verdict_merges)}")

# %% [markdown]
# ## 7. Byte-level BPE: GPT-2's tokenizer
#
# Our BPE starts from *characters*. A character it never saw in training (an accent, a Chinese
# character, an emoji) has no symbol at all. GPT-2 (Radford et al., 2019) runs BPE on **bytes** instead:
# any text is first encoded as UTF-8, a sequence of values 0–255, and those 256 byte values are the
# initial symbols. Nothing can ever be unknown, because every string is a byte string.
#
# A common mistake is to call these "256 ASCII characters": ASCII has only 128 codes (0–127). The other
# 128 byte values occur inside multi-byte UTF-8 characters.
#
# GPT-2 learned 50,000 merges on top of the 256 bytes, and added one special token, `<|endoftext|>`,
# which marks the boundary between documents:
#
# $$256 \text{ bytes} + 50{,}000 \text{ merges} + 1 \text{ special token} = 50{,}257 \text{ token ids.}$$
#
# Two more details: GPT-2 first splits text with a regular expression into words, numbers, punctuation
# and whitespace runs (so merges never cross those boundaries, much like our `</w>`), and a leading space
# is part of the word (`' world'` is one token). The merges are stored as a **ranks file**, one
# `base64(token bytes) rank` per line. The course bundles it, and `load_gpt2_encoding` (exercise 4)
# builds a `tiktoken.Encoding` from it without the network:

# %%
enc = load_gpt2_encoding()
print(f"n_vocab = {enc.n_vocab:,}   eot_token = {enc.eot_token}   special tokens: {enc.special_tokens_set}")
print("ASCII codes:", 2 ** 7, "  byte values:", 2 ** 8)
assert enc.n_vocab == 50_257 == 256 + 50_000 + 1 and enc.eot_token == 50_256
assert all(len(enc.decode_single_token_bytes(i)) == 1 for i in range(256))   # the first 256 ranks: single bytes
assert len({enc.decode_single_token_bytes(i) for i in range(256)}) == 256    # ... all 256 different values

# %% [markdown]
# `tiktoken.get_encoding("gpt2")` is the usual way to get this tokenizer, but it downloads the files on
# first use; in an offline notebook without a populated cache it fails with a connection error. The
# course's files also fill tiktoken's cache folder, so the official call can be checked against ours
# (route (b) of the course's data notes: `TIKTOKEN_CACHE_DIR` pointing at a writable copy):

# %%
try:
    os.environ["TIKTOKEN_CACHE_DIR"] = str(llmcourse.data.tiktoken_cache_dir())
    official = tiktoken.get_encoding("gpt2")
except Exception as exc:  # no mirror and no network: nothing to compare with
    official = None
    print(f"tiktoken's own route is unavailable here ({type(exc).__name__}); skipping the comparison")
if official is not None:
    same_tokens = all(official.decode_single_token_bytes(i) == enc.decode_single_token_bytes(i)
                      for i in range(50_256))
    same_ids = official.encode(verdict) == enc.encode(verdict) and official.encode(shakespeare) == enc.encode(shakespeare)
    print(f"same 50,256 token byte strings: {same_tokens};  same ids on both texts: {same_ids}")
    assert same_tokens and same_ids and official.n_vocab == enc.n_vocab

# %% [markdown]
# Some worked examples. Note how the unusual word "Akwirw" falls apart into short known pieces, and how
# each Devanagari character of "नमस्ते" costs two tokens: GPT-2's merges were learned mostly on English,
# so its 18 UTF-8 bytes get few merges. (Unit 06 trains a language-specific BPE for this reason.)

# %%
examples = {"hello world": [31373, 995], "Building": [25954],
            "Your journey starts with one step": [7120, 7002, 4940, 351, 530, 2239],
            " Akwirw ier": [9084, 86, 343, 86, 220, 959]}
for text, expected_ids in examples.items():
    got = enc.encode(text)
    print(f"{text!r:38} -> {got}  {[enc.decode([i]) for i in got]}")
    assert got == expected_ids
namaste = "नमस्ते"
print(f"{namaste!r}: {len(namaste)} code points, {len(namaste.encode('utf-8'))} UTF-8 bytes, "
      f"{len(enc.encode(namaste))} GPT-2 tokens")
assert (len(namaste), len(namaste.encode("utf-8")), len(enc.encode(namaste))) == (6, 18, 12)

# %% [markdown]
# ### Special tokens
#
# `<|endoftext|>` is not text: it is a control signal with its own id. If ordinary text (say, a web page
# that discusses tokenizers) contained the characters `<|endoftext|>`, silently turning them into the
# control token would be a bug or a security hole. So `tiktoken` **refuses** to encode it unless you say
# that it is allowed:

# %%
text = "Hello, world! Attention is all you need.<|endoftext|>"
try:
    enc.encode(text)
except ValueError as err:
    print("ValueError:", str(err).splitlines()[0])
with_special = enc.encode(text, allowed_special={"<|endoftext|>"})
as_text = enc.encode(text, disallowed_special=())
print("allowed:       ", with_special)
print("as plain text: ", as_text[-7:], "(the characters <, |, endo, ...)")
assert with_special == [15496, 11, 995, 0, 47406, 318, 477, 345, 761, 13, 50256]            # F01.3
assert enc.encode("<|endoftext|>", disallowed_special=()) == [27, 91, 437, 1659, 5239, 91, 29]

# %% [markdown]
# Another common slip is misspelling the token, for example `</endoftext>` (the token is `<|endoftext|>`).
# `tiktoken` does not complain about an unknown name in `allowed_special`; it just encodes the text as
# ordinary pieces, and the document boundary silently disappears. The course helper
# `encode_with_specials` checks the names first:

# %%
print(enc.encode("The end.</endoftext>", allowed_special={"</endoftext>"}), "<- no 50256: silently plain text")
try:
    encode_with_specials(enc, "The end.</endoftext>", allowed_special={"</endoftext>"})
except ValueError as err:
    print("ValueError:", err)
assert encode_with_specials(enc, "The end.<|endoftext|>", allowed_special={"<|endoftext|>"})[-1] == 50256

# %% [markdown]
# ## 8. Comparing the tokenizers on real text
#
# Now all four side by side: word level (vocabulary from the same text, so nothing is unknown here),
# characters, our BPE trained on the-verdict, and GPT-2. "Characters per token" measures how much text
# one token carries; the higher, the more text fits in a fixed context window.

# %%
verdict_alphabet = {c for w in verdict_counts for c in w}   # every character the BPE saw in training
bpe_tok = BPETokenizer(verdict_merges, alphabet=verdict_alphabet)


def stats(name, n_tokens, vocab_size, text):
    print(f"  {name:28} {n_tokens:>10,} tokens  {len(text) / n_tokens:5.2f} chars/token  vocabulary {vocab_size:>6,}")
    return n_tokens


counts_by_text = {}
for label, text in [("the-verdict", verdict), ("tinyshakespeare", shakespeare)]:
    print(f"{label}: {len(text):,} characters, {len(text.split()):,} whitespace words")
    wt, ct = WordTokenizer.from_text(text), CharTokenizer.from_text(text)
    counts_by_text[label] = {
        "word": stats("word", len(wt.encode(text)), wt.vocab_size, text),
        "char": stats("character", len(ct.encode(text)), ct.vocab_size, text),
        "bpe": stats(f"course BPE ({len(verdict_merges)} merges)", len(bpe_tok.encode(text)), bpe_tok.vocab_size, text),
        "gpt2": stats("GPT-2", len(enc.encode(text)), enc.n_vocab, text),
    }
v, s = counts_by_text["the-verdict"], counts_by_text["tinyshakespeare"]
print(f"GPT-2 characters per token: the-verdict {len(verdict) / v['gpt2']:.2f}, tinyshakespeare {len(shakespeare) / s['gpt2']:.2f}")
assert v["gpt2"] == 5_145 and s["gpt2"] == 338_025 and s["char"] == 1_115_394 and v["char"] == 20_479
assert round(len(verdict) / v["gpt2"], 2) == 3.98 and round(len(shakespeare) / s["gpt2"], 2) == 3.30
assert enc.encode(verdict)[:10] == [40, 367, 2885, 1464, 1807, 3619, 402, 271, 10899, 2138]

# %% [markdown]
# Shakespeare's English (archaic words, verse line breaks, many short lines) packs less text into each
# GPT-2 token than Wharton's prose: 3.30 against 3.98 characters per token.
#
# **Tokens per word, and what the merges buy.** With zero merges our BPE is a character tokenizer plus
# one `</w>` per word, so it must produce exactly (non-space characters + words) tokens. Every merge can
# only shorten the sequence. Both facts are easy to check:

# %%
non_space = sum(1 for c in verdict if not c.isspace())
n_words = len(verdict.split())
lengths = {}
for n in [0, 10, 50, len(verdict_merges)]:
    tok_n = BPETokenizer(verdict_merges[:n], alphabet=verdict_alphabet)
    lengths[n] = len(tok_n.encode(verdict))
    print(f"{n:4} merges: {lengths[n]:6,} tokens = {lengths[n] / n_words:.2f} tokens per word")
print(f"GPT-2:       {v['gpt2']:6,} tokens = {v['gpt2'] / n_words:.2f} tokens per word")
assert lengths[0] == non_space + n_words
assert all(lengths[a] >= lengths[b] for a, b in zip(list(lengths), list(lengths)[1:]))

# %% [markdown]
# **Round trip on arbitrary text.** Decode(encode(text)) should give the text back. GPT-2's byte-level
# BPE does, for any string. Ours cannot: characters it never saw become `<|unk|>`, and splitting on
# whitespace forgets whether words were separated by a space, a newline or a tab.

# %%
probe = "Crème brûlée — 東京 🙂 नमस्ते\nnew line"
ours = bpe_tok.decode(bpe_tok.encode(probe))
theirs = enc.decode(enc.encode(probe))
print("course BPE:", repr(ours))
print("GPT-2:     ", repr(theirs))
assert theirs == probe and ours != probe and "<|unk|>" in ours

# %% [markdown]
# Try your own sentences in the comparison widget: each chip is one token (hover to see its id; grey
# chips are not in the vocabulary).

# %% tags=["nbval-ignore-output"]
first_sentence = verdict[: verdict.index(".") + 1]
show_tokenizer_comparison(first_sentence, word=WordTokenizer.from_text(verdict), char=CharTokenizer.from_text(verdict),
                          bpe=bpe_tok, gpt2=enc)

# %% [markdown]
# ## 9. From a token stream to training pairs
#
# A GPT is trained to predict the **next token**. Any stretch of text gives many such examples: after
# `I` comes `' HAD'`, after `I HAD` comes `' always'`, and so on.

# %%
ids = enc.encode(verdict)
for i in range(1, 5):
    context, target = ids[:i], ids[i]
    print(f"{enc.decode(context)!r:32} -> {enc.decode([target])!r}")

# %% [markdown]
# Training processes many positions at once. Cut the stream into windows of `context_length` L tokens:
# the input is `x = ids[s : s+L]`, and the target is the same window shifted left by one token,
# `y = ids[s+1 : s+L+1]`. Position `t` of `y` is the token that follows `x[: t+1]`, so one window holds L
# training examples. The window starts advance by a **stride**: stride 1 gives heavily overlapping windows,
# stride L gives disjoint ones. The last start must leave room for L + 1 tokens, so the starts are
# `range(0, len(ids) − L, stride)`.

# %%
ds1 = GPTWindowDataset(ids, context_length=4, stride=1)
ds4 = GPTWindowDataset(ids, context_length=4, stride=4)
x0, y0 = ds1[0]
print(f"stride 1: {len(ds1):,} windows   x0 = {x0.tolist()}   y0 = {y0.tolist()}   x1 = {ds1[1][0].tolist()}")
print(f"stride 4: {len(ds4):,} windows   x1 = {ds4[1][0].tolist()}   y1 = {ds4[1][1].tolist()}")
assert len(ds1) == 5_141 and len(ds4) == 1_286                                    # F01.4
assert x0.tolist() == [40, 367, 2885, 1464] and y0.tolist() == [367, 2885, 1464, 1807]
assert ds4[1][0].tolist() == [1807, 3619, 402, 271] and ds4[1][1].tolist() == [3619, 402, 271, 10899]
assert all(torch.equal(ds1[i][0][1:], ds1[i][1][:-1]) for i in range(len(ds1)))  # y is x shifted by one

# %% [markdown]
# The widget shows the windows over the first 40 GPT-2 tokens of the-verdict: each input row (blue) and
# its target row (orange) one position to the right. Hatched cells are shared with the previous window.

# %% tags=["nbval-ignore-output"]
show_sliding_window([enc.decode([i]) for i in ids[:40]])

# %% [markdown]
# ### Spot the bug: the missing last window
#
# Here is a window count with a plausible-looking range. Run it and compare with the formula: with
# stride 1 the last window should end exactly at the end of the text, so its target's last token must be
# the text's last token.

# %%
L = 4
buggy_starts = range(0, len(ids) - L - 1, 1)
last = buggy_starts[-1]
print(f"{len(buggy_starts):,} windows; the last target ends at token {last + L + 1} of {len(ids)}")
print("is the last token of the text ever a target?", last + L + 1 == len(ids))

# %% [markdown]
# The range stops one start too early (5,140 windows), so the text's final token is never a target. The
# start `s` is valid as long as `s + L + 1 ≤ len(ids)`, i.e. `s < len(ids) − L`: `range(0, len(ids) − L,
# stride)`. Self-check:

# %%
fixed_starts = range(0, len(ids) - L, 1)
assert len(fixed_starts) == len(ds1) == 5_141 and fixed_starts[-1] + L + 1 == len(ids)
print("fixed: 5,141 windows, and the last target ends at the last token")

# %% [markdown]
# Finally, a `DataLoader` groups windows into batches of shape `(batch_size, context_length)`. Shuffling
# uses its own seeded `torch.Generator`, so the same seed always gives the same batches:

# %%
loader = create_dataloader(ids, batch_size=8, context_length=4, stride=4, shuffle=True, seed=0)
xb, yb = next(iter(loader))
print(xb.shape, xb.dtype, "\n", xb, "\n", yb)
again = next(iter(create_dataloader(ids, batch_size=8, context_length=4, stride=4, shuffle=True, seed=0)))
assert xb.shape == (8, 4) and xb.dtype == torch.long and torch.equal(xb[:, 1:], yb[:, :-1])
assert torch.equal(again[0], xb), "same seed, same batches"
print(f"{len(loader)} batches of 8 (drop_last=True drops the last {len(ds4) % 8} windows)")
assert len(loader) == len(ds4) // 8

# %% [markdown]
# ## Summary
#
# * Word tokenizers need huge vocabularies and lose unseen words; character tokenizers never lose
#   anything but make sequences 3–4 times longer. Subword tokenizers sit in between.
# * BPE learns merges by repeatedly joining the most frequent adjacent pair (weighted by word counts,
#   never across words, non-overlapping left to right). Ties are common, so the tie-break rule is part of
#   the algorithm; the course uses the lexicographically smallest pair.
# * Encoding applies the merges in rank order; unseen words fall back to smaller pieces.
# * GPT-2's byte-level BPE starts from the 256 byte values, so it encodes any string:
#   256 + 50,000 + 1 = 50,257 ids, with `<|endoftext|>` = 50256 accepted only when explicitly allowed.
# * A sliding window turns a token stream into `(x, y)` pairs with `y` = `x` shifted by one;
#   `range(0, len − L, stride)` gives every complete window.
#
# Next: the exercises (`exercises/01_tokenization/01_tokenization.ipynb`). From unit 02 on the course
# imports these pieces from `llmcourse` (`llmcourse.gpt2_encoding()`, `llmcourse.create_dataloader`).
