"""Evaluation metrics: chrF, the character n-gram F-score (unit 06).

Source: Popović, "chrF: character n-gram F-score for automatic MT evaluation" (WMT 2015), with the
corpus-level aggregation and defaults of sacreBLEU's ``CHRF`` (``char_order=6``, ``word_order=0``,
``beta=2``, whitespace removed): n-gram statistics are **summed over the corpus first**, then turned
into per-order precision and recall, averaged over orders, and combined into one F-β score.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["chrf", "chrf_statistics"]


def _ngrams(text: str, k: int) -> Counter:
    return Counter(text[i:i + k] for i in range(len(text) - k + 1))


def _check(hypotheses, references, n, beta) -> None:
    for name, xs in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(xs, str) or not all(isinstance(x, str) for x in xs):
            raise ValueError(f"{name} must be a list of strings (one per sentence), got {type(xs).__name__}")
    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses but {len(references)} references; they pair up one to one")
    if n < 1:
        raise ValueError(f"the maximum n-gram order n must be ≥ 1, got {n}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")


def chrf_statistics(hypotheses: list[str], references: list[str], n: int = 6) -> list[tuple[int, int, int]]:
    """Per order k = 1…n, the corpus sums ``(matches, hypothesis k-grams, reference k-grams)``.

    Whitespace is removed from every string first; matches are clipped per sentence,
    ``Σ_g min(H_k[g], R_k[g])``.
    """
    _check(hypotheses, references, n, 1.0)
    stats = [[0, 0, 0] for _ in range(n)]
    for hyp, ref in zip(hypotheses, references):
        hyp, ref = "".join(hyp.split()), "".join(ref.split())
        for k in range(1, n + 1):
            h, r = _ngrams(hyp, k), _ngrams(ref, k)
            s = stats[k - 1]
            s[0] += sum(min(c, r[g]) for g, c in h.items())
            s[1] += sum(h.values())
            s[2] += sum(r.values())
    return [tuple(s) for s in stats]


def chrf(hypotheses: list[str], references: list[str], n: int = 6, beta: float = 2.0) -> float:
    """Corpus-level chrF in ``[0, 100]`` (exercise ``06.chrf``).

    For each order k = 1…n with at least one hypothesis or reference k-gram: ``P_k = matches/hyp_count``
    (0 without hypothesis k-grams), ``R_k = matches/ref_count`` (0 without reference k-grams). ``P`` and
    ``R`` are the means over those orders, and ``chrF = 100·(1+β²)·P·R/(β²·P + R)`` (0 when ``P + R = 0``).
    β = 2 weighs recall twice as much as precision.

    F06.3: ``chrf(["the cat sat"], ["the cat sat on the mat"]) = 49.5935``, the reverse 79.7386,
    ``chrf(["the cat", "a dog"], ["the cat", "the dog"]) = 63.8322`` (averaging sentence scores instead is
    a known bug), ``chrf(["a b"], ["ab"]) = 100``.

    Compared with sacrebleu (``sacrebleu.metrics.CHRF(char_order=6, word_order=0, beta=2)``, version 2.6.0):
    the scores are equal whenever every hypothesis and every reference has at least ``n`` non-space
    characters. They differ on shorter sentences, in two ways: sacrebleu does not count a sentence's
    hypothesis k-grams of an order its reference has none of, and it averages ``P_k``, ``R_k`` only over the
    orders with both counts non-zero ("effective order"), while this definition keeps every order with a
    k-gram on either side (with ``P_k = 0`` or ``R_k = 0``). So ``chrf(["ab"], ["abcd"])`` is 23.5849 here
    and 47.1698 in sacrebleu. The course keeps its definition (it is the exercise's contract);
    ``tests/test_unit06_translation_transformer.py`` tests the equality and both differences.

    Raises:
        ValueError: lists of different lengths, a non-string entry, ``n < 1`` or ``beta <= 0``.
    """
    _check(hypotheses, references, n, beta)
    ps, rs = [], []
    for matches, hyp_count, ref_count in chrf_statistics(hypotheses, references, n):
        if hyp_count == 0 and ref_count == 0:
            continue
        ps.append(matches / hyp_count if hyp_count else 0.0)
        rs.append(matches / ref_count if ref_count else 0.0)
    if not ps:
        return 0.0
    p, r = sum(ps) / len(ps), sum(rs) / len(rs)
    if p + r == 0:
        return 0.0
    b2 = beta * beta
    return 100.0 * (1 + b2) * p * r / (b2 * p + r)
