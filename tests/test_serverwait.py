"""coursetools.serverwait: the wait for a just-started server that JupyterHub's and JupyterLab's starters share."""

from __future__ import annotations

import socket
import subprocess
import sys

from coursetools.serverwait import wait_until_answering


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_answering_server_is_waited_for_and_an_exited_one_is_named():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until_answering(proc, f"http://127.0.0.1:{port}/", timeout=30) is None
    finally:
        proc.kill()
        proc.wait()
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_until_answering(gone, f"http://127.0.0.1:{_free_port()}/", timeout=30) == "exited with code 3"
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        problem = wait_until_answering(silent, f"http://127.0.0.1:{_free_port()}/", timeout=1)
        assert problem is not None and problem.startswith("did not answer on http://127.0.0.1:")
    finally:
        silent.kill()
        silent.wait()
