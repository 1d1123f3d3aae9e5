"""Red-team answers for unit 13 (DeepSeek multi-head latent attention): written from the released exercise notebook."""

from tests.redteam import Answer

# A full DeepSeekMLA forward as a student writes it; each answer edits one piece (the markers below).
_DS_FORWARD = '''
class DeepSeekMLA(DeepSeekMLA):
    def forward(self, x, positions, mask, cache=None, layer_idx=0, absorb=False):
        B, T, _ = x.shape
        H, dn, dr, dv = self.n_heads, self.d_nope, self.d_rope, self.d_v
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, dn + dr).transpose(1, 2)
        q_nope, q_pe = q[..., :dn], q[..., dn:]
        kv_a = self.kv_a_proj_with_mqa(x)
        c_kv, k_pe = kv_a[..., :self.kv_lora_rank], kv_a[..., self.kv_lora_rank:]
        c_kv = self.kv_a_layernorm(c_kv)  # @NORM
        cos, sin = L11.rope_cos_sin(L11.rope_inv_freq(dr, self.rope_theta), positions)
        rope = L11.apply_rope_interleaved if self.rope_interleave else L11.apply_rope  # @ROPE
        q_pe, k_pe = rope(q_pe, cos, sin), rope(k_pe, cos, sin)
        if cache is not None:
            c_kv, k_pe = cache.update(layer_idx, c_kv, k_pe)
        c_kv = c_kv  # @READ
        S = c_kv.shape[1]
        w = self.kv_b_proj.weight.view(H, dn + dv, self.kv_lora_rank)
        scores = q_pe @ k_pe[:, None].transpose(-2, -1)
        if absorb:
            q_lat = torch.einsum("bhtn,hnc->bhtc", q_nope, w[:, :dn])  # @QLAT
            scores = scores + q_lat @ c_kv[:, None].transpose(-2, -1)  # @ABSORB_S
        else:
            kv = self.kv_b_proj(c_kv).view(B, S, H, dn + dv).transpose(1, 2)
            k_nope, v = kv[..., :dn], kv[..., dn:]
            scores = scores + q_nope @ k_nope.transpose(-2, -1)
        scores = scores / math.sqrt(dn + dr)  # @SCALE
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        if absorb:
            out = torch.einsum("bhtc,hvc->bhtv", p @ c_kv[:, None], w[:, dn:])  # @ABSORB_V
        else:
            out = p @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * dv))
'''


def _ds(**edits):
    src = _DS_FORWARD
    for marker, line in edits.items():
        tag = f"# @{marker}"
        lines = src.split("\n")
        i = next(n for n, s in enumerate(lines) if s.rstrip().endswith(tag))
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i] = "\n".join(indent + part for part in line.split("\n"))
        src = "\n".join(lines)
    return src


_SIMPLE_FORWARD = '''
class SimpleMLA(SimpleMLA):
    def forward(self, x, mask, cache=None, layer_idx=0):
        B, T, _ = x.shape
        c = self.W_dkv(x)
        if cache is not None:
            c, _ = cache.update(layer_idx, c)
        S = c.shape[1]
        q = self.W_q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.W_uk(c).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.W_uv(c).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / SCALE
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.W_o(MERGE)
'''


def _simple(scale="math.sqrt(self.head_dim)", merge="out.transpose(1, 2).reshape(B, T, -1)"):
    return _SIMPLE_FORWARD.replace("SCALE", scale).replace("MERGE", merge)


_ABSORBED = '''
def absorbed_forward(mla, x, c_all, mask):
    A, Bo = absorb_mla_weights(mla)
    q_lat = torch.einsum("btd,hdc->bhtc", x, A)
    scores = torch.einsum("bhtc,bsc->bhts", q_lat, c_all) / math.sqrt(mla.head_dim)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    BODY
'''

ANSWERS = [
    # -- 13.SimpleMLA -------------------------------------------------------------------------------------------
    Answer("13.SimpleMLA", "scores scaled by the latent width 1/sqrt(d_c)",
           _simple(scale="math.sqrt(self.kv_lora_rank)"), says=r"scale|sqrt|differ|expected"),
    Answer("13.SimpleMLA", "heads merged without the transpose (head-major mixing)",
           _simple(merge="out.reshape(B, T, -1)"), says=r"head|merge|differ|expected"),
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
           _ABSORBED.replace("/ math.sqrt(mla.head_dim)", "/ math.sqrt(mla.kv_lora_rank)").replace(
               "BODY", 'lat = torch.einsum("bhts,bsc->bhtc", p, c_all)\n'
                       '    return torch.einsum("bhtc,hdc->btd", lat, Bo)'),
           says=r"scale|differ|expected"),
    Answer("13.absorb", "keys absorbed, values rebuilt per head from the latents", _ABSORBED.replace(
        "BODY", 'H, hd = mla.n_heads, mla.head_dim\n'
                '    v = (c_all @ mla.W_uv.weight.T).view(c_all.shape[0], c_all.shape[1], H, hd).transpose(1, 2)\n'
                '    ctx = (p @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], H * hd)\n'
                '    return ctx @ mla.W_o.weight.T'),
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
    Answer("13.DeepSeekMLA", "scale 1/sqrt(d_nope): the rope dims left out", _ds(SCALE="scores = scores / math.sqrt(dn)"),
           bug="B13.scale_nope_only"),
    Answer("13.DeepSeekMLA", "scale 1/sqrt(d_v)", _ds(SCALE="scores = scores / math.sqrt(dv)"),
           says=r"scale|differ|expected"),
    Answer("13.DeepSeekMLA", "rope_interleave ignored (always interleaved)",
           _ds(ROPE="rope = L11.apply_rope_interleaved"), says=r"interleav|rope|layout|differ|expected"),
    Answer("13.DeepSeekMLA", "the cache holds the un-normalised latent, normalised on read",
           _ds(NORM="pass", READ="c_kv = self.kv_a_layernorm(c_kv)"), says=r"cache|normalis|wr[io]te"),
    Answer("13.DeepSeekMLA", "absorb=True: keys absorbed, values rebuilt per head from the latent", _ds(
        ABSORB_V='v = (c_kv @ w[:, dn:].reshape(H * dv, -1).T).view(B, S, H, dv).transpose(1, 2)\n'
                 'out = p @ v'),
        says=r"value|rebuil|per-head|structure", origin="issue 39"),
    Answer("13.DeepSeekMLA", "absorb=True: K and V rebuilt from the latent in float64", _ds(
        QLAT='kv = (c_kv.double() @ self.kv_b_proj.weight.double().T).view(B, S, H, dn + dv).transpose(1, 2)\n'
             'k_nope, v = kv[..., :dn], kv[..., dn:]',
        ABSORB_S='scores = (scores.double() + q_nope.double() @ k_nope.transpose(-2, -1)).float()',
        ABSORB_V='out = (p.double() @ v).to(x.dtype)'),
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
