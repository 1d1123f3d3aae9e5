"""Checks of unit 09 (generation and sampling).

Fixtures: the syllabus's F09.1 (``z = [2, 1, 0.5, 0, −1]``: softmax, temperature, top-k, top-p and the
tie example ``[3, 1, 1, 0]``) and F09.2 (the greedy continuation of ``"ROMEO:"`` by the course's trained
character GPT, computed here with the reference ``generate`` on the same weights). Independent oracles:
``torch.topk`` (tie-free rows), a pure-Python nucleus rule (stable descending order, mass before < p),
``torch.argmax``, and binomial standard errors for sampled frequencies. Sampling is never compared bit for
bit with a rule the learner could legitimately implement differently: draws are checked by their support
(exact) and by the frequencies of 20,000 draws from a seeded ``torch.Generator`` (within 4 standard
errors); because the call sequence is prescribed (one ``torch.multinomial(probs, 1, generator=g)``), a
seeded generator also makes the draws reproducible and comparable with the reference's.

Probes return plain data only; models are built inside each probe from a config and a state dict.

Contract clauses and the probes that cover them (what is not listed is not graded):

``09.apply_temperature``: softmax(out) = softmax(z/T) on the worked example and batches; argmax kept;
  T ≤ 0 -> ValueError; input not modified
``09.top_k_filter``: worked example; ties with the k-th value kept; rows independent; k=None / k ≥ V unchanged;
  masked entries -inf (never 0); input not modified
``09.top_p_filter``: worked example at several p; exact thresholds (4 and 8 equal tokens); another vocabulary
  order; stable order of ties; random batches against an independent keep rule; kept mass ≥ p and ≥ 1 token;
  input already holding -inf; p=None / p ≥ 1 unchanged (also rows whose float32 mass reaches 1 before the
  last token); input not modified
``09.sample_next_token``: shape (B, 1) long; temperature 0 = argmax (filters ignored); draw frequencies of every
  setting (temperature, top_k, top_p and their order) vs the filtered probabilities; one multinomial call with the
  generator (seeded draws reproducible)
``09.generate``: greedy = reference on the trained character model; long prompts (the window is the most recent
  context_length tokens); the ``context_length`` argument, not the model's maximum; max_new_tokens=0; temperature,
  top_k, top_p (top_p=1e-6 = greedy) and generator passed on; eos_id: finished rows frozen, early stop, rows that
  stop at different steps; eval mode and no autograd inside, the caller's mode restored; side effects: weights and
  buffers unchanged after generating from train and from eval mode
``09.generate_batched``: greedy rows equal each prompt generated alone (4 lengths; equal lengths; a batch of one; a
  prompt filling the window exactly); one model call per step on all rows (a forward pre-hook counts them); pad_id does not matter (pad_id=7); max_new_tokens=0; ValueError past
  context_length; eos_id (rows finish at different steps, frozen; early stop on a stand-in model whose
  rows finish after 2, 5, 1 and 7 of 30 steps); sampling: the generator passed on
  (seeded runs equal), every token in the top 3 of its own prompt run alone, top_k=1 = greedy; eval mode inside,
  the caller's mode restored, weights unchanged. The choices it forces (where the padding goes, what the model is
  told about it, which position each token gets) are not named by the task; the mutants are named
"""


from __future__ import annotations

import functools
import math

import torch

from ..core import check, describe_difference
from ..runner import also_blocked
from ..strength import decision, defining_property

U = "09"
T = torch.tensor
NEG_INF = float("-inf")
N_DRAWS = 20_000

# F09.1
Z = T([2.0, 1.0, 0.5, 0.0, -1.0])
F091_SOFTMAX = [0.5630, 0.2071, 0.1256, 0.0762, 0.0280]
F091_T05 = [0.8292, 0.1122, 0.0413, 0.0152, 0.0021]
F091_T2 = [0.3745, 0.2272, 0.1769, 0.1378, 0.0836]
F091_TOPK2 = [0.7311, 0.2689, 0.0, 0.0, 0.0]
F091_TOPP = {0.5: [1.0, 0.0, 0.0, 0.0, 0.0], 0.6: [0.7311, 0.2689, 0.0, 0.0, 0.0],
             0.8: [0.6285, 0.2312, 0.1402, 0.0, 0.0], 0.9: [0.5793, 0.2131, 0.1293, 0.0784, 0.0]}
TIES = T([3.0, 1.0, 1.0, 0.0])


def _ref_temperature():
    from llmcourse.train import sampling as S

    return {"apply_temperature": S.apply_temperature}


def _ref_top_k():
    from llmcourse.train import sampling as S

    return {"top_k_filter": S.top_k_filter}


def _ref_top_p():
    from llmcourse.train import sampling as S

    return {"top_p_filter": S.top_p_filter}


def _ref_sample():
    from llmcourse.train import sampling as S

    return {"sample_next_token": S.sample_next_token}


def _ref_generate():
    from llmcourse.train import sampling as S

    return {"generate": S.generate}


def _is_float_tensor(x, shape) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and tuple(x.shape) == tuple(shape)


def _masked(logits: torch.Tensor, keep) -> torch.Tensor:
    return logits.masked_fill(~torch.as_tensor(keep, dtype=torch.bool), NEG_INF)


def _fmt(values) -> str:
    return "[" + ", ".join("-inf" if v == NEG_INF else f"{v:.4g}" for v in values) + "]"


def _call_and_input(name, logits, *args):
    """A probe: the function's result and its input afterwards (a filter must not modify its input)."""
    def probe(impl):
        x = logits.clone()
        out = getattr(impl, name)(x, *args)
        return out, x
    return probe


def _check_not_inplace(t, name, logits, *args):
    out, after = t.run(_call_and_input(name, logits, *args))
    t.expect(torch.equal(after, logits), f"{name} modified its input tensor in place; return a new tensor and leave "
             "the caller's logits untouched")
    return out


def _check_no_nan(t, out, what: str):
    odd = ~torch.isfinite(out) & (out != NEG_INF)
    t.expect(not bool(odd.any()), f"{what}: the result contains +inf or NaN")


# ================================================================== 09.apply_temperature


