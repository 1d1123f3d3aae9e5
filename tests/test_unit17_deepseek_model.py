"""Unit 17 library: DeepSeekLM against transformers' DeepseekV3ForCausalLM, counts and cache sizes from
independent formulas, latent-cached generation, causality, MTP leakage, the training step and the helpers."""

from __future__ import annotations

import pytest
import torch

from llmcourse.models import GPT2Config, GPT2Model, LatentCache, Llama3Config, Llama3Model
from llmcourse.models.deepseek import (
    DeepSeekConfig,
    DeepSeekLM,
    cache_elems_per_token,
    compare_models,
    deepseek_state_dict_from_hf,
    fp8_eval,
    generate_latent_cached,
    greedy_uncached,
    load_hf_deepseek,
    param_counts,
    train_step,
)
from llmcourse.models.deepseek_moe import DeepSeekMoE
from llmcourse.quant.fp8 import FP8Linear


def _model(seed: int = 0, **kw) -> DeepSeekLM:
    torch.manual_seed(seed)
    return DeepSeekLM(DeepSeekConfig(**kw))


def _f17_1_hf(seed: int = 0, std: float = 0.05):
    """The parity configuration written out literally (not through the library's config builder)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV3Config(
        vocab_size=65, hidden_size=128, intermediate_size=384, moe_intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=1.0,
        kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32, n_group=4,
        topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1, tie_word_embeddings=True,
        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rope_interleave=True, attn_implementation="eager")
    hf = transformers.DeepseekV3ForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(hf.named_parameters()):
            r = torch.randn(p.shape, generator=g) * std
            p.copy_(1.0 + r if "norm" in name else r)
        for name, b in sorted(hf.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    return hf.eval()


def _tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 65, (b, t), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------ parity


def test_main_path_equals_transformers():
    hf = _f17_1_hf()
    model = load_hf_deepseek(_model(), hf.state_dict()).eval()
    idx = _tokens(3, 48)
    with torch.no_grad():
        ref = hf(idx).logits
        out = model(idx)["logits"]
    assert out.shape == (3, 48, 65)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=0)
    # the routing really matters: the selected experts differ between tokens and the bias was copied
    assert torch.equal(model.layers[1].mlp.gate.e_score_correction_bias,
                       hf.model.layers[1].mlp.gate.e_score_correction_bias.float())


def test_attention_matches_unit13_naive_path_for_every_mask_form():
    """The capstone attention (scores in one baddbmm with an additive mask) equals unit 13's naive MLA for a 2-D
    causal bool mask, a (B, H, T, T) bool mask, an additive float mask and no mask; a mask that hides the future
    changes the output (the test can fail)."""
    from llmcourse.models.deepseek import DeepSeekAttention
    from llmcourse.models.deepseek_mla import DeepSeekMLA
    from llmcourse.models.llama3 import rope_cos_sin, rope_inv_freq

    torch.manual_seed(0)
    attn = DeepSeekAttention(64, 4, None, 16, 16, 8, 16)
    x, t = torch.randn(2, 10, 64), 10
    cos, sin = rope_cos_sin(rope_inv_freq(8, 10000.0), torch.arange(t))
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    random4d = (torch.rand(2, 4, t, t) > 0.5) | torch.eye(t, dtype=torch.bool)
    additive = torch.zeros(t, t).masked_fill(~causal, float("-inf"))
    for mask in (causal, random4d, additive, None):
        ref = DeepSeekMLA.forward(attn, x, torch.arange(t), mask)
        torch.testing.assert_close(attn(x, cos, sin, mask), ref, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(attn(x, cos, sin, causal), attn(x, cos, sin, None), atol=1e-3)


def test_swapped_expert_halves_break_parity():
    hf = _f17_1_hf()
    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    for k in sd:
        if k.endswith("gate_up_proj"):
            i = sd[k].shape[1] // 2
            sd[k] = torch.cat([sd[k][:, i:], sd[k][:, :i]], dim=1)
    model = load_hf_deepseek(_model(), sd).eval()
    idx = _tokens(2, 16)
    with torch.no_grad():
        assert (model(idx)["logits"] - hf(idx).logits).abs().max() > 1e-3


def test_converter_keys():
    hf = _f17_1_hf()
    sd = deepseek_state_dict_from_hf(hf.state_dict())
    model = _model()
    main = {k for k in model.state_dict() if not k.startswith("mtp.")}
    assert set(sd) == main
    assert sd["layers.1.mlp.experts.3.gate_proj.weight"].shape == (128, 128)
    assert torch.equal(sd["layers.1.mlp.experts.3.up_proj.weight"],
                       hf.state_dict()["model.layers.1.mlp.experts.gate_up_proj"][3, 128:])


# ------------------------------------------------------------------------------------------------ structure


def test_keys_dense_first_layer_and_buffers():
    model = _model()
    sd = model.state_dict()
    assert "layers.0.mlp.gate_proj.weight" in sd and "layers.0.mlp.gate.weight" not in sd
    for i in (1, 2, 3):
        assert sd[f"layers.{i}.mlp.gate.e_score_correction_bias"].dtype == torch.float32
        assert f"layers.{i}.mlp.experts.7.down_proj.weight" in sd
        assert f"layers.{i}.mlp.shared_experts.up_proj.weight" in sd
    assert "mtp.0.mtp_block.mlp.gate_proj.weight" in sd and "mtp.0.eh_proj.weight" in sd
    assert model.lm_head.weight is model.embed_tokens.weight
    names = {n for n, _ in model.named_parameters()}
    assert not any("e_score_correction_bias" in n for n in names)
    assert {n for n, _ in model.named_buffers() if "bias" in n} == {
        f"layers.{i}.mlp.gate.e_score_correction_bias" for i in (1, 2, 3)}


def test_parameter_counts_from_formulas():
    d, v, h, dc, dr, dn, dv, ff, fi, e, s, k = 128, 65, 4, 64, 16, 32, 32, 384, 128, 8, 1, 2
    mla = d * h * (dn + dr) + d * (dc + dr) + dc + dc * h * (dn + dv) + h * dv * d
    expert = 3 * d * fi
    dense = mla + 3 * d * ff + 2 * d
    moe = mla + e * expert + s * expert + e * d + 2 * d
    total = v * d + dense + 3 * moe + d
    active = v * d + dense + 3 * (mla + k * expert + s * expert + e * d + 2 * d) + d
    mtp = 3 * d + 2 * d * d + dense
    assert (mla, dense, moe, total, active, mtp) == (67_648, 215_360, 511_296, 1_757_696, 872_960, 248_512)
    model = _model()
    assert param_counts(model) == {"total": total, "active": active}
    assert sum(p.numel() for p in model.mtp[0].parameters()) == mtp
    gpt = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
    llama = Llama3Model(Llama3Config.preset("llama3-tiny"))
    assert param_counts(gpt) == {"total": 809_856, "active": 809_856}
    assert param_counts(llama) == {"total": 795_904, "active": 795_904}
    # no MTP: the same main-path counts
    assert param_counts(_model(mtp_depth=0)) == {"total": total, "active": active}


def test_cache_elements_per_token():
    model = _model()
    assert cache_elems_per_token(model) == 4 * (64 + 16) == 320
    assert cache_elems_per_token(Llama3Model(Llama3Config.preset("llama3-tiny"))) == 4 * 2 * 2 * 32 == 512
    assert cache_elems_per_token(GPT2Model(GPT2Config.preset("gpt2-char-tiny"))) == 4 * 4 * 2 * 32 == 1024
    # read from a filled cache
    toks, cache = generate_latent_cached(model, _tokens(2, 7), 6)
    assert cache.seq_len == 12
    assert cache.nbytes() == 320 * 12 * 2 * 4
    for layer in range(4):
        assert cache.c_kv[layer].shape == (2, 12, 64) and cache.k_pe[layer].shape == (2, 12, 16)


# ------------------------------------------------------------------------------------------------ behaviour


def test_cached_generation_equals_uncached_and_decodes_one_token():
    model = _model(3)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():            # N(0, 0.02²) weights give flat logits: widen them so the tokens vary
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    prompt = _tokens(2, 5)
    lengths = []
    hook = model.layers[0].register_forward_pre_hook(lambda m, args: lengths.append(args[0].shape[1]))
    toks, cache = generate_latent_cached(model, prompt, 12)
    hook.remove()
    assert isinstance(cache, LatentCache)
    assert lengths == [5] + [1] * 11
    assert torch.equal(toks, greedy_uncached(model, prompt, 12))
    assert not any(len(set(r.tolist())) == 1 for r in toks[:, 5:])   # a real sequence, not a constant


def test_causality():
    model = _model(4).eval()
    idx = _tokens(1, 20)
    alt = idx.clone()
    alt[0, 12] = (alt[0, 12] + 1) % 65
    with torch.no_grad():
        a, b = model(idx)["logits"], model(alt)["logits"]
    assert torch.equal(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_mtp_leakage():
    model = _model(5).eval()
    x = _tokens(1, 21)
    x, y = x[:, :-1], x[:, 1:]
    p = 10
    x2, y2 = x.clone(), y.clone()
    x2[0, p] = (x2[0, p] + 1) % 65
    y2[0, p - 1] = x2[0, p]
    with torch.no_grad():
        a, b = model(x, y)["mtp_logits"][0], model(x2, y2)["mtp_logits"][0]
    # depth 1 at position i embeds token i+1: positions i < p-1 must not see token p
    assert torch.equal(a[:, :p - 1], b[:, :p - 1])
    assert not torch.allclose(a[:, p - 1], b[:, p - 1])


def test_loss_is_main_plus_weighted_mtp():
    model = _model(6, mtp_depth=2, mtp_lambda=0.4)
    x = _tokens(2, 17)
    out = model(x[:, :-1], x[:, 1:])
    assert len(out["loss_mtp"]) == 2
    torch.testing.assert_close(out["loss"], out["loss_main"] + 0.4 / 2 * (out["loss_mtp"][0] + out["loss_mtp"][1]))
    lg = out["logits"]
    torch.testing.assert_close(out["loss_main"], torch.nn.functional.cross_entropy(lg.reshape(-1, 65),
                                                                                   x[:, 1:].reshape(-1)))


def test_trunk_does_not_depend_on_mtp_depth():
    a, b = _model(7, mtp_depth=0), _model(7, mtp_depth=1)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_train_step_bias_rule_and_clipping():
    model = _model(8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    biases = [m.gate.e_score_correction_bias for m in model.layers if isinstance(m.mlp, DeepSeekMoE) for m in [m.mlp]]
    assert all(id(b) not in in_opt for b in biases)
    before = [b.clone() for b in biases]
    x = _tokens(2, 17)
    rec = train_step(model, opt, x[:, :-1], x[:, 1:])
    assert len(rec["expert_load"]) == 3
    for b0, b1, c in zip(before, biases, rec["expert_load"]):
        assert c.dtype == torch.long and c.shape == (8,) and int(c.sum()) == 2 * 16 * 2
        c = c.float()
        torch.testing.assert_close(b1 - b0, 0.001 * torch.sign(c.mean() - c), atol=1e-7, rtol=0)
    assert rec["loss"] == pytest.approx(rec["loss_main"] + 0.3 * rec["loss_mtp"][0], rel=1e-6)
    # clipping acts before the step: with plain SGD (lr 1) the update's norm is at most max_norm
    model2 = _model(9)
    sgd = torch.optim.SGD(model2.parameters(), lr=1.0)
    old = [p.detach().clone() for p in model2.parameters()]
    rec2 = train_step(model2, sgd, x[:, :-1], x[:, 1:], max_norm=0.01)
    step = torch.sqrt(sum(((p.detach() - o) ** 2).sum() for p, o in zip(model2.parameters(), old)))
    assert rec2["grad_norm"] > 0.01 and float(step) <= 0.01 * 1.001


def test_bias_update_needs_a_training_forward():
    model = _model(10)
    before = [m.gate.e_score_correction_bias.clone() for m in model.moe_layers()]
    model.update_router_biases()           # nothing recorded yet
    assert all(torch.equal(a, m.gate.e_score_correction_bias) for a, m in zip(before, model.moe_layers()))
    model.eval()
    with torch.no_grad():
        model(_tokens(1, 8))
    model.update_router_biases()           # eval forwards record nothing
    assert all(torch.equal(a, m.gate.e_score_correction_bias) for a, m in zip(before, model.moe_layers()))


def test_compare_models_identical_batches_and_rows():
    data = torch.randint(0, 65, (3000,), generator=torch.Generator().manual_seed(0))
    seen: dict[str, list] = {}

    def spy(name, model):
        orig = model.forward

        def fwd(idx, *a, **k):
            if model.training:
                seen.setdefault(name, []).append(idx.clone())
            return orig(idx, *a, **k)
        model.forward = fwd
        return model

    torch.manual_seed(0)
    models = {"gpt": spy("gpt", GPT2Model(GPT2Config.preset("gpt2-char-tiny"))),
              "llama": spy("llama", Llama3Model(Llama3Config.preset("llama3-tiny"))),
              "deepseek": spy("deepseek", _model(11))}
    rows = compare_models(models, data[:2500], data[2500:], steps=3, batch_size=4, context_length=32,
                          lr_fn=lambda s: 1e-3, seed=5, eval_batches=2)
    assert [r["name"] for r in rows] == ["gpt", "llama", "deepseek"]
    assert [len(seen[n]) for n in ("gpt", "llama", "deepseek")] == [3, 3, 3]
    for s in range(3):
        assert torch.equal(seen["gpt"][s], seen["llama"][s]) and torch.equal(seen["gpt"][s], seen["deepseek"][s])
    assert rows[2]["total_params"] == 1_757_696 and rows[2]["active_params"] == 872_960
    assert [r["cache_elems_per_token"] for r in rows] == [1024, 512, 320]
    assert all(r["ms_per_step"] > 0 and r["val_loss"] > 0 for r in rows)


def test_fp8_eval_leaves_model_and_keeps_routers():
    model = _model(12)
    data = torch.randint(0, 65, (2000,), generator=torch.Generator().manual_seed(1))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    res = fp8_eval(model, data, n_batches=2, batch_size=4, context_length=32)
    assert set(res) == {"val_loss_fp32", "val_loss_fp8", "delta"}
    assert res["delta"] == pytest.approx(res["val_loss_fp8"] - res["val_loss_fp32"])
    assert abs(res["delta"]) < 0.05
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in sd.items())
    assert not any(isinstance(m, FP8Linear) for m in model.modules())


def test_fp8_copy_layout():
    import copy

    from llmcourse.quant.fp8 import convert_linears_to_fp8
    model = _model(13)
    c = copy.deepcopy(model)
    convert_linears_to_fp8(c.layers, skip=("lm_head", "gate"))
    assert isinstance(c.layers[0].self_attn.q_proj, FP8Linear)
    assert c.layers[1].mlp.gate.weight.dtype == torch.float32
    assert type(c.lm_head) is torch.nn.Linear and c.lm_head.weight is c.embed_tokens.weight
    assert not any(isinstance(m, FP8Linear) for m in c.mtp.modules())


def test_errors():
    model = _model(14)
    with pytest.raises(ValueError):
        model(_tokens(1, 257))
    with pytest.raises(ValueError):
        model(_tokens(1, 1), _tokens(1, 1))              # T ≤ mtp_depth
    with pytest.raises(ValueError):
        model(_tokens(1, 4), _tokens(1, 4), cache=LatentCache(4))
