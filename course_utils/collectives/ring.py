"""Ring all-reduce built from point-to-point send/recv: a reduce-scatter phase, then an all-gather.

The flat tensor (N elements) is cut into D shards, one per rank (sizes differ by at most one, so
any N works, including N < D). Ranks form a ring: rank r sends to ``(r + 1) % D`` and receives
from ``(r - 1) % D``.

* **Reduce-scatter** (D - 1 steps): at step s, rank r sends shard ``(r - s) % D`` and adds the
  shard ``(r - s - 1) % D`` it receives into its own copy. Afterwards rank r holds the fully
  reduced shard ``(r + 1) % D``.
* **All-gather** (D - 1 steps): at step s, rank r sends shard ``(r + 1 - s) % D`` and overwrites
  shard ``(r - s) % D`` with the one it receives. Afterwards every rank holds every reduced shard.

Every step a rank sends one shard, so it sends 2(D - 1) shards: 2(D - 1)/D x N x element size
bytes (exactly, when D divides N; on average over ranks otherwise), independent of D for large D.

Two implementations: :func:`reduce_scatter_phase` + :func:`all_gather_phase` (the textbook
version, one blocking exchange per step) and :func:`ring_all_reduce` (the pipelined one: each shard
is cut into ``pieces`` and every piece is forwarded as soon as it arrives, so sends, receives and
additions of different pieces can overlap, and the all-gather starts before the reduce-scatter
ends). Pipelining is not a guaranteed speed-up here: every piece costs Python-level calls, and on
gloo over one CPU host the same cores move the bytes and run the interpreter, so at small sizes
(one piece per shard, see :func:`default_pieces`) neither version is reliably faster.

Time is not bytes: :func:`ring_time_s` is the alpha-beta model
2(D - 1) alpha + 2(D - 1)/D x n / beta, whose latency term grows linearly with D.

Run it under torchrun (checks the result against ``dist.all_reduce`` and prints bytes sent)::

    torchrun --standalone --nproc-per-node 3 -m course_utils.collectives.ring
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.runtime import backend
from course_utils.collectives.cost import ring_bytes_per_rank, ring_time_s  # noqa: F401
from course_utils.collectives.primitives import shard_bounds
from course_utils.runtime.clock import clock
from course_utils.runtime.validate import check_int

__all__ = ["RingStats", "ring_bytes_per_rank", "ring_time_s", "reduce_scatter_phase",
           "all_gather_phase", "ring_all_reduce_simple", "ring_all_reduce", "open_channels",
           "default_pieces", "ring_worker", "ring_phases_worker", "bandwidth_worker",
           "ring_check_worker"]


@dataclass
class RingStats:
    """What one rank put on the wire during a ring all-reduce."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0

    def add(self, other: "RingStats") -> "RingStats":
        """Element-wise sum of two counts (e.g. the two phases)."""
        return RingStats(self.bytes_sent + other.bytes_sent,
                         self.bytes_received + other.bytes_received,
                         self.messages_sent + other.messages_sent)


def _check_tensor(tensor: Any) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor must be a torch.Tensor; got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous (the ring works on a flat view of it)")
    if not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(f"tensor must have a floating-point dtype; got {tensor.dtype}")
    return tensor.view(-1)


