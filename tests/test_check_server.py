"""The warm check server behind ``course check`` (coursetools/checkserver.py).

Everything runs on a private copy of the course (unit 03) with its own socket folder, so these servers are
not the ones a developer's ``course check`` would reach, and a fingerprint change touches only the copy.
The rest of the suite runs ``course check`` cold (tests/conftest.py sets LLMCOURSE_CHECK_SERVER=0).
Every server started here is stopped at teardown.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coursetools import checkserver

ROOT = Path(__file__).resolve().parents[1]
UNIT = "03"
pytestmark = pytest.mark.slow
CORRECT = ("def softmax_stable(x, dim=-1):\n    shifted = x - x.amax(dim=dim, keepdim=True)\n    e = shifted.exp()\n"
           "    return e / e.sum(dim=dim, keepdim=True)\n")
WRONG = ("def simple_attention(x):\n    scores = x @ x.transpose(-2, -1)\n    w = torch.softmax(scores, dim=-2)\n"
         "    return w @ x, w\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our own child that exited) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return not _alive(pid)


def mutant_notebook(exercise: Path, dest: Path) -> Path:
    """Unit 03's exercise with a correct softmax and an attention that normalises over the wrong axis."""
    import nbformat

    nb = nbformat.read(str(exercise), as_version=4)
    answers = {"ex03_softmax_stable_answer": CORRECT, "ex03_simple_attention_answer": WRONG}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers.pop(gid)
    assert not answers, f"{exercise} has no answer cells {sorted(answers)}"
    nbformat.write(nb, str(dest / exercise.name))
    return dest / exercise.name


@pytest.fixture(scope="module")
def setup(tmp_path_factory, course_copy):
    """(course copy, socket folder, env for `python -m coursetools` in the copy, notebooks by kind, server pids)."""
    course = course_copy((UNIT, "04"))
    copy, unit = course.root, course.unit(UNIT)
    sockets = tmp_path_factory.mktemp("sockets")
    os.chmod(sockets, 0o700)
    env = dict(os.environ, LLMCOURSE_CHECK_SERVER="1", LLMCOURSE_CHECK_SERVER_DIR=str(sockets),
               LLMCOURSE_CHECK_SERVER_DEBUG="1", LLMCOURSE_CHECK_SERVER_IDLE="20", PYTHONDONTWRITEBYTECODE="1")
    env.pop("LLMCOURSE_ROOT", None)
    student = tmp_path_factory.mktemp("student")
    notebooks = {"solution": str(copy / unit.solution), "stub": str(copy / unit.exercise),
                 "mutant": str(mutant_notebook(copy / unit.exercise, student))}
    started: list[int] = []
    yield copy, sockets, env, notebooks, started
    r = subprocess.run([sys.executable, "-m", "coursetools", "check", "--stop-server"], cwd=copy, env=env,
                       capture_output=True, text=True, timeout=120)
    for pid in started:
        if not _wait_gone(pid, 5.0):
            os.kill(pid, signal.SIGKILL)
    assert r.returncode == 0, r.stderr


def course_check(setup, kind: str, *extra: str, env: dict | None = None):
    copy, _, base_env, notebooks, started = setup
    r = subprocess.run([sys.executable, "-m", "coursetools", "check", *extra, notebooks[kind]], cwd=copy,
                       env=env or base_env, capture_output=True, text=True, timeout=600)
    m = re.search(r"answered by the check server \(pid (\d+)\)", r.stderr)
    pid = int(m.group(1)) if m else None
    if pid is not None and pid not in started:
        started.append(pid)
    return r, pid


