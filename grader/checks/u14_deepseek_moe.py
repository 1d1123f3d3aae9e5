"""Checks of unit 14 (mixture of experts: softmax top-k routing, the auxiliary loss, DeepSeek-V3 routing,
the auxiliary-loss-free bias update, the DeepSeekMoE layer).

Oracles: ``transformers``' ``DeepseekV3TopkRouter`` (indices and weights; it returns the indices unsorted, so
both sides are sorted by expert index) and ``DeepseekV3MoE`` (N(0, 0.3²) weights, random correction bias,
experts converted from the fused 3-D tensors). Their outputs are a stored snapshot
(``assets/oracles/u14_hf_deepseek_moe.pt``, rebuilt and compared by ``tests/test_unit14_deepseek_moe_checks.py``)
so that ``course check`` need not import transformers. Torch built-ins: ``softmax``, ``topk``, ``bincount``.
Fixtures: F14.1 (softmax top-2), F14.2 (uniform and collapsed routers), F14.3 (group-limited routing with a
negative bias), F14.4 (sign update). Properties: weights = softmax of the selected logits, gradient reaches
``probs`` only, invariance to token order, float32 bias, balanced loads unchanged, the bias a buffer, experts
without tokens not run, independent rows.

Contract clauses and the probes that cover them
-----------------------------------------------

``14.softmax_topk_route``: probs, indices (descending), weights of the worked example; ``renormalize=False``
  (non-default); shapes; weights = softmax of the selected logits; rows sum to 1.
``14.load_balancing_loss``: the normalisation of ``f_i`` is the learner's decision, forced by the two boundary cases
  (uniform + balanced with k = 2 gives exactly alpha; collapse with k = 1 gives alpha·E; the wrong alternatives are
  the fractions without E/k and E/N without 1/k); a random router at a non-default ``alpha``; the gradient
  reaches ``probs`` only (alpha·f_i/N); token-order invariance.
``14.deepseek_route``: the negative-bias group case (the mask value of excluded groups is the learner's decision:
  0 is the named wrong alternative); float32/long outputs; ``routed_scaling_factor`` and ``norm_topk_prob=False``
  (non-default) against ``DeepseekV3TopkRouter``; ``n_group``/``topk_group`` in two oracle configs.
``14.update_bias``: the worked loads; float32 for a bfloat16 bias; balanced loads unchanged; random loads at a
  non-default ``gamma``; the input bias is not modified in place (a new tensor is returned).
``14.DeepSeekMoE``: keys/shapes, bias a float32 persistent buffer; parity with ``DeepseekV3MoE`` (two configs:
  ``n_group``, ``topk_group``, ``routed_scaling_factor``, ``norm_topk_prob=False``, S = 1 and 2); independent rows;
  experts without tokens not run; train mode stores ``last_indices``; ``update_bias`` with a non-default
  ``bias_update_speed``; side effects: an eval forward and a train-mode forward leave parameters and buffers
  unchanged (the bias moves only in ``update_bias``).
``14.sequence_balance_loss``: balanced sequences with equal affinities of any value give exactly alpha (per-token
  normalisation); two sequences collapsed onto different experts pay as much as one (per sequence, not batch-wise:
  named alternative); mean over sequences (sum is named); a random batch at a non-default ``alpha`` and the
  default ``alpha`` (1e-4) against a loop written here; gradient reaches ``scores`` (autograd of that loop); token
  order within a sequence does not matter.
"""

from __future__ import annotations

import torch

from ..core import check, module_facts, unwrap
from ..oracles import stored_oracle, write_oracle

U = "14"
ORACLE_ASSET = "oracles/u14_hf_deepseek_moe.pt"
F141_LOGITS = [[2.0, 1.0, 0.5, 0.0]]
F141_PROBS = [0.5793, 0.2131, 0.1293, 0.0784]
F141_WEIGHTS = [0.7311, 0.2689]
F143_LOGITS = [[2.1972246, 1.3862944, -0.8472979, -1.3862944]]  # logit([0.9, 0.8, 0.3, 0.2])
F143_BIAS = [-1.0, -1.0, -1.5, -1.5]
F143_WEIGHTS = [0.9 / 1.7, 0.8 / 1.7]
F144_INDICES = [[0, 0], [0, 0], [0, 1], [2, 3]]  # counts [5, 1, 1, 1]
F144_DELTA = [-0.001, 0.001, 0.001, 0.001]
# the router and MoE configurations compared with transformers (DeepSeekMoE keyword arguments)
ORACLE_CASES = [
    dict(d_model=16, moe_intermediate_size=8, n_routed_experts=8, n_shared_experts=2, top_k=3, n_group=4,
         topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True),
    dict(d_model=16, moe_intermediate_size=8, n_routed_experts=16, n_shared_experts=1, top_k=4, n_group=4,
         topk_group=2, routed_scaling_factor=1.0, norm_topk_prob=False),
]
MOE_KW = ORACLE_CASES[0]


