"""The pip requirements and environment.yml pin the same packages at the same versions."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pins(lines):
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip().lstrip("-").strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_requirements_and_environment_yml_agree():
    pip = _pins((ROOT / "requirements.txt").read_text().splitlines() + (ROOT / "requirements-dev.txt").read_text().splitlines())
    conda = _pins((ROOT / "environment.yml").read_text().splitlines())
    assert pip, "no pins found in requirements*.txt"
    assert pip == conda, f"only in pip: {set(pip.items()) - set(conda.items())}; only in conda: {set(conda.items()) - set(pip.items())}"


def test_every_runtime_requirement_is_pinned_and_torch_is_exact():
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            assert "==" in line, f"unpinned requirement: {line}"
    pins = _pins((ROOT / "requirements.txt").read_text().splitlines())
    assert pins["torch"] == "2.13.0"
    assert int(pins["jupyterlab"].split(".")[0]) < 5 and int(pins["notebook"].split(".")[0]) < 8  # nbgrader 0.9


def test_installed_versions_match_the_pins():
    import importlib.metadata as md

    for name, version in _pins((ROOT / "requirements.txt").read_text().splitlines()).items():
        assert md.version(name).split("+", 1)[0] == version, name
