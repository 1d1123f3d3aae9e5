"""Checks of unit 17 (the capstone: a tiny DeepSeek-style model).

Independent routes: ``transformers``' ``DeepseekV3ForCausalLM`` on the course's DeepSeek-tiny configuration with
seeded weights (the ``transformers`` layout — ``model.`` prefix, fused ``gate_up_proj`` / ``down_proj`` expert
tensors — is built here from a seeded course-layout state dict by plain tensor operations; the logits are a stored
snapshot, ``assets/oracles/u17_hf_deepseek.pt``, rebuilt and compared by ``tests/test_unit17_deepseek_checks.py`` so
that ``course check`` never imports transformers); closed-form parameter counts (1,757,696 total, 872,960 active,
248,512 per MTP module; the baselines 809,856 and 795,904) and cache sizes (320, 512, 1,024 elements per token);
the sign rule re-derived here from the loads a training step returns; batches re-drawn here with unit 10's
``get_batch``; the calibrated FP8 delta stored in ``assets/deepseek_char_tiny.pt``.

``17.generate_latent_cached``, ``17.train_step`` and ``17.fp8_inference`` run the learner's function on the course's
``DeepSeekLM`` (the answer of another exercise), so a wrong model costs its own points only.

Contract clauses and the probes that cover them (every argument at a non-default value once):

* ``17.DeepSeekLM``: keys/shapes, buffers vs parameters, tied head (re-derived by changing the embedding), counts;
  parity with ``DeepseekV3ForCausalLM`` through ``load_hf_deepseek``; causality; losses with ``targets`` and the MTP
  leakage rule; ``update_router_biases`` from the last training forward; forwards in eval and train mode change no
  parameter or buffer (side effect: the bias moves only in ``update_router_biases``); every ``DeepSeekConfig`` field
  at a non-default value (``ALT``: untied head, ``q_lora_rank``, half-split RoPE, two MTP depths, λ = 0.5, γ = 0.01, …)
  against the course's model on the same weights: logits, MTP logits and losses, decoding through a ``LatentCache``
  up to exactly ``context_length``, every parameter's gradient, the bias rule; ``mtp_depth=0``; the N(0, 0.02²) init.
* ``17.generate_latent_cached``: tokens equal uncached greedy decoding; cache shapes and bytes; one prefill call,
  then T = 1 calls; eval mode during the calls and the model's mode restored; ``max_new_tokens`` 1 and 0.
* ``17.train_step``: expert loads, the sign rule, the returned losses (a model handed over in eval mode), clipping
  with ``max_norm=0.05`` (SGD probe, stale gradients left on the parameters).
* ``17.compare_models``: identical batches with ``seed=5``; a non-constant ``lr_fn`` (weights against the reference
  trained here); ``val_loss`` re-derived from the returned weights on the contract's batches; counts and caches (ints);
  models handed over in eval mode (training in train mode, validation in eval mode); the gradient norm at every
  optimizer step (clipped to 1); ``ms_per_step`` between the sleep put into each step and the time before validation
  (3 steps and 1 step).
* ``17.fp8_inference``: the trained asset (``seed=10_000``, 1 batch) and a heavy-tailed seeded model at small widths
  (2 batches), two-sided against the reference conversion computed once per process; every FP8Linear built during the
  call matched to the linear map it came from; the original model unchanged (side effect: its mode, and no routing
  record of the validation batches left in a train-mode model).
"""

from __future__ import annotations

import functools
import math

import torch

from ..core import check, float32_floor, module_facts, reference_memo, unwrap
from ..oracles import stored_oracle, write_oracle
from ..runner import also_blocked

U = "17"
ORACLE_ASSET = "oracles/u17_hf_deepseek.pt"
STATE_SEED = 1700
TOTAL, ACTIVE, MTP_MODULE = 1_757_696, 872_960, 248_512
SMALL = dict(d_model=32, n_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
             intermediate_size=64, moe_intermediate_size=16, context_length=64)


def _ref_model():
    from llmcourse.models.deepseek import DeepSeekBlock, DeepSeekConfig, DeepSeekLM, load_hf_deepseek

    return {"DeepSeekConfig": DeepSeekConfig, "DeepSeekBlock": DeepSeekBlock, "DeepSeekLM": DeepSeekLM,
            "load_hf_deepseek": load_hf_deepseek}


def _ref_generate():
    from llmcourse.models.deepseek import generate_latent_cached

    return {"generate_latent_cached": generate_latent_cached}


def _ref_train():
    from llmcourse.models.deepseek import train_step

    return {"train_step": train_step}


def _ref_compare():
    from llmcourse.models.deepseek import compare_models

    return {"compare_models": compare_models}


def _ref_fp8():
    from llmcourse.models.deepseek import fp8_eval

    return {"fp8_eval": fp8_eval}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _tokens(b, t, seed):
    return torch.randint(0, 65, (b, t), generator=_gen(seed))


def _run_named_by(t, probe, diagnose):
    """:meth:`grader.core.Tester.run` whose learner error is named by running ``diagnose`` (a cheaper probe that
    raises the same way: the first part of ``probe``) on the catalogued mistakes."""
    from ..core import CheckFailure, LearnerError

    try:
        out = t._learner.call(probe)
    except LearnerError as err:
        raise CheckFailure(err.message, bug_id=t.diagnose(diagnose, err)) from None
    t._note_returned(out)
    t._last = (probe, out)
    return out


def _compare_result(t, probe, result, expected, what: str, atol: float, rtol: float, pick, diagnose=None):
    """:meth:`grader.core.Tester.compare` on a result ``probe`` already returned (``t.run``): the same message and
    bug diagnosis, without running the learner's code a second time. ``diagnose``: a cheaper probe whose result
    *is* the compared value (``pick`` not applied), run on the catalogued mistakes to name one."""
    from ..core import _NONFINITE_ADVICE as advice
    from ..core import CheckFailure, _same, describe_difference, nonfinite_report

    got = pick(result)
    if not _same(got, expected, atol, rtol):
        detail = describe_difference(got, expected, atol, rtol)
        bug_id = t.diagnose(probe if diagnose is None else diagnose, got, atol=max(atol, 1e-12),
                            rtol=max(rtol, 1e-6), pick=pick if diagnose is None else None)
        bad = nonfinite_report(got, expected)
        if bad:
            if bug_id is None:
                bad = f"{bad}; {advice}"
            detail = bad if "NaN at index" in detail or "match within" in detail else f"{bad}; {detail}"
        raise CheckFailure(f"{what}: {detail}", bug_id=bug_id)
    t._compared_ok = True


# ------------------------------------------------------------------ seeded weights in both layouts


def course_state(seed: int = STATE_SEED, std: float = 0.05, **cfg) -> dict:
    """A main-path state dict in the course layout: every key of ``DeepSeekLM(DeepSeekConfig(mtp_depth=0, **cfg))``
    but ``lm_head.weight`` (tied) drawn in sorted-key order, ``N(0, std²)``, norms ``1 + N(0, std²)``, router
    biases ``N(0, 0.05²)``; ``lm_head.weight`` is ``embed_tokens.weight``. Drawn once per process and arguments; every
    call returns new tensors (callers may change them)."""
    state = _course_state_cached(seed, std, tuple(sorted(cfg.items())))
    out = {k: v.clone() for k, v in state.items() if k != "lm_head.weight"}
    out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


@functools.lru_cache(maxsize=16)
def _course_state_cached(seed: int, std: float, cfg: tuple) -> dict:
    from llmcourse.models.deepseek import DeepSeekConfig, DeepSeekLM

    with torch.random.fork_rng():
        torch.manual_seed(0)
        shapes = {k: tuple(v.shape) for k, v in DeepSeekLM(DeepSeekConfig(mtp_depth=0, **dict(cfg))).state_dict().items()}
    g = _gen(seed)
    state = {}
    for k in sorted(shapes):
        if k == "lm_head.weight":
            continue
        r = torch.randn(shapes[k], generator=g)
        state[k] = 1.0 + std * r if "norm" in k else (0.05 if k.endswith("e_score_correction_bias") else std) * r
    state["lm_head.weight"] = state["embed_tokens.weight"]
    return state


def hf_layout(state: dict) -> dict:
    """The same weights under ``DeepseekV3ForCausalLM``'s keys: ``model.`` prefix, experts fused per layer into
    ``gate_up_proj (E, 2I, D)`` (gate rows first) and ``down_proj (E, D, I)``."""
    out, experts = {}, {}
    for k, v in state.items():
        if k == "lm_head.weight":
            out[k] = v.clone()
        elif ".mlp.experts." in k:
            layer, rest = k.split(".mlp.experts.")
            e, proj = rest.split(".")[:2]
            experts.setdefault(layer, {}).setdefault(int(e), {})[proj] = v
        else:
            out["model." + k] = v.clone()
    for layer, per in experts.items():
        idx = sorted(per)
        out[f"model.{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([per[e]["gate_proj"], per[e]["up_proj"]], 0) for e in idx])
        out[f"model.{layer}.mlp.experts.down_proj"] = torch.stack([per[e]["down_proj"] for e in idx])
    return out


def build_hf_oracle() -> dict:
    """Logits of ``DeepseekV3ForCausalLM`` (F17.1 configuration written out, eager attention) with
    :func:`hf_layout` ``(course_state())`` on two seeded inputs (needs transformers; a few seconds).

    Write it with ``python -c "from grader.checks.u17_deepseek_capstone import write_hf_oracle; write_hf_oracle()"``.
    """
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=65, hidden_size=128, intermediate_size=384, moe_intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=1.0,
        kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32, n_group=4,
        topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1, tie_word_embeddings=True,
        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rope_interleave=True, attn_implementation="eager")
    hf = DeepseekV3ForCausalLM(cfg).eval()
    missing, unexpected = hf.load_state_dict(hf_layout(course_state()), strict=False)
    assert not unexpected and not [k for k in missing if "inv_freq" not in k], (missing, unexpected)
    idx = _tokens(2, 24, STATE_SEED + 1)
    with torch.no_grad():
        logits = hf(idx).logits.clone()
    return {"idx": idx, "logits": logits}


