# %% [markdown]
# # Unit 08 — The GPT-2 model: exercises
#
# Four graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: logits compared with Hugging Face's
# `GPT2LMHeadModel` on small random configurations, exact parameter counts of every released size,
# causality, weight tying and the initialisation statistics. When something fails it tells you what
# was expected, what came back, and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/08_gpt2_model/08_gpt2_model.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `math`, the standard library and the
# course pieces imported below: `MultiHeadAttention` (unit 04), `LayerNorm` and `FeedForward`
# (unit 05).

# %%
import math  # noqa: F401
from dataclasses import dataclass

import torch
from torch import nn

import llmcourse
from llmcourse.nn.feedforward import FeedForward
from llmcourse.nn.multihead import MultiHeadAttention
from llmcourse.nn.norms import LayerNorm

cfg = llmcourse.setup_notebook("08")

# %% [markdown]
# ## Exercise 1 — `GPT2Config` (2 points)
#
# A dataclass holding GPT-2's hyper-parameters. The fields are given (their defaults are GPT-2
# small's); write the class method `preset`:
#
# ```python
# @dataclass
# class GPT2Config:
#     vocab_size: int = 50257; context_length: int = 1024; d_model: int = 768; n_heads: int = 12
#     n_layers: int = 12; dropout: float = 0.1; qkv_bias: bool = True; layer_norm_eps: float = 1e-5
#     tie_weights: bool = True
#
#     @classmethod
#     def preset(cls, name: str) -> "GPT2Config": ...
# ```
#
# `preset(name)` returns a **new** config for:
#
# | name | n_layers | d_model | n_heads | other fields |
# |---|---:|---:|---:|---|
# | `"gpt2-small"` | 12 | 768 | 12 | defaults |
# | `"gpt2-medium"` | 24 | 1024 | 16 | defaults |
# | `"gpt2-large"` | 36 | 1280 | 20 | defaults |
# | `"gpt2-xl"` | 48 | 1600 | 25 | defaults |
# | `"gpt2-char-tiny"` | 4 | 128 | 4 | `vocab_size=65`, `context_length=64`, `dropout=0.0` |
#
# Any other name raises `KeyError`.

# %% tags=["solution:08.GPT2Config"]
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
        ### BEGIN SOLUTION
        sizes = {"gpt2-small": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20),
                 "gpt2-xl": (48, 1600, 25), "gpt2-char-tiny": (4, 128, 4)}
        if name not in sizes:
            raise KeyError(f"unknown preset {name!r}")
        n_layers, d_model, n_heads = sizes[name]
        config = cls(n_layers=n_layers, d_model=d_model, n_heads=n_heads)
        if name == "gpt2-char-tiny":
            config.vocab_size, config.context_length, config.dropout = 65, 64, 0.0
        return config
        ### END SOLUTION


# %% tags=["tests:08.GPT2Config"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("08.GPT2Config")  # noqa: E702
### END HIDDEN TESTS
small = GPT2Config()
assert (small.vocab_size, small.context_length, small.d_model, small.n_heads, small.n_layers) == (50257, 1024, 768, 12, 12)
tiny = GPT2Config.preset("gpt2-char-tiny")
assert (tiny.vocab_size, tiny.context_length, tiny.d_model, tiny.n_heads, tiny.n_layers, tiny.dropout) == \
    (65, 64, 128, 4, 4, 0.0), f"gpt2-char-tiny: got {tiny}"
assert GPT2Config.preset("gpt2-xl").d_model == 1600
try:
    GPT2Config.preset("gpt-5")
except KeyError:
    pass
