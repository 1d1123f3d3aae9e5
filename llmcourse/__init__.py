"""llmcourse: the finished pieces of "LLMs from scratch — from the Transformer to DeepSeek".

Lessons build each concept in the open; later lessons import the finished version from here
("we built this in unit 03; from here on we import it"), and the grader uses the same code as
its reference. The package is organised by concept (``nn``, ``models``, ``data``, ``train``,
``viz``), not by unit.

Frequently used names are re-exported here::

    import llmcourse
    cfg = llmcourse.setup_notebook("03")      # offline switches, threads, seeds; returns the profile
    enc = llmcourse.gpt2_encoding()           # GPT-2 BPE via tiktoken, offline
    mask = llmcourse.causal_mask(4)           # bool, True = may attend
"""

from .data import (
    BPETokenizer,
    CharTokenizer,
    DataNotFoundError,
    GPTWindowDataset,
    bpe_encode_word,
    bpe_train,
    create_dataloader,
    data_path,
    gpt2_encoding,
    load_gpt2_encoding,
    load_text,
)
from .manifest import course_root, load_course
from .models import GPT2Config, GPT2Model, Llama3Config, Llama3Model
from .nn import (
    GPTEmbedding,
    InputEmbeddings,
    MultiHeadAttention,
    PositionalEncoding,
    causal_mask,
    merge_heads,
    scaled_dot_product_attention,
    sinusoidal_pe,
    split_heads,
)
from .runtime import profile, profile_name, seed_everything, setup_notebook, widgets_live
from .selfcheck import check, install_history_hook
from .train import generate, label_smoothed_cross_entropy, make_noam_scheduler, noam_lambda, sample_next_token

__version__ = "0.1.0"

__all__ = [
    "BPETokenizer", "CharTokenizer", "DataNotFoundError", "GPTWindowDataset", "bpe_encode_word", "bpe_train",
    "causal_mask", "create_dataloader", "load_gpt2_encoding", "course_root", "data_path", "gpt2_encoding", "load_course",
    "label_smoothed_cross_entropy", "load_text", "make_noam_scheduler", "merge_heads", "noam_lambda",
    "profile", "profile_name", "scaled_dot_product_attention",
    "seed_everything", "setup_notebook", "split_heads", "widgets_live",
    "GPTEmbedding", "InputEmbeddings", "PositionalEncoding", "sinusoidal_pe",
    "MultiHeadAttention",
    "GPT2Config", "GPT2Model", "Llama3Config", "Llama3Model",
    "generate", "sample_next_token",
    "check",
]

install_history_hook()  # llmcourse.check() warns about cells run but not saved (a no-op outside IPython)
