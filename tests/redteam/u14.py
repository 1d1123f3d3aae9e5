"""Red-team answers for unit 14 (DeepSeek mixture-of-experts): written from the released exercise notebook."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "14"


def _route(*edits):
    return edited(U, "deepseek_route", *edits)


def _moe(*edits):
    return edited(U, "DeepSeekMoE", *edits)


_GATHER = "weights = s.gather(1, indices)\n"
_NORM = "weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)"
_MOE_RET = "return out.view_as(x) + self.shared_experts(x)"
_MOE_SPARSE = """out = torch.zeros_like(flat)
        for e in range(self.num_experts):
            token, slot = torch.where(indices == e)
            if token.numel() == 0:
                continue
            y = self.experts[e](flat[token]) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y.to(out.dtype))
"""


ANSWERS = [
    # -- 14.softmax_topk_route ----------------------------------------------------------------------------------
    Answer("14.softmax_topk_route", "weights always renormalised (renormalize ignored)", '''
def softmax_topk_route(logits, k, renormalize=True):
    probs = torch.softmax(logits, dim=-1)
    w, i = probs.topk(k, dim=-1)
    return w / w.sum(-1, keepdim=True), i, probs
''', says=r"renormali|weights|expected"),
    Answer("14.softmax_topk_route", "softmax over the k largest logits only", '''
def softmax_topk_route(logits, k, renormalize=True):
    top, i = logits.topk(k, dim=-1)
    return torch.softmax(top, dim=-1), i, torch.softmax(logits, dim=-1)
''', says=r"renormali|weights|expected"),
    Answer("14.softmax_topk_route", "indices in expert order, not by descending probability", '''
def softmax_topk_route(logits, k, renormalize=True):
    probs = torch.softmax(logits, dim=-1)
    w, i = probs.topk(k, dim=-1)
    i, order = i.sort(dim=-1)
    w = w.gather(-1, order)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, i, probs
''', says=r"descending|order|indices|expected"),
    # -- 14.load_balancing_loss ---------------------------------------------------------------------------------
    Answer("14.load_balancing_loss", "f from the mean probabilities (indices ignored): alpha*E*sum P^2", '''
def load_balancing_loss(probs, indices, num_experts, alpha=0.01):
    P = probs.mean(dim=0)
    return alpha * num_experts * (P * P).sum()
''', says=r"count|assignment|indices|expected|gradient"),
    Answer("14.load_balancing_loss", "f normalised by the number of tokens only (k times too large)", '''
def load_balancing_loss(probs, indices, num_experts, alpha=0.01):
    n = indices.shape[0]
    counts = torch.bincount(indices.reshape(-1), minlength=num_experts).float()
    return alpha * (counts * num_experts / n * probs.mean(dim=0)).sum()
''', says=r"k|normalis|expected|alpha"),
    Answer("14.load_balancing_loss", "counts taken from probs with gradient (soft one-hot times probs)", '''
def load_balancing_loss(probs, indices, num_experts, alpha=0.01):
    n, k = indices.shape
    hit = torch.zeros_like(probs).scatter(1, indices, 1.0)
    f = (hit * (1 + probs - probs.detach())).sum(0) * num_experts / (k * n)
    return alpha * (f * probs.mean(dim=0)).sum()
''', says=r"gradient|count|expected"),
    # -- 14.deepseek_route --------------------------------------------------------------------------------------
    Answer("14.deepseek_route", "excluded experts masked with 0 instead of -inf", _route(('masked_fill(~expert_keep, float("-inf"))', "masked_fill(~expert_keep, 0.0)")),
           bug="B14.group_mask_zero"),
    Answer("14.deepseek_route", "gates normalised over all E sigmoid scores", _route(
        (_NORM, "weights = weights / (s.sum(dim=-1, keepdim=True) + 1e-20)")), bug="B14.norm_over_all_experts", origin="issue 39"),
    Answer("14.deepseek_route", "groups chosen on the unbiased scores", _route(("per_group = sb.view(", "per_group = s.view(")),
           bug="B14.groups_unbiased", origin="issue 39"),
    Answer("14.deepseek_route", "a group's score is the whole group's sum", _route(("per_group.topk(2, dim=-1).values.sum(dim=-1)", "per_group.sum(dim=-1)")),
           bug="B14.group_score_sum", origin="issue 39"),
    Answer("14.deepseek_route", "the bias in the normaliser", _route(
        (_NORM, "weights = weights / ((s + bias.float()).gather(1, indices).sum(dim=-1, keepdim=True) + 1e-20)")),
        bug="B14.norm_with_bias", origin="issue 39"),
    Answer("14.deepseek_route", "weights from the biased scores", _route((_GATHER, "weights = (s + bias.float()).gather(1, indices)\n")),
           says=r"weight|bias|unbiased|expected"),
    # -- 14.update_bias -----------------------------------------------------------------------------------------
    Answer("14.update_bias", "mean load over the experts that got tokens only", '''
@torch.no_grad()
def update_bias(bias, indices, num_experts, gamma=0.001):
    c = torch.bincount(indices.reshape(-1), minlength=num_experts).float()
    return bias.float() + gamma * torch.sign(c[c > 0].mean() - c)
''', says=r"mean|sign|expected|load"),
    Answer("14.update_bias", "updated in place and returned in the bias dtype", '''
@torch.no_grad()
def update_bias(bias, indices, num_experts, gamma=0.001):
    c = torch.bincount(indices.reshape(-1), minlength=num_experts).float()
    bias += (gamma * torch.sign(c.mean() - c)).to(bias.dtype)
    return bias
''', says=r"float32|new|in place|dtype|input"),
    # -- 14.DeepSeekMoE -----------------------------------------------------------------------------------------
    Answer("14.DeepSeekMoE", "every expert run on every token, weights zero where not chosen",
           _moe((_MOE_SPARSE, '''dense = torch.zeros(flat.shape[0], self.num_experts).scatter(1, indices, weights)
        out = sum(dense[:, e:e + 1] * self.experts[e](flat) for e in range(self.num_experts))
''')), says=r"expert|token|called|run"),
    Answer("14.DeepSeekMoE", "shared experts forgotten",
           _moe((_MOE_RET, "return out.view_as(x)")), says=r"shared|expected|differ"),
    Answer("14.DeepSeekMoE", "residual added inside the layer",
           _moe((_MOE_RET, "return x + out.view_as(x) + self.shared_experts(x)")),
           says=r"residual|expected|differ"),
    # -- 14.sequence_balance_loss -------------------------------------------------------------------------------
    Answer("14.sequence_balance_loss", "counts over the whole batch, P per sequence", '''
def sequence_balance_loss(scores, indices, num_experts, alpha=0.0001):
    b, t, k = indices.shape
    counts = torch.bincount(indices.reshape(-1), minlength=num_experts).to(scores.dtype)
    f = counts * num_experts / (k * t * b)
    shares = scores / scores.sum(dim=-1, keepdim=True)
    return alpha * (f * shares.mean(dim=1)).sum(dim=-1).mean()
''', says=r"sequence|batch|collapsed|expected"),
    Answer("14.sequence_balance_loss", "summed over the sequences instead of the mean", '''
def sequence_balance_loss(scores, indices, num_experts, alpha=0.0001):
    b, t, k = indices.shape
    counts = torch.zeros(b, num_experts).scatter_add(1, indices.reshape(b, -1), torch.ones(b, t * k))
    shares = scores / scores.sum(dim=-1, keepdim=True)
    return alpha * (counts * num_experts / (k * t) * shares.mean(dim=1)).sum()
''', says=r"mean|sequence|alpha|expected"),
    Answer("14.sequence_balance_loss", "P from the raw sigmoid scores divided by their mean", '''
def sequence_balance_loss(scores, indices, num_experts, alpha=0.0001):
    b, t, k = indices.shape
    counts = torch.zeros(b, num_experts).scatter_add(1, indices.reshape(b, -1), torch.ones(b, t * k))
    P = scores.mean(dim=1) / scores.mean(dim=(1, 2))[:, None] / num_experts
    return alpha * (counts * num_experts / (k * t) * P).sum(-1).mean()
''', says=r"share|affinit|expected|token"),
]
