"""Checks of unit 08 (GPT-2).

Oracle: ``transformers.GPT2LMHeadModel`` on the syllabus's two tiny configs (F08.4, eager attention,
eval mode), with **every** tensor re-drawn from N(0, 0.2) (LayerNorm weights 1 + N(0, 0.2)) so that
each layout mistake moves the logits far beyond ``atol 1e-5``. Its logits are computed here, in the
checker. ``08.GPT2Model`` receives weights already mapped by the **reference** loader, so it is graded
independently of ``08.load_hf_gpt2``; ``08.load_hf_gpt2`` loads into the **reference** model, and its
result is judged by running the returned ``state_dict`` through a reference model here. Fixtures:
the F08.1 parameter counts (literal values). Properties: causality, tying (re-derived from returned
tensors: an in-place change of the token embedding must show in the head), ``init_weights``
statistics, ``ValueError`` contracts.

Contract clauses and the probes that cover them (what is not listed is not graded):

``08.GPT2Config``
  * default fields = GPT-2 small: ``GPT2Config()`` fields; every field kept when given (all nine at non-defaults)
  * ``preset(name)`` for the five names; returns a ``GPT2Config``; a new object per call; unknown name -> KeyError
``08.GPT2Model``
  * state_dict keys and shapes (incl. Q/K/V biases); weights are parameters, not buffers: ``module_facts``
  * tied head = the token embedding's Parameter (in-place change followed); untied head its own (V, D): ``_tying``
  * unique parameter count = the formula (tied and untied)
  * logits = ``GPT2LMHeadModel`` on two configs (weights mapped here); float32
  * every config field used: ``qkv_bias=False``, ``layer_norm_eps=0.5``, ``tie_weights=False`` vs the reference
  * causal (later tokens leave earlier logits unchanged); T = C works; T > C -> ValueError
  * ``init_weights``: N(0, 0.02²), residual projections 0.02/√(2L), biases 0, norms 1/0; called by ``__init__``
    (a fresh model has these statistics)
  * backpropagation: a random projection of the logits reaches every parameter (``grader.gradcheck``)
  * train mode (by properties, p = 0.25): each sublayer's output dropped before the residual add, survivors
    × 1/(1−p), zero fraction ≈ p; the attention built with cfg.dropout; embeddings dropped (input of blocks[0])
  * side effects: a forward in eval mode and in train mode leaves every parameter and buffer unchanged
``08.gpt2_param_count``
  * formula for every preset with tied/untied head and with/without Q/K/V biases
  * ``count_parameters``: a shared tensor once, plain modules, models on the meta device
``08.load_hf_gpt2``
  * loaded logits = ``GPT2LMHeadModel`` (two configs, every tensor random); in place, same model returned,
    head still tied; old ``.attn.bias``/``.attn.masked_bias`` buffers ignored; shape mismatch -> ValueError (another
    config, a truncated c_fc, a c_attn with extra columns)
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from ..core import check, forbid, module_facts, run_learner, unwrap
from ..gradcheck import check_module_gradients, module_gradient_probe
from ..oracles import float32_atol, stored_oracle, write_oracle
from ..runner import also_blocked
from ..strength import decision, defining_property

U = "08"

CONFIG_FIELDS = ("vocab_size", "context_length", "d_model", "n_heads", "n_layers", "dropout", "qkv_bias",
                 "layer_norm_eps", "tie_weights")
DEFAULTS = {"vocab_size": 50257, "context_length": 1024, "d_model": 768, "n_heads": 12, "n_layers": 12,
            "dropout": 0.1, "qkv_bias": True, "layer_norm_eps": 1e-5, "tie_weights": True}
PRESETS = {
    "gpt2-small": {"n_layers": 12, "d_model": 768, "n_heads": 12},
    "gpt2-medium": {"n_layers": 24, "d_model": 1024, "n_heads": 16},
    "gpt2-large": {"n_layers": 36, "d_model": 1280, "n_heads": 20},
    "gpt2-xl": {"n_layers": 48, "d_model": 1600, "n_heads": 25},
    "gpt2-char-tiny": {"vocab_size": 65, "context_length": 64, "d_model": 128, "n_heads": 4, "n_layers": 4,
                       "dropout": 0.0},
}
# F08.1: (preset, tie_weights, qkv_bias) -> parameters
F081 = {
    ("gpt2-small", True, True): 124_439_808, ("gpt2-small", False, True): 163_037_184,
    ("gpt2-small", True, False): 124_412_160, ("gpt2-small", False, False): 163_009_536,
    ("gpt2-medium", True, True): 354_823_168, ("gpt2-large", True, True): 774_030_080,
    ("gpt2-xl", True, True): 1_557_611_200,
    ("gpt2-char-tiny", True, True): 809_856, ("gpt2-char-tiny", False, True): 818_176,
}
# F08.4: (n_embd, n_head, n_layer), vocab 1000, 128 positions, no dropout
F084 = [(64, 4, 2), (48, 3, 3)]
HF_SEEDS = (11, 12)


def _ref():
    from llmcourse.models import gpt2 as G

    # GPT2Block and gpt2_param_breakdown are listed so that the worker blocks them too (they hold answers)
    return {"GPT2Config": G.GPT2Config, "GPT2Model": G.GPT2Model, "GPT2Block": G.GPT2Block,
            "gpt2_param_count": G.gpt2_param_count, "gpt2_param_breakdown": G.gpt2_param_breakdown,
            "count_parameters": G.count_parameters, "load_hf_gpt2": G.load_hf_gpt2}


def _cfg(**fields):
    from llmcourse.models.gpt2 import GPT2Config

    return GPT2Config(**fields)


def _parity_cfg(d, h, n, **extra):
    return _cfg(vocab_size=1000, context_length=128, d_model=d, n_heads=h, n_layers=n, dropout=0.0, **extra)


def _idx():
    return torch.randint(0, 1000, (2, 17), generator=torch.Generator().manual_seed(0))


ORACLE_ASSET = "oracles/u08_hf_gpt2.pt"  # under assets/: HF state dicts and GPT2LMHeadModel logits (F08.4)


def build_hf_oracle() -> dict:
    """The transformers oracle of this unit, computed with ``GPT2LMHeadModel`` (needs transformers).

    ``{"cases": [{"d_model", "n_heads", "n_layers", "seed", "hf_state_dict", "logits"}, ...]}``.
    Stored as ``assets/oracles/u08_hf_gpt2.pt`` so ``course check`` need not import transformers
    (seconds); ``tests/test_unit08_gpt2_model.py`` rebuilds it and requires equality with the file.
    Write it with ``python -c "from grader.checks.u08_gpt2_model import write_hf_oracle; write_hf_oracle()"``.
    """
    from llmcourse.models.gpt2 import random_hf_gpt2

    cases = []
    for (d, h, n), seed in zip(F084, HF_SEEDS):
        hf = random_hf_gpt2(_parity_cfg(d, h, n), seed=seed, std=0.2)
        with torch.no_grad():
            logits = hf(_idx()).logits.clone()
        sd = {k: v.clone() for k, v in hf.state_dict().items()}
        if "lm_head.weight" in sd:  # tied in the model: stored once
            sd["lm_head.weight"] = sd["transformer.wte.weight"]
        cases.append({"d_model": d, "n_heads": h, "n_layers": n, "seed": seed, "logits": logits, "hf_state_dict": sd})
    return {"cases": cases}


def write_hf_oracle() -> None:
    write_oracle(ORACLE_ASSET, build_hf_oracle)


oracle = stored_oracle(ORACLE_ASSET, build_hf_oracle)


@functools.lru_cache(maxsize=1)
def _hf_cases() -> tuple:
    """Per F08.4 config: (course config, HF state dict, course state dict (reference loader), HF logits)."""
    from llmcourse.models.gpt2 import GPT2Model, load_hf_gpt2

    cases = []
    for case in oracle()["cases"]:
        cfg = _parity_cfg(case["d_model"], case["n_heads"], case["n_layers"])
        hf_sd = case["hf_state_dict"]
        course = load_hf_gpt2(GPT2Model(cfg).eval(), {k: v.clone() for k, v in hf_sd.items()})
        course_sd = {k: v.clone() for k, v in course.state_dict().items()}
        cases.append((cfg, hf_sd, course_sd, case["logits"]))
    return tuple(cases)


def gpt2_reduction(cfg, t: int) -> int:
    """The summed reduction length of a GPT-2 forward pass of ``t`` tokens (``grader.oracles.float32_atol``): per
    block the two LayerNorms' statistics (2·D each), q/k/v (D), scores (D/H), softmax and weighted sum (T each), the
    output projection (D), fc1 (D) and fc2 (4·D); then the final norm (2·D) and the head (D)."""
    d = cfg.d_model
    block = 2 * d + d + d // cfg.n_heads + t + t + d + 2 * d + d + 4 * d
    return cfg.n_layers * block + 3 * d


def logits_atol(cfg, logits: torch.Tensor) -> float:
    """The tolerance of a comparison of logits ``(B, T, V)`` with another implementation's: float32 rounding at
    their scale (measured: 4 ulps at the scale between transformers' GPT-2 and the course's, any kernels)."""
    return float32_atol(logits, gpt2_reduction(cfg, logits.shape[-2]))


def _describe(cfg) -> str:
    return f"d_model={cfg.d_model}, n_heads={cfg.n_heads}, n_layers={cfg.n_layers}"


# ================================================================== 08.GPT2Config


def _fields(c) -> dict:
    return {f: getattr(c, f, "<missing>") for f in CONFIG_FIELDS}


def _preset(impl, name):
    """``impl.GPT2Config.preset(name)``; the learner's classmethod runs under the grader's guard."""
    cls = impl.GPT2Config
    real = getattr(cls, "__wrapped__", cls)
    preset = getattr(real, "preset", None)
    if preset is None:
        from ..core import CheckFailure

        raise CheckFailure("GPT2Config has no classmethod `preset`")
    return run_learner(preset, "GPT2Config.preset", (name,), {})


@check(f"{U}.GPT2Config", ["GPT2Config"], _ref)
def check_gpt2_config(t):
    t.compare(lambda impl: _fields(impl.GPT2Config()), DEFAULTS,
              "GPT2Config() fields (the defaults are GPT-2 small's)")
    for name, fields in PRESETS.items():
        expected = {**DEFAULTS, **fields}
        got = t.run(lambda impl, name=name: _fields(_preset(impl, name)))
        t.expect(got == expected, f"GPT2Config.preset({name!r}) must have the fields {expected}; got {got}")
    kind = t.run(lambda impl: [type(_preset(impl, "gpt2-small")).__name__, type(unwrap(impl.GPT2Config())).__name__])
    t.expect(kind[0] == kind[1], f"GPT2Config.preset must return a GPT2Config instance, got a {kind[0]}")
    custom = {"vocab_size": 10, "context_length": 8, "d_model": 16, "n_heads": 2, "n_layers": 1, "dropout": 0.0,
              "qkv_bias": False, "layer_norm_eps": 1e-6, "tie_weights": False}
    t.compare(lambda impl: _fields(impl.GPT2Config(**custom)), custom,
              "GPT2Config(**fields) must keep every field it is given")

    def fresh(impl):
        a = _preset(impl, "gpt2-char-tiny")
        a.n_layers = 99
        return _preset(impl, "gpt2-char-tiny").n_layers

    t.expect(t.run(fresh) == 4, "GPT2Config.preset must return a new object each time (changing one preset "
             "changed the next call's result)")
    err = t.raised(lambda impl: _preset(impl, "gpt-5"))
    t.expect(err == "KeyError", f"GPT2Config.preset('gpt-5') must raise KeyError (unknown name); got {err}")


# ================================================================== 08.GPT2Model

STRUCT_CFG = dict(vocab_size=50, context_length=16, d_model=32, n_heads=4, n_layers=2, dropout=0.0)


def _tying(model) -> dict:
    """Head and embedding before and after an in-place change of the embedding (plain tensors)."""
    m = unwrap(model)
    before = (m.lm_head.weight.detach().clone(), m.tok_emb.weight.detach().clone())
    with torch.no_grad():
        m.tok_emb.weight.add_(1.0)
    return {"head0": before[0], "emb0": before[1], "head1": m.lm_head.weight.detach().clone(),
            "emb1": m.tok_emb.weight.detach().clone()}


def _loaded_logits(impl, cfg, state, idx):
    """Build the implementation's model, load ``state`` (course keys, no lm_head) and run ``idx``."""
    m = impl.GPT2Model(cfg)
    unwrap(m).eval()
    result = unwrap(m).load_state_dict(state, strict=False)
    with torch.no_grad():
        return {"missing": sorted(result.missing_keys), "unexpected": sorted(result.unexpected_keys),
                "logits": m(idx)}


