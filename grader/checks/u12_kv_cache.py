"""Checks of unit 12 (the KV cache).

Independent routes: ``torch.cat`` of the appended chunks (the cache contents), the closed-form byte count
``2·L·KV·hd·T·B·bytes`` (F12.2), unit 11's **cache-free** ``Llama3Model`` on the whole sequence (the logits
every cached step must reproduce, and the greedy tokens of uncached generation), and per-group means written
out with explicit head slices (MHA→GQA). Models are ``llama3-tiny`` with seeded random weights of a large
scale (clear greedy margins) and, when present, the course's trained character Llama
(``assets/llama_char_tiny.pt``).

Probes build their models inside the worker from a config and a state dict. The cache-aware probes use the
course's ``KVCache`` (an earlier exercise of this unit, not the reference of the exercise being checked), so a
wrong ``KVCache`` costs its own points only. ``generate_cached``'s call pattern (one prefill call, then
``T = 1`` calls) is recorded by a forward pre-hook in the worker and only shapes feedback: points come from
the returned tokens, compared here with uncached greedy tokens computed by the cache-free model.

Contract clauses and the probes that cover them (what is not listed is not graded):

12.KVCache
  - ``update`` appends on dim 2 per layer and returns the layer's full tensors: three chunks (3, 1, 5) in 3 layers;
  - ``seq_len`` follows the appends, 0 when empty; ``reset`` empties (and a new update starts from scratch);
  - ``nbytes`` counts every cached element at its own size: float32 and bfloat16 caches; the dtype is kept.
12.cached_forward
  - keys and shapes of unit 11 kept; without a cache the ordinary forward;
  - ``cache``/``layer_idx``: prefill then single-token steps, and chunked prefill (3, 1, 5, 2, 5), each step equal
    to the cache-free forward at its positions (positions restarted, ``start`` read after layer 0, a top-left
    mask and re-rotated raw keys are named mutants); cached tensors ``(B, KV, T, hd)`` (repeated heads named);
  - ``ValueError`` past the context; no side effects: parameters and buffers unchanged after cached calls.
12.generate_cached
  - tokens equal uncached greedy decoding (seeded weights, two prompts; the trained asset, two prompts in a row);
  - the call pattern: one prefill call, then ``T = 1`` calls with the right cache length (it costs the points: right tokens computed without reusing the cache fail);
  - ``eos_id``: a batch of three rows that produce it at different steps (finished rows keep emitting it; the loop
    stops when every row has; stopping at the first row, ignoring it and not filling are named mutants), and an
    ``eos_id`` no row produces (runs to ``max_new_tokens``);
  - ``max_new_tokens = 0`` returns the prompt; no side effects on the model's parameters and buffers.
12.kv_cache_bytes
  - every argument at non-default values (batch, fp32, fp8) and by keyword; real models (F12.2); an ``int``.
12.mha_to_gqa
  - ``KV == H`` is the identity, ``KV == 1`` the mean; a GQA projection expanded to MHA the way unit 11's
    attention shares KV heads comes back exactly (the strided grouping is a named mutant); KV = 2 and 4 means;
    the converted model's logits.
"""

from __future__ import annotations

import functools

import torch

from ..core import check, module_facts, reference_memo, state_change, unwrap
from ..oracles import float32_atol
from ..runner import also_blocked
from ..strength import decision, defining_property

U = "12"
T = torch.tensor
CHUNKS = (3, 1, 5, 2)


def _ref_kvcache():
    from llmcourse.nn.kv_cache import KVCache

    return {"KVCache": KVCache}


def _ref_cached_forward():
    from llmcourse.models.llama3_cached import CachedGroupedQueryAttention, CachedLlama3Model

    return {"GroupedQueryAttention": CachedGroupedQueryAttention, "Llama3Model": CachedLlama3Model}


def _ref_generate():
    from llmcourse.models.llama3_cached import generate_cached

    return {"generate_cached": generate_cached}


def _ref_bytes():
    from llmcourse.nn.kv_cache import kv_cache_bytes

    return {"kv_cache_bytes": kv_cache_bytes}


def _ref_gqa():
    from llmcourse.nn.kv_cache import mha_to_gqa

    return {"mha_to_gqa": mha_to_gqa}


# ================================================================== 12.KVCache


def _chunks(seed: int, B=2, KV=2, hd=4, n_layers=3, lengths=(3, 1, 5)):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(B, KV, n, hd, generator=g), torch.randn(B, KV, n, hd, generator=g))
             for _ in range(n_layers)] for n in lengths]


