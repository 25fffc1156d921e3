"""The collective recorder (course_utils.collectives.recorder): what it sees, on real gloo ranks
and on the fake process group, against a one-process expectation; and its views."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.collectives import recorder
from course_utils.runtime import backend

CHUNK = 3   # elements of fp32 per rank's chunk: the ring collectives' buffers are W chunks


# ------------------------------------------------------------------- what the dispatcher sees


class _AllReduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def _seen_worker(rank: int, world_size: int) -> dict:
    """Each way of calling a collective, alone in a recording: (op, api, dispatched) seen."""
    import torch.distributed._functional_collectives as funcol

    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    all_reduce = dist.all_reduce                 # as after `from torch.distributed import ...`
    originals = {name: getattr(dist, name) for name in ("all_reduce", "isend", "send")}

    def p2p():
        if rank % 2 == 0:
            dist.send(torch.ones(2), nxt)
            dist.recv(torch.empty(2), prev)
        else:
            dist.recv(torch.empty(2), prev)
            dist.send(torch.ones(2), nxt)

    def ip2p():
        for work in (dist.isend(torch.ones(2), nxt), dist.irecv(torch.empty(2), prev)):
            work.wait()

    def batch():
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), nxt),
                                            dist.P2POp(dist.irecv, torch.empty(2), prev)]):
            work.wait()

    def backward():
        x = torch.ones(3, requires_grad=True)
        _AllReduceGrad.apply(x).sum().backward()

    ways = {"all_reduce": lambda: all_reduce(torch.ones(4)), "send/recv": p2p,
            "isend/irecv": ip2p, "batch_isend_irecv": batch, "in backward": backward,
            "all_to_all": lambda: dist.all_to_all([torch.empty(1)] * world_size,
                                                  [torch.ones(1)] * world_size),
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
                torch.empty(2 * world_size), torch.ones(2)),
            "functional": lambda: funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)}
    out = {}
    for name, way in ways.items():
        with recorder.record() as calls:
            unpatched = all(getattr(dist, k) is v for k, v in originals.items())
            way()
        out[name] = ([(c.op, c.api, c.api_call, c.dispatched) for c in calls], unpatched)
    return out


def test_the_dispatcher_sees_every_way_of_calling_a_collective_on_gloo():
    """The finding behind the recorder's design: a TorchDispatchMode sees, on gloo, each
    torch.distributed function (even one imported before the block), send/recv,
    isend/irecv, each message of batch_isend_irecv, a collective inside backward and a
    functional collective, while torch.distributed's functions stay as they are. The function
    called is read from the stack; the messages of one batch_isend_irecv share one api_call."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        seen = launch.run(_seen_worker, 2, timeout_s=120)
    for rank, out in enumerate(seen):
        assert all(unpatched for _, unpatched in out.values())
        calls = {name: got for name, (got, _) in out.items()}
        first, second = ("send", "recv") if rank % 2 == 0 else ("recv", "send")
        p2p = {"send": "c10d.send", "recv": "c10d.recv_"}
        assert calls == {
            "all_reduce": [("all_reduce", "all_reduce", 1, "c10d.allreduce_")],
            "send/recv": [(first, first, 1, p2p[first]), (second, second, 2, p2p[second])],
            "isend/irecv": [("send", "isend", 1, "c10d.send"), ("recv", "irecv", 2, "c10d.recv_")],
            "batch_isend_irecv": [("send", "batch_isend_irecv", 1, "c10d.send"),
                                  ("recv", "batch_isend_irecv", 1, "c10d.recv_")],
            "in backward": [("all_reduce", "all_reduce", 1, "c10d.allreduce_")],
            "all_to_all": [("all_to_all", "all_to_all", 1, "c10d.alltoall_")],
            "all_gather_into_tensor": [("all_gather", "all_gather_into_tensor", 1,
                                        "c10d._allgather_base_")],
            "functional": [("all_reduce", "", 1, "_c10d_functional.all_reduce")]}


# ----------------------------------------------------- calls and bytes, against one process


