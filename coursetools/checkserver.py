"""A warm ``course check``: a per-user check server that later calls reuse.

A cold ``course check`` spends most of its time importing: the checker imports ``torch``, ``grader`` and
``llmcourse``, and the grader's forkserver preloads ``torch`` and ``torch._dynamo`` before the first learner
process can start (≈ 4–5 s on 2 cores). The first ``course check`` therefore starts a detached **check
server**: a checker process that has done those imports, keeps the forkserver warm, and listens on a Unix
socket in a private directory (mode 0700: ``$XDG_RUNTIME_DIR/llmcourse-check``, else
``~/.cache/llmcourse/check-server``, else ``/tmp/llmcourse-check-<uid>``). Later calls send the notebook
path, ``--json``, the working directory and the environment to it, and print its answer with its exit code:
the same text, the same JSON, the same verdicts as a cold run (the server runs the very same code,
:func:`coursetools.checking.check_command`).

What is unchanged: the server is the *checker*. Learner code never runs in it, only in forkserver workers,
one per exercise, exactly as in a cold run (:mod:`grader.worker`); a server serves one request at a time.
``course progress`` checks several notebooks at once by sending them to more than one server of the same key
(*slots*: ``$LLMCOURSE_CHECK_SERVERS``, default 2, at most the CPUs; slot 0 is the one ``course check`` uses,
the others start on first use and end like it), each a separate process with its own forkserver, so a report
never depends on which slot wrote it.
``course grade`` never uses it (it keeps its own snapshot-based checker, :mod:`coursetools.grading`);
``course progress`` sends it the notebooks whose report is not in the check-result cache
(:mod:`coursetools.resultcache`, keyed by this server's key), which every check fills.

Which server answers: one per **key**, a hash of everything that could change an answer — the course root,
the Python executable, where ``llmcourse``, ``grader`` and ``coursetools`` are imported from, a fingerprint
of those three packages, ``course.toml`` and ``assets/`` (relative path, size and mtime of every file; ``__pycache__`` and
dot-files left out), and the environment variables listed in :data:`ENV_PREFIXES`. A changed key starts a
fresh server; the old one notices that its fingerprint changed (it re-checks every few seconds and before
every request) and exits. A server also exits after :data:`IDLE_ENV` seconds without a request (default
600).

Switches: ``LLMCOURSE_CHECK_SERVER=0`` disables the server (every call is cold, as before);
``LLMCOURSE_CHECK_SERVER_IDLE`` sets the idle timeout in seconds; ``LLMCOURSE_CHECK_SERVER_DEBUG=1`` makes
the client say on stderr which server answered (or why it fell back). Whenever the server cannot be
started or reached, or fails in any way, the call falls back to the cold path silently; a server started
by a fresh key needs as long as a cold run for its first answer. ``course check --stop-server`` stops the
servers of this user.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

SERVER_ENV = "LLMCOURSE_CHECK_SERVER"
IDLE_ENV = "LLMCOURSE_CHECK_SERVER_IDLE"
DEBUG_ENV = "LLMCOURSE_CHECK_SERVER_DEBUG"
DIR_ENV = "LLMCOURSE_CHECK_SERVER_DIR"  # where the sockets live (tests point it at a temporary folder)
IDLE_DEFAULT_S = 600.0
# environment variables that can change a check's answer: part of the server's key
ENV_PREFIXES = ("LLMCOURSE_", "HF_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_",
                "CUDA_", "CUBLAS_", "KMP_", "PYTHONHASHSEED", "PYTHONPATH", "TOKENIZERS_", "TIKTOKEN_")
SERVERS_ENV = "LLMCOURSE_CHECK_SERVERS"  # how many servers `course progress` checks with at once (default: 2, at most
# the CPUs); one per *slot*: slot 0 answers `course check`, the others only `course progress`
START_TIMEOUT_S = 30.0  # until the new server's socket accepts (it binds before its heavy imports)
REPLY_TIMEOUT_S = 3600.0  # a request (the first one includes the server's imports and forkserver start-up)
TICK_S = 2.0  # the server re-checks its fingerprint, socket and idle time this often

__all__ = ["client_check", "fingerprint", "progress_slots", "server_key", "stop_servers"]


# ============================================================================ shared: key, directory, framing

def _debug(msg: str) -> None:
    if os.environ.get(DEBUG_ENV) == "1":
        print(f"course check: {msg}", file=sys.stderr)


def _walk(path: Path, out: list) -> None:
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.name.startswith(".") or e.name == "__pycache__" or e.name.endswith((".pyc", ".pyo")):
            continue
        try:
            if e.is_dir(follow_symlinks=True):
                _walk(Path(e.path), out)
            else:
                st = e.stat()
                out.append(f"{e.path}\0{st.st_size}\0{st.st_mtime_ns}")
        except OSError:
            out.append(f"{e.path}\0?")


def fingerprint(paths: list[str]) -> str:
    """Hash of (path, size, mtime) of every file under ``paths`` (files or folders); cheap: stats only."""
    out: list = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            _walk(p, out)
        else:
            try:
                st = p.stat()
                out.append(f"{p}\0{st.st_size}\0{st.st_mtime_ns}")
            except OSError:
                out.append(f"{p}\0missing")
    return hashlib.sha256("\n".join(out).encode()).hexdigest()


def _package_dir(name: str) -> str:
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None):
        return str(Path(mod.__file__).resolve().parent)
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise ImportError(name)
    return str(Path(spec.origin).resolve().parent)


def _course_root(llmcourse_dir: str) -> str:
    env = os.environ.get("LLMCOURSE_ROOT")  # as llmcourse.manifest.course_root
    return str(Path(env).resolve() if env else Path(llmcourse_dir).parent)


def _env_subset(env=None) -> dict:
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items())
            if k.startswith(ENV_PREFIXES) and not k.startswith(("LLMCOURSE_CHECK_SERVER", "LLMCOURSE_CHECK_CACHE"))}


def watched_paths(root: str, llmcourse_dir: str, grader_dir: str, tools_dir: str) -> list[str]:
    """What the fingerprint covers: the three packages (``llmcourse``, ``grader``, ``coursetools``),
    ``course.toml`` and ``assets/``."""
    return [llmcourse_dir, grader_dir, tools_dir, str(Path(root) / "course.toml"), str(Path(root) / "assets")]


def server_key() -> dict:
    """The identity of the server that may answer this process's ``course check`` (see the module doc)."""
    llmcourse_dir, grader_dir = _package_dir("llmcourse"), _package_dir("grader")
    tools_dir = _package_dir("coursetools")
    root = _course_root(llmcourse_dir)
    ident = {"root": root, "python": sys.executable, "version": sys.version, "llmcourse": llmcourse_dir,
             "grader": grader_dir, "coursetools": tools_dir, "env": _env_subset()}
    ident["fingerprint"] = fingerprint(watched_paths(root, llmcourse_dir, grader_dir, tools_dir))
    ident["key"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
    return ident


def _private_dir() -> Path:
    """This user's socket folder, created 0700; refused (OSError) unless owned by us and private."""
    candidates = []
    if os.environ.get(DIR_ENV):
        candidates.append(Path(os.environ[DIR_ENV]))
    else:
        if os.environ.get("XDG_RUNTIME_DIR"):
            candidates.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "llmcourse-check")
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        candidates.append(cache / "llmcourse" / "check-server")
        candidates.append(Path("/tmp") / f"llmcourse-check-{os.getuid()}")
    for d in candidates:
        if len(str(d)) > 70:  # a Unix socket path is limited to 107 bytes
            continue
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(d)
        except OSError:
            continue
        import stat

        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return d
    raise OSError("no private folder for the check server")


