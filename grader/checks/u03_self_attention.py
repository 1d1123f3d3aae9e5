"""Checks of unit 03 (self-attention).

Oracles: ``torch.softmax`` and ``torch.nn.functional.scaled_dot_product_attention``. Fixtures are
the syllabus's F03.1–F03.4 values (4 decimals, ``atol 1e-4``); every comparison with the reference
shares weights. Dropout is checked by its properties (survivors equal w/(1−p), eval is the
identity, the train-mode mean is unbiased), never by its mask.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..core import check, forbid, module_facts, unwrap
from ..dropout import weight_dropout_problem
from ..gradcheck import check_function_gradients, function_gradient_probe
from ..runner import also_blocked
from ..strength import decision, defining_property

U = "03"
# train-mode dropout problems (grader.dropout kinds) -> bug ids, when no mutant matches the output
_DROPOUT_BUGS = {"missing": "B03.dropout_missing", "not_on_weights": "B03.dropout_not_on_weights"}
T = torch.tensor


def _ref():
    from llmcourse.nn import attention as A

    return {
        "softmax_stable": A.softmax_stable, "simple_attention": A.simple_attention,
        "scaled_dot_product_attention": A.scaled_dot_product_attention,
        "SelfAttention": A.SelfAttention, "CausalSelfAttention": A.CausalSelfAttention,
    }


# F03.2: "Your journey starts with one step"
X6 = T([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
        [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
F032_W = T([[0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452], [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
            [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565], [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
            [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295], [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896]])
F032_C = T([[0.4421, 0.5931, 0.5790], [0.4419, 0.6515, 0.5683], [0.4431, 0.6496, 0.5671],
            [0.4304, 0.6298, 0.5510], [0.4671, 0.5910, 0.5266], [0.4177, 0.6503, 0.5645]])
# F03.3 (seed 123, torch.rand(3, 2) three times)
F033_W = T([[0.1551, 0.2104, 0.2059, 0.1413, 0.1074, 0.1799], [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820],
            [0.1503, 0.2256, 0.2192, 0.1315, 0.0914, 0.1819], [0.1591, 0.1994, 0.1962, 0.1477, 0.1206, 0.1769],
            [0.1610, 0.1949, 0.1923, 0.1501, 0.1265, 0.1752], [0.1557, 0.2092, 0.2048, 0.1419, 0.1089, 0.1794]])
F033_C = T([[0.2996, 0.8053], [0.3061, 0.8210], [0.3058, 0.8203], [0.2948, 0.7939], [0.2927, 0.7891], [0.2990, 0.8040]])
# F03.4 (same recipe, causal)
F034_W_ROWS = {1: [0.3986, 0.6014, 0, 0, 0, 0], 2: [0.2526, 0.3791, 0.3683, 0, 0, 0],
               3: [0.2265, 0.2839, 0.2794, 0.2103, 0, 0], 4: [0.1952, 0.2363, 0.2331, 0.1820, 0.1534, 0]}
F034_C = T([[0.1855, 0.8812], [0.3116, 0.9549], [0.3395, 0.9652], [0.3129, 0.8747], [0.2865, 0.7897], [0.2990, 0.8040]])


def f033_weights() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The seed-123 recipe: Wq, Wk, Wv of shape (3, 2) (row-vector math: q = x @ Wq)."""
    g = torch.Generator().manual_seed(123)
    return tuple(torch.rand(3, 2, generator=g) for _ in range(3))


def f033_state_dict() -> dict:
    wq, wk, wv = f033_weights()
    return {"W_query.weight": wq.T.contiguous(), "W_key.weight": wk.T.contiguous(), "W_value.weight": wv.T.contiguous()}


def _module_state(module) -> dict:
    return {k: v.clone() for k, v in unwrap(module).state_dict().items()}


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _expect_float32(t, out, what):
    """The contract of every exercise here: float32 in, float32 out. ``out`` is what ``what`` returned for float32
    inputs (a tensor or a tuple of tensors); a float64 result is the named mistake B03.float64_output."""
    got = [x.dtype for x in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(x, torch.Tensor)]
    wrong = sorted({str(d).replace("torch.", "") for d in got if d != torch.float32})
    t.expect(not wrong, f"{what} on float32 inputs returned {', '.join(wrong)} tensors: float32 in must give float32 "
             "out", bug="B03.float64_output" if "float64" in wrong else None)


# ================================================================== 03.softmax_stable

