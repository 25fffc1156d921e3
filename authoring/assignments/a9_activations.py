# %% [markdown]
# # Assignment 9: activation memory, recomputation and precision
#
# Lecture 9 predicted what a transformer saves for backward, measured it to the byte with
# saved-tensor hooks, traded it for recomputation, and showed on real tensors what each
# precision choice of the 16-, 18- and 12-byte layouts protects. Here you size activations for
# new configurations, pick a recomputation and micro-batch size for a memory budget, write the
# measurement yourself, and diagnose a precision problem.
#
# **Formulas** (as in the lecture). The published form for a GPT layer in 16-bit with dropout
# (Korthikanti et al. 2022), s tokens per sequence, micro-batch b, hidden size h, a heads, with
# the paper's unfused attention kernel, which stores the attention matrix (the 5 a s / h term;
# a fused kernel does not: lecture 9, section 2). Use these formulas for Q1, Q2 and Q6:
#
# * no recomputation: s b h (34 + 5 a s / h) bytes per layer;
# * selective recomputation (attention core recomputed): 34 s b h bytes per layer;
# * full recomputation (each layer's input kept): 2 s b h bytes per layer.
#
# One TinyLM block (fp32, math attention, no recomputation) saves 4 (8BTD + 2BTF + 4BT + BHT²)
# bytes (batch B, sequence T, width D, MLP width F, H heads). **Units**: 1 GB = 10^9 bytes.
#
# Answer each question by assigning the named variable in its answer cell (delete the
# `raise NotImplementedError()` line), then run the cells below it.
#
# **Practice, then the graded question.** Each numeric or choice question starts with a
# *practice* question (not graded) with the same reasoning and other numbers; the cell after it
# checks your practice answer fully. The test cell after a graded answer checks its type and
# rejects a few known wrong values, naming the misconception, but never tells you the right
# value. For Q3 (a function) the test cell runs your function on visible cases and checks the
# bytes. **Grading adds** the graded values themselves and Q3 on further hidden modules;
# Q7 is an explanation your instructor grades by hand. Q5 is measured on real ranks: your
# timings are your own, and grading checks your pick against the table you measured.
#
# **Your own numbers.** Q1, Q2 and Q6 use numbers drawn for you (the table the next cell
# shows, `G`): your classmates have other ones, so their answers are wrong for you. They come
# from your identity (your JupyterHub user, the name `make lab` asked for once, or, when your
# instructor grades, your student id, whatever this notebook says). Do not edit that cell.
#
# **Work the answers out yourself.** Some `course_utils` helpers compute a graded answer
# outright (here, for example, `activations.korthikanti_bytes` and `activations.saved_bytes`).
# An answer that uses one is flagged for your instructor.

# %%
import torch
from torch import nn

from course_utils.assess import checks, variants

