"""Tensor parallelism (Megatron-LM): one layer's weight matrices split over ranks.

Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism",
§3 and Fig. 3. With ``p`` ranks and ``Y = X·Wᵀ``:

* **column-parallel** (:class:`ColumnParallelLinear`): rank ``r`` holds rows ``r·out/p …`` of ``W`` (an
  ``(out/p, in)`` block, i.e. a block of output *columns* of ``Y``); input ``X`` replicated; output: the local
  ``(…, out/p)`` slice, no communication. Backward must **sum** ``∂L/∂X`` over ranks (Megatron's ``f``).
* **row-parallel** (:class:`RowParallelLinear`): rank ``r`` holds input columns ``r·in/p …`` (``(out, in/p)``);
  input: the local ``(…, in/p)`` slice; the partial products are **summed with one all-reduce** (Megatron's
  ``g``), and the bias is added once, after the sum (adding it on every rank before would give ``p·b``).

An MLP ``down(act(gate(x)) ⊙ up(x))`` splits with gate/up column-parallel and down row-parallel: the element-wise
``act`` and ``⊙`` need no communication, so :class:`TensorParallelSwiGLU` costs **one all-reduce forward and one
backward** per block (Megatron §3, "g" and "f").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["row_parallel_linear", "copy_to_tensor_parallel", "reduce_from_tensor_parallel", "ColumnParallelLinear",
           "RowParallelLinear", "TensorParallelSwiGLU", "tp_swiglu"]


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce (sum) forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        import torch.distributed as dist

        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def copy_to_tensor_parallel(x: Tensor) -> Tensor:
    """Enter a tensor-parallel region: ``x`` unchanged; its gradient is summed over ranks in backward."""
    return _CopyToTP.apply(x)


def reduce_from_tensor_parallel(x: Tensor) -> Tensor:
    """Leave a tensor-parallel region: the sum of ``x`` over ranks (one all-reduce); gradient passed through."""
    return _ReduceFromTP.apply(x)


def _split(size: int, world_size: int, what: str) -> int:
    if size % world_size:
        raise ValueError(f"{what} = {size} is not divisible by the tensor-parallel size {world_size}")
    return size // world_size


class ColumnParallelLinear(nn.Module):
    """``nn.Linear(in_features, out_features)`` with its output features split over ``world_size`` ranks.

    Args:
        in_features, out_features: the full layer's sizes; ``out_features`` divisible by ``world_size``.
        rank, world_size: this rank and the tensor-parallel size.
        bias: keep a bias shard ``(out/p,)``.
        gather_output: all-gather the slices into the full ``(…, out)`` output (default: keep the slice).
        device, dtype: of the parameters (as ``nn.Linear``); :meth:`from_linear` takes the full layer's.

    ``weight`` ``(out/p, in)`` = rows ``rank·out/p … (rank+1)·out/p − 1`` of the full weight. ``forward``:
    ``(…, in)`` replicated → ``(…, out/p)`` (or ``(…, out)`` gathered).

    Raises:
        ValueError: ``out_features`` not divisible by ``world_size``.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, world_size: int, bias: bool = True,
                 gather_output: bool = False, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.rank, self.world_size, self.gather_output = rank, world_size, gather_output
        self.local_out = _split(out_features, world_size, "out_features")
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(self.local_out, in_features, **kw))
        self.bias = nn.Parameter(torch.zeros(self.local_out, **kw)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world_size: int, gather_output: bool = False):
        """This rank's shard of a full ``nn.Linear`` (weights copied)."""
        m = cls(linear.in_features, linear.out_features, rank, world_size, linear.bias is not None, gather_output,
                device=linear.weight.device, dtype=linear.weight.dtype)
        rows = slice(rank * m.local_out, (rank + 1) * m.local_out)
        with torch.no_grad():
            m.weight.copy_(linear.weight[rows])
            if m.bias is not None:
                m.bias.copy_(linear.bias[rows])
        return m

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(copy_to_tensor_parallel(x), self.weight, self.bias)
        if not self.gather_output:
            return y
        import torch.distributed as dist

        parts = [torch.empty_like(y) for _ in range(self.world_size)]
        dist.all_gather(parts, y.contiguous())
        parts[self.rank] = y    # keep the local slice in the graph
        return torch.cat(parts, dim=-1)


class RowParallelLinear(nn.Module):
    """``nn.Linear(in_features, out_features)`` with its input features split over ``world_size`` ranks.

    ``weight`` ``(out, in/p)`` = columns ``rank·in/p …`` of the full weight; ``bias`` ``(out,)`` replicated and
    added **once**, after the all-reduce. ``forward``: the local input slice ``(…, in/p)`` → the full output
    ``(…, out)`` on every rank (one all-reduce).

    Raises:
        ValueError: ``in_features`` not divisible by ``world_size``.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, world_size: int, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.rank, self.world_size = rank, world_size
        self.local_in = _split(in_features, world_size, "in_features")
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in, **kw))
        self.bias = nn.Parameter(torch.zeros(out_features, **kw)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world_size: int):
        """This rank's shard of a full ``nn.Linear`` (weights copied)."""
        m = cls(linear.in_features, linear.out_features, rank, world_size, linear.bias is not None,
                device=linear.weight.device, dtype=linear.weight.dtype)
        cols = slice(rank * m.local_in, (rank + 1) * m.local_in)
        with torch.no_grad():
            m.weight.copy_(linear.weight[:, cols])
            if m.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def forward(self, x_local: Tensor) -> Tensor:
        y = reduce_from_tensor_parallel(F.linear(x_local, self.weight))
        return y + self.bias if self.bias is not None else y


