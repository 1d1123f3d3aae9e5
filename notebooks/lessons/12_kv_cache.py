# %% [markdown]
# # Unit 12 — The KV cache: MHA, MQA and GQA
#
# Unit 09's generation loop feeds the **whole** sequence to the model at every step, and unit 11's Llama
# recomputes every position each time. Almost all of that work is thrown away: only the last position's
# logits choose the next token. This lesson removes the waste with a **key/value cache**:
#
# 1. the inference loop revisited: which rows of the attention matrix a new token needs;
# 2. why only keys and values are cached, never queries;
# 3. prefill and decode, and chunked prefill;
# 4. absolute positions with a cache: RoPE offsets and bottom-right causal masks;
# 5. the `KVCache` object: after RoPE, before `repeat_kv`;
# 6. the equality test: cache == no cache, token by token;
# 7. the cost per step and in total;
# 8. memory: measured cache sizes, a calculator for real models, MQA and GQA as reducers, MHA → GQA conversion
#    and what it costs before and after a short fine-tuning;
# 9. the measured speedup and its limits;
# 10. why fewer KV heads decode faster: bytes read per token against the machine's memory bandwidth (a roofline).
#
# We use the course's trained character Llama (unit 11's architecture at `llama3-tiny` size, trained on
# Shakespeare) and the finished cache-aware classes from `llmcourse.models.llama3_cached`. The exercise
# notebook (`exercises/12_kv_cache/12_kv_cache.ipynb`) asks you to write the cache, the cached forward pass,
# cached generation, the memory formula and the MHA → GQA conversion yourself.
#
# Cells marked **Spot the bug** show a mistake from popular write-ups: run the buggy cell, see which
# property breaks, then repair it in the cell marked **Your fix** and run the self-check below it.

# %%
import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import llmcourse
from llmcourse.models.llama3 import Llama3Config, Llama3Model
from llmcourse.models.llama3_cached import CachedLlama3Model, generate_cached, generate_uncached
from llmcourse.nn.kv_cache import KV_PRESETS, KVCache, kv_cache_bytes, mha_to_gqa
from llmcourse.nn.masks import causal_mask
from llmcourse.train.llama_char import load_llama_char_tiny
from llmcourse.viz import kv_cache as viz

cfg = llmcourse.setup_notebook("12")
try:   # the course's trained character Llama (assets/llama_char_tiny.pt)
    model, tok = load_llama_char_tiny(retrain=False)
    encode, decode = tok.encode, tok.decode
    trained = True
except FileNotFoundError:   # without the asset: seeded random weights of the same shape
    torch.manual_seed(0)
    model = Llama3Model(Llama3Config.preset("llama3-tiny")).eval()
    chars = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    encode = lambda s: [chars.index(c) for c in s]  # noqa: E731
    decode = lambda ids: "".join(chars[i] for i in ids)  # noqa: E731
    trained = False
mcfg = model.cfg
fast = CachedLlama3Model(mcfg).eval()          # the same weights in the cache-aware class
fast.load_state_dict(model.state_dict())
n_params = sum(p.numel() for p in model.parameters())
print(f"{'trained' if trained else 'random (asset missing)'} Llama: {n_params:,} parameters, {mcfg.n_layers} layers, "
      f"{mcfg.n_heads} query heads, {mcfg.n_kv_heads} KV heads of size {mcfg.hd}, context {mcfg.context_length}")
cfg

# %% [markdown]
# ## 1. The inference loop revisited
#
# Without a cache, step `t` of greedy decoding runs the model on all `t` tokens and keeps one row of the
# `(B, t, V)` logits. A causal model's earlier rows do not depend on later tokens, so they come out exactly
# as in the previous step: recomputed and discarded. Check it on the trained model: append one token and
# compare the logits of the old positions.

# %%
prompt = torch.tensor([encode("ROMEO:\nWhat light")])
with torch.no_grad():
    before = model(prompt)
    after = model(torch.cat([prompt, torch.tensor([[encode(" ")[0]]])], dim=1))
same_rows = (after[:, :-1] - before).abs().max().item()
print(f"{prompt.shape[1]} old positions, max |change| of their logits after appending a token: {same_rows:.1e}")
print(f"useful rows per step: 1 of {after.shape[1]}")

# %% [markdown]
# Inside attention the same holds row by row: the new token's output is one **query row** against every
# key. The rows of the earlier tokens are finished.
#
# ## 2. Why only K and V
#
# The new token's attention output needs its own query `q_t` and the keys and values of **all** positions
# `0 … t`. Past queries are never used again: no later token reads them. Past keys and values are reused at
# every later step, so we keep them, and each step computes one new `q`, one new `k` and one new `v` per layer.
#
# Keeping them is exact only if they never change when tokens are appended. What do they depend on? At
# layer 0 a key is a function of its own token and position. At layer 1 and above it is computed from the
# previous layer's output at that position, which attended over **every earlier token**: a cached key of
# layer 1 changes when an earlier token changes. What it never depends on is a **later** position, because
# every layer masks the future. That property, causality, is what makes the cache exact: appending a token
# (a later position) leaves every stored key and value as it was.
#
# A numerical check on the cache-aware model: fill a cache with a prompt, then with the same prompt with
# its **first** token changed, then with its **last** token changed, and compare the keys stored for the
# position just before the last one, layer by layer.

