"""Unit 18 widget: the ring all-reduce animation's compute function and both renderings."""

from __future__ import annotations

import pytest
import torch

from llmcourse.viz.base import StaticFigure
from llmcourse.viz.parallel import draw_ring_step, ring_contributions, show_ring_all_reduce


@pytest.mark.parametrize("p", [2, 3, 5])
def test_ring_contributions_reach_every_rank(p):
    states = ring_contributions(p)
    assert len(states) == 2 * (p - 1) + 1
    assert torch.equal(states[0]["counts"], torch.ones(p, p, dtype=torch.long))
    assert torch.equal(states[-1]["counts"], torch.full((p, p), p))
    # after the reduce-scatter phase each rank owns one finished chunk, the next one along the ring
    mid = states[p - 1]["counts"]
    assert [int(mid[r, (r + 1) % p]) for r in range(p)] == [p] * p
    assert int((mid == p).sum()) == p
    # one chunk per rank and step: 2(p-1) chunks of n/p, i.e. 2(p-1)/p of the tensor
    assert states[-1]["sent_chunks"] == 2 * (p - 1)
    assert all(len(s["sends"]) == p and {d for _, d, _ in s["sends"]} == set(range(p)) for s in states[1:])


def test_ring_contributions_rejects_bad_sizes():
    with pytest.raises(ValueError):
        ring_contributions(1)


def test_static_and_live_renderings():
    static = show_ring_all_reduce(4, static=True)
    assert isinstance(static, StaticFigure) and static.widget_id == "W18.1"
    assert static._repr_png_().startswith(b"\x89PNG")
    assert draw_ring_step(3, step=99).axes        # clamped to the last step
    live = show_ring_all_reduce(3, static=False)
    assert "llmcourse-w18-1" in live._dom_classes
