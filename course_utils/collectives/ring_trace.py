"""Module 2's collectives step by step: what each rank sends and holds at every step of the
course's ring, recorded once on real gloo ranks and replayed by the stepper widget
(:mod:`course_utils.widgets.ring_steps`).

The ring is :mod:`course_utils.collectives.ring`'s textbook version: its reduce-scatter phase and
its all-gather phase (one blocking exchange per step), which append each step to a ``trace``
list: the shard sent and the one received, their bytes, and a copy of the rank's tensor after
the step. An all-reduce is the two phases; the reduce-scatter and the all-gather are one phase
each (the ring's all-gather starts where its reduce-scatter ends: rank r holds shard
(r + 1) mod D). The all-to-all is the pairwise exchange of :func:`pairwise_all_to_all`.

The inputs make every value say where it came from: each element of rank r's tensor is 2^r, so
a sum of contributions is the bitmask of the ranks it came from (exact in float32), and 0 means
nothing yet (a shard the all-gather has not brought). :func:`record` runs the four collectives
on D ranks and decodes every step into those masks (one per shard, after checking that every
element of the shard agrees); :func:`load` reads the recording committed in
``course_utils/data/ring_traces.json``, which ``python -m course_utils.collectives.ring_trace``
writes and ``tests/test_ring_trace.py`` compares with a fresh run.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.runtime import backend
from course_utils.collectives.cost import ring_bytes_per_rank
from course_utils.collectives.primitives import shard_bounds
from course_utils.collectives.ring import RingStats, all_gather_phase, reduce_scatter_phase
from course_utils.runtime.validate import check_int, one_of

__all__ = ["COLLECTIVES", "WORLD_SIZES", "NUMEL", "PATH", "Step", "Trace",
           "pairwise_all_to_all", "trace_worker", "record", "record_all", "load", "trace",
           "ranks_of"]

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
WORLD_SIZES = tuple(range(2, 9))   # the D the recording covers
NUMEL = 840                        # float32 elements per rank: every D from 2 to 8 divides it
PATH = Path(__file__).resolve().parent.parent / "data" / "ring_traces.json"


@dataclass(frozen=True)
class Step:
    """One step of a collective on every rank: ``sends[r]`` = (shard rank r sent, the rank it
    went to, bytes), ``holds[r][c]`` = bitmask of the ranks whose data shard c of rank r holds
    after the step (0: nothing)."""

    phase: str
    sends: tuple[tuple[int, int, int], ...]
    holds: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Trace:
    """A collective on ``world_size`` ranks as recorded: what each rank held at the start and
    after each of its steps; each rank's tensor is ``numel`` float32 elements in D shards."""

    collective: str
    world_size: int
    numel: int
    start: tuple[tuple[int, ...], ...]
    steps: tuple[Step, ...]

    def holds(self, k: int) -> tuple[tuple[int, ...], ...]:
        """What every rank holds after ``k`` steps (0: the start)."""
        check_int("k", k, 0)
        if k > len(self.steps):
            raise ValueError(f"k must be from 0 to {len(self.steps)} (the steps of this trace); "
                             f"got {k}")
        return self.start if k == 0 else self.steps[k - 1].holds

    def sent_so_far(self, k: int) -> list[int]:
        """Bytes each rank has sent in the first ``k`` steps."""
        self.holds(k)
        return [sum(s.sends[r][2] for s in self.steps[:k]) for r in range(self.world_size)]


def ranks_of(mask: int) -> list[int]:
    """The ranks a bitmask names: ``ranks_of(0b101) == [0, 2]``."""
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


# ------------------------------------------------------------------------------- all-to-all


def pairwise_all_to_all(flat: torch.Tensor, trace: list | None = None) -> RingStats:
    """All-to-all in place on 1-D ``flat`` (N,) cut into D shards over the default group: before,
    shard j is this rank's data for rank j; after, it is rank j's data for this rank. D - 1
    steps: at step k (1 to D - 1) rank r sends shard (r + k) mod D to rank r + k and receives
    rank r - k's shard for it into shard (r - k) mod D. ``trace``: as the ring phases'."""
    if not isinstance(flat, torch.Tensor) or flat.dim() != 1:
        raise ValueError(f"flat must be a 1-D torch.Tensor; got {type(flat).__name__}")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    bounds = shard_bounds(flat.numel(), world_size)
    original = flat.clone()  # (N,): a shard sent late may have been received into already
    stats = RingStats()
    for k in range(1, world_size):
        to, source = (rank + k) % world_size, (rank - k) % world_size
        send_lo, send_hi = bounds[to]
        recv_lo, recv_hi = bounds[source]
        outgoing = original[send_lo:send_hi]
        incoming = flat.new_empty(recv_hi - recv_lo)
        ops = []
        if send_hi > send_lo:
            ops.append(dist.P2POp(dist.isend, outgoing, to))
        if recv_hi > recv_lo:
            ops.append(dist.P2POp(dist.irecv, incoming, source))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        flat[recv_lo:recv_hi] = incoming
        step = RingStats(outgoing.numel() * flat.element_size(),
                         incoming.numel() * flat.element_size(), 1)
        stats = stats.add(step)
        if trace is not None:
            trace.append({"step": k - 1, "send": to, "recv": source, "sent_bytes": step.bytes_sent,
                          "received_bytes": step.bytes_received, "flat": flat.detach().clone()})
    return stats


# ---------------------------------------------------------------------------------- recording


