"""Bug catalog of unit 06 (translation Transformer): one known-wrong implementation per graded entry.

Each mutant is the reference with exactly one mistake. Entries recognised by output matching use
``detect="mutant"``; ``B06.greedy_train_mode`` (repeated calls differ on a model with dropout) and
``B06.no_final_norm`` (the ``state_dict`` lacks ``encoder.norm``/``decoder.norm``) are named by detectors
in the checks.

Three catalog entries are not tied to a graded API in the syllabus and live in the lesson instead, as
"spot the bug" cells with visible self-checks: ``B06.pad_in_loss`` (loss averaged over PAD targets),
``B06.noam_base_lr`` (base lr left at 1e-4 under Noam) and ``B06.hindi_word_regex`` (``\\w+`` splitting
Hindi words at vowel signs). Their detectors are tested in ``tests/test_unit06_translation_transformer.py``.
"""

from __future__ import annotations

from collections import Counter

import torch

from ..core import bug_group

U = "06"


# ---------------------------------------------------------------- make_masks


def _src_mask_query_axis(src, pad_id=0):
    return (src != pad_id)[:, None, :, None]          # (B, 1, S, 1): masks queries, not keys


def _src_mask_2d(src, pad_id=0):
    return src != pad_id                               # (B, S): broadcasts against the wrong axes


def _tgt_mask_no_causal(tgt_in, pad_id=0):
    t = tgt_in.shape[1]
    return (tgt_in != pad_id)[:, None, None, :].expand(-1, 1, t, t)


bug_group("B06.src_mask_shape", f"{U}.make_masks", "Key masks broadcast over queries: `(B, 1, 1, S)`.",
          {"make_src_mask": _src_mask_query_axis})
bug_group("B06.src_mask_shape", f"{U}.make_masks", "Key masks broadcast over queries: `(B, 1, 1, S)`.",
          {"make_src_mask": _src_mask_2d})
bug_group("B06.tgt_mask_no_causal", f"{U}.make_masks", "The decoder self-attention must also be causal.",
          {"make_tgt_mask": _tgt_mask_no_causal})


# ---------------------------------------------------------------- make_translation_batch


def _batch_not_shifted(pairs, max_len, pad_id=0, sos_id=1, eos_id=2):
    srcs, tins, touts = [], [], []
    for x, y in pairs:
        x, y = list(x)[:max_len], list(y)[:max_len - 1]
        srcs.append(x)
        tins.append(y + [eos_id])                      # decoder input = target: nothing left to predict
        touts.append(y + [eos_id])

    def pad(rows):
        w = max(len(r) for r in rows)
        return torch.tensor([r + [pad_id] * (w - len(r)) for r in rows], dtype=torch.long)

    return pad(srcs), pad(tins), pad(touts)


bug_group("B06.tgt_not_shifted", f"{U}.make_translation_batch",
          "The decoder input is the target shifted right by SOS.", {"make_translation_batch": _batch_not_shifted})


# ---------------------------------------------------------------- Transformer


def _transformer_without_memory_mask():
    from llmcourse.data.translation import make_src_mask, make_tgt_mask
    from llmcourse.models.transformer import Transformer

    class Transformer(Transformer):  # noqa: F811 - the mutant keeps the reference's name
        def decode(self, tgt_in, memory, src_mask, tgt_mask):
            return self.decoder(self.pos(self.tgt_embed(tgt_in)), memory, None, tgt_mask)

        def forward(self, src, tgt_in):
            src_mask = make_src_mask(src, self.pad_id)
            memory = self.encode(src, src_mask)
            return self.projection(self.decode(tgt_in, memory, src_mask, make_tgt_mask(tgt_in, self.pad_id)))

    Transformer.__module__ = "grader_mutant"
    return Transformer


def _transformer_without_final_norm():
    from llmcourse.models.transformer import Transformer

    class Transformer(Transformer):  # noqa: F811
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.encoder.norm = None
            self.decoder.norm = None

    Transformer.__module__ = "grader_mutant"
    return Transformer


