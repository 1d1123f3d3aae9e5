"""Checks of unit 00 (PyTorch essentials).

Oracles: ``x.view(B, T, H, hd).transpose(1, 2)`` for head splitting, ``ones(t_q, t_k).tril(offset)``
for causal masks, ``@`` for the einsum products, ``F.cross_entropy(..., label_smoothing=ε,
ignore_index=...)`` for the loss (computed by the grader; the learner's call runs with
``F.cross_entropy`` blocked), the closed-form Noam formula and a real ``LambdaLR`` driving an
``SGD`` optimizer for the schedule. Fixtures F00.1–F00.4 are the syllabus's values. Dropout is
checked by properties only (eval is deterministic, train-mode branches are 0 or 1/(1−p) times the
branch), never by its mask.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import nn

from ..core import CheckFailure, LearnerError, check, forbid, unwrap
from ..gradcheck import check_function_gradients, function_gradient_probe
from ..plain import Opaque
from ..runner import also_blocked
from ..strength import decision, defining_property

U = "00"
T = torch.tensor


def _ref():
    from llmcourse.nn import einsum, heads, masks, residual
    from llmcourse.train import losses, schedules

    return {
        "split_heads": heads.split_heads, "merge_heads": heads.merge_heads,
        "causal_mask": masks.causal_mask,
        "attention_scores_einsum": einsum.attention_scores_einsum,
        "attention_output_einsum": einsum.attention_output_einsum,
        "label_smoothed_cross_entropy": losses.label_smoothed_cross_entropy,
        "noam_lambda": schedules.noam_lambda, "make_noam_scheduler": schedules.make_noam_scheduler,
        "ResidualStack": residual.ResidualStack,
    }


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _tname(x) -> str:
    """The type name of a value that came back from a probe (an opaque marker names the learner's type)."""
    if isinstance(x, Opaque):
        return x.type_name.rsplit(".", 1)[-1]
    return type(x).__name__


def _is_tensor(x, shape=None) -> bool:
    return isinstance(x, torch.Tensor) and (shape is None or tuple(x.shape) == tuple(shape))


def _shape(x):
    return tuple(x.shape) if isinstance(x, torch.Tensor) else _tname(x)


# ================================================================== 00.split_merge_heads


def _merged_is_contiguous(y):
    """A probe: whether ``merge_heads(y)`` is contiguous (a fact only the learner's process can see:
    results come back as contiguous copies). It can only make the check fail."""

    def probe(impl):
        out = impl.merge_heads(y)
        return bool(out.is_contiguous()) if isinstance(out, torch.Tensor) else False

    return probe


@check(f"{U}.split_merge_heads", ["split_heads", "merge_heads"], _ref)
def check_split_merge_heads(t):
    # F00.1: (2, 6, 16) -> (2, 4, 6, 4) -> (2, 6, 16)
    x = _rand(2, 6, 16, seed=1)
    s = t.run(lambda impl: impl.split_heads(x, 4))
    t.expect(_is_tensor(s, (2, 4, 6, 4)), f"split_heads(x of shape (2, 6, 16), n_heads=4) must have shape "
             f"(2, 4, 6, 4) = (B, H, T, head_dim); got {_shape(s)}")
    for i, (b, tt, d, h) in enumerate([(2, 6, 16, 4), (3, 5, 12, 3), (1, 7, 8, 8), (2, 4, 10, 1), (2, 3, 24, 6)]):
        x = _rand(b, tt, d, seed=10 + i)
        t.compare(lambda impl, x=x, h=h: impl.split_heads(x, h), x.view(b, tt, h, d // h).transpose(1, 2),
                  f"split_heads(x of shape {(b, tt, d)}, n_heads={h}) vs x.view(B, T, H, hd).transpose(1, 2)",
                  atol=0, rtol=0)

    # merge_heads on a contiguous (B, H, T, hd) tensor, as attention returns it
    y = _rand(2, 4, 6, 4, seed=2)
    t.compare(lambda impl: impl.merge_heads(y), y.transpose(1, 2).reshape(2, 6, 16),
              "merge_heads of a contiguous (2, 4, 6, 4) tensor (the shape of attention's output)", atol=0, rtol=0)
    # returned tensors arrive as contiguous copies: the layout is read where the learner's code ran
    t.expect(t.run(_merged_is_contiguous(y)),
             "merge_heads must return a contiguous tensor (call .contiguous() before .view)")
    y = _rand(3, 2, 5, 7, seed=3)
    t.compare(lambda impl: impl.merge_heads(y), y.transpose(1, 2).reshape(3, 5, 14),
              "merge_heads of a (3, 2, 5, 7) tensor", atol=0, rtol=0)
    y_nc = _rand(4, 2, 6, 3, seed=4).transpose(0, 1)  # (2, 4, 6, 3), not contiguous
    t.compare(lambda impl: impl.merge_heads(y_nc), y_nc.transpose(1, 2).reshape(2, 6, 12),
              "merge_heads of a non-contiguous (2, 4, 6, 3) tensor", atol=0, rtol=0)
    t.expect(t.run(_merged_is_contiguous(y_nc)),
             "merge_heads must return a contiguous tensor, also for non-contiguous input")

    # round trip, contiguous and non-contiguous inputs
    inputs = [("a contiguous (2, 6, 16) tensor", _rand(2, 6, 16, seed=5), 4),
              ("a non-contiguous (2, 6, 16) tensor (a transposed (6, 2, 16))", _rand(6, 2, 16, seed=6).transpose(0, 1), 4),
              ("a non-contiguous (2, 6, 12) tensor (a transposed (2, 12, 6))", _rand(2, 12, 6, seed=7).transpose(1, 2), 3)]
    for what, x, h in inputs:
        back = t.run(lambda impl, x=x, h=h: impl.merge_heads(impl.split_heads(x, h)))
        t.expect(_is_tensor(back, x.shape) and bool(torch.equal(back, x)),
                 f"merge_heads(split_heads(x, {h})) must give back x exactly for {what}; got "
                 + (f"shape {_shape(back)}" if not _is_tensor(back, x.shape) else
                    f"max abs difference {(back - x).abs().max().item():.3g}"))

    # gradients flow through both
    check_function_gradients(t, function_gradient_probe("split_heads", (_rand(2, 6, 12, seed=8), 3), (0,)),
                    "split_heads(x of shape (2, 6, 12), 3)")
    check_function_gradients(t, function_gradient_probe("merge_heads", (_rand(2, 3, 6, 4, seed=9),), (0,)),
                    "merge_heads(x of shape (2, 3, 6, 4))")

    # D % n_heads != 0 -> ValueError
    got = t.raised(lambda impl: impl.split_heads(_rand(2, 6, 15), 4))
    t.expect(got == "ValueError", "split_heads(x of shape (2, 6, 15), n_heads=4) must raise ValueError "
             f"(15 is not divisible by 4); got {got}")


# ================================================================== 00.causal_mask

F002_3_5 = T([[True, True, True, False, False], [True, True, True, True, False], [True, True, True, True, True]])


@check(f"{U}.causal_mask", ["causal_mask"], _ref)
def check_causal_mask(t):
    m = t.run(lambda impl: impl.causal_mask(4))
    t.expect(_is_tensor(m, (4, 4)), f"causal_mask(4) must be a (4, 4) tensor; got {_shape(m)}")
    mb = m.bool() if m.dtype == torch.bool else (m != 0)
    t.expect(bool(mb[0, 0]) or not bool(mb[0, 3]),
             "causal_mask(4)[0, 0] is False and [0, 3] is True: query 0 may not see itself but may see the future",
             bug="B00.mask_polarity")
    t.expect(bool(mb.diagonal().all()),
             f"the diagonal of causal_mask(4) must be True; got {mb.diagonal().tolist()}", bug="B00.mask_diagonal")
    t.expect(m.dtype == torch.bool, f"the mask must have dtype torch.bool (True = may attend); got {m.dtype}")

    # F00.2
    t.compare(lambda impl: impl.causal_mask(4), torch.ones(4, 4).tril().bool(), "causal_mask(4)")
    t.compare(lambda impl: impl.causal_mask(3, 5), F002_3_5,
              "causal_mask(3, 5) (the 3 queries are the last 3 of 5 positions)")
    t.compare(lambda impl: impl.causal_mask(1, 5), torch.ones(1, 5, dtype=torch.bool),
              "causal_mask(1, 5) (one new token sees the whole prefix)")

    # R: 30 random (t_q, t_k, offset)
    rng = random.Random(0)
    for _ in range(30):
        t_q = rng.randint(1, 7)
        t_k = rng.randint(t_q, 10)
        offset = None if rng.random() < 0.4 else rng.randint(-2, t_k)
        expected = torch.ones(t_q, t_k).tril(t_k - t_q if offset is None else offset).bool()
        def probe(impl, a=t_q, b=t_k, o=offset):
            return impl.causal_mask(a, b) if o is None else impl.causal_mask(a, b, offset=o)

        what = f"causal_mask({t_q}, {t_k})" if offset is None else f"causal_mask({t_q}, {t_k}, offset={offset})"
        t.compare(probe, expected, f"{what}: entry (i, j) must be True iff j <= offset + i")

    # S: dtype and device
    cpu = t.run(lambda impl: impl.causal_mask(3, 5, device=torch.device("cpu")))
    t.expect(_is_tensor(cpu, (3, 5)) and cpu.dtype == torch.bool and cpu.device.type == "cpu",
             f"causal_mask(3, 5, device=torch.device('cpu')) must be a (3, 5) bool tensor on the CPU; got "
             f"{_shape(cpu)}, {getattr(cpu, 'dtype', None)}, {getattr(cpu, 'device', None)}")
    def on_meta(impl):  # the "meta" device exists everywhere; code that cannot run on it is not penalised
        try:
            return impl.causal_mask(3, 5, device=torch.device("meta"))
        except LearnerError:
            return None

    meta = t.run(on_meta)
    if meta is not None:
        t.expect(_is_tensor(meta) and meta.device.type == "meta",
                 f"causal_mask(3, 5, device=torch.device('meta')) returned a tensor on "
                 f"{getattr(meta, 'device', None)}: create the mask on the requested device")


# ================================================================== 00.einsum_attention


def _no_matmul():
    return forbid((torch, "matmul"), (torch, "bmm"), (torch.Tensor, "__matmul__"), (torch.Tensor, "matmul"),
                  (torch.Tensor, "bmm"), reason="write these products with torch.einsum.")


def _einsum_calls(name, args):
    """A probe: how many times the learner's ``name(*args)`` reaches torch's einsum kernel.

    ``torch.einsum`` (also when imported as ``from torch import einsum``) ends in ``torch._VF.einsum``,
    which is counted for the duration of the call."""

    def probe(impl):
        import importlib

        vf = importlib.import_module("torch._VF")  # by name: cloudpickle cannot send the module object
        had = "einsum" in vars(vf)
        original = vf.einsum
        calls = [0]

        def counted(*a, **kw):
            calls[0] += 1
            return original(*a, **kw)

        vf.einsum = counted
        try:
            with _no_matmul():
                getattr(impl, name)(*args)
        finally:
            if had:
                vf.einsum = original
            else:
                del vf.einsum
        return calls[0]

    return probe


@check(f"{U}.einsum_attention", ["attention_scores_einsum", "attention_output_einsum"], _ref)
def check_einsum_attention(t):
    def scores(q, k):
        def probe(impl):
            with _no_matmul():
                return impl.attention_scores_einsum(q, k)
        return probe

    def output(w, v):
        def probe(impl):
            with _no_matmul():
                return impl.attention_output_einsum(w, v)
        return probe

    # the defining property: both products go through torch.einsum (counted where the learner's code runs; a
    # count can only make the check fail, the values are compared below)
    g = torch.Generator().manual_seed(99)
    q0, k0, v0 = torch.randn(1, 2, 3, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 6, generator=g)
    w0 = torch.randn(1, 2, 3, 5, generator=g).softmax(-1)
    for name, args in (("attention_scores_einsum", (q0, k0)), ("attention_output_einsum", (w0, v0))):
        calls = t.run(_einsum_calls(name, args))
        t.expect(calls > 0, f"{name} computed its result without calling torch.einsum (0 calls counted): the "
                 "exercise is to write the product as an einsum equation")

    cases = [((2, 3, 5, 8), 7, 4), ((1, 4, 1, 16), 9, 6), ((3, 2, 6, 4), 6, 5)]
    for i, ((b, h, tq, d), tk, dv) in enumerate(cases):
        g = torch.Generator().manual_seed(100 + i)
        q, k = torch.randn(b, h, tq, d, generator=g), torch.randn(b, h, tk, d, generator=g)
        v = torch.randn(b, h, tk, dv, generator=g)
        raw = torch.randn(b, h, tq, tk, generator=g)
        s = t.run(scores(q, k))
        t.expect(_is_tensor(s, (b, h, tq, tk)), f"attention_scores_einsum(q {tuple(q.shape)}, k {tuple(k.shape)}) "
                 f"must have shape (B, H, T_q, T_k) = {(b, h, tq, tk)}; got {_shape(s)}")
        t.compare(scores(q, k), q @ k.transpose(-2, -1), f"raw scores for q {tuple(q.shape)}, k {tuple(k.shape)} vs "
                  "q @ k.transpose(-2, -1) (no scaling)", atol=1e-6, rtol=1e-5)
        w = raw.softmax(-1)
        o = t.run(output(w, v))
        t.expect(_is_tensor(o, (b, h, tq, dv)), f"attention_output_einsum(weights {tuple(w.shape)}, v "
                 f"{tuple(v.shape)}) must have shape (B, H, T_q, d_v) = {(b, h, tq, dv)}; got {_shape(o)}")
        t.compare(output(w, v), w @ v, f"context for weights {tuple(w.shape)}, v {tuple(v.shape)} vs weights @ v",
                  atol=1e-6, rtol=1e-5)
        t.compare(output(raw, v), raw @ v, f"attention_output_einsum with unnormalised weights {tuple(raw.shape)} "
                  "vs weights @ v", atol=1e-5, rtol=1e-5)
    check_function_gradients(t, function_gradient_probe("attention_scores_einsum", (q0, k0), (0, 1), guard=_no_matmul),
                    "attention_scores_einsum(q, k)")
    check_function_gradients(t, function_gradient_probe("attention_output_einsum", (w0, v0), (0, 1), guard=_no_matmul),
                    "attention_output_einsum(weights, v)")


# ================================================================== 00.label_smoothed_cross_entropy


def _no_builtin_ce():
    return forbid((F, "cross_entropy"), (torch._C._nn, "cross_entropy_loss"),
                  reason="compute the loss yourself from log_softmax.")


def _oracle_ce(logits, targets, eps, ignore_index=-100):
    c = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, c), targets.reshape(-1), label_smoothing=eps, ignore_index=ignore_index)