def row_parallel_linear(x: Tensor, linear: nn.Linear, rank: int, world_size: int) -> Tensor:
    """``linear(x)`` computed row-parallel: rank ``r`` multiplies its input slice ``x[..., r·in/p : (r+1)·in/p]`` by
    the matching weight columns, one all-reduce sums the partial outputs, and the bias is added once, after it.

    Args:
        x: ``(…, in)`` (the same on every rank); linear: the full layer (the same on every rank).

    Returns:
        ``(…, out)`` on every rank, equal to ``linear(x)`` up to float rounding; differentiable: backward gives this
        rank the full layer's gradients for its input slice, its weight columns and the bias (the all-reduce's
        backward is the identity, Megatron's ``g``).

    Raises:
        ValueError: ``in_features`` not divisible by ``world_size``.
    """
    width = _split(linear.in_features, world_size, "in_features")
    cols = slice(rank * width, (rank + 1) * width)
    y = reduce_from_tensor_parallel(F.linear(x[..., cols], linear.weight[:, cols]))
    return y + linear.bias if linear.bias is not None else y


def tp_swiglu(x: Tensor, ff, rank: int, world_size: int) -> Tensor:
    """``ff(x)`` for unit 11's ``SwiGLUFeedForward`` ``ff``, computed tensor-parallel from this rank's shards only.

    Rank ``r`` uses rows ``r·h/p … (r+1)·h/p − 1`` of ``gate_proj.weight`` and ``up_proj.weight`` (column-parallel:
    its slice of the hidden features, from the whole ``x``) and the matching columns of ``down_proj.weight``
    (row-parallel). ``x`` enters through Megatron's ``f`` (identity forward, all-reduce of ``∂x`` backward); the
    partial outputs leave through ``g`` (all-reduce forward, identity backward): one all-reduce of ``(…, D)`` each
    way (Shoeybi et al. 2019, §3, Fig. 3a).

    Args:
        x: ``(…, D)``, the same on every rank; ff: the full block (the same on every rank).

    Returns:
        ``(…, D)`` on every rank, equal to ``ff(x)`` up to float rounding; backward gives every rank the full ``∂x``
        and its shards' gradients (rows of gate/up, columns of down) equal to the slices of the dense block's.

    Raises:
        ValueError: the hidden size not divisible by ``world_size``.
    """
    width = _split(ff.gate_proj.out_features, world_size, "hidden_dim")
    mine = slice(rank * width, (rank + 1) * width)
    x = copy_to_tensor_parallel(x)
    h = F.silu(F.linear(x, ff.gate_proj.weight[mine])) * F.linear(x, ff.up_proj.weight[mine])
    return reduce_from_tensor_parallel(F.linear(h, ff.down_proj.weight[:, mine]))


class TensorParallelSwiGLU(nn.Module):
    """Unit 11's SwiGLU MLP ``down_proj(silu(gate_proj(x)) ⊙ up_proj(x))`` split Megatron-style.

    ``gate_proj``/``up_proj``: :class:`ColumnParallelLinear` ``(D → hidden/p)``; ``down_proj``:
    :class:`RowParallelLinear` ``(hidden/p → D)``; all bias-free as in Llama. ``forward``: ``(…, D)`` replicated →
    ``(…, D)`` on every rank, equal to the full :class:`~llmcourse.models.llama3.SwiGLUFeedForward`; one all-reduce
    forward, one backward.

    Raises:
        ValueError: ``hidden_dim`` not divisible by ``world_size``.
    """

    def __init__(self, d_model: int, hidden_dim: int, rank: int, world_size: int):
        super().__init__()
        self.gate_proj = ColumnParallelLinear(d_model, hidden_dim, rank, world_size, bias=False)
        self.up_proj = ColumnParallelLinear(d_model, hidden_dim, rank, world_size, bias=False)
        self.down_proj = RowParallelLinear(hidden_dim, d_model, rank, world_size, bias=False)

    @classmethod
    def from_swiglu(cls, ff, rank: int, world_size: int):
        """This rank's shard of a full ``SwiGLUFeedForward`` ``ff`` (weights copied)."""
        m = cls(ff.gate_proj.in_features, ff.gate_proj.out_features, rank, world_size)
        m.gate_proj = ColumnParallelLinear.from_linear(ff.gate_proj, rank, world_size)
        m.up_proj = ColumnParallelLinear.from_linear(ff.up_proj, rank, world_size)
        m.down_proj = RowParallelLinear.from_linear(ff.down_proj, rank, world_size)
        return m

    def forward(self, x: Tensor) -> Tensor:
        x = copy_to_tensor_parallel(x)      # one backward all-reduce for both column-parallel maps
        gate = F.linear(x, self.gate_proj.weight)
        up = F.linear(x, self.up_proj.weight)
        return self.down_proj(F.silu(gate) * up)
