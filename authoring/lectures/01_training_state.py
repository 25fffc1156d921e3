# %% [markdown]
# # Module 1: Sizing the training state
#
# Before choosing a parallelism strategy, count what training has to keep in memory between
# steps. By the end of this notebook you can estimate the persistent state of a model from its
# parameter count and its optimizer layout, convert between GB and GiB without mixing them up,
# and check an estimate against the bytes a real PyTorch model holds.
#
# Prerequisites: the training loop (forward, loss, backward, optimizer step) and tensor dtypes.

# %%
import matplotlib.pyplot as plt

from course_utils import launch, memory, style
from course_utils.widgets.training_state import TrainingState

style.use()

# %% [markdown]
# ## The problem: the training state does not fit
#
# Take a model with $N = 7 \times 10^9$ parameters trained with mixed-precision Adam. One common
# layout keeps five things per parameter:

# %%
lay = memory.layout("mixed_adam16")
rows = [("BF16/FP16 weights", lay.weights, "read by forward and backward"),
        ("BF16/FP16 gradients", lay.grads, "accumulated update signal"),
        ("FP32 master weights", lay.master, "the copy the optimizer updates precisely"),
        ("FP32 Adam moments (2)", lay.optimizer, "running mean of g and of g**2")]
for item, nbytes, purpose in rows:
    print(f"{item:24s} {nbytes:2d} B/param   {purpose}")
print(f"{'total':24s} {lay.total:2d} B/param")

# %% [markdown]
# Adam's second moment is a running average of *squared* gradients, not a variance around a
# mean. The ZeRO paper calls this layout "2 + 2 + K" with K = 12 optimizer bytes.
#
# Multiply by the parameter count. Keep the units apart: **1 GB = 10⁹ bytes** and
# **1 GiB = 2³⁰ bytes** (what `nvidia-smi` and most allocators report).

# %%
N = 7e9
total = memory.state_bytes(N, "mixed_adam16")
print(f"{N:.0e} parameters x {lay.total} B = {total:.3e} bytes")
print(f"= {memory.format_bytes(total, 'GB')} = {memory.format_bytes(total, 'GiB')}")
print("fits a 64 GB device?", memory.fits(total, device_gb=64))

# %% [markdown]
# 112 GB (about 104.31 GiB) is already more than a 64 GB device holds, and that is before any
# saved activations, temporary buffers or allocator overhead.
#
# There are two different jobs here:
#
# 1. **Make the state fit**: partition it across devices (ZeRO/FSDP, tensor and pipeline
#    parallelism).
# 2. **Process more examples per second**: add replicas (data parallelism).
#
# Adding replicas does only the second job. Plain data parallelism keeps a full copy of the
# state on every device, so per-device memory does not move at all:

# %%
for D in (1, 2, 8, 64):
    per_device = memory.zero_state_bytes(N, dp=D, stage=0)["total"]
    print(f"D = {D:2d} replicas: {memory.format_bytes(per_device)} per device")

# %% [markdown]
# ## The layout depends on the implementation
#
# 16 bytes/parameter is one layout, not a law. Some stacks accumulate gradients in FP32, some
# update BF16 weights directly with no master copy, some train fully in FP32. Read the code (or
# measure, as below) before you trust a bytes-per-parameter number.

# %%
fig = memory.plot_layouts(n_params=N)
plt.show()

# %% [markdown]
# In `course_utils.memory` each layout has a name (`memory.state_bytes(N, "fp32_sgd")`):

# %%
for name, lay_ in memory.LAYOUTS.items():
    b = memory.state_bytes(N, name)
    print(f"{name:22s} {lay_.total:2d} B/param -> 7B model: {b / memory.GB:6.1f} GB "
          f"= {b / memory.GiB:6.2f} GiB")

# %% [markdown]
# ### Try it: the training-state calculator
#
# The calculator below runs the same `memory` functions on the numbers you choose: parameters
# (in billions), a layout, the state in GB and in GiB, and which of the course's device budgets
# it fits. **Predict, then move the controls:**
#
# 1. Switch the layout from mixed-precision Adam to BF16 Adam without a master copy. How many GB
#    does the 7B model's state lose? Work it out from the bytes per parameter first.
# 2. Type a parameter count until "fits a device of" first lists 80 GB. Which count did you
#    predict from 80 GB / 16 B, and is the GiB number then above or below 80?

