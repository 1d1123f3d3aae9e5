"""Which lesson section each catalogued mistake points to: ``grader/sections/uNN.toml``, bug id -> a heading of
the unit's lesson (or lab), for the instructor's class report (:mod:`coursetools.report`).

The map is data, derived automatically and then read by people: ``python -m coursetools.sections [UNIT ...]
--write`` scores every ``##``/``###`` section of the unit's lesson notebooks against each catalogued mistake (the
words of its name, its hint and the graded names it replaces and its exercise's name, weighted by how rare each word is among the lesson's
sections; a word in the heading counts more than one in the section's text) and writes the best section of each
as ``how = "auto"``. An entry someone checked or corrected says ``how = "checked"`` and is kept as it is by a later
``--write``; a mistake no section teaches is listed with ``unmapped = "<why>"``. tests/test_sections.py holds every
catalogued mistake of every unit to an entry whose heading exists in its unit's lesson, or to an ``unmapped`` reason.

Headings are the learner's: a section is named as the lesson names it (``lesson 11 §2 RMSNorm``; a ``###`` section
under its numbered ``##`` one: ``lesson 11 §6 Two ways to pair dimensions › Spot the bug: …``), never by a
fixture or check id.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Section", "lesson_sections", "section_map", "section_of", "derive", "SECTIONS_DIR"]

SECTIONS_DIR = Path("grader") / "sections"
_HEADING = re.compile(r"^(#{2,3})\s+(.+?)\s*#*\s*$")
_WORD = re.compile(r"[a-z][a-z0-9]+")
_STOP = set("""the a an of to in and or is it its be by on for at as not no with from this that than then one two
are was were into out over your you their each every any all only but so if when which what who how does do done
same other more most less used use uses using gives give given get gets make makes own one's instead where here
there them they these those has have had can must should would could also just still per between after before
""".split())


@dataclass(frozen=True)
class Section:
    notebook: str  # repository-relative path of the lesson notebook
    heading: str  # the heading's text, as the lesson writes it (markdown marks kept)
    level: int  # 2 or 3
    parent: str | None  # a ### section's ## heading
    text: str  # the section's markdown and code (to its next heading)

    def label(self, unit_id: str) -> str:
        """``lesson 11 §2 RMSNorm`` (``lab`` for a unit's extra lesson)."""
        kind = "lab" if Path(self.notebook).stem.endswith("_lab") else "lesson"

        def part(h: str) -> str:
            m = re.match(r"(\d+)\.\s+(.*)", _plain(h))
            return f"§{m.group(1)} {m.group(2)}" if m else _plain(h)

        if self.level == 3 and self.parent:
            return f"{kind} {unit_id} {part(self.parent)} › {_plain(self.heading)}"
        return f"{kind} {unit_id} {part(self.heading)}"


def _plain(heading: str) -> str:
    """The heading without markdown's code and emphasis marks; an underscore inside a word (``d_k``) stays."""
    return re.sub(r"[`*]|(?<!\w)_+|_+(?!\w)", "", heading).strip()


def lesson_sections(root: Path, notebook: str) -> list[Section]:
    """The ``##`` and ``###`` sections of one lesson notebook (read from the committed ``.ipynb``)."""
    nb = json.loads((root / notebook).read_text(encoding="utf-8"))
    out: list[Section] = []
    current: dict | None = None
    parent: str | None = None

    def close():
        if current is not None:
            out.append(Section(notebook, current["heading"], current["level"], current["parent"],
                               "\n".join(current["text"])))

    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = src.splitlines()
        for line in lines:
            m = _HEADING.match(line) if cell["cell_type"] == "markdown" else None
            if m:
                close()
                level = len(m.group(1))
                if level == 2:
                    parent = m.group(2)
                current = {"heading": m.group(2), "level": level, "parent": parent if level == 3 else None,
                           "text": []}
            elif current is not None:
                current["text"].append(line)
    close()
    return out


def _words(text: str) -> list[str]:
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text).lower().replace("_", " ")
    return [w for w in _WORD.findall(text) if w not in _STOP]


def _bug_words(bug) -> Counter:
    from grader.core import bug_name

    words = Counter(_words(bug_name(bug.id)) * 2 + _words(bug.hint))
    for name in bug.impl:
        words.update(_words(name))
    words.update(_words(bug.exercise_id.split(".", 1)[1]))  # the exercise's own name: a tie-breaker
    return words


def _score(query: Counter, sections: list[Section]) -> list[float]:
    docs = [Counter(_words(s.text)) for s in sections]
    heads = [set(_words(s.heading)) for s in sections]
    n = len(sections)
    idf = {w: math.log((n + 1) / (1 + sum(w in d or w in h for d, h in zip(docs, heads)))) + 0.1 for w in query}
    return [sum(q * idf[w] * ((3.0 if w in h else 0.0) + math.log1p(d[w])) for w, q in query.items())
            for d, h in zip(docs, heads)]


_GENERIC = {"bug", "spot", "mask", "model", "dropout"}  # too common in headings to narrow a section down


def _stem(word: str) -> str:
    return word[:-1] if word.endswith("s") and len(word) > 3 else word


def unit_lessons(unit) -> list[str]:
    return [unit.lesson, *unit.extra_lessons]


