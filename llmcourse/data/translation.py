"""Data for unit 06 (English→Hindi translation): Tatoeba pairs, pre-tokenisation, per-language BPE,
batches and masks.

* :func:`load_translation_pairs` reads the ``tatoeba-eng-hin`` dataset through the data layer and
  keeps each pair's **attribution** (Tatoeba content is CC BY 2.0 FR, which asks for it);
  :func:`split_pairs` makes the seeded 90/5/5 split of the syllabus.
* :func:`pretokenize` is the course rule for both languages: split on whitespace and punctuation
  (the danda ``।`` and double danda ``॥`` included) with :data:`PRETOKENIZE_PATTERN`, after NFC.
  Python's ``\\w`` does not match Devanagari vowel signs (category Mc/Mn), so ``\\w+`` cuts Hindi
  words apart (F06.4).
* :class:`TranslationTokenizer`: unit 01's BPE (:func:`~llmcourse.data.tokenizers.bpe_train`,
  :func:`~llmcourse.data.tokenizers.bpe_encode_word`) trained per language on the words of the
  training split, with the specials ``[PAD]=0, [SOS]=1, [EOS]=2, [UNK]=3``. The merges are
  shipped as ``assets/tokenizers/tatoeba_{en,hi}_bpe.json`` (:func:`load_tatoeba_tokenizers`).
* :func:`make_translation_batch`, :func:`make_src_mask`, :func:`make_tgt_mask`: the graded batching and
  mask functions (exercises ``06.make_translation_batch`` and ``06.make_masks``), boolean masks with
  ``True`` = may attend (the course convention).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .tokenizers import END_OF_WORD, bpe_encode_word, bpe_train, bpe_vocabulary

__all__ = [
    "EOS_ID", "PAD_ID", "PRETOKENIZE_PATTERN", "SOS_ID", "SPECIAL_TOKENS", "UNK_ID", "TranslationPair",
    "TranslationTokenizer", "encode_pairs", "load_tatoeba_tokenizers", "load_translation_pairs",
    "make_src_mask", "make_tgt_mask", "make_translation_batch", "pretokenize", "sample_batches", "split_pairs",
    "train_tatoeba_tokenizers",
    "tokenizer_asset_path",
]

SPECIAL_TOKENS = ("[PAD]", "[SOS]", "[EOS]", "[UNK]")
PAD_ID, SOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

_PUNCT = ".,!?;:\"()\u0964\u0965-"
#: The course's pre-tokenisation rule (syllabus F06.4): runs of non-space, non-punctuation characters, or
#: one punctuation mark. U+0964/U+0965 are the Devanagari danda and double danda.
PRETOKENIZE_PATTERN = r'[^\s.,!?;:"()\u0964\u0965-]+|[.,!?;:"()\u0964\u0965-]'
_PRETOKENIZE_RE = re.compile(PRETOKENIZE_PATTERN)

DATASET_ID = "tatoeba-eng-hin"
ASSET_DIR = Path(__file__).resolve().parents[2] / "assets" / "tokenizers"


# ============================================================================ pairs


@dataclass(frozen=True)
class TranslationPair:
    """One English–Hindi pair and its Tatoeba attribution (``""`` when the line has none)."""

    en: str
    hi: str
    attribution: str = ""


def _clean(text: str) -> str:
    return unicodedata.normalize("NFC", text).strip()


def load_translation_pairs(dataset_id: str = DATASET_ID, text: str | None = None) -> list[TranslationPair]:
    """The cleaned pairs of the Tatoeba English–Hindi file, in file order.

    One line is ``English<TAB>Hindi[<TAB>attribution…]``. Both sides get Unicode NFC and ``strip()``;
    lines with an empty side are dropped, and so are exact duplicate ``(en, hi)`` pairs (the first one
    is kept, with its attribution). Columns after the second are joined with a tab into ``attribution``:
    the model ignores them, but the licence (CC BY 2.0 FR) asks that they travel with the text.

    Args:
        dataset_id: the data layer's id (resolved from assets, cache or ``LLMCOURSE_DATA_MIRROR``).
        text: the file's content, to parse a string instead (tests).

    Returns:
        list of :class:`TranslationPair`.

    Raises:
        DataNotFoundError: the file cannot be found offline (the message names the mirror variable).
    """
    if text is None:
        from .resolve import load_text

        text = load_text(dataset_id)
    pairs, seen = [], set()
    for line in text.splitlines():
        cols = line.split("\t")
        if len(cols) < 2:
            continue
        en, hi = _clean(cols[0]), _clean(cols[1])
        if not en or not hi or (en, hi) in seen:
            continue
        seen.add((en, hi))
        pairs.append(TranslationPair(en, hi, "\t".join(c.strip() for c in cols[2:])))
    return pairs


def split_pairs(pairs: Sequence, fractions: tuple[float, float, float] = (0.9, 0.05, 0.05),
                seed: int = 0) -> tuple[list, list, list]:
    """Seeded train/val/test split: ``perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))``.

    ``n_train = int(fractions[0]·n)``, ``n_val = int(fractions[1]·n)``, the rest is the test set; each part
    takes the next indices of ``perm`` (so the split is a pure function of ``n`` and ``seed``).

    Raises:
        ValueError: fractions that are negative or do not sum to 1.
    """
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    n = len(pairs)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_train, n_val = int(fractions[0] * n), int(fractions[1] * n)
    idx = perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]
    return tuple([pairs[i] for i in part] for part in idx)


# ============================================================================ tokenisation


def pretokenize(text: str) -> list[str]:
    """Split ``text`` (after NFC) into words and single punctuation marks with :data:`PRETOKENIZE_PATTERN`.

    F06.4: ``"क्या आप मेरी मदद कर सकते हैं?"`` -> ``['क्या', 'आप', 'मेरी', 'मदद', 'कर', 'सकते', 'हैं', '?']``
    (``\\w+|[^\\w\\s]`` gives 17 pieces: it splits at every vowel sign).
    """
    if not isinstance(text, str):
        raise TypeError(f"pretokenize expects a string, got {type(text).__name__}")
    return _PRETOKENIZE_RE.findall(unicodedata.normalize("NFC", text))


_NO_SPACE_BEFORE = re.compile(r" ([.,!?;:)\u0964\u0965])")


class TranslationTokenizer:
    """Unit 01's BPE over :func:`pretokenize` words, with the translation specials.

    Ids: ``[PAD]=0, [SOS]=1, [EOS]=2, [UNK]=3``, then the alphabet (every character of the training
    words) sorted, then the end-of-word marker ``</w>``, then one symbol per merge in merge order (a merge
    whose result already exists adds nothing). A character never seen in training becomes ``[UNK]``.
    ``decode`` joins words with one space and removes the space before closing punctuation, so
    ``decode(encode(s))`` equals ``s`` up to whitespace for text made of known characters.

    Args:
        merges: ``(left, right)`` pairs in rank order (from :func:`~llmcourse.data.tokenizers.bpe_train`).
        alphabet: the training characters.
        end_of_word: the BPE end-of-word marker.
    """

    def __init__(self, merges: Iterable[tuple[str, str]], alphabet: Iterable[str], end_of_word: str = END_OF_WORD):
        self.merges = [tuple(m) for m in merges]
        self.alphabet = sorted(set(alphabet) - {end_of_word})
        self.end_of_word = end_of_word
        self.itos = bpe_vocabulary(SPECIAL_TOKENS, self.alphabet, self.merges, end_of_word)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self._cache: dict[str, list[int]] = {}

    # -- training and storage ------------------------------------------------------------
    @staticmethod
    def word_counts(texts: Iterable[str]) -> dict[str, int]:
        """``{word: count}`` over the :func:`pretokenize` words of ``texts`` (what BPE is trained on)."""
        return dict(Counter(w for t in texts for w in pretokenize(t)))

    @classmethod
    def train(cls, texts: Iterable[str], num_merges: int, end_of_word: str = END_OF_WORD) -> TranslationTokenizer:
        """Learn ``num_merges`` merges (unit 01's :func:`bpe_train`, lexmin tie-break) on ``texts``.

        Raises:
            ValueError: no words in ``texts``, or a negative ``num_merges``.
        """
        counts = cls.word_counts(texts)
        if not counts:
            raise ValueError("cannot train a tokenizer on texts without any word")
        return cls(bpe_train(counts, num_merges, end_of_word), {c for w in counts for c in w}, end_of_word)

    def to_dict(self) -> dict:
        return {"format": "llmcourse-bpe-v1", "end_of_word": self.end_of_word, "specials": list(SPECIAL_TOKENS),
                "alphabet": self.alphabet, "merges": [list(m) for m in self.merges]}

    def save(self, path: str | Path, **meta) -> None:
        """Write the merges and alphabet as UTF-8 JSON (``meta`` adds keys such as the training recipe)."""
        data = {**meta, **self.to_dict()}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path, num_merges: int | None = None) -> TranslationTokenizer:
        """Read a file written by :meth:`save`; ``num_merges`` keeps only the first merges (BPE merges are
        learned greedily, so the first k merges of a longer run are exactly what a k-merge run learns).

        Raises:
            FileNotFoundError: no such file; ValueError: not a course BPE file, or ``num_merges`` too large.
        """
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("format") != "llmcourse-bpe-v1":
            raise ValueError(f"{path} is not a course BPE file (format {data.get('format')!r})")
        merges = [tuple(m) for m in data["merges"]]
        if num_merges is not None:
            if num_merges > len(merges):
                raise ValueError(f"{path} has {len(merges)} merges; cannot take the first {num_merges}")
            merges = merges[:num_merges]
        return cls(merges, data["alphabet"], data["end_of_word"])

    # -- encoding ------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def _word_ids(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            ids = [self.stoi.get(s, UNK_ID) for s in bpe_encode_word(word, self.merges, self.end_of_word)]
            self._cache[word] = ids
        return ids

    def tokenize(self, text: str) -> list[str]:
        """Symbol strings (unknown symbols as ``[UNK]``)."""
        return [self.itos[i] for i in self.encode(text)]

    def encode(self, text: str) -> list[int]:
        """Text -> ids, without SOS/EOS (the batching adds them)."""
        out: list[int] = []
        for w in pretokenize(text):
            out += self._word_ids(w)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; specials are dropped, and decoding stops at the first EOS.

        Raises:
            ValueError: an id outside the vocabulary.
        """
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        pieces = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"id {i} is outside the vocabulary (0 … {self.vocab_size - 1})")
            if i == EOS_ID:
                break
            if i in (PAD_ID, SOS_ID):
                continue
            pieces.append(self.itos[i])
        text = "".join(pieces).replace(self.end_of_word, " ")
        return _NO_SPACE_BEFORE.sub(r"\1", " ".join(text.split()))

    def __repr__(self) -> str:
        return f"TranslationTokenizer(merges={len(self.merges)}, vocab_size={self.vocab_size})"


