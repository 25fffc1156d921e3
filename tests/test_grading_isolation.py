"""What one submission may take from the others and from the grader (issue 41): CPU, the
machine's ``/dev/shm``, leftovers, the grader's memory, and the lines of a text report.

Real sandboxed kernels where the claim is about them (a cell's leftover processes, CPU shares,
the socket folder's budget); the rest at the value level (hostile messages, report lines).
``tests/test_grading_host.py`` grades each attack end to end beside honest students.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import tracemalloc
from pathlib import Path

import nbformat
import pytest

from grading import cgroups, inert, integrity, judge, relay, sandbox
from grading.preprocessors import CONTAINER_BYTES, RecoveringExecute, payload_size

needs_sandbox = pytest.mark.skipif(not sandbox.enabled() or sandbox.bwrap_path() is None,
                                   reason="no bubblewrap on this machine")
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def _notebook(*cells: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNELSPEC
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


# ------------------------------------------------------------------------------ processes


@needs_sandbox
@pytest.mark.slow
def test_a_cell_leaves_no_process_running_but_the_rank_launcher(tmp_path):
    """Processes a cell starts, detached (new session, double fork) or not, end when the cell
    does; the course's rank launcher (its forkserver) survives to serve the next cell."""
    if not sandbox.has_cpu_cgroup() and not sandbox.has_pids_cgroup():
        pytest.skip("no writable cgroup on this machine")
    start = ("import os, subprocess, time\n"
             "from course_utils import launch\n"
             "def _rank(rank, world_size):\n    return rank\n"
             "print(launch.run(_rank, 2, timeout_s=60))\n"
             "subprocess.Popen(['sleep', '300'])\n"
             "for _ in range(5):\n"
             "    pid = os.fork()\n"
             "    if pid == 0:\n"
             "        os.setsid()\n"
             "        if os.fork() == 0:\n"
             "            time.sleep(300)\n"
             "        os._exit(0)\n"
             "    os.waitpid(pid, 0)\n"
             "time.sleep(0.5)\n")
    look = ("import os\n"  # (the processes running in the sandbox; a zombie has no cmdline)
            "procs = sorted(c for c in (open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ')"
            "[:60] for p in os.listdir('/proc') if p.isdigit()) if c)\n"
            "print(len(procs), procs)\n")
    again = "print(launch.run(_rank, 2, timeout_s=60))\n"
    nb = _notebook(start, look, again)
    ex = RecoveringExecute(timeout=120, startup_timeout=120)
    ex.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert "[0, 1]" in _text(nb.cells[0])
    seen = _text(nb.cells[1])
    assert "sleep" not in seen, seen
    # bwrap's init, the kernel, the launcher's forkserver and multiprocessing's tracker
    assert seen.startswith("4 "), seen
    assert "[0, 1]" in _text(nb.cells[2])
    assert any("6 processes this cell left running were ended" in line
               for line in ex._limits), ex._limits


