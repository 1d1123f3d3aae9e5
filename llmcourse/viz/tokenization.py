"""Widgets of unit 01 (tokenization): the BPE stepper, the tokenizer comparison
and the sliding-window view.

Each widget follows :mod:`llmcourse.viz.base`: pure compute functions (tested in pytest), draw
functions that paint a matplotlib ``Figure``, and ``show_*(..., static=None)`` returning the live
ipywidgets UI or one static figure. The tokenizer comparison's live view is an ``ipywidgets.HTML`` of coloured chips
whose ``title`` attribute shows the token id on hover (plain HTML, no JavaScript).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from ..data.tokenizers import END_OF_WORD, UNK_TOKEN, BPEStep, bpe_trace
from ..data.windows import window_starts
from .base import figure, live_or_static, redrawing_output

__all__ = [
    "TOY_CORPUS", "TokenView", "WindowRow", "chip_colour", "compare_tokenizers", "draw_bpe_states",
    "draw_token_views", "draw_windows", "layout_chips", "pair_table", "parse_corpus", "show_bpe_stepper",
    "show_sliding_window", "show_tokenizer_comparison", "sliding_windows", "token_views_html",
]

TOY_CORPUS = {"old": 7, "older": 3, "finest": 9, "lowest": 4}  # F01.1
TIE_BREAK_LABELS = {"course rule (smallest pair)": "lexmin", "first seen": "first_seen", "largest pair": "lexmax"}
_PALETTE = ["#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f", "#cab2d6", "#ffff99", "#8dd3c7", "#fccde5",
            "#d9d9d9", "#bebada", "#ccebc5", "#ffed6f"]


def chip_colour(token_id: int | None) -> str:
    """A pastel colour fixed per id (the same token always gets the same colour); grey for unknown."""
    if token_id is None or token_id < 0:
        return "#e0e0e0"
    return _PALETTE[token_id % len(_PALETTE)]


# ============================================================================ W01.1 BPE stepper


def parse_corpus(text: str) -> dict[str, int]:
    """``"old 7\\nolder 3"`` -> ``{"old": 7, "older": 3}``; a line with one word counts 1; repeats add up.

    Raises:
        ValueError: a line with more than two fields or a count that is not a positive integer,
            naming the line; or no words at all.
    """
    counts: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) > 2:
            raise ValueError(f"line {n}: write one word and an optional count, e.g. 'lowest 4'; got {line!r}")
        word = fields[0]
        try:
            count = int(fields[1]) if len(fields) == 2 else 1
        except ValueError:
            raise ValueError(f"line {n}: the count {fields[1]!r} is not an integer") from None
        if count < 1:
            raise ValueError(f"line {n}: counts must be positive; got {count}")
        counts[word] = counts.get(word, 0) + count
    if not counts:
        raise ValueError("the corpus is empty: write one word per line, optionally followed by its count")
    return counts


def pair_table(step: BPEStep, top: int | None = 15) -> list[tuple[tuple[str, str], int, str]]:
    """Rows ``(pair, count, status)`` sorted by count (high first), then by pair; ``status`` is
    ``"best"`` for the pair the rule merges next, ``"tied"`` for the other pairs with the top count."""
    rows = sorted(step.counts.items(), key=lambda kv: (-kv[1], kv[0]))
    tied = set(step.tied)
    out = [(p, c, "best" if p == step.next_merge else "tied" if p in tied else "") for p, c in rows]
    return out[:top] if top else out


def _fmt_pair(pair: tuple[str, str]) -> str:
    return f"{pair[0]} + {pair[1]}"


def draw_bpe_states(states: Sequence[BPEStep], titles: Sequence[str] | None = None, top: int = 12):
    """One panel per state: the pair-count table (next merge filled, tied pairs outlined), the current
    segmentation of every word and the merges so far."""
    n = len(states)
    fig, axes = figure(1, n, figsize=(3.3 * n, 5.4), squeeze=False)
    fig.suptitle("filled: the pair merged next; dashed: pairs tied with it at the top count", fontsize=8)
    for k, (ax, st) in enumerate(zip(axes[0], states)):
        ax.set_axis_off()
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        title = titles[k] if titles else f"after {len(st.merges)} merges"
        ax.set_title(title, fontsize=10)
        rows = pair_table(st, top)
        y, dy = 0.97, 0.031
        ax.text(0.02, y, "pair", fontsize=8, weight="bold", va="top")
        ax.text(0.80, y, "count", fontsize=8, weight="bold", va="top")
        for pair, count, status in rows:
            y -= dy
            if status:
                ax.add_patch(_row_patch(y, dy, status))
            ax.text(0.02, y, _fmt_pair(pair), fontsize=8, va="top", family="monospace")
            ax.text(0.80, y, str(count), fontsize=8, va="top", family="monospace")
        if not rows:
            y -= dy
            ax.text(0.02, y, "(no pairs left)", fontsize=8, va="top")
        more = len(st.counts) - len(rows)
        if more > 0:
            y -= dy
            ax.text(0.02, y, f"… {more} more pairs", fontsize=7, va="top", color="#666")
        y -= 1.6 * dy
        ax.text(0.02, y, "segmentation", fontsize=8, weight="bold", va="top")
        for symbols in list(st.segmentation.values())[:8]:
            y -= dy
            ax.text(0.02, y, " ".join(symbols), fontsize=7.5, va="top", family="monospace")
        y -= 1.6 * dy
        merges = ", ".join("".join(m) for m in st.merges[-6:]) or "—"
        prefix = "… " if len(st.merges) > 6 else ""
        ax.text(0.02, y, "merges: " + prefix + merges, fontsize=7, va="top", wrap=True)
    return fig


def _row_patch(y, dy, status):
    from matplotlib.patches import Rectangle

    if status == "best":
        return Rectangle((0.0, y - dy * 0.95), 1.0, dy * 0.95, facecolor="#ffd54f", edgecolor="#e65100", lw=1.2)
    return Rectangle((0.0, y - dy * 0.95), 1.0, dy * 0.95, facecolor="none", edgecolor="#e65100", lw=1.0, ls="--")


def show_bpe_stepper(word_counts: dict[str, int] | None = None, static: bool | None = None,
                     end_of_word: str = END_OF_WORD):
    """The BPE stepper: step through BPE training merge by merge.

    Live: a corpus editor (one ``word count`` per line, default the toy corpus), "merge" and
    "reset" buttons and a tie-break dropdown (course rule / first seen / largest pair). Static: the
    tables after 0, 1, 3 and 12 merges of the toy corpus with the course rule.
    """
    corpus = dict(word_counts or TOY_CORPUS)

    def build_static():
        states = bpe_trace(corpus, 12, end_of_word)
        picked = [states[min(k, len(states) - 1)] for k in (0, 1, 3, 12)]
        return draw_bpe_states(picked)

    def build_live():
        import ipywidgets as w

        editor = w.Textarea(value="\n".join(f"{k} {v}" for k, v in corpus.items()), rows=6,
                            description="corpus", layout=w.Layout(width="260px"))
        rule = w.Dropdown(options=list(TIE_BREAK_LABELS), value="course rule (smallest pair)", description="ties")
        merge_btn, reset_btn = w.Button(description="merge"), w.Button(description="reset")
        status = w.HTML()
        state = {"k": 0, "done": False}

        def draw(step):
            return draw_bpe_states([step])

        out, update = redrawing_output(draw)

        def refresh(*_):
            try:
                states = bpe_trace(parse_corpus(editor.value), state["k"], end_of_word, TIE_BREAK_LABELS[rule.value])
            except ValueError as exc:
                status.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
                return
            step = states[-1]
            state["k"], state["done"] = len(step.merges), step.next_merge is None
            update(step=step)
            note = " (every word is one symbol: training is finished)" if state["done"] else ""
            status.value = f"merges so far: <b>{state['k']}</b>{note}"

        def on_merge(_):
            if not state["done"]:
                state["k"] += 1
            refresh()

        def on_reset(*_):
            state["k"] = 0
            refresh()

        merge_btn.on_click(on_merge)
        reset_btn.on_click(on_reset)
        editor.observe(on_reset, names="value")
        rule.observe(on_reset, names="value")
        refresh()
        return w.VBox([w.HBox([editor, w.VBox([rule, w.HBox([merge_btn, reset_btn]), status])]), out])

    return live_or_static("W01.1", build_live, build_static, static,
                          caption="BPE on the toy corpus after 0, 1, 3 and 12 merges (course tie-break rule)")


# ============================================================================ W01.2 tokenizer comparison


@dataclass
class TokenView:
    """One tokenizer's view of a text: the token strings and their ids (``None`` = not in the vocabulary)."""

    name: str
    pieces: list[str]
    ids: list[int | None]
    n_chars: int

    @property
    def n_tokens(self) -> int:
        return len(self.pieces)

    @property
    def chars_per_token(self) -> float:
        return self.n_chars / self.n_tokens if self.n_tokens else float("nan")


