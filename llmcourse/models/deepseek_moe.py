"""Mixture of experts: softmax top-k routing (Switch/GShard) and DeepSeek-V3's DeepSeekMoE layer.

Pieces (unit 14):

* :func:`softmax_topk_route` -- softmax over ``E`` experts, keep the ``k`` largest, optionally renormalise.
* :func:`load_balancing_loss` -- the Switch Transformer auxiliary loss ``α·Σ_i f_i·P_i`` (Fedus et al. 2021,
  eq. 4-6; GShard's ``l_aux``), scaled so that a uniform router with balanced assignments gives exactly ``α``.
* :func:`sequence_balance_loss` -- DeepSeek-V3's complementary sequence-wise balance loss (report eq. 17-20): the
  same product ``α·Σ_i f_i·P_i`` per sequence, with the affinities normalised per token, averaged over the batch.
* :func:`deepseek_route` -- DeepSeek-V3's sigmoid, group-limited routing (DeepSeek-V3 report, eq. 12-16):
  ``e_score_correction_bias`` only **chooses** experts; the gate weights come from the unbiased scores.
* :func:`update_bias` -- auxiliary-loss-free balancing (Wang et al. 2024, "Auxiliary-Loss-Free Load
  Balancing", Algorithm 1): ``b_i ← b_i + γ·sign(c̄ − c_i)`` in float32, outside autograd.
* :class:`DeepSeekTopkRouter` and :class:`DeepSeekMoE` -- the layer with the state_dict names of
  ``transformers``' ``DeepseekV3TopkRouter`` / ``DeepseekV3MoE`` (experts stored one module each; see
  :func:`moe_state_dict_from_hf` for ``transformers`` 5's fused 3-D expert tensors).

Every routing function equals ``transformers`` 5.23 (``models/deepseek_v3/modeling_deepseek_v3.py``) with
the same inputs; ``tests/test_unit14_deepseek_moe.py`` proves it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .llama3 import SwiGLUFeedForward

__all__ = [
    "softmax_topk_route", "load_balancing_loss", "sequence_balance_loss", "deepseek_route", "update_bias",
    "expert_counts", "capacity_mask", "DeepSeekTopkRouter", "DeepSeekMoE", "moe_param_counts",
    "profile_moe_forward",
    "hf_deepseek_moe_config", "random_hf_deepseek_moe", "moe_state_dict_from_hf", "load_hf_deepseek_moe",
]


# ------------------------------------------------------------------------------------------------
# routing functions
# ------------------------------------------------------------------------------------------------


def softmax_topk_route(logits: Tensor, k: int, renormalize: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Softmax top-k routing (Shazeer et al. 2017 without noise; Switch/GShard/Mixtral style).

    Args:
        logits: ``(N, E)`` router scores of ``N`` tokens.
        k: experts per token, ``1 ≤ k ≤ E``.
        renormalize: divide the kept probabilities by their sum (Mixtral); then the weights equal a
            softmax over the ``k`` selected logits.

    Returns:
        ``(weights (N, k), indices (N, k) long, probs (N, E))``: ``probs = softmax(logits, -1)``, ``indices``
        by descending probability, ``weights = probs.gather(1, indices)`` (renormalised when asked).
        Example: logits ``[[2, 1, 0.5, 0]]``, ``k=2`` -> probs ``[0.5793, 0.2131, 0.1293, 0.0784]``,
        indices ``[0, 1]``, weights ``[0.7311, 0.2689]``.

    Raises:
        ValueError: ``logits`` not 2-D, or ``k`` outside ``[1, E]``.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (N, E), got shape {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, {logits.shape[-1]}], got {k}")
    probs = torch.softmax(logits, dim=-1)
    weights, indices = torch.topk(probs, k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, indices, probs


def expert_counts(indices: Tensor, num_experts: int) -> Tensor:
    """Number of ``(token, slot)`` assignments per expert: ``(E,)`` long, from ``indices`` of any shape."""
    return torch.bincount(indices.reshape(-1).long(), minlength=num_experts)


def capacity_mask(indices: Tensor, num_experts: int, capacity_factor: float) -> tuple[Tensor, int]:
    """Expert capacity with token dropping (Switch Transformer §2.2, GShard): which assignments an expert keeps.

    Every expert accepts at most ``C = floor(capacity_factor · k·N / E)`` of the ``N·k`` assignments (``k·N/E`` is
    its share under perfect balance); assignments are served in token order (token 0's slots first) and the ones
    beyond ``C`` are dropped (the token then skips that expert; a residual connection carries it on). DeepSeek-V3
    drops no tokens, in training or inference (report §2.1.2): it relies on balanced routing instead.

    Args:
        indices: ``(N, k)`` long. num_experts: ``E``. capacity_factor: ``> 0``.

    Returns:
        ``(kept (N, k) bool, C)``.
    """
    n, k = indices.shape
    cap = int(math.floor(capacity_factor * k * n / num_experts))
    onehot = F.one_hot(indices.reshape(-1).long(), num_experts)                  # (N·k, E), token-major order
    position = (onehot.cumsum(0) * onehot).sum(-1) - 1                          # place in its expert's queue
    return (position < cap).view(n, k), cap


def load_balancing_loss(probs: Tensor, indices: Tensor, num_experts: int, alpha: float = 0.01) -> Tensor:
    """Auxiliary load-balancing loss ``α·Σ_i f_i·P_i`` (Switch Transformer eq. 4-6, generalised to top-k).

    ``f_i = E/(k·N)·#{(t, j): indices[t, j] = i}`` (the dispatch fraction, scaled so balanced routing gives
    ``f_i = 1``), ``P_i = mean_t probs[t, i]``. The counts carry no gradient; the loss is differentiable in
    ``probs`` only. A uniform router with balanced assignments gives exactly ``α``; all tokens sent to one
    expert with probability 1 give ``α·E``.

    Args:
        probs: ``(N, E)`` routing probabilities (rows sum to 1).
        indices: ``(N, k)`` long, the experts each token was sent to.
        num_experts: ``E``.
        alpha: the loss coefficient.

    Returns:
        a scalar tensor of ``probs``' dtype.
    """
    n, k = indices.shape
    f = expert_counts(indices, num_experts).to(probs.dtype) * (num_experts / (k * n))
    p = probs.mean(dim=0)
    return alpha * (f * p).sum()


def sequence_balance_loss(scores: Tensor, indices: Tensor, num_experts: int, alpha: float = 0.0001) -> Tensor:
    """DeepSeek-V3's complementary sequence-wise balance loss (technical report §2.1.2, eq. 17-20).

    For each sequence ``b`` of ``T`` tokens: ``s'[t, i] = scores[b, t, i] / Σ_j scores[b, t, j]`` (affinities
    normalised per token), ``P_i = mean_t s'[t, i]``, ``f_i = E/(k·T)·#{(t, j): indices[b, t, j] = i}``,
    ``L_b = α·Σ_i f_i·P_i``; returns ``mean_b L_b``. Balance is asked of **every sequence**, not only of the batch:
    two sequences collapsed onto different experts are balanced as a batch (:func:`load_balancing_loss` near
    ``α``) but each pays ``α·E/k`` here (for a uniform router, whatever the constant affinity). Differentiable in
    ``scores`` only.

    Args:
        scores: ``(B, T, E)`` non-negative affinities (DeepSeek-V3: the sigmoid scores, unbiased).
        indices: ``(B, T, k)`` long, the chosen experts (DeepSeek-V3: chosen with the biased scores).
        num_experts: ``E``. alpha: the coefficient (DeepSeek-V3 used a very small one, 1e-4).

    Returns:
        a scalar tensor of ``scores``' dtype.
    """
    b, t, k = indices.shape
    counts = torch.stack([expert_counts(indices[i], num_experts) for i in range(b)]).to(scores.dtype)  # (B, E)
    f = counts * (num_experts / (k * t))
    p = (scores / scores.sum(dim=-1, keepdim=True)).mean(dim=1)                                      # (B, E)
    return alpha * (f * p).sum(dim=-1).mean()


def deepseek_route(router_logits: Tensor, bias: Tensor, top_k: int, n_group: int, topk_group: int,
                   routed_scaling_factor: float = 1.0, norm_topk_prob: bool = True) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3 routing: sigmoid affinities, group-limited top-k, bias for selection only.

    ``s = sigmoid(router_logits.float())``; ``sb = s + bias`` (used only to choose); each of ``n_group``
    contiguous groups is scored by the sum of its two largest ``sb``; the ``topk_group`` best groups are
    kept and the ``sb`` of every other expert is set to ``−inf`` (not 0: biased scores can be negative);
    ``indices = topk(sb, top_k)``; ``weights = s.gather(1, indices)`` (**unbiased**), divided by their sum
    (+1e-20) when ``norm_topk_prob``, then multiplied by ``routed_scaling_factor``.
    Equals ``transformers``' ``DeepseekV3TopkRouter.forward`` after its linear map (which returns the indices
    unsorted; compare after sorting by expert index).

    Args:
        router_logits: ``(N, E)``; bias: ``(E,)`` (float32); ``E`` divisible by ``n_group``, each group of at
            least 2 experts; ``1 ≤ topk_group ≤ n_group``; ``top_k ≤ topk_group·E/n_group``.

    Returns:
        ``(weights (N, top_k) float32, indices (N, top_k) long)``, indices by descending biased score.

    Raises:
        ValueError: inconsistent sizes.
    """
    n, e = router_logits.shape
    if e % n_group or e // n_group < 2:
        raise ValueError(f"{e} experts cannot form {n_group} groups of at least 2 experts")
    if not 1 <= topk_group <= n_group or not 1 <= top_k <= topk_group * (e // n_group):
        raise ValueError(f"need 1 ≤ topk_group ≤ n_group and 1 ≤ top_k ≤ topk_group·E/n_group, got "
                         f"top_k={top_k}, n_group={n_group}, topk_group={topk_group}, E={e}")
    scores = torch.sigmoid(router_logits.float())
    choice = scores + bias.float()
    group_scores = choice.view(n, n_group, e // n_group).topk(2, dim=-1).values.sum(dim=-1)
    group_idx = group_scores.topk(topk_group, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
    keep = keep.unsqueeze(-1).expand(n, n_group, e // n_group).reshape(n, e)
    choice = choice.masked_fill(~keep, float("-inf"))
    indices = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, indices)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, indices


@torch.no_grad()
def update_bias(bias: Tensor, indices: Tensor, num_experts: int, gamma: float = 0.001) -> Tensor:
    """Auxiliary-loss-free bias update (Wang et al. 2024, Alg. 1; DeepSeek-V3 report §2.1.2).

    ``c_i`` = number of ``(token, slot)`` assignments to expert ``i`` in ``indices`` (any shape), ``c̄ = mean(c)``;
    returns a new float32 ``(E,)`` tensor ``bias + γ·sign(c̄ − c)``: overloaded experts go down by ``γ``,
    underloaded ones up, balanced ones stay. float32 even for a bfloat16 ``bias`` (a step of 1e-3 near 1 is
    below bfloat16's resolution). Example: counts ``[5, 1, 1, 1]``, ``γ=0.001`` -> ``Δ = [−0.001, +0.001, +0.001, +0.001]``.
    """
    c = expert_counts(indices, num_experts).float()
    return bias.float() + gamma * torch.sign(c.mean() - c)


# ------------------------------------------------------------------------------------------------
# modules
# ------------------------------------------------------------------------------------------------


class DeepSeekTopkRouter(nn.Module):
    """The router of :class:`DeepSeekMoE` (``transformers``' ``DeepseekV3TopkRouter`` names).

    Keys: ``weight`` ``(E, D)`` (a Parameter, no bias) and ``e_score_correction_bias`` ``(E,)`` float32, a
    **persistent buffer** (in ``state_dict``, never in ``parameters()``; changed only by the sign update).
    ``forward(x)``: ``x (..., D)`` -> ``(router_logits (N, E) float32, weights (N, top_k) float32,
    indices (N, top_k) long)`` with ``N = x.numel()/D``; logits computed in float32 as in ``transformers``.
    """

    def __init__(self, d_model: int, n_routed_experts: int, top_k: int, n_group: int = 1, topk_group: int = 1,
                 routed_scaling_factor: float = 1.0, norm_topk_prob: bool = True):
        super().__init__()
        self.d_model, self.n_routed_experts, self.top_k = d_model, n_routed_experts, top_k
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor, self.norm_topk_prob = routed_scaling_factor, norm_topk_prob
        self.weight = nn.Parameter(torch.empty(n_routed_experts, d_model))
        nn.init.normal_(self.weight, std=0.02)
        self.register_buffer("e_score_correction_bias", torch.zeros(n_routed_experts, dtype=torch.float32))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        flat = x.reshape(-1, self.d_model)
        logits = F.linear(flat.float(), self.weight.float())
        weights, indices = deepseek_route(logits, self.e_score_correction_bias, self.top_k, self.n_group,
                                          self.topk_group, self.routed_scaling_factor, self.norm_topk_prob)
        return logits, weights, indices

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, experts={self.n_routed_experts}, top_k={self.top_k}, "
                f"n_group={self.n_group}, topk_group={self.topk_group}, scale={self.routed_scaling_factor}")


class DeepSeekMoE(nn.Module):
    """DeepSeek-V3's MoE feed-forward layer: routed SwiGLU experts plus always-on shared experts.

    ``forward(x)``: ``(B, T, D)`` (any ``(..., D)``) -> same shape,
    ``Σ_j w_j·expert_{i_j}(x) + shared_experts(x)`` per token (no residual), with ``(w, i)`` from
    :func:`deepseek_route`. Experts run only on the tokens routed to them: the assignments are sorted by expert
    once, then either one grouped GEMM per projection runs over the blocks (``F.grouped_mm``, when every expert is a
    plain bias-free SwiGLU without hooks) or each expert with tokens is called on its block (an expert with no tokens
    is not called; FP8-converted or hooked experts take this path). Both give the same sums. In training mode the layer keeps ``last_indices`` ``(N, top_k)`` and ``last_router_logits``
    ``(N, E)`` of the last call for the caller's :meth:`update_bias` (or an auxiliary loss).

    ``state_dict`` keys (``transformers``' ``DeepseekV3MoE`` with experts unfused, :func:`moe_state_dict_from_hf`)::

        gate.weight (E, D)                  gate.e_score_correction_bias (E,) float32 buffer
        experts.{e}.gate_proj.weight (I, D) experts.{e}.up_proj.weight (I, D) experts.{e}.down_proj.weight (D, I)
        shared_experts.gate_proj.weight (I·S, D)  shared_experts.up_proj.weight (I·S, D)
        shared_experts.down_proj.weight (D, I·S)        (absent when n_shared_experts = 0)

    The S shared experts are one SwiGLU MLP of width ``I·S``, which equals the **sum** of S experts of width I.
    Source: DeepSeek-V3 technical report §2.1.2 eq. 12-16; ``transformers`` 5.23 ``DeepseekV3MoE``.
    """

    def __init__(self, d_model: int, moe_intermediate_size: int, n_routed_experts: int, n_shared_experts: int,
                 top_k: int, n_group: int = 1, topk_group: int = 1, routed_scaling_factor: float = 1.0,
                 norm_topk_prob: bool = True, bias_update_speed: float = 0.001):
        super().__init__()
        self.d_model, self.n_routed_experts, self.top_k = d_model, n_routed_experts, top_k
        self.bias_update_speed = bias_update_speed
        self.gate = DeepSeekTopkRouter(d_model, n_routed_experts, top_k, n_group, topk_group,
                                       routed_scaling_factor, norm_topk_prob)
        self.experts = nn.ModuleList(SwiGLUFeedForward(d_model, moe_intermediate_size)
                                     for _ in range(n_routed_experts))
        self.shared_experts = (SwiGLUFeedForward(d_model, moe_intermediate_size * n_shared_experts)
                               if n_shared_experts > 0 else None)
        self.last_indices: Tensor | None = None
        self.last_router_logits: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected (..., {self.d_model}) inputs, got shape {tuple(x.shape)}")
        flat = x.reshape(-1, self.d_model)
        logits, weights, indices = self.gate(flat)
        if self.training:
            self.last_indices, self.last_router_logits = indices.detach(), logits
        # Dispatch once: sort the N·k (token, slot) assignments by expert (stable: token order inside an expert),
        # gather their inputs in one index_select (its backward is one index_add), run the experts on their
        # contiguous blocks, weight, and scatter-add back. Per expert the rows and their order are those of a
        # ``torch.where(indices == e)`` loop, so the sums are the same.
        k = indices.shape[1]
        flat_e = indices.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        counts = torch.bincount(flat_e, minlength=self.n_routed_experts)
        token = order // k
        xs = flat.index_select(0, token)
        w = weights.reshape(-1).index_select(0, order)[:, None]
        out = torch.zeros_like(flat)
        if self._grouped_ok(xs):
            # one grouped GEMM per projection over the expert-sorted rows (torch's grouped_mm: the rows of expert e
            # are the e-th block of the offsets); the same SwiGLU as calling each expert on its block
            # (gate and up of each expert side by side: one GEMM for both, as transformers' fused gate_up_proj)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            n_e, width = len(self.experts), self.experts[0].gate_proj.out_features
            w_gate_up = torch.cat([p for ex in self.experts for p in (ex.gate_proj.weight, ex.up_proj.weight)])
            gate, up = F.grouped_mm(xs, w_gate_up.view(n_e, 2 * width, -1).transpose(1, 2), offs=offs).chunk(2, dim=-1)
            w_down = torch.stack([ex.down_proj.weight for ex in self.experts]).transpose(1, 2)
            ys = F.grouped_mm(F.silu(gate) * up, w_down, offs=offs) * w
            out = out.index_add_(0, token, ys.to(flat.dtype))
        elif xs.shape[0]:
            # each expert with tokens called as a module on its block (an expert with no tokens is not called)
            ys = [self.experts[e](part) for e, part in enumerate(xs.split(counts.tolist())) if part.shape[0]]
            out = out.index_add_(0, token, (torch.cat(ys) * w).to(flat.dtype))
        out = out.view_as(x)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out

    use_grouped_mm = True   # class switch (tests compare both paths)

    def _grouped_ok(self, xs: Tensor) -> bool:
        """The grouped path applies when torch has ``F.grouped_mm``, the rows are float32 and every expert is unit 11's
        plain SwiGLU of bias-free ``nn.Linear`` maps without hooks (an FP8-converted or hooked expert is called as a
        module instead)."""
        if not (self.use_grouped_mm and hasattr(F, "grouped_mm") and xs.dtype == torch.float32 and xs.shape[0]):
            return False
        for ex in self.experts:
            if type(ex) is not SwiGLUFeedForward or ex._forward_hooks or ex._forward_pre_hooks:
                return False
            for lin in (ex.gate_proj, ex.up_proj, ex.down_proj):
                if type(lin) is not nn.Linear or lin.bias is not None or lin._forward_hooks or lin._forward_pre_hooks:
                    return False
        return True

    @torch.no_grad()
    def update_bias(self) -> None:
        """Apply :func:`update_bias` with ``bias_update_speed`` to ``gate.e_score_correction_bias`` using the
        routing of the last training-mode call (a no-op when there is none); keeps the buffer float32."""
        if self.last_indices is None:
            return
        b = self.gate.e_score_correction_bias
        b.copy_(update_bias(b, self.last_indices, self.n_routed_experts, self.bias_update_speed))


@torch.no_grad()
def profile_moe_forward(moe: DeepSeekMoE, x: Tensor, repeats: int = 5) -> dict:
    """Where one eval-mode :meth:`DeepSeekMoE.forward` spends its time, stage by stage (the grouped-GEMM path).

    Runs the steps of the forward one after the other with a clock between them and returns the best of ``repeats``
    wall times per stage in milliseconds::

        router   logits in float32 and deepseek_route (sigmoid, group mask, top-k, gate weights)
        sort     argsort of the N·k expert indices, tokens per expert, offsets
        gather   the rows of the routed tokens and their gate weights (index_select)
        pack     the expert weights laid side by side for the grouped GEMM (cat/stack, every call)
        gemm     the grouped GEMMs (gate and up in one, SwiGLU, down) and the gate-weight product
        scatter  the weighted rows added back at their tokens (index_add)
        shared   the shared experts (one dense SwiGLU)

    plus ``"total"`` (the sum) and ``"max_abs_diff"`` against ``moe(x)`` (the staged run must compute the same
    output). Timings depend on the machine and its load: print them, never assert them.

    Raises:
        ValueError: when the layer would not take the grouped path (hooked or converted experts, non-float32 rows).
    """
    import time

    flat = x.reshape(-1, moe.d_model)
    if not moe._grouped_ok(flat):
        raise ValueError("profile_moe_forward needs the grouped-GEMM path (plain float32 SwiGLU experts)")
    best: dict[str, float] = {}
    out = None
    for _ in range(repeats):
        times = {}
        t0 = time.perf_counter()
        _, weights, indices = moe.gate(flat)
        t1 = time.perf_counter()
        times["router"] = t1 - t0
        k = indices.shape[1]
        flat_e = indices.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        counts = torch.bincount(flat_e, minlength=moe.n_routed_experts)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        token = order // k
        t2 = time.perf_counter()
        times["sort"] = t2 - t1
        xs = flat.index_select(0, token)
        w = weights.reshape(-1).index_select(0, order)[:, None]
        t3 = time.perf_counter()
        times["gather"] = t3 - t2
        n_e, width = len(moe.experts), moe.experts[0].gate_proj.out_features
        w_gate_up = torch.cat([p for ex in moe.experts for p in (ex.gate_proj.weight, ex.up_proj.weight)])
        w_gate_up = w_gate_up.view(n_e, 2 * width, -1).transpose(1, 2)
        w_down = torch.stack([ex.down_proj.weight for ex in moe.experts]).transpose(1, 2)
        t4 = time.perf_counter()
        times["pack"] = t4 - t3
        gate, up = F.grouped_mm(xs, w_gate_up, offs=offs).chunk(2, dim=-1)
        ys = F.grouped_mm(F.silu(gate) * up, w_down, offs=offs) * w
        t5 = time.perf_counter()
        times["gemm"] = t5 - t4
        routed = torch.zeros_like(flat).index_add_(0, token, ys.to(flat.dtype))
        t6 = time.perf_counter()
        times["scatter"] = t6 - t5
        shared = moe.shared_experts(flat) if moe.shared_experts is not None else torch.zeros_like(flat)
        times["shared"] = time.perf_counter() - t6
        out = routed + shared
        for name, v in times.items():
            best[name] = min(best.get(name, float("inf")), 1e3 * v)
    best["total"] = sum(best.values())
    best["max_abs_diff"] = float((out.view_as(x) - moe(x)).abs().max())
    return best


def moe_param_counts(d_model: int, moe_intermediate_size: int, n_routed_experts: int, n_shared_experts: int,
                     top_k: int) -> dict[str, int]:
    """Parameters of one :class:`DeepSeekMoE` (formula): ``expert`` 3·D·I, ``routed`` E·3·D·I, ``shared``
    3·D·I·S, ``router`` E·D, ``total`` and ``active`` per token (k routed + shared + router).
    Example (D=I=128, E=8, S=1, k=2): expert 49,152, total 443,392, active 148,480."""
    expert = 3 * d_model * moe_intermediate_size
    router = n_routed_experts * d_model
    shared = expert * n_shared_experts
    return {"expert": expert, "routed": n_routed_experts * expert, "shared": shared, "router": router,
            "total": n_routed_experts * expert + shared + router, "active": top_k * expert + shared + router}


# ------------------------------------------------------------------------------------------------
# transformers interop (imported lazily: course check never imports transformers)
# ------------------------------------------------------------------------------------------------

_MOE_KW = ("d_model", "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "top_k", "n_group",
           "topk_group", "routed_scaling_factor", "norm_topk_prob")


def hf_deepseek_moe_config(d_model: int, moe_intermediate_size: int, n_routed_experts: int, n_shared_experts: int,
                           top_k: int, n_group: int = 1, topk_group: int = 1, routed_scaling_factor: float = 1.0,
                           norm_topk_prob: bool = True):
    """A ``transformers.DeepseekV3Config`` whose ``DeepseekV3MoE`` matches ``DeepSeekMoE`` with these arguments."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(hidden_size=d_model, intermediate_size=4 * d_model,
                            moe_intermediate_size=moe_intermediate_size, n_routed_experts=n_routed_experts,
                            n_shared_experts=n_shared_experts, num_experts_per_tok=top_k, n_group=n_group,
                            topk_group=topk_group, routed_scaling_factor=routed_scaling_factor,
                            norm_topk_prob=norm_topk_prob, hidden_act="silu", vocab_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=2)


def random_hf_deepseek_moe(seed: int = 0, std: float = 0.3, bias_std: float = 0.1, **kw):
    """``transformers``' ``DeepseekV3MoE`` for :func:`hf_deepseek_moe_config` ``(**kw)``, every weight
    ``~ N(0, std²)`` and the correction bias ``~ N(0, bias_std²)`` (seeded; eval mode)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = hf_deepseek_moe_config(**kw)
    g = torch.Generator().manual_seed(seed)
    moe = DeepseekV3MoE(cfg)
    with torch.no_grad():
        for _name, p in sorted(moe.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * std)
        moe.gate.e_score_correction_bias.copy_(torch.randn(cfg.n_routed_experts, generator=g) * bias_std)
    return moe.eval()


def moe_state_dict_from_hf(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Convert a ``DeepseekV3MoE`` state dict to :class:`DeepSeekMoE` keys.

    ``transformers`` 5 fuses the experts: ``experts.gate_up_proj`` ``(E, 2I, D)`` (rows ``[:I]`` = ``gate_proj``,
    ``[I:]`` = ``up_proj``) and ``experts.down_proj`` ``(E, D, I)``; older per-expert keys pass through.
    """
    out = {}
    for k, v in sd.items():
        if k == "experts.gate_up_proj":
            i = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"experts.{e}.gate_proj.weight"] = v[e, :i].clone()
                out[f"experts.{e}.up_proj.weight"] = v[e, i:].clone()
        elif k == "experts.down_proj":
            for e in range(v.shape[0]):
                out[f"experts.{e}.down_proj.weight"] = v[e].clone()
        else:
            out[k] = v.clone()
    return out


def load_hf_deepseek_moe(hf_moe) -> DeepSeekMoE:
    """A :class:`DeepSeekMoE` with the configuration and (converted) weights of a ``transformers``
    ``DeepseekV3MoE``; in the same train/eval mode."""
    c = hf_moe.config
    moe = DeepSeekMoE(c.hidden_size, c.moe_intermediate_size, c.n_routed_experts, c.n_shared_experts,
                      c.num_experts_per_tok, c.n_group, c.topk_group, c.routed_scaling_factor, c.norm_topk_prob)
    moe.load_state_dict(moe_state_dict_from_hf(hf_moe.state_dict()))
    return moe.train(hf_moe.training)
