"""The instructor's class report (coursetools/report.py) in Chromium, offline: its plots render (their pixels are
on the screen, in the report's colours), nothing is requested but the page itself, its tables sort; a full-page
screenshot goes to test-artifacts/class-report.png (docs/classroom.md shows it)."""

from __future__ import annotations

import io
import json
import random

from jlab import ARTIFACTS

EXERCISES = (("11.rms_norm", 2), ("11.swiglu", 2), ("11.rope", 3), ("11.grouped_query_attention", 3))
MISTAKES = {"11.rms_norm": ("rms_eps_outside", "lesson 11 §2 RMSNorm"),
            "11.rope": ("rope_theta", "lesson 11 §5 RoPE in code")}


def _record(n: int = 24) -> dict:
    """``n`` students of one assignment, seeded: passes, named and unnamed failures, stubs and an error."""
    rng = random.Random(0)
    subs = []
    for i in range(n):
        exercises = []
        for ex_id, pts in EXERCISES:
            kind = rng.choice(["passed", "passed", "failed", "not_attempted", "named"])
            if i == 0:
                kind = "error"
            mistake, section = MISTAKES.get(ex_id, (None, None)) if kind == "named" else (None, None)
            status = "failed" if kind == "named" else kind
            exercises.append({"id": ex_id, "points": float(pts if status == "passed" else 0), "max_points": float(pts),
                              "status": status, "mistake": mistake, "section": section,
                              "hint": f"the hint of {mistake}" if mistake else None,
                              "message": "no verdict" if status == "error" else f"a property broke at {i}.5"})
        subs.append({"student": f"student{i + 1:03d}", "assignment": "11_llama3",
                     "score": sum(e["points"] for e in exercises), "max_score": 10.0,
                     "notes": "a cell timed out" if i == 0 else "", "exercises": exercises})
    return {"submissions": subs, "tampering": []}


def _colour_share(png: bytes, rgb: tuple[int, int, int]) -> float:
    import numpy as np
    from PIL import Image

    px = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
    return float((np.abs(px - np.array(rgb, dtype=np.int16)).max(axis=-1) <= 6).mean())


def test_the_report_renders_its_plots_offline(browser, tmp_path, shots):
    from coursetools.report import KIND_COLORS, RECORD_NAME, write_report

    (tmp_path / RECORD_NAME).write_text(json.dumps(_record()), encoding="utf-8")
    page_path = write_report(tmp_path)["html"]
    ctx = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
    requested = []

    def route(r):
        requested.append(r.request.url)
        return r.continue_() if r.request.url.startswith("file://") else r.abort()

    ctx.route("**/*", route)
    page = ctx.new_page()
    shots.watch(page, "report")
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_path.as_uri())
    page.wait_for_load_state("load")
    assert requested == [page_path.as_uri()], requested  # nothing but the page itself
    assert not errors, errors

    plots = page.locator("figure.plot")
    assert [plots.nth(i).get_attribute("data-plot") for i in range(plots.count())] == ["scores", "mistakes", "heat"]
    for i in range(plots.count()):
        box = plots.nth(i).locator("svg").bounding_box()
        assert box and box["width"] > 200 and box["height"] > 100, (i, box)
    # drawn, not just present: the heat map's pixels carry the passed and named-mistake colours, the ranking's bars
    # the named-mistake colour, and the ranking names the mistakes as text
    heat = plots.nth(2).screenshot()
    for kind in ("passed", "failed, named", "not attempted"):
        rgb = tuple(int(KIND_COLORS[kind][j:j + 2], 16) for j in (1, 3, 5))
        assert _colour_share(heat, rgb) > 0.01, kind
    ranked = plots.nth(1)
    assert _colour_share(ranked.screenshot(), (0xd6, 0x60, 0x4d)) > 0.02
    assert "rms_eps_outside" in ranked.inner_text() or "rms_eps_outside" in ranked.inner_html()
    assert "lesson 11 §2 RMSNorm" in page.locator("table").nth(1).inner_text()

    # the heat table sorts by a column head
    table = page.locator("table.heat")
    names = [f"student{i + 1:03d}" for i in range(24)]

    def column():
        return [table.locator("tr").nth(k).locator("td").first.inner_text() for k in range(1, 25)]

    assert column() == names
    table.locator("th").first.click()
    table.locator("th").first.click()  # the second click: descending
    assert column() == names[::-1]

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "class-report.png"), full_page=True)
    ctx.close()
