"""Whole models, built from the pieces in :mod:`llmcourse.nn`."""

from .attention_lm import AttentionOnlyLM
from .encoder_classifier import BertEmbeddings, EncoderClassifier
from .transformer import Transformer

__all__ = ["AttentionOnlyLM", "BertEmbeddings", "EncoderClassifier", "Transformer"]
