"""``course_utils.jax_sharding.framework_compare``: every public function refuses a bad argument, naming it,
before any work (no ranks launched, no JAX process started)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from course_utils.jax_sharding import framework_compare as fc

_RESULT_KEYS = ("workload", "torch", "jax", "loss_rel_diff", "machine")

CASES = [
    ("Workload seed", lambda: fc.Workload(seed=-1), ValueError, "seed must be an int >= 0"),
    ("Workload seed type", lambda: fc.Workload(seed=1.5), ValueError, "seed must be"),
    ("Workload lr", lambda: fc.Workload(lr=float("inf")), ValueError, "lr must be a finite"),
    ("Workload lr sign", lambda: fc.Workload(lr=-0.1), ValueError, "lr must be a positive"),
    ("Workload sizes", lambda: fc.Workload(sizes=(64,)), ValueError, "sizes must be"),
    ("Workload steps", lambda: fc.Workload(steps=0), ValueError, "steps must be"),
    ("Workload threads", lambda: fc.Workload(threads_per_worker=0), ValueError,
     "threads_per_worker must be"),
    ("init_params", lambda: fc.init_params({"sizes": (4, 4)}), TypeError, "w must be a Workload"),
    ("batches", lambda: fc.batches(None), TypeError, "w must be a Workload"),
    ("dp_rank_worker rank", lambda: fc.dp_rank_worker(2, 2, {}), ValueError,
     "rank must be an int from 0 to world_size - 1 = 1"),
    ("dp_rank_worker world_size", lambda: fc.dp_rank_worker(0, 0, {}), ValueError,
     "world_size must be"),
    ("dp_rank_worker workload", lambda: fc.dp_rank_worker(0, 2, fc.Workload()), TypeError,
     "workload must be a dict"),
    ("run_torch w", lambda: fc.run_torch("workload"), TypeError, "w must be a Workload"),
    ("run_torch timeout", lambda: fc.run_torch(fc.Workload(), timeout_s=0), ValueError,
     "timeout_s must be"),
    ("run_jax w", lambda: fc.run_jax(3), TypeError, "w must be a Workload"),
    ("run_jax timeout", lambda: fc.run_jax(fc.Workload(), timeout_s=-1.0), ValueError,
     "timeout_s must be"),
    ("compare w", lambda: fc.compare("default"), TypeError, "w must be a Workload"),
    ("compare timeout", lambda: fc.compare(fc.Workload(), timeout_s=float("nan")), ValueError,
     "timeout_s must be"),
    ("table keys", lambda: fc.table({"torch": {}}), ValueError, "result must be compare"),
    ("table type", lambda: fc.table([]), ValueError, "result must be compare"),
    ("table workload", lambda: fc.table(dict.fromkeys(_RESULT_KEYS)), TypeError,
     "w must be a Workload"),
]


@pytest.mark.parametrize("fn, error, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_arguments_are_named(fn, error, match):
    with pytest.raises(error, match=match):
        fn()


def test_every_public_function_is_swept():
    swept = {c[0].split()[0] for c in CASES}
    public = {name for name in fc.__all__ if inspect.isfunction(getattr(fc, name))
              or inspect.isclass(getattr(fc, name))}
    assert public - swept == {"machine"}  # (no arguments)
    assert inspect.signature(fc.machine).parameters == {}


def test_a_good_workload_still_builds_its_inputs():
    w = fc.Workload(sizes=(4, 8, 2), global_batch=8, steps=3, warmup=1, workers=2)
    params = fc.init_params(w)
    assert [p.shape for p in params] == [(4, 8), (8,), (8, 2), (2,)]
    x, y = fc.batches(w)
    assert x.shape == (3, 8, 4) and y.shape == (3, 8, 2)
    assert fc.Workload(**dataclasses.asdict(w)) == w
