"""Bug catalog of unit 03 (self-attention): one known-wrong implementation per syllabus entry.

Each mutant is the reference with exactly one mistake. ``detect="mutant"`` entries are recognised
by matching the learner's output on the failing input; ``detect="detector"`` entries by a property
that the check names explicitly (rows summing to 1/√d_k, columns summing to 1, NaN rows, ...).
The grader's self-tests run every mutant through its check and require the verdict to name it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core import bug, bug_group

U = "03"

# ---------------------------------------------------------------- softmax_stable


def _naive_softmax(x, dim=-1):
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


bug_group("B03.naive_softmax", f"{U}.softmax_stable",
          "Run it on [1000., 1001.]: which step overflows, and which shift of the inputs leaves a softmax unchanged?",
          {"softmax_stable": _naive_softmax}, detect="detector")

FLOAT64_HINT = ("Compare the dtype of what your code returns with the dtype of its input: float32 in must give float32 out (the dtype the rest of the model computes in).")


def _float64_softmax(x, dim=-1):
    x = x.double()
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


bug_group("B03.float64_output", f"{U}.softmax_stable", FLOAT64_HINT, {"softmax_stable": _float64_softmax},
          detect="detector")

# ---------------------------------------------------------------- simple_attention


def _simple_softmax_dim(x):
    scores = x @ x.transpose(-2, -1)
    w = torch.softmax(scores, dim=-2)
    return w @ x, w


def _simple_transpose_T(x):
    scores = x @ x.T
    w = torch.softmax(scores, dim=-1)
    return w @ x, w


bug_group("B03.softmax_dim", f"{U}.simple_attention", "Normalise over the keys: `dim=-1`.",
          {"simple_attention": _simple_softmax_dim}, detect="detector")
bug_group("B03.transpose_T", f"{U}.simple_attention", "Use `x.transpose(-2, -1)` for batched tensors.",
          {"simple_attention": _simple_transpose_T})


def _simple_scaled(x):
    scores = x @ x.transpose(-2, -1) / x.shape[-1] ** 0.5
    w = torch.softmax(scores, dim=-1)
    return w @ x, w


bug_group("B03.simple_scaled", f"{U}.simple_attention",
          "This first attention has no trainable weights and no scaling: compare your weights with the softmax of "
          "the raw dot products of the lesson's example.", {"simple_attention": _simple_scaled})



def _simple_float64(x):
    x = x.double()
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return w @ x, w


bug_group("B03.float64_output", f"{U}.simple_attention", FLOAT64_HINT, {"simple_attention": _simple_float64},
          detect="detector")

# ---------------------------------------------------------------- scaled_dot_product_attention


def _sdpa(q, k, v, mask=None, dropout=None, variant=""):
    d_k = k.shape[-1]
    if variant == "float64_output":
        q, k, v = q.double(), k.double(), v.double()
    kt = k.T if variant == "transpose_T" else k.transpose(-2, -1)
    scores = q @ kt
    if variant == "scale_dk":
        scores = scores / d_k
    elif variant not in {"no_scale", "scale_after_softmax"}:
        scores = scores / math.sqrt(d_k)
    if variant == "dropout_on_scores" and dropout is not None:
        scores = dropout(scores)
    if mask is not None and variant not in {"mask_after_softmax"}:
        if variant == "mask_zero_fill":
            scores = scores.masked_fill(~mask, 0.0)
        elif variant == "mask_inverted":
            scores = scores.masked_fill(mask, float("-inf"))
        elif variant == "mask_fill_finite":
            scores = scores.masked_fill(~mask, -1e9)
        else:
            scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2 if variant == "softmax_dim" else -1)
    if variant == "scale_after_softmax":
        weights = weights / math.sqrt(d_k)
    if variant == "mask_after_softmax" and mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    skip = variant in {"dropout_on_scores", "dropout_missing", "dropout_on_output"}
    used = dropout(weights) if (dropout is not None and not skip) else weights
    values = q if variant == "weights_times_q" else v
    if variant == "dropout_on_output" and dropout is not None:
        return dropout(used @ values), weights
    return used @ values, weights


def _register_sdpa(bug_id, variant, hint, detect="mutant"):
    def f(q, k, v, mask=None, dropout=None):
        return _sdpa(q, k, v, mask, dropout, variant)

    f.__name__ = f"sdpa_{variant}"
    bug_group(bug_id, f"{U}.scaled_dot_product_attention", hint, {"scaled_dot_product_attention": f}, detect)


_register_sdpa("B03.no_scale", "no_scale", "Divide the scores by √d_k before the softmax.")
_register_sdpa("B03.scale_dk", "scale_dk", "Divide by the **square root** of d_k.")
_register_sdpa("B03.scale_after_softmax", "scale_after_softmax", "Scaling happens before the softmax.", "detector")
_register_sdpa("B03.softmax_dim", "softmax_dim", "Normalise over the keys: `dim=-1`.", "detector")
_register_sdpa("B03.mask_zero_fill", "mask_zero_fill",
               "exp(0)=1 still gives future keys weight; fill with −∞.")
_register_sdpa("B03.mask_after_softmax", "mask_after_softmax",
               "Mask before the softmax, or renormalise each row after zeroing.", "detector")
_register_sdpa("B03.mask_inverted", "mask_inverted", "Course masks are True where attention is allowed.", "detector")
_register_sdpa("B03.dropout_on_scores", "dropout_on_scores", "Dropout acts on the attention weights, after the softmax.")
_register_sdpa("B03.dropout_missing", "dropout_missing",
               "Apply the `dropout` module to the attention weights when one is given (train mode).", "detector")
_register_sdpa("B03.dropout_not_on_weights", "dropout_on_output",
               "Dropout acts on the attention weights (one draw per query–key pair), not on the output or the "
               "values.", "detector")
_register_sdpa("B03.transpose_T", "transpose_T", "Use `k.transpose(-2, -1)` for batched tensors.")
_register_sdpa("B03.float64_output", "float64_output", FLOAT64_HINT, "detector")
_register_sdpa("B03.mask_fill_finite", "mask_fill_finite",
               "Make every score a query may see lower than your fill value (scale q and k up): where does its weight "
               "go? The lesson's float16 experiment is the other half of the evidence.", "detector")

# ---------------------------------------------------------------- SelfAttention


class _SelfAttentionBase(nn.Module):
    variant = ""

    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        scores = q @ k.transpose(-2, -1)
        if self.variant == "scale_global":
            scores = scores / D_OUT_GLOBAL ** 0.5  # noqa: F821 (a notebook global that the grader never defines)
        elif self.variant == "scale_d_in":
            scores = scores / x.shape[-1] ** 0.5
        elif self.variant != "no_scale":
            scores = scores / k.shape[-1] ** 0.5
        w = torch.softmax(scores, dim=-1)
        out = w @ (x if self.variant == "weights_times_x" else v)
        return out.double() if self.variant == "float64_output" else out


@bug("B03.scale_global", f"{U}.SelfAttention", "Use the key width of this call (`k.shape[-1]`).",
     detect="name_error", name="SelfAttention")
class SelfAttentionScaleGlobal(_SelfAttentionBase):
    variant = "scale_global"


@bug("B03.no_scale", f"{U}.SelfAttention", "Divide the scores by √d_k before the softmax.", name="SelfAttention")
class SelfAttentionNoScale(_SelfAttentionBase):
    variant = "no_scale"


@bug("B03.scale_d_in", f"{U}.SelfAttention",
     "With d_in ≠ d_out, which width sets the spread of q·k? Compare the spread of your scores with that of the "
     "keys' dot products.", name="SelfAttention")
class SelfAttentionScaleDIn(_SelfAttentionBase):
    variant = "scale_d_in"


@bug("B03.weights_times_x", f"{U}.SelfAttention", "Weights combine the **value** vectors.", name="SelfAttention")
class SelfAttentionTimesX(_SelfAttentionBase):
    variant = "weights_times_x"


@bug("B03.float64_output", f"{U}.SelfAttention", FLOAT64_HINT, detect="detector", name="SelfAttention")
class SelfAttentionFloat64(_SelfAttentionBase):
    variant = "float64_output"


# ---------------------------------------------------------------- CausalSelfAttention


class _CausalBase(nn.Module):
    variant = ""

    def __init__(self, d_in, d_out, context_length, dropout=0.0, qkv_bias=False):
        super().__init__()
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        ones = torch.ones(context_length, context_length, dtype=torch.bool)
        if self.variant == "mask_no_diagonal":
            mask = ones.tril(-1)
        elif self.variant == "mask_buffer_blocked":
            mask = ones.triu(1)  # True = blocked: the buffer's meaning flipped, forward flips it back
        else:
            mask = ones.tril()
        self.register_buffer("mask", mask, persistent=False)
        self.last_weights = None

    def forward(self, x):
        b, t, _ = x.shape
        if t > self.context_length:
            raise ValueError("sequence longer than context_length")
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        kt = k.T if self.variant == "transpose_T" else k.transpose(-2, -1)
        scores = q @ kt
        if self.variant != "no_scale":
            scores = scores / k.shape[-1] ** 0.5
        mask = self.mask if self.variant == "mask_not_sliced" else self.mask[:t, :t]
        if self.variant == "mask_buffer_blocked":
            mask = ~mask
        if self.variant == "dropout_on_scores":
            scores = self.dropout(scores)
        if self.variant == "mask_zero_fill":
            scores = scores.masked_fill(~mask, 0.0)
        elif self.variant == "mask_inverted":
            scores = scores.masked_fill(mask, float("-inf"))
        elif self.variant != "mask_after_softmax":
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=1 if self.variant == "softmax_dim" else -1)
        if self.variant == "mask_after_softmax":
            w = w.masked_fill(~mask, 0.0)
        if self.variant == "dropout_in_eval":
            used = nn.functional.dropout(w, self.dropout.p, training=True)
        elif self.variant in {"dropout_on_scores", "dropout_missing", "dropout_on_output"}:
            used = w
        else:
            used = self.dropout(w)
        self.last_weights = (used if self.variant == "last_weights_after_dropout" else w).detach()
        out = used @ (x if self.variant == "weights_times_x" else v)
        if self.variant == "float64_output":
            return out.double()
        return self.dropout(out) if self.variant == "dropout_on_output" else out


def _register_causal(bug_id, variant, hint, detect="mutant"):
    cls = type(f"Causal_{variant}", (_CausalBase,), {"variant": variant})
    bug(bug_id, f"{U}.CausalSelfAttention", hint, detect=detect, name="CausalSelfAttention")(cls)


_register_causal("B03.mask_zero_fill", "mask_zero_fill", "exp(0)=1 still gives future keys weight; fill with −∞.")
_register_causal("B03.mask_after_softmax", "mask_after_softmax",
                 "Mask before the softmax, or renormalise each row after zeroing.", "detector")
_register_causal("B03.mask_inverted", "mask_inverted", "Course masks are True where attention is allowed.", "detector")
_register_causal("B03.mask_no_diagonal", "mask_no_diagonal", "A token must be able to attend to itself.", "detector")
_register_causal("B03.mask_not_sliced", "mask_not_sliced",
                 "Call the module on a batch shorter than context_length and compare the shapes of the scores and of "
                 "the mask.")
_register_causal("B03.softmax_dim", "softmax_dim", "Normalise over the keys: `dim=-1`.", "detector")
_register_causal("B03.dropout_on_scores", "dropout_on_scores", "Dropout acts on the attention weights, after the softmax.")
_register_causal("B03.dropout_in_eval", "dropout_in_eval",
                 "`nn.Dropout` is off after `model.eval()`; never call it with `training=True`.", "detector")
_register_causal("B03.dropout_missing", "dropout_missing",
                 "Apply `self.dropout` to the attention weights after the softmax (it is active in train mode).",
                 "detector")
_register_causal("B03.dropout_not_on_weights", "dropout_on_output",
                 "Dropout acts on the attention weights (one draw per query–key pair), not on the output or the "
                 "values.", "detector")
_register_causal("B03.weights_times_x", "weights_times_x", "Weights combine the **value** vectors.")
_register_causal("B03.transpose_T", "transpose_T", "Use `k.transpose(-2, -1)` for batched tensors.")
_register_causal("B03.no_scale", "no_scale", "Divide the scores by √d_k before the softmax.")
_register_causal("B03.last_weights_after_dropout", "last_weights_after_dropout",
                 "Call the module in train() mode with dropout > 0 and add up each row of last_weights.", "detector")
_register_causal("B03.float64_output", "float64_output", FLOAT64_HINT, "detector")
_register_causal("B03.mask_buffer_blocked", "mask_buffer_blocked",
                 "Print the mask buffer of a small module: which entries are True, and what does the course's "
                 "convention say True means?", "detector")
