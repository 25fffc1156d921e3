"""Module 11's figures: how long a simulated job takes on this machine and how much memory.

Each configuration runs in a fresh process (peak RSS is per process): the 405B model on 1,024
ranks (TP 8 x PP 16 x DP 8) and on Llama 3's 16,384 (TP 8 x PP 16 x DP 128), and the 70B
lesson mesh, with the per-rank bytes and, for rank 0, one step's traced collectives.

Run: .venv/bin/python benchmarks/scale_sim.py
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json, time, warnings
warnings.filterwarnings("ignore")
t0 = time.perf_counter()
from course_utils.scale import comms as scale_comms
from course_utils.scale import memory as scale_memory
from course_utils.scale import tables as scale_tables
t1 = time.perf_counter()
model, tp, pp, dp = {cfg!r}
job = scale_memory.job_table(model, tp, pp, dp)
t2 = time.perf_counter()
trace = scale_comms.trace_step(model, tp, pp, dp, 0)
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "memory_s": t2 - t1, "trace_s": t3 - t2,
                  "ranks_built": len(job["ranks"]), "min_gb": job["min"] / 1e9,
                  "max_gb": job["max"] / 1e9, "rss_mb": scale_tables.rss_mb()}}))
"""


def main() -> None:
    for cfg in (("405B", 8, 16, 8), ("405B", 8, 16, 128), ("70B", 4, 2, 4)):
        out = subprocess.run([sys.executable, "-c", CHILD.format(cfg=cfg)], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        ranks = cfg[1] * cfg[2] * cfg[3]
        print(f"{cfg[0]} TP {cfg[1]} x PP {cfg[2]} x DP {cfg[3]} ({ranks:,} ranks): "
              f"per-rank state {r['min_gb']:.2f}-{r['max_gb']:.2f} GB from {r['ranks_built']} "
              f"ranks in {r['memory_s']:.1f} s; rank 0's step traced in {r['trace_s']:.1f} s; "
              f"import {r['import_s']:.1f} s; peak RSS {r['rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
