# %% [markdown]
# # Unit 17 — Capstone: a tiny DeepSeek-style model: exercises
#
# Five graded exercises, 30 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: the logits of your model against `transformers`'
# `DeepseekV3ForCausalLM` with the same weights, the state_dict keys and parameter counts, causality and what
# the multi-token-prediction head may see, the bias rule after a training step, the batches each model of a
# comparison trains on, the cache your generator returns, and the FP8 loss change of the course's trained
# DeepSeek. When something fails it tells you what was expected, what came back, and, if your mistake is a
# known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/17_deepseek_capstone/17_deepseek_capstone.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, the standard library and the pieces of earlier
# units imported below (they are the course library's versions of what you built in units 10–16); later
# exercises may call your earlier ones.

# %%
import copy  # noqa: F401
import time  # noqa: F401
from dataclasses import asdict, dataclass  # noqa: F401

import torch
import torch.nn.functional as F  # noqa: F401
from torch import nn

import llmcourse
from llmcourse.data.corpus import get_batch  # noqa: F401
from llmcourse.models.deepseek_mla import DeepSeekMLA, LatentCache  # noqa: F401
from llmcourse.models.deepseek_moe import DeepSeekMoE, DeepSeekTopkRouter  # noqa: F401
from llmcourse.models.llama3 import RMSNorm, SwiGLUFeedForward, rope_cos_sin, rope_inv_freq  # noqa: F401
from llmcourse.models.mtp import MTPModule  # noqa: F401
from llmcourse.nn.kv_cache import attn_cache_elems_per_token  # noqa: F401
from llmcourse.quant.fp8 import convert_linears_to_fp8  # noqa: F401
from llmcourse.train.optim import configure_optimizer  # noqa: F401

cfg = llmcourse.setup_notebook("17")

# %% [markdown]
# ## Exercise 1 — `DeepSeekConfig`, `DeepSeekBlock`, `DeepSeekLM`, `load_hf_deepseek` (10 points)
#
# ```python
# @dataclass
# class DeepSeekConfig:
#     vocab_size: int = 65; d_model: int = 128; n_layers: int = 4; n_heads: int = 4; context_length: int = 256
#     q_lora_rank: int | None = None; kv_lora_rank: int = 64; qk_nope_head_dim: int = 32; qk_rope_head_dim: int = 16
#     v_head_dim: int = 32; rope_theta: float = 10000.0; rope_interleave: bool = True
#     intermediate_size: int = 384; first_k_dense_replace: int = 1
#     moe_intermediate_size: int = 128; n_routed_experts: int = 8; n_shared_experts: int = 1; num_experts_per_tok: int = 2
#     n_group: int = 4; topk_group: int = 2; routed_scaling_factor: float = 1.0; norm_topk_prob: bool = True
#     bias_update_speed: float = 0.001; mtp_depth: int = 1; mtp_lambda: float = 0.3; rms_norm_eps: float = 1e-6
#     tie_word_embeddings: bool = True
#
# class DeepSeekBlock(nn.Module):
#     def __init__(self, cfg: DeepSeekConfig, moe: bool): ...
#     def forward(self, x, cos, sin, mask, cache=None, layer_idx=0): ...   # (B, T, D) -> (B, T, D)
#
# class DeepSeekLM(nn.Module):
#     def __init__(self, cfg: DeepSeekConfig): ...
#     def forward(self, idx, targets=None, cache=None) -> dict: ...
#     def update_router_biases(self) -> None: ...
#
# def load_hf_deepseek(model: DeepSeekLM, hf_state: dict) -> DeepSeekLM: ...
# ```
#
# **The block** is pre-norm: `x + self_attn(input_layernorm(x), …)`, then `x + mlp(post_attention_layernorm(x))`.
# `self_attn` is unit 13's `DeepSeekMLA` (its keys); `mlp` is a SwiGLU of width `intermediate_size` (keys
# `gate_proj`, `up_proj`, `down_proj`) when `moe=False`, else unit 14's `DeepSeekMoE` (keys `gate.weight`,
# `gate.e_score_correction_bias`, `experts.{e}.*`, `shared_experts.*`). `cos, sin` are the RoPE tables
# `(T, qk_rope_head_dim)` of the new tokens' positions (`rope_cos_sin(rope_inv_freq(d_R, θ), positions)`), so that the
# block can serve as the block of unit 15's `MTPModule`, which calls `block(x, cos, sin, mask)`; `mask` is boolean,
# True = may attend.
#
# **The model** has the keys `embed_tokens.weight`, `layers.{i}.…` (a dense block for `i < first_k_dense_replace`,
# MoE blocks after), `norm.weight`, `lm_head.weight` (the same Parameter as the embedding when
# `tie_word_embeddings`) and `mtp.{k}.…`: `mtp_depth` `MTPModule`s whose block is a **dense** `DeepSeekBlock`.
# Initialise linear, embedding and router weights `N(0, 0.02²)`. The router biases must stay buffers.
#
# `forward(idx, targets=None, cache=None)`: `idx (B, T)` long. Returns `{"logits": (B, T, V)}`; with `targets`
# also `loss_main` (cross-entropy of the main logits), `mtp_logits` (list: depth `k` gives `(B, T−k, V)`; position `i`
# embeds token `i+k` and predicts token `i+k+1`, as in unit 15), `loss_mtp` (list of their cross-entropies against
# `targets[:, k:]`) and `loss = loss_main + mtp_lambda / mtp_depth · Σ loss_mtp`. With a `LatentCache`, `idx` holds
# new tokens at positions `cache.seq_len, …`. `update_router_biases()` applies the
# sign rule `b ← b + γ·sign(mean(c) − c)` to every MoE layer, with the loads `c` of the last training-mode forward.
#
# `load_hf_deepseek(model, hf_state)` loads the state dict of `transformers`' `DeepseekV3ForCausalLM` (same sizes):
# drop the `model.` prefix; each MoE layer stores its experts fused, `mlp.experts.gate_up_proj (E, 2I, D)` (rows
# `[:I]` the gate projection, `[I:]` the up projection) and `mlp.experts.down_proj (E, D, I)`;
# `e_score_correction_bias` is copied as float32. `transformers` has no MTP weights: leave yours as they are.
# Return `model`.