# %%
def cached_keys(ids):
    c = KVCache(mcfg.n_layers)
    with torch.no_grad():
        fast(ids, cache=c)
    return c.keys


T0 = prompt.shape[1]
other = (prompt[0, 0] + 1) % mcfg.vocab_size
first_changed, last_changed = prompt.clone(), prompt.clone()
first_changed[0, 0], last_changed[0, -1] = other, (prompt[0, -1] + 1) % mcfg.vocab_size
keys, keys_first, keys_last = cached_keys(prompt), cached_keys(first_changed), cached_keys(last_changed)
p_ = T0 - 2   # the position just before the last one
for layer in range(mcfg.n_layers):
    earlier = (keys_first[layer][:, :, p_] - keys[layer][:, :, p_]).abs().max().item()
    later = (keys_last[layer][:, :, p_] - keys[layer][:, :, p_]).abs().max().item()
    print(f"layer {layer}: key of position {p_} moves by {earlier:.2e} when token 0 changes, "
          f"by {later:.1e} when token {T0 - 1} changes")
    assert later < 1e-6 and (earlier < 1e-6 if layer == 0 else earlier > 1e-4)
print(f"per layer and token: one query of {mcfg.n_heads}×{mcfg.hd}, one key and one value of "
      f"{mcfg.n_kv_heads}×{mcfg.hd} each")

# %% [markdown]
# ## 3. Prefill and decode
#
# Generation with a cache has two phases:
#
# - **prefill**: one forward pass over the whole prompt (`T = T0`) fills every layer's cache and gives the
#   logits of the first new token;
# - **decode**: one forward pass per new token with `T = 1`; each layer appends one key and one value and
#   attends over everything cached.
#
# A long prompt can also be prefilled in **chunks** (to bound memory or interleave requests): each chunk
# continues the cached sequence. Whatever the split, the logits must be those of the cache-free model on the
# whole sequence. The cache-aware model `fast` holds the same weights as `model`:

# %%
text = torch.tensor([encode("JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?")])
with torch.no_grad():
    reference = model(text)
    splits = {"prefill all": [text.shape[1]], "prefill 8, then 1 at a time": [8] + [1] * (text.shape[1] - 8),
              "chunks 3, 1, 5, 2, rest": [3, 1, 5, 2, text.shape[1] - 11]}
    for name, chunks in splits.items():
        cache, outs, pos = KVCache(mcfg.n_layers), [], 0
        for n in chunks:
            outs.append(fast(text[:, pos:pos + n], cache=cache))
            pos += n
        gap = (torch.cat(outs, dim=1) - reference).abs().max().item()
        print(f"{name:>28}: {len(chunks):3d} calls, max |logit difference| {gap:.1e}")

# %% [markdown]
# ### Spot the bug: a chunked prefill that drifts
#
# The helper below prefills a long prompt chunk by chunk. After it, the cache should hold exactly the prompt,
# and the logits of the last position should be those of the cache-free model (they choose the first new
# token). Neither holds. One thing in it is wrong, unmarked. Run it: the cell prints how many positions the
# cache holds, the logit gap and the first new token each way.

# %%
def chunked_prefill(model, ids, chunk=8):
    """Prefill a prompt through one cache, `chunk` tokens per call (bounded memory): (cache, logits of the last prompt position, the index range of every chunk)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    T = ids.shape[1]
    if T > model.cfg.context_length:
        raise ValueError(f"a prompt of {T} tokens does not fit the context {model.cfg.context_length}")
    cache = KVCache(model.cfg.n_layers)
    fed = []                      # (first, last) prompt index of every chunk, for the log
    last = None
    with torch.no_grad():
        for s in range(0, T, chunk):
            first = max(s - 1, 0)     # each chunk starts with the token before it, for context
            fed.append((first, min(s + chunk, T) - 1))
            last = model(ids[:, first:s + chunk], cache)[:, -1]
    return cache, last, fed


long_prompt = text[:, :40]
with torch.no_grad():
    want_last = model(long_prompt)[:, -1]


def self_check_chunked(prefill) -> bool:
    """✓ when the chunked prefill caches exactly the prompt and gives the cache-free logits of its last position."""
    try:
        cache_, last_, _ = prefill(fast, long_prompt)
        gap_ = (last_ - want_last).abs().max().item()
        ok = cache_.seq_len == long_prompt.shape[1] and gap_ < 1e-4
    except Exception as exc:   # a self-check never raises
        print(f"✗ not yet: it raised {type(exc).__name__}: {exc}")
        return False
    print(f"✓ {cache_.seq_len} positions cached, logit gap {gap_:.1e}" if ok else
          f"✗ not yet: {cache_.seq_len} positions cached for a {long_prompt.shape[1]}-token prompt, logit gap {gap_:.3g}")
    return ok


cache_b, last_b, fed_b = chunked_prefill(fast, long_prompt)
print(f"prompt of {long_prompt.shape[1]} tokens; cache after the prefill: {cache_b.seq_len} positions")
print(f"last-position logits: max gap {(last_b - want_last).abs().max().item():.3g} from the cache-free model; "
      f"first new token {decode([int(last_b.argmax())])!r} after the chunks, {decode([int(want_last.argmax())])!r} "
      "without a cache")
print("chunks fed:", fed_b)

# %% [markdown]
# **Your turn.** Fix the copy below (`chunked_prefill_fixed`) and run the self-check. Ask what the cache
# already holds when a chunk arrives, and which absolute positions the model gives the chunk's tokens.

# %%
# TODO: find the one bug and fix it in this copy
def chunked_prefill_fixed(model, ids, chunk=8):
    """TODO: the same helper with its one bug fixed."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    T = ids.shape[1]
    if T > model.cfg.context_length:
        raise ValueError(f"a prompt of {T} tokens does not fit the context {model.cfg.context_length}")
    cache = KVCache(model.cfg.n_layers)
    fed = []                      # (first, last) prompt index of every chunk, for the log
    last = None
    with torch.no_grad():
        for s in range(0, T, chunk):
            first = max(s - 1, 0)     # each chunk starts with the token before it, for context
            fed.append((first, min(s + chunk, T) - 1))
            last = model(ids[:, first:s + chunk], cache)[:, -1]
    return cache, last, fed


