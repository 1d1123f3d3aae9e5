"""Nothing present is lost, on the checker path (no nbgrader run): damaged files, stripped metadata,
markdown answers, wrong dtypes and shapes, capped output, a missing course kernel, the roster.

The same submissions graded by ``course grade`` (with nbgrader) are in tests/test_grading_attacks.py.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import pytest
from hostile import invalid_json

from grader.extract import code_cells_of_notebook
from grader.repair import answer_cell_notes, read_submission, repair_nbgrader_metadata
from grader.runner import check_notebook, run_unit

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions/03_self_attention/03_self_attention.ipynb"
EXERCISE = ROOT / "exercises/03_self_attention/03_self_attention.ipynb"


def _correct_submission():
    ex = nbformat.read(EXERCISE, as_version=4)
    sol = nbformat.read(SOLUTION, as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in sol.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for c in ex.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            c.source = "\n".join(ln for ln in answers[gid].splitlines() if "### BEGIN" not in ln and "### END" not in ln)
    return ex


def _wrapped_sources(wrap: str) -> list[str]:
    """The solution's answers, each result passed through ``wrap`` (e.g. ``x.double()``)."""
    out = []
    for c in code_cells_of_notebook(nbformat.read(SOLUTION, as_version=4)):
        for n in ("softmax_stable", "simple_attention", "scaled_dot_product_attention"):
            c = re.sub(rf"^def {n}\(", f"def _{n}(", c, flags=re.M)
        out.append(c)
    out.append(f"""
def _dd(o):
    return tuple({wrap} for x in o) if isinstance(o, tuple) else (lambda x: {wrap})(o)
def softmax_stable(x, dim=-1):
    return _dd(_softmax_stable(x, dim))
def simple_attention(x):
    return _dd(_simple_attention(x))
def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):
    return _dd(_scaled_dot_product_attention(q, k, v, mask, dropout))
class SelfAttention(SelfAttention):
    def forward(self, x):
        return _dd(super().forward(x))
class CausalSelfAttention(CausalSelfAttention):
    def forward(self, x):
        return _dd(super().forward(x))
""")
    return out


@pytest.mark.parametrize("wrap, words", [("x.double()", "float64"), ("x.half()", None), ("x.unsqueeze(0)", "shape")])
def test_wrong_dtype_or_shape_gets_a_dtype_or_shape_message(wrap, words):
    verdicts = run_unit("03", _wrapped_sources(wrap))
    for v in verdicts:
        text = v.render()
        assert v.status != "error" and "grader itself" not in text, text
    failed = [v for v in verdicts if not v.passed]
    assert failed
    if words:
        assert any(words in v.message for v in failed), [v.message for v in failed]


def test_invalid_json_reports_the_parse_position(tmp_path):
    text = nbformat.writes(_correct_submission())
    bad = tmp_path / "03_self_attention.ipynb"
    bad.write_text(invalid_json(text), encoding="utf-8")
    nb, cause = read_submission(bad)
    assert nb is None and re.search(r"not valid JSON \(line \d+, column \d+: ", cause), cause
    with pytest.raises(ValueError, match=r"line \d+, column \d+"):
        check_notebook(bad)


def test_stripped_metadata_is_put_back_on_the_same_cells(tmp_path):
    nb = _correct_submission()
    nb.cells.insert(3, nbformat.v4.new_code_cell("print('a scratch cell of mine')"))
    want = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    stripped = copy.deepcopy(nb)
    for c in stripped.cells:
        c.metadata.pop("nbgrader", None)
    release = nbformat.read(EXERCISE, as_version=4)
    repaired, n = repair_nbgrader_metadata(stripped, release)
    assert n == sum(1 for g in want if g)
    assert [c.metadata.get("nbgrader", {}).get("grade_id") for c in repaired.cells] == want
    path = tmp_path / "03_self_attention.ipynb"
    nbformat.write(stripped, path)
    _, verdicts = check_notebook(path)
    assert all(v.passed for v in verdicts), [v.render() for v in verdicts]


