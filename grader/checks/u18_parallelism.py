"""Checks of unit 18 (data, tensor and expert parallelism with torch.distributed).

Every probe starts a real process group **inside the process running the learner's code** (the isolated worker):
``llmcourse.parallel.launch`` forks 2 (or 3) gloo ranks on 127.0.0.1, with a rendezvous store on a port the OS
picked and a deadline (:data:`RANK_TIMEOUT_S`); each rank runs the learner's function and sends back plain data, its
error, and the collectives it called. A rank that raises, dies or hangs is reported with its rank and the
collective it was in; nothing waits forever (the launcher kills the ranks at the deadline).

Expected values never come from ranks: they are single-process computations here (the sum of the ranks' inputs,
one model on the whole batch, ``torch.optim.AdamW``, the full ``nn.Linear``, the full ``DeepSeekMoE``). The
collectives a rank called (a fact observed in the worker) can only make a check fail.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..core import CheckFailure, NotAttempted, check
from ..runner import also_blocked

U = "18"
RANK_TIMEOUT_S = 15.0   # per launch; a check is stopped at 30 s (grader.core.CHECK_TIME_LIMIT_S)
WORLD = 2
_COLLECTIVE_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce(", "gather(",
                     "scatter(")


def _ref_ring():
    from llmcourse.parallel.collectives import ring_all_reduce

    return {"ring_all_reduce": ring_all_reduce}


def _ref_dp():
    from llmcourse.parallel.data_parallel import attach_data_parallel

    return {"attach_data_parallel": attach_data_parallel}


def _ref_zero():
    from llmcourse.parallel.zero import ZeRO1AdamW

    return {"ShardedAdamW": ZeRO1AdamW}


def _ref_row():
    from llmcourse.parallel.tensor_parallel import row_parallel_linear

    return {"row_parallel_linear": row_parallel_linear}


def _ref_ep():
    from llmcourse.parallel.expert_parallel import expert_parallel_moe

    return {"expert_parallel_moe": expert_parallel_moe}


# ------------------------------------------------------------------------------------------------ ranks


def on_ranks(body, world_size: int = WORLD, timeout_s: float = RANK_TIMEOUT_S) -> list[dict]:
    """Run ``body(rank, world_size)`` on ``world_size`` gloo ranks (call inside a probe). One plain record per rank:
    ``{"rank", "ok", "value", "status", "message", "error", "pending", "calls"}``. A learner's exception inside
    a rank (already turned into a readable message by the learner guard) becomes ``status``/``message``."""
    from llmcourse.parallel import launch

    def guarded(rank, world_size):
        try:
            return {"ok": True, "value": body(rank, world_size)}
        except CheckFailure as exc:
            return {"ok": False, "status": exc.status, "message": exc.message}

    records = []
    for r in launch(guarded, world_size, timeout_s=timeout_s):
        rec = {"rank": r.rank, "calls": list(r.calls), "pending": r.pending, "error": r.error,
               "ok": False, "value": None, "status": "failed", "message": ""}
        if r.ok and isinstance(r.value, dict):
            if r.value["ok"] and isinstance(r.value["value"], dict):
                rec.update(r.value["value"], ok=True)      # the body's own keys ("out", "grads", ...)
            else:
                rec.update({k: v for k, v in r.value.items() if k != "value"})
        records.append(rec)
    if any(rec.get("status") == "not_attempted" for rec in records):
        raise NotAttempted()
    return records


def rank_problem(records: list[dict]) -> str | None:
    """The first failed rank, in words (rank, error, collective), or None when every rank finished."""
    for rec in records:
        if rec["ok"]:
            continue
        last = rec["pending"] or (rec["calls"][-1] if rec["calls"] else None)
        where = f" (its last collective: {last})" if last else ""
        if rec["error"] and rec["error"].startswith("timed out"):
            return (f"rank {rec['rank']} did not finish within {RANK_TIMEOUT_S:g} s{where}: a collective that not "
                    f"every rank called, or called in a different order or with different sizes, waits forever")
        text = rec["error"] or rec["message"]
        if any(w in text for w in ("Connection closed by peer", "Connection reset by peer")):
            where += (" -- its peer left the collective (that rank crashed, or never made this call: every rank must "
                      "call the same collectives in the same order with matching sizes)")
        if rec["error"]:
            return f"rank {rec['rank']} stopped: {rec['error']}{where}"
        return f"rank {rec['rank']}: {rec['message']}{where}"
    return None


def run_on_ranks(t, probe) -> list[dict]:
    """``t.run(probe)``; a failed rank fails the check with its rank and call."""
    records = t.run(probe)
    problem = rank_problem(records)
    if problem:
        t.fail(problem)
    return records


def compare_ranks(t, probe, records, expected, what: str, key, atol=1e-5, rtol=1e-5):
    """Compare ``key(record)`` of every rank with ``expected``; on a mismatch name the rank and a known mutant."""
    from ..core import _same, describe_difference

    for rec in records:
        got = key(rec)
        if not _same(got, expected, atol, rtol):
            pick = functools.partial(_pick_rank, rank=rec["rank"], key=key)
            bug_id = t.diagnose(probe, got, atol=max(atol, 1e-12), rtol=max(rtol, 1e-6), pick=pick)
            t.fail(f"rank {rec['rank']}, {what}: {describe_difference(got, expected, atol, rtol)}", bug=bug_id)


def _pick_rank(records, rank, key):
    rec = records[rank]
    if not rec["ok"]:
        raise ValueError("that rank failed")
    return key(rec)


def _used_collectives(records) -> list[str]:
    return sorted({c.split("(")[0] for rec in records for c in rec["calls"]
                   if any(c.startswith(n) for n in _COLLECTIVE_NAMES)})


# ------------------------------------------------------------------------------------------------ 18.ring_all_reduce

RING_WORLD = 3
RING_N = 12


def _ring_inputs():
    g = torch.Generator().manual_seed(1800)
    return torch.randn(RING_WORLD, RING_N, generator=g)


@check("18.ring_all_reduce", ["ring_all_reduce"], _ref_ring)
def check_ring_all_reduce(t):
    xs = _ring_inputs()

    def probe(impl):
        def body(rank, world_size):
            x = xs[rank].clone()
            out = impl.ring_all_reduce(x)
            return {"out": out.clone() if isinstance(out, torch.Tensor) else None, "x": x.clone(),
                    "same_object": out is x}
        return on_ranks(body, RING_WORLD)

    records = run_on_ranks(t, probe)
    used = _used_collectives(records)
    t.expect(not used, f"your ring calls {', '.join('dist.' + u for u in used)}; build it from point-to-point "
             "messages only (dist.isend/irecv, dist.batch_isend_irecv or send/recv)")
    t.expect(all(r["out"] is not None for r in records), "ring_all_reduce must return the tensor it was given")
    compare_ranks(t, probe, records, xs.sum(0), "the tensor after the ring (3 ranks, 12 elements)",
                  key=lambda r: r["x"], atol=1e-5)
    t.expect(all(r["same_object"] for r in records), "the sum must be written into the given tensor (in place) and "
             "that same tensor returned, as dist.all_reduce does")


# ------------------------------------------------------------------------------------------------ 18.attach_data_parallel

DP_BATCH = torch.randn(8, 6, generator=torch.Generator().manual_seed(1801))
DP_TARGET = torch.randn(8, 3, generator=torch.Generator().manual_seed(1802))
DP_STEPS, DP_LR, DP_SEED = 2, 0.1, 1234


def _dp_model():
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


def _dp_train(model, x, y):
    grads = []
    for _ in range(DP_STEPS):
        for p in model.parameters():
            p.grad = None
        F.mse_loss(model(x), y).backward()
        grads.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in
                      model.parameters()])
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= DP_LR * p.grad
    return grads, [p.detach().clone() for p in model.parameters()]


@functools.lru_cache(maxsize=1)
def _dp_expected():
    torch.manual_seed(100)                 # rank 0's initialisation
    model = _dp_model()
    grads, weights = _dp_train(model, DP_BATCH, DP_TARGET)
    return grads, weights


@check("18.attach_data_parallel", ["attach_data_parallel"], _ref_dp)
def check_attach_data_parallel(t):
    batch, target = DP_BATCH, DP_TARGET

    def probe(impl):
        def body(rank, world_size):
            torch.manual_seed(100 + rank)     # each rank initialises its replica differently
            model = _dp_model()
            impl.attach_data_parallel(model, DP_SEED)
            draws = torch.rand(16)
            n = batch.shape[0] // world_size
            grads, weights = _dp_train(model, batch[rank * n:(rank + 1) * n], target[rank * n:(rank + 1) * n])
            return {"grads": grads, "weights": weights, "draws": draws}
        return on_ranks(body)

    records = run_on_ranks(t, probe)
    grads, weights = _dp_expected()
    t.expect(not torch.equal(records[0]["draws"], records[1]["draws"]),
             "after attach_data_parallel both ranks draw the same random numbers, so their dropout masks are equal; "
             "each rank needs its own seed derived from `seed` (the weights are made equal another way)",
             bug="B18.same_dropout_seed")
    compare_ranks(t, probe, records, grads[0], "gradients of the first backward (model on 2 ranks with 4 examples "
                  "each, against one process with all 8)", key=lambda r: r["grads"][0], atol=1e-6, rtol=1e-5)
    compare_ranks(t, probe, records, grads[1], "gradients of the second backward", key=lambda r: r["grads"][1],
                  atol=1e-6, rtol=1e-5)
    compare_ranks(t, probe, records, weights, "weights after two SGD steps", key=lambda r: r["weights"],
                  atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ 18.ShardedAdamW

Z_STEPS = 3
# eps = 1e-2 (not 1e-8): with a tiny eps Adam's update barely depends on the gradient's scale, and a gradient
# shard summed instead of averaged would go unnoticed
Z_KW = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-2}


def _z_model():
    torch.manual_seed(1803)
    return nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 3), nn.GELU(), nn.Linear(3, 1, bias=False))


def _z_numel() -> int:
    return sum(p.numel() for p in _z_model().parameters())          # 69: odd, so the shards need padding


@functools.lru_cache(maxsize=1)
def _z_expected():
    model = _z_model()
    opt = torch.optim.AdamW(model.parameters(), **Z_KW)
    for _ in range(Z_STEPS):
        opt.zero_grad()
        F.mse_loss(model(DP_BATCH[:, :5]), DP_TARGET[:, :1]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@check("18.ShardedAdamW", ["ShardedAdamW"], _ref_zero)
def check_sharded_adamw(t):
    batch, target = DP_BATCH[:, :5].clone(), DP_TARGET[:, :1].clone()

    def probe(impl):
        def body(rank, world_size):
            model = _z_model()
            opt = impl.ShardedAdamW(model.parameters(), **Z_KW)
            n = batch.shape[0] // world_size
            x, y = batch[rank * n:(rank + 1) * n], target[rank * n:(rank + 1) * n]
            for _ in range(Z_STEPS):
                for p in model.parameters():
                    p.grad = None
                F.mse_loss(model(x), y).backward()
                opt.step()
            return {"weights": [p.detach().clone() for p in model.parameters()], "state": int(opt.state_numel())}
        return on_ranks(body)

    records = run_on_ranks(t, probe)
    psi = _z_numel()
    shard = -(-psi // WORLD)
    for rec in records:
        t.expect(rec["state"] <= 2 * shard,
                 f"rank {rec['rank']} holds {rec['state']} elements of optimizer state; ZeRO-1 keeps the two AdamW "
                 f"moments of its shard only: at most 2·⌈Ψ/p⌉ = {2 * shard} for Ψ = {psi} parameters on {WORLD} ranks "
                 f"(plain AdamW: 2Ψ = {2 * psi})")
    compare_ranks(t, probe, records, _z_expected(), f"weights after {Z_STEPS} steps (each rank 4 of the 8 examples, "
                  "against torch.optim.AdamW on all 8 in one process)", key=lambda r: r["weights"], atol=1e-6,
                  rtol=1e-5)


# ------------------------------------------------------------------------------------------------ 18.row_parallel_linear

ROW_X = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1804))


def _row_linear():
    torch.manual_seed(1805)
    lin = nn.Linear(8, 5)
    with torch.no_grad():
        lin.bias.copy_(torch.linspace(-2.0, 2.0, 5))           # a visible bias
    return lin


@check("18.row_parallel_linear", ["row_parallel_linear"], _ref_row)
def check_row_parallel_linear(t):
    x, state = ROW_X.clone(), _row_linear().state_dict()

    def probe(impl):
        def body(rank, world_size):
            lin = nn.Linear(8, 5)
            lin.load_state_dict(state)
            out = impl.row_parallel_linear(x.clone(), lin, rank, world_size)
            return {"out": out.detach().clone()}
        return on_ranks(body)

    records = run_on_ranks(t, probe)
    with torch.no_grad():
        expected = _row_linear()(ROW_X)
    compare_ranks(t, probe, records, expected, "row-parallel output against the full nn.Linear(8, 5)",
                  key=lambda r: r["out"], atol=1e-5)
    for rec in records:
        reduces = [c for c in rec["calls"] if c.startswith("all_reduce")]
        others = [c.split("(")[0] for c in rec["calls"] if not c.startswith("all_reduce")]
        t.expect(len(reduces) == 1 and not others,
                 f"rank {rec['rank']} called {rec['calls']}; a row-parallel layer needs exactly one all_reduce of the "
                 "partial outputs and nothing else (each rank already has the input)")


# ------------------------------------------------------------------------------------------------ 18.expert_parallel_moe

EP_X = torch.randn(WORLD, 2, 4, 8, generator=torch.Generator().manual_seed(1806))     # (rank, B, T, D)


def _ep_moe():
    from llmcourse.models.deepseek_moe import DeepSeekMoE

    torch.manual_seed(1807)
    moe = DeepSeekMoE(8, 8, n_routed_experts=4, n_shared_experts=1, top_k=2)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    return moe


@functools.lru_cache(maxsize=1)
def _ep_expected():
    moe = _ep_moe()
    with torch.no_grad():
        return moe(EP_X.reshape(-1, 4, 8)).reshape(EP_X.shape)


@check("18.expert_parallel_moe", ["expert_parallel_moe"], _ref_ep)
def check_expert_parallel_moe(t):
    xs, state = EP_X.clone(), _ep_moe().state_dict()

    def probe(impl):
        from llmcourse.models.deepseek_moe import DeepSeekMoE

        def body(rank, world_size):
            moe = DeepSeekMoE(8, 8, n_routed_experts=4, n_shared_experts=1, top_k=2)
            moe.load_state_dict(state)
            per = 4 // world_size
            with torch.no_grad():              # another rank's experts are not here: NaN weights
                for e, expert in enumerate(moe.experts):
                    if e // per != rank:
                        for p in expert.parameters():
                            p.fill_(float("nan"))
            with torch.no_grad():
                out = impl.expert_parallel_moe(xs[rank].clone(), moe, rank, world_size)
            return {"out": out.detach().clone()}
        return on_ranks(body)

    records = t.run(probe)
    for rec in records:
        last = rec["pending"] or (rec["calls"][-1] if rec["calls"] else "")
        if not rec["ok"] and last.startswith("all_to_all"):
            error = (rec["error"] or rec["message"]).splitlines()[0][:200]
            t.fail(f"rank {rec['rank']} failed inside {last} ({error}): the all-to-all's split sizes do not fit "
                   "together across ranks (what rank i sends to rank j must be what rank j expects from rank i)",
                   bug="B18.a2a_split_sizes")
    problem = rank_problem(records)
    if problem:
        t.fail(problem)
    expected = _ep_expected()
    for rec in records:
        t.expect(not torch.isnan(rec["out"]).any(),
                 f"rank {rec['rank']}'s output has NaN: it ran experts that live on the other rank (here their weights "
                 "are NaN); send each token to the rank that owns its expert")
    for rec in records:
        compare_ranks(t, probe, [rec], expected[rec["rank"]], "MoE output for this rank's tokens against the "
                      "full DeepSeekMoE in one process", key=lambda r: r["out"], atol=1e-5)


also_blocked("18.attach_data_parallel", "llmcourse.parallel.data_parallel:BucketedDataParallel",
             "llmcourse.parallel.data_parallel:average_gradients")
also_blocked("18.row_parallel_linear", "llmcourse.parallel.tensor_parallel:RowParallelLinear",
             "llmcourse.parallel.tensor_parallel:reduce_from_tensor_parallel")
also_blocked("18.expert_parallel_moe", "llmcourse.parallel.expert_parallel:ExpertParallelMoE")