# %%
TrainingState()

# %% [markdown]
# ## Measure it: a real model in the 16-byte layout
#
# `memory.MixedPrecisionAdam` implements the layout above: the model's parameters (and so its
# gradients) are BF16; the optimizer keeps an FP32 master copy and runs `torch.optim.Adam` on it,
# then rounds the result back into the BF16 weights. `memory.count_state_bytes` sums the bytes
# each tensor's storage really holds, counting shared storage once.
#
# Each data-parallel rank below builds the same small MLP, computes gradients on its own
# examples, averages them with an all-reduce, takes one optimizer step, and counts its bytes.
# The two ranks are real processes joined by `torch.distributed` (gloo backend).

# %%
results = launch.run(memory.replica_state_bytes, 2)
n = results[0]["n_params"]
print(f"{'':18s} {'rank 0':>9s} {'rank 1':>9s}  B/param")
print(f"{'parameters N':18s} {results[0]['n_params']:>9,} {results[1]['n_params']:>9,}")
for part in ("weights", "grads", "master", "optimizer"):
    print(f"{part + ' (B)':18s} {results[0][part]:>9,} {results[1][part]:>9,}  "
          f"{results[0][part] // n}")
layout_bytes = [c["total"] - c["other"] for c in results]
print(f"{'16-byte layout (B)':18s} {layout_bytes[0]:>9,} {layout_bytes[1]:>9,}  "
      f"formula 16 x N = {16 * n:,} B, equal: {all(b == 16 * n for b in layout_bytes)}")
print(f"{'step counters (B)':18s} {results[0]['other']:>9,} {results[1]['other']:>9,}  "
      "(Adam: 4 B per parameter tensor)")

# %% [markdown]
# The measurement matches the formula to the byte, with one thing the formula leaves out:
# `torch.optim.Adam` keeps a 4-byte `step` counter per parameter *tensor* (4 tensors here).
# That is negligible, but it is exactly the kind of detail that only reading or measuring the
# implementation reveals. Note also that both ranks hold the **full** state: replicas do not
# shrink it.
#
# ## How big can a model get?
#
# The plot shows persistent state against parameter count for three layouts, with some common
# device budgets (grey lines). Each dot marks the largest model whose 16-byte state fits a
# budget. The state alone of a 7B model is 112 GB, so it overflows every budget below 112 GB:
# of the four shown, the 24, 64 and 80 GB ones. Only the 141 GB budget holds it.

# %%
budgets = {"24 GB": 24, "64 GB (lesson)": 64, "80 GB": 80, "141 GB": 141}
fig = memory.plot_state_vs_size(budgets, names=("mixed_adam16", "bf16_adam_no_master",
                                                "fp32_sgd"), mark_params=N)
plt.show()

# %%
print(f"7B model, 16-byte layout: {memory.format_bytes(total, 'GB')}")
for label, gb in budgets.items():
    n_max = gb * memory.GB / lay.total
    print(f"{label:15s}: at most {n_max / 1e9:.2f}B parameters in the 16-byte layout; "
          f"7B fits: {memory.fits(total, device_gb=gb)}")

# %% [markdown]
# ## Exercises
#
# 1. A 30B model uses the 16-byte layout. How many GB and how many GiB is its state?
# 2. The same model accumulates gradients in FP32. How many bytes per parameter now?
# 3. Why can't 8 data-parallel replicas of the 7B model each fit on a 64 GB device?
#
# <details><summary>Answers</summary>
#
# 1. 30e9 x 16 = 480 GB = 447.0 GiB. 2. 2 + 4 + 4 + 8 = 18 B/param (540 GB).
# 3. Each replica still holds all 112 GB: replication multiplies throughput, not capacity.
# Module 3 (ZeRO) shards the state instead.
# </details>

# %% [markdown]
# **Next**: assignment `a1_training_state` (in your workspace under
# `assignments/a1_training_state/`) practises these estimates: state in GB and GiB, other
# layouts, whether a model fits a device, and the largest model a device holds. Then
# **Module 2: Data parallelism and the all-reduce**.
