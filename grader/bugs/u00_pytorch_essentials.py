"""Bug catalog of unit 00 (PyTorch essentials): one known-wrong implementation per syllabus entry.

Each mutant is the reference with exactly one mistake. Exercises with two names
(``00.split_merge_heads``, ``00.einsum_attention``, ``00.noam_schedule``) register both names through
:func:`bug_group`, the correct one being a local copy of the reference (the grader refuses objects
imported from ``llmcourse`` as learner code). ``detect="mutant"`` entries are recognised by matching
the learner's output (or raised error) on the failing probe; ``detect="detector"`` entries by a
property that the check names explicitly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import bug, bug_group

U = "00"

# ---------------------------------------------------------------- split_heads / merge_heads


def _split_heads(x, n_heads):
    b, t, d = x.shape
    if d % n_heads != 0:
        raise ValueError(f"d_model={d} is not divisible by n_heads={n_heads}")
    return x.reshape(b, t, n_heads, d // n_heads).transpose(1, 2)


def _merge_heads(x):
    b, h, t, hd = x.shape
    return x.transpose(1, 2).contiguous().view(b, t, h * hd)


def _merge_view_after_transpose(x):
    b, h, t, hd = x.shape
    return x.transpose(1, 2).view(b, t, h * hd)


def _merge_without_transpose(x):
    b, h, t, hd = x.shape
    return x.reshape(b, t, h * hd)


def _split_direct_view(x, n_heads):
    b, t, d = x.shape
    if d % n_heads != 0:
        raise ValueError(f"d_model={d} is not divisible by n_heads={n_heads}")
    return x.view(b, n_heads, t, d // n_heads)


bug_group("B00.view_after_transpose", f"{U}.split_merge_heads",
          "After `transpose`, call `.contiguous()` before `.view`, or use `.reshape`.",
          {"split_heads": _split_heads, "merge_heads": _merge_view_after_transpose})
bug_group("B00.merge_without_transpose", f"{U}.split_merge_heads",
          "Move the head axis back next to `head_dim` (`transpose(1, 2)`) before merging.",
          {"split_heads": _split_heads, "merge_heads": _merge_without_transpose})
bug_group("B00.split_direct_view", f"{U}.split_merge_heads",
          "View as `(B, T, H, hd)` first, then swap T and H.",
          {"split_heads": _split_direct_view, "merge_heads": _merge_heads})

# ---------------------------------------------------------------- causal_mask


def _mask(variant):
    def causal_mask(t_q, t_k=None, offset=None, device=None):
        t_k = t_q if t_k is None else t_k
        offset = t_k - t_q if offset is None else offset
        ones = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
        if variant == "polarity":
            return ones.triu(offset + 1)          # True = blocked
        if variant == "diagonal":
            return ones.tril(offset - 1)          # a token may not see itself
        if variant == "top_left":
            return ones.tril(0)                   # offset ignored
        raise AssertionError(variant)

    return causal_mask


bug_group("B00.mask_polarity", f"{U}.causal_mask", "Course masks are True where attention is allowed.",
          {"causal_mask": _mask("polarity")}, detect="detector")
bug_group("B00.mask_diagonal", f"{U}.causal_mask", "A token may always attend to itself.",
          {"causal_mask": _mask("diagonal")}, detect="detector")
bug_group("B00.mask_top_left", f"{U}.causal_mask",
          "Queries are the *last* `t_q` positions; shift the diagonal by `t_k − t_q`.",
          {"causal_mask": _mask("top_left")})

# ---------------------------------------------------------------- einsum attention


def _scores_einsum(q, k):
    return torch.einsum("bhqd,bhkd->bhqk", q, k)


def _output_einsum_v_index(weights, v):
    return torch.einsum("bhqk,bhvd->bhqd", weights, v)


bug_group("B00.einsum_v_index", f"{U}.einsum_attention",
          "The index summed over in weights and values must be the same letter.",
          {"attention_scores_einsum": _scores_einsum, "attention_output_einsum": _output_einsum_v_index})

# ---------------------------------------------------------------- label_smoothed_cross_entropy


def _lsce(variant):
    def label_smoothed_cross_entropy(logits, targets, eps=0.0, ignore_index=-100):
        c = logits.shape[-1]
        z = logits.reshape(-1, c)
        if variant == "ce_on_probs":
            z = z.softmax(-1)                      # probabilities fed to a loss that expects logits
        logp = z.log_softmax(-1)
        y = targets.reshape(-1)
        keep = y != ignore_index
        safe = torch.where(keep, y, torch.zeros_like(y))
        nll = -logp.gather(1, safe[:, None]).squeeze(1)
        if variant == "excludes_target":           # ε over the C−1 wrong classes only
            others = (-logp).sum(-1) - nll
            per = (1 - eps) * nll + eps / (c - 1) * others
        else:
            per = (1 - eps) * nll + eps * (-logp).mean(-1)
        per = torch.where(keep, per, torch.zeros_like(per))
        if variant == "mean_includes_ignored":
            return per.sum() / y.numel()
        return per.sum() / keep.sum()

    return label_smoothed_cross_entropy


bug_group("B00.ls_excludes_target", f"{U}.label_smoothed_cross_entropy",
          "PyTorch spreads ε uniformly over all C classes, including the target.",
          {"label_smoothed_cross_entropy": _lsce("excludes_target")})
bug_group("B00.ls_mean_includes_ignored", f"{U}.label_smoothed_cross_entropy",
          "Divide by the number of non-ignored targets.",
          {"label_smoothed_cross_entropy": _lsce("mean_includes_ignored")})
bug_group("B00.ce_on_probs", f"{U}.label_smoothed_cross_entropy", "Cross-entropy expects raw logits.",
          {"label_smoothed_cross_entropy": _lsce("ce_on_probs")})

# ---------------------------------------------------------------- Noam schedule


def _noam_lambda(step, d_model, warmup):
    s = max(step, 1)
    return d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)


def _scheduler_keeps_base_lr(optimizer, d_model, warmup, factor=1.0):
    # the optimizer keeps whatever lr it was built with (e.g. 1e-4)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: _noam_lambda(e + 1, d_model, warmup))


def _scheduler_off_by_one(optimizer, d_model, warmup, factor=1.0):
    for group in optimizer.param_groups:
        group["lr"] = factor
        group["initial_lr"] = factor
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: _noam_lambda(e, d_model, warmup))


bug_group("B00.noam_base_lr", f"{U}.noam_schedule",
          "Build the optimizer with lr=1e-4, attach your scheduler and print the lr of the first steps: what "
          "does LambdaLR multiply your lambda by?",
          {"noam_lambda": _noam_lambda, "make_noam_scheduler": _scheduler_keeps_base_lr}, detect="detector")
bug_group("B00.noam_off_by_one", f"{U}.noam_schedule",
          "Record the values your lambda is called with and the lr of optimizer steps 1 and 2: which λ(n) does "
          "each step use?",
          {"noam_lambda": _noam_lambda, "make_noam_scheduler": _scheduler_off_by_one})

# ---------------------------------------------------------------- ResidualStack


@bug("B00.plain_list", f"{U}.ResidualStack", "Use `nn.ModuleList` so layers are registered.",
     detect="detector", name="ResidualStack")
class ResidualStackPlainList(nn.Module):
    def __init__(self, d_model, n_layers, dropout=0.0):
        super().__init__()
        self.layers = [nn.Linear(d_model, d_model) for _ in range(n_layers)]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        for layer in self.layers:
            x = x + self.dropout(layer(x))
        return x


@bug("B00.dropout_in_eval", f"{U}.ResidualStack", "Functional dropout needs `training=self.training`.",
     detect="detector", name="ResidualStack")
class ResidualStackFunctionalDropout(nn.Module):
    def __init__(self, d_model, n_layers, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        for layer in self.layers:
            x = x + F.dropout(layer(x), self.p)   # training=True by default, also after .eval()
        return x


@bug("B00.dropout_branch_input", f"{U}.ResidualStack",
     "Look at what dropout must act on: with a constant branch, does out − x ever lose an entry?",
     detect="detector", name="ResidualStack")
class ResidualStackDropoutOnInput(nn.Module):
    def __init__(self, d_model, n_layers, dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(self.dropout(x))   # dropout on what the branch reads, not on what it adds
        return x


@bug("B00.dropout_on_sum", f"{U}.ResidualStack",
     "In train mode, out − x should be 0 or the branch scaled by 1/(1−p): compare the values you get.",
     detect="detector", name="ResidualStack")
class ResidualStackDropoutOnSum(nn.Module):
    def __init__(self, d_model, n_layers, dropout=0.0):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        for layer in self.layers:
            x = self.dropout(x + layer(x))   # the residual path is dropped too
        return x
