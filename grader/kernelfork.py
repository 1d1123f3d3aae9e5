"""Kernels for ``course grade --execute`` forked from a pre-imported state (a per-nbgrader-run fork server).

Each kernel nbgrader starts costs a Python start-up and the imports of ipykernel, torch, numpy and ``llmcourse``
(measured: most of a short exercise notebook's CPU time). With ``LLMCOURSE_KERNEL_FORKSERVER=1`` in nbgrader's
environment (set by ``course grade --execute``; ``grader/nbgrader_config.py`` calls :func:`install`), nbgrader's
kernel launches go to a *fork server*: a child of the nbgrader process, started at its first kernel launch (after the
checkers have decided every score: nbgrader runs only then), that imports those modules once, runs no student code,
starts no Python thread (it refuses to serve if one runs; numpy's import starts OpenBLAS's native pool, which
OpenBLAS's own fork handler stops in the server and starts afresh in each kernel), and forks one kernel per notebook.
Each kernel:

* is a fresh fork of that state (nothing a previous kernel did is in it: each fork copies the server's memory, which
  no kernel writes to; the server maps no shared memory, and the kernel closes the server's pipes before anything
  else runs);
* runs in its own session and process group (``setsid``), below nbgrader's process tree (nbgrader -> fork server
  -> kernel), with the environment nbgrader's launch gives it (the run token included: the supervision in
  ``coursetools.grading._autograde`` finds, reads and kills it as before) and the working directory it asks for;
* gets fresh seeds for ``random`` and numpy's global generator (a fresh process draws them from the OS too).

A launch the fork server cannot serve as a normal launch would (another command than the course's kernel, an
environment that differs from the server's in more than jupyter_client's own variables, output redirected, the
server failing to start or to answer) is launched the normal way (``jupyter_client.launcher.launch_kernel``).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time

ENABLE_ENV = "LLMCOURSE_KERNEL_FORKSERVER"
PRELOAD_ENV = "LLMCOURSE_KERNEL_PRELOAD"  # more modules to import first (comma-separated): the release's imports
PRELOAD = ("zmq", "ipykernel.kernelapp", "ipykernel.ipkernel", "numpy", "torch", "torch.nn", "llmcourse")
# variables jupyter_client sets per launch: the only ones a kernel's environment may differ from the server's in
_LAUNCH_VARS = ("JPY_PARENT_PID", "JPY_SESSION_NAME", "PYDEVD_DISABLE_FILE_VALIDATION")


# ------------------------------------------------------------------ the fork server (its own process)


def _child(req: dict, reply_w: int, req_r: int, sync_w: int) -> None:
    """In the forked child: become the kernel. Never returns."""
    code = 1
    try:
        os.setsid()
        os.write(sync_w, b"x")  # its own session now: the server replies with its pid only after this
        for fd in (reply_w, req_r, sync_w):
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.closerange(3, 65536)  # nothing of the server's (its pipes) reaches the kernel
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ["JPY_PARENT_PID"] = str(os.getppid())  # ipykernel's parent poller watches the fork server
        import random

        import numpy

        random.seed()
        numpy.random.seed()
        sys.path[0] = os.getcwd()  # as `python -m ipykernel_launcher` started here
        for name in [m for m in sys.modules if m == "grader" or m.startswith("grader.")]:
            del sys.modules[name]  # the server's own package: the kernel imports grader itself, as a fresh one does
        sys.argv = [sys.argv[0], *req["args"], f"--IPKernelApp.parent_handle={os.getppid()}"]
        from ipykernel import kernelapp

        kernelapp.launch_new_instance()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the kernel's stderr, then the process ends
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def serve(reply_w: int) -> int:
    """The fork server: requests as JSON lines on stdin, replies on ``reply_w`` (``{"pid": ..}``, ``{"exit": ..}``)."""
    import importlib
    import select

    failed = []
    extra = [m.strip() for m in os.environ.get(PRELOAD_ENV, "").split(",") if m.strip()]
    for name in [*PRELOAD, *extra]:
        if name == "grader" or name.startswith("grader."):
            continue  # imported by each kernel itself (see _child)
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the kernel imports it itself then
            failed.append(f"{name}: {type(exc).__name__}")
    ready = {"ready": True, "pid": os.getpid(), "threads": threading.active_count(), "failed": failed}
    if threading.active_count() != 1:  # a thread would not survive the fork: refuse (the launches fall back)
        ready["ready"] = False
    os.write(reply_w, (json.dumps(ready) + "\n").encode())
    if not ready["ready"]:
        return 1
    children: set[int] = set()
    req_r, buf = 0, b""
    try:
        while True:
            readable, _, _ = select.select([req_r], [], [], 0.1)
            while children:  # report exits (and reap them: no zombies)
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                children.discard(pid)
                os.write(reply_w, (json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
                         .encode())
            if not readable:
                continue
            chunk = os.read(req_r, 1 << 20)
            if not chunk:
                return 0  # nbgrader ended
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                sync_r, sync_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(sync_r)
                    _child(req, reply_w, req_r, sync_w)
                os.close(sync_w)
                children.add(pid)
                # jupyter_client signals the kernel's process group: reply once the child leads its own
                ok = select.select([sync_r], [], [], 30)[0] and os.read(sync_r, 1) == b"x"
                os.close(sync_r)
                try:
                    ok = ok and os.getpgid(pid) == pid
                except OSError:
                    ok = False
                if not ok:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                    os.write(reply_w, (json.dumps({"error": "the kernel did not start its own session"}) + "\n")
                             .encode())
                    continue
                os.write(reply_w, (json.dumps({"pid": pid}) + "\n").encode())
    finally:
        for pid in children:  # what is left when nbgrader goes: ended with it
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass


# ------------------------------------------------------------------ in nbgrader's process


class _Server:
    """The fork server as seen from nbgrader: started at the first launch, one per nbgrader process."""

    def __init__(self, argv: list[str]):
        reply_r, reply_w = os.pipe()
        self.proc = subprocess.Popen([*argv, "-m", "grader.kernelfork", str(reply_w)], stdin=subprocess.PIPE,
                                     pass_fds=(reply_w,), close_fds=True)
        os.close(reply_w)
        self._r, self._buf, self._lock = reply_r, b"", threading.Lock()
        self.exits: dict[int, int] = {}
        self.env = dict(os.environ)
        self.argv = list(argv)
        self.returncode: int | None = None
        self._closing = False
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        hello = self._next(time.monotonic() + 120)
        if not (hello and hello.get("ready")):
            self.close()
            raise RuntimeError(f"the kernel fork server did not start: {hello}")
        atexit.register(self.close)  # waited for: its CPU time and its kernels' count as nbgrader's children's

    def _watch(self) -> None:
        """The server's end, and a signal to it passed on to this process: to a kernel, the fork server stands
        where nbgrader stood (its parent). A kernel that stops or kills its parent stops or kills nbgrader, as with
        the normal launch, and ``course grade``'s supervision sees nbgrader stopped or killed, as it did."""
        while True:
            try:
                _, status = os.waitpid(self.proc.pid, os.WUNTRACED)
            except ChildProcessError:
                self.returncode = self.returncode if self.returncode is not None else 0
                return
            if os.WIFSTOPPED(status):
                if not self._closing:
                    os.kill(os.getpid(), os.WSTOPSIG(status))
                continue
            self.returncode = os.waitstatus_to_exitcode(status)
            self.proc.returncode = self.returncode
            if os.WIFSIGNALED(status) and not self._closing:
                os.kill(os.getpid(), os.WTERMSIG(status))
            return

    def _next(self, until: float | None) -> dict | None:
        """The next reply that is not an exit report (exits are recorded), or None by ``until`` (None: don't wait)."""
        import select

        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                msg = json.loads(line)
                if "exit" in msg:
                    self.exits[msg["exit"]] = msg["code"]
                else:
                    return msg
            left = 0.0 if until is None else until - time.monotonic()
            if left < 0:
                return None
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                if until is None or time.monotonic() >= until:
                    return None
                continue
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                return None
            self._buf += chunk

    def fork(self, args: list[str], env: dict, cwd: str) -> int:
        with self._lock:
            self.proc.stdin.write((json.dumps({"args": args, "env": env, "cwd": cwd}) + "\n").encode())
            self.proc.stdin.flush()
            reply = self._next(time.monotonic() + 30)
        if not reply or "pid" not in reply:
            raise RuntimeError(f"the kernel fork server did not fork: {reply}")
        pid = int(reply["pid"])
        try:  # the server's own child, leading its own session: never another process named by a stray line
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            ours = int(fields[1]) == self.proc.pid and int(fields[3]) == pid
        except (OSError, IndexError, ValueError):
            ours = False
        if not ours:
            raise RuntimeError(f"the kernel fork server's reply names process {pid}, not a kernel it forked")
        return pid

    def poll_exits(self) -> None:
        """Record the exit reports that have come (:meth:`_next` files them; only exit reports come unasked)."""
        with self._lock:
            self._next(None)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            self.proc.stdin.close()  # the server kills what kernels are left, reaps them and exits
        except OSError:
            pass
        self._watcher.join(10)
        if self._watcher.is_alive():
            self.proc.kill()
            self._watcher.join(10)
        os.close(self._r)


