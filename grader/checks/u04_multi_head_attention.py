"""Checks of unit 04 (multi-head attention).

Oracles: ``nn.MultiheadAttention`` (weights packed here as ``[W_q; W_k; W_v]``, masks inverted),
``F.scaled_dot_product_attention`` and a per-head loop written in this file (one head at a time on
row slices of the projection weights) for the non-square and cross-attention cases. Fixtures: F04.5
(seed 123). Properties: the future never leaks, appended masked-out keys change nothing,
``last_weights`` rows sum to 1, heads are independent. Every comparison shares weights (the
reference's ``state_dict`` is loaded into the learner's module), and everything runs in eval mode.

Isolation: a course module handed to the learner's function (``mha_from_wrapper``, ``to_torch_mha``,
``mha_forward_sdpa``) is rebuilt inside the probe from its constructor arguments and state_dict; what
comes back is tensors and plain facts (shapes, type names). ``mha_forward_sdpa`` must not delegate to the
module's own forward (which runs ``F.scaled_dot_product_attention`` itself): the forward's code raises
while the learner's function runs, and the fused kernel's output carries a mark (a different one for
``is_causal=True``), so that the call is proven by the returned values, not by a spy in the learner's
process.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from ..core import CheckFailure, check, module_facts, run_learner, unwrap
from ..dropout import weight_dropout_problem
from ..gradcheck import check_module_gradients, module_gradient_probe

U = "04"
T = torch.tensor

# train-mode dropout problems (grader.dropout kinds) -> bug ids, when no mutant matches the output
_DROPOUT_BUGS = {"missing": "B04.dropout_missing", "not_on_weights": "B04.dropout_not_on_weights"}
_WRAPPER_DROPOUT_BUGS = {"missing": "B04.wrapper_dropout_missing"}


def _dropout_case(num_heads, head_dim, seed):
    """Inputs for the train-mode dropout property: tokens x_j = e_j (T = 6), each head's values [e_j | e_j].

    Returns ``(x, w_query, w_key, clean)``: ``clean`` (B, T, H·6) is each head's pre-dropout causal
    weights, heads side by side, computed here from the same projections.
    """
    g = torch.Generator().manual_seed(seed)
    d_out = num_heads * head_dim
    w_query, w_key = torch.randn(d_out, 6, generator=g), torch.randn(d_out, 6, generator=g)
    x = torch.eye(6).expand(16, 6, 6).contiguous()
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    heads = []
    for h in range(num_heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        scores = (x @ w_query[rows].T) @ (x @ w_key[rows].T).transpose(-2, -1) / head_dim ** 0.5
        heads.append(torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1))
    return x, w_query, w_key, torch.cat(heads, -1)


def _dropout_verdict(t, probe, y, clean, num_heads, head_dim, p, bugs=None):
    """Split the (B, T, H·head_dim) output into the two copies of each head's dropped weights and judge them."""
    halves = y.reshape(*y.shape[:-1], num_heads, 2, head_dim // 2)
    a = halves[..., 0, :].reshape(*y.shape[:-1], -1)
    b = halves[..., 1, :].reshape(*y.shape[:-1], -1)
    problem = weight_dropout_problem(a, b, clean, p)
    if problem is not None:
        kind, message = problem
        t.fail(message, bug=t.diagnose(probe, y) or (_DROPOUT_BUGS if bugs is None else bugs).get(kind))


NAMES = ("MultiHeadAttentionWrapper", "MultiHeadAttention", "mha_from_wrapper", "to_torch_attn_mask", "to_torch_mha",
         "mha_forward_sdpa")


def _ref():
    from llmcourse.nn import multihead as M

    return {name: getattr(M, name) for name in NAMES}


# F03.2 "Your journey starts with one step", F04.5 expected item 0
X6 = T([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
        [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
F045 = T([[-0.4519, 0.2216, 0.4772, 0.1063], [-0.5874, 0.0058, 0.5891, 0.3257], [-0.6300, -0.0632, 0.6202, 0.3860],
          [-0.5675, -0.0843, 0.5478, 0.3589], [-0.5526, -0.0981, 0.5321, 0.3428], [-0.5299, -0.1081, 0.5077, 0.3493]])


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _ref_mha(*args, seed=0, **kwargs):
    from llmcourse.nn.multihead import MultiHeadAttention

    torch.manual_seed(seed)
    m = MultiHeadAttention(*args, **kwargs).eval()
    with torch.no_grad():  # non-zero biases, so that a missing or misplaced bias shows
        for p in m.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed + p.numel()))
    return m


def _state(module) -> dict:
    return {k: v.clone() for k, v in unwrap(module).state_dict().items()}


def _load(module, state: dict, what: str):
    """load_state_dict into a learner module; a key/shape mismatch becomes a failure, not a grader error."""
    try:
        unwrap(module).load_state_dict(state)
    except RuntimeError as exc:
        raise CheckFailure(f"could not load the reference weights into your {what}: "
                           f"{str(exc).splitlines()[0]} (check the state_dict keys and shapes)") from None
    unwrap(module).eval()
    return module


def _spec(module) -> tuple:
    """What a probe needs to rebuild a course ``MultiHeadAttention`` in the learner's process: its
    constructor arguments and a copy of its state_dict (inputs only, never the module itself)."""
    kwargs = {"dropout": module.dropout.p, "qkv_bias": module.W_query.bias is not None, "causal": module.causal,
              "context_length": module.context_length, "d_kv": module.d_kv}
    return (module.d_in, module.d_out, module.num_heads), kwargs, _state(module)


def _course_mha(spec):
    """Inside a probe: the course ``MultiHeadAttention`` described by ``spec``, in eval mode."""
    from llmcourse.nn.multihead import MultiHeadAttention

    args, kwargs, state = spec
    m = MultiHeadAttention(*args, **kwargs)
    m.load_state_dict(state)
    return m.eval()


def _course_wrapper(spec):
    """Inside a probe: the course ``MultiHeadAttentionWrapper`` described by ``spec`` (args, state), eval mode."""
    from llmcourse.nn.multihead import MultiHeadAttentionWrapper

    args, kwargs, state = spec
    w = MultiHeadAttentionWrapper(*args, **kwargs)
    w.load_state_dict(state)
    return w.eval()


def _path(obj, dotted: str):
    """``obj.a.b`` or None (inside a probe: a learner object may lack an attribute)."""
    for part in dotted.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # noqa: BLE001 - a missing or raising attribute is reported as missing
            return None
    return obj


def torch_mha_oracle(mha, x, attn_mask=None, key_padding_mask=None, need_weights=False):
    """nn.MultiheadAttention with mha's weights packed [Wq; Wk; Wv]; masks in torch polarity (True = blocked)."""
    d, h = mha.d_out, mha.num_heads
    tm = nn.MultiheadAttention(d, h, bias=True, batch_first=True).eval()
    with torch.no_grad():
        tm.in_proj_weight.copy_(torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight]))
        if mha.W_query.bias is not None:
            tm.in_proj_bias.copy_(torch.cat([mha.W_query.bias, mha.W_key.bias, mha.W_value.bias]))
        else:
            tm.in_proj_bias.zero_()
        tm.out_proj.weight.copy_(mha.out_proj.weight)
        tm.out_proj.bias.copy_(mha.out_proj.bias)
        return tm(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=need_weights,
                  average_attn_weights=False)


