"""The class builder of ``coursetools.bench.class_grading`` (fast; grading the class is in test_grading_jobs.py)."""

from __future__ import annotations

import ast
import json
import math

import nbformat
import pytest
import torch
from torch import nn

from coursetools.bench.class_grading import KINDS, _answer_cells, _bound_names, build_class, mutant_source


def _outcome(f, x, mask):
    try:
        return f(x, x, x, mask)
    except Exception as exc:  # noqa: BLE001 - compared by type
        return type(exc).__name__


@pytest.mark.filterwarnings("ignore:The use of `x.T`")  # the transpose_T mutant
def test_a_written_mutant_behaves_as_the_catalogued_one(course):
    from grader.core import BUGS
    from grader.runner import load_unit

    unit = course.unit("03")
    load_unit("03")
    solution = nbformat.read(course.root / unit.solution, as_version=4)
    available = _bound_names([c.source for c in solution.cells if c.cell_type == "code"])
    written = 0
    x = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0))
    for bug in BUGS["03.scaled_dot_product_attention"]:
        (name, obj), = bug.impl.items()
        source = mutant_source(obj, name, available)
        if source is None:
            continue
        ns = {"torch": torch, "math": math, "nn": nn}
        exec(compile(source, "<mutant>", "exec"), ns)  # trusted: the course's own bug catalog
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
        got, want = _outcome(ns[name], x, mask), _outcome(obj, x, mask)
        if isinstance(want, str):  # the mutant raises (e.g. `.T` on a batch): the written one the same way
            assert got == want, bug.id
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=bug.id)
        written += 1
    assert written >= 5, "most attention mutants (a closure over a shared helper) must be writable"


def test_a_mutant_whose_helper_calls_the_reference_by_its_name_calls_the_solution(course):
    """A rope_inv_freq mutant starts from the reference rope_inv_freq (in its bug-catalog module); written into a
    notebook under the same name it must call the solution's definition, not itself (endless recursion)."""
    from grader.core import BUGS
    from grader.extract import extract_namespace
    from grader.runner import load_unit

    unit = course.unit("11")
    load_unit("11")
    solution = nbformat.read(course.root / unit.solution, as_version=4)
    code = [c.source for c in solution.cells if c.cell_type == "code"]
    scaling = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    written = 0
    for bug in BUGS["11.rope"]:
        if set(bug.impl) != {"rope_inv_freq"}:
            continue
        obj = bug.impl["rope_inv_freq"]
        source = mutant_source(obj, "rope_inv_freq", _bound_names(code), code)
        if source is None or "_reference_rope_inv_freq" not in source:
            continue
        answer = _answer_cells(solution)["ex11_rope_answer"]
        ns = extract_namespace(code[:1] + [answer + "\n\n\n" + source]).namespace  # as the grader loads the cell
        torch.testing.assert_close(ns["rope_inv_freq"](16, 500000.0, scaling), obj(16, 500000.0, scaling), rtol=0,
                                   atol=0, msg=bug.id)
        written += 1
    assert written >= 2, "the smoothing-blend mutants call the reference rope_inv_freq from a helper"


def test_a_mutant_that_calls_the_reference_by_its_own_name_calls_the_solution(course):
    """Unit 17's expert-conversion mutant ends with ``return load_hf_deepseek(model, sd)`` (the course's loader);
    written under the name ``load_hf_deepseek`` it must call the solution's definition, not itself."""
    from grader.core import BUGS
    from grader.runner import load_unit

    unit = course.unit("17")
    load_unit("17")
    solution = nbformat.read(course.root / unit.solution, as_version=4)
    code = [c.source for c in solution.cells if c.cell_type == "code"]
    bug = next(b for b in BUGS["17.DeepSeekLM"] if b.id == "B17.expert_conversion")
    source = mutant_source(bug.impl["load_hf_deepseek"], "load_hf_deepseek", _bound_names(code), code)
    tree = ast.parse(source)
    mutant = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "load_hf_deepseek")
    called = {n.func.id for n in ast.walk(mutant) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "load_hf_deepseek" not in called and "_reference_load_hf_deepseek" in called
    assert any(isinstance(n, ast.FunctionDef) and n.name == "_reference_load_hf_deepseek" for n in tree.body)


def test_the_class_is_seeded_and_has_every_kind(course, tmp_path):
    unit = course.unit("03")
    kinds = build_class(unit, 8, tmp_path / "a", seed=5, course=course)
    again = build_class(unit, 8, tmp_path / "b", seed=5, course=course)
    assert kinds == again and set(kinds.values()) == set(KINDS)
    name = unit.name + ".ipynb"
    for student, kind in kinds.items():
        a = (tmp_path / "a" / student / unit.name / name).read_text(encoding="utf-8")
        assert a == (tmp_path / "b" / student / unit.name / name).read_text(encoding="utf-8")
        if kind == "right":
            answers = _answer_cells(nbformat.reads(a, as_version=4))
            solution = _answer_cells(nbformat.read(course.root / unit.solution, as_version=4))
            assert answers == solution
    broken = [s for s, k in kinds.items() if k == "broken"]
    assert broken
    for s in broken:  # invalid JSON, or valid JSON with a syntax error in an answer
        text = (tmp_path / "a" / s / unit.name / name).read_text(encoding="utf-8")
        try:
            json.loads(text)
        except ValueError:
            continue
        assert any(_bound_names([src]) == set() for src in _answer_cells(nbformat.reads(text, as_version=4)).values())
