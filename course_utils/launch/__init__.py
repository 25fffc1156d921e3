"""Start a function on several ranks on this machine: the one launcher the course uses.

Every lecture that starts ranks (lectures 2 to 12) and the assignments' harnesses use it.

``run(fn, world_size, *args)`` calls ``fn(rank, world_size, *args)`` in ``world_size`` fresh
processes joined into one process group, and returns the ranks' return values in rank order.
The group is NCCL with one CUDA device per rank when the machine has enough GPUs, gloo on CPU
otherwise (:func:`resolve_backend`; ``backend=`` overrides). A worker puts its tensors on
:func:`device`, so the same worker code runs on a laptop and on a GPU box.

Guarantees (each one has a test in ``tests/test_launch.py``):

* **Fast.** Ranks are forked from a forkserver that has already imported torch, so after the
  first launch in a kernel a small job starts in a fraction of a second.
* **Bounded.** A rank that raises makes ``run`` raise :class:`RankError` naming the rank that
  failed first, with its traceback. A rank that hangs (in Python or in a collective), never joins,
  or dies makes ``run`` raise within ``timeout_s``; a hung rank's stack is shown. An interrupt
  (Ctrl-C, a notebook cell timeout) kills every rank. Ranks also kill themselves if the process
  that launched them dies, so no process is ever left behind.
* **Readable.** Each rank's printed output is captured and printed after the join, in rank
  order, with a ``[rank r]`` prefix, so a notebook shows the same text on every run. A rank's
  error shows the student's own frames with their source lines (notebook cells included: the
  cells' text travels with ``fn``), library frames folded to one line each run; the launcher's
  own frames are hidden from IPython's traceback. An interrupt says which ranks it stopped.
* **Concurrent.** The rendezvous store listens on a port the OS picks, so launches in two
  notebooks or test processes at once never collide.
* **Student code.** ``fn`` may be defined in a notebook cell: it is sent to the ranks by value
  (cloudpickle), which works with the forkserver and spawn start methods (Linux and macOS).

The same worker runs under torchrun (the real launcher used on clusters)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.launch course_utils.launch:ping

which calls :func:`torchrun_main`; demo modules also call it from their ``__main__`` block.
Across nodes, start the same command on every node with a shared rendezvous instead of
``--standalone``::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d \
        --rdzv-endpoint HOST:29500 -m course_utils.launch course_utils.launch:ping

(``scripts/cluster.sbatch`` does this under Slurm.)

Modules: :mod:`~course_utils.launch.launcher` (:func:`run`, :data:`MAX_WORLD_SIZE`),
:mod:`~course_utils.launch.forkserver` (:func:`preload`, :func:`start_forkserver`,
:data:`PRELOAD`), :mod:`~course_utils.launch.rank` (a rank process's body),
:mod:`~course_utils.launch.reports` (:class:`RankError`, :class:`LaunchTimeout`, the ranks'
output), :mod:`~course_utils.launch.tracebacks` (what a student reads when a rank fails or
hangs), :mod:`~course_utils.launch.torchrun` (:func:`torchrun_main`, :func:`ping`).
:func:`resolve_backend`, :func:`device` and :data:`BACKENDS` live in
:mod:`course_utils.runtime.backend`.
"""

# the names of the former course_utils.launch module
from course_utils.launch.forkserver import (  # noqa: F401
    PRELOAD, PRELOAD_LIGHT, preload, start_forkserver,
)
from course_utils.launch.launcher import MAX_WORLD_SIZE, run  # noqa: F401
from course_utils.launch.reports import LaunchTimeout, RankError  # noqa: F401
from course_utils.launch.torchrun import ping, torchrun_main  # noqa: F401
from course_utils.runtime.backend import BACKENDS, device, resolve_backend  # noqa: F401

__all__ = ["run", "RankError", "LaunchTimeout", "torchrun_main", "ping", "MAX_WORLD_SIZE",
           "BACKENDS", "resolve_backend", "device", "start_forkserver", "preload"]
