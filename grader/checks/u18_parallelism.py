"""Checks of unit 18 (data, tensor and expert parallelism with torch.distributed).

Every probe starts a real process group **inside the process running the learner's code** (the isolated worker):
``llmcourse.parallel.launch`` forks 2 (or 3) gloo ranks on 127.0.0.1, with a rendezvous store on a port the OS
picked and a deadline (:data:`RANK_TIMEOUT_S`); each rank runs the learner's function and sends back plain data, its
error, and the collectives it called. A rank that raises, dies or hangs is reported with its rank and the
collective it was in; nothing waits forever (the launcher kills the ranks at the deadline).

What a rank sent is observed twice: its default group (``llmcourse.parallel.traffic.RecordingProcessGroup``) records
every message whichever API sent it, and the launcher reads from the kernel the bytes the rank really put on its TCP
connections while the learner's function ran (Linux); :func:`expect_observed` fails a rank whose bytes exceed what
its recorded messages account for (:func:`wire_budget`), so traffic sent around the group (through the real gloo
group behind the recording one, or a group of its own) is seen. Not caught: unrecorded traffic hidden under recorded
decoys, a connection opened and closed inside the function, or a platform without ``TCP_INFO``.

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
from ..strength import decision, defining_property

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


def _ref_tp():
    from llmcourse.parallel.tensor_parallel import tp_swiglu

    return {"tp_swiglu": tp_swiglu}


def _ref_ep():
    from llmcourse.parallel.expert_parallel import expert_parallel_moe

    return {"expert_parallel_moe": expert_parallel_moe}


# ------------------------------------------------------------------------------------------------ ranks


def on_ranks(body, world_size: int = WORLD, timeout_s: float = RANK_TIMEOUT_S) -> list[dict]:
    """Run ``body(rank, world_size)`` on ``world_size`` gloo ranks (call inside a probe). One plain record per rank:
    ``{"rank", "ok", "value", "status", "message", "error", "pending", "calls", "traffic"}``. A learner's exception
    inside a rank (already turned into a readable message by the learner guard) becomes ``status``/``message``.

    The ranks' default group is :class:`llmcourse.parallel.traffic.RecordingProcessGroup`: ``traffic`` lists what
    each rank's group really carried (operation, elements, peer), whichever route the code took to it."""
    from llmcourse.parallel import launch

    _warm_up()

    def guarded(rank, world_size):
        try:
            return {"ok": True, "value": body(rank, world_size)}
        except CheckFailure as exc:
            return {"ok": False, "status": exc.status, "message": exc.message}

    records = []
    for r in launch(guarded, world_size, timeout_s=timeout_s, backend="gloo_recorded"):
        rec = {"rank": r.rank, "calls": list(r.calls), "pending": r.pending, "error": r.error,
               "ok": False, "value": None, "status": "failed", "message": "", "traffic": list(r.traffic),
               "wire_sent": r.wire_sent, "barriers": r.barriers, "world_size": world_size}
        if r.ok and isinstance(r.value, dict):
            if r.value["ok"] and isinstance(r.value["value"], dict):
                rec.update(r.value["value"], ok=True)      # the body's own keys ("out", "grads", ...)
            else:
                rec.update({k: v for k, v in r.value.items() if k != "value"})
        records.append(rec)
    if any(rec.get("status") == "not_attempted" for rec in records):
        raise NotAttempted()
    return records


def _warm_up() -> None:
    """One AdamW step on one number, in the process that forks the ranks: the first optimizer step of a process
    imports torch's compiler stack (seconds); done here (cheap after the first time), the forked ranks inherit it
    instead of each paying it on a loaded machine (where 4 ranks doing so outlasted the launch's deadline)."""
    w = torch.zeros(1, requires_grad=True)
    w.grad = torch.ones(1)
    torch.optim.AdamW([w]).step()


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
    expect_observed(t, records)
    return records


def expect_observed(t, records) -> None:
    """Every message went through the ranks' own default group (where the grader sees it): no group of another
    backend, and no more bytes on the wire than the recorded messages account for (:func:`wire_budget`)."""
    for rec in records:
        other = [e.get("backend", "?") for e in rec["traffic"] if e["op"] == "unrecorded_group"]
        t.expect(not other, f"rank {rec['rank']} made a process group of its own ({other[0] if other else ''}); "
                 "use the default group that every rank already joined (dist.new_group() without a backend works)")
    for rec in records:
        budget = wire_budget(rec)
        t.expect(rec.get("wire_sent") is None or rec["wire_sent"] <= budget,
                 f"rank {rec['rank']} sent {rec.get('wire_sent')} bytes over its connections to the other ranks, more "
                 f"than the messages its process group recorded can account for (at most {budget:.0f} bytes with "
                 "gloo's headers): it communicated around the group (through an object behind it, or a group or "
                 "connection of its own). Send everything through torch.distributed's functions or the group's own "
                 "methods")


# Bytes gloo puts on the wire for a recorded message, measured on loopback (torch 2.13's gloo; a rank's bytes sent,
# tensors of 8 and 1,000 elements per rank, 2, 3 and 4 ranks): a payload part (an all-reduce sends 2(p−1)/p of its
# tensor, a reduce-scatter the same: gloo runs it as an all-reduce; an all-gather (p−1) contributions; an all-to-all
# (p−1)/p of its input; a broadcast's root up to 2 tensors), and a header part growing with the ranks: ≈ 580(p−1)
# bytes per all-reduce or reduce-scatter, 290(p−1) per all-gather, 145(p−1) per all-to-all, 150(p−1) per barrier,
# 48 per point-to-point message and per receive notification. The budget takes the payload's bound (the tensor's
# bytes × the factor below) and 1.5 times the headers, so that no correct answer comes near it (the references stay
# under 0.7 of it), while an unrecorded collective of a check's tensors goes over it.
_WIRE_HEADER = {"allreduce": 900, "reduce_scatter": 900, "allgather": 450, "all_to_all": 220,
                "all_to_all_single": 220, "broadcast": 500, "reduce": 500, "gather": 100, "scatter": 100}
