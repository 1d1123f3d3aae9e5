"""A correct answer earns full points on every CPU: the grader's self-test under other processors' kernels.

torch picks its float32 kernels by processor (generic, AVX2, AVX-512 on x86; NEON on arm64) and the order of a
reduction by thread count, so a correct answer's output differs from the reference by a few float32 ulps from one
machine to the next. `ATEN_CPU_CAPABILITY` forces the kernels of a processor with fewer features, which is how a
student's machine is imitated here; `LLMCOURSE_WORKER_THREADS` sets the learner worker's torch threads. Under each
combination, every solution must earn full points (unit 08's and 11's stored transformers oracles included: a
stored-oracle check passes the reference under the generic kernels) and every catalogued mutant must fail with its
own name (tests/test_grader_selftest.py, run in a fresh process so that the variable takes effect).

Cost: one self-test run is about a minute on an idle 2-core machine; four runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

COMBINATIONS = [("default", 1), ("default", 3), ("avx2", 1), ("avx2", 3)]


@pytest.mark.parametrize("capability,threads", COMBINATIONS, ids=[f"{c}-{t}threads" for c, t in COMBINATIONS])
def test_self_test_passes_under_other_cpu_kernels(capability, threads):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "LLMCOURSE_WORKER_THREADS": str(threads),
           "LLMCOURSE_PROFILE": "ci"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--no-header",
           "tests/test_grader_selftest.py", "-k", "solution_passes or mutant_fails"]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}, {threads} worker threads:\n{run.stdout[-6000:]}"


def test_the_capability_variable_takes_effect():
    """The imitation is real: a fresh process under ATEN_CPU_CAPABILITY=default reports the generic kernels."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() in {"DEFAULT", "default", "NO AVX"}, out.stdout + out.stderr


def test_comparisons_allow_float32_rounding_at_the_outputs_scale_and_nothing_more():
    from grader.core import FLOAT32_EPS, _same, describe_difference

    expected = torch.tensor([17.0, -0.366343, 3.0])
    other_cpu = expected.clone()
    other_cpu[1] += 8 * FLOAT32_EPS * 17  # a few ulps at the output's scale, on a small element (issue 35: 1.58e-5)
    assert not torch.allclose(other_cpu, expected, atol=1e-5, rtol=1e-5)  # what the checks used to require
    assert _same(other_cpu, expected, atol=1e-5, rtol=1e-5)
    wrong = expected.clone()
    wrong[1] *= 1.001  # a real mistake is relative to the output itself
    assert not _same(wrong, expected, atol=1e-5, rtol=1e-5)
    assert "float32 rounding at the output's scale" in describe_difference(wrong, expected, 1e-5, 1e-5)
    assert not _same(other_cpu, expected, atol=0, rtol=0)  # exact stays exact
    assert _same(torch.tensor([1, 2]), torch.tensor([1, 2]), 1e-5, 1e-5)
    assert not _same(1.0 + 1e-3, 1.0, atol=1e-6, rtol=1e-6)


def test_stored_oracle_comparison_allows_the_same_rounding():
    from grader.core import FLOAT32_EPS
    from grader.oracles import assert_same

    stored = {"y": torch.tensor([17.0, -0.366343])}
    rebuilt = {"y": stored["y"] + torch.tensor([0.0, 8 * FLOAT32_EPS * 17])}
    assert_same(stored, rebuilt)
    with pytest.raises(AssertionError, match="oracle.y"):
        assert_same(stored, {"y": stored["y"] * 1.001})