SOFTMAX_FIXTURES = [
    ([1.0, 2.0, 3.0, 6.0], [0.0063, 0.0170, 0.0463, 0.9304]),
    ([2.0, 3.0, 5.0], [0.0420, 0.1142, 0.8438]),
    ([2.0, 3.0, float("-inf")], [0.2689, 0.7311, 0.0]),
    ([11.0, 10.2, 10.1, 10.4, 11.2], [0.2758, 0.1239, 0.1121, 0.1513, 0.3368]),
    ([0.1, -0.2, 0.3, -0.2, 0.5], [0.1925, 0.1426, 0.2351, 0.1426, 0.2872]),
    ([0.8, -1.6, 2.4, -1.6, 4.0], [0.0326, 0.0030, 0.1615, 0.0030, 0.8000]),
]


def _no_builtin_softmax():
    return forbid((torch, "softmax"), (torch.Tensor, "softmax"), (F, "softmax"), (torch.special, "softmax"),
                  reason="implement the softmax with exp, a maximum and a sum.")


@check(f"{U}.softmax_stable", ["softmax_stable"], _ref)
def check_softmax_stable(t):
    def call(x, dim=-1):
        def probe(impl):
            with _no_builtin_softmax():
                return impl.softmax_stable(x, dim=dim)
        return probe

    _expect_float32(t, t.run(call(T(SOFTMAX_FIXTURES[0][0]))), f"softmax_stable({SOFTMAX_FIXTURES[0][0]})")
    # small inputs first: a result that is wrong (or NaN) everywhere fails here, before the overflow detector
    for values, expected in SOFTMAX_FIXTURES:
        t.compare(call(T(values)), T(expected), f"softmax_stable({values})", atol=1e-4)
    big = T([1000.0, 1001.0])
    out = t.run(call(big))
    t.expect(isinstance(out, torch.Tensor), f"softmax_stable must return a tensor, got {type(out).__name__}")
    t.expect(bool(torch.isfinite(out).all()),
             f"softmax_stable([1000, 1001]) returned {out.tolist()}: exp overflows for large inputs",
             bug="B03.naive_softmax")
    t.compare(call(big), T([0.2689, 0.7311]), "softmax_stable([1000, 1001])", atol=1e-4)
    huge = _rand(3, 6, seed=1) * 1e4
    out = t.run(call(huge))
    t.expect(bool(torch.isfinite(out).all()), "inputs of magnitude 1e4 must not give NaN or inf", bug="B03.naive_softmax")
    for shape, dim in [((4, 7), -1), ((2, 3, 5), -1), ((2, 3, 5), 1), ((5, 3), 0)]:
        x = _rand(*shape, seed=sum(shape) + dim)
        t.compare(call(x, dim), torch.softmax(x, dim=dim), f"softmax_stable(x of shape {shape}, dim={dim}) vs torch.softmax",
                  atol=1e-6, rtol=1e-5)
    check_function_gradients(t, function_gradient_probe("softmax_stable", (_rand(3, 5, seed=4), 0), (0,), guard=_no_builtin_softmax),
                    "softmax_stable(x of shape (3, 5), dim=0)")
    x = _rand(4, 5, seed=3)
    x[:, 2:] = float("-inf")
    out = t.compare(call(x), torch.softmax(x, dim=-1), "rows with -inf entries", atol=1e-6)
    t.expect(bool((out[:, 2:] == 0).all()), "-inf entries must get weight exactly 0")


# ================================================================== 03.simple_attention


@check(f"{U}.simple_attention", ["simple_attention"], _ref)
def check_simple_attention(t):
    out = t.run(lambda impl: impl.simple_attention(X6))
    t.expect(isinstance(out, (tuple, list)) and len(out) == 2,
             "simple_attention must return a tuple (context, weights)")
    _expect_float32(t, out, "simple_attention(x)")
    context, weights = out
    t.expect(isinstance(weights, torch.Tensor) and weights.shape == (6, 6),
             f"weights for a (6, 3) input must have shape (6, 6), got {getattr(weights, 'shape', None)}")
    if not torch.allclose(weights.sum(-1), torch.ones(6), atol=1e-5):
        t.expect(not torch.allclose(weights.sum(-2), torch.ones(6), atol=1e-5),
                 "the columns of the weights sum to 1, the rows do not", bug="B03.softmax_dim")
        t.fail(f"each row of the weights must sum to 1; row sums are {[round(v, 4) for v in weights.sum(-1).tolist()]}")
    t.compare(lambda impl: impl.simple_attention(X6), F032_W, "weights softmax(X Xᵀ) for 'Your journey starts with "
              "one step'", atol=1e-4, pick=lambda o: o[1])
    t.compare(lambda impl: impl.simple_attention(X6), F032_C, "context vectors", atol=1e-4, pick=lambda o: o[0])
    xb = _rand(2, 5, 4, seed=7)
    ref_c, ref_w = simple_ref(xb)
    wb = t.run(lambda impl: impl.simple_attention(xb))[1]
    if isinstance(wb, torch.Tensor) and wb.shape == (2, 5, 5) and not torch.allclose(wb.sum(-1), torch.ones(2, 5), atol=1e-5):
        t.expect(not torch.allclose(wb.sum(-2), torch.ones(2, 5), atol=1e-5),
                 "for a batched (2, 5, 4) input the columns of the weights sum to 1, the rows do not",
                 bug="B03.softmax_dim")
    t.compare(lambda impl: impl.simple_attention(xb), ref_w, "weights for a batched (2, 5, 4) input", atol=1e-6,
              pick=lambda o: o[1])
    t.compare(lambda impl: impl.simple_attention(xb), ref_c, "context for a batched (2, 5, 4) input", atol=1e-6,
              pick=lambda o: o[0])
    check_function_gradients(t, function_gradient_probe("simple_attention", (xb,), (0,)), "simple_attention(x of shape (2, 5, 4))")


