"""Unit 05 (Transformer blocks): wrong and lazy answers the hidden checks must withstand."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "05"
E, D = "EncoderBlock", "DecoderBlock"

ANSWERS = [
    # -- 05.LayerNorm -------------------------------------------------------------------------------------------
    Answer("05.LayerNorm", "unbiased variance (torch.var's default)", edited(U, "LayerNorm",
           ("x.var(dim=-1, keepdim=True, unbiased=False)", "x.var(dim=-1, keepdim=True)")), says=r"biased|variance"),
    Answer("05.LayerNorm", "eps outside the square root", edited(U, "LayerNorm",
           ("torch.sqrt(var + self.eps)", "(torch.sqrt(var) + self.eps)")), says=r"eps"),
    Answer("05.LayerNorm", "eps argument ignored (1e-5 hard-coded)", edited(U, "LayerNorm",
           ("torch.sqrt(var + self.eps)", "torch.sqrt(var + 1e-5)")), says=r"eps"),
    Answer("05.LayerNorm", "normalised over the whole token x feature plane", edited(U, "LayerNorm",
           ("mean = x.mean(dim=-1, keepdim=True)", "mean = x.mean(dim=(-2, -1), keepdim=True)"),
           ("x.var(dim=-1, keepdim=True, unbiased=False)", "x.var(dim=(-2, -1), keepdim=True, unbiased=False)")),
           says=r"last|token|dim"),
    Answer("05.LayerNorm", "lazy: F.layer_norm under another name",
           edited(U, "LayerNorm", ("        mean = x.mean(dim=-1, keepdim=True)\n"
                                   "        var = x.var(dim=-1, keepdim=True, unbiased=False)\n"
                                   "        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias\n",
                                   "        ln = torch.nn.functional.layer_norm\n"
                                   "        return ln(x, x.shape[-1:], self.weight, self.bias, self.eps)\n")),
           says=r"layer_norm|LayerNorm"),
    # -- 05.gelu ------------------------------------------------------------------------------------------------
    Answer("05.gelu", "no ValueError for an unknown approximate", edited(U, "gelu",
           ('    if approximate == "tanh":\n', '    else:\n'),
           ('    raise ValueError(f"approximate must be \'none\' or \'tanh\', got {approximate!r}")\n', "")),
           origin="issue 37", says=r"ValueError"),
    Answer("05.gelu", "tanh approximation without the cubic term's 0.044715", edited(U, "gelu",
           ("(x + 0.044715 * x ** 3)", "x")), says=r"tanh"),
    Answer("05.gelu", "x * sigmoid(1.702 x) for the tanh form", edited(U, "gelu",
           ("return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))",
            "return x * torch.sigmoid(1.702 * x)")), says=r"tanh"),
    Answer("05.gelu", "exact form without the 1/sqrt(2) inside erf", edited(U, "gelu",
           ("torch.erf(x / math.sqrt(2.0))", "torch.erf(x)")), says=r"erf|exact|none"),
    # -- 05.FeedForward -----------------------------------------------------------------------------------------
    Answer("05.FeedForward", "dropout between fc1 and fc2", edited(U, "FeedForward",
           ("        self.fc2 = nn.Linear(d_ff, d_model)\n",
            "        self.fc2 = nn.Linear(d_ff, d_model)\n        self.dropout = nn.Dropout(0.1)\n"),
           ("        return self.fc2(h)\n", "        return self.fc2(self.dropout(h))\n")), bug="B05.ffn_inner_dropout"),
    Answer("05.FeedForward", "'gelu_tanh' computed with the exact GELU", edited(U, "FeedForward",
           ('h = gelu(h, approximate="tanh")', "h = gelu(h)")), says=r"gelu_tanh|tanh"),
    Answer("05.FeedForward", "activation argument ignored (always ReLU)", edited(U, "FeedForward",
           ('        if self.activation == "relu":\n            h = torch.relu(h)\n', '        if True:\n'
            '            h = torch.relu(h)\n')), says=r"activation|gelu"),
    # -- 05.EncoderBlock ----------------------------------------------------------------------------------------
    Answer("05.EncoderBlock", "qkv_bias ignored", edited(U, E,
           ("MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)",
            "MultiHeadAttention(d_model, d_model, num_heads, dropout)")), origin="issue 37", says=r"qkv_bias|bias"),
    Answer("05.EncoderBlock", "pre-LN residual added to the normalised input", edited(U, E,
           ("            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask))\n",
            "            x = self.norm1(x)\n            x = x + self.dropout(self.self_attn(x, mask=mask))\n")),
           says=r"residual|norm"),
    Answer("05.EncoderBlock", "norm_first ignored (always pre-LN)", edited(U, E,
           ("        if self.norm_first:\n", "        if True:\n")), says=r"post|norm_first"),
    Answer("05.EncoderBlock", "no residual dropout on the attention branch", edited(U, E,
           ("            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask))\n",
            "            x = x + self.self_attn(self.norm1(x), mask=mask)\n")), says=r"dropout"),
    Answer("05.EncoderBlock", "attention dropout probability not passed (0.0)", edited(U, E,
           ("MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)",
            "MultiHeadAttention(d_model, d_model, num_heads, 0.0, qkv_bias)")), says=r"dropout|attention"),
    Answer("05.EncoderBlock", "activation argument not passed to the FFN", edited(U, E,
           ("FeedForward(d_model, d_ff, activation)", "FeedForward(d_model, d_ff)")), says=r"activation|gelu"),
    # -- 05.DecoderBlock ----------------------------------------------------------------------------------------
    Answer("05.DecoderBlock", "cross-attention keys/values from the normalised target", edited(U, D,
           ("self.cross_attn(self.norm2(x), memory, mask=memory_mask)",
            "self.cross_attn(self.norm2(x), mask=memory_mask)")), says=r"memory"),
    Answer("05.DecoderBlock", "memory normalised again before cross-attention", edited(U, D,
           ("self.cross_attn(self.norm2(x), memory, mask=memory_mask)",
            "self.cross_attn(self.norm2(x), self.norm2(memory), mask=memory_mask)")), says=r"memory|norm"),
    Answer("05.DecoderBlock", "memory_mask ignored", edited(U, D,
           ("self.cross_attn(self.norm2(x), memory, mask=memory_mask)", "self.cross_attn(self.norm2(x), memory)"),
           ("self.cross_attn(x, memory, mask=memory_mask)", "self.cross_attn(x, memory)")),
           says=r"memory_mask|padding|pad"),
    Answer("05.DecoderBlock", "qkv_bias ignored in both attentions", edited(U, D,
           ("self.self_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)",
            "self.self_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout)"),
           ("self.cross_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)",
            "self.cross_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout)")), says=r"qkv_bias|bias"),
    Answer("05.DecoderBlock", "post-LN uses one norm for the last two sublayers", edited(U, D,
           ("            x = self.norm3(x + self.dropout(self.ffn(x)))\n",
            "            x = self.norm2(x + self.dropout(self.ffn(x)))\n")), says=r"norm3|post"),
    # -- 05.ProjectionLayer -------------------------------------------------------------------------------------
    Answer("05.ProjectionLayer", "log-softmax on the output", edited(U, "ProjectionLayer",
           ("return self.proj(x)", "return torch.log_softmax(self.proj(x), dim=-1)")), says=r"logits|softmax"),
    Answer("05.ProjectionLayer", "no bias", edited(U, "ProjectionLayer",
           ("nn.Linear(d_model, vocab_size)", "nn.Linear(d_model, vocab_size, bias=False)")), says=r"bias"),
    Answer("05.ProjectionLayer", "logits divided by sqrt(d_model)", edited(U, "ProjectionLayer",
           ("return self.proj(x)", "return self.proj(x) / math.sqrt(x.shape[-1])")), says=r"logits"),
]

ANSWERS += [
    Answer("05.EncoderBlock", "qkv_bias=True hard-coded", edited(U, E,
           ("MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)",
            "MultiHeadAttention(d_model, d_model, num_heads, dropout, True)")), origin="issue 37",
           bug="B05.qkv_bias_ignored"),
    Answer("05.DecoderBlock", "qkv_bias=True hard-coded in the cross-attention", edited(U, D,
           ("self.cross_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias)",
            "self.cross_attn = MultiHeadAttention(d_model, d_model, num_heads, dropout, qkv_bias=True)")),
           bug="B05.qkv_bias_ignored"),
]
