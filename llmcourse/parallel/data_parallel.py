"""Data parallelism from scratch: every rank a copy of the model and a shard of the batch, gradients averaged.

With ``p`` ranks each computing the mean loss of its own ``B/p`` examples, the gradient of the whole batch's mean
loss is the **mean** of the ``p`` local gradients (equal shards). :class:`BucketedDataParallel` averages them the
way ``torch.nn.parallel.DistributedDataParallel`` does (Li et al. 2020, "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training", §3.2):

* the model's parameters and buffers are **broadcast from rank 0** at construction, so every replica starts equal;
* parameters are grouped into **buckets** of about ``bucket_cap_mb`` in reverse registration order (roughly the
  order in which backward produces their gradients);
* a hook fires when a parameter's gradient is accumulated (``register_post_accumulate_grad_hook``); when every
  gradient of a bucket is ready the bucket is flattened and all-reduced **asynchronously** while backward goes on;
* at the end of backward (a callback queued on the autograd engine) the pending all-reduces are awaited and each
  gradient is replaced by the average.

After ``loss.backward()`` every rank holds the same averaged gradients, so one optimizer step per rank keeps the
replicas identical. ``tests/test_unit18_parallel.py`` compares it with one process on the whole batch and with
``DistributedDataParallel``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["BucketedDataParallel", "attach_data_parallel", "broadcast_parameters", "average_gradients", "shard_batch"]


def shard_batch(batch: Tensor, rank: int, world_size: int) -> Tensor:
    """Rows ``rank·B/p … (rank+1)·B/p − 1`` of ``batch`` ``(B, ...)``.

    Raises:
        ValueError: ``B`` not divisible by ``world_size`` (unequal shards would weight examples unequally).
    """
    b = batch.shape[0]
    if b % world_size:
        raise ValueError(f"batch of {b} rows cannot be split evenly over {world_size} ranks")
    step = b // world_size
    return batch[rank * step:(rank + 1) * step]


@torch.no_grad()
def broadcast_parameters(module: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (``dist.broadcast`` of each tensor, in place)."""
    import torch.distributed as dist

    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src)


@torch.no_grad()
def average_gradients(module: nn.Module) -> None:
    """After ``backward``: replace every ``.grad`` by its mean over ranks (one ``all_reduce`` per parameter, the
    unbucketed baseline). Parameters without a gradient are skipped (the same ones on every rank, or the calls
    would not match)."""
    import torch.distributed as dist

    p = dist.get_world_size()
    for param in module.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad)
            param.grad.div_(p)


def attach_data_parallel(module: nn.Module, seed: int) -> None:
    """Make ``module`` a data-parallel replica on the default process group, in place (no wrapper, no buckets).

    1. rank 0's parameters and buffers are broadcast to every rank (replicas start equal even when each rank
       initialised its copy from a different seed);
    2. torch's global generator is seeded with ``seed + rank``: random draws after this call (dropout masks)
       differ between ranks and are reproducible;
    3. every trainable parameter gets a ``register_post_accumulate_grad_hook`` that all-reduces its ``.grad``
       and divides by the world size as soon as backward has accumulated it: after ``loss.backward()`` each
       ``.grad`` is the mean of the ranks' local gradients, with nothing to call afterwards.

    Every rank must call it on the same architecture, and every parameter must get a gradient in each backward
    (the hooks fire in the same order on every rank, so the all-reduces match).
    """
    import torch.distributed as dist

    broadcast_parameters(module)
    torch.manual_seed(seed + dist.get_rank())
    world_size = dist.get_world_size()

    def hook(param: Tensor) -> None:
        dist.all_reduce(param.grad)
        param.grad.div_(world_size)

    for param in module.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(hook)


class BucketedDataParallel(nn.Module):
    """Wrap ``module`` for data-parallel training on the default process group (the DDP recipe, from scratch).

    Args:
        module: the replica; its parameters are overwritten by rank 0's at construction.
        bucket_cap_mb: bucket size in MiB (DDP's default is 25); ``0`` puts every parameter in its own bucket.

    Attributes:
        buckets: list of lists of parameters (reverse registration order); ``last_bucket_calls``: number of
            all-reduces issued by the last backward (= ``len(buckets)``).

    ``forward`` is ``module``'s. Every trainable parameter must receive a gradient in every backward (as DDP
    with ``find_unused_parameters=False``); otherwise the end-of-backward check raises ``RuntimeError`` naming the
    parameters whose bucket never became ready.

    Raises:
        RuntimeError: no default process group.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0):
        super().__init__()
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("BucketedDataParallel needs torch.distributed.init_process_group first")
        self.module = module
        self.world_size = dist.get_world_size()
        broadcast_parameters(module)
        params = [p for p in module.parameters() if p.requires_grad]
        names = {id(p): n for n, p in module.named_parameters()}
        cap = bucket_cap_mb * 2**20
        self.buckets: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if not self.buckets or size + nbytes > cap:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._names = names
        self._ready: list[int] = [0] * len(self.buckets)
        self._pending: dict[int, tuple] = {}
        self._callback_queued = False
        self.last_bucket_calls = 0
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, param: Tensor) -> None:
        import torch.distributed as dist

        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        i = self._bucket_of[id(param)]
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]):
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            self._pending[i] = (flat, dist.all_reduce(flat, async_op=True))

    def _finish(self) -> None:
        missing = [self._names.get(id(p), "?") for i, b in enumerate(self.buckets) if i not in self._pending
                   for p in b]
        try:
            if missing:
                raise RuntimeError(f"these parameters received no gradient in this backward: {missing[:5]}")
            for i, (flat, work) in sorted(self._pending.items()):
                work.wait()
                flat.div_(self.world_size)
                offset = 0
                for p in self.buckets[i]:
                    n = p.numel()
                    p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                    offset += n
            self.last_bucket_calls = len(self._pending)
        finally:
            self._ready = [0] * len(self.buckets)
            self._pending = {}
            self._callback_queued = False
