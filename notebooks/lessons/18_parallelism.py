# %% [markdown]
# # Unit 18 — Beyond one machine: data, tensor and expert parallelism
#
# DeepSeek-V3 was trained on thousands of GPUs, and a large part of its technical report is about how the work was
# split between them. Every model of this course so far ran in one process. This lesson runs the same kind of models in
# **several processes that talk to each other** with PyTorch's own distributed engine, `torch.distributed`: not a
# simulation, real process groups started on this CPU with the `gloo` backend and messages over the loopback
# network (127.0.0.1). The same code is written to run on GPUs across machines with `torchrun` and the `nccl`
# backend (every buffer it makes follows the device of the tensors it is given, and each rank picks its GPU before
# joining), but the course has only run it on CPUs with `gloo`: on GPUs it is untested.
#
# 1. collectives (all-reduce, all-gather, reduce-scatter, broadcast, all-to-all) on real tensors, their traffic,
#    and the bandwidth of this machine;
# 2. data parallelism from scratch, against one process and against `DistributedDataParallel`;
# 3. sharded optimizer state (ZeRO stage 1) and its memory per rank; ZeRO-2/3, and FSDP measured on the ranks;
# 4. tensor parallelism (Megatron) for unit 11's SwiGLU block;
# 5. expert parallelism for unit 14's DeepSeekMoE, and how node-limited routing bounds the traffic;
# 6. what the DeepSeek-V3 report adds: pipelines (GPipe and 1F1B simulated), DualPipe, and why it trains without
#    tensor parallelism.
#
# The finished pieces come from `llmcourse.parallel`. The exercise notebook
# (`exercises/18_parallelism/18_parallelism.ipynb`) asks you to write several of them yourself.

# %%
import math
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.models.deepseek_moe import DeepSeekMoE
from llmcourse.models.llama3 import SwiGLUFeedForward
from llmcourse.parallel import (
    BucketedDataParallel,
    ExpertParallelMoE,
    TensorParallelSwiGLU,
    ZeRO1AdamW,
    collective_bytes_per_rank,
    dispatch_counts,
    launch,
    measure_all_reduce,
    ring_all_reduce,
    ring_all_reduce_volume,
    shard_batch,
    simulate_pipeline,
    zero_memory_per_rank,
)
from llmcourse.viz import parallel as viz
from torch.distributed.fsdp import fully_shard     # imported once here, so the forked ranks inherit it

cfg = llmcourse.setup_notebook("18")
P = cfg["world_size"]                # ranks started by this lesson
TIMEOUT = cfg["rank_timeout_s"]
cfg

# %% [markdown]
# ## 1. Ranks and collectives
#
# A **process group** is a set of processes, the **ranks** `0 … p−1`, that can exchange tensors. `launch(fn, p)`
# starts `p` processes on this machine, joins them into one group (each calls
# `dist.init_process_group("gloo", rank=…, world_size=p)` through a rendezvous on a free local port), runs
# `fn(rank, world_size)` in every one of them, and brings back each rank's return value, what it printed, and the
# collectives it called. It never hangs: a rank still running at the timeout is killed and reported.
#
# A **collective** is a call that every rank of the group makes together. Here are the ones that parallel
# training is built from, each rank starting with its own small tensor:

