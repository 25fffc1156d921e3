"""A small Slurm client: submit a job, wait for it, and say readably how each task ended.

Everything comes from Slurm's own commands (``sbatch``, ``squeue``, ``scontrol``, and ``sacct``
where the cluster keeps accounting) and the job's own log: a job that failed is described as
"job 12_3 ended TIMEOUT after 00:01:04 (time limit 00:01:00)" plus the log's error lines, never as
a bare exit code. Used by the Slurm executor of autograde (:mod:`grading.slurm_executor`) and by
the tests that run ``scripts/cluster.sbatch`` on a real one-node Slurm (``scripts/slurm_local.sh``).

Every call is bounded: each command has a time limit, and :func:`wait` gives up after its
``timeout_s`` with a :class:`SlurmError` naming the tasks still pending or running (and why Slurm
keeps them pending).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from grading.files import entry_kind, read_regular

COMMAND_TIMEOUT_S = 60  # one squeue/scontrol/sbatch call
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
          "RESIZING", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT",
          "STOPPED"}
# what an end state means, in words
MEANING = {"COMPLETED": "finished",
           "FAILED": "exited with an error",
           "TIMEOUT": "ran past its time limit and was killed",
           "CANCELLED": "was cancelled",
           "NODE_FAIL": "lost its node",
           "OUT_OF_MEMORY": "ran out of memory",
           "PREEMPTED": "was preempted",
           "BOOT_FAIL": "could not start its node",
           "DEADLINE": "passed its deadline",
           "UNKNOWN": "is unknown to Slurm now"}


class SlurmError(RuntimeError):
    """A Slurm command failed, or a job did not end in time (the message says which and why)."""


def unavailable() -> str | None:
    """Why Slurm cannot be used from here (a sentence), or None when it can: the client
    commands are installed and the controller answers."""
    for tool in ("sbatch", "squeue", "scontrol"):
        if shutil.which(tool) is None:
            return f"Slurm's {tool} is not installed (Debian/Ubuntu: apt-get install slurm-client)"
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True,
                             timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "scontrol ping got no answer in 60 s"
    if out.returncode != 0 or " is UP" not in out.stdout:
        return f"no Slurm controller answers ({(out.stdout + out.stderr).strip()[:300]})"
    return None


def _run(args: list[str], what: str, timeout: float = COMMAND_TIMEOUT_S,
         env: dict | None = None, cwd: Path | None = None) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                             cwd=cwd)
    except FileNotFoundError:
        raise SlurmError(f"{what}: {args[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{what}: {args[0]} got no answer in {timeout:g} s") from None
    if out.returncode != 0:
        raise SlurmError(f"{what}: {' '.join(args[:2])} ... failed ({out.returncode}): "
                         f"{(out.stderr or out.stdout).strip()[:1000]}")
    return out.stdout


def sbatch(args: list[str], env: dict | None = None, cwd: Path | None = None) -> str:
    """Submit with ``sbatch --parsable ARGS``; returns the job id (Slurm's error if refused)."""
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"args must be a list of strings (sbatch's arguments), got {args!r}")
    out = _run(["sbatch", "--parsable", *args], "submitting the job", env=env, cwd=cwd)
    job = out.strip().split(";")[0]
    if not job.isdigit():
        raise SlurmError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
    return job


def cancel(job: str) -> None:
    """``scancel JOB`` (a job, an array or one task ``12_3``); quiet if it has already ended."""
    subprocess.run(["scancel", str(job)], capture_output=True, timeout=COMMAND_TIMEOUT_S)


def release(job: str) -> None:
    """``scontrol release JOB``: let a job submitted with ``--hold`` start."""
    _run(["scontrol", "release", str(job)], f"releasing job {job}")