def _cache_run(chunks, dtype=None):
    def probe(impl):
        c = impl.KVCache(len(chunks[0]))
        rec = {"empty_len": c.seq_len, "empty_bytes": c.nbytes(), "returned": [], "lens": []}
        for step in chunks:
            for layer, (k, v) in enumerate(step):
                if dtype is not None:
                    k, v = k.to(dtype), v.to(dtype)
                rk, rv = c.update(layer, k.clone(), v.clone())
                rec["returned"].append([rk, rv])
            rec["lens"].append(c.seq_len)
        rec["nbytes"] = c.nbytes()
        c.reset()
        rec["reset"] = [c.seq_len, c.nbytes()]
        k, v = chunks[0][0]
        rk, _ = c.update(0, k.clone(), v.clone())
        rec["after_reset"] = [rk, c.seq_len]
        return rec
    return probe


@check(f"{U}.KVCache", ["KVCache"], _ref_kvcache)
def check_kvcache(t):
    chunks = _chunks(0)
    probe = _cache_run(chunks)
    got = t.run(probe)
    t.expect(isinstance(got, dict) and got["empty_len"] == 0, f"an empty cache must have seq_len 0; got "
             f"{got.get('empty_len') if isinstance(got, dict) else got!r}")
    t.expect(got["empty_bytes"] == 0, f"an empty cache holds 0 bytes; nbytes() returned {got['empty_bytes']!r}")
    i = 0
    for s, step in enumerate(chunks):
        for layer in range(len(step)):
            k_all = torch.cat([chunks[j][layer][0] for j in range(s + 1)], dim=2)
            v_all = torch.cat([chunks[j][layer][1] for j in range(s + 1)], dim=2)
            rk, rv = got["returned"][i]
            t.expect(isinstance(rk, torch.Tensor) and isinstance(rv, torch.Tensor),
                     "update must return the layer's (keys, values) as two tensors")
            t.expect(tuple(rk.shape) == tuple(k_all.shape) and tuple(rv.shape) == tuple(v_all.shape),
                     f"update #{s + 1} of layer {layer}: the returned keys/values must hold every appended token, "
                     f"shape {tuple(k_all.shape)} (appended on dim 2); got {tuple(rk.shape)} / {tuple(rv.shape)}")
            t.expect(torch.equal(rk, k_all) and torch.equal(rv, v_all),
                     f"update #{s + 1} of layer {layer}: the returned tensors must be the earlier keys/values of "
                     "this layer followed by the new ones, in order (each layer has its own slot)")
            i += 1
    lens = [sum((3, 1, 5)[: s + 1]) for s in range(3)]
    t.expect(got["lens"] == lens, f"seq_len after appending chunks of 3, 1 and 5 tokens to every layer must be "
             f"{lens}; got {got['lens']}")
    expected_bytes = 2 * 3 * 2 * 4 * 9 * 2 * 4   # 2 · L · KV · hd · T · B · 4 bytes (float32)
    t.expect(got["nbytes"] == expected_bytes, f"nbytes() of a float32 cache with 3 layers, B=2, KV=2, T=9, hd=4 "
             f"must be 2·3·2·4·9·2·4 = {expected_bytes}; got {got['nbytes']!r}")
    t.expect(got["reset"] == [0, 0], f"after reset() the cache must be empty (seq_len 0, nbytes 0); got "
             f"seq_len {got['reset'][0]!r}, nbytes {got['reset'][1]!r}")
    rk, n = got["after_reset"]
    t.expect(torch.equal(rk, chunks[0][0][0]) and n == 3, "after reset() a new update must start from scratch "
             "(the old keys are gone)")
    half = t.run(_cache_run(_chunks(1, B=1, KV=1, hd=8, n_layers=2, lengths=(4, 2)), dtype=torch.bfloat16))
    expected = 2 * 2 * 1 * 8 * 6 * 1 * 2
    t.expect(half["nbytes"] == expected, f"nbytes() of a bfloat16 cache (2 layers, KV=1, hd=8, T=6) must count 2 "
             f"bytes per element: {expected}; got {half['nbytes']!r}")
    t.expect(half["returned"][-1][0].dtype == torch.bfloat16, "the cache must keep the dtype of the keys it is given")




# ================================================================== model fixtures


def _tiny_cfg() -> dict:
    from llmcourse.models.llama3 import Llama3Config

    return Llama3Config.preset("llama3-tiny").to_dict()


def _seeded_state(cfg: dict, seed: int, std: float = 0.1) -> dict:
    """Random weights of a large scale (every linear and embedding ``std·N(0,1)``, norms ``1 + std·N(0,1)``)."""
    from llmcourse.models.llama3 import Llama3Config, Llama3Model

    model = Llama3Model(Llama3Config(**cfg))
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, p in model.state_dict().items():
        noise = std * torch.randn(p.shape, generator=g)
        state[name] = 1.0 + noise if name.endswith("norm.weight") else noise
    if cfg.get("tie_word_embeddings", True):
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return state


