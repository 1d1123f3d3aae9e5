"""A simulated FP8 *training* step in the style of DeepSeek-V3 (unit 16).

DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), §3.3 "FP8 Training": the three GEMMs of every large linear
layer run in FP8 (E4M3 for every tensor), each operand scaled in small groups computed online from the current
absolute maximum, ``s = amax / 448`` (§3.3.2, Fig. 7a). A group always lies along the GEMM's **contraction**
dimension, in chunks of 128, so that its scale can be applied to the chunk's partial product:

* **Fprop** ``y = x wᵀ`` (contracts the input channels K): the activation ``x (M, K)`` in **1×128** tiles (per
  token, per 128 channels), the weight ``w (N, K)`` in **128×128** blocks;
* **Dgrad** ``dx = dy w`` (contracts the output channels N): the output gradient ``dy (M, N)`` in **1×128**
  tiles (per token, per 128 output channels), the weight in the same 128×128 blocks (a square block serves
  ``w`` and ``wᵀ`` alike);
* **Wgrad** ``dw = dyᵀ x`` (contracts the tokens M): ``dy`` and ``x`` in **128×1** tiles (per channel, per 128
  tokens). The report stores the forward activation in FP8 with 1×128 tiles and converts it to 128×1 tiles for
  the backward pass (§3.3.3); here it is re-quantised from the float32 activation along the tokens.

What stays in higher precision, as in V3 (§3.3.1, §3.3.3): the master weights, the weight gradients and the
optimizer (here all float32; V3 keeps its AdamW moments in BF16), the embedding, the output head, the norms,
attention's softmax and the MoE router (``skip``). The products are *emulated*: each operand is quantised to
``torch.float8_e4m3fn`` with its scales (the exact bytes an FP8 GPU would hold), dequantised, and multiplied in
float32, which equals a per-chunk FP8 GEMM with float32 promotion up to float32 rounding
(:func:`~llmcourse.quant.fp8.fp8_blockwise_matmul`). No FP8 kernel is needed, and nothing is faster.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from .fp8 import (
    _AMAX_FLOOR,
    E4M3_MAX,
    _shared_ptrs,
    dequantize_act_tiles,
    dequantize_weight_blocks,
    quantize_act_tiles,
    quantize_weight_blocks,
)

__all__ = [
    "FP8TrainLinear",
    "convert_linears_for_fp8_training",
    "dequantize_tiles",
    "fp8_linear",
    "fp8_training_curves",
    "quantize_tiles",
]


def quantize_tiles(x: Tensor, dim: int, tile: int = 128) -> tuple[Tensor, Tensor]:
    """E4M3 quantisation of a 2-D ``x`` in groups of ``tile`` consecutive elements along ``dim``.

    ``dim=1``: 1×``tile`` tiles (one scale per row and per ``tile`` columns), exactly
    :func:`~llmcourse.quant.fp8.quantize_act_tiles`; ``dim=0``: ``tile``×1 tiles (one scale per column and per
    ``tile`` rows). The last group may be partial and uses only its own elements.

    Returns:
        ``q`` with ``x``'s shape, ``float8_e4m3fn``, and float32 scales ``s = max(amax, 1e-12) / 448``, shape
        ``(M, ceil(K/tile))`` for ``dim=1`` and ``(ceil(M/tile), K)`` for ``dim=0``.

    Raises:
        ValueError: ``x`` not 2-D, or ``dim`` not 0 or 1.
    """
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 or 1, got {dim}")
    if dim == 1:
        return quantize_act_tiles(x, tile)
    q, s = quantize_act_tiles(x.T, tile)
    return q.T, s.T


def dequantize_tiles(q: Tensor, s: Tensor, dim: int, tile: int = 128) -> Tensor:
    """Inverse of :func:`quantize_tiles` (float32, ``q``'s shape)."""
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 or 1, got {dim}")
    if dim == 1:
        return dequantize_act_tiles(q, s, tile)
    return dequantize_act_tiles(q.T, s.T, tile).T


_E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()   # the 256 codes' values


def _widen(q: Tensor) -> Tensor:
    """``q.float()`` for an E4M3 tensor, read from the 256-entry table (bit-identical; faster on a CPU)."""
    return torch.take(_E4M3_VALUES.to(q.device), q.view(torch.uint8).long())


def _fp8(x: Tensor, dim: int, tile: int) -> Tensor:
    """``dequantize_tiles(*quantize_tiles(x, dim, tile), dim, tile)`` in one pass, without transposed copies
    (the same values: same scales, same casts; ``tests/test_unit16_fp8_train.py`` compares the two)."""
    M, K = x.shape
    x = x.float()
    if dim == 1:
        nt = -(-K // tile)
        xp = torch.nn.functional.pad(x, (0, nt * tile - K)).view(M, nt, tile)
        s = xp.abs().amax(dim=2, keepdim=True).clamp(min=_AMAX_FLOOR) / E4M3_MAX
        q = (xp / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return (_widen(q) * s).view(M, nt * tile)[:, :K]
    nt = -(-M // tile)
    xp = torch.nn.functional.pad(x, (0, 0, 0, nt * tile - M)).view(nt, tile, K)
    s = xp.abs().amax(dim=1, keepdim=True).clamp(min=_AMAX_FLOOR) / E4M3_MAX
    q = (xp / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (_widen(q) * s).view(nt * tile, K)[:M]


class _FP8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, tile: int) -> Tensor:
        w_hat = dequantize_weight_blocks(*quantize_weight_blocks(weight.detach(), tile), tile)   # 128×128 blocks
        y = _fp8(x.detach(), 1, tile) @ w_hat.T                                               # x in 1×128 tiles
        if bias is not None:
            y = y + bias.detach()
        ctx.save_for_backward(x.detach(), w_hat)
        ctx.tile, ctx.has_bias = tile, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w_hat = ctx.saved_tensors
        tile = ctx.tile
        dy = dy.float()
        dx = _fp8(dy, 1, tile) @ w_hat                       # Dgrad: contracts N, dy in 1×128 tiles
        dw = _fp8(dy, 0, tile).T @ _fp8(x, 0, tile)         # Wgrad: contracts M, dy and x in 128×1 tiles
        db = dy.sum(0) if ctx.has_bias else None             # the bias gradient is a float32 sum
        return dx, dw, db, None


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, tile: int = 128) -> Tensor:
    """``x wᵀ + b`` with the three GEMMs of training quantised as DeepSeek-V3 does (module docstring).

    Args:
        x: ``(..., K)`` float32 input; weight ``(N, K)`` float32 (the master weight); bias ``(N,)`` or None.
        tile: the group width (128 in V3).

    Returns:
        ``(..., N)`` float32. Forward: ``Q₁ₓ₁₂₈(x) · Q₁₂₈ₓ₁₂₈(w)ᵀ + b``. Backward: ``dx = Q₁ₓ₁₂₈(dy) · Q₁₂₈ₓ₁₂₈(w)``,
        ``dw = Q₁₂₈ₓ₁(dy)ᵀ · Q₁₂₈ₓ₁(x)``, ``db = Σ dy`` (unquantised), where ``Q`` is quantise-then-dequantise with
        the named tiles (rows = tokens of the flattened ``x``). The gradients are those of the quantised
        products, not a straight-through copy of the float32 ones.
    """
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"fp8_linear: input (..., {x.shape[-1]}) does not match weight {tuple(weight.shape)}")
    lead = x.shape[:-1]
    y = _FP8LinearFunction.apply(x.reshape(-1, x.shape[-1]).float(), weight, bias, tile)
    return y.reshape(*lead, weight.shape[0])


class FP8TrainLinear(nn.Linear):
    """An ``nn.Linear`` whose forward and backward run through :func:`fp8_linear`. Its ``weight`` and ``bias``
    are ordinary float32 parameters (the master weights the optimizer updates); build it from a layer with
    :meth:`from_linear`, which **shares** that layer's parameters (no copy)."""

    tile: int = 128

    @classmethod
    def from_linear(cls, linear: nn.Linear, tile: int = 128) -> FP8TrainLinear:
        m = cls.__new__(cls)
        nn.Module.__init__(m)                      # no new parameters drawn: the global RNG is untouched
        m.in_features, m.out_features, m.tile = linear.in_features, linear.out_features, tile
        m.weight = linear.weight
        m.register_parameter("bias", linear.bias)
        return m

    def forward(self, x: Tensor) -> Tensor:
        return fp8_linear(x, self.weight, self.bias, self.tile)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tile={self.tile}"


def convert_linears_for_fp8_training(model: nn.Module, skip: tuple[str, ...] = ("lm_head", "gate"),
                                     tile: int = 128) -> nn.Module:
    """Replace, **in place**, every ``nn.Linear`` of ``model`` by :meth:`FP8TrainLinear.from_linear` (same
    parameter objects, so an optimizer built before or after sees the same tensors), except those whose last
    name component is in ``skip`` (the head and a MoE router, as V3) and those whose weight is shared with
    another module (a head tied to the embedding). Returns ``model``."""
    tied = _shared_ptrs(model)
    targets = [(module, name, child) for module in model.modules() for name, child in module.named_children()
               if type(child) is nn.Linear and name not in skip and child.weight.data_ptr() not in tied]
    for parent, name, child in targets:
        setattr(parent, name, FP8TrainLinear.from_linear(child, tile))
    return model


def fp8_training_curves(model: nn.Module, train_data: Tensor, val_data: Tensor, steps: int, batch_size: int,
                        context_length: int, lr_fn: Callable[[int], float], seed: int = 0, eval_batches: int = 4,
                        max_norm: float = 1.0, weight_decay: float = 0.1, progress: bool = False) -> dict:
    """Train a float32 copy and an FP8 copy of ``model`` (same initial weights) on identical batches.

    Step ``s`` of both runs uses ``get_batch(train_data, batch_size, context_length, Generator(seed + s))``, the
    learning rate ``lr_fn(s)`` and unit 10's ``train_step`` (AdamW from ``configure_optimizer``, clipping at
    ``max_norm``); the FP8 copy is converted with :func:`convert_linears_for_fp8_training` (default ``skip``).
    The runs alternate step by step. ``model`` itself is not changed.

    Returns:
        ``{"fp32": [loss per step], "fp8": [...], "val_fp32", "val_fp8"`` (``estimate_loss`` on ``eval_batches``
        validation batches, seeds ``10_000 + i``, float32 evaluation of each run's weights for fp32 and the FP8
        forward for fp8), ``"rel_gap"``: ``(val_fp8 − val_fp32) / val_fp32``, ``"converted"``: names of the FP8
        layers}.
    """
    from ..data.corpus import get_batch
    from ..train.optim import configure_optimizer
    from ..train.pretraining import EVAL_SEED, estimate_loss, train_step

    runs = {"fp32": copy.deepcopy(model), "fp8": convert_linears_for_fp8_training(copy.deepcopy(model))}
    opts = {k: configure_optimizer(m, lr_fn(0), weight_decay=weight_decay) for k, m in runs.items()}
    curves = {k: [] for k in runs}
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="fp32 and FP8 steps")
    for m in runs.values():
        m.train()
    for s in it:
        x, y = get_batch(train_data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
        for k, m in runs.items():
            loss, _ = train_step(m, opts[k], x, y, lr_fn(s), max_norm)
            curves[k].append(loss)
    val = {k: estimate_loss(m, val_data, batch_size, context_length, eval_batches, seed=EVAL_SEED)
           for k, m in runs.items()}
    converted = [n for n, mod in runs["fp8"].named_modules() if isinstance(mod, FP8TrainLinear)]
    return {"fp32": curves["fp32"], "fp8": curves["fp8"], "val_fp32": val["fp32"], "val_fp8": val["fp8"],
            "rel_gap": (val["fp8"] - val["fp32"]) / val["fp32"], "converted": converted}
