"""FP8 quantisation simulated bit-exactly on a CPU (unit 16).

Everything here runs on ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` tensors, whose casts from float32
round to nearest (ties to even) exactly as FP8 hardware does; only the speed of FP8 tensor cores is missing.

Formats (OCP "OFP8" specification, 2023; Micikevicius et al., "FP8 formats for deep learning", 2022):

* **E4M3** (``float8_e4m3fn``): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; only
  ``S.1111.111`` is NaN, so the largest finite value is ``1.75·2⁸ = 448``.
* **E5M2** (``float8_e5m2``): 1 sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like: exponent ``11111``
  holds ±inf (mantissa 0) and NaN; largest finite ``1.75·2¹⁵ = 57,344``.

Fine-grained scaling follows DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.3.2,
Fig. 7): one float32 scale per **1×128** activation tile (per token, per 128 channels) and per **128×128**
weight block, computed online from the current absolute maximum, ``s = amax / 448``; the GEMM scales each
128-wide K-chunk's partial product by its own two scales and accumulates in float32 (§3.3.2, "increasing
accumulation precision": promotion to FP32 every 128 elements). :func:`accumulate_limited` emulates an
accumulator with a limited number of mantissa bits (the report measures about 14 bits on H800 tensor cores).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "E4M3_MAX",
    "FP8Linear",
    "accumulate_limited",
    "convert_linears_to_fp8",
    "decode_fp8_bits",
    "dequantize_act_tiles",
    "dequantize_per_tensor",
    "dequantize_weight_blocks",
    "fp8_blockwise_matmul",
    "fp8_info",
    "fp8_loss_delta",
    "fp8_table",
    "fp8_bytes",
    "is_e4m3_representable",
    "linear_layer_errors",
    "outlier_errors",
    "quantize_act_tiles",
    "quantize_per_tensor",
    "quantize_weight_blocks",
    "rel_error",
    "round_mantissa",
]

E4M3_MAX = 448.0
_AMAX_FLOOR = 1e-12

# (exponent bits, mantissa bits, IEEE-like specials?) — the only facts taken as given; the rest is derived.
_LAYOUT = {torch.float8_e4m3fn: (4, 3, False), torch.float8_e5m2: (5, 2, True)}


def _layout(dtype: torch.dtype) -> tuple[int, int, bool]:
    if dtype not in _LAYOUT:
        raise ValueError(f"fp8_info knows torch.float8_e4m3fn and torch.float8_e5m2, got {dtype}")
    return _LAYOUT[dtype]


def fp8_info(dtype: torch.dtype) -> dict:
    """The defining numbers of an FP8 format, derived from its bit layout.

    Args:
        dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` (``ValueError`` otherwise).

    Returns:
        ``{"exponent_bits", "mantissa_bits", "bias" = 2^(e−1) − 1, "max", "min_normal" = 2^(1−bias),
        "min_subnormal" = 2^(1−bias−m), "eps" = 2^(−m) (gap above 1.0), "has_inf"}``. ``max`` is
        ``(2 − 2^(1−m))·2^(2^e − 2 − bias)`` for IEEE-like formats (top exponent reserved for inf/NaN) and
        ``(2 − 2^(1−m))·2^(2^e − 1 − bias)`` for E4M3 "fn" (only the all-ones mantissa of the top exponent is
        NaN). E4M3: 4, 3, 7, 448, 2⁻⁶, 2⁻⁹, 0.125, False; E5M2: 5, 2, 15, 57,344, 2⁻¹⁴, 2⁻¹⁶, 0.25, True.
    """
    e, m, ieee = _layout(dtype)
    bias = 2 ** (e - 1) - 1
    if ieee:
        top, top_frac = 2 ** e - 2 - bias, 2 - 2.0 ** (-m)
    else:
        top, top_frac = 2 ** e - 1 - bias, 2 - 2.0 ** (1 - m)
    return {"exponent_bits": e, "mantissa_bits": m, "bias": bias, "max": top_frac * 2.0 ** top,
            "min_normal": 2.0 ** (1 - bias), "min_subnormal": 2.0 ** (1 - bias - m), "eps": 2.0 ** (-m),
            "has_inf": ieee}


def decode_fp8_bits(code: int, dtype: torch.dtype) -> float:
    """The value of the 8-bit pattern ``code`` (0–255) in ``dtype``, decoded with the formula (no torch cast).

    ``(−1)^s · 2^(1−bias) · (0.f)`` for exponent field 0 (subnormals, ±0), ``(−1)^s · 2^(E−bias) · (1.f)``
    otherwise; E4M3 "fn": ``S.1111.111`` is NaN; E5M2: exponent ``11111`` is ±inf (f = 0) or NaN.
    """
    e, m, ieee = _layout(dtype)
    bias = 2 ** (e - 1) - 1
    sign = -1.0 if code >> 7 else 1.0
    E = (code >> m) & (2 ** e - 1)
    f = code & (2 ** m - 1)
    if ieee and E == 2 ** e - 1:
        return sign * math.inf if f == 0 else math.nan
    if not ieee and E == 2 ** e - 1 and f == 2 ** m - 1:
        return math.nan
    if E == 0:
        return sign * 2.0 ** (1 - bias) * (f / 2 ** m)
    return sign * 2.0 ** (E - bias) * (1 + f / 2 ** m)


def fp8_table(dtype: torch.dtype) -> list[dict]:
    """All 256 patterns of ``dtype``: ``{"code", "bits" ("s.eeee.mmm"), "value" (float), "kind"}`` with kind
    ``"zero"``, ``"subnormal"``, ``"normal"``, ``"inf"`` or ``"nan"``, decoded by :func:`decode_fp8_bits`."""
    e, m, _ = _layout(dtype)
    rows = []
    for code in range(256):
        v = decode_fp8_bits(code, dtype)
        b = f"{code:08b}"
        E = (code >> m) & (2 ** e - 1)
        kind = ("nan" if math.isnan(v) else "inf" if math.isinf(v) else "zero" if v == 0
                else "subnormal" if E == 0 else "normal")
        rows.append({"code": code, "bits": f"{b[0]}.{b[1:1 + e]}.{b[1 + e:]}", "value": v, "kind": kind})
    return rows


def is_e4m3_representable(x: Tensor) -> Tensor:
    """Boolean mask: which finite values of ``x`` are exactly one of the 253 finite E4M3 values (a float16
    "FP8" clamped to ±448 fails this). Computed from the decoded table, not from a cast."""
    values = torch.tensor(sorted({r["value"] for r in fp8_table(torch.float8_e4m3fn) if r["kind"] != "nan"}),
                          dtype=torch.float64)
    xd = x.detach().to(torch.float64).reshape(-1)
    idx = torch.searchsorted(values, xd).clamp(max=len(values) - 1)
    return (values[idx] == xd).reshape(x.shape)


# ------------------------------------------------------------------------------------------------
# scaling
# ------------------------------------------------------------------------------------------------


def _check_2d(x: Tensor, what: str) -> None:
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"{what} must be a 2-D tensor, got {tuple(x.shape) if isinstance(x, Tensor) else type(x)}")


def quantize_per_tensor(x: Tensor, fmt: torch.dtype = torch.float8_e4m3fn) -> tuple[Tensor, Tensor]:
    """One scale for the whole tensor: ``s = max(amax, 1e-12) / max_fmt``, ``q = clamp(x/s, ±max).to(fmt)``.

    Returns ``(q, s)``: ``q`` has ``x``'s shape and dtype ``fmt``; ``s`` is a 0-d float32 tensor.
    """
    fmax = fp8_info(fmt)["max"]
    x = x.float()
    s = x.abs().amax().clamp(min=_AMAX_FLOOR) / fmax
    return (x / s).clamp(-fmax, fmax).to(fmt), s


def dequantize_per_tensor(q: Tensor, s: Tensor) -> Tensor:
    """``q.float() · s`` (float32)."""
    return q.float() * s


def quantize_act_tiles(x: Tensor, tile: int = 128) -> tuple[Tensor, Tensor]:
    """Fine-grained activation quantisation with one scale per row and 1×``tile`` K-tile (DeepSeek-V3 §3.3.2).

    Args:
        x: ``(M, K)`` float tensor (rows = tokens, columns = channels).
        tile: tile width along K; the last tile may be partial and uses only its own elements.

    Returns:
        ``q (M, K) float8_e4m3fn`` with ``q = clamp(x / s, −448, 448)`` rounded to nearest-even by the cast, and
        ``s (M, ceil(K/tile)) float32`` with ``s = max(amax_tile, 1e-12) / 448``.

    Raises:
        ValueError: ``x`` not 2-D.
    """
    _check_2d(x, "x")
    M, K = x.shape
    x = x.float()
    nt = -(-K // tile)
    pad = nt * tile - K
    xp = torch.nn.functional.pad(x, (0, pad)).view(M, nt, tile)   # zero padding never raises an amax
    s = xp.abs().amax(dim=-1).clamp(min=_AMAX_FLOOR) / E4M3_MAX
    q = (xp / s[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(M, nt * tile)[:, :K].contiguous(), s


def dequantize_act_tiles(q: Tensor, s: Tensor, tile: int = 128) -> Tensor:
    """Inverse of :func:`quantize_act_tiles`: ``x̂[i, j] = q[i, j].float() · s[i, j // tile]`` → ``(M, K)`` float32."""
    _check_2d(q, "q")
    K = q.shape[1]
    return q.float() * s.float().repeat_interleave(tile, dim=1)[:, :K]


def quantize_weight_blocks(w: Tensor, block: int = 128) -> tuple[Tensor, Tensor]:
    """Fine-grained weight quantisation with one scale per ``block×block`` tile (DeepSeek-V3 §3.3.2, Fig. 7a).

    Args:
        w: ``(N, K)`` float tensor (``nn.Linear`` layout: out × in); edge blocks may be partial.

    Returns:
        ``q (N, K) float8_e4m3fn`` and ``s (ceil(N/block), ceil(K/block)) float32``, ``s = max(amax, 1e-12)/448``
        per block, ``q = clamp(w / s_block, ±448).to(float8_e4m3fn)``.
    """
    _check_2d(w, "w")
    N, K = w.shape
    w = w.float()
    nb, kb = -(-N // block), -(-K // block)
    wp = torch.nn.functional.pad(w, (0, kb * block - K, 0, nb * block - N)).view(nb, block, kb, block)
    s = wp.abs().amax(dim=(1, 3)).clamp(min=_AMAX_FLOOR) / E4M3_MAX
    q = (wp / s[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(nb * block, kb * block)[:N, :K].contiguous(), s


def _expand_blocks(s: Tensor, block: int, N: int, K: int) -> Tensor:
    return s.float().repeat_interleave(block, dim=0)[:N].repeat_interleave(block, dim=1)[:, :K]


def dequantize_weight_blocks(q: Tensor, s: Tensor, block: int = 128) -> Tensor:
    """Inverse of :func:`quantize_weight_blocks`: ``ŵ[n, k] = q[n, k].float() · s[n // block, k // block]``."""
    _check_2d(q, "q")
    N, K = q.shape
    return q.float() * _expand_blocks(s, block, N, K)


# ------------------------------------------------------------------------------------------------
# the block-scaled GEMM
# ------------------------------------------------------------------------------------------------


def fp8_blockwise_matmul(qa: Tensor, sa: Tensor, qw: Tensor, sw: Tensor, chunk: int = 128,
                         acc_bits: int | None = None) -> Tensor:
    """``y = x̂ ŵᵀ`` computed as DeepSeek-V3's FP8 GEMM does: per K-chunk products, per-chunk scales, FP32 sums.

    Args:
        qa: ``(M, K)`` FP8 activations, ``sa (M, ceil(K/chunk))`` their tile scales.
        qw: ``(N, K)`` FP8 weights, ``sw (ceil(N/chunk), ceil(K/chunk))`` their block scales.
        chunk: the K-chunk width = activation tile width = weight block size.
        acc_bits: ``None`` (default): each chunk's raw partial product is kept in float32. An int: the partial
            product of every chunk (unscaled, as the tensor core's limited accumulator holds it) is rounded to
            ``acc_bits`` significant bits (:func:`round_mantissa`, to nearest) **before** it is scaled and
            promoted into the float32 sum: the promotion of DeepSeek-V3 §3.3.2, one rounding per chunk.

    Returns:
        ``(M, N)`` float32: ``Σ_c (qa[:, c].float() @ qw[:, c].float().T) · sa[:, c, None] · sw[n // chunk, c]``.
        Every single FP8×FP8 product is exact in float32 (two 4-bit significands make at most 8 bits), but a
        chunk's sum of ``chunk`` products is an ordinary float32 sum: when the products span more than float32's
        24 bits of magnitude, low bits are rounded away (not exact in general). Equals
        ``dequantize_act_tiles(qa, sa) @ dequantize_weight_blocks(qw, sw).T`` up to float32 rounding when
        ``acc_bits`` is None.
    """
    _check_2d(qa, "qa")
    _check_2d(qw, "qw")
    M, K = qa.shape
    N, K2 = qw.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: qa {tuple(qa.shape)} vs qw {tuple(qw.shape)}")
    nc = -(-K // chunk)
    pad = nc * chunk - K                                   # zero columns add exact zeros to every chunk
    a = torch.nn.functional.pad(qa.float(), (0, pad)).view(M, nc, chunk).transpose(0, 1)     # (nc, M, chunk)
    w = torch.nn.functional.pad(qw.float(), (0, pad)).view(N, nc, chunk).permute(1, 2, 0)    # (nc, chunk, N)
    parts = torch.bmm(a, w)                                # (nc, M, N): one float32 partial product per chunk
    if acc_bits is not None:                               # the limited accumulator's result, before promotion
        parts = round_mantissa(parts, acc_bits).float()
    sw_rows = sw.float().repeat_interleave(chunk, dim=0)[:N]          # (N, nc): row n uses block n // chunk
    scale = sa.float().T[:, :, None] * sw_rows.T[:, None, :]          # (nc, M, N)
    y = torch.zeros(M, N, dtype=torch.float32, device=qa.device)
    for c in range(nc):                                    # FP32 accumulation, chunk by chunk
        y += parts[c] * scale[c]
    return y


ROUNDING_MODES = ("nearest", "truncate")


def round_mantissa(x: Tensor, bits: int, rounding: str = "nearest") -> Tensor:
    """Round float64 ``x`` to ``bits`` significant bits (implicit leading bit included).

    ``rounding="nearest"``: to nearest, ties to even (IEEE's default); ``"truncate"``: toward zero (the dropped
    bits are simply cut off, as an accumulator that shifts out low bits without rounding does). ``bits = 24`` is
    float32's significand, ``11`` float16's. Exponent range is unlimited (no over/underflow).

    Raises:
        ValueError: an unknown ``rounding``.
    """
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding must be one of {ROUNDING_MODES}, got {rounding!r}")
    mant, exp = torch.frexp(x.to(torch.float64))          # x = mant · 2^exp, |mant| in [0.5, 1)
    scaled = torch.ldexp(mant, torch.tensor(bits))
    return torch.ldexp(torch.round(scaled) if rounding == "nearest" else torch.trunc(scaled), exp - bits)


def accumulate_limited(a: Tensor, b: Tensor, bits: int, interval: int | None = None,
                       rounding: str = "nearest") -> Tensor:
    """Row sums ``Σ_k a[:, k]·b[:, k]`` with an accumulator that keeps ``bits`` significant bits.

    Emulates a tensor core's limited accumulation (DeepSeek-V3 §3.3.2 reports about 14 bits on H800): products
    are exact (float64), the running sum is rounded to ``bits`` bits after every addition, to nearest or by
    truncation (``rounding``, see :func:`round_mantissa`). With ``interval``, every ``interval`` products the
    limited partial sum is **promoted**: added to a float32 accumulator and reset (the report promotes every 128
    elements). Returns ``(rows,)`` float64. A model, not the hardware: the real accumulator's alignment and
    rounding inside one MMA instruction are not published, so the emulation brackets the report's error rather
    than reproducing it.
    """
    prod = a.to(torch.float64) * b.to(torch.float64)
    R, K = prod.shape
    acc = torch.zeros(R, dtype=torch.float64)
    total = torch.zeros(R, dtype=torch.float32)
    for k in range(K):
        acc = round_mantissa(acc + prod[:, k], bits, rounding)
        if interval is not None and (k + 1) % interval == 0:
            total = total + acc.float()
            acc = torch.zeros_like(acc)
    if interval is None:
        return acc
    return (total + acc.float()).to(torch.float64)


# ------------------------------------------------------------------------------------------------
# the layer and the converter
# ------------------------------------------------------------------------------------------------


class FP8Linear(nn.Module):
    """A linear layer whose weight is stored in E4M3 with 128×128 block scales and whose input is quantised
    online in 1×128 tiles; the product is :func:`fp8_blockwise_matmul` (DeepSeek-V3 §3.3, Fig. 6/7).

    State: buffers ``weight_fp8 (out, in) float8_e4m3fn`` and ``weight_scale (ceil(out/block), ceil(in/block))
    float32``; parameter ``bias (out,) float32`` when ``bias`` (never quantised). Shapes ``(..., in) ->
    (..., out)``, float32 output. Build from a trained layer with :meth:`from_linear`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, block: int = 128):
        super().__init__()
        self.in_features, self.out_features, self.block = in_features, out_features, block
        self.register_buffer("weight_fp8", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn))
        self.register_buffer("weight_scale", torch.ones(-(-out_features // block), -(-in_features // block)))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, block: int = 128) -> FP8Linear:
        """Quantise ``linear.weight`` blockwise; copy the bias in float32; same device."""
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, block=block)
        m = m.to(linear.weight.device)
        q, s = quantize_weight_blocks(linear.weight.detach(), block)
        m.weight_fp8.copy_(q)
        m.weight_scale.copy_(s)
        if linear.bias is not None:
            with torch.no_grad():
                m.bias.copy_(linear.bias.detach().float())
        return m

    def dequantized_weight(self) -> Tensor:
        """``(out, in)`` float32 weight the layer effectively uses."""
        return dequantize_weight_blocks(self.weight_fp8, self.weight_scale, self.block)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"FP8Linear expects (..., {self.in_features}) inputs, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        qa, sa = quantize_act_tiles(x.reshape(-1, self.in_features), self.block)
        y = fp8_blockwise_matmul(qa, sa, self.weight_fp8, self.weight_scale, self.block)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}, block={self.block}"


def _shared_ptrs(model: nn.Module) -> set[int]:
    """``data_ptr``s of tensors that appear under more than one name (tied weights)."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[p.data_ptr()] = seen.get(p.data_ptr(), 0) + 1
    for _, b in model.named_buffers(remove_duplicate=False):
        seen[b.data_ptr()] = seen.get(b.data_ptr(), 0) + 1
    return {ptr for ptr, n in seen.items() if n > 1}


def convert_linears_to_fp8(model: nn.Module, skip: tuple[str, ...] = ("lm_head", "gate"), block: int = 128
                           ) -> nn.Module:
    """Replace, **in place**, every ``nn.Linear`` of ``model`` by :meth:`FP8Linear.from_linear` except

    * those whose last name component is in ``skip`` (``"lm_head"``, and ``"gate"``: a DeepSeek MoE router
      keeps full precision; ``"gate_proj"`` is not ``"gate"`` and is converted), and
    * those whose weight is shared with another module (a head tied to the embedding): converting would make
      a copy and silently break the tie.

    Embeddings, norms and every non-Linear module are untouched. Returns ``model``.
    """
    tied = _shared_ptrs(model)
    targets = []
    for _name, module in model.named_modules():
        for child_name, child in module.named_children():
            if type(child) is nn.Linear and child_name not in skip and child.weight.data_ptr() not in tied:
                targets.append((module, child_name, child))
    for parent, child_name, child in targets:
        setattr(parent, child_name, FP8Linear.from_linear(child, block))
    return model


# ------------------------------------------------------------------------------------------------
# analysis helpers (lesson and widgets)
# ------------------------------------------------------------------------------------------------


def rel_error(approx: Tensor, exact: Tensor) -> float:
    """Relative Frobenius error ``‖approx − exact‖ / ‖exact‖`` in float64."""
    a, e = approx.detach().to(torch.float64), exact.detach().to(torch.float64)
    return float((a - e).norm() / e.norm())


def outlier_errors(x: Tensor, factor: float, column: int = 7, tile: int = 128) -> dict:
    """Multiply ``x[:, column]`` by ``factor`` and quantise per tensor and per 1×``tile`` tile.

    Returns ``{"per_tensor", "per_tile"}``: the relative error of the **other** columns after the round trip.
    """
    x = x.float().clone()
    x[:, column] *= factor
    keep = torch.ones(x.shape[1], dtype=torch.bool)
    keep[column] = False
    qt, st = quantize_per_tensor(x)
    qa, sa = quantize_act_tiles(x, tile)
    return {"per_tensor": rel_error(dequantize_per_tensor(qt, st)[:, keep], x[:, keep]),
            "per_tile": rel_error(dequantize_act_tiles(qa, sa, tile)[:, keep], x[:, keep])}


@torch.no_grad()
def linear_layer_errors(model: nn.Module, converted: nn.Module, idx: Tensor) -> list[dict]:
    """Per-layer relative output error of every :class:`FP8Linear` of ``converted`` against the same-named
    ``nn.Linear`` of ``model`` on the same inputs (each layer's input recorded in ``model`` by forward hooks,
    so errors do not compound). Returns ``[{"name", "shape", "rel_error"}]`` in module order."""
    conv = dict(converted.named_modules())
    inputs, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(conv.get(name), FP8Linear):
            hooks.append(m.register_forward_hook(lambda mod, args, out, n=name: inputs.__setitem__(n, (args[0], out))))
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for name, (x, y) in inputs.items():
        rows.append({"name": name, "shape": tuple(conv[name].weight_fp8.shape),
                     "rel_error": rel_error(conv[name](x), y)})
    return rows


def fp8_bytes(n_params: int, block: int = 128) -> dict:
    """Weight memory for ``n_params`` values: ``{"fp32", "bf16", "fp8", "fp8_scales"}`` in bytes (scales: one
    float32 per ``block×block`` block, counted as ``4·n/block²``)."""
    return {"fp32": 4 * n_params, "bf16": 2 * n_params, "fp8": n_params, "fp8_scales": 4 * n_params / block ** 2}


@torch.no_grad()
def fp8_loss_delta(model: nn.Module, val_data: Tensor, n_batches: int, batch_size: int, context_length: int,
                   skip: tuple[str, ...] = ("lm_head", "gate"), seed: int = 0) -> dict:
    """Validation loss of ``model`` and of a deep copy converted by :func:`convert_linears_to_fp8` on the same
    ``n_batches`` batches (unit 10's :func:`~llmcourse.train.pretraining.estimate_loss`, seeds ``seed + i``).

    Returns ``{"val_loss", "val_loss_fp8", "delta"}`` (nats per token; ``delta = fp8 − fp32``) and leaves
    ``model`` unchanged.
    """
    import copy

    from ..train.pretraining import estimate_loss

    fp8 = convert_linears_to_fp8(copy.deepcopy(model), skip=skip)
    base = estimate_loss(model, val_data, batch_size, context_length, n_batches, seed=seed)
    low = estimate_loss(fp8, val_data, batch_size, context_length, n_batches, seed=seed)
    return {"val_loss": base, "val_loss_fp8": low, "delta": low - base}
