# %% [markdown]
# # Assignment 6: Building a device mesh
#
# Lecture 6 laid ranks out on one grid whose axes are the parallelism degrees, built the same
# mesh with `init_device_mesh`, and sized the lesson's 70B plan. In this assignment you find
# coordinates and groups yourself, write the functions that build them and use them on real gloo
# ranks, and decide whether plans fit a device.
#
# **Convention** (as in the lecture): a mesh has named axes listed **outermost first**, e.g.
# `(dp, pp, tp)`. Ranks fill the grid in row-major order, so the **last** axis varies fastest.
# The group of a rank along an axis is every rank whose other coordinates equal its own. Memory
# uses the lesson's 16-byte mixed-precision Adam layout: 2 (bf16 weights) + 2 (bf16 gradients)
# + 12 (fp32 master copy and two Adam moments) bytes per parameter; 1 GB = 10⁹ bytes. ZeRO
# shards over the **DP** ranks only, with ideal balance.
#
# Answer in the cells marked `YOUR CODE HERE`, then run the test cell below each one.
#
# **What the tests tell you while you practise.** Before each question that asks for values
# (Q1, Q4, Q5) there is a *Practice (not graded)* twin: the same reasoning on another mesh or
# plan, and the cell after it checks your practice answers fully (the right values, or what a
# known wrong value means). For the functions (Q2, Q3) the visible test runs your code on
# visible cases (other meshes than the graded ones; Q3 on 4 real gloo ranks) and checks the
# values, naming the usual mistakes. For the graded values of Q1, Q4 and Q5 the visible test
# checks the types and rejects known wrong answers (another ZeRO stage's figure, a group of the
# wrong size, an answer that contradicts your other answers), without saying what the right one
# is: passing it does not mean the answer is right. **Grading adds** the hidden tests: your
# functions on other meshes (and against a real `init_device_mesh`) and the graded values
# themselves.
#
# **Your own numbers.** Q4 and Q5 use numbers drawn for you (the table the next cell shows,
# `G`): your classmates have other ones, so their answers are wrong for you. They come from
# your identity (your JupyterHub user, the name `make lab` asked for once, or, when your
# instructor grades, your student id, whatever this notebook says). Do not edit that cell.
#
# **Work the answers out yourself.** Some `course_utils` helpers compute a graded answer
# outright (here, for example, `mesh.hand_mesh_groups`). An answer that uses one is flagged for
# your instructor: the questions ask for the reasoning those helpers do.

# %%
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.assess import checks, variants