@check(f"{U}.GPT2Model", ["GPT2Model", "GPT2Block"], _ref)
def check_gpt2_model(t):
    ref = _ref()
    cfg = _cfg(**STRUCT_CFG)
    torch.manual_seed(0)
    want = {k: tuple(v.shape) for k, v in ref["GPT2Model"](cfg).state_dict().items()}
    facts = t.run(lambda impl: module_facts(impl.GPT2Model(cfg)))
    t.expect(facts.get("is_module"), f"GPT2Model must be an nn.Module subclass, got {facts.get('type')}")
    got = facts["state_dict"]
    if "blocks.0.attn.W_query.weight" in got and "blocks.0.attn.W_query.bias" not in got:
        t.fail("blocks.{i}.attn.W_query/W_key/W_value need biases (qkv_bias=True in the config)", bug="B08.no_qkv_bias")
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    t.expect(not missing and not extra, f"state_dict keys of GPT2Model({_describe(cfg)}, V=50, C=16): missing "
             f"{missing[:6]}, unexpected {extra[:6]}")
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    t.expect(not wrong, f"state_dict shapes (got, expected): {dict(list(wrong.items())[:4])}")
    t.expect(not facts["buffers"] or all(not n.endswith("weight") for n in facts["buffers"]),
             f"weights must be parameters, not buffers: {list(facts['buffers'])}")
    # tying: the head must be the token embedding's Parameter (re-derived from returned tensors)
    tie = t.run(lambda impl: _tying(impl.GPT2Model(cfg)))
    if not torch.equal(tie["head0"], tie["emb0"]):
        t.fail("lm_head.weight must be the same Parameter as tok_emb.weight (tie_weights=True); after "
               "construction their values already differ", bug="B08.untied_head")
    t.expect(torch.equal(tie["emb1"], tie["emb0"] + 1.0), "tok_emb.weight must be a trainable Parameter "
             "(changing it in place did not change it)")
    if not torch.equal(tie["head1"], tie["emb1"]):
        t.fail("lm_head.weight must be the same Parameter as tok_emb.weight: after changing tok_emb.weight in place "
               "the head kept its old values", bug="B08.tied_by_copy")
    # count unique parameters here, from the returned names and shapes
    n_params = sum(math.prod(got[n]) for n in facts["parameters"] if n in got)
    expected_count = ref["gpt2_param_count"](cfg)
    t.expect(n_params == expected_count, f"GPT2Model({_describe(cfg)}, V=50, C=16) has {n_params:,} unique parameters; "
             f"the formula gives {expected_count:,} (is the head tied, and is anything counted twice?)")

    untied = _cfg(**{**STRUCT_CFG, "tie_weights": False})
    tie_u = t.run(lambda impl: _tying(impl.GPT2Model(untied)))
    t.expect(torch.equal(tie_u["head1"], tie_u["head0"]), "with tie_weights=False the head must be its own "
             "Parameter (changing tok_emb.weight changed lm_head.weight)")
    facts_u = t.run(lambda impl: module_facts(impl.GPT2Model(untied)))
    n_u = sum(math.prod(facts_u["state_dict"][n]) for n in facts_u["parameters"])
    t.expect(n_u == ref["gpt2_param_count"](untied), f"with tie_weights=False the model must have "
             f"{ref['gpt2_param_count'](untied):,} parameters (a separate (V, D) head without bias); got {n_u:,}")

    # every config field at a non-default value: no Q/K/V biases, a large LayerNorm eps, an untied head
    odd = _cfg(**{**STRUCT_CFG, "qkv_bias": False, "layer_norm_eps": 0.5, "tie_weights": False})
    torch.manual_seed(9)
    odd_ref = ref["GPT2Model"](odd).eval()
    with torch.no_grad():
        for prm in odd_ref.parameters():
            prm.add_(0.3 * torch.randn(prm.shape))
    odd_state = {k: v.detach().clone() for k, v in odd_ref.state_dict().items()}
    odd_idx = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        odd_want = odd_ref(odd_idx)

    def odd_probe(impl):
        m = impl.GPT2Model(odd)
        unwrap(m).load_state_dict(odd_state)
        unwrap(m).eval()
        with torch.no_grad():
            return m(odd_idx)

    t.compare(odd_probe, odd_want, "logits of GPT2Model(qkv_bias=False, layer_norm_eps=0.5, tie_weights=False) with "
              "random weights (every config field must be used)", atol=logits_atol(odd, odd_want), rtol=1e-5)

    # parity with transformers (weights mapped by the reference loader; lm_head follows tok_emb)
    for cfg_p, _hf_sd, course_sd, hf_logits in _hf_cases():
        state = {k: v for k, v in course_sd.items() if k != "lm_head.weight"}
        idx = _idx()
        probe = functools.partial(_loaded_logits, cfg=cfg_p, state=state, idx=idx)
        out = t.run(probe)
        t.expect(not out["unexpected"] and set(out["missing"]) <= {"lm_head.weight"},
                 f"loading GPT-2 weights into your model: missing keys {out['missing'][:6]}, unexpected "
                 f"{out['unexpected'][:6]}")
        t.compare(probe, hf_logits, f"logits vs transformers' GPT2LMHeadModel with the same weights ({_describe(cfg_p)}, "
                  f"idx (2, 17), eval mode)", atol=logits_atol(cfg_p, hf_logits), rtol=1e-5,
                  pick=lambda o: o["logits"])
    t.expect(out["logits"].dtype == torch.float32, f"logits must be float32, got {out['logits'].dtype}")

    # causality: changing tokens t0.. must leave the logits before t0 unchanged
    tiny = _cfg(**PRESETS["gpt2-char-tiny"])
    g = torch.Generator().manual_seed(5)
    a = torch.randint(0, 65, (2, 24), generator=g)
    b = a.clone()
    b[:, 10:] = torch.randint(0, 65, (2, 14), generator=g)

    def causal_probe(impl):
        torch.manual_seed(1)
        m = impl.GPT2Model(tiny)
        unwrap(m).eval()
        with torch.no_grad():
            return m(a), m(b)

    la, lb = t.run(causal_probe)
    t.expect(tuple(la.shape) == (2, 24, 65), f"logits must have shape (B, T, V) = (2, 24, 65), got {tuple(la.shape)}")
    t.expect(bool(torch.allclose(la[:, :10], lb[:, :10], atol=1e-6)),
             "changing the tokens at positions ≥ 10 changed the logits at positions < 10: the model looks ahead")
    full = t.run(lambda impl: tuple(impl.GPT2Model(tiny)(torch.zeros(1, 64, dtype=torch.long)).shape))
    t.expect(full == (1, 64, 65), f"a sequence of exactly context_length=64 tokens must work; got shape {full}")
    err = t.raised(lambda impl: impl.GPT2Model(tiny)(torch.zeros(1, 65, dtype=torch.long)))
    t.expect(err == "ValueError", f"T = 65 > context_length = 64 must raise ValueError; got {err}")

    # init_weights statistics on gpt2-char-tiny
    def init_probe(impl):
        torch.manual_seed(2)
        m = impl.GPT2Model(tiny)
        with torch.no_grad():
            for p in unwrap(m).parameters():
                p.fill_(0.5)
        m.init_weights()
        return {k: v.detach().clone() for k, v in unwrap(m).state_dict().items()}

    st = t.run(init_probe)
    for problem in _init_problems(st, tiny.n_layers):
        t.expect(False, f"init_weights: {problem}")
    # the constructor calls init_weights: a model straight out of GPT2Model(cfg) has the same statistics
    def fresh_probe(impl):
        torch.manual_seed(2)
        return {k: v.detach().clone() for k, v in unwrap(impl.GPT2Model(tiny)).state_dict().items()}

    fresh = _init_problems(t.run(fresh_probe), tiny.n_layers)
    if fresh:
        t.fail(f"GPT2Model(gpt2-char-tiny) straight after construction, before any explicit init_weights() call: "
               f"{fresh[0]}{f' (and {len(fresh) - 1} more)' if len(fresh) > 1 else ''}; these are PyTorch's default "
               "initialisations, so __init__ never ran init_weights", bug="B08.init_not_called")

    # backpropagation: a loss on the logits reaches every parameter (nothing on the way is detached)
    def build_for_grad(impl):
        torch.manual_seed(6)
        return unwrap(impl.GPT2Model(cfg)).eval()

    check_module_gradients(t, module_gradient_probe(build_for_grad, [torch.randint(0, 50, (2, 9), generator=torch.Generator()
                                                                     .manual_seed(14))]),
                    f"GPT2Model({_describe(cfg)}, V=50, C=16), a random projection of the logits")

    _check_train_mode_dropout(t)


