"""The course's Slurm paths on a real one-node Slurm (``scripts/slurm_local.sh``: real munged,
slurmctld and slurmd): ``scripts/cluster.sbatch`` submitted with sbatch and checked against the
one-device run, a failing job described from Slurm's own state and log, and autograde as a job
array (``--executor slurm``) giving the same results as the local executor. Skips, saying why,
where Slurm cannot run here (not root, slurm-wlm not installed: ``.ci/run`` installs it).

The cluster lives in a temporary folder (config, munge key, state, spool, logs) and the last test
stops it and checks that no Slurm or munge process of it is left. The stand-in test of
``tests/test_launch.py`` keeps what one node cannot show (two torchruns joined across "nodes").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from conftest import REFERENCE_CACHE, ROOT

from grading import integrity, judge, slurm, slurm_executor, synthetic, workflow

SCRIPT = ROOT / "scripts" / "slurm_local.sh"
A = "a1_training_state"
# The class graded both ways: what the Slurm executor can treat differently from the local one.
# A task grades its one submission with the local executor itself (workflow.autograde, one
# worker) in its own copy of the course data (the secret, the gradebook as submitted, the
# submission), from --chdir=ROOT, and the merge brings the results back. So the class holds the
# kinds that meet the task's surroundings: what the course data, the secret, the working folder
# and the logs let an attack reach (writes_course_data, reads_expected, shadow_course_utils,
# hidden_payload, stderr_noise), notebooks no task can grade (malformed_json,
# missing_notebook), the class-level evidence computed over the merged results (copies_peer of
# the peer "correct", typed_identity), a partial score with its message (wrong), and one
# representative each of the attacks met inside the kernel and judged outside it
# (patch_sys_modules) and of the test cells restored from the release (edited_tests);
# honest_1 is the task cancelled before it starts. The other kinds of synthetic.EXECUTOR_CLASS
# meet the same kernel and judge in a task as in the local executor (unit mistakes, a raising
# answer, objects that lie, a helper used, the typical mistake, the other patches, a deleted
# test cell, an unanswered one): the grading tests grade each of them on a1 in a kernel.
KINDS = ["correct", "wrong", "edited_tests", "patch_sys_modules", "shadow_course_utils",
         "malformed_json", "missing_notebook", "stderr_noise", "reads_expected",
         "hidden_payload", "honest_1", "copies_peer", "typed_identity", "writes_course_data"]
assert set(KINDS) <= set(synthetic.EXECUTOR_CLASS)
CANCELLED = "honest_1"   # its array task is cancelled before it starts
SLEEPER = "sleeper"      # its first answer sleeps past its task's 1-minute time limit
CELL_TIMEOUT = 150       # (so the sleeper meets Slurm's limit, not the cell's)


@dataclass
class Cluster:
    folder: Path
    conf: Path

    def pids(self) -> dict[str, int]:
        """The daemons' pids from their pid files."""
        return {name: int((self.folder / f"{name}.pid").read_text())
                for name in ("munged", "slurmctld", "slurmd")
                if (self.folder / f"{name}.pid").exists()}


def _script(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A one-node Slurm for this module; one CPU more than the machine has, so the sleeping
    submission's task does not hold back the others."""
    folder = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ, SLURM_LOCAL_CPUS=str((os.cpu_count() or 1) + 1))
    out = _script("start", str(folder), env=env)
    if out.returncode == 3:
        pytest.skip(out.stderr.strip())
    assert out.returncode == 0, out.stdout + out.stderr
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(folder / "slurm.conf"))
        try:
            yield Cluster(folder, folder / "slurm.conf")
        finally:
            _script("stop", str(folder))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _submit_demo(folder: Path, ranks: int) -> tuple[str, float]:
    """``sbatch --nodes 1 scripts/cluster.sbatch course_utils.mesh.grid`` with ``ranks`` ranks."""
    env = dict(os.environ, NPROC_PER_NODE=str(ranks), RDZV_PORT=str(_free_port()),
               OMP_NUM_THREADS="1")
    start = time.monotonic()
    job = slurm.sbatch(["--nodes=1", "--time=5", f"--output={folder}/demo-%j.out",
                        str(ROOT / "scripts" / "cluster.sbatch"), "course_utils.mesh.grid"],
                       env=env, cwd=ROOT)
    return job, start


