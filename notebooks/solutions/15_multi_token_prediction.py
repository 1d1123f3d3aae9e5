# %% [markdown]
# # Unit 15 — Multi-token prediction: exercises
#
# Four graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: windows of distinct tokens at several depths, an MTP module
# on a `llama3-tiny` decoder layer with seeded weights, a two-depth model whose logits it perturbs token by
# token to find any leak from the future, its losses and their weighting, and speculative decoding on seeded
# random weights and on the course's trained MTP model, compared token for token with plain greedy decoding.
# When something fails it tells you what was expected, what came back, and, if your mistake is a known one,
# its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/15_multi_token_prediction/15_multi_token_prediction.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `math`, the standard library and unit 11's
# pieces from `llmcourse.models.llama3` (`RMSNorm`, `Llama3Block`, `Llama3Model`, `Llama3Config`).
#
# **Conventions.** `x, y (B, T)` are a batch of windows with `y` = `x` shifted by one (`y[:, i] = x[:, i+1]`).
# Depth `k ≥ 1` of the MTP chain predicts, at position `i`, the token at absolute position `i+k+1`.
# A boolean mask is `True` where a query may attend.

# %%
import math  # noqa: F401

import torch
import torch.nn.functional as F  # noqa: F401
from torch import nn  # noqa: F401

import llmcourse
from llmcourse.models import llama3 as L11
from llmcourse.models import mtp as course_mtp

cfg = llmcourse.setup_notebook("15")
small = L11.Llama3Config(vocab_size=65, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64,
                         context_length=64, rope_theta=10000.0)

# %% [markdown]
# ## Exercise 1 — `mtp_inputs_and_targets` (4 points)
#
# ```python
# def mtp_inputs_and_targets(x: Tensor, y: Tensor, depth: int) -> tuple[Tensor, Tensor]
# ```
#
# For depth `k = depth ≥ 1` return `(emb_tokens, targets)`, both `(B, T−k)` long: at position `i`,
# `emb_tokens[:, i]` is the token at absolute position `i+k` (the one depth `k` embeds) and `targets[:, i]` the
# token at absolute position `i+k+1` (the one it predicts). The matching previous-depth hidden states are those
# of positions `0 … T−k−1`.

# %% tags=["solution:15.mtp_alignment"]
def mtp_inputs_and_targets(x, y, depth):
    """(B, T), (B, T), k -> (B, T-k) embedded tokens, (B, T-k) targets."""
    ### BEGIN SOLUTION
    return x[:, depth:], y[:, depth:]
    ### END SOLUTION


# %% tags=["tests:15.mtp_alignment"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("15.mtp_alignment")  # noqa: E702
### END HIDDEN TESTS
window = torch.arange(10, 19)[None]
xs, ys = window[:, :-1], window[:, 1:]
e1, t1 = mtp_inputs_and_targets(xs, ys, 1)
assert e1.tolist() == [list(range(11, 18))], f"depth 1 embeds tokens 11…17; got {e1.tolist()}"
assert t1.tolist() == [list(range(12, 19))], f"depth 1 predicts tokens 12…18; got {t1.tolist()}"
e2, t2 = mtp_inputs_and_targets(xs, ys, 2)
assert e2.shape == t2.shape == (1, 6), f"depth 2 keeps T-2 = 6 positions; got {tuple(e2.shape)}, {tuple(t2.shape)}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `MTPModule` (5 points)
#
# ```python
# class MTPModule(nn.Module):
#     def __init__(self, d_model: int, block: nn.Module, rms_norm_eps: float = 1e-5): ...
#     def forward(self, h_prev, emb, cos, sin, mask) -> Tensor: ...
# ```
#
# One depth of the chain. `state_dict` keys: `enorm.weight (D,)`, `hnorm.weight (D,)` (two RMSNorms, unit 11's
# `L11.RMSNorm(D, eps)`), `eh_proj.weight (D, 2D)` (a linear map without bias), `mtp_block.*` (the block you are
# given) and `post_norm.weight (D,)`. The embedding and the output head are **not** part of the module.
#
# `forward`: `h_prev, emb (B, T', D)`; normalise `emb` with `enorm` and `h_prev` with `hnorm`, concatenate the two
# on the last dimension, project to `D`, run `block(h, cos, sin, mask)` (the call signature of unit 11's
# `Llama3Block`) and return `post_norm` of the result, `(B, T', D)`.
#
# **Your decision: the order of the two halves.** The paper's equation and the released checkpoints disagree, and a
# trained `eh_proj` only works with the order it was trained with. The evidence: the course's trained MTP model
# (`load_mtp_char_tiny()` from `llmcourse.train.mtp_char`) was trained in the checkpoints' layout, and its
# `mtp[0]` has exactly your keys. Load its state into your module: with the right order your module reproduces
# `model.mtp[0]` on the same inputs (the visible test below does this).

