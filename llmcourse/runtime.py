"""Runtime profiles and notebook setup.

A profile is a named set of sizes and step counts from ``course.toml`` (``ci``, ``laptop``,
``gpu``), chosen by the environment variable ``LLMCOURSE_PROFILE`` (default ``laptop``).
Notebooks ask for it instead of hard-coding sizes::

    cfg = llmcourse.profile("03")     # profile-wide keys merged with the [profiles.<name>."03"] table
    cfg["train_steps"]
"""

from __future__ import annotations

import os
import random

from .manifest import load_course

__all__ = ["MAX_THREADS_ENV", "PROFILE_ENV", "profile", "profile_name", "read_bandwidth", "seed_everything",
           "setup_notebook", "widgets_live"]

PROFILE_ENV = "LLMCOURSE_PROFILE"
DEFAULT_PROFILE = "laptop"
# At most this many torch threads for every ``*torch_threads`` key of the profile (unset: the profile's own). The
# browser tests set it to 1: they run several lessons at once on 2 cores, and two threads per kernel there make the
# kernels wait on each other (lessons measured 3-6x slower than when run alone).
MAX_THREADS_ENV = "LLMCOURSE_MAX_TORCH_THREADS"


def profile_name() -> str:
    """The active profile name from ``$LLMCOURSE_PROFILE`` (default ``"laptop"``).

    Raises:
        ValueError: if the variable names a profile that course.toml does not define.
    """
    name = os.environ.get(PROFILE_ENV, DEFAULT_PROFILE).strip() or DEFAULT_PROFILE
    profiles = load_course().profiles
    if name not in profiles:
        raise ValueError(f"{PROFILE_ENV}={name!r} is not a profile; course.toml defines {sorted(profiles)}")
    return name


def profile(unit: str | None = None, name: str | None = None) -> dict:
    """The active runtime profile as a plain dict.

    Args:
        unit: a unit id such as ``"03"``; its sub-table's keys are merged over the profile's own.
        name: a profile name to use instead of ``$LLMCOURSE_PROFILE``.

    Returns:
        dict with at least ``name``, ``device`` (``"cpu"`` or ``"cuda"``; ``"cuda"`` falls back to
        ``"cpu"`` when no GPU is present), ``torch_threads``, ``widgets`` (``"live"``/``"static"``), ``seed``.
        ``$LLMCOURSE_MAX_TORCH_THREADS`` caps every ``*torch_threads`` value.

    Raises:
        ValueError: an unknown profile, or a cap that is not a positive whole number.
    """
    name = name or profile_name()
    table = load_course().profiles[name]
    cfg = {k: v for k, v in table.items() if not isinstance(v, dict)}
    if unit is not None:
        cfg.update(table.get(unit, {}))
    cfg["name"] = name
    cap = os.environ.get(MAX_THREADS_ENV, "").strip()
    if cap:
        if not cap.isdigit() or int(cap) < 1:
            raise ValueError(f"{MAX_THREADS_ENV}={cap!r}: expected a positive whole number of threads")
        for key in [k for k in cfg if k.endswith("torch_threads")]:
            cfg[key] = min(int(cfg[key]), int(cap))
    if cfg.get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            cfg["device"] = "cpu"
    return cfg


def widgets_live() -> bool:
    """True when widgets should render live (ipywidgets), False for the static matplotlib fallback.

    ``LLMCOURSE_WIDGETS=live`` or ``=static`` overrides the profile (the browser tests set ``live``).
    """
    forced = os.environ.get("LLMCOURSE_WIDGETS", "").strip().lower()
    if forced in {"live", "static"}:
        return forced == "live"
    return profile().get("widgets", "live") == "live"


def seed_everything(seed: int = 0) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch's CPU (and CUDA) generators."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup_notebook(unit: str | None = None, seed: int | None = None, quiet: bool = False) -> dict:
    """The first call in every notebook: offline switches, threads, seeds; returns the profile.

    Sets ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1``, calls ``torch.set_num_threads`` with
    the profile's ``torch_threads``, seeds everything with ``seed`` (default: the profile's), and
    prints one line naming the profile so a reader knows which sizes ran. In an exercise notebook opened in
    JupyterLab it also starts the check server and keeps it warm while the kernel runs
    (:func:`llmcourse.selfcheck.keep_check_server_warm`).
    """
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    cfg = profile(unit)
    torch.set_num_threads(int(cfg.get("torch_threads", 2)))
    seed_everything(cfg.get("seed", 0) if seed is None else seed)
    if not quiet:
        mode = "live widgets" if widgets_live() else "static figures"
        print(f"llmcourse profile '{cfg['name']}' on {cfg['device']} ({mode}); torch {torch.__version__}")
    from .selfcheck import keep_check_server_warm

    keep_check_server_warm()  # an exercise opened in JupyterLab: its first check (and later ones) start warm
    return cfg


def read_bandwidth(nbytes: int = 256 << 20, repeats: int = 7) -> float:
    """The machine's memory read bandwidth in bytes/s, as torch sees it with its current thread count.

    The best of ``repeats`` timed ``sum()`` reductions over a float32 tensor of ``nbytes`` bytes (a sum reads
    every byte once and does one addition per 4 bytes, so it runs at the speed memory delivers data). Choose
    ``nbytes`` larger than what the workload you compare with reads per step; on a CPU whose last-level cache
    holds the buffer, the figure is that cache's read rate, which is also where a smaller workload's bytes come
    from. Units 12 (the decoding roofline) and ``course bench decode`` use it.

    Raises:
        ValueError: ``nbytes < 4`` or ``repeats < 1``.
    """
    import time

    import torch

    if nbytes < 4 or repeats < 1:
        raise ValueError(f"need nbytes ≥ 4 and repeats ≥ 1, got {nbytes}, {repeats}")
    x = torch.ones(nbytes // 4)
    x.sum()  # fault the pages in and warm the kernel
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best
