# %% [markdown]
# # Assignment 8: Shardings in JAX
#
# Lecture 8 declared meshes and shardings, let the compiler insert the collectives, read them
# from the compiled HLO, and wrote the same layers per device with `shard_map`. Here you write
# the `PartitionSpec`s of a plan yourself, predict what the compiler will insert and how many
# bytes each device holds, and write a row-parallel layer with `shard_map` that runs on 8 CPU
# devices.
#
# **Notation** (as in the lecture): `Y = X @ W`, `X` of shape `(b, h_in)`, `W` of shape
# `(h_in, h_out)`, float32 (4 bytes per element). A `PartitionSpec` lists, dim by dim, the mesh
# axis that splits that dim (`None`: not split); a mesh axis it does not name replicates the
# array over that axis. "Bytes per device" means the bytes of one device's own block (its
# shard), as `addressable_shards` reports them. Collectives are named as in the HLO:
# `"none"`, `"all-gather"`, `"all-reduce"`, `"reduce-scatter"`.
#
# Answer in the cells marked `YOUR CODE HERE` (delete the `raise NotImplementedError()` line),
# then run the cell below each one.
#
# **How to practise.** Before Q1 and Q2 a *practice* question (not graded) asks the same
# reasoning about another layer; the cell after it checks every value fully (against the
# compiled program itself) and names the misconception a wrong value reveals. The test cell
# after a graded answer checks the types and rejects some known wrong answers without saying
# what the right one is; for Q3 it runs your function on 8 devices on a visible case and checks
# the values. When the assignment is graded, your specs are compiled, your predictions are
# compared with the compiled HLO and with `addressable_shards`, and your function runs on
# hidden cases.
#
# **Your own numbers.** Q2's sizes are drawn for you (the table the next cell shows, `G`):
# your classmates have other ones, so their byte counts are wrong for you. They come from your
# identity (your JupyterHub user, the name `make lab` asked for once, or, when your instructor
# grades, your student id, whatever this notebook says). Do not edit that cell.

# %%
# course_utils.jax_sharding first: it puts --xla_force_host_platform_device_count=8 into
# XLA_FLAGS, then imports JAX, which reads the flag once, when it starts (lecture 8).
from course_utils import jax_sharding as js
from course_utils.assess import checks

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from course_utils.assess import variants

