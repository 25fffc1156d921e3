"""Comparing frameworks on a pinned workload: the same MLP training step in PyTorch and in JAX.

The protocol, not the verdict, is the point. A :class:`Workload` pins everything both sides
must share: layer sizes, dtype (float32), global batch, initial weights and batches (numpy,
from one seed), learning rate (plain SGD), number of steps and of workers, and one thread per
worker. Then:

* **PyTorch**: DDP on ``workers`` gloo ranks started by ``course_utils.launch.run``
  (:func:`dp_rank_worker`), each rank on its ``global_batch / workers`` rows, torch set to one
  thread per rank. No compilation: the set-up time reported is building the model and DDP.
* **JAX**: one process with ``workers`` CPU devices, params replicated, the batch split over a
  ``"data"`` mesh axis, one ``jit``-compiled step; run in a fresh Python process
  (:func:`run_jax`) so that its ``XLA_FLAGS`` (device count, one thread per device:
  ``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``) hold whatever the
  caller's process already imported. Compilation is timed separately.

Both record every step's loss (the global batch's mean squared error before the update) and
every step's wall time; the first ``warmup`` steps are left out of the step time. The losses
must agree to :data:`LOSS_RTOL`. What this measures: these two programs, this workload, this
machine, these versions (printed with the table). It ranks nothing beyond that: a larger model,
another batch, a GPU, other thread settings or another version can reverse it.

Run it from a shell: ``python benchmarks/framework_compare.py``. JAX is imported only in the
subprocess (``python -m course_utils.jax_sharding.framework_compare --jax '<workload json>'``).
Lecture 8 (JAX), section 8.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from course_utils.runtime.validate import check_int, check_real

__all__ = ["LOSS_RTOL", "Workload", "init_params", "batches", "dp_rank_worker", "run_torch",
           "run_jax", "compare", "table", "machine"]

LOSS_RTOL = 1e-5   # relative agreement of the two loss curves (float32, different sum orders)


@dataclass(frozen=True)
class Workload:
    """Everything both frameworks must share."""

    sizes: tuple[int, ...] = (64, 256, 64)
    global_batch: int = 256
    steps: int = 20
    warmup: int = 3
    lr: float = 0.05
    seed: int = 0
    workers: int = 8
    threads_per_worker: int = 1
    dtype: str = "float32"

    def __post_init__(self) -> None:
        sizes = self.sizes
        if (not isinstance(sizes, (tuple, list)) or len(sizes) < 2
                or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)):
            raise ValueError(f"sizes must be a tuple of at least 2 ints >= 1; got {sizes!r}")
        object.__setattr__(self, "sizes", tuple(sizes))
        for name in ("global_batch", "steps", "workers", "threads_per_worker"):
            check_int(name, getattr(self, name))
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or not (
                0 <= self.warmup < self.steps):
            raise ValueError(f"warmup must be an int from 0 to steps - 1 = {self.steps - 1}; "
                             f"got {self.warmup!r}")
        if self.global_batch % self.workers:
            raise ValueError(f"global_batch = {self.global_batch} must be divisible by "
                             f"workers = {self.workers} (equal shards)")
        if self.dtype != "float32":
            raise ValueError(f"dtype must be 'float32' (the only one pinned); got {self.dtype!r}")
        if not isinstance(self.lr, (int, float)) or isinstance(self.lr, bool) or self.lr <= 0:
            raise ValueError(f"lr must be a positive number; got {self.lr!r}")
        check_real("lr", self.lr)  # (finite, too)
        check_int("seed", self.seed, 0)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def _check_workload(w: object) -> Workload:
    if not isinstance(w, Workload):
        raise TypeError(f"w must be a Workload (framework_compare.Workload(...)); got "
                        f"{type(w).__name__}")
    return w


def init_params(w: Workload) -> list[np.ndarray]:
    """Initial weights (``Y = X W`` layout) and biases, float32, from ``w.seed``."""
    _check_workload(w)
    rng = np.random.default_rng(w.seed)
    params = []
    for fan_in, fan_out in zip(w.sizes[:-1], w.sizes[1:]):
        params.append((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32))
        params.append(np.zeros(fan_out, dtype=np.float32))
    return params


def batches(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (steps, global_batch, in) and targets (steps, global_batch, out), float32."""
    _check_workload(w)
    rng = np.random.default_rng(10_000 + w.seed)
    x = rng.standard_normal((w.steps, w.global_batch, w.sizes[0])).astype(np.float32)
    y = rng.standard_normal((w.steps, w.global_batch, w.sizes[-1])).astype(np.float32)
    return x, y


