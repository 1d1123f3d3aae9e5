"""Bug catalog of unit 07 (encoder classifier): one known-wrong implementation per syllabus entry.

Each mutant is the reference (``llmcourse.data.sentiment``, ``llmcourse.models.encoder_classifier``,
``llmcourse.train.classification``) with exactly one mistake. ``detect="mutant"`` entries are named
by matching the learner's output on the failing probe; ``detect="detector"`` entries by a property
the check names (padding invariance, ``[SEP]`` present after truncation, repeated evaluations agree,
the loss is a per-example mean).
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F

from llmcourse.data.sentiment import CLS_ID, SEP_ID, UNK_ID
from llmcourse.models.encoder_classifier import EncoderClassifier
from llmcourse.train.classification import accuracy, confusion_matrix

from ..core import bug_group

U = "07"

# ---------------------------------------------------------------- build_compact_vocab


def _vocab_from_zero(token_id_lists, min_freq=1):
    counts = Counter(int(i) for ids in token_id_lists for i in ids)
    kept = sorted(i for i, c in counts.items() if c >= min_freq)
    return {gpt2_id: k for k, gpt2_id in enumerate(kept)}  # collides with [PAD]=0 … [UNK]=3


bug_group("B07.special_collision", f"{U}.build_compact_vocab",
          "Specials are 0–3; GPT-2 ids start at 4 after compaction.", {"build_compact_vocab": _vocab_from_zero})

# ---------------------------------------------------------------- encode_batch


def _encode(texts, enc, vocab, max_len, variant=""):
    pad = 50256 if variant == "pad_eot" else 0
    rows = []
    for text in texts:
        content = [vocab.get(i, UNK_ID) for i in enc.encode(text)]
        if variant == "truncate_drops_sep":
            rows.append(([CLS_ID] + content + [SEP_ID])[:max_len])
        else:
            rows.append([CLS_ID] + content[: max_len - 2] + [SEP_ID])
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = True
    return ids, (~mask if variant == "mask_polarity" else mask)


def _encode_variant(variant):
    def encode_batch(texts, enc, vocab, max_len):
        return _encode(texts, enc, vocab, max_len, variant)
    return encode_batch


bug_group("B07.special_collision", f"{U}.encode_batch",
          "Specials are 0–3 and [PAD] is 0; do not reuse GPT-2 ids such as <|endoftext|> for them.",
          {"encode_batch": _encode_variant("pad_eot")})
bug_group("B07.mask_polarity", f"{U}.encode_batch",
          "Course masks are True where attention is allowed (real tokens).",
          {"encode_batch": _encode_variant("mask_polarity")})
bug_group("B07.truncate_drops_sep", f"{U}.encode_batch",
          "Truncate the content to `max_len−2`, then add `[CLS]`/`[SEP]`.",
          {"encode_batch": _encode_variant("truncate_drops_sep")}, detect="detector")

# ---------------------------------------------------------------- EncoderClassifier


def _classifier_variant(variant: str):
    class Mutant(EncoderClassifier):
        def forward(self, ids, attention_mask):
            mask = attention_mask[:, None, None, :]
            if variant == "mask_polarity":
                mask = ~mask
            h = self.embeddings(ids)
            for layer in self.layers:
                h = layer(h, None if variant == "pad_not_masked" else mask)
            if variant != "no_final_norm":
                h = self.final_norm(h)
            if variant == "pool_last":
                pooled = h[:, -1]
            elif self.pooling == "cls":
                pooled = h[:, 0]
            elif variant == "mean_includes_pad":
                pooled = h.mean(dim=1)
            else:
                keep = attention_mask.unsqueeze(-1).to(h.dtype)
                pooled = (h * keep).sum(1) / keep.sum(1)
            return self.classifier(pooled)

    Mutant.__name__ = Mutant.__qualname__ = f"EncoderClassifier_{variant}"
    Mutant.__module__ = __name__
    return Mutant


for _bug, _variant, _hint, _detect in [
    ("B07.pad_not_masked", "pad_not_masked", "Real tokens must not attend to `[PAD]`: pass the key-padding mask.",
     "detector"),
    ("B07.mask_polarity", "mask_polarity", "Course masks are True where attention is allowed.", "mutant"),
    ("B07.mean_includes_pad", "mean_includes_pad", "Average only over real tokens.", "mutant"),
    ("B07.pool_last", "pool_last", "`[CLS]` sits at position 0.", "mutant"),
    ("B07.no_final_norm", "no_final_norm", "A pre-LN encoder ends with a final LayerNorm.", "mutant"),
]:
    bug_group(_bug, f"{U}.EncoderClassifier", _hint, {"EncoderClassifier": _classifier_variant(_variant)}, _detect)

# ---------------------------------------------------------------- confusion_matrix


def _confusion_transposed(y_true, y_pred, num_classes):
    return confusion_matrix(y_pred, y_true, num_classes)


bug_group("B07.confusion_transposed", f"{U}.confusion_matrix", "Rows are true labels, columns are predictions.",
          {"confusion_matrix": _confusion_transposed})

# ---------------------------------------------------------------- evaluate


def _evaluate(model, loader, variant=""):
    was_training = model.training
    if variant != "eval_train_mode":
        model.eval()
    total, n, trues, preds = 0.0, 0, [], []
    with torch.no_grad():
        for ids, attention_mask, labels in loader:
            logits = model(ids, attention_mask)
            if variant == "summed_loss":
                total += float(F.cross_entropy(logits, labels))  # batch means added up, never divided
            else:
                total += float(F.cross_entropy(logits, labels, reduction="sum"))
            n += len(labels)
            trues.append(labels)
            preds.append(logits.argmax(-1))
    model.train(was_training)
    y_true, y_pred = torch.cat(trues), torch.cat(preds)
    return {"loss": total if variant == "summed_loss" else total / n, "accuracy": accuracy(y_true, y_pred),
            "confusion": confusion_matrix(y_true, y_pred, logits.shape[-1])}


def _evaluate_variant(variant):
    def evaluate(model, loader):
        return _evaluate(model, loader, variant)
    return evaluate


bug_group("B07.eval_train_mode", f"{U}.evaluate", "Call `model.eval()` (and restore the mode afterwards).",
          {"evaluate": _evaluate_variant("eval_train_mode")}, detect="detector")
bug_group("B07.summed_loss", f"{U}.evaluate", "Report the mean loss per example.",
          {"evaluate": _evaluate_variant("summed_loss")}, detect="detector")