def _init_problems(st: dict, n_layers: int) -> list[str]:
    """What in the state ``st`` of a gpt2-char-tiny model breaks the init_weights rule (empty when nothing)."""
    resid = 0.02 / math.sqrt(2 * n_layers)
    problems = []
    for key, v in st.items():
        if key.endswith("norm1.weight") or key.endswith("norm2.weight") or key == "final_norm.weight":
            if not bool((v == 1).all()):
                problems.append(f"{key} must be all ones")
        elif key.endswith(".bias"):
            if not bool((v == 0).all()):
                problems.append(f"{key} must be all zeros")
        else:
            target = resid if key.endswith("attn.out_proj.weight") or key.endswith("ffn.fc2.weight") else 0.02
            std = float(v.std())
            if not (abs(std - target) <= 0.1 * target and abs(float(v.mean())) < 0.2 * target):
                problems.append(f"{key} must be drawn from N(0, {target:.5f}²); its std is {std:.5f}"
                                + (" (the residual projections use 0.02/√(2·n_layers))" if target == resid else ""))
    return problems


# ------------------------------------------------------------------ 08.GPT2Model: train-mode dropout, side effects

DROP_P = 0.25
DROP_CFG = dict(vocab_size=20, context_length=12, d_model=16, n_heads=2, n_layers=2, dropout=DROP_P)
LEVELS = (1.0, 2.5)  # constant attention / feed-forward outputs: every subset sum is distinct


