# %% [markdown]
# # Assignment 1: sizing the training state
#
# Answer each question by assigning the named variable in the cell marked `# YOUR CODE HERE`
# (delete the `raise NotImplementedError()` line). Use **GB = 10⁹ bytes** and
# **GiB = 2³⁰ bytes**. Run each test cell after your answer: a failed check tells you what
# went wrong. More checks run when the assignment is graded.
#
# The byte layouts from the lecture, per parameter:
#
# | layout | weights | gradients | master copy | optimizer (Adam moments) |
# |---|---|---|---|---|
# | mixed-precision Adam (the lesson's) | 2 (BF16) | 2 (BF16) | 4 (FP32) | 8 (FP32) |
# | same, FP32 gradients | 2 | 4 | 4 | 8 |
# | BF16 Adam, no master copy | 2 | 2 | 0 | 8 |

# %%
import math

# %% [markdown]
# **Q1 (2 points).** A 13B-parameter model ($N = 13 \times 10^9$) is trained with the lesson's
# mixed-precision Adam layout. How many **GB** of persistent training state does it keep?
# Assign the number to `q1_state_gb`.

# %% [answer q1_state_gb]
### BEGIN SOLUTION
q1_state_gb = 13e9 * (2 + 2 + 4 + 8) / 1e9
### END SOLUTION

# %% [test q1_state_gb_test points=2]
from course_utils.checks import check_number

check_number("q1_state_gb", q1_state_gb)  # a plain number
### BEGIN HIDDEN TESTS
check_number("q1_state_gb", q1_state_gb, 208.0, unit="GB", mistakes=[
    (208e9, "that is the count in bytes; divide by 10**9 to get GB."),
    (13e9 * 16 / 2**30, "that is GiB (2**30 bytes); the question asks for GB (10**9 bytes)."),
    (156.0, "that is 12 bytes/parameter: either the 4-byte FP32 master copy is missing "
            "(2 + 2 + 8) or only the optimizer bucket (4 + 8) was counted. The layout totals 16."),
    (104.0, "that counts only Adam's two FP32 moments (8 bytes); add weights, gradients and "
            "the master copy."),
    (182.0, "that is 14 bytes/parameter: one of the 2-byte items (weights or gradients) is "
            "missing."),
])
### END HIDDEN TESTS

# %% [markdown]
# **Q2 (1 point).** Convert your Q1 answer to **GiB**. Assign it to `q2_state_gib`.

# %% [answer q2_state_gib]
### BEGIN SOLUTION
q2_state_gib = 13e9 * 16 / 2**30
### END SOLUTION

# %% [test q2_state_gib_test points=1]
check_number("q2_state_gib", q2_state_gib)
### BEGIN HIDDEN TESTS
check_number("q2_state_gib", q2_state_gib, 13e9 * 16 / 2**30, unit="GiB", mistakes=[
    (208.0, "that is still GB: divide the byte count by 2**30, not 10**9."),
    (208e9 * 2**30 / 1e18, "the conversion went the wrong way: a GiB is larger than a GB, "
                           "so the number of GiB is smaller."),
    (208e9 / 1024**2, "that divides by 2**20 (MiB); a GiB is 2**30 bytes."),
])
### END HIDDEN TESTS

# %% [markdown]
# **Q3 (2 points).** The same 13B model, but the training stack accumulates gradients in FP32
# (second row of the table). How many **bytes per parameter** (`q3_bytes_per_param`) and how many
# **GB** in total (`q3_state_gb`)?

# %% [answer q3]
### BEGIN SOLUTION
q3_bytes_per_param = 2 + 4 + 4 + 8
q3_state_gb = 13e9 * q3_bytes_per_param / 1e9
### END SOLUTION

