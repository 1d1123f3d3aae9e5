"""A class on the course's JupyterHub (``make hub``, coursetools/hub.py), in a real browser.

The hub of ``make hub`` on 127.0.0.1 (free ports, a temporary state folder): JupyterHub with its proxy
(configurable-http-proxy from ``make hub-deps``), one student and the instructor, each logging in with
JupyterHub's shared-password authenticator into their own JupyterLab and HOME. One cycle of unit 03:

1. the instructor logs in: JupyterLab has nbgrader's instructor tools; in a JupyterLab terminal,
   ``course exchange release 03`` (the hub sets ``LLMCOURSE_EXCHANGE_ROOT``, so no ``--root``);
2. the student logs in: the student configuration of ``make lab`` (no instructor tools); Nbgrader >
   Assignment List, Fetch, open the notebook from the list, write one exercise's answer (the solution's
   cell), save, run the check cell: the table passes that exercise and only it; Submit from the list;
3. the instructor, in the same terminal: ``course exchange collect``, ``course grade``,
   ``course exchange feedback``. Grading runs from the terminal because the course's scores come from its
   isolated checker (``course grade``), not from the Formgrader's nbgrader autograde button;
4. the student presses Fetch Feedback and gets their feedback file.

Skipped (saying why) where Chromium, JupyterHub or the proxy is missing (``make browser-deps``,
``make setup``, ``make hub-deps``).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from jlab import ARTIFACTS, LAB_SETTINGS, ROOT, js, mark_cells, open_tab, wait_until_done

from coursetools import hub as hubmod

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STUDENT = "ada"
UNIT_ID = "03"
SOLVED = "ex03_softmax_stable_answer"  # the one exercise the student solves
INSTRUCTOR_PLUGINS = ["@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:formgrader",
                      "@jupyter/nbgrader:course-list"]
STUDENT_PLUGINS = ["@jupyter/nbgrader:validate-assignment", "@jupyter/nbgrader:assignment-list"]


@pytest.fixture(scope="module")
def hub(browser, tmp_path_factory):
    reason = hubmod.missing()
    if reason:
        pytest.skip(reason)
    env = {"LLMCOURSE_PROFILE": "ci", "LLMCOURSE_WIDGETS": "live",
           "LLMCOURSE_MAX_TORCH_THREADS": os.environ.get("LLMCOURSE_MAX_TORCH_THREADS", "1"),
           "LLMCOURSE_CHECK_SERVER": "0",  # a cold check: no detached check server outlives the test
           "PYTHONUNBUFFERED": "1"}
    h = hubmod.Hub(tmp_path_factory.mktemp("hub") / "state", port=0, students=(STUDENT,), env=env,
                   lab_settings=LAB_SETTINGS,
                   singleuser_args=["--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
                                    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"])
    h.prepare()
    try:
        h.start()
        yield h
    finally:
        h.stop()
        if h.log_path.is_file():  # the hub's log, with every user's server's (they write to the hub's output)
            ARTIFACTS.mkdir(exist_ok=True)
            shutil.copy2(h.log_path, ARTIFACTS / "hub-jupyterhub.log")


def _login(browser, hub, user: str, password: str, shots):
    tab = open_tab(browser)
    shots.watch(tab.page, user)
    page = tab.page
    page.goto(f"{hub.url}/hub/login", wait_until="domcontentloaded")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    # the hub spawns the user's JupyterLab and redirects to it
    page.wait_for_url(re.compile(rf"/user/{user}/lab"), timeout=240_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=120_000)
    # every plugin activated and the layout restored (JupyterLab's own promises)
    page.evaluate("async () => { await window.jupyterapp.started; await window.jupyterapp.restored; }")
    return tab


def _activated(page) -> dict:
    return page.evaluate("() => Object.fromEntries(window.jupyterapp.listPlugins().map("
                         "p => [p, window.jupyterapp.isPluginActivated(p)]))")


def _terminal(page):
    """A JupyterLab terminal (File > New > Terminal's command), once its shell is connected."""
    page.evaluate("async () => { await window.jupyterapp.commands.execute('terminal:create-new'); }")
    page.wait_for_function("""() => {
      for (const w of window.jupyterapp.shell.widgets('main')) {
        const s = w.content && w.content.session;
        if (s && s.connectionStatus === 'connected' && w.node.querySelector('.xterm')) return true;
      }
      return false;
    }""", timeout=60_000)
    return page.locator(".jp-Terminal").last


def _type(page, terminal, command: str) -> None:
    terminal.click()
    page.keyboard.type(command)
    page.keyboard.press("Enter")


def _wait_file(path: Path, timeout: float, what: str, log: Path | None = None) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.5)
    extra = log.read_text(errors="replace")[-3000:] if log is not None and log.is_file() else ""
    raise AssertionError(f"{what}: {path} did not appear within {timeout:.0f} s\n{extra}")