@check(f"{U}.apply_temperature", ["apply_temperature"], _ref_temperature)
def check_apply_temperature(t):
    out = t.run(lambda impl: impl.apply_temperature(Z.clone(), 0.5))
    t.expect(_is_float_tensor(out, (5,)), f"apply_temperature(z, 0.5) must return a float tensor of the same shape "
             f"(5,); got {getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    for temp, probs in ((0.5, F091_T05), (2.0, F091_T2)):
        probe = _call_and_input("apply_temperature", Z, temp)
        t.compare(probe, Z / temp, f"apply_temperature(z, {temp}) of the worked example z = [2, 1, 0.5, 0, -1]: "
                  "the logits divided by T", atol=1e-6, rtol=1e-6, pick=lambda o: o[0])
        t.compare(probe, T(probs), f"softmax(apply_temperature(z, {temp})) of the worked example", atol=1e-4,
                  pick=lambda o: torch.softmax(o[0], -1) if isinstance(o[0], torch.Tensor) else o[0])
    _check_not_inplace(t, "apply_temperature", Z, 2.0)
    for bad in (0.0, -1.0):
        err = t.raised(lambda impl, b=bad: impl.apply_temperature(Z.clone(), b))
        t.expect(err == "ValueError", f"apply_temperature(z, {bad}) must raise ValueError (T must be > 0); "
                 f"got {err}")
    g = torch.Generator().manual_seed(0)
    batch = torch.randn(2, 6, 40, generator=g) * 3
    for temp in (0.05, 0.7, 3.0):
        out = t.compare(lambda impl, tt=temp: impl.apply_temperature(batch.clone(), tt), batch / temp,
                        f"apply_temperature on a (2, 6, 40) batch with T={temp}", atol=1e-5, rtol=1e-5)
        t.expect(torch.equal(out.argmax(-1), batch.argmax(-1)), f"T={temp} changed the argmax of some rows: a "
                 "positive temperature must keep the most likely token")


# ================================================================== 09.top_k_filter


@check(f"{U}.top_k_filter", ["top_k_filter"], _ref_top_k)
def check_top_k_filter(t):
    out = t.run(lambda impl: impl.top_k_filter(Z.clone(), 2))
    t.expect(_is_float_tensor(out, (5,)), f"top_k_filter(z, 2) must return a float tensor of shape (5,); got "
             f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    _check_no_nan(t, out, "top_k_filter(z, 2)")
    expected = _masked(Z, [True, True, False, False, False])
    if torch.isfinite(out[2:]).any() and not bool((out[2:] == 0).all()):
        t.fail(f"top_k_filter(z, 2) must set the removed logits to -inf (float('-inf')); got {_fmt(out.tolist())}")
    t.compare(_call_and_input("top_k_filter", Z, 2), expected,
              "top_k_filter(z, 2) of the worked example (kept logits unchanged, the rest -inf)", atol=0, rtol=0,
              pick=lambda o: o[0])
    t.compare(_call_and_input("top_k_filter", Z, 2), T(F091_TOPK2), "softmax(top_k_filter(z, 2))", atol=1e-4,
              pick=lambda o: torch.softmax(o[0], -1))
    _check_not_inplace(t, "top_k_filter", Z, 2)

    # ties with the k-th value are kept
    tied = t.run(lambda impl: impl.top_k_filter(TIES.clone(), 2))
    kept = torch.isfinite(tied).nonzero().flatten().tolist() if isinstance(tied, torch.Tensor) else tied
    t.expect(kept != [0, 1] and kept != [0, 2], f"top_k_filter([3, 1, 1, 0], k=2) kept only indices {kept}: a logit "
             "equal to the k-th largest value must be kept too (indices 0, 1 and 2)", bug="B09.topk_exact_k")
    t.compare(lambda impl: impl.top_k_filter(TIES.clone(), 2), T([3.0, 1.0, 1.0, NEG_INF]),
              "top_k_filter([3, 1, 1, 0], k=2): ties with the k-th value are kept", atol=0, rtol=0)
    t.compare(lambda impl: impl.top_k_filter(T([0.5, 0.5, 0.5, 0.5, -2.0]), 1), T([0.5, 0.5, 0.5, 0.5, NEG_INF]),
              "top_k_filter([0.5, 0.5, 0.5, 0.5, -2], k=1): every logit tied with the largest is kept", atol=0, rtol=0)

    # oracle on tie-free rows: scatter torch.topk's values; rows of very different scales (per row, not global)
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(5, 30, generator=g) * T([[0.1], [1.0], [10.0], [100.0], [3.0]]) + T([[50.0], [0], [-20], [0], [0]])
    for k in (1, 3, 17, 29):
        vals, ids = torch.topk(rows, k, dim=-1)
        t.compare(lambda impl, kk=k: impl.top_k_filter(rows.clone(), kk),
                  torch.full_like(rows, NEG_INF).scatter(-1, ids, vals),
                  f"top_k_filter on a (5, 30) batch with k={k}: each row keeps its own k largest logits",
                  atol=0, rtol=0)
    x3 = torch.randn(2, 3, 7, generator=g)
    vals, ids = torch.topk(x3, 2, dim=-1)
    t.compare(lambda impl: impl.top_k_filter(x3.clone(), 2), torch.full_like(x3, NEG_INF).scatter(-1, ids, vals),
              "top_k_filter on a (2, 3, 7) tensor with k=2 (filter along the last dimension)", atol=0, rtol=0)
    for k in (None, 5, 9):
        t.compare(lambda impl, kk=k: impl.top_k_filter(Z.clone(), kk), Z.clone(),
                  f"top_k_filter(z, {k}) must leave the logits unchanged (k None or k ≥ V)", atol=0, rtol=0)


# ================================================================== 09.top_p_filter


def _nucleus_keep(row: list[float], p: float) -> list[bool]:
    """The keep rule in plain Python (double precision): stable descending order, mass before < p."""
    m = max(row)
    e = [math.exp(v - m) if v != NEG_INF else 0.0 for v in row]
    s = sum(e)
    probs = [v / s for v in e]
    keep, before = [False] * len(row), 0.0
    for i in sorted(range(len(row)), key=lambda j: -probs[j]):  # Python's sort is stable
        keep[i] = before < p
        before += probs[i]
    return keep


@check(f"{U}.top_p_filter", ["top_p_filter"], _ref_top_p)
def check_top_p_filter(t):
    out = t.run(lambda impl: impl.top_p_filter(Z.clone(), 0.8))
    t.expect(_is_float_tensor(out, (5,)), f"top_p_filter(z, 0.8) must return a float tensor of shape (5,); got "
             f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    _check_no_nan(t, out, "top_p_filter(z, 0.8)")
    if torch.isfinite(out[3:]).any():
        t.fail(f"top_p_filter(z, 0.8) must set the removed logits to -inf (float('-inf')); got {_fmt(out.tolist())}")
    for p, probs in F091_TOPP.items():
        keep = [v > 0 for v in probs]
        low = t.run(lambda impl, pp=p: impl.top_p_filter(Z.clone(), pp))
        if isinstance(low, torch.Tensor) and low.shape == Z.shape and not bool(torch.isfinite(low).any()):
            # same probe on the mutants first: a matching one names the bug precisely
            bug = t.diagnose(lambda impl, pp=p: impl.top_p_filter(Z.clone(), pp), low) or "B09.topp_strict"
            t.fail(f"top_p_filter(z, {p}) removed every token (softmax would give NaN): the token whose mass crosses "
                   "p must be kept, so the most likely token always survives", bug=bug)
        t.compare(lambda impl, pp=p: impl.top_p_filter(Z.clone(), pp), _masked(Z, keep),
                  f"top_p_filter(z, {p}) of the worked example (probabilities {F091_SOFTMAX}): keep the shortest "
                  "prefix of the sorted tokens whose mass reaches p", atol=0, rtol=0)
        t.compare(lambda impl, pp=p: impl.top_p_filter(Z.clone(), pp), T(probs), f"softmax(top_p_filter(z, {p}))",
                  atol=1e-4, pick=lambda o: torch.softmax(o, -1))
    _check_not_inplace(t, "top_p_filter", Z, 0.8)

    # the same logits in another vocabulary order: the result follows the input's order
    perm = T([3, 0, 4, 1, 2])
    zp = Z[perm]
    for p in (0.6, 0.8, 0.9):
        t.compare(lambda impl, pp=p: impl.top_p_filter(zp.clone(), pp), _masked(zp, _nucleus_keep(zp.tolist(), p)),
                  f"top_p_filter on the worked example in another order, {_fmt(zp.tolist())}, p={p}: sort by "
                  "probability, then return the result in the original vocabulary order", atol=0, rtol=0)

    # the exact threshold: uniform over 4 tokens, the mass before the third is exactly 0.5
    u4 = torch.zeros(4)

    def u4_probe(impl):
        return impl.top_p_filter(u4.clone(), 0.5)

    got = t.run(u4_probe)
    n_kept = int(torch.isfinite(got).sum()) if isinstance(got, torch.Tensor) else -1
    t.expect(n_kept == 2, f"top_p_filter(zeros(4), p=0.5) must keep exactly 2 tokens (two of them already reach "
             f"p = 0.5; the third, with exactly 0.5 before it, is not needed); kept {n_kept}",
             bug=t.diagnose(u4_probe, got) if n_kept != 2 else None)
    # p = 1: unchanged, also where the cumulative mass rounds to 1 before the last token (tiny tail probabilities)
    wide = T([0.0, -30.0, -40.0, -60.0, 2.0])
    t.compare(lambda impl: impl.top_p_filter(wide.clone(), 1.0), wide.clone(), "top_p_filter(logits, p=1.0) must return the "
              "logits unchanged (every token kept, including a tail whose mass rounds away in float32)", atol=0, rtol=0)
    # rows where the float32 mass before the last token already sums to 1.0 (three tokens of probability 1/3, or
    # 0.58 + 0.21 + 0.21): a nucleus computed at p = 1 drops that token, the contract keeps it (p >= 1: no filter)
    rounded = T([[0.0, 0.0, 0.0, -40.0], [1.0, 0.0, 0.0, -30.0]])
    t.compare(lambda impl: impl.top_p_filter(rounded.clone(), 1.0), rounded.clone(), "top_p_filter(logits (2, 4), "
              "p=1.0) on rows whose float32 cumulative mass reaches 1.0 before the last token must return the logits "
              "unchanged (p >= 1 keeps every token: no nucleus is computed)", atol=0, rtol=0)
    # p = 0: the most likely token alone survives (one behaviour, stated and graded; transformers keeps
    # min_tokens_to_keep=1 likewise), in every row of a batch
    rows = torch.randn(3, 7, generator=torch.Generator().manual_seed(17))
    t.compare(lambda impl: torch.isfinite(impl.top_p_filter(rows.clone(), 0.0)),
              torch.nn.functional.one_hot(rows.argmax(-1), 7).bool(),
              "top_p_filter(logits (3, 7), p=0) keeps each row's most likely token alone (a row is never emptied)",
              atol=0, rtol=0)
    u8 = torch.zeros(8)
    for p, n in ((0.25, 2), (0.75, 6), (0.7501, 7)):
        got = t.run(lambda impl, pp=p: impl.top_p_filter(u8.clone(), pp))
        n_kept = int(torch.isfinite(got).sum()) if isinstance(got, torch.Tensor) else -1
        t.expect(n_kept == n, f"top_p_filter(zeros(8), p={p}) must keep {n} tokens (each has probability 1/8); "
                 f"kept {n_kept}")
    # equal probabilities keep their vocabulary order (a stable sort), also in a large vocabulary
    big = torch.zeros(256)
    big[::7] = 2.0
    t.compare(lambda impl: impl.top_p_filter(big.clone(), 0.5), _masked(big, _nucleus_keep(big.tolist(), 0.5)),
              "top_p_filter on 256 logits with many ties (values 2 and 0), p=0.5: tokens with equal probability keep "
              "their vocabulary order (sort with stable=True)", atol=0, rtol=0)

    # random rows: the independent rule, per row; properties of the kept set
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(12, 50, generator=g) * torch.linspace(0.2, 5.0, 12)[:, None]
    probs = torch.softmax(rows, -1)
    for p in (0.05, 0.3, 0.75, 0.95):
        expected = torch.stack([_masked(r, _nucleus_keep(r.tolist(), p)) for r in rows])
        out = t.compare(lambda impl, pp=p: impl.top_p_filter(rows.clone(), pp), expected,
                        f"top_p_filter on a (12, 50) batch with p={p}: each row filtered on its own", atol=0, rtol=0)
        kept = torch.isfinite(out)
        t.expect(bool((kept.sum(-1) >= 1).all()), f"p={p}: every row must keep at least one token")
        t.expect(bool(((probs * kept).sum(-1) >= p - 1e-6).all()), f"p={p}: the kept probability mass must be ≥ p")
    x3 = torch.randn(2, 3, 9, generator=g)
    expected = torch.stack([torch.stack([_masked(r, _nucleus_keep(r.tolist(), 0.7)) for r in m]) for m in x3])
    t.compare(lambda impl: impl.top_p_filter(x3.clone(), 0.7), expected,
              "top_p_filter on a (2, 3, 9) tensor with p=0.7 (filter along the last dimension)", atol=0, rtol=0)
    # after top-k: the input already holds -inf; top-p renormalises over the survivors
    after_k = T([2.0, 1.0, NEG_INF, NEG_INF, NEG_INF])
    t.compare(lambda impl: impl.top_p_filter(after_k.clone(), 0.6), T([2.0, NEG_INF, NEG_INF, NEG_INF, NEG_INF]),
              "top_p_filter([2, 1, -inf, -inf, -inf], 0.6) (the survivors of top-k=2 have probabilities 0.73, 0.27)",
              atol=0, rtol=0)
    for p in (None, 1.0, 1.5):
        t.compare(lambda impl, pp=p: impl.top_p_filter(Z.clone(), pp), Z.clone(),
                  f"top_p_filter(z, {p}) must leave the logits unchanged (p None or p ≥ 1)", atol=0, rtol=0)


# ================================================================== 09.sample_next_token


def _draws(logits, seed, **kw):
    def probe(impl):
        return impl.sample_next_token(logits.expand(N_DRAWS, -1).clone(), generator=torch.Generator().manual_seed(seed),
                                      **kw)
    return probe


def _freq_probe(logits, seed, **kw):
    """Frequencies of the draws (for naming a mutant; runs on course code only)."""
    draws = _draws(logits, seed, **kw)

    def probe(impl):
        out = draws(impl)
        return torch.bincount(out.flatten(), minlength=logits.shape[-1]).double() / out.numel()
    return probe


# (settings, label); the expected distribution comes from the independent rule below (the tests check it
# against the worked example's typed numbers for the first five)
SAMPLING_CASES = [
    (dict(temperature=1.0), "T=1, no filter"),
    (dict(temperature=0.5), "T=0.5"),
    (dict(temperature=2.0), "T=2"),
    (dict(temperature=1.0, top_k=2), "top_k=2"),
    (dict(temperature=1.0, top_p=0.8), "top_p=0.8"),
    (dict(temperature=1.0, top_k=2, top_p=0.6), "top_k=2 then top_p=0.6"),
    (dict(temperature=2.0, top_p=0.8), "T=2 then top_p=0.8"),
    (dict(temperature=0.7, top_k=4, top_p=0.9), "T=0.7, top_k=4, top_p=0.9"),
]


def _expected_probs(logits, temperature, top_k, top_p):
    """The filtered distribution by the rules, written independently of the reference (float64 softmax)."""
    z = logits / temperature
    if top_k is not None and top_k < z.shape[-1]:
        vals, ids = torch.topk(z, top_k)
        keep = z >= vals[-1]
        z = z.masked_fill(~keep, NEG_INF)
    if top_p is not None and top_p < 1:
        z = _masked(z, _nucleus_keep(z.tolist(), top_p))
    return torch.softmax(z.double(), -1)


@check(f"{U}.sample_next_token", ["sample_next_token"], _ref_sample)
def check_sample_next_token(t):
    g = torch.Generator().manual_seed(5)
    batch = torch.randn(6, 11, generator=g) * 2
    out = t.run(lambda impl: impl.sample_next_token(batch.clone(), 1.0, generator=torch.Generator().manual_seed(0)))
    t.expect(isinstance(out, torch.Tensor) and tuple(out.shape) == (6, 1),
             f"sample_next_token on (B, V) = (6, 11) logits must return a (B, 1) tensor; got "
             f"{tuple(getattr(out, 'shape', ())) or type(out).__name__}")
    t.expect(out.dtype == torch.long, f"the sampled ids must be torch.long, got {out.dtype}")
    t.expect(bool(((out >= 0) & (out < 11)).all()), f"sampled ids must lie in 0 … V−1; got {out.flatten().tolist()}")

    # temperature 0: the argmax, whatever the filters say
    t.compare(lambda impl: impl.sample_next_token(batch.clone(), 0.0, top_k=3, top_p=0.2,
                                                  generator=torch.Generator().manual_seed(0)),
              batch.argmax(-1, keepdim=True), "sample_next_token(logits, temperature=0) must be the argmax of each row "
              "(top_k and top_p are ignored)", atol=0, rtol=0)

    # the generator decides the draw, not torch's global state
    def twice(impl):
        torch.manual_seed(1)
        a = impl.sample_next_token(batch.clone(), 0.9, 6, 0.95, torch.Generator().manual_seed(7))
        torch.manual_seed(2)
        b = impl.sample_next_token(batch.clone(), 0.9, 6, 0.95, torch.Generator().manual_seed(7))
        return a, b

    a, b = t.run(twice)
    t.expect(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b),
             "two calls with generators seeded alike gave different tokens: pass `generator` to torch.multinomial")

    # frequencies of 20,000 seeded draws against the filtered distribution (support exact, 4 standard errors)
    for seed, (kw, label) in enumerate(SAMPLING_CASES):
        expected = _expected_probs(Z, kw["temperature"], kw.get("top_k"), kw.get("top_p"))
        draws = t.run(_draws(Z, 100 + seed, **kw))
        t.expect(isinstance(draws, torch.Tensor) and tuple(draws.shape) == (N_DRAWS, 1) and draws.dtype == torch.long,
                 f"sample_next_token on ({N_DRAWS}, 5) logits must return ({N_DRAWS}, 1) long ids")
        freq = torch.bincount(draws.flatten().clamp(0, 4), minlength=5).double() / N_DRAWS
        outside = [i for i in range(5) if expected[i] == 0 and freq[i] > 0]
        se = (expected * (1 - expected) / N_DRAWS).sqrt()
        bad = (freq - expected).abs() > 4 * se + 1e-9
        if outside or bad.any():
            bug = t.diagnose(_freq_probe(Z, 100 + seed, **kw), freq, atol=3e-3, rtol=0)
            what = (f"token(s) {outside} were drawn although the filters remove them" if outside else
                    "the frequencies are more than 4 standard errors from the filtered probabilities")
            t.fail(f"{label} on the worked example z = [2, 1, 0.5, 0, -1]: {what}. Expected probabilities "
                   f"{[round(v, 4) for v in expected.tolist()]}, frequencies of {N_DRAWS:,} draws "
                   f"{[round(v, 4) for v in freq.tolist()]}", bug=bug)

    # the prescribed draw: one torch.multinomial(probs, 1, generator=g) for the whole batch
    wide = torch.randn(500, 40, generator=g) * 1.5
    kw = dict(temperature=0.8, top_k=10, top_p=0.9)
    mine = t.run(lambda impl: impl.sample_next_token(wide.clone(), generator=torch.Generator().manual_seed(11), **kw))
    ref = t.reference.sample_next_token(wide.clone(), generator=torch.Generator().manual_seed(11), **kw)
    same = float((mine == ref).float().mean()) if isinstance(mine, torch.Tensor) and mine.shape == ref.shape else 0.0
    t.expect(same >= 0.99, f"with a generator seeded like the reference's, only {same:.1%} of 500 draws agree: after the "
             "filters, draw with a single torch.multinomial(probs, 1, generator=generator) over the (B, V) batch")


# ================================================================== 09.generate


@functools.lru_cache(maxsize=1)
def _char_setup() -> dict:
    """The shipped character GPT as (config, state dict) plus a few prompts; a seeded random model with the
    same shape stands in when the asset is absent (the comparisons are with the reference on the same weights)."""
    from llmcourse.models.gpt2 import GPT2Config, GPT2Model

    try:
        from llmcourse.train.char_model import load_gpt_char_tiny

        model, tok = load_gpt_char_tiny(retrain=False, verbose=False)
        cfg = model.cfg.to_dict()
        chars = "".join(tok.chars)
    except (ImportError, FileNotFoundError):
        cfg = GPT2Config.preset("gpt2-char-tiny").to_dict() | {"context_length": 128}
        torch.manual_seed(9)
        model = GPT2Model(GPT2Config(**cfg))
        chars = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"cfg": cfg, "state": state, "chars": chars}


def _char_model(cfg: dict, state: dict, dropout: float | None = None):
    """Build the character GPT from its config and weights (inside a probe)."""
    from llmcourse.models.gpt2 import GPT2Config, GPT2Model

    c = dict(cfg)
    if dropout is not None:
        c["dropout"] = dropout
    m = GPT2Model(GPT2Config(**c))
    m.load_state_dict(state)
    return m.eval()


def _ids(chars: str, text: str) -> torch.Tensor:
    return T([[chars.index(c) for c in text]])


def _text(chars: str, row) -> str:
    return "".join(chars[i] if 0 <= i < len(chars) else "?" for i in row)


def _gen(cfg, state, idx, n, context, **kw):
    def probe(impl):
        return impl.generate(_char_model(cfg, state), idx.clone(), n, context, **kw)
    return probe


class _Counter(torch.nn.Module):
    """A stand-in language model: the next token is (current token + 1) mod V at every position."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, idx):
        return 5.0 * torch.nn.functional.one_hot((idx + 1) % self.vocab, self.vocab).float()


class _CounterBatched(_Counter):
    """:class:`_Counter` with the keyword arguments ``generate_batched`` passes (ignored: the rule reads each
    position's own token, so padding and positions cannot change it)."""

    def forward(self, idx, attention_mask=None, position_ids=None):
        return super().forward(idx)


def _greedy_counter(idx: torch.Tensor, n: int, vocab: int = 10) -> torch.Tensor:
    """Greedy decoding of :class:`_Counter`, by its rule (no model call)."""
    out = idx.clone()
    for _ in range(n):
        out = torch.cat([out, (out[:, -1:] + 1) % vocab], dim=1)
    return out


def _expect_equal(t, probe, actual, expected, what: str, pick=None):
    """Exact equality of already-returned learner data (no second run); on failure name a matching mutant."""
    got = pick(actual) if pick else actual
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got, expected):
        return
    detail = describe_difference(got, expected, 0, 0)
    t.fail(f"{what}: {detail}", bug=t.diagnose(probe, got, atol=0, rtol=0, pick=pick))


def _freeze_after_eos(free: torch.Tensor, t0: int, eos: int) -> torch.Tensor:
    """The EOS rule applied by hand to an unconstrained greedy run: rows keep eos after producing it, and the
    output ends at the step where the last row finished (or at the end)."""
    out = free.clone()
    finish = []
    for b in range(out.shape[0]):
        row = out[b, t0:].tolist()
        if eos in row:
            first = row.index(eos)
            out[b, t0 + first:] = eos
            finish.append(first)
        else:
            finish.append(None)
    if all(f is not None for f in finish):
        out = out[:, : t0 + max(finish) + 1]
    return out


@check(f"{U}.generate", ["generate"], _ref_generate)
def check_generate(t):
    setup = _char_setup()
    cfg, state, chars = setup["cfg"], setup["state"], setup["chars"]
    C = cfg["context_length"]
    ref_model = _char_model(cfg, state)
    gen_ref = t.reference.generate

    # F09.2: the greedy continuation of "ROMEO:" (60 characters)
    prompt = _ids(chars, "ROMEO:")
    out = t.run(_gen(cfg, state, prompt, 60, C))
    t.expect(isinstance(out, torch.Tensor) and not out.is_floating_point() and out.dim() == 2,
             f"generate must return a (B, T0 + n) tensor of token ids; got {getattr(out, 'dtype', type(out).__name__)}"
             f" {tuple(getattr(out, 'shape', ()))}")
    t.expect(tuple(out.shape) == (1, 66), f"generate(model, idx (1, 6), max_new_tokens=60, ...) without eos_id must "
             f"return shape (1, 66): the prompt followed by 60 new tokens; got {tuple(out.shape)}")
    t.expect(torch.equal(out[:, :6], prompt), "the output must start with the prompt itself")
    expected = gen_ref(ref_model, prompt.clone(), 60, C)
    if not torch.equal(out, expected):
        bug = t.diagnose(_gen(cfg, state, prompt, 60, C), out)
        t.fail(f'greedy continuation of "ROMEO:" by the course\'s character model: expected '
               f"{_text(chars, expected[0].tolist())!r}, got {_text(chars, out[0].tolist())!r}", bug=bug)

    # prompts longer than the window: crop to the last context_length tokens
    g = torch.Generator().manual_seed(0)
    long_prompt = torch.randint(0, len(chars), (2, C + 20), generator=g)
    err = t.raised_error(_gen(cfg, state, long_prompt, 6, C))
    if err is not None:
        t.fail(f"generate raised {err[0]} ({err[1]}) for a prompt of {C + 20} tokens with context_length={C}: feed "
               "the model only the last context_length tokens", bug="B09.no_crop")
    crop_probe = _gen(cfg, state, long_prompt, 6, C)
    _expect_equal(t, crop_probe, t.run(crop_probe), gen_ref(ref_model, long_prompt.clone(), 6, C),
                  f"greedy generation from a {C + 20}-token prompt (context_length={C})")

    # one probe for the batch scenarios: greedy, nothing to add, a small window, top_k=1, seeded sampling
    batch = torch.cat([_ids(chars, s) for s in ("JULIET:\n", "KING RIC", "First Ci")])
    t0 = batch.shape[1]

    def scenarios(impl):
        m = _char_model(cfg, state)
        sampled = [impl.generate(m, batch.clone(), 12, C, temperature=1.2, top_k=3,
                                 generator=torch.Generator().manual_seed(4)) for _ in range(2)]
        return {"greedy": impl.generate(m, batch.clone(), 30, C), "none": impl.generate(m, batch.clone(), 0, C),
                "window4": impl.generate(m, batch.clone(), 10, 4),
                "top_k1": impl.generate(m, batch.clone(), 10, C, temperature=1.0, top_k=1),
                "top_p_tiny": impl.generate(m, batch.clone(), 10, C, temperature=1.0, top_p=1e-6,
                                            generator=torch.Generator().manual_seed(5)), "sampled": sampled}

    got = t.run(scenarios)
    t.expect(isinstance(got, dict) and all(isinstance(v, torch.Tensor) for k, v in got.items() if k != "sampled"),
             "generate must return a tensor of token ids")
    free = gen_ref(ref_model, batch.clone(), 30, C)
    _expect_equal(t, scenarios, got, free, "greedy generation for a batch of three 8-character prompts (30 new "
                  "tokens)", pick=lambda o: o["greedy"])
    t.expect(torch.equal(got["none"], batch), "max_new_tokens=0 must return the prompt unchanged")
    _expect_equal(t, scenarios, got, gen_ref(ref_model, batch.clone(), 10, 4), "greedy generation with "
                  "context_length=4 (the window is the argument, not the model's maximum)", pick=lambda o: o["window4"])
    t.expect(torch.equal(got["top_k1"], free[:, : t0 + 10]),
             "generate(..., temperature=1.0, top_k=1) must equal greedy decoding: pass temperature, top_k and top_p "
             "on to sample_next_token")
    t.expect(torch.equal(got["top_p_tiny"], free[:, : t0 + 10]),
             "generate(..., temperature=1.0, top_p=1e-6) keeps only the most likely token at every step, so it must "
             "equal greedy decoding: pass top_p on to sample_next_token")
    s1, s2 = got["sampled"]
    t.expect(isinstance(s1, torch.Tensor) and tuple(s1.shape) == (3, t0 + 12),
             f"sampled generation of 12 tokens must return (3, {t0 + 12}); got {tuple(getattr(s1, 'shape', ()))}")
    t.expect(torch.equal(s1, s2), "two sampled runs with generators seeded alike differ: pass `generator` on to "
             "sample_next_token")
    want_s = gen_ref(ref_model, batch.clone(), 12, C, temperature=1.2, top_k=3, generator=torch.Generator().manual_seed(4))
    t.expect(torch.equal(s1, want_s), "generate(..., temperature=1.2, top_k=3, generator seeded with 4) must draw the "
             "same tokens as the course's generate with the same generator: pass temperature, top_k, top_p and the "
             "generator on to sample_next_token, one draw per step")
    with torch.no_grad():
        top3 = ref_model(s1[:, :-1]).topk(3, dim=-1).indices[:, t0 - 1:]  # the top 3 after each prefix
    inside = (top3 == s1[:, t0:, None]).any(-1)
    t.expect(bool(inside.all()), "with top_k=3 every generated token must be among the 3 most likely after its "
             f"prefix; {int((~inside).sum())} of {inside.numel()} are not (are temperature/top_k/top_p passed to "
             "sample_next_token?)")

    # EOS: rows that produce it keep emitting it; the loop stops when every row has. With the trained model the
    # newline is the end token; a stand-in model whose steps are known replaces it if its rows do not tell.
    rows = free[:, t0:].tolist()
    newline = chars.index("\n")
    steps = [row.index(newline) if newline in row else None for row in rows]
    if len(set(steps)) >= 2 and any(s is not None and any(v != newline for v in row[s:]) for s, row in zip(steps, rows)):
        eos, e_batch, e_free, e_len = newline, batch, free, C
        probe = _gen(cfg, state, batch, 30, C, eos_id=eos)
    else:
        eos, e_batch, e_len = 9, T([[0, 7], [0, 4], [0, 8], [3, 2]]), 4  # rows reach 9 after 2, 5, 1 and 7 steps
        e_free = _greedy_counter(e_batch, 30)

        def probe(impl):
            return impl.generate(_Counter(10), e_batch.clone(), 30, 4, eos_id=9)
    e_t0 = e_batch.shape[1]
    out = t.run(probe)
    t.expect(isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == e_batch.shape[0],
             f"generate with eos_id must still return (B, T0 + n) ids; got {tuple(getattr(out, 'shape', ()))}")
    for b, row in enumerate(out[:, e_t0:].tolist()):
        if eos in row:
            first = row.index(eos)
            t.expect(all(v == eos for v in row[first:]),
                     f"row {b} produced eos_id={eos} at new position {first} but kept generating other tokens after "
                     f"it: {row[first:first + 8]}…", bug="B09.eos_ignored")
    expected = _freeze_after_eos(e_free, e_t0, eos)
    if out.shape[1] > expected.shape[1] and bool((out[:, expected.shape[1] - 1:] == eos).all()):
        t.fail(f"every row had produced eos_id after {expected.shape[1] - e_t0} new tokens, but generation went on to "
               f"{out.shape[1] - e_t0}: stop as soon as all rows are finished", bug="B09.eos_ignored")
    _expect_equal(t, probe, out, expected, f"greedy generation of {e_batch.shape[0]} prompts with eos_id={eos} "
                  f"(rows finish at different steps; context_length={e_len})")

    # early stop, always exercised: a stand-in model whose rows reach eos_id=9 after 2, 5, 1 and 7 steps
    c_batch = T([[0, 7], [0, 4], [0, 8], [3, 2]])
    c_expected = _freeze_after_eos(_greedy_counter(c_batch, 30), c_batch.shape[1], 9)

    def counter_probe(impl):
        return impl.generate(_Counter(10), c_batch.clone(), 30, 4, eos_id=9)

    _expect_equal(t, counter_probe, t.run(counter_probe), c_expected, "greedy generation of 4 prompts whose rows "
                  "produce eos_id=9 after 2, 5, 1 and 7 steps: every row finished after 7 new tokens, so generation "
                  "stops there")

    # dropout: generation runs in eval mode, under no_grad, and restores the mode
    def dropout_runs(start_training: bool, n: int):
        def probe(impl):
            m = _char_model(cfg, state, dropout=0.3)
            m.train(start_training)
            grad_on = []
            m.register_forward_hook(lambda mod, inp, out: grad_on.append(torch.is_grad_enabled()))
            a = impl.generate(m, batch.clone(), n, C)
            b = impl.generate(m, batch.clone(), n, C) if start_training else a
            return a, b, m.training, any(grad_on)
        return probe

    a, b, training, grad_on = t.run(dropout_runs(True, 12))
    t.expect(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b),
             "two greedy runs of a model with dropout 0.3 (in train mode) gave different tokens: switch the model to "
             "eval() inside generate", bug="B09.train_mode")
    t.expect(training is True, "the model was in train mode before generate and must be again afterwards (restore "
             "the previous mode)")
    t.expect(grad_on is False, "the model ran with gradient tracking on: decorate generate with @torch.no_grad() (or "
             "use `with torch.no_grad():`)", bug="B09.train_mode")
    t.expect(torch.equal(a, free[:, : t0 + 12]), "greedy generation of a dropout model must equal the eval-mode result")
    _, _, training, _ = t.run(dropout_runs(False, 2))
    t.expect(training is False, "the model was in eval mode before generate and must stay in eval mode")

    # side effects: generating (from train mode and from eval mode) leaves every weight and buffer as it was
    def state_probe(impl):
        m = _char_model(cfg, state, dropout=0.3)
        m.train()
        impl.generate(m, batch.clone(), 4, C, temperature=1.0, generator=torch.Generator().manual_seed(2))
        after_train = {k: v.detach().clone() for k, v in m.state_dict().items()}
        m.eval()
        impl.generate(m, batch.clone(), 4, C)
        return after_train, {k: v.detach().clone() for k, v in m.state_dict().items()}

    for label, after in zip(("from train mode", "from eval mode"), t.run(state_probe)):
        moved = [k for k in state if k not in after or not torch.equal(state[k], after[k])]
        t.expect(not moved, f"generate {label} changed the model's weights or buffers: {moved[:4]}")


