"""Checks of unit 15 (multi-token prediction).

``transformers`` 5.23 has no MTP layer, so there is no oracle: the expected values come from the reference
(:mod:`llmcourse.models.mtp`, run here with the same weights), from index arithmetic on windows of distinct
tokens, from the loss formula applied to the learner's own components, from properties (which logits may move
when one token changes) and, for speculative decoding, from plain greedy decoding of the main model written out
here as a loop over unit 11's cache-free ``Llama3Model``.

Two conventions for the MTP chain's hidden states are accepted by ``15.MTPLanguageModel`` (the DeepSeek-V3 report
does not settle them): the course feeds depth 1 the trunk output **before** the final norm and chains each
depth's output after its ``post_norm`` (the module's own output); vLLM's DeepSeek-V3 MTP code
(``vllm/model_executor/models/deepseek_mtp.py``) feeds the hidden state **after** the main model's final norm and
chains the block output before ``shared_head.norm`` (here: before ``post_norm``). The check finds which of the
four combinations the learner's depth-1 and depth-2 logits follow and grades everything against that one.

Contract clauses and the probes that cover them:

* ``15.mtp_alignment``: return two tensors (B, T−k); embedded tokens ``x[:, k:]``, targets ``y[:, k:]`` (worked
  window at k = 1, 2; distinct tokens at k = 1, 3, 5: every argument at a non-default value); inputs untouched
  (the probe passes clones and compares the returned values only).
* ``15.MTPModule``: keys and shapes; forward against the reference with seeded weights; each half normalised on
  its own (scaled inputs); forward leaves parameters and buffers unchanged (side-effect probe, eval and train).
* ``15.MTPLanguageModel``: keys, shared embedding/head, parameter count; causality per depth (leakage probes);
  main/MTP logits and losses against the reference (either accepted convention); the loss weighting at two
  (D, λ) pairs (non-default λ = 0.5 included).
* ``15.speculative_generate``: tokens equal greedy decoding; main-model calls; the drafter is used; the reported
  rate; the course's trained model is a required case (a missing asset fails loudly instead of skipping).

Probes build the learner's objects in the worker from a config and a state dict and return tensors.
``speculative_generate`` runs on the course's ``MTPLanguageModel`` (not the learner's); forward hooks record the
main-model calls and the drafter calls, which only shape feedback and a consistency check of the reported rate:
the points come from the tokens (compared with greedy tokens computed here) and from the rate of the reference
procedure computed here.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..core import check, module_facts, unwrap

U = "15"
V = 65


def _ref_alignment():
    from llmcourse.models.mtp import mtp_inputs_and_targets

    return {"mtp_inputs_and_targets": mtp_inputs_and_targets}


def _ref_module():
    from llmcourse.models.mtp import MTPModule

    return {"MTPModule": MTPModule}


def _ref_model():
    from llmcourse.models.mtp import MTPLanguageModel

    return {"MTPLanguageModel": MTPLanguageModel}


def _ref_spec():
    from llmcourse.models.mtp import speculative_generate

    return {"speculative_generate": speculative_generate}


# ================================================================== 15.mtp_alignment


def _align_probe(x, y, k):
    return lambda impl: list(impl.mtp_inputs_and_targets(x.clone(), y.clone(), k))


@check(f"{U}.mtp_alignment", ["mtp_inputs_and_targets"], _ref_alignment)
def check_alignment(t):
    w = torch.arange(10, 19)[None]
    x, y = w[:, :-1].clone(), w[:, 1:].clone()
    for k, (emb, tgt) in {1: (list(range(11, 18)), list(range(12, 19))),
                          2: (list(range(12, 18)), list(range(13, 19)))}.items():
        probe = _align_probe(x, y, k)
        got = t.run(probe)
        t.expect(isinstance(got, list) and len(got) == 2 and all(isinstance(g, torch.Tensor) for g in got),
                 "mtp_inputs_and_targets must return a tuple (emb_tokens, targets) of two tensors")
        t.compare(probe, torch.tensor([emb]), f"window 10…18 (x = 10…17, y = 11…18), depth {k}: the embedded "
                  f"tokens must be {emb[0]}…{emb[-1]}", atol=0, rtol=0, pick=lambda o: o[0])
        t.compare(probe, torch.tensor([tgt]), f"window 10…18, depth {k}: the targets must be {tgt[0]}…{tgt[-1]}",
                  atol=0, rtol=0, pick=lambda o: o[1])
    # distinct tokens: position i of depth k embeds absolute position i+k and predicts i+k+1
    g = torch.Generator().manual_seed(0)
    win = torch.stack([torch.randperm(200, generator=g)[:13] for _ in range(2)])
    xb, yb = win[:, :-1].clone(), win[:, 1:].clone()
    for k in (1, 3, 5):
        got = t.run(_align_probe(xb, yb, k))
        e, tg = got
        T = xb.shape[1]
        t.expect(tuple(e.shape) == (2, T - k) and tuple(tg.shape) == (2, T - k),
                 f"depth {k} of a (2, {T}) batch: both outputs must have shape (B, T−k) = (2, {T - k}); got "
                 f"{tuple(e.shape)} and {tuple(tg.shape)}")
        for i in range(T - k):
            t.expect(torch.equal(e[:, i], win[:, i + k]), f"depth {k}, position {i}: the embedded token must be the "
                     f"one at absolute position i+k = {i + k}")
            t.expect(torch.equal(tg[:, i], win[:, i + k + 1]), f"depth {k}, position {i}: the target must be the "
                     f"token at absolute position i+k+1 = {i + k + 1}")


# ================================================================== model fixtures


def _small_cfg() -> dict:
    from llmcourse.models.llama3 import Llama3Config

    return Llama3Config(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64,
                        context_length=64, rope_theta=10000.0).to_dict()


def _noisy(state: dict, seed: int, std: float) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in state.items():
        noise = std * torch.randn(p.shape, generator=g)
        out[name] = 1.0 + noise if name.endswith("norm.weight") else noise
    return out


def _ref_mtp_model(cfg: dict, depth: int, lam: float = 0.3, seed: int = 0, std: float = 0.3):
    """The reference model with seeded large weights (tied head = embedding), here in the checker."""
    from llmcourse.models.llama3 import Llama3Config
    from llmcourse.models.mtp import MTPLanguageModel

    m = MTPLanguageModel(Llama3Config(**cfg), mtp_depth=depth, mtp_lambda=lam)
    state = _noisy(m.state_dict(), seed, std)
    state["model.lm_head.weight"] = state["model.embed_tokens.weight"]
    m.load_state_dict(state)
    return m.eval(), state


# ================================================================== 15.MTPModule


def _tiny_cfg() -> dict:
    from llmcourse.models.llama3 import Llama3Config

    return Llama3Config.preset("llama3-tiny").to_dict()


@functools.lru_cache(maxsize=1)
def _module_case():
    from llmcourse.models.llama3 import Llama3Block, Llama3Config, rope_cos_sin, rope_inv_freq
    from llmcourse.models.mtp import MTPModule

    cfg = _tiny_cfg()
    c = Llama3Config(**cfg)
    ref = MTPModule(c.d_model, Llama3Block(c), c.rms_norm_eps)
    state = _noisy(ref.state_dict(), 5, 0.2)
    ref.load_state_dict(state)
    g = torch.Generator().manual_seed(6)
    h = 3.0 * torch.randn(2, 7, c.d_model, generator=g) + 1.0
    e = 0.5 * torch.randn(2, 7, c.d_model, generator=g)   # different scales: a shared norm shows
    cos, sin = rope_cos_sin(rope_inv_freq(c.hd, c.rope_theta), torch.arange(2, 9))
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    with torch.no_grad():
        out = ref(h, e, cos, sin, mask)
    return cfg, state, (h, e, cos, sin, mask), out


def _module_probe(cfg, state, inputs):
    def probe(impl):
        from llmcourse.models.llama3 import Llama3Block, Llama3Config

        c = Llama3Config(**cfg)
        m = impl.MTPModule(c.d_model, Llama3Block(c), c.rms_norm_eps)
        unwrap(m).load_state_dict(state)
        unwrap(m).eval()
        with torch.no_grad():
            return m(*[x.clone() for x in inputs])
    return probe


@check(f"{U}.MTPModule", ["MTPModule"], _ref_module)
def check_mtp_module(t):
    cfg, state, inputs, expected = _module_case()

    def facts_probe(impl):
        from llmcourse.models.llama3 import Llama3Block, Llama3Config

        c = Llama3Config(**cfg)
        return module_facts(impl.MTPModule(c.d_model, Llama3Block(c), c.rms_norm_eps))

    facts = t.run(facts_probe)
    t.expect(facts["is_module"], "MTPModule must be an nn.Module subclass")
    keys = facts["state_dict"]
    D = cfg["d_model"]
    if "enorm.weight" not in keys or "hnorm.weight" not in keys:
        t.fail("MTPModule needs two RMSNorms, enorm (for the embedding) and hnorm (for the hidden state); its "
               f"state_dict has {sorted(k for k in keys if not k.startswith('mtp_block.'))}", bug="B15.shared_norm")
    expected_keys = {k: tuple(v.shape) for k, v in state.items()}
    t.expect(keys == expected_keys, "MTPModule's state_dict must hold enorm.weight (D,), hnorm.weight (D,), "
             f"eh_proj.weight (D, 2D) without bias, post_norm.weight (D,) and the given block under mtp_block.*; "
             f"differences: {sorted(set(keys) ^ set(expected_keys))[:4] or 'shapes'} (D = {D})")
    t.compare(_module_probe(cfg, state, inputs), expected, "forward(h_prev, emb, cos, sin, mask) with a llama3-tiny "
              "decoder layer as the block and seeded weights (2 rows of 7 positions): eh_proj reads "
              "[enorm(emb); hnorm(h_prev)], the released checkpoints' order (the paper's [h; e] order, or a sum "
              "instead of a concatenation, gives other outputs)", atol=1e-4, rtol=1e-4)
    # the norms act on their own inputs: scaling emb or h_prev by a constant changes nothing
    h, e, cos, sin, mask = inputs
    scaled = (h * 4.0, e * 2.0, cos, sin, mask)
    t.compare(_module_probe(cfg, state, scaled), expected, "forward with h_prev × 4 and emb × 2 (each half is "
              "RMS-normalised on its own, so the output must not change)", atol=1e-4, rtol=1e-4)

    # rms_norm_eps at a non-default value (all three norms), and gradients (the module is trained)
    def eps_grad_probe(impl):
        from llmcourse.models.llama3 import Llama3Block, Llama3Config

        c = Llama3Config(**cfg)
        m = impl.MTPModule(c.d_model, Llama3Block(c), 0.5)
        unwrap(m).load_state_dict(state)
        unwrap(m).eval()
        hh, ee = h.clone().requires_grad_(True), e.clone().requires_grad_(True)
        out = m(hh, ee, cos, sin, mask)
        (out * r_out).sum().backward()
        w = unwrap(m).eh_proj.weight
        return [out.detach(), hh.grad if hh.grad is not None else torch.zeros_like(hh),
                w.grad if w.grad is not None else torch.zeros_like(w)]

    r_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(8))
    from llmcourse.models.llama3 import Llama3Block, Llama3Config
    from llmcourse.models.mtp import MTPModule as _CourseModule

    c_ = Llama3Config(**cfg)
    ref_eps = _CourseModule(c_.d_model, Llama3Block(c_), 0.5)
    ref_eps.load_state_dict(state)
    ref_eps.eval()
    hr, er = h.clone().requires_grad_(True), e.clone().requires_grad_(True)
    out_r = ref_eps(hr, er, cos, sin, mask)
    (out_r * r_out).sum().backward()
    t.compare(eps_grad_probe, [out_r.detach(), hr.grad, ref_eps.eh_proj.weight.grad], "rms_norm_eps=0.5 (every norm "
              "of the module uses it): the output, and the gradients of Σ r·output with respect to h_prev and "
              "eh_proj.weight (the module is trained: no .detach())", atol=1e-4, rtol=1e-4)

    # side effects: a forward in eval and in train mode leaves every parameter and buffer as it was
    def side_probe(impl):
        from llmcourse.models.llama3 import Llama3Block, Llama3Config

        c = Llama3Config(**cfg)
        m = impl.MTPModule(c.d_model, Llama3Block(c), c.rms_norm_eps)
        unwrap(m).load_state_dict(state)
        before = {k: v.clone() for k, v in unwrap(m).state_dict().items()}
        changed = []
        for train in (False, True):
            unwrap(m).train(train)
            with torch.no_grad():
                m(*[x.clone() for x in inputs])
            changed += [k for k, v in unwrap(m).state_dict().items() if not torch.equal(v, before[k])]
        return sorted(set(changed))

    moved = t.run(side_probe)
    t.expect(moved == [], f"a forward must not change the module's parameters or buffers; changed: {moved[:4]}")


# ================================================================== 15.MTPLanguageModel


def _lm_class(impl):
    """``impl.MTPLanguageModel`` built from the course's ``MTPModule`` and ``mtp_inputs_and_targets`` wherever the learner's
    code calls them (exercises 1 and 2 are graded on their own): one mistake costs one exercise."""
    from grader.prior import use_course
    from llmcourse.models import mtp as course

    cls = impl.MTPLanguageModel
    use_course(cls, MTPModule=course.MTPModule, mtp_inputs_and_targets=course.mtp_inputs_and_targets)
    return cls


def _lm_probe(cfg, state, depth, lam, batches):
    def probe(impl):
        from llmcourse.models.llama3 import Llama3Config

        m = _lm_class(impl)(Llama3Config(**cfg), mtp_depth=depth, mtp_lambda=lam)
        unwrap(m).load_state_dict(state)
        unwrap(m).eval()
        outs = []
        with torch.no_grad():
            for x, y in batches:
                o = m(x.clone(), y.clone())
                outs.append({"logits": o["logits"], "mtp_logits": list(o["mtp_logits"]),
                             "loss_main": o["loss_main"], "loss_mtp": list(o["loss_mtp"]), "loss": o["loss"]})
        return outs
    return probe


def _windows(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, V, (b, t + 1), generator=g)
    return w[:, :-1].clone(), w[:, 1:].clone()


@check(f"{U}.MTPLanguageModel", ["MTPLanguageModel"], _ref_model)
def check_mtp_language_model(t):
    cfg = _small_cfg()
    ref2, state2 = _ref_mtp_model(cfg, 2, 0.3, seed=1)

    def facts_probe(impl):
        from llmcourse.models.llama3 import Llama3Config

        m = _lm_class(impl)(Llama3Config(**cfg), mtp_depth=2, mtp_lambda=0.3)
        u = unwrap(m)
        shared = [u.model.embed_tokens.weight.data_ptr() == u.model.lm_head.weight.data_ptr()]
        return module_facts(m) | {"n_params": sum(p.numel() for p in u.parameters()), "tied": shared}

    facts = t.run(facts_probe)
    t.expect(facts["is_module"], "MTPLanguageModel must be an nn.Module subclass")
    keys = facts["state_dict"]
    ref_keys = {k: tuple(v.shape) for k, v in ref2.state_dict().items()}
    extra_mtp = sorted(k for k in set(keys) - set(ref_keys) if k.startswith("mtp."))
    if any(("head" in k or "embed" in k) for k in extra_mtp):
        t.fail(f"the MTP modules must not own an embedding or output head; extra keys {extra_mtp[:4]}",
               bug="B15.own_head")
    t.expect(keys == ref_keys, "MTPLanguageModel's state_dict must be model.* (unit 11's Llama3Model) and mtp.{k}.* "
             "(one MTPModule per depth, with a Llama3Block as mtp_block), nothing else; differences: "
             f"{sorted(set(keys) ^ set(ref_keys))[:4] or 'shapes'}")
    n_ref = sum(p.numel() for p in ref2.parameters())
    t.expect(facts["n_params"] == n_ref, f"the model must count {n_ref:,} parameters (embedding and head shared by "
             f"every depth); it counts {facts['n_params']:,}", bug="B15.own_head")

    # leakage: perturb one token of the window at a time (x and y are its two shifted views)
    T = 8
    g = torch.Generator().manual_seed(3)
    w = torch.randint(0, V, (1, T + 1), generator=g)
    batches = [(w[:, :-1].clone(), w[:, 1:].clone())]
    for j in range(T + 1):
        w2 = w.clone()
        w2[:, j] = (w2[:, j] + 17) % V
        batches.append((w2[:, :-1].clone(), w2[:, 1:].clone()))
    outs = t.run(_lm_probe(cfg, state2, 2, 0.3, batches))
    base = outs[0]["mtp_logits"]
    t.expect(len(base) == 2, f"with mtp_depth=2, mtp_logits must hold 2 tensors; got {len(base)}")
    for k in (1, 2):
        t.expect(tuple(base[k - 1].shape) == (1, T - k, V), f"mtp_logits[{k - 1}] must have shape (B, T−{k}, V) = "
                 f"{(1, T - k, V)}; got {tuple(base[k - 1].shape)}")
    moved = {(k, j, i): bool((outs[j + 1]["mtp_logits"][k - 1][0, i] - base[k - 1][0, i]).abs().max() > 1e-5)
             for k in (1, 2) for j in range(T + 1) for i in range(T - k)}
    far = [(k, j, i) for (k, j, i), m in moved.items() if m and j >= i + k + 2]
    if far:
        k, j, i = far[0]
        t.fail(f"leakage: the depth-{k} logits at position {i} change when token {j} changes; they may depend on "
               f"tokens up to position {i + k} only (every depth attends causally)", bug="B15.block_not_causal")
    near = [(k, j, i) for (k, j, i), m in moved.items() if m and j == i + k + 1]
    if near:
        k, j, i = near[0]
        if not any(ii == T - kk - 1 for kk, _, ii in near):
            # the last position of every depth is clean: the target arrives from the next row, through the block's mask
            t.fail(f"leakage: the depth-{k} logits at position {i} change when token {j} (the token they predict) "
                   f"changes, at every position but the last: inside the MTP block position i reads row i+1, whose "
                   "embedding is that token", bug="B15.leaky_mask")
        t.fail(f"leakage: the depth-{k} logits at position {i} change when token {j} (the token they predict) "
               "changes", bug="B15.leak_target_embedding")
    deaf = [(k, j, i) for (k, j, i), m in moved.items() if not m and j == i + k]
    if deaf:
        k, j, i = deaf[0]
        t.fail(f"the depth-{k} logits at position {i} ignore token {j}: depth k must embed the token at position "
               "i+k")

    # values and losses against the reference with the same weights, in the convention the learner follows
    xb, yb = _windows(2, 12, 4)
    with torch.no_grad():
        exp = ref2(xb, yb)
        conv = {(h0n, chain): _convention_logits(ref2, xb, h0n, chain) for h0n in (False, True)
                for chain in (False, True)}
    probe = _lm_probe(cfg, state2, 2, 0.3, [(xb, yb)])
    t.compare(probe, exp["logits"], "main logits (lm_head(norm(trunk)))", atol=1e-4, rtol=1e-4,
              pick=lambda o: o[0]["logits"])
    got = t.run(probe)[0]

    def _close(a, b) -> bool:
        try:
            return tuple(a.shape) == tuple(b.shape) and bool(torch.allclose(a.float(), b, atol=1e-4, rtol=1e-4))
        except (AttributeError, RuntimeError, TypeError):
            return False

    h0n = _close(got["mtp_logits"][0], conv[(True, False)][0]) and not _close(got["mtp_logits"][0],
                                                                                conv[(False, False)][0])
    chain = len(got["mtp_logits"]) > 1 and _close(got["mtp_logits"][1], conv[(h0n, True)][1]) and not _close(
        got["mtp_logits"][1], conv[(h0n, False)][1])
    want = conv[(h0n, chain)]
    state_in = "after model.norm (vLLM's convention)" if h0n else "before model.norm (the course's convention)"
    chained = ("the output of depth 1 before its post_norm (vLLM's convention)" if chain else
               "the output of depth 1 (after its post_norm, the course's convention)")
    t.compare(probe, want[0], "depth-1 logits (mtp.0 on the trunk output before model.norm, or after it as in "
              "vLLM's DeepSeek-V3 MTP code, and the embeddings of tokens 1…T−1)", atol=1e-4, rtol=1e-4,
              pick=lambda o: o[0]["mtp_logits"][0])
    t.compare(probe, want[1], f"depth-2 logits (mtp.1 on {chained}; trunk state {state_in})", atol=1e-4,
              rtol=1e-4, pick=lambda o: o[0]["mtp_logits"][1])
    want_losses = torch.stack([exp["loss_main"]] + [
        F.cross_entropy(lg.reshape(-1, V), yb[:, k + 1:].reshape(-1)) for k, lg in enumerate(want)])
    t.compare(probe, want_losses, "loss_main and loss_mtp (cross-entropy of each depth against its shifted "
              "targets)", atol=1e-5, rtol=1e-5, pick=lambda o: torch.stack([o[0]["loss_main"], *o[0]["loss_mtp"]]))

    # the weighting, from the learner's own components (λ at its default and at 0.5)
    for depth, lam in ((2, 0.3), (1, 0.5)):
        ref_m, st = (ref2, state2) if depth == 2 else _ref_mtp_model(cfg, depth, lam, seed=2)
        o = t.run(_lm_probe(cfg, st, depth, lam, [(xb, yb)]))[0] if depth != 2 else got
        total = float(o["loss_main"]) + lam / depth * sum(float(v) for v in o["loss_mtp"])
        if abs(float(o["loss"]) - total) > 1e-5:
            undivided = float(o["loss_main"]) + lam * sum(float(v) for v in o["loss_mtp"])
            bug = "B15.lambda_not_divided" if abs(float(o["loss"]) - undivided) < 1e-5 else None
            t.fail(f"with λ = {lam} and D = {depth}, loss must be loss_main + λ/D·Σ loss_mtp = {total:.5f}; got "
                   f"{float(o['loss']):.5f}", bug=bug)

    # the model is trained: the loss's gradient reaches the trunk, the embedding and every depth (course convention)
    names = ["model.embed_tokens.weight", next(n for n, _ in ref2.named_parameters() if n.startswith("model.layers.0.")),
             "mtp.0.eh_proj.weight", "mtp.1.eh_proj.weight"]

    def grad_probe(impl):
        from llmcourse.models.llama3 import Llama3Config

        m = _lm_class(impl)(Llama3Config(**cfg), mtp_depth=2, mtp_lambda=0.3)
        unwrap(m).load_state_dict(state2)
        unwrap(m).eval()
        m(xb.clone(), yb.clone())["loss"].backward()
        params = dict(unwrap(m).named_parameters())
        return [params[n].grad if params[n].grad is not None else torch.zeros_like(params[n]) for n in names]

    if not h0n and not chain:
        ref2.zero_grad(set_to_none=True)
        ref2(xb, yb)["loss"].backward()
        ref_params = dict(ref2.named_parameters())
        t.compare(grad_probe, [ref_params[n].grad.clone() for n in names], "gradients of the loss with respect to "
                  f"{', '.join(names)} (the loss trains the trunk, the shared embedding and every depth: no "
                  ".detach() on the way)", atol=1e-5, rtol=1e-4)
        ref2.zero_grad(set_to_none=True)

    # the new linear maps start from N(0, 0.02²) (unit 11's initialisation)
    def init_probe(impl):
        from llmcourse.models.llama3 import Llama3Config

        torch.manual_seed(0)
        m = _lm_class(impl)(Llama3Config(**cfg), mtp_depth=2)
        return [float(unwrap(m).mtp[k].eh_proj.weight.std()) for k in range(2)]
    stds = t.run(init_probe)
    t.expect(all(0.017 < s < 0.023 for s in stds), f"the MTP modules' new linear maps must start from N(0, 0.02²) "
             f"weights; eh_proj's standard deviations are {[round(s, 4) for s in stds]}")


@torch.no_grad()
def _convention_logits(ref, x, h0_after_norm: bool, chain_before_post_norm: bool) -> list:
    """Depth-k logits of the reference weights under one of the two accepted conventions for each choice: the
    trunk state fed to depth 1 before (course) or after (vLLM) ``model.norm``; the state chained to the next
    depth after (course) or before (vLLM, pre-``shared_head.norm``) the module's ``post_norm``."""
    m = ref.model
    t = x.shape[1]
    h0 = ref.trunk(x)
    h_prev = m.norm(h0) if h0_after_norm else h0
    out = []
    for k in range(1, ref.mtp_depth + 1):
        mod = ref.mtp[k - 1]
        e = m.embed_tokens(x[:, k:])
        h = mod.eh_proj(torch.cat([mod.enorm(e), mod.hnorm(h_prev[:, :t - k])], dim=-1))
        pre = mod.mtp_block(h, m.rope_cos[k:t], m.rope_sin[k:t], m.causal[:t - k, :t - k])
        post = mod.post_norm(pre)
        out.append(m.lm_head(post))
        h_prev = pre if chain_before_post_norm else post
    return out