# %%
def collectives_demo(rank, world_size):
    mine = torch.arange(4.0) + 10 * rank                      # rank r holds [10r, 10r+1, 10r+2, 10r+3]
    print(f"start          {mine.tolist()}")
    t = mine.clone()
    dist.all_reduce(t)                                         # every rank: the element-wise sum
    print(f"all_reduce     {t.tolist()}")
    gathered = torch.empty(4 * world_size)
    dist.all_gather_single(gathered, mine)                # every rank: all tensors, in rank order
    print(f"all_gather     {gathered.tolist()}")
    share = torch.empty(4 // world_size)
    dist.reduce_scatter_single(share, mine.clone())            # rank r: the sum of everyone's r-th slice
    print(f"reduce_scatter {share.tolist()}")
    b = mine.clone()
    dist.broadcast(b, src=0)                                   # every rank: rank 0's tensor
    print(f"broadcast      {b.tolist()}")
    swapped = torch.empty(4)
    dist.all_to_all_single(swapped, mine)                      # rank r's slice j goes to rank j
    print(f"all_to_all     {swapped.tolist()}")
    return t


def show_ranks(results):
    for res in results:
        print(f"--- rank {res.rank}" + ("" if res.ok else f" FAILED: {res.describe()}"))
        print(res.output, end="")


demo = launch(collectives_demo, P, timeout_s=TIMEOUT)
show_ranks(demo)

# %% [markdown]
# Read the table rank by rank: **all-reduce** leaves the same sum everywhere; **all-gather** concatenates;
# **reduce-scatter** sums and leaves each rank one slice of the sum (an all-reduce, cut in `p` pieces);
# **broadcast** copies one rank's tensor to all; **all-to-all** transposes: slice `j` of rank `i` becomes slice `i`
# of rank `j`. The launcher also recorded the calls each rank made:

# %%
print("\n".join(demo[0].calls))

# %% [markdown]
# ### What a collective costs: the ring
#
# How does an all-reduce move the data? The classic bandwidth-optimal answer is a **ring**: cut each rank's tensor
# into `p` chunks; in `p − 1` *reduce-scatter* steps every rank passes one chunk to its right neighbour, which adds
# it to its own; after them each rank owns one fully summed chunk. In `p − 1` *all-gather* steps the finished
# chunks travel once more around the ring. Each rank sends one chunk of `n/p` per step, so
#
# $$\text{bytes sent per rank} = 2\,\frac{p-1}{p}\,n,$$
#
# which stays below `2n` however many ranks join: the **bandwidth** term does not grow with `p`. Step through it
# (the play button animates it; each cell counts how many ranks' contributions the chunk already holds):

# %% tags=["nbval-ignore-output"]
viz.show_ring_all_reduce(4)

# %% [markdown]
# That is only half of the cost. The ring takes `2(p − 1)` steps **one after another**, and each step is a message
# that pays a start-up latency `α` however small it is. In the α–β model (Thakur, Rabenseifner and Gropp 2005) a
# message of `m` bytes costs `α + m·β` (`β` = seconds per byte), so a ring all-reduce of `n` bytes takes
#
# $$T_	ext{ring} = 2(p-1)\,lpha + 2\,rac{p-1}{p}\,n\,eta .$$
#
# The latency term grows linearly with `p`; the bandwidth term does not. They are equal at `n* = p·α/β`: below that
# size the ring is latency-bound. With illustrative inter-node numbers (microseconds per message, tens of GB/s):

# %%
alpha, beta = 2e-6, 1 / 25e9                       # illustrative: 2 µs per message, 25 GB/s per link
for p_ring in (8, 64, 1024):
    crossover = p_ring * alpha / beta
    for n_bytes in (1e6, 100e6):
        lat, bw = 2 * (p_ring - 1) * alpha, ring_all_reduce_volume(n_bytes, p_ring) * beta
        print(f"p = {p_ring:5d}, n = {n_bytes / 1e6:5.0f} MB: latency {lat * 1e3:7.3f} ms, bandwidth "
              f"{bw * 1e3:6.3f} ms -> {'latency' if lat > bw else 'bandwidth'}-bound (n* = {crossover / 1e6:.1f} MB)")
assert 8 * alpha / beta < 1e6 < 64 * alpha / beta   # the same 1 MB: bandwidth-bound on 8 ranks, latency-bound on 64

# %% [markdown]
# So data parallelism scales in bandwidth, and pays in latency as the ring grows: that is why gradients travel in
# large **buckets** (few big messages, below) and why libraries such as NCCL switch to tree algorithms, with
# `O(log p)` sequential steps, for small messages or many ranks.
#
# The library's `ring_all_reduce` runs exactly this schedule with point-to-point messages (`dist.isend`/`irecv`).
# On real ranks it gives `dist.all_reduce`'s result:

# %%
def ring_vs_builtin(rank, world_size):
    x = torch.randn(12 * world_size, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    ours = ring_all_reduce(x.clone())
    ref = x.clone()
    dist.all_reduce(ref)
    return (ours - ref).abs().max().item()


diffs = [res.value for res in launch(ring_vs_builtin, P, timeout_s=TIMEOUT)]
print("max |ring − dist.all_reduce| per rank:", diffs)
assert max(diffs) < 1e-12

# %% [markdown]
# Per-rank traffic of each collective for a tensor of `n` bytes (bandwidth-optimal algorithms):

# %%
n_mb = 100
for name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
    row = ", ".join(f"p={p}: {collective_bytes_per_rank(name, n_mb, p):.1f} MB" for p in (2, 8, 64, 1024))
    print(f"{name:15s} {row}")

# %% [markdown]
# ### Bandwidth of this machine
#
# Now measure it. Each rank all-reduces a tensor of growing size; the time of the fastest of a few calls gives the
# **bus bandwidth**, the bytes each rank sent (`2(p−1)/p · n`) per second. Over loopback the "network" is memory
# copies through the kernel, so these numbers say more about this CPU than about a cluster, whose NVLink and
# InfiniBand links are built for far higher rates.

# %% tags=["nbval-ignore-output"]
def bandwidth(rank, world_size, numels, repeats):
    return [measure_all_reduce(n, repeats) for n in numels]


bw = launch(bandwidth, P, cfg["bandwidth_numels"], cfg["bandwidth_repeats"], timeout_s=TIMEOUT)[0].value
print(f"{'tensor':>10s} {'sent per rank':>14s} {'time':>10s} {'bus bandwidth':>14s}")
for m in bw:
    print(f"{m['bytes'] / 2**20:8.2f} MiB {m['sent_bytes'] / 2**20:11.2f} MiB {m['seconds'] * 1e3:8.2f} ms "
          f"{m['bus_bandwidth'] / 1e9:10.2f} GB/s")
best = max(bw, key=lambda m: m["bus_bandwidth"])
print(f"\nlargest tensor: {bw[-1]['bytes'] / 2**20:.1f} MiB, {bw[-1]['sent_bytes'] / 2**20:.1f} MiB sent per rank = "
      f"2(p−1)/p · n = {ring_all_reduce_volume(bw[-1]['bytes'], P) / 2**20:.1f} MiB; best bus bandwidth "
      f"{best['bus_bandwidth'] / 1e9:.2f} GB/s. Small tensors are dominated by latency, not bandwidth.")

# %% [markdown]
# ### Same code, other launchers
#
# `launch` forks the ranks from this notebook (fast, and notebook functions work). `torchrun` starts fresh
# interpreters instead, which import the rank's function from a file. `launch(..., start_method="spawn")` does the
# same; here the function lives in a module this notebook writes to a temporary folder:

# %%
module_dir = tempfile.mkdtemp()
with open(os.path.join(module_dir, "u18_ranks.py"), "w") as fh:
    fh.write("import torch\nimport torch.distributed as dist\n\n"
             "def hello(rank, world_size):\n"
             "    t = torch.tensor([float(rank)])\n"
             "    dist.all_reduce(t)\n"
             "    print(f'rank {rank} of {world_size}: sum of ranks = {t.item():g}')\n"
             "    return t.item()\n")
sys.path.insert(0, module_dir)
import u18_ranks  # noqa: E402

start = "spawn" if cfg["spawn_demo"] else "fork"
show_ranks(launch(u18_ranks.hello, P, timeout_s=TIMEOUT, start_method=start))
print(f"(start method: {start}; spawn re-imports torch in every rank, so the ci profile forks)")

# %% [markdown]
# On a GPU cluster the file would end with `llmcourse.parallel.run_torchrun_entry(hello)` and be started as
# `torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint <host>:29500 u18_ranks.py` on each machine: torchrun sets
# `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`, and `nccl` replaces `gloo`. Nothing else should change,
# since each rank calls `torch.cuda.set_device(LOCAL_RANK)` and the library allocates on the parameters' device; the
# course has not run it on GPUs, so treat that path as untested.
#
# ## 2. Data parallelism
#
# Every rank holds a full copy of the model and a different shard of the batch. If the loss is the mean over the
# batch and the shards are equal, the whole batch's gradient is the **mean** of the ranks' gradients. So: compute
# local gradients, all-reduce them, divide by `p`, step. `DistributedDataParallel` (DDP) does this with two
# refinements that `BucketedDataParallel` copies: gradients are grouped in **buckets** all-reduced as soon as
# backward has produced every gradient of the bucket (communication overlaps the rest of backward), and rank 0's
# weights are **broadcast** at the start, so the replicas begin equal.
#
# Three runs of two SGD steps with the same data: one process on the whole batch, `BucketedDataParallel` on `p`
# ranks (each rank initialised with a different seed: the broadcast fixes it), and PyTorch's DDP on `p` ranks.

# %%
B = cfg["batch_size"]
X = torch.randn(B, 16, generator=torch.Generator().manual_seed(0))
Y = torch.randn(B, 4, generator=torch.Generator().manual_seed(1))


def make_mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def sgd_run(model, x, y, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def dp_rank(rank, world_size, steps):
    x, y = shard_batch(X, rank, world_size), shard_batch(Y, rank, world_size)
    ours = BucketedDataParallel(make_mlp(seed=rank), bucket_cap_mb=0.002)
    w_ours = sgd_run(ours, x, y, steps)
    theirs = nn.parallel.DistributedDataParallel(make_mlp(seed=rank))
    w_ddp = sgd_run(theirs, x, y, steps)
    print(f"{len(ours.buckets)} buckets, {ours.last_bucket_calls} all-reduces in the last backward")
    return w_ours, w_ddp


steps = cfg["train_steps"]
single = sgd_run(make_mlp(seed=0), X, Y, steps)
dp = launch(dp_rank, P, steps, timeout_s=TIMEOUT)
show_ranks(dp)
for res in dp:
    ours, ddp = res.value
    print(f"rank {res.rank}: |ours − one process| = {(ours - single).abs().max():.2e}, "
          f"|DDP − one process| = {(ddp - single).abs().max():.2e}")
assert all((r.value[0] - single).abs().max() < 1e-5 and (r.value[1] - single).abs().max() < 1e-5 for r in dp)

# %% [markdown]
# Equal within float32 rounding: summing in another order is all that differs. Two details matter in practice.
# Random numbers: if every rank seeds its generator identically, dropout draws the same masks on every rank. That
# is a choice, not an error: Megatron-LM's data-parallel ranks share their dropout seed by default, and since each
# rank sees different examples, the same mask on different examples is still a valid random mask. It matters when
# the ranks' examples are correlated, or when you want the data-parallel run to be one process on the whole batch
# with independent masks per example, as here; then seed each rank differently (from the run's seed and the rank,
# so the run can be repeated), *after* making the weights equal. Within tensor parallelism the opposite holds:
# ranks that hold slices of the same activation need the same mask where the activation is replicated. And every
# rank must call the same collectives in the same order: a rank that skips one leaves the others waiting.
#
# ### Spot the bug: averaging over unequal shards
#
# The loss reported by a data-parallel run is often averaged with `all_reduce(local_mean) / p`. That is the mean of
# the batch only when every rank has the same number of examples. Here rank `r` holds `3 + 2r` values:

# %%
def global_mean_buggy(local):
    m = local.mean().reshape(1)
    dist.all_reduce(m)
    return m / dist.get_world_size()


def unequal_values(rank):
    return torch.arange(3.0 + 2 * rank) * (rank + 1)


def run_mean(fn):
    def body(rank, world_size):
        return fn(unequal_values(rank)).item()
    return [res.value for res in launch(body, P, timeout_s=TIMEOUT)]


true_mean = torch.cat([unequal_values(r) for r in range(P)]).mean().item()
print(f"mean over all {sum(3 + 2 * r for r in range(P))} values: {true_mean:.4f}; "
      f"mean of the ranks' means: {run_mean(global_mean_buggy)}")

# %% [markdown]
# **Your fix.** Rewrite `global_mean` so that every rank gets the mean over all values of all ranks, whatever the
# shard sizes (one or two all-reduces), then run the self-check.

# %%
def global_mean(local):
    # TODO: weight each rank by its number of values
    m = local.mean().reshape(1)
    dist.all_reduce(m)
    return m / dist.get_world_size()


def self_check_global_mean(fn=None):
    got = run_mean(fn or global_mean)
    ok = all(v is not None and abs(v - true_mean) < 1e-5 for v in got)
    print("✓ every rank gets the mean over all values" if ok else f"✗ not yet: ranks got {got}, expected {true_mean:.4f}")
    return ok


self_check_global_mean();

# %% jupyter={"source_hidden": true}
# Reference fix: all-reduce the sum and the count together, then divide.
def global_mean_fixed(local):
    both = torch.stack([local.sum(), torch.tensor(float(local.numel()))])
    dist.all_reduce(both)
    return both[0] / both[1]


assert self_check_global_mean(global_mean_fixed)

# %% [markdown]
# ## 3. Sharding the optimizer state: ZeRO stage 1
#
# AdamW keeps two moments per parameter. In plain data parallelism every rank stores all of them, `p` identical
# copies. ZeRO-1 (Rajbhandari et al. 2020) gives each rank the moments of **one `1/p` share** of the (flattened)
# parameters. A step: *reduce-scatter* the gradients (each rank receives the mean of its share: half the traffic of
# an all-reduce), AdamW on the share, *all-gather* the updated parameters. Total traffic: one all-reduce's worth.
# `ZeRO1AdamW` does it; the oracle is `torch.optim.AdamW` on the whole batch in one process.

# %%
def adam_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(16, 24), nn.GELU(), nn.Linear(24, 4))


def zero_rank(rank, world_size, steps):
    model = adam_model()
    opt = ZeRO1AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x, y = shard_batch(X, rank, world_size), shard_batch(Y, rank, world_size)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), opt.state_bytes()


ref = adam_model()
adamw = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
for _ in range(steps):
    adamw.zero_grad()
    F.mse_loss(ref(X), Y).backward()
    adamw.step()
ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
psi = ref_flat.numel()
zero = launch(zero_rank, P, steps, timeout_s=TIMEOUT)
plain_state = sum(v.numel() * v.element_size() for s in adamw.state.values() for v in s.values() if v.dim() > 0)
for res in zero:
    flat, state_bytes = res.value
    print(f"rank {res.rank}: |ZeRO-1 − AdamW| = {(flat - ref_flat).abs().max():.2e}; optimizer state "
          f"{state_bytes:,} bytes (plain AdamW on every rank: {plain_state:,})")
formula = zero_memory_per_rank(psi, P, stage=1, param_bytes=4, grad_bytes=4, optimizer_bytes=8)
print(f"Ψ = {psi:,} parameters, p = {P}: model states per rank by the ZeRO formula 4Ψ + 4Ψ + 8Ψ/p = {formula:,.0f} "
      f"bytes, of which optimizer state 8Ψ/p = {8 * psi / P:,.0f} (+ padding to a multiple of p)")
assert all((r.value[0] - ref_flat).abs().max() < 1e-5 for r in zero)

# %% [markdown]
# At scale the saving is what makes training fit. The ZeRO paper's own example uses mixed-precision Adam: 16-bit
# weights and gradients, plus fp32 master weights and both moments (`K` bytes per parameter); the cell prints its
# model size, GPU count and the memory per GPU of each stage:

# %%
zero_example = {"parameters": 7.5e9, "gpus": 64, "K": 12}          # the ZeRO paper's worked example
print(f"{zero_example['parameters'] / 1e9:g} billion parameters on {zero_example['gpus']} GPUs, 2 + 2 + K = "
      f"{4 + zero_example['K']} bytes of model state per parameter:")
for stage, what in enumerate(["plain data parallel", "ZeRO-1: optimizer state", "ZeRO-2: + gradients",
                              "ZeRO-3: + parameters"]):
    gb = zero_memory_per_rank(zero_example["parameters"], zero_example["gpus"], stage,
                              optimizer_bytes=zero_example["K"]) / 1e9
    print(f"stage {stage} ({what:24s}): {gb:6.1f} GB per GPU")

# %% [markdown]
# ### ZeRO-2, ZeRO-3 and FSDP
#
# The formula behind those four lines, for `Ψ` parameters on `N_d` data-parallel ranks with 16-bit weights (`2Ψ`
# bytes), 16-bit gradients (`2Ψ`) and `KΨ` of optimizer state (`K = 12` for mixed-precision Adam: fp32 master
# weights, momentum and variance), is `2Ψ + 2Ψ + KΨ` per rank without ZeRO, and each stage divides one more term by
# `N_d`:
#
# - **ZeRO-1** shards the optimizer state: `2Ψ + 2Ψ + KΨ/N_d`.
# - **ZeRO-2** shards the gradients too: after the reduce-scatter a rank needs only its share of the averaged
#   gradient, so it frees the rest bucket by bucket during the backward pass: `2Ψ + (2 + K)Ψ/N_d`, for the same
#   traffic as ZeRO-1.
# - **ZeRO-3** shards the parameters too: a layer's full weights exist only while it runs. Each layer's shards are
#   all-gathered just before its forward, freed after it, all-gathered again for its backward, and its gradient is
#   reduce-scattered: `(2 + 2 + K)Ψ/N_d`, for three collectives of `Ψ` per step instead of two (1.5× the traffic
#   of data parallelism).
#
# The cell computes each stage from that formula and checks it against `zero_memory_per_rank`, which printed the
# lines above:

# %%
psi_ex, nd, K = zero_example["parameters"], zero_example["gpus"], zero_example["K"]
by_formula = [(2 + 2 + K) * psi_ex, 2 * psi_ex + 2 * psi_ex + K * psi_ex / nd, 2 * psi_ex + (2 + K) * psi_ex / nd,
              (2 + 2 + K) * psi_ex / nd]
for stage, b in enumerate(by_formula):
    saving = f", {by_formula[0] / b:.1f}× less than plain data parallelism" if stage else ""
    print(f"stage {stage}: {b / 1e9:6.1f} GB per GPU{saving}")
    assert math.isclose(b, zero_memory_per_rank(psi_ex, nd, stage, optimizer_bytes=K))

# %% [markdown]
# PyTorch's **FSDP** (`torch.distributed.fsdp.fully_shard`) is ZeRO-3. It runs on gloo too, so here it trains the
# MLP of section 2 for one AdamW step on `P` ranks through the recording process group, which counts what each
# rank sends: the cell prints what each rank holds (parameters, gradients, optimizer state, all as local shards),
# the collectives of each phase, and compares the weights with `torch.optim.AdamW` in one process.

# %%
from llmcourse.parallel import traffic  # noqa: E402


def fsdp_rank(rank, world_size):
    model = adam_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)                      # each Linear is one unit: gathered when it runs
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    held = sum(q.to_local().numel() for q in model.parameters())
    out = model(shard_batch(X, rank, world_size))
    n_forward = len(traffic.TRAFFIC)
    F.mse_loss(out, shard_batch(Y, rank, world_size)).backward()
    n_backward = len(traffic.TRAFFIC)
    grads = sum(q.grad.to_local().numel() for q in model.parameters())
    opt.step()
    state = sum(v.to_local().numel() for st in opt.state.values() for v in st.values() if v.dim() > 0)
    n_step = len(traffic.TRAFFIC)
    phases = {"forward": traffic.TRAFFIC[:n_forward], "backward": traffic.TRAFFIC[n_forward:n_backward],
              "optimizer step": traffic.TRAFFIC[n_backward:n_step]}
    weights = [q.full_tensor().detach() for q in model.parameters()]
    return held, grads, state, {k: [(e["op"], e["numel"]) for e in v] for k, v in phases.items()}, weights


