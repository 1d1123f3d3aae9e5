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
import random
import re
import time

import regex
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
from llmcourse.data.tokenizers import merge_pair
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
print(f'"Hello, world!" costs {len(ids)} tokens; all of tinyshakespeare costs {len(char_tok.encode(shakespeare)):,}')
assert char_tok.vocab_size == 65 and len(ids) == 13
assert [char_tok.stoi[c] for c in "\n !Aaz"] == [0, 1, 2, 13, 39, 64]

# %% [markdown]
# The price is **sequence length**: one token per character, as the last line above counts. A transformer's attention compares every token with every other one, so its cost grows with
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
# "finest" (9 times) and once in "lowest" (4 times), so its count is 9 + 4. The cell lists every pair
# with its count and, last, the pairs that share the highest count.

# %%
counts = bpe_trace(toy, 0)[0].counts              # the pair counts before the first merge
for pair, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
    print(f"{pair[0]:>4} {pair[1]:<5} {c}")
top_count = max(counts.values())
top_pairs = sorted("".join(p) for p, c in counts.items() if c == top_count)
print(f"{len(top_pairs)} pairs share the highest count, {top_count}: {', '.join(top_pairs)}")
expected = {("e", "s"): 13, ("s", "t"): 13, ("t", "</w>"): 13, ("l", "d"): 10, ("o", "l"): 10, ("f", "i"): 9,
            ("i", "n"): 9, ("n", "e"): 9, ("d", "</w>"): 7, ("l", "o"): 4, ("o", "w"): 4, ("w", "e"): 4,
            ("d", "e"): 3, ("e", "r"): 3, ("r", "</w>"): 3}
assert dict(counts) == expected

# %% [markdown]
# **Which pair is the most frequent?** The last line above answers it: no single pair; `es`, `st` and
# `t</w>` tie. Many write-ups present "es" as *the* most frequent first pair; it is only one of the tied
# pairs, and the algorithm is not
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
# At the first merge where the lists part (printed above), `ld` and `ol` tie. The course rule merges
# `('l', 'd')` (since `'l' < 'o'`) and then `('o', 'ld')`; the first-seen rule merges `('o', 'l')` first,
# because "old" is the first word in the dict and `ol` is its first pair. The later differences (the table
# marks them) come from another such tie (`old`+`e` versus `e`+`r`).
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

#
# Training stops early when every word has become a single symbol (no pair is left to count). The exercises
# write the byte-level version of this trainer (section 9); here we use the course's finished character version,
# `bpe_train(word_counts, num_merges)`,
# which returns the merges in the order learned, and `bpe_trace`, which also keeps the segmentation of
# every word after each step. `merge_pair` is the replacement step on its own.

