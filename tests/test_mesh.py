"""course_utils.mesh.grid: coordinates and groups from one grid, checked against torch's DeviceMesh
on real gloo ranks, and a 2-D (DP x TP) step checked against one device."""

from __future__ import annotations

import itertools

import pytest
import torch

from course_utils import launch
from course_utils.mesh.grid import (AXES, Mesh, check_dp_tp, dp_tp_step, dp_tp_step_dtensor,
                               hand_mesh_groups, reference_step, shard_of, torch_mesh_groups)

LESSON = Mesh.from_degrees(dp=4, pp=2, tp=4)  # the lesson's 32 devices


def test_lesson_mesh_sizes_and_a_rank():
    assert LESSON.names == AXES == ("dp", "pp", "tp")
    assert LESSON.world_size == 32
    assert LESSON.size("tp") * LESSON.size("pp") == 8  # devices per model replica
    assert LESSON.coords(13) == {"dp": 1, "pp": 1, "tp": 1}
    assert LESSON.group(13, "tp") == [12, 13, 14, 15]
    assert LESSON.group(13, "pp") == [9, 13]
    assert LESSON.group(13, "dp") == [5, 13, 21, 29]


@pytest.mark.parametrize("sizes", [(2, 2), (4, 2, 4), (3, 1, 2), (2, 3, 2, 2)])
def test_coords_round_trip_and_groups_partition(sizes):
    names = tuple(f"a{i}" for i in range(len(sizes)))
    m = Mesh(sizes, names)
    grid = m.grid()
    for rank in range(m.world_size):
        c = m.coords(rank)
        assert m.rank_of(**c) == rank
        assert grid[tuple(c.values())].item() == rank
    for axis, size in zip(names, sizes):
        groups = m.groups(axis)
        assert len(groups) == m.world_size // size and all(len(g) == size for g in groups)
        assert sorted(itertools.chain(*groups)) == list(range(m.world_size))
        for g in groups:  # members differ only along `axis`
            coords = [m.coords(r) for r in g]
            assert [c[axis] for c in coords] == list(range(size))
            others = {tuple(v for k, v in c.items() if k != axis) for c in coords}
            assert len(others) == 1


def test_innermost_axis_is_consecutive_and_order_decides_nodes():
    assert LESSON.groups("tp") == [[4 * i + j for j in range(4)] for i in range(8)]
    assert LESSON.groups_crossing_nodes("tp", 8) == []          # TP innermost: inside nodes
    assert len(LESSON.groups_crossing_nodes("dp", 8)) == 8       # DP spans the nodes
    tp_outer = Mesh.from_degrees(order=("tp", "pp", "dp"), dp=4, pp=2, tp=4)
    assert tp_outer.group(0, "tp") == [0, 8, 16, 24]
    assert len(tp_outer.groups_crossing_nodes("tp", 8)) == 8     # every TP group crosses
    assert [LESSON.node_of(r, 8) for r in (0, 7, 8, 31)] == [0, 0, 1, 3]


def test_table_lists_every_rank():
    lines = Mesh((2, 2), ("dp", "tp")).table().splitlines()
    assert lines[0].split() == ["rank", "dp", "tp"]
    assert [ln.split() for ln in lines[1:]] == [["0", "0", "0"], ["1", "0", "1"],
                                                ["2", "1", "0"], ["3", "1", "1"]]


