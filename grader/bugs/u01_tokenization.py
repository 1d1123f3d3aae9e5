"""Bug catalog of unit 01 (tokenization): one known-wrong implementation per syllabus entry.

Each mutant is the reference with exactly one mistake. ``detect="mutant"`` entries are recognised by
matching the learner's output on the failing input; ``detect="detector"`` entries by a property the
check names explicitly (``y == x``, a chunk read outside ``where[pair]``). Some bugs touch two exercises (a
trainer and an encoder can both try overlapping special tokens in the wrong order): they are registered for each.
The grader's self-tests run every mutant through its check and require the verdict to name it.
"""

from __future__ import annotations

from collections import Counter

from llmcourse.data import bytebpe as _bb
from llmcourse.data import tokenizers as _tok
from llmcourse.data import windows as _win

from ..core import bug_group

U = "01"

# ---------------------------------------------------------------- byte-level BPE: merge_step


def _merge_right_to_left(ids, pair, new_id):
    """Non-overlapping merge scanning from the right: ``[7, 7, 7]`` -> ``[7, n]`` (the wrong direction)."""
    out, i = [], len(ids) - 1
    while i >= 0:
        if i >= 1 and (ids[i - 1], ids[i]) == tuple(pair):
            out.append(new_id)
            i -= 2
        else:
            out.append(ids[i])
            i -= 1
    return out[::-1]


def _step(words, counts, pair_counts, where, pair, new_id, *, weighted=True, drop_zero=True, discard=True,
          recount=False, merge=_bb.merge_ids):
    if recount:  # merge every chunk that holds the pair, then count the corpus again
        for i in range(len(words)):
            if tuple(pair) in zip(words[i], words[i][1:]):
                words[i] = merge(words[i], pair, new_id)
        pc, wh = _bb.count_pairs(words, counts)
        pair_counts.clear()
        pair_counts.update(pc)
        where.clear()
        where.update(wh)
        return
    touched = set()
    for i in sorted(where.get(tuple(pair), ())):
        old = words[i]
        new = merge(old, pair, new_id)
        n = counts[i] if weighted else 1
        for p in zip(old, old[1:]):
            pair_counts[p] -= n
            touched.add(p)
            if discard:
                where[p].discard(i)
        for p in zip(new, new[1:]):
            pair_counts[p] = pair_counts.get(p, 0) + n
            where.setdefault(p, set()).add(i)
        words[i] = new
    for p in touched:
        if drop_zero and pair_counts.get(p) == 0:
            del pair_counts[p]
        if drop_zero and p in where and not where[p]:
            del where[p]


def _register_step(bug_id, hint, detect="mutant", **kw):
    def merge_step(words, counts, pair_counts, where, pair, new_id):
        return _step(words, counts, pair_counts, where, pair, new_id, **kw)

    bug_group(bug_id, f"{U}.merge_step", hint, {"merge_step": merge_step}, detect)


H_OVERLAP = "Merge non-overlapping occurrences, scanning left to right."
_register_step("B01.step_full_recount", "A merge changes only the chunks that hold the pair: where[pair] says which; "
               "update the counts from those chunks instead of counting the corpus again.", "detector", recount=True)
_register_step("B01.step_unweighted", "A chunk that occurs n times contributes each of its pairs n times, in the "
               "counts taken away as well as in those added.", weighted=False)
_register_step("B01.step_zero_kept", "After the merge, is every key of pair_counts a pair that still occurs?",
               drop_zero=False)
_register_step("B01.step_where_stale", "After the merge, does where still list a chunk for a pair that chunk no longer "
               "holds?", discard=False)
_register_step("B01.overlap_merge", H_OVERLAP, merge=_merge_right_to_left)

# ---------------------------------------------------------------- byte-level BPE: byte_bpe_train

merge_step = _bb.merge_step  # the name the mutant trainers call (the check's spy replaces it while it watches)


def _chunks(text, special_tokens, pattern, *, specials="longest", split="pattern"):
    import regex

    parts = [text]
    toks = list(special_tokens)
    if toks and specials != "ignored":
        if specials == "longest":
            toks = sorted(toks, key=len, reverse=True)
        alt = "|".join(regex.escape(s) if specials != "unescaped" else s for s in toks)
        parts = regex.split(alt, text)
    if split == "whitespace":
        return [c for p in parts for c in p.split()]
    return [c for p in parts for c in regex.findall(pattern, p)]


def _train(text, num_merges, special_tokens=(), pattern=_bb.GPT2_PATTERN, *, tie="min", recount=False, **kw):
    table = Counter(_chunks(text, special_tokens, pattern, **kw))
    words = [list(c.encode("utf-8")) for c in table]
    counts = list(table.values())
    pair_counts, where = _bb.count_pairs(words, counts)
    merges = []
    for k in range(num_merges):
        if recount:
            pair_counts, where = _bb.count_pairs(words, counts)
        if not pair_counts:
            break
        top = max(pair_counts.values())
        tied = [p for p, c in pair_counts.items() if c == top]
        pair = {"min": min, "max": max, "first": lambda ps: ps[0]}[tie](tied)
        merge_step(words, counts, pair_counts, where, pair, 256 + k)
        merges.append(pair)
    return merges


