"""Unit 02's red-team answers (see tests/redteam/__init__.py)."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "02"
PE_SUM = "return self.dropout(x + self.pe[:, :t])"
GPT_SUM = "return self.dropout(self.tok_emb(idx) + self.pos_emb(positions))"

ANSWERS = [
    # -- 02.embedding_lookup ---------------------------------------------------------------------------------
    Answer("02.embedding_lookup", "one_hot without num_classes (V taken from the largest id)", edited(U, "one_hot_matmul",
           ("F.one_hot(ids, num_classes=weight.shape[0])", "F.one_hot(ids)")), says=r"."),
    Answer("02.embedding_lookup", "the lookup detaches the table (no gradient reaches weight)",
           edited(U, "embedding_lookup", ("return weight[ids]", "return weight.detach()[ids]")), says=r"grad"),
    Answer("02.embedding_lookup", "one-hot cast to float32, not to the table's dtype", edited(U, "one_hot_matmul",
           (".to(weight.dtype)", ".float()")), says=r"dtype|float64|double"),
    # -- 02.InputEmbeddings ----------------------------------------------------------------------------------
    Answer("02.InputEmbeddings", "padding_idx=0 added to the table", edited(U, "InputEmbeddings",
           ("nn.Embedding(vocab_size, d_model)", "nn.Embedding(vocab_size, d_model, padding_idx=0)")), says=r"grad"),
    Answer("02.InputEmbeddings", "the table scaled once at construction instead of in forward",
           edited(U, "InputEmbeddings",
                  ("        self.embedding = nn.Embedding(vocab_size, d_model)\n",
                   "        self.embedding = nn.Embedding(vocab_size, d_model)\n        with torch.no_grad():\n"
                   "            self.embedding.weight.mul_(math.sqrt(d_model))\n"),
                  ("return self.embedding(ids) * math.sqrt(self.d_model)", "return self.embedding(ids)")),
           bug="B02.no_scale"),
    # -- 02.sinusoidal_pe ------------------------------------------------------------------------------------
    Answer("02.sinusoidal_pe", "sines and cosines in two halves, not interleaved", edited(U, "sinusoidal_pe",
           ("    pe = torch.zeros(max_len, d_model)\n    pe[:, 0::2] = torch.sin(angles)\n"
            "    pe[:, 1::2] = torch.cos(angles)\n    return pe\n",
            "    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)\n")), bug="B02.concat_halves"),
    Answer("02.sinusoidal_pe", "frequency 10000^(-i/D) per pair (the 2 forgotten)", edited(U, "sinusoidal_pe",
           ("torch.arange(0, d_model, 2, dtype=torch.float32)", "torch.arange(d_model // 2, dtype=torch.float32)")),
           bug="B02.positive_exponent"),
    Answer("02.sinusoidal_pe", "float64 table returned", edited(U, "sinusoidal_pe",
           ("torch.arange(max_len, dtype=torch.float32)", "torch.arange(max_len, dtype=torch.float64)"),
           ("torch.arange(0, d_model, 2, dtype=torch.float32)", "torch.arange(0, d_model, 2, dtype=torch.float64)"),
           ("torch.zeros(max_len, d_model)", "torch.zeros(max_len, d_model, dtype=torch.float64)")),
           says=r"float32|dtype"),
    # -- 02.PositionalEncoding -------------------------------------------------------------------------------
    Answer("02.PositionalEncoding", "dropout on the table only, not on the sum", edited(U, "PositionalEncoding",
           (PE_SUM, "return x + self.dropout(self.pe[:, :t])")), bug="B02.pe_dropout_only"),
    Answer("02.PositionalEncoding", "dropout probability hard-coded to 0.1", edited(U, "PositionalEncoding",
           ("nn.Dropout(dropout)", "nn.Dropout(0.1)")), says=r"dropout|probab|p ="),
    Answer("02.PositionalEncoding", "a plain tensor attribute (does not follow .to)", edited(U, "PositionalEncoding",
           ('self.register_buffer("pe", sinusoidal_pe(max_len, d_model).unsqueeze(0), persistent=False)',
            "self.pe = sinusoidal_pe(max_len, d_model).unsqueeze(0)")), bug="B02.pe_attribute"),
    Answer("02.PositionalEncoding", "a persistent buffer (the table saved in every checkpoint)",
           edited(U, "PositionalEncoding", (".unsqueeze(0), persistent=False)", ".unsqueeze(0))")),
           bug="B02.pe_persistent"),
    # -- 02.shift_matrix -------------------------------------------------------------------------------------
    Answer("02.shift_matrix", "the transposed rotation (rotates backwards)", edited(U, "shift_matrix",
           ("[[c, s], [-s, c]]", "[[c, -s], [s, c]]")), bug="B02.shift_transposed"),
    Answer("02.shift_matrix", "the angle omega + k instead of omega * k", edited(U, "shift_matrix",
           ("math.cos(omega * k), math.sin(omega * k)", "math.cos(omega + k), math.sin(omega + k)")), says=r"."),
    # -- 02.GPTEmbedding -------------------------------------------------------------------------------------
    Answer("02.GPTEmbedding", "positions built with torch.arange(T), ignoring idx's device", edited(U, "GPTEmbedding",
           ("torch.arange(t, device=idx.device)", "torch.arange(t)")), bug="B02.positions_default_device",
           origin="issue 37"),
    Answer("02.GPTEmbedding", "the sum scaled by sqrt(d_model) as in the Transformer", edited(U, "GPTEmbedding",
           (GPT_SUM, "d = self.tok_emb.embedding_dim\n"
                     "        return self.dropout(self.tok_emb(idx) * math.sqrt(d) + self.pos_emb(positions))")),
           says=r"GPTEmbedding\(50, 8, 12\) on idx"),
    Answer("02.GPTEmbedding", "dropout on the token vectors only", edited(U, "GPTEmbedding",
           (GPT_SUM, "return self.dropout(self.tok_emb(idx)) + self.pos_emb(positions)")), says=r"dropout|sum"),
]