def _block_state(cfg) -> dict:
    """A reference block's random state with both sublayers made constant (weights 0, biases LEVELS)."""
    from llmcourse.models.gpt2 import GPT2Block

    torch.manual_seed(31)
    st = {k: v.detach().clone() for k, v in GPT2Block(cfg).state_dict().items()}
    for key, c in zip(("attn.out_proj", "ffn.fc2"), LEVELS):
        st[f"{key}.weight"] = torch.zeros_like(st[f"{key}.weight"])
        st[f"{key}.bias"] = torch.full_like(st[f"{key}.bias"], c)
    return st


def _block_dropout_probe(cfg, state, x):
    def probe(impl):
        blk = impl.GPT2Block(cfg)
        unwrap(blk).load_state_dict(state)
        unwrap(blk).train()
        torch.manual_seed(7)
        out = blk(x)
        attn_p = [float(d.p) for d in unwrap(blk).attn.modules() if isinstance(d, nn.Dropout)] \
            if isinstance(getattr(unwrap(blk), "attn", None), nn.Module) else None
        return out, attn_p
    return probe


def _embedding_dropout_probe(cfg, idx, quiet_state):
    """Logits in train and in eval mode of a model whose blocks add nothing (every sublayer's last layer 0),
    so only dropout on the embeddings can make them differ; and, when blocks[0] is called as a module, its
    input in train mode (a pre-hook) with the two embedding tables."""
    def probe(impl):
        torch.manual_seed(3)
        m = impl.GPT2Model(cfg)
        unwrap(m).load_state_dict(quiet_state, strict=False)
        seen = []
        unwrap(m).blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
        unwrap(m).train()
        torch.manual_seed(8)
        train_logits = m(idx).detach()
        x0 = seen[0] if seen else None
        unwrap(m).eval()
        with torch.no_grad():
            eval_logits = m(idx)
        return {"x0": x0, "train": train_logits, "eval": eval_logits, "tok": unwrap(m).tok_emb.weight.detach().clone(),
                "pos": unwrap(m).pos_emb.weight.detach().clone()}
    return probe