_WIRE_PAYLOAD = {"allreduce": 2, "reduce_scatter": 2, "all_to_all": 1, "all_to_all_single": 1}
WIRE_PER_MESSAGE = 96           # a send's header, or a receiver's notification, with room
WIRE_PER_BARRIER = 250          # per other rank
WIRE_SLACK = 256                # for the whole function (no recorded message: nothing may go on the wire beyond it)


def wire_budget(rec) -> float:
    """The most bytes a rank's recorded messages (and barriers) can put on the wire (see the constants above)."""
    p = rec.get("world_size", WORLD)
    budget = WIRE_SLACK + rec.get("barriers", 0) * WIRE_PER_BARRIER * max(1, p - 1)
    for e in rec["traffic"]:
        if e["op"] == "unrecorded_group":
            continue
        size = e["numel"] * (getattr(torch, e["dtype"]).itemsize if e.get("dtype") else 4)
        if e["op"] == "send":
            budget += size + WIRE_PER_MESSAGE
        elif e["op"] == "recv":
            budget += WIRE_PER_MESSAGE
        else:
            budget += _WIRE_PAYLOAD.get(e["op"], p) * size + _WIRE_HEADER.get(e["op"], 900) * max(1, p - 1)
    return budget


_P2P = ("send", "recv")


def traffic_collectives(rec) -> list[str]:
    """The collectives (not point-to-point messages, not barriers) a rank's group carried, in order, deduplicated."""
    seen = []
    for e in rec["traffic"]:
        if e["op"] not in _P2P and e["op"] != "unrecorded_group" and e["op"] not in seen:
            seen.append(e["op"])
    return seen


def compare_ranks(t, probe, records, expected, what: str, key, atol=1e-5, rtol=1e-5):
    """Compare ``key(record)`` of every rank with ``expected``; on a mismatch name the rank and a known mutant."""
    from ..core import _same, describe_difference

    for rec in records:
        got = key(rec)
        if not _same(got, expected, atol, rtol):
            pick = functools.partial(_pick_rank, rank=rec["rank"], key=key)
            bug_id = t.diagnose(probe, got, atol=max(atol, 1e-12), rtol=max(rtol, 1e-6), pick=pick)
            t.fail(f"rank {rec['rank']}, {what}: {describe_difference(got, expected, atol, rtol)}", bug=bug_id)


def nan_probe_failure(message: str, bug: str | None = None):
    """Fail a probe whose NaN is the evidence (weights a rank must not touch are NaN there): the message says what
    the NaN means, instead of the generic report on a non-finite result (``Tester.fail``)."""
    raise CheckFailure(message, bug_id=bug)


def _pick_rank(records, rank, key):
    rec = records[rank]
    if not rec["ok"]:
        raise ValueError("that rank failed")
    return key(rec)


def _used_collectives(records) -> list[str]:
    return sorted({c.split("(")[0] for rec in records for c in rec["calls"]
                   if any(c.startswith(n) for n in _COLLECTIVE_NAMES)})


# ------------------------------------------------------------------------------------------------ 18.ring_all_reduce

RING_WORLD = 4        # 4 ranks: a rank has a neighbour on each side and one rank that is not a neighbour
RING_SHAPE = (3, 8)   # 24 elements, 6 per chunk
RING_SEED = 1800


def _ring_input(rank: int) -> torch.Tensor:
    """Rank ``rank``'s tensor, made inside that rank (no rank holds another's input)."""
    return torch.randn(RING_SHAPE, generator=torch.Generator().manual_seed(RING_SEED + rank))


def ring_volume(rec) -> tuple[int, dict[int, int], dict[int, int]]:
    """``(elements sent, {dst: elements}, {src: elements})`` of one rank's point-to-point traffic."""
    sent, got = {}, {}
    for e in rec["traffic"]:
        if e["op"] == "send":
            sent[e["peer"]] = sent.get(e["peer"], 0) + e["numel"]
        elif e["op"] == "recv":
            got[e["peer"]] = got.get(e["peer"], 0) + e["numel"]
    return sum(sent.values()), sent, got


defining_property(
    "18.ring_all_reduce",
    "a ring all-reduce: each rank exchanges messages only with its two neighbours (r±1 mod p), point to point, "
    "and sends 2(p−1)/p·n elements in all (reduce-scatter then all-gather of n/p chunks), never the whole tensor",
    probe="the ranks' default process group is a recording wrapper of gloo: every send/recv is counted per peer "
          "(any route: dist.isend, batch_isend_irecv, send, the group object) on 4 ranks, each holding only its "
          "own input; any collective it carried fails the check")