class ForkedKernel:
    """A ``subprocess.Popen`` stand-in for a kernel forked by the server (what jupyter_client's provisioner uses)."""

    stdin = stdout = stderr = None

    def __init__(self, server: _Server, pid: int, args: list[str]):
        self._server, self.pid, self.args, self.returncode = server, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.poll_exits()
            if self.pid in self._server.exits:
                self.returncode = self._server.exits.pop(self.pid)
            elif self._server.returncode is not None and not _alive(self.pid):
                self.returncode = -signal.SIGKILL  # the server went (and took its kernels with it)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        until = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if until is not None and time.monotonic() > until:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


_server: _Server | None = None
_server_failed = False
stats = {"forked": 0, "fallback": 0}


def _kernel_args(cmd: list[str]) -> tuple[list[str], list[str]] | None:
    """``(interpreter argv, the kernel's own args)`` when ``cmd`` is ``python [-X..] -m ipykernel_launcher ...``."""
    if "-m" not in cmd:
        return None
    i = cmd.index("-m")
    if i + 1 >= len(cmd) or cmd[i + 1] != "ipykernel_launcher":
        return None
    head = cmd[:i]
    if not head or os.path.realpath(head[0]) != os.path.realpath(sys.executable) or \
            any(not a.startswith("-X") for a in head[1:]):
        return None
    return head, cmd[i + 2:]


