"""Pretraining corpora through Hugging Face ``datasets``, and random next-token batches.

The pipeline a practitioner would write, at the size of a laptop:

1. :func:`load_document_dataset`: ``datasets.load_dataset("text", data_files=<resolved local file>,
   sample_by="document")``, offline. ``sample_by="document"`` keeps each file as **one** row with its
   text unchanged; the default line-by-line mode would drop every ``"\\n"``, which for tinyshakespeare
   is one of the 65 characters the model must learn (it ends every line of verse).
2. a batched ``.map`` that tokenizes (characters for tinyshakespeare, GPT-2's BPE for TinyStories);
   ``datasets`` writes the result as Arrow files in the user cache (``~/.cache/llmcourse/hf_datasets``),
   so the second run reads them back instead of tokenizing again;
3. ``.with_format("torch")`` hands the ids to torch as one long 1-D stream, split 90 % / 10 %
   (train / validation) by position;
4. :func:`get_batch` cuts ``B`` random windows of ``T + 1`` tokens out of the stream.

Facts (tinyshakespeare): 1,115,394 characters, 65 distinct; the first 90 % (1,003,854 characters)
train, the last 111,540 validate.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .registry import get_dataset
from .resolve import cache_dir, data_path
from .tokenizers import CharTokenizer

__all__ = [
    "CompactGPT2Tokenizer", "Corpus", "char_corpus", "get_batch", "hf_cache_dir", "load_document_dataset",
    "repair_mojibake", "split_stories", "tinystories_corpus",
]

PIPELINE_VERSION = "1"  # part of the Arrow-cache fingerprints: bump when the tokenization changes


def hf_cache_dir():
    """Where ``datasets`` keeps its Arrow files for the course: ``<user cache>/hf_datasets``."""
    return cache_dir() / "hf_datasets"


def load_document_dataset(dataset_id: str, file: str | None = None):
    """A registered text file as a ``datasets.Dataset`` with one row per file and a ``"text"`` column.

    Calls ``datasets.load_dataset("text", data_files=..., sample_by="document", split="train")`` on the
    file resolved (and checked by size and SHA-256) by :func:`~llmcourse.data.data_path`, with the Arrow
    cache in :func:`hf_cache_dir`. Works offline (``HF_DATASETS_OFFLINE=1``): the ``"text"`` builder
    ships with ``datasets`` and reads only the local file.

    Raises:
        DataNotFoundError: the file is neither local nor downloadable.
    """
    import datasets

    path = data_path(dataset_id, file)
    return datasets.load_dataset("text", data_files=str(path), sample_by="document", split="train",
                                 cache_dir=str(hf_cache_dir()))


def _fingerprint(*parts) -> str:
    h = hashlib.sha256()
    for p in (PIPELINE_VERSION, *parts):
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _file_sha(dataset_id: str, file: str | None = None) -> str:
    return get_dataset(dataset_id).file(file).sha256


def _ids_features():
    import datasets

    return datasets.Features({"ids": datasets.Sequence(datasets.Value("int32"))})


def _stream(ds) -> Tensor:
    """All rows' ``ids`` concatenated into one 1-D long tensor (in row order)."""
    rows = ds.with_format("torch")["ids"]
    if isinstance(rows, Tensor):  # equal-length rows come back stacked
        return rows.reshape(-1).long()
    return torch.cat([r.reshape(-1) for r in rows]).long() if len(rows) else torch.zeros(0, dtype=torch.long)


@dataclass
class Corpus:
    """A tokenized corpus split by position into a training and a validation stream.

    Attributes:
        name: the dataset id.
        tokenizer: has ``encode(str) -> list[int]``, ``decode(list[int]) -> str`` and ``vocab_size``.
        train, val: 1-D long tensors of token ids (the first and the last part of the stream).
        dataset: the tokenized ``datasets.Dataset`` (Arrow, cached) the streams were read from.
        n_chars: characters in the (repaired) source text.
    """

    name: str
    tokenizer: object
    train: Tensor
    val: Tensor
    dataset: object = field(repr=False, default=None)
    n_chars: int = 0

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def n_tokens(self) -> int:
        return self.train.numel() + self.val.numel()


