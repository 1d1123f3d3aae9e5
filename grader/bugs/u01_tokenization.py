"""Bug catalog of unit 01 (tokenization): one known-wrong implementation per syllabus entry.

Each mutant is the reference with exactly one mistake. ``detect="mutant"`` entries are recognised by
matching the learner's output on the failing input; ``detect="detector"`` entries by a property the
check names explicitly (``y == x``). Some bugs touch two exercises (a BPE trainer and an encoder can
both forget the end-of-word marker or merge overlapping pairs): they are registered for each.
The grader's self-tests run every mutant through its check and require the verdict to name it.
"""

from __future__ import annotations

import tiktoken

from llmcourse.data import tokenizers as _tok
from llmcourse.data import windows as _win

from ..core import bug_group

U = "01"
EOW = "</w>"

# ---------------------------------------------------------------- helpers shared by the mutants


def _merge_right_to_left(symbols, pair):
    """Non-overlapping merge scanning from the right: ``[a, a, a]`` -> ``[a, aa]`` (the wrong direction)."""
    left, right = pair
    out, i = [], len(symbols) - 1
    while i >= 0:
        if i >= 1 and symbols[i - 1] == left and symbols[i] == right:
            out.append(left + right)
            i -= 2
        else:
            out.append(symbols[i])
            i -= 1
    return out[::-1]


def _train(word_counts, num_merges, end_of_word=EOW, *, marker=True, weighted=True, tie="lexmin",
           merge=_tok.merge_pair):
    words = {w: list(w) + ([end_of_word] if marker else []) for w in word_counts}
    merges = []
    for _ in range(num_merges):
        counts = {}
        for w, symbols in words.items():
            n = word_counts[w] if weighted else 1
            for p in zip(symbols, symbols[1:]):
                counts[p] = counts.get(p, 0) + n
        if not counts:
            break
        top = max(counts.values())
        tied = [p for p, c in counts.items() if c == top]
        best = {"lexmin": min(tied), "lexmax": max(tied), "first_seen": tied[0]}[tie]
        merges.append(best)
        words = {w: merge(s, best) for w, s in words.items()}
    return merges


def _train_stream(word_counts, num_merges, end_of_word=EOW):
    """The whole corpus as one symbol stream (each word repeated count times): pairs span words."""
    stream = []
    for w, n in word_counts.items():
        for _ in range(n):
            stream += list(w) + [end_of_word]
    merges = []
    for _ in range(num_merges):
        counts = {}
        for p in zip(stream, stream[1:]):
            counts[p] = counts.get(p, 0) + 1
        if not counts:
            break
        top = max(counts.values())
        best = min(p for p, c in counts.items() if c == top)
        merges.append(best)
        stream = _tok.merge_pair(stream, best)
    return merges


def _register_train(bug_id, hint, fn, detect="mutant"):
    def bpe_train(word_counts, num_merges, end_of_word=EOW):
        return fn(word_counts, num_merges, end_of_word)

    bug_group(bug_id, f"{U}.bpe_train", hint, {"bpe_train": bpe_train}, detect)


# ---------------------------------------------------------------- bpe_train

H_NO_EOW = 'Append the end-of-word marker, so that "est" at a word end differs from "est" inside "esteem".'
H_OVERLAP = "Merge non-overlapping occurrences, scanning left to right."

_register_train("B01.no_end_of_word", H_NO_EOW, lambda wc, n, e: _train(wc, n, e, marker=False))
_register_train("B01.unweighted_counts", "Pair counts are weighted by how often the word occurs.",
                lambda wc, n, e: _train(wc, n, e, weighted=False))
_register_train("B01.tie_first_seen", "Use the documented tie-break: the lexicographically smallest pair.",
                lambda wc, n, e: _train(wc, n, e, tie="first_seen"))
_register_train("B01.tie_lexmax", "Smallest, not largest.", lambda wc, n, e: _train(wc, n, e, tie="lexmax"))
_register_train("B01.cross_word_pairs", "Pairs never span two words.", _train_stream)
_register_train("B01.overlap_merge", H_OVERLAP, lambda wc, n, e: _train(wc, n, e, merge=_merge_right_to_left))

# ---------------------------------------------------------------- bpe_encode_word


def _encode(word, merges, end_of_word=EOW, *, marker=True, merge=_tok.merge_pair, scan_order=False):
    ranks = {}
    for r, p in enumerate(merges):
        ranks.setdefault(tuple(p), r)
    symbols = list(word) + ([end_of_word] if marker else [])
    while len(symbols) > 1:
        pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
        if not pairs:
            break
        symbols = merge(symbols, pairs[0] if scan_order else min(pairs, key=ranks.__getitem__))
    return symbols


def _register_encode(bug_id, hint, fn, detect="mutant"):
    def bpe_encode_word(word, merges, end_of_word=EOW):
        return fn(word, merges, end_of_word)

    bug_group(bug_id, f"{U}.bpe_encode_word", hint, {"bpe_encode_word": bpe_encode_word}, detect)


