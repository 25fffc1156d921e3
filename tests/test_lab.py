"""``make lab`` (``scripts/lab.py``) stopped every way a student stops it: Ctrl-C (SIGINT to the
terminal's job), SIGTERM to make, a closed terminal (SIGHUP to the job), make killed outright
(SIGKILL: Linux tells lab.py, ``PR_SET_PDEATHSIG``). Each time JupyterLab, its kernels and a
kernel's rank forkserver are gone and nothing of it is left. The student configuration culls
idle kernels (its log says so), and the first launch's URL opens ``START_HERE.md``."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from jupyterlab_harness import MakeLab

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import workspace  # noqa: E402

pytestmark = pytest.mark.slow

# how a student stops make lab: (signal, to the terminal job's whole process group?)
WAYS = {"Ctrl-C": (signal.SIGINT, True), "SIGTERM to make": (signal.SIGTERM, False),
        "terminal closed": (signal.SIGHUP, True), "make killed": (signal.SIGKILL, False)}


def _run_in_kernel(lab: MakeLab, kernel_id: str, code: str, timeout_s: float = 240) -> None:
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(
        lab.workspace / ".jupyter-runtime" / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    try:
        reply = client.execute_interactive(code, timeout=timeout_s)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()


@pytest.mark.parametrize("way", list(WAYS))
def test_every_way_of_stopping_make_lab_leaves_no_process(tmp_path, way):
    import psutil

    ws = tmp_path / "ws"
    workspace.sync(ws)
    first = way != "terminal closed"
    if not first:  # (a later launch: JupyterLab opens where the student left it)
        (ws / ".course").mkdir(parents=True, exist_ok=True)
        (ws / ".course" / "lab-opened").touch()
    with MakeLab(ws) as lab:
        assert ("/lab/tree/START_HERE.md?token=" in lab.url) == first, lab.url
        kernel = lab.api("POST", "api/kernels", {"name": "python3"})
        if way == "SIGTERM to make":  # a kernel that has launched ranks: its forkserver too
            _run_in_kernel(lab, kernel["id"], "from course_utils import launch\n"
                                              "assert launch.run(launch.ping, 2, timeout_s=120)"
                                              " == [1, 1]")
        deadline = time.monotonic() + 60
        while not any("ipykernel" in " ".join(p.cmdline()) for p in lab.family()
                      if p.is_running()):
            assert time.monotonic() < deadline, "the kernel never started"
            time.sleep(0.5)
        family = lab.family()
        if way == "SIGTERM to make":
            assert any("forkserver" in " ".join(p.cmdline()) for p in family), [
                p.cmdline()[:3] for p in family]
        sig, group = WAYS[way]
        lab.signal(sig, group)
        lab.proc.wait(60)
        _, alive = psutil.wait_procs(family, timeout=60)
        left = [(p.pid, p.cmdline()[:3]) for p in alive if p.is_running()]
        assert left == [], f"{way}: processes left: {left}"
    assert lab.survivors == []
    log = (ws / ".jupyter-lab.log").read_text()
    assert "Culling kernels with idle durations > 1800 seconds" in log
    if sig != signal.SIGKILL:
        assert any("stopping JupyterLab and its kernels" in line for line in lab.lines), lab.lines
        # (and a closing line once it is done, issue 50: SIGTERM printed none)
        assert any(line.startswith("lab: stopped in") for line in lab.lines), lab.lines
