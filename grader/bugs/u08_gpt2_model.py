"""Bug catalog of unit 08 (GPT-2): one known-wrong implementation per syllabus entry.

Each mutant is the reference (:mod:`llmcourse.models.gpt2`) with exactly one mistake.
``detect="mutant"`` entries are named by matching the learner's output on the failing probe;
``detect="detector"`` entries by a property the check names (the head does not follow an in-place
change of the token embedding; the loader works only on weights already in ``nn.Linear`` layout; the
Q/K/V biases are missing from the ``state_dict``).
"""

from __future__ import annotations

import torch
from torch import nn

from llmcourse.models.gpt2 import GPT2Block, GPT2Model, gpt2_param_count

from ..core import bug_group

U = "08"

# ---------------------------------------------------------------- GPT2Model


def _model_variant(variant: str):
    class Mutant(GPT2Model):
        def __init__(self, cfg):
            super().__init__(cfg)
            if variant == "gelu_exact":
                for block in self.blocks:
                    block.ffn.activation = "gelu"
            elif variant == "untied_head" and cfg.tie_weights:
                self.lm_head.weight = nn.Parameter(torch.randn_like(self.tok_emb.weight) * 0.02)
            elif variant == "tied_by_copy" and cfg.tie_weights:
                self.lm_head.weight = nn.Parameter(self.tok_emb.weight.detach().clone())
            elif variant == "init_not_called":  # PyTorch's default initialisations, as if __init__ never called it
                for module in self.modules():
                    if isinstance(module, (nn.Linear, nn.Embedding)):
                        module.reset_parameters()
            elif variant == "no_qkv_bias":
                for block in self.blocks:
                    for name in ("W_query", "W_key", "W_value"):
                        old = getattr(block.attn, name)
                        setattr(block.attn, name, nn.Linear(old.in_features, old.out_features, bias=False))

        def embed(self, idx):
            if variant not in ("positions_offset", "emb_dropout_missing"):
                return super().embed(idx)
            t = idx.shape[1]
            if t > self.cfg.context_length:
                raise ValueError(f"sequence length {t} exceeds context_length={self.cfg.context_length}")
            if variant == "emb_dropout_missing":
                return self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
            return self.dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(1, t + 1, device=idx.device)))

        def forward(self, idx):
            x = self.embed(idx)
            for block in self.blocks:
                if variant == "post_ln":
                    x = block.norm1(x + block.dropout(block.attn(x)))
                    x = block.norm2(x + block.dropout(block.ffn(x)))
                else:
                    x = block(x)
            if variant != "no_final_norm":
                x = self.final_norm(x)
            return self.lm_head(x)

    Mutant.__name__ = Mutant.__qualname__ = f"GPT2Model_{variant}"
    Mutant.__module__ = __name__
    return Mutant


# ---------------------------------------------------------------- train-mode dropout (GPT2Block and GPT2Model)


def _block_variant(variant: str):
    class BlockMutant(GPT2Block):
        def __init__(self, cfg):
            super().__init__(cfg)
            if variant == "attn_dropout_missing":
                for d in self.attn.modules():
                    if isinstance(d, nn.Dropout):
                        d.p = 0.0

        def forward(self, x):
            if variant == "resid_dropout_missing":
                x = x + self.attn(self.norm1(x))
                return x + self.ffn(self.norm2(x))
            if variant == "dropout_on_sum":
                x = self.dropout(x + self.attn(self.norm1(x)))
                return self.dropout(x + self.ffn(self.norm2(x)))
            return super().forward(x)

    class ModelMutant(GPT2Model):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.blocks = nn.ModuleList(BlockMutant(cfg) for _ in range(cfg.n_layers))
            self.init_weights()

    for cls, name in ((BlockMutant, f"GPT2Block_{variant}"), (ModelMutant, f"GPT2Model_{variant}")):
        cls.__name__ = cls.__qualname__ = name
        cls.__module__ = __name__
    return {"GPT2Block": BlockMutant, "GPT2Model": ModelMutant}


