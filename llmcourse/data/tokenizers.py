"""Tokenizers of unit 01: characters, byte-pair encoding from scratch, and GPT-2's byte-level BPE.

* :class:`CharTokenizer`: one id per character; the vocabulary is ``sorted(set(text))``.
* :func:`bpe_train` / :func:`bpe_encode_word`: BPE over characters with an end-of-word marker, as
  in Sennrich et al., "Neural Machine Translation of Rare Words with Subword Units" (ACL 2016),
  Algorithm 1, with the course's **documented tie-break**: among the pairs with the highest count,
  take the lexicographically smallest ``(left, right)`` tuple of Python strings.
  :func:`bpe_trace` records every step (pair counts, ties, segmentation) for the W01.1 widget.
* :class:`BPETokenizer`: the course BPE as a whole-text tokenizer (whitespace pre-tokenisation,
  ids, ``<|unk|>`` for characters never seen in training); used to compare it with GPT-2's.
* :class:`WordTokenizer`: a word-level vocabulary (words and punctuation) with ``<|unk|>``.
* :func:`load_gpt2_encoding`: GPT-2's tokenizer as a ``tiktoken.Encoding`` built from the ranks
  file (route (a) of the syllabus, offline); :func:`encode_with_specials` encodes with tiktoken
  after checking the names of the allowed special tokens (tiktoken silently ignores unknown ones).

Every learner-facing function rejects bad input with a ``ValueError`` (or ``TypeError`` for a wrong
type) whose message says what to change.
"""

from __future__ import annotations

import difflib
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "END_OF_WORD", "GPT2_RANKS_SHA256", "UNK_TOKEN", "BPEStep", "BPETokenizer", "CharTokenizer", "WordTokenizer",
    "bpe_encode_word", "bpe_trace", "bpe_train", "encode_with_specials", "load_gpt2_encoding", "merge_pair",
    "pair_counts",
]

END_OF_WORD = "</w>"
UNK_TOKEN = "<|unk|>"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


# ============================================================================ characters


