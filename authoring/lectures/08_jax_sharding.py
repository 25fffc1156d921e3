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
#    read from the compiled program, and the same layers written with `shard_map`; what a GPU
#    compiler emits instead, and which partitioner runs; the layout that is illegal, and
#    *Explicit* axes, where a sharding is part of an array's type; pinning a layout inside a
#    program with `with_sharding_constraint`; a ring step with `ppermute`;
# 4. FSDP/ZeRO-3 (module 3): sharded training state, bytes per device, and what the compiler
#    says it allocates (`memory_analysis`);
# 5. a 2-D `data x model` mesh (module 6);
# 6. recomputation with `jax.checkpoint` and its policies (module 9's trade);
# 7. what the collectives cost: module 2's alpha-beta model on the compiled programs, and when
#    FSDP's or TP's communication fits behind its matmul, with two accelerators' published
#    figures;
# 8. the same training step in PyTorch and in JAX, compared on a pinned workload (module 7).
#
# The code lives in `course_utils/jax_sharding/`, one module per section below (`shardings.py`,
# `hlo.py`, `layouts.py`, `ring.py`, `comm_cost.py`, ...), and `framework_compare.py`.
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

from course_utils import jax_sharding as js, launch, memory, style
from course_utils.jax_sharding import framework_compare as fc, P
from course_utils.widgets.sharding import Sharding

style.use()
launch.start_forkserver()  # section 8's PyTorch ranks: their process imports torch meanwhile
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
# ### Try it: the sharding visualiser
#
# Choose a mesh of the 8 devices and a `PartitionSpec` for `X` (16, 32), for `W` (32, 64) and for
# `Y`, or let the compiler choose `Y`'s. The visualiser draws which devices hold each block,
# as `jax.debug.visualize_array_sharding` lists them (from JAX's own `NamedSharding`), and
# names the collectives in the compiled program of `X @ W`. A compilation takes too long
# for a redraw, so every setting the controls reach was compiled once and its collectives
# kept (`course_utils/data/sharding_collectives.json`; the tests compile a sample again and
# check the table above against it). It starts at the "row" layout on a `1 x 8` mesh, whose
# `"data"` axis has one device. **Predict, then move the controls:**
#
# 1. Keep the row split but ask for `Y` split by rows, `P('model', None)`. Does the compiler
#    still all-reduce? Predict, then set it.
# 2. On the `2 x 4` mesh, split `X` by rows over `"data"` and `W` by columns over `"model"`
#    (data and tensor parallelism at once), `Y` the compiler's choice. Does any collective
#    run? Which devices hold the same block of `W`?

# %%
Sharding(mesh="1 x 8", x="P(None, 'model')", w="P('model', None)", y="P()")

# %% [markdown]
# ### What a GPU compiler emits instead, and which partitioner runs
#
# The CPU program of "row, scattered" all-reduces the full `(16, 64)` partial sums, then each
# device keeps its slice with a `dynamic-slice` (indexed by its partition id). Counting the
# instructions of both compiled programs shows the pattern:

# %%
x16, w16 = js.linear_inputs(seed=0)
mesh8 = js.make_mesh(shape=(8,), names=("model",))
scattered = js.LAYOUTS["row, scattered"]
xs, ws = js.place(x16, mesh8, scattered.x), js.place(w16, mesh8, scattered.w)
for name, build in (("jit", js.jit_linear), ("shard_map", js.shard_map_linear)):
    hlo = build("row, scattered", mesh8).lower(xs, ws).compile().as_text()
    print(f"{name:<9}", js.op_counts(hlo, ops=["all-reduce", "dynamic-slice", "reduce-scatter"]))

