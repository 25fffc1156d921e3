"""Throughput of the two autograde executors, and the Slurm job timings, on this machine.

    .venv/bin/python benchmarks/grading_executors.py                 # 24 submissions of a1
    .venv/bin/python benchmarks/grading_executors.py --n 48 --workers 2

Grades the same synthetic class twice, into two fresh course data folders sharing one secret
(so the same hidden cases): with the local executor (``--workers`` nbgrader processes) and with
the Slurm executor (one array task per submission, then the merge). The class is the 24 kinds
``tests/test_slurm.py`` grades (right, wrong, unit and typical mistakes, cheats, attacks,
unreadable notebooks, copied answers), repeated with new names up to ``--n``. Uses the Slurm that
``SLURM_CONF`` names, or starts a one-node Slurm with ``scripts/slurm_local.sh`` (this machine's
CPUs, so as many tasks at once as the local executor has workers by default) and stops it after.

Prints and writes to ``benchmarks/results/grading_executors.json``: each executor's seconds per
submission and submissions per second; for Slurm, sbatch's answer time, the wait for the first
task, each task's wall time (and within it the notebook's own run-and-judge seconds: the rest is
the per-task start-up: Python, nbgrader, the kernel), the array's wall time, the merge's and the
report's; a ``scripts/cluster.sbatch`` demo job from sbatch to its end; that both executors gave
the same results; and the class report of the Slurm-graded class.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from grading import integrity, judge, slurm, slurm_executor, synthetic, workflow  # noqa: E402

A = "a1_training_state"
KINDS = synthetic.EXECUTOR_CLASS


def build_class(data: Path, refs: dict, n: int) -> list[str]:
    """``n`` submissions: the kinds in turn, each cycle its own names (``c1_correct``, ...)."""
    students: list[str] = []
    cycle = 0
    while len(students) < n:
        prefix = f"c{cycle}_"
        chosen = [(c, f) for c, f in synthetic.cases_for(A, refs, prefix) if c.kind in KINDS]
        chosen = chosen[:n - len(students)]
        students += [c.student for c in synthetic.write(chosen, data / "submitted", A, prefix)]
        cycle += 1
    return students


def same_results(a: Path, b: Path) -> bool:
    """Whether both course data folders' reports say the same of every student."""
    def said(data):
        results, _ = integrity.report(A, data)
        return {r.student: (r.status, r.score, [(c.grade_id, c.score, c.message) for c in r.cells],
                            sorted(r.flags)) for r in results}
    return said(a) == said(b)