# %% tags=["solution:15.MTPModule"]
class MTPModule(nn.Module):
    """Both inputs normalised, concatenated (your order), eh_proj -> block -> post_norm."""

    def __init__(self, d_model, block, rms_norm_eps=1e-5):
        super().__init__()
        ### BEGIN SOLUTION
        self.enorm = L11.RMSNorm(d_model, rms_norm_eps)
        self.hnorm = L11.RMSNorm(d_model, rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.mtp_block = block
        self.post_norm = L11.RMSNorm(d_model, rms_norm_eps)
        ### END SOLUTION

    def forward(self, h_prev, emb, cos, sin, mask):
        ### BEGIN SOLUTION
        h = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h_prev)], dim=-1))
        return self.post_norm(self.mtp_block(h, cos, sin, mask))
        ### END SOLUTION


# %% tags=["tests:15.MTPModule"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("15.MTPModule")  # noqa: E702
### END HIDDEN TESTS
tiny = L11.Llama3Config.preset("llama3-tiny")
module = MTPModule(tiny.d_model, L11.Llama3Block(tiny), tiny.rms_norm_eps)
n_params = sum(p.numel() for p in module.parameters())
assert n_params == 230_016, f"one MTP module on llama3-tiny has 230,016 parameters; yours has {n_params:,}"
keys = [k for k in module.state_dict() if not k.startswith("mtp_block.")]
assert sorted(keys) == ["eh_proj.weight", "enorm.weight", "hnorm.weight", "post_norm.weight"], keys
cos, sin = L11.rope_cos_sin(L11.rope_inv_freq(tiny.hd, tiny.rope_theta), torch.arange(1, 6))
out = module(torch.randn(2, 5, tiny.d_model), torch.randn(2, 5, tiny.d_model), cos, sin,
             torch.ones(5, 5, dtype=torch.bool).tril())
assert out.shape == (2, 5, tiny.d_model), f"expected (2, 5, 128), got {tuple(out.shape)}"
from llmcourse.train.mtp_char import load_mtp_char_tiny  # noqa: E402

trained_mtp, _ = load_mtp_char_tiny()
mine = MTPModule(trained_mtp.cfg.d_model, L11.Llama3Block(trained_mtp.cfg), trained_mtp.cfg.rms_norm_eps)
mine.load_state_dict(trained_mtp.mtp[0].state_dict())
mine.eval()
h_in, e_in = 2.0 * torch.randn(1, 5, trained_mtp.cfg.d_model), 0.1 * torch.randn(1, 5, trained_mtp.cfg.d_model)
with torch.no_grad():
    same = torch.allclose(mine(h_in, e_in, cos, sin, torch.ones(5, 5, dtype=torch.bool).tril()),
                          trained_mtp.mtp[0](h_in, e_in, cos, sin, torch.ones(5, 5, dtype=torch.bool).tril()), atol=1e-4)