def _side_effect_probe(cfg, idx):
    """State before and after a forward in eval mode and in train mode (nothing may change)."""
    def probe(impl):
        torch.manual_seed(4)
        m = impl.GPT2Model(cfg)
        before = {k: v.detach().clone() for k, v in unwrap(m).state_dict().items()}
        unwrap(m).eval()
        with torch.no_grad():
            m(idx)
        after_eval = {k: v.detach().clone() for k, v in unwrap(m).state_dict().items()}
        unwrap(m).train()
        m(idx)
        after_train = {k: v.detach().clone() for k, v in unwrap(m).state_dict().items()}
        return before, after_eval, after_train
    return probe


def _check_train_mode_dropout(t):
    """Residual dropout on each sublayer's output, embedding dropout, the attention's p; by properties."""
    from ..dropout import zero_fraction_bounds

    cfg = _cfg(**DROP_CFG)
    x = torch.randn(6, 10, 16, generator=torch.Generator().manual_seed(32))
    probe = _block_dropout_probe(cfg, _block_state(cfg), x)
    out, attn_p = t.run(probe)
    what = f"GPT2Block(dropout={DROP_P}) in train mode, with its attention and feed-forward outputs made constant"
    t.expect(isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(x.shape),
             f"{what}: the output must keep the shape {tuple(x.shape)}; got {getattr(out, 'shape', out)}")
    total = sum(LEVELS)
    if bool(((out - x - total).abs() < 1e-4).all()):
        t.fail(f"{what}: no sublayer output was dropped; in train mode each sublayer's output goes through dropout "
               "before it is added to the residual stream", bug=t.diagnose(probe, (out, attn_p)) or "B08.resid_dropout_missing")
    import itertools

    sums = {sum(c for c, k in zip(LEVELS, keep) if k): keep for keep in itertools.product((False, True), repeat=2)}
    grid = torch.tensor(sorted(sums), dtype=torch.float64)
    d = ((out - x) * (1 - DROP_P)).double()
    nearest = (d.unsqueeze(-1) - grid).abs().argmin(-1)
    if not bool(((d - grid[nearest]).abs() < 1e-3).all()):
        t.fail(f"{what}: out − x must be, entry by entry, a sum of the dropped or kept sublayer outputs (each kept one "
               "× 1/(1−p)); it is not: dropout acts on something else (the residual sum x + sublayer, or the input)",
               bug=t.diagnose(probe, (out, attn_p)) or "B08.dropout_on_sum")
    keeps = torch.tensor([sums[v] for v in grid.tolist()])[nearest]
    lo, hi = zero_fraction_bounds(DROP_P, d.numel())
    for i, label in enumerate(("attention", "feed-forward")):
        frac = 1.0 - float(keeps[..., i].float().mean())
        t.expect(lo <= frac <= hi, f"{what}: {frac:.1%} of the {label} output's entries were dropped; expected about "
                 f"{DROP_P:.0%} (one dropout on each sublayer's output, with cfg.dropout)",
                 bug="B08.resid_dropout_missing" if frac == 0 else None)
    if attn_p is not None:
        t.expect(any(abs(q - DROP_P) < 1e-9 for q in attn_p), f"{what}: the attention must drop its weights with "
                 f"cfg.dropout = {DROP_P}; its dropout probabilities are {attn_p or 'none'}", bug="B08.attn_dropout_missing")

    # embedding dropout: the input of the first block is dropout(tok_emb[idx] + pos_emb[0 … T−1])
    idx = torch.randint(0, 20, (8, 12), generator=torch.Generator().manual_seed(33))
    from llmcourse.models.gpt2 import GPT2Model

    torch.manual_seed(3)
    quiet = {k: (torch.zeros_like(v) if any(w in k for w in ("attn.out_proj.", "ffn.fc2.")) else v.detach().clone())
             for k, v in GPT2Model(cfg).state_dict().items() if k != "lm_head.weight"}
    emb = t.run(_embedding_dropout_probe(cfg, idx, quiet))
    if torch.allclose(emb["train"], emb["eval"], atol=1e-6):
        t.fail(f"GPT2Model(dropout={DROP_P}) whose blocks add nothing (attention and feed-forward outputs 0) gives the "
               "same logits in train and in eval mode: the embeddings are not dropped (dropout on tok_emb + pos_emb, "
               "before the first block)", bug="B08.emb_dropout_missing")
    # eval mode: dropout off everywhere. The quiet model's eval logits equal the reference's with the same weights,
    # and two eval calls under different seeds agree (issue 38: F.dropout(..., training=True) earned full points)
    ref_m = GPT2Model(cfg)
    ref_m.load_state_dict(quiet, strict=False)
    ref_m.eval()
    with torch.no_grad():
        want_eval = ref_m(idx)

    def eval_twice(impl):
        torch.manual_seed(3)
        m = impl.GPT2Model(cfg)
        unwrap(m).load_state_dict(quiet, strict=False)
        unwrap(m).eval()
        with torch.no_grad():
            torch.manual_seed(11)
            a = m(idx)
            torch.manual_seed(12)
            return a, m(idx)

    e1, e2 = t.run(eval_twice)
    t.expect(torch.equal(e1, e2), f"GPT2Model(dropout={DROP_P}) in eval mode gave different logits in two calls on the "
             f"same input (max difference {float((e1 - e2).abs().max()):.3g}): in eval mode dropout must be off "
             "(a dropout that ignores the module's mode, e.g. F.dropout(..., training=True), stays on)")
    t.expect(bool(torch.allclose(e1, want_eval, atol=float32_atol(want_eval, 3 * cfg.d_model), rtol=1e-5)),
             f"GPT2Model(dropout={DROP_P}) in eval mode must give the logits of the same weights without dropout; max "
             f"difference {float((e1 - want_eval).abs().max()):.3g}")
    if emb["x0"] is not None:  # the input of blocks[0] can be read: dropped by the right rule?
        clean = (emb["tok"][idx] + emb["pos"][: idx.shape[1]]).double()
        x0 = emb["x0"].double()
        what = f"GPT2Model(dropout={DROP_P}) in train mode: the input of blocks[0]"
        t.expect(tuple(x0.shape) == tuple(clean.shape),
                 f"{what} must have shape {tuple(clean.shape)}; got {tuple(x0.shape)}")
        kept = x0.abs() > 1e-9
        t.expect(torch.allclose(x0[kept], clean[kept] / (1 - DROP_P), atol=1e-5, rtol=1e-4),
                 f"{what}: every kept entry must be (tok_emb + pos_emb)/(1−p) (inverted dropout of the sum)")
        frac = 1.0 - float(kept.double().mean())
        lo, hi = zero_fraction_bounds(DROP_P, x0.numel())
        t.expect(lo <= frac <= hi, f"{what}: {frac:.1%} of the entries were zeroed; expected about {DROP_P:.0%}")
        # blocks that add nothing pass x0 on unchanged: the train-mode logits are lm_head(final_norm(x0)), so a
        # dropout anywhere after the blocks (before the head) shows (issue 38)
        with torch.no_grad():
            want_train = ref_m.lm_head(ref_m.final_norm(emb["x0"].float()))
        gap = float((emb["train"].float() - want_train).abs().max())
        t.expect(gap <= float32_atol(want_train, 3 * cfg.d_model), f"GPT2Model(dropout={DROP_P}) in train mode, with "
                 f"blocks that add nothing (attention and feed-forward outputs 0): the logits must be "
                 f"lm_head(final_norm(input of blocks[0])); they differ by {gap:.3g}: dropout belongs on the embeddings "
                 "and on each sublayer's output only, not after the blocks or before the head")

    # side effects: a forward (eval, then train) leaves every parameter and buffer as it was
    before, after_eval, after_train = t.run(_side_effect_probe(cfg, idx))
    for label, after in (("in eval mode", after_eval), ("in train mode", after_train)):
        moved = [k for k in before if k not in after or not torch.equal(before[k], after[k])]
        t.expect(not moved, f"a forward pass {label} changed the model's state: {moved[:4]} (a forward must not "
                 "write into parameters or buffers)")


