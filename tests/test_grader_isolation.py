"""Isolation of learner code: worker processes, plain data, the off-limits reference (unit 03 as the example)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
import torch

from grader.core import CHECKS
from grader.core import Tester as _Tester
from grader.extract import code_cells_of_notebook
from grader.plain import Opaque, dumps, loads, plain
from grader.runner import load_unit, run_check, run_unit
from grader.worker import LearnerProcess

ROOT = Path(__file__).resolve().parents[1]
SOLUTION_03 = "solutions/03_self_attention/03_self_attention.ipynb"


def _sources_with(replacement: str, name: str) -> list[str]:
    cells = code_cells_of_notebook(nbformat.read(ROOT / SOLUTION_03, as_version=4))
    return [replacement if (c.lstrip().startswith(f"def {name}") or c.lstrip().startswith(f"class {name}")) else c
            for c in cells]


def test_learner_code_runs_in_another_process():
    src = "import os\n\ndef softmax_stable(x, dim=-1):\n    return torch.full_like(x, float(os.getpid()))\n"
    with LearnerProcess(_sources_with(src, "softmax_stable")) as proc:
        out = proc.call(lambda impl: impl.softmax_stable(torch.zeros(2)))
    assert int(out[0]) != os.getpid()


def test_a_tensor_subclass_comes_back_as_a_plain_tensor():
    src = ("class Sneaky(torch.Tensor):\n"
           "    def __eq__(self, other):\n        return True\n\n"
           "def softmax_stable(x, dim=-1):\n    return x.as_subclass(Sneaky)\n")
    with LearnerProcess(_sources_with(src, "softmax_stable")) as proc:
        out = proc.call(lambda impl: impl.softmax_stable(torch.ones(3)))
    assert type(out) is torch.Tensor


def test_objects_that_are_not_plain_data_come_back_opaque():
    src = "def softmax_stable(x, dim=-1):\n    return torch.nn.Linear(2, 2)\n"
    with LearnerProcess(_sources_with(src, "softmax_stable")) as proc:
        out = proc.call(lambda impl: impl.softmax_stable(torch.ones(3)))
    assert isinstance(out, Opaque) and "Linear" in repr(out) and out != out


def test_plain_round_trip_refuses_arbitrary_pickles():
    assert loads(dumps(plain({"a": (1, 2.5, "x", None, [torch.ones(2)])})))["a"][0] == 1
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError):
        loads(pickle.dumps(Evil()))


def test_a_worker_that_exits_fails_only_that_exercise():
    src = "import os\n\ndef softmax_stable(x, dim=-1):\n    os._exit(3)\n"
    verdicts = {v.exercise_id: v for v in run_unit("03", _sources_with(src, "softmax_stable"))}
    v = verdicts["03.softmax_stable"]
    assert v.status == "failed" and "ended before answering" in v.message and "status 3" in v.message
    assert all(x.passed for k, x in verdicts.items() if k != "03.softmax_stable")


def test_a_worker_that_exhausts_memory_is_reported(monkeypatch):
    monkeypatch.setenv("LLMCOURSE_WORKER_MEMORY_MB", "512")
    src = "def softmax_stable(x, dim=-1):\n    return torch.empty(4 * 1024 ** 3, dtype=torch.uint8).fill_(1)\n"
    v = run_check("03.softmax_stable", _sources_with(src, "softmax_stable"))
    assert v.status == "failed" and ("out of memory" in v.message or "ended before answering" in v.message), v.message


def test_a_probe_may_not_capture_its_expected_value():
    load_unit("03")
    spec = CHECKS["03.softmax_stable"]
    expected = torch.ones(2)
    t = _Tester(spec, {"softmax_stable": lambda x, dim=-1: x})
    with pytest.raises(RuntimeError, match="captures the expected value"):
        t.compare(lambda impl: impl.softmax_stable(expected), expected, "probe leak")


@pytest.mark.parametrize("src, name, exercise_id", [
    ("import llmcourse.nn.attention as A\n\ndef softmax_stable(x, dim=-1):\n    return A.softmax_stable(x, dim)\n",
     "softmax_stable", "03.softmax_stable"),
    ("import sys\n\ndef simple_attention(x):\n    return sys.modules['llmcourse.nn.attention'].simple_attention(x)\n",
     "simple_attention", "03.simple_attention"),
    ("import llmcourse.nn.attention as A\n\nclass SelfAttention(A.SelfAttention):\n    pass\n",
     "SelfAttention", "03.SelfAttention"),
])
def test_the_exercises_reference_is_off_limits(src, name, exercise_id):
    v = run_check(exercise_id, _sources_with(src, name))
    assert v.points == 0 and "course library" in v.render(), v.render()


def test_earlier_pieces_of_the_library_stay_usable():
    # unit 03's CausalSelfAttention may build on the library's softmax: only its own reference is blocked
    src = ("import llmcourse.nn.attention as A\n\n"
           "def softmax_stable(x, dim=-1):\n    return A.scaled_dot_product_attention(x, x, x)[1] * 0 + "
           "torch.softmax(x, dim=dim)\n")
    v = run_check("03.softmax_stable", _sources_with(src, "softmax_stable"))
    assert "course library" not in v.render()


def test_nothing_the_worker_prints_reaches_the_checker(capfd):
    src = "import sys\n\ndef softmax_stable(x, dim=-1):\n    print('LEAK'); sys.stderr.write('LEAK')\n    return x\n"
    run_check("03.softmax_stable", _sources_with(src, "softmax_stable"))
    captured = capfd.readouterr()
    assert "LEAK" not in captured.out and "LEAK" not in captured.err
