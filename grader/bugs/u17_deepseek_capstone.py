"""Bug catalog of unit 17 (the capstone): one known-wrong implementation per catalog entry.

Each mutant is the reference (:mod:`llmcourse.models.deepseek`) with exactly one mistake.
"""

from __future__ import annotations

import torch
from torch import nn

from llmcourse.models.deepseek import (
    DeepSeekBlock,
    DeepSeekLM,
    _init_linear_weights,
    compare_models,
    deepseek_state_dict_from_hf,
    generate_latent_cached,
    load_hf_deepseek,
    param_counts,
)
from llmcourse.models.deepseek_mla import LatentCache

from ..core import bug_group

U = "17"

# ---------------------------------------------------------------- 17.DeepSeekLM


def load_hf_swapped(model, hf_state):
    sd = {}
    for k, v in hf_state.items():
        if k.endswith("gate_up_proj"):
            i = v.shape[1] // 2
            v = torch.cat([v[:, i:], v[:, :i]], dim=1)
        sd[k] = v
    return load_hf_deepseek(model, sd)


bug_group("B17.expert_conversion", f"{U}.DeepSeekLM", "Rows [:I] of gate_up_proj are the gate, [I:] the up projection.",
          {"load_hf_deepseek": load_hf_swapped})


class DenseFirstMissing(DeepSeekLM):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.layers[0] = DeepSeekBlock(cfg, moe=True)
        _init_linear_weights(self.layers[0], 0.02)


def load_hf_any(model, hf_state):
    sd = deepseek_state_dict_from_hf(hf_state)
    model.load_state_dict(sd, strict=False)
    return model


bug_group("B17.dense_layer_moe", f"{U}.DeepSeekLM", "The first k layers use a dense SwiGLU FFN.",
          {"DeepSeekLM": DenseFirstMissing, "load_hf_deepseek": load_hf_any})


class BiasParameter(DeepSeekLM):
    def __init__(self, cfg):
        super().__init__(cfg)
        for moe in self.moe_layers():
            gate = moe.gate
            b = gate.e_score_correction_bias
            del gate._buffers["e_score_correction_bias"]
            gate.e_score_correction_bias = nn.Parameter(b.clone())


bug_group("B17.bias_in_optimizer", f"{U}.DeepSeekLM", "The bias is updated by the sign rule, not by gradients.",
          {"DeepSeekLM": BiasParameter})

# ---------------------------------------------------------------- 17.generate_latent_cached


@torch.no_grad()
def generate_with_mtp(model, idx, max_new_tokens):
    """Drafts every second token with the MTP module and never verifies it."""
    was = model.training
    model.eval()
    try:
        out = idx
        while out.shape[1] < idx.shape[1] + max_new_tokens:
            t = out.shape[1]
            h0 = model.trunk(out)
            nxt = model.lm_head(model.norm(h0))[:, -1:].argmax(-1)
            out = torch.cat([out, nxt], 1)
            if out.shape[1] < idx.shape[1] + max_new_tokens and len(model.mtp):
                h1 = model.mtp[0](h0, model.embed_tokens(out[:, 1:]), model.rope_cos[1:t + 1], model.rope_sin[1:t + 1],
                                  model.causal[:t, :t])
                out = torch.cat([out, model.lm_head(h1)[:, -1:].argmax(-1)], 1)
        cache = LatentCache(len(model.layers))
        model(out[:, :-1], cache=cache)
        return out, cache
    finally:
        model.train(was)


bug_group("B17.mtp_in_generation", f"{U}.generate_latent_cached",
          "Plain generation uses the main path; MTP is for training or speculative decoding.",
          {"generate_latent_cached": generate_with_mtp})


@torch.no_grad()
def generate_full_kv(model, idx, max_new_tokens):
    """Correct tokens, but the cache it returns holds the decompressed per-head keys and values."""
    toks, cache = generate_latent_cached(model, idx, max_new_tokens)
    for i, layer in enumerate(model.layers):
        att = layer.self_attn
        kv = att.kv_b_proj(cache.c_kv[i])                                  # (B, T, H·(d_nope + d_v))
        cache.c_kv[i] = kv
        cache.k_pe[i] = cache.k_pe[i].repeat(1, 1, att.n_heads)            # one rope key per head
    return toks, cache


bug_group("B17.cache_full_kv", f"{U}.generate_latent_cached", "Cache the latent and the shared rope key only.",
          {"generate_latent_cached": generate_full_kv})


@torch.no_grad()
def generate_in_given_mode(model, idx, max_new_tokens):
    """Correct tokens, but a model handed over in training mode decodes in training mode (its MoE layers record the
    generated tokens' routing)."""
    was = model.training
    try:
        out, cache = [idx], LatentCache(len(model.layers))
        if max_new_tokens > 0:
            logits = model(idx, cache=cache)["logits"]
            for step in range(max_new_tokens):
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                out.append(nxt)
                if step < max_new_tokens - 1:
                    logits = model(nxt, cache=cache)["logits"]
        return torch.cat(out, 1), cache
    finally:
        model.train(was)


bug_group("B17.decode_in_train_mode", f"{U}.generate_latent_cached",
          "Generation must leave the routers as it found them: in which mode does an MoE layer record its routing?",
          {"generate_latent_cached": generate_in_given_mode})

