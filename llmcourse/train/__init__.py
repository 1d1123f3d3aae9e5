"""Training utilities: losses, learning-rate schedules (one home per concept)."""

from .classification import accuracy, confusion_matrix, evaluate
from .decoding import greedy_translate
from .losses import label_smoothed_cross_entropy
from .metrics import chrf
from .schedules import make_noam_scheduler, noam_lambda

__all__ = ["accuracy", "chrf", "confusion_matrix", "evaluate", "greedy_translate", "label_smoothed_cross_entropy", "make_noam_scheduler", "noam_lambda"]
