"""nbgrader's Formgrader and a feedback page, in the browser, on a course graded with the course's own tools.

A temporary class with one submission is graded by :func:`coursetools.grading.grade` (the work root it
creates holds ``solutions/``, ``exercises/``, ``.grading/{submitted,autograded,feedback,gradebook.db}`` and
an ``nbgrader_config.py`` that loads ``grader/nbgrader_config.py``). The submission is unit 03's released
exercise with every stub filled from the solution, except ``scaled_dot_product_attention`` without the
``1/√d_k`` scale (bug B03.no_scale), so its feedback has failures to show.

JupyterLab is started in that work root with ``LLMCOURSE_NBGRADER_ROOT`` set, as an instructor would.
The Formgrader must list the assignment and the submission with its score; the feedback page must show
the diagnosis and no hidden-check source.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import nbformat
import pytest
from jlab import ARTIFACTS, ROOT, LabServer, open_tab

from coursetools.grading import grade
from llmcourse.manifest import load_course

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STUDENT = "ada"
LEAKS = ("BEGIN HIDDEN TESTS", "from grader import", "grader/checks", "def check_")


def _answers(solution) -> dict[str, str]:
    out = {}
    for c in solution.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("solution"):
            out[meta["grade_id"]] = "\n".join(ln for ln in c.source.splitlines()
                                              if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
    return out


@pytest.fixture(scope="module")
def graded(browser, tmp_path_factory):
    """(work root, unit, report): one autograded submission of unit 03 with feedback."""
    course = load_course(ROOT)
    unit = course.unit("03")
    if not unit.available:
        pytest.skip("unit 03 is not available in course.toml")
    exercise = nbformat.read(str(ROOT / unit.exercise), as_version=4)
    answers = _answers(nbformat.read(str(ROOT / unit.solution), as_version=4))
    sdpa = "ex03_scaled_dot_product_attention_answer"
    no_scale = answers[sdpa].replace(" / math.sqrt(d_k)", "")
    assert no_scale != answers[sdpa], "the reference scaled_dot_product_attention changed: update this test"
    answers[sdpa] = no_scale
    nb = copy.deepcopy(exercise)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = answers[meta["grade_id"]]
    submitted = tmp_path_factory.mktemp("class") / "submitted"
    folder = submitted / STUDENT / unit.name
    folder.mkdir(parents=True)
    nbformat.write(nb, str(folder / Path(unit.exercise).name))
    work = tmp_path_factory.mktemp("grading") / "work"
    report = grade(submitted, out_dir=work, cell_timeout=120)
    assert [r["student"] for r in report.rows] == [STUDENT], report.render()
    return work, unit, report


@pytest.fixture(scope="module")
def formgrader_lab(graded):
    work, _, _ = graded
    env = {"LLMCOURSE_NBGRADER_ROOT": str(work)}
    if os.environ.get("LLMCOURSE_DATA_MIRROR"):
        env["LLMCOURSE_DATA_MIRROR"] = os.environ["LLMCOURSE_DATA_MIRROR"]
    # cwd = the work root: nbgrader (and so the formgrader) reads nbgrader_config.py from there
    server = LabServer(work, cwd=work, env=env, allow_hidden=True, name="formgrader").start()
    try:
        yield server
    finally:
        server.stop()


def _columns(page) -> list[str]:
    return [" ".join(t.split()) for t in page.locator("thead th").all_inner_texts()]


def _row(page, row) -> dict[str, str]:
    """A formgrader table row as ``{column header: cell text}``."""
    cells = [" ".join(t.replace("\u00a0", " ").split()) for t in row.locator("td").all_inner_texts()]
    return dict(zip(_columns(page), cells))


@pytest.fixture
def tab(browser):
    t = open_tab(browser)
    yield t
    t.close()


@pytest.mark.timeout(600)
def test_formgrader_lists_the_assignment_and_the_submission(graded, formgrader_lab, tab, shots):
    work, unit, report = graded
    page = tab.page
    shots.watch(page, "formgrader")
    score = report.rows[0]["score"]
    # no_scale fails scaled_dot_product_attention (5 of 20) only: the modules built on it are graded on the course's
    # function (one mistake costs one exercise)
    assert score == unit.points - 5, report.render()

    page.goto(f"{formgrader_lab.url}/formgrader/manage_assignments")
    row = page.locator("tbody tr", has_text=unit.name).first
    row.wait_for(state="visible", timeout=60_000)
    assignment = _row(page, row)
    assert assignment.get("Name") == unit.name, assignment
    assert assignment.get("# Submissions") == "1", f"the formgrader should count 1 submission: {assignment}"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "formgrader-assignments.png"))

    # follow the submission count's link, as an instructor does
    row.locator("td").nth(_columns(page).index("# Submissions")).locator("a").click()
    page.wait_for_url(f"**/formgrader/manage_submissions/{unit.name}**")
    sub = page.locator("tbody tr", has_text=STUDENT).first
    sub.wait_for(state="visible", timeout=60_000)
    submission = _row(page, sub)
    assert submission.get("Student ID") == STUDENT, submission
    assert submission.get("Status") == "graded", submission
    assert submission.get("Score") == f"{score:g} / {unit.points:g}", submission
    page.screenshot(path=str(ARTIFACTS / "formgrader-submissions.png"))
    assert not tab.errors(), "JavaScript console errors:\n" + "\n".join(tab.errors())


@pytest.mark.timeout(300)
def test_feedback_page_shows_the_diagnosis_and_no_hidden_checks(graded, formgrader_lab, tab, shots):
    work, unit, report = graded
    score = report.rows[0]["score"]
    page = tab.page
    shots.watch(page, "feedback")
    rel = f".grading/feedback/{STUDENT}/{unit.name}/{Path(unit.exercise).stem}.html"
    assert (work / rel).exists(), f"grade() wrote no feedback at {rel}"
    # as when a link in JupyterLab is followed (jupyter_server serves /files/ to same-site requests only)
    response = page.goto(f"{formgrader_lab.url}/files/{rel}", referer=f"{formgrader_lab.url}/lab")
    assert response is not None and response.ok, f"GET /files/{rel}: {response.status if response else None}"
    page.wait_for_load_state("load")
    html = page.content()
    shown = page.locator("body").inner_text()
    for leak in LEAKS:
        assert leak not in html, f"the feedback page's HTML contains hidden-check source {leak!r}"
        assert leak not in shown, f"the feedback page shows hidden-check source {leak!r}"
    assert "no_scale" in shown, "the feedback should name the diagnosed mistake no_scale"
    assert "B03." not in shown, "the feedback shows an internal bug id"
    assert f"{unit.name} (Score: {score:.1f} / {unit.points:.1f})" in shown, shown[:300]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "feedback-03.png"), full_page=True)