def write_hf_oracle() -> None:
    write_oracle(ORACLE_ASSET, build_hf_oracle)


oracle = stored_oracle(ORACLE_ASSET, build_hf_oracle)


def _course_model(state=None, seed=0, **cfg):
    """The course's DeepSeekLM (another exercise's answer) seeded, optionally with a main-path state."""
    from llmcourse.models.deepseek import DeepSeekConfig, DeepSeekLM

    torch.manual_seed(seed)
    m = DeepSeekLM(DeepSeekConfig(**cfg))
    if state is not None:
        m.load_state_dict(state, strict=False)
    return m


# ================================================================== 17.DeepSeekLM


@functools.lru_cache(maxsize=1)
def _full_state_cached() -> tuple:
    """:func:`course_state` plus seeded weights of the MTP module (norms ``1 + N(0, 0.05²)``, the rest ``N(0, 0.05²)``)."""
    state = course_state()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        shapes = {k: tuple(v.shape) for k, v in _course_model().state_dict().items() if k.startswith("mtp.")}
    g = _gen(STATE_SEED + 7)
    for k in sorted(shapes):
        r = torch.randn(shapes[k], generator=g)
        state[k] = 1.0 + 0.05 * r if "norm" in k else 0.05 * r
    return tuple(state.items())


def _full_state() -> dict:
    return dict(_full_state_cached())


@torch.no_grad()
def _mtp_expected(state: dict, x, y) -> list:
    """``[(mtp_logits[0], loss_mtp[0])]`` of the course's model with ``state`` for depth 1 reading the trunk output before
    the final norm (the course's convention) and after it (vLLM's), computed module by module here."""
    import torch.nn.functional as F

    ref = _course_model(seed=0)
    ref.load_state_dict(state)
    ref.eval()
    t = x.shape[1]
    h = ref.embed_tokens(x)
    for i, layer in enumerate(ref.layers):
        h = layer(h, ref.rope_cos[:t], ref.rope_sin[:t], ref.causal[:t, :t], None, i)
    n, out = t - 1, []
    for h0 in (h, ref.norm(h)):
        hk = ref.mtp[0](h0[:, :n], ref.embed_tokens(x[:, 1:]), ref.rope_cos[1:t], ref.rope_sin[1:t], ref.causal[:n, :n])
        lg = ref.lm_head(hk)
        out.append((lg, F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y[:, 1:].reshape(-1))))
    return out


def _learner_model(impl, hf_state=None, seed=0, **cfg):
    torch.manual_seed(seed)
    m = impl.DeepSeekLM(impl.DeepSeekConfig(**cfg))
    if hf_state is not None:
        impl.load_hf_deepseek(unwrap(m), {k: v.clone() for k, v in hf_state.items()})
    return m

ALT = dict(vocab_size=70, d_model=48, n_layers=4, n_heads=3, context_length=24, q_lora_rank=40, kv_lora_rank=20,
           qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=10, rope_theta=500.0, rope_interleave=False,
           intermediate_size=96, first_k_dense_replace=2, moe_intermediate_size=24, n_routed_experts=6,
           n_shared_experts=2, num_experts_per_tok=3, n_group=3, topk_group=2, routed_scaling_factor=2.5,
           norm_topk_prob=False, bias_update_speed=0.01, mtp_depth=2, mtp_lambda=0.5, rms_norm_eps=1e-5,
           tie_word_embeddings=False)


@functools.lru_cache(maxsize=1)
def _alt_case_cached() -> tuple:
    """Seeded weights of every key of the course's ``DeepSeekLM(DeepSeekConfig(**ALT))`` (norms ``1 + N(0, 0.1²)``,
    router biases ``N(0, 0.05²)``, the rest ``N(0, 0.15²)``, sorted-key order) and a ``(2, 24)`` token batch."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        shapes = {k: tuple(v.shape) for k, v in _course_model(**ALT).state_dict().items()}
    g = _gen(STATE_SEED + 11)
    state = {}
    for k in sorted(shapes):
        r = torch.randn(shapes[k], generator=g)
        state[k] = 1.0 + 0.1 * r if "norm" in k else (0.05 if k.endswith("e_score_correction_bias") else 0.15) * r
    idx = torch.randint(0, ALT["vocab_size"], (2, ALT["context_length"]), generator=_gen(STATE_SEED + 12))
    return tuple(state.items()), idx


def _alt_case() -> tuple[dict, torch.Tensor]:
    state, idx = _alt_case_cached()
    return dict(state), idx


def _alt_run(m, state, idx, cache_cls) -> dict:
    """The measurements of the non-default-configuration probe on a model ``m`` (learner's or the course's)."""
    m_ = unwrap(m)
    m_.load_state_dict(state, strict=True)
    m_.eval()
    x, y = idx[:, :-1], idx[:, 1:]
    res = {}
    with torch.no_grad():
        o = m(x, y)
        res.update(logits=o["logits"], loss=o["loss"], loss_mtp=[v.detach() for v in o["loss_mtp"]],
                   mtp_logits=[v.detach() for v in o["mtp_logits"]])
        res["logits_full"] = m(idx)["logits"]
        cache = cache_cls(ALT["n_layers"])
        parts = [m(idx[:, :10], cache=cache)["logits"], m(idx[:, 10:16], cache=cache)["logits"]]
        parts += [m(idx[:, i:i + 1], cache=cache)["logits"] for i in range(16, 24)]
        res["cached"] = torch.cat(parts, 1)
    m_.train()
    m_.zero_grad(set_to_none=True)
    m(x, y)["loss"].backward()
    res["grads"] = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in m_.named_parameters()}
    moes = [layer.mlp for layer in m_.layers[ALT["first_k_dense_replace"]:]]
    res["loads"] = [torch.bincount(mo.last_indices.flatten(), minlength=ALT["n_routed_experts"])
                    if getattr(mo, "last_indices", None) is not None else None for mo in moes]
    before = [mo.gate.e_score_correction_bias.clone() for mo in moes]
    m.update_router_biases()
    res["bias_delta"] = [mo.gate.e_score_correction_bias - b for mo, b in zip(moes, before)]
    return res


def _alt_probe(state, idx):
    def probe(impl):
        from llmcourse.models.deepseek_mla import LatentCache

        res = _alt_run(_learner_model(impl, **ALT), state, idx, LatentCache)
        res.pop("loads")
        m0 = _learner_model(impl, **dict(ALT, mtp_depth=0))
        with torch.no_grad():
            o = m0(idx[:, :-1], idx[:, 1:])
        res.update(loss_depth0=float(o["loss"]), loss_main_depth0=float(o["loss_main"]),
                   n_mtp_depth0=len(o.get("loss_mtp", [])))
        return res
    return probe


def _alt_reference() -> dict:
    from llmcourse.models.deepseek_mla import LatentCache

    state, idx = _alt_case()
    return reference_memo("17.alt", state, idx, compute=lambda: _alt_run(_course_model(**ALT), state, idx, LatentCache))


def _init_probe(impl) -> dict:
    """Per weight ``(std, mean, numel)`` of a fresh learner model's linear, embedding and router weights (the keys that
    end in ``.weight`` and are not norms; ``lm_head`` is the tied embedding) and the pooled share beyond 2·0.02."""
    return _init_stats(_learner_model(impl, seed=4))


def _init_stats(m) -> dict:
    """:func:`_init_probe` on a model ``m`` built just now (inside a probe)."""
    m = unwrap(m)
    per, beyond, total = {}, 0, 0
    for k, v in m.state_dict().items():
        if k.endswith(".weight") and "norm" not in k and k != "lm_head.weight":
            w = v.detach().double()
            per[k] = (float(w.std()), float(w.mean()), w.numel())
            beyond += int((w.abs() > 0.04).sum())
            total += w.numel()
    return {"per": per, "tail": beyond / max(total, 1)}



def _mtp_values(m, full: dict, x, y) -> dict:
    """Inside a probe: depth 1's MTP logits and loss of ``m`` with every weight of ``full`` loaded (strict), eval mode."""
    unwrap(m).load_state_dict(full, strict=True)
    unwrap(m).eval()
    with torch.no_grad():
        o = m(x, y)
    return {"mtp": o["mtp_logits"][0], "loss_mtp": o["loss_mtp"][0]}


