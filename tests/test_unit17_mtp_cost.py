"""Unit 17: FLOPs per training step counted with FlopCounterMode (MoE experts included) and the MTP cost rows."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmcourse.models.deepseek import DeepSeekConfig, DeepSeekLM, mtp_step_cost, train_step_flops
from llmcourse.models.deepseek_moe import DeepSeekMoE


def _flops(cfg, x, y):
    torch.manual_seed(0)
    return train_step_flops(DeepSeekLM(cfg), x, y)


def test_expert_flops_match_the_formula():
    """Widening every expert by ΔI adds 3 projections × (forward + 2 backward products) × 2 FLOPs per multiply-add
    on N·k routed rows and N shared rows per MoE layer. FlopCounterMode does not count F.grouped_mm, so a count that
    took the grouped path would miss the routed part and fail here."""
    B, T = 2, 16
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 65, (B, T), generator=g), torch.randint(0, 65, (B, T), generator=g)
    base = DeepSeekConfig(mtp_depth=0)
    wide = dataclasses.replace(base, moe_intermediate_size=2 * base.moe_intermediate_size)
    n_moe = base.n_layers - base.first_k_dense_replace
    N, D, dI = B * T, base.d_model, base.moe_intermediate_size
    rows = N * base.num_experts_per_tok + N * base.n_shared_experts
    want = n_moe * 3 * 3 * 2 * rows * D * dI
    assert _flops(wide, x, y) - _flops(base, x, y) == want
    assert DeepSeekMoE.use_grouped_mm is True, "the class switch must be restored"


def test_mtp_flops_and_side_effects():
    B, T = 2, 16
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 65, (B, T), generator=g), torch.randint(0, 65, (B, T), generator=g)
    torch.manual_seed(0)
    m = DeepSeekLM(DeepSeekConfig()).eval()
    f_with = train_step_flops(m, x, y)
    assert not m.training and all(p.grad is None for p in m.parameters())
    f_without = _flops(DeepSeekConfig(mtp_depth=0), x, y)
    # the MTP module holds one extra dense block plus eh_proj and a second pass through the head, on T-1 positions:
    # more than a tenth and less than the whole main model
    assert 0.1 * f_without < f_with - f_without < f_without
    # the head's share alone (forward + 2 backward products of (T-1)·B rows × D × V) is part of that difference
    head = 3 * 2 * (T - 1) * B * m.cfg.d_model * m.cfg.vocab_size
    assert f_with - f_without > head


def test_mtp_step_cost_rows():
    from llmcourse.data.corpus import char_corpus

    train = char_corpus("tinyshakespeare").train
    rows = mtp_step_cost(DeepSeekConfig(), train, 4, 16, repeats=3)
    assert [r["mtp_depth"] for r in rows] == [1, 0]
    assert rows[0]["flops_per_step"] > rows[1]["flops_per_step"] > 0
    assert all(r["ms_per_step"] > 0 for r in rows)
    with pytest.raises(ValueError):
        mtp_step_cost(DeepSeekConfig(mtp_depth=0), train, 4, 16)


def test_train_step_flops_counts_fused_attention_in_closed_form():
    """PyTorch's FlopCounterMode counts 0 for CPU's fused scaled_dot_product_attention; train_step_flops adds it:
    for GPT-2-char-tiny (4 layers, 4 heads of 32) at B=32, T=64 the count is the linear maps' (counted with the
    attention products zeroed) plus 3 · L · 2·B·H·T²·(d_k + d_v) (forward, and backward twice the forward)."""
    from torch.utils.flop_counter import FlopCounterMode

    from llmcourse.models import GPT2Config, GPT2Model
    from llmcourse.models.deepseek import sdpa_flops

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
    x, y = torch.randint(0, 65, (32, 64)), torch.randint(0, 65, (32, 64))
    with FlopCounterMode(display=False) as plain:       # torch's own counter: nothing for the fused attention
        torch.nn.functional.cross_entropy(model(x).reshape(-1, 65), y.reshape(-1)).backward()
    model.zero_grad(set_to_none=True)
    L, H, hd, B, T = 4, 4, 32, 32, 64
    attention = 3 * L * 2 * B * H * T * T * (hd + hd)
    assert attention == 3 * L * sdpa_flops((B, H, T, hd), (B, H, T, hd), (B, H, T, hd)) == 805_306_368
    assert train_step_flops(model, x, y) == plain.get_total_flops() + attention
