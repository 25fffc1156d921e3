"""CPU seconds of the imports every grading and test process pays, in fresh interpreters.

    .venv/bin/python benchmarks/import_cost.py

For each module: the median user+sys CPU time of ``python -c "import <module>"`` over five
fresh processes (CPU, not wall: the figure does not depend on the machine's load). The row
``rfc3987_syntax`` is what ``scripts/setup.sh`` removes from the environment (jsonschema built its
38 parsers in every process that imported nbformat); where it is still installed, the
``nbformat`` row includes it.
"""

from __future__ import annotations

import importlib.util
import resource
import statistics
import subprocess
import sys

MODULES = ["json", "nbformat", "nbclient", "nbgrader.apps", "torch", "jax"]


def cpu_seconds(module: str, runs: int = 5) -> float:
    out = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(out)


def main() -> None:
    rows = [m for m in MODULES if importlib.util.find_spec(m.split(".")[0])]
    if importlib.util.find_spec("rfc3987_syntax"):
        rows.insert(1, "rfc3987_syntax")
    print(f"{'module':<16} CPU s (median of 5 fresh processes)")
    for module in rows:
        print(f"{module:<16} {cpu_seconds(module):.2f}")


if __name__ == "__main__":
    main()