# ================================================================== 15.speculative_generate


@functools.lru_cache(maxsize=1)
def _trained() -> dict | None:
    """The course's trained MTP character model as (config, state), or None when the asset is absent."""
    try:
        from llmcourse.train.mtp_char import load_mtp_char_tiny

        model, tok = load_mtp_char_tiny(retrain=False, verbose=False)
    except (ImportError, FileNotFoundError):
        return None
    return {"cfg": model.cfg.to_dict(), "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "depth": model.mtp_depth, "prompt": [tok.encode("ROMEO:")]}


def _spec_probe(cfg, state, depth, prompt, n):
    def probe(impl):
        from llmcourse.models.llama3 import Llama3Config
        from llmcourse.models.mtp import MTPLanguageModel

        m = MTPLanguageModel(Llama3Config(**cfg), mtp_depth=depth)
        m.load_state_dict(state)
        m.eval()
        main_calls, drafts = [], []
        m.model.layers[0].register_forward_pre_hook(lambda mod, args: main_calls.append(int(args[0].shape[1])))
        m.mtp[0].register_forward_pre_hook(lambda mod, args: drafts.append(int(args[0].shape[1])))
        out = impl.speculative_generate(m, prompt.clone(), n)
        tokens, rate = out[0], out[1]
        return {"tokens": tokens, "rate": float(rate), "main_calls": main_calls, "drafts": drafts}
    return probe


@torch.no_grad()
def _greedy(model, idx, n):
    """Plain greedy decoding of the main model, one full forward per token (the independent route)."""
    for _ in range(n):
        idx = torch.cat([idx, model(idx)[:, -1, :].argmax(-1, keepdim=True)], dim=1)
    return idx


@check(f"{U}.speculative_generate", ["speculative_generate"], _ref_spec)
def check_speculative_generate(t):
    from llmcourse.models.mtp import speculative_trace

    cases = []
    cfg = _small_cfg()
    for seed in (0, 1):
        ref, state = _ref_mtp_model(cfg, 1, seed=10 + seed, std=0.3)
        prompt = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(seed))
        cases.append(("seeded random weights", cfg, state, 1, prompt, 30, ref))
    ref2d, state2d = _ref_mtp_model(cfg, 2, seed=14, std=0.3)   # two depths: depth 1 (mtp[0]) still drafts
    cases.append(("seeded random weights, two MTP depths", cfg, state2d, 2,
                  torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(2)), 12, ref2d))
    asset = _trained()
    if asset is None:
        t.fail("the course's trained MTP model (assets/mtp_char_tiny.pt) is missing, so the case where one call "
               "yields two tokens cannot be checked: restore the asset (python -m llmcourse.train.mtp_char) and "
               "check again")
    else:
        from llmcourse.models.llama3 import Llama3Config
        from llmcourse.models.mtp import MTPLanguageModel

        ref = MTPLanguageModel(Llama3Config(**asset["cfg"]), mtp_depth=asset["depth"])
        ref.load_state_dict(asset["state"])
        cases.append(("the course's trained MTP model", asset["cfg"], asset["state"], asset["depth"],
                      torch.tensor(asset["prompt"]), 40, ref.eval()))
    for what, c, state, depth, prompt, n, ref in cases:
        expected = _greedy(ref.model, prompt, n)
        probe = _spec_probe(c, state, depth, prompt, n)
        got = t.run(probe)
        t.expect(isinstance(got["tokens"], torch.Tensor) and tuple(got["tokens"].shape) == tuple(expected.shape),
                 f"speculative_generate must return (tokens (1, T0 + n), rate); with T0 = {prompt.shape[1]}, n = {n} "
                 f"the tokens must have shape {tuple(expected.shape)}; got {tuple(getattr(got['tokens'], 'shape', ()))}")
        t.compare(probe, expected, f"{n} tokens from a {prompt.shape[1]}-token prompt ({what}): they must equal plain "
                  "greedy decoding of model.model token for token", atol=0, rtol=0, pick=lambda o: o["tokens"])
        tr = speculative_trace(ref, prompt, n)
        calls, drafts = len(got["main_calls"]), len(got["drafts"])
        t.expect(calls <= n - tr["accepted"] + 1, f"({what}) {calls} main-model calls for {n} tokens with "
                 f"{tr['accepted']} acceptable drafts: each verification call must also yield the next token (its "
                 f"last position), so at most {n - tr['accepted'] + 1} calls are needed; a fresh main-model call "
                 "after every kept draft saves nothing")
        t.expect(drafts > 0, f"({what}) the depth-1 module (model.mtp[0]) was never called: it drafts the tokens")
        tol = 1.0 / max(tr["drafts"], 1) + 1e-9
        t.expect(abs(got["rate"] - tr["rate"]) <= tol, f"({what}) the acceptance rate must be accepted drafts / "
                 f"drafts = {tr['accepted']}/{tr['drafts']} = {tr['rate']:.3f}; got {got['rate']:.3f}")
        accepted = n - calls
        t.expect(drafts > 0 and any(abs(got["rate"] - a / drafts) < 1e-9 for a in (accepted, accepted + 1) if a >= 0),
                 f"({what}) the reported rate {got['rate']:.3f} does not match the calls observed: {drafts} drafts "
                 f"and {calls} main-model calls for {n} tokens (≈ {max(accepted, 0)} accepted)")
    _check_spec_edges(t, cfg)