@pytest.fixture(scope="module")
def cold(setup):
    """The cold answers (a fresh `course check --json` without a server) for the three notebooks: the text
    report of a cold run is `render_check_report` of the same report."""
    from coursetools.cli import render_check_report

    _, _, env, notebooks, _ = setup
    env = dict(env, LLMCOURSE_CHECK_SERVER="0")
    out = {}
    for kind in notebooks:
        r, pid = course_check(setup, kind, "--json", env=env)
        assert pid is None and "check server" not in r.stderr, r.stderr
        out[kind, ("--json",)] = (r.returncode, r.stdout, r.stderr)
        out[kind, ()] = (r.returncode, render_check_report(json.loads(r.stdout)) + "\n", r.stderr)
    return out


def test_second_call_is_answered_by_the_server_with_the_cold_verdicts(setup, cold):
    r1, pid1 = course_check(setup, "solution", "--json")
    assert "started a check server" in r1.stderr and pid1 is not None, r1.stderr
    answers = {}
    for kind in ("solution", "stub", "mutant"):
        for extra in ((), ("--json",)):
            r, pid = course_check(setup, kind, *extra)
            assert pid == pid1 and "started" not in r.stderr, r.stderr  # the same warm server
            answers[kind, extra] = (r.returncode, r.stdout, r.stderr.replace(f"course check: answered by the check "
                                                                             f"server (pid {pid})\n", ""))
    assert answers == cold  # same exit codes, same text, same JSON (verdicts, points, feedback)
    assert (r1.returncode, r1.stdout) == cold["solution", ("--json",)][:2]
    report = json.loads(answers["mutant", ("--json",)][1])
    assert [v["status"] for v in report["verdicts"]][:2] == ["passed", "failed"]
    assert any(v["bug_id"] for v in report["verdicts"])
    assert cold["stub", ()][0] == 1 and "not attempted" in cold["stub", ()][1]
    assert cold["solution", ()][0] == 0 and cold["mutant", ()][0] == 1


def test_socket_folder_is_private(setup):
    _, sockets, _, _, _ = setup
    assert not os.stat(sockets).st_mode & 0o077
    socks = list(sockets.glob("*.sock"))
    assert socks
    for sock in socks:
        assert stat.S_ISSOCK(os.stat(sock).st_mode) and not os.stat(sock).st_mode & 0o077


def test_the_client_imports_no_torch(setup):
    """A warm call's client stays cheap: it imports neither torch nor the grader."""
    copy, _, env, notebooks, started = setup
    code = ("import sys; from coursetools.cli import main; rc = main(['check', sys.argv[1]]); "
            "print(sorted(m for m in ('torch', 'grader', 'numpy') if m in sys.modules), file=sys.stderr); "
            "raise SystemExit(rc)")
    r = subprocess.run([sys.executable, "-c", code, notebooks["stub"]], cwd=copy, env=env, capture_output=True,
                       text=True, timeout=600)
    assert "answered by the check server" in r.stderr and "started" not in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("[]") and r.returncode == 1, r.stderr


def test_a_killed_server_is_replaced_transparently(setup, cold):
    _, pid = course_check(setup, "mutant")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert _wait_gone(pid, 10)
    r, new = course_check(setup, "mutant")
    assert new is not None and new != pid and "started a check server" in r.stderr, r.stderr
    assert (r.returncode, r.stdout) == cold["mutant", ()][:2]


IDLE_S = 3