def _register_train(bug_id, hint, detect="mutant", **kw):
    def byte_bpe_train(text, num_merges, special_tokens=(), pattern=_bb.GPT2_PATTERN):
        return _train(text, num_merges, special_tokens, pattern, **kw)

    bug_group(bug_id, f"{U}.byte_bpe_train", hint, {"byte_bpe_train": byte_bpe_train}, detect)


H_SPECIAL_LONGEST = ("Two special tokens can overlap in the text: cut at the longer one first (try the tokens from "
                     "the longest down).")
_register_train("B01.train_recounts", "After the first count, the counts come from merge_step's updates: counting the "
                "corpus again at every merge is the slow loop this exercise replaces.", "detector", recount=True)
_register_train("B01.special_unescaped", "A special token is plain text to find, but `|`, `[`, `.` mean something in a "
                "regular expression: compare what your split removes from 'a <|endoftext|> endoftext'.",
                specials="unescaped")
_register_train("B01.special_not_split", "Cut the text at the special tokens and drop them before the pattern runs: "
                "no chunk may contain one.", specials="ignored")
_register_train("B01.special_shortest_first", H_SPECIAL_LONGEST, specials="given")
_register_train("B01.tie_lexmax", "Among tied pairs take the smallest, not the largest.", tie="max")
_register_train("B01.tie_first_seen", "Use the documented tie-break, the smallest pair, not the order of the dict.",
                tie="first")
_register_train("B01.split_on_whitespace", "Cut the text with the pattern (regex.findall): it keeps the leading space "
                "with the word and splits punctuation off.", split="whitespace")

# ---------------------------------------------------------------- byte-level BPE: byte_bpe_encode


def _encode(text, merges, byte_ids=None, special_tokens=None, pattern=_bb.GPT2_PATTERN, *, order="rank",
            use_byte_ids=True, specials="longest", split="pattern"):
    import regex

    specials_map = dict(special_tokens or {})
    table = list(range(256)) if byte_ids is None or not use_byte_ids else list(byte_ids)
    pieces = [text]
    toks = list(specials_map)
    if toks and specials != "ignored":
        if specials == "longest":
            toks = sorted(toks, key=len, reverse=True)
        pieces = regex.split("(" + "|".join(regex.escape(s) for s in toks) + ")", text)
    out = []
    for j, piece in enumerate(pieces):
        if j % 2:
            out.append(specials_map[piece])
            continue
        for chunk in (regex.findall(pattern, piece) if split == "pattern" else ([piece] if piece else [])):
            ids = [table[b] for b in chunk.encode("utf-8")]
            while True:
                present = [p for p in zip(ids, ids[1:]) if p in merges]
                if not present:
                    break
                pair = present[0] if order == "scan" else min(present, key=merges.__getitem__)
                ids = _bb.merge_ids(ids, pair, merges[pair])
            out.extend(ids)
    return out


def _register_encode(bug_id, hint, detect="mutant", **kw):
    def byte_bpe_encode(text, merges, byte_ids=None, special_tokens=None, pattern=_bb.GPT2_PATTERN):
        return _encode(text, merges, byte_ids, special_tokens, pattern, **kw)

    bug_group(bug_id, f"{U}.byte_bpe_encode", hint, {"byte_bpe_encode": byte_bpe_encode}, detect)


_register_encode("B01.encode_in_scan_order", "Always apply the pair with the lowest merged id first, wherever it is "
                 "in the chunk.", order="scan")
_register_encode("B01.byte_ids_ignored", "Byte b starts as the id byte_ids[b]: GPT-2 does not number its bytes "
                 "0-255 in order.", use_byte_ids=False)
_register_encode("B01.encode_special_as_text", "A special token in the text becomes its own id, never bytes.",
                 specials="ignored")
_register_encode("B01.special_shortest_first", H_SPECIAL_LONGEST, specials="given")
_register_encode("B01.encode_no_pretokenization", "Cut the text into chunks with the pattern first: merges never "
                 "cross a chunk boundary.", split="none")


def _gpt2_merges_first_split(path=None):
    """Each token split at the first position where both halves are tokens (not necessarily GPT-2's merge)."""
    from llmcourse.data.resolve import data_path

    ranks = _bb.read_ranks(data_path("gpt2-bpe", "gpt2.tiktoken") if path is None else path)
    byte_ids = [ranks[bytes([b])] for b in range(256)]
    merges = {}
    for token, rank in ranks.items():
        if len(token) > 1:
            k = next(k for k in range(1, len(token)) if token[:k] in ranks and token[k:] in ranks)
            merges[(ranks[token[:k]], ranks[token[k:]])] = rank
    return byte_ids, merges


bug_group("B01.recover_first_split", f"{U}.byte_bpe_encode",
          "A token's bytes can often be cut into two known tokens in several ways; the pair it was merged from is "
          "the one BPE itself reaches on those bytes with the merges learned before it.",
          {"gpt2_merges": _gpt2_merges_first_split})

# ---------------------------------------------------------------- CharTokenizer


class CharTokenizerUnsorted(_tok.CharTokenizer):
    """Vocabulary in order of first appearance instead of sorted."""

    @classmethod
    def from_text(cls, text):
        return cls(list(dict.fromkeys(text)))


bug_group("B01.char_vocab_unsorted", f"{U}.CharTokenizer", "Build the vocabulary from `sorted(set(text))`.",
          {"CharTokenizer": CharTokenizerUnsorted})

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