assert same, "with the trained model's weights your module must reproduce its depth-1 module: check the order"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `MTPLanguageModel` (5 points)
#
# ```python
# class MTPLanguageModel(nn.Module):
#     def __init__(self, cfg: Llama3Config, mtp_depth: int = 1, mtp_lambda: float = 0.3): ...
#     def forward(self, x: Tensor, y: Tensor) -> dict: ...
# ```
#
# Keys: `model.*` (unit 11's `L11.Llama3Model(cfg)`) and `mtp.{k}.*` for `k = 0 … D−1` (a `nn.ModuleList` of your
# `MTPModule`, each with a fresh `L11.Llama3Block(cfg)`). The modules use `model.embed_tokens` and `model.lm_head`:
# no second embedding or head anywhere.
#
# `forward(x, y)` returns a dict:
# - `h0`: the trunk output **before** `model.norm` (embed, then every layer of `model.layers` with the model's
#   buffers `rope_cos[:T]`, `rope_sin[:T]`, `causal[:T, :T]`); `"logits" = lm_head(norm(h0))`, `(B, T, V)`, and
#   `"loss_main"` its cross-entropy against `y`.
# - for `k = 1 … D`: take the embedded tokens and targets of depth `k`; depth `k` reads the previous depth's
#   output (`h0` for `k = 1`) at positions `0 … T−k−1` and the embeddings of its tokens, with the RoPE rows of
#   those tokens' positions (`k … T−1`) and a causal mask over its `T−k` positions; its logits `lm_head(h_k)`
#   `(B, T−k, V)` go into the list `"mtp_logits"`, their cross-entropy into the list `"loss_mtp"`; `h_k` is the
#   next depth's input.
# - `"loss" = loss_main + mtp_lambda / D · Σ_k loss_mtp[k−1]`.
#
# Conventions: the text above is the course's (depth 1 reads `h0` before `model.norm`; `h_k` is the module's output
# after its `post_norm`). vLLM's DeepSeek-V3 MTP code feeds depth 1 the state after the final norm and passes the
# block output before the head's norm to the next depth; the report does not settle it, and the check accepts
# either choice.
#
# Initialise like unit 11: `L11.Llama3Model` initialises itself; give the new linear maps `N(0, 0.02²)` weights.

# %% tags=["solution:15.MTPLanguageModel"]
class MTPLanguageModel(nn.Module):
    """Unit 11's Llama with D sequential MTP modules sharing its embedding and head."""

    def __init__(self, cfg, mtp_depth=1, mtp_lambda=0.3):
        super().__init__()
        ### BEGIN SOLUTION
        self.cfg, self.mtp_depth, self.mtp_lambda = cfg, mtp_depth, mtp_lambda
        self.model = L11.Llama3Model(cfg)
        self.mtp = nn.ModuleList(MTPModule(cfg.d_model, L11.Llama3Block(cfg), cfg.rms_norm_eps)
                                 for _ in range(mtp_depth))
        for mod in self.mtp.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=0.02)
        ### END SOLUTION

    def forward(self, x, y):
        ### BEGIN SOLUTION
        m, T = self.model, x.shape[1]
        h = m.embed_tokens(x)
        for layer in m.layers:
            h = layer(h, m.rope_cos[:T], m.rope_sin[:T], m.causal[:T, :T])
        logits = m.lm_head(m.norm(h))
        loss_main = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        h_prev, mtp_logits, loss_mtp = h, [], []
        for k in range(1, self.mtp_depth + 1):
            tokens, targets = mtp_inputs_and_targets(x, y, k)
            n = T - k
            h_k = self.mtp[k - 1](h_prev[:, :n], m.embed_tokens(tokens), m.rope_cos[k:T], m.rope_sin[k:T],
                                  m.causal[:n, :n])
            lg = m.lm_head(h_k)
            mtp_logits.append(lg)
            loss_mtp.append(F.cross_entropy(lg.flatten(0, 1), targets.flatten()))
            h_prev = h_k
        loss = loss_main
        if self.mtp_depth:
            loss = loss_main + self.mtp_lambda / self.mtp_depth * sum(loss_mtp)
        return {"logits": logits, "mtp_logits": mtp_logits, "loss_main": loss_main, "loss_mtp": loss_mtp,
                "loss": loss}
        ### END SOLUTION


# %% tags=["tests:15.MTPLanguageModel"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("15.MTPLanguageModel")  # noqa: E702
### END HIDDEN TESTS
torch.manual_seed(0)
lm = MTPLanguageModel(small, mtp_depth=2, mtp_lambda=0.3).eval()
assert not any(("embed" in k or "head" in k) for k in lm.state_dict() if k.startswith("mtp.")), \
    "the MTP modules must share the main embedding and head"