fsdp = launch(fsdp_rank, P, timeout_s=TIMEOUT, backend="gloo_recorded")
ref = adam_model()
adamw = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
F.mse_loss(ref(X), Y).backward()
adamw.step()
for res in fsdp:
    assert res.ok, res.describe()
    held, grads, state, phases, weights = res.value
    err = max((w - q).abs().max().item() for w, q in zip(weights, ref.parameters(), strict=True))
    print(f"rank {res.rank}: holds {held} of Ψ = {psi} parameters, {grads} gradient and {state} moment elements; "
          f"|FSDP − AdamW| = {err:.1e}")
    assert err < 1e-5 and held <= math.ceil(psi / P) + 2 * P and state == 2 * held
phases = fsdp[0].value[3]
for phase, events in phases.items():
    print(f"  rank 0, {phase:14s}: {events or 'no communication'}")
sent = (sum((P - 1) * n for op, n in phases["forward"] + phases["backward"] if op == "allgather")
        + sum((P - 1) / P * n for op, n in phases["backward"] if op == "reduce_scatter"))
print(f"rank 0 sends {sent:,.0f} elements per step (bandwidth-optimal collectives); data parallelism's all-reduce "
      f"sends 2(p−1)/p·Ψ = {ring_all_reduce_volume(psi, P):,.0f}: {sent / ring_all_reduce_volume(psi, P):.2f}×")