def _side_effects(m, before: dict, idx) -> list:
    """Inside a probe: the state-dict keys of ``m`` that differ from ``before`` after a forward with targets in eval
    mode, then one in train mode (both without gradients)."""
    changed = []
    for train in (False, True):
        unwrap(m).train(train)
        with torch.no_grad():
            m(idx[:, :-1], idx[:, 1:])
        changed += [k for k, v in unwrap(m).state_dict().items() if k in before and not torch.equal(v, before[k])]
    return sorted(set(changed))


@functools.lru_cache(maxsize=1)
def _default_shapes() -> tuple:
    """``(key, shape)`` of every state-dict entry of the course's ``DeepSeekLM(DeepSeekConfig())``."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return tuple((k, tuple(v.shape)) for k, v in _course_model().state_dict().items())


@functools.lru_cache(maxsize=1)
def _hf_state() -> dict:
    """:func:`hf_layout` ``(course_state())``, once per process; read only here (probes get their own copy)."""
    return hf_layout(course_state())


def _reference_loads(x, y) -> list:
    """Expert loads (one ``(8,)`` count per MoE layer) of the course's model with :func:`course_state` after a
    training forward on ``(x, y)``, once per process and inputs."""
    def compute():
        ref = _course_model(course_state(), seed=0).train()
        ref(x, y)
        return [torch.bincount(ref.layers[i].mlp.last_indices.flatten(), minlength=8) for i in (1, 2, 3)]
    return reference_memo("17.loads", x, y, compute=compute)


@check(f"{U}.DeepSeekLM", ["DeepSeekConfig", "DeepSeekBlock", "DeepSeekLM", "load_hf_deepseek"], _ref_model)
def check_deepseek_lm(t):
    def facts_and_tie(impl):
        m = _learner_model(impl, seed=4)
        facts = module_facts(m)
        try:
            init = _init_stats(m)
        except Exception:  # asked again below by its own probe
            init = None
        try:
            with torch.no_grad():
                unwrap(m).embed_tokens.weight.add_(1.0)
            tied = (unwrap(m).embed_tokens.weight, unwrap(m).lm_head.weight)
        except Exception:  # asked again below by its own probe, which then fails with the learner's error
            tied = None
        return {"facts": facts, "tie": tied, "init": init}
    first = t.run(facts_and_tie)
    facts = first["facts"]
    t.expect(facts.get("is_module"), f"DeepSeekLM must be an nn.Module subclass, got {facts.get('type')}")
    sd = facts["state_dict"]
    params = set(facts.get("parameters", []))
    if any(k.endswith("e_score_correction_bias") for k in params):
        t.fail("e_score_correction_bias is a Parameter: an optimizer would change it by gradients; register it as a "
               "float32 buffer (in the state_dict, not in parameters())", bug="B17.bias_in_optimizer")
    if "layers.0.mlp.gate.weight" in sd or "layers.0.mlp.experts.0.gate_proj.weight" in sd:
        t.fail("layer 0 has experts and a router, but first_k_dense_replace=1 makes layer 0 a dense SwiGLU "
               "(mlp.gate_proj/up_proj/down_proj of width intermediate_size)", bug="B17.dense_layer_moe")
    want = dict(_default_shapes())
    got = {k: tuple(v) for k, v in sd.items()}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    t.expect(not missing and not extra, f"DeepSeekLM(DeepSeekConfig()) state_dict keys differ from the contract: "
             f"missing {missing[:6]}{' …' if len(missing) > 6 else ''}, unexpected {extra[:6]}"
             f"{' …' if len(extra) > 6 else ''}")
    bad = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    t.expect(not bad, f"shapes differ from the contract (got, expected): {dict(list(bad.items())[:5])}")
    for i in (1, 2, 3):
        k = f"layers.{i}.mlp.gate.e_score_correction_bias"
        t.expect(k in facts.get("buffers", []), f"{k} must be a buffer (persistent, float32)",
                 bug="B17.bias_in_optimizer")

    # tie and counts (re-derived from returned tensors and shapes)
    def tie(impl):
        m = _learner_model(impl)
        with torch.no_grad():
            unwrap(m).embed_tokens.weight.add_(1.0)
        return unwrap(m).embed_tokens.weight, unwrap(m).lm_head.weight
    emb, head = first["tie"] if first["tie"] is not None else t.run(tie)
    t.expect(torch.equal(emb, head), "lm_head.weight must be the same Parameter as embed_tokens.weight (tied)")
    main = sum(math.prod(s) for k, s in got.items() if k in params and not k.startswith("mtp.") and k != "lm_head.weight")
    t.expect(main == TOTAL, f"the main path must have 1,757,696 parameters (tied head counted once, MTP excluded); "
             f"counted {main:,} from your state_dict")
    mtp = sum(math.prod(s) for k, s in got.items() if k in params and k.startswith("mtp.0."))
    t.expect(mtp == MTP_MODULE, f"one MTP module with a dense DeepSeek block has 248,512 parameters; counted {mtp:,}")

    # parity with transformers
    orc = oracle()
    hf_state = _hf_state()
    idx = orc["idx"]

    # causality
    alt = idx.clone()
    alt[:, 12] = (alt[:, 12] + 1) % 65

    # logits, causality and side effects of forwards observed on one model (a model build costs as much as the
    # forwards); what raises after the logits is asked again by its own probe below, which fails with the error
    def parity(impl):
        m = _learner_model(impl, hf_state)
        unwrap(m).eval()
        try:
            before = {k: v.clone() for k, v in unwrap(m).state_dict().items()}
        except Exception:
            before = None
        with torch.no_grad():
            out = m(idx)
        res = {"logits": out["logits"] if isinstance(out, dict) else out, "causal": None, "side": None}
        try:
            with torch.no_grad():
                res["causal"] = (m(idx)["logits"], m(alt)["logits"])
        except Exception:
            return res
        if before is not None:
            try:
                res["side"] = _side_effects(m, before, idx)
            except Exception:
                pass
        return res
    def logits(impl):  # the logits part alone: what the catalogued mistakes are run on to name one
        m = _learner_model(impl, hf_state)
        unwrap(m).eval()
        with torch.no_grad():
            out = m(idx)
        return out["logits"] if isinstance(out, dict) else out
    par = _run_named_by(t, parity, logits)
    _compare_result(t, parity, par, orc["logits"], "logits of DeepseekV3ForCausalLM (the course default "
                    "configuration) after loading its state dict with load_hf_deepseek", atol=1e-4, rtol=0,
                    pick=lambda r: r["logits"], diagnose=logits)

    def causal(impl):
        m = _learner_model(impl, hf_state)
        unwrap(m).eval()
        with torch.no_grad():
            return m(idx)["logits"], m(alt)["logits"]
    a, b = par["causal"] if par["causal"] is not None else t.run(causal)
    t.expect(torch.allclose(a[:, :12], b[:, :12], atol=1e-6, rtol=0), "changing token 12 changed the logits at "
             "positions 0…11: a position may only read tokens at or before it")

    # side effects: forwards in eval and train mode (with targets) leave every parameter and buffer as it was
    def side(impl):
        m = _learner_model(impl, hf_state)
        return _side_effects(m, {k: v.clone() for k, v in unwrap(m).state_dict().items()}, idx)
    moved = par["side"] if par["side"] is not None else t.run(side)
    t.expect(moved == [], f"a forward must not change parameters or buffers (the router bias moves only in "
             f"update_router_biases); changed: {moved[:4]}")

    # losses and MTP
    x, y = idx[:, :-1], idx[:, 1:]
    x2, y2 = x.clone(), y.clone()
    x2[:, 10] = (x2[:, 10] + 1) % 65
    y2[:, 9] = x2[:, 10]

    full = _full_state()

    def losses(impl):
        m = _learner_model(impl, hf_state, seed=3)
        unwrap(m).eval()
        with torch.no_grad():
            o1, o2 = m(x, y), m(x2, y2)
        res = {"logits": o1["logits"], "loss": o1["loss"], "loss_main": o1["loss_main"],
               "loss_mtp": list(o1["loss_mtp"]), "mtp1": o1["mtp_logits"][0], "mtp2": o2["mtp_logits"][0]}
        try:  # the MTP values below on the same model, every weight loaded (asked again by their own probe on error)
            res["mtp_values"] = _mtp_values(m, full, x, y)
        except Exception:
            res["mtp_values"] = None
        return res
    got = t.run(losses)
    mtp_got = got["mtp_values"]
    lg = got["logits"]
    main_loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))
    t.expect(torch.allclose(torch.as_tensor(got["loss_main"]), main_loss, atol=1e-5),
             "loss_main must be the cross-entropy of the returned logits against targets")
    t.expect(len(got["loss_mtp"]) == 1, f"with mtp_depth=1, loss_mtp must be a list of one loss; got "
             f"{len(got['loss_mtp'])}")
    t.expect(abs(float(got["loss"]) - (float(got["loss_main"]) + 0.3 * float(got["loss_mtp"][0]))) < 1e-5,
             "loss must be loss_main + mtp_lambda/mtp_depth · Σ loss_mtp (λ = 0.3, D = 1)")
    m1, m2 = got["mtp1"], got["mtp2"]
    t.expect(tuple(m1.shape) == (2, 22, 65), f"mtp_logits[0] must be (B, T−1, V) = (2, 22, 65); got {tuple(m1.shape)}")
    t.expect(torch.allclose(m1[:, :9], m2[:, :9], atol=1e-6, rtol=0),
             "the depth-1 MTP logits at positions 0…8 changed when token 10 changed: position i may read tokens up to "
             "i+1 only (the embedding of the token the main head predicts)")
    t.expect(not torch.allclose(m1[:, 9], m2[:, 9]), "the depth-1 MTP logits at position 9 must depend on token 10 "
             "(its embedded input)")

    # the MTP head by value: every weight (MTP module included) loaded into the learner's model, against the course's
    # module applied here; depth 1 may read the trunk state before or after the final norm (both conventions exist)
    want = _mtp_expected(full, x, y)

    def mtp_values(impl):
        return _mtp_values(_learner_model(impl), full, x, y)
    got = mtp_got if mtp_got is not None else t.run(mtp_values)
    lg, lm = got["mtp"], got["loss_mtp"]
    own = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), y[:, 1:].reshape(-1))
    t.expect(abs(float(lm) - float(own)) < 1e-4,
             f"loss_mtp[0] must be the cross-entropy of mtp_logits[0] against targets[:, 1:] (position i predicts token "
             f"i+2); against your own mtp_logits that is {float(own):.5f}, you returned {float(lm):.5f}"
             + (" — the cross-entropy against targets[:, :T−1], the token the module embeds (a copy task)"
                if abs(float(lm) - float(torch.nn.functional.cross_entropy(
                    lg.reshape(-1, lg.shape[-1]).float(), y[:, :-1].reshape(-1)))) < 1e-4 else ""))
    close = [bool(torch.allclose(lg, w_lg, atol=1e-4, rtol=0)) for w_lg, _ in want]
    t.expect(any(close), "mtp_logits[0] with every weight given (the MTP module's included) differs from "
             "lm_head(mtp[0](h_prev[:, :T−1], embed(idx[:, 1:]), RoPE rows 1…T−1, causal mask)) with h_prev the trunk "
             "output before (or after) the final norm: max gap "
             f"{min(float((lg - w_lg).abs().max()) for w_lg, _ in want):.3g}. Check what the module receives and in "
             "which order (the previous depth's state first, then the embeddings)")
    w_loss = want[close.index(True)][1]
    t.expect(abs(float(lm) - float(w_loss)) < 1e-4, f"loss_mtp[0] must be {float(w_loss):.5f} on these weights; got "
             f"{float(lm):.5f}")

    # the bias update rule from the training forward's routing
    def bias_update(impl):
        m = _learner_model(impl, hf_state)
        unwrap(m).train()
        m(x, y)["loss"].backward()
        before = [unwrap(m).layers[i].mlp.gate.e_score_correction_bias.clone() for i in (1, 2, 3)]
        m.update_router_biases()
        return before, [unwrap(m).layers[i].mlp.gate.e_score_correction_bias.clone() for i in (1, 2, 3)]
    before, after = t.run(bias_update)
    for i, (b0, b1) in enumerate(zip(before, after)):
        c = _reference_loads(x, y)[i].float()
        t.expect(torch.allclose(b1 - b0, 0.001 * torch.sign(c.mean() - c), atol=1e-7, rtol=0),
                 f"update_router_biases: layer {i + 1}'s bias must move by γ·sign(mean(c) − c) with the expert loads c "
                 "of the last training forward (γ = bias_update_speed = 0.001)")

    # every configuration field at a non-default value: the learner's model with the course model's (seeded) weights
    # against the course's DeepSeekLM (another exercise's answer here); forward and losses (two MTP depths, λ = 0.5),
    # incremental decoding through a LatentCache up to exactly context_length, gradients of the loss (train mode) and
    # the bias rule with γ = 0.01
    alt_state, alt_idx = _alt_case()
    want = _alt_reference()
    got = t.run(_alt_probe(alt_state, alt_idx))
    fields = ", ".join(f"{k}={v}" for k, v in ALT.items())

    def gap(a, b):
        if not isinstance(a, torch.Tensor) or tuple(a.shape) != tuple(b.shape):
            return float("inf")
        return float((a.float() - b).abs().max())

    lg_gap = gap(got["logits"], want["logits"])
    t.expect(lg_gap <= 1e-4 + float32_floor(want["logits"]),
             f"with every DeepSeekConfig field at another value ({fields}) your logits differ from the course's "
             f"DeepSeekLM on the same weights by {lg_gap:.3g}: every field must reach the module that uses it")
    t.expect(len(got["mtp_logits"]) == 2 and len(got["loss_mtp"]) == 2,
             f"with mtp_depth=2 the output must hold two MTP depths; got {len(got['mtp_logits'])} mtp_logits and "
             f"{len(got['loss_mtp'])} losses")
    for k in range(2):
        g = gap(got["mtp_logits"][k], want["mtp_logits"][k])
        t.expect(g <= 1e-4 + float32_floor(want["mtp_logits"][k]),
                 f"mtp_depth=2: mtp_logits[{k}] must be depth {k + 1}'s (B, T−{k + 1}, V) logits, depth {k + 1} reading "
                 f"depth {k}'s state; they differ from the course's module chain by {g:.3g}")
        t.expect(abs(float(got["loss_mtp"][k]) - float(want["loss_mtp"][k])) < 1e-4,
                 f"mtp_depth=2: loss_mtp[{k}] must be {float(want['loss_mtp'][k]):.5f}; got {float(got['loss_mtp'][k]):.5f}")
    t.expect(abs(float(got["loss"]) - float(want["loss"])) < 1e-4,
             f"with mtp_lambda=0.5 and mtp_depth=2, loss = loss_main + λ/D·Σ loss_mtp = {float(want['loss']):.5f}; got "
             f"{float(got['loss']):.5f}")
    t.expect(abs(float(got["loss_depth0"]) - float(got["loss_main_depth0"])) < 1e-6 and got["n_mtp_depth0"] == 0,
             "with mtp_depth=0 there is no MTP loss: loss must equal loss_main and loss_mtp must be empty")
    c_gap = gap(got["cached"], want["logits_full"])
    t.expect(c_gap <= 1e-4 + float32_floor(want["logits_full"]),
             "decoding through a LatentCache (10 prompt tokens, a chunk of 6, then 8 single tokens: exactly "
             f"context_length = 24 positions) must give the logits of one uncached forward; the gap is {c_gap:.3g}: the "
             "new tokens sit at positions cache.seq_len…, and each layer reads and extends its own cache entry")
    bad = []
    for name, w in want["grads"].items():
        g = got["grads"].get(name)
        if g is None:
            bad.append(f"{name} (no gradient)")
        elif tuple(g.shape) != tuple(w.shape) or float((g.double() - w.double()).norm()) > \
                1e-3 * float(w.double().norm()) + 1e-6:
            bad.append(name)
    t.expect(not bad, f"the gradient of loss (train mode) must reach every parameter as in the course's model; it "
             f"differs at {_name_summary(bad)}: no tensor on the way from the embedding to the losses may be detached")
    for i, (d, c) in enumerate(zip(got["bias_delta"], want["loads"])):
        c = c.float()
        t.expect(torch.allclose(d, 0.01 * torch.sign(c.mean() - c), atol=1e-7, rtol=0),
                 f"update_router_biases with bias_update_speed=0.01: MoE layer {i + 2}'s bias must move by "
                 "γ·sign(mean(c) − c) (γ from the configuration)")

    # initialisation: every linear, embedding and router weight N(0, 0.02²) (MTP modules included)
    stats = first["init"] if first["init"] is not None else t.run(_init_probe)
    off = [k for k, (std, mean, n) in stats["per"].items()
           if abs(std / 0.02 - 1) > 6 / math.sqrt(2 * n) + 0.01 or abs(mean) > 6 * 0.02 / math.sqrt(n)]
    tail = stats["tail"]
    t.expect(not off and 0.035 < tail < 0.056,
             "a fresh DeepSeekLM must initialise every linear, embedding and router weight N(0, 0.02²); "
             + (f"these are not: {_name_summary(off)}" if off else
                f"{tail:.1%} of the weights lie beyond 2σ (a normal law has 4.6%)"))


# ================================================================== 17.generate_latent_cached


@check(f"{U}.generate_latent_cached", ["generate_latent_cached"], _ref_generate)
def check_generate(t):
    from llmcourse.models.deepseek import greedy_uncached

    state = course_state(STATE_SEED + 2, std=0.3)
    prompt = _tokens(2, 5, STATE_SEED + 3)

    def run(impl):
        m = _course_model(state).eval()
        lengths = []
        hook = m.layers[0].register_forward_pre_hook(lambda mod, args: lengths.append(int(args[0].shape[1])))
        toks, cache = impl.generate_latent_cached(m, prompt, 12)
        hook.remove()
        return {"tokens": toks, "nbytes": int(cache.nbytes()), "lengths": lengths,
                "c_kv": [list(v.shape) if isinstance(v, torch.Tensor) else None for v in cache.c_kv],
                "k_pe": [list(v.shape) if isinstance(v, torch.Tensor) else None for v in cache.k_pe]}
    expected = reference_memo("17.greedy12", STATE_SEED + 2, prompt,
                              compute=lambda: greedy_uncached(_course_model(state).eval(), prompt, 12)).clone()
    got = t.run(run)
    _compare_result(t, run, got, expected, "greedy tokens for a (2, 5) prompt and 12 new tokens (equal to uncached "
                    "greedy decoding with the main head; the MTP module has no part in it: its logits predict one token "
                    "further, and mixing them in or appending its token changes the text)", atol=0, rtol=0,
                    pick=lambda o: o["tokens"])
    n = 5 + 12 - 1
    t.expect(got["c_kv"] == [[2, n, 64]] * 4 and got["k_pe"] == [[2, n, 16]] * 4,
             f"the cache must hold, per layer, c_kv (B, T, d_c) = (2, {n}, 64) and k_pe (B, T, d_R) = (2, {n}, 16) "
             f"(the last token is returned, not fed); got c_kv {got['c_kv']} and k_pe {got['k_pe']}",
             bug="B17.cache_full_kv")
    want = 4 * (64 + 16) * n * 2 * 4
    t.expect(got["nbytes"] == want, f"cache.nbytes() must be n_layers·(d_c + d_R)·T·B·4 = {want:,}; got "
             f"{got['nbytes']:,}", bug="B17.cache_full_kv")
    t.expect(got["lengths"] == [5] + [1] * 11, f"one prefill call with the 5 prompt tokens, then one call with T = 1 "
             f"per new token; the model's first layer saw sequence lengths {got['lengths']}")

    def modes(impl):
        out, during = [], []
        m = _course_model(state)
        hook = m.register_forward_pre_hook(lambda mod, args: during.append(bool(mod.training)))
        for train in (True, False):  # one model, handed over in train mode, then in eval mode
            m.train(train)
            impl.generate_latent_cached(m, prompt[:1, :3], 2)
            out.append(bool(m.training))
        hook.remove()
        return {"after": out, "during": during}
    got = t.run(modes)
    t.expect(got["after"] == [True, False], "generate_latent_cached must leave the model in the mode it found it in "
             "(train mode stays train mode, eval stays eval)")
    t.expect(got["during"] and not any(got["during"]), "given a model in training mode, generate_latent_cached ran it "
             "in training mode: its MoE layers recorded the generated tokens' routing, which the next "
             "update_router_biases would apply; decode in eval mode (and restore the mode afterwards)",
             bug="B17.decode_in_train_mode")

    # max_new_tokens at its edges: one new token (the prompt is fed, the token returned), none (the prompt back; the
    # contract leaves open whether the prompt is prefilled into the cache then)
    def short(impl):
        m = _course_model(state).eval()
        out = {}
        for n in (1, 0):
            toks, cache = impl.generate_latent_cached(m, prompt, n)
            out[n] = {"tokens": toks, "seq_len": int(cache.seq_len)}
        return out
    got = t.run(short)
    one = expected[:, :6]  # greedy decoding's first token is the first of its 12
    t.expect(torch.equal(got[1]["tokens"], one) and got[1]["seq_len"] == 5,
             f"max_new_tokens=1 must return the prompt and one greedy token {one[:, -1].tolist()} with the 5 prompt "
             f"positions cached; got {got[1]['tokens'][:, 5:].tolist()} with {got[1]['seq_len']} cached")
    t.expect(torch.equal(got[0]["tokens"], prompt) and got[0]["seq_len"] in (0, 5),
             "max_new_tokens=0 must return the prompt unchanged")


# ================================================================== 17.train_step


def _train_probe(state, x, y, sgd=False, max_norm=1.0, start_eval=False, stale=False):
    """``train_step`` on the course's small model; ``start_eval``: the model is handed over in eval mode; ``stale``:
    every parameter carries a stale gradient (0.5 everywhere) from an earlier backward."""
    def probe(impl):
        m = _course_model(state, seed=0, **SMALL)
        m.train(not start_eval)
        if stale:
            for p in m.parameters():
                p.grad = torch.full_like(p, 0.5)
        opt = torch.optim.SGD(m.parameters(), lr=1.0) if sgd else torch.optim.AdamW(m.parameters(), lr=1e-2)
        before_p = [p.detach().clone() for p in m.parameters()]
        before_b = [layer.mlp.gate.e_score_correction_bias.clone() for layer in m.layers[1:]]
        during = []
        hook = m.register_forward_pre_hook(lambda mod, args: during.append(bool(mod.training)))
        try:
            rec = impl.train_step(m, opt, x, y, max_norm)
        except Exception:
            if during and not any(during):      # the mode is the first thing wrong: name it, not what follows
                return {"during": during}
            raise
        finally:
            hook.remove()
        rec = dict(rec)
        rec["loss_mtp"] = [float(v) for v in rec.get("loss_mtp", [])]
        return {"rec": {k: rec.get(k) for k in ("loss", "loss_main", "loss_mtp", "expert_load")}, "during": during,
                "bias_before": before_b, "bias_after": [layer.mlp.gate.e_score_correction_bias.clone()
                                                        for layer in m.layers[1:]],
                "delta": [p.detach() - b for p, b in zip(m.parameters(), before_p)],
                "grad_norm": math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in m.parameters()
                                           if p.grad is not None))}
    return probe


def _norm(tensors) -> float:
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in tensors))


def _train_reference(state, x, y) -> tuple:
    """``(loss, gradients, parameter names)`` of the course's small model with ``state`` in train mode on ``(x, y)``
    (the training loss before the step and its gradient, zeros where a parameter gets none), once per process and
    inputs (:func:`grader.core.reference_memo`); callers must not modify the tensors."""
    def compute():
        ref = _course_model(state, seed=0, **SMALL).train()
        out = ref(x, y)
        loss = out["loss"].item()
        out["loss"].backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ref.parameters()]
        return loss, grads, [n for n, _ in ref.named_parameters()]
    return reference_memo("17.train_reference", state, x, y, compute=compute)


@check(f"{U}.train_step", ["train_step"], _ref_train)
def check_train_step(t):
    state = course_state(STATE_SEED + 4, std=0.1, **SMALL)
    seq = _tokens(4, 25, STATE_SEED + 5)
    x, y = seq[:, :-1], seq[:, 1:]
    got = t.run(_train_probe(state, x, y, start_eval=True))
    t.expect(got["during"] and all(got["during"]), "given a model in eval mode, train_step ran its forward in eval mode: "
             "a training step runs in training mode (the MoE layers record the step's routing only then)",
             bug="B17.step_in_eval_mode")
    rec = got["rec"]
    loads = rec.get("expert_load")
    t.expect(isinstance(loads, list) and len(loads) == 3 and all(isinstance(c, torch.Tensor) for c in loads),
             "expert_load must be a list with one (E,) tensor of counts per MoE layer (3 here)")
    for i, c in enumerate(loads):
        t.expect(tuple(c.shape) == (8,) and int(c.sum()) == 4 * 24 * 2,
                 f"expert_load[{i}] must count the (token, slot) assignments of the step: shape (8,), sum B·T·k = 192; "
                 f"got shape {tuple(c.shape)}, sum {int(c.sum())}")
    changed = [not torch.equal(a, b) for a, b in zip(got["bias_before"], got["bias_after"])]
    t.expect(any(changed), "the router biases did not change: call model.update_router_biases() after "
             "optimizer.step(), from that step's expert loads", bug="B17.bias_update_missing")
    for i, (b0, b1, c) in enumerate(zip(got["bias_before"], got["bias_after"], loads)):
        c = c.float()
        t.expect(torch.allclose(b1 - b0, 0.001 * torch.sign(c.mean() - c), atol=1e-7, rtol=0),
                 f"MoE layer {i + 1}: the bias must change by exactly γ·sign(mean(c) − c) with the returned loads c "
                 "(γ = 0.001), once per step", bug="B17.bias_update_missing")
    t.expect(abs(float(rec["loss"]) - (float(rec["loss_main"]) + 0.3 * sum(rec["loss_mtp"]))) < 1e-5,
             "the returned loss must equal loss_main + λ/D·Σ loss_mtp (λ = 0.3, D = 1)")
    ref_loss, grads, names = _train_reference(state, x, y)
    t.expect(abs(float(rec["loss"]) - ref_loss) < 1e-5, f"the returned loss must be the model's training "
             f"loss on (x, y) before the step: expected {ref_loss:.6f}, got {float(rec['loss']):.6f}")
    # clipping before the step: SGD with lr 1 moves the weights by exactly the clipped gradient
    got = t.run(_train_probe(state, x, y, sgd=True, max_norm=0.05, stale=True))
    norm = math.sqrt(sum(float((d.double() ** 2).sum()) for d in got["delta"]))
    if norm > 0.05 * 1.001 and abs(float(got.get("grad_norm") or 0.0) - 0.05) < 1e-4:
        t.fail(f"with plain SGD (lr 1) and max_norm=0.05 the step moved the weights by a global norm of {norm:.4g}, "
               "while the gradients left behind have norm 0.05: they were clipped after optimizer.step() had used "
               "them", bug="B17.clip_after_step")
    t.expect(norm <= 0.05 * 1.001 and norm > 0.04, f"with plain SGD (lr 1) and max_norm=0.05 the step moved the "
             f"weights by a global norm of {norm:.4g}: the gradients must be clipped to max_norm before "
             "optimizer.step()")
    gnorm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    step = [-g * min(1.0, 0.05 / (gnorm + 1e-6)) for g in grads]
    num = sum(float(((d - w).double() ** 2).sum()) for d, w in zip(got["delta"], step))
    den = sum(float((w.double() ** 2).sum()) for w in step)
    stale_norm = _norm([g + 0.5 for g in grads])
    stale_step = [-(g + 0.5) * min(1.0, 0.05 / (stale_norm + 1e-6)) for g in grads]
    stale_num = sum(float(((d - w).double() ** 2).sum()) for d, w in zip(got["delta"], stale_step))
    mtp_moved = any(float(d.abs().max()) > 0 for d, n in zip(got["delta"], names) if n.startswith("mtp."))
    t.expect((num / den) ** 0.5 < 1e-3,
             "with plain SGD (lr 1, max_norm 0.05) the step must be minus the clipped gradient of the training loss "
             f"loss_main + λ/D·Σ loss_mtp (the parameters came with stale gradients of an earlier backward, which the "
             f"step must clear first); your step differs from it by {(num / den) ** 0.5:.1%} of its norm"
             + ("" if mtp_moved else " (the MTP module never moved: its loss was not back-propagated)"),
             bug="B17.grads_accumulated" if (stale_num / den) ** 0.5 < 1e-3 else None)


# ================================================================== 17.compare_models


def _compare_init_models(names=("gpt", "llama", "deepseek")) -> dict:
    """The three models, built in this order after ``torch.manual_seed(0)``; ``names``: only these (the ones built
    before the last of them too, so that each gets the same weights as in the full set)."""
    from llmcourse.models import GPT2Config, GPT2Model, Llama3Config, Llama3Model

    order = ("gpt", "llama", "deepseek")
    last = max(order.index(n) for n in names)
    build = {"gpt": lambda: GPT2Model(GPT2Config.preset("gpt2-char-tiny")),
             "llama": lambda: Llama3Model(Llama3Config.preset("llama3-tiny")),
             "deepseek": lambda: _course_model(seed=0)}
    torch.manual_seed(0)
    return {n: build[n]() for n in order[:last + 1]}


def _compare_reference(data: torch.Tensor) -> tuple[dict, dict]:
    """``(start, trained)`` state dicts of "llama" and "deepseek": the reference ``compare_models`` run from
    :func:`_compare_init_models` on ``data`` (3 steps, batch 4, context 16, :func:`_compare_lr`, seed 5). Computed once
    per process and data (:func:`grader.core.reference_memo`); the global torch RNG is left as the computation leaves
    it, every time. Callers must not modify the tensors."""
    def compute():
        from llmcourse.models.deepseek import compare_models as reference_compare

        models = _compare_init_models()
        start = {n: {k: v.clone() for k, v in models[n].state_dict().items()} for n in ("llama", "deepseek")}
        reference_compare(models, data[:2500], data[2500:], 3, 4, 16, _compare_lr, 5)
        trained = {n: {k: v.detach().clone() for k, v in models[n].state_dict().items()} for n in ("llama", "deepseek")}
        return start, trained, torch.get_rng_state()

    start, trained, rng = reference_memo("17.compare_reference", data, compute=compute)
    torch.set_rng_state(rng)
    return start, trained


def _compare_lr(s: int) -> float:
    """A schedule that is not constant: a learner who uses lr_fn(0) throughout never moves the weights."""
    return (0.0, 2e-3, 5e-4)[s]


COMPARE_SLEEP = 0.05  # seconds each training forward of "gpt" sleeps in the probe: a floor under its measured step time


def _compare_probe(data, names=("gpt", "llama", "deepseek"), steps=3):
    """``compare_models`` on :func:`_compare_init_models` (handed over in eval mode), recording per model the batches of
    its gradient-enabled forwards, the mode of every forward, the gradient norm at every optimizer step, and when its
    first no-grad (validation) forward began; "gpt"'s training forwards sleep :data:`COMPARE_SLEEP` s."""
    import time

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def probe(impl):
        models = {n: m.eval() for n, m in _compare_init_models(names).items() if n in names}
        seen, modes, val_start = {}, {}, {}
        for name, m in models.items():
            def fwd(idx, *a, _orig=m.forward, _m=m, _name=name, **k):
                grad = torch.is_grad_enabled()
                modes.setdefault(_name, []).append(("train" if grad else "val", bool(_m.training)))
                if grad:
                    seen.setdefault(_name, []).append(idx.clone())
                    if _name == "gpt":
                        time.sleep(COMPARE_SLEEP)
                else:
                    val_start.setdefault(_name, time.perf_counter())
                return _orig(idx, *a, **k)
            m.forward = fwd
        owner = {id(p): n for n, m in models.items() for p in m.parameters()}
        norms = {}

        def pre_step(opt, args, kwargs):
            ps = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            if ps:
                norms.setdefault(owner.get(id(ps[0]), "?"), []).append(
                    math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in ps)))
        handle = register_optimizer_step_pre_hook(pre_step)
        t0 = time.perf_counter()
        try:
            rows = impl.compare_models(models, data[:2500], data[2500:], steps, 4, 16, _compare_lr, 5)
        finally:
            handle.remove()
        states = {n: {k: v.detach().clone() for k, v in unwrap(models[n]).state_dict().items()}
                  for n in ("llama", "deepseek") if n in models}
        return {"rows": [dict(r) for r in rows], "seen": seen, "states": states, "modes": modes, "norms": norms,
                "span": {n: v - t0 for n, v in val_start.items()}}
    return probe


