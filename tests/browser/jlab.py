"""Helpers of the browser tests: a JupyterLab server on 127.0.0.1 and a few JupyterLab page actions.

The server (:class:`LabServer`) runs ``.venv/bin/jupyter-lab`` directly, so it is stopped by its PID:
no token or password, a free random port, temporary runtime/config/data/settings/workspace folders, the
news prompt and the update check turned off, ``window.jupyterapp`` exposed (JupyterLab's own switch for
UI tests), and the notebook's windowing turned off so every cell is in the DOM.

Page helpers drive JupyterLab the way a person does (menus, toolbar buttons, typing into a cell) and
read its state through ``window.jupyterapp`` (cell models, kernel status), never through timing guesses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from coursetools.serverwait import wait_until_answering

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("LLMCOURSE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# JupyterLab user settings for the test server (a temporary user-settings dir).
LAB_SETTINGS = {
    # no "Would you like to receive official Jupyter news?" toast, no update check
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                          "checkForUpdates": False},
    # every cell rendered (the default windowing renders only the cells in view); each code cell's execution
    # timestamps in its metadata (``execution``: the kernel's start and reply times), read by :func:`execution_time`
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none", "recordTiming": True},
}


# What `make lab` adds to show students only student tools (the Makefile's STUDENT_LAB; a test compares them)
STUDENT_LAB_ARGS = [f"--LabApp.app_settings_dir={ROOT / 'lab-config' / 'student'}"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jupyter_lab_executable() -> Path:
    return Path(sys.executable).parent / "jupyter-lab"


class LabServer:
    """``jupyter-lab`` serving ``root_dir`` on 127.0.0.1 (started by :meth:`start`, stopped by :meth:`stop`).

    Args:
        root_dir: the folder the server shows (and the notebooks' working directories).
        cwd: the server's working directory (nbgrader reads ``nbgrader_config.py`` from it); default root_dir.
        env: extra environment variables for the server and its kernels.
        allow_hidden: serve dot-folders (``.grading/``) too.
        name: a label for logs and artifacts.
        extra_args: more ``jupyter-lab`` options (e.g. :data:`STUDENT_LAB_ARGS`, what ``make lab`` adds).
    """

    def __init__(self, root_dir: Path, cwd: Path | None = None, env: dict | None = None,
                 allow_hidden: bool = False, name: str = "lab", extra_args: list[str] | None = None):
        self.root_dir = Path(root_dir)
        self.cwd = Path(cwd or root_dir)
        self.extra_env = dict(env or {})
        self.allow_hidden = allow_hidden
        self.name = name
        self.extra_args = list(extra_args or [])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix=f"llmcourse-{name}-"))
        self.log_path = self._tmp / "jupyter-lab.log"

    # ------------------------------------------------------------------------------------ lifecycle

    def _env(self) -> dict:
        tmp = self._tmp
        settings = tmp / "user-settings"
        for rel, value in LAB_SETTINGS.items():
            path = settings / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value), encoding="utf-8")
        for sub in ("runtime", "config", "data", "workspaces", "ipython"):
            (tmp / sub).mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "JPY_"))}
        env.update({
            # temporary per-user folders; the course kernel stays discoverable because it is installed
            # with --sys-prefix (<venv>/share/jupyter/kernels/llmcourse), which is always on the path
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),
            "JUPYTER_DATA_DIR": str(tmp / "data"),
            "IPYTHONDIR": str(tmp / "ipython"),
            "LLMCOURSE_WIDGETS": "live",
            "LLMCOURSE_PROFILE": "ci",
            # one torch thread per kernel: several lessons run at once on 2 cores, and 2 threads per kernel made
            # the heavy lessons 3-6x slower than alone (llmcourse.runtime.MAX_THREADS_ENV)
            "LLMCOURSE_MAX_TORCH_THREADS": os.environ.get("LLMCOURSE_MAX_TORCH_THREADS", "1"),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            # the `course`/`nbgrader` scripts of this interpreter first on PATH
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        })
        env.update(self.extra_env)
        return env

    def command(self) -> list[str]:
        tmp = self._tmp
        cmd = [
            str(jupyter_lab_executable()),
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root_dir}",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.user_settings_dir={tmp / 'user-settings'}",
            f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        ]
        if self.allow_hidden:
            cmd.append("--ContentsManager.allow_hidden=True")
        cmd += self.extra_args
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        return cmd

    def start(self, timeout: float = 90.0) -> LabServer:
        exe = jupyter_lab_executable()
        if not exe.exists():
            raise RuntimeError(f"{exe} not found: run `make setup` first")
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(self.command(), cwd=self.cwd, env=self._env(), stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        problem = wait_until_answering(self.proc, f"{self.url}/api/status", timeout)
        if problem is None:
            return self
        self.stop()
        raise RuntimeError(f"jupyter-lab {problem}:\n{self.log_tail()}")

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 10):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text else None

    def shutdown_kernels(self) -> None:
        """Stop every kernel of this server (frees the CPU between tests)."""
        try:
            for s in self.api("GET", "/api/sessions"):
                self.api("DELETE", f"/api/sessions/{s['id']}")
            for k in self.api("GET", "/api/kernels"):
                self.api("DELETE", f"/api/kernels/{k['id']}")
        except Exception:  # best effort: stop() ends everything anyway
            pass

    def shutdown_notebook(self, path: str) -> None:
        """Stop the kernel session of one notebook (``path`` relative to the server root)."""
        try:
            for s in self.api("GET", "/api/sessions"):
                if s.get("path") == path or (s.get("notebook") or {}).get("path") == path:
                    self.api("DELETE", f"/api/sessions/{s['id']}")
        except Exception:
            pass

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL); its kernels go with it."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self.shutdown_kernels()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc is not None:
            # kernels left behind by a hard kill are in the server's own process group (start_new_session)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
        self.proc = None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


# ------------------------------------------------------------------------------------------ pages

# Console errors that are not the course's fault: none so far. Add a pattern here only with a comment
# saying why it is harmless (e.g. re.compile(r"...")).
IGNORED_CONSOLE: list[re.Pattern] = []


@dataclass
class Tab:
    """A page in its own browser context, with the console errors it logged."""

    page: object
    context: object
    console_errors: list[str] = field(default_factory=list)

    def errors(self) -> list[str]:
        return [e for e in self.console_errors if not any(p.search(e) for p in IGNORED_CONSOLE)]

    def close(self) -> None:
        self.context.close()


def open_tab(browser, width: int = 1400, height: int = 1000) -> Tab:
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(30_000)
    page = context.new_page()
    tab = Tab(page=page, context=context)
    page.on("console", lambda m: tab.console_errors.append(f"console.{m.type}: {m.text} @ {m.location}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: tab.console_errors.append(f"uncaught: {e}"))
    return tab


# JavaScript run in the page: find the notebook panel of a path (through window.jupyterapp).
_FIND_PANEL = """
const findPanel = (path) => {
  const app = window.jupyterapp;
  if (!app) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.content && w.content.widgets) return w;
  }
  return null;
};
"""


def js(body: str, is_async: bool = False) -> str:
    """A page function ``(arg) => {...}`` with ``findPanel`` in scope (never async for wait_for_function:
    a Promise is truthy, so the wait would end at once)."""
    return f"{'async ' if is_async else ''}(arg) => {{ {_FIND_PANEL}\n{body} }}"


def open_notebook(page, server: LabServer, path: str, workspace: str, timeout: float = 120) -> None:
    """Open ``path`` in a fresh JupyterLab workspace and wait until its kernel is idle."""
    page.goto(f"{server.url}/lab/workspaces/{workspace}/tree/{path}?reset", wait_until="domcontentloaded")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=timeout * 1000)
    page.wait_for_function(js("return !!findPanel(arg);"), arg=path, timeout=timeout * 1000)
    wait_kernel_idle(page, path, timeout)


def wait_kernel_idle(page, path: str, timeout: float = 120) -> None:
    page.wait_for_function(js("""
      const p = findPanel(arg);
      if (!p) return false;
      const k = p.sessionContext.session && p.sessionContext.session.kernel;
      return !!k && k.status === 'idle' && p.sessionContext.kernelDisplayName !== 'No Kernel';
    """), arg=path, timeout=timeout * 1000, polling=250)


def kernel_name(page, path: str) -> str:
    return page.evaluate(js("const p = findPanel(arg); return p.sessionContext.session.kernel.name;"), path)


def menu(page, top: str, item: str) -> None:
    """Click ``top`` in JupyterLab's menu bar, then ``item`` in the menu it opens."""
    page.locator(".lm-MenuBar-itemLabel", has_text=top).first.click()
    page.locator(".lm-Menu:visible .lm-Menu-itemLabel").get_by_text(item, exact=True).click()


