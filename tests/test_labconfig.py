"""The course's JupyterLab settings reach every way of starting it, and its terminal finds `course`.

* `make lab` / `course lab` load lab-config/jupyter_server_config.py: the server's PATH starts with the
  environment's bin folder and its terminal is lab-config/course-shell, a non-login shell that keeps it;
* a plain `jupyter lab` (Binder's postBuild, or `python -m coursetools.labconfig --sys-prefix`) reads the
  same student settings from the environment's prefix: nbgrader's instructor plugins disabled, as
  JupyterLab's own page-config reader sees them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from coursetools import labconfig

ROOT = Path(__file__).resolve().parents[1]
BIN = str(Path(sys.executable).parent)


def _load_server_config(path: Path):
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader(path.name, str(path.parent)).load_config()


def test_server_config_puts_the_environment_first_and_uses_the_course_shell(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    config = _load_server_config(labconfig.SERVER_CONFIG)
    assert os.environ["PATH"].split(os.pathsep)[0] == BIN
    shell = config.ServerApp.terminado_settings["shell_command"]
    assert shell == [str(ROOT / "lab-config" / "course-shell")] and os.access(shell[0], os.X_OK)


def test_the_terminal_shell_keeps_the_path_and_finds_course(tmp_path):
    env = {"PATH": BIN + os.pathsep + "/usr/bin:/bin", "SHELL": "/bin/sh", "HOME": str(tmp_path), "ENV": ""}
    out = subprocess.run([str(ROOT / "lab-config" / "course-shell")], input="command -v course\nexit\n",
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.stdout.strip().splitlines()[-1] == str(Path(BIN) / "course"), out.stdout + out.stderr


def test_plain_jupyter_lab_gets_the_student_settings_from_the_prefix(tmp_path, monkeypatch):
    (tmp_path / "etc" / "jupyter" / "labconfig").mkdir(parents=True)
    (tmp_path / "etc" / "jupyter" / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"some-other-plugin": True}}))
    written = labconfig.install(tmp_path)
    labconfig.install(tmp_path)  # twice: nothing duplicated
    assert all(p.exists() for p in written)
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path / "etc" / "jupyter"))
    from jupyterlab_server.config import get_page_config

    got = get_page_config([], app_settings_dir=None)["disabledExtensions"]
    disabled = set(got) if isinstance(got, list) else {k for k, v in got.items() if v}
    wanted = json.loads((ROOT / "lab-config" / "student" / "page_config.json").read_text())["disabledExtensions"]
    assert set(wanted) <= set(disabled) and "some-other-plugin" in disabled
    server = (tmp_path / "etc" / "jupyter" / "jupyter_server_config.py").read_text()
    assert server.count("load_subconfig") == 1
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    config = _load_server_config(tmp_path / "etc" / "jupyter" / "jupyter_server_config.py")
    assert config.ServerApp.terminado_settings["shell_command"][0].endswith("course-shell")


def test_make_lab_course_lab_and_binder_use_the_same_settings():
    makefile = (ROOT / "Makefile").read_text()
    assert '--config="$(CURDIR)/lab-config/jupyter_server_config.py"' in makefile
    cmd = labconfig.lab_command()
    assert f"--config={labconfig.SERVER_CONFIG}" in cmd and f"--LabApp.app_settings_dir={labconfig.STUDENT_SETTINGS}" in cmd
    assert not any("app_settings_dir" in a for a in labconfig.lab_command(instructor=True))
    assert "python -m coursetools.labconfig --sys-prefix" in (ROOT / "postBuild").read_text()
