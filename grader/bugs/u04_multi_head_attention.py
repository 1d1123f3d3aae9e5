"""Bug catalog of unit 04 (multi-head attention): one known-wrong implementation per syllabus entry.

Each mutant is the reference with exactly one mistake. ``detect="mutant"`` entries are recognised by
matching the learner's output (or the error it raises) on the failing input; ``detect="detector"``
entries by a property the check names explicitly (the future leaks, identical column blocks, no error
for an indivisible width). The grader's self-tests run every mutant through its check and require the
verdict to name it.

``B04.sdpa_delegates`` (not in the syllabus's table) is an answer that calls the module's own forward,
which runs ``F.scaled_dot_product_attention`` itself since the library took the fast path.

Note on ``B04.sdpa_mask_and_causal``: the syllabus expects an error when ``attn_mask`` and
``is_causal=True`` are passed together; torch 2.13 on CPU accepts both and ANDs ``attn_mask`` with a
**top-left** causal mask, so the mistake shows up as wrong rows for ``T_q < T_k`` with a user mask.
The mutant reproduces whatever the installed torch does, so either behaviour is diagnosed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..core import bug, bug_group

U = "04"


def _ref():
    from llmcourse.nn import multihead

    return multihead


# ---------------------------------------------------------------- MultiHeadAttentionWrapper


class WrapperSharedHead(nn.Module):
    """One CausalSelfAttention reused for every head."""

    def __init__(self, d_in, head_dim, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        from llmcourse.nn import CausalSelfAttention

        head = CausalSelfAttention(d_in, head_dim, context_length, dropout, qkv_bias)
        self.heads = nn.ModuleList([head] * num_heads)

    def forward(self, x):
        return torch.cat([h(x) for h in self.heads], dim=-1)


bug("B04.wrapper_shared_head", f"{U}.MultiHeadAttentionWrapper", "Each head needs its own projections.",
    detect="detector", name="MultiHeadAttentionWrapper")(WrapperSharedHead)



class WrapperNoDropout(nn.Module):
    """The heads are built without the wrapper's dropout."""

    def __init__(self, d_in, head_dim, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        from llmcourse.nn import CausalSelfAttention

        self.heads = nn.ModuleList([CausalSelfAttention(d_in, head_dim, context_length, 0.0, qkv_bias)
                                    for _ in range(num_heads)])

    def forward(self, x):
        return torch.cat([h(x) for h in self.heads], dim=-1)


bug("B04.wrapper_dropout_missing", f"{U}.MultiHeadAttentionWrapper", "Pass `dropout` on to every head.",
    detect="detector", name="MultiHeadAttentionWrapper")(WrapperNoDropout)


class WrapperNoBias(nn.Module):
    """The heads are built without the wrapper's qkv_bias (always without biases)."""

    def __init__(self, d_in, head_dim, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        from llmcourse.nn import CausalSelfAttention

        self.heads = nn.ModuleList([CausalSelfAttention(d_in, head_dim, context_length, dropout)
                                    for _ in range(num_heads)])

    def forward(self, x):
        return torch.cat([h(x) for h in self.heads], dim=-1)


bug("B04.wrapper_qkv_bias_ignored", f"{U}.MultiHeadAttentionWrapper",
    "Every argument of the constructor reaches the heads: `qkv_bias` decides whether their projections have biases.",
    detect="detector", name="MultiHeadAttentionWrapper")(WrapperNoBias)

# ---------------------------------------------------------------- MultiHeadAttention


class _MHABase(nn.Module):
    variant = ""

    def __init__(self, d_in, d_out, num_heads, dropout=0.0, qkv_bias=False, causal=False, context_length=None,
                 d_kv=None):
        super().__init__()
        d_kv = d_in if d_kv is None else d_kv
        if d_out % num_heads != 0 and self.variant != "head_dim_floor":
            raise ValueError(f"d_out={d_out} is not divisible by num_heads={num_heads}")
        self.d_in, self.d_out, self.d_kv, self.num_heads = d_in, d_out, d_kv, num_heads
        self.head_dim = d_out // num_heads
        self.causal, self.context_length = causal, context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_kv, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_kv, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        if causal:
            self.register_buffer("causal_mask", torch.ones(context_length, context_length, dtype=torch.bool).tril(),
                                 persistent=False)
        self.store_weights = False
        self.last_weights = None

    def forward(self, x_q, x_kv=None, mask=None):
        x_kv = x_q if x_kv is None else x_kv
        b, t_q, _ = x_q.shape
        t_k = x_kv.shape[1]
        h, hd = self.num_heads, self.head_dim

        def split(y, t):
            if self.variant == "split_wrong_view":
                return y.view(b, h, t, hd)
            return y.view(b, t, h, hd).transpose(1, 2)

        q, k, v = split(self.W_query(x_q), t_q), split(self.W_key(x_kv), t_k), split(self.W_value(x_kv), t_k)
        kt = k.transpose(1, 2) if self.variant == "transpose_1_2_on_4d" else k.transpose(-2, -1)
        scores = q @ kt
        scores = scores / math.sqrt(self.d_out if self.variant == "scale_d_out" else hd)
        full = mask
        if self.causal:
            if t_k > self.context_length:
                raise ValueError("sequence longer than context_length")
            cm = self.causal_mask[:t_q, :t_k] if self.variant == "causal_top_left" else \
                self.causal_mask[t_k - t_q:t_k, :t_k]
            full = cm if mask is None or self.variant == "causal_drops_mask" else cm & mask
        if full is not None:
            if self.variant == "mask_discarded":
                scores.masked_fill(~full, float("-inf"))  # result thrown away: no mask at all
            else:
                scores = scores.masked_fill(~full, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if self.variant == "last_weights_after_dropout":
            weights = self.dropout(weights)
        if self.store_weights:
            self.last_weights = weights.detach()
        if self.variant == "last_weights_after_dropout":
            return self.out_proj((weights @ v).transpose(1, 2).contiguous().view(b, t_q, self.d_out))
        used = weights if self.variant in {"dropout_missing", "dropout_on_output"} else self.dropout(weights)
        context = used @ v
        if self.variant == "merge_no_transpose":
            merged = context.reshape(b, t_q, self.d_out)
        else:
            merged = context.transpose(1, 2).contiguous().view(b, t_q, self.d_out)
        if self.variant == "dropout_on_output":
            return self.dropout(self.out_proj(merged))
        return merged if self.variant == "no_out_proj" else self.out_proj(merged)


def _register_mha(bug_id, variant, hint, detect="mutant"):
    cls = type(f"MHA_{variant}", (_MHABase,), {"variant": variant})
    bug(bug_id, f"{U}.MultiHeadAttention", hint, detect=detect, name="MultiHeadAttention")(cls)


_register_mha("B04.head_dim_floor", "head_dim_floor", "Raise when d_out is not divisible by num_heads.", "detector")
_register_mha("B04.merge_no_transpose", "merge_no_transpose",
              "Transpose back to (B, T, H, head_dim) before merging heads.")
_register_mha("B04.split_wrong_view", "split_wrong_view",
              "Split the last dim: view(B, T, H, head_dim), then transpose(1, 2).")
_register_mha("B04.scale_d_out", "scale_d_out",
              "Each head's dot product has head_dim terms: scale by √head_dim.")
_register_mha("B04.no_out_proj", "no_out_proj", "Apply out_proj after merging the heads.")
_register_mha("B04.transpose_1_2_on_4d", "transpose_1_2_on_4d",
              "Transpose the last two axes: transpose(-2, -1).")
_register_mha("B04.dropout_missing", "dropout_missing",
              "Apply `self.dropout` to the attention weights after the softmax (it is active in train mode).",
              "detector")
_register_mha("B04.dropout_not_on_weights", "dropout_on_output",
              "Dropout acts on the attention weights (one draw per query–key pair), not on the output or the "
              "values.", "detector")
_register_mha("B04.mask_discarded", "mask_discarded",
              "masked_fill is not in-place: assign the result or use masked_fill_.", "detector")
_register_mha("B04.causal_top_left", "causal_top_left",
              "With fewer queries than keys, the queries are the newest positions: query i sits at position "
              "T_k − T_q + i.")
_register_mha("B04.causal_drops_mask", "causal_drops_mask",
              "A causal module still obeys the mask it is given: a key must be allowed by both.")
_register_mha("B04.last_weights_after_dropout", "last_weights_after_dropout",
              "last_weights is what the heads' softmax produced, a distribution per query, whatever the mode.",
              "detector")

# ---------------------------------------------------------------- mha_from_wrapper


def _from_wrapper_variant(wrapper, variant):
    heads = wrapper.heads
    first = heads[0]
    d_in, head_dim = first.W_query.in_features, first.W_query.out_features
    qkv_bias = first.W_query.bias is not None
    d_out = head_dim * len(heads)
    mha = _ref().MultiHeadAttention(d_in, d_out, len(heads), dropout=first.dropout.p, qkv_bias=qkv_bias,
                                    causal=variant != "not_causal", context_length=first.context_length)

    def stack(ts):
        if variant == "interleaved":  # row r of head h lands at row r·H + h
            return torch.stack(ts, dim=1).reshape(-1, *ts[0].shape[1:])
        return torch.cat(ts, dim=0)

    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(mha, name).weight.copy_(stack([getattr(h, name).weight for h in heads]))
            if qkv_bias:
                getattr(mha, name).bias.copy_(stack([getattr(h, name).bias for h in heads]))
        mha.out_proj.weight.copy_(torch.eye(d_out))
        mha.out_proj.bias.zero_()
    return mha


bug_group("B04.from_wrapper_interleaved", f"{U}.mha_from_wrapper",
          "Head h of the fused module reads one contiguous block of head_dim projected features; which rows of "
          "the big weight produce them?", {"mha_from_wrapper": lambda w: _from_wrapper_variant(w, "interleaved")})
bug_group("B04.from_wrapper_not_causal", f"{U}.mha_from_wrapper",
          "Every head of the wrapper is causal: the fused module must be too (with the heads' context_length).",
          {"mha_from_wrapper": lambda w: _from_wrapper_variant(w, "not_causal")}, detect="detector")

# ---------------------------------------------------------------- to_torch_mha


def _mask_unchanged(mask):
    return mask


def _to_torch_mha_kqv(mha):
    tm = _ref().to_torch_mha(mha)
    with torch.no_grad():
        tm.in_proj_weight.copy_(torch.cat([mha.W_key.weight, mha.W_query.weight, mha.W_value.weight], 0))
        if mha.W_query.bias is not None:
            tm.in_proj_bias.copy_(torch.cat([mha.W_key.bias, mha.W_query.bias, mha.W_value.bias], 0))
    return tm


bug_group("B04.torch_mask_polarity", f"{U}.to_torch_mha",
          "There, True means **blocked**: invert the mask.", {"to_torch_attn_mask": _mask_unchanged})
bug_group("B04.in_proj_order", f"{U}.to_torch_mha",
          "Read nn.MultiheadAttention's forward: which third of in_proj_weight projects the query, the key, "
          "the value?", {"to_torch_mha": _to_torch_mha_kqv})


def _to_torch_mha_no_dropout(mha):
    tm = _ref().to_torch_mha(mha)
    tm.dropout = 0.0
    return tm


bug_group("B04.torch_mha_dropout_missing", f"{U}.to_torch_mha",
          "The copy must behave like the course module in train mode too: give nn.MultiheadAttention the "
          "module's dropout probability.", {"to_torch_mha": _to_torch_mha_no_dropout}, detect="detector")

# ---------------------------------------------------------------- mha_forward_sdpa


def _sdpa_variant(mha, x_q, x_kv, mask, variant):
    x_kv = x_q if x_kv is None else x_kv
    b, t_q, _ = x_q.shape
    t_k = x_kv.shape[1]
    h, hd = mha.num_heads, mha.head_dim

    def split(y, t):
        return y.view(b, t, h, hd).transpose(1, 2)

    q, k, v = split(mha.W_query(x_q), t_q), split(mha.W_key(x_kv), t_k), split(mha.W_value(x_kv), t_k)
    if variant == "top_left" and mha.causal and mask is None:
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif variant == "mask_and_causal":
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(mha.causal))
    else:
        full = mask
        if mha.causal:
            cm = mha.causal_mask[t_k - t_q:t_k, :t_k]
            full = cm if mask is None else cm & mask
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    return mha.out_proj(ctx.transpose(1, 2).contiguous().view(b, t_q, h * hd))


def _sdpa_top_left(mha, x_q, x_kv=None, mask=None):
    return _sdpa_variant(mha, x_q, x_kv, mask, "top_left")


def _sdpa_mask_and_causal(mha, x_q, x_kv=None, mask=None):
    return _sdpa_variant(mha, x_q, x_kv, mask, "mask_and_causal")


def _sdpa_dropout_in_eval(mha, x_q, x_kv=None, mask=None):
    x_kv = x_q if x_kv is None else x_kv
    b, t_q, _ = x_q.shape
    t_k = x_kv.shape[1]
    h, hd = mha.num_heads, mha.head_dim

    def split(y, t):
        return y.view(b, t, h, hd).transpose(1, 2)

    q, k, v = split(mha.W_query(x_q), t_q), split(mha.W_key(x_kv), t_k), split(mha.W_value(x_kv), t_k)
    full = mask
    if mha.causal:
        cm = mha.causal_mask[t_k - t_q:t_k, :t_k]
        full = cm if mask is None else cm & mask
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=full, dropout_p=mha.dropout.p)
    return mha.out_proj(ctx.transpose(1, 2).contiguous().view(b, t_q, h * hd))


def _sdpa_causal_drops_mask(mha, x_q, x_kv=None, mask=None):
    return _sdpa_variant(mha, x_q, x_kv, None if mha.causal else mask, "plain")


bug_group("B04.sdpa_dropout_in_eval", f"{U}.mha_forward_sdpa",
          "F.scaled_dot_product_attention's dropout_p acts whatever the module's mode: a module in eval mode "
          "drops nothing.", {"mha_forward_sdpa": _sdpa_dropout_in_eval}, detect="detector")
bug_group("B04.sdpa_causal_drops_mask", f"{U}.mha_forward_sdpa",
          "A causal module still obeys the mask it is given: a key must be allowed by both.",
          {"mha_forward_sdpa": _sdpa_causal_drops_mask})

# order matters: without a user mask both mutants give the top-left rows; the check probes the
# masked case first, where only the second one is wrong
bug_group("B04.sdpa_top_left", f"{U}.mha_forward_sdpa",
          "SDPA's is_causal is top-left aligned; pass an explicit bottom-right mask.",
          {"mha_forward_sdpa": _sdpa_top_left})
bug_group("B04.sdpa_mask_and_causal", f"{U}.mha_forward_sdpa",
          "Combine the masks yourself and pass only attn_mask.", {"mha_forward_sdpa": _sdpa_mask_and_causal})


# not in the syllabus's table: since the library's MultiHeadAttention runs F.scaled_dot_product_attention
# in its own forward, calling the module matches every expected value; the check names it (a detector),
# whether the forward is reached through the module, its class, or a reference to it taken in advance,
# or its fast path is written out (is_causal=True for square causal self-attention, which the task forbids)
def _sdpa_delegates(mha, x_q, x_kv=None, mask=None):
    return mha(x_q, x_kv, mask)


def _sdpa_delegates_forward(mha, x_q, x_kv=None, mask=None):
    return type(mha).forward(mha, x_q, x_kv, mask=mask)


def _sdpa_delegates_captured():
    forward = _ref().MultiHeadAttention.forward  # taken when the notebook is loaded, before any check runs

    def mha_forward_sdpa(mha, x_q, x_kv=None, mask=None):
        return forward(mha, x_q, x_kv, mask)

    return mha_forward_sdpa


def _sdpa_square_is_causal(mha, x_q, x_kv=None, mask=None):
    """The module's own fast path, written out: is_causal=True for square causal self-attention."""
    x_kv = x_q if x_kv is None else x_kv
    b, t_q, _ = x_q.shape
    t_k = x_kv.shape[1]
    h, hd = mha.num_heads, mha.head_dim

    def split(y, t):
        return y.view(b, t, h, hd).transpose(1, 2)

    q, k, v = split(mha.W_query(x_q), t_q), split(mha.W_key(x_kv), t_k), split(mha.W_value(x_kv), t_k)
    if mha.causal and mask is None and t_q == t_k:
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mha.attention_mask(t_q, t_k, mask, batch=b))
    return mha.out_proj(ctx.transpose(1, 2).contiguous().view(b, t_q, h * hd))


_DELEGATES_HINT = ("Recompute the forward pass yourself: projections, heads, the combined mask passed as attn_mask "
                   "(never is_causal=True), F.scaled_dot_product_attention, out_proj. Calling the module or its "
                   "forward is not the exercise.")
for _f in (_sdpa_delegates, _sdpa_delegates_forward, _sdpa_delegates_captured(), _sdpa_square_is_causal):
    bug_group("B04.sdpa_delegates", f"{U}.mha_forward_sdpa", _DELEGATES_HINT, {"mha_forward_sdpa": _f},
              detect="detector")