def _ring(group: dist.ProcessGroup | None) -> tuple[int, int, int, int]:
    """(rank, world size, next rank, previous rank) in global rank numbers."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if group is None:
        to_global = lambda r: r  # noqa: E731
    else:
        to_global = lambda r: dist.get_global_rank(group, r)  # noqa: E731
    return rank, world_size, to_global((rank + 1) % world_size), to_global((rank - 1) % world_size)


# --------------------------------------------------------------------------- textbook version


def _record(trace: list | None, step: int, send: int, recv: int, sent: int, received: int,
            flat: torch.Tensor) -> None:
    """Append one step to ``trace``: the shards sent and received, their bytes, and a copy of
    what this rank holds after the step (:mod:`course_utils.collectives.ring_trace` replays
    them)."""
    if trace is not None:
        trace.append({"step": step, "send": send, "recv": recv, "sent_bytes": sent,
                      "received_bytes": received, "flat": flat.detach().clone()})


def reduce_scatter_phase(flat: torch.Tensor, group: dist.ProcessGroup | None = None,
                         trace: list | None = None) -> RingStats:
    """Phase 1, in place on 1-D ``flat`` (N,): afterwards this rank's shard (rank + 1) % D is the
    sum. ``trace``: a list to append each step to (what was sent, received and held)."""
    flat = _check_tensor(flat)
    rank, world_size, next_rank, prev_rank = _ring(group)
    bounds = shard_bounds(flat.numel(), world_size)
    stats = RingStats()
    for step in range(world_size - 1):
        send_lo, send_hi = bounds[(rank - step) % world_size]
        recv_lo, recv_hi = bounds[(rank - step - 1) % world_size]
        incoming = flat.new_empty(recv_hi - recv_lo)  # (shard,)
        ops = []
        if send_hi > send_lo:
            ops.append(dist.P2POp(dist.isend, flat[send_lo:send_hi], next_rank, group))
        if recv_hi > recv_lo:
            ops.append(dist.P2POp(dist.irecv, incoming, prev_rank, group))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        flat[recv_lo:recv_hi] += incoming  # (shard,) += (shard,)
        step_stats = RingStats((send_hi - send_lo) * flat.element_size(),
                               (recv_hi - recv_lo) * flat.element_size(), 1)
        stats = stats.add(step_stats)
        _record(trace, step, (rank - step) % world_size, (rank - step - 1) % world_size,
                step_stats.bytes_sent, step_stats.bytes_received, flat)
    return stats


def all_gather_phase(flat: torch.Tensor, group: dist.ProcessGroup | None = None,
                     trace: list | None = None) -> RingStats:
    """Phase 2, in place on 1-D ``flat`` (N,) holding reduced shard (rank + 1) % D: fills the
    rest. ``trace``: a list to append each step to (what was sent, received and held)."""
    flat = _check_tensor(flat)
    rank, world_size, next_rank, prev_rank = _ring(group)
    bounds = shard_bounds(flat.numel(), world_size)
    stats = RingStats()
    for step in range(world_size - 1):
        send_lo, send_hi = bounds[(rank + 1 - step) % world_size]
        recv_lo, recv_hi = bounds[(rank - step) % world_size]
        ops = []
        if send_hi > send_lo:
            ops.append(dist.P2POp(dist.isend, flat[send_lo:send_hi], next_rank, group))
        if recv_hi > recv_lo:
            ops.append(dist.P2POp(dist.irecv, flat[recv_lo:recv_hi], prev_rank, group))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        step_stats = RingStats((send_hi - send_lo) * flat.element_size(),
                               (recv_hi - recv_lo) * flat.element_size(), 1)
        stats = stats.add(step_stats)
        _record(trace, step, (rank + 1 - step) % world_size, (rank - step) % world_size,
                step_stats.bytes_sent, step_stats.bytes_received, flat)
    return stats


def ring_all_reduce_simple(tensor: torch.Tensor,
                           group: dist.ProcessGroup | None = None) -> RingStats:
    """Sum ``tensor`` (any shape, contiguous) over ranks in place: phase 1 then phase 2."""
    flat = _check_tensor(tensor)
    return reduce_scatter_phase(flat, group).add(all_gather_phase(flat, group))


# ------------------------------------------------------------------------------ fast version


def default_pieces(numel: int, world_size: int, element_size: int = 4) -> int:
    """How many pieces to cut each shard into: about 1 MiB each, from 1 to 16.

    ``numel`` (int >= 0) elements of ``element_size`` (int >= 1) bytes over ``world_size``
    (int >= 1) ranks; a shard under 1.5 MiB stays whole (one piece).
    """
    check_int("numel", numel, 0)
    check_int("world_size", world_size, 1)
    check_int("element_size", element_size, 1)
    shard_bytes = numel * element_size / world_size
    return int(max(1, min(16, round(shard_bytes / 2**20))))


def open_channels(n: int, timeout_s: float = 60.0) -> list[dist.ProcessGroup | None]:
    """``n`` communication channels over all ranks: the default group plus n - 1 new groups.

    Each gloo group has its own TCP connections and I/O thread, so pieces sent on different
    channels travel in parallel (NCCL's "channels" idea; under NCCL each group is its own
    communicator). Every rank must call this, in the same order.
    """
    check_int("n", n)
    return [None] + [backend.new_group(timeout_s=timeout_s) for _ in range(n - 1)]


_SCRATCH: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _scratch(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A reusable receive buffer of ``numel`` elements on this rank's device: a fresh one would
    page-fault every call."""
    dev = backend.device()
    buf = _SCRATCH.get((dtype, dev))
    if buf is None or buf.numel() < numel:
        buf = torch.zeros(numel, dtype=dtype, device=dev)  # zeros: touch every page once, now
        _SCRATCH[(dtype, dev)] = buf
    return buf[:numel]


