"""Unit 07 (a BERT-style encoder classifier): wrong and lazy answers the hidden checks must withstand."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "07"
C = "EncoderClassifier"

ANSWERS = [
    # -- 07.build_compact_vocab ---------------------------------------------------------------------------------
    Answer("07.build_compact_vocab", "ids ordered by frequency", edited(U, "build_compact_vocab",
           ("kept = sorted(i for i, c in counts.items() if c >= min_freq)",
            "kept = [i for i, c in counts.most_common() if c >= min_freq]")), bug="B07.vocab_by_frequency"),
    Answer("07.build_compact_vocab", "min_freq compared with >", edited(U, "build_compact_vocab",
           ("c >= min_freq", "c > min_freq")), says=r"min_freq"),
    Answer("07.build_compact_vocab", "new ids from 0 (colliding with the specials)", edited(U, "build_compact_vocab",
           ("4 + k", "k")), says=r"special|4"),
    Answer("07.build_compact_vocab", "counts per list (document frequency)", edited(U, "build_compact_vocab",
           ("Counter(i for ids in token_id_lists for i in ids)", "Counter(i for ids in token_id_lists for i in set(ids))")),
           says=r"min_freq|count"),
    # -- 07.encode_batch ----------------------------------------------------------------------------------------
    Answer("07.encode_batch", "[SEP] cut off by truncation", edited(U, "encode_batch",
           ("        content = [vocab.get(i, 3) for i in enc.encode(text)][: max_len - 2]\n"
            "        rows.append([1] + content + [2])\n",
            "        content = [vocab.get(i, 3) for i in enc.encode(text)]\n"
            "        rows.append(([1] + content + [2])[:max_len])\n")), says=r"SEP"),
    Answer("07.encode_batch", "the start of the content dropped instead of the end", edited(U, "encode_batch",
           ("[vocab.get(i, 3) for i in enc.encode(text)][: max_len - 2]",
            "[vocab.get(i, 3) for i in enc.encode(text)][-(max_len - 2):]")), says=r"end|truncat"),
    Answer("07.encode_batch", "every batch padded to max_len", edited(U, "encode_batch",
           ("length = max(len(row) for row in rows)", "length = max_len")), says=r"longest|length|shape"),
    Answer("07.encode_batch", "attention mask as long 0/1", edited(U, "encode_batch",
           ("mask = torch.zeros(len(rows), length, dtype=torch.bool)", "mask = torch.zeros(len(rows), length, dtype=torch.long)"),
           ("mask[b, : len(row)] = True", "mask[b, : len(row)] = 1")), says=r"bool"),
    # -- 07.BertEmbeddings --------------------------------------------------------------------------------------
    Answer("07.BertEmbeddings", "dropout before the LayerNorm", edited(U, "BertEmbeddings",
           ("self.dropout(self.norm(self.tok(ids) + self.pos(positions) + self.seg(segment_ids)))",
            "self.norm(self.dropout(self.tok(ids) + self.pos(positions) + self.seg(segment_ids)))")),
           says=r"dropout"),
    Answer("07.BertEmbeddings", "segment_ids ignored", edited(U, "BertEmbeddings",
           ("        if segment_ids is None:\n            segment_ids = torch.zeros_like(ids)\n",
            "        segment_ids = torch.zeros_like(ids)\n")), says=r"segment"),
    Answer("07.BertEmbeddings", "positions from 1", edited(U, "BertEmbeddings",
           ("torch.arange(ids.shape[1], device=ids.device)", "torch.arange(1, ids.shape[1] + 1, device=ids.device) % self.pos.num_embeddings")),
           says=r"position"),
    Answer("07.BertEmbeddings", "no LayerNorm on the sum (norm built, not applied)", edited(U, "BertEmbeddings",
           ("self.dropout(self.norm(self.tok(ids) + self.pos(positions) + self.seg(segment_ids)))",
            "self.dropout(self.tok(ids) + self.pos(positions) + self.seg(segment_ids))")), says=r"norm"),
    # -- 07.EncoderClassifier -----------------------------------------------------------------------------------
    Answer("07.EncoderClassifier", "mask as a query mask (B, 1, L, 1)", edited(U, C,
           ("mask = attention_mask[:, None, None, :]", "mask = attention_mask[:, None, :, None]")),
           says=r"pad|mask"),
    Answer("07.EncoderClassifier", "mean pooling over padding too", edited(U, C,
           ("            keep = attention_mask.unsqueeze(-1).float()\n            pooled = (h * keep).sum(1) / keep.sum(1)\n",
            "            pooled = h.mean(1)\n")), says=r"mean|pad"),
    Answer("07.EncoderClassifier", "pooling argument ignored (always [CLS])", edited(U, C,
           ('        if self.pooling == "cls":\n', "        if True:\n")), says=r"pool|mean"),
    Answer("07.EncoderClassifier", "final norm after mean pooling", edited(U, C,
           ("        h = self.final_norm(h)\n", ""),
           ("        return self.classifier(pooled)\n", "        return self.classifier(self.final_norm(pooled))\n")),
           says=r"norm|mean"),
    Answer("07.EncoderClassifier", "num_classes ignored (2 hard-coded)", edited(U, C,
           ("nn.Linear(d_model, num_classes)", "nn.Linear(d_model, 2)")), says=r"num_classes|class"),
    Answer("07.EncoderClassifier", "dropout not passed to the blocks", edited(U, C,
           ('EncoderBlock(d_model, num_heads, d_ff, dropout, norm_first=True, activation="gelu")',
            'EncoderBlock(d_model, num_heads, d_ff, norm_first=True, activation="gelu")')), says=r"dropout"),
    # -- 07.confusion_matrix ------------------------------------------------------------------------------------
    Answer("07.confusion_matrix", "rows are predictions", edited(U, "confusion_matrix",
           ("cm[t, p] += 1", "cm[p, t] += 1")), says=r"rows|true"),
    Answer("07.confusion_matrix", "accuracy returned as a tensor", edited(U, "accuracy",
           ("(y_true == y_pred).float().mean().item()", "(y_true == y_pred).float().mean()")), says=r"float"),
    Answer("07.confusion_matrix", "num_classes ignored (size from the labels seen)", edited(U, "confusion_matrix",
           ("cm = torch.zeros(num_classes, num_classes, dtype=torch.long)",
            "k = int(max(y_true.max(), y_pred.max())) + 1\n    cm = torch.zeros(k, k, dtype=torch.long)")),
           says=r"num_classes|shape"),
    # -- 07.evaluate --------------------------------------------------------------------------------------------
    Answer("07.evaluate", "two classes hard-coded", edited(U, "evaluate",
           ("        num_classes = logits.shape[-1]\n", "")), origin="issue 37", says=r"class"),
    Answer("07.evaluate", "mean of batch means", edited(U, "evaluate",
           ('total += F.cross_entropy(logits, labels, reduction="sum").item()', "total += F.cross_entropy(logits, labels).item()"),
           ("n += len(labels)", "n += 1")), says=r"per example|mean|average"),
    Answer("07.evaluate", "the model left in eval mode", edited(U, "evaluate",
           ("    model.train(was_training)\n", "")), says=r"mode|train"),
    Answer("07.evaluate", "train() afterwards whatever the mode was", edited(U, "evaluate",
           ("    model.train(was_training)\n", "    model.train()\n")), says=r"mode|eval"),
]
