"""Lesson rules that hold for every unit.

(a) A lesson never contains a graded answer of its unit, verbatim or renamed: the code of each
    unit's lesson source (notebooks/lessons/NN_*.py, code cells) is compared with the
    BEGIN/END SOLUTION blocks of the unit's exercise source (notebooks/solutions/NN_*.py) after
    normalising both with `tokenize` (names -> placeholder, literals -> placeholder, comments
    dropped; attribute names and library names kept). Any window of WINDOW consecutive normalised
    logical lines of a solution block that also occurs, consecutively, in the lesson is a copy.
(a') A folded reference fix (a `source_hidden` code cell of a lesson) is held to a stricter form of (a):
    it shows the learner a complete fix, so even one substantial normalised line of a graded answer
    (FOLDED_MIN_TOKENS tokens or more, once an assignment target or a `return` is dropped: `best = f(x)`
    and `return f(x)` are the same answer) may not appear in it. A reference fix whose fix *is* a graded
    answer says what to change in words and runs its self-check on the library's version instead.
(b) Nothing a student reads (lessons/*.ipynb, exercises/*/*.ipynb, which hold the visible test
    cells) contains an internal id (fixture/widget/bug ids such as F03.3, W02.4, B05.x) or the
    word "syllabus".

Both tests run for every unit whose sources exist.
"""

from __future__ import annotations

import builtins
import io
import json
import keyword
import re
import textwrap
import tokenize
from pathlib import Path

import pytest

from coursetools.dev.studytime import percent_cells

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks"

# "rule:unit" pairs that still fail while issue 15 (revision of units 00-07) is in progress
# ("answers": a graded answer in the lesson; "ids": internal ids in student notebooks).
# This set MUST be empty when the revision is finished; remove an entry as soon as it passes.
KNOWN_FAILING: set[str] = set()

WINDOW = 3  # consecutive normalised logical lines that count as a copy
FOLDED_MIN_TOKENS = 8  # in a folded reference fix, one shared line this long is a copy
MIN_TOKENS = 12  # a window this short (e.g. three `return x` lines) is too generic to mean a copy