def derive(unit, root: Path) -> dict[str, dict]:
    """``{bug id: {"lesson", "heading", "how": "auto", "score"}}``: the best-scoring section of each catalogued
    mistake of ``unit`` (see the module docstring); a mistake no section shares a word with is left out."""
    from grader.core import BUGS
    from grader.runner import load_unit

    load_unit(unit.id)
    sections = [s for nb in unit_lessons(unit) for s in lesson_sections(root, nb)
                if not re.match(r"(summary|what's next|further reading|references)\b", _plain(s.heading).lower())]
    queries: dict[str, Counter] = {}  # one mistake may be catalogued for several exercises (one hint each)
    names: dict[str, set] = {}
    for e in unit.exercises:
        for b in BUGS.get(e.id, []):
            queries.setdefault(b.id, Counter()).update(_bug_words(b))
            names[b.id] = {_stem(w) for w in _words(b.id.split(".", 1)[1])}
    # score the ## sections, each with its ### subsections' text (a subsection is often one experiment or one
    # "spot the bug" of its section: too narrow to stand for a mistake by its words alone)
    tops = [s for s in sections if s.level == 2]
    merged = [Section(t.notebook, t.heading, 2, None, "\n".join(
        [t.heading, t.text] + [c.heading + "\n" + c.text for c in sections if c.parent == t.heading
                                and c.notebook == t.notebook and c.level == 3])) for t in tops]
    out = {}
    for bug_id, query in queries.items():
        scores = _score(query, merged)
        best = max(range(len(merged)), key=lambda i: scores[i]) if merged else None
        if best is None or scores[best] <= 0:
            continue
        chosen = tops[best]
        # a subsection whose heading names the mistake (a word of its name) narrows it down, if only one does
        kids = [c for c in sections if c.level == 3 and c.parent == chosen.heading and c.notebook == chosen.notebook
                and names[bug_id] & {_stem(w) for w in _words(c.heading)} - _GENERIC]
        if len(kids) == 1:
            chosen = kids[0]
        out[bug_id] = {"lesson": chosen.notebook, "heading": chosen.heading, "how": "auto",
                       "score": round(scores[best], 2)}
    return out


def _path(root: Path, unit_id: str) -> Path:
    return root / SECTIONS_DIR / f"u{unit_id}.toml"


@functools.cache
def _load(path: Path, mtime: float) -> dict[str, dict]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def section_map(unit_id: str, root: Path | None = None) -> dict[str, dict]:
    """The committed map of one unit: ``{bug id: {"lesson", "heading", "how"} or {"unmapped": why}}`` ({} if none)."""
    from llmcourse.manifest import course_root

    path = _path(Path(root) if root else course_root(), unit_id)
    return dict(_load(path, path.stat().st_mtime)) if path.is_file() else {}


def section_of(bug_id: str, root: Path | None = None) -> str | None:
    """The learner-facing name of the lesson section ``bug_id`` points to (``lesson 11 §2 RMSNorm``), else None
    (no entry, an ``unmapped`` one, or a heading the lesson no longer has)."""
    from llmcourse.manifest import course_root

    unit_id = bug_id[1:].split(".", 1)[0]
    root = Path(root) if root else course_root()
    entry = section_map(unit_id, root).get(bug_id)
    if not entry or "heading" not in entry:
        return None
    for s in _sections_cached(root, entry["lesson"]):
        if s.heading == entry["heading"]:
            return s.label(unit_id)
    return None


@functools.cache
def _sections_cached(root: Path, notebook: str) -> tuple[Section, ...]:
    try:
        return tuple(lesson_sections(root, notebook))
    except OSError:
        return ()


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def write_map(unit, root: Path) -> Path:
    """Rewrite ``grader/sections/uNN.toml``: entries marked ``checked`` or ``unmapped`` kept, the rest derived."""
    path = _path(root, unit.id)
    old = tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    auto = derive(unit, root)
    from grader.core import BUGS

    ids = list(dict.fromkeys(b.id for e in unit.exercises for b in BUGS.get(e.id, [])))
    lines = [f"# Unit {unit.id}: the lesson section each catalogued mistake points to (coursetools/sections.py).",
             "# how = \"auto\": derived by `python -m coursetools.sections --write` (rewritten by it); \"checked\": "
             "read or set by a person (kept).", "# unmapped = \"why\": no section of the lesson teaches it.", ""]
    for bug_id in ids:
        entry = old.get(bug_id)
        if not (entry and (entry.get("how") == "checked" or "unmapped" in entry)):
            entry = auto.get(bug_id) or {"unmapped": "no section of the lesson shares a word with its name or hint"}
        lines.append(f"[{_toml_str(bug_id)}]")
        for k in ("lesson", "heading", "how", "score", "unmapped"):
            if k in entry:
                lines.append(f"{k} = {entry[k]!r}" if k == "score" else f"{k} = {_toml_str(str(entry[k]))}")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coursetools.sections", description=__doc__.split("\n\n")[0])
    p.add_argument("units", nargs="*", help="unit ids (default: every unit)")
    p.add_argument("--write", action="store_true", help="rewrite grader/sections/uNN.toml (keeps checked entries)")
    args = p.parse_args(argv)
    from llmcourse.manifest import load_course

    course = load_course()
    for unit in course.units:
        if args.units and unit.id not in args.units:
            continue
        if args.write:
            print(write_map(unit, course.root))
            continue
        for bug_id, entry in derive(unit, course.root).items():
            s = next(x for x in lesson_sections(course.root, entry["lesson"]) if x.heading == entry["heading"])
            print(f"{bug_id:45} {entry['score']:6.1f}  {s.label(unit.id)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
