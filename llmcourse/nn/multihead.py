"""Multi-head attention (unit 04): a list of heads, the weight-split module, and PyTorch interop.

Two ways to run ``H`` attentions side by side:

* :class:`MultiHeadAttentionWrapper` keeps ``H`` independent single-head
  :class:`~llmcourse.nn.attention.CausalSelfAttention` modules of width ``head_dim`` each and
  concatenates their outputs on the last dim (no output projection).
* :class:`MultiHeadAttention` uses one ``(d_out, d_in)`` projection per query/key/value, cuts its
  output into ``H`` slices of width ``head_dim = d_out // H`` (``view`` + ``transpose``), attends
  in every head at once on ``(B, H, T_q, T_k)`` scores and merges the heads back before a final
  ``out_proj``.

:func:`mha_from_wrapper` shows that both compute the same function: stack the heads' weights row
by row and set ``out_proj`` to the identity. :func:`to_torch_mha` / :func:`to_torch_attn_mask` and
:func:`mha_forward_sdpa` reproduce the module with ``nn.MultiheadAttention`` and
``F.scaled_dot_product_attention``.

Conventions (syllabus §4): ``d_out`` is the **total** width of :class:`MultiHeadAttention`, while
``head_dim`` is the width of **one** head of the wrapper. Masks are boolean with ``True`` = may
attend and broadcast to ``(B, H, T_q, T_k)``; a causal module ANDs its bottom-right aligned causal
mask (:func:`~llmcourse.nn.masks.causal_mask`) with the user's mask. ``nn.MultiheadAttention``
uses the opposite polarity (``True`` = blocked).

Source: Vaswani et al., "Attention Is All You Need" (2017), §3.2.2, eq. for
``MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O``; the packed ``in_proj_weight`` layout
``[W_q; W_k; W_v]`` is the one of ``torch.nn.MultiheadAttention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import CausalSelfAttention, scaled_dot_product_attention
from .heads import merge_heads

__all__ = [
    "MultiHeadAttentionWrapper", "MultiHeadAttention", "mha_from_wrapper", "to_torch_attn_mask",
    "to_torch_mha", "mha_forward_sdpa", "mha_param_count",
]


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class MultiHeadAttentionWrapper(nn.Module):
    """``num_heads`` independent causal heads, concatenated on the last dim.

    Args:
        d_in: input width.
        head_dim: width of **one** head (each head's ``d_out``).
        context_length: longest sequence each head accepts.
        dropout: attention-weight dropout probability of every head.
        num_heads: number of heads ``H``.
        qkv_bias: whether the projections have a bias.

    State: ``heads`` (``nn.ModuleList`` of ``H`` llmcourse ``CausalSelfAttention(d_in, head_dim,
    context_length, dropout, qkv_bias)``), so the keys are ``heads.{h}.W_query.weight``
    ``(head_dim, d_in)`` and likewise ``W_key``, ``W_value``. Parameters: ``3·d_in·head_dim·H``
    (plus ``3·head_dim·H`` biases); there is no output projection.

    ``forward``: ``(B, T, d_in)`` -> ``(B, T, H·head_dim)``; columns ``h·head_dim … (h+1)·head_dim−1``
    come from head ``h``.

    Raises:
        ValueError: if a size is not a positive int.
    """

    def __init__(self, d_in: int, head_dim: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False):
        super().__init__()
        for name, value in (("d_in", d_in), ("head_dim", head_dim), ("context_length", context_length),
                            ("num_heads", num_heads)):
            _check_positive(name, value)
        self.heads = nn.ModuleList(
            [CausalSelfAttention(d_in, head_dim, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([head(x) for head in self.heads], dim=-1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with weight splitting, for self-, causal and cross-attention.

    Args:
        d_in: width of the query input ``x_q``.
        d_out: **total** output width; ``head_dim = d_out // num_heads``.
        num_heads: number of heads ``H``.
        dropout: dropout probability on the attention weights (``self.dropout``).
        qkv_bias: bias on ``W_query``, ``W_key``, ``W_value`` (``out_proj`` always has one).
        causal: AND a bottom-right aligned causal mask with the user's mask.
        context_length: size of the causal buffer; required when ``causal``.
        d_kv: width of the key/value input ``x_kv`` (cross-attention); default ``d_in``.

    State (``state_dict`` keys): ``W_query.weight`` ``(d_out, d_in)``, ``W_key.weight`` ``(d_out, d_kv)``,
    ``W_value.weight`` ``(d_out, d_kv)`` (+ ``.bias`` ``(d_out,)`` when ``qkv_bias``), ``out_proj.weight``
    ``(d_out, d_out)``, ``out_proj.bias`` ``(d_out,)``. When ``causal``, the buffer ``causal_mask``
    ``(context_length, context_length)`` bool lower-triangular, ``persistent=False``. The four
    ``nn.Linear`` layers are created in the order query, key, value, out_proj.

    Parameters: ``d_out·d_in + 2·d_out·d_kv (+ 3·d_out) + d_out² + d_out``; for ``d_in = d_out = 768``:
    2,360,064 (2,362,368 with ``qkv_bias``).

    ``store_weights`` (default ``False``): when set, each forward runs the explicit path
    (llmcourse's :func:`~llmcourse.nn.attention.scaled_dot_product_attention`: scores, mask, softmax,
    dropout on the weights, ``@ V``) and stores ``last_weights`` ``(B, H, T_q, T_k)``, post-softmax,
    pre-dropout, detached. Otherwise the attention runs in ``F.scaled_dot_product_attention`` (torch's
    fused kernel; ``is_causal=True`` for square causal self-attention without a user mask, else the
    boolean mask): the same function (``atol 1e-6``), faster and without the ``(T_q, T_k)`` weights in
    memory. Dropout on the weights is ``dropout.p`` in training mode on both paths.

    ``forward(x_q, x_kv=None, mask=None)``: ``x_q`` ``(B, T_q, d_in)``; ``x_kv`` ``(B, T_k, d_kv)`` or
    ``None`` for self-attention; ``mask`` bool broadcastable to ``(B, H, T_q, T_k)``, ``True`` = attend
    (e.g. a ``(B, 1, 1, T_k)`` key-padding mask). Returns ``(B, T_q, d_out)``. Scores are scaled by
    ``1/√head_dim``. Every query row must keep at least one key (else NaN, as in torch).

    Raises:
        ValueError: ``d_out`` not divisible by ``num_heads``; ``causal`` without ``context_length``;
            wrong input ranks or widths; a non-bool or non-broadcastable mask; for a causal module,
            ``T_k > context_length`` or ``T_q > T_k``.
    """

    def __init__(self, d_in: int, d_out: int, num_heads: int, dropout: float = 0.0, qkv_bias: bool = False,
                 causal: bool = False, context_length: int | None = None, d_kv: int | None = None):
        super().__init__()
        d_kv = d_in if d_kv is None else d_kv
        for name, value in (("d_in", d_in), ("d_out", d_out), ("num_heads", num_heads), ("d_kv", d_kv)):
            _check_positive(name, value)
        if d_out % num_heads != 0:
            raise ValueError(f"d_out={d_out} is not divisible by num_heads={num_heads}: "
                             f"head_dim = d_out / num_heads must be an integer")
        if causal:
            if context_length is None:
                raise ValueError("a causal MultiHeadAttention needs context_length (the size of its mask buffer)")
            _check_positive("context_length", context_length)
        self.d_in, self.d_out, self.d_kv = d_in, d_out, d_kv
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.causal = causal
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_kv, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_kv, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        if causal:
            self.register_buffer("causal_mask", torch.ones(context_length, context_length, dtype=torch.bool).tril(),
                                 persistent=False)
        self.store_weights = False
        self.last_weights: Tensor | None = None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, causal={self.causal}"

    def _split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def _fused_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's q, k, v ``(B, H, T, hd)`` from one ``(3·d_out, d_in)`` GEMM over the concatenated
        ``W_query``/``W_key``/``W_value`` weights (what GPT-2's fused ``c_attn`` does; measured faster on CPU than three
        ``(d_out, d_in)`` GEMMs at 2 threads). Parameters and state_dict keys are unchanged; the explicit
        ``store_weights`` path keeps the three separate projections."""
        weight = torch.cat([self.W_query.weight, self.W_key.weight, self.W_value.weight])
        bias = None if self.W_query.bias is None else torch.cat([self.W_query.bias, self.W_key.bias, self.W_value.bias])
        q, k, v = F.linear(x, weight, bias).split(self.W_query.out_features, dim=-1)
        return self._split(q), self._split(k), self._split(v)

    def _inputs(self, x_q: Tensor, x_kv: Tensor | None) -> Tensor:
        if x_q.dim() != 3 or x_q.shape[-1] != self.d_in:
            raise ValueError(f"x_q must have shape (B, T_q, d_in={self.d_in}), got {tuple(x_q.shape)}")
        if x_kv is None:
            if self.d_kv != self.d_in:
                raise ValueError(f"this module has d_kv={self.d_kv} != d_in={self.d_in}: pass x_kv (cross-attention)")
            return x_q
        if x_kv.dim() != 3 or x_kv.shape[-1] != self.d_kv or x_kv.shape[0] != x_q.shape[0]:
            raise ValueError(f"x_kv must have shape (B={x_q.shape[0]}, T_k, d_kv={self.d_kv}), got {tuple(x_kv.shape)}")
        return x_kv

    def attention_mask(self, t_q: int, t_k: int, mask: Tensor | None = None, batch: int = 1) -> Tensor | None:
        """The boolean mask the module applies: its causal mask (if ``causal``) AND ``mask``.

        Args:
            t_q, t_k: numbers of queries and keys.
            mask: optional bool mask broadcastable to ``(batch, H, t_q, t_k)``, ``True`` = attend.
            batch: the batch size, used only to validate ``mask``'s shape.

        Returns:
            ``None`` (no masking), or a bool tensor broadcastable to ``(batch, H, t_q, t_k)``. The causal
            part is bottom-right aligned: query ``i`` may see keys ``j ≤ i + t_k − t_q``, i.e.
            ``causal_mask(t_q, t_k)``.

        Raises:
            ValueError: non-bool or non-broadcastable ``mask``; causal with ``t_k > context_length`` or
                ``t_q > t_k``.
        """
        if mask is not None:
            if mask.dtype != torch.bool:
                raise ValueError(f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}; "
                                 f"build it with comparisons or .bool()")
            try:
                torch.broadcast_shapes(mask.shape, (batch, self.num_heads, t_q, t_k))
            except RuntimeError:
                raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, T_q, T_k) = "
                                 f"{(batch, self.num_heads, t_q, t_k)}; a key-padding mask is (B, 1, 1, T_k)") from None
        if not self.causal:
            return mask
        if t_k > self.context_length:
            raise ValueError(f"sequence length {t_k} exceeds context_length={self.context_length}")
        if t_q > t_k:
            raise ValueError(f"a causal module needs T_q <= T_k (queries are the last T_q positions), "
                             f"got T_q={t_q}, T_k={t_k}")
        causal = self.causal_mask[t_k - t_q:t_k, :t_k]
        return causal if mask is None else causal & mask

    def forward(self, x_q: Tensor, x_kv: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        x_kv = self._inputs(x_q, x_kv)
        b, t_q, _ = x_q.shape
        t_k = x_kv.shape[1]
        full_mask = self.attention_mask(t_q, t_k, mask, batch=b)
        if x_kv is x_q and not self.store_weights:
            q, k, v = self._fused_qkv(x_q)           # self-attention: one GEMM, same parameters
        else:
            q = self._split(self.W_query(x_q))       # (B, H, T_q, hd)
            k = self._split(self.W_key(x_kv))        # (B, H, T_k, hd)
            v = self._split(self.W_value(x_kv))      # (B, H, T_k, hd)
        if self.store_weights:
            # explicit path: the attention weights are materialised for the head viewers
            context, weights = scaled_dot_product_attention(q, k, v, mask=full_mask, dropout=self.dropout)
            self.last_weights = weights.detach()
        else:
            # fast path: torch's fused kernel; for square causal self-attention without a user mask the
            # top-left is_causal alignment equals the course's bottom-right one
            p = self.dropout.p if self.training else 0.0
            if self.causal and mask is None and t_q == t_k:
                context = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            else:
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=full_mask, dropout_p=p)
        return self.out_proj(merge_heads(context))   # (B, T_q, d_out)


def mha_param_count(d_in: int, d_out: int, qkv_bias: bool = False, d_kv: int | None = None) -> int:
    """Number of parameters of ``MultiHeadAttention(d_in, d_out, H, qkv_bias=qkv_bias, d_kv=d_kv)``.

    ``d_out·d_in + 2·d_out·d_kv (+ 3·d_out if qkv_bias) + d_out² + d_out`` (independent of ``H``).
    For ``d_in = d_out = 768``: 2,360,064, or 2,362,368 with ``qkv_bias``.
    """
    d_kv = d_in if d_kv is None else d_kv
    return d_out * d_in + 2 * d_out * d_kv + (3 * d_out if qkv_bias else 0) + d_out * d_out + d_out


def mha_from_wrapper(wrapper: MultiHeadAttentionWrapper) -> MultiHeadAttention:
    """The weight-split :class:`MultiHeadAttention` computing the same function as ``wrapper``.

    Returns a causal module with ``d_out = H·head_dim``, the heads' dropout ``p`` and ``context_length``,
    ``W_query.weight = cat([heads[h].W_query.weight for h], 0)`` (rows of head ``h`` are the slice
    ``h·head_dim … (h+1)·head_dim−1``), the same for ``W_key``/``W_value`` (and their biases),
    ``out_proj.weight = I`` and ``out_proj.bias = 0``. Weights are copied (not shared); the result is
    in the wrapper's training mode. In eval mode ``mha_from_wrapper(w)(x) == w(x)``.

    Raises:
        ValueError: if ``wrapper`` has no ``heads`` or the heads differ in shape.
    """
    heads = list(getattr(wrapper, "heads", []))
    if not heads:
        raise ValueError("mha_from_wrapper expects a MultiHeadAttentionWrapper with a non-empty .heads")
    first = heads[0]
    d_in, head_dim = first.W_query.in_features, first.W_query.out_features
    if any(h.W_query.weight.shape != first.W_query.weight.shape for h in heads):
        raise ValueError("all heads of the wrapper must have the same d_in and head_dim")
    qkv_bias = first.W_query.bias is not None
    mha = MultiHeadAttention(d_in, head_dim * len(heads), len(heads), dropout=first.dropout.p, qkv_bias=qkv_bias,
                             causal=True, context_length=first.context_length)
    mha.to(device=first.W_query.weight.device, dtype=first.W_query.weight.dtype)
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(mha, name).weight.copy_(torch.cat([getattr(h, name).weight for h in heads], dim=0))
            if qkv_bias:
                getattr(mha, name).bias.copy_(torch.cat([getattr(h, name).bias for h in heads], dim=0))
        mha.out_proj.weight.copy_(torch.eye(mha.d_out, dtype=mha.out_proj.weight.dtype,
                                                     device=mha.out_proj.weight.device))
        mha.out_proj.bias.zero_()
    mha.train(wrapper.training)
    return mha


def to_torch_attn_mask(mask: Tensor) -> Tensor:
    """Course mask (``True`` = may attend) -> boolean ``attn_mask`` of ``nn.MultiheadAttention`` (``True`` = blocked).

    The conversion is ``~mask``. ``nn.MultiheadAttention`` accepts a ``(T_q, T_k)`` or ``(B·H, T_q, T_k)``
    attn_mask; a key-padding mask goes to its ``key_padding_mask`` argument as ``~keep`` of shape ``(B, T_k)``.
    (``F.scaled_dot_product_attention`` uses the course polarity: pass course masks to it unchanged.)

    Raises:
        ValueError: if ``mask`` is not a bool tensor (a float mask would be *added* to the scores by torch).
    """
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"expected a bool course mask (True = may attend), got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)}")
    return ~mask


def to_torch_mha(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(d, H, dropout=p, bias=True, batch_first=True)`` with ``mha``'s weights.

    ``in_proj_weight = cat([W_query.weight, W_key.weight, W_value.weight], 0)`` ``(3·d, d)`` (rows in the
    order query, key, value); ``in_proj_bias`` the concatenated biases, or zeros without ``qkv_bias``;
    ``out_proj`` copied. The causal flag is not carried over: pass ``to_torch_attn_mask(mask)``. Same
    device, dtype and training mode as ``mha``. Then, for a course mask ``m`` (including the causal part),
    ``torch_mha(x, x, x, attn_mask=to_torch_attn_mask(m), need_weights=False)[0] == mha(x, mask=m)``.

    Raises:
        ValueError: unless ``d_in == d_kv == d_out`` (torch's packed layout needs one width).
    """
    if not (mha.d_in == mha.d_kv == mha.d_out):
        raise ValueError(f"to_torch_mha needs d_in == d_kv == d_out, got d_in={mha.d_in}, d_kv={mha.d_kv}, "
                         f"d_out={mha.d_out}")
    w = mha.W_query.weight
    torch_mha = nn.MultiheadAttention(mha.d_out, mha.num_heads, dropout=mha.dropout.p, bias=True, batch_first=True,
                                      device=w.device, dtype=w.dtype)
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight], 0))
        if mha.W_query.bias is not None:
            torch_mha.in_proj_bias.copy_(torch.cat([mha.W_query.bias, mha.W_key.bias, mha.W_value.bias], 0))
        else:
            torch_mha.in_proj_bias.zero_()
        torch_mha.out_proj.weight.copy_(mha.out_proj.weight)
        torch_mha.out_proj.bias.copy_(mha.out_proj.bias)
    torch_mha.train(mha.training)
    return torch_mha


