"""How often the copied-answer evidence accuses an honest student, and how many copiers it names.

    .venv/bin/python benchmarks/copy_evidence.py                  # every assignment with givens
    .venv/bin/python benchmarks/copy_evidence.py a1_training_state --seeds 20

Simulated classes on values alone (``grading.copies.simulate_class``): 30 honest students, each
answering every question judged by checks right, or with a mistake the judge names for their own
numbers (a third of the answers), or, at ``--unknown`` (default 0 and 0.15), with a slip the
judge does not know (the right value times 2, another allowed choice); and 10 students who hand
in an honest classmate's values (one with other numbers). The evidence is computed as the
report computes it (``grading.copies.matches``). Per assignment: the honest students named
(false positives), and the copiers whose answers are wrong for their own numbers that are not
named with the classmate they copied (misses). Results also go to
``benchmarks/results/copy_evidence.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.assess import givens as assignment_givens  # noqa: E402
from grading import copies, reference  # noqa: E402


def rates(assignment: str, seeds: int, unknown: float) -> dict:
    ref = {g: p for run in reference.reference_run(
        assignment, cache=ROOT / ".cache" / "reference").values()
        for g, p in run["submissions"].items()}
    honest = named_honest = copiers = missed = 0
    for seed in range(seeds):
        students, copied_from = copies.simulate_class(assignment, ref, seed=seed,
                                                      unknown_rate=unknown)
        found = copies.matches(assignment, students, ref)
        for s, peer in copied_from.items():
            if peer is None:
                honest += 1
                named_honest += bool(found[s])
            elif students[s][1]:  # (a copy right for the copier's own numbers is no evidence)
                copiers += 1
                missed += not any(peer in peers for _, peers, _ in found[s])
    return {"assignment": assignment, "unknown_slips": unknown, "honest": honest,
            "honest_named": named_honest, "copiers_with_wrong_answers": copiers,
            "copiers_missed": missed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("assignments", nargs="*", default=sorted(assignment_givens.GIVENS))
    parser.add_argument("--seeds", type=int, default=10, help="classes per assignment")
    parser.add_argument("--unknown", type=float, nargs="+", default=[0.0, 0.15])
    args = parser.parse_args()
    rows = []
    print(f"{'assignment':20s} {'slips':>5s} {'honest named':>14s} {'copiers missed':>16s}")
    for unknown in args.unknown:
        for a in args.assignments:
            r = rates(a, args.seeds, unknown)
            rows.append(r)
            print(f"{a:20s} {unknown:5.2f} {r['honest_named']:6d} / {r['honest']:<6d} "
                  f"{r['copiers_missed']:6d} / {r['copiers_with_wrong_answers']:<6d}", flush=True)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "copy_evidence.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