@check("18.ring_all_reduce", ["ring_all_reduce"], _ref_ring)
def check_ring_all_reduce(t):
    def probe(impl):
        def body(rank, world_size):
            x = _ring_input(rank)
            out = impl.ring_all_reduce(x)
            return {"out": out.clone() if isinstance(out, torch.Tensor) else None, "x": x.clone(),
                    "same_object": out is x}
        return on_ranks(body, RING_WORLD)

    records = run_on_ranks(t, probe)
    used = sorted({c for rec in records for c in traffic_collectives(rec)} | set(_used_collectives(records)))
    t.expect(not used, f"your ring calls the collective {', '.join(used)}; build it from point-to-point "
             "messages only (dist.isend/irecv, dist.batch_isend_irecv or send/recv)")
    t.expect(all(r["out"] is not None for r in records), "ring_all_reduce must return the tensor it was given")
    expected = torch.stack([_ring_input(r) for r in range(RING_WORLD)]).sum(0)
    compare_ranks(t, probe, records, expected, f"the tensor after the ring ({RING_WORLD} ranks, "
                  f"{expected.numel()} elements)", key=lambda r: r["x"], atol=1e-5)
    t.expect(all(r["same_object"] for r in records), "the sum must be written into the given tensor (in place) and "
             "that same tensor returned, as dist.all_reduce does")
    p, n = RING_WORLD, expected.numel()
    budget = 2 * (p - 1) * n // p
    for rec in records:
        r = rec["rank"]
        total, sent, got = ring_volume(rec)
        neighbours = {(r - 1) % p, (r + 1) % p}
        far = sorted(set(sent) - neighbours)
        far_in = sorted(set(got) - neighbours)
        t.expect(not far and not far_in,
                 f"rank {r} of {p} exchanged messages with rank {(far or far_in)[0] if far or far_in else ''} "
                 f"(sent to {sorted(sent)}, received from {sorted(got)}); in a ring each rank talks only to its "
                 f"two neighbours, ranks {(r - 1) % p} and {(r + 1) % p}", bug="B18.ring_not_neighbours")
        t.expect(total <= budget,
                 f"rank {r} sent {total} elements for a tensor of n = {n} on p = {p} ranks; a ring all-reduce "
                 f"sends 2(p−1)/p·n = {budget}: p−1 steps of one n/p chunk to reduce, p−1 to gather",
                 bug="B18.ring_whole_tensor")


# ------------------------------------------------------------------------------------------------ 18.attach_data_parallel

DP_BATCH = torch.randn(8, 6, generator=torch.Generator().manual_seed(1801))
DP_TARGET = torch.randn(8, 3, generator=torch.Generator().manual_seed(1802))
DP_STEPS, DP_LR, DP_SEED = 2, 0.1, 1234
DP_AMBIENT = 4321        # every rank's global RNG state just before the call: the same on all ranks


class _DPNet(nn.Module):
    """A small MLP with a random buffer (a fixed feature scale): replicas that sync only parameters differ."""

    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(6, 10), nn.Linear(10, 3)
        self.register_buffer("scale", torch.rand(10) + 0.5)

    def forward(self, x):
        return self.lin2(torch.tanh(self.lin1(x)) * self.scale)


def _dp_model():
    return _DPNet()


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
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grads, weights = _dp_train(model, DP_BATCH, DP_TARGET)
    return state, grads, weights


def _dp_attached(impl, rank, seed, ambient):
    """A replica initialised as rank ``rank`` would, attached with ``seed`` from the global RNG state ``ambient``;
    returns it, its state right after the call and 16 draws of torch.rand after the call."""
    torch.manual_seed(100 + rank)          # each rank initialises its replica differently
    model = _dp_model()
    torch.manual_seed(ambient)             # ...but the global RNG state before the call is the same on all ranks
    impl.attach_data_parallel(model, seed)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model, state, torch.rand(16)


defining_property(
    "18.attach_data_parallel",
    "data parallelism without a wrapper: replicas start from rank 0's parameters and buffers, every .grad is the "
    "mean over ranks as soon as backward produced it (hooks), and random draws after the call differ between "
    "ranks and are a function of `seed` (not of the RNG state the rank happened to have)",
    probe="on 2 ranks whose replicas were initialised differently and whose global RNG state is made identical "
          "just before the call: the state dict right after the call against rank 0's; draws after the call "
          "compared across ranks, across two calls with the same seed from different RNG states, and against a "
          "call with another seed; gradients of two backwards and weights after two SGD steps against one process "
          "on the whole batch")


@check("18.attach_data_parallel", ["attach_data_parallel"], _ref_dp)
def check_attach_data_parallel(t):
    batch, target = DP_BATCH, DP_TARGET

    def probe(impl):
        def body(rank, world_size):
            _, _, again = _dp_attached(impl, rank, DP_SEED, ambient=DP_AMBIENT + 1)   # same seed, other RNG state
            _, _, other = _dp_attached(impl, rank, DP_SEED + 1, ambient=DP_AMBIENT)   # another seed
            model, state, draws = _dp_attached(impl, rank, DP_SEED, ambient=DP_AMBIENT)
            n = batch.shape[0] // world_size
            grads, weights = _dp_train(model, batch[rank * n:(rank + 1) * n], target[rank * n:(rank + 1) * n])
            return {"grads": grads, "weights": weights, "draws": draws, "again": again, "other": other,
                    "state": state}
        return on_ranks(body)

    records = run_on_ranks(t, probe)
    state0, grads, weights = _dp_expected()
    for rec in records:
        for name, want in sorted(state0.items(), key=lambda kv: kv[0] == "scale"):     # parameters first
            got = rec["state"].get(name)
            same = got is not None and got.shape == want.shape and torch.equal(got, want)
            if not same:
                kind = "buffer" if name == "scale" else "parameter"
                t.fail(f"rank {rec['rank']}: right after attach_data_parallel its {kind} {name!r} differs from rank "
                       f"0's; every replica must start from rank 0's parameters and buffers",
                       bug="B18.unsynced_init" if kind == "parameter" else None)
    for rec in records:
        t.expect(not torch.equal(rec["draws"], rec["other"]),
                 f"rank {rec['rank']} draws the same random numbers after attach_data_parallel(model, seed={DP_SEED}) "
                 f"and after seed={DP_SEED + 1}: its random draws do not depend on `seed`",
                 bug="B18.seed_ignored")
    t.expect(not torch.equal(records[0]["draws"], records[1]["draws"]),
             "after attach_data_parallel both ranks draw the same random numbers, so their dropout masks are equal; "
             "each rank needs its own seed derived from `seed` (the weights are made equal another way)",
             bug="B18.same_dropout_seed")
    for rec in records:
        t.expect(torch.equal(rec["draws"], rec["again"]),
                 f"rank {rec['rank']}: two calls with the same seed={DP_SEED}, made from different random states, are "
                 "followed by different draws: they must be reproducible from `seed` alone")
    compare_ranks(t, probe, records, grads[0], "gradients of the first backward (model on 2 ranks with 4 examples "
                  "each, against one process with all 8)", key=lambda r: r["grads"][0], atol=1e-6, rtol=1e-5)
    compare_ranks(t, probe, records, grads[1], "gradients of the second backward", key=lambda r: r["grads"][1],
                  atol=1e-6, rtol=1e-5)
    compare_ranks(t, probe, records, weights, "weights after two SGD steps", key=lambda r: r["weights"],
                  atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ 18.ShardedAdamW

Z_STEPS = 3
Z_WORLD = 4           # 4 ranks: a share is a quarter, so sharded state (≤ 1.5Ψ with one full buffer) and full moments
#                       (2Ψ) are far apart
# eps = 1e-2 (not 1e-8): with a tiny eps Adam's update barely depends on the gradient's scale, and a gradient
# shard summed instead of averaged would go unnoticed
# betas not the defaults: an answer that ignores them is seen
Z_KW = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-2, "betas": (0.8, 0.99)}


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