def _ref():
    from llmcourse.models import deepseek_moe as M

    return {"softmax_topk_route": M.softmax_topk_route, "load_balancing_loss": M.load_balancing_loss,
            "deepseek_route": M.deepseek_route, "update_bias": M.update_bias, "DeepSeekMoE": M.DeepSeekMoE}


def _ref_seq():
    from llmcourse.models.deepseek_moe import sequence_balance_loss

    return {"sequence_balance_loss": sequence_balance_loss}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ the stored transformers oracle


def build_hf_oracle() -> dict:
    """Every transformers output the checks compare with (needs transformers; a few seconds).

    Write it with ``python -c "from grader.checks.u14_deepseek_moe import write_hf_oracle; write_hf_oracle()"``.
    """
    import torch.nn.functional as F

    from llmcourse.models.deepseek_moe import moe_state_dict_from_hf, random_hf_deepseek_moe

    cases = []
    for i, kw in enumerate(ORACLE_CASES):
        # bias mean −0.4: many biased scores are negative, so masking with 0 instead of −inf shows
        hf = random_hf_deepseek_moe(seed=50 + i, std=0.3, bias_std=0.3, **kw)
        with torch.no_grad():
            hf.gate.e_score_correction_bias.sub_(0.4)
        x = torch.randn(2, 12, kw["d_model"], generator=_gen(60 + i))
        with torch.no_grad():
            logits = F.linear(x.reshape(-1, kw["d_model"]), hf.gate.weight)
            _, w, idx = hf.gate(x)
            order = idx.argsort(-1)
            y = hf(x)
        cases.append({"kw": dict(kw), "x": x, "router_logits": logits.clone(),
                      "bias": hf.gate.e_score_correction_bias.detach().clone(),
                      "indices_sorted": idx.gather(1, order).clone(), "weights_sorted": w.gather(1, order).clone(),
                      "state": moe_state_dict_from_hf({k: v.detach() for k, v in hf.state_dict().items()}),
                      "y": y.clone()})
    return {"cases": cases}


def write_hf_oracle() -> None:
    write_oracle(ORACLE_ASSET, build_hf_oracle)


oracle = stored_oracle(ORACLE_ASSET, build_hf_oracle)


def _sorted_by_expert(out):
    """``(weights, indices)`` -> both reordered by ascending expert index (float32 weights, long indices)."""
    w, i = out[0], out[1]
    order = i.long().argsort(-1)
    return [w.float().gather(1, order), i.long().gather(1, order)]


# ================================================================== 14.softmax_topk_route


