"""Red-team answers for unit 15 (multi-token prediction): written from the released exercise notebook."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "15"


def _lm(*edits):
    return edited(U, "MTPLanguageModel", *edits)


def _module(*edits):
    return edited(U, "MTPModule", *edits)


_CAT = "torch.cat([self.enorm(emb), self.hnorm(h_prev)], dim=-1)"
_POST = "return self.post_norm(self.mtp_block(h, cos, sin, mask))"


ANSWERS = [
    # -- 15.mtp_alignment ---------------------------------------------------------------------------------------
    Answer("15.mtp_alignment", "depth ignored past the slice length (tokens of depth 1, trimmed)", '''
def mtp_inputs_and_targets(x, y, depth):
    T = x.shape[1]
    return x[:, 1:T - depth + 1], y[:, 1:T - depth + 1]
''', says=r"depth|position|expected|token"),
    Answer("15.mtp_alignment", "depth k embeds token i+k-1 (the main head's input again)", '''
def mtp_inputs_and_targets(x, y, depth):
    T = x.shape[1]
    return x[:, depth - 1:T - 1], y[:, depth - 1:T - 1]
''', says=r"depth|position|expected|token"),
    # -- 15.MTPModule -------------------------------------------------------------------------------------------
    Answer("15.MTPModule", "the paper's order [h; emb]",
           _module((_CAT, "torch.cat([self.hnorm(h_prev), self.enorm(emb)], dim=-1)")),
           says=r"order|concat|half|expected"),
    Answer("15.MTPModule", "post_norm left out",
           _module((_POST, "return self.mtp_block(h, cos, sin, mask)")),
           says=r"post_norm|norm|expected|differ"),
    Answer("15.MTPModule", "one norm for both halves",
           _module((_CAT, "torch.cat([self.enorm(emb), self.enorm(h_prev)], dim=-1)")),
           says=r"hnorm|norm|expected|differ"),
    # -- 15.MTPLanguageModel ------------------------------------------------------------------------------------
    Answer("15.MTPLanguageModel", "depth 1 reads h0 at position i+1", _lm(("self.mtp[k - 1](h_prev[:, :n],", "self.mtp[k - 1](h_prev[:, 1:n + 1],")),
           bug="B15.h0_shifted", origin="issue 39"),
    Answer("15.MTPLanguageModel", "depth k embeds the tokens of positions 0..T-k-1",
           _lm(("n = T - k\n", "n = T - k\n            tokens = x[:, :n]\n")), says=r"token|embed|position|expected|differ|leak"),
    Answer("15.MTPLanguageModel", "every depth reads h0", _lm(("            h_prev = h_k\n", "")),
           says=r"previous|depth|chain|expected|differ"),
    Answer("15.MTPLanguageModel", "MTP losses not divided by the depth", _lm(
        ("self.mtp_lambda / self.mtp_depth * sum(loss_mtp)", "self.mtp_lambda * sum(loss_mtp)")), says=r"lambda|weight|loss|expected"),
    Answer("15.MTPLanguageModel", "leaky mask tril(diagonal=1)", _lm(
        ("m.causal[:n, :n])", "torch.ones(n, n, dtype=torch.bool).tril(diagonal=1))")), bug="B15.leaky_mask", origin="issue 39"),
    # -- 15.speculative_generate --------------------------------------------------------------------------------
    Answer("15.speculative_generate", "every draft kept without verification", '''
@torch.no_grad()
def speculative_generate(model, idx, max_new_tokens):
    model.eval()
    head, norm = model.model.lm_head, model.model.norm
    seq, drafts = idx, 0
    while seq.shape[1] < idx.shape[1] + max_new_tokens:
        h0 = model.trunk(seq)
        seq = torch.cat([seq, head(norm(h0[:, -1:])).argmax(-1)], 1)
        if seq.shape[1] == idx.shape[1] + max_new_tokens:
            break
        seq = torch.cat([seq, head(model.mtp_hidden(1, h0, seq[:, 1:])[:, -1:]).argmax(-1)], 1)
        drafts += 1
    return seq, 1.0 if drafts else 0.0
''', says=r"greedy|token|expected"),
    Answer("15.speculative_generate", "verified, but the verification call's next token thrown away", '''
@torch.no_grad()
def speculative_generate(model, idx, max_new_tokens):
    model.eval()
    head, norm = model.model.lm_head, model.model.norm
    seq, drafts, kept = idx, 0, 0
    while seq.shape[1] < idx.shape[1] + max_new_tokens:
        h0 = model.trunk(seq)
        seq = torch.cat([seq, head(norm(h0[:, -1:])).argmax(-1)], 1)
        if seq.shape[1] == idx.shape[1] + max_new_tokens:
            break
        draft = head(model.mtp_hidden(1, h0, seq[:, 1:])[:, -1:]).argmax(-1)
        drafts += 1
        check = head(norm(model.trunk(seq)[:, -1:])).argmax(-1)
        if bool(check[0, 0] == draft[0, 0]):
            kept += 1
            seq = torch.cat([seq, draft], 1)
    return seq, kept / drafts if drafts else 0.0
''', says=r"call|save|main-model|expected"),
    Answer("15.speculative_generate", "rate counts drafts over new tokens", '''
_spec = speculative_generate


@torch.no_grad()
def speculative_generate(model, idx, max_new_tokens):
    seq, rate = _spec(model, idx, max_new_tokens)
    return seq, rate * (max_new_tokens - 1) / max(1, max_new_tokens)
''', says=r"rate|draft|expected|accept"),
]
