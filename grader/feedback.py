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
