"""The rank launcher: results, output order, every failure mode, and no process left behind."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

from course_utils import launch

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ workers (top level: picklable)


def _allreduce_worker(rank, world_size, seed):
    import torch.distributed as dist

    g = torch.Generator().manual_seed(seed + rank)
    local = torch.randn(5, generator=g)
    total = local.clone()
    dist.all_reduce(total)
    print(f"local sum {local.sum().item():.4f}")
    return local, total


def _record_pid(piddir):
    Path(piddir, f"{os.getpid()}").write_text("")


def _raise_on(rank, world_size, piddir, bad_rank, delay_other):
    import torch.distributed as dist

    _record_pid(piddir)
    if rank == bad_rank:
        raise ValueError(f"bad value on rank {rank}")
    time.sleep(delay_other)
    if delay_other:
        raise RuntimeError("late failure")  # a later failure must not be reported first
    dist.barrier()


def _hang_in_python(rank, world_size, piddir):
    _record_pid(piddir)
    if rank == 1:
        while True:
            time.sleep(0.05)
    import torch.distributed as dist

    dist.barrier()


def _skip_collective(rank, world_size, piddir):
    import torch.distributed as dist

    _record_pid(piddir)
    if rank == 0:
        dist.barrier()  # rank 1 never arrives, but stays alive
    else:
        time.sleep(60)


def _die(rank, world_size, piddir):
    _record_pid(piddir)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def _unpicklable(rank, world_size):
    return lambda: rank


def _survivors(piddir: Path, wait_s: float = 5.0) -> list[int]:
    pids = [int(p.name) for p in piddir.iterdir()]
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


# --------------------------------------------------------------------------------------- results


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_results_in_rank_order_match_single_process(world_size, seed):
    results = launch.run(_allreduce_worker, world_size, seed, show_output=False)
    assert len(results) == world_size
    expected_total = sum(r[0] for r in results)  # the same sum computed in one process
    for rank, (local, total) in enumerate(results):
        g = torch.Generator().manual_seed(seed + rank)
        torch.testing.assert_close(local, torch.randn(5, generator=g))
        torch.testing.assert_close(total, expected_total)


def test_output_printed_after_join_in_rank_order(capsys):
    launch.run(_allreduce_worker, 4, 0)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split("]")[0] for ln in lines] == [f"[rank {r}" for r in range(4)]


def test_ping_returns_sum_of_ranks():
    assert launch.run(launch.ping, 3) == [3, 3, 3]


def test_function_defined_at_runtime_travels_by_value():
    namespace = {}
    exec(textwrap.dedent("""
        def student_fn(rank, world_size, scale):
            import torch, torch.distributed as dist
            t = torch.tensor([float(rank)]) * scale
            dist.all_reduce(t)
            return t.item()
    """), namespace)
    namespace["student_fn"].__module__ = "__main__"  # as in a notebook cell
    assert launch.run(namespace["student_fn"], 2, 10.0) == [10.0, 10.0]


def test_spawn_start_method_also_works():
    assert launch.run(launch.ping, 2, start_method="spawn", timeout_s=120) == [1, 1]


# ---------------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("kwargs, exc, word", [
    (dict(fn=42, world_size=2), TypeError, "fn"),
    (dict(fn=launch.ping, world_size=0), ValueError, "world_size"),
    (dict(fn=launch.ping, world_size=launch.MAX_WORLD_SIZE + 1), ValueError, "world_size"),
    (dict(fn=launch.ping, world_size=2.0), TypeError, "world_size"),
    (dict(fn=launch.ping, world_size=True), TypeError, "world_size"),
    (dict(fn=launch.ping, world_size=2, timeout_s=0), ValueError, "timeout_s"),
    (dict(fn=launch.ping, world_size=2, timeout_s=-1), ValueError, "timeout_s"),
    (dict(fn=launch.ping, world_size=2, threads_per_rank=0), ValueError, "threads_per_rank"),
    (dict(fn=launch.ping, world_size=2, start_method="fork"), ValueError, "start_method"),
])
def test_bad_arguments_name_the_argument(kwargs, exc, word):
    fn, world_size = kwargs.pop("fn"), kwargs.pop("world_size")
    with pytest.raises(exc, match=word):
        launch.run(fn, world_size, **kwargs)


# -------------------------------------------------------------------------------------- failures


def test_rank_that_raises_is_named_with_traceback(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(launch.RankError) as info:
        launch.run(_raise_on, 2, str(tmp_path), 1, 0.0, timeout_s=30)
    assert time.monotonic() - t0 < 30
    err = info.value
    assert err.rank == 1
    assert "rank 1 failed first: ValueError: bad value on rank 1" in str(err)
    assert "Traceback" in err.rank_traceback and "_raise_on" in err.rank_traceback
    assert _survivors(tmp_path) == []


def test_first_failure_is_reported_not_a_later_one(tmp_path):
    with pytest.raises(launch.RankError) as info:
        launch.run(_raise_on, 3, str(tmp_path), 2, 1.0, timeout_s=30)
    assert info.value.rank == 2
    assert "late failure" not in str(info.value).split("--- output")[0]
    assert _survivors(tmp_path) == []


def test_hang_in_python_times_out_with_stack(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(launch.LaunchTimeout) as info:
        launch.run(_hang_in_python, 2, str(tmp_path), timeout_s=4)
    elapsed = time.monotonic() - t0
    assert elapsed < 4 + 3, elapsed  # the deadline, plus the stack dump and kill
    assert 1 in info.value.ranks
    assert "_hang_in_python" in str(info.value)  # the hung rank's stack is shown
    assert _survivors(tmp_path) == []


def test_hang_in_collective_times_out(tmp_path):
    with pytest.raises(launch.LaunchTimeout) as info:
        launch.run(_skip_collective, 2, str(tmp_path), timeout_s=4)
    assert 0 in info.value.ranks
    assert "barrier" in str(info.value)
    # where the hung rank was: its own frame, torch's folded to one line, none of the
    # launcher's (its threads included: the dump covers every thread)
    text = str(info.value)
    assert "in _skip_collective" in text and "frame(s) in torch.distributed" in text, text
    assert "course_utils/launch.py" not in text and "_rank_main" not in text, text
    assert "_watch_parent" not in text, text
    assert _survivors(tmp_path) == []


def test_rank_that_never_joins_times_out():
    t0 = time.monotonic()
    with pytest.raises(launch.LaunchTimeout) as info:
        launch.run(launch.ping, 2, timeout_s=4, _fault={"rank": 1, "stage": "before_init"})
    assert time.monotonic() - t0 < 7
    assert info.value.ranks == [0, 1]


def test_rank_killed_by_signal_is_reported(tmp_path):
    with pytest.raises(launch.RankError, match="rank 1 was killed by SIGKILL"):
        launch.run(_die, 2, str(tmp_path), timeout_s=30)
    assert _survivors(tmp_path) == []


def test_unpicklable_result_is_a_readable_error():
    with pytest.raises(launch.RankError, match=r"rank \d failed first: .*Can't pickle"):
        launch.run(_unpicklable, 2)  # both ranks fail; either may be first


# ------------------------------------------------------------------ interrupts and dying launchers

_DRIVER = textwrap.dedent("""
    import signal, sys, time
    # Ctrl-C must raise here even when the suite runs as a shell's background job, whose
    # processes start with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {root!r})
    from tests.test_launch import _hang_in_python
    from course_utils import launch
    print("launching", flush=True)
    launch.run(_hang_in_python, 2, {piddir!r}, timeout_s=120)
