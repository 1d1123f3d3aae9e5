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


def _src_mask_pad0(src, pad_id=0):
    return (src != 0)[:, None, None, :]


def _tgt_mask_pad0(tgt_in, pad_id=0):
    from llmcourse.nn.masks import causal_mask

    return (tgt_in != 0)[:, None, None, :] & causal_mask(tgt_in.shape[1])


def _tgt_mask_query_padding(tgt_in, pad_id=0):
    from llmcourse.nn.masks import causal_mask

    keys = (tgt_in != pad_id)[:, None, None, :]
    return keys & keys.transpose(-1, -2) & causal_mask(tgt_in.shape[1])


bug_group("B06.pad_id_ignored", f"{U}.make_masks", "Padding is whatever `pad_id` says, not always 0.",
          {"make_src_mask": _src_mask_pad0})
bug_group("B06.pad_id_ignored", f"{U}.make_masks", "Padding is whatever `pad_id` says, not always 0.",
          {"make_tgt_mask": _tgt_mask_pad0})
bug_group("B06.tgt_mask_empty_rows", f"{U}.make_masks",
          "The target mask hides padded *keys*; a row whose every key is hidden has a softmax over nothing.",
          {"make_tgt_mask": _tgt_mask_query_padding})


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


def _batch_left_padded(pairs, max_len, pad_id=0, sos_id=1, eos_id=2):
    srcs, tins, touts = [], [], []
    for x, y in pairs:
        x, y = list(x)[:max_len], list(y)[:max_len - 1]
        srcs.append(x)
        tins.append([sos_id] + y)
        touts.append(y + [eos_id])

    def pad(rows):
        w = max(len(r) for r in rows)
        return torch.tensor([[pad_id] * (w - len(r)) + r for r in rows], dtype=torch.long)

    return pad(srcs), pad(tins), pad(touts)


bug_group("B06.left_padding", f"{U}.make_translation_batch",
          "The masks and the positions assume every row starts at position 0.",
          {"make_translation_batch": _batch_left_padded})


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


def _transformer_variant(variant):
    from llmcourse.data.translation import make_src_mask, make_tgt_mask
    from llmcourse.models.transformer import Transformer

    class Transformer(Transformer):  # noqa: F811
        def __init__(self, *args, **kwargs):
            if variant == "dropout_ignored":
                kwargs["dropout"] = 0.1
            super().__init__(*args, **kwargs)

        def encode(self, src, src_mask):
            if variant != "encoder_norm_unused":
                return super().encode(src, src_mask)
            x = self.pos(self.src_embed(src))
            for layer in self.encoder.layers:
                x = layer(x, src_mask)
            return x

        def decode(self, tgt_in, memory, src_mask, tgt_mask):
            if variant != "decoder_norm_unused":
                return super().decode(tgt_in, memory, src_mask, tgt_mask)
            x = self.pos(self.tgt_embed(tgt_in))
            for layer in self.decoder.layers:
                x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=src_mask)
            return x

        def forward(self, src, tgt_in):
            pad = 0 if variant == "pad_id_ignored" else self.pad_id
            src_mask = make_src_mask(src, pad)
            memory = self.encode(src, None if variant == "encoder_mask_missing" else src_mask)
            return self.projection(self.decode(tgt_in, memory, src_mask, make_tgt_mask(tgt_in, pad)))

    Transformer.__module__ = "grader_mutant"
    return Transformer


bug_group("B06.encoder_mask_missing", f"{U}.Transformer",
          "The encoder's self-attention must ignore source padding too: real source tokens never attend to PAD.",
          {"Transformer": _transformer_variant("encoder_mask_missing")})
bug_group("B06.pad_id_ignored", f"{U}.Transformer", "Padding is whatever `self.pad_id` says, not always 0.",
          {"Transformer": _transformer_variant("pad_id_ignored")})
bug_group("B06.dropout_ignored", f"{U}.Transformer",
          "Every dropout of the model (embeddings, attention weights, sublayer outputs) uses the `dropout` given.",
          {"Transformer": _transformer_variant("dropout_ignored")}, detect="detector")
bug_group("B06.memory_mask_missing", f"{U}.Transformer", "Cross-attention must ignore source padding too.",
          {"Transformer": _transformer_without_memory_mask()})