w = torch.randint(0, 65, (1, 11))
xb, yb = w[:, :-1], w[:, 1:]
with torch.no_grad():
    res = lm(xb, yb)
    assert [tuple(t.shape) for t in res["mtp_logits"]] == [(1, 9, 65), (1, 8, 65)], "mtp_logits: (B, T-k, V)"
    total = res["loss_main"] + 0.3 / 2 * (res["loss_mtp"][0] + res["loss_mtp"][1])
    assert torch.allclose(res["loss"], total), "loss = loss_main + λ/D · Σ loss_mtp"
    w2 = w.clone()
    w2[0, 10] = (w2[0, 10] + 1) % 65          # the last token: only targets may see it
    res2 = lm(w2[:, :-1], w2[:, 1:])
    assert torch.equal(res2["mtp_logits"][0], res["mtp_logits"][0]), "depth-1 logits must not see the last token"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `speculative_generate` (6 points)
#
# ```python
# @torch.no_grad()
# def speculative_generate(model, idx: Tensor, max_new_tokens: int) -> tuple[Tensor, float]
# ```
#
# `model` is the course's `MTPLanguageModel` (with at least one MTP module). It offers two helpers:
# `model.trunk(ids) -> h0 (1, T, D)` (the trunk output before `model.model.norm`; one **main-model call**), and
# `model.mtp_hidden(1, h_prev, tokens) -> (1, T', D)` (depth 1 on the trunk states of positions `0 … T'−1` and the
# tokens at positions `1 … T'`). Main-model logits are `model.model.lm_head(model.model.norm(h))`, depth-1 logits
# `model.model.lm_head(h1)`.
#
# Greedy, batch 1, `T0 + max_new_tokens ≤ context_length`. After the main model's next token `a` is appended,
# depth 1 drafts the token after it (at the last position), and one main-model call on `sequence + [draft]`
# follows. Stop after exactly `max_new_tokens` new tokens. Return `(tokens (1, T0 + max_new_tokens), kept drafts /
# drafts)` (0.0 when no draft was made).
#
# **Your decision: the verification.** Decide when a draft may be kept, what replaces a draft that may not, and
# what else that one main-model call gives you, so that both hold: (1) the tokens equal plain greedy decoding of
# `model.model` token for token; (2) kept drafts save calls: with `A` kept drafts, at most
# `max_new_tokens − A + 1` main-model calls.

# %% tags=["solution:15.speculative_generate"]
@torch.no_grad()
def speculative_generate(model, idx, max_new_tokens):
    """Greedy decoding with the depth-1 module drafting one token per main-model call."""
    ### BEGIN SOLUTION
    model.eval()
    head, norm = model.model.lm_head, model.model.norm
    seq, drafts, accepted = idx, 0, 0
    if max_new_tokens == 0:
        return seq, 0.0
    h0 = model.trunk(seq)
    nxt = head(norm(h0[:, -1:])).argmax(-1)
    n = 0
    while True:
        seq = torch.cat([seq, nxt], dim=1)
        n += 1
        if n == max_new_tokens:
            break
        draft = head(model.mtp_hidden(1, h0, seq[:, 1:])[:, -1:]).argmax(-1)
        drafts += 1
        h = model.trunk(torch.cat([seq, draft], dim=1))
        pred = head(norm(h[:, -2:])).argmax(-1)
        if bool(pred[0, 0] == draft[0, 0]):
            accepted += 1
            seq = torch.cat([seq, draft], dim=1)
            n += 1
            if n == max_new_tokens:
                break
            h0, nxt = h, pred[:, 1:]
        else:
            h0, nxt = h[:, :-1], pred[:, :1]
    return seq, accepted / drafts if drafts else 0.0
    ### END SOLUTION


# %% tags=["tests:15.speculative_generate"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("15.speculative_generate")  # noqa: E702
### END HIDDEN TESTS
from llmcourse.models.llama3_cached import generate_uncached

torch.manual_seed(1)
course_model = course_mtp.MTPLanguageModel(small, mtp_depth=1).eval()
prompt = torch.randint(0, 65, (1, 5))
n_new = cfg["exercise_tokens"]
tokens, rate = speculative_generate(course_model, prompt, n_new)
greedy = generate_uncached(course_model.model, prompt, n_new)
assert tokens.shape == greedy.shape, f"expected {tuple(greedy.shape)}, got {tuple(tokens.shape)}"
assert torch.equal(tokens, greedy), "speculative decoding must reproduce plain greedy decoding exactly"
assert 0.0 <= rate <= 1.0, f"the acceptance rate is a fraction; got {rate}"
print(f"{n_new} tokens equal greedy decoding; acceptance rate {rate:.2f} (random weights: drafts rarely agree)")
print("visible tests passed")