def simple_ref(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return w @ x, w


# ================================================================== 03.scaled_dot_product_attention


def _sdpa_case(shape_q, shape_k, dv, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, generator=g)
    k = torch.randn(*shape_k, generator=g)
    v = torch.randn(*shape_k[:-1], dv, generator=g)
    return q, k, v


@check(f"{U}.scaled_dot_product_attention", ["scaled_dot_product_attention"], _ref)
def check_sdpa(t):
    # shape and return contract
    q, k, v = _sdpa_case((2, 5, 8), (2, 7, 8), 3, seed=11)
    out = t.run(lambda impl: impl.scaled_dot_product_attention(q, k, v))
    t.expect(isinstance(out, (tuple, list)) and len(out) == 2,
             "scaled_dot_product_attention must return a tuple (context, weights)")
    _expect_float32(t, out, "scaled_dot_product_attention(q, k, v)")
    context, weights = out
    t.expect(tuple(weights.shape) == (2, 5, 7) and tuple(context.shape) == (2, 5, 3),
             f"for q (2, 5, 8), k (2, 7, 8), v (2, 7, 3) expected context (2, 5, 3) and weights (2, 5, 7); "
             f"got {tuple(context.shape)} and {tuple(weights.shape)}")
    rows = weights.sum(-1)
    if not torch.allclose(rows, torch.ones_like(rows), atol=1e-5):
        t.expect(not torch.allclose(rows, torch.full_like(rows, 1 / math.sqrt(8)), atol=1e-5),
                 f"rows of the weights sum to {rows.flatten()[0].item():.4f} = 1/√d_k instead of 1",
                 bug="B03.scale_after_softmax")
        t.expect(not torch.allclose(weights.sum(-2), torch.ones(2, 7), atol=1e-5),
                 "the weights' columns sum to 1 (softmax over the queries)", bug="B03.softmax_dim")
        t.fail(f"each row of the weights must sum to 1; first row sums: {[round(x, 4) for x in rows[0].tolist()]}")

    # F03.3: scaled scores and weights of the worked example
    wq, wk, wv = f033_weights()
    Q, K, V = X6 @ wq, X6 @ wk, X6 @ wv
    t.compare(lambda impl: impl.scaled_dot_product_attention(Q, K, V), F033_W,
              "weights of the worked example (d_k = 2)", atol=1e-4, pick=lambda o: o[1])
    t.compare(lambda impl: impl.scaled_dot_product_attention(Q, K, V), F033_C, "context of the worked example",
              atol=1e-4, pick=lambda o: o[0])

    # causal masks: detectors first, then the oracle
    cm = torch.ones(6, 6, dtype=torch.bool).tril()
    w = t.run(lambda impl: impl.scaled_dot_product_attention(Q, K, V, mask=cm))[1]
    t.expect(not bool(torch.isnan(w[-1]).any()),
             "with a causal mask the last row of the weights is NaN and weight sits above the diagonal",
             bug="B03.mask_inverted")
    rows = w.sum(-1)
    t.expect(bool(torch.allclose(rows, torch.ones(6), atol=1e-5)) or not bool((rows < 1 - 1e-4).all() or rows[0] < 0.99),
             f"with a causal mask the rows of the weights sum to {[round(x, 4) for x in rows.tolist()]} (< 1)",
             bug="B03.mask_after_softmax")
    t.expect(bool(torch.allclose(rows, torch.ones(6), atol=1e-5)),
             f"with a causal mask each row must still sum to 1; got {[round(x, 4) for x in rows.tolist()]}")

    # oracle: F.scaled_dot_product_attention on 2-D, 3-D, 4-D, Tq != Tk, dk != dv, with/without masks
    cases = []
    q2, k2, v2 = _sdpa_case((5, 4), (5, 4), 4, seed=21)
    cases.append(("2-D (5, 4) inputs, no mask", q2, k2, v2, None))
    q3, k3, v3 = _sdpa_case((3, 4, 8), (3, 6, 8), 5, seed=22)
    cases.append(("3-D inputs, T_q=4 ≠ T_k=6, d_k=8 ≠ d_v=5, no mask", q3, k3, v3, None))
    m3 = torch.ones(4, 6, dtype=torch.bool).tril(diagonal=2)
    cases.append(("3-D inputs with a bottom-right causal mask (4, 6)", q3, k3, v3, m3))
    q4, k4, v4 = _sdpa_case((2, 3, 5, 8), (2, 3, 5, 8), 6, seed=23)
    lengths = torch.tensor([5, 3])
    pad = (torch.arange(5)[None, :] < lengths[:, None])[:, None, None, :]
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    cases.append(("4-D inputs (2, 3, 5, 8) with a causal mask", q4, k4, v4, causal))
    cases.append(("4-D inputs with a key-padding mask (2, 1, 1, 5) & causal mask", q4, k4, v4, pad & causal))
    for what, qq, kk, vv, mm in cases:
        expected = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mm)
        t.compare(lambda impl, qq=qq, kk=kk, vv=vv, mm=mm: impl.scaled_dot_product_attention(qq, kk, vv, mask=mm),
                  expected, f"context for {what} vs F.scaled_dot_product_attention", atol=1e-5, rtol=1e-5,
                  pick=lambda o: o[0])
        if mm is not None:
            w = t.run(lambda impl, qq=qq, kk=kk, vv=vv, mm=mm: impl.scaled_dot_product_attention(qq, kk, vv, mask=mm))[1]
            t.expect(bool((w.masked_fill(mm, 0) == 0).all()), f"masked weights must be exactly 0 ({what})")

    # blocked keys get weight exactly 0 whatever the scores: here every score a query may see is about −1.8e9,
    # below any finite fill value a mask could use
    gq = torch.Generator().manual_seed(51)
    qh = 3e4 * (1.0 + 0.01 * torch.rand(1, 4, 4, generator=gq))
    kh = -3e4 * (1.0 + 0.01 * torch.rand(1, 4, 4, generator=gq))
    vh = torch.randn(1, 4, 3, generator=gq)
    mh = torch.ones(4, 4, dtype=torch.bool).tril()
    w_low = t.run(lambda impl: impl.scaled_dot_product_attention(qh, kh, vh, mask=mh))[1]
    leaked = float(w_low.masked_fill(mh, 0).abs().max())
    t.expect(leaked == 0.0 and bool(torch.allclose(w_low.sum(-1), torch.ones(1, 4), atol=1e-5)),
             f"with scores near −1.8e9 for every key a query may see (q and k of size 3e4) and a causal mask, blocked "
             f"keys received weight up to {leaked:.3g}: a blocked key must get weight exactly 0 whatever the scores",
             bug="B03.mask_fill_finite")

    # gradients reach q, k and v (through the context and the weights)
    qg, kg, vg = _sdpa_case((2, 4, 8), (2, 6, 8), 5, seed=61)
    mg = torch.ones(4, 6, dtype=torch.bool).tril(2)
    check_function_gradients(t, function_gradient_probe("scaled_dot_product_attention", (qg, kg, vg, mg), (0, 1, 2)),
                    "scaled_dot_product_attention(q, k, v, a causal mask)")

    # future perturbation: keys/values after position t never change context rows <= t
    q, k, v = _sdpa_case((1, 7, 4), (1, 7, 4), 4, seed=31)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    base = t.run(lambda impl: impl.scaled_dot_product_attention(q, k, v, mask=mask))[0]
    for pos in range(6):
        k2, v2 = k.clone(), v.clone()
        k2[:, pos + 1:] += 5.0
        v2[:, pos + 1:] -= 3.0
        out = t.run(lambda impl, k2=k2, v2=v2: impl.scaled_dot_product_attention(q, k2, v2, mask=mask))[0]
        t.expect(bool(torch.allclose(out[:, : pos + 1], base[:, : pos + 1], atol=1e-6)),
                 f"with a causal mask, changing keys/values after position {pos} changed context row ≤ {pos}: "
                 "the future leaks")

    # dropout on the weights: context = dropout(weights) @ v; weights returned pre-dropout. With
    # v = [I | I] both halves of the context are the dropped-out weights: one draw per weight makes
    # them identical, dropout on the values or the output does not
    q, k, _ = _sdpa_case((8, 6, 4), (8, 6, 4), 4, seed=41)
    eye = torch.eye(6).expand(8, 6, 6)
    eye2 = torch.cat([eye, eye], -1)

    def dropped(impl):
        torch.manual_seed(5)
        drop = nn.Dropout(0.5).train()
        return impl.scaled_dot_product_attention(q, k, eye2, mask=None, dropout=drop)

    ctx, w = t.run(dropped)
    t.expect(isinstance(ctx, torch.Tensor) and tuple(ctx.shape) == (8, 6, 12),
             f"q, k (8, 6, 4) and v (8, 6, 12): the context must be (8, 6, 12); got {getattr(ctx, 'shape', ctx)}")
    t.expect(bool(torch.allclose(w.sum(-1), torch.ones(8, 6), atol=1e-5)),
             "the returned weights must be the softmax output before dropout (rows sum to 1)")
    clean = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    problem = weight_dropout_problem(ctx[..., :6], ctx[..., 6:], clean, 0.5)
    if problem is not None:
        kind, message = problem
        bug_id = t.diagnose(dropped, (ctx, w)) or _DROPOUT_BUGS.get(kind)
        t.fail(message, bug=bug_id)
    drop_eval = nn.Dropout(0.5).eval()
    ref = F.scaled_dot_product_attention(q, k, eye2)
    t.compare(lambda impl: impl.scaled_dot_product_attention(q, k, eye2, dropout=drop_eval), ref,
              "with a Dropout module in eval mode the context must equal the no-dropout context", atol=1e-6,
              pick=lambda o: o[0])


