"""A measured data-parallel run as a torchrun demo (lecture 7).

Each rank trains a few steps of TinyLM and reports its mean step time and its time inside the
gradient all-reduce.

:func:`demo` is the worker; ``python -m course_utils.measure`` runs this module. Under torchrun
(the same worker on real launchers)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.measure.run
"""

from __future__ import annotations

from dataclasses import replace

from course_utils.measure.spec import RunSpec
from course_utils.measure.step import dp_train

__all__ = ["demo"]


def demo(rank: int, world_size: int, steps: int = 8) -> dict[str, float]:
    """torchrun entry: train ``steps`` steps and return this rank's mean step time and wait (ms)."""
    spec = replace(RunSpec(), steps=steps, log_every=max(1, steps // 4))
    out = dp_train(rank, world_size, spec)
    n = len(out["steps"]) - spec.warmup_steps
    return {"step_ms": round(1e3 * sum(s["step_s"] for s in out["steps"][1:]) / n, 2),
            "wait_ms": round(1e3 * sum(s["wait"] for s in out["steps"][1:]) / n, 2)}


if __name__ == "__main__":
    from course_utils.launch import torchrun_main

    torchrun_main(demo)