# %% [markdown]
# `dynamic-slice(all-reduce)` is exactly what XLA's `ReduceScatterCreator` pass rewrites: its
# header says *"Transforms dynamic-slice(all-reduce) to a reduce-scatter."*
# (`xla/service/gpu/transforms/reduce_scatter_creator.h`, line 28), and the GPU compiler adds
# it to its collective optimizations (`xla/service/gpu/gpu_compiler.cc`, line 951, inside
# `RunCollectiveOptimizationPasses`, line 849). The CPU compiler does not run it: the word
# `ReduceScatter` does not occur in `xla/service/cpu/cpu_compiler.cc`. (Lines of openxla/xla at
# commit `84d7260`, 15 January 2025, read from its openxla/openxla mirror; the XLA inside this
# jaxlib may have moved them.) So on a GPU that pass can turn the "row, scattered" layer into
# one reduce-scatter, which sends (D − 1)/D of `Y` per device instead of the all-reduce's
# 2(D − 1)/D: what module 4 and the `shard_map` version do. We cannot show it here (it takes
# several GPUs), and TPU's compiler is not open source: we cannot cite that one.
#
# Which partitioner turns the shardings into per-device programs? In this JAX, **Shardy**: the
# flag `jax_use_shardy_partitioner` is on by default (`default=True` at
# `jax/_src/config.py`, line 2149 of the installed 0.10.2), the lowered program (StableHLO,
# before XLA) carries Shardy's `sdy.` attributes and no GSPMD `mhlo.sharding`, and the CPU
# compiler's SPMD pipeline adds the `ShardyXLA` pass when the module asks for Shardy
# (`cpu_compiler.cc`, lines 485 to 486, same commit):

# %%
part = js.partitioner(layout="row", devices=8)
print("jax_use_shardy_partitioner:", part["shardy"], "| attributes:", part["attributes"],
      "| GSPMD:", part["gspmd_attributes"])
print(part["mesh_line"])

# %% [markdown]
# ### The illegal layout, and Explicit axes
#
# Module 4's rule has a case it never needed: `X` split by **rows** over `"model"` and `W` by
# **columns** over the same axis. Both split dims survive into `Y = X W`, so `Y` would be split
# by rows *and* by columns over the same 8 devices: device `i` would hold row block `i` of
# column block `i`, the 8 diagonal blocks of 64, and the other 56 would live nowhere. A mesh
# axis may split at most one dim of an array. With **Explicit** axes (what `jax.make_mesh` gives by default
# here) a sharding is part of an array's type, `jax.typeof` prints it (`16@model`: dim 0 split
# over `"model"`), and the matmul is checked as it is traced. JAX refuses, and refuses the
# spec `P("model", "model")` itself when it is built:

# %%
bad = js.both_dims_on_one_axis(devices=8)
print("mesh axis types:", bad["axis_types"], "| X:", bad["x_type"], "| W:", bad["w_type"])
print("X @ W:", bad["no_out_sharding"])
print("NamedSharding(mesh, P('model', 'model')):", bad["duplicate_spec"])

# %% [markdown]
# `out_sharding=` on the matmul (`jnp.matmul(x, w, out_sharding=...)`, a keyword of this JAX
# version) resolves it: it says which dim of `Y` keeps the split, the compiler gathers the
# operand whose split is dropped, and `Y`'s type says where it lives:

# %%
for spec, r in bad["out_sharding"].items():
    print(f"out_sharding={spec:<17} Y: {r['type']:<21} {[str(c) for c in r['collectives']]}, "
          f"equal: {r['equal']}")

# %% [markdown]
# With **Auto** axes the same program compiles without a word: the type carries no sharding,
# and the compiler chooses. Here it gathered `X` (2,048 B), the smaller operand, rather than
# `W` (8,192 B), and left `Y` split by columns:

# %%
auto = bad["auto"]
print("X:", auto["x_type"], "| Y:", auto["y_spec"], "|", [str(c) for c in auto["collectives"]],
      "| equal:", auto["equal"])

# %% [markdown]
# ### Pinning a layout inside the program: `with_sharding_constraint`
#
# Auto propagation picks the layout of every intermediate; `jax.lax.with_sharding_constraint`
# inside the jitted function pins one. Take module 4's Megatron pair `tanh(X W1) W2` on the 8
# `"model"` devices: `X` `(16, 32)` replicated, `W1` `(32, 128)` by columns, `W2` `(128, 32)`
# by rows, `Y` replicated; and constrain the hidden activation `h`, `(16, 128)`, four ways:

# %%
for r in js.constrained_mlp(devices=8, seed=0):
    print(f"h: {r['constraint']:<16} equal: {r['equal']} |", "; ".join(str(c) for c in
                                                                   r["collectives"]))

