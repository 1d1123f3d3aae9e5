"""grader/sections/uNN.toml (coursetools/sections.py): every catalogued mistake of every unit points to a heading
its unit's lesson has, or says why it cannot."""

from __future__ import annotations

import pytest

from coursetools.sections import _plain, derive, lesson_sections, section_map, section_of, unit_lessons
from llmcourse.manifest import load_course

COURSE = load_course()


def _catalog(unit) -> list[str]:
    from grader.core import BUGS
    from grader.runner import load_unit

    load_unit(unit.id)
    return list(dict.fromkeys(b.id for e in unit.exercises for b in BUGS.get(e.id, [])))


@pytest.mark.parametrize("u", COURSE.units, ids=lambda u: u.id)
def test_every_catalogued_mistake_points_to_a_heading_of_its_lesson(u):
    unit = u
    catalog = _catalog(unit)
    entries = section_map(unit.id, COURSE.root)
    headings = {nb: {s.heading for s in lesson_sections(COURSE.root, nb)} for nb in unit_lessons(unit)}
    problems = []
    for bug_id in catalog:
        entry = entries.get(bug_id)
        if entry is None:
            problems.append(f"{bug_id}: no entry (run `python -m coursetools.sections {unit.id} --write`)")
        elif "unmapped" in entry:
            if len(entry["unmapped"].strip()) < 10:
                problems.append(f"{bug_id}: unmapped without a reason")
        elif entry.get("lesson") not in headings:
            problems.append(f"{bug_id}: {entry.get('lesson')} is not a lesson of unit {unit.id}")
        elif entry.get("heading") not in headings[entry["lesson"]]:
            problems.append(f"{bug_id}: no heading {entry.get('heading')!r} in {entry['lesson']}")
        elif entry.get("how") not in ("auto", "checked"):
            problems.append(f"{bug_id}: how = {entry.get('how')!r} (auto or checked)")
        else:
            assert section_of(bug_id, COURSE.root).startswith(("lesson " + unit.id, "lab " + unit.id))
    stale = sorted(set(entries) - set(catalog))
    assert not problems and not stale, problems + [f"{s}: not in the catalog any more" for s in stale]


def test_the_label_is_the_lesson_s_own_heading():
    assert section_of("B11.rms_eps_outside", COURSE.root) == "lesson 11 §2 RMSNorm"
    assert section_of("B03.no_such_mistake", COURSE.root) is None
    # markdown marks go, an underscore inside a word stays (a heading with $\\sqrt{d_k}$ must keep its d_k)
    assert _plain("Why divide by $\\sqrt{d_k}$? `mask` and *__emphasis__*") == "Why divide by $\\sqrt{d_k}$? mask and emphasis"


def test_derivation_finds_the_section_that_teaches_a_mistake():
    # an independent reading of lesson 11: its RMSNorm and SwiGLU mistakes are taught in §2 and §3
    got = derive(COURSE.unit("11"), COURSE.root)
    assert got["B11.rms_eps_outside"]["heading"] == "2. RMSNorm"
    assert got["B11.swiglu_swapped"]["heading"] == "3. SiLU and SwiGLU"
    assert got["B11.repeat_not_interleave"]["heading"] == "8. Grouped-query attention"
