"""The local JupyterHub's configuration (coursetools/hub.py, hub/jupyterhub_config.py), without starting it.

tests/browser/test_browser_hub.py runs the hub for real; these check what it would be started with:
127.0.0.1 only, the student settings of `make lab` for students and not for the instructor, each user's
nbgrader identity and exchange, the passwords file, the pins of JupyterHub and its proxy.
"""

from __future__ import annotations

import json
import runpy
import stat
from pathlib import Path

import pytest

from coursetools import hub as hubmod

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("jupyterhub", reason="JupyterHub is not installed: run `make setup` (requirements.txt pins it)")


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMCOURSE_PROFILE", "ci")
    monkeypatch.setenv("SECRET_TOKEN_OF_THE_CALLER", "x")
    return hubmod.Hub(tmp_path / "state", port=0, students=("ada", "bo")).prepare()


def _config(hub, monkeypatch) -> tuple:
    from traitlets.config import Config

    monkeypatch.setenv("LLMCOURSE_HUB_SETTINGS", str(hub.state / "settings.json"))
    c = Config()
    ns = runpy.run_path(str(hubmod.CONFIG), init_globals={"get_config": lambda: c})
    return c, ns


def test_everything_listens_on_127_0_0_1(prepared, monkeypatch):
    c, _ = _config(prepared, monkeypatch)
    settings = json.loads((prepared.state / "settings.json").read_text())
    assert c.JupyterHub.bind_url == f"http://127.0.0.1:{prepared.port}"
    assert c.JupyterHub.hub_bind_url == f"http://127.0.0.1:{settings['hub_port']}"
    assert c.ConfigurableHTTPProxy.api_url == f"http://127.0.0.1:{settings['proxy_api_port']}"
    assert c.Spawner.ip == "127.0.0.1"
    assert c.ConfigurableHTTPProxy.command == [str(hubmod.PROXY)]
    assert len({prepared.port, settings["hub_port"], settings["proxy_api_port"]}) == 3


def test_students_get_the_student_lab_and_the_instructor_the_instructor_tools(prepared, monkeypatch):
    c, ns = _config(prepared, monkeypatch)
    student_settings = f"--LabApp.app_settings_dir={ROOT / 'lab-config' / 'student'}"
    server_config = f"--config={ROOT / 'lab-config' / 'jupyter_server_config.py'}"
    for student in ("ada", "bo"):
        assert student_settings in ns["user_args"](student) and server_config in ns["user_args"](student)
    assert student_settings not in ns["user_args"]("instructor")
    assert server_config in ns["user_args"]("instructor")
    assert c.Authenticator.allowed_users == {"ada", "bo"} and c.Authenticator.admin_users == {"instructor"}
    assert c.JupyterHub.authenticator_class == "shared-password"
    assert c.SimpleLocalProcessSpawner.home_dir_template == str(prepared.state / "homes" / "{username}")
    env = c.Spawner.environment
    assert env["PATH"].split(":")[0] == str(Path(hubmod.sys.executable).parent), "`course` first on the PATH"
    assert env["LLMCOURSE_EXCHANGE_ROOT"] == str(prepared.exchange) and env["LLMCOURSE_PROFILE"] == "ci"
    assert "SECRET_TOKEN_OF_THE_CALLER" not in env, "only the course's variables reach the users' servers"


def test_each_user_has_a_home_with_their_nbgrader_identity(prepared):
    from traitlets.config.loader import PyFileConfigLoader

    for user in ("ada", "bo", "instructor"):
        cfg_file = prepared.home(user) / ".jupyter" / "nbgrader_config.py"
        cfg = PyFileConfigLoader(cfg_file.name, str(cfg_file.parent)).load_config()
        assert cfg.CourseDirectory.course_id == "llmcourse"
        assert cfg.Exchange.root == str(prepared.exchange)
        # every server runs as one OS user: a student is named explicitly, the instructor is no student
        if user == "instructor":
            assert "student_id" not in cfg.CourseDirectory
        else:
            assert cfg.CourseDirectory.student_id == user
    news = prepared.home("ada") / ".jupyter" / "lab" / "user-settings" / next(iter(hubmod.NO_NEWS))
    assert json.loads(news.read_text())["fetchNews"] == "false"


def test_passwords_are_private_long_enough_and_kept(prepared):
    path = prepared.state / "settings.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = (prepared.student_password, prepared.instructor_password)
    assert len(first[0]) >= 8 and len(first[1]) >= 32 and first[0] != first[1]  # JupyterHub's rules
    again = hubmod.Hub(prepared.state, port=0, students=("ada", "bo")).prepare()
    assert (again.student_password, again.instructor_password) == first


def test_the_instructor_cannot_be_a_student(tmp_path):
    with pytest.raises(ValueError, match="both"):
        hubmod.Hub(tmp_path, students=("instructor",)).prepare()


def test_exchange_root_defaults_to_the_hubs(monkeypatch, tmp_path):
    from coursetools import cli, exchange

    seen = {}
    monkeypatch.setattr(exchange, "release", lambda unit, root: seen.setdefault("root", root) or tmp_path)
    monkeypatch.setenv("LLMCOURSE_EXCHANGE_ROOT", str(tmp_path / "ex"))
    assert cli.main(["exchange", "release", "03"]) == 0
    assert seen["root"] == str(tmp_path / "ex")
    monkeypatch.delenv("LLMCOURSE_EXCHANGE_ROOT")
    seen.clear()
    assert cli.main(["exchange", "release", "03"]) == 0
    assert seen["root"] == "/srv/nbgrader/exchange"


def test_jupyterhub_and_its_proxy_are_pinned():
    reqs = (ROOT / "requirements.txt").read_text()
    import jupyterhub

    assert f"jupyterhub=={jupyterhub.__version__}\n" in reqs
    package = json.loads((ROOT / "hub" / "package.json").read_text())
    pin = package["dependencies"]["configurable-http-proxy"]
    assert pin[0].isdigit(), f"pin configurable-http-proxy exactly, not {pin}"
    lock = json.loads((ROOT / "hub" / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/configurable-http-proxy"]["version"] == pin


def test_make_hub_and_make_test_install_the_proxy():
    text = (ROOT / "Makefile").read_text()
    assert "\nhub: setup hub-deps\n\t$(VENV)/bin/course hub" in text
    assert "\ntest: setup browser-deps hub-deps\n" in text
    assert "npm ci --prefix hub" in text and "npm install -g" not in text