# %% [markdown]
# The constraint is an order, not a hint: the compiler obeys it and pays for it.
# `P(None, "model")`, `h` split by features, compiles to the same program as no constraint.
# `P()` adds an all-gather of the whole hidden activation, 8,192 B, 4x the 2,048 B all-reduce
# the program still needs. `P("model", None)` (tokens split, as sequence parallelism would)
# makes it gather both weights instead, 16,384 B each, and then `Y`. All four compute the same
# `Y`. Pin a layout where propagation chooses badly or the next operation needs one, and read
# the HLO afterwards.
#
# ### A ring step with `ppermute`
#
# `shard_map` also has point-to-point: `jax.lax.ppermute(x, "model", perm)` sends each
# device's block to the device `perm` names. With `perm = [(i, (i + 1) % 8)]` it is one step of
# module 2's ring, one `collective-permute` in the HLO: device `i`'s block moves to device
# `i + 1`.

# %%
step = js.ring_step(devices=8)
print("before:", step["before"])
print("after :", step["after"])
print("collectives:", [str(c) for c in step["collectives"]])

# %% [markdown]
# Module 2's ring reduce-scatter is 7 such steps: at step `s` device `r` sends its running sum
# of chunk `(r − s) % 8` to device `r + 1`, receives device `r − 1`'s running sum of chunk
# `(r − s − 1) % 8`, and adds its own copy of that chunk (`ring_allreduce.reduce_scatter_phase`).
# Written with `ppermute` (`js.ring_reduce_scatter`), the compiled program holds 7
# collective-permutes of one chunk each; `psum_scatter` compiles to one reduce-scatter. Both leave one summed chunk per device (the ring's device `r` holds
# chunk `(r + 1) % 8`, as in module 2):

# %%
rs = js.ring_reduce_scatter(devices=8, chunk=2, seed=0)
print("ring == numpy:", np.allclose(rs["ring"], rs["expected"], rtol=1e-5, atol=1e-5),
      "| psum_scatter == numpy:", np.allclose(rs["psum_scatter"], rs["summed"], rtol=1e-5,
                                              atol=1e-5))
print("ring        :", len(rs["ring_collectives"]), "x", rs["ring_collectives"][0])
print("psum_scatter:", [str(c) for c in rs["psum_scatter_collectives"]])

# %% [markdown]
# The same step, carrying key/value blocks instead of gradient chunks, is **ring attention**
# (context parallelism, module 6's table): each device keeps its block of queries, computes
# attention with the key/value block it holds, and `ppermute`s that block to the next device,
# 7 times. The "collective matmul" of *How to Scale Your Model* (HTSYM below; its sources are
# jax-ml/scaling-book on GitHub, read at commit `0819a7d`) hides a TP matmul's communication
# the same way (`jax-stuff.md`, lines 186 to 191).

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
# ### What the compiler says it allocates: `memory_analysis()`
#
# The compiled program can say what it will allocate before anything runs:
# `jax.jit(f).lower(...).compile().memory_analysis()` gives per-device byte counts. Compile one
# Adam step on this ZeRO-3 state (weights, gradients and two moments, each split 8 ways over
# `"data"`; the step returns the new weights and moments), once plainly and once with the state
# donated (`donate_argnums=0`: the outputs may reuse the input buffers). The fields it reports,
# per device:

# %%
mem = js.fsdp_memory(sizes=(64, 256, 64), seed=0, devices=8)
n = mem["n_params"]
print(f"16 N / D = 16 x {n} / 8 = {16 * n // 8} B (ZeRO-3); 12 N / D = {12 * n // 8} B; "
      f"read from the shards: {mem['shard_bytes']} B")
print(f"{'field':<30} {'plain':>7} {'donated':>8}")
for field in mem["plain"]:
    if not field.startswith("host_"):
        print(f"{field:<30} {mem['plain'][field]:>7} {mem['donated'][field]:>8}")
host = [f for f in mem["plain"] if f.startswith("host_")]
print(f"{len(host)} host_* fields, all 0:", all(mem[k][f] == 0 for k in ("plain", "donated")
                                             for f in host))
extra = mem["plain"]["output_size_in_bytes"] - 12 * n // 8
print(f"output - 12 N / D = {extra} B = {extra // mem['n_outputs']} B x {mem['n_outputs']} "
      "outputs")
print("peak == argument + output - alias:", {k: m["peak_memory_in_bytes"] == (
    m["argument_size_in_bytes"] + m["output_size_in_bytes"] - m["alias_size_in_bytes"])
    for k, m in (("plain", mem["plain"]), ("donated", mem["donated"]))})
