# %% [markdown]
# # Assignment 1: sizing the training state
#
# Answer each question by assigning the named variable in the cell marked `# YOUR CODE HERE`
# (delete the `raise NotImplementedError()` line). Use **GB = 10⁹ bytes** and
# **GiB = 2³⁰ bytes**.
#
# **How to practise.** Before each graded question that asks for a number or a yes/no, a
# *practice* question (not graded) asks the same reasoning with other numbers. Run the cell
# after your practice answer: it checks the value fully, and when it is wrong it names the
# misconception your number reveals. Then answer the graded question.
#
# **What the test cells check.** The test cell after a graded answer checks its type and
# rejects the known wrong answers that follow from the question alone (another row of the
# table, for instance), without ever saying what the right value is; for the function of Q5 it
# runs your code on visible cases and checks the values. Passing a test cell while practising
# does not mean the graded answer is right: when the assignment is graded, the values
# themselves are checked, and your function runs on other, hidden cases.
#
# The byte layouts from the lecture, per parameter:
#
# | layout | weights | gradients | master copy | optimizer (Adam moments) |
# |---|---|---|---|---|
# | mixed-precision Adam (the lesson's) | 2 (BF16) | 2 (BF16) | 4 (FP32) | 8 (FP32) |
# | same, FP32 gradients | 2 | 4 | 4 | 8 |
# | BF16 Adam, no master copy | 2 | 2 | 0 | 8 |
#
# **Your own numbers.** The graded questions use numbers drawn for you (the table the next
# cell shows, `G`): your classmates have other ones, so a classmate's answers are wrong for
# you. They are drawn from your identity: on a JupyterHub your user name, in your own
# workspace the name `make lab` asked for once (kept in `workspace/.course/identity`), and when
# your instructor grades, your student id, whatever this notebook says. Do not edit that cell;
# use the numbers it shows (`G.n_params` in code, or the number itself).
#
# **Work the answers out yourself.** Some `course_utils` helpers compute a graded answer
# outright (here, for example, `memory.state_bytes`). An answer that uses one is flagged for
# your instructor: the questions ask for the reasoning those helpers do.

# %%
import math

from course_utils.assess import variants