# ================================================================== 08.gpt2_param_count


@check(f"{U}.gpt2_param_count", ["gpt2_param_count", "count_parameters", "gpt2_param_breakdown"], _ref)
def check_gpt2_param_count(t):
    for (name, tied, bias), expected in F081.items():
        cfg = _cfg(**{**PRESETS[name], "tie_weights": tied, "qkv_bias": bias})
        t.compare(lambda impl, cfg=cfg: impl.gpt2_param_count(cfg), expected,
                  f"gpt2_param_count({name}, tie_weights={tied}, qkv_bias={bias})", atol=0, rtol=0)
    # from the config alone: no nn.Module may be built (on any device; issue 38: a meta-device model earned 3/3)
    def no_model(impl):
        with forbid((nn.Module, "__init__"), reason="gpt2_param_count works from the config alone, no model is built"):
            return impl.gpt2_param_count(_cfg(**PRESETS["gpt2-small"]))

    err = t.raised_error(no_model)
    t.expect(err is None, "gpt2_param_count must compute the count from the config's numbers alone (the formula), "
             f"without building a model (not even on the meta device); building one failed with: {err and err[1]}")
    # count_parameters: an nn.Module with one shared tensor, then GPT-2 presets built on the meta device
    lin = nn.Linear(3, 4)

    def shared(impl):
        net = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
        net[1].weight = net[0].weight
        return impl.count_parameters(net)

    t.compare(shared, 15, "count_parameters of nn.Sequential(Embedding(5, 3), Linear(3, 5, bias=False)) with the "
              "Linear's weight tied to the embedding (15 unique values)", atol=0, rtol=0)
    t.compare(lambda impl: impl.count_parameters(nn.Sequential(lin, nn.ReLU(), nn.Linear(4, 2))), 26,
              "count_parameters(Linear(3, 4), ReLU, Linear(4, 2))", atol=0, rtol=0)
    for (name, tied, bias) in (("gpt2-medium", True, True), ("gpt2-char-tiny", False, True),
                               ("gpt2-small", True, True)):
        cfg = _cfg(**{**PRESETS[name], "tie_weights": tied, "qkv_bias": bias})

        def meta(impl, cfg=cfg):
            from llmcourse.models.gpt2 import GPT2Model

            with torch.device("meta"):
                model = GPT2Model(cfg)
            return impl.count_parameters(model)

        t.compare(meta, F081[(name, tied, bias)], f"count_parameters of the course's GPT2Model({name}, "
                  f"tie_weights={tied}) built on the meta device", atol=0, rtol=0)


