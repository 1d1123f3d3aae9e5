"""nbgrader configuration of the course (also loaded by the repository's top-level nbgrader_config.py).

Course directory layout (names relative to the course root):
  solutions/<NN_slug>/<NN_slug>.ipynb   nbgrader *source* (reference answers, hidden-test hooks)
  exercises/<NN_slug>/<NN_slug>.ipynb   nbgrader *release* (what students get; committed)
  .grading/                             gradebook, submissions, autograded and feedback (never committed)

Environment:
  LLMCOURSE_NBGRADER_ROOT   another course root (the CLI and tests use temporary ones)
  LLMCOURSE_CELL_TIMEOUT    seconds per cell when autograding (default 600; nbgrader's own default, 30 s,
                            is too short for training cells under the laptop profile)
"""

import os
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

# Students delete or retype grade cells: restore them from the gradebook.
c.OverwriteCells.add_missing_cells = True

# Stubs in released notebooks.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# Feedback: never show hidden-check source, neither in cells nor in tracebacks.
c.GenerateFeedback.preprocessors = [
    "grader.feedback.StripHiddenTests",
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
