"""Train-mode dropout judged by its properties (checker side only; never shipped to a worker).

Dropout masks are random, so checks never compare them bit for bit. They build inputs for which
the dropped tensor can be read off the output exactly, then test:

* **where** dropout acts: two output channels that carry the *same* attention weights (the value
  vectors are duplicated) must be dropped identically; dropout on the values or on the output
  draws them independently;
* **that** it acts: in train mode with ``p > 0`` some entries are zeroed;
* **how** survivors are scaled: every kept entry equals ``w / (1 − p)`` (inverted dropout);
* **how often**: the zero fraction is within a few standard errors of ``p``.

:func:`weight_dropout_problem` returns ``None`` when all hold, else ``(kind, message)`` with kind
``"missing"``, ``"not_on_weights"``, ``"scale"`` or ``"fraction"`` (checks map kinds to bug ids).
"""

from __future__ import annotations

import math

import torch

__all__ = ["weight_dropout_problem", "zero_fraction_bounds"]


def zero_fraction_bounds(p: float, n: int, sigmas: float = 5.0, floor: float = 0.08) -> tuple[float, float]:
    """Accepted range of the zero fraction of ``n`` Bernoulli(p) draws."""
    half = max(floor, sigmas * math.sqrt(p * (1 - p) / max(n, 1)))
    return p - half, p + half


def weight_dropout_problem(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor, p: float,
                           where: str = "the attention weights") -> tuple[str, str] | None:
    """Judge dropped weights read off twice (``a`` and ``b``, same shape as the clean weights ``w``).

    Args:
        a, b: the train-mode output's two copies of ``dropout(w)`` (float tensors, any shape).
        w: the pre-dropout weights, computed by the checker (same shape).
        p: the dropout probability used.
    """
    a, b, w = a.double(), b.double(), w.double().expand_as(a)
    scale = 1.0 / (1.0 - p)
    if torch.allclose(a, w, atol=1e-5) and torch.allclose(b, w, atol=1e-5):
        return "missing", (f"in train mode with dropout p={p:g} the output equals the no-dropout output: dropout "
                           f"is missing from {where} (or it is not active in train mode)")
    if not torch.allclose(a, b, atol=1e-5):
        return "not_on_weights", (f"in train mode, two value channels that receive the same attention weights were "
                                  f"dropped differently: dropout must act on {where} (one draw per query–key "
                                  "pair, after the softmax), not on the values or the output")
    live = w > 1e-6
    if bool((a[~live].abs() > 1e-6).any()):
        return "scale", "in train mode, a weight that is 0 before dropout (a masked key) became non-zero"
    kept = a[live].abs() > 1e-7
    survivors_ok = torch.allclose(a[live][kept], scale * w[live][kept], atol=1e-5, rtol=1e-4)
    if not survivors_ok:
        ratio = (a[live][kept] / w[live][kept]).median().item() if bool(kept.any()) else float("nan")
        return "scale", (f"in train mode with dropout p={p:g}, every kept weight must equal w/(1−p) = {scale:.4g}·w "
                         f"(inverted dropout, after the softmax); the kept entries are about {ratio:.4g}·w, or not "
                         "a fixed multiple of w")
    n = int(live.sum())
    frac = 1.0 - float(kept.float().mean())
    lo, hi = zero_fraction_bounds(p, n)
    if not lo <= frac <= hi:
        return "fraction", (f"in train mode with dropout p={p:g}, {frac:.1%} of {n} attention weights were zeroed; "
                            f"expected about {p:.0%} (between {lo:.1%} and {hi:.1%})")
    return None
