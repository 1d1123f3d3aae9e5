"""Training utilities: losses, learning-rate schedules, optimizers, checkpoints, the pretraining loop,
decoding and sampling (one home per concept)."""

from .checkpoints import load_checkpoint, save_checkpoint
from .classification import accuracy, confusion_matrix, evaluate
from .decoding import greedy_translate
from .losses import label_smoothed_cross_entropy, lm_loss, perplexity
from .metrics import chrf
from .optim import clip_grad_norm, configure_optimizer
from .pretraining import estimate_loss, pretrain, train_step, train_steps
from .sampling import (
    apply_temperature,
    entropy,
    filtered_probs,
    generate,
    generate_batched,
    padded_batch,
    sample_next_token,
    top_k_filter,
    top_p_filter,
)
from .schedules import make_noam_scheduler, noam_lambda, warmup_cosine_lr

__all__ = ["accuracy", "chrf", "confusion_matrix", "evaluate", "greedy_translate", "label_smoothed_cross_entropy", "make_noam_scheduler", "noam_lambda",
           "apply_temperature", "entropy", "filtered_probs", "generate", "generate_batched", "padded_batch", "sample_next_token", "top_k_filter",
           "top_p_filter",
           # unit 10: pretraining
           "clip_grad_norm", "configure_optimizer", "estimate_loss", "load_checkpoint", "lm_loss", "perplexity",
           "pretrain", "save_checkpoint", "train_step", "train_steps", "warmup_cosine_lr"]
