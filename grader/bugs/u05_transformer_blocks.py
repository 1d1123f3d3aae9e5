"""Bug catalog of unit 05 (transformer blocks): one known-wrong implementation per syllabus entry.

Each mutant is the reference with exactly one mistake (built from llmcourse's ``LayerNorm``,
``FeedForward`` and ``MultiHeadAttention`` so that only the named mistake differs). ``detect="mutant"``
entries are recognised by matching the learner's output on the failing input; ``detect="detector"``
entries by a property the check names explicitly (train/eval differ, output ignores memory, output
matches the *other* norm placement, rows of ``exp(output)`` sum to 1). An id may have several
mutants when the same mistake has several common spellings (statistics over the batch axis or over
the sequence axis).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..core import bug_group

U = "05"

# ---------------------------------------------------------------- LayerNorm


class _LayerNormBase(nn.Module):
    variant = ""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        dims = {"axis_seq": -2, "axis_batch": 0, "axis_plane": (-2, -1)}.get(self.variant, -1)
        mean = x.mean(dim=dims, keepdim=True)
        if self.variant == "unbiased":
            var = x.var(dim=dims, keepdim=True)
        else:
            var = (x - mean).pow(2).mean(dim=dims, keepdim=True)
        if self.variant == "eps_outside":
            x_hat = (x - mean) / (var.sqrt() + self.eps)
        else:
            x_hat = (x - mean) / torch.sqrt(var + self.eps)
        if self.variant == "affine_swapped":
            return x_hat * self.bias + self.weight
        return x_hat * self.weight + self.bias


class _LayerNormRunningStats(nn.Module):
    """BatchNorm's behaviour under LayerNorm's name: batch statistics in train, running ones in eval."""

    def __init__(self, d_model, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.register_buffer("running_mean", torch.zeros(d_model))
        self.register_buffer("running_var", torch.ones(d_model))

    def forward(self, x):
        if self.training:
            flat = x.reshape(-1, x.shape[-1])
            mean, var = flat.mean(0), flat.var(0, unbiased=False)
            with torch.no_grad():
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
                self.running_var.mul_(1 - self.momentum).add_(self.momentum * var)
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def _ln(variant):
    return type(f"LayerNorm_{variant}", (_LayerNormBase,), {"variant": variant})


bug_group("B05.ln_unbiased", f"{U}.LayerNorm", "LayerNorm uses the biased variance (`unbiased=False`).",
          {"LayerNorm": _ln("unbiased")})
bug_group("B05.ln_eps_outside", f"{U}.LayerNorm", "ε goes inside the square root.",
          {"LayerNorm": _ln("eps_outside")})
bug_group("B05.ln_wrong_axis", f"{U}.LayerNorm", "Normalise each token over its features (last dim).",
          {"LayerNorm": _ln("axis_seq")})
bug_group("B05.ln_wrong_axis", f"{U}.LayerNorm", "Normalise each token over its features (last dim).",
          {"LayerNorm": _ln("axis_batch")})
bug_group("B05.ln_wrong_axis", f"{U}.LayerNorm", "Normalise each token over its features (last dim).",
          {"LayerNorm": _ln("axis_plane")})
bug_group("B05.ln_affine_swapped", f"{U}.LayerNorm", "weight (γ) scales, bias (β) shifts.",
          {"LayerNorm": _ln("affine_swapped")})
bug_group("B05.ln_running_stats", f"{U}.LayerNorm",
          "LayerNorm has no running statistics; train and eval are identical.",
          {"LayerNorm": _LayerNormRunningStats}, detect="detector")

# ---------------------------------------------------------------- gelu


def _gelu_exact_always(x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


bug_group("B05.gelu_exact_for_tanh", f"{U}.gelu", "GPT-2's GELU is the tanh approximation.",
          {"gelu": _gelu_exact_always})


def _gelu_any_other_is_tanh(x, approximate="none"):
    if approximate == "none":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


bug_group("B05.gelu_no_valueerror", f"{U}.gelu",
          "A name that is neither form is a caller's mistake: say so with an error instead of picking a formula.",
          {"gelu": _gelu_any_other_is_tanh}, detect="detector")

# ---------------------------------------------------------------- FeedForward


class _FFNInnerDropout(nn.Module):
    """Dropout between the activation and fc2 (nn.TransformerEncoderLayer's _ff_block), which this FFN leaves out."""

    def __init__(self, d_model, d_ff, activation="relu"):
        super().__init__()
        from llmcourse.nn.feedforward import gelu

        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.act = {"relu": torch.relu, "gelu": gelu, "gelu_tanh": lambda z: gelu(z, approximate="tanh")}[activation]
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.fc2(self.dropout(self.act(self.fc1(x))))


bug_group("B05.ffn_inner_dropout", f"{U}.FeedForward",
          "This FeedForward is deterministic: the block that uses it drops the FFN's output (one dropout per "
          "sublayer).", {"FeedForward": _FFNInnerDropout}, detect="detector")

# ---------------------------------------------------------------- blocks


def _parts():
    from llmcourse.nn.feedforward import FeedForward
    from llmcourse.nn.multihead import MultiHeadAttention
    from llmcourse.nn.norms import LayerNorm

    return LayerNorm, FeedForward, MultiHeadAttention


class _EncoderBase(nn.Module):
    variant = ""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=True, activation="relu", qkv_bias=True):
        super().__init__()
        LayerNorm, FeedForward, MultiHeadAttention = _parts()
        self.norm_first = norm_first
        attn_p = 0.0 if self.variant == "attn_dropout_missing" else dropout
        qkv_bias = True if self.variant == "qkv_bias_ignored" else qkv_bias
        self.self_attn = MultiHeadAttention(d_model, d_model, num_heads, attn_p, qkv_bias)
        self.norm1, self.norm2 = LayerNorm(d_model), LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.dropout = nn.Dropout(dropout)

    def _sub(self, x, f, norm, pre):
        v = self.variant
        if v == "dropout_missing":
            return x + f(norm(x)) if pre else norm(x + f(x))
        if v == "dropout_on_sum":
            return self.dropout(x + f(norm(x))) if pre else norm(self.dropout(x + f(x)))
        if pre:
            if v == "residual_from_normed":
                x = norm(x)
                return x + self.dropout(f(x))
            if v == "no_residual":
                return self.dropout(f(norm(x)))
            return x + self.dropout(f(norm(x)))
        if v == "no_residual":
            return norm(self.dropout(f(x)))
        return norm(x + self.dropout(f(x)))

    def forward(self, x, mask=None):
        pre = (not self.norm_first) if self.variant == "post_for_pre" else self.norm_first
        x = self._sub(x, lambda h: self.self_attn(h, mask=mask), self.norm1, pre)
        return self._sub(x, self.ffn, self.norm2, pre)