class CharTokenizer:
    """Character-level tokenizer: the id of a character is its position in ``chars``.

    ``CharTokenizer.from_text(text)`` uses ``sorted(set(text))``, so the ids do not depend on where a
    character first appears. On tinyshakespeare (F01.5): ``vocab_size == 65``, ``'\\n' -> 0``,
    ``' ' -> 1``, ``'!' -> 2``, ``'A' -> 13``, ``'a' -> 39``, ``'z' -> 64``.

    Args:
        chars: the vocabulary, a non-empty sequence of distinct one-character strings.

    Raises:
        ValueError: empty vocabulary, an entry that is not a single character, or a duplicate.
    """

    def __init__(self, chars: Iterable[str]):
        chars = list(chars)
        if not chars:
            raise ValueError("CharTokenizer needs at least one character in its vocabulary")
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"every vocabulary entry must be a single character; got {c!r}")
        dup = [c for c, n in Counter(chars).items() if n > 1]
        if dup:
            raise ValueError(f"the vocabulary lists {dup[0]!r} more than once; ids must be unique")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is ``sorted(set(text))``.

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: ``text`` is empty (there is nothing to build a vocabulary from).
        """
        if not isinstance(text, str):
            raise TypeError(f"from_text expects a str, got {type(text).__name__}")
        if not text:
            raise ValueError("cannot build a character vocabulary from an empty string; pass the training text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        """Number of characters in the vocabulary."""
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        """``s`` -> list of ids (``len(s)`` of them; ``""`` gives ``[]``).

        Raises:
            ValueError: naming the first character of ``s`` that is not in the vocabulary.
        """
        if not isinstance(s, str):
            raise TypeError(f"encode expects a str, got {type(s).__name__}")
        try:
            return [self.stoi[c] for c in s]
        except KeyError:
            i = next(i for i, c in enumerate(s) if c not in self.stoi)
            raise ValueError(f"character {s[i]!r} (position {i}) is not in the vocabulary of {self.vocab_size} "
                             "characters; build the tokenizer from text that contains it") from None

    def decode(self, ids: Iterable[int]) -> str:
        """List (or 1-D tensor) of ids -> string.

        Raises:
            ValueError: an id outside ``0 … vocab_size−1``.
        """
        ids = _as_int_list(ids)
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"id {bad} is outside the vocabulary (0 … {self.vocab_size - 1})")
        return "".join(self.chars[i] for i in ids)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def _as_int_list(ids) -> list[int]:
    if hasattr(ids, "tolist"):  # torch tensors, numpy arrays
        ids = ids.tolist()
    ids = list(ids)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"ids must be integers; got {i!r} ({type(i).__name__})")
    return ids


# ============================================================================ byte-pair encoding


def _check_end_of_word(end_of_word) -> None:
    if end_of_word is not None and (not isinstance(end_of_word, str) or not end_of_word):
        raise ValueError(f"end_of_word must be a non-empty string (or None for no marker); got {end_of_word!r}")


def _initial_words(word_counts: Mapping[str, int], end_of_word) -> dict[str, list[str]]:
    if not isinstance(word_counts, Mapping):
        raise TypeError(f"word_counts must be a dict {{word: count}}, got {type(word_counts).__name__}")
    if not word_counts:
        raise ValueError("word_counts is empty: give at least one word with a positive count")
    for w, n in word_counts.items():
        if not isinstance(w, str) or not w:
            raise ValueError(f"every word must be a non-empty string; got {w!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"counts must be positive integers; word {w!r} has count {n!r}")
    tail = [end_of_word] if end_of_word is not None else []
    return {w: list(w) + tail for w in word_counts}


def pair_counts(segmentation: Mapping[str, list[str]], word_counts: Mapping[str, int]) -> dict[tuple[str, str], int]:
    """Counts of adjacent symbol pairs over all words, weighted by ``word_counts[word]``.

    Pairs never span two words. Overlapping occurrences all count (``[a, a, a]`` has ``(a, a)`` twice).
    The dict is ordered by first occurrence (words in ``segmentation`` order, left to right).
    """
    counts: dict[tuple[str, str], int] = {}
    for w, symbols in segmentation.items():
        n = word_counts[w]
        for pair in zip(symbols, symbols[1:]):
            counts[pair] = counts.get(pair, 0) + n
    return counts


def merge_pair(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    """Replace every non-overlapping occurrence of ``pair`` in ``symbols``, scanning left to right.

    ``merge_pair(["a", "a", "a", "</w>"], ("a", "a"))`` is ``["aa", "a", "</w>"]``.
    """
    left, right = pair
    out, i, n = [], 0, len(symbols)
    while i < n:
        if i + 1 < n and symbols[i] == left and symbols[i + 1] == right:
            out.append(left + right)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


_TIE_BREAKS = ("lexmin", "first_seen", "lexmax")


def _choose(counts: dict[tuple[str, str], int], tie_break: str) -> tuple[tuple[str, str], list[tuple[str, str]]]:
    best_count = max(counts.values())
    tied = [p for p, c in counts.items() if c == best_count]  # in first-seen order
    if tie_break == "lexmin":
        return min(tied), tied
    if tie_break == "lexmax":
        return max(tied), tied
    return tied[0], tied


def _bpe_iter(word_counts, num_merges, end_of_word, tie_break) -> Iterator[tuple[dict, tuple | None, list, dict]]:
    """Yield, after 0, 1, … merges: (pair counts, the pair the rule picks next or None, tied pairs,
    segmentation). Stops after the state that follows merge ``num_merges`` (or when no pair is left)."""
    _check_end_of_word(end_of_word)
    if isinstance(num_merges, bool) or not isinstance(num_merges, int) or num_merges < 0:
        raise ValueError(f"num_merges must be a non-negative integer; got {num_merges!r}")
    if tie_break not in _TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {_TIE_BREAKS}; got {tie_break!r}")
    words = _initial_words(word_counts, end_of_word)
    done = 0
    while True:
        counts = pair_counts(words, word_counts)
        best, tied = _choose(counts, tie_break) if counts else (None, [])
        yield counts, best, tied, words
        if best is None or done == num_merges:
            return
        words = {w: merge_pair(s, best) if len(s) > 1 else s for w, s in words.items()}
        done += 1


def bpe_train(word_counts: dict[str, int], num_merges: int, end_of_word: str = END_OF_WORD) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` BPE merges from a weighted word list.

    Rules (syllabus, unit 01): each word starts as ``list(word) + [end_of_word]``. At each step the
    adjacent symbol pairs are counted over all words, weighted by the word's count (pairs never span
    two words). The pair with the highest count is merged; **ties go to the lexicographically smallest
    pair**, comparing ``(left, right)`` as Python string tuples (so the result does not depend on the
    dict's order). Every non-overlapping occurrence is replaced, scanning each word left to right.
    Training stops early when no pair remains (every word is one symbol).

    Example (F01.1): ``{"old": 7, "older": 3, "finest": 9, "lowest": 4}`` gives 15 merges, starting
    ``("e", "s"), ("es", "t"), ("est", "</w>"), ("l", "d"), ("o", "ld")``.

    Args:
        word_counts: ``{word: count}``, non-empty words and positive integer counts.
        num_merges: the maximum number of merges (≥ 0).
        end_of_word: the marker appended to every word (``None``: no marker).

    Returns:
        The merges in the order learned (index = merge rank), each a ``(left, right)`` tuple.

    Raises:
        ValueError: empty ``word_counts``, an empty word, a non-positive count, a negative ``num_merges``.
    """
    steps = _bpe_iter(word_counts, num_merges, end_of_word, "lexmin")
    return [best for k, (_, best, _, _) in enumerate(steps) if k < num_merges and best is not None]


