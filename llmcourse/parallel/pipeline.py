"""Pipeline-parallel schedules, simulated: when each stage computes, how long it idles, how many activations it holds.

``p`` stages (consecutive groups of layers on different devices) process ``m`` micro-batches of one batch. A
stage's forward of micro-batch ``i`` needs the previous stage's forward of ``i``; its backward of ``i`` needs the
next stage's backward of ``i`` (and its own forward of ``i``). Two classic orders of the work on each stage:

* **GPipe** (Huang et al. 2019, §2.2 and Fig. 2c): all ``m`` forwards, then all ``m`` backwards. A stage holds the
  activations of every micro-batch at once (``m``).
* **1F1B** (PipeDream-Flush, Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training", §2.2 and
  Fig. 3; the non-interleaved schedule of Megatron-LM, Narayanan et al. 2021 SC, §2.2.1): stage ``s`` runs
  ``min(p − s − 1, m)`` warm-up forwards, then alternates one forward and one backward, then drains the remaining
  backwards. It holds at most ``p − s`` micro-batches' activations, whatever ``m``.

With the same forward time ``f`` and backward time ``b`` on every stage, both take ``(m + p − 1)(f + b)`` for the
batch, so each stage idles the fraction ``(p − 1)/(m + p − 1)`` (the "bubble"): 1F1B saves memory, not time.
:func:`simulate_pipeline` computes the timeline from the dependencies alone; the closed forms are what it is
tested against (tests/test_unit18_parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PipelineRun", "bubble_fraction", "simulate_pipeline", "stage_order"]


@dataclass
class PipelineRun:
    """One simulated batch. ``ops[s]``: stage ``s``'s work in order, ``(kind, micro_batch, start, end)`` with kind
    ``"F"`` or ``"B"``; ``makespan``: when the last backward ends; ``bubble``: idle fraction of the stages' time,
    ``1 − (busy time of all stages)/(p · makespan)``; ``peak_activations[s]``: the most micro-batches stage ``s``
    had run forward but not yet backward at any moment."""

    schedule: str
    stages: int
    micro_batches: int
    ops: list[list[tuple[str, int, float, float]]] = field(default_factory=list)
    makespan: float = 0.0
    bubble: float = 0.0
    peak_activations: list[int] = field(default_factory=list)


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """``(p − 1)/(m + p − 1)``: the idle fraction of GPipe and 1F1B with equal stage times (GPipe, §2.2)."""
    return (stages - 1) / (micro_batches + stages - 1)


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The order in which stage ``stage`` (0-based) runs its forwards ``("F", i)`` and backwards ``("B", i)``.

    Raises:
        ValueError: an unknown schedule (``"gpipe"`` or ``"1f1b"``).
    """
    m = micro_batches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    warm = min(stages - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]


def simulate_pipeline(stages: int, micro_batches: int, schedule: str = "1f1b", forward_time: float = 1.0,
                      backward_time: float = 2.0) -> PipelineRun:
    """Run ``schedule`` on ``stages`` stages and ``micro_batches`` micro-batches: each operation starts as soon as
    its stage is free and its dependency has finished (forward ``i`` on stage ``s − 1``; backward ``i`` on stage
    ``s + 1``, or this stage's forward ``i`` on the last stage). Communication takes no time.

    Raises:
        ValueError: ``stages`` or ``micro_batches`` < 1, a time ≤ 0, or an unknown schedule.
    """
    if stages < 1 or micro_batches < 1 or forward_time <= 0 or backward_time <= 0:
        raise ValueError(f"need stages, micro_batches ≥ 1 and positive times, got {stages}, {micro_batches}, "
                         f"{forward_time}, {backward_time}")
    orders = [stage_order(schedule, s, stages, micro_batches) for s in range(stages)]
    done: dict[tuple[str, int, int], float] = {}          # (kind, stage, micro-batch) -> end time
    nxt, free = [0] * stages, [0.0] * stages
    run = PipelineRun(schedule, stages, micro_batches, ops=[[] for _ in range(stages)])
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(stages):
            if nxt[s] == len(orders[s]):
                continue
            kind, i = orders[s][nxt[s]]
            dep = ("F", s - 1, i) if kind == "F" else (("B", s + 1, i) if s + 1 < stages else ("F", s, i))
            if kind == "F" and s == 0:
                ready = 0.0
            elif dep in done:
                ready = done[dep]
            else:
                continue
            start = max(free[s], ready)
            end = start + (forward_time if kind == "F" else backward_time)
            done[(kind, s, i)] = free[s] = end
            run.ops[s].append((kind, i, start, end))
            nxt[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule!r} deadlocks")   # cannot happen for the two orders above
    run.makespan = max(free)
    busy = stages * micro_batches * (forward_time + backward_time)
    run.bubble = 1.0 - busy / (stages * run.makespan)
    for s in range(stages):
        held = peak = 0
        for kind, _, _, _ in run.ops[s]:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        run.peak_activations.append(peak)
    return run
