# %% [markdown]
# # Unit 12 — The KV cache: exercises
#
# Five graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: sequences of cache updates in several layers and
# dtypes, prefill followed by single-token steps and chunked prefill compared with the cache-free model
# at every position, the cached tensors' shapes, greedy generation with seeded random weights and with
# the course's trained character Llama (also twice in a row), every model call your generation loop
# makes, and real models' cache sizes. When something fails it tells you what was expected, what came
# back, and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/12_kv_cache/12_kv_cache.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `math`, the standard library and unit 11's
# pieces from `llmcourse.models.llama3`.
#
# **Conventions.** Cached keys and values have shape `(B, KV, T, hd)`: batch, key/value heads, cached
# positions, head size. A boolean mask is `True` where a query may attend.

# %%
import math  # noqa: F401

import torch
from torch import nn  # noqa: F401

import llmcourse
from llmcourse.models import llama3 as L11
from llmcourse.nn.masks import causal_mask  # noqa: F401

cfg = llmcourse.setup_notebook("12")
tiny = L11.Llama3Config.preset("llama3-tiny")

# %% [markdown]
# ## Exercise 1 — `KVCache` (4 points)
#
# ```python
# class KVCache:
#     def __init__(self, n_layers: int): ...
#     def update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...
#     @property
#     def seq_len(self) -> int: ...
#     def reset(self) -> None: ...
#     def nbytes(self) -> int: ...
# ```
#
# One slot per layer. `update(layer_idx, k, v)` takes the new keys and values of that layer, each
# `(B, KV, T_new, hd)`, appends them **along dim 2** after what the layer already holds, and returns the
# layer's full `(keys, values)`, `(B, KV, T_old + T_new, hd)`. `seq_len` is the number of cached positions
# (read it from layer 0; 0 when empty). `reset()` empties every layer. `nbytes()` is the number of bytes
# held by all cached K and V tensors (`numel · element_size`, summed).

# %% tags=["solution:12.KVCache"]
class KVCache:
    """Per-layer keys and values (B, KV, T, hd), appended on dim 2."""

    def __init__(self, n_layers):
        ### BEGIN SOLUTION
        self.keys = [None] * n_layers
        self.values = [None] * n_layers
        ### END SOLUTION

    def update(self, layer_idx, k, v):
        ### BEGIN SOLUTION
        if self.keys[layer_idx] is not None:
            k = torch.cat([self.keys[layer_idx], k], dim=2)
            v = torch.cat([self.values[layer_idx], v], dim=2)
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return k, v
        ### END SOLUTION

    @property
    def seq_len(self):
        ### BEGIN SOLUTION
        return 0 if self.keys[0] is None else self.keys[0].shape[2]
        ### END SOLUTION

    def reset(self):
        ### BEGIN SOLUTION
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)
        ### END SOLUTION

    def nbytes(self):
        ### BEGIN SOLUTION
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
        ### END SOLUTION


# %% tags=["tests:12.KVCache"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("12.KVCache")  # noqa: E702
### END HIDDEN TESTS
c = KVCache(2)
assert c.seq_len == 0 and c.nbytes() == 0, "an empty cache has length 0 and holds 0 bytes"
a, b = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 1, 4)
for layer in range(2):
    c.update(layer, a, -a)
