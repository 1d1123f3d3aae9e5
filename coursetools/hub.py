"""A local JupyterHub for the course on 127.0.0.1: ``make hub`` (``course hub``) and the browser test.

:class:`Hub` prepares a *state folder* (default ``.hub/`` in the checkout) and runs
``python -m jupyterhub -f hub/jupyterhub_config.py`` in it:

* ``settings.json`` (mode 0600): the ports, the user names, the two passwords, the exchange folder and the
  environment of the single-user servers, read by ``hub/jupyterhub_config.py``;
* ``homes/<user>/``: each user's HOME and JupyterLab root. Its ``.jupyter/nbgrader_config.py`` names the course
  (``llmcourse``) and the exchange; a student's also sets ``CourseDirectory.student_id`` to the hub user name
  (every server runs as the hub's OS user, so nbgrader's default, the OS user name, would be the same for
  everyone); its ``.jupyter/lab/user-settings`` holds JupyterLab settings given to :class:`Hub`;
* ``exchange/``: nbgrader's exchange (``course exchange release|collect|feedback --root`` it; in the users'
  terminals ``LLMCOURSE_EXCHANGE_ROOT`` names it, so ``--root`` can be left out);
* the hub's database, cookie secret, proxy pid file, log (``jupyterhub.log``) and ``servers/<user>.pid``.

The proxy is ``hub/node_modules/.bin/configurable-http-proxy`` (``make hub-deps``: ``npm ci --prefix hub``, the
version pinned by ``hub/package-lock.json``). Users log in with JupyterHub's shared-password authenticator: one
password for the students, another (32+ characters, JupyterHub's rule) for the instructor, who is the hub's
admin. Students get ``make lab``'s student configuration, the instructor ``make lab-instructor``'s.

:meth:`Hub.stop` stops the hub by its PID (SIGTERM; the hub stops every user's server and the proxy), then any
server whose pid file is left (its process group), then the users' warm ``course check`` servers.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .serverwait import wait_until_answering

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "hub" / "jupyterhub_config.py"
PROXY = ROOT / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
NODE_MAJOR = 20  # configurable-http-proxy 5.2's "engines"
COURSE_ID = "llmcourse"  # coursetools.exchange.COURSE_ID
EXCHANGE_ENV = "LLMCOURSE_EXCHANGE_ROOT"  # the default of `course exchange --root`
# environment of the hub's caller passed on to the users' servers (the rest is not: JupyterHub's rule)
PASS_ENV = ("LLMCOURSE_", "HF_", "TRANSFORMERS_", "OMP_", "PYTHONPATH")
NO_NEWS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                               "checkForUpdates": False}}

__all__ = ["Hub", "HubError", "missing", "main"]


class HubError(RuntimeError):
    """The hub could not be started; the message ends with the last lines of its log."""


def missing() -> str | None:
    """Why the hub cannot run here (JupyterHub or its proxy not installed), or None."""
    try:
        import jupyterhub  # noqa: F401
    except ImportError as exc:
        return f"JupyterHub is not installed ({exc}): run `make setup` (requirements.txt pins it)"
    if not (PROXY.is_file() and os.access(PROXY, os.X_OK)):
        return (f"JupyterHub's proxy is not installed ({PROXY} is missing): run `make hub-deps` "
                "(npm ci --prefix hub; needs Node.js >= 20 and npm)")
    node = shutil.which("node")
    if node is None:
        return "Node.js is not on the PATH: configurable-http-proxy needs it (Debian: apt-get install nodejs)"
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
        major = int(version.lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return f"{node} --version did not answer: configurable-http-proxy needs Node.js >= {NODE_MAJOR}"
    if major < NODE_MAJOR:
        return f"Node.js {version} is too old: configurable-http-proxy (hub/package.json) needs >= {NODE_MAJOR}"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Hub:
    """A JupyterHub on 127.0.0.1 with one instructor and some students (see the module docstring).

    Args:
        state: the state folder (created; kept between runs, so passwords and homes persist).
        port: the public port (0: a free one).
        students: the students' user names.
        instructor: the instructor's user name (the hub's admin).
        env: more environment variables for the users' servers (after those taken from this process).
        lab_settings: JupyterLab user settings written into every home, ``{relative file: JSON value}``.
        singleuser_args: more options for every ``jupyterhub-singleuser``.
    """

    def __init__(self, state: str | os.PathLike = ROOT / ".hub", port: int = 8000,
                 students: tuple[str, ...] = ("alice", "bob"), instructor: str = "instructor",
                 env: dict | None = None, lab_settings: dict | None = None, singleuser_args: list[str] | None = None):
        self.state = Path(state).resolve()
        self.port = port or free_port()
        self.students = tuple(students)
        self.instructor = instructor
        self.extra_env = dict(env or {})
        self.lab_settings = dict(NO_NEWS if lab_settings is None else lab_settings)
        self.singleuser_args = list(singleuser_args or [])
        self.url = f"http://127.0.0.1:{self.port}"
        self.exchange = self.state / "exchange"
        self.log_path = self.state / "jupyterhub.log"
        self.proc: subprocess.Popen | None = None
        self.student_password = self.instructor_password = ""

    # ------------------------------------------------------------------------------------ state

    def home(self, user: str) -> Path:
        return self.state / "homes" / user

    @property
    def users(self) -> tuple[str, ...]:
        return (self.instructor, *self.students)

    def _passwords(self) -> tuple[str, str]:
        old = self.state / "settings.json"
        try:
            s = json.loads(old.read_text(encoding="utf-8"))
            if len(s["student_password"]) >= 8 and len(s["instructor_password"]) >= 32:
                return s["student_password"], s["instructor_password"]
        except (OSError, ValueError, KeyError):
            pass
        return secrets.token_urlsafe(9), secrets.token_urlsafe(30)

    def server_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k.startswith(PASS_ENV) and k != EXCHANGE_ENV}
        env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", EXCHANGE_ENV: str(self.exchange)})
        env.update(self.extra_env)
        return env

    def prepare(self) -> Hub:
        """Create the state folder, the exchange, every user's home and the settings file."""
        if self.instructor in self.students:
            raise ValueError(f"{self.instructor!r} cannot be both the instructor and a student")
        self.state.mkdir(parents=True, exist_ok=True)
        self.exchange.mkdir(exist_ok=True)
        self.student_password, self.instructor_password = self._passwords()
        for user in self.users:
            home = self.home(user)
            cfg = home / ".jupyter" / "nbgrader_config.py"
            cfg.parent.mkdir(parents=True, exist_ok=True)
            lines = ["# written by coursetools/hub.py: the course and the hub's exchange",
                     "c = get_config()  # noqa: F821",
                     f"c.CourseDirectory.course_id = {COURSE_ID!r}",
                     f"c.Exchange.root = {str(self.exchange)!r}"]
            if user != self.instructor:
                # every server runs as the same OS user: name the student explicitly (fetch, submit, feedback)
                lines.append(f"c.CourseDirectory.student_id = {user!r}")
            cfg.write_text("\n".join(lines) + "\n", encoding="utf-8")
            for rel, value in self.lab_settings.items():
                path = home / ".jupyter" / "lab" / "user-settings" / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(value), encoding="utf-8")
        settings = {"state": str(self.state), "port": self.port, "hub_port": free_port(),
                    "proxy_api_port": free_port(), "students": list(self.students), "instructor": self.instructor,
                    "student_password": self.student_password, "instructor_password": self.instructor_password,
                    "env": self.server_env(), "singleuser_args": self.singleuser_args}
        path = self.state / "settings.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=2)
        os.chmod(path, 0o600)
        return self

    def release(self, unit_id: str) -> Path:
        """Release unit ``unit_id``'s exercise into the hub's exchange (nothing when it is already there)."""
        from llmcourse.manifest import load_course

        from . import exchange

        course = load_course()
        outbound = self.exchange / COURSE_ID / "outbound" / course.unit(unit_id).name
        if outbound.is_dir():
            return outbound
        return exchange.release(unit_id, self.exchange, course=course)

    # ------------------------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        return [sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)]

    def start(self, timeout: float = 120.0) -> Hub:
        """Start the hub (after :meth:`prepare`) and wait until it answers.

        Raises:
            HubError: the proxy is missing, the port is taken, or the hub exited or did not answer in time.
        """
        reason = missing()
        if reason:
            raise HubError(reason)
        if not _port_free(self.port):
            raise HubError(f"port {self.port} on 127.0.0.1 is taken (another hub?): choose another with --port")
        if not (self.state / "settings.json").is_file():
            self.prepare()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "JPY_", "CONFIGPROXY_"))}
        env["LLMCOURSE_HUB_SETTINGS"] = str(self.state / "settings.json")
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(self.command(), cwd=self.state, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        problem = wait_until_answering(self.proc, f"{self.url}/hub/api/", timeout)
        if problem is None:
            return self
        self.stop()
        raise HubError(f"jupyterhub {problem}:\n{self.log_tail()}")

    def running_servers(self) -> dict[str, int]:
        """``{user: pid}`` of the single-user servers the hub started and has not stopped."""
        out = {}
        for f in sorted((self.state / "servers").glob("*.pid")):
            try:
                out[f.stem] = int(f.read_text())
            except (OSError, ValueError):
                pass
        return out

    def stop(self) -> None:
        """Stop the hub by its PID (it stops the users' servers and the proxy), then anything left over."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc is not None:
            try:  # the proxy is the hub's child, in the hub's process group (start_new_session above)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for user, pid in self.running_servers().items():  # a server the hub could not stop
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            (self.state / "servers" / f"{user}.pid").unlink(missing_ok=True)
        self._stop_check_servers()
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None
        self.proc = None

    def _stop_check_servers(self) -> None:
        """Stop each user's warm ``course check`` server (coursetools/checkserver.py; they live in the homes)."""
        for user in self.users:
            home = self.home(user)
            if not (home / ".cache" / "llmcourse").is_dir():
                continue
            env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME")}
            env["HOME"] = str(home)
            subprocess.run([sys.executable, "-m", "coursetools", "check", "--stop-server"], env=env,
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Hub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(port: int = 8000, state: str | os.PathLike | None = None, units: tuple[str, ...] = ("03",)) -> int:
    """``make hub``: prepare and start the hub, release ``units``, print how to log in; stop on Ctrl-C."""
    reason = missing()
    if reason:
        print(f"course hub: {reason}", file=sys.stderr)
        return 2

    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    # Ctrl-C, a closed terminal or a plain `kill`: stop the hub (it runs in a session of its own, so no signal
    # reaches it otherwise), even where the caller started this process with SIGINT ignored
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    hub = Hub(state or ROOT / ".hub", port=port).prepare()
    for unit in units:
        try:
            print(f"unit {unit} is released in the hub's exchange: {hub.release(unit)}")
        except (FileNotFoundError, ValueError, KeyError, RuntimeError) as exc:
            print(f"course hub: unit {unit} not released: {exc}", file=sys.stderr)
    try:
        hub.start()
    except HubError as exc:
        print(f"course hub: {exc}", file=sys.stderr)
        return 1
    print(f"""
JupyterHub of the course: {hub.url}   (127.0.0.1 only; Ctrl-C stops it and every user's server)
  students   {', '.join(hub.students)}   password: {hub.student_password}
  instructor {hub.instructor}   password: {hub.instructor_password}
Students: Nbgrader > Assignment List, Fetch, solve, save, run the check cell, Submit.
Instructor (a terminal in JupyterLab; the exchange is {hub.exchange}):
  course exchange collect 03 --into ~/class
  course grade ~/class/.grading/submitted --out ~/class/work
  course exchange feedback 03 --work ~/class/work
State (homes, exchange, passwords, log): {hub.state}""", flush=True)
    try:
        while hub.proc is not None and hub.proc.poll() is None:
            time.sleep(1)
        print(f"course hub: jupyterhub exited (code {hub.proc.returncode}); its log:\n{hub.log_tail()}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping the hub ...", flush=True)
        return 0
    finally:
        hub.stop()
