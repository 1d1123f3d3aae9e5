"""Unit 03's red-team answers (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

_CSA_INIT = '''
class CausalSelfAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout=0.0, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(context_length, context_length, dtype=torch.bool).tril(),
                             persistent=False)
'''

ANSWERS = [
    # -- 03.softmax_stable -----------------------------------------------------------------------------------
    Answer("03.softmax_stable", "the max taken over the last axis whatever dim is", '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)
''', says=r"dim"),
    Answer("03.softmax_stable", "one global max for the whole tensor", '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim=dim, keepdim=True)
''', bug="B03.naive_softmax"),
    Answer("03.softmax_stable", "inputs clamped to [-80, 80] before exp", '''
def softmax_stable(x, dim=-1):
    e = torch.exp(x.clamp(-80, 80))
    return e / e.sum(dim=dim, keepdim=True)
''', says=r"."),
    # -- 03.simple_attention ---------------------------------------------------------------------------------
    Answer("03.simple_attention", "softmax over dim=1 (the columns of a batched input)", '''
def simple_attention(x):
    scores = x @ x.transpose(-2, -1)
    weights = torch.softmax(scores, dim=1)
    return weights @ x, weights
''', bug="B03.softmax_dim"),
    Answer("03.simple_attention", "scores scaled by 1/sqrt(d) though the task says no scaling", '''
def simple_attention(x):
    scores = x @ x.transpose(-2, -1) / math.sqrt(x.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    return weights @ x, weights
''', bug="B03.simple_scaled"),
    # -- 03.scaled_dot_product_attention ---------------------------------------------------------------------
    Answer("03.scaled_dot_product_attention", "masked_fill(~mask, -1e9) instead of -inf", '''
def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = torch.softmax(scores, dim=-1)
    p = weights if dropout is None else dropout(weights)
    return p @ v, weights
''', bug="B03.mask_fill_finite", origin="issue 37"),
    Answer("03.scaled_dot_product_attention", "weights returned after dropout", '''
def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights
''', says=r"dropout"),
    Answer("03.scaled_dot_product_attention", "mask applied after the softmax (rows no longer sum to 1)", '''
def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    p = weights if dropout is None else dropout(weights)
    return p @ v, weights
''', bug="B03.mask_after_softmax"),
    Answer("03.scaled_dot_product_attention", "dropout on the context, not on the weights", '''
def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = weights @ v
    return (out if dropout is None else dropout(out)), weights
''', says=r"dropout"),
    # -- 03.SelfAttention ------------------------------------------------------------------------------------
    Answer("03.SelfAttention", "scores scaled by sqrt(d_in)", '''
class SelfAttention(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.d_in = d_in
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_in), dim=-1)
        return w @ v
''', bug="B03.scale_d_in"),
    Answer("03.SelfAttention", "qkv_bias ignored (no bias ever)", '''
class SelfAttention(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
        return w @ v
''', says=r"bias"),
    # -- 03.CausalSelfAttention ------------------------------------------------------------------------------
    Answer("03.CausalSelfAttention", "last_weights stored after dropout", _CSA_INIT + '''
    def forward(self, x):
        B, T, _ = x.shape
        if T > self.mask.shape[0]:
            raise ValueError(f"T={T} > context_length")
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        s = (q @ k.transpose(1, 2) / math.sqrt(k.shape[-1])).masked_fill(~self.mask[:T, :T], float("-inf"))
        w = self.dropout(torch.softmax(s, dim=-1))
        self.last_weights = w.detach()
        return w @ v
''', bug="B03.last_weights_after_dropout", origin="issue 37"),
    Answer("03.CausalSelfAttention", "dropout on the output instead of the weights", _CSA_INIT + '''
    def forward(self, x):
        B, T, _ = x.shape
        if T > self.mask.shape[0]:
            raise ValueError(f"T={T} > context_length")
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        s = (q @ k.transpose(1, 2) / math.sqrt(k.shape[-1])).masked_fill(~self.mask[:T, :T], float("-inf"))
        w = torch.softmax(s, dim=-1)
        self.last_weights = w.detach()
        return self.dropout(w @ v)
''', bug="B03.dropout_not_on_weights"),
    Answer("03.CausalSelfAttention", "mask buffer stored as True = blocked (upper triangle)", '''
class CausalSelfAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout=0.0, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        if T > self.mask.shape[0]:
            raise ValueError(f"T={T} > context_length")
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        s = (q @ k.transpose(1, 2) / math.sqrt(k.shape[-1])).masked_fill(self.mask[:T, :T], float("-inf"))
        w = torch.softmax(s, dim=-1)
        self.last_weights = w.detach()
        return self.dropout(w) @ v
''', bug="B03.mask_buffer_blocked"),
    Answer("03.CausalSelfAttention", "qkv_bias ignored", '''
class CausalSelfAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout=0.0, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(context_length, context_length, dtype=torch.bool).tril(),
                             persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        if T > self.mask.shape[0]:
            raise ValueError(f"T={T} > context_length")
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        s = (q @ k.transpose(1, 2) / math.sqrt(k.shape[-1])).masked_fill(~self.mask[:T, :T], float("-inf"))
        w = torch.softmax(s, dim=-1)
        self.last_weights = w.detach()
        return self.dropout(w) @ v
''', says=r"bias"),
]