def _check_timing(t, got, steps):
    """"gpt"'s ms_per_step lies between the sleep each of its steps contains and the time before its validation."""
    row = next((r for r in got["rows"] if r.get("name") == "gpt"), {})
    ms, span = row.get("ms_per_step"), got["span"].get("gpt")
    if not isinstance(ms, (int, float)) or span is None:
        return
    t.expect(ms >= 1000 * COMPARE_SLEEP * (1 - 1e-3),
             f"gpt: ms_per_step is {ms:.1f}, yet each of its {steps} training forwards slept {1000 * COMPARE_SLEEP:.0f} ms "
             "in this check: ms_per_step must be the mean wall time of one step (total over the steps ÷ steps)")
    t.expect(ms * steps / 1000 <= span * (1 + 1e-3) + 1e-3,
             f"gpt: ms_per_step · steps = {ms * steps / 1000:.3f} s, more than the {span:.3f} s that passed before its "
             "validation began: ms_per_step must be the mean wall time of one step (total over the steps ÷ steps)")


@torch.no_grad()
def _main_and_mtp_val(state: dict, val, batch_size: int, context_length: int, n: int = 10) -> tuple[float, float]:
    """(main-head validation loss, main + λ/D·MTP loss) of a course DeepSeekLM with ``state`` on the contract's
    batches: ``get_batch(val, B, T, Generator(10_000 + i))``, ``i < n``; computed here with torch's cross-entropy."""
    import torch.nn.functional as F

    from llmcourse.data.corpus import get_batch

    m = _course_model(seed=0)
    m.load_state_dict(state)
    m.eval()
    main = total = 0.0
    for i in range(n):
        x, y = get_batch(val, batch_size, context_length, _gen(10_000 + i))
        out = m(x, y)
        main += F.cross_entropy(out["logits"].reshape(-1, out["logits"].shape[-1]), y.reshape(-1)).item()
        total += float(out["loss"])
    return main / n, total / n


