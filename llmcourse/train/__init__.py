"""Training utilities: losses, learning-rate schedules (one home per concept)."""

from .classification import accuracy, confusion_matrix, evaluate
from .losses import label_smoothed_cross_entropy
from .schedules import make_noam_scheduler, noam_lambda

__all__ = ["accuracy", "confusion_matrix", "evaluate", "label_smoothed_cross_entropy", "make_noam_scheduler", "noam_lambda"]
