"""llmcourse.models.AttentionOnlyLM: the one-layer attention-only LM trained in unit 03's lesson."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from llmcourse.models import AttentionOnlyLM
from llmcourse.nn import CausalSelfAttention


def _model(v=11, d=8, c=10, seed=0):
    torch.manual_seed(seed)
    return AttentionOnlyLM(v, d, c)


def test_shapes_keys_and_parameter_count():
    m = _model()
    logits = m(torch.randint(0, 11, (3, 7)))
    assert logits.shape == (3, 7, 11) and logits.dtype == torch.float32
    assert sorted(m.state_dict()) == sorted([
        "tok_emb.weight", "pos_emb.weight", "attn.W_query.weight", "attn.W_key.weight", "attn.W_value.weight",
        "lm_head.weight", "lm_head.bias"])
    v, d, c = 11, 8, 10
    assert sum(p.numel() for p in m.parameters()) == v * d + c * d + 3 * d * d + d * v + v
    assert isinstance(m.attn, CausalSelfAttention)
    assert m.attn.last_weights.shape == (3, 7, 7)


def test_forward_is_embeddings_plus_residual_attention_then_head():
    m = _model()
    idx = torch.randint(0, 11, (2, 6))
    with torch.no_grad():
        x = m.tok_emb.weight[idx] + m.pos_emb.weight[:6]
        q, k, v = x @ m.attn.W_query.weight.T, x @ m.attn.W_key.weight.T, x @ m.attn.W_value.weight.T
        h = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        expected = h @ m.lm_head.weight.T + m.lm_head.bias
        assert torch.allclose(m(idx), expected, atol=1e-5)


def test_causal_future_ids_do_not_change_past_logits():
    m = _model().eval()
    idx = torch.randint(0, 11, (2, 9))
    other = idx.clone()
    other[:, 5:] = (other[:, 5:] + 3) % 11
    with torch.no_grad():
        assert torch.allclose(m(idx)[:, :5], m(other)[:, :5], atol=1e-6)
        assert not torch.allclose(m(idx)[:, 5:], m(other)[:, 5:])


def test_clear_errors():
    m = _model()
    with pytest.raises(ValueError, match="context_length"):
        m(torch.zeros(1, 11, dtype=torch.long))
    with pytest.raises(ValueError, match="integer token ids"):
        m(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="integer token ids"):
        m(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        m(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match="vocab_size"):
        AttentionOnlyLM(0, 8, 4)
    with pytest.raises(ValueError, match="temperature"):
        m.generate(torch.zeros(1, 1, dtype=torch.long), 3, temperature=0.0)


def test_generate_shape_mode_and_determinism():
    m = _model().train()
    start = torch.zeros(2, 3, dtype=torch.long)
    a = m.generate(start, 15, generator=torch.Generator().manual_seed(0))   # longer than context_length
    b = m.generate(start, 15, generator=torch.Generator().manual_seed(0))
    assert a.shape == (2, 18) and a.dtype == torch.long and torch.equal(a[:, :3], start)
    assert torch.equal(a, b)
    assert m.training                                      # previous mode restored
    assert int(a.min()) >= 0 and int(a.max()) < 11


def test_learns_a_periodic_sequence():
    """A few dozen AdamW steps on 'abcabc…' drive the loss far below ln(3)."""
    torch.manual_seed(0)
    m = AttentionOnlyLM(3, 16, 12)
    seq = torch.arange(13) % 3
    x, y = seq[:-1][None], seq[1:][None]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(60):
        loss = F.cross_entropy(m(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2 * math.log(3)