def _update_gap(got: dict, want: dict, start: dict) -> float:
    """‖W_learner − W_reference‖ / ‖W_reference − W_start‖ over every floating tensor: 0 for the same training."""
    num = den = 0.0
    for k, w in want.items():
        if w.is_floating_point() and k in got and tuple(got[k].shape) == tuple(w.shape):
            num += float((got[k].double() - w.double()).pow(2).sum())
            den += float((w.double() - start[k].double()).pow(2).sum())
        elif w.is_floating_point():
            return float("inf")
    return (num / max(den, 1e-30)) ** 0.5


@check(f"{U}.compare_models", ["compare_models"], _ref_compare)
def check_compare(t):
    from llmcourse.data.corpus import get_batch

    data = torch.randint(0, 65, (3000,), generator=_gen(STATE_SEED + 6))
    got = t.run(_compare_probe(data))
    rows = got["rows"]
    t.expect([r.get("name") for r in rows] == ["gpt", "llama", "deepseek"],
             f"one row per model, in input order, with its name; got {[r.get('name') for r in rows]}")
    for name in ("gpt", "llama", "deepseek"):
        m = got["modes"].get(name, [])
        t.expect(all(train for kind, train in m if kind == "train"), f"{name}: handed over in eval mode, it ran its "
                 "training steps in eval mode: call model.train() before training (dropout, routing records)")
        t.expect(all(not train for kind, train in m if kind == "val"), f"{name}: its validation forwards ran in "
                 "training mode: call model.eval() before validating (dropout would make val_loss noisy)")
        n = got["norms"].get(name, [])
        t.expect(len(n) == 3 and all(abs(v - 1.0) < 1e-3 for v in n),
                 f"{name}: the gradient norm at each optimizer step must be clipped to 1.0 (every step's raw norm is "
                 f"above 2 here); at optimizer.step() it was {[round(v, 4) for v in n]}")
    _check_timing(t, got, 3)
    want = [get_batch(data[:2500], 4, 16, _gen(5 + s))[0] for s in range(3)]
    for name in ("gpt", "llama", "deepseek"):
        batches = got["seen"].get(name, [])
        ok = len(batches) == 3 and all(torch.equal(b, w) for b, w in zip(batches, want))
        t.expect(ok, f"model {name!r} must train on exactly 3 batches, step s drawn with get_batch(train_data, 4, 16, "
                 f"torch.Generator().manual_seed(seed + s)); it saw {len(batches)} training batches"
                 + ("" if len(batches) != 3 else " that differ from those"), bug="B17.unequal_budget")
    # the schedule and the validation loss, against the reference trained here from the same start on the same batches
    start, trained = _compare_reference(data)
    for name in ("llama", "deepseek"):
        gap = _update_gap(got["states"][name], trained[name], start[name])
        if gap > 0.05:
            frozen = _update_gap(got["states"][name], start[name], start[name]) == 0.0
            mtp_keys = [k for k in start[name] if k.startswith("mtp.") or k.endswith("e_score_correction_bias")]
            if name == "deepseek" and not frozen and all(
                    torch.equal(got["states"][name].get(k, start[name][k]), start[name][k]) for k in mtp_keys):
                t.fail("deepseek: its MTP module and router biases never changed, so it trained as a plain model; a "
                       "DeepSeek model trains with your train_step (MTP loss, bias update). The check passes the "
                       "course's DeepSeekLM, not your class: recognise it by its update_router_biases method")
            t.fail(f"{name}: after 3 steps with lr_fn = (0, 2e-3, 5e-4) the weights differ from the reference "
                   f"training by {gap:.0%} of its update: step s must use lr_fn(s) (AdamW, unit 10's groups, "
                   "clipping at 1.0)" + ("; the weights never moved (a constant lr_fn(0)?)" if frozen else ""),
                   bug="B17.constant_lr" if frozen else None)
    row = next((r for r in rows if r.get("name") == "deepseek"), {})
    main, with_mtp = _main_and_mtp_val(got["states"]["deepseek"], data[2500:], 4, 16)
    v = row.get("val_loss")
    if not (isinstance(v, (int, float)) and abs(v - main) < 1e-4):
        t.fail(f"deepseek: val_loss must be the main head's mean cross-entropy over the 10 validation batches of its "
               f"trained weights, {main:.5f}; got {v!r}" + (" (the main + MTP training loss)" if isinstance(
                   v, (int, float)) and abs(v - with_mtp) < 1e-4 else ""),
               bug="B17.val_with_mtp" if isinstance(v, (int, float)) and abs(v - with_mtp) < 1e-4 else None)

    expected = {"gpt": (809_856, 809_856, 1024), "llama": (795_904, 795_904, 512), "deepseek": (TOTAL, ACTIVE, 320)}
    for r in rows:
        tot, act, cache = expected[r["name"]]
        if r["name"] == "deepseek" and r.get("active_params") == r.get("total_params"):
            t.fail(f"deepseek: active_params equals total_params ({r.get('total_params')!r}); one token's forward pass "
                   "does not run every routed expert: expected 872,960", bug="B17.active_counts_total")
        t.expect(r.get("total_params") == tot and r.get("active_params") == act,
                 f"{r['name']}: total/active parameters must be {tot:,}/{act:,} (main path, tied head once, MTP "
                 f"excluded; active: what one token's forward pass uses); got "
                 f"{r.get('total_params')!r}/{r.get('active_params')!r}", bug="B17.active_counts_total")
        t.expect(r.get("cache_elems_per_token") == cache, f"{r['name']}: cache elements per token must be {cache}; got "
                 f"{r.get('cache_elems_per_token')!r}")
        t.expect(all(isinstance(r.get(k), int) and not isinstance(r.get(k), bool)
                     for k in ("total_params", "active_params", "cache_elems_per_token")),
                 f"{r['name']}: total_params, active_params and cache_elems_per_token are counts: Python ints; got "
                 f"{[type(r.get(k)).__name__ for k in ('total_params', 'active_params', 'cache_elems_per_token')]}")
        v, ms = r.get("val_loss"), r.get("ms_per_step")
        t.expect(isinstance(v, (int, float)) and math.isfinite(v) and 0 < v < 10,
                 f"{r['name']}: val_loss must be a finite positive float (nats); got {v!r}")
        t.expect(isinstance(ms, (int, float)) and ms > 0, f"{r['name']}: ms_per_step must be positive; got {ms!r}")
    # one step: the mean over the steps, not over a fixed count
    _check_timing(t, t.run(_compare_probe(data, names=("gpt",), steps=1)), 1)


