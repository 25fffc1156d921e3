# %% [markdown]
# # Assignment 4: Tensor parallelism
#
# Lecture 4 split one layer's matrices across ranks and checked every output and gradient
# against one device. Here you work out the shapes, the collectives and the bytes yourself, and
# write a row-parallel linear layer that the tests run on real gloo ranks.
#
# **Notation** (as in the lecture): `Y = X @ W` with `X` of shape `(b, s, h_in)`, `W` of shape
# `(h_in, h_out)`. `nn.Linear` stores `W` transposed: its `weight` is `(h_out, h_in)`. `t` is the
# tensor-parallel degree. "Column-parallel" splits `W` by columns (output features),
# "row-parallel" by rows (input features). Shards are equal and contiguous, in rank order.
#
# Answer in the cells marked `YOUR CODE HERE`, then run the test cell below each one. Visible tests
# check types and shapes; hidden tests check the values when the assignment is graded.

# %%
import math

import torch
import torch.distributed as dist

from course_utils import checks, launch

# %% [markdown]
# ## Q1. Shard shapes (3 points)
#
# A transformer MLP has `W1` of shape `(h, ffn)` and `W2` of shape `(ffn, h)` with `h = 1024`,
# `ffn = 4096`, split Megatron-style over `t = 8` ranks: `W1` column-parallel, `W2` row-parallel.
# Give each answer as a tuple of ints.
#
# * `w1_local`: the shape of one rank's shard of `W1` (in the `Y = X @ W` layout above).
# * `w2_local`: the shape of one rank's shard of `W2`.
# * `partial_local`: the shape of the tensor one rank computes with its shard of `W2` for an
#   input batch with `b = 2`, `s = 128`, before any communication.
# * `dtensor_up_local`: the same `W1` as `up = nn.Linear(1024, 4096)`, parallelized with
#   DTensor's `ColwiseParallel()` on a mesh of 8 ranks. The shape of `up.weight.to_local()`.

# %% [answer q1]
### BEGIN SOLUTION
w1_local = (1024, 512)
w2_local = (512, 1024)
partial_local = (2, 128, 1024)
dtensor_up_local = (512, 1024)
### END SOLUTION

# %% [test q1_test points=3]
for name, value, length in (("w1_local", w1_local, 2), ("w2_local", w2_local, 2),
                            ("partial_local", partial_local, 3),
                            ("dtensor_up_local", dtensor_up_local, 2)):
    assert type(value) in (tuple, list), f"{name} should be a tuple of ints, got {type(value).__name__}"
    assert len(value) == length, f"{name} should have {length} entries, got {len(value)}"
    for i, dim in enumerate(value):
        checks.check_number(f"{name}[{i}]", dim)
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("w1_local[0]", w1_local[0])
submit("w1_local[1]", w1_local[1])
submit("w2_local[0]", w2_local[0])
submit("w2_local[1]", w2_local[1])
submit("partial_local[2]", partial_local[2])
submit("partial_local[0]", partial_local[0])
submit("partial_local[1]", partial_local[1])
submit("dtensor_up_local[0]", dtensor_up_local[0])
submit("dtensor_up_local[1]", dtensor_up_local[1])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Which collective combines the results? (3 points)
#
# For each situation, answer one of `"all-reduce"`, `"all-gather"`, `"reduce-scatter"`, `"none"`
# (the collective that must run on the layer's output, or `"none"` if the next operation can
# use the local results as they are). Then count the all-reduces of the Megatron MLP.
#
# * `a_col_then_gelu`: a column-parallel linear followed by an elementwise GELU.
# * `b_row_then_residual`: a row-parallel linear followed by a residual add `X + Y` that needs
#   the true `Y` on every rank.
# * `c_col_then_layernorm`: a column-parallel linear followed by a LayerNorm over all its
#   output features, on every rank.
# * `d_col_input_grad`: in the backward pass of a column-parallel linear whose input `X` was the
#   same on every rank, combining the ranks' `dL/dX` into the true input gradient.
# * `e_row_then_seq_split`: a row-parallel linear followed by an operation on which each rank
#   handles only `s/t` of the sequence positions (sequence parallelism).
# * `mlp_fwd_all_reduces`, `mlp_bwd_all_reduces`: ints, the all-reduces one Megatron MLP
#   (column-parallel, GELU, row-parallel) issues in its forward and in its backward pass.

