"""Multi-token prediction (unit 15): DeepSeek-V3-style sequential MTP modules and self-speculative decoding.

A main model predicts token ``i+1`` from positions ``0 … i``. An MTP chain of depth ``D`` adds modules
``k = 1 … D``; module ``k`` predicts token ``i+k+1`` at position ``i`` from two inputs:

* the previous depth's hidden state at position ``i`` (depth 0 = the trunk output **before** the final
  norm; depth ``k−1 ≥ 1`` = the output of module ``k−1``; see "Conventions" below), and
* the (shared) embedding of token ``i+k``, the token the previous depth was trained to predict.

Each input is RMS-normalised (``enorm``, ``hnorm``), they are concatenated **embedding first**, projected
``2D → D`` (``eh_proj``), passed through one causal Transformer block over the whole sequence
(``mtp_block``) and normalised (``post_norm``); the shared output head turns the result into logits.

Index bookkeeping for ``x, y (B, T)`` with ``y`` = ``x`` shifted by one (:func:`mtp_inputs_and_targets`):
depth ``k`` keeps ``T − k`` positions; it embeds ``x[:, k:]`` (tokens ``i+k``), predicts ``y[:, k:]``
(tokens ``i+k+1``) and reads the previous depth's states at positions ``0 … T−k−1``. The RoPE positions of
depth ``k`` are those of its embedded tokens (``k … T−1``); only relative offsets enter the scores.

Causality (proved by ``tests/test_unit15_multi_token_prediction.py``): the depth-``k`` logits at position
``i`` change when token ``i+k`` changes and never when a token at ``≥ i+k+1`` does.

Loss: ``L = L_main + (λ/D)·Σ_k L_k`` (DeepSeek-V3 trained with ``D = 1``, ``λ = 0.3`` then ``0.1``).

Concatenation order: the paper's eq. (21) writes ``[h; e]``; DeepSeek-V3's released weights (whose ``eh_proj``
reads ``[enorm(e); hnorm(h)]``) put the embedding first, and so does this course. ``transformers`` 5.23
has no MTP layer: there is no oracle here, the tests stand on properties and a hand-written reference.

Conventions the report does not settle: this course feeds depth 1 the trunk output before the final norm and
chains each module's output (after ``post_norm``). vLLM's DeepSeek-V3 MTP code
(``vllm/model_executor/models/deepseek_mtp.py``) feeds the main model's hidden state **after** its final norm and
chains the block output before ``shared_head.norm``. Both are consistent causal chains; a trained ``hnorm`` works
with the one it was trained with. The grader accepts either.

Information, not distance: depth ``k`` at position ``i`` sees every token ``≤ i+k`` and predicts ``i+k+1`` — the
same information and the same target as the main head at position ``i+k``. So its best achievable loss is the
main head's (the entropy of the next token given the prefix); what it lacks is the trunk's full computation at
position ``i+k``. In practice ``L_k ≥ L_main`` on the same targets (the lesson measures it).

Sources: Gloeckle et al., "Better & Faster Large Language Models via Multi-token Prediction" (2024);
DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), §2.2, eqs. (21)–(25); the module and key names
(``enorm``, ``hnorm``, ``eh_proj``, ``post_norm``) follow DeepSeek-V3's checkpoint layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .llama3 import Llama3Block, Llama3Config, Llama3Model, RMSNorm

__all__ = ["MTPLanguageModel", "MTPModule", "draft_agreement", "mtp_inputs_and_targets", "mtp_param_count",
           "speculative_generate", "speculative_trace"]


def mtp_inputs_and_targets(x: Tensor, y: Tensor, depth: int) -> tuple[Tensor, Tensor]:
    """The embedded tokens and targets of MTP depth ``k``: ``(x[:, k:], y[:, k:])``, both ``(B, T−k)`` long.

    ``x, y`` ``(B, T)`` long with ``y[:, i] = x[:, i+1]`` (unit 01's windows). Position ``i`` of depth ``k``
    embeds the token at absolute position ``i+k`` and predicts the one at ``i+k+1``; its previous-depth hidden
    state is ``h_prev[:, i]`` for ``i = 0 … T−k−1``. Example (``x = [10..17]``, ``y = [11..18]``): depth 1 gives
    ``[11..17]`` and ``[12..18]``; depth 2 gives ``[12..17]`` and ``[13..18]``.

    Raises:
        ValueError: ``x``/``y`` not 2-D with equal shapes, ``depth < 1`` or ``depth ≥ T``.
    """
    if not isinstance(x, Tensor) or not isinstance(y, Tensor) or x.dim() != 2 or x.shape != y.shape:
        raise ValueError(f"x and y must be (B, T) tensors of the same shape, got "
                         f"{tuple(getattr(x, 'shape', ()))} and {tuple(getattr(y, 'shape', ()))}")
    if not isinstance(depth, int) or depth < 1 or depth >= x.shape[1]:
        raise ValueError(f"depth must be an int with 1 ≤ depth < T={x.shape[1]}, got {depth!r}")
    return x[:, depth:], y[:, depth:]


class MTPModule(nn.Module):
    """One sequential MTP depth: ``post_norm(block(eh_proj([enorm(emb); hnorm(h_prev)]), cos, sin, mask))``.

    Args:
        d_model: D.
        block: any module called as ``block(x, cos, sin, mask) -> (B, T', D)`` with ``x (B, T', D)``,
            ``cos``/``sin`` the RoPE tables of the T' positions and ``mask`` a bool ``(T', T')`` causal mask
            (True = may attend). That is the signature of :class:`~llmcourse.models.llama3.Llama3Block`; a
            DeepSeek block with the same call signature works unchanged.
        rms_norm_eps: ε of the three RMSNorms.

    Keys: ``enorm.weight (D,)``, ``hnorm.weight (D,)``, ``eh_proj.weight (D, 2D)`` (no bias), ``mtp_block.*``,
    ``post_norm.weight (D,)``. The embedding and the output head are **not** part of the module: the model
    passes the shared embedding in and applies its own head to the output.

    ``forward(h_prev, emb, cos, sin, mask)``: ``h_prev, emb (B, T', D)`` -> ``(B, T', D)``.

    Raises:
        ValueError: ``h_prev`` and ``emb`` of different shapes or a last dimension other than D.
    """

    def __init__(self, d_model: int, block: nn.Module, rms_norm_eps: float = 1e-5):
        super().__init__()
        self.d_model = int(d_model)
        self.enorm = RMSNorm(d_model, rms_norm_eps)
        self.hnorm = RMSNorm(d_model, rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.mtp_block = block
        self.post_norm = RMSNorm(d_model, rms_norm_eps)

    def forward(self, h_prev: Tensor, emb: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        if h_prev.shape != emb.shape or h_prev.shape[-1] != self.d_model:
            raise ValueError(f"h_prev and emb must both be (B, T', {self.d_model}), got {tuple(h_prev.shape)} "
                             f"and {tuple(emb.shape)}")
        h = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h_prev)], dim=-1))
        h = self.mtp_block(h, cos, sin, mask)
        return self.post_norm(h)


class MTPLanguageModel(nn.Module):
    """A :class:`~llmcourse.models.llama3.Llama3Model` with ``mtp_depth`` sequential MTP modules.

    Keys: ``model.*`` (the Llama model) and ``mtp.{k}.*`` for ``k = 0 … D−1`` (each an :class:`MTPModule` whose
    block is a fresh :class:`~llmcourse.models.llama3.Llama3Block`). The modules use ``model.embed_tokens`` and
    ``model.lm_head`` (the same objects; no duplicate keys). ``mtp_depth = 0`` is the plain model trained with
    the same code (``loss = loss_main``), the baseline of an equal-budget comparison: its trunk starts from the
    same weights for the same seed, since the trunk is initialised before the MTP modules.

    ``forward(x, y)``: ``x, y (B, T)`` long -> dict with ``logits (B, T, V)``, ``mtp_logits`` (list of
    ``(B, T−k, V)``), ``loss_main``, ``loss_mtp`` (list of scalars) and
    ``loss = loss_main + mtp_lambda/D · Σ_k loss_mtp[k−1]``. Inference without MTP is ``self.model(idx)``.

    Raises:
        ValueError: ``mtp_depth < 0``; ``T ≤ mtp_depth`` (no position left at the deepest depth).
    """

    def __init__(self, cfg: Llama3Config, mtp_depth: int = 1, mtp_lambda: float = 0.3):
        super().__init__()
        if mtp_depth < 0:
            raise ValueError(f"mtp_depth must be ≥ 0, got {mtp_depth}")
        self.cfg, self.mtp_depth, self.mtp_lambda = cfg, int(mtp_depth), float(mtp_lambda)
        self.model = Llama3Model(cfg)
        self.mtp = nn.ModuleList(MTPModule(cfg.d_model, Llama3Block(cfg), cfg.rms_norm_eps) for _ in range(mtp_depth))
        self.init_mtp_weights()

    @torch.no_grad()
    def init_mtp_weights(self, std: float = 0.02) -> None:
        """Linear weights of the MTP modules ``~ N(0, std²)`` (global generator), their norms 1 (as the trunk)."""
        for module in self.mtp.modules():
            if isinstance(module, nn.Linear) and not module.weight.is_meta:
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm) and not module.weight.is_meta:
                nn.init.ones_(module.weight)

    def trunk(self, idx: Tensor) -> Tensor:
        """``h0 (B, T, D)``: the last layer's output **before** ``model.norm`` (``model(idx) = lm_head(norm(h0))``)."""
        m = self.model
        t = m._check(idx)
        x = m.embed_tokens(idx)
        cos, sin, mask = m.rope_cos[:t], m.rope_sin[:t], m.causal[:t, :t]
        for layer in m.layers:
            x = layer(x, cos, sin, mask)
        return x

    def mtp_hidden(self, k: int, h_prev: Tensor, tokens: Tensor) -> Tensor:
        """Depth ``k`` (1-based) on ``h_prev (B, T', D)`` (previous depth at positions ``0 … T'−1``) and the
        ``tokens (B, T')`` it embeds (absolute positions ``k … k+T'−1``) -> ``(B, T', D)``."""
        t = tokens.shape[1]
        m = self.model
        cos, sin = m.rope_cos[k:k + t], m.rope_sin[k:k + t]
        return self.mtp[k - 1](h_prev, m.embed_tokens(tokens), cos, sin, m.causal[:t, :t])

    def forward(self, x: Tensor, y: Tensor) -> dict:
        if x.dim() != 2 or x.shape != y.shape:
            raise ValueError(f"x and y must be (B, T) of the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
        t = x.shape[1]
        if self.mtp_depth and t <= self.mtp_depth:
            raise ValueError(f"T={t} leaves no position for MTP depth {self.mtp_depth}: use T > mtp_depth")
        h0 = self.trunk(x)
        logits = self.model.lm_head(self.model.norm(h0))
        loss_main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        h_prev, mtp_logits, loss_mtp = h0, [], []
        for k in range(1, self.mtp_depth + 1):
            e, tgt = mtp_inputs_and_targets(x, y, k)
            h_k = self.mtp_hidden(k, h_prev[:, :t - k], e)
            lg = self.model.lm_head(h_k)
            mtp_logits.append(lg)
            loss_mtp.append(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1)))
            h_prev = h_k
        loss = loss_main
        if self.mtp_depth:
            loss = loss_main + self.mtp_lambda / self.mtp_depth * torch.stack(loss_mtp).sum()
        return {"logits": logits, "mtp_logits": mtp_logits, "loss_main": loss_main, "loss_mtp": loss_mtp,
                "loss": loss}