# ================================================================== 09.generate_batched


def _ref_generate_batched():
    from llmcourse.train import sampling as S

    return {"generate_batched": S.generate_batched}


# prompts of four different lengths (a batch needs padding); the one-by-one reference is unit 09's generate
BATCH_PROMPTS = ("ROMEO:", "JULIET:\nO Romeo, Romeo", "KING", "First Citizen:\nBefore we proceed")


def _one_by_one(model, prompts: list[list[int]], n: int, context: int, eos_id=None) -> torch.Tensor:
    """The contract's oracle: each prompt generated alone with unit 09's ``generate`` (greedy), the new tokens
    stacked; with ``eos_id``, rows that finished early are filled with it and the batch ends when all have."""
    from llmcourse.train.sampling import generate

    rows = [generate(model, T([p]), n, context, eos_id=eos_id)[0, len(p):].tolist() for p in prompts]
    if eos_id is not None:
        finished = [eos_id in r for r in rows]
        n = max(r.index(eos_id) + 1 for r in rows) if all(finished) else n
        rows = [(r + [eos_id] * n)[:n] for r in rows]
    return T(rows, dtype=torch.long).view(len(prompts), n)


@functools.lru_cache(maxsize=64)
def _one_by_one_ref(prompts: tuple, n: int, context: int, eos_id=None) -> torch.Tensor:
    """:func:`_one_by_one` on the character GPT of :func:`_char_setup`, computed once per process (a warm check
    server answers many checks): callers get the same tensor and must not modify it."""
    setup = _char_setup()
    return _one_by_one(_char_model(setup["cfg"], setup["state"]), [list(p) for p in prompts], n, context, eos_id)


