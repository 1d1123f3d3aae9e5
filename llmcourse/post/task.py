"""A verifiable task for post-training (unit 19): multi-digit addition in a fixed chat-style format.

A program checks every answer, so the reward needs no learned reward model (the "rule-based rewards"
of DeepSeek-R1, 2025, §2.2.2: an accuracy reward plus a format reward).

**Vocabulary** (:class:`ChatTokenizer`, 16 tokens, one id each)::

    0 <pad>   1 <bos>   2 <eos>   3 <user>   4 <assistant>   5..14 the digits 0..9   15 +

**Template.** The question ``a + b`` with both operands written with exactly ``n_digits`` digits (leading
zeros kept, so every prompt of a task has the same length ``2·n_digits + 4``)::

    prompt      <bos><user>07+35<assistant>
    completion  42<eos>

The answer is the decimal sum without leading zeros, followed by ``<eos>``.

**Reward** (:func:`addition_reward`): the completion is read up to its first ``<eos>``. It is
*well-formed* when an ``<eos>`` is there and the text before it is a decimal number without leading zeros
(``0`` itself is allowed); it is *correct* when it is well-formed and the number equals ``a + b``. The reward
is ``correct_weight·correct + format_weight·well_formed`` (defaults 1.0 and 0.1, so a completion earns
0, 0.1 or 1.1).

**Split** (:class:`AdditionTask`): the ``10^(2·n_digits)`` ordered pairs are indexed ``a·10^n + b``; a seeded
permutation puts ``n_test`` of them in the held-out test set, and training pairs are drawn uniformly from
the rest (never a test pair).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

__all__ = ["SPECIAL_TOKENS", "AdditionTask", "ChatTokenizer", "addition_reward", "parse_completion"]

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<user>", "<assistant>")
_NUMBER = re.compile(r"0|[1-9][0-9]*")


class ChatTokenizer:
    """The 16-token vocabulary of the addition task: five special tokens, the ten digits and ``+``.

    ``encode(text) -> list[int]`` reads the special tokens by name and every other character alone;
    ``decode(ids) -> str`` writes them back (``decode(encode(t)) == t``). ``pad_id``, ``bos_id``,
    ``eos_id``, ``user_id``, ``assistant_id``; ``vocab_size`` = 16.

    Raises:
        ValueError: ``encode`` of a character outside the vocabulary; ``decode`` of an id outside ``[0, 16)``.
    """

    def __init__(self):
        self.tokens: tuple[str, ...] = SPECIAL_TOKENS + tuple("0123456789") + ("+",)
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.pad_id, self.bos_id, self.eos_id, self.user_id, self.assistant_id = range(5)
        self._split = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS) + "|.", re.S)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        out = []
        for piece in self._split.findall(text):
            if piece not in self.ids:
                raise ValueError(f"{piece!r} is not in the task's vocabulary {''.join(self.tokens[5:])} + "
                                 f"{', '.join(SPECIAL_TOKENS)}")
            out.append(self.ids[piece])
        return out

    def decode(self, ids) -> str:
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        bad = [i for i in ids if not 0 <= int(i) < len(self.tokens)]
        if bad:
            raise ValueError(f"token ids {bad[:5]} outside [0, {len(self.tokens)})")
        return "".join(self.tokens[int(i)] for i in ids)


def parse_completion(completion: str) -> int | None:
    """The number a completion answers, or ``None`` when it is not well-formed.

    Well-formed: the text before the first ``<eos>`` is a decimal number without leading zeros and an
    ``<eos>`` follows it (a completion cut off by the length limit is not well-formed).
    """
    head, sep, _ = completion.partition("<eos>")
    if not sep or not _NUMBER.fullmatch(head):
        return None
    return int(head)


def addition_reward(completion: str, answer: int, correct_weight: float = 1.0, format_weight: float = 0.1,
                    length_weight: float = 0.0, gate_format: bool = False) -> float:
    """Rule-based reward of one completion:
    ``correct_weight·correct + format_weight·well_formed + length_weight·length``.

    Args:
        completion: the decoded completion (the tokens after the prompt), e.g. ``"42<eos><eos>"``.
        answer: the true sum ``a + b``.
        length_weight: a bonus per token before the first ``<eos>`` (all tokens when there is none); 0 by
            default. It exists to show reward hacking: a policy paid for length learns to write long.
        gate_format: pay the format term only to a correct answer (then a tidy wrong answer earns what a
            malformed one does). Group normalisation divides by the group's std, so a group whose rewards differ
            only by the format term (``[0.1, …, 0.1, 0]``) gets advantages as large as a group that differs in
            correctness: the gate removes that amplification of the format signal.

    Returns:
        A float: with the defaults 0.0 (malformed), 0.1 (well-formed, wrong) or 1.1 (correct). See
        :func:`parse_completion` for "well-formed"; "correct" implies "well-formed".
    """
    value = parse_completion(completion)
    bonus = 0.0
    if length_weight:
        head = completion.partition("<eos>")[0]
        bonus = float(length_weight) * len(re.findall("|".join(re.escape(t) for t in SPECIAL_TOKENS) + "|.", head))
    if value is None:
        return bonus
    right = value == int(answer)
    if gate_format and not right:
        return bonus
    return float(format_weight) + (float(correct_weight) if right else 0.0) + bonus


class AdditionTask:
    """``n_digits``-digit addition with a seeded held-out test set.

    Args:
        n_digits: 1, 2 or 3 (the ordered pairs are enumerated: ``10^(2·n_digits)`` of them).
        n_test: number of held-out pairs, ``1 ≤ n_test < 10^(2·n_digits)``.
        seed: seeds the permutation that picks the test pairs.

    Attributes: ``tokenizer`` (:class:`ChatTokenizer`), ``prompt_len`` (``2·n_digits + 4``),
    ``max_new_tokens`` (``n_digits + 2``: the longest answer and its ``<eos>``), ``test_pairs``
    (``(n_test, 2)`` long tensor of ``(a, b)``).

    Raises:
        ValueError: ``n_digits`` outside 1..3 or ``n_test`` out of range.
    """

    def __init__(self, n_digits: int = 2, n_test: int = 200, seed: int = 0):
        if n_digits not in (1, 2, 3):
            raise ValueError(f"n_digits must be 1, 2 or 3, got {n_digits}")
        n_pairs = 10 ** (2 * n_digits)
        if not 1 <= n_test < n_pairs:
            raise ValueError(f"n_test must be in [1, {n_pairs}), got {n_test}")
        self.n_digits = n_digits
        self.tokenizer = ChatTokenizer()
        self.prompt_len = 2 * n_digits + 4
        self.max_new_tokens = n_digits + 2
        self._base = 10 ** n_digits
        perm = torch.randperm(n_pairs, generator=torch.Generator().manual_seed(seed))
        self._is_test = torch.zeros(n_pairs, dtype=torch.bool)
        self._is_test[perm[:n_test]] = True
        self._train_index = perm[n_test:].sort().values
        self.test_pairs = self._pairs(perm[:n_test].sort().values)

    def _pairs(self, index: Tensor) -> Tensor:
        return torch.stack([index // self._base, index % self._base], dim=1)

    def sample_train(self, n: int, generator: torch.Generator) -> Tensor:
        """``(n, 2)`` long: training pairs drawn uniformly (with replacement) from the non-test pairs."""
        pick = torch.randint(len(self._train_index), (n,), generator=generator)
        return self._pairs(self._train_index[pick])

    def is_test(self, pairs: Tensor) -> Tensor:
        """``(n,)`` bool: which of the ``(n, 2)`` pairs are held out."""
        return self._is_test[pairs[:, 0] * self._base + pairs[:, 1]]

    def prompt_text(self, a: int, b: int) -> str:
        """``"<bos><user>{a}+{b}<assistant>"`` with both operands zero-padded to ``n_digits``."""
        n = self.n_digits
        return f"<bos><user>{int(a):0{n}d}+{int(b):0{n}d}<assistant>"

    def answer_text(self, a: int, b: int) -> str:
        """The ideal completion: ``"{a+b}<eos>"``."""
        return f"{int(a) + int(b)}<eos>"

    def prompts(self, pairs: Tensor) -> Tensor:
        """``(n, prompt_len)`` long: the encoded prompts of the ``(n, 2)`` pairs."""
        return torch.tensor([self.tokenizer.encode(self.prompt_text(a, b)) for a, b in pairs.tolist()],
                            dtype=torch.long).reshape(len(pairs), self.prompt_len)

    def rewards(self, pairs: Tensor, completions: Tensor, **weights) -> Tensor:
        """``(n,)`` float32: :func:`addition_reward` of each completion row ``(n, T_c)`` for its pair."""
        return torch.tensor([addition_reward(self.tokenizer.decode(c), a + b, **weights)
                             for (a, b), c in zip(pairs.tolist(), completions)], dtype=torch.float32)

    def correct(self, pairs: Tensor, completions: Tensor) -> Tensor:
        """``(n,)`` bool: the completion is well-formed and equals ``a + b``."""
        return torch.tensor([parse_completion(self.tokenizer.decode(c)) == a + b
                             for (a, b), c in zip(pairs.tolist(), completions)], dtype=torch.bool)
