"""Unit 07 (encoder classifier): data parsing and split, compact vocabulary, batches, the model, metrics,
evaluation and the widgets' compute functions, checked against the syllabus numbers, formulas and
independent oracles (``torch.nn.TransformerEncoderLayer``, ``F.cross_entropy``, hand counts)."""

from __future__ import annotations

import csv
import io
import math

import pytest
import torch
import torch.nn.functional as F

import llmcourse
from llmcourse.data import sentiment as S
from llmcourse.models.encoder_classifier import (
    BertEmbeddings,
    EncoderClassifier,
    attention_maps,
    encoder_classifier_param_count,
)
from llmcourse.nn.blocks import to_torch_encoder_layer
from llmcourse.train.classification import accuracy, confusion_matrix, evaluate
from llmcourse.viz import classifier as viz


@pytest.fixture(scope="module")
def enc():
    return llmcourse.gpt2_encoding()


@pytest.fixture(scope="module")
def examples():
    return S.load_sentiment()


@pytest.fixture(scope="module")
def splits(examples):
    return S.stratified_split(examples, seed=0)


# ------------------------------------------------------------------ data


def test_files_parse_to_1000_balanced_lines_each(examples):
    assert len(examples) == 3000
    for src in S.SOURCES:
        labels = [e.label for e in examples if e.source == src]
        assert len(labels) == 1000 and sum(labels) == 500, src


def test_imdb_traps_csv_and_splitlines():
    text = llmcourse.load_text("uci-sentiment", "sentiment/imdb_labelled.txt")
    assert len(list(csv.reader(io.StringIO(text), delimiter="\t"))) == 748  # MANIFEST: default quoting merges lines
    assert len(text.splitlines()) == 1002  # Unicode line separators inside sentences
    assert len(S.parse_labelled_lines(text)) == 1000


def test_parse_splits_on_last_tab_and_rejects_bad_lines():
    out = S.parse_labelled_lines('a "quoted\tthing\t1\nplain\t0\n', "x")
    assert out == [S.SentimentExample('a "quoted\tthing', 1, "x"), S.SentimentExample("plain", 0, "x")]
    with pytest.raises(ValueError, match="no tab"):
        S.parse_labelled_lines("no tab here\n")
    with pytest.raises(ValueError, match="0 or 1"):
        S.parse_labelled_lines("text\t7\n")
    with pytest.raises(ValueError, match="unknown source"):
        S.load_sentiment(["twitter"])


def test_stratified_split_sizes_mix_and_determinism(examples, splits):
    assert [len(splits[k]) for k in ("train", "val", "test")] == [2400, 300, 300]
    for name, per_group in (("train", 400), ("val", 50), ("test", 50)):
        for src in S.SOURCES:
            for lab in (0, 1):
                assert sum(e.source == src and e.label == lab for e in splits[name]) == per_group
    ids = [id(e) for part in splits.values() for e in part]
    assert len(set(ids)) == 3000  # a partition: every example exactly once
    again = S.stratified_split(examples, seed=0)
    assert again == splits
    assert S.stratified_split(examples, seed=1)["test"] != splits["test"]
    with pytest.raises(ValueError):
        S.stratified_split(examples, (0.8, 0.1))


# ------------------------------------------------------------------ vocabulary and batches (F07.1)


def test_f07_1_gpt2_ids_and_compact_vocab(enc):
    assert enc.encode("Great phone!") == [13681, 3072, 0]
    assert enc.encode("Bad battery.") == [22069, 6555, 13]
    assert enc.encode("Not bad at all, great value.") == [3673, 2089, 379, 477, 11, 1049, 1988, 13]
    vocab = S.build_compact_vocab([[13681, 3072, 0], [22069, 6555, 13]])
    assert vocab == {0: 4, 13: 5, 3072: 6, 6555: 7, 13681: 8, 22069: 9}