self_check_chunked(chunked_prefill_fixed);

# %% jupyter={"source_hidden": true}
# Reference fix: the cache already carries the context of every earlier chunk, so a chunk must bring only new
# tokens. Re-feeding the token before each chunk stores it twice and shifts every later position by one per
# chunk: the model then reads a prompt that was never written, at positions it never had.
def chunked_prefill_reference(model, ids, chunk=8):
    """Prefill a prompt through one cache, `chunk` tokens per call (bounded memory): (cache, logits of the last prompt position, the index range of every chunk)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    T = ids.shape[1]
    if T > model.cfg.context_length:
        raise ValueError(f"a prompt of {T} tokens does not fit the context {model.cfg.context_length}")
    cache = KVCache(model.cfg.n_layers)
    fed = []                      # (first, last) prompt index of every chunk, for the log
    last = None
    with torch.no_grad():
        for s in range(0, T, chunk):
            first = s
            fed.append((first, min(s + chunk, T) - 1))
            last = model(ids[:, first:s + chunk], cache)[:, -1]
    return cache, last, fed


assert self_check_chunked(chunked_prefill_reference)

# %% [markdown]
# ## 4. Positions with a cache
#
# A chunk of `T` new tokens continues a cache that already holds `start` positions, so its tokens sit at
# absolute positions `start … start+T−1`. Two things depend on it:
#
# - **RoPE** rotates the new queries and keys by their absolute positions: rows `start … start+T−1` of the
#   model's cos/sin tables;
# - the **causal mask** has `T` query rows and `start + T` key columns, and query `i` (position `start + i`)
#   may see keys `0 … start + i`: the lower triangle aligned to the **bottom-right** corner.
#
# `start` is the cache length **before** the call. Read it once, before layer 0 appends its keys: after that
# append, the cache already counts the new tokens, and layers 1, 2, … would be shifted by `T`.

# %%
for t_q, t_k in ((1, 5), (3, 5)):
    print(f"causal_mask({t_q}, {t_k}):\n{causal_mask(t_q, t_k).int()}")
print("top-left alignment (offset 0) of the same shape:\n", causal_mask(3, 5, offset=0).int())

# %% [markdown]
# ### Spot the bug: `is_causal=True` for a decoding step
#
# `F.scaled_dot_product_attention(q, k, v, is_causal=True)` builds its mask from the **top-left** corner.
# With as many queries as keys that is the usual causal mask. During decoding there is 1 query and `start + 1`
# keys, and the top-left mask lets that query see only key 0. Run it on the cached keys of layer 0:

# %%
with torch.no_grad():
    cache = KVCache(mcfg.n_layers)
    fast(text[:, :-1], cache=cache)                 # prefill all but the last token
    start = cache.seq_len
    last = text[:, -1:]
    x = fast.layers[0].input_layernorm(fast.embed_tokens(last))
    q_new, k_new, v_new = fast.layers[0].self_attn.project(x, fast.rope_cos[start:start + 1],
                                                          fast.rope_sin[start:start + 1])
    k_all = torch.cat([cache.keys[0], k_new], dim=2)
    v_all = torch.cat([cache.values[0], v_new], dim=2)


def decode_attention_buggy(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def sees_whole_prefix(attend) -> bool:
    """The property: one decoding query attends over every cached key (compare with explicit softmax weights)."""
    n_rep = q_new.shape[1] // k_all.shape[1]
    kk, vv = k_all.repeat_interleave(n_rep, 1), v_all.repeat_interleave(n_rep, 1)
    weights = torch.softmax(q_new @ kk.transpose(-1, -2) / math.sqrt(q_new.shape[-1]), dim=-1)
    return torch.allclose(attend(q_new, k_all, v_all), weights @ vv, atol=1e-5)


print(f"1 query over {k_all.shape[2]} keys; attends over the whole prefix: {sees_whole_prefix(decode_attention_buggy)}")

# %% [markdown]
# **Your fix.** Rewrite `decode_attention` so that the `T_q` new queries (the last `T_q` positions) see every
# key up to their own position, for any number of cached keys. Then run the self-check.

# %%
def decode_attention(q, k, v):
    # TODO: align the causal mask with the END of the keys
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def self_check_decode_attention(attend=None):
    attend = attend or decode_attention
    g = torch.Generator().manual_seed(0)
    q3, k3, v3 = (torch.randn(1, 4, 3, 8, generator=g), torch.randn(1, 2, 7, 8, generator=g),
                  torch.randn(1, 2, 7, 8, generator=g))
    kk, vv = k3.repeat_interleave(2, 1), v3.repeat_interleave(2, 1)
    s = (q3 @ kk.transpose(-1, -2) / math.sqrt(8)).masked_fill(~torch.ones(3, 7, dtype=torch.bool).tril(4),
                                                               float("-inf"))
    ok = sees_whole_prefix(attend) and torch.allclose(attend(q3, k3, v3), torch.softmax(s, -1) @ vv, atol=1e-5)
    print("✓ decode attention is fixed" if ok else "✗ not yet: the last query must see every key")
    return ok


self_check_decode_attention();

# %% jupyter={"source_hidden": true}
# Reference fix: the bottom-right causal mask (offset = T_k - T_q) instead of SDPA's top-left is_causal.
def decode_attention_reference(q, k, v):
    mask = causal_mask(q.shape[2], k.shape[2], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


assert self_check_decode_attention(decode_attention_reference)

# %% [markdown]
# ## 5. The `KVCache` object
#
# The course's `KVCache` keeps one key tensor and one value tensor per layer, each `(B, KV, T, hd)`, and
# appends new positions on dim 2. Two placement rules:
#
# - cache keys **after RoPE**: each key is rotated once, at its own position, and never touched again;
# - cache **before `repeat_kv`**: store the `KV` key/value heads, and let attention share each of them with its
#   `H/KV` query heads (SDPA's `enable_gqa=True` does this without copying).
#
# Here is a cache after prefilling the prompt; the animation steps through prefill and decoding on the
# trained model (grey: already cached; orange: appended by the current call; right: the new queries'
# attention over the cached keys, layer 0, head 0).

# %%
cache = KVCache(mcfg.n_layers)
with torch.no_grad():
    fast(prompt, cache=cache)
print(cache)
print(f"keys per layer {tuple(cache.keys[0].shape)}; {cache.nbytes():,} bytes in float32 "
      f"(after repeat_kv it would be {cache.nbytes() * mcfg.n_heads // mcfg.n_kv_heads:,})")
frames = viz.cache_animation_frames(fast, torch.tensor([encode("ROMEO:")]), cfg["animation_steps"])
viz.show_cache_animation(frames, decode=decode)

# %% [markdown]
# ## 6. Cache == no cache, token by token
#
# The test that matters: greedy generation with the cache must produce **exactly** the tokens of generation
# without it. (`generate_cached` makes one prefill call and then one call per token; `generate_uncached`
# runs the whole sequence every step.)

# %%
n_check = min(cfg["check_tokens"], mcfg.context_length - prompt.shape[1])
with_cache = generate_cached(fast, prompt, n_check)
without_cache = generate_uncached(model, prompt, n_check)
print(f"{n_check} greedy tokens, identical: {torch.equal(with_cache, without_cache)}")
print(decode(with_cache[0].tolist()))

# %% [markdown]
# ## 7. Cost per step
#
# Count multiply-adds per layer for a model of width `D` (attention width `H·hd = D`) when a call feeds
# `T_new` tokens and attention covers `t` keys:
#
# | | projections and MLP | attention scores and weighted sum |
# |---|---|---|
# | without cache (`T_new = t`) | `O(t·D²)` (every position again) | `O(t²·D)` (the whole `t×t` matrix) |
# | with cache (`T_new = 1`) | `O(D²)` (one position) | `O(t·D)` (one query row) |
#
# Which calls does generating `n` tokens after a `t0`-token prompt make? The `j`-th new token (`j = 1 … n`)
# is chosen from the logits of a sequence of `t0 + j − 1` tokens, and the last new token is never fed back.
# So the uncached loop runs the model on `t = t0, t0+1, …, t0+n−1` tokens (`n` calls); the cached loop runs
# one prefill over `t0` tokens and then `n − 1` single-token calls over `t = t0+1, …, t0+n−1` keys. Summed, the
# uncached loop costs `O(n²·D² + n³·D)` and the cached one `O(n·D² + n²·D)`: one power of `n` less. For the
# trained model, counting only the matrix products:

# %%
def macs_per_call(t_new, t, c=mcfg):
    """Multiply-adds of one forward call that feeds t_new tokens and attends over t keys (matrix products only)."""
    D, I, H, KV, hd = c.d_model, c.intermediate_size, c.n_heads, c.n_kv_heads, c.hd
    proj = D * (H + 2 * KV) * hd + H * hd * D + 3 * D * I        # q, k, v, o and the SwiGLU MLP, per position
    attn = t_new * t * H * hd * 2                                 # scores and the weighted sum
    return c.n_layers * (t_new * proj + attn) + t_new * D * c.vocab_size


def total_macs(t0, n_new):
    uncached = sum(macs_per_call(t, t) for t in range(t0, t0 + n_new))
    cached = macs_per_call(t0, t0) + sum(macs_per_call(1, t) for t in range(t0 + 1, t0 + n_new))
    return uncached, cached


# %% [markdown]
# Check the call list by counting: a forward hook records every call the two generation loops make (tokens
# fed, keys attended), for a few tokens, and the sum over the recorded calls must equal the formula.

# %%
def recorded_macs(m, generate, t0, n_new):
    calls = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache")
        t_new = args[0].shape[1]
        calls.append((t_new, t_new + (cache.seq_len if cache is not None else 0)))

    handle = m.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        generate(m, prompt[:, :t0], n_new)
    finally:
        handle.remove()
    return len(calls), sum(macs_per_call(t_new, t) for t_new, t in calls)


t_small, n_small = prompt.shape[1], 5
calls_u, counted_u = recorded_macs(model, generate_uncached, t_small, n_small)
calls_c, counted_c = recorded_macs(fast, generate_cached, t_small, n_small)
print(f"{n_small} tokens after {t_small}: uncached {calls_u} calls, cached {calls_c} calls; "
      f"counted = formula: {(counted_u, counted_c) == total_macs(t_small, n_small)}")
assert (calls_u, calls_c) == (n_small, n_small) and (counted_u, counted_c) == total_macs(t_small, n_small)
t0 = cfg["speed_prompt"]
n = min(cfg["speed_tokens"], mcfg.context_length - t0)      # the model's context bounds the run
total_u, total_c = total_macs(t0, n)
print(f"{n} tokens after a {t0}-token prompt: {total_u / 1e9:.2f} GMAC without the cache, {total_c / 1e9:.3f} GMAC "
      f"with it (prefill included): {total_u / total_c:.0f}× fewer operations")

# %% [markdown]
# ## 8. Memory
#
# The price of the cache is memory. How much? Measure it instead of guessing: fill caches of the tiny model
# and read `nbytes()`, varying one thing at a time (the number of positions, the batch, the dtype, the number
# of KV heads). Each measurement is proportional to what it varies; the exercise asks you to turn these
# observations into a formula.

# %%
def measured_bytes(n_kv_heads=mcfg.n_kv_heads, batch=1, length=8, dtype=torch.float32):
    c_ = Llama3Config(**(mcfg.to_dict() | {"n_kv_heads": n_kv_heads}))
    m_ = CachedLlama3Model(c_).to(dtype).eval()
    cache_ = KVCache(c_.n_layers)
    with torch.no_grad():
        m_(torch.zeros(batch, length, dtype=torch.long), cache=cache_)
    return cache_.nbytes()


base_bytes = measured_bytes()
for what, kw in (("16 positions instead of 8", {"length": 16}), ("a batch of 3", {"batch": 3}),
                 ("bfloat16 instead of float32", {"dtype": torch.bfloat16}),
                 (f"{mcfg.n_heads} KV heads (MHA) instead of {mcfg.n_kv_heads}", {"n_kv_heads": mcfg.n_heads})):
    print(f"{what:>36}: {measured_bytes(**kw):>7,} bytes = {measured_bytes(**kw) / base_bytes:g} × {base_bytes:,}")
print(f"llama3-tiny, float32: {base_bytes // 8:,} bytes per cached position and sequence")

# %% [markdown]
# The course library's `kv_cache_bytes` gives the same numbers for any size without building a model; for
# real models in bfloat16 (2 bytes per element):

# %%
assert kv_cache_bytes(mcfg.n_layers, mcfg.n_kv_heads, mcfg.hd, 8, bytes_per_elem=4) == base_bytes
KIB, MIB, GIB = 1024, 1024**2, 1024**3
rows = [("GPT-2 small", 1024), ("Llama-3.2-1B", 8192), ("Llama-3.2-1B", 131072), ("Llama-3.2-3B", 8192),
        ("Llama-3.2-3B", 131072), ("Llama-3-8B", 8192)]
print(f"{'model':>14} {'KV':>3} {'per token':>10} {'as MHA':>9} {'tokens':>8} {'cache':>10}")
for name, length in rows:
    p = KV_PRESETS[name]
    per_token = kv_cache_bytes(p["n_layers"], p["n_kv_heads"], p["head_dim"], 1)
    mha = kv_cache_bytes(p["n_layers"], p["n_heads"], p["head_dim"], 1)
    total = kv_cache_bytes(p["n_layers"], p["n_kv_heads"], p["head_dim"], length)
    print(f"{name:>14} {p['n_kv_heads']:>3} {per_token / KIB:>6.0f} KiB {mha / KIB:>5.0f} KiB {length:>8,} "
          f"{total / MIB:>6,.0f} MiB")
p = KV_PRESETS["Llama-3.2-1B"]
long_cache = kv_cache_bytes(p["n_layers"], p["n_kv_heads"], p["head_dim"], 131072)
print(f"\nLlama-3.2-1B at 131,072 tokens: cache {long_cache / GIB:.1f} GiB vs bf16 weights "
      f"{2 * p['n_params'] / 1e9:.2f} GB: the cache of ONE long sequence outweighs the model "
      f"({long_cache / (2 * p['n_params']):.1f}×)")

# %% [markdown]
# **MQA and GQA as reducers.** The cache is proportional to the number of KV heads. Multi-query attention
# (one KV head) divides multi-head attention's cache by `H`; grouped-query attention with `KV` heads divides
# it by `H/KV`. The price is quality: fewer distinct keys and values per layer. Explore the trade-off for
# each model below (sequence length on a log scale, batch, dtype, attention type) against the weight size.

# %%
viz.show_memory_calculator("Llama-3.2-3B")

# %% [markdown]
# **Converting MHA to GQA.** A trained multi-head model can be turned into a grouped-query one by replacing
# each group of `H/KV` key (and value) heads with their **mean** and then fine-tuning briefly
# (the GQA paper's "uptraining"). Which heads form a group is not free: each group must be the set of query
# heads that `repeat_kv` (unit 11) hands the new KV head to. Without any fine-tuning, how much does it cost?
# Pool the model's KV heads
# into one (GQA → MQA) and compare the loss on Shakespeare text before and after:

# %%
mqa_cfg = Llama3Config(**(mcfg.to_dict() | {"n_kv_heads": 1}))
mqa = Llama3Model(mqa_cfg).eval()
state = dict(model.state_dict())
for i in range(mcfg.n_layers):
    key = f"layers.{i}.self_attn."
    state[key + "k_proj.weight"], state[key + "v_proj.weight"] = mha_to_gqa(
        state[key + "k_proj.weight"], state[key + "v_proj.weight"], mcfg.n_kv_heads, 1)
mqa.load_state_dict(state)
text_ids = torch.tensor([encode(c) for c in llmcourse.load_text("tinyshakespeare")[-4 * mcfg.context_length:]
                         if c in set(decode(list(range(mcfg.vocab_size))))]).flatten()
windows = text_ids[: (len(text_ids) // mcfg.context_length) * mcfg.context_length].view(-1, mcfg.context_length)
with torch.no_grad():
    losses = {name: F.cross_entropy(m(windows[:, :-1]).flatten(0, 1), windows[:, 1:].flatten()).item()
              for name, m in ((f"{mcfg.n_kv_heads} KV heads (as loaded)", model), ("1 KV head (mean-pooled)", mqa))}
for name, loss in losses.items():
    print(f"{name:>24}: loss {loss:.3f} nats per character")
print(f"cache per token: ÷{mcfg.n_kv_heads}; loss change {losses['1 KV head (mean-pooled)'] - losses[f'{mcfg.n_kv_heads} KV heads (as loaded)']:+.3f} "
      "nats per character before any fine-tuning")

# %% [markdown]
# **Uptraining: how much of the jump a short fine-tuning wins back.** The GQA paper converts a checkpoint and then
# continues pretraining for a small fraction of the original steps. Do the same at toy scale: fine-tune the pooled
# model for `uptrain_steps` steps on the training text, at the learning rate the model ended its own training
# with (after a short warm-up, since the optimiser starts with empty moments). As a **control**, give the
# unconverted model the very same fine-tuning, so that what the pooled model gains is not simply "more training".
# All four losses are measured on the same held-out batches of the validation text (more text than the cell
# above used, so the first two differ a little from its printout).

# %%
import copy  # noqa: E402

from llmcourse.data.corpus import char_corpus  # noqa: E402
from llmcourse.train.llama_char import LLAMA_CHAR_TINY_RECIPE  # noqa: E402
from llmcourse.train.optim import configure_optimizer  # noqa: E402
from llmcourse.train.pretraining import estimate_loss, train_steps  # noqa: E402

corpus = char_corpus()
up_steps, up_lr = cfg["uptrain_steps"], LLAMA_CHAR_TINY_RECIPE["min_lr"]
up_warmup = min(15, up_steps)


def fine_tuned(m):
    m = copy.deepcopy(m)
    opt = configure_optimizer(m, up_lr, weight_decay=0.0)
    train_steps(m, opt, corpus.train, up_steps, 0, cfg["uptrain_batch"], mcfg.context_length,
                lambda s: up_lr * min(1.0, (s + 1) / up_warmup), 1.0, seed=1234)
    return m.eval()


def held_out(m):
    return estimate_loss(m, corpus.val, 8, mcfg.context_length, 4)


up = {f"{mcfg.n_kv_heads} KV heads (as loaded)": held_out(model), "1 KV head, pooled": held_out(mqa)}
up["1 KV head, pooled + fine-tuned"] = held_out(fine_tuned(mqa))
up[f"{mcfg.n_kv_heads} KV heads + the same fine-tuning"] = held_out(fine_tuned(model))
for name, loss in up.items():
    print(f"{name:>36}: held-out loss {loss:.3f}")
names = list(up)
jump = up[names[1]] - up[names[0]]
print(f"pooling cost {jump:+.3f} nats per character; {up_steps} fine-tuning steps of {cfg['uptrain_batch']} × "
      f"{mcfg.context_length} characters win back {(up[names[1]] - up[names[2]]) / jump:.0%} of it; the control moved "
      f"by {up[names[3]] - up[names[0]]:+.3f}")

# %% [markdown]
# The conversion is cheap but not free: mean-pooling throws away what distinguished the pooled heads, and the rest
# of the network must adapt to the shared keys and values. A fine-tuning of a few steps recovers a large part of
# the loss because only that adaptation is missing; the remaining gap is the price of caching fewer heads (with a
# larger `uptrain_steps`, as in the laptop profile, the gap shrinks further; it need not close).

# %% [markdown]
# ## 9. The measured speedup
#
# Time greedy decoding after a prompt of `speed_prompt` tokens, step by step, with and without the cache.
# In operations, an uncached step grows with the sequence length while a cached step stays almost flat
# (section 7). The measurement shows how much of that survives on a small model (timings vary from run to
# run and with the machine's load; they are printed, never asserted).

# %%
speed_prompt = text_ids[: cfg["speed_prompt"]][None]   # a stretch of Shakespeare
speed = viz.measure_decode_speed(fast, model, speed_prompt, n, progress=tqdm)
c_ms, u_ms = speed["cached_ms"], speed["uncached_ms"]
print(f"same tokens: {speed['same_tokens']}; total {sum(u_ms) / 1000:.2f} s without the cache, "
      f"{sum(c_ms) / 1000:.2f} s with it ({sum(u_ms) / sum(c_ms):.1f}×)")
q = max(1, len(c_ms) // 4)
print(f"speedup in the first quarter of the tokens {sum(u_ms[:q]) / sum(c_ms[:q]):.1f}×, in the last quarter "
      f"{sum(u_ms[-q:]) / sum(c_ms[-q:]):.1f}×; an uncached step in the last quarter takes "
      f"{sum(u_ms[-q:]) / sum(u_ms[:q]):.2f}× as long as one in the first, a cached one {sum(c_ms[-q:]) / sum(c_ms[:q]):.2f}×")
viz.show_speed_plot(speed)

# %% [markdown]
# Compare the measured speedup with the operation count of section 7: at this size it is far smaller. A
# decoding step of a model this small is mostly fixed cost: Python and the launch of every small operation
# (the embedding, a dozen operations per layer, the head), and that cost does not shrink with the cache. On
# large models the matrix products dominate and the measured speedup approaches the ratio of operations. (A
# fair comparison times the same model with and without the cache, as here; timing a library's
# `generate(use_cache=...)` measures the library, not your model.) `course bench decode` measures a larger
# Llama against `transformers`' own cached generation.
#
# ## 10. Why fewer KV heads decode faster: the roofline
#
# Section 8 counted the cache in bytes held. Speed depends on bytes **read**: a decoding step computes little
# (one token per sequence), but it must bring every weight matrix and the whole K/V cache of every layer from
# memory to the cores. So a step cannot be faster than
#
# ```
# bytes read per step  =  weights  +  K/V cache at the current length
# time per step        ≥  bytes read per step ÷ memory bandwidth
# ```
#
# The token-embedding table counts whole when the output head is tied to it: the head multiplies by the whole
# `(V, D)` table at every step (an untied model reads only the looked-up rows of its embedding, and its own head
# whole). For Llama-3.2-1B, whose head is tied, that table is a large share of the weights:

# %%
with torch.device("meta"):
    big_cfg = Llama3Config.preset("llama3.2-1b")
    big_params = sum(p.numel() for p in Llama3Model(big_cfg).parameters())
table_share = big_cfg.vocab_size * big_cfg.d_model / big_params
print(f"Llama-3.2-1B: tied head {big_cfg.tie_word_embeddings}; the (V, D) table holds {table_share:.1%} of its "
      f"{big_params:,} parameters, read at every decoding step")
assert big_cfg.tie_word_embeddings and 0.1 < table_share < 0.5

# %% [markdown]
# That bound is the **roofline** of decoding. The weights are read once per step whatever the length; the cache
# part grows with the length, the batch and the number of KV heads. Here is the machine's read bandwidth,
# measured by summing a large tensor (a sum reads each byte once and does almost nothing with it):

# %% tags=["nbval-ignore-output"]
import matplotlib.pyplot as plt  # noqa: E402

from llmcourse.models.llama3_cached import time_decode_step  # noqa: E402
from llmcourse.nn.kv_cache import decode_step_bytes  # noqa: E402
from llmcourse.runtime import read_bandwidth  # noqa: E402

bandwidth = read_bandwidth(cfg["bandwidth_mib"] << 20)
print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s ({torch.get_num_threads()} torch thread(s), "
      f"{cfg['bandwidth_mib']} MiB summed)")

# %% [markdown]
# One model in three versions that differ only in the number of KV heads: multi-head (as many KV heads as query
# heads), grouped-query (a quarter) and multi-query (one). The tiny character model is too small for this (its
# weights are a few MB and a step is mostly Python overhead), so we build a wider, untrained Llama (`roofline_*`
# in the profile; timing does not need trained weights). For each version and several cached lengths, fill the
# cache with random keys and values (their values do not change what a step reads) and time single-token steps.

# %% tags=["nbval-ignore-output"]
H_r, B_r, lengths_r = cfg["roofline_heads"], cfg["roofline_batch"], cfg["roofline_lengths"]
roof = {}
for name, kv in (("MHA", H_r), ("GQA", max(1, H_r // 4)), ("MQA", 1)):
    rcfg = Llama3Config(**(Llama3Config.preset("llama3-tiny").to_dict() | dict(
        d_model=cfg["roofline_d_model"], n_layers=cfg["roofline_layers"], n_heads=H_r, n_kv_heads=kv,
        intermediate_size=3 * cfg["roofline_d_model"], context_length=max(lengths_r) + cfg["roofline_steps"] + 1)))
    torch.manual_seed(0)
    rmodel = CachedLlama3Model(rcfg).eval()
    n_r = sum(p.numel() for p in rmodel.parameters())
    nbytes = [decode_step_bytes(rcfg, n_r, B_r, t) for t in lengths_r]
    roof[name] = {"kv": kv, "params": n_r, "bytes": nbytes, "bound_ms": [1000 * b / bandwidth for b in nbytes],
                  "ms": [time_decode_step(rmodel, B_r, t, cfg["roofline_steps"]) for t in lengths_r]}
    del rmodel
print(f"batch {B_r}, float32; bound = bytes read ÷ {bandwidth / 1e9:.1f} GB/s; tokens/s = {B_r} sequences ÷ time per step")
print(f"{'':>4} {'KV':>3} {'params':>11} {'cached':>7} {'MB/step':>8} {'bound ms':>9} {'measured ms':>12} "
      f"{'bound tok/s':>12} {'measured tok/s':>15} {'fraction':>9}")
for name, r in roof.items():
    for t, b, lo, ms in zip(lengths_r, r["bytes"], r["bound_ms"], r["ms"]):
        print(f"{name:>4} {r['kv']:>3} {r['params']:>11,} {t:>7,} {b / 1e6:>8.1f} {lo:>9.2f} {ms:>12.2f} "
              f"{1000 * B_r / lo:>12,.0f} {1000 * B_r / ms:>15,.0f} {lo / ms:>9.2f}")

fig, (ax_b, ax_t) = plt.subplots(1, 2, figsize=(11, 3.8))
for (name, r), colour in zip(roof.items(), ("tab:red", "tab:orange", "tab:green")):
    ax_b.plot(lengths_r, [b / 1e6 for b in r["bytes"]], "o-", color=colour, label=f"{name} ({r['kv']} KV)")
    ax_t.plot(lengths_r, r["ms"], "o-", color=colour, label=f"{name} measured")
    ax_t.plot(lengths_r, r["bound_ms"], "--", color=colour, label=f"{name} bound (bytes ÷ bandwidth)")
ax_b.set(xlabel="cached positions", ylabel="MB read per step", title="bytes read per decoding step")
ax_t.set(xlabel="cached positions", ylabel="ms per step", title=f"time per step, batch {B_r}")
ax_b.legend()
ax_t.legend(fontsize=7)
fig.tight_layout()
plt.show()
last = {name: r["ms"][-1] for name, r in roof.items()}
print(f"at {lengths_r[-1]:,} cached positions: MHA reads {roof['MHA']['bytes'][-1] / roof['MQA']['bytes'][-1]:.1f}× "
      f"MQA's bytes and measured {last['MHA'] / last['MQA']:.1f}× its time; at {lengths_r[0]:,}: "
      f"{roof['MHA']['bytes'][0] / roof['MQA']['bytes'][0]:.2f}× the bytes, {roof['MHA']['ms'][0] / roof['MQA']['ms'][0]:.2f}× the time")

# %% [markdown]
# How to read it. At short lengths the weights dominate what a step reads, so the three versions cost about the
# same. As the cache grows, MHA's bytes grow `H` times faster than MQA's and `H/KV` times faster than GQA's, and
# the measured time grows with them: fewer KV heads decode faster **because each step reads less**, not
# because it computes less (the query side, where the operations are, is the same in all three). The *fraction*
# column (bound ÷ measured) says how close a step comes to the memory limit; below 1, the rest is compute, the
# overhead of launching small operations, and the machine's load while this ran. Larger batches read the weights
# once for more tokens, so tokens/s rises with the batch until the cache, which grows with the batch, takes over.
# `course bench decode` prints the same fraction for a larger model beside each ms/token.

# %% [markdown]
# ## Summary
#
# - Decoding needs one new query row per step; past keys and values never change, past queries are never
#   used: cache K and V.
# - Prefill once, then feed one token per step; chunked prefill gives the same logits.
# - With a cache, new tokens sit at `start … start+T−1` with `start` read once: RoPE rows from `start`, and
#   the bottom-right causal mask `causal_mask(T, start+T)`.
# - Cache keys after RoPE and with the KV heads only.
# - The cache grows linearly with the positions, the batch, the bytes per element and the number of KV heads;
#   GQA and MQA shrink it by `H/KV`; at long context it can outgrow the weights.
# - Pooling a trained model's KV heads costs loss at once; a short fine-tuning wins much of it back.
# - A decoding step is bounded by the bytes it reads (weights + cache) ÷ the memory bandwidth: fewer KV heads
#   read less, and that is where GQA's and MQA's speed comes from.
