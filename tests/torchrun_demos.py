"""Run several demo modules' ``__main__`` blocks in one torchrun job (for tests/test_launch.py).

    torchrun --standalone --nproc-per-node 2 -m tests.torchrun_demos OUT_DIR zero mesh ...

Each rank runs each module as ``python -m course_utils.MODULE`` would (runpy, ``__main__``, the
module's file as ``sys.argv[0]``), in turn, with its stdout and stderr in
``OUT_DIR/MODULE.rank<r>.out``. One job instead of one per module: torchrun's agent and the ranks
import torch once (a job costs about 7 CPU-seconds before any demo runs). Each demo joins its
own process group through torchrun's env:// variables, as in a job of its own; only
``MASTER_PORT`` names a fresh store that rank 0 hosts, because a second group on the agent's
store would find the first group's gloo addresses under the same keys. A demo that raises ends
the job (torchrun stops the other ranks); the files show how far it got (a demo that
returned normally ends its file with ``[torchrun_demos] MODULE finished``).
"""

from __future__ import annotations

import datetime
import os
import runpy
import sys
import time

import torch.distributed as dist

import course_utils


def main(out_dir: str, modules: list[str]) -> None:
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise RuntimeError("run under torchrun with its agent's store (--standalone or c10d)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, timeout = os.environ["MASTER_ADDR"], datetime.timedelta(seconds=120)
    agent = dist.TCPStore(host, int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    stores = []  # rank 0's servers stay up until every rank is done
    package = os.path.dirname(course_utils.__file__)
    for i, module in enumerate(modules):
        if rank == 0:
            stores.append(dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False,
                                        timeout=timeout))
            agent.set(f"demo/{i}/port", str(stores[-1].port))
        os.environ["MASTER_PORT"] = agent.get(f"demo/{i}/port").decode()
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(os.path.join(out_dir, f"{module}.rank{rank}.out"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.argv = [os.path.join(package, *module.split(".")) + ".py"]
        runpy.run_module(f"course_utils.{module}", run_name="__main__", alter_sys=True)
        print(f"[torchrun_demos] {module} finished")
        sys.stdout.flush()
        sys.stderr.flush()
    agent.add("demo/done", 1)  # rank 0 keeps the stores up until the last rank is done
    while rank == 0 and agent.add("demo/done", 0) < world:
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
