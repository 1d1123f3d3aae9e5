"""Unit 03 reference code vs independent oracles (torch built-ins) and the syllabus fixtures."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from llmcourse.nn import (
    CausalSelfAttention,
    SelfAttention,
    causal_mask,
    scaled_dot_product_attention,
    simple_attention,
)
from llmcourse.nn.attention import softmax_stable

X6 = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                   [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])


def seed123_weights():
    torch.manual_seed(123)
    return [nn.Parameter(torch.rand(3, 2), requires_grad=False) for _ in range(3)]


def test_softmax_stable_matches_torch_and_f03_1():
    for shape, dim in [((4, 7), -1), ((2, 3, 5), 1), ((5, 3), 0)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(softmax_stable(x, dim), torch.softmax(x, dim), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(softmax_stable(torch.tensor([1.0, 2, 3, 6])),
                               torch.tensor([0.0063, 0.0170, 0.0463, 0.9304]), atol=1e-4, rtol=0)
    torch.testing.assert_close(softmax_stable(torch.tensor([1000.0, 1001.0])), torch.tensor([0.2689, 0.7311]),
                               atol=1e-4, rtol=0)
    assert torch.isnan(softmax_stable(torch.full((3,), float("-inf")))).all()
    torch.testing.assert_close(softmax_stable(torch.full((4,), -1e9)), torch.full((4,), 0.25))


def test_simple_attention_f03_2():
    ctx, w = simple_attention(X6)
    torch.testing.assert_close(w[1], torch.tensor([0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]), atol=1e-4, rtol=0)
    torch.testing.assert_close(ctx[0], torch.tensor([0.4421, 0.5931, 0.5790]), atol=1e-4, rtol=0)


def test_f03_3_recipe_and_worked_example():
    wq, wk, wv = seed123_weights()
    torch.testing.assert_close(wq.data, torch.tensor([[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]]),
                               atol=1e-4, rtol=0)
    q, k, v = X6 @ wq, X6 @ wk, X6 @ wv
    torch.testing.assert_close((q @ k.T)[1], torch.tensor([1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440]),
                               atol=1e-4, rtol=0)
    ctx, w = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(ctx[0], torch.tensor([0.2996, 0.8053]), atol=1e-4, rtol=0)
    torch.testing.assert_close(w[1], torch.tensor([0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape_q,shape_k,dv", [((5, 4), (5, 4), 4), ((3, 4, 8), (3, 6, 8), 5), ((2, 3, 5, 8), (2, 3, 7, 8), 6)])
def test_sdpa_matches_torch_builtin(shape_q, shape_k, dv):
    q, k = torch.randn(*shape_q), torch.randn(*shape_k)
    v = torch.randn(*shape_k[:-1], dv)
    mask = causal_mask(shape_q[-2], shape_k[-2])
    for m in (None, mask):
        ctx, w = scaled_dot_product_attention(q, k, v, mask=m)
        torch.testing.assert_close(ctx, F.scaled_dot_product_attention(q, k, v, attn_mask=m), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_f03_4_causal_fixture_and_f03_5_masking_variants():
    wq, wk, wv = seed123_weights()
    m = CausalSelfAttention(3, 2, 6).eval()
    m.load_state_dict({"W_query.weight": wq.T, "W_key.weight": wk.T, "W_value.weight": wv.T})
    out = m(X6.unsqueeze(0))[0]
    torch.testing.assert_close(out[1], torch.tensor([0.3116, 0.9549]), atol=1e-4, rtol=0)
    torch.testing.assert_close(m.last_weights[0, 2], torch.tensor([0.2526, 0.3791, 0.3683, 0, 0, 0]), atol=1e-4, rtol=0)
    q, k = X6 @ wq, X6 @ wk
    scores = q @ k.T / math.sqrt(2)
    mask = causal_mask(6)
    zeroed = torch.softmax(scores, -1).masked_fill(~mask, 0)
    torch.testing.assert_close(zeroed.sum(-1), torch.tensor([0.1551, 0.3764, 0.5952, 0.7024, 0.8248, 1.0]), atol=1e-4, rtol=0)
    renorm = zeroed / zeroed.sum(-1, keepdim=True)
    assert (renorm - m.last_weights[0]).abs().max() < 1e-6
    zero_fill = torch.softmax(scores.masked_fill(~mask, 0.0), -1)
    torch.testing.assert_close(zero_fill[0], torch.tensor([0.2775, 0.1445, 0.1445, 0.1445, 0.1445, 0.1445]), atol=1e-4, rtol=0)


def test_causal_self_attention_contract():
    m = CausalSelfAttention(8, 4, context_length=10, dropout=0.5)
    assert set(m.state_dict()) == {"W_query.weight", "W_key.weight", "W_value.weight"}
    assert m.mask.dtype == torch.bool and "mask" in dict(m.named_buffers())
    with pytest.raises(ValueError, match="context_length"):
        m(torch.randn(1, 11, 8))
    m.eval()
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(m(x), m(x))
    x2 = x.clone()
    x2[:, 4:] = 0
    torch.testing.assert_close(m(x2)[:, :4], m(x)[:, :4])


def test_self_attention_scales_by_its_own_width():
    torch.manual_seed(0)
    m = SelfAttention(3, 5)
    x = torch.randn(4, 3)
    q, k, v = m.W_query(x), m.W_key(x), m.W_value(x)
    expected = torch.softmax(q @ k.T / math.sqrt(5), -1) @ v
    torch.testing.assert_close(m(x), expected)


def test_causal_mask_convention():
    assert causal_mask(3, 5).tolist() == [[True, True, True, False, False], [True, True, True, True, False],
                                          [True, True, True, True, True]]
    assert causal_mask(1, 5).all()
    for t_q, t_k, off in [(4, 4, None), (3, 7, 1), (5, 5, 2)]:
        expected = torch.ones(t_q, t_k).tril(t_k - t_q if off is None else off).bool()
        assert torch.equal(causal_mask(t_q, t_k, off), expected)


@pytest.mark.parametrize("module_exercise", ["03.SelfAttention", "03.CausalSelfAttention"])
def test_a_wrong_attention_function_costs_only_its_own_exercise(module_exercise):
    """One mistake costs one exercise: the modules are graded on the course's scaled_dot_product_attention, so a
    learner whose function scales after the softmax (and whose modules call it) loses that exercise only."""
    from grader.runner import run_check
    from tests.redteam.edits import edited, solution_def

    wrong = edited("03", "scaled_dot_product_attention",
                   ("weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores * math.sqrt(d_k), dim=-1) / math.sqrt(d_k)"))
    sources = ["import math\nimport torch\nfrom torch import nn\n", wrong,
               solution_def("03", "SelfAttention"), solution_def("03", "CausalSelfAttention")]
    assert run_check("03.scaled_dot_product_attention", sources).status == "failed"
    v = run_check(module_exercise, sources)
    assert v.status == "passed", v.render()