for _bug, _variant, _hint in [
    ("B08.resid_dropout_missing", "resid_dropout_missing",
     "In train mode each sublayer's output is dropped before it joins the residual stream."),
    ("B08.dropout_on_sum", "dropout_on_sum",
     "Residual dropout acts on the sublayer's output, not on the residual stream after the add."),
    ("B08.attn_dropout_missing", "attn_dropout_missing",
     "The attention layer drops its weights with the config's dropout too."),
]:
    bug_group(_bug, f"{U}.GPT2Model", _hint, _block_variant(_variant), "detector")

for _bug, _variant, _hint, _detect in [
    ("B08.emb_dropout_missing", "emb_dropout_missing",
     "The sum of the token and position embeddings is dropped in train mode too.", "detector"),
    ("B08.gelu_exact", "gelu_exact", "GPT-2 uses the tanh approximation of GELU (`gelu_new`).", "mutant"),
    ("B08.post_ln", "post_ln", "GPT-2 blocks are pre-LN: normalise the input of each sublayer, not the sum.",
     "mutant"),
    ("B08.no_final_norm", "no_final_norm", "Apply the final LayerNorm (HF `ln_f`) before the head.", "mutant"),
    ("B08.positions_offset", "positions_offset", "Positions are 0 … T−1.", "mutant"),
    ("B08.untied_head", "untied_head", "Tie the output head to the token embedding.", "detector"),
    ("B08.tied_by_copy", "tied_by_copy",
     "Tying shares one Parameter object; a copy drifts apart during training.", "detector"),
    ("B08.no_qkv_bias", "no_qkv_bias", "GPT-2's attention projections have biases.", "detector"),
    ("B08.init_not_called", "init_not_called", "A model must start from GPT-2's initialisation as soon as it is "
     "built: the constructor runs init_weights.", "detector"),
]:
    bug_group(_bug, f"{U}.GPT2Model", _hint, {"GPT2Model": _model_variant(_variant)}, _detect)

# ---------------------------------------------------------------- gpt2_param_count / count_parameters


def _count_tied_twice_formula(cfg):
    """The formula of an untied model, whatever ``tie_weights`` says."""
    total = gpt2_param_count(cfg)
    return total + (cfg.vocab_size * cfg.d_model if cfg.tie_weights else 0)


def _count_ignores_qkv_bias(cfg):
    """The formula with Q/K/V biases always counted, whatever ``qkv_bias`` says."""
    total = gpt2_param_count(cfg)
    return total + (0 if cfg.qkv_bias else 3 * cfg.d_model * cfg.n_layers)


def _count_state_dict(model):
    """Sums the ``state_dict`` tensors: a tied weight appears there under both names."""
    return sum(v.numel() for v in model.state_dict().values())


_COUNT_HINT = "Count the shared tensor once."
bug_group("B08.count_tied_twice", f"{U}.gpt2_param_count", _COUNT_HINT, {"gpt2_param_count": _count_tied_twice_formula})
bug_group("B08.count_tied_twice", f"{U}.gpt2_param_count", _COUNT_HINT, {"count_parameters": _count_state_dict})
bug_group("B08.count_ignores_qkv_bias", f"{U}.gpt2_param_count",
          "Read the config: without Q/K/V biases a block has three D-vectors fewer.",
          {"gpt2_param_count": _count_ignores_qkv_bias})

# ---------------------------------------------------------------- load_hf_gpt2


def _strip(sd):
    return {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in sd.items()
            if not k.endswith((".attn.bias", ".attn.masked_bias"))}