@check(f"{U}.softmax_topk_route", ["softmax_topk_route"], _ref)
def check_softmax_topk_route(t):
    x = torch.tensor(F141_LOGITS)
    out = t.run(lambda impl: impl.softmax_topk_route(x, 2))
    t.expect(isinstance(out, (list, tuple)) and len(out) == 3,
             "softmax_topk_route must return a tuple (weights, indices, probs)")
    t.compare(lambda impl: impl.softmax_topk_route(x, 2)[2], torch.tensor([F141_PROBS]),
              "probs of the worked example (softmax over all experts)", atol=1e-4)
    t.compare(lambda impl: impl.softmax_topk_route(x, 2)[1].long(), torch.tensor([[0, 1]]),
              "indices of the worked example (by descending probability)", atol=0)
    t.compare(lambda impl: impl.softmax_topk_route(x, 2)[0], torch.tensor([F141_WEIGHTS]),
              "renormalised weights of the worked example", atol=1e-4)
    t.compare(lambda impl: impl.softmax_topk_route(x, 2, renormalize=False)[0], torch.tensor([F141_PROBS[:2]]),
              "weights with renormalize=False (the probabilities of the chosen experts)", atol=1e-4)
    logits = torch.randn(40, 8, generator=_gen(1)) * 2
    w, i, p = t.run(lambda impl: impl.softmax_topk_route(logits, 3))
    t.expect(tuple(w.shape) == (40, 3) and tuple(i.shape) == (40, 3) and tuple(p.shape) == (40, 8),
             f"shapes: weights {tuple(w.shape)}, indices {tuple(i.shape)}, probs {tuple(p.shape)}; expected "
             "(N, k), (N, k), (N, E)")
    probs = torch.softmax(logits, -1)
    t.expect(torch.allclose(p, probs, atol=1e-6), "probs must be the softmax of the logits over the experts")
    t.expect(torch.equal(i.long(), probs.topk(3, -1).indices), "indices must be the k most probable experts, "
             "by descending probability")
    t.expect(torch.allclose(w, torch.softmax(logits.gather(1, i.long()), -1), atol=1e-6),
             "renormalised weights must equal a softmax over the selected logits")
    t.expect(torch.allclose(w.sum(-1), torch.ones(40), atol=1e-6), "renormalised weights must sum to 1 per token")

    # the router learns through these outputs: gradients of weights and probs reach the logits
    r_w, r_p = torch.randn(40, 3, generator=_gen(11)), torch.randn(40, 8, generator=_gen(12))

    def grads(impl):
        lg = logits.clone().requires_grad_(True)
        w_, _, p_ = impl.softmax_topk_route(lg, 3)
        (w_ * r_w).sum().backward()
        g_w = lg.grad.clone() if lg.grad is not None else torch.zeros_like(lg)
        lg2 = logits.clone().requires_grad_(True)
        (impl.softmax_topk_route(lg2, 3)[2] * r_p).sum().backward()
        return [g_w, lg2.grad.clone() if lg2.grad is not None else torch.zeros_like(lg2)]

    lg = logits.clone().requires_grad_(True)
    pr = torch.softmax(lg, -1)
    top = pr.gather(1, probs.topk(3, -1).indices)
    ((top / top.sum(-1, keepdim=True)) * r_w).sum().backward()
    want_w = lg.grad.clone()
    lg2 = logits.clone().requires_grad_(True)
    (torch.softmax(lg2, -1) * r_p).sum().backward()
    t.compare(grads, [want_w, lg2.grad], "d(Σ r·weights)/d logits and d(Σ r·probs)/d logits (the router is trained "
              "through these outputs: no .detach())", atol=1e-6, rtol=1e-5)


# ================================================================== 14.load_balancing_loss


@check(f"{U}.load_balancing_loss", ["load_balancing_loss"], _ref)
def check_load_balancing_loss(t):
    n, e, a = 8, 4, 0.01
    uniform = torch.full((n, e), 1 / e)
    balanced = torch.tensor([[0, 1], [2, 3]] * 4)
    t.compare(lambda impl: impl.load_balancing_loss(uniform, balanced, e, a).float(), torch.tensor(a),
              "loss of a uniform router with balanced assignments (must be exactly alpha)", atol=1e-7, rtol=1e-5)
    onehot = torch.zeros(n, e)
    onehot[:, 0] = 1
    zeros = torch.zeros(n, 1, dtype=torch.long)
    t.compare(lambda impl: impl.load_balancing_loss(onehot, zeros, e, a).float(), torch.tensor(a * e),
              "loss when every token goes to expert 0 with probability 1 (alpha·E)", atol=1e-7, rtol=1e-5)
    logits = torch.randn(30, 6, generator=_gen(2))
    probs = torch.softmax(logits, -1)
    idx = probs.topk(2, -1).indices
    counts = torch.bincount(idx.flatten(), minlength=6).float()
    f = counts * 6 / (2 * 30)
    want = 0.05 * (f * probs.mean(0)).sum()
    t.compare(lambda impl: impl.load_balancing_loss(probs, idx, 6, 0.05).float(), want,
              "loss of a random router (N=30, E=6, k=2, alpha=0.05)", atol=1e-7, rtol=1e-5)

    def grad_probe(impl):
        p = probs.clone().requires_grad_(True)
        loss = impl.load_balancing_loss(p, idx, 6, 0.05)
        loss.backward()
        return p.grad

    grad = t.run(grad_probe)
    t.expect(grad is not None, "the loss must be differentiable in probs (no .detach() or .item() on them)")
    t.expect(torch.allclose(grad, (0.05 * f / 30).expand(30, 6), atol=1e-7),
             "d loss / d probs[t, i] must be alpha·f_i/N: the counts carry no gradient, P_i is a mean over tokens")
    perm = torch.randperm(30, generator=_gen(3))
    pair = t.run(lambda impl: [impl.load_balancing_loss(probs, idx, 6, 0.05).float(),
                               impl.load_balancing_loss(probs[perm], idx[perm], 6, 0.05).float()])
    t.expect(torch.allclose(pair[0], pair[1], atol=1e-7), "the loss must not depend on the order of the tokens")


