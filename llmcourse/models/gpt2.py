"""GPT-2 (unit 08): config and presets, the model, exact parameter counts and the Hugging Face loader.

A decoder-only Transformer: token embedding + **learned** absolute position embedding (dropout on the
sum) → ``n_layers`` pre-LN :class:`GPT2Block` (causal multi-head attention **with** Q/K/V biases, a
``4·D`` feed-forward network with the tanh-approximate GELU, residual dropout) → a final LayerNorm →
``lm_head``, a bias-free linear map to the vocabulary whose weight **is** the token embedding's
Parameter (weight tying).

Everything is built from llmcourse's earlier pieces: :class:`~llmcourse.nn.multihead.MultiHeadAttention`
(unit 04, ``causal=True``), :class:`~llmcourse.nn.norms.LayerNorm` and
:class:`~llmcourse.nn.feedforward.FeedForward` (unit 05, activation ``"gelu_tanh"``).

Hugging Face's ``GPT2LMHeadModel`` stores the same function under other names and in another layout:
``transformer.wte/wpe/h.{i}/ln_f``, a fused ``c_attn`` (query, key, value concatenated along the output
dimension) and ``Conv1D`` layers whose weights are stored ``(in, out)``, the transpose of
``nn.Linear.weight``. :func:`load_hf_gpt2` maps one onto the other.

Sources: Radford et al., "Language Models are Unsupervised Multitask Learners" (2019), §2.3 (pre-LN,
final LayerNorm, residual init scaled by 1/√N, vocabulary 50,257, context 1,024); OpenAI's
``gpt-2/src/model.py`` and ``transformers.models.gpt2.modeling_gpt2`` (the layout and the ``gelu_new``
activation the numerical parity tests match).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..nn.feedforward import FeedForward
from ..nn.multihead import MultiHeadAttention
from ..nn.norms import LayerNorm
from .inputs import token_ids_length

__all__ = [
    "GPT2_PRESETS", "GPT2Block", "GPT2Config", "GPT2Model", "count_parameters", "find_pretrained_gpt2",
    "gpt2_param_breakdown", "gpt2_param_count", "hf_gpt2_config", "load_hf_gpt2", "load_pretrained_gpt2",
    "pretrained_gpt2_dir", "random_hf_gpt2",
]

# the preset names of GPT2Config.preset (the table itself lives in that method)
GPT2_PRESETS: tuple[str, ...] = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt2-char-tiny")


@dataclass
class GPT2Config:
    """Hyper-parameters of :class:`GPT2Model`; the defaults are GPT-2 small's (124,439,808 parameters).

    Fields: ``vocab_size`` V (50,257 = 50,000 BPE merges + 256 byte tokens + ``<|endoftext|>``),
    ``context_length`` C (number of learned positions), ``d_model`` D, ``n_heads`` H (D divisible by H),
    ``n_layers`` L, ``dropout`` (embedding, attention-weight and residual dropout; 0.1 as GPT-2's
    ``*_pdrop``), ``qkv_bias`` (GPT-2's Q/K/V projections have biases), ``layer_norm_eps``,
    ``tie_weights`` (``lm_head.weight`` is ``tok_emb.weight``). The FFN width is ``d_ff = 4·D``.

    ``GPT2Config.preset(name)`` returns a new config for one of :data:`GPT2_PRESETS`: ``"gpt2-small"``, ``"gpt2-medium"``,
    ``"gpt2-large"``, ``"gpt2-xl"`` (the four released sizes) and ``"gpt2-char-tiny"`` (the course's
    character model: V 65, C 64, D 128, H 4, L 4, dropout 0.0; 809,856 parameters). Unknown names raise
    ``KeyError``. ``to_dict()`` / ``GPT2Config(**d)`` round-trip through plain Python types (checkpoints
    store the dict, loadable with ``torch.load(..., weights_only=True)``).
    """

    vocab_size: int = 50257
    context_length: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    dropout: float = 0.1
    qkv_bias: bool = True
    layer_norm_eps: float = 1e-5
    tie_weights: bool = True

    @classmethod
    def preset(cls, name: str) -> GPT2Config:
        table = {  # the fields that differ from the defaults (GPT-2 small's)
            "gpt2-small": {"n_layers": 12, "d_model": 768, "n_heads": 12},
            "gpt2-medium": {"n_layers": 24, "d_model": 1024, "n_heads": 16},
            "gpt2-large": {"n_layers": 36, "d_model": 1280, "n_heads": 20},
            "gpt2-xl": {"n_layers": 48, "d_model": 1600, "n_heads": 25},
            "gpt2-char-tiny": {"vocab_size": 65, "context_length": 64, "d_model": 128, "n_heads": 4, "n_layers": 4,
                               "dropout": 0.0},
        }
        if name not in table:
            raise KeyError(f"unknown GPT-2 preset {name!r}; choose one of {sorted(table)}")
        return cls(**table[name])

    @property
    def d_ff(self) -> int:
        """Hidden width of the feed-forward network, ``4·d_model``."""
        return 4 * self.d_model

    @property
    def head_dim(self) -> int:
        """Width of one attention head, ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        """The fields as a plain dict (ints, floats, bools)."""
        return dataclasses.asdict(self)


class GPT2Block(nn.Module):
    """One GPT-2 layer: pre-LN causal self-attention and a tanh-GELU feed-forward network.

    ``forward(x)``::

        x = x + dropout(attn(norm1(x)))      # causal, H heads, Q/K/V biases when cfg.qkv_bias
        x = x + dropout(ffn(norm2(x)))       # fc1: D -> 4D, GELU (tanh), fc2: 4D -> D

    ``state_dict`` keys: ``norm1.{weight,bias}`` (D), ``attn.{W_query,W_key,W_value}.{weight (D, D),bias (D)}``,
    ``attn.out_proj.{weight (D, D),bias (D)}``, ``norm2.*``, ``ffn.fc1.{weight (4D, D),bias (4D)}``,
    ``ffn.fc2.{weight (D, 4D),bias (D)}``; ``12·D² + 13·D`` parameters (7,087,872 for D = 768).
    Matches ``transformers``' ``GPT2Block`` (``ln_1, attn, ln_2, mlp``) loaded with the same weights.

    Shapes: ``(B, T, D)`` -> ``(B, T, D)``, ``T ≤ context_length``.
    """

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        d = cfg.d_model
        self.norm1 = LayerNorm(d, eps=cfg.layer_norm_eps)
        self.attn = MultiHeadAttention(d, d, cfg.n_heads, dropout=cfg.dropout, qkv_bias=cfg.qkv_bias, causal=True,
                                       context_length=cfg.context_length)
        self.norm2 = LayerNorm(d, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(d, cfg.d_ff, activation="gelu_tanh")
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``mask``: optional bool ``(B, 1, T, T)`` (or broadcastable), ``True`` = may attend, ANDed with the causal
        mask by the attention (a left-padded batch: see :meth:`GPT2Model.forward`)."""
        x = x + self.dropout(self.attn(self.norm1(x)) if mask is None else self.attn(self.norm1(x), mask=mask))
        return x + self.dropout(self.ffn(self.norm2(x)))


class GPT2Model(nn.Module):
    """GPT-2 with a language-modelling head.

    Args:
        cfg: a :class:`GPT2Config` (``GPT2Config.preset("gpt2-char-tiny")`` for the course's small model).

    ``state_dict`` keys (D = d_model, V = vocab_size, C = context_length)::

        tok_emb.weight (V, D)                   pos_emb.weight (C, D)
        blocks.{i}.norm1.weight / .bias (D)
        blocks.{i}.attn.W_query.weight (D, D) / .bias (D)     (also W_key, W_value)
        blocks.{i}.attn.out_proj.weight (D, D) / .bias (D)
        blocks.{i}.norm2.weight / .bias (D)
        blocks.{i}.ffn.fc1.weight (4D, D) / .bias (4D)        blocks.{i}.ffn.fc2.weight (D, 4D) / .bias (D)
        final_norm.weight / .bias (D)
        lm_head.weight (V, D)                   (no bias; the same Parameter as tok_emb.weight when tied)

    ``forward(idx)``: ``idx`` (B, T) long, ``T ≤ C`` -> logits (B, T, V) float32 (no softmax). Position
    ``t`` sees tokens ``0 … t`` only. ``hidden_states(idx)`` returns the residual stream after the
    embedding and after every block (``L + 1`` tensors (B, T, D), before the final norm), for
    layer-by-layer comparisons.

    ``forward(idx, attention_mask=None, position_ids=None)`` batches sequences of different lengths, with
    ``transformers``' meaning of the two arguments (``GPT2LMHeadModel``): ``attention_mask`` (B, T) bool or 0/1,
    ``True``/1 = a real token, ``False``/0 = padding that no query may attend to (as a key); ``position_ids``
    (B, T) long in ``0 … C−1``, the row of ``pos_emb`` each token gets (default ``0 … T−1`` in every row; the
    model never derives positions from the mask, as ``transformers``' forward does not either). A padded query
    attends to itself only, so its (meaningless) output stays finite; the outputs of real tokens are those of
    the same tokens run alone when each row's real tokens are contiguous and numbered from 0. Both ``None``
    runs exactly the unbatched computation (bit-identical to ``forward(idx)``).

    The weights are initialised by :meth:`init_weights` (GPT-2's scheme) at construction. Parameters:
    :func:`gpt2_param_count` (124,439,808 for GPT-2 small, 809,856 for ``gpt2-char-tiny``); build on the
    ``meta`` device (``with torch.device("meta"): GPT2Model(cfg)``) to count the large presets without
    allocating memory.

    Raises:
        ValueError: in ``forward``, when ``idx`` is not 2-D or ``T > context_length``; an ``attention_mask`` or
            ``position_ids`` whose shape is not ``idx``'s, or a position outside ``0 … C−1``.

    Numerically equal (``atol 1e-5``) to ``transformers.GPT2LMHeadModel`` after :func:`load_hf_gpt2`.
    """

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        if cfg.d_model % cfg.n_heads != 0:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2's initialisation, in place.

        Every ``nn.Linear`` and ``nn.Embedding`` weight ~ N(0, 0.02²), every bias 0, LayerNorm weight 1 and
        bias 0; then the two projections that write into the residual stream, ``attn.out_proj.weight`` and
        ``ffn.fc2.weight`` of every block, ~ N(0, (0.02/√(2·n_layers))²) so that the variance the
        ``2·L`` residual additions contribute stays independent of depth (GPT-2 paper, §2.3). Draws
        come from torch's global generator; a no-op on the ``meta`` device.
        """
        if self.tok_emb.weight.is_meta:  # shapes only: nothing to draw
            return
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.out_proj.weight, mean=0.0, std=std)
            nn.init.normal_(block.ffn.fc2.weight, mean=0.0, std=std)

    def embed(self, idx: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """``dropout(tok_emb(idx) + pos_emb(positions))``: (B, T) long -> (B, T, D); ``positions`` are
        ``position_ids`` (B, T) or, by default, ``0 … T−1``."""
        t = token_ids_length(idx, self.cfg.context_length, "GPT2Model")
        if position_ids is None:
            positions = torch.arange(t, device=idx.device)
        else:
            if not isinstance(position_ids, Tensor) or tuple(position_ids.shape) != tuple(idx.shape) \
                    or position_ids.is_floating_point():
                raise ValueError(f"position_ids must be integer ids of idx's shape {tuple(idx.shape)}, got "
                                 f"{getattr(position_ids, 'dtype', type(position_ids).__name__)} "
                                 f"{tuple(getattr(position_ids, 'shape', ()))}")
            if position_ids.numel() and (int(position_ids.min()) < 0
                                         or int(position_ids.max()) >= self.cfg.context_length):
                raise ValueError(f"position_ids must lie in 0 … {self.cfg.context_length - 1}, got "
                                 f"{int(position_ids.min())} … {int(position_ids.max())}")
            positions = position_ids
        return self.dropout(self.tok_emb(idx) + self.pos_emb(positions))

    def padding_mask(self, attention_mask: Tensor | None, idx: Tensor) -> Tensor | None:
        """The (B, 1, T, T) bool mask the blocks get for a padded batch: key ``j`` is visible to query ``i`` when
        token ``j`` is real, or ``j = i`` (a padded query sees itself, so no softmax row is empty); the causal
        part is added by the attention. ``None`` for ``attention_mask=None``."""
        if attention_mask is None:
            return None
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(idx.shape):
            raise ValueError(f"attention_mask must have idx's shape {tuple(idx.shape)} (True/1 = real token), got "
                             f"{tuple(getattr(attention_mask, 'shape', ())) or type(attention_mask).__name__}")
        real = attention_mask.bool()
        t = idx.shape[1]
        own = torch.eye(t, dtype=torch.bool, device=idx.device)
        return real[:, None, None, :] | own

    def forward(self, idx: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None) -> Tensor:
        mask = self.padding_mask(attention_mask, idx)
        x = self.embed(idx) if position_ids is None else self.embed(idx, position_ids)
        for block in self.blocks:
            x = block(x) if mask is None else block(x, mask)
        return self.lm_head(self.final_norm(x))

    def hidden_states(self, idx: Tensor, attention_mask: Tensor | None = None,
                      position_ids: Tensor | None = None) -> list[Tensor]:
        """Residual stream after the embedding and after each block: ``L + 1`` tensors (B, T, D).

        ``transformers``' ``output_hidden_states`` returns the same first ``L`` tensors; its last one is
        ``ln_f`` applied to the output of block ``L``. ``attention_mask`` and ``position_ids``: as in ``forward``.
        """
        mask = self.padding_mask(attention_mask, idx)
        states = [self.embed(idx) if position_ids is None else self.embed(idx, position_ids)]
        for block in self.blocks:
            states.append(block(states[-1]) if mask is None else block(states[-1], mask))
        return states


# ------------------------------------------------------------------------------------------------
# parameter accounting
# ------------------------------------------------------------------------------------------------


def gpt2_param_count(cfg: GPT2Config) -> int:
    """Exact number of parameters of ``GPT2Model(cfg)``, from the formula.

    ``V·D + C·D + L·(12·D² + 13·D) + 2·D``, plus ``V·D`` when the head is untied, minus ``3·D·L`` without
    Q/K/V biases. Per block: attention ``4·D² + 4·D`` (Q, K, V, out with biases), FFN ``8·D² + 5·D``,
    two LayerNorms ``4·D``. GPT-2 small: 124,439,808 (163,037,184 untied).
    """
    v, c, d, n = cfg.vocab_size, cfg.context_length, cfg.d_model, cfg.n_layers
    total = v * d + c * d + n * (12 * d * d + 13 * d) + 2 * d
    if not cfg.tie_weights:
        total += v * d
    if not cfg.qkv_bias:
        total -= 3 * d * n
    return total


def count_parameters(model: nn.Module) -> int:
    """Number of scalars in the **unique** parameter tensors of ``model`` (a tied tensor counted once).

    Works on the ``meta`` device (shapes only). Equals ``sum(p.numel() for p in model.parameters())``,
    because ``parameters()`` yields a shared Parameter once.
    """
    seen: set[int] = set()
    total = 0
    for _, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def gpt2_param_breakdown(cfg: GPT2Config) -> dict[str, int]:
    """Parameter counts by component (formula): ``token_embedding``, ``position_embedding``,
    ``attention``, ``ffn``, ``block_norms`` (all blocks together), ``final_norm``, ``lm_head`` (0 when tied)
    and ``total`` (== :func:`gpt2_param_count`)."""
    v, c, d, n = cfg.vocab_size, cfg.context_length, cfg.d_model, cfg.n_layers
    parts = {
        "token_embedding": v * d,
        "position_embedding": c * d,
        "attention": n * (4 * d * d + (4 if cfg.qkv_bias else 1) * d),
        "ffn": n * (8 * d * d + 5 * d),
        "block_norms": n * 4 * d,
        "final_norm": 2 * d,
        "lm_head": 0 if cfg.tie_weights else v * d,
    }
    parts["total"] = sum(parts.values())
    if parts["total"] != gpt2_param_count(cfg):  # two independent routes to the same number
        raise RuntimeError("gpt2_param_breakdown disagrees with gpt2_param_count")
    return parts


# ------------------------------------------------------------------------------------------------
# Hugging Face interop
# ------------------------------------------------------------------------------------------------

_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


@torch.no_grad()
def load_hf_gpt2(model: GPT2Model, hf_state_dict: dict[str, Tensor]) -> GPT2Model:
    """Copy a Hugging Face GPT-2 ``state_dict`` into ``model`` in place and return ``model``.

    Accepts the keys of ``GPT2LMHeadModel`` (``transformer.wte.weight`` …) or of the bare ``GPT2Model``
    / the hub's ``model.safetensors`` (``wte.weight`` …). Mapping (HF ``Conv1D`` stores ``(in, out)``):

    ====================================== ============================================ ===================
    HF key                                 course key                                   transform
    ====================================== ============================================ ===================
    ``wte.weight`` (V, D)                  ``tok_emb.weight``                           copy (head follows)
    ``wpe.weight`` (C, D)                  ``pos_emb.weight``                           copy
    ``h.{i}.ln_1.*``, ``h.{i}.ln_2.*``     ``blocks.{i}.norm1.*``, ``norm2.*``          copy
    ``h.{i}.attn.c_attn.weight`` (D, 3D)   ``blocks.{i}.attn.W_query/W_key/W_value``    split dim 1, ``.T``
    ``h.{i}.attn.c_attn.bias`` (3D)        their biases                                 split in three
    ``h.{i}.attn.c_proj.*`` (D, D)         ``blocks.{i}.attn.out_proj.*``               ``.T`` / copy
    ``h.{i}.mlp.c_fc.*`` (D, 4D)           ``blocks.{i}.ffn.fc1.*``                     ``.T`` / copy
    ``h.{i}.mlp.c_proj.*`` (4D, D)         ``blocks.{i}.ffn.fc2.*``                     ``.T`` / copy
    ``ln_f.*``                             ``final_norm.*``                             copy
    ``lm_head.weight``                     (tied: not copied; untied: ``lm_head.weight``, else ``wte``)
    ====================================== ============================================ ===================

    The non-parameter buffers ``….attn.bias`` / ``….attn.masked_bias`` of older checkpoints are ignored.
    Tying survives (the copy goes into the shared tensor). Values are cast to the model's dtype.

    Raises:
        ValueError: any shape mismatch (e.g. a ``c_attn`` split along the wrong dim, another config).
        KeyError: a missing HF key.
    """
    sd = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in hf_state_dict.items()
          if not k.endswith(_IGNORED_SUFFIXES)}

    def get(key: str) -> Tensor:
        if key not in sd:
            raise KeyError(f"the Hugging Face state dict has no {key!r} (nor 'transformer.{key}'); is it GPT-2?")
        return sd[key]

    def put(param: Tensor, value: Tensor, what: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise ValueError(f"shape mismatch for {what}: the model has {tuple(param.shape)}, the checkpoint "
                             f"gives {tuple(value.shape)}")
        param.copy_(value.to(dtype=param.dtype, device=param.device))

    put(model.tok_emb.weight, get("wte.weight"), "tok_emb.weight <- wte.weight")
    put(model.pos_emb.weight, get("wpe.weight"), "pos_emb.weight <- wpe.weight")
    d = model.cfg.d_model
    for i, block in enumerate(model.blocks):
        h = f"h.{i}."
        put(block.norm1.weight, get(h + "ln_1.weight"), f"blocks.{i}.norm1.weight")
        put(block.norm1.bias, get(h + "ln_1.bias"), f"blocks.{i}.norm1.bias")
        w = get(h + "attn.c_attn.weight")
        if w.dim() != 2 or w.shape[1] != 3 * d:
            raise ValueError(f"shape mismatch for h.{i}.attn.c_attn.weight: expected (D, 3D) = ({d}, {3 * d}), "
                             f"got {tuple(w.shape)}")
        b = get(h + "attn.c_attn.bias")
        for j, name in enumerate(("W_query", "W_key", "W_value")):
            lin = getattr(block.attn, name)
            put(lin.weight, w[:, j * d:(j + 1) * d].T, f"blocks.{i}.attn.{name}.weight")
            if lin.bias is not None:
                put(lin.bias, b[j * d:(j + 1) * d], f"blocks.{i}.attn.{name}.bias")
        put(block.attn.out_proj.weight, get(h + "attn.c_proj.weight").T, f"blocks.{i}.attn.out_proj.weight")
        put(block.attn.out_proj.bias, get(h + "attn.c_proj.bias"), f"blocks.{i}.attn.out_proj.bias")
        put(block.norm2.weight, get(h + "ln_2.weight"), f"blocks.{i}.norm2.weight")
        put(block.norm2.bias, get(h + "ln_2.bias"), f"blocks.{i}.norm2.bias")
        put(block.ffn.fc1.weight, get(h + "mlp.c_fc.weight").T, f"blocks.{i}.ffn.fc1.weight")
        put(block.ffn.fc1.bias, get(h + "mlp.c_fc.bias"), f"blocks.{i}.ffn.fc1.bias")
        put(block.ffn.fc2.weight, get(h + "mlp.c_proj.weight").T, f"blocks.{i}.ffn.fc2.weight")
        put(block.ffn.fc2.bias, get(h + "mlp.c_proj.bias"), f"blocks.{i}.ffn.fc2.bias")
    put(model.final_norm.weight, get("ln_f.weight"), "final_norm.weight")
    put(model.final_norm.bias, get("ln_f.bias"), "final_norm.bias")
    if model.lm_head.weight is not model.tok_emb.weight:
        head = sd.get("lm_head.weight", sd["wte.weight"])
        put(model.lm_head.weight, head, "lm_head.weight")
    return model


def hf_gpt2_config(cfg: GPT2Config, attn_implementation: str = "eager", **overrides):
    """The ``transformers.GPT2Config`` describing the same model as ``cfg``.

    ``n_positions = context_length``, ``n_embd = d_model``, ``n_layer``, ``n_head``, ``vocab_size``,
    ``resid_pdrop = embd_pdrop = attn_pdrop = dropout``, ``layer_norm_epsilon``,
    ``activation_function = "gelu_new"`` (tanh GELU), ``tie_word_embeddings``. ``bos/eos_token_id`` are
    set to ``vocab_size − 1`` (GPT-2's ``<|endoftext|>`` is the last id). ``qkv_bias=False`` has no
    equivalent in transformers (``ValueError``). ``overrides`` go to the config unchanged.
    """
    from transformers import GPT2Config as HFGPT2Config

    if not cfg.qkv_bias:
        raise ValueError("transformers' GPT-2 always has Q/K/V biases; qkv_bias=False has no HF equivalent")
    kwargs = {
        "vocab_size": cfg.vocab_size, "n_positions": cfg.context_length, "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout, "layer_norm_epsilon": cfg.layer_norm_eps, "activation_function": "gelu_new",
        "tie_word_embeddings": cfg.tie_weights, "bos_token_id": cfg.vocab_size - 1,
        "eos_token_id": cfg.vocab_size - 1, "attn_implementation": attn_implementation,
    }
    kwargs.update(overrides)
    return HFGPT2Config(**kwargs)


@torch.no_grad()
def random_hf_gpt2(cfg: GPT2Config, seed: int = 0, std: float = 0.2, attn_implementation: str = "eager"):
    """A ``transformers.GPT2LMHeadModel`` for ``cfg`` in eval mode, with **every** parameter re-drawn.

    Each parameter tensor (in ``named_parameters()`` order; the tied head once) is replaced by
    ``std · N(0, 1)`` from ``torch.Generator().manual_seed(seed)``, LayerNorm weights by ``1 + std · N(0, 1)``.
    Large, asymmetric weights make every layout error numerically visible: a missing transpose of a square
    ``c_proj`` or an exchanged query/key block changes the logits by far more than ``1e-5``, which HF's own
    initialisation (``c_proj`` small, LayerNorms 1/0, biases 0) would hide.
    """
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(hf_gpt2_config(cfg, attn_implementation=attn_implementation))
    g = torch.Generator().manual_seed(seed)
    for name, p in hf.named_parameters():
        noise = std * torch.randn(p.shape, generator=g)
        p.copy_(1.0 + noise if (".ln_" in name and name.endswith("weight")) else noise)
    return hf.eval()


# ------------------------------------------------------------------------------------------------
# optional: the real GPT-2 weights, when the learner has a local copy
# ------------------------------------------------------------------------------------------------

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def pretrained_gpt2_dir(name: str = "gpt2"):
    """``<user cache>/pretrained/<name>`` (``~/.cache/llmcourse/pretrained/gpt2`` by default).

    The course never downloads these weights; a learner with the internet can place a Hugging Face
    GPT-2 checkpoint there (``config.json`` plus ``model.safetensors`` or ``pytorch_model.bin``, e.g.
    from ``huggingface_hub.snapshot_download("openai-community/gpt2", local_dir=...)``).
    """
    from ..data.resolve import cache_dir

    return cache_dir() / "pretrained" / name


def find_pretrained_gpt2(path=None):
    """The weight file of a local GPT-2 checkpoint, or ``None`` when there is none.

    ``path`` is a checkpoint folder or a weight file; default :func:`pretrained_gpt2_dir`.
    """
    from pathlib import Path

    path = Path(path) if path is not None else pretrained_gpt2_dir()
    if path.is_file():
        return path
    for name in _WEIGHT_FILES:
        if (path / name).is_file():
            return path / name
    return None


@torch.no_grad()
def load_pretrained_gpt2(path=None, dropout: float = 0.0) -> GPT2Model:
    """A :class:`GPT2Model` holding a local Hugging Face GPT-2 checkpoint, in eval mode.

    Args:
        path: a checkpoint folder or weight file (default :func:`pretrained_gpt2_dir`).
        dropout: the model's dropout (0 for inference).

    The config comes from the folder's ``config.json`` (``n_embd``, ``n_head``, ``n_layer``,
    ``n_positions``, ``vocab_size``, ``layer_norm_epsilon``, ``tie_word_embeddings``), else GPT-2 small.
    ``.safetensors`` files are read with ``safetensors``; ``.bin`` files with
    ``torch.load(weights_only=True)``. Weights are mapped by :func:`load_hf_gpt2`.

    Raises:
        FileNotFoundError: no checkpoint there (the message says where to put one).
    """
    import json

    file = find_pretrained_gpt2(path)
    if file is None:
        where = path if path is not None else pretrained_gpt2_dir()
        raise FileNotFoundError(f"no GPT-2 checkpoint in {where}: put config.json and model.safetensors (or "
                                f"pytorch_model.bin) of a Hugging Face GPT-2 there")
    cfg = GPT2Config(dropout=dropout)
    config_file = file.parent / "config.json"
    if config_file.is_file():
        hf = json.loads(config_file.read_text(encoding="utf-8"))
        cfg = GPT2Config(vocab_size=hf.get("vocab_size", 50257), context_length=hf.get("n_positions", 1024),
                         d_model=hf.get("n_embd", 768), n_heads=hf.get("n_head", 12), n_layers=hf.get("n_layer", 12),
                         dropout=dropout, layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                         tie_weights=hf.get("tie_word_embeddings", True))
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(file))
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
    return load_hf_gpt2(GPT2Model(cfg), state).eval()