@dataclass
class BPEStep:
    """The state of BPE training after ``len(merges)`` merges (one row of :func:`bpe_trace`)."""

    merges: list[tuple[str, str]]  # learned so far
    segmentation: dict[str, list[str]]  # word -> current symbols
    counts: dict[tuple[str, str], int]  # pair counts now, in first-seen order
    next_merge: tuple[str, str] | None  # the pair the rule picks next (None: nothing left to merge)
    tied: list[tuple[str, str]] = field(default_factory=list)  # pairs sharing the top count (first-seen order)


def bpe_trace(word_counts: dict[str, int], num_merges: int, end_of_word: str = END_OF_WORD,
              tie_break: str = "lexmin") -> list[BPEStep]:
    """Every state of BPE training, for teaching and the W01.1 stepper.

    Args:
        tie_break: ``"lexmin"`` (the course rule, as :func:`bpe_train`), ``"first_seen"`` (the first
            tied pair met when scanning the words in dict order) or ``"lexmax"`` (the largest pair).

    Returns:
        ``[state after 0 merges, after 1, …]``: ``num_merges + 1`` states, fewer if training stops early.
        With ``tie_break="lexmin"`` the last state's ``merges`` equal ``bpe_train(...)``.
    """
    states, merges = [], []
    for counts, best, tied, words in _bpe_iter(word_counts, num_merges, end_of_word, tie_break):
        states.append(BPEStep(list(merges), {w: list(s) for w, s in words.items()}, dict(counts), best, list(tied)))
        merges.append(best)
    return states


def bpe_vocabulary(specials: Iterable[str], alphabet: Iterable[str], merges: Iterable[tuple[str, str]],
                   end_of_word: str = END_OF_WORD) -> list[str]:
    """The id -> symbol table of a BPE tokenizer: specials, sorted single characters, the end-of-word
    marker, then each merge's new symbol in merge order (a symbol produced twice keeps its first id)."""
    symbols = [*specials, *sorted(set(alphabet) - {end_of_word}), end_of_word]
    seen = set(symbols)
    for left, right in merges:
        if left + right not in seen:
            seen.add(left + right)
            symbols.append(left + right)
    return symbols


def bpe_encode_word(word: str, merges: list[tuple[str, str]], end_of_word: str = END_OF_WORD) -> list[str]:
    """Segment one word with learned merges.

    Start from ``list(word) + [end_of_word]``; repeatedly take the adjacent pair with the **lowest
    rank** (its index in ``merges``) and merge all of its non-overlapping occurrences left to right;
    stop when no adjacent pair is a merge. A word never seen in training still works: characters
    that no merge covers stay single symbols.

    Examples (F01.2, F01.1 merges): ``"lowest"`` -> ``["lowest</w>"]``; ``"newest"`` ->
    ``["n", "e", "w", "est</w>"]``; with ``[("a", "a")]``: ``"aaa"`` -> ``["aa", "a", "</w>"]``.

    Raises:
        ValueError: ``word`` is empty or not a string.
    """
    if not isinstance(word, str) or not word:
        raise ValueError(f"bpe_encode_word needs a non-empty word (a string without the marker); got {word!r}")
    _check_end_of_word(end_of_word)
    ranks: dict[tuple[str, str], int] = {}
    for r, pair in enumerate(merges):
        ranks.setdefault(tuple(pair), r)
    symbols = list(word) + ([end_of_word] if end_of_word is not None else [])
    while len(symbols) > 1:
        candidates = [(ranks[p], p) for p in zip(symbols, symbols[1:]) if p in ranks]
        if not candidates:
            break
        symbols = merge_pair(symbols, min(candidates)[1])
    return symbols


# ============================================================================ whole-text tokenizers