class _DecoderBase(_EncoderBase):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=True, activation="relu", qkv_bias=True):
        super().__init__(d_model, num_heads, d_ff, dropout, norm_first, activation, qkv_bias)
        LayerNorm, _, MultiHeadAttention = _parts()
        attn_p = 0.0 if self.variant == "attn_dropout_missing" else dropout
        qkv_bias = True if self.variant == "qkv_bias_ignored" else qkv_bias
        self.cross_attn = MultiHeadAttention(d_model, d_model, num_heads, attn_p, qkv_bias)
        self.norm3 = LayerNorm(d_model)

    def _cross(self, h, memory, tgt_mask, memory_mask):
        from llmcourse.nn.masks import causal_mask

        v = self.variant
        if v == "cross_kv_from_decoder":
            return self.cross_attn(h, None, mask=None)
        if v == "cross_causal":
            causal = causal_mask(h.shape[1], memory.shape[1])
            return self.cross_attn(h, memory, mask=causal if memory_mask is None else causal & memory_mask)
        if v == "cross_tgt_mask":
            return self.cross_attn(h, memory, mask=tgt_mask)
        if v == "memory_normed_again":
            return self.cross_attn(h, self.norm2(memory), mask=memory_mask)
        return self.cross_attn(h, memory, mask=memory_mask)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        pre = (not self.norm_first) if self.variant == "post_for_pre" else self.norm_first
        x = self._sub(x, lambda h: self.self_attn(h, mask=tgt_mask), self.norm1, pre)
        x = self._sub(x, lambda h: self._cross(h, memory, tgt_mask, memory_mask), self.norm2, pre)
        return self._sub(x, self.ffn, self.norm3, pre)


def _enc(variant):
    return type(f"EncoderBlock_{variant}", (_EncoderBase,), {"variant": variant})


def _dec(variant):
    return type(f"DecoderBlock_{variant}", (_DecoderBase,), {"variant": variant})


_HINTS = {
    "dropout_missing": "Residual dropout: `x + dropout(sublayer(norm(x)))` on every sublayer (active in train mode).",
    "dropout_on_sum": "Dropout goes on each sublayer's output before the residual add, not on the sum.",
    "attn_dropout_missing": "Build the attention layers with the block's `dropout` too (it drops the attention "
                            "weights).",
    "post_for_pre": "Pre-LN: `x + f(norm(x))`; post-LN: `norm(x + f(x))`.",
    "residual_from_normed": "The residual adds the **un-normalised** input.",
    "no_residual": "Each sublayer output is added to its input.",
    "qkv_bias_ignored": "Pass `qkv_bias` on to the attention layers: it decides whether their query, key and value "
                        "projections have biases.",
}
for _name, _detect in (("post_for_pre", "detector"), ("residual_from_normed", "mutant"), ("no_residual", "mutant"),
                      ("dropout_missing", "detector"), ("dropout_on_sum", "detector"),
                      ("attn_dropout_missing", "detector"), ("qkv_bias_ignored", "detector")):
    bug_group(f"B05.{_name}", f"{U}.EncoderBlock", _HINTS[_name], {"EncoderBlock": _enc(_name)}, detect=_detect)
    bug_group(f"B05.{_name}", f"{U}.DecoderBlock", _HINTS[_name], {"DecoderBlock": _dec(_name)}, detect=_detect)

bug_group("B05.cross_kv_from_decoder", f"{U}.DecoderBlock",
          "Queries come from the decoder; keys and values come from the encoder memory.",
          {"DecoderBlock": _dec("cross_kv_from_decoder")}, detect="detector")
bug_group("B05.cross_causal", f"{U}.DecoderBlock", "Only self-attention in the decoder is causal.",
          {"DecoderBlock": _dec("cross_causal")})
bug_group("B05.cross_causal", f"{U}.DecoderBlock", "Only self-attention in the decoder is causal.",
          {"DecoderBlock": _dec("cross_tgt_mask")})
bug_group("B05.memory_normed_again", f"{U}.DecoderBlock", "The encoder's final norm already normalised memory.",
          {"DecoderBlock": _dec("memory_normed_again")})

# ---------------------------------------------------------------- ProjectionLayer


class _ProjectionBase(nn.Module):
    variant = ""

    def __init__(self, d_model, vocab_size):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, x):
        logits = self.proj(x)
        return F.softmax(logits, dim=-1) if self.variant == "softmax" else F.log_softmax(logits, dim=-1)


for _v in ("softmax", "log_softmax"):
    bug_group("B05.projection_softmax", f"{U}.ProjectionLayer",
              "Return logits; the loss applies log-softmax itself.",
              {"ProjectionLayer": type(f"Projection_{_v}", (_ProjectionBase,), {"variant": _v})}, detect="detector")