k, v = c.update(0, b, -b)
assert k.shape == (1, 2, 4, 4), f"keys after 3 + 1 tokens: expected (1, 2, 4, 4), got {tuple(k.shape)}"
assert torch.equal(k, torch.cat([a, b], dim=2)) and torch.equal(v, -torch.cat([a, b], dim=2)), "append on dim 2"
c.update(1, b, -b)
assert c.seq_len == 4, f"seq_len must be 4, got {c.seq_len}"
assert c.nbytes() == 2 * 2 * 2 * 4 * 4 * 4, f"2 layers x (K, V) x 2 heads x 4 tokens x 4 floats x 4 bytes; got {c.nbytes()}"
c.reset()
assert c.seq_len == 0 and c.nbytes() == 0, "reset() empties the cache"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — the cached forward pass (6 points)
#
# ```python
# GroupedQueryAttention.forward(self, x, cos, sin, mask, cache=None, layer_idx=None) -> Tensor
# Llama3Model.forward(self, idx, cache=None) -> Tensor
# ```
#
# Extend unit 11's cache-free classes (imported from the course library as `L11`). The class headers and
# `__init__` are given: `Llama3Model` puts your attention class into every layer, and keeps unit 11's
# `state_dict` keys and its three buffers `rope_cos`, `rope_sin` `(context_length, hd)` and `causal`
# `(context_length, context_length)`. Unit 11's attention has two halves you may call:
# `self.project(x, cos, sin) -> q (B, H, T, hd), k, v (B, KV, T, hd)` (RoPE applied to `q` and `k`) and
# `self.attend(q, k, v, mask) -> (B, T, D)`. Each layer's parts are `input_layernorm`, `self_attn`,
# `post_attention_layernorm` and `mlp`, combined as in unit 11's block.
#
# - **Attention**: with a cache, append this layer's rotated keys and its values (with their `KV` heads) to
#   slot `layer_idx` and attend over everything the slot then holds; without one, behave as unit 11.
# - **Model**: `idx (B, T)` → logits `(B, T, V)`. The new tokens continue the cached sequence, so they sit at
#   absolute positions after the cached ones. Which rows of the model's RoPE tables they take, when the
#   cached length must be read, and which keys each new query may see (a `(T, cached + T)` boolean mask; the
#   course library's `causal_mask(t_q, t_k, offset=...)` and the `causal` buffer are at hand) are yours to
#   work out from the contract below. Raise `ValueError` when the cached and the new tokens together exceed
#   `context_length`.
#
# Contract: feeding a sequence in pieces through one cache gives the same logits, position by position, as
# the cache-free forward on the whole sequence.

# %% tags=["solution:12.cached_forward"]
class GroupedQueryAttention(L11.GroupedQueryAttention):
    """Unit 11's attention, extended with a KV cache."""

    def forward(self, x, cos, sin, mask, cache=None, layer_idx=None):
        ### BEGIN SOLUTION
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            k, v = cache.update(layer_idx, k, v)
        return self.attend(q, k, v, mask)
        ### END SOLUTION


class Llama3Model(L11.Llama3Model):
    """Unit 11's model whose forward can prefill or extend a KV cache."""

    def __init__(self, cfg):
        super().__init__(cfg)
        for layer in self.layers:   # the same keys, with the cache-aware attention above
            layer.self_attn = GroupedQueryAttention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.hd)
        self.init_weights()

    def forward(self, idx, cache=None):
        ### BEGIN SOLUTION
        T = idx.shape[1]
        start = cache.seq_len if cache is not None else 0
        if start + T > self.cfg.context_length:
            raise ValueError(f"positions up to {start + T - 1} exceed context_length {self.cfg.context_length}")
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        mask = self.causal[start:start + T, :start + T]
        x = self.embed_tokens(idx)
        for i, layer in enumerate(self.layers):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, mask, cache, i)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.norm(x))
        ### END SOLUTION


# %% tags=["tests:12.cached_forward"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("12.cached_forward")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
reference = L11.Llama3Model(tiny).eval()
mine = Llama3Model(tiny).eval()
mine.load_state_dict(reference.state_dict())
ids = torch.randint(0, tiny.vocab_size, (2, 12))
with torch.no_grad():
    full = reference(ids)
    cache = KVCache(tiny.n_layers)
    steps = [mine(ids[:, :5], cache=cache)] + [mine(ids[:, i:i + 1], cache=cache) for i in range(5, 12)]