def _check_allowed_special(allowed_special, known: Iterable[str]) -> set[str]:
    known = set(known)
    if allowed_special == "all":
        return known
    if isinstance(allowed_special, str):
        raise TypeError(f"allowed_special must be a set of token strings (or 'all'), not the string {allowed_special!r}; "
                        f"write allowed_special={{{allowed_special!r}}}")
    allowed = set(allowed_special)
    for tok in sorted(allowed - known):
        close = difflib.get_close_matches(tok, sorted(known), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown special token {tok!r}: this tokenizer knows {sorted(known)}{hint}")
    return allowed


def _split_specials(text: str, specials: Iterable[str]) -> list[str]:
    specials = sorted(specials, key=len, reverse=True)
    if not specials:
        return [text]
    return [piece for piece in re.split("(" + "|".join(map(re.escape, specials)) + ")", text) if piece]


class _SpecialTextMixin:
    special_tokens: dict[str, int]

    def _segments(self, text: str, allowed_special) -> list[tuple[str, bool]]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        allowed = _check_allowed_special(allowed_special, self.special_tokens)
        out = []
        for piece in _split_specials(text, self.special_tokens):
            if piece in self.special_tokens:
                if piece not in allowed:
                    raise ValueError(f"the text contains the special token {piece!r}; pass "
                                     f"allowed_special={{{piece!r}}} to encode it as id {self.special_tokens[piece]}")
                out.append((piece, True))
            else:
                out.append((piece, False))
        return out


class WordTokenizer(_SpecialTextMixin):
    """A word-level vocabulary: words and punctuation marks are tokens; unseen ones become ``<|unk|>``.

    Pre-tokenisation: ``re.findall(r"\\w+|[^\\w\\s]", text)`` (runs of letters/digits, and single
    punctuation marks; whitespace is dropped). Ids: ``<|unk|>`` = 0, ``<|endoftext|>`` = 1, then the
    vocabulary sorted. ``decode`` joins tokens with spaces, so whitespace does not round-trip.
    """

    PATTERN = re.compile(r"\w+|[^\w\s]")

    def __init__(self, vocab: Iterable[str]):
        words = sorted(set(vocab) - {UNK_TOKEN, "<|endoftext|>"})
        if not words:
            raise ValueError("WordTokenizer needs a non-empty vocabulary")
        self.special_tokens = {UNK_TOKEN: 0, "<|endoftext|>": 1}
        self.itos = [UNK_TOKEN, "<|endoftext|>", *words]
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def from_text(cls, text: str) -> WordTokenizer:
        if not isinstance(text, str) or not text.strip():
            raise ValueError("cannot build a word vocabulary from an empty text")
        return cls(cls.PATTERN.findall(text))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def tokenize(self, text: str, allowed_special=frozenset()) -> list[str]:
        """Token strings; words outside the vocabulary come back as ``<|unk|>``."""
        out = []
        for piece, special in self._segments(text, allowed_special):
            if special:
                out.append(piece)
            else:
                out += [w if w in self.stoi else UNK_TOKEN for w in self.PATTERN.findall(piece)]
        return out

    def encode(self, text: str, allowed_special=frozenset()) -> list[int]:
        return [self.stoi[t] for t in self.tokenize(text, allowed_special)]

    def decode(self, ids: Iterable[int]) -> str:
        ids = _as_int_list(ids)
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"id {bad} is outside the vocabulary (0 … {self.vocab_size - 1})")
        return " ".join(self.itos[i] for i in ids)