def per_head_loop(mha, x_q, x_kv=None, mask=None):
    """Independent oracle: one head at a time on row slices of the weights, with F.scaled_dot_product_attention."""
    x_kv = x_q if x_kv is None else x_kv
    t_q, t_k = x_q.shape[1], x_kv.shape[1]
    full = mask
    if mha.causal:
        cm = torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)
        full = cm if mask is None else cm & mask
    outs = []
    hd = mha.head_dim
    with torch.no_grad():
        for h in range(mha.num_heads):
            rows = slice(h * hd, (h + 1) * hd)

            def proj(lin, x, rows=rows):
                return F.linear(x, lin.weight[rows], None if lin.bias is None else lin.bias[rows])

            q, k, v = proj(mha.W_query, x_q), proj(mha.W_key, x_kv), proj(mha.W_value, x_kv)
            m = None if full is None else full.expand(x_q.shape[0], mha.num_heads, t_q, t_k)[:, h]
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=m))
        return mha.out_proj(torch.cat(outs, dim=-1))


# ================================================================== 04.MultiHeadAttentionWrapper


@check(f"{U}.MultiHeadAttentionWrapper", ["MultiHeadAttentionWrapper"], _ref)
def check_wrapper(t):
    def structure(impl):
        m = impl.MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2)
        facts = module_facts(m)
        heads = getattr(unwrap(m), "heads", None)
        facts["heads"] = len(heads) if isinstance(heads, nn.ModuleList) else None
        return facts

    facts = t.run(structure)
    t.expect(facts["is_module"], "MultiHeadAttentionWrapper must be an nn.Module subclass")
    t.expect(facts["heads"] == 2, "self.heads must be an nn.ModuleList with num_heads heads")
    shapes = facts["state_dict"]
    want = {f"heads.{h}.W_{n}.weight": (2, 3) for h in range(2) for n in ("query", "key", "value")}
    t.expect(shapes == want, f"state_dict keys/shapes of MultiHeadAttentionWrapper(d_in=3, head_dim=2, "
             f"context_length=6, dropout=0.0, num_heads=2) must be {want}; got {shapes}")
    biased = t.run(lambda impl: module_facts(impl.MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2, qkv_bias=True)))
    want_b = {f"heads.{h}.W_{n}.{w}": (2, 3) if w == "weight" else (2,)
              for h in range(2) for n in ("query", "key", "value") for w in ("weight", "bias")}
    got_b = biased["state_dict"]
    t.expect(got_b == want_b, f"MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2, qkv_bias=True): every head's query, key "
             f"and value projections must have a bias; state_dict {got_b}", bug="B04.wrapper_qkv_bias_ignored")

    # independent heads: perturbing head 1 changes only its own columns
    x = _rand(2, 5, 4, seed=3)

    def perturbed(impl):
        torch.manual_seed(7)
        w = impl.MultiHeadAttentionWrapper(4, 3, 8, 0.0, 3)
        unwrap(w).eval()
        before = w(x)
        with torch.no_grad():
            unwrap(w).heads[1].W_value.weight.add_(1.0)
        return before, w(x)

    before, after = t.run(perturbed)
    t.expect(tuple(before.shape) == (2, 5, 9),
             f"3 heads of width 3 on a (2, 5, 4) batch must give (2, 5, 9); got {tuple(before.shape)}")
    t.expect(not torch.allclose(before[..., :3], before[..., 3:6], atol=1e-6),
             "the column blocks of different heads are identical: every head uses the same projections",
             bug="B04.wrapper_shared_head")
    changed = (after - before).abs().amax(dim=(0, 1)) > 1e-6
    t.expect(bool(changed[3:6].all()) and not bool(changed[:3].any()) and not bool(changed[6:].any()),
             f"changing head 1's W_value must change only columns 3..5 of the output; columns that changed: "
             f"{torch.nonzero(changed).flatten().tolist()}", bug="B04.wrapper_shared_head")

    # F04.5: torch.manual_seed(123), heads created in order, each with query, key, value layers
    def f045(impl):
        torch.manual_seed(123)
        w = impl.MultiHeadAttentionWrapper(d_in=3, head_dim=2, context_length=6, dropout=0.0, num_heads=2)
        unwrap(w).eval()
        return w(torch.stack([X6, X6]))

    t.compare(f045, torch.stack([F045, F045]), "MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2) built right after "
              "torch.manual_seed(123), on torch.stack([X, X])", atol=1e-4)

    # shared weights vs the reference, qkv_bias, T < context_length
    Ref = _ref()["MultiHeadAttentionWrapper"]
    torch.manual_seed(5)
    ref = Ref(6, 4, 10, 0.0, 3, qkv_bias=True).eval()
    st = _state(ref)
    xb = _rand(3, 7, 6, seed=11)

    def shared(impl):
        w = _load(impl.MultiHeadAttentionWrapper(6, 4, 10, 0.0, 3, qkv_bias=True), st, "MultiHeadAttentionWrapper")
        return w(xb)

    t.compare(shared, ref(xb), "MultiHeadAttentionWrapper(6, 4, 10, 0.0, 3, qkv_bias=True) on a (3, 7, 6) batch "
              "(shared weights)", atol=1e-5)
    check_module_gradients(t, module_gradient_probe(lambda impl: _load(impl.MultiHeadAttentionWrapper(6, 4, 10, 0.0, 3,
                                                                                       qkv_bias=True), st,
                                                         "MultiHeadAttentionWrapper"), [xb]),
                    "MultiHeadAttentionWrapper(6, 4, 10, 0.0, 3, qkv_bias=True)")

    # train mode: the heads drop their attention weights with the wrapper's p (tokens x_j = e_j,
    # each head's W_value = [I; I], so each head's 12 columns are twice its dropout(weights))
    x_d, wq_d, wk_d, clean = _dropout_case(2, 12, seed=79)
    st_d = {}
    for h in range(2):
        rows = slice(h * 12, (h + 1) * 12)
        st_d.update({f"heads.{h}.W_query.weight": wq_d[rows], f"heads.{h}.W_key.weight": wk_d[rows],
                     f"heads.{h}.W_value.weight": torch.cat([torch.eye(6)] * 2, 0)})

    def train_dropped(impl):
        w = _load(impl.MultiHeadAttentionWrapper(6, 12, 6, 0.25, 2), st_d, "MultiHeadAttentionWrapper")
        unwrap(w).train()
        torch.manual_seed(7)
        return w(x_d)

    y = t.run(train_dropped)
    t.expect(isinstance(y, torch.Tensor) and tuple(y.shape) == (16, 6, 24),
             f"MultiHeadAttentionWrapper(6, 12, 6, 0.25, 2) in train mode on a (16, 6, 6) batch must return "
             f"(16, 6, 24); got {getattr(y, 'shape', y)}")
    _dropout_verdict(t, train_dropped, y, clean, 2, 12, 0.25, _WRAPPER_DROPOUT_BUGS)


