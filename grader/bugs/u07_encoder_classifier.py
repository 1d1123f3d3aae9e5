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
from torch import nn

from llmcourse.data.sentiment import CLS_ID, SEP_ID, UNK_ID
from llmcourse.models.encoder_classifier import BertEmbeddings, EncoderClassifier
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


def _vocab_variant(variant):
    def build_compact_vocab(token_id_lists, min_freq=1):
        if variant == "per_list":
            counts = Counter(int(i) for ids in token_id_lists for i in set(ids))
        else:
            counts = Counter(int(i) for ids in token_id_lists for i in ids)
        if variant == "by_frequency":
            kept = [i for i, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c >= min_freq]
        elif variant == "strict":
            kept = sorted(i for i, c in counts.items() if c > min_freq)
        else:
            kept = sorted(i for i, c in counts.items() if c >= min_freq)
        return {gpt2_id: 4 + k for k, gpt2_id in enumerate(kept)}
    return build_compact_vocab


bug_group("B07.vocab_by_frequency", f"{U}.build_compact_vocab",
          "The numbering must not depend on how often an id occurs: the same ids, counted differently, give the "
          "same table.", {"build_compact_vocab": _vocab_variant("by_frequency")})
bug_group("B07.min_freq_strict", f"{U}.build_compact_vocab", "An id that occurs exactly `min_freq` times is kept.",
          {"build_compact_vocab": _vocab_variant("strict")})
bug_group("B07.min_freq_per_list", f"{U}.build_compact_vocab",
          "min_freq counts every occurrence over all lists, repeats inside one list included.",
          {"build_compact_vocab": _vocab_variant("per_list")})

# ---------------------------------------------------------------- encode_batch


def _encode(texts, enc, vocab, max_len, variant=""):
    pad = 50256 if variant == "pad_eot" else 0
    rows = []
    for text in texts:
        content = [vocab.get(i, UNK_ID) for i in enc.encode(text)]
        if variant == "truncate_drops_sep":
            rows.append(([CLS_ID] + content + [SEP_ID])[:max_len])
        elif variant == "truncate_start":
            rows.append([CLS_ID] + content[max(0, len(content) - (max_len - 2)):] + [SEP_ID])
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
bug_group("B07.truncate_start", f"{U}.encode_batch",
          "What does not fit is the end of the content: a review keeps its first words.",
          {"encode_batch": _encode_variant("truncate_start")})
bug_group("B07.truncate_drops_sep", f"{U}.encode_batch",
          "Truncate the content to `max_len−2`, then add `[CLS]`/`[SEP]`.",
          {"encode_batch": _encode_variant("truncate_drops_sep")}, detect="detector")

# ---------------------------------------------------------------- BertEmbeddings


def _embeddings_variant(variant: str):
    class Mutant(BertEmbeddings):
        def forward(self, ids, segment_ids=None):
            if segment_ids is None:
                segment_ids = torch.zeros_like(ids)
            positions = torch.arange(ids.shape[1], device=ids.device)
            if variant == "positions_from_1":
                positions = (positions + 1) % self.pos.num_embeddings
            x = self.tok(ids) + self.pos(positions) + self.seg(segment_ids)
            if variant == "dropout_before_norm":
                return self.norm(self.dropout(x))
            return self.dropout(x if variant == "no_norm" else self.norm(x))

    Mutant.__name__ = Mutant.__qualname__ = f"BertEmbeddings_{variant}"
    Mutant.__module__ = __name__
    return Mutant


bug_group("B07.positions_from_1", f"{U}.BertEmbeddings", "The first token sits at position 0.",
          {"BertEmbeddings": _embeddings_variant("positions_from_1")})
bug_group("B07.dropout_before_norm", f"{U}.BertEmbeddings",
          "In BERT's embeddings the dropout is the last step: it acts on what the LayerNorm gives.",
          {"BertEmbeddings": _embeddings_variant("dropout_before_norm")}, detect="detector")
bug_group("B07.emb_no_norm", f"{U}.BertEmbeddings",
          "BERT normalises the sum of the three embeddings before anything else sees it.",
          {"BertEmbeddings": _embeddings_variant("no_norm")})

# ---------------------------------------------------------------- EncoderClassifier


def _classifier_variant(variant: str):
    class Mutant(EncoderClassifier):
        def __init__(self, vocab_size, d_model=64, num_heads=4, d_ff=256, n_layers=2, max_len=64, num_classes=2,
                     dropout=0.1, pooling="cls"):
            if variant == "num_classes_ignored":
                num_classes = 2
            super().__init__(vocab_size, d_model, num_heads, d_ff, n_layers, max_len, num_classes, dropout, pooling)
            if variant == "block_dropout_missing":
                for layer in self.layers:
                    for m in layer.modules():
                        if isinstance(m, nn.Dropout):
                            m.p = 0.0

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
    ("B07.num_classes_ignored", "num_classes_ignored", "The classifier has one logit per class: `num_classes` of them.",
     "detector"),
    ("B07.block_dropout_missing", "block_dropout_missing",
     "`dropout` reaches the encoder blocks too (attention weights and sublayer outputs), not only the embeddings.",
     "detector"),
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
    num_classes = 2 if variant == "two_classes" else logits.shape[-1]
    return {"loss": total if variant == "summed_loss" else total / n, "accuracy": accuracy(y_true, y_pred),
            "confusion": confusion_matrix(y_true, y_pred, num_classes)}


def _evaluate_variant(variant):
    def evaluate(model, loader):
        return _evaluate(model, loader, variant)
    return evaluate


bug_group("B07.eval_train_mode", f"{U}.evaluate", "Call `model.eval()` (and restore the mode afterwards).",
          {"evaluate": _evaluate_variant("eval_train_mode")}, detect="detector")
bug_group("B07.eval_two_classes", f"{U}.evaluate",
          "The model says how many classes there are: its logits have one column per class.",
          {"evaluate": _evaluate_variant("two_classes")}, detect="detector")
bug_group("B07.summed_loss", f"{U}.evaluate", "Report the mean loss per example.",
          {"evaluate": _evaluate_variant("summed_loss")}, detect="detector")