def _run_in_terminal(page, terminal, home: Path, name: str, command: str, timeout: float) -> str:
    """Type ``command`` (output to ~/name.log) and wait for its exit code in ~/name.done; returns the log."""
    _type(page, terminal, f"{command} > ~/{name}.log 2>&1; echo $? > ~/{name}.done")
    code = _wait_file(home / f"{name}.done", timeout, name, home / f"{name}.log")
    log = (home / f"{name}.log").read_text(errors="replace")
    assert code == "0", f"`{command}` exited with {code}:\n{log[-3000:]}"
    return log


def _answer(unit, grade_id: str) -> str:
    solution = nbformat.read(str(ROOT / unit.solution), as_version=4)
    for c in solution.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return "\n".join(ln for ln in c.source.splitlines()
                             if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
    raise KeyError(grade_id)


def test_the_hub_and_every_server_listen_on_127_0_0_1_only(hub):
    import json

    settings = json.loads((hub.state / "settings.json").read_text())
    assert (hub.state / "settings.json").stat().st_mode & 0o077 == 0, "the passwords file is readable by others"
    log = hub.log_path.read_text(errors="replace")
    assert f"JupyterHub is now running at http://127.0.0.1:{hub.port}" in log, log[-2000:]
    assert f"Hub API listening on http://127.0.0.1:{settings['hub_port']}/hub/" in log, log[-2000:]
    assert f"Proxy API at http://{settings['proxy_api_port']}:127.0.0.1" in log or \
        f"Proxy API at http://127.0.0.1:{settings['proxy_api_port']}" in log, log[-2000:]


@pytest.mark.timeout(900)
def test_a_class_on_the_hub_release_fetch_check_submit_grade_feedback(browser, hub, shots):
    from llmcourse.manifest import load_course

    unit = load_course(ROOT).unit(UNIT_ID)
    if not unit.available:
        pytest.skip(f"unit {UNIT_ID} is not available")
    name = unit.name
    nb_path = f"{name}/{Path(unit.exercise).name}"
    teacher_home, student_home = hub.home(hub.instructor), hub.home(STUDENT)
    t0 = time.monotonic()
    timings = {}

    # 1. the instructor logs in (instructor tools) and releases unit 03 from a JupyterLab terminal
    teacher = _login(browser, hub, hub.instructor, hub.instructor_password, shots)
    tpage = teacher.page
    active = _activated(tpage)
    for plugin in INSTRUCTOR_PLUGINS + STUDENT_PLUGINS:
        assert active.get(plugin), f"{plugin} is not active in the instructor's lab"
    term = _terminal(tpage)
    out = _run_in_terminal(tpage, term, teacher_home, "release", f"course exchange release {UNIT_ID}", 180)
    assert (hub.exchange / "llmcourse" / "outbound" / name / Path(unit.exercise).name).is_file(), out
    timings["instructor login + release"] = time.monotonic() - t0

    # 2. the student logs in (student tools only), fetches from the Assignment List, solves one exercise
    student = _login(browser, hub, STUDENT, hub.student_password, shots)
    page = student.page
    active = _activated(page)
    for plugin in INSTRUCTOR_PLUGINS:
        assert not active.get(plugin), f"{plugin} is active in a student's lab"
    for plugin in STUDENT_PLUGINS:
        assert active.get(plugin), f"{plugin} is not active in a student's lab"
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).first.click()
    page.locator(".lm-Menu:visible .lm-Menu-itemLabel").get_by_text("Assignment List", exact=True).click()
    released = page.locator("#released_assignments_list")
    released.get_by_text(name).wait_for(timeout=60_000)
    released.get_by_role("button", name="Fetch").click()
    fetched = page.locator("#fetched_assignments_list")
    fetched.get_by_role("button", name="Submit").wait_for(timeout=60_000)
    assert (student_home / nb_path).is_file(), "Fetch did not put the notebook in the student's home"
    fetched.locator("a.assignment-notebooks-link", has_text=name).click()  # shows the assignment's notebooks
    fetched.locator(f"#nbgrader-llmcourse-{name}").get_by_text(Path(unit.exercise).stem, exact=True).click()
    page.wait_for_function(js("return !!findPanel(arg);"), arg=nb_path, timeout=120_000)
    page.wait_for_function(js("""
      const p = findPanel(arg); const k = p && p.sessionContext.session && p.sessionContext.session.kernel;
      return !!k && k.status === 'idle';"""), arg=nb_path, timeout=180_000)
    assert page.evaluate(js("return findPanel(arg).sessionContext.session.kernel.name;"), nb_path) == "llmcourse"
    cells = mark_cells(page, nb_path)
    answer = _answer(unit, SOLVED)
    page.evaluate(js("""
      const [path, gid, src] = arg;
      for (const c of findPanel(path).content.widgets)
        if ((c.model.getMetadata('nbgrader') || {}).grade_id === gid) c.model.sharedModel.setSource(src);
    """), [nb_path, SOLVED, answer])
    page.locator(f'[data-llmtest-index="{cells[0]["index"]}"]').click()
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    page.wait_for_function(js("return !findPanel(arg).context.model.dirty;"), arg=nb_path, timeout=30_000)
    first = next(c for c in cells if c["type"] == "code")
    last = cells[-1]
    assert last["type"] == "code" and last["source"] == "llmcourse.check()", last
    for cell, limit in ((first, 180), (last, 400)):
        page.locator(f'[data-llmtest-index="{cell["index"]}"] .jp-InputPrompt').click()
        page.keyboard.press("Control+Enter")
        wait_until_done(page, nb_path, timeout=limit)
    out = page.locator(f'[data-llmtest-index="{last["index"]}"] .jp-OutputArea')
    table = out.locator(".llmcourse-check-table")
    assert table.count() == 1, f"no check table; the cell printed:\n{out.inner_text()[:1500]}"
    rows = table.locator("tr.llmcourse-check-row")
    status = dict(zip(rows.evaluate_all("rs => rs.map(r => r.dataset.exercise)"),
                      rows.evaluate_all("rs => rs.map(r => r.dataset.status)")))
    assert status.pop(f"{UNIT_ID}.softmax_stable") == "passed", status
    assert set(status.values()) == {"not_attempted"}, status
    ARTIFACTS.mkdir(exist_ok=True)
    out.screenshot(path=str(ARTIFACTS / "hub-check-03.png"))
    timings["student login, fetch, solve, check"] = time.monotonic() - t0 - sum(timings.values())

    # ... and submits from the Assignment List
    page.locator(".lm-TabBar-tab", has_text="Assignments").first.click()
    fetched.get_by_role("button", name="Submit").click()
    page.locator("#submitted_assignments_list").get_by_text(name).first.wait_for(timeout=60_000)
    inbound = sorted((hub.exchange / "llmcourse" / "inbound").glob(f"{STUDENT}+{name}+*"))
    assert len(inbound) == 1, inbound
    submitted = nbformat.read(str(inbound[0] / Path(unit.exercise).name), as_version=4)
    assert any(c.source == answer for c in submitted.cells), "the submission is not the saved notebook"

    # 3. the instructor collects, grades and releases feedback from the same terminal
    t1 = time.monotonic()
    _run_in_terminal(tpage, term, teacher_home, "collect", f"course exchange collect {UNIT_ID} --into ~/class", 180)
    _run_in_terminal(tpage, term, teacher_home, "grade",
                     "course grade ~/class/.grading/submitted --out ~/class/work", 600)
    with (teacher_home / "class" / "work" / "grades.csv").open(newline="") as fh:
        grades = list(csv.DictReader(fh))
    points = next(e.points for e in unit.exercises if e.grade_id == SOLVED.removesuffix("_answer"))
    assert [(g["student"], g["assignment"]) for g in grades] == [(STUDENT, name)], grades
    assert float(grades[0]["score"]) == points, grades
    _run_in_terminal(tpage, term, teacher_home, "feedback",
                     f"course exchange feedback {UNIT_ID} --work ~/class/work", 180)
    timings["instructor collect, grade, feedback"] = time.monotonic() - t1

    # 4. the student fetches their feedback
    page.locator(".lm-TabBar-tab", has_text="Assignments").first.click()
    page.locator("#refresh_assignments_list").click()
    page.get_by_role("button", name="Fetch Feedback").click()
    deadline = time.monotonic() + 60
    while not list((student_home / name / "feedback").rglob("*.html")) and time.monotonic() < deadline:
        time.sleep(0.5)
    feedback = list((student_home / name / "feedback").rglob("*.html"))
    assert len(feedback) == 1, f"the student fetched {feedback}"
    assert "BEGIN HIDDEN TESTS" not in feedback[0].read_text(errors="replace")
    errors = student.errors() + teacher.errors()
    print("hub cycle timings (s, loaded machine):", {k: round(v, 1) for k, v in timings.items()},
          "total", round(time.monotonic() - t0, 1))
    student.close()
    teacher.close()
    assert not errors, "JavaScript console errors:\n" + "\n".join(errors)


def test_the_users_servers_listened_on_127_0_0_1_and_stop_with_the_hub(hub):
    """After the cycle: every route the proxy added pointed to 127.0.0.1; stopping the hub stops every server."""
    log = hub.log_path.read_text(errors="replace")
    targets = re.findall(r"Adding route /user/(\w+) -> (http://[^\s]+)", log)
    assert {u for u, _ in targets} == {STUDENT, hub.instructor}, targets
    assert all(t.startswith("http://127.0.0.1:") for _, t in targets), targets
    servers = hub.running_servers()
    if not servers:
        pytest.skip("no user logged in: this test follows the class cycle above")
    assert set(servers) == {STUDENT, hub.instructor}, servers
    hub.stop()
    time.sleep(1)
    alive = [pid for pid in servers.values() if _alive(pid)]
    assert not alive, f"single-user servers still running after the hub stopped: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is not running
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False
