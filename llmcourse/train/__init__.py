"""Training utilities: losses, learning-rate schedules, decoding and sampling (one home per concept)."""

from .classification import accuracy, confusion_matrix, evaluate
from .decoding import greedy_translate
from .losses import label_smoothed_cross_entropy
from .metrics import chrf
from .sampling import (
    apply_temperature,
    entropy,
    filtered_probs,
    generate,
    sample_next_token,
    top_k_filter,
    top_p_filter,
)
from .schedules import make_noam_scheduler, noam_lambda

__all__ = ["accuracy", "chrf", "confusion_matrix", "evaluate", "greedy_translate", "label_smoothed_cross_entropy", "make_noam_scheduler", "noam_lambda",
           "apply_temperature", "entropy", "filtered_probs", "generate", "sample_next_token", "top_k_filter",
           "top_p_filter"]
