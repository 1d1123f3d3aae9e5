"""Unit 14: routing functions and DeepSeekMoE against hand-computed fixtures and transformers' DeepSeek-V3.

Reference numbers come from the worked examples (computed by hand from the formulas) and from
``transformers`` 5.23's ``DeepseekV3TopkRouter`` / ``DeepseekV3MoE`` with the same weights.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmcourse.models.deepseek_moe import (
    DeepSeekMoE,
    deepseek_route,
    expert_counts,
    load_balancing_loss,
    load_hf_deepseek_moe,
    moe_param_counts,
    moe_state_dict_from_hf,
    random_hf_deepseek_moe,
    softmax_topk_route,
    update_bias,
)

F143_LOGITS = torch.logit(torch.tensor([[0.9, 0.8, 0.3, 0.2]]))
F143_BIAS = torch.tensor([-1.0, -1.0, -1.5, -1.5])


def test_softmax_topk_worked_example_and_renormalisation():
    w, i, p = softmax_topk_route(torch.tensor([[2.0, 1.0, 0.5, 0.0]]), 2)
    e = torch.exp(torch.tensor([2.0, 1.0, 0.5, 0.0]))
    torch.testing.assert_close(p[0], e / e.sum())
    assert i.tolist() == [[0, 1]]
    torch.testing.assert_close(w[0], torch.tensor([1 / (1 + math.exp(-1)), 1 - 1 / (1 + math.exp(-1))]))
    logits = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
    w, i, p = softmax_topk_route(logits, 3)
    torch.testing.assert_close(w, torch.softmax(logits.gather(1, i), -1))
    w2, _, _ = softmax_topk_route(logits, 3, renormalize=False)
    torch.testing.assert_close(w2, p.gather(1, i))
    with pytest.raises(ValueError):
        softmax_topk_route(logits, 9)


def test_load_balancing_loss_extremes_and_gradient():
    n, e, a = 8, 4, 0.01
    probs = torch.full((n, e), 1 / e, requires_grad=True)
    idx = torch.tensor([[0, 1], [2, 3]] * 4)
    loss = load_balancing_loss(probs, idx, e, a)
    torch.testing.assert_close(loss, torch.tensor(a))
    loss.backward()
    assert probs.grad is not None
    onehot = torch.zeros(n, e)
    onehot[:, 0] = 1
    torch.testing.assert_close(load_balancing_loss(onehot, torch.zeros(n, 1, dtype=torch.long), e, a),
                               torch.tensor(a * e))


def test_deepseek_route_worked_example_and_known_bugs():
    w, i = deepseek_route(F143_LOGITS, F143_BIAS, 2, 2, 1)
    assert sorted(i[0].tolist()) == [0, 1]
    torch.testing.assert_close(w[0], torch.tensor([0.9 / 1.7, 0.8 / 1.7]))
    w, _ = deepseek_route(F143_LOGITS, F143_BIAS, 2, 2, 1, routed_scaling_factor=2.5)
    torch.testing.assert_close(w[0], torch.tensor([2.5 * 0.9 / 1.7, 2.5 * 0.8 / 1.7]))
    assert w.dtype == torch.float32 and i.dtype == torch.long
    # masking with 0 instead of -inf would let the excluded group win (biased scores are all negative)
    sb = torch.sigmoid(F143_LOGITS) + F143_BIAS
    zero_masked = torch.where(torch.tensor([[True, True, False, False]]), sb, torch.zeros_like(sb))
    assert sorted(zero_masked.topk(2).indices[0].tolist()) == [2, 3]


def test_update_bias_sign_rule_and_precision():
    idx = torch.tensor([[0, 0], [0, 0], [0, 1], [2, 3]])  # counts 5, 1, 1, 1
    assert expert_counts(idx, 4).tolist() == [5, 1, 1, 1]
    new = update_bias(torch.zeros(4), idx, 4, 0.001)
    torch.testing.assert_close(new, torch.tensor([-0.001, 0.001, 0.001, 0.001]))
    out = update_bias(torch.ones(4, dtype=torch.bfloat16), idx, 4, 0.001)
    assert out.dtype == torch.float32 and out[1].item() == pytest.approx(1.001, abs=1e-6)
    balanced = torch.tensor([[0, 1], [2, 3]])
    assert torch.equal(update_bias(torch.full((4,), 0.25), balanced, 4), torch.full((4,), 0.25))


def test_param_counts_match_the_module():
    c = moe_param_counts(128, 128, 8, 1, 2)
    assert (c["expert"], c["total"], c["active"]) == (49_152, 443_392, 148_480)
    m = DeepSeekMoE(128, 128, 8, 1, 2)
    assert sum(p.numel() for p in m.parameters()) == c["total"]
    assert math.comb(16, 2) == 120 and math.comb(64, 8) == 4_426_165_368


def test_bias_is_a_float32_buffer_and_update_uses_last_routing():
    m = DeepSeekMoE(16, 8, 4, 1, 2, bias_update_speed=0.01)
    names = {n for n, _ in m.named_parameters()}
    assert "gate.e_score_correction_bias" not in names
    assert "gate.e_score_correction_bias" in m.state_dict()
    assert m.gate.e_score_correction_bias.dtype == torch.float32
    m.train()
    m(torch.randn(3, 5, 16))
    assert m.last_indices.shape == (15, 2)
    expected = update_bias(m.gate.e_score_correction_bias, m.last_indices, 4, 0.01)
    m.update_bias()
    assert torch.equal(m.gate.e_score_correction_bias, expected)


def test_experts_without_tokens_are_not_run_and_rows_are_independent():
    torch.manual_seed(0)
    m = DeepSeekMoE(16, 8, 8, 1, 2).eval()
    calls = [0] * 8
    for e, ex in enumerate(m.experts):
        ex.register_forward_hook(lambda *_, e=e: calls.__setitem__(e, calls[e] + 1))
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        m(x)
    assert sum(calls) == 2
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        full = m(x)
        for b in range(2):
            for t in range(6):
                torch.testing.assert_close(m(x[b:b + 1, t:t + 1])[0, 0], full[b, t], atol=1e-6, rtol=1e-5)


PARITY = [
    dict(d_model=16, moe_intermediate_size=8, n_routed_experts=8, n_shared_experts=1, top_k=2),
    dict(d_model=16, moe_intermediate_size=8, n_routed_experts=8, n_shared_experts=2, top_k=3, n_group=4,
         topk_group=2, routed_scaling_factor=2.5),
    dict(d_model=24, moe_intermediate_size=12, n_routed_experts=16, n_shared_experts=1, top_k=4, n_group=4,
         topk_group=2, routed_scaling_factor=1.5, norm_topk_prob=False),
]


@pytest.mark.parametrize("kw", PARITY)
def test_router_and_moe_equal_transformers_deepseek_v3(kw):
    pytest.importorskip("transformers")
    hf = random_hf_deepseek_moe(seed=1, std=0.3, bias_std=0.2, **kw)
    assert hf.experts.gate_up_proj.dim() == 3  # transformers 5 fuses the experts; the converter unfuses them
    ours = load_hf_deepseek_moe(hf).eval()
    x = torch.randn(3, 9, kw["d_model"], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        lh, wh, ih = hf.gate(x)
        lo, wo, io = ours.gate(x)
        torch.testing.assert_close(lo, lh, atol=0, rtol=0)
        sh, oh = ih.sort(-1)
        so, oo = io.sort(-1)
        assert torch.equal(sh, so)
        torch.testing.assert_close(wo.gather(1, oo), wh.gather(1, oh), atol=1e-7, rtol=1e-6)
        torch.testing.assert_close(ours(x), hf(x), atol=1e-5, rtol=1e-5)
    # the bias matters for selection in these draws (otherwise the test would not see a biased-gate bug)
    _, i_nob = deepseek_route(lh, torch.zeros_like(hf.gate.e_score_correction_bias), kw["top_k"],
                                  kw.get("n_group", 1), kw.get("topk_group", 1))
    assert not torch.equal(i_nob.sort(-1).values, sh)


def test_state_dict_conversion_splits_gate_and_up_rows():
    sd = {"experts.gate_up_proj": torch.arange(2 * 6 * 3.0).view(2, 6, 3),
          "experts.down_proj": torch.arange(2 * 3 * 3.0).view(2, 3, 3)}
    out = moe_state_dict_from_hf(sd)
    assert torch.equal(out["experts.1.gate_proj.weight"], sd["experts.gate_up_proj"][1, :3])
    assert torch.equal(out["experts.1.up_proj.weight"], sd["experts.gate_up_proj"][1, 3:])
    assert torch.equal(out["experts.0.down_proj.weight"], sd["experts.down_proj"][0])


# ---------------------------------------------------------------- issue 27: capacity, sequence-wise loss, profile


def test_capacity_mask_equals_a_loop_over_assignments_in_token_order():
    from llmcourse.models.deepseek_moe import capacity_mask

    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(200)])
    idx[:60] = torch.tensor([0, 1])                      # skew: experts 0 and 1 overloaded
    for factor in (0.5, 1.0, 1.25, 3.0):
        kept, cap = capacity_mask(idx, 8, factor)
        assert cap == int(factor * 2 * 200 / 8)
        served, want = [0] * 8, torch.zeros_like(kept)
        for t in range(200):
            for j in range(2):
                e = int(idx[t, j])
                if served[e] < cap:
                    want[t, j], served[e] = True, served[e] + 1
        assert torch.equal(kept, want)
    balanced = torch.arange(64 * 2).remainder(8).view(64, 2)
    assert capacity_mask(balanced, 8, 1.0)[0].all()


def test_sequence_balance_loss_properties():
    from llmcourse.models.deepseek_moe import load_balancing_loss, sequence_balance_loss

    sc = torch.rand(1, 12, 8, generator=torch.Generator().manual_seed(4)) + 0.01
    ind = sc.topk(2, -1).indices
    torch.testing.assert_close(sequence_balance_loss(sc, ind, 8, 0.001),
                               load_balancing_loss((sc / sc.sum(-1, keepdim=True))[0], ind[0], 8, 0.001))
    even = torch.tensor([[[0, 1], [2, 3]] * 4] * 2)
    for value in (0.2, 0.9):
        assert abs(sequence_balance_loss(torch.full((2, 8, 4), value), even, 4, 0.01).item() - 0.01) < 1e-8
    split = torch.tensor([[[0, 1]] * 8, [[2, 3]] * 8])
    sure = torch.full((2, 8, 4), 0.1).scatter(2, split, 0.9)
    pair = sequence_balance_loss(sure, split, 4, 0.01)
    torch.testing.assert_close(pair, sequence_balance_loss(sure[:1], split[:1], 4, 0.01))
    batch = load_balancing_loss((sure / sure.sum(-1, keepdim=True)).view(-1, 4), split.view(-1, 2), 4, 0.01)
    assert abs(batch.item() - 0.01) < 1e-7 and pair.item() > 1.5 * batch.item()


def test_max_mean_ratio_is_at_most_e_over_k():
    from llmcourse.models.deepseek_moe import expert_counts
    from llmcourse.train.moe_char import max_mean_ratio

    g = torch.Generator().manual_seed(1)
    for k in (1, 2, 4):
        for _ in range(20):
            logits = torch.randn(50, 8, generator=g) * 3
            idx = logits.topk(k, -1).indices
            assert max_mean_ratio(expert_counts(idx, 8)).item() <= 8 / k + 1e-6
        assert max_mean_ratio(expert_counts(torch.arange(k).expand(50, k), 8)).item() == pytest.approx(8 / k)


def test_profile_moe_forward_reproduces_the_layer():
    from llmcourse.models.deepseek_moe import DeepSeekMoE, profile_moe_forward

    torch.manual_seed(0)
    m = DeepSeekMoE(16, 8, 8, 1, 2).eval()
    prof = profile_moe_forward(m, torch.randn(2, 10, 16), repeats=2)
    assert set(prof) >= {"router", "sort", "gather", "pack", "gemm", "scatter", "shared", "total"}
    assert prof["max_abs_diff"] < 1e-6 and prof["total"] > 0
