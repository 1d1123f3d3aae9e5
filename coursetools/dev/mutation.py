"""Mutation testing of the hidden checks: how many small wrong versions of each reference answer does grading catch?

Usage::

    python -m coursetools.dev.mutation NN [NN ...] [--exercise NN.name] [--sample N --seed S] [--jobs J]
                                               [--json OUT] [--store] [--list]
    python -m coursetools.dev.mutation --report        # regenerate docs/grading-strength.md from the stored runs
    make mutation [UNITS="05 18"]                      # the full run: every (or the given) unit stored, then --report

* ``NN``: a unit (``05``); ``--exercise 05.LayerNorm`` restricts the run to one exercise (repeatable).
* ``--list``: print the mutants (id, the line before and after) without running them.
* ``--sample N --seed S``: run N mutants per exercise, drawn deterministically (seeded by S and the exercise id);
  ``--limit N`` runs the first N per exercise (id order). Either is said in the output.
* ``--jobs J``: J checker processes (default 1; 2 on an idle two-core machine).
* ``--time-limit S``: lower grading's per-check time limit (``grader.core.CHECK_TIME_LIMIT_S``) for the mutants: a
  mutant stuck in a loop (``i += 1`` deleted) otherwise costs the full limit; said in the output. Faster while
  iterating on one unit; a stored run should keep grading's own limit.
* ``--toml``: also print each survivor as an ``[[equivalent]]`` stanza (``reason = "TODO"``) to paste into the
  equivalent file once you have shown that no correct check can tell it from the reference.
* ``-v``: print each mutant's verdict as it comes.
* ``--json OUT``: write every mutant's outcome as JSON; ``--store`` writes the full run of a unit to
  ``docs/grading-strength/uNN.json`` (refused with --exercise/--sample/--limit), which ``--report`` reads.

The last line per unit is exactly ``unit NN: M mutants, K killed, E equivalent, S survivors``; the exit status is 1
when S > 0 (a survivor not listed as equivalent) or when an exercise's unmutated reference does not get full points
(run first; that exercise's mutants are then not run: ``REFERENCE FAILS``), 2 on bad arguments. Each survivor is
printed before it: its id and the changed line(s); so are the mutants that made the grader itself fail
(``GRADER ERROR``: killed, since they score 0, but worth a look).

**What is mutated.** The reference answer of exercise ``NN.name`` is the code between ``### BEGIN SOLUTION`` and
``### END SOLUTION`` in the answer cell(s) of that exercise in the unit's built solution notebook
(``solutions/NN_slug/NN_slug.ipynb``, built from ``notebooks/solutions/NN_slug.py``; the cells tagged
``solution:NN.name`` there, nbgrader id ``exNN_name_answer[_k]``). Every operator below rewrites one site (or, for
"argument ignored", every use of one parameter) whose source lies entirely inside a solution block; the mutated text
replaces the original in that cell only, everything else (other cells, the stub's ``def`` line, the docstring)
untouched. A mutant that does not compile is skipped; mutants whose cells parse to the same AST are deduplicated
(as are those identical to the reference: formatting-only changes).

**How a mutant is run.** Exactly as grading runs a submission: ``grader.runner.run_check(exercise_id, sources)``
with ``sources`` the solution notebook's code cells, the answer cell replaced by the mutant's, so the learner side
is an isolated worker forked from the warm forkserver (torch preloaded once per checker process, never per mutant);
the check itself runs in the checker process, as in ``course check``. **Killed**: points < max (the verdict's status,
the bug id it named and the first line of its message are recorded); **survived** otherwise. A survivor listed in
``grader/equivalent/uNN.toml`` counts as **equivalent**; a listed mutant that is killed counts as killed and the
entry is reported as wrong, and a listed id that the tool no longer generates is reported as stale (a warning).

**The equivalent file** ``grader/equivalent/uNN.toml``::

    [[equivalent]]
    exercise = "05.gelu"
    mutant = "const@1.4: 0.044715 -> 1.044715"     # the id exactly as --list prints it
    reason = "one line: why no correct check can tell this mutant from the reference"

The ids are TOML basic strings (``json.dumps`` of the id is one; ``--toml`` prints them so). The file is read with
``tomllib``; an entry without ``exercise``, ``mutant`` or ``reason`` is an error.

**Mutant ids** read ``<operator>@<block>.<line>: <change>``: ``block`` counts the exercise's solution blocks from 1
(in cell order), ``line`` the lines inside that block from 1, ``change`` is ``old -> new`` (double quotes shown as
single quotes, so an id fits a TOML string); ``#k`` is appended when the same change occurs k times on one line.
Ids depend only on the block's own text, so they stay valid while code outside the blocks changes.

**Operators** (``OPERATORS``): ``arith`` (binary and augmented operators, one replacement per site as mutmut does:
``+``/``-``, ``*``/``/``, ``//``->``/``, ``%``->``/``, ``**``->``*``, ``@``->``*``, shifts and bit operators;
``x += y`` -> ``x = y``), ``unary`` (``-x``, ``not x``, ``~x`` -> ``x``), ``compare`` (``<``/``<=``, ``>``/``>=``,
``==``/``!=``, ``is``/``is not``, ``in``/``not in``), ``boolop`` (``and``/``or``), ``not`` (an ``if``/``while``/
conditional-expression test negated), ``const`` (integer literals +-1, so 0 -> 1 and 1 -> 0; float literals +1,
0.0 -> 1.0 and 1.0 -> 0.0; ``True``/``False``), ``slice`` (a slice bound +-1, or dropped; ``0:`` is never
dropped, being ``:``), ``dim`` (a ``dim=``
argument's value +-1, or the argument dropped), ``keepdim`` (flipped), ``delete`` (a statement replaced by ``pass``;
``return``, docstrings and definitions are kept), ``swap`` (two adjacent positional arguments of a call swapped;
not the two dims of a transpose, nor ``maximum``/``minimum``'s operands: the same call),
``default`` (a parameter of the enclosing function replaced by its default value at every use inside the block:
the argument ignored), ``training`` (``self.training`` or a ``training=`` argument forced to True and to False),
``detach`` (``.detach()`` removed; added to a returned or assigned value outside ``__init__``, unless that value is
a size or a fresh tensor from a torch factory, which carries no autograd history), ``transpose``
(``.transpose(...)``, ``.t()``, ``.permute(...)``, ``.swapaxes(...)``, ``.T``, ``.mT`` removed), ``loop`` (a
``for`` loop over an empty list), ``break`` (``break``/``continue`` swapped).

**Before the mutants**, each exercise's unmutated reference is run the same way; an interrupted run (Ctrl-C, or
SIGTERM from ``timeout``) keeps, prints and stores the outcomes so far and says so. ``tests/test_mutation.py`` checks
the operators on a synthetic cell and reruns a seeded sample (2 mutants per exercise, seed 0) of units 02 and 03,
whose outcomes must equal their stored runs: after changing those checks on purpose, store the unit again.

**Why our own operators, on the standard library's ``ast``.** Both libraries were read with a view to calling their
operators on one code block. cosmic-ray 8.7.0's operators (``cosmic_ray.operators``, on parso trees) can be applied
to a code string (``cosmic_ray.mutating.mutate_code(code, operator, occurrence)``), but its
binary/comparison-operator replacement emits *every* other operator at each site (12 mutants per ``+``: several
times this field's 10-minute budget per unit), an occurrence is numbered across the whole module (ids would shift
whenever code above changes, so an equivalent list could not name them), and installing it pulls an execution
framework this use never touches (aiohttp, SQLAlchemy, GitPython, stevedore, rich, ...). mutmut 3.8.1's mutators
(``mutmut/mutation/mutators.py``, on libcst) are internal functions of its trampoline design (all mutants of a
function compiled into one ``mutants/`` copy of the project, selected by an environment variable under its own
pytest runner), and the package pulls libcst, textual, coverage and setproctitle. Neither has the operators this
field needs (``dim=``, ``keepdim``, ``self.training``, ``.detach()``, transposes, an argument ignored), which are
rewrites of specific call and attribute nodes. So the operators are written here, on ``ast`` positions (no package
added): the generic ones follow those libraries' choices (mutmut's single replacement per arithmetic/comparison
site, cosmic-ray's NumberReplacer +-1, AddNot, ReplaceTrueWithFalse, ReplaceAndWithOr, ZeroIterationForLoop,
ReplaceBreakWithContinue), and the text of each rewritten node is spliced into the cell, so the rest of the cell
keeps its formatting and comments.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import json
import random
import re
import sys
import time
import tomllib
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENT_DIR = ROOT / "grader" / "equivalent"
STORE_DIR = ROOT / "docs" / "grading-strength"
REPORT = ROOT / "docs" / "grading-strength.md"

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"

OPERATORS = ("arith", "unary", "compare", "boolop", "not", "const", "slice", "dim", "keepdim", "delete", "swap",
             "default", "training", "detach", "transpose", "loop", "break")

_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
          ast.Mod: ast.Div, ast.Pow: ast.Mult, ast.MatMult: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
          ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitAnd}
_BINSYM = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
           ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^"}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
        ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_CMPSYM = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
           ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
_TRANSPOSE_CALLS = {"transpose", "t", "permute", "swapaxes", "swapdims"}
_TRANSPOSE_ATTRS = {"T", "mT"}
_SYMMETRIC = {"transpose", "swapaxes", "swapdims", "maximum", "minimum"}  # swapping these two arguments is a no-op
_ATOMIC = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript, ast.List, ast.Tuple, ast.Dict, ast.Set,
           ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.JoinedStr)


# -- where the reference answer is -----------------------------------------------------------------------------

@dataclass
class Block:
    cell: int  # index into the notebook's code cells
    first: int  # first line of the block's content in the cell (1-based, after the BEGIN line)
    last: int  # last line of the content (before the END line)


@dataclass
class Reference:
    exercise: str
    sources: list[str]  # the solution notebook's code cells
    blocks: list[Block]


def solution_sources(unit) -> tuple[list[str], list[dict]]:
    """The built solution notebook's code cells and their nbgrader metadata."""
    import nbformat

    from llmcourse.manifest import load_course

    nb = nbformat.read(load_course().root / unit.solution, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    return [c.source for c in cells], [c.get("metadata", {}).get("nbgrader", {}) for c in cells]


def reference_of(exercise_id: str, sources: list[str], metas: list[dict]) -> Reference:
    """The solution blocks of ``exercise_id``'s answer cells (``exNN_name_answer``, ``..._answer_2``, ...)."""
    from llmcourse.manifest import grade_id

    gid = grade_id(exercise_id)
    pattern = re.compile(rf"^{re.escape(gid)}_answer(_\d+)?$")
    blocks = []
    for index, (src, meta) in enumerate(zip(sources, metas)):
        if not pattern.match(meta.get("grade_id", "")):
            continue
        start = None
        for n, line in enumerate(src.splitlines(), start=1):
            s = line.strip()
            if s.startswith(BEGIN):
                start = n + 1
            elif s.startswith(END) and start is not None:
                blocks.append(Block(index, start, n - 1))
                start = None
    if not blocks:
        raise ValueError(f"{exercise_id}: no '{BEGIN}' block in its answer cells ({gid}_answer)")
    return Reference(exercise_id, list(sources), blocks)


# -- mutants ----------------------------------------------------------------------------------------------------

@dataclass
class Mutant:
    exercise: str
    id: str
    operator: str
    block: int  # 1-based
    line: int  # 1-based, within the block
    before: str  # the original line (stripped)
    after: str  # the mutated line(s) (stripped, joined)
    cell: int = 0  # the code cell replaced
    source: str = field(default="", repr=False)  # the mutated cell


@dataclass
class _Edit:
    operator: str
    node: ast.AST  # the site (its first line names the mutant)
    change: str  # "old -> new"
    splices: list  # [(lineno, col, end_lineno, end_col, text)], byte columns as ast gives them


def _segment(lines: list[bytes], node) -> str:
    a, b = node.lineno - 1, node.end_lineno - 1
    if a == b:
        return lines[a][node.col_offset:node.end_col_offset].decode()
    parts = [lines[a][node.col_offset:]] + lines[a + 1:b] + [lines[b][:node.end_col_offset]]
    return b"".join(parts).decode()


def _apply(source: str, splices) -> str:
    lines = source.encode().splitlines(keepends=True)
    # last first, so earlier positions stay valid
    for lineno, col, end_lineno, end_col, text in sorted(splices, key=lambda s: (s[0], s[1]), reverse=True):
        a, b = lineno - 1, end_lineno - 1
        head, tail = lines[a][:col], lines[b][end_col:]
        lines[a:b + 1] = [head + text.encode() + tail]
    return b"".join(lines).decode()


def _wrap(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if isinstance(node, _ATOMIC) or (isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)) \
        else f"({text})"


def _short(text: str, n: int = 48) -> str:
    text = re.sub(r"\s+", " ", text).strip().replace('"', "'")
    return text if len(text) <= n else text[: n - 3] + "..."


def _number(node) -> int | float | None:
    """The value of a numeric literal (``3``, ``-1``, ``1e-5``), else None (bools are not numbers here)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) in (int, float):
        return -node.operand.value
    return None


def _fmt(v) -> str:
    return repr(v) if not isinstance(v, float) else repr(float(f"{v:.12g}"))


def _number_changes(value) -> list[str]:
    if isinstance(value, int):
        return [_fmt(value + 1), _fmt(value - 1)]
    if value == 0.0:
        return ["1.0"]
    if value == 1.0:
        return ["0.0", "2.0"]
    return [_fmt(value + 1)]


_FACTORIES = {"arange", "zeros", "ones", "empty", "full", "tensor", "eye", "linspace", "logspace", "randn", "rand",
              "randint", "randperm", "zeros_like", "ones_like", "empty_like", "full_like", "as_tensor", "tril_indices",
              "triu_indices", "from_numpy"}
_SHAPE_METHODS = {"unsqueeze", "squeeze", "view", "reshape", "to", "float", "long", "int", "bool", "double", "half",
                  "expand", "repeat", "flip", "t", "transpose", "permute", "contiguous", "clone", "type", "tril", "triu"}


def _without_grad(node) -> bool:
    """Whether ``node`` is certainly a tensor that carries no autograd history: a torch factory call (``zeros_like``
    and friends included, which copy no history), a literal, or shape/dtype methods and arithmetic on those."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _without_grad(node.operand)
    if isinstance(node, ast.BinOp):
        return _without_grad(node.left) and _without_grad(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "torch":
            return node.func.attr in _FACTORIES
        return node.func.attr in _SHAPE_METHODS and _without_grad(owner)
    return False


def _sub(node, text: str) -> tuple:
    return (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, text)


class _Finder:
    """Collects the edits of every operator for the nodes inside the solution blocks of one cell."""

    def __init__(self, source: str, ranges: list[tuple[int, int]]):
        self.source = source
        self.lines = source.encode().splitlines(keepends=True)
        self.tree = ast.parse(source)
        self.ranges = ranges
        self.edits: list[_Edit] = []
        self.parents: dict[ast.AST, ast.AST] = {}
        for parent in ast.walk(self.tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent

    def inside(self, node) -> bool:
        if not hasattr(node, "lineno") or getattr(node, "end_lineno", None) is None:
            return False
        return any(a <= node.lineno and node.end_lineno <= b for a, b in self.ranges)

    def seg(self, node) -> str:
        return _segment(self.lines, node)

    def token_splice(self, left, right, pattern: str, new: str):
        """A splice replacing the operator token between two operands (keeping parentheses and layout), or None."""
        gap = self.lines[left.end_lineno - 1][left.end_col_offset:] if left.end_lineno != right.lineno else \
            self.lines[left.end_lineno - 1][left.end_col_offset:right.col_offset]
        if left.end_lineno != right.lineno:
            return None  # an operator across lines: rebuild the node instead
        m = re.fullmatch(rb"([\s()]*)(" + pattern.encode() + rb")([\s()]*)", gap)
        if not m:
            return None
        a = left.end_col_offset + m.start(2)
        return (left.end_lineno, a, left.end_lineno, a + len(m.group(2)), new)

    def wrap(self, node, new) -> str:
        """``new``'s text for ``node``'s place: parenthesised when the place is an operand."""
        parent = self.parents.get(node)
        text = ast.unparse(new)
        if isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Attribute, ast.Subscript,
                               ast.Await)) or (isinstance(parent, ast.Call) and parent.func is node):
            return f"({text})"
        return text

    def add(self, operator, node, change, splices):
        self.edits.append(_Edit(operator, node, change, splices))

    def replace(self, operator, node, new_text, change=None):
        self.add(operator, node, change or f"{_short(self.seg(node))} -> {_short(new_text)}", [_sub(node, new_text)])

    def run(self) -> list[_Edit]:
        for node in ast.walk(self.tree):
            if not self.inside(node):
                continue
            for method in (self.arith, self.unary, self.compare, self.boolop, self.add_not, self.constant,
                           self.slice_bounds, self.keywords, self.delete, self.swap, self.training, self.detach,
                           self.transpose, self.loop, self.break_continue):
                method(node)
        self.defaults()
        return self.edits

    # each operator -------------------------------------------------------------------------------------------
    def arith(self, node):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
            new = ast.BinOp(node.left, _BINOP[type(node.op)](), node.right)
            sym, new_sym = _BINSYM[type(node.op)], _BINSYM[type(new.op)]
            splice = None
            if sym not in ("**", "&", "|", "^"):  # same precedence: only the operator token changes
                splice = self.token_splice(node.left, node.right, re.escape(sym), new_sym)
            self.add("arith", node, f"{sym} -> {new_sym}", [splice or _sub(node, self.wrap(node, new))])
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP:
            sym, new_sym = _BINSYM[type(node.op)], _BINSYM[_BINOP[type(node.op)]]
            target, value = self.seg(node.target), self.seg(node.value)
            self.add("arith", node, f"{sym}= -> {new_sym}=", [_sub(node, f"{target} {new_sym}= {value}")])
            self.add("arith", node, f"{sym}= -> =", [_sub(node, f"{target} = {value}")])

    def unary(self, node):
        if isinstance(node, ast.UnaryOp) and _number(node) is None and not isinstance(node.op, ast.UAdd):
            sym = {ast.USub: "-", ast.Not: "not ", ast.Invert: "~"}[type(node.op)]
            self.add("unary", node, f"{sym.strip()} removed", [_sub(node, _wrap(node.operand))])

    def compare(self, node):
        if not isinstance(node, ast.Compare):
            return
        for i, op in enumerate(node.ops):
            ops = list(node.ops)
            ops[i] = _CMP[type(op)]()
            new = ast.Compare(node.left, ops, node.comparators)
            left = node.left if i == 0 else node.comparators[i - 1]
            pattern = re.escape(_CMPSYM[type(op)]).replace(r"\ ", r"\s+")
            splice = self.token_splice(left, node.comparators[i], pattern, _CMPSYM[type(ops[i])])
            self.add("compare", node, f"{_CMPSYM[type(op)]} -> {_CMPSYM[type(ops[i])]}",
                     [splice or _sub(node, self.wrap(node, new))])

    def boolop(self, node):
        if isinstance(node, ast.BoolOp):
            new = ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)
            old, sym = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            splices = [self.token_splice(a, b, old, sym) for a, b in zip(node.values, node.values[1:])]
            if not all(splices):
                splices = [_sub(node, self.wrap(node, new))]
            self.add("boolop", node, f"{old} -> {sym}", splices)

    def add_not(self, node):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)) and self.inside(node.test):
            test = node.test
            self.add("not", test, f"{_short(self.seg(test), 40)} -> not (...)", [_sub(test, f"not ({self.seg(test)})")])

    def _context(self, node):
        parent = self.parents.get(node)
        if isinstance(parent, ast.keyword) and parent.arg in ("dim", "keepdim", "training"):
            return parent.arg
        if isinstance(parent, ast.Slice):
            return "slice"
        return "const"

    def constant(self, node):
        parent = self.parents.get(node)
        if isinstance(parent, ast.UnaryOp) and _number(parent) is not None:
            return  # the literal is -n: handled at the UnaryOp
        value = _number(node)
        if value is not None:
            if isinstance(parent, ast.Expr):
                return
            op = self._context(node)
            if op in ("keepdim", "training"):
                op = "const"
            for new in _number_changes(value):
                text = f"({new})" if new.startswith("-") and isinstance(parent, ast.Attribute) else new
                self.replace(op, node, text, change=f"{self.seg(node)} -> {new}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            op = self._context(node)
            op = op if op in ("keepdim", "training") else "const"
            self.replace(op, node, str(not node.value))

    def slice_bounds(self, node):
        if not isinstance(node, ast.Slice):
            return
        for name in ("lower", "upper"):
            bound = getattr(node, name)
            if bound is None:
                continue
            if _number(bound) is None:  # literals get +-1 from `constant`
                text = self.seg(bound)
                for sign in ("+", "-"):
                    self.replace("slice", bound, f"({text}) {sign} 1" if not isinstance(bound, _ATOMIC) else f"{text} {sign} 1")
            if name == "lower" and _number(bound) == 0 and (node.step is None or (_number(node.step) or 0) > 0):
                continue  # `0:` dropped is `:` (equivalent by the language)
            # the bound dropped: rebuild the slice without it
            parts = [self.seg(node.lower) if node.lower is not None and name != "lower" else "",
                     self.seg(node.upper) if node.upper is not None and name != "upper" else ""]
            text = ":".join(parts) + (f":{self.seg(node.step)}" if node.step is not None else "")
            self.add("slice", node, f"{_short(self.seg(node))} -> {text}", [_sub(node, text)])

    def keywords(self, node):
        if not isinstance(node, ast.Call):
            return
        for kw in node.keywords:
            if kw.arg == "dim":
                if _number(kw.value) is None:
                    text = self.seg(kw.value)
                    for sign in ("+", "-"):
                        new = f"{text} {sign} 1" if isinstance(kw.value, _ATOMIC) else f"({text}) {sign} 1"
                        self.replace("dim", kw.value, new, change=f"dim={_short(text)} -> dim={new}")
                self._drop_keyword(node, kw, "dim")

    def _drop_keyword(self, call, kw, op):
        # rebuild the call's argument list without this keyword
        func = self.seg(call.func)
        args = [self.seg(a) if not isinstance(a, ast.Starred) else self.seg(a) for a in call.args]
        args += [(f"{k.arg}={self.seg(k.value)}" if k.arg else f"**{self.seg(k.value)}") for k in call.keywords if k is not kw]
        self.add(op, call, f"{kw.arg}={_short(self.seg(kw.value), 20)} dropped", [_sub(call, f"{func}({', '.join(args)})")])

    def delete(self, node):
        if not isinstance(node, ast.stmt) or isinstance(node, (ast.Return, ast.Pass, ast.FunctionDef, ast.AsyncFunctionDef,
                                                               ast.ClassDef, ast.Import, ast.ImportFrom, ast.Global,
                                                               ast.Nonlocal)):
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return  # a docstring or a bare literal
        first = self.seg(node).splitlines()[0]
        if self.lines[node.lineno - 1][:node.col_offset].strip():
            return  # not at the start of its line (after `;` or `else:`): deleting it is left to its own line
        self.add("delete", node, f"{_short(first, 56)} -> pass", [_sub(node, "pass")])

    def swap(self, node):
        if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
            return
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        torch_call = isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
            and node.func.value.id == "torch"
        for i in range(len(node.args) - 1):
            if name in _SYMMETRIC and i == (1 if torch_call and name in _TRANSPOSE_CALLS else 0):
                continue  # transpose(a, b) is transpose(b, a); maximum(a, b) is maximum(b, a)
            a, b = node.args[i], node.args[i + 1]
            sa, sb = self.seg(a), self.seg(b)
            if sa == sb:
                continue
            self.add("swap", node, f"{_short(self.seg(node.func), 24)}(..{_short(sa, 16)}, {_short(sb, 16)}..) swapped",
                     [_sub(a, sb), _sub(b, sa)])

    def training(self, node):
        if isinstance(node, ast.Attribute) and node.attr == "training" and isinstance(node.ctx, ast.Load):
            for value in (True, False):
                self.replace("training", node, str(value))
        elif isinstance(node, ast.keyword) and node.arg == "training" and not (
                isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool)):
            if isinstance(node.value, ast.Attribute) and node.value.attr == "training":
                return  # training=self.training: the attribute is mutated already
            for value in (True, False):
                self.replace("training", node.value, str(value), change=f"training={_short(self.seg(node.value))} -> training={value}")

    def detach(self, node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach" \
                and not node.args and not node.keywords:
            self.replace("detach", node, _wrap(node.func.value) if not isinstance(node.func.value, _ATOMIC)
                         else self.seg(node.func.value), change=f"{_short(self.seg(node))} -> .detach() removed")
            return
        value = None
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            value = node.value
        if value is None or not isinstance(value, (ast.Call, ast.BinOp, ast.Subscript)):
            return
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "detach":
            return
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute) and value.value.attr == "shape":
            return  # a size, not a tensor
        if isinstance(value, ast.Call) and isinstance(value.func, (ast.Attribute, ast.Name)) and \
                getattr(value.func, "attr", getattr(value.func, "id", "")) in ("size", "len", "dim", "numel", "item"):
            return
        if _without_grad(value):
            return  # a fresh tensor from a factory (torch.arange(...).unsqueeze(1)): .detach() is a no-op on it
        func = self._function(node)
        if func is None or func.name == "__init__":
            return
        text = self.seg(value)
        self.replace("detach", value, f"({text}).detach()" if not isinstance(value, _ATOMIC) else f"{text}.detach()",
                     change=f"{_short(text, 40)} -> .detach() added")

    def transpose(self, node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _TRANSPOSE_CALLS:
            inner = node.func.value
            if isinstance(inner, ast.Name) and inner.id == "torch":
                if node.args:  # torch.transpose(x, a, b): x
                    self.replace("transpose", node, _wrap(node.args[0]), change=f"{_short(self.seg(node))} -> {_short(self.seg(node.args[0]))}")
                return
            self.replace("transpose", node, _wrap(inner), change=f".{node.func.attr}({_short(', '.join(self.seg(a) for a in node.args), 20)}) removed")
        elif isinstance(node, ast.Attribute) and node.attr in _TRANSPOSE_ATTRS and isinstance(node.ctx, ast.Load):
            self.replace("transpose", node, _wrap(node.value), change=f".{node.attr} removed")

    def loop(self, node):
        if isinstance(node, ast.For) and self.inside(node.iter):
            self.replace("loop", node.iter, "[]", change=f"for ... in {_short(self.seg(node.iter), 30)} -> in []")

    def break_continue(self, node):
        if isinstance(node, ast.Break):
            self.replace("break", node, "continue")
        elif isinstance(node, ast.Continue):
            self.replace("break", node, "break")

    def _function(self, node):
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node = self.parents.get(node)
        return node

    def defaults(self):
        """The argument ignored: a parameter with a default replaced by it at every use inside the block."""
        for func in ast.walk(self.tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = func.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            for arg, default in pairs:
                uses = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == arg.arg and self.inside(n)
                        and self._function(n) is func]
                if not uses or any(not isinstance(n.ctx, ast.Load) for n in uses):
                    continue
                text = self.seg(default)
                text = text if isinstance(default, _ATOMIC) or _number(default) is not None else f"({text})"
                self.add("default", uses[0], f"{arg.arg} ignored (= {_short(text, 30)})", [_sub(n, text) for n in uses])


def mutants_of(ref: Reference) -> list[Mutant]:
    """Every compiling, distinct mutant of ``ref``'s solution blocks, with stable ids (sorted by block, line, id)."""
    out: list[Mutant] = []
    seen = set()
    by_cell: dict[int, list[tuple[int, Block]]] = {}
    for number, block in enumerate(ref.blocks, start=1):
        by_cell.setdefault(block.cell, []).append((number, block))
    for cell, numbered in by_cell.items():
        source = ref.sources[cell]
        finder = _Finder(source, [(b.first, b.last) for _, b in numbered])
        seen.add((cell, ast.dump(finder.tree)))
        original_lines = source.splitlines()
        counts: dict[str, int] = {}
        for edit in finder.run():
            number, block = next((n, b) for n, b in numbered if b.first <= edit.node.lineno <= b.last)
            line = edit.node.lineno - block.first + 1
            new_source = _apply(source, edit.splices)
            try:
                with warnings.catch_warnings():  # "'NoneType' object is not callable" and the like: still a mutant
                    warnings.simplefilter("ignore")
                    tree = compile(new_source, "<mutant>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
                    compile(tree, "<mutant>", "exec", dont_inherit=True)
            except (SyntaxError, ValueError):
                continue
            key = (cell, ast.dump(tree))
            if key in seen:
                continue
            seen.add(key)
            base = f"{edit.operator}@{number}.{line}: {edit.change}"
            counts[base] = counts.get(base, 0) + 1
            mid = base if counts[base] == 1 else f"{base} #{counts[base]}"
            new_lines = new_source.splitlines()
            first = edit.node.lineno - 1
            # the changed line(s) of the cell
            ops = difflib.SequenceMatcher(None, original_lines, new_lines, autojunk=False).get_opcodes()
            after = [s for tag, _, _, j1, j2 in ops if tag != "equal" for s in new_lines[j1:j2]]
            out.append(Mutant(ref.exercise, mid, edit.operator, number, line, original_lines[first].strip(),
                              " / ".join(s.strip() for s in after if s.strip()) or "", cell, new_source))
    out.sort(key=lambda m: (m.block, m.line, m.id))
    return out


# -- equivalents ---------------------------------------------------------------------------------------------------

def equivalents(unit_id: str) -> list[dict]:
    """The entries of ``grader/equivalent/uNN.toml`` (``[]`` when it does not exist)."""
    path = EQUIVALENT_DIR / f"u{unit_id}.toml"
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    entries = data.get("equivalent", [])
    for e in entries:
        missing = [k for k in ("exercise", "mutant", "reason") if not str(e.get(k, "")).strip()]
        if missing:
            raise ValueError(f"grader/equivalent/{path.name}: an [[equivalent]] entry lacks {missing}: {e}")
    return entries


def stale(listed: list[dict], mutants: list[Mutant]) -> list[dict]:
    """The listed equivalents whose mutant is not generated (any more)."""
    generated = {(m.exercise, m.id) for m in mutants}
    return [e for e in listed if (e["exercise"], e["mutant"]) not in generated]


# -- running -------------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    exercise: str
    id: str
    operator: str
    before: str
    after: str
    outcome: str  # killed | survived | equivalent
    status: str  # the verdict's status
    points: float
    max_points: float
    bug: str | None
    message: str  # first line
    seconds: float


def _run_one(exercise_id: str, sources: list[str], time_limit_s: float | None = None) -> dict:
    import grader.runner
    from grader.runner import run_check

    if time_limit_s:  # --time-limit: grading's own limit, lowered (a mutant stuck in a loop fails sooner)
        grader.runner.CHECK_TIME_LIMIT_S = time_limit_s
    t0 = time.perf_counter()
    v = run_check(exercise_id, sources)
    message = (v.message or "").strip().splitlines()
    return {"status": v.status, "points": v.points, "max_points": v.max_points, "bug": v.bug_id,
            "message": message[0][:200] if message else "", "seconds": round(time.perf_counter() - t0, 3)}


def _pool_init():
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.simplefilter("ignore")


def run_mutants(mutants: list[Mutant], sources: list[str], jobs: int = 1, progress=None,
                time_limit_s: float | None = None) -> list[dict]:
    """The verdict of each mutant, in order (``_run_one``'s dict)."""
    def sources_for(m):
        s = list(sources)
        s[m.cell] = m.source
        return s

    if jobs <= 1 or len(mutants) < 2:
        out = []
        try:
            for i, m in enumerate(mutants):
                out.append(_run_one(m.exercise, sources_for(m), time_limit_s))
                if progress:
                    progress(i + 1, len(mutants), m, out[-1])
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (main): keep what ran
            print(f"interrupted after {len(out)} of {len(mutants)} mutants", file=sys.stderr)
        return out
    # Checker processes that can start workers of their own: multiprocessing.Pool's processes are daemonic, and a
    # daemonic process may not have children (grading's LearnerProcess then fails every mutant with "its forkserver
    # did not answer"); ProcessPoolExecutor's are not. "spawn", not this process's forkserver: each checker starts
    # its own grading forkserver, and none is a child of the one that LearnerProcess here kills orphans under.
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from grader.forkserver import without_main

    # by their importable name (under `python -m` these functions live in __main__, which the children do not load)
    here = importlib.import_module("coursetools.dev.mutation")
    out = []
    with without_main():  # the children need none of __main__ (the CLI, pytest): not re-imported in each
        pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=here._pool_init)
        pending = [pool.submit(here._run_one, m.exercise, sources_for(m), time_limit_s) for m in mutants]
    try:
        for i, (m, p) in enumerate(zip(mutants, pending)):
            out.append(p.result())
            if progress:
                progress(i + 1, len(mutants), m, out[-1])
    except KeyboardInterrupt:
        print(f"interrupted after {len(out)} of {len(mutants)} mutants", file=sys.stderr)
        running = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in running:  # the running checks stop now, not at their end
            proc.terminate()
    else:
        pool.shutdown()
    return out


def select(mutants: list[Mutant], sample: int | None, seed: int, limit: int | None) -> list[Mutant]:
    """A deterministic subset per exercise: ``sample`` drawn with ``random.Random(f"{seed}:{exercise}")``, or the
    first ``limit`` (id order)."""
    by_ex: dict[str, list[Mutant]] = {}
    for m in mutants:
        by_ex.setdefault(m.exercise, []).append(m)
    out = []
    for ex, ms in by_ex.items():
        if sample is not None and sample < len(ms):
            picked = set(random.Random(f"{seed}:{ex}").sample(range(len(ms)), sample))
            ms = [m for i, m in enumerate(ms) if i in picked]
        elif limit is not None:
            ms = ms[:limit]
        out.extend(ms)
    return out


def unit_mutants(unit_id: str, exercises: list[str] | None = None) -> tuple[list[str], list[Mutant]]:
    """The solution notebook's code cells and every mutant of the unit's (or the given) exercises."""
    from llmcourse.manifest import load_course

    unit = load_course().unit(unit_id)
    sources, metas = solution_sources(unit)
    out = []
    for e in unit.exercises:
        if exercises and e.id not in exercises:
            continue
        out.extend(mutants_of(reference_of(e.id, sources, metas)))
    return sources, out


def classify(mutants: list[Mutant], verdicts: list[dict], listed: list[dict]) -> list[Outcome]:
    eq = {(e["exercise"], e["mutant"]) for e in listed}
    out = []
    for m, v in zip(mutants, verdicts):
        killed = v["points"] < v["max_points"]
        outcome = "killed" if killed else ("equivalent" if (m.exercise, m.id) in eq else "survived")
        out.append(Outcome(m.exercise, m.id, m.operator, m.before, m.after, outcome, v["status"], v["points"],
                           v["max_points"], v["bug"], v["message"], v["seconds"]))
    return out


def summary_line(unit_id: str, outcomes: list[Outcome]) -> str:
    k = sum(o.outcome == "killed" for o in outcomes)
    e = sum(o.outcome == "equivalent" for o in outcomes)
    s = sum(o.outcome == "survived" for o in outcomes)
    return f"unit {unit_id}: {len(outcomes)} mutants, {k} killed, {e} equivalent, {s} survivors"


def _git_commit() -> str:
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "grader", "solutions",
                                "llmcourse"], capture_output=True, text=True, timeout=10).stdout.strip()
        return head + (" + uncommitted changes" if head and dirty else "")
    except Exception:  # noqa: BLE001
        return ""


