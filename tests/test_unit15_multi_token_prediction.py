"""Unit 15: multi-token prediction (llmcourse.models.mtp).

No ``transformers`` oracle exists for MTP (5.23 has no MTP layer): the reference numbers come from a
hand-written per-position loop (every position computed on its own, from the equations) and from properties
(causality, loss weighting, equality with plain greedy decoding).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from llmcourse.models.llama3 import Llama3Block, Llama3Config, RMSNorm
from llmcourse.models.llama3_cached import generate_uncached
from llmcourse.models.mtp import (
    MTPLanguageModel,
    MTPModule,
    mtp_inputs_and_targets,
    mtp_param_count,
    speculative_generate,
    speculative_trace,
)

V = 65


def small_cfg(**kw) -> Llama3Config:
    base = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64,
                context_length=64, rope_theta=10000.0)
    base.update(kw)
    return Llama3Config(**base)


def make_model(depth=2, seed=0, scale=1.0, lam=0.3, **kw) -> MTPLanguageModel:
    torch.manual_seed(seed)
    m = MTPLanguageModel(small_cfg(**kw), mtp_depth=depth, mtp_lambda=lam)
    if scale != 1.0:
        with torch.no_grad():
            for name, p in m.named_parameters():
                if not name.endswith("norm.weight"):
                    p.mul_(scale)
    return m.eval()


def windows(b=2, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, V, (b, t + 1), generator=g)
    return w[:, :-1], w[:, 1:]


def test_alignment_fixture():
    w = torch.arange(10, 19)[None]
    x, y = w[:, :-1], w[:, 1:]
    e1, t1 = mtp_inputs_and_targets(x, y, 1)
    assert e1.tolist() == [list(range(11, 18))] and t1.tolist() == [list(range(12, 19))]
    e2, t2 = mtp_inputs_and_targets(x, y, 2)
    assert e2.tolist() == [list(range(12, 18))] and t2.tolist() == [list(range(13, 19))]
    for k in (1, 2, 3):
        e, t = mtp_inputs_and_targets(x, y, k)
        for i in range(e.shape[1]):
            assert int(e[0, i]) == int(w[0, i + k]) and int(t[0, i]) == int(w[0, i + k + 1])


@pytest.mark.parametrize("bad", [0, -1, 8, 1.0])
def test_alignment_errors(bad):
    x = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(ValueError):
        mtp_inputs_and_targets(x, x, bad)
    with pytest.raises(ValueError):
        mtp_inputs_and_targets(x, x[:, :7], 1)


def test_param_count_tiny():
    cfg = Llama3Config.preset("llama3-tiny")
    mod = MTPModule(cfg.d_model, Llama3Block(cfg), cfg.rms_norm_eps)
    n = sum(p.numel() for p in mod.parameters())
    assert n == mtp_param_count(cfg) == 230_016
    parts = {k: v.numel() for k, v in mod.state_dict().items() if not k.startswith("mtp_block.")}
    assert parts == {"enorm.weight": 128, "hnorm.weight": 128, "eh_proj.weight": 32_768, "post_norm.weight": 128}


def test_module_keys_and_equation():
    d = 16
    cfg = small_cfg(d_model=d, n_heads=2, n_kv_heads=1, intermediate_size=24)
    torch.manual_seed(1)
    mod = MTPModule(d, Llama3Block(cfg), 1e-5)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_()
    assert tuple(mod.eh_proj.weight.shape) == (d, 2 * d) and mod.eh_proj.bias is None
    h, e = torch.randn(2, 5, d), torch.randn(2, 5, d)
    from llmcourse.models.llama3 import rope_cos_sin, rope_inv_freq
    cos, sin = rope_cos_sin(rope_inv_freq(cfg.hd, 10000.0), torch.arange(3, 8))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    out = mod(h, e, cos, sin, mask)

    def rms(x, w):  # independent RMSNorm, float64
        x = x.double()
        return w.double() * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)

    z = torch.cat([rms(e, mod.enorm.weight), rms(h, mod.hnorm.weight)], -1) @ mod.eh_proj.weight.double().T
    ref = rms(mod.mtp_block(z.float(), cos, sin, mask), mod.post_norm.weight)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    swapped = torch.cat([rms(h, mod.hnorm.weight), rms(e, mod.enorm.weight)], -1) @ mod.eh_proj.weight.double().T
    assert (mod.mtp_block(swapped.float(), cos, sin, mask).double() - mod.mtp_block(z.float(), cos, sin, mask)
            .double()).abs().max() > 1e-2  # the order is visible
    with pytest.raises(ValueError):
        mod(h, e[:, :4], cos, sin, mask)


def test_model_keys_shared_embedding_and_head():
    m = make_model(depth=2)
    keys = list(m.state_dict())
    assert all(k.startswith(("model.", "mtp.0.", "mtp.1.")) for k in keys)
    assert not any(("embed" in k or "lm_head" in k) for k in keys if k.startswith("mtp."))
    assert {k for k in keys if k.startswith("mtp.0.")} >= {"mtp.0.enorm.weight", "mtp.0.hnorm.weight",
                                                            "mtp.0.eh_proj.weight", "mtp.0.post_norm.weight",
                                                            "mtp.0.mtp_block.self_attn.q_proj.weight"}
    n_unique = len({id(p) for p in m.parameters()})
    assert n_unique == len(list(m.parameters()))
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in m.model.parameters()) + \
        2 * mtp_param_count(m.cfg)


def loop_reference(m: MTPLanguageModel, x, y):
    """Per-position reference from the equations: every depth-k position i is computed from scratch on the
    prefix it may see, with explicit absolute RoPE positions (no slicing of whole-sequence tensors)."""
    mm = m.model
    t = x.shape[1]
    h0 = m.trunk(x)
    losses = []
    prev = h0  # prev[:, j] = state of the previous depth at position j
    logits_all = []
    for k in range(1, m.mtp_depth + 1):
        n = t - k
        inputs = torch.stack([m.mtp[k - 1].eh_proj(torch.cat([m.mtp[k - 1].enorm(mm.embed_tokens(x[:, j + k])),
                                                               m.mtp[k - 1].hnorm(prev[:, j])], -1))
                              for j in range(n)], 1)
        outs = []
        for i in range(n):  # position i sees inputs 0..i only; RoPE at absolute positions k..k+i
            pos = torch.arange(k, k + i + 1)
            cos, sin = mm.rope_cos[pos], mm.rope_sin[pos]
            hb = m.mtp[k - 1].mtp_block(inputs[:, :i + 1], cos, sin, None)
            outs.append(m.mtp[k - 1].post_norm(hb[:, -1]))
        hk = torch.stack(outs, 1)
        lg = mm.lm_head(hk)
        logits_all.append(lg)
        losses.append(F.cross_entropy(lg.reshape(-1, V), y[:, k:].reshape(-1)))
        prev = hk
    return logits_all, losses


@torch.no_grad()
def test_forward_matches_per_position_reference():
    m = make_model(depth=2, scale=3.0)
    x, y = windows(2, 10)
    out = m(x, y)
    ref_logits, ref_losses = loop_reference(m, x, y)
    for k in range(2):
        torch.testing.assert_close(out["mtp_logits"][k], ref_logits[k], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out["loss_mtp"][k], ref_losses[k], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["logits"], m.model(x))
    torch.testing.assert_close(out["loss_main"], F.cross_entropy(m.model(x).reshape(-1, V), y.reshape(-1)))


@torch.no_grad()
@pytest.mark.parametrize("depth,lam", [(1, 0.3), (2, 0.3), (3, 0.1)])
def test_loss_weighting(depth, lam):
    m = make_model(depth=depth, lam=lam)
    x, y = windows(2, 12)
    out = m(x, y)
    expected = out["loss_main"] + lam / depth * sum(out["loss_mtp"])
    torch.testing.assert_close(out["loss"], expected)
    assert len(out["loss_mtp"]) == len(out["mtp_logits"]) == depth
    assert [tuple(lg.shape) for lg in out["mtp_logits"]] == [(2, 12 - k, V) for k in range(1, depth + 1)]


def test_depth_zero_is_the_plain_model_with_the_same_trunk():
    m0, m1 = make_model(depth=0), make_model(depth=1)
    x, y = windows()
    with torch.no_grad():
        out = m0(x, y)
        assert out["mtp_logits"] == [] and torch.equal(out["loss"], out["loss_main"])
    sd0, sd1 = m0.state_dict(), m1.state_dict()
    assert all(torch.equal(sd0[k], sd1[k]) for k in sd0)


@torch.no_grad()
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_causality(depth):
    """Depth-k logits at position i change when token i+k changes and never when a token at ≥ i+k+1 does."""
    m = make_model(depth=depth, scale=3.0)
    t = 10
    x, y = windows(1, t, seed=3)
    base = m(x, y)["mtp_logits"]
    for j in range(t):
        x2 = x.clone()
        x2[:, j] = (x2[:, j] + 17) % V
        pert = m(x2, y)["mtp_logits"]
        for k in range(1, depth + 1):
            diff = (pert[k - 1] - base[k - 1]).abs().amax(-1)[0]  # (T-k,)
            for i in range(t - k):
                if j >= i + k + 1:
                    assert diff[i] == 0, f"depth {k} position {i} moved when token {j} changed"
                elif j == i + k:
                    assert diff[i] > 1e-4, f"depth {k} position {i} ignores token {j} (the one it embeds)"


def test_causality_fails_without_mask():
    """The leakage check can fail: an MTP block run without its mask reads future tokens."""
    m = make_model(depth=1, scale=3.0)
    x, y = windows(1, 8, seed=4)
    mm = m.model
    with torch.no_grad():
        h0 = m.trunk(x)
        e, _ = mtp_inputs_and_targets(x, y, 1)
        a = m.mtp[0](h0[:, :7], mm.embed_tokens(e), mm.rope_cos[1:8], mm.rope_sin[1:8], None)
        x2 = x.clone()
        x2[:, 7] = (x2[:, 7] + 1) % V
        e2, _ = mtp_inputs_and_targets(x2, y, 1)
        b = m.mtp[0](m.trunk(x2)[:, :7], mm.embed_tokens(e2), mm.rope_cos[1:8], mm.rope_sin[1:8], None)
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-4


def test_gradients_reach_shared_embedding_through_mtp():
    m = make_model(depth=1)
    x, y = windows()
    out = m(x, y)
    out["loss_mtp"][0].backward()
    assert m.model.embed_tokens.weight.grad.abs().sum() > 0
    assert m.mtp[0].eh_proj.weight.grad.abs().sum() > 0
    assert m.model.norm.weight.grad is None or m.model.norm.weight.grad.abs().sum() == 0  # h0 is before the norm


@pytest.mark.parametrize("seed,scale", [(0, 1.0), (1, 8.0), (2, 8.0)])
def test_speculative_equals_greedy(seed, scale):
    m = make_model(depth=1, seed=seed, scale=scale)
    idx = torch.randint(0, V, (1, 4), generator=torch.Generator().manual_seed(seed))
    tr = speculative_trace(m, idx, 30)
    ref = generate_uncached(m.model, idx, 30)
    assert torch.equal(tr["tokens"], ref)
    n = 30
    assert tr["calls"] - (n - tr["accepted"]) in (0, 1)
    assert tr["rate"] == (tr["accepted"] / tr["drafts"] if tr["drafts"] else 0.0)
    assert sum(kind != "reject" for kind, _ in tr["events"]) == n
    toks, rate = speculative_generate(m, idx, 30)
    assert torch.equal(toks, ref) and rate == tr["rate"]


def test_speculative_accepts_a_perfect_drafter():
    """A drafter that always agrees gets every draft accepted and saves ~half the main-model calls."""
    m = make_model(depth=1)
    with torch.no_grad():  # constant main model: all logits equal except token 5 -> argmax always 5
        for p in m.model.parameters():
            p.zero_()
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
        m.model.lm_head.weight[5, 0] = 1.0
        for layer in m.model.layers:
            layer.mlp.down_proj.weight[0].fill_(0.0)
        m.model.embed_tokens.weight[:, 0] = 1.0  # residual stream feature 0 = 1 everywhere
        for p in m.mtp.parameters():
            p.zero_()
        m.mtp[0].enorm.weight.fill_(1.0)
        m.mtp[0].post_norm.weight.fill_(1.0)
        m.mtp[0].eh_proj.weight[0, 0] = 1.0   # copies feature 0 of the normalised embedding
    idx = torch.tensor([[1, 2, 3]])
    tr = speculative_trace(m, idx, 21)
    assert torch.equal(tr["tokens"], generate_uncached(m.model, idx, 21))
    assert tr["rate"] == 1.0 and tr["calls"] == 11


def test_speculative_errors():
    m = make_model(depth=1)
    with pytest.raises(ValueError):
        speculative_generate(m, torch.zeros(2, 3, dtype=torch.long), 5)
    with pytest.raises(ValueError):
        speculative_generate(m, torch.zeros(1, 3, dtype=torch.long), 100)
    with pytest.raises(ValueError):
        speculative_generate(make_model(depth=0), torch.zeros(1, 3, dtype=torch.long), 5)
    toks, rate = speculative_generate(m, torch.zeros(1, 3, dtype=torch.long), 0)
    assert toks.shape == (1, 3) and rate == 0.0


def test_block_signature_is_generic():
    """Any block called as block(x, cos, sin, mask) works (here a norm-only block that ignores RoPE)."""

    class NormBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = RMSNorm(8)

        def forward(self, x, cos, sin, mask):
            return x + self.norm(x)

    mod = MTPModule(8, NormBlock())
    out = mod(torch.randn(1, 3, 8), torch.randn(1, 3, 8), None, None, None)
    assert out.shape == (1, 3, 8) and "mtp_block.norm.weight" in mod.state_dict()


# ---------------------------------------------------------------- widgets, pipeline, asset


def test_alignment_table_never_lets_a_target_influence_itself():
    from llmcourse.viz.mtp import alignment_table

    rows = alignment_table(8, 2)
    assert len(rows) == 8 + 7 + 6
    for r in rows:
        assert r["embed"] == r["position"] + r["depth"] and r["target"] == r["embed"] + 1
        assert r["target"] not in r["influence"] and max(r["influence"]) == r["embed"]
    with pytest.raises(ValueError):
        alignment_table(4, 4)


def test_widgets_static_fallbacks():
    from llmcourse.viz import mtp as viz
    from llmcourse.viz.base import StaticFigure

    assert isinstance(viz.show_alignment_table(static=True), StaticFigure)
    m = make_model(depth=1, scale=4.0)
    tr = speculative_trace(m, torch.tensor([[1, 2, 3]]), 25)
    frames = viz.speculative_steps(tr)
    last = frames[-1]
    assert last["generated"] == 25 and last["drafts"] == tr["drafts"] and last["accepted"] == tr["accepted"]
    assert last["calls"] == tr["calls"]
    assert isinstance(viz.show_speculative_stepper(frames, static=True), StaticFigure)
    hist = {"step": [1, 2], "loss_main": [3.0, 2.5], "loss_mtp": [3.1, 2.7], "eval_step": [0, 2],
            "val_loss": [4.0, 2.6], "val_loss_mtp": [4.0, 2.8]}
    plain = hist | {"loss_mtp": [math.nan] * 2, "val_loss_mtp": [math.nan] * 2}
    assert isinstance(viz.show_mtp_loss_curves({"plain": plain, "mtp": hist}, static=True), StaticFigure)


def test_compare_mtp_same_start_and_batches():
    """With and without MTP: the same initial trunk and the same batches, so the first main loss is identical."""
    from llmcourse.train.mtp_char import compare_mtp

    runs = compare_mtp(steps=3, batch_size=2, context_length=16, warmup_steps=1, eval_every=3, eval_batches=1,
                       progress=False)
    assert runs["plain"]["loss_main"][0] == runs["mtp"]["loss_main"][0]
    assert runs["plain"]["val_loss"][0] == runs["mtp"]["val_loss"][0]
    assert all(math.isnan(v) for v in runs["plain"]["loss_mtp"]) and not math.isnan(runs["mtp"]["loss_mtp"][0])
    assert runs["mtp"]["loss"][0] == pytest.approx(runs["mtp"]["loss_main"][0] + 0.3 * runs["mtp"]["loss_mtp"][0])


def test_asset():
    from llmcourse.train.mtp_char import load_mtp_char_tiny, mtp_char_tiny_path

    p = mtp_char_tiny_path()
    if not p.exists():
        pytest.skip("assets/mtp_char_tiny.pt not built (python -m llmcourse.train.mtp_char)")
    assert p.stat().st_size < 5_000_000
    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    assert set(ckpt) >= {"model", "config", "tokenizer", "recipe", "val_loss", "val_loss_mtp"}
    model, tok = load_mtp_char_tiny(retrain=False, verbose=False)
    assert model.mtp_depth == 1 and len(tok.chars) == model.cfg.vocab_size == 65
    n = sum(p.numel() for p in model.parameters())
    assert n == 795_904 + 230_016   # llama3-tiny + one MTP module: about 1M parameters
    assert ckpt["val_loss"] < 2.2 and ckpt["val_loss_mtp"] > ckpt["val_loss"]
    prompt = torch.tensor([tok.encode("ROMEO:")])
    tr = speculative_trace(model, prompt, 40)
    assert torch.equal(tr["tokens"], generate_uncached(model.model, prompt, 40))
    assert tr["rate"] > 0.2   # a trained drafter agrees with the main model far more often than chance


def test_speculative_demo_fits_the_trained_models_context_in_every_profile():
    """The lesson decodes spec_tokens after the 7-character prompt "ROMEO:\\n" with the shipped model (context 128)."""
    from llmcourse.runtime import profile
    from llmcourse.train.mtp_char import MTP_CHAR_TINY_RECIPE

    for name in ("ci", "laptop", "gpu"):
        assert len("ROMEO:\n") + profile("15", name)["spec_tokens"] <= MTP_CHAR_TINY_RECIPE["context_length"], name


# ---------------------------------------------------------------- the two accepted chain conventions


class _VLLMConvention(MTPLanguageModel):
    """vLLM's DeepSeek-V3 MTP convention (vllm/model_executor/models/deepseek_mtp.py): depth 1 reads the hidden state
    **after** the main model's final norm, and the state chained to the next depth is the block output before the
    head's norm (``shared_head.norm``; here ``post_norm``)."""

    h0_after_norm, chain_before_post_norm = True, True

    def forward(self, x, y):
        t, m = x.shape[1], self.model
        h0 = self.trunk(x)
        logits = m.lm_head(m.norm(h0))
        loss_main = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        h_prev = m.norm(h0) if self.h0_after_norm else h0
        mtp_logits, loss_mtp = [], []
        for k in range(1, self.mtp_depth + 1):
            mod = self.mtp[k - 1]
            h = mod.eh_proj(torch.cat([mod.enorm(m.embed_tokens(x[:, k:])), mod.hnorm(h_prev[:, :t - k])], -1))
            pre = mod.mtp_block(h, m.rope_cos[k:t], m.rope_sin[k:t], m.causal[:t - k, :t - k])
            lg = m.lm_head(mod.post_norm(pre))
            mtp_logits.append(lg)
            loss_mtp.append(F.cross_entropy(lg.reshape(-1, V), y[:, k:].reshape(-1)))
            h_prev = pre if self.chain_before_post_norm else mod.post_norm(pre)
        loss = loss_main + self.mtp_lambda / self.mtp_depth * torch.stack(loss_mtp).sum()
        return {"logits": logits, "mtp_logits": mtp_logits, "loss_main": loss_main, "loss_mtp": loss_mtp,
                "loss": loss}


