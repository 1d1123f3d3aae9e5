"""The widget declarations the browser tests rely on (no browser needed: runs in the fast suite too)."""

from __future__ import annotations

import nbformat
import pytest
from widget_ids import css_class, declared_widgets, widget_registry


def test_registry_finds_the_unit03_widgets_of_the_syllabus():
    reg = widget_registry()
    # syllabus unit 03: W03.1 attention lab ... W03.5 dropout on weights (+ W03.6 sentence attention map)
    assert {"W03.1", "W03.2", "W03.3", "W03.4", "W03.5"} <= set(reg.values()), reg
    assert reg["show_attention_lab"] == "W03.1"
    assert len(set(reg.values())) == len(reg), f"two show_* functions claim one widget id: {reg}"
    for name, wid in reg.items():
        assert name.startswith("show_") and wid[0] == "W" and wid[1:3].isdigit(), (name, wid)


def test_declared_widgets_reads_calls_and_honours_static_true():
    reg = {"show_a": "W09.1", "show_b": "W09.2", "show_c": "W09.3"}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("show_c() in prose does not count"),
        nbformat.v4.new_code_cell("%matplotlib inline\nfrom llmcourse import viz\nviz.show_a(x=1)"),
        nbformat.v4.new_code_cell("show_b()\nshow_b(static=False)"),
        nbformat.v4.new_code_cell("show_c(static=True)  # the lesson asks for the static figure"),
        nbformat.v4.new_code_cell("!echo not python\nshow_unknown()"),
    ])
    assert declared_widgets(nb, reg) == {"W09.1": 1, "W09.2": 2}


def test_css_class_matches_the_viz_convention():
    assert css_class("W03.6") == "llmcourse-w03-6"


def test_every_available_lesson_parses(unit, course):  # `unit`: every available unit (tests/conftest.py)
    path = course.root / unit.lesson
    if not path.exists():
        pytest.skip(f"{unit.lesson} not built yet")
    declared_widgets(path)  # raises SyntaxError for a cell that is not Python