@functools.lru_cache(maxsize=1)
def _asset() -> dict | None:
    """The course's trained character Llama as (config, state, characters), or None when absent."""
    try:
        from llmcourse.train.llama_char import load_llama_char_tiny

        model, tok = load_llama_char_tiny(retrain=False, verbose=False)
    except (ImportError, FileNotFoundError):
        return None
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"cfg": model.cfg.to_dict(), "state": state, "chars": "".join(tok.chars)}


def _plain_model(cfg: dict, state: dict):
    """Unit 11's cache-free model (the independent route), here in the checker."""
    from llmcourse.models.llama3 import Llama3Config, Llama3Model

    m = Llama3Model(Llama3Config(**cfg))
    m.load_state_dict(state)
    return m.eval()


def _learner_model(impl, cfg: dict, state: dict):
    """The learner's Llama3Model with the given weights (inside a probe)."""
    from llmcourse.models.llama3 import Llama3Config

    m = impl.Llama3Model(Llama3Config(**cfg))
    unwrap(m).load_state_dict(state)
    unwrap(m).eval()
    return m


@torch.no_grad()
def _uncached_greedy(model, idx: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        nxt = model(idx)[:, -1, :].argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


# ================================================================== 12.cached_forward


def _steps_probe(cfg, state, idx, chunks):
    """Feed ``idx`` in chunks through one cache; the concatenated logits and the cached key/value shapes."""
    def probe(impl):
        from llmcourse.nn.kv_cache import KVCache

        m = _learner_model(impl, cfg, state)
        cache = KVCache(cfg["n_layers"])
        outs, pos = [], 0
        with torch.no_grad():
            for n in chunks:
                outs.append(m(idx[:, pos:pos + n], cache=cache))
                pos += n
        shapes = [list(k.shape) if isinstance(k, torch.Tensor) else None for k in cache.keys]
        vshapes = [list(v.shape) if isinstance(v, torch.Tensor) else None for v in cache.values]
        return {"logits": torch.cat(outs, dim=1), "k_shapes": shapes, "v_shapes": vshapes}
    return probe


@check(f"{U}.cached_forward", ["GroupedQueryAttention", "Llama3Model"], _ref_cached_forward)
def check_cached_forward(t):
    cfg = _tiny_cfg()
    state = _seeded_state(cfg, 0)
    plain = _plain_model(cfg, state)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg["vocab_size"], (2, 16), generator=g)
    with torch.no_grad():
        full = plain(idx)

    facts = t.run(lambda impl: module_facts(_learner_model(impl, cfg, state)))
    t.expect(facts["is_module"], "Llama3Model must be an nn.Module (extend unit 11's Llama3Model)")
    ref_keys = {k: tuple(v.shape) for k, v in state.items()}
    t.expect(facts["state_dict"] == ref_keys, "Llama3Model must keep unit 11's state_dict keys and shapes (the same "
             "weights load into both); differences: "
             f"{sorted(set(facts['state_dict']) ^ set(ref_keys))[:4] or 'shapes'}")

    # without a cache: the ordinary forward
    t.compare(lambda impl: _learner_model(impl, cfg, state)(idx), full, "forward(idx) without a cache on a (2, 16) "
              "batch of llama3-tiny with seeded weights (unit 11's logits)", atol=1e-5, rtol=1e-5)

    # prefill 4 tokens, then one token at a time
    decode = _steps_probe(cfg, state, idx, [4] + [1] * 12)
    got = t.run(decode)
    t.expect(isinstance(got["logits"], torch.Tensor) and tuple(got["logits"].shape) == tuple(full.shape),
             f"prefill + 12 single-token steps must return logits (2, 1, V) per step; concatenated shape "
             f"{tuple(getattr(got['logits'], 'shape', ()))}, expected {tuple(full.shape)}")
    H, KV, hd = cfg["n_heads"], cfg["n_kv_heads"], cfg["d_model"] // cfg["n_heads"]
    if got["k_shapes"][0] is not None and got["k_shapes"][0][1] == H != KV:
        t.fail(f"the cache holds {H} key heads per layer (shape {got['k_shapes'][0]}): after repeat_kv; cache the "
               f"{KV} key/value heads", bug="B12.cache_after_repeat")
    expected_shape = [2, KV, 16, hd]
    t.expect(all(s == expected_shape for s in got["k_shapes"] + got["v_shapes"]),
             f"after 16 tokens every layer's cached keys and values must have shape (B, KV, T, hd) = "
             f"{tuple(expected_shape)}; got keys {got['k_shapes']}, values {got['v_shapes']}")
    t.compare(decode, full[:, :4], "logits of the 4-token prefill with an empty cache", atol=1e-5, rtol=1e-5,
              pick=lambda o: o["logits"][:, :4])
    t.compare(decode, full, "logits of prefill (4 tokens) then 12 single-token steps, each equal to the uncached "
              "forward on the whole sequence at that position", atol=1e-5, rtol=1e-5, pick=lambda o: o["logits"])

    # chunked prefill 3, 1, 5, 2 (then the rest)
    chunked = _steps_probe(cfg, state, idx, [*CHUNKS, 5])
    t.compare(chunked, full, f"logits of chunked prefill (chunks {', '.join(map(str, CHUNKS))}, 5) through one "
              "cache", atol=1e-5, rtol=1e-5, pick=lambda o: o["logits"])

    # the context limit
    C = cfg["context_length"]

    def too_long(impl):
        from llmcourse.nn.kv_cache import KVCache

        m = _learner_model(impl, cfg, state)
        cache = KVCache(cfg["n_layers"])
        with torch.no_grad():
            m(torch.zeros(1, C - 3, dtype=torch.long), cache=cache)
            m(torch.zeros(1, 5, dtype=torch.long), cache=cache)

    err = t.raised(too_long)
    t.expect(err == "ValueError", f"feeding 5 tokens after {C - 3} cached ones (context_length {C}) must raise "
             f"ValueError (start + T > context_length); got {err}")

    def exactly_full(impl):   # the window filled exactly is allowed: start + T == context_length
        from llmcourse.nn.kv_cache import KVCache

        m = _learner_model(impl, cfg, state)
        cache = KVCache(cfg["n_layers"])
        with torch.no_grad():
            m(torch.zeros(1, C - 3, dtype=torch.long), cache=cache)
            return tuple(m(torch.zeros(1, 3, dtype=torch.long), cache=cache).shape)

    err = t.raised_error(exactly_full)
    t.expect(err is None, f"feeding 3 tokens after {C - 3} cached ones fills the context exactly ({C} positions) and "
             f"must work; got {err and ': '.join(err)}")

    # without a cache the forward is unit 11's, trainable: gradients reach the token embedding
    def grads(impl):
        m = _learner_model(impl, cfg, state)
        out = m(idx[:, :6])
        if not (isinstance(out, torch.Tensor) and out.requires_grad):
            return 0.0
        out.float().pow(2).mean().backward()
        mm = unwrap(m)
        ws = [mm.embed_tokens.weight, mm.layers[0].self_attn.q_proj.weight, mm.layers[0].mlp.gate_proj.weight]
        return min(0.0 if w.grad is None else float(w.grad.abs().sum()) for w in ws)

    t.expect(t.run(grads) > 0, "forward(idx) without a cache must stay differentiable as unit 11's (the logits carry "
             "gradients to the embedding, the attention and the MLP weights): nothing in it may be detached")

    def emb_grad(impl):   # the tied table's gradient: from the head and from the looked-up rows
        m = _learner_model(impl, cfg, state)
        m(idx[:, :6]).float().pow(2).mean().backward()
        return unwrap(m).embed_tokens.weight.grad

    ref_m = _plain_model(cfg, state)
    ref_m(idx[:, :6]).float().pow(2).mean().backward()
    want_g = ref_m.embed_tokens.weight.grad
    t.compare(emb_grad, want_g, "the token embedding's gradient after forward(idx[:, :6]) without a cache (mean "
              "squared logit), vs unit 11's model: the looked-up rows must receive theirs too",
              atol=float32_atol(want_g, 6 * cfg["d_model"]), rtol=1e-4)

    def side(impl):
        from llmcourse.nn.kv_cache import KVCache

        m = _learner_model(impl, cfg, state)
        cache = KVCache(cfg["n_layers"])
        return state_change(m, lambda: [m(idx[:, :5], cache=cache), m(idx[:, 5:6], cache=cache)])

    change = t.run(side)
    t.expect(change == 0.0, f"a prefill and a decoding step changed the model's parameters or buffers (largest change "
             f"{change!r}): the cache is the only state a cached forward may change")


