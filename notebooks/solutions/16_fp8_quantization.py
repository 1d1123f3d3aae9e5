# %% [markdown]
# # Unit 16 — FP8 quantization: exercises
#
# Five graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: both FP8 formats against PyTorch's own types and all
# their bit patterns, payloads compared bit for bit on inputs with partial and all-zero tiles, products
# with partial chunks and another chunk width, error levels on a seeded product, the layer's `state_dict`,
# conversions of tied and untied tiny Llamas with custom `skip` lists, and the validation loss of the
# course's trained character Llama after conversion. When something fails it tells you what was expected,
# what came back, and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/16_fp8_quantization/16_fp8_quantization.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `math` and the standard library; later
# exercises may call your earlier ones.
#
# **Conventions.** FP8 tensors are `torch.float8_e4m3fn` (E4M3). A scale `s` maps real values to FP8 values:
# quantise `q = x / s`, dequantise `x̂ = q · s`; exercise 2 leaves the choice of `s` to you. Activations
# `x (M, K)` have one row per token; weights `w (N, K)` use the `nn.Linear` layout (out × in).

# %%
import math  # noqa: F401

import torch
import torch.nn.functional as F  # noqa: F401
from torch import nn

import llmcourse

cfg = llmcourse.setup_notebook("16")
E4M3 = torch.float8_e4m3fn

# %% [markdown]
# ## Exercise 1 — `fp8_info` (2 points)
#
# ```python
# def fp8_info(dtype: torch.dtype) -> dict: ...
# ```
#
# For `torch.float8_e4m3fn` and `torch.float8_e5m2`, return the dict with keys `exponent_bits`,
# `mantissa_bits`, `bias`, `max` (largest finite value), `min_normal` (smallest positive normal value),
# `min_subnormal` (smallest positive value), `eps` (gap between 1.0 and the next value) and `has_inf`
# (a `bool`). Derive the numbers from the bit layout (E4M3: 4 exponent and 3 mantissa bits, only the
# all-ones pattern of the top exponent is NaN, no infinities; E5M2: 5 and 2, IEEE-like: the top exponent
# holds ±inf and NaN). Any other dtype may raise `ValueError`.

# %% tags=["solution:16.fp8_info"]
def fp8_info(dtype):
    """Exponent/mantissa bits, bias, max, smallest normal and subnormal, eps, has_inf of an FP8 dtype."""
    ### BEGIN SOLUTION
    layouts = {torch.float8_e4m3fn: (4, 3, False), torch.float8_e5m2: (5, 2, True)}
    if dtype not in layouts:
        raise ValueError(f"not an FP8 dtype: {dtype}")
    e, m, ieee = layouts[dtype]
    bias = 2 ** (e - 1) - 1
    if ieee:   # the top exponent is reserved; largest mantissa 1.11..1
        largest = (2 - 2.0 ** -m) * 2.0 ** (2 ** e - 2 - bias)
    else:      # the top exponent is usable except its all-ones mantissa (NaN)
        largest = (2 - 2.0 ** (1 - m)) * 2.0 ** (2 ** e - 1 - bias)
    return {"exponent_bits": e, "mantissa_bits": m, "bias": bias, "max": largest,
            "min_normal": 2.0 ** (1 - bias), "min_subnormal": 2.0 ** (1 - bias - m), "eps": 2.0 ** -m,
            "has_inf": ieee}
    ### END SOLUTION