class BPETokenizer(_SpecialTextMixin):
    """The course BPE (:func:`bpe_train` / :func:`bpe_encode_word`) as a whole-text tokenizer.

    Pre-tokenisation splits on whitespace (``str.split``); each word is segmented by
    :func:`bpe_encode_word`. Ids: the special tokens first (``<|unk|>`` = 0, ``<|endoftext|>`` = 1),
    then the alphabet (every character seen in training) sorted, then ``end_of_word``, then one new
    symbol per merge in merge order. A character never seen in training becomes ``<|unk|>``, so
    unlike GPT-2's byte-level BPE this tokenizer cannot round-trip arbitrary Unicode; whitespace
    is not kept either (``decode`` separates words with one space).
    """

    def __init__(self, merges: list[tuple[str, str]], alphabet: Iterable[str], end_of_word: str = END_OF_WORD):
        _check_end_of_word(end_of_word)
        if end_of_word is None:
            raise ValueError("BPETokenizer needs an end-of-word marker to find word boundaries when decoding")
        self.merges = [tuple(m) for m in merges]
        self.end_of_word = end_of_word
        self.special_tokens = {UNK_TOKEN: 0, "<|endoftext|>": 1}
        self.itos = bpe_vocabulary(self.special_tokens, alphabet, self.merges, end_of_word)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self._word_cache: dict[str, list[str]] = {}  # word -> symbols (long texts repeat words a lot)

    @classmethod
    def train(cls, text: str, num_merges: int, end_of_word: str = END_OF_WORD) -> BPETokenizer:
        """Train on the whitespace-separated words of ``text`` (their counts weight the pairs)."""
        if not isinstance(text, str) or not text.split():
            raise ValueError("cannot train BPE on an empty text; pass a text with at least one word")
        words = Counter(text.split())
        merges = bpe_train(dict(words), num_merges, end_of_word)
        return cls(merges, {c for w in words for c in w}, end_of_word)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def tokenize(self, text: str, allowed_special=frozenset()) -> list[str]:
        """Symbol strings (``</w>`` marks word ends); unknown characters come back as ``<|unk|>``."""
        out = []
        for piece, special in self._segments(text, allowed_special):
            if special:
                out.append(piece)
                continue
            for word in piece.split():
                symbols = self._word_cache.get(word)
                if symbols is None:
                    symbols = [s if s in self.stoi else UNK_TOKEN
                               for s in bpe_encode_word(word, self.merges, self.end_of_word)]
                    self._word_cache[word] = symbols
                out += symbols
        return out

    def encode(self, text: str, allowed_special=frozenset()) -> list[int]:
        """Text -> ids (``""`` gives ``[]``).

        Raises:
            ValueError: ``allowed_special`` names an unknown special token, or the text contains a special
                token that is not allowed.
        """
        return [self.stoi[s] for s in self.tokenize(text, allowed_special)]

    def decode(self, ids: Iterable[int]) -> str:
        ids = _as_int_list(ids)
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"id {bad} is outside the vocabulary (0 … {self.vocab_size - 1})")
        text = "".join(self.itos[i] for i in ids)
        return text.replace(self.end_of_word, " ").rstrip(" ")

    def __repr__(self) -> str:
        return f"BPETokenizer(merges={len(self.merges)}, vocab_size={self.vocab_size})"


# ============================================================================ GPT-2 (tiktoken)


def load_gpt2_encoding(path: str | os.PathLike | None = None):
    """GPT-2's byte-level BPE as a ``tiktoken.Encoding``, built from a ranks file without the network.

    The ranks file (``gpt2.tiktoken``: one ``base64(token) rank`` per line) holds the 256 single bytes
    and 50,000 merges; the special token ``<|endoftext|>`` = 50256 is added here, so
    ``n_vocab == 50257 == 256 + 50,000 + 1``. The pre-tokenisation regex is r50k's (GPT-2's).
    The result encodes exactly like ``tiktoken.get_encoding("gpt2")``; encoding the text
    ``"<|endoftext|>"`` raises ``ValueError`` unless ``allowed_special={"<|endoftext|>"}`` is passed.

    Args:
        path: the ranks file; ``None`` resolves the registered ``gpt2-bpe/gpt2.tiktoken`` through the
            data layer (course assets, user cache, ``$LLMCOURSE_DATA_MIRROR``, download).

    Raises:
        FileNotFoundError: ``path`` does not exist (``DataNotFoundError`` when ``path`` is None and
            the file cannot be resolved).
        ValueError: the file's SHA-256 is not GPT-2's ranks file.
    """
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    from .gpt2_tokenizer import EOT_ID, EOT_TOKEN, _read_ranks
    from .resolve import data_path, sha256_of

    if path is None:
        p = data_path("gpt2-bpe", "gpt2.tiktoken")
    else:
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"no GPT-2 ranks file at {p}; pass the path of gpt2.tiktoken, or path=None "
                                    "to use the course's copy")
        digest = sha256_of(p)
        if digest != GPT2_RANKS_SHA256:
            raise ValueError(f"{p} is not GPT-2's ranks file: sha256 {digest[:12]}… != {GPT2_RANKS_SHA256[:12]}…")
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=_read_ranks(p),
                             special_tokens={EOT_TOKEN: EOT_ID}, explicit_n_vocab=50257)


def encode_with_specials(enc, text: str, allowed_special=frozenset()) -> list[int]:
    """``enc.encode(text, allowed_special=…)`` after checking the special-token names.

    tiktoken silently ignores names it does not know in ``allowed_special`` (so a misspelt
    ``"</endoftext>"`` turns the marker into ordinary text pieces). This helper raises instead.

    Raises:
        ValueError: ``allowed_special`` names a token that ``enc`` does not have (with the closest
            known name), or ``text`` contains a special token that is not allowed (tiktoken's error).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    allowed = _check_allowed_special(allowed_special, enc.special_tokens_set)
    return enc.encode(text, allowed_special=allowed)