def run_unit(unit_id: str, args) -> tuple[int, dict]:
    """Run (or list) one unit's mutants; print survivors and the summary line. Returns (survivors, record)."""
    commit, started = _git_commit(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())  # what was run, when
    sources, mutants = unit_mutants(unit_id, args.exercise)
    if args.exercise:
        known = {m.exercise for m in mutants}
        for ex in args.exercise:
            if ex[:2] == unit_id and ex not in known:
                print(f"warning: {ex} has no mutants (or is not an exercise of unit {unit_id})")
    listed = [e for e in equivalents(unit_id) if not args.exercise or e["exercise"] in args.exercise]
    for e in stale(listed, mutants):
        print(f"warning: stale entry in grader/equivalent/u{unit_id}.toml: {e['exercise']} {e['mutant']!r} "
              "is not generated any more", file=sys.stderr)
    chosen = select(mutants, args.sample, args.seed, args.limit)
    if args.list:
        for m in chosen:
            print(f"{m.exercise}  {m.id}\n    - {m.before}\n    + {m.after}")
        print(f"unit {unit_id}: {len(chosen)} mutants listed (of {len(mutants)})")
        return 0, {}
    note = ""
    if len(chosen) < len(mutants):
        how = f"a sample of {args.sample} per exercise, seed {args.seed}" if args.sample is not None \
            else f"the first {args.limit} per exercise"
        note = f"ran {len(chosen)} of {len(mutants)} mutants ({how})"

    def progress(i, n, m, v):
        if args.verbose:
            print(f"[{i}/{n}] {m.exercise} {m.id}: {v['status']} {v['points']}/{v['max_points']} "
                  f"{v['bug'] or ''} ({v['seconds']:.1f} s)", flush=True)

    t0 = time.perf_counter()
    # the reference itself first: a check that fails it would "kill" every mutant
    refs = []
    for m in chosen:
        if m.exercise not in {r.exercise for r in refs}:
            refs.append(Mutant(m.exercise, "(reference)", "reference", 0, 0, "", "", m.cell, sources[m.cell]))
    broken = {}
    ref_verdicts = run_mutants(refs, sources, jobs=args.jobs, time_limit_s=args.time_limit)
    interrupted = len(ref_verdicts) < len(refs)  # Ctrl-C or SIGTERM: run_mutants returned what ran
    if interrupted:
        chosen, note = [], "interrupted while running the references"
    for r, v in zip(refs, ref_verdicts):
        if v["points"] < v["max_points"]:
            broken[r.exercise] = f"{v['status']}: {v['message']}"
            print(f"REFERENCE FAILS {r.exercise} ({v['points']}/{v['max_points']}, {v['status']}: {v['message']}): "
                  "its mutants are not run")
    if broken:
        chosen = [m for m in chosen if m.exercise not in broken]
        note = "; ".join(filter(None, [note, f"not run: the reference fails the check of {', '.join(sorted(broken))}"]))
    verdicts = run_mutants(chosen, sources, jobs=args.jobs, progress=progress, time_limit_s=args.time_limit)
    wall = time.perf_counter() - t0
    if len(verdicts) < len(chosen):  # interrupted: the outcomes so far (in id order: the first exercises)
        interrupted = True
        note = "; ".join(filter(None, [note, f"interrupted: ran {len(verdicts)} of the {len(chosen)} chosen "
                                             f"(exercises {', '.join(dict.fromkeys(m.exercise for m in chosen[len(verdicts):]))} "
                                             "not, or not fully, run)"]))
        chosen = chosen[:len(verdicts)]
    outcomes = classify(chosen, verdicts, listed)
    by_id = {(o.exercise, o.id): o for o in outcomes}
    for e in listed:
        o = by_id.get((e["exercise"], e["mutant"]))
        if o is not None and o.outcome == "killed":
            print(f"warning: grader/equivalent/u{unit_id}.toml lists {e['exercise']} {e['mutant']!r} as equivalent, "
                  f"but the check kills it ({o.status}, {o.bug or o.message[:60]}): remove the entry", file=sys.stderr)
    survivors = [o for o in outcomes if o.outcome == "survived"]
    for o in survivors:
        print(f"SURVIVOR {o.exercise}  {o.id}\n    - {o.before}\n    + {o.after}")
    if args.toml and survivors:
        print(f"# stanzas for grader/equivalent/u{unit_id}.toml (only for mutants no correct check can tell apart):")
        for o in survivors:
            print(f"[[equivalent]]\nexercise = {json.dumps(o.exercise)}\nmutant = {json.dumps(o.id, ensure_ascii=False)}"
                  '\nreason = "TODO"\n')
    errors = [o for o in outcomes if o.status == "error"]
    for o in errors:  # killed, but by the grader failing rather than by a verdict on the answer
        print(f"GRADER ERROR {o.exercise}  {o.id}: {o.message}")
    statuses: dict[str, int] = {}
    for o in outcomes:
        if o.outcome == "killed":
            statuses[o.status] = statuses.get(o.status, 0) + 1
    named = sum(o.outcome == "killed" and bool(o.bug) for o in outcomes)
    if statuses:
        print("killed by: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
              + f" ({named} with a catalogued bug named)")
    per = wall / max(1, len(chosen))
    print(f"ran in {wall:.0f} s ({per:.2f} s a mutant, {args.jobs} job(s))")
    if args.time_limit:
        note = "; ".join(filter(None, [note, f"check time limit lowered to {args.time_limit:g} s"]))
    if note:
        print(note)
    line = summary_line(unit_id, outcomes)
    record = {"unit": unit_id, "commit": commit, "date": started,
              "generated": len(mutants), "ran": len(chosen), "note": note, "summary": line,
              "seconds": round(wall, 1), "jobs": args.jobs, "mutants": [asdict(o) for o in outcomes]}
    record["reference_fails"] = broken
    record["interrupted"] = interrupted
    return len(survivors) + len(broken) + record["interrupted"], record  # the caller prints record["summary"] last