# ================================================================== 03.SelfAttention


def _on_course_sdpa(cls):
    """The learner's class with its ``scaled_dot_product_attention`` calls pointed at the course's (exercise 3): a
    mistake in that function is charged to that exercise only, not again to the modules built on it."""
    from grader.prior import use_course
    from llmcourse.nn import attention as A

    use_course(cls, scaled_dot_product_attention=A.scaled_dot_product_attention)
    return cls


def _loaded(cls_factory, state, *args):
    def make(impl):
        m = _on_course_sdpa(getattr(impl, cls_factory))(*args)
        unwrap(m).load_state_dict(state)
        return m
    return make


@check(f"{U}.SelfAttention", ["SelfAttention"], _ref)
def check_self_attention(t):
    facts = t.run(lambda impl: module_facts(impl.SelfAttention(3, 2)))
    t.expect(facts["is_module"], "SelfAttention must be an nn.Module subclass")
    shapes = facts["state_dict"]
    want = {"W_query.weight": (2, 3), "W_key.weight": (2, 3), "W_value.weight": (2, 3)}
    t.expect(shapes == want, f"state_dict keys/shapes for SelfAttention(3, 2) must be {want}; got {shapes}")
    fb = t.run(lambda impl: module_facts(impl.SelfAttention(3, 2, qkv_bias=True)))
    t.expect(set(fb.get("state_dict", {})) == set(want) | {"W_query.bias", "W_key.bias", "W_value.bias"},
             "with qkv_bias=True the three projections must have biases")

    # fresh namespace, d_out = 5: the scale must come from this module's own width
    torch.manual_seed(0)
    ref5 = _ref()["SelfAttention"](3, 5)
    state5 = _module_state(ref5)
    x = _rand(2, 4, 3, seed=8)
    _expect_float32(t, t.run(lambda impl: _loaded("SelfAttention", state5, 3, 5)(impl)(x)), "SelfAttention(3, 5)(x)")
    t.compare(lambda impl: _loaded("SelfAttention", state5, 3, 5)(impl)(x), ref5(x),
              "SelfAttention(3, 5) on a (2, 4, 3) batch (shared weights)", atol=1e-5)

    # F03.3: W_query.weight = Wq.T etc.
    state = f033_state_dict()
    t.compare(lambda impl: _loaded("SelfAttention", state, 3, 2)(impl)(X6), F033_C,
              "context of the worked example with the seed-123 weights", atol=1e-4)
    t.compare(lambda impl: _loaded("SelfAttention", state, 3, 2)(impl)(X6.expand(2, 6, 3)),
              F033_C.expand(2, 6, 2), "the same example as a batch of 2", atol=1e-4)
    torch.manual_seed(1)
    ref = _ref()["SelfAttention"](6, 4, qkv_bias=True)
    state_b = _module_state(ref)
    xb = _rand(3, 5, 6, seed=9)
    t.compare(lambda impl: _loaded("SelfAttention", state_b, 6, 4, True)(impl)(xb), ref(xb),
              "SelfAttention(6, 4, qkv_bias=True) on a (3, 5, 6) batch (shared weights)", atol=1e-5)