@check(f"{U}.generate_batched", ["generate_batched"], _ref_generate_batched)
def check_generate_batched(t):
    setup = _char_setup()
    cfg, state, chars = setup["cfg"], setup["state"], setup["chars"]
    C = cfg["context_length"]
    ref_model = _char_model(cfg, state)
    prompts = [[chars.index(c) for c in s] for s in BATCH_PROMPTS]
    lengths = [len(p) for p in prompts]
    n = 16

    def main(impl):
        m = _char_model(cfg, state)
        return {"greedy": impl.generate_batched(m, [list(p) for p in prompts], n, C),
                "pad7": impl.generate_batched(m, [list(p) for p in prompts], n, C, pad_id=7),
                "none": impl.generate_batched(m, [list(p) for p in prompts], 0, C)}

    got = t.run(main)
    g = got.get("greedy") if isinstance(got, dict) else None
    t.expect(isinstance(g, torch.Tensor) and not g.is_floating_point() and tuple(g.shape) == (4, n),
             f"generate_batched(model, 4 prompts, max_new_tokens={n}, ...) must return the new tokens as a (4, {n}) "
             f"tensor of ids (the prompts not included); got {getattr(g, 'dtype', type(g).__name__)} "
             f"{tuple(getattr(g, 'shape', ()))}")
    expected = _one_by_one_ref(tuple(map(tuple, prompts)), n, C)
    wrong = [b for b in range(4) if not torch.equal(g[b], expected[b])]
    if wrong:
        b = wrong[0]
        bug = t.diagnose(main, g, atol=0, rtol=0, pick=lambda o: o["greedy"])
        t.fail(f"greedy batched generation of 4 prompts of lengths {lengths}: rows {wrong} differ from generating "
               f"each prompt alone; prompt {b} ({lengths[b]} tokens) alone continues "
               f"{_text(chars, expected[b].tolist())!r}, your batch gave {_text(chars, g[b].tolist())!r}. A padded "
               "row must compute exactly what the prompt computes alone: which columns hold its tokens, which keys its "
               "queries may see, and which position each token gets", bug=bug)
    same = isinstance(got["pad7"], torch.Tensor) and torch.equal(got["pad7"], g)
    t.expect(same, "pad_id=7 changed the generated tokens: the padding's token id must not matter (no real token may "
             "attend to a padding slot)",
             bug=None if same else t.diagnose(main, got["pad7"], atol=0, rtol=0, pick=lambda o: o["pad7"]))
    t.expect(isinstance(got["none"], torch.Tensor) and tuple(got["none"].shape) == (4, 0),
             f"max_new_tokens=0 must return a (4, 0) tensor; got {tuple(getattr(got['none'], 'shape', ()))}")

    # one model call per step for the whole batch (not a loop over the prompts)
    def calls(impl):
        m = _char_model(cfg, state)
        seen = []

        def record(mod, args, kwargs):
            x = args[0] if args else kwargs.get("idx")
            seen.append(tuple(x.shape) if isinstance(x, torch.Tensor) else None)

        m.register_forward_pre_hook(record, with_kwargs=True)
        impl.generate_batched(m, [list(p) for p in prompts], 5, C)
        return seen

    seen = t.run(calls)
    rows = [s_[0] if s_ else None for s_ in seen] if isinstance(seen, list) else []
    t.expect(len(rows) == 5 and all(r == 4 for r in rows),
             f"5 new tokens for 4 prompts must take 5 model calls, each on all 4 rows; the model saw {len(rows)} calls "
             f"with batch sizes {rows[:8]}{'…' if len(rows) > 8 else ''}", bug="B09.batch_one_by_one")

    # one prompt that fills the window exactly with the new tokens; prompts of equal length; a batch of one
    long_p = [(3 * i + 1) % len(chars) for i in range(C - 6)]
    short_p = prompts[2]

    def edges(impl):
        m = _char_model(cfg, state)
        return {"full": impl.generate_batched(m, [list(short_p), list(long_p)], 6, C),
                "equal": impl.generate_batched(m, [list(prompts[0]), list(prompts[0][::-1])], 8, C),
                "single": impl.generate_batched(m, [list(prompts[1])], 8, C)}

    e = t.run(edges)
    for key, ps, k, what in (("full", [short_p, long_p], 6, f"a {len(short_p)}-token and a {len(long_p)}-token prompt "
                              f"with 6 new tokens (exactly context_length={C} columns)"),
                             ("equal", [prompts[0], prompts[0][::-1]], 8, "two prompts of equal length (no padding)"),
                             ("single", [prompts[1]], 8, "a batch of one prompt")):
        _expect_equal(t, edges, e, _one_by_one_ref(tuple(map(tuple, ps)), k, C), f"greedy batched generation of {what}",
                      pick=lambda o, kk=key: o[kk])
    err = t.raised(lambda impl: impl.generate_batched(_char_model(cfg, state), [list(long_p), [1]], 7, C))
    t.expect(err == "ValueError", f"a {len(long_p)}-token prompt plus 7 new tokens exceeds context_length={C}: "
             f"generate_batched must raise ValueError; got {err}")

    # eos_id: rows finish at different steps (newline), frozen afterwards; the loop stops when all have
    eos = chars.index("\n")
    free = expected.tolist()
    if len({r.index(eos) if eos in r else None for r in free}) < 2:
        eos = chars.index(" ")

    def eos_probe(impl):
        return impl.generate_batched(_char_model(cfg, state), [list(p) for p in prompts], n, C, eos_id=eos)

    out = t.run(eos_probe)
    _expect_equal(t, eos_probe, out, _one_by_one_ref(tuple(map(tuple, prompts)), n, C, eos_id=eos),
                  f"greedy batched generation with eos_id={eos} (a row that produced it keeps emitting it; stop when "
                  "every row has)")

    # early stop, always exercised: a stand-in model whose rows reach eos_id=9 after 2, 5, 1 and 7 steps; every
    # row has finished after 7 new tokens, so the result has 7 columns, not max_new_tokens=30
    c_prompts = [[7], [0, 4], [8], [3, 2]]
    c_rows = []
    for p in c_prompts:
        row = [(p[-1] + 1 + i) % 10 for i in range(30)]
        c_rows.append(row[:row.index(9)] + [9] * (30 - row.index(9)))
    c_expected = T(c_rows)[:, :7]

    def counter_probe(impl):
        return impl.generate_batched(_CounterBatched(10), [list(p) for p in c_prompts], 30, 32, eos_id=9)

    c_out = t.run(counter_probe)
    if isinstance(c_out, torch.Tensor) and c_out.dim() == 2 and c_out.shape[1] > 7 and bool((c_out[:, 6:] == 9).all()):
        t.fail(f"4 prompts whose rows produce eos_id=9 after 2, 5, 1 and 7 steps: every row had finished after 7 new "
               f"tokens, but generation went on to {c_out.shape[1]} (max_new_tokens=30): stop as soon as all rows are "
               "finished", bug="B09.batch_no_early_stop")
    _expect_equal(t, counter_probe, c_out, c_expected, "greedy batched generation of 4 prompts whose rows produce "
                  "eos_id=9 after 2, 5, 1 and 7 steps (max_new_tokens=30): finished rows keep eos_id, and the result "
                  "ends after 7 new tokens, when every row has finished")

    # sampling: the generator decides; every token among the top 3 of the prompt run alone; top_k=1 is greedy
    def sampled(impl):
        m = _char_model(cfg, state)
        runs = [impl.generate_batched(m, [list(p) for p in prompts], 12, C, temperature=1.3, top_k=3,
                                      generator=torch.Generator().manual_seed(3)) for _ in range(2)]
        return {"runs": runs, "top1": impl.generate_batched(m, [list(p) for p in prompts], 12, C, temperature=1.0,
                                                            top_k=1),
                "top_p": impl.generate_batched(m, [list(p) for p in prompts], 12, C, temperature=1.0, top_p=0.01,
                                               generator=torch.Generator().manual_seed(4))}

    s = t.run(sampled)
    a, b = s["runs"]
    t.expect(isinstance(a, torch.Tensor) and tuple(a.shape) == (4, 12) and torch.equal(a, b),
             "two sampled runs with generators seeded alike differ (or have the wrong shape): pass `generator` on to "
             "the sampler")
    want_a = t.reference.generate_batched(_char_model(cfg, state), [list(p) for p in prompts], 12, C, temperature=1.3,
                                          top_k=3, generator=torch.Generator().manual_seed(3))
    t.expect(torch.equal(a, want_a), "generate_batched(..., temperature=1.3, top_k=3, generator seeded with 3) must "
             "draw the same tokens as the course's with the same generator: pass temperature, top_k, top_p and the "
             "generator on to the sampler, one draw per step for the batch")
    outside = []
    with torch.no_grad():
        for r, p in enumerate(prompts):
            seq = T([p + a[r].tolist()])
            top3 = ref_model(seq[:, :-1]).topk(3, dim=-1).indices[0, len(p) - 1:]
            outside += [(r, i) for i in range(12) if int(a[r, i]) not in top3[i].tolist()]
    t.expect(not outside, f"with top_k=3, every sampled token must be among the 3 most likely after its own prompt and "
             f"the tokens before it (the prompt run alone); {len(outside)} of 48 are not, first at (row, step) "
             f"{outside[0] if outside else None}", bug=t.diagnose(sampled, a, atol=0, rtol=0,
                                                                   pick=lambda o: o["runs"][0]) if outside else None)
    t.expect(isinstance(s["top1"], torch.Tensor) and torch.equal(s["top1"], expected[:, :12]),
             "generate_batched(..., temperature=1.0, top_k=1) must equal greedy decoding: pass temperature, top_k and "
             "top_p on to the sampler")
    # the padding slots hold pad_id (the contract names the id written there)
    def pad_probe(impl):
        m = _char_model(cfg, state)
        seen = []
        m.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(
            (args[0].clone() if args else kwargs.get("idx"), kwargs.get("attention_mask"))), with_kwargs=True)
        impl.generate_batched(m, [list(p) for p in prompts], 2, C, pad_id=7)
        return seen[0] if seen else (None, None)

    idx0, mask0 = t.run(pad_probe)
    if isinstance(idx0, torch.Tensor) and isinstance(mask0, torch.Tensor) and mask0.shape == idx0.shape:
        pads = idx0[~mask0.bool()]
        t.expect(bool((pads == 7).all()), f"generate_batched(..., pad_id=7): the padding slots of the first model "
                 f"call hold {sorted(set(pads.tolist()))[:5]}; write pad_id there")
    # top_p reaches the sampler (issue 38: it was never probed): with 65 tokens the most likely one has probability
    # >= 1/65 > 0.01, so top_p=0.01 keeps it alone, whatever the row, and sampling is greedy
    t.expect(isinstance(s["top_p"], torch.Tensor) and torch.equal(s["top_p"], expected[:, :12]),
             "generate_batched(..., temperature=1.0, top_p=0.01) must equal greedy decoding (only the most likely token "
             "survives a nucleus of mass 0.01): pass top_p on to the sampler")

    # eval mode inside, the caller's mode restored, weights unchanged
    def modes(impl):
        m = _char_model(cfg, state, dropout=0.3)
        m.train()
        out = impl.generate_batched(m, [list(p) for p in prompts], 8, C)
        return out, m.training, {k: v.detach().clone() for k, v in m.state_dict().items()}

    out, training, after = t.run(modes)
    t.expect(isinstance(out, torch.Tensor) and torch.equal(out, expected[:, :8]),
             "a model with dropout 0.3 in train mode must generate the eval-mode tokens: switch to eval() inside",
             bug="B09.train_mode")
    t.expect(training is True, "the model was in train mode before generate_batched and must be again afterwards")

    def from_eval(impl):
        m = _char_model(cfg, state)
        m.eval()
        impl.generate_batched(m, [list(p) for p in prompts], 2, C)
        return m.training

    t.expect(t.run(from_eval) is False, "the model was in eval mode before generate_batched and must be again "
             "afterwards (restore the caller's mode, whichever it was)")
    moved = [k for k in state if k not in after or not torch.equal(state[k], after[k])]
    t.expect(not moved, f"generate_batched changed the model's weights or buffers: {moved[:4]}")


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# sample_next_token: temperature, top-k, top-p and softmax in one call: sample_next_token minus the draw
also_blocked(f"{U}.sample_next_token", "llmcourse.train.sampling:filtered_probs")
# generate_batched: the left padding, the mask and the positions in one call
also_blocked(f"{U}.generate_batched", "llmcourse.train.sampling:padded_batch")


