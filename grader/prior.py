"""One mistake costs one exercise: grade a later exercise on the course's versions of the earlier ones it calls.

A learner's ``DeepSeekMoE`` calls their own ``deepseek_route``; their ``FP8Linear`` calls their own quantisers and GEMM.
Graded as written, one wrong routing or scale would fail every exercise built on it. :func:`use_course` points the
learner's class or function (inside a probe, in the worker) at the course library's finished versions of those
earlier exercises, by replacing the names in the globals its code reads; what the exercise itself asks for stays the
learner's. Names the learner's code does not use are left alone, and the course's own modules are never touched.
"""

from __future__ import annotations

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


def use_course(obj, **course_objects) -> None:
    """Make ``obj`` (the learner's class or function) call ``course_objects`` instead of its own same-named globals."""
    for fn in _functions(obj):
        g = fn.__globals__
        if str(g.get("__name__", "")).startswith(("llmcourse", "grader", "torch")):
            continue
        for name, value in course_objects.items():
            if name in g:
                g[name] = value
