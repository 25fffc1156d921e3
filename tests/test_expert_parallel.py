"""course_utils.sequence_parallel.experts: MoE token routing and Ulysses sequence parallelism with
all-to-all on real gloo ranks, each checked against one device over several seeds."""

from __future__ import annotations

import pytest
import torch

from course_utils import launch
from course_utils.sequence_parallel.experts import (attention_inputs, attention_reference, check_moe,
                                          check_ulysses, make_moe, moe_expert_parallel,
                                          moe_reference, moe_tokens, route, ulysses_attention)


def test_moe_reference_is_gate_times_chosen_expert():
    params = make_moe(0, 4)
    x = moe_tokens(0, 10)
    expert, gate = route(x, params["router"])
    assert expert.shape == (10,) and expert.dtype == torch.int64 and gate.shape == (10,)
    out = moe_reference(x, params)
    for t in range(10):  # one token at a time, the plain definition
        e = int(expert[t])
        want = gate[t] * (torch.relu(x[t] @ params["w1"][e]) @ params["w2"][e])
        torch.testing.assert_close(out[t], want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_moe_all_to_all_equals_one_device(seed):
    results = check_moe(seed, world_size=4, tokens_per_rank=6, n_experts=4)
    assert [r["my_experts"] for r in results] == [[0], [1], [2], [3]]
    assert all(sum(r["sent"]) == 6 for r in results)                 # every token goes somewhere
    assert sum(sum(r["received"]) for r in results) == 24


@pytest.mark.parametrize("seed", [0, 1])
def test_moe_two_experts_per_rank(seed):
    results = check_moe(seed, world_size=2, tokens_per_rank=8, n_experts=4)
    assert [r["my_experts"] for r in results] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("seed", [0, 1])
def test_moe_reuses_the_dp_groups_as_ep_groups(seed):
    results = check_moe(seed, world_size=4, tokens_per_rank=6, n_experts=4,
                        mesh_sizes=(2, 2), mesh_names=("dp", "tp"), ep_axis="dp")
    assert [r["ep_ranks"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["my_experts"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_moe_rank_with_no_tokens_for_a_peer():
    """Uneven splits include zeros: a rank may send nothing to some expert rank."""
    results = check_moe(0, world_size=4, tokens_per_rank=3, n_experts=8)
    assert any(0 in r["sent"] for r in results)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_ulysses_equals_one_device(seed, causal):
    results = check_ulysses(seed, world_size=4, seq=8, heads=4, causal=causal)
    assert results[0]["local_shape"] == [2, 4, 4]    # my 2 tokens, all 4 heads
    assert results[0]["heads_shape"] == [8, 1, 4]    # all 8 tokens, my 1 head
    assert results[0]["sent_elements"] == 4 * 2 * 4 * 4 * 3 // 4  # 3/4 of 4 tensors leave


@pytest.mark.parametrize("seed", [0, 1])
def test_ulysses_over_the_tp_groups(seed):
    results = check_ulysses(seed, world_size=4, seq=8, heads=4, mesh_sizes=(2, 2),
                            mesh_names=("dp", "tp"), sp_axis="tp")
    assert [r["sp_ranks"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert results[0]["heads_shape"] == [8, 2, 4]


def test_attention_reference_matches_explicit_softmax():
    q, k, v = attention_inputs(3, 6, 2)
    out = attention_reference(q, k, v, causal=True)
    for h in range(2):
        scores = q[:, h] @ k[:, h].T / 2.0                  # head_dim 4: sqrt = 2
        scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
        torch.testing.assert_close(out[:, h], torch.softmax(scores, -1) @ v[:, h])


@pytest.mark.parametrize("call, match", [
    (lambda: make_moe(0, 0), "n_experts"),
    (lambda: moe_tokens(0, 0), "n_tokens"),
    (lambda: attention_inputs(0, 0, 2), "seq"),
    (lambda: attention_inputs(0, 4, 2, head_dim=0), "head_dim"),
])
def test_bad_input_raises_value_error_naming_it(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_workers_reject_shapes_that_do_not_split():
    with pytest.raises(launch.RankError, match="n_experts must be a multiple"):
        launch.run(moe_expert_parallel, 2, 0, 4, 3, timeout_s=60)
    with pytest.raises(launch.RankError, match="seq and heads must be multiples"):
        launch.run(ulysses_attention, 2, 0, 6, 3, timeout_s=60)


def test_draw_token_routing_shows_each_experts_load():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils import style
    from course_utils.sequence_parallel.experts import draw_token_routing

    runs = {f"seed {s}": check_moe(s, world_size=4, tokens_per_rank=6, n_experts=4)
            for s in (0, 1)}
    assert [sum(r["received"]) for r in runs["seed 0"]] == [5, 8, 1, 10]  # the lecture's claim
    with matplotlib.rc_context():
        style.use()
        fig = draw_token_routing(runs)
        fig.canvas.draw()
        assert style.problems(fig, fig.canvas.get_renderer()) == []
        ax = fig.get_axes()[0]
        cells = sorted((t.get_position(), t.get_text()) for t in ax.texts)
        assert len(cells) == 16 and [c[1] for c in cells][:4] == ["2", "1", "2", "0"]  # column 0
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks[2].endswith("1 token") and ticks[3].endswith("10 tokens")
        plt.close(fig)


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_draw_all_to_all_transposes_the_grid(world_size):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from course_utils import style
    from course_utils.sequence_parallel.experts import draw_all_to_all

    n = world_size
    with matplotlib.rc_context():
        style.use()
        fig = draw_all_to_all(world_size=n)
        fig.canvas.draw()
        assert style.problems(fig, fig.canvas.get_renderer()) == []
        before, after = fig.get_axes()
        for ax, flipped in ((before, False), (after, True)):
            cells = {(round(t.get_position()[1] - 0.5), round(t.get_position()[0] - 0.5)):
                     t.get_text() for t in ax.texts}                      # (row, col) -> "i→j"
            assert len(cells) == n * n
            for (row, col), text in cells.items():                       # row = the rank
                src, dst = (col, row) if flipped else (row, col)
                assert text == f"{src}→{dst}"
        faces = lambda ax: [to_hex(p.get_facecolor()) for p in ax.patches]  # noqa: E731
        left, right = faces(before), faces(after)                        # row-major squares
        assert [left[r * n + c] for r in range(n) for c in range(n)] == \
               [right[c * n + r] for r in range(n) for c in range(n)]   # shade travels with chunk
        assert len(set(left)) == n                                       # one shade per sender
        plt.close(fig)


@pytest.mark.parametrize("world_size", [1, 9, 2.0])
def test_draw_all_to_all_rejects_bad_world_size(world_size):
    from course_utils.sequence_parallel.experts import draw_all_to_all

    with pytest.raises(ValueError, match="world_size"):
        draw_all_to_all(world_size=world_size)
