"""The mutation tool (coursetools/dev/mutation.py): each operator makes the mutant it should, ids are stable, and a
seeded sample of mutants of every unit (two per exercise) has the outcome its stored full run recorded."""

from __future__ import annotations

import ast

import pytest

from coursetools.dev import mutation as mt

CELL = '''\
def f(x, scale=2.0, training=False):
    """A docstring outside the block."""
    ### BEGIN SOLUTION
    y = x.transpose(-2, -1) + 1
    z = y.mean(dim=-1, keepdim=True).detach()
    if self.training and scale > 0:
        z = -z
    for i in range(3):
        if i == 1:
            break
    w = torch.cat([y[:, 1:n], y.T], 0)
    return F.dropout(z * scale, 0.1, training=training) @ w
    ### END SOLUTION


def untouched(a, b=1):
    return a - b
'''

# one expected mutant per operator: id -> the mutated block line
EXPECTED = {
    "arith@1.1: + -> -": "y = x.transpose(-2, -1) - 1",
    "const@1.1: 1 -> 2": "y = x.transpose(-2, -1) + 2",
    "transpose@1.1: .transpose(-2, -1) removed": "y = x + 1",
    "swap@1.9: F.dropout(..z * scale, 0.1..) swapped": "return F.dropout(0.1, z * scale, training=training) @ w",
    "delete@1.1: y = x.transpose(-2, -1) + 1 -> pass": "pass",
    "dim@1.2: -1 -> -2": "z = y.mean(dim=-2, keepdim=True).detach()",
    "dim@1.2: dim=-1 dropped": "z = y.mean(keepdim=True).detach()",
    "keepdim@1.2: True -> False": "z = y.mean(dim=-1, keepdim=False).detach()",
    "detach@1.2: y.mean(dim=-1, keepdim=True).detach() -> .detach() removed": "z = y.mean(dim=-1, keepdim=True)",
    "training@1.3: self.training -> True": "if True and scale > 0:",
    "training@1.3: self.training -> False": "if False and scale > 0:",
    "boolop@1.3: and -> or": "if self.training or scale > 0:",
    "compare@1.3: > -> >=": "if self.training and scale >= 0:",
    "not@1.3: self.training and scale > 0 -> not (...)": "if not (self.training and scale > 0):",
    "unary@1.4: - removed": "z = z",
    "loop@1.5: for ... in range(3) -> in []": "for i in []:",
    "break@1.7: break -> continue": "continue",
    "slice@1.8: 1:n -> :n": "w = torch.cat([y[:, :n], y.T], 0)",
    "slice@1.8: n -> n + 1": "w = torch.cat([y[:, 1:n + 1], y.T], 0)",
    "transpose@1.8: .T removed": "w = torch.cat([y[:, 1:n], y], 0)",
    "default@1.3: scale ignored (= 2.0)":
        "if self.training and 2.0 > 0: / return F.dropout(z * 2.0, 0.1, training=training) @ w",
    "training@1.9: training=training -> training=True": "return F.dropout(z * scale, 0.1, training=True) @ w",
    "detach@1.9: F.dropout(z * scale, 0.1, training=tr... -> .detach() added":
        "return (F.dropout(z * scale, 0.1, training=training) @ w).detach()",
    "arith@1.9: @ -> *": "return F.dropout(z * scale, 0.1, training=training) * w",
}


def _reference():
    return mt.reference_of("99.f", ["import torch", CELL], [{}, {"grade_id": "ex99_f_answer"}])


def _mutants():
    return mt.mutants_of(_reference())


def test_each_operator_makes_the_expected_mutant():
    by_id = {m.id: m for m in _mutants()}
    missing = [i for i in EXPECTED if i not in by_id]
    assert not missing, f"not generated: {missing}\ngenerated:\n" + "\n".join(by_id)
    wrong = {mid: by_id[mid].after for mid, line in EXPECTED.items() if by_id[mid].after != line}
    assert not wrong, wrong
    assert not any(i.startswith("swap@1.1") for i in by_id), "transpose(a, b) swapped is the same transpose"
    assert {m.operator for m in by_id.values()} == set(mt.OPERATORS)


@pytest.mark.parametrize("expr, fresh", [("torch.arange(3).unsqueeze(1)", True), ("torch.zeros(2, 3) * 2.0", True),
                                         ("x.unsqueeze(1)", False), ("torch.zeros(2) + w", False),
                                         ("torch.sin(torch.arange(3))", False)])
def test_detach_is_not_added_to_fresh_factory_tensors(expr, fresh):
    assert mt._without_grad(ast.parse(expr).body[0].value) is fresh


def test_mutants_stay_inside_the_block_compile_and_are_distinct():
    ms = _mutants()
    ref_lines = CELL.splitlines()
    dumps = set()
    for m in ms:
        new = m.source.splitlines()
        assert new[:3] == ref_lines[:3], m.id  # the def line and docstring untouched
        assert new[-5:] == ref_lines[-5:], m.id  # code after the block untouched
        dumps.add(ast.dump(ast.parse(m.source)))
    assert len(dumps) == len(ms)
    assert ast.dump(ast.parse(CELL)) not in dumps
    assert len({m.id for m in ms}) == len(ms), "ids must be unique"


