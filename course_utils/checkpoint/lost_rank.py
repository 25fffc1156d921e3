"""A lost rank: a real SIGKILL mid-run, torchrun's agent restarts the job, the job resumes from
its last complete checkpoint and ends where the uninterrupted run does.

:func:`job_worker` is one rank of a :class:`course_utils.checkpoint.resume_job.Job` run as
torchrun runs it (env:// rendezvous, ``TORCHELASTIC_RESTART_COUNT``): it resumes from
:func:`course_utils.checkpoint.dcp.latest` when there is a checkpoint, saves one every ``every``
steps, pads each step to ``step_s`` seconds (so that the timeline reads like a bigger model's)
and, in the first attempt only, rank ``kill_rank`` sends itself SIGKILL in the middle of step
``kill_step``. Each rank appends its events (start, ready, steps, saves, load, kill) with wall
clock times to a log file, which outlives the process.

:func:`run` starts torchrun's own agent (``torch.distributed.launcher.api.elastic_launch``,
what the ``torchrun`` command calls) with ``max_restarts`` and this function as the entrypoint,
in a process forked from the course's forkserver, so that neither it nor the workers it forks
import torch afresh. It runs the job twice, uninterrupted and with the kill, and
:func:`timeline` reads both runs' events. Everything lives in a temporary folder removed at the
end; the agent's whole process group is killed after ``timeout_s``.

The same worker under the ``torchrun`` command (rank 1 killed at step 6, one restart)::

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 \
        -m course_utils.checkpoint.lost_rank FOLDER
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Plan", "job_worker", "run", "timeline", "predicted_lost_s", "draw"]


@dataclass(frozen=True)
class Plan:
    """The job (``resume_job.Job`` with these ranks and steps), its checkpoint interval
    ``every``, the step's padded time ``step_s`` and the kill (rank, step)."""

    world_size: int = 2
    steps: int = 10
    every: int = 4
    step_s: float = 0.1
    kill_rank: int = 1
    kill_step: int = 6
    max_restarts: int = 1

    def __post_init__(self) -> None:
        from course_utils.runtime.validate import check_index, check_int, check_real

        for name in ("world_size", "steps", "every", "max_restarts"):
            check_int(name, getattr(self, name))
        check_real("step_s", self.step_s)
        check_index("kill_rank", self.kill_rank, self.world_size)
        if not 0 < self.kill_step < self.steps:
            raise ValueError(f"kill_step must be a step from 1 to {self.steps - 1}; got "
                             f"{self.kill_step!r}")

    def job(self):
        from course_utils.checkpoint.resume_job import Job

        return Job(world_size=self.world_size, steps=self.steps)


def _log(folder: str, rank: int, event: str, **fields: Any) -> None:
    fields.setdefault("attempt", int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    line = json.dumps({"t": time.time(), "rank": rank, "event": event, **fields})
    with open(os.path.join(folder, f"events.rank{rank}.jsonl"), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())       # the line must survive a SIGKILL right after it


def job_worker(folder: str, plan_fields: dict, kill: bool) -> dict[str, Any]:
    """One rank of the job under torchrun's agent (env:// rendezvous): resume if there is a
    checkpoint in ``folder/ckpt``, train, save every ``plan.every`` steps; returns the losses
    of this attempt and a digest of the final weights."""
    import warnings

    import torch
    import torch.distributed as dist

    from course_utils.checkpoint import dcp as checkpoint
    from course_utils.checkpoint import resume_job

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    plan = Plan(**plan_fields)
    rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    _log(folder, rank, "start", attempt=attempt)

    def stopped(signum, frame):           # the agent stops the survivors with SIGTERM
        _log(folder, rank, "stopped", attempt=attempt)
        os._exit(143)

    signal.signal(signal.SIGTERM, stopped)
    # torchrun's agent keeps one TCPStore across restarts (the same MASTER_PORT, seen in its
    # log), so the dead attempt's gloo addresses are still in it: a prefix per attempt keeps the
    # new ranks from connecting to a dead one's address ("Connection refused").
    store = dist.PrefixStore(f"attempt{attempt}", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), plan.world_size,
        is_master=False))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=plan.world_size)
    job, root = plan.job(), os.path.join(folder, "ckpt")
    resume_job.train(resume_job.fresh(job, rank, plan.world_size), 1)   # warm-up, thrown away
    trainer = resume_job.fresh(job, rank, plan.world_size)
    found = checkpoint.latest(root)
    _log(folder, rank, "ready", attempt=attempt)
    if found is not None:
        checkpoint.load(trainer, found[1])
        _log(folder, rank, "loaded", step=found[0])
    losses = []
    while trainer.step < job.steps:
        t0, step = time.time(), trainer.step
        _log(folder, rank, "step", step=step)
        losses += resume_job.train(trainer, step + 1)
        if kill and attempt == 0 and rank == plan.kill_rank and step == plan.kill_step and \
                int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:   # (a restart to come)
            time.sleep(max(0.0, t0 + plan.step_s / 2 - time.time()))
            _log(folder, rank, "killed", step=step)
            os.kill(os.getpid(), signal.SIGKILL)                           # a real lost rank
        time.sleep(max(0.0, t0 + plan.step_s - time.time()))
        if trainer.step % plan.every == 0 and trainer.step < job.steps:
            _log(folder, rank, "save", step=trainer.step)
            checkpoint.save(trainer, checkpoint.step_folder(root, trainer.step))
            dist.barrier()
            _log(folder, rank, "saved", step=trainer.step)
    _log(folder, rank, "done", step=trainer.step)
    weights = resume_job.snapshot(trainer)["weights"]
    dist.destroy_process_group()
    return {"losses": losses, "weights": {k: v.tobytes().hex() for k, v in weights.items()}}


