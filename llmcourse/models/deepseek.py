"""The capstone (unit 17): a tiny DeepSeek-V3-style language model assembled from units 11–16.

Which unit supplies which part:

* unit 11 — :class:`~llmcourse.models.llama3.RMSNorm`, the SwiGLU feed-forward of the dense layers and the RoPE
  tables (half-split ``cos``/``sin``; the interleaved rotation reads the same tables);
* unit 13 — :class:`~llmcourse.models.deepseek_mla.DeepSeekMLA` (multi-head latent attention with decoupled
  RoPE) and :class:`~llmcourse.models.deepseek_mla.LatentCache`;
* unit 14 — :class:`~llmcourse.models.deepseek_moe.DeepSeekMoE` (shared + routed experts, sigmoid group-limited
  routing, the ``e_score_correction_bias`` buffer and its sign update);
* unit 15 — :class:`~llmcourse.models.mtp.MTPModule` (sequential multi-token prediction);
* unit 16 — :func:`~llmcourse.quant.fp8.convert_linears_to_fp8` (FP8 inference, :func:`fp8_eval`);
* units 10 and 12 — the seeded batches (:func:`~llmcourse.data.corpus.get_batch`), the training step and the
  cache-size formulas (:func:`~llmcourse.nn.kv_cache.attn_cache_elems_per_token`).

Contents: :class:`DeepSeekConfig`, :class:`DeepSeekBlock`, :class:`DeepSeekLM`, :func:`generate_latent_cached`,
:func:`greedy_uncached`, :func:`train_step`, :func:`compare_models`, :func:`fp8_eval`, parameter and cache
accounting (:func:`param_counts`, :func:`cache_elems_per_token`, :func:`deepseek_param_breakdown`) and the
``transformers`` interop (:func:`hf_deepseek_config`, :func:`random_hf_deepseek`, :func:`deepseek_state_dict_from_hf`,
:func:`load_hf_deepseek`; ``transformers`` is imported lazily, only by those).

Sources: DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), §2.1 (MLA, DeepSeekMoE, auxiliary-loss-free
balancing) and §2.2 (MTP); ``transformers`` 5.23 ``DeepseekV3ForCausalLM`` (main path matched with converted
weights in ``tests/test_unit17_deepseek_model.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.corpus import get_batch
from ..nn.kv_cache import attn_cache_elems_per_token
from ..quant.fp8 import convert_linears_to_fp8
from .deepseek_mla import DeepSeekMLA, LatentCache
from .deepseek_moe import DeepSeekMoE, DeepSeekTopkRouter, expert_counts
from .llama3 import RMSNorm, SwiGLUFeedForward, rope_cos_sin, rope_inv_freq
from .mtp import MTPModule, mtp_inputs_and_targets

__all__ = ["DeepSeekAttention", "DeepSeekBlock", "DeepSeekConfig", "DeepSeekLM", "cache_elems_per_token",
           "compare_models", "deepseek_param_breakdown", "deepseek_state_dict_from_hf", "forward_time_breakdown", "fp8_eval",
           "generate_latent_cached", "greedy_uncached", "hf_deepseek_config", "load_hf_deepseek", "model_logits",
           "mtp_step_cost", "param_counts", "random_hf_deepseek", "train_step", "train_step_flops"]


@dataclass
class DeepSeekConfig:
    """Hyper-parameters of :class:`DeepSeekLM` (defaults: the course's DeepSeek-tiny).

    Field names follow ``transformers``' ``DeepseekV3Config`` where one exists (``d_model`` = ``hidden_size``,
    ``n_layers`` = ``num_hidden_layers``, ``n_heads`` = ``num_attention_heads``, ``context_length`` =
    ``max_position_embeddings``). Attention: ``q_lora_rank`` (``None`` = uncompressed query), ``kv_lora_rank`` d_c,
    ``qk_nope_head_dim``, ``qk_rope_head_dim`` d_R, ``v_head_dim``, ``rope_theta``, ``rope_interleave``. Dense FFN
    width ``intermediate_size`` for layers ``i < first_k_dense_replace``; MoE layers: ``moe_intermediate_size``,
    ``n_routed_experts`` E, ``n_shared_experts``, ``num_experts_per_tok`` k, ``n_group``, ``topk_group``,
    ``routed_scaling_factor``, ``norm_topk_prob``, ``bias_update_speed`` γ. MTP: ``mtp_depth`` D (0 = none) and
    ``mtp_lambda`` λ. ``to_dict()`` / ``DeepSeekConfig(**d)`` round-trip through plain Python types.
    """

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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class DeepSeekAttention(DeepSeekMLA):
    """:class:`~llmcourse.models.deepseek_mla.DeepSeekMLA` (same parameters and keys) called with precomputed RoPE
    tables instead of positions, so that a DeepSeek block has the call signature ``block(x, cos, sin, mask)`` of
    unit 11's block, which :class:`~llmcourse.models.mtp.MTPModule` expects.

    ``forward(x, cos, sin, mask, cache=None, layer_idx=0, absorb=False)``: ``x (B, T, D)``; ``cos, sin`` float32
    ``(T, d_R)``, the half-split tables of the new tokens' absolute positions (``rope_cos_sin``); ``mask`` bool,
    True = may attend (every query row must keep at least one key). Returns ``(B, T, D)``, equal to
    ``DeepSeekMLA.forward(x, positions, mask, …)`` up to float32 round-off: the naive path scores the concatenated
    ``[nope, rope]`` query against the key ``[k_nope, k_pe]`` in one batched matmul that also adds the mask as
    ``0 / −inf`` and applies the scale (``torch.baddbmm``), then softmax and ``@ v``; ``absorb=True`` is unit 13's
    code. (At training sizes, T = 64 and head dims 48/32, this beats ``F.scaled_dot_product_attention``, whose CPU
    fused kernel needs equal query and value head dims, so it falls back to its math path with extra
    masked-row checks.)
    (A thin wrapper: unit 13's module takes positions and builds its tables itself; it is not edited here.)
    """

    _tables: tuple[Tensor, Tensor] | None = None

    def rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        if self._tables is not None:
            return self._tables
        return super().rope_tables(positions)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: LatentCache | None = None,
                layer_idx: int = 0, absorb: bool = False) -> Tensor:
        t = x.shape[1]
        if cos.shape[-2] != t or sin.shape[-2] != t:
            raise ValueError(f"RoPE tables {tuple(cos.shape)} do not match the {t} tokens of x")
        self._tables = (cos, sin)
        try:
            positions = torch.arange(t, device=x.device)
            if absorb:
                return super().forward(x, positions, mask, cache, layer_idx, absorb)
            # The naive path of DeepSeekMLA.forward with the scores in one batched matmul: the per-head query
            # [q_nope, q_pe] against the key [k_nope, k_pe] (k_pe shared by every head) gives the same scores
            # q_nope·k_nopeᵀ + q_pe·k_peᵀ; baddbmm adds the additive mask and applies (d_nope + d_R)^−½ in the same op.
            b = x.shape[0]
            q_nope, q_pe, c_kv, k_pe = self.project(x, positions)
            if cache is not None:
                c_kv, k_pe = cache.update(layer_idx, c_kv, k_pe)
            s, h, dv = c_kv.shape[1], self.n_heads, self.v_head_dim
            kv = self.kv_b_proj(c_kv).view(b, s, h, self.qk_nope_head_dim + dv).transpose(1, 2)
            k_nope, v = kv.split([self.qk_nope_head_dim, dv], dim=-1)
            q = torch.cat([q_nope, q_pe], dim=-1).reshape(b * h, t, self.qk_head_dim)
            k = torch.cat([k_nope, k_pe[:, None].expand(b, h, s, self.qk_rope_head_dim)], dim=-1)
            k = k.reshape(b * h, s, self.qk_head_dim).transpose(1, 2)
            if mask is None:
                scores = torch.bmm(q, k) * self.scaling
            else:
                if mask.dtype == torch.bool:
                    mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
                bias = mask.to(q.dtype).expand(b, h, t, s).reshape(b * h, t, s) if mask.dim() > 2 else mask.to(q.dtype)
                scores = torch.baddbmm(bias, q, k, alpha=self.scaling)
            out = torch.bmm(torch.softmax(scores, dim=-1), v.reshape(b * h, s, dv))
            return self.o_proj(out.view(b, h, t, dv).transpose(1, 2).reshape(b, t, h * dv))
        finally:
            self._tables = None


class DeepSeekBlock(nn.Module):
    """One DeepSeek-V3 decoder layer (pre-norm)::

        x = x + self_attn(input_layernorm(x), cos, sin, mask, cache, layer_idx)
        x = x + mlp(post_attention_layernorm(x))

    ``mlp`` is unit 11's SwiGLU of width ``intermediate_size`` when ``moe=False`` (DeepSeek's first
    ``first_k_dense_replace`` layers, and the block of an MTP module) and unit 14's :class:`DeepSeekMoE` otherwise.
    Keys: ``input_layernorm.weight``, ``self_attn.*`` (unit 13's ``DeepSeekMLA`` names), ``post_attention_layernorm.weight``,
    ``mlp.{gate,up,down}_proj.weight`` (dense) or ``mlp.gate.weight``, ``mlp.gate.e_score_correction_bias`` (buffer),
    ``mlp.experts.{e}.*``, ``mlp.shared_experts.*`` (MoE): ``transformers``' ``DeepseekV3DecoderLayer`` names.

    ``forward(x, cos, sin, mask, cache=None, layer_idx=0)``: ``x (B, T, D)`` -> ``(B, T, D)``.
    """

    def __init__(self, cfg: DeepSeekConfig, moe: bool):
        super().__init__()
        self.is_moe = bool(moe)
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.self_attn = DeepSeekAttention(cfg.d_model, cfg.n_heads, cfg.q_lora_rank, cfg.kv_lora_rank,
                                           cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                                           cfg.rope_theta, cfg.rope_interleave, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        if moe:
            self.mlp = DeepSeekMoE(cfg.d_model, cfg.moe_intermediate_size, cfg.n_routed_experts, cfg.n_shared_experts,
                                   cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor,
                                   cfg.norm_topk_prob, cfg.bias_update_speed)
        else:
            self.mlp = SwiGLUFeedForward(cfg.d_model, cfg.intermediate_size)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: LatentCache | None = None,
                layer_idx: int = 0) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer_idx)
        return x + self.mlp(self.post_attention_layernorm(x))


@torch.no_grad()
def _init_linear_weights(module: nn.Module, std: float) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        elif isinstance(m, DeepSeekTopkRouter):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            m.e_score_correction_bias.zero_()
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)


class DeepSeekLM(nn.Module):
    """A DeepSeek-V3-style language model: embedding, MLA blocks (dense first, then MoE), final norm, tied head,
    and ``mtp_depth`` sequential MTP modules used only by the training loss.

    ``state_dict`` keys (``transformers``' ``DeepseekV3ForCausalLM`` without its ``model.`` prefix, plus ``mtp``)::

        embed_tokens.weight (V, D)
        layers.{i}.input_layernorm.weight (D)     layers.{i}.post_attention_layernorm.weight (D)
        layers.{i}.self_attn.{q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}.weight
        layers.{i}.mlp.{gate,up,down}_proj.weight                    (i < first_k_dense_replace)
        layers.{i}.mlp.gate.weight (E, D), layers.{i}.mlp.gate.e_score_correction_bias (E,) float32 buffer,
        layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight, layers.{i}.mlp.shared_experts.*   (otherwise)
        norm.weight (D)
        lm_head.weight (V, D)            (the same Parameter as embed_tokens.weight when tie_word_embeddings)
        mtp.{k}.{enorm, hnorm, eh_proj, post_norm}.weight, mtp.{k}.mtp_block.* (a dense DeepSeekBlock)

    Non-persistent buffers: ``rope_cos``, ``rope_sin`` ``(C, d_R)`` float32 and ``causal`` ``(C, C)`` bool. The
    router biases are buffers: they never reach an optimizer; :meth:`update_router_biases` changes them.
    Initialisation: every linear/embedding/router weight ``N(0, 0.02²)``, norms 1, biases 0; the trunk is built and
    initialised before the MTP modules, so a seed gives the same trunk for every ``mtp_depth``.

    ``forward(idx, targets=None, cache=None)``: ``idx (B, T)`` long. Returns a dict with ``logits (B, T, V)``; with
    ``targets (B, T)`` also ``loss_main`` (cross-entropy of the main head), ``loss_mtp`` (list of ``D`` scalars,
    depth ``k`` predicting ``targets[:, k:]`` from the embedded ``idx[:, k:]``) and
    ``loss = loss_main + λ/D·Σ_k loss_mtp[k]`` (``= loss_main`` when D = 0). With a :class:`LatentCache`, ``idx``
    holds the new tokens at positions ``cache.seq_len …`` and the MTP modules are not run. With targets the dict
    also has ``mtp_logits``: depth ``k``'s ``(B, T−k, V)`` logits (position ``i`` predicts token ``i+k+1``).

    Raises:
        ValueError: ``idx`` not 2-D long; past + T > ``context_length``; ``targets`` with a cache or of another
            shape; ``T ≤ mtp_depth`` with targets.
    """

    def __init__(self, cfg: DeepSeekConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(DeepSeekBlock(cfg, moe=i >= cfg.first_k_dense_replace)
                                    for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        _init_linear_weights(self, 0.02)
        self.mtp = nn.ModuleList(MTPModule(cfg.d_model, DeepSeekBlock(cfg, moe=False), cfg.rms_norm_eps)
                                 for _ in range(cfg.mtp_depth))
        _init_linear_weights(self.mtp, 0.02)
        inv = rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta)
        cos, sin = rope_cos_sin(inv, torch.arange(cfg.context_length))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        causal = torch.ones(cfg.context_length, cfg.context_length, dtype=torch.bool).tril()
        self.register_buffer("causal", causal, persistent=False)

    def moe_layers(self) -> list[DeepSeekMoE]:
        """The :class:`DeepSeekMoE` modules of the main path, in layer order."""
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, DeepSeekMoE)]

    def trunk(self, idx: Tensor, cache: LatentCache | None = None) -> Tensor:
        """``h0 (B, T, D)``: the last layer's output before ``norm`` (the MTP chain's depth-0 state)."""
        if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"idx must be a (B, T) integer tensor, got {getattr(idx, 'shape', type(idx))}")
        t = idx.shape[1]
        past = 0 if cache is None else cache.seq_len
        if t < 1 or past + t > self.cfg.context_length:
            raise ValueError(f"{past} cached + {t} new tokens do not fit context_length={self.cfg.context_length}")
        x = self.embed_tokens(idx)
        cos, sin = self.rope_cos[past:past + t], self.rope_sin[past:past + t]
        mask = self.causal[past:past + t, :past + t]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i)
        return x

    def forward(self, idx: Tensor, targets: Tensor | None = None, cache: LatentCache | None = None) -> dict:
        if targets is not None and cache is not None:
            raise ValueError("targets and cache are exclusive: the cache is for generation, the loss for training")
        h0 = self.trunk(idx, cache)
        logits = self.lm_head(self.norm(h0))
        out = {"logits": logits}
        if targets is None:
            return out
        if targets.shape != idx.shape:
            raise ValueError(f"targets {tuple(targets.shape)} must have the shape of idx {tuple(idx.shape)}")
        t, depth = idx.shape[1], len(self.mtp)
        if depth and t <= depth:
            raise ValueError(f"T={t} leaves no position for MTP depth {depth}: use T > mtp_depth")
        loss_main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        h_prev, loss_mtp, mtp_logits = h0, [], []
        for k in range(1, depth + 1):
            emb_tokens, tgt = mtp_inputs_and_targets(idx, targets, k)
            tk = t - k
            h_k = self.mtp[k - 1](h_prev[:, :tk], self.embed_tokens(emb_tokens), self.rope_cos[k:k + tk],
                                  self.rope_sin[k:k + tk], self.causal[:tk, :tk])
            lg = self.lm_head(h_k)
            mtp_logits.append(lg)
            loss_mtp.append(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1)))
            h_prev = h_k
        loss = loss_main
        if depth:
            loss = loss_main + self.cfg.mtp_lambda / depth * torch.stack(loss_mtp).sum()
        out.update(loss_main=loss_main, loss_mtp=loss_mtp, mtp_logits=mtp_logits, loss=loss)
        return out

    def expert_loads(self) -> list[Tensor]:
        """Per MoE layer, the ``(E,)`` long counts of ``(token, slot)`` assignments of the last training-mode
        forward (empty counts of zeros for a layer that has not routed yet)."""
        out = []
        for moe in self.moe_layers():
            if moe.last_indices is None:
                out.append(torch.zeros(moe.n_routed_experts, dtype=torch.long))
            else:
                out.append(expert_counts(moe.last_indices, moe.n_routed_experts).long())
        return out

    @torch.no_grad()
    def update_router_biases(self) -> None:
        """``b ← b + γ·sign(c̄ − c)`` on every MoE layer's ``e_score_correction_bias`` from the routing recorded in
        the last training-mode forward (DeepSeek-V3 report §2.1.2); a layer without a recorded routing is left
        alone. The record is consumed, so a second call before the next forward changes nothing."""
        for moe in self.moe_layers():
            moe.update_bias()
            moe.last_indices = moe.last_router_logits = None    # the logits would keep the step's graph alive


def model_logits(model: nn.Module, x: Tensor) -> Tensor:
    """Logits ``(B, T, V)`` of any course language model: ``model(x)`` or ``model(x)["logits"]``."""
    out = model(x)
    return out["logits"] if isinstance(out, dict) else out


@torch.no_grad()
def greedy_uncached(model: nn.Module, idx: Tensor, max_new_tokens: int) -> Tensor:
    """Greedy decoding that re-runs the whole sequence every step (the reference for the cached path); eval mode,
    previous mode restored. A model with a ``cfg.context_length`` sees at most its last ``context_length`` tokens (a
    sliding window; within the context nothing is cropped). Returns ``(B, T0 + max_new_tokens)`` long."""
    was = model.training
    model.eval()
    window = getattr(getattr(model, "cfg", None), "context_length", None)
    try:
        for _ in range(max_new_tokens):
            ctx = idx if window is None else idx[:, -window:]
            nxt = model_logits(model, ctx)[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
    finally:
        model.train(was)


@torch.no_grad()
def generate_latent_cached(model: DeepSeekLM, idx: Tensor, max_new_tokens: int) -> tuple[Tensor, LatentCache]:
    """Greedy decoding with a :class:`LatentCache`: one prefill call on ``idx (B, T0)``, then one call with
    ``T = 1`` per new token (the last token is returned, not fed). The MTP modules are not used.

    Returns ``(tokens (B, T0 + n), cache)``; the cache holds ``T0 + n − 1`` positions of ``c_kv (B, ·, d_c)`` and
    ``k_pe (B, ·, d_R)`` per layer, so ``cache.nbytes() = L·(d_c + d_R)·seq_len·B·4`` in float32. Tokens equal
    :func:`greedy_uncached`. Eval mode during the call, previous mode restored.

    Raises:
        ValueError: ``max_new_tokens < 0``; ``T0 + max_new_tokens − 1 > context_length``.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    if idx.shape[1] + max(max_new_tokens - 1, 0) > model.cfg.context_length:
        raise ValueError(f"prompt {idx.shape[1]} + {max_new_tokens} new tokens exceed the context "
                         f"{model.cfg.context_length}")
    cache = LatentCache(len(model.layers))
    if max_new_tokens == 0:
        return idx, cache
    was = model.training
    model.eval()
    try:
        out = [idx]
        logits = model(idx, cache=cache)["logits"]
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            if step < max_new_tokens - 1:
                logits = model(nxt, cache=cache)["logits"]
        return torch.cat(out, dim=1), cache
    finally:
        model.train(was)


def train_step(model: DeepSeekLM, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor, max_norm: float = 1.0
               ) -> dict:
    """One training step: ``zero_grad → forward(x, y) → loss.backward() → clip_grad_norm_(max_norm) →
    optimizer.step() → model.update_router_biases()`` (train mode).

    Returns ``{"loss", "loss_main", "loss_mtp" (list), "grad_norm"}`` as floats (``grad_norm`` before clipping) and
    ``"expert_load"``: per MoE layer the ``(E,)`` long counts of this step's routing, the loads the bias update
    used (each layer's bias moves by exactly ``γ·sign(mean(c) − c)``).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(x, y)
    out["loss"].backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    loads = model.expert_loads()
    model.update_router_biases()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "grad_norm": float(norm), "expert_load": loads}


# ------------------------------------------------------------------------------------------------
# accounting
# ------------------------------------------------------------------------------------------------


def _unique_params(module: nn.Module, exclude_prefix: str | None = None) -> int:
    seen, n = set(), 0
    for name, p in module.named_parameters():
        if exclude_prefix is not None and name.startswith(exclude_prefix):
            continue
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def param_counts(model: nn.Module) -> dict[str, int]:
    """``{"total", "active"}`` parameters of a model's **main path** (MTP modules excluded, a tied weight counted
    once, buffers never). For a :class:`DeepSeekLM` ``active`` drops the ``E − k`` routed experts a token does not
    use in every MoE layer (shared experts, the router and everything dense stay); for dense models it equals the
    total. DeepSeek-tiny: 1,757,696 / 872,960."""
    if isinstance(model, DeepSeekLM):
        total = _unique_params(model, exclude_prefix="mtp.")
        idle = 0
        for moe in model.moe_layers():
            per_expert = sum(p.numel() for p in moe.experts[0].parameters())
            idle += (moe.n_routed_experts - moe.top_k) * per_expert
        return {"total": total, "active": total - idle}
    total = _unique_params(model, exclude_prefix="mtp.")
    return {"total": total, "active": total}


def cache_elems_per_token(model: nn.Module) -> int:
    """Cached elements per generated token (one sequence, all layers): MLA ``L·(d_c + d_R)`` for a
    :class:`DeepSeekLM`, GQA ``L·KV·2·hd`` for a Llama model, MHA ``L·H·2·hd`` for a GPT-2 model (unit 12's formulas).
    DeepSeek-tiny 320, llama3-tiny 512, gpt2-char-tiny 1,024.

    Raises:
        TypeError: a model of another kind.
    """
    cfg = getattr(model, "cfg", None)
    if isinstance(model, DeepSeekLM):
        return attn_cache_elems_per_token("mla", cfg.n_layers, kv_lora_rank=cfg.kv_lora_rank,
                                          qk_rope_head_dim=cfg.qk_rope_head_dim)
    if cfg is not None and hasattr(cfg, "n_kv_heads"):
        hd = cfg.head_dim if getattr(cfg, "head_dim", None) is not None else cfg.d_model // cfg.n_heads
        return attn_cache_elems_per_token("gqa", cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                                          head_dim=hd)
    if cfg is not None and hasattr(cfg, "n_heads") and hasattr(cfg, "n_layers"):
        return attn_cache_elems_per_token("mha", cfg.n_layers, n_heads=cfg.n_heads, head_dim=cfg.d_model // cfg.n_heads)
    raise TypeError(f"no cache formula for {type(model).__name__}")


def deepseek_param_breakdown(model: DeepSeekLM) -> dict[str, int]:
    """Parameters per part, counted from the built modules: ``embedding``, ``dense_layer`` (each),
    ``moe_layer`` (each), ``mla``, ``expert``, ``router``, ``final_norm``, ``mtp_module`` (each; 0 without MTP)."""
    def n(m):
        return sum(p.numel() for p in m.parameters())

    dense = [layer for layer in model.layers if not layer.is_moe]
    moe = [layer for layer in model.layers if layer.is_moe]
    return {"embedding": model.embed_tokens.weight.numel(),
            "dense_layer": n(dense[0]) if dense else 0, "moe_layer": n(moe[0]) if moe else 0,
            "mla": n(model.layers[0].self_attn), "expert": n(moe[0].mlp.experts[0]) if moe else 0,
            "router": n(moe[0].mlp.gate) if moe else 0, "final_norm": n(model.norm),
            "mtp_module": n(model.mtp[0]) if len(model.mtp) else 0}


# ------------------------------------------------------------------------------------------------
# comparison and FP8
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def _val_loss(model: nn.Module, data: Tensor, batch_size: int, context_length: int, n_batches: int, seed: int) -> float:
    was = model.training
    model.eval()
    try:
        total = 0.0
        for i in range(n_batches):
            x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + i))
            lg = model_logits(model, x)
            total += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).item()
        return total / n_batches
    finally:
        model.train(was)


def compare_models(models: dict[str, nn.Module], train_data: Tensor, val_data: Tensor, steps: int, batch_size: int,
                   context_length: int, lr_fn: Callable[[int], float], seed: int = 0, *, eval_batches: int = 10,
                   eval_seed: int = 10_000, weight_decay: float = 0.1, max_norm: float = 1.0,
                   on_step: Callable[[str, int, dict], None] | None = None, progress: bool = False) -> list[dict]:
    """Train every model on **identical** batches at an equal token budget and return one row per model (input order).

    Step ``s`` of every model uses ``get_batch(train_data, batch_size, context_length, Generator(seed + s))`` and
    learning rate ``lr_fn(s)``; AdamW (unit 10's two groups, ``weight_decay``). A :class:`DeepSeekLM` trains with
    :func:`train_step` (MTP loss, router-bias update), any other model with ``cross_entropy(model(x), y)``, the
    same clipping and optimizer. ``ms_per_step`` is the mean wall time of a step (batch drawing excluded).
    Validation: ``eval_batches`` fixed batches of ``val_data`` (generator ``eval_seed + i``), main head only.
    ``on_step(name, step, record)`` is called after each step with ``{"loss", "ms"}`` (and ``expert_load`` for
    DeepSeek).

    Row: ``{"name", "total_params", "active_params", "ms_per_step", "val_loss", "cache_elems_per_token"}`` (counts
    from :func:`param_counts` and :func:`cache_elems_per_token`).
    """
    from ..train.optim import configure_optimizer

    rows = []
    for name, model in models.items():
        opt = configure_optimizer(model, lr_fn(0), weight_decay=weight_decay)
        model.train()
        elapsed = 0.0
        it = range(steps)
        if progress:
            from tqdm.auto import tqdm
            it = tqdm(it, desc=name, leave=False)
        for s in it:
            x, y = get_batch(train_data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
            for g in opt.param_groups:
                g["lr"] = lr_fn(s)
            t0 = time.perf_counter()
            if isinstance(model, DeepSeekLM):
                rec = train_step(model, opt, x, y, max_norm)
            else:
                opt.zero_grad(set_to_none=True)
                lg = model_logits(model, x)
                loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                opt.step()
                rec = {"loss": loss.item()}
            dt = time.perf_counter() - t0
            elapsed += dt
            if on_step is not None:
                on_step(name, s, dict(rec, ms=1000 * dt))
        counts = param_counts(model)
        rows.append({"name": name, "total_params": counts["total"], "active_params": counts["active"],
                     "ms_per_step": 1000 * elapsed / max(steps, 1),
                     "val_loss": _val_loss(model, val_data, batch_size, context_length, eval_batches, eval_seed),
                     "cache_elems_per_token": cache_elems_per_token(model)})
    return rows


_DISPATCH_OPS = ("sort", "argsort", "index_select", "index_add", "index", "gather", "scatter", "bincount", "cumsum",
                 "repeat_interleave", "histc", "nonzero", "unique")


def sdpa_flops(q_shape, k_shape, v_shape) -> int:
    """Forward FLOPs of ``scaled_dot_product_attention`` for ``q (…, H, Tq, d_k)``, ``k (…, H, Tk, d_k)``,
    ``v (…, H, Tk, d_v)``: the two products ``q kᵀ`` and ``p v``, ``2·B·H·Tq·Tk·(d_k + d_v)`` (a multiply-add counts 2;
    a causal mask is not subtracted, as for explicit matmuls). The backward pass is counted as twice this (the four
    products ``dV``, ``dP``, ``dQ``, ``dK``), as for an explicit attention."""
    *batch, tq, dk = q_shape
    tk, dv = k_shape[-2], v_shape[-1]
    n = 1
    for b in batch:
        n *= int(b)
    return 2 * n * int(tq) * int(tk) * (int(dk) + int(dv))


def _sdpa_flop_mapping() -> dict:
    """``FlopCounterMode`` formulas for CPU's fused attention, which PyTorch's counter does not know (it counts 0 for
    ``aten._scaled_dot_product_flash_attention_for_cpu``): forward :func:`sdpa_flops`, backward twice that."""
    aten = torch.ops.aten

    def forward(query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_flops(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return 2 * sdpa_flops(query, key, value)

    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def train_step_flops(model: nn.Module, x: Tensor, y: Tensor) -> int:
    """Floating-point operations of one training step's forward and backward pass, counted by
    ``torch.utils.flop_counter.FlopCounterMode`` (matrix products and attention; a multiply-add counts 2; the
    optimizer's elementwise update and the norms are not counted). PyTorch's counter has no formula for CPU's fused
    ``scaled_dot_product_attention`` (it would count 0 there, while MLA's explicit products are counted): the
    count adds it in closed form (:func:`sdpa_flops`, backward twice the forward, as for explicit products).

    A :class:`DeepSeekLM` is run on ``(x, y)`` (main + MTP loss); any other model on ``cross_entropy(model(x), y)``.
    ``FlopCounterMode`` has no formula for ``F.grouped_mm``, so during the count every MoE layer takes its
    per-expert path (``DeepSeekMoE.use_grouped_mm = False``, restored afterwards): the same products on the same
    rows. Parameters' ``.grad`` are left as they were (saved and restored); the mode is restored. Returns an int.
    """
    from torch.utils.flop_counter import FlopCounterMode

    grads = {p: p.grad for p in model.parameters()}
    was, grouped = model.training, DeepSeekMoE.use_grouped_mm
    model.train()
    DeepSeekMoE.use_grouped_mm = False
    try:
        with FlopCounterMode(display=False, custom_mapping=_sdpa_flop_mapping()) as counter:
            if isinstance(model, DeepSeekLM):
                loss = model(x, y)["loss"]
            else:
                lg = model_logits(model, x)
                loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))
            loss.backward()
        return int(counter.get_total_flops())
    finally:
        DeepSeekMoE.use_grouped_mm = grouped
        model.train(was)
        for p, g in grads.items():
            p.grad = g


def mtp_step_cost(cfg: DeepSeekConfig, train_data: Tensor, batch_size: int, context_length: int, repeats: int = 5,
                  seed: int = 0) -> list[dict]:
    """What the MTP module costs a training step: two :class:`DeepSeekLM` built from ``cfg`` with ``mtp_depth`` as
    given and with 0, from the same seed (so the same trunk), on the same batches.

    FLOPs: :func:`train_step_flops` on the batch of step ``seed``. Time: one warm-up :func:`train_step` each, then
    ``repeats`` rounds that run one step of each model (batch ``get_batch(…, Generator(seed + r))``, AdamW lr 1e-3),
    alternating which goes first; ``ms_per_step`` is the **median** over the rounds (interleaving spreads load
    changes of the machine over both). Returns ``[{"name", "mtp_depth", "flops_per_step", "ms_per_step"}]``, the
    model with MTP first.
    """
    from ..train.optim import configure_optimizer

    if cfg.mtp_depth < 1:
        raise ValueError("mtp_step_cost compares a model with MTP against one without: give cfg.mtp_depth >= 1")
    runs = []
    for depth in (cfg.mtp_depth, 0):
        torch.manual_seed(seed)
        m = DeepSeekLM(dataclasses.replace(cfg, mtp_depth=depth))
        runs.append({"name": f"deepseek-tiny, {'MTP depth ' + str(depth) if depth else 'no MTP'}", "mtp_depth": depth,
                     "model": m, "opt": configure_optimizer(m, 1e-3), "ms": []})
    x, y = get_batch(train_data, batch_size, context_length, torch.Generator().manual_seed(seed))
    for r in runs:
        r["flops_per_step"] = train_step_flops(r["model"], x, y)
        train_step(r["model"], r["opt"], x, y)                                  # warm-up
    for i in range(repeats):
        x, y = get_batch(train_data, batch_size, context_length, torch.Generator().manual_seed(seed + 1 + i))
        for r in (runs if i % 2 == 0 else runs[::-1]):
            t0 = time.perf_counter()
            train_step(r["model"], r["opt"], x, y)
            r["ms"].append(1000 * (time.perf_counter() - t0))
    return [{"name": r["name"], "mtp_depth": r["mtp_depth"], "flops_per_step": r["flops_per_step"],
             "ms_per_step": float(torch.tensor(r["ms"]).median())} for r in runs]


def forward_time_breakdown(model: DeepSeekLM, x: Tensor, y: Tensor | None = None, repeats: int = 3) -> dict[str, float]:
    """Where the CPU time of a :class:`DeepSeekLM` forward pass goes, in ms per forward (mean of ``repeats`` runs
    after one warm-up), measured with ``torch.profiler`` (self CPU time of every operator, attributed by the
    module that ran it).

    Forward hooks open a profiler range around each attention module, dense feed-forward, MoE layer, router
    (``mlp.gate``) and MTP module; every operator's self time goes to the innermost range, and inside an MoE layer
    (outside its router) to its kind: ``"MoE expert GEMMs"`` (``grouped_mm`` and the matrix products it runs; the
    per-expert loop's matmuls when grouped GEMMs are off: the routed experts), ``"MoE dispatch (sort, gather,
    scatter)"``,
    ``"MoE expert weights gathered (cat/stack)"`` or ``"MoE elementwise and other"``. The MTP module counts as one
    item (``"MTP module"``, present when ``y`` is given). Keys also include ``"attention"``, ``"dense FFN"``,
    ``"MoE router"``, ``"MoE shared expert"``, ``"embedding, norms, head, loss"`` and ``"total"`` (the sum). Runs under ``no_grad`` in the
    model's current mode; the model is unchanged (the routers' last-call records aside).
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    labels: dict[nn.Module, str] = {}
    for layer in model.layers:
        labels[layer.self_attn] = "attention"
        if isinstance(layer.mlp, DeepSeekMoE):
            labels[layer.mlp] = "moe"
            labels[layer.mlp.gate] = "router"
            if getattr(layer.mlp, "shared_experts", None) is not None:
                labels[layer.mlp.shared_experts] = "shared"
        else:
            labels[layer.mlp] = "dense"
    for mod in model.mtp:
        labels[mod] = "mtp"
    stack: list = []

    def pre(mod, args):
        rf = record_function(f"ds::{labels[mod]}")
        rf.__enter__()
        stack.append(rf)

    def post(mod, args, out):
        stack.pop().__exit__(None, None, None)

    handles = [m.register_forward_pre_hook(pre) for m in labels] + [m.register_forward_hook(post) for m in labels]
    try:
        with torch.no_grad():
            model(x, y) if y is not None else model(x)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(repeats):
                    model(x, y) if y is not None else model(x)
    finally:
        for h in handles:
            h.remove()

    out = {k: 0.0 for k in ("attention", "dense FFN", "MoE router", "MoE shared expert", "MoE expert GEMMs",
                            "MoE dispatch (sort, gather, scatter)", "MoE expert weights gathered (cat/stack)",
                            "MoE elementwise and other", "MTP module", "embedding, norms, head, loss")}
    names = {"attention": "attention", "dense": "dense FFN", "router": "MoE router", "shared": "MoE shared expert",
             "mtp": "MTP module"}
    for ev in prof.events():
        if ev.name.startswith("ds::") or ev.name.startswith("ProfilerStep"):
            continue
        chain, p = [], ev.cpu_parent
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        ranges = [c[4:] for c in chain if c.startswith("ds::")]
        if "mtp" in ranges:
            key = "MTP module"
        elif not ranges:
            key = "embedding, norms, head, loss"
        elif ranges[0] != "moe":
            key = names[ranges[0]]
        else:
            op = ev.name.removeprefix("aten::").strip("_")
            if "grouped_mm" in ev.name or any("grouped_mm" in c for c in chain) or op in ("mm", "addmm", "matmul",
                                                                                           "linear", "bmm"):
                key = "MoE expert GEMMs"
            elif op in _DISPATCH_OPS:
                key = "MoE dispatch (sort, gather, scatter)"
            elif op in ("cat", "stack"):
                key = "MoE expert weights gathered (cat/stack)"
            else:
                key = "MoE elementwise and other"
        out[key] += ev.self_cpu_time_total / 1000.0 / repeats
    out["total"] = sum(out.values())
    return out


def _deepcopy_model(model: DeepSeekLM) -> DeepSeekLM:
    """``copy.deepcopy`` that leaves out each MoE layer's routing record (its logits may be a non-leaf tensor of a
    training forward, which cannot be deep-copied); the original keeps its record."""
    saved = [(m, m.last_indices, m.last_router_logits) for m in model.modules() if isinstance(m, DeepSeekMoE)]
    try:
        for m, _, _ in saved:
            m.last_indices = m.last_router_logits = None
        return copy.deepcopy(model)
    finally:
        for m, idx, logits in saved:
            m.last_indices, m.last_router_logits = idx, logits


def fp8_eval(model: DeepSeekLM, val_data: Tensor, n_batches: int, seed: int = 0, *, batch_size: int = 32,
             context_length: int = 64) -> dict:
    """Validation loss of ``model`` and of an FP8 copy: ``{"val_loss_fp32", "val_loss_fp8", "delta"}``
    (``delta = fp8 − fp32``, nats/token; main head only).

    The copy is ``copy.deepcopy(model)`` whose main-path linear maps are replaced by unit 16's block-scaled
    ``FP8Linear`` (:func:`convert_linears_to_fp8` on ``copy.layers``, skipping the routers named ``gate``); the
    embedding, the tied head, the norms, the routers and the MTP modules stay float32; ``model`` is unchanged.
    Both losses use the same ``n_batches`` batches (generator ``seed + i``).
    """
    fp8 = _deepcopy_model(model)
    convert_linears_to_fp8(fp8.layers, skip=("lm_head", "gate"))
    a = _val_loss(model, val_data, batch_size, context_length, n_batches, seed)
    b = _val_loss(fp8, val_data, batch_size, context_length, n_batches, seed)
    return {"val_loss_fp32": a, "val_loss_fp8": b, "delta": b - a}


# ------------------------------------------------------------------------------------------------
# transformers interop (imported lazily)
# ------------------------------------------------------------------------------------------------


def hf_deepseek_config(cfg: DeepSeekConfig | None = None, attn_implementation: str = "eager"):
    """The ``transformers.DeepseekV3Config`` of a :class:`DeepSeekConfig` (default: DeepSeek-tiny, the parity
    configuration); its MTP layers are not part of ``transformers``' main path."""
    from transformers import DeepseekV3Config

    c = cfg or DeepSeekConfig()
    return DeepseekV3Config(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.intermediate_size,
                            moe_intermediate_size=c.moe_intermediate_size, num_hidden_layers=c.n_layers,
                            num_attention_heads=c.n_heads, num_key_value_heads=c.n_heads,
                            n_shared_experts=c.n_shared_experts, n_routed_experts=c.n_routed_experts,
                            routed_scaling_factor=c.routed_scaling_factor, kv_lora_rank=c.kv_lora_rank,
                            q_lora_rank=c.q_lora_rank, qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
                            qk_nope_head_dim=c.qk_nope_head_dim, n_group=c.n_group, topk_group=c.topk_group,
                            num_experts_per_tok=c.num_experts_per_tok, first_k_dense_replace=c.first_k_dense_replace,
                            norm_topk_prob=c.norm_topk_prob, tie_word_embeddings=c.tie_word_embeddings,
                            max_position_embeddings=c.context_length, rms_norm_eps=c.rms_norm_eps,
                            rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
                            rope_interleave=c.rope_interleave, attn_implementation=attn_implementation)


def random_hf_deepseek(cfg: DeepSeekConfig | None = None, seed: int = 0, std: float = 0.05, bias_std: float = 0.05,
                       attn_implementation: str = "eager"):
    """``transformers``' ``DeepseekV3ForCausalLM`` for :func:`hf_deepseek_config` with every parameter
    ``~ N(0, std²)`` except the norms (``1 + N(0, std²)``), and every router's ``e_score_correction_bias``
    ``~ N(0, bias_std²)``, drawn from ``torch.Generator().manual_seed(seed)`` in sorted-name order; eval mode."""
    from transformers import DeepseekV3ForCausalLM

    hf = DeepseekV3ForCausalLM(hf_deepseek_config(cfg, attn_implementation))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(hf.named_parameters()):
            r = torch.randn(p.shape, generator=g) * std
            p.copy_(1.0 + r if "norm" in name else r)
        for name, b in sorted(hf.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * bias_std)
    return hf.eval()


def deepseek_state_dict_from_hf(hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Convert a ``DeepseekV3ForCausalLM`` state dict to :class:`DeepSeekLM` keys: strip ``model.``; split each
    fused ``mlp.experts.gate_up_proj (E, 2I, D)`` into ``experts.{e}.gate_proj`` (rows ``[:I]``) and ``up_proj``
    (rows ``[I:]``) and ``mlp.experts.down_proj (E, D, I)`` into ``experts.{e}.down_proj``; copy
    ``e_score_correction_bias`` (float32); drop the RoPE ``inv_freq`` buffers. Everything else passes through."""
    out: dict[str, Tensor] = {}
    for key, v in hf_state.items():
        k = key[len("model."):] if key.startswith("model.") else key
        if k.endswith("rotary_emb.inv_freq") or k.endswith("original_inv_freq"):
            continue
        if k.endswith("mlp.experts.gate_up_proj"):
            prefix, i = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = v[e, :i].clone()
                out[f"{prefix}{e}.up_proj.weight"] = v[e, i:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            prefix = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = v[e].clone()
        elif k.endswith("e_score_correction_bias"):
            out[k] = v.detach().float().clone()
        else:
            out[k] = v.detach().clone()
    return out


def load_hf_deepseek(model: DeepSeekLM, hf_state: dict[str, Tensor]) -> DeepSeekLM:
    """Load a ``DeepseekV3ForCausalLM`` state dict (converted by :func:`deepseek_state_dict_from_hf`) into ``model``;
    the MTP modules keep their weights (``transformers`` has none). Returns ``model``.

    Raises:
        KeyError: a main-path key missing from ``hf_state`` or a key ``model`` does not have."""
    sd = deepseek_state_dict_from_hf(hf_state)
    if model.cfg.tie_word_embeddings:
        sd.setdefault("lm_head.weight", sd.get("embed_tokens.weight"))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith("mtp.")]
    if missing or unexpected:
        raise KeyError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model
