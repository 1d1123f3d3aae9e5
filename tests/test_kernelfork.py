"""Kernels forked from a pre-imported state (grader/kernelfork.py, `course grade --execute`): isolated, supervised,
and the normal launch when the fork server cannot serve."""

from __future__ import annotations

import os
import subprocess

import pytest

pytest.importorskip("ipykernel")

from grader import kernelfork  # noqa: E402


@pytest.fixture
def forking(monkeypatch, tmp_path):
    """kernelfork installed in this process with a fresh server state; the server closed afterwards."""
    from jupyter_client.provisioning import local_provisioner

    monkeypatch.setenv(kernelfork.ENABLE_ENV, "1")
    monkeypatch.setenv("LLMCOURSE_TEST_MARK", "kernelfork-test")
    monkeypatch.setattr(local_provisioner, "launch_kernel", local_provisioner.launch_kernel)
    monkeypatch.setattr(kernelfork, "_server", None)
    monkeypatch.setattr(kernelfork, "_server_failed", False)
    monkeypatch.setattr(kernelfork, "PRELOAD", ("ipykernel.kernelapp", "ipykernel.ipkernel"))  # quick to start
    assert kernelfork.install()
    yield tmp_path
    if kernelfork._server is not None:
        kernelfork._server.close()


def _start(cwd):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import start_new_kernel

    if "llmcourse" not in KernelSpecManager().find_kernel_specs():
        pytest.skip("the course's kernel is not registered (make kernel)")
    if kernelfork._kernel_args(KernelSpecManager().get_kernel_spec("llmcourse").argv) is None:
        pytest.skip("the course's kernel spec is not this interpreter's ipykernel_launcher: nothing to fork")
    return start_new_kernel(kernel_name="llmcourse", startup_timeout=120, cwd=str(cwd))


def _run(kc, code: str) -> str:
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])

    kc.execute_interactive(code, timeout=60, output_hook=hook)
    return "".join(out).strip()


def _stop(km, kc):
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def test_two_kernels_of_one_run_share_no_state(forking):
    a_dir, b_dir = forking / "a", forking / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    km_a, kc_a = _start(a_dir)
    try:
        assert isinstance(km_a.provisioner.process, kernelfork.ForkedKernel), "not forked: see the captured stderr"
        # the first kernel writes module-level state into modules the server had imported
        assert _run(kc_a, "import ipykernel.kernelapp as m, random; m.LEAK = 42; random.seed(7); "
                    "print('set', random.random())").startswith("set")
        info_a = _run(kc_a, "import os; print(os.getpid(), os.getppid(), os.getsid(0), os.getcwd(), "
                      "os.environ.get('LLMCOURSE_TEST_MARK'))").split()
        km_b, kc_b = _start(b_dir)
        try:
            assert isinstance(km_b.provisioner.process, kernelfork.ForkedKernel)
            assert _run(kc_b, "import ipykernel.kernelapp as m; print(getattr(m, 'LEAK', 'absent'))") == "absent"
            info_b = _run(kc_b, "import os; print(os.getpid(), os.getppid(), os.getsid(0), os.getcwd(), "
                          "os.environ.get('LLMCOURSE_TEST_MARK'))").split()
            # fresh seeds: the second kernel's `random` is not the first one's, nor the server's
            r_b = _run(kc_b, "import random; print(random.getstate()[1][:4])")
            r_a = _run(kc_a, "import random; random.seed(7); print(random.getstate()[1][:4])")
            assert r_a != r_b
        finally:
            _stop(km_b, kc_b)
    finally:
        _stop(km_a, kc_a)
    server = kernelfork._server.proc.pid
    for info, cwd in ((info_a, a_dir), (info_b, b_dir)):
        pid, ppid, sid, where, mark = info
        assert int(ppid) == server  # below this process: nbgrader's supervision sees it in its tree
        assert int(sid) == int(pid)  # its own session and process group
        assert os.path.realpath(where) == os.path.realpath(cwd)
        assert mark == "kernelfork-test"  # the launch's environment (a run token travels the same way)
    assert info_a[0] != info_b[0]
    assert kernelfork.stats["forked"] >= 2


def test_fallback_when_the_fork_server_is_unavailable(forking, monkeypatch):
    def broken(self, argv):
        raise OSError("no fork server here")

    monkeypatch.setattr(kernelfork._Server, "__init__", broken)
    km, kc = _start(forking)
    try:
        assert isinstance(km.provisioner.process, subprocess.Popen)  # the normal launch
        assert _run(kc, "print(6 * 7)") == "42"
    finally:
        _stop(km, kc)
    assert kernelfork._server_failed


def test_fallback_when_the_environment_differs(forking, monkeypatch):
    km, kc = _start(forking)  # starts the server with this environment
    _stop(km, kc)
    assert kernelfork._server is not None and not kernelfork._server_failed
    monkeypatch.setenv("LLMCOURSE_TEST_MARK", "changed")  # a kernel launched with another environment
    km, kc = _start(forking)
    try:
        assert isinstance(km.provisioner.process, subprocess.Popen)
        assert _run(kc, "import os; print(os.environ['LLMCOURSE_TEST_MARK'])") == "changed"
    finally:
        _stop(km, kc)


def test_release_imports_are_the_notebooks_own():
    from llmcourse.manifest import load_course

    course = load_course()
    mods = kernelfork.release_imports(course.root / course.unit("11").exercise)
    assert "torch" in mods and "transformers.models.llama.modeling_llama" in mods
    assert not any(m.split(".")[0] == "grader" for m in mods)