def _program(rank: int, world_size: int, pair: object) -> None:
    """The collectives every test rank runs (``pair``: its group of two ranks)."""
    n, nxt, prev = CHUNK * world_size, (rank + 1) % world_size, (rank - 1) % world_size
    with recorder.phase("collectives"):
        dist.all_reduce(torch.ones(n))
        dist.all_gather_single(torch.empty(n), torch.ones(CHUNK))
        dist.reduce_scatter_single(torch.empty(CHUNK), torch.ones(n))
        dist.all_to_all_single(torch.empty(n), torch.ones(n))
        dist.all_gather([torch.empty(CHUNK) for _ in range(world_size)], torch.ones(CHUNK))
        dist.all_reduce(torch.ones(5, dtype=torch.float64), group=pair)
    with recorder.phase("p2p"):
        if rank % 2 == 0:
            dist.send(torch.ones(7), nxt)
            dist.recv(torch.empty(7), prev)
        else:
            dist.recv(torch.empty(7), prev)
            dist.send(torch.ones(7), nxt)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), nxt),
                                            dist.P2POp(dist.irecv, torch.empty(2), prev)]):
            work.wait()


def _pairs(rank: int, world_size: int) -> object:
    mine = None
    for first in range(0, world_size, 2):      # every rank creates every group
        group = dist.new_group([first, first + 1])
        if rank in (first, first + 1):
            mine = group
    return mine


def _row(call: recorder.Call, names: dict[str, str]) -> tuple:
    return (call.op, names.get(call.group_name, "?"), call.group_size, call.buffer_bytes,
            call.sent_bytes, call.shape, str(call.dtype), call.phase, call.api, call.api_call)


def _calls_worker(rank: int, world_size: int) -> list[tuple]:
    pair = _pairs(rank, world_size)
    names = {dist.group.WORLD.group_name: "world", pair.group_name: "pair"}
    with recorder.record() as calls:
        _program(rank, world_size, pair)
    return [_row(c, names) for c in calls]


def _expected(rank: int, world_size: int) -> list[tuple]:
    """The same program's calls worked out by hand: a ring collective over W ranks moves W - 1
    chunks of its buffer's W chunks per rank (twice for an all-reduce: a reduce-scatter, then an
    all-gather); a send sends its message, a receive nothing."""
    w, f32 = world_size, "torch.float32"
    n, chunk_bytes = CHUNK * w, CHUNK * 4
    ring = [("all_reduce", 2 * (w - 1) * chunk_bytes, (n,), "all_reduce"),
            ("all_gather", (w - 1) * chunk_bytes, (n,), "all_gather_single"),
            ("reduce_scatter", (w - 1) * chunk_bytes, (CHUNK,), "reduce_scatter_single"),
            ("all_to_all", (w - 1) * chunk_bytes, (n,), "all_to_all_single"),
            ("all_gather", (w - 1) * chunk_bytes, (w, CHUNK), "all_gather")]
    rows = [(op, "world", w, 4 * n, float(sent), shape, f32, "collectives", api, i + 1)
            for i, (op, sent, shape, api) in enumerate(ring)]
    rows.append(("all_reduce", "pair", 2, 40, 2 * 1 * 20.0, (5,), "torch.float64", "collectives",
                 "all_reduce", 6))
    p2p = [("send", 28, 28.0), ("recv", 28, 0.0)]
    for i, (op, nbytes, sent) in enumerate(p2p if rank % 2 == 0 else p2p[::-1]):
        rows.append((op, "world", w, nbytes, sent, (7,), f32, "p2p", op, 7 + i))
    rows += [("send", "world", w, 8, 8.0, (2,), f32, "p2p", "batch_isend_irecv", 9),
             ("recv", "world", w, 8, 0.0, (2,), f32, "p2p", "batch_isend_irecv", 9)]
    return rows


@pytest.mark.parametrize("world_size", [2, 4])
def test_calls_and_bytes_on_gloo_ranks_equal_one_process_expectation(world_size):
    got = launch.run(_calls_worker, world_size, timeout_s=120)
    for rank, rows in enumerate(got):
        assert rows == _expected(rank, world_size)