def _summary(losses: list[float], times: list[float], w: Workload) -> dict:
    timed = times[w.warmup:]
    return {"losses": losses, "step_times_s": times,
            "step_s_median": statistics.median(timed), "step_s_min": min(timed),
            "first_step_s": times[0]}


# ------------------------------------------------------------------------------------- PyTorch


def dp_rank_worker(rank: int, world_size: int, workload: dict) -> dict:
    """One DDP rank of the pinned workload: its rows of every batch; per-step local loss and
    step time (after a barrier), and the time to build the model and DDP."""
    check_int("world_size", world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int from 0 to world_size - 1 = {world_size - 1}; "
                         f"got {rank!r}")
    if not isinstance(workload, dict):
        raise TypeError(f"workload must be a dict (dataclasses.asdict of a Workload); got "
                        f"{type(workload).__name__}")
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_utils.runtime import backend

    w = Workload(**workload)
    torch.set_num_threads(w.threads_per_worker)
    start = time.perf_counter()
    layers: list[nn.Module] = []
    params = init_params(w)
    for k in range(len(params) // 2):
        lin = nn.Linear(*params[2 * k].shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(params[2 * k].T))   # nn.Linear stores W^T
            lin.bias.copy_(torch.from_numpy(params[2 * k + 1]))
        layers += [lin, nn.Tanh()]
    dev = backend.device()  # the CPU: run_torch asks for gloo, as JAX runs on CPU devices here
    model = DDP(nn.Sequential(*layers[:-1]).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=w.lr)
    setup_s = time.perf_counter() - start
    xs, ys = batches(w)
    local = w.global_batch // world_size
    rows = slice(rank * local, (rank + 1) * local)
    losses, times = [], []
    for step in range(w.steps):
        x, y = backend.to_device((torch.from_numpy(xs[step, rows]),
                                  torch.from_numpy(ys[step, rows])), dev)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ((model(x) - y) ** 2).mean()       # this rank's rows; DDP averages the grads
        loss.backward()                           # gradient all-reduce (DDP buckets)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return {"losses": losses, "times": times, "setup_s": setup_s,
            "threads": torch.get_num_threads()}


def run_torch(w: Workload, timeout_s: float = 120.0) -> dict:
    """The PyTorch side: DDP on ``w.workers`` gloo ranks. Per step: the mean of the ranks'
    losses (equal shards: the global batch's loss) and the slowest rank's time."""
    _check_workload(w)
    check_real("timeout_s", timeout_s)
    import functools

    import torch

    from course_utils import launch

    start = time.perf_counter()
    ranks = launch.run(functools.partial(dp_rank_worker, workload=dataclasses.asdict(w)),
                       w.workers, timeout_s=timeout_s, threads_per_rank=w.threads_per_worker,
                       show_output=False, backend="gloo")  # CPU, like the JAX side
    wall_s = time.perf_counter() - start
    losses = [float(np.mean([r["losses"][s] for r in ranks])) for s in range(w.steps)]
    times = [max(r["times"][s] for r in ranks) for s in range(w.steps)]
    out = _summary(losses, times, w)
    out.update({"framework": "PyTorch DDP", "setup_s": max(r["setup_s"] for r in ranks),
                "compile_s": None, "launch_wall_s": wall_s,
                "workers": f"{w.workers} gloo ranks",
                "threads": ranks[0]["threads"], "version": f"torch {torch.__version__}"})
    return out


# ----------------------------------------------------------------------------------------- JAX


def _jax_flags(w: Workload) -> str:
    flags = [f"--xla_force_host_platform_device_count={w.workers}"]
    if w.threads_per_worker == 1:
        flags += ["--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1"]
    else:
        flags += [f"intra_op_parallelism_threads={w.threads_per_worker}"]
    return " ".join(flags)


