"""Gradient probes shared by the checks of units 00-03: does a gradient reach the inputs, and is it the right one?

A graded function used inside a model must let gradients flow: an answer that detaches an intermediate result
(``.detach()``, ``.data``, ``torch.no_grad()``) computes the right values and trains nothing. The probe below
backpropagates a fixed random weighting of the output and returns the gradients of the chosen inputs; the check
compares them with the reference's. It lives in ``grader.checks`` so that it is sent to the worker by value.
"""

from __future__ import annotations

import contextlib

import torch


def input_gradients(fn_name: str, args: tuple, wrt: tuple[int, ...], seed: int = 0, guard=None, pick=None):
    """A probe: ``d(sum(w * out)) / d args[i]`` for ``i in wrt``, with ``w`` a seeded normal tensor per output.

    ``out`` is ``impl.<fn_name>(*args)`` (``pick(out)`` when given: e.g. the context of a (context, weights)
    pair); ``guard`` is a context-manager factory entered around the call (a ``forbid``). Returns a list with one
    gradient (or None) per input of ``wrt``, or None when no floating output depends on them through the graph.
    """

    def probe(impl):
        xs = [a.detach().clone().requires_grad_(True) if i in wrt else a for i, a in enumerate(args)]
        with guard() if guard is not None else contextlib.nullcontext():
            out = getattr(impl, fn_name)(*xs)
        if pick is not None:
            out = pick(out)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        g = torch.Generator().manual_seed(seed)
        total = None
        for o in outs:
            if isinstance(o, torch.Tensor) and o.is_floating_point():
                w = torch.randn(o.shape, generator=g, dtype=o.dtype)
                if o.requires_grad:
                    term = (o * w).sum()
                    total = term if total is None else total + term
        if total is None:
            return None
        return list(torch.autograd.grad(total, [xs[i] for i in wrt], allow_unused=True))

    return probe


def gradient_message(what: str, got) -> str | None:
    """The failure to report when ``got`` (a probe's result) carries no gradient at all, else None."""
    if got is None or all(gr is None for gr in got):
        return (f"{what}: no gradient reaches the inputs (the output is detached from them: .detach(), .data or "
                "torch.no_grad() somewhere inside); a function used in a model must let gradients flow")
    return None


def check_gradients(t, probe, what: str, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Run ``probe`` (from :func:`input_gradients` or alike) on the learner and on the reference; fail when no
    gradient arrives, or when it differs from the reference's."""
    got = t.run(probe)
    message = gradient_message(what, got)
    if message is not None:
        t.fail(message)
    expected = probe(t.reference)
    t.compare(probe, expected, f"{what}: the gradient of a random weighting of the output, vs the reference's",
              atol=atol, rtol=rtol)
