# %% [markdown]
# # Module 4: Tensor parallelism
#
# Split one layer across ranks, and check it against one device. Data parallelism copies the
# whole model to every rank. Tensor parallelism (TP) splits the matrices *inside* a layer, so
# every rank holds a fraction of each weight and all ranks work on the **same** examples. The
# lesson makes three claims; this notebook turns each into something that runs on real
# processes (gloo ranks on this machine) and is checked against the single-device layer:
#
# 1. Splitting the columns of `W` in `Y = X W` lets each rank compute different output features.
# 2. How the pieces are combined depends on the split and on the next operation: not every layer
#    uses the same collective.
# 3. TP communicates often, and what it sends grows with the activations, not with the
#    parameters.
#
# **Notation.** `X` has shape `(b, s, h_in)` (batch, sequence, features), `W` has shape
# `(h_in, h_out)` and `Y = X @ W` has shape `(b, s, h_out)`. `t` is the TP degree: the number of
# ranks that share one layer. Careful: `nn.Linear` stores `W` *transposed*, as `weight` of shape
# `(h_out, h_in)`. So "split `W` by columns" means "split `nn.Linear.weight` by rows". We will meet
# this again when PyTorch's DTensor shards `weight` with `Shard(0)`.
#
# The code lives in `course_utils/tensor_parallel/`: `layers.py` (the layers), `conjugates.py`
# (the autograd operators), `comms.py` (what goes on the wire), `comparison.py` (each layer
# against one device) and `pictures.py` (the drawings). Every comparison below uses
# `torch.testing.assert_close` over two seeds; if any tensor differed, the cell would raise.

# %%
import functools
import inspect
import os

import matplotlib.pyplot as plt
import torch

from course_utils import launch, style, tensor_parallel as tp
from course_utils.tensor_parallel import pictures as pics
from course_utils.widgets.tp_layout import TPLayout

style.use()
torch.manual_seed(0)
print("torch", torch.__version__)

# %% [markdown]
# ## 1. Split `W` by columns: each rank owns some output features
#
# Column `j` of `Y` depends only on column `j` of `W`: `Y[:, j] = X @ W[:, j]`. So if rank `r`
# holds a block of columns `W[:, cols_r]` (shape `(h_in, h_out/t)`) and the full input `X`, it can
# compute `Y[:, cols_r]` without talking to anyone. The ranks together hold all of `Y`, in
# pieces. If the next operation needs every feature on every rank, an **all-gather**
# concatenates the pieces.

# %%
_ = pics.draw_column_split(tp=2, tokens=8, h_in=16, h_out=32)
plt.show()

# %% [markdown]
# `tp.compare(kind, tp_size)` starts `tp_size` real ranks with `course_utils.launch.run`. Each
# rank builds the same `nn.Linear(16, 32)` from a seed, keeps its column shard, runs the forward
# and the backward pass (loss `sum(Y * dY)` for a random `dY`), and returns its local tensors.
# The parent process runs the unsplit layer and compares every tensor: outputs, the gradient of
# the input, and the gradients of the weight shards (concatenated back in rank order).
# `tp.comparison_table` puts the runs on 2 and on 4 ranks side by side: the layout its weight
# shapes are given in, rank 0's parameter shapes, the collectives rank 0 issued (with the shape
# and bytes of their result), and, in the last rows, how the ranks' tensors give the
# single-device tensor.

# %%
columns = [tp.compare("column", t) for t in (2, 4)]
print(tp.comparison_table(columns))

# %% [markdown]
# Read the table: the from-scratch layers store `W` itself, so shapes and weight-gradient dims
# are in the `Y = X W` layout. With `t = 2` each rank's weight is `(16, 16)` (half of 32 output
# features); with `t = 4` it is `(16, 8)`, cut along dim 1, the columns, and the weight
# gradient's slices are concatenated along that same dim 1. `y_local` (each rank's own
# features, concatenated) already equals the single-device output before any communication:
# the all-gather only moves data. The backward pass needs one all-reduce for `dL/dX`: each rank's
# output features depend on *all* of `X`, so each rank holds only part of the input gradient, and
# the parts are summed.