def test_ids_are_stable_when_code_outside_the_block_changes():
    first = [m.id for m in _mutants()]
    moved = "import math\n\n\n" + CELL.replace('"""A docstring outside the block."""', '"""Longer\n    docstring."""')
    ref = mt.reference_of("99.f", ["import torch", moved], [{}, {"grade_id": "ex99_f_answer"}])
    assert [m.id for m in mt.mutants_of(ref)] == first


def test_sampling_is_deterministic():
    ms = _mutants()
    a = [m.id for m in mt.select(ms, 5, 3, None)]
    assert a == [m.id for m in mt.select(ms, 5, 3, None)] and len(a) == 5
    assert a != [m.id for m in mt.select(ms, 5, 4, None)]


def test_equivalent_file_counts_listed_survivors_and_finds_stale_entries(tmp_path, monkeypatch):
    ms = _mutants()
    (tmp_path / "u99.toml").write_text(
        '[[equivalent]]\nexercise = "99.f"\nmutant = "const@1.9: 0.1 -> 1.1"\nreason = "a test entry"\n\n'
        '[[equivalent]]\nexercise = "99.f"\nmutant = "arith@1.1: + -> - #7"\nreason = "no such mutant"\n',
        encoding="utf-8")
    monkeypatch.setattr(mt, "EQUIVALENT_DIR", tmp_path)
    listed = mt.equivalents("99")
    assert [e["mutant"] for e in mt.stale(listed, ms)] == ["arith@1.1: + -> - #7"]
    chosen = [m for m in ms if m.id in ("const@1.9: 0.1 -> 1.1", "arith@1.1: + -> -", "unary@1.4: - removed")]
    full = {"status": "passed", "points": 2, "max_points": 2, "bug": None, "message": "", "seconds": 0.0}
    zero = dict(full, status="failed", points=0)
    outcomes = mt.classify(chosen, [full if m.id != "arith@1.1: + -> -" else zero for m in chosen], listed)
    assert {o.id: o.outcome for o in outcomes} == {"const@1.9: 0.1 -> 1.1": "equivalent", "arith@1.1: + -> -": "killed",
                                                 "unary@1.4: - removed": "survived"}
    (tmp_path / "u98.toml").write_text('[[equivalent]]\nexercise = "98.f"\nmutant = "x"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="reason"):
        mt.equivalents("98")


def test_summary_line_format():
    o = [mt.Outcome("05.x", "a", "arith", "", "", k, "failed", 0, 1, None, "", 0.0)
         for k in ("killed", "killed", "equivalent", "survived")]
    assert mt.summary_line("05", o) == "unit 05: 4 mutants, 2 killed, 1 equivalent, 1 survivors"


# -- a seeded sample of real mutants reproduces the stored full run ----------------------------------------------

def _available_units() -> list[str]:
    from llmcourse.manifest import load_course

    return [u.id for u in load_course().available_units]


SAMPLED_UNITS = _available_units()  # every unit: two seeded mutants per exercise
PER_EXERCISE = 2


@pytest.mark.parametrize("unit_id", SAMPLED_UNITS)
def test_a_seeded_sample_has_its_stored_outcome(unit_id):
    record = mt.stored(unit_id)
    if record is None:
        pytest.fail(f"no stored run for unit {unit_id}: python -m coursetools.dev.mutation {unit_id} --store")
    stored = {(m["exercise"], m["id"]): m for m in record["mutants"]}
    sources, mutants = mt.unit_mutants(unit_id)
    chosen = mt.select(mutants, PER_EXERCISE, 0, None)
    stale = [m.id for m in chosen if (m.exercise, m.id) not in stored]
    assert not stale, (f"unit {unit_id}: mutants not in the stored run {stale}; the solution changed since: rerun "
                       f"python -m coursetools.dev.mutation {unit_id} --store")
    outcomes = mt.classify(chosen, mt.run_mutants(chosen, sources), mt.equivalents(unit_id))
    differ = [f"{o.exercise} {o.id}: now {o.outcome} ({o.status}: {o.message}), stored "
              f"{stored[(o.exercise, o.id)]['outcome']}" for o in outcomes
              if o.outcome != stored[(o.exercise, o.id)]["outcome"]]
    assert not differ, ("outcomes differ from the stored run (rerun python -m coursetools.dev.mutation "
                        f"{unit_id} --store if the check changed on purpose):\n" + "\n".join(differ))


def test_two_jobs_give_the_verdicts_of_one():
    """``--jobs 2``: each mutant is graded in one of two checker processes, which start grading's workers of their
    own (the daemonic processes of a multiprocessing.Pool could not: every mutant failed with "its forkserver did
    not answer"). A small seeded sample of one cheap exercise gets the same verdicts as with one job."""
    sources, mutants = mt.unit_mutants("00", ["00.causal_mask"])
    chosen = mt.select(mutants, 4, 0, None)
    assert len(chosen) == 4
    keys = ("status", "points", "max_points", "bug", "message")
    one = [{k: v[k] for k in keys} for v in mt.run_mutants(chosen, sources, jobs=1)]
    two = [{k: v[k] for k in keys} for v in mt.run_mutants(chosen, sources, jobs=2)]
    assert not any("did not answer" in v["message"] for v in one + two), two
    assert two == one
