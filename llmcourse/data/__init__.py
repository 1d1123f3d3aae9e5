"""The data layer: registered datasets, file resolution, tokenizers and windowed datasets."""

from .bytebpe import (
    GPT2_PATTERN,
    byte_bpe_decode,
    byte_bpe_encode,
    byte_bpe_train,
    gpt2_merges,
    merge_step,
)
from .corpus import Corpus, char_corpus, get_batch, load_document_dataset, tinystories_corpus
from .gpt2_tokenizer import EOT_ID, EOT_TOKEN, gpt2_encoding, tiktoken_cache_dir
from .registry import DATASETS, DataFile, Dataset, get_dataset
from .resolve import MIRROR_ENV, DataNotFoundError, cache_dir, data_path, load_text
from .sentiment import (
    SPECIALS,
    SentimentBatches,
    SentimentExample,
    build_compact_vocab,
    encode_batch,
    load_sentiment,
    parse_labelled_lines,
    stratified_split,
)
from .tokenizers import (
    END_OF_WORD,
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    bpe_encode_word,
    bpe_trace,
    bpe_train,
    encode_with_specials,
    load_gpt2_encoding,
)
from .translation import (
    TranslationPair,
    TranslationTokenizer,
    load_tatoeba_tokenizers,
    load_translation_pairs,
    make_src_mask,
    make_tgt_mask,
    make_translation_batch,
    pretokenize,
    split_pairs,
)
from .windows import GPTWindowDataset, create_dataloader

__all__ = [
    "DATASETS", "DataFile", "Dataset", "DataNotFoundError", "EOT_ID", "EOT_TOKEN", "MIRROR_ENV",
    "cache_dir", "data_path", "get_dataset", "gpt2_encoding", "load_text", "tiktoken_cache_dir",
    # unit 01: tokenizers and windowed datasets
    "END_OF_WORD", "BPETokenizer", "CharTokenizer", "GPTWindowDataset", "WordTokenizer", "bpe_encode_word",
    "bpe_trace", "bpe_train", "create_dataloader", "encode_with_specials", "load_gpt2_encoding",
    "GPT2_PATTERN", "byte_bpe_decode", "byte_bpe_encode", "byte_bpe_train", "gpt2_merges", "merge_step",
    # unit 07: UCI sentiment sentences, compact GPT-2 vocabulary, classifier batches
    "SPECIALS", "SentimentBatches", "SentimentExample", "build_compact_vocab", "encode_batch", "load_sentiment",
    "parse_labelled_lines", "stratified_split",
    # unit 10: pretraining corpora (Hugging Face datasets) and random next-token batches
    "Corpus", "char_corpus", "get_batch", "load_document_dataset", "tinystories_corpus",
    # unit 06: translation data, tokenizers, batches and masks
    "TranslationPair", "TranslationTokenizer", "load_tatoeba_tokenizers", "load_translation_pairs", "make_src_mask",
    "make_tgt_mask", "make_translation_batch", "pretokenize", "split_pairs",
]