print("collectives of the step:", mem["collectives"], "(the optimizer step is local)")

# %% [markdown]
# What each field counts, in PJRT's definitions (`xla/pjrt/pjrt_executable.h`, lines 281 to
# 295, and `CompiledMemoryStats::PopulateBufferStatsFromAllocations` in `pjrt_executable.cc`,
# lines 252 to 316, same XLA commit as above):
#
# * `argument_size_in_bytes`: the entry parameters' buffers, here the whole state: exactly
#   16 N / D = 66,176 B on each device, module 3's ZeRO-3 formula;
# * `output_size_in_bytes`: the buffers that live out, the new weights and moments, 12 N / D =
#   49,632 B, plus 96 B: 8 B for each of the 12 outputs, the result tuple's index table
#   (`ShapeUtil::ByteSizeOfTupleIndexTable` is pointer size x tuple elements,
#   `xla/shape_util.cc` line 892; a test checks 8 B per output for 2, 4 and 16 outputs, and
#   none for a single output);
# * `alias_size_in_bytes`, "how much argument is reused for output": 0 plainly, 12 N / D when
#   donated (the gradients' buffers are not reused: no output takes their place);
# * `temp_size_in_bytes`: scratch, 0 here (the update is elementwise); the generated code's
#   size is 0 on this backend, and the `host_*` fields count host memory, unused here;
# * `peak_memory_in_bytes` (newer than that XLA source): here arguments + outputs − alias,
#   115,904 B plainly and 66,272 B donated. Donation is how a JAX training step updates its
#   state without holding two copies of it.

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
# ## 6. Recomputation: what `jax.checkpoint` keeps for backward
#
# Module 9 trades memory for compute with `torch.utils.checkpoint`. JAX's counterpart is
# `jax.checkpoint(f, policy=...)`: the policy says which values computed in the forward pass
# the backward may keep; the rest it recomputes. `jax.ad_checkpoint.print_saved_residuals`
# lists what is kept. For the mean-squared loss of an MLP `16 -> 64 -> 64 -> 16` (tanh) on 8
# rows, under four policies (the inputs, "from the argument", are kept in every case and left
# out here):

# %%
kept = {policy: js.saved_residuals(policy, sizes=(16, 64, 64, 16), batch=8, seed=0)
        for policy in js.POLICIES}
for policy, r in kept.items():
    print(f"{policy:<20} {len(r['computed'])} values, {r['computed_bytes']:>5} B: "
          f"{r['summary'] or 'nothing'}")
plain = kept["no checkpoint"]["grads"]
print("gradients equal under every policy:", all(
    np.allclose(a, b, rtol=1e-6, atol=1e-7) for r in kept.values() for a, b in zip(r["grads"],
                                                                                     plain)))

# %% [markdown]
# In JAX's own words (`jax/_src/ad_checkpoint.py`, lines 67 to 96 of 0.10.2):
# `everything_saveable` is "as if `jax.checkpoint` were not being used at all" (its list is
# plain `jax.grad`'s), and `nothing_saveable` is "the effective policy when using jax.remat
# without explicit policy": nothing computed is kept, module 9's **full** recomputation, where
# a checkpointed block keeps only its input. `dots_saveable` keeps the outputs of the matmuls
# (`dot_general`, and convolutions) and recomputes the cheap elementwise work after them: the
# tanh, and the `sub` that tanh's derivative reuses (its JVP, `jax/_src/lax/lax.py` lines 4509
# to 4519, is `(g + g tanh)(1 − tanh)`, so plain `jax.grad` keeps `1 − tanh` too). Module 9's
# **selective** recomputation bets the other way for attention: it recomputes the attention
# core, matmuls included, to drop its large softmax matrix. Whatever the policy, the gradients
# are the same.
#
# ## 7. What the collectives cost
#
# Module 2 priced a ring all-reduce with the alpha-beta model: every message costs a fixed
# latency α plus its size over the link bandwidth β; the ring's 2(D − 1) steps each send n/D
# bytes, T ≈ 2(D − 1)α + 2(D − 1)/D · n/β (`ring_allreduce.ring_time_s`). An all-gather or a
# reduce-scatter is one of that ring's two phases, D − 1 steps: half of it, with n the gathered
# result, or the reduce-scatter's input (D times its result). A collective-permute is one
# message, α + n/β. `js.ring_cost` applies this to a collective read from the compiled HLO
# (`js.cost_table`, to a list of them). With a TPU v5e's link, β = 4.5e10 B/s one way per ICI
# link (the published figure in HTSYM's table, `tpus.md` line 192 of jax-ml/scaling-book), and
# HTSYM's working latency α = 1 µs per hop (`tpus.md` line 254, `inference.md` line 633: the
# book's assumption, not a vendor's figure), the collectives of this lecture's programs cost:

# %%
by_layout = {r["layout"]: r for r in layouts}
alpha_s, beta = 1e-6, 4.5e10  # TPU v5e, HTSYM: 1 us per hop (assumed), 4.5e10 B/s one way
programs = {"DP gradients": dp["collectives"], "row (jit)": by_layout["row"]["jit"],
            "row, scattered (map)": by_layout["row, scattered"]["shard_map"],
            "column, gathered": by_layout["column, gathered"]["jit"],
            "fsdp (jit)": by_layout["fsdp"]["jit"], "2-D MLP step": mlp["step"],
            "ring step": step["collectives"]}
print(js.cost_table(programs, alpha_s=alpha_s, bandwidth_bytes_per_s=beta))
print(f"alpha = {alpha_s * 1e6:g} us, beta = {beta:.2g} B/s; one step's n/D takes alpha at "
      f"n = alpha x beta x D = {alpha_s * beta * 8 / 1e3:.0f} kB (D = 8)")

# %% [markdown]
# Every one is **latency-bound**: up to 14 µs of latency against under half a microsecond of
# bandwidth. The two terms are equal when one step's n/D bytes take α, at n = α β D = 360 kB
# for D = 8 (HTSYM's test for a latency-bound collective, `inference.md` line 633, is the same
# inequality). The lecture's arrays are kilobytes; the layer of the next table holds 537 MB of
# weights, and there the bandwidth term rules.
#
# ### When the communication hides behind the matmul
#
# On GPUs and TPUs a collective can run while a matmul computes (the asynchronous
# `-start`/`-done` pairs of section 2), so what matters is whether its bytes fit in the
# matmul's time. A local `(T, d) @ (d, f)` is 2 T d f FLOPs: 2 T d f / C seconds at C FLOP/s.
# With W the bytes per second a device's link sends and s bytes per value:
#
# * **FSDP** gathers the whole weight before the matmul: (D − 1)/D · d f s bytes sent per
#   device. The FLOPs grow with the tokens, the bytes do not: the gather fits when
#   **T ≥ (C / W) · (s / 2) · (D − 1)/D**, tokens per device above about C / W in bf16 (s = 2).
# * **TP** (module 4's pair, column then row) all-reduces its `(T, d)` output:
#   2 (D − 1)/D · T d s bytes against 4 T d f / D FLOPs. T cancels: it fits when the
#   **per-device width f / D ≥ (C / W) · (s / 2) · (D − 1)/D**.
#
# The backward pass doubles both sides, so the rule holds for a training step. HTSYM states the
# same rules, for large D, with its *bidirectional* W_ici: B / X > C / W_ici for data parallelism and
# FSDP (`training.md` lines 204 and 267), F > Y · C / W_ici for tensor parallelism (line
# 338). A ring that sends both ways at once doubles W and halves the threshold; the table
# below uses the one-way figures, module 2's one-way ring. `js.hides_behind_matmul` computes
# both sides of the comparison. For two accelerators' published figures, TPU v5e: 1.97e14
# bf16 FLOP/s per chip and 4.5e10 B/s one way per ICI link (HTSYM's tables, `tpus.md` lines 182
# and 192); H100: 9.9e14 bf16 FLOP/s and 450 GB/s each way from each GPU, NVLink 4's 18 links
# of 25 GB/s (HTSYM's `gpus.md`, a newer chapter, read at commit `1a55377`: sections "Summary
# of GPU specs" and "At the node level"); and
# a layer d = 8192 on D = 8 devices in bf16:

# %%
print(f"weights of the layer: d x f x s = 8192 x 32768 x 2 B = {8192 * 32768 * 2 / 1e6:.0f} MB")
for name, chip in js.ACCELERATORS.items():
    c, w_link = chip["flops_per_s"], chip["link_bytes_per_s"]
    print(f"{name}: C = {c:.3g} FLOP/s, W = {w_link:.3g} B/s, C / W = {c / w_link:.0f}")
    for plan, tokens, d_ff in (("fsdp", 1024, 32768), ("fsdp", 4096, 32768),
                               ("tp", 2048, 16384), ("tp", 2048, 32768)):
        r = js.hides_behind_matmul(plan, tokens_per_device=tokens, d_model=8192, d_ff=d_ff,
                                   devices=8, flops_per_s=c, link_bytes_per_s=w_link)
        print(f"  {plan:<4} {r['width_name']} {r['width']:>4} vs {r['threshold']:>4.0f}: matmul "
              f"{r['compute_s'] * 1e3:.3f} ms, collective {r['comm_s'] * 1e3:.3f} ms, "
              f"hidden: {r['hidden']}")

# %% [markdown]
# On both chips FSDP needs about two to four thousand tokens per device (thresholds 1,925 and
# 3,831): 1,024 is too few, 4,096 enough.
# TP over 8 devices with f = 16,384 (2,048 features per device) hides on the H100 (threshold
# 1,925) but not on the v5e's one-way link (3,831); f = 32,768 hides on both. These are
# rooflines: peak FLOP/s and link bandwidth, a ring over one axis, perfect overlap. They say
# whether the bytes *can* hide. FSDP's gather of the next layer's weights waits on nothing in
# this layer, so it can start during this layer's matmul; TP's all-reduce needs this matmul's
# own output, and hiding it means cutting the matmul into pieces and sending each while the
# next one computes: the collective matmul, built from the `ppermute` step of section 3.
#
# ## 8. Comparing frameworks on a pinned workload
#
# Which is faster, PyTorch or JAX? The lesson's answer: compare a **pinned workload**, not an
# assumed hierarchy. `course_utils.jax_sharding.framework_compare` pins one: the same MLP (`64 -> 256 -> 64`,
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
# | row-parallel, `Y` split, on GPU | as above | reduce-scatter expected (XLA's `ReduceScatterCreator`, cited, not run here) |
# | `X` rows and `W` columns over one axis | Explicit: an error; `out_sharding=` picks `Y`'s split | all-gather of the operand whose split is dropped (Auto: `X`) |
# | Megatron pair, `h` pinned `P()` | `with_sharding_constraint` | all-gather of `h`, then the all-reduce |
# | a ring step in `shard_map` | `ppermute` | collective-permute (7 make a ring reduce-scatter) |
#
# | question | answer here |
# | --- | --- |
# | memory per device of the ZeRO-3 Adam step | `memory_analysis()` arguments = 16 N / D; donated, the outputs reuse 12 N / D |
# | what backward keeps | `nothing_saveable`: only the inputs; `dots_saveable`: the matmul outputs; gradients equal |
# | this lecture's collectives, v5e link, α = 1 µs | all latency-bound: equal terms at n = α β D = 360 kB |
# | FSDP hides behind its matmul | tokens per device ≥ (C / W)(s / 2)(D − 1)/D: 3,831 on a v5e link, 1,925 on an H100 |
# | TP hides behind its matmul | d_ff per device ≥ the same threshold |
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
# * `X` is split by rows over `"model"` and `W` by columns over `"model"`. Why can `Y = X W`
#   not keep both splits, and what do Explicit and Auto axes each do about it? (`Y` would need
#   `"model"` on two of its dims; Explicit raises until `out_sharding=` says which split stays,
#   Auto picks one itself and gathers the other operand.)
# * An FSDP job on TPU v5e chips has 1,024 tokens per chip on an 8-way one-way ring. Can the
#   weight all-gather hide behind the matmul? (No: it needs about 3,831; at 1,024 the matmul
#   takes about a quarter of the gather's time.)
# * Why does a speed table from this laptop not rank PyTorch and JAX?

# %% [markdown]
# **Next**: assignment `a8_jax_sharding`: write the `PartitionSpec`s for a layer, predict the
# collective the compiler will insert and the bytes per device (checked against the compiled
# HLO and `addressable_shards`), and write a row-parallel layer with `shard_map` that runs on 8
# CPU devices. Then module 9, `09_activations`: activation memory, recomputation (this
# lecture's `jax.checkpoint`, in PyTorch), sequence parallelism, overlap and precision.
