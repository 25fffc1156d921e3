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
# Answer in the cells marked `YOUR CODE HERE`, then run the test cell below each one. Visible
# tests check types; hidden tests check the values when the assignment is graded.

# %%
import torch
import torch.distributed as dist

from course_utils import checks, launch

# %% [markdown]
# ## Q1. Coordinates and groups by hand (3 points)
#
# The lesson's 32-device mesh has axes `(dp, pp, tp)` with sizes `(4, 2, 4)`.
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
assert type(coords_21) is tuple and len(coords_21) == 3, "coords_21 should be a tuple (dp, pp, tp)"
for _name in ("tp_group_21", "pp_group_21", "dp_group_21", "tp_group_21_tp_outer"):
    assert _name in globals(), f"define {_name} in the answer cell above"
    _value = globals()[_name]
    assert type(_value) is list and all(type(r) is int for r in _value), (
        f"{_name} should be a list of ints")
    assert 21 in _value, f"{_name} should contain rank 21 itself"
assert type(tp_groups_crossing) is int, "tp_groups_crossing should be an int"
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

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
_c = coords_of(5, (2, 3))
assert type(_c) is tuple and len(_c) == 2 and all(type(v) is int for v in _c), (
    "coords_of(5, (2, 3)) should be a tuple of 2 ints")
_g = group_of(5, (2, 3), 1)
assert type(_g) is list and len(_g) == 3 and all(type(v) is int for v in _g), (
    "group_of(5, (2, 3), 1) should be a list of 3 ints")
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

import contextlib
import io

from course_utils.mesh import torch_mesh_groups

for _sizes in [(4, 2, 4), (3, 5), (2, 3, 1, 2), (7,)]:
    _n = 1
    for _s in _sizes:
        _n *= _s
    submit(f"coords_of for every rank of {_sizes}",
           [tuple(coords_of(_r, _sizes)) for _r in range(_n)])
    for _axis in range(len(_sizes)):
        submit(f"group_of for every rank of {_sizes}, axis {_axis}",
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

with contextlib.redirect_stderr(io.StringIO()):
    _sums = launch.run(axis_sum, 4, (2, 2), 1, timeout_s=120, show_output=False)
assert type(_sums) is list and len(_sums) == 4
for _s in _sums:
    checks.check_number("axis_sum(...)", _s)
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

import contextlib
import io

for _sizes, _world in [((2, 2), 4), ((1, 2, 2), 4), ((4,), 4)]:
    for _axis in range(len(_sizes)):
        with contextlib.redirect_stderr(io.StringIO()):
            _got = launch.run(axis_sum, _world, _sizes, _axis, timeout_s=120, show_output=False)
        submit(f"axis_sum on every rank (sizes {_sizes}, axis {_axis})", _got)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. The lesson's 70B plan (2 points)
#
# 32 devices: TP = 4, PP = 2, DP = 4; a 70 × 10⁹-parameter model; 16 bytes per parameter.
# Give floats, in billions of parameters and in GB.
#
# * `params_per_shard_b`: parameters each device's TP/PP shard holds, in billions.
# * `gb_zero3`: persistent state per device with ZeRO-3 over the DP ranks.
# * `gb_zero1`: persistent state per device with ZeRO-1 over the DP ranks.

# %% [answer q4]
### BEGIN SOLUTION
params_per_shard_b = 70 / (4 * 2)
gb_zero3 = params_per_shard_b * 16 / 4
gb_zero1 = params_per_shard_b * (2 + 2 + 12 / 4)
### END SOLUTION

# %% [test q4_test points=2]
for _name in ("params_per_shard_b", "gb_zero3", "gb_zero1"):
    assert _name in globals(), f"define {_name} in the answer cell above"
    checks.check_number(_name, globals()[_name])
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("params_per_shard_b", params_per_shard_b)
submit("gb_zero3", gb_zero3)
submit("gb_zero1", gb_zero1)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. Does it fit? (2 points)
#
# Devices have 80 GB. Count only the persistent 16-byte state (ideal balance, no activations).
#
# * Plan A: a 175B model on 128 devices, TP = 8, PP = 4, DP = 4, ZeRO-1.
# * Plan B: a 70B model on 32 devices, TP = 4, PP = 1, DP = 8, ZeRO-1.
#
# Give `gb_a` and `gb_b` (floats, GB per device) and `fits_a`, `fits_b` (bools).

# %% [answer q5]
### BEGIN SOLUTION
gb_a = 175 / (8 * 4) * (4 + 12 / 4)
gb_b = 70 / (4 * 1) * (4 + 12 / 8)
fits_a = gb_a <= 80
fits_b = gb_b <= 80
### END SOLUTION

# %% [test q5_test points=2]
checks.check_number("gb_a", gb_a)
checks.check_number("gb_b", gb_b)
assert type(fits_a) is bool and type(fits_b) is bool, "fits_a and fits_b should be True or False"
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("gb_a", gb_a)
submit("gb_b", gb_b)
submit("fits_a", fits_a)
submit("fits_b", fits_b)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. What the estimate leaves out (2 points, graded by hand)
#
# The playground says the lesson's plan needs 35 GB of an 80 GB device. A colleague concludes
# the job will fit with 45 GB to spare. In a few sentences: name at least three things the
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
# (each DP rank holds different experts, the other weights stay replicated), so the 4 expert
# groups reuse the DP = 4 axis; tokens then travel by all-to-all within each DP group.
# ### END SOLUTION