# %% tags=["tests:16.fp8_info"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("16.fp8_info")  # noqa: E702
### END HIDDEN TESTS
info = fp8_info(E4M3)
assert info["max"] == torch.finfo(E4M3).max, f"E4M3 max: expected {torch.finfo(E4M3).max}, got {info['max']}"
assert info["bias"] == 7 and info["has_inf"] is False, "E4M3: bias 7, no infinities"
every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e5m2).float()
assert fp8_info(torch.float8_e5m2)["min_subnormal"] == every[every > 0].min().item(), "E5M2 smallest positive value"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — tile and block quantisation (5 points)
#
# ```python
# def quantize_act_tiles(x: Tensor, tile: int = 128) -> tuple[Tensor, Tensor]: ...
# def quantize_weight_blocks(w: Tensor, block: int = 128) -> tuple[Tensor, Tensor]: ...
# def dequantize_act_tiles(q: Tensor, s: Tensor, tile: int = 128) -> Tensor: ...
# def dequantize_weight_blocks(q: Tensor, s: Tensor, block: int = 128) -> Tensor: ...
# ```
#
# - **Activations** `x (M, K)` float32: one scale per row and per `tile`-wide slice of K (a 1 × 128 tile).
#   Return `q (M, K)` `float8_e4m3fn` and `s (M, ceil(K/tile))` float32. **Your decision: the scale.** The
#   contract is the round trip `x̂ = q.float() · s`; choose `s` from the tile's own elements, stated as a property: no
#   value of the tile saturates, and the tile keeps as many of its values as it can among E4M3's normal numbers,
#   where the round trip is within 2⁻⁴ relative (the grader compares your scales and payloads bit for bit with
#   the one choice that does both), `q` the scaled tile cast to E4M3 (clamped to the format's
#   range first), and an all-zero tile gives zeros and a finite scale (floor its amax at 1e-12). The last tile
#   may be narrower; it uses only its own elements.
# - **Weights** `w (N, K)`: the same with one scale per `block × block` square, `s (ceil(N/block),
#   ceil(K/block))`; edge blocks may be partial.
# - **Dequantise**: `x̂ = q.float() · s` of the element's tile or block, float32, the input's shape.