def mark_cells(page, path: str) -> list[dict]:
    """Set ``data-llmtest-index`` (and ``data-llmtest-grade-id``) on every cell node; returns cell summaries."""
    return page.evaluate(js("""
      const p = findPanel(arg);
      return p.content.widgets.map((c, i) => {
        const nb = c.model.getMetadata('nbgrader') || {};
        c.node.setAttribute('data-llmtest-index', String(i));
        if (nb.grade_id) c.node.setAttribute('data-llmtest-grade-id', nb.grade_id);
        return {index: i, type: c.model.type, grade_id: nb.grade_id || null,
                tags: c.model.getMetadata('tags') || [], source: c.model.sharedModel.getSource()};
      });
    """), path)


def run_state(page, path: str) -> dict:
    """Kernel status, cells still running or queued (``[*]``), unexecuted non-empty code cells, and errors."""
    return page.evaluate(js("""
      const p = findPanel(arg);
      const k = p.sessionContext.session && p.sessionContext.session.kernel;
      const state = {kernel: k ? k.status : 'none', busy: [], unexecuted: [], errors: [], count: 0};
      p.content.widgets.forEach((c, i) => {
        if (c.model.type !== 'code') return;
        state.count += 1;
        const prompt = c.node.querySelector('.jp-InputPrompt');
        if (prompt && prompt.textContent.includes('*')) state.busy.push(i);
        const src = c.model.sharedModel.getSource().trim();
        if (src && c.model.executionCount === null) state.unexecuted.push(i);
        const outs = c.model.outputs.toJSON();
        for (const o of outs) {
          if (o.output_type === 'error') {
            state.errors.push({index: i, ename: o.ename, evalue: String(o.evalue).slice(0, 500),
                               tags: c.model.getMetadata('tags') || [], source: src.slice(0, 300)});
          }
        }
      });
      return state;
    """), path)


