"""The grader tried as an adversarial student would: each attack is a submission, scored in both views.

Built from unit 03's released exercise notebook (20 points), graded with ``course grade`` on a
private copy of the course and with ``course check``'s path (:func:`grader.runner.check_notebook`):

  control           every answer correct                                                    -> 20
  grader_patched    a top cell replaces the grader's functions with no-ops; answers wrong    ->  0
  allclose_patched  a top cell makes torch.allclose / torch.equal always true; answers wrong ->  0
  patch_inside      answers that, while called, patch torch and Tensor.__eq__ and walk the
                    call stack for the grader's expected values; otherwise stub-level        ->  0
  reference_abuse   answers that fetch the course's reference from sys.modules, wrap it,
                    subclass it, reuse its forward, or dig it out of gc                      ->  0
  gradebook_editor  stub answers; a top cell rewrites every row of the gradebook to 99       ->  0

The two views must agree exercise by exercise, and the gradebook must hold the checker's scores.
A second run proves that a notebook that writes to the grading code stops the run with a clear
message and leaves no scores behind.
"""

from __future__ import annotations

import copy
import sqlite3
from pathlib import Path

import nbformat
import pytest

from grader.runner import check_notebook
from llmcourse.grading import GradingTampered, grade

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.roundtrip, pytest.mark.slow]

WRONG = {
    "ex03_softmax_stable_answer": "def softmax_stable(x, dim=-1):\n    return x\n",
    "ex03_simple_attention_answer": "def simple_attention(x):\n    return x, x\n",
    "ex03_scaled_dot_product_attention_answer":
        "def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):\n    return v, q\n",
    "ex03_SelfAttention_answer":
        "class SelfAttention(nn.Module):\n    def __init__(self, d_in, d_out, qkv_bias=False):\n"
        "        super().__init__()\n    def forward(self, x):\n        return x\n",
    "ex03_CausalSelfAttention_answer":
        "class CausalSelfAttention(nn.Module):\n    def __init__(self, d_in, d_out, context_length, dropout=0.0, "
        "qkv_bias=False):\n        super().__init__()\n    def forward(self, x):\n        return x\n",
}

GRADER_PATCH = """\
import grader, grader.runner, grader.core
from grader.core import Verdict

def _always_passed(exercise_id, *args, **kwargs):
    print(f"{exercise_id}: passed (99/99 points)")
    return Verdict(exercise_id, "passed", points=99, max_points=99)

grader.grade = grader.runner.grade = _always_passed
grader.runner.run_check = lambda exercise_id, *a, **k: Verdict(exercise_id, "passed", points=99, max_points=99)
grader.core.Tester.compare = lambda self, *a, **k: None
grader.core.Tester.expect = lambda self, *a, **k: None
grader.core.Tester.run = lambda self, probe: None
"""

ALLCLOSE_PATCH = """\
import torch
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
"""

# while called: patch torch, then look up the caller frames for a tensor named like an expected value
_SNOOP = """\
    import inspect
    import torch
    torch.allclose = lambda *a, **k: True
    torch.equal = lambda *a, **k: True
    torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
    for record in inspect.stack():
        for name, value in list(record.frame.f_locals.items()):
            if name in ("expected", "ref", "want", "reference", "expect") and isinstance(value, torch.Tensor):
                return {ret}
"""
PATCH_INSIDE = {
    "ex03_softmax_stable_answer": "def softmax_stable(x, dim=-1):\n" + _SNOOP.format(ret="value.clone()")
    + "    return x\n",
    "ex03_simple_attention_answer": "def simple_attention(x):\n" + _SNOOP.format(ret="(value.clone(), value.clone())")
    + "    return x, x\n",
    "ex03_scaled_dot_product_attention_answer":
        "def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):\n"
        + _SNOOP.format(ret="(value.clone(), value.clone())") + "    return v, q\n",
    "ex03_SelfAttention_answer": WRONG["ex03_SelfAttention_answer"].replace(
        "        return x\n", "        return _snoop(x)\n") + "\n\ndef _snoop(x):\n" + _SNOOP.format(ret="value.clone()")
    + "    return x\n",
    "ex03_CausalSelfAttention_answer": WRONG["ex03_CausalSelfAttention_answer"],
}