def _check_spec_edges(t, cfg):
    """max_new_tokens 0 and 1 (no draft: rate 0.0), and a model whose drafts are all accepted (a zero head: every
    argmax is token 0), so that a draft is kept at the very last position and the generation must stop there."""
    ref, state = _ref_mtp_model(cfg, 1, seed=12, std=0.3)
    prompt = torch.randint(0, V, (1, 4), generator=torch.Generator().manual_seed(3))
    for n in (0, 1):
        got = t.run(_spec_probe(cfg, state, 1, prompt, n))
        t.expect(isinstance(got["tokens"], torch.Tensor) and torch.equal(got["tokens"], _greedy(ref.model, prompt, n)),
                 f"max_new_tokens={n}: the tokens must be the prompt followed by {n} greedy token(s)")
        t.expect(got["rate"] == 0.0, f"max_new_tokens={n}: no draft is made, so the rate must be 0.0; got "
                 f"{got['rate']}")
    zero = {k: (torch.zeros_like(v) if k.endswith("lm_head.weight") or k.endswith("embed_tokens.weight") else v)
            for k, v in state.items()}
    for n in (4, 5):
        got = t.run(_spec_probe(cfg, zero, 1, prompt, n))
        want = torch.cat([prompt, torch.zeros(1, n, dtype=torch.long)], 1)
        t.expect(isinstance(got["tokens"], torch.Tensor) and torch.equal(got["tokens"], want),
                 f"a model whose every draft is right (all logits equal: greedy picks token 0 each time), "
                 f"max_new_tokens={n}: exactly {n} new tokens, all 0, must come back")
        t.expect(len(got["main_calls"]) <= n // 2 + 1, f"every draft of that model is kept, so {n} tokens need "
                 f"{n // 2 + 1} main-model calls at most; yours made {len(got['main_calls'])}")
        t.expect(abs(got["rate"] - 1.0) < 1e-9, f"every draft of that model is kept: the rate must be 1.0; got "
                 f"{got['rate']}")


