"""Stored ``transformers`` oracles: built once with ``transformers``, read by the checks as an asset.

Importing ``transformers`` dominates a ``course check`` (seconds), so a check that compares with a
``transformers`` model reads that model's weights and outputs from ``assets/oracles/uNN_*.pt`` instead.
A check module defines ``ORACLE_ASSET`` and a ``build_hf_oracle()`` that computes the dict with
``transformers`` (plain tensors, numbers, strings, lists and dicts only: the file is read with
``torch.load(weights_only=True)``), then::

    oracle = stored_oracle(ORACLE_ASSET, build_hf_oracle)      # the checks call oracle()

    def write_hf_oracle() -> None:                              # run after changing build_hf_oracle
        write_oracle(ORACLE_ASSET, build_hf_oracle)

and the unit's tests rebuild it and require equality with the file (:func:`assert_oracle_is_current`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from .core import FLOAT32_EPS, float32_floor, float32_scale

__all__ = ["F32_EPS", "F32_ULPS", "float32_atol", "assert_oracle_is_current", "assert_same", "load_oracle", "oracle_path", "stored_oracle", "write_oracle"]


def oracle_path(asset: str) -> Path:
    """``<course root>/assets/<asset>``."""
    from llmcourse.manifest import course_root

    return course_root() / "assets" / asset


def load_oracle(asset: str, build: Callable[[], dict]) -> dict:
    """The stored oracle (``torch.load(weights_only=True)``), or ``build()`` when the file is missing."""
    path = oracle_path(asset)
    return torch.load(path, weights_only=True) if path.exists() else build()


def stored_oracle(asset: str, build: Callable[[], dict]) -> Callable[[], dict]:
    """A cached ``oracle()`` that loads ``asset`` once per process (or builds it when the file is missing)."""

    @functools.lru_cache(maxsize=1)
    def oracle() -> dict:
        return load_oracle(asset, build)

    oracle.__doc__ = f"The stored transformers oracle ``assets/{asset}`` (loaded once; rebuilt if missing)."
    return oracle


def write_oracle(asset: str, build: Callable[[], dict]) -> None:
    """Compute ``build()`` and save it as ``assets/<asset>``."""
    path = oracle_path(asset)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(build(), path)


def assert_same(a, b, path: str = "oracle", atol: float = 1e-6, rtol: float = 1e-6) -> None:
    """Recursive equality of two oracles: same keys, lengths and values; tensors of the same dtype and
    shape, floating ones within ``atol``/``rtol`` plus ``grader.core.float32_floor`` of the stored value (a rebuild
    on another CPU rounds differently, by a few float32 ulps at the values' scale), others exactly. Raises AssertionError naming the first differing path (``oracle.cases[1].logits``)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys differ"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}", atol, rtol)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", atol, rtol)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, \
            f"{path}: dtype/shape {getattr(b, 'dtype', type(b))} {tuple(getattr(b, 'shape', ()))} != {a.dtype} {tuple(a.shape)}"
        if a.is_floating_point():
            floor = float32_floor(a) if (atol or rtol) else 0.0
            torch.testing.assert_close(b, a, atol=atol + floor, rtol=rtol, msg=lambda m: f"{path}: {m}")
        else:
            assert torch.equal(a, b), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_oracle_is_current(asset: str, build: Callable[[], dict], atol: float = 1e-6, rtol: float = 1e-6) -> dict:
    """Rebuild the oracle with ``transformers`` and require it to equal the stored file within ``atol``/``rtol``
    (pass the check's own tolerance where a rebuild on another CPU rounds further than 1e-6); returns the stored
    one."""
    stored = torch.load(oracle_path(asset), weights_only=True)
    assert_same(stored, build(), atol=atol, rtol=rtol)
    return stored


# The per-path float32 tolerance (item 3 of "Tolerances" in grader.core's module docstring, which says when a check
# uses it rather than relying on grader.core.float32_floor alone): each rounding is half an ulp of the partial sum and
# the errors of a length-n reduction grow like sqrt(n) ulps of its scale (a random walk; Higham, Accuracy and
# Stability of Numerical Algorithms, §4.2), so a float32 result compared with a reference computed elsewhere (a
# stored oracle) or otherwise (another kernel) is allowed F32_ULPS ulps at the expected output's largest magnitude
# times sqrt(n), n the summed length of the reductions on the path from the inputs to the output.
F32_EPS = FLOAT32_EPS  # the same machine epsilon as grader.core's floor (kept under this name for the checks)
F32_ULPS = 8


def float32_atol(expected: torch.Tensor, reduction: int = 1, floor: float = 1e-5) -> float:
    """The absolute tolerance of a float32 result ``expected`` reached through reductions of summed length
    ``reduction``: ``F32_ULPS`` ulps at its largest finite magnitude (:func:`grader.core.float32_scale`) times
    ``sqrt(reduction)``, never below ``floor``."""
    return max(floor, F32_ULPS * F32_EPS * float32_scale(expected) * reduction ** 0.5)