# %% tags=["solution:17.DeepSeekLM"]
@dataclass
class DeepSeekConfig:
    """Hyper-parameters of the course's DeepSeek-tiny."""
    vocab_size: int = 65
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    context_length: int = 256
    q_lora_rank: int | None = None
    kv_lora_rank: int = 64
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    intermediate_size: int = 384
    first_k_dense_replace: int = 1
    moe_intermediate_size: int = 128
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    n_group: int = 4
    topk_group: int = 2
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    bias_update_speed: float = 0.001
    mtp_depth: int = 1
    mtp_lambda: float = 0.3
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True


class TableMLA(DeepSeekMLA):
    """Unit 13's attention, called with precomputed RoPE tables instead of positions (optional helper)."""

    _tables = None

    def rope_tables(self, positions):
        ### BEGIN SOLUTION
        return self._tables if self._tables is not None else super().rope_tables(positions)
        ### END SOLUTION

    def forward(self, x, cos, sin, mask, cache=None, layer_idx=0):
        ### BEGIN SOLUTION
        self._tables = (cos, sin)
        try:
            return super().forward(x, torch.arange(x.shape[1]), mask, cache, layer_idx)
        finally:
            self._tables = None
        ### END SOLUTION


class DeepSeekBlock(nn.Module):
    """Pre-norm block: MLA, then a dense SwiGLU (moe=False) or DeepSeekMoE."""

    def __init__(self, cfg, moe):
        super().__init__()
        ### BEGIN SOLUTION
        self.is_moe = moe
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.self_attn = TableMLA(cfg.d_model, cfg.n_heads, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim,
                                  cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.rope_theta, cfg.rope_interleave,
                                  cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        if moe:
            self.mlp = DeepSeekMoE(cfg.d_model, cfg.moe_intermediate_size, cfg.n_routed_experts, cfg.n_shared_experts,
                                   cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor,
                                   cfg.norm_topk_prob, cfg.bias_update_speed)
        else:
            self.mlp = SwiGLUFeedForward(cfg.d_model, cfg.intermediate_size)
        ### END SOLUTION

    def forward(self, x, cos, sin, mask, cache=None, layer_idx=0):
        ### BEGIN SOLUTION
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer_idx)
        return x + self.mlp(self.post_attention_layernorm(x))
        ### END SOLUTION