""")


# Launchers started by these tests preload only torch in their forkserver (what they test does
# not depend on what the ranks find imported): about 2.5 CPU-seconds less per process.
def _light():
    return dict(os.environ, COURSE_LAUNCH_PRELOAD="light")


def _start_driver(tmp_path):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    code = _DRIVER.format(root=str(ROOT), piddir=str(piddir))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_light())
    deadline = time.monotonic() + 60
    while len(list(piddir.iterdir())) < 2:
        assert time.monotonic() < deadline, proc.communicate(timeout=5)
        time.sleep(0.1)
    return proc, piddir


def test_keyboard_interrupt_kills_every_rank(tmp_path):
    proc, piddir = _start_driver(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    assert _survivors(piddir) == []


def test_ranks_exit_when_the_launching_process_is_killed(tmp_path):
    proc, piddir = _start_driver(tmp_path)
    proc.kill()  # no cleanup code runs in the launcher: the ranks must notice by themselves
    proc.communicate(timeout=30)
    assert _survivors(piddir, wait_s=10) == []


@pytest.mark.slow
@pytest.mark.parametrize("interrupt_on_timeout", [True, False])
def test_notebook_cell_timeout_leaves_no_rank(tmp_path, interrupt_on_timeout, monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    piddir = tmp_path / "pids"
    piddir.mkdir()
    monkeypatch.setenv("COURSE_LAUNCH_PRELOAD", "light")  # (the kernel inherits it; see _light)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                                  "from course_utils import launch\n"
                                  "from tests.test_launch import _hang_in_python\n"
                                  "launch.run(launch.ping, 2)  # start the forkserver"),
        nbformat.v4.new_code_cell(f"launch.run(_hang_in_python, 2, {str(piddir)!r}, timeout_s=300)"),
    ]
    # The warm-up cell may take a while on a loaded machine; the hanging cell only has to fork
    # two ranks (well under a second once the forkserver runs) before its timeout.
    client = NotebookClient(nb, kernel_name="python3", interrupt_on_timeout=interrupt_on_timeout,
                            timeout_func=lambda cell: 6 if "_hang_in_python, 2" in cell.source
                            else 120)
    # Interrupted: the cell ends in KeyboardInterrupt. Not interrupted: the kernel is shut down.
    expected = CellExecutionError if interrupt_on_timeout else CellTimeoutError
    with pytest.raises(expected) as info:
        client.execute()
    if interrupt_on_timeout:
        assert "KeyboardInterrupt" in str(info.value)
    assert len(list(piddir.iterdir())) == 2
    assert _survivors(piddir, wait_s=10) == []


# ----------------------------------------------------------------------- concurrency and torchrun


def test_concurrent_launchers_do_not_collide(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from course_utils import launch
        for _ in range(4):
            assert launch.run(launch.ping, 2, timeout_s=60) == [1, 1]
        print("ok")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_light()) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        assert out.strip() == "ok"


def test_same_worker_runs_under_torchrun(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2",
                          "-m", "course_utils.launch", "course_utils.launch:ping"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert sorted(line for line in out.stdout.splitlines() if "returned" in line) == [
        "rank 0 returned: 1", "rank 1 returned: 1"]


def _torchrun_modules() -> list[str]:
    """Every course_utils module whose ``__main__`` block starts a worker with torchrun_main."""
    out = []
    library = ROOT / "course_utils"
    for path in sorted(library.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.stem != "launch" and "torchrun_main(" in text.partition('if __name__ == "__main__":')[2]:
            out.append(".".join(path.relative_to(library).with_suffix("").parts))
    return out


# Demos whose ranks return their largest difference from the one-device result: its bound.
MAX_DIFFERENCE = {"mesh.grid": 1e-5, "data_parallel.overlap": 1e-6,
                  "sequence_parallel.sequence": 1e-5, "tensor_parallel.layers": 1e-5,
                  "trainer3d.train": 1e-4, "tensor_parallel.vocab": 1e-5}


@pytest.fixture(scope="module")
def torchrun_demos(tmp_path_factory):
    """Every demo module's ``__main__`` on 2 ranks, in turn, in one torchrun job
    (``tests/torchrun_demos.py``: the agent and the ranks import torch once, not once per
    module; test_same_worker_runs_under_torchrun runs a ``-m`` command of its own).
    Returns (the job's completed process, {module: [rank 0's output, rank 1's] or None})."""
    out_dir = tmp_path_factory.mktemp("torchrun-demos")
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    modules = _torchrun_modules()
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "tests.torchrun_demos",
           str(out_dir), *modules]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:  # a demo hung: torchrun stops its ranks on SIGTERM
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        err += "\n[the job was stopped after 900 s]"
    job = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    outputs = {}
    for module in modules:
        files = [out_dir / f"{module}.rank{r}.out" for r in range(2)]
        outputs[module] = ([f.read_text(errors="replace") for f in files]
                           if all(f.exists() for f in files) else None)
    return job, outputs