else:
    raise AssertionError("an unknown preset name must raise KeyError")
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `GPT2Model` (8 points)
#
# ```python
# class GPT2Model(nn.Module):
#     def __init__(self, cfg): ...
#     def forward(self, idx): ...        # (B, T) long -> logits (B, T, vocab_size) float32
#     def init_weights(self): ...
# ```
#
# **Architecture** (D = `d_model`): `tok_emb(idx) + pos_emb(0 … T−1)` → dropout → `n_layers` blocks →
# `final_norm` → `lm_head`. Each block is **pre-LN**:
#
# ```
# x = x + dropout(attn(norm1(x)))     # causal multi-head self-attention
# x = x + dropout(ffn(norm2(x)))      # D -> 4D -> D with GELU, tanh approximation
# ```
#
# Use `MultiHeadAttention(D, D, n_heads, dropout, qkv_bias=cfg.qkv_bias, causal=True,
# context_length=cfg.context_length)`, `LayerNorm(D, eps=cfg.layer_norm_eps)` and
# `FeedForward(D, 4 * D, activation="gelu_tanh")`. Fill in the `GPT2Block(cfg)` class first (one
# block, with exactly the attribute names below), then the model.
#
# **`state_dict` keys and shapes** (exactly these; V = `vocab_size`, C = `context_length`):
#
# ```
# tok_emb.weight (V, D)                 pos_emb.weight (C, D)
# blocks.{i}.norm1.weight / .bias (D)
# blocks.{i}.attn.W_query.weight (D, D) / .bias (D)      (also W_key, W_value)
# blocks.{i}.attn.out_proj.weight (D, D) / .bias (D)
# blocks.{i}.norm2.weight / .bias (D)
# blocks.{i}.ffn.fc1.weight (4D, D) / .bias (4D)         blocks.{i}.ffn.fc2.weight (D, 4D) / .bias (D)
# final_norm.weight / .bias (D)
# lm_head.weight (V, D)                 no bias
# ```
#
# **Weight tying**: when `cfg.tie_weights`, `lm_head.weight` must be **the same Parameter object** as
# `tok_emb.weight` (not a copy); otherwise the head is its own `(V, D)` Parameter.
#
# **`forward`** raises `ValueError` when `T > context_length`.
#
# **`init_weights()`** (call it at the end of `__init__`): every `nn.Linear` and `nn.Embedding` weight
# ~ N(0, 0.02²), every bias 0, every LayerNorm weight 1 and bias 0; then, in every block,
# `attn.out_proj.weight` and `ffn.fc2.weight` ~ N(0, (0.02/√(2·n_layers))²).

# %% tags=["solution:08.GPT2Model"]
class GPT2Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ### BEGIN SOLUTION
        d = cfg.d_model
        self.norm1 = LayerNorm(d, eps=cfg.layer_norm_eps)
        self.attn = MultiHeadAttention(d, d, cfg.n_heads, cfg.dropout, qkv_bias=cfg.qkv_bias, causal=True,
                                       context_length=cfg.context_length)
        self.norm2 = LayerNorm(d, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(d, 4 * d, activation="gelu_tanh")
        self.dropout = nn.Dropout(cfg.dropout)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.dropout(self.ffn(self.norm2(x)))
        ### END SOLUTION


class GPT2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ### BEGIN SOLUTION
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([GPT2Block(cfg) for _ in range(cfg.n_layers)])
        self.final_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.init_weights()
        ### END SOLUTION

    def forward(self, idx):
        ### BEGIN SOLUTION
        t = idx.shape[1]
        if t > self.cfg.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length={self.cfg.context_length}")
        x = self.dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))
        ### END SOLUTION

    @torch.no_grad()
    def init_weights(self):
        ### BEGIN SOLUTION
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            nn.init.normal_(block.attn.out_proj.weight, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layers))
            nn.init.normal_(block.ffn.fc2.weight, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layers))
        ### END SOLUTION


# %% tags=["tests:08.GPT2Model"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("08.GPT2Model")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
tiny_cfg = llmcourse.GPT2Config.preset("gpt2-char-tiny")   # the course's config, so this test does not need yours
model = GPT2Model(tiny_cfg).eval()
assert model.lm_head.weight is model.tok_emb.weight, "lm_head.weight must BE tok_emb.weight (weight tying)"
n_params = sum(p.numel() for p in model.parameters())
assert n_params == 809_856, f"gpt2-char-tiny has 809,856 parameters (head tied); got {n_params:,}"
idx = torch.randint(0, 65, (2, 20))
with torch.no_grad():
    logits = model(idx)
    changed = idx.clone()
    changed[:, 15:] = 0
    logits_changed = model(changed)
