"""torchrun support: the same worker on torchrun, the launcher used on clusters.

Every lecture's demo modules run under it; lecture 11 runs them across nodes.

:func:`torchrun_main` runs ``fn(rank, world_size, *args)`` as one rank of a torchrun job (demo
modules call it from their ``__main__`` block); :func:`ping` is a trivial job;
:func:`main` is ``python -m course_utils.launch package.module:function [int args...]``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Sequence

from course_utils.runtime.backend import device, init_process_group, resolve_backend, to_cpu

__all__ = ["torchrun_main", "ping", "resolve_worker", "main"]


def torchrun_main(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(rank, world_size, *args)`` as one rank of a torchrun job (env:// rendezvous).

    The backend is ``$COURSE_BACKEND`` (default "auto": NCCL when every local rank has its own
    CUDA device, gloo otherwise), so the same command runs on a laptop, a GPU box and, with
    ``--nnodes``, a cluster. Prints ``rank r returned: <value>`` and returns the value.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    init_process_group(resolve_backend(os.environ.get("COURSE_BACKEND", "auto"), local_world),
                       local_rank)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        value = to_cpu(fn(rank, world_size, *args))
        # One write per line: the ranks share torchrun's stdout, and print() writes the text
        # and its newline separately, so two ranks' lines could interleave.
        sys.stdout.write(f"rank {rank} returned: {value}\n")
        sys.stdout.flush()
        return value
    finally:
        dist.destroy_process_group()


def ping(rank: int, world_size: int) -> int:
    """A trivial job: all-reduce each rank's number; every rank returns 0 + 1 + ... + (ws - 1)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank], device=device())
    dist.all_reduce(t)
    return int(t.item())


def resolve_worker(spec: str) -> Callable[..., Any]:
    """The function ``spec`` names as ``package.module:function``."""
    if ":" not in spec:
        raise ValueError(f"expected 'package.module:function', got {spec!r}")
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def main(argv: Sequence[str], usage: str) -> None:
    """``torchrun ... -m course_utils.launch package.module:function [int args...]``: run that
    function on this rank with the arguments (those that look like ints as ints); with no
    arguments, exit showing ``usage``."""
    if len(argv) < 1:
        sys.exit(usage)
    cli_args = [int(a) if a.lstrip("-").isdigit() else a for a in argv[1:]]
    torchrun_main(resolve_worker(argv[0]), *cli_args)
