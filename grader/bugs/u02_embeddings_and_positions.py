"""Bug catalog of unit 02 (embeddings and positions): one known-wrong implementation per syllabus entry.

Each mutant is the reference with exactly one mistake. ``detect="mutant"`` entries are recognised by
matching the learner's output on the failing input; ``detect="detector"`` entries by a property that the
check names explicitly (a buffer in ``parameters()``, a table that ``.to(float64)`` leaves in float32, the
slowest pair moving fastest, dropout outputs of the wrong form, a shape error for T < max_len).

The sinusoidal-formula mistakes are registered twice: for ``02.sinusoidal_pe`` (the function) and for
``02.PositionalEncoding`` (a module whose buffer holds the wrong table), so both checks can name them.
``B02.shift_transposed`` is not in the syllabus's table; it is the mistake the lesson's rotation
picture invites (the transpose rotates the other way and maps p to p − k).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core import bug, bug_group

U = "02"

# ---------------------------------------------------------------- InputEmbeddings


class _InputEmbeddingsBase(nn.Module):
    variant = ""

    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)

    def forward(self, ids):
        e = self.embedding(ids)
        if self.variant == "no_scale":
            return e
        if self.variant == "times_d":
            return e * self.d_model
        if self.variant == "divide_sqrt":
            return e / math.sqrt(self.d_model)
        return e * math.sqrt(self.d_model)


def _register_input(bug_id, variant, hint):
    cls = type(f"InputEmbeddings_{variant}", (_InputEmbeddingsBase,), {"variant": variant})
    bug(bug_id, f"{U}.InputEmbeddings", hint, name="InputEmbeddings")(cls)


_register_input("B02.no_scale", "no_scale", "The Transformer scales token embeddings by √d_model.")
_register_input("B02.scale_by_d", "times_d", "Multiply by the square root of d_model.")
_register_input("B02.scale_by_d", "divide_sqrt", "Multiply by the square root of d_model.")

# ---------------------------------------------------------------- sinusoidal_pe


def _pe_variant(max_len, d_model, variant=""):
    if d_model % 2:
        raise ValueError("d_model must be even")
    p = torch.arange(max_len, dtype=torch.float64)[:, None]
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    if variant == "arange_step1":  # exponent j/D for every column j instead of 2i/D for the pair
        angles = p / 10000.0 ** (torch.arange(d_model, dtype=torch.float64) / d_model)
        pe[:, 0::2], pe[:, 1::2] = angles[:, 0::2].sin(), angles[:, 1::2].cos()
        return pe.float()
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    sign = 1.0 if variant == "positive_exponent" else -1.0
    angles = p * torch.exp(sign * two_i * math.log(10000.0) / d_model)
    if variant == "sin_cos_swapped":
        pe[:, 0::2], pe[:, 1::2] = angles.cos(), angles.sin()
    elif variant == "concat_halves":
        pe = torch.cat([angles.sin(), angles.cos()], dim=-1)
    else:
        pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
    return pe.float()


PE_FORMULA_BUGS = {
    "sin_cos_swapped": ("B02.sin_cos_swapped", "Even dims use sine, odd dims use cosine.", "mutant"),
    "concat_halves": ("B02.concat_halves", "This course interleaves: `pe[:, 0::2]` and `pe[:, 1::2]`.", "mutant"),
    "arange_step1": ("B02.arange_step1", "One frequency per **pair**: `arange(0, D, 2)`.", "mutant"),
    "positive_exponent": ("B02.positive_exponent", "The frequencies are `10000^(−2i/D)`.", "detector"),
}


def _register_pe(variant):
    bug_id, hint, detect = PE_FORMULA_BUGS[variant]

    def f(max_len, d_model):
        return _pe_variant(max_len, d_model, variant)

    f.__name__ = f"sinusoidal_pe_{variant}"
    bug_group(bug_id, f"{U}.sinusoidal_pe", hint, {"sinusoidal_pe": f}, detect)


for _v in PE_FORMULA_BUGS:
    _register_pe(_v)

# ---------------------------------------------------------------- PositionalEncoding


class _PositionalEncodingBase(nn.Module):
    variant = ""
    table = ""

    def __init__(self, d_model, max_len, dropout=0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        pe = _pe_variant(max_len, d_model, self.table).unsqueeze(0)
        if self.variant == "pe_parameter":
            self.pe = nn.Parameter(pe)
        elif self.variant == "pe_attribute":
            self.pe = pe
        elif self.variant == "pe_persistent":
            self.register_buffer("pe", pe)
        else:
            self.register_buffer("pe", pe, persistent=False)
        self.max_len = max_len

    def forward(self, x):
        t = x.shape[1]
        if t > self.max_len:
            raise ValueError("sequence longer than max_len")
        if self.variant == "pe_not_sliced":
            return self.dropout(x + self.pe)
        if self.variant == "pe_dropout_only":
            return x + self.dropout(self.pe[:, :t])
        return self.dropout(x + self.pe[:, :t])


def _register_module(bug_id, hint, variant="", table="", detect="detector"):
    cls = type(f"PositionalEncoding_{variant or table}", (_PositionalEncodingBase,),
               {"variant": variant, "table": table})
    bug(bug_id, f"{U}.PositionalEncoding", hint, detect=detect, name="PositionalEncoding")(cls)


_register_module("B02.pe_parameter", "Count the module's parameters: an optimizer would train the fixed table, and "
                 "every checkpoint would carry it.", "pe_parameter")
_register_module("B02.pe_attribute", "Call module.to(torch.float64) and look at the dtype of self.pe afterwards.",
                 "pe_attribute")
_register_module("B02.pe_persistent", "List the keys of state_dict(): the table can be recomputed from max_len and "
                 "d_model, so a checkpoint should not carry it.", "pe_persistent")
_register_module("B02.pe_dropout_only", "Dropout goes on the sum x + PE.", "pe_dropout_only")
_register_module("B02.pe_not_sliced", "Slice `pe[:, :T]`.", "pe_not_sliced")
for _v in ("sin_cos_swapped", "concat_halves", "arange_step1"):
    _bug_id, _hint, _ = PE_FORMULA_BUGS[_v]
    _register_module(_bug_id, _hint, table=_v, detect="mutant")

# ---------------------------------------------------------------- shift_matrix


def _shift_transposed(k, omega):
    c, s = math.cos(omega * k), math.sin(omega * k)
    return torch.tensor([[c, -s], [s, c]])


bug_group("B02.shift_transposed", f"{U}.shift_matrix",
          "M_k must map (sin ωp, cos ωp) to position p + k; the transposed matrix rotates the other way (p − k).",
          {"shift_matrix": _shift_transposed})

# ---------------------------------------------------------------- GPTEmbedding


class _GPTEmbeddingFromOne(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, dropout=0.0):
        super().__init__()
        self.context_length = context_length
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.context_length:
            raise ValueError("sequence longer than context_length")
        positions = torch.arange(1, t + 1, device=idx.device)
        return self.dropout(self.tok_emb(idx) + self.pos_emb(positions))


bug("B02.positions_from_one", f"{U}.GPTEmbedding", "Positions start at 0.", name="GPTEmbedding")(_GPTEmbeddingFromOne)


class _GPTEmbeddingPositionsOnCPU(_GPTEmbeddingFromOne):
    def forward(self, idx):
        t = idx.shape[1]
        if t > self.context_length:
            raise ValueError("sequence longer than context_length")
        positions = torch.arange(t)  # made on the default device, wherever idx lives
        return self.dropout(self.tok_emb(idx) + self.pos_emb(positions))


bug("B02.positions_default_device", f"{U}.GPTEmbedding",
    "Move the module and idx to another device (the 'meta' device exists on every machine) and look at where the "
    "position ids are made.", detect="detector", name="GPTEmbedding")(_GPTEmbeddingPositionsOnCPU)
