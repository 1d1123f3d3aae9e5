"""Bug catalog of unit 16 (FP8 quantisation): one known-wrong implementation per syllabus entry.

Quantisation mutants are named by matching the learner's scales or payloads on the failing probe
(``detect="mutant"``), or by a property of the payload (its dtype: E5M2; values no E4M3 pattern represents: a
float16 clamped to ±448). GEMM mutants are named by their products; the bias and tie mutants by structure (the
bias's dtype; the head read back after the embedding changed).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from llmcourse.quant.fp8 import (
    FP8Linear,
    fp8_blockwise_matmul,
    quantize_act_tiles,
    quantize_weight_blocks,
)

from ..core import bug_group

U = "16"
Q = f"{U}.quantize_blockwise"


def _tiles(x, tile, fmax=448.0, dtype=torch.float8_e4m3fn, inverted=False):
    M, K = x.shape
    nt = -(-K // tile)
    xp = F.pad(x.float(), (0, nt * tile - K)).view(M, nt, tile)
    s = xp.abs().amax(-1).clamp(min=1e-12) / fmax
    z = xp * s[..., None] if inverted else xp / s[..., None]
    q = z.clamp(-fmax, fmax).to(dtype) if dtype is not None else z.clamp(-fmax, fmax).half()
    return q.view(M, nt * tile)[:, :K].contiguous(), s


def _blocks(w, block, fmax=448.0, inverted=False):
    N, K = w.shape
    nb, kb = -(-N // block), -(-K // block)
    wp = F.pad(w.float(), (0, kb * block - K, 0, nb * block - N)).view(nb, block, kb, block)
    s = wp.abs().amax(dim=(1, 3)).clamp(min=1e-12) / fmax
    z = wp * s[:, None, :, None] if inverted else wp / s[:, None, :, None]
    q = z.clamp(-fmax, fmax).to(torch.float8_e4m3fn)
    return q.view(nb * block, kb * block)[:N, :K].contiguous(), s


# ---------------------------------------------------------------- scale_inverted: q = x·s, x̂ = q / s


def _q_act_inv(x, tile=128):
    return _tiles(x, tile, inverted=True)


def _q_w_inv(w, block=128):
    return _blocks(w, block, inverted=True)


def _dq_act_inv(q, s, tile=128):
    return q.float() / s.float().repeat_interleave(tile, 1)[:, :q.shape[1]]


def _dq_w_inv(q, s, block=128):
    N, K = q.shape
    return q.float() / s.float().repeat_interleave(block, 0)[:N].repeat_interleave(block, 1)[:, :K]


bug_group("B16.scale_inverted", Q, "The convention is q = x/s and x̂ = q·s: your s maps the other way.",
          {"quantize_act_tiles": _q_act_inv, "quantize_weight_blocks": _q_w_inv,
           "dequantize_act_tiles": _dq_act_inv, "dequantize_weight_blocks": _dq_w_inv})


# ---------------------------------------------------------------- per_tensor: one scale for the whole tensor


def _q_act_tensor(x, tile=128):
    M, K = x.shape
    s = x.float().abs().amax().clamp(min=1e-12) / 448.0
    q = (x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s.expand(M, -(-K // tile)).clone()


def _q_w_tensor(w, block=128):
    N, K = w.shape
    s = w.float().abs().amax().clamp(min=1e-12) / 448.0
    q = (w.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s.expand(-(-N // block), -(-K // block)).clone()


bug_group("B16.per_tensor", Q, "Scales are per 1×128 activation tile and per 128×128 weight block.",
          {"quantize_act_tiles": _q_act_tensor, "quantize_weight_blocks": _q_w_tensor})


# ---------------------------------------------------------------- tile_axis: activation tiles of 128 rows × 1 column


def _q_act_cols(x, tile=128):
    q, s = _tiles(x.T.contiguous(), tile)
    return q.T.contiguous(), s.T.contiguous()


def _dq_act_cols(q, s, tile=128):
    return q.float() * s.float().repeat_interleave(tile, 0)[:q.shape[0]]


bug_group("B16.tile_axis", Q, "Forward activation tiles run along K (per token, 128 channels).",
          {"quantize_act_tiles": _q_act_cols, "dequantize_act_tiles": _dq_act_cols})


# ---------------------------------------------------------------- fp16_as_fp8: float16 clamped to ±448


def _q_act_fp16(x, tile=128):
    return _tiles(x, tile, dtype=None)


bug_group("B16.fp16_as_fp8", Q, "Cast to `torch.float8_e4m3fn` to get real FP8 rounding.",
          {"quantize_act_tiles": _q_act_fp16}, detect="detector")


# ---------------------------------------------------------------- e5m2_forward


def _q_act_e5m2(x, tile=128):
    return _tiles(x, tile, fmax=57344.0, dtype=torch.float8_e5m2)


bug_group("B16.e5m2_forward", Q, "DeepSeek-V3 uses E4M3 for all tensors; fine-grained scales cover the range.",
          {"quantize_act_tiles": _q_act_e5m2}, detect="detector")


# ---------------------------------------------------------------- wrong_max: amax / 240


def _q_act_240(x, tile=128):
    return _tiles(x, tile, fmax=240.0)


def _q_w_240(w, block=128):
    return _blocks(w, block, fmax=240.0)


bug_group("B16.wrong_max", Q, "E4M3 (fn) saturates at 448.",
          {"quantize_act_tiles": _q_act_240, "quantize_weight_blocks": _q_w_240})


# ---------------------------------------------------------------- scales from a typical size, not the largest value


def _q_act_stat(x, tile=128, stat="mean"):
    M, K = x.shape
    n = math.ceil(K / tile)
    padded = torch.zeros(M, n * tile)
    padded[:, :K] = x.float()
    tiles = padded.view(M, n, tile)
    if stat == "mean":
        s = tiles.abs().mean(dim=2).clamp(min=1e-12) * 4 / 448.0
    else:
        s = (3 * tiles.std(dim=2)).clamp(min=1e-12) / 448.0
    q = (tiles / s.unsqueeze(2)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(M, n * tile)[:, :K].contiguous(), s


def _q_act_mean(x, tile=128):
    return _q_act_stat(x, tile, "mean")


def _q_act_3sigma(x, tile=128):
    return _q_act_stat(x, tile, "3sigma")


bug_group("B16.scale_from_mean", Q, "A tile's outliers are the values that matter most: with this scale, does "
          "every value of the tile stay inside E4M3's range?", {"quantize_act_tiles": _q_act_mean})
bug_group("B16.scale_from_sigma", Q, "A few standard deviations cover most of a tile, not all of it: which values "
          "saturate with this scale?", {"quantize_act_tiles": _q_act_3sigma})


# ---------------------------------------------------------------- the block-scaled GEMM


def _mm_mean(qa, sa, qw, sw, chunk=128, acc_bits=None):
    return (qa.float() @ qw.float().T) * sa.float().mean() * sw.float().mean()


def _mm_modulo(qa, sa, qw, sw, chunk=128, acc_bits=None):
    rows = torch.arange(qw.shape[0]) % sw.shape[0]          # block index wrapped instead of n // chunk
    return _mm_rows(qa, sa, qw, sw.float()[rows], chunk, acc_bits)


def _mm_rows(qa, sa, qw, sw_rows, chunk, acc_bits=None):
    """Per-chunk product with one weight scale row per output row (``sw_rows (N, n_chunks)``)."""
    from llmcourse.quant.fp8 import round_mantissa

    M, K = qa.shape
    y = torch.zeros(M, qw.shape[0])
    for c, k0 in enumerate(range(0, K, chunk)):
        part = qa[:, k0:k0 + chunk].float() @ qw[:, k0:k0 + chunk].float().T
        if acc_bits is not None:
            part = round_mantissa(part, acc_bits).float()
        y += part * sa[:, c, None] * sw_rows[None, :, c]
    return y


def _mm_dequant_first(qa, sa, qw, sw, chunk=128, acc_bits=None):
    """Dequantise both operands, one float32 matmul; the accumulator's rounding applied to the finished sum."""
    from llmcourse.quant.fp8 import dequantize_act_tiles, dequantize_weight_blocks, round_mantissa

    y = dequantize_act_tiles(qa, sa, chunk) @ dequantize_weight_blocks(qw, sw, chunk).T
    return y if acc_bits is None else round_mantissa(y, acc_bits).float()


