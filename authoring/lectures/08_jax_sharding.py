# %% [markdown]
# # Module 8: The same plans in JAX
#
# Modules 2 to 6 built each plan by hand on gloo ranks: every rank was a process, and we wrote
# every collective ourselves (or PyTorch's DDP, FSDP and DTensor wrote them for us). JAX comes
# at the same ideas from the other side. One process sees several **devices**; you declare a
# **mesh** of them with named axes and say how each array is split over those axes (a
# **sharding**); the XLA compiler then partitions the program and **inserts the collectives**.
# Or you write the per-device program yourself with `shard_map` and name each collective,
# as we did in module 4. The lesson's point stands in both frameworks: the partitioning and the
# communication must be reasoned about, and a speed comparison means something only for a
# pinned workload.
#
# This notebook sees every earlier idea again, in JAX, and checks each against one device:
#
# 1. a mesh, a sharding, and where each shard of a weight matrix lives;
# 2. data parallelism (module 2), the lesson's two-replica example included;
# 3. tensor parallelism (module 4): which collective the compiler inserted for each layout,
#    read from the compiled program, and the same layers written with `shard_map`;
# 4. FSDP/ZeRO-3 (module 3): sharded training state, bytes per device;
# 5. a 2-D `data x model` mesh (module 6);
# 6. the same training step in PyTorch and in JAX, compared on a pinned workload (module 7).
#
# The code lives in `course_utils/jax_sharding.py` and `course_utils/framework_compare.py`.
#
# **Eight devices on one laptop.** XLA can split this one CPU into several "devices"; the flag
# `--xla_force_host_platform_device_count=8` in the environment variable `XLA_FLAGS` asks for 8.
# XLA reads it once, when JAX's CPU backend starts: at the first `jax.devices()` or the first
# computation, not at `import jax` (`jax.config.update("jax_num_cpu_devices", 8)` before that
# point does the same; after it, both are too late: a test shows the three cases). The setup
# cell sets the flag before importing JAX, the simplest safe order. (Already ran JAX in this
# kernel without it? `js.require_devices` stops with a message saying so: restart the kernel.) Every "device" runs on the same cores, so nothing here is faster for
# being split: we study *what* is computed and communicated, not speed.

# %%
import inspect
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before `import jax`

import jax
import matplotlib.pyplot as plt
import numpy as np

from course_utils import framework_compare as fc, jax_sharding as js, memory, style
from course_utils.jax_sharding import P

style.use()
devices = js.require_devices(8)
print("jax", jax.__version__, "|", len(devices), "devices:", ", ".join(str(d) for d in devices))

# %% [markdown]
# ## 1. A mesh, a sharding, and where each shard lives
#
# `jax.sharding.Mesh` names the axes of a grid of devices, the grid exactly as it is given.
# The course's `js.make_mesh` fills it row-major from the device list, the last axis varying
# fastest, like module 6's mesh (`jax.make_mesh` on a TPU orders them by the chips' physical
# topology instead: its docstring in `jax/_src/sharding_impls.py`). Here 8 devices form a
# `2 x 4` mesh with axes
# `"data"` and `"model"`. A `PartitionSpec` says, dim by dim, which mesh axis splits an array's
# dimension: `P(None, "model")` keeps dim 0 whole and splits dim 1 over the 4 `"model"`
# devices; an axis it does not name (here `"data"`) **replicates** the array over it.
# `NamedSharding(mesh, spec)` joins the two, and `jax.device_put` places the array
# (`js.place`).
#
# One detail of this JAX version: `jax.make_mesh` gives *Explicit* axes by default, where a
# sharding is part of an array's type and an ambiguous matmul is an error until you say where
# the result goes. `js.make_mesh` asks for *Auto* axes: the compiler propagates the shardings
# and chooses the collectives itself, which is what we want to watch.

# %%
mesh = js.make_mesh(shape=(2, 4), names=("data", "model"))
print("default axis types of jax.make_mesh:", jax.make_mesh((8,), ("model",)).axis_types)
print(mesh)
w = js.place(np.arange(16 * 32, dtype=np.float32).reshape(16, 32), mesh, P(None, "model"))
print("W", w.shape, w.dtype, "sharding:", w.sharding.spec)

# %% [markdown]
# `jax.debug.visualize_array_sharding` draws the split: each column block of `W` with the
# devices that hold it. Each block is held twice, once in each row of the mesh (`"data"` 0 and
# 1), because the spec does not name `"data"`.