bug_group("B06.no_final_norm", f"{U}.Transformer", "A pre-LN stack ends with a LayerNorm.",
          {"Transformer": _transformer_without_final_norm()}, detect="detector")
for _v in ("encoder_norm_unused", "decoder_norm_unused"):  # the norm is built but never applied
    bug_group("B06.no_final_norm", f"{U}.Transformer", "A pre-LN stack ends with a LayerNorm.",
              {"Transformer": _transformer_variant(_v)})


# ---------------------------------------------------------------- greedy_translate


def _greedy(model, src, max_len, sos_id=1, eos_id=2, pad_id=0, variant=""):
    from llmcourse.data.translation import make_src_mask, make_tgt_mask

    if variant == "ids_hard_coded":
        sos_id, eos_id, pad_id = 1, 2, 0
    was_training = model.training
    if variant != "train_mode":
        model.eval()
    with torch.no_grad():
        src_mask = make_src_mask(src, pad_id)
        memory = model.encode(src, src_mask)
        ys = torch.full((src.shape[0], 1), sos_id, dtype=torch.long)
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        for _ in range(max_len):
            if variant == "reencodes":
                memory = model.encode(src, src_mask)
            nxt = model.projection(model.decode(ys, memory, src_mask, make_tgt_mask(ys, pad_id))[:, -1]).argmax(-1)
            if variant != "no_eos_stop":
                nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            ys = torch.cat([ys, nxt[:, None]], 1)
            done = done | (nxt == eos_id)
            if variant != "no_eos_stop" and bool(done.all()):
                break
    if variant != "mode_not_restored":
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
bug_group("B06.greedy_mode_not_restored", f"{U}.greedy_translate",
          "Decoding must not change the caller's model: leave it in the mode it was in.",
          {"greedy_translate": _greedy_variant("mode_not_restored")}, detect="detector")
bug_group("B06.greedy_ids_hard_coded", f"{U}.greedy_translate",
          "Start, stop and pad with the ids the caller passes (`sos_id`, `eos_id`, `pad_id`).",
          {"greedy_translate": _greedy_variant("ids_hard_coded")})
bug_group("B06.greedy_reencodes", f"{U}.greedy_translate",
          "The source does not change while decoding: its memory is computed once.",
          {"greedy_translate": _greedy_variant("reencodes")}, detect="detector")


# ---------------------------------------------------------------- chrf


def _stats(h, r, n, strip=True, clip=True):
    if strip:
        h, r = "".join(h.split()), "".join(r.split())
    out = []
    for k in range(1, n + 1):
        hg = Counter(h[i:i + k] for i in range(len(h) - k + 1))
        rg = Counter(r[i:i + k] for i in range(len(r) - k + 1))
        matches = sum(min(c, rg[g]) if clip else (c if g in rg else 0) for g, c in hg.items())
        out.append((matches, sum(hg.values()), sum(rg.values())))
    return out


def _score(stats, beta, skip_empty=True):
    ps, rs = [], []
    for m, hc, rc in stats:
        if hc == 0 and rc == 0 and skip_empty:
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


def _chrf_corpus(hypotheses, references, n=6, beta=2.0, clip=True, skip_empty=True):
    total = [[0, 0, 0] for _ in range(n)]
    for h, r in zip(hypotheses, references):
        for k, st in enumerate(_stats(h, r, n, clip=clip)):
            total[k] = [a + b for a, b in zip(total[k], st)]
    return _score(total, beta, skip_empty=skip_empty)


def _chrf_unclipped(hypotheses, references, n=6, beta=2.0):
    return _chrf_corpus(hypotheses, references, n, beta, clip=False)


def _chrf_empty_orders(hypotheses, references, n=6, beta=2.0):
    return _chrf_corpus(hypotheses, references, n, beta, skip_empty=False)


bug_group("B06.chrf_unclipped", f"{U}.chrf",
          "A hypothesis n-gram can match at most as many times as the reference holds it.",
          {"chrf": _chrf_unclipped})
bug_group("B06.chrf_empty_orders", f"{U}.chrf",
          "An order with no n-gram on either side (strings shorter than n) says nothing: leave it out of the means.",
          {"chrf": _chrf_empty_orders})
