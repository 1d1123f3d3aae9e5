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

from .data import DataNotFoundError, data_path, gpt2_encoding, load_text
from .manifest import course_root, load_course
from .nn import causal_mask, merge_heads, scaled_dot_product_attention, split_heads
from .runtime import profile, profile_name, seed_everything, setup_notebook, widgets_live

__version__ = "0.1.0"

__all__ = [
    "DataNotFoundError", "causal_mask", "course_root", "data_path", "gpt2_encoding", "load_course",
    "load_text", "merge_heads", "profile", "profile_name", "scaled_dot_product_attention",
    "seed_everything", "setup_notebook", "split_heads", "widgets_live",
]
