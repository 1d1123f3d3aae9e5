"""Unit 12 red-team corpus (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

_CACHE = '''
class KVCache:
    def __init__(self, n_layers):
        self.keys = [None] * n_layers
        self.values = [None] * n_layers

    def update(self, layer_idx, k, v):
{update}

    @property
    def seq_len(self):
{seq_len}

    def reset(self):
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)

    def nbytes(self):
{nbytes}
'''
_UPDATE = '''        if self.keys[layer_idx] is not None:
            k = torch.cat([self.keys[layer_idx], k], dim=2)
            v = torch.cat([self.values[layer_idx], v], dim=2)
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return k, v'''
_SEQ = '''        return 0 if self.keys[0] is None else self.keys[0].shape[2]'''
_NBYTES = '''        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)'''


def _cache(update=_UPDATE, seq_len=_SEQ, nbytes=_NBYTES) -> str:
    return _CACHE.format(update=update, seq_len=seq_len, nbytes=nbytes)


_FWD = '''
class GroupedQueryAttention(L11.GroupedQueryAttention):
    def forward(self, x, cos, sin, mask, cache=None, layer_idx=None):
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            k, v = cache.update(layer_idx, k, v)
        return self.attend(q, k, v, mask)


class Llama3Model(L11.Llama3Model):
    def __init__(self, cfg):
        super().__init__(cfg)
        for layer in self.layers:
            layer.self_attn = GroupedQueryAttention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.hd)
        self.init_weights()

    def forward(self, idx, cache=None):
        T = idx.shape[1]
        start = cache.seq_len if cache is not None else 0
        if start + T > self.cfg.context_length:
            raise ValueError("too long")
        {tables}
        {mask}
        x = self.embed_tokens(idx)
        for i, layer in enumerate(self.layers):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, mask, cache, i)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.norm(x))
'''
_TABLES = "cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]"
_MASK = "mask = self.causal[start:start + T, :start + T]"


def _fwd(tables=_TABLES, mask=_MASK) -> str:
    return _FWD.format(tables=tables, mask=mask)


_GEN = '''
@torch.no_grad()
def generate_cached(model, idx, max_new_tokens, eos_id=None):
{body}
'''

ANSWERS = [
    # ---------------------------------------------------------------- 12.KVCache
    Answer("12.KVCache", "appends along the head dimension (dim 1)", _cache(update=_UPDATE.replace("dim=2", "dim=1")),
           says=r"KVCache.update. raised RuntimeError"),
    Answer("12.KVCache", "seq_len counts update calls", _cache(
        update="        self.calls = getattr(self, 'calls', 0) + (layer_idx == 0)\n" + _UPDATE,
        seq_len="        return getattr(self, 'calls', 0) if self.keys[0] is not None else 0"), says=r"seq_len after appending chunks"),
    Answer("12.KVCache", "nbytes assumes 4 bytes per element", _cache(
        nbytes="        return sum(t.numel() * 4 for t in self.keys + self.values if t is not None)"), says=r"must count 2 bytes per element"),
    # ---------------------------------------------------------------- 12.cached_forward
    Answer("12.cached_forward", "new tokens take the RoPE rows from 0", _fwd(
        tables="cos, sin = self.rope_cos[:T], self.rope_sin[:T]"), bug="B12.positions_restart"),
    Answer("12.cached_forward", "the mask is the square causal mask of the new tokens", _fwd(
        mask="mask = self.causal[:T, :T] if start == 0 else torch.ones(T, start + T, dtype=torch.bool)"),
        says=r"chunked prefill"),
    Answer("12.cached_forward", "no mask over the cache (every query sees every key)", _fwd(
        mask="mask = torch.ones(T, start + T, dtype=torch.bool)"), says=r"without a cache"),
    # ---------------------------------------------------------------- 12.generate_cached
    Answer("12.generate_cached", "re-runs the whole sequence at every step (through the cache)", _GEN.format(body='''
    model.eval()
    cache = KVCache(len(model.layers))
    done = torch.zeros(idx.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        cache.reset()
        logits = model(idx, cache=cache)
        nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        if eos_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt[:, 0] == eos_id)
        idx = torch.cat([idx, nxt], dim=1)
        if eos_id is not None and bool(done.all()):
            break
    return idx'''), bug="B12.rerun_sequence", origin="issue 38"),
    Answer("12.generate_cached", "no EOS freezing (rows continue after EOS)", _GEN.format(body='''
    model.eval()
    if max_new_tokens == 0:
        return idx
    cache = KVCache(len(model.layers))
    logits = model(idx, cache=cache)
    for step in range(max_new_tokens):
        nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
        if step == max_new_tokens - 1:
            break
        logits = model(nxt, cache=cache)
    return idx'''), bug="B12.eos_ignored"),
    Answer("12.generate_cached", "one cache shared by every call (module-level)", '''
_SHARED = {}
''' + _GEN.format(body='''
    model.eval()
    if max_new_tokens == 0:
        return idx
    cache = _SHARED.setdefault(id(model), KVCache(len(model.layers)))
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
    return idx'''), bug="B12.no_reset"),
    # ---------------------------------------------------------------- 12.kv_cache_bytes
    Answer("12.kv_cache_bytes", "keys only (no factor 2 for K and V)", '''
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):
    return n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_elem
''', bug="B12.bytes_no_factor2"),
    Answer("12.kv_cache_bytes", "batch size forgotten", '''
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * bytes_per_elem
''', bug="B12.bytes_ignores_batch"),
    Answer("12.kv_cache_bytes", "returns a float (GB-style division)", '''
def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):
    return 2.0 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_elem / 1.0
''', says=r"must return an int"),
    # ---------------------------------------------------------------- 12.mha_to_gqa
    Answer("12.mha_to_gqa", "strided groups (head h joins group h mod KV)", '''
def mha_to_gqa(k_proj_weight, v_proj_weight, n_heads, n_kv_heads):
    out = []
    for w in (k_proj_weight, v_proj_weight):
        hd = w.shape[0] // n_heads
        out.append(w.reshape(n_heads // n_kv_heads, n_kv_heads, hd, w.shape[1]).mean(dim=0).reshape(-1, w.shape[1]))
    return out[0], out[1]
''', bug="B12.gqa_strided_groups"),
    Answer("12.mha_to_gqa", "keeps the first head of each group (no mean)", '''
def mha_to_gqa(k_proj_weight, v_proj_weight, n_heads, n_kv_heads):
    out = []
    for w in (k_proj_weight, v_proj_weight):
        hd = w.shape[0] // n_heads
        out.append(w.reshape(n_kv_heads, n_heads // n_kv_heads, hd, w.shape[1])[:, 0].reshape(-1, w.shape[1]))
    return out[0], out[1]
''', says=r"the mean over all heads"),
]
