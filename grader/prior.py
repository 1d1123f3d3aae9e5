"""One mistake costs one exercise: grade a later exercise on the course's versions of the earlier ones it calls.

A learner's ``DeepSeekMoE`` calls their own ``deepseek_route``; their ``FP8Linear`` calls their own quantisers and GEMM.
Graded as written, one wrong routing or scale would fail every exercise built on it. :func:`use_course` points the
learner's class or function (inside a probe, in the worker) at the course library's finished versions of those
earlier exercises, by replacing the names in the globals its code reads; what the exercise itself asks for stays the
learner's. Names the learner's code does not use are left alone, and the course's own modules are never touched.
The replacement lasts as long as the worker's copy of the notebook (the module built in a probe is called after the
helper returns). :func:`course_versions` is the same for one ``with`` block, after which the learner's own objects
are put back (unit 05's ``course_parts``: LayerNorm/FeedForward/gelu bound around a probe of a block).
"""

from __future__ import annotations

import contextlib
import inspect


def _functions(obj):
    obj = getattr(obj, "__wrapped__", obj)
    if inspect.isclass(obj):
        for klass in obj.__mro__:
            if klass.__module__.startswith(("torch", "builtins", "llmcourse", "grader")):
                continue
            for v in vars(klass).values():
                v = getattr(v, "__func__", v)
                if isinstance(v, property):
                    v = v.fget
                if inspect.isfunction(v):
                    yield v
    elif inspect.isfunction(obj):
        yield obj


def _learner_globals(obj) -> list[dict]:
    """The globals dicts ``obj``'s functions read (the notebook's namespace), each once; the course's, the grader's
    and torch's own modules never."""
    found = {}
    for fn in _functions(obj):
        g = fn.__globals__
        if not str(g.get("__name__", "")).startswith(("llmcourse", "grader", "torch")):
            found[id(g)] = g
    return list(found.values())


def use_course(obj, **course_objects) -> list[tuple[dict, str, object]]:
    """Make ``obj`` (the learner's class or function) call ``course_objects`` instead of its own same-named globals.

    Returns what was replaced, ``[(globals, name, the learner's object)]``, for :func:`course_versions` to put back.
    """
    replaced = []
    for g in _learner_globals(obj):
        for name, value in course_objects.items():
            if name in g:
                replaced.append((g, name, g[name]))
                g[name] = value
    return replaced


@contextlib.contextmanager
def course_versions(obj, **course_objects):
    """:func:`use_course` for the duration of a ``with`` block: the learner's own objects are put back afterwards
    (for a probe that must leave the notebook's namespace as it found it, e.g. unit 05's blocks)."""
    replaced = use_course(obj, **course_objects)
    try:
        yield
    finally:
        for g, name, value in reversed(replaced):
            g[name] = value
