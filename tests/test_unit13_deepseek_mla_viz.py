"""Unit 13 widgets: compute functions against independent routes, and every static fallback renders."""

from __future__ import annotations

import pytest

from llmcourse.viz import mla as V


def test_flow_shapes_of_deepseek_v3():
    info = V.mla_flow_shapes()
    assert info["cached"] == 576 and info["shapes"]["keys"] == (128, 192) and info["shapes"]["out"] == (16384,)
    assert info["mha_equivalent"] == 128 * (192 + 128)


def test_cache_comparison_numbers():
    r = V.cache_comparison("DeepSeek-V3", 131072)
    assert r["per_token"][0] == 2_498_560 and r["per_token"][3] == 35_136
    assert round(r["bytes"][3] / 2**30, 2) == 8.58 and round(r["bytes"][0] / 2**30) == 610
    assert r["gqa_groups_equal_to_mla"] == 576 / 320
    tiny = V.cache_comparison("course tiny models", 1)
    assert tiny["per_token"] == [1024, 512, 256, 320]


def test_decode_macs_by_hand_and_growth():
    c = V.decode_macs(0, 4, 2, 3, 5)
    assert c["naive"] == 4 * 5 + 4 * 6 + 2 * 1 * 5 * 6 + 2 * 1 * 6 + 6 * 4
    assert c["absorbed"] == 4 * 5 + 4 * 2 * 5 + 2 * 1 * 2 * 5 + 2 * 5 * 4
    big = V.decode_macs(4096, 128, 4, 32, 64)
    assert big["naive"] > 10 * big["absorbed"]


def test_absorption_errors_separate_the_correct_and_the_wrong_form():
    e = V.absorption_errors()
    assert e["absorbed"] < 1e-10 and e["head-split bug"] > 1.0


def test_rope_changes_the_absorbed_matrix_but_offset_zero_does_not():
    r = V.rope_absorption([0, 1, 5])
    assert r["change"][0] == pytest.approx(0.0, abs=1e-12)
    assert r["change"][1] > 1e-3 and r["change"][2] > 1e-3


@pytest.mark.parametrize("show", [V.show_mla_flow, V.show_cache_comparison, V.show_absorption_check,
                                  V.show_rope_absorption])
def test_static_fallbacks_render(show):
    fig = show(static=True)
    assert fig._repr_png_()[:4] == b"\x89PNG"
    assert "llmcourse-static" in fig._repr_html_()


@pytest.mark.parametrize("show", [V.show_mla_flow, V.show_cache_comparison, V.show_absorption_check,
                                  V.show_rope_absorption])
def test_live_widgets_build(show):
    w = show(static=False)
    assert "llmcourse-widget" in w._dom_classes