# ================================================================== 12.generate_cached


def _gen_probe(cfg, state, prompts, n):
    """Run the learner's generate_cached on the course's cache-aware model, once per prompt, recording the
    inputs of every model call (token ids and the cache length before the call)."""
    def probe(impl):
        from llmcourse.models.llama3 import Llama3Config
        from llmcourse.models.llama3_cached import CachedLlama3Model

        m = CachedLlama3Model(Llama3Config(**cfg))
        m.load_state_dict(state)
        m.eval()
        calls = []

        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("idx")
            cache = args[1] if len(args) > 1 else kwargs.get("cache")
            calls.append([x.detach().clone() if isinstance(x, torch.Tensor) else None,
                          None if cache is None else int(cache.seq_len)])

        m.register_forward_pre_hook(hook, with_kwargs=True)
        outs, per_prompt = [], []
        for p in prompts:
            start = len(calls)
            outs.append(impl.generate_cached(m, p.clone(), n))
            per_prompt.append(calls[start:])
        return {"out": outs, "calls": per_prompt}
    return probe


def _pattern_problem(calls, prompt: torch.Tensor, out: torch.Tensor) -> tuple[str, str | None] | None:
    """Feedback on the call pattern (returned inputs), or None when it is one prefill and then T = 1 calls."""
    t0 = prompt.shape[1]
    if not calls:
        return "the model was never called", None
    first, cache_len = calls[0]
    if first is None or tuple(first.shape) != tuple(prompt.shape) or not torch.equal(first, prompt):
        return (f"the first model call must be the prefill of the whole prompt {tuple(prompt.shape)}; got "
                f"{tuple(getattr(first, 'shape', ())) or first!r}"), None
    if cache_len is None:
        return "the model was called without a cache: pass a KVCache to every call (cache=...)", "B12.cache_queries"
    if cache_len != 0:
        return (f"the prefill call found {cache_len} tokens already cached: make (or reset) a cache for every "
                "prompt"), "B12.no_reset"
    for i, (x, n_cached) in enumerate(calls[1:], start=1):
        if x is None or x.shape[1] != 1:
            return (f"model call #{i + 1} received {tuple(getattr(x, 'shape', ()))} tokens: after the prefill, feed "
                    "only the newly generated token (T = 1); the cache holds the rest"), "B12.rerun_sequence"
        if n_cached != t0 + i - 1:
            return f"model call #{i + 1} found {n_cached} cached tokens, expected {t0 + i - 1}", None
        if not torch.equal(x[:, 0], out[:, t0 + i - 1]):
            return (f"model call #{i + 1} fed a token that is not the one generated at the previous step "
                    "(after the prefill, feed only the newly generated token)"), "B12.prefill_twice"
    return None


