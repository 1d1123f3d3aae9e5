"""Unit 01's red-team answers (see tests/redteam/__init__.py), written as edits of the reference solution."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "01"

_CHARS_ENCODE_CHECK = ("        for c in s:\n            if c not in self.stoi:\n"
                       "                raise ValueError(f\"character {c!r} is not in the vocabulary\")\n")
_STEP_CLEANUP = ("    for p in changed:\n        if pair_counts.get(p) == 0:\n            del pair_counts[p]\n"
                 "        if p in where and not where[p]:\n            del where[p]\n")
_RECOVER_LOOP = '''        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            k = min(range(len(parts) - 1), key=lambda k: ranks.get(parts[k] + parts[k + 1], math.inf))
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
'''

ANSWERS = [
    # -- 01.CharTokenizer ------------------------------------------------------------------------------------
    Answer("01.CharTokenizer", "__init__ sorts the given chars (ids are no longer positions in chars)",
           edited(U, "CharTokenizer", ("self.chars = list(chars)", "self.chars = sorted(chars)")),
           says=r"position|chars|id"),
    Answer("01.CharTokenizer", "unknown characters raise KeyError from the dict lookup",
           edited(U, "CharTokenizer", (_CHARS_ENCODE_CHECK, "")), says=r"ValueError"),
    Answer("01.CharTokenizer", "vocabulary in order of first appearance",
           edited(U, "CharTokenizer", ("cls(sorted(set(text)))", "cls(dict.fromkeys(text))")),
           bug="B01.char_vocab_unsorted"),
    # -- 01.merge_step ---------------------------------------------------------------------------------------
    Answer("01.merge_step", "lazy: merge, then recount every pair of the corpus from scratch",
           edited(U, "merge_step", (_STEP_CLEANUP,
                                    "    pair_counts.clear()\n    where.clear()\n"
                                    "    for j, w in enumerate(words):\n        for p in zip(w, w[1:]):\n"
                                    "            pair_counts[p] = pair_counts.get(p, 0) + counts[j]\n"
                                    "            where.setdefault(p, set()).add(j)\n")),
           bug="B01.step_full_recount"),
    Answer("01.merge_step", "each chunk's pairs counted once, not times the chunk's count",
           edited(U, "merge_step", ("pair_counts[p] -= counts[i]", "pair_counts[p] -= 1"),
                  ("pair_counts.get(p, 0) + counts[i]", "pair_counts.get(p, 0) + 1")),
           bug="B01.step_unweighted"),
    Answer("01.merge_step", "pairs whose count fell to 0 stay in pair_counts and where",
           edited(U, "merge_step", (_STEP_CLEANUP, "")), bug="B01.step_zero_kept"),
    Answer("01.merge_step", "where never loses a chunk (stale entries)",
           edited(U, "merge_step", ("            where[p].discard(i)\n", "")), bug="B01.step_where_stale"),
    Answer("01.merge_step", "the scan steps one id past a match (the right id of the pair stays)",
           edited(U, "merge_step", ("                new.append(new_id)\n                k += 2",
                                    "                new.append(new_id)\n                k += 1")),
           says=r"chunks after the merge"),
    Answer("01.merge_step", "walks every chunk and merges where the pair occurs (ignores where)",
           edited(U, "merge_step", ("for i in list(where.get(pair, ())):",
                                    "for i in range(len(words)):\n        if pair not in zip(words[i], words[i][1:]):\n"
                                    "            continue")),
           bug="B01.step_full_recount"),
    # -- 01.byte_bpe_train -----------------------------------------------------------------------------------
    Answer("01.byte_bpe_train", "lazy: recounts every pair before each merge",
           edited(U, "byte_bpe_train", ("        top = max(pair_counts.values())\n",
                                        "        pair_counts, where = full_count(words, counts)\n"
                                        "        top = max(pair_counts.values())\n")),
           bug="B01.train_recounts"),
    Answer("01.byte_bpe_train", "special tokens used as a regex unescaped (| is alternation)",
           edited(U, "byte_bpe_train", ("regex.escape(s) for s in by_length", "s for s in by_length")),
           bug="B01.special_unescaped"),
    Answer("01.byte_bpe_train", "special tokens not cut out (trained as text)",
           edited(U, "byte_bpe_train", ("    if special_tokens:\n", "    if False:\n")),
           bug="B01.special_not_split"),
    Answer("01.byte_bpe_train", "special tokens tried in the given order, not the longest first",
           edited(U, "byte_bpe_train", ("sorted(special_tokens, key=len, reverse=True)", "list(special_tokens)")),
           bug="B01.special_shortest_first"),
    Answer("01.byte_bpe_train", "ties broken by the largest pair",
           edited(U, "byte_bpe_train", ("pair = min(p for p", "pair = max(p for p")), bug="B01.tie_lexmax"),
    Answer("01.byte_bpe_train", "ties broken by dict order (the first pair with the top count)",
           edited(U, "byte_bpe_train", ("pair = min(p for p, c in pair_counts.items() if c == top)",
                                        "pair = next(p for p, c in pair_counts.items() if c == top)")),
           bug="B01.tie_first_seen"),
    Answer("01.byte_bpe_train", "chunks cut at whitespace (str.split) instead of the pattern",
           edited(U, "byte_bpe_train", ("regex.findall(pattern, part)", "part.split()")),
           bug="B01.split_on_whitespace"),
    Answer("01.byte_bpe_train", "pattern argument ignored (GPT-2's pattern hard-coded)",
           edited(U, "byte_bpe_train", ("regex.findall(pattern, part)", "regex.findall(GPT2_PATTERN, part)")),
           says=r"pattern"),
    # -- 01.byte_bpe_encode ----------------------------------------------------------------------------------
    Answer("01.byte_bpe_encode", "a token's pair taken as the first split into two known tokens",
           edited(U, "gpt2_merges", (_RECOVER_LOOP,
                                     "        k = next(k for k in range(1, len(token)) "
                                     "if token[:k] in ranks and token[k:] in ranks)\n"
                                     "        parts = [token[:k], token[k:]]\n")),
           bug="B01.recover_first_split"),
    Answer("01.byte_bpe_encode", "a token's pair taken as the split whose halves have the lowest ranks",
           edited(U, "gpt2_merges", (_RECOVER_LOOP,
                                     "        k = min((k for k in range(1, len(token)) "
                                     "if token[:k] in ranks and token[k:] in ranks),\n"
                                     "                key=lambda k: max(ranks[token[:k]], ranks[token[k:]]))\n"
                                     "        parts = [token[:k], token[k:]]\n")),
           says=r"GPT-2|tiktoken|merge|ids"),
    Answer("01.byte_bpe_encode", "path ignored (always the course's copy)",
           edited(U, "gpt2_merges", ("    if path is None:\n", "    if True:\n")), says=r"path"),
    Answer("01.byte_bpe_encode", "merges applied in scan order (the first mergeable pair)",
           edited(U, "byte_bpe_encode", ("new_id, (a, b) = min(found)", "new_id, (a, b) = found[0]")),
           bug="B01.encode_in_scan_order"),
    Answer("01.byte_bpe_encode", "byte_ids ignored (bytes used as ids)",
           edited(U, "byte_bpe_encode", ("            if byte_ids is not None:\n                seq = [byte_ids[b] for b in seq]\n",
                                         "")),
           bug="B01.byte_ids_ignored"),
    Answer("01.byte_bpe_encode", "special tokens encoded as text",
           edited(U, "byte_bpe_encode", ("    if special_tokens:\n", "    if False:\n")),
           bug="B01.encode_special_as_text"),
    Answer("01.byte_bpe_encode", "no pre-tokenisation: the whole text is one chunk",
           edited(U, "byte_bpe_encode", ("for chunk in regex.findall(pattern, piece):",
                                         "for chunk in [piece]:")),
           bug="B01.encode_no_pretokenization"),
    Answer("01.byte_bpe_encode", "pattern argument ignored (GPT-2's pattern hard-coded)",
           edited(U, "byte_bpe_encode", ("regex.findall(pattern, piece)", "regex.findall(GPT2_PATTERN, piece)")),
           says=r"pattern"),
    # -- 01.GPTWindowDataset ---------------------------------------------------------------------------------
    Answer("01.GPTWindowDataset", "ids not forced to torch.long (an int32 input stays int32)",
           edited(U, "GPTWindowDataset", ("torch.as_tensor(token_ids, dtype=torch.long)", "torch.as_tensor(token_ids)")),
           says=r"long|int64|dtype", origin="issue 37"),
    Answer("01.GPTWindowDataset", "stride ignored (window i starts at i)",
           edited(U, "GPTWindowDataset", ("range(0, len(self.ids) - context_length, stride)",
                                          "range(0, len(self.ids) - context_length)")),
           bug="B01.stride_ignored"),
    Answer("01.GPTWindowDataset", "create_dataloader seeds the global RNG instead of a generator",
           edited(U, "create_dataloader", ("num_workers=0,\n                      generator=torch.Generator().manual_seed(seed))",
                                           "num_workers=0)"),
                  ("    dataset = GPTWindowDataset(", "    torch.manual_seed(seed)\n    dataset = GPTWindowDataset(")),
           bug="B01.loader_global_seed"),
    Answer("01.GPTWindowDataset", "drop_last ignored (always True)",
           edited(U, "create_dataloader", ("drop_last=drop_last", "drop_last=True")), says=r"drop_last"),
]
