"""Red-team answers for unit 14 (DeepSeek mixture-of-experts): written from the released exercise notebook."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "14"
TOP_K = "    weights, indices = probs.topk(k, dim=-1)\n"
RENORM = "    if renormalize:\n        weights = weights / weights.sum(dim=-1, keepdim=True)\n"
COUNTS = "counts = torch.bincount(indices.reshape(-1), minlength=num_experts).to(probs.dtype)"
F = "f = counts * num_experts / (k * n)"
NORM = "weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)"
GATHER = "weights = s.gather(1, indices)"
SIGN = "return bias.float() + gamma * torch.sign(c.mean() - c)"
ROUTED = ("        out = torch.zeros_like(flat)\n        for e in range(self.num_experts):\n"
          "            token, slot = torch.where(indices == e)\n            if token.numel() == 0:\n"
          "                continue\n            y = self.experts[e](flat[token]) * weights[token, slot].unsqueeze(-1)\n"
          "            out = out.index_add(0, token, y.to(out.dtype))\n")
RETURN = "return out.view_as(x) + self.shared_experts(x)"
SEQ_COUNTS = ("    counts = torch.zeros(b, num_experts, dtype=scores.dtype)\n"
              "    counts = counts.scatter_add(1, indices.reshape(b, -1), torch.ones(b, t * k, dtype=scores.dtype))\n")

ANSWERS = [
    # -- 14.softmax_topk_route ----------------------------------------------------------------------------------
    Answer("14.softmax_topk_route", "weights always renormalised (renormalize ignored)", edited(U, "softmax_topk_route",
           ("    if renormalize:\n        weights = ", "    weights = ")), says=r"renormali|weights|expected"),
    Answer("14.softmax_topk_route", "softmax over the k largest logits only", edited(U, "softmax_topk_route",
           (TOP_K + RENORM, "    top, indices = logits.topk(k, dim=-1)\n    weights = torch.softmax(top, dim=-1)\n")),
           says=r"renormali|weights|expected"),
    Answer("14.softmax_topk_route", "indices in expert order, not by descending probability",
           edited(U, "softmax_topk_route", (TOP_K, TOP_K + "    indices, order = indices.sort(dim=-1)\n"
                                                          "    weights = weights.gather(-1, order)\n")),
           says=r"descending|order|indices|expected"),
    # -- 14.load_balancing_loss ---------------------------------------------------------------------------------
    Answer("14.load_balancing_loss", "f from the mean probabilities (indices ignored): alpha*E*sum P^2",
           edited(U, "load_balancing_loss", (F, "f = num_experts * probs.mean(dim=0)")),
           says=r"count|assignment|indices|expected|gradient"),
    Answer("14.load_balancing_loss", "f normalised by the number of tokens only (k times too large)",
           edited(U, "load_balancing_loss", (F, "f = counts * num_experts / n")), says=r"k|normalis|expected|alpha"),
    Answer("14.load_balancing_loss", "counts taken from probs with gradient (soft one-hot times probs)",
           edited(U, "load_balancing_loss", (COUNTS, "hit = torch.zeros_like(probs).scatter(1, indices, 1.0)"),
                  (F, "f = (hit * (1 + probs - probs.detach())).sum(0) * num_experts / (k * n)")),
           says=r"gradient|count|expected"),
    # -- 14.deepseek_route --------------------------------------------------------------------------------------
    Answer("14.deepseek_route", "excluded experts masked with 0 instead of -inf", edited(U, "deepseek_route",
           ('sb.masked_fill(~expert_keep, float("-inf"))', "sb.masked_fill(~expert_keep, 0.0)")),
           bug="B14.group_mask_zero"),
    Answer("14.deepseek_route", "gates normalised over all E sigmoid scores", edited(U, "deepseek_route",
           (NORM, "weights / (s.sum(-1, keepdim=True) + 1e-20)")), bug="B14.norm_over_all_experts", origin="issue 39"),
    Answer("14.deepseek_route", "groups chosen on the unbiased scores", edited(U, "deepseek_route",
           ("per_group = sb.view(", "per_group = s.view(")), bug="B14.groups_unbiased", origin="issue 39"),
    Answer("14.deepseek_route", "a group's score is the whole group's sum", edited(U, "deepseek_route",
           ("per_group.topk(2, dim=-1).values.sum(dim=-1)", "per_group.sum(dim=-1)")), bug="B14.group_score_sum",
           origin="issue 39"),
    Answer("14.deepseek_route", "the bias in the normaliser", edited(U, "deepseek_route",
           (NORM, "weights / ((s + bias.float()).gather(1, indices).sum(dim=-1, keepdim=True) + 1e-20)")),
           bug="B14.norm_with_bias", origin="issue 39"),
    Answer("14.deepseek_route", "weights from the biased scores", edited(U, "deepseek_route",
           (GATHER, "weights = (s + bias.float()).gather(1, indices)")), says=r"weight|bias|unbiased|expected"),
    # -- 14.update_bias -----------------------------------------------------------------------------------------
    Answer("14.update_bias", "mean load over the experts that got tokens only", edited(U, "update_bias",
           ("torch.sign(c.mean() - c)", "torch.sign(c[c > 0].mean() - c)")), says=r"mean|sign|expected|load"),
    Answer("14.update_bias", "updated in place and returned in the bias dtype", edited(U, "update_bias",
           (SIGN, "bias += (gamma * torch.sign(c.mean() - c)).to(bias.dtype)\n    return bias")),
           says=r"float32|new|in place|dtype|input"),
    # -- 14.DeepSeekMoE -----------------------------------------------------------------------------------------
    Answer("14.DeepSeekMoE", "every expert run on every token, weights zero where not chosen", edited(U, "DeepSeekMoE",
           (ROUTED, "        dense = torch.zeros(flat.shape[0], self.num_experts).scatter(1, indices, weights)\n"
                    "        out = sum(dense[:, e:e + 1] * self.experts[e](flat) for e in range(self.num_experts))\n")),
           says=r"expert|token|called|run"),
    Answer("14.DeepSeekMoE", "shared experts forgotten", edited(U, "DeepSeekMoE", (RETURN, "return out.view_as(x)")),
           says=r"shared|expected|differ"),
    Answer("14.DeepSeekMoE", "residual added inside the layer", edited(U, "DeepSeekMoE", (RETURN, "return x + " + RETURN[7:])),
           says=r"residual|expected|differ"),
    # -- 14.sequence_balance_loss -------------------------------------------------------------------------------
    Answer("14.sequence_balance_loss", "counts over the whole batch, P per sequence", edited(U, "sequence_balance_loss",
           (SEQ_COUNTS, "    counts = torch.bincount(indices.reshape(-1), minlength=num_experts).to(scores.dtype)\n"),
           ("/ (k * t)", "/ (k * t * b)")), says=r"sequence|batch|collapsed|expected"),
    Answer("14.sequence_balance_loss", "summed over the sequences instead of the mean", edited(U, "sequence_balance_loss",
           ("return alpha * per_seq.mean()", "return alpha * per_seq.sum()")), says=r"mean|sequence|alpha|expected"),
    Answer("14.sequence_balance_loss", "P from the raw sigmoid scores divided by their mean",
           edited(U, "sequence_balance_loss",
                  ("    shares = scores / scores.sum(dim=-1, keepdim=True)\n",
                   "    P = scores.mean(dim=1) / scores.mean(dim=(1, 2))[:, None] / num_experts\n"),
                  ("shares.mean(dim=1)", "P")), says=r"share|affinit|expected|token"),
]