class DeepSeekLM(nn.Module):
    """Embedding, MLA blocks (dense first), final norm, tied head, MTP modules."""

    def __init__(self, cfg):
        super().__init__()
        ### BEGIN SOLUTION
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(DeepSeekBlock(cfg, i >= cfg.first_k_dense_replace) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.mtp = nn.ModuleList(MTPModule(cfg.d_model, DeepSeekBlock(cfg, False), cfg.rms_norm_eps)
                                 for _ in range(cfg.mtp_depth))
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding, DeepSeekTopkRouter)):
                    nn.init.normal_(m.weight, std=0.02)
        cos, sin = rope_cos_sin(rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta), torch.arange(cfg.context_length))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("causal", torch.ones(cfg.context_length, cfg.context_length, dtype=torch.bool).tril(),
                             persistent=False)
        ### END SOLUTION

    def forward(self, idx, targets=None, cache=None):
        ### BEGIN SOLUTION
        t = idx.shape[1]
        past = 0 if cache is None else cache.seq_len
        if past + t > self.cfg.context_length:
            raise ValueError(f"{past} + {t} tokens exceed the context {self.cfg.context_length}")
        h = self.embed_tokens(idx)
        cos, sin = self.rope_cos[past:past + t], self.rope_sin[past:past + t]
        mask = self.causal[past:past + t, :past + t]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, mask, cache, i)
        logits = self.lm_head(self.norm(h))
        out = {"logits": logits}
        if targets is None:
            return out
        v = logits.shape[-1]
        loss_main = F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1))
        prev, mtp_logits, loss_mtp = h, [], []
        for k, module in enumerate(self.mtp, start=1):
            n = t - k
            prev = module(prev[:, :n], self.embed_tokens(idx[:, k:]), self.rope_cos[k:k + n], self.rope_sin[k:k + n],
                          self.causal[:n, :n])
            lg = self.lm_head(prev)
            mtp_logits.append(lg)
            loss_mtp.append(F.cross_entropy(lg.reshape(-1, v), targets[:, k:].reshape(-1)))
        loss = loss_main
        if loss_mtp:
            loss = loss_main + self.cfg.mtp_lambda / len(loss_mtp) * sum(loss_mtp)
        out.update(loss_main=loss_main, mtp_logits=mtp_logits, loss_mtp=loss_mtp, loss=loss)
        return out
        ### END SOLUTION

    @torch.no_grad()
    def update_router_biases(self):
        ### BEGIN SOLUTION
        for layer in self.layers:
            if isinstance(layer.mlp, DeepSeekMoE):
                layer.mlp.update_bias()
                layer.mlp.last_indices = layer.mlp.last_router_logits = None
        ### END SOLUTION


