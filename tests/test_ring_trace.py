"""The recorded ring (course_utils.collectives.ring_trace): the committed recording is what a fresh gloo run
records, every trace ends in its collective's result, the bytes are the ring's formula, and the
pairwise all-to-all equals gloo's."""

from __future__ import annotations

import pytest
import torch

from course_utils import launch
from course_utils.collectives import ring as ring_allreduce
from course_utils.collectives import ring_trace


def test_the_committed_recording_is_a_fresh_runs():
    fresh = ring_trace.record(4)
    for name in ring_trace.COLLECTIVES:
        assert fresh[name] == ring_trace.trace(name, 4), name


@pytest.mark.slow
def test_every_committed_trace_is_a_fresh_runs():
    for d in ring_trace.WORLD_SIZES:
        fresh = ring_trace.record(d)
        for name in ring_trace.COLLECTIVES:
            assert fresh[name] == ring_trace.trace(name, d), (name, d)


@pytest.mark.parametrize("d", ring_trace.WORLD_SIZES)
def test_every_trace_ends_in_its_collectives_result(d):
    everyone = 2 ** d - 1
    t = {name: ring_trace.trace(name, d) for name in ring_trace.COLLECTIVES}
    assert [len(t[n].steps) for n in ring_trace.COLLECTIVES] == [2 * (d - 1), d - 1, d - 1, d - 1]
    assert all(m == everyone for row in t["all_reduce"].holds(2 * (d - 1)) for m in row)
    rs = t["reduce_scatter"].holds(d - 1)
    assert [rs[r][(r + 1) % d] for r in range(d)] == [everyone] * d  # shard r + 1 complete
    assert t["all_gather"].holds(d - 1) == tuple(tuple(1 << ((c - 1) % d) for c in range(d))
                                                   for _ in range(d))
    assert t["all_to_all"].holds(d - 1) == tuple(tuple(1 << c for c in range(d))
                                                   for _ in range(d))
    assert t["all_reduce"].sent_so_far(2 * (d - 1)) == \
        [ring_allreduce.ring_bytes_per_rank(ring_trace.NUMEL, d)] * d == [ring_trace.ring_total(d)] * d
    for name in ("reduce_scatter", "all_gather", "all_to_all"):
        assert t[name].sent_so_far(d - 1) == [ring_trace.ring_total(d) / 2] * d


def _a2a_worker(rank: int, world_size: int, n: int) -> tuple[list, list]:
    import torch.distributed as dist

    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))  # (n,)
    ours, theirs = x.clone(), torch.empty_like(x)
    ring_trace.pairwise_all_to_all(ours)
    dist.all_to_all_single(theirs, x)
    return ours.tolist(), theirs.tolist()


@pytest.mark.parametrize("d,n", [(2, 6), (3, 12), (4, 8)])
def test_pairwise_all_to_all_is_gloos(d, n):
    for ours, theirs in launch.run(_a2a_worker, d, n, show_output=False):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs))


def test_a_bad_step_or_trace_is_named():
    with pytest.raises(ValueError, match=r"k must be from 0 to 6 \(the steps of this trace\)"):
        ring_trace.trace("all_reduce", 4).holds(7)
    with pytest.raises(ValueError, match="world_size must be one of"):
        ring_trace.trace("all_reduce", 9)
    with pytest.raises(ValueError, match="collective must be one of"):
        ring_trace.trace("broadcast", 4)
