"""The five collectives on real gloo ranks against a single-process reference, and their pictures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_utils.collectives import primitives as C  # noqa: E402
from course_utils import launch  # noqa: E402

# ------------------------------------------------------------------ workers (top level: picklable)


def _flat_helpers_worker(rank, world_size, shards, fulls):
    """all_gather_flat with uneven shards, reduce_scatter_flat with each op and uneven sizes."""
    out = {"gather": C.all_gather_flat(shards[rank], sizes=[s.numel() for s in shards]).tolist()}
    for op in ("sum", "avg", "max", "min"):
        out[op] = C.reduce_scatter_flat(fulls[rank], op=op).tolist()
    return out


def _random(seed, n, world_size):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for _ in range(world_size)]


# ---------------------------------------------------------------------------------- the lesson


def test_hello_runs_on_two_ranks(capsys):
    assert launch.run(C.hello, 2) == ["hello from rank 0 of 2 (gloo)",
                                      "hello from rank 1 of 2 (gloo)"]
    assert "[rank 1] hello from rank 1 of 2 (gloo)" in capsys.readouterr().out


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name", C.COLLECTIVES)
def test_each_collective_on_real_ranks_equals_reference(name, world_size):
    root = world_size - 1  # a non-zero root catches code that assumes rank 0
    before, after = C.run_collective(name, world_size, root=root, show_output=False)
    expected = C.reference(name, before, root=root)
    for r in range(world_size):
        torch.testing.assert_close(before[r], C.example_inputs(name, world_size)[r])
        if expected[r] is not None:
            torch.testing.assert_close(after[r], expected[r])


def test_example_numbers_stated_in_the_notebook():
    ins = C.example_inputs("all_reduce", 2)
    assert [t.tolist() for t in ins] == [[1.0, 2.0], [11.0, 12.0]]
    assert [t.tolist() for t in C.reference("all_reduce", ins)] == [[12.0, 14.0]] * 2
    assert C.reference("reduce", ins, root=0)[1] is None
    assert [t.tolist() for t in C.reference("broadcast", ins)] == [[1.0, 2.0]] * 2
    assert C.reference("all_gather", ins)[0].tolist() == [1.0, 2.0, 11.0, 12.0]
    rs = C.example_inputs("reduce_scatter", 2)
    assert [t.tolist() for t in rs] == [[1.0, 2.0, 3.0, 4.0], [11.0, 12.0, 13.0, 14.0]]
    assert [t.tolist() for t in C.reference("reduce_scatter", rs)] == [[12.0, 14.0], [16.0, 18.0]]


def test_all_reduce_is_reduce_scatter_then_all_gather():
    ins = _random(0, 7, 3)
    shards = C.reference("reduce_scatter", ins)
    gathered = C.reference("all_gather", shards)
    torch.testing.assert_close(gathered[0], C.reference("all_reduce", ins)[0])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("world_size", [2, 3])
def test_flat_helpers_handle_uneven_sizes_and_every_op(seed, world_size):
    g = torch.Generator().manual_seed(seed)
    shards = [torch.randn(r + 1, generator=g) for r in range(world_size)]  # lengths 1, 2, 3
    fulls = _random(seed + 10, 7, world_size)  # 7 does not divide by 2 or 3
    results = launch.run(_flat_helpers_worker, world_size, shards, fulls, show_output=False)
    for rank, out in enumerate(results):
        torch.testing.assert_close(torch.tensor(out["gather"]),
                                   C.reference("all_gather", shards)[rank])
        for op in ("sum", "avg", "max", "min"):
            torch.testing.assert_close(torch.tensor(out[op]),
                                       C.reference("reduce_scatter", fulls, op=op)[rank])


def test_public_workers_for_other_modules():
    shards = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    assert launch.run(C.all_gather_worker, 2, shards, show_output=False) == [[1.0, 2.0, 3.0]] * 2
    fulls = [torch.arange(5.0), torch.ones(5)]
    assert launch.run(C.reduce_scatter_worker, 2, fulls, show_output=False) == [
        [1.0, 2.0, 3.0], [4.0, 5.0]]


def test_shard_sizes_follow_tensor_split():
    for numel in range(0, 12):
        for ws in (1, 2, 3, 4):
            sizes = C.shard_sizes(numel, ws)
            assert sizes == [len(c) for c in torch.arange(numel).tensor_split(ws)]
            assert C.shard_bounds(numel, ws)[-1][1] == numel


# ------------------------------------------------------------------------------------ pictures


@pytest.mark.parametrize("name", C.COLLECTIVES)
def test_draw_collective_for_each_name(name):
    before, after = [t for t in C.example_inputs(name, 3)], None
    ax = C.draw_collective(name, before, after, root=1)
    assert name.replace("_", "-") in ax.get_title()  # words, not the code name
    texts = [t.get_text() for t in ax.texts]
    assert "rank 2" in texts and "before" in texts and "after" in texts
    plt.close(ax.figure)


def test_lecture_figure_of_the_five_collectives_passes_the_course_figure_check():
    from course_utils import style

    with matplotlib.rc_context():
        style.use()
        fig, axes = plt.subplots(5, 1, figsize=(8, 9.5))
        for ax, name in zip(axes, C.COLLECTIVES):
            C.draw_collective(name, world_size=2, ax=ax)
        fig.tight_layout()
        fig.canvas.draw()
        assert style.problems(fig, fig.canvas.get_renderer()) == []
        plt.close(fig)


def test_draw_collective_marks_scratch_and_cuts_long_rows():
    ins = C.example_inputs("reduce", 2)
    ax = C.draw_collective("reduce", ins, [torch.tensor([12.0, 14.0]), None])
    assert "?" in [t.get_text() for t in ax.texts]  # non-root after reduce: unspecified
    plt.close(ax.figure)
    ax = C.draw_collective("all_gather", world_size=4)  # 4 x 2 = 8 cells gathered
    ax2 = C.draw_collective("all_gather", [torch.arange(6.0)] * 4, max_cells=5)
    assert "…" in [t.get_text() for t in ax2.texts]
    plt.close(ax.figure)
    plt.close(ax2.figure)


def test_provenance():
    ins = C.example_inputs("all_gather", 2)
    assert C.provenance("all_gather", ins) == [[(0,), (0,), (1,), (1,)]] * 2
    assert C.provenance("reduce", ins, root=1) == [[(), ()], [(0, 1), (0, 1)]]
    assert C.provenance("broadcast", ins, root=1) == [[(1,), (1,)]] * 2


# --------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, word", [
    (lambda: C.example_inputs("allreduce", 2), "name"),
    (lambda: C.example_inputs("all_reduce", 0), "world_size"),
    (lambda: C.example_inputs("all_reduce", 2, numel=0), "numel"),
    (lambda: C.reference("reduce", C.example_inputs("reduce", 2), root=2), "root"),
    (lambda: C.reference("all_reduce", C.example_inputs("all_reduce", 2), op="mean"), "op"),
    (lambda: C.reference("all_reduce", []), "inputs"),
    (lambda: C.reference("all_reduce", [torch.ones(2), torch.ones(3)]), "inputs"),
    (lambda: C.reference("all_reduce", [torch.ones(2, 2)]), "inputs[0]"),
    (lambda: C.shard_sizes(-1, 2), "numel"),
    (lambda: C.shard_sizes(4, 0), "world_size"),
    (lambda: C.run_collective("all_reduce", 2, inputs=[torch.ones(2)]), "inputs"),
    (lambda: C.run_collective("broadcast", 2, root=-1), "root"),
    (lambda: C.draw_collective("gather"), "name"),
    (lambda: C.draw_collective("all_reduce", [torch.ones(2)] * 2, [torch.ones(2)]), "after"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, word):
    with pytest.raises(ValueError, match=word.replace("[", r"\[").replace("]", r"\]")):
        call()