# ================================================================== 14.deepseek_route


@check(f"{U}.deepseek_route", ["deepseek_route"], _ref)
def check_deepseek_route(t):
    lg, b = torch.tensor(F143_LOGITS), torch.tensor(F143_BIAS)
    out = t.run(lambda impl: impl.deepseek_route(lg, b, 2, 2, 1))
    t.expect(isinstance(out, (list, tuple)) and len(out) == 2, "deepseek_route must return (weights, indices)")
    t.expect(out[0].dtype == torch.float32, f"weights must be float32, got {out[0].dtype}")
    t.expect(out[1].dtype == torch.long, f"indices must be long (int64), got {out[1].dtype}")
    t.compare(lambda impl: impl.deepseek_route(lg, b, 2, 2, 1), [torch.tensor([F143_WEIGHTS]), torch.tensor([[0, 1]])],
              "the worked example with a negative bias (2 groups, keep 1, top 2): [weights, indices] sorted by "
              "expert", atol=1e-4, pick=_sorted_by_expert)
    t.compare(lambda impl: impl.deepseek_route(lg, b, 2, 2, 1, routed_scaling_factor=2.5),
              [torch.tensor([[2.5 * w for w in F143_WEIGHTS]]), torch.tensor([[0, 1]])],
              "the worked example with routed_scaling_factor=2.5", atol=1e-4, pick=_sorted_by_expert)
    # the gate weights are trained through the routing weights: their gradient reaches the logits
    case0 = oracle()["cases"][0]
    kw0 = case0["kw"]
    args0 = (kw0["top_k"], kw0["n_group"], kw0["topk_group"], kw0["routed_scaling_factor"], kw0["norm_topk_prob"])
    r = torch.randn(case0["router_logits"].shape[0], kw0["top_k"], generator=_gen(13))

    def route_grad(impl):
        lg_ = case0["router_logits"].clone().requires_grad_(True)
        w_, i_ = impl.deepseek_route(lg_, case0["bias"], *args0)
        order = i_.long().argsort(-1)
        (w_.gather(1, order) * r).sum().backward()
        return lg_.grad.clone() if lg_.grad is not None else torch.zeros_like(lg_)

    from llmcourse.models.deepseek_moe import deepseek_route as _course_route

    lg_ref = case0["router_logits"].clone().requires_grad_(True)
    w_ref, i_ref = _course_route(lg_ref, case0["bias"], *args0)
    (w_ref.gather(1, i_ref.argsort(-1)) * r).sum().backward()
    t.compare(route_grad, lg_ref.grad, "d(Σ r·weights)/d router_logits (weights sorted by expert): the router is "
              "trained through the routing weights, so they must carry the sigmoid's gradient", atol=1e-6, rtol=1e-5)
    for n, case in enumerate(oracle()["cases"]):
        kw, logits, bias = case["kw"], case["router_logits"], case["bias"]
        args = (kw["top_k"], kw["n_group"], kw["topk_group"], kw["routed_scaling_factor"], kw["norm_topk_prob"])
        t.compare(lambda impl, logits=logits, bias=bias, args=args: impl.deepseek_route(logits, bias, *args)[1],
                  case["indices_sorted"], f"chosen experts vs transformers' DeepseekV3TopkRouter (case {n + 1}: "
                  f"E={kw['n_routed_experts']}, top_k={kw['top_k']}, n_group={kw['n_group']}, "
                  f"topk_group={kw['topk_group']}, random bias)", atol=0,
                  pick=lambda o: o.long().sort(-1).values)
        t.compare(lambda impl, logits=logits, bias=bias, args=args: impl.deepseek_route(logits, bias, *args),
                  [case["weights_sorted"], case["indices_sorted"]],
                  f"weights vs transformers' DeepseekV3TopkRouter (case {n + 1}: routed_scaling_factor="
                  f"{kw['routed_scaling_factor']}, norm_topk_prob={kw['norm_topk_prob']})", atol=1e-6, rtol=1e-5,
                  pick=_sorted_by_expert)


