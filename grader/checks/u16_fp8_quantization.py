"""Checks of unit 16 (FP8 quantisation simulated on a CPU).

Independent routes: ``torch.finfo`` and the 256 bit patterns of ``torch.float8_e4m3fn`` / ``float8_e5m2``
(``fp8_info``); the per-element formula ``x̂ = q·s`` in float64 with tiles and blocks expanded by
``repeat_interleave`` (the dequantised product the block-scaled GEMM must equal); the plain float32 ``x @ w.T``
and ``nn.Linear`` (error levels of F16.3 and the FP8Linear accuracy bound); unit 11's ``Llama3Model`` and unit 10's
validation batches (the loss delta of the converted character Llama, ``assets/llama_char_tiny.pt``). Payloads are
compared bit for bit (``q.view(torch.uint8)``). Converted-model structure (module types, buffer dtypes) shapes
feedback; the tie is re-derived from returned tensors (the embedding is changed inside the probe and the head read
back).

Contract clauses and the probes that cover them (every argument is probed at a non-default value once):

* ``16.fp8_info``: every field of both FP8 dtypes against the bit patterns; other dtypes raise.
* ``16.quantize_blockwise``: scales (formula, per 1×128 tile / 128×128 block, partial and all-zero tiles), payload bit
  patterns, dequantisation, the round-trip bound; ``tile=64`` / ``block=64``; inputs left unchanged (side effect).
* ``16.fp8_blockwise_matmul``: the per-chunk product with partial chunks; ``chunk=64``; ``acc_bits`` (every chunk's
  raw partial product rounded on its own before the scales: the per-chunk structure); error level vs float32.
* ``16.FP8Linear``: buffers/parameter layout, ``bias=False``, ``from_linear`` payload, forward against the
  reference, ``block=64``; a forward in eval and train mode leaves the state unchanged (side effect).
* ``16.convert_linears_to_fp8``: in place, default ``skip``, custom ``skip``, ``skip=()``, tied heads never
  converted (re-derived from returned logits), MoE experts converted and routers kept, the trained model's loss.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from ..core import InstanceGuard, check, module_facts, run_learner, unwrap

U = "16"
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
F161 = {E4: {"exponent_bits": 4, "mantissa_bits": 3, "bias": 7}, E5: {"exponent_bits": 5, "mantissa_bits": 2,
                                                                      "bias": 15}}
# validation-loss increase of the reference conversion of assets/llama_char_tiny.pt on the check's batches
# (unit 10's estimate_loss: 4 batches of 8 × 128 characters, seeds 0..3); re-computed by tests/test_unit16_checks.py
REF_DELTA = 0.003992
LOSS_BATCHES, LOSS_BATCH, LOSS_T = 4, 8, 128


def _ref_info():
    from llmcourse.quant.fp8 import fp8_info

    return {"fp8_info": fp8_info}


def _ref_quant():
    from llmcourse.quant import fp8 as Q

    return {"quantize_act_tiles": Q.quantize_act_tiles, "quantize_weight_blocks": Q.quantize_weight_blocks,
            "dequantize_act_tiles": Q.dequantize_act_tiles, "dequantize_weight_blocks": Q.dequantize_weight_blocks}


def _ref_matmul():
    from llmcourse.quant.fp8 import fp8_blockwise_matmul

    return {"fp8_blockwise_matmul": fp8_blockwise_matmul}


def _ref_linear():
    from llmcourse.quant.fp8 import FP8Linear

    return {"FP8Linear": FP8Linear}


def _ref_convert():
    from llmcourse.quant.fp8 import convert_linears_to_fp8

    return {"convert_linears_to_fp8": convert_linears_to_fp8}


def _patterns(dtype) -> torch.Tensor:
    return torch.arange(256, dtype=torch.uint8).view(dtype).float()


_FP8_NAMES = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def _wire(x):
    """FP8 tensors do not cross the worker pipe: send their bytes (uint8) and dtype name (runs in probes)."""
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return {"fp8": str(x.dtype).replace("torch.", ""), "bits": x.detach().contiguous().view(torch.uint8).clone()}
    if isinstance(x, dict):
        return {k: _wire(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_wire(v) for v in x)
    return x


def _unwire(x):
    """Inverse of :func:`_wire`, here in the checker."""
    if isinstance(x, dict) and set(x) == {"fp8", "bits"} and x["fp8"] in _FP8_NAMES:
        return x["bits"].view(_FP8_NAMES[x["fp8"]])
    if isinstance(x, dict):
        return {k: _unwire(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_unwire(v) for v in x)
    return x


def _u8(q: torch.Tensor) -> torch.Tensor:
    """The bytes of an FP8 tensor, for capturing it in a probe (``.view(torch.float8_e4m3fn)`` inside)."""
    return q.contiguous().view(torch.uint8).clone()


def _earlier_course(impl, name):
    """``impl.<name>`` pointed at the course's quantisers, GEMM and ``FP8Linear`` (exercises 2-4) wherever the learner's
    code calls them: a later exercise is graded on the course's earlier pieces, so one mistake costs one exercise."""
    from grader.prior import use_course
    from llmcourse.quant import fp8 as q

    obj = getattr(impl, name)
    deps = {k: getattr(q, k) for k in ("quantize_act_tiles", "quantize_weight_blocks", "dequantize_act_tiles",
                                       "dequantize_weight_blocks", "fp8_blockwise_matmul")}
    if name != "FP8Linear":
        deps["FP8Linear"] = q.FP8Linear
    use_course(obj, **deps)
    return obj


