"""Group relative policy optimisation (GRPO) from scratch (unit 19).

Sources: Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
Models" (2024), §4.1, equations (3) and (4) and the outcome-supervision advantage of §4.1.2; DeepSeek-AI,
"DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via Reinforcement Learning" (2025), §2.2 (the same
objective, rule-based accuracy + format rewards). The KL estimator is Schulman's "k3" ("Approximating KL
Divergence", 2020).

For each prompt ``q`` the old policy samples a **group** of ``G`` completions ``o_1 … o_G`` with rewards
``r_1 … r_G``. GRPO needs no value model: the baseline is the group itself,

    Â_i = (r_i − mean(r)) / std(r)                       (outcome supervision: every token of o_i gets Â_i)

and the policy maximises (DeepSeekMath eq. 3)

    J(θ) = 1/G Σ_i 1/|o_i| Σ_t [ min(ρ_{i,t} Â_i, clip(ρ_{i,t}, 1 − ε, 1 + ε) Â_i) − β D_KL ]
    ρ_{i,t} = π_θ(o_{i,t} | q, o_{i,<t}) / π_old(o_{i,t} | q, o_{i,<t}) = exp(log π_θ − log π_old)
    D_KL    = π_ref/π_θ − log(π_ref/π_θ) − 1             (eq. 4, per token; ≥ 0, = 0 iff the two agree)

where ``π_ref`` is the frozen model GRPO started from. :func:`grpo_loss` returns ``−J``.

Shapes: ``B`` prompts, ``G`` completions each (``N = B·G`` rows, the group of prompt ``b`` in rows
``b·G … b·G + G − 1``), ``T_c`` completion tokens per row; ``mask (N, T_c)`` marks the completion's own tokens
(up to and including its first ``<eos>``; the fill after it is not part of ``o_i``).

Conventions: the standard deviation is the sample one (``torch.std``, correction 1, as TRL's
``GRPOTrainer``), and a group whose rewards are all equal (std 0) gets advantages 0: it carries no
signal about which completion is better (dividing by its zero std would give ``0/0``). The objective is
normalised per sequence then averaged over sequences, as in eq. 3 (TRL's ``loss_type="grpo"``); DAPO's
token-level mean and Dr. GRPO's constant normaliser are the alternatives :func:`normalise_loss` offers, and
``scale_rewards="none"`` drops the std (Dr. GRPO).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from ..models.llama3_cached import _check_prompt, _PreallocatedKVCache
from ..train.optim import clip_grad_norm

__all__ = ["LOSS_TYPES", "SCALE_REWARDS", "completion_mask", "evaluate_accuracy", "frozen_copy",
           "group_relative_advantages", "grpo_loss", "grpo_step", "grpo_update", "kl_k3", "normalise_loss", "per_token_logps",
           "sample_completions"]


@torch.no_grad()
def sample_completions(model: nn.Module, prompts: Tensor, max_new_tokens: int, eos_id: int,
                       temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """Sample with a KV cache (unit 12's decoding loop) at a temperature.

    Args:
        model: a cache-aware model, ``model(idx, cache=KVCache) -> (B, T, V)`` (e.g.
            :class:`~llmcourse.models.llama3_cached.CachedLlama3Model`).
        prompts: ``(N, T0)`` long, equal-length prompts (repeat each prompt ``G`` times for a group).
        max_new_tokens: ``≥ 1``; ``T0 + max_new_tokens`` must fit the model's context.
        eos_id: a row that sampled it keeps emitting it; the loop stops once every row has.
        temperature: ``> 0``; each step draws from ``softmax(logits / temperature)``.
        generator: the draws' ``torch.Generator`` (seeded: the same samples every run).

    Returns:
        ``(N, T0 + n)`` long, ``n ≤ max_new_tokens``. The model's train/eval mode is restored.

    Raises:
        ValueError: bad prompts, ``max_new_tokens < 1`` or ``temperature ≤ 0`` (use
            :func:`~llmcourse.models.llama3_cached.generate_cached` for greedy decoding).
    """
    _check_prompt(prompts, max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (greedy decoding is generate_cached), got {temperature}")
    was_training = model.training
    model.eval()
    try:
        cache = _PreallocatedKVCache(len(model.layers), prompts.shape[1] + max_new_tokens)
        out = [prompts]
        done = torch.zeros(prompts.shape[0], dtype=torch.bool, device=prompts.device)
        logits = model(prompts, cache=cache)
        for step in range(max_new_tokens):
            probs = torch.softmax(logits[:, -1, :].float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt[:, 0] == eos_id)
            out.append(nxt)
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            logits = model(nxt, cache=cache)
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)


def completion_mask(completions: Tensor, eos_id: int) -> Tensor:
    """``(N, T_c)`` bool: True on each row's tokens up to and including its first ``eos_id`` (all True for a
    row without one). ``completions`` is ``(N, T_c)`` long (the sampled tokens after the prompt)."""
    is_eos = completions == eos_id
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()   # number of EOS strictly before t
    return before == 0


SCALE_REWARDS = ("group", "batch", "none")


def group_relative_advantages(rewards: Tensor, group_size: int, eps: float = 0.0, scale_rewards: str = "group") -> Tensor:
    """Outcome-supervised GRPO advantages ``Â_i = (r_i − mean_group) / std_group`` (DeepSeekMath §4.1.2).

    Args:
        rewards: ``(N,)`` float, ``N = B·G``, the group of prompt ``b`` in rows ``b·G … b·G + G − 1``.
        group_size: ``G ≥ 2``.
        eps: added to the std in the denominator (TRL uses ``1e-4``); ``0`` gives the paper's formula.
        scale_rewards: what the centred rewards are divided by, named as TRL's ``GRPOConfig.scale_rewards``:
            ``"group"`` (the group's sample std: DeepSeekMath), ``"batch"`` (one sample std of all ``N``
            rewards; the centring stays per group) or ``"none"`` (no division: Dr. GRPO, Liu et al. 2025,
            "Understanding R1-Zero-Like Training", §3.1, which removes the std's question-level difficulty bias).

    Returns:
        ``(N,)`` float: the advantages (sample std, correction 1). A group whose rewards are all equal gets
        all zeros (never NaN or inf, nor its float32 rounding noise divided by a std of ~1e-8); with ``"group"`` every other group has mean 0 and, with ``eps = 0``, sample std 1.

    Raises:
        ValueError: ``rewards`` not 1-D, ``group_size < 2``, ``N`` not a multiple of ``group_size``, or an
            unknown ``scale_rewards``.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B·G,), got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size must be ≥ 2 (a group of one has no spread), got {group_size}")
    if rewards.shape[0] % group_size:
        raise ValueError(f"{rewards.shape[0]} rewards are not a whole number of groups of {group_size}")
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    r = rewards.float().view(-1, group_size)
    # "no spread" is tested on the rewards themselves: in float32 torch reduces one row of eight rewards 0.1 to a
    # mean that is not exactly 0.1 and a std near 1e-8 instead of 0 (several rows happen to come out exact), and
    # dividing by it would turn rounding noise into advantages of about ±0.94
    spread = r.amax(dim=1, keepdim=True) > r.amin(dim=1, keepdim=True)
    centred = torch.where(spread, r - r.mean(dim=1, keepdim=True), torch.zeros_like(r))
    if scale_rewards == "none":
        return centred.view(-1)
    std = r.std(dim=1, keepdim=True) if scale_rewards == "group" else r.reshape(-1).std().expand(r.shape[0], 1)
    safe = torch.where(spread, std + eps, torch.ones_like(std))
    return torch.where(spread, centred / safe, torch.zeros_like(centred)).view(-1)