def _jax_main(w: Workload) -> dict:
    """The JAX side, run in this (fresh) process: XLA_FLAGS must already be set."""
    # JAX first, on purpose: run_jax set this process's XLA_FLAGS (the workload's device
    # count), and course_utils.jax_sharding.devices leaves the flags of a process that already
    # imported JAX as they are.
    import jax
    import jax.numpy as jnp

    from course_utils.jax_sharding.hlo import collective_names
    from course_utils.jax_sharding.mlp import mse
    from course_utils.jax_sharding.shardings import P, make_mesh, place

    mesh = make_mesh((w.workers,), ("data",))
    params = [place(p, mesh, P()) for p in init_params(w)]
    xs, ys = batches(w)

    def step(params, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        return [p - w.lr * g for p, g in zip(params, grads)], loss

    x0, y0 = place(xs[0], mesh, P("data")), place(ys[0], mesh, P("data"))
    start = time.perf_counter()
    compiled = jax.jit(step).lower(params, x0, y0).compile()
    compile_s = time.perf_counter() - start
    names = collective_names(compiled.as_text())
    losses, times = [], []
    for s in range(w.steps):
        x, y = place(xs[s], mesh, P("data")), place(ys[s], mesh, P("data"))
        jax.block_until_ready((x, y))
        t0 = time.perf_counter()
        params, loss = compiled(params, x, y)
        loss = float(jax.block_until_ready(loss))
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    out = _summary(losses, times, w)
    import jaxlib
    out.update({"framework": "JAX jit", "compile_s": compile_s, "setup_s": None,
                "workers": f"{len(jax.devices())} CPU devices, 1 process",
                "threads": 1 if w.threads_per_worker == 1 else w.threads_per_worker,
                "collectives": names, "dtype": str(jnp.zeros(1).dtype),
                "version": f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"})
    return out


def run_jax(w: Workload, timeout_s: float = 120.0) -> dict:
    """The JAX side in a fresh Python process with the workload's XLA_FLAGS."""
    _check_workload(w)
    check_real("timeout_s", timeout_s)
    env = dict(os.environ, XLA_FLAGS=_jax_flags(w), OMP_NUM_THREADS=str(w.threads_per_worker),
               JAX_PLATFORMS="cpu")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "course_utils.jax_sharding.framework_compare",
                           "--jax", w.to_json()], capture_output=True, text=True, env=env,
                          timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the JAX side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["launch_wall_s"] = time.perf_counter() - start
    return out


# ------------------------------------------------------------------------------------ protocol


def machine() -> dict:
    """What ran it: CPU model, core count, OS, Python."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "os": f"{platform.system()} "
            f"{platform.release()}", "python": platform.python_version()}


def compare(w: Workload | None = None, timeout_s: float = 120.0) -> dict:
    """Run both sides of ``w`` (default :class:`Workload`); their losses must agree to
    :data:`LOSS_RTOL` (else AssertionError). Returns both results, the largest relative loss
    difference, the workload and the machine."""
    w = Workload() if w is None else w
    if not isinstance(w, Workload):
        raise TypeError(f"w must be a Workload; got {type(w).__name__}")
    check_real("timeout_s", timeout_s)
    torch_side, jax_side = run_torch(w, timeout_s), run_jax(w, timeout_s)
    rel = max(abs(a - b) / max(abs(b), 1e-12)
              for a, b in zip(torch_side["losses"], jax_side["losses"]))
    if not rel <= LOSS_RTOL:
        raise AssertionError(f"the two loss curves differ by {rel:.2e} (relative), more than "
                             f"{LOSS_RTOL:.0e}: the workloads are not the same")
    return {"workload": w, "torch": torch_side, "jax": jax_side, "loss_rel_diff": rel,
            "machine": machine()}


def table(result: dict) -> str:
    """The pinned-workload table: step time, compile / set-up time, the loss at the last step N
    (computed before that step's update: the loss after N - 1 updates), versions."""
    keys = {"workload", "torch", "jax", "loss_rel_diff", "machine"}
    if not isinstance(result, dict) or not keys <= set(result):
        raise ValueError(f"result must be compare()'s dict, with keys {sorted(keys)}; got "
                         f"{sorted(result) if isinstance(result, dict) else type(result).__name__}")
    _check_workload(result["workload"])
    w, m = result["workload"], result["machine"]
    lines = [f"workload: MLP {' -> '.join(map(str, w.sizes))} (tanh), {w.dtype}, global batch "
             f"{w.global_batch}, SGD lr {w.lr}, {w.steps} steps ({w.warmup} warm-up steps "
             f"not timed), seed {w.seed}, {w.workers} workers x {w.threads_per_worker} thread",
             f"machine : {m['cpu']}, {m['cores']} cores, {m['os']}, Python {m['python']}",
             f"{'':<12} {'step (median)':>14} {'compile':>9} {'set-up':>8} "
             f"{'loss at step ' + str(w.steps):>17}  version"]
    for side in (result["torch"], result["jax"]):
        comp = "-" if side["compile_s"] is None else f"{side['compile_s']:.2f} s"
        setup = "-" if side["setup_s"] is None else f"{side['setup_s']:.2f} s"
        lines.append(f"{side['framework']:<12} {side['step_s_median'] * 1e3:>11.2f} ms "
                     f"{comp:>9} {setup:>8} {side['losses'][-1]:>17.7f}  {side['version']}")
    lines.append(f"loss curves agree to {result['loss_rel_diff']:.1e} (relative; tolerance "
                 f"{LOSS_RTOL:.0e}); JAX step's collectives: "
                 f"{', '.join(result['jax']['collectives']) or 'none'}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--jax":
        print(json.dumps(_jax_main(Workload(**json.loads(sys.argv[2])))))
    else:
        print(table(compare()))