# %% [answer q2]
### BEGIN SOLUTION
a_col_then_gelu = "none"
b_row_then_residual = "all-reduce"
c_col_then_layernorm = "all-gather"
d_col_input_grad = "all-reduce"
e_row_then_seq_split = "reduce-scatter"
mlp_fwd_all_reduces = 1
mlp_bwd_all_reduces = 1
### END SOLUTION

# %% [test q2_test points=3]
CHOICES = ["all-reduce", "all-gather", "reduce-scatter", "none"]
for name in ("a_col_then_gelu", "b_row_then_residual", "c_col_then_layernorm", "d_col_input_grad",
             "e_row_then_seq_split"):
    value = globals()[name]
    assert type(value) is str and value.lower() in CHOICES, f"{name} should be one of {CHOICES}, got {value!r}"
checks.check_number("mlp_fwd_all_reduces", mlp_fwd_all_reduces)
checks.check_number("mlp_bwd_all_reduces", mlp_bwd_all_reduces)
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("a_col_then_gelu", a_col_then_gelu)
submit("b_row_then_residual", b_row_then_residual)
submit("c_col_then_layernorm", c_col_then_layernorm)
submit("d_col_input_grad", d_col_input_grad)
submit("e_row_then_seq_split", e_row_then_seq_split)
submit("mlp_fwd_all_reduces", mlp_fwd_all_reduces)
submit("mlp_bwd_all_reduces", mlp_bwd_all_reduces)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Bytes on the wire (3 points)
#
# A model has `L = 40` transformer blocks with `h = 5120`, runs in bf16 (2 bytes per element)
# with TP degree `t = 8`, and processes a micro-batch of `b = 4` sequences of `s = 2048` tokens.
# Each block is attention plus an MLP with `ffn = 4h`, both split Megatron-style. Count only
# the tensor-parallel all-reduces. 1 GB = 10^9 bytes.
#
# * `mlp_forward_bytes`: the size in bytes of the tensor all-reduced in one MLP's forward pass.
# * `step_payload_gb`: the total size in GB of all tensors all-reduced by all `L` blocks for one
#   micro-batch, forward and backward.
# * `ring_gb_per_rank`: with a ring all-reduce, how many GB each rank **sends** for the same
#   micro-batch.
# * `naive_over_megatron`: a colleague instead all-gathers the GELU output of the
#   column-parallel `W1` so that every rank can run all of `W2`. How many times larger is the
#   all-gather's result than the tensor Megatron's forward all-reduce moves?

# %% [answer q3]
### BEGIN SOLUTION
b, s, h, t, L = 4, 2048, 5120, 8, 40
mlp_forward_bytes = b * s * h * 2
step_payload_gb = L * 4 * mlp_forward_bytes / 1e9
ring_gb_per_rank = 2 * (t - 1) / t * step_payload_gb
naive_over_megatron = (b * s * 4 * h * 2) / mlp_forward_bytes
### END SOLUTION

# %% [test q3_test points=3]
for name in ("mlp_forward_bytes", "step_payload_gb", "ring_gb_per_rank", "naive_over_megatron"):
    checks.check_number(name, globals()[name])
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("mlp_forward_bytes", mlp_forward_bytes)
submit("step_payload_gb", step_payload_gb)
submit("ring_gb_per_rank", ring_gb_per_rank)
submit("naive_over_megatron", naive_over_megatron)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. A row-parallel linear on real ranks (4 points)
#
# Write `row_parallel_linear(x_local, w_local, bias, tp_group)`, run by every rank of one
# tensor-parallel group:
#
# * `x_local`: shape `(b, s, h_in / t)`, this rank's slice of the input features;
# * `w_local`: shape `(h_in / t, h_out)`, this rank's rows of `W`;
# * `bias`: shape `(h_out,)`, the same on every rank;
# * `tp_group`: the process group of this layer's ranks. It may be smaller than the world:
#   the tests also run two independent TP groups side by side (ranks `{0, 1}` and `{2, 3}`, each
#   with its own input), so pass it to every collective you call.
#
# Return the full `Y = X @ W + bias`, shape `(b, s, h_out)`, on every rank of the group. Use
# `torch.distributed` (imported as `dist`). The tests compare your result with `X @ W + bias`
# computed on one device, and report which collectives you called.