@pytest.mark.slow
@pytest.mark.parametrize("module", _torchrun_modules())
def test_every_demo_module_runs_under_torchrun(torchrun_demos, module):
    """The README's promise: `torchrun --standalone --nproc-per-node 2 -m course_utils.MODULE`
    runs each demo (gloo here, NCCL on a GPU box) and every rank reports; a demo that checks
    itself against one device reports a difference within its bound."""
    job, outputs = torchrun_demos
    ran = outputs[module]
    assert ran is not None, f"the job ended before {module} started:\n{job.stderr[-3000:]}"
    failed = f"{module} failed:\n" + "\n".join(o[-3000:] for o in ran) + job.stderr[-2000:]
    for rank, text in enumerate(ran):
        assert f"[torchrun_demos] {module} finished" in text, failed
        # one "rank r returned: v" line per rank, written in one write by torchrun_main
        returned = re.findall(r"rank (\d+) returned: ([^\n]*)", text)
        assert [r for r, _ in returned] == [str(rank)], failed
        if module in MAX_DIFFERENCE:
            assert float(returned[0][1]) < MAX_DIFFERENCE[module], returned


@pytest.mark.slow
def test_the_demo_job_ends_cleanly(torchrun_demos):
    job, _ = torchrun_demos
    assert job.returncode == 0, job.stderr[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_every_rank_matches_one_device(stdout: str, world_size: int) -> None:
    """torchrun_main's "rank r returned: <largest difference from one device>" lines."""
    lines = sorted(line for line in stdout.splitlines() if "returned" in line)
    assert [line.split(" returned")[0] for line in lines] == [
        f"rank {r}" for r in range(world_size)], stdout
    assert all(float(line.split(": ")[1]) < 1e-6 for line in lines), lines


def test_the_slurm_script_starts_one_torchrun_per_node(tmp_path):
    """scripts/cluster.sbatch under stand-ins for Slurm's srun and scontrol: two "nodes" on this
    machine, as an allocation of two would run it, reach the same checked result. This is also
    the course's two-node check: two torchruns (c10d rendezvous on the loopback address, 2 ranks
    each) run module 6's DP x TP step, TP inside each node and DP across them, and every rank's
    shard equals the one-device step's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a long host list, as a large allocation prints: a reader that stops after the first line
    # (`| head -n 1`) kills scontrol with SIGPIPE, and pipefail fails the job (CI, exit 141)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nfor i in $(seq 20000); do echo 127.0.0.1; done\n")
    # srun runs its command once per node, in parallel (as with --ntasks-per-node=1)
    (bin_dir / "srun").write_text('#!/bin/bash\nshift\nfor n in $(seq "$SLURM_JOB_NUM_NODES"); '
                                  'do "$@" & done\nfail=0\nfor job in $(jobs -p); do wait "$job" '
                                  '|| fail=1; done\nexit $fail\n')
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    port = _free_port()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NUM_NODES="2",
               SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_ID="42", SLURM_SUBMIT_DIR=str(ROOT),
               NPROC_PER_NODE="2", RDZV_PORT=str(port), OMP_NUM_THREADS="1")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "cluster.sbatch"), "course_utils.mesh.grid"],
                         capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 node(s) x 2 rank(s)" in out.stdout
    _assert_every_rank_matches_one_device(out.stdout, 4)
    usage = subprocess.run(["bash", str(ROOT / "scripts" / "cluster.sbatch")],
                           capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_backend_is_chosen_from_the_machine():
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    want = "nccl" if dist.is_nccl_available() and gpus >= 2 else "gloo"
    assert launch.resolve_backend("auto", 2) == want
    assert launch.resolve_backend("gloo", 2) == "gloo"
    with pytest.raises(ValueError, match="backend must be one of"):
        launch.resolve_backend("mpi", 2)
    with pytest.raises(ValueError, match="one CUDA device per rank"):
        launch.resolve_backend("nccl", gpus + 1)
    with pytest.raises(ValueError, match="backend must be one of"):
        launch.run(launch.ping, 2, backend="tcp")
    assert launch.device().type == "cpu"  # outside a process group
    assert launch.run(_device_type, 2, backend="gloo", show_output=False) == ["cpu", "cpu"]


def _device_type(rank, world_size):
    return launch.device().type


def _return_tensors(rank, world_size, n):
    return {"t": torch.arange(n, dtype=torch.float32) + rank, "view": torch.ones(4, 4)[1]}


def test_tensor_results_survive_the_rank_exiting():
    """Tensors travel by value: torch's fd-sharing pickler would die with the rank."""
    for _ in range(3):
        results = launch.run(_return_tensors, 2, 100_000, show_output=False)
        for rank, r in enumerate(results):
            torch.testing.assert_close(r["t"], torch.arange(100_000, dtype=torch.float32) + rank)
            torch.testing.assert_close(r["view"], torch.ones(4))


def test_a_failed_rendezvous_is_retried_once(tmp_path):
    marker = str(tmp_path / "failed-once")
    fault = {"rank": 1, "stage": "init_error", "marker": marker}
    assert launch.run(launch.ping, 2, _fault=fault) == [1, 1]
    assert os.path.exists(marker)


def _subgroup_connect_fails_once(rank, world_size, marker):
    import torch.distributed as dist

    if rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:553] Connection closed by "
                           "peer [127.0.0.1]:11421")  # what a loaded machine gave in CI
    dist.barrier(group=dist.new_group([0, 1]))
    return rank