# ================================================================== 14.update_bias


@check(f"{U}.update_bias", ["update_bias"], _ref)
def check_update_bias(t):
    idx = torch.tensor(F144_INDICES)
    zeros = torch.zeros(4)
    t.compare(lambda impl: impl.update_bias(zeros, idx, 4, 0.001), torch.tensor(F144_DELTA),
              "bias change for loads [5, 1, 1, 1] (mean 2, gamma 0.001)", atol=1e-7, rtol=0)
    ones_bf16 = torch.ones(4, dtype=torch.bfloat16)
    out = t.run(lambda impl: impl.update_bias(ones_bf16, idx, 4, 0.001))
    t.expect(out.dtype == torch.float32, f"the updated bias must be float32 even for a bfloat16 input "
             f"(got {out.dtype}): a step of 0.001 near 1 is below bfloat16's resolution")
    t.expect(torch.allclose(out.float(), torch.tensor([0.999, 1.001, 1.001, 1.001]), atol=1e-6),
             f"a bfloat16 bias of ones must become [0.999, 1.001, 1.001, 1.001]; got {out.tolist()}")
    start = torch.tensor([0.3, -0.2, 0.1, 0.0])
    balanced = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]])
    t.compare(lambda impl: impl.update_bias(start, balanced, 4, 0.01), start.clone(),
              "balanced loads must leave the bias unchanged", atol=0)
    b = torch.randn(6, generator=_gen(4)) * 0.1
    ind = torch.randint(0, 6, (25, 2), generator=_gen(5))

    def in_place(impl):
        given = b.clone()
        impl.update_bias(given, ind, 6, 0.01)
        return given

    t.expect(torch.equal(t.run(in_place), b), "update_bias must return a new tensor and leave the bias it was given "
             "unchanged (the layer copies the result into its buffer)")
    c = torch.bincount(ind.flatten(), minlength=6).float()
    t.compare(lambda impl: impl.update_bias(b, ind, 6, 0.01), b + 0.01 * torch.sign(c.mean() - c),
              "random loads (E=6, 25 tokens × 2, gamma 0.01)", atol=1e-7, rtol=0)
    idle = torch.tensor([[0, 0], [0, 0], [2, 3], [2, 3]])     # loads [4, 0, 2, 2]: expert 1 got nothing, mean 2
    t.compare(lambda impl: impl.update_bias(torch.zeros(4), idle, 4, 0.01), torch.tensor([-0.01, 0.01, 0.0, 0.0]),
              "loads [4, 0, 2, 2] (an expert without tokens; the mean load c̄ = 2 is over all E experts, so the two "
              "experts at the mean keep their bias)", atol=1e-7, rtol=0)


# ================================================================== 14.DeepSeekMoE


def _moe(impl, state, kw, mode="eval"):
    from grader.prior import use_course
    from llmcourse.models.deepseek_moe import deepseek_route, update_bias

    m = impl.DeepSeekMoE(**kw)
    # graded on the course's routing and bias update (exercises 3 and 4): one mistake costs one exercise
    use_course(type(unwrap(m)), deepseek_route=deepseek_route, update_bias=update_bias)
    unwrap(m).load_state_dict(state)
    return unwrap(m).train() if mode == "train" else unwrap(m).eval()


