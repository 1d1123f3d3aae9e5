"""Unit 08 red-team corpus (see tests/redteam/__init__.py): each answer an edit of the reference solution.

An answer that changes ``GPT2Block`` carries ``GPT2Model`` too: the test runs the answer in a copy of the solution's
namespace, and only a model class defined in that copy builds its blocks from the answer's ``GPT2Block``.
"""

from tests.redteam import Answer
from tests.redteam.edits import edited, solution_def

U = "08"
B, M = "GPT2Block", "GPT2Model"
_F = "import torch.nn.functional as F\n"
_EMB = "x = self.dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device)))"
_SCALED = ("        for block in self.blocks:\n"
           "            nn.init.normal_(block.attn.out_proj.weight, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layers))\n"
           "            nn.init.normal_(block.ffn.fc2.weight, 0.0, 0.02 / math.sqrt(2 * self.cfg.n_layers))\n")

ANSWERS = [
    # ---------------------------------------------------------------- 08.GPT2Config
    Answer("08.GPT2Config", "an unknown preset falls back to GPT-2 small", edited(U, "GPT2Config",
           ('        if name not in sizes:\n            raise KeyError(f"unknown preset {name!r}")\n', ""),
           ("sizes[name]", "sizes.get(name, (12, 768, 12))")), says=r"must raise KeyError"),
    Answer("08.GPT2Config", "presets shared between calls (one cached object per name)", "_PRESETS = {}\n\n\n"
           + edited(U, "GPT2Config", ("        return config\n",
                                      "        return _PRESETS.setdefault(name, config)\n")),
           says=r"must return a new object"),
    Answer("08.GPT2Config", "gpt2-char-tiny keeps the default dropout 0.1", edited(U, "GPT2Config",
           ("config.vocab_size, config.context_length, config.dropout = 65, 64, 0.0",
            "config.vocab_size, config.context_length = 65, 64")), says=r"'dropout': 0\.0"),
    # ---------------------------------------------------------------- 08.GPT2Model
    Answer("08.GPT2Model", "dropout on in eval mode (F.dropout(..., training=True))", _F + edited(U, B,
           ("        self.dropout = nn.Dropout(cfg.dropout)\n",
            "        self.dropout = nn.Dropout(cfg.dropout)\n        self.p = cfg.dropout\n"),
           ("self.dropout(self.attn(self.norm1(x)))", "F.dropout(self.attn(self.norm1(x)), self.p, training=True)"),
           ("self.dropout(self.ffn(self.norm2(x)))", "F.dropout(self.ffn(self.norm2(x)), self.p, training=True)"))
           + "\n\n" + edited(U, M, (_EMB, "x = F.dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(t)), "
                                         "self.cfg.dropout, training=True)")),
           says=r"in eval mode.*dropout must be off", origin="issue 38"),
    Answer("08.GPT2Model", "an extra dropout before the head", edited(U, M,
           ("return self.lm_head(self.final_norm(x))", "return self.lm_head(self.dropout(self.final_norm(x)))")),
           says=r"not after the blocks or before the head", origin="issue 38"),
    Answer("08.GPT2Model", "no scaled init of the residual projections", edited(U, M, (_SCALED, "")),
           says=r"residual projections use 0\.02"),
    Answer("08.GPT2Model", "post-LN blocks (norm after the residual add)", edited(U, B,
           ("x = x + self.dropout(self.attn(self.norm1(x)))", "x = self.norm1(x + self.dropout(self.attn(x)))"),
           ("return x + self.dropout(self.ffn(self.norm2(x)))", "return self.norm2(x + self.dropout(self.ffn(x)))"))
           + "\n\n" + solution_def(U, M), bug="B08.post_ln"),
    Answer("08.GPT2Model", "the head is a copy of the embedding, not the same Parameter", edited(U, M,
           ("self.lm_head.weight = self.tok_emb.weight",
            "self.lm_head.weight = nn.Parameter(self.tok_emb.weight.detach().clone())")), bug="B08.untied_head"),
    Answer("08.GPT2Model", "init_weights written but never called by the constructor", edited(U, M,
           ("        self.init_weights()\n", "")), bug="B08.init_not_called"),
    Answer("08.GPT2Model", "each block's output detached (the same logits, nothing trains below the top)",
           edited(U, M, ("x = block(x)", "x = block(x).detach()")), says=r"no gradient reached"),
    # ---------------------------------------------------------------- 08.gpt2_param_count
    Answer("08.gpt2_param_count", "builds the model on the meta device and counts it", edited(U, "gpt2_param_count",
           ("    v, c, d, n = cfg.vocab_size, cfg.context_length, cfg.d_model, cfg.n_layers\n"
            "    total = v * d + c * d + n * (12 * d * d + 13 * d) + 2 * d\n"
            "    if not cfg.tie_weights:\n        total += v * d\n"
            "    if not cfg.qkv_bias:\n        total -= 3 * d * n\n"
            "    return total\n",
            "    with torch.device(\"meta\"):\n        model = llmcourse.GPT2Model(cfg)\n"
            "    return sum(p.numel() for p in model.parameters())\n")),
           says=r"no model is built", origin="issue 38"),
    Answer("08.gpt2_param_count", "the formula ignores qkv_bias", edited(U, "gpt2_param_count",
           ("    if not cfg.qkv_bias:\n        total -= 3 * d * n\n", "")), bug="B08.count_ignores_qkv_bias"),
    Answer("08.gpt2_param_count", "count_parameters sums the state dict (tied head twice)", edited(U, "count_parameters",
           ("    unique = {id(p): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}\n"
            "    return sum(unique.values())\n",
            "    return sum(t.numel() for t in model.state_dict().values())\n")), bug="B08.count_tied_twice"),
    # ---------------------------------------------------------------- 08.load_hf_gpt2
    Answer("08.load_hf_gpt2", "Conv1D weights copied without a transpose (the square ones load silently)",
           edited(U, "load_hf_gpt2",
                  ("        if param.shape != value.shape:\n            raise",
                   "        if param.shape != value.shape:\n            value = value.T\n"
                   "        if param.shape != value.shape:\n            raise"),
                  ("w[:, j * d:(j + 1) * d].T", "w[:, j * d:(j + 1) * d]"),
                  ('sd[h + "attn.c_proj.weight"].T', 'sd[h + "attn.c_proj.weight"]'),
                  ('sd[h + "mlp.c_fc.weight"].T', 'sd[h + "mlp.c_fc.weight"]'),
                  ('sd[h + "mlp.c_proj.weight"].T', 'sd[h + "mlp.c_proj.weight"]')),
           says=r"logits of the loaded model vs transformers"),
    Answer("08.load_hf_gpt2", "a new Parameter assigned to the embedding (the tied head is left behind)",
           edited(U, "load_hf_gpt2", ('put(model.tok_emb.weight, sd["wte.weight"])',
                                      'model.tok_emb.weight = nn.Parameter(sd["wte.weight"].clone())')),
           bug="B08.tied_by_copy"),
    Answer("08.load_hf_gpt2", "the fused c_attn's shape never checked (three D-wide slices of any width)",
           edited(U, "load_hf_gpt2", ('        if w.shape != (d, 3 * d):\n'
                                      '            raise ValueError(f"c_attn.weight must be ({d}, {3 * d}), got '
                                      '{tuple(w.shape)}")\n', "")), says=r"c_attn weight of shape \(64, 196\)"),
]