G = variants.givens("a6_device_mesh", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## Q1. Coordinates and groups by hand (3 points)
#
# *Practice (not graded)*: a 24-device mesh has axes `(dp, pp, tp)` with sizes `(3, 2, 4)`.
#
# * `practice_coords_14`: the coordinates of rank 14 as a tuple `(dp, pp, tp)` of ints.
# * `practice_tp_group_14`, `practice_pp_group_14`, `practice_dp_group_14`: the ranks of rank
#   14's TP, PP and DP groups, each a sorted list of ints.
# * `practice_tp_group_14_tp_outer`: rank 14's TP group (sorted list) when the same degrees are
#   laid out in the order `(tp, pp, dp)`, sizes `(4, 2, 3)`.
# * `practice_tp_groups_crossing`: a mesh `(dp, tp, pp)` with sizes `(4, 4, 2)` runs on nodes of
#   4 GPUs (ranks 0-3 on node 0, 4-7 on node 1, ...). How many of its TP groups contain ranks
#   from more than one node? (an int)
#
# Run the check below it.

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_coords_14 = (1, 1, 2)
practice_tp_group_14 = [12, 13, 14, 15]
practice_pp_group_14 = [10, 14]
practice_dp_group_14 = [6, 14, 22]
practice_tp_group_14_tp_outer = [2, 8, 14, 20]
practice_tp_groups_crossing = 8
### END SOLUTION

# %%
def _practice_same(name, value, want, mistakes=()):
    """value equals want (lists compared sorted); else say which known mistake it is."""
    if type(want) is list:
        assert type(value) is list and all(type(r) is int for r in value), (
            f"{name} should be a list of ints")
        value = sorted(value)
    else:
        assert type(value) is tuple and all(type(c) is int for c in value), (
            f"{name} should be a tuple of ints")
    if value == want:
        return
    for wrong, why in mistakes:
        if value == wrong:
            raise AssertionError(f"{name} = {value}: {why}")
    raise AssertionError(f"{name} = {value} is not right; it is {want}")


_practice_same("practice_coords_14", practice_coords_14, (1, 1, 2), [
    ((2, 1, 1), "you reversed the axes: the tuple is (dp, pp, tp), outermost first"),
    ((2, 0, 2), "you made the first axis (dp) vary fastest; the last axis, tp, does: "
                "tp = 14 % 4, then 14 // 4 = 3 gives pp = 3 % 2 and dp = 3 // 2"),
    ((1, 3, 2), "pp = 14 // 4 = 3 is more than the PP size allows: take the remainder, "
                "(14 // 4) % 2")])
_practice_same("practice_tp_group_14", practice_tp_group_14, [12, 13, 14, 15], [
    ([6, 14, 22], "those ranks are 8 apart: that is the DP group. TP is the last axis, so the "
                  "TP group is 4 neighbours"),
    ([10, 14], "that is the PP group (ranks TP = 4 apart)")])
_practice_same("practice_pp_group_14", practice_pp_group_14, [10, 14], [
    ([14, 18], "rank 14 has pp = 1, so its partner is the stage-0 rank 14 - 4 = 10"),
    ([12, 13, 14, 15], "that is the TP group; PP is the middle axis, ranks TP = 4 apart")])
_practice_same("practice_dp_group_14", practice_dp_group_14, [6, 14, 22], [
    ([2, 6, 10, 14, 18, 22], "that varies both dp and pp; a DP group keeps pp and tp fixed"),
    ([12, 13, 14, 15], "that is the TP group; DP is the outermost axis, ranks PP x TP = 8 "
                       "apart")])
_practice_same("practice_tp_group_14_tp_outer", practice_tp_group_14_tp_outer, [2, 8, 14, 20], [
    ([12, 13, 14, 15], "that is the TP group of the (dp, pp, tp) layout; with TP outermost its "
                       "ranks are PP x DP = 6 apart"),
    ([6, 14, 22], "that is the DP group of the (dp, pp, tp) layout; recompute rank 14's "
                  "coordinates in the (tp, pp, dp) layout first")])
checks.check_number("practice_tp_groups_crossing", practice_tp_groups_crossing, 8, mistakes=[
    (0, "in (dp, tp, pp) the last axis is PP, so a TP group's ranks are PP = 2 apart and span 7 "
        "consecutive ranks: more than a 4-GPU node"),
    (4, "there is one TP group per (dp, pp) pair: DP x PP = 8 of them, not 4"),
    (16, "the mesh has only DP x PP = 8 TP groups")])
print("Q1 practice: all right.")

# %% [markdown]
# **Graded.** The lesson's 32-device mesh has axes `(dp, pp, tp)` with sizes `(4, 2, 4)`.
#
# * `coords_21`: the coordinates of rank 21 as a tuple `(dp, pp, tp)` of ints.
# * `tp_group_21`, `pp_group_21`, `dp_group_21`: the ranks of rank 21's TP, PP and DP groups,
#   each a sorted list of ints.
# * `tp_group_21_tp_outer`: rank 21's TP group (sorted list) when the *same* degrees are laid out
#   in the order `(tp, pp, dp)`, sizes `(4, 2, 4)`: TP outermost.
# * `tp_groups_crossing`: a mesh `(dp, tp, pp)` with sizes `(2, 8, 2)` runs on nodes of 8 GPUs
#   (ranks 0-7 on node 0, 8-15 on node 1, ...). How many of its TP groups contain ranks from
#   more than one node? (an int)

# %% [answer q1]
### BEGIN SOLUTION
coords_21 = (2, 1, 1)
tp_group_21 = [20, 21, 22, 23]
pp_group_21 = [17, 21]
dp_group_21 = [5, 13, 21, 29]
tp_group_21_tp_outer = [5, 13, 21, 29]
tp_groups_crossing = 4
### END SOLUTION

# %% [test q1_test points=3]
# Checks the types and rejects answers that cannot be right; the values are checked when graded.
assert type(coords_21) is tuple and len(coords_21) == 3, "coords_21 should be a tuple (dp, pp, tp)"
for _c, _size, _axis in zip(coords_21, (4, 2, 4), ("dp", "pp", "tp")):
    assert type(_c) is int and 0 <= _c < _size, (
        f"coords_21: the {_axis} coordinate should be an int from 0 to {_size - 1}, got {_c!r}")
for _name, _size in (("tp_group_21", 4), ("pp_group_21", 2), ("dp_group_21", 4),
                     ("tp_group_21_tp_outer", 4)):
    if _name not in globals():
        raise NameError(f"name {_name!r} is not defined: define it in the answer cell above")
    _value = globals()[_name]
    assert type(_value) is list and all(type(r) is int for r in _value), (
        f"{_name} should be a list of ints")
    assert 21 in _value, f"{_name} should contain rank 21 itself"
    assert len(set(_value)) == len(_value) and all(0 <= r < 32 for r in _value), (
        f"{_name} should hold distinct ranks from 0 to 31")
    assert len(_value) == _size, (
        f"{_name} has {len(_value)} ranks; a group along an axis holds one rank per index of "
        f"that axis: {_size}")
for _a, _b in (("tp_group_21", "pp_group_21"), ("tp_group_21", "dp_group_21"),
               ("pp_group_21", "dp_group_21")):
    assert set(globals()[_a]) & set(globals()[_b]) == {21}, (
        f"{_a} and {_b} share ranks other than 21: groups along two different axes meet only "
        "at rank 21 itself")
assert sorted(tp_group_21_tp_outer) != sorted(tp_group_21), (
    "tp_group_21_tp_outer is the TP group of the (dp, pp, tp) layout: with TP outermost, rank "
    "21 has other coordinates, and other TP partners")
checks.check_number("tp_groups_crossing", tp_groups_crossing, mistakes=[
    (0, "TP is not innermost here: in (dp, tp, pp) the last axis, PP, varies fastest, so the "
        "ranks of a TP group are not consecutive; work out which ranks one TP group holds"),
    (8, "8 is the TP degree (ranks in one TP group); the question counts TP groups")])
assert type(tp_groups_crossing) is int, "tp_groups_crossing should be an int"
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("coords_21", coords_21)
submit("tp_group_21", sorted(tp_group_21))
submit("pp_group_21", sorted(pp_group_21))
submit("dp_group_21", sorted(dp_group_21))
submit("tp_group_21_tp_outer", sorted(tp_group_21_tp_outer))
submit("tp_groups_crossing", tp_groups_crossing)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Coordinates and groups for any mesh (3 points)
#
# Write two functions for a mesh whose sizes are given outermost first (any number of axes):
#
# * `coords_of(rank, sizes)` returns the rank's coordinates as a tuple of ints.
# * `group_of(rank, sizes, axis)` returns the sorted list of ranks in the rank's group along
#   axis number `axis` (0 = outermost).
#
# Use plain Python (no `course_utils`). The grader compares your groups with the groups
# `torch.distributed.device_mesh.init_device_mesh` builds on real gloo ranks.

# %% [answer q2]
### BEGIN SOLUTION
def coords_of(rank, sizes):
    coords = []
    for size in reversed(sizes):
        rank, c = divmod(rank, size)
        coords.append(c)
    return tuple(reversed(coords))


def group_of(rank, sizes, axis):
    stride = 1
    for size in sizes[axis + 1:]:
        stride *= size
    base = rank - coords_of(rank, sizes)[axis] * stride
    return [base + i * stride for i in range(sizes[axis])]
### END SOLUTION

# %% [test q2_test points=3]
# Visible cases (the hidden tests use other meshes): the values are checked here.
def _expect(call, got, want, mistakes=()):
    if type(want) is list:
        assert type(got) is list and all(type(v) is int for v in got), (
            f"{call} should return a list of ints, got {got!r}")
        assert sorted(got) != want or got == want, f"{call} = {got}: sort the ranks"
    else:
        assert type(got) is tuple and len(got) == len(want) and all(
            type(v) is int for v in got), f"{call} should return a tuple of {len(want)} ints"
    if got == want:
        return
    for wrong, why in mistakes:
        if got == wrong:
            raise AssertionError(f"{call} = {got}: {why}")
    raise AssertionError(f"{call} = {got} is not right; it is {want}")


_first_fastest = "your first axis varies fastest; in row-major order the last axis does"
_inner_first = "those are the coordinates innermost first; return them outermost first"
_expect("coords_of(7, (3, 4))", coords_of(7, (3, 4)), (1, 3),
        [((1, 2), _first_fastest), ((3, 1), _inner_first)])
_expect("coords_of(10, (2, 3, 2))", coords_of(10, (2, 3, 2)), (1, 2, 0),
        [((0, 2, 1), _inner_first + ", or your first axis varies fastest")])
_expect("group_of(7, (3, 4), 0)", group_of(7, (3, 4), 0), [3, 7, 11], [
    ([4, 5, 6, 7], "that is the group along axis 1; axis 0 is the outermost axis (ranks 4 "
                   "apart)")])
_expect("group_of(7, (3, 4), 1)", group_of(7, (3, 4), 1), [4, 5, 6, 7], [
    ([3, 7, 11], "that is the group along axis 0; axis 1, the last axis, holds neighbours")])
_expect("group_of(10, (2, 3, 2), 1)", group_of(10, (2, 3, 2), 1), [6, 8, 10], [
    ([8, 9, 10], "the middle axis has stride 2 (the product of the sizes after it), not 1"),
    ([4, 10], "that is the group along axis 0")])
_expect("group_of(10, (2, 3, 2), 0)", group_of(10, (2, 3, 2), 0), [4, 10], [
    ([10, 11], "that is the group along the last axis; axis 0 is the outermost (stride 3 x 2)")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

import contextlib
import io

from course_utils.mesh import torch_mesh_groups

for _k, _sizes in enumerate(hidden_cases("q2_test"), 1):  # drawn per submission
    _sizes, _n = tuple(_sizes), 1
    for _s in _sizes:
        _n *= _s
    submit(f"coords_of for every rank of hidden mesh {_k}",
           [tuple(coords_of(_r, _sizes)) for _r in range(_n)])
    for _axis in range(len(_sizes)):
        submit(f"group_of for every rank of hidden mesh {_k}, axis {_axis}",
               [sorted(group_of(_r, _sizes, _axis)) for _r in range(_n)])

for _sizes, _world in [((2, 2), 4), ((2, 1, 2), 4), ((1, 4), 4), ((2, 2, 2), 8)]:
    _names = tuple(f"axis{k}" for k in range(len(_sizes)))
    with contextlib.redirect_stderr(io.StringIO()):
        _views = launch.run(torch_mesh_groups, _world, _sizes, _names, timeout_s=120,
                            show_output=False)
    for _k, _name in enumerate(_names):
        submit(f"init_device_mesh{_sizes} groups, axis {_k}",
               [_view["groups"][_name] for _view in _views])
        submit(f"group_of on the init_device_mesh{_sizes} ranks, axis {_k}",
               [list(group_of(_r, _sizes, _k)) for _r in range(_world)])
    submit(f"init_device_mesh{_sizes} coords",
           [list(_view["coords"].values()) for _view in _views])
    submit(f"coords_of on the init_device_mesh{_sizes} ranks",
           [tuple(coords_of(_r, _sizes)) for _r in range(_world)])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Use your groups on real ranks (3 points)
#
# Write `axis_sum(rank, world_size, sizes, axis)`, run on every rank of a job whose ranks form
# the mesh `sizes`. Each rank contributes the value `10.0 ** rank`. Return (as a Python float)
# the sum of the values of the ranks in this rank's group along `axis`, computed with an
# all-reduce over a process group you build with `dist.new_group`.
#
# Rules of `dist.new_group`: every rank must call it for **every** group (also the groups it is
# not in), in the same order; pass `timeout=datetime.timedelta(seconds=60)`. Use your
# `group_of` from Q2 (it travels to the ranks with `axis_sum`).
#
# Try it: `launch.run(axis_sum, 4, (2, 2), 0)` should give `[101.0, 1010.0, 101.0, 1010.0]`.
# The test cell checks the other axis of that mesh; the hidden tests run other meshes.

# %% [answer q3]
import datetime


def axis_sum(rank, world_size, sizes, axis):
    ### BEGIN SOLUTION
    groups = []
    for r in range(world_size):
        g = group_of(r, sizes, axis)
        if g[0] == r:  # each group once, in rank order of its first member
            groups.append(g)
    my_group = None
    for g in groups:
        handle = dist.new_group(g, timeout=datetime.timedelta(seconds=60))
        if rank in g:
            my_group = handle
    value = torch.tensor([10.0 ** rank], dtype=torch.float64)
    dist.all_reduce(value, group=my_group)
    return float(value.item())
    ### END SOLUTION

# %% [test q3_test points=3]
import contextlib
import io

# A visible case on 4 real ranks (the hidden tests use other meshes): the values are checked.
with contextlib.redirect_stderr(io.StringIO()):
    _sums = launch.run(axis_sum, 4, (2, 2), 1, timeout_s=120, show_output=False)
assert type(_sums) is list and len(_sums) == 4
for _s in _sums:
    checks.check_number("axis_sum(...)", _s)
_sums = [float(_s) for _s in _sums]


def _same_sums(a, b):
    return all(abs(x - y) <= 1e-9 * abs(y) for x, y in zip(a, b))


for _wrong, _why in [
        ([1.0, 10.0, 100.0, 1000.0], "each rank kept its own value: all-reduce it over the "
                                     "rank's group"),
        ([1111.0] * 4, "every rank got the sum of all 4 ranks: the all-reduce ran on the default "
                       "group; pass the rank's own group"),
        ([101.0, 1010.0, 101.0, 1010.0], "those are the sums along axis 0 (ranks 2 apart); "
                                         "along axis 1, the last axis, a group holds "
                                         "neighbours")]:
    assert not _same_sums(_sums, _wrong), f"launch.run(axis_sum, 4, (2, 2), 1) = {_sums}: {_why}"
assert _same_sums(_sums, [11.0, 11.0, 1100.0, 1100.0]), (
    f"launch.run(axis_sum, 4, (2, 2), 1) = {_sums} is not right; it is "
    "[11.0, 11.0, 1100.0, 1100.0] (groups [0, 1] and [2, 3])")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

import contextlib
import io

for _k, _sizes in enumerate(hidden_cases("q3_test"), 1):  # drawn per submission
    _sizes, _world = tuple(_sizes), 1
    for _s in _sizes:
        _world *= _s
    for _axis in range(len(_sizes)):
        with contextlib.redirect_stderr(io.StringIO()):
            _got = launch.run(axis_sum, _world, _sizes, _axis, timeout_s=120, show_output=False)
        submit(f"axis_sum on every rank (hidden mesh {_k}, axis {_axis})", _got)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. A plan like the lesson's 70B one (2 points)
#
# *Practice (not graded)*: 48 devices: TP = 4, PP = 2, DP = 6; a 30 × 10⁹-parameter model;
# 16 bytes per parameter. Give floats: `practice_params_per_shard_b` (billions of parameters in
# each device's TP/PP shard), `practice_gb_zero3` and `practice_gb_zero1` (GB of persistent
# state per device with ZeRO-3, ZeRO-1 over the DP ranks).

# %% [answer q4_practice]
### BEGIN SOLUTION
practice_params_per_shard_b = 30 / (4 * 2)
practice_gb_zero3 = practice_params_per_shard_b * 16 / 6
practice_gb_zero1 = practice_params_per_shard_b * (2 + 2 + 12 / 6)
### END SOLUTION

# %%
checks.check_number("practice_params_per_shard_b", practice_params_per_shard_b, 3.75, mistakes=[
    (30 / 48, "that splits the model over all 48 devices, but the 6 DP ranks each hold a copy: "
              "only TP x PP = 8 devices split it"),
    (30 / 4, "that divides by TP only: the 2 pipeline stages split the layers too"),
    (30e9 / 8, "give billions of parameters (3.75 means 3.75 x 10**9)")])
checks.check_number("practice_gb_zero3", practice_gb_zero3, 10.0, unit="GB", mistakes=[
    (3.75 * 16 / 48, "that shards the shard again over all 48 devices; ZeRO shards over the "
                     "DP = 6 ranks only"),
    (3.75 * 16, "that is the shard without ZeRO; ZeRO-3 shards all 16 bytes over DP = 6"),
    (10e9 / 2**30, "that is in GiB (2**30 bytes); GB here means 10**9 bytes")])
checks.check_number("practice_gb_zero1", practice_gb_zero1, 22.5, unit="GB", mistakes=[
    (10.0, "that is ZeRO-3; ZeRO-1 keeps the bf16 weights and gradients (4 bytes) whole and "
           "shards the 12 optimizer bytes"),
    (3.75 * (2 + 14 / 6), "that is the ZeRO-2 figure: there the bf16 gradients are sharded "
                          "as well"),
    (3.75 * (4 + 12 / 48), "the optimizer state is sharded over the 6 DP ranks, not over all "
                           "48 devices"),
    (3.75 * 16, "that is the shard without ZeRO")])
print("Q4 practice: all right.")

# %% [markdown]
# **Graded.** TP × PP × DP devices and a model of N × 10⁹ parameters, where
# `(TP, PP, DP, N) = G.q4` (yours are in the table at the top); 16 bytes per parameter. Give
# floats, in billions of parameters and in GB.
#
# * `params_per_shard_b`: parameters each device's TP/PP shard holds, in billions.
# * `gb_zero3`: persistent state per device with ZeRO-3 over the DP ranks.
# * `gb_zero1`: persistent state per device with ZeRO-1 over the DP ranks.

# %% [answer q4]
### BEGIN SOLUTION
tp, pp, dp, n_b = G.q4
params_per_shard_b = n_b / (tp * pp)
gb_zero3 = params_per_shard_b * 16 / dp
gb_zero1 = params_per_shard_b * (2 + 2 + 12 / dp)
### END SOLUTION

# %% [test q4_test points=2]
# Checks the types and rejects known wrong answers; the values are checked when graded.
for _name in ("params_per_shard_b", "gb_zero3", "gb_zero1"):
    if _name not in globals():
        raise NameError(f"name {_name!r} is not defined: define it in the answer cell above")
    checks.check_number(_name, globals()[_name])
_p = float(params_per_shard_b)
_tp, _pp, _dp, _n = G.q4
assert _p < 1000, f"params_per_shard_b is in billions of parameters ({_n} means {_n} x 10**9)"
for _name in ("gb_zero3", "gb_zero1"):  # a model's state per device is far below 10**6 GB
    assert float(globals()[_name]) < 1e6, (
        f"{_name} = {float(globals()[_name]):g}: that looks like bytes; give GB (10**9 bytes)")
_devices = _tp * _pp * _dp
checks.check_number("params_per_shard_b", params_per_shard_b, variant=G.key("q4"), mistakes=[
    (_n / _devices, f"that splits the model over all {_devices} devices, but DP ranks hold "
                    "copies of the model, they do not split it"),
    (_n / _tp, f"that divides {_n} by one degree only: which degrees split the model, and "
               "which replicate it?")])
checks.check_number("gb_zero3", gb_zero3, unit="GB", variant=G.key("q4"), mistakes=[
    (_p * 16, "that is your shard's state without ZeRO; ZeRO-3 shards it over the DP ranks"),
    (_p * 16 / _devices, f"that shards your TP/PP shard again over all {_devices} devices; "
                         "ZeRO shards only over the DP ranks")])
checks.check_number("gb_zero1", gb_zero1, unit="GB", variant=G.key("q4"), mistakes=[
    (float(gb_zero3), "that is your ZeRO-3 figure; ZeRO-1 shards less (only the optimizer "
                      "state), so it keeps more per device"),
    (_p * 16, "that is your shard's state without ZeRO; ZeRO-1 shards the optimizer state "
              "over the DP ranks")])
assert float(gb_zero1) > float(gb_zero3), (
    "gb_zero1 should be larger than gb_zero3: ZeRO-1 shards only the optimizer state, ZeRO-3 "
    "shards everything")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("params_per_shard_b", params_per_shard_b)
submit("gb_zero3", gb_zero3)
submit("gb_zero1", gb_zero1)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. Does it fit? (2 points)
#
# *Practice (not graded)*: devices have 80 GB; count only the persistent 16-byte state.
#
# * Plan C: a 120B model on 32 devices, TP = 8, PP = 1, DP = 4, **ZeRO-2**.
# * Plan D: a 100B model on 64 devices, TP = 4, PP = 2, DP = 8, ZeRO-1.
#
# Give `practice_gb_c`, `practice_gb_d` (floats, GB per device) and `practice_fits_c`,
# `practice_fits_d` (bools).

# %% [answer q5_practice]
### BEGIN SOLUTION
practice_gb_c = 120 / (8 * 1) * (2 + 14 / 4)
practice_gb_d = 100 / (4 * 2) * (4 + 12 / 8)
practice_fits_c = practice_gb_c <= 80
practice_fits_d = practice_gb_d <= 80
### END SOLUTION

# %%
checks.check_number("practice_gb_c", practice_gb_c, 82.5, unit="GB", mistakes=[
    (15 * 7, "that is ZeRO-1; ZeRO-2 shards the bf16 gradients over the DP ranks too"),
    (15 * 4, "that is ZeRO-3; ZeRO-2 keeps the bf16 weights whole"),
    (15 * (2 + 14 / 32), "gradients and optimizer state are sharded over the 4 DP ranks, "
                         "not over all 32 devices"),
    (120 / 32 * 5.5, "you counted the DP ranks in the model shard: only TP x PP = 8 split it")])
checks.check_number("practice_gb_d", practice_gb_d, 68.75, unit="GB", mistakes=[
    (12.5 * 2, "that is plan D with ZeRO-3; with ZeRO-1 the 4 bytes of bf16 weights and "
               "gradients stay whole"),
    (12.5 * (4 + 12 / 64), "the optimizer state is sharded over the 8 DP ranks, not over all "
                           "64 devices"),
    (100 / 64 * 5.5, "you counted the DP ranks in the model shard: only TP x PP = 8 split it")])
checks.check_choice("practice_fits_c", practice_fits_c, False, [True, False], hint=(
    "82.5 GB of state is more than the 80 GB a device has, even before activations"))
checks.check_choice("practice_fits_d", practice_fits_d, True, [True, False], hint=(
    "68.75 GB of persistent state fits in 80 GB (activations would have to fit in the rest)"))
print("Q5 practice: all right.")

# %% [markdown]
# **Graded.** Devices have 80 GB. Count only the persistent 16-byte state (ideal balance, no activations).
#
# * Plan A: a model of N_A × 10⁹ parameters with ZeRO-1 on TP × PP × DP devices, where
#   `(N_A, TP, PP, DP), _ = G.q5`.
# * Plan B: the same for `_, (N_B, TP, PP, DP) = G.q5`.
#
# Give `gb_a` and `gb_b` (floats, GB per device) and `fits_a`, `fits_b` (bools).

# %% [answer q5]
### BEGIN SOLUTION
(n_a, tp_a, pp_a, dp_a), (n_b, tp_b, pp_b, dp_b) = G.q5
gb_a = n_a / (tp_a * pp_a) * (4 + 12 / dp_a)
gb_b = n_b / (tp_b * pp_b) * (4 + 12 / dp_b)
fits_a = gb_a <= 80
fits_b = gb_b <= 80
### END SOLUTION

# %% [test q5_test points=2]
# Checks the types and rejects known wrong answers; the values are checked when graded.
for _plan, (_n, _tp, _pp, _dp), _gb in zip("ab", G.q5, (gb_a, gb_b)):
    _shard, _devices = _n / (_tp * _pp), _tp * _pp * _dp
    checks.check_number(f"gb_{_plan}", _gb, unit="GB", variant=G.key("q5"), mistakes=[
        (_shard * 16 / _dp, f"that is plan {_plan.upper()} with ZeRO-3 (all 16 bytes sharded); "
                            "ZeRO-1 shards only the optimizer state"),
        (_shard * (2 + 14 / _dp), f"that is plan {_plan.upper()} with ZeRO-2; ZeRO-1 keeps the "
                                  "gradients whole"),
        *([(_shard * (4 + 12 / _devices), f"ZeRO-1 shards over the DP ranks only, not over all "
                                          f"{_devices} devices")] if _devices != _dp else [])])
assert type(fits_a) is bool and type(fits_b) is bool, "fits_a and fits_b should be True or False"
for _fits, _gb, _plan in ((fits_a, gb_a, "a"), (fits_b, gb_b, "b")):
    assert _fits == (float(_gb) <= 80), (
        f"fits_{_plan} = {_fits} contradicts your gb_{_plan} = {float(_gb):g} GB on an 80 GB "
        "device")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("gb_a", gb_a)
submit("gb_b", gb_b)
submit("fits_a", fits_a)
submit("fits_b", fits_b)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. What the estimate leaves out (2 points, graded by hand)
#
# The playground's persistent-state estimate (`plan()` without a sequence length) says the
# lesson's plan needs 35 GB of an 80 GB device. A colleague concludes the job will fit with
# 45 GB to spare. In a few sentences: name at least three things the
# estimate leaves out that could use that room, and what you would measure in a first real run
# to check. Then: the team wants to add expert parallelism with 4 expert groups. Must the job
# grow to 4 x 32 devices? Explain when EP can reuse existing device groups.

# %% [manual q6_explain points=2]
# ### BEGIN SOLUTION
# The 35 GB counts only persistent state. Left out: activations saved for backward (they grow
# with sequence length and microbatch size and are often the largest term; checkpointing trades
# them for recomputation), the parameters ZeRO-3 gathers for each layer plus the communication
# buffers and workspaces (peaks, not persistent state), fragmentation, and imbalance between
# layers/stages (embeddings, output layer). Measure peak memory per rank, step time, throughput
# and time waiting at collectives, after checking the loss and gradient scaling.
# EP need not multiply the device count: experts can be spread over the existing DP ranks
# (each DP rank holds different experts; the non-expert weights stay as DP keeps them, which
# under this plan's ZeRO-3 means sharded over the 4 DP ranks, not replicated), so the 4 expert
# groups reuse the DP = 4 axis; tokens then travel by all-to-all within each DP group.
#
# **Rubric** (2 points):
# * 1 point: names at least three things the 35 GB leaves out (activations saved for backward;
#   the layers ZeRO-3 gathers, communication buffers and workspaces; allocator fragmentation;
#   imbalance between stages such as the embedding and output layers) and at least one thing to
#   measure in a first run (peak memory per rank, step time or throughput, time waiting in
#   collectives).
# * 1 point: says EP need not multiply the device count: the expert groups can reuse an existing
#   axis (the DP = 4 ranks hold different experts), the non-expert weights stay as DP keeps them
#   (sharded over DP under this plan's ZeRO-3), and tokens move by all-to-all within the group.
# * 0 points: agrees that 45 GB are free for sure, or says EP needs 4 x 32 devices, with no
#   correct account of either part.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a6_device_mesh.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a6_device_mesh/a6_device_mesh.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a6_device_mesh` grades your copy the same way.
