"""The course manifest, ``course.toml``: metadata, runtime profiles and units in order.

Every consumer (the ``course`` CLI, the tests, nbgrader assignment names, the README map and
``course_home.ipynb``) reads the manifest through this module, so there is one source of truth.

Exercise ids are ``NN.name`` (for example ``03.scaled_dot_product_attention``); nbgrader grade
ids allow only ``[A-Za-z0-9_-]``, so the grade cell of an exercise is named mechanically
``exNN_name`` (:func:`grade_id`).
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Course", "Exercise", "Unit", "course_root", "load_course", "grade_id", "exercise_id_from_grade_id"]

_EXERCISE_ID = re.compile(r"^(\d\d)\.([A-Za-z_][A-Za-z0-9_]*)$")


def course_root() -> Path:
    """The repository root: ``$LLMCOURSE_ROOT`` if set, else the folder above this package.

    Raises:
        FileNotFoundError: when no ``course.toml`` is found there.
    """
    env = os.environ.get("LLMCOURSE_ROOT")
    root = Path(env) if env else Path(__file__).resolve().parents[1]
    if not (root / "course.toml").is_file():
        raise FileNotFoundError(
            f"course.toml not found in {root}. Install the course with `pip install -e .` from its "
            "repository, or set LLMCOURSE_ROOT to the repository folder."
        )
    return root


def grade_id(exercise_id: str) -> str:
    """``"03.softmax_stable"`` -> ``"ex03_softmax_stable"`` (the nbgrader grade cell id)."""
    m = _EXERCISE_ID.match(exercise_id)
    if not m:
        raise ValueError(f"not an exercise id (expected 'NN.name'): {exercise_id!r}")
    return f"ex{m.group(1)}_{m.group(2)}"


def exercise_id_from_grade_id(gid: str) -> str | None:
    """Inverse of :func:`grade_id`; ``None`` for ids that are not exercise grade cells."""
    m = re.match(r"^ex(\d\d)_([A-Za-z_][A-Za-z0-9_]*)$", gid)
    return f"{m.group(1)}.{m.group(2)}" if m else None


@dataclass(frozen=True)
class Exercise:
    id: str
    points: int
    unit_id: str

    @property
    def name(self) -> str:
        """The graded function or class name part of the id (``softmax_stable``)."""
        return self.id.split(".", 1)[1]

    @property
    def grade_id(self) -> str:
        return grade_id(self.id)


@dataclass(frozen=True)
class Unit:
    id: str
    slug: str
    title: str
    available: bool
    lesson: str
    exercise: str
    solution: str
    prerequisites: tuple[str, ...]
    minutes: dict
    exercises: tuple[Exercise, ...] = field(default_factory=tuple)
    extra_lessons: tuple[str, ...] = ()
    study_hours: float | None = None  # expected study time, lesson + exercise (coursetools/dev/studytime.py)

    @property
    def name(self) -> str:
        """``NN_slug``: the nbgrader assignment name and the notebook stem."""
        return f"{self.id}_{self.slug}"

    @property
    def points(self) -> int:
        return sum(e.points for e in self.exercises)

    def notebooks(self) -> list[str]:
        """Repository-relative paths of every notebook this unit owns."""
        return [self.lesson, *self.extra_lessons, self.solution, self.exercise]


@dataclass(frozen=True)
class Course:
    root: Path
    meta: dict
    profiles: dict
    units: tuple[Unit, ...]

    def unit(self, unit_id: str) -> Unit:
        """The unit with id ``"NN"`` (also accepts ``"NN_slug"``). Raises KeyError."""
        for u in self.units:
            if unit_id in (u.id, u.name):
                return u
        raise KeyError(f"no unit {unit_id!r} in course.toml")

    def exercise(self, exercise_id: str) -> Exercise:
        for u in self.units:
            for e in u.exercises:
                if e.id == exercise_id:
                    return e
        raise KeyError(f"no exercise {exercise_id!r} in course.toml")

    @property
    def available_units(self) -> list[Unit]:
        return [u for u in self.units if u.available]

    def unit_for_notebook(self, path: str | os.PathLike) -> Unit | None:
        """The unit whose exercise, solution or lesson notebook has this file name, else None."""
        name = Path(path).name
        for u in self.units:
            if name in {Path(p).name for p in u.notebooks()}:
                return u
        return None


@functools.cache
def _load(root: Path, mtime: float) -> Course:
    data = tomllib.loads((root / "course.toml").read_text(encoding="utf-8"))
    units = []
    for raw in data["units"]:
        exercises = tuple(Exercise(id=e["id"], points=int(e["points"]), unit_id=raw["id"]) for e in raw["exercises"])
        for e in exercises:
            grade_id(e.id)  # validates the id format
        units.append(
            Unit(
                id=raw["id"], slug=raw["slug"], title=raw["title"], available=bool(raw["available"]),
                lesson=raw["lesson"], exercise=raw["exercise"], solution=raw["solution"],
                prerequisites=tuple(raw.get("prerequisites", [])), minutes=dict(raw.get("minutes", {})),
                exercises=exercises, extra_lessons=tuple(raw.get("extra_lessons", [])),
                study_hours=raw.get("study_hours"),
            )
        )
    return Course(root=root, meta=data["course"], profiles=data["profiles"], units=tuple(units))


def load_course(root: str | os.PathLike | None = None) -> Course:
    """Parse ``course.toml`` (cached until the file changes)."""
    root = Path(root) if root else course_root()
    return _load(root.resolve(), (root / "course.toml").stat().st_mtime)