@torch.no_grad()
def _load(model, hf_state_dict, variant: str):
    """The reference mapping with one mistake (``variant``)."""
    sd = _strip(hf_state_dict)
    d = model.cfg.d_model

    def put(param, value):
        if tuple(param.shape) != tuple(value.shape):
            raise ValueError(f"shape mismatch: model {tuple(param.shape)}, checkpoint {tuple(value.shape)}")
        param.copy_(value)

    def conv(w, which):
        # which: "attn" (attn.c_proj), "fc" (mlp.c_fc), "proj" (mlp.c_proj)
        if variant == "no_transpose" or (variant == "c_proj_not_transposed" and which == "attn"):
            return w
        return w.T

    put(model.tok_emb.weight, sd["wte.weight"])
    put(model.pos_emb.weight, sd["wpe.weight"])
    for i, block in enumerate(model.blocks):
        h = f"h.{i}."
        put(block.norm1.weight, sd[h + "ln_1.weight"])
        put(block.norm1.bias, sd[h + "ln_1.bias"])
        w, b = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]
        if variant == "split_dim0":
            parts = [p.T for p in w.reshape(3, d, d)]          # as if Q, K, V were stacked along dim 0
        elif variant == "split_dim0_linear_layout":
            parts = list(w.split(d, dim=0))                   # treats (D, 3D) as nn.Linear's (3D, D)
        else:
            parts = [w[:, j * d:(j + 1) * d].T for j in range(3)]
        biases = [b[j * d:(j + 1) * d] for j in range(3)]
        order = (1, 0, 2) if variant == "kqv_order" else (0, 1, 2)
        for name, j in zip(("W_query", "W_key", "W_value"), order):
            lin = getattr(block.attn, name)
            put(lin.weight, parts[j])
            if variant != "no_qkv_bias":
                put(lin.bias, biases[j])
        put(block.attn.out_proj.weight, conv(sd[h + "attn.c_proj.weight"], "attn"))
        put(block.attn.out_proj.bias, sd[h + "attn.c_proj.bias"])
        put(block.norm2.weight, sd[h + "ln_2.weight"])
        put(block.norm2.bias, sd[h + "ln_2.bias"])
        put(block.ffn.fc1.weight, conv(sd[h + "mlp.c_fc.weight"], "fc"))
        put(block.ffn.fc1.bias, sd[h + "mlp.c_fc.bias"])
        put(block.ffn.fc2.weight, conv(sd[h + "mlp.c_proj.weight"], "proj"))
        put(block.ffn.fc2.bias, sd[h + "mlp.c_proj.bias"])
    put(model.final_norm.weight, sd["ln_f.weight"])
    put(model.final_norm.bias, sd["ln_f.bias"])
    if variant == "tied_by_copy" and model.lm_head.weight is model.tok_emb.weight:
        model.lm_head.weight = nn.Parameter(model.tok_emb.weight.detach().clone())
    return model


def _load_variant(variant):
    def load(model, hf_state_dict):
        return _load(model, hf_state_dict, variant)
    load.__name__ = f"load_hf_gpt2_{variant}"
    return load


for _bug, _variant, _hint, _detect in [
    ("B08.conv1d_not_transposed", "c_proj_not_transposed",
     "HF GPT-2 uses Conv1D, which stores weights as (in, out); transpose them for nn.Linear.", "mutant"),
    ("B08.conv1d_not_transposed", "no_transpose",
     "HF GPT-2 uses Conv1D, which stores weights as (in, out); transpose them for nn.Linear.", "detector"),
    ("B08.c_attn_split_dim0", "split_dim0",
     "The fused Q/K/V are concatenated along the output dimension (dim 1 of the (in, out) layout).", "mutant"),
    ("B08.c_attn_split_dim0", "split_dim0_linear_layout",
     "The fused Q/K/V are concatenated along the output dimension (dim 1 of the (in, out) layout).", "detector"),
    ("B08.c_attn_order", "kqv_order", "The order inside `c_attn` is query, key, value.", "mutant"),
    ("B08.no_qkv_bias", "no_qkv_bias", "GPT-2's attention projections have biases: load them too.", "mutant"),
    ("B08.tied_by_copy", "tied_by_copy",
     "Tying shares one Parameter object; a copy drifts apart during training.", "detector"),
]:
    bug_group(_bug, f"{U}.load_hf_gpt2", _hint, {"load_hf_gpt2": _load_variant(_variant)}, _detect)