@check(f"{U}.DeepSeekMoE", ["DeepSeekMoE"], _ref)
def check_deepseek_moe(t):
    ref = _ref()
    kw = dict(MOE_KW)
    wanted = {k: tuple(v.shape) for k, v in ref["DeepSeekMoE"](**kw).state_dict().items()}
    facts = t.run(lambda impl: module_facts(impl.DeepSeekMoE(**kw)))
    t.expect(facts.get("is_module"), f"DeepSeekMoE must be an nn.Module subclass, got {facts.get('type')}")
    got = facts["state_dict"]
    bias = "gate.e_score_correction_bias"
    t.expect(bias not in facts["parameters"], f"{bias} is a parameter: the bias must be a buffer, changed only by "
             "the sign update (never by the optimizer)", bug="B14.bias_parameter")
    t.expect(bias in facts["buffers"], f"{bias} must be a registered (persistent) buffer of the router `gate`")
    t.expect(facts["dtypes"].get(bias) == torch.float32, f"{bias} must be float32, got {facts['dtypes'].get(bias)}",
             bug="B14.bias_low_precision")
    missing, extra = sorted(set(wanted) - set(got)), sorted(set(got) - set(wanted))
    t.expect(not missing and not extra, f"state_dict keys: missing {missing[:6]}, unexpected {extra[:6]}")
    wrong = {k: (got[k], wanted[k]) for k in wanted if got[k] != wanted[k]}
    t.expect(not wrong, f"state_dict shapes (got, expected): {dict(list(wrong.items())[:4])}")
    # transformers parity
    for n, case in enumerate(oracle()["cases"]):
        ckw, state, x = case["kw"], case["state"], case["x"]
        t.compare(lambda impl, ckw=ckw, state=state, x=x: _moe(impl, state, ckw)(x), case["y"],
                  f"output vs transformers' DeepseekV3MoE with the same weights (case {n + 1}: E="
                  f"{ckw['n_routed_experts']}, S={ckw['n_shared_experts']}, top_k={ckw['top_k']})", atol=1e-5, rtol=1e-4)
    case = oracle()["cases"][0]
    state, x = case["state"], case["x"]
    # independent rows
    pair = t.run(lambda impl: [_moe(impl, state, kw)(x), _moe(impl, state, kw)(x[:1, 3:4])])
    t.expect(torch.allclose(pair[1][0, 0], pair[0][0, 3], atol=1e-5),
             "each token's output must depend on that token only (run alone it must give the same row)")

    # an expert without tokens is not run: one token, hooks count the calls
    def calls_probe(impl):
        m = _moe(impl, state, kw)
        calls = [0] * kw["n_routed_experts"]
        for e, ex in enumerate(m.experts):
            ex.register_forward_hook(lambda *_, e=e: calls.__setitem__(e, calls[e] + 1))
        with torch.no_grad():
            m(x[:1, :1])
        return calls

    calls = t.run(calls_probe)
    r = ref["DeepSeekMoE"](**kw).eval()
    r.load_state_dict(state)
    with torch.no_grad():
        chosen = set(r.gate(x[:1, :1])[2][0].tolist())
    ran = {e for e, c in enumerate(calls) if c}
    t.expect(ran == chosen, f"for one token routed to experts {sorted(chosen)} your layer ran experts {sorted(ran)}; "
             "run each expert only on the tokens routed to it")

    # side effects: forwards in eval and train mode change no parameter or buffer (the bias moves in update_bias only)
    def side_effects(impl):
        m = _moe(impl, state, kw)
        before = {k: v.detach().clone() for k, v in unwrap(m).state_dict().items()}
        with torch.no_grad():
            m(x)
        unwrap(m).train()
        m(x)
        return [before, {k: v.detach().clone() for k, v in unwrap(m).state_dict().items()}]

    before, after = t.run(side_effects)
    changed = sorted(k for k in before if k not in after or not torch.equal(before[k], after[k]))
    t.expect(not changed, f"a forward pass (eval or train mode) must leave parameters and buffers unchanged; it "
             f"changed {changed[:4]} (the correction bias moves only when update_bias() is called)")

    # a training step reaches every weight the token used: gradients of the input, the router and the experts
    r_out = torch.randn(x.shape, generator=_gen(14))

    def grad_probe(impl):
        m = _moe(impl, state, kw, mode="train")
        xx = x.clone().requires_grad_(True)
        (m(xx) * r_out).sum().backward()
        named = dict(unwrap(m).named_parameters())
        return [xx.grad if xx.grad is not None else torch.zeros_like(xx)] + [
            named[k].grad if named[k].grad is not None else torch.zeros_like(named[k])
            for k in ("gate.weight", "shared_experts.up_proj.weight")]

    r_mod = ref["DeepSeekMoE"](**kw).train()
    r_mod.load_state_dict(state)
    xr = x.clone().requires_grad_(True)
    (r_mod(xr) * r_out).sum().backward()
    want_g = [xr.grad, r_mod.gate.weight.grad, r_mod.shared_experts.up_proj.weight.grad]
    t.compare(grad_probe, want_g, "gradients of Σ r·output (training mode) with respect to the input, the router "
              "weight and a shared-expert weight: the layer must stay differentiable (no .detach())",
              atol=1e-5, rtol=1e-4)

    # training mode: last_indices and update_bias
    def train_probe(impl):
        m = _moe(impl, state, dict(kw, bias_update_speed=0.01), mode="train")
        before = m.gate.e_score_correction_bias.detach().clone()
        m(x)
        m.update_bias()
        return [m.last_indices, before, m.gate.e_score_correction_bias.detach().clone()]

    last, before, after = t.run(train_probe)
    with torch.no_grad():
        want_idx = r.gate(x)[2].sort(-1).values
    t.expect(torch.is_tensor(last) and tuple(last.shape) == tuple(want_idx.shape)
             and torch.equal(last.long().sort(-1).values, want_idx),
             "in training mode forward must store last_indices (N, top_k): the experts chosen for each token")
    c = torch.bincount(want_idx.flatten(), minlength=kw["n_routed_experts"]).float()
    t.expect(after.dtype == torch.float32 and torch.allclose(after, before + 0.01 * torch.sign(c.mean() - c),
                                                             atol=1e-7),
             "update_bias() must apply bias + bias_update_speed·sign(mean load − load) to gate.e_score_correction_bias "
             "using the loads of the last training-mode forward")