# ================================================================== 03.CausalSelfAttention


@check(f"{U}.CausalSelfAttention", ["CausalSelfAttention"], _ref)
def check_causal_self_attention(t):
    Ref = _ref()["CausalSelfAttention"]
    facts = t.run(lambda impl: module_facts(impl.CausalSelfAttention(3, 2, 6)))
    t.expect(facts["is_module"], "CausalSelfAttention must be an nn.Module subclass")
    t.expect(facts["children"].get("dropout") == "torch.nn.modules.dropout.Dropout",
             "self.dropout must be an nn.Dropout")
    keys = set(facts["state_dict"])
    want = {"W_query.weight", "W_key.weight", "W_value.weight"}
    t.expect(keys == want, f"state_dict keys must be {sorted(want)} (the mask is a non-persistent buffer); "
             f"got {sorted(keys)}")
    buffers = facts["buffers"]
    t.expect("mask" in buffers, "register the causal mask as a buffer named `mask`")
    t.expect(buffers["mask"][0] == torch.bool and tuple(buffers["mask"][1]) == (6, 6),
             f"the `mask` buffer must be a (context_length, context_length) bool tensor; got "
             f"{buffers['mask'][0]} {tuple(buffers['mask'][1])}")
    t.expect("mask" not in facts["parameters"], "the mask must not be a parameter")
    mask6 = t.run(lambda impl: unwrap(impl.CausalSelfAttention(3, 2, 6)).mask)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    t.expect(bool(torch.equal(mask6, allowed)),
             "the mask buffer of CausalSelfAttention(3, 2, 6) must be True where a query may attend (the lower "
             f"triangle with its diagonal); yours is {mask6.int().tolist()}",
             bug="B03.mask_buffer_blocked" if bool(torch.equal(mask6, ~allowed))
             else "B03.mask_no_diagonal" if bool(torch.equal(mask6, allowed.tril(-1))) else None)
    fb = t.run(lambda impl: module_facts(impl.CausalSelfAttention(3, 2, 6, qkv_bias=True)))
    t.expect(set(fb.get("state_dict", {})) == want | {"W_query.bias", "W_key.bias", "W_value.bias"},
             f"with qkv_bias=True the three projections must have biases; state_dict keys: {sorted(fb.get('state_dict', {}))}")

    state = f033_state_dict()
    x = X6.unsqueeze(0)

    def f034(impl):
        mm = _loaded("CausalSelfAttention", state, 3, 2, 6)(impl)
        unwrap(mm).eval()
        out = mm(x)
        w = unwrap(mm).last_weights
        return out, w, bool(getattr(w, "requires_grad", False))

    out, w, w_requires_grad = t.run(f034)
    _expect_float32(t, out, "CausalSelfAttention(3, 2, 6)(x)")
    t.expect(isinstance(w, torch.Tensor) and tuple(w.shape) == (1, 6, 6),
             f"after a call, self.last_weights must be the (B, T, T) weights; got {getattr(w, 'shape', w)}")
    t.expect(not bool(torch.isnan(w[0, 0]).any()), "row 0 of the weights is NaN: the first token may attend to nothing",
             bug="B03.mask_no_diagonal")
    t.expect(not bool(torch.isnan(w[0, -1]).any()),
             "the last row of the weights is NaN and weight sits above the diagonal: the mask blocks the past "
             "and lets queries see the future", bug="B03.mask_inverted")
    if not torch.allclose(w.sum(-1), torch.ones(1, 6), atol=1e-5):
        t.expect(not torch.allclose(w.sum(-2), torch.ones(1, 6), atol=1e-5),
                 "the weights' columns sum to 1 (softmax over the queries)", bug="B03.softmax_dim")
        t.expect(not bool((w.sum(-1) < 1 - 1e-4).any()),
                 f"rows of last_weights sum to {[round(s, 4) for s in w.sum(-1)[0].tolist()]} (< 1)",
                 bug="B03.mask_after_softmax")
        t.fail("rows of last_weights must sum to 1")
    t.expect(not w_requires_grad, "last_weights must be detached")
    for r, row in F034_W_ROWS.items():
        t.compare(f034, T(row), f"causal weights row {r} of the worked example", atol=1e-4,
                  pick=lambda o, r=r: o[1][0, r])
    t.compare(f034, F034_C, "causal context of the worked example", atol=1e-4, pick=lambda o: o[0][0])
    t.expect(bool((w[0].triu(1) == 0).all()), "the upper triangle of the weights must be exactly 0")

    # T < context_length, batches, shared weights, qkv_bias
    torch.manual_seed(2)
    ref = Ref(8, 4, 10, dropout=0.5, qkv_bias=True).eval()
    st = _module_state(ref)
    xb = _rand(3, 7, 8, seed=12)

    def shorter(impl):
        mm = _loaded("CausalSelfAttention", st, 8, 4, 10, 0.5, True)(impl)
        unwrap(mm).eval()
        return mm(xb)

    expected = ref(xb)
    def twice(impl):  # both calls inside one probe, so the random stream advances between them
        mm = _loaded("CausalSelfAttention", st, 8, 4, 10, 0.5, True)(impl)
        unwrap(mm).eval()
        return mm(xb), mm(xb)

    first, second = t.run(twice)
    t.expect(bool(torch.equal(first, second)), "in eval mode two calls gave different outputs: dropout is still "
             "active after model.eval()", bug="B03.dropout_in_eval")
    t.compare(shorter, expected, "CausalSelfAttention(8, 4, context_length=10) on a (3, 7, 8) batch (T < "
              "context_length, eval mode, shared weights)", atol=1e-5)
    # output row 0 equals the value vector of token 0
    value0 = xb[:, 0] @ st["W_value.weight"].T + st["W_value.bias"]
    t.compare(shorter, value0, "output at position 0 must equal the value vector of token 0", atol=1e-5,
              pick=lambda o: o[:, 0])

    # the future-perturbation test on every row
    def perturbed(pos):
        def run(impl):
            x2 = xb.clone()
            x2[:, pos + 1:] = x2[:, pos + 1:] * -3.0 + 1.0
            mm = _loaded("CausalSelfAttention", st, 8, 4, 10, 0.5, True)(impl)
            unwrap(mm).eval()
            return mm(x2)
        return run

    base = t.run(shorter)
    for pos in range(6):
        out = t.run(perturbed(pos))
        t.expect(bool(torch.allclose(out[:, : pos + 1], base[:, : pos + 1], atol=1e-6)),
                 f"changing tokens after position {pos} changed the output at position ≤ {pos}: the future leaks")

    # T > context_length raises ValueError
    def too_long(impl):
        mm = _on_course_sdpa(impl.CausalSelfAttention)(8, 4, 5)
        mm(_rand(1, 6, 8, seed=1))
        return "no error"

    got = t.raised(too_long)
    t.expect(got == "ValueError", f"a sequence longer than context_length must raise ValueError; got {got}")

    # train mode, by its properties: tokens x_j = e_j and W_value = [I; I], so both halves of the
    # output are dropout(weights) (p = 0.25: survivors are w/(1−p) = 4w/3, not 2w)
    g = torch.Generator().manual_seed(77)
    st_d = {"W_query.weight": torch.randn(12, 6, generator=g), "W_key.weight": torch.randn(12, 6, generator=g),
            "W_value.weight": torch.cat([torch.eye(6), torch.eye(6)], 0)}
    x_d = torch.eye(6).expand(16, 6, 6).contiguous()
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    qd, kd = x_d @ st_d["W_query.weight"].T, x_d @ st_d["W_key.weight"].T
    clean = torch.softmax((qd @ kd.transpose(-2, -1) / math.sqrt(12)).masked_fill(~causal, float("-inf")), dim=-1)

    def train_dropped(impl):
        mm = _loaded("CausalSelfAttention", st_d, 6, 12, 6, 0.25)(impl)
        unwrap(mm).train()
        torch.manual_seed(7)
        return mm(x_d)

    def train_last_weights(impl):
        mm = _loaded("CausalSelfAttention", st_d, 6, 12, 6, 0.25)(impl)
        unwrap(mm).train()
        torch.manual_seed(7)
        mm(x_d)
        return unwrap(mm).last_weights

    lw = t.run(train_last_weights)
    t.expect(isinstance(lw, torch.Tensor) and tuple(lw.shape) == (16, 6, 6),
             f"in train mode last_weights must be (B, T, T) = (16, 6, 6); got {getattr(lw, 'shape', lw)}")
    sums = lw.sum(-1)
    t.expect(bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-5)),
             "in train() mode with dropout=0.25, rows of last_weights sum to "
             f"{[round(v, 3) for v in sums[0].tolist()]}: they must be the attention weights themselves (each row "
             "sums to 1), not the weights after dropout", bug="B03.last_weights_after_dropout")
    t.compare(train_last_weights, clean, "last_weights in train() mode vs the softmax weights", atol=1e-5)

    y = t.run(train_dropped)
    t.expect(isinstance(y, torch.Tensor) and tuple(y.shape) == (16, 6, 12),
             f"CausalSelfAttention(6, 12, 6, dropout=0.25) in train mode on a (16, 6, 6) batch must return "
             f"(16, 6, 12); got {getattr(y, 'shape', y)}")
    problem = weight_dropout_problem(y[..., :6], y[..., 6:], clean, 0.25)
    if problem is not None:
        kind, message = problem
        t.fail(message, bug=t.diagnose(train_dropped, y) or _DROPOUT_BUGS.get(kind))

    # inverted dropout is unbiased: the mean of 400 train-mode passes ≈ the eval output
    def train_passes(impl):
        mm = _loaded("CausalSelfAttention", st, 8, 4, 10, 0.5, True)(impl)
        unwrap(mm).train()
        torch.manual_seed(1234)
        outs = torch.stack([mm(xb[:1]) for _ in range(400)])
        return outs

    outs = t.run(train_passes)
    mean, se = outs.mean(0), outs.std(0) / math.sqrt(outs.shape[0])
    ok = bool(((mean - expected[:1]).abs() <= 4 * se + 1e-4).float().mean() > 0.97)
    if not ok:
        def one_pass(impl):
            mm = _loaded("CausalSelfAttention", st, 8, 4, 10, 0.5, True)(impl)
            unwrap(mm).train()
            torch.manual_seed(99)
            return mm(xb[:1])
        bug_id = t.diagnose(one_pass, t.run(one_pass))
        t.fail("in train mode with dropout p=0.5 the mean over 400 passes is not within 4 standard errors of the "
               "eval output: dropout must act on the attention weights with inverted scaling 1/(1−p)", bug=bug_id)


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
also_blocked(f"{U}.simple_attention", "llmcourse.viz.attention:masked_attention")
also_blocked(f"{U}.scaled_dot_product_attention", "llmcourse.viz.attention:masked_attention")
also_blocked(f"{U}.SelfAttention", "llmcourse.viz.attention:masked_attention")
# CausalSelfAttention: the attention lab's masked_attention(q, k, v, method, scale, causal) is (context,
# weights) of plain, scaled and causal attention
also_blocked(f"{U}.CausalSelfAttention", "llmcourse.viz.attention:masked_attention")