G = variants.givens("a9_activations", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## Q1. Activation bytes for a new configuration (3 points)
#
# *Practice (not graded)*: (a) a GPT model with h = 2048, a = 16 heads and 24 layers trains on
# sequences of s = 2048 tokens, micro-batch b = 1, 16-bit, no recomputation. How many GB of
# activations does it save for backward (all layers)? Assign it to `practice_gpt_gb`.
# (b) A TinyLM block with D = 32, H = 2, F = 128 runs on B = 2 sequences of T = 16 tokens. How
# many bytes does it save? Assign it to `practice_block_bytes`.

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_gpt_gb = 2048 * 1 * 2048 * (34 + 5 * 16 * 2048 / 2048) * 24 / 1e9
practice_block_bytes = 4 * (8 * 2 * 16 * 32 + 2 * 2 * 16 * 128 + 4 * 2 * 16 + 2 * 2 * 16 * 16)
### END SOLUTION

# %%
checks.check_number("practice_gpt_gb", practice_gpt_gb, 11.475615744, unit="GB", mistakes=[
    (3.422552064, "that leaves out the attention term 5 a s / h: the attention scores, softmax "
                  "and dropout are (a, s, s) per sequence and grow with s^2."),
    (0.478150656, "that is one layer; the model has 24."),
    (11.475615744e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes."),
    (22.951231488, "the formula already counts 16-bit values (2 bytes each): do not double it."),
    (11.475615744e9, "that is bytes; give GB."),
])
checks.check_number("practice_block_bytes", practice_block_bytes, 70144, unit="bytes", mistakes=[
    (4 * 16512, "the attention probabilities (B, H, T, T) are missing: the math kernel saves "
                "them, B H T^2 elements."),
    (2 * 17536, "TinyLM runs in fp32: 4 bytes per element, not 2."),
    (17536, "that counts elements; each fp32 element is 4 bytes."),
    (4 * (8 * 2 * 16 * 32 + 2 * 2 * 16 * 32 + 4 * 2 * 16 + 2 * 2 * 16 * 16),
     "the MLP's two saved tensors are (B, T, F), F = 128, not (B, T, D)."),
])
print("practice Q1: right")

# %% [markdown]
# **Graded**: (a) a GPT model with hidden size h, a heads and L layers trains on sequences
# of s tokens, micro-batch b, 16-bit, no recomputation, where `(h, a, L, s, b) = G.q1_gpt`
# (yours are in the table at the top). How many GB of activations does it save for backward
# (all layers)? Assign it to `q1_gpt_gb`.
# (b) A TinyLM block with `(D, H, F, B, T) = G.q1_block` runs on B sequences of T tokens,
# fp32, math attention, no recomputation. How many bytes does it save? Assign it to
# `q1_block_bytes`.

# %% [answer q1]
### BEGIN SOLUTION
h, a, n_layers, s, b = G.q1_gpt
q1_gpt_gb = s * b * h * (34 + 5 * a * s / h) * n_layers / 1e9
d, n_heads, f, batch, t = G.q1_block
q1_block_bytes = 4 * (8 * batch * t * d + 2 * batch * t * f + 4 * batch * t
                      + batch * n_heads * t * t)
### END SOLUTION

# %% [test q1_test points=3]
# Checks the type and rejects known wrong answers; the value itself is checked when graded.
_h, _a, _L, _s, _b = G.q1_gpt
checks.check_number("q1_gpt_gb", q1_gpt_gb, unit="GB", variant=G.key("q1_gpt"), mistakes=[
    (_s * _b * _h * 34 * _L / 1e9,
     "that leaves out the attention term 5 a s / h, which grows with s^2."),
    (_s * _h * (34 + 5 * _a * _s / _h) * _L / 1e9,
     f"that is one sequence's activations; this micro-batch holds {_b}."),
])
_D, _H, _F, _B, _T = G.q1_block
_elements = 8 * _B * _T * _D + 2 * _B * _T * _F + 4 * _B * _T + _B * _H * _T * _T
checks.check_number("q1_block_bytes", q1_block_bytes, unit="bytes", variant=G.key("q1_block"),
                    mistakes=[
    (4 * (_elements - _B * _H * _T * _T), "the attention probabilities (B, H, T, T) are missing."),
    (_elements, "that is a count of elements: multiply by 4 bytes per fp32 element."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q1_gpt_gb", q1_gpt_gb)
submit("q1_block_bytes", q1_block_bytes)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. What fits the budget? (3 points)
#
# Options: recomputation `"none"`, `"selective"` or `"full"` (formulas above), and a
# micro-batch size of 1, 2, 4, 8 or 16 sequences. The team's rule: **least recomputation
# first** (none, then selective, then full), and with it the **largest micro-batch** whose
# activations fit the budget.
#
# *Practice (not graded)*: the model of Q1's practice (h = 2048, a = 16, 24 layers) trains on
# s = 8192 tokens with an activation budget of 10 GB per GPU (16-bit). Assign the choice to
# `practice_recompute` and the micro-batch size to `practice_micro_batch`.

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_recompute = "full"
practice_micro_batch = 8
### END SOLUTION

# %%
checks.check_choice("practice_recompute", practice_recompute, "full",
                    ["none", "selective", "full"], mistakes={
    "none": "without recomputation one sequence alone saves 8192 x 2048 x (34 + 320) x 24 = "
            "142.5 GB: the attention term 5 a s / h = 320 dwarfs the 34.",
    "selective": "selective recomputation still keeps 34 s b h per layer: 13.7 GB for one "
                 "sequence, over the 10 GB budget.",
})
checks.check_number("practice_micro_batch", practice_micro_batch, 8, mistakes=[
    (16, "16 sequences keep 16 x 0.805 = 12.9 GB of layer inputs: over 10 GB."),
    (1, "one sequence fits, but so do 8 (6.4 GB): take the largest that fits."),
    (12, "the options are 1, 2, 4, 8 or 16."),
])
print("practice Q2: right")

# %% [markdown]
# **Graded**: a model with hidden size h, a heads and L layers trains on s tokens with an
# activation budget of B GB per GPU (16-bit), where `(h, a, L, s, B) = G.q2`. Assign the choice
# to `q2_recompute` and the micro-batch size to `q2_micro_batch`.

# %% [answer q2]
### BEGIN SOLUTION
h, a, n_layers, s, budget_gb = G.q2
per_sequence_gb = {"none": s * h * (34 + 5 * a * s / h) * n_layers / 1e9,  # b = 1
                   "selective": s * h * 34 * n_layers / 1e9,
                   "full": s * h * 2 * n_layers / 1e9}
q2_recompute = next(r for r, gb in per_sequence_gb.items() if gb <= budget_gb)
q2_micro_batch = max(m for m in (1, 2, 4, 8, 16)
                     if m * per_sequence_gb[q2_recompute] <= budget_gb)
### END SOLUTION

# %% [test q2_test points=3]
checks.check_choice("q2_recompute", q2_recompute, None, ["none", "selective", "full"])
checks.check_number("q2_micro_batch", q2_micro_batch)
if float(q2_micro_batch) not in (1.0, 2.0, 4.0, 8.0, 16.0):
    raise AssertionError(f"q2_micro_batch = {q2_micro_batch}: the options are 1, 2, 4, 8, 16.")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q2_recompute", q2_recompute)
submit("q2_micro_batch", q2_micro_batch)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Measure what a module saves for backward (4 points)
#
# Write `saved_activation_bytes(module, inputs)`: run `module(*inputs)` once and return, as a
# plain `int`, the bytes of the tensors autograd saves for backward, counting
#
# * each **storage** once, whole: `t.untyped_storage()` is the buffer a tensor views,
#   `.data_ptr()` identifies it and `.nbytes()` is its size (a view of a buffer keeps the
#   whole buffer alive; two views of one buffer cost it once);
# * no parameter of `module` (they are persistent state, counted elsewhere).
#
# Use `torch.autograd.graph.saved_tensors_hooks(pack, unpack)`: inside the `with` block,
# autograd calls `pack(t)` for every tensor it saves and stores what `pack` returns; `unpack`
# gets that back in backward. Here `pack` can record the storage and return `t` unchanged,
# and `unpack` return its argument.
#
# The test cell runs your function on three visible modules and checks the bytes; grading runs
# it on other modules (a transformer block among them).

# %% [answer q3]
def saved_activation_bytes(module, inputs):
    """Bytes of the storages autograd saves for backward in ``module(*inputs)``, parameters
    excluded, each storage counted once."""
    ### BEGIN SOLUTION
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    sizes = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            sizes[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return int(sum(sizes.values()))
    ### END SOLUTION

# %% [test q3_test points=4]
class _ExpSquare(nn.Module):
    """exp(x)^2: exp saves its output y, and y * y saves y twice (one storage)."""

    def forward(self, x):
        y = x.exp()
        return y * y


def _q3_visible():
    torch.manual_seed(0)
    x = torch.randn(4, 8, requires_grad=True)
    cases = [
        # Linear(8, 16) keeps its (4, 8) fp32 input (128 bytes) and its (16, 8) weight, a
        # parameter (512 bytes)
        ("Linear(8, 16) on (4, 8)", nn.Linear(8, 16), (x,), 128, 128 + 16 * 8 * 4),
        # exp keeps its (3, 5) output, y * y keeps it twice: one 60-byte storage (no weights)
        ("_ExpSquare on (3, 5)", _ExpSquare(), (torch.randn(3, 5, requires_grad=True),), 60,
         60),
        # the input (128), the GELU input (4, 32) and the GELU output (4, 32): 128 + 512 + 512
        ("Linear(8, 32), GELU, Linear(32, 8) on (4, 8)",
         nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)), (x,), 1152,
         1152 + 4 * (8 * 32 + 32 * 8)),
    ]
    for name, module, inputs, want, with_params in cases:
        got = saved_activation_bytes(module, inputs)
        assert type(got) is int, f"{name}: return a plain int, got {type(got).__name__}"
        if got == with_params != want:
            raise AssertionError(f"{name}: {got} bytes counts the weights too; leave out the "
                                 "module's parameters (compare storages' data_ptr()).")
        if name.startswith("_ExpSquare") and got == 180:
            raise AssertionError(f"{name}: {got} bytes counts one storage three times (exp's "
                                 "output, then the two operands of y * y): count each storage "
                                 "once.")
        if got == want // 4:
            raise AssertionError(f"{name}: {got} looks like elements; return bytes.")
        assert got == want, f"{name}: {got} bytes; this visible case saves {want} bytes."


_q3_visible()
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit
from course_utils.models import tiny_lm


def _q3_hidden_case(kind, seed, shape):
    """(module, inputs) of one hidden case (drawn per submission); the judge builds the same."""
    torch.manual_seed(seed)
    if kind == "block":
        return (tiny_lm.build(tiny_lm.TinyLMConfig(), 0).blocks[0],
                (torch.randn(*shape, requires_grad=True),))
    if kind == "ln-linear-tanh":
        d = shape[-1]
        return (nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Tanh()),
                (torch.randn(*shape, requires_grad=True),))
    return _ExpSquare(), (torch.randn(*shape, dtype=torch.float64, requires_grad=True),)


for _number, _case in enumerate(hidden_cases("q3_test"), 1):
    _module, _inputs = _q3_hidden_case(*_case)
    _got = saved_activation_bytes(_module, _inputs)
    submit(f"saved_activation_bytes on hidden case {_number}", _got)
    submit(f"saved_activation_bytes on hidden case {_number}: type", type(_got).__name__)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Diagnose a precision problem (2 points)
#
# Choices (assign one string):
#
# `"nothing: bf16 master weights are enough"`, `"keep an fp32 master copy of the weights"`,
# `"scale the loss"`, `"keep the gradients in fp32"`
#
# *Practice (not graded)*: a team moves a run from bf16 to **fp16** mixed precision, keeping
# the fp32 master copy and Adam moments (16 bytes per parameter). From the first step, 99% of
# the gradient elements are exactly zero and the loss does not move. Which change fixes it?
# Assign it to `practice_fix`.

# %% [answer q4_practice]
### BEGIN SOLUTION
practice_fix = "scale the loss"
### END SOLUTION

# %%
Q4_CHOICES = ["nothing: bf16 master weights are enough", "keep an fp32 master copy of the weights",
              "scale the loss", "keep the gradients in fp32"]
checks.check_choice("practice_fix", practice_fix, "scale the loss", Q4_CHOICES, mistakes={
    "nothing: bf16 master weights are enough": "the run has no bf16 master weights to blame: "
        "its gradients are computed in fp16, whose smallest number is about 6e-8, and smaller "
        "ones flush to zero.",
    "keep an fp32 master copy of the weights": "the run already keeps one; a master copy "
        "cannot add up updates whose gradients are zero.",
    "keep the gradients in fp32": "the gradients are zero before they are stored: the fp16 "
        "backward pass underflows. Scaling the loss (GradScaler) moves them into fp16's range.",
})
print("practice Q4: right")

# %% [markdown]
# **Graded**: to save memory, a team switched a long bf16 run to the **12-byte** layout:
# bf16 weights updated directly by Adam, no master copy, fp32 moments. Late in training, at a
# learning rate of 1e-5 (Adam's steps are about that size) with weights of typical magnitude
# 0.01 to 0.05, the loss stopped improving, and between two steps more than 80% of the weight
# elements are bit-for-bit unchanged. The gradients are not zero. Which change fixes it? Assign
# it to `q4_fix`.

# %% [answer q4]
### BEGIN SOLUTION
q4_fix = "keep an fp32 master copy of the weights"
### END SOLUTION

# %% [test q4_test points=2]
checks.check_choice("q4_fix", q4_fix, None, Q4_CHOICES, mistakes={
    "scale the loss": "the gradients are not zero, and bf16 has fp32's exponent range: loss "
                      "scaling is for fp16, whose small gradients flush to zero.",
})
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q4_fix", q4_fix)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. Pick the bucket size (3 points)
#
# Lecture 9 all-reduced the gradients by buckets during backward and timed it on real ranks:
# per bucket size, each rank's median over several steps (ms) of the whole step
# (`step_ms`: forward, backward with the buckets' all-reduces, the waits), compute alone
# (`compute_ms`), communication alone (`comm_ms`) and the time blocked in `work.wait()` after
# backward (`wait_ms`). A step is over when **every** rank has its averaged gradients. The team
# wants the bucket size with the **fastest step**.
#
# *Practice (not graded)*: two ranks measured these medians (`PRACTICE_RUNS[r][i]` is rank r's
# row for bucket size `PRACTICE_SIZES[i]`, in MiB). Assign to `practice_step_ms` the list of
# step times that decide, one per size in the order of `PRACTICE_SIZES`, and to
# `practice_best` the bucket size to pick.

# %%
PRACTICE_SIZES = [0.25, 1.0, 4.0, 25.0]
PRACTICE_RUNS = [
    [{"bucket_mb": 0.25, "step_ms": 41.0, "compute_ms": 19.0, "comm_ms": 30.0, "wait_ms": 12.0},
     {"bucket_mb": 1.0, "step_ms": 31.0, "compute_ms": 19.5, "comm_ms": 12.0, "wait_ms": 4.0},
     {"bucket_mb": 4.0, "step_ms": 29.0, "compute_ms": 18.5, "comm_ms": 10.0, "wait_ms": 5.0},
     {"bucket_mb": 25.0, "step_ms": 36.0, "compute_ms": 19.0, "comm_ms": 9.0, "wait_ms": 11.0}],
    [{"bucket_mb": 0.25, "step_ms": 42.5, "compute_ms": 19.5, "comm_ms": 31.0, "wait_ms": 13.0},
     {"bucket_mb": 1.0, "step_ms": 30.5, "compute_ms": 19.0, "comm_ms": 12.5, "wait_ms": 3.5},
     {"bucket_mb": 4.0, "step_ms": 33.5, "compute_ms": 19.0, "comm_ms": 10.5, "wait_ms": 6.0},
     {"bucket_mb": 25.0, "step_ms": 36.5, "compute_ms": 19.5, "comm_ms": 9.5, "wait_ms": 12.0}],
]

# %% [answer q5_practice]
### BEGIN SOLUTION
practice_step_ms = [max(run[i]["step_ms"] for run in PRACTICE_RUNS)
                    for i in range(len(PRACTICE_SIZES))]
practice_best = PRACTICE_SIZES[practice_step_ms.index(min(practice_step_ms))]
### END SOLUTION

# %%
checks.check_sequence("practice_step_ms", practice_step_ms, [42.5, 31.0, 33.5, 36.5], hint=(
    "Per size, take the step time of the slowest rank (the largest of the two): a step ends "
    "when every rank has its gradients. Rank 0's column alone, or the mean of the ranks, "
    "hides the rank that everyone waits for."))
checks.check_number("practice_best", practice_best, 1.0, unit="MiB", mistakes=[
    (4.0, "4 MiB is fastest on rank 0 alone, but rank 1 takes 33.5 ms there; the slowest "
          "rank decides, and at 1 MiB it takes 31.0 ms."),
    (25.0, "25 MiB has the least communication alone (one call), but one bucket starts only "
           "when backward ends: nothing overlaps. Pick by step time."),
    (0.25, "the smallest buckets start earliest but pay the per-call latency many times "
           "(32 calls here): their step is the slowest."),
])
print("practice Q5: right")

# %% [markdown]
# **Graded**: measure it yourself. The next cell runs the lecture's worker
# `overlap.timing_worker` on **2 real ranks** through `launch.run`, for the bucket sizes
# `Q5_SIZES` (the lecture's MLP: 32 layers 256 wide, 8 MiB of gradients; medians of 7 steps
# after 2 of warm-up). `q5_runs[r][i]` is rank r's row for `Q5_SIZES[i]`, with the keys of the
# practice rows. It takes a few seconds; your numbers are yours, they differ from anyone
# else's, and grading checks your pick against **your** table.
#
# Assign to `q5_step_ms` the list of step times that decide (one per size, in the order of
# `Q5_SIZES`, ms) and to `q5_best` the bucket size with the fastest step (a size within 2% of
# the fastest counts as the fastest). Do not use `overlap.measure_overlap` (it builds the
# table for you).

# %%
from course_utils import launch
from course_utils.data_parallel import overlap

Q5_SIZES = [0.25, 1.0, 4.0, 25.0]
q5_runs = launch.run(overlap.timing_worker, 2, Q5_SIZES, 7, 2, timeout_s=120, show_output=False)
print(f"{'rank':>4}{'bucket MiB':>12}{'step':>8}{'compute':>9}{'comm':>8}{'wait':>8}")
for r, run in enumerate(q5_runs):
    for row in run:
        print(f"{r:>4}{row['bucket_mb']:>12g}{row['step_ms']:>8.1f}{row['compute_ms']:>9.1f}"
              f"{row['comm_ms']:>8.1f}{row['wait_ms']:>8.1f}")

# %% [answer q5]
### BEGIN SOLUTION
q5_step_ms = [max(run[i]["step_ms"] for run in q5_runs) for i in range(len(Q5_SIZES))]
q5_best = Q5_SIZES[q5_step_ms.index(min(q5_step_ms))]
### END SOLUTION

# %% [test q5_test points=3]
if not isinstance(q5_step_ms, (list, tuple)) or len(q5_step_ms) != len(Q5_SIZES):
    raise AssertionError(f"q5_step_ms should be a list with one step time per size of "
                         f"Q5_SIZES ({len(Q5_SIZES)} numbers).")
for _i, _v in enumerate(q5_step_ms):
    checks.check_number(f"q5_step_ms[{_i}]", _v, unit="ms")
_rank0 = [float(row["step_ms"]) for row in q5_runs[0]]
_rank1 = [float(row["step_ms"]) for row in q5_runs[1]]
if [float(v) for v in q5_step_ms] == _rank0 and any(a < b for a, b in zip(_rank0, _rank1)):
    raise AssertionError("q5_step_ms is rank 0's column, and rank 1 was slower at some size: "
                         "the step is over only when the slower rank is done too.")
checks.check_number("q5_best", q5_best, unit="MiB")
if float(q5_best) not in Q5_SIZES:
    raise AssertionError(f"q5_best = {q5_best!r}: pick one of Q5_SIZES {Q5_SIZES}.")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q5_runs", q5_runs)
submit("q5_step_ms", q5_step_ms)
submit("q5_best", q5_best)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. Sequence parallelism (2 points)
#
# With Megatron tensor parallelism over t GPUs (no recomputation, 16-bit, dropout), each GPU
# saves per layer (Korthikanti et al. 2022, as in lecture 9)
#
# $$s\,b\,h\,\Bigl(10 + \frac{24}{t} + 5\,\frac{a\,s}{h\,t}\Bigr)\ \text{bytes}.$$
#
# Sequence parallelism runs LayerNorm and dropout on s/t of the tokens on each GPU (lecture 9,
# section 4), on top of the same tensor parallelism.
#
# *Practice (not graded)*: a GPT model with h = 2048, a = 16 heads and 24 layers trains on
# sequences of s = 4096 tokens, micro-batch b = 1, tensor parallel over **t = 4** GPUs. How many
# GB of activations does each GPU save for backward (all layers) (a) with tensor parallelism
# alone, `practice_tp_gb`, and (b) with sequence parallelism as well, `practice_sp_gb`?

# %% [answer q6_practice]
### BEGIN SOLUTION
practice_tp_gb = 4096 * 1 * 2048 * (10 + 24 / 4 + 5 * 16 * 4096 / (2048 * 4)) * 24 / 1e9
practice_sp_gb = 4096 * 1 * 2048 * (34 + 5 * 16 * 4096 / 2048) / 4 * 24 / 1e9
### END SOLUTION

# %%
checks.check_number("practice_tp_gb", practice_tp_gb, 11.274289152, unit="GB", mistakes=[
    (9.764339712, "that divides the whole s b h (34 + 5 a s / h) by t: tensor parallelism alone "
                  "keeps the LayerNorm and dropout activations (the 10 s b h) whole on every GPU."),
    (39.057358848, "that is one device's activations: tensor parallelism splits the 24 s b h of "
                   "the matmuls' inputs and the attention matrix by t."),
    (35.433480192, "the attention matrix is split by heads too: 5 a s / h is divided by t."),
    (0.469762048, "that is one layer; the model has 24."),
    (11.274289152e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes."),
])
checks.check_number("practice_sp_gb", practice_sp_gb, 9.764339712, unit="GB", mistakes=[
    (11.274289152, "that is tensor parallelism alone: sequence parallelism also splits the "
                   "10 s b h that TP replicates (LayerNorm inputs and outputs, dropout masks)."),
    (3.724541952, "the attention term was divided by t twice: tensor parallelism already splits "
                  "it by heads, and sequence parallelism does not split it again. Every term "
                  "is divided by t once: s b h (34 + 5 a s / h) / t."),
    (39.057358848, "that is one device's activations: divide by t."),
    (9.764339712e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes."),
])
print("practice Q6: right")

# %% [markdown]
# **Graded**: a GPT model with hidden size h, a heads and L layers trains on sequences of
# s tokens, micro-batch b = 1, tensor parallel over t GPUs, no recomputation, where
# `(h, a, L, s, t) = G.q6`. How many GB of activations does each GPU save for backward (all
# layers) (a) with tensor parallelism alone, `q6_tp_gb`, and (b) with sequence parallelism as
# well, `q6_sp_gb`?

# %% [answer q6]
### BEGIN SOLUTION
h, a, n_layers, s, tp = G.q6
q6_tp_gb = s * 1 * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * n_layers / 1e9
q6_sp_gb = s * 1 * h * (34 + 5 * a * s / h) / tp * n_layers / 1e9
### END SOLUTION

# %% [test q6_test points=2]
checks.check_number("q6_tp_gb", q6_tp_gb, unit="GB")
checks.check_number("q6_sp_gb", q6_sp_gb, unit="GB")
if abs(float(q6_sp_gb) - float(q6_tp_gb)) <= 1e-3 * abs(float(q6_tp_gb)):
    raise AssertionError("q6_sp_gb equals q6_tp_gb: sequence parallelism also splits the "
                         "10 s b h that tensor parallelism keeps whole on every GPU.")
if float(q6_sp_gb) > float(q6_tp_gb):
    raise AssertionError("q6_sp_gb is larger than q6_tp_gb: sequence parallelism only splits "
                         "what tensor parallelism keeps whole; it never adds activations.")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q6_tp_gb", q6_tp_gb)
submit("q6_sp_gb", q6_sp_gb)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q7. Selective or full? (2 points, graded by hand)
#
# Full recomputation fits a far larger micro-batch than selective recomputation or none (in
# Q2, compare what each fits for your numbers). Explain, with the formulas: which saved tensors selective recomputation drops, and why
# recomputing them costs little time; roughly how much longer a step takes with full
# recomputation, and why; and one reason a team might still choose full recomputation with the
# larger micro-batch. Does either change the loss or the gradients?

# %% [manual q7_explain points=2]
# ### BEGIN SOLUTION
# Selective recomputation drops the 5 a s / h part of s b h (34 + 5 a s / h): the attention
# scores' softmax output, its dropout mask and dropout output, a s^2 b values per layer: for
# the practice model at s = 4096 (h = 2048, a = 16), 160 of the 194 s b h (82% of the bytes). Rerunning them costs little because they are
# element-wise operations and two attention matmuls; the big matmuls with the weights (QKV,
# projection, MLP) are not rerun, so the extra time is a few percent. Full recomputation keeps
# only each layer's input (2 s b h) and reruns the whole forward pass in backward: about one
# extra forward per step, roughly a third more time (forward is about a third of forward plus
# backward). A team may still choose it because a many times larger micro-batch means fewer gradient
# accumulation steps or fewer ranks for the same global batch, larger and more efficient
# matmuls, and the communication per token shrinks. Neither changes the loss or gradients: the
# recomputed forward uses the same weights and inputs (lecture 9 checks bit-for-bit equality).
#
# **Rubric** (2 points):
# * 1 point: says selective recomputation drops the attention matrix's tensors (softmax output,
#   dropout mask and output, the 5 a s / h term, quadratic in s, most of the bytes at long
#   sequences)
#   and that recomputing them is cheap because the weight matmuls are not rerun (a few percent
#   of a step).
# * 1 point: says full recomputation reruns the whole forward in backward, about one extra
#   forward per step (roughly 30 to 40% more time), gives one reason to accept it (larger
#   micro-batch: fewer accumulation steps or ranks, more efficient matmuls, less communication
#   per token), and says the loss and gradients do not change.
# * 0 points: says recomputation changes the loss or gradients, or calls full recomputation
#   free, or confuses recomputation with sharding the activations across ranks.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a9_activations.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a9_activations/a9_activations.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a9_activations` grades your copy the same way.