# %% [markdown]
# ## 2. Split `W` by rows: each rank computes a partial sum
#
# Split `W` by rows instead (rank `r` holds `W[rows_r, :]`, shape `(h_in/t, h_out)`). Then
# `X @ W = sum_r X[:, rows_r] @ W[rows_r, :]`: each rank needs only its slice of the input
# features and produces a **partial sum** of the full output shape. Concatenating partial sums
# would be wrong (wrong shape and wrong values); they must be added: an **all-reduce**. The bias
# is added once, after the sum; adding it on every rank before the sum would count it `t` times.

# %%
_ = pics.draw_row_split(tp=2, tokens=8, h_in=32, h_out=16)
plt.show()

# %%
rows = [tp.compare("row", t) for t in (2, 4)]
print(tp.comparison_table(rows))

# %% [markdown]
# Each rank's `partial` is a full `(2, 4, 16)` tensor, and only their **sum** equals `X @ W`.
# Here the input arrived already split (`X[..., rows_r]`), so the backward pass needs no
# communication: each rank's input gradient is exactly its slice.
#
# ## 3. Which collective? It depends on the split and on what comes next
#
# | the layer's output | next operation | what combines the results |
# | --- | --- | --- |
# | column-parallel: own features | elementwise (GELU, dropout) | nothing: apply it to the local features |
# | column-parallel: own features | a row-parallel matmul over those features | nothing: the features are exactly its input split |
# | column-parallel: own features | needs every feature (LayerNorm, softmax over features, an unsplit layer) | all-gather |
# | row-parallel: partial sums | anything that needs the true output (residual add, LayerNorm) | all-reduce (sum) |
# | row-parallel: partial sums | an operation split over the sequence (sequence parallelism) | reduce-scatter |
#
# The last row goes beyond this module: Megatron's sequence parallelism replaces the all-reduce
# by a reduce-scatter, then an all-gather before the next column-parallel layer, and moves the
# same bytes. Without it, tensor parallelism splits only the matmuls: after each all-reduce
# every rank holds the whole `(b, s, h)` activation, so the inputs of LayerNorm, dropout and the
# residual add are **replicated** on all t ranks, not divided by t; sequence parallelism splits
# them along the sequence. The rule behind the table: **columns give pieces (concatenate), rows
# give partial sums (add)**, and an elementwise operation between them needs neither.

# %% [markdown]
# ## 4. The conjugate operators f and g
#
# A column-parallel layer followed by GELU and a row-parallel layer needs exactly two
# communication points, written as two autograd functions that mirror each other:
#
# * **f** (`CopyToTensorParallel`), placed before the column-parallel matmul: the forward pass
#   is the identity (every rank already has `X`); the backward pass all-reduces `dL/dX`,
#   because each rank computed it from its own output features only.
# * **g** (`ReduceFromTensorParallel`), placed after the row-parallel matmul: the forward pass
#   all-reduces the partial sums; the backward pass is the identity, because
#   `Y = sum_r P_r` gives `dL/dP_r = dL/dY` on every rank.
#
# The forward of one is the backward of the other. Here is the line each pass of each operator
# returns, read from `course_utils/tensor_parallel/conjugates.py` (`_all_reduce` all-reduces a
# copy of the tensor over the TP group and records the collective; `x.view_as(x)` is the
# identity, a view of the same data):

# %%
for op in (tp.CopyToTensorParallel, tp.ReduceFromTensorParallel):
    for phase in ("forward", "backward"):
        returned = inspect.getsource(getattr(op, phase)).strip().splitlines()[-1].strip()
        print(f"{op.__name__ + '.' + phase:<34} {returned}")

# %% [markdown]
# ## 5. The Megatron MLP: column-parallel, then row-parallel
#
# A transformer MLP is `Y = GELU(X W1 + b1) W2 + b2` with `W1` of shape `(h, ffn)` and `W2` of
# shape `(ffn, h)`. Split `W1` by columns and `W2` by rows, on the same `ffn/t` slice: rank `r`
# computes its `ffn/t` hidden features, applies GELU locally (elementwise, so no collective),
# and those features are exactly the input slice its rows of `W2` need. The only collectives
# are g in the forward pass and f in the backward pass.