# ================================================================== 17.fp8_inference


@functools.lru_cache(maxsize=1)
def _asset_info():
    from llmcourse.train.deepseek_char import deepseek_char_tiny_path

    p = deepseek_char_tiny_path()
    if not p.exists():
        return None
    ckpt = torch.load(p, map_location="cpu", weights_only=True)
    return {"fp8_check": ckpt.get("fp8_check"), "sums": {k: float(v.float().abs().sum()) for k, v in ckpt["model"].items()}}


FP8_BATCHES = 1


@functools.lru_cache(maxsize=1)
def _shakespeare_val() -> torch.Tensor:
    """tinyshakespeare's validation characters (``char_corpus("tinyshakespeare").val``), read once per checker
    process and sent with the probe: a fresh worker would spend ≈ 0.7 s tokenizing the corpus for every check."""
    from llmcourse.data.corpus import char_corpus

    return char_corpus("tinyshakespeare").val


@functools.lru_cache(maxsize=1)
def _asset_reference() -> tuple:
    """The reference conversion's ``(val_loss_fp32, delta)`` on the trained asset (:data:`FP8_BATCHES` batch of
    tinyshakespeare's validation text, seed 10,000), computed once per checker process (the stored calibration,
    ``fp8_check``, is the same computation on 3 batches; ``tests/test_unit17_asset.py`` reproduces it)."""
    from llmcourse.models.deepseek import fp8_eval as reference_fp8
    from llmcourse.train.deepseek_char import load_deepseek_char_tiny

    model, _ = load_deepseek_char_tiny(retrain=False, verbose=False)
    ref = reference_fp8(model, _shakespeare_val().clone(), FP8_BATCHES, 10_000)
    return float(ref["val_loss_fp32"]), float(ref["delta"])