@check(f"{U}.generate_cached", ["generate_cached"], _ref_generate)
def check_generate_cached(t):
    cfg = _tiny_cfg()
    g = torch.Generator().manual_seed(2)
    cases = [("llama3-tiny with seeded random weights", cfg, _seeded_state(cfg, 3), None)]
    asset = _asset()
    if asset is not None:
        cases.append(("the course's trained character Llama", asset["cfg"], asset["state"], asset["chars"]))
    n = 40
    for label, c, state, chars in cases:
        plain = _plain_model(c, state)
        if chars is None:
            prompts = [torch.randint(0, c["vocab_size"], (2, 6), generator=g),
                       torch.randint(0, c["vocab_size"], (2, 9), generator=g)]
        else:   # the same batch size twice: a cache kept from the first prompt shows up as wrong tokens
            prompts = [T([[chars.index(ch) for ch in "ROMEO:"]]), T([[chars.index(ch) for ch in "JULIET:\n"]])]
        probe = _gen_probe(c, state, prompts, n)
        got = t.run(probe)
        for j, (p, out) in enumerate(zip(prompts, got["out"])):
            what = f"greedy generation of {n} tokens from a {tuple(p.shape)} prompt ({label}"
            what += ", second call with a new prompt)" if j else ")"
            t.expect(isinstance(out, torch.Tensor) and not out.is_floating_point(),
                     f"generate_cached must return a tensor of token ids; got {getattr(out, 'dtype', type(out))}")
            t.expect(tuple(out.shape) == (p.shape[0], p.shape[1] + n), f"{what}: expected shape "
                     f"{(p.shape[0], p.shape[1] + n)} (prompt + {n} new tokens); got {tuple(out.shape)}")
            expected = reference_memo("12.greedy", c, state, p, n, compute=lambda p=p, m=plain: _uncached_greedy(m, p.clone(), n))
            if not torch.equal(out, expected):
                bug = t.diagnose(probe, out, pick=lambda o, jj=j: o["out"][jj])
                first = int((out != expected).nonzero()[0, 1]) - p.shape[1]
                t.fail(f"{what}: the tokens differ from uncached greedy decoding from new token {first} on",
                       bug=bug)
            problem = _pattern_problem(got["calls"][j], p, out)
            if problem is not None:
                t.fail(f"{what}: the tokens are right, but {problem[0]}", bug=problem[1])
            n_calls, n_new = len(got["calls"][j]), out.shape[1] - p.shape[1]
            t.expect(n_calls == n_new, f"{what}: the tokens are right, but the model was called {n_calls} times for "
                     f"{n_new} new tokens: the prefill gives the first, each further call one more, and the last new "
                     "token is never fed (its logits would not be used)")
    _check_eos(t, cfg, cases[0][2])

    def side(impl):
        m = _plain_cached(cfg, cases[0][2])
        return state_change(m, lambda: impl.generate_cached(m, T([[1, 2, 3]]), 5))

    change = t.run(side)
    t.expect(change == 0.0, f"generate_cached changed the model's parameters or buffers (largest change {change!r})")
    zero = t.run(_gen_probe(cfg, cases[0][2], [T([[1, 2, 3]])], 0))
    t.expect(isinstance(zero["out"][0], torch.Tensor) and zero["out"][0].tolist() == [[1, 2, 3]],
             "max_new_tokens=0 must return the prompt unchanged")
    t.expect(len(zero["calls"][0]) == 0, f"max_new_tokens=0 needs no model call (nothing is generated); the model was "
             f"called {len(zero['calls'][0])} time(s)")
    one_p = T([[1, 2, 3]])
    one = t.run(_gen_probe(cfg, cases[0][2], [one_p], 1))
    want_one = _uncached_greedy(_plain_model(cfg, cases[0][2]), one_p.clone(), 1)
    t.expect(isinstance(one["out"][0], torch.Tensor) and torch.equal(one["out"][0], want_one)
             and len(one["calls"][0]) == 1, f"max_new_tokens=1: one model call (the prefill) and one new token "
             f"{want_one[0, -1].item()}; got {getattr(one['out'][0], 'tolist', lambda: one['out'][0])()} after "
             f"{len(one['calls'][0])} call(s)")


