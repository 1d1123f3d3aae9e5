"""Backpropagation checked by its effect (checker side): a detached intermediate cuts training off without changing
one output value, so checks that compare outputs only cannot see it.

:func:`gradient_probe` builds a probe (run in the learner's process like any other) that backpropagates a fixed
random projection of a module's output and returns the gradients of the floating inputs and of every parameter;
:func:`check_gradients` runs it on the reference (here) and on the learner, then requires that every parameter the
reference's gradient reaches is reached, and that the input gradients agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .core import unwrap


def gradient_probe(build: Callable, inputs, seed: int = 17, wrap: Callable | None = None):
    """Probe: ``build(impl)`` -> module (in the mode it should be checked in); gradients of
    ``(module(*inputs) * w).sum()`` (``w`` a seeded normal tensor of the output's shape) w.r.t. the floating
    inputs (list) and every named parameter (dict, ``None`` where no gradient arrived)."""

    def probe(impl):
        m = build(impl)
        with torch.enable_grad():
            xs = [a.clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                  for a in inputs]
            out = m(*xs)
            w = torch.randn(tuple(out.shape), generator=torch.Generator().manual_seed(seed))
            (out * w).sum().backward()
        mod = unwrap(m)
        params = {n: p.grad for n, p in mod.named_parameters()} if isinstance(mod, nn.Module) else {}
        return [a.grad for a in xs if isinstance(a, torch.Tensor) and a.is_floating_point()], params

    return wrap(probe) if wrap is not None else probe


def check_gradients(t, probe, what: str, atol: float = 1e-4, rtol: float = 1e-4) -> None:
    """Every parameter the reference's gradient reaches must be reached, and the input gradients must agree.

    Tolerance: the gradients compared are sums of O(1) float32 products over at most a few hundred terms.
    """
    ref_inputs, ref_params = probe(t.reference)
    _, got_params = t.run(probe)
    reached = {n for n, g in ref_params.items() if g is not None and bool(g.abs().sum() > 0)}
    got_params = got_params if isinstance(got_params, dict) else {}
    cut = sorted(n for n in reached if not isinstance(got_params.get(n), torch.Tensor)
                 or not bool(got_params[n].abs().sum() > 0))
    t.expect(not cut, f"{what}: after backward() no gradient reached {cut[:6]}: something on the way from these "
             "parameters to the output is detached (or not computed from them), so training would never change them")
    t.compare(probe, ref_inputs, f"{what}: gradient of a random projection of the output w.r.t. the input(s)",
              atol=atol, rtol=rtol, pick=lambda o: o[0])