@functools.lru_cache(maxsize=1)
def _fp8_case():
    """Seeded main-path weights of DeepSeek-tiny at :data:`SMALL` widths whose block linear maps have heavy tails
    (``× exp(1.5·N(0, 1))``): converting one layer fewer or more moves the FP8 loss by up to ≈ 2e-3 nats, and every
    converted layer is told apart by its block scales; random validation tokens. (Small widths: each FP8 forward
    costs a fifth of the full-width one.)"""
    state = course_state(seed=1777, std=0.08, **SMALL)
    g = _gen(5)
    for k in sorted(state):
        if k.startswith("layers.") and k.endswith("proj.weight"):
            state[k] = state[k] * torch.exp(1.5 * torch.randn(state[k].shape, generator=g))
    return state, torch.randint(0, 65, (4000,), generator=_gen(9))


def _fp8_case_model(train: bool = False):
    state, _ = _fp8_case()
    return _course_model(state, seed=0, **SMALL).train(train)


@functools.lru_cache(maxsize=1)
def _fp8_case_reference() -> torch.Tensor:
    """The reference conversion's (val_loss_fp32, val_loss_fp8) on :func:`_fp8_case` (2 batches, seed 10,000), float64;
    computed once per process (a warm check server or a grading checker answers many checks)."""
    from llmcourse.models.deepseek import fp8_eval as reference_fp8

    _, val = _fp8_case()
    ref = reference_fp8(_fp8_case_model(), val, 2, 10_000)
    return torch.tensor([ref["val_loss_fp32"], ref["val_loss_fp8"]], dtype=torch.float64)


@functools.lru_cache(maxsize=1)
def _fp8_fingerprints_cached() -> tuple:
    """``{name: (weight shape, sum of its 128×128 block scales)}`` of every nn.Linear of the :func:`_fp8_case` model
    (the scales of unit 16's ``quantize_weight_blocks``: amax/448 per block; distinct for seeded weights)."""
    from llmcourse.quant.fp8 import quantize_weight_blocks

    out = {}
    for name, mod in _fp8_case_model().named_modules():
        if type(mod) is torch.nn.Linear:
            _, sc = quantize_weight_blocks(mod.weight.detach())
            out[name] = (list(mod.weight.shape), float(sc.double().sum()))
    return tuple(out.items())


def _fp8_fingerprints() -> dict:
    return dict(_fp8_fingerprints_cached())


def _name_summary(names) -> str:
    """A few module names and how many more."""
    names = list(names)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


