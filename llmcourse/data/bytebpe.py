"""Byte-level BPE on integer ids (unit 01): GPT-2's pre-tokenisation, special tokens, incremental pair counts.

* :data:`GPT2_PATTERN`: GPT-2's pre-tokenisation regex (the ``pat_str`` of tiktoken's ``r50k_base``/``gpt2``),
  for the ``regex`` package (``\\p{L}`` letters, ``\\p{N}`` digits).
* :func:`split_chunks`: text -> the pieces BPE works inside: the text is cut at the special tokens (matched
  literally, the longest first), and each part between them is cut by the pattern.
* :func:`count_pairs` / :func:`merge_ids` / :func:`merge_step`: the bookkeeping of training. The corpus is a list
  of distinct chunks (``words[i]``, a list of ids) with their number of occurrences (``counts[i]``);
  ``pair_counts[p]`` is the number of times the adjacent pair ``p`` occurs in the corpus (overlapping occurrences
  counted: ``[a, a, a]`` holds ``(a, a)`` twice), ``where[p]`` the set of chunk indexes holding ``p``.
  :func:`merge_step` merges one pair and updates both maps **incrementally**: it reads only the chunks in
  ``where[pair]``, never the whole corpus.
* :func:`byte_bpe_train`: the training loop (ids 0-255 are the bytes, merge ``k`` creates id ``256 + k``; the
  highest count wins, ties go to the smallest pair as a tuple of ints). :func:`byte_bpe_train_naive` is the same
  loop with a full recount at every merge (same merges; the lesson and ``course bench bpe`` compare their speed).
* :func:`gpt2_merges`: GPT-2's 50,000 merges recovered from its ranks file ``gpt2.tiktoken``, which lists only the
  tokens' bytes and ranks: the pair a token was merged from is found by running BPE on the token's own bytes with
  the ranks below its own, which stops at exactly two parts.
* :func:`byte_bpe_encode` / :func:`byte_bpe_decode`: encoding (split, bytes to ids, then repeatedly merge the
  pair with the lowest merged id) and decoding. With ``gpt2_merges()`` and ``<|endoftext|>`` = 50256 the ids are
  tiktoken's GPT-2 ids (checked on the-verdict and tinyshakespeare in tests/test_unit01_tokenization.py).

Sources: Sennrich et al. 2016 (BPE for NMT); Radford et al. 2019 (GPT-2: byte-level BPE, the regex pre-tokeniser);
the ranks-file format and pattern of ``tiktoken_ext/openai_public.py`` (tiktoken 0.14.0). Written for the course.
"""

from __future__ import annotations

import base64
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "GPT2_PATTERN", "byte_bpe_decode", "byte_bpe_encode", "byte_bpe_train", "byte_bpe_train_naive", "count_pairs",
    "gpt2_merges", "merge_ids", "merge_step", "read_ranks", "split_chunks", "training_work",
]

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

Pair = tuple[int, int]


def _special_regex(special_tokens: Iterable[str]):
    import regex

    specials = sorted(set(special_tokens), key=len, reverse=True)
    if any(not s for s in specials):
        raise ValueError("a special token must be a non-empty string")
    return regex.compile("|".join(regex.escape(s) for s in specials)) if specials else None


def split_chunks(text: str, special_tokens: Iterable[str] = (), pattern: str = GPT2_PATTERN,
                 keep_specials: bool = False) -> list[str]:
    """The pre-tokenised pieces of ``text``, in order: cut at the special tokens, then by ``pattern``.

    Special tokens are matched literally (regex metacharacters such as ``|`` escaped); where two overlap, the
    longest matches. With ``keep_specials`` the special tokens stay in the list as their own pieces; otherwise
    they are dropped. ``"".join(split_chunks(text, specials, keep_specials=True)) == text`` for GPT-2's pattern.
    """
    import regex

    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    special_re = _special_regex(special_tokens)
    word_re = regex.compile(pattern)
    out: list[str] = []
    pos = 0
    matches = list(special_re.finditer(text)) if special_re is not None else []
    for m in matches + [None]:
        end = len(text) if m is None else m.start()
        out.extend(word_re.findall(text[pos:end]))
        if m is not None:
            if keep_specials:
                out.append(m.group())
            pos = m.end()
    return out


def count_pairs(words: list[list[int]], counts: list[int]) -> tuple[dict[Pair, int], dict[Pair, set[int]]]:
    """The full count: ``pair_counts[p]`` (occurrences weighted by ``counts``) and ``where[p]`` (chunk indexes)."""
    pair_counts: dict[Pair, int] = {}
    where: dict[Pair, set[int]] = {}
    for i, (w, n) in enumerate(zip(words, counts, strict=True)):
        for p in zip(w, w[1:]):
            pair_counts[p] = pair_counts.get(p, 0) + n
            where.setdefault(p, set()).add(i)
    return pair_counts, where