def test_a_gloo_connect_failure_inside_the_job_is_retried_once(tmp_path):
    """CI saw gloo's connectFullMesh fail while a job made a subgroup: the job runs once more
    in fresh processes; a second failure, or any other error, is reported as it is."""
    marker = str(tmp_path / "failed-once")
    assert launch.run(_subgroup_connect_fails_once, 2, marker, show_output=False) == [0, 1]
    assert os.path.exists(marker)
    always = str(tmp_path / "missing-dir" / "marker")  # open() fails: a plain error, no retry
    with pytest.raises(launch.RankError, match="FileNotFoundError"):
        launch.run(_subgroup_connect_fails_once, 2, always, show_output=False)


def _raise_after_barrier(rank, world_size, piddir):
    import torch.distributed as dist

    _record_pid(piddir)
    dist.barrier()  # both ranks have recorded their pid before rank 0 fails
    if rank == 0:
        raise ValueError("bad value on rank 0")
    time.sleep(30)


def test_an_error_inside_fn_is_not_retried(tmp_path):
    with pytest.raises(launch.RankError, match="bad value on rank 0"):
        launch.run(_raise_after_barrier, 2, str(tmp_path), timeout_s=30)
    assert len(list(tmp_path.iterdir())) == 2  # one attempt: each rank recorded one pid