@check(f"{U}.fp8_inference", ["fp8_eval"], _ref_fp8)
def check_fp8(t):
    info = _asset_info()
    if info is None or info["fp8_check"] is None:
        t.fail("assets/deepseek_char_tiny.pt (with its FP8 calibration) is missing; re-create it with "
               "`python -m llmcourse.train.deepseek_char`")

    val = _shakespeare_val()

    def probe(impl):
        from llmcourse.train.deepseek_char import load_deepseek_char_tiny

        model, _ = load_deepseek_char_tiny(retrain=False, verbose=False)
        res = impl.fp8_eval(model, val.clone(), FP8_BATCHES, 10_000)
        return {"res": {k: float(v) for k, v in dict(res).items()},
                "sums": {k: float(v.float().abs().sum()) for k, v in model.state_dict().items()},
                "types": sorted({type(m).__name__ for m in model.modules()})}
    got = t.run(probe)
    res = got["res"]
    cal_fp32, cal_delta = _asset_reference()
    t.expect(set(res) >= {"val_loss_fp32", "val_loss_fp8", "delta"},
             f"fp8_eval must return val_loss_fp32, val_loss_fp8 and delta; got {sorted(res)}")
    t.expect(abs(res["delta"] - (res["val_loss_fp8"] - res["val_loss_fp32"])) < 1e-6,
             "delta must be val_loss_fp8 − val_loss_fp32")
    t.expect(abs(res["val_loss_fp32"] - cal_fp32) < 1e-4,
             f"val_loss_fp32 of the course's trained DeepSeek on one validation batch "
             f"(get_batch(val_data, 32, 64, Generator(seed + i))) must be {cal_fp32:.5f}; got "
             f"{res['val_loss_fp32']:.5f}")
    t.expect(res["delta"] != 0.0, "val_loss_fp8 equals val_loss_fp32 exactly: the copy was not converted to FP8")
    t.expect(res["delta"] <= cal_delta + 0.02, f"the FP8 copy loses {res['delta']:+.4f} nats; the reference "
             f"conversion (main-path linear maps only; routers, head, embeddings and MTP in float32) loses "
             f"{cal_delta:+.4f}")
    t.expect("FP8Linear" not in got["types"], "the original model now contains FP8Linear modules: convert a deep copy")

    # which modules are converted: a seeded model with heavy-tailed weights, where every layer's FP8 error shows in
    # the loss, against the reference conversion computed here on the same weights and batches (two-sided); every
    # FP8Linear built during that call is recorded by its weight scales, matched here to the linear map of the
    # original model it came from; the eval-mode model stays in eval mode
    state, heavy_val = _fp8_case()

    def probe_heavy(impl):
        from llmcourse.quant import fp8 as q

        made, init = [], q.FP8Linear.__init__

        def spy(self, *a, **k):
            init(self, *a, **k)
            made.append(self)
        q.FP8Linear.__init__ = spy
        try:
            m = _course_model(state, seed=0, **SMALL).eval()
            res = impl.fp8_eval(m, heavy_val.clone(), 2, 10_000)
        finally:
            q.FP8Linear.__init__ = init
        return {"losses": [float(res["val_loss_fp32"]), float(res["val_loss_fp8"])],
                "made": [[list(f.weight_fp8.shape), float(f.weight_scale.double().sum())] for f in made],
                "training": bool(m.training)}

    heavy = t.run(probe_heavy)
    prints = _fp8_fingerprints()
    names = set()
    for shape, total in heavy["made"]:
        hit = [n for n, (sh, tot) in prints.items() if sh == shape and abs(tot - total) <= 1e-9 * max(1.0, abs(tot))]
        names.update(hit[:1] if hit else ["(a layer that is not a linear map of the model)"])
    want = {n for n in prints if n.startswith("layers.")}
    missing, extra = sorted(want - names), sorted(names - want)
    t.expect(not missing and not extra,
             f"the FP8 copy must convert the main path's linear maps, every block's attention and feed-forward "
             f"(experts and shared experts included): {len(want)} layers. Yours converted {len(names & want)} of "
             f"them" + (f"; not converted: {_name_summary(missing)}" if missing else "")
             + (f"; converted but outside the stated set: {_name_summary(extra)}" if extra else ""),
             bug="B17.fp8_partial")

    _compare_result(t, probe_heavy, heavy, _fp8_case_reference().clone(),
                    "val_loss_fp32 and val_loss_fp8 of a seeded small DeepSeek (d_model 32) with heavy-tailed weights "
                    "(2 batches, seed 10,000): every main-path linear layer of every block converted, routers, head, embeddings "
                    "and MTP kept in float32", atol=2e-4, rtol=0,
                    pick=lambda r: torch.tensor(r["losses"], dtype=torch.float64))
    diff = [k for k, v in info["sums"].items() if abs(got["sums"].get(k, float("nan")) - v) > 1e-3 * max(1.0, v)]
    t.expect(not diff, f"fp8_eval changed the original model's weights ({diff[:4]}): convert a deep copy")

    # the model is left as it was found: its mode, also right after a training forward (routing kept with its graph)
    def modes(impl):
        m = _course_model(state, seed=0, **SMALL).train(True)
        xb = heavy_val[:65].view(1, 65)
        m(xb[:, :-1], xb[:, 1:])
        before = [None if mo.last_indices is None else mo.last_indices.clone() for mo in m.moe_layers()]
        impl.fp8_eval(m, heavy_val[:2000].clone(), 1, 10_000)
        kept = all(mo.last_indices is None or (b is not None and torch.equal(mo.last_indices, b))
                   for mo, b in zip(m.moe_layers(), before))
        return {"modes": [bool(m.training)], "kept": kept}
    got = t.run(modes)
    t.expect(got["modes"] + [heavy["training"]] == [True, False], "fp8_eval must leave the model in the mode it found "
             "it in (a model that has just run a training forward stays in train mode; an eval-mode model stays in "
             "eval mode)")
    t.expect(got["kept"], "given a model in training mode, fp8_eval left the validation batches' routing in its MoE "
             "layers (the next update_router_biases would apply it): the losses are measured in eval mode, and the "
             "model is left as it was found")


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# DeepSeekLM: load_hf_deepseek's key mapping
also_blocked(f"{U}.DeepSeekLM", "llmcourse.models.deepseek:deepseek_state_dict_from_hf")
# generate_latent_cached: the benchmark's cached greedy loop
also_blocked(f"{U}.generate_latent_cached", "coursetools.bench.capstone:_greedy_with_cache")
also_blocked(f"{U}.compare_models", "llmcourse.models.deepseek:_val_loss")
# fp8_inference: the validation loss of compare_models and fp8_eval
also_blocked(f"{U}.fp8_inference", "llmcourse.models.deepseek:_val_loss")


# ================================================================== declared strength (grader/strength.py)
from ..strength import decision, defining_property  # noqa: E402

defining_property(f"{U}.DeepSeekLM", "the assembled DeepSeek: MLA blocks, dense then MoE, a tied head and an MTP depth "
                  "whose logits and loss are those of the module on (h_prev, emb) scored against targets[:, k:]",
                  probe="logits against transformers' DeepseekV3ForCausalLM (stored); mtp_logits and loss_mtp by value "
                        "with every weight given, both h0 conventions; loss_mtp re-derived from the returned logits; "
                        "leak probes; the bias rule")
defining_property(f"{U}.generate_latent_cached", "greedy decoding with a latent cache: one prefill call, then one call "
                  "per token, the main head only",
                  probe="tokens against uncached greedy decoding on the course's model; the sequence lengths the first "
                        "layer saw; the cache's shapes and bytes; the mode restored")
defining_property(f"{U}.train_step", "one step on main + MTP loss with the gradient clipped before the optimizer, then "
                  "the router biases moved by the step's loads",
                  probe="with SGD (lr 1) the step re-derived here as minus the clipped gradient of the full loss; bias "
                        "changes against the returned loads")
defining_property(f"{U}.compare_models", "models compared on identical batches and schedules, by the loss they are "
                  "judged on and the parameters a token actually uses",
                  probe="the batches each model trained on (recorded), weights after training against the reference "
                        "run here, val_loss re-derived from the trained weights, counts against closed forms")
defining_property(f"{U}.fp8_inference", "an FP8 copy converts exactly the main path's linear maps (attention and every "
                  "expert); routers, head, embeddings and MTP stay float32; the model itself is unchanged",
                  probe="every FP8Linear built during the call recorded and matched to the original model's linear maps "
                        "by their block scales; the losses against the reference conversion; the model's weights after")

decision(f"{U}.generate_latent_cached", "whether the MTP module takes part in plain cached generation (it does not)",
         forms=[r"MTP (module )?(has|plays|takes) no (part|role)", r"(do not|don't|never) (use|call) the MTP",
                r"main (path|head) only"],
         wrong=("B17.mtp_in_generation",))
decision(f"{U}.compare_models", "which of an MoE layer's parameters count as active: the router, the shared expert and "
         "k of the E routed experts",
         forms=[r"shared (expert|experts)?\s*\+\s*k\b", r"k of the E routed", r"\(\s*n_routed_experts\s*-\s*(top_k|"
                r"num_experts_per_tok)\s*\)", r"router, the shared expert and k"],
         wrong=("B17.active_counts_total",))
decision(f"{U}.compare_models", "what val_loss means for a model with an MTP head: the main head's loss only",
         forms=[r"val_loss[^.]{0,60}main(-| )head", r"main(-| )head (validation )?(loss|cross-entropy)"],
         wrong=("B17.val_with_mtp",))
decision(f"{U}.fp8_inference", "which layers the FP8 copy converts: every main-path linear map, not the routers, head, "
         "embeddings or MTP modules",
         forms=[r"routers?, (the )?head, (the )?embeddings?", r"main-path linear (layers|maps)",
                r"routers?[^.]{0,40}(stay|kept|remain)[^.]{0,20}float32"],
         wrong=("B17.fp8_partial",))