def test_a_changed_fingerprint_starts_a_fresh_server_and_ends_the_old(setup, cold):
    copy, _, env, _, started = setup
    _, old = course_check(setup, "solution")
    assert old is not None
    toml = copy / "course.toml"
    st = toml.stat()
    os.utime(toml, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    # the fresh server gets a short idle timeout: the next test waits for it to end by itself
    r, new = course_check(setup, "solution", env=dict(env, LLMCOURSE_CHECK_SERVER_IDLE=str(IDLE_S)))
    assert new is not None and new != old and "started a check server" in r.stderr, r.stderr
    assert (r.returncode, r.stdout) == cold["solution", ()][:2]
    assert _wait_gone(old, 3 * checkserver.TICK_S + 5)  # it noticed the change by itself


def test_the_idle_timeout_ends_the_server(setup):
    _, sockets, _, _, started = setup
    pid = started[-1]  # the fresh server of the previous test
    assert _alive(pid) or not list(sockets.glob("*.sock"))
    assert _wait_gone(pid, IDLE_S + 2 * checkserver.TICK_S + 5)
    assert not list(sockets.glob("*.sock"))  # it removed its socket


def test_without_a_reachable_server_the_client_falls_back(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMCOURSE_CHECK_SERVER", "1")
    # a socket folder that is not private: refused, no server, the cold path answers
    public = tmp_path / "public"
    public.mkdir(mode=0o755)
    os.chmod(public, 0o755)
    monkeypatch.setenv("LLMCOURSE_CHECK_SERVER_DIR", str(public))
    assert checkserver.client_check("whatever.ipynb", False) is None
    # a server that cannot start (here: exits with an error at once): the cold path answers
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("LLMCOURSE_CHECK_SERVER_DIR", str(private))
    (private / f"{checkserver.server_key()['key']}.sock").write_text("not a socket")
    monkeypatch.setattr(checkserver, "_spawn", lambda ident, folder: subprocess.Popen(
        [sys.executable, "-c", "raise SystemExit(3)"]))
    t = time.monotonic()
    assert checkserver.client_check("whatever.ipynb", False) is None
    assert time.monotonic() - t < 20
    # the switch
    monkeypatch.setenv("LLMCOURSE_CHECK_SERVER", "0")
    monkeypatch.setattr(checkserver, "_spawn", lambda *a: pytest.fail("the server is switched off"))
    assert checkserver.client_check("whatever.ipynb", False) is None


def test_the_cli_falls_back_to_the_cold_path(monkeypatch, capsys):
    from coursetools.cli import main

    monkeypatch.setenv("LLMCOURSE_CHECK_SERVER", "1")
    monkeypatch.setattr(checkserver, "client_check", lambda *a: None)
    code = main(["check", str(ROOT / "exercises" / "03_self_attention" / "03_self_attention.ipynb")])
    assert code == 1 and "03.softmax_stable: not attempted" in capsys.readouterr().out


def test_warm_starts_the_server_that_the_next_check_uses(setup):
    """`course check --warm` (what an exercise's kernel runs every few minutes) starts the server ahead of the
    first check and resets its idle timer; the next check is answered by that server."""
    copy, _, env, _, started = setup
    subprocess.run([sys.executable, "-m", "coursetools", "check", "--stop-server"], cwd=copy, env=env,
                   capture_output=True, text=True, timeout=120)
    r = subprocess.run([sys.executable, "-m", "coursetools", "check", "--warm"], cwd=copy, env=env,
                       capture_output=True, text=True, timeout=300)
    m = re.search(r"check server ready \(pid (\d+)\)", r.stdout)
    assert r.returncode == 0 and m, r.stdout + r.stderr
    started.append(int(m.group(1)))
    again = subprocess.run([sys.executable, "-m", "coursetools", "check", "--warm"], cwd=copy, env=env,
                           capture_output=True, text=True, timeout=300)
    assert f"(pid {m.group(1)})" in again.stdout and "started a check server" not in again.stderr
    check, pid = course_check(setup, "solution")
    assert pid == int(m.group(1)) and "started" not in check.stderr, check.stderr
    off = subprocess.run([sys.executable, "-m", "coursetools", "check", "--warm"], cwd=copy,
                         env=dict(env, LLMCOURSE_CHECK_SERVER="0"), capture_output=True, text=True, timeout=120)
    assert off.returncode == 0 and "no check server" in off.stdout


def test_progress_through_the_warm_server_gives_the_cold_table(setup):
    """`course progress` asks the warm server for each unit; its table equals the cold one."""
    copy, _, env, notebooks, started = setup
    folder = Path(notebooks["mutant"]).parent
    runs = {}
    for name, server in (("cold", "0"), ("warm", "1"), ("again", "1")):
        r = subprocess.run([sys.executable, "-m", "coursetools", "progress", str(folder), "--json"], cwd=copy,
                           env=dict(env, LLMCOURSE_CHECK_SERVER=server), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads(r.stdout)
        started += [int(p) for p in re.findall(r"answered by the check server \(pid (\d+)\)", r.stderr)]
        if server == "1":
            assert "answered by the check server" in r.stderr, r.stderr
    assert runs["cold"] == runs["warm"] == runs["again"]
    row = next(u for u in runs["cold"]["units"] if u["notebook"])
    assert row["failed"] >= 1 and row["common_bug"] and "." not in row["common_bug"]


def test_progress_checks_with_two_servers_at_once(setup, tmp_path):
    """With ``LLMCOURSE_CHECK_SERVERS=2`` two servers of the same key (slots 0 and 1) answer one `course progress`
    together, each unit once; the table is the cold one, and ``--stop-server`` ends both."""
    import shutil

    copy, sockets, env, notebooks, started = setup
    folder = tmp_path / "two"
    folder.mkdir()
    shutil.copy2(notebooks["mutant"], folder)
    shutil.copy2(copy / "solutions" / "04_multi_head_attention" / "04_multi_head_attention.ipynb", folder)
    runs, pids = {}, set()
    for name, server, n in (("cold", "0", "2"), ("one", "1", "1"), ("two", "1", "2"), ("again", "1", "2")):
        r = subprocess.run([sys.executable, "-m", "coursetools", "progress", str(folder), "--json"], cwd=copy,
                           env=dict(env, LLMCOURSE_CHECK_SERVER=server, LLMCOURSE_CHECK_SERVERS=n),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads(r.stdout)
        answered = [int(p) for p in re.findall(r"answered by the check server \(pid (\d+)\)", r.stderr)]
        started += answered
        if name == "two":
            assert "started a check server (slot 1" in r.stderr, r.stderr
        if name in ("two", "again"):
            assert len(answered) == 2 and len(set(answered)) == 2, r.stderr  # one unit each, two processes
            pids |= set(answered)
    assert runs["cold"] == runs["one"] == runs["two"] == runs["again"]
    assert {u["unit"]: u["earned"] for u in runs["cold"]["units"] if u["notebook"]}["04"] > 0
    assert len(pids) == 2 and any(p.name.endswith("-1.sock") for p in sockets.glob("*.sock"))
    assert set(checkserver_pids(env)) >= pids


def checkserver_pids(env) -> list[int]:
    """The pids that answer a ping in the test's socket folder (every slot)."""
    code = "from coursetools.checkserver import server_pids; print(server_pids())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    return json.loads(r.stdout)


def test_a_warm_check_fills_the_result_cache_that_progress_reuses(setup, tmp_path):
    """The server stores each report under the client's key; `course progress` then shows it without asking the
    server, with the same rows as an uncached run (tests/test_check_cache.py covers the cold path and edits)."""
    copy, _, env, notebooks, _ = setup
    folder = Path(notebooks["mutant"]).parent
    cache = tmp_path / "cache"
    cached_env = dict(env, LLMCOURSE_CHECK_CACHE=str(cache))
    r, pid = course_check(setup, "mutant", "--json", env=cached_env)
    assert pid is not None and len(list(cache.glob("*.json"))) == 1, r.stderr
    runs = {}
    for name, run_env in (("uncached", dict(env, LLMCOURSE_CHECK_SERVER="0")), ("cached", cached_env)):
        p = subprocess.run([sys.executable, "-m", "coursetools", "progress", str(folder), "--json"], cwd=copy,
                           env=run_env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        runs[name] = json.loads(p.stdout)
        if name == "cached":
            assert "answered by the check server" not in p.stderr and "started a check server" not in p.stderr
    assert runs["cached"] == runs["uncached"]