def _eos_case(plain, vocab_size: int, n: int):
    """A batch of three prompts and a token that their greedy continuations produce first at three different
    steps (all before the last), found by search over seeded prompts; plus a token no row produces."""
    g = torch.Generator().manual_seed(7)
    for _ in range(50):
        prompts = torch.randint(0, vocab_size, (3, 5), generator=g)
        gen = _uncached_greedy(plain, prompts.clone(), n)[:, 5:]
        for tok in range(vocab_size):
            hits = [(row == tok).nonzero() for row in gen]
            if all(len(h) for h in hits):
                firsts = [int(h[0]) for h in hits]
                if len(set(firsts)) == 3 and max(firsts) < n - 2 and min(firsts) > 0:
                    absent = [v for v in range(vocab_size) if not bool((gen == v).any())]
                    return prompts, gen, tok, firsts, (absent[0] if absent else None)
    raise RuntimeError("grader bug: no EOS case found")


def _with_eos(prompts, gen, eos, firsts):
    """The EOS rule applied to tokens generated without it: a row keeps emitting eos after its first one; the
    sequence ends at the step where the last row produced it."""
    steps = max(firsts) + 1
    out = gen[:, :steps].clone()
    for r, f in enumerate(firsts):
        out[r, f:] = eos
    return torch.cat([prompts, out], dim=1)


def _check_eos(t, cfg, state):
    n = 30
    plain = _plain_model(cfg, state)
    prompts, gen, eos, firsts, absent = reference_memo("12.eos_case", cfg, state, n, compute=lambda: _eos_case(plain, cfg["vocab_size"], n))
    expected = _with_eos(prompts, gen, eos, firsts)

    def probe(impl):
        return impl.generate_cached(_plain_cached(cfg, state), prompts.clone(), n, eos_id=eos)

    got = t.run(probe)
    what = (f"eos_id={eos} with a batch of 3 rows whose greedy tokens reach it at new tokens {firsts}: each row keeps "
            f"emitting eos_id after its first one and generation stops once every row has (expected shape "
            f"{tuple(expected.shape)})")
    t.expect(isinstance(got, torch.Tensor), f"{what}; got {type(got).__name__}")
    if tuple(got.shape) != tuple(expected.shape) or not torch.equal(got, expected):
        t.fail(f"{what}; got shape {tuple(got.shape)}", bug=t.diagnose(probe, got))
    if absent is not None:
        full = t.run(lambda impl: impl.generate_cached(_plain_cached(cfg, state), prompts.clone(), n, eos_id=absent))
        t.expect(isinstance(full, torch.Tensor) and tuple(full.shape) == (3, 5 + n) and torch.equal(full[:, 5:], gen),
                 f"eos_id={absent}, a token no row produces: generation must run to max_new_tokens = {n} with the "
                 f"ordinary greedy tokens; got {tuple(getattr(full, 'shape', ()))}")


def _plain_cached(cfg, state):
    from llmcourse.models.llama3 import Llama3Config
    from llmcourse.models.llama3_cached import CachedLlama3Model

    m = CachedLlama3Model(Llama3Config(**cfg))
    m.load_state_dict(state)
    return m.eval()


# ================================================================== 12.kv_cache_bytes

KIB, MIB, GIB = 1024, 1024**2, 1024**3
F122 = [  # (what, args, expected bytes)
    ("GPT-2 small per token (12 layers, 12 heads, hd 64, bf16)", (12, 12, 64, 1), 36 * KIB),
    ("GPT-2 small at 1,024 tokens (bf16)", (12, 12, 64, 1024), 36 * MIB),
    ("GPT-2 small at 1,024 tokens in fp32", (12, 12, 64, 1024, 1, 4), 72 * MIB),
    ("Llama-3.2-1B per token (16 layers, 8 KV heads, hd 64)", (16, 8, 64, 1), 32 * KIB),
    ("Llama-3.2-1B at 8,192 tokens", (16, 8, 64, 8192), 256 * MIB),
    ("Llama-3.2-1B at 131,072 tokens", (16, 8, 64, 131072), 4 * GIB),
    ("Llama-3.2-3B per token (28 layers, 8 KV heads, hd 128)", (28, 8, 128, 1), 112 * KIB),
    ("Llama-3.2-3B at 8,192 tokens", (28, 8, 128, 8192), 896 * MIB),
    ("Llama-3-8B at 8,192 tokens (32 layers, 8 KV heads, hd 128)", (32, 8, 128, 8192), 1 * GIB),
    ("a batch of 4 sequences of 100 tokens, fp8 (3 layers, 2 KV heads, hd 16)", (3, 2, 16, 100, 4, 1), 76800),
]


