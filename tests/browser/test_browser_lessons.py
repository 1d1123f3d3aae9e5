"""Every available lesson in real JupyterLab: runs clean, its live widgets render and react.

1. ``test_lesson_runs_and_its_widgets_render``: open the lesson (a copy), Run > Run All Cells, then: no
   error output (except in cells tagged ``raises-exception``), no JavaScript console error, every widget
   the lesson shows (see :mod:`widget_ids`) rendered live (``.llmcourse-widget.llmcourse-wNN-k``), and no
   static fallback (``.llmcourse-static``). Screenshots of the lesson and of each widget go to
   ``test-artifacts/`` (always for this test, so a reviewer can look at them).
2. ``test_attention_map_reacts_to_its_controls``: in unit 03's lesson, untick W03.6's causal mask and move
   its temperature; each change must redraw the attention map (the PNG shown changes). W03.1's causal
   toggle likewise.

These runs are the lessons' execution test in ``make test``: each notebook that passed here is listed, with the
kernel time JupyterLab recorded for its cells, in ``test-artifacts/browser-lessons.json`` (:func:`record_run`),
and the nbval step of ``make test`` then leaves it out (the root ``conftest.py``). Lessons run ``PARALLEL`` at
a time, so their times here are inflated; the ci cap is checked on sequential runs (see conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass

import pytest
from jlab import (
    ARTIFACTS,
    ROOT,
    Tab,
    execution_time,
    mark_cells,
    menu,
    open_notebook,
    open_tab,
    save,
    wait_until_done,
)
from widget_ids import css_class, declared_widgets

from llmcourse.manifest import load_course

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COURSE = load_course(ROOT)
# lessons whose live page later tests of this module use: kept open after test 1 (others are closed)
INTERACTIVE = {"03"}
WIDGET_CLASS = re.compile(r"^llmcourse-(w\d\d-\d+)$")


@dataclass
class LessonRun:
    unit_id: str
    path: str
    tab: Tab
    state: dict
    cells: list[dict]
    started: float = 0.0  # time.monotonic() when Run All Cells was clicked
    wall_s: float = 0.0  # from then until the run was seen done (other lessons ran meanwhile)


@pytest.fixture(scope="module")
def lesson_runs(lab):
    runs: dict[str, LessonRun] = {}
    yield runs
    for run in runs.values():
        run.tab.close()
        lab.shutdown_notebook(run.path)


# Lessons running at once. Each lesson runs in its own browser context and kernel; while a test waits on
# its lesson, the next one already runs, so page loads, rendering and polling overlap with computation.
PARALLEL = max(1, int(os.environ.get("LLMCOURSE_BROWSER_PARALLEL", "3")))


def _start_lesson(browser, lab, unit, runs: dict) -> LessonRun:
    """Open the unit's lesson in a new tab and start Run > Run All Cells (does not wait)."""
    tab = open_tab(browser)
    run = LessonRun(unit.id, unit.lesson, tab, {}, [])
    runs[unit.id] = run  # closed by the fixture even when something below fails
    open_notebook(tab.page, lab, unit.lesson, workspace=f"lesson{unit.id}")
    run.cells = mark_cells(tab.page, unit.lesson)
    run.started = time.monotonic()
    menu(tab.page, "Run", "Run All Cells")
    return run


# Notebooks that ran clean in this session's browser, with their times: read by the root conftest.py, whose
# nbval step in `make test` then does not execute them a second time (the Makefile removes the file first).
LESSON_RECORD = ARTIFACTS / "browser-lessons.json"
_RECORDED: dict[str, dict] = {}


def record_run(run: LessonRun) -> None:
    """List ``run.path`` in :data:`LESSON_RECORD` as executed here (call it only once every assertion passed)."""
    timing = execution_time(run.tab.page, run.path)
    # no cell timed (recordTiming not honoured?): the run's wall time stands in, and the record says so
    seconds, source = (timing["kernel_s"], "kernel") if timing["cells"] else (run.wall_s, "wall")
    _RECORDED[run.path] = {"kernel_s": round(seconds, 2), "source": source, "wall_s": round(run.wall_s, 2),
                           "cells": timing["cells"], "untimed_cells": timing["untimed"]}
    ARTIFACTS.mkdir(exist_ok=True)
    LESSON_RECORD.write_text(json.dumps(
        {"profile": "ci", "parallel": PARALLEL, "cpus": os.cpu_count(), "notebooks": _RECORDED}, indent=1))


