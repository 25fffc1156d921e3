"""A lost node: two torchrun agents, one killed whole, and the job goes on without it.

Most interruptions at scale are hardware: of Llama 3 405B's 419 unexpected interruptions in 54 days,
78 % were confirmed or suspected hardware issues, a faulty GPU 30.1 % and its HBM3 memory 17.2 %
(Llama Team 2024, "The Llama 3 Herd of Models", Table 5). A restart on the same node meets the same
GPU again (lecture 12's :mod:`course_utils.checkpoint.lost_rank` restarts every rank where it was);
the cure is to leave the bad host out. torchrun does that when its job is *elastic*: with
``--nnodes 1:2`` and a c10d rendezvous, each node's agent joins a rendezvous that closes with
between 1 and 2 nodes, and when a node is lost, the agents left start a new round without it and
the job goes on with fewer ranks.

:func:`run` starts two agents on this machine, two "nodes" (torchrun's own agent,
``torch.distributed.launcher.api.elastic_launch``, each in a process group of its own; node
"a" hosts the rendezvous store: ``rdzv_configs={"is_host": ...}``), one rank each. In the first
round, node "b"'s rank sends SIGKILL to its node's whole process group in the middle of step
``kill_step``: the agent and its rank die together, as when a host goes down. Node "a"'s rank
fails on its next collective, its agent starts a new round (``max_restarts``), which closes with
one node ``last_call_s`` seconds after it is reached, and the job goes on on one rank, resumed
from the last checkpoint. The run is :class:`course_utils.checkpoint.resume_job.Job` with the global
sampler (``sampler="global"``, no dropout): the same global batch on 2 ranks or 1, so its
losses follow the uninterrupted run's (``resume_job.reference_run``) up to float reduction
order. :func:`node_worker` logs its events (start, steps, saves, load, kill) with wall-clock
times to a file per rank and attempt, which outlives the process; :func:`summary` reads them.

The same worker under the ``torchrun`` command, two shells on one machine started within a few
seconds of each other (the first round waits ``last_call_timeout`` for the second node; the
second node is killed with its rank in step 3)::

    torchrun --nnodes 1:2 --nproc-per-node 1 --max-restarts 1 --rdzv-backend c10d \\
        --rdzv-id lost-node --rdzv-endpoint 127.0.0.1:29411 --rdzv-conf \\
        is_host=1,last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2 \\
        -m course_utils.checkpoint.lost_node a FOLDER
    torchrun (the same, with is_host=0) -m course_utils.checkpoint.lost_node b FOLDER
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Plan", "node_worker", "run", "summary"]

NODES = ("a", "b")   # "a" hosts the rendezvous store and survives; "b" is lost


@dataclass(frozen=True)
class Plan:
    """The job (``resume_job.Job``, global batch 8, ``steps`` steps), its checkpoint interval
    ``every``, each step padded to ``step_s`` seconds, the step in which node "b" dies; how
    long a round waits for more nodes once it has one (``last_call_s``), and when a silent
    node is dead: its last heartbeat older than ``keep_alive_s x keep_alive_attempts``
    (``_sanitize`` in ``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``; torchrun's
    defaults are 5 s x 3 and a last call of 30 s)."""

    steps: int = 6
    every: int = 2
    step_s: float = 0.05
    kill_step: int = 3
    last_call_s: int = 1
    keep_alive_s: int = 1
    keep_alive_attempts: int = 2

    def __post_init__(self) -> None:
        from course_utils.runtime.validate import check_int, check_real

        for name in ("steps", "every", "last_call_s", "keep_alive_s", "keep_alive_attempts"):
            check_int(name, getattr(self, name))
        check_real("step_s", self.step_s)
        if not 0 < self.kill_step < self.steps:
            raise ValueError(f"kill_step must be a step from 1 to {self.steps - 1}; got "
                             f"{self.kill_step!r}")

    def job(self, world_size: int):
        from course_utils.checkpoint.resume_job import Job

        return Job(world_size=2, rows=4, steps=self.steps, dropout=0.0,
                   sampler="global").resized(world_size)


def _log(folder: str, event: str, **fields: Any) -> None:
    line = json.dumps({"t": time.time(), "event": event, "pid": os.getpid(), **fields})
    name = f"events.{os.environ.get('COURSE_NODE', '?')}.jsonl"
    with open(os.path.join(folder, name), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())       # the line must survive the SIGKILL right after it


def node_worker(folder: str, plan_fields: dict) -> dict[str, Any]:
    """One rank of the elastic job (env:// from its agent): join the round's group, resume
    from the newest checkpoint in ``folder/ckpt`` with the per-rank pieces left out (the world
    may have shrunk), train, save every ``plan.every`` steps; the rank of node "b" kills its
    node in the first round. Returns this attempt's losses and the step it started from."""
    import warnings

    import torch
    import torch.distributed as dist

    from course_utils.checkpoint import dcp as checkpoint
    from course_utils.checkpoint import resume_job

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    plan = Plan(**plan_fields)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    node = os.environ.get("COURSE_NODE", "?")
    _log(folder, "start", rank=rank, world=world, attempt=attempt)
    # (as in lost_rank: the agent's store outlives a round; a prefix per attempt keeps the new
    # ranks from meeting the dead ones' addresses)
    store = dist.PrefixStore(f"attempt{attempt}", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    job, root = plan.job(world), os.path.join(folder, "ckpt")
    trainer = resume_job.fresh(job, rank, world)
    found = checkpoint.latest(root)
    if found is not None:
        checkpoint.load(trainer, found[1], omit=checkpoint.PER_RANK)
        _log(folder, "loaded", rank=rank, attempt=attempt, step=found[0])
    start, losses = trainer.step, []
    while trainer.step < job.steps:
        t0, step = time.time(), trainer.step
        _log(folder, "step", rank=rank, attempt=attempt, step=step, world=world)
        losses += resume_job.train(trainer, step + 1)
        if node == "b" and attempt == 0 and step == plan.kill_step:
            time.sleep(max(0.0, t0 + plan.step_s / 2 - time.time()))
            _log(folder, "killed", rank=rank, attempt=attempt, step=step)
            # the node: its agent (this rank's parent) first, then this rank and whatever shares
            # its process group (under the torchrun command a rank has a group of its own)
            os.kill(os.getppid(), signal.SIGKILL)
            os.killpg(os.getpgid(0), signal.SIGKILL)
        time.sleep(max(0.0, t0 + plan.step_s - time.time()))
        if trainer.step % plan.every == 0 and trainer.step < job.steps:
            checkpoint.save(trainer, checkpoint.step_folder(root, trainer.step))
            dist.barrier()
            _log(folder, "saved", rank=rank, attempt=attempt, step=trainer.step)
    _log(folder, "done", rank=rank, attempt=attempt, step=trainer.step, world=world)
    dist.destroy_process_group()
    return {"losses": losses, "from": start, "world": world}


def _node(folder: str, name: str, port: int, plan_fields: dict) -> None:
    """One node's agent process: a process group of its own (its rank joins it), output in
    ``folder/agent_<name>.log``, torchrun's agent with an elastic c10d rendezvous."""
    import logging

    os.setsid()
    log = os.open(os.path.join(folder, f"agent_{name}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(TMPDIR=folder, OMP_NUM_THREADS="1", LOGLEVEL="INFO", COURSE_NODE=name)
    tempfile.tempdir = folder

    import torch.distributed.checkpoint  # noqa: F401 - imported once here, before the fork
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # (as in lost_rank: the failure's log line would import torch._dynamo mid-restart)
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    config = LaunchConfig(
        min_nodes=1, max_nodes=len(NODES), nproc_per_node=1, run_id="lost-node",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_configs={"is_host": name == NODES[0], "join_timeout": 60,
                      "last_call_timeout": plan_fields["last_call_s"],
                      "keep_alive_interval": plan_fields["keep_alive_s"],
                      "keep_alive_max_attempt": plan_fields["keep_alive_attempts"]},
        max_restarts=1, monitor_interval=0.05,
        start_method="fork", logs_specs=DefaultLogsSpecs(log_dir=os.path.join(folder,
                                                                              f"logs_{name}")))
    results = elastic_launch(config, node_worker)(folder, plan_fields)
    with open(os.path.join(folder, f"result_{name}.part"), "w") as f:
        json.dump({str(k): v for k, v in results.items()}, f)
    os.replace(os.path.join(folder, f"result_{name}.part"),       # (whole, or not there)
               os.path.join(folder, f"result_{name}.json"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(plan: Plan = Plan(), timeout_s: float = 180.0) -> dict[str, Any]:
    """Start the two nodes' agents (forked from the course's forkserver: torch already
    imported), let node "b" die, wait for node "a" to finish; return :func:`summary` and
    ``pids``, every agent's and rank's process id. The temporary folder is removed and both
    process groups killed whatever happens."""
    import multiprocessing

    from course_utils import launch
    from course_utils.checkpoint import dcp as checkpoint
    from course_utils.runtime.validate import check_real

    if not isinstance(plan, Plan):
        raise ValueError(f"plan must be a lost_node.Plan; got {type(plan).__name__}")
    check_real("timeout_s", timeout_s)
    launch.preload(*checkpoint.PRELOAD, "course_utils.checkpoint.lost_node")
    launch.run(launch.ping, 1, timeout_s=timeout_s)                  # the forkserver, ready
    folder = tempfile.mkdtemp(prefix="course-lost-node-")
    port, ctx, agents = _free_port(), multiprocessing.get_context("forkserver"), []
    try:
        t0 = time.time()
        for name in NODES:
            agents.append(ctx.Process(target=_node, args=(folder, name, port, asdict(plan))))
            agents[-1].start()
        result, deadline = os.path.join(folder, "result_a.json"), time.monotonic() + timeout_s
        while not os.path.exists(result) and agents[0].exitcode is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the lost-node job did not finish in {timeout_s:g} s; "
                                   "stopped")
            time.sleep(0.05)
        # (once the result is there, the agent's own exit, about 2 s of interpreter teardown,
        # is not waited for: the finally below kills it)
        if not os.path.exists(result):
            with open(os.path.join(folder, "agent_a.log"), errors="replace") as f:
                tail = f.read().splitlines()[-15:]
            raise RuntimeError(f"node a's agent failed (exit code {agents[0].exitcode}):\n"
                               + "\n".join(tail))
        out = summary(folder, plan, t0)
        out["wall_s"] = time.time() - t0
    finally:
        for agent in agents:
            try:
                os.killpg(agent.pid, signal.SIGKILL)     # the agent and every rank it forked
            except (ProcessLookupError, PermissionError):
                pass
            agent.join(5)
        shutil.rmtree(folder, ignore_errors=True)
    out["pids"] = sorted({a.pid for a in agents} | {e["pid"] for e in out["events"]})
    return out


def summary(folder: str, plan: Plan, t0: float) -> dict[str, Any]:
    """The events (seconds since ``t0``) and what they add up to: the world size of each
    attempt, the kill, the checkpoint resumed from, the time from the kill to the first step
    on the smaller world, the steps redone, and the losses after the resume beside the
    uninterrupted run's (``resume_job.reference_run``: the same global batches)."""
    from course_utils.checkpoint import resume_job

    events = []
    for name in NODES:
        path = os.path.join(folder, f"events.{name}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                events += [dict(json.loads(line), node=name) for line in f if line.strip()]
    events.sort(key=lambda e: e["t"])
    for e in events:
        e["t"] = round(e["t"] - t0, 4)
    with open(os.path.join(folder, "result_a.json")) as f:
        [result] = json.load(f).values()
    kill = next(e for e in events if e["event"] == "killed")
    resumed = next(e for e in events if e["event"] == "step" and e["attempt"] > 0)
    reference = resume_job.reference_run(plan.job(2))["losses"]
    after = reference[result["from"]:]
    return {"events": events, "kill": kill, "resumed_from": result["from"],
            "worlds": sorted({(e["attempt"], e["world"]) for e in events
                              if e["event"] == "start"}),
            "restart_s": resumed["t"] - kill["t"], "redone": kill["step"] + 1 - result["from"],
            "losses": result["losses"], "reference": after,
            "largest_difference": max(abs(a - b) / abs(b)
                                      for a, b in zip(result["losses"], after))}


def _cli_main(node: str, folder: str) -> None:
    """``torchrun`` entry (one rank): :func:`node_worker` for node ``node`` ("a" or "b")."""
    os.environ["COURSE_NODE"] = node
    out = node_worker(folder, asdict(Plan()))
    sys.stdout.write(f"rank {os.environ['RANK']} returned: {len(out['losses'])}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _cli_main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(
        prefix="course-lost-node-"))