def merge_ids(ids: list[int], pair: Pair, new_id: int) -> list[int]:
    """``ids`` with every non-overlapping occurrence of ``pair`` (scanning left to right) replaced by ``new_id``."""
    a, b = pair
    out: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_step(words: list[list[int]], counts: list[int], pair_counts: dict[Pair, int],
               where: dict[Pair, set[int]], pair: Pair, new_id: int) -> None:
    """Merge ``pair`` into ``new_id`` in every chunk holding it, updating ``pair_counts`` and ``where`` in place.

    Only the chunks ``where[pair]`` are read and rewritten (``words[i]`` is replaced by the merged list); for
    each, the counts of its old pairs are taken away and those of its new pairs added, times ``counts[i]``.
    Afterwards both maps equal :func:`count_pairs` of the new ``words``: pairs whose count fell to 0 are removed
    from ``pair_counts`` and from ``where``. A ``pair`` absent from ``where`` changes nothing.
    """
    touched: set[Pair] = set()
    for i in sorted(where.get(tuple(pair), ())):
        old = words[i]
        new = merge_ids(old, pair, new_id)
        n = counts[i]
        old_pairs = Counter(zip(old, old[1:]))
        new_pairs = Counter(zip(new, new[1:]))
        for p, c in old_pairs.items():
            pair_counts[p] -= c * n
            touched.add(p)
        for p, c in new_pairs.items():
            pair_counts[p] = pair_counts.get(p, 0) + c * n
        for p in old_pairs.keys() - new_pairs.keys():
            where[p].discard(i)
        for p in new_pairs.keys() - old_pairs.keys():
            where.setdefault(p, set()).add(i)
        words[i] = new
    for p in touched:
        if pair_counts.get(p, 1) == 0:
            del pair_counts[p]
        if p in where and not where[p]:
            del where[p]


def _chunk_table(text: str, special_tokens: Iterable[str], pattern: str) -> tuple[list[list[int]], list[int]]:
    chunk_counts = Counter(split_chunks(text, special_tokens, pattern))
    pieces = sorted(chunk_counts)
    return [list(p.encode("utf-8")) for p in pieces], [chunk_counts[p] for p in pieces]


def _best(pair_counts: dict[Pair, int]) -> Pair:
    top = max(pair_counts.values())
    return min(p for p, c in pair_counts.items() if c == top)


def byte_bpe_train(text: str, num_merges: int, special_tokens: Iterable[str] = (),
                   pattern: str = GPT2_PATTERN) -> list[Pair]:
    """Learn ``num_merges`` byte-level BPE merges on ``text``; merge ``k`` creates the id ``256 + k``.

    The text is cut into chunks (:func:`split_chunks`; the special tokens are removed, so no pair spans one or
    contains its bytes); each distinct chunk becomes its UTF-8 bytes (ids 0-255) with its number of occurrences.
    At each step the pair with the highest count wins, ties going to the smallest pair (as a tuple of ints), and
    :func:`merge_step` merges it, updating the counts incrementally. Stops early when no pair is left.

    Returns:
        the merges ``[(left_id, right_id), ...]`` in the order learned.
    """
    if num_merges < 0:
        raise ValueError(f"num_merges must be >= 0, got {num_merges}")
    words, counts = _chunk_table(text, special_tokens, pattern)
    pair_counts, where = count_pairs(words, counts)
    merges: list[Pair] = []
    for k in range(num_merges):
        if not pair_counts:
            break
        best = _best(pair_counts)
        merge_step(words, counts, pair_counts, where, best, 256 + k)
        merges.append(best)
    return merges


def byte_bpe_train_naive(text: str, num_merges: int, special_tokens: Iterable[str] = (),
                         pattern: str = GPT2_PATTERN) -> list[Pair]:
    """:func:`byte_bpe_train` with a full recount of every pair at every merge (the baseline the lesson times)."""
    words, counts = _chunk_table(text, special_tokens, pattern)
    merges: list[Pair] = []
    for k in range(num_merges):
        pair_counts, _ = count_pairs(words, counts)
        if not pair_counts:
            break
        best = _best(pair_counts)
        words = [merge_ids(w, best, 256 + k) for w in words]
        merges.append(best)
    return merges