# %% [markdown]
# ## 4. Tensor parallelism (Megatron)
#
# Data parallelism copies the model; when one layer is too big, or too slow, split the **matrices**. For
# `Y = X·Wᵀ` Megatron-LM (Shoeybi et al. 2019) uses two splits:
#
# - **column-parallel**: rank `r` holds a block of output features (rows of `W`); each rank computes its slice of
#   `Y` from the full `X`, with no communication;
# - **row-parallel**: rank `r` holds a block of input features; each computes a partial `Y` from its slice of `X`,
#   and one **all-reduce** sums them (where a bias goes is for you to work out in the exercises).
#
# In unit 11's SwiGLU block `down(silu(gate(x)) ⊙ up(x))`, `gate` and `up` are column-parallel, so each rank holds a
# slice of the hidden features, `silu` and `⊙` act element by element on the slice, and `down` is row-parallel:
# **one all-reduce** per block in the forward pass. The block is trained, so the backward pass must give every rank
# the same gradients as the dense block; what that costs in communication, and where, is exercise 5's question.
# Below, `TensorParallelSwiGLU` (the library's answer) is compared with the dense block, forward and backward.

# %%
D, HIDDEN = cfg["d_model"], cfg["ffn_hidden"]
XT = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(4))


def full_block():
    torch.manual_seed(5)
    return SwiGLUFeedForward(D, HIDDEN)