# %% [test q3_test points=2]
check_number("q3_bytes_per_param", q3_bytes_per_param)
check_number("q3_state_gb", q3_state_gb)
### BEGIN HIDDEN TESTS
check_number("q3_bytes_per_param", q3_bytes_per_param, 18, mistakes=[
    (16, "16 is the BF16-gradient layout; FP32 gradients take 4 bytes instead of 2."),
    (20, "only the gradients change to FP32 (2 -> 4 bytes); the weights stay BF16."),
    (14, "the FP32 master copy (4 bytes) is still there."),
])
check_number("q3_state_gb", q3_state_gb, 234.0, unit="GB", mistakes=[
    (234e9, "that is bytes; divide by 10**9 for GB."),
    (13e9 * 18 / 2**30, "that is GiB; the question asks for GB."),
    (208.0, "that is the 16-byte layout; FP32 gradients make it 18 bytes/parameter."),
])
### END HIDDEN TESTS

# %% [markdown]
# **Q4 (2 points).** A 6B model, an 80 GB device, persistent state only. Does the state fit
# (a) in the lesson's 16-byte layout (`q4a_fits`) and (b) with BF16 Adam and no master copy
# (`q4b_fits`)? Answer `True` or `False`.

# %% [answer q4]
### BEGIN SOLUTION
q4a_fits = 6e9 * 16 <= 80e9
q4b_fits = 6e9 * 12 <= 80e9
### END SOLUTION

# %% [test q4_test points=2]
from course_utils.checks import check_choice

check_choice("q4a_fits", q4a_fits, None, [True, False])
check_choice("q4b_fits", q4b_fits, None, [True, False])
### BEGIN HIDDEN TESTS
check_choice("q4a_fits", q4a_fits, False, [True, False], mistakes={
    True: "6e9 x 16 B = 96 GB, which is more than 80 GB."})
check_choice("q4b_fits", q4b_fits, True, [True, False], mistakes={
    False: "without the master copy it is 12 B/param: 6e9 x 12 B = 72 GB <= 80 GB."})
### END HIDDEN TESTS

# %% [markdown]
# **Q5 (3 points).** Write `max_params(device_gb, bytes_per_param)`: the largest parameter count
# whose persistent state fits in a device of `device_gb` GB. Return a plain `int`
# (round down: a fraction of a parameter does not exist). Raise `ValueError` if either argument
# is not positive.

# %% [answer max_params]
def max_params(device_gb, bytes_per_param):
    ### BEGIN SOLUTION
    if device_gb <= 0 or bytes_per_param <= 0:
        raise ValueError("device_gb and bytes_per_param must be positive")
    return int(device_gb * 10**9 // bytes_per_param)
    ### END SOLUTION

# %% [test max_params_test points=3]
check_number("max_params(64, 16)", max_params(64, 16))
### BEGIN HIDDEN TESTS
check_number("max_params(64, 16)", max_params(64, 16), 4_000_000_000, rel=1e-9, mistakes=[
    (64 * 2**30 // 16, "that uses GiB (2**30) for the device; the device size is in GB (10**9)."),
    (64 // 16, "that is in billions and lost the units: return the number of parameters."),
])
check_number("max_params(80, 12)", max_params(80, 12), 6_666_666_666, rel=0, abs_tol=0.5,
             hint="Round down to a whole parameter.")
assert type(max_params(80, 12)) is int, "max_params should return an int (use int(...) or //)."
for bad in [(0, 16), (64, 0), (-1, 16)]:
    try:
        max_params(*bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"max_params{bad} should raise ValueError for a non-positive argument.")
### END HIDDEN TESTS

# %% [markdown]
# **Q6 (2 points, graded by your instructor).** A colleague proposes training the 7B model with
# the 16-byte layout on eight 64 GB devices using plain data parallelism, "so the 112 GB is spread
# over 512 GB of memory". Explain in two or three sentences why this does not fit, and name one
# approach that would.

# %% [manual q6_explain points=2]
# Plain data parallelism keeps a full replica of the state on every device: each of the eight
# devices would still need 112 GB, more than its 64 GB. Replicas add throughput, not capacity.
# Sharding the state instead (ZeRO-3 / FSDP: 112 / 8 = 14 GB per device, before activations),
# or splitting the model with tensor or pipeline parallelism, would make it fit.