def held_state(opt, params) -> int:
    """Elements of the tensors reachable from the optimizer object ``opt`` (its attributes, containers, nested
    objects of its own classes and modules, torch optimizers' ``state`` and ``param_groups``, its class's attributes, and
    attributes set on the parameters), each storage counted once, the parameters' and gradients' own storages
    excluded. Library objects other than torch optimizers are not entered (their internals are not state this
    answer keeps). Runs inside a rank, on the learner's object."""
    skip_storage = set()
    for q in params:
        skip_storage.add(q.untyped_storage().data_ptr())
        if q.grad is not None:
            skip_storage.add(q.grad.untyped_storage().data_ptr())
    storages: dict[int, int] = {}
    seen: set[int] = set()
    stack = [opt, {k: v for k, v in vars(type(opt)).items() if not k.startswith("__")}, *params]
    while stack and len(seen) < 100_000:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            if o.device.type != "meta":
                key = o.untyped_storage().data_ptr()
                if key not in skip_storage and o.untyped_storage().nbytes():
                    storages[key] = max(storages.get(key, 0), o.untyped_storage().nbytes() // o.element_size())
            stack.extend(getattr(o, "__dict__", {}).values())
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, torch.optim.Optimizer):
            stack.extend([o.state, o.param_groups])
        elif isinstance(o, nn.Module):
            stack.extend(vars(o).values())
        elif type(o).__module__.split(".")[0] not in ("torch", "builtins", "numpy", "functools", "collections",
                                                       "types", "typing", "abc", "weakref"):
            stack.extend(getattr(o, "__dict__", {}).values())
            for slot in getattr(type(o), "__slots__", ()):
                if hasattr(o, slot):
                    stack.append(getattr(o, slot))
    return sum(storages.values())


def zero_traffic(rec, p: int) -> float:
    """Elements one rank sends in its collectives under the bandwidth-optimal algorithms (reduce-scatter of n:
    (p−1)/p·n; all-gather of a share s: (p−1)·s; all-reduce of n: 2(p−1)/p·n; broadcast of n: n from the root
    (charged to every rank: the bound is per rank); point-to-point sends: their size)."""
    total = 0.0
    for e in rec["traffic"]:
        n = e["numel"]
        total += {"reduce_scatter": (p - 1) / p * n, "allgather": (p - 1) * n, "allreduce": 2 * (p - 1) / p * n,
                  "broadcast": n, "reduce": (p - 1) / p * n, "all_to_all": (p - 1) / p * n,
                  "all_to_all_single": (p - 1) / p * n, "send": n, "scatter": n, "gather": n}.get(e["op"], 0.0)
    return total