# %%
jax.debug.visualize_array_sharding(w)

# %% [markdown]
# The same thing from the array itself: `w.addressable_shards` lists each device's block (its
# index into the global array and its data). Device 1 and device 5 hold the same columns
# `8:16`; each holds `16 x 8` float32 values, 512 bytes, a quarter of the 2048-byte matrix.

# %%
for row in js.shard_table(w):
    print(f"device {row['device']}: W{row['block']:<10} shape {row['shape']}, {row['nbytes']} B")

# %% [markdown]
# Drawn as the course draws meshes (rows: the `"data"` axis, columns: the `"model"` axis), each
# device labelled with its block:

# %%
_ = js.draw_sharding(w, name="W")
plt.show()

# %% [markdown]
# ## 2. Data parallelism: split the batch, replicate the weights
#
# Data parallelism is one line of sharding: the batch split over `"data"` (`P("data")`), the
# weights replicated (`P()`). We `jit` the gradient of the mean loss over the whole batch. Each
# device computes the gradient of its own rows; the mean over the global batch needs their
# sum, so the compiler inserts an **all-reduce**: module 2's averaged gradient, without our
# writing it.
#
# First the lesson's two-replica example on 2 devices: replica `r`'s loss is `g_r . w`, so its
# local gradient is `g_r`, with `g_0 = [2, 4]`, `g_1 = [6, 0]`. The mean gradient is `[4, 2]`,
# and SGD with learning rate 0.1 from `[1, 1]` gives `[0.6, 0.8]` on both replicas.

# %%
two = js.lesson_two_replicas(grads=[[2.0, 4.0], [6.0, 0.0]], w0=[1.0, 1.0], lr=0.1)
print("local gradients (device 0, device 1):", two["local_grads"])
print("mean gradient                       :", two["mean_grad"])
print("new weights                         :", np.round(two["new_w"], 6).tolist())
print("collectives in the compiled step    :", [str(c) for c in two["collectives"]])

# %% [markdown]
# Now a small MLP (`16 -> 64 -> 16`, 2,128 parameters) on all 8 devices, a batch of 32 rows
# (4 per device). The gradient computed with the batch sharded equals the gradient on one
# device of the whole batch, and the mean of the 8 per-shard gradients; the compiled program
# holds one all-reduce, of every parameter's gradient at once (`2128 x 4 = 8512` bytes): the
# compiler merged the gradients' all-reduces into one, which can start only when the last
# gradient exists. That is the opposite of what DDP's buckets are for (starting early, to
# overlap backward: module 9). On GPU and TPU, whether a collective overlaps compute is decided
# by the compiler's scheduler and its asynchronous collectives (`all-reduce-start` / `-done`
# pairs in the program), which this CPU backend does not show.

# %%
dp = js.dp_step_check(seed=0)
for name, other in (("one device, whole batch", "one_device"),
                    ("mean of 8 shard gradients", "mean_of_shards")):
    same = all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(dp["grads"], dp[other]))
    print(f"sharded gradient == {name}: {same}")
print("gradients come out", dp["grad_sharding"][0], "(replicated); collectives:",
      [str(c) for c in dp["collectives"]])

# %% [markdown]
# ## 3. Tensor parallelism: which collective did the compiler insert?
#
# Module 4's rule was **columns give pieces (concatenate), rows give partial sums (add)**. In
# JAX we state the layout of `X`, `W` and the wanted `Y` for `Y = X W` (16 tokens, 32 -> 64
# features) on a 1-D mesh of 8 devices, `jit` it, compile it, and read the collectives in the
# compiled program's HLO text (`jit(f).lower(x, w).compile().as_text()`; `js.collectives`
# picks out the `all-reduce`, `all-gather`, `reduce-scatter` ... instructions). Next to it,
# the same layer written per device with `shard_map`, where we name the collective ourselves.
# Both results are compared with one device's `X @ W`.

# %%
layouts = js.compare_layouts(seed=0)
print(js.layout_table(layouts))

