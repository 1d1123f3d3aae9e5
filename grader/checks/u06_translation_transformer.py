"""Checks of unit 06 (the encoder–decoder Transformer for English→Hindi).

Oracles: ``torch.nn.Transformer`` (same weights, torch's mask convention), ``causal_mask`` from unit 00,
``torch.argmax`` for greedy decoding, and hand-computed chrF values (sacreBLEU is not a course
dependency). Fixtures F06.1–F06.3 come from the syllabus. Models are compared with shared weights: the
learner's module is built with the same arguments and loaded with the reference ``state_dict``.
"""

from __future__ import annotations

import torch

from ..core import check, module_facts, unwrap
from ..gradcheck import check_module_gradients, module_gradient_probe
from ..runner import also_blocked

U = "06"
T = torch.tensor
PAD, SOS, EOS = 0, 1, 2


def _ref_masks():
    from llmcourse.data import translation as tr

    return {"make_src_mask": tr.make_src_mask, "make_tgt_mask": tr.make_tgt_mask}


def _ref_batch():
    from llmcourse.data import translation as tr

    return {"make_translation_batch": tr.make_translation_batch}


def _ref_transformer():
    from llmcourse.data import translation as tr
    from llmcourse.models.transformer import Transformer

    return {"Transformer": Transformer, "make_src_mask": tr.make_src_mask, "make_tgt_mask": tr.make_tgt_mask}


def _ref_greedy():
    from llmcourse.train.decoding import greedy_translate

    return {"greedy_translate": greedy_translate}


def _ref_chrf():
    from llmcourse.train.metrics import chrf

    return {"chrf": chrf}


def _causal(t):
    from llmcourse.nn.masks import causal_mask

    return causal_mask(t)