@pytest.fixture(scope="module")
def demos(cluster, tmp_path_factory) -> dict[int, tuple[slurm.TaskState, str, float]]:
    """The demo with 2 ranks and with 1, submitted together: ``{ranks: (Slurm's state of the
    job, its log, seconds from sbatch to its end)}``."""
    folder = tmp_path_factory.mktemp("demos")
    jobs = {ranks: _submit_demo(folder, ranks) for ranks in (2, 1)}
    out = {}
    for ranks, (job, start) in jobs.items():
        [st] = slurm.wait(job, timeout_s=300, poll_s=0.5).values()
        log = folder / f"demo-{job}.out"
        out[ranks] = (st, log.read_text() if log.exists() else "", time.monotonic() - start)
    return out


def test_cluster_sbatch_runs_a_demo_on_real_slurm(demos):
    """One node, one torchrun, two ranks as the script starts them on a cluster: each rank's
    DP step equals the one-device step (the worker prints its largest difference)."""
    st, text, took = demos[2]
    assert st.ok, st.describe()
    assert "1 node(s) x 2 rank(s)" in text, text
    lines = sorted(line for line in text.splitlines() if " returned: " in line)
    assert [line.split(" returned")[0] for line in lines] == ["rank 0", "rank 1"], text
    assert all(float(line.split(": ")[1]) < 1e-6 for line in lines), lines
    print(f"cluster.sbatch course_utils.mesh.grid, 1 node x 2 ranks: {took:.1f} s from sbatch to end")


def test_a_failing_job_is_described_from_slurm_and_its_log(demos):
    """One rank, which raises (the demo needs an even world); Slurm says FAILED, and the
    description carries the exit status and the rank's error from the job's log."""
    st, text, _ = demos[1]
    assert st.state == "FAILED", (st, text[-2000:])
    said = st.describe()
    assert said.startswith(f"job {st.job} ended FAILED: it exited with an error (exit status 1")
    assert "world_size must be even (dp = 2); got 1" in said, said