# ================================================================== 04.MultiHeadAttention


def _make(st, *args, **kwargs):
    def make(impl):
        return _load(impl.MultiHeadAttention(*args, **kwargs), st, "MultiHeadAttention")
    return make


@check(f"{U}.MultiHeadAttention", ["MultiHeadAttention"], _ref)
def check_mha(t):
    # structure
    facts = t.run(lambda impl: module_facts(impl.MultiHeadAttention(6, 4, 2, qkv_bias=True, causal=True,
                                                                    context_length=8, d_kv=5)))
    t.expect(facts["is_module"], "MultiHeadAttention must be an nn.Module subclass")
    shapes = facts["state_dict"]
    want = {"W_query.weight": (4, 6), "W_query.bias": (4,), "W_key.weight": (4, 5), "W_key.bias": (4,),
            "W_value.weight": (4, 5), "W_value.bias": (4,), "out_proj.weight": (4, 4), "out_proj.bias": (4,)}
    t.expect(shapes == want, "state_dict of MultiHeadAttention(d_in=6, d_out=4, num_heads=2, qkv_bias=True, "
             f"causal=True, context_length=8, d_kv=5) must be {want} (the causal mask is a non-persistent buffer); "
             f"got {shapes}")
    buffers = facts["buffers"]
    t.expect("causal_mask" in buffers and buffers["causal_mask"][0] == torch.bool
             and tuple(buffers["causal_mask"][1]) == (8, 8),
             "a causal module must register a (context_length, context_length) bool buffer named `causal_mask`")
    t.expect("causal_mask" not in facts["parameters"], "the mask must not be a parameter")
    nb = t.run(lambda impl: module_facts(impl.MultiHeadAttention(6, 6, 3)))
    nb_keys = set(nb.get("state_dict", {}))
    t.expect(nb_keys == {"W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight", "out_proj.bias"},
             f"without qkv_bias the keys must be W_query/W_key/W_value.weight and out_proj.weight/.bias; got "
             f"{sorted(nb_keys)}")
    got = t.raised(lambda impl: impl.MultiHeadAttention(256, 256, 6))
    t.expect(got == "ValueError", f"MultiHeadAttention(d_in=256, d_out=256, num_heads=6) must raise ValueError "
             f"(256 is not divisible by 6); got {got}", bug="B04.head_dim_floor")

    # causal future perturbation (detects a mask that is never applied)
    ref_c = _ref_mha(8, 8, 2, causal=True, context_length=10, seed=1)
    st_c = _state(ref_c)
    x = _rand(2, 6, 8, seed=2)
    base = t.run(lambda impl: _make(st_c, 8, 8, 2, causal=True, context_length=10)(impl)(x))
    t.expect(tuple(base.shape) == (2, 6, 8), f"(2, 6, 8) input, d_out=8: expected output (2, 6, 8), got "
             f"{tuple(base.shape)}")
    for pos in range(5):
        x2 = x.clone()
        x2[:, pos + 1:] = x2[:, pos + 1:] * -2.0 + 0.5
        def probe(impl, x2=x2):
            return _make(st_c, 8, 8, 2, causal=True, context_length=10)(impl)(x2)

        out = t.run(probe)
        if not torch.allclose(out[:, :pos + 1], base[:, :pos + 1], atol=1e-6):
            # a wrong split/merge mixes positions too; a known mutant takes precedence over the detector
            t.fail(f"causal module: changing tokens after position {pos} changed the output at positions ≤ {pos}: "
                   "the future leaks", bug=t.diagnose(probe, out) or "B04.mask_discarded")

    # oracle: nn.MultiheadAttention with copied weights, square cases
    ref = _ref_mha(8, 8, 2, qkv_bias=True, seed=3)
    st = _state(ref)
    xs = _rand(2, 5, 8, seed=4)
    t.compare(lambda impl: _make(st, 8, 8, 2, qkv_bias=True)(impl)(xs), torch_mha_oracle(ref, xs)[0],
              "MultiHeadAttention(8, 8, 2, qkv_bias=True) without a mask vs nn.MultiheadAttention with the same "
              "weights", atol=1e-5)
    cm = torch.ones(6, 6, dtype=torch.bool).tril()
    t.compare(lambda impl: _make(st_c, 8, 8, 2, causal=True, context_length=10)(impl)(x),
              torch_mha_oracle(ref_c, x, attn_mask=~cm)[0],
              "causal MultiHeadAttention(8, 8, 2) on a (2, 6, 8) batch vs nn.MultiheadAttention with attn_mask = "
              "~causal_mask", atol=1e-5)
    g = torch.Generator().manual_seed(6)
    rmask = torch.rand(2, 2, 5, 5, generator=g) > 0.4
    rmask[..., 0] = True  # every query keeps at least one key
    t.compare(lambda impl: _make(st, 8, 8, 2, qkv_bias=True)(impl)(xs, mask=rmask),
              torch_mha_oracle(ref, xs, attn_mask=~rmask.reshape(4, 5, 5))[0],
              "a random (B, H, T, T) mask vs nn.MultiheadAttention with the inverted mask", atol=1e-5)
    keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    t.compare(lambda impl: _make(st, 8, 8, 2, qkv_bias=True)(impl)(xs, mask=keep[:, None, None, :]),
              torch_mha_oracle(ref, xs, key_padding_mask=~keep)[0],
              "a (B, 1, 1, T_k) key-padding mask vs nn.MultiheadAttention(key_padding_mask=~keep)", atol=1e-5)

    # per-head loop reference: cross-attention (T_q != T_k, d_kv != d_in), causal with T_q < T_k
    ref_x = _ref_mha(6, 8, 4, qkv_bias=False, d_kv=5, seed=7)
    st_x = _state(ref_x)
    xq, xkv = _rand(2, 3, 6, seed=8), _rand(2, 7, 5, seed=9)
    pad = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :]
    t.compare(lambda impl: _make(st_x, 6, 8, 4, d_kv=5)(impl)(xq, xkv), per_head_loop(ref_x, xq, xkv),
              "cross-attention MultiHeadAttention(d_in=6, d_out=8, num_heads=4, d_kv=5), x_q (2, 3, 6), "
              "x_kv (2, 7, 5), vs a per-head loop", atol=1e-5)
    t.compare(lambda impl: _make(st_x, 6, 8, 4, d_kv=5)(impl)(xq, xkv, mask=pad), per_head_loop(ref_x, xq, xkv, pad),
              "cross-attention with a (B, 1, 1, T_k) key-padding mask vs a per-head loop", atol=1e-5)
    xk2 = _rand(2, 6, 8, seed=10)
    t.compare(lambda impl: _make(st_c, 8, 8, 2, causal=True, context_length=10)(impl)(x[:, 4:], xk2),
              per_head_loop(ref_c, x[:, 4:], xk2),
              "causal module, x_q (2, 2, 8) after x_kv (2, 6, 8): the 2 queries are the last positions "
              "(bottom-right causal mask), vs a per-head loop", atol=1e-5)

    # a causal module given a mask obeys both: causal & key padding, square self-attention
    keep6 = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])[:, None, None, :]
    t.compare(lambda impl: _make(st_c, 8, 8, 2, causal=True, context_length=10)(impl)(x, mask=keep6),
              per_head_loop(ref_c, x, mask=keep6),
              "causal MultiHeadAttention(8, 8, 2) given a (B, 1, 1, T) key-padding mask (a key must be allowed by "
              "both the causal mask and the given one) vs a per-head loop", atol=1e-5)

    # padding invariance: appending masked-out keys changes nothing
    extra = torch.cat([xkv, _rand(2, 3, 5, seed=12) * 5], dim=1)
    keep10 = torch.cat([torch.ones(2, 7, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool)], 1)[:, None, None, :]
    short = t.run(lambda impl: _make(st_x, 6, 8, 4, d_kv=5)(impl)(xq, xkv))
    long_ = t.run(lambda impl: _make(st_x, 6, 8, 4, d_kv=5)(impl)(xq, extra, mask=keep10))
    t.expect(bool(torch.allclose(short, long_, atol=1e-5)),
             "appending 3 keys that the mask blocks changed the output: masked keys must get weight exactly 0")

    # store_weights is off by default: a fresh module stores nothing, before and after a forward pass
    def fresh_weights(impl):
        mm = _make(st_c, 8, 8, 2, causal=True, context_length=10)(impl)
        before = getattr(unwrap(mm), "last_weights", "missing")
        mm(x)
        return before, getattr(unwrap(mm), "last_weights", "missing"), getattr(unwrap(mm), "store_weights", "missing")

    before, after, flag = t.run(fresh_weights)
    t.expect(before is None and after is None and flag is False,
             "a new MultiHeadAttention has store_weights = False and last_weights = None, and keeps last_weights None "
             f"through a forward pass until store_weights is switched on; got store_weights={flag!r}, last_weights "
             f"{'None' if before is None else 'set' if before != 'missing' else 'missing'} before and "
             f"{'None' if after is None else 'set' if after != 'missing' else 'missing'} after a forward pass")

    # backpropagation reaches every projection and the inputs (causal with a mask; cross-attention)
    check_module_gradients(t, module_gradient_probe(_make(st_c, 8, 8, 2, causal=True, context_length=10), [x, None, keep6]),
                    "causal MultiHeadAttention(8, 8, 2) with a key-padding mask")
    check_module_gradients(t, module_gradient_probe(_make(st_x, 6, 8, 4, d_kv=5), [xq, xkv]),
                    "cross-attention MultiHeadAttention(6, 8, 4, d_kv=5)")

    # last_weights with store_weights
    def weights(impl):
        mm = _make(st_c, 8, 8, 2, causal=True, context_length=10)(impl)
        mm.store_weights = True
        mm(x)
        w = getattr(unwrap(mm), "last_weights", None)
        return w, bool(getattr(w, "requires_grad", False))

    w, w_requires_grad = t.run(weights)
    t.expect(isinstance(w, torch.Tensor) and tuple(w.shape) == (2, 2, 6, 6),
             f"with store_weights = True, last_weights must be the (B, H, T_q, T_k) = (2, 2, 6, 6) weights; got "
             f"{getattr(w, 'shape', w)}")
    t.expect(bool(torch.allclose(w.sum(-1), torch.ones(2, 2, 6), atol=1e-5)), "rows of last_weights must sum to 1")
    t.expect(bool((w.triu(1) == 0).all()), "causal module: last_weights must be exactly 0 above the diagonal")
    t.expect(not w_requires_grad, "last_weights must be detached")

    # in train mode too, last_weights is the softmax's output: rows that sum to 1, equal to the eval weights
    def weights_train(impl):
        mm = _make(st_c, 8, 8, 2, dropout=0.5, causal=True, context_length=10)(impl)
        mm.store_weights = True
        unwrap(mm).train()
        torch.manual_seed(3)
        mm(x)
        return getattr(unwrap(mm), "last_weights", None)

    wt = t.run(weights_train)
    sums = wt.sum(-1) if isinstance(wt, torch.Tensor) else None
    t.expect(isinstance(wt, torch.Tensor) and tuple(wt.shape) == (2, 2, 6, 6)
             and bool(torch.allclose(wt, w, atol=1e-5)),
             "MultiHeadAttention(8, 8, 2, dropout=0.5, causal=True) in train mode with store_weights = True: "
             "last_weights must be the attention distribution of each query (rows summing to 1, the same as in "
             "eval mode); its row sums are "
             f"{[round(v, 3) for v in sums.flatten()[:6].tolist()] if sums is not None else wt} …",
             bug="B04.last_weights_after_dropout")

    # the head count matters: 4 heads of 2 are not 1 head of 8
    ref4 = _ref_mha(8, 8, 4, seed=13)
    st4 = _state(ref4)
    t.compare(lambda impl: _make(st4, 8, 8, 4)(impl)(xs), torch_mha_oracle(ref4, xs)[0],
              "MultiHeadAttention(8, 8, num_heads=4) vs nn.MultiheadAttention", atol=1e-5)

    # train mode, by its properties: tokens x_j = e_j, W_value = [I; I; I; I], out_proj = I, so each
    # head's 12 output columns are twice its dropout(weights) (p = 0.25: survivors are 4w/3)
    x_d, wq_d, wk_d, clean = _dropout_case(2, 12, seed=78)
    st_d = {"W_query.weight": wq_d, "W_key.weight": wk_d, "W_value.weight": torch.cat([torch.eye(6)] * 4, 0),
            "out_proj.weight": torch.eye(24), "out_proj.bias": torch.zeros(24)}

    def train_dropped(impl):
        mm = _make(st_d, 6, 24, 2, dropout=0.25, causal=True, context_length=6)(impl)
        unwrap(mm).train()
        torch.manual_seed(7)
        return mm(x_d)

    y = t.run(train_dropped)
    t.expect(isinstance(y, torch.Tensor) and tuple(y.shape) == (16, 6, 24),
             f"MultiHeadAttention(6, 24, 2, dropout=0.25, causal=True, context_length=6) in train mode on a "
             f"(16, 6, 6) batch must return (16, 6, 24); got {getattr(y, 'shape', y)}")
    _dropout_verdict(t, train_dropped, y, clean, 2, 12, 0.25)


