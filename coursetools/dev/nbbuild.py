"""Build the committed notebooks from their reviewable sources.

Sources are jupytext "percent" scripts under ``notebooks/``:

* ``notebooks/lessons/<name>.py``   -> ``lessons/<name>.ipynb``
* ``notebooks/solutions/<NN_slug>.py`` -> ``solutions/<NN_slug>/<NN_slug>.ipynb`` (nbgrader source)
* ``course.toml``                     -> ``course_home.ipynb`` (the landing page of ``make lab``)

Cell tags in the source header (``# %% tags=["..."]``) carry the course's conventions:

* ``solution:NN.name``: an autograded answer cell of exercise ``NN.name`` (``### BEGIN/END SOLUTION``
  regions inside are replaced by stubs at release);
* ``tests:NN.name``: the exercise's autograder test cell, grade id ``exNN_name``, points from
  course.toml; visible asserts plus a ``### BEGIN HIDDEN TESTS`` block that calls ``grader.grade``;
* ``nbval-ignore-output``, ``nbval-skip``, ``raises-exception``: kept as tags (nbval / Jupyter).

Every exercise (solution) notebook gets, from the builder, a last markdown cell and a last code cell
``llmcourse.check()`` (:data:`CHECK_MARKDOWN`, :data:`CHECK_CODE`): the in-notebook check of the saved file. They are not graded
(no nbgrader metadata) and print one line under nbval / nbgrader (see :func:`llmcourse.check`). The
introduction's sentence ``**Check your work** at any time: save the notebook, then run in a terminal`` is
rewritten to name that check first (:func:`_intro_check_first`).

The output is normalised (course kernelspec, deterministic cell ids, no outputs) so rebuilding an
unchanged source gives byte-identical notebooks; ``tests/test_notebooks_built.py`` checks that.
Run ``make notebooks`` (``python -m coursetools.dev.nbbuild``) after editing a source.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import jupytext
import nbformat

from llmcourse.manifest import grade_id, load_course

__all__ = ["build_all", "build_notebook", "course_home", "outputs_for_sources"]


def _kernelspec(course) -> dict:
    return {"display_name": course.meta["kernel_display_name"], "language": "python", "name": course.meta["kernel_name"]}


def _normalise(nb, course, prefix: str) -> nbformat.NotebookNode:
    nb.metadata = nbformat.from_dict({
        "kernelspec": _kernelspec(course),
        "language_info": {"name": "python", "pygments_lexer": "ipython3"},
    })
    nb.nbformat, nb.nbformat_minor = 4, 5
    for i, cell in enumerate(nb.cells):
        cell.id = f"{prefix}-{i:03d}"
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


CHECK_MARKDOWN = """## Check your work