# %% tags=["solution:16.quantize_blockwise"]
def quantize_act_tiles(x, tile=128):
    """x (M, K) -> q (M, K) float8_e4m3fn, s (M, ceil(K/tile)) float32."""
    ### BEGIN SOLUTION
    M, K = x.shape
    n = math.ceil(K / tile)
    padded = torch.zeros(M, n * tile)
    padded[:, :K] = x.float()
    tiles = padded.view(M, n, tile)
    s = tiles.abs().amax(dim=2).clamp(min=1e-12) / 448.0
    q = (tiles / s.unsqueeze(2)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(M, n * tile)[:, :K].contiguous(), s
    ### END SOLUTION


def quantize_weight_blocks(w, block=128):
    """w (N, K) -> q (N, K) float8_e4m3fn, s (ceil(N/block), ceil(K/block)) float32."""
    ### BEGIN SOLUTION
    N, K = w.shape
    nb, kb = math.ceil(N / block), math.ceil(K / block)
    padded = torch.zeros(nb * block, kb * block)
    padded[:N, :K] = w.float()
    blocks = padded.view(nb, block, kb, block)
    s = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (blocks / s[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(nb * block, kb * block)[:N, :K].contiguous(), s
    ### END SOLUTION


def dequantize_act_tiles(q, s, tile=128):
    """q (M, K) fp8, s (M, ceil(K/tile)) -> (M, K) float32."""
    ### BEGIN SOLUTION
    K = q.shape[1]
    return q.float() * s.float().repeat_interleave(tile, dim=1)[:, :K]
    ### END SOLUTION


def dequantize_weight_blocks(q, s, block=128):
    """q (N, K) fp8, s (ceil(N/block), ceil(K/block)) -> (N, K) float32."""
    ### BEGIN SOLUTION
    N, K = q.shape
    full = s.float().repeat_interleave(block, dim=0)[:N].repeat_interleave(block, dim=1)[:, :K]
    return q.float() * full
    ### END SOLUTION


# %% tags=["tests:16.quantize_blockwise"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("16.quantize_blockwise")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
x = torch.randn(4, 200)
q, s = quantize_act_tiles(x)
assert q.dtype == E4M3 and q.shape == (4, 200), f"q: expected float8_e4m3fn (4, 200), got {q.dtype} {tuple(q.shape)}"
assert s.shape == (4, 2), f"s: one scale per row and 128-wide tile -> (4, 2), got {tuple(s.shape)}"
assert q.float().abs().max() <= torch.finfo(E4M3).max, "no value may go beyond E4M3's largest finite value"
back = dequantize_act_tiles(q, s)
assert ((back - x).abs() <= x.abs() / 16 + 1e-3).all(), "round trip: within 2^-4 relative"
qw, sw = quantize_weight_blocks(torch.randn(300, 200) * 0.02)
assert sw.shape == (3, 2), f"weight scales for (300, 200): expected (3, 2), got {tuple(sw.shape)}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — the block-scaled GEMM (5 points)
#
# ```python
# def fp8_blockwise_matmul(qa: Tensor, sa: Tensor, qw: Tensor, sw: Tensor, chunk: int = 128,
#                          acc_bits: int | None = None) -> Tensor: ...
# ```
#
# `qa (M, K)`, `sa (M, ceil(K/chunk))` from `quantize_act_tiles(x, chunk)`; `qw (N, K)`,
# `sw (ceil(N/chunk), ceil(K/chunk))` from `quantize_weight_blocks(w, chunk)`. Return `y (M, N)` float32,
# an approximation of `x @ w.T`, computed chunk by chunk along K: the partial product of K-chunk `c`
# (FP8 values turned into float32) is multiplied by activation scale `sa[m, c]` of its row and by weight
# scale `sw[n // chunk, c]` of its output column, and the scaled partial products are summed in float32.
# The result equals the product of the two dequantised matrices up to float32 rounding.
#
# `acc_bits` is a coarse model of the tensor core's limited accumulator and its promotion (it rounds each chunk's
# exact sum once, where the hardware rounds after every addition inside the chunk): when it is an int, each chunk's raw
# partial product (the FP8 values' product, before any scale) is rounded to `acc_bits` significant bits with
# `llmcourse.quant.fp8.round_mantissa(partial, acc_bits)` (it returns float64: turn it back into float32) and only
# then scaled and added to the float32 sum. With `acc_bits=None` nothing is rounded.

# %% tags=["solution:16.fp8_blockwise_matmul"]
def fp8_blockwise_matmul(qa, sa, qw, sw, chunk=128, acc_bits=None):
    """(M, K) x (N, K) FP8 with per-tile/per-block scales -> (M, N) float32."""
    ### BEGIN SOLUTION
    from llmcourse.quant.fp8 import round_mantissa

    M, K = qa.shape
    N = qw.shape[0]
    w_scale_per_row = sw.float().repeat_interleave(chunk, dim=0)[:N]   # (N, chunks)
    y = torch.zeros(M, N)
    for c in range(math.ceil(K / chunk)):
        cols = slice(c * chunk, min(K, (c + 1) * chunk))
        part = qa[:, cols].float() @ qw[:, cols].float().T
        if acc_bits is not None:
            part = round_mantissa(part, acc_bits).float()
        y += part * sa[:, c].float().unsqueeze(1) * w_scale_per_row[:, c].unsqueeze(0)
    return y
    ### END SOLUTION


# %% tags=["tests:16.fp8_blockwise_matmul"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("16.fp8_blockwise_matmul")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
x, w = torch.randn(8, 300), torch.randn(260, 300) * 0.02
qa, sa = quantize_act_tiles(x)
qw, sw = quantize_weight_blocks(w)
y = fp8_blockwise_matmul(qa, sa, qw, sw)
assert y.shape == (8, 260) and y.dtype == torch.float32, f"expected float32 (8, 260), got {y.dtype} {tuple(y.shape)}"
ref = dequantize_act_tiles(qa, sa) @ dequantize_weight_blocks(qw, sw).T
rel = ((y - ref).norm() / ref.norm()).item()
assert rel < 1e-5, f"the block-scaled product must equal the dequantised product; relative gap {rel:.2e}"
print(f"relative error against float32: {((y - x @ w.T).norm() / (x @ w.T).norm()).item():.4f}")
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `FP8Linear` (5 points)
#
# ```python
# class FP8Linear(nn.Module):
#     def __init__(self, in_features: int, out_features: int, bias: bool = True, block: int = 128): ...
#     @classmethod
#     def from_linear(cls, linear: nn.Linear, block: int = 128) -> "FP8Linear": ...
#     def forward(self, x: Tensor) -> Tensor: ...
# ```
#
# State: **buffers** `weight_fp8 (out, in)` `float8_e4m3fn` and `weight_scale (ceil(out/block),
# ceil(in/block))` float32; a float32 **parameter** `bias (out,)` when `bias` is true (no `bias` key
# otherwise). `from_linear` quantises the linear layer's weight in `block × block` blocks and copies its
# bias. `forward` maps `(..., in)` to `(..., out)` float32: quantise the input in 1 × `block` tiles (per
# token), multiply with your block-scaled GEMM, add the bias.

# %% tags=["solution:16.FP8Linear"]
class FP8Linear(nn.Module):
    """A linear layer with an E4M3 weight (block scales) and online 1×block activation quantisation."""

    def __init__(self, in_features, out_features, bias=True, block=128):
        super().__init__()
        ### BEGIN SOLUTION
        self.in_features, self.out_features, self.block = in_features, out_features, block
        self.register_buffer("weight_fp8", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn))
        self.register_buffer("weight_scale", torch.ones(math.ceil(out_features / block),
                                                        math.ceil(in_features / block)))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        ### END SOLUTION

    @classmethod
    def from_linear(cls, linear, block=128):
        ### BEGIN SOLUTION
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, block=block)
        q, s = quantize_weight_blocks(linear.weight.detach(), block)
        layer.weight_fp8.copy_(q)
        layer.weight_scale.copy_(s)
        if linear.bias is not None:
            layer.bias.data.copy_(linear.bias.detach().float())
        return layer
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        rows = x.reshape(-1, self.in_features)
        qa, sa = quantize_act_tiles(rows, self.block)
        y = fp8_blockwise_matmul(qa, sa, self.weight_fp8, self.weight_scale, self.block)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)
        ### END SOLUTION