def _from_linear(impl, lin):
    """``impl.FP8Linear.from_linear(lin)``; for the learner the classmethod runs guarded (Proxy has none)."""
    cls = _earlier_course(impl, "FP8Linear")
    raw = getattr(cls, "__wrapped__", None)
    if raw is None:   # the reference or a mutant
        return cls.from_linear(lin)
    return InstanceGuard(run_learner(raw.from_linear, "FP8Linear.from_linear", (lin,), {}), "FP8Linear")


# ================================================================== 16.fp8_info


@check(f"{U}.fp8_info", ["fp8_info"], _ref_info)
def check_fp8_info(t):
    for dtype in (E4, E5):
        name = str(dtype).replace("torch.", "")
        got = t.run(lambda impl, d=dtype: impl.fp8_info(d))
        t.expect(isinstance(got, dict), f"fp8_info({name}) must return a dict; got {type(got).__name__}")
        keys = {"exponent_bits", "mantissa_bits", "bias", "max", "min_normal", "min_subnormal", "eps", "has_inf"}
        t.expect(keys <= set(got), f"fp8_info({name}) misses the keys {sorted(keys - set(got))}")
        for k, v in F161[dtype].items():
            t.expect(got[k] == v, f"fp8_info({name})[{k!r}] must be {v}; got {got[k]!r}")
        fi, pats = torch.finfo(dtype), _patterns(dtype)
        positive = pats[(pats > 0) & pats.isfinite()]
        expected = {"max": fi.max, "min_normal": fi.smallest_normal, "eps": fi.eps,
                    "min_subnormal": positive.min().item()}
        for k, v in expected.items():
            try:
                ok = float(got[k]) == v
            except (TypeError, ValueError):
                ok = False
            t.expect(ok, f"fp8_info({name})[{k!r}] must be {v!r} (torch.finfo and the 256 bit patterns agree); "
                     f"got {got[k]!r}")
        has_inf = bool(pats.isinf().any())
        t.expect(bool(got["has_inf"]) == has_inf and isinstance(got["has_inf"], bool),
                 f"fp8_info({name})['has_inf'] must be the bool {has_inf}; got {got['has_inf']!r}")


# ================================================================== 16.quantize_blockwise


def _act_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(160)
    x = torch.randn(5, 200, generator=g) * torch.logspace(-2, 1, 200)
    x[2, 128:] = 0.0                                # an all-zero partial tile
    x[3, :128] *= 50.0                              # one row far larger than the others
    return x


def _weight_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(161)
    w = torch.randn(300, 200, generator=g) * 0.02
    w[128:256, 128:] *= 20.0                        # one block larger than its neighbours
    return w


def _quant_probe(fn: str, x: torch.Tensor):
    def probe(impl):
        out = getattr(impl, fn)(x.clone())
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            return {"ok": False, "type": type(out).__name__}
        q, s = out
        return {"ok": True, "q": _wire(q), "s": s}
    return probe


def _e4m3_values() -> torch.Tensor:
    p = _patterns(E4)
    return torch.unique(p[p.isfinite()]).double()


def _check_payload(t, got: dict, what: str) -> None:
    t.expect(got["ok"], f"{what} must return a pair (q, s); got {got.get('type')}")
    q, s = got["q"], got["s"]
    t.expect(isinstance(q, torch.Tensor) and isinstance(s, torch.Tensor), f"{what}: q and s must be tensors")
    if q.dtype == E5:
        t.fail(f"{what}: q is float8_e5m2; the forward quantisation stores every tensor in float8_e4m3fn",
               bug="B16.e5m2_forward")
    if q.dtype != E4:
        if q.is_floating_point():
            vals = q.detach().double().reshape(-1)
            table = _e4m3_values()
            pos = torch.searchsorted(table, vals).clamp(max=len(table) - 1)
            if not bool((table[pos] == vals).all()):
                bad = vals[table[pos] != vals][0].item()
                t.fail(f"{what}: q is {q.dtype} and holds values that no 8-bit E4M3 pattern represents (e.g. "
                       f"{bad:.6g}); clamping a wider float to ±448 does not round like FP8", bug="B16.fp16_as_fp8")
        t.fail(f"{what}: q must have dtype torch.float8_e4m3fn; got {q.dtype}")
    t.expect(s.dtype == torch.float32, f"{what}: the scales must be float32; got {s.dtype}")


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.contiguous().view(torch.uint8)


@check(f"{U}.quantize_blockwise", ["quantize_act_tiles", "quantize_weight_blocks", "dequantize_act_tiles",
                                   "dequantize_weight_blocks"], _ref_quant)