@check(f"{U}.kv_cache_bytes", ["kv_cache_bytes"], _ref_bytes)
def check_kv_cache_bytes(t):
    for what, args, expected in F122:
        got = t.run(lambda impl, a=args: impl.kv_cache_bytes(*a))
        t.expect(isinstance(got, int) and not isinstance(got, bool),
                 f"kv_cache_bytes must return an int (bytes); got {type(got).__name__} {got!r}")
        if got != expected:
            bug = t.diagnose(lambda impl, a=args: impl.kv_cache_bytes(*a), got)
            t.fail(f"{what}: expected {expected:,} bytes, got {got:,}", bug=bug)
    kw = t.run(lambda impl: impl.kv_cache_bytes(n_layers=2, n_kv_heads=3, head_dim=4, seq_len=5, batch_size=6,
                                                bytes_per_elem=4))
    t.expect(kw == 2 * 2 * 3 * 4 * 5 * 6 * 4, f"keyword arguments (n_layers=2, n_kv_heads=3, head_dim=4, seq_len=5, "
             f"batch_size=6, bytes_per_elem=4): expected {2 * 2 * 3 * 4 * 5 * 6 * 4}, got {kw!r}")


# ================================================================== 12.mha_to_gqa


def _pooled(w: torch.Tensor, H: int, KV: int) -> torch.Tensor:
    """Group g = mean of the row blocks of heads g·r … g·r+r−1 (written out head by head)."""
    hd, r = w.shape[0] // H, H // KV
    groups = [sum(w[h * hd:(h + 1) * hd] for h in range(g * r, (g + 1) * r)) / r for g in range(KV)]
    return torch.cat(groups, dim=0)