# %%
_ = pics.draw_megatron_mlp(tp=2)
plt.show()

# %%
mlp_runs = {t: tp.compare("mlp", t) for t in (2, 4)}
print(tp.comparison_table(mlp_runs.values()))

# %% [markdown]
# One all-reduce forward, one backward, on 2 ranks and on 4, and every output and gradient
# equals the single-device MLP. Had we gathered the hidden features after `W1` (an all-gather of
# a `(b, s, ffn)` tensor, four times the size of the input when `ffn = 4h`) and run `W2` unsplit,
# the result would be the same but every rank would hold all of `W2` and the traffic would grow.
#
# ## 6. Attention split by heads
#
# Attention heads are independent until the output projection. With `n_heads` divisible by `t`,
# rank `r` owns `n_heads/t` whole heads: a column slice of `W_q`, `W_k` and `W_v` (head `i`
# owns features `i*d_head ... (i+1)*d_head`), computes attention for its heads only, and holds a
# row slice of `W_o`. So attention is another column-then-row pair with the same f and g. The
# three column slices are stored side by side in one `qkv` weight so that one f covers them.

# %%
attentions = [tp.compare("attention", t, cfg={"h": 16, "n_heads": 4}) for t in (2, 4)]
print(tp.comparison_table(attentions))

# %% [markdown]
# With 4 heads of width 4: on 2 ranks each rank owns 2 heads (`qkv` is `(16, 3 * 8)`), on 4
# ranks one head each (`(16, 3 * 4)`). A transformer block is attention plus MLP: **two
# all-reduces forward and two backward per block**, each of a `(b, s, h)` activation.
#
# ## 7. The same MLP with PyTorch's DTensor
#
# PyTorch expresses the same plan declaratively: `parallelize_module(mlp, tp_mesh,
# {"up": ColwiseParallel(), "down": RowwiseParallel()})` replaces the parameters by DTensors
# sharded over a one-dimensional device mesh. We run it on the same seeds and compare with the
# same single-device MLP; `CommDebugMode` counts the collectives DTensor issues.

# %%
dtensor_runs = {t: tp.compare("dtensor_mlp", t) for t in (2, 4)}
print(tp.comparison_table(dtensor_runs.values()))

# %% [markdown]
# This table is in the `nn.Linear` layout (its second line says so): DTensor's local shards are
# the from-scratch shards, transposed. `ColwiseParallel` puts `Shard(0)` on `up.weight` because
# `nn.Linear.weight` is `W1` transposed, `(ffn, h)`, so splitting its dim 0 is splitting `W1` by
# columns, and the gradient's slices are concatenated along dim 0 here where the from-scratch
# table said dim 1. `RowwiseParallel` puts `Shard(1)` on `down.weight` and keeps `down.bias`
# replicated (added once, after the all-reduce). It issues the same one all-reduce forward and
# one backward (the collective rows, as counted by `CommDebugMode`). The cell below checks that
# the shapes are the from-scratch shapes transposed:

# %%
print(f"{'rank 0':<16} {'from scratch (Y = X W layout)':<31} DTensor to_local() (nn.Linear)")
for t in (2, 4):
    scratch, dtensor = mlp_runs[t].shapes[0], dtensor_runs[t].shapes[0]
    for name in ("up.weight", "down.weight"):
        assert dtensor[name] == scratch[name][::-1]
        print(f"t={t} {name:<12} {str(scratch[name]):<31} {dtensor[name]}")

# %% [markdown]
# ## 8. Communication per layer, in bytes
#
# Every collective above moves one tensor of the activation's shape `(b, s, h)`. So per
# all-reduce, the payload is `b * s * h * bytes_per_element`, and per layer
#
# | layer | all-reduces forward | all-reduces backward |
# | --- | --- | --- |
# | MLP | 1 (g) | 1 (f) |
# | attention | 1 | 1 |
# | transformer block | 2 | 2 |
#
# With a ring all-reduce each rank sends `2 (t-1)/t` times the payload. None of this mentions
# `ffn` or the number of parameters. `tp.tp_comm_bytes` computes it; first check it against
# the bytes the ranks really all-reduced above (fp32, `b=2, s=4, h=16`):