@dataclass
class TaskState:
    """How one job, or one task of a job array, stands or ended."""

    job: str                  # "12" or "12_3" (array job 12, task 3)
    state: str                # PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, CANCELLED, ...
    exit_code: str = ""       # "1:0" (exit status : signal)
    reason: str = ""          # why it is pending, or why it ended (Slurm's Reason)
    run_time: str = ""
    time_limit: str = ""
    log: Path | None = None   # its StdOut file

    @property
    def active(self) -> bool:
        """Still pending or running (or suspended, requeued...): not ended."""
        return self.state in ACTIVE

    @property
    def ok(self) -> bool:
        """Ended COMPLETED with exit status 0."""
        return self.state == "COMPLETED" and self.exit_code.split(":")[0] in ("", "0")

    def describe(self, log_lines: int = 6) -> str:
        """One readable paragraph: what happened to the job, from Slurm and from its log."""
        if self.active:
            text = f"job {self.job} is still {self.state}"
            if self.reason and self.reason != "None":
                text += f" ({_reason(self.reason)})"
            return text
        text = f"job {self.job} ended {self.state}"
        meaning = MEANING.get(self.state)
        if self.state == "COMPLETED" and not self.ok:
            meaning = "exited with an error"
        if meaning and self.state != "COMPLETED":
            text += f": it {meaning}"
        if self.exit_code and self.exit_code != "0:0":
            status, _, signal = self.exit_code.partition(":")
            text += (f" (exit status {status}" + (f", signal {signal}" if signal not in
                                                  ("", "0") else "") + ")")
        if self.run_time:
            text += f" after {self.run_time}"
        if self.state == "TIMEOUT" and self.time_limit:
            text += f" (time limit {self.time_limit})"
        if self.log is not None:
            excerpt = log_excerpt(self.log, log_lines)
            if excerpt:
                text += f"; its log {self.log} says: {excerpt}"
            else:
                text += f"; log: {self.log}"
        return text


def _reason(reason: str) -> str:
    words = {"Resources": "waiting for free CPUs", "Priority": "other jobs go first",
             "JobHeldUser": "held: scontrol release it", "JobHeldAdmin": "held by an admin",
             "Dependency": "waiting for the job it depends on",
             "ReqNodeNotAvail": "the nodes it needs are not available",
             "PartitionDown": "its partition is down", "BeginTime": "its start time is later",
             "JobArrayTaskLimit": "the array's limit of running tasks is reached"}
    head = reason.split(",")[0]
    return f"{reason}: {words[head]}" if head in words else reason


_ERROR_LINE = re.compile(r"(\b\w*(Error|Exception)\b|error:|\*\*\* JOB|Traceback|Killed|"
                         r"DUE TO TIME LIMIT|CANCELLED)")


def log_excerpt(path: Path, lines: int = 6, max_bytes: int = 2_000_000) -> str:
    """The lines of a job's log that say what went wrong (errors, Slurm's ``*** JOB ...``
    notes), else its last lines; joined with `` | ``; "" when there is no readable log. The
    log is read as a regular file (no link followed), its last ``max_bytes`` at most."""
    try:
        if entry_kind(Path(path)) != "file":
            return ""
        size = os.lstat(path).st_size
        if size > max_bytes:
            with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as f:
                f.seek(size - max_bytes)
                data = f.read(max_bytes)
        else:
            data = read_regular(Path(path), max_bytes)
    except OSError:
        return ""
    text = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    errors = [line for line in text if _ERROR_LINE.search(line)]
    chosen = (errors[-lines:] if errors else text[-lines:])
    return " | ".join(line[:300] for line in chosen)


_FIELD = re.compile(r"(\w+)=(\S*)")


def _parse_records(text: str) -> list[dict[str, str]]:
    """``scontrol show job -o`` output: one record per line, ``Key=Value`` fields."""
    return [dict(_FIELD.findall(line)) for line in text.splitlines() if line.strip()]