def _agent(folder: str, plan_fields: dict) -> None:
    """The agent's process: torchrun's agent, the job uninterrupted, then with the kill. It forks
    the workers from itself (``start_method="fork"``): it has imported everything they need,
    and has never run a matmul (a fork after one can hang a child in OpenMP)."""
    import logging

    import torch.distributed.checkpoint  # noqa: F401 - imported once here, before the forks
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.INFO)
    # The agent logs a worker's failure with its traceback, and torch's log formatter imports
    # torch._dynamo to do so (~1.4 s, ~10 s on a loaded machine) in the middle of the restart:
    # that one log line is left out (the agent's INFO lines still say what happens).
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    plan = Plan(**plan_fields)
    summary = {}
    for name, kill in (("uninterrupted", False), ("killed", True)):
        run_folder = os.path.join(folder, name)
        os.makedirs(run_folder)
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=plan.world_size,
                              run_id=name, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0",
                              max_restarts=plan.max_restarts, monitor_interval=0.05,
                              start_method="fork",
                              logs_specs=DefaultLogsSpecs(log_dir=os.path.join(run_folder, "logs")))
        t0 = time.time()
        results = elastic_launch(config, job_worker)(run_folder, plan_fields, kill)
        summary[name] = {"t0": t0, "t1": time.time(), "results": results}
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f)