def test_markdown_answer_earns_nothing_and_says_which_cell(tmp_path):
    nb = _correct_submission()
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == "ex03_softmax_stable_answer":
            c.cell_type = "markdown"
            c.pop("outputs", None)
            c.pop("execution_count", None)
    path = tmp_path / "03_self_attention.ipynb"
    nbformat.write(nb, path)
    unit, verdicts = check_notebook(path)
    by = {v.exercise_id: v for v in verdicts}
    assert by["03.softmax_stable"].points == 0
    assert "'ex03_softmax_stable_answer' is a markdown cell" in by["03.softmax_stable"].render()
    assert sum(v.points for v in verdicts) == 17
    assert set(answer_cell_notes(nb, unit)) == {"03.softmax_stable"}


def test_printed_output_is_capped():
    from coursetools.grading import OUTPUT_CAP_CHARS, cap_outputs

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('x' * 10**7)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 10**7 + "\n")] + [
        nbformat.v4.new_output("stream", name="stdout", text="y" * 10**5 + "\n") for _ in range(50)]
    nb.cells.append(cell)
    assert cap_outputs(nb)
    assert len(nbformat.writes(nb)) < 3 * OUTPUT_CAP_CHARS
    assert "output cut" in nb.cells[0].outputs[0]["text"]


def test_grade_refuses_without_the_course_kernel(monkeypatch, tmp_path, capsys):
    from jupyter_client.kernelspec import KernelSpecManager

    from coursetools.cli import main

    monkeypatch.setattr(KernelSpecManager, "find_kernel_specs", lambda self: {"python3": "/nowhere"})
    (tmp_path / "alice" / "03_self_attention").mkdir(parents=True)
    assert main(["grade", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not registered" in err[0] and "make kernel" in err[0], err


def test_roster_in_nbgrader_import_format(tmp_path):
    from coursetools.grading import read_roster

    path = tmp_path / "roster.csv"
    path.write_text("id,first_name,last_name,email\nalice,Alice,Liddell,alice@example.org\nbob,,,\n",
                    encoding="utf-8")
    assert read_roster(path) == {"alice": {"first_name": "Alice", "last_name": "Liddell", "email": "alice@example.org"},
                                 "bob": {"first_name": None, "last_name": None, "email": None}}
    path.write_text("student,name\nalice,Alice\n", encoding="utf-8")
    with pytest.raises(ValueError, match="id,first_name,last_name,email"):
        read_roster(path)


def test_the_run_summary_ends_with_where_the_time_went(tmp_path):
    from coursetools.grading import TOTAL_PHASE, GradeReport

    report = GradeReport(out_dir=tmp_path, rows=[{"student": "alice", "assignment": "03_self_attention",
                                                  "score": 20.0, "max_score": 20.0, "notes": ""}] * 4, jobs=2,
                         timings={"checks (course checker)": 10.0, "nbgrader generate_assignment (beside the checks)":
                                  6.0, "feedback (nbgrader generate_feedback)": 5.0, TOTAL_PHASE: 18.0})
    text = report.render()
    table = text[text.index("where the time went"):].splitlines()
    assert "4 submissions, --jobs 2, notebooks as saved" in table[0], table
    rows = {ln[:54].strip(): ln[54:].split() for ln in table[2:]}
    assert rows["checks (course checker)"] == ["10.0"] and rows["other"] == ["3.0"], rows  # "beside": not counted
    assert rows[TOTAL_PHASE][0] == "18.0" and "(4.50 s per submission)" in table[-1], table
    report.executed = True
    assert "notebooks run in nbgrader (--execute)" in report.render()


def test_course_grade_passes_execute_and_prints_the_phase_table(monkeypatch, tmp_path, capsys):
    import coursetools.grading as grading
    from coursetools.cli import main
    from coursetools.grading import TOTAL_PHASE, GradeReport

    seen = []

    def fake(*args, **kwargs):
        seen.append(kwargs["execute"])
        return GradeReport(out_dir=tmp_path, timings={"checks (course checker)": 1.0, TOTAL_PHASE: 2.0},
                           executed=kwargs["execute"])

    monkeypatch.setattr(grading, "grade", fake)
    assert main(["grade", str(tmp_path), "--quiet"]) == 0
    assert main(["grade", str(tmp_path), "--quiet", "--execute"]) == 0
    out = capsys.readouterr().out
    assert seen == [False, True] and out.count("where the time went") == 2 and "--execute)" in out, out