def run_lesson(browser, lab, unit, runs: dict, shots) -> LessonRun:
    """The unit's lesson, run to the end (once per module: reused by later tests).

    Also starts the next ``PARALLEL - 1`` lessons (course order) so that they run while this one is awaited.
    """
    if unit.id in runs and runs[unit.id].state:
        shots.watch(runs[unit.id].tab.page, unit.name)
        return runs[unit.id]
    if not (ROOT / unit.lesson).exists():
        pytest.fail(f"course.toml marks unit {unit.id} available but {unit.lesson} does not exist")
    if unit.id not in runs:
        _start_lesson(browser, lab, unit, runs)
    order = [u for u in COURSE.available_units if (ROOT / u.lesson).exists()]
    ids = [u.id for u in order]
    if unit.id in ids:
        for nxt in order[ids.index(unit.id) + 1: ids.index(unit.id) + PARALLEL]:
            if nxt.id not in runs:
                _start_lesson(browser, lab, nxt, runs)
    run = runs[unit.id]
    shots.watch(run.tab.page, unit.name)  # photographed if anything below fails
    budget = max(240.0, 8 * 60 * float(unit.minutes.get("ci", 1)))
    run.state = wait_until_done(run.tab.page, run.path, timeout=budget * PARALLEL)
    run.wall_s = time.monotonic() - run.started
    return run


def assert_ran_clean(run: LessonRun) -> None:
    """Every non-empty code cell ran, and none raised (unless tagged raises-exception)."""
    errors = [e for e in run.state["errors"] if "raises-exception" not in e["tags"]]
    assert not errors, f"{run.path}: cells raised errors:\n" + "\n".join(
        f"  cell {e['index']}: {e['ename']}: {e['evalue']}\n    {e['source'][:200]!r}" for e in errors)
    assert not run.state["unexecuted"], (f"{run.path}: code cells {run.state['unexecuted']} were not executed by "
                                         f"Run All Cells (an earlier cell stopped the run?)")


def live_widgets_in_page(page) -> dict[str, int]:
    """``{"W03.6": 1, ...}``: live widgets in the DOM, by their ``llmcourse-wNN-k`` class."""
    classes = page.evaluate("""() => Array.from(document.querySelectorAll('.llmcourse-widget'))
                                 .map(e => Array.from(e.classList))""")
    found: dict[str, int] = {}
    for cls in classes:
        for c in cls:
            m = WIDGET_CLASS.match(c)
            if m:
                nn, k = m.group(1)[1:].split("-")
                wid = f"W{nn}.{k}"
                found[wid] = found.get(wid, 0) + 1
    return found


@pytest.mark.timeout(900)
def test_lesson_runs_and_its_widgets_render(browser, lab, lesson_runs, shots, unit):
    """``unit``: every available unit of course.toml (parametrized by tests/conftest.py)."""
    declared = declared_widgets(ROOT / unit.lesson) if (ROOT / unit.lesson).exists() else {}
    run = run_lesson(browser, lab, unit, lesson_runs, shots)
    page = run.tab.page

    # 1. every non-empty code cell ran, and none raised (unless tagged raises-exception)
    assert_ran_clean(run)

    # 2. every declared widget rendered live; no static fallback
    for wid, calls in sorted(declared.items()):
        widget = page.locator(f".llmcourse-widget.{css_class(wid)}")
        assert widget.count() >= calls, (
            f"{unit.lesson}: widget {wid} ({calls} show_* call(s)) rendered {widget.count()} time(s) live; "
            f"expected a DOM element with classes llmcourse-widget {css_class(wid)}")
        first = widget.first
        first.scroll_into_view_if_needed()
        box = first.bounding_box()
        assert box and box["width"] > 50 and box["height"] > 50, f"{wid} rendered with no size: {box}"
    live = live_widgets_in_page(page)
    assert set(live) == set(declared), (f"{unit.lesson}: live widgets in the page {sorted(live)} differ from the "
                                        f"widgets the lesson shows {sorted(declared)}")
    statics = page.locator(".llmcourse-static")
    assert statics.count() == 0, (f"{unit.lesson}: {statics.count()} static fallback(s) shown although "
                                  "LLMCOURSE_WIDGETS=live: " + ", ".join(
                                      statics.nth(i).get_attribute("data-widget") or "?"
                                      for i in range(statics.count())))
    text = page.locator(".jp-Notebook").inner_text()
    for broken in ("Error displaying widget", "Error rendering output item", "Loading widget..."):
        assert broken not in text, f"{unit.lesson}: the page shows {broken!r}"

    # 3. no JavaScript errors while the lesson loaded, ran and rendered its widgets
    assert not run.tab.errors(), f"{unit.lesson}: JavaScript console errors:\n" + "\n".join(run.tab.errors())

    # screenshots for a reviewer: the lesson's end and every widget
    save(page, run.path)  # the executed copy (temporary) keeps outputs; handy when debugging locally
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"lesson-{unit.name}.png"))
    for wid in sorted(live):
        page.locator(f".llmcourse-widget.{css_class(wid)}").first.screenshot(
            path=str(ARTIFACTS / f"lesson-{unit.name}-{wid}.png"))
    record_run(run)

    if unit.id not in INTERACTIVE:  # free the kernel's memory and CPU for the next lesson
        lesson_runs.pop(unit.id).tab.close()
        lab.shutdown_notebook(run.path)