assert logits.shape == (2, 20, 65), f"expected logits (2, 20, 65), got {tuple(logits.shape)}"
assert torch.allclose(logits_changed[:, :15], logits[:, :15], atol=1e-6), "position t must not see tokens after t"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `gpt2_param_count` and `count_parameters` (3 points)
#
# ```python
# gpt2_param_count(cfg) -> int        # exact, from the config alone (no model is built)
# count_parameters(model) -> int      # number of values in the model's UNIQUE parameter tensors
# ```
#
# Work out the formula from the `state_dict` table of exercise 2 (every key is a parameter; `qkv_bias=False`
# removes the three Q/K/V biases; a tied head is the token embedding's tensor, an untied one its own). The
# evidence it must reproduce: GPT-2 small has 124,439,808 parameters with a tied head and 163,037,184 with
# an untied one; `gpt2-char-tiny` has 809,856; GPT-2 XL 1,557,611,200.
# `count_parameters` must count a shared tensor **once** (the tied head is one tensor with two names).
# It must also work for a model built on the `meta` device (shapes without memory).

# %% tags=["solution:08.gpt2_param_count"]
def gpt2_param_count(cfg):
    ### BEGIN SOLUTION
    v, c, d, n = cfg.vocab_size, cfg.context_length, cfg.d_model, cfg.n_layers
    total = v * d + c * d + n * (12 * d * d + 13 * d) + 2 * d
    if not cfg.tie_weights:
        total += v * d
    if not cfg.qkv_bias:
        total -= 3 * d * n
    return total
    ### END SOLUTION


def count_parameters(model):
    ### BEGIN SOLUTION
    unique = {id(p): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(unique.values())
    ### END SOLUTION


# %% tags=["tests:08.gpt2_param_count"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("08.gpt2_param_count")  # noqa: E702
### END HIDDEN TESTS
assert gpt2_param_count(llmcourse.GPT2Config()) == 124_439_808, "GPT-2 small with a tied head has 124,439,808"
with torch.device("meta"):
    meta_tiny = llmcourse.GPT2Model(llmcourse.GPT2Config.preset("gpt2-char-tiny"))
assert count_parameters(meta_tiny) == 809_856, f"count the tied head once: got {count_parameters(meta_tiny):,}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `load_hf_gpt2` (7 points)
#
# ```python
# @torch.no_grad()
# def load_hf_gpt2(model, hf_state_dict) -> model
# ```
#
# Copy the weights of a Hugging Face `GPT2LMHeadModel` (its `state_dict()`: keys `transformer.wte.weight`,
# `transformer.h.{i}.attn.c_attn.weight`, …) **in place** into a course `GPT2Model` and return the
# same model. The contract is an oracle: **the loaded model's logits must equal `GPT2LMHeadModel`'s with the
# same weights** (to float32 rounding, on random weights in every tensor). Which key goes where:
#
# | Hugging Face key (shape) | course key |
# |---|---|
# | `transformer.wte.weight` (V, D) | `tok_emb.weight` (a tied head follows) |
# | `transformer.wpe.weight` (C, D) | `pos_emb.weight` |
# | `transformer.h.{i}.ln_1.{weight,bias}` | `blocks.{i}.norm1.*` |
# | `transformer.h.{i}.attn.c_attn.weight` (D, 3D) and `.bias` (3D) | `blocks.{i}.attn.W_query/W_key/W_value.*` |
# | `transformer.h.{i}.attn.c_proj.weight` (D, D) / `.bias` | `blocks.{i}.attn.out_proj.*` |
# | `transformer.h.{i}.ln_2.*` | `blocks.{i}.norm2.*` |
# | `transformer.h.{i}.mlp.c_fc.weight` (D, 4D) / `.bias` | `blocks.{i}.ffn.fc1.*` |
# | `transformer.h.{i}.mlp.c_proj.weight` (4D, D) / `.bias` | `blocks.{i}.ffn.fc2.*` |
# | `transformer.ln_f.*` | `final_norm.*` |
# | `lm_head.weight` | not copied (tied) |
#
# **How each tensor must be transformed is your decision**, from what the layers compute: Hugging Face's
# GPT-2 layers are `transformers.pytorch_utils.Conv1D`s, which compute `y = x @ weight + bias`, while
# `nn.Linear` computes `y = x @ weight.T + bias`; the fused `c_attn` produces query, key and value in one
# matmul, `3D` outputs per position. Decide along which dimension the three parts lie, in which order, and
# which weights need a transpose; a square `D×D` weight loads without a shape error either way, so only the
# logits can tell you. Try it on one layer first: build a `Conv1D(nf, nx)` and an `nn.Linear`, copy, compare.
#
# Raise `ValueError` on any shape mismatch; ignore keys ending in `.attn.bias` or `.attn.masked_bias`
# (buffers that older checkpoints carry). Copy into the existing tensors (`param.copy_(...)`), so a tied
# head stays tied.

# %% tags=["solution:08.load_hf_gpt2"]
@torch.no_grad()
def load_hf_gpt2(model, hf_state_dict):
    ### BEGIN SOLUTION
    sd = {k.removeprefix("transformer."): v for k, v in hf_state_dict.items()
          if not k.endswith((".attn.bias", ".attn.masked_bias"))}

    def put(param, value):
        if param.shape != value.shape:
            raise ValueError(f"shape mismatch: {tuple(param.shape)} vs {tuple(value.shape)}")
        param.copy_(value)

    d = model.tok_emb.weight.shape[1]
    put(model.tok_emb.weight, sd["wte.weight"])
    put(model.pos_emb.weight, sd["wpe.weight"])
    for i, block in enumerate(model.blocks):
        h = f"h.{i}."
        put(block.norm1.weight, sd[h + "ln_1.weight"])
        put(block.norm1.bias, sd[h + "ln_1.bias"])
        w, b = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]
        if w.shape != (d, 3 * d):
            raise ValueError(f"c_attn.weight must be ({d}, {3 * d}), got {tuple(w.shape)}")
        for j, lin in enumerate((block.attn.W_query, block.attn.W_key, block.attn.W_value)):
            put(lin.weight, w[:, j * d:(j + 1) * d].T)
            put(lin.bias, b[j * d:(j + 1) * d])
        put(block.attn.out_proj.weight, sd[h + "attn.c_proj.weight"].T)
        put(block.attn.out_proj.bias, sd[h + "attn.c_proj.bias"])
        put(block.norm2.weight, sd[h + "ln_2.weight"])
        put(block.norm2.bias, sd[h + "ln_2.bias"])
        put(block.ffn.fc1.weight, sd[h + "mlp.c_fc.weight"].T)
        put(block.ffn.fc1.bias, sd[h + "mlp.c_fc.bias"])
        put(block.ffn.fc2.weight, sd[h + "mlp.c_proj.weight"].T)
        put(block.ffn.fc2.bias, sd[h + "mlp.c_proj.bias"])
    put(model.final_norm.weight, sd["ln_f.weight"])
    put(model.final_norm.bias, sd["ln_f.bias"])
    return model
    ### END SOLUTION