def tokenizer_asset_path(lang: str) -> Path:
    """``assets/tokenizers/tatoeba_<lang>_bpe.json`` (``lang`` is ``"en"`` or ``"hi"``)."""
    if lang not in ("en", "hi"):
        raise ValueError(f"lang must be 'en' or 'hi', got {lang!r}")
    return ASSET_DIR / f"tatoeba_{lang}_bpe.json"


def load_tatoeba_tokenizers(num_merges: int = 500) -> tuple[TranslationTokenizer, TranslationTokenizer]:
    """The shipped English and Hindi tokenizers, keeping the first ``num_merges`` merges (≤ 2,000).

    The assets hold 2,000 merges per language, made by the recipe
    :func:`train_tatoeba_tokenizers` (training split only, seed-0 split); a test re-trains them.

    Raises:
        FileNotFoundError: an asset is missing (re-create it with :func:`train_tatoeba_tokenizers`).
    """
    paths = [tokenizer_asset_path(lang) for lang in ("en", "hi")]
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"tokenizer asset {p} is missing; re-create it with "
                                    "llmcourse.data.translation.train_tatoeba_tokenizers(save=True)")
    return tuple(TranslationTokenizer.load(p, num_merges) for p in paths)


def train_tatoeba_tokenizers(num_merges: int = 2000, save: bool = False,
                             pairs: list[TranslationPair] | None = None) -> tuple[TranslationTokenizer, TranslationTokenizer]:
    """The recipe behind the assets: BPE per language on the **training** split (seed 0) of the cleaned pairs.

    Takes a few seconds per hundred merges with unit 01's plain reference loop. ``save=True`` writes the
    assets (``assets/tokenizers/``).
    """
    train, _, _ = split_pairs(pairs if pairs is not None else load_translation_pairs())
    en = TranslationTokenizer.train([p.en for p in train], num_merges)
    hi = TranslationTokenizer.train([p.hi for p in train], num_merges)
    if save:
        ASSET_DIR.mkdir(parents=True, exist_ok=True)
        recipe = {"recipe": "llmcourse.data.translation.train_tatoeba_tokenizers: unit 01 bpe_train on the "
                            "pretokenize() words of the seed-0 training split of tatoeba-eng-hin",
                  "source": "Tatoeba (tatoeba.org), CC BY 2.0 FR"}
        en.save(tokenizer_asset_path("en"), **recipe)
        hi.save(tokenizer_asset_path("hi"), **recipe)
    return en, hi


