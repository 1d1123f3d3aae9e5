"""Next-token training pairs from a token stream: sliding windows and a seeded ``DataLoader``.

A window starting at ``s`` gives the input ``x = ids[s : s+L]`` and the target ``y = ids[s+1 : s+L+1]``
(the input shifted left by one token), so position ``t`` of ``y`` is the token that follows
``x[: t+1]``. Window starts are ``range(0, len(ids) − L, stride)``: the last start leaves room for
the ``L+1`` tokens a complete target needs. With stride ≥ L consecutive inputs do not overlap.

On the-verdict's 5,145 GPT-2 tokens (F01.4): ``L=4, stride=1`` gives 5,141 windows, ``stride=4`` 1,286.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

__all__ = ["GPTWindowDataset", "create_dataloader", "window_starts"]


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return value


def _as_id_tensor(token_ids) -> Tensor:
    if isinstance(token_ids, Tensor):
        if token_ids.dim() != 1:
            raise ValueError(f"token_ids must be 1-D (one long stream of ids); got shape {tuple(token_ids.shape)}")
        if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
            raise ValueError(f"token_ids must hold integer ids; got dtype {token_ids.dtype}")
        return token_ids.detach().to(torch.long).cpu()
    if isinstance(token_ids, str):
        raise TypeError("token_ids is a string: encode the text first (e.g. enc.encode(text))")
    ids = list(token_ids)
    bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)), None)
    if bad is not None:
        raise ValueError(f"token_ids must be integer ids; got {bad!r} ({type(bad).__name__})")
    return torch.tensor(ids, dtype=torch.long)


def window_starts(n_tokens: int, context_length: int, stride: int) -> range:
    """``range(0, n_tokens − context_length, stride)``: the start of every complete window."""
    return range(0, n_tokens - context_length, stride)


class GPTWindowDataset(Dataset):
    """Sliding windows over one token stream: item ``i`` is ``(x, y)``, each long ``(context_length,)``.

    Args:
        token_ids: a list of ints or a 1-D integer tensor (kept as one ``long`` tensor).
        context_length: L, the window length (≥ 1).
        stride: the step between window starts (≥ 1); ``stride = L`` gives non-overlapping windows.

    Raises:
        ValueError: ``context_length`` or ``stride`` not a positive integer; fewer than
            ``context_length + 1`` tokens (no complete target window); ids that are not integers.
        IndexError: (``__getitem__``) an index outside ``-len … len−1``.
    """

    def __init__(self, token_ids: list[int] | Tensor, context_length: int, stride: int):
        self.context_length = _check_positive_int("context_length", context_length)
        self.stride = _check_positive_int("stride", stride)
        self.ids = _as_id_tensor(token_ids)
        if len(self.ids) <= context_length:
            raise ValueError(f"the text has {len(self.ids)} tokens, but one window needs context_length + 1 = "
                             f"{context_length + 1} (input plus the shifted target); use a shorter context_length "
                             "or a longer text")
        self.starts = window_starts(len(self.ids), context_length, stride)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        s = self.starts[i]  # IndexError for out-of-range i; negative indices count from the end
        L = self.context_length
        return self.ids[s: s + L], self.ids[s + 1: s + L + 1]


def create_dataloader(token_ids, batch_size: int, context_length: int, stride: int, shuffle: bool = True,
                      drop_last: bool = True, seed: int = 0) -> DataLoader:
    """A ``DataLoader`` of ``(x, y)`` batches, each long ``(batch_size, context_length)``.

    Shuffling uses ``torch.Generator().manual_seed(seed)``, so two loaders with the same seed give the
    same batches (and the global RNG is neither used nor advanced); ``num_workers=0``.

    Raises:
        ValueError: as :class:`GPTWindowDataset`, or ``batch_size`` not a positive integer.
    """
    _check_positive_int("batch_size", batch_size)
    ds = GPTWindowDataset(token_ids, context_length, stride)
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, num_workers=0,
                      generator=torch.Generator().manual_seed(seed))