def check_quantize_blockwise(t):
    from llmcourse.quant import fp8 as Q

    # --- activations: 1 × 128 tiles along K (K = 200: a full and a partial tile; an all-zero tile)
    x = _act_input()
    qa_ref, sa_ref = Q.quantize_act_tiles(x)
    probe = _quant_probe("quantize_act_tiles", x)
    got = _unwire(t.run(probe))
    _check_payload(t, got, "quantize_act_tiles on a (5, 200) input")
    t.compare(probe, sa_ref, "activation scales s (5, 2) of a (5, 200) input: one per row and 128-wide K tile (the "
              "last tile holds 72 columns), s = max(amax, 1e-12) / 448: the tile's amax lands on E4M3's largest finite value "
              "(not 448/amax, which inverts the convention; not amax/240, the maximum of the fnuz variant; not "
              "amax/57344, E5M2's; not one scale for the whole tensor)", atol=0.0, rtol=1e-6, pick=lambda o: o["s"])
    t.compare(probe, qa_ref.float(), "activation payload q (5, 200)", atol=0.0, rtol=0.0,
              pick=lambda o: _unwire(o["q"]).float())
    t.expect(torch.equal(_bits(got["q"]), _bits(qa_ref)), "activation payload: the values match but the bit patterns "
             "do not (a signed zero?); q must be exactly clamp(x / s, −448, 448).to(torch.float8_e4m3fn)")
    for i in range(5):
        for j, (k0, k1) in enumerate(((0, 128), (128, 200))):
            amax = got["q"][i, k0:k1].float().abs().max().item()
            if x[i, k0:k1].abs().max() > 0:
                t.expect(amax == 448.0, f"row {i}, K-tile {j}: the largest |q| of a non-zero tile must be exactly 448 "
                         f"(its amax maps to the format's maximum); got {amax}")
            else:
                t.expect(amax == 0.0 and math.isfinite(got["s"][i, j].item()),
                         f"row {i}, K-tile {j} is all zeros: q must be 0 and the scale finite (amax floored at 1e-12)")

    # --- weights: 128 × 128 blocks with partial edges (N = 300, K = 200)
    w = _weight_input()
    qw_ref, sw_ref = Q.quantize_weight_blocks(w)
    wprobe = _quant_probe("quantize_weight_blocks", w)
    gotw = _unwire(t.run(wprobe))
    _check_payload(t, gotw, "quantize_weight_blocks on a (300, 200) weight")
    t.compare(wprobe, sw_ref, "weight scales s (3, 2) of a (300, 200) weight: one per 128 × 128 block (edge blocks "
              "partial)", atol=0.0, rtol=1e-6, pick=lambda o: o["s"])
    t.compare(wprobe, qw_ref.float(), "weight payload q (300, 200)", atol=0.0, rtol=0.0, pick=lambda o: _unwire(o["q"]).float())
    t.expect(torch.equal(_bits(gotw["q"]), _bits(qw_ref)), "weight payload: the values match but the bit patterns "
             "do not; q must be exactly clamp(w / s, −448, 448).to(torch.float8_e4m3fn)")

    # --- non-default tile and block (64) and no side effect on the inputs
    from llmcourse.quant import fp8 as Qr

    qa64, sa64 = Qr.quantize_act_tiles(x, 64)
    qw64, sw64 = Qr.quantize_weight_blocks(w, 64)

    def probe64(impl):
        xc, wc = x.clone(), w.clone()
        q, s_ = impl.quantize_act_tiles(xc, 64)
        qw_, sw_ = impl.quantize_weight_blocks(wc, 64)
        return {"sa": s_, "sw": sw_, "xa": impl.dequantize_act_tiles(q, s_, 64),
                "xw": impl.dequantize_weight_blocks(qw_, sw_, 64),
                "untouched": bool(torch.equal(xc, x) and torch.equal(wc, w))}

    t.compare(probe64, sa64, "activation scales with tile=64: (5, 4) for a (5, 200) input", atol=0.0, rtol=1e-6,
              pick=lambda o: o["sa"])
    t.compare(probe64, sw64, "weight scales with block=64: (5, 4) for a (300, 200) weight", atol=0.0, rtol=1e-6,
              pick=lambda o: o["sw"])
    t.compare(probe64, Qr.dequantize_act_tiles(qa64, sa64, 64), "round trip of the activations with tile=64",
              atol=0.0, rtol=1e-6, pick=lambda o: o["xa"])
    t.compare(probe64, Qr.dequantize_weight_blocks(qw64, sw64, 64), "round trip of the weights with block=64",
              atol=0.0, rtol=1e-6, pick=lambda o: o["xw"])
    t.expect(t.run(probe64)["untouched"], "quantising must not change its input tensor (work on a copy)")

    # --- dequantisation from given payloads, checked against q·s in float64
    def expand(s, n, k):
        return s.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]

    want_a = (qa_ref.double() * sa_ref.double().repeat_interleave(128, 1)[:, :200]).float()
    qa_bits, qw_bits = _u8(qa_ref), _u8(qw_ref)
    t.compare(lambda impl: impl.dequantize_act_tiles(qa_bits.view(torch.float8_e4m3fn), sa_ref.clone()), want_a,
              "dequantize_act_tiles(q, s): q.float() · s of its tile", atol=0.0, rtol=1e-6)
    want_w = (qw_ref.double() * expand(sw_ref, 300, 200)).float()
    t.compare(lambda impl: impl.dequantize_weight_blocks(qw_bits.view(torch.float8_e4m3fn), sw_ref.clone()), want_w,
              "dequantize_weight_blocks(q, s): q.float() · s of its block", atol=0.0, rtol=1e-6)

    # --- round trip through the learner's own pair: |x̂ − x| ≤ 2⁻⁴|x| wherever x/s is in the normal range
    def roundtrip(impl):
        q, s = impl.quantize_act_tiles(x.clone())
        qw, sw = impl.quantize_weight_blocks(w.clone())
        return impl.dequantize_act_tiles(q, s), impl.dequantize_weight_blocks(qw, sw)

    xa, xw = t.run(roundtrip)
    for name, orig, back, s in (("activations", x, xa, sa_ref.double().repeat_interleave(128, 1)[:, :200]),
                                ("weights", w, xw, expand(sw_ref, 300, 200))):
        normal = (orig.double().abs() / s) >= 2.0 ** -6
        err = (back.double() - orig.double()).abs()
        ok = bool((err <= 2.0 ** -4 * orig.double().abs() + 1e-30)[normal].all())
        t.expect(ok, f"round trip of the {name}: every value whose scaled magnitude is in E4M3's normal range must "
                 "come back within 2⁻⁴ (6.25 %) of itself")