stepped = torch.cat(steps, dim=1)
assert stepped.shape == full.shape, f"expected logits {tuple(full.shape)}, got {tuple(stepped.shape)}"
gap = (stepped - full).abs().max().item()
assert gap < 1e-5, f"prefill + single-token steps differ from the cache-free forward by {gap:.2e}"
assert cache.keys[0].shape == (2, tiny.n_kv_heads, 12, tiny.hd), f"cached keys: {tuple(cache.keys[0].shape)}"
print(f"max |cached - uncached| = {gap:.1e}")
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `generate_cached` (4 points)
#
# ```python
# @torch.no_grad()
# def generate_cached(model, idx, max_new_tokens, eos_id=None) -> Tensor
# ```
#
# Greedy generation with a KV cache: make a fresh `KVCache(len(model.layers))`, call the model **once** on
# the whole prompt `idx (B, T0)` (prefill), then once per new token with only that token `(B, 1)`, always
# passing the cache (`model(ids, cache=cache)`). Each new token is the argmax of the last position's logits.
# Return `(B, T0 + n)` long, the prompt followed by the new tokens; `max_new_tokens=0` returns the prompt.
# With an `eos_id`, a row that has produced it keeps emitting it, and the loop stops once every row has.
# Run in eval mode. The result must equal greedy generation without a cache, token for token.

# %% tags=["solution:12.generate_cached"]
@torch.no_grad()
def generate_cached(model, idx, max_new_tokens, eos_id=None):
    """(B, T0) -> (B, T0 + n) long: one prefill call, then one call per new token."""
    ### BEGIN SOLUTION
    model.eval()
    if max_new_tokens == 0:
        return idx
    cache = KVCache(len(model.layers))
    done = torch.zeros(idx.shape[0], dtype=torch.bool)
    logits = model(idx, cache=cache)
    for step in range(max_new_tokens):
        nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        if eos_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt[:, 0] == eos_id)
        idx = torch.cat([idx, nxt], dim=1)
        if step == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
            break
        logits = model(nxt, cache=cache)
    return idx
    ### END SOLUTION


# %% tags=["tests:12.generate_cached"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("12.generate_cached")  # noqa: E702
### END HIDDEN TESTS
prompt = torch.randint(0, tiny.vocab_size, (2, 6))
n_new = cfg["exercise_tokens"]
cached_out = generate_cached(mine, prompt, n_new)
uncached_out = prompt
with torch.no_grad():
    for _ in range(n_new):
        uncached_out = torch.cat([uncached_out, reference(uncached_out)[:, -1].argmax(-1, keepdim=True)], dim=1)
assert cached_out.shape == (2, 6 + n_new), f"expected (2, {6 + n_new}), got {tuple(cached_out.shape)}"
assert torch.equal(cached_out, uncached_out), "cached and uncached greedy tokens differ"
assert torch.equal(generate_cached(mine, prompt, 0), prompt), "max_new_tokens=0 returns the prompt"
print(f"{n_new} cached tokens equal the uncached ones")
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `kv_cache_bytes` (3 points)
#
# ```python
# def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2) -> int
# ```
#
# Predict, without building anything, the `nbytes()` of the cache a model holds after `seq_len` positions of
# `batch_size` sequences: a model with `n_layers` layers whose attention has `n_kv_heads` key/value heads of
# size `head_dim`, elements of `bytes_per_elem` bytes (2 for bfloat16, the default; 4 for float32; 1 for
# fp8). Return an `int`. The formula is yours to derive: fill a `KVCache` with a model (your cached model of
# exercise 2, or unit 11's shapes) and measure, varying one size at a time, as the lesson does.

# %% tags=["solution:12.kv_cache_bytes"]
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):
    """The nbytes() of the cache after seq_len positions of batch_size sequences."""
    ### BEGIN SOLUTION
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_elem
    ### END SOLUTION


# %% tags=["tests:12.kv_cache_bytes"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("12.kv_cache_bytes")  # noqa: E702
### END HIDDEN TESTS
from llmcourse.models.llama3_cached import CachedLlama3Model  # noqa: E402
from llmcourse.nn.kv_cache import KVCache as CourseKVCache  # noqa: E402

measured = CourseKVCache(tiny.n_layers)   # the course's cache and cached model: this test measures, it grades nothing
with torch.no_grad():
    CachedLlama3Model(tiny).eval()(torch.zeros(3, 7, dtype=torch.long), cache=measured)
predicted = kv_cache_bytes(tiny.n_layers, tiny.n_kv_heads, tiny.hd, 7, batch_size=3, bytes_per_elem=4)
assert predicted == measured.nbytes(), f"llama3-tiny, 3 sequences of 7 tokens in float32: the cache holds " \
    f"{measured.nbytes():,} bytes, kv_cache_bytes predicts {predicted!r}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `mha_to_gqa` (3 points)