REFERENCE_ABUSE = {
    # fetched from sys.modules
    "ex03_softmax_stable_answer": "import sys\n\ndef softmax_stable(x, dim=-1):\n"
                                  "    return sys.modules['llmcourse.nn.attention'].softmax_stable(x, dim=dim)\n",
    # dug out of the garbage collector by name
    "ex03_simple_attention_answer":
        "import gc\n\ndef simple_attention(x):\n"
        "    for obj in gc.get_objects():\n"
        "        if callable(obj) and getattr(obj, '__name__', '') == 'simple_attention' and "
        "getattr(obj, '__module__', '').startswith('llmcourse'):\n"
        "            return obj(x)\n"
        "    return x, x\n",
    # wrapped
    "ex03_scaled_dot_product_attention_answer":
        "import importlib\n\ndef scaled_dot_product_attention(q, k, v, mask=None, dropout=None):\n"
        "    ref = importlib.import_module('llmcourse.nn.attention')\n"
        "    return ref.scaled_dot_product_attention(q, k, v, mask=mask, dropout=dropout)\n",
    # subclassed
    "ex03_SelfAttention_answer": "import llmcourse.nn.attention as _att\n\n"
                                "class SelfAttention(_att.SelfAttention):\n    pass\n",
    # own __init__, the reference's forward
    "ex03_CausalSelfAttention_answer":
        "import llmcourse.nn.attention as _att\n\n"
        "class CausalSelfAttention(nn.Module):\n"
        "    def __init__(self, d_in, d_out, context_length, dropout=0.0, qkv_bias=False):\n"
        "        super().__init__()\n"
        "        self.d_out = d_out\n"
        "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
        "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
        "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
        "        self.dropout = nn.Dropout(dropout)\n"
        "        self.register_buffer('mask', torch.ones(context_length, context_length, dtype=torch.bool).tril(),"
        " persistent=False)\n"
        "        self.last_weights = None\n"
        "    forward = _att.CausalSelfAttention.forward\n",
}

GRADEBOOK_EDIT = """\
import os, sqlite3
_root = os.environ.get("LLMCOURSE_NBGRADER_ROOT")
if _root:
    _db = sqlite3.connect(os.path.join(_root, ".grading", "gradebook.db"))
    _db.execute("UPDATE grade SET manual_score = 99, auto_score = 99")
    _db.commit()
    _db.close()
"""

EXPECTED = {"control": 20, "grader_patched": 0, "allclose_patched": 0, "patch_inside": 0, "reference_abuse": 0,
            "gradebook_editor": 0}


def _answers(solution) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(
        ln for ln in c.source.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
        for c in solution.cells if c.metadata.get("nbgrader", {}).get("solution")}


def _submission(exercise, answers: dict[str, str] | None, top: str | None = None):
    nb = copy.deepcopy(exercise)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if answers is not None and cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[gid]
    if top:
        first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(first_code + 1, nbformat.v4.new_code_cell(top))
    return nb