@torch.no_grad()
def draft_agreement(model: MTPLanguageModel, x: Tensor) -> float:
    """Teacher-forced agreement of the depth-1 drafter with the main model on a given text ``x (B, T)`` long.

    At position ``i`` depth 1 (trunk state at ``i``, embedding of the text's token ``i+1``) guesses token ``i+2``;
    the main model at position ``i+1`` guesses the same token. Returns the fraction of the ``B·(T−1)`` positions
    where the two argmaxes are equal: the acceptance rate greedy self-speculative decoding would have if the
    text were its own output. Model mode is left unchanged (computed in eval mode).
    """
    was = model.training
    model.eval()
    try:
        h0 = model.trunk(x)
        main = model.model.lm_head(model.model.norm(h0[:, 1:])).argmax(-1)          # guesses of tokens 2 … T
        draft = model.model.lm_head(model.mtp_hidden(1, h0[:, :-1], x[:, 1:])).argmax(-1)
        return float((draft == main).float().mean())
    finally:
        model.train(was)


def mtp_param_count(cfg: Llama3Config) -> int:
    """Parameters of one MTP module with a Llama block (formula): ``3·D`` norms + ``2D·D`` projection + one block
    (``2·H·hd·D + 2·KV·hd·D + 3·D·I + 2·D``). ``llama3-tiny``: 230,016."""
    d, hd = cfg.d_model, cfg.hd
    block = 2 * cfg.n_heads * hd * d + 2 * cfg.n_kv_heads * hd * d + 3 * d * cfg.intermediate_size + 2 * d
    return 3 * d + 2 * d * d + block


