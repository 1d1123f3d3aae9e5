# JupyterHub configuration of the course's local hub (`make hub`, tests/browser/test_browser_hub.py).
#
# Loaded by `python -m jupyterhub -f hub/jupyterhub_config.py`, which coursetools/hub.py starts with
# LLMCOURSE_HUB_SETTINGS naming a settings file (JSON, mode 0600) in the hub's state folder: ports,
# user names, passwords, the exchange folder and the single-user servers' environment. Everything
# listens on 127.0.0.1 only.
#
# For trying the course and for tests, never for a real class: every user's server runs as the hub's
# own OS user (SimpleLocalProcessSpawner), each with a HOME of its own under the state folder, so users
# are not isolated from each other. docs/classroom.md describes a deployment for a class.
import json
import os
import signal
import sys
from pathlib import Path

from jupyterhub.spawner import SimpleLocalProcessSpawner

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = json.loads(Path(os.environ["LLMCOURSE_HUB_SETTINGS"]).read_text(encoding="utf-8"))
STATE = Path(SETTINGS["state"])
BIN = Path(sys.executable).parent
PIDS = STATE / "servers"  # <user>.pid of every running single-user server (coursetools.hub stops leftovers)


def user_args(name: str) -> list[str]:
    """The options of user ``name``'s ``jupyterhub-singleuser``: `make lab`'s server config for everyone,
    the student settings (lab-config/student: nbgrader's instructor tools disabled) for every student."""
    args = [f"--config={ROOT / 'lab-config' / 'jupyter_server_config.py'}"]
    if name != SETTINGS["instructor"]:
        args.append(f"--LabApp.app_settings_dir={ROOT / 'lab-config' / 'student'}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")
    return args + list(SETTINGS.get("singleuser_args", []))


class CourseSpawner(SimpleLocalProcessSpawner):
    """A single-user JupyterLab per user, as the hub's OS user, HOME = <state>/homes/<name>.

    Students get the student configuration of `make lab` (lab-config/student: nbgrader's instructor
    tools disabled); the instructor gets every nbgrader tool (`make lab-instructor`). Both load
    lab-config/jupyter_server_config.py (the terminal finds `course`).
    """

    def get_args(self):
        return super().get_args() + user_args(self.user.name)

    async def start(self):
        out = await super().start()
        PIDS.mkdir(parents=True, exist_ok=True)
        (PIDS / f"{self.user.name}.pid").write_text(str(self.pid))
        return out

    async def stop(self, now=False):
        pid = self.pid
        await super().stop(now=now)
        (PIDS / f"{self.user.name}.pid").unlink(missing_ok=True)
        if pid:  # the server's kernels and terminals live in its process group (its own session)
            try:
                os.killpg(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass


# ------------------------------------------------------------------------------------------ network
c.JupyterHub.bind_url = f"http://127.0.0.1:{SETTINGS['port']}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{SETTINGS['hub_port']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{SETTINGS['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [str(ROOT / "hub" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.Spawner.ip = "127.0.0.1"

# ------------------------------------------------------------------------------------------ state
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server
c.JupyterHub.cleanup_proxy = True

# ------------------------------------------------------------------------------------------ users
# JupyterHub's built-in test authenticator: one password for the students, a longer one for the instructor
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = SETTINGS["student_password"]
c.SharedPasswordAuthenticator.admin_password = SETTINGS["instructor_password"]
c.Authenticator.allowed_users = set(SETTINGS["students"])
c.Authenticator.admin_users = {SETTINGS["instructor"]}

# ------------------------------------------------------------------------------------------ servers
c.JupyterHub.spawner_class = CourseSpawner
c.SimpleLocalProcessSpawner.home_dir_template = str(STATE / "homes" / "{username}")
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
# a cold JupyterLab on a loaded 2-core machine can take a while to answer
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
# JupyterHub passes none of its own environment but this: the course environment's bin first (`course`,
# `nbgrader`, the kernel), plus what coursetools.hub chose (data mirror, profile, offline switches)
c.Spawner.environment = {
    "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")]),
    "LANG": os.environ.get("LANG", "C.UTF-8"),
    **SETTINGS.get("env", {}),
}