# ================================================================== 08.load_hf_gpt2


def _load_probe(impl, cfg, hf_sd):
    """Load into the reference model; return its state (course keys) and a tying probe."""
    from llmcourse.models.gpt2 import GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(cfg).eval()
    out = impl.load_hf_gpt2(model, dict(hf_sd))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tie = _tying(model)
    return {"returned_model": out is model, "state": state, "tie": tie}


@functools.lru_cache(maxsize=4)
def _ref_model(cfg_key: tuple):
    from llmcourse.models.gpt2 import GPT2Model

    return GPT2Model(_cfg(**dict(cfg_key))).eval()


def _logits_of(out, cfg):
    """Run the returned state dict through a reference model here (checker side)."""
    if not isinstance(out, dict) or not isinstance(out.get("state"), dict):
        return None
    model = _ref_model(tuple(sorted(cfg.to_dict().items())))
    state = out["state"]
    want = model.state_dict()
    if set(state) != set(want) or any(tuple(state[k].shape) != tuple(want[k].shape) for k in want):
        return None
    with torch.no_grad():
        model.load_state_dict({k: v for k, v in state.items() if k != "lm_head.weight"}, strict=False)
        return model(_idx()).clone()


def _conv1d_pre_transposed(hf_sd: dict, which=("attn.c_proj", "mlp.c_fc", "mlp.c_proj")) -> dict:
    return {k: (v.T.contiguous() if any(f".{w}.weight" in k for w in which) else v) for k, v in hf_sd.items()}


def _c_attn_linear_layout(hf_sd: dict) -> dict:
    return {k: (v.T.contiguous() if k.endswith("attn.c_attn.weight") else v) for k, v in hf_sd.items()}