_register_encode("B01.overlap_merge", H_OVERLAP, lambda w, m, e: _encode(w, m, e, merge=_merge_right_to_left))
_register_encode("B01.encode_in_scan_order", "Always apply the pair with the lowest rank first.",
                 lambda w, m, e: _encode(w, m, e, scan_order=True))
_register_encode("B01.no_end_of_word", H_NO_EOW, lambda w, m, e: _encode(w, m, e, marker=False))


def _encode_one_pass(word, merges, end_of_word=EOW):
    """Each merge applied once, in list order: a pair created by a later merge is never looked at again."""
    symbols = list(word) + [end_of_word]
    for pair in merges:
        symbols = _tok.merge_pair(symbols, tuple(pair))
    return symbols


_register_encode("B01.encode_one_pass",
                 "Merging can create a pair whose rank is lower than merges already passed: check which pairs are "
                 "present after each merge.", _encode_one_pass)

H_MARKER = "Encode a word with end_of_word='_': does the marker you were given appear in the symbols?"
_register_encode("B01.marker_hard_coded", H_MARKER, lambda w, m, e: _encode(w, m, EOW), detect="detector")
_register_train("B01.marker_hard_coded", H_MARKER, lambda wc, n, e: _train(wc, n, EOW), detect="detector")

# ---------------------------------------------------------------- CharTokenizer


class CharTokenizerUnsorted(_tok.CharTokenizer):
    """Vocabulary in order of first appearance instead of sorted."""

    @classmethod
    def from_text(cls, text):
        return cls(list(dict.fromkeys(text)))


bug_group("B01.char_vocab_unsorted", f"{U}.CharTokenizer", "Build the vocabulary from `sorted(set(text))`.",
          {"CharTokenizer": CharTokenizerUnsorted})

# ---------------------------------------------------------------- load_gpt2_encoding


def _load_without_special(path=None):
    """The ranks are right, but <|endoftext|> is not registered as a special token."""
    from tiktoken_ext.openai_public import r50k_pat_str

    from llmcourse.data.gpt2_tokenizer import _read_ranks
    from llmcourse.data.resolve import data_path

    p = data_path("gpt2-bpe", "gpt2.tiktoken") if path is None else path
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=_read_ranks(p), special_tokens={})


bug_group("B01.special_as_text", f"{U}.load_gpt2_encoding",
          'Pass `allowed_special={"<|endoftext|>"}` to get id 50256 (and register the special token).',
          {"load_gpt2_encoding": _load_without_special})

# ---------------------------------------------------------------- GPTWindowDataset


class WindowsNotShifted(_win.GPTWindowDataset):
    def __getitem__(self, i):
        s = self.starts[i]
        x = self.ids[s: s + self.context_length]
        return x, x.clone()


class WindowsPlusOne(_win.GPTWindowDataset):
    def __init__(self, token_ids, context_length, stride):
        super().__init__(token_ids, context_length, stride)
        self.starts = range(0, len(self.ids) - context_length + 1, stride)


class WindowsShort(_win.GPTWindowDataset):
    def __init__(self, token_ids, context_length, stride):
        super().__init__(token_ids, context_length, stride)
        self.starts = range(0, len(self.ids) - context_length - 1, stride)


class WindowsStrideIgnored(_win.GPTWindowDataset):
    def __init__(self, token_ids, context_length, stride):
        super().__init__(token_ids, context_length, stride)
        self.starts = range(0, len(self.ids) - context_length, 1)


def _create_dataloader_global_seed(token_ids, batch_size, context_length, stride, shuffle=True, drop_last=True,
                                   seed=0):
    import torch

    torch.manual_seed(seed)  # the notebook's generator reseeded; the loader shuffles from it when iterated
    ds = _win.GPTWindowDataset(token_ids, context_length, stride)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=0)


bug_group("B01.loader_global_seed", f"{U}.GPTWindowDataset",
          "Build two loaders with the same seed and draw a random number in between: does the order still agree, "
          "and is the notebook's own random sequence unchanged?",
          {"create_dataloader": _create_dataloader_global_seed}, detect="detector")


def _register_windows(bug_id, hint, cls, detect="mutant"):
    bug_group(bug_id, f"{U}.GPTWindowDataset", hint, {"GPTWindowDataset": cls}, detect)


_register_windows("B01.target_not_shifted", "The target is the input shifted left by one token.", WindowsNotShifted,
                  "detector")
_register_windows("B01.window_range_plus_one", "Look at the last item of your dataset: is its target y as long as "
                  "x?", WindowsPlusOne)
_register_windows("B01.window_range_short", "Count by hand the complete windows of 6 ids with L = 4 and stride 1, "
                  "and compare with len(dataset).", WindowsShort)
_register_windows("B01.stride_ignored", "Advance the start by `stride`.", WindowsStrideIgnored)
