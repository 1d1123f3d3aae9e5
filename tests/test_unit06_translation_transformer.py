"""Unit 06 library tests: data and tokenizers, masks and batches, the Transformer, decoding, chrF, widgets.

Oracles are the syllabus's fixtures (F06.1–F06.5, parameter counts), ``torch.nn.Transformer`` with copied
weights, ``torch.argmax`` and formulas; never numbers printed from the code under test.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from llmcourse.data.translation import (
    EOS_ID,
    PAD_ID,
    SOS_ID,
    TranslationTokenizer,
    load_tatoeba_tokenizers,
    load_translation_pairs,
    make_src_mask,
    make_tgt_mask,
    make_translation_batch,
    pretokenize,
    split_pairs,
    tokenizer_asset_path,
)
from llmcourse.models.transformer import Transformer, to_torch_transformer, transformer_param_count
from llmcourse.nn.masks import causal_mask
from llmcourse.train.decoding import greedy_translate, greedy_translate_verbose
from llmcourse.train.metrics import chrf
from llmcourse.train.seq2seq import evaluate_loss, noam_factor_for_peak, train_translation

HINDI = "क्या आप मेरी मदद कर सकते हैं?"


@pytest.fixture(scope="module")
def pairs():
    return load_translation_pairs()


# ---------------------------------------------------------------- data


def test_pairs_cleaned_and_attributed(pairs):
    assert 0 < len(pairs) <= 3117                      # the file has 3,117 lines
    assert all(p.en and p.hi and p.en == p.en.strip() for p in pairs)
    assert len({(p.en, p.hi) for p in pairs}) == len(pairs)
    assert all(p.attribution.startswith("CC-BY 2.0 (France) Attribution: tatoeba.org") for p in pairs)


def test_loader_nfc_dedup_and_empty_sides():
    text = "Hi.\tनमस्ते।\tattr1\nHi.\tनमस्ते।\tattr2\n \tखाली\nGo.\t  \n Yes. \tहाँ\n"
    out = load_translation_pairs(text=text)
    assert [(p.en, p.hi, p.attribution) for p in out] == [("Hi.", "नमस्ते।", "attr1"), ("Yes.", "हाँ", "")]
    assert load_translation_pairs(text="cafe\u0301\tx")[0].en == "caf\u00e9"          # NFC composes e + acute
    # U+0958 (QA) is a composition exclusion: NFC writes it as KA + NUKTA, so both spellings become equal
    assert load_translation_pairs(text="a\t\u0958")[0].hi == "\u0915\u093c"


def test_split_is_seeded_90_5_5(pairs):
    train, val, test = split_pairs(pairs)
    n = len(pairs)
    assert (len(train), len(val)) == (int(0.9 * n), int(0.05 * n)) and len(train) + len(val) + len(test) == n
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
    assert train[0] == pairs[perm[0]] and val[0] == pairs[perm[int(0.9 * n)]]
    assert split_pairs(pairs)[1] == val
    with pytest.raises(ValueError):
        split_pairs(pairs, (0.5, 0.5, 0.5))


def test_pretokenize_f06_4():
    assert pretokenize(HINDI) == ['क्या', 'आप', 'मेरी', 'मदद', 'कर', 'सकते', 'हैं', '?']
    assert len(re.findall(r"\w+|[^\w\s]", HINDI)) == 17   # the B06.hindi_word_regex failure
    assert pretokenize("मैं ठीक हूँ।") == ["मैं", "ठीक", "हूँ", "।"]
    assert pretokenize("Hello, world!") == ["Hello", ",", "world", "!"]


def test_tokenizer_specials_roundtrip_and_unknown():
    tok = TranslationTokenizer.train(["the cat sat.", "the cat ran!"], 10)
    assert tok.itos[:4] == ["[PAD]", "[SOS]", "[EOS]", "[UNK]"]
    ids = tok.encode("the cat ran!")
    assert min(ids) >= 4 and tok.decode(ids) == "the cat ran!"
    assert tok.decode([SOS_ID] + ids + [EOS_ID, 7, PAD_ID]) == "the cat ran!"   # stops at EOS
    assert 3 in tok.encode("zebra")                                              # unseen characters -> [UNK]
    with pytest.raises(ValueError):
        tok.decode([tok.vocab_size])


def test_assets_reproduce_and_prefix(pairs):
    """Re-training on the seed-0 training split reproduces the shipped merges (first 150 of each language)."""
    train, _, _ = split_pairs(pairs)
    for lang in ("en", "hi"):
        shipped = TranslationTokenizer.load(tokenizer_asset_path(lang))
        assert len(shipped.merges) == 2000
        retrained = TranslationTokenizer.train([getattr(p, lang) for p in train], 150)
        assert retrained.merges == shipped.merges[:150]
        assert retrained.alphabet == shipped.alphabet
    assert sum(tokenizer_asset_path(x).stat().st_size for x in ("en", "hi")) < 5_000_000
    en, hi = load_tatoeba_tokenizers(500)
    assert len(en.merges) == len(hi.merges) == 500 and en.vocab_size <= 4 + len(en.alphabet) + 1 + 500


def test_hindi_bpe_beats_gpt2_bytes():
    from llmcourse.data import gpt2_encoding

    word = "सकते"
    _, hi = load_tatoeba_tokenizers(500)
    assert len(hi.encode(word)) < len(gpt2_encoding().encode(word))


# ---------------------------------------------------------------- masks and batches


def test_masks_f06_1():
    m = make_src_mask(torch.tensor([[5, 6, 7, 0, 0]]))
    assert m.dtype == torch.bool and m.tolist() == [[[[True, True, True, False, False]]]]
    tm = make_tgt_mask(torch.tensor([[1, 8, 9, 0]]))
    assert tm.shape == (1, 1, 4, 4)
    assert tm[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]


def test_tgt_mask_property_and_no_empty_rows():
    tgt = torch.tensor([[1, 5, 6, 0, 0], [1, 7, 8, 9, 10]])
    assert torch.equal(make_tgt_mask(tgt), (tgt != 0)[:, None, None, :] & causal_mask(5))
    assert make_tgt_mask(tgt).any(-1).all()
    with pytest.raises(ValueError, match="integer token ids"):
        make_src_mask(torch.rand(2, 3))


def test_batch_f06_2_and_truncation():
    src, tgt_in, tgt_out = make_translation_batch([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])], 8)
    assert src.tolist() == [[5, 6, 7], [5, 0, 0]]
    assert tgt_in.tolist() == [[1, 8, 9, 0, 0], [1, 8, 9, 10, 11]]
    assert tgt_out.tolist() == [[8, 9, 2, 0, 0], [8, 9, 10, 11, 2]]
    src, tgt_in, tgt_out = make_translation_batch([(list(range(4, 14)), list(range(4, 14)))], 4)
    assert src.tolist() == [[4, 5, 6, 7]] and tgt_in.tolist() == [[1, 4, 5, 6]] and tgt_out.tolist() == [[4, 5, 6, 2]]
    with pytest.raises(ValueError):
        make_translation_batch([], 8)
    with pytest.raises(ValueError):
        make_translation_batch([([], [5])], 8)


# ---------------------------------------------------------------- model


def test_param_count_formula():
    v_src, v_tgt = 500, 700
    m = Transformer(v_src, v_tgt)
    expected = (v_src + v_tgt) * 128 + 2 * 198_272 + 2 * 264_576 + 2 * 256 + 129 * v_tgt   # syllabus formula
    assert sum(p.numel() for p in m.parameters()) == expected == transformer_param_count(v_src, v_tgt)
    keys = set(m.state_dict())
    assert {"encoder.norm.weight", "decoder.norm.bias", "projection.proj.weight"} <= keys
    assert not any(k.startswith("pos") for k in keys)
    post = Transformer(v_src, v_tgt, norm_first=False)
    assert not any(k.startswith(("encoder.norm", "decoder.norm")) for k in post.state_dict())


def test_matches_torch_transformer():
    torch.manual_seed(0)
    m = Transformer(30, 25, d_model=32, num_heads=4, d_ff=64, max_len=16, dropout=0.0).eval()
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [4, 9, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 8, 9, 0], [1, 4, 5, 6]])
    with torch.no_grad():
        sm = make_src_mask(src)
        mine = m.decode(tgt, m.encode(src, sm), sm, make_tgt_mask(tgt))
        tt = to_torch_transformer(m)
        theirs = tt(m.pos(m.src_embed(src)), m.pos(m.tgt_embed(tgt)), tgt_mask=~causal_mask(4),
                    src_key_padding_mask=src == 0, memory_key_padding_mask=src == 0, tgt_key_padding_mask=tgt == 0)
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_padding_invariance_and_causality():
    torch.manual_seed(1)
    m = Transformer(30, 25, d_model=32, num_heads=4, d_ff=64, max_len=16, dropout=0.0).eval()
    src = torch.tensor([[5, 6, 7]])
    tgt = torch.tensor([[1, 8, 9, 10]])
    with torch.no_grad():
        base = m(src, tgt)
        torch.testing.assert_close(m(torch.tensor([[5, 6, 7, 0, 0]]), tgt), base, atol=1e-5, rtol=1e-5)
        changed = m(src, torch.tensor([[1, 8, 20, 21]]))
    torch.testing.assert_close(changed[:, :2], base[:, :2], atol=1e-6, rtol=1e-6)


def test_initial_loss_near_log_vocab():
    torch.manual_seed(0)
    m = Transformer(60, 400, d_model=32, num_heads=4, d_ff=64, max_len=16, dropout=0.0)
    src, tgt_in, tgt_out = make_translation_batch([([5, 6, 7], [8, 9, 10]), ([9, 10], [11, 12])], 16)
    from llmcourse.train.losses import label_smoothed_cross_entropy

    with torch.no_grad():
        logits = m(src, tgt_in)
    for eps in (0.0, 0.1):
        loss = float(label_smoothed_cross_entropy(logits, tgt_out, eps, ignore_index=PAD_ID))
        assert abs(loss - math.log(400)) < 0.5


# ---------------------------------------------------------------- decoding


def _toy(dropout=0.0):
    torch.manual_seed(0)
    m = Transformer(30, 25, d_model=32, num_heads=4, d_ff=64, max_len=16, dropout=dropout)
    with torch.no_grad():
        m.projection.proj.bias[EOS_ID] += 1.0
    return m


def test_greedy_argmax_eos_padding_and_mode():
    m = _toy(dropout=0.3).train()
    src = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11], [12, 0, 0, 0]])
    out = greedy_translate(m, src, 10)
    assert m.training and out.dtype == torch.long and out.shape[0] == 3 and out.shape[1] <= 10
    assert torch.equal(out, greedy_translate(m, src, 10))
    m.eval()
    prefix = torch.cat([torch.full((3, 1), SOS_ID), out[:, :-1]], 1)
    with torch.no_grad():
        sm = make_src_mask(src)
        am = m.projection(m.decode(prefix, m.encode(src, sm), sm, make_tgt_mask(prefix))).argmax(-1)
    for b, row in enumerate(out.tolist()):
        stop = row.index(EOS_ID) + 1 if EOS_ID in row else len(row)
        assert row[:stop] == am[b, :stop].tolist()
        assert all(x == PAD_ID for x in row[stop:])
    with pytest.raises(ValueError):
        greedy_translate(m, src, 99)


def test_verbose_cross_weights():
    m = _toy().eval()
    src = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    v = greedy_translate_verbose(m, src, 6)
    assert torch.equal(v["tokens"], greedy_translate(m, src, 6))
    w = v["cross_weights"][-1]
    assert w.shape == (2, 4, v["tokens"].shape[1], 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    assert (w[0, ..., 3] == 0).all()                                   # the PAD source position gets no weight
    assert ((v["probs"] > 0) & (v["probs"] <= 1)).all()


# ---------------------------------------------------------------- chrF


@pytest.mark.parametrize("hyp,ref,expected", [
    (["the cat sat"], ["the cat sat"], 100.0),
    (["abc"], ["xyz"], 0.0),
    (["the cat sat"], ["the cat sat on the mat"], 49.5935),
    (["the cat sat on the mat"], ["the cat sat"], 79.7386),
    (["tac eht"], ["the cat"], 16.6667),
    (["the cat", "a dog"], ["the cat", "the dog"], 63.8322),
    (["a b"], ["ab"], 100.0),
    (["तुम कैसे हो"], ["तुम कैसे हो?"], 88.3978),
])
def test_chrf_f06_3(hyp, ref, expected):
    assert chrf(hyp, ref) == pytest.approx(expected, abs=1e-4)


def test_chrf_unigram_by_hand_and_errors():
    # n=1, beta=1: "ab" vs "abc": P = 2/2, R = 2/3 -> F1 = 0.8
    assert chrf(["ab"], ["abc"], n=1, beta=1.0) == pytest.approx(80.0)
    with pytest.raises(ValueError):
        chrf(["a"], ["a", "b"])
    with pytest.raises(ValueError):
        chrf("abc", "abc")


def test_chrf_equals_sacrebleu_on_ordinary_sentences():
    """An independent implementation: sacrebleu's CHRF(char_order=6, word_order=0, beta=2) gives the same
    corpus score whenever every hypothesis and every reference has at least n = 6 non-space characters
    (fixtures, and real Tatoeba sentences scored against other sentences, so that matches are partial)."""
    sacrebleu = pytest.importorskip("sacrebleu")
    sb = sacrebleu.metrics.CHRF(char_order=6, word_order=0, beta=2)
    from llmcourse.data.translation import load_translation_pairs

    pairs = [p for p in load_translation_pairs() if min(len("".join(p.en.split())), len("".join(p.hi.split()))) >= 6]
    pairs = pairs[:120]
    cases = [
        (["the cat sat"], ["the cat sat on the mat"]),
        (["the cat sat on the mat"], ["the cat sat"]),
        (["the cat sat", "a big dog"], ["the cat sat", "the big dog"]),
        (["तुम कैसे हो"], ["तुम कैसे हो?"]),
        ([p.hi for p in pairs[:60]], [p.hi for p in pairs[1:61]]),
        ([p.en for p in pairs[60:]], [p.en.lower() for p in reversed(pairs[60:])]),
    ]
    for hyp, ref in cases:
        assert all(len("".join(t.split())) >= 6 for t in hyp + ref)
        assert chrf(hyp, ref) == pytest.approx(sb.corpus_score(hyp, [ref]).score, abs=1e-6)


def test_chrf_differs_from_sacrebleu_on_sentences_shorter_than_n():
    """The documented difference: for a hypothesis shorter than n characters the course's definition keeps
    every order with a reference k-gram (P_k = R_k = 0 there), sacrebleu's effective order ("eff:yes")
    averages over the orders the hypothesis has. "ab" vs "abcd", worked out by hand:
    course: orders 1-4, P = (1 + 1 + 0 + 0)/4, R = (2/4 + 1/3 + 0 + 0)/4;
    sacrebleu: orders 1-2, P = 1, R = (2/4 + 1/3)/2."""
    sacrebleu = pytest.importorskip("sacrebleu")
    sb = sacrebleu.metrics.CHRF(char_order=6, word_order=0, beta=2)

    def f(p, r, beta=2.0):
        return 100 * (1 + beta**2) * p * r / (beta**2 * p + r)

    course = f((1 + 1) / 4, (2 / 4 + 1 / 3) / 4)
    effective = f(1.0, (2 / 4 + 1 / 3) / 2)
    assert course == pytest.approx(23.5849, abs=1e-4) and effective == pytest.approx(47.1698, abs=1e-4)
    assert chrf(["ab"], ["abcd"]) == pytest.approx(course, abs=1e-9)
    assert sb.corpus_score(["ab"], [["abcd"]]).score == pytest.approx(effective, abs=1e-9)
    # the second difference: sacrebleu does not count a sentence's hypothesis k-grams of an order its
    # reference is too short for. "abcdef" vs "abcd": orders 5-6 have 2 + 1 hypothesis k-grams and no
    # reference k-grams: the course keeps them (P_5 = P_6 = 0), sacrebleu drops both orders.
    course = f((4 / 6 + 3 / 5 + 2 / 4 + 1 / 3) / 6, (1 + 1 + 1 + 1) / 6)
    effective = f((4 / 6 + 3 / 5 + 2 / 4 + 1 / 3) / 4, 1.0)
    assert chrf(["abcdef"], ["abcd"]) == pytest.approx(course, abs=1e-9)
    assert sb.corpus_score(["abcdef"], [["abcd"]]).score == pytest.approx(effective, abs=1e-9)


# ---------------------------------------------------------------- training pieces


def test_noam_factor_f06_5():
    assert noam_factor_for_peak(1e-3, 128, 400) == pytest.approx(0.22627, abs=1e-5)


def test_short_training_reduces_loss_and_pad_ignored():
    torch.manual_seed(0)
    data = [([4 + i % 7, 5 + i % 5], [6 + i % 7, 7 + i % 5]) for i in range(40)]
    m = Transformer(20, 20, d_model=32, num_heads=4, d_ff=64, max_len=8, dropout=0.0)
    before = evaluate_loss(m, data, 16, 8)
    hist = train_translation(m, data, 40, 16, 8, warmup=10, factor=noam_factor_for_peak(3e-3, 32, 10),
                             val_encoded=data, eval_every=20, progress=False)
    assert hist["val_loss"][-1] < before - 0.5
    assert hist["lr"][9] == pytest.approx(3e-3, rel=1e-6)            # the peak sits at step = warmup
    assert not m.training


def test_early_stopping_keeps_best_validation_weights():
    """patience: the weights returned are those of the lowest validation loss; stop after `patience` bad evals."""
    train = [([4 + i % 7, 5 + i % 5], [6 + i % 7, 7 + i % 5]) for i in range(40)]
    val = [([4 + i % 7, 5 + i % 5], [12 + i % 5, 6 + i % 7]) for i in range(40)]     # same sources, other targets
    kw = dict(val_encoded=val, eval_every=5, progress=False)

    def run(**extra):
        torch.manual_seed(0)
        m = Transformer(20, 20, d_model=32, num_heads=4, d_ff=64, max_len=8, dropout=0.0)
        return m, train_translation(m, train, 80, 16, 8, warmup=10, factor=noam_factor_for_peak(3e-3, 32, 10),
                                    **kw, **extra)

    _, full = run()
    losses, steps = full["val_loss"], full["val_step"]
    # the rule, replayed on the un-stopped run's evaluations (same seed, no dropout: the same trajectory)
    best, bad, stop_at = 0, 0, steps[-1]
    for k in range(1, len(losses)):
        if losses[k] < losses[best]:
            best, bad = k, 0
        else:
            bad += 1
            if bad >= 2:
                stop_at = steps[k]
                break
    assert stop_at < steps[-1], "the fixture must make the validation loss turn upwards"
    m, hist = run(patience=2)
    assert (hist["best_step"], hist["stopped_step"]) == (steps[best], stop_at)
    assert hist["best_val_loss"] == pytest.approx(losses[best], rel=1e-5)
    assert evaluate_loss(m, val, 64, 8) == pytest.approx(losses[best], rel=1e-5)      # the best weights came back
    with pytest.raises(ValueError, match="patience"):
        train_translation(m, train, 5, 16, 8, warmup=2, factor=1.0, patience=2, progress=False)


# ---------------------------------------------------------------- widgets (compute functions and static fallbacks)


def test_romanize():
    from llmcourse.viz.translation import romanize

    assert romanize("नमस्ते") == "namaste"          # virama drops the inherent vowel
    assert romanize("मेरी") == "merī" and romanize("क्या") == "kyā"
    assert romanize("hello.") == "hello."


def test_alignment_and_translation_views_and_static_figures():
    from matplotlib.figure import Figure

    from llmcourse.viz import base
    from llmcourse.viz.translation import (
        alignment_view,
        draw_training_curves,
        show_alignment_explorer,
        show_training_monitor,
        show_translation_box,
        translation_view,
    )

    src_tok, tgt_tok = load_tatoeba_tokenizers(100)
    torch.manual_seed(0)
    m = Transformer(src_tok.vocab_size, tgt_tok.vocab_size, d_model=32, num_heads=4, d_ff=64, max_len=12).eval()
    v = alignment_view(m, src_tok, tgt_tok, "I am happy.")
    assert v["weights"].shape == (len(v["tgt_tokens"]), len(v["src_tokens"]))
    torch.testing.assert_close(v["weights"].sum(-1), torch.ones(len(v["tgt_tokens"])))
    assert v["src_tokens"] == [src_tok.itos[i] for i in src_tok.encode("I am happy.")]
    tv = translation_view(m, src_tok, tgt_tok, "I am happy.")
    assert len(tv["tokens"]) == len(tv["probs"]) and all(0 < p <= 1 for p in tv["probs"])
    hist = {"step": list(range(1, 31)), "loss": [5.0 - 0.1 * i for i in range(30)], "lr": [1e-3] * 30,
            "val_step": [10, 20, 30], "val_loss": [4.0, 3.5, 3.2]}
    assert isinstance(draw_training_curves(hist, 12.3), Figure)
    for shown in (show_alignment_explorer(m, src_tok, tgt_tok, ["Hi.", "Go.", "Come here."], static=True),
                  show_training_monitor(hist, static=True),
                  show_translation_box(m, src_tok, tgt_tok, ["Hi.", "Go."], static=True)):
        assert isinstance(shown, base.StaticFigure) and shown._repr_png_().startswith(b"\x89PNG")


def test_live_widgets_build():
    pytest.importorskip("ipywidgets")
    from llmcourse.viz.translation import show_alignment_explorer, show_translation_box

    src_tok, tgt_tok = load_tatoeba_tokenizers(100)
    torch.manual_seed(0)
    m = Transformer(src_tok.vocab_size, tgt_tok.vocab_size, d_model=32, num_heads=4, d_ff=64, max_len=12).eval()
    w = show_alignment_explorer(m, src_tok, tgt_tok, ["Hi.", "Come here."], static=False)
    assert "llmcourse-w06-1" in w._dom_classes
    assert "llmcourse-w06-3" in show_translation_box(m, src_tok, tgt_tok, ["Hi."], static=False)._dom_classes
    from llmcourse.viz.translation import make_training_monitor

    box, redraw = make_training_monitor(static=False)
    redraw({"step": [1, 2], "loss": [3.0, 2.0], "lr": [1e-4, 2e-4], "val_step": [2], "val_loss": [2.5]})
    assert "llmcourse-w06-2" in box._dom_classes and make_training_monitor(static=True) == (None, None)


def test_shipped_checkpoint(pairs):
    from llmcourse.train.seq2seq import (
        TRANSLATE_TINY_RECIPE,
        evaluate_chrf,
        load_translate_tiny,
        translate_tiny_path,
    )

    assert translate_tiny_path().stat().st_size < 5_000_000
    model, ckpt = load_translate_tiny()
    assert ckpt["recipe"] == TRANSLATE_TINY_RECIPE and not model.training
    en, hi = load_tatoeba_tokenizers(ckpt["recipe"]["num_merges"])
    assert (model.src_embed.vocab_size, model.tgt_embed.vocab_size) == (en.vocab_size, hi.vocab_size)
    _, val, _ = split_pairs(pairs)
    score, hyps = evaluate_chrf(model, val, en, hi, model.max_len)
    assert ckpt["val_chrf"] >= 20 and abs(score - ckpt["val_chrf"]) < 2.0     # float16 storage moves it slightly
    assert hyps == evaluate_chrf(model, val, en, hi, model.max_len)[1]