def char_corpus(dataset_id: str = "tinyshakespeare", val_fraction: float = 0.1) -> Corpus:
    """Character ids of a text file, split into the first ``1 − val_fraction`` and the rest.

    The tokenizer is unit 01's :class:`~llmcourse.data.CharTokenizer` over ``sorted(set(text))``; the
    tokenization is one batched ``Dataset.map`` whose Arrow output is cached (fingerprinted by the file's
    SHA-256 and the vocabulary). The split point is ``int(len(text) · (1 − val_fraction))``: for
    tinyshakespeare 1,003,854 training and 111,540 validation characters (of 1,115,394; 65 distinct).

    Raises:
        ValueError: ``val_fraction`` not in (0, 1).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    docs = load_document_dataset(dataset_id)
    text = "".join(docs["text"])
    tok = CharTokenizer.from_text(text)
    stoi = tok.stoi

    def encode(batch):
        return {"ids": [[stoi[c] for c in t] for t in batch["text"]]}

    ds = docs.map(encode, batched=True, remove_columns=["text"], features=_ids_features(),
                  new_fingerprint=_fingerprint("char", _file_sha(dataset_id), "".join(tok.chars)),
                  desc="characters -> ids")
    ids = _stream(ds)
    n_train = int(ids.numel() * (1 - val_fraction))
    return Corpus(dataset_id, tok, ids[:n_train], ids[n_train:], ds, len(text))


# ------------------------------------------------------------------ TinyStories (the lab)

_MOJIBAKE = [  # UTF-8 read as Windows-1252, longest first; a lone "â€" lost its third byte (a closing quote)
    ("â€œ", "“"), ("â€™", "’"), ("â€˜", "‘"), ("â€“", "–"), ("â€”", "—"), ("â€¦", "…"), ("â€", "”"),
]


def repair_mojibake(text: str) -> str:
    """Undo the few UTF-8-read-as-Windows-1252 sequences of the TinyStories sample (``â€™`` -> ``’``, …)."""
    for bad, good in _MOJIBAKE:
        text = text.replace(bad, good)
    return text


_STORY_BREAK = re.compile(r"(?<!\n)\n(?!\n)")  # a single newline; "\n\n" separates paragraphs inside a story


def split_stories(text: str) -> list[str]:
    """The non-empty stories of the TinyStories sample (separated by a single ``"\\n"``), repaired and stripped."""
    return [s.strip() for s in _STORY_BREAK.split(repair_mojibake(text)) if s.strip()]


class CompactGPT2Tokenizer:
    """GPT-2's BPE followed by a compact renumbering of the ids that occur in the training text.

    Unit 07's method (:func:`~llmcourse.data.build_compact_vocab`): the GPT-2 ids seen in training get
    new ids 4, 5, … in increasing GPT-2-id order; 0–3 are reserved (unseen ids map to 3, ``[UNK]``).
    ``<|endoftext|>`` (50256) ends every story, so it is always in the vocabulary.
    """

    UNK = 3

    def __init__(self, enc, vocab: dict[int, int]):
        self.enc = enc
        self.vocab = dict(vocab)
        self.inverse = {v: k for k, v in self.vocab.items()}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + 4

    @property
    def eot_id(self) -> int:
        return self.vocab[self.enc.eot_token]

    def encode_gpt2(self, text: str) -> list[int]:
        return self.enc.encode(text, allowed_special={"<|endoftext|>"})

    def encode(self, text: str) -> list[int]:
        return [self.vocab.get(i, self.UNK) for i in self.encode_gpt2(text)]

    def decode(self, ids) -> str:
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return self.enc.decode([self.inverse[i] for i in ids if i in self.inverse])


def tinystories_corpus(val_fraction: float = 0.1) -> Corpus:
    """The TinyStories sample as GPT-2 tokens, compacted, stories joined by ``<|endoftext|>``.

    Pipeline: one document row -> a batched map that splits it into stories (more output rows than
    input rows) -> a batched map that encodes ``story + "<|endoftext|>"`` with GPT-2's BPE (Arrow-cached)
    -> the last ``val_fraction`` of the stories validate -> the GPT-2 ids of the training stories are
    renumbered with :class:`CompactGPT2Tokenizer`.
    """
    from .gpt2_tokenizer import EOT_TOKEN, gpt2_encoding
    from .sentiment import build_compact_vocab

    docs = load_document_dataset("tinystories-sample")
    sha = _file_sha("tinystories-sample")

    def to_stories(batch):
        return {"text": [s for t in batch["text"] for s in split_stories(t)]}

    stories = docs.map(to_stories, batched=True, new_fingerprint=_fingerprint("stories", sha), desc="stories")
    enc = gpt2_encoding()

    def encode(batch):
        return {"ids": [enc.encode(t + EOT_TOKEN, allowed_special={EOT_TOKEN}) for t in batch["text"]]}

    ds = stories.map(encode, batched=True, remove_columns=["text"], features=_ids_features(),
                     new_fingerprint=_fingerprint("gpt2", sha), desc="GPT-2 BPE")
    n_train = int(len(ds) * (1 - val_fraction))
    train_rows = ds.select(range(n_train))
    tok = CompactGPT2Tokenizer(enc, build_compact_vocab(train_rows["ids"]))
    lookup = torch.full((enc.n_vocab,), CompactGPT2Tokenizer.UNK, dtype=torch.long)
    for gpt2_id, new_id in tok.vocab.items():
        lookup[gpt2_id] = new_id
    train = lookup[_stream(train_rows)]
    val = lookup[_stream(ds.select(range(n_train, len(ds))))]
    return Corpus("tinystories-sample", tok, train, val, ds, sum(len(s) for s in stories["text"]))


# ------------------------------------------------------------------ batches


def get_batch(data: Tensor, batch_size: int, context_length: int,
              generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of a token stream: inputs and next-token targets.

    The offsets are drawn with exactly one call,
    ``torch.randint(0, len(data) − context_length, (batch_size,), generator=generator)``, so a batch is a
    deterministic function of the generator's state (a generator seeded with ``seed + step`` makes the
    batch of every step reproducible, which is what exact resumption needs). Row ``b`` is
    ``x[b] = data[o_b : o_b + T]`` and ``y[b] = data[o_b + 1 : o_b + T + 1]``: the targets are the inputs
    shifted left by one, so ``y[:, :-1] == x[:, 1:]``. The largest offset, ``len(data) − T − 1``, still
    leaves room for the last target.

    Example: ``data = torch.arange(100)``, ``B = 2, T = 4``, ``torch.Generator().manual_seed(0)`` draws
    offsets ``[44, 15]``: ``x = [[44, 45, 46, 47], [15, 16, 17, 18]]``, ``y = x + 1``.

    Args:
        data: 1-D tensor of token ids (any integer dtype), length > ``context_length``.
        batch_size: B ≥ 1.
        context_length: T ≥ 1.
        generator: a ``torch.Generator`` on the CPU.

    Returns:
        ``(x, y)``, each ``(B, T)`` long, on ``data``'s device.

    Raises:
        ValueError: ``data`` is not 1-D or not longer than ``context_length``; B or T < 1.
    """
    if data.dim() != 1:
        raise ValueError(f"data must be a 1-D stream of token ids, got shape {tuple(data.shape)}")
    if batch_size < 1 or context_length < 1:
        raise ValueError(f"batch_size and context_length must be ≥ 1, got {batch_size} and {context_length}")
    if data.numel() <= context_length:
        raise ValueError(f"data has {data.numel()} tokens; a window needs context_length + 1 = {context_length + 1}")
    offsets = torch.randint(0, data.numel() - context_length, (batch_size,), generator=generator)
    window = offsets[:, None] + torch.arange(context_length + 1)
    chunk = data[window.to(data.device)].long()
    return chunk[:, :-1], chunk[:, 1:]