def encode_pairs(pairs: Iterable[TranslationPair], src_tok: TranslationTokenizer,
                 tgt_tok: TranslationTokenizer) -> list[tuple[list[int], list[int]]]:
    """``[(src_tok.encode(p.en), tgt_tok.encode(p.hi)), …]`` (no SOS/EOS; the batching adds them)."""
    return [(src_tok.encode(p.en), tgt_tok.encode(p.hi)) for p in pairs]


# ============================================================================ batches and masks


def _check_ids_2d(x, name: str) -> None:
    if not isinstance(x, Tensor) or x.dim() != 2 or x.is_floating_point() or x.dtype == torch.bool:
        raise ValueError(f"{name} must be a (B, L) tensor of integer token ids, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} of shape {tuple(getattr(x, 'shape', ()))}")


def make_src_mask(src: Tensor, pad_id: int = PAD_ID) -> Tensor:
    """Source key-padding mask: ``(B, S)`` ids -> ``(B, 1, 1, S)`` bool, ``True`` = real token (may attend).

    The mask broadcasts over heads and queries, so it serves the encoder's self-attention and the
    decoder's cross-attention alike. F06.1: ``[[5, 6, 7, 0, 0]]`` -> ``[[[[T, T, T, F, F]]]]``.

    Raises:
        ValueError: ``src`` is not a 2-D integer tensor.
    """
    _check_ids_2d(src, "src")
    return (src != pad_id)[:, None, None, :]


