"""Unit 01 (tokenization): the library pieces, their error messages and the widgets' compute functions.

Independent oracles: the syllabus fixtures F01.1–F01.5 (literal values below), a Sennrich-style BPE
written here with regular expressions on space-separated symbols (a different algorithm shape from
the library's), tiktoken's own ``get_encoding("gpt2")`` loaded from a cache folder, and the window
formulas ``x = ids[s:s+L]``, ``y = ids[s+1:s+L+1]``.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
import torch

import llmcourse
from llmcourse.data import tokenizers as T
from llmcourse.data.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    bpe_encode_word,
    bpe_trace,
    bpe_train,
    encode_with_specials,
    load_gpt2_encoding,
    merge_pair,
    pair_counts,
)
from llmcourse.data.windows import GPTWindowDataset, create_dataloader
from llmcourse.viz import tokenization as V

TOY = {"old": 7, "older": 3, "finest": 9, "lowest": 4}
EOW = "</w>"
F011 = [("e", "s"), ("es", "t"), ("est", EOW), ("l", "d"), ("o", "ld"), ("f", "i"), ("fi", "n"), ("fin", "est</w>"),
        ("old", EOW), ("l", "o"), ("lo", "w"), ("low", "est</w>"), ("e", "r"), ("er", EOW), ("old", "er</w>")]


@pytest.fixture(scope="module")
def verdict():
    return llmcourse.load_text("the-verdict")


@pytest.fixture(scope="module")
def shakespeare():
    return llmcourse.load_text("tinyshakespeare")


@pytest.fixture(scope="module")
def enc():
    return load_gpt2_encoding()


@pytest.fixture(scope="module")
def verdict_ids(verdict):
    return llmcourse.gpt2_encoding().encode(verdict)


# ----------------------------------------------------------------------------- CharTokenizer


def test_char_tokenizer_f015(shakespeare):
    tok = CharTokenizer.from_text(shakespeare)
    assert tok.vocab_size == 65
    assert "".join(tok.chars) == "\n !$&',-.3:;?" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "abcdefghijklmnopqrstuvwxyz"
    assert [tok.encode(c)[0] for c in "\n !Aaz"] == [0, 1, 2, 13, 39, 64]
    assert len(tok.encode("Hello, world!")) == 13


def test_char_tokenizer_round_trip_and_positions(shakespeare):
    tok = CharTokenizer.from_text(shakespeare)
    rng = random.Random(0)
    for _ in range(50):
        a = rng.randrange(len(shakespeare) - 200)
        s = shakespeare[a: a + rng.randint(0, 200)]
        assert tok.decode(tok.encode(s)) == s
    assert CharTokenizer(["c", "a", "b"]).encode("abc") == [1, 2, 0]
    assert CharTokenizer(["c", "a", "b"]).decode(torch.tensor([2, 0])) == "bc"
    assert tok.encode("") == []


@pytest.mark.parametrize("call, exc, words", [
    (lambda t: t.encode("Hello ✓ world €"), ValueError, ["'✓'", "position 6"]),
    (lambda t: t.decode([0, 99]), ValueError, ["99"]),
    (lambda t: t.decode([0.5]), ValueError, ["integers"]),
    (lambda t: t.encode(3), TypeError, ["str"]),
])
def test_char_tokenizer_errors(shakespeare, call, exc, words):
    tok = CharTokenizer.from_text(shakespeare)
    with pytest.raises(exc) as info:
        call(tok)
    for w in words:
        assert w in str(info.value)


def test_char_tokenizer_construction_errors():
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")
    with pytest.raises(ValueError, match="at least one"):
        CharTokenizer([])
    with pytest.raises(ValueError, match="more than once"):
        CharTokenizer(["a", "b", "a"])
    with pytest.raises(ValueError, match="single character"):
        CharTokenizer(["ab"])


# ----------------------------------------------------------------------------- BPE: an independent oracle


def sennrich_bpe(word_counts, num_merges, eow=EOW):
    """BPE on space-separated symbol strings with regex replacement (lexicographically smallest tie)."""
    vocab = {" ".join(list(w) + [eow]): c for w, c in word_counts.items()}
    merges = []
    for _ in range(num_merges):
        stats = Counter()
        for word, c in vocab.items():
            syms = word.split(" ")
            for i in range(len(syms) - 1):
                stats[syms[i], syms[i + 1]] += c
        if not stats:
            break
        top = max(stats.values())
        best = sorted(p for p, c in stats.items() if c == top)[0]
        merges.append(best)
        pattern = re.compile(r"(?<!\S)" + re.escape(best[0] + " " + best[1]) + r"(?!\S)")
        vocab = {pattern.sub(best[0] + best[1], w): c for w, c in vocab.items()}
    return merges


def test_sennrich_oracle_reproduces_f011():
    assert sennrich_bpe(TOY, 100) == F011  # the oracle itself against the syllabus


def test_bpe_train_f011():
    assert bpe_train(TOY, 100) == F011
    assert bpe_train(TOY, 4) == F011[:4]
    assert bpe_train(TOY, 0) == []
    assert bpe_train(TOY, 3, end_of_word="_") == [("e", "s"), ("es", "t"), ("est", "_")]


def test_bpe_initial_counts_and_ties():
    start = {w: list(w) + [EOW] for w in TOY}
    counts = pair_counts(start, TOY)
    syllabus = {"es": 13, "st": 13, "t</w>": 13, "ld": 10, "ol": 10, "fi": 9, "in": 9, "ne": 9, "d</w>": 7, "lo": 4,
                "ow": 4, "we": 4, "de": 3, "er": 3, "r</w>": 3}
    assert {a + b: c for (a, b), c in counts.items()} == syllabus
    assert len({s for v in start.values() for s in v}) == 12
    states = bpe_trace(TOY, 15)
    assert [k + 1 for k in range(15) if len(states[k].tied) > 1] == [1, 2, 4, 6, 7, 10, 11, 13, 14]
    assert states[-1].merges == F011 and states[-1].next_merge is None
    assert states[2].segmentation["finest"] == ["f", "i", "n", "est", EOW]
    assert states[2].segmentation["lowest"] == ["l", "o", "w", "est", EOW]
    assert states[12].segmentation == {"old": ["old</w>"], "older": ["old", "e", "r", EOW],
                                       "finest": ["finest</w>"], "lowest": ["lowest</w>"]}


def test_bpe_other_tie_rules_diverge_where_the_syllabus_says():
    first = bpe_trace(TOY, 15, tie_break="first_seen")[-1].merges
    assert first[:3] == F011[:3] and first[3] == ("o", "l") and first[4] == ("ol", "d")
    assert first[12] == ("old", "e")
    assert bpe_trace(TOY, 1, tie_break="lexmax")[-1].merges == [("t", EOW)]


def _random_corpus(rng):
    alphabet = rng.choice(["ab", "abc", "aabbc", "lowerst", "xyz"])
    words = {}
    while len(words) < rng.randint(2, 7):
        words["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))] = rng.randint(1, 9)
    return words


def test_bpe_train_matches_the_oracle_and_ignores_dict_order():
    rng = random.Random(5)
    for _ in range(40):
        corpus, n = _random_corpus(rng), rng.randint(1, 30)
        merges = bpe_train(corpus, n)
        assert merges == sennrich_bpe(corpus, n), corpus
        items = list(corpus.items())
        rng.shuffle(items)
        assert bpe_train(dict(items), n) == merges


def test_bpe_train_replay_every_merge_was_maximal(verdict):
    corpus = dict(Counter(verdict.split()[:600]))
    merges = bpe_train(corpus, 40)
    seg = {w: list(w) + [EOW] for w in corpus}
    for m in merges:
        counts = Counter()
        for w, s in seg.items():
            for i in range(len(s) - 1):
                counts[s[i], s[i + 1]] += corpus[w]
        top = max(counts.values())
        assert counts[m] == top and m == min(p for p, c in counts.items() if c == top)
        seg = {w: merge_pair(s, m) for w, s in seg.items()}


@pytest.mark.parametrize("args, match", [
    (({}, 5), "empty"),
    (({"": 2}, 5), "non-empty"),
    (({"ab": 0}, 5), "positive"),
    (({"ab": 1.5}, 5), "positive"),
    (({"ab": 1}, -1), "non-negative"),
    (({"ab": 1}, 2, ""), "end_of_word"),
])
def test_bpe_train_errors(args, match):
    with pytest.raises(ValueError, match=match):
        bpe_train(*args)


def test_bpe_train_stops_early_and_speed(verdict):
    assert len(bpe_train({"ab": 1}, 10)) == 2  # a+b, then ab+</w>: one symbol left
    import time

    t0 = time.perf_counter()
    merges = bpe_train(dict(Counter(verdict.split())), 100)
    assert len(merges) == 100 and time.perf_counter() - t0 < 5.0  # syllabus: about 0.6 s on 2 cores


# ----------------------------------------------------------------------------- bpe_encode_word


@pytest.mark.parametrize("word, k, expected", [
    ("lowest", 2, ["l", "o", "w", "est", EOW]),
    ("lowest", 3, ["l", "o", "w", "est</w>"]),
    ("lowest", 12, ["lowest</w>"]),
    ("newest", 15, ["n", "e", "w", "est</w>"]),
    ("finer", 15, ["fin", "er</w>"]),
    ("bold", 15, ["b", "old</w>"]),
    ("older", 12, ["old", "e", "r", EOW]),
])
def test_bpe_encode_word_f012(word, k, expected):
    assert bpe_encode_word(word, F011[:k]) == expected


def test_bpe_encode_word_overlaps_rank_order_and_spelling(verdict):
    assert bpe_encode_word("aaa", [("a", "a")]) == ["aa", "a", EOW]
    assert bpe_encode_word("aaaa", [("a", "a")]) == ["aa", "aa", EOW]
    assert bpe_encode_word("abc", [("b", "c"), ("a", "b")]) == ["a", "bc", EOW]
    merges = bpe_train(dict(Counter(verdict.split())), 60)
    rng = random.Random(3)
    for _ in range(200):
        w = "".join(rng.choice("etaoinshrdlu,.") for _ in range(rng.randint(1, 12)))
        assert "".join(bpe_encode_word(w, merges)) == w + EOW
    # encoding a training word reproduces its training segmentation
    corpus = dict(Counter(verdict.split()))
    final = bpe_trace(corpus, 60)[-1].segmentation
    for w in list(corpus)[:300]:
        assert bpe_encode_word(w, merges) == final[w]


def test_bpe_encode_word_errors():
    with pytest.raises(ValueError, match="non-empty word"):
        bpe_encode_word("", F011)
    with pytest.raises(ValueError, match="end_of_word"):
        bpe_encode_word("ab", F011, end_of_word="")


# ----------------------------------------------------------------------------- whole-text tokenizers


def test_bpe_tokenizer_counts_round_trip_and_specials(verdict):
    corpus = Counter(verdict.split())
    alphabet = {c for w in corpus for c in w}
    tok0 = BPETokenizer([], alphabet)
    assert len(tok0.encode(verdict)) == sum(not c.isspace() for c in verdict) + len(verdict.split())
    tok = BPETokenizer.train(verdict, 50)
    assert tok.merges == bpe_train(dict(corpus), 50)
    assert tok.vocab_size == 2 + len(alphabet) + 1 + 50
    assert tok.decode(tok.encode("the picture")) == "the picture"
    assert tok.encode("") == []
    assert "<|unk|>" in tok.decode(tok.encode("東京"))
    ids = tok.encode("end<|endoftext|>start", allowed_special={"<|endoftext|>"})
    assert tok.special_tokens["<|endoftext|>"] in ids
    with pytest.raises(ValueError, match="allowed_special"):
        tok.encode("end<|endoftext|>")
    with pytest.raises(ValueError, match="unknown special token '</endoftext>'.*did you mean '<\\|endoftext\\|>'"):
        tok.encode("x", allowed_special={"</endoftext>"})
    with pytest.raises(TypeError, match="set"):
        tok.encode("x", allowed_special="<|endoftext|>")
    with pytest.raises(ValueError, match="outside"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="empty"):
        BPETokenizer.train("   ", 5)


def test_word_tokenizer(verdict):
    tok = WordTokenizer.from_text(verdict)
    assert tok.tokenize("I had runing.") == ["I", "had", "<|unk|>", "."]
    assert tok.encode("it, it.")[1] == tok.stoi[","]
    assert tok.vocab_size == 2 + len(set(re.findall(r"\w+|[^\w\s]", verdict)))
    with pytest.raises(ValueError):
        WordTokenizer.from_text("  ")


# ----------------------------------------------------------------------------- GPT-2


F013 = [("Hello, world! Attention is all you need.<|endoftext|>", [15496, 11, 995, 0, 47406, 318, 477, 345, 761, 13, 50256]),
        ("hello world", [31373, 995]), ("Building", [25954]),
        ("Your journey starts with one step", [7120, 7002, 4940, 351, 530, 2239]),
        (" Akwirw ier", [9084, 86, 343, 86, 220, 959])]


def test_load_gpt2_encoding_f013(enc):
    assert enc.n_vocab == 50257 == 256 + 50_000 + 1 and enc.eot_token == 50256
    for text, ids in F013:
        assert enc.encode(text, allowed_special={"<|endoftext|>"}) == ids
    assert [enc.decode([i]) for i in enc.encode(" Akwirw ier")] == [" Ak", "w", "ir", "w", " ", "ier"]
    assert len(enc.encode("नमस्ते")) == 12 and len("नमस्ते".encode()) == 18
    with pytest.raises(ValueError):
        enc.encode("<|endoftext|>")
    assert enc.encode("<|endoftext|>", disallowed_special=()) == [27, 91, 437, 1659, 5239, 91, 29]


def test_load_gpt2_encoding_texts(enc, verdict, shakespeare, verdict_ids):
    ids = enc.encode(verdict)
    assert len(ids) == 5145 and ids[:10] == [40, 367, 2885, 1464, 1807, 3619, 402, 271, 10899, 2138]
    assert enc.decode(ids) == verdict
    sh = enc.encode(shakespeare)
    cut = int(0.9 * len(shakespeare))
    assert len(sh) == 338025
    assert (len(enc.encode(shakespeare[:cut])), len(enc.encode(shakespeare[cut:]))) == (301966, 36059)
    for s in ["naïve café — Grüße", "東京タワー 🗼", "tab\tand\nnewline"]:
        assert enc.decode(enc.encode(s)) == s


def test_load_gpt2_encoding_equals_tiktoken_get_encoding(enc, tmp_path, monkeypatch, verdict, shakespeare):
    import tiktoken
    import tiktoken.registry

    cache = llmcourse.data.tiktoken_cache_dir(tmp_path / "tiktoken_cache")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # force a fresh load from the cache folder
    official = tiktoken.get_encoding("gpt2")
    assert official.n_vocab == enc.n_vocab and official.eot_token == enc.eot_token
    assert all(official.decode_single_token_bytes(i) == enc.decode_single_token_bytes(i) for i in range(50257))
    assert official.encode(verdict) == enc.encode(verdict)
    assert official.encode(shakespeare[:200_000]) == enc.encode(shakespeare[:200_000])


def test_load_gpt2_encoding_paths_and_errors(tmp_path):
    path = llmcourse.data_path("gpt2-bpe", "gpt2.tiktoken")
    for arg in (str(path), path):
        assert load_gpt2_encoding(arg).encode("hello world") == [31373, 995]
    with pytest.raises(FileNotFoundError, match="no GPT-2 ranks file"):
        load_gpt2_encoding(tmp_path / "missing.tiktoken")
    with pytest.raises(ValueError, match="not GPT-2's ranks file"):
        load_gpt2_encoding(llmcourse.data_path("the-verdict"))


def test_encode_with_specials(enc):
    assert encode_with_specials(enc, "a<|endoftext|>", {"<|endoftext|>"})[-1] == 50256
    assert encode_with_specials(enc, "a<|endoftext|>", "all")[-1] == 50256
    with pytest.raises(ValueError, match="did you mean '<\\|endoftext\\|>'"):
        encode_with_specials(enc, "x</endoftext>", {"</endoftext>"})
    with pytest.raises(ValueError, match="disallowed special token"):
        encode_with_specials(enc, "x<|endoftext|>")
    # tiktoken alone silently ignores the misspelt name (the reason for the helper)
    assert 50256 not in enc.encode("x</endoftext>", allowed_special={"</endoftext>"})


# ----------------------------------------------------------------------------- windows


def test_windows_f014(verdict_ids):
    assert len(verdict_ids) == 5145
    ds = GPTWindowDataset(verdict_ids, 4, 1)
    assert len(ds) == 5141
    x0, y0 = ds[0]
    assert x0.tolist() == [40, 367, 2885, 1464] and y0.tolist() == [367, 2885, 1464, 1807]
    assert ds[1][0].tolist() == [367, 2885, 1464, 1807]
    ds4 = GPTWindowDataset(verdict_ids, 4, 4)
    assert len(ds4) == 1286
    assert ds4[1][0].tolist() == [1807, 3619, 402, 271] and ds4[1][1].tolist() == [3619, 402, 271, 10899]
    assert x0.dtype == torch.long and x0.shape == (4,)


@pytest.mark.parametrize("n, L, stride", [(300, 8, 3), (101, 10, 10), (50, 7, 11), (12, 11, 1), (9, 1, 2)])
def test_windows_formulas(verdict_ids, n, L, stride):
    data = verdict_ids[:n]
    for src in (data, torch.tensor(data), torch.tensor(data, dtype=torch.int32)):
        ds = GPTWindowDataset(src, L, stride)
        starts = list(range(0, n - L, stride))
        assert len(ds) == len(starts)
        for i, s in enumerate(starts):
            x, y = ds[i]
            assert x.tolist() == data[s: s + L] and y.tolist() == data[s + 1: s + L + 1]
            assert torch.equal(x[1:], y[:-1]) and x.dtype == y.dtype == torch.long
        assert torch.equal(ds[-1][0], ds[len(ds) - 1][0])
        with pytest.raises(IndexError):
            ds[len(ds)]
        if stride >= L and len(ds) > 1:  # disjoint inputs
            assert starts[1] >= starts[0] + L


@pytest.mark.parametrize("args, exc, match", [
    (([1, 2, 3, 4], 4, 1), ValueError, "4 tokens.*context_length \\+ 1 = 5"),
    (([], 1, 1), ValueError, "0 tokens"),
    (([1, 2, 3], 0, 1), ValueError, "context_length"),
    (([1, 2, 3], 1, 0), ValueError, "stride"),
    (([1, 2, 3], 1.5, 1), ValueError, "context_length"),
    ((torch.zeros(2, 5, dtype=torch.long), 2, 1), ValueError, "1-D"),
    ((torch.rand(10), 2, 1), ValueError, "integer"),
    (([1, 2.5, 3], 1, 1), ValueError, "integer"),
    (("some text", 2, 1), TypeError, "encode the text first"),
])
def test_windows_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        GPTWindowDataset(*args)


def test_create_dataloader(verdict_ids):
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = list(create_dataloader(verdict_ids, 8, 4, 4, seed=0))
    assert torch.equal(torch.get_rng_state(), state), "the loader must not draw from the global generator"
    b = list(create_dataloader(verdict_ids, 8, 4, 4, seed=0))
    c = list(create_dataloader(verdict_ids, 8, 4, 4, seed=1))
    assert len(a) == 1286 // 8
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, c))
    xb, yb = a[0]
    assert xb.shape == yb.shape == (8, 4) and xb.dtype == torch.long and torch.equal(xb[:, 1:], yb[:, :-1])
    ordered = list(create_dataloader(verdict_ids, 8, 4, 4, shuffle=False, drop_last=False))
    assert len(ordered) == 1286 // 8 + 1 and ordered[-1][0].shape == (1286 % 8, 4)
    assert ordered[0][0][1].tolist() == [1807, 3619, 402, 271]
    assert create_dataloader(verdict_ids, 8, 4, 4).num_workers == 0
    with pytest.raises(ValueError, match="batch_size"):
        create_dataloader(verdict_ids, 0, 4, 4)
    with pytest.raises(ValueError, match="context_length"):
        create_dataloader(verdict_ids[:3], 2, 4, 1)


def test_library_exports():
    assert llmcourse.bpe_train is bpe_train and llmcourse.CharTokenizer is CharTokenizer
    assert llmcourse.create_dataloader is create_dataloader and llmcourse.load_gpt2_encoding is load_gpt2_encoding
    assert T.END_OF_WORD == EOW


# ----------------------------------------------------------------------------- widgets (compute functions)


def test_parse_corpus():
    assert V.parse_corpus("old 7\nolder 3\n\nfinest 9\nlowest 4") == TOY
    assert V.parse_corpus("a\na 2") == {"a": 3}
    for bad, match in [("", "empty"), ("old seven", "line 1.*integer"), ("a 1\nb 0", "line 2.*positive"),
                       ("a b c", "line 1")]:
        with pytest.raises(ValueError, match=match):
            V.parse_corpus(bad)


def test_pair_table_marks_best_and_ties():
    rows = V.pair_table(bpe_trace(TOY, 0)[0], top=None)
    assert rows[0] == (("e", "s"), 13, "best")
    assert [r[2] for r in rows[:4]] == ["best", "tied", "tied", ""]
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
    after3 = V.pair_table(bpe_trace(TOY, 3)[-1], top=2)
    assert after3 == [(("l", "d"), 10, "best"), (("o", "l"), 10, "tied")]


def test_sliding_windows_layout():
    rows = V.sliding_windows(40, 4, 1)
    assert len(rows) == 36 and rows[0].inputs == range(0, 4) and rows[0].targets == range(1, 5)
    assert all(len(r.overlap) == 3 for r in rows[1:]) and len(rows[0].overlap) == 0
    rows4 = V.sliding_windows(40, 4, 4, max_windows=5)
    assert [r.start for r in rows4] == [0, 4, 8, 12, 16] and all(len(r.overlap) == 0 for r in rows4)
    assert [r.start for r in V.sliding_windows(40, 6, 4)] == list(range(0, 34, 4))
    assert all(len(r.overlap) == 2 for r in V.sliding_windows(40, 6, 4)[1:])
    with pytest.raises(ValueError):
        V.sliding_windows(4, 4, 1)


def test_layout_chips_wraps():
    lay = V.layout_chips(["abc", "de", "fghij", "k"], width=8)
    assert lay == [(0, 0, 3), (0, 4, 2), (1, 0, 5), (1, 6, 1)]
    assert all(col + n <= 8 for _, col, n in lay)


def test_compare_tokenizers(verdict, enc):
    text = "I HAD always thought Jack Gisburn 東京"
    bpe = BPETokenizer.train(verdict, 30)
    views = V.compare_tokenizers(text, WordTokenizer.from_text(verdict), CharTokenizer.from_text(verdict), bpe, enc)
    by = {v.name.split(" (")[0]: v for v in views}
    assert by["GPT-2"].ids == enc.encode(text) and by["GPT-2"].n_tokens == len(enc.encode(text))
    assert by["character"].n_tokens == len(text) and by["character"].ids[-1] is None
    assert by["course BPE"].pieces == bpe.tokenize(text) and None in by["course BPE"].ids
    assert abs(by["character"].chars_per_token - 1.0) < 1e-12
    html = V.token_views_html(views)
    assert 'title="id 40"' in html and "not in the vocabulary" in html
    with pytest.raises(ValueError):
        V.compare_tokenizers("", gpt2=enc)


def test_chip_colour_is_stable():
    assert V.chip_colour(5) == V.chip_colour(5 + len(V._PALETTE)) and V.chip_colour(None) == "#e0e0e0"


def test_widgets_static_and_live(verdict, enc):
    from llmcourse.viz.base import StaticFigure

    pieces = [enc.decode([i]) for i in enc.encode(verdict)[:40]]
    first = verdict[: verdict.index(".") + 1]
    bpe = BPETokenizer.train(verdict, 20)
    cases = [("W01.1", lambda s: V.show_bpe_stepper(static=s)),
             ("W01.2", lambda s: V.show_tokenizer_comparison(first, bpe=bpe, gpt2=enc, static=s)),
             ("W01.3", lambda s: V.show_sliding_window(pieces, static=s))]
    for wid, make in cases:
        fig = make(True)
        assert isinstance(fig, StaticFigure) and fig.widget_id == wid
        assert fig._repr_png_()[:4] == b"\x89PNG"
        live = make(False)
        assert "llmcourse-widget" in live._dom_classes and f"llmcourse-{wid.lower().replace('.', '-')}" in live._dom_classes


def test_bpe_stepper_live_controls():
    w = V.show_bpe_stepper(static=False)
    editor, controls = w.children[0].children
    rule, buttons, status = controls.children
    merge, reset = buttons.children
    for _ in range(20):  # the toy corpus has only 15 merges
        merge.click()
    assert "<b>15</b>" in status.value and "finished" in status.value
    rule.value = "first seen"  # changing the rule starts over
    assert "<b>0</b>" in status.value
    editor.value = "old seven"
    assert "not an integer" in status.value


# ============================================================================ byte-level BPE (llmcourse.data.bytebpe)
# Oracles: tiktoken's GPT-2 ids, GPT-2's original release files vocab.bpe and gpt2.tiktoken (read by the grader's
# oracle, grader.checks.u01_tokenization._gpt2_bpe_oracle, with GPT-2's byte-to-character map: no code of
# llmcourse.data.bytebpe on that route), and a full recount written here.


@pytest.fixture(scope="module")
def gpt2_bytebpe():
    from llmcourse.data import bytebpe as B

    return B.gpt2_merges()


def test_gpt2_merges_equal_the_original_merges_file(gpt2_bytebpe):
    from grader.checks.u01_tokenization import _gpt2_bpe_oracle

    byte_ids, merges = gpt2_bytebpe
    want_ids, want_merges = _gpt2_bpe_oracle()
    expected = {(a, b): new for a, b, new in want_merges}
    assert len(expected) == 50_000 and merges == expected
    assert byte_ids == list(want_ids) and sorted(byte_ids) == list(range(256))


def test_byte_bpe_encode_equals_tiktoken(gpt2_bytebpe, verdict, shakespeare):
    from llmcourse.data import bytebpe as B

    byte_ids, merges = gpt2_bytebpe
    gpt2 = llmcourse.gpt2_encoding()
    eot = {"<|endoftext|>": 50256}
    for text in [verdict, shakespeare[:100_000], "naïve café 🙂 東京\n\n  x<|endoftext|>y 2024's", ""]:
        ids = B.byte_bpe_encode(text, merges, byte_ids, eot)
        assert ids == gpt2.encode(text, allowed_special="all")
        assert B.byte_bpe_decode(ids, merges, byte_ids, eot) == text


def _recount(words, counts):
    pc, wh = Counter(), {}
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pc[p] += counts[i]
            wh.setdefault(p, set()).add(i)
    return dict(pc), wh


def test_merge_step_equals_a_recount_and_touches_only_the_chunks_holding_the_pair():
    from llmcourse.data import bytebpe as B

    rng = random.Random(5)
    for _ in range(20):
        words = [[rng.randint(1, 3) for _ in range(rng.randint(1, 9))] for _ in range(25)]
        counts = [rng.randint(1, 5) for _ in words]
        pc, wh = B.count_pairs(words, counts)
        assert (pc, wh) == _recount(words, counts)
        for k in range(6):
            if not pc:
                break
            pair = max(pc, key=lambda p: (pc[p], [-x for x in p]))
            holders = set(wh[pair])
            before = [list(w) for w in words]
            B.merge_step(words, counts, pc, wh, pair, 100 + k)
            assert (pc, wh) == _recount(words, counts)
            assert all(words[i] == before[i] for i in range(len(words)) if i not in holders)
            assert pair not in pc


def test_byte_bpe_train_equals_the_naive_recount_and_respects_special_tokens(verdict):
    from llmcourse.data import bytebpe as B

    assert B.byte_bpe_train(verdict, 80) == B.byte_bpe_train_naive(verdict, 80)
    text = "low <|endoftext|> lower<|endoftext|>lowest <|a|>xx <|a|>"
    merges = B.byte_bpe_train(text, 40, ["<|endoftext|>", "<|a|>", "<|a|>xx"])
    assert merges == B.byte_bpe_train_naive(text, 40, ["<|a|>xx", "<|endoftext|>", "<|a|>"])
    assert ord("|") not in {x for m in merges for x in m}  # no chunk holds a special token's bytes
    assert B.split_chunks("a<|x|>b c", ["<|x|>"], keep_specials=True) == ["a", "<|x|>", "b", " c"]
    with pytest.raises(ValueError):
        B.byte_bpe_train(text, -1)