# %%
print(merge_pair(["a", "a", "a", "</w>"], ("a", "a")))
merges = bpe_train(toy, 100)
seg = bpe_trace(toy, 100)[-1].segmentation
print(f"{len(merges)} merges:", ["".join(m) for m in merges])
print("final segmentation:", seg)
assert merge_pair(["a", "a", "a", "</w>"], ("a", "a")) == ["aa", "a", "</w>"]
assert len(merges) == 15 and all(len(s) == 1 for s in seg.values())
assert bpe_trace(toy, 2)[-1].segmentation["finest"] == ["f", "i", "n", "est", "</w>"]
assert bpe_trace(toy, 12)[-1].segmentation == {"old": ["old</w>"], "older": ["old", "e", "r", "</w>"],
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
# ### Why the tie-break must be written down
#
# The function below picks the pair to merge the way many tutorials do. Run the cell. It replays every
# training step of a corpus of anagrams (every word has the same letters and count, so ties are
# everywhere): at each step it gives the rule the pair counts in the order they were met, and the same
# counts in reverse order. A tokenizer must not depend on how a dict happens to be ordered.

# %%
def most_frequent_pair_buggy(counts):
    return max(counts, key=counts.get)


anagrams = {"listen": 3, "silent": 3, "enlist": 3, "tinsel": 3}
anagram_steps = bpe_trace(anagrams, 10)           # the course rule's steps: counts and the pair it picks


def replay(choose):
    """(step, course pair, pair from the counts as met, pair from the reversed counts) where they differ."""
    bad = []
    for k, state in enumerate(anagram_steps[:-1]):
        forward, backward = choose(dict(state.counts)), choose(dict(reversed(list(state.counts.items()))))
        if not (forward == backward == state.next_merge):
            bad.append((k + 1, state.next_merge, forward, backward))
    return bad


for step, want, forward, backward in replay(most_frequent_pair_buggy)[:3]:
    print(f"step {step}: course rule {want}; buggy rule {forward} (counts as met), {backward} (reversed)")

# %% [markdown]
# `max` returns the *first* maximal key in the dict's iteration order, so ties go to whichever pair was
# counted first, and that depends on the order of the words. The course's rule does not: the highest
# count wins, and among tied pairs the smallest `(left, right)` tuple. The byte-level trainer of exercise 3
# follows the same rule on pairs of ids; its check trains on texts full of ties.

# %% [markdown]
# ## 6. Encoding a word with the merges
#
# To encode a new word, start again from its characters plus `</w>` and apply merges **in rank order**:
# among the adjacent pairs of the current symbols, take the one with the lowest rank, merge it, and
# repeat until no adjacent pair is in the table. Words never seen in training still work, because
# characters that no merge covers simply stay single symbols. Exercise 4's byte-level encoder follows the same
# rank rule on ids; the course's character version is `bpe_encode_word(word, merges)`.

# %%
encode_word = bpe_encode_word
for word, k in [("lowest", 2), ("lowest", 3), ("lowest", 12), ("newest", 15), ("finer", 15), ("bold", 15),
                ("older", 12)]:
    print(f"{word:7} with the first {k:2} merges -> {encode_word(word, merges[:k])}")
assert encode_word("lowest", merges[:2]) == ["l", "o", "w", "est", "</w>"]
assert encode_word("lowest", merges[:3]) == ["l", "o", "w", "est</w>"]
assert encode_word("newest", merges) == ["n", "e", "w", "est</w>"]            # never seen in training
assert encode_word("finer", merges) == ["fin", "er</w>"] and encode_word("bold", merges) == ["b", "old</w>"]
assert encode_word("aaa", [("a", "a")]) == ["aa", "a", "</w>"] and encode_word("aaaa", [("a", "a")]) == ["aa", "aa", "</w>"]

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
# `base64(token bytes) rank` per line. The course bundles it, and `load_gpt2_encoding` builds a
# `tiktoken.Encoding` from it without the network. (The file lists each token's bytes, not which two tokens
# each merge joined: exercise 4 recovers those pairs and encodes with them, to tiktoken's ids.)

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
# many tokens the Devanagari word "नमस्ते" costs per character (the last line counts its code points, UTF-8
# bytes and tokens): GPT-2's merges were learned mostly on English, so those bytes get few merges. (Unit 06 trains a language-specific BPE for this reason.)

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
assert with_special == [15496, 11, 995, 0, 47406, 318, 477, 345, 761, 13, 50256]
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
# GPT-2 token than Wharton's prose (the last line printed above).
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
# ## 9. Byte-level BPE on the course's text, and the classic pitfalls
#
# The round trip above failed for two reasons: characters never seen in training, and whitespace lost by
# `split()`. GPT-2's design removes both, and we can rebuild it with the pieces we have.
#
# **Pre-tokenization.** GPT-2 first cuts text with a regular expression into runs of letters, runs of
# digits and runs of other symbols, each allowed to carry **one leading space**, runs of whitespace (which
# take no extra space: before a word, a run of spaces leaves its last space to that word), plus the English
# contractions (`'s`, `'t`, `'re`, …). Merges never cross those boundaries (the job `</w>` does
# in our BPE), and because the space sits *in front of* a word, nothing is lost: joining the pieces gives
# the text back. The pattern below is GPT-2's (it needs the `regex` package for `\p{L}`, "any letter",
# and `\p{N}`, "any digit"). If it is the same split tiktoken uses, encoding the pieces one by one gives
# exactly GPT-2's ids for the whole text:

# %%
GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
pieces = GPT2_SPLIT.findall(verdict)
print(f"{len(pieces):,} pieces; the first 12: {pieces[:12]}")
print(GPT2_SPLIT.findall("It's 2024, and   she said: héllo!\n"))
assert "".join(pieces) == verdict, "nothing is lost"
spaced = GPT2_SPLIT.findall("a   b")
print("'a   b' (three spaces) ->", spaced)
assert spaced == ["a", "  ", " b"]   # the whitespace run keeps two spaces, the word takes the third
assert [t for piece in pieces for t in enc.encode(piece)] == enc.encode(verdict), "the same split as tiktoken's"

# %% [markdown]
# **Bytes as the alphabet.** Each piece becomes its UTF-8 bytes. To reuse our string-based trainer, every
# byte is shown as one printable character: printable ASCII stays itself, every other byte `b` becomes the
# character `chr(256 + b)` (so the space, byte 32, shows as `Ġ`, the same symbol GPT-2's vocabulary files
# use). Now train the course's `bpe_train` on the pieces of the-verdict with **no** end-of-word marker (the
# pre-tokenizer already fixes the boundaries), with as many merges as before:

# %%
def byte_symbols(piece):
    """The UTF-8 bytes of `piece`, one printable character per byte."""
    return "".join(chr(b) if 33 <= b <= 126 else chr(256 + b) for b in piece.encode("utf-8"))


def symbols_to_text(symbols):
    raw = bytes(ord(c) if ord(c) < 256 else ord(c) - 256 for c in "".join(symbols))
    return raw.decode("utf-8", errors="replace")


piece_counts = collections.Counter(byte_symbols(piece) for piece in pieces)
t0 = time.perf_counter()
byte_merges = bpe_train(dict(piece_counts), cfg["bpe_merges"], end_of_word=None)
print(f"{len(byte_merges)} byte-level merges on {len(piece_counts):,} distinct pieces in {time.perf_counter() - t0:.2f} s")
print("first 20:", ["".join(m) for m in byte_merges[:20]])
byte_vocab = 256 + len({"".join(m) for m in byte_merges})
print(f"vocabulary: 256 bytes + {byte_vocab - 256} merged symbols = {byte_vocab}")
leading_space = sum("".join(m).startswith("Ġ") for m in byte_merges)
print(f"{leading_space} of the {len(byte_merges)} merged symbols start with a space")

# %% [markdown]
# The space-led symbols (`Ġt`, `Ġthe`, …) are the "leading space is part of the word" rule learned from
# data. And now nothing is unknown: a piece never seen in training falls back to bytes, every one of which
# is in the vocabulary, and decoding the bytes gives the text back exactly:

# %%
for text in ["the picture", " 東京🙂", "Crème brûlée\n"]:
    symbols = [sym for piece in GPT2_SPLIT.findall(text)
               for sym in bpe_encode_word(byte_symbols(piece), byte_merges, end_of_word=None)]
    print(f"{text!r:18} -> {len(symbols):2} tokens {symbols}")
    assert symbols_to_text(symbols) == text

# %% [markdown]
# ### Byte-level BPE on integer ids, and the cost of counting
#
# Showing bytes as characters was a detour so that our string trainer could run. Real byte-level tokenizers work on
# **integer ids**: a chunk is its list of bytes, the ids 0–255, and merge `k` creates the new id `256 + k`.
# Special tokens such as `<|endoftext|>` are cut out of the text before the pattern runs, so no merge ever
# learns their bytes.
#
# The loop above also counts every pair of the whole corpus again at every merge. Yet a merge changes only the
# chunks that hold the merged pair; every other chunk's pairs, and so most counts, stay as they were. Keeping,
# for each pair, its count *and* the set of chunks that hold it lets a merge visit those chunks alone and update
# the counts from them. Exercises 2 and 3 build exactly this. Here are the course's versions, first the work
# each merge does on the-verdict (exact counts, from `training_work`):

# %%
from llmcourse.data import bytebpe

work = bytebpe.training_work(verdict, cfg["bpe_merges"])
visits_incremental = sum(work["touched"])
visits_naive = work["chunks"] * len(work["touched"])
print(f"{work['chunks']:,} distinct chunks; {len(work['touched'])} merges")
print(f"chunks visited: full recount {visits_naive:,}, incremental {visits_incremental:,} "
      f"({visits_naive / visits_incremental:.0f}x fewer); the busiest merge visits {max(work['touched']):,} chunks")
assert visits_incremental < visits_naive and max(work["touched"]) <= work["chunks"]

# %% [markdown]
# Both loops learn the same merges (the cell checks it); the incremental one does far less work. The timing
# below measures the two on this machine, now: on a shared or busy CPU the ratio moves several-fold, so read it
# as an order of magnitude, not as a number to plan with. The visit counts above are exact and do not move.

# %% tags=["nbval-ignore-output"]
n_merges = cfg["bpe_merges"]
assert llmcourse.byte_bpe_train(verdict, n_merges) == bytebpe.byte_bpe_train_naive(verdict, n_merges)
seconds = {"incremental": [], "full recount": []}
for _ in range(2):  # interleaved, best of two
    for label, trainer in [("incremental", llmcourse.byte_bpe_train), ("full recount", bytebpe.byte_bpe_train_naive)]:
        t0 = time.perf_counter()
        trainer(verdict, n_merges)
        seconds[label].append(time.perf_counter() - t0)
best = {label: min(ts) for label, ts in seconds.items()}
print(f"{n_merges} merges on the-verdict: " + ", ".join(f"{k} {v:.3f} s" for k, v in best.items())
      + f"; full recount / incremental = {best['full recount'] / best['incremental']:.1f}x (this machine, now)")

# %% [markdown]
# ### Spot the bug: printing tokens as they arrive
#
# A model generates one token at a time, and a chat interface prints each as it comes. The quick way
# decodes every token on its own, `enc.decode([i])`. A GPT-2 token is a run of **bytes**, though, and a
# character outside ASCII takes 2 to 4 bytes that can land in different tokens: decoded alone, each half
# becomes the replacement character `�`.

# %%
stream_texts = ["नमस्ते", "Crème brûlée 🙂", "東京タワー"]


def stream_quick(token_ids):
    for i in token_ids:
        yield enc.decode([i])


for text in stream_texts:
    chunks = list(stream_quick(enc.encode(text)))
    print(f"{text!r:18} -> {''.join(chunks)!r}  ({sum(c.count(chr(0xFFFD)) for c in chunks)} replacement characters)")
assert "".join(stream_quick(enc.encode(stream_texts[0]))) != stream_texts[0]

# %% [markdown]
# **Your fix.** `stream_text(token_ids)` yields one string per token: everything that the bytes received
# so far complete and that was not printed yet (an empty string while a character is still incomplete).
# Joined, the pieces give the text back. `enc.decode_single_token_bytes(i)` gives the bytes of one token.
# The self-check compares, after every token, what was printed with the longest complete UTF-8 prefix of
# the bytes so far.

# %%
def stream_text(token_ids):
    # TODO: never print half a character, never hold back a complete one
    for i in token_ids:
        yield enc.decode([i])


def longest_text_prefix(raw):
    """The longest prefix of `raw` that is complete UTF-8, decoded (a character has at most 4 bytes)."""
    for cut in range(len(raw), max(len(raw) - 4, 0) - 1, -1):
        try:
            return raw[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


def self_check_stream(stream):
    for text in stream_texts + ["plain ASCII", verdict[:300]]:
        token_ids = enc.encode(text)
        shown, raw = "", b""
        for k, chunk in enumerate(stream(token_ids)):
            shown += chunk
            raw += enc.decode_single_token_bytes(token_ids[k])
            if shown != longest_text_prefix(raw):
                print(f"✗ not yet: {text!r} after token {k + 1}: printed {shown!r}, expected {longest_text_prefix(raw)!r}")
                return False
        if shown != text:
            print(f"✗ not yet: {text!r} printed as {shown!r}")
            return False
    print("✓ every character printed once, as soon as its last byte arrives")
    return True


self_check_stream(stream_text)

# %% jupyter={"source_hidden": true}
# Reference fix (folded): an incremental UTF-8 decoder keeps an incomplete character's bytes until the
# rest arrives.
import codecs


def stream_text_reference(token_ids):
    decoder = codecs.getincrementaldecoder("utf-8")()
    for i in token_ids:
        yield decoder.decode(enc.decode_single_token_bytes(i))


assert self_check_stream(stream_text_reference)

# %% [markdown]
# **Pitfalls a byte-level tokenizer brings (measured on GPT-2's).**
#
# * *Digits.* Numbers are split into whatever digit runs happened to be frequent, so the same digits can
#   become different tokens in different numbers, which makes arithmetic harder to learn (later models
#   split numbers into single digits or fixed groups of three).
# * *Leading spaces.* `"hello"` and `" hello"` are different tokens with unrelated ids; a prompt that ends
#   with a space forces the model to continue with a rare space-less token.
# * *Case variants.* `Hello`, `hello` and `HELLO` share nothing: different ids, even different counts.
# * *Glitch tokens.* The merges were learned on one data set and the model trained on another: a few
#   strings (user names from a counting forum, for example) are single tokens that the model almost never
#   saw in training, and their embeddings stayed near where they started. Asking GPT-2-era models to repeat
#   them produced famously strange output.

# %%
def show_tokens(text):
    ids_ = enc.encode(text)
    return f"{text!r:22} {len(ids_)} tokens {[enc.decode([i]) for i in ids_]} {ids_}"


for text in ["2024", "2025", "12345", " 12345", "1234567"]:
    print("digits    ", show_tokens(text))
for text in ["hello", " hello", "Hello", "HELLO", " HELLO"]:
    print("space/case", show_tokens(text))
for text in [" SolidGoldMagikarp", " TheNitromeFan", " davidjl"]:
    print("glitch    ", show_tokens(text))
assert enc.encode("hello") != enc.encode(" hello") and len(enc.encode(" SolidGoldMagikarp")) == 1
assert len({len(enc.encode(t)) for t in ["Hello", "HELLO"]}) == 2

# %% [markdown]
# **WordPiece and Unigram.** BPE is not the only subword algorithm. Unit 07 calls its classifier
# "BERT-style"; BERT uses **WordPiece**, which builds its vocabulary by merging too, but picks the pair
# that most increases the likelihood of the training data (roughly, the count of the pair divided by the
# counts of its two parts), marks pieces that continue a word with `##` (`un ##believ ##able`), and
# encodes a word greedily, longest vocabulary match first, instead of replaying merges. **Unigram**
# (SentencePiece, used by T5 and many multilingual models) goes the other way: it starts from a large set
# of candidate pieces, fits a unigram language model, and repeatedly drops the pieces whose loss hurts the
# likelihood least; it encodes with the most probable segmentation (Viterbi). In unit 07 the course keeps
# GPT-2's tokenizer; the extension at the end of this lesson lets you write WordPiece's encoder.

# %% [markdown]
# ## 10. From a token stream to training pairs
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
# stride L gives disjoint ones. A window counts only if both its `x` and its `y` are complete.

# %%
ds1 = GPTWindowDataset(ids, context_length=4, stride=1)
ds4 = GPTWindowDataset(ids, context_length=4, stride=4)
x0, y0 = ds1[0]
print(f"stride 1: {len(ds1):,} windows   x0 = {x0.tolist()}   y0 = {y0.tolist()}   x1 = {ds1[1][0].tolist()}")
print(f"stride 4: {len(ds4):,} windows   x1 = {ds4[1][0].tolist()}   y1 = {ds4[1][1].tolist()}")
assert len(ds1) == 5_141 and len(ds4) == 1_286
assert x0.tolist() == [40, 367, 2885, 1464] and y0.tolist() == [367, 2885, 1464, 1807]
assert ds4[1][0].tolist() == [1807, 3619, 402, 271] and ds4[1][1].tolist() == [3619, 402, 271, 10899]
assert all(torch.equal(ds1[i][0][1:], ds1[i][1][:-1]) for i in range(len(ds1)))  # y is x shifted by one

# %% [markdown]
# The widget shows the windows over the first 40 GPT-2 tokens of the-verdict: each input row (blue) and
# its target row (orange) one position to the right. Hatched cells are shared with the previous window.

# %% tags=["nbval-ignore-output"]
show_sliding_window([enc.decode([i]) for i in ids[:40]])

# %% [markdown]
# ### Spot the bug: a validation split
#
# To see overfitting, part of the text is held out for validation: the model must never train on it. A
# tempting way is below: make all windows, shuffle them, keep 10 % for validation. Run it on token
# **positions** (`torch.arange(n)` in place of the ids), so that every window says which positions of the
# text it reads, and look at what the two sides share:

# %%
def split_windows_shuffled(token_ids, L, stride, val_fraction=0.1, seed=0):
    ds = GPTWindowDataset(token_ids, L, stride)
    order = list(range(len(ds)))
    random.Random(seed).shuffle(order)
    n_val = int(len(ds) * val_fraction)
    return [ds[i] for i in order[n_val:]], [ds[i] for i in order[:n_val]]


def positions_read(windows):
    """The positions of the text that a collection of (x, y) windows reads."""
    return {p for k in range(len(windows)) for p in torch.cat(windows[k]).tolist()}


train_w, val_w = split_windows_shuffled(torch.arange(len(ids)), 4, 1)
shared = positions_read(train_w) & positions_read(val_w)
print(f"{len(val_w)} validation windows read {len(positions_read(val_w)):,} positions; "
      f"{len(shared):,} of them are also read by training windows")
assert len(shared) > 0.9 * len(positions_read(val_w))

# %% [markdown]
# **Your fix.** `split_windows(token_ids, L, stride, val_fraction)` returns `(train, val)`, two
# collections of `(x, y)` windows (anything with `len` and indexing) such that no position of the text is
# read by both, every window is a valid pair (`y` is `x` shifted by one token), and the validation windows
# read about `val_fraction` of the text. The self-check runs it on positions with several `L` and strides.

# %%
def split_windows(token_ids, L, stride, val_fraction=0.1):
    # TODO: no position may be read by a training window and a validation window
    return split_windows_shuffled(token_ids, L, stride, val_fraction)


def self_check_split(split):
    n = len(ids)
    for L_, stride in [(4, 1), (4, 4), (16, 3)]:
        train, val = split(torch.arange(n), L_, stride, 0.1)
        pairs = [train[k] for k in range(len(train))] + [val[k] for k in range(len(val))]
        valid = all(len(x) == L_ and torch.equal(x + 1, y) for x, y in pairs)
        overlap = len(positions_read(train) & positions_read(val))
        share = len(positions_read(val)) / n
        if not (valid and overlap == 0 and 0.05 <= share <= 0.15 and len(train) > 0):
            print(f"✗ not yet: L={L_}, stride={stride}: valid windows {valid}, {overlap:,} positions read by both, "
                  f"validation reads {share:.0%} of the text")
            return False
    print("✓ training and validation windows read disjoint parts of the text")
    return True


self_check_split(split_windows)

# %% jupyter={"source_hidden": true}
# Reference fix (folded): with stride 1, neighbouring windows share all but one of their tokens, so after a
# shuffle nearly every position a validation window reads is also read by some training window. Cut the token
# stream once, then make the windows on each side of the cut.
def split_windows_reference(token_ids, L, stride, val_fraction=0.1):
    cut = int(len(token_ids) * (1 - val_fraction))
    return GPTWindowDataset(token_ids[:cut], L, stride), GPTWindowDataset(token_ids[cut:], L, stride)


assert self_check_split(split_windows_reference)

# %% [markdown]
# Finally, a `DataLoader` groups windows into batches of shape `(batch_size, context_length)`. Its order
# depends on its `seed` only, so the same seed always gives the same batches:

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
#   only complete windows count.
#
# * Byte-level BPE splits text with a regular expression (leading spaces kept), uses the 256 bytes as its
#   alphabet and never meets an unknown symbol; its pitfalls are digits, leading spaces, case variants and
#   glitch tokens.
# * Real byte-level tokenizers merge integer ids (bytes 0–255, then one new id per merge) and cut special tokens
#   out before training. A merge changes only the chunks that hold its pair, so training keeps each pair's count
#   and the chunks holding it and updates both from those chunks, instead of recounting the corpus every merge. WordPiece (BERT) and Unigram (SentencePiece) are the other two common algorithms.
#
# Next: the exercises (`exercises/01_tokenization/01_tokenization.ipynb`). From unit 02 on the course
# imports these pieces from `llmcourse` (`llmcourse.gpt2_encoding()`, `llmcourse.create_dataloader`).
#
# ## Open-ended extension (ungraded): WordPiece's encoder
#
# Write `wordpiece_encode(word, vocab)`: starting at the beginning of the word, take the **longest** prefix
# that is in `vocab`, emit it, and continue from where it ended; every piece after the first is looked up
# with a `##` in front (`"##able"`). If at some point no prefix matches, the whole word becomes `"[UNK]"`.
# Then try it with a vocabulary built from the-verdict's merges, and think about how it differs from
# replaying merges in rank order (hint: try the two-merge example of section 6). The self-check uses a
# small hand-made vocabulary.

# %%
def wordpiece_encode(word, vocab):
    # TODO (optional): greedy longest-match-first, "##" on continuation pieces, "[UNK]" when stuck
    return None


def self_check_wordpiece(fn):
    vocab = {"un", "unbeliev", "##able", "##believ", "##a", "##b", "##l", "##e", "b", "a", "##ble"}
    cases = {"unbelievable": ["unbeliev", "##able"], "unable": ["un", "##able"], "able": ["a", "##ble"],
             "unx": ["[UNK]"], "ba": ["b", "##a"]}
    for word, want in cases.items():
        got = fn(word, vocab)
        if got != want:
            print(f"✗ not yet: wordpiece_encode({word!r}) gave {got}, expected {want}")
            return False
    print("✓ greedy longest-match-first, as BERT's tokenizer")
    return True


self_check_wordpiece(wordpiece_encode)
