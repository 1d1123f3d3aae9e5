"""Learner code that signals or outlives the processes supervising it (issue: grading no submission can stall).

Unit 03's solution with ``softmax_stable`` replaced by a wrong answer that first attacks
(:func:`conftest.hostile_code`): SIGSTOP / SIGKILL / SIGTERM to the worker's parent (the forkserver) and
to its own process group, a forked daemon, ``os.setsid`` and a long sleep, closing the result pipe or
writing garbage into it. Each run must end in bounded time, give that exercise 0 and grade the four other
exercises (17 points), kill every daemon, and leave a working forkserver for the next submission.

As root (CI) a worker runs as ``nobody`` and its signals to the forkserver fail; with
``LLMCOURSE_WORKER_NOBODY=0`` they land, which is what grading as an ordinary user looks like: then the
forkserver is found stopped or dead, replaced, and the exercise scores 0 with "the submission stopped
the grading process". The attacks only ever signal processes below this test process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest
import torch
from hostile import HOSTILE_KINDS, hostile_code, surviving_daemons

from grader import forkserver
from grader.extract import code_cells_of_notebook
from grader.runner import run_unit
from grader.supervise import STOPPED_NOTE, state
from grader.worker import LearnerProcess

ROOT = Path(__file__).resolve().parents[1]
SOLUTION_03 = ROOT / "solutions/03_self_attention/03_self_attention.ipynb"
pytestmark = pytest.mark.slow
WALL_LIMIT_S = 150.0  # the setsid + sleep case waits for the 30 s check limit; the others take seconds


def _sources(top: str, body: str) -> list[str]:
    cells = code_cells_of_notebook(nbformat.read(SOLUTION_03, as_version=4))
    wrong = f"def softmax_stable(x, dim=-1):\n{body}    return x\n"
    return [top] + [wrong if c.lstrip().startswith("def softmax_stable") else c for c in cells]


def _attacked(tmp_path, kind: str):
    marks = tmp_path / "marks"
    started = time.monotonic()
    verdicts = {v.exercise_id: v for v in run_unit("03", _sources(hostile_code(marks), f"    _hostile({kind!r})\n"))}
    return verdicts, time.monotonic() - started, marks


def _assert_contained(verdicts, wall, marks):
    assert wall < WALL_LIMIT_S, wall
    assert verdicts["03.softmax_stable"].points == 0, verdicts["03.softmax_stable"].render()
    others = {k: v for k, v in verdicts.items() if k != "03.softmax_stable"}
    assert all(v.passed for v in others.values()), [v.render() for v in others.values()]
    assert sum(v.points for v in verdicts.values()) == 17
    assert not surviving_daemons(marks)
    assert forkserver.healthy() and state(forkserver.pid()) not in (None, "T", "Z")


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_an_attack_costs_its_exercise_only(tmp_path, kind):
    forkserver.start_forkserver()
    before = forkserver.pid()
    verdicts, wall, marks = _attacked(tmp_path, kind)
    _assert_contained(verdicts, wall, marks)
    if os.geteuid() == 0:  # as nobody, nothing reaches the forkserver (signals, its "alive" pipe)
        assert forkserver.pid() == before
    if kind == "daemon":
        assert list(marks.glob("daemon-*")), "the daemon never started: the case proves nothing"


@pytest.mark.parametrize("kind", [k for k in HOSTILE_KINDS if k.endswith(("_parent", "_group"))])
def test_an_attack_that_lands_on_the_forkserver_is_contained(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("LLMCOURSE_WORKER_NOBODY", "0")  # the grading user's own identity: signals land
    before = forkserver.pid()
    verdicts, wall, marks = _attacked(tmp_path, kind)
    _assert_contained(verdicts, wall, marks)
    message = verdicts["03.softmax_stable"].message
    if kind.endswith("_parent"):
        assert STOPPED_NOTE in message.lower() and forkserver.pid() != before, message
    elif kind == "stop_group":
        assert STOPPED_NOTE in message.lower(), message


def test_a_worker_is_confined():
    src = ("import os\n\ndef softmax_stable(x, dim=-1):\n"
           "    try:\n        os.kill(os.getppid(), 0)\n        signal_parent = 1\n    except PermissionError:\n"
           "        signal_parent = 0\n"
           "    return torch.tensor([float(os.getsid(0) == os.getpid()), float(os.getuid()), float(signal_parent)])\n")
    cells = [src if c.lstrip().startswith("def softmax_stable") else c
             for c in code_cells_of_notebook(nbformat.read(SOLUTION_03, as_version=4))]
    with LearnerProcess(cells) as proc:
        own_session, uid, signal_parent = proc.call(lambda impl: impl.softmax_stable(torch.zeros(1))).tolist()
    assert own_session == 1.0
    if os.geteuid() == 0:
        assert uid == 65534.0 and signal_parent == 0.0
