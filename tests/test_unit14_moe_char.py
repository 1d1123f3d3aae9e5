"""Unit 14's reference pipeline: the MoE character model, its dense twin, the recorded loads and the asset."""

from __future__ import annotations

import pytest
import torch

from llmcourse.models.deepseek_moe import DeepSeekMoE, load_balancing_loss
from llmcourse.train import moe_char


def _model(**kw):
    torch.manual_seed(0)
    return moe_char.MoECharModel(moe_char.moe_char_config(), **kw)


def test_dense_twin_has_the_active_parameters_of_the_moe_model():
    moe, dense = _model(), moe_char.dense_char_model()
    assert all(isinstance(layer.mlp, DeepSeekMoE) for layer in moe.layers)
    n_moe = sum(p.numel() for p in moe.parameters())
    n_dense = sum(p.numel() for p in dense.parameters())
    per_layer_inactive = 6 * 3 * 128 * 128  # six routed experts idle per token
    routers = 3 * 8 * 128
    assert n_moe - 3 * per_layer_inactive - routers == n_dense


def test_aux_loss_reaches_the_router_through_the_logits():
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    plain, aux = _model().train(), _model(aux_alpha=0.5).train()
    plain(idx).sum().backward()
    aux(idx).sum().backward()
    g0, g1 = plain.layers[0].mlp.gate.weight.grad, aux.layers[0].mlp.gate.weight.grad
    # expected extra gradient: that of the summed auxiliary losses alone
    ref = _model(aux_alpha=0.5).train()
    ref(idx)
    total = 0.0
    for m in ref.moe_layers():
        s = torch.sigmoid(m.last_router_logits)
        total = total + load_balancing_loss(s / s.sum(-1, keepdim=True), m.last_indices, 8, 0.5)
    total.backward()
    torch.testing.assert_close(g1 - g0, ref.layers[0].mlp.gate.weight.grad, atol=1e-6, rtol=1e-4)
    assert aux.last_aux == pytest.approx(float(total.detach()), rel=1e-5)


def test_short_runs_record_loads_and_update_the_bias_only_when_asked():
    recipe = dict(steps=3, warmup_steps=1, eval_every=3, eval_batches=1, batch_size=4, context_length=16)
    m0, h0 = moe_char.train_moe_char(recipe, progress=False)
    m1, h1 = moe_char.train_moe_char(recipe, gamma=0.01, progress=False)
    assert h0["loads"].shape == (3, 3, 8) and int(h0["loads"][0, 0].sum()) == 4 * 16 * 2
    assert torch.equal(h0["loads"][0], h1["loads"][0])  # same start, same first batch
    assert all(torch.count_nonzero(m.gate.e_score_correction_bias) == 0 for m in m0.moe_layers())
    b = m1.layers[0].mlp.gate.e_score_correction_bias
    assert b.dtype == torch.float32 and torch.count_nonzero(b) > 0
    assert torch.allclose((b / 0.01).round(), b / 0.01, atol=1e-4)  # whole steps of ±γ
    assert "gate.e_score_correction_bias" not in dict(m1.named_parameters())


def test_max_mean_ratio():
    assert moe_char.max_mean_ratio(torch.tensor([4, 0, 0, 0])).item() == 4.0
    assert moe_char.max_mean_ratio(torch.tensor([[2, 2], [3, 1]])).tolist() == [1.0, 1.5]


def test_the_shipped_asset():
    p = moe_char.moe_load_runs_path()
    if not p.exists():
        pytest.skip("assets/moe_load_runs.pt not generated")
    assert p.stat().st_size < 2_000_000
    data = moe_char.load_moe_load_runs()
    assert set(data["runs"]) == set(moe_char.RUNS)
    steps = data["recipe"]["steps"]
    for name, run in data["runs"].items():
        assert run["loads"].shape == (steps, 3, 8)
        assert (run["loads"].sum(-1) == data["recipe"]["batch_size"] * data["recipe"]["context_length"] * 2).all()
        assert run["router_logits"].shape == (3, len(data["probe_text"]), 8)
        assert (run["final_bias"] != 0).any() == (run["gamma"] > 0)
