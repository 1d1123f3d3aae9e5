"""Unit 11 red-team corpus (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

_GQA = '''
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, head_dim=None):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = head_dim if head_dim is not None else d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        n_rep = self.n_heads // self.n_kv_heads
        {repeat}
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        {mask}
        out = scores.softmax(dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
'''
_REPEAT = "k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)"
_MASK = 'scores = scores.masked_fill(~mask, float("-inf"))'


def _gqa(repeat=_REPEAT, mask=_MASK, pre="") -> str:
    return pre + _GQA.format(repeat=repeat, mask=mask)


_MODEL = '''
class Llama3Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim if cfg.head_dim is not None else cfg.d_model // cfg.n_heads
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([Llama3Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_cos_sin(rope_inv_freq(hd, {theta}, {scaling}), torch.arange(cfg.context_length))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        causal = torch.ones(cfg.context_length, cfg.context_length, dtype=torch.bool).tril()
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.cfg.context_length:
            raise ValueError("too long")
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, self.rope_cos[:t], self.rope_sin[:t], self.causal[:t, :t])
        return self.lm_head({final}(x))
'''


def _model(theta="cfg.rope_theta", scaling="cfg.rope_scaling", final="self.norm") -> str:
    return _MODEL.format(theta=theta, scaling=scaling, final=final)


ANSWERS = [
    # ---------------------------------------------------------------- 11.RMSNorm
    Answer("11.RMSNorm", "LayerNorm-style centring", '''
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        xf = xf - xf.mean(-1, keepdim=True)
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
''', bug="B11.rms_mean_subtracted"),
    Answer("11.RMSNorm", "eps outside the square root", '''
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)).to(x.dtype)
''', bug="B11.rms_eps_outside"),
    Answer("11.RMSNorm", "statistics in the input's dtype (bfloat16)", '''
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
''', bug="B11.rms_low_precision"),
    # ---------------------------------------------------------------- 11.SwiGLUFeedForward
    Answer("11.SwiGLUFeedForward", "gate and up exchanged (SiLU on the up projection)", '''
class SwiGLUFeedForward(nn.Module):
    def __init__(self, d_model, hidden_dim):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden_dim, bias=False)
        self.up_proj = nn.Linear(d_model, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, d_model, bias=False)

    def forward(self, x):
        u = self.up_proj(x)
        return self.down_proj(u * torch.sigmoid(u) * self.gate_proj(x))
''', bug="B11.swiglu_swapped"),
    Answer("11.SwiGLUFeedForward", "GELU instead of SiLU", '''
class SwiGLUFeedForward(nn.Module):
    def __init__(self, d_model, hidden_dim):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden_dim, bias=False)
        self.up_proj = nn.Linear(d_model, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.gelu(self.gate_proj(x)) * self.up_proj(x))
''', bug="B11.swiglu_gelu"),
    # ---------------------------------------------------------------- 11.rope
    Answer("11.rope", "interleaved pairs (x0, x1) instead of half-split", '''
def rotate_half(x):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def rope_cos_sin(inv_freq, positions):
    angles = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.repeat_interleave(angles, 2, dim=-1)
    return emb.cos(), emb.sin()
''', says=r"= cat\(f, f\)"),
    Answer("11.rope", "every frequency divided by the factor (no smoothing bands)", '''
def rope_inv_freq(head_dim, theta=500000.0, scaling=None):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling is None:
        return inv
    return inv / scaling["factor"]
''', says=r"Llama-3 scaling 32/1/4/8192"),
    Answer("11.rope", "exponent i / head_dim with i = 0, 1, 2, … (not 2i / head_dim)", '''
def rope_inv_freq(head_dim, theta=500000.0, scaling=None):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim // 2, dtype=torch.float32) / head_dim))
    if scaling is None:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > orig / low, inv / factor, inv)
    s = (orig / wavelen - low) / (high - low)
    smoothed = (1 - s) * out / factor + s * out
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return torch.where(medium, smoothed, out)
''', says=r"the eight inverse frequencies"),
    # ---------------------------------------------------------------- 11.GroupedQueryAttention
    Answer("11.GroupedQueryAttention", "ignores its mask argument and builds its own causal tril", _gqa(
        mask='scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))'),
        says=r"non-causal boolean mask.*apply the mask you are given", origin="issue 38"),
    Answer("11.GroupedQueryAttention", "KV heads tiled (repeat) instead of interleaved", _gqa(
        repeat="k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)"), bug="B11.repeat_not_interleave"),
    Answer("11.GroupedQueryAttention", "no 1/sqrt(head_dim) scale", _gqa(
        mask='scores = (scores * math.sqrt(self.head_dim)).masked_fill(~mask, float("-inf"))'), says=r"vs F.scaled_dot_product_attention"),
    # ---------------------------------------------------------------- 11.Llama3Model
    Answer("11.Llama3Model", "rope_scaling ignored when the tables are built", _model(scaling="None"),
           says=r"logits vs transformers' LlamaForCausalLM.*Llama-3 smoothing"),
    Answer("11.Llama3Model", "no final norm before the head", _model(final=""), says=r"logits vs transformers' LlamaForCausalLM"),
    Answer("11.Llama3Model", "theta fixed at 10,000", _model(theta="10000.0"), says=r"logits vs transformers' LlamaForCausalLM"),
]