def wait_until_done(page, path: str, timeout: float, settle: float = 1.0) -> dict:
    """Wait until no cell is running or queued and the kernel is idle (twice, ``settle`` s apart)."""
    deadline = time.monotonic() + timeout
    stable = 0
    state = {}
    while time.monotonic() < deadline:
        state = run_state(page, path)
        if state["kernel"] == "idle" and not state["busy"]:
            stable += 1
            if stable >= 2:
                return state
            page.wait_for_timeout(settle * 1000)
            continue
        stable = 0
        page.wait_for_timeout(500)
    raise TimeoutError(f"{path}: cells still running after {timeout:.0f} s: {state}")


def execution_time(page, path: str) -> dict:
    """How long the kernel spent on the notebook's code cells, from JupyterLab's ``recordTiming`` metadata.

    Returns ``{"kernel_s": sum over cells of (shell.execute_reply - shell.execute_reply.started), "cells":
    cells timed, "untimed": code cells with no timing}``; the start falls back to ``iopub.execute_input`` when
    the kernel did not send its own start time. Both ends of each difference come from the kernel's clock.
    """
    return page.evaluate(js("""
      const p = findPanel(arg);
      let total = 0, cells = 0, untimed = 0;
      p.content.widgets.forEach((c) => {
        if (c.model.type !== 'code' || !c.model.sharedModel.getSource().trim()) return;
        const e = c.model.getMetadata('execution') || {};
        const start = Date.parse(e['shell.execute_reply.started'] || e['iopub.execute_input'] || '');
        const end = Date.parse(e['shell.execute_reply'] || '');
        if (Number.isFinite(start) && Number.isFinite(end) && end >= start) { total += (end - start) / 1000; cells += 1; }
        else untimed += 1;
      });
      return {kernel_s: total, cells: cells, untimed: untimed};
    """), path)


def save(page, path: str) -> None:
    page.evaluate(js("const p = findPanel(arg); await p.context.save();", is_async=True), path)


def cell_output_text(page, path: str, index: int) -> str:
    """The text of every output of cell ``index`` (stream text, text/plain, error name and value)."""
    return page.evaluate(js("""
      const [path, index] = arg;
      const p = findPanel(path);
      const parts = [];
      for (const o of p.content.widgets[index].model.outputs.toJSON()) {
        if (o.output_type === 'stream') parts.push(Array.isArray(o.text) ? o.text.join('') : o.text);
        else if (o.output_type === 'error') parts.push(o.ename + ': ' + o.evalue);
        else if (o.data && o.data['text/plain']) {
          const t = o.data['text/plain']; parts.push(Array.isArray(t) ? t.join('') : t);
        }
      }
      return parts.join('\\n');
    """), [path, index])