bug_group("B06.memory_mask_missing", f"{U}.Transformer", "Cross-attention must ignore source padding too.",
          {"Transformer": _transformer_without_memory_mask()})
bug_group("B06.no_final_norm", f"{U}.Transformer", "A pre-LN stack ends with a LayerNorm.",
          {"Transformer": _transformer_without_final_norm()}, detect="detector")


# ---------------------------------------------------------------- greedy_translate


def _greedy(model, src, max_len, sos_id=1, eos_id=2, pad_id=0, variant=""):
    from llmcourse.data.translation import make_src_mask, make_tgt_mask

    was_training = model.training
    if variant != "train_mode":
        model.eval()
    with torch.no_grad():
        src_mask = make_src_mask(src, pad_id)
        memory = model.encode(src, src_mask)
        ys = torch.full((src.shape[0], 1), sos_id, dtype=torch.long)
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        for _ in range(max_len):
            nxt = model.projection(model.decode(ys, memory, src_mask, make_tgt_mask(ys, pad_id))[:, -1]).argmax(-1)
            if variant != "no_eos_stop":
                nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            ys = torch.cat([ys, nxt[:, None]], 1)
            done = done | (nxt == eos_id)
            if variant != "no_eos_stop" and bool(done.all()):
                break
    model.train(was_training)
    return ys if variant == "includes_sos" else ys[:, 1:]


def _greedy_variant(variant):
    def greedy_translate(model, src, max_len, sos_id=1, eos_id=2, pad_id=0):
        return _greedy(model, src, max_len, sos_id, eos_id, pad_id, variant)
    return greedy_translate


bug_group("B06.greedy_train_mode", f"{U}.greedy_translate", "Switch to `eval()` (and back) around decoding.",
          {"greedy_translate": _greedy_variant("train_mode")}, detect="detector")
bug_group("B06.greedy_no_eos_stop", f"{U}.greedy_translate", "Stop a row at its first EOS and pad the rest.",
          {"greedy_translate": _greedy_variant("no_eos_stop")})
bug_group("B06.greedy_includes_sos", f"{U}.greedy_translate", "Return only generated tokens.",
          {"greedy_translate": _greedy_variant("includes_sos")})


# ---------------------------------------------------------------- chrf


def _stats(h, r, n, strip=True):
    if strip:
        h, r = "".join(h.split()), "".join(r.split())
    out = []
    for k in range(1, n + 1):
        hg = Counter(h[i:i + k] for i in range(len(h) - k + 1))
        rg = Counter(r[i:i + k] for i in range(len(r) - k + 1))
        out.append((sum(min(c, rg[g]) for g, c in hg.items()), sum(hg.values()), sum(rg.values())))
    return out


def _score(stats, beta):
    ps, rs = [], []
    for m, hc, rc in stats:
        if hc == 0 and rc == 0:
            continue
        ps.append(m / hc if hc else 0.0)
        rs.append(m / rc if rc else 0.0)
    if not ps:
        return 0.0
    p, r = sum(ps) / len(ps), sum(rs) / len(rs)
    return 0.0 if p + r == 0 else 100 * (1 + beta ** 2) * p * r / (beta ** 2 * p + r)


def _chrf_whitespace(hypotheses, references, n=6, beta=2.0):
    total = [[0, 0, 0] for _ in range(n)]
    for h, r in zip(hypotheses, references):
        for k, s in enumerate(_stats(h, r, n, strip=False)):
            total[k] = [a + b for a, b in zip(total[k], s)]
    return _score(total, beta)


def _chrf_sentence_mean(hypotheses, references, n=6, beta=2.0):
    scores = [_score(_stats(h, r, n), beta) for h, r in zip(hypotheses, references)]
    return sum(scores) / len(scores) if scores else 0.0


bug_group("B06.chrf_whitespace", f"{U}.chrf", "chrF ignores whitespace.", {"chrf": _chrf_whitespace})
bug_group("B06.chrf_sentence_mean", f"{U}.chrf", "Sum n-gram statistics over the corpus first.",
          {"chrf": _chrf_sentence_mean})
