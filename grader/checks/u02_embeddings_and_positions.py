"""Checks of unit 02 (embeddings and positions).

Oracles: ``torch.nn.functional.embedding`` for the lookups, a float64 formula written here for the
sinusoidal table (independent of the reference), the angle-addition identity for the rotation ``M_k``,
and the syllabus's fixtures F02.1–F02.4. Structure checks cover ``state_dict`` keys, buffers vs
parameters and ``.to(torch.float64)``. Dropout is checked by its form (every output entry is 0 or
``(x + pe)/(1−p)``) and its zero fraction, never by its mask.

Tolerances: fixtures printed to 4 decimals use ``atol 1e-4``. The syllabus asks for ``atol 1e-6`` against
the float64 formula for ``max_len ≤ 64, D = 512``; a correct float32 computation is already 3.8e-6 away at
position 63 (the argument ``p·ω`` is rounded), so the check uses ``1e-6`` for ``max_len = 8`` and ``1e-5``
for ``max_len = 64`` (and ``5e-4`` for ``max_len = 2048``, as specified).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..core import CheckFailure, LearnerError, check, forbid, module_facts, unwrap
from ..runner import also_blocked
from ..strength import decision, defining_property

U = "02"
T = torch.tensor


def _ref():
    from llmcourse.nn import embeddings as E
    from llmcourse.nn import positions as P

    return {
        "embedding_lookup": E.embedding_lookup, "one_hot_matmul": E.one_hot_matmul,
        "InputEmbeddings": E.InputEmbeddings, "sinusoidal_pe": P.sinusoidal_pe,
        "PositionalEncoding": P.PositionalEncoding, "shift_matrix": P.shift_matrix, "GPTEmbedding": E.GPTEmbedding,
    }


# F02.1: torch.manual_seed(123); nn.Embedding(5, 3).weight (= torch.manual_seed(123); torch.randn(5, 3))
F021_W = T([[-0.1115, 0.1204, -0.3696], [-0.2404, -1.1969, 0.2093], [-0.9724, -0.7550, 0.3239],
            [-0.1085, 0.2103, -0.3908], [0.2350, 0.6653, 0.3528]])
# F02.2: sinusoidal_pe(4, 4)
F022 = T([[0.0, 1.0, 0.0, 1.0], [0.8415, 0.5403, 0.0100, 0.99995], [0.9093, -0.4161, 0.0200, 0.9998],
          [0.1411, -0.9900, 0.0300, 0.99955]])
# F02.3: sinusoidal_pe(6, 16)[1]
F023 = T([0.8415, 0.5403, 0.3110, 0.9504, 0.0998, 0.9950, 0.0316, 0.9995, 0.0100, 0.99995, 0.0032, 1.0000,
          0.0010, 1.0000, 0.0003, 1.0000])


def pe_float64(max_len: int, d_model: int) -> torch.Tensor:
    """The oracle: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D)), in float64."""
    p = torch.arange(max_len, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)[None, :]
    angles = p / torch.pow(10000.0, two_i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe


def rotation64(k: float, omega: float) -> torch.Tensor:
    c, s = math.cos(omega * k), math.sin(omega * k)
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _ids(high, *shape, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))




def _tensor(t, value, what: str) -> torch.Tensor:
    t.expect(isinstance(value, torch.Tensor), f"{what} must return a torch.Tensor, got {type(value).__name__}")
    return value


def _state(module) -> dict:
    return {k: v.clone() for k, v in unwrap(module).state_dict().items()}


def _loaded(name, state, *args, **kwargs):
    """Probe factory: build ``impl.<name>(*args)``, load ``state`` into it, return the module."""
    def make(impl):
        m = getattr(impl, name)(*args, **kwargs)
        unwrap(m).load_state_dict(state)
        return m
    return make


def _dropout_form(out: torch.Tensor, clean: torch.Tensor, p: float) -> bool:
    """Every entry is 0 or clean/(1−p) (inverted dropout applied to ``clean``)."""
    zero = out.abs() <= 1e-6
    kept = (out - clean / (1 - p)).abs() <= 1e-5 + 1e-5 * clean.abs()
    return bool((zero | kept).all())


# ================================================================== 02.embedding_lookup


def _no_builtin_embedding():
    return forbid((F, "embedding"), (torch, "embedding"),
                  reason="select the rows by indexing (embedding_lookup) or multiply by one-hot vectors "
                         "(one_hot_matmul).")


@check(f"{U}.embedding_lookup", ["embedding_lookup", "one_hot_matmul"], _ref)
def check_embedding_lookup(t):
    def call(fname, ids, weight):
        def probe(impl):
            with _no_builtin_embedding():
                return getattr(impl, fname)(ids, weight)
        return probe

    w11 = _rand(11, 6, seed=1)
    cases = [
        ("ids of shape (7,) with repeats", _ids(11, 7, seed=2), w11),
        ("ids of shape (2, 3)", _ids(11, 2, 3, seed=3), w11),
        ("ids of shape (2, 3, 4)", _ids(11, 2, 3, 4, seed=4), w11),
        ("a float64 table (5, 4) (the dtype must be kept)", _ids(5, 3, 2, seed=5), _rand(5, 4, seed=6).double()),
    ]
    for fname in ("embedding_lookup", "one_hot_matmul"):
        ids01 = T([0, 1])
        out = _tensor(t, t.run(call(fname, ids01, F021_W)), fname)
        t.expect(tuple(out.shape) == (2, 3),
                 f"{fname}(ids=[0, 1], weight (5, 3)) must have shape (2, 3) (ids.shape + (D,)); got {tuple(out.shape)}")
        t.compare(call(fname, ids01, F021_W), F021_W[:2], f"{fname}(ids=[0, 1], the 5×3 worked-example table): rows 0 and 1",
                  atol=1e-6)
        for what, ids, w in cases:
            expected = F.embedding(ids, w)
            got = t.compare(call(fname, ids, w), expected, f"{fname} with {what} vs F.embedding", atol=1e-6)
            t.expect(got.dtype == w.dtype, f"{fname} must return the table's dtype ({w.dtype}); got {got.dtype}")

        # gradient sparsity: d(sum of outputs)/dW[r] = count(r) · ones(D); unused rows get 0
        ids = T([[1, 4, 4], [7, 1, 4]])

        def grad_probe(impl, fname=fname, ids=ids):
            w = w11.clone().requires_grad_(True)
            with _no_builtin_embedding():
                out = getattr(impl, fname)(ids, w)
            try:
                out.sum().backward()
            except RuntimeError:  # nothing of the output depends on w through the graph
                return None
            return w.grad

        grad = t.run(grad_probe)
        t.expect(grad is not None, f"no gradient reached the weight through {fname}: do not detach it or use .data")
        counts = torch.bincount(ids.flatten(), minlength=11).float()
        expected = counts[:, None].expand(11, 6)
        t.compare(grad_probe, expected, f"{fname}: for loss = out.sum() with ids {ids.tolist()}, weight.grad[r] must "
                  "be count(r)·ones(D) (rows 1 and 4 used twice and three times, unused rows 0)", atol=1e-6)


# ================================================================== 02.InputEmbeddings


@check(f"{U}.InputEmbeddings", ["InputEmbeddings"], _ref)
def check_input_embeddings(t):
    facts = t.run(lambda impl: module_facts(impl.InputEmbeddings(5, 3)))
    t.expect(facts["is_module"], "InputEmbeddings must be an nn.Module subclass")
    shapes = facts["state_dict"]
    t.expect(shapes == {"embedding.weight": (5, 3)},
             f"InputEmbeddings(5, 3).state_dict() must hold exactly embedding.weight of shape (5, 3) "
             f"(self.embedding = nn.Embedding(vocab_size, d_model)); got {shapes}")

    state = {"embedding.weight": F021_W.clone()}

    def f021(impl):
        mm = _loaded("InputEmbeddings", state, 5, 3)(impl)
        return mm(T([0, 1]))

    out = _tensor(t, t.run(f021), "InputEmbeddings.forward")
    t.expect(out.dtype == torch.float32, f"the output must stay float32 (the parameter's dtype); got {out.dtype}")
    t.compare(f021, F021_W[:2] * math.sqrt(3), "InputEmbeddings(5, 3) with the 5×3 worked-example table, ids [0, 1]: rows 0 "
              "and 1 times √3", atol=1e-4)

    torch.manual_seed(0)
    ref = _ref()["InputEmbeddings"](50, 16)
    st = _state(ref)
    ids = _ids(50, 2, 7, seed=8)
    expected = ref(ids).detach()
    got = t.compare(lambda impl: _loaded("InputEmbeddings", st, 50, 16)(impl)(ids), expected,
                    "InputEmbeddings(50, 16) on ids of shape (2, 7) (shared weights)", atol=1e-5)
    t.expect(got.dtype == torch.float32, f"the output must be float32; got {got.dtype}")
    ids3 = _ids(50, 2, 3, 4, seed=9)
    t.compare(lambda impl: _loaded("InputEmbeddings", st, 50, 16)(impl)(ids3), ref(ids3).detach(),
              "InputEmbeddings(50, 16) on ids of shape (2, 3, 4)", atol=1e-5)

    # every row of the table is trained: for loss = out.sum(), row r's gradient is count(r)·√d_model·ones(D)
    ids_g = T([[0, 3, 3], [1, 0, 4]])

    def grad_rows(impl):
        mm = _loaded("InputEmbeddings", state, 5, 3)(impl)
        unwrap(mm).train()
        out = mm(ids_g)
        if not (isinstance(out, torch.Tensor) and out.requires_grad):
            return None  # detached from the table: nothing trains it
        out.sum().backward()
        return unwrap(mm).embedding.weight.grad

    counts = torch.bincount(ids_g.flatten(), minlength=5).float()
    t.compare(grad_rows, (counts * math.sqrt(3))[:, None].expand(5, 3),
              f"InputEmbeddings(5, 3) with ids {ids_g.tolist()} and loss = out.sum(): embedding.weight.grad[r] must be "
              "count(r)·√3 for every row (ids 0 and 3 appear twice, 2 never)", atol=1e-5)


# ================================================================== 02.sinusoidal_pe


@check(f"{U}.sinusoidal_pe", ["sinusoidal_pe"], _ref)
def check_sinusoidal_pe(t):
    out = _tensor(t, t.run(lambda impl: impl.sinusoidal_pe(4, 4)), "sinusoidal_pe")
    t.expect(tuple(out.shape) == (4, 4), f"sinusoidal_pe(4, 4) must have shape (max_len, d_model) = (4, 4); "
             f"got {tuple(out.shape)}")
    t.expect(out.dtype == torch.float32, f"sinusoidal_pe must return float32; got {out.dtype}")

    # detectors first: values are sines and cosines; the last pair is the slowest
    big = t.run(lambda impl: impl.sinusoidal_pe(64, 64))
    t.expect(tuple(big.shape) == (64, 64), f"sinusoidal_pe(64, 64) has shape {tuple(big.shape)}")
    t.expect(bool(big.abs().max() <= 1 + 1e-5),
             f"every entry must be a sine or cosine in [−1, 1]; the largest magnitude is {big.abs().max().item():.4g}")
    moved = (big[:11, -2:].double() - big[0, -2:].double()).abs().max().item()
    t.expect(moved < 0.05,
             f"the last pair (dims 62, 63 for D=64) must be the slowest: its frequency 10000^(−62/64) ≈ 1.3e-4 "
             f"barely moves it over positions 0–10, but yours changes by {moved:.3f}; your frequencies grow with "
             f"the pair index instead of shrinking", bug="B02.positive_exponent")

    t.compare(lambda impl: impl.sinusoidal_pe(4, 4), F022, "sinusoidal_pe(4, 4) (inverse frequencies [1, 0.01])",
              atol=1e-4)
    t.compare(lambda impl: impl.sinusoidal_pe(6, 16), F023, "sinusoidal_pe(6, 16)[1]", atol=1e-4,
              pick=lambda o: o[1])
    for max_len, d_model, atol in [(8, 512, 1e-6), (10, 6, 1e-6), (64, 512, 1e-5), (2048, 512, 5e-4)]:
        expected = pe_float64(max_len, d_model)
        got = t.compare(lambda impl, a=max_len, b=d_model: impl.sinusoidal_pe(a, b), expected,
                        f"sinusoidal_pe({max_len}, {d_model}) vs the float64 formula", atol=atol, rtol=0)
        t.expect(got.dtype == torch.float32, f"sinusoidal_pe({max_len}, {d_model}) must be float32; got {got.dtype}")

    # F02.4: M_k(ω_i) · PE[p, 2i:2i+2] = PE[p+k, 2i:2i+2] for 20 random (p, k, i) at D=512
    table = t.run(lambda impl: impl.sinusoidal_pe(400, 512)).double()
    g = torch.Generator().manual_seed(24)
    for _ in range(20):
        p = int(torch.randint(0, 200, (1,), generator=g))
        k = int(torch.randint(1, 200, (1,), generator=g))
        i = int(torch.randint(0, 256, (1,), generator=g))
        omega = 10000.0 ** (-2 * i / 512)
        rotated = rotation64(k, omega) @ table[p, 2 * i:2 * i + 2]
        err = (rotated - table[p + k, 2 * i:2 * i + 2]).abs().max().item()
        t.expect(err <= 1e-4, f"shift property fails for p={p}, k={k}, pair i={i}: M_k·PE[p, 2i:2i+2] differs "
                 f"from PE[p+k, 2i:2i+2] by {err:.3g} (dims 2i and 2i+1 must hold sin and cos of the same angle)")

    got = t.raised(lambda impl: impl.sinusoidal_pe(4, 5))
    t.expect(got == "ValueError", f"sinusoidal_pe(4, 5) (odd d_model) must raise ValueError; got {got}")


# ================================================================== 02.PositionalEncoding


@check(f"{U}.PositionalEncoding", ["PositionalEncoding"], _ref)
def check_positional_encoding(t):
    d, max_len = 16, 10
    ref_pe = pe_float64(max_len, d).float().unsqueeze(0)
    def structure(impl):
        mm = impl.PositionalEncoding(d, max_len, dropout=0.0)
        facts = module_facts(mm)
        if facts["is_module"]:
            pe = getattr(unwrap(mm), "pe", None)
            facts["pe"] = (pe.dtype, tuple(pe.shape)) if isinstance(pe, torch.Tensor) else None
            unwrap(mm).to(torch.float64)
            pe64 = getattr(unwrap(mm), "pe", None)
            facts["pe_after_to_float64"] = pe64.dtype if isinstance(pe64, torch.Tensor) else None
        return facts

    facts = t.run(structure)
    t.expect(facts["is_module"], "PositionalEncoding must be an nn.Module subclass")
    params = facts["parameters"]
    t.expect(not params, f"PositionalEncoding must have no parameters, but parameters() holds {params}: the fixed "
             "table would be trained and saved", bug="B02.pe_parameter")
    pe = facts["pe"]
    t.expect(pe is not None, "store the table as self.pe (a buffer of shape (1, max_len, d_model))")
    t.expect(tuple(pe[1]) == (1, max_len, d) and pe[0] == torch.float32,
             f"self.pe must be float32 of shape (1, max_len, d_model) = (1, {max_len}, {d}); got {pe[0]} "
             f"{tuple(pe[1])}")
    t.expect(facts["pe_after_to_float64"] in (None, torch.float64),
             "after module.to(torch.float64) self.pe is still float32: a plain tensor attribute does not follow the "
             "module", bug="B02.pe_attribute")
    t.expect("pe" in facts["buffers"], "self.pe is not among the module's buffers (named_buffers()): the module "
             "does not know it holds the table")
    keys = list(facts["state_dict"])
    t.expect(not keys, f"state_dict() must be empty: the table is recomputed from max_len and d_model, so a checkpoint "
             f"does not carry it; got the keys {keys}", bug="B02.pe_persistent" if keys == ["pe"] else None)

    t.compare(lambda impl: unwrap(impl.PositionalEncoding(d, max_len, dropout=0.0)).pe, ref_pe,
              f"the pe buffer of PositionalEncoding({d}, {max_len}) vs the sinusoidal table", atol=1e-5)

    # eval mode: x + pe[:, :T], for T < max_len and T = max_len
    x = _rand(3, 7, d, seed=3)

    def eval_out(length):
        def probe(impl):
            mm = impl.PositionalEncoding(d, max_len, dropout=0.1)
            unwrap(mm).eval()
            return mm(x[:, :length] if length <= 7 else _rand(3, length, d, seed=4))
        return probe

    try:
        t.run(eval_out(7))
    except CheckFailure as short_failed:
        try:
            t.run(eval_out(max_len))
        except CheckFailure:
            raise short_failed from None
        t.fail(f"a (3, 7, {d}) input (T=7 < max_len={max_len}) fails while T = max_len works: {short_failed.message}",
               bug="B02.pe_not_sliced")
    t.compare(eval_out(7), x + ref_pe[:, :7], f"in eval mode, PositionalEncoding({d}, {max_len}) on x (3, 7, {d}) must "
              "return x + pe[:, :7]", atol=1e-5)
    x10 = _rand(3, max_len, d, seed=4)
    t.compare(eval_out(max_len), x10 + ref_pe, f"eval mode with T = max_len = {max_len}", atol=1e-5)

    # the module sits inside a model: the gradient of the output reaches x unchanged (eval mode: d(x + pe)/dx = 1)
    def x_gradient(impl):
        mm = impl.PositionalEncoding(d, max_len, dropout=0.1)
        unwrap(mm).eval()
        xg = x.clone().requires_grad_(True)
        out = mm(xg)
        if not (isinstance(out, torch.Tensor) and out.requires_grad):
            return None
        out.sum().backward()
        return xg.grad

    t.compare(x_gradient, torch.ones_like(x), "in eval mode, the gradient of PositionalEncoding(x).sum() with respect "
              "to x (no gradient means the output was detached from x)", atol=1e-6)

    # train mode, p = 0.5: dropout acts on the sum
    def train_out(inp, seed, p=0.5):
        def probe(impl):
            mm = impl.PositionalEncoding(d, max_len, dropout=p)
            unwrap(mm).train()
            torch.manual_seed(seed)
            return mm(inp)
        return probe

    zeros = torch.zeros(4, max_len, d)
    out0 = t.run(train_out(zeros, 1))
    t.expect(_dropout_form(out0, ref_pe.expand(4, max_len, d), 0.5),
             "in train mode with dropout=0.5 and x = 0, every output entry must be 0 or 2·pe")
    xs = 2.0 + 0.1 * _rand(4, max_len, d, seed=5)
    clean = xs + ref_pe
    out1 = t.run(train_out(xs, 2))
    if not _dropout_form(out1, clean, 0.5):
        only_pe = ((out1 - xs).abs() <= 1e-5) | ((out1 - xs - 2 * ref_pe).abs() <= 1e-5)
        t.expect(not bool(only_pe.all()),
                 "in train mode with dropout=0.5 every output entry is x or x + 2·pe: dropout acts on the positional "
                 "encoding only, but it must act on the sum x + pe", bug="B02.pe_dropout_only")
        t.fail("in train mode with dropout=0.5 every output entry must be 0 or 2·(x + pe) (inverted dropout on the sum)")
    frac = (out1 == 0).float().mean().item()
    t.expect(0.35 < frac < 0.65, f"with dropout=0.5 in train mode about half of the entries must be zeroed; got "
             f"{frac:.2f} (is the dropout module built with the `dropout` argument and applied in forward?)")
    big = 2.0 + torch.zeros(64, max_len, d)

    def default_p(impl):
        mm = impl.PositionalEncoding(d, max_len)
        unwrap(mm).train()
        torch.manual_seed(3)
        return mm(big)

    frac = (t.run(default_p) == 0).float().mean().item()
    t.expect(0.06 < frac < 0.14, f"the default dropout must be 0.1: in train mode {frac:.3f} of the entries were zeroed")

    # .to(float64) carries the table; T > max_len raises
    def as64(impl):
        mm = impl.PositionalEncoding(d, max_len, dropout=0.0)
        unwrap(mm).to(torch.float64).eval()
        return mm(x.double())

    got = t.run(as64)
    t.expect(got.dtype == torch.float64, f"after .to(torch.float64) a float64 input must give float64; got {got.dtype}")
    t.expect(bool(torch.allclose(got, x.double() + pe_float64(7, d)[None], atol=1e-6)),
             "after .to(torch.float64) the output must be x + pe in float64")
    got = t.raised(lambda impl: impl.PositionalEncoding(d, max_len, dropout=0.0)(_rand(1, max_len + 1, d, seed=6)))
    t.expect(got == "ValueError", f"an input longer than max_len (T={max_len + 1} > {max_len}) must raise ValueError; "
             f"got {got}")


# ================================================================== 02.shift_matrix


@check(f"{U}.shift_matrix", ["shift_matrix"], _ref)
def check_shift_matrix(t):
    out = _tensor(t, t.run(lambda impl: impl.shift_matrix(1.0, 1.0)), "shift_matrix")
    t.expect(tuple(out.shape) == (2, 2), f"shift_matrix must return a (2, 2) tensor; got {tuple(out.shape)}")
    t.compare(lambda impl: impl.shift_matrix(1.0, 1.0).double(), rotation64(1.0, 1.0),
              "shift_matrix(k=1, omega=1) = [[cos 1, sin 1], [−sin 1, cos 1]]", atol=1e-6)
    t.compare(lambda impl: impl.shift_matrix(5, 0.01).double(), rotation64(5, 0.01),
              "shift_matrix(k=5, omega=0.01) (an int offset)", atol=1e-6)

    g = torch.Generator().manual_seed(7)
    for _ in range(20):
        omega = 10000.0 ** (-float(torch.rand(1, generator=g)))
        k = float(torch.randint(-30, 31, (1,), generator=g)) + (0.5 if torch.rand(1, generator=g) < 0.3 else 0.0)
        m = t.run(lambda impl, k=k, omega=omega: impl.shift_matrix(k, omega)).double()
        t.expect(bool(torch.allclose(m @ m.T, torch.eye(2, dtype=torch.float64), atol=1e-5)),
                 f"shift_matrix({k}, {omega:.4g}) must be orthogonal (M Mᵀ = I); got M Mᵀ = {(m @ m.T).tolist()}")
        t.expect(abs(torch.linalg.det(m).item() - 1) < 1e-5, f"shift_matrix({k}, {omega:.4g}) must be a rotation "
                 f"(determinant +1); got {torch.linalg.det(m).item():.4f}")
        for p in (0.0, 3.0, 17.0, 250.0):  # the same matrix serves every position
            v = torch.tensor([math.sin(omega * p), math.cos(omega * p)], dtype=torch.float64)
            w = torch.tensor([math.sin(omega * (p + k)), math.cos(omega * (p + k))], dtype=torch.float64)
            if not torch.allclose(m @ v, w, atol=1e-5):
                bug_id = t.diagnose(lambda impl, k=k, omega=omega: impl.shift_matrix(k, omega).double(), m)
                t.fail(f"shift_matrix(k={k}, omega={omega:.4g}) @ [sin ωp, cos ωp] must be [sin ω(p+k), cos ω(p+k)]; "
                       f"for p={p:g} got {[round(z, 5) for z in (m @ v).tolist()]}, expected "
                       f"{[round(z, 5) for z in w.tolist()]}", bug=bug_id)


# ================================================================== 02.GPTEmbedding


@check(f"{U}.GPTEmbedding", ["GPTEmbedding"], _ref)
def check_gpt_embedding(t):
    V, C, D = 50, 8, 12
    facts = t.run(lambda impl: module_facts(impl.GPTEmbedding(V, C, D)))
    t.expect(facts["is_module"], "GPTEmbedding must be an nn.Module subclass")
    shapes = facts["state_dict"]
    want = {"tok_emb.weight": (V, D), "pos_emb.weight": (C, D)}
    t.expect(shapes == want, f"GPTEmbedding({V}, {C}, {D}).state_dict() must be {want}; got {shapes}")

    torch.manual_seed(0)
    ref = _ref()["GPTEmbedding"](V, C, D).eval()
    st = _state(ref)

    def forward(idx, state=st, dropout=None, train=False):
        def probe(impl):
            kwargs = {} if dropout is None else {"dropout": dropout}
            mm = _loaded("GPTEmbedding", state, V, C, D, **kwargs)(impl)
            unwrap(mm).train(train)
            return mm(idx)
        return probe

    # positions start at 0: with a zero token table the output at position t is pos_emb.weight[t]
    zero_tok = {"tok_emb.weight": torch.zeros(V, D), "pos_emb.weight": st["pos_emb.weight"]}
    idx = _ids(V, 2, 5, seed=1)
    out = _tensor(t, t.run(forward(idx, zero_tok)), "GPTEmbedding.forward")
    t.expect(tuple(out.shape) == (2, 5, D), f"idx (2, 5) must give (2, 5, {D}); got {tuple(out.shape)}")
    t.expect(out.dtype == torch.float32, f"the output must be float32; got {out.dtype}")
    t.compare(forward(idx, zero_tok), st["pos_emb.weight"][:5].expand(2, 5, D),
              "with an all-zero token table the output at position t must be pos_emb.weight[t] (positions 0 … T−1)",
              atol=1e-6)

    for what, idx in [("idx (3, 5), T < context_length", _ids(V, 3, 5, seed=2)),
                      ("idx (1, 1)", _ids(V, 1, 1, seed=3)),
                      (f"idx (2, {C}), T = context_length", _ids(V, 2, C, seed=4))]:
        t.compare(forward(idx), ref(idx).detach(), f"GPTEmbedding({V}, {C}, {D}) on {what} (shared weights, eval)",
                  atol=1e-6)
    same = _ids(V, 1, 6, seed=5).expand(3, 6)
    out = t.run(forward(same))
    t.expect(bool(torch.allclose(out[0], out[1]) and torch.allclose(out[0], out[2])),
             "identical rows of idx must give identical outputs (the position rows broadcast over the batch)")

    # dropout on the sum; default dropout 0.0
    pos_state = {"tok_emb.weight": 1.0 + _rand(V, D, seed=6).abs(), "pos_emb.weight": 1.0 + _rand(C, D, seed=7).abs()}
    idx = _ids(V, 4, C, seed=8)
    clean = pos_state["tok_emb.weight"][idx] + pos_state["pos_emb.weight"]

    def dropped(impl):
        torch.manual_seed(11)
        return forward(idx, pos_state, dropout=0.5, train=True)(impl)

    out = t.run(dropped)
    t.expect(_dropout_form(out, clean, 0.5),
             "in train mode with dropout=0.5 every output entry must be 0 or 2·(tok_emb + pos_emb) (dropout on the sum)")
    frac = (out == 0).float().mean().item()
    t.expect(0.35 < frac < 0.65, f"with dropout=0.5 in train mode about half of the entries must be zeroed; got {frac:.2f}")
    t.compare(forward(idx, pos_state, train=True), clean,
              "with the default dropout (0.0) train mode must give tok_emb(idx) + pos_emb(positions)", atol=1e-5)

    # both tables train: for loss = out.sum(), tok_emb.weight.grad[r] = count(r) and pos_emb.weight.grad[t] = B
    idx_g = _ids(V, 3, 5, seed=10)

    def table_grads(impl):
        mm = _loaded("GPTEmbedding", st, V, C, D)(impl)
        unwrap(mm).train()
        out = mm(idx_g)
        if not (isinstance(out, torch.Tensor) and out.requires_grad):
            return None
        out.sum().backward()
        mod = unwrap(mm)
        return mod.tok_emb.weight.grad, mod.pos_emb.weight.grad

    counts = torch.bincount(idx_g.flatten(), minlength=V).float()[:, None].expand(V, D)
    per_position = torch.cat([torch.full((5, D), 3.0), torch.zeros(C - 5, D)])
    t.compare(table_grads, (counts, per_position), "gradients of GPTEmbedding(idx (3, 5)).sum(): tok_emb.weight.grad[r] "
              "= count of id r, pos_emb.weight.grad[t] = 3 for t < 5 (no gradient means the output was detached)",
              atol=1e-5)

    # the positions are made where idx lives: module and idx moved to the 'meta' device (it exists on every
    # machine); a forward pre-hook on pos_emb records the device of the position ids it receives
    def meta_positions(impl):
        mm = impl.GPTEmbedding(V, C, D)
        mod = unwrap(mm)
        pos = getattr(mod, "pos_emb", None)
        seen = []
        if isinstance(pos, torch.nn.Module):
            pos.register_forward_pre_hook(lambda m, args: seen.append(
                args[0].device.type if args and isinstance(args[0], torch.Tensor) else None))
        mod.to("meta")
        mod.eval()
        try:
            out = mm(torch.zeros(2, 5, dtype=torch.long, device="meta"))
        except LearnerError:  # code that cannot run on 'meta' at all is not penalised here
            return None
        return {"seen": seen, "out": out.device.type if isinstance(out, torch.Tensor) else None}

    meta = t.run(meta_positions)
    if meta is not None:
        where = sorted({d for d in meta["seen"] if d is not None and d != "meta"})
        t.expect(not where, f"GPTEmbedding moved to the 'meta' device and called with idx on 'meta' looked up position "
                 f"ids that live on {', '.join(where)}: on a GPU the same code fails (or copies every step)",
                 bug="B02.positions_default_device")

    got = t.raised(lambda impl: impl.GPTEmbedding(V, C, D)(_ids(V, 1, C + 1, seed=9)))
    t.expect(got == "ValueError", f"a sequence longer than context_length (T={C + 1} > {C}) must raise ValueError; "
             f"got {got}")


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# sinusoidal_pe: the widgets' float64 table, and the frequencies the table is built from
also_blocked(f"{U}.sinusoidal_pe",
             "llmcourse.viz.positions:sinusoidal_pe_float64",
             "llmcourse.nn.positions:inverse_frequencies")


# ================================================================== the grader's strength, declared (grader/strength.py)
defining_property(
    f"{U}.embedding_lookup",
    "an embedding lookup is row selection, equal to a one-hot matrix product, keeping the table's dtype and sending "
    "gradient count(r) to row r",
    probe="both functions against F.embedding (blocked for the learner) on 1-D to 3-D ids and a float64 table; "
          "weight.grad compared with the id counts")
defining_property(
    f"{U}.InputEmbeddings",
    "a token's vector is its trainable table row times sqrt(d_model)",
    probe="the worked example and shared random weights; the gradient of every row for loss = out.sum()")
defining_property(
    f"{U}.sinusoidal_pe",
    "PE[p, 2i] = sin(p w_i) and PE[p, 2i+1] = cos(p w_i) with one frequency w_i = 10000^(-2i/D) per pair",
    probe="against an exact float64 formula; each pair on the unit circle; the slowest pair's movement; dtype; odd D")
defining_property(
    f"{U}.PositionalEncoding",
    "a fixed table, neither trained nor saved, that follows the module's device and dtype, added to x with dropout on "
    "the sum",
    probe="parameters and state_dict read; self.pe's dtype after .to(float64); eval outputs against x + pe[:, :T]; "
          "train-mode entries 0 or (x + pe)/(1 - p) with p read from the argument")
defining_property(
    f"{U}.shift_matrix",
    "moving k positions is one rotation by w*k, the same for every position p",
    probe="M_k applied to (sin wp, cos wp) for many p and compared with position p + k; orthogonality")
defining_property(
    f"{U}.GPTEmbedding",
    "the input is a learned token row plus the learned row of positions 0..T-1, made where idx lives, with dropout on "
    "the sum",
    probe="a zero token table exposes the position rows; shared weights; train-mode dropout form; module and idx on the "
          "'meta' device with a hook on pos_emb recording the device of the position ids")

decision(f"{U}.PositionalEncoding",
         "how the table is held so that it follows .to() yet is neither a parameter nor saved in the state_dict",
         forms=[r"persistent\s*=\s*False", r"register_buffer\(\s*[\"']pe"],
         wrong=("B02.pe_parameter", "B02.pe_attribute", "B02.pe_persistent"))
decision(f"{U}.GPTEmbedding",
         "where the position ids are created",
         forms=[r"arange\([^)]*device\s*=\s*idx\.device", r"on `?idx`?'s device", r"device\s*=\s*idx\.device"],
         wrong=("B02.positions_default_device",))
