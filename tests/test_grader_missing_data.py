"""A check that reads a data set missing on this machine says which one and where to put it (not "the grader
itself failed"): the error verdict carries the data loader's own message (URL and mirror variable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import json, sys, nbformat
from grader.runner import run_check, notebook_sources
from llmcourse.manifest import load_course
course = load_course()
unit = course.unit(sys.argv[1])
sources = notebook_sources(nbformat.read(course.root / unit.solution, as_version=4), unit)
v = run_check(sys.argv[2], list(sources))
print(json.dumps({"status": v.status, "message": v.message}))
"""


def test_a_missing_data_set_is_named_with_its_url_and_the_mirror_variable(tmp_path):
    env = dict(os.environ, LLMCOURSE_DATA_MIRROR=str(tmp_path / "no-mirror"), LLMCOURSE_CACHE=str(tmp_path / "cache"),
               LLMCOURSE_OFFLINE="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", SCRIPT, "01", "01.CharTokenizer"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout.strip().splitlines()[-1])
    assert v["status"] == "error", v
    assert "missing" in v["message"] and "https://" in v["message"] and "LLMCOURSE_DATA_MIRROR" in v["message"], v
    assert "grader itself failed" not in v["message"], v