def training_work(text: str, num_merges: int, special_tokens: Iterable[str] = (),
                  pattern: str = GPT2_PATTERN) -> dict:
    """How much of the corpus each merge of :func:`byte_bpe_train` touches (the lesson's work count).

    Returns:
        ``{"chunks": number of distinct chunks, "touched": [chunks holding the merged pair, one entry per merge]}``:
        the incremental update reads ``touched[k]`` chunks at merge ``k``, a full recount reads all ``chunks``.
    """
    words, counts = _chunk_table(text, special_tokens, pattern)
    pair_counts, where = count_pairs(words, counts)
    touched = []
    for k in range(num_merges):
        if not pair_counts:
            break
        best = _best(pair_counts)
        touched.append(len(where[best]))
        merge_step(words, counts, pair_counts, where, best, 256 + k)
    return {"chunks": len(words), "touched": touched}


def read_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """A tiktoken ranks file (one ``base64(token bytes) rank`` per line) as ``{token bytes: rank}``."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def gpt2_merges(path: str | os.PathLike | None = None) -> tuple[list[int], dict[Pair, int]]:
    """GPT-2's byte ids and merges, recovered from its ranks file.

    Args:
        path: the ranks file (``gpt2.tiktoken``); ``None`` means the course's copy,
            ``llmcourse.data_path("gpt2-bpe", "gpt2.tiktoken")``.

    Returns:
        ``(byte_ids, merges)``: ``byte_ids[b]`` is the id of the single byte ``b`` (GPT-2 does not number the bytes
        0-255 in order), and ``merges[(a, b)]`` the id of the token merged from ids ``a`` and ``b``; ids are ranks.

    Raises:
        ValueError: a token that no pair of lower-ranked tokens builds, or a missing single byte.
    """
    from .resolve import data_path

    p = data_path("gpt2-bpe", "gpt2.tiktoken") if path is None else Path(path)
    ranks = read_ranks(p)
    byte_ids = []
    for b in range(256):
        if bytes([b]) not in ranks:
            raise ValueError(f"the ranks file has no single-byte token {bytes([b])!r}")
        byte_ids.append(ranks[bytes([b])])
    merges: dict[Pair, int] = {}
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            found = [(ranks.get(x + y, rank), k) for k, (x, y) in enumerate(zip(parts, parts[1:]))]
            r, k = min(found)
            if r >= rank:
                break
            parts[k: k + 2] = [parts[k] + parts[k + 1]]
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens")
        merges[(ranks[parts[0]], ranks[parts[1]])] = rank
    return byte_ids, merges


def _encode_chunk(ids: list[int], merges: dict[Pair, int]) -> list[int]:
    while len(ids) > 1:
        candidates = [merges[p] for p in zip(ids, ids[1:]) if p in merges]
        if not candidates:
            break
        new_id = min(candidates)
        pair = next(p for p in zip(ids, ids[1:]) if merges.get(p) == new_id)
        ids = merge_ids(ids, pair, new_id)
    return ids


def byte_bpe_encode(text: str, merges: dict[Pair, int], byte_ids: list[int] | None = None,
                    special_tokens: dict[str, int] | None = None, pattern: str = GPT2_PATTERN) -> list[int]:
    """Token ids of ``text``: split (:func:`split_chunks`), bytes to ids, then merge the lowest merged id first.

    Args:
        merges: ``{(left_id, right_id): merged_id}``; a trained list ``m`` is ``{p: 256 + k for k, p in
            enumerate(m)}``. Merged ids grow in the order the merges were learned.
        byte_ids: ``byte_ids[b]`` is the id of byte ``b`` (default: ``b`` itself).
        special_tokens: ``{text: id}``; each occurrence in ``text`` (the longest first where two overlap) becomes
            its id, and the text around it is encoded on its own.
    """
    specials = dict(special_tokens or {})
    table = list(range(256)) if byte_ids is None else list(byte_ids)
    if len(table) != 256:
        raise ValueError(f"byte_ids must give the id of each of the 256 bytes; got {len(table)} ids")
    out: list[int] = []
    for piece in split_chunks(text, specials, pattern, keep_specials=True):
        if piece in specials:
            out.append(specials[piece])
        else:
            out.extend(_encode_chunk([table[b] for b in piece.encode("utf-8")], merges))
    return out


def byte_bpe_decode(ids: Iterable[int], merges: dict[Pair, int], byte_ids: list[int] | None = None,
                    special_tokens: dict[str, int] | None = None) -> str:
    """The text of ``ids`` (invalid UTF-8, e.g. half a character, becomes U+FFFD)."""
    table = list(range(256)) if byte_ids is None else list(byte_ids)
    vocab: dict[int, bytes] = {i: bytes([b]) for b, i in enumerate(table)}
    for (a, b), new in sorted(merges.items(), key=lambda kv: kv[1]):
        vocab[new] = vocab[a] + vocab[b]
    for s, i in (special_tokens or {}).items():
        vocab[i] = s.encode("utf-8")
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")
