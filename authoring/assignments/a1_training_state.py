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
from course_utils.checks import submit

submit("q1_state_gb", q1_state_gb)
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
from course_utils.checks import submit

submit("q2_state_gib", q2_state_gib)
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
from course_utils.checks import submit

submit("q3_bytes_per_param", q3_bytes_per_param)
submit("q3_state_gb", q3_state_gb)
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
from course_utils.checks import submit

submit("q4a_fits", q4a_fits)
submit("q4b_fits", q4b_fits)
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
from course_utils.checks import submit

submit("max_params(64, 16)", max_params(64, 16))
submit("max_params(80, 12)", max_params(80, 12))
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
# Plain data parallelism keeps a full replica of the state on every device: each of the eight
# devices would still need 112 GB, more than its 64 GB. Replicas add throughput, not capacity.
# Sharding the state instead (ZeRO-3 / FSDP: 112 / 8 = 14 GB per device, before activations),
# or splitting the model with tensor or pipeline parallelism, would make it fit.
