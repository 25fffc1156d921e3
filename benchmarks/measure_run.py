"""The figures Module 7 reports: a data-parallel TinyLM run measured on real gloo ranks.

    .venv/bin/python benchmarks/measure_run.py                 # 2 ranks, 12 steps, 3 repeats
    .venv/bin/python benchmarks/measure_run.py --steps 20 --repeats 5 --delay 0.1

For each repeat: a balanced run and a run whose rank 1 sleeps ``--delay`` seconds in its forward
pass. Prints per rank the mean step time, tokens/s, time inside the gradient all-reduce and its
share of the step, then the medians over repeats, the bytes sent per all-reduce against the
ring prediction 2(D-1)/D x bytes, and persistent and peak memory against the fp32 Adam layout.
Timings on a shared machine vary about 2x between runs: read the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course_utils import launch, measure  # noqa: E402
from course_utils.memory import sizing as memory  # noqa: E402
from course_utils.models import tiny_lm  # noqa: E402

COLUMNS = ["rank", "forward_ms", "backward_ms", "wait_ms", "idle_ms", "step_ms", "tokens_per_s",
           "global_tokens_per_s", "wait_fraction"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.1, help="straggler delay, seconds")
    args = parser.parse_args()
    ws = args.world_size
    spec = measure.RunSpec(steps=args.steps, global_batch=8 * ws)
    n = tiny_lm.count_params(tiny_lm.build(spec.cfg))
    medians: dict[str, list[list[dict]]] = {"balanced": [], "straggler": []}
    for rep in range(args.repeats):
        for label, s in (("balanced", replace(spec, track_memory=(rep == 0))),
                         ("straggler", replace(spec, straggler_rank=ws - 1,
                                               straggler_delay_s=args.delay))):
            t0 = time.perf_counter()
            res = launch.run(measure.dp_train, ws, s, timeout_s=300, threads_per_rank=1,
                             show_output=False)
            rows = measure.summarize(res)
            medians[label].append(rows)
            print(f"\n# repeat {rep + 1}/{args.repeats}, {label} "
                  f"({time.perf_counter() - t0:.1f} s wall)")
            print(measure.format_table(rows, COLUMNS))
            if label == "balanced" and rep == 0:
                first = res
    for label, runs in medians.items():
        med = [{c: statistics.median(run[r][c] for run in runs) for c in COLUMNS}
               for r in range(ws)]
        for row in med:
            row["rank"] = int(row["rank"])
        print(f"\n## median over {args.repeats} repeats: {label}")
        print(measure.format_table(med, COLUMNS))
    grad_bytes = 4 * n
    sent = first[0]["steps"][-1]["bytes_sent"]
    pred = measure.predicted_allreduce_bytes(grad_bytes, ws)
    print(f"\nall-reduce of {grad_bytes:,} B gradients at D={ws}: sent {sent:,.0f} B per rank, "
          f"predicted {pred:,.0f} B, ratio {sent / pred:.4f}")
    state = first[0]["state_bytes"]
    print(f"persistent state: counted {state['total']:,} B, predicted (fp32_adam) "
          f"{memory.state_bytes(n, 'fp32_adam'):,.0f} B")
    peak = first[0]["peak_bytes"]
    print(f"peak (MemTracker, last step): {peak['total']:,} B = "
          f"{peak['total'] / state['total']:.2f} x persistent; activations {peak['activation']:,} B")


if __name__ == "__main__":
    main()
