"""Neural-network building blocks (one home per concept)."""

from .attention import (
    CausalSelfAttention,
    SelfAttention,
    scaled_dot_product_attention,
    simple_attention,
    softmax_stable,
)
from .heads import merge_heads, split_heads
from .masks import causal_mask, padding_mask

__all__ = [
    "CausalSelfAttention", "SelfAttention", "causal_mask", "merge_heads", "padding_mask",
    "scaled_dot_product_attention", "simple_attention", "softmax_stable", "split_heads",
]
