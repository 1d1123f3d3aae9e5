"""Checks of unit 13 (multi-head latent attention).

Independent routes: ``torch.cat`` of the appended latents (the cache contents); an explicit per-head loop over
weight slices written here (``SimpleMLA`` and the absorbed matrices ``A_h = W_q,hᵀ W_uk,h``,
``B_h = W_o[:, h] W_uv,h``); ``transformers``' ``DeepseekV3Attention`` (eager, 5.x) on the four tiny parity
configs (query compression off/on × ``rope_interleave`` True/False), every weight re-drawn from N(0, 0.2²), whose
outputs are a stored snapshot (``assets/oracles/u13_hf_mla.pt``, rebuilt and compared by
``tests/test_unit13_deepseek_mla_checks.py``) so that ``course check`` need not import transformers; closed-form
cache sizes (DeepSeek-V3: 61 layers × (512 + 64) = 35,136 elements per token; the course's tiny models).

Contract clauses and the probes that cover them
-----------------------------------------------

``13.SimpleMLA``
  * ``LatentCache``: empty length/bytes; ``update`` appends on dim 1 per layer and returns the layer's (c_kv, k_pe),
    ``k_pe=None`` (default) returns None; ``seq_len``; ``nbytes`` in float32 and bfloat16 -> ``_latent_run`` probes.
  * ``SimpleMLA``: keys/shapes (``module_facts``); float32 and float64 output vs a per-head loop; a cache at a
    non-default ``layer_idx=1`` holds only ``W_dkv(x)`` and decoding equals the full forward (``decode``); an eval
    and a train-mode forward leave parameters and buffers unchanged (``side_effects``).
``13.absorb``
  * ``absorb_mla_weights``: shapes and values of ``A``, ``Bo`` (the per-head bilinear forms; the learner decides
    the slicing: the head-split mutant is the wrong alternative) -> ``weights``.
  * ``absorbed_forward``: equals naive MLA (float64 example, float32 with a longer latent than the queries and a
    bottom-right mask) -> ``f131``, ``decode_rows``; recomputed after a weight change -> ``weight_change``;
    **never rebuilds per-head keys or values**: ``W_uk``/``W_uv`` answer NaN when called (``poisoned_calls``) and
    weights scaled so that any ``W_uk c`` overflows float32 while the absorbed products stay finite
    (``overflow``); both outputs must equal the naive float64 result.
``13.DeepSeekMLA``
  * keys/shapes for both query layouts; parity with ``DeepseekV3Attention`` (stored oracle) for 6 configs: the
    4 tiny ones, one with distinct d_nope/d_R/d_v (the softmax scale is the learner's decision: no scale,
    ``d_nope^-½`` and ``d_v^-½`` are the named alternatives) and one with non-default ``rope_theta`` and
    (``rms_norm_eps=0.1``: against the course's module, see ``EXTRA``); ``absorb=True`` equal; shifted ``positions``; cached decoding at ``layer_idx=1`` (naive and
    absorbed) and what the cache holds; **absorb=True never materialises per-head K/V** (``kv_b_proj`` answers
    NaN when called; overflow-scaled weights); an eval and a train-mode forward leave parameters and buffers
    unchanged.
``13.mla_memory``
  * every ``kind``; ``k_head_dim``/``v_head_dim`` overriding ``head_dim``; an ``int`` result.

Probes build the learner's modules inside the worker. ``13.absorb`` runs the learner's functions on the course's
``SimpleMLA`` and ``13.DeepSeekMLA`` decodes through the course's ``LatentCache`` (both earlier exercises, not the
references of the exercise being checked), so a wrong cache or ``SimpleMLA`` costs its own points only.
"""

from __future__ import annotations

import math

import torch

from ..core import check, module_facts, unwrap
from ..oracles import stored_oracle, write_oracle
from ..runner import also_blocked

U = "13"
ORACLE_ASSET = "oracles/u13_hf_mla.pt"
TINY = dict(d_model=64, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
PARITY = [(None, True), (None, False), (24, True), (24, False)]   # (q_lora_rank, rope_interleave)
# two more parity configs (same tiny D and H): distinct head dims (d_nope 16, d_R 16, d_v 12: every candidate softmax
# scale gives a different output) and a non-default rope_theta. (rms_norm_eps is probed against the course's module:
# transformers 5's DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm with their default eps 1e-6 whatever
# config.rms_norm_eps says, which agrees with DeepSeek-V3's own config, where both are 1e-6.)
EXTRA = [dict(q_lora_rank=24, rope_interleave=True, qk_rope_head_dim=16, v_head_dim=12),
         dict(q_lora_rank=24, rope_interleave=False, rope_theta=50.0)]
SEQ = 9


def _ref_simple():
    from llmcourse.models.deepseek_mla import LatentCache, SimpleMLA

    return {"LatentCache": LatentCache, "SimpleMLA": SimpleMLA}


def _ref_absorb():
    from llmcourse.models.deepseek_mla import absorb_mla_weights, absorbed_forward

    return {"absorb_mla_weights": absorb_mla_weights, "absorbed_forward": absorbed_forward}


def _ref_deepseek():
    from llmcourse.models.deepseek_mla import DeepSeekMLA

    return {"DeepSeekMLA": DeepSeekMLA}


def _ref_memory():
    from llmcourse.nn.kv_cache import attn_cache_elems_per_token

    return {"attn_cache_elems_per_token": attn_cache_elems_per_token}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _causal(t, s=None):
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)


def _state_copy(m):
    return {k: v.detach().clone() for k, v in unwrap(m).state_dict().items()}


def _unchanged(before, after):
    """Names of state_dict entries a forward changed (plain data on both sides)."""
    return sorted(k for k in before if k not in after or not torch.equal(before[k], after[k]))


def _nan_forward(module):
    """Make ``module`` answer NaN when called (its weights stay readable): a path that calls it shows in the output."""
    def forward(inp, *args, **kwargs):
        out_features = unwrap(module).weight.shape[0]
        return torch.full((*inp.shape[:-1], out_features), float("nan"), dtype=inp.dtype)
    unwrap(module).forward = forward


