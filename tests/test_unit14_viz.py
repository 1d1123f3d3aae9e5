"""Unit 14 widgets: compute functions checked against hand-made cases; every show_* has a static fallback."""

from __future__ import annotations

import math

import torch

from llmcourse.viz.moe import (
    draw_load_runs,
    expert_combinatorics,
    load_ratio_curves,
    routing_table,
    show_combinatorics,
    show_expert_loads,
    show_routing_explorer,
)

LOGITS = torch.logit(torch.tensor([[0.9, 0.8, 0.3, 0.2]]))


def test_routing_table_masks_groups_and_keeps_unbiased_weights():
    tab = routing_table(LOGITS, torch.tensor([-1.0, -1.0, -1.5, -1.5]), top_k=2, n_group=2, topk_group=1)
    assert tab["chosen"][0].tolist() == [True, True, False, False]
    assert tab["excluded"][0].tolist() == [False, False, True, True]
    torch.testing.assert_close(tab["weights"][0, :2], torch.tensor([0.9 / 1.7, 0.8 / 1.7]))
    # raising expert 3's bias changes the choice (one group) but not the chosen experts' score source
    tab2 = routing_table(LOGITS, torch.tensor([0.0, 0.0, 0.0, 1.0]), top_k=2)
    assert tab2["chosen"][0].tolist() == [True, False, False, True]
    torch.testing.assert_close(tab2["weights"][0, [0, 3]], torch.tensor([0.9 / 1.1, 0.2 / 1.1]))


def test_load_ratio_curves():
    loads = torch.tensor([[[4, 0, 0, 0]], [[1, 1, 1, 1]]])  # (steps 2, layers 1, E 4)
    cur = load_ratio_curves(loads, smooth=2)
    torch.testing.assert_close(cur["ratio"], torch.tensor([4.0, 1.0]))
    torch.testing.assert_close(cur["smoothed"], torch.tensor([4.0, 2.5]))
    torch.testing.assert_close(cur["share"][0, :, 1], torch.full((4,), 0.25))


def test_combinatorics_matches_binomials_and_keeps_compute():
    a = expert_combinatorics(16, 2, 1, intermediate=512)
    b = expert_combinatorics(16, 2, 4, intermediate=512)
    assert a["combinations"] == 120 and b["combinations"] == 4_426_165_368 == math.comb(64, 8)
    assert a["active_params"] - 16 * 128 == b["active_params"] - 64 * 128  # equal apart from the router
    assert a["total_params"] - 16 * 128 == b["total_params"] - 64 * 128


def test_static_fallbacks():
    runs = {"a": torch.randint(0, 50, (20, 3, 8)), "b": torch.randint(0, 50, (20, 3, 8))}
    for w, wid in [(show_expert_loads(runs, static=True), "W14.2"), (show_combinatorics(static=True), "W14.3"),
                   (show_routing_explorer(torch.randn(6, 8), list("hello!"), static=True), "W14.1")]:
        assert w.widget_id == wid and w._repr_png_()[:4] == b"\x89PNG"
    assert draw_load_runs(runs, "b", 2) is not None


def test_live_widgets_build():
    runs = {"a": torch.randint(0, 50, (10, 2, 4))}
    for w in (show_expert_loads(runs, static=False), show_combinatorics(static=False),
              show_routing_explorer(torch.randn(5, 8), list("abcde"), static=False)):
        assert any(c.startswith("llmcourse-w14-") for c in w._dom_classes)


def test_shared_equivalence_sum_not_mean():
    from llmcourse.viz.moe import shared_equivalence, show_shared_equivalence

    r = shared_equivalence(3)
    assert r["sum"] < 1e-5 < r["mean"] and r["params_narrow"] == r["params_wide"] == 3 * 3 * 32 * 16
    assert shared_equivalence(1)["mean"] < 1e-5
    w = show_shared_equivalence(static=True)
    assert w.widget_id == "W14.4" and w._repr_png_()[:4] == b"\x89PNG"
    assert any(c == "llmcourse-w14-4" for c in show_shared_equivalence(static=False)._dom_classes)