# ================================================================== 04.mha_from_wrapper


@check(f"{U}.mha_from_wrapper", ["mha_from_wrapper"], _ref)
def check_mha_from_wrapper(t):
    Wrapper = _ref()["MultiHeadAttentionWrapper"]
    for seed, (d_in, hd, ctx, h, bias, shape) in enumerate([(3, 2, 6, 2, False, (2, 6, 3)),
                                                           (8, 4, 10, 3, True, (3, 7, 8)),
                                                           (5, 3, 4, 1, False, (1, 4, 5))]):
        torch.manual_seed(100 + seed)
        wrapper = Wrapper(d_in, hd, ctx, 0.1, h, qkv_bias=bias).eval()
        spec = ((d_in, hd, ctx, 0.1, h), {"qkv_bias": bias}, _state(wrapper))
        x = _rand(*shape, seed=seed)
        expected = wrapper(x)

        def structure(impl, spec=spec):
            mha = unwrap(impl.mha_from_wrapper(_course_wrapper(spec)))
            facts = {"type": type(mha).__name__, "is_module": isinstance(mha, nn.Module)}
            facts["missing"] = [a for a in ("W_query", "W_key", "W_value", "out_proj", "dropout")
                                if _path(mha, a) is None]
            for key in ("W_query.weight", "W_key.weight", "out_proj.weight", "out_proj.bias", "dropout.p"):
                facts[key] = _path(mha, key)
            facts["causal"] = _path(mha, "causal")
            cm = _path(mha, "causal_mask")
            facts["causal_mask"] = tuple(cm.shape) if isinstance(cm, torch.Tensor) else None
            return facts

        facts = t.run(structure)
        t.expect(facts["is_module"], f"mha_from_wrapper must return an nn.Module, got {facts['type']}")
        missing = facts["missing"]
        t.expect(not missing, f"the module returned by mha_from_wrapper has no attribute(s) {missing}")
        what = f"wrapper with {h} heads of width {hd} (d_in={d_in}, qkv_bias={bias})"
        wq = facts["W_query.weight"]
        t.expect(isinstance(wq, torch.Tensor) and tuple(wq.shape) == (h * hd, d_in),
                 f"{what}: W_query.weight must be (num_heads·head_dim, d_in) = {(h * hd, d_in)}; got "
                 f"{tuple(getattr(wq, 'shape', ())) or wq}")
        eye = torch.eye(h * hd)
        ow, ob = facts["out_proj.weight"], facts["out_proj.bias"]
        t.expect(isinstance(ow, torch.Tensor) and isinstance(ob, torch.Tensor) and bool(torch.equal(ow, eye))
                 and bool((ob == 0).all()), f"{what}: out_proj must be the identity (weight = I, bias = 0)")
        t.expect(facts["causal"] is True and facts["causal_mask"] == (ctx, ctx),
                 f"{what}: every head of the wrapper is causal with context_length={ctx}; the returned module must be "
                 f"too (causal={facts['causal']!r}, causal_mask {facts['causal_mask']})",
                 bug="B04.from_wrapper_not_causal")
        stacked = torch.cat([hh.W_key.weight for hh in wrapper.heads], 0).detach()

        def key_weight(impl, spec=spec):
            return _path(unwrap(impl.mha_from_wrapper(_course_wrapper(spec))), "W_key.weight")

        t.compare(key_weight, stacked, f"{what}: the returned W_key.weight (head h must compute exactly what "
                  "wrapper.heads[h] computes)", atol=0, rtol=0)
        t.expect(facts["dropout.p"] == 0.1, f"{what}: the dropout probability must be copied (0.1)")

        def run(impl, spec=spec, x=x):
            out = unwrap(impl.mha_from_wrapper(_course_wrapper(spec)))
            out.eval()
            return run_learner(out, "the module returned by mha_from_wrapper", (x,), {})

        t.compare(run, expected, f"{what}: mha_from_wrapper(w)(x) vs w(x) in eval mode", atol=1e-6, rtol=1e-5)