def compare_tokenizers(text: str, word=None, char=None, bpe=None, gpt2=None) -> list[TokenView]:
    """Token views of ``text`` under each tokenizer given (``None`` ones are skipped).

    Args:
        word: a :class:`~llmcourse.data.tokenizers.WordTokenizer` (unknown words -> ``<|unk|>``, id ``None``).
        char: a :class:`~llmcourse.data.tokenizers.CharTokenizer` (unknown characters get id ``None``).
        bpe: a :class:`~llmcourse.data.tokenizers.BPETokenizer` (the course BPE).
        gpt2: a ``tiktoken.Encoding``; a piece that is not valid UTF-8 on its own (part of a multi-byte
            character) is shown with ``\\x..`` escapes.

    Special tokens typed in the text (``<|endoftext|>``) are treated as allowed by every tokenizer.

    Raises:
        ValueError: ``text`` is empty.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("type some text to compare tokenizers")
    views = []
    if word is not None:
        pieces = word.tokenize(text, allowed_special="all")
        views.append(TokenView("word", pieces, [None if p == UNK_TOKEN else word.stoi[p] for p in pieces], len(text)))
    if char is not None:
        views.append(TokenView("character", list(text), [char.stoi.get(c) for c in text], len(text)))
    if bpe is not None:
        pieces = bpe.tokenize(text, allowed_special="all")
        views.append(TokenView(f"course BPE ({len(bpe.merges)} merges)", pieces,
                               [None if p == UNK_TOKEN else bpe.stoi[p] for p in pieces], len(text)))
    if gpt2 is not None:
        ids = gpt2.encode(text, allowed_special="all")
        pieces = [gpt2.decode_single_token_bytes(i).decode("utf-8", errors="backslashreplace") for i in ids]
        views.append(TokenView("GPT-2 (tiktoken)", pieces, ids, len(text)))
    return views


def _display_piece(piece: str) -> str:
    return (piece.replace(END_OF_WORD, "_").replace(" ", "·").replace("\n", "↵").replace("\t", "→")) or "∅"


def layout_chips(pieces: Sequence[str], width: int) -> list[tuple[int, int, int]]:
    """Wrap chips into lines of at most ``width`` characters: ``(line, start column, length)`` per piece
    (a piece longer than ``width`` gets a line of its own)."""
    out, line, col = [], 0, 0
    for p in pieces:
        n = max(len(_display_piece(p)), 1)
        if col > 0 and col + n > width:
            line, col = line + 1, 0
        out.append((line, col, n))
        col += n + 1
    return out


def draw_token_views(views: Sequence[TokenView], width: int = 90, max_lines: int = 6):
    """Chips for each tokenizer, one block per tokenizer, ids printed under the chips when they fit."""
    layouts = [layout_chips(v.pieces, width) for v in views]
    heights = [min((lay[-1][0] + 1) if lay else 1, max_lines) for lay in layouts]
    total = sum(h + 1.6 for h in heights)
    fig, ax = figure(figsize=(11, 0.34 * total + 0.4))
    ax.set_axis_off()
    ax.set_xlim(0, width)
    ax.set_ylim(total, 0)
    y = 0.0
    from matplotlib.patches import FancyBboxPatch

    for v, lay, h in zip(views, layouts, heights):
        ax.text(0, y + 0.55, f"{v.name}: {v.n_tokens} tokens, {v.chars_per_token:.2f} characters per token",
                fontsize=9, weight="bold", va="center")
        y += 1.1
        for piece, tid, (line, col, n) in zip(v.pieces, v.ids, lay):
            if line >= max_lines:
                ax.text(width - 1, y + max_lines - 0.5, "…", fontsize=9, ha="right")
                break
            ax.add_patch(FancyBboxPatch((col + 0.1, y + line + 0.12), n - 0.2, 0.76,
                                        boxstyle="round,pad=0.02,rounding_size=0.15",
                                        facecolor=chip_colour(tid), edgecolor="#555", lw=0.4))
            ax.text(col + n / 2, y + line + 0.5, _display_piece(piece), fontsize=7, ha="center", va="center",
                    family="monospace")
        y += h + 0.5
    return fig


def token_views_html(views: Sequence[TokenView]) -> str:
    """HTML chips (id on hover via the ``title`` attribute) with counts; used by the live widget."""
    parts = []
    for v in views:
        chips = "".join(
            f'<span title="{"id " + str(i) if i is not None else "not in the vocabulary"}" '
            f'style="background:{chip_colour(i)};border:1px solid #888;border-radius:4px;padding:0 3px;'
            f'margin:1px;font-family:monospace;white-space:pre;display:inline-block">'
            f"{html.escape(_display_piece(p))}</span>"
            for p, i in zip(v.pieces, v.ids))
        parts.append(f"<div style='margin:6px 0'><b>{html.escape(v.name)}</b>: {v.n_tokens} tokens, "
                     f"{v.chars_per_token:.2f} characters per token<br>{chips}</div>")
    legend = ("<div style='font-size:small;color:#555'>· = space, ↵ = newline, _ = end of word (&lt;/w&gt;); "
              "grey chips are not in the vocabulary. Hover over a chip to see its id.</div>")
    return "".join(parts) + legend


def show_tokenizer_comparison(text: str, word=None, char=None, bpe=None, gpt2=None, static: bool | None = None):
    """The tokenizer comparison: type a sentence and see its tokens under the word, character, course-BPE and GPT-2
    tokenizers as coloured chips (ids on hover), with token counts and characters per token.
    Static: ``text`` (the lesson passes the-verdict's first sentence)."""

    def build_static():
        return draw_token_views(compare_tokenizers(text, word, char, bpe, gpt2))

    def build_live():
        import ipywidgets as w

        box = w.Textarea(value=text, rows=3, layout=w.Layout(width="95%"), continuous_update=False)
        view = w.HTML()

        def refresh(*_):
            try:
                view.value = token_views_html(compare_tokenizers(box.value, word, char, bpe, gpt2))
            except ValueError as exc:
                view.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"

        box.observe(refresh, names="value")
        refresh()
        return w.VBox([box, view])

    return live_or_static("W01.2", build_live, build_static, static,
                          caption="The same sentence under four tokenizers")


# ============================================================================ W01.3 sliding window


@dataclass
class WindowRow:
    """One window: its start, the positions of its input and target tokens, and the input positions it
    shares with the previous window's input (the overlap)."""

    start: int
    inputs: range
    targets: range
    overlap: range


def sliding_windows(n_tokens: int, context_length: int, stride: int, max_windows: int | None = None) -> list[WindowRow]:
    """The windows of :class:`~llmcourse.data.windows.GPTWindowDataset` over ``n_tokens`` tokens
    (starts ``range(0, n_tokens − L, stride)``), at most ``max_windows`` of them.

    Raises:
        ValueError: ``context_length`` or ``stride`` < 1, or ``n_tokens ≤ context_length``.
    """
    if context_length < 1 or stride < 1:
        raise ValueError(f"context_length and stride must be ≥ 1; got {context_length}, {stride}")
    if n_tokens <= context_length:
        raise ValueError(f"{n_tokens} tokens cannot hold one window of context_length {context_length} plus its target")
    rows = []
    for s in window_starts(n_tokens, context_length, stride):
        if max_windows is not None and len(rows) >= max_windows:
            break
        prev = rows[-1].inputs if rows else range(0)
        overlap = range(max(s, prev.start), min(s + context_length, prev.stop)) if rows else range(0)
        rows.append(WindowRow(s, range(s, s + context_length), range(s + 1, s + context_length + 1),
                              overlap if len(overlap) > 0 else range(0)))
    return rows


def draw_windows(pieces: Sequence[str], panels: Sequence[tuple[int, int]], max_windows: int = 8):
    """One panel per ``(context_length, stride)``: the tokens along the top, then for every window an
    input row (blue; overlap with the previous window hatched) and its target row (orange) shifted by one."""
    from matplotlib.patches import Rectangle

    n = len(pieces)
    fig, axes = figure(len(panels), 1, figsize=(12, 1.0 + 0.42 * max_windows * len(panels)), squeeze=False)
    for ax, (L, stride) in zip(axes[:, 0], panels):
        rows = sliding_windows(n, L, stride, max_windows)
        total = len(window_starts(n, L, stride))
        ax.set_xlim(-2.6, n)
        ax.set_ylim(2 * len(rows) + 1.3, -2.6)
        ax.set_axis_off()
        ax.set_title(f"context_length = {L}, stride = {stride}: {total} windows over {n} tokens "
                     f"(first {len(rows)} shown)", fontsize=9, loc="left")
        for j, p in enumerate(pieces):
            ax.text(j + 0.5, 1.05, p.replace(" ", "·").replace("\n", "↵")[:10], rotation=90, fontsize=6.5,
                    ha="center", va="bottom", family="monospace")
        for r, row in enumerate(rows):
            y = 1.2 + 2 * r
            ax.text(-0.2, y + 0.45, f"x{r}", fontsize=7, ha="right", va="center")
            ax.text(-0.2, y + 1.3, f"y{r}", fontsize=7, ha="right", va="center")
            for j in row.inputs:
                shared = j in row.overlap
                ax.add_patch(Rectangle((j + 0.05, y), 0.9, 0.8, facecolor="#6baed6" if shared else "#c6dbef",
                                       edgecolor="#08519c", lw=0.5, hatch="///" if shared else None))
            for j in row.targets:
                ax.add_patch(Rectangle((j + 0.05, y + 0.9), 0.9, 0.8, facecolor="#fdd0a2", edgecolor="#a63603", lw=0.5))
    return fig


def show_sliding_window(pieces: Sequence[str], static: bool | None = None, max_windows: int = 8):
    """The sliding-window view: context-length and stride sliders over a list of token strings (the lesson passes the
    first 40 GPT-2 tokens of the-verdict); inputs and targets aligned, overlap hatched.
    Static: ``context_length = 4`` with strides 1 and 4."""
    pieces = list(pieces)

    def build_static():
        return draw_windows(pieces, [(4, 1), (4, 4)], max_windows)

    def build_live():
        import ipywidgets as w

        L = w.IntSlider(value=4, min=1, max=min(16, len(pieces) - 1), description="context")
        stride = w.IntSlider(value=1, min=1, max=16, description="stride")
        out, update = redrawing_output(lambda L, stride: draw_windows(pieces, [(L, stride)], max_windows))

        def refresh(*_):
            update(L=L.value, stride=stride.value)

        L.observe(refresh, names="value")
        stride.observe(refresh, names="value")
        refresh()
        return w.VBox([w.HBox([L, stride]), out])

    return live_or_static("W01.3", build_live, build_static, static,
                          caption="Sliding windows: L = 4 with stride 1 (overlapping) and stride 4 (disjoint)")