# Names a renamed copy keeps: library modules and their usual aliases, builtins.
KEPT_NAMES = {
    "torch",
    "nn",
    "F",
    "math",
    "np",
    "numpy",
    "tiktoken",
    "llmcourse",
    "re",
    "collections",
    "itertools",
    "functools",
    "self",
    "cls",
    "super",
} | set(dir(builtins))
ID_PATTERN = re.compile(r"\b[FWB]\d\d\.\w+|\bsyllabus\b", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# jupytext percent sources


cells = percent_cells  # (header, source) of each `# %%` cell of a jupytext percent script


def code_cells(path: Path) -> list[str]:
    return [src for head, src in cells(path) if "[markdown]" not in head and "[raw]" not in head]


def solution_blocks(path: Path) -> list[tuple[str, str]]:
    """(exercise id, code) of every BEGIN/END SOLUTION block of an exercise source."""
    blocks = []
    for head, src in cells(path):
        m = re.search(r'"solution:([^"]+)"', head)
        name = m.group(1) if m else head
        body: list[str] | None = None
        for line in src.splitlines():
            if "BEGIN SOLUTION" in line:
                body = []
            elif "END SOLUTION" in line and body is not None:
                blocks.append((name, textwrap.dedent("\n".join(body))))
                body = None
            elif body is not None:
                body.append(line)
    return blocks


# ---------------------------------------------------------------------------------------------
# normalisation


def _normalise_line(toks: list[tokenize.TokenInfo]) -> str:
    out = []
    depth = 0
    for i, tok in enumerate(toks):
        kind, text = tok.type, tok.string
        prev = toks[i - 1].string if i else None
        prev2 = toks[i - 2].string if i > 1 else None
        nxt = toks[i + 1].string if i + 1 < len(toks) else None
        if kind == tokenize.OP and text in "([{":
            depth += 1
        elif kind == tokenize.OP and text in ")]}":
            depth -= 1
        if kind == tokenize.NAME and not keyword.iskeyword(text):
            attribute = prev == "." and prev2 not in ("self", "_")
            keyword_argument = depth > 0 and nxt == "=" and prev in ("(", ",")
            norm = text if (attribute or keyword_argument or text in KEPT_NAMES) else "_"
        elif kind == tokenize.NUMBER:
            norm = "0"
        elif kind == tokenize.STRING or kind == getattr(tokenize, "FSTRING_START", -1):
            norm = "''"
        elif kind in (getattr(tokenize, "FSTRING_MIDDLE", -1), getattr(tokenize, "FSTRING_END", -1)):
            continue
        else:
            norm = text
        out.append(norm)
    return " ".join(out)


def _normalise_tokens(source: str) -> list[str]:
    """Normalised logical lines of `source` (raises tokenize.TokenError / SyntaxError)."""
    lines: list[str] = []
    current: list[tokenize.TokenInfo] = []
    skip = (
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    )
    for tok in tokenize.generate_tokens(io.StringIO(source + "\n").readline):
        if tok.type in skip:
            continue
        if tok.type == tokenize.NEWLINE:
            if current:
                lines.append(_normalise_line(current))
            current = []
            continue
        current.append(tok)
    if current:
        lines.append(_normalise_line(current))
    return lines


def normalise(source: str) -> list[str]:
    """Normalised logical lines: names -> `_` (except attributes, builtins and library modules),
    numbers -> `0`, strings -> `''`, comments and indentation dropped. Lines that do not tokenize
    as a whole (IPython magics, a fragment) are normalised one by one."""
    source = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!", "# %")))
    try:
        return _normalise_tokens(source)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        out: list[str] = []
        for line in source.splitlines():
            try:
                out += _normalise_tokens(line.strip())
            except (tokenize.TokenError, SyntaxError, IndentationError):
                continue
        return out


def _windows(lines: list[str]) -> list[tuple[str, ...]]:
    return [tuple(lines[i : i + WINDOW]) for i in range(len(lines) - WINDOW + 1)]


def copied_answers(lesson_code: list[str], blocks: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Exercise id -> the normalised windows of its solution found in the lesson code."""
    lesson_windows: set[tuple[str, ...]] = set()
    for src in lesson_code:
        lesson_windows.update(_windows(normalise(src)))
    hits: dict[str, list[str]] = {}
    for name, code in blocks:
        for w in _windows(normalise(code)):
            if sum(len(line.split()) for line in w) < MIN_TOKENS:
                continue
            if w in lesson_windows:
                hits.setdefault(name, []).append(" | ".join(w))
    return hits


def folded_cells(path: Path) -> list[str]:
    """The folded (`source_hidden`) code cells of a lesson source: its reference fixes."""
    return [src for head, src in cells(path) if "source_hidden" in head and "[markdown]" not in head]


def _core(line: str) -> str:
    """A normalised line without its assignment target or `return`: the expression it computes."""
    line = re.sub(r"^(return|yield) ", "", line)
    return re.sub(r"^_( , _)* (=|\+=|-=|\*=|/=) ", "", line)


def answers_in_folded_cells(folded: list[str], blocks: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Exercise id -> the lines of its solution (as expressions) found in the folded reference fixes."""
    shown = {_core(line) for src in folded for line in normalise(src)}
    hits: dict[str, list[str]] = {}
    for name, code in blocks:
        for line in normalise(code):
            core = _core(line)
            if len(core.split()) >= FOLDED_MIN_TOKENS and core in shown:
                hits.setdefault(name, []).append(core)
    return hits


# ---------------------------------------------------------------------------------------------
# units


def _units() -> list[str]:
    lessons = {p.name[:2] for p in (SOURCES / "lessons").glob("[0-9][0-9]_*.py")}
    solutions = {p.name[:2] for p in (SOURCES / "solutions").glob("[0-9][0-9]_*.py")}
    return sorted(lessons & solutions)


UNITS = _units()


def _mark(rule: str, unit: str):
    if f"{rule}:{unit}" in KNOWN_FAILING:
        return pytest.param(unit, marks=pytest.mark.xfail(reason="issue 15 in progress", strict=False))
    return unit


@pytest.mark.parametrize("unit_id", [_mark("answers", u) for u in UNITS])
def test_no_graded_answer_in_lesson(unit_id):
    unit = unit_id
    lesson_code = []
    for p in sorted((SOURCES / "lessons").glob(f"{unit}_*.py")):
        lesson_code += code_cells(p)
    blocks = []
    for p in sorted((SOURCES / "solutions").glob(f"{unit}_*.py")):
        blocks += solution_blocks(p)
    assert blocks, f"unit {unit}: no BEGIN/END SOLUTION block found"
    hits = copied_answers(lesson_code, blocks)
    assert not hits, f"unit {unit}: graded answers in the lesson: " + "; ".join(
        f"{name}: {places[0]!r}" + (f" (+{len(places) - 1})" if len(places) > 1 else "")
        for name, places in sorted(hits.items())
    )


# units whose lessons belong to another helper's branch at the time of writing and still show a graded
# line in a folded reference fix: {unit: exercise ids}. Empty it as those branches land.
FOLDED_ELSEWHERE: dict[str, set[str]] = {}


@pytest.mark.parametrize("unit_id", UNITS)
def test_no_graded_answer_in_folded_reference_fixes(unit_id, request):
    known = FOLDED_ELSEWHERE.get(unit_id)
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"another branch's lesson: {sorted(known)}"))
    folded = []
    for p in sorted((SOURCES / "lessons").glob(f"{unit_id}_*.py")):
        folded += folded_cells(p)
    blocks = []
    for p in sorted((SOURCES / "solutions").glob(f"{unit_id}_*.py")):
        blocks += solution_blocks(p)
    hits = answers_in_folded_cells(folded, blocks)
    assert not hits, f"unit {unit_id}: graded answers in folded reference fixes: " + "; ".join(
        f"{name}: {lines[0]!r}" + (f" (+{len(lines) - 1})" if len(lines) > 1 else "") for name, lines in sorted(hits.items()))


