"""nbgrader feedback preprocessor: strip hidden checks from the HTML students receive.

nbgrader's feedback is the autograded notebook rendered to HTML. Autograding restores the hidden
test blocks of the grade cells, so without this preprocessor the feedback would show them, and
tracebacks could show grader frames. This preprocessor:

* replaces every ``### BEGIN HIDDEN TESTS … ### END HIDDEN TESTS`` block by a one-line comment;
* in grade cells, and in any cell whose traceback mentions the grader, replaces the traceback by
  the single line ``<ename>: <evalue>`` (the grader's own verdict text is printed as normal output).
"""

from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*$", re.S | re.M)
PLACEHOLDER = "# (hidden checks ran here; their results are printed below)"
_GRADER_MARKERS = ("grader/", "grader\\", "grader.checks", "grader.bugs", "grader.core", "grader.runner",
                   "from grader", "BEGIN HIDDEN TESTS")


def strip_hidden(source: str) -> str:
    return HIDDEN.sub(PLACEHOLDER, source)


def _mentions_grader(lines) -> bool:
    return any(marker in line for line in lines for marker in _GRADER_MARKERS)


class StripHiddenTests(NbGraderPreprocessor):
    """Remove hidden-test source and grader tracebacks from feedback notebooks."""

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code":
            return cell, resources
        cell.source = strip_hidden(cell.source)
        is_grade = bool(cell.metadata.get("nbgrader", {}).get("grade"))
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                if is_grade or _mentions_grader(out.get("traceback", [])):
                    evalue = str(out.get("evalue", "")).splitlines()[:1]
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {evalue[0] if evalue else ''}"]
            elif out.get("output_type") == "stream" and _mentions_grader([out.get("text", "")]):
                out["text"] = "\n".join(line for line in out["text"].splitlines()
                                        if not any(m in line for m in _GRADER_MARKERS)) + "\n"
        return cell, resources


# -- the feedback page's HTML, without nbconvert's BeautifulSoup pass -----------------------------------------------

from nbconvert.exporters import HTMLExporter  # noqa: E402
from nbconvert.exporters.templateexporter import TemplateExporter  # noqa: E402

_IMG_WITHOUT_ALT = re.compile(r"<img\b(?![^>]*\balt\s*=)", re.I)
NO_ALT = "No description has been provided for this image"


class FeedbackHTMLExporter(HTMLExporter):
    """nbconvert's ``HTMLExporter`` (7.x) less the BeautifulSoup pass over the finished page.

    That pass parses and re-serialises the whole page (its inline CSS included) to give every image without one an
    ``alt`` text and the lab template's cells a ``tabindex``: over half of the CPU time of ``nbgrader
    generate_feedback`` per notebook (measured with cProfile). nbgrader's feedback template is the classic one, which
    has no such cells; the ``alt`` text is added here by a regular expression. Configured in
    ``grader/nbgrader_config.py`` (``GenerateFeedback.exporter_class``); the page is otherwise the same.
    """

    def from_notebook_node(self, nb, resources=None, **kw):  # same steps as HTMLExporter's, bar the soup
        from nbconvert.filters.highlight import Highlight2HTML
        from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        highlight_code = self.filters.get("highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self))
        resources = self._init_resources(resources)
        filter_data_type = WidgetsDataTypeFilter(notebook_metadata=self._nb_metadata, parent=self,
                                                 resources=resources)
        self.register_filter("highlight_code", highlight_code)
        self.register_filter("filter_data_type", filter_data_type)
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        return _IMG_WITHOUT_ALT.sub(f'<img alt="{NO_ALT}"', html), resources