defining_property(
    "18.ShardedAdamW",
    "ZeRO stage 1: each rank holds AdamW's two moments only for its ~Ψ/p share of the parameters, and a step "
    "communicates no more than data parallelism's all-reduce of the gradients (2(p−1)/p·Ψ per rank)",
    probe="inside each of 4 ranks, after 3 steps, the elements of every tensor reachable from the optimizer object "
          "(attributes, containers, nested objects, class attributes, attributes set on the parameters; parameter "
          "and gradient storages excluded) are counted, never the answer's state_numel(); the recording process "
          "group sums each rank's collective traffic per step; weights against torch.optim.AdamW in one process")


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
            params = list(model.parameters())
            return {"weights": [p.detach().clone() for p in params], "state": int(opt.state_numel()),
                    "held": held_state(opt, params)}
        return on_ranks(body, Z_WORLD)

    records = run_on_ranks(t, probe)
    psi, p = _z_numel(), Z_WORLD
    shard = -(-psi // p)
    n_params = len(list(_z_model().parameters()))
    # the moments of one share, plus one full flat buffer of the padded parameters (stage 1 keeps full gradients)
    # and a few scalars (step counts)
    allowed = 2 * shard + p * shard + n_params + 8
    for rec in records:
        t.expect(rec["held"] <= allowed,
                 f"rank {rec['rank']}'s optimizer holds {rec['held']} elements in tensors (counted from the optimizer "
                 f"object: its attributes and what they contain, parameters and gradients excluded); ZeRO-1 keeps the "
                 f"two AdamW moments of its share only, 2·⌈Ψ/p⌉ = {2 * shard} for Ψ = {psi} parameters on {p} ranks, "
                 f"where plain AdamW keeps 2Ψ = {2 * psi}", bug="B18.zero_full_state")
    for rec in records:
        t.expect(rec["state"] <= rec["held"],
                 f"rank {rec['rank']}'s state_numel() says {rec['state']} elements, but the tensors its optimizer "
                 f"holds have {rec['held']}: state_numel() counts the moment elements this rank really keeps")
    total = sum(rec["state"] for rec in records)
    t.expect(total >= 2 * psi,
             f"state_numel() summed over the {p} ranks is {total}, below 2Ψ = {2 * psi}: between them the ranks keep "
             "both AdamW moments of every parameter (each rank those of its share), and state_numel() counts them")
    for rec in records:
        t.expect(rec["state"] <= 2 * shard,
                 f"rank {rec['rank']} reports {rec['state']} elements of optimizer state; ZeRO-1 keeps the two AdamW "
                 f"moments of its shard only: at most 2·⌈Ψ/p⌉ = {2 * shard} for Ψ = {psi} parameters on {p} ranks "
                 f"(plain AdamW: 2Ψ = {2 * psi})")
    compare_ranks(t, probe, records, _z_expected(), f"weights after {Z_STEPS} steps (each rank 2 of the 8 examples, "
                  "against torch.optim.AdamW on all 8 in one process)", key=lambda r: r["weights"], atol=1e-6,
                  rtol=1e-5)
    budget = 2 * (p - 1) / p * (p * shard)
    for rec in records:
        sent = zero_traffic(rec, p) / Z_STEPS
        t.expect(sent <= budget + 1e-9,
                 f"rank {rec['rank']} sends {sent:g} elements per step in its collectives (as each would run "
                 f"bandwidth-optimally); ZeRO-1 costs what data parallelism costs, one all-reduce's "
                 f"2(p−1)/p·Ψ = {budget:g} for Ψ = {p * shard} (padded) on {p} ranks: each rank needs only its "
                 "share of the averaged gradient, and everyone needs the updated parameters",
                 bug="B18.zero_all_reduce")


# ------------------------------------------------------------------------------------------------ 18.row_parallel_linear

ROW_X = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1804))
ROW_G = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1808))    # the loss's weights: sum(G ⊙ y)