def _ring_worker(rank: int, world_size: int) -> dict:
    """The course's ring all-reduce, built from batch_isend_irecv, beside dist.all_reduce."""
    from course_utils.collectives import ring

    x = torch.arange(4.0 * world_size * CHUNK) + rank
    with recorder.record() as calls:
        dist.all_reduce(x.clone())
        ring.ring_all_reduce_simple(x)
    first, rest = calls[0], calls[1:]
    return {"model": first.sent_bytes,
            "sent": sum(c.buffer_bytes for c in rest if c.op == "send"),
            "received": sum(c.buffer_bytes for c in rest if c.op == "recv"),
            "batches": len({c.api_call for c in rest}),
            "apis": {c.api for c in rest}}


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_ring_built_from_sends_sends_what_the_ring_model_says(world_size):
    """The bytes the traced sends of module 2's ring all-reduce carry equal the all-reduce's
    Call.sent_bytes (collectives.cost): 2(W - 1) steps of one batch_isend_irecv each."""
    for out in launch.run(_ring_worker, world_size, timeout_s=120):
        assert out["sent"] == out["received"] == out["model"]
        assert out["batches"] == 2 * (world_size - 1)
        assert out["apis"] == {"batch_isend_irecv"}


# ------------------------------------------------------------------------ fake process group


def _fake_program(world_size: int) -> list[tuple]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size // 2, 2), mesh_dim_names=("dp", "tp"))
    sharded = distribute_tensor(torch.ones(2 * CHUNK, 2), mesh, [Replicate(), Shard(0)])
    partial = DTensor.from_local(torch.ones(CHUNK), mesh, [Replicate(), Partial()])
    names = {dist.group.WORLD.group_name: "world", mesh["tp"].get_group().group_name: "tp"}
    with recorder.record() as calls:
        dist.all_reduce(torch.ones(CHUNK * world_size))
        dist.reduce_scatter_single(torch.empty(CHUNK), torch.ones(CHUNK * world_size))
        sharded.redistribute(mesh, [Replicate(), Replicate()])   # DTensor: a functional
        partial.redistribute(mesh, [Replicate(), Replicate()])   # all-gather, an all-reduce
    return [_row(c, names)[:-1] + (c.dispatched,) for c in calls]


@pytest.mark.parametrize("world_size", [4, 8])
def test_calls_on_the_fake_process_group_equal_one_process_expectation(world_size):
    """One process plays a rank of 4 or 8 (PyTorch's fake group): torch.distributed's
    collectives and DTensor's functional ones over the mesh's "tp" axis of 2 ranks."""
    w, chunk_bytes = world_size, CHUNK * 4
    got = backend.fake_job(0, world_size, _fake_program, world_size)
    f32 = "torch.float32"
    assert got == [
        ("all_reduce", "world", w, w * chunk_bytes, 2.0 * (w - 1) * chunk_bytes,
         (CHUNK * w,), f32, "", "all_reduce", "c10d.allreduce_"),
        ("reduce_scatter", "world", w, w * chunk_bytes, float((w - 1) * chunk_bytes),
         (CHUNK,), f32, "", "reduce_scatter_single", "c10d._reduce_scatter_base_"),
        ("all_gather", "tp", 2, 4 * chunk_bytes, 2.0 * chunk_bytes, (2 * CHUNK, 2), f32, "", "",
         "_c10d_functional.all_gather_into_tensor"),
        ("all_reduce", "tp", 2, chunk_bytes, float(chunk_bytes), (CHUNK,), f32, "", "",
         "_c10d_functional.all_reduce")]


# ------------------------------------------------------------------------------ declared calls


def test_declared_calls_reach_declared_recordings_only_and_nest():
    from course_utils.tensor_parallel.recording import CommEvent, log_comm, record_comms

    x = torch.ones(2, 3)
    with recorder.record(declared=True, traced=False) as both, record_comms() as outer:
        with record_comms() as inner, recorder.record() as traced:
            log_comm("all_reduce", "forward", x, 0.5)
        log_comm("all_gather", "backward", x.double())
        with recorder.phase("grad sync"):
            call = recorder.declare("reduce_scatter", x)
    assert traced == [] and inner == [CommEvent("all_reduce", "forward", (2, 3), 24)]
    assert outer == inner + [CommEvent("all_gather", "backward", (2, 3), 48),
                             CommEvent("reduce_scatter", "grad sync", (2, 3), 24)]
    assert [c.declared for c in both] == [True] * 3 and both[-1] == call
    assert call.group_size == 1 and call.buffer_bytes == 24 and call.sent_bytes == 0.0
    assert outer[0].seconds == 0.5
    with pytest.raises(ValueError, match="op must be one of"):
        recorder.declare("allreduce", x)