Save the notebook (**Ctrl+S**), then run the cell below. It runs the grader's checks on the notebook *as
saved*, in a separate process, and shows a table: for each exercise *passed*, *failed* (what went wrong
and, for a known mistake, its name and a hint) or *not attempted*, with your points and the total. You can
call `llmcourse.check()` in any cell. In a terminal, `course check {exercise}` prints the same report."""
CHECK_CODE = "llmcourse.check()"
CHECK_TAG = "llmcourse-check"

INTRO_TERMINAL = "**Check your work** at any time: save the notebook, then run in a terminal"
INTRO_CHECK_FIRST = ("**Check your work** at any time: save the notebook (Ctrl+S) and run the last cell, "
                     "`llmcourse.check()` (it works in any cell): it shows a table of your results. Or run in "
                     "a terminal")


def _intro_check_first(nb) -> None:
    """The introduction names the in-notebook check first and the terminal command second."""
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first is None or "llmcourse.check()" in first.source:
        return
    if INTRO_TERMINAL in first.source:
        first.source = first.source.replace(INTRO_TERMINAL, INTRO_CHECK_FIRST, 1)
    else:
        first.source += ("\n\n**Check your work** at any time: save the notebook (Ctrl+S) and run the last cell, "
                         "`llmcourse.check()`; or `course check` in a terminal.")


def add_check_cells(nb, course, unit_id: str) -> None:
    """Append the "Check your work" cells (no nbgrader metadata: never graded; the release copies them)."""
    if any(CHECK_TAG in c.metadata.get("tags", []) for c in nb.cells):
        return
    try:
        exercise = course.unit(unit_id).exercise
    except KeyError:
        return
    _intro_check_first(nb)
    nb.cells.append(nbformat.v4.new_markdown_cell(CHECK_MARKDOWN.format(exercise=exercise)))
    code = nbformat.v4.new_code_cell(CHECK_CODE)
    code.metadata["tags"] = [CHECK_TAG]
    nb.cells.append(code)


def build_notebook(source: Path, course=None) -> nbformat.NotebookNode:
    """Convert one percent-format source into a normalised notebook (nbgrader metadata included)."""
    course = course or load_course()
    nb = jupytext.read(source, fmt="py:percent")
    seen: dict[str, int] = {}
    for cell in nb.cells:
        tags = list(cell.metadata.get("tags", []))
        keep = []
        for tag in tags:
            m = re.fullmatch(r"(solution|tests):(\d\d\.\w+)", tag)
            if not m:
                keep.append(tag)
                continue
            kind, ex_id = m.groups()
            exercise = course.exercise(ex_id)  # KeyError for an id course.toml does not list
            gid = grade_id(ex_id)
            if kind == "tests":
                cell.metadata["nbgrader"] = {"grade": True, "grade_id": gid, "locked": True,
                                             "points": exercise.points, "schema_version": 3, "solution": False,
                                             "task": False}
            else:
                n = seen.get(gid, 0) + 1
                seen[gid] = n
                cell.metadata["nbgrader"] = {"grade": False, "grade_id": f"{gid}_answer" + (f"_{n}" if n > 1 else ""),
                                             "locked": False, "schema_version": 3, "solution": True, "task": False}
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in {"tags", "nbgrader", "jupyter"}}  # jupyter: source_hidden (collapsed reference fixes)
        if keep:
            cell.metadata["tags"] = keep
        else:
            cell.metadata.pop("tags", None)
    if source.parent.name == "solutions":
        add_check_cells(nb, course, source.stem.split("_")[0])
    return _normalise(nb, course, source.stem.split("_")[0])


def course_home(course=None) -> nbformat.NotebookNode:
    """The landing notebook: the course map from course.toml with links to lessons and exercises."""
    course = course or load_course()
    md = [f"# {course.meta['title']}", "",
          "Welcome. Work through the units in order: read and run the **lesson**, then fill in the "
          "**exercise** notebook; save it and run its last cell, `llmcourse.check()`, to see the grader's "
          "verdicts (or `course check <exercise notebook>` in a terminal). See README.md for the full workflow.", "",
          course_map_markdown(course, links=True)]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("\n".join(md))]
    return _normalise(nb, course, "home")


def course_map_markdown(course=None, links: bool = True) -> str:
    """The course map table (used in README.md and course_home.ipynb).

    The Lesson column lists the unit's lab notebooks (``extra_lessons``) after its lesson; Study (h) is the
    expected study time (course.toml ``study_hours``, set by :mod:`coursetools.dev.studytime`); the minutes are
    the compute budget of lesson + solution (labs state their own expected time at their top).
    """
    course = course or load_course()
    rows = ["| Unit | Title | Lesson (+ optional labs) | Exercise | Points | Study (h) | ci / laptop (min) | Status |",
            "|---|---|---|---|---:|---:|---|---|"]
    for u in course.units:
        if u.available and links:
            lesson, exercise = f"[lesson]({u.lesson})", f"[exercise]({u.exercise})"
            labs = [f"[lab]({p})" for p in u.extra_lessons]
        else:
            lesson, exercise = f"`{Path(u.lesson).name}`", f"`{Path(u.exercise).name}`"
            labs = [f"`{Path(p).name}`" for p in u.extra_lessons]
        lesson = " + ".join([lesson, *labs])
        status = "available" if u.available else "not yet available"
        study = f"{u.study_hours:g}" if u.study_hours is not None else "?"
        rows.append(f"| {u.id} | {u.title} | {lesson} | {exercise} | {u.points} | {study} | "
                    f"{u.minutes.get('ci', '?')} / {u.minutes.get('laptop', '?')} | {status} |")
    rows += ["", "**Study (h)**: the expected time for a learner who knows Python to read and run the lesson and "
             "to solve the exercise. It is an estimate by a stated rule, not a measurement with learners: prose at "
             "120 words a minute, 1.5 minutes per lesson code cell, 10 minutes per spot-the-bug fix and 8 minutes "
             "per exercise point, rounded up to the half hour (`python -m coursetools.dev.studytime`).", "",
             "**ci / laptop (min)**: compute time, how long the lesson and the exercise's solution run top to "
             "bottom under each profile. A **lab** is an optional companion notebook of its unit (longer training "
             "runs, extra experiments); its expected time is stated at its top."]
    return "\n".join(rows)


def outputs_for_sources(course=None) -> dict[Path, nbformat.NotebookNode]:
    """Every notebook the builder produces, keyed by its repository-relative output path."""
    course = course or load_course()
    root = course.root
    out: dict[Path, nbformat.NotebookNode] = {}
    for src in sorted((root / "notebooks" / "lessons").glob("*.py")):
        out[Path("lessons") / f"{src.stem}.ipynb"] = build_notebook(src, course)
    for src in sorted((root / "notebooks" / "solutions").glob("*.py")):
        out[Path("solutions") / src.stem / f"{src.stem}.ipynb"] = build_notebook(src, course)
    out[Path(course.meta.get("home", "course_home.ipynb"))] = course_home(course)
    return out


def dumps(nb) -> str:
    return nbformat.writes(nb) + "\n" if not nbformat.writes(nb).endswith("\n") else nbformat.writes(nb)


def build_all(check: bool = False) -> list[Path]:
    """Write (or with ``check=True`` only compare) every built notebook; returns the stale/written paths."""
    course = load_course()
    changed = []
    for rel, nb in outputs_for_sources(course).items():
        path = course.root / rel
        text = dumps(nb)
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        changed.append(rel)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    changed = build_all(check=check)
    verb = "stale" if check else "wrote"
    for rel in changed:
        print(f"{verb}: {rel}")
    if not changed:
        print("all notebooks are up to date with their sources")
    return 1 if (check and changed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
