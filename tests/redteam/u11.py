"""Unit 11 red-team corpus (see tests/redteam/__init__.py): each answer an edit of the reference solution.

An answer that changes ``rotate_half`` carries ``apply_rope`` too: the test runs the answer in a copy of the
solution's namespace, and only a function defined in that copy calls the answer's ``rotate_half``.
"""

from tests.redteam import Answer
from tests.redteam.edits import edited, solution_def

U = "11"
_GQA, _M = "GroupedQueryAttention", "Llama3Model"
_TABLES = "rope_inv_freq(hd, cfg.rope_theta, cfg.rope_scaling)"
_SMOOTHING = ('    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]\n'
              '    orig = scaling["original_max_position_embeddings"]\n'
              "    wavelen = 2 * math.pi / inv\n"
              "    out = torch.where(wavelen > orig / low, inv / factor, inv)\n"
              "    s = (orig / wavelen - low) / (high - low)\n"
              "    smoothed = (1 - s) * out / factor + s * out\n"
              "    medium = (wavelen >= orig / high) & (wavelen <= orig / low)\n"
              "    return torch.where(medium, smoothed, out)\n")

ANSWERS = [
    # ---------------------------------------------------------------- 11.RMSNorm
    Answer("11.RMSNorm", "LayerNorm-style centring", edited(U, "RMSNorm",
           ("        xf = x.float()\n", "        xf = x.float()\n        xf = xf - xf.mean(-1, keepdim=True)\n")),
           bug="B11.rms_mean_subtracted"),
    Answer("11.RMSNorm", "eps outside the square root", edited(U, "RMSNorm",
           ("xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)",
            "xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)")), bug="B11.rms_eps_outside"),
    Answer("11.RMSNorm", "statistics in the input's dtype (bfloat16)", edited(U, "RMSNorm",
           ("xf = x.float()", "xf = x")), bug="B11.rms_low_precision"),
    Answer("11.RMSNorm", "the float32 copy detached (same values, no gradient to the input)", edited(U, "RMSNorm",
           ("xf = x.float()", "xf = x.float().detach()")), says=r"gradient"),
    # ---------------------------------------------------------------- 11.SwiGLUFeedForward
    Answer("11.SwiGLUFeedForward", "gate and up exchanged (SiLU on the up projection)", edited(U, "SwiGLUFeedForward",
           ("        g = self.gate_proj(x)\n        return self.down_proj(g * torch.sigmoid(g) * self.up_proj(x))",
            "        u = self.up_proj(x)\n        return self.down_proj(u * torch.sigmoid(u) * self.gate_proj(x))")),
           bug="B11.swiglu_swapped"),
    Answer("11.SwiGLUFeedForward", "GELU instead of SiLU", edited(U, "SwiGLUFeedForward",
           ("g * torch.sigmoid(g)", "torch.nn.functional.gelu(g)")), bug="B11.swiglu_gelu"),
    # ---------------------------------------------------------------- 11.rope
    Answer("11.rope", "interleaved pairs (x0, x1) instead of half-split", edited(U, "rotate_half",
           ("    h = x.shape[-1] // 2\n    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)\n",
            "    x1, x2 = x[..., 0::2], x[..., 1::2]\n    return torch.stack((-x2, x1), dim=-1).flatten(-2)\n"))
           + "\n\n" + edited(U, "rope_cos_sin", ("torch.cat((angles, angles), dim=-1)",
                                               "torch.repeat_interleave(angles, 2, dim=-1)"))
           + "\n\n" + solution_def(U, "apply_rope"), says=r"= cat\(f, f\)"),
    Answer("11.rope", "every frequency divided by the factor (no smoothing bands)", edited(U, "rope_inv_freq",
           (_SMOOTHING, '    return inv / scaling["factor"]\n')), says=r"Llama-3 scaling 32/1/4/8192"),
    Answer("11.rope", "exponent i / head_dim with i = 0, 1, 2, … (not 2i / head_dim)", edited(U, "rope_inv_freq",
           ("torch.arange(0, head_dim, 2, dtype=torch.float32)", "torch.arange(0, head_dim // 2, dtype=torch.float32)")),
           says=r"the eight inverse frequencies"),
    Answer("11.rope", "a pair exactly at the long limit scaled twice (>= for the slow band, <= for the blend)",
           edited(U, "rope_inv_freq", ("wavelen > orig / low", "wavelen >= orig / low")), says=r"continuous"),
    # ---------------------------------------------------------------- 11.GroupedQueryAttention
    Answer("11.GroupedQueryAttention", "ignores its mask argument and builds its own causal tril", edited(U, _GQA,
           ('scores.masked_fill(~mask, float("-inf"))',
            'scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))')),
           says=r"non-causal boolean mask.*apply the mask you are given", origin="issue 38"),
    Answer("11.GroupedQueryAttention", "KV heads tiled (repeat) instead of interleaved", edited(U, _GQA,
           ("k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)",
            "k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)")), bug="B11.repeat_not_interleave"),
    Answer("11.GroupedQueryAttention", "no 1/sqrt(head_dim) scale", edited(U, _GQA,
           (" / math.sqrt(self.head_dim)", "")), says=r"vs F.scaled_dot_product_attention"),
    Answer("11.GroupedQueryAttention", "rotated queries detached (same outputs, q_proj never trained)", edited(U, _GQA,
           ("q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)",
            "q, k = apply_rope(q, cos, sin).detach(), apply_rope(k, cos, sin)")), says=r"no gradient reached"),
    # ---------------------------------------------------------------- 11.Llama3Model
    Answer("11.Llama3Model", "rope_scaling ignored when the tables are built", edited(U, _M,
           (_TABLES, "rope_inv_freq(hd, cfg.rope_theta, None)")),
           says=r"logits vs transformers' LlamaForCausalLM.*Llama-3 smoothing"),
    Answer("11.Llama3Model", "no final norm before the head", edited(U, _M,
           ("return self.lm_head(self.norm(x))", "return self.lm_head(x)")),
           says=r"logits vs transformers' LlamaForCausalLM"),
    Answer("11.Llama3Model", "theta fixed at 10,000", edited(U, _M, (_TABLES, "rope_inv_freq(hd, 10000.0, cfg.rope_scaling)")),
           says=r"logits vs transformers' LlamaForCausalLM"),
    Answer("11.Llama3Model", "a sequence of exactly context_length tokens refused (T >= C)", edited(U, _M,
           ("if t > self.cfg.context_length:", "if t >= self.cfg.context_length:")), says=r"exactly context_length"),
]