def _agent_process(folder: str, plan_fields: dict) -> None:
    """Body of the agent's process: its own process group (so that one signal stops it and
    every worker it forks), its output in ``folder/agent.log``, then :func:`_agent`."""
    os.setsid()
    log = os.open(os.path.join(folder, "agent.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(TMPDIR=folder, OMP_NUM_THREADS="1", LOGLEVEL="INFO")   # (its restarts)
    tempfile.tempdir = folder
    _agent(folder, plan_fields)


def run(plan: Plan = Plan(), timeout_s: float = 120.0) -> dict[str, Any]:
    """Run the job under torchrun's agent twice (uninterrupted, then with the kill) in a process
    of its own, forked from the course's forkserver (torch already imported); return
    :func:`timeline` of both. The temporary folder (checkpoints, logs) is removed and the
    agent's process group killed whatever happens."""
    import multiprocessing

    from course_utils import launch
    from course_utils.checkpoint import dcp as checkpoint
    from course_utils.runtime.validate import check_real

    if not isinstance(plan, Plan):
        raise ValueError(f"plan must be a lost_rank.Plan; got {type(plan).__name__}")
    check_real("timeout_s", timeout_s)  # seconds
    # (if nothing started it)
    launch.preload(*checkpoint.PRELOAD, "course_utils.checkpoint.lost_rank")
    launch.run(launch.ping, 1, timeout_s=timeout_s)                  # the forkserver, ready
    folder = tempfile.mkdtemp(prefix="course-lost-rank-")
    agent = multiprocessing.get_context("forkserver").Process(
        target=_agent_process, args=(folder, asdict(plan)))   # (not a daemon: it has children)
    agent.start()
    try:
        agent.join(timeout_s)
        output = ""
        if os.path.exists(os.path.join(folder, "agent.log")):
            with open(os.path.join(folder, "agent.log"), errors="replace") as f:
                output = f.read()
        if agent.exitcode is None:
            raise TimeoutError(f"the lost-rank job did not finish in {timeout_s:g} s; it was "
                               "stopped")
        if agent.exitcode != 0:
            raise RuntimeError(f"the torchrun agent failed (exit code {agent.exitcode}):\n"
                               + "\n".join(output.splitlines()[-15:]))
        return timeline(folder, output)
    finally:
        try:
            os.killpg(agent.pid, signal.SIGKILL)     # the agent and every worker it forked
        except (ProcessLookupError, PermissionError):
            pass
        agent.join(5)
        shutil.rmtree(folder, ignore_errors=True)


def _events(run_folder: str) -> list[dict[str, Any]]:
    events = []
    for name in sorted(os.listdir(run_folder)):
        if name.startswith("events.rank"):
            with open(os.path.join(run_folder, name)) as f:
                events += [json.loads(line) for line in f if line.strip()]
    return sorted(events, key=lambda e: e["t"])


def timeline(folder: str, agent_output: str = "") -> dict[str, Any]:
    """Both runs' events (seconds from each run's start) and what they add up to: each run's
    time, the kill, the restart (kill to the first step of the new attempt), the checkpoint it
    resumed from, and the steps redone; the agent's own lines about the failure."""
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    out: dict[str, Any] = {"agent": agent_output.splitlines()}
    for name, run_info in summary.items():
        events = _events(os.path.join(folder, name))
        t0 = run_info["t0"]
        for e in events:
            e["t"] = round(e["t"] - t0, 4)
        results = run_info["results"]
        # a run's time: from its ranks' first start to its end (the agent's own start-up, paid
        # once per process, is left out of both runs)
        first = min(e["t"] for e in events if e["event"] == "start")
        last = max(e["t"] for e in events if e["event"] == "done")
        out[name] = {"events": events, "total_s": last - first,
                     "losses": results["0"]["losses"] if "0" in results else
                     results[0]["losses"], "weights": (results.get("0") or results[0])["weights"]}
    killed = out["killed"]["events"]
    kill = next(e for e in killed if e["event"] == "killed")
    loaded = next(e for e in killed if e["event"] == "loaded")
    resumed = next(e for e in killed if e["event"] == "step" and e["attempt"] > 0)
    out["kill"] = {"rank": kill["rank"], "step": kill["step"], "t": kill["t"],
                   "resumed_from": loaded["step"], "restart_s": resumed["t"] - kill["t"],
                   "lost_s": out["killed"]["total_s"] - out["uninterrupted"]["total_s"]}
    return out


def predicted_lost_s(plan: Plan, restart_s: float) -> float:
    """Time lost to the kill: the work since the last checkpoint (``kill_step`` minus the last
    multiple of ``every``, plus the half step done when the rank died) at ``step_s`` a step,
    plus the restart."""
    last = plan.kill_step // plan.every * plan.every
    return (plan.kill_step - last + 0.5) * plan.step_s + restart_s


def draw(out: dict[str, Any], ax) -> None:
    """Both runs' timelines, one row per (run, rank): steps, saves, the kill, the restart."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from course_utils.style import PHASE_COLORS

    colors = {"step": PHASE_COLORS["forward"], "save": PHASE_COLORS["optimizer"],
              "start": PHASE_COLORS["idle"], "ready": PHASE_COLORS["data"],
              "loaded": PHASE_COLORS["forward"]}
    rows = [(name, rank) for name in ("uninterrupted", "killed")
            for rank in sorted({e["rank"] for e in out[name]["events"]})]
    for y, (name, rank) in enumerate(rows):
        events = [e for e in out[name]["events"] if e["rank"] == rank]
        for a, b in zip(events, events[1:] + [None]):
            end = b["t"] if b else a["t"]
            color = colors.get(a["event"])
            if color and end > a["t"]:
                ax.barh(y, end - a["t"], left=a["t"], color=color, height=0.6)
            if a["event"] == "killed":
                ax.plot(a["t"], y, "x", color=PHASE_COLORS["wait"], ms=9, mew=2)
    handles = [Patch(color=colors["start"], label="joining the group, a warm-up step"),
               Patch(color=colors["ready"], label="finding and loading the checkpoint"),
               Patch(color=colors["step"], label="training step"),
               Patch(color=colors["save"], label="saving a checkpoint"),
               Line2D([], [], marker="x", ls="", color=PHASE_COLORS["wait"], mew=2,
                      label="SIGKILL")]
    ax.set(yticks=range(len(rows)), yticklabels=[f"{n}, rank {r}" for n, r in rows],
           xlabel="seconds since the agent started the job")
    ax.invert_yaxis()
    ax.legend(handles=handles, fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0))


def _cli_main(folder: str) -> None:
    """``torchrun`` entry (one rank): the job, with the kill in attempt 0 (rank 1, step 6) when
    torchrun may restart it (``--max-restarts``). It joins its group itself, with the attempt's
    prefix, so it does not go through ``launch.torchrun_main``; it prints ``rank r returned: n``
    (the steps this attempt trained) as that does."""
    out = job_worker(folder, asdict(Plan(world_size=int(os.environ["WORLD_SIZE"]))), kill=True)
    sys.stdout.write(f"rank {os.environ['RANK']} returned: {len(out['losses'])}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    # torchrun --standalone --nproc-per-node 2 --max-restarts 1 \
    #     -m course_utils.checkpoint.lost_rank DIR
    _cli_main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="course-lost-"))