def _matmul_flops(fn):
    """Floating-point operations of the matrix products ``fn()`` runs (``torch.utils.flop_counter``: mm, bmm,
    addmm, einsum's products; elementwise work is not counted). Runs in the worker, around the learner's call."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = fn()
    return int(counter.get_total_flops()), out


def _flops_per_latent(f_short, f_long, s_short, s_long):
    """Matmul FLOPs added by each extra cached latent (one query): the slope between two cache lengths."""
    return (f_long - f_short) / (s_long - s_short)


# ------------------------------------------------------------------ the stored transformers oracle


def build_hf_oracle() -> dict:
    """Outputs of ``DeepseekV3Attention`` on the four parity configs (needs transformers; a few seconds).

    Write it with ``python -c "from grader.checks.u13_deepseek_mla import write_hf_oracle; write_hf_oracle()"``.
    """
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    from llmcourse.models.deepseek_mla import hf_deepseek_attention_config

    cases = []
    configs = [dict(q_lora_rank=q, rope_interleave=il) for q, il in PARITY] + [dict(e) for e in EXTRA]
    for i, conf in enumerate(configs):
        q_lora_rank, interleave = conf["q_lora_rank"], conf["rope_interleave"]
        extra = {k: v for k, v in conf.items() if k not in ("q_lora_rank", "rope_interleave")}
        cfg = hf_deepseek_attention_config(**conf)
        att = DeepseekV3Attention(cfg, layer_idx=0).eval()
        g = _gen(100 + i)
        with torch.no_grad():
            for p in att.parameters():
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
        x = torch.randn(2, SEQ, TINY["d_model"], generator=_gen(200 + i))
        cos, sin = DeepseekV3RotaryEmbedding(cfg)(x, torch.arange(SEQ)[None].expand(2, SEQ))
        add = torch.zeros(SEQ, SEQ).masked_fill(~_causal(SEQ), float("-inf"))[None, None]
        with torch.no_grad():
            y = att(x, (cos, sin), add)[0].clone()
        case = {"q_lora_rank": -1 if q_lora_rank is None else q_lora_rank, "rope_interleave": interleave,
                "state": {k: v.detach().clone() for k, v in att.state_dict().items()}, "x": x, "y": y}
        if extra:
            case["extra"] = extra
        cases.append(case)
    return {"cases": cases}


def write_hf_oracle() -> None:
    write_oracle(ORACLE_ASSET, build_hf_oracle)


oracle = stored_oracle(ORACLE_ASSET, build_hf_oracle)


# ================================================================== 13.SimpleMLA


def _simple_state(seed, D=32, H=4, hd=8, dc=6, dtype=torch.float32, scale=1.0):
    g = _gen(seed)
    shapes = {"W_q.weight": (H * hd, D), "W_dkv.weight": (dc, D), "W_uk.weight": (H * hd, dc),
              "W_uv.weight": (H * hd, dc), "W_o.weight": (D, H * hd)}
    return {k: (scale * torch.randn(s, generator=g, dtype=torch.float64)).to(dtype) for k, s in shapes.items()}


def _simple_naive(state, x, mask, H, hd):
    """MLA without positions, head by head from weight slices (the checker's independent route)."""
    c = x @ state["W_dkv.weight"].T
    out = torch.zeros(*x.shape[:2], state["W_o.weight"].shape[0], dtype=x.dtype)
    for h in range(H):
        rows = slice(h * hd, (h + 1) * hd)
        q, k, v = x @ state["W_q.weight"][rows].T, c @ state["W_uk.weight"][rows].T, c @ state["W_uv.weight"][rows].T
        s = q @ k.transpose(-2, -1) / math.sqrt(hd)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        out = out + torch.softmax(s, dim=-1) @ v @ state["W_o.weight"][:, rows].T
    return out, c


def _latent_chunks(seed, B=2, dc=6, dr=4, n_layers=3, lengths=(3, 1, 5), with_pe=True):
    g = _gen(seed)
    return [[(torch.randn(B, n, dc, generator=g), torch.randn(B, n, dr, generator=g) if with_pe else None)
             for _ in range(n_layers)] for n in lengths]


def _latent_run(chunks, dtype=None):
    def probe(impl):
        c = impl.LatentCache(len(chunks[0]))
        rec = {"empty_len": c.seq_len, "empty_bytes": c.nbytes(), "returned": [], "lens": []}
        for step in chunks:
            for layer, (ckv, kpe) in enumerate(step):
                if dtype is not None:
                    ckv = ckv.to(dtype)
                    kpe = None if kpe is None else kpe.to(dtype)
                r = c.update(layer, ckv.clone(), None if kpe is None else kpe.clone())
                rec["returned"].append(list(r) if isinstance(r, (tuple, list)) else r)
            rec["lens"].append(c.seq_len)
        rec["nbytes"] = c.nbytes()
        return rec
    return probe


def _simple_module(impl, state, D, H, hd, dc, dtype=None):
    m = impl.SimpleMLA(D, H, hd, dc)
    if dtype is not None:
        unwrap(m).to(dtype)
    unwrap(m).load_state_dict(state)
    unwrap(m).eval()
    return m


@check(f"{U}.SimpleMLA", ["LatentCache", "SimpleMLA"], _ref_simple)
def check_simple_mla(t):
    # -- the cache
    chunks = _latent_chunks(0)
    got = t.run(_latent_run(chunks))
    t.expect(isinstance(got, dict) and got["empty_len"] == 0 and got["empty_bytes"] == 0,
             "an empty LatentCache must have seq_len 0 and nbytes() 0")
    i = 0
    for s, step in enumerate(chunks):
        for layer in range(len(step)):
            c_all = torch.cat([chunks[j][layer][0] for j in range(s + 1)], dim=1)
            k_all = torch.cat([chunks[j][layer][1] for j in range(s + 1)], dim=1)
            r = got["returned"][i]
            t.expect(isinstance(r, list) and len(r) == 2 and all(isinstance(v, torch.Tensor) for v in r),
                     "update(layer_idx, c_kv, k_pe) must return the layer's (c_kv, k_pe) as two tensors")
            t.expect(tuple(r[0].shape) == tuple(c_all.shape) and tuple(r[1].shape) == tuple(k_all.shape),
                     f"update #{s + 1} of layer {layer}: the returned tensors must hold every appended token, "
                     f"shapes {tuple(c_all.shape)} and {tuple(k_all.shape)} (appended on dim 1); got "
                     f"{tuple(r[0].shape)} and {tuple(r[1].shape)}")
            t.expect(torch.equal(r[0], c_all) and torch.equal(r[1], k_all),
                     f"update #{s + 1} of layer {layer}: the returned tensors must be this layer's earlier latents "
                     "followed by the new ones, in order")
            i += 1
    t.expect(got["lens"] == [3, 4, 9], f"seq_len after appending 3, 1 and 5 tokens to every layer must be [3, 4, 9]; "
             f"got {got['lens']}")
    expected = 3 * (6 + 4) * 9 * 2 * 4
    t.expect(got["nbytes"] == expected, f"nbytes() of a float32 cache (3 layers, B=2, T=9, d_c=6, d_R=4) must be "
             f"3·(6+4)·9·2·4 = {expected}; got {got['nbytes']!r}")
    def layer0_only(impl):
        c = impl.LatentCache(3)
        c.update(0, torch.zeros(1, 4, 6))
        first = c.seq_len
        c.update(2, torch.zeros(1, 9, 6))
        return [first, c.seq_len]
    t.expect(t.run(layer0_only) == [4, 4], "seq_len is the cached length of layer 0: 4 after appending 4 tokens to "
             "layer 0 only, still 4 after appending 9 to layer 2")
    nope = t.run(_latent_run(_latent_chunks(1, n_layers=1, lengths=(2, 3), with_pe=False), dtype=torch.bfloat16))
    t.expect(nope["returned"][-1][1] is None, "without k_pe (k_pe=None) update must return None as the second item")
    t.expect(nope["nbytes"] == 6 * 5 * 2 * 2, f"nbytes() of a bfloat16 latent-only cache (1 layer, B=2, T=5, d_c=6) "
             f"must be {6 * 5 * 2 * 2}; got {nope['nbytes']!r}")

    # -- the module
    D, H, hd, dc = 32, 4, 8, 6
    facts = t.run(lambda impl: module_facts(impl.SimpleMLA(D, H, hd, dc)))
    t.expect(facts.get("is_module"), f"SimpleMLA must be an nn.Module subclass, got {facts.get('type')}")
    want = {"W_q.weight": (32, 32), "W_dkv.weight": (6, 32), "W_uk.weight": (32, 6), "W_uv.weight": (32, 6),
            "W_o.weight": (32, 32)}
    t.expect(facts["state_dict"] == want, f"SimpleMLA(32, 4, 8, 6) must have exactly the keys and shapes {want} "
             f"(no biases); got {facts['state_dict']}")
    odd = t.run(lambda impl: module_facts(impl.SimpleMLA(32, 4, 6, 5))["state_dict"])
    want_odd = {"W_q.weight": (24, 32), "W_dkv.weight": (5, 32), "W_uk.weight": (24, 5), "W_uv.weight": (24, 5),
                "W_o.weight": (32, 24)}
    t.expect(odd == want_odd, f"SimpleMLA(32, 4, 6, 5) (d_model ≠ n_heads·head_dim) must have the shapes {want_odd}; "
             f"got {odd}")
    state = _simple_state(1, scale=0.3)
    x = torch.randn(2, 7, D, generator=_gen(2))
    mask = _causal(7)
    full, c = _simple_naive(state, x, mask, H, hd)
    t.compare(lambda impl: _simple_module(impl, state, D, H, hd, dc)(x, mask), full,
              "SimpleMLA(32, 4, 8, 6) on a (2, 7, 32) input with a causal mask (seeded weights)", atol=1e-5, rtol=1e-4)
    s64 = _simple_state(3, dtype=torch.float64)
    x64 = torch.randn(1, 5, D, generator=_gen(4), dtype=torch.float64)
    t.compare(lambda impl: _simple_module(impl, s64, D, H, hd, dc, torch.float64)(x64, _causal(5)),
              _simple_naive(s64, x64, _causal(5), H, hd)[0], "SimpleMLA in float64 (scale 1/√hd, softmax over keys)",
              atol=1e-10, rtol=1e-10)

    # -- cached decoding: prefill 3 tokens into layer 1 of a 2-layer cache, then one token at a time
    def decode(impl):
        m = _simple_module(impl, state, D, H, hd, dc)
        cache = _Recorder(impl.LatentCache(2))
        outs = []
        with torch.no_grad():
            outs.append(m(x[:, :3], _causal(3), cache=cache, layer_idx=1))
            for i in range(3, 7):
                outs.append(m(x[:, i:i + 1], None, cache=cache, layer_idx=1))
        return {"out": torch.cat(outs, dim=1), "nbytes": cache.nbytes(), "c_kv": cache.last,
                "slots": [v is not None for v in cache.inner.c_kv]}

    got = t.run(decode)
    t.expect(got["slots"] == [False, True], f"with layer_idx=1 the module must write slot 1 of the cache only; the "
             f"slots written: {got['slots']}")
    ckv = got["c_kv"]
    t.expect(isinstance(ckv, torch.Tensor), "SimpleMLA.forward with a cache must call cache.update(layer_idx, c) and "
             "use the (c_all, None) it returns")
    t.expect(tuple(ckv.shape) == (2, 7, dc), f"after 7 tokens, cache.update returned a tensor of shape "
             f"{tuple(ckv.shape)}; MLA caches only the latent c = W_dkv(x), shape (B, T, d_c) = (2, 7, {dc})")
    t.expect(torch.allclose(ckv, c, atol=1e-5, rtol=1e-4),
             "after 7 tokens the cache's layer 1 must hold the latents W_dkv(x) of the 7 tokens, in order")
    t.expect(got["nbytes"] == 1 * dc * 7 * 2 * 4, f"nbytes() after caching 7 tokens in one layer (float32, B=2, d_c=6) "
             f"must be {dc * 7 * 2 * 4}: only the latent is cached; got {got['nbytes']!r}")
    t.compare(decode, full, "outputs of a 3-token prefill then 4 single-token steps through a LatentCache (equal to "
              "the full forward)", atol=1e-5, rtol=1e-4, pick=lambda o: o["out"])

    # -- side effects: a forward (eval, train, with a cache) leaves parameters and buffers unchanged
    def side_effects(impl):
        m = _simple_module(impl, state, D, H, hd, dc)
        before = _state_copy(m)
        with torch.no_grad():
            m(x, mask)
            m(x[:, :3], _causal(3), cache=impl.LatentCache(1))
        unwrap(m).train()
        m(x, mask)
        return [before, _state_copy(m)]

    before, after = t.run(side_effects)
    changed = _unchanged(before, after)
    t.expect(not changed, f"a forward pass (eval or train mode, with or without a cache) must leave the module's "
             f"parameters and buffers unchanged; it changed {changed}")

    # the module is trained: gradients of Σ r·output reach the input and every weight
    r_out = torch.randn(2, 7, D, generator=_gen(15))

    def grads(impl):
        m = _simple_module(impl, state, D, H, hd, dc)
        xx = x.clone().requires_grad_(True)
        (m(xx, mask) * r_out).sum().backward()
        named = dict(unwrap(m).named_parameters())
        return [xx.grad if xx.grad is not None else torch.zeros_like(xx)] + [
            named[k].grad if named[k].grad is not None else torch.zeros_like(named[k]) for k in sorted(state)]

    st = {k: v.clone().requires_grad_(True) for k, v in state.items()}
    xr = x.clone().requires_grad_(True)
    (_simple_naive(st, xr, mask, H, hd)[0] * r_out).sum().backward()
    t.compare(grads, [xr.grad] + [st[k].grad for k in sorted(state)], "gradients of Σ r·output with respect to the "
              "input and every weight (the module is trained: no .detach())", atol=1e-5, rtol=1e-4)


class _Recorder:
    """Passes every call to the learner's cache and keeps the latents the last ``update`` returned."""

    def __init__(self, inner):
        self.inner, self.last = inner, None

    def update(self, layer_idx, c_kv, k_pe=None):
        out = self.inner.update(layer_idx, c_kv, k_pe)
        self.last = out[0] if isinstance(out, (tuple, list)) else out
        return out

    @property
    def seq_len(self):
        return self.inner.seq_len

    def nbytes(self):
        return self.inner.nbytes()


# ================================================================== 13.absorb


def _course_simple(state, D, H, hd, dc, dtype=torch.float32):
    from llmcourse.models.deepseek_mla import SimpleMLA

    m = SimpleMLA(D, H, hd, dc).to(dtype)
    m.load_state_dict(state)
    return m.eval()


def _expected_absorbed(state, H, hd):
    wq, wuk, wuv, wo = (state[k] for k in ("W_q.weight", "W_uk.weight", "W_uv.weight", "W_o.weight"))
    a = torch.stack([wq[h * hd:(h + 1) * hd].T @ wuk[h * hd:(h + 1) * hd] for h in range(H)])
    b = torch.stack([wo[:, h * hd:(h + 1) * hd] @ wuv[h * hd:(h + 1) * hd] for h in range(H)])
    return a, b


def _f131_state():
    """F13.1: ``torch.manual_seed(0)``, randn weights in the order W_q, W_dkv, W_uk, W_uv, W_o, then x (float64)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        shapes = [("W_q.weight", (32, 32)), ("W_dkv.weight", (6, 32)), ("W_uk.weight", (32, 6)),
                  ("W_uv.weight", (32, 6)), ("W_o.weight", (32, 32))]
        state = {k: torch.randn(s, dtype=torch.float64) for k, s in shapes}
        x = torch.randn(2, 5, 32, dtype=torch.float64)
    return state, x


@check(f"{U}.absorb", ["absorb_mla_weights", "absorbed_forward"], _ref_absorb)
def check_absorb(t):
    D, H, hd, dc = 32, 4, 8, 6
    state, x = _f131_state()
    mask = _causal(5)
    a, b = _expected_absorbed(state, H, hd)

    def weights(impl):
        return impl.absorb_mla_weights(_course_simple(state, D, H, hd, dc, torch.float64))

    naive, c = _simple_naive(state, x, mask, H, hd)

    def f131(impl):
        m = _course_simple(state, D, H, hd, dc, torch.float64)
        with torch.no_grad():
            return impl.absorbed_forward(m, x, m.W_dkv(x), mask)

    t.compare(f131, naive, "absorbed_forward on the seeded float64 example (B=2, T=5, D=32, H=4, hd=8, d_c=6) "
              "against naive MLA", atol=1e-10, rtol=1e-10)
    got = t.run(weights)
    t.expect(isinstance(got, (list, tuple)) and len(got) == 2 and all(isinstance(v, torch.Tensor) for v in got),
             "absorb_mla_weights must return two tensors (A, Bo)")
    t.expect(tuple(got[0].shape) == (H, D, dc) and tuple(got[1].shape) == (H, D, dc),
             f"A and Bo must both have shape (H, D, d_c) = {(H, D, dc)}; got {tuple(got[0].shape)} and "
             f"{tuple(got[1].shape)}")
    t.compare(weights, a, "A[h] = W_q[h]ᵀ @ W_uk[h] (each (D, d_c))", atol=1e-10, rtol=1e-10, pick=lambda o: o[0])
    t.compare(weights, b, "Bo[h] = W_o[:, h] @ W_uv[h] (each (D, d_c))", atol=1e-10, rtol=1e-10, pick=lambda o: o[1])

    # float32, default nn.Linear initialisation, a longer latent than the queries (decoding with a cache)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        from llmcourse.models.deepseek_mla import SimpleMLA

        s32 = {k: v.detach().clone() for k, v in SimpleMLA(48, 6, 8, 10).state_dict().items()}
    xs = torch.randn(3, 11, 48, generator=_gen(6))
    full, _ = _simple_naive(s32, xs, _causal(11), 6, 8)

    def decode_rows(impl):
        m = _course_simple(s32, 48, 6, 8, 10)
        with torch.no_grad():
            return impl.absorbed_forward(m, xs[:, 8:], m.W_dkv(xs), _causal(3, 11))

    t.compare(decode_rows, full[:, 8:], "absorbed_forward for the last 3 of 11 tokens reading all 11 latents "
              "(float32, default initialisation, bottom-right causal mask)", atol=1e-5, rtol=1e-4)

    # recomputed on every call
    def weight_change(impl):
        m = _course_simple(s32, 48, 6, 8, 10)
        with torch.no_grad():
            first = impl.absorbed_forward(m, xs, m.W_dkv(xs), _causal(11))
            m.W_uk.weight.mul_(1.5)
            m.W_o.weight.add_(0.05)
            second = impl.absorbed_forward(m, xs, m.W_dkv(xs), _causal(11))
        return first, second

    s2 = dict(s32)
    s2["W_uk.weight"] = s32["W_uk.weight"] * 1.5
    s2["W_o.weight"] = s32["W_o.weight"] + 0.05
    after, _ = _simple_naive(s2, xs, _causal(11), 6, 8)
    got = t.run(weight_change)
    t.expect(not torch.allclose(got[0], got[1]) and torch.allclose(got[1], after, atol=1e-5, rtol=1e-4),
             "after the module's weights change (an optimizer step), absorbed_forward must give the new model's "
             "output; it gave " + ("the old output (stale absorbed matrices)" if torch.allclose(got[0], got[1])
                                   else "something else"), bug="B13.absorb_cached_stale")

    # differentiable: gradients of Σ r·output reach the queries, the latents and every weight through A and Bo
    r_abs = torch.randn(3, 11, 48, generator=_gen(16))

    def abs_grads(impl):
        m = _course_simple(s32, 48, 6, 8, 10)
        xx = xs.clone().requires_grad_(True)
        (impl.absorbed_forward(m, xx, m.W_dkv(xx), _causal(11)) * r_abs).sum().backward()
        return [xx.grad if xx.grad is not None else torch.zeros_like(xx)] + [
            p.grad if p.grad is not None else torch.zeros_like(p) for _, p in sorted(m.named_parameters())]

    st32 = {k: v.clone().requires_grad_(True) for k, v in s32.items()}
    xr = xs.clone().requires_grad_(True)
    (_simple_naive(st32, xr, _causal(11), 6, 8)[0] * r_abs).sum().backward()
    t.compare(abs_grads, [xr.grad] + [st32[k].grad for k in sorted(s32)], "gradients of Σ r·absorbed_forward(...) "
              "with respect to x and every weight of the module (through A and Bo: no .detach())", atol=1e-5,
              rtol=1e-4)

    # -- structure: the latents are never turned into per-head keys or values
    # (1) W_uk and W_uv answer NaN when called as modules; their weights stay readable
    def poisoned_calls(impl):
        m = _course_simple(s32, 48, 6, 8, 10)
        with torch.no_grad():
            c_all = m.W_dkv(xs)
            _nan_forward(m.W_uk)
            _nan_forward(m.W_uv)
            return impl.absorbed_forward(m, xs, c_all, _causal(11))

    out = t.run(poisoned_calls)
    t.expect(isinstance(out, torch.Tensor) and bool(torch.isfinite(out).all()),
             "absorbed_forward called the module's W_uk or W_uv on the latents (a probe made those calls return "
             "NaN): that rebuilds every cached token's per-head keys/values, the work absorption removes. Use the "
             "absorbed matrices, which read only the weights", bug="B13.absorbed_forward_rebuilds_kv")
    t.compare(poisoned_calls, full, "absorbed_forward with W_uk/W_uv answering NaN when called (weights readable)",
              atol=1e-5, rtol=1e-4)
    # (2) weights scaled so that W_uk·c overflows float32 while x·A, A·c and Bo·lat stay finite
    ovf = {k: v.clone() for k, v in s32.items()}
    ovf["W_q.weight"] *= 1e-20
    ovf["W_dkv.weight"] *= 1e19
    ovf["W_uk.weight"] *= 1e21
    ovf["W_o.weight"] *= 1e-19
    want_ovf = _simple_naive({k: v.double() for k, v in ovf.items()}, xs.double(), _causal(11), 6, 8)[0].float()

    def overflow(impl):
        m = _course_simple(ovf, 48, 6, 8, 10)
        with torch.no_grad():
            return impl.absorbed_forward(m, xs, m.W_dkv(xs), _causal(11))

    out = t.run(overflow)
    t.expect(isinstance(out, torch.Tensor) and bool(torch.isfinite(out).all()),
             "with weights scaled so that any per-head key W_uk·c overflows float32 (latents ~1e19, W_uk ~1e21, "
             "W_q ~1e-20), absorbed_forward returned inf/NaN: it builds per-head keys from the latents. Score the "
             "queries against the latents through A instead (x·A stays finite)", bug="B13.absorbed_forward_rebuilds_kv")
    t.compare(overflow, want_ovf, "absorbed_forward with overflow-scaled weights (only the absorbed products stay "
              "finite) against naive MLA in float64", atol=1e-5, rtol=1e-4)
    # (3) the work counted: one query over a long cache. Absorbed attention costs O(H·d_c) multiply-adds per cached
    # latent (a score and a context term per head); rebuilding a head's key or value from a latent costs hd·d_c more
    # per head, whatever the dtype, whichever op does it (a module call, a float64 product, an einsum)
    Dw, Hw, hdw, dcw = 64, 4, 32, 8
    with torch.random.fork_rng():
        torch.manual_seed(7)
        from llmcourse.models.deepseek_mla import SimpleMLA

        sw = {k: v.detach().clone() for k, v in SimpleMLA(Dw, Hw, hdw, dcw).state_dict().items()}
    lens = (64, 320)
    xw = torch.randn(1, lens[1] + 1, Dw, generator=_gen(8))

    def counted(impl):
        m = _course_simple(sw, Dw, Hw, hdw, dcw)
        res = []
        with torch.no_grad():
            for n in lens:
                c_all = m.W_dkv(xw[:, :n + 1])
                flops, _ = _matmul_flops(lambda c_all=c_all, n=n: impl.absorbed_forward(m, xw[:, n:n + 1], c_all, None))
                res.append(flops)
        return res

    got = t.run(counted)
    slope = _flops_per_latent(got[0], got[1], lens[0] + 1, lens[1] + 1) / 2   # multiply-adds per latent
    allowed = 2 * Hw * dcw                                                       # q_lat·c_j and p_j·c_j per head
    rebuild = Hw * hdw * dcw                                                     # one head-set of keys or values
    t.expect(slope <= allowed + rebuild / 2,
             f"one query over a cache of S latents: your absorbed_forward spends {slope:.0f} multiply-adds per cached "
             f"latent (matrix products counted at S = {lens[0] + 1} and {lens[1] + 1}; H={Hw}, hd={hdw}, d_c={dcw}). "
             f"Attention in latent space needs {allowed} (a score and a context term per head); the extra "
             f"{slope - allowed:.0f} ≈ S·H·hd·d_c means keys or values are rebuilt per head from the latents (with "
             "W_uk/W_uv's weights, in any dtype): weight the latents themselves and map the context out with Bo",
             bug="B13.absorbed_forward_rebuilds_kv")


# ================================================================== 13.DeepSeekMLA


def _case_kwargs(case):
    """``DeepSeekMLA`` keyword arguments of a stored oracle case."""
    q = None if case["q_lora_rank"] < 0 else case["q_lora_rank"]
    return dict(TINY, q_lora_rank=q, rope_interleave=case["rope_interleave"], **case.get("extra", {}))


def _ds_kwargs(q_lora_rank, interleave):
    return dict(TINY, q_lora_rank=q_lora_rank, rope_interleave=interleave)


def _expected_keys(q_lora_rank):
    H, D, dc, dn, dr, dv = 4, 64, 16, 16, 8, 16
    keys = ({"q_proj.weight": (H * (dn + dr), D)} if q_lora_rank is None else
            {"q_a_proj.weight": (q_lora_rank, D), "q_a_layernorm.weight": (q_lora_rank,),
             "q_b_proj.weight": (H * (dn + dr), q_lora_rank)})
    keys.update({"kv_a_proj_with_mqa.weight": (dc + dr, D), "kv_a_layernorm.weight": (dc,),
                 "kv_b_proj.weight": (H * (dn + dv), dc), "o_proj.weight": (D, H * dv)})
    return keys


def _ds_module(impl, kw, state):
    m = impl.DeepSeekMLA(**kw)
    unwrap(m).load_state_dict(state, strict=True)
    unwrap(m).eval()
    return m


def _ds_full(kw, state, x, shift=0, absorb=False, poison=False):
    def probe(impl):
        m = _ds_module(impl, kw, state)
        if poison:
            _nan_forward(m.kv_b_proj)
        with torch.no_grad():
            return m(x, torch.arange(x.shape[1]) + shift, _causal(x.shape[1]), absorb=absorb)
    return probe


def _ds_decode(kw, state, x, prefill=5, absorb=False):
    def probe(impl):
        from llmcourse.models.deepseek_mla import LatentCache

        m = _ds_module(impl, kw, state)
        cache = LatentCache(2)
        T = x.shape[1]
        with torch.no_grad():
            outs = [m(x[:, :prefill], torch.arange(prefill), _causal(prefill), cache=cache, layer_idx=1)]
            for i in range(prefill, T):
                outs.append(m(x[:, i:i + 1], torch.arange(i, i + 1), None, cache=cache, layer_idx=1, absorb=absorb))
        shapes = [list(v.shape) if isinstance(v, torch.Tensor) else None for v in (cache.c_kv[1], cache.k_pe[1])]
        return {"out": torch.cat(outs, dim=1), "shapes": shapes, "layer0": [cache.c_kv[0], cache.k_pe[0]],
                "layer1": [cache.c_kv[1], cache.k_pe[1]]}
    return probe


def _expected_cache(kw, state, x):
    """What layer 1 of the cache must hold after ``x``: the normalised latent and the rotated shared rope key."""
    from llmcourse.models import llama3 as L11
    from llmcourse.models.deepseek_mla import DeepSeekMLA

    m = DeepSeekMLA(**kw).eval()
    m.load_state_dict(state)
    with torch.no_grad():
        kv_a = m.kv_a_proj_with_mqa(x)
        c_kv, k_pe = m.kv_a_layernorm(kv_a[..., :kw["kv_lora_rank"]]), kv_a[..., kw["kv_lora_rank"]:]
        cos, sin = L11.rope_cos_sin(L11.rope_inv_freq(kw["qk_rope_head_dim"], kw.get("rope_theta", 10000.0)),
                                    torch.arange(x.shape[1]))
        rope = L11.apply_rope_interleaved if kw["rope_interleave"] else L11.apply_rope
        return c_kv, rope(k_pe, cos, sin)


def _overflow_state(state, kw):
    """Weights scaled so that per-head keys ``W_UK c_kv`` overflow float32 (latent ~1e19 via the latent norm's gain,
    K rows of ``kv_b_proj`` ~1e21) while the absorbed products stay finite (queries ~1e-20, ``o_proj`` ~1e-19)."""
    st = {k: v.clone() for k, v in state.items()}
    h, dn, dv, dc = kw["n_heads"], kw["qk_nope_head_dim"], kw["v_head_dim"], kw["kv_lora_rank"]
    st["q_proj.weight"] *= 1e-20
    st["kv_a_layernorm.weight"] *= 1e19
    st["kv_b_proj.weight"].view(h, dn + dv, dc)[:, :dn] *= 1e21
    st["o_proj.weight"] *= 1e-19
    return st


def _expected_overflow(state, kw, x):
    """The naive path in float64 (no overflow there) on the scaled weights, as float32."""
    from llmcourse.models.deepseek_mla import DeepSeekMLA

    m = DeepSeekMLA(**kw).double().eval()
    m.load_state_dict({k: v.double() for k, v in state.items()})
    with torch.no_grad():
        return m(x.double(), torch.arange(x.shape[1]), _causal(x.shape[1])).float()


@check(f"{U}.DeepSeekMLA", ["DeepSeekMLA"], _ref_deepseek)
def check_deepseek_mla(t):
    for q_lora_rank in (None, 24):
        facts = t.run(lambda impl, q=q_lora_rank: module_facts(impl.DeepSeekMLA(**_ds_kwargs(q, True))))
        t.expect(facts.get("is_module"), f"DeepSeekMLA must be an nn.Module subclass, got {facts.get('type')}")
        want, sd = _expected_keys(q_lora_rank), facts["state_dict"]
        width = sd.get("kv_a_proj_with_mqa.weight")
        if width is not None and width[0] == 16 + 4 * 8:
            t.fail(f"kv_a_proj_with_mqa.weight has shape {width}: one rope key per head; DeepSeek's rope key k_pe is "
                   "a single head of width qk_rope_head_dim shared by all query heads, so the projection is "
                   "(kv_lora_rank + qk_rope_head_dim, d_model) = (24, 64)", bug="B13.k_pe_per_head")
        t.expect(sd == want, f"DeepSeekMLA(q_lora_rank={q_lora_rank}, ...) must have exactly the keys and shapes of "
                 f"transformers' DeepseekV3Attention, no biases: {want}; got {sd}")

    cases = oracle()["cases"]
    # the distinct-head-dims case first: every candidate softmax scale gives its own output there
    for case in [cases[4], *cases[:4], cases[5]]:
        kw = _case_kwargs(case)
        extra = "".join(f", {k}={v}" for k, v in case.get("extra", {}).items())
        t.compare(_ds_full(kw, case["state"], case["x"]), case["y"],
                  f"output with transformers' DeepseekV3Attention weights (q_lora_rank={kw['q_lora_rank']}, "
                  f"rope_interleave={kw['rope_interleave']}{extra}; D=64, H=4, d_c=16, causal mask)", atol=1e-5, rtol=0)

    for case in cases[2:4]:
        kw, state, x, y = _case_kwargs(case), case["state"], case["x"], case["y"]
        il = kw["rope_interleave"]
        t.compare(_ds_full(kw, state, x, absorb=True), y, f"absorb=True (rope_interleave={il}) must equal the "
                  "naive path", atol=1e-5, rtol=0)
        t.compare(_ds_full(kw, state, x, shift=11), y, f"positions shifted by 11 (rope_interleave={il}) must "
                  "leave the output unchanged (RoPE sees only j − i)", atol=2e-5, rtol=0)
        got = t.run(_ds_decode(kw, state, x))
        if got["shapes"][0] is not None and got["shapes"][0] != [2, SEQ, 16]:
            t.fail(f"after {SEQ} tokens the cache holds c_kv of shape {got['shapes'][0]} and k_pe of shape "
                   f"{got['shapes'][1]}: MLA caches only the normalised latent (B, T, kv_lora_rank) = (2, {SEQ}, 16) "
                   f"and the shared rotated rope key (B, T, qk_rope_head_dim) = (2, {SEQ}, 8)",
                   bug="B13.cache_decompressed")
        t.expect(got["shapes"] == [[2, SEQ, 16], [2, SEQ, 8]], f"after {SEQ} tokens through layer 1 of a LatentCache, "
                 f"update(layer_idx, c_kv, k_pe) must have stored c_kv (2, {SEQ}, 16) and k_pe (2, {SEQ}, 8); got "
                 f"{got['shapes']}", bug="B13.cache_decompressed")
        t.expect(got["layer0"] == [None, None], "with layer_idx=1 only layer 1 of the cache may be written")
        want_c, want_pe = _expected_cache(kw, state, x)
        t.expect(all(isinstance(v, torch.Tensor) for v in got["layer1"])
                 and torch.allclose(got["layer1"][0], want_c, atol=1e-5, rtol=1e-4),
                 "what your module writes into the cache must be c_kv after kv_a_layernorm (the latent every later "
                 "step reads as it is); the cached latents differ from the normalised ones", bug="B13.no_kv_norm")
        t.expect(torch.allclose(got["layer1"][1], want_pe, atol=1e-5, rtol=1e-4),
                 "what your module writes into the cache must be the shared rope key k_pe already rotated at its own "
                 "position; the cached rope keys differ")
        t.compare(_ds_decode(kw, state, x), y, f"a 5-token prefill then single-token steps through a LatentCache "
                  f"(rope_interleave={il}) must equal the full forward", atol=1e-5, rtol=0, pick=lambda o: o["out"])
        t.compare(_ds_decode(kw, state, x, absorb=True), y, f"cached decoding with absorb=True "
                  f"(rope_interleave={il}) must equal the full forward", atol=1e-5, rtol=0, pick=lambda o: o["out"])

    # rms_norm_eps at a non-default value (both latent norms); the course's module is the reference here
    from llmcourse.models.deepseek_mla import DeepSeekMLA

    eps_kw = dict(_case_kwargs(cases[3]), rms_norm_eps=0.1)
    ref_eps = DeepSeekMLA(**eps_kw).eval()
    ref_eps.load_state_dict(cases[3]["state"])
    with torch.no_grad():
        want_eps = ref_eps(cases[3]["x"], torch.arange(SEQ), _causal(SEQ))
    t.compare(_ds_full(eps_kw, cases[3]["state"], cases[3]["x"]), want_eps, "rms_norm_eps=0.1 (the epsilon of both "
              "RMSNorms, q_a_layernorm and kv_a_layernorm)", atol=1e-5, rtol=0)

    # -- structure of absorb=True: per-head keys/values are never built from the latents
    case = cases[0]
    kw, state, x, y = _case_kwargs(case), case["state"], case["x"], case["y"]
    out = t.run(_ds_full(kw, state, x, absorb=True, poison=True))
    t.expect(isinstance(out, torch.Tensor) and bool(torch.isfinite(out).all()),
             "with absorb=True your module still called kv_b_proj on the latents (a probe made that call return NaN): "
             "the absorbed path must not run the naive path or rebuild per-head keys/values; it reads the K and V "
             "rows of kv_b_proj.weight and works on c_kv directly", bug="B13.absorb_ignored")
    t.compare(_ds_full(kw, state, x, absorb=True, poison=True), y, "absorb=True with kv_b_proj answering NaN when "
              "called (its weight readable)", atol=1e-5, rtol=0)
    ovf = _overflow_state(state, kw)
    out = t.run(_ds_full(kw, ovf, x, absorb=True))
    t.expect(isinstance(out, torch.Tensor) and bool(torch.isfinite(out).all()),
             "with weights scaled so that any per-head key (K rows of kv_b_proj applied to c_kv) overflows float32 "
             "while the absorbed products stay finite, absorb=True returned inf/NaN: it materialises per-head keys. "
             "Map q_nope into latent space with the K rows and score it against c_kv", bug="B13.absorb_rebuilds_kv")
    t.compare(_ds_full(kw, ovf, x, absorb=True), _expected_overflow(ovf, kw, x), "absorb=True with overflow-scaled "
              "weights against the naive path in float64", atol=1e-5, rtol=1e-4)
    # the work counted: one absorbed decoding step over caches of two lengths (the prefill is not counted)
    lens = (32, 160)
    kw0 = _case_kwargs(cases[0])
    xl = torch.randn(1, lens[1] + 1, kw0["d_model"], generator=_gen(9))

    def counted(impl):
        from llmcourse.models.deepseek_mla import LatentCache

        m = _ds_module(impl, kw0, state)
        res = []
        with torch.no_grad():
            for n in lens:
                cache = LatentCache(1)
                m(xl[:, :n], torch.arange(n), _causal(n), cache=cache)
                flops, _ = _matmul_flops(lambda n=n, cache=cache: m(xl[:, n:n + 1], torch.arange(n, n + 1), None,
                                                                     cache=cache, absorb=True))
                res.append(flops)
        return res

    got = t.run(counted)
    H, dn, dr, dv, dc = kw0["n_heads"], kw0["qk_nope_head_dim"], kw0["qk_rope_head_dim"], kw0["v_head_dim"], \
        kw0["kv_lora_rank"]
    slope = _flops_per_latent(got[0], got[1], lens[0] + 1, lens[1] + 1) / 2
    allowed = H * (dc + dr) + H * dc         # scores against c_kv and k_pe, the latent context
    t.expect(slope <= allowed + H * min(dn, dv) * dc / 2,
             f"absorb=True, one query over a cache of S latents: your module spends {slope:.0f} multiply-adds per "
             f"cached latent (matrix products counted at S = {lens[0] + 1} and {lens[1] + 1}; H={H}, d_c={dc}, "
             f"d_nope={dn}, d_v={dv}, d_R={dr}). Attention in latent space needs {allowed}; the extra "
             f"{slope - allowed:.0f} per latent is S·H·(d_nope or d_v)·d_c: keys or values rebuilt per head from "
             "c_kv (whatever the dtype or the op). Score against c_kv and weight c_kv itself; map the context out "
             "with the value rows afterwards", bug="B13.absorb_rebuilds_kv")

    # -- differentiable (naive and absorbed): gradients of Σ r·output with respect to the input and every weight
    case3 = cases[3]
    kw3 = _case_kwargs(case3)
    r_ds = torch.randn(case3["y"].shape, generator=_gen(17))

    def ds_grads(impl, absorb):
        m = _ds_module(impl, kw3, case3["state"])
        xx = case3["x"].clone().requires_grad_(True)
        (m(xx, torch.arange(SEQ), _causal(SEQ), absorb=absorb) * r_ds).sum().backward()
        return [xx.grad if xx.grad is not None else torch.zeros_like(xx)] + [
            p.grad if p.grad is not None else torch.zeros_like(p) for _, p in sorted(unwrap(m).named_parameters())]

    ref_g = DeepSeekMLA(**kw3).eval()
    ref_g.load_state_dict(case3["state"])
    xr = case3["x"].clone().requires_grad_(True)
    (ref_g(xr, torch.arange(SEQ), _causal(SEQ)) * r_ds).sum().backward()
    want_g = [xr.grad] + [p.grad for _, p in sorted(ref_g.named_parameters())]
    for absorb in (False, True):
        t.compare(lambda impl, absorb=absorb: ds_grads(impl, absorb), want_g, f"gradients of Σ r·output (absorb="
                  f"{absorb}) with respect to the input and every weight (the module is trained: no .detach())",
                  atol=1e-4, rtol=1e-4)

    # -- side effects: forwards (eval and train mode, cached, absorbed) leave parameters and buffers unchanged
    def side_effects(impl):
        from llmcourse.models.deepseek_mla import LatentCache

        m = _ds_module(impl, _case_kwargs(cases[3]), cases[3]["state"])
        xx = cases[3]["x"]
        before = _state_copy(m)
        with torch.no_grad():
            m(xx, torch.arange(SEQ), _causal(SEQ), absorb=True)
            m(xx[:, :4], torch.arange(4), _causal(4), cache=LatentCache(1))
        unwrap(m).train()
        m(xx, torch.arange(SEQ), _causal(SEQ))
        return [before, _state_copy(m)]

    before, after = t.run(side_effects)
    changed = _unchanged(before, after)
    t.expect(not changed, f"a forward pass (eval or train mode, cached or absorbed) must leave the module's "
             f"parameters and buffers unchanged; it changed {changed}")


# ================================================================== 13.mla_memory


@check(f"{U}.mla_memory", ["attn_cache_elems_per_token"], _ref_memory)
def check_mla_memory(t):
    def call(**kw):
        return lambda impl: impl.attn_cache_elems_per_token(**kw)

    t.compare(call(kind="mla", n_layers=61, kv_lora_rank=512, qk_rope_head_dim=64), 35_136,
              "DeepSeek-V3's MLA cache per token: 61 layers × (kv_lora_rank 512 + qk_rope_head_dim 64)", atol=0, rtol=0)
    t.compare(call(kind="mha", n_layers=61, n_heads=128, k_head_dim=192, v_head_dim=128), 2_498_560,
              "multi-head attention with DeepSeek-V3's head sizes: 61 × 128 × (192 + 128)", atol=0, rtol=0)
    t.compare(call(kind="mla", n_layers=4, kv_lora_rank=64, qk_rope_head_dim=16), 320,
              "the course's DeepSeek-tiny (4 layers, d_c 64, d_R 16)", atol=0, rtol=0)
    t.compare(call(kind="gqa", n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32), 512,
              "the course's Llama-tiny (GQA: 4 layers, 2 KV heads of 32)", atol=0, rtol=0)
    t.compare(call(kind="mha", n_layers=4, n_heads=4, head_dim=32), 1024,
              "the course's GPT-tiny (MHA: 4 layers, 4 heads of 32)", atol=0, rtol=0)
    t.compare(call(kind="mqa", n_layers=12, n_heads=12, head_dim=64), 1536,
              "MQA with 12 layers and one key/value head of 64", atol=0, rtol=0)
    t.compare(call(kind="gqa", n_layers=3, n_heads=8, n_kv_heads=2, head_dim=16, k_head_dim=24), 3 * 2 * (24 + 16),
              "GQA with keys wider than values (k_head_dim 24, v_head_dim defaulting to head_dim 16)", atol=0, rtol=0)
    got = t.run(call(kind="mla", n_layers=61, kv_lora_rank=512, qk_rope_head_dim=64))
    t.expect(isinstance(got, int) and not isinstance(got, bool), f"the count must be a Python int; got "
             f"{type(got).__name__}")


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# SimpleMLA: the absorbed attention equals SimpleMLA's forward given its latents
also_blocked(f"{U}.SimpleMLA",
             "llmcourse.models.deepseek_mla:absorbed_forward",
             "llmcourse.models.deepseek_mla:absorb_mla_weights")


# ================================================================== declared strength (grader/strength.py)
from ..strength import decision, defining_property  # noqa: E402

defining_property(f"{U}.SimpleMLA", "only the latent c = W_dkv(x) is cached; keys and values of every head are rebuilt "
                  "from the cached latents, so cached decoding equals the full forward",
                  probe="the cache's returned tensors after each update (their shapes and contents against the appended "
                        "latents), nbytes, and decoding through a recording cache against a per-head loop over weight "
                        "slices")
defining_property(f"{U}.absorb", "attention computed in latent space: queries scored against the latents through the "
                  "absorbed A[h], the latents themselves weighted, Bo[h] mapping the latent context out; no per-head key "
                  "or value is ever built from a latent",
                  probe="matrix-product FLOPs counted (torch.utils.flop_counter) for one query over caches of two lengths: "
                        "the cost per cached latent must be O(H·d_c), not H·hd·d_c; W_uk/W_uv answering NaN when called; "
                        "overflow-scaled weights; values against the float64 naive route")
defining_property(f"{U}.DeepSeekMLA", "DeepSeek-V3's MLA: a normalised latent plus one shared rotated rope key cached per "
                  "token, decoupled RoPE, and an absorbed path that never materialises per-head keys or values",
                  probe="outputs against transformers' DeepseekV3Attention (stored) on 6 configurations; the cache's "
                        "contents after decoding; matmul FLOPs per cached latent of one absorbed decoding step; "
                        "kv_b_proj answering NaN; overflow-scaled weights")
defining_property(f"{U}.mla_memory", "a cache's elements per token follow from what each layer stores: heads × (d_k + d_v) "
                  "for MHA/GQA/MQA, d_c + d_R for MLA",
                  probe="the returned counts for every kind at non-default head widths, against closed forms")

decision(f"{U}.DeepSeekMLA", "the softmax scale: the inverse square root of the query·key width d_nope + d_R",
         forms=[r"sqrt\(\s*(d_nope|qk_nope_head_dim|dn)\s*\+\s*(d_R|d_rope|qk_rope_head_dim|dr)\s*\)",
                r"\(\s*(d_nope|qk_nope_head_dim)\s*\+\s*(d_R|qk_rope_head_dim)\s*\)\s*\*\*\s*-?\s*0?\.5",
                r"(d_nope|qk_nope_head_dim)\s*\+\s*(d_R|qk_rope_head_dim)\s*\)?\s*\^\s*\(?-\s*1\s*/\s*2"],
         wrong=("B13.scale_nope_only", "B13.scale_v_dim", "B13.scale_missing"))
decision(f"{U}.absorb", "which rows and columns of which weights form head h's piece of A and Bo",
         forms=[r"W_q\[\s*h\s*\]\s*\^?\s*T", r"W_q\[\s*h\s*\]\s*ᵀ", r"W_o\[\s*:\s*,\s*h\s*\]\s*@?\s*W_uv",
                r"W_q\.weight\[\s*h\s*\*\s*hd"],
         wrong=("B13.absorb_head_split",))
