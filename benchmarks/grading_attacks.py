"""Each attack on classmates and on the grader, graded beside two honest students (issue 41).

    .venv/bin/python benchmarks/grading_attacks.py                 # every attack of the suite
    .venv/bin/python benchmarks/grading_attacks.py cpu_hog huge_shapes

For each attack kind of ``grading.attacks.host_cases_for``: a fresh ``$COURSE_DATA`` with
three students, graded by two workers at once: the attack and ``correct`` in one worker,
``slow_honest`` (2 s of CPU before its first answer) in the other, started together, at the
suite's cell timeout (10 s). Prints one row per attack: the attack's score against what its
answers deserve, the two classmates' scores against theirs, the side effects (kernel folders
and cgroups left, the machine's free ``/dev/shm`` inodes at their lowest while grading, a file
written through the Jupyter API), and the grader's peak memory (the resident set of the
nbgrader processes, their kernels apart, sampled every 20 ms) and CPU seconds (the kernels'
and their relays' apart; each notebook's own share is in its judge log). Results also go to
``benchmarks/results/grading_attacks.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from grading import attacks, cgroups, integrity, judge, synthetic, workflow  # noqa: E402

A = "a1_training_state"
HONEST = ["correct", "slow_honest"]
ATTACKS = [k for k in attacks.HOST_ATTACKS if k not in HONEST]  # every attack of the suite


def _leftovers(since: float) -> list[str]:
    """Kernel folders and cgroups whose grading process has ended, made after ``since``."""
    left = []
    for root in (Path("/dev/shm"), *cgroups.CGROUP_ROOTS):
        for p in root.glob(f"{cgroups.CGROUP_PREFIX}*") if root.is_dir() else []:
            try:
                if cgroups.creator_alive(p.name) is False and p.stat().st_mtime >= since:
                    left.append(str(p))
            except OSError:
                pass
    return left


def one(kind: str, memory_gb: float = 2.0) -> dict:
    import psutil

    data = Path(tempfile.mkdtemp(prefix=f"bench-attack-{kind}-"))
    home = Path(tempfile.mkdtemp(prefix="bench-home-"))
    try:
        host = attacks.Host.make(home / "home", A)
        refs = integrity.reference_run(A, data)
        honest = [(c, f) for c, f in synthetic.cases_for(A, refs) if c.kind == "correct"]
        attack = [(c, f) for c, f in attacks.host_cases_for(A, host, data, memory_gb)
                  if c.kind in (kind, "slow_honest")]
        cases = {c.kind: c for c in synthetic.hand_in(honest + attack, data, A)}
        workflow.register(A, data)
        peak, low_inodes, stop = [0], [os.statvfs("/dev/shm").f_ffree], threading.Event()
        cpu: dict[int, float] = {}  # CPU seconds of each grading process, as last sampled

        def sample():
            me = psutil.Process()
            while not stop.is_set():
                rss = 0
                for p in me.children(recursive=True):
                    try:
                        if "autograde" in p.cmdline():
                            rss = max(rss, p.memory_info().rss)
                            t = p.cpu_times()
                            cpu[p.pid] = t.user + t.system
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], rss)
                low_inodes[0] = min(low_inodes[0], os.statvfs("/dev/shm").f_ffree)
                stop.wait(0.02)

        watcher = threading.Thread(target=sample, daemon=True)
        start, inodes_before = time.time(), os.statvfs("/dev/shm").f_ffree
        watcher.start()
        run = workflow.autograde(A, workers=2, data=data, register_first=False, timeout=10,
                                 students=[kind, "slow_honest", "correct"],
                                 extra_args=[f"--SandboxedKernelManager.memory_gb={memory_gb}"])
        stop.set()
        watcher.join()
        results, _ = integrity.report(A, data)
        by = {r.student: r for r in results}
        pwned = list((ROOT / "test-artifacts").glob(f"pwned-{attacks.SCRIPT_MARKER}*"))
        row = {"attack": kind, "score": by[kind].score, "deserved": cases[kind].deserved,
               "classmates": {s: by[s].score for s in HONEST},
               "classmates_deserve": {s: cases[s].deserved for s in HONEST},
               "limits": by[kind].limits, "left_behind": _leftovers(start),
               "shm_inodes_taken_at_most": inodes_before - low_inodes[0],
               "file_written_by_script": [str(p) for p in pwned],
               "grader_peak_rss_mb": round(peak[0] / 1e6), "seconds": round(run.seconds, 1),
               "grader_cpu_s": round(sum(cpu.values()), 1),
               "grader_cost": {s: getattr(judge, "read_grader_cost", lambda _: {})(
                   judge.log_path(data, A, s, A)) for s in (kind, *HONEST)
                   if by[s].status == "graded"}}
        def score(s):
            return f"{by[s].score:g}" if by[s].score is not None else by[s].status

        print(f"{kind:15s} score {score(kind)}/{cases[kind].deserved:g}  classmates "
              + ", ".join(f"{s} {score(s)}/{cases[s].deserved:g}" for s in HONEST)
              + f"  left {len(row['left_behind'])}  /dev/shm inodes -{row['shm_inodes_taken_at_most']}"
              f"  grader {row['grader_peak_rss_mb']} MB, {row['grader_cpu_s']:g} CPU-s "
              f"({row['grader_cost'].get(kind, {}).get('cpu_s', float('nan')):g} for it)"
              f"  {run.seconds:.0f} s"
              + (f"  said: {by[kind].limits[0][:60]!r}" if by[kind].limits else ""), flush=True)
        return row
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attacks", nargs="*", default=ATTACKS)
    args = parser.parse_args()
    rows = [one(kind) for kind in args.attacks]
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "grading_attacks.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