def tp_rank(rank, world_size):
    block = TensorParallelSwiGLU.from_swiglu(full_block(), rank, world_size)
    x = XT.clone().requires_grad_(True)
    out = block(x)
    out.pow(2).sum().backward()
    print(f"holds gate_proj {tuple(block.gate_proj.weight.shape)}, up_proj {tuple(block.up_proj.weight.shape)}, "
          f"down_proj {tuple(block.down_proj.weight.shape)} of the full ({HIDDEN}, {D}), ({HIDDEN}, {D}), ({D}, {HIDDEN})")
    return out.detach(), x.grad


tp = launch(tp_rank, P, timeout_s=TIMEOUT)
show_ranks(tp)
block = full_block()
xt = XT.clone().requires_grad_(True)
want = block(xt)
want.pow(2).sum().backward()
for res in tp:
    out, gx = res.value
    print(f"rank {res.rank}: |TP − full block| = {(out - want.detach()).abs().max():.2e}, "
          f"|∂x TP − ∂x full| = {(gx - xt.grad).abs().max():.2e}")
assert all((r.value[0] - want.detach()).abs().max() < 1e-5 for r in tp)

# %% [markdown]
# Each all-reduce moves the block's whole activation `(tokens, D)`, once per attention and once per MLP block, in
# each direction. Inside a server, NVLink makes that affordable; across servers it is not, which is why tensor
# parallelism stays inside one node.
#
# ## 5. Expert parallelism (DeepSeekMoE)
#
# A mixture-of-experts layer has many experts and each token uses only `k` of them. Expert parallelism puts
# different experts on different ranks. Every rank brings its own tokens, routes them locally, and then:
#
# 1. **dispatch**: sorts the (token, slot) pairs by the rank that owns their expert, tells every rank how many rows
#    to expect (an all-to-all of `p` counts), and sends the rows with `all_to_all_single`;
# 2. runs its experts on what arrived;
# 3. **combine**: sends the results back with the reverse all-to-all, weights them with the gate and adds the
#    shared experts.