def per_token_logps(model: nn.Module, sequences: Tensor, prompt_len: int) -> Tensor:
    """Log-probabilities the model gives each completion token: ``(N, T − prompt_len)``.

    ``out[i, t] = log softmax(model(sequences)[i, prompt_len + t − 1])[sequences[i, prompt_len + t]]``: the
    logit at position ``p − 1`` scores the token at ``p``, and only the completion's positions are kept.
    Gradients flow when grad mode is on (call under ``torch.no_grad()`` for the old and reference models).

    Raises:
        ValueError: ``sequences`` not ``(N, T)`` integer, or ``prompt_len`` outside ``[1, T)``.
    """
    if not isinstance(sequences, Tensor) or sequences.dim() != 2 or sequences.is_floating_point():
        raise ValueError(f"sequences must be (N, T) token ids, got {getattr(sequences, 'shape', sequences)}")
    if not 1 <= int(prompt_len) < sequences.shape[1]:
        raise ValueError(f"prompt_len must be in [1, T) = [1, {sequences.shape[1]}), got {prompt_len}")
    logits = model(sequences)[:, int(prompt_len) - 1:-1].float()
    targets = sequences[:, int(prompt_len):]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def kl_k3(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token k3 estimate of ``KL(π_θ ‖ π_ref)`` (DeepSeekMath eq. 4): ``exp(d) − d − 1`` with
    ``d = ref_logps − logps``. Same shape as the inputs; ``≥ 0``, ``0`` where the log-probs agree."""
    d = ref_logps - logps
    return torch.exp(d) - d - 1


LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


def _masked_sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(values.dtype)
    return ((values * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)).mean()


def normalise_loss(per_token: Tensor, mask: Tensor, loss_type: str = "grpo",
                   max_completion_length: int | None = None) -> Tensor:
    """Reduce a per-token objective ``(N, T_c)`` over the mask to a scalar, as ``loss_type`` says.

    * ``"grpo"``: ``1/N Σ_i 1/|o_i| Σ_t`` (DeepSeekMath eq. 3; TRL ``loss_type="grpo"``). Every completion
      weighs the same, so a token of a long completion weighs less (the length bias Dr. GRPO points out).
    * ``"dapo"``: ``Σ_{i,t} / Σ_i |o_i|``, one mean over the batch's tokens (DAPO, Yu et al. 2025, eq. 8,
      "token-level policy gradient loss"; TRL ``loss_type="dapo"``, its default, on one process).
    * ``"dr_grpo"``: ``Σ_{i,t} / (N · L)`` with the constant ``L = max_completion_length`` (default ``T_c``)
      (Dr. GRPO, Liu et al. 2025, §3.1; TRL ``loss_type="dr_grpo"``).

    A row with an empty mask contributes 0 in all three. Raises ``ValueError`` for an unknown ``loss_type``.
    """
    m = mask.to(per_token.dtype)
    if loss_type == "grpo":
        return _masked_sequence_mean(per_token, mask)
    if loss_type == "dapo":
        return (per_token * m).sum() / m.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        length = per_token.shape[1] if max_completion_length is None else int(max_completion_length)
        return (per_token * m).sum() / (per_token.shape[0] * length)
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def grpo_loss(logps: Tensor, old_logps: Tensor, ref_logps: Tensor, advantages: Tensor, mask: Tensor,
              clip_eps: float = 0.2, beta: float = 0.04, loss_type: str = "grpo",
              max_completion_length: int | None = None) -> Tensor:
    """The GRPO loss ``−J(θ)`` of DeepSeekMath eq. 3 with the k3 KL of eq. 4 (see the module docstring).

    Args:
        logps: ``(N, T_c)`` float, :func:`per_token_logps` of the policy being trained (with gradients).
        old_logps: ``(N, T_c)``, the same under the policy that sampled the group (no gradient).
        ref_logps: ``(N, T_c)``, the same under the frozen reference model (no gradient).
        advantages: ``(N,)``, one per completion (:func:`group_relative_advantages`).
        mask: ``(N, T_c)`` bool or 0/1, the completion's own tokens (:func:`completion_mask`).
        clip_eps: ε of the clip, ``ρ ∈ [1 − ε, 1 + ε]``.
        beta: weight β of the KL penalty (DeepSeekMath used 0.04).
        loss_type: how the per-token terms are averaged (:func:`normalise_loss`): ``"grpo"`` (the default,
            eq. 3), ``"dapo"`` (one token-level mean) or ``"dr_grpo"`` (a constant normaliser ``N · L``).
        max_completion_length: ``L`` of ``"dr_grpo"`` (default ``T_c``); ignored by the others.

    Returns:
        Scalar: with ``"grpo"``, ``−1/N Σ_i 1/|o_i| Σ_{t ∈ o_i} [min(ρ Â_i, clip(ρ) Â_i) − β·k3]`` with
        ``ρ = exp(logps − old_logps)``. A row with an empty mask contributes 0. Equals TRL 1.16's
        ``GRPOTrainer._compute_loss`` (``importance_sampling_level="token"``, ``epsilon_low = epsilon_high = ε``,
        one process, no gradient accumulation) for each of the three loss types (tests/test_unit19_trl.py).

    Raises:
        ValueError: shapes that do not match, or an unknown ``loss_type``.
    """
    if logps.dim() != 2 or old_logps.shape != logps.shape or ref_logps.shape != logps.shape \
            or tuple(mask.shape) != tuple(logps.shape):
        raise ValueError(f"logps, old_logps, ref_logps and mask must share one (N, T_c) shape; got "
                         f"{tuple(logps.shape)}, {tuple(old_logps.shape)}, {tuple(ref_logps.shape)}, {tuple(mask.shape)}")
    if tuple(advantages.shape) != (logps.shape[0],):
        raise ValueError(f"advantages must be ({logps.shape[0]},), got {tuple(advantages.shape)}")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    ratio = torch.exp(logps - old_logps.detach())
    adv = advantages.detach().to(logps.dtype)[:, None]
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    per_token = surrogate - beta * kl_k3(logps, ref_logps.detach())
    return -normalise_loss(per_token, mask, loss_type, max_completion_length)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy in eval mode with ``requires_grad=False`` everywhere: the reference model ``π_ref``."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def grpo_step(policy: nn.Module, ref_model: nn.Module, optimizer: torch.optim.Optimizer, task, pairs: Tensor,
              group_size: int = 8, temperature: float = 1.0, clip_eps: float = 0.2, beta: float = 0.04,
              inner_steps: int = 1, max_norm: float = 1.0, generator: torch.Generator | None = None,
              reward_weights: dict | None = None, loss_type: str = "grpo", scale_rewards: str = "group") -> dict:
    """One GRPO iteration on the ``(B, 2)`` pairs of ``task`` (:class:`~llmcourse.post.task.AdditionTask`).

    1. the current policy (= ``π_old``) samples ``group_size`` completions per prompt
       (:func:`sample_completions`, at most ``task.max_new_tokens`` tokens);
    2. rewards (``task.rewards(..., **reward_weights)``) and :func:`group_relative_advantages` (with
       ``scale_rewards``);
    3. ``old_logps`` and ``ref_logps`` without gradients (:func:`per_token_logps`);
    4. ``inner_steps`` optimizer steps on :func:`grpo_loss` (μ in DeepSeekMath's Algorithm 1), each with
       global-norm clipping at ``max_norm``. With ``inner_steps = 1`` the ratio is 1 at the step and the clip
       never acts; the KL term and the advantage-weighted log-likelihood gradient remain. ``loss_type`` is
       :func:`grpo_loss`'s (``"dr_grpo"`` normalises by ``task.max_new_tokens``).

    Returns:
        dict of floats: ``reward`` (mean), ``accuracy`` (fraction of sampled completions that are correct),
        ``length`` (mean completion length in tokens, ``<eos>`` included), ``kl`` (masked mean k3 before the
        update), ``loss`` (of the first inner step), ``zero_std_groups`` (fraction of groups with no spread),
        ``clip_fraction`` (of masked tokens clipped at the last inner step).
    """
    tok = task.tokenizer
    prompts = task.prompts(pairs).repeat_interleave(group_size, dim=0)
    pairs_g = pairs.repeat_interleave(group_size, dim=0)
    seqs = sample_completions(policy, prompts, task.max_new_tokens, tok.eos_id, temperature, generator)
    P = task.prompt_len
    completions = seqs[:, P:]
    mask = completion_mask(completions, tok.eos_id)
    rewards = task.rewards(pairs_g, completions, **(reward_weights or {}))
    adv = group_relative_advantages(rewards, group_size, scale_rewards=scale_rewards)
    with torch.no_grad():
        old = per_token_logps(policy, seqs, P)
        ref = per_token_logps(ref_model, seqs, P)
    policy.train()
    losses, clipped = [], 0.0
    for _ in range(inner_steps):
        logps = per_token_logps(policy, seqs, P)
        loss = grpo_loss(logps, old, ref, adv, mask, clip_eps, beta, loss_type=loss_type,
                         max_completion_length=task.max_new_tokens)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(policy.parameters(), max_norm)
        optimizer.step()
        losses.append(loss.item())
        with torch.no_grad():
            ratio = torch.exp(logps - old)
            clipped = (((ratio - 1).abs() > clip_eps) & mask).sum().item() / max(mask.sum().item(), 1)
    policy.eval()
    m = mask.float()
    return {
        "reward": rewards.mean().item(),
        "accuracy": task.correct(pairs_g, completions).float().mean().item(),
        "length": m.sum(dim=1).mean().item(),
        "kl": ((kl_k3(old, ref) * m).sum() / m.sum().clamp(min=1)).item(),
        "loss": losses[0],
        "zero_std_groups": (rewards.view(-1, group_size).amax(dim=1) == rewards.view(-1, group_size).amin(dim=1))
        .float().mean().item(),
        "clip_fraction": clipped,
    }


def grpo_update(policy: nn.Module, ref_model: nn.Module, optimizer: torch.optim.Optimizer, sequences: Tensor,
                prompt_len: int, rewards: Tensor, mask: Tensor, group_size: int, clip_eps: float = 0.2,
                beta: float = 0.04, inner_steps: int = 1, max_norm: float | None = None) -> list[float]:
    """The update half of a GRPO iteration, on completions already sampled (DeepSeekMath Algorithm 1, the μ inner
    steps for one batch): advantages, the old and reference log-probabilities, then ``inner_steps`` optimizer steps.

    1. ``Â = group_relative_advantages(rewards, group_size)``;
    2. ``old_logps`` (the policy as it sampled, before any step) and ``ref_logps`` under ``torch.no_grad()``,
       both computed once: the old policy stays fixed while the inner steps move ``policy``;
    3. per inner step: ``logps`` with gradients, :func:`grpo_loss`, ``zero_grad``, backward, optional
       global-norm clipping at ``max_norm``, ``optimizer.step()``.

    Args:
        sequences: ``(N, T)`` long, prompts of length ``prompt_len`` followed by the sampled completions.
        rewards: ``(N,)``; ``mask``: ``(N, T − prompt_len)`` bool (:func:`completion_mask`).

    Returns:
        The ``inner_steps`` losses, each computed before its step (Python floats). ``ref_model`` is not changed.

    Raises:
        ValueError: ``inner_steps < 1``, or ``rewards``/``mask`` shapes that do not match ``sequences``.
    """
    if inner_steps < 1:
        raise ValueError(f"inner_steps must be ≥ 1, got {inner_steps}")
    n, t = sequences.shape
    if tuple(rewards.shape) != (n,) or tuple(mask.shape) != (n, t - prompt_len):
        raise ValueError(f"rewards {tuple(rewards.shape)} and mask {tuple(mask.shape)} do not match sequences "
                         f"{tuple(sequences.shape)} with prompt_len {prompt_len}")
    adv = group_relative_advantages(rewards, group_size)
    with torch.no_grad():
        old = per_token_logps(policy, sequences, prompt_len)
        ref = per_token_logps(ref_model, sequences, prompt_len)
    losses = []
    for _ in range(inner_steps):
        loss = grpo_loss(per_token_logps(policy, sequences, prompt_len), old, ref, adv, mask, clip_eps, beta)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_norm is not None:
            clip_grad_norm(policy.parameters(), max_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def evaluate_correct(model: nn.Module, task, pairs: Tensor, batch_size: int = 256) -> Tensor:
    """``(n,)`` bool: whether greedy decoding (:func:`~llmcourse.models.llama3_cached.generate_cached`, stopping
    at ``<eos>``) answers each of the ``(n, 2)`` pairs correctly; the per-item record a paired test needs."""
    from ..models.llama3_cached import generate_cached

    out = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        seqs = generate_cached(model, task.prompts(chunk), task.max_new_tokens, task.tokenizer.eos_id)
        out.append(task.correct(chunk, seqs[:, task.prompt_len:]).bool())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, task, pairs: Tensor, batch_size: int = 256) -> float:
    """Fraction of the ``(n, 2)`` pairs answered correctly with greedy decoding (:func:`evaluate_correct`)."""
    return int(evaluate_correct(model, task, pairs, batch_size).sum()) / max(len(pairs), 1)
