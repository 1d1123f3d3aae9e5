"""Rewrite the course map in README.md (between the course-map markers) and course_home.ipynb from course.toml."""

from __future__ import annotations

from llmcourse.manifest import load_course

from .nbbuild import build_all, course_map_markdown

BEGIN, END = "<!-- course-map:begin -->", "<!-- course-map:end -->"


def main() -> int:
    course = load_course()
    path = course.root / "README.md"
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{course_map_markdown(course)}\n{END}{tail}", encoding="utf-8")
    build_all()
    print("README.md course map and course_home.ipynb updated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
