"""Unit 00's red-team answers (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

ANSWERS = [
    # -- 00.split_merge_heads --------------------------------------------------------------------------------
    Answer("00.split_merge_heads", "head count and head width swapped (square case passes)", '''
def split_heads(x, n_heads):
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D} is not divisible by n_heads={n_heads}")
    return x.reshape(B, T, D // n_heads, n_heads).transpose(1, 2)
''', says=r"shape|head"),
    Answer("00.split_merge_heads", "divisibility checked with assert (AssertionError, not ValueError)", '''
def split_heads(x, n_heads):
    B, T, D = x.shape
    assert D % n_heads == 0, "D must be divisible by n_heads"
    return x.reshape(B, T, n_heads, D // n_heads).transpose(1, 2)
''', says=r"ValueError"),
    # -- 00.causal_mask --------------------------------------------------------------------------------------
    Answer("00.causal_mask", "offset = offset or t_k - t_q: an explicit offset=0 is replaced", '''
def causal_mask(t_q, t_k=None, offset=None, device=None):
    t_k = t_k or t_q
    offset = offset or (t_k - t_q)
    i = torch.arange(t_q, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    return j <= offset + i
''', says=r"offset"),
    Answer("00.causal_mask", "device ignored (the mask is always made on the CPU)", '''
def causal_mask(t_q, t_k=None, offset=None, device=None):
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q if offset is None else offset
    return torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=offset)
''', says=r"device"),
    # -- 00.einsum_attention ---------------------------------------------------------------------------------
    Answer("00.einsum_attention", "scores scaled by 1/sqrt(d) although the task says raw q·k", '''
def attention_scores_einsum(q, k):
    return torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
''', says=r"scal|sqrt|√"),
    Answer("00.einsum_attention", "no einsum: broadcast-multiply and sum", '''
def attention_scores_einsum(q, k):
    return (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1)


def attention_output_einsum(weights, v):
    return (weights.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)
''', says=r"einsum"),
    # -- 00.label_smoothed_cross_entropy ---------------------------------------------------------------------
    Answer("00.label_smoothed_cross_entropy", "eps spread over the C - 1 wrong classes", '''
def label_smoothed_cross_entropy(logits, targets, eps=0.0, ignore_index=-100):
    C = logits.shape[-1]
    logp = torch.log_softmax(logits.reshape(-1, C), dim=-1)
    y = targets.reshape(-1)
    keep = y != ignore_index
    logp, y = logp[keep], y[keep]
    nll = -logp.gather(1, y[:, None]).squeeze(1)
    others = (-logp.sum(1) - nll) / (C - 1)
    return ((1 - eps) * nll + eps * others).mean()
''', says=r"eps|smooth|C classes|all"),
    Answer("00.label_smoothed_cross_entropy", "ignore_index hard-coded to -100", '''
def label_smoothed_cross_entropy(logits, targets, eps=0.0, ignore_index=-100):
    C = logits.shape[-1]
    logp = torch.log_softmax(logits.reshape(-1, C), dim=-1)
    y = targets.reshape(-1)
    keep = y != -100
    logp, y = logp[keep], y[keep]
    nll = -logp.gather(1, y[:, None]).squeeze(1)
    return ((1 - eps) * nll + eps / C * (-logp.sum(1))).mean()
''', says=r"ignore_index"),
    Answer("00.label_smoothed_cross_entropy", "log-softmax over axis 1 (the time axis of (B, T, C))", '''
def label_smoothed_cross_entropy(logits, targets, eps=0.0, ignore_index=-100):
    C = logits.shape[-1]
    logp = torch.log_softmax(logits, dim=1).reshape(-1, C)
    y = targets.reshape(-1)
    keep = y != ignore_index
    logp, y = logp[keep], y[keep]
    nll = -logp.gather(1, y[:, None]).squeeze(1)
    return ((1 - eps) * nll + eps / C * (-logp.sum(1))).mean()
''', says=r"."),
    # -- 00.noam_schedule ------------------------------------------------------------------------------------
    Answer("00.noam_schedule", "factor ignored", '''
def make_noam_scheduler(optimizer, d_model, warmup, factor=1.0):
    for group in optimizer.param_groups:
        group["lr"] = 1.0
        group["initial_lr"] = 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: noam_lambda(s + 1, d_model, warmup))
''', says=r"factor"),
    Answer("00.noam_schedule", "only the first param group reset to lr 1", '''
def make_noam_scheduler(optimizer, d_model, warmup, factor=1.0):
    optimizer.param_groups[0]["lr"] = 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: factor * noam_lambda(s + 1, d_model, warmup))
''', says=r"group"),
    Answer("00.noam_schedule", "divides by the optimizer's default lr (wrong for groups with their own lr)", '''
def make_noam_scheduler(optimizer, d_model, warmup, factor=1.0):
    base = optimizer.defaults["lr"]
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: factor * noam_lambda(s + 1, d_model, warmup) / base)
''', says=r"group"),
    # -- 00.ResidualStack ------------------------------------------------------------------------------------
    Answer("00.ResidualStack", "dropout on the sum", '''
class ResidualStack(nn.Module):
    def __init__(self, d_model, n_layers, dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        for layer in self.layers:
            x = self.dropout(x + layer(x))
        return x
''', bug="B00.dropout_on_sum"),
    Answer("00.ResidualStack", "dropout on the branch input", '''
class ResidualStack(nn.Module):
    def __init__(self, d_model, n_layers, dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(self.dropout(x))
        return x
''', bug="B00.dropout_branch_input", origin="issue 37"),
    Answer("00.ResidualStack", "one shared dropout mask for all layers (drawn once)", '''
class ResidualStack(nn.Module):
    def __init__(self, d_model, n_layers, dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        keep = self.dropout(torch.ones_like(x))
        for layer in self.layers:
            x = x + keep * layer(x)
        return x
''', says=r"independent"),
]
