"""How long grading takes: N synthetic submissions per assignment, autograded in parallel.

    .venv/bin/python benchmarks/grading.py                      # every assignment, 50 each
    .venv/bin/python benchmarks/grading.py --n 10 a1_training_state --workers 1 2 4
    .venv/bin/python benchmarks/grading.py --memory              # the grader's memory

For each assignment: a fresh temporary $COURSE_DATA, the reference run (cached, timed apart),
N submissions cycling through correct / wrong / unanswered answers, one parallel autograde per
``--workers`` value (the gradebook registration is timed apart: it is done once per
assignment), then the outside-the-kernel verification and report. Prints per-assignment
seconds per submission, whether the notebook imports torch, and the whole course's grading
time; checks every autograde log for sqlite "database is locked" errors. The goal: at most
1.5 s per submission on 2 cores for a notebook that imports torch. Results also go to
``benchmarks/results/grading.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from grading import integrity, synthetic, workflow  # noqa: E402

MIX = ("correct", "wrong", "unanswered")


def imports_torch(assignment: str) -> bool:
    """Whether the assignment's notebook imports torch (the expensive part of a kernel)."""
    text = "".join((ROOT / "solutions" / assignment / n).read_text()
                   for n in integrity.notebook_names(assignment))
    return "import torch" in text or "from torch" in text


def bench(assignment: str, n: int, workers_list: list[int]) -> dict:
    data = Path(tempfile.mkdtemp(prefix=f"bench-{assignment}-"))
    try:
        t = time.perf_counter()
        refs = integrity.reference_run(assignment, data)
        t_ref = time.perf_counter() - t
        for i, kind in enumerate(MIX):
            synthetic.clone(assignment, data / "submitted", kind, (n + len(MIX) - 1 - i) // len(MIX),
                            refs, prefix=f"{kind[0]}")
        students = workflow.submitted_students(assignment, data)
        t = time.perf_counter()
        workflow.register(assignment, data)
        t_reg = time.perf_counter() - t
        runs = {}
        for w in workers_list:
            run = workflow.autograde(assignment, workers=w, data=data, register_first=False)
            locked = sum(log.read_text().count("database is locked") for log in run.logs)
            t = time.perf_counter()
            results, _ = integrity.report(assignment, data)
            t_rep = time.perf_counter() - t
            graded = sum(r.graded for r in results)
            runs[w] = {"autograde_s": round(run.seconds, 1),
                       "per_submission_s": round(run.seconds / len(students), 2),
                       "report_s": round(t_rep, 1), "graded": graded,
                       "returncodes": run.returncodes, "db_locked_errors": locked}
            print(f"  {assignment}: {len(students)} submissions, {w} worker(s): "
                  f"{run.seconds:.1f} s = {run.seconds / len(students):.2f} s/submission; "
                  f"report {t_rep:.1f} s; graded {graded}/{len(students)}; "
                  f"'database is locked' x{locked}", flush=True)
        return {"assignment": assignment, "submissions": len(students),
                "imports_torch": imports_torch(assignment), "reference_s": round(t_ref, 1),
                "register_s": round(t_reg, 1), "runs": runs}
    finally:
        shutil.rmtree(data, ignore_errors=True)


def grader_memory(prints: int = 6, mb: int = 400) -> dict:
    """The grader's own peak memory while one submission prints ``prints`` x ``mb`` MB: the
    resident set of the nbgrader process (its kernels are other processes), sampled every
    20 ms. Before outputs were capped as they arrive it held every byte until the notebook
    ended (3.1 GiB for 6 x 400 MB)."""
    import threading

    import nbformat
    import psutil

    a = "a1_training_state"
    data = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    try:
        refs = integrity.reference_run(a, data)
        [(case, files)] = [(c, f) for c, f in synthetic.cases_for(a, refs) if c.kind == "correct"]
        nb = files[f"{a}.ipynb"]
        nb.cells.append(nbformat.v4.new_code_cell(
            f"for _ in range({prints}):\n    print('x' * {mb} * 10**6)"))
        synthetic.write([(case, files)], data / "submitted", a)
        workflow.register(a, data)
        peak, stop = [0], threading.Event()

        def sample():  # this process's own nbgrader worker, not its kernels
            me = psutil.Process()
            while not stop.is_set():
                for p in me.children():
                    try:
                        if "autograde" in p.cmdline():
                            peak[0] = max(peak[0], p.memory_info().rss)
                    except psutil.Error:
                        pass
                stop.wait(0.02)

        watcher = threading.Thread(target=sample, daemon=True)
        watcher.start()
        run = workflow.autograde(a, workers=1, data=data, register_first=False)
        stop.set()
        watcher.join()
        [result], _ = integrity.report(a, data)
        out = {"prints": prints, "mb_each": mb, "grader_peak_rss_mb": round(peak[0] / 1e6),
               "seconds": round(run.seconds, 1), "score": result.score,
               "limits": result.limits}
        print(f"one submission printing {prints} x {mb} MB: the nbgrader process peaked at "
              f"{peak[0] / 1e6:.0f} MB resident; graded {result.score:g}/{result.max_score:g} "
              f"in {run.seconds:.1f} s; limits: {result.limits}")
        return out
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("assignments", nargs="*", help="default: all")
    parser.add_argument("--n", type=int, default=50, help="submissions per assignment")
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--memory", action="store_true",
                        help="only the grader's peak memory for a submission printing 6 x 400 MB")
    args = parser.parse_args()
    if args.memory:
        out = ROOT / "benchmarks" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "grading_memory.json").write_text(json.dumps(grader_memory(), indent=1))
        return
    names = args.assignments or workflow.all_assignments()
    print(f"grading benchmark: {args.n} submissions per assignment, workers {args.workers}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    rows = [bench(a, args.n, args.workers) for a in names]
    print()
    print(f"{'assignment':22s} {'torch':>5s} " + " ".join(
        f"{'s/sub @' + str(w):>9s}" for w in args.workers) + f" {'ref s':>6s} {'reg s':>6s}")
    for r in rows:
        print(f"{r['assignment']:22s} {'yes' if r['imports_torch'] else 'no':>5s} " + " ".join(
            f"{r['runs'][w]['per_submission_s']:9.2f}" for w in args.workers)
            + f" {r['reference_s']:6.1f} {r['register_s']:6.1f}")
    for w in args.workers:
        total = sum(r["runs"][w]["autograde_s"] + r["register_s"] for r in rows)
        subs = sum(r["submissions"] for r in rows)
        print(f"whole course, {w} worker(s): {subs} submissions graded in {total:.0f} s "
              f"(registration included; reference runs {sum(r['reference_s'] for r in rows):.0f} s "
              "once, cached)")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "grading.json").write_text(json.dumps(
        {"n": args.n, "workers": args.workers, "cpus": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