G = variants.givens("a1_training_state", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# *Practice (not graded)*: a 3B-parameter model ($N = 3 \times 10^9$) is trained with the
# lesson's mixed-precision Adam layout. How many **GB** of persistent training state does it
# keep? Assign the number to `practice_state_gb`, then run the check below it.

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_state_gb = 3e9 * (2 + 2 + 4 + 8) / 1e9
### END SOLUTION

# %%
from course_utils.assess.checks import check_choice, check_number

check_number("practice_state_gb", practice_state_gb, 48.0, unit="GB", mistakes=[
    (48e9, "this is a number of bytes; one GB is 10**9 bytes, so divide by 10**9."),
    (3e9 * 16 / 2**30, "you divided by 2**30, which gives GiB; GB means 10**9 bytes."),
    (36.0, "you counted 12 bytes per parameter (the row without a master copy, or only the "
           "master copy and the moments); the lesson's layout adds up all four columns."),
    (42.0, "you counted 14 bytes per parameter: one of the two 2-byte columns (BF16 weights "
           "or BF16 gradients) is missing."),
    (24.0, "you counted only Adam's moments (8 bytes per parameter); the state also holds the "
           "weights, the gradients and the FP32 master copy."),
    (6.0, "you counted only the BF16 weights (2 bytes per parameter); training also keeps "
          "gradients, a master copy and Adam's moments."),
])
print("practice_state_gb is right.")

# %% [markdown]
# **Q1 (2 points).** A model with $N$ = `G.n_params` parameters (your $N$ is in the table at
# the top) is trained with the lesson's mixed-precision Adam layout. How many **GB** of persistent training state does it keep?
# Assign the number to `q1_state_gb`.

# %% [answer q1_state_gb]
### BEGIN SOLUTION
q1_state_gb = G.n_params * (2 + 2 + 4 + 8) / 1e9
### END SOLUTION

# %% [test q1_state_gb_test points=2]
from course_utils.assess.checks import check_number

# A plain number, and not one of these wrong answers (the right value is checked when graded).
check_number("q1_state_gb", q1_state_gb, unit="GB", variant=G.key("n_params"), mistakes=[
    (G.n_params * 12 / 1e9, "you used the third row of the table (BF16 Adam without a master "
                      "copy); Q1 asks for the lesson's mixed-precision layout, the first row."),
    (G.n_params * 8 / 1e9, "you counted only Adam's moments; the persistent state also holds the "
                     "weights, the gradients and the FP32 master copy."),
    (G.n_params * 2 / 1e9, "you counted only the BF16 weights; training also keeps gradients, a "
                     "master copy and Adam's moments."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q1_state_gb", q1_state_gb)
### END HIDDEN TESTS

# %% [markdown]
# *Practice (not graded)*: your practice model above keeps 48 GB of state. How many **GiB** is
# that? Assign it to `practice_state_gib`.

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_state_gib = 48e9 / 2**30
### END SOLUTION

# %%
check_number("practice_state_gib", practice_state_gib, 48e9 / 2**30, unit="GiB", mistakes=[
    (48.0, "this is still the number of GB: convert the 48 * 10**9 bytes with 2**30 bytes "
           "per GiB."),
    (48e9 * 2**30 / 1e18, "you converted the wrong way: a GiB holds more bytes than a GB, so "
                          "48 GB is fewer than 48 GiB."),
    (48 / 1.024, "a GiB is not 1.024 GB: 2**30 bytes is 1.024**3 = 1.0737 GB (you converted "
                 "only one factor of 1024/1000)."),
    (48e9 / 2**20, "you divided by 2**20, which gives MiB; a GiB is 2**30 bytes."),
])
print("practice_state_gib is right.")

# %% [markdown]
# **Q2 (1 point).** Convert your Q1 answer to **GiB**. Assign it to `q2_state_gib`.

# %% [answer q2_state_gib]
### BEGIN SOLUTION
q2_state_gib = G.n_params * 16 / 2**30
### END SOLUTION

# %% [test q2_state_gib_test points=1]
# a plain number (the value is checked when graded)
check_number("q2_state_gib", q2_state_gib, variant=G.key("n_params"))
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q2_state_gib", q2_state_gib)
### END HIDDEN TESTS

# %% [markdown]
# *Practice (not graded)*: a 5B model is trained with the lesson's layout, except that the
# optimizer keeps each of Adam's two moments in 8 bits (1 byte each, as 8-bit Adam does; ignore
# its small quantization constants). How many **bytes per parameter**
# (`practice_bytes_per_param`) and how many **GB** in total (`practice_8bit_gb`)?

# %% [answer q3_practice]
### BEGIN SOLUTION
practice_bytes_per_param = 2 + 2 + 4 + 1 + 1
practice_8bit_gb = 5e9 * practice_bytes_per_param / 1e9
### END SOLUTION

# %%
check_number("practice_bytes_per_param", practice_bytes_per_param, 10, mistakes=[
    (16, "that is the lesson's layout unchanged; the moments now take 1 byte each, 2 bytes "
         "together instead of 8."),
    (9, "Adam keeps two moments (first and second), and each takes 1 byte here."),
    (8, "the moments are still stored, only smaller: add their 2 bytes."),
    (6, "the FP32 master copy (4 bytes) is still kept: 8-bit Adam only shrinks the moments."),
])
check_number("practice_8bit_gb", practice_8bit_gb, 50.0, unit="GB", mistakes=[
    (50e9, "this is a number of bytes; one GB is 10**9 bytes."),
    (5e9 * 10 / 2**30, "you divided by 2**30, which gives GiB; GB means 10**9 bytes."),
    (80.0, "that is 16 bytes per parameter, the layout with FP32 moments."),
    (45.0, "that is 9 bytes per parameter: one of the two moments is missing."),
])
print("practice_bytes_per_param and practice_8bit_gb are right.")

# %% [markdown]
# **Q3 (2 points).** The same model ($N$ = `G.n_params`), trained by a stack that accumulates gradients in
# FP32 (as in the second row of the table) and, like the third row, updates the BF16 weights
# directly with no FP32 master copy (Adam's moments stay FP32). No row of the table is this
# layout: build it from the columns. How many **bytes per parameter** (`q3_bytes_per_param`)
# and how many **GB** in total (`q3_state_gb`)?

# %% [answer q3]
### BEGIN SOLUTION
q3_bytes_per_param = 2 + 4 + 0 + 8
q3_state_gb = G.n_params * q3_bytes_per_param / 1e9
### END SOLUTION

# %% [test q3_test points=2]
# Plain numbers, and not one of these wrong answers (the right values are checked when graded).
check_number("q3_bytes_per_param", q3_bytes_per_param, mistakes=[
    (18, "that is the second row as it stands; this stack also drops the FP32 master copy."),
    (12, "that is the third row as it stands; this stack keeps its gradients in FP32."),
    (16, "that is the lesson's layout; this stack changes two of its columns."),
])
check_number("q3_state_gb", q3_state_gb, unit="GB", variant=G.key("n_params"), mistakes=[
    (G.n_params * 18 / 1e9, "that is the second row as it stands; this stack also drops the "
                            "FP32 master copy."),
    (G.n_params * 12 / 1e9, "that is the third row as it stands; this stack keeps its "
                            "gradients in FP32."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q3_bytes_per_param", q3_bytes_per_param)
submit("q3_state_gb", q3_state_gb)
### END HIDDEN TESTS

# %% [markdown]
# *Practice (not graded)*: a 4B model, persistent state only. Does the state fit (a) on an
# 80 GB device in the lesson's 16-byte layout (`practice_fits_a`) and (b) on a 40 GB device
# with BF16 Adam and no master copy (`practice_fits_b`)? Answer `True` or `False`.

# %% [answer q4_practice]
### BEGIN SOLUTION
practice_fits_a = 4e9 * 16 <= 80e9
practice_fits_b = 4e9 * 12 <= 40e9
### END SOLUTION

# %%
check_choice("practice_fits_a", practice_fits_a, True, [True, False], mistakes={
    False: "4e9 parameters x 16 bytes = 64 GB, less than the device's 80 GB: it fits."})
check_choice("practice_fits_b", practice_fits_b, False, [True, False], mistakes={
    True: "without the master copy it is 12 bytes per parameter: 4e9 x 12 bytes = 48 GB, "
          "more than the 40 GB device."})
print("practice_fits_a and practice_fits_b are right.")

# %% [markdown]
# **Q4 (2 points).** A model of $N_4$ parameters on a device of $M$ GB, where
# `(N_4, M) = G.q4` (yours are in the table at the top), persistent state only. Does the state fit
# (a) in the lesson's 16-byte layout (`q4a_fits`) and (b) with BF16 Adam and no master copy
# (`q4b_fits`)? Answer `True` or `False`.

# %% [answer q4]
### BEGIN SOLUTION
n4, device_gb = G.q4
q4a_fits = n4 * 16 <= device_gb * 1e9
q4b_fits = n4 * 12 <= device_gb * 1e9
### END SOLUTION

# %% [test q4_test points=2]
from course_utils.assess.checks import check_choice

# True or False (the answers are checked when graded).
check_choice("q4a_fits", q4a_fits, None, [True, False])
check_choice("q4b_fits", q4b_fits, None, [True, False])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q4a_fits", q4a_fits)
submit("q4b_fits", q4b_fits)
### END HIDDEN TESTS

# %% [markdown]
# **Q5 (3 points).** Write `max_params(device_gb, bytes_per_param)`: the largest parameter count
# whose persistent state fits in a device of `device_gb` GB. Return a plain `int`
# (round down: a fraction of a parameter does not exist). Raise `ValueError` if either argument
# is not positive. The test cell checks your function on two visible cases; grading runs it on
# other cases.

# %% [answer max_params]
def max_params(device_gb, bytes_per_param):
    ### BEGIN SOLUTION
    if device_gb <= 0 or bytes_per_param <= 0:
        raise ValueError("device_gb and bytes_per_param must be positive")
    return int(device_gb * 10**9 // bytes_per_param)
    ### END SOLUTION

# %% [test max_params_test points=3]
from course_utils.assess.checks import as_number

# Visible cases, checked fully (grading uses other cases).
_got = max_params(40, 16)
_n = as_number("max_params(40, 16)", _got)
assert _n != 40 * 2**30 // 16, (
    "max_params(40, 16) = 2684354560: you read the device size in GiB (2**30 bytes); "
    "device_gb is in GB, 10**9 bytes.")
assert _n not in (2, 2.5), (
    f"max_params(40, 16) = {_got}: that is in billions of parameters; return the parameter "
    "count itself.")
assert type(_got) is int, (
    f"max_params(40, 16) returned a {type(_got).__name__}: return a plain int (int(...) or //).")
assert _n == 2_500_000_000, f"max_params(40, 16) = {_got} is not right: 40 GB at 16 bytes each."
_got = max_params(10, 3)
_n = as_number("max_params(10, 3)", _got)
assert _n != 3_333_333_334, (
    "max_params(10, 3) = 3333333334: you rounded up; 3333333334 parameters need more than "
    "10 GB. Round down.")
assert type(_got) is int, (
    f"max_params(10, 3) = {_got!r}: round down to a whole parameter and return a plain int.")
assert _n == 3_333_333_333, f"max_params(10, 3) = {_got} is not right: 10 GB at 3 bytes each."
for _bad in [(0, 12), (40, -2)]:
    try:
        max_params(*_bad)
        _outcome = "returned a value"
    except ValueError:
        _outcome = None
    except Exception as _e:  # noqa: BLE001 - the message names the wrong error
        _outcome = f"raised {type(_e).__name__}"
    assert _outcome is None, (
        f"max_params{_bad} should raise ValueError (an argument is not positive); it {_outcome}.")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _i, (_gb, _bytes) in enumerate(hidden_cases("max_params_test")):  # drawn per submission
    submit(f"hidden case {_i + 1}", max_params(_gb, _bytes))
for _bad in [(0, 16), (64, 0), (-1, 16)]:
    try:
        max_params(*_bad)
        _outcome = "returned"
    except ValueError:
        _outcome = "ValueError"
    except Exception as _e:  # noqa: BLE001 - the judge says which error was wrong
        _outcome = type(_e).__name__
    submit(f"max_params{_bad} raises", _outcome)
### END HIDDEN TESTS

# %% [markdown]
# **Q6 (2 points, graded by your instructor).** A colleague proposes training the 7B model with
# the 16-byte layout on eight 64 GB devices using plain data parallelism, "so the 112 GB is spread
# over 512 GB of memory". Explain in two or three sentences why this does not fit, and name one
# approach that would.

# %% [manual q6_explain points=2]
# ### BEGIN SOLUTION
# Plain data parallelism keeps a full replica of the state on every device: each of the eight
# devices would still need 112 GB, more than its 64 GB. Replicas add throughput, not capacity.
# Sharding the state instead (ZeRO-3 / FSDP: 112 / 8 = 14 GB per device, before activations),
# or splitting the model with tensor or pipeline parallelism, would make it fit.
#
# **Rubric** (2 points):
# * 1 point: says that plain data parallelism keeps a full copy of the state on every device,
#   so each of the eight devices still needs the whole 112 GB, more than its 64 GB (the 512 GB
#   is not pooled).
# * 1 point: names one approach that brings the per-device state under 64 GB: sharding it
#   (ZeRO-3 / FSDP, 112 / 8 = 14 GB; ZeRO-1 or ZeRO-2 also fit, about 38.5 GB and 26 GB),
#   tensor or pipeline parallelism, or offloading the optimizer state to CPU memory.
# * 0 points: treats the 512 GB as one pool (the 112 GB split over eight devices) and names no
#   approach that shrinks the per-device state, only ones that leave it at 112 GB (more
#   devices with plain DP, a smaller batch, gradient accumulation, activation checkpointing).
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a1_training_state.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a1_training_state/a1_training_state.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a1_training_state` grades your copy the same way.