@check(f"{U}.label_smoothed_cross_entropy", ["label_smoothed_cross_entropy"], _ref)
def check_label_smoothed_cross_entropy(t):
    def call(logits, targets, **kw):
        def probe(impl):
            with _no_builtin_ce():
                return impl.label_smoothed_cross_entropy(logits, targets, **kw)
        return probe

    # F00.4
    z, y = T([[2.0, 1.0, 0.1]]), T([0])
    out = t.run(call(z, y))
    t.expect(_is_tensor(out) and out.dim() == 0,
             f"label_smoothed_cross_entropy must return a scalar (0-dim) tensor; got {_shape(out)}")
    t.compare(call(z, y), T(0.4170), "cross-entropy of logits [[2.0, 1.0, 0.1]], target [0]", atol=1e-4)
    t.compare(call(z, y, eps=0.1), T(0.5137), "the same with eps=0.1 (0.9·0.4170 + 0.1·1.3837)", atol=1e-4)

    # O: F.cross_entropy on 2-D and 3-D inputs with ignored positions
    g = torch.Generator().manual_seed(7)
    z2 = torch.randn(12, 7, generator=g) * 2
    y2 = torch.randint(0, 7, (12,), generator=g)
    y2[[2, 5, 11]] = -100
    for eps in (0.0, 0.1, 0.25):
        t.compare(call(z2, y2, eps=eps), _oracle_ce(z2, y2, eps),
                  f"(12, 7) logits, 3 targets = -100 (ignored), eps={eps}, vs F.cross_entropy", atol=1e-5, rtol=1e-5)
    z3 = torch.randn(2, 5, 6, generator=g)
    y3 = torch.randint(1, 6, (2, 5), generator=g)
    y3[0, 3:] = 0
    y3[1, 4] = 0
    t.compare(call(z3, y3, eps=0.1, ignore_index=0), _oracle_ce(z3, y3, 0.1, ignore_index=0),
              "(2, 5, 6) logits with padding id 0 as ignore_index, eps=0.1, vs F.cross_entropy", atol=1e-5, rtol=1e-5)
    y3b = torch.randint(0, 6, (2, 5), generator=g)
    t.compare(call(z3, y3b), _oracle_ce(z3, y3b, 0.0), "(2, 5, 6) logits, eps=0 (plain cross-entropy), vs "
              "F.cross_entropy", atol=1e-5, rtol=1e-5)

    # the loss trains the logits: its gradient reaches them (ignored positions get none)
    check_function_gradients(t, function_gradient_probe("label_smoothed_cross_entropy", (z3, y3, 0.1, 0), (0,), guard=_no_builtin_ce),
                    "label_smoothed_cross_entropy((2, 5, 6) logits, eps=0.1, ignore_index=0)")

    # P: huge logits stay finite
    zh = torch.randn(4, 5, generator=g) * 1e4
    yh = T([0, 1, 2, 3])
    out = t.run(call(zh, yh, eps=0.1))
    t.expect(_is_tensor(out) and bool(torch.isfinite(out).all()),
             f"logits of magnitude 1e4 must give a finite loss (use log_softmax, not log(softmax)); got {out}")
    t.compare(call(zh, yh, eps=0.1), _oracle_ce(zh, yh, 0.1), "logits of magnitude 1e4, eps=0.1, vs F.cross_entropy",
              atol=1e-2, rtol=1e-5)


