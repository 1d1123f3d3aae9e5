# Server settings of the course's JupyterLab (`make lab`, `make lab-instructor`, `course lab`), loaded with
# `--config`: JupyterLab's terminal finds `course`.
#
# The terminal is a shell started by the server. Put the bin folder of the environment the server runs in
# (.venv/bin, or the conda environment's) first on the PATH it inherits, and start an interactive, non-login
# shell (lab-config/course-shell): a login shell would read /etc/profile, which resets PATH on many systems.
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

_bin = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("VIRTUAL_ENV", str(Path(sys.executable).parent.parent))
c.ServerApp.terminado_settings = {"shell_command": [str(Path(__file__).resolve().parent / "course-shell")]}