# %%
counted = [e.nbytes for e in mlp_runs[4].comms[0]]  # the MLP run on 4 ranks
model = tp.tp_comm_bytes(b=2, s=4, h=16, tp=4, dtype=torch.float32, layer="mlp")
print("counted on rank 0:", counted)
print(f"formula          : {model['all_reduces_forward']} all-reduce forward + "
      f"{model['all_reduces_backward']} backward, {model['payload_bytes']} B each; "
      f"a ring sends {model['ring_bytes_sent_per_rank']:.0f} B per rank")
assert counted == [model["payload_bytes"]] * 2
assert sum(counted) == model["forward_bytes"] + model["backward_bytes"]

# %% [markdown]
# Now change the layer's size two ways on 2 ranks: quadruple the parameters (`ffn` 32 → 128),
# or double the activations (`b` 2 → 4). Only the second changes the bytes.

# %%
for cfg in ({"b": 2, "ffn": 32}, {"b": 2, "ffn": 128}, {"b": 4, "ffn": 32}):
    run = tp.compare("mlp", 2, seeds=(0,), cfg=cfg)
    params = tp.mlp_param_count(h=16, ffn=cfg["ffn"])
    sent = sum(e.nbytes for e in run.comms[0])
    print(f"b={cfg['b']} ffn={cfg['ffn']:>3}: {params:>5} parameters, "
          f"{sent:>5} bytes all-reduced per rank (fwd + bwd)")

# %% [markdown]
# At a realistic size the same formula gives large numbers. Take a 7B-class block (`h = 4096`),
# one sequence of `s = 4096` tokens, bf16, TP over `t = 8` ranks, 32 blocks:

# %%
b, s, h, t, layers = 1, 4096, 4096, 8, 32
block = tp.tp_comm_bytes(b=b, s=s, h=h, tp=t, dtype="bf16", layer="block")
print(f"payload of one all-reduce       : {block['payload_bytes'] / 2**20:.0f} MiB")
print(f"all-reduces per block (fwd, bwd): {block['all_reduces_forward']}, "
      f"{block['all_reduces_backward']}")
print(f"sent per rank per block (ring)  : {block['ring_bytes_sent_per_rank'] / 1e6:.1f} MB")
print(f"sent per rank, {layers} blocks        : "
      f"{layers * block['ring_bytes_sent_per_rank'] / 1e9:.2f} GB per sequence")
print(f"pipeline boundary, one direction: {b * s * h * 2 / 2**20:.0f} MiB per boundary")

# %% [markdown]
# About 7.5 GB per rank for one 4096-token sequence, in 128 all-reduces that sit on the critical
# path: the next matmul needs the result. A pipeline stage boundary sends one such activation
# forward and one gradient back. Data parallelism's gradient all-reduce is proportional to the
# parameters instead, once per optimizer step, and can overlap with the backward pass.
#
# ### Try it: the layouts side by side
#
# The explorer below cuts each weight of a layer into t blocks (one colour per rank) and lists
# what one forward and backward send, for the four layers of this notebook: a column-parallel
# and a row-parallel linear, the Megatron MLP and attention split by heads. Its shapes and
# collectives are `tp.layer_plan`'s, which predicts exactly what `tp.compare` recorded on real
# ranks above (the tests check every layer), and its bytes are `tp_comm_bytes`'s. It starts at
# one MLP of the 7B-class block above. **Predict, then move the controls:**
#
# 1. Double the MLP width ffn (16384 to 32768). Do the collectives' bytes change? Predict from
#    the table in section 8, then type it in.
# 2. Switch to the column-parallel linear with its output gathered. Which collective appears in
#    the forward pass, and how many times the MLP's all-reduce payload is it?

# %%
TPLayout(layer="mlp", tp=8, b=1, s=4096, h=4096, ffn=16384)

# %% [markdown]
# ## 9. Communication vs. matmul, measured here
#
# How much that matters depends on how fast the matmuls run compared with the link. Each of 2
# ranks times its share of the MLP's forward matmuls and the all-reduce that follows, for a few
# sizes (`tokens = b * s = 256`, `ffn = 4h`, fp32). Timings vary from run to run.