def _mm_round_scaled(qa, sa, qw, sw, chunk=128, acc_bits=None):
    """Per chunk, but the rounding is applied after the scales (the accumulator never holds scaled values)."""
    from llmcourse.quant.fp8 import round_mantissa

    M, K = qa.shape
    N = qw.shape[0]
    sw_rows = sw.float().repeat_interleave(chunk, dim=0)[:N]
    y = torch.zeros(M, N)
    for c, k0 in enumerate(range(0, K, chunk)):
        part = (qa[:, k0:k0 + chunk].float() @ qw[:, k0:k0 + chunk].float().T) * sa[:, c, None] * sw_rows[None, :, c]
        y += part if acc_bits is None else round_mantissa(part, acc_bits).float()
    return y


bug_group("B16.mean_scales", f"{U}.fp8_blockwise_matmul",
          "Each K-chunk has its own scales; apply them per chunk before summing.", {"fp8_blockwise_matmul": _mm_mean})
bug_group("B16.block_index", f"{U}.fp8_blockwise_matmul", "Output row n belongs to block `n // 128`.",
          {"fp8_blockwise_matmul": _mm_modulo})
bug_group("B16.dequant_then_matmul", f"{U}.fp8_blockwise_matmul",
          "The limited accumulator holds one chunk's raw partial product: round and promote every chunk, not the "
          "finished sum.", {"fp8_blockwise_matmul": _mm_dequant_first}, detect="detector")