# %%
E = cfg["n_experts"]
XE = torch.randn(P, cfg["tokens_per_rank"], D, generator=torch.Generator().manual_seed(7))


def full_moe(n_group=1, topk_group=1):
    torch.manual_seed(6)
    moe = DeepSeekMoE(D, HIDDEN // 2, n_routed_experts=E, n_shared_experts=1, top_k=2, n_group=n_group,
                      topk_group=topk_group)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    return moe


def ep_rank(rank, world_size):
    layer = ExpertParallelMoE.from_moe(full_moe(), rank, world_size)
    with torch.no_grad():
        out = layer(XE[rank])
    print(f"experts {rank * E // world_size}…{(rank + 1) * E // world_size - 1}; rows sent to each rank "
          f"{layer.last_send_rows.tolist()}, received from each rank {layer.last_recv_rows.tolist()}")
    return out


ep = launch(ep_rank, P, timeout_s=TIMEOUT)
show_ranks(ep)
with torch.no_grad():
    want_ep = full_moe()(XE.reshape(-1, D)).reshape(XE.shape)
for res in ep:
    print(f"rank {res.rank}: |EP − one-process MoE| = {(res.value - want_ep[res.rank]).abs().max():.2e}")
assert all((r.value - want_ep[r.rank]).abs().max() < 1e-5 for r in ep)