# ================================================================== 16.fp8_blockwise_matmul


def _gemm_inputs(M, N, K, seed, tile=128, wstd=0.02):
    from llmcourse.quant import fp8 as Q

    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) * wstd
    w[: min(N, tile)] *= 4.0                       # block rows with clearly different scales
    qa, sa = Q.quantize_act_tiles(x, tile)
    qw, sw = Q.quantize_weight_blocks(w, tile)
    return x, w, qa, sa, qw, sw


def _dequant_product(qa, sa, qw, sw, chunk) -> torch.Tensor:
    M, K = qa.shape
    N = qw.shape[0]
    a = qa.double() * sa.double().repeat_interleave(chunk, 1)[:, :K]
    b = qw.double() * sw.double().repeat_interleave(chunk, 0)[:N].repeat_interleave(chunk, 1)[:, :K]
    return a @ b.T


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@check(f"{U}.fp8_blockwise_matmul", ["fp8_blockwise_matmul"], _ref_matmul)
def check_fp8_blockwise_matmul(t):
    # partial chunks along K (300 = 128 + 128 + 44) and three weight block rows (N = 260)
    _, _, qa, sa, qw, sw = _gemm_inputs(9, 260, 300, 162)
    want = _dequant_product(qa, sa, qw, sw, 128)
    a8, w8 = _u8(qa), _u8(qw)
    y = t.compare(lambda impl: impl.fp8_blockwise_matmul(a8.view(E4), sa.clone(), w8.view(E4), sw.clone()),
                  want.float(), "fp8_blockwise_matmul on (9, 300) activations and a (260, 300) weight: Σ over K-chunks "
                  "of each chunk's product times its activation-tile and weight-block scales", atol=1e-6, rtol=1e-5)
    t.expect(isinstance(y, torch.Tensor) and y.dtype == torch.float32, "the product must be float32")
    t.expect(_rel(y, want) < 1e-6, f"the product must equal the dequantised matmul to 1e-6 relative; got "
             f"{_rel(y, want):.2e}")

    # the chunk argument is used: 64-wide tiles and blocks
    _, _, qa6, sa6, qw6, sw6 = _gemm_inputs(6, 150, 200, 163, tile=64)
    a6, w6 = _u8(qa6), _u8(qw6)
    t.compare(lambda impl: impl.fp8_blockwise_matmul(a6.view(E4), sa6.clone(), w6.view(E4), sw6.clone(), chunk=64),
              _dequant_product(qa6, sa6, qw6, sw6, 64).float(), "fp8_blockwise_matmul(..., chunk=64) on 64-wide tiles "
              "and 64 × 64 blocks", atol=1e-6, rtol=1e-5)

    # error levels on the seeded 256 × 512 by 384 × 512 product
    torch.manual_seed(0)
    x = torch.randn(256, 512)
    w = torch.randn(384, 512) * 0.02
    from llmcourse.quant import fp8 as Q

    qa3, sa3 = Q.quantize_act_tiles(x)
    qw3, sw3 = Q.quantize_weight_blocks(w)
    a3, w3 = _u8(qa3), _u8(qw3)
    y3 = t.run(lambda impl: impl.fp8_blockwise_matmul(a3.view(E4), sa3.clone(), w3.view(E4), sw3.clone()))
    err = _rel(y3, x.double() @ w.double().T)
    t.expect(err < 0.08, f"relative error of the FP8 product against float32 x @ w.T is {err:.3f}; block-scaled FP8 "
             "gives about 0.037 here (0.16 means the scales were averaged instead of applied per chunk)",
             bug="B16.mean_scales" if 0.12 < err < 0.22 else None)
    t.expect(abs(err - 0.0369) < 0.15 * 0.0369, f"relative error against float32 is {err:.4f}, expected about "
             "0.0369 (± 15 %)")

    # the per-chunk structure: with a limited accumulator (acc_bits) every chunk's raw partial product is rounded
    # and promoted on its own; a dequantise-then-matmul product cannot do that
    bits = 6
    _, _, qa7, sa7, qw7, sw7 = _gemm_inputs(7, 200, 400, 164)
    a7, w7 = _u8(qa7), _u8(qw7)
    y7 = t.run(lambda impl: impl.fp8_blockwise_matmul(a7.view(E4), sa7.clone(), w7.view(E4), sw7.clone(),
                                                      acc_bits=bits))
    variants = _acc_variants(qa7, sa7, qw7, sw7, 128, bits)
    ok_frac = _match_fraction(y7, variants["per_chunk"])
    if ok_frac < 0.99:
        named = next((bug for key, bug in (("rounded_total", "B16.dequant_then_matmul"),
                                           ("rounded_scaled", "B16.round_after_scaling"))
                      if _match_fraction(y7, variants[key]) >= 0.99), None)
        ignored = _match_fraction(y7, variants["unrounded"]) >= 0.99
        t.fail(f"fp8_blockwise_matmul(..., acc_bits={bits}) on (7, 400) × (200, 400): only {ok_frac:.0%} of the "
               f"outputs equal Σ_c scale_c · round(raw partial product of chunk c, {bits} bits)"
               + ("; acc_bits was ignored" if ignored else ""), bug=named)


