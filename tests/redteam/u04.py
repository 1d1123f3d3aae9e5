"""Unit 04 (multi-head attention): wrong and lazy answers the hidden checks must withstand."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "04"
W = "MultiHeadAttentionWrapper"
M = "MultiHeadAttention"

ANSWERS = [
    # -- 04.MultiHeadAttentionWrapper ---------------------------------------------------------------------------
    Answer("04.MultiHeadAttentionWrapper", "one head module repeated num_heads times",
           edited(U, W, ("[CausalSelfAttention(d_in, head_dim, context_length, dropout, qkv_bias) for _ in range(num_heads)]",
                         "[CausalSelfAttention(d_in, head_dim, context_length, dropout, qkv_bias)] * num_heads")),
           says=r"separate|same module|shared|distinct"),
    Answer("04.MultiHeadAttentionWrapper", "qkv_bias not passed to the heads",
           edited(U, W, ("dropout, qkv_bias)", "dropout)")),
           says=r"qkv_bias|bias"),
    Answer("04.MultiHeadAttentionWrapper", "dropout not passed to the heads (0.0 hard-coded)",
           edited(U, W, ("context_length, dropout, qkv_bias)", "context_length, 0.0, qkv_bias)")),
           says=r"dropout"),
    Answer("04.MultiHeadAttentionWrapper", "heads' columns interleaved (stack on the last dim, then flatten)",
           edited(U, W, ("torch.cat([head(x) for head in self.heads], dim=-1)",
                         "torch.stack([head(x) for head in self.heads], dim=-1).flatten(-2)")),
           says=r"column|head|order"),
    # -- 04.MultiHeadAttention ----------------------------------------------------------------------------------
    Answer("04.MultiHeadAttention", "last_weights stored after dropout", edited(U, M, (
        "        if self.store_weights:\n            self.last_weights = weights.detach()\n"
        "        context = self.dropout(weights) @ v\n",
        "        weights = self.dropout(weights)\n        if self.store_weights:\n"
        "            self.last_weights = weights.detach()\n        context = weights @ v\n")),
           origin="issue 37", says=r"last_weights.*(dropout|sum)"),
    Answer("04.MultiHeadAttention", "heads split by view(b, h, t, hd) without the transpose", edited(U, M,
           ("q = self.W_query(x_q).view(b, t_q, self.num_heads, self.head_dim).transpose(1, 2)",
            "q = self.W_query(x_q).view(b, self.num_heads, t_q, self.head_dim)"),
           ("k = self.W_key(x_kv).view(b, t_k, self.num_heads, self.head_dim).transpose(1, 2)",
            "k = self.W_key(x_kv).view(b, self.num_heads, t_k, self.head_dim)"),
           ("v = self.W_value(x_kv).view(b, t_k, self.num_heads, self.head_dim).transpose(1, 2)",
            "v = self.W_value(x_kv).view(b, self.num_heads, t_k, self.head_dim)")),
           says=r"head|feature|slice"),
    Answer("04.MultiHeadAttention", "causal mask top-left aligned when T_q < T_k", edited(U, M,
           ("self.causal_mask[t_k - t_q:t_k, :t_k]", "self.causal_mask[:t_q, :t_k]")),
           says=r"last|bottom|T_q|align"),
    Answer("04.MultiHeadAttention", "scores scaled by 1/sqrt(d_out) instead of 1/sqrt(head_dim)", edited(U, M,
           ("/ math.sqrt(self.head_dim)", "/ math.sqrt(self.d_out)")),
           says=r"scal|sqrt|head_dim"),
    Answer("04.MultiHeadAttention", "a causal module ignores the mask it is given", edited(U, M,
           ("mask = causal if mask is None else causal & mask", "mask = causal")),
           says=r"mask"),
    Answer("04.MultiHeadAttention", "dropout on the context instead of the weights", edited(U, M,
           ("context = self.dropout(weights) @ v", "context = self.dropout(weights @ v)")),
           says=r"dropout"),
    Answer("04.MultiHeadAttention", "d_kv ignored: keys and values projected from d_in", edited(U, M,
           ("self.W_key = nn.Linear(d_kv, d_out, bias=qkv_bias)", "self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)"),
           ("self.W_value = nn.Linear(d_kv, d_out, bias=qkv_bias)",
            "self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)")),
           says=r"d_kv|cross"),
    # -- 04.mha_from_wrapper ------------------------------------------------------------------------------------
    Answer("04.mha_from_wrapper", "qkv biases not copied", edited(U, "mha_from_wrapper", (
        "            if qkv_bias:\n                getattr(mha, name).bias.copy_(torch.cat([getattr(h, name).bias for h in heads], dim=0))\n",
        "")), says=r"bias"),
    Answer("04.mha_from_wrapper", "dropout probability not carried over (0.0)", edited(U, "mha_from_wrapper",
           ("dropout=first.dropout.p", "dropout=0.0")), says=r"dropout"),
    Answer("04.mha_from_wrapper", "heads interleaved row by row (stack on dim 1, then reshape)",
           edited(U, "mha_from_wrapper",
                  ("getattr(mha, name).weight.copy_(torch.cat([getattr(h, name).weight for h in heads], dim=0))",
                   "getattr(mha, name).weight.copy_(torch.stack([getattr(h, name).weight for h in heads], dim=1)"
                   ".reshape(d_out, d_in))")),
           says=r"row|head"),
    Answer("04.mha_from_wrapper", "out_proj bias left at its random initialisation", edited(U, "mha_from_wrapper",
           ("        mha.out_proj.bias.zero_()\n", "")), says=r"out_proj|bias|identity"),
    Answer("04.mha_from_wrapper", "returned module not causal", edited(U, "mha_from_wrapper",
           ("causal=True,", "causal=False,")), says=r"causal|future"),
    # -- 04.to_torch_mha ----------------------------------------------------------------------------------------
    Answer("04.to_torch_mha", "nn.MultiheadAttention built without the module's dropout", edited(U, "to_torch_mha",
           ("dropout=mha.dropout.p, ", "")), origin="issue 37", says=r"dropout"),
    Answer("04.to_torch_mha", "in_proj packed as query, value, key", edited(U, "to_torch_mha",
           ("[mha.W_query.weight, mha.W_key.weight, mha.W_value.weight]",
            "[mha.W_query.weight, mha.W_value.weight, mha.W_key.weight]"),
           ("[mha.W_query.bias, mha.W_key.bias, mha.W_value.bias]", "[mha.W_query.bias, mha.W_value.bias, mha.W_key.bias]")),
           says=r"order|key|value|in_proj"),
    Answer("04.to_torch_mha", "no ValueError for cross-attention widths", edited(U, "to_torch_mha",
           ('    if not (mha.d_in == mha.d_kv == mha.d_out):\n'
            '        raise ValueError("nn.MultiheadAttention\'s packed in_proj needs d_in == d_kv == d_out")\n', "")),
           says=r"ValueError"),
    Answer("04.to_torch_mha", "attn_mask returned as a float additive mask", edited(U, "to_torch_attn_mask",
           ("return ~mask", 'return torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))')),
           says=r"bool"),
    # -- 04.mha_forward_sdpa ------------------------------------------------------------------------------------
    Answer("04.mha_forward_sdpa", "dropout_p applied in eval mode", edited(U, "mha_forward_sdpa",
           ("attn_mask=mask)", "attn_mask=mask, dropout_p=mha.dropout.p)")),
           origin="issue 37", says=r"dropout|eval"),
    Answer("04.mha_forward_sdpa", "is_causal=True when there is no user mask", edited(U, "mha_forward_sdpa",
           ("    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n",
            "    if mha.causal and mask is causal:\n"
            "        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
            "    else:\n        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n")),
           bug="B04.sdpa_top_left"),
    Answer("04.mha_forward_sdpa", "attn_mask and is_causal=mha.causal together", edited(U, "mha_forward_sdpa",
           ("    if mha.causal:\n        causal = mha.causal_mask[t_k - t_q:t_k, :t_k]\n"
            "        mask = causal if mask is None else causal & mask\n", ""),
           ("attn_mask=mask)", "attn_mask=mask, is_causal=mha.causal)")),
           bug="B04.sdpa_mask_and_causal"),
    Answer("04.mha_forward_sdpa", "lazy: calls the module itself, no fused kernel",
           "def mha_forward_sdpa(mha, x_q, x_kv=None, mask=None):\n    return mha(x_q, x_kv, mask)\n",
           says=r"scaled_dot_product_attention"),
    Answer("04.mha_forward_sdpa", "a causal module drops the given mask", edited(U, "mha_forward_sdpa",
           ("mask = causal if mask is None else causal & mask", "mask = causal")), says=r"mask"),
]