def launch(cmd: list[str], normal, **kwargs):
    """jupyter_client's ``launch_kernel(cmd, **kwargs)``, by a fork of the server where it can be; else ``normal``."""
    global _server, _server_failed
    parsed = _kernel_args(cmd)
    env = kwargs.get("env") or dict(os.environ)
    plain = all(kwargs.get(k) is None for k in ("stdin", "stdout", "stderr")) and not kwargs.get("independent")
    if parsed is None or not plain or _server_failed:
        stats["fallback"] += 1
        return normal(cmd, **kwargs)
    head, args = parsed
    try:
        if _server is None:
            _server = _Server(head)
        differs = {k for k in set(env) | set(_server.env) if env.get(k) != _server.env.get(k)} - set(_LAUNCH_VARS)
        if differs or head != _server.argv:
            stats["fallback"] += 1
            return normal(cmd, **kwargs)
        pid = _server.fork(args, dict(env), str(kwargs.get("cwd") or os.getcwd()))
    except Exception as exc:  # noqa: BLE001 - the normal launch then, for this and every later kernel
        print(f"[kernelfork] fork server unavailable ({type(exc).__name__}: {exc}); kernels start normally",
              file=sys.stderr)
        _server_failed = True
        stats["fallback"] += 1
        return normal(cmd, **kwargs)
    stats["forked"] += 1
    return ForkedKernel(_server, pid, cmd)


def release_imports(path) -> list[str]:
    """The modules a (released, course-written) notebook imports: ``import a.b`` and ``from a.b import c`` anywhere in
    its code cells, ``grader`` left out; what the fork server imports beside :data:`PRELOAD`."""
    import ast

    import nbformat

    mods: set[str] = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mods.add(node.module)
    return sorted(m for m in mods if m.split(".")[0] != "grader")


def install() -> bool:
    """Route jupyter_client's local kernel launches through :func:`launch` when ``$LLMCOURSE_KERNEL_FORKSERVER=1``, on Linux
    (the server's checks read ``/proc``; on macOS forking a process that imported torch is not safe): elsewhere False."""
    if os.environ.get(ENABLE_ENV) != "1" or not sys.platform.startswith("linux"):  # /proc is read; macOS: no fork
        return False
    from jupyter_client.provisioning import local_provisioner

    normal = local_provisioner.launch_kernel
    if getattr(normal, "_llmcourse_fork", False):
        return True

    def launch_kernel(cmd, **kwargs):
        return launch(cmd, normal, **kwargs)

    launch_kernel._llmcourse_fork = True
    local_provisioner.launch_kernel = launch_kernel
    return True


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
