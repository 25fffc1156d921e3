"""A pytest plugin for ``benchmarks/test_suite_time.py``: when each test ran, on which worker,
and how busy the machine's CPUs were meanwhile (where a CPU-bound suite leaves a core idle).

    PYTHONPATH=benchmarks PYTEST_ADDOPTS="-p suite_timeline" make test
    .venv/bin/python benchmarks/test_suite_time.py --timeline benchmarks/results/timeline

Every pytest process (the controller and each xdist worker) appends to ``<worker>.jsonl`` in
``$SUITE_TIMELINE`` (default ``benchmarks/results/timeline/``) one ``{"test", "start", "end"}``
per test, set-up to teardown (Unix seconds); the controller also samples ``/proc/stat`` each
second into ``cpu.jsonl``: ``{"t", "busy", "cpus"}``, the fraction of all CPUs busy since the
sample before (Linux only; elsewhere no samples).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

OUT = Path(os.environ.get("SUITE_TIMELINE", Path(__file__).parent / "results" / "timeline"))
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_STOP = pytest.StashKey[threading.Event]()  # (the controller's sampler's stop signal)


def _cpu() -> tuple[int, int]:
    """(all ticks, idle ticks) since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]  # (idle and iowait)


def _sample(stop: threading.Event) -> None:
    total, idle = _cpu()
    with open(OUT / "cpu.jsonl", "a") as f:
        while not stop.wait(1.0):
            total2, idle2 = _cpu()
            busy = 1 - (idle2 - idle) / max(1, total2 - total)
            f.write(json.dumps({"t": time.time(), "busy": round(busy, 4),
                                "cpus": os.cpu_count()}) + "\n")
            f.flush()
            total, idle = total2, idle2


def pytest_configure(config) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if _WORKER != "main":
        return
    for old in OUT.glob("*.jsonl"):  # (the controller starts before its workers)
        old.unlink()
    if Path("/proc/stat").exists():
        stop = threading.Event()
        threading.Thread(target=_sample, args=(stop,), daemon=True).start()
        config.stash[_STOP] = stop



def pytest_unconfigure(config) -> None:
    stop = config.stash.get(_STOP, None)
    if stop is not None:
        stop.set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.time()
    yield
    with open(OUT / f"{_WORKER}.jsonl", "a") as f:
        f.write(json.dumps({"test": item.nodeid, "start": start, "end": time.time()}) + "\n")
