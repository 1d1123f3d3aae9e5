"""Neural-network building blocks (one home per concept)."""

from .attention import (
    CausalSelfAttention,
    SelfAttention,
    scaled_dot_product_attention,
    simple_attention,
    softmax_stable,
)
from .blocks import DecoderBlock, EncoderBlock, ProjectionLayer
from .einsum import attention_output_einsum, attention_scores_einsum
from .embeddings import GPTEmbedding, InputEmbeddings, embedding_lookup, one_hot_matmul
from .feedforward import FeedForward, gelu
from .heads import merge_heads, split_heads
from .kv_cache import (
    KV_PRESETS,
    KVCache,
    attn_cache_elems_per_token,
    kv_cache_bytes,
    kv_elements_per_token,
    mha_to_gqa,
    mla_cache_bytes,
)
from .masks import causal_mask, padding_mask
from .multihead import (
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    mha_forward_sdpa,
    mha_from_wrapper,
    mha_param_count,
    to_torch_attn_mask,
    to_torch_mha,
)
from .norms import LayerNorm
from .positions import PositionalEncoding, inverse_frequencies, shift_matrix, sinusoidal_pe
from .residual import ResidualStack

__all__ = [
    "DecoderBlock", "EncoderBlock", "FeedForward", "LayerNorm", "ProjectionLayer", "gelu",
    "GPTEmbedding", "InputEmbeddings", "PositionalEncoding", "embedding_lookup", "inverse_frequencies",
    "one_hot_matmul", "shift_matrix", "sinusoidal_pe",
    "CausalSelfAttention", "ResidualStack", "SelfAttention", "attention_output_einsum", "attention_scores_einsum",
    "causal_mask", "merge_heads", "padding_mask",
    "KV_PRESETS", "KVCache", "kv_cache_bytes", "kv_elements_per_token", "mha_to_gqa", "attn_cache_elems_per_token",
    "mla_cache_bytes",
    "MultiHeadAttention", "MultiHeadAttentionWrapper", "mha_forward_sdpa", "mha_from_wrapper", "mha_param_count",
    "to_torch_attn_mask", "to_torch_mha",
    "scaled_dot_product_attention", "simple_attention", "softmax_stable", "split_heads",
]
