"""The in-notebook check, and student vs instructor tools, in real JupyterLab.

* A student's JupyterLab (``make lab``: :data:`jlab.STUDENT_LAB_ARGS`) on a fresh copy of the course:
  unit 03's exercise gets one correct and one wrong answer, is saved with Ctrl+S, and its last cell
  (``llmcourse.check()``) is run: the rendered table shows exactly one passed exercise and names the
  wrong one's bug. The same lab has nbgrader's Validate button and Assignment List but none of its
  instructor plugins (Create Assignment sidebar, Formgrader, Course List).
* The instructor's JupyterLab (``make lab-instructor``, the plain server of the other browser tests)
  has them all.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest
from jlab import (
    ARTIFACTS,
    ROOT,
    STUDENT_LAB_ARGS,
    LabServer,
    js,
    mark_cells,
    open_notebook,
    open_tab,
    wait_until_done,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

UNIT_ID = "03"
INSTRUCTOR_PLUGINS = ["@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:formgrader",
                      "@jupyter/nbgrader:course-list"]
STUDENT_PLUGINS = ["@jupyter/nbgrader:validate-assignment", "@jupyter/nbgrader:assignment-list"]
# one correct answer and one known mistake (normalising over the queries: B03.softmax_dim), as in test_selfcheck.py
CORRECT = ("def softmax_stable(x, dim=-1):\n    shifted = x - x.amax(dim=dim, keepdim=True)\n    e = shifted.exp()\n"
           "    return e / e.sum(dim=dim, keepdim=True)\n")
WRONG = ("def simple_attention(x):\n    scores = x @ x.transpose(-2, -1)\n    w = torch.softmax(scores, dim=-2)\n"
         "    return w @ x, w\n")
INSTRUCTOR_COMMANDS = ["nbgrader:open-create-assignment", "nbgrader:open-formgrader", "nbgrader:open-course-list"]


def _student_copy(dest):
    """What a student opens here: exercises/, the course home and nbgrader's config (for Validate)."""
    shutil.copytree(ROOT / "exercises", dest / "exercises", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for rel in ("course_home.ipynb", "nbgrader_config.py", "grader/nbgrader_config.py"):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


@pytest.fixture(scope="module")
def student_lab(browser, tmp_path_factory):
    env = {"LLMCOURSE_DATA_MIRROR": os.environ["LLMCOURSE_DATA_MIRROR"]} if os.environ.get("LLMCOURSE_DATA_MIRROR") else {}
    copy = _student_copy(tmp_path_factory.mktemp("student-course"))
    server = LabServer(copy, env=env, name="student", extra_args=STUDENT_LAB_ARGS).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(copy, ignore_errors=True)


def _ui_state(page) -> dict:
    return page.evaluate("""() => {
      const app = window.jupyterapp;
      const ids = (w) => Array.from(w).map(x => x.title.label);
      return {plugins: app.listPlugins ? app.listPlugins() : [],
              activated: Object.fromEntries(app.listPlugins().map(p => [p, app.isPluginActivated(p)])),
              commands: app.commands.listCommands().filter(c => c.startsWith('nbgrader:')),
              right: ids(app.shell.widgets('right')), left: ids(app.shell.widgets('left'))};
    }""")


def _nbgrader_menu(page) -> list[str]:
    """The labels of the Nbgrader menu's visible items (empty when there is no such menu)."""
    top = page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$"))
    if top.count() == 0:
        return []
    top.first.click()
    labels = page.locator(".lm-Menu:visible .lm-Menu-itemLabel").all_inner_texts()
    page.keyboard.press("Escape")
    return [t.strip() for t in labels if t.strip()]


def test_make_lab_passes_the_student_settings():
    text = (ROOT / "Makefile").read_text()
    assert 'STUDENT_LAB = --LabApp.app_settings_dir="$(CURDIR)/lab-config/student"' in text
    assert re.search(r"^lab: setup\n\t.*\$\(STUDENT_LAB\)$", text, re.M), "make lab must use STUDENT_LAB"
    assert not re.search(r"^lab-instructor: setup\n\t.*STUDENT_LAB", text, re.M)
    assert STUDENT_LAB_ARGS == [f"--LabApp.app_settings_dir={ROOT / 'lab-config' / 'student'}"]


@pytest.mark.timeout(420)
def test_student_lab_checks_a_saved_notebook_from_its_last_cell(browser, student_lab, shots):
    from llmcourse.manifest import load_course

    unit = load_course(ROOT).unit(UNIT_ID)
    if not unit.available:
        pytest.skip(f"unit {UNIT_ID} is not available")
    tab = open_tab(browser)
    page = tab.page
    shots.watch(page, "student")
    try:
        path = unit.exercise
        open_notebook(page, student_lab, path, workspace="student")

        # student tools only: Validate and the assignment list, no instructor plugins
        ui = _ui_state(page)
        for plugin in INSTRUCTOR_PLUGINS:
            assert not ui["activated"].get(plugin), f"{plugin} is active in the student lab"
        for plugin in STUDENT_PLUGINS:
            assert ui["activated"].get(plugin), f"{plugin} is not active in the student lab: {ui['activated']}"
        assert not set(INSTRUCTOR_COMMANDS) & set(ui["commands"]), ui["commands"]
        assert "nbgrader:open-assignment-list" in ui["commands"]
        assert "Create Assignment" not in ui["right"], ui["right"]
        assert page.locator(".jp-NotebookPanel-toolbar .validate-button").count() == 1, "no Validate button"
        menu = _nbgrader_menu(page)
        assert not {"Formgrader", "Course List", "Create assignment"} & set(menu), menu

        # one correct and one wrong answer, saved with Ctrl+S
        cells = mark_cells(page, path)
        answers = {"ex03_softmax_stable_answer": CORRECT, "ex03_simple_attention_answer": WRONG}
        page.evaluate(js("""
          const [path, answers] = arg;
          const p = findPanel(path);
          for (const c of p.content.widgets) {
            const gid = (c.model.getMetadata('nbgrader') || {}).grade_id;
            if (gid in answers) c.model.sharedModel.setSource(answers[gid]);
          }
        """), [path, answers])
        assert page.evaluate(js("return findPanel(arg).context.model.dirty;"), path)
        page.locator(f'[data-llmtest-index="{cells[0]["index"]}"]').click()
        page.keyboard.press("Escape")
        page.keyboard.press("Control+s")
        page.wait_for_function(js("return !findPanel(arg).context.model.dirty;"), arg=path, timeout=30_000)

        # run the first code cell (imports, setup) and the last one (the check), as a student does
        first = next(c for c in cells if c["type"] == "code")
        last = cells[-1]
        assert last["type"] == "code" and last["source"] == "llmcourse.check()", last
        page.locator(f'[data-llmtest-index="{first["index"]}"] .jp-InputPrompt').click()
        page.keyboard.press("Control+Enter")
        wait_until_done(page, path, timeout=120)
        page.locator(f'[data-llmtest-index="{last["index"]}"] .jp-InputPrompt').click()
        page.keyboard.press("Control+Enter")
        wait_until_done(page, path, timeout=300)

        out = page.locator(f'[data-llmtest-index="{last["index"]}"] .jp-OutputArea')
        table = out.locator(".llmcourse-check-table")
        assert table.count() == 1, f"no check table; the cell printed:\n{out.inner_text()[:1500]}"
        ARTIFACTS.mkdir(exist_ok=True)
        out.screenshot(path=str(ARTIFACTS / "check-03-in-notebook.png"))
        rows = table.locator("tr.llmcourse-check-row")
        status = dict(zip(rows.evaluate_all("rs => rs.map(r => r.dataset.exercise)"),
                          rows.evaluate_all("rs => rs.map(r => r.dataset.status)")))
        assert list(status.values()).count("passed") == 1 and status["03.softmax_stable"] == "passed", status
        assert status["03.simple_attention"] == "failed", status
        wrong = table.locator('tr[data-exercise="03.simple_attention"]').inner_text()
        # the known mistake by its name, never by its internal id
        assert "Known mistake: softmax_dim" in wrong and "B03." not in wrong, wrong
        text = out.inner_text()
        assert "3/20" in text and "Unsaved changes" not in text, text[:1500]
        assert not tab.errors(), "JavaScript console errors:\n" + "\n".join(tab.errors())
    finally:
        tab.close()
        student_lab.shutdown_kernels()


@pytest.mark.timeout(180)
def test_instructor_lab_has_the_instructor_tools(browser, lab, shots):
    tab = open_tab(browser)
    page = tab.page
    shots.watch(page, "instructor")
    try:
        open_notebook(page, lab, "exercises/03_self_attention/03_self_attention.ipynb", workspace="instructor")
        ui = _ui_state(page)
        for plugin in INSTRUCTOR_PLUGINS + STUDENT_PLUGINS:
            assert ui["activated"].get(plugin), f"{plugin} is not active in the instructor lab"
        assert set(INSTRUCTOR_COMMANDS) <= set(ui["commands"]), ui["commands"]
        assert "Create Assignment" in ui["right"], ui["right"]
        menu = _nbgrader_menu(page)
        assert {"Formgrader", "Course List", "Assignment List"} <= set(menu), menu
    finally:
        tab.close()
        lab.shutdown_kernels()