def load_hf_deepseek(model, hf_state):
    """Load a DeepseekV3ForCausalLM state dict into model; returns model."""
    ### BEGIN SOLUTION
    sd = {}
    for key, v in hf_state.items():
        k = key.removeprefix("model.")
        if "inv_freq" in k:
            continue
        if k.endswith("experts.gate_up_proj"):
            half = v.shape[1] // 2
            for e in range(v.shape[0]):
                sd[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = v[e, :half]
                sd[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = v[e, half:]
        elif k.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                sd[k.replace("down_proj", f"{e}.down_proj.weight")] = v[e]
        else:
            sd[k] = v.float() if k.endswith("e_score_correction_bias") else v
    if model.cfg.tie_word_embeddings:
        sd.setdefault("lm_head.weight", sd["embed_tokens.weight"])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith("mtp.")]
    if missing or unexpected:
        raise KeyError(f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    return model
    ### END SOLUTION


# %% tags=["tests:17.DeepSeekLM"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("17.DeepSeekLM")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
model = DeepSeekLM(DeepSeekConfig())
sd = model.state_dict()
assert "layers.0.mlp.gate_proj.weight" in sd, "layer 0 is dense"
assert "layers.1.mlp.experts.7.up_proj.weight" in sd and "layers.1.mlp.gate.e_score_correction_bias" in sd
assert "mtp.0.mtp_block.mlp.gate_proj.weight" in sd, "the MTP block is a dense DeepSeek block"
assert model.lm_head.weight is model.embed_tokens.weight, "the head is tied"
assert not any("e_score_correction_bias" in n for n, _ in model.named_parameters()), "router biases are buffers"
n_main = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("mtp."))
print(f"main-path parameters: {n_main:,}")
ids = torch.randint(0, 65, (2, 17))
out = model(ids[:, :-1], ids[:, 1:])
assert out["logits"].shape == (2, 16, 65) and len(out["loss_mtp"]) == 1
assert torch.allclose(out["loss"], out["loss_main"] + 0.3 * out["loss_mtp"][0])
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `generate_latent_cached` (6 points)
#
# ```python
# @torch.no_grad()
# def generate_latent_cached(model: DeepSeekLM, idx: Tensor, max_new_tokens: int) -> tuple[Tensor, LatentCache]: ...
# ```
#
# Greedy decoding of `max_new_tokens` tokens after the prompt `idx (B, T0)` with a fresh `LatentCache(n_layers)`:
# one call on the prompt, then one call with a single token (`T = 1`) per new token; the last token is returned,
# not fed. Return `(tokens (B, T0 + max_new_tokens), cache)`. Leave the model in the mode you found it in.
#
# **Your decision: what the MTP module does here.** The evidence your tokens must meet: they equal greedy decoding
# of the same model without a cache (`argmax` of `model(ids)["logits"][:, -1]`, one token at a time), for any
# weights, and the cache holds exactly one latent and one rope key per layer and position. Decide whether the MTP
# module has a part in that loop.

# %% tags=["solution:17.generate_latent_cached"]
@torch.no_grad()
def generate_latent_cached(model, idx, max_new_tokens):
    """Greedy decoding with a latent cache; returns (tokens, cache)."""
    ### BEGIN SOLUTION
    was = model.training
    model.eval()
    cache = LatentCache(len(model.layers))
    out = [idx]
    try:
        if max_new_tokens > 0:
            logits = model(idx, cache=cache)["logits"]
            for step in range(max_new_tokens):
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                out.append(nxt)
                if step < max_new_tokens - 1:
                    logits = model(nxt, cache=cache)["logits"]
        return torch.cat(out, dim=1), cache
    finally:
        model.train(was)
    ### END SOLUTION


# %% tags=["tests:17.generate_latent_cached"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("17.generate_latent_cached")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(1)
small = DeepSeekLM(DeepSeekConfig(d_model=32, n_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                  v_head_dim=8, intermediate_size=64, moe_intermediate_size=16))
prompt = torch.randint(0, 65, (1, 4))
tokens, cache = generate_latent_cached(small, prompt, 6)
ref = prompt
with torch.no_grad():
    for _ in range(6):
        ref = torch.cat([ref, small.eval()(ref)["logits"][:, -1].argmax(-1, keepdim=True)], 1)
assert torch.equal(tokens, ref), "cached tokens must equal uncached greedy decoding"
assert cache.c_kv[0].shape == (1, 9, 16) and cache.k_pe[0].shape == (1, 9, 4)
print(f"cache bytes after 9 positions: {cache.nbytes():,}")
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `train_step` (6 points)
#
# ```python
# def train_step(model: DeepSeekLM, optimizer, x: Tensor, y: Tensor, max_norm: float = 1.0) -> dict: ...
# ```
#
# One training step in training mode: clear the gradients, compute the loss with targets (main + MTP), back-propagate,
# clip the global gradient norm to `max_norm`, step the optimizer, then update the router biases from this step's
# routing. Return `{"loss", "loss_main", "loss_mtp" (list), "expert_load"}`: the three losses as floats and, per MoE
# layer, the `(E,)` long tensor of this step's expert loads (how many `(token, slot)` assignments each expert got),
# the counts the bias update used.

# %% tags=["solution:17.train_step"]
def train_step(model, optimizer, x, y, max_norm=1.0):
    """One optimizer step with the MTP loss and the router-bias update; returns losses and expert loads."""
    ### BEGIN SOLUTION
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(x, y)
    out["loss"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    loads = [torch.bincount(layer.mlp.last_indices.flatten(), minlength=layer.mlp.n_routed_experts)
             for layer in model.layers if isinstance(layer.mlp, DeepSeekMoE)]
    model.update_router_biases()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "expert_load": loads}
    ### END SOLUTION


# %% tags=["tests:17.train_step"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("17.train_step")  # noqa: E702
### END HIDDEN TESTS
opt = torch.optim.AdamW(small.parameters(), lr=1e-3)
b0 = small.layers[1].mlp.gate.e_score_correction_bias.clone()
seq = torch.randint(0, 65, (2, 13))
rec = train_step(small, opt, seq[:, :-1], seq[:, 1:])
c = rec["expert_load"][0].float()
assert torch.allclose(small.layers[1].mlp.gate.e_score_correction_bias - b0, 0.001 * torch.sign(c.mean() - c))
print(f"loss {rec['loss']:.4f} = {rec['loss_main']:.4f} + 0.3 · {rec['loss_mtp'][0]:.4f}")
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `compare_models` (5 points)
#
# ```python
# def compare_models(models: dict[str, nn.Module], train_data, val_data, steps, batch_size, context_length,
#                    lr_fn, seed=0) -> list[dict]: ...
# ```
#
# Train every model for `steps` steps on **the same batches**: step `s` uses
# `get_batch(train_data, batch_size, context_length, torch.Generator().manual_seed(seed + s))` and learning rate
# `lr_fn(s)`, AdamW (unit 10's `configure_optimizer`), clipping at 1.0. A DeepSeek model trains with your
# `train_step` (main + MTP loss, router-bias update); the check passes the course's
# `llmcourse.models.deepseek.DeepSeekLM`, not your class, so recognise a DeepSeek model by what it has (both
# classes have `update_router_biases`) rather than by your own class. Other models return logits from `model(x)`
# and train on the cross-entropy. Return one row per model,
# in input order: `{"name", "total_params", "active_params", "ms_per_step", "val_loss", "cache_elems_per_token"}`.
# Parameters count the main path (MTP modules excluded, a tied weight once). **Your decision: `active_params`**, the
# parameters one token's forward pass actually uses. Decide, for an MoE layer, which of its router, shared expert
# and routed experts count (a token is sent to `num_experts_per_tok` of the `n_routed_experts`); a dense model's
# active count is its total. **`val_loss` is your decision too**: the validation loss that compares the three
# models fairly (a DeepSeek model's output with targets also holds MTP losses), the mean over 10 validation
# batches (generator seed `10_000 + i`). Cache elements per token: unit 12's formulas (MLA: `L·(d_c + d_R)`; Llama: GQA;
# GPT-2: MHA).

# %% tags=["solution:17.compare_models"]
def compare_models(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed=0):
    """Train each model on identical batches; one row per model."""
    ### BEGIN SOLUTION
    def counts(model):
        seen, total, idle = set(), 0, 0
        for name, p in model.named_parameters():
            if not name.startswith("mtp.") and id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        for m in model.modules():
            if isinstance(m, DeepSeekMoE):
                idle += (m.n_routed_experts - m.top_k) * sum(p.numel() for p in m.experts[0].parameters())
        return total, total - idle

    def cache_elems(model):
        c = model.cfg
        if hasattr(c, "kv_lora_rank"):
            return attn_cache_elems_per_token("mla", c.n_layers, kv_lora_rank=c.kv_lora_rank,
                                              qk_rope_head_dim=c.qk_rope_head_dim)
        if hasattr(c, "n_kv_heads"):
            return attn_cache_elems_per_token("gqa", c.n_layers, n_kv_heads=c.n_kv_heads,
                                              head_dim=c.d_model // c.n_heads)
        return attn_cache_elems_per_token("mha", c.n_layers, n_heads=c.n_heads, head_dim=c.d_model // c.n_heads)

    def logits_of(model, x):
        out = model(x)
        return out["logits"] if isinstance(out, dict) else out

    rows = []
    for name, model in models.items():
        opt = configure_optimizer(model, lr_fn(0))
        model.train()
        spent = 0.0
        for s in range(steps):
            x, y = get_batch(train_data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
            for g in opt.param_groups:
                g["lr"] = lr_fn(s)
            t0 = time.perf_counter()
            if hasattr(model, "update_router_biases"):
                train_step(model, opt, x, y)
            else:
                opt.zero_grad(set_to_none=True)
                lg = logits_of(model, x)
                F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            spent += time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            losses = []
            for i in range(10):
                x, y = get_batch(val_data, batch_size, context_length, torch.Generator().manual_seed(10_000 + i))
                lg = logits_of(model, x)
                losses.append(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).item())
        total, active = counts(model)
        rows.append({"name": name, "total_params": total, "active_params": active,
                     "ms_per_step": 1000 * spent / max(steps, 1), "val_loss": sum(losses) / len(losses),
                     "cache_elems_per_token": cache_elems(model)})
    return rows
    ### END SOLUTION


# %% tags=["tests:17.compare_models"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("17.compare_models")  # noqa: E702
### END HIDDEN TESTS
data = torch.randint(0, 65, (2000,))
rows = compare_models({"deepseek-small": small}, data[:1500], data[1500:], 2, 2, 16, lambda s: 1e-3)
assert [r["name"] for r in rows] == ["deepseek-small"]
assert rows[0]["active_params"] < rows[0]["total_params"]
print(rows[0])
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `fp8_eval` (3 points)
#
# ```python
# def fp8_eval(model: DeepSeekLM, val_data, n_batches: int, seed: int = 0) -> dict: ...
# ```
#
# Return `{"val_loss_fp32", "val_loss_fp8", "delta"}` (`delta = val_loss_fp8 − val_loss_fp32`, the cross-entropy of
# `model(x)["logits"]`, eval mode, no gradients) over `n_batches` batches
# `get_batch(val_data, 32, 64, torch.Generator().manual_seed(seed + i))`, the FP8 loss from a deep copy converted
# with unit 16's `convert_linears_to_fp8`; `model` itself is left unchanged. **Your decision: which layers the copy
# converts.** The evidence to weigh: the loss budget (on the course's trained DeepSeek your copy may lose at most
# 0.02 nats more than the course's conversion), a router's top-k is discrete (a small error in its logits sends
# tokens to other experts), the head is tied to the embedding, and a converted layer that never runs in this loss
# saves nothing. The grader records which of the model's linear maps your copy converted.
# (A model that has just trained keeps its last routing in each MoE layer; clear `last_indices` and
# `last_router_logits` of the copy's source before `copy.deepcopy` if it complains about non-leaf tensors.)

# %% tags=["solution:17.fp8_inference"]
def fp8_eval(model, val_data, n_batches, seed=0):
    """Validation loss of the model and of an FP8 copy."""
    ### BEGIN SOLUTION
    for m in model.modules():
        if isinstance(m, DeepSeekMoE):
            m.last_indices = m.last_router_logits = None
    fp8 = copy.deepcopy(model)
    convert_linears_to_fp8(fp8.layers, skip=("lm_head", "gate"))

    def loss(m):
        was = m.training
        m.eval()
        total = 0.0
        with torch.no_grad():
            for i in range(n_batches):
                x, y = get_batch(val_data, 32, 64, torch.Generator().manual_seed(seed + i))
                lg = m(x)["logits"]
                total += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).item()
        m.train(was)
        return total / n_batches

    a, b = loss(model), loss(fp8)
    return {"val_loss_fp32": a, "val_loss_fp8": b, "delta": b - a}
    ### END SOLUTION


# %% tags=["tests:17.fp8_inference"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("17.fp8_inference")  # noqa: E702
### END HIDDEN TESTS
res = fp8_eval(small, torch.randint(0, 65, (3000,)), 1)
assert set(res) == {"val_loss_fp32", "val_loss_fp8", "delta"}
assert not any(type(m).__name__ == "FP8Linear" for m in small.modules()), "convert a copy"
print(res)
print("visible tests passed")
