"""The datasets the course knows by id: file(s), byte size, SHA-256, licence and canonical URL.

The facts come from the offline mirror's MANIFEST.md (which documents where each copy came from).
Files are never committed to the repository; :mod:`llmcourse.data.resolve` finds them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DataFile", "Dataset", "DATASETS", "get_dataset"]


@dataclass(frozen=True)
class DataFile:
    path: str  # relative path inside the data folder / mirror, e.g. "sentiment/imdb_labelled.txt"
    sha256: str
    size: int  # bytes
    url: str  # canonical download URL
    archive_member: str | None = None  # when `url` is a zip archive: the member holding this file


@dataclass(frozen=True)
class Dataset:
    id: str
    description: str
    licence: str
    files: tuple[DataFile, ...]

    def file(self, path: str | None = None) -> DataFile:
        """The dataset's file named ``path`` (default: its only/first file). Raises KeyError."""
        if path is None:
            return self.files[0]
        for f in self.files:
            if f.path == path or f.path.rsplit("/", 1)[-1] == path:
                return f
        raise KeyError(f"dataset {self.id!r} has no file {path!r}; it has {[f.path for f in self.files]}")


_OPENAI = "https://openaipublic.blob.core.windows.net"
_UCI = "https://archive.ics.uci.edu/static/public/331/sentiment+labelled+sentences.zip"

DATASETS: dict[str, Dataset] = {
    d.id: d
    for d in [
        Dataset(
            "tinyshakespeare",
            "Tiny Shakespeare: 40,000 lines of Shakespeare's plays in one file (65 distinct characters).",
            "Public-domain texts; repository karpathy/char-rnn (MIT).",
            (DataFile("tinyshakespeare.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", 1115394,
                      "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"),),
        ),
        Dataset(
            "the-verdict",
            "'The Verdict' (1908), a short story by Edith Wharton (20,479 characters).",
            "Public domain.",
            (DataFile("the-verdict.txt", "b41e41a68f0398a3154ae69e2e4c0e2694e17fe0d66730536837f1b01935b31f", 20479,
                      "https://raw.githubusercontent.com/rasbt/LLMs-from-scratch/main/ch02/01_main-chapter-code/the-verdict.txt"),),
        ),
        Dataset(
            "tinystories-sample",
            "About 1,100 stories from the start of the TinyStories train split (Eldan & Li, 2023).",
            "CDLA-Sharing-1.0 (TinyStories dataset card).",
            (DataFile("tinystories_sample.txt", "c56cfd24fb1c542b141a396184b822a4db3672abdb4c49c6aa843171c5e822a5", 944426,
                      "https://raw.githubusercontent.com/s-ajaykumar/smallGPT/b8b899265a5574abd2c19d8857039309184a357c/data/tiny_stories.txt"),),
        ),
        Dataset(
            "tatoeba-eng-hin",
            "English–Hindi sentence pairs from Tatoeba (manythings.org Anki format), 3,117 lines with attribution.",
            "CC BY 2.0 (France); keep the attribution column (tatoeba.org).",
            (DataFile("eng-hin-tatoeba.tsv", "d67859600040fd07f9c61351d3e508e9e5bea928fc0a3bede75e1aaefda4f3c4", 610350,
                      "https://raw.githubusercontent.com/devpatel0005/Hindi-English-Language-Translation/e1e9682ff81f20d744904e316e7049fb4f4b8320/hin.txt"),),
        ),
        Dataset(
            "uci-sentiment",
            "UCI Sentiment Labelled Sentences (Kotzias et al., KDD 2015): Amazon, IMDb and Yelp, 1,000 each.",
            "CC BY 4.0 (UCI Machine Learning Repository, dataset 331); cite Kotzias et al. 2015.",
            (
                DataFile("sentiment/amazon_cells_labelled.txt", "47003fc0a0d4840b00e96e715b6189bad09e7443a3da41c4cbe12ffc79f86ae3", 58226, _UCI, "sentiment labelled sentences/amazon_cells_labelled.txt"),
                DataFile("sentiment/imdb_labelled.txt", "aef2e49e3da25714d61175e3a6e68eeef74a20a2f914318dc3be9947ea86512d", 85285, _UCI, "sentiment labelled sentences/imdb_labelled.txt"),
                DataFile("sentiment/yelp_labelled.txt", "c76468b7b5c6e56a0804d728345c5f84aa2142ddb214420f61cc9cfd4c00d2ea", 61320, _UCI, "sentiment labelled sentences/yelp_labelled.txt"),
            ),
        ),
        Dataset(
            "gpt2-bpe",
            "GPT-2's byte-level BPE: 50,256 mergeable ranks (tiktoken format) + <|endoftext|> = 50256.",
            "OpenAI GPT-2 release (Modified MIT License); gpt2.tiktoken via openai-whisper (MIT).",
            (
                DataFile("gpt2_bpe/gpt2.tiktoken", "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930", 835554,
                         f"{_OPENAI}/encodings/r50k_base.tiktoken"),
                DataFile("gpt2_bpe/vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5", 456318,
                         f"{_OPENAI}/gpt-2/encodings/main/vocab.bpe"),
                DataFile("gpt2_bpe/encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783", 1042301,
                         f"{_OPENAI}/gpt-2/encodings/main/encoder.json"),
            ),
        ),
    ]
}


def get_dataset(dataset_id: str) -> Dataset:
    """The registered dataset ``dataset_id``. Raises KeyError listing the known ids."""
    try:
        return DATASETS[dataset_id]
    except KeyError:
        raise KeyError(f"unknown dataset {dataset_id!r}; known: {sorted(DATASETS)}") from None