def _acc_variants(qa, sa, qw, sw, chunk, bits) -> dict:
    """The limited-accumulator product computed here (float64 chunk products rounded once each) and the outputs of
    the known shortcuts: the rounding applied to the finished sum, to the scaled partials, or not at all."""
    from llmcourse.quant.fp8 import round_mantissa

    M, K = qa.shape
    N = qw.shape[0]
    swr = sw.double().repeat_interleave(chunk, 0)[:N]
    out = {k: torch.zeros(M, N, dtype=torch.float64) for k in ("per_chunk", "rounded_scaled", "unrounded")}
    for c, k0 in enumerate(range(0, K, chunk)):
        raw = qa[:, k0:k0 + chunk].double() @ qw[:, k0:k0 + chunk].double().T
        scale = sa[:, c, None].double() * swr[None, :, c]
        out["per_chunk"] += round_mantissa(raw, bits) * scale
        out["rounded_scaled"] += round_mantissa(raw * scale, bits)
        out["unrounded"] += raw * scale
    out["rounded_total"] = round_mantissa(out["unrounded"], bits)
    return out


def _match_fraction(y, want) -> float:
    """Share of elements of ``y`` within float32 rounding of ``want`` (a rare element whose float32 chunk sum sits
    on a rounding boundary of the limited accumulator may land one step away)."""
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(want.shape):
        return 0.0
    close = (y.double() - want).abs() <= 1e-5 * want.abs().max() + 1e-4 * want.abs()
    return float(close.double().mean())


# ================================================================== 16.FP8Linear