def _slow_progress(rank, world_size, steps):
    for step in range(steps):
        print(f"step {step}")
        time.sleep(0.3)
    return rank


def test_live_rank_prints_progress_while_running_and_once(capsys):
    assert launch.run(_slow_progress, 2, 4, live_rank=0) == [0, 1]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"[rank 0] step {s}" for s in range(4)] + [
        f"[rank 1] step {s}" for s in range(4)]


def test_live_rank_must_be_a_rank():
    with pytest.raises(ValueError, match="live_rank"):
        launch.run(launch.ping, 2, live_rank=2)


def test_a_rank_error_shows_the_students_code_first():
    """A function defined in a notebook cell (code that exists only in memory) fails on a rank:
    the error shows its source lines, folds the library frames (torch) to one line, and leaves
    out the launcher's own frames; the whole traceback stays in ``rank_traceback``."""
    import linecache

    cell = "/tmp/ipykernel_0/cell_for_test_42.py"  # not a file: like a notebook cell
    source = textwrap.dedent("""\
        import torch.distributed as dist

        def student_step(rank, world_size):
            x = [1.0, 2.0]  # not a tensor
            dist.all_reduce(x)
            return x
    """)
    lines = source.splitlines(keepends=True)
    linecache.cache[cell] = (len(source), None, lines, cell)  # what IPython does for a cell
    scope: dict = {}
    exec(compile(source, cell, "exec"), scope)
    try:
        with pytest.raises(launch.RankError) as info:
            launch.run(scope["student_step"], 2, timeout_s=60, show_output=False)
    finally:
        del linecache.cache[cell]
    text = str(info.value)
    assert f'File "{cell}", line 5, in student_step' in text
    assert "dist.all_reduce(x)" in text  # the student's source line, from the cell's text
    assert "frame(s) in torch." in text
    assert "_rank_main" not in text and "multiprocessing" not in text
    assert "_rank_main" in info.value.rank_traceback  # the whole story is still there


def test_an_interrupt_says_which_ranks_it_stopped(tmp_path):
    import _thread
    import threading

    # interrupt_main does nothing where SIGINT is ignored (a shell's background job): handle it
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(3.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt, match=r"rank\(s\) \[0, 1\] were still running "
                                                    "and have been stopped"):
            launch.run(_hang_in_python, 2, str(tmp_path), timeout_s=60, show_output=False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert _survivors(tmp_path) == []
