"""Whole models, built from the pieces in :mod:`llmcourse.nn`."""

from .attention_lm import AttentionOnlyLM

__all__ = ["AttentionOnlyLM"]