def _linear_state(inp, out, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    state = {"weight": torch.randn(out, inp, generator=g) * 0.02}
    if bias:
        state["bias"] = torch.randn(out, generator=g) * 0.1
    return state


def _fp8linear_probe(state, x):
    def probe(impl):
        out_f, in_f = state["weight"].shape
        lin = nn.Linear(in_f, out_f, bias="bias" in state)
        lin.load_state_dict(state)
        m = _from_linear(impl, lin)
        facts = module_facts(m)
        with torch.no_grad():
            y = m(x.clone())
        sd = {k: v for k, v in unwrap(m).state_dict().items()}
        return {"facts": _wire(facts), "y": y, "sd": _wire(sd)}
    return probe


@check(f"{U}.FP8Linear", ["FP8Linear"], _ref_linear)
def check_fp8linear(t):
    from llmcourse.quant.fp8 import FP8Linear

    fresh = t.run(lambda impl: module_facts(_earlier_course(impl, "FP8Linear")(200, 300)))
    t.expect(fresh["is_module"], "FP8Linear must be an nn.Module")
    state = _linear_state(200, 300, 164)
    g = torch.Generator().manual_seed(165)
    x = torch.randn(2, 5, 200, generator=g)
    probe = _fp8linear_probe(state, x)
    got = _unwire(t.run(probe))
    sd = got["sd"]
    bias = sd.get("bias")
    if isinstance(bias, torch.Tensor) and bias.dtype in (E4, E5):
        t.fail("the bias is stored in FP8; keep it a float32 parameter", bug="B16.bias_quantized")
    if any(k.startswith("bias") and k != "bias" for k in sd):
        t.fail(f"the bias must stay a float32 parameter named 'bias'; found {sorted(k for k in sd if 'bias' in k)}",
               bug="B16.bias_quantized")
    want = {"weight_fp8": (E4, (300, 200)), "weight_scale": (torch.float32, (3, 2)), "bias": (torch.float32, (300,))}
    have = {k: (v.dtype, tuple(v.shape)) for k, v in sd.items()}
    t.expect(set(have) == set(want), f"state_dict keys of FP8Linear.from_linear(nn.Linear(200, 300)) must be "
             f"{sorted(want)}; got {sorted(have)}")
    for k, v in want.items():
        t.expect(have[k] == v, f"state_dict[{k!r}] must be {v[0]} of shape {v[1]}; got {have[k][0]} of shape "
                 f"{have[k][1]}")
    t.expect(got["facts"]["parameters"] == ["bias"], "the only parameter is the float32 bias; the weight and its "
             f"scales are buffers; parameters: {got['facts']['parameters']}")
    nobias = t.run(lambda impl: sorted(unwrap(_earlier_course(impl, "FP8Linear")(64, 32, bias=False)).state_dict()))
    t.expect(nobias == ["weight_fp8", "weight_scale"], f"FP8Linear(64, 32, bias=False) must hold only weight_fp8 and "
             f"weight_scale; got {nobias}")

    ref_lin = nn.Linear(200, 300)
    ref_lin.load_state_dict(state)
    ref = FP8Linear.from_linear(ref_lin)
    t.expect(torch.equal(_bits(sd["weight_fp8"]), _bits(ref.weight_fp8)), "weight_fp8 must be the 128 × 128 "
             "block quantisation of the linear's weight (bit patterns differ)")
    with torch.no_grad():
        y_ref = ref(x)
        y_fp32 = ref_lin(x)
    t.compare(probe, y_ref, "FP8Linear.from_linear(lin)(x) on a (2, 5, 200) input: 1×128 activation tiles quantised "
              "on the fly, block-scaled product, plus the float32 bias", atol=1e-5, rtol=1e-5, pick=lambda o: o["y"])
    err = _rel(got["y"], y_fp32)
    t.expect(err < 0.06, f"relative error against the original nn.Linear is {err:.3f}; it must stay below 0.06")

    # the bias is a trainable float32 parameter: its gradient is the sum of the output's gradient over the tokens
    r_out = torch.randn(2, 5, 300, generator=torch.Generator().manual_seed(21))

    def bias_grad(impl):
        lin = nn.Linear(200, 300)
        lin.load_state_dict(state)
        m = _from_linear(impl, lin)
        (m(x.clone()) * r_out).sum().backward()
        b = unwrap(m).bias
        return b.grad if b.grad is not None else torch.zeros_like(b)

    t.compare(bias_grad, r_out.sum(dim=(0, 1)), "the gradient of Σ r·output with respect to the bias (a float32 "
              "Parameter: the output must stay differentiable in it)", atol=1e-5, rtol=1e-5)

    # block=64, and no side effects: forwards in eval and train mode leave every buffer and parameter as it was
    ref64 = FP8Linear.from_linear(ref_lin, block=64)
    with torch.no_grad():
        y64 = ref64(x)

    def probe64(impl):
        lin = nn.Linear(200, 300)
        lin.load_state_dict(state)
        m = _earlier_course(impl, "FP8Linear").from_linear(lin, block=64) if not hasattr(impl.FP8Linear, "__wrapped__") else \
            InstanceGuard(run_learner(impl.FP8Linear.__wrapped__.from_linear, "FP8Linear.from_linear", (lin,),
                                      {"block": 64}), "FP8Linear")
        before = {k: v.clone() for k, v in unwrap(m).state_dict().items()}
        outs = []
        for train in (False, True):
            unwrap(m).train(train)
            with torch.no_grad():
                outs.append(m(x.clone()))
        changed = sorted(k for k, v in unwrap(m).state_dict().items()
                         if k not in before or v.view(torch.uint8).ne(before[k].view(torch.uint8)).any())
        return {"y": outs[0], "changed": changed, "scale_shape": list(before["weight_scale"].shape)
                if "weight_scale" in before else None}

    got64 = t.run(probe64)
    t.expect(got64["scale_shape"] == [5, 4], f"FP8Linear.from_linear(lin, block=64) on a (300, 200) weight must hold "
             f"(5, 4) weight scales; got {got64['scale_shape']}")
    t.compare(probe64, y64, "FP8Linear.from_linear(lin, block=64)(x): 1×64 tiles and 64×64 blocks", atol=1e-5,
              rtol=1e-5, pick=lambda o: o["y"])
    t.expect(got64["changed"] == [], f"a forward must not change the layer's buffers or parameters; changed: "
             f"{got64['changed']}")


# ================================================================== 16.convert_linears_to_fp8


def _llama_state(tie: bool, seed: int):
    from llmcourse.models.llama3 import Llama3Config, Llama3Model

    cfg = Llama3Config.preset("llama3-tiny")
    cfg.tie_word_embeddings = tie
    torch.manual_seed(seed)
    m = Llama3Model(cfg)
    return cfg.to_dict(), {k: v.clone() for k, v in m.state_dict().items()}


def _convert_probe(cfg, state, skip, idx, add_gate=False):
    def probe(impl):
        from llmcourse.models.llama3 import Llama3Config, Llama3Model

        m = Llama3Model(Llama3Config(**cfg))
        m.load_state_dict(state)
        if add_gate:
            gen = torch.Generator().manual_seed(7)
            m.layers[1].gate = nn.Linear(cfg["d_model"], 8, bias=False)
            with torch.no_grad():
                m.layers[1].gate.weight.copy_(torch.randn(8, cfg["d_model"], generator=gen))
        m.eval()
        conv = _earlier_course(impl, "convert_linears_to_fp8")
        out = conv(m) if skip is None else conv(m, skip=skip)
        out = unwrap(out)
        kinds = {}
        for name, mod in out.named_modules():
            fp8 = [n for n, b in mod.named_buffers(recurse=False) if b.dtype in (E4, E5)]
            kinds[name] = {"type": type(mod).__name__, "fp8": bool(fp8), "linear": type(mod) is nn.Linear}
        with torch.no_grad():
            logits = out(idx)
            tie_ptr = out.lm_head.weight.data_ptr() == out.embed_tokens.weight.data_ptr() \
                if isinstance(getattr(out.lm_head, "weight", None), torch.Tensor) else False
            out.embed_tokens.weight.mul_(2.0)           # a tied head follows the embedding
            head = out.lm_head.weight.detach().clone() if isinstance(getattr(out.lm_head, "weight", None),
                                                                      torch.Tensor) else None
        return {"same": out is m, "kinds": kinds, "logits": logits, "tie_ptr": tie_ptr, "head": head}
    return probe


PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")


MOE_KW = dict(moe_intermediate_size=128, n_routed_experts=8, n_shared_experts=1, top_k=2, n_group=4, topk_group=2)


def _moe_llama(cfg: dict):
    """Unit 14's MoE model shape: llama3-tiny whose layers 1.. use a DeepSeekMoE feed-forward (router ``mlp.gate``,
    experts ``mlp.experts.{e}.*_proj``, ``mlp.shared_experts.*``); None when unit 14's library is absent."""
    try:
        from llmcourse.models.deepseek_moe import DeepSeekMoE
    except ImportError:
        return None
    from llmcourse.models.llama3 import Llama3Config, Llama3Model

    m = Llama3Model(Llama3Config(**cfg))
    for layer in m.layers[1:]:
        layer.mlp = DeepSeekMoE(cfg["d_model"], **MOE_KW)
    return m


def _moe_state(cfg: dict, seed: int):
    m = _moe_llama(cfg)
    if m is None:
        return None
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        for layer in m.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(8, generator=g) * 0.05)
    return {k: v.clone() for k, v in m.state_dict().items()}


def _moe_probe(cfg, state, idx):
    def probe(impl):
        m = _moe_llama(cfg)
        m.load_state_dict(state)
        m.eval()
        out = unwrap(_earlier_course(impl, "convert_linears_to_fp8")(m))
        kinds = {}
        for name, mod in out.named_modules():
            fp8 = [n for n, b in mod.named_buffers(recurse=False) if b.dtype in (E4, E5)]
            kinds[name] = {"type": type(mod).__name__, "fp8": bool(fp8), "linear": type(mod) is nn.Linear}
        gate = {f"layers.{i}.mlp.gate.weight": out.layers[i].mlp.gate.weight.detach().clone()
                for i in range(1, len(out.layers))}
        with torch.no_grad():
            logits = out(idx)
        return {"kinds": kinds, "gate": gate, "logits": logits}
    return probe


