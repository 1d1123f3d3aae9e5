"""nbgrader configuration of the course (also loaded by the repository's top-level nbgrader_config.py).

Course directory layout (names relative to the course root):
  solutions/<NN_slug>/<NN_slug>.ipynb   nbgrader *source* (reference answers, hidden-test hooks)
  exercises/<NN_slug>/<NN_slug>.ipynb   nbgrader *release* (what students get; committed)
  .grading/                             gradebook, submissions, autograded and feedback (never committed)

Environment:
  LLMCOURSE_NBGRADER_ROOT   another course root (the CLI and tests use temporary ones)
  LLMCOURSE_CELL_TIMEOUT    seconds per cell when autograding (default 600; nbgrader's own default, 30 s,
                            is too short for training cells under the laptop profile)
  LLMCOURSE_KERNEL_SOCKETS  a private folder (mode 0700) for the kernels' Unix sockets (default
                            <tempdir>/llmcourse-kernels-<uid>; `course grade` makes one per run)
  LLMCOURSE_KERNEL_FORKSERVER  1: kernels forked from a pre-imported state (grader/kernelfork.py; set by
                            `course grade --execute` unless it is 0 in its environment)
  LLMCOURSE_KERNEL_PRELOAD  what that fork server imports beside ipykernel, torch, numpy and llmcourse
"""

import os
import secrets
import tempfile
from pathlib import Path

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

root = Path(os.environ.get("LLMCOURSE_NBGRADER_ROOT") or Path(__file__).resolve().parents[1])
grading = root / ".grading"
grading.mkdir(parents=True, exist_ok=True)  # sqlite cannot create the gradebook's folder

c.CourseDirectory.root = str(root)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.submitted_directory = ".grading/submitted"
c.CourseDirectory.autograded_directory = ".grading/autograded"
c.CourseDirectory.feedback_directory = ".grading/feedback"
c.CourseDirectory.db_url = f"sqlite:///{grading / 'gradebook.db'}"
c.CourseDirectory.course_id = "llmcourse"

# Execution while autograding: a generous cell timeout; a timed-out cell is interrupted and recorded
# as an error, and the notebook goes on (nbgrader's Execute keeps going after errors).
c.Execute.timeout = int(os.environ.get("LLMCOURSE_CELL_TIMEOUT", "600"))
c.Execute.interrupt_on_timeout = True
c.Execute.startup_timeout = 120

# Kernels on private Unix sockets, never TCP ports. With TCP each kernel's five ports are picked by binding
# port 0 and releasing it; another process launching a kernel at that moment (a second `course grade --jobs`
# job, a test runner, JupyterLab) can be handed the same port first. The client then talks to the wrong
# kernel, which drops its messages as badly signed, and nbgrader waits startup_timeout for a reply that never
# comes ("Kernel didn't respond in 120 seconds"): a failure of timing only. jupyter_client's port cache
# covers one process. Here every nbgrader process gets its own random socket prefix in a folder only this
# user can enter; its kernels run one after the other and jupyter_client numbers their sockets past any
# that exist. (nbgrader's Execute fixes kernel_manager_class, so this is configured on KernelManager.)
sockets = os.environ.get("LLMCOURSE_KERNEL_SOCKETS") or os.path.join(tempfile.gettempdir(),
                                                                        f"llmcourse-kernels-{os.getuid()}")
os.makedirs(sockets, mode=0o700, exist_ok=True)
if os.stat(sockets).st_uid == os.getuid() and not os.stat(sockets).st_mode & 0o077 and len(sockets) < 70:
    c.KernelManager.transport = "ipc"
    c.KernelManager.ip = os.path.join(sockets, secrets.token_hex(8))  # + "-<n>": within a socket path's 103 bytes

# Students delete or retype grade cells: restore them from the gradebook.
c.OverwriteCells.add_missing_cells = True

# Stubs in released notebooks.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# Feedback: never show hidden-check source, neither in cells nor in tracebacks.
c.GenerateFeedback.exporter_class = "grader.feedback.FeedbackHTMLExporter"  # nbconvert's, less a slow re-parse
c.GenerateFeedback.preprocessors = [
    "grader.feedback.StripHiddenTests",
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# `course grade --execute`: kernels forked from a pre-imported state (grader/kernelfork.py says how and why), with the
# normal launch as the fallback
if os.environ.get("LLMCOURSE_KERNEL_FORKSERVER") == "1":
    from grader.kernelfork import install

    install()