# %% [markdown]
# Read it row by row, next to module 4's f/g reasoning:
#
# * **column**: `W` split by columns, every device holds all of `X`; each computes its own
#   output features and `Y` may stay split: **no collective** (a column-parallel layer feeding
#   an elementwise GELU and a row-parallel layer).
# * **column, gathered**: the same, but every device needs all of `Y` (a LayerNorm next):
#   an **all-gather** concatenates the pieces.
# * **row**: `W` split by rows, so the contraction dimension is split: each device computes a
#   partial sum of the full `Y`, and the compiler inserts an **all-reduce**: module 4's g.
# * **row, scattered**: partial sums again, but `Y` may stay split by features. The natural
#   collective is a **reduce-scatter** (sum, keep a slice), and `shard_map` issues exactly
#   that. XLA's CPU compiler instead all-reduces and lets each device keep its slice: the same
#   result, more bytes moved. Reading the compiled program is how you find out what a compiler
#   really did; another backend or version may choose differently (the tests pin these names,
#   so an upgrade that changes them fails loudly).
# * **fsdp**: `W` split by rows over `"data"` as storage, the batch split too: the compiler
#   **all-gathers** `W` before the matmul (section 4).
#
# The `shard_map` versions are short per-device programs, the JAX counterparts of module 4's
# autograd functions. Here is each one's line that holds its collective (`"model"` or
# `"data"` is the mesh axis it runs over):

# %%
for name, fn in (("row", js._row_local), ("row, scattered", js._row_scattered_local),
                 ("column, gathered", js._column_gathered_local), ("fsdp", js._fsdp_local)):
    [line] = [ln for ln in inspect.getsource(fn).splitlines() if "jax.lax." in ln]
    print(f"{name:<17} {line.strip()}")

# %% [markdown]
# ## 4. FSDP / ZeRO-3: shard the whole training state over `"data"`
#
# ZeRO-3 shards weights, gradients and optimizer state over the data-parallel ranks and gathers
# each layer's weights when it is used. In JAX that is a sharding of the training state: every
# array split by its first dim over the 8 `"data"` devices. Take an MLP `64 -> 256 -> 64` in
# FP32 with Adam: weights, gradients and two moments, 16 bytes per parameter. Module 3's
# ZeRO-3 formula says each device holds `16 N / 8` bytes; `addressable_shards` says what each
# device really holds.

# %%
fsdp = js.fsdp_state(sizes=(64, 256, 64), seed=0)
formula = memory.zero_state_bytes(fsdp["n_params"], 8, 3, "fp32_adam")
print(f"parameters N                 : {fsdp['n_params']}")
print(f"whole state (16 N)           : {fsdp['global_bytes']} B")
print(f"ZeRO-3 formula, per device   : {formula['total']:.0f} B")
print(f"read from the shards, devices: {sorted(set(fsdp['bytes_per_device'].values()))} B "
      f"(all {len(fsdp['bytes_per_device'])} equal)")
print("one device's parts          :", fsdp["parts_per_device"])

# %% [markdown]
# The compiled forward pass gathers each sharded array right where it is used, four
# all-gathers (two weights, two biases): FSDP's "gather before use". One SGD step of a single
# sharded linear layer shows the backward side: the weight is gathered for the forward pass and
# the gradient summed over `"data"`. ZeRO-3 would reduce-scatter it (each rank keeps its own
# shard); XLA's CPU compiler again all-reduces and keeps the slice.

# %%
print("forward pass:", [str(c) for c in fsdp["forward"]][:2], "...",
      f"({len(fsdp['forward'])} all-gathers)")
print("linear step :", [str(c) for c in fsdp["linear_step"]])

# %% [markdown]
# ## 5. A 2-D mesh: data x model for an MLP block
#
# Module 6 combined the axes. On the `2 x 4` mesh: the batch split over `"data"`, the MLP
# block `GELU(X W1) W2` split Megatron-style over `"model"` (`W1` by columns, `W2` by rows) and
# replicated over `"data"`. `X` is `(8, 16)`, `W1` is `(16, 64)`, `W2` is `(64, 16)`, float32.
# Predict first:
#
# * bytes per device: each device holds a quarter of `W1` (`16 x 16`) and of `W2`
#   (`16 x 16`): `2 x 1024 = 2048` bytes; and half the batch of `X`, `4 x 16 x 4 = 256` bytes;
# * collectives per training step: forward, one all-reduce of the row-parallel partial sums
#   (g) over `"model"` (groups of 4), of a `(4, 16)` activation; backward, the weight
#   gradients summed over `"data"` (groups of 2): one all-reduce of both `(16, 16)` blocks.
#   Module 4's f (the all-reduce of `dL/dX`) is absent: `X` is the input, and nobody needs
#   its gradient.