def _write(submitted: Path, student: str, unit, nb) -> Path:
    folder = submitted / student / unit.name
    folder.mkdir(parents=True)
    path = folder / Path(unit.exercise).name
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def attacked(tmp_path_factory, course_copy):
    course = course_copy(("03",))
    unit = course.unit("03")
    exercise = nbformat.read(ROOT / unit.exercise, as_version=4)
    correct = _answers(nbformat.read(ROOT / unit.solution, as_version=4))
    subs = {
        "control": _submission(exercise, correct),
        "grader_patched": _submission(exercise, WRONG, top=GRADER_PATCH),
        "allclose_patched": _submission(exercise, WRONG, top=ALLCLOSE_PATCH),
        "patch_inside": _submission(exercise, PATCH_INSIDE),
        "reference_abuse": _submission(exercise, REFERENCE_ABUSE),
        "gradebook_editor": _submission(exercise, None, top=GRADEBOOK_EDIT),
    }
    submitted = tmp_path_factory.mktemp("class") / "submitted"
    paths = {student: _write(submitted, student, unit, nb) for student, nb in subs.items()}
    out = tmp_path_factory.mktemp("grading")
    report = grade(submitted.parent, out_dir=out, cell_timeout=60, course=course)
    checked = {student: {v.exercise_id: v for v in check_notebook(path)[1]} for student, path in paths.items()}
    return report, checked, out, unit


def test_every_attack_scores_zero_and_the_control_full_marks(attacked):
    report, _, _, _ = attacked
    scores = {r["student"]: r["score"] for r in report.rows}
    assert scores == EXPECTED, report.render()


def test_course_check_gives_the_same_points_exercise_by_exercise(attacked):
    report, checked, _, unit = attacked
    for row in report.rows:
        view = {e.grade_id: float(checked[row["student"]][e.id].points) for e in unit.exercises}
        assert view == row["per_exercise"], (row["student"], view, row["per_exercise"])


def test_reference_abuse_is_named(attacked):
    _, checked, _, _ = attacked
    verdicts = checked["reference_abuse"]
    for exercise_id, v in verdicts.items():
        text = v.render()
        assert v.points == 0 and "course library" in text, text


def test_the_gradebook_holds_the_checkers_scores(attacked):
    report, _, out, _ = attacked
    db = sqlite3.connect(out / ".grading" / "gradebook.db")
    rows = db.execute(
        "SELECT student.id, grade.auto_score, grade.manual_score FROM grade "
        "JOIN submitted_notebook ON grade.notebook_id = submitted_notebook.id "
        "JOIN submitted_assignment ON submitted_notebook.assignment_id = submitted_assignment.id "
        "JOIN student ON submitted_assignment.student_id = student.id").fetchall()
    db.close()
    totals: dict[str, float] = {}
    for student, auto, manual in rows:
        assert manual is None, (student, manual)
        totals[student] = totals.get(student, 0.0) + (auto or 0.0)
    assert totals == {r["student"]: r["score"] for r in report.rows}


def test_feedback_shows_the_checkers_verdict(attacked):
    _, _, out, unit = attacked
    html = (out / ".grading" / "feedback" / "grader_patched" / unit.name / f"{unit.name}.html").read_text()
    assert "03.softmax_stable: FAILED (0/3 points)" in html
    graded = nbformat.read(out / ".grading" / "autograded" / "grader_patched" / unit.name / f"{unit.name}.ipynb",
                           as_version=4)
    outputs = [o.get("text", "") for c in graded.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")
               for o in c.get("outputs", [])]
    assert outputs and not any("99/99" in text for text in outputs), outputs


def test_writing_to_the_grading_code_stops_the_run(tmp_path, course_copy):
    course = course_copy(("03",))
    unit = course.unit("03")
    exercise = nbformat.read(ROOT / unit.exercise, as_version=4)
    target = course.root / "grader" / "checks" / "u03_self_attention.py"
    top = (f"with open({str(target)!r}, 'a') as fh:\n    fh.write('\\n# every check passes now\\n')\n" + GRADEBOOK_EDIT)
    submitted = tmp_path / "class" / "submitted"
    _write(submitted, "tamperer", unit, _submission(exercise, None, top=top))
    out = tmp_path / "grading"
    with pytest.raises(GradingTampered) as err:
        grade(submitted.parent, out_dir=out, cell_timeout=60, course=course)
    text = str(err.value)
    assert "grader/checks/u03_self_attention.py" in text and "tamperer/03_self_attention" in text
    assert "No scores were written" in text
    assert not (out / ".grading" / "gradebook.db").exists()
