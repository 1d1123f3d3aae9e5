"""Unit 08 red-team corpus (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

_BLOCK = '''
class GPT2Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.norm1 = LayerNorm(d, eps=cfg.layer_norm_eps)
        self.attn = MultiHeadAttention(d, d, cfg.n_heads, cfg.dropout, qkv_bias=cfg.qkv_bias, causal=True,
                                       context_length=cfg.context_length)
        self.norm2 = LayerNorm(d, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(d, 4 * d, activation="gelu_tanh")
        self.dropout = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout

    def forward(self, x):
        {block_forward}
'''

_MODEL = '''
class GPT2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([GPT2Block(cfg) for _ in range(cfg.n_layers)])
        self.final_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        {tie}
        self.init_weights()

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.cfg.context_length:
            raise ValueError("too long")
        {model_forward}

    @torch.no_grad()
    def init_weights(self):
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        {scaled_init}
'''

_OK = dict(
    block_forward="x = x + self.dropout(self.attn(self.norm1(x)))\n        return x + self.dropout(self.ffn(self.norm2(x)))",
    tie="if cfg.tie_weights:\n            self.lm_head.weight = self.tok_emb.weight",
    model_forward="x = self.dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device)))\n"
                  "        for block in self.blocks:\n            x = block(x)\n"
                  "        return self.lm_head(self.final_norm(x))",
    scaled_init="for block in self.blocks:\n"
                "            nn.init.normal_(block.attn.out_proj.weight, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layers))\n"
                "            nn.init.normal_(block.ffn.fc2.weight, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layers))",
)


def _gpt2(**changes) -> str:
    parts = {**_OK, **changes}
    return "import torch.nn.functional as F\n" + _BLOCK.format(**parts) + _MODEL.format(**parts)


ANSWERS = [
    # ---------------------------------------------------------------- 08.GPT2Config
    Answer("08.GPT2Config", "an unknown preset falls back to GPT-2 small", '''
@dataclass
class GPT2Config:
    vocab_size: int = 50257
    context_length: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    dropout: float = 0.1
    qkv_bias: bool = True
    layer_norm_eps: float = 1e-5
    tie_weights: bool = True

    @classmethod
    def preset(cls, name):
        sizes = {"gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20), "gpt2-xl": (48, 1600, 25),
                 "gpt2-char-tiny": (4, 128, 4)}
        n_layers, d_model, n_heads = sizes.get(name, (12, 768, 12))
        config = cls(n_layers=n_layers, d_model=d_model, n_heads=n_heads)
        if name == "gpt2-char-tiny":
            config.vocab_size, config.context_length, config.dropout = 65, 64, 0.0
        return config
''', says=r"must raise KeyError"),
    Answer("08.GPT2Config", "presets shared between calls (one cached object per name)", '''
_PRESETS = {}


@dataclass
class GPT2Config:
    vocab_size: int = 50257
    context_length: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    dropout: float = 0.1
    qkv_bias: bool = True
    layer_norm_eps: float = 1e-5
    tie_weights: bool = True

    @classmethod
    def preset(cls, name):
        sizes = {"gpt2-small": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20),
                 "gpt2-xl": (48, 1600, 25), "gpt2-char-tiny": (4, 128, 4)}
        if name not in sizes:
            raise KeyError(name)
        if name not in _PRESETS:
            n_layers, d_model, n_heads = sizes[name]
            config = cls(n_layers=n_layers, d_model=d_model, n_heads=n_heads)
            if name == "gpt2-char-tiny":
                config.vocab_size, config.context_length, config.dropout = 65, 64, 0.0
            _PRESETS[name] = config
        return _PRESETS[name]
''', says=r"must return a new object"),
    Answer("08.GPT2Config", "gpt2-char-tiny keeps the default dropout 0.1", '''
@dataclass
class GPT2Config:
    vocab_size: int = 50257
    context_length: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    dropout: float = 0.1
    qkv_bias: bool = True
    layer_norm_eps: float = 1e-5
    tie_weights: bool = True

    @classmethod
    def preset(cls, name):
        sizes = {"gpt2-small": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20),
                 "gpt2-xl": (48, 1600, 25), "gpt2-char-tiny": (4, 128, 4)}
        n_layers, d_model, n_heads = sizes[name]
        config = cls(n_layers=n_layers, d_model=d_model, n_heads=n_heads)
        if name == "gpt2-char-tiny":
            config.vocab_size, config.context_length = 65, 64
        return config
''', says=r"'dropout': 0\.0"),
    # ---------------------------------------------------------------- 08.GPT2Model
    Answer("08.GPT2Model", "dropout on in eval mode (F.dropout(..., training=True))", _gpt2(
        block_forward="x = x + F.dropout(self.attn(self.norm1(x)), self.p, training=True)\n"
                      "        return x + F.dropout(self.ffn(self.norm2(x)), self.p, training=True)",
        model_forward="x = F.dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(t)), self.cfg.dropout, training=True)\n"
                      "        for block in self.blocks:\n            x = block(x)\n"
                      "        return self.lm_head(self.final_norm(x))"),
        says=r"in eval mode.*dropout must be off", origin="issue 38"),
    Answer("08.GPT2Model", "an extra dropout before the head", _gpt2(
        model_forward="x = self.dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device)))\n"
                      "        for block in self.blocks:\n            x = block(x)\n"
                      "        return self.lm_head(self.dropout(self.final_norm(x)))"),
        says=r"not after the blocks or before the head", origin="issue 38"),
    Answer("08.GPT2Model", "no scaled init of the residual projections", _gpt2(scaled_init="pass"),
           says=r"residual projections use 0\.02"),
    Answer("08.GPT2Model", "post-LN blocks (norm after the residual add)", _gpt2(
        block_forward="x = self.norm1(x + self.dropout(self.attn(x)))\n"
                      "        return self.norm2(x + self.dropout(self.ffn(x)))"),
        bug="B08.post_ln"),
    Answer("08.GPT2Model", "the head is a copy of the embedding, not the same Parameter", _gpt2(
        tie="if cfg.tie_weights:\n            self.lm_head.weight = nn.Parameter(self.tok_emb.weight.detach().clone())"),
        bug="B08.untied_head"),
    # ---------------------------------------------------------------- 08.gpt2_param_count
    Answer("08.gpt2_param_count", "builds the model on the meta device and counts it", '''
def gpt2_param_count(cfg):
    with torch.device("meta"):
        model = llmcourse.GPT2Model(cfg)
    return sum(p.numel() for p in model.parameters())


def count_parameters(model):
    unique = {id(p): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(unique.values())
''', says=r"no model is built", origin="issue 38"),
    Answer("08.gpt2_param_count", "the formula ignores qkv_bias", '''
def gpt2_param_count(cfg):
    v, c, d, n = cfg.vocab_size, cfg.context_length, cfg.d_model, cfg.n_layers
    total = v * d + c * d + n * (12 * d * d + 13 * d) + 2 * d
    if not cfg.tie_weights:
        total += v * d
    return total


def count_parameters(model):
    unique = {id(p): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(unique.values())
''', bug="B08.count_ignores_qkv_bias"),
    Answer("08.gpt2_param_count", "count_parameters sums the state dict (tied head twice)", '''
def gpt2_param_count(cfg):
    v, c, d, n = cfg.vocab_size, cfg.context_length, cfg.d_model, cfg.n_layers
    total = v * d + c * d + n * (12 * d * d + 13 * d) + 2 * d
    if not cfg.tie_weights:
        total += v * d
    if not cfg.qkv_bias:
        total -= 3 * d * n
    return total


def count_parameters(model):
    return sum(t.numel() for t in model.state_dict().values())
''', bug="B08.count_tied_twice"),
    # ---------------------------------------------------------------- 08.load_hf_gpt2
    Answer("08.load_hf_gpt2", "Conv1D weights copied without a transpose (the square ones load silently)", '''
@torch.no_grad()
def load_hf_gpt2(model, hf_state_dict):
    sd = {k.removeprefix("transformer."): v for k, v in hf_state_dict.items()
          if not k.endswith((".attn.bias", ".attn.masked_bias"))}

    def put(param, value):
        if param.shape != value.shape:
            value = value.T
        if param.shape != value.shape:
            raise ValueError("shape mismatch")
        param.copy_(value)

    d = model.tok_emb.weight.shape[1]
    put(model.tok_emb.weight, sd["wte.weight"])
    put(model.pos_emb.weight, sd["wpe.weight"])
    for i, block in enumerate(model.blocks):
        h = f"h.{i}."
        put(block.norm1.weight, sd[h + "ln_1.weight"])
        put(block.norm1.bias, sd[h + "ln_1.bias"])
        w, b = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]
        for j, lin in enumerate((block.attn.W_query, block.attn.W_key, block.attn.W_value)):
            put(lin.weight, w[:, j * d:(j + 1) * d])
            put(lin.bias, b[j * d:(j + 1) * d])
        put(block.attn.out_proj.weight, sd[h + "attn.c_proj.weight"])
        put(block.attn.out_proj.bias, sd[h + "attn.c_proj.bias"])
        put(block.norm2.weight, sd[h + "ln_2.weight"])
        put(block.norm2.bias, sd[h + "ln_2.bias"])
        put(block.ffn.fc1.weight, sd[h + "mlp.c_fc.weight"])
        put(block.ffn.fc1.bias, sd[h + "mlp.c_fc.bias"])
        put(block.ffn.fc2.weight, sd[h + "mlp.c_proj.weight"])
        put(block.ffn.fc2.bias, sd[h + "mlp.c_proj.bias"])
    put(model.final_norm.weight, sd["ln_f.weight"])
    put(model.final_norm.bias, sd["ln_f.bias"])
    return model
''', says=r"logits of the loaded model vs transformers"),
    Answer("08.load_hf_gpt2", "new Parameters assigned (the tied head is left behind)", '''
@torch.no_grad()
def load_hf_gpt2(model, hf_state_dict):
    sd = {k.removeprefix("transformer."): v for k, v in hf_state_dict.items()
          if not k.endswith((".attn.bias", ".attn.masked_bias"))}

    def put(owner, name, value):
        if getattr(owner, name).shape != value.shape:
            raise ValueError("shape mismatch")
        setattr(owner, name, nn.Parameter(value.clone()))

    d = model.tok_emb.weight.shape[1]
    put(model.tok_emb, "weight", sd["wte.weight"])
    put(model.pos_emb, "weight", sd["wpe.weight"])
    for i, block in enumerate(model.blocks):
        h = f"h.{i}."
        put(block.norm1, "weight", sd[h + "ln_1.weight"])
        put(block.norm1, "bias", sd[h + "ln_1.bias"])
        w, b = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]
        for j, lin in enumerate((block.attn.W_query, block.attn.W_key, block.attn.W_value)):
            put(lin, "weight", w[:, j * d:(j + 1) * d].T)
            put(lin, "bias", b[j * d:(j + 1) * d])
        put(block.attn.out_proj, "weight", sd[h + "attn.c_proj.weight"].T)
        put(block.attn.out_proj, "bias", sd[h + "attn.c_proj.bias"])
        put(block.norm2, "weight", sd[h + "ln_2.weight"])
        put(block.norm2, "bias", sd[h + "ln_2.bias"])
        put(block.ffn.fc1, "weight", sd[h + "mlp.c_fc.weight"].T)
        put(block.ffn.fc1, "bias", sd[h + "mlp.c_fc.bias"])
        put(block.ffn.fc2, "weight", sd[h + "mlp.c_proj.weight"].T)
        put(block.ffn.fc2, "bias", sd[h + "mlp.c_proj.bias"])
    put(model.final_norm, "weight", sd["ln_f.weight"])
    put(model.final_norm, "bias", sd["ln_f.bias"])
    return model
''', bug="B08.tied_by_copy"),
]
