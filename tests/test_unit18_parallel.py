"""Unit 18: the launcher and the parallelisms, each against an independent oracle.

Oracles: the ring schedule's element count against the formula 2(p−1)/p·n; ``dist.all_reduce`` for the ring built
from point-to-point messages; one process with the whole batch and ``DistributedDataParallel`` for data
parallelism; ``torch.optim.AdamW`` for ZeRO-1; ``nn.Linear``/``SwiGLUFeedForward`` for tensor parallelism; the
single-process ``DeepSeekMoE`` for expert parallelism. Every launch uses 2 gloo ranks on 127.0.0.1 with a timeout.
"""

from __future__ import annotations

import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from llmcourse.models.deepseek_moe import DeepSeekMoE
from llmcourse.models.llama3 import SwiGLUFeedForward
from llmcourse.parallel import (
    BucketedDataParallel,
    ColumnParallelLinear,
    ExpertParallelMoE,
    RankFailure,
    RowParallelLinear,
    TensorParallelSwiGLU,
    ZeRO1AdamW,
    collective_bytes_per_rank,
    dispatch_counts,
    launch,
    ring_all_reduce,
    ring_all_reduce_schedule,
    ring_all_reduce_volume,
    run_ranks,
    shard_batch,
    zero_memory_per_rank,
)

TIMEOUT = 60.0


# ------------------------------------------------------------------------------------------ formulas (no ranks)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_ring_schedule_sends_the_formula_volume_and_sums(p):
    n = 6 * p
    x = torch.randn(p, n, generator=torch.Generator().manual_seed(p), dtype=torch.float64)
    states = ring_all_reduce_schedule(x)
    assert len(states) == 2 * (p - 1) + 1
    final = states[-1]["data"]
    torch.testing.assert_close(final, x.sum(0).expand(p, n))
    # each step every rank sends exactly one chunk of n/p elements, counted independently of the formula
    counted = sum(len({src for src, _, _ in s["sends"]}) and n // p for s in states[1:])
    assert counted == states[-1]["sent_elements"] == ring_all_reduce_volume(n, p)
    # after the reduce-scatter phase rank r holds the finished chunk (r+1) mod p
    mid = states[p - 1]["data"]
    c = n // p
    for r in range(p):
        k = (r + 1) % p
        torch.testing.assert_close(mid[r, k * c:(k + 1) * c], x.sum(0)[k * c:(k + 1) * c])


def test_volume_formulas():
    assert ring_all_reduce_volume(4e6, 2) == 4e6
    assert ring_all_reduce_volume(4e6, 8) == 7e6
    assert collective_bytes_per_rank("all_reduce", 8, 4) == 2 * collective_bytes_per_rank("reduce_scatter", 8, 4)
    with pytest.raises(ValueError):
        collective_bytes_per_rank("allreduce", 8, 4)
    with pytest.raises(ValueError):
        ring_all_reduce_volume(1, 0)


def test_zero_memory_matches_the_paper_example():
    gb = [zero_memory_per_rank(7.5e9, 64, s) / 1e9 for s in range(4)]
    assert [round(v, 1) for v in gb] == [120.0, 31.4, 16.6, 1.9]
    with pytest.raises(ValueError):
        zero_memory_per_rank(1, 2, stage=4)


# ------------------------------------------------------------------------------------------ the launcher


def _values(rank, world_size, scale):
    t = torch.full((3,), float(rank + 1) * scale)
    dist.all_reduce(t)
    print(f"rank {rank} of {world_size}")
    return {"sum": t, "rank": rank}


def _one_crashes(rank, world_size):
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    t = torch.ones(2)
    dist.all_reduce(t)
    return t


def _one_hangs(rank, world_size):
    if rank == 0:
        time.sleep(60)
    t = torch.ones(4)
    dist.all_reduce(t)
    return t


def test_launch_returns_values_output_and_calls_in_rank_order():
    results = launch(_values, 2, 2.0, timeout_s=TIMEOUT)
    assert [r.rank for r in results] == [0, 1]
    assert all(r.ok for r in results)
    for r in results:
        torch.testing.assert_close(r.value["sum"], torch.full((3,), 6.0))
        assert r.output == f"rank {r.rank} of 2\n"
        assert r.calls == ["all_reduce(float32 (3,))"]


def test_launch_reports_the_failing_rank_and_never_hangs():
    start = time.monotonic()
    results = launch(_one_crashes, 2, timeout_s=TIMEOUT)
    assert results[1].error == "ValueError: rank one fails on purpose"
    assert "rank one fails" in results[1].traceback
    assert not results[0].ok          # its peer vanished: gloo's error, not a hang
    assert time.monotonic() - start < TIMEOUT
    with pytest.raises(RankFailure, match="rank 1: ValueError"):
        run_ranks(_one_crashes, 2, timeout_s=TIMEOUT)


def test_launch_kills_ranks_at_the_deadline_and_names_the_pending_collective():
    start = time.monotonic()
    results = launch(_one_hangs, 2, timeout_s=3.0)
    assert time.monotonic() - start < 10
    assert [r.error for r in results] == ["timed out after 3 s"] * 2
    assert results[1].pending.startswith("all_reduce(float32 (4,))")
    assert results[0].pending is None


def _one_returns_one_sleeps(rank, world_size):
    if rank == 1:
        time.sleep(60)
    return rank + 100


def test_a_rank_that_finished_keeps_its_value_when_a_peer_hangs():
    results = launch(_one_returns_one_sleeps, 2, timeout_s=3.0)
    assert (results[0].ok, results[0].value) == (True, 100)
    assert results[1].error == "timed out after 3 s" and results[1].pending is None


def test_launch_spawn_runs_a_module_level_function():
    results = launch(_values, 2, 1.0, timeout_s=120.0, start_method="spawn")
    assert [r.error for r in results] == [None, None]
    torch.testing.assert_close(results[0].value["sum"], torch.full((3,), 3.0))


def test_launch_rejects_bad_arguments():
    with pytest.raises(ValueError):
        launch(_values, 0)
    with pytest.raises(ValueError):
        launch(_values, 2, start_method="thread")


# ------------------------------------------------------------------------------------------ collectives


def _ring(rank, world_size):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(12, generator=g, dtype=torch.float64)
    mine = ring_all_reduce(x.clone())
    theirs = x.clone()
    dist.all_reduce(theirs)
    return mine, theirs


def test_ring_all_reduce_from_point_to_point_equals_all_reduce():
    for mine, theirs in run_ranks(_ring, 2, timeout_s=TIMEOUT):
        torch.testing.assert_close(mine, theirs)


# ------------------------------------------------------------------------------------------ data parallelism

BATCH = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
TARGET = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))


