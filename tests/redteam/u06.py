"""Unit 06 (the encoder-decoder Transformer): wrong and lazy answers the hidden checks must withstand."""

from tests.redteam import Answer
from tests.redteam.edits import edited, solution_def

U = "06"
T = "Transformer"

ANSWERS = [
    # -- 06.make_masks ------------------------------------------------------------------------------------------
    Answer("06.make_masks", "source mask (B, 1, S): one singleton axis", edited(U, "make_src_mask",
           ("(src != pad_id)[:, None, None, :]", "(src != pad_id)[:, None, :]")), says=r"shape|\(B, 1, 1, S\)"),
    Answer("06.make_masks", "pad_id ignored (0 hard-coded)", edited(U, "make_src_mask",
           ("(src != pad_id)", "(src != 0)")), says=r"pad_id"),
    Answer("06.make_masks", "target mask without key padding (causal only)", edited(U, "make_tgt_mask",
           ("return make_src_mask(tgt_in, pad_id) & causal_mask(t, device=tgt_in.device)",
            "return causal_mask(t, device=tgt_in.device).expand(tgt_in.shape[0], 1, t, t)")),
           says=r"pad"),
    Answer("06.make_masks", "target mask also blocks PAD queries (empty rows)", edited(U, "make_tgt_mask",
           ("    return make_src_mask(tgt_in, pad_id) & causal_mask(t, device=tgt_in.device)\n",
            "    keys = make_src_mask(tgt_in, pad_id)\n"
            "    return keys & keys.transpose(-1, -2) & causal_mask(t, device=tgt_in.device)\n")),
           says=r"row|query|empty"),
    Answer("06.make_masks", "padding OR causal instead of AND", edited(U, "make_tgt_mask",
           ("make_src_mask(tgt_in, pad_id) & causal_mask", "make_src_mask(tgt_in, pad_id) | causal_mask")),
           says=r"future|causal|pad"),
    # -- 06.make_translation_batch ------------------------------------------------------------------------------
    Answer("06.make_translation_batch", "target cut to max_len before adding SOS/EOS", edited(U,
           "make_translation_batch", ("y = list(x)[:max_len], list(y)[:max_len - 1]", "y = list(x)[:max_len], list(y)[:max_len]")),
           says=r"max_len|long"),
    Answer("06.make_translation_batch", "special ids hard-coded (0/1/2)", edited(U, "make_translation_batch",
           ("tins.append([sos_id] + y)", "tins.append([1] + y)"), ("touts.append(y + [eos_id])", "touts.append(y + [2])"),
           ("[pad_id] * (width - len(r))", "[0] * (width - len(r))")), says=r"pad_id|sos_id|eos_id"),
    Answer("06.make_translation_batch", "left padding", edited(U, "make_translation_batch",
           ("[r + [pad_id] * (width - len(r)) for r in rows]", "[[pad_id] * (width - len(r)) + r for r in rows]")),
           says=r"right|pad"),
    Answer("06.make_translation_batch", "int32 tensors", edited(U, "make_translation_batch",
           ("dtype=torch.long)", "dtype=torch.int32)")), says=r"long|dtype"),
    # -- 06.Transformer -----------------------------------------------------------------------------------------
    Answer("06.Transformer", "pad_id ignored in the masks", edited(U, T,
           ("src_mask = make_src_mask(src, self.pad_id)", "src_mask = make_src_mask(src)"),
           ("make_tgt_mask(tgt_in, self.pad_id)", "make_tgt_mask(tgt_in)")), origin="issue 37", says=r"pad_id"),
    Answer("06.Transformer", "dropout ignored (0.1 hard-coded)", edited(U, T,
           ("self.pos = PositionalEncoding(d_model, max_len, dropout)", "self.pos = PositionalEncoding(d_model, max_len, 0.1)"),
           ("Encoder(n_enc, d_model, num_heads, d_ff, dropout, norm_first)", "Encoder(n_enc, d_model, num_heads, d_ff, 0.1, norm_first)"),
           ("Decoder(n_dec, d_model, num_heads, d_ff, dropout, norm_first)", "Decoder(n_dec, d_model, num_heads, d_ff, 0.1, norm_first)")),
           origin="issue 37", says=r"dropout"),
    Answer("06.Transformer", "encoder without the padding mask", edited(U, T,
           ("memory = self.encode(src, src_mask)", "memory = self.encode(src, None)")),
           origin="issue 37", says=r"encoder.*(pad|mask)|(pad|mask).*encoder"),
    Answer("06.Transformer", "cross-attention without the source padding mask", edited(U, "Decoder",
           ("x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=src_mask)", "x = layer(x, memory, tgt_mask=tgt_mask)"))
           + solution_def(U, T), bug="B06.memory_mask_missing"),
    Answer("06.Transformer", "norm_first not passed to the blocks", edited(U, "Encoder",
           ("EncoderBlock(d_model, num_heads, d_ff, dropout, norm_first)", "EncoderBlock(d_model, num_heads, d_ff, dropout)"))
           + edited(U, "Decoder", ("DecoderBlock(d_model, num_heads, d_ff, dropout, norm_first)",
                                   "DecoderBlock(d_model, num_heads, d_ff, dropout)")) + solution_def(U, T),
           says=r"norm_first|post"),
    Answer("06.Transformer", "decoder's final norm built but never applied", edited(U, "Decoder",
           ("return self.norm(x) if self.norm is not None else x", "return x")) + solution_def(U, T),
           says=r"norm|decoder"),
    # -- 06.greedy_translate ------------------------------------------------------------------------------------
    Answer("06.greedy_translate", "SOS/EOS/PAD ids hard-coded as 1/2/0", edited(U, "greedy_translate",
           ("src_mask = make_src_mask(src, pad_id)", "src_mask = make_src_mask(src, 0)"),
           ("sos_id, dtype=torch.long)", "1, dtype=torch.long)"),
           ("make_tgt_mask(ys, pad_id)", "make_tgt_mask(ys, 0)"),
           ("torch.full_like(nxt, pad_id)", "torch.full_like(nxt, 0)"), ("(nxt == eos_id)", "(nxt == 2)")),
           origin="issue 37", says=r"sos_id|eos_id|pad_id|special"),
    Answer("06.greedy_translate", "the model left in eval mode", edited(U, "greedy_translate",
           ("    model.train(was_training)\n", "")), says=r"mode|train"),
    Answer("06.greedy_translate", "tokens after EOS not replaced by pad_id", edited(U, "greedy_translate",
           ("        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)\n", "")), says=r"EOS|pad"),
    Answer("06.greedy_translate", "the source re-encoded at every step", edited(U, "greedy_translate",
           ("        hidden = model.decode(ys, memory, src_mask, make_tgt_mask(ys, pad_id))\n",
            "        memory = model.encode(src, src_mask)\n"
            "        hidden = model.decode(ys, memory, src_mask, make_tgt_mask(ys, pad_id))\n")),
           says=r"encode.*once|once"),
    Answer("06.greedy_translate", "SOS returned with the tokens", edited(U, "greedy_translate",
           ("    return ys[:, 1:]\n", "    return ys\n")), says=r"SOS|shape|length"),
    # -- 06.chrf ------------------------------------------------------------------------------------------------
    Answer("06.chrf", "mean of sentence scores", solution_def(U, "chrf").replace("def chrf(", "def _chrf_corpus(", 1)
           + "\n\ndef chrf(hypotheses, references, n=6, beta=2.0):\n"
             "    scores = [_chrf_corpus([h], [r], n, beta) for h, r in zip(hypotheses, references)]\n"
             "    return sum(scores) / len(scores)\n", says=r"sum|corpus|average"),
    Answer("06.chrf", "only spaces removed (tabs and newlines kept)", edited(U, "chrf",
           ('hyp, ref = "".join(hyp.split()), "".join(ref.split())', 'hyp, ref = hyp.replace(" ", ""), ref.replace(" ", "")')),
           says=r"whitespace"),
    Answer("06.chrf", "matches not clipped", edited(U, "chrf",
           ("sum(min(c, r[g]) for g, c in h.items())", "sum(c for g, c in h.items() if g in r)")), says=r"clip|min"),
    Answer("06.chrf", "beta ignored (2 hard-coded)", edited(U, "chrf",
           ("100.0 * (1 + beta ** 2) * p * r / (beta ** 2 * p + r)", "100.0 * 5 * p * r / (4 * p + r)")), says=r"beta"),
    Answer("06.chrf", "empty orders counted as zeros", edited(U, "chrf",
           ("        if hyp_count == 0 and ref_count == 0:\n            continue\n", "")), says=r"order|short|empty"),
]
