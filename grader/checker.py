"""The checker process of ``course grade``: decides verdicts where learner code never ran.

``course grade`` (``coursetools/grading.py``) copies ``grader/``, ``llmcourse/``, ``course.toml`` and
``assets/`` into a snapshot folder and hashes it before the first submission runs, then starts this
module from the snapshot (``python -I``, the snapshot first on ``sys.path``). Requests and replies
are JSON lines on two dedicated pipes (file descriptors given on the command line), never stdin or
stdout. For each submission it receives the code cells (locked cells already restored) and answers
with one verdict per exercise; learner definitions run only in this process's worker children
(``grader/worker.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys


def _verdicts(unit_id: str, sources: list[str]) -> list[dict]:
    from .runner import run_unit

    return [dataclasses.asdict(v) for v in run_unit(unit_id, sources)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    read_fd, write_fd = int(argv[0]), int(argv[1])
    from .forkserver import start_forkserver

    start_forkserver()  # first: it preloads torch while this process imports its own
    from llmcourse.manifest import load_course

    from .runner import load_unit
    course = load_course()
    for unit in course.available_units:  # every check and mutant imported before any learner code runs
        load_unit(unit.id)
        for spec_id in [e.id for e in unit.exercises]:
            from .core import CHECKS

            spec = CHECKS.get(spec_id)
            if spec is not None:
                try:
                    spec.reference()
                except Exception:  # noqa: BLE001 - reported by the check itself later
                    pass
    with os.fdopen(read_fd, "r", encoding="utf-8") as requests, os.fdopen(write_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps({"ready": True, "root": str(course.root)}) + "\n")
        out.flush()
        for line in requests:
            job = json.loads(line)
            if job.get("op") == "exit":
                break
            try:
                reply = {"key": job["key"], "verdicts": _verdicts(job["unit"], job["sources"])}
            except Exception as exc:  # noqa: BLE001 - fail closed: the caller records 0 with the cause
                reply = {"key": job["key"], "error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
