"""grader.feedback strips hidden tests and grader tracebacks from feedback notebooks."""

from __future__ import annotations

import nbformat

from grader.feedback import StripHiddenTests


def test_hidden_blocks_and_grader_tracebacks_are_removed():
    cell = nbformat.v4.new_code_cell(
        "### BEGIN HIDDEN TESTS\nfrom grader import grade; grade('03.x')\n### END HIDDEN TESTS\nassert f(1) == 2\n")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "ex03_x", "points": 3}
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="03.x: FAILED (0/3 points)\n  expected 2, got 1\n"),
        nbformat.v4.new_output("error", ename="GradeFailed", evalue="03.x: FAILED (0/3 points)\nmore",
                               traceback=["File /site/grader/checks/u03.py line 5", "t.compare(secret)"]),
    ]
    other = nbformat.v4.new_code_cell("x = 1")
    other.outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="bad",
                                            traceback=["File grader/core.py", "secret line"])]
    nb = nbformat.v4.new_notebook(cells=[cell, other])
    nb, _ = StripHiddenTests().preprocess(nb, {})
    text = nbformat.writes(nb)
    for leak in ("BEGIN HIDDEN TESTS", "from grader", "grader/checks", "t.compare", "secret"):
        assert leak not in text, leak
    assert "assert f(1) == 2" in nb.cells[0].source
    assert nb.cells[0].outputs[1]["traceback"] == ["GradeFailed: 03.x: FAILED (0/3 points)"]
    assert "expected 2, got 1" in nb.cells[0].outputs[0]["text"]


def test_the_feedback_exporter_writes_nbconverts_page_without_the_soup_pass():
    """Same text as nbconvert's HTMLExporter; an image output gets its alt text (what the skipped pass added)."""
    import nbformat
    from bs4 import BeautifulSoup
    from nbconvert.exporters import HTMLExporter

    from grader.feedback import NO_ALT, FeedbackHTMLExporter

    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Unit 03\n\nSome *task* text."),
        nbformat.v4.new_code_cell("print(1)", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="03.softmax_stable: FAILED (0/3 points)\n"),
            nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"})])])
    ours, _ = FeedbackHTMLExporter(template_name="classic").from_notebook_node(nb)
    theirs, _ = HTMLExporter(template_name="classic").from_notebook_node(nb)
    text = lambda html: " ".join(BeautifulSoup(html, "html.parser").get_text().split())  # noqa: E731
    assert text(ours) == text(theirs) and "03.softmax_stable: FAILED (0/3 points)" in text(ours)
    imgs = BeautifulSoup(ours, "html.parser").find_all("img")
    assert imgs and all(img.get("alt") == NO_ALT for img in imgs), imgs