def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                    pieces: int | None = None,
                    channels: Sequence[dist.ProcessGroup | None] | None = None) -> RingStats:
    """Sum ``tensor`` (any shape, contiguous) over ranks in place with a pipelined ring.

    Each of the D shards is cut into ``pieces`` (default :func:`default_pieces`). A piece is
    forwarded to the next rank as soon as it has been received (and, in the reduce-scatter
    phase, added), and receives are posted two steps ahead, so transfers of one piece overlap
    the addition of another and both phases run at once. Same bytes as the textbook ring.
    ``channels`` (from :func:`open_channels`, spanning the same ranks as ``group``): piece j
    travels on ``channels[j % len(channels)]``.
    """
    flat = _check_tensor(tensor)
    rank, world_size, next_rank, prev_rank = _ring(group)
    if pieces is None:
        pieces = default_pieces(flat.numel(), world_size, flat.element_size())
    check_int("pieces", pieces)
    channels = list(channels) if channels else [group]
    stats = RingStats()
    if world_size == 1 or flat.numel() == 0:
        return stats
    elem = flat.element_size()
    shards = shard_bounds(flat.numel(), world_size)
    # piece_bounds[k][j]: (lo, hi) of piece j of shard k, as offsets into flat
    piece_bounds = [[(lo + a, lo + b) for a, b in shard_bounds(hi - lo, pieces)]
                    for lo, hi in shards]
    n_rs = world_size - 1
    n_steps = 2 * n_rs
    longest = max(b - a for row in piece_bounds for a, b in row)
    parities = min(2, n_rs)  # reduce-scatter steps in flight at once
    scratch = _scratch(parities * pieces * longest, flat.dtype).view(parities, pieces, longest)

    def send_shard(step: int) -> int:
        if step < n_rs:
            return (rank - step) % world_size
        return (rank + 1 - (step - n_rs)) % world_size

    def recv_shard(step: int) -> int:
        if step < n_rs:
            return (rank - step - 1) % world_size
        return (rank - (step - n_rs)) % world_size

    def recv_buffer(step: int, j: int) -> torch.Tensor:
        lo, hi = piece_bounds[recv_shard(step)][j]
        if step < n_rs:  # reduce-scatter: land in scratch, then add
            return scratch[step % parities, j, : hi - lo]
        return flat[lo:hi]  # all-gather: land in place

    def tag(step: int, j: int) -> int:
        return step * pieces + j

    recvs: dict[tuple[int, int], Any] = {}
    sends: list[Any] = []

    def post_recv(step: int, j: int) -> None:
        buf = recv_buffer(step, j)
        if buf.numel():
            recvs[step, j] = dist.irecv(buf, prev_rank, group=channels[j % len(channels)],
                                        tag=tag(step, j))
            stats.bytes_received += buf.numel() * elem

    def post_send(step: int, j: int) -> None:
        lo, hi = piece_bounds[send_shard(step)][j]
        if hi > lo:
            sends.append(dist.isend(flat[lo:hi], next_rank, group=channels[j % len(channels)],
                                    tag=tag(step, j)))
            stats.bytes_sent += (hi - lo) * elem
            stats.messages_sent += 1

    for step in range(min(2, n_steps)):
        for j in range(pieces):
            post_recv(step, j)
    for j in range(pieces):
        post_send(0, j)
    for step in range(n_steps):
        for j in range(pieces):
            work = recvs.pop((step, j), None)
            if work is not None:
                work.wait()
                if step < n_rs:
                    lo, hi = piece_bounds[recv_shard(step)][j]
                    flat[lo:hi] += scratch[step % parities, j, : hi - lo]  # (piece,) += (piece,)
            # the piece just received is exactly what the next step sends
            if step + 1 < n_steps:
                post_send(step + 1, j)
            if step + 2 < n_steps:
                post_recv(step + 2, j)
    for work in sends:
        work.wait()
    return stats


