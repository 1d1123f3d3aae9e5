"""Red-team answers for unit 13 (DeepSeek multi-head latent attention): written from the released exercise notebook."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "13"


def _ds(*edits):
    return edited(U, "DeepSeekMLA", *edits)


def _simple(*edits):
    return edited(U, "SimpleMLA", *edits)


def _absorbed(*edits):
    return edited(U, "absorbed_forward", *edits)


_SCALE = "scores = scores / math.sqrt(dn + dr)"
_ABSORB_V = 'out = torch.einsum("bhtc,hvc->bhtv", p @ c_kv[:, None], w[:, dn:])'
_LAT = ('    lat = torch.einsum("bhts,bsc->bhtc", torch.softmax(scores, dim=-1), c_all)\n'
        '    return torch.einsum("bhtc,hdc->btd", lat, Bo)\n')


ANSWERS = [
    # -- 13.SimpleMLA -------------------------------------------------------------------------------------------
    Answer("13.SimpleMLA", "scores scaled by the latent width 1/sqrt(d_c)",
           _simple(("/ math.sqrt(self.head_dim)", "/ math.sqrt(self.kv_lora_rank)")), says=r"scale|sqrt|differ|expected"),
    Answer("13.SimpleMLA", "heads merged without the transpose (head-major mixing)",
           _simple(("out.transpose(1, 2).reshape(B, T, -1)", "out.reshape(B, T, -1)")), says=r"head|merge|differ|expected"),
    Answer("13.SimpleMLA", "the cache ignores layer_idx (every layer appends to slot 0)", '''
class LatentCache(LatentCache):
    def update(self, layer_idx, c_kv, k_pe=None):
        return super().update(0, c_kv, k_pe)
''', says=r"layer|cache|expected"),
    Answer("13.SimpleMLA", "nbytes counts only the latents, not the rope keys", '''
class LatentCache(LatentCache):
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.c_kv if t is not None)
''', says=r"nbytes|bytes"),
    Answer("13.SimpleMLA", "seq_len sums the lengths of every layer", '''
class LatentCache(LatentCache):
    @property
    def seq_len(self):
        return sum(t.shape[1] for t in self.c_kv if t is not None)
''', says=r"seq_len|length"),
    # -- 13.absorb ----------------------------------------------------------------------------------------------
    Answer("13.absorb", "absorbed weights cached by module id (stale after a weight change)", '''
_ABSORB_MEMO = {}
_absorb_once = absorb_mla_weights


def absorb_mla_weights(mla):
    if id(mla) not in _ABSORB_MEMO:
        _ABSORB_MEMO[id(mla)] = (mla, _absorb_once(mla))   # the module kept: its id is never reused
    return _ABSORB_MEMO[id(mla)][1]


def absorbed_forward(mla, x, c_all, mask):
    A, Bo = absorb_mla_weights(mla)
    q_lat = torch.einsum("btd,hdc->bhtc", x, A)
    scores = torch.einsum("bhtc,bsc->bhts", q_lat, c_all) / math.sqrt(mla.head_dim)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lat = torch.einsum("bhts,bsc->bhtc", torch.softmax(scores, dim=-1), c_all)
    return torch.einsum("bhtc,hdc->btd", lat, Bo)
''', says=r"current|weight|change|stale|expected"),
    Answer("13.absorb", "scores scaled by 1/sqrt(d_c) in latent space",
           _absorbed(("/ math.sqrt(mla.head_dim)", "/ math.sqrt(mla.kv_lora_rank)")),
           says=r"scale|differ|expected"),
    Answer("13.absorb", "keys absorbed, values rebuilt per head from the latents", _absorbed((
        _LAT, '    p = torch.softmax(scores, dim=-1)\n'
              '    H, hd = mla.n_heads, mla.head_dim\n'
              '    v = (c_all @ mla.W_uv.weight.T).view(c_all.shape[0], c_all.shape[1], H, hd).transpose(1, 2)\n'
              '    ctx = (p @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], H * hd)\n'
              '    return ctx @ mla.W_o.weight.T\n')),
        says=r"value|rebuil|per-head|structure", origin="issue 39"),
    Answer("13.absorb", "Bo taken from W_o's rows instead of its columns of head h", '''
_absorb_ok = absorb_mla_weights


def absorb_mla_weights(mla):
    A, _ = _absorb_ok(mla)
    H, hd = mla.n_heads, mla.head_dim
    wuv = mla.W_uv.weight.view(H, hd, -1)
    wo = mla.W_o.weight.view(H, hd, -1).transpose(1, 2)
    return A, wo @ wuv
''', says=r"Bo|differ|expected|column"),
    # -- 13.DeepSeekMLA -----------------------------------------------------------------------------------------
    Answer("13.DeepSeekMLA", "scale 1/sqrt(d_nope): the rope dims left out", _ds((_SCALE, "scores = scores / math.sqrt(dn)")),
           bug="B13.scale_nope_only"),
    Answer("13.DeepSeekMLA", "scale 1/sqrt(d_v)", _ds((_SCALE, "scores = scores / math.sqrt(dv)")),
           says=r"scale|differ|expected"),
    Answer("13.DeepSeekMLA", "rope_interleave ignored (always interleaved)",
           _ds(("rope = L11.apply_rope_interleaved if self.rope_interleave else L11.apply_rope",
                "rope = L11.apply_rope_interleaved")), says=r"interleav|rope|layout|differ|expected"),
    Answer("13.DeepSeekMLA", "the cache holds the un-normalised latent, normalised on read",
           _ds(("self.kv_a_layernorm(kv_a[..., :self.kv_lora_rank])", "kv_a[..., :self.kv_lora_rank]"),
               ("        S = c_kv.shape[1]\n", "        c_kv = self.kv_a_layernorm(c_kv)\n        S = c_kv.shape[1]\n")), says=r"cache|normalis|wr[io]te"),
    Answer("13.DeepSeekMLA", "absorb=True: keys absorbed, values rebuilt per head from the latent", _ds((
        _ABSORB_V, 'v = (c_kv @ w[:, dn:].reshape(H * dv, -1).T).view(B, S, H, dv).transpose(1, 2)\n'
                   '            out = p @ v')),
        says=r"value|rebuil|per-head|structure", origin="issue 39"),
    Answer("13.DeepSeekMLA", "absorb=True: K and V rebuilt from the latent in float64", _ds(
        ('q_lat = torch.einsum("bhtn,hnc->bhtc", q_nope, w[:, :dn])',
         'kv = (c_kv.double() @ self.kv_b_proj.weight.double().T).view(B, S, H, dn + dv).transpose(1, 2)\n'
         '            k_nope, v = kv[..., :dn], kv[..., dn:]'),
        ("scores = scores + q_lat @ c_kv[:, None].transpose(-2, -1)",
         "scores = (scores.double() + q_nope.double() @ k_nope.transpose(-2, -1)).float()"),
        (_ABSORB_V, "out = (p.double() @ v).to(x.dtype)")),
        says=r"value|key|rebuil|per-head|structure", origin="issue 39"),
    # -- 13.mla_memory ------------------------------------------------------------------------------------------
    Answer("13.mla_memory", "MLA cache counted per head", '''
_mem = attn_cache_elems_per_token


def attn_cache_elems_per_token(kind, n_layers, n_heads=0, n_kv_heads=0, head_dim=0, kv_lora_rank=0,
                               qk_rope_head_dim=0, k_head_dim=None, v_head_dim=None):
    if kind == "mla":
        return n_layers * n_heads * (kv_lora_rank + qk_rope_head_dim)
    return _mem(kind, n_layers, n_heads, n_kv_heads, head_dim, kv_lora_rank, qk_rope_head_dim, k_head_dim,
                v_head_dim)
''', says=r"mla|expected|per token"),
    Answer("13.mla_memory", "k_head_dim / v_head_dim ignored (2 * head_dim per head)", '''
def attn_cache_elems_per_token(kind, n_layers, n_heads=0, n_kv_heads=0, head_dim=0, kv_lora_rank=0,
                               qk_rope_head_dim=0, k_head_dim=None, v_head_dim=None):
    per = {"mha": n_heads * 2 * head_dim, "gqa": n_kv_heads * 2 * head_dim, "mqa": 2 * head_dim,
           "mla": kv_lora_rank + qk_rope_head_dim}[kind]
    return n_layers * per
''', says=r"head_dim|expected|per token"),
    Answer("13.mla_memory", "MQA counts every query head", '''
_mem2 = attn_cache_elems_per_token


def attn_cache_elems_per_token(kind, n_layers, n_heads=0, n_kv_heads=0, head_dim=0, kv_lora_rank=0,
                               qk_rope_head_dim=0, k_head_dim=None, v_head_dim=None):
    if kind == "mqa":
        kind = "mha"
    return _mem2(kind, n_layers, n_heads, n_kv_heads, head_dim, kv_lora_rank, qk_rope_head_dim, k_head_dim,
                 v_head_dim)
''', says=r"mqa|expected|per token"),
]