def _mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _train(model, x, y, steps, lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = []
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return grads, [p.detach().clone() for p in model.parameters()]


def _ddp_rank(rank, world_size):
    x, y = shard_batch(BATCH, rank, world_size), shard_batch(TARGET, rank, world_size)
    ours = BucketedDataParallel(_mlp(seed=rank), bucket_cap_mb=200 / 2**20)   # different seeds: broadcast fixes
    grads, weights = _train(ours, x, y, steps=2)
    theirs = nn.parallel.DistributedDataParallel(_mlp(seed=10 + rank))
    torch.manual_seed(0)
    g2, w2 = _train(theirs, x, y, steps=2)
    return {"grads": grads, "weights": weights, "buckets": len(ours.buckets), "calls": ours.last_bucket_calls,
            "ddp_grads": g2, "ddp_weights": w2}


def test_bucketed_data_parallel_equals_one_process_and_ddp():
    results = run_ranks(_ddp_rank, 2, timeout_s=TIMEOUT)
    ref_grads, ref_weights = _train(_mlp(seed=0), BATCH, TARGET, steps=2)
    ddp_grads, ddp_weights = _train(_mlp(seed=10), BATCH, TARGET, steps=2)
    for r in results:
        assert r["buckets"] > 1 and r["calls"] == r["buckets"]
        for step in range(2):
            for a, b in zip(r["grads"][step], ref_grads[step], strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
            for a, b in zip(r["ddp_grads"][step], ddp_grads[step], strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        for a, b in zip(r["weights"], ref_weights, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        for a, b in zip(r["ddp_weights"], ddp_weights, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------ ZeRO-1


def _small_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 3))   # 42 + 24 parameters


def _zero_rank(rank, world_size):
    model = _small_model()
    model.append(nn.Linear(3, 1, bias=False))        # 3 more: 69 parameters, not divisible by 2 (padding)
    opt = ZeRO1AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x, y = shard_batch(BATCH[:, :5], rank, world_size), shard_batch(TARGET[:, :1], rank, world_size)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], opt.state_bytes()


def test_zero1_adamw_equals_adamw_on_the_whole_batch():
    results = run_ranks(_zero_rank, 2, timeout_s=TIMEOUT)
    model = _small_model()
    model.append(nn.Linear(3, 1, bias=False))
    n = sum(p.numel() for p in model.parameters())
    assert n % 2 == 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(BATCH[:, :5]), TARGET[:, :1]).backward()
        opt.step()
    for weights, state_bytes in results:
        assert state_bytes == 2 * 4 * ((n + 1) // 2)      # two fp32 moments of ceil(Ψ/p) elements
        for a, b in zip(weights, model.parameters(), strict=True):
            torch.testing.assert_close(a, b.detach(), atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------ tensor parallelism

X_TP = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(4))


def _tp_rank(rank, world_size):
    torch.manual_seed(5)
    col_full, row_full = nn.Linear(8, 6), nn.Linear(8, 4)
    ff = SwiGLUFeedForward(8, 12)
    col = ColumnParallelLinear.from_linear(col_full, rank, world_size, gather_output=True)
    row = RowParallelLinear.from_linear(row_full, rank, world_size)
    tp = TensorParallelSwiGLU.from_swiglu(ff, rank, world_size)
    x = X_TP.clone().requires_grad_(True)
    before = len(_CALLS)
    y = tp(x)
    forward_calls = len(_CALLS) - before
    y.pow(2).sum().backward()
    backward_calls = len(_CALLS) - before - forward_calls
    cols = slice(rank * 4, (rank + 1) * 4)
    return {"col": col(X_TP), "row": row(X_TP[..., cols]), "swiglu": y.detach(), "x_grad": x.grad,
            "gate_grad": tp.gate_proj.weight.grad, "down_grad": tp.down_proj.weight.grad,
            "forward_calls": forward_calls, "backward_calls": backward_calls}


_CALLS: list[str] = []     # all_reduce calls of this rank (a fork of the test process has its own copy)


def _recording(rank, world_size):
    real = dist.all_reduce

    def counted(*args, **kwargs):
        _CALLS.append("all_reduce")
        return real(*args, **kwargs)

    dist.all_reduce = counted
    try:
        return _tp_rank(rank, world_size)
    finally:
        dist.all_reduce = real


def test_tensor_parallel_layers_equal_the_full_layers_with_one_all_reduce_per_block():
    results = run_ranks(_recording, 2, timeout_s=TIMEOUT)
    torch.manual_seed(5)
    col_full, row_full = nn.Linear(8, 6), nn.Linear(8, 4)
    ff = SwiGLUFeedForward(8, 12)
    x = X_TP.clone().requires_grad_(True)
    y = ff(x)
    y.pow(2).sum().backward()
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["col"], col_full(X_TP).detach())
        torch.testing.assert_close(r["row"], row_full(X_TP).detach())       # bias added once, not p times
        torch.testing.assert_close(r["swiglu"], y.detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(r["x_grad"], x.grad, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(r["gate_grad"], ff.gate_proj.weight.grad[rank * 6:(rank + 1) * 6])
        torch.testing.assert_close(r["down_grad"], ff.down_proj.weight.grad[:, rank * 6:(rank + 1) * 6])
        assert (r["forward_calls"], r["backward_calls"]) == (1, 1)


def test_tensor_parallel_sizes_must_divide():
    with pytest.raises(ValueError, match="not divisible"):
        ColumnParallelLinear(4, 6, 0, 4)
    with pytest.raises(ValueError, match="not divisible"):
        RowParallelLinear(6, 4, 0, 4)


# ------------------------------------------------------------------------------------------ expert parallelism


def _moe(n_group=1, topk_group=1):
    torch.manual_seed(6)
    moe = DeepSeekMoE(8, 8, n_routed_experts=4, n_shared_experts=1, top_k=2, n_group=n_group,
                      topk_group=topk_group)
    for p in moe.parameters():
        nn.init.normal_(p, std=0.3)
    return moe


X_EP = torch.randn(2, 2, 5, 8, generator=torch.Generator().manual_seed(7))     # (ranks, B, T, D)


def _ep_rank(rank, world_size):
    ep = ExpertParallelMoE.from_moe(_moe(), rank, world_size)
    x = X_EP[rank].clone().requires_grad_(True)
    y = ep(x)
    y.pow(2).sum().backward()
    return {"y": y.detach(), "x_grad": x.grad, "expert_grads": [e.down_proj.weight.grad for e in ep.experts],
            "sent": ep.last_send_rows, "received": ep.last_recv_rows}


def test_expert_parallel_moe_equals_the_single_process_moe():
    results = run_ranks(_ep_rank, 2, timeout_s=TIMEOUT)
    moe = _moe()
    x = X_EP.clone().requires_grad_(True)
    y = moe(x.reshape(4, 5, 8))
    y.pow(2).sum().backward()
    y = y.reshape(2, 2, 5, 8)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["y"], y[rank].detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(r["x_grad"], x.grad[rank], atol=1e-5, rtol=1e-5)
        for j, g in enumerate(r["expert_grads"]):
            expert = moe.experts[rank * 2 + j]
            expected = expert.down_proj.weight.grad
            torch.testing.assert_close(g, expected if expected is not None else torch.zeros_like(g),
                                       atol=1e-5, rtol=1e-5)
        assert int(r["sent"].sum()) == 2 * 5 * 2       # N·k rows leave each rank
    # what rank 0 sent to rank 1 is what rank 1 received from rank 0
    assert int(results[0]["sent"][1]) == int(results[1]["received"][0])


def test_node_limited_routing_bounds_the_ranks_a_token_reaches():
    moe = _moe(n_group=2, topk_group=1)          # groups = ranks; each token may use one group only
    with torch.no_grad():
        _, _, idx = moe.gate(X_EP.reshape(-1, 8))
    counts = dispatch_counts(idx, 4, 2)
    assert int(counts["ranks_per_token"].max()) == 1
    assert int(counts["rows"].sum()) == idx.numel()
    free = _moe(n_group=1, topk_group=1)
    with torch.no_grad():
        _, _, idx = free.gate(X_EP.reshape(-1, 8))
    assert int(dispatch_counts(idx, 4, 2)["ranks_per_token"].max()) == 2


def test_run_torchrun_entry_reads_the_environment_torchrun_sets(monkeypatch):
    from llmcourse.parallel import free_port, run_torchrun_entry

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    out = run_torchrun_entry(lambda rank, world_size: (rank, world_size, dist.is_initialized()), backend="gloo")
    assert out == (0, 1, True)
    assert not dist.is_initialized()


# ------------------------------------------------------------------------------------------ device and dtype (issue 40)
# The library runs unchanged under torchrun + NCCL only if every buffer it makes follows the tensors it is given:
# NCCL moves GPU tensors only. No GPU here: float64 inputs (a dtype nothing would produce by default) and the
# 'meta' device stand in for "not the default", on CPU.


def _zero64_rank(rank, world_size):
    torch.manual_seed(11)
    model = nn.Linear(5, 3).double()
    opt = ZeRO1AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x = BATCH[rank * 4:(rank + 1) * 4, :5].double()
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(x), TARGET[rank * 4:(rank + 1) * 4, :3].double()).backward()
        opt.step()
    return {"weights": [p.detach() for p in model.parameters()], "dtypes": {opt.exp_avg.dtype, opt.exp_avg_sq.dtype},
            "devices": {opt.exp_avg.device.type, opt.exp_avg_sq.device.type}}


def test_zero1_state_follows_the_parameters_dtype_and_device():
    results = run_ranks(_zero64_rank, 2, timeout_s=TIMEOUT)
    torch.manual_seed(11)
    model = nn.Linear(5, 3).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(BATCH[:, :5].double()), TARGET[:, :3].double()).backward()
        opt.step()
    for r in results:
        assert r["dtypes"] == {torch.float64} and r["devices"] == {"cpu"}
        for a, b in zip(r["weights"], model.parameters(), strict=True):
            assert a.dtype == torch.float64
            torch.testing.assert_close(a, b.detach(), atol=1e-12, rtol=1e-12)   # float64 all the way through


def _ep64_rank(rank, world_size):
    torch.manual_seed(12)
    moe = DeepSeekMoE(8, 8, n_routed_experts=4, n_shared_experts=1, top_k=2).double()
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(20 + rank), dtype=torch.float64)
    with torch.no_grad():
        return {"y": ExpertParallelMoE.from_moe(moe, rank, world_size)(x), "x": x}


