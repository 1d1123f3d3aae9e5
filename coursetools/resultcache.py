"""The check-result cache: ``course check`` stores each notebook's report, ``course progress`` reuses it.

A report is stored under a key that hashes everything its verdicts depend on:

* the check server's key (:func:`coursetools.checkserver.server_key`: the course root, the Python executable,
  where ``llmcourse``, ``grader`` and ``coursetools`` come from, the fingerprint of those packages,
  ``course.toml`` and ``assets/``, and the environment variables that can change an answer);
* the unit id and the notebook's resolved path;
* the notebook's cells: type, source and nbgrader metadata of every cell (outputs and execution counts are
  left out: running a cell does not change what is graded, editing any cell does);
* size and mtime of the unit's released notebook (locked cells are restored from it).

So ``course progress`` shows, for a notebook the student has checked since they last edited it, exactly the
report ``course check`` gave, without running it again; any edit, a changed course library or grader, or another
profile is a miss and the notebook is checked as before (and stored). The cache is a convenience for the student's
own view: ``course grade`` never reads it (it checks every submission from its own snapshot).

Where: ``$LLMCOURSE_CHECK_CACHE`` (a folder; ``0`` switches the cache off), else
``$XDG_CACHE_HOME/llmcourse/check-results`` or ``~/.cache/llmcourse/check-results`` (created mode 0700, used only
when owned by this user and private). One small JSON file per key; nothing is ever read from another user's folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path

CACHE_ENV = "LLMCOURSE_CHECK_CACHE"

__all__ = ["CACHE_ENV", "cache_dir", "load", "result_key", "store"]


def cache_dir(setting: str | None = None) -> Path | None:
    """This user's private cache folder (created), or None when switched off or unusable.

    ``setting``: a folder or ``"0"`` (default: ``$LLMCOURSE_CHECK_CACHE``); the warm check server uses the one its
    client resolved, since its own environment may be another client's.
    """
    setting = os.environ.get(CACHE_ENV, "") if setting is None else setting
    if setting == "0":
        return None
    if setting:
        folder = Path(setting)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        folder = base / "llmcourse" / "check-results"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder


def _cells(path: Path) -> list | None:
    try:
        nb = json.loads(path.read_bytes())
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    out = []
    for c in cells:
        if not isinstance(c, dict):
            return None
        source = c.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        meta = c.get("metadata", {}) if isinstance(c.get("metadata"), dict) else {}
        out.append([c.get("cell_type"), source, meta.get("nbgrader"), meta.get("tags")])
    return out


def result_key(notebook: str | os.PathLike, unit, server: str, root: Path | None = None) -> str | None:
    """The cache key of ``notebook`` checked as ``unit`` (see the module doc), or None (unreadable notebook).

    ``server``: the check server key (:func:`coursetools.checkserver.server_key`); ``root``: the course root
    (default :func:`llmcourse.manifest.course_root`).
    """
    path = Path(notebook).resolve()
    cells = _cells(path)
    if cells is None:
        return None
    if root is None:
        from llmcourse.manifest import course_root

        root = course_root()
    release = Path(root) / unit.exercise
    try:
        st = release.stat()
        release_stat = [st.st_size, st.st_mtime_ns]
    except OSError:
        release_stat = None
    material = {"server": server, "unit": unit.id, "path": str(path), "cells": cells, "release": release_stat}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def load(key: str | None) -> dict | None:
    """The stored report (``course check --json``'s data, without its ``notebook``), or None."""
    folder = cache_dir()
    if key is None or folder is None:
        return None
    try:
        data = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key and isinstance(data.get("report"), dict) else None


def store(key: str | None, report: dict, setting: str | None = None) -> None:
    """Store a report (best effort: a full disk or a read-only home only costs the next reuse); ``setting`` as
    for :func:`cache_dir`."""
    folder = cache_dir(setting)
    if key is None or folder is None or "error" in report:
        return
    report = {k: v for k, v in report.items() if k != "notebook"}
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps({"key": key, "report": report}), encoding="utf-8")
        os.replace(tmp, folder / f"{key}.json")
    with contextlib.suppress(OSError):
        tmp.unlink()
