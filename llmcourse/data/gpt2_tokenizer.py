"""GPT-2's byte-level BPE through tiktoken, offline from the data layer.

``gpt2_encoding()`` builds the encoding explicitly from the registered ``gpt2_bpe/gpt2.tiktoken``
ranks (route (a) of the syllabus): 50,256 mergeable ranks, r50k's pre-tokenisation regex and the
special token ``<|endoftext|>`` = 50256, so ``n_vocab == 50257``. It is identical to
``tiktoken.get_encoding("gpt2")`` (checked in tests/test_data.py through tiktoken's own cache route).
"""

from __future__ import annotations

import base64
import functools
import os
import shutil
from pathlib import Path

from .resolve import data_path

__all__ = ["EOT_ID", "EOT_TOKEN", "gpt2_encoding", "tiktoken_cache_dir"]

EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256


def _read_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def gpt2_encoding():
    """The GPT-2 tokenizer as a ``tiktoken.Encoding`` named ``"gpt2"``, built without the network.

    Returns:
        tiktoken.Encoding with ``n_vocab == 50257`` and ``eot_token == 50256``.
        ``enc.encode("Hello, world")`` is ``[15496, 11, 995]``. Encoding the text ``"<|endoftext|>"``
        raises ValueError unless ``allowed_special={"<|endoftext|>"}`` is passed (tiktoken's rule).

    Raises:
        DataNotFoundError: when the ranks file is neither local nor downloadable.
    """
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = _read_ranks(data_path("gpt2-bpe", "gpt2.tiktoken"))  # verified by size and sha256
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT_TOKEN: EOT_ID},
        explicit_n_vocab=50257,
    )


def tiktoken_cache_dir(dest: str | os.PathLike | None = None) -> Path:
    """A writable copy of the mirror's ``tiktoken_cache/`` for ``TIKTOKEN_CACHE_DIR`` (route (b)).

    tiktoken names cache files by the SHA-1 of their URL and may write into the folder, so the
    read-only mirror is copied to ``dest`` (default ``<user cache>/tiktoken_cache``). With
    ``TIKTOKEN_CACHE_DIR`` pointing there, ``tiktoken.get_encoding("gpt2")`` works offline.

    Raises:
        DataNotFoundError: when ``$LLMCOURSE_DATA_MIRROR/tiktoken_cache`` does not exist.
    """
    from .resolve import MIRROR_ENV, DataNotFoundError, cache_dir

    mirror = os.environ.get(MIRROR_ENV)
    src = Path(mirror) / "tiktoken_cache" if mirror else None
    if src is None or not src.is_dir():
        raise DataNotFoundError(f"no tiktoken_cache/ folder in ${MIRROR_ENV} ({mirror!r}); use gpt2_encoding() instead")
    dest = Path(dest) if dest else cache_dir() / "tiktoken_cache"
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not (dest / f.name).exists():
            shutil.copyfile(f, dest / f.name)
    return dest
