"""A learner's path through an exercise notebook in JupyterLab, ending with nbgrader's Validate button.

On a copy of ``exercises/03_self_attention/03_self_attention.ipynb``: type the reference answer of
``softmax_stable`` into its cell (taken from the solution notebook), run the notebook's first cells with
Shift+Enter as a learner does, check the exercise's visible test cell printed ``visible tests passed``,
then click **Validate** (nbgrader's JupyterLab extension). With one stub of five filled, nbgrader must
report exactly the test cells of the four other exercises as failed, each with ``NotImplementedError``,
and not the one that was solved.
"""

from __future__ import annotations

import nbformat
import pytest
from jlab import (
    ARTIFACTS,
    ROOT,
    cell_output_text,
    mark_cells,
    open_notebook,
    open_tab,
    wait_until_done,
)

from llmcourse.manifest import load_course

pytestmark = [pytest.mark.browser, pytest.mark.slow]

UNIT_ID = "03"
SOLVED = "03.softmax_stable"


def _reference_answer(unit, grade_id: str) -> str:
    """The solution notebook's answer cell, without nbgrader's BEGIN/END SOLUTION marker lines."""
    nb = nbformat.read(str(ROOT / unit.solution), as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id") == grade_id:
            return "\n".join(ln for ln in cell.source.splitlines()
                             if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
    raise AssertionError(f"{unit.solution} has no answer cell {grade_id}")


@pytest.fixture
def exercise_tab(browser, lab):
    tab = open_tab(browser)
    yield tab
    tab.close()
    lab.shutdown_kernels()


@pytest.mark.timeout(600)
def test_fill_one_stub_run_its_tests_and_validate(lab, exercise_tab, shots):
    course = load_course(ROOT)
    unit = course.unit(UNIT_ID)
    if not unit.available:
        pytest.skip(f"unit {UNIT_ID} is not available in course.toml")
    solved = course.exercise(SOLVED)
    answer_id = f"{solved.grade_id}_answer"
    answer = _reference_answer(unit, answer_id)

    page = exercise_tab.page
    shots.watch(page, "exercise")
    path = unit.exercise
    open_notebook(page, lab, path, workspace="exercise")
    cells = mark_cells(page, path)
    by_gid = {c["grade_id"]: c for c in cells if c["grade_id"]}
    assert answer_id in by_gid and solved.grade_id in by_gid, f"{path}: grade cells {sorted(by_gid)}"
    assert "raise NotImplementedError()" in by_gid[answer_id]["source"], "the exercise should start as a stub"

    # type the answer into the stub's editor, key by key, replacing the stub. The editor indents new lines
    # itself (4 spaces after `def ...:`, then the line above's), so each line is typed without its indent.
    editor = page.locator(f'[data-llmtest-grade-id="{answer_id}"] .cm-content')
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    lines = answer.strip().splitlines()
    assert lines[0].startswith("def ") and all(ln.startswith("    ") and not ln.startswith("     ")
                                               for ln in lines[1:]), (
        f"typing relies on the editor's auto-indent: the reference {SOLVED} must be a def with a flat body:\n{answer}")
    for n, line in enumerate(lines):
        page.keyboard.type(line.lstrip())
        if n < len(lines) - 1:
            page.keyboard.press("Enter")
    page.keyboard.press("Escape")
    source_now = mark_cells(page, path)[by_gid[answer_id]["index"]]["source"]
    assert source_now.strip() == answer.strip(), f"cell source after typing:\n{source_now}\nexpected:\n{answer}"

    # run from the first cell through the solved exercise's test cell with Shift+Enter, as a learner does
    first_code = next(c for c in cells if c["type"] == "code")
    page.locator(f'[data-llmtest-index="{first_code["index"]}"] .jp-InputPrompt').click()
    for _ in range(first_code["index"], by_gid[solved.grade_id]["index"] + 1):
        page.keyboard.press("Shift+Enter")
    state = wait_until_done(page, path, timeout=180)
    test_index = by_gid[solved.grade_id]["index"]
    out = cell_output_text(page, path, test_index)
    assert not state["errors"], f"errors while running the solved exercise: {state['errors']}"
    assert "visible tests passed" in out, f"the {SOLVED} test cell printed {out!r}"
    assert "visible tests passed" in page.locator(f'[data-llmtest-index="{test_index}"] .jp-OutputArea').inner_text()

    # nbgrader's Validate button (saves the notebook, then runs nbgrader's validator on the server)
    validate = page.locator(".jp-NotebookPanel-toolbar .validate-button").get_by_text("Validate")
    assert validate.count() == 1, ("no Validate button in the notebook toolbar: is nbgrader's JupyterLab extension "
                                   "enabled? (`.venv/bin/jupyter labextension list` should list @jupyter/nbgrader)")
    validate.click()
    dialog = page.locator(".jp-Dialog").filter(has_text="Validation Results")
    dialog.wait_for(state="visible", timeout=240_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "exercise-03-validate.png"))
    message = dialog.locator("#validation-message")
    report = message.evaluate("""(el) => ({
        classes: Array.from(el.classList),
        headings: Array.from(el.querySelectorAll(':scope > div > p')).map(p => p.innerText),
        pres: Array.from(el.querySelectorAll('pre')).map(p => p.innerText),
        text: el.innerText })""")
    assert "validation-failed" in report["classes"], f"nbgrader did not report a failed validation: {report['text'][:800]}"
    others = [e for e in unit.exercises if e.id != SOLVED]
    released = {c.metadata["nbgrader"]["grade_id"]: c.source
                for c in nbformat.read(str(ROOT / unit.exercise), as_version=4).cells
                if c.metadata.get("nbgrader", {}).get("grade")}
    assert report["headings"] == ["The following cell failed:"] * len(others), report["headings"]
    # each failure: the test cell's source, then its traceback
    sources, tracebacks = report["pres"][0::2], report["pres"][1::2]
    expected = [released[e.grade_id].strip() for e in others]
    assert [s.strip() for s in sources] == expected, (
        "nbgrader should list exactly the test cells of " + ", ".join(e.id for e in others) + " as failed; it listed:\n"
        + "\n---\n".join(s[:200] for s in sources))
    for e, tb in zip(others, tracebacks):
        assert "NotImplementedError" in tb and "raise NotImplementedError()" in tb, f"{e.id}: traceback {tb[-400:]}"
    assert released[solved.grade_id].strip() not in [s.strip() for s in sources], f"{SOLVED} was reported as failed"
    dialog.get_by_role("button", name="Ok").click()
    dialog.wait_for(state="hidden")

    # Validate saved the notebook first: the copy on disk has the answer (the repository's notebook is untouched)
    saved = nbformat.read(str(lab.root_dir / path), as_version=4)
    saved_answer = next(c.source for c in saved.cells if c.metadata.get("nbgrader", {}).get("grade_id") == answer_id)
    assert saved_answer.strip() == answer.strip()
    assert "raise NotImplementedError()" in next(
        c.source for c in nbformat.read(str(ROOT / path), as_version=4).cells
        if c.metadata.get("nbgrader", {}).get("grade_id") == answer_id)
    assert not exercise_tab.errors(), "JavaScript console errors:\n" + "\n".join(exercise_tab.errors())