def _declared_group_worker(rank: int, world_size: int) -> list[tuple]:
    pair = _pairs(rank, world_size)
    with recorder.record(traced=False, declared=True) as calls:
        recorder.declare("reduce_scatter", torch.ones(CHUNK), group=pair, phase="forward")
        recorder.declare("all_gather", torch.ones(CHUNK * world_size))
    return [(c.op, c.group_size, c.buffer_bytes, c.sent_bytes, c.phase) for c in calls]


def test_a_declared_call_counts_its_group():
    w = 4
    for rows in launch.run(_declared_group_worker, w, timeout_s=120):
        assert rows == [("reduce_scatter", 2, 2 * CHUNK * 4, CHUNK * 4.0, "forward"),
                        ("all_gather", w, w * CHUNK * 4, (w - 1) * CHUNK * 4.0, "")]


def test_call_bytes_come_from_the_ring_model():
    from course_utils.collectives import cost

    call = recorder.Call("all_reduce", "g", 4, 800)
    assert call.sent_bytes == cost.ring_bytes("all_reduce", 800, 4) == 1200
    assert recorder.Call("broadcast", "g", 4, 800).sent_bytes is None
    assert recorder.Call("send", "g", 4, 800).sent_bytes == 800
    with pytest.raises(ValueError, match="no dtype"):
        recorder.Call("send", "g", 4, 800).result_bytes


def test_listen_checks_its_switches():
    with pytest.raises(ValueError, match="traced must be True or False"):
        with recorder.record(traced=1):
            pass
    with pytest.raises(ValueError, match="label must be a str"):
        with recorder.phase(3):
            pass
    assert recorder.current_phase() == ""


# -------------------------------------------------------------------------------- the views


def _views_worker(rank: int, world_size: int) -> dict:
    from course_utils.scale.comms import CollectiveLog
    from course_utils.tensor_parallel.recording import spy_collectives
    from course_utils.trainer3d.comms import count_comms
    from course_utils.zero.recording import SpyCollectives

    pair = _pairs(rank, world_size)
    with spy_collectives() as spied, SpyCollectives() as names, \
            count_comms({"pair": pair}) as counts, CollectiveLog() as log:
        _program(rank, world_size, pair)
    return {"spied": spied, "names": names, "counts": counts, "log": log.calls,
            "pair": pair.group_name, "world": dist.group.WORLD.group_name}


def test_the_old_recorders_are_views_of_the_recorder():
    w = 4
    n_bytes = CHUNK * w * 4
    for out in launch.run(_views_worker, w, timeout_s=120):
        assert out["spied"] == [("all_reduce", w), ("all_gather_single", w),
                                ("reduce_scatter_single", w), ("all_to_all_single", w),
                                ("all_gather", w), ("all_reduce", 2)]
        assert out["names"] == ["all_reduce", "all_gather_single", "reduce_scatter_single",
                                "all_gather", "all_reduce"]
        assert out["counts"] == {"send": 2, "recv": 2, "p2p_batches": 1, "all_reduce_other": 1,
                                 "all_gather_single_other": 1, "all_to_all_single_other": 1,
                                 "reduce_scatter_single_other": 1, "all_gather_other": 1,
                                 "all_reduce_pair": 1}
        world, pair = out["world"], out["pair"]
        assert out["log"] == [("all_reduce", world, w, n_bytes), ("all_gather", world, w, n_bytes),
                              ("reduce_scatter", world, w, n_bytes), ("all_reduce", pair, 2, 40)]


def test_comm_log_is_a_view_of_calls():
    from course_utils.zero.recording import CommLog

    log = CommLog(4)
    log.record("all_gather", 100, 2)
    assert log.as_calls() == [recorder.Call("all_gather", "", 4, 200, shape=(100,))]
    assert log.ring_bytes()["all_gather"] == log.as_calls()[0].sent_bytes == 150
