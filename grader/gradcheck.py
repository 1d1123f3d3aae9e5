"""Gradient probes: does backpropagation through the learner's code reach what it should, with the right values?

**Why a check probes gradients.** A function or module used inside a model must let gradients flow. An answer that
detaches an intermediate result (``.detach()``, ``.data``, ``torch.no_grad()``, a value rebuilt with
``torch.tensor(...)``) computes every output value right and trains nothing, so a check that compares outputs only
cannot see it. The probes below observe it by its effect: they backpropagate a fixed, seeded random weighting of
the output (``(out * w).sum()``, ``w`` normal with the output's shape, so that no gradient of a correct answer
cancels by symmetry) and return the gradients; the check compares them with the reference's.

**Two kinds of probed code, one pair of helpers each.**

* A *function* of tensors (units 00, 03: ``split_heads``, ``softmax_stable``, ``scaled_dot_product_attention``):
  :func:`function_gradient_probe` returns ``d(sum(w * out)) / d args[i]`` for the chosen inputs;
  :func:`check_function_gradients` fails when no gradient reaches the inputs at all (the output is detached from
  them), then compares the gradients with the reference's (float32 sums of a few O(1) products: 1e-5).
* A *module* (units 04-07: attention, blocks, whole models): :func:`module_gradient_probe` returns the gradients of
  the floating inputs and of every named parameter; :func:`check_module_gradients` requires that every parameter
  the reference's gradient reaches is reached (a parameter cut off from the output would never train), then compares
  the input gradients with the reference's (float32 sums of O(1) products over at most a few hundred terms: 1e-4).

The probes run in the learner's process like any other probe (they are closures, pickled by value); expected
values are never captured: the reference's gradients come from running the same probe on ``t.reference``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from .core import unwrap

__all__ = ["check_function_gradients", "check_module_gradients", "function_gradient_probe", "module_gradient_probe"]


# ------------------------------------------------------------------------------------------------ functions

def function_gradient_probe(fn_name: str, args: tuple, wrt: tuple[int, ...], seed: int = 0,
                            guard: Callable | None = None, pick: Callable | None = None):
    """A probe of ``impl.<fn_name>(*args)``: the gradients ``d(sum(w * out)) / d args[i]`` for ``i in wrt``.

    ``w`` is a normal tensor of each floating output's shape (``torch.Generator().manual_seed(seed)``; a tuple or
    list output contributes every floating tensor in it). ``pick(out)`` selects the output when given (e.g. the
    context of a ``(context, weights)`` pair); ``guard`` is a context-manager factory entered around the call (a
    ``forbid`` of the built-in the exercise replaces). The probe returns a list with one gradient (or None) per
    input of ``wrt``, or None when no floating output depends on the inputs through the autograd graph.
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


def check_function_gradients(t, probe, what: str, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Run ``probe`` (from :func:`function_gradient_probe`) on the learner and on the reference.

    Fails when no gradient reaches any probed input (a detached output), else when the gradients differ from the
    reference's beyond ``atol``/``rtol`` (``t.compare``: a catalogued bug that reproduces them is named).
    """
    got = t.run(probe)
    if got is None or all(gr is None for gr in got):
        t.fail(f"{what}: no gradient reaches the inputs (the output is detached from them: .detach(), .data or "
               "torch.no_grad() somewhere inside); a function used in a model must let gradients flow")
    expected = probe(t.reference)
    t.compare(probe, expected, f"{what}: the gradient of a random weighting of the output, vs the reference's",
              atol=atol, rtol=rtol)


# ------------------------------------------------------------------------------------------------ modules

def module_gradient_probe(build: Callable, inputs, seed: int = 17, wrap: Callable | None = None):
    """A probe of the module ``build(impl)`` (built in the mode it should be checked in, e.g. eval).

    Backpropagates ``(module(*inputs) * w).sum()``, ``w`` a normal tensor of the output's shape
    (``torch.Generator().manual_seed(seed)``), with grad enabled. The probe returns ``(input_grads, param_grads)``:
    the gradients of the floating tensors of ``inputs`` (a list, in order; other inputs such as token ids or masks
    are passed unchanged and skipped) and ``{name: grad or None}`` over the module's named parameters. ``wrap``
    wraps the probe when given (e.g. ``with_course_parts``, which lets it build the reference's sub-modules).
    """

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


def check_module_gradients(t, probe, what: str, atol: float = 1e-4, rtol: float = 1e-4) -> None:
    """Run ``probe`` (from :func:`module_gradient_probe`) on the reference and on the learner.

    Every parameter whose gradient the reference's backward reaches (nonzero) must be reached by the learner's
    too (else: which ones were cut off); then the input gradients must agree with the reference's within
    ``atol``/``rtol`` (``t.compare``: a catalogued bug that reproduces them is named). Tolerance: the gradients
    compared are sums of O(1) float32 products over at most a few hundred terms.
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