def _masks(flat: torch.Tensor, world_size: int) -> list[int]:
    """The bitmask each shard of ``flat`` holds (every element of a shard must agree)."""
    out = []
    for lo, hi in shard_bounds(flat.numel(), world_size):
        values = backend.to_cpu(flat[lo:hi])
        mask = int(values[0].item())
        if not bool((values == mask).all()) or mask < 0 or mask >= 2 ** world_size:
            raise RuntimeError(f"shard [{lo}:{hi}] holds {values.unique().tolist()}: not one "
                               f"sum of distinct 2^rank")
        out.append(mask)
    return out


def _steps(trace: list, world_size: int, phase: str, to: Any) -> list[dict]:
    return [{"phase": phase, "send": t["send"], "to": to(t["step"]), "bytes": t["sent_bytes"],
             "holds": _masks(t["flat"], world_size)} for t in trace]


def trace_worker(rank: int, world_size: int, numel: int = NUMEL) -> dict:
    """Run the four collectives on this rank with traced steps; returns, per collective, the
    masks this rank held at the start and each step's phase, shard sent, its destination,
    bytes and masks held after it."""
    n = numel
    mine = float(2 ** rank)
    bounds = shard_bounds(n, world_size)
    ring_next = lambda step: (rank + 1) % world_size  # noqa: E731
    out = {}

    def run(name: str, flat: torch.Tensor, phases: list) -> None:
        start, steps = _masks(flat, world_size), []
        for phase, fn, to in phases:
            trace: list = []
            fn(flat, trace=trace)
            steps += _steps(trace, world_size, phase, to)
        out[name] = {"start": start, "steps": steps}

    x = torch.full((n,), mine, device=backend.device())  # (n,): every element 2^rank
    run("all_reduce", x.clone(), [("reduce-scatter", reduce_scatter_phase, ring_next),
                                  ("all-gather", all_gather_phase, ring_next)])
    run("reduce_scatter", x.clone(), [("reduce-scatter", reduce_scatter_phase, ring_next)])
    own = torch.zeros(n, device=backend.device())  # (n,): only shard (rank + 1) % D held
    lo, hi = bounds[(rank + 1) % world_size]
    own[lo:hi] = mine
    run("all_gather", own, [("all-gather", all_gather_phase, ring_next)])
    run("all_to_all", x.clone(), [("all-to-all", pairwise_all_to_all,
                                   lambda step: (rank + step + 1) % world_size)])
    return out


def record(world_size: int, numel: int = NUMEL) -> dict[str, Trace]:
    """The four collectives run on ``world_size`` real ranks (gloo on a CPU), each rank's tensor
    ``numel`` float32 elements: collective -> :class:`Trace`."""
    check_int("world_size", world_size, 2)
    check_int("numel", numel)
    per_rank = launch.run(trace_worker, world_size, numel, backend="gloo", timeout_s=120,
                          show_output=False)
    return {name: _combine(name, [r[name] for r in per_rank], numel) for name in COLLECTIVES}


def _combine(name: str, ranks: list[dict], numel: int) -> Trace:
    steps = []
    for k, first in enumerate(ranks[0]["steps"]):
        steps.append(Step(first["phase"],
                          tuple((r["steps"][k]["send"], r["steps"][k]["to"], r["steps"][k]["bytes"])
                                for r in ranks),
                          tuple(tuple(r["steps"][k]["holds"]) for r in ranks)))
    return Trace(name, len(ranks), numel, tuple(tuple(r["start"]) for r in ranks), tuple(steps))


def record_all(world_sizes: tuple[int, ...] = WORLD_SIZES) -> dict:
    """Every collective on every D of ``world_sizes``, as the JSON :func:`load` reads."""
    traces: dict = {name: {} for name in COLLECTIVES}
    for d in world_sizes:
        for name, t in record(d).items():
            traces[name][str(d)] = {
                "numel": t.numel, "start": [list(h) for h in t.start],
                "steps": [{"phase": s.phase, "sends": [list(x) for x in s.sends],
                           "holds": [list(h) for h in s.holds]} for s in t.steps]}
    return {"recorded": {"torch": torch.__version__.split("+")[0], "backend": "gloo",
                         "dtype": "float32", "numel": NUMEL,
                         "how": "python -m course_utils.collectives.ring_trace"},
            "traces": traces}


@functools.lru_cache(maxsize=1)
def load(path: Path = PATH) -> dict[tuple[str, int], Trace]:
    """The committed recording: (collective, D) -> :class:`Trace`."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))["traces"]
    out = {}
    for name, by_d in data.items():
        for d, t in by_d.items():
            out[name, int(d)] = Trace(
                name, int(d), t["numel"], tuple(tuple(h) for h in t["start"]),
                tuple(Step(s["phase"], tuple(tuple(x) for x in s["sends"]),
                           tuple(tuple(h) for h in s["holds"])) for s in t["steps"]))
    return out


def trace(collective: str, world_size: int) -> Trace:
    """The recorded trace of ``collective`` (one of :data:`COLLECTIVES`) on ``world_size`` ranks
    (one of :data:`WORLD_SIZES`)."""
    one_of("collective", collective, COLLECTIVES)
    one_of("world_size", world_size, WORLD_SIZES)  # the recorded ranks
    return load()[collective, world_size]


def ring_total(world_size: int) -> float:
    """What :func:`~course_utils.collectives.cost.ring_bytes_per_rank` says each rank sends in
    the recorded all-reduce (:data:`NUMEL` float32 per rank)."""
    return ring_bytes_per_rank(NUMEL, world_size, 4)


__all__ += ["ring_total"]


if __name__ == "__main__":
    # python -m course_utils.collectives.ring_trace: record every trace again on real gloo ranks
    PATH.parent.mkdir(exist_ok=True)
    PATH.write_text(json.dumps(record_all(), separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {PATH}")
