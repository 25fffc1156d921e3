"""How long each lecture widget takes to redraw after a control moves (issue 28: under 200 ms).

Builds every widget of ``course_utils.widgets`` at its lecture setting, then moves each of its
controls through a few values, several rounds, and reads ``redraw_s`` (the whole redraw in the
kernel: the tested function, the numbers, the figure rendered to PNG) after every move. Prints
the median and the worst redraw per widget, in wall-clock time and in this process's CPU time
(what the redraw itself costs, whatever else the machine runs), the first draw (construction)
apart, and the machine's load average: a shared 2-core machine slows everything it runs.

Run: .venv/bin/python benchmarks/widget_redraw.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# the sharding widget imports JAX with 8 CPU devices: before anything else imports JAX
from course_utils.widgets import sharding  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")

from course_utils import style  # noqa: E402
from course_utils.widgets import (activation_memory, number_formats,  # noqa: E402
                                  pipeline_timeline, ring_steps, step_time, tp_layout,
                                  training_state, zero_shards)

# widget class, the lecture's setting, and the moves: (control, values it takes in turn)
CASES = {
    "training_state (module 1)": (training_state.TrainingState, {}, [
        ("params_b", [13.0, 70.0, 405.0, 7.0]),
        ("layout", ["fp32_adam", "bf16_adam_no_master", "mixed_adam16"])]),
    "ring_steps (module 2)": (ring_steps.RingSteps, {}, [
        ("step", [1, 3, 6, 0]), ("ranks", [8, 3, 4]),
        ("collective", ["reduce_scatter", "all_gather", "all_to_all", "all_reduce"])]),
    "zero_shards (module 3)": (zero_shards.ZeroShards, {}, [
        ("ranks", [16, 64, 8]), ("stage", [3, 0, 1, 2]), ("params_b", [70.0, 7.0])]),
    "tp_layout (module 4)": (tp_layout.TPLayout, {}, [
        ("tp", [2, 4, 8]), ("layer", ["column", "row", "attention", "mlp"]),
        ("dtype", ["fp32", "bf16"]), ("s", [2048, 4096])]),
    "pipeline_timeline (module 5)": (pipeline_timeline.PipelineTimeline, {}, [
        ("microbatches", [16, 32, 8]), ("stages", [8, 2, 4]), ("schedule", ["gpipe", "1f1b"]),
        ("slow_stage", [2, -1]), ("op_times", ["1:1:1", "1:0.5:0.5"]),
        ("schedule", ["zb-h1", "zbv", "dualpipev", "1f1b"]), ("stages", [8, 4]),
        ("microbatches", [32, 8])]),
    "sharding (module 8)": (sharding.Sharding, {}, [
        ("x", ["P(None, 'model')", "P('model', None)", "P('data', None)"]),
        ("w", ["P('model', None)", "P('data', 'model')", "P(None, 'model')"]),
        ("y", ["P()", "P(None, 'model')", sharding.AUTO]), ("mesh", ["4 x 2", "1 x 8", "2 x 4"])]),
    "number_formats (module 9)": (number_formats.NumberFormats, {}, [
        ("value", [0.02, 448.0, 1.0]), ("update", [1e-5, 0.004, 1e-3])]),
    "activation_memory (module 9)": (activation_memory.ActivationMemory, {}, [
        ("seq_len", [8192, 32768, 4096]), ("recompute", ["attention", "full", "none"]),
        ("tp", [8, 1]), ("model", ["70B", "7B"]), ("attention", ["math", "fused"])]),
    "step_time (module 13)": (step_time.StepTime, {}, [
        ("efficiency", [0.5, 1.0, 0.8]), ("schedule", ["1f1b", "zbv", "interleaved v=2"]),
        ("pp", [8, 4, 1, 16]), ("global_batch", [4096, 2048]), ("dp", [64, 128]),
        ("model", ["70B", "8B", "405B"]), ("hardware", ["A100", "H100"]),
        ("recompute", ["full", "none"]), ("schedule", ["interleaved v=4"])]),
}


def _full_collections() -> list[float]:
    """Record, from now on, how long each of Python's full (generation 2) garbage collections
    takes: they scan every object of the process (torch, JAX, matplotlib), and one that falls
    inside a redraw is most of a worst case."""
    import gc

    took: list[float] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            watch.start = time.perf_counter()
        elif info["generation"] == 2:
            took.append(time.perf_counter() - watch.start)

    gc.callbacks.append(watch)
    return took


def measure(rounds: int, only: str = "") -> dict[str, dict]:
    """Per widget (those whose name has ``only`` in it): the first draw and every redraw, in
    seconds."""
    out = {}
    for name, (cls, values, moves) in CASES.items():
        if only not in name:
            continue
        start = time.perf_counter()
        widget = cls(**values)
        first = time.perf_counter() - start
        times, cpu = [], []
        for _ in range(rounds):
            for control, targets in moves:
                for value in targets:
                    start = time.process_time()
                    widget.controls[control].value = value
                    cpu.append(time.process_time() - start)
                    times.append(widget.redraw_s)
        out[name] = {"first": first, "redraws": times, "cpu": cpu}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="passes over every move")
    parser.add_argument("--only", default="", help="only the widgets whose name has this in it")
    args = parser.parse_args(argv)
    style.use()
    load = os.getloadavg()[0]
    collections = _full_collections()
    results = measure(args.rounds, args.only)
    print(f"{'':<30}{'first':>7}{'':>8}{'wall clock':>18}{'CPU time':>18}")
    print(f"{'widget':<30}{'draw':>7}{'redraws':>8}{'median':>9}{'worst':>9}{'median':>9}"
          f"{'worst':>9}  (ms)")
    for name, r in results.items():
        t, c = [x * 1e3 for x in r["redraws"]], [x * 1e3 for x in r["cpu"]]
        print(f"{name:<30}{r['first'] * 1e3:>7.0f}{len(t):>8}{statistics.median(t):>9.0f}"
              f"{max(t):>9.0f}{statistics.median(c):>9.0f}{max(c):>9.0f}")
    print(f"load average (1 min) before: {load:.2f}, after: {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs")
    print(f"full garbage collections meanwhile: {len(collections)}, "
          + ", ".join(f"{t * 1e3:.0f}" for t in collections) + " ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