# %% [markdown]
# Every (token, slot) pair leaves its rank unless its expert happens to be local: with uniform routing a fraction
# `(p−1)/p` of `k·N` rows crosses the network twice (dispatch and combine). DeepSeek-V3 bounds this with
# **node-limited routing** (unit 14's groups): the experts are grouped by node, each token may use experts of at
# most `M` groups, so it is sent to at most `M` nodes, and each node receives a token once and forwards it to its
# GPUs over the faster NVLink. With one group per rank, count the ranks each token reaches:

# %%
x_all = XE.reshape(-1, D)
for label, moe in [("free routing", full_moe()), ("node-limited, M = 1", full_moe(n_group=P, topk_group=1))]:
    with torch.no_grad():
        _, _, idx = moe.gate(x_all)
    c = dispatch_counts(idx, E, P)
    print(f"{label:20s}: rows per destination rank {c['rows'].tolist()}, distinct tokens per rank "
          f"{c['tokens'].tolist()}, most ranks reached by one token: {int(c['ranks_per_token'].max())}")

V3 = {"experts": 256, "top_k": 8, "nodes": 8, "M": 4, "hidden": 7168}
per_node = V3["experts"] // V3["nodes"]
p_unused = math.comb(V3["experts"] - per_node, V3["top_k"]) / math.comb(V3["experts"], V3["top_k"])
print(f"DeepSeek-V3 ({V3['experts']} routed experts on {V3['nodes']} nodes, top-{V3['top_k']}): with free routing "
      f"a token reaches up to {min(V3['top_k'], V3['nodes'])} nodes ({V3['nodes'] * (1 - p_unused):.2f} on average "
      f"if its experts were drawn uniformly); node-limited routing caps it at M = {V3['M']}")

# %% [markdown]
# ## 6. What the report adds on top
#
# DeepSeek-V3's training combines pipeline parallelism, expert parallelism across nodes and ZeRO-1 data
# parallelism, and **no tensor parallelism**. The numbers below come from the report, simple formulas and a small
# simulation; nothing here runs on ranks.
#
# **Pipeline parallelism** cuts the layers into stages on different GPUs; a batch is cut into micro-batches that
# flow through the stages. With `s` stages and `m` micro-batches the simplest schedule idles a fraction
# `(s−1)/(m+s−1)` of the time (the "bubble"); interleaving forward and backward passes of different micro-batches
# (1F1B) bounds the memory, and splitting the backward pass into its input and weight parts shrinks the bubble.
# **DualPipe** feeds micro-batches from both ends of the pipeline and overlaps the computation of one micro-batch
# with the all-to-all communication of another, so that the expert-parallel dispatch and combine are hidden behind
# compute. The report's bubble formulas, in units of one chunk's forward `F`, backward-for-input `B` and
# backward-for-weights `W` (with an overlapped forward-and-backward chunk `F&B`):

# %%
report = {"pp_stages": 16, "ep_ways": 64, "ep_nodes": 8, "gpus": 2048}
s = report["pp_stages"]
F_, B_, W_ = 1.0, 1.0, 0.5          # illustrative chunk times (not measured); an overlapped chunk costs F + B
FB = F_ + B_
print(f"illustrative chunk times: F = {F_}, B = {B_}, W = {W_}, F&B = {FB}")
bubbles = {"1F1B": (s - 1) * (F_ + B_), "ZB1P": (s - 1) * (F_ + B_ - 2 * W_),
           "DualPipe": (s / 2 - 1) * (FB + B_ - 3 * W_)}
for name, b in bubbles.items():
    print(f"{name:9s} bubble with {s} stages: {b:5.1f} chunk-times")
for m in (s, 4 * s):
    print(f"simple pipeline, {s} stages, {m} micro-batches: idle fraction (s−1)/(m+s−1) = {(s - 1) / (m + s - 1):.1%}")
print(f"report: {report['pp_stages']}-way pipeline, {report['ep_ways']}-way expert parallelism over "
      f"{report['ep_nodes']} nodes, ZeRO-1 data parallelism, {report['gpus']} GPUs")

# %% [markdown]
# The bubble of the simple schedules is easy to get wrong, so simulate it. `simulate_pipeline` runs `m`
# micro-batches through `p` stages, each operation starting as soon as its stage is free and its input has arrived
# (the forward of micro-batch `i` on the previous stage, its backward on the next), with a backward taking twice a
# forward. **GPipe** runs all forwards, then all backwards; **1F1B** runs a few warm-up forwards, then alternates
# one forward and one backward. The chart shows stage by stage what runs (digit: forward of that micro-batch,
# letter: its backward, `.`: idle); the table, the measured idle fraction, the formula `(p−1)/(m+p−1)`, and the
# most micro-batches whose activations a stage holds at once.

# %%
p_pipe = 4
for name in ("gpipe", "1f1b"):
    run = simulate_pipeline(p_pipe, 4, name)
    print(f"{name}, {p_pipe} stages, 4 micro-batches (time →):")
    for s_, ops in enumerate(run.ops):
        line = ["."] * int(run.makespan)
        for kind, i, start, end in ops:
            for tick in range(int(start), int(end)):
                line[tick] = str(i) if kind == "F" else "abcdefgh"[i]
        print(f"  stage {s_}: {''.join(line)}")