devices = js.require_devices(8)
COLLECTIVES = ["none", "all-gather", "all-reduce", "reduce-scatter"]
G = variants.givens("a8_jax_sharding", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## Q1. Write the specs of a plan (3 points)
#
# All of Q1 uses the `2 x 4` mesh `js.make_mesh(shape=(2, 4), names=("data", "model"))`: data
# parallelism over `"data"`, tensor parallelism over `"model"`.
#
# *Practice (not graded)*: the output projection of attention, `Y = X @ Wo`, runs
# **row-parallel** over `"model"` (each device holds whole heads), on a batch split over
# `"data"`. `X` is `(b, h)` and arrives split by batch over `"data"` and by features over
# `"model"` (each device's heads); `Wo` is `(h, h)`; `Y` must be split by batch over `"data"`
# and whole in its features. Give `practice_spec_x`, `practice_spec_wo`, `practice_spec_y`.

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_spec_x = P("data", "model")
practice_spec_wo = P("model", None)
practice_spec_y = P("data", None)
### END SOLUTION

# %%
_mesh = js.make_mesh(shape=(2, 4), names=("data", "model"))
_want = {"practice_spec_x": ["data", "model"], "practice_spec_wo": ["model", None],
         "practice_spec_y": ["data", None]}
_known = {
    ("practice_spec_wo", (None, "model")): "that splits Wo's columns (output features); a "
    "row-parallel layer splits its rows, the dim it sums over (dim 0)",
    ("practice_spec_wo", ("data", None)): "you used the data axis: the weights are split over "
    "\"model\" (tensor parallelism) and replicated over \"data\"",
    ("practice_spec_x", ("model", "data")): "the axis names are swapped: the batch (dim 0) is "
    "split over \"data\", the features (dim 1) over \"model\"",
    ("practice_spec_y", ("data", "model")): "Y must be whole in its features: its dim 1 is not "
    "split",
}
for _name, _value in (("practice_spec_x", practice_spec_x), ("practice_spec_wo", practice_spec_wo),
                      ("practice_spec_y", practice_spec_y)):
    _entries = js.spec_entries(_value, 2)
    if _entries != _want[_name]:
        _why = _known.get((_name, tuple(_entries)), f"it is P{tuple(_want[_name])}")
        raise AssertionError(f"{_name} = {_value}: {_why}")
_plan = js.compile_plan(_mesh, lambda x, w: x @ w, {"x": (16, 64), "wo": (64, 64)},
                        {"x": practice_spec_x, "wo": practice_spec_wo}, practice_spec_y)
print("practice Q1: right. Compiled, the layer holds:", _plan["collectives"])

# %% [markdown]
# **Graded.** The Megatron MLP block `Y = GELU(X @ W1) @ W2` with `X` of shape `(b, h)`, `W1`
# `(h, ffn)`, `W2` `(ffn, h)`, in a plan the lecture does not show: tensor parallelism **and**
# FSDP at once. The batch is split over `"data"`; `W1` is **column-parallel** and `W2`
# **row-parallel** over `"model"`; and each weight is also *stored* split over `"data"`, along
# the dim that tensor parallelism leaves whole (ZeRO-3: gathered over `"data"` when used). `Y`
# is split by batch over `"data"`, whole in its features. Give `spec_x`, `spec_w1`, `spec_w2`,
# `spec_y`.

# %% [answer q1]
### BEGIN SOLUTION
spec_x = P("data", None)
spec_w1 = P("data", "model")
spec_w2 = P("model", "data")
spec_y = P("data", None)
### END SOLUTION

# %% [test q1_test points=3]
# Checks the types and rejects some wrong answers; the values are checked when graded.
for _name, _value in (("spec_x", spec_x), ("spec_w1", spec_w1), ("spec_w2", spec_w2),
                      ("spec_y", spec_y)):
    assert isinstance(_value, P), f"{_name} should be a PartitionSpec, P(...); got {_value!r}"
    for _axis in js.spec_entries(_value, 2):
        assert _axis in (None, "data", "model"), (
            f"{_name} = {_value}: the mesh's axes are \"data\" and \"model\"")
assert js.spec_entries(spec_w1, 2) != js.spec_entries(spec_w2, 2), (
    "spec_w1 and spec_w2 are the same: a column-parallel and a row-parallel layer split "
    "different dims of their weights")
for _name, _value in (("spec_w1", spec_w1), ("spec_w2", spec_w2)):
    assert "model" in js.spec_entries(_value, 2), (
        f"{_name} = {_value} does not name \"model\": tensor parallelism splits each weight "
        "over \"model\"")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

for _name, _value in (("spec_x", spec_x), ("spec_w1", spec_w1), ("spec_w2", spec_w2),
                      ("spec_y", spec_y)):
    submit(_name, js.spec_entries(_value, 2))
_plan = js.compile_plan(js.make_mesh((2, 4), ("data", "model")),
                        lambda x, w1, w2: jax.nn.gelu(x @ w1) @ w2,
                        {"x": (16, 32), "w1": (32, 128), "w2": (128, 32)},
                        {"x": spec_x, "w1": spec_w1, "w2": spec_w2}, spec_y)
submit("compiled collectives of your specs", _plan["collectives"])
submit("bytes per device of your specs", _plan["bytes"])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Predict the collective and the bytes (3 points)
#
# *Practice (not graded)*: a 1-D mesh of 4 devices with axis `"model"`; `X` is `(32, 256)`,
# `W` is `(256, 128)`, float32; the compiler (`jit`, Auto axes) compiles `Y = X @ W` with `Y`
# laid out as asked. Which collective does it insert?
#
# * `practice_collective_a`: `X: P()`, `W: P(None, "model")`, `Y: P()`.
# * `practice_collective_b`: `X: P(None, "model")`, `W: P("model", None)`, `Y: P()`.
# * `practice_collective_c`: `X: P("model", None)` (the batch split), `W: P()`,
#   `Y: P("model", None)`.
# * `practice_w_bytes_b`: the bytes one device holds of `W` in layout b.
# * `practice_y_bytes_c`: the bytes one device holds of `Y` in layout c.
# * `practice_w_bytes_2d`: on the `2 x 4` mesh `("data", "model")`, a float32 weight of shape
#   `(512, 2048)` with spec `P("model", "data")`: bytes per device.

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_collective_a = "all-gather"
practice_collective_b = "all-reduce"
practice_collective_c = "none"
practice_w_bytes_b = 256 * 128 * 4 // 4
practice_y_bytes_c = 32 * 128 * 4 // 4
practice_w_bytes_2d = 512 * 2048 * 4 // 8
### END SOLUTION

# %%
_m4 = js.make_mesh((4,), ("model",))
_mm = lambda x, w: x @ w  # noqa: E731
_shapes = {"x": (32, 256), "w": (256, 128)}
_runs = {"a": js.compile_plan(_m4, _mm, _shapes, {"x": P(), "w": P(None, "model")}, P()),
         "b": js.compile_plan(_m4, _mm, _shapes, {"x": P(None, "model"), "w": P("model", None)},
                              P()),
         "c": js.compile_plan(_m4, _mm, _shapes, {"x": P("model", None), "w": P()},
                              P("model", None))}
_why = {("a", "all-reduce"): "column pieces are different features: they are concatenated "
                             "(all-gather), not added",
        ("a", "none"): "each device holds only its own columns of Y, and Y: P() asks for all of "
                       "it on every device",
        ("b", "none"): "W is split by rows, the contraction dim: each device holds a partial "
                       "sum, which must be added",
        ("b", "all-gather"): "partial sums are added (all-reduce), not concatenated",
        ("c", "all-reduce"): "each device computes whole rows of Y from its own rows of X with "
                             "all of W: data parallelism's forward pass needs no collective"}
for _k, _value in (("a", practice_collective_a), ("b", practice_collective_b),
                  ("c", practice_collective_c)):
    assert _value in COLLECTIVES, f"practice_collective_{_k} should be one of {COLLECTIVES}"
    _true = _runs[_k]["collectives"][0] if _runs[_k]["collectives"] else "none"
    assert _value == _true, (f"practice_collective_{_k} = {_value!r}: "
                             + _why.get((_k, _value), f"the compiler inserts {_true!r}"))
for _name, _value, _true, _global in (
        ("practice_w_bytes_b", practice_w_bytes_b, _runs["b"]["bytes"]["w"], 256 * 128 * 4),
        ("practice_y_bytes_c", practice_y_bytes_c, _runs["c"]["out_bytes"], 32 * 128 * 4),
        ("practice_w_bytes_2d", practice_w_bytes_2d,
         js.bytes_per_device(js.place(np.zeros((512, 2048), np.float32), _mesh,
                                      P("model", "data")))[0], 512 * 2048 * 4)):
    _mistakes = [(_global, "that is the global array; a device holds only its own shard"),
                 (_true / 4, "that is a count of elements; each float32 is 4 bytes")]
    if _name == "practice_w_bytes_2d":
        _mistakes += [(_global / 2, "the spec names both mesh axes: 2 x 4 = 8 blocks"),
                      (_global / 4, "the spec names both mesh axes: 2 x 4 = 8 blocks")]
    checks.check_number(_name, _value, _true, unit="bytes", mistakes=_mistakes)
print("practice Q2: all right (checked against the compiled programs and their shards).")

# %% [markdown]
# **Graded.** A 1-D mesh of 8 devices with axis `"model"`; the weight is stored as PyTorch's
# `nn.Linear` stores it, `(out_features, in_features)`: `X` is `(b, in_features)`, `W` is
# `(out_features, in_features)`, float32, where `(b, in_features, out_features) = G.q2`
# (yours are in the table at the top), and the layer computes `Y = X @ W.T`, compiled with `jit` (Auto axes). Work out which of `W`'s dims is contracted before you answer.
#
# * `collective_a`: `X: P()`, `W: P("model", None)`, `Y: P()`.
# * `collective_b`: `X: P(None, "model")`, `W: P(None, "model")`, `Y: P()`.
# * `collective_c`: `X: P()`, `W: P("model", None)`, `Y: P(None, "model")`.
# * `w_bytes_b`: the bytes one device holds of `W` in layout b (an int).
# * `y_bytes_c`: the bytes one device holds of `Y` in layout c (an int).
# * `w_bytes_2d`: on the `2 x 4` mesh `("data", "model")`, a float32 weight of shape
#   `(rows, cols) = G.q2_2d` with spec `P("data", "model")`: bytes per device (an int).

# %% [answer q2]
### BEGIN SOLUTION
collective_a = "all-gather"
collective_b = "all-reduce"
collective_c = "none"
b, n_in, n_out = G.q2
rows, cols = G.q2_2d
w_bytes_b = n_out * n_in * 4 // 8
y_bytes_c = b * n_out * 4 // 8
w_bytes_2d = rows * cols * 4 // 8
### END SOLUTION

# %% [test q2_test points=3]
# Checks the types and rejects some wrong answers; the values are checked when graded.
for _name, _value in (("collective_a", collective_a), ("collective_b", collective_b),
                      ("collective_c", collective_c)):
    assert isinstance(_value, str) and _value in COLLECTIVES, (
        f"{_name} should be one of {COLLECTIVES}; got {_value!r}")
assert collective_b != "none", (
    "collective_b = 'none': in layout b, W.T's rows are split, the contraction dim: sharding it "
    "and expecting no collective is the typical mistake; what does each device hold after its "
    "matmul?")
assert collective_a != collective_c, (
    "layouts a and c differ only in Y's layout, and they need different communication")
for _name, _value, _key in (("w_bytes_b", w_bytes_b, G.key("q2")),
                            ("y_bytes_c", y_bytes_c, G.key("q2")),
                            ("w_bytes_2d", w_bytes_2d, G.key("q2_2d"))):
    checks.check_number(_name, _value, unit="bytes", variant=_key)
    assert float(_value) == int(_value), f"{_name} should be a whole number"
_b, _in, _out = G.q2
_rows, _cols = G.q2_2d
checks.check_number("w_bytes_b", w_bytes_b, unit="bytes", variant=G.key("q2"), mistakes=[
    (_out * _in * 4, "that is the global W: count the bytes of one device's shard (its own "
                     "block), as addressable_shards does"),
    (_out * _in / 8, "that is a count of elements; each float32 is 4 bytes")])
checks.check_number("w_bytes_2d", w_bytes_2d, unit="bytes", variant=G.key("q2_2d"), mistakes=[
    (_rows * _cols * 4, "that is the global array: count one device's shard"),
    (_rows * _cols * 4 / 4, "the spec names both mesh axes: the array is split 2 x 4 ways, not "
                            "only over \"model\"")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

for _name, _value in (("collective_a", collective_a), ("collective_b", collective_b),
                      ("collective_c", collective_c), ("w_bytes_b", w_bytes_b),
                      ("y_bytes_c", y_bytes_c), ("w_bytes_2d", w_bytes_2d)):
    submit(_name, _value)
_m8 = js.make_mesh((8,), ("model",))
_mm = lambda x, w: x @ w.T  # noqa: E731   (nn.Linear's layout: W is (out, in))
_b, _in, _out = G.q2
_rows, _cols = G.q2_2d
_shapes = {"x": (_b, _in), "w": (_out, _in)}
for _k, _specs, _out in (("a", {"x": P(), "w": P("model", None)}, P()),
                         ("b", {"x": P(None, "model"), "w": P(None, "model")}, P()),
                         ("c", {"x": P(), "w": P("model", None)}, P(None, "model"))):
    _plan = js.compile_plan(_m8, _mm, _shapes, _specs, _out)
    submit(f"compiled {_k}: collectives", _plan["collectives"])
    submit(f"compiled {_k}: W bytes on a device", _plan["bytes"]["w"])
    submit(f"compiled {_k}: Y bytes on a device", _plan["out_bytes"])
_w2d = js.place(np.zeros((_rows, _cols), np.float32), js.make_mesh((2, 4), ("data", "model")),
                P("data", "model"))
submit("2-D weight: bytes per device", js.bytes_per_device(_w2d))
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. A row-parallel layer with `shard_map` (4 points)
#
# Write `row_parallel(x_local, w_local, b)`, the per-device program of a row-parallel linear
# layer on a 1-D mesh with axis `"model"`:
#
# * `x_local`: `(tokens, h_in / t)`, this device's columns of `X`;
# * `w_local`: `(h_in / t, h_out)`, this device's rows of `W`;
# * `b`: `(h_out,)`, the bias, the same on every device.
#
# Return the full `Y = X @ W + b`, `(tokens, h_out)`, on every device. Use `jax.lax` collectives
# over the axis name `"model"` (the test runs your function with `shard_map` on 8 devices,
# `in_specs=(P(None, "model"), P("model", None), P())`, `out_specs=P()`, and compares with one
# device's `X @ W + b`).

# %% [answer q3]
def row_parallel(x_local, w_local, b):
    """Row-parallel Y = X @ W + b: (tokens, h_in/t) x (h_in/t, h_out) -> (tokens, h_out)."""
    ### BEGIN SOLUTION
    partial = x_local @ w_local                # (tokens, h_out): this device's partial sum
    return jax.lax.psum(partial, "model") + b  # the sum over "model", then the bias once
    ### END SOLUTION

# %% [test q3_test points=4]
# A visible case on 8 devices (the hidden cases use other shapes and seeds).
_rng = np.random.default_rng(5)
_x, _w, _b = (_rng.standard_normal((4, 16)).astype(np.float32),
              _rng.standard_normal((16, 6)).astype(np.float32),
              _rng.standard_normal(6).astype(np.float32))
_run = js.row_parallel_harness(row_parallel, _x, _w, _b)
_y = _run["y"]
assert _y.shape == (4, 6), (
    f"row_parallel returned shape {_y.shape}; expected (tokens, h_out) = (4, 6)")
if np.allclose(_y, _x[:, :2] @ _w[:2] + _b, atol=1e-4):
    raise AssertionError("Y is device 0's own partial sum: the partial sums of the 8 devices "
                         "must be added (jax.lax.psum over \"model\")")
if np.allclose(_y, _x @ _w + 8 * _b, atol=1e-4):
    raise AssertionError("the bias was added on every device before the sum, so Y holds it 8 "
                         "times: add it once, after the psum")
assert "all-gather" not in _run["collectives"], (
    "your program all-gathers: each row-parallel device holds a partial sum of the whole "
    "output, to be added to the others, not concatenated")
np.testing.assert_allclose(_y, _x @ _w + _b, rtol=1e-4, atol=1e-4,
                           err_msg="row_parallel does not match X @ W + b on one device")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

for _seed, _shape in ((11, (6, 32, 5)), (12, (3, 8, 7))):
    _rng = np.random.default_rng(_seed)
    _tok, _hin, _hout = _shape
    _x, _w, _b = (_rng.standard_normal((_tok, _hin)).astype(np.float32),
                  _rng.standard_normal((_hin, _hout)).astype(np.float32),
                  _rng.standard_normal(_hout).astype(np.float32))
    _run = js.row_parallel_harness(row_parallel, _x, _w, _b)
    submit(f"seed {_seed}: y", np.asarray(_run["y"], dtype=np.float64))
    submit(f"seed {_seed}: collectives", _run["collectives"])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. What does a framework comparison show? (2 points, graded by hand)
#
# Suppose that on your laptop lecture 8's pinned workload ran a JAX step about 15 times faster
# than the PyTorch DDP step, with equal losses. A colleague concludes: "JAX is 15x faster; let's move our
# 7B model's GPU training to it." In a few sentences: what does the measurement show, what does
# it not show, and what would you pin and measure before such a decision?

# %% [manual q4_explain points=2]
# ### BEGIN SOLUTION
# It shows that on this laptop, for this small MLP, batch, float32, 8 workers with one thread
# each and these versions, the JAX program's step took less time than the PyTorch DDP program's
# while computing the same losses. It does not show a general ranking: here the 8 PyTorch ranks
# are separate processes sharing two cores and talking through gloo's sockets, while JAX's 8
# devices live in one process, so the measurement mostly compares process and communication
# overheads of a tiny workload. A 7B model on GPUs is dominated by large matmuls, NCCL
# collectives, memory and the parallel plan, none of which ran here.
# Before deciding I would pin the real workload (model, sequence length, batch, precision,
# parallel plan, number and kind of GPUs, versions) and measure both on the target cluster:
# steady-state step time and tokens per second with warm-up and compilation reported
# separately, peak memory, time in collectives, and that the losses agree.
#
# **Rubric** (2 points):
# * 1 point: says what it shows and what it does not: only this workload, on this machine, with
#   these versions and thread settings, and gives a reason it does not carry over to a 7B model
#   on GPUs (processes sharing cores and gloo sockets vs one process; a tiny model dominated by
#   overheads; GPUs, NCCL, large matmuls, memory not measured).
# * 1 point: names what to pin (model, batch/sequence, precision, plan, hardware, versions) and
#   at least two things to measure on the target hardware (step time or tokens per second after
#   warm-up, compile time separately, peak memory, time in collectives, equal losses).
# * 0 points: accepts the 15x as a general ranking, or only says "benchmark it" without what to
#   pin or measure.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a8_jax_sharding.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a8_jax_sharding/a8_jax_sharding.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a8_jax_sharding` grades your copy the same way.