# ================================================================== 04.to_torch_mha


def _in_bias(torch_mha):
    bias = getattr(unwrap(torch_mha), "in_proj_bias", None)
    return None if bias is None else bias.detach()


@check(f"{U}.to_torch_mha", ["to_torch_attn_mask", "to_torch_mha"], _ref)
def check_to_torch_mha(t):
    cm = torch.ones(5, 5, dtype=torch.bool).tril()
    t.compare(lambda impl: impl.to_torch_attn_mask(cm), ~cm,
              "to_torch_attn_mask(causal mask (5, 5)): nn.MultiheadAttention's boolean masks mean 'blocked'")
    ref = _ref_mha(8, 8, 2, qkv_bias=True, seed=21)
    spec = _spec(ref)

    def structure(impl):
        tm = unwrap(impl.to_torch_mha(_course_mha(spec)))
        return {"type": type(tm).__name__, "is_torch_mha": isinstance(tm, nn.MultiheadAttention),
                "batch_first": bool(getattr(tm, "batch_first", False))}

    facts = t.run(structure)
    t.expect(facts["is_torch_mha"], f"to_torch_mha must return nn.MultiheadAttention, got {facts['type']}")
    t.expect(facts["batch_first"], "create the nn.MultiheadAttention with batch_first=True")
    packed = torch.cat([ref.W_query.weight, ref.W_key.weight, ref.W_value.weight]).detach()
    t.compare(lambda impl: impl.to_torch_mha(_course_mha(spec)).in_proj_weight.detach(), packed,
              "in_proj_weight (3·d, d)", atol=0, rtol=0)
    t.compare(lambda impl: _in_bias(impl.to_torch_mha(_course_mha(spec))),
              torch.cat([ref.W_query.bias, ref.W_key.bias, ref.W_value.bias]).detach(), "in_proj_bias", atol=0, rtol=0)
    nobias = _ref_mha(8, 8, 4, seed=22)
    spec_nb = _spec(nobias)
    t.compare(lambda impl: _in_bias(impl.to_torch_mha(_course_mha(spec_nb))), torch.zeros(24),
              "in_proj_bias of a module without qkv_bias (zeros; create nn.MultiheadAttention with bias=True, "
              "since out_proj needs its bias)", atol=0, rtol=0)

    x = _rand(2, 5, 8, seed=23)
    g = torch.Generator().manual_seed(24)
    rmask = torch.rand(5, 5, generator=g) > 0.5
    rmask[:, 0] = True
    for what, module, mask in [("causal mask", ref, cm), ("random (T, T) mask", ref, rmask),
                               ("causal mask, 4 heads, no qkv bias", nobias, cm)]:
        expected = module(x, mask=mask)
        spec_m = _spec(module)

        def run(impl, spec=spec_m, mask=mask):
            torch_mha = unwrap(impl.to_torch_mha(_course_mha(spec))).eval()
            return run_learner(torch_mha, "the nn.MultiheadAttention returned by to_torch_mha", (x, x, x),
                               {"attn_mask": impl.to_torch_attn_mask(mask), "need_weights": False})[0]

        t.compare(run, expected, f"nn.MultiheadAttention from to_torch_mha with attn_mask=to_torch_attn_mask(m), "
                  f"{what}, vs mha(x, mask=m)", atol=1e-5)

    # averaged weights equal last_weights.mean(1)
    ref.store_weights = True
    ref(x, mask=cm)
    expected_w = ref.last_weights.mean(1)
    ref.store_weights = False

    def weights(impl):
        torch_mha = unwrap(impl.to_torch_mha(_course_mha(spec))).eval()
        return run_learner(torch_mha, "the nn.MultiheadAttention returned by to_torch_mha", (x, x, x),
                           {"attn_mask": impl.to_torch_attn_mask(cm), "need_weights": True,
                            "average_attn_weights": True})[1]

    t.compare(weights, expected_w, "need_weights=True, average_attn_weights=True: weights vs mha.last_weights.mean(1)",
              atol=1e-5)
    # train mode: the copy drops its attention weights like the course module (p = 0.5): every returned
    # weight is 0 or w/(1-p), about half of them 0
    ref_d = _ref_mha(8, 8, 2, dropout=0.5, seed=27)
    spec_d = _spec(ref_d)
    xd = _rand(16, 6, 8, seed=28)
    ref_d.store_weights = True
    ref_d(xd, mask=torch.ones(6, 6, dtype=torch.bool).tril())
    clean = ref_d.last_weights
    ref_d.store_weights = False

    def train_weights(impl):
        torch_mha = unwrap(impl.to_torch_mha(_course_mha(spec_d))).train()
        torch.manual_seed(5)
        cm6 = torch.ones(6, 6, dtype=torch.bool).tril()
        return run_learner(torch_mha, "the nn.MultiheadAttention returned by to_torch_mha", (xd, xd, xd),
                           {"attn_mask": impl.to_torch_attn_mask(cm6), "need_weights": True,
                            "average_attn_weights": False})[1]

    wd = t.run(train_weights)
    if isinstance(wd, torch.Tensor) and wd.shape == clean.shape:
        problem = weight_dropout_problem(wd, wd, clean, 0.5)
        if problem is not None:
            t.fail(f"to_torch_mha of a module with dropout p=0.5, in train mode (weights returned by "
                   f"need_weights=True, average_attn_weights=False): {problem[1]}",
                   bug="B04.torch_mha_dropout_missing" if problem[0] == "missing" else None)
    else:
        t.fail(f"need_weights=True, average_attn_weights=False must return (B, H, T, T) = {tuple(clean.shape)} "
               f"weights; got {getattr(wd, 'shape', wd)}")
    got = t.raised(lambda impl: impl.to_torch_mha(_ref_mha(6, 8, 2, seed=26)))
    t.expect(got == "ValueError", f"to_torch_mha on a module with d_in=6 != d_out=8 must raise ValueError; got {got}")