# ================================================================== the grader's strength, declared (grader/strength.py)
defining_property(
    f"{U}.softmax_stable",
    "a softmax along any dim that stays finite for any finite input (softmax is unchanged by a shift of each slice)",
    probe="inputs of magnitude 1e3 and 1e4 with every built-in softmax blocked; every dim of 2-D and 3-D inputs against "
          "torch.softmax; -inf entries")
defining_property(
    f"{U}.simple_attention",
    "the weights are the row-wise softmax of the raw dot products x x^T, the context is weights @ x",
    probe="the lesson's six-token example against fixture values; batched inputs against the formula; row and "
          "column sums")
defining_property(
    f"{U}.scaled_dot_product_attention",
    "softmax(q k^T / sqrt(d_k)) v where a blocked key gets weight exactly 0 whatever the scores, and dropout acts only "
    "on the weights that multiply v",
    probe="against F.scaled_dot_product_attention on 2-D to 4-D inputs with causal and padding masks; scores below "
          "-1e9; future perturbation; duplicated value channels read the dropout draw")
defining_property(
    f"{U}.SelfAttention",
    "three learned projections whose scores are scaled by this module's key width",
    probe="a fresh namespace with d_out = 5 != d_in; the worked example; qkv_bias=True with shared weights")
defining_property(
    f"{U}.CausalSelfAttention",
    "query t attends to keys 0..t only, through a bool buffer of the allowed pairs; dropout acts on the weights; "
    "last_weights holds the pre-dropout softmax in every mode",
    probe="future perturbation on every row; the buffer's values; last_weights' row sums in train mode; tokens e_j "
          "with duplicated value channels for the dropout draw; the mean of 400 train-mode passes")

decision(f"{U}.softmax_stable",
         "which constant to subtract before exp so that no finite input overflows, and along which axis",
         forms=[r"x\s*-\s*(x\.)?max\b", r"exp\(\s*x\s*-\s*m\b", r"subtract(ing)? the (row |largest |maximum)",
                r"\bx\.amax\(", r"max\(\s*dim\s*=\s*dim"],
         wrong=("B03.naive_softmax",))
decision(f"{U}.CausalSelfAttention",
         "how a (context_length, context_length) buffer serves a sequence of T < context_length tokens",
         forms=[r"mask\[\s*:\s*T\s*,\s*:\s*T\s*\]", r"\[\s*:\s*T\s*\]\s*\[\s*:\s*,\s*:\s*T\s*\]",
                r"slice (the buffer|it) to"],
         wrong=("B03.mask_not_sliced",))
