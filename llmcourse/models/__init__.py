"""Whole models, built from the pieces in :mod:`llmcourse.nn`."""

from .attention_lm import AttentionOnlyLM
from .deepseek_mla import (
    DEEPSEEK_V3_MLA,
    DeepSeekMLA,
    LatentCache,
    SimpleMLA,
    absorb_mla_weights,
    absorbed_forward,
    hf_deepseek_attention_config,
    mla_param_count,
)
from .deepseek_moe import (
    DeepSeekMoE,
    DeepSeekTopkRouter,
    deepseek_route,
    expert_counts,
    hf_deepseek_moe_config,
    load_balancing_loss,
    load_hf_deepseek_moe,
    moe_param_counts,
    moe_state_dict_from_hf,
    random_hf_deepseek_moe,
    softmax_topk_route,
    update_bias,
)
from .encoder_classifier import BertEmbeddings, EncoderClassifier
from .gpt2 import (
    GPT2_PRESETS,
    GPT2Block,
    GPT2Config,
    GPT2Model,
    count_parameters,
    find_pretrained_gpt2,
    gpt2_param_breakdown,
    gpt2_param_count,
    hf_gpt2_config,
    load_hf_gpt2,
    load_pretrained_gpt2,
    pretrained_gpt2_dir,
    random_hf_gpt2,
)
from .llama3 import (
    LLAMA3_PRESETS,
    GroupedQueryAttention,
    Llama3Block,
    Llama3Config,
    Llama3Model,
    RMSNorm,
    SwiGLUFeedForward,
    apply_rope,
    apply_rope_interleaved,
    hf_llama_config,
    interleaved_to_half_split_perm,
    llama3_param_breakdown,
    llama3_param_count,
    llama_parity_configs,
    load_hf_llama,
    random_hf_llama,
    repeat_kv,
    rope_cos_sin,
    rope_inv_freq,
    rotate_half,
)
from .llama3_cached import (
    CachedGroupedQueryAttention,
    CachedLlama3Block,
    CachedLlama3Model,
    generate_cached,
    generate_uncached,
)
from .mtp import (
    MTPLanguageModel,
    MTPModule,
    mtp_inputs_and_targets,
    mtp_param_count,
    speculative_generate,
    speculative_trace,
)
from .transformer import Transformer

__all__ = [
    "AttentionOnlyLM", "BertEmbeddings", "EncoderClassifier", "Transformer",
    "GPT2_PRESETS", "GPT2Block", "GPT2Config", "GPT2Model", "count_parameters", "gpt2_param_breakdown",
    "gpt2_param_count", "hf_gpt2_config", "load_hf_gpt2", "random_hf_gpt2",
    "find_pretrained_gpt2", "load_pretrained_gpt2", "pretrained_gpt2_dir",
    "LLAMA3_PRESETS", "GroupedQueryAttention", "Llama3Block", "Llama3Config", "Llama3Model", "RMSNorm",
    "SwiGLUFeedForward", "apply_rope", "apply_rope_interleaved", "hf_llama_config", "interleaved_to_half_split_perm",
    "llama3_param_breakdown", "llama3_param_count", "llama_parity_configs", "load_hf_llama", "random_hf_llama",
    "repeat_kv", "rope_cos_sin", "rope_inv_freq", "rotate_half",
    "DeepSeekMoE", "DeepSeekTopkRouter", "deepseek_route", "expert_counts", "hf_deepseek_moe_config",
    "load_balancing_loss", "load_hf_deepseek_moe", "moe_param_counts", "moe_state_dict_from_hf",
    "random_hf_deepseek_moe", "softmax_topk_route", "update_bias",
    "DEEPSEEK_V3_MLA", "DeepSeekMLA", "LatentCache", "SimpleMLA", "absorb_mla_weights", "absorbed_forward",
    "hf_deepseek_attention_config", "mla_param_count",
    "CachedGroupedQueryAttention", "CachedLlama3Block", "CachedLlama3Model", "generate_cached", "generate_uncached",
    "MTPLanguageModel", "MTPModule", "mtp_inputs_and_targets", "mtp_param_count", "speculative_generate",
    "speculative_trace",
]
