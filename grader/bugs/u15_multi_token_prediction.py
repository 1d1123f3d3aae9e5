"""Bug catalog of unit 15 (multi-token prediction): one known-wrong implementation per syllabus entry.

Each mutant is the reference (:mod:`llmcourse.models.mtp`) with exactly one mistake. Alignment and module
mutants are named by their outputs (``detect="mutant"``); the model mutants by their logits (parallel heads),
by the leakage check (target embedded, block without mask), by the loss formula
(λ not divided by D) or by the state_dict (a head per depth, one norm for both inputs); the unverified drafter
by its tokens.

Not a bug: feeding depth 1 the trunk state **after** the final norm, or chaining the block output before
``post_norm``, is vLLM's DeepSeek-V3 MTP convention; the check accepts it (``tests/test_unit15_*`` proves it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmcourse.models.llama3 import RMSNorm
from llmcourse.models.mtp import MTPLanguageModel, MTPModule

from ..core import bug_group

U = "15"

# ---------------------------------------------------------------- alignment


def _align_leak(x, y, depth):
    return x[:, depth + 1:], y[:, depth:]


def _align_early(x, y, depth):
    return x[:, depth:], y[:, depth - 1:]


def _align_late(x, y, depth):
    return x[:, depth:], y[:, depth + 1:]


for _id, _fn, _hint in [
    ("B15.leak_target_embedding", _align_leak, "Depth k embeds token i+k and predicts token i+k+1."),
    ("B15.targets_early", _align_early, "The depth-k target is k tokens beyond the main target."),
    ("B15.targets_late", _align_late, "Shift the targets by exactly k."),
]:
    bug_group(_id, f"{U}.mtp_alignment", _hint, {"mtp_inputs_and_targets": _fn})

# ---------------------------------------------------------------- MTPModule


class MTPModuleConcatOrder(MTPModule):
    def forward(self, h_prev, emb, cos, sin, mask):
        h = self.eh_proj(torch.cat([self.hnorm(h_prev), self.enorm(emb)], dim=-1))
        return self.post_norm(self.mtp_block(h, cos, sin, mask))


class MTPModuleSharedNorm(nn.Module):
    def __init__(self, d_model, block, rms_norm_eps=1e-5):
        super().__init__()
        self.norm = RMSNorm(d_model, rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.mtp_block = block
        self.post_norm = RMSNorm(d_model, rms_norm_eps)

    def forward(self, h_prev, emb, cos, sin, mask):
        h = self.eh_proj(torch.cat([self.norm(emb), self.norm(h_prev)], dim=-1))
        return self.post_norm(self.mtp_block(h, cos, sin, mask))


bug_group("B15.concat_order", f"{U}.MTPModule", "This course (and released checkpoints) put the embedding first.",
          {"MTPModule": MTPModuleConcatOrder})
bug_group("B15.shared_norm", f"{U}.MTPModule", "Use separate `enorm` and `hnorm`.",
          {"MTPModule": MTPModuleSharedNorm}, detect="detector")

# ---------------------------------------------------------------- MTPLanguageModel


class _MTPModel(MTPLanguageModel):
    """The reference forward with switchable mistakes."""

    variant = "ok"

    def forward(self, x, y):
        t = x.shape[1]
        m = self.model
        h0 = self.trunk(x)
        logits = m.lm_head(m.norm(h0))
        loss_main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        start = h0
        h_prev, mtp_logits, loss_mtp = start, [], []
        for k in range(1, self.mtp_depth + 1):
            e, tgt = x[:, k:], y[:, k:]
            if self.variant == "leak":
                e = y[:, k:]                     # the token it must predict
            src = start if self.variant == "parallel" else h_prev
            cos, sin = m.rope_cos[k:t], m.rope_sin[k:t]
            mask = None if self.variant == "no_mask" else m.causal[:t - k, :t - k]
            if self.variant == "leaky_mask":
                mask = torch.ones(t - k, t - k, dtype=torch.bool).tril(diagonal=1)
            prev = src[:, 1:t - k + 1] if self.variant == "h0_shifted" and k == 1 else src[:, :t - k]
            h_k = self.mtp[k - 1](prev, m.embed_tokens(e), cos, sin, mask)
            head = self.heads[k - 1] if self.variant == "own_head" else m.lm_head
            lg = head(h_k)
            mtp_logits.append(lg)
            loss_mtp.append(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1)))
            h_prev = h_k
        w = self.mtp_lambda if self.variant == "lambda" else self.mtp_lambda / max(self.mtp_depth, 1)
        loss = loss_main + w * torch.stack(loss_mtp).sum() if loss_mtp else loss_main
        return {"logits": logits, "mtp_logits": mtp_logits, "loss_main": loss_main, "loss_mtp": loss_mtp,
                "loss": loss}


class _OwnHead(_MTPModel):
    variant = "own_head"

    def __init__(self, cfg, mtp_depth=1, mtp_lambda=0.3):
        super().__init__(cfg, mtp_depth, mtp_lambda)
        for k in range(mtp_depth):   # a new output head per depth
            self.mtp[k].head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    @property
    def heads(self):
        return [mod.head for mod in self.mtp]


for _id, _variant, _hint, _detect in [
    ("B15.leak_target_embedding", "leak", "Depth k embeds token i+k and predicts token i+k+1.", "detector"),
    ("B15.parallel_heads", "parallel", "Depth k reads the output of depth k−1 (sequential chain).", "mutant"),
    ("B15.h0_shifted", "h0_shifted", "At position i, depth 1 combines the trunk's state at i with the embedding of "
     "token i+1: which positions' states go with which tokens?", "mutant"),
    ("B15.lambda_not_divided", "lambda", "Average over depths: λ/D.", "detector"),
    ("B15.block_not_causal", "no_mask", "Every depth attends causally over the full sequence.", "detector"),
    ("B15.leaky_mask", "leaky_mask", "The block of every depth is causal like the trunk: "
     "a position never reads a later row.", "detector"),
]:
    _cls = type(f"MTPLanguageModel_{_variant}", (_MTPModel,), {"variant": _variant})
    bug_group(_id, f"{U}.MTPLanguageModel", _hint, {"MTPLanguageModel": _cls}, detect=_detect)
bug_group("B15.own_head", f"{U}.MTPLanguageModel", "MTP modules share the main embedding and output head.",
          {"MTPLanguageModel": _OwnHead}, detect="detector")

# ---------------------------------------------------------------- speculative_generate


@torch.no_grad()
def _spec_unverified(model, idx, max_new_tokens):
    model.eval()
    seq, drafts = idx, 0
    h0 = model.trunk(seq)
    nxt = model.model.lm_head(model.model.norm(h0[:, -1:])).argmax(-1)
    n = 0
    while n < max_new_tokens:
        seq = torch.cat([seq, nxt], dim=1)
        n += 1
        if n == max_new_tokens:
            break
        draft = model.model.lm_head(model.mtp_hidden(1, h0, seq[:, 1:])[:, -1:]).argmax(-1)
        drafts += 1
        seq = torch.cat([seq, draft], dim=1)   # accepted without looking at the main model's prediction
        n += 1
        h0 = model.trunk(seq)
        nxt = model.model.lm_head(model.model.norm(h0[:, -1:])).argmax(-1)
    return seq, 1.0 if drafts else 0.0


bug_group("B15.spec_unverified", f"{U}.speculative_generate",
          "A draft is accepted only if it equals the main model's own prediction.",
          {"speculative_generate": _spec_unverified})
