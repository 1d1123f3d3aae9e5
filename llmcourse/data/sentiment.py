"""The UCI sentiment sentences (unit 07): parsing, a stratified split, a compact GPT-2 vocabulary, batches.

Data: "Sentiment Labelled Sentences" (Kotzias et al., KDD 2015), registered as ``uci-sentiment``:
three files of 1,000 lines each (Amazon phone reviews, IMDb, Yelp), 500 positive and 500 negative,
one ``sentence<TAB>label`` per line.

Two parsing traps this module avoids on purpose:

* a CSV reader with quote handling: stray ``"`` characters merge lines (Python's ``csv`` returns
  748 IMDb rows instead of 1,000). Each line is split on its **last** tab, nothing else.
* ``str.splitlines()``: it also breaks on Unicode line separators (U+2028 and friends), two of
  which occur inside IMDb sentences, giving 1,002 "lines". Lines are split on ``"\\n"`` only.

Token ids follow BERT's layout with GPT-2's BPE underneath: the four specials
``[PAD]=0, [CLS]=1, [SEP]=2, [UNK]=3`` (:data:`SPECIALS`), then every GPT-2 id seen in the training
split, renumbered from 4 in increasing GPT-2-id order (:func:`build_compact_vocab`). A row is
``[CLS] content [SEP] [PAD] …`` (:func:`encode_batch`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .resolve import load_text

__all__ = [
    "CLS_ID", "PAD_ID", "SENTIMENT_FILES", "SEP_ID", "SOURCES", "SPECIALS", "UNK_ID", "SentimentBatches",
    "SentimentExample", "build_compact_vocab", "encode_batch", "load_sentiment", "parse_labelled_lines",
    "stratified_split",
]

SPECIALS: dict[str, int] = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3}
PAD_ID, CLS_ID, SEP_ID, UNK_ID = 0, 1, 2, 3

SOURCES: tuple[str, ...] = ("amazon", "imdb", "yelp")
SENTIMENT_FILES: dict[str, str] = {
    "amazon": "sentiment/amazon_cells_labelled.txt",
    "imdb": "sentiment/imdb_labelled.txt",
    "yelp": "sentiment/yelp_labelled.txt",
}


class SentimentExample(NamedTuple):
    """One labelled sentence: ``text`` (str), ``label`` (0 = negative, 1 = positive), ``source`` (str)."""

    text: str
    label: int
    source: str


def parse_labelled_lines(text: str, source: str = "") -> list[SentimentExample]:
    """Parse ``sentence<TAB>label`` lines.

    The text is split into lines with ``text.rstrip("\\n").split("\\n")`` (never ``splitlines()``,
    which also breaks at Unicode line separators inside sentences), and each line on its **last**
    tab; quotes are ordinary characters. A trailing ``"\\r"`` (Windows line ends) is removed.

    Args:
        text: the whole file.
        source: a name stored in every example (``"imdb"``).

    Returns:
        list of :class:`SentimentExample`, in file order.

    Raises:
        ValueError: a line without a tab, or a label other than ``0``/``1`` (the message gives the
            line number and the line).
    """
    examples = []
    for number, line in enumerate(text.rstrip("\n").split("\n"), start=1):
        line = line.removesuffix("\r")
        sentence, tab, label = line.rpartition("\t")
        if not tab:
            raise ValueError(f"{source or 'input'} line {number} has no tab: {line[:80]!r}")
        if label.strip() not in {"0", "1"}:
            raise ValueError(f"{source or 'input'} line {number}: the label after the last tab must be 0 or 1, "
                             f"got {label!r}")
        examples.append(SentimentExample(sentence, int(label), source))
    return examples


def load_sentiment(sources: Sequence[str] = SOURCES) -> list[SentimentExample]:
    """All sentences of the given sources (default all three: 3,000 examples), in file order.

    Loads through the data layer (``load_text("uci-sentiment", ...)``), so the files are verified by
    size and SHA-256 and resolved offline from ``$LLMCOURSE_DATA_MIRROR``.

    Raises:
        ValueError: an unknown source name.
    """
    examples: list[SentimentExample] = []
    for source in sources:
        if source not in SENTIMENT_FILES:
            raise ValueError(f"unknown source {source!r}; choose from {list(SENTIMENT_FILES)}")
        examples += parse_labelled_lines(load_text("uci-sentiment", SENTIMENT_FILES[source]), source)
    return examples


def stratified_split(examples: Sequence[SentimentExample], fractions: Sequence[float] = (0.8, 0.1, 0.1),
                     seed: int = 0) -> dict[str, list[SentimentExample]]:
    """Split into ``train``/``val``/``test``, stratified by (source, label).

    Recipe (deterministic): group the examples by ``(source, label)``; visit the groups in sorted
    order; for each, draw ``torch.randperm(n, generator=g)`` from one ``torch.Generator`` seeded with
    ``seed``; the first ``round(f_train·n)`` permuted examples go to train, the next
    ``round(f_val·n)`` to val, the rest to test. With 500 examples per group and 80/10/10 that is
    400/50/50 per group, 2,400/300/300 in all, and every split has the same source and label mix.

    Returns:
        ``{"train": [...], "val": [...], "test": [...]}`` (groups concatenated in sorted order).

    Raises:
        ValueError: fractions that are not three non-negative numbers summing to 1.
    """
    if len(fractions) != 3 or min(fractions) < 0 or not math.isclose(sum(fractions), 1.0, abs_tol=1e-9):
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {tuple(fractions)}")
    groups: dict[tuple[str, int], list[SentimentExample]] = {}
    for ex in examples:
        groups.setdefault((ex.source, ex.label), []).append(ex)
    g = torch.Generator().manual_seed(seed)
    out: dict[str, list[SentimentExample]] = {"train": [], "val": [], "test": []}
    for key in sorted(groups):
        group = groups[key]
        order = torch.randperm(len(group), generator=g).tolist()
        n_train = round(fractions[0] * len(group))
        n_val = round(fractions[1] * len(group))
        out["train"] += [group[i] for i in order[:n_train]]
        out["val"] += [group[i] for i in order[n_train:n_train + n_val]]
        out["test"] += [group[i] for i in order[n_train + n_val:]]
    return out


def build_compact_vocab(token_id_lists: list[list[int]], min_freq: int = 1) -> dict[int, int]:
    """Map every GPT-2 id used at least ``min_freq`` times to a compact id 4, 5, ….

    The new ids are assigned in **increasing GPT-2-id order** (not by frequency, not by first
    appearance), so the result does not depend on the order of the lists. Ids 0–3 are the
    :data:`SPECIALS`; GPT-2 id 0 (``"!"``) is an ordinary token and gets a new id ≥ 4.

    Args:
        token_id_lists: GPT-2 token ids per sentence (the training split only).
        min_freq: minimum total count over all lists (≥ 1).

    Returns:
        ``{gpt2_id: compact_id}`` with values exactly ``4 … 4+n−1``.

    Raises:
        ValueError: ``min_freq < 1``.

    Example (F07.1): ``[[13681, 3072, 0], [22069, 6555, 13]]`` →
    ``{0: 4, 13: 5, 3072: 6, 6555: 7, 13681: 8, 22069: 9}``.
    """
    if min_freq < 1:
        raise ValueError(f"min_freq must be ≥ 1, got {min_freq}")
    counts = Counter(int(i) for ids in token_id_lists for i in ids)
    kept = sorted(i for i, c in counts.items() if c >= min_freq)
    return {gpt2_id: len(SPECIALS) + k for k, gpt2_id in enumerate(kept)}


def encode_batch(texts: list[str], enc, vocab: dict[int, int], max_len: int) -> tuple[Tensor, Tensor]:
    """Tokenise, compact, frame and pad a batch of sentences.

    Each row is ``[CLS] + content + [SEP]`` where content is the sentence's GPT-2 ids mapped through
    ``vocab`` (ids not in it become ``[UNK]``) and **truncated to** ``max_len − 2`` first, so ``[SEP]``
    always survives. Rows are right-padded with ``[PAD]`` to ``L`` = the longest row (≤ ``max_len``).

    Args:
        texts: B sentences.
        enc: a tiktoken ``Encoding`` (GPT-2's; :func:`llmcourse.gpt2_encoding`).
        vocab: ``{gpt2_id: compact_id}`` from :func:`build_compact_vocab`.
        max_len: the longest row including ``[CLS]`` and ``[SEP]`` (≥ 2).

    Returns:
        ``ids`` (B, L) long and ``attention_mask`` (B, L) bool, True for real tokens (including
        ``[CLS]``/``[SEP]``), False for padding.

    Raises:
        ValueError: ``max_len < 2`` or an empty list of texts.

    Example (F07.1, vocab from "Great phone!" and "Bad battery.", ``max_len=8``):
    ``["Great phone!", "Not bad at all, great value."]`` →
    ``[[1,8,6,4,2,0,0,0], [1,3,3,3,3,3,3,2]]``.
    """
    if max_len < 2:
        raise ValueError(f"max_len must be ≥ 2 (room for [CLS] and [SEP]), got {max_len}")
    if len(texts) == 0:
        raise ValueError("encode_batch needs at least one text")
    rows = []
    for text in texts:
        content = [vocab.get(i, UNK_ID) for i in enc.encode(text)][: max_len - 2]
        rows.append([CLS_ID] + content + [SEP_ID])
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, : len(row)] = True
    return ids, mask


class SentimentBatches:
    """An iterable of ``(ids, attention_mask, labels)`` batches over a list of examples.

    Each batch is :func:`encode_batch` of ``batch_size`` sentences and a ``(B,)`` long tensor of
    labels. With ``shuffle=True`` a new order is drawn each pass from ``generator`` (seeded by the
    caller), so runs are reproducible; otherwise the examples keep their order. ``len()`` is the
    number of batches, ⌈N / batch_size⌉ (the last batch may be smaller).

    This is the ``loader`` that :func:`llmcourse.train.evaluate` and the lesson's training loop use.

    Raises:
        ValueError: no examples or ``batch_size < 1``.
    """

    def __init__(self, examples: Sequence[SentimentExample], enc, vocab: dict[int, int], max_len: int,
                 batch_size: int = 32, shuffle: bool = False, generator: torch.Generator | None = None):
        if len(examples) == 0:
            raise ValueError("SentimentBatches needs at least one example")
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        self.examples = list(examples)
        self.enc, self.vocab, self.max_len = enc, vocab, max_len
        self.batch_size, self.shuffle = batch_size, shuffle
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        # tokenising is the slow part: encode every sentence once, frame per batch
        self._encoded = [encode_batch([ex.text], enc, vocab, max_len)[0][0] for ex in self.examples]

    def __len__(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        n = len(self.examples)
        order = torch.randperm(n, generator=self.generator).tolist() if self.shuffle else list(range(n))
        for start in range(0, n, self.batch_size):
            idx = order[start:start + self.batch_size]
            rows = [self._encoded[i] for i in idx]
            length = max(len(r) for r in rows)
            ids = torch.full((len(rows), length), PAD_ID, dtype=torch.long)
            for b, row in enumerate(rows):
                ids[b, : len(row)] = row
            labels = torch.tensor([self.examples[i].label for i in idx], dtype=torch.long)
            yield ids, ids != PAD_ID, labels