def _send(sock: socket.socket, obj) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, limit: int = 1 << 30):
    (n,) = struct.unpack("!Q", _recv_exact(sock, 8))
    if n > limit:
        raise ValueError("message too large")
    return json.loads(_recv_exact(sock, n))


# ============================================================================ client

def _connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return s
    except OSError:
        s.close()
        return None


_BOOT = ("import sys, json; cfg = json.loads(sys.argv[1]); sys.path[:] = cfg['sys_path']; "
         "from coursetools.checkserver import serve_main; serve_main(cfg)")


def _name(key: str, slot: int) -> str:
    """The file stem of slot ``slot``'s server for ``key`` (its socket, lock and log)."""
    return key if slot == 0 else f"{key}-{slot}"


def progress_slots(n_units: int) -> int:
    """How many servers ``course progress`` uses at once for ``n_units`` unchecked notebooks: ``$LLMCOURSE_CHECK_SERVERS``
    (default 2), at most the CPUs this process may use and at most ``n_units``; at least 1."""
    try:
        wanted = int(os.environ.get(SERVERS_ENV) or 2)
    except ValueError:
        wanted = 2
    from . import usable_cpus

    return max(1, min(wanted, usable_cpus(), n_units))


def _spawn(ident: dict, folder: Path, slot: int = 0):
    """Start a detached server for ``ident`` (new session; no pipe of ours is left open in it)."""
    import subprocess

    # the client's import path; its first entry (the script's folder, or the working directory under
    # `python -m`) only when llmcourse or grader come from there: the server imports what this process would
    first = str(Path(sys.path[0] or os.getcwd()).resolve()) if sys.path else ""
    keep = first in {str(Path(ident[k]).parent) for k in ("llmcourse", "grader", "coursetools")}
    path = ([first] if keep else []) + [p for p in sys.path[1:] if p]
    cfg = {"key": ident["key"], "dir": str(folder), "root": ident["root"], "llmcourse": ident["llmcourse"],
           "grader": ident["grader"], "coursetools": ident["coursetools"], "fingerprint": ident["fingerprint"],
           "sys_path": list(dict.fromkeys(path)), "idle": float(os.environ.get(IDLE_ENV) or IDLE_DEFAULT_S),
           "slot": int(slot)}
    log = open(folder / f"{_name(ident['key'], slot)}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(cfg)], cwd=str(folder),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    finally:
        log.close()


def _connect_or_start(ident: dict, folder: Path, slot: int = 0) -> socket.socket | None:
    name = _name(ident["key"], slot)
    path = folder / f"{name}.sock"
    s = _connect(path)
    if s is not None:
        return s
    proc = _spawn(ident, folder, slot)
    _debug(f"started a check server (slot {slot}, pid {proc.pid})")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        s = _connect(path)
        if s is not None:
            return s
        code = proc.poll()
        if code not in (None, 0):  # 0: another client's server holds the key; wait for its socket
            _debug(f"the check server exited with code {code} (see {folder / (name + '.log')})")
            return None
        time.sleep(0.02)
    return None


def _cache_setting() -> str:
    """The client's check-result cache folder for the server to store into (``"0"``: none)."""
    from .resultcache import cache_dir

    folder = cache_dir()
    return str(folder) if folder is not None else "0"


def client_check(notebook: str, as_json: bool, slot: int = 0) -> tuple[str, str, int] | None:
    """``course check`` answered by the warm server: ``(stdout, stderr, exit code)``, or None for the cold path.

    ``slot``: which of this key's servers answers (``course progress`` sends notebooks to several at once,
    :func:`progress_slots`; every slot is the same server, started on first use, with its own forkserver)."""
    if os.environ.get(SERVER_ENV, "1") == "0":
        return None
    try:
        folder = _private_dir()
        for _ in range(2):
            ident = server_key()
            sock = _connect_or_start(ident, folder, slot)
            if sock is None:
                return None
            with sock:
                sock.settimeout(REPLY_TIMEOUT_S)
                _send(sock, {"op": "check", "key": ident["key"], "notebook": notebook, "json": bool(as_json),
                             "cwd": os.getcwd(), "env": _env_subset(), "cache": _cache_setting()})
                reply = _recv(sock)
            if reply.get("stale"):  # a watched file changed since the key was computed: a fresh server
                _debug("the check server was out of date; starting a fresh one")
                continue
            if not reply.get("ok"):
                _debug(f"the check server could not answer ({reply.get('error')}); checking without it")
                return None
            _debug(f"answered by the check server (pid {reply.get('pid')})")
            return str(reply["stdout"]), str(reply["stderr"]), int(reply["code"])
    except Exception as exc:  # noqa: BLE001 - any failure: the cold path answers, correctly
        _debug(f"check server unavailable ({type(exc).__name__}: {exc}); checking without it")
    return None


def client_warm() -> int | None:
    """Start this user's server for this checkout if none runs, and reset its idle timer (every request
    does): the pid of the server, or None (switched off, or it could not start). ``course check --warm``;
    an exercise notebook's kernel calls it every few minutes (``llmcourse.selfcheck.keep_check_server_warm``)
    so that a pause longer than the idle timeout does not make the next check cold."""
    if os.environ.get(SERVER_ENV, "1") == "0":
        return None
    try:
        ident = server_key()
        sock = _connect_or_start(ident, _private_dir())
        if sock is None:
            return None
        with sock:
            sock.settimeout(REPLY_TIMEOUT_S)
            _send(sock, {"op": "ping"})
            reply = _recv(sock)
        return int(reply["pid"]) if reply.get("ok") else None
    except Exception as exc:  # noqa: BLE001 - warming is best effort; a check still works cold
        _debug(f"could not warm the check server ({type(exc).__name__}: {exc})")
        return None


def _request_all(op: str) -> list[dict]:
    try:
        folder = _private_dir()
    except OSError:
        return []
    out = []
    for path in sorted(folder.glob("*.sock")):
        s = _connect(path)
        if s is None:
            continue
        with s:
            try:
                s.settimeout(30)
                _send(s, {"op": op})
                out.append(_recv(s))
            except (OSError, ValueError, EOFError):
                pass
    return out


def stop_servers() -> int:
    """Ask every check server of this user (in this user's folder) to exit; the number that answered."""
    return len(_request_all("shutdown"))


def server_pids() -> list[int]:
    """The pids of the running check servers of this user (tests)."""
    return [int(r["pid"]) for r in _request_all("ping") if "pid" in r]


# ============================================================================ server

def _peer_uid(conn: socket.socket) -> int | None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    except (OSError, AttributeError):
        return None


class _State:
    """Process-wide state a cold ``course check`` starts from, restored before every request."""

    def __init__(self):
        import random

        import torch

        self.torch_rng = torch.get_rng_state()
        self.random = random.getstate()
        self.threads = torch.get_num_threads()
        self.dtype = torch.get_default_dtype()
        self.grad = torch.is_grad_enabled()
        self.deterministic = torch.are_deterministic_algorithms_enabled()

    def restore(self):
        import random

        import torch

        torch.set_rng_state(self.torch_rng)
        random.setstate(self.random)
        torch.set_num_threads(self.threads)
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(self.grad)
        torch.use_deterministic_algorithms(self.deterministic)


def _run_request(msg: dict, state: _State, home: str) -> dict:
    import contextlib
    import io
    import warnings

    from coursetools.checking import check_command

    out, err = io.StringIO(), io.StringIO()
    state.restore()
    os.chdir(msg["cwd"])  # relative paths, the report's notebook name and the workers' cwd, as in a cold run
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = check_command(str(msg["notebook"]), bool(msg["json"]), server=str(msg["key"]),
                                 cache=str(msg.get("cache") or "0"))
    finally:
        os.chdir(home)
    return {"ok": True, "stdout": out.getvalue(), "stderr": err.getvalue(), "code": int(code), "pid": os.getpid()}


def serve_main(cfg: dict) -> None:
    """The server process (started by :func:`_spawn`; its working directory is the private folder)."""
    import contextlib
    import fcntl
    import signal

    folder = Path(cfg["dir"])
    key = cfg["key"]
    name = _name(key, int(cfg.get("slot", 0)))
    env_at_start = _env_subset()  # before the imports below (some set variables of their own)
    sock_path = folder / f"{name}.sock"
    lock = open(folder / f"{name}.lock", "w")  # noqa: SIM115 - held for the server's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another server holds this key (two clients started one each): it answers
    watched = watched_paths(cfg["root"], cfg["llmcourse"], cfg["grader"], cfg["coursetools"])
    if fingerprint(watched) != cfg["fingerprint"]:
        raise SystemExit(4)  # changed since the client looked: it checks cold (a non-zero exit tells it)
    with contextlib.suppress(OSError):
        sock_path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(sock_path))
    finally:
        os.umask(old_umask)
    listener.listen(16)
    inode = os.stat(sock_path).st_ino

    def cleanup(*_, code=0):
        with contextlib.suppress(OSError):
            if os.stat(sock_path).st_ino == inode:
                sock_path.unlink()
        with contextlib.suppress(OSError):
            (folder / f"{name}.lock").unlink()
        with contextlib.suppress(OSError):
            log_path = folder / f"{name}.log"
            if not log_path.stat().st_size:
                log_path.unlink()
        os._exit(code)

    signal.signal(signal.SIGTERM, cleanup)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    # the forkserver first (its preload overlaps this process's imports), then what a cold check imports
    sys.modules.setdefault("rfc3987_syntax", None)  # as coursetools.cli.main (see _skip_slow_iri_validator)
    from grader.forkserver import start_forkserver

    start_forkserver()
    import coursetools
    import coursetools.checking  # noqa: F401
    import grader
    import llmcourse
    from grader import runner  # noqa: F401

    if (str(Path(llmcourse.__file__).resolve().parent) != cfg["llmcourse"]
            or str(Path(grader.__file__).resolve().parent) != cfg["grader"]
            or str(Path(coursetools.__file__).resolve().parent) != cfg["coursetools"]):
        print(f"imported {llmcourse.__file__}, {grader.__file__} and {coursetools.__file__}, "
              "not the client's packages", flush=True)
        cleanup(code=5)
    state = _State()
    home = str(folder)
    idle = float(cfg.get("idle", IDLE_DEFAULT_S))
    last = time.monotonic()
    listener.settimeout(TICK_S)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            conn = None
        if conn is None:
            try:
                gone = os.stat(sock_path).st_ino != inode
            except OSError:
                gone = True
            if gone or time.monotonic() - last > idle or fingerprint(watched) != cfg["fingerprint"]:
                cleanup()
            continue
        with conn:
            conn.settimeout(60.0)  # for the request itself; a check then takes as long as it takes
            try:
                if _peer_uid(conn) not in (os.getuid(), None):
                    continue
                msg = _recv(conn, limit=1 << 24)
                conn.settimeout(None)
                op = msg.get("op")
                if op == "ping":
                    _send(conn, {"ok": True, "pid": os.getpid(), "key": key})
                    continue
                if op == "shutdown":
                    _send(conn, {"ok": True, "pid": os.getpid()})
                    conn.close()
                    cleanup()
                if op != "check" or msg.get("key") != key:
                    _send(conn, {"ok": False, "error": "unknown request"})
                    continue
                if fingerprint(watched) != cfg["fingerprint"]:
                    _send(conn, {"ok": False, "stale": True})
                    conn.close()
                    cleanup()
                theirs = _env_subset(msg.get("env") or {})
                if theirs != env_at_start:
                    diff = sorted(k for k in set(theirs) | set(env_at_start) if theirs.get(k) != env_at_start.get(k))
                    _send(conn, {"ok": False, "error": f"environment differs: {', '.join(diff)}"})
                    continue
                try:
                    reply = _run_request(msg, state, home)
                except BaseException as exc:  # noqa: BLE001 - the client re-runs it cold (same traceback)
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                _send(conn, reply)
            except Exception:  # noqa: BLE001 - a broken request never ends the server
                pass
            finally:
                last = time.monotonic()
