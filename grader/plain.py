"""Plain data: what may cross from a learner's worker process to the checker.

A probe's result (and every error record) is converted by :func:`plain` inside the worker and sent
as ``torch.save`` bytes; the checker reads them with ``torch.load(weights_only=True)``
(:func:`loads`). The weights-only unpickler rebuilds only plain tensors, numbers, strings, bools,
``None``, lists, tuples, dicts, torch dtypes and the one marker class of this module, so nothing the
checker receives can run learner code when it is deserialised or used: no tensor subclasses, no
custom ``__eq__``, no pickled learner objects.

:func:`plain` is also applied to the results of the reference and the mutants (which run in the
checker), so a check sees the same kind of value from every implementation.
"""

from __future__ import annotations

import io
import math
import numbers

import torch

__all__ = ["Opaque", "PlainError", "dumps", "loads", "plain"]

MAX_DEPTH = 8
MAX_ITEMS = 100_000


class Opaque:
    """Stands for an object that is not plain data (a module, a learner class, a generator...).

    Equal to nothing; its repr names the type, which is what a failure message needs.
    """

    def __init__(self, type_name: str = "object"):
        self.type_name = str(type_name)

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"

    def __eq__(self, other) -> bool:  # never equal: an opaque object is not a valid answer
        return False

    __hash__ = object.__hash__


torch.serialization.add_safe_globals([Opaque])


class PlainError(TypeError):
    """A value could not be converted to plain data (too deep, too many items)."""


def _type_name(x) -> str:
    t = type(x)
    mod = getattr(t, "__module__", "") or ""
    return t.__qualname__ if mod in ("builtins", "__learner__", "") else f"{mod}.{t.__qualname__}"


def plain(x, _depth: int = 0):
    """A copy of ``x`` made only of plain types (see the module docstring).

    Tensors (subclasses and Parameters included) become detached, contiguous, plain ``torch.Tensor``
    copies; ``numbers`` become ``int``/``float``/``complex``/``bool``; sequences become lists or tuples;
    mappings become dicts; ``torch.Size`` a tuple; devices a string; numpy arrays tensors; anything
    else an :class:`Opaque` marker naming its type.
    """
    if _depth > MAX_DEPTH:
        raise PlainError("nested too deeply")
    if x is None or type(x) in (bool, int, float, str, complex, bytes):
        return x
    if isinstance(x, torch.Tensor):
        t = torch.Tensor._make_subclass(torch.Tensor, x.detach(), False) if type(x) is not torch.Tensor else x.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        if t.is_meta:
            return torch.empty(t.shape, dtype=t.dtype, device="meta")
        return t.clone(memory_format=torch.contiguous_format)
    if isinstance(x, torch.dtype):
        return x
    if isinstance(x, torch.device):
        return str(x)
    if isinstance(x, torch.Size):
        return tuple(int(v) for v in x)
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        return float(x)
    if isinstance(x, numbers.Complex):
        return complex(x)
    if isinstance(x, str):
        return str(x)
    if type(x).__module__ == "numpy" and hasattr(x, "shape") and hasattr(x, "dtype"):
        try:
            return torch.from_numpy(x.copy()) if x.shape else plain(x.item(), _depth + 1)
        except (TypeError, ValueError):
            return Opaque(_type_name(x))
    if isinstance(x, dict):
        if len(x) > MAX_ITEMS:
            raise PlainError("too many items")
        return {plain(k, _depth + 1): plain(v, _depth + 1) for k, v in list(x.items())}
    if isinstance(x, (list, tuple, set, frozenset, range)):
        items = list(x)
        if len(items) > MAX_ITEMS:
            raise PlainError("too many items")
        out = [plain(v, _depth + 1) for v in items]
        return tuple(out) if isinstance(x, tuple) else out
    return Opaque(_type_name(x))


def dumps(obj) -> bytes:
    """``torch.save`` bytes of plain data."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def loads(data: bytes):
    """Read bytes written by :func:`dumps` with the weights-only unpickler (never runs learner code)."""
    return torch.load(io.BytesIO(data), weights_only=True)


def is_finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
