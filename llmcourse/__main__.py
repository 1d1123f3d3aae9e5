"""``python -m llmcourse ...``: an alias of ``python -m coursetools ...`` (the ``course`` command).

The student library does not import the course tooling; the alias runs it as a command in this interpreter
(same arguments, standard streams and exit code), as ``llmcourse.check()`` does.
"""

import subprocess
import sys

raise SystemExit(subprocess.call([sys.executable, "-m", "coursetools", *sys.argv[1:]]))