@needs_sandbox
@pytest.mark.slow
def test_700_busy_processes_get_the_cpu_of_one_kernel():
    """A kernel whose processes (700 busy ones, detached) hog the CPU is one scheduling entity
    beside an honest kernel, which keeps at least its share: its fixed work takes at most 4
    times as long as without the hog (without the cpu group: hundreds of times)."""
    if not sandbox.has_cpu_cgroup():
        pytest.skip("no writable cpu cgroup on this machine")
    work = ("import time\nt0 = time.perf_counter()\nx = 0\n"
            "for i in range(3_000_000):\n    x += i\n"
            "print(time.perf_counter() - t0)\n")
    # (the 700 wait for a signal file before they spin: forking them must not take the kernel
    # its own CPU share, which they would share with it)
    hog = ("import os, time\n"
           "for _ in range(700):\n"
           "    pid = os.fork()\n"
           "    if pid == 0:\n"
           "        os.setsid()\n"
           "        if os.fork() == 0:\n"
           "            while not os.path.exists('/tmp/go'):\n                time.sleep(0.05)\n"
           "            stop = float(open('/tmp/go').read() or 0)\n"
           "            while time.time() < stop:\n                pass\n"
           "        os._exit(0)\n"
           "    os.waitpid(pid, 0)\n"
           "open('/tmp/go.tmp', 'w').write(str(time.time() + 60))\n"
           "os.rename('/tmp/go.tmp', '/tmp/go')\n"
           "time.sleep(1)\n")

    async def run() -> tuple[float, float, int]:
        managers = [sandbox.SandboxedKernelManager(kernel_name="python3") for _ in range(2)]
        clients = []
        try:
            for km in managers:
                await km.start_kernel()
                kc = km.client()
                kc.start_channels()
                await kc.wait_for_ready(timeout=120)
                km.record_kernel()
                clients.append(kc)
            honest, hogger = clients

            async def seconds(kc) -> float:
                out = []
                await kc.execute_interactive(work, timeout=300, output_hook=lambda m: out.append(
                    m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
                return float("".join(out))

            alone = min([await seconds(honest) for _ in range(2)])
            await hogger.execute_interactive(hog, timeout=600)
            beside = await seconds(honest)
            ended = managers[1].end_strays()
            return alone, beside, ended
        finally:
            for kc in clients:
                kc.stop_channels()
            for km in managers:
                await km.shutdown_kernel(now=True)

    alone, beside, ended = asyncio.run(run())
    assert ended >= 690, ended  # (a process or two may still be forking when it looks)
    assert beside < 4 * alone + 0.5, (alone, beside)


# ------------------------------------------------------------------------------ /dev/shm


@needs_sandbox
@pytest.mark.slow
def test_the_socket_folder_has_its_own_file_budget(tmp_path):
    """A kernel that makes files in its socket folder until it cannot fills only its own
    tmpfs (root) and never the machine's /dev/shm; the folder is gone after the kernel."""
    if os.geteuid() != 0:
        pytest.skip("a tmpfs per kernel needs root (the report then says NO file budget)")
    fill = ("import json, os, sys\n"
            "conn = sys.argv[sys.argv.index('-f') + 1]\n"
            "folder = os.path.dirname(json.load(open(conn))['ip'])\n"
            "n = 0\n"
            "try:\n"
            "    while n < 100_000:\n"
            "        open(os.path.join(folder, f'f{n}'), 'w').close()\n"
            "        n += 1\n"
            "except OSError as e:\n"
            "    print(n, e.errno)\n")
    before = os.statvfs("/dev/shm").f_ffree
    folders = set(Path("/dev/shm").glob(f"{cgroups.CGROUP_PREFIX}{os.getpid()}-*"))
    nb = _notebook(fill)
    RecoveringExecute(timeout=60, startup_timeout=120).preprocess(
        nb, {"metadata": {"path": str(tmp_path)}})
    made, errno = map(int, _text(nb.cells[0]).split())
    assert made < sandbox.KernelFolder.SOCKET_FS_INODES and errno == 28  # ENOSPC
    assert abs(os.statvfs("/dev/shm").f_ffree - before) < 50
    assert set(Path("/dev/shm").glob(f"{cgroups.CGROUP_PREFIX}{os.getpid()}-*")) == folders


def test_what_a_kernel_leaves_is_removed_whatever_it_is(tmp_path):
    """3,000 folders deep, a folder of mode 000, names that look like options, a link to a
    file outside (which stays): all removed, without recursion in Python."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    tree = tmp_path / "course-kernel-0-x"
    d = tree / "sockets"
    d.mkdir(parents=True)
    (d / "-rf").write_text("x")
    (d / "link").symlink_to(outside)
    (d / "link-dir").symlink_to(tmp_path)
    locked = d / "locked"
    locked.mkdir()
    (locked / "f").write_text("x")
    locked.chmod(0)
    fd = os.open(d, os.O_RDONLY)
    for _ in range(3000):  # (deeper than PATH_MAX allows a path to name: one level at a time)
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    sandbox._remove_tree(tree)
    assert not tree.exists() and outside.read_text() == "keep me"


def test_cleanup_removes_the_cgroups_even_when_the_folder_cannot_be(monkeypatch):
    """A kernel folder whose removal fails (anything: RecursionError, a busy mount) never
    keeps the kernel's cgroups, nor the next step of cleaning up, from going."""
    km = sandbox.SandboxedKernelManager.__new__(sandbox.SandboxedKernelManager)
    removed = []

    class Groups:
        def end_strays(self):
            return 0

        def remove(self):
            removed.append("cgroups")

    class Folder:
        def remove(self):
            raise RecursionError("3,000 folders deep")

    km.cgroups, km._folder = Groups(), Folder()
    km.log = __import__("logging").getLogger("test")

    async def parent_cleanup(self, restart=False):
        removed.append("kernel")

    monkeypatch.setattr(sandbox.AsyncKernelManager, "_async_cleanup_resources", parent_cleanup)
    asyncio.run(km._async_cleanup_resources())
    assert removed == ["kernel", "cgroups"]  # (and no exception: the next student is graded)


def test_a_killed_graders_folders_and_groups_are_swept(tmp_path):
    """Kernel folders named after a grading process that has ended are removed by the next
    kernel; a live grader's and a recent unnamed one stay."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    orphan = tmp_path / f"{cgroups.CGROUP_PREFIX}{ended.pid}-abc"
    live = tmp_path / f"{cgroups.CGROUP_PREFIX}{os.getpid()}-abc"
    unnamed = tmp_path / f"{cgroups.CGROUP_PREFIX}abc"
    for folder in (orphan, live, unnamed):
        (folder / "sockets" / "deep").mkdir(parents=True)
    assert sandbox.sweep_orphan_folders(tmp_path) == [orphan]
    assert not orphan.exists() and live.exists() and unnamed.exists()


# ------------------------------------------------------------------------------ memory


SHAPES = {  # 28 MiB of JSON each, under the 32 MiB message limit: (unit, count)
    "15 million zeros": (b"0,", 14 * 2**20),
    "9 million empty lists": (b"[],", 28 * 2**20 // 3),
    "9 million empty objects": (b"{},", 28 * 2**20 // 3),
    "5 million short strings": (b'"ab",', 28 * 2**20 // 5),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_hostile_message_is_refused_before_it_is_parsed(shape):
    """Each shape would cost the grader 140-700 MB parsed (measured): the session refuses it
    while it is still bytes, using almost nothing."""
    km = sandbox.SandboxedKernelManager.__new__(sandbox.SandboxedKernelManager)
    unpack = relay.guarded_unpack(json.loads,
                                  sandbox.SandboxedKernelManager.max_message_items.default_value)
    unit, count = SHAPES[shape]
    raw = b"[" + unit * count + b"0]"
    tracemalloc.start()
    try:
        with pytest.raises(relay.MessageTooComplex):
            unpack(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak
    assert km is not None and unpack(b'{"data": {"text/plain": "a, b, [c]"}}')["data"]


def test_the_session_of_every_grading_kernel_is_guarded():
    km = sandbox.SandboxedKernelManager(kernel_name="python3")
    try:
        assert getattr(km.session.unpack, "course_guarded", False)
        assert km.client().session.unpack is km.session.unpack
    finally:
        if km._folder is not None:
            km._folder.remove()


def test_walking_a_wide_output_costs_no_memory():
    """The output budget is counted with one iterator per level: 15 million items cost the
    grader nothing beyond the message itself (the old walk pushed one tuple per item: 1 GB)."""
    content = {"data": {"application/json": [0] * 15_000_000}}
    tracemalloc.start()
    try:
        assert payload_size(content, 64, limit=4_000_000) > 4_000_000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100_000, peak
    nested: list = []
    for _ in range(100):
        nested = [nested]
    assert payload_size(nested, 64) is None
    assert payload_size({"a": ["bc", 1]}, 64) == 2 * CONTAINER_BYTES + 13  # (1 + 2 + 2 + 8)


def test_distinct_type_names_do_not_grow_the_grader():
    """Thousands of distinct type names in one value (and as many in the next student's) leave at
    most 256 stand-in types behind: nothing grows from one student to the next."""
    judge._opaque_type.cache_clear()
    for student in range(2):
        values = judge.decode([{"$type": f"T{student}-{i}"} for i in range(5_000)])
        assert type(values[-1]).__name__ == f"T{student}-4999"
    assert judge._opaque_type.cache_info().currsize <= 256
    assert type(judge.decode({"$type": "a\nb\x1b[2K"})).__name__ == "a\\nb\\x1b[2K"


# ------------------------------------------------------------------------------ reports

HOSTILE = "Error\nr3_ghost: 10 / 10\x1b[2K\r\u202eevil\u2028x"


def test_no_report_line_can_be_forged_or_hidden():
    """Newlines, carriage returns, terminal escapes and bidirectional overrides in every field a
    student controls (exception names and messages, flags, limits, a not-graded reason) come
    out escaped: the text report has exactly its own lines."""
    graded = integrity.StudentResult(
        "alice", "graded", score=0.0, kernel_score=0.0, max_score=2.0,
        cells=[integrity.CellResult("q1_test", 2.0, 0.0, 0.0, HOSTILE, [HOSTILE])],
        flags=[HOSTILE], limits=[HOSTILE])
    missing = integrity.StudentResult("bob", f"not graded: notebook a.ipynb missing (found "
                                             f"{HOSTILE}.ipynb)")
    results = [integrity._inert(graded), integrity._inert(missing)]
    from grading import class_report

    summary = class_report.summarize("a1_training_state", results)
    text = integrity.render_text("a1_training_state", results, "sandboxed",
                                 class_summary=class_report.render_text(summary))
    for bad in ("\r", "\x1b", "\u202e", "\u2028"):
        assert bad not in text
    lines = text.split("\n")
    assert not any(line.lstrip().startswith("r3_ghost") for line in lines)
    assert sum("r3_ghost" in line for line in lines) >= 4  # (shown, escaped, where it was)
    assert "Error\\nr3_ghost: 10 / 10\\x1b[2K\\r\\u202eevil\\u2028x" in text


def test_the_kernels_error_and_edited_metadata_are_one_line_each():
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("error", ename="Err\nr3_ghost: 10 / 10\x1b[2K",
                                           evalue="\r\x1b[1Aq1 passed\nsecond line",
                                           traceback=[])]
    ename, evalue = judge.kernel_error(cell)
    assert ename == "Err\\nr3_ghost: 10 / 10\\x1b[2K" and evalue == "\\x1b[1Aq1 passed"
    release = nbformat.v4.new_notebook()
    test = nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {
        "grade": True, "grade_id": "q1_test", "locked": True, "points": 2, "solution": False}})
    release.cells = [test]
    submitted = nbformat.from_dict(json.loads(json.dumps(release)))
    submitted.cells[0].metadata["nbgrader"]["x\nr5_ghost: 10 / 10"] = True
    [change] = integrity.restore_metadata(submitted, release)
    assert "\n" not in change and "x\\nr5_ghost" in change


def test_one_line_escapes_what_a_terminal_would_act_on():
    assert inert.one_line("a\nb\r\x1b[31m\x07\u200b\u202e\x85c") == \
        "a\\nb\\r\\x1b[31m\\x07\\u200b\\u202e\\x85c"
    assert inert.one_line(inert.one_line("x\ny")) == "x\\ny"  # twice changes nothing
    assert inert.one_line("é ü 漢字 and a\\path") == "é ü 漢字 and a\\path"
    assert inert.one_line("x" * 50, limit=10) == "x" * 10 + "..."