def speculative_trace(model: MTPLanguageModel, idx: Tensor, max_new_tokens: int) -> dict:
    """:func:`speculative_generate` with its record: a dict with ``tokens`` ``(1, T0+n)``, ``rate``, ``calls``
    (main-model calls), ``drafts``, ``accepted`` and ``events``: one ``(kind, token)`` per step in order,
    kind ``"main"`` (a token from the main model), ``"accept"`` (a verified draft) or ``"reject"`` (a draft that
    was thrown away; ``token`` is the draft)."""
    record: dict = {}
    speculative_generate(model, idx, max_new_tokens, record=record)
    return record


@torch.no_grad()
def speculative_generate(model: MTPLanguageModel, idx: Tensor, max_new_tokens: int,
                         record: dict | None = None) -> tuple[Tensor, float]:
    """Greedy self-speculative decoding with the depth-1 MTP module as the drafter (batch 1).

    Each round the main model's next token ``a`` is appended; depth 1 then drafts the token after it from the
    trunk state at ``a``'s predecessor and the embedding of ``a``; one main-model call on ``sequence + draft``
    verifies it: the draft is accepted iff it equals the main model's argmax there, and then the same call's
    last position yields the following token for free. A rejected draft is replaced by the main model's own
    token. The output therefore equals plain greedy decoding of ``model.model`` token for token (up to float
    rounding ties); every accepted draft saves one main-model call.

    Args:
        model: an :class:`MTPLanguageModel` with ``mtp_depth ≥ 1``.
        idx: ``(1, T0)`` long prompt; ``T0 + max_new_tokens ≤ context_length``.
        max_new_tokens: ``≥ 0``.
        record: optional dict, filled with the run's record (see :func:`speculative_trace`).

    Returns:
        ``(tokens (1, T0 + max_new_tokens), rate)`` with ``rate = accepted drafts / drafts`` (0.0 without drafts).
        Main-model calls = generated tokens − accepted drafts (+1 when the last accepted draft ends the run).

    Raises:
        ValueError: a batch other than 1, ``max_new_tokens < 0``, a model without MTP modules, a result longer
        than the context.
    """
    record = {} if record is None else record
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.shape[0] != 1 or idx.shape[1] < 1 \
            or idx.is_floating_point():
        raise ValueError(f"idx must be a (1, T0) tensor of token ids with T0 ≥ 1, got {tuple(getattr(idx, 'shape', ()))}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    if not model.mtp_depth:
        raise ValueError("speculative decoding needs a model with mtp_depth ≥ 1 (the depth-1 module drafts)")
    ctx = model.cfg.context_length
    if idx.shape[1] + max_new_tokens > ctx:
        raise ValueError(f"T0 + max_new_tokens = {idx.shape[1] + max_new_tokens} exceeds context_length={ctx}")
    was_training = model.training
    model.eval()
    try:
        seq, events = idx, []
        calls = drafts = accepted = 0
        if max_new_tokens == 0:
            record.update(tokens=seq, rate=0.0, calls=0, drafts=0, accepted=0, events=events)
            return seq, 0.0
        h0 = model.trunk(seq)
        calls += 1
        nxt = model.model.lm_head(model.model.norm(h0[:, -1:])).argmax(-1)       # (1, 1)
        n = 0
        while True:
            seq = torch.cat([seq, nxt], dim=1)
            events.append(("main", int(nxt)))
            n += 1
            if n == max_new_tokens:
                break
            # draft: depth 1 at the last position reads h0 there and embeds the token just appended
            h1 = model.mtp_hidden(1, h0, seq[:, 1:])
            draft = model.model.lm_head(h1[:, -1:]).argmax(-1)
            drafts += 1
            h_all = model.trunk(torch.cat([seq, draft], dim=1))
            calls += 1
            logits = model.model.lm_head(model.model.norm(h_all[:, -2:]))
            verify = logits[:, :1].argmax(-1)
            if bool((verify == draft).all()):
                accepted += 1
                seq = torch.cat([seq, draft], dim=1)
                events.append(("accept", int(draft)))
                n += 1
                if n == max_new_tokens:
                    break
                h0, nxt = h_all, logits[:, 1:].argmax(-1)
            else:
                events.append(("reject", int(draft)))
                h0, nxt = h_all[:, :-1], verify
        rate = accepted / drafts if drafts else 0.0
        record.update(tokens=seq, rate=rate, calls=calls, drafts=drafts, accepted=accepted, events=events)
        return seq, rate
    finally:
        model.train(was_training)
