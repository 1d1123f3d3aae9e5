"""Which widgets a notebook declares, read from the source (no registry to keep up to date).

* :func:`widget_registry` parses ``llmcourse/viz/*.py``: every top-level ``show_<name>`` function that
  calls ``live_or_static("WNN.k", ...)`` maps to that widget id.
* :func:`declared_widgets` parses a notebook's code cells: every call of a registered ``show_<name>``
  (``show_x(...)``, ``viz.show_x(...)``, ``llmcourse.viz.show_x(...)``) declares its widget, unless the
  call passes ``static=True`` (then the static fallback is what the notebook asks for).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import nbformat

VIZ = Path(__file__).resolve().parents[2] / "llmcourse" / "viz"


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


_PARSED: dict[tuple, dict[str, str]] = {}


def widget_registry(viz_dir: Path = VIZ) -> dict[str, str]:
    """``{"show_attention_lab": "W03.1", ...}`` from the ``live_or_static`` call in each ``show_*``.

    Parsed once per state of the files (their names, sizes and modification times): every lesson asks for it.
    """
    key = (str(viz_dir), *((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(viz_dir.glob("*.py"))))
    if key not in _PARSED:
        _PARSED[key] = _parse_registry(viz_dir)
    return dict(_PARSED[key])


def _parse_registry(viz_dir: Path) -> dict[str, str]:
    registry: dict[str, str] = {}
    for path in sorted(viz_dir.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for fn in tree.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("show_")):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.Call) and _call_name(node) == "live_or_static" and node.args
                        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                    registry[fn.name] = node.args[0].value
                    break
    return registry


def _python_source(cell_source: str) -> str:
    """Cell source with IPython magics and shell escapes commented out, so ``ast`` can parse it."""
    lines = []
    for line in cell_source.splitlines():
        stripped = line.lstrip()
        lines.append(("# " + line) if stripped.startswith(("%", "!")) else line)
    return "\n".join(lines)


def declared_widgets(notebook: str | Path | nbformat.NotebookNode, registry: dict[str, str] | None = None) -> Counter:
    """Widget ids the notebook shows live, with how many calls each (``Counter({"W03.6": 1, ...})``).

    Raises:
        SyntaxError: a code cell is not valid Python (the notebook would not run either).
    """
    registry = widget_registry() if registry is None else registry
    nb = notebook if isinstance(notebook, nbformat.NotebookNode) else nbformat.read(str(notebook), as_version=4)
    found: Counter = Counter()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(_python_source(cell.source))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _call_name(node)
            if name not in registry:
                continue
            static = next((kw.value for kw in node.keywords if kw.arg == "static"), None)
            if isinstance(static, ast.Constant) and static.value is True:
                continue
            found[registry[name]] += 1
    return found


def css_class(widget_id: str) -> str:
    from llmcourse.viz.base import css_class as _css

    return _css(widget_id)