@functools.lru_cache(maxsize=1)
def _asset_model():
    try:
        from llmcourse.train.llama_char import load_llama_char_tiny

        model, _ = load_llama_char_tiny(retrain=False, verbose=False)
    except (ImportError, FileNotFoundError):
        return None
    return model.cfg.to_dict(), {k: v.detach().clone() for k, v in model.state_dict().items()}


@functools.lru_cache(maxsize=1)
def _val_batches():
    """Unit 10's validation batches of tinyshakespeare's characters (the last 10 %, ids in sorted-character order,
    as :func:`llmcourse.data.corpus.char_corpus` splits them; read without the datasets library, which would
    dominate the check's time). ``tests/test_unit16_checks.py`` compares them with ``char_corpus``'s."""
    from llmcourse.data.corpus import get_batch
    from llmcourse.data.resolve import load_text

    text = load_text("tinyshakespeare")
    stoi = {c: i for i, c in enumerate(sorted(set(text)))}
    val = torch.tensor([stoi[c] for c in text[int(len(text) * 0.9):]], dtype=torch.long)
    xs, ys = [], []
    for i in range(LOSS_BATCHES):
        x, y = get_batch(val, LOSS_BATCH, LOSS_T, torch.Generator().manual_seed(i))
        xs.append(x)
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)


@check(f"{U}.convert_linears_to_fp8", ["convert_linears_to_fp8"], _ref_convert)
def check_convert(t):
    g = torch.Generator().manual_seed(166)
    idx = torch.randint(0, 65, (2, 24), generator=g)

    # tied llama3-tiny with an extra router-like Linear named "gate"; default skip
    cfg, state = _llama_state(True, 0)
    got = t.run(_convert_probe(cfg, state, None, idx, add_gate=True))
    kinds = got["kinds"]
    t.expect(got["same"], "convert_linears_to_fp8 converts in place and returns the model it was given")
    for i in range(cfg["n_layers"]):
        for p in PROJ:
            k = kinds.get(f"layers.{i}.{p}", {})
            t.expect(k.get("fp8") and not k.get("linear"), f"layers.{i}.{p} must become an FP8Linear (FP8 weight "
                     f"buffer); it is a {k.get('type')}")
    t.expect(kinds["layers.1.gate"]["linear"], "layers.1.gate is a router ('gate' is in skip): it must stay an "
             f"nn.Linear in full precision; it is a {kinds['layers.1.gate']['type']}")
    t.expect(kinds["embed_tokens"]["type"] == "Embedding", "the embedding must stay an nn.Embedding")
    t.expect(kinds["lm_head"]["linear"], f"lm_head must stay an nn.Linear; it is a {kinds['lm_head']['type']}")
    head = got["head"]
    t.expect(head is not None and torch.equal(head, state["embed_tokens.weight"] * 2.0),
             "after conversion lm_head must still share its weight with embed_tokens (scaling the embedding must "
             "change the head)", bug="B16.tie_broken")

    # tied head, skip without "lm_head": the tie alone must keep the head unconverted
    got2 = t.run(_convert_probe(cfg, state, ("gate",), idx))
    head2 = got2["head"]
    if got2["kinds"]["lm_head"]["fp8"] or head2 is None or not torch.equal(head2, state["embed_tokens.weight"] * 2.0):
        t.fail("with skip=('gate',) the tied lm_head was converted: a Linear whose weight is shared with another "
               "module must never be converted, whatever skip says (the FP8 copy breaks the tie: recognise it by its "
               "weight's storage, not by its name)", bug="B16.tie_broken")

    # untied model, custom skip: names are matched on their last component
    cfg_u, state_u = _llama_state(False, 1)
    got3 = t.run(_convert_probe(cfg_u, state_u, ("lm_head", "o_proj"), idx))
    k3 = got3["kinds"]
    t.expect(k3["lm_head"]["linear"] and all(k3[f"layers.{i}.self_attn.o_proj"]["linear"] for i in range(4)),
             "with skip=('lm_head', 'o_proj') every o_proj and the head must stay nn.Linear")
    t.expect(all(k3[f"layers.{i}.self_attn.q_proj"]["fp8"] for i in range(4)),
             "with skip=('lm_head', 'o_proj') the q_proj layers must still be converted")
    got4 = t.run(_convert_probe(cfg_u, state_u, (), idx))
    t.expect(got4["kinds"]["lm_head"]["fp8"], "with skip=() an untied lm_head is an ordinary Linear and must be "
             "converted")

    # the logits stay close to the float32 model's
    from llmcourse.models.llama3 import Llama3Config, Llama3Model

    fp32 = Llama3Model(Llama3Config(**cfg)).eval()
    fp32.load_state_dict(state)
    with torch.no_grad():
        base = fp32(idx)
    err = _rel(got["logits"], base)
    t.expect(err < 0.1, f"logits of the converted llama3-tiny differ from the float32 model's by {err:.3f} "
             "(relative); FP8 with fine-grained scales stays well below 0.1")

    # unit 14's MoE model: experts (routed and shared) converted, the router untouched
    moe_state = _moe_state(cfg_u, 2)
    if moe_state is not None:
        idx_moe = idx[:1, :16]
        got5 = t.run(_moe_probe(cfg_u, moe_state, idx_moe))
        k5 = got5["kinds"]
        for i in range(1, cfg_u["n_layers"]):
            for p in ("experts.0.gate_proj", "experts.7.down_proj", "shared_experts.up_proj"):
                k = k5.get(f"layers.{i}.mlp.{p}", {})
                t.expect(k.get("fp8") and not k.get("linear"), f"in the MoE model, layers.{i}.mlp.{p} (an expert's "
                         f"projection) must become an FP8Linear; it is a {k.get('type')}")
            t.expect(not k5[f"layers.{i}.mlp.gate"]["fp8"], f"in the MoE model, the router layers.{i}.mlp.gate must "
                     "keep full precision")
        for name, wgt in got5["gate"].items():
            t.expect(isinstance(wgt, torch.Tensor) and wgt.dtype == torch.float32 and torch.equal(wgt, moe_state[name]),
                     f"in the MoE model, the router weight {name} must stay the same float32 tensor")
        moe_ref = _moe_llama(cfg_u)
        moe_ref.load_state_dict(moe_state)
        with torch.no_grad():
            moe_base = moe_ref.eval()(idx_moe)
        from llmcourse.quant.fp8 import convert_linears_to_fp8

        with torch.no_grad():
            ref_err = _rel(convert_linears_to_fp8(moe_ref)(idx_moe), moe_base)
        err5 = _rel(got5["logits"], moe_base)
        t.expect(err5 <= 1.5 * ref_err + 0.02, f"logits of the converted MoE model differ from the float32 model's by "
                 f"{err5:.3f} (relative); the course's conversion differs by {ref_err:.3f}")

    # the trained character Llama: validation-loss increase
    asset = _asset_model()
    if asset is None:
        return
    acfg, astate = asset
    xb, yb = _val_batches()

    def loss_probe(impl):
        from llmcourse.models.llama3 import Llama3Config, Llama3Model

        m = Llama3Model(Llama3Config(**acfg))
        m.load_state_dict(astate)
        m = unwrap(_earlier_course(impl, "convert_linears_to_fp8")(m.eval()))
        with torch.no_grad():
            return torch.cat([m(xb[i:i + LOSS_BATCH]) for i in range(0, len(xb), LOSS_BATCH)])

    logits = t.run(loss_probe)
    ref = Llama3Model(Llama3Config(**acfg)).eval()
    ref.load_state_dict(astate)
    with torch.no_grad():
        base_logits = torch.cat([ref(xb[i:i + LOSS_BATCH]) for i in range(0, len(xb), LOSS_BATCH)])
    t.expect(isinstance(logits, torch.Tensor) and logits.shape == base_logits.shape, "the converted character "
             "model must return logits of the same shape")
    ce = nn.functional.cross_entropy
    delta = (ce(logits.flatten(0, 1).float(), yb.flatten()) - ce(base_logits.flatten(0, 1), yb.flatten())).item()
    t.expect(delta <= REF_DELTA + 0.02, f"converting the trained character Llama raised its validation loss by "
             f"{delta:.4f} nats; the reference conversion costs {REF_DELTA:.4f} (allowed: + 0.02)")