def _img_src(page, selector: str) -> str:
    return page.evaluate("(sel) => { const i = document.querySelector(sel); return i ? i.src : ''; }", selector)


def _wait_new_image(page, selector: str, old: str, what: str, timeout: float = 60) -> str:
    try:
        page.wait_for_function(
            "([sel, old]) => { const i = document.querySelector(sel);"
            " return !!i && i.complete && i.naturalWidth > 0 && i.src.startsWith('data:image/png') && i.src !== old; }",
            arg=[selector, old], timeout=timeout * 1000, polling=200)
    except Exception as exc:
        raise AssertionError(f"{what}: the attention map was not redrawn within {timeout:.0f} s "
                             f"({selector} kept the same image)") from exc
    return _img_src(page, selector)


@pytest.mark.timeout(900)
def test_attention_map_reacts_to_its_controls(browser, lab, lesson_runs, shots):
    unit = COURSE.unit("03")
    if not unit.available:
        pytest.skip("unit 03 is not available in course.toml")
    # W03.6 shows the trained model of the unit's lab when the training lives there: run that notebook
    notebooks = [nb for nb in (unit.lesson, *unit.extra_lessons) if (ROOT / nb).exists()]
    target = next((nb for nb in notebooks if "W03.6" in declared_widgets(ROOT / nb)), None)
    if target is None:
        pytest.fail(f"no notebook of unit 03 ({notebooks}) shows widget W03.6 (show_sentence_attention); "
                    f"the test needs it")
    declared = declared_widgets(ROOT / target)
    if target != unit.lesson:
        unit = dataclasses.replace(unit, id=f"{unit.id}-lab", lesson=target)
    run = run_lesson(browser, lab, unit, lesson_runs, shots)
    assert_ran_clean(run)
    page = run.tab.page
    errors_before = len(run.tab.errors())

    box = f".llmcourse-widget.{css_class('W03.6')}"
    img = f"{box} img"
    widget = page.locator(box).first
    widget.scroll_into_view_if_needed()
    first = _img_src(page, img)
    assert first.startswith("data:image/png"), f"W03.6 shows no PNG attention map (img src {first[:40]!r})"

    # untick the causal mask: the upper triangle fills in
    causal = page.locator(f"{box} .llmcourse-causal input[type=checkbox]")
    assert causal.is_checked(), "W03.6 should start with the causal mask on"
    causal.click()
    assert not causal.is_checked()
    no_mask = _wait_new_image(page, img, first, "unticking 'causal mask'")

    # move the temperature: type 0.3 into the slider's readout (what a person does for an exact value)
    readout = page.locator(f"{box} .llmcourse-temperature .widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("0.3")
    page.keyboard.press("Enter")
    sharp = _wait_new_image(page, img, no_mask, "temperature 1 -> 0.3")
    assert readout.inner_text().strip() in {"0.3", "0.30"}, f"temperature readout shows {readout.inner_text()!r}"

    # back to the start: causal again at temperature 1 gives the first picture back (a pure function of the
    # controls), so the image depends on the controls and on nothing else
    causal.click()
    after_causal = _wait_new_image(page, img, sharp, "ticking 'causal mask' again")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("1")
    page.keyboard.press("Enter")
    back = _wait_new_image(page, img, after_causal, "temperature 0.3 -> 1")
    assert back == first, "causal mask on at temperature 1 should redraw the original attention map"
    widget.screenshot(path=str(ARTIFACTS / "W03.6-controls.png"))

    # W03.1 (attention lab): its causal toggle redraws the weight heatmap too
    if "W03.1" in declared:
        lab_box = f".llmcourse-widget.{css_class('W03.1')}"
        page.locator(lab_box).first.scroll_into_view_if_needed()
        lab_img = f"{lab_box} img"
        before = _img_src(page, lab_img)
        assert before.startswith("data:image/png"), "W03.1 shows no PNG heatmap"
        toggle = page.locator(f"{lab_box} label", has_text="causal mask").locator("input[type=checkbox]")
        toggle.click()
        _wait_new_image(page, lab_img, before, "W03.1: toggling the causal mask")

    new_errors = run.tab.errors()[errors_before:]
    assert not new_errors, "JavaScript console errors while using the widgets:\n" + "\n".join(new_errors)
    record_run(run)