def test_compact_vocab_properties():
    lists = [[5, 9, 9], [7, 9], [5]]
    assert S.build_compact_vocab(lists) == {5: 4, 7: 5, 9: 6}
    assert S.build_compact_vocab(lists[::-1]) == S.build_compact_vocab(lists)
    assert S.build_compact_vocab(lists, min_freq=2) == {5: 4, 9: 5}
    assert S.build_compact_vocab(lists, min_freq=3) == {9: 4}
    with pytest.raises(ValueError):
        S.build_compact_vocab(lists, min_freq=0)


def test_f07_1_encode_batch(enc):
    vocab = {0: 4, 13: 5, 3072: 6, 6555: 7, 13681: 8, 22069: 9}
    ids, mask = S.encode_batch(["Great phone!", "Not bad at all, great value."], enc, vocab, max_len=8)
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.tolist() == [[1, 8, 6, 4, 2, 0, 0, 0], [1, 3, 3, 3, 3, 3, 3, 2]]
    assert mask.tolist() == [[True] * 5 + [False] * 3, [True] * 8]


def test_encode_batch_truncation_keeps_sep(enc):
    text = "one two three four five six seven eight nine ten"
    for max_len in (2, 3, 5, 64):
        ids, mask = S.encode_batch([text, "hi"], enc, {}, max_len)
        assert ids.shape[1] == min(max_len, len(enc.encode(text)) + 2)
        assert ((ids == 2).sum(1) == 1).all() and (ids[:, 0] == 1).all()
        assert (ids[torch.arange(2), mask.sum(1) - 1] == 2).all()
    with pytest.raises(ValueError):
        S.encode_batch(["x"], enc, {}, 1)
    with pytest.raises(ValueError):
        S.encode_batch([], enc, {}, 8)


def test_sentiment_batches_match_encode_batch(enc, splits):
    part = splits["val"][:70]
    vocab = S.build_compact_vocab([enc.encode(e.text) for e in part])
    loader = S.SentimentBatches(part, enc, vocab, 16, batch_size=32)
    assert len(loader) == 3
    batches = list(loader)
    assert [len(y) for *_, y in batches] == [32, 32, 6]
    ids, mask = S.encode_batch([e.text for e in part[:32]], enc, vocab, 16)
    assert torch.equal(batches[0][0], ids) and torch.equal(batches[0][1], mask)
    shuffled = S.SentimentBatches(part, enc, vocab, 16, 32, shuffle=True, generator=torch.Generator().manual_seed(0))
    assert sorted(torch.cat([y for *_, y in shuffled]).tolist()) == sorted(e.label for e in part)
    assert math.ceil(2400 / 32) == len(S.SentimentBatches(splits["train"][:2400], enc, vocab, 16, 32))


# ------------------------------------------------------------------ model


def test_parameter_counts_match_syllabus():
    for v in (100, 6013):
        n = sum(p.numel() for p in EncoderClassifier(v).parameters())
        assert n == 64 * v + 104_578 == encoder_classifier_param_count(v)
    block = EncoderClassifier(10).layers[0]
    assert sum(p.numel() for p in block.parameters()) == 49_984
    big = EncoderClassifier(50_260, d_model=256, num_heads=4, d_ff=1024, n_layers=4, max_len=256)
    n = sum(p.numel() for p in big.parameters())
    assert big.embeddings.tok.weight.numel() == 12_866_560
    assert n - big.embeddings.seg.weight.numel() == 16_092_674  # the syllabus figure counts no segment table


def test_state_dict_keys():
    keys = set(EncoderClassifier(20, n_layers=1).state_dict())
    assert {"embeddings.tok.weight", "embeddings.pos.weight", "embeddings.seg.weight", "embeddings.norm.weight",
            "embeddings.norm.bias", "final_norm.weight", "final_norm.bias", "classifier.weight",
            "classifier.bias", "layers.0.self_attn.W_query.weight", "layers.0.ffn.fc1.weight",
            "layers.0.norm1.weight"} <= keys
    emb = BertEmbeddings(20, 8, 6)
    assert emb.tok.padding_idx == 0 and bool((emb.tok.weight[0] == 0).all())