# %% tags=["tests:08.load_hf_gpt2"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("08.load_hf_gpt2")  # noqa: E702
### END HIDDEN TESTS
from llmcourse.models import random_hf_gpt2  # noqa: E402

small_cfg = llmcourse.GPT2Config(vocab_size=1000, context_length=128, d_model=64, n_heads=4, n_layers=2, dropout=0.0)
hf = random_hf_gpt2(small_cfg, seed=0)      # transformers' GPT2LMHeadModel, every weight random
ours = load_hf_gpt2(llmcourse.GPT2Model(small_cfg).eval(), hf.state_dict())
idx = torch.randint(0, 1000, (2, 17), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    want = hf(idx).logits
    diff = (ours(idx) - want).abs().max().item()
# float32 rounding at the logits' scale: 8 ulps × max |logit| × √(summed length of the forward's reductions)
D, T = small_cfg.d_model, idx.shape[1]
reduction = small_cfg.n_layers * (2 * D + D + D // small_cfg.n_heads + 2 * T + D + 2 * D + D + 4 * D) + 3 * D
bound = 8 * torch.finfo(torch.float32).eps * want.abs().max().item() * math.sqrt(reduction)
print(f"max |logits - transformers' logits| = {diff:.2e} (float32 rounding bound at their scale: {bound:.1e})")
assert diff < bound, (f"the loaded model must reproduce transformers' logits: max difference {diff:.3g} > {bound:.2g} "
                      f"(transformers' attention: {hf.config._attn_implementation}, torch kernels: "
                      f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)")
assert ours.lm_head.weight is ours.tok_emb.weight, "the head must stay tied after loading"
print("visible tests passed")