# ================================================================== declared strength (grader/strength.py)
from ..strength import decision, defining_property  # noqa: E402

defining_property(f"{U}.mtp_alignment", "depth k at position i embeds token i+k and predicts token i+k+1",
                  probe="returned tokens on windows of distinct tokens at depths 1-3")
defining_property(f"{U}.MTPModule", "one MTP depth: two separate norms, the halves concatenated in the trained "
                  "checkpoints' order, a projection, the given block, a final norm",
                  probe="outputs with the course's trained depth-1 weights and with seeded weights whose two norms and "
                        "two halves differ")
defining_property(f"{U}.MTPLanguageModel", "a sequential chain of depths sharing the main embedding and head; depth k "
                  "reads depth k−1's state and never sees the token it predicts",
                  probe="perturbing every token of a window and recording which depth-k logits move; logits and losses "
                        "against the course's modules in both h0 conventions (graded on the course's MTPModule and "
                        "alignment, so exercises 1-2 count once)")
defining_property(f"{U}.speculative_generate", "drafts verified by one main-model call that also yields the next token: "
                  "the output equals greedy decoding and every kept draft saves a main-model call",
                  probe="tokens against plain greedy decoding; main-model calls counted through model.trunk on seeded "
                        "and trained models")

decision(f"{U}.MTPModule", "the order of the two halves fed to eh_proj (the embedding first, as in the checkpoints)",
         forms=[r"\[\s*enorm\(\s*emb\s*\)\s*;\s*hnorm", r"cat\(\s*\[\s*self\.enorm",
                r"embedding (half )?(comes |goes )?first", r"\[\s*emb\s*;\s*h(_prev)?\s*\]"],
         wrong=("B15.concat_order",))
decision(f"{U}.speculative_generate", "the verification: keep a draft only when the main model's own argmax agrees, "
         "replace it by that argmax otherwise, and take the call's next token as a bonus",
         forms=[r"bonus token", r"keep (the|a) draft (only )?(if|when)[^.]{0,40}(argmax|main model)",
                r"replace[^.]{0,30}draft[^.]{0,30}(by|with) the main model"],
         wrong=("B15.spec_unverified",))


