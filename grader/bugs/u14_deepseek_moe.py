"""Bug catalog of unit 14 (mixture of experts): one known-wrong implementation per syllabus entry.

Each mutant is the reference (:mod:`llmcourse.models.deepseek_moe`) with exactly one mistake. Detectors (named
by the checks): the bias registered as a Parameter (``bias_parameter``) or stored in bfloat16
(``bias_low_precision``).
"""

from __future__ import annotations

import torch
from torch import nn

from llmcourse.models.deepseek_moe import DeepSeekMoE, expert_counts

from ..core import bug

U = "14"


def _route(router_logits, bias, top_k, n_group, topk_group, routed_scaling_factor=1.0, norm_topk_prob=True, *,
           affinity="sigmoid", bias_on_logits=False, mask_value=float("-inf"), group_score="top2",
           weights_from_biased=False, renorm=True, scale=True, groups_on="biased", normaliser="chosen"):
    """The reference routing with switches for the known mistakes."""
    n, e = router_logits.shape
    logits = router_logits.float()
    if affinity == "softmax":
        scores = torch.softmax(logits, -1)
    else:
        scores = torch.sigmoid(logits)
    choice = torch.sigmoid(logits + bias.float()) if bias_on_logits else scores + bias.float()
    grouped = (scores if groups_on == "unbiased" else choice).view(n, n_group, e // n_group)
    gs = (grouped.max(-1).values if group_score == "max" else grouped.sum(-1) if group_score == "sum" else
          grouped.topk(2, -1).values.sum(-1))
    keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gs.topk(topk_group, -1).indices, True)
    keep = keep.unsqueeze(-1).expand(n, n_group, e // n_group).reshape(n, e)
    choice = choice.masked_fill(~keep, mask_value)
    indices = choice.topk(top_k, -1).indices
    weights = (choice if weights_from_biased else scores).gather(1, indices)
    if norm_topk_prob and renorm:
        total = {"chosen": weights.sum(-1, keepdim=True), "all": scores.sum(-1, keepdim=True),
                 "biased": (scores + bias.float()).gather(1, indices).sum(-1, keepdim=True)}[normaliser]
        weights = weights / (total + 1e-20)
    return (weights * routed_scaling_factor if scale else weights), indices


for _id, _opts, _hint in [
    ("B14.gate_from_biased", dict(weights_from_biased=True),
     "The bias only chooses experts; the gate weights come from the unbiased scores."),
    ("B14.group_mask_zero", dict(mask_value=0.0),
     "Biased scores can be negative: what score does an excluded expert keep, and can it still win the top-k?"),
    ("B14.group_score_max", dict(group_score="max"), "DeepSeek-V3 scores a group by the sum of its two best experts."),
    ("B14.no_renorm", dict(renorm=False), "With norm_topk_prob, divide the selected weights by their sum."),
    ("B14.softmax_for_sigmoid", dict(affinity="softmax"), "DeepSeek-V3 uses sigmoid affinities."),
    ("B14.bias_on_logits", dict(bias_on_logits=True), "Add the bias to the sigmoid scores, not to the logits."),
    ("B14.scaling_missing", dict(scale=False), "Multiply the routed weights by the scaling factor."),
    ("B14.norm_over_all_experts", dict(normaliser="all"),
     "With norm_topk_prob the chosen experts' weights sum to 1: what do you divide them by?"),
    ("B14.norm_with_bias", dict(normaliser="biased"),
     "The bias only chooses experts; it has no part in the weights, their normalisation included."),
    ("B14.groups_unbiased", dict(groups_on="unbiased"),
     "The bias exists to steer the choice: the choice of groups included."),
    ("B14.group_score_sum", dict(group_score="sum"),
     "A group is scored by what it would contribute to a token's top-k, not by all of its experts."),
]:
    def _mutant(*args, _opts=_opts, **kwargs):
        return _route(*args, **kwargs, **_opts)

    bug(_id, f"{U}.deepseek_route", _hint, name="deepseek_route")(_mutant)


# ---------------------------------------------------------------- the auxiliary loss


@bug("B14.aux_no_scale", f"{U}.load_balancing_loss", "Normalise f_i so that a uniform router gives exactly alpha.",
     name="load_balancing_loss")
def load_balancing_loss_fractions(probs, indices, num_experts, alpha=0.01):
    f = expert_counts(indices, num_experts).to(probs.dtype) / indices.numel()
    return alpha * (f * probs.mean(0)).sum()


@bug("B14.aux_no_topk_scale", f"{U}.load_balancing_loss", "Each token makes k assignments: normalise the counts by "
     "k·N/E so that a balanced router gives f_i = 1 for any k.", name="load_balancing_loss")
def load_balancing_loss_no_k(probs, indices, num_experts, alpha=0.01):
    f = expert_counts(indices, num_experts).to(probs.dtype) * num_experts / indices.shape[0]
    return alpha * (f * probs.mean(0)).sum()


# ---------------------------------------------------------------- the sequence-wise loss


def _seq_loss(scores, indices, num_experts, alpha=0.0001, *, batchwise=False, normalise="share", reduce="mean"):
    """The reference sequence-wise loss with switches for the known mistakes."""
    if batchwise:
        scores, indices = scores.reshape(1, -1, scores.shape[-1]), indices.reshape(1, -1, indices.shape[-1])
    b, t, k = indices.shape
    counts = torch.stack([expert_counts(indices[i], num_experts) for i in range(b)]).to(scores.dtype)
    p = {"share": scores / scores.sum(-1, keepdim=True), "raw": scores,
         "softmax": torch.softmax(scores, -1)}[normalise].mean(1)
    per_seq = alpha * (counts * (num_experts / (k * t)) * p).sum(-1)
    return per_seq.sum() if reduce == "sum" else per_seq.mean()


for _id, _opts, _hint in [
    ("B14.seq_loss_batchwise", dict(batchwise=True),
     "Sequence-wise: count f_i and average P_i over each sequence's own tokens, then average the sequences; a batch "
     "can be balanced while every sequence in it is not."),
    ("B14.seq_loss_unnormalised", dict(normalise="raw"),
     "Sigmoid affinities do not sum to 1: use each token's affinities as shares of their sum."),
    ("B14.seq_loss_softmax", dict(normalise="softmax"),
     "Normalise the affinities by their sum per token, not with a softmax (which changes their ratios)."),
    ("B14.seq_loss_summed", dict(reduce="sum"), "Average the per-sequence losses over the batch; do not sum them."),
]:
    def _seq_mutant(*args, _opts=_opts, **kwargs):
        return _seq_loss(*args, **kwargs, **_opts)

    bug(_id, f"{U}.sequence_balance_loss", _hint, name="sequence_balance_loss")(_seq_mutant)


# ---------------------------------------------------------------- the bias update


@bug("B14.bias_sign_flipped", f"{U}.update_bias", "Lower the bias of overloaded experts and raise underloaded ones.",
     name="update_bias")
@torch.no_grad()
def update_bias_flipped(bias, indices, num_experts, gamma=0.001):
    c = expert_counts(indices, num_experts).float()
    return bias.float() + gamma * torch.sign(c - c.mean())


@bug("B14.bias_proportional", f"{U}.update_bias", "The rule uses the sign of the load error: a fixed step gamma.",
     name="update_bias")
@torch.no_grad()
def update_bias_proportional(bias, indices, num_experts, gamma=0.001):
    c = expert_counts(indices, num_experts).float()
    return bias.float() + gamma * (c.mean() - c)


# ---------------------------------------------------------------- the layer


class MoESharedAveraged(DeepSeekMoE):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._s = max(1, self.shared_experts.gate_proj.out_features // self.experts[0].gate_proj.out_features)

    def forward(self, x):
        shared, self.shared_experts = self.shared_experts, None
        try:
            out = super().forward(x)
        finally:
            self.shared_experts = shared
        return out + shared(x) / self._s


class MoEUnweighted(DeepSeekMoE):
    def forward(self, x):
        flat = x.reshape(-1, self.d_model)
        _, _, indices = self.gate(flat)
        if self.training:
            self.last_indices = indices.detach()
        out = torch.zeros_like(flat)
        for e in expert_counts(indices, self.n_routed_experts).nonzero().flatten().tolist():
            token, _ = torch.where(indices == e)
            out.index_add_(0, token, self.experts[e](flat[token]))
        return out.view_as(x) + self.shared_experts(x)


class MoESwitchCapacity(DeepSeekMoE):
    """Switch-style capacity (factor 1.25, served in token order): the assignments beyond it are dropped."""

    def forward(self, x):
        from llmcourse.models.deepseek_moe import capacity_mask

        flat = x.reshape(-1, self.d_model)
        _, weights, indices = self.gate(flat)
        if self.training:
            self.last_indices = indices.detach()
        kept, _ = capacity_mask(indices, self.n_routed_experts, 1.25)
        weights = weights * kept
        out = torch.zeros_like(flat)
        for e in expert_counts(indices, self.n_routed_experts).nonzero().flatten().tolist():
            token, slot = torch.where((indices == e) & kept)
            if token.numel():
                out.index_add_(0, token, self.experts[e](flat[token]) * weights[token, slot].unsqueeze(-1))
        return out.view_as(x) + self.shared_experts(x)


class MoEBiasParameter(DeepSeekMoE):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        b = self.gate.e_score_correction_bias
        del self.gate._buffers["e_score_correction_bias"]
        self.gate.e_score_correction_bias = nn.Parameter(b.clone())

    @torch.no_grad()
    def update_bias(self):
        pass


class MoEBiasLowPrecision(DeepSeekMoE):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate.e_score_correction_bias = self.gate.e_score_correction_bias.bfloat16()


for _id, _cls, _hint, _detect in [
    ("B14.shared_averaged", MoESharedAveraged, "Shared experts are summed (one wide MLP), not averaged.", "mutant"),
    ("B14.unweighted_combine", MoEUnweighted, "Multiply each expert's output by its gate weight.", "mutant"),
    ("B14.capacity_dropping", MoESwitchCapacity, "DeepSeek-V3 drops no assignment, in training or inference.",
     "mutant"),
    ("B14.bias_parameter", MoEBiasParameter,
     "The bias is a buffer updated by the sign rule, outside autograd and the optimizer.", "detector"),
    ("B14.bias_low_precision", MoEBiasLowPrecision,
     "Keep the bias in float32; updates of 1e-3 vanish in bfloat16 near 1.", "detector"),
]:
    bug(_id, f"{U}.DeepSeekMoE", _hint, detect=_detect, name="DeepSeekMoE")(_cls)