def demo_job(folder: Path) -> dict:
    """``sbatch --nodes 1 scripts/cluster.sbatch course_utils.mesh.grid`` with 2 ranks."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, NPROC_PER_NODE="2", RDZV_PORT=str(port), OMP_NUM_THREADS="1")
    start = time.perf_counter()
    job = slurm.sbatch(["--nodes=1", "--time=5", f"--output={folder}/demo-%j.out",
                        str(ROOT / "scripts" / "cluster.sbatch"), "course_utils.mesh.grid"],
                       env=env, cwd=ROOT)
    [st] = slurm.wait(job, timeout_s=600, poll_s=0.2).values()
    took = time.perf_counter() - start
    print(f"cluster.sbatch course_utils.mesh.grid (1 node x 2 ranks): {st.state} in {took:.1f} s "
          f"from sbatch to its end (Slurm's run time {st.run_time})", flush=True)
    return {"state": st.state, "seconds": round(took, 1), "run_time": st.run_time}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=24, help="submissions (default 24)")
    parser.add_argument("--workers", type=int, default=2,
                        help="the local executor's workers (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the course data folders")
    args = parser.parse_args()
    if args.n < 1 or args.workers < 1:
        parser.error("--n and --workers must be >= 1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-executors-"))
    cluster = None
    try:
        if slurm.unavailable() is not None:
            cluster = tmp / "slurm"
            out = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "start",
                                  str(cluster)], capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                sys.exit(f"no Slurm here and none could be started: {out.stderr.strip()}")
            os.environ["SLURM_CONF"] = str(cluster / "slurm.conf")
        cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True,
                              timeout=60).stdout.split()
        load0 = os.getloadavg()[0]
        print(f"executors benchmark: {args.n} submissions of {A}, local with {args.workers} "
              f"worker(s), Slurm node of {cpus[0] if cpus else '?'} CPUs; {os.cpu_count()} "
              f"CPUs here, load average {load0:.1f}", flush=True)
        local, remote = tmp / "local", tmp / "slurm-data"
        cache = tmp / "reference"
        t = time.perf_counter()
        refs = integrity.reference_run(A, remote, cache=cache)
        t_ref = time.perf_counter() - t
        students = build_class(remote, refs, args.n)
        build_class(local, refs, args.n)
        judge.course_secret(remote)
        shutil.copy(remote / judge.SECRET_FILE, local / judge.SECRET_FILE)
        workflow.register(A, local)
        workflow.register(A, remote)

        t = time.perf_counter()
        run = workflow.autograde(A, workers=args.workers, data=local, register_first=False,
                                 reference_cache=cache)
        t_local = time.perf_counter() - t
        print(f"local: {len(students)} submissions in {t_local:.1f} s = "
              f"{t_local / len(students):.2f} s/submission = {len(students) / t_local:.3f} "
              f"submissions/s", flush=True)

        t = time.perf_counter()
        sub = slurm_executor.submit(A, remote, register_first=False, reference_cache=cache)
        t_submit = time.perf_counter() - t
        t = time.perf_counter()
        slurm.wait(sub.job, timeout_s=slurm_executor.default_wait_s(len(students), 20), poll_s=0.5)
        t_wait = time.perf_counter() - t
        results = [json.loads((sub.run_dir / "tasks" / str(i) / "result.json").read_text())
                   for i in range(len(sub.students))]
        t = time.perf_counter()
        merged = slurm_executor.merge(A, remote)
        t_merge = time.perf_counter() - t
        t = time.perf_counter()
        integrity.report(A, remote)
        t_report = time.perf_counter() - t
        t_slurm = t_submit + t_wait + t_merge
        submitted_at = json.loads((sub.run_dir / "run.json").read_text())["submitted_at"]
        first_start = min(r["started"] for r in results) - submitted_at
        walls = [r["seconds"] for r in results]
        graded_s = {r.student: r.seconds for r in integrity.verify_assignment(A, remote)
                    if r.seconds is not None}
        inner = [graded_s[s] for s in sub.students if s in graded_s]
        print(f"slurm: sbatch answered in {t_submit:.2f} s (registration and reference done "
              f"before); first task started {first_start:.1f} s after; array of "
              f"{len(students)} ended {t_wait:.1f} s after submission; merge {t_merge:.1f} s; "
              f"report {t_report:.1f} s", flush=True)
        print(f"slurm: {len(students)} submissions in {t_slurm:.1f} s = "
              f"{t_slurm / len(students):.2f} s/submission = {len(students) / t_slurm:.3f} "
              f"submissions/s; each task {statistics.mean(walls):.1f} s on average (median "
              f"{statistics.median(walls):.1f}, max {max(walls):.1f}), of which running and "
              f"judging the notebook {statistics.mean(inner):.1f} s", flush=True)
        same = same_results(local, remote)
        print(f"same results from both executors: {same}", flush=True)
        demo = demo_job(tmp)
        load1 = os.getloadavg()[0]
        text = (remote / "reports" / f"{A}.txt").read_text()
        summary = text[text.index("CLASS SUMMARY"):text.index("EVERY STUDENT")]
        print("\n" + summary)
        out = {"assignment": A, "submissions": len(students), "cpus": os.cpu_count(),
               "slurm_node_cpus": cpus[0] if cpus else None,
               "load_average": [round(load0, 2), round(load1, 2)],
               "reference_s": round(t_ref, 1),
               "local": {"workers": args.workers, "seconds": round(t_local, 1),
                         "per_submission_s": round(t_local / len(students), 2),
                         "submissions_per_s": round(len(students) / t_local, 3),
                         "returncodes": run.returncodes},
               "slurm": {"sbatch_s": round(t_submit, 2),
                         "first_task_after_s": round(first_start, 1),
                         "array_s": round(t_wait, 1), "merge_s": round(t_merge, 2),
                         "report_s": round(t_report, 1), "seconds": round(t_slurm, 1),
                         "per_submission_s": round(t_slurm / len(students), 2),
                         "submissions_per_s": round(len(students) / t_slurm, 3),
                         "task_wall_s": {"mean": round(statistics.mean(walls), 2),
                                         "median": round(statistics.median(walls), 2),
                                         "max": round(max(walls), 2)},
                         "notebook_s_mean": round(statistics.mean(inner), 2),
                         "finished": len(merged.finished)},
               "same_results": same, "demo_job": demo, "class_summary": summary}
        folder = ROOT / "benchmarks" / "results"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "grading_executors.json").write_text(json.dumps(out, indent=1))
        if args.keep:
            print(f"course data kept in {tmp}")
    finally:
        if cluster is not None:
            subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "stop",
                            str(cluster)], capture_output=True, timeout=120)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
