"""TRL as a test-only oracle of unit 19's GRPO loss (trl is pinned in requirements-dev.txt, never a course dependency).

The course's :func:`llmcourse.post.grpo.grpo_loss` must equal TRL's GRPO loss on the same log-probabilities,
advantages and masks, value and gradient, for each normalisation the two share (``loss_type`` ``"grpo"``,
``"dapo"``, ``"dr_grpo"``). TRL's loss is computed by TRL's own code: the method ``GRPOTrainer._compute_loss``
(trl 1.16.0, ``trl/trainer/grpo_trainer.py``), called unbound on a stand-in ``self`` that holds the attributes
that method reads (a full trainer would need a model on the hub, a dataset and generation: none of which the loss
reads). Its forward hook ``_get_per_token_logps_and_entropies`` is replaced by one that returns our synthetic
log-probabilities, so the same leaf tensor goes through both routes and the gradients can be compared too.
Configuration matched: token-level importance sampling, ``epsilon_low = epsilon_high = clip_eps``, one process, no
gradient accumulation, no entropy mask, bonus, vLLM correction, off-policy mask or delta clip.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer", reason="trl (requirements-dev.txt) is not installed")

from llmcourse.post.grpo import LOSS_TYPES, group_relative_advantages, grpo_loss  # noqa: E402


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def _trl_loss(logps, old, ref, adv, mask, clip_eps, beta, loss_type, max_completion_length):
    """TRL's ``GRPOTrainer._compute_loss`` on the given tensors (``logps`` stands for the model's output)."""
    n, t = logps.shape
    entropies = torch.zeros_like(logps.detach())
    me = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=beta, loss_type=loss_type, epsilon_low=clip_eps, epsilon_high=clip_eps, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=max_completion_length,
        accelerator=_Accelerator(), _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, entropies, None),
    )
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, t, dtype=torch.long), "completion_mask": mask.long(),
        "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    return trl_grpo.GRPOTrainer._compute_loss(me, None, inputs)


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    n, t = 8, 6
    logps = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3 - 0.05
    old = logps + torch.randn(n, t, generator=g, dtype=torch.float64) * 0.4    # ratios on both sides of the clip
    ref = logps + torch.randn(n, t, generator=g, dtype=torch.float64) * 0.5
    rewards = torch.tensor([1.1, 0.1, 0.1, 0.0, 0.1, 0.1, 0.1, 0.1], dtype=torch.float64)
    adv = group_relative_advantages(rewards, 4).double()
    lengths = torch.tensor([6, 3, 1, 4, 2, 0, 5, 6])
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return logps, old, ref, adv, mask


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kw", [dict(clip_eps=0.2, beta=0.04), dict(clip_eps=0.1, beta=0.3), dict(clip_eps=0.3, beta=0.0)])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_loss_equals_trl(loss_type, kw, seed):
    logps, old, ref, adv, mask = _inputs(seed)
    L = 9                                    # dr_grpo's constant: larger than T_c, so it is not T_c by accident
    a = logps.clone().requires_grad_(True)
    ours = grpo_loss(a, old, ref, adv, mask, loss_type=loss_type, max_completion_length=L, **kw)
    ours.backward()
    b = logps.clone().requires_grad_(True)
    theirs = _trl_loss(b, old, ref, adv, mask, kw["clip_eps"], kw["beta"], loss_type, L)
    theirs.backward()
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(a.grad, b.grad, atol=1e-12, rtol=1e-12)


def test_the_oracle_can_fail():
    """TRL's route tells the three normalisations apart on these inputs, so the equalities above say something."""
    logps, old, ref, adv, mask = _inputs(0)
    values = {lt: float(_trl_loss(logps, old, ref, adv, mask, 0.2, 0.04, lt, 9)) for lt in LOSS_TYPES}
    assert len({round(v, 9) for v in values.values()}) == 3, values
    ours = grpo_loss(logps, old, ref, adv, mask, loss_type="grpo")
    assert abs(float(ours) - values["dapo"]) > 1e-6


def test_trl_install_kept_the_cpu_torch():
    import trl

    assert trl.__version__ == "1.16.0"
    assert torch.__version__.startswith("2.13.0") and not torch.version.cuda
