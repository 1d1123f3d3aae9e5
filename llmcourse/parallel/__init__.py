"""Training across processes with ``torch.distributed`` (unit 18): a launcher and the parallelisms, from scratch.

* :mod:`.launcher` -- :func:`launch`/:func:`run_ranks`: a function on ``N`` gloo ranks on 127.0.0.1, with a
  timeout, each rank's result or error (with the collective it was in).
* :mod:`.collectives` -- communication volume of the collectives (ring all-reduce ``2(p−1)/p·n``), the ring
  all-reduce schedule and a point-to-point implementation, a bandwidth measurement.
* :mod:`.data_parallel` -- :class:`BucketedDataParallel` (gradients averaged in buckets from backward hooks).
* :mod:`.zero` -- :class:`ZeRO1AdamW` (optimizer state sharded: reduce-scatter + all-gather) and the ZeRO memory
  formula.
* :mod:`.tensor_parallel` -- Megatron's column/row-parallel linear layers and :class:`TensorParallelSwiGLU`.
* :mod:`.pipeline` -- pipeline schedules (GPipe, 1F1B) simulated: bubble fraction and activations held.
* :mod:`.expert_parallel` -- :class:`ExpertParallelMoE` (DeepSeekMoE's experts over ranks, all-to-all
  dispatch/combine) and :func:`dispatch_counts`.
"""

from .collectives import (
    collective_bytes_per_rank,
    measure_all_reduce,
    ring_all_reduce,
    ring_all_reduce_schedule,
    ring_all_reduce_volume,
)
from .data_parallel import (
    BucketedDataParallel,
    attach_data_parallel,
    average_gradients,
    broadcast_parameters,
    shard_batch,
)
from .expert_parallel import ExpertParallelMoE, all_to_all_rows, dispatch_counts, expert_parallel_moe
from .launcher import COLLECTIVES, RankFailure, RankResult, free_port, launch, run_ranks, run_torchrun_entry
from .pipeline import bubble_fraction, simulate_pipeline
from .tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelSwiGLU,
    copy_to_tensor_parallel,
    reduce_from_tensor_parallel,
    row_parallel_linear,
    tp_swiglu,
)
from .zero import ZeRO1AdamW, shard_range, zero_memory_per_rank

__all__ = [
    "COLLECTIVES", "BucketedDataParallel", "ColumnParallelLinear", "ExpertParallelMoE", "RankFailure", "RankResult",
    "RowParallelLinear", "TensorParallelSwiGLU", "ZeRO1AdamW", "all_to_all_rows", "attach_data_parallel",
    "average_gradients", "expert_parallel_moe", "row_parallel_linear",
    "broadcast_parameters", "bubble_fraction", "collective_bytes_per_rank", "copy_to_tensor_parallel", "dispatch_counts", "free_port",
    "launch", "measure_all_reduce", "reduce_from_tensor_parallel", "ring_all_reduce", "ring_all_reduce_schedule",
    "ring_all_reduce_volume", "run_ranks", "run_torchrun_entry", "shard_batch", "shard_range", "simulate_pipeline", "tp_swiglu",
    "zero_memory_per_rank",
]
