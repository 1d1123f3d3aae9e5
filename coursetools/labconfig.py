"""The student configuration of JupyterLab, for every way of starting it.

``make lab`` passes it on the command line (``--LabApp.app_settings_dir=lab-config/student`` and
``--config=lab-config/jupyter_server_config.py``), and so does ``course lab`` (for a conda environment).
A plain ``jupyter lab`` (Binder, or a conda user who types it) reads only the Jupyter config path, so
``python -m coursetools.labconfig --sys-prefix`` (Binder's ``postBuild``) installs the same settings
under the environment's prefix:

* ``etc/jupyter/labconfig/page_config.json``: the disabled nbgrader instructor plugins of
  ``lab-config/student/page_config.json``, merged with what is there (in the ``{name: true}`` form that
  JupyterLab expects on the config path);
* ``etc/jupyter/jupyter_server_config.py``: loads ``lab-config/jupyter_server_config.py`` (the terminal
  finds ``course``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB_CONFIG = ROOT / "lab-config"
STUDENT_SETTINGS = LAB_CONFIG / "student"
SERVER_CONFIG = LAB_CONFIG / "jupyter_server_config.py"

__all__ = ["install", "lab_command", "main"]


def lab_command(instructor: bool = False, extra: list[str] | None = None) -> list[str]:
    """The ``jupyter lab`` command line of the course's lab (what ``make lab`` runs)."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--config={SERVER_CONFIG}", f"--ServerApp.root_dir={ROOT}",
           "--LabApp.default_url=/lab/tree/course_home.ipynb"]
    if not instructor:
        cmd.append(f"--LabApp.app_settings_dir={STUDENT_SETTINGS}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd + list(extra or [])


def install(prefix: str | os.PathLike) -> list[Path]:
    """Write the student settings under ``prefix``/etc/jupyter; returns the files written."""
    etc = Path(prefix) / "etc" / "jupyter"
    page = etc / "labconfig" / "page_config.json"
    page.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(page.read_text()) if page.exists() else {}
    wanted = json.loads((STUDENT_SETTINGS / "page_config.json").read_text())
    disabled = current.get("disabledExtensions", {})
    if isinstance(disabled, list):  # the config path's page_config takes the form {name: true}
        disabled = dict.fromkeys(disabled, True)
    current["disabledExtensions"] = {**disabled, **dict.fromkeys(wanted["disabledExtensions"], True)}
    page.write_text(json.dumps(current, indent=2) + "\n")
    server = etc / "jupyter_server_config.py"
    line = f"load_subconfig({str(SERVER_CONFIG)!r})  # the course's lab settings (coursetools/labconfig.py)\n"
    text = server.read_text() if server.exists() else ""
    if line not in text:
        server.write_text(text + line)
    return [page, server]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--sys-prefix" in argv:
        for path in install(sys.prefix):
            print(f"wrote {path}")
        return 0
    return subprocess.call(lab_command("--instructor" in argv, [a for a in argv if a != "--instructor"]))


if __name__ == "__main__":
    sys.exit(main())