#
# ```python
# def mha_to_gqa(k_proj_weight, v_proj_weight, n_heads, n_kv_heads) -> tuple[Tensor, Tensor]
# ```
#
# Turn the key and value projections of multi-head attention, `(H·hd, D)` (rows `h·hd … h·hd+hd−1` belong
# to head `h`), into grouped-query ones, `(KV·hd, D)`: each new KV head is the **mean** of a group of
# `H / KV` old heads. **Which heads form a group** is yours to decide, from how unit 11's attention shares a
# KV head among query heads. The evidence: a grouped-query layer written out as multi-head attention (every
# query head given its own copy of the KV head that serves it) must come back exactly, and the converted
# weights must run in unit 11's `Llama3Model` with `n_kv_heads = KV`. `KV == H` returns the same values;
# `KV == 1` gives the mean over all heads.

# %% tags=["solution:12.mha_to_gqa"]
def mha_to_gqa(k_proj_weight, v_proj_weight, n_heads, n_kv_heads):
    """(H·hd, D) key/value weights -> (KV·hd, D): each new KV head the mean of a group of H/KV old heads."""
    ### BEGIN SOLUTION
    out = []
    for w in (k_proj_weight, v_proj_weight):
        hd = w.shape[0] // n_heads
        out.append(w.reshape(n_kv_heads, n_heads // n_kv_heads, hd, w.shape[1]).mean(dim=1).reshape(-1, w.shape[1]))
    return out[0], out[1]
    ### END SOLUTION


# %% tags=["tests:12.mha_to_gqa"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("12.mha_to_gqa")  # noqa: E702
### END HIDDEN TESTS
wk, wv = torch.randn(8 * 4, 16), torch.randn(8 * 4, 16)
k2, v2 = mha_to_gqa(wk, wv, 8, 2)
assert k2.shape == (2 * 4, 16), f"expected (8, 16), got {tuple(k2.shape)}"
gqa_k = torch.randn(2 * 4, 16)   # 2 KV heads of 4; written out for 8 query heads by unit 11's sharing rule
as_mha = L11.repeat_kv(gqa_k.view(1, 2, 4, 16), 4).reshape(8 * 4, 16)
back, _ = mha_to_gqa(as_mha, as_mha, 8, 2)
assert torch.allclose(back, gqa_k, atol=1e-6), "a GQA layer written out as MHA must come back exactly"
same_k, _ = mha_to_gqa(wk, wv, 8, 8)
assert torch.equal(same_k, wk), "KV == H must return the weights unchanged"
print("visible tests passed")

# %% [markdown]
# ## Putting it together
#
# Not graded: your cache against the cache-free loop on the course's trained character Llama, timed.

# %%
import time  # noqa: E402

from llmcourse.train.llama_char import load_llama_char_tiny  # noqa: E402

try:   # the course's trained character Llama (assets/llama_char_tiny.pt)
    char_model, tok = load_llama_char_tiny(retrain=False)
    start_ids = torch.tensor([tok.encode("ROMEO:")])
except FileNotFoundError:   # without the asset: the seeded random model of the tests above
    char_model, tok = reference, None
    start_ids = prompt[:1]
fast = Llama3Model(char_model.cfg).eval()
fast.load_state_dict(char_model.state_dict())
n_new = min(cfg["exercise_tokens"], char_model.cfg.context_length - start_ids.shape[1])
t0 = time.perf_counter()
with_cache = generate_cached(fast, start_ids, n_new)
t1 = time.perf_counter()
without = start_ids
with torch.no_grad():
    for _ in range(n_new):
        without = torch.cat([without, char_model(without)[:, -1].argmax(-1, keepdim=True)], dim=1)
t2 = time.perf_counter()
if tok is not None:
    print(tok.decode(with_cache[0].tolist()))
print(f"same tokens: {torch.equal(with_cache, without)}; cached {1000 * (t1 - t0) / n_new:.1f} ms/token, "
      f"uncached {1000 * (t2 - t1) / n_new:.1f} ms/token")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
