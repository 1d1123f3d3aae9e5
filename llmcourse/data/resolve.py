"""Finding a dataset file: course assets, user cache, offline mirror, then download.

Resolution order for a registered file ``<path>`` (see :mod:`llmcourse.data.registry`):

1. ``<course>/assets/data/<path>``: data the course makes itself;
2. the user cache ``~/.cache/llmcourse/data/<path>`` (``$LLMCOURSE_CACHE`` overrides ``~/.cache/llmcourse``);
3. the mirror ``$LLMCOURSE_DATA_MIRROR/<path>`` (CI and offline classrooms);
4. a download from the canonical URL into the user cache, with a progress bar.

Every file found is checked against its registered byte size and SHA-256 before it is used; a
file that fails the check is skipped (with a warning) and the next location is tried. Offline
with nothing found, :class:`DataNotFoundError` names the dataset, its URL and the mirror variable.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import tempfile
import urllib.request
import warnings
import zipfile
from pathlib import Path

from ..manifest import course_root
from .registry import DataFile, get_dataset

__all__ = ["DataNotFoundError", "MIRROR_ENV", "cache_dir", "data_path", "load_text", "sha256_of"]

MIRROR_ENV = "LLMCOURSE_DATA_MIRROR"
CACHE_ENV = "LLMCOURSE_CACHE"
OFFLINE_ENV = "LLMCOURSE_OFFLINE"  # "1": never try the network


class DataNotFoundError(FileNotFoundError):
    """A registered dataset file could not be found locally and could not be downloaded."""


def cache_dir() -> Path:
    """The user cache folder (``$LLMCOURSE_CACHE`` or ``~/.cache/llmcourse``); not created here."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "llmcourse")


@functools.cache
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_of(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file (memoised on path, size and modification time)."""
    st = os.stat(path)
    return _sha256_cached(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def _valid(candidate: Path, f: DataFile) -> bool:
    if not candidate.is_file():
        return False
    if candidate.stat().st_size != f.size or sha256_of(candidate) != f.sha256:
        warnings.warn(f"{candidate} does not match the registered size/sha256 of {f.path}; ignoring it", stacklevel=3)
        return False
    return True


def _candidates(f: DataFile) -> list[tuple[str, Path]]:
    out = []
    try:
        out.append(("course assets", course_root() / "assets" / "data" / f.path))
    except FileNotFoundError:
        pass
    out.append(("user cache", cache_dir() / "data" / f.path))
    mirror = os.environ.get(MIRROR_ENV)
    if mirror:
        out.append((f"mirror ${MIRROR_ENV}", Path(mirror).expanduser() / f.path))
    return out


def _download(f: DataFile, dest: Path) -> None:
    from tqdm.auto import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(f.url, timeout=30) as resp:  # noqa: S310 (https URLs from the registry)
        total = int(resp.headers.get("Content-Length") or 0) or None
        buf = io.BytesIO()
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {Path(f.path).name}") as bar:
            for block in iter(lambda: resp.read(1 << 16), b""):
                buf.write(block)
                bar.update(len(block))
    payload = buf.getvalue()
    if f.archive_member:
        with zipfile.ZipFile(io.BytesIO(payload)) as zf:
            payload = zf.read(f.archive_member)
    if len(payload) != f.size or hashlib.sha256(payload).hexdigest() != f.sha256:
        raise DataNotFoundError(f"downloaded {f.url} but its size/sha256 do not match the registry for {f.path}")
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
        tmp.write(payload)
    shutil.move(tmp.name, dest)


def data_path(dataset_id: str, file: str | None = None, download: bool | None = None) -> Path:
    """Local path of a registered dataset file, verified by size and SHA-256.

    Args:
        dataset_id: a registered id, e.g. ``"tinyshakespeare"`` or ``"gpt2-bpe"``.
        file: which file of a multi-file dataset (``"gpt2.tiktoken"``, ``"sentiment/imdb_labelled.txt"``);
            default the first one.
        download: allow the network as the last resort (default: yes unless ``LLMCOURSE_OFFLINE=1``).

    Raises:
        KeyError: unknown dataset or file.
        DataNotFoundError: not found locally and not downloadable; the message names the dataset,
            its canonical URL and the ``LLMCOURSE_DATA_MIRROR`` variable.
    """
    ds = get_dataset(dataset_id)
    f = ds.file(file)
    tried = []
    for label, cand in _candidates(f):
        if _valid(cand, f):
            return cand
        tried.append(f"{label}: {cand}")
    if download is None:
        download = os.environ.get(OFFLINE_ENV, "") not in {"1", "true", "yes"}
    dest = cache_dir() / "data" / f.path
    error = "downloads disabled (LLMCOURSE_OFFLINE=1)"
    if download:
        try:
            _download(f, dest)
            return dest
        except Exception as exc:  # network down, HTTP error, checksum mismatch
            error = f"download failed: {exc}"
    raise DataNotFoundError(
        f"dataset '{dataset_id}' file '{f.path}' not found ({error}). Download it from {f.url} "
        f"into {dest}, or set {MIRROR_ENV} to a folder holding '{f.path}' (an offline mirror). "
        f"Looked in: " + "; ".join(tried)
    )


def load_text(dataset_id: str, file: str | None = None) -> str:
    """The text of a registered dataset file, decoded as UTF-8 (newlines kept as in the file)."""
    return data_path(dataset_id, file).read_text(encoding="utf-8")