# -- the report ----------------------------------------------------------------------------------------------------

def stored(unit_id: str) -> dict | None:
    path = STORE_DIR / f"u{unit_id}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _redteam(unit_id: str) -> list:
    """The red-team answers of a unit (``tests/redteam/uNN.py``; ``[]`` without a checkout's tests)."""
    if not (ROOT / "tests" / "redteam" / "__init__.py").exists():
        return []
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        from tests.redteam import load

        return load(unit_id)
    except Exception as exc:  # noqa: BLE001 - a broken corpus module is reported, the report still written
        print(f"warning: tests/redteam/u{unit_id}.py could not be loaded: {exc}", file=sys.stderr)
        return []


def report() -> str:
    from grader.runner import load_unit
    from grader.strength import DECISIONS, DEFINING
    from llmcourse.manifest import load_course

    course = load_course()
    lines = [
        "# Grading strength, measured",
        "",
        "Generated by `python -m coursetools.dev.mutation --report` from the stored mutation runs",
        "(`docs/grading-strength/uNN.json`, written by `python -m coursetools.dev.mutation NN --store`), the red-team",
        "corpus (`tests/redteam/uNN.py`) and the declarations of `grader/strength.py` in each unit's check module.",
        "Do not edit by hand.",
        "",
        "## Method",
        "",
        "**Mutants.** The reference answer of each graded exercise (the code between `### BEGIN SOLUTION` and",
        "`### END SOLUTION` in its answer cells of the solution notebook) is rewritten one site at a time by these",
        "operators (`coursetools/dev/mutation.py`, written on Python's `ast`; the module docstring says why",
        "cosmic-ray's and mutmut's operators are followed but not imported):",
        "",
        "| operator | what it changes |",
        "|---|---|",
        "| `arith` | a binary operator, one replacement per site (`+`/`-`, `*`/`/`, `//`->`/`, `%`->`/`, `**`->`*`, `@`->`*`); `x += y` -> `x -= y` and `x = y` |",
        "| `unary` | `-x`, `not x`, `~x` -> `x` |",
        "| `compare` | `<`/`<=`, `>`/`>=`, `==`/`!=`, `is`/`is not`, `in`/`not in` |",
        "| `boolop` | `and`/`or` |",
        "| `not` | the test of an `if`, `while` or conditional expression negated |",
        "| `const` | integer literals +-1 (so 0 -> 1, 1 -> 0), float literals +1 (0.0 -> 1.0, 1.0 -> 0.0), `True`/`False` |",
        "| `slice` | a slice bound +-1, or dropped |",
        "| `dim` | a `dim=` argument +-1, or dropped |",
        "| `keepdim` | `keepdim=` flipped |",
        "| `delete` | a statement replaced by `pass` (not `return`, docstrings, definitions) |",
        "| `swap` | two adjacent positional arguments of a call swapped |",
        "| `default` | a parameter replaced by its default at every use in the block (the argument ignored) |",
        "| `training` | `self.training` / `training=` forced to True, and to False |",
        "| `detach` | `.detach()` removed; added to a returned or assigned value (outside `__init__`) |",
        "| `transpose` | `.transpose(...)`, `.t()`, `.permute(...)`, `.swapaxes(...)`, `.T`, `.mT` removed |",
        "| `loop` | a `for` loop run over `[]` |",
        "| `break` | `break`/`continue` swapped |",
        "",
        "A mutant that does not compile is skipped; mutants with the same code (same AST) are counted once.",
        "Ids read `<operator>@<block>.<line>: <change>` (block and line counted inside the exercise's solution blocks).",
        "",
        "**How a mutant is run.** As grading runs a submission: `grader.runner.run_check(exercise, sources)` on the",
        "solution notebook's code cells with the answer cell replaced by the mutant's (the learner's code in an isolated",
        "worker forked from the warm forkserver, the check in the checker process). **Killed**: it scores less than",
        "the maximum. **Equivalent**: it scores the maximum and is listed in `grader/equivalent/uNN.toml` with a",
        "one-line reason (it cannot change any behaviour a correct check may observe). **Survivor**: it scores the",
        "maximum and is not listed: an open hole of that unit's grading, until a probe kills it or it is shown",
        "equivalent.",
        "",
        "**Red-team answers**: wrong or lazy answers written as a student would (`tests/redteam/uNN.py`, run by",
        "`tests/test_redteam.py`); *open* ones still earn full points. **Decisions**: choices left to the student and",
        "declared withheld (`decision(...)`); **defining property**: the idea each exercise exists to teach, stated",
        "with the probe that observes it (`defining_property(...)`).",
        "",
        "## Summary",
        "",
        "| unit | exercises | mutants | killed | equivalent | survivors | red-team answers (open) | decisions | defining properties |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for unit in course.units:
        if not unit.exercises:
            continue
        load_unit(unit.id)
        n_ex = len(unit.exercises)
        answers = _redteam(unit.id)
        n_open = sum(a.open is not None for a in answers)
        n_dec = sum(len(DECISIONS.get(e.id, [])) for e in unit.exercises)
        n_def = sum(e.id in DEFINING for e in unit.exercises)
        rec = stored(unit.id)
        if rec is None:
            cells = ["not run yet", "", "", ""]
        else:
            ms = rec["mutants"]
            cells = [str(len(ms)), *(str(sum(m["outcome"] == k for m in ms)) for k in ("killed", "equivalent", "survived"))]
        lines.append(f"| {unit.id} | {n_ex} | " + " | ".join(cells) + f" | {len(answers)} ({n_open}) | {n_dec} | {n_def}/{n_ex} |")
        details.append(f"### Unit {unit.id}: {unit.title}")
        details.append("")
        if rec is None:
            details.append("Mutation run: not run yet.")
        else:
            details.append(f"Mutation run of {rec['date']} (commit {rec['commit'] or '?'}, {rec['seconds']:.0f} s with "
                           f"{rec['jobs']} job(s)): {rec['summary'].split(': ', 1)[1]}." + (f" Note: {rec['note']}." if rec.get("note") else ""))
            named = sum(m["outcome"] == "killed" and bool(m["bug"]) for m in rec["mutants"])
            timeouts = sum(m["outcome"] == "killed" and "did not finish within" in m["message"] for m in rec["mutants"])
            details.append(f"Of the killed, {named} named a catalogued bug, {timeouts} ran out of time.")
            surv = [m for m in rec["mutants"] if m["outcome"] == "survived"]
            if surv:
                details.append("")
                details.append("Open holes (survivors):")
                details.append("")
                for m in surv:
                    details.append(f"- `{m['exercise']}` `{m['id']}`: `{m['after']}`")
        details.append("")
        for e in unit.exercises:
            d = DEFINING.get(e.id)
            decs = DECISIONS.get(e.id, [])
            ex_answers = [a for a in answers if a.exercise == e.id]
            bits = [f"- **{e.id}**: " + (f"{d.statement} *(probe: {d.probe})*" if d else "no defining property declared")]
            if decs:
                bits.append("  decisions: " + "; ".join(x.what for x in decs))
            if ex_answers:
                bits.append(f"  red-team answers: {len(ex_answers)}" +
                            (f" ({sum(a.open is not None for a in ex_answers)} open: "
                             + "; ".join(a.title for a in ex_answers if a.open is not None) + ")"
                             if any(a.open is not None for a in ex_answers) else ""))
            details.extend(bits)
        details.append("")
    return "\n".join(lines + ["", "## Per unit", "", *details]).rstrip() + "\n"


def _dump(record: dict) -> str:
    """JSON with one line per mutant (a stored run diffs line by line)."""
    head = {k: v for k, v in record.items() if k != "mutants"}
    lines = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    rows = ",\n".join("  " + json.dumps(m, ensure_ascii=False) for m in record["mutants"])
    return f'{lines},\n "mutants": [\n{rows}\n ]\n}}\n'


# -- command line --------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m coursetools.dev.mutation", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("units", nargs="*", help="unit ids (NN)")
    p.add_argument("--exercise", action="append", help="only this exercise (NN.name); repeatable")
    p.add_argument("--list", action="store_true", help="print the mutants without running them")
    p.add_argument("--sample", type=int, help="run N mutants per exercise, drawn with --seed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, help="run the first N mutants per exercise")
    p.add_argument("--jobs", type=int, default=1, help="checker processes")
    p.add_argument("--json", help="write the outcomes to this file")
    p.add_argument("--store", action="store_true", help="store a full run in docs/grading-strength/uNN.json")
    p.add_argument("--report", action="store_true", help="regenerate docs/grading-strength.md and exit")
    p.add_argument("--time-limit", type=float, help="seconds a check may take (default: grading's own limit)")
    p.add_argument("--toml", action="store_true", help="also print each survivor as an [[equivalent]] stanza")
    p.add_argument("-v", "--verbose", action="store_true", help="print each mutant's verdict as it comes")
    args = p.parse_args(argv)
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # `timeout` and make send SIGTERM: the outcomes so far are kept
    if args.report:
        REPORT.write_text(report(), encoding="utf-8")
        print(f"wrote {REPORT.relative_to(ROOT)}")
        return 0
    units = list(args.units) or sorted({e[:2] for e in args.exercise or []})
    if not units:
        p.print_usage()
        return 2
    if args.store and (args.exercise or args.sample is not None or args.limit is not None):
        print("--store stores full runs only (no --exercise, --sample or --limit)", file=sys.stderr)
        return 2
    records, survivors = [], 0
    for unit_id in units:
        s, record = run_unit(unit_id.zfill(2), args)
        survivors += s
        if record:
            records.append(record)
            if args.store and record.get("reference_fails"):
                # a run whose reference answer failed measured nothing: never replace a stored run with it
                print(f"not stored: the reference fails {', '.join(sorted(record['reference_fails']))}",
                      file=sys.stderr)
                survivors += 1
            elif args.store:
                STORE_DIR.mkdir(parents=True, exist_ok=True)
                path = STORE_DIR / f"u{record['unit']}.json"
                path.write_text(_dump(record), encoding="utf-8")
                print(f"stored {path.relative_to(ROOT)}")
            print(record["summary"], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records if len(records) != 1 else records[0], indent=1,
                                              ensure_ascii=False) + "\n", encoding="utf-8")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