@pytest.mark.parametrize("h0_after_norm,chain_before", [(True, True), (True, False), (False, True)])
def test_check_accepts_vllms_mtp_convention(h0_after_norm, chain_before):
    """A learner who follows vLLM's DeepSeek-V3 MTP code (post-final-norm state in, pre-norm state chained) gets
    full points: the report does not settle the convention, so neither choice is graded as a bug."""
    from grader.runner import run_check

    cls = type("M", (_VLLMConvention,), {"h0_after_norm": h0_after_norm, "chain_before_post_norm": chain_before})
    # the convention really differs from the course's on the check's weights (else this test proves nothing)
    torch.manual_seed(0)
    ref = make_model(depth=2, scale=3.0)
    alt = cls(small_cfg(), mtp_depth=2)
    alt.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for name, p in alt.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
        ref.load_state_dict(alt.state_dict())
        x, y = windows()
        assert not torch.allclose(alt.eval()(x, y)["mtp_logits"][1], ref(x, y)["mtp_logits"][1], atol=1e-3)
    verdict = run_check("15.MTPLanguageModel", namespace={"MTPLanguageModel": cls})
    assert verdict.status == "passed", verdict.render()


def test_check_of_speculative_generate_fails_loudly_without_the_asset(monkeypatch):
    """The trained model is the case where one verification call yields two tokens: without the asset the check
    fails and says why, instead of skipping the case."""
    from grader.checks import u15_multi_token_prediction as C
    from grader.runner import run_check

    monkeypatch.setattr(C, "_trained", lambda: None)
    verdict = run_check("15.speculative_generate", namespace={"speculative_generate": speculative_generate})
    assert verdict.status == "failed" and "mtp_char_tiny.pt" in verdict.render(), verdict.render()