# ---------------------------------------------------------------- 17.train_step


def train_step_no_bias(model, optimizer, x, y, max_norm=1.0):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(x, y)
    out["loss"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    loads = model.expert_loads()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "expert_load": loads}


def train_step_bias_first(model, optimizer, x, y, max_norm=1.0):
    model.update_router_biases()            # before this step's routing exists
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(x, y)
    out["loss"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    loads = model.expert_loads()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "expert_load": loads}


def train_step_clip_after(model, optimizer, x, y, max_norm=1.0):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(x, y)
    out["loss"].backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)     # too late: the step has used the gradients
    loads = model.expert_loads()
    model.update_router_biases()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "expert_load": loads}


def train_step_mode_kept(model, optimizer, x, y, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)   # no model.train(): a model handed over in eval mode trains in eval mode
    out = model(x, y)
    out["loss"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    loads = model.expert_loads()
    model.update_router_biases()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "expert_load": loads}


def train_step_grads_kept(model, optimizer, x, y, max_norm=1.0):
    model.train()                           # no zero_grad: the step adds its gradients to those already there
    out = model(x, y)
    out["loss"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    loads = model.expert_loads()
    model.update_router_biases()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "expert_load": loads}


bug_group("B17.step_in_eval_mode", f"{U}.train_step",
          "The model may arrive in any mode: which mode makes the MoE layers record the routing the bias update uses?",
          {"train_step": train_step_mode_kept})
bug_group("B17.grads_accumulated", f"{U}.train_step",
          "backward() adds to .grad: what is in .grad before this step's backward?",
          {"train_step": train_step_grads_kept})
bug_group("B17.clip_after_step", f"{U}.train_step",
          "Clipping changes the gradients; which call reads them?", {"train_step": train_step_clip_after},
          detect="detector")
bug_group("B17.bias_update_missing", f"{U}.train_step",
          "Update the biases after each optimizer step, from that step's expert loads.",
          {"train_step": train_step_no_bias})
bug_group("B17.bias_update_missing", f"{U}.train_step",
          "Update the biases after each optimizer step, from that step's expert loads.",
          {"train_step": train_step_bias_first})

# ---------------------------------------------------------------- 17.compare_models


def compare_unequal(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed=0, **kw):
    rows = []
    for i, (name, model) in enumerate(models.items()):      # every model gets its own batches
        rows += compare_models({name: model}, train_data, val_data, steps, batch_size, context_length, lr_fn,
                               seed + 1000 * i, **kw)
    return rows


bug_group("B17.unequal_budget", f"{U}.compare_models", "Compare at equal tokens, with identical batches.",
          {"compare_models": compare_unequal})


def compare_active_total(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed=0, **kw):
    rows = compare_models(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed, **kw)
    for r, m in zip(rows, models.values()):
        r["active_params"] = param_counts(m)["total"]
    return rows


bug_group("B17.active_counts_total", f"{U}.compare_models", "Active means used by one token's forward pass: which of an MoE layer's experts does one token run?",
          {"compare_models": compare_active_total})


def compare_constant_lr(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed=0, **kw):
    """The first learning rate for every step: the schedule is never followed."""
    first = lr_fn(0)
    return compare_models(models, train_data, val_data, steps, batch_size, context_length, lambda s: first, seed, **kw)


def compare_val_with_mtp(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed=0, **kw):
    """Validation with the training objective (main + λ/D·MTP) instead of the main head's loss."""
    from llmcourse.data.corpus import get_batch
    from llmcourse.models.deepseek import DeepSeekLM

    rows = compare_models(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed, **kw)
    for r, m in zip(rows, models.values()):
        if isinstance(m, DeepSeekLM):
            m.eval()
            with torch.no_grad():
                losses = [float(m(*get_batch(val_data, batch_size, context_length,
                                             torch.Generator().manual_seed(10_000 + i)))["loss"]) for i in range(10)]
            r["val_loss"] = sum(losses) / len(losses)
    return rows


bug_group("B17.constant_lr", f"{U}.compare_models", "Step s uses lr_fn(s): follow the schedule, not its first value.",
          {"compare_models": compare_constant_lr}, detect="detector")
bug_group("B17.val_with_mtp", f"{U}.compare_models",
          "Validate the main head only: the MTP term is a training objective, not the model's loss.",
          {"compare_models": compare_val_with_mtp}, detect="detector")

# ---------------------------------------------------------------- 17.fp8_inference


def fp8_eval_one_layer(model, val_data, n_batches, seed=0, **kw):
    """Only the first block is converted to FP8."""
    from llmcourse.models.deepseek import _deepcopy_model, _val_loss
    from llmcourse.quant.fp8 import convert_linears_to_fp8

    fp8 = _deepcopy_model(model)
    convert_linears_to_fp8(fp8.layers[0], skip=("lm_head", "gate"))
    a = _val_loss(model, val_data, 32, 64, n_batches, seed)
    b = _val_loss(fp8, val_data, 32, 64, n_batches, seed)
    return {"val_loss_fp32": a, "val_loss_fp8": b, "delta": b - a}


bug_group("B17.fp8_partial", f"{U}.fp8_inference", "Convert every main-path linear layer of every block.",
          {"fp8_eval": fp8_eval_one_layer})