def _task_ids(spec: str) -> list[int]:
    """``3``, ``3-7``, ``3-7%2``, ``[3-5,9]`` -> the task ids it names."""
    spec = spec.split("%")[0].strip("[]")
    out: list[int] = []
    for part in spec.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        hi = hi.split(":")[0]  # (a step, 0-9:2)
        if lo.isdigit():
            out += list(range(int(lo), int(hi) + 1)) if hi.isdigit() else [int(lo)]
    return out


def states(job: str) -> dict[int | None, TaskState]:
    """Every task Slurm knows of job ``job``: ``{task id: TaskState}`` for an array, ``{None:
    TaskState}`` for a plain job. Tasks whose record the controller has dropped (finished longer
    ago than its ``MinJobAge``, or cancelled before they started) come from ``sacct`` where the
    cluster keeps accounting, and are absent otherwise."""
    job = str(job)
    if not job.isdigit():
        raise ValueError(f"job must be a Slurm job id (digits), got {job!r}")
    out: dict[int | None, TaskState] = {}
    try:
        text = _run(["scontrol", "show", "job", "-o", job], f"reading job {job}")
    except SlurmError as err:
        if "Invalid job id" not in str(err):
            raise
        text = ""
    for rec in _parse_records(text):
        log = Path(rec["StdOut"]) if rec.get("StdOut", "").startswith("/") else None
        common = dict(state=rec.get("JobState", "UNKNOWN"), exit_code=rec.get("ExitCode", ""),
                      reason=rec.get("Reason", ""), run_time=rec.get("RunTime", ""),
                      time_limit=rec.get("TimeLimit", ""))
        if "ArrayTaskId" in rec:
            ids = _task_ids(rec["ArrayTaskId"])
            for task in ids:  # (a pending range's record names one task's log: none for it)
                out[task] = TaskState(f"{job}_{task}", log=log if len(ids) == 1 else None,
                                      **common)
        else:
            out[None] = TaskState(job, log=log, **common)
    for task, st in _from_sacct(job).items():
        out.setdefault(task, st)
    return out


def _from_sacct(job: str) -> dict[int | None, TaskState]:
    """What the accounting database says of ``job``'s tasks (empty without accounting)."""
    if shutil.which("sacct") is None:
        return {}
    try:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job,
                              "-o", "JobID,State,ExitCode,Elapsed,Timelimit"],
                             capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {}
    if out.returncode != 0:  # "Slurm accounting storage is disabled"
        return {}
    found: dict[int | None, TaskState] = {}
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 5:
            continue
        jid, state, code, elapsed, limit = parts[:5]
        state = state.split()[0] if state else "UNKNOWN"  # "CANCELLED by 0"
        base, _, task = jid.partition("_")
        if base != job:
            continue
        if task.isdigit():
            found[int(task)] = TaskState(jid, state, code, "", elapsed, limit)
        elif not task:
            found[None] = TaskState(jid, state, code, "", elapsed, limit)
    return found


def wait(job: str, timeout_s: float, poll_s: float = 1.0,
         tasks: list[int] | None = None) -> dict[int | None, TaskState]:
    """Wait until no task of ``job`` (or of ``tasks``, its array task ids) is pending or
    running; returns :func:`states`. Raises :class:`SlurmError` after ``timeout_s`` naming the
    tasks still active and why (the job is left as it is: :func:`cancel` it if you give up)."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    deadline = time.monotonic() + timeout_s
    while True:
        now = states(job)
        active = [st for t, st in now.items() if st.active and (tasks is None or t in tasks)]
        if not active:
            return now
        if time.monotonic() >= deadline:
            shown = "; ".join(st.describe() for st in active[:5])
            more = f" and {len(active) - 5} more" if len(active) > 5 else ""
            raise SlurmError(f"job {job} did not end within {timeout_s:g} s: {shown}{more}")
        time.sleep(poll_s)


__all__ = ["SlurmError", "TaskState", "cancel", "log_excerpt", "release", "sbatch", "states",
           "unavailable", "wait"]