bug_group("B16.round_after_scaling", f"{U}.fp8_blockwise_matmul",
          "The accumulator holds the raw FP8 partial product; the scales are applied after promotion.",
          {"fp8_blockwise_matmul": _mm_round_scaled}, detect="detector")


# ---------------------------------------------------------------- FP8Linear with an FP8 bias


class _FP8LinearFP8Bias(FP8Linear):
    def __init__(self, in_features, out_features, bias=True, block=128):
        super().__init__(in_features, out_features, bias=False, block=block)
        del self.bias
        self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float8_e4m3fn) if bias else None)

    @classmethod
    def from_linear(cls, linear, block=128):
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, block=block)
        q, s = quantize_weight_blocks(linear.weight.detach(), block)
        m.weight_fp8.copy_(q)
        m.weight_scale.copy_(s)
        if linear.bias is not None:
            m.bias = linear.bias.detach().float().clamp(-448, 448).to(torch.float8_e4m3fn)
        return m

    def forward(self, x):
        lead = x.shape[:-1]
        qa, sa = quantize_act_tiles(x.reshape(-1, self.in_features), self.block)
        y = fp8_blockwise_matmul(qa, sa, self.weight_fp8, self.weight_scale, self.block)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.reshape(*lead, self.out_features)


bug_group("B16.bias_quantized", f"{U}.FP8Linear", "Keep the bias in float32.", {"FP8Linear": _FP8LinearFP8Bias},
          detect="detector")


# ---------------------------------------------------------------- converter that ignores ties


def _convert_ignoring_ties(model: nn.Module, skip=("lm_head", "gate")):
    targets = []
    for module in model.modules():
        for name, child in module.named_children():
            if type(child) is nn.Linear and name not in skip:
                targets.append((module, name, child))
    for parent, name, child in targets:
        setattr(parent, name, FP8Linear.from_linear(copy.deepcopy(child)))
    return model


bug_group("B16.tie_broken", f"{U}.convert_linears_to_fp8", "Skip tied and sensitive layers (head, embedding, router).",
          {"convert_linears_to_fp8": _convert_ignoring_ties}, detect="detector")