def test_expert_parallel_buffers_follow_the_input_dtype():
    results = run_ranks(_ep64_rank, 2, timeout_s=TIMEOUT)
    torch.manual_seed(12)
    moe = DeepSeekMoE(8, 8, n_routed_experts=4, n_shared_experts=1, top_k=2).double()
    for r in results:
        assert r["y"].dtype == torch.float64
        with torch.no_grad():
            torch.testing.assert_close(r["y"], moe(r["x"]), atol=1e-12, rtol=1e-12)


def test_tensor_parallel_shards_take_the_full_layers_device_and_dtype():
    full = nn.Linear(8, 6, device="meta", dtype=torch.float64)
    for layer in (ColumnParallelLinear.from_linear(full, 1, 2), RowParallelLinear.from_linear(full, 1, 2)):
        assert {(p.device.type, p.dtype) for p in layer.parameters()} == {("meta", torch.float64)}
    col = ColumnParallelLinear(8, 6, 0, 2, device="meta", dtype=torch.float16)
    assert (col.weight.device.type, col.weight.dtype, tuple(col.weight.shape)) == ("meta", torch.float16, (3, 8))


def test_no_tensor_factory_in_the_library_ignores_the_device():
    """Every torch.zeros/empty/ones/full in llmcourse/parallel names a device (or takes one through **kw): a buffer
    made on the default device breaks NCCL, where every tensor a collective touches must be on this rank's GPU."""
    import inspect
    import re

    import llmcourse.parallel as par

    bad = []
    for mod in (par.collectives, par.data_parallel, par.zero, par.tensor_parallel, par.expert_parallel):
        for n, line in enumerate(inspect.getsource(mod).splitlines(), 1):
            if re.search(r"torch\.(zeros|empty|ones|full|arange|rand|randn)\(", line) and not re.search(
                    r"device|\*\*kw|torch\.empty\(0\)", line):
                bad.append(f"{mod.__name__}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_schedules_take_the_closed_form_time_and_hold_the_closed_form_activations(schedule):
    from llmcourse.parallel.pipeline import bubble_fraction, simulate_pipeline, stage_order

    for p in (1, 2, 3, 4):
        for m in (1, 2, 5, 8):
            run = simulate_pipeline(p, m, schedule, forward_time=1.0, backward_time=2.0)
            # every stage runs each micro-batch once forward and once backward
            assert all(sorted(op[:2] for op in ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
                       for ops in run.ops)
            # the dependencies hold: forward i after the previous stage's, backward i after the next stage's
            end = {(k, s, i): e for s, ops in enumerate(run.ops) for k, i, _, e in ops}
            start = {(k, s, i): b for s, ops in enumerate(run.ops) for k, i, b, _ in ops}
            for s in range(p):
                for i in range(m):
                    if s:
                        assert start[("F", s, i)] >= end[("F", s - 1, i)]
                    if s + 1 < p:
                        assert start[("B", s, i)] >= end[("B", s + 1, i)]
            assert run.makespan == (m + p - 1) * 3.0            # GPipe §2.2: (m + p − 1)(f + b)
            assert run.bubble == pytest.approx(bubble_fraction(p, m)) == pytest.approx((p - 1) / (m + p - 1))
            want = [m] * p if schedule == "gpipe" else [min(p - s, m) for s in range(p)]
            assert run.peak_activations == want
            assert [k for k, _ in stage_order(schedule, 0, p, m)].count("F") == m
    with pytest.raises(ValueError, match="schedule"):
        simulate_pipeline(2, 2, "interleaved")
    with pytest.raises(ValueError):
        simulate_pipeline(0, 2)


def _bypass(rank, world_size):
    import torch.distributed as dist

    t = torch.ones(1000)
    dist.group.WORLD._inner.allreduce([t]).wait()      # the real group behind the recording one: not a record
    return t[0].item()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO's byte counters are Linux's")
def test_bytes_sent_around_the_recording_group_are_seen_on_the_wire():
    from grader.checks.u18_parallelism import wire_budget

    results = launch(_bypass, 2, timeout_s=TIMEOUT, backend="gloo_recorded")
    for r in results:
        assert r.ok and r.value == 2.0, r.describe()
        assert r.traffic == []                                      # the group saw nothing ...
        assert r.wire_sent >= 4000 > wire_budget({"traffic": [], "barriers": 0, "world_size": 2})  # ... the kernel did
