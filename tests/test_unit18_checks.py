"""Unit 18 checks: the reference passes, a stub is "not attempted", every catalogued mistake is named, and a
learner's code runs its ranks inside the isolated worker (a hang is reported with the rank and the collective).

The namespaces below stand for a learner's notebook (functions defined outside ``llmcourse``, delegating to the
library); the bug catalog's mutants replace one of them each.
"""

from __future__ import annotations

import sys
import time

import pytest

from grader import runner
from grader.core import BUGS, CHECKS
from grader.runner import load_unit, run_check

EXERCISES = ["18.ring_all_reduce", "18.attach_data_parallel", "18.ShardedAdamW", "18.row_parallel_linear",
             "18.tp_swiglu", "18.expert_parallel_moe"]


def ring_all_reduce(tensor):
    from llmcourse.parallel import ring_all_reduce as lib

    return lib(tensor)


def attach_data_parallel(module, seed):
    from llmcourse.parallel import attach_data_parallel as lib

    return lib(module, seed)


def row_parallel_linear(x, linear, rank, world_size):
    from llmcourse.parallel import row_parallel_linear as lib

    return lib(x, linear, rank, world_size)


def tp_swiglu(x, ff, rank, world_size):
    from llmcourse.parallel import tp_swiglu as lib

    return lib(x, ff, rank, world_size)


def expert_parallel_moe(x, moe, rank, world_size):
    from llmcourse.parallel import expert_parallel_moe as lib

    return lib(x, moe, rank, world_size)


def _sharded_adamw():
    from llmcourse.parallel import ZeRO1AdamW

    class ShardedAdamW(ZeRO1AdamW):
        pass

    ShardedAdamW.__module__ = __name__
    return ShardedAdamW


def _namespace():
    return {"ring_all_reduce": ring_all_reduce, "attach_data_parallel": attach_data_parallel,
            "ShardedAdamW": _sharded_adamw(), "row_parallel_linear": row_parallel_linear,
            "tp_swiglu": tp_swiglu, "expert_parallel_moe": expert_parallel_moe}


def _stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("exercise_id", EXERCISES)
def test_reference_passes_and_stub_is_not_attempted(exercise_id):
    v = run_check(exercise_id, namespace=_namespace())
    assert v.status == "passed", v.render()
    name = {"18.ring_all_reduce": "ring_all_reduce", "18.attach_data_parallel": "attach_data_parallel",
            "18.ShardedAdamW": "ShardedAdamW", "18.row_parallel_linear": "row_parallel_linear",
            "18.tp_swiglu": "tp_swiglu", "18.expert_parallel_moe": "expert_parallel_moe"}[exercise_id]
    v = run_check(exercise_id, namespace={**_namespace(), name: _stub})
    assert v.status == "not_attempted", v.render()


CATALOG = {"B18.sum_not_mean": "18.attach_data_parallel", "B18.reduce_before_backward": "18.attach_data_parallel",
           "B18.unsynced_init": "18.attach_data_parallel", "B18.same_dropout_seed": "18.attach_data_parallel",
           "B18.zero_sum_not_mean": "18.ShardedAdamW", "B18.bias_every_rank": "18.row_parallel_linear",
           "B18.a2a_split_sizes": "18.expert_parallel_moe",
           # issue 40: the shortcuts that skip each exercise's idea
           "B18.ring_whole_tensor": "18.ring_all_reduce", "B18.ring_not_neighbours": "18.ring_all_reduce",
           "B18.seed_ignored": "18.attach_data_parallel", "B18.grads_averaged_twice": "18.attach_data_parallel",
           "B18.zero_full_state": "18.ShardedAdamW", "B18.zero_all_reduce": "18.ShardedAdamW",
           "B18.row_full_product": "18.row_parallel_linear", "B18.ep_no_all_to_all": "18.expert_parallel_moe",
           # issue 40 item 2: the tensor-parallel block, forward and backward
           "B18.tp_dx_partial": "18.tp_swiglu", "B18.tp_input_reduced_forward": "18.tp_swiglu",
           "B18.tp_dx_averaged": "18.tp_swiglu", "B18.tp_output_reduced_backward": "18.tp_swiglu",
           "B18.tp_gather_weights": "18.tp_swiglu", "B18.tp_dx_summed_per_layer": "18.tp_swiglu"}


@pytest.fixture(autouse=True, scope="module")
def _unit18_registry():
    """Load unit 18's checks for these tests only, and leave the grader's registries as they were: while the unit
    is not available, other tests iterate the registered bugs, checks and siblings of the available units only."""
    before = {k for k in CHECKS if k.startswith("18.")}
    load_unit("18")
    yield
    if not before:
        for registry in (CHECKS, BUGS, runner.ALSO_BLOCKED):
            for key in [k for k in registry if k.startswith("18.")]:
                del registry[key]
        for name in [m for m in sys.modules if m.startswith(("grader.checks.u18_", "grader.bugs.u18_"))]:
            del sys.modules[name]


@pytest.mark.parametrize("bug_id", sorted(CATALOG))
def test_every_mutant_fails_and_is_named(bug_id):
    exercise_id = CATALOG[bug_id]
    bug = next(b for b in BUGS[exercise_id] if b.id == bug_id)
    v = run_check(exercise_id, namespace={**_namespace(), **bug.impl})
    assert v.status == "failed", v.render()
    assert v.bug_id == bug.id, v.render()
    assert bug.hint in v.render()


def test_the_catalog_is_the_classic_mistakes():
    assert {(ex, b.id) for ex in EXERCISES for b in BUGS.get(ex, [])} == {(ex, b) for b, ex in CATALOG.items()}


ROW_OK = '''
import torch
import torch.distributed as dist
import torch.nn.functional as F

def row_parallel_linear(x, linear, rank, world_size):
    n = linear.in_features // world_size
    cols = slice(rank * n, (rank + 1) * n)
    y = F.linear(x[..., cols], linear.weight[:, cols])
    dist.all_reduce(y)
    return y + linear.bias
'''

ROW_HANGS = '''
import time
import torch
import torch.distributed as dist
import torch.nn.functional as F

def row_parallel_linear(x, linear, rank, world_size):
    n = linear.in_features // world_size
    cols = slice(rank * n, (rank + 1) * n)
    y = F.linear(x[..., cols], linear.weight[:, cols])
    if rank == 1:
        time.sleep(60)
    dist.all_reduce(y)
    return y + linear.bias
'''


def test_ranks_run_inside_the_isolated_worker():
    v = run_check("18.row_parallel_linear", [ROW_OK])
    assert v.status == "passed", v.render()


def test_a_hanging_rank_is_reported_with_its_rank_and_call():
    start = time.monotonic()
    v = run_check("18.row_parallel_linear", [ROW_HANGS])
    assert time.monotonic() - start < 29
    assert v.status == "failed"
    assert "rank 0 did not finish" in v.message and "all_reduce(float32 (2, 3, 5))" in v.message, v.message