@pytest.mark.parametrize("call, match", [
    (lambda: Mesh((), ()), "sizes"),
    (lambda: Mesh((2, 0), ("dp", "tp")), "sizes"),
    (lambda: Mesh((2, 2.0), ("dp", "tp")), "sizes"),
    (lambda: Mesh((2, 2), ("dp",)), "names"),
    (lambda: Mesh((2, 2), ("dp", "dp")), "names"),
    (lambda: LESSON.coords(32), "rank"),
    (lambda: LESSON.coords(-1), "rank"),
    (lambda: LESSON.group(0, "ep"), "axis"),
    (lambda: LESSON.rank_of(dp=0, pp=0), "coords"),
    (lambda: LESSON.rank_of(dp=4, pp=0, tp=0), "coords"),
    (lambda: LESSON.groups_crossing_nodes("tp", 0), "devices_per_node"),
    (lambda: Mesh.from_degrees(order=("dp", "tp"), dp=2, pp=2, tp=2), "order"),
])
def test_bad_input_raises_value_error_naming_it(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("sizes, names, world", [
    ((2, 2), ("dp", "tp"), 4),
    ((2, 1, 2), ("dp", "pp", "tp"), 4),
    ((1, 2, 2), ("dp", "pp", "tp"), 4),
    ((2, 2, 2), ("dp", "pp", "tp"), 8),
])
def test_init_device_mesh_builds_the_hand_built_groups(sizes, names, world):
    got = launch.run(torch_mesh_groups, world, sizes, names, timeout_s=180)
    assert got == hand_mesh_groups(sizes, names)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dp_tp_step_equals_one_device(seed):
    ref = reference_step(seed)
    hand = launch.run(dp_tp_step, 4, seed, 2, 2, timeout_s=180)
    torch_api = launch.run(dp_tp_step_dtensor, 4, seed, 2, 2, timeout_s=180)
    for rank in range(4):
        want = shard_of(ref, rank % 2, 2)  # tp_rank = rank % 2 on the (dp=2, tp=2) mesh
        assert want["grad.up.weight"].shape == (8, 8)
        for key, value in want.items():
            torch.testing.assert_close(torch.as_tensor(hand[rank][key]), value)
            torch.testing.assert_close(torch.as_tensor(torch_api[rank][key]), value)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("worker", [dp_tp_step, dp_tp_step_dtensor])
def test_dp_tp_step_weights_unequal_slices_by_example_count(worker, seed):
    """dp = 3 does not divide the batch of 8: the DP ranks get 2, 3 and 3 examples. Averaging
    their three means (module 2's mean of means) would weight the examples unequally; weighted
    by example count, every rank's loss, gradients and new weights equal one device's."""
    ref = reference_step(seed)
    got = launch.run(worker, 3, seed, 3, 1, timeout_s=180)   # mesh (dp=3, tp=1)
    for rank in range(3):
        for key, value in ref.items():
            torch.testing.assert_close(torch.as_tensor(got[rank][key]), value)


def test_dp_larger_than_the_batch_is_refused_naming_dp():
    from course_utils.mesh.grid import BATCH, _dp_rows

    assert [_dp_rows(r, 3).stop - _dp_rows(r, 3).start for r in range(3)] == [2, 3, 3]
    assert _dp_rows(7, BATCH) == slice(7, 8)                 # one example each is fine
    with pytest.raises(ValueError, match="dp must be at most the global batch"):
        _dp_rows(0, BATCH + 1)


def test_dp_tp_other_shapes_and_helper():
    assert len(check_dp_tp(seeds=(3,), dp=4, tp=1)) == 1
    assert len(check_dp_tp(seeds=(4,), dp=1, tp=4)) == 1


def test_dp_tp_step_rejects_wrong_world():
    with pytest.raises(launch.RankError, match="dp x tp must equal world_size"):
        launch.run(dp_tp_step, 2, 0, 2, 2, timeout_s=60)


@pytest.mark.parametrize("sizes, names, rank", [
    ((4, 2, 4), AXES, 13), ((2, 2), ("dp", "tp"), 1), ((2, 2, 2, 2), ("dp", "cp", "pp", "tp"), 5),
    ((4,), ("tp",), 2)])
def test_draw_rank_groups_colours_each_group_by_axis(sizes, names, rank):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from course_utils import style
    from course_utils.mesh.grid import draw_rank_groups

    with matplotlib.rc_context():
        style.use()
        m = Mesh(sizes, names)
        fig = draw_rank_groups(m, rank)
        fig.canvas.draw()
        assert style.problems(fig, fig.canvas.get_renderer()) == []
        ax = fig.get_axes()[0]
        faces = [to_hex(p.get_facecolor()) for p in ax.patches]  # one square per rank
        assert len(faces) == m.world_size and faces[rank] == "#ffffff"
        for axis in names:
            for r in m.group(rank, axis):
                if r != rank and len(m.group(rank, axis)) > 1:
                    assert faces[r] in {style.AXIS_COLORS[a] for a in names}
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend[0].startswith(f"rank {rank}: ") and len(legend) == 1 + len(names)
        plt.close(fig)