# -------------------------------------------------------------------------------------- workers


def ring_worker(rank: int, world_size: int, inputs: Sequence[torch.Tensor],
                implementation: str = "fast",
                pieces: int | None = None) -> tuple[list[float], dict]:
    """All-reduce ``inputs[rank]`` with the ring; returns (result as a list, byte counts as a
    dict)."""
    if implementation not in ("fast", "simple"):
        raise ValueError(f"implementation must be 'fast' or 'simple'; got {implementation!r}")
    x = backend.to_device(inputs[rank]).clone()
    if implementation == "fast":
        stats = ring_all_reduce(x, pieces=pieces)
    else:
        stats = ring_all_reduce_simple(x)
    return x.tolist(), asdict(stats)


def ring_phases_worker(rank: int, world_size: int,
                       inputs: Sequence[torch.Tensor]) -> tuple[list[float], list[float]]:
    """Textbook ring on ``inputs[rank]``: returns what the rank holds after phase 1 and phase 2."""
    x = backend.to_device(inputs[rank]).clone()
    reduce_scatter_phase(x)
    after_phase1 = x.tolist()
    all_gather_phase(x)
    return after_phase1, x.tolist()


def bandwidth_worker(rank: int, world_size: int, sizes_bytes: Sequence[int], repeats: int = 5,
                     pieces: int | None = None, include_simple: bool = False,
                     n_channels: int = 1) -> dict:
    """Median seconds per float32 all-reduce, ring vs ``dist.all_reduce``, for each size in bytes.

    The two are interleaved (ring, gloo, ring, gloo, ...) so load changes hit both; each result
    is checked against the other. Returns {"ring": [...], "gloo": [...], ("simple": [...])},
    seconds, agreed on by all ranks (the max over ranks of each rank's median).
    """
    names = ["ring", "gloo"] + (["simple"] if include_simple else [])
    channels = open_channels(n_channels) if n_channels > 1 else None
    times: dict[str, list[float]] = {name: [] for name in names}
    for nbytes in sizes_bytes:
        numel = int(nbytes) // 4
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(numel, generator=gen).to(backend.device())  # (numel,)
        samples: dict[str, list[float]] = {name: [] for name in names}
        results: dict[str, torch.Tensor] = {}
        for _ in range(repeats + 1):  # the first round warms up and is dropped
            for name in names:
                y = x.clone()
                dist.barrier()
                start = clock(x)  # on CUDA: after the queued work, not at its launch
                if name == "ring":
                    ring_all_reduce(y, pieces=pieces, channels=channels)
                elif name == "simple":
                    ring_all_reduce_simple(y)
                else:
                    dist.all_reduce(y)
                samples[name].append(clock(x) - start)
                results[name] = y
        for name in names:
            torch.testing.assert_close(results[name], results["gloo"], rtol=1e-5, atol=1e-4)
            median = torch.tensor(statistics.median(samples[name][1:]), dtype=torch.float64)
            dist.all_reduce(median, op=dist.ReduceOp.MAX)
            times[name].append(float(median))
    return times


def ring_check_worker(rank: int, world_size: int, numel: int = 1001) -> dict[str, Any]:
    """Ring vs ``dist.all_reduce`` on a random (numel,) tensor: equal? and bytes sent vs formula."""
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(backend.device())
    ring, expected = x.clone(), x.clone()
    stats = ring_all_reduce(ring)
    dist.all_reduce(expected)
    return {"equal": bool(torch.allclose(ring, expected, rtol=1e-5, atol=1e-5)),
            "bytes_sent": stats.bytes_sent,
            "formula_mean_over_ranks": ring_bytes_per_rank(numel, world_size)}


if __name__ == "__main__":
    # torchrun --standalone --nproc-per-node N -m course_utils.collectives.ring
    launch.torchrun_main(ring_check_worker)
