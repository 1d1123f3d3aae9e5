"""Waiting for a server process that was just started to answer on its URL (JupyterHub, JupyterLab)."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request

__all__ = ["wait_until_answering"]


def wait_until_answering(proc: subprocess.Popen, url: str, timeout: float, poll_s: float = 0.25) -> str | None:
    """Poll ``url`` until it answers HTTP 200; None then, else why not.

    Returns:
        None once ``url`` answered 200; ``"exited with code N"`` as soon as ``proc`` has ended; ``"did not answer
        on <url> within <timeout> s"`` when ``timeout`` seconds passed first. The caller stops ``proc`` and
        raises its own error with the log.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with code {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(poll_s)
    return f"did not answer on {url} within {timeout:.0f} s"
