"""Unit 02's red-team answers (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

_GPT_INIT = '''
class GPTEmbedding(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, dropout=0.0):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.drop = nn.Dropout(dropout)
        self.context_length = context_length
'''

ANSWERS = [
    # -- 02.embedding_lookup ---------------------------------------------------------------------------------
    Answer("02.embedding_lookup", "one_hot without num_classes (V taken from the largest id)", '''
def one_hot_matmul(ids, weight):
    return F.one_hot(ids).to(weight.dtype) @ weight
''', says=r"."),
    Answer("02.embedding_lookup", "the lookup detaches the table (no gradient reaches weight)", '''
def embedding_lookup(ids, weight):
    return weight.detach()[ids]
''', says=r"grad"),
    Answer("02.embedding_lookup", "one-hot cast to float32, not to the table's dtype", '''
def one_hot_matmul(ids, weight):
    return F.one_hot(ids, weight.shape[0]).float() @ weight
''', says=r"dtype|float64|double"),
    # -- 02.InputEmbeddings ----------------------------------------------------------------------------------
    Answer("02.InputEmbeddings", "padding_idx=0 added to the table", '''
class InputEmbeddings(nn.Module):
    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.d_model = d_model

    def forward(self, ids):
        return self.embedding(ids) * math.sqrt(self.d_model)
''', says=r"grad"),
    Answer("02.InputEmbeddings", "the table scaled once at construction instead of in forward", '''
class InputEmbeddings(nn.Module):
    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        with torch.no_grad():
            self.embedding.weight.mul_(math.sqrt(d_model))

    def forward(self, ids):
        return self.embedding(ids)
''', bug="B02.no_scale"),
    # -- 02.sinusoidal_pe ------------------------------------------------------------------------------------
    Answer("02.sinusoidal_pe", "sines and cosines in two halves, not interleaved", '''
def sinusoidal_pe(max_len, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    p = torch.arange(max_len, dtype=torch.float32)[:, None]
    w = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    return torch.cat([torch.sin(p * w), torch.cos(p * w)], dim=1)
''', bug="B02.concat_halves"),
    Answer("02.sinusoidal_pe", "frequency 10000^(-i/D) per pair (the 2 forgotten)", '''
def sinusoidal_pe(max_len, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    p = torch.arange(max_len, dtype=torch.float32)[:, None]
    w = 10000.0 ** (-torch.arange(d_model // 2, dtype=torch.float32) / d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(p * w)
    pe[:, 1::2] = torch.cos(p * w)
    return pe
''', bug="B02.positive_exponent"),
    Answer("02.sinusoidal_pe", "float64 table returned", '''
def sinusoidal_pe(max_len, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    p = torch.arange(max_len, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(p * w)
    pe[:, 1::2] = torch.cos(p * w)
    return pe
''', says=r"float32|dtype"),
    # -- 02.PositionalEncoding -------------------------------------------------------------------------------
    Answer("02.PositionalEncoding", "dropout on the table only, not on the sum", '''
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        self.register_buffer("pe", sinusoidal_pe(max_len, d_model)[None], persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        T = x.shape[1]
        if T > self.pe.shape[1]:
            raise ValueError(f"T={T} > max_len={self.pe.shape[1]}")
        return x + self.dropout(self.pe[:, :T])
''', bug="B02.pe_dropout_only"),
    Answer("02.PositionalEncoding", "dropout probability hard-coded to 0.1", '''
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        self.register_buffer("pe", sinusoidal_pe(max_len, d_model)[None], persistent=False)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        T = x.shape[1]
        if T > self.pe.shape[1]:
            raise ValueError(f"T={T} > max_len={self.pe.shape[1]}")
        return self.dropout(x + self.pe[:, :T])
''', says=r"dropout|probab|p ="),
    Answer("02.PositionalEncoding", "a plain tensor attribute (does not follow .to)", '''
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        self.pe = sinusoidal_pe(max_len, d_model)[None]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        T = x.shape[1]
        if T > self.pe.shape[1]:
            raise ValueError(f"T={T} > max_len={self.pe.shape[1]}")
        return self.dropout(x + self.pe[:, :T])
''', bug="B02.pe_attribute"),
    Answer("02.PositionalEncoding", "a persistent buffer (the table saved in every checkpoint)", '''
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        self.register_buffer("pe", sinusoidal_pe(max_len, d_model)[None])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        T = x.shape[1]
        if T > self.pe.shape[1]:
            raise ValueError(f"T={T} > max_len={self.pe.shape[1]}")
        return self.dropout(x + self.pe[:, :T])
''', bug="B02.pe_persistent"),
    # -- 02.shift_matrix -------------------------------------------------------------------------------------
    Answer("02.shift_matrix", "the transposed rotation (rotates backwards)", '''
def shift_matrix(k, omega):
    c, s = math.cos(omega * k), math.sin(omega * k)
    return torch.tensor([[c, -s], [s, c]])
''', bug="B02.shift_transposed"),
    Answer("02.shift_matrix", "the angle omega + k instead of omega * k", '''
def shift_matrix(k, omega):
    c, s = math.cos(omega + k), math.sin(omega + k)
    return torch.tensor([[c, s], [-s, c]])
''', says=r"."),
    # -- 02.GPTEmbedding -------------------------------------------------------------------------------------
    Answer("02.GPTEmbedding", "positions built with torch.arange(T), ignoring idx's device", _GPT_INIT + '''
    def forward(self, idx):
        T = idx.shape[1]
        if T > self.context_length:
            raise ValueError(f"T={T} > context_length={self.context_length}")
        return self.drop(self.tok_emb(idx) + self.pos_emb(torch.arange(T)))
''', bug="B02.positions_default_device", origin="issue 37"),
    Answer("02.GPTEmbedding", "the sum scaled by sqrt(d_model) as in the Transformer", _GPT_INIT + '''
    def forward(self, idx):
        T = idx.shape[1]
        if T > self.context_length:
            raise ValueError(f"T={T} > context_length={self.context_length}")
        pos = torch.arange(T, device=idx.device)
        d = self.tok_emb.embedding_dim
        return self.drop(self.tok_emb(idx) * math.sqrt(d) + self.pos_emb(pos))
''', says=r"GPTEmbedding\(50, 8, 12\) on idx"),
    Answer("02.GPTEmbedding", "dropout on the token vectors only", _GPT_INIT + '''
    def forward(self, idx):
        T = idx.shape[1]
        if T > self.context_length:
            raise ValueError(f"T={T} > context_length={self.context_length}")
        pos = torch.arange(T, device=idx.device)
        return self.drop(self.tok_emb(idx)) + self.pos_emb(pos)
''', says=r"dropout|sum"),
]