def make_tgt_mask(tgt_in: Tensor, pad_id: int = PAD_ID) -> Tensor:
    """Target mask ``(B, 1, T, T)`` bool = key-padding ``&`` causal (``causal_mask(T)``, unit 00).

    A query row of a PAD position keeps its real keys (padding is on the right and every row starts with
    SOS), so no row is empty and no NaN arises. With right padding the key-padding part changes nothing
    for real queries: the causal mask already hides every later (padded) key. F06.1: ``[[1, 8, 9, 0]]`` ->
    rows ``[T,F,F,F], [T,T,F,F], [T,T,T,F], [T,T,T,F]``.

    Raises:
        ValueError: ``tgt_in`` is not a 2-D integer tensor.
    """
    from ..nn.masks import causal_mask

    _check_ids_2d(tgt_in, "tgt_in")
    t = tgt_in.shape[1]
    return make_src_mask(tgt_in, pad_id) & causal_mask(t, device=tgt_in.device)


def make_translation_batch(pairs: list[tuple[list[int], list[int]]], max_len: int, pad_id: int = PAD_ID,
                           sos_id: int = SOS_ID, eos_id: int = EOS_ID) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forcing batch from ``(source ids, target ids)`` pairs.

    ``src`` row = ``x[:max_len]``; with ``y' = y[:max_len − 1]``, ``tgt_in`` row = ``[SOS] + y'`` and ``tgt_out``
    row = ``y' + [EOS]`` (the decoder input is the target shifted right by one). All rows are right-padded
    with ``pad_id`` to the longest length in the batch after truncation.

    F06.2: ``[([5,6,7],[8,9]), ([5],[8,9,10,11])]``, ``max_len=8`` -> ``src = [[5,6,7],[5,0,0]]``,
    ``tgt_in = [[1,8,9,0,0],[1,8,9,10,11]]``, ``tgt_out = [[8,9,2,0,0],[8,9,10,11,2]]``.

    Returns:
        ``(src (B, S), tgt_in (B, T), tgt_out (B, T))``, all ``torch.long``.

    Raises:
        ValueError: an empty batch, ``max_len < 2``, or a pair with an empty source.
    """
    if not pairs:
        raise ValueError("make_translation_batch needs at least one pair")
    if max_len < 2:
        raise ValueError(f"max_len must be ≥ 2 (room for one token and SOS/EOS), got {max_len}")
    srcs, tins, touts = [], [], []
    for x, y in pairs:
        x, y = list(x)[:max_len], list(y)[:max_len - 1]
        if not x:
            raise ValueError("every source must have at least one token (an empty source gives an all-PAD row)")
        srcs.append(x)
        tins.append([sos_id] + y)
        touts.append(y + [eos_id])

    def pad(rows):
        width = max(len(r) for r in rows)
        return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)

    return pad(srcs), pad(tins), pad(touts)


def sample_batches(encoded: Sequence[tuple[list[int], list[int]]], batch_size: int, max_len: int,
                   generator: torch.Generator) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Endless random batches: each draws ``batch_size`` pair indices with
    ``torch.randint(len(encoded), (batch_size,), generator=generator)`` and calls :func:`make_translation_batch`."""
    if not encoded:
        raise ValueError("no encoded pairs to sample from")
    while True:
        idx = torch.randint(len(encoded), (batch_size,), generator=generator).tolist()
        yield make_translation_batch([encoded[i] for i in idx], max_len)