# ================================================================== 00.noam_schedule

F003 = {1: 1.746928e-07, 100: 1.746928e-05, 1000: 1.746928e-04, 4000: 6.987712e-04, 8000: 4.941059e-04,
        16000: 3.493856e-04}


def _noam(step, d_model, warmup):
    s = max(step, 1)
    return d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)


def _drive(d_model, warmup, factor, n_steps, lr0=1e-4, record=None, resumed=False):
    """A probe: SGD with two param groups (lr0 and 0.5), the learner's scheduler, n_steps updates.

    Returns the lr of each group before each optimizer step (the lr that step uses), or only the steps
    listed in ``record``.
    """

    def probe(impl):
        p1, p2 = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([{"params": [p1]}, {"params": [p2], "lr": 0.5}], lr=lr0)
        if resumed:  # an optimizer that an earlier scheduler already drove: its groups carry "initial_lr"
            torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0)
        sched = impl.make_noam_scheduler(opt, d_model, warmup, factor=factor)
        if not isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
            raise CheckFailure(f"make_noam_scheduler must return a torch.optim.lr_scheduler.LambdaLR; got "
                               f"{type(sched).__name__}")
        lrs = []
        for n in range(1, n_steps + 1):
            if record is None or n in record:
                lrs.append([float(g["lr"]) for g in opt.param_groups])
            opt.step()
            try:
                sched.step()
            except Exception as exc:
                raise CheckFailure(f"scheduler.step() raised {type(exc).__name__}: {exc} (the lambda given to "
                                   "LambdaLR is called with the scheduler's step counter, an int)") from None
        return T(lrs, dtype=torch.float64)

    return probe