# %% [answer q4]
def row_parallel_linear(x_local, w_local, bias, tp_group=None):
    """Row-parallel Y = X @ W + bias: (b, s, h_in/t) x (h_in/t, h_out) -> (b, s, h_out)."""
    ### BEGIN SOLUTION
    partial = x_local @ w_local               # (b, s, h_out): this rank's share of the sum
    dist.all_reduce(partial, group=tp_group)  # sum over the tp group
    return partial + bias                     # bias once, after the sum
    ### END SOLUTION

# %% [test q4_test points=4]
from course_utils import tensor_parallel as tp_harness

gen = torch.Generator().manual_seed(1)
x = torch.randn(2, 3, 8, generator=gen)    # (b, s, h_in)
w = torch.randn(8, 4, generator=gen)       # (h_in, h_out)
bias = torch.randn(4, generator=gen)       # (h_out,)
runs = tp_harness.run_row_parallel(row_parallel_linear, 2, [x], w, bias, timeout_s=50)
for rank, run in enumerate(runs):
    assert isinstance(run["y"], torch.Tensor), f"rank {rank} returned {type(run['y']).__name__}, not a tensor"
    assert tuple(run["y"].shape) == (2, 3, 4), f"rank {rank} returned shape {tuple(run['y'].shape)}; expected (b, s, h_out) = (2, 3, 4)"
### BEGIN HIDDEN TESTS
from course_utils.checks import submit


def _submit_runs(label, tp_size, xs, w, bias):
    """Run the student's layer on real ranks; hand each rank's result and collectives over."""
    runs = tp_harness.run_row_parallel(row_parallel_linear, tp_size, xs, w, bias, timeout_s=50)
    submit(f"{label}: calls per rank", [run["calls"] for run in runs])
    submit(f"{label}: y per rank", [run["y"] for run in runs])


for seed in (0, 1):  # one TP group of 2 ranks
    gen = torch.Generator().manual_seed(100 + seed)
    xs = [torch.randn(2, 5, 12, generator=gen)]
    w, bias = torch.randn(12, 6, generator=gen), torch.randn(6, generator=gen)
    _submit_runs(f"one tp group of 2, seed {100 + seed}", 2, xs, w, bias)
gen = torch.Generator().manual_seed(7)  # one TP group of 4 ranks
xs = [torch.randn(3, 2, 16, generator=gen)]
w, bias = torch.randn(16, 5, generator=gen), torch.randn(5, generator=gen)
_submit_runs("one tp group of 4, seed 7", 4, xs, w, bias)
gen = torch.Generator().manual_seed(8)  # two TP groups of 2 ({0,1}, {2,3}), different inputs
xs = [torch.randn(2, 3, 8, generator=gen), torch.randn(2, 3, 8, generator=gen)]
w, bias = torch.randn(8, 4, generator=gen), torch.randn(4, generator=gen)
_submit_runs("two tp groups of 2, seed 8", 2, xs, w, bias)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. Where does TP go? (2 points, graded by hand)
#
# A cluster has nodes of 8 accelerators joined by fast links inside each node and a slower
# network between nodes. You are choosing between TP = 8 inside each node and TP = 16 across
# two nodes. In a few sentences: why is TP usually kept on the fastest links (use what you
# counted in Q3: what is communicated, how often, and can it be hidden behind computation)?
# And what would you measure before deciding, rather than trusting a bytes-over-bandwidth
# estimate?

# %% [manual q5_explain points=2]
# ### BEGIN SOLUTION
# TP all-reduces a full activation (b, s, h) four times per block per micro-batch (Q3: about
# 23 GB sent per rank per micro-batch for that model), and each all-reduce blocks the next
# matmul, so it sits on the critical path and can hardly be overlapped. Its size does not shrink
# as TP grows, while each rank's matmuls do, so the ratio of communication to compute rises
# with t and with slower links: on a link several times slower, the all-reduces can take longer
# than the matmuls. Data parallelism (gradients once per step, overlappable) and pipeline
# parallelism (one activation per stage boundary) tolerate the slower network better.
# Before deciding I would run both layouts on the real cluster and measure step time and tokens
# per second, the time spent waiting in collectives (profiler), the achieved all-reduce
# bandwidth and latency at the real message sizes, and peak memory, since latency, topology,
# contention, overlap and the efficiency of the smaller matmuls are not in the estimate.
# ### END SOLUTION