# %%
mlp = js.mlp_2d(seed=0, data=2, model=4, batch=8, h=16, ffn=64)
predicted = sum(js.local_bytes(mlp["shapes"][k], mlp["specs"][k], mlp["mesh_shape"])
                for k in ("w1", "w2"))
print("predicted weight bytes per device:", predicted, "| read:",
      sorted(set(mlp["bytes_per_device"].values())), "| X:",
      sorted(set(mlp["x_bytes_per_device"].values())))
print("forward      :", [str(c) for c in mlp["forward"]])
print("training step:", [str(c) for c in mlp["step"]])
print("step == one device:", all(np.allclose(a, b, rtol=1e-5, atol=1e-6)
                                 for a, b in zip(mlp["new"], mlp["one_device"])))

# %% [markdown]
# ## 6. Comparing frameworks on a pinned workload
#
# Which is faster, PyTorch or JAX? The lesson's answer: compare a **pinned workload**, not an
# assumed hierarchy. `course_utils.framework_compare` pins one: the same MLP (`64 -> 256 -> 64`,
# tanh), float32, the same initial weights and batches (numpy, one seed), global batch 256,
# plain SGD, 20 steps, 8 workers with one thread each. PyTorch runs DDP on 8 gloo ranks
# through the course launcher; JAX runs one process with 8 CPU devices and a data-parallel
# `jit` step (started fresh, so that its thread flags hold). Both record each step's loss and
# time; the first 3 steps are warm-up and not timed, and JAX's compile time is reported on its
# own. `fc.compare` raises unless the two loss curves agree to `1e-5` (relative).

# %%
# NBVAL_IGNORE_OUTPUT
result = fc.compare(fc.Workload())
print(fc.table(result))

# %% [markdown]
# What the table shows: on this machine, for this workload, these versions and these thread
# settings, the two programs compute the same losses, and each step took the time printed.
# What it does not show: which framework is faster in general. Here the 8 PyTorch ranks are 8
# processes sharing the laptop's few cores and talking through gloo's sockets, while JAX's 8
# devices live in one process; a larger model, another batch size, a GPU, more threads or
# another version can change the order, and did not run here. To compare for your own use,
# pin your workload and run `benchmarks/framework_compare.py` on your machine.
#
# ## Summary
#
# | plan | JAX shardings | collective read from the compiled HLO |
# | --- | --- | --- |
# | data parallel | batch `P("data")`, weights `P()` | one all-reduce of all gradients |
# | column-parallel, `Y` split | `W: P(None, "model")` | none |
# | column-parallel, `Y` whole | `W: P(None, "model")`, `Y: P()` | all-gather |
# | row-parallel, `Y` whole | `X: P(None, "model")`, `W: P("model", None)` | all-reduce |
# | row-parallel, `Y` split | same, `Y: P(None, "model")` | all-reduce here (`shard_map`: reduce-scatter) |
# | FSDP / ZeRO-3 | every array `P("data")` | all-gather per weight; gradient all-reduce here |
# | 2-D MLP block | `X: P("data")`, Megatron over `"model"` | all-reduce over model (fwd), over data (grads) |
#
# ## Check yourself
#
# * `W` is split by rows over `"model"` and `X` by columns. Which collective does `X @ W`
#   need, and why is "none" wrong? (Each device holds a partial sum of the whole `Y`: an
#   all-reduce if every device needs all of `Y`; a reduce-scatter if `Y` may stay split, the
#   "row, scattered" row.)
# * A `(2048, 1024)` float32 weight has spec `P("model", "data")` on a `2 x 4` mesh. How many
#   bytes does one device hold? (`2048 x 1024 x 4 / 8`, 1 MiB: the local shard, not the
#   global 8 MiB.)
# * Why does a speed table from this laptop not rank PyTorch and JAX?

# %% [markdown]
# **Next**: assignment `a8_jax_sharding`: write the `PartitionSpec`s for a layer, predict the
# collective the compiler will insert and the bytes per device (checked against the compiled
# HLO and `addressable_shards`), and write a row-parallel layer with `shard_map` that runs on 8
# CPU devices. This is the course's last module: go back to any plan of modules 2 to 6 and
# write it in JAX.
