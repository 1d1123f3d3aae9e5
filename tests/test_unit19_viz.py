"""Unit 19 widget W19.1 (GRPO dashboard): the series it plots, the static fallback and the live build."""

from __future__ import annotations

import numpy as np
import pytest

from llmcourse.viz import post as viz
from llmcourse.viz.base import StaticFigure, css_class

HISTORY = [dict(reward=0.1 * i, accuracy=0.05 * i, length=3.0 + i % 2, kl=0.01 * i, loss=0.0) for i in range(6)]
HISTORY[2]["test_accuracy"] = 0.5
HISTORY[5]["test_accuracy"] = 0.6


def test_series_by_hand():
    s = viz.grpo_series(HISTORY, window=2)
    assert s["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert s["reward"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    # trailing mean over 2 iterations (the first averages itself)
    assert s["kl_smooth"] == pytest.approx([0.0, 0.005, 0.015, 0.025, 0.035, 0.045])
    assert s["test_step"].tolist() == [3, 6] and s["test_accuracy"] == pytest.approx([0.5, 0.6])
    empty = viz.grpo_series([])
    assert empty["step"].size == 0 and empty["test_accuracy"].size == 0
    with pytest.raises(KeyError):
        viz.grpo_series([{"reward": 1.0}])


def test_static_fallback_and_figure():
    fig = viz.draw_grpo_dashboard(HISTORY, window=3, acc_sft=0.4)
    assert len(fig.axes) == 4
    lines = fig.axes[1].get_lines()
    assert any(len(line.get_ydata()) == 2 and np.allclose(line.get_ydata(), [0.5, 0.6]) for line in lines)
    assert viz.draw_grpo_dashboard([]) is not None                                 # before the first iteration
    shown = viz.show_grpo_dashboard(HISTORY, acc_sft=0.4, static=True)
    assert isinstance(shown, StaticFigure) and shown.widget_id == "W19.1"
    assert 'data-widget="W19.1"' in shown._repr_html_()
    assert viz.make_grpo_dashboard(10, static=True) == (None, None)


def test_live_builds():
    pytest.importorskip("ipywidgets")
    box = viz.show_grpo_dashboard(HISTORY, static=False)
    assert css_class("W19.1") in box._dom_classes
    live, callback = viz.make_grpo_dashboard(6, acc_sft=0.4, static=False)
    callback(HISTORY[:3])
    assert "iteration 3 / 6" in live.children[0].value and css_class("W19.1") in live._dom_classes
