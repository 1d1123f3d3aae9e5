"""Unit 03's red-team answers (see tests/redteam/__init__.py)."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "03"
SOFTMAX_MAX = "x.amax(dim=dim, keepdim=True)"
SDPA_FILL = '    if mask is not None:\n        scores = scores.masked_fill(~mask, float("-inf"))\n'
SDPA_TAIL = "    used = dropout(weights) if dropout is not None else weights\n    return used @ v, weights\n"
SA_CALL = ("        context, _ = scaled_dot_product_attention(self.W_query(x), self.W_key(x), self.W_value(x))\n"
           "        return context\n")
CSA_CALL = "context, weights = scaled_dot_product_attention(q, k, v, mask=self.mask[:t, :t], dropout=self.dropout)"

ANSWERS = [
    # -- 03.softmax_stable -----------------------------------------------------------------------------------
    Answer("03.softmax_stable", "the max taken over the last axis whatever dim is", edited(U, "softmax_stable",
           (SOFTMAX_MAX, "x.amax(dim=-1, keepdim=True)")), says=r"dim"),
    Answer("03.softmax_stable", "one global max for the whole tensor", edited(U, "softmax_stable",
           (SOFTMAX_MAX, "x.amax()")), bug="B03.naive_softmax"),
    Answer("03.softmax_stable", "shifted in float64 so that exp never overflows (float32 in, float64 out)",
           edited(U, "softmax_stable", (f"x - {SOFTMAX_MAX}", f"x.double() - {SOFTMAX_MAX}")),
           bug="B03.float64_output"),
    Answer("03.softmax_stable", "inputs clamped to [-80, 80] before exp", edited(U, "softmax_stable",
           (f"x - {SOFTMAX_MAX}", "x.clamp(-80, 80)")), says=r"."),
    # -- 03.simple_attention ---------------------------------------------------------------------------------
    Answer("03.simple_attention", "softmax over dim=1 (the columns of a batched input)", edited(U, "simple_attention",
           ("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=1)")), bug="B03.softmax_dim"),
    Answer("03.simple_attention", "scores scaled by 1/sqrt(d) though the task says no scaling",
           edited(U, "simple_attention", ("scores = x @ x.transpose(-2, -1)",
                                          "scores = x @ x.transpose(-2, -1) / math.sqrt(x.shape[-1])")),
           bug="B03.simple_scaled"),
    Answer("03.simple_attention", "computed in float64 for precision (float32 in, float64 out)",
           edited(U, "simple_attention",
                  ("scores = x @ x.transpose(-2, -1)", "x = x.double()\n    scores = x @ x.transpose(-2, -1)")),
           bug="B03.float64_output"),
    # -- 03.scaled_dot_product_attention ---------------------------------------------------------------------
    Answer("03.scaled_dot_product_attention", "masked_fill(~mask, -1e9) instead of -inf",
           edited(U, "scaled_dot_product_attention", ('masked_fill(~mask, float("-inf"))', "masked_fill(~mask, -1e9)")),
           bug="B03.mask_fill_finite", origin="issue 37"),
    Answer("03.scaled_dot_product_attention", "weights returned after dropout", edited(U, "scaled_dot_product_attention",
           (SDPA_TAIL, "    if dropout is not None:\n        weights = dropout(weights)\n    return weights @ v, weights\n")),
           says=r"dropout"),
    Answer("03.scaled_dot_product_attention", "mask applied after the softmax (rows no longer sum to 1)",
           edited(U, "scaled_dot_product_attention",
                  (SDPA_FILL + "    weights = torch.softmax(scores, dim=-1)\n",
                   "    weights = torch.softmax(scores, dim=-1)\n    if mask is not None:\n"
                   "        weights = weights * mask\n")), bug="B03.mask_after_softmax"),
    Answer("03.scaled_dot_product_attention", "dropout on the context, not on the weights",
           edited(U, "scaled_dot_product_attention",
                  (SDPA_TAIL, "    out = weights @ v\n    return (out if dropout is None else dropout(out)), weights\n")),
           says=r"dropout"),
    Answer("03.scaled_dot_product_attention", "scores and softmax in float64 for stability (float32 in, float64 out)",
           edited(U, "scaled_dot_product_attention",
                  ("scores = q @ k.transpose(-2, -1)", "scores = q.double() @ k.double().transpose(-2, -1)"),
                  ("return used @ v, weights", "return used @ v.double(), weights")), bug="B03.float64_output"),
    # -- 03.SelfAttention ------------------------------------------------------------------------------------
    Answer("03.SelfAttention", "scores scaled by sqrt(d_in)", edited(U, "SelfAttention",
           ("        self.W_query = ", "        self.d_in = d_in\n        self.W_query = "),
           (SA_CALL, "        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)\n"
                     "        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_in), dim=-1)\n"
                     "        return w @ v\n")), bug="B03.scale_d_in"),
    Answer("03.SelfAttention", "qkv_bias ignored (no bias ever)", edited(U, "SelfAttention",
           ("bias=qkv_bias", "bias=False")), says=r"bias"),
    Answer("03.SelfAttention", "projections in float64 (float32 in, float64 out)", edited(U, "SelfAttention",
           ("bias=qkv_bias)", "bias=qkv_bias, dtype=torch.float64)"),
           ("        context, _ = scaled", "        x = x.double()\n        context, _ = scaled")),
           bug="B03.float64_output"),
    # -- 03.CausalSelfAttention ------------------------------------------------------------------------------
    Answer("03.CausalSelfAttention", "last_weights stored after dropout", edited(U, "CausalSelfAttention",
           (f"        {CSA_CALL}\n        self.last_weights = weights.detach()\n        return context\n",
            '        s = (q @ k.transpose(1, 2) / math.sqrt(k.shape[-1])).masked_fill(~self.mask[:t, :t], float("-inf"))\n'
            "        w = self.dropout(torch.softmax(s, dim=-1))\n        self.last_weights = w.detach()\n"
            "        return w @ v\n")), bug="B03.last_weights_after_dropout", origin="issue 37"),
    Answer("03.CausalSelfAttention", "dropout on the output instead of the weights", edited(U, "CausalSelfAttention",
           (CSA_CALL, "context, weights = scaled_dot_product_attention(q, k, v, mask=self.mask[:t, :t])"),
           ("        return context\n", "        return self.dropout(context)\n")), bug="B03.dropout_not_on_weights"),
    Answer("03.CausalSelfAttention", "mask buffer stored as True = blocked (upper triangle)",
           edited(U, "CausalSelfAttention", (".tril()", ".triu(1)"), ("mask=self.mask[:t, :t]", "mask=~self.mask[:t, :t]")),
           bug="B03.mask_buffer_blocked"),
    Answer("03.CausalSelfAttention", "the context returned as float64 (.double())", edited(U, "CausalSelfAttention",
           ("        return context\n", "        return context.double()\n")), bug="B03.float64_output"),
    Answer("03.CausalSelfAttention", "qkv_bias ignored", edited(U, "CausalSelfAttention",
           ("bias=qkv_bias", "bias=False")), says=r"bias"),
]