# ================================================================== 14.sequence_balance_loss


def _seq_loss_loop(scores, indices, num_experts, alpha):
    """The checker's own route: a loop over sequences and experts (differentiable in ``scores``)."""
    b, t, k = indices.shape
    total = 0.0
    for s in range(b):
        shares = scores[s] / scores[s].sum(-1, keepdim=True)
        seq = 0.0
        for i in range(num_experts):
            f = num_experts / (k * t) * float((indices[s] == i).sum())
            seq = seq + f * shares[:, i].mean()
        total = total + alpha * seq
    return total / b


@check(f"{U}.sequence_balance_loss", ["sequence_balance_loss"], _ref_seq)
def check_sequence_balance_loss(t):
    even = torch.tensor([[[0, 1], [2, 3]] * 4] * 2)
    for value in (0.37, 0.9):
        flat = torch.full((2, 8, 4), value)
        t.compare(lambda impl, flat=flat: impl.sequence_balance_loss(flat, even, 4, 0.01).float(), torch.tensor(0.01),
                  f"balanced sequences whose experts all have affinity {value}: the loss must be exactly alpha "
                  "(P_i uses each token's affinities as shares of their sum)", atol=1e-7, rtol=1e-5)
    split = torch.tensor([[[0, 1]] * 8, [[2, 3]] * 8])
    sure = torch.full((2, 8, 4), 0.1).scatter(2, split, 0.9)
    t.compare(lambda impl: impl.sequence_balance_loss(sure, split, 4, 0.01).float(),
              _seq_loss_loop(sure, split, 4, 0.01), "two sequences collapsed onto different experts (balanced as a "
              "batch): each sequence is judged on its own tokens", atol=1e-7, rtol=1e-5)
    t.compare(lambda impl: impl.sequence_balance_loss(sure[:1], split[:1], 4, 0.01).float(),
              _seq_loss_loop(sure[:1], split[:1], 4, 0.01), "one collapsed sequence alone (the pair above must "
              "cost the same)", atol=1e-7, rtol=1e-5)
    g = _gen(7)
    sc = torch.rand(3, 10, 6, generator=g) + 0.05
    idx = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(30)]).view(3, 10, 2)
    t.compare(lambda impl: impl.sequence_balance_loss(sc, idx, 6, 0.05).float(), _seq_loss_loop(sc, idx, 6, 0.05),
              "a random batch (B=3, T=10, E=6, k=2, alpha=0.05)", atol=1e-7, rtol=1e-5)
    t.compare(lambda impl: impl.sequence_balance_loss(sc, idx, 6).float(), _seq_loss_loop(sc, idx, 6, 1e-4),
              "the same batch with the default alpha (1e-4)", atol=1e-9, rtol=1e-5)

    def grad_probe(impl):
        p = sc.clone().requires_grad_(True)
        impl.sequence_balance_loss(p, idx, 6, 0.05).backward()
        return p.grad

    p = sc.clone().requires_grad_(True)
    _seq_loss_loop(p, idx, 6, 0.05).backward()
    grad = t.run(grad_probe)
    t.expect(grad is not None, "the loss must be differentiable in scores (no .detach() or .item() on them)")
    t.expect(torch.allclose(grad, p.grad, atol=1e-7), "d loss / d scores differs from the gradient of the loss as "
             "defined: the counts carry no gradient, the shares are each token's affinities over their sum")
    perm = torch.randperm(10, generator=_gen(8))
    pair = t.run(lambda impl: [impl.sequence_balance_loss(sc, idx, 6, 0.05).float(),
                               impl.sequence_balance_loss(sc[:, perm], idx[:, perm], 6, 0.05).float()])
    t.expect(torch.allclose(pair[0], pair[1], atol=1e-8), "the loss must not depend on the order of the tokens "
             "inside a sequence")