# ================================================================== 04.mha_forward_sdpa


DELEGATES = "B04.sdpa_delegates"


def _delegation_trap(*args, **kwargs):
    # runs with the globals of llmcourse.nn.multihead (its code replaces MultiHeadAttention.forward's): only
    # builtins and constants here
    from grader.core import CheckFailure

    raise CheckFailure("mha_forward_sdpa calls the module's own forward (`mha(...)` or `mha.forward(...)`), which "
                       "already uses F.scaled_dot_product_attention: this exercise asks you to compute it yourself "
                       "from mha.W_query, mha.W_key, mha.W_value, the mask and mha.out_proj.",
                       bug_id="B04.sdpa_delegates")


@contextlib.contextmanager
def _no_module_forward():
    """Inside a probe: the course ``MultiHeadAttention.forward`` raises while the learner's function runs.

    The module's own forward already runs ``F.scaled_dot_product_attention``, so an answer that calls
    ``mha(...)``, ``mha.forward(...)``, ``MultiHeadAttention.forward(mha, ...)`` or a reference to that
    function taken in advance would match every expected value; this exercise asks for the computation
    itself. The function's code is swapped (not the class attribute), so every route to it ends here.
    A fact of the learner's process: it can only make the check fail.
    """
    from llmcourse.nn.multihead import MultiHeadAttention

    forward = MultiHeadAttention.__dict__["forward"]
    saved = forward.__code__
    swap = not saved.co_freevars  # a code object can only replace one with the same free variables
    if swap:
        forward.__code__ = _delegation_trap.__code__
    else:  # (a forward that uses super() has a free variable): replace the class attribute instead
        MultiHeadAttention.forward = _delegation_trap
    try:
        yield
    finally:
        if swap:
            forward.__code__ = saved
        else:
            MultiHeadAttention.forward = forward