def test_bert_embeddings_formula_and_errors():
    torch.manual_seed(0)
    emb = BertEmbeddings(20, 8, 6, dropout=0.5).eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    seg = torch.tensor([[0, 0, 1, 1]])
    x = emb.tok.weight[ids] + emb.pos.weight[:4] + emb.seg.weight[seg]
    torch.testing.assert_close(emb(ids, seg), F.layer_norm(x, (8,), emb.norm.weight, emb.norm.bias, 1e-5))
    with pytest.raises(ValueError, match="max_len"):
        emb(torch.ones(1, 7, dtype=torch.long))
    with pytest.raises(ValueError):
        emb(ids, seg[:, :2])


def test_encoder_classifier_matches_torch_encoder_layers():
    torch.manual_seed(1)
    model = EncoderClassifier(30, d_model=16, num_heads=2, d_ff=32, n_layers=2, max_len=10, num_classes=3,
                              dropout=0.0).eval()
    ids = torch.tensor([[1, 5, 6, 7, 2, 0, 0], [1, 8, 9, 10, 11, 12, 2]])
    mask = ids != 0
    h = model.embeddings(ids)
    for block in model.layers:
        h = to_torch_encoder_layer(block)(h, src_key_padding_mask=~mask)
    h = F.layer_norm(h, (16,), model.final_norm.weight, model.final_norm.bias, 1e-5)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask), model.classifier(h[:, 0]), atol=1e-5, rtol=1e-5)
        model.pooling = "mean"
        pooled = torch.stack([h[b, mask[b]].mean(0) for b in range(2)])
        torch.testing.assert_close(model(ids, mask), model.classifier(pooled), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padding_invariance(pooling):
    torch.manual_seed(2)
    model = EncoderClassifier(30, d_model=16, num_heads=2, d_ff=32, max_len=12, dropout=0.3, pooling=pooling).eval()
    ids = torch.tensor([[1, 5, 6, 2, 0], [1, 7, 8, 9, 2]])
    mask = ids != 0
    with torch.no_grad():
        base = model(ids, mask)
        more = model(torch.cat([ids, torch.zeros(2, 4, dtype=torch.long)], 1),
                     torch.cat([mask, torch.zeros(2, 4, dtype=torch.bool)], 1))
        noisy = ids.clone()
        noisy[0, 4] = 17
        alone = model(ids[:1, :4], mask[:1, :4])
        torch.testing.assert_close(more, base, atol=1e-5, rtol=0)
        torch.testing.assert_close(model(noisy, mask), base, atol=1e-5, rtol=0)
        torch.testing.assert_close(alone[0], base[0], atol=1e-5, rtol=0)


def test_model_errors():
    with pytest.raises(ValueError, match="pooling"):
        EncoderClassifier(10, pooling="max")
    with pytest.raises(ValueError):
        EncoderClassifier(10, d_model=256, num_heads=6)
    model = EncoderClassifier(10)
    ids = torch.tensor([[1, 4, 2]])
    with pytest.raises(ValueError, match="bool"):
        model(ids, torch.ones(1, 3))


def test_attention_maps_rows_and_padding():
    torch.manual_seed(3)
    model = EncoderClassifier(30, d_model=16, num_heads=2, d_ff=32, max_len=12).train()
    ids = torch.tensor([[1, 5, 6, 2, 0, 0], [1, 7, 8, 9, 10, 2]])
    maps = attention_maps(model, ids, ids != 0)
    assert model.training and not any(layer.self_attn.store_weights for layer in model.layers)
    assert len(maps) == 2 and maps[0].shape == (2, 2, 6, 6)
    for w in maps:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 6))
        assert (w[0, :, :, 4:] == 0).all()  # no weight on padding


# ------------------------------------------------------------------ metrics and evaluation (F07.2)