# %%
# NBVAL_IGNORE_OUTPUT
sizes = [(256, 128, 512), (256, 256, 1024), (256, 512, 2048)]  # (tokens, h, ffn)
timings = launch.run(functools.partial(tp.time_comm_vs_matmul, sizes=sizes, repeats=3), 2,
                     timeout_s=120)[0]
print(f"this machine: {os.cpu_count()} CPU cores; threads per rank for its matmuls: "
      f"{timings[0]['threads']} (2 ranks)")
for row in timings:
    flops, ratio = row["matmul_flops"] / row["matmul_s"], row["all_reduce_s"] / row["matmul_s"]
    print(f"h={row['h']:>4}: matmuls {row['matmul_s'] * 1e3:7.2f} ms "
          f"({flops / 1e9:5.1f} GFLOP/s), all-reduce {row['all_reduce_s'] * 1e3:6.2f} ms "
          f"({row['all_reduce_bytes'] / 1e6:.2f} MB), comm/matmul {ratio:.3f}")

_ = pics.draw_comm_vs_matmul(timings)
plt.show()

# %% [markdown]
# Per token, the matmuls grow with `h * ffn` (here `4h^2`) while the all-reduce grows with `h`,
# so larger layers hide communication better. The batch and sequence length cancel out of the
# ratio: `tp.mlp_comm_to_compute` writes it as `(t-1) * bytes * FLOP/s / (8 * h * link B/s)` for
# `ffn = 4h`. The measured numbers belong to whichever machine runs this notebook: its core
# count (printed above), the threads each rank gets, and whatever else is running on it, so
# read the ratio in your own output. A CPU computes far fewer FLOP/s than an accelerator, which
# tends to leave the all-reduce a small share of the time at the larger sizes. For the smallest
# layer it can come close to the matmul time or exceed it: a small all-reduce costs mostly its
# fixed start-up time (latency), which the bytes-over-bandwidth model leaves out.
#
# An accelerator changes the balance. Suppose, as round assumptions rather than measurements, a
# device sustaining 10^15 FLOP/s, and two kinds of link: 450 GB/s inside a node and 50 GB/s
# between nodes:

# %%
for name, link in (("fast in-node link, 450 GB/s", 450e9), ("network link,     50 GB/s", 50e9)):
    ratio = tp.mlp_comm_to_compute(h=4096, tp=8, dtype="bf16", flops_per_s=1e15,
                                   link_bytes_per_s=link)
    print(f"{name}: comm / matmul = {ratio:.2f}  (h=4096, t=8, bf16)")

# %% [markdown]
# With these assumptions the all-reduces already take about as long as the matmuls on the fast
# link and over eight times longer on the slow one. They are also hard to hide: each one blocks
# the next layer, unless the framework cuts the matmuls into pieces to overlap them. That is why
# TP is usually kept inside the group of devices joined by the fastest links, and data or
# pipeline parallelism spans the slower ones.
#
# The model is only a first guess. It ignores per-message latency (which dominates small
# all-reduces), what the collective library and topology really deliver, contention with other
# traffic, overlap, and how efficiently the smaller `ffn/t` matmuls run. Those are why placement
# is decided by **measuring** the step time, the time spent in collectives and the throughput of
# candidate layouts on the real machine — as the timing cell above does on a small scale
# (`benchmarks/tp_comm_vs_matmul.py` runs a larger sweep, on 2 and 4 ranks, and prints the
# model's prediction beside each measurement).
#
# ## Check yourself
#
# * A column-parallel layer is followed by GELU and then by a row-parallel layer. Which
#   collective runs between them? (None.)
# * Why must a row-parallel layer's bias be added after the all-reduce?
# * Doubling `ffn` doubles an MLP's parameters. What happens to its TP communication? (Nothing.)

# %% [markdown]
# **Next.** The assignment `a4_tensor_parallel` (in your workspace under
# `assignments/a4_tensor_parallel/`) practises this module: shard shapes, the right collective
# for each split, bytes per layer, and a row-parallel forward that runs on real ranks. Then
# Module 5: Pipeline parallelism, which splits the model by layers instead of inside them.