def _sleeper_notebook(correct: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(json.loads(json.dumps(correct)))
    first = next(c for c in nb.cells if integrity.is_answer_cell(c))
    first.source = "import time\nwhile True:\n    time.sleep(1)\n" + first.source
    return nb


def _class(data: Path, refs: dict, sleeper: nbformat.NotebookNode) -> None:
    synthetic.build(A, data / "submitted", refs, kinds=set(KINDS), mechanics=True)
    target = data / "submitted" / SLEEPER / A
    target.mkdir(parents=True)
    nbformat.write(sleeper, target / f"{A}.ipynb")


def _verdicts(results) -> dict:
    """Everything the report says of each student but the time grading took."""
    return {r.student: (r.status, r.score, r.kernel_score, r.max_score, r.manual_pending,
                        [(c.grade_id, c.score, c.kernel_score, c.message) for c in r.cells],
                        sorted(r.flags), r.limits) for r in results}


def _gradebook(data: Path) -> dict:
    """Each student's rows of the gradebook that autograde writes."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    with Gradebook(f"sqlite:///{data / 'gradebook.db'}") as gb:
        for student in gb.students:
            try:
                sub = gb.find_submission(A, student.id)
            except MissingEntry:
                out[student.id] = None
                continue
            out[student.id] = (str(sub.timestamp), [
                (nb.name, nb.late_submission_penalty,
                 sorted((g.name, g.auto_score, g.manual_score, g.needs_manual_grade)
                        for g in nb.grades),
                 sorted((c.name, c.auto_comment) for c in nb.comments))
                for nb in sub.notebooks])
    return out


@pytest.mark.slow
def test_grading_as_a_job_array_matches_the_local_executor(cluster, tmp_path):
    """The class (and a sleeper) graded as Slurm array tasks: a task cancelled before it starts
    and a task killed at its time limit are those students' "not graded" with Slurm's account of
    it; grading again (``--no-wait``: a dependent merge job) grades only those two; then every
    score, message, flag and gradebook row is the local executor's, and the merges leave no
    copy of the secret, the gradebook or a submission behind."""
    slow = tmp_path / "slurm-data"
    here = tmp_path / "local-data"
    cache = REFERENCE_CACHE  # (the suite's: a1's reference runs once for every test)
    refs = integrity.reference_run(A, slow, cache=cache)
    correct = next(f for c, f in synthetic.cases_for(A, refs) if c.kind == "correct")[f"{A}.ipynb"]
    _class(slow, refs, _sleeper_notebook(correct))
    _class(here, refs, correct)  # the local class: the sleeper's fixed notebook
    judge.course_secret(slow)
    shutil.copy(slow / judge.SECRET_FILE, here / judge.SECRET_FILE)  # the same hidden cases
    workflow.register(A, slow)

    # the sleeper through the whole command (submit, wait, merge) in a thread, beside the rest
    t0 = time.monotonic()
    sleeping: dict = {}
    thread = threading.Thread(target=lambda: sleeping.update(run=slurm_executor.autograde(
        A, slow, students=[SLEEPER], timeout=CELL_TIMEOUT, register_first=False,
        reference_cache=cache, time_limit_min=1, wait_timeout_s=400, poll_s=1)))
    thread.start()
    deadline = time.monotonic() + 60
    while not list((slow / "slurm" / A).glob("*/run.json")) and time.monotonic() < deadline:
        time.sleep(0.2)  # (its array first: the others are "missing" but for it)
    main = slurm_executor.submit(A, slow, timeout=CELL_TIMEOUT, register_first=False,
                                 reference_cache=cache, hold=True)
    assert sorted(main.students) == sorted(KINDS)
    slurm.cancel(f"{main.job}_{main.students.index(CANCELLED)}")
    slurm.release(main.job)
    slurm.wait(main.job, timeout_s=900, poll_s=1)
    first = slurm_executor.merge(A, slow)
    t_array = time.monotonic() - t0
    [main_run] = [p.parent for p in (slow / "slurm" / A).glob("*/run.json")
                  if json.loads(p.read_text()).get("job") == main.job]

    t0 = time.monotonic()
    local = workflow.autograde(A, workers=2, data=here, timeout=CELL_TIMEOUT,
                               reference_cache=cache)
    t_local = time.monotonic() - t0
    assert not local.timed_out

    thread.join(timeout=400)
    assert not thread.is_alive()
    sleeper = sleeping["run"]
    # a merge installs every run that has ended: the sleeper's own merge takes the main array
    # too when both end together, and then the merge above found nothing left to do
    took = first if main_run in first.runs else sleeper.merged
    assert main_run in took.runs, (first, sleeper.merged)
    assert set(took.finished) >= set(KINDS) - {CANCELLED}, took
    assert CANCELLED in took.not_graded
    assert sleeper.students == 1 and SLEEPER not in sleeper.merged.finished
    assert "ended TIMEOUT" in sleeper.merged.not_graded[SLEEPER]
    results, _ = integrity.report(A, slow)
    by = {r.student: r for r in results}
    assert by[CANCELLED].status.startswith(f"not graded: its Slurm task {main.job}_"), \
        by[CANCELLED].status
    assert "autograde again" in by[CANCELLED].status
    why = by[SLEEPER].status
    assert why.startswith(f"not graded: its Slurm task: job {sleeper.job}_0 ended TIMEOUT: it "
                          "ran past its time limit and was killed"), why
    assert "(time limit 00:01:00)" in why and "DUE TO TIME LIMIT" in why, why
    text = (slow / "reports" / f"{A}.txt").read_text()
    assert f"{SLEEPER}: NOT GRADED (its Slurm task: job {sleeper.job}_0 ended TIMEOUT" in text
    n = len(KINDS) + 1  # (the sleeper; not graded: it, the cancelled, malformed, missing)
    assert f"CLASS SUMMARY: {n} students, {n - 4} graded, 4 NOT graded" in text
    print(text[text.index("CLASS SUMMARY"):text.index("EVERY STUDENT")])

    # the student sends a fixed notebook; grading again grades only the two missing ones, and
    # a dependent job merges and reports
    nbformat.write(correct, slow / "submitted" / SLEEPER / A / f"{A}.ipynb")
    assert sorted(slurm_executor.missing_students(A, slow)) == sorted([CANCELLED, SLEEPER])
    t0 = time.monotonic()
    again = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), "autograde", A,
                            "--executor", "slurm", "--no-wait", "--timeout", str(CELL_TIMEOUT)],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, COURSE_DATA=str(slow)))
    assert again.returncode == 0, again.stdout + again.stderr
    said = re.search(r"submitted 2 submission\(s\) as Slurm array (\d+); job (\d+) merges",
                     again.stdout)
    assert said, again.stdout
    [merge_job] = slurm.wait(said.group(2), timeout_s=600, poll_s=1).values()
    t_again = time.monotonic() - t0
    assert merge_job.ok, merge_job.describe()
    [run_dir] = [p.parent for p in (slow / "slurm" / A).glob("*/run.json")
                 if json.loads(p.read_text()).get("job") == said.group(1)]
    merged = (run_dir / "logs" / "merge.out").read_text()
    assert "merged 2 finished Slurm task(s) from 1 array(s)" in merged, merged
    assert f"{A}: {n - 2} graded, 2 NOT graded" in merged, merged  # (malformed, missing)
    assert slurm_executor.missing_students(A, slow) == []

    slurm_results, _ = integrity.report(A, slow)
    local_results, _ = integrity.report(A, here)
    assert len(slurm_results) == len(KINDS) + 1
    assert _verdicts(slurm_results) == _verdicts(local_results)
    assert _gradebook(slow) == _gradebook(here)
    # (export writes these rows, in the gradebook's order, and the reports' verdicts: the same)
    graded = [r for r in slurm_results if r.graded]
    assert len(graded) == len(KINDS) - 1 and all(r.seconds for r in graded)
    # nothing of a task's private copies is left once merged; the logs stay
    left = [p for p in (slow / "slurm").rglob("*")
            if p.name in (judge.SECRET_FILE, "gradebook.db") or "submitted" in p.parts]
    assert left == []
    assert len(list((slow / "slurm" / A).glob("*/logs/task-0.out"))) == 3
    print(f"Slurm array of {len(KINDS)} (one cancelled) beside a 1-minute sleeper, merged: "
          f"{t_array:.1f} s; local executor, 2 workers, {len(KINDS) + 1}: {t_local:.1f} s; "
          f"the 2 missing again with --no-wait, until the merge job's end: {t_again:.1f} s")


def test_stopping_leaves_no_slurm_or_munge_process(cluster):
    """``slurm_local.sh stop`` ends every daemon it started (and the job steps): none of their
    pids is alive afterwards (a zombie waiting for init to reap it counts as ended)."""
    pids = cluster.pids()
    assert set(pids) == {"munged", "slurmctld", "slurmd"}
    out = _script("stop", str(cluster.folder))
    assert out.returncode == 0, out.stdout + out.stderr

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return False
        return state != "Z"

    assert [name for name, pid in pids.items() if alive(pid)] == []
    marked = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"DTP_SLURM_LOCAL={cluster.folder}".encode() in (proc / "environ").read_bytes():
                marked.append(proc.name)
        except OSError:
            continue
    assert marked == []
    assert slurm.unavailable() is not None  # the controller is gone


def test_bad_arguments_get_clear_errors(tmp_path):
    """No Slurm needed: each bad argument is named with what is allowed."""
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), "autograde", A,
                          "--executor", "pbs"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'pbs'" in bad.stderr
    with pytest.raises(ValueError, match="max_running must be a whole number >= 1"):
        slurm_executor.submit(A, tmp_path, max_running=0)
    with pytest.raises(ValueError, match="job must be a Slurm job id"):
        slurm.states("12; rm -rf /")
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        slurm.wait("12", timeout_s=0)
    out = _script("bogus")
    assert out.returncode == 2 and "usage" in out.stderr


def test_without_a_controller_the_executor_refuses_saying_why(tmp_path):
    """A config naming no running controller: the Slurm executor stops before submitting,
    saying why and how to get a Slurm here, within seconds."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                    "AuthType=auth/none\nNodeName=x CPUs=1\nPartitionName=p Nodes=x\n")
    if shutil.which("scontrol") is None:
        pytest.skip("Slurm's client commands are not installed")
    env = dict(os.environ, SLURM_CONF=str(conf), COURSE_DATA=str(tmp_path / "data"))
    (tmp_path / "data" / "submitted" / "alice" / A).mkdir(parents=True)
    start = time.monotonic()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), "autograde", A,
                          "--executor", "slurm"], capture_output=True, text=True, timeout=180,
                         env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "the Slurm executor cannot run: no Slurm controller answers" in out.stderr
    assert "scripts/slurm_local.sh start" in out.stderr
    assert time.monotonic() - start < 170


def test_task_states_are_read_from_slurm_records():
    """The parts of a ``scontrol show job -o`` answer the executor relies on."""
    assert slurm._task_ids("3") == [3]
    assert slurm._task_ids("4-7%2") == [4, 5, 6, 7]
    assert slurm._task_ids("[1-2,9]") == [1, 2, 9]
    st = slurm.TaskState("12_3", "TIMEOUT", "0:15", "TimeLimit", "00:01:07", "00:01:00")
    assert st.describe() == ("job 12_3 ended TIMEOUT: it ran past its time limit and was killed "
                             "(exit status 0, signal 15) after 00:01:07 (time limit 00:01:00)")
    pending = slurm.TaskState("12_4", "PENDING", reason="Resources")
    assert pending.active and "waiting for free CPUs" in pending.describe()
