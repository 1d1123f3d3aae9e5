"""The widget convention: live ipywidgets, or one static matplotlib figure.

Every widget of the course is a function ``show_<name>(..., static=None)`` in ``llmcourse.viz``
built from three parts:

1. a **pure compute function** (tensors in, tensors/numbers out) that pytest checks;
2. a **draw function** ``draw(fig, **controls)`` that paints a matplotlib ``Figure``;
3. :func:`live_or_static`, which either builds the live UI (ipywidgets controls + an ``Output``
   that is redrawn on every change) or returns one :class:`StaticFigure` for the default controls.

``static=None`` means "ask the profile" (:func:`llmcourse.widgets_live`): static under ``ci`` unless
``LLMCOURSE_WIDGETS=live``. No JavaScript is loaded from a CDN: ipywidgets ships with JupyterLab
and figures are PNG images. Return values display themselves when they end a cell.

DOM classes (used by the browser tests): a live widget's outer box has ``llmcourse-widget`` and
``llmcourse-<id>`` (``W03.1`` -> ``llmcourse-w03-1``); a static fallback is an HTML ``div`` with class
``llmcourse-static`` and ``data-widget="<id>"``.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable

from matplotlib.figure import Figure

from ..runtime import widgets_live

__all__ = ["StaticFigure", "css_class", "figure", "live_or_static", "render_png"]


def figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (6, 4), **kwargs):
    """A matplotlib ``Figure`` and its axes, created without pyplot (so nothing is auto-displayed twice)."""
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(nrows, ncols, **kwargs)
    return fig, axes


def render_png(fig: Figure, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def css_class(widget_id: str) -> str:
    """``"W03.1"`` -> ``"llmcourse-w03-1"``."""
    return "llmcourse-" + widget_id.lower().replace(".", "-")


class StaticFigure:
    """A figure shown as a PNG inside a marked ``div`` (static fallback of widget ``widget_id``)."""

    def __init__(self, fig: Figure, widget_id: str, caption: str = ""):
        self.figure = fig
        self.widget_id = widget_id
        self.caption = caption

    def _repr_png_(self) -> bytes:
        return render_png(self.figure)

    def _repr_html_(self) -> str:
        data = base64.b64encode(self._repr_png_()).decode()
        note = ("Static preview (interactive version: run with the `laptop` profile or "
                "LLMCOURSE_WIDGETS=live).")
        caption = f"<br><em>{self.caption}</em>" if self.caption else ""
        alt = html.escape(self.caption or "figure", quote=True)  # never the internal widget id
        return (f'<div class="llmcourse-static" data-widget="{self.widget_id}">'
                f'<img alt="{alt}" src="data:image/png;base64,{data}"/>'
                f'<div style="font-size:small;color:#666">{note}{caption}</div></div>')


def live_or_static(widget_id: str, build_live: Callable[[], object], build_static: Callable[[], Figure],
                   static: bool | None = None, caption: str = ""):
    """The live widget (``build_live()``, tagged with the DOM classes) or a :class:`StaticFigure`."""
    if static is None:
        static = not widgets_live()
    if static:
        return StaticFigure(build_static(), widget_id, caption)
    w = build_live()
    _full_width_labels(w)
    w.add_class("llmcourse-widget")
    w.add_class(css_class(widget_id))
    return w


def _full_width_labels(widget) -> None:
    """Show control labels in full ("temperature", not "temperat…"): ipywidgets truncates them at 80 px."""
    style = getattr(widget, "style", None)
    if getattr(widget, "description", "") and style is not None and hasattr(style, "description_width"):
        if not style.description_width:
            style.description_width = "initial"
    for child in getattr(widget, "children", ()) or ():
        _full_width_labels(child)


def redrawing_output(draw: Callable[..., Figure]):
    """An ``ipywidgets.Output`` plus ``update(**controls)`` that redraws ``draw(**controls)`` into it."""
    import ipywidgets as widgets
    from IPython.display import display

    out = widgets.Output()

    def update(**controls):
        fig = draw(**controls)
        with out:
            out.clear_output(wait=True)
            display(StaticPNG(fig))

    return out, update



def linked_controls(controls: dict, draw: Callable[..., Figure], rows: list[list[str]] | None = None):
    """A live panel: rows of ``controls`` (an ``{argument: ipywidget}`` dict; one row by default) above an Output
    that ``draw(**{argument: widget.value})`` redraws on every change."""
    import ipywidgets as widgets

    out, update = redrawing_output(draw)

    def refresh(_change=None):
        update(**{k: c.value for k, c in controls.items()})

    for c in controls.values():
        c.observe(refresh, names="value")
    refresh()
    rows = rows or [list(controls)]
    return widgets.VBox([widgets.HBox([controls[k] for k in row]) for row in rows] + [out])

class StaticPNG:
    """A bare PNG display object (used inside live widgets' Output areas)."""

    def __init__(self, fig: Figure):
        self.figure = fig

    def _repr_png_(self) -> bytes:
        return render_png(self.figure)
