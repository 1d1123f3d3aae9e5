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

and the rest of the hostile-submission corpus (``CORPUS`` below: every tamper notebook carries
wrong or stub answers, so any point it earns is a free point; controls show that nothing present is
lost). All of it, with the round trip's cases (``mutant``: scaled_dot_product_attention without 1/√d_k,
which SelfAttention and CausalSelfAttention call, 20 − 5 − 3 − 6 = 6; ``syntax``: a syntax error in
the softmax_stable cell, 17), is graded in one ``course grade`` run with a 20 s cell timeout: this
file is the nbgrader round-trip test (release, autograde, gradebook, feedback, grades.csv).

The two views must agree exercise by exercise, and the gradebook must hold the checker's scores.
A second run proves that a notebook that writes to the checkout's grading code costs only itself: it
scores 0 with the note, the other submission is graded as usual, and the run asks for a restore of the
checkout (tests/test_grading_tamper.py: a change to the checker's copy only).
"""

from __future__ import annotations

import copy
import re
import sqlite3
import time
from pathlib import Path

import nbformat
import pytest
from hostile import HOSTILE_KINDS, hostile_code, invalid_json, surviving_daemons

from coursetools.grading import TAMPER_NOTE, grade
from grader.runner import check_notebook
from grader.supervise import STOPPED_NOTE

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.roundtrip, pytest.mark.slow]
CHECK_WALL_LIMIT_S = 180.0  # one course check of one notebook (setsid_sleep waits out its 30 s check limit)
GRADE_WALL_LIMIT_S = 3600.0  # the whole course grade run (about ten minutes on a loaded 2-core machine)

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

TORCH_PATCH = """\
import torch, builtins
torch.softmax = lambda x, dim=-1, **k: x
torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
torch.isclose = lambda a, b, *x, **k: torch.ones_like(a, dtype=torch.bool)
torch.testing.assert_close = lambda *a, **k: None
builtins.isinstance = lambda obj, cls: True
"""

REFERENCE_POISON = """\
import llmcourse.nn.attention as _att
_att.softmax_stable = lambda x, dim=-1: x
_att.simple_attention = lambda x: (x, x)
_att.scaled_dot_product_attention = lambda q, k, v, mask=None, dropout=None: (v, q)
"""

# while called: look through every live object for a tensor of the right shape (an expected value?)
_GC = """\
    import gc
    import torch
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.shape == {shape} and obj is not {arg}:
            return {ret}
"""
GC_INSIDE = {
    "ex03_softmax_stable_answer": "def softmax_stable(x, dim=-1):\n" + _GC.format(shape="x.shape", arg="x",
                                                                                 ret="obj.clone()") + "    return x\n",
    "ex03_simple_attention_answer": "def simple_attention(x):\n" + _GC.format(shape="x.shape", arg="x",
                                                                             ret="(obj.clone(), obj.clone())")
                                    + "    return x, x\n",
    "ex03_scaled_dot_product_attention_answer":
        "def scaled_dot_product_attention(q, k, v, mask=None, dropout=None):\n"
        + _GC.format(shape="v.shape", arg="v", ret="(obj.clone(), q)") + "    return v, q\n",
    "ex03_SelfAttention_answer": WRONG["ex03_SelfAttention_answer"],
    "ex03_CausalSelfAttention_answer": WRONG["ex03_CausalSelfAttention_answer"],
}

_GRADER_INSIDE = """\
    import grader.core, grader.runner
    grader.core.Tester.compare = lambda self, *a, **k: None
    grader.core.Tester.expect = lambda self, *a, **k: None
    grader.core._same = lambda *a, **k: True
"""
GRADER_INSIDE = {gid: src.replace("):\n", "):\n" + _GRADER_INSIDE, 1) if src.startswith("def") else src
                 for gid, src in WRONG.items()}


def _calling(body: str) -> dict[str, str]:
    """Wrong answers that run ``body`` first whenever a function is called."""
    return {gid: src.replace("):\n", "):\n" + body, 1) if src.startswith("def") else src for gid, src in WRONG.items()}


EXPECTED = {"control": 20, "grader_patched": 0, "allclose_patched": 0, "patch_inside": 0, "reference_abuse": 0,
            "gradebook_editor": 0,
            # tampering, wrong or stub answers: every point would be free
            "torch_patched": 0, "reference_poisoned": 0, "gc_inside": 0, "grader_patched_inside": 0,
            "sys_exit_top": 0, "os_exit_top": 0, "loop_top": 0, "huge_output": 0, "sys_exit_inside": 0,
            "os_exit_inside": 0, "loop_inside": 0, "invalid_json": 0, "stripped_wrong": 0, "tests_deleted_wrong": 0,
            "tests_retyped_wrong": 0, "markdown_answers": 0, "nan_answers": 0, "batch_dims": 0, "stub": 0,
            # float32 in, float64 out breaks every exercise's dtype contract (B03.float64_output; measured with
            # course check on this corpus notebook)
            "float64_answers": 0,
            # correct answers around what a real class produces: nothing present is lost
            "crash_correct": 20, "stripped_correct": 20, "tests_tampered_correct": 20,
            "huge_output_correct": 20, "markdown_one_correct": 17,
            # the nbgrader round trip: a named mistake costs only its own exercise (the modules built on
            # scaled_dot_product_attention are graded on the course's function); so does a syntax error
            "mutant": 15, "syntax": 17,
            # learner code that signals or outlives the processes that supervise it (tests/hostile.py)
            **{f"{kind}_inside": 0 for kind in HOSTILE_KINDS}}


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
    if nb is not None:
        nbformat.write(nb, path)
    return path


HUGE = "print('x' * 20_000_000)\nfor _ in range(20):\n    print('y' * 1_000_000)"


def _stripped(nb):
    for c in nb.cells:
        c.metadata.pop("nbgrader", None)
    return nb


def _grade_cell(c) -> bool:
    return bool(c.metadata.get("nbgrader", {}).get("grade"))


def _tests_deleted(nb, keep_one: bool = False):
    graded = [c for c in nb.cells if _grade_cell(c)]
    drop = graded[1:] if keep_one else graded
    nb.cells = [c for c in nb.cells if not any(c is d for d in drop)]
    return nb


def _tests_retyped(nb):
    for c in nb.cells:
        if _grade_cell(c):
            c.source = "print('passed (99/99 points)')"
    return nb


def _markdown(nb, all_answers: bool):
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("solution") and (all_answers or meta.get("grade_id") == "ex03_softmax_stable_answer"):
            c.cell_type = "markdown"
            c.pop("outputs", None)
            c.pop("execution_count", None)
    return nb


def _wrapped(answers: dict[str, str], wrap: str) -> dict[str, str]:
    """Correct answers whose every result goes through ``wrap`` (``x`` is each returned tensor)."""
    out = {}
    for gid, src in answers.items():
        for n in ("softmax_stable", "simple_attention", "scaled_dot_product_attention"):
            src = re.sub(rf"^def {n}\(", f"def _{n}(", src, flags=re.M)
            if gid == f"ex03_{n}_answer":
                src += (f"\n\ndef {n}(*args, **kwargs):\n    o = _{n}(*args, **kwargs)\n"
                        f"    return tuple({wrap} for x in o) if isinstance(o, tuple) else (lambda x: {wrap})(o)\n")
        for n in ("SelfAttention", "CausalSelfAttention"):
            if gid == f"ex03_{n}_answer":
                src += (f"\n\nclass {n}({n}):\n    def forward(self, *args):\n"
                        f"        return (lambda x: {wrap})(super().forward(*args))\n")
        out[gid] = src
    return out


def corpus(exercise, correct: dict[str, str], marks: Path | None = None) -> dict:
    """The hostile corpus as ``{student: notebook}``; with ``marks`` (a folder), the supervision cases too."""
    subs = {
        "control": _submission(exercise, correct),
        "torch_patched": _submission(exercise, WRONG, top=TORCH_PATCH),
        "reference_poisoned": _submission(exercise, WRONG, top=REFERENCE_POISON),
        "gc_inside": _submission(exercise, GC_INSIDE),
        "grader_patched_inside": _submission(exercise, GRADER_INSIDE),
        "sys_exit_top": _submission(exercise, WRONG, top="import sys\nsys.exit(0)"),
        "os_exit_top": _submission(exercise, WRONG, top="import os\nos._exit(0)"),
        "loop_top": _submission(exercise, WRONG, top="while True:\n    pass"),
        "huge_output": _submission(exercise, WRONG, top=HUGE),
        "sys_exit_inside": _submission(exercise, _calling("    import sys\n    sys.exit(0)\n")),
        "os_exit_inside": _submission(exercise, _calling("    import os\n    os._exit(0)\n")),
        "loop_inside": _submission(exercise, {**WRONG, "ex03_softmax_stable_answer":
                                              "def softmax_stable(x, dim=-1):\n    while True:\n        pass\n"}),
        "stripped_wrong": _stripped(_submission(exercise, WRONG)),
        "tests_deleted_wrong": _tests_deleted(_submission(exercise, WRONG)),
        "tests_retyped_wrong": _tests_retyped(_submission(exercise, WRONG)),
        "markdown_answers": _markdown(_submission(exercise, correct), all_answers=True),
        "nan_answers": _submission(exercise, _calling("    return _nan(locals())\n"),
                                   top="import torch\ndef _nan(args):\n    t = next(v for v in args.values() "
                                       "if isinstance(v, torch.Tensor))\n    return torch.full_like(t, float('nan'))"),
        "batch_dims": _submission(exercise, _wrapped(correct, "x.unsqueeze(0)")),
        "stub": _submission(exercise, None),
        "float64_answers": _submission(exercise, _wrapped(correct, "x.double()")),
        "crash_correct": _submission(exercise, correct, top="import os\nos._exit(1)"),
        "stripped_correct": _stripped(_submission(exercise, correct)),
        "tests_tampered_correct": _tests_retyped(_tests_deleted(_submission(exercise, correct), keep_one=True)),
        "huge_output_correct": _submission(exercise, correct, top=HUGE),
        "markdown_one_correct": _markdown(_submission(exercise, correct), all_answers=False),
        "grader_patched": _submission(exercise, WRONG, top=GRADER_PATCH),
        "allclose_patched": _submission(exercise, WRONG, top=ALLCLOSE_PATCH),
        "patch_inside": _submission(exercise, PATCH_INSIDE),
        "reference_abuse": _submission(exercise, REFERENCE_ABUSE),
        "gradebook_editor": _submission(exercise, None, top=GRADEBOOK_EDIT),
        "mutant": _submission(exercise, {**correct, "ex03_scaled_dot_product_attention_answer":
                                         correct["ex03_scaled_dot_product_attention_answer"].replace(
                                             " / math.sqrt(d_k)", "")}),
        "syntax": _submission(exercise, {**correct, "ex03_softmax_stable_answer":
                                         "def softmax_stable(x, dim=-1)\n    return x\n"}),
    }
    if marks is not None:
        subs.update(supervision_cases(exercise, marks))
    return subs


def supervision_cases(exercise, marks: Path) -> dict:
    """Wrong answers that attack the processes running them (tests/hostile.py) each time they are called:
    in ``course check`` and ``course grade`` the checking worker, in ``course grade`` nbgrader's kernel too."""
    top = hostile_code(marks)
    cases = {}
    for kind in HOSTILE_KINDS:
        if kind == "setsid_sleep":  # one exercise only: its check time limit and cell timeout are waited out
            answers = {**WRONG, "ex03_softmax_stable_answer":
                       "def softmax_stable(x, dim=-1):\n    _hostile('setsid_sleep')\n    return x\n"}
        else:
            answers = _calling(f"    _hostile({kind!r})\n")
        cases[f"{kind}_inside"] = _submission(exercise, answers, top=top)
    return cases


@pytest.fixture(scope="module")
def attacked(tmp_path_factory, course_copy):
    course = course_copy(("03",))
    unit = course.unit("03")
    exercise = nbformat.read(ROOT / unit.exercise, as_version=4)
    correct = _answers(nbformat.read(ROOT / unit.solution, as_version=4))
    marks = tmp_path_factory.mktemp("daemons")
    subs = corpus(exercise, correct, marks)
    assert subs["mutant"].cells != subs["control"].cells
    submitted = tmp_path_factory.mktemp("class") / "submitted"
    paths = {student: _write(submitted, student, unit, nb) for student, nb in subs.items()}
    damaged = nbformat.writes(_submission(exercise, WRONG))
    paths["invalid_json"] = _write(submitted, "invalid_json", unit, None)
    paths["invalid_json"].write_text(invalid_json(damaged), encoding="utf-8")
    out = tmp_path_factory.mktemp("grading")
    started = time.monotonic()
    # executed in nbgrader: every attack on the kernel's side too (make test runs it beside nbval)
    report = grade(submitted.parent, out_dir=out, cell_timeout=20, course=course, execute=True)
    WALL["course grade"] = time.monotonic() - started
    print(f"corpus: {len(paths)} notebooks graded by course grade in {WALL['course grade']:.0f} s")
    WALL["daemons after course grade"] = surviving_daemons(marks)
    checked = {}
    for student, path in paths.items():
        started = time.monotonic()
        try:
            checked[student] = {v.exercise_id: v for v in check_notebook(path)[1]}
        except ValueError as exc:  # unreadable: nothing graded (the message names the cause)
            checked[student] = str(exc)
        WALL[student] = time.monotonic() - started
    WALL["daemons after course check"] = surviving_daemons(marks)
    return report, checked, out, unit


WALL: dict = {}  # seconds per course check, the course grade run, daemons found alive after each view


def test_every_attack_scores_zero_and_the_control_full_marks(attacked):
    report, _, _, _ = attacked
    scores = {r["student"]: r["score"] for r in report.rows}
    assert len(scores) >= 30 and scores == EXPECTED, report.render()


def test_course_check_gives_the_same_points_exercise_by_exercise(attacked):
    report, checked, _, unit = attacked
    for row in report.rows:
        got = checked[row["student"]]
        view = {e.grade_id: float(got[e.id].points) if isinstance(got, dict) else 0.0 for e in unit.exercises}
        assert view == row["per_exercise"], (row["student"], view, row["per_exercise"])


def test_no_submission_stalls_either_view_nor_outlives_it(attacked):
    report, checked, _, _ = attacked
    assert WALL["daemons after course grade"] == [] and WALL["daemons after course check"] == [], WALL
    slow = {s: round(t) for s, t in WALL.items() if s in checked and t > CHECK_WALL_LIMIT_S}
    assert not slow, slow
    assert WALL["course grade"] < GRADE_WALL_LIMIT_S, WALL["course grade"]
    notes = {r["student"]: r["notes"] for r in report.rows}
    # a kernel that stops nbgrader (it runs as the grading user) costs its own notebook's run, named
    assert STOPPED_NOTE in notes["stop_parent_inside"], notes["stop_parent_inside"]
    assert not any(STOPPED_NOTE in notes[s] for s in ("control", "stub", "mutant", "crash_correct")), notes


def test_course_check_gives_the_expected_scores(attacked):
    _, checked, _, _ = attacked
    totals = {s: sum(v.points for v in got.values()) if isinstance(got, dict) else 0 for s, got in checked.items()}
    assert totals == EXPECTED


def test_no_verdict_blames_the_grader(attacked):
    _, checked, _, _ = attacked
    for student, got in checked.items():
        for v in got.values() if isinstance(got, dict) else ():
            assert v.status != "error" and "grader itself" not in v.render(), (student, v.render())


def test_what_went_wrong_is_named_in_one_line(attacked):
    report, checked, out, _ = attacked
    notes = {r["student"]: r["notes"] for r in report.rows}
    assert "kernel died" in notes["crash_correct"] and "kernel died" in notes["os_exit_top"], notes
    assert "not valid JSON (line" in notes["invalid_json"] and "not valid JSON (line" in checked["invalid_json"]
    assert "nbgrader metadata" in notes["stripped_correct"]
    assert "output" in notes["huge_output_correct"] and "cut" in notes["huge_output_correct"]
    assert "markdown cell" in checked["markdown_one_correct"]["03.softmax_stable"].render()
    assert any("float64" in v.message for v in checked["float64_answers"].values())
    for student in ("crash_correct", "stripped_correct", "invalid_json"):  # recorded, with feedback
        assert (out / ".grading" / "feedback" / student).exists(), student


def test_output_is_capped_in_the_graded_notebook_and_the_feedback(attacked):
    _, _, out, unit = attacked
    for student in ("huge_output", "huge_output_correct"):
        graded = out / ".grading" / "autograded" / student / unit.name / f"{unit.name}.ipynb"
        feedback = out / ".grading" / "feedback" / student / unit.name / f"{unit.name}.html"
        assert graded.stat().st_size < 1_000_000 and feedback.stat().st_size < 1_500_000


def test_students_are_listed_under_their_ids(attacked):
    report, _, out, _ = attacked
    db = sqlite3.connect(out / ".grading" / "gradebook.db")
    rows = dict(db.execute("SELECT id, last_name FROM student").fetchall())
    db.close()
    assert rows == {r["student"]: r["student"] for r in report.rows}


def test_reference_abuse_is_named(attacked):
    _, checked, _, _ = attacked
    verdicts = checked["reference_abuse"]
    for _exercise_id, v in verdicts.items():
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


def test_writing_to_the_checkout_costs_the_tamperer_and_asks_for_a_restore(tmp_path, course_copy):
    course = course_copy(("03",))
    unit = course.unit("03")
    exercise = nbformat.read(ROOT / unit.exercise, as_version=4)
    correct = _answers(nbformat.read(ROOT / unit.solution, as_version=4))
    target = course.root / "grader" / "checks" / "u03_self_attention.py"
    top = (f"with open({str(target)!r}, 'a') as fh:\n    fh.write('\\n# every check passes now\\n')\n" + GRADEBOOK_EDIT)
    submitted = tmp_path / "class" / "submitted"
    _write(submitted, "tamperer", unit, _submission(exercise, correct, top=top))
    _write(submitted, "control", unit, _submission(exercise, correct))
    out = tmp_path / "grading"
    report = grade(submitted.parent, out_dir=out, cell_timeout=60, course=course, execute=True)  # its kernel writes
    rows = {r["student"]: r for r in report.rows}
    assert rows["control"]["score"] == 20 and TAMPER_NOTE not in rows["control"]["notes"], rows["control"]
    assert rows["tamperer"]["score"] == 0 and TAMPER_NOTE in rows["tamperer"]["notes"], rows["tamperer"]
    assert "grader/checks/u03_self_attention.py" in rows["tamperer"]["notes"]
    tampered = [ln for ln in report.tampering if ln.startswith("TAMPERED")]
    assert len(tampered) == 1 and "tamperer/03_self_attention" in tampered[0], report.tampering
    restore = [ln for ln in report.tampering if ln.startswith("RESTORE")]
    assert len(restore) == 1 and "git checkout" in restore[0] and "grader/checks/u03_self_attention.py" in restore[0]
    db = sqlite3.connect(out / ".grading" / "gradebook.db")
    scores = dict(db.execute(
        "SELECT student.id, SUM(grade.auto_score) FROM grade "
        "JOIN submitted_notebook ON grade.notebook_id = submitted_notebook.id "
        "JOIN submitted_assignment ON submitted_notebook.assignment_id = submitted_assignment.id "
        "JOIN student ON submitted_assignment.student_id = student.id GROUP BY student.id").fetchall())
    db.close()
    assert scores == {"control": 20, "tamperer": 0}, scores


# ------------------------------------------------------------------ the nbgrader round trip (same run)


def test_grades_csv_has_totals_and_per_exercise_points(attacked):
    import csv

    report, _, _, _ = attacked
    rows = {r["student"]: r for r in csv.DictReader(report.grades_csv.open())}
    assert float(rows["control"]["score"]) == 20.0 and float(rows["control"]["max_score"]) == 20.0
    assert float(rows["mutant"]["ex03_scaled_dot_product_attention"]) == 0.0
    assert float(rows["mutant"]["ex03_softmax_stable"]) == 3.0


def test_the_timeout_is_reported(attacked):
    report, _, _, _ = attacked
    notes = {r["student"]: r["notes"] for r in report.rows}
    assert "timed out" in notes["loop_inside"] or "errors" in notes["loop_inside"], notes["loop_inside"]


def test_feedback_names_the_mutant_and_hides_the_checks(attacked):
    _, _, out, unit = attacked
    feedback = sorted((out / ".grading" / "feedback").rglob("*.html"))
    assert {"control", "stub", "mutant", "syntax", "loop_inside", "tests_tampered_correct"} <= {p.parts[-3]
                                                                                                for p in feedback}
    for html_path in feedback:
        html = html_path.read_text(encoding="utf-8")
        for leak in ("BEGIN HIDDEN TESTS", "from grader import", "grader/checks", "grader/core", "def check_",
                     "t.compare", "BEGIN SOLUTION"):
            assert leak not in html, f"{html_path}: feedback shows {leak!r}"
    mutant = (out / ".grading" / "feedback" / "mutant" / unit.name / f"{unit.name}.html").read_text()
    # a known mistake is shown by its name, never by its catalogue id
    assert "no_scale: Divide the scores by" in mutant and "B03.no_scale" not in mutant


def test_the_class_report_lists_hostile_submissions_as_limits_and_hides_the_checks(attacked):
    import json

    report, _, out, _ = attacked
    assert str(report.class_report) == str(out / "report.html"), report.class_report  # written, not crashed
    page = (out / "report.html").read_text(encoding="utf-8")
    for leak in ("BEGIN HIDDEN TESTS", "from grader import", "grader/checks", "def check_", "t.compare",
                 "BEGIN SOLUTION", "B03."):
        assert leak not in page, f"the class report shows {leak!r}"
    summary = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert summary["assignments"]["03_self_attention"]["students"] == len(report.rows)
    assert {"stop_parent_inside", "loop_inside", "crash_correct"} <= {x["student"] for x in summary["limits"]}