# ================================================================== grading strength (grader/strength.py)
defining_property(f"{U}.apply_temperature", "temperature divides the logits (a sharper or flatter softmax), and T <= 0 "
                  "is refused", probe="the worked example at T = 0.5 and 3; argmax unchanged; ValueError at T = 0")
defining_property(f"{U}.top_k_filter", "each row keeps the logits at or above its own k-th largest value",
                  probe="ties at the k-th value, batches with a threshold per row, k = None and k >= V")
defining_property(f"{U}.top_p_filter", "each row keeps the shortest probability-sorted prefix whose mass reaches p, "
                  "the top token always, in the original vocabulary order",
                  probe="exact thresholds on equal probabilities, shuffled vocabularies, batches, -inf inputs")
defining_property(f"{U}.sample_next_token", "temperature, then top-k, then top-p, then one seeded draw for the batch",
                  probe="frequencies of 20,000 draws vs the filtered probabilities; seeded draws repeat; greedy at T = 0")
defining_property(f"{U}.generate", "autoregressive decoding that feeds the model the most recent context_length tokens, "
                  "freezes finished rows, runs in eval mode and restores the caller's", probe="long prompts token by "
                  "token vs the reference; EOS rows; a dropout model in train mode; the mode after the call")
defining_property(f"{U}.generate_batched", "one model call per step for prompts of different lengths, each row equal "
                  "to its prompt generated alone (padding invisible through the mask and the positions)",
                  probe="greedy rows vs one-by-one generation for mixes of lengths and pad ids; seeded sampling with "
                  "top_k and top_p; EOS; modes")
decision(f"{U}.top_p_filter", "where the nucleus ends: the quantity compared with p for sorted token i and whether the "
         "comparison is strict", forms=[r"mass before (it|token i|the token) is < ?p", r"cumsum\(.{0,30}\) ?- ?sorted",
                                        r"exclusive cumulative", r"crossing token included",
                                        r"the token that (reaches|crosses) (it|p) included"],
         wrong=("B09.topp_strict", "B09.topp_not_strict"))
decision(f"{U}.top_k_filter", "what happens to logits tied with the k-th largest value (kept: the only rule that does "
         "not depend on the vocabulary order and never leaves fewer than k tokens)",
         forms=[r"ties (are |with the k-th (largest )?value are )?kept", r"keeps? (the )?ties", r"every logit equal to the k-th",
                r"equal to the k-th (largest )?value (are|is) kept", r"keeps indices 0, 1 (\*\*)?and(\*\*)? 2",
                r"\[True, True, True, False\]"],
         wrong=("B09.topk_exact_k",))