def _padded_ids(lengths, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    x = torch.randint(4, vocab, (len(lengths), width), generator=g)
    for i, n in enumerate(lengths):
        x[i, n:] = PAD
    return x


# ================================================================== 06.make_masks

F061_SRC = T([[5, 6, 7, 0, 0]])
F061_SRC_MASK = T([[[[True, True, True, False, False]]]])
F061_TGT = T([[1, 8, 9, 0]])
F061_TGT_MASK = T([[[[True, False, False, False], [True, True, False, False],
                     [True, True, True, False], [True, True, True, False]]]])


@check(f"{U}.make_masks", ["make_src_mask", "make_tgt_mask"], _ref_masks)
def check_make_masks(t):
    out = t.run(lambda impl: impl.make_src_mask(F061_SRC))
    t.expect(isinstance(out, torch.Tensor), f"make_src_mask must return a tensor, got {type(out).__name__}")
    t.expect(out.dtype == torch.bool, f"make_src_mask must return a bool mask (True = real token), got {out.dtype}")
    t.compare(lambda impl: impl.make_src_mask(F061_SRC), F061_SRC_MASK,
              "make_src_mask([[5, 6, 7, 0, 0]]) (expected shape (B, 1, 1, S))")
    src = _padded_ids([6, 3, 1, 5], 30, seed=1)
    t.compare(lambda impl: impl.make_src_mask(src), (src != PAD)[:, None, None, :], "make_src_mask on a (4, 6) batch")
    # pad_id: padding is the given id, and 0 is then an ordinary token
    src_p = torch.where(src == PAD, 3, src)
    src_p[0, 0] = 0
    t.compare(lambda impl: impl.make_src_mask(src_p, pad_id=3), (src_p != 3)[:, None, None, :],
              "make_src_mask with pad_id=3 (id 0 is then an ordinary token)")

    out = t.run(lambda impl: impl.make_tgt_mask(F061_TGT))
    t.expect(isinstance(out, torch.Tensor) and out.dtype == torch.bool,
             f"make_tgt_mask must return a bool tensor, got {getattr(out, 'dtype', type(out).__name__)}")
    t.compare(lambda impl: impl.make_tgt_mask(F061_TGT), F061_TGT_MASK,
              "make_tgt_mask([[1, 8, 9, 0]]) (expected shape (B, 1, T, T) = padding & causal)")
    tgt = _padded_ids([5, 2, 7], 30, seed=2)
    tgt[:, 0] = SOS
    expected = (tgt != PAD)[:, None, None, :] & _causal(tgt.shape[1])
    out = t.run(lambda impl: impl.make_tgt_mask(tgt))
    t.expect(not isinstance(out, torch.Tensor) or out.shape != expected.shape or bool(out.any(-1).all()),
             "a query row of the target mask keeps no key at all (a PAD query): its softmax has nothing to normalise "
             "and gives NaN", bug="B06.tgt_mask_empty_rows")
    t.compare(lambda impl: impl.make_tgt_mask(tgt), expected,
              "make_tgt_mask on a (3, 7) batch: key padding (B, 1, 1, T) & causal_mask(T)")
    tgt_p = torch.where(tgt == PAD, 3, tgt)
    tgt_p[1, 1] = 0
    t.compare(lambda impl: impl.make_tgt_mask(tgt_p, pad_id=3), (tgt_p != 3)[:, None, None, :] & _causal(7),
              "make_tgt_mask with pad_id=3 (id 0 is then an ordinary token)")


# ================================================================== 06.make_translation_batch

F062_PAIRS = [([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])]
F062 = (T([[5, 6, 7], [5, 0, 0]]), T([[1, 8, 9, 0, 0], [1, 8, 9, 10, 11]]), T([[8, 9, 2, 0, 0], [8, 9, 10, 11, 2]]))


@check(f"{U}.make_translation_batch", ["make_translation_batch"], _ref_batch)
def check_make_translation_batch(t):
    out = t.run(lambda impl: impl.make_translation_batch(F062_PAIRS, 8))
    t.expect(isinstance(out, (tuple, list)) and len(out) == 3,
             "make_translation_batch must return a tuple (src, tgt_in, tgt_out)")
    t.expect(all(isinstance(x, torch.Tensor) and x.dtype == torch.long for x in out),
             "src, tgt_in and tgt_out must be torch.long tensors")
    for k, name in enumerate(("src", "tgt_in", "tgt_out")):
        t.compare(lambda impl: impl.make_translation_batch(F062_PAIRS, 8), F062[k], f"{name} for pairs {F062_PAIRS} (max_len=8)",
                  pick=lambda o, k=k: o[k])
    long_pairs = [(list(range(4, 14)), list(range(20, 32))), ([7, 8], [9])]
    ref = t.reference.make_translation_batch(long_pairs, 6)
    for k, name in enumerate(("src", "tgt_in", "tgt_out")):
        t.compare(lambda impl: impl.make_translation_batch(long_pairs, 6), ref[k],
                  f"{name} with truncation (source of 10 and target of 12 tokens, max_len=6)", pick=lambda o, k=k: o[k])
    ref = t.reference.make_translation_batch(F062_PAIRS, 8, pad_id=99, sos_id=97, eos_id=98)
    t.compare(lambda impl: impl.make_translation_batch(F062_PAIRS, 8, pad_id=99, sos_id=97, eos_id=98), ref,
              "the batch with pad_id=99, sos_id=97, eos_id=98")
    src, tgt_in, tgt_out = t.run(lambda impl: impl.make_translation_batch(long_pairs + F062_PAIRS, 7))
    both = (tgt_in[:, 1:] != PAD) & (tgt_out[:, :-1] != PAD)
    t.expect(bool((tgt_in[:, 1:][both] == tgt_out[:, :-1][both]).all()),
             "tgt_in[:, 1:] must equal tgt_out[:, :-1] wherever both are real tokens (teacher forcing)",
             bug="B06.tgt_not_shifted")


# ================================================================== 06.Transformer

CFG = dict(d_model=32, num_heads=4, d_ff=64, n_enc=2, n_dec=2, max_len=16, dropout=0.0)
V_SRC, V_TGT = 23, 19


def _reference_state(norm_first=True):
    from llmcourse.models.transformer import Transformer

    torch.manual_seed(0)
    return Transformer(V_SRC, V_TGT, **CFG, norm_first=norm_first).state_dict()


def _make(impl, norm_first=True):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return impl.Transformer(V_SRC, V_TGT, **CFG, norm_first=norm_first)


def _build(impl, state, norm_first=True):
    """The implementation's Transformer loaded with ``state`` (a reference state_dict), in eval mode."""
    m = _make(impl, norm_first)
    unwrap(m).load_state_dict(state)
    unwrap(m).eval()
    return m


def _batch():
    src = _padded_ids([7, 4, 2], V_SRC, seed=3)
    tgt = _padded_ids([6, 3, 5], V_TGT, seed=4)
    tgt[:, 0] = SOS
    return src, tgt


@check(f"{U}.Transformer", ["Transformer"], _ref_transformer)
def check_transformer(t):
    from llmcourse.models.transformer import Transformer as Ref
    from llmcourse.models.transformer import to_torch_transformer

    states = {nf: _reference_state(nf) for nf in (True, False)}  # inputs: the weights both sides load
    for norm_first in (True, False):
        facts = t.run(lambda impl, nf=norm_first: module_facts(_make(impl, nf)))
        t.expect(facts["is_module"], "Transformer must be an nn.Module")
        shapes = facts["state_dict"]
        keys = set(shapes)
        want_shapes = {k: tuple(v.shape) for k, v in states[norm_first].items()}
        want = set(want_shapes)
        if norm_first and want - keys and {k for k in want - keys if k.startswith(("encoder.norm", "decoder.norm"))}:
            t.fail(f"state_dict keys missing: {sorted(want - keys)}", bug="B06.no_final_norm")
        t.expect(keys == want, f"state_dict keys (norm_first={norm_first}): missing {sorted(want - keys)[:6]}, "
                               f"unexpected {sorted(keys - want)[:6]} (pos holds only a non-persistent buffer)")
        for k, shape in shapes.items():
            t.expect(tuple(shape) == want_shapes[k], f"{k} has shape {tuple(shape)}, expected {want_shapes[k]}")

    src, tgt = _batch()

    def logits(impl, s=src, g=tgt, norm_first=True):
        with torch.no_grad():
            return _build(impl, states[norm_first], norm_first)(s, g)

    ref_logits = logits(t.reference)
    t.compare(logits, ref_logits, "forward(src, tgt_in) logits vs the reference with the same weights (B=3, S=7, T=6)")
    t.compare(lambda impl: logits(impl, norm_first=False), logits(t.reference, norm_first=False),
              "logits of the post-LN model (norm_first=False) vs the reference")

    # oracle: nn.Transformer with the same weights, fed the same embedded inputs
    ref_model = _build(t.reference, states[True])
    tt = to_torch_transformer(ref_model)
    with torch.no_grad():
        oracle = tt(ref_model.pos(ref_model.src_embed(src)), ref_model.pos(ref_model.tgt_embed(tgt)),
                    tgt_mask=~_causal(tgt.shape[1]), src_key_padding_mask=src == PAD,
                    memory_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt == PAD)

    def decoded(impl):
        from llmcourse.data.translation import make_src_mask, make_tgt_mask

        m = _build(impl, states[True])
        with torch.no_grad():
            sm = make_src_mask(src)
            return m.decode(tgt, m.encode(src, sm), sm, make_tgt_mask(tgt))

    t.compare(decoded, oracle, "decode(tgt_in, encode(src, src_mask), src_mask, tgt_mask) vs torch.nn.Transformer "
                               "(norm_first=True, same weights)")
    t.expect(isinstance(ref_model, Ref), "internal: reference model")

    # properties
    base = t.run(logits)
    future = tgt.clone()
    future[:, 3:] = (future[:, 3:] + 5) % (V_TGT - 4) + 4
    t.compare(lambda impl: logits(impl, g=future), base[:, :3], "logits[:, :3] after changing target tokens 3… "
              "(the decoder must be causal: future target tokens may not change earlier logits)",
              pick=lambda o: o[:, :3])
    wide = torch.cat([src, torch.zeros(src.shape[0], 4, dtype=torch.long)], 1)
    t.compare(lambda impl: logits(impl, s=wide), base, "logits after appending 4 PAD columns to src (source padding "
              "must be masked in the encoder and in the cross-attention)")

    # pad_id: a model built with pad_id=5 pads with 5 (and 0 is an ordinary token)
    src5, tgt5 = torch.where(src == PAD, 5, src), torch.where(tgt == PAD, 5, tgt)
    src5[0, 1], tgt5[0, 2] = 0, 0

    def logits_pad5(impl):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            m = impl.Transformer(V_SRC, V_TGT, **CFG, pad_id=5)
        unwrap(m).load_state_dict(states[True])
        unwrap(m).eval()
        with torch.no_grad():
            return m(src5, tgt5)

    t.compare(logits_pad5, logits_pad5(t.reference), "logits of Transformer(..., pad_id=5) on a batch padded with 5 "
              "(id 0 is an ordinary token there) vs the reference")

    # every size argument at a non-default value: 2 heads, 3 encoder and 1 decoder blocks, max_len 40
    other = dict(CFG, num_heads=2, n_enc=3, n_dec=1, max_len=40)
    with torch.random.fork_rng():
        torch.manual_seed(3)
        ref_other = Ref(V_SRC, V_TGT, **other).eval()
    st_other = {k: v.clone() for k, v in ref_other.state_dict().items()}
    facts_other = t.run(lambda impl: module_facts(impl.Transformer(V_SRC, V_TGT, **other)))
    t.expect(facts_other.get("buffers") == module_facts(ref_other)["buffers"]
             and facts_other.get("state_dict") == module_facts(ref_other)["state_dict"],
             "Transformer(..., num_heads=2, n_enc=3, n_dec=1, max_len=40): the state_dict and buffers must follow "
             f"these arguments (n_enc, n_dec blocks; a positional table of max_len rows); got state_dict keys "
             f"{len(facts_other.get('state_dict') or {})} (expected {len(st_other)}) and buffers "
             f"{facts_other.get('buffers')}")

    def logits_other(impl):
        m = impl.Transformer(V_SRC, V_TGT, **other)
        unwrap(m).load_state_dict(st_other)
        unwrap(m).eval()
        with torch.no_grad():
            return m(src, tgt)

    with torch.no_grad():
        expected_other = ref_other(src, tgt)
    t.compare(logits_other, expected_other, "logits of Transformer(..., num_heads=2, n_enc=3, n_dec=1, max_len=40) "
              "with the same weights")

    # backpropagation reaches every parameter (embeddings, both stacks, the projection)
    check_module_gradients(t, module_gradient_probe(lambda impl: _build(impl, states[True]), [src, tgt]),
                    "Transformer forward(src, tgt_in)")

    # dropout: the argument reaches every dropout of the model; with dropout=0 train mode is deterministic
    def dropout_facts(impl):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            cfg = dict(CFG, dropout=0.3)
            m = unwrap(impl.Transformer(V_SRC, V_TGT, **cfg))
        ps = sorted({round(float(d.p), 6) for d in m.modules() if isinstance(d, torch.nn.Dropout)})
        m0 = _make(impl)
        unwrap(m0).load_state_dict(states[True])
        unwrap(m0).train()
        with torch.no_grad():
            return ps, m0(src, tgt)

    ps, train0 = t.run(dropout_facts)
    t.expect(ps == [0.3], f"Transformer(..., dropout=0.3): every dropout of the model must use p=0.3; the model's "
             f"nn.Dropout probabilities are {ps}", bug="B06.dropout_ignored")
    t.compare(lambda impl: dropout_facts(impl)[1], ref_logits, "Transformer(..., dropout=0.0) in train mode (no "
              "dropout anywhere: the same logits as in eval mode)")


# ================================================================== 06.greedy_translate

_GREEDY_CACHE: dict = {}


def _greedy_setup():
    """(model, src): the shipped tiny model with six encoded sentences, or a seeded random model."""
    if "setup" in _GREEDY_CACHE:
        return _GREEDY_CACHE["setup"]
    from llmcourse.data.translation import load_tatoeba_tokenizers, make_translation_batch
    from llmcourse.train.seq2seq import load_translate_tiny

    loaded = load_translate_tiny()
    sentences = ["I am happy.", "Where is the station?", "He is my friend.", "Come here.",
                 "She reads a book every day.", "What is your name?"]
    if loaded is not None:
        model, ckpt = loaded
        en, _ = load_tatoeba_tokenizers(ckpt["recipe"]["num_merges"])
        src, _, _ = make_translation_batch([(en.encode(s), [0]) for s in sentences], 32)
    else:
        from llmcourse.models.transformer import Transformer

        torch.manual_seed(0)
        model = Transformer(40, 30, d_model=32, num_heads=4, d_ff=64, max_len=32).eval()
        with torch.no_grad():
            model.projection.proj.bias[EOS] += 1.5
        src = _padded_ids([5, 3, 7, 2, 6, 4], 40, seed=5)
    _GREEDY_CACHE["setup"] = (model, src)
    return model, src


def _dropout_model():
    """``(model, src)``: a small seeded random model (vocabularies 40 → 30) with dropout 0.3 everywhere,
    and three padded source rows. Small on purpose: it travels to the learner's process in every probe."""
    from llmcourse.models.transformer import Transformer

    with torch.random.fork_rng():
        torch.manual_seed(1)
        dm = Transformer(40, 30, d_model=32, num_heads=4, d_ff=64, max_len=32, dropout=0.3)
    for mod in dm.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.3
    return dm, _padded_ids([6, 4, 7], 40, seed=6)


MODE_SEED = 12345


def _mode_evidence(model, src):
    """A seeded forward pass of ``model`` on ``src`` and a fixed 3-token prefix.

    Run after a call in the learner's process and here on the same weights in a known mode, it tells
    (from numbers, not from a flag read over there) which mode the call left the model in: dropout
    draws the same mask from the same seed, and eval mode draws none.
    """
    tgt = torch.tensor([[SOS, 4, 5]] * src.shape[0])
    with torch.random.fork_rng():
        torch.manual_seed(MODE_SEED)
        with torch.no_grad():
            return model(src, tgt)


def _same_numbers(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-5))