# %% tags=["tests:16.FP8Linear"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("16.FP8Linear")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
lin = nn.Linear(200, 300)
nn.init.normal_(lin.weight, std=0.02)
layer = FP8Linear.from_linear(lin)
keys = {k: v.dtype for k, v in layer.state_dict().items()}
assert keys == {"weight_fp8": E4M3, "weight_scale": torch.float32, "bias": torch.float32}, keys
x = torch.randn(2, 5, 200)
with torch.no_grad():
    y, ref = layer(x), lin(x)
assert y.shape == (2, 5, 300), f"expected (2, 5, 300), got {tuple(y.shape)}"
rel = ((y - ref).norm() / ref.norm()).item()
assert rel < 0.06, f"relative error against the float32 layer: {rel:.3f} (should be about 0.03)"
print(f"relative error against nn.Linear: {rel:.4f}")
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `convert_linears_to_fp8` (3 points)
#
# ```python
# def convert_linears_to_fp8(model: nn.Module, skip: tuple[str, ...] = ("lm_head", "gate")) -> nn.Module: ...
# ```
#
# In place: replace every `nn.Linear` of `model` by `FP8Linear.from_linear(...)` unless the last component
# of its name (`"gate"` in `"layers.1.mlp.gate"`) is in `skip`. Embeddings, norms and every other module stay as
# they are. Return `model`.
#
# **Your decision.** The converted model must stay the same model apart from precision: in a model whose head is
# tied to its embedding, changing `embed_tokens.weight` must still change the logits through the head after the
# conversion, **whatever `skip` says**. Decide which linear layers that rules out and how to recognise them.

# %% tags=["solution:16.convert_linears_to_fp8"]
def convert_linears_to_fp8(model, skip=("lm_head", "gate")):
    """Replace the eligible nn.Linear layers of model by FP8Linear, in place; returns model."""
    ### BEGIN SOLUTION
    uses = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[p.data_ptr()] = uses.get(p.data_ptr(), 0) + 1
    replace = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear and name not in skip and uses[child.weight.data_ptr()] == 1:
                replace.append((parent, name, child))
    for parent, name, child in replace:
        setattr(parent, name, FP8Linear.from_linear(child))
    return model
    ### END SOLUTION


# %% tags=["tests:16.convert_linears_to_fp8"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("16.convert_linears_to_fp8")  # noqa: E702
### END HIDDEN TESTS
from llmcourse.models.llama3 import Llama3Config, Llama3Model  # noqa: E402

torch.manual_seed(0)
model = Llama3Model(Llama3Config.preset("llama3-tiny")).eval()
ids = torch.randint(0, 65, (1, 16))
with torch.no_grad():
    before = model(ids)
convert_linears_to_fp8(model)
assert isinstance(model.layers[0].self_attn.q_proj, FP8Linear), "q_proj must become an FP8Linear"
assert isinstance(model.layers[0].mlp.gate_proj, FP8Linear), "'gate_proj' is not 'gate': convert it"
assert type(model.lm_head) is nn.Linear, "lm_head stays a Linear"
assert model.lm_head.weight is model.embed_tokens.weight, "the tie must survive"
with torch.no_grad():
    after = model(ids)
print(f"relative change of the logits: {((after - before).norm() / before.norm()).item():.4f}")
print("visible tests passed")