@check(f"{U}.load_hf_gpt2", ["load_hf_gpt2"], _ref)
def check_load_hf_gpt2(t):
    for cfg, hf_sd, _course_sd, hf_logits in _hf_cases():
        probe = functools.partial(_load_probe, cfg=cfg, hf_sd=hf_sd)
        failed = t.raised_error(probe)
        if failed is not None:
            # recognise a loader that expects nn.Linear layouts: it works once the weights are pre-transposed
            for variant, bug in ((_conv1d_pre_transposed(hf_sd), "B08.conv1d_not_transposed"),
                                 (_c_attn_linear_layout(hf_sd), "B08.c_attn_split_dim0")):
                alt = functools.partial(_load_probe, cfg=cfg, hf_sd=variant)
                if t.raised_error(alt) is None:
                    got = _logits_of(t.run(alt), cfg)
                    if got is not None and torch.allclose(got, hf_logits, atol=logits_atol(cfg, hf_logits), rtol=1e-5):
                        t.fail(f"load_hf_gpt2 raised {failed[0]} on a GPT2LMHeadModel state dict ({_describe(cfg)}), "
                               f"but works when those weights are given in nn.Linear's (out, in) layout", bug=bug)
        out = t.run(probe)  # raises with the learner's error (and a mutant's name when one raises alike)
        t.compare(probe, hf_logits, f"logits of the loaded model vs transformers' GPT2LMHeadModel ({_describe(cfg)}, "
                  f"every HF tensor random)", atol=logits_atol(cfg, hf_logits), rtol=1e-5,
                  pick=lambda o, cfg=cfg: _logits_of(o, cfg))
        tie = out["tie"]
        if not (torch.equal(tie["head0"], tie["emb0"]) and torch.equal(tie["head1"], tie["emb1"])):
            t.fail("after loading, lm_head.weight must still be the same Parameter as tok_emb.weight (copy into the "
                   "existing tensors instead of assigning new Parameters)", bug="B08.tied_by_copy")
        t.expect(out["returned_model"] is True, "load_hf_gpt2 must return the model it was given (loaded in place)")

    cfg, hf_sd, _course_sd, hf_logits = _hf_cases()[0]
    # old checkpoints carry non-parameter buffers: ignored
    old = dict(hf_sd)
    for i in range(cfg.n_layers):
        old[f"transformer.h.{i}.attn.bias"] = torch.ones(1, 1, 128, 128, dtype=torch.bool).tril()
        old[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    t.compare(functools.partial(_load_probe, cfg=cfg, hf_sd=old), hf_logits,
              "a state dict that also holds the old '.attn.bias' / '.attn.masked_bias' buffers (ignore them)",
              atol=logits_atol(cfg, hf_logits), rtol=1e-5, pick=lambda o: _logits_of(o, cfg))
    # shape mismatches: another config, one transposed c_fc
    other = _hf_cases()[1][1]
    err = t.raised(functools.partial(_load_probe, cfg=cfg, hf_sd=other))
    t.expect(err == "ValueError", f"loading a d_model=48 checkpoint into a d_model=64 model must raise ValueError; "
             f"got {err}")
    wide = dict(hf_sd)  # a fused c_attn with 4 extra columns: slicing three D-wide parts out of it would succeed
    wide["transformer.h.0.attn.c_attn.weight"] = torch.cat([wide["transformer.h.0.attn.c_attn.weight"],
                                                           torch.zeros(cfg.d_model, 4)], dim=1)
    err = t.raised(functools.partial(_load_probe, cfg=cfg, hf_sd=wide))
    t.expect(err == "ValueError", f"a c_attn weight of shape (64, 196) instead of (64, 192) must raise ValueError "
             f"(slicing query, key and value out of it would silently load a wrong checkpoint); got {err}")
    bad = dict(hf_sd)
    bad["transformer.h.1.mlp.c_fc.weight"] = bad["transformer.h.1.mlp.c_fc.weight"][:, :-4].contiguous()
    err = t.raised(functools.partial(_load_probe, cfg=cfg, hf_sd=bad))
    t.expect(err == "ValueError", f"a c_fc weight of shape (64, 252) instead of (64, 256) must raise ValueError; "
             f"got {err}")


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# GPT2Model: the capstone benchmark's GPT-2 forward over a KVCache (an empty cache gives the whole forward)
also_blocked(f"{U}.GPT2Model", "coursetools.bench.capstone:_gpt2_cached_logits")


# ================================================================== grading strength (grader/strength.py)
defining_property(f"{U}.GPT2Config", "presets are fresh configs built from a table of sizes, and an unknown name is "
                  "an error, not a fallback", probe="every preset's fields; two calls return independent objects; "
                  "an unknown name raises KeyError")
defining_property(f"{U}.GPT2Model", "a pre-LN decoder whose logits equal GPT-2's for the same weights, with dropout "
                  "exactly on the embeddings and each sublayer's output in train mode and nowhere in eval mode",
                  probe="logits vs transformers' GPT2LMHeadModel; dropout read off outputs of sublayers made constant "
                  "(train), two eval calls and the no-dropout logits (eval); causality; init statistics")
defining_property(f"{U}.gpt2_param_count", "the parameter count is a formula of the config's numbers; a shared "
                  "tensor counts once", probe="counts of every released size with and without tying and Q/K/V biases, "
                  "computed with nn.Module construction forbidden; count_parameters on a tied module")
defining_property(f"{U}.load_hf_gpt2", "a checkpoint in another layout (Conv1D, fused c_attn) is mapped so that the "
                  "model computes the same function", probe="logits of the loaded course model vs GPT2LMHeadModel on "
                  "random weights in every tensor; the tied head still one Parameter after loading")
decision(f"{U}.load_hf_gpt2", "how each Conv1D tensor is transformed (transposed) and along which dimension, in which "
         "order, the fused c_attn splits into query, key and value",
         forms=[r"c_attn\.weight\[:, ?\w* ?\*? ?d ?:", r"split (c_attn|the fused \w+) along (dim(ension)? )?(1|-1)\b",
                r"transpose (every|each|all) Conv1D weights?", r"Conv1D weights? (must|need to) be transposed"],
         wrong=("B08.conv1d_not_transposed", "B08.c_attn_split_dim0", "B08.c_attn_order"))
decision(f"{U}.gpt2_param_count", "the per-block count, derived from the state_dict table",
         forms=[r"12 ?\* ?d ?\* ?d ?\+ ?13 ?\* ?d", r"12 ?\* ?d ?\*\* ?2 ?\+ ?13 ?\* ?d", r"12 ?d\^?2 ?\+ ?13 ?d",
                r"12D2 ?\+ ?13D"],
         wrong=("B08.count_ignores_qkv_bias", "B08.count_tied_twice"))