def test_f07_2_confusion_and_accuracy():
    yt, yp = torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 1, 1, 1, 0])
    assert confusion_matrix(yt, yp, 2).tolist() == [[1, 1], [1, 2]]
    assert accuracy(yt, yp) == pytest.approx(0.6)
    asym = confusion_matrix(torch.tensor([0, 0, 0, 2]), torch.tensor([1, 1, 0, 0]), 3)
    assert asym.tolist() == [[1, 2, 0], [0, 0, 0], [1, 0, 0]]  # rows = true labels
    assert asym.dtype == torch.long and int(asym.sum()) == 4
    with pytest.raises(ValueError):
        confusion_matrix(torch.tensor([0, 3]), torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError):
        confusion_matrix(torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError):
        accuracy(torch.tensor([]), torch.tensor([]))


def test_evaluate_per_example_mean_modes_and_determinism():
    torch.manual_seed(4)
    model = EncoderClassifier(30, d_model=16, num_heads=2, d_ff=32, n_layers=1, max_len=12, dropout=0.5).train()
    g = torch.Generator().manual_seed(0)
    loader = []
    for size in (4, 4, 2):
        ids = torch.randint(4, 30, (size, 6), generator=g)
        ids[:, 0], ids[:, -1] = 1, 2
        loader.append((ids, ids != 0, torch.randint(0, 2, (size,), generator=g)))
    r1, r2 = evaluate(model, loader), evaluate(model, loader)
    assert model.training
    assert r1["loss"] == r2["loss"] and torch.equal(r1["confusion"], r2["confusion"])
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(i, m) for i, m, _ in loader])
    labels = torch.cat([y for *_, y in loader])
    assert r1["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), abs=1e-6)
    assert r1["accuracy"] == pytest.approx((logits.argmax(-1) == labels).float().mean().item())
    assert int(r1["confusion"].sum()) == 10
    evaluate(model, loader)
    assert not model.training
    with pytest.raises(ValueError):
        evaluate(model, [])


# ------------------------------------------------------------------ widgets


def test_confusion_view_and_static_figure():
    preds = {"test": {"y_true": torch.tensor([0, 1, 1, 0]), "y_pred": torch.tensor([0, 1, 0, 0]),
                      "source": ["amazon", "imdb", "imdb", "yelp"]}}
    view = viz.confusion_view(preds, "test", "imdb")
    assert view["confusion"].tolist() == [[0, 0], [1, 1]] and view["accuracy"] == 0.5 and view["n"] == 2
    assert viz.confusion_view(preds)["accuracy"] == 0.75
    with pytest.raises(ValueError):
        viz.confusion_view(preds, "val")
    with pytest.raises(ValueError):
        viz.confusion_view(preds, "test", "twitter")
    fig = viz.show_confusion(preds, static=True)
    assert "W07.1" in fig._repr_html_()


def test_cls_attention_view(enc):
    torch.manual_seed(5)
    vocab = S.build_compact_vocab([enc.encode(s) for s in viz.DEFAULT_SENTENCES])
    model = EncoderClassifier(len(vocab) + 4, d_model=16, num_heads=2, d_ff=32, max_len=32)
    view = viz.cls_attention(model, enc, vocab, "Great phone, awful battery.", 32)
    n = len(enc.encode("Great phone, awful battery.")) + 2
    assert view["tokens"][0] == "[CLS]" and view["tokens"][-1] == "[SEP]" and len(view["tokens"]) == n
    assert view["weights"].shape == (2, 2, n)
    torch.testing.assert_close(view["weights"].sum(-1), torch.ones(2, 2))
    assert view["probs"].sum().item() == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError):
        viz.cls_attention(model, enc, vocab, "   ")
    assert "W07.2" in viz.show_cls_attention(model, enc, vocab, 32, static=True)._repr_html_()


def test_best_epoch_and_training_figure():
    history = {"train_loss": [0.7, 0.5, 0.3, 0.1], "val_loss": [0.69, 0.6, 0.55, 0.8],
               "val_accuracy": [0.5, 0.7, 0.7, 0.65]}
    assert viz.best_epoch(history) == 2  # tie on accuracy broken by the lower validation loss
    with pytest.raises(ValueError):
        viz.best_epoch({"train_loss": [1.0], "val_loss": [], "val_accuracy": [0.5]})
    assert "W07.3" in viz.show_training_curves(history, static=True)._repr_html_()
