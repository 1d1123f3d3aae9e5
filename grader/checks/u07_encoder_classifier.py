"""Checks of unit 07 (a BERT-style encoder classifier).

Fixtures are the syllabus's F07.1 (GPT-2 ids, compact vocabulary, framed batch) and F07.2
(confusion matrix). Modules are compared with the reference (``llmcourse``) with shared weights, in
eval mode; properties: padding invariance (appending ``[PAD]`` columns, changing ids at padded
positions, batching vs one row at a time), ``[SEP]`` survives truncation, repeated evaluations of a
dropout model agree, the mode is restored, the loss is a per-example mean. Independent oracles:
``F.cross_entropy``, ``torch.bincount`` and hand-computed counts.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from ..core import check, module_facts, unwrap
from ..gradcheck import check_module_gradients, module_gradient_probe

U = "07"
T = torch.tensor


def _ref():
    from llmcourse.data import sentiment as S
    from llmcourse.models import encoder_classifier as M
    from llmcourse.train import classification as C

    return {
        "build_compact_vocab": S.build_compact_vocab, "encode_batch": S.encode_batch,
        "BertEmbeddings": M.BertEmbeddings, "EncoderClassifier": M.EncoderClassifier,
        "confusion_matrix": C.confusion_matrix, "accuracy": C.accuracy, "evaluate": C.evaluate,
    }


def _enc():
    """The GPT-2 encoding (cached by llmcourse). Probes call this on their side rather than capture
    the encoding: a tiktoken object would be pickled (≈ 0.6 MB, 0.3 s) into every probe."""
    from llmcourse.data import gpt2_encoding

    return gpt2_encoding()


# F07.1
GREAT, BAD, NOT_BAD = "Great phone!", "Bad battery.", "Not bad at all, great value."
GREAT_IDS, BAD_IDS = [13681, 3072, 0], [22069, 6555, 13]
NOT_BAD_IDS = [3673, 2089, 379, 477, 11, 1049, 1988, 13]
F071_VOCAB = {0: 4, 13: 5, 3072: 6, 6555: 7, 13681: 8, 22069: 9}
F071_IDS = T([[1, 8, 6, 4, 2, 0, 0, 0], [1, 3, 3, 3, 3, 3, 3, 2]])
F071_MASK = T([[True] * 5 + [False] * 3, [True] * 8])


# ================================================================== 07.build_compact_vocab


@check(f"{U}.build_compact_vocab", ["build_compact_vocab"], _ref)
def check_build_compact_vocab(t):
    lists = [GREAT_IDS, BAD_IDS]
    out = t.run(lambda impl: impl.build_compact_vocab(lists))
    t.expect(isinstance(out, dict), f"build_compact_vocab must return a dict {{gpt2_id: new_id}}, got {type(out).__name__}")
    a, b = t.run(lambda impl: (impl.build_compact_vocab([[9, 5, 5]]), impl.build_compact_vocab([[9, 9, 5]])))
    t.expect(not (isinstance(a, dict) and isinstance(b, dict) and set(a) == set(b)) or a == b, f"build_compact_vocab([[9, 5, 5]]) gave {a} and build_compact_vocab([[9, 9, 5]]) gave {b}: the "
             "same ids, counted differently, must get the same new ids", bug="B07.vocab_by_frequency")
    t.compare(lambda impl: impl.build_compact_vocab(lists), F071_VOCAB,
              'vocabulary of "Great phone!" and "Bad battery."')
    # a larger random corpus: values exactly 4 … 4+n−1, in increasing GPT-2-id order
    rng = random.Random(7)
    corpus = [[rng.randrange(50257) if rng.random() < 0.3 else rng.randrange(60) for _ in range(rng.randint(1, 12))]
              for _ in range(40)]
    out = t.run(lambda impl: impl.build_compact_vocab(corpus))
    distinct = sorted({i for ids in corpus for i in ids})
    t.expect(sorted(out) == distinct, f"every GPT-2 id that occurs must be a key: expected {len(distinct)} keys, "
             f"got {len(out)}")
    t.expect(sorted(out.values()) == list(range(4, 4 + len(distinct))),
             "the new ids must be exactly 4, 5, …, 4+n−1 (0–3 are the specials)")
    t.compare(lambda impl: impl.build_compact_vocab(corpus), {g: 4 + k for k, g in enumerate(distinct)},
              "new ids must be assigned in increasing GPT-2-id order")
    shuffled = [list(reversed(ids)) for ids in reversed(corpus)]
    t.compare(lambda impl: impl.build_compact_vocab(shuffled), {g: 4 + k for k, g in enumerate(distinct)},
              "the result must not depend on the order of the lists or of the ids inside them")
    # min_freq filters on the total count over all lists
    counts = {}
    for ids in corpus:
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
    t.compare(lambda impl: impl.build_compact_vocab([[7, 7, 9], [9, 5], [3, 3, 3]], min_freq=2), {3: 4, 7: 5, 9: 6},
              "build_compact_vocab([[7, 7, 9], [9, 5], [3, 3, 3]], min_freq=2): every occurrence counts, repeats "
              "inside one list included; an id seen exactly min_freq times is kept")
    for min_freq in (2, 3):
        kept = sorted(i for i, c in counts.items() if c >= min_freq)
        t.compare(lambda impl, m=min_freq: impl.build_compact_vocab(corpus, min_freq=m),
                  {g: 4 + k for k, g in enumerate(kept)},
                  f"with min_freq={min_freq}, keep only ids with a total count ≥ {min_freq} (numbered 4, 5, …)")


# ================================================================== 07.encode_batch


@check(f"{U}.encode_batch", ["encode_batch"], _ref)
def check_encode_batch(t):
    enc = _enc()
    texts = [GREAT, NOT_BAD]
    out = t.run(lambda impl: impl.encode_batch(texts, _enc(), F071_VOCAB, 8))
    t.expect(isinstance(out, (tuple, list)) and len(out) == 2, "encode_batch must return (ids, attention_mask)")
    ids, mask = out
    t.expect(isinstance(ids, torch.Tensor) and ids.dtype == torch.long,
             f"ids must be a long tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
    t.expect(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
             f"attention_mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    t.expect(tuple(ids.shape) == (2, 8) and tuple(mask.shape) == (2, 8),
             f"for the two reviews with max_len=8 both tensors must have shape (2, 8); got {tuple(ids.shape)} and "
             f"{tuple(mask.shape)}")
    sep_rows = (ids == 2).sum(1)
    t.expect(bool((sep_rows == 1).all()),
             "every row must contain exactly one [SEP] (id 2); a truncated row lost it: truncate the content "
             "before adding [CLS]/[SEP]", bug="B07.truncate_drops_sep" if bool((sep_rows == 0).any()) else None)
    t.compare(lambda impl: impl.encode_batch(texts, _enc(), F071_VOCAB, 8), F071_IDS,
              'ids for ["Great phone!", "Not bad at all, great value."], max_len=8', pick=lambda o: o[0])
    t.compare(lambda impl: impl.encode_batch(texts, _enc(), F071_VOCAB, 8), F071_MASK,
              "attention_mask of the same batch (True for real tokens, [CLS] and [SEP] included)", pick=lambda o: o[1])
    # L = the longest row when nothing is truncated
    texts2 = [BAD, GREAT, "ok"]
    t.compare(lambda impl: impl.encode_batch(texts2, _enc(), F071_VOCAB, 32),
              _ref()["encode_batch"](texts2, enc, F071_VOCAB, 32)[0],
              "ids padded to the longest row (max_len=32, no truncation)", pick=lambda o: o[0])
    # properties on longer sentences and several max_len values
    sentences = ["The screen is great but the battery dies after two hours, which is really annoying.",
                 "Loved it!", "Worst. Service. Ever.", "I would not recommend this place to anyone at all."]
    vocab = _ref()["build_compact_vocab"]([enc.encode(s) for s in sentences[:2]])
    for max_len in (4, 7, 12, 64):
        ids, mask = t.run(lambda impl, m=max_len: impl.encode_batch(sentences, _enc(), vocab, m))
        t.expect(ids.shape[1] <= max_len, f"with max_len={max_len} rows must have at most {max_len} ids; got "
                 f"{ids.shape[1]}")
        t.expect(bool((ids[:, 0] == 1).all()), f"every row must start with [CLS] = 1 (max_len={max_len})")
        n_sep = (ids == 2).sum(1)
        t.expect(bool((n_sep == 1).all()), f"with max_len={max_len} every row must keep exactly one [SEP]; counts "
                 f"{n_sep.tolist()}", bug="B07.truncate_drops_sep" if bool((n_sep == 0).any()) else None)
        last = mask.sum(1) - 1
        t.expect(bool((ids[torch.arange(len(ids)), last] == 2).all()),
                 f"[SEP] must be the last real token of each row (max_len={max_len})")
        t.compare(lambda impl, m=max_len: impl.encode_batch(sentences, _enc(), vocab, m),
                  _ref()["encode_batch"](sentences, enc, vocab, max_len),
                  f"encode_batch of four sentences, max_len={max_len}")


# ================================================================== 07.BertEmbeddings


def _state(module) -> dict:
    return {k: v.clone() for k, v in unwrap(module).state_dict().items()}


def _token_table_gradient(impl):
    """Gradients of a fresh BertEmbeddings(11, 8, 6) after a backward pass through ids with [PAD] = 0.

    ``padding_idx=0`` shows in numbers: row 0 of ``tok.weight`` gets no gradient while the rows of the
    real ids do (a random projection of the output, since the sum of a LayerNorm output is constant).
    """
    m = impl.BertEmbeddings(11, 8, 6, dropout=0.0)
    ids = torch.tensor([[1, 5, 0, 0], [0, 3, 2, 0]])
    out = m(ids)
    w = torch.randn(tuple(out.shape), generator=torch.Generator().manual_seed(0))
    (out * w).sum().backward()
    return {n: p.grad for n, p in unwrap(m).named_parameters()}


@check(f"{U}.BertEmbeddings", ["BertEmbeddings"], _ref)
def check_bert_embeddings(t):
    Ref = _ref()["BertEmbeddings"]
    V, D, L = 11, 8, 6
    facts = t.run(lambda impl: module_facts(impl.BertEmbeddings(V, D, L)))
    t.expect(facts["is_module"], "BertEmbeddings must be an nn.Module subclass")
    torch.manual_seed(0)
    ref = Ref(V, D, L, dropout=0.5).eval()
    want = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    got = facts["state_dict"]
    t.expect(got == want, f"state_dict keys/shapes of BertEmbeddings({V}, {D}, {L}) must be {want}; got {got}")
    grads = t.run(_token_table_gradient)
    tok_grad = grads.get("tok.weight") if isinstance(grads, dict) else None
    t.expect(isinstance(tok_grad, torch.Tensor) and tuple(tok_grad.shape) == (11, 8)
             and not bool(tok_grad[0].any()) and bool(tok_grad[[1, 2, 3, 5]].abs().sum(-1).gt(0).all()),
             "the token table must be nn.Embedding(vocab_size, d_model, padding_idx=0) ([PAD] = 0)")
    facts3 = t.run(lambda impl: module_facts(impl.BertEmbeddings(V, D, L, type_vocab_size=3)))
    t.expect(facts3.get("state_dict", {}).get("seg.weight") == (3, D), "seg.weight must have shape (type_vocab_size, D)")

    with torch.no_grad():
        ref.norm.weight.uniform_(0.5, 1.5)
        ref.norm.bias.normal_()
    st = _state(ref)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (3, 5), generator=g)
    seg = torch.randint(0, 2, (3, 5), generator=g)

    def run(ids, seg=None, mode="eval", dropout=0.5):
        def probe(impl):
            mm = impl.BertEmbeddings(V, D, L, dropout=dropout)
            unwrap(mm).load_state_dict(st)
            getattr(unwrap(mm), mode)()
            return mm(ids) if seg is None else mm(ids, seg)
        return probe

    with torch.no_grad():
        full0 = torch.randint(0, V, (2, L), generator=torch.Generator().manual_seed(4))
        one = t.run(run(full0[:, :1]))
        if not (isinstance(one, torch.Tensor) and tuple(one.shape) == (2, 1, D)
                and bool(torch.allclose(one[:, 0], ref(full0)[:, 0], atol=1e-5))):
            t.fail("a length-1 input must use position 0 (positions are 0 … L−1): its vector must equal the first "
                   "vector of a longer input with the same first token", bug=t.diagnose(run(full0[:, :1]), one))
        t.compare(run(ids), ref(ids), "BertEmbeddings(ids) in eval mode with shared weights (segments default 0)")
        t.compare(run(ids, seg), ref(ids, seg), "BertEmbeddings(ids, segment_ids) in eval mode with shared weights")
        full = torch.randint(0, V, (2, L), generator=g)
        t.compare(run(full), ref(full), f"a batch of length L = max_len = {L}")
        # positions start at 0: the position-0 row of a length-1 input equals the first row of a longer one
        one = t.run(run(full[:, :1]))
        t.expect(bool(torch.allclose(one[:, 0], ref(full)[:, 0], atol=1e-5)),
                 "a length-1 input must use position 0 (positions are 0 … L−1)")
        # dropout: active in train mode, survivors scaled by 1/(1−p)
        big = torch.randint(0, V, (8, L), generator=g)
        clean = ref(big)
        noisy = t.run(run(big, mode="train"))
        zero_frac = float((noisy == 0).float().mean())
        kept = noisy != 0
        after_norm = 0.35 < zero_frac < 0.65 and bool(torch.allclose(noisy[kept], 2 * clean[kept], atol=1e-5))
        moved = not bool(torch.allclose(noisy, clean, atol=1e-5))
        t.expect(after_norm or zero_frac > 0.02 or not moved, f"in train mode with dropout=0.5 no output is 0 (zero fraction "
                 f"{zero_frac:.2f}): the dropout acts before the LayerNorm, which mixes every feature of a token",
                 bug="B07.dropout_before_norm")
        t.expect(0.35 < zero_frac < 0.65, f"in train mode with dropout=0.5 about half of the outputs must be 0; got a "
                 f"zero fraction of {zero_frac:.2f}")
        t.expect(after_norm, "in train mode with dropout=0.5 every output that is not 0 must be exactly 2 × the eval "
                 "output")


# ================================================================== 07.EncoderClassifier


def _classifier_state(pooling: str, vocab: int = 23):
    from llmcourse.models.encoder_classifier import EncoderClassifier

    torch.manual_seed(11)
    ref = EncoderClassifier(vocab, d_model=16, num_heads=2, d_ff=32, n_layers=2, max_len=12, num_classes=3,
                            dropout=0.0, pooling=pooling).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))  # non-trivial LayerNorm affine parameters
    return ref, _state(ref)


def _batch(lengths, width, vocab=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, 0] = 1
        ids[b, 1:n - 1] = torch.randint(4, vocab, (n - 2,), generator=g)
        ids[b, n - 1] = 2
    return ids, ids != 0


@check(f"{U}.EncoderClassifier", ["EncoderClassifier"], _ref)
def check_encoder_classifier(t):
    Ref = _ref()["EncoderClassifier"]
    # structure: keys and the parameter count of the defaults
    facts = t.run(lambda impl: module_facts(impl.EncoderClassifier(100)))
    t.expect(facts["is_module"], "EncoderClassifier must be an nn.Module subclass")
    ref_default = Ref(100)
    want = {k: tuple(v.shape) for k, v in ref_default.state_dict().items()}
    got = facts["state_dict"]
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    t.expect(not missing and not extra, f"state_dict keys differ from the specification: missing {missing[:6]}, "
             f"unexpected {extra[:6]}")
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    t.expect(not wrong, f"state_dict shapes differ (got, expected): {dict(list(wrong.items())[:4])}")
    n_params = sum(math.prod(got[n]) for n in facts["parameters"] if n in got)
    t.expect(n_params == 64 * 100 + 104_578, f"EncoderClassifier(100) must have 64·V + 104,578 = 110,978 parameters; "
             f"got {n_params:,}")

    def head_and_dropouts(impl):
        mm = unwrap(impl.EncoderClassifier(100, num_classes=5, dropout=0.3))
        f = module_facts(mm)
        layers = getattr(mm, "layers", None)
        ps = sorted({round(float(d.p), 6) for d in layers.modules() if isinstance(d, torch.nn.Dropout)}) \
            if isinstance(layers, torch.nn.Module) else None
        return f.get("state_dict", {}).get("classifier.weight"), ps

    n3 = t.run(lambda impl: sum(1 for k in module_facts(impl.EncoderClassifier(100, n_layers=3))["state_dict"]
                                if k.startswith("layers.") and k.endswith(".norm1.weight")))
    t.expect(n3 == 3, f"EncoderClassifier(100, n_layers=3) must hold 3 encoder blocks; its state_dict has {n3}")
    head, ps = t.run(head_and_dropouts)
    t.expect(head == (5, 64), f"EncoderClassifier(100, num_classes=5): the classifier must give 5 logits, "
             f"classifier.weight (5, 64); got {head}", bug="B07.num_classes_ignored")
    t.expect(ps == [0.3], f"EncoderClassifier(100, dropout=0.3): the encoder blocks must drop with p=0.3 too "
             f"(attention weights and sublayer outputs); their dropout probabilities are {ps}",
             bug="B07.block_dropout_missing")

    def build(pooling, st):
        def make(impl):
            mm = impl.EncoderClassifier(23, d_model=16, num_heads=2, d_ff=32, n_layers=2, max_len=12, num_classes=3,
                                        dropout=0.0, pooling=pooling)
            unwrap(mm).load_state_dict(st)
            unwrap(mm).eval()
            return mm
        return make

    def logits(pooling, st, ids, mask):
        def probe(impl):
            with torch.no_grad():
                return build(pooling, st)(impl)(ids, mask)
        return probe

    for pooling in ("cls", "mean"):
        ref, st = _classifier_state(pooling)
        # 1. no padding at all
        ids, mask = _batch([7, 7, 7], 7, seed=1)
        with torch.no_grad():
            expected = ref(ids, mask)
        out = t.compare(logits(pooling, st, ids, mask), expected,
                        f'logits (B=3, C=3) for unpadded inputs, pooling="{pooling}", shared weights, eval mode')
        t.expect(tuple(out.shape) == (3, 3), f"logits must have shape (B, num_classes) = (3, 3); got {tuple(out.shape)}")

        # 2. padding invariance: append PAD columns (and False mask entries)
        ids, mask = _batch([9, 5, 3], 9, seed=2)
        base = t.run(logits(pooling, st, ids, mask))
        t.expect(not bool(torch.isnan(base).any()), f'logits contain NaN for a padded batch (pooling="{pooling}")')
        padded_ids = torch.cat([ids, torch.zeros(3, 3, dtype=torch.long)], 1)
        padded_mask = torch.cat([mask, torch.zeros(3, 3, dtype=torch.bool)], 1)
        probe = logits(pooling, st, padded_ids, padded_mask)
        longer = t.run(probe)
        if not torch.allclose(longer, base, atol=1e-5):
            bug_id = t.diagnose(probe, longer) or "B07.pad_not_masked"
            t.fail(f'appending 3 [PAD] columns (mask False) changed the logits (pooling="{pooling}", max abs change '
                   f"{(longer - base).abs().max().item():.3g}): padding must not influence real tokens", bug=bug_id)
        # 3. changing the ids at padded positions changes nothing
        noisy = ids.clone()
        noisy[~mask] = torch.randint(4, 23, (int((~mask).sum()),), generator=torch.Generator().manual_seed(5))
        probe = logits(pooling, st, noisy, mask)
        changed = t.run(probe)
        if not torch.allclose(changed, base, atol=1e-5):
            bug_id = t.diagnose(probe, changed) or "B07.pad_not_masked"
            t.fail(f'changing the ids at padded positions (mask False) changed the logits (pooling="{pooling}")',
                   bug=bug_id)
        # 4. rows are independent: each row alone (no padding) gives the batched logits
        for b, n in enumerate([9, 5, 3]):
            alone = t.run(logits(pooling, st, ids[b:b + 1, :n], mask[b:b + 1, :n]))
            t.expect(bool(torch.allclose(alone[0], base[b], atol=1e-5)),
                     f"row {b} alone (length {n}, no padding) gives different logits than inside the padded batch",
                     bug="B07.pad_not_masked")
        # 5. the reference on the padded batch
        with torch.no_grad():
            expected = ref(ids, mask)
        t.compare(logits(pooling, st, ids, mask), expected,
                  f'logits for a right-padded batch (lengths 9, 5, 3), pooling="{pooling}", shared weights')

    # backpropagation reaches every parameter (both poolings)
    for pooling in ("cls", "mean"):
        _, st_g = _classifier_state(pooling)
        ids_g, mask_g = _batch([9, 5, 3], 9, seed=6)
        check_module_gradients(t, module_gradient_probe(build(pooling, st_g), [ids_g, mask_g]),
                        f'EncoderClassifier(pooling="{pooling}") on a padded batch')

    # dropout: train mode is random, eval mode is deterministic
    ref, st = _classifier_state("cls")
    ids, mask = _batch([8, 6], 8, seed=4)

    def twice(impl):
        mm = impl.EncoderClassifier(23, d_model=16, num_heads=2, d_ff=32, n_layers=2, max_len=12, num_classes=3,
                                    dropout=0.3)
        unwrap(mm).load_state_dict(st)
        unwrap(mm).train()
        with torch.no_grad():
            a, b = mm(ids, mask), mm(ids, mask)
            unwrap(mm).eval()
            return a, b, mm(ids, mask), mm(ids, mask)

    a, b, c, d = t.run(twice)
    t.expect(not torch.equal(a, b), "with dropout=0.3 in train mode two calls gave identical logits: pass `dropout` "
             "to the embeddings and the encoder blocks")
    t.expect(torch.equal(c, d), "in eval mode two calls must give identical logits")


# ================================================================== 07.confusion_matrix


@check(f"{U}.confusion_matrix", ["confusion_matrix", "accuracy"], _ref)
def check_confusion_matrix(t):
    y_true, y_pred = T([0, 0, 1, 1, 1]), T([0, 1, 1, 1, 0])
    cm = t.run(lambda impl: impl.confusion_matrix(y_true, y_pred, 2))
    t.expect(isinstance(cm, torch.Tensor) and tuple(cm.shape) == (2, 2),
             f"confusion_matrix must return a (C, C) tensor; got {getattr(cm, 'shape', type(cm).__name__)}")
    t.expect(not cm.is_floating_point(), f"confusion_matrix must hold integer counts (long), got {cm.dtype}")
    t.compare(lambda impl: impl.confusion_matrix(y_true, y_pred, 2).long(), T([[1, 1], [1, 2]]),
              "confusion_matrix([0,0,1,1,1], [0,1,1,1,0]) (rows = true labels)")
    acc = t.run(lambda impl: impl.accuracy(y_true, y_pred))
    t.expect(isinstance(acc, float), f"accuracy must return a Python float, got {type(acc).__name__}")
    t.compare(lambda impl: impl.accuracy(y_true, y_pred), 0.6, "accuracy([0,0,1,1,1], [0,1,1,1,0])", atol=1e-7)
    # asymmetric 3-class case against an independent count
    g = torch.Generator().manual_seed(0)
    yt = torch.randint(0, 3, (200,), generator=g)
    yp = torch.where(torch.rand(200, generator=g) < 0.6, yt, torch.randint(0, 3, (200,), generator=g))
    yp[yt == 2] = 0  # class 2 is always predicted as 0: a strongly asymmetric matrix
    expected = torch.zeros(3, 3, dtype=torch.long)
    for i, j in zip(yt.tolist(), yp.tolist()):
        expected[i, j] += 1
    cm = t.compare(lambda impl: impl.confusion_matrix(yt, yp, 3).long(), expected,
                   "a 3-class confusion matrix with 200 examples (rows = true, columns = predicted)")
    t.expect(int(cm.sum()) == 200, f"the entries must sum to N = 200, got {int(cm.sum())}")
    acc = t.run(lambda impl: impl.accuracy(yt, yp))
    t.expect(abs(acc - float(cm.trace()) / 200) < 1e-6, f"accuracy ({acc:.4f}) must equal trace/N "
             f"({float(cm.trace()) / 200:.4f})")
    # a class that never occurs still gets its row and column
    t.compare(lambda impl: impl.confusion_matrix(T([0, 1]), T([1, 1]), 4).long(),
              T([[0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),
              "num_classes=4 with only classes 0 and 1 present (shape (4, 4))")


# ================================================================== 07.evaluate


def _eval_fixture(dropout: float):
    from llmcourse.models.encoder_classifier import EncoderClassifier

    torch.manual_seed(21)
    model = EncoderClassifier(23, d_model=16, num_heads=2, d_ff=32, n_layers=1, max_len=12, num_classes=2,
                              dropout=dropout)
    loader = []
    g = torch.Generator().manual_seed(8)
    for size, width in ((4, 9), (4, 7), (2, 5)):  # unequal batch sizes: per-example mean ≠ mean of batch means
        lengths = torch.randint(3, width + 1, (size,), generator=g).tolist()
        lengths[0] = width
        ids, mask = _batch(lengths, width, seed=int(torch.randint(0, 1000, (1,), generator=g)))
        loader.append((ids, mask, torch.randint(0, 2, (size,), generator=g)))
    return model, loader


MODE_SEED = 12345


def _mode_evidence(model, loader):
    """A seeded forward pass of ``model`` on the first batch of ``loader``.

    Run after a call in the learner's process and here on the same weights in a known mode, it tells
    (from numbers, not from a flag read over there) which mode the call left the model in.
    """
    ids, mask, _ = loader[0]
    with torch.random.fork_rng():
        torch.manual_seed(MODE_SEED)
        with torch.no_grad():
            return model(ids, mask)


def _same_numbers(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-5))


@check(f"{U}.evaluate", ["evaluate"], _ref)
def check_evaluate(t):
    model, loader = _eval_fixture(dropout=0.5)
    state = _state(model)
    # oracle: per-example cross-entropy in eval mode
    model.eval()
    with torch.no_grad():
        all_logits = torch.cat([model(ids, mask) for ids, mask, _ in loader])
    labels = torch.cat([y for *_, y in loader])
    ce = F.cross_entropy(all_logits, labels, reduction="none")
    preds = all_logits.argmax(-1)
    expected_cm = torch.zeros(2, 2, dtype=torch.long)
    for i, j in zip(labels.tolist(), preds.tolist()):
        expected_cm[i, j] += 1
    left_in_train = _mode_evidence(model.train(), loader)
    left_in_eval = _mode_evidence(model.eval(), loader)

    def call(mode):
        def probe(impl):
            model.load_state_dict(state)
            model.train(mode == "train")
            r1 = impl.evaluate(model, loader)
            after = _mode_evidence(model, loader)
            r2 = impl.evaluate(model, loader)
            return r1, r2, after
        return probe

    r1, r2, after = t.run(call("train"))
    t.expect(isinstance(r1, dict) and {"loss", "accuracy", "confusion"} <= set(r1),
             f"evaluate must return a dict with keys 'loss', 'accuracy', 'confusion'; got "
             f"{sorted(r1) if isinstance(r1, dict) else type(r1).__name__}")
    same = abs(float(r1["loss"]) - float(r2["loss"])) < 1e-6 and torch.equal(
        torch.as_tensor(r1["confusion"]), torch.as_tensor(r2["confusion"]))
    t.expect(same, "evaluating a dropout-0.5 model twice gave different results: dropout is still active; switch "
             "the model to eval mode inside evaluate", bug="B07.eval_train_mode")
    t.expect(_same_numbers(after, left_in_train), "evaluate must restore the model's previous mode (it was in train mode, now it is not)")
    loss = float(r1["loss"])
    batch_means = [float(F.cross_entropy(all_logits[s:s + len(y)], y)) for s, y in
                   zip([0, 4, 8], [y for *_, y in loader])]
    if abs(loss - float(ce.mean())) > 1e-5:
        summed = abs(loss - sum(batch_means)) < 1e-4 or abs(loss - float(ce.sum())) < 1e-4
        t.expect(not summed, f"the loss {loss:.4f} is a sum (per-example mean: {float(ce.mean()):.4f})",
                 bug="B07.summed_loss")
        if abs(loss - sum(batch_means) / len(batch_means)) < 1e-5:
            t.fail(f"the loss {loss:.4f} is the mean of the batch means; with unequal batch sizes (4, 4, 2) the "
                   f"per-example mean is {float(ce.mean()):.4f}: weight each batch by its size")
        t.fail(f"loss: expected the mean cross-entropy over the 10 examples, {float(ce.mean()):.5f}; got {loss:.5f}")
    t.compare(call("train"), float((preds == labels).float().mean()), "accuracy over the 10 examples",
              atol=1e-6, pick=lambda o: float(o[0]["accuracy"]))
    t.compare(call("train"), expected_cm, "confusion matrix over the 10 examples (rows = true labels)",
              pick=lambda o: torch.as_tensor(o[0]["confusion"]).long())
    r1, _, after = t.run(call("eval"))
    t.expect(_same_numbers(after, left_in_eval), "evaluate must leave a model that was in eval mode in eval mode")

    # the number of classes comes from the model: a 3-class model gets a (3, 3) confusion matrix
    from llmcourse.models.encoder_classifier import EncoderClassifier

    torch.manual_seed(22)
    m3 = EncoderClassifier(23, d_model=16, num_heads=2, d_ff=32, n_layers=1, max_len=12, num_classes=3,
                           dropout=0.0).eval()
    with torch.no_grad():
        m3.classifier.bias.copy_(torch.tensor([0.0, 0.0, 3.0]))  # class 2 is predicted
    loader3 = [(ids, mask, torch.randint(0, 3, (len(ids),), generator=torch.Generator().manual_seed(9)))
               for ids, mask, _ in loader]
    with torch.no_grad():
        logits3 = torch.cat([m3(ids, mask) for ids, mask, _ in loader3])
    labels3 = torch.cat([y for *_, y in loader3])
    cm3 = torch.zeros(3, 3, dtype=torch.long)
    for i, j in zip(labels3.tolist(), logits3.argmax(-1).tolist()):
        cm3[i, j] += 1

    def three(impl):
        return impl.evaluate(m3, loader3)["confusion"]

    err = t.raised_error(three)
    if err is not None and err[0] in ("IndexError", "ValueError", "RuntimeError"):
        t.fail(f"evaluate on a model with 3 classes (logits (B, 3)) raised {err[0]} ({err[1]}): the confusion matrix "
               "must have one row and column per class of the model", bug="B07.eval_two_classes")
    got3 = t.run(three)
    t.expect(isinstance(got3, torch.Tensor) and tuple(got3.shape) == (3, 3),
             f"a model with 3 classes (logits (B, 3)) must get a (3, 3) confusion matrix; got "
             f"{tuple(getattr(got3, 'shape', ())) or type(got3).__name__}", bug="B07.eval_two_classes")
    t.compare(lambda impl: torch.as_tensor(three(impl)).long(), cm3,
              "confusion matrix of a 3-class model over the 10 examples")


# ================================================================== grading strength (grader/strength.py)

from ..strength import decision, defining_property  # noqa: E402

defining_property(
    f"{U}.build_compact_vocab",
    "a compact vocabulary is a function of the set of kept ids only: numbered 4, 5, … in GPT-2-id order, kept by "
    "their total count",
    probe="the returned dict for fixed lists, a random corpus, its reversal, equal id sets with different counts, "
          "and min_freq thresholds met exactly")
defining_property(
    f"{U}.encode_batch",
    "a framed, right-padded batch: [CLS] content [SEP] with the end of the content cut, and a bool mask of the real "
    "tokens",
    probe="ids and mask for fixed sentences and four max_len values: [SEP] count and position, shapes, dtypes, "
          "compared with the reference")
defining_property(
    f"{U}.BertEmbeddings",
    "BERT's input layer: dropout(LayerNorm(token + position + segment)), positions from 0, [PAD] row frozen",
    probe="the learner's module with shared weights in eval mode (segments default and given), a length-1 input, "
          "gradients of the token table through PAD ids, and train-mode outputs (zero fraction, survivors 2x)")
defining_property(
    f"{U}.EncoderClassifier",
    "classification from pre-LN encoder states in which padding changes nothing: key-padding mask in every block, "
    "final norm, [CLS] or masked-mean pooling, num_classes logits",
    probe="logits with shared weights for both poolings; appended PAD columns, changed PAD ids and rows alone must "
          "leave them unchanged; the classifier's shape for num_classes=5; the blocks' dropout probabilities")
defining_property(
    f"{U}.confusion_matrix",
    "counts of (true, predicted) pairs, rows = true labels, every class present, and accuracy = trace / N",
    probe="the returned matrices against hand counts (asymmetric 3-class, absent classes) and the float accuracy")
defining_property(
    f"{U}.evaluate",
    "evaluation is a per-example average in eval mode that leaves the model as it was and sizes its confusion "
    "matrix by the model's classes",
    probe="loss, accuracy and confusion vs F.cross_entropy over unequal batches; two calls on a dropout-0.5 model; "
          "the mode after the call read from a seeded forward pass; a 3-class model")

decision(f"{U}.BertEmbeddings", "the order of LayerNorm and dropout in BERT's embedding layer",
         forms=[r"Dropout\}?\\?(big)?\(\\?(text\{)?LayerNorm", r"dropout\(\s*(self\.)?norm\(",
                r"dropout acts on (that|the) normali[sz]ed", r"LayerNorm, then dropout"],
         wrong=("B07.dropout_before_norm",))
decision(f"{U}.EncoderClassifier", "the shape of the mask the blocks receive (a key mask over heads and queries)",
         forms=[r"attention_mask\[\s*:\s*,\s*None\s*,\s*None\s*,\s*:\s*\]", r"\(B, 1, 1, L\)"],
         wrong=("B07.pad_not_masked", "B07.mask_polarity"))