@check(f"{U}.mha_to_gqa", ["mha_to_gqa"], _ref_gqa)
def check_mha_to_gqa(t):
    g = torch.Generator().manual_seed(5)
    H, hd, D = 8, 4, 12
    wk, wv = torch.randn(H * hd, D, generator=g), torch.randn(H * hd, D, generator=g)
    same = t.run(lambda impl: impl.mha_to_gqa(wk.clone(), wv.clone(), H, H))
    t.expect(isinstance(same, (tuple, list)) and len(same) == 2, "mha_to_gqa must return a pair (k_weight, v_weight)")
    t.compare(lambda impl: impl.mha_to_gqa(wk.clone(), wv.clone(), H, H), [wk, wv],
              "n_kv_heads == n_heads must return the weights unchanged", atol=0, rtol=0)
    t.compare(lambda impl: impl.mha_to_gqa(wk.clone(), wv.clone(), H, 1), [_pooled(wk, H, 1), _pooled(wv, H, 1)],
              "n_kv_heads == 1 (MQA): the mean over all heads", atol=1e-6, rtol=1e-6)
    # a grouped-query projection written out as multi-head attention (each query head given a copy of the KV head
    # that serves it in unit 11's attention) must come back exactly
    gk, gv = torch.randn(2 * hd, D, generator=g), torch.randn(2 * hd, D, generator=g)
    disguised = [torch.repeat_interleave(w.view(2, hd, D), H // 2, dim=0).reshape(H * hd, D) for w in (gk, gv)]
    t.compare(lambda impl: impl.mha_to_gqa(disguised[0].clone(), disguised[1].clone(), H, 2), [gk, gv],
              "H=8 -> KV=2 on key/value projections that already are a 2-KV-head layer written out for 8 query heads "
              "(query head h holds a copy of the KV head that serves it in unit 11's attention): the conversion must "
              "return the 2 original heads", atol=1e-6, rtol=1e-6)
    for KV in (2, 4):
        t.compare(lambda impl, kv=KV: impl.mha_to_gqa(wk.clone(), wv.clone(), H, kv),
                  [_pooled(wk, H, KV), _pooled(wv, H, KV)],
                  f"H=8 -> KV={KV}: KV head g must be the mean of the contiguous query heads g·{H // KV} … "
                  f"g·{H // KV}+{H // KV - 1} (the grouping of repeat_interleave)", atol=1e-6, rtol=1e-6)

    # the converted model runs: llama3-tiny built as MHA (KV=4), converted to KV=2, evaluated by unit 11's model
    from llmcourse.models.llama3 import Llama3Config

    mha_cfg = Llama3Config.preset("llama3-tiny").to_dict() | {"n_kv_heads": 4}
    gqa_cfg = dict(mha_cfg, n_kv_heads=2)
    state = _seeded_state(mha_cfg, 6)
    idx = torch.randint(0, 65, (1, 10), generator=g)

    def convert(impl):
        new = dict(state)
        for i in range(mha_cfg["n_layers"]):
            p = f"layers.{i}.self_attn."
            k, v = impl.mha_to_gqa(state[p + "k_proj.weight"].clone(), state[p + "v_proj.weight"].clone(), 4, 2)
            new[p + "k_proj.weight"], new[p + "v_proj.weight"] = k, v
        return {k: new[k] for k in new if "k_proj" in k or "v_proj" in k}

    conv = dict(state)
    for i in range(mha_cfg["n_layers"]):
        p = f"layers.{i}.self_attn."
        conv[p + "k_proj.weight"] = _pooled(state[p + "k_proj.weight"], 4, 2)
        conv[p + "v_proj.weight"] = _pooled(state[p + "v_proj.weight"], 4, 2)
    got = t.run(convert)
    with torch.no_grad():
        expected_logits = _plain_model(gqa_cfg, conv)(idx)
        try:
            logits = _plain_model(gqa_cfg, {**state, **got})(idx)
        except (RuntimeError, KeyError) as exc:
            t.fail(f"the converted weights do not load into a Llama3Model with n_kv_heads=2: {str(exc)[:200]}")
    if not torch.allclose(logits, expected_logits, atol=1e-5):
        probe = lambda impl: impl.mha_to_gqa(wk.clone(), wv.clone(), H, 2)  # noqa: E731
        t.fail("a llama3-tiny built with 4 KV heads, converted to 2 by your mha_to_gqa, gives other logits than the "
               "mean-pooled model", bug=t.diagnose(probe, t.run(probe)))


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# generate_cached: the benchmark's prefill-then-one-token loop
also_blocked(f"{U}.generate_cached", "coursetools.bench.capstone:_greedy_with_cache")
# kv_cache_bytes: the per-token element counts (times seq_len, batch and bytes is the answer)
also_blocked(f"{U}.kv_cache_bytes",
             "llmcourse.nn.kv_cache:kv_elements_per_token",
             "llmcourse.nn.kv_cache:attn_cache_elems_per_token",
             "llmcourse.viz.llama:kv_bytes_per_token")
# (llmcourse.nn.kv_cache.decode_step_bytes, the roofline's bytes per step, calls kv_cache_bytes itself: refused
# through the reference, tests/test_blocked_siblings.py)


# ================================================================== grading strength (grader/strength.py)
defining_property(f"{U}.KVCache", "keys and values appended per layer along the sequence axis, their length and bytes "
                  "measured from what is held", probe="sequences of updates in several layers and dtypes; seq_len "
                  "after chunks; nbytes in bfloat16; reset")
defining_property(f"{U}.cached_forward", "feeding a sequence in pieces through one cache gives the cache-free logits, "
                  "position by position", probe="prefill then single-token steps and chunked prefill vs the uncached "
                  "forward at every position; the cached tensors' shapes; ValueError past the context")
defining_property(f"{U}.generate_cached", "one prefill, then one call per new token that reuses the cache, equal to "
                  "uncached greedy decoding", probe="tokens vs uncached greedy (seeded and trained models, two prompts "
                  "in a row); every model call recorded (inputs and cached length); EOS rows")
defining_property(f"{U}.kv_cache_bytes", "the cache's size follows from its shapes: K and V per layer, KV head, "
                  "position and sequence", probe="predictions vs caches filled and measured, each size varied, real "
                  "models' configs")
defining_property(f"{U}.mha_to_gqa", "MHA heads averaged in the groups unit 11's attention shares, so a GQA layer "
                  "written out as MHA comes back exactly", probe="the written-out GQA layer round trip; KV = H; KV = 1")
decision(f"{U}.mha_to_gqa", "which heads form a group (contiguous: heads g*H/KV ... (g+1)*H/KV - 1)",
         forms=[r"contiguous groups?", r"each group of `?H ?/ ?KV`? consecutive", r"reshape\(n_kv_heads, ?n_heads ?// ?n_kv_heads", r"consecutive heads form"],
         wrong=("B12.gqa_strided_groups",))
decision(f"{U}.kv_cache_bytes", "the formula of the cache's size",
         forms=[r"2 ?\* ?n_layers ?\* ?n_kv_heads ?\* ?head_dim", r"2 ?[*·] ?L ?[*·] ?KV ?[*·] ?hd ?[*·] ?T"],
         wrong=("B12.bytes_no_factor2", "B12.bytes_ignores_batch"))