print(f"{'schedule':9s} {'m':>3s} {'idle':>7s} {'(p−1)/(m+p−1)':>14s}  activations held per stage")
for m in (4, 8, 32):
    for name in ("gpipe", "1f1b"):
        run = simulate_pipeline(p_pipe, m, name)
        formula = (p_pipe - 1) / (m + p_pipe - 1)
        print(f"{name:9s} {m:3d} {run.bubble:7.1%} {formula:14.1%}  {run.peak_activations}")
        assert math.isclose(run.bubble, formula)

# %% [markdown]
# Both schedules idle the same fraction: more micro-batches shrink the bubble, the order does not. What 1F1B
# changes is memory: GPipe's stages hold the activations of all `m` micro-batches, 1F1B's first stage at most `p`,
# however many micro-batches there are, which is what lets `m` grow until the bubble is small. Shrinking the bubble
# itself takes other orders (interleaved stages, the split backward of ZB1P, DualPipe above).

# %% [markdown]
# **Why no tensor parallelism?** Tensor parallelism pays an all-reduce of the full activation after every
# attention and every MLP, forward and backward. Is it the bytes? Count both the same way, forward **and**
# backward, per token and layer, for DeepSeek-V3's hidden size:

# %%
d = V3["hidden"]
tp_ways = 8
tp_bytes = 4 * ring_all_reduce_volume(d * 2, tp_ways)            # 2 all-reduces forward + 2 backward, bf16
ep_forward = V3["M"] * d * (1 + 2)                                # dispatch in FP8 (1 byte), combine in bf16 (2)
ep_bytes = V3["M"] * d * (1 + 2 + 2 + 2)                          # + backward: two all-to-alls in bf16
print(f"tensor parallel ({tp_ways}-way), forward + backward: 4 all-reduces × 2(p−1)/p × {d} × 2 bytes = "
      f"{tp_bytes / 1e3:.1f} kB")
print(f"expert parallel, forward + backward: ≤ {V3['M']} nodes × {d} × (1 + 2 + 2 + 2) bytes = {ep_bytes / 1e3:.1f} kB "
      f"(forward alone {ep_forward / 1e3:.1f} kB)")
print(f"expert parallelism moves {ep_bytes / tp_bytes:.2f}× the bytes of {tp_ways}-way tensor parallelism")
assert ep_bytes > tp_bytes        # counted alike, the bytes do not favour expert parallelism

# %% [markdown]
# Counted alike, expert parallelism moves *more* bytes. The report's reasons are elsewhere. **Memory**: it saves
# memory without splitting matrices (recomputing cheap pieces such as normalisations, keeping the weights' moving
# average in CPU memory, placing the embedding and the output head on the same pipeline rank so that the
# multi-token prediction module shares them physically), so each GPU holds its share with pipeline and expert
# parallelism alone. **Overlap**: a tensor-parallel all-reduce sits between two matrix multiplications of the same
# micro-batch and cannot be hidden, while DualPipe runs the all-to-alls of one micro-batch during the computation
# of another, so their cost is mostly hidden.

# %% [markdown]
# ## Summary
#
# - Collectives are the vocabulary of parallel training; a ring all-reduce sends `2(p−1)/p · n` per rank.
# - Data parallelism = local gradients + all-reduce (mean); bucketing overlaps it with backward; equal to one
#   process on the whole batch, as DDP is.
# - ZeRO-1 shards the optimizer state: reduce-scatter, update a share, all-gather; the same result as AdamW.
#   ZeRO-2 shards the gradients too, ZeRO-3 (FSDP) the parameters: `(2 + 2 + K)Ψ/N_d` per rank for 1.5× the traffic.
# - Tensor parallelism splits matrices: column then row, one all-reduce per block forward.
# - Pipeline parallelism idles `(p−1)/(m+p−1)` with GPipe and 1F1B alike; 1F1B holds `p` micro-batches, not `m`.
# - Expert parallelism moves tokens to experts with two all-to-alls; node-limited routing bounds the traffic.
#
# ## Extension (optional)
#
# **An all-gather from scratch.** Write `ring_all_gather(shard)` with `dist.isend`/`dist.irecv` only: every rank
# passes the shard it received last step to its right neighbour, `p − 1` times, and returns the concatenation of
# all ranks' shards in rank order (what `dist.all_gather_single` returns).

# %%
def ring_all_gather(shard):
    # TODO (optional): p − 1 steps around the ring; return torch.cat of all shards in rank order
    return None


def self_check_all_gather(fn=None):
    fn = fn or ring_all_gather

    def body(rank, world_size):
        out = fn(torch.arange(3.0) + 10 * rank)
        return None if out is None else out.tolist()
    got = [res.value for res in launch(body, P, timeout_s=TIMEOUT)]
    want = torch.cat([torch.arange(3.0) + 10 * r for r in range(P)]).tolist()
    ok = all(g == want for g in got)
    print("✓ every rank has all shards in rank order" if ok else "✗ not yet: return all shards, in rank order")
    return ok


self_check_all_gather();