def _shard(rank: int, world_size: int, n: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` features (``n`` divisible by ``world_size``)."""
    k = n // world_size
    return slice(rank * k, (rank + 1) * k)


def _nan_outside_shard(rank: int, world_size: int, n: int, *cuts) -> slice:
    """:func:`_shard` of ``n`` features; in each ``(tensor, dim)`` of ``cuts`` every feature outside it is set to NaN
    (what this rank does not own is not here: a rank that touches it returns NaN)."""
    own = _shard(rank, world_size, n)
    with torch.no_grad():
        for tensor, dim in cuts:
            for c in range(n):
                if not own.start <= c < own.stop:
                    tensor.select(dim, c).fill_(float("nan"))
    return own


def _row_linear():
    torch.manual_seed(1805)
    lin = nn.Linear(8, 5)
    with torch.no_grad():
        lin.bias.copy_(torch.linspace(-2.0, 2.0, 5))           # a visible bias
    return lin


defining_property(
    "18.row_parallel_linear",
    "Megatron's row-parallel layer: rank r multiplies only its slice of the input features by the matching "
    "columns of the weight, the partial outputs are summed by one all-reduce, and the bias is added once; "
    "backward gives each rank the full layer's gradients for its slice (input features, weight columns) and the bias",
    probe="in each rank the weight columns and input features outside its slice are NaN (a rank that touches them "
          "returns NaN); the recording process group lists the collectives each rank's group carried (exactly one "
          "all-reduce); the output, and the gradients of sum(G ⊙ y) for the rank's input features, weight columns and "
          "bias, against the full nn.Linear in one process")


@check("18.row_parallel_linear", ["row_parallel_linear"], _ref_row)
def check_row_parallel_linear(t):
    x, state = ROW_X.clone(), _row_linear().state_dict()

    def probe(impl):
        def body(rank, world_size):
            lin = nn.Linear(8, 5)
            lin.load_state_dict(state)
            xr = x.clone()
            own = _nan_outside_shard(rank, world_size, 8, (lin.weight, 1), (xr, -1))
            xr.requires_grad_(True)
            out = impl.row_parallel_linear(xr, lin, rank, world_size)
            grads = None
            if isinstance(out, torch.Tensor) and out.requires_grad and out.shape == ROW_G.shape:
                (out * ROW_G).sum().backward()
                grads = [g.detach().clone() if g is not None else None
                         for g in (xr.grad[..., own] if xr.grad is not None else None,
                                   lin.weight.grad[:, own] if lin.weight.grad is not None else None, lin.bias.grad)]
            return {"out": out.detach().clone(), "grads": grads}
        return on_ranks(body)

    records = run_on_ranks(t, probe)
    with torch.no_grad():
        expected = _row_linear()(ROW_X)
    for rec in records:
        if not bool(torch.isfinite(rec["out"]).all()):
            nan_probe_failure(f"rank {rec['rank']}'s output has NaN: it used weight columns or input features outside "
                              "its slice (here they are NaN); rank r computes with features r·in/p … (r+1)·in/p − 1 "
                              "only and the all-reduce brings in the rest", bug="B18.row_full_product")
    compare_ranks(t, probe, records, expected, "row-parallel output against the full nn.Linear(8, 5)",
                  key=lambda r: r["out"], atol=1e-5)
    dense = _row_linear()
    xd = ROW_X.clone().requires_grad_(True)
    (dense(xd) * ROW_G).sum().backward()
    for rec in records:
        r = rec["rank"]
        own = _shard(r, WORLD, 8)
        t.expect(rec["grads"] is not None and all(g is not None for g in rec["grads"]),
                 f"rank {r}: no gradient flows back through the output to the input slice, the weight columns and the "
                 "bias; a row-parallel layer is trained: its output must be differentiable like linear(x)")
        want = [xd.grad[..., own], dense.weight.grad[:, own], dense.bias.grad]
        compare_ranks(t, probe, [rec], want, f"rank {r}'s gradients (its input features, its weight columns, the "
                      "bias) against the full layer's, for the loss sum(G ⊙ y)", key=lambda rc: rc["grads"], atol=1e-5)
    for rec in records:
        ops = [e["op"] for e in rec["traffic"]]
        t.expect(ops == ["allreduce"],
                 f"rank {rec['rank']}'s group carried {ops or 'nothing'} ({rec['calls']}); a row-parallel layer needs "
                 "exactly one all_reduce of the partial outputs and nothing else (each rank already has the input)")


# ------------------------------------------------------------------------------------------------ 18.tp_swiglu

TP_D, TP_HIDDEN = 8, 12
TP_X = torch.randn(2, 3, TP_D, generator=torch.Generator().manual_seed(1810))
TP_G = torch.randn(2, 3, TP_D, generator=torch.Generator().manual_seed(1811))     # the loss's weights: sum(G ⊙ y)


def _tp_block():
    from llmcourse.models.llama3 import SwiGLUFeedForward

    torch.manual_seed(1812)
    ff = SwiGLUFeedForward(TP_D, TP_HIDDEN)
    with torch.no_grad():
        for prm in ff.parameters():
            prm.normal_(0.0, 0.4)                                  # silu far from linear: the gate matters
    return ff


def _tp_phases(rec) -> tuple[list[dict], list[dict]]:
    """A rank's recorded traffic split into the forward call and the backward pass (the body marks the boundary)."""
    n = rec.get("n_forward", 0)
    return rec["traffic"][:n], rec["traffic"][n:]


def _tp_expected():
    dense = _tp_block()
    x = TP_X.clone().requires_grad_(True)
    y = dense(x)
    (y * TP_G).sum().backward()
    return y.detach(), x.grad, dense


defining_property(
    "18.tp_swiglu",
    "Megatron's tensor-parallel SwiGLU block: gate/up column-parallel (rank r multiplies the whole x by its rows), "
    "down row-parallel (its columns), one all-reduce of the output forward; where x enters, the identity forward "
    "and one all-reduce of ∂x backward (f/g), so every rank gets the full ∂x and its shards' dense gradients",
    probe="in each rank the gate/up rows and down columns outside its shard are NaN (a rank touching them returns "
          "NaN); the recording process group's traffic is split at the end of the forward call: exactly one "
          "all-reduce of (…, D) elements in the forward and one in the backward, nothing else; the output, ∂x and "
          "the shards' weight gradients of sum(G ⊙ y) against the dense SwiGLUFeedForward in one process")


@check("18.tp_swiglu", ["tp_swiglu"], _ref_tp)
def check_tp_swiglu(t):
    x, state = TP_X.clone(), _tp_block().state_dict()

    def probe(impl):
        def body(rank, world_size):
            from llmcourse.models.llama3 import SwiGLUFeedForward
            from llmcourse.parallel import traffic

            ff = SwiGLUFeedForward(TP_D, TP_HIDDEN)
            ff.load_state_dict(state)
            own = _nan_outside_shard(rank, world_size, TP_HIDDEN, (ff.gate_proj.weight, 0), (ff.up_proj.weight, 0),
                                     (ff.down_proj.weight, 1))
            xr = x.clone().requires_grad_(True)
            out = impl.tp_swiglu(xr, ff, rank, world_size)
            n_forward = len(traffic.TRAFFIC)
            grads = None
            if isinstance(out, torch.Tensor) and out.requires_grad and out.shape == TP_G.shape:
                (out * TP_G).sum().backward()
                pick = [xr.grad, ff.gate_proj.weight.grad, ff.up_proj.weight.grad, ff.down_proj.weight.grad]
                if all(g is not None for g in pick):
                    grads = [pick[0].detach().clone(), pick[1][own].detach().clone(), pick[2][own].detach().clone(),
                             pick[3][:, own].detach().clone()]
            return {"out": out.detach().clone() if isinstance(out, torch.Tensor) else out, "grads": grads,
                    "n_forward": n_forward}
        return on_ranks(body)

    records = run_on_ranks(t, probe)
    want_y, want_dx, dense = _tp_expected()
    tokens = TP_X.numel()
    for rec in records:
        t.expect(isinstance(rec["out"], torch.Tensor) and rec["out"].shape == want_y.shape,
                 f"rank {rec['rank']} returned {type(rec['out']).__name__}"
                 f"{tuple(rec['out'].shape) if isinstance(rec['out'], torch.Tensor) else ''}; every rank returns "
                 f"the block's full output {tuple(want_y.shape)}")
        if not bool(torch.isfinite(rec["out"]).all()):
            nan_probe_failure(f"rank {rec['rank']}'s output has NaN: it used gate/up rows or down columns outside its "
                              "shard (here they are NaN); rank r multiplies with rows r·h/p … (r+1)·h/p − 1 of gate and "
                              "up and the matching columns of down only")
        fwd, _ = _tp_phases(rec)
        if any(e["op"] == "allgather" for e in fwd):
            t.fail(f"rank {rec['rank']} all-gathered in the forward pass ({[e['op'] for e in fwd]}): gathering the "
                   "shards rebuilds the dense block on every rank", bug="B18.tp_gather_weights")
    compare_ranks(t, probe, records, want_y, "output against the dense SwiGLU block", key=lambda r: r["out"], atol=1e-5)
    for rec in records:
        r = rec["rank"]
        own = _shard(r, WORLD, TP_HIDDEN)
        t.expect(rec["grads"] is not None,
                 f"rank {r}: no gradient reaches x and the gate, up and down weights through the output; the block "
                 "is trained, so its output must be differentiable like ff(x)")
        want = [want_dx, dense.gate_proj.weight.grad[own], dense.up_proj.weight.grad[own],
                dense.down_proj.weight.grad[:, own]]
        compare_ranks(t, probe, [rec], want, f"rank {r}'s gradients (∂x, its rows of gate and up, its columns of down) "
                      "against the dense block's, for the loss sum(G ⊙ y)", key=lambda rc: rc["grads"], atol=1e-5)
    for rec in records:
        fwd, bwd = _tp_phases(rec)
        if [(e["op"], e["numel"]) for e in bwd] == [("allreduce", tokens)] * 2:
            t.fail(f"rank {rec['rank']}'s group carried two all-reduces of {tokens} elements in the backward pass, "
                   "one for each column-parallel layer's input; the block needs one", bug="B18.tp_dx_summed_per_layer")
        for phase, events in (("forward", fwd), ("backward", bwd)):
            desc = [(e["op"], e["numel"]) for e in events]
            t.expect(desc == [("allreduce", tokens)],
                     f"rank {rec['rank']}'s group carried {desc or 'nothing'} in the {phase} pass; the block needs "
                     f"exactly one all-reduce of {tokens} elements (the (…, D) activation or its gradient) there "
                     "and nothing else")


# ------------------------------------------------------------------------------------------------ 18.expert_parallel_moe

EP_SHAPE = (2, 3, 8)     # each rank's tokens (B, T, D): B·T ≠ D, so (tokens, D) and (D, tokens) differ
EP_SEED = 1806
EP_EXPERTS = 4


def _ep_tokens(rank: int) -> torch.Tensor:
    """Rank ``rank``'s tokens, made inside that rank (no rank holds another's tokens)."""
    return torch.randn(EP_SHAPE, generator=torch.Generator().manual_seed(EP_SEED + rank))


def _ep_moe():
    from llmcourse.models.deepseek_moe import DeepSeekMoE

    torch.manual_seed(1807)
    moe = DeepSeekMoE(8, 8, n_routed_experts=EP_EXPERTS, n_shared_experts=1, top_k=2)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    return moe


@functools.lru_cache(maxsize=1)
def _ep_expected():
    moe = _ep_moe()
    with torch.no_grad():
        return torch.stack([moe(_ep_tokens(r)) for r in range(WORLD)])


def routed_rows(rank: int, world_size: int) -> dict[int, torch.Tensor]:
    """``{q: rows}``: rank ``rank``'s token vectors, one row per (token, slot) routed to an expert of rank ``q``."""
    moe = _ep_moe()
    flat = _ep_tokens(rank).reshape(-1, moe.d_model)
    with torch.no_grad():
        _, _, idx = moe.gate(flat)
    owner = idx // (EP_EXPERTS // world_size)
    return {q: flat[(owner == q).nonzero()[:, 0]] for q in range(world_size)}


def _rows_match(sent: torch.Tensor, want: torch.Tensor) -> bool:
    """``sent`` holds exactly the rows of ``want`` (each at least once, nothing else, no more rows than ``want``),
    in any order, within bfloat16 rounding (a rank may send its tokens in a narrower dtype)."""
    if sent.shape[0] > want.shape[0] or (sent.shape[0] == 0) != (want.shape[0] == 0):
        return False
    if sent.shape[0] == 0:
        return True
    d = torch.cdist(sent.double(), want.double())
    tol = 1e-2 * (1 + want.abs().max().item())
    return bool((d.min(dim=1).values <= tol).all() and (d.min(dim=0).values <= tol).all())


def dispatch_problem(rec, world_size: int, d_model: int) -> str | None:
    """Why none of the rank's all-to-alls carried exactly its routed tokens to each other rank, else None."""
    want = routed_rows(rec["rank"], world_size)
    best = None
    for e in rec["traffic"]:
        if e["op"] not in ("all_to_all_single", "all_to_all") or not str(e["dtype"]).startswith(("float", "bfloat")):
            continue
        inp = e["input"]
        if isinstance(inp, list):
            parts = [t.reshape(-1, d_model) if t.numel() % d_model == 0 else None for t in inp]
        else:
            if inp.numel() % d_model:
                continue
            rows = inp.reshape(-1, d_model)
            splits = e["input_splits"] or [rows.shape[0] // world_size] * world_size
            if sum(splits) != rows.shape[0] and inp.dim() >= 1:
                splits = [s * inp[0].numel() // d_model for s in splits]     # splits in units of dim 0
            parts = list(rows.split(splits)) if sum(splits) == rows.shape[0] else [None] * world_size
        peers = [q for q in range(world_size) if q != rec["rank"]]
        if all(parts[q] is not None and _rows_match(parts[q].float(), want[q]) for q in peers):
            return None
        q = peers[0]
        if parts[q] is not None and best is None:
            best = (f"its all-to-all sent rank {q} {parts[q].shape[0]} rows, but {want[q].shape[0]} of its "
                    f"(token, slot) pairs are routed to rank {q}'s experts")
    return best or "none of its all-to-alls carried token vectors"


defining_property(
    "18.expert_parallel_moe",
    "expert parallelism: each rank routes its own tokens and an all-to-all carries to every other rank exactly the "
    "token vectors routed to that rank's experts (no token goes where none of its experts lives); only the "
    "owner's experts run on them",
    probe="each rank makes its own tokens; the experts a rank does not own are NaN there; the recording process "
          "group keeps what every all-to-all sent to each peer, compared row by row (any order) with the (token, "
          "slot) pairs the replicated router sends there; other collectives may carry only small metadata "
          "(counts); outputs against DeepSeekMoE in one process")


@check("18.expert_parallel_moe", ["expert_parallel_moe"], _ref_ep)
def check_expert_parallel_moe(t):
    state = _ep_moe().state_dict()

    def probe(impl):
        from llmcourse.models.deepseek_moe import DeepSeekMoE

        def body(rank, world_size):
            moe = DeepSeekMoE(8, 8, n_routed_experts=EP_EXPERTS, n_shared_experts=1, top_k=2)
            moe.load_state_dict(state)
            per = EP_EXPERTS // world_size
            with torch.no_grad():              # another rank's experts are not here: NaN weights
                for e, expert in enumerate(moe.experts):
                    if e // per != rank:
                        for p in expert.parameters():
                            p.fill_(float("nan"))
            with torch.no_grad():
                out = impl.expert_parallel_moe(_ep_tokens(rank), moe, rank, world_size)
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
    expect_observed(t, records)
    expected = _ep_expected()
    for rec in records:
        if torch.isnan(rec["out"]).any():
            nan_probe_failure(f"rank {rec['rank']}'s output has NaN: it ran experts that live on the other rank (here "
                              "their weights are NaN); send each token to the rank that owns its expert")
    metadata = WORLD * EP_EXPERTS
    for rec in records:
        heavy = [f"{e['op']} of {e['numel']} elements" for e in rec["traffic"]
                 if e["op"] not in ("all_to_all_single", "all_to_all", "send", "recv") and e["numel"] > metadata]
        t.expect(not heavy, f"rank {rec['rank']} moved data with {heavy[0] if heavy else ''}; in expert parallelism "
                 "tokens and expert outputs travel by all-to-all, each token only to the ranks owning its experts "
                 "(other collectives may carry small metadata such as counts)", bug="B18.ep_no_all_to_all")
    for rec in records:
        why = dispatch_problem(rec, WORLD, EP_SHAPE[-1])
        t.expect(why is None, f"rank {rec['rank']}: {why}; the dispatch all-to-all sends each rank exactly the "
                 "token vectors routed to its experts, one row per (token, slot)")
    for rec in records:
        compare_ranks(t, probe, [rec], expected[rec["rank"]], "MoE output for this rank's tokens against the "
                      "full DeepSeekMoE in one process", key=lambda r: r["out"], atol=1e-5)


# -- the decisions each exercise leaves to the student (withheld from what a student reads first; leak-scanned)

decision("18.attach_data_parallel", "which hook averages a gradient: one that fires once backward has accumulated "
         "that parameter's .grad (the post-accumulate-grad hook), not a module hook or the first gradient's",
         forms=[r"register_post_accumulate_grad_hook", r"post[-_ ]accumulate"],
         wrong=("B18.reduce_before_backward",))
decision("18.attach_data_parallel", "the per-rank seed: a function of both seed and rank (e.g. seed + rank), set "
         "after the broadcast", forms=[r"manual_seed\(\s*seed\s*\+\s*(dist\.get_)?rank", r"seed\s*\+\s*rank\b"],
         wrong=("B18.same_dropout_seed", "B18.seed_ignored"))
decision("18.ShardedAdamW", "the collectives: a reduce-scatter hands each rank its share of the summed gradient and "
         "an all-gather returns the updated parameters (an all-reduce of the whole gradient costs 1.5x the traffic)",
         forms=[r"reduce[-_ ]?scatter\w*\(?\s*(of\s+)?(the\s+)?(flat\s+)?grad",
                r"all[-_ ]?gather\w*\(?\s*(of\s+)?(the\s+)?(updated\s+)?param"],
         wrong=("B18.zero_all_reduce", "B18.zero_full_state"))
decision("18.row_parallel_linear", "where the bias goes: added once, after the partial products are summed",
         forms=[r"bias\W+(\w+\W+){0,4}after\s+(the\s+)?(all[-_ ]?reduce|sum)", r"bias added once"],
         wrong=("B18.bias_every_rank",))
decision("18.tp_swiglu", "where x enters the column-parallel layers: the identity in the forward pass and an "
         "all-reduce (sum) of ∂x in the backward pass (Megatron's f), shared by gate and up",
         forms=[r"identity\W+(in\s+)?(the\s+)?forward", r"all[-_ ]?reduce\w*\W+(of\s+)?(the\s+)?(gradient of x|∂x|grad)",
                r"sum(s|med)?\s+(of\s+)?(the\s+)?(gradient of x|∂x)"],
         wrong=("B18.tp_dx_partial", "B18.tp_input_reduced_forward", "B18.tp_dx_averaged"))
decision("18.expert_parallel_moe", "how a rank learns how many rows it receives: an all-to-all of the per-rank counts "
         "before the rows", forms=[r"exchange (the )?(per-rank )?counts", r"all[-_ ]to[-_ ]all of (the )?(p )?"
                                   r"(integers|counts)"],
         wrong=("B18.a2a_split_sizes",))


also_blocked("18.attach_data_parallel", "llmcourse.parallel.data_parallel:BucketedDataParallel",
             "llmcourse.parallel.data_parallel:average_gradients")
also_blocked("18.row_parallel_linear", "llmcourse.parallel.tensor_parallel:RowParallelLinear",
             "llmcourse.parallel.tensor_parallel:reduce_from_tensor_parallel")
also_blocked("18.tp_swiglu", "llmcourse.parallel.tensor_parallel:TensorParallelSwiGLU",
             "llmcourse.parallel.tensor_parallel:ColumnParallelLinear",
             "llmcourse.parallel.tensor_parallel:copy_to_tensor_parallel",
             "llmcourse.parallel.tensor_parallel:_CopyToTP")
also_blocked("18.expert_parallel_moe", "llmcourse.parallel.expert_parallel:ExpertParallelMoE")