def _greedy(model, src, max_len, mode="eval"):
    """Probe: ``greedy_translate(model, src, max_len)`` with the model put in ``mode`` first."""
    def probe(impl):
        model.train(mode == "train")
        return impl.greedy_translate(model, src, max_len)
    return probe


@check(f"{U}.greedy_translate", ["greedy_translate"], _ref_greedy)
def check_greedy_translate(t):
    model, src = _greedy_setup()
    model.eval()
    out = t.run(_greedy(model, src, 20))
    t.expect(isinstance(out, torch.Tensor) and out.dtype == torch.long and out.dim() == 2,
             f"greedy_translate must return a (B, L) long tensor, got {getattr(out, 'dtype', type(out).__name__)} "
             f"of shape {tuple(getattr(out, 'shape', ()))}")
    if out.shape[1] > 0 and bool((out[:, 0] == SOS).all()):
        ref0 = t.reference.greedy_translate(model.eval(), src, 20)
        t.expect(bool((ref0[:, 0] == SOS).all()), "the first column is SOS for every row: return only the tokens "
                                                  "generated after SOS", bug="B06.greedy_includes_sos")
    t.expect(out.shape[0] == src.shape[0] and out.shape[1] <= 20,
             f"expected shape (B={src.shape[0]}, L ≤ max_len=20), got {tuple(out.shape)}")
    for b in range(out.shape[0]):
        row = out[b].tolist()
        if EOS in row:
            first = row.index(EOS)
            t.expect(all(x == PAD for x in row[first + 1:]), f"row {b} continues after its first EOS at position "
                     f"{first}: {row}", bug="B06.greedy_no_eos_stop")
    ref = t.reference.greedy_translate(model.eval(), src, 20)
    t.compare(_greedy(model, src, 20), ref, "greedy translations of six sentences with the shipped tiny model "
              "(max_len=20)")
    # each emitted token is the argmax given its prefix
    from llmcourse.data.translation import make_src_mask, make_tgt_mask

    model.eval()
    prefix = torch.cat([torch.full_like(out[:, :1], SOS), out[:, :-1]], 1)
    with torch.no_grad():
        sm = make_src_mask(src)
        argmax = model.projection(model.decode(prefix, model.encode(src, sm), sm, make_tgt_mask(prefix))).argmax(-1)
    real = torch.ones_like(out, dtype=torch.bool)
    for b in range(out.shape[0]):
        row = out[b].tolist()
        if EOS in row:
            real[b, row.index(EOS) + 1:] = False
    t.expect(bool((argmax[real] == out[real]).all()), "some emitted token is not the argmax of the logits given "
                                                      "the source and its prefix")
    short = t.reference.greedy_translate(model.eval(), src, 3)
    t.compare(_greedy(model, src, 3), short, "greedy_translate with max_len=3")

    # dropout: decoding must run in eval mode and restore the previous mode (read from a seeded forward
    # pass after the call, compared with the same pass here in each mode)
    dm, s2 = _dropout_model()
    left_in_train = _mode_evidence(dm.train(), s2)
    left_in_eval = _mode_evidence(dm.eval(), s2)

    def seeded(k, mode="train"):
        def probe(impl):
            dm.train(mode == "train")
            torch.manual_seed(100 + k)   # a different dropout draw per call (t.run restores the RNG afterwards)
            return impl.greedy_translate(dm, s2, 10), _mode_evidence(dm, s2)
        return probe

    results = [t.run(seeded(k)) for k in range(4)]
    runs = [r[0] for r in results]
    t.expect(all(torch.equal(runs[0], r) for r in runs[1:]),
             "repeated calls on a model with dropout 0.3 gave different translations: dropout was active",
             bug="B06.greedy_train_mode")
    t.expect(_same_numbers(results[0][1], left_in_train),
             "the model was in train mode before greedy_translate and must be again afterwards",
             bug="B06.greedy_mode_not_restored")
    _, after = t.run(seeded(0, mode="eval"))
    t.expect(_same_numbers(after, left_in_eval),
             "the model was in eval mode before greedy_translate and must stay in eval mode",
             bug="B06.greedy_mode_not_restored")
    t.compare(_greedy(dm, s2, 10), t.reference.greedy_translate(dm.eval(), s2, 10),
              "greedy translations of a random model with dropout 0.3 (eval mode)")

    # the special ids are the caller's: SOS=5, EOS=6, PAD=7 (a source padded with 7); the model is biased
    # towards 6 and, less, towards 2 so that rows end, some of them after a 2 that is no EOS here
    import copy

    dm6 = copy.deepcopy(dm).eval()
    with torch.no_grad():
        dm6.projection.proj.bias[6] += 1.2
        dm6.projection.proj.bias[2] += 1.0
    s7 = torch.where(s2 == PAD, 7, s2)
    t.compare(lambda impl: impl.greedy_translate(dm6.eval(), s7, 12, sos_id=5, eos_id=6, pad_id=7),
              t.reference.greedy_translate(dm6.eval(), s7, 12, sos_id=5, eos_id=6, pad_id=7),
              "greedy_translate(model, src, 12, sos_id=5, eos_id=6, pad_id=7) on a source padded with 7")

    # the source is encoded once: the encoder stack runs one time per call
    def encoder_calls(impl):
        calls = []
        hook = dm.encoder.register_forward_hook(lambda *a: calls.append(1))
        try:
            impl.greedy_translate(dm.eval(), s2, 10)
        finally:
            hook.remove()
        return len(calls)

    n_enc = t.run(encoder_calls)
    t.expect(n_enc == 1, f"greedy_translate ran the encoder {n_enc} times for one call of 10 steps: the source "
             "is encoded once, its memory reused at every step", bug="B06.greedy_reencodes")