# ================================================================== declared strength (grader/strength.py)
from ..strength import decision, defining_property  # noqa: E402

defining_property(f"{U}.softmax_topk_route", "softmax over all experts, the k most probable chosen in order, their "
                  "probabilities renormalised only when asked",
                  probe="returned probs, indices and weights for both renormalize values against softmax/topk here")
defining_property(f"{U}.load_balancing_loss", "alpha·Σ f_i·P_i with f_i the assignment counts normalised so that a "
                  "balanced router gives f_i = 1 for any k; the counts carry no gradient",
                  probe="values at the two boundary cases and on a random router (k = 2); d loss / d probs against "
                        "alpha·f_i/N; invariance under a token permutation")
defining_property(f"{U}.deepseek_route", "sigmoid affinities; the bias chooses groups and experts but never weighs them; "
                  "experts of excluded groups can never be chosen, however negative the biased scores",
                  probe="chosen experts and weights against transformers' DeepseekV3TopkRouter with random biases and the "
                        "negative-bias worked example")
defining_property(f"{U}.update_bias", "the sign rule b + γ·sign(c̄ − c) with c̄ the mean load over all E experts, a "
                  "new float32 tensor",
                  probe="returned biases for skewed, balanced, idle-expert and random loads; the argument left unchanged; "
                        "a bfloat16 input")
defining_property(f"{U}.DeepSeekMoE", "routed experts run only on their tokens and are combined with the routing weights, "
                  "plus the shared experts; the bias is a buffer moved only by the sign rule",
                  probe="outputs against transformers' DeepseekV3MoE (on the course's routing, so exercise 3 is graded "
                        "once); forward hooks counting which experts run; state before/after forwards; last_indices")
defining_property(f"{U}.sequence_balance_loss", "exercise 2's product asked of every sequence on its own, with "
                  "affinities normalised per token, averaged over the batch",
                  probe="values for balanced sequences, two collapsed sequences balanced as a batch, random scores, "
                        "against a loop here; the gradient in scores")

decision(f"{U}.deepseek_route", "how an expert outside the kept groups is excluded from the top-k (its score must be "
         "below any allowed score, even negative ones)",
         forms=[r"masked_fill\([^)]*-\s*(float\(\s*['\"])?inf", r"-\s*inf(inity)?\b[^.]{0,60}(exclud|outside|masked)",
                r"(exclud|outside|masked)[^.]{0,60}-\s*inf(inity)?\b", r"−∞|-∞"],
         wrong=("B14.group_mask_zero",))
decision(f"{U}.load_balancing_loss", "the normalisation of f_i: E/(k·N) times the counts",
         forms=[r"E\s*/\s*\(\s*k\s*\*?\s*N\s*\)", r"num_experts\s*/\s*\(\s*k\s*\*\s*n\s*\)",
                r"\*\s*E\s*/\s*\(\s*k\s*\*?\s*[NT]\b"],
         wrong=("B14.aux_no_scale", "B14.aux_no_topk_scale"))