def mha_forward_sdpa(mha: MultiHeadAttention, x_q: Tensor, x_kv: Tensor | None = None,
                     mask: Tensor | None = None) -> Tensor:
    """``mha(x_q, x_kv, mask)`` with the attention computed by ``F.scaled_dot_product_attention``.

    Uses ``mha``'s projections, a boolean ``attn_mask`` = (the module's bottom-right causal mask if
    ``mha.causal``) AND ``mask``, and ``dropout_p = mha.dropout.p`` only in training mode. ``is_causal`` is
    never passed: it is top-left aligned for ``T_q ≠ T_k`` and may not be combined with ``attn_mask``.
    Equal to ``mha.forward`` in eval mode (``atol 1e-5``). Shapes and errors as in ``mha.forward``.
    """
    x_kv = mha._inputs(x_q, x_kv)
    b, t_q, _ = x_q.shape
    t_k = x_kv.shape[1]
    full_mask = mha.attention_mask(t_q, t_k, mask, batch=b)
    q = mha._split(mha.W_query(x_q))
    k = mha._split(mha.W_key(x_kv))
    v = mha._split(mha.W_value(x_kv))
    p = mha.dropout.p if mha.training else 0.0
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=full_mask, dropout_p=p)
    return mha.out_proj(merge_heads(context))