# ================================================================== 06.chrf

F063 = [
    (["the cat sat"], ["the cat sat"], 100.0),
    (["abc"], ["xyz"], 0.0),
    (["the cat sat"], ["the cat sat on the mat"], 49.5935),
    (["the cat sat on the mat"], ["the cat sat"], 79.7386),
    (["tac eht"], ["the cat"], 16.6667),
    (["the cat", "a dog"], ["the cat", "the dog"], 63.8322),
    (["a b"], ["ab"], 100.0),
    (["तुम कैसे हो"], ["तुम कैसे हो?"], 88.3978),
]


@check(f"{U}.chrf", ["chrf"], _ref_chrf)
def check_chrf(t):
    out = t.run(lambda impl: impl.chrf(["the cat sat"], ["the cat sat"]))
    t.expect(isinstance(out, (float, int)) or (isinstance(out, torch.Tensor) and out.numel() == 1),
             f"chrf must return a number, got {type(out).__name__}")
    for hyps, refs, expected in F063:
        t.compare(lambda impl, h=hyps, r=refs: float(impl.chrf(h, r)), expected,
                  f"chrf({hyps}, {refs})", atol=1e-4, rtol=0)
    corpus = ["मैं घर जा रहा हूँ।", "वह किताब पढ़ती है", "yes, of course"]
    t.compare(lambda impl: float(impl.chrf(corpus, corpus)), 100.0, "chrf of a corpus against itself", atol=1e-4, rtol=0)
    squashed = ["".join(s.split()) for s in corpus]
    hyp = ["मैं घर जाता हूँ", "किताब", "of course"]
    t.compare(lambda impl: float(impl.chrf(hyp, squashed)), t.reference.chrf(hyp, corpus),
              "chrf must not depend on whitespace in the references", atol=1e-4, rtol=0)
    t.compare(lambda impl: float(impl.chrf(hyp, corpus, n=3, beta=1.0)), t.reference.chrf(hyp, corpus, n=3, beta=1.0),
              "chrf with n=3, beta=1", atol=1e-4, rtol=0)
    # strings shorter than n: orders with k-grams on one side only count as 0, orders with none are skipped
    for hyps, refs in ((["ab"], ["abcdefgh"]), (["abcdefgh"], ["ab"]), (["ab", "xyz"], ["abc", "xy"]),
                       ([""], [""]), (["", "a"], ["", "a"])):
        t.compare(lambda impl, h=hyps, r=refs: float(impl.chrf(h, r)), t.reference.chrf(hyps, refs),
                  f"chrf({hyps}, {refs}) (strings shorter than n)", atol=1e-4, rtol=0)
    spaced = ["the\tcat\nsat", "a\u00a0dog  barks"]
    t.expect(abs(t.run(lambda impl: float(impl.chrf(spaced, ["the cat sat", "a dog barks"]))) - 100.0) < 1e-4,
             "chrf of hypotheses that differ from the references only by tabs, newlines and non-breaking spaces must "
             "be 100: remove all whitespace, not only spaces", bug="B06.chrf_whitespace")


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# chrf: the per-order n-gram matches and counts chrf is computed from (the F-score is the rest)
also_blocked(f"{U}.chrf", "llmcourse.train.metrics:chrf_statistics", "llmcourse.train.metrics:_ngrams")