def _compare_rel(t, probe, expected, what: str, rtol: float = 1e-6, index_label=None):
    """Like ``t.compare`` but with a purely relative tolerance, also for the diagnosis.

    Learning rates are ~1e-7: the default absolute tolerance of the diagnosis would match any mutant.
    """
    got = t.run(probe)
    exp = torch.as_tensor(expected, dtype=torch.float64)
    try:
        val = torch.as_tensor(got, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        t.fail(f"{what}: expected a number, got {_tname(got)}")
    if val.shape != exp.shape:
        t.fail(f"{what}: expected shape {tuple(exp.shape)}, got {tuple(val.shape)}")
    bad = ~((val - exp).abs() <= rtol * exp.abs())
    if bool(bad.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        where = (f" ({index_label(idx)})" if index_label else f" at index {idx}") if idx else ""
        bug_id = None
        for b, impl in t.mutant_impls():
            try:
                out = torch.as_tensor(probe(impl), dtype=torch.float64)
            except Exception:
                continue
            if out.shape == val.shape and bool(((out - val).abs() <= rtol * out.abs()).all()):
                bug_id = b.id
                break
        t.fail(f"{what}: expected {exp[idx].item():.6e}{where}, got {val[idx].item():.6e}", bug=bug_id)
    return got


def _step_group(idx) -> str:
    return f"the lr used by optimizer step {idx[0] + 1} in param group {idx[1]}"


@check(f"{U}.noam_schedule", ["noam_lambda", "make_noam_scheduler"], _ref)
def check_noam_schedule(t):
    # F00.3
    for step, value in F003.items():
        _compare_rel(t, lambda impl, s=step: float(impl.noam_lambda(s, 512, 4000)), value,
                     f"noam_lambda({step}, d_model=512, warmup=4000)", rtol=2e-6)
    _compare_rel(t, lambda impl: float(impl.noam_lambda(0, 512, 4000)), F003[1],
                 "noam_lambda(0, 512, 4000): step 0 counts as step 1 (s = max(step, 1))", rtol=2e-6)
    for step in (1, 50, 99, 100, 101, 400):
        _compare_rel(t, lambda impl, s=step: float(impl.noam_lambda(s, 64, 100)), _noam(step, 64, 100),
                     f"noam_lambda({step}, d_model=64, warmup=100)")
    # P: the maximum over steps 1 … 8000 is at step = warmup
    values = t.run(lambda impl: [float(impl.noam_lambda(s, 512, 4000)) for s in range(1, 8001)])
    peak = max(range(8000), key=lambda i: values[i]) + 1
    t.expect(peak == 4000, f"the largest noam_lambda(step, 512, 4000) over steps 1…8000 must be at step 4000 "
             f"(= warmup); it is at step {peak}")

    # the scheduler: lr used by the n-th optimizer.step() is factor · λ(n), in every param group
    expected = T([[_noam(n, 512, 4000)] * 2 for n in range(1, 6)], dtype=torch.float64)
    got = t.run(_drive(512, 4000, 1.0, 5))
    ratio = (got / expected)[:, 0]
    t.expect(not bool(torch.allclose(ratio, torch.full_like(ratio, 1e-4), rtol=1e-3)),
             "the optimizer was built with lr=1e-4 and the lr before the first 5 steps is 1e-4 · λ(n) "
             f"({got[0, 0].item():.3e}, …): LambdaLR multiplies the base lr, so the peak would be "
             f"{1e-4 * F003[4000]:.3g} instead of {F003[4000]:.3g}", bug="B00.noam_base_lr")
    _compare_rel(t, _drive(512, 4000, 1.0, 5), expected,
                 "lr of both param groups before optimizer steps 1…5 (expected λ(1) … λ(5), d_model=512, "
                 "warmup=4000, factor=1, optimizer built with lr=1e-4)", index_label=_step_group)
    expected = T([[2.0 * _noam(n, 64, 3)] * 2 for n in range(1, 8)], dtype=torch.float64)
    _compare_rel(t, _drive(64, 3, 2.0, 7), expected,
                 "lr of the two param groups before optimizer steps 1…7 with d_model=64, warmup=3, factor=2.0 "
                 "(expected 2·λ(1) … 2·λ(7))", index_label=_step_group)
    _compare_rel(t, _drive(64, 3, 2.0, 4, resumed=True), expected[:4],
                 "the same with an optimizer that an earlier LambdaLR already drove (its groups carry 'initial_lr', "
                 "the base lr a new LambdaLR starts from)", index_label=_step_group)
    # the peak through the real scheduler (F00.3)
    got = t.run(_drive(512, 4000, 1.0, 4000, record={4000}))
    t.expect(bool(torch.allclose(got, torch.full_like(got, F003[4000]), rtol=1e-5, atol=0)),
             f"the lr used by optimizer step 4000 (the peak) must be {F003[4000]:.6e}; got {got[0, 0].item():.6e}",
             bug="B00.noam_base_lr" if math.isclose(got[0, 0].item(), 1e-4 * F003[4000], rel_tol=1e-3) else None)


# ================================================================== 00.ResidualStack


def _structure(impl):
    """A probe: ResidualStack(16, 4)'s parameters and state_dict (tensors, counted here) and its layer container."""
    mod = unwrap(impl.ResidualStack(16, 4))
    if not isinstance(mod, nn.Module):
        return {"is_module": False}
    layers = getattr(mod, "layers", None)
    return {"is_module": True, "parameters": dict(mod.named_parameters()), "state_dict": dict(mod.state_dict()),
            "layers_is_module_list": isinstance(layers, nn.ModuleList), "layers_type": type(layers).__name__}


def _dropout_attribute(impl):
    """A probe: what ResidualStack(8, 2, dropout=0.3).dropout is."""
    drop = getattr(unwrap(impl.ResidualStack(8, 2, dropout=0.3)), "dropout", None)
    is_dropout = isinstance(drop, nn.Dropout)
    return {"is_dropout": is_dropout, "p": float(drop.p) if is_dropout else None, "repr": repr(drop)[:200]}


def _param_count(params: dict) -> int:
    return sum(p.numel() for p in params.values() if isinstance(p, torch.Tensor))


@check(f"{U}.ResidualStack", ["ResidualStack"], _ref)
def check_residual_stack(t):
    from llmcourse.nn.residual import ResidualStack as Ref

    facts = t.run(_structure)
    t.expect(facts["is_module"], "ResidualStack must be an nn.Module subclass")
    n_params = _param_count(facts["parameters"])
    t.expect(n_params > 0, "ResidualStack(16, 4) registers 0 parameters: layers kept in a plain Python "
             "list are invisible to parameters(), state_dict() and the optimizer", bug="B00.plain_list")
    t.expect(facts["layers_is_module_list"], f"self.layers must be an nn.ModuleList; got {facts['layers_type']}")
    shapes = {k: tuple(v.shape) for k, v in facts["state_dict"].items() if isinstance(v, torch.Tensor)}
    want = {}
    for i in range(4):
        want[f"layers.{i}.weight"] = (16, 16)
        want[f"layers.{i}.bias"] = (16,)
    t.expect(shapes == want, f"state_dict keys/shapes of ResidualStack(16, 4) must be {want}; got {shapes}")
    t.expect(n_params == 1088, f"ResidualStack(16, 4) must have 4·(16² + 16) = 1,088 parameters; "
             f"got {n_params}")
    drop = t.run(_dropout_attribute)
    t.expect(drop["is_dropout"] and math.isclose(drop["p"], 0.3),
             f"ResidualStack(8, 2, dropout=0.3).dropout must be nn.Dropout(0.3); got {drop['repr']}")

    # eval mode: deterministic, equal to the reference with shared weights
    torch.manual_seed(3)
    ref = Ref(16, 3, dropout=0.5).eval()
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    x = _rand(2, 5, 16, seed=4)

    def shared(impl, p=0.5):
        mm = impl.ResidualStack(16, 3, dropout=p)
        unwrap(mm).load_state_dict(state)
        return mm

    def eval_twice(impl):
        mm = shared(impl)
        unwrap(mm).eval()
        return mm(x), mm(x)

    first, second = t.run(eval_twice)
    t.expect(_is_tensor(first, x.shape), f"forward must preserve the shape {tuple(x.shape)}; got {_shape(first)}")
    t.expect(bool(torch.equal(first, second)), "in eval() mode two calls gave different outputs: dropout is still "
             "active after model.eval()", bug="B00.dropout_in_eval")
    t.compare(lambda impl: eval_twice(impl)[0], ref(x), "ResidualStack(16, 3, dropout=0.5) in eval mode on a (2, 5, 16) "
              "input vs the reference with the same weights (x = x + layer(x) for each layer)", atol=1e-5)
    x2 = _rand(7, 16, seed=5)

    def train_no_dropout(impl):
        mm = shared(impl, p=0.0)
        unwrap(mm).train()
        return mm(x2)

    t.compare(train_no_dropout, ref(x2), "ResidualStack(16, 3, dropout=0.0) in train mode on a (7, 16) input",
              atol=1e-5)

    # train mode, one layer with weight 0 and bias 1: the branch is 1, so out − x ∈ {0, 1/(1−p) = 2}
    xb = _rand(8, 64, 16, seed=6)

    def branch_dropout(impl):
        mm = impl.ResidualStack(16, 1, dropout=0.5)
        layer = unwrap(mm).layers[0]
        with torch.no_grad():
            layer.weight.zero_()
            layer.bias.fill_(1.0)
        unwrap(mm).train()
        torch.manual_seed(11)
        return mm(xb) - xb

    delta = t.run(branch_dropout)
    is_0 = delta.abs() < 1e-5
    is_2 = (delta - 2).abs() < 1e-5
    if bool(((delta - 1).abs() < 1e-5).all()):
        # the constant branch came through untouched: dropout is missing, or acts on what the layer reads
        # (a layer with weight 0 ignores its input). A layer with weight I and bias 0 tells the two apart.
        def identity_branch(impl):
            mm = impl.ResidualStack(16, 1, dropout=0.5)
            layer = unwrap(mm).layers[0]
            with torch.no_grad():
                layer.weight.copy_(torch.eye(16))
                layer.bias.zero_()
            unwrap(mm).train()
            torch.manual_seed(12)
            return mm(xb) - xb

        branch = t.run(identity_branch)
        dropped = bool((branch.abs() < 1e-6).float().mean() > 0.3)
        t.fail("in train() mode with dropout=0.5 and one layer with weight 0 and bias 1 (a branch whose output is 1 "
               "whatever it reads), every entry of out − x is exactly 1: the branch's output is never dropped nor "
               "scaled by 1/(1−p)" + ("; with weight I and bias 0 the branch does lose entries, so dropout acts on "
                                      "the layer's input, not on its output" if dropped else ""),
               bug="B00.dropout_branch_input" if dropped else None)
    t.expect(bool((is_0 | is_2).all()),
             "in train() mode with dropout=0.5, one layer with weight 0 and bias 1, every entry of out − x must be "
             "0 (branch dropped) or 2 (branch kept, scaled by 1/(1−p)); got values such as "
             f"{sorted({round(v, 3) for v in delta[~(is_0 | is_2)].flatten()[:5].tolist()})}: dropout belongs on the "
             "branch, before the residual add, not on the sum", bug="B00.dropout_on_sum")
    frac = is_0.float().mean().item()
    t.expect(0.4 < frac < 0.6, f"in train() mode with dropout=0.5 about half the branch entries must be dropped; "
             f"{frac:.1%} were")

    # two layers, each branch constant 1: out − x = 2·m1 + 2·m2 with independent keep-masks m1, m2, so about
    # half the entries are 2 (one branch kept); one draw shared by the layers gives only 0 and 4
    def two_branches(impl):
        mm = impl.ResidualStack(16, 2, dropout=0.5)
        for layer in unwrap(mm).layers:
            with torch.no_grad():
                layer.weight.zero_()
                layer.bias.fill_(1.0)
        unwrap(mm).train()
        torch.manual_seed(13)
        return mm(xb) - xb

    delta2 = t.run(two_branches)
    share_2 = ((delta2 - 2).abs() < 1e-5).float().mean().item()
    t.expect(0.4 < share_2 < 0.6,
             "in train() mode with dropout=0.5 and two layers whose branches are constant 1, out − x must be 0, 2 or 4 "
             f"with 2 (exactly one branch kept) in about half the entries; it is 2 in {share_2:.1%}: each layer's "
             "branch must be dropped independently of the others")

    # the optimizer sees (and updates) every parameter: before/after tensors are compared here
    def one_step(impl):
        mm = impl.ResidualStack(16, 3)
        mod = unwrap(mm)
        before = {k: v.detach().clone() for k, v in mod.named_parameters()}
        opt = torch.optim.SGD(mod.parameters(), lr=0.1)
        loss = mm(x).pow(2).sum()
        try:
            loss.backward()
        except RuntimeError:  # no gradient reaches the parameters: reported below as "not updated"
            pass
        else:
            opt.step()
        return {k: (before[k], v) for k, v in mod.named_parameters()}

    pairs = t.run(one_step)
    changed = {k: isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor) and not torch.equal(b, a)
               for k, (b, a) in pairs.items()}
    stuck = [k for k, ok in changed.items() if not ok]
    t.expect(len(changed) == 6 and not stuck,
             f"an optimizer over model.parameters() must update all 6 tensors of ResidualStack(16, 3); "
             f"found {len(changed)}, not updated: {stuck}")


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# noam_schedule: the schedule widget's curve is the Noam multiplier at steps 1 … n
also_blocked(f"{U}.noam_schedule", "llmcourse.viz.essentials:noam_curve")


# ================================================================== the grader's strength, declared (grader/strength.py)
defining_property(
    f"{U}.split_merge_heads",
    "split_heads re-views the feature axis as H consecutive slices and moves the head axis before T; merge_heads is "
    "its exact inverse and returns a contiguous tensor, whatever the input's layout",
    probe="outputs compared bit-exactly with x.view(B, T, H, hd).transpose(1, 2) for five (D, H) pairs (non-square "
          "ones included); round trips on non-contiguous inputs; is_contiguous() read where the learner's code ran")
defining_property(
    f"{U}.causal_mask",
    "entry (i, j) is True exactly when key j is at or before query i's absolute position offset + i (the queries are "
    "the last t_q positions by default), as a bool tensor made on the requested device",
    probe="30 random (t_q, t_k, offset) compared with ones(t_q, t_k).tril(offset), an explicit offset=0 among them; "
          "dtype read; a mask requested on the 'meta' device")
defining_property(
    f"{U}.einsum_attention",
    "both attention products are einsum contractions whose summed axis carries the same letter in both inputs",
    probe="torch's einsum kernel counted during each call (@, matmul and bmm blocked); values against @ with "
          "T_q != T_k, d != d_v and unnormalised weights")
defining_property(
    f"{U}.label_smoothed_cross_entropy",
    "the loss mixes (1 - eps) of the target's negative log-probability with eps spread over all C classes, averaged "
    "over the positions whose target is not ignore_index",
    probe="F.cross_entropy(label_smoothing=eps, ignore_index=...) computed by the grader (blocked for the learner) "
          "on 2-D and 3-D logits, eps in {0, 0.1, 0.25}, ignore_index -100 and 0, logits of magnitude 1e4")
defining_property(
    f"{U}.noam_schedule",
    "the lr used by the n-th optimizer step equals factor * noam_lambda(n) in every param group, whatever lr the "
    "optimizer was built with",
    probe="a real SGD with two param groups (lr 1e-4 and 0.5) driven by the learner's scheduler; the lr of each group "
          "read before steps 1-7 (factor 1 and 2) and at the peak step 4000")
defining_property(
    f"{U}.ResidualStack",
    "each registered layer adds its own dropped-out branch to the residual stream (x <- x + dropout(layer(x))); the "
    "residual path itself is never dropped",
    probe="train-mode out - x with constant branches: values in {0, 1/(1-p)}, about p dropped, independent draws per "
          "layer; an identity branch separates dropout on the input; eval determinism; one optimizer step updates "
          "all six tensors")

decision(f"{U}.noam_schedule",
         "how LambdaLR's multiplier becomes an absolute learning rate whatever lr the optimizer was built with",
         forms=[r"\[\s*[\"']lr[\"']\s*\]\s*=\s*factor", r"\[\s*[\"']initial_lr[\"']\s*\]\s*=",
                r"base lr(s)? to `?factor", r"sets? (every|each) (param )?group's (base )?lr"],
         wrong=("B00.noam_base_lr",))
decision(f"{U}.noam_schedule",
         "which value of LambdaLR's step counter corresponds to the n-th optimizer step",
         forms=[r"noam_lambda\(\s*\w+\s*\+\s*1\b", r"λ\(\s*e\s*\+\s*1\s*\)", r"\b(e|step|epoch|count) \+ 1\b"],
         wrong=("B00.noam_off_by_one",))