def _sdpa_marked(*args, **kwargs):
    """``F.scaled_dot_product_attention`` with a recognisable mark on its output: ``2·out + 1`` elementwise,
    or ``−3·out + 1`` when called with ``is_causal=True``.

    An answer that computes its attention with the fused kernel carries the mark into its result (the
    merge is a permutation, ``out_proj`` is affine); one that does not, does not; one that passes
    ``is_causal=True`` (as the library module's own fast path does) carries the other mark. The checker
    compares with the reference run under the same marks, so what was called is proven by returned values.
    """
    causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
    out = _SDPA(*args, **kwargs)
    return out * (-3.0 if causal else 2.0) + 1.0


def _sdpa_marked_as_causal(*args, **kwargs):
    """The mark a call with ``is_causal=True`` gets (the checker's expectation for that case)."""
    return _SDPA(*args, **kwargs) * -3.0 + 1.0


_SDPA = F.scaled_dot_product_attention


@contextlib.contextmanager
def _marked_sdpa(fn, spy=_sdpa_marked):
    """Route F.scaled_dot_product_attention (and the names ``fn``'s module imported it as) through the mark."""
    original = F.scaled_dot_product_attention
    fn = getattr(fn, "__wrapped__", fn)
    namespace = getattr(fn, "__globals__", {})
    aliases = [k for k, v in list(namespace.items()) if v is original]
    F.scaled_dot_product_attention = spy
    for k in aliases:
        namespace[k] = spy
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
        for k in aliases:
            namespace[k] = original


