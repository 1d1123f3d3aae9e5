"""Checks of unit 05 (transformer blocks).

Oracles: ``nn.LayerNorm`` (same ``state_dict``), ``F.gelu`` for both ``approximate`` modes, and
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` (``batch_first=True``, dropout 0)
loaded with the block's weights in **both** norm placements. Fixtures: F05.1 (std of a LayerNorm
output = √(128/127)), F05.2 (the two GELUs at x = −3), F05.3 (parameter counts).

The learner's ``EncoderBlock``/``DecoderBlock``/``FeedForward`` normally use the learner's own
``LayerNorm``/``FeedForward``/``gelu`` from the same notebook. While a probe runs on the learner's
code (in the worker process), those names are temporarily bound to the course's finished versions,
so a mistake in ``LayerNorm`` costs points in ``05.LayerNorm`` only and is not counted again in
every block.

Isolated design: every probe builds the learner's module itself and returns plain data (output
tensors, a ``state_dict``, :func:`~grader.core.module_facts`, parameter counts); structural facts
only ever make a check fail, and every pass is decided on returned tensors.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..core import _same, check, forbid, module_facts, unwrap
from ..gradcheck import check_module_gradients, module_gradient_probe
from ..prior import course_versions

U = "05"
T = torch.tensor


def _ref():
    from llmcourse.nn import blocks, feedforward, norms

    return {"LayerNorm": norms.LayerNorm, "gelu": feedforward.gelu, "FeedForward": feedforward.FeedForward,
            "EncoderBlock": blocks.EncoderBlock, "DecoderBlock": blocks.DecoderBlock,
            "ProjectionLayer": blocks.ProjectionLayer}


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _course_parts() -> dict:
    """The finished pieces a block is built from (unit 05's, never blocked while a block is checked)."""
    from llmcourse.nn import feedforward, norms

    return {"LayerNorm": norms.LayerNorm, "FeedForward": feedforward.FeedForward, "gelu": feedforward.gelu}


def course_parts(impl, name):
    """Bind LayerNorm/FeedForward/gelu (all but ``name`` itself) in the learner's globals to llmcourse's while a probe
    runs (:func:`grader.prior.course_versions`); nothing for the reference and the mutants."""
    obj = getattr(impl, "_objects", {}).get(name) if getattr(impl, "_learner", False) else None
    return course_versions(obj, **{k: v for k, v in _course_parts().items() if k != name})


def with_course_parts(name, probe):
    """``probe`` run with :func:`course_parts` (inside the learner's process, around the whole probe)."""

    def wrapped(impl):
        with course_parts(impl, name):
            return probe(impl)

    return wrapped


def _structure(name, *args, **kwargs):
    """Probe: module facts of ``impl.<name>(*args, **kwargs)`` plus its parameter count."""

    def probe(impl):
        m = unwrap(getattr(impl, name)(*args, **kwargs))
        facts = module_facts(m)
        if facts["is_module"]:
            facts["n_params"] = sum(p.numel() for p in m.parameters())
        return facts

    return with_course_parts(name, probe)


def _param_count(name, *args):
    """Probe: the parameter count of ``impl.<name>(*args)`` (None when it is not an nn.Module)."""

    def probe(impl):
        m = unwrap(getattr(impl, name)(*args))
        return sum(p.numel() for p in m.parameters()) if isinstance(m, nn.Module) else None

    return with_course_parts(name, probe)


def _state_dict(module) -> dict:
    """A reference module's state_dict (checker side only)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _shapes(module) -> dict:
    """A reference module's state_dict shapes (checker side only)."""
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _randomised(module, seed):
    """``module`` with every parameter redrawn (norm weights around 1) so no sublayer is trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("norm3.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return module.eval()


# ================================================================== gradients (every module)


def _check_gradients(t, name, args, kwargs, state, inputs, what):
    """Backpropagation reaches the inputs and every parameter (``name(*args, **kwargs)``, ``state`` loaded, eval)."""

    def build(impl):
        m = getattr(impl, name)(*args, **kwargs)
        unwrap(m).load_state_dict(state)
        unwrap(m).eval()
        return m

    check_module_gradients(t, module_gradient_probe(build, inputs, wrap=lambda p: with_course_parts(name, p)), what)


# ================================================================== 05.LayerNorm

F051_STD = math.sqrt(128 / 127)  # 1.00393


def _no_builtin_norm():
    return forbid((F, "layer_norm"), (F, "group_norm"), (torch, "layer_norm"), (torch, "group_norm"),
                  reason="compute the mean and the biased variance over the last dimension yourself.")


def _ln_state(d, seed):
    g = torch.Generator().manual_seed(seed)
    return {"weight": 1.0 + 0.5 * torch.randn(d, generator=g), "bias": 0.5 * torch.randn(d, generator=g)}


@check(f"{U}.LayerNorm", ["LayerNorm"], _ref)
def check_layernorm(t):
    def fresh(impl):
        mod = unwrap(impl.LayerNorm(16))
        facts = module_facts(mod)
        if facts["is_module"]:
            facts["sd"] = dict(mod.state_dict())
            facts["has_eps"] = hasattr(mod, "eps")
            facts["eps"] = getattr(mod, "eps", None)
        return facts

    facts = t.run(fresh)
    t.expect(facts["is_module"], "LayerNorm must be an nn.Module subclass")
    shapes = facts["state_dict"]
    buffers = facts["buffers"]
    t.expect(not buffers, f"LayerNorm must have no buffers (it keeps no running statistics); found "
             f"{sorted(buffers)}", bug="B05.ln_running_stats")
    t.expect(shapes == {"weight": (16,), "bias": (16,)},
             f"state_dict of LayerNorm(16) must be {{'weight': (16,), 'bias': (16,)}}; got {shapes}")
    sd = facts["sd"]
    t.expect(bool(torch.equal(sd["weight"], torch.ones(16))) and bool(torch.equal(sd["bias"], torch.zeros(16))),
             "a new LayerNorm must start with weight = 1 and bias = 0 (the identity affine map)")
    eps = facts["eps"]
    t.expect(not facts["has_eps"] or (isinstance(eps, (int, float)) and not isinstance(eps, bool)
                                      and abs(float(eps) - 1e-5) < 1e-12),
             f"the default eps must be 1e-5; got {eps}")

    def run(x, state=None, d=16, mode="eval", eps=None):
        def probe(impl):
            m = impl.LayerNorm(d) if eps is None else impl.LayerNorm(d, eps=eps)
            if state is not None:
                unwrap(m).load_state_dict(state)
            getattr(unwrap(m), mode)()
            with _no_builtin_norm():
                return m(x)
        return probe

    # train and eval identical (BatchNorm would differ)
    x = _rand(2, 4, 16, seed=1) * 2.0 + 1.0
    st = _ln_state(16, 3)
    y_train = t.run(run(x, st, mode="train"))
    y_eval = t.run(run(x, st, mode="eval"))
    t.expect(isinstance(y_train, torch.Tensor) and y_train.shape == x.shape,
             f"LayerNorm must keep the input shape {tuple(x.shape)}; got {getattr(y_train, 'shape', y_train)}")
    t.expect(bool(torch.allclose(y_train, y_eval, atol=1e-6)),
             "train() and eval() give different outputs: LayerNorm has no running statistics and behaves the same "
             "in both modes", bug="B05.ln_running_stats")

    # F05.1: the std (unbiased) of all 128 outputs is √(128/127) for any non-degenerate (2, 4, 16) input
    t.compare(run(x), torch.tensor([F051_STD]),
              "std of LayerNorm(16)(x) over all 128 elements for x of shape (2, 4, 16) (√(128/127) = 1.00393)",
              atol=1e-4, rtol=0.0, pick=lambda y: y.std().reshape(1) if isinstance(y, torch.Tensor) else y)

    # each token is normalised on its own: changing token 0 of sequence 0 changes no other token's output
    x_tok = x.clone()
    x_tok[0, 0] = x_tok[0, 0] * 3.0 - 2.0
    y_tok = t.run(run(x_tok, st))
    others = torch.ones(2, 4, dtype=torch.bool)
    others[0, 0] = False
    t.expect(isinstance(y_tok, torch.Tensor) and y_tok.shape == x.shape
             and bool(torch.allclose(y_tok[others], y_eval[others], atol=1e-6)),
             "changing one token of the input changed the outputs of other tokens: LayerNorm's statistics are each "
             "token's own (over its features only)", bug="B05.ln_wrong_axis")

    # oracle: nn.LayerNorm with the same state_dict, several shapes and scales
    cases = [
        ("a (3, 5, 16) batch", _rand(3, 5, 16, seed=4), 16),
        ("a (3, 5, 16) batch with small variance (σ ≈ 0.003: ε matters)", _rand(3, 5, 16, seed=5) * 0.003, 16),
        ("a (4, 8) 2-D input with an offset", _rand(4, 8, seed=6) * 2 + 3.0, 8),
        ("a (2, 3, 6, 12) 4-D input", _rand(2, 3, 6, 12, seed=7), 12),
    ]
    for what, xx, d in cases:
        state = _ln_state(d, d + 11)
        oracle = nn.LayerNorm(d)
        oracle.load_state_dict(state)
        with torch.no_grad():
            expected = oracle(xx)
        t.compare(lambda impl, xx=xx, state=state, d=d: run(xx, state, d)(impl), expected,
                  f"LayerNorm vs nn.LayerNorm (same weight/bias) on {what}", atol=1e-6, rtol=1e-5)
    # custom eps
    xx = _rand(2, 3, 16, seed=8) * 0.01
    oracle = nn.LayerNorm(16, eps=1e-3)
    with torch.no_grad():
        expected = oracle(xx)
    t.compare(run(xx, None, 16, eps=1e-3), expected, "LayerNorm(16, eps=1e-3) vs nn.LayerNorm(16, eps=1e-3)",
              atol=1e-6, rtol=1e-5)
    _check_gradients(t, "LayerNorm", (16,), {}, st, [_rand(3, 5, 16, seed=9) * 2 + 1],
                     "LayerNorm(16) with random weight/bias")
    # the state_dict loads into nn.LayerNorm (interchangeable keys); sd is the fresh module's, returned above
    try:
        nn.LayerNorm(16).load_state_dict(sd)
    except RuntimeError as exc:
        t.fail(f"your LayerNorm's state_dict does not load into nn.LayerNorm(16): {str(exc).splitlines()[0]}")


# ================================================================== 05.gelu


@check(f"{U}.gelu", ["gelu"], _ref)
def check_gelu(t):
    def call(x, approximate="none"):
        def probe(impl):
            with forbid((F, "gelu"), reason="write GELU with torch.erf / torch.tanh."):
                return impl.gelu(x, approximate=approximate)
        return probe

    x = torch.linspace(-8, 8, 1601)
    out = t.run(call(x))
    t.expect(isinstance(out, torch.Tensor) and out.shape == x.shape,
             f"gelu must return a tensor of the input's shape {tuple(x.shape)}")
    t.compare(call(T([-3.0])), T([-0.00405]), "gelu(-3) with approximate='none'", atol=1e-5)
    t.compare(call(T([-3.0]), "tanh"), T([-0.00364]), "gelu(-3) with approximate='tanh'", atol=1e-5)
    # float64 inputs: the float32 formula loses ~1e-6 to cancellation in 1 + erf(x/√2) for x < -3
    x64 = torch.linspace(-8, 8, 1601, dtype=torch.float64)
    for approximate in ("none", "tanh"):
        for what, xx in (("x in linspace(-8, 8, 1601), float64", x64),
                         ("a (2, 3, 5) normal tensor ×3, float64", _rand(2, 3, 5, seed=2).double() * 3)):
            expected = F.gelu(xx, approximate=approximate)
            t.compare(call(xx, approximate), expected, f"gelu({what}, approximate={approximate!r}) vs F.gelu",
                      atol=1e-6, rtol=1e-5)
        t.compare(call(x, approximate), F.gelu(x, approximate=approximate),
                  f"gelu(x, approximate={approximate!r}) in float32 vs F.gelu", atol=1e-5, rtol=1e-5)
    for approximate in ("none", "tanh"):
        xg = torch.linspace(-6, 6, 241, dtype=torch.float64)
        xr = xg.clone().requires_grad_(True)
        F.gelu(xr, approximate=approximate).sum().backward()

        def grad_probe(impl, approximate=approximate, xg=xg):
            with torch.enable_grad():
                xx = xg.clone().requires_grad_(True)
                with forbid((F, "gelu"), reason="write GELU with torch.erf / torch.tanh."):
                    impl.gelu(xx, approximate=approximate).sum().backward()
            return xx.grad

        t.compare(grad_probe, xr.grad, f"d gelu(x, approximate={approximate!r}) / dx on [−6, 6] (float64) vs "
                  "F.gelu's gradient (the function must stay differentiable: nothing detached)", atol=1e-6, rtol=1e-5)
    for other in ("erf", "Tanh", "sigmoid"):
        got = t.raised(call(x, other))
        t.expect(got == "ValueError", f"gelu(x, approximate={other!r}) must raise ValueError (only 'none' and "
                 f"'tanh' are GELUs); got {got}", bug="B05.gelu_no_valueerror")
    exact, approx = t.run(call(x)), t.run(call(x, "tanh"))
    diff = (exact - approx).abs()
    t.expect(abs(diff.max().item() - 4.74e-4) < 5e-6,
             f"max |gelu_exact − gelu_tanh| on [−8, 8] must be 4.74e-4; got {diff.max().item():.3g}")


# ================================================================== 05.FeedForward


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else repr(n)


@check(f"{U}.FeedForward", ["FeedForward"], _ref)
def check_feedforward(t):
    facts = t.run(_structure("FeedForward", 8, 32))
    t.expect(facts["is_module"], "FeedForward must be an nn.Module subclass")
    want = {"fc1.weight": (32, 8), "fc1.bias": (32,), "fc2.weight": (8, 32), "fc2.bias": (8,)}
    got = facts["state_dict"]
    t.expect(got == want, f"state_dict of FeedForward(8, 32) must be {want}; got {got}")
    n = facts["n_params"]
    t.expect(n == 2 * 8 * 32 + 32 + 8, f"FeedForward(8, 32) must have 2·D·d_ff + d_ff + D = 552 parameters; got {n}")
    n = t.run(_param_count("FeedForward", 512, 2048))
    t.expect(n == 2_099_712, f"FeedForward(512, 2048) must have 2,099,712 parameters; got {_count(n)}")

    ref_cls = t.reference.FeedForward
    # deterministic in train mode: the FFN has no dropout inside (the block drops its output)
    torch.manual_seed(6)
    st_d = _state_dict(ref_cls(8, 32, "relu"))
    x_d = _rand(4, 6, 8, seed=7)

    def train_twice(impl):
        mm = impl.FeedForward(8, 32, "relu")
        unwrap(mm).load_state_dict(st_d)
        unwrap(mm).train()
        torch.manual_seed(1)
        a = mm(x_d)
        torch.manual_seed(2)
        return a, mm(x_d)

    a, b = t.run(with_course_parts("FeedForward", train_twice))
    t.expect(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
             and bool(torch.allclose(a, b, atol=1e-6)),
             "FeedForward(8, 32) in train mode gave two different outputs for the same input: something random "
             "acts inside it, and this FFN has no dropout inside", bug="B05.ffn_inner_dropout")

    for activation, oracle_act in (("relu", F.relu), ("gelu", lambda z: F.gelu(z)),
                                   ("gelu_tanh", lambda z: F.gelu(z, approximate="tanh"))):
        torch.manual_seed(3)
        ref = ref_cls(8, 32, activation)
        st = _state_dict(ref)
        x = _rand(3, 5, 8, seed=4)
        with torch.no_grad():
            expected = F.linear(oracle_act(F.linear(x, st["fc1.weight"], st["fc1.bias"])),
                                st["fc2.weight"], st["fc2.bias"])

        def probe(impl, st=st, x=x, activation=activation):
            mm = impl.FeedForward(8, 32, activation)
            unwrap(mm).load_state_dict(st)
            unwrap(mm).train()  # no dropout inside: train mode gives the same result
            return mm(x)

        t.compare(with_course_parts("FeedForward", probe), expected, f"FeedForward(8, 32, activation={activation!r}) "
                  "on a (3, 5, 8) batch (shared weights, train mode)", atol=1e-5, rtol=1e-5)

    for activation in ("relu", "gelu", "gelu_tanh"):
        torch.manual_seed(8)
        _check_gradients(t, "FeedForward", (8, 32, activation), {}, _state_dict(ref_cls(8, 32, activation)),
                         [_rand(3, 5, 8, seed=10)], f"FeedForward(8, 32, activation={activation!r})")
    got = t.raised(with_course_parts("FeedForward", lambda impl: impl.FeedForward(8, 32, "swish")))
    t.expect(got == "ValueError", f"FeedForward(8, 32, activation='swish') must raise ValueError (the activations "
             f"are 'relu', 'gelu' and 'gelu_tanh'); got {got}")

    # position-wise: permuting positions permutes outputs the same way
    torch.manual_seed(5)
    st = _state_dict(ref_cls(8, 32, "gelu"))
    x = _rand(2, 7, 8, seed=6)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])

    def both(impl):
        mm = impl.FeedForward(8, 32, "gelu")
        unwrap(mm).load_state_dict(st)
        return mm(x), mm(x[:, perm])

    y, y_perm = t.run(with_course_parts("FeedForward", both))
    t.expect(bool(torch.allclose(y[:, perm], y_perm, atol=1e-6)),
             "FeedForward must act on each position independently: permuting the positions of the input "
             "must permute the outputs in the same way")


# ================================================================== blocks: shared helpers


def _enc_probe(st, x, mask, norm_first, activation="relu", d=16, h=4, d_ff=32):
    def probe(impl):
        m = impl.EncoderBlock(d, h, d_ff, dropout=0.0, norm_first=norm_first, activation=activation)
        unwrap(m).load_state_dict(st)
        unwrap(m).eval()
        return m(x, mask=mask)
    return with_course_parts("EncoderBlock", probe)


def _compare_orderings(t, probe, expected, other, what):
    """Compare with the requested ordering; name B05.post_for_pre when the output is the other one's."""
    got = t.run(probe)
    if _same(got, expected, 1e-5, 1e-5):
        return got
    if _same(got, other, 1e-5, 1e-5):
        t.fail(f"{what}: your output equals the **other** norm placement's (pre-LN and post-LN swapped)",
               bug="B05.post_for_pre")
    t.compare(probe, expected, what, atol=1e-5, rtol=1e-5)
    return got  # unreachable when compare fails


def _keep(lengths, t_max):
    return torch.arange(t_max)[None, :] < torch.tensor(lengths)[:, None]


def _torch_padding_mask(keep, t_q, num_heads=4):
    """The key-padding mask ``keep`` (B, T_k) as torch's per-head ``attn_mask`` (B·H, T_q, T_k), True = blocked.

    Same outputs as ``key_padding_mask=~keep``; that route runs ``torch._check_with``, whose first call
    imports sympy (about a second), so the oracles take the padding through ``attn_mask`` instead.
    """
    b, t_k = keep.shape
    return (~keep)[:, None, None, :].expand(b, num_heads, t_q, t_k).reshape(b * num_heads, t_q, t_k)


def _check_block_structure(t, name, want, n_big, args_big, what_big):
    """The module facts of ``name(16, 4, 32)`` against the reference's keys, and the parameter count."""
    facts = t.run(_structure(name, 16, 4, 32))
    t.expect(facts["is_module"], f"{name} must be an nn.Module subclass")
    got = facts["state_dict"]
    qkv = {k for k in want if k.endswith((".W_query.bias", ".W_key.bias", ".W_value.bias"))}
    t.expect(got == want, f"state_dict keys/shapes of {name}(16, 4, 32) must be {want}; got {got}",
             bug="B05.qkv_bias_ignored" if isinstance(got, dict) and set(want) - set(got) and set(want) - set(got) <= qkv
             else None)
    nb = t.run(_structure(name, 16, 4, 32, qkv_bias=False))
    got_nb = nb.get("state_dict")
    want_nb = {k: v for k, v in want.items() if k not in qkv}
    t.expect(got_nb == want_nb, f"{name}(16, 4, 32, qkv_bias=False): the attention layers' query, key and value "
             f"projections have no bias; state_dict keys {sorted(got_nb) if isinstance(got_nb, dict) else got_nb}",
             bug="B05.qkv_bias_ignored" if isinstance(got_nb, dict) and set(got_nb) - set(want_nb) and set(got_nb) - set(want_nb) <= qkv
             else None)
    n = t.run(_param_count(name, *args_big))
    t.expect(n == n_big, f"{name}(512, 8, 2048) must have {n_big:,} parameters ({what_big}); got {_count(n)}")


# ================================================================== blocks: train-mode dropout


def _residual_dropout(t, name, ref_cls, branches, call_args, p=0.25):
    """Train-mode dropout of a block, by its properties (pre-LN).

    Every sublayer is made constant: its last linear layer gets weight 0 and bias ``c`` (a different
    ``c`` per branch, chosen so that every subset sum is distinct). In train mode, with residual
    dropout on each branch, ``(out − x)·(1 − p)`` is then a sum of a subset of the ``c``s in every entry,
    and each branch's survivors can be read off: each must be dropped with probability ≈ p, by its own
    draw. Dropout on the sum, or only inside a sublayer, leaves other values. The attention layers
    must also receive the block's p (attention-weight dropout; their outputs here do not depend on
    their weights, so that part is read from the modules' ``nn.Dropout`` probabilities).
    """
    torch.manual_seed(14)
    ref = _randomised(ref_cls(16, 4, 32, dropout=p), 24)
    st = _state_dict(ref)
    levels = {}
    for (key, label), c in zip(branches, (1.0, 2.5, 7.0)):
        st[f"{key}.weight"] = torch.zeros_like(st[f"{key}.weight"])
        st[f"{key}.bias"] = torch.full_like(st[f"{key}.bias"], c)
        levels[label] = c
    x = _rand(8, 6, 16, seed=31)
    attn = [key.split(".")[0] for key, _ in branches if "attn" in key]

    def probe(impl):
        m = getattr(impl, name)(16, 4, 32, dropout=p, norm_first=True)
        unwrap(m).load_state_dict(st)
        unwrap(m).train()
        torch.manual_seed(7)
        out = m(x, *call_args)
        ps = {}
        for a in attn:
            sub = getattr(unwrap(m), a, None)
            ps[a] = [float(d.p) for d in sub.modules() if isinstance(d, nn.Dropout)] if isinstance(sub, nn.Module) \
                else None
        return out, ps

    probe = with_course_parts(name, probe)
    out, ps = t.run(probe)
    t.expect(isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(x.shape),
             f"{name}(16, 4, 32, dropout={p}) in train mode on an {tuple(x.shape)} batch must keep its shape; got "
             f"{getattr(out, 'shape', out)}")
    d = ((out - x) * (1 - p)).double()
    total = sum(levels.values())
    what = f"{name}(16, 4, 32, dropout={p}, norm_first=True) in train mode"
    if bool(((out - x - total).abs() < 1e-3).all()):
        t.fail(f"{what}: no sublayer output was dropped: apply dropout to each sublayer's output before the "
               "residual add, x + dropout(sublayer(norm(x)))", bug=t.diagnose(probe, (out, ps)) or "B05.dropout_missing")
    import itertools

    values = list(levels.values())
    sums = {sum(c for c, k in zip(values, keep) if k): keep
            for keep in itertools.product((False, True), repeat=len(values))}
    grid = torch.tensor(sorted(sums), dtype=torch.float64)
    nearest = (d.unsqueeze(-1) - grid).abs().argmin(-1)
    if not bool(((d - grid[nearest]).abs() < 1e-3).all()):
        t.fail(f"{what}: out − x must be, entry by entry, a sum of dropped or kept sublayer outputs (each kept one "
               "scaled by 1/(1−p)); it is not: dropout belongs on each sublayer's output before the residual add, "
               "not on the sum x + sublayer, nor only inside a sublayer",
               bug=t.diagnose(probe, (out, ps)) or "B05.dropout_on_sum")
    keeps = torch.tensor([sums[v] for v in grid.tolist()])[nearest]  # (..., branch) kept flags
    from ..dropout import zero_fraction_bounds

    lo, hi = zero_fraction_bounds(p, d.numel())
    for i, label in enumerate(levels):
        frac = 1.0 - float(keeps[..., i].float().mean())
        if not lo <= frac <= hi:
            t.fail(f"{what}: {frac:.1%} of the {label} output's entries were dropped; expected about {p:.0%} "
                   "(residual dropout on every sublayer's output, with the block's p)",
                   bug=t.diagnose(probe, (out, ps)) or ("B05.dropout_missing" if frac == 0 else None))
    for a, found in ps.items():
        if found is not None and not any(abs(q - p) < 1e-9 for q in found):
            t.fail(f"{what}: {a} must drop its attention weights with the block's p={p:g}; its dropout "
                   f"probabilities are {found or 'none'}", bug="B05.attn_dropout_missing")



# ================================================================== 05.EncoderBlock


@check(f"{U}.EncoderBlock", ["EncoderBlock"], _ref)
def check_encoder_block(t):
    from llmcourse.nn.blocks import to_torch_encoder_layer

    ref_cls = t.reference.EncoderBlock
    _check_block_structure(t, "EncoderBlock", _shapes(ref_cls(16, 4, 32)), 3_152_384, (512, 8, 2048),
                           "all biases, as nn.TransformerEncoderLayer")

    x = _rand(3, 7, 16, seed=1)
    keep = _keep([7, 5, 2], 7)
    mask = keep[:, None, None, :]
    for activation in ("relu", "gelu"):
        for norm_first in (True, False):
            torch.manual_seed(10)
            ref = _randomised(ref_cls(16, 4, 32, dropout=0.0, norm_first=norm_first, activation=activation), 20)
            st = _state_dict(ref)
            oracle = to_torch_encoder_layer(ref)
            ref_other = _randomised(ref_cls(16, 4, 32, dropout=0.0, norm_first=not norm_first,
                                            activation=activation), 20)
            other_layer = to_torch_encoder_layer(ref_other)
            with torch.enable_grad():  # no nested-tensor fast path: padded rows are computed too
                expected = oracle(x, src_mask=_torch_padding_mask(keep, 7)).detach()
                other = other_layer(x, src_mask=_torch_padding_mask(keep, 7)).detach()
            label = "pre-LN" if norm_first else "post-LN"
            _compare_orderings(t, _enc_probe(st, x, mask, norm_first, activation), expected, other,
                               f"EncoderBlock({label}, activation={activation!r}) vs nn.TransformerEncoderLayer"
                               f"(norm_first={norm_first}) with the same weights and a padding mask")

    # no mask at all
    torch.manual_seed(11)
    ref = _randomised(ref_cls(16, 4, 32, dropout=0.0), 21)
    with torch.enable_grad():
        expected = to_torch_encoder_layer(ref)(x).detach()
    t.compare(_enc_probe(_state_dict(ref), x, None, True), expected, "EncoderBlock(pre-LN) without a mask vs "
              "nn.TransformerEncoderLayer", atol=1e-5, rtol=1e-5)

    # padding invariance: appending masked-out positions leaves the real positions unchanged
    st = _state_dict(ref)
    keep2 = torch.cat([keep, torch.zeros(3, 3, dtype=torch.bool)], 1)
    x2 = torch.cat([x, _rand(3, 3, 16, seed=9) * 4], 1)
    base = t.run(_enc_probe(st, x, mask, True))
    longer = t.run(_enc_probe(st, x2, keep2[:, None, None, :], True))
    t.expect(bool(torch.allclose(longer[:, :7][keep], base[keep], atol=1e-5)),
             "appending padded (masked-out) positions changed the outputs at real positions: the mask must "
             "reach the self-attention")

    # dropout: eval mode is deterministic and equals the dropout-0 block
    def with_dropout(impl):
        m = impl.EncoderBlock(16, 4, 32, dropout=0.5)
        unwrap(m).load_state_dict(st)
        unwrap(m).eval()
        return m(x, mask=mask)

    t.compare(with_course_parts("EncoderBlock", with_dropout), base, "EncoderBlock(dropout=0.5) in eval mode must "
              "equal the same block without dropout", atol=1e-5, rtol=1e-5)
    for norm_first in (True, False):
        torch.manual_seed(15)
        _check_gradients(t, "EncoderBlock", (16, 4, 32), {"dropout": 0.0, "norm_first": norm_first},
                         _state_dict(_randomised(ref_cls(16, 4, 32, dropout=0.0, norm_first=norm_first), 25)),
                         [x, mask], f"EncoderBlock(16, 4, 32, norm_first={norm_first}) with a padding mask")
    _residual_dropout(t, "EncoderBlock", ref_cls, [("self_attn.out_proj", "self-attention"), ("ffn.fc2", "feed-forward")],
                      (None,))


# ================================================================== 05.DecoderBlock


def _dec_probe(st, x, memory, tgt_mask, memory_mask, norm_first=True, activation="relu"):
    def probe(impl):
        m = impl.DecoderBlock(16, 4, 32, dropout=0.0, norm_first=norm_first, activation=activation)
        unwrap(m).load_state_dict(st)
        unwrap(m).eval()
        return m(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask)
    return with_course_parts("DecoderBlock", probe)


@check(f"{U}.DecoderBlock", ["DecoderBlock"], _ref)
def check_decoder_block(t):
    from llmcourse.nn.blocks import to_torch_decoder_layer
    from llmcourse.nn.masks import causal_mask

    ref_cls = t.reference.DecoderBlock
    _check_block_structure(t, "DecoderBlock", _shapes(ref_cls(16, 4, 32)), 4_204_032, (512, 8, 2048),
                           "as nn.TransformerDecoderLayer")

    torch.manual_seed(12)
    ref = _randomised(ref_cls(16, 4, 32, dropout=0.0), 22)
    st = _state_dict(ref)
    tgt = _rand(2, 6, 16, seed=2)
    mem = _rand(2, 6, 16, seed=3)
    src_keep = _keep([6, 4], 6)
    cm = causal_mask(6)
    mm = src_keep[:, None, None, :]

    # detector: the output must depend on memory (at its unmasked positions) ...
    base = t.run(_dec_probe(st, tgt, mem, cm, mm))
    mem2 = mem.clone()
    mem2[:, :4] = mem2[:, :4] * -2.0 + 1.0
    moved = t.run(_dec_probe(st, tgt, mem2, cm, mm))
    t.expect(not bool(torch.allclose(moved, base, atol=1e-6)),
             "changing the encoder memory did not change the decoder's output: cross-attention must take its "
             "keys and values from memory", bug="B05.cross_kv_from_decoder")
    # ... and not on masked-out memory positions
    mem3 = mem.clone()
    mem3[1, 4:] = 50.0
    t.compare(_dec_probe(st, tgt, mem3, cm, mm), base, "changing memory positions that memory_mask hides "
              "(padding of the source) must leave the output unchanged", atol=1e-5, rtol=1e-5)

    # causal over the target: a change at position p leaves outputs < p unchanged
    for p in (2, 4):
        tgt2 = tgt.clone()
        tgt2[:, p:] = tgt2[:, p:] * 3.0 - 1.0
        out = t.run(_dec_probe(st, tgt2, mem, cm, mm))
        t.expect(bool(torch.allclose(out[:, :p], base[:, :p], atol=1e-5)),
                 f"changing target positions ≥ {p} changed outputs at positions < {p}: the self-attention must "
                 "use tgt_mask (the causal mask)")

    # oracle, T_tgt == T_src first, then T_tgt != T_src, both orderings
    shapes = [("T_tgt = T_src = 6", tgt, mem, src_keep),
              ("T_tgt = 5 ≠ T_src = 7", _rand(2, 5, 16, seed=4), _rand(2, 7, 16, seed=5), _keep([7, 3], 7)),
              ("T_tgt = 8 ≠ T_src = 3", _rand(2, 8, 16, seed=6), _rand(2, 3, 16, seed=7), _keep([3, 2], 3))]
    for what, xx, memory, keep in shapes:
        for activation, norm_first in (("relu", True), ("relu", False), ("gelu", True), ("gelu", False)):
            torch.manual_seed(13)
            r = _randomised(ref_cls(16, 4, 32, dropout=0.0, norm_first=norm_first, activation=activation), 23)
            r_other = _randomised(ref_cls(16, 4, 32, dropout=0.0, norm_first=not norm_first,
                                          activation=activation), 23)
            c = causal_mask(xx.shape[1])
            with torch.enable_grad():
                pad = _torch_padding_mask(keep, xx.shape[1])
                expected = to_torch_decoder_layer(r)(xx, memory, tgt_mask=~c, memory_mask=pad).detach()
                other = to_torch_decoder_layer(r_other)(xx, memory, tgt_mask=~c, memory_mask=pad).detach()
            label = "pre-LN" if norm_first else "post-LN"
            _compare_orderings(t, _dec_probe(_state_dict(r), xx, memory, c, keep[:, None, None, :], norm_first,
                                             activation), expected, other,
                               f"DecoderBlock({label}, activation={activation!r}) vs nn.TransformerDecoderLayer"
                               f"(norm_first={norm_first}) with the same weights, {what}, causal tgt_mask and "
                               "source padding memory_mask")

    # train mode: residual dropout on all three sublayers, attention-weight dropout with the block's p
    for norm_first in (True, False):
        torch.manual_seed(16)
        _check_gradients(t, "DecoderBlock", (16, 4, 32), {"dropout": 0.0, "norm_first": norm_first},
                         _state_dict(_randomised(ref_cls(16, 4, 32, dropout=0.0, norm_first=norm_first), 26)),
                         [tgt, mem, cm, mm], f"DecoderBlock(16, 4, 32, norm_first={norm_first}) (target and memory)")
    _residual_dropout(t, "DecoderBlock", ref_cls, [("self_attn.out_proj", "self-attention"),
                                                    ("cross_attn.out_proj", "cross-attention"), ("ffn.fc2", "feed-forward")],
                      (_rand(8, 5, 16, seed=32), causal_mask(6), None))


# ================================================================== 05.ProjectionLayer


@check(f"{U}.ProjectionLayer", ["ProjectionLayer"], _ref)
def check_projection(t):
    facts = t.run(lambda impl: module_facts(impl.ProjectionLayer(16, 50)))
    t.expect(facts["is_module"], "ProjectionLayer must be an nn.Module subclass")
    want = {"proj.weight": (50, 16), "proj.bias": (50,)}
    got = facts["state_dict"]
    t.expect(got == want, f"state_dict of ProjectionLayer(16, 50) must be {want}; got {got}")
    torch.manual_seed(14)
    ref = t.reference.ProjectionLayer(16, 50)
    st = _state_dict(ref)
    x = _rand(3, 5, 16, seed=8) * 2

    def probe(impl):
        mm = impl.ProjectionLayer(16, 50)
        unwrap(mm).load_state_dict(st)
        return mm(x)

    out = t.run(probe)
    t.expect(isinstance(out, torch.Tensor) and tuple(out.shape) == (3, 5, 50),
             f"ProjectionLayer(16, 50) on (3, 5, 16) must return logits of shape (3, 5, 50); got "
             f"{getattr(out, 'shape', out)}")
    ones = torch.ones(3, 5)
    t.expect(not bool(torch.allclose(out.sum(-1), ones, atol=1e-4)),
             "each row of your output sums to 1: these are probabilities (softmax), not logits",
             bug="B05.projection_softmax")
    t.expect(not bool(torch.allclose(out.exp().sum(-1), ones, atol=1e-4)),
             "rows of exp(output) sum to 1: these are log-probabilities (log_softmax), not logits",
             bug="B05.projection_softmax")
    with torch.no_grad():
        expected = F.linear(x, st["proj.weight"], st["proj.bias"])
    t.compare(probe, expected, "ProjectionLayer(16, 50) logits with shared weights", atol=1e-5, rtol=1e-5)
    _check_gradients(t, "ProjectionLayer", (16, 50), {}, st, [x], "ProjectionLayer(16, 50)")


# ================================================================== grading strength (grader/strength.py)

from ..strength import decision, defining_property  # noqa: E402

defining_property(
    f"{U}.LayerNorm",
    "each token is normalised by its own statistics over its features (biased variance, eps inside the root), "
    "identically in train and eval mode, then scaled and shifted",
    probe="the learner's module, loaded with random weight/bias, against nn.LayerNorm on four shapes and a "
          "small-variance input where eps matters; changing one token must move no other token's output; train "
          "and eval outputs compared; F.layer_norm forbidden while it runs")
defining_property(
    f"{U}.gelu",
    "GELU is x·Φ(x), exactly (erf) or by GPT-2's tanh approximation, and nothing else",
    probe="both forms against F.gelu in float32 and float64 on [−8, 8] and random tensors, F.gelu forbidden; the "
          "gap between the two forms measured; three other names must raise ValueError")
defining_property(
    f"{U}.FeedForward",
    "a deterministic position-wise map fc2(act(fc1(x))) with the chosen activation",
    probe="the learner's module with shared weights against F.linear/F.gelu for each activation, in train mode; "
          "two train-mode calls under different seeds must agree; a permutation of positions must permute the "
          "outputs")
defining_property(
    f"{U}.EncoderBlock",
    "a residual block: x plus a dropped-out sublayer of the (pre- or post-) normalised stream, the sublayers being "
    "masked self-attention and the FFN",
    probe="nn.TransformerEncoderLayer loaded with the block's weights in both norm placements and activations, with "
          "a padding mask; appended padded positions; train-mode residual dropout read off constant sublayers of "
          "distinct levels; qkv_bias both ways in the state_dict")
defining_property(
    f"{U}.DecoderBlock",
    "the decoder block listens to the encoder memory through cross-attention (keys/values from memory, source "
    "padding hidden) after causal self-attention, each sublayer residual with its own dropout",
    probe="nn.TransformerDecoderLayer oracle in both placements and three T_tgt/T_src shapes; memory perturbed at "
          "visible and at masked positions; future target perturbation; train-mode residual dropout of three "
          "sublayers read off constant levels")
defining_property(
    f"{U}.ProjectionLayer",
    "the output layer returns logits (an affine map), leaving the log-softmax to the loss",
    probe="the learner's module with shared weights against F.linear; row sums of the output and of its exp "
          "inspected")

decision(f"{U}.DecoderBlock", "which of the two masks each attention of the decoder block takes",
         forms=[r"cross_attn\([^)]*mask\s*=\s*memory_mask", r"self_attn\([^)]*mask\s*=\s*tgt_mask"],
         wrong=("B05.cross_causal",))
decision(f"{U}.EncoderBlock", "where residual dropout acts in a sublayer (before the add, on the sublayer's output)",
         forms=[r"x \+ (self\.)?dropout\(", r"dropout to the output of each sub-?layer",
                r"\\mathrm\{dropout\}\(f\b", r"dropout to the (FFN's|sublayer's) output"],
         wrong=("B05.dropout_on_sum", "B05.dropout_missing"))
