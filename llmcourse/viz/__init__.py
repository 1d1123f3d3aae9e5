"""Widgets and figures. Each ``show_*`` has a static matplotlib fallback (see :mod:`llmcourse.viz.base`)."""

from .attention import (
    show_attention_lab,
    show_dropout_on_weights,
    show_query_geometry,
    show_sentence_attention,
    show_softmax_sharpness,
    show_variance_vs_dim,
)
from .base import StaticFigure, css_class, figure, live_or_static, redrawing_output
from .blocks import (
    show_activations,
    show_block_diagram,
    show_layernorm,
    show_pre_post_ln,
    show_residual_gradients,
)
from .classifier import show_cls_attention, show_confusion, show_training_curves
from .essentials import show_dropout_clicker, show_label_smoothing, show_noam_curve, show_shape_tracer
from .gpt2 import show_architecture_map, show_divergence_finder, show_param_sunburst
from .llama import (
    show_gqa_map,
    show_llama_param_diff,
    show_rope_relative,
    show_rope_rotation,
    show_rope_smoothing,
)
from .multihead import show_head_viewer, show_mask_translator, show_merge_visualiser
from .positions import (
    show_candidate_comparison,
    show_frequency_explorer,
    show_pe_heatmap,
    show_position_similarity,
    show_shift_rotation,
)
from .pretraining import (
    make_training_dashboard,
    show_checkpoint_sampler,
    show_schedule_explorer,
    show_training_dashboard,
)
from .tokenization import show_bpe_stepper, show_sliding_window, show_tokenizer_comparison
from .translation import show_alignment_explorer, show_training_monitor, show_translation_box

__all__ = [
    "show_cls_attention", "show_confusion", "show_training_curves",
    "show_activations", "show_block_diagram", "show_layernorm", "show_pre_post_ln", "show_residual_gradients",
    "StaticFigure", "css_class", "figure", "live_or_static", "redrawing_output",
    "show_attention_lab", "show_dropout_on_weights", "show_query_geometry", "show_sentence_attention",
    "show_softmax_sharpness", "show_variance_vs_dim",
    "show_architecture_map", "show_divergence_finder", "show_param_sunburst",
    "show_gqa_map", "show_llama_param_diff", "show_rope_relative", "show_rope_rotation", "show_rope_smoothing",
    "show_dropout_clicker", "show_label_smoothing", "show_noam_curve", "show_shape_tracer",
    "show_bpe_stepper", "show_sliding_window", "show_tokenizer_comparison",
    "show_candidate_comparison", "show_frequency_explorer", "show_pe_heatmap", "show_position_similarity",
    "show_shift_rotation",
    "show_alignment_explorer", "show_training_monitor", "show_translation_box",
    "show_head_viewer", "show_mask_translator", "show_merge_visualiser",
    "make_training_dashboard", "show_checkpoint_sampler", "show_schedule_explorer", "show_training_dashboard",
]