def _student_notebooks(unit: str) -> list[Path]:
    return sorted(ROOT.glob(f"lessons/{unit}_*.ipynb")) + sorted(ROOT.glob(f"exercises/{unit}_*/*.ipynb"))


@pytest.mark.parametrize("unit_id", [_mark("ids", u) for u in UNITS])
def test_no_internal_ids_in_student_notebooks(unit_id):
    unit = unit_id
    found = []
    for p in _student_notebooks(unit):
        for i, cell in enumerate(json.loads(p.read_text())["cells"]):
            for m in ID_PATTERN.finditer("".join(cell["source"])):
                found.append(f"{p.relative_to(ROOT)} cell {i}: {m.group(0)}")
    assert not found, f"unit {unit}: {len(found)} internal ids: " + "; ".join(found[:12])


# ---------------------------------------------------------------------------------------------
# the detectors can fail


SOLUTION = """
# %% tags=["solution:99.merge"]
def merge(word, pair, new):
    ### BEGIN SOLUTION
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out
    ### END SOLUTION
"""

RENAMED_COPY = """
# %% [markdown]
# A lesson that shows the answer with other names and other literals.

# %%
def apply_pair(symbols, target, joined):
    result, k = [], 0  # same shape
    while k < len(symbols):
        if k + 1 < len(symbols) and (symbols[k], symbols[k + 1]) == target:
            result.append(joined)
            k += 2
        else:
            result.append(symbols[k])
            k += 1
    return result
"""

INNOCENT = """
# %%
from collections import Counter
counts = Counter(zip("hello", "hello"[1:]))
print(counts.most_common(3))
"""


def test_a_renamed_copy_is_flagged(tmp_path):
    sol = tmp_path / "99_x_solution.py"
    sol.write_text(SOLUTION)
    les = tmp_path / "99_x_lesson.py"
    les.write_text(RENAMED_COPY)
    hits = copied_answers(code_cells(les), solution_blocks(sol))
    assert set(hits) == {"99.merge"}
    les.write_text(INNOCENT)
    assert copied_answers(code_cells(les), solution_blocks(sol)) == {}


FOLDED_LESSON = """
# %% [markdown]
# A reference fix that returns the answer's key line, with other names.

# %% jupyter={"source_hidden": true}
def pick(counts):
    top = max(counts.values())
    return min(p for p, c in counts.items() if c == top)
"""

SOLUTION_TIE = """
# %% tags=["solution:99.train"]
def train(words):
    ### BEGIN SOLUTION
    counts = count(words)
    best = min(pair for pair, n in counts.items() if n == max(counts.values()))
    chosen = min(q for q, k in counts.items() if k == limit)
    return chosen
    ### END SOLUTION
"""


def test_a_folded_fix_with_one_answer_line_is_flagged(tmp_path):
    sol = tmp_path / "99_x_solution.py"
    sol.write_text(SOLUTION_TIE)
    les = tmp_path / "99_x_lesson.py"
    les.write_text(FOLDED_LESSON)
    assert set(answers_in_folded_cells(folded_cells(les), solution_blocks(sol))) == {"99.train"}
    les.write_text(FOLDED_LESSON.replace("source_hidden", "tags"))  # not folded: the 3-line rule applies
    assert answers_in_folded_cells(folded_cells(les), solution_blocks(sol)) == {}
    assert copied_answers(code_cells(les), solution_blocks(sol)) == {}


def test_the_id_pattern_catches_ids_and_the_word():
    text = "fixture F03.3, widget W02.4, bug B05.no_scale; see the Syllabus"
    assert [m.group(0) for m in ID_PATTERN.finditer(text)] == ["F03.3", "W02.4", "B05.no_scale", "Syllabus"]
    assert not ID_PATTERN.search("float16 and GPT-2 at 1.5B, F.softmax, W_q, exercise 02.PositionalEncoding")
