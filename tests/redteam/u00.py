"""Unit 00's red-team answers (see tests/redteam/__init__.py)."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "00"
EINSUM = 'torch.einsum("bhqd,bhkd->bhqk", q, k)'
LOOP = ('    for group in optimizer.param_groups:\n        group["lr"] = factor\n'
        '        group["initial_lr"] = factor\n')

ANSWERS = [
    # -- 00.split_merge_heads --------------------------------------------------------------------------------
    Answer("00.split_merge_heads", "head count and head width swapped (square case passes)", edited(U, "split_heads",
           ("x.reshape(b, t, n_heads, d // n_heads)", "x.reshape(b, t, d // n_heads, n_heads)")),
           says=r"shape|head"),
    Answer("00.split_merge_heads", "divisibility checked with assert (AssertionError, not ValueError)",
           edited(U, "split_heads", ('    if d % n_heads != 0:\n        raise ValueError(f"d_model={d} is not divisible '
                                     'by n_heads={n_heads}")\n',
                                     '    assert d % n_heads == 0, "D must be divisible by n_heads"\n')),
           says=r"ValueError"),
    # -- 00.causal_mask --------------------------------------------------------------------------------------
    Answer("00.causal_mask", "offset = offset or t_k - t_q: an explicit offset=0 is replaced", edited(U, "causal_mask",
           ("t_k = t_q if t_k is None else t_k", "t_k = t_k or t_q"),
           ("offset = t_k - t_q if offset is None else offset", "offset = offset or (t_k - t_q)")), says=r"offset"),
    Answer("00.causal_mask", "device ignored (the mask is always made on the CPU)", edited(U, "causal_mask",
           ("dtype=torch.bool, device=device)", "dtype=torch.bool)")), says=r"device"),
    # -- 00.einsum_attention ---------------------------------------------------------------------------------
    Answer("00.einsum_attention", "scores scaled by 1/sqrt(d) although the task says raw q·k",
           edited(U, "attention_scores_einsum", (EINSUM, EINSUM + " / math.sqrt(q.shape[-1])")), says=r"scal|sqrt|√"),
    Answer("00.einsum_attention", "no einsum: broadcast-multiply and sum",
           edited(U, "attention_scores_einsum", (EINSUM,
                                                 "(q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1)")) + "\n\n"
           + edited(U, "attention_output_einsum", ('torch.einsum("bhqk,bhkd->bhqd", weights, v)',
                                                   "(weights.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)")),
           says=r"einsum"),
    # -- 00.label_smoothed_cross_entropy ---------------------------------------------------------------------
    Answer("00.label_smoothed_cross_entropy", "eps spread over the C - 1 wrong classes",
           edited(U, "label_smoothed_cross_entropy", ("uniform = -log_probs.mean(dim=-1)",
                                                      "uniform = (-log_probs.sum(dim=-1) - nll) / (n_classes - 1)")),
           says=r"eps|smooth|C classes|all"),
    Answer("00.label_smoothed_cross_entropy", "ignore_index hard-coded to -100",
           edited(U, "label_smoothed_cross_entropy", ("keep = y != ignore_index", "keep = y != -100")),
           says=r"ignore_index"),
    Answer("00.label_smoothed_cross_entropy", "log-softmax over axis 1 (the time axis of (B, T, C))",
           edited(U, "label_smoothed_cross_entropy", ("logits.reshape(-1, n_classes).log_softmax(dim=-1)",
                                                      "logits.log_softmax(dim=1).reshape(-1, n_classes)")),
           says=r"."),
    # -- 00.noam_schedule ------------------------------------------------------------------------------------
    Answer("00.noam_schedule", "factor ignored", edited(U, "make_noam_scheduler",
           ('group["lr"] = factor', 'group["lr"] = 1.0'), ('group["initial_lr"] = factor', 'group["initial_lr"] = 1.0')),
           says=r"factor"),
    Answer("00.noam_schedule", "only the first param group reset to lr 1", edited(U, "make_noam_scheduler",
           (LOOP, '    optimizer.param_groups[0]["lr"] = 1.0\n'),
           ("lambda e: noam_lambda(", "lambda e: factor * noam_lambda(")), says=r"group"),
    Answer("00.noam_schedule", "divides by the optimizer's default lr (wrong for groups with their own lr)",
           edited(U, "make_noam_scheduler", (LOOP, '    base = optimizer.defaults["lr"]\n'),
                  ("lambda e: noam_lambda(e + 1, d_model, warmup)",
                   "lambda e: factor * noam_lambda(e + 1, d_model, warmup) / base")), says=r"group"),
    # -- 00.ResidualStack ------------------------------------------------------------------------------------
    Answer("00.ResidualStack", "dropout on the sum", edited(U, "ResidualStack",
           ("x = x + self.dropout(layer(x))", "x = self.dropout(x + layer(x))")), bug="B00.dropout_on_sum"),
    Answer("00.ResidualStack", "dropout on the branch input", edited(U, "ResidualStack",
           ("x = x + self.dropout(layer(x))", "x = x + layer(self.dropout(x))")), bug="B00.dropout_branch_input",
           origin="issue 37"),
    Answer("00.ResidualStack", "one shared dropout mask for all layers (drawn once)", edited(U, "ResidualStack",
           ("        for layer in self.layers:\n            x = x + self.dropout(layer(x))\n",
            "        keep = self.dropout(torch.ones_like(x))\n        for layer in self.layers:\n"
            "            x = x + keep * layer(x)\n")), says=r"independent"),
]