# ================================================================== declared strength (grader/strength.py)
from ..strength import decision, defining_property  # noqa: E402

defining_property(f"{U}.fp8_info", "the FP8 formats' limits follow from their bit layouts (E4M3 has no infinities and "
                  "keeps its top exponent)",
                  probe="every field against all 256 bit patterns decoded by torch's own FP8 dtypes")
defining_property(f"{U}.quantize_blockwise", "fine-grained scaling: one scale per 1×128 activation tile and per 128×128 "
                  "weight block, chosen from the tile's own values so that nothing saturates and the full E4M3 range is "
                  "used",
                  probe="payload bit patterns and scales compared bit for bit on inputs with outliers, partial and "
                        "all-zero tiles; round trips")
defining_property(f"{U}.fp8_blockwise_matmul", "the scales are applied per K-chunk to the FP8 partial products, which is "
                  "where the limited accumulator rounds",
                  probe="products against the dequantised route and against the acc_bits variants (rounding before, after "
                        "or without the scales) on partial chunks and another chunk width")
defining_property(f"{U}.FP8Linear", "an E4M3 weight stored as buffers with block scales, the activation quantised per "
                  "token and tile on every forward, a float32 bias",
                  probe="state_dict kinds and dtypes, outputs against the course's layer (graded on the course's "
                        "quantisers and GEMM, so exercises 2-3 count once), no side effects")
defining_property(f"{U}.convert_linears_to_fp8", "every eligible linear map converted in place, except those named in "
                  "skip and those whose weight is shared (a tied head stays tied whatever skip says)",
                  probe="module types after conversion of tied and untied tiny Llamas and an MoE model, with custom skip "
                        "lists; the tie re-derived by changing the embedding (graded on the course's FP8Linear)")

decision(f"{U}.quantize_blockwise", "the scale: the tile's amax over E4M3's largest finite value (448)",
         forms=[r"amax\s*/\s*448", r"448\s*/\s*amax", r"max\s*\|\s*x\s*\|\s*/\s*448", r"abs\(\)\.amax\([^)]*\)\s*/\s*448",
                r"largest (magnitude|\|value\|)[^.]{0,40}lands? (exactly )?on"],
         wrong=("B16.scale_inverted", "B16.wrong_max", "B16.per_tensor"))
decision(f"{U}.convert_linears_to_fp8", "how a tied layer is recognised: its weight is shared with another module "
         "(same storage), whatever its name",
         forms=[r"data_ptr\(\)", r"remove_duplicate\s*=\s*False", r"_shared_ptrs"],
         wrong=("B16.tie_broken",))
