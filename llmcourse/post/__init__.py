"""Post-training (unit 19): from a pretrained model to a reasoning model with supervised fine-tuning and
GRPO on a task whose answers a program verifies (DeepSeekMath 2024; DeepSeek-R1 2025)."""

from .grpo import (
    completion_mask,
    evaluate_accuracy,
    evaluate_correct,
    frozen_copy,
    group_relative_advantages,
    grpo_loss,
    grpo_step,
    grpo_update,
    kl_k3,
    normalise_loss,
    per_token_logps,
    sample_completions,
)
from .sft import sft_batch, sft_labels, sft_loss, sft_train
from .task import SPECIAL_TOKENS, AdditionTask, ChatTokenizer, addition_reward, parse_completion

__all__ = ["SPECIAL_TOKENS", "AdditionTask", "ChatTokenizer", "addition_reward", "completion_mask",
           "evaluate_accuracy", "evaluate_correct", "frozen_copy", "group_relative_advantages", "grpo_loss", "grpo_step", "grpo_update", "kl_k3",
           "normalise_loss", "parse_completion", "per_token_logps", "sample_completions", "sft_batch", "sft_labels", "sft_loss",
           "sft_train"]