@check(f"{U}.mha_forward_sdpa", ["mha_forward_sdpa"], _ref)
def check_mha_forward_sdpa(t):
    ref_c = _ref_mha(8, 8, 2, qkv_bias=True, causal=True, context_length=10, seed=31)
    x = _rand(2, 6, 8, seed=32)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]
    ref_x = _ref_mha(6, 8, 4, d_kv=5, seed=33)
    xq, xkv = _rand(2, 3, 6, seed=34), _rand(2, 7, 5, seed=35)
    pad = torch.tensor([[True] * 7, [True] * 2 + [False] * 5])[:, None, None, :]
    ref_s = _ref_mha(8, 8, 4, seed=36)
    rmask = torch.rand(2, 4, 6, 6, generator=torch.Generator().manual_seed(37)) > 0.5
    rmask[..., 0] = True
    # the masked T_q < T_k case comes first: it separates the two top-left mistakes
    cases = [
        ("causal module, T_q=3 < T_k=6, with a key-padding mask", ref_c, x[:, 3:], x, keep),
        ("causal module, T_q=2 < T_k=6 (queries are the last positions), no user mask", ref_c, x[:, 4:], x, None),
        ("causal module, self-attention", ref_c, x, None, None),
        ("cross-attention, T_q=3, T_k=7, d_kv=5, with a key-padding mask", ref_x, xq, xkv, pad),
        ("non-causal self-attention with a random (B, H, T, T) mask", ref_s, x, None, rmask),
    ]
    # a module in eval mode drops nothing, whatever its p: two calls agree, and equal the forward
    ref_p = _ref_mha(8, 8, 2, dropout=0.5, causal=True, context_length=10, seed=38)
    spec_p = _spec(ref_p)

    def eval_twice(impl):
        mha = _course_mha(spec_p)
        with _no_module_forward():
            torch.manual_seed(1)
            a = impl.mha_forward_sdpa(mha, x)
            torch.manual_seed(2)
            return a, impl.mha_forward_sdpa(mha, x)

    a, b = t.run(eval_twice)
    t.expect(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
             and bool(torch.allclose(a, b, atol=1e-6)),
             "mha_forward_sdpa on a module with dropout p=0.5 in eval mode gave two different results for the same "
             "input: something random (dropout) acts in eval mode", bug="B04.sdpa_dropout_in_eval")
    for what, module, xq_, xkv_, mask in cases:
        expected = module(xq_, xkv_, mask=mask)
        spec_m = _spec(module)

        def run(impl, spec=spec_m, xq_=xq_, xkv_=xkv_, mask=mask):
            mha = _course_mha(spec)
            with _no_module_forward():
                return impl.mha_forward_sdpa(mha, xq_, xkv_, mask)

        t.compare(run, expected, f"mha_forward_sdpa vs mha.forward: {what}", atol=1e-5)

    # backpropagation through mha_forward_sdpa reaches the module's projections and the inputs
    spec_g = _spec(ref_c)

    def sdpa_module(impl, spec=spec_g):
        mha = _course_mha(spec)

        class Call(nn.Module):
            def __init__(self):
                super().__init__()
                self.mha = mha

            def forward(self, xq_, mask_):
                with _no_module_forward():
                    return impl.mha_forward_sdpa(self.mha, xq_, None, mask_)

        return Call()

    check_module_gradients(t, module_gradient_probe(sdpa_module, [x, keep]), "mha_forward_sdpa on a causal module with a "
                    "key-padding mask")

    # the attention must come from F.scaled_dot_product_attention, called with attn_mask only: its output
    # carries a mark here, and a different one for is_causal=True. Square causal self-attention without a
    # user mask is the case where the module's own fast path passes is_causal=True.
    spec_c = _spec(ref_c)

    def marked(impl):
        mha = _course_mha(spec_c)
        with _no_module_forward(), _marked_sdpa(impl.mha_forward_sdpa):
            return impl.mha_forward_sdpa(mha, x)

    reference = _ref()["mha_forward_sdpa"]
    with _marked_sdpa(reference):
        expected = reference(ref_c, x)
    with _marked_sdpa(reference, spy=_sdpa_marked_as_causal):  # what is_causal=True (the module's fast path) gives
        as_causal = reference(ref_c, x)
    got = t.run(marked)

    def close(a, b):
        return isinstance(a, torch.Tensor) and a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-5, rtol=1e-5))

    if close(got, expected):
        return
    if close(got, as_causal):
        t.fail("for square causal self-attention mha_forward_sdpa calls F.scaled_dot_product_attention with "
               "is_causal=True (directly, or through the module's own forward): compute the forward yourself and "
               "pass the combined boolean mask as attn_mask, never is_causal=True", bug=DELEGATES)
    t.fail("mha_forward_sdpa must compute the attention with F.scaled_dot_product_attention (it was never called, "
           "or its output was not used)")


# ================================================================== grading strength (grader/strength.py)

from ..strength import decision, defining_property  # noqa: E402

defining_property(
    f"{U}.MultiHeadAttentionWrapper",
    "multi-head attention as num_heads independent causal heads whose outputs sit side by side: head h owns output "
    "columns h·head_dim … (h+1)·head_dim − 1 and nothing else",
    probe="perturbs head 1's W_value inside the learner's module and records which output columns move; compares "
          "with the reference under shared weights (qkv_bias both ways) and reads each head's dropped weights off "
          "a train-mode output built from one-hot tokens")
defining_property(
    f"{U}.MultiHeadAttention",
    "one projection per Q/K/V split into heads: head h attends with feature slice h of the projections, scaled by "
    "1/√head_dim, under a bottom-right causal mask AND the given mask, dropout on the weights only",
    probe="per-head loop and nn.MultiheadAttention oracles with the learner's module loaded with the same weights "
          "(square, T_q < T_k, cross-attention, causal + padding masks); future-perturbation and appended-key "
          "invariance measured on outputs; train-mode weights read off duplicated value channels; last_weights "
          "recorded in eval and train mode")
defining_property(
    f"{U}.mha_from_wrapper",
    "the split module and the list of heads are the same function: head h of the fused module reads exactly the "
    "rows of the stacked projections that wrapper.heads[h] owns, and out_proj is the identity",
    probe="calls the learner's function on a course wrapper rebuilt in the worker (three shapes, qkv_bias both "
          "ways), returns the fused module's weights, causal buffer and its output on a fresh batch, compared "
          "with the wrapper's output")
defining_property(
    f"{U}.to_torch_mha",
    "PyTorch's nn.MultiheadAttention is the course module with packed in_proj rows and the opposite mask polarity, "
    "in train mode as in eval mode",
    probe="runs the returned nn.MultiheadAttention on shared inputs with the converted masks (eval: outputs and "
          "averaged weights vs the course module; train: per-head weights judged as dropped weights with p=0.5)")
defining_property(
    f"{U}.mha_forward_sdpa",
    "the fused kernel computes the same attention only when given the combined bottom-right boolean mask, never "
    "is_causal, and with no dropout in eval mode",
    probe="the module's own forward is disabled and F.scaled_dot_product_attention marks its output while the "
          "learner's function runs; outputs compared with mha.forward on five mask/shape cases; two eval-mode calls "
          "of a p=0.5 module must agree")

decision(f"{U}.mha_from_wrapper", "how the heads' projection weights are assembled into one (d_out, d_in) matrix",
         forms=[r"row-?wise", r"cat\([^)]*\bdim\s*=\s*0\)\s*(for|#)[^\n]{0,40}head"],
         wrong=("B04.from_wrapper_interleaved",))
decision(f"{U}.MultiHeadAttention", "which block of the stored causal mask a module with T_q < T_k queries uses",
         forms=[r"t_k\s*-\s*t_q\s*:\s*t_k", r"diagonal\s*=\s*t_k\s*-\s*t_q", r"causal_mask\[\s*:\s*t_q"],
         wrong=("B04.causal_top_left",))