# ================================================================== grading strength (grader/strength.py)

from ..strength import decision, defining_property  # noqa: E402

defining_property(
    f"{U}.make_masks",
    "the source mask hides padded keys for every head and query; the target mask also hides the future, and "
    "padding is whatever pad_id says",
    probe="the learner's masks on fixed and random padded batches, with pad_id=3 where id 0 is a real token; "
          "shapes, dtypes and every row keeping a key checked on the returned tensors")
defining_property(
    f"{U}.make_translation_batch",
    "teacher forcing: the decoder reads SOS + target and predicts target + EOS, one step ahead, right-padded",
    probe="the returned tensors for fixed pairs, truncation, non-default special ids, and the shift measured "
          "between tgt_in and tgt_out")
defining_property(
    f"{U}.Transformer",
    "the encoder–decoder Transformer: source padding hidden in the encoder and in cross-attention, the decoder "
    "causal, with the pad id and dropout the caller chose",
    probe="logits of the learner's model loaded with the reference's weights (both norm placements, pad_id=5) and "
          "decode() against torch.nn.Transformer; future-target and appended-PAD perturbations; the model's dropout "
          "probabilities and a dropout-0 train-mode pass")
defining_property(
    f"{U}.greedy_translate",
    "greedy decoding: each token the argmax given the source (encoded once) and the prefix, rows ending at the "
    "caller's EOS, deterministic, the caller's model left as it was",
    probe="translations of the shipped model and of a random dropout model compared with the reference, each token "
          "re-derived as the argmax here; encoder forward passes counted by a hook; the mode after the call read "
          "from a seeded forward pass; non-default special ids")
defining_property(
    f"{U}.chrf",
    "corpus chrF: clipped character n-gram statistics summed over the corpus, whitespace removed, before the "
    "F-beta of the mean precision and recall",
    probe="hand-computed fixtures (clipping, empty orders, corpus vs sentence mean, Hindi), whitespace of several "
          "kinds, n and beta at non-default values")

decision(f"{U}.greedy_translate", "how decoding leaves the caller's model in the mode it found it in",
         forms=[r"was_training", r"\.train\(\s*(previous|was_training|prev|mode|training|before)\s*\)"],
         wrong=("B06.greedy_mode_not_restored", "B06.greedy_train_mode"))
decision(f"{U}.Transformer", "which mask the decoder's cross-attention takes",
         forms=[r"memory_mask\s*=\s*src_mask"],
         wrong=("B06.memory_mask_missing",))
