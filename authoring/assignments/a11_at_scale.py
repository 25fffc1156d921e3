# %% [markdown]
# # Assignment 11: Predict a job at scale, then check it
#
# Lecture 11 sharded Llama-shaped models with PyTorch's own APIs on a fake process group and
# read each rank's bytes and one step's collectives. Here you predict them yourself, for a
# model and a mesh drawn for you, check your prediction with the simulated job, and say what
# the simulation cannot tell (Q4, graded by hand).
#
# **The job** (as in the lecture): a Llama-shaped model (`course_utils.models.llama_shapes.Shape`:
# `vocab`, `hidden`, `layers`, `ffn`, `heads`, `kv_heads`, `head_dim`; no biases; an untied
# output head) on a PP x DP x TP mesh. Pipeline stage `s` of `P` holds its layers
# (`llama_shapes.stage_layers`, contiguous, split as torchtitan and Llama 3 split: the
# embedding and the output count as a layer each, the `layers + 2` go evenly to the stages,
# the first `(layers + 2) % P` one more, then the first and the last stage hold one layer
# fewer); the first stage also holds the embedding (`vocab x hidden`), the last the final
# RMSNorm (`hidden`) and the head (`vocab x hidden`). Tensor parallelism (Megatron's plan): q, k, v, w1, w3, the
# embedding and the head split their rows (dim 0) over TP; o and w2 split their columns; the
# two RMSNorm weights of each layer and the final one stay whole on every TP rank. FSDP2 then
# splits every tensor's local rows (dim 0) over DP into chunks of ceil(rows / DP): rank 0 of
# DP holds a whole chunk, and every DP rank allocates one. Each parameter costs 16 bytes: fp32
# weight (4), fp32 gradient (4), AdamW's two fp32 moments (8). **Units**: 1 GB = 10^9 bytes.
#
# **What the tests tell you while you practise.** Each graded question has a practice twin
# that the cell after it checks fully. The graded numbers' visible tests check the type and
# reject known wrong answers without saying what the right one is. Q2's visible test runs your
# function on visible cases. **Grading adds** your own numbers' values, judged against the
# simulated job, and your function on hidden meshes and models drawn for your submission.
#
# **Your own numbers.** Q1 and Q3 use jobs drawn for you (`G.q1`, `G.q3`: model name, TP, PP,
# DP, in the table the next cell shows). Do not edit that cell.
#
# **Work the answers out yourself**, then check them with the simulation
# (`scale_memory.rank_state`, `scale_comms.trace_step`): an answer computed by those helpers
# is flagged for your instructor.

# %%
import math

from course_utils.assess import checks, variants
from course_utils.models import llama_shapes

G = variants.givens("a11_at_scale", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## Q1. One rank's bytes (3 points)
#
# *Practice (not graded)*: Llama 7B (`llama_shapes.shape("7B")`) on TP 4 x PP 4 x DP 3. Set
# `practice_first_gb` to the persistent GB of rank 0 (stage 0, DP and TP coordinate 0) and
# `practice_last_gb` to those of the last stage's first rank (stage 3, DP and TP coordinate 0).

# %% [answer q1_practice]
### BEGIN SOLUTION
def stage_params(shape, tp, pp, dp, stage):
    """Elements the stage's rank with DP and TP coordinate 0 allocates (whole FSDP2 chunks)."""
    n = len(llama_shapes.stage_layers(shape.layers, pp, stage))
    h, f, v = shape.hidden, shape.ffn, shape.vocab
    kv = shape.kv_heads * shape.head_dim

    def chunk(rows, cols):
        return math.ceil(rows / dp) * cols

    layer = (chunk(h // tp, h) + 2 * chunk(kv // tp, h) + chunk(h, h // tp)
             + 2 * chunk(f // tp, h) + chunk(h, f // tp) + 2 * chunk(h, 1))
    first, last = stage == 0, stage == pp - 1
    return n * layer + first * chunk(v // tp, h) + last * (chunk(v // tp, h) + chunk(h, 1))


practice_first_gb = 16 * stage_params(llama_shapes.shape("7B"), 4, 4, 3, 0) / 1e9
practice_last_gb = 16 * stage_params(llama_shapes.shape("7B"), 4, 4, 3, 3) / 1e9
### END SOLUTION

# %%
_n7 = llama_shapes.param_count("7B")
checks.check_number("practice_first_gb", practice_first_gb, 2.335872512, unit="GB", rel=1e-6,
                    mistakes=[
    (16 * _n7 / 48 / 1e9, "that is 16N / (TP x PP x DP): stages are not equal (the embedding "
                          "is on the first), norms stay whole under TP, chunks are rounded up"),
    (16 * 7e9 / 48 / 1e9, "that takes the name for the parameter count: Llama 7B has "
                          "6.74e9 parameters (llama_shapes.param_count), and its stages are "
                          "not equal"),
    (2.3337806506666663, "the chunks are not rounded up: FSDP2 pads each tensor's rows to a "
                         "multiple of DP (ceil(rows / DP) per rank), and rank 0 holds a whole "
                         "chunk"),
    (2.161088, "the embedding is missing: the first stage holds it (vocab / TP rows)"),
    (2.335610368, "the RMSNorm weights were split over TP: they stay whole on every TP rank"),
])
checks.check_number("practice_last_gb", practice_last_gb, 2.065758368, unit="GB", rel=1e-6,
                    mistakes=[
    (2.335872512, "that is the first stage: the last holds the head and the final norm "
                  "instead of the embedding, and 7 layers"),
    (2.335894368, "that gives the last stage 8 layers (the even split): the output counts as "
                  "a layer, so it holds 7"),
])
print("practice Q1: right")

# %% [markdown]
# **Graded**: your job is `G.q1 = (model name, TP, PP, DP)`. Set `q1_first_gb` (rank 0) and
# `q1_last_gb` (the last stage's rank with DP and TP coordinate 0), in GB.

# %% [answer q1]
### BEGIN SOLUTION
name, tp, pp, dp = G.q1
q1_first_gb = 16 * stage_params(llama_shapes.shape(name), tp, pp, dp, 0) / 1e9
q1_last_gb = 16 * stage_params(llama_shapes.shape(name), tp, pp, dp, pp - 1) / 1e9
### END SOLUTION

# %% [test q1_test points=3]
# Checks the type and rejects known wrong answers; the values are checked when graded.
_name, _tp, _pp, _dp = G.q1
_n = llama_shapes.param_count(_name)
checks.check_number("q1_first_gb", q1_first_gb, unit="GB", variant=G.key("q1"), rel=1e-6,
                    mistakes=[
    (16 * _n / (_tp * _pp * _dp) / 1e9, "that is 16N / (TP x PP x DP): the stages are not "
                                        "equal, and norms and chunks are not either"),
    # (the name's own number: "7B" says 7e9)
    (16 * (float(_name[:-1]) * 1e9 if _name.endswith("B") else _n) / (_tp * _pp * _dp) / 1e9,
     "that takes the model's name for its parameter count (llama_shapes.param_count says how "
     "many), and its stages are not equal"),
])
checks.check_number("q1_last_gb", q1_last_gb, unit="GB", variant=G.key("q1"), rel=1e-6,
                    mistakes=[
    (16 * _n / (_tp * _pp * _dp) / 1e9, "that is 16N / (TP x PP x DP): the last stage holds "
                                        "the head and the final norm"),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q1_first_gb", q1_first_gb)
submit("q1_last_gb", q1_last_gb)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Any rank, any mesh (3 points)
#
# Write `rank_bytes(shape, tp, pp, dp, stage)`: the persistent bytes (an int) of pipeline
# stage `stage`'s rank with DP and TP coordinate 0, for a `llama_shapes.Shape` on a
# TP x PP x DP mesh. The visible cases below are what the simulated job measures; grading runs
# your function on other models and meshes and compares with the simulation.

# %% [answer q2]
def rank_bytes(shape, tp, pp, dp, stage):
    """Persistent bytes of stage ``stage``'s rank with DP and TP coordinate 0."""
    ### BEGIN SOLUTION
    return 16 * stage_params(shape, tp, pp, dp, stage)
    ### END SOLUTION

# %% [test q2_test points=3]
# Visible cases (model, TP, PP, DP, stage) -> bytes, as the simulation measures them; what the
# course's typical mistakes give on them (grading names these on other models and meshes too).
_visible = {("tiny", 2, 2, 3, 0): 52160, ("tiny", 2, 2, 3, 1): 52336,
            ("70B", 8, 2, 3, 1): 23006871984}
_typical = {
    "16N / (TP x PP x DP) splits evenly, but stages differ, norms stay whole under TP and "
    "chunks are rounded up": [49877, 49877, 22992216064],
    "chunks not rounded up: FSDP2 pads a tensor's local rows to a multiple of DP": [
        50176, 50347, 22995315371],
    "norms split over TP: an RMSNorm weight stays whole on every TP rank": [
        51840, 51936, 23003775840],
    "no embedding: stage 0 holds it, vocab / TP rows": [43456, None, None],
}
for _i, ((_m, _tp, _pp, _dp, _stage), _want) in enumerate(_visible.items()):
    _got = rank_bytes(llama_shapes.shape(_m), _tp, _pp, _dp, _stage)
    _case = (f"rank_bytes on visible case {_i + 1} ({_m}, TP {_tp} x PP {_pp} x DP {_dp}, "
             f"stage {_stage})")
    if isinstance(_got, bool) or not isinstance(_got, int):
        raise checks.CheckFailed(f"{_case} returned a {type(_got).__name__}: it must return "
                                 f"an int, a number of bytes")
    if _got != _want:
        _why = next((w for w, v in _typical.items() if v[_i] and abs(_got - v[_i]) <= 1), None)
        raise checks.CheckFailed(f"{_case} is not what the simulated job measures"
                                 + (f": {_why}" if _why else ""))
print("checked rank_bytes on the 3 visible cases: right there; grading runs it on other models "
      "and meshes")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _case, (_m, _tp, _pp, _dp, _stage) in enumerate(hidden_cases("q2_test"), 1):
    submit(f"rank_bytes on hidden case {_case}",
           rank_bytes(llama_shapes.shape(_m), _tp, _pp, _dp, _stage))
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. One step's traffic per axis (3 points)
#
# One forward and backward of one sequence of 4096 tokens through rank 0's stage (the first):
# one microbatch, not a whole step of several (lecture 11, section 2), as lecture 11 traced it
# with FSDP2's default resharding: FSDP2 gathers bf16 weights (2 bytes) and reduces bf16
# gradients, the activations are bf16. The TP plan is lecture 11's `per_linear`
# (`llama_shapes.apply_tp`): it all-reduces each row-parallel output (o, w2) in forward and each
# column-parallel linear's input gradient (q, k, v, w1, w3, each its own) in backward, and the
# embedding's output in forward (not the `block` plan, whose shared inputs all-reduce once per
# half-layer); FSDP2 gathers every layer before its forward and again before its backward, but
# keeps the root's own weights (the embedding) gathered between them. A ring sends 2(g-1)/g of
# an all-reduce's buffer and (g-1)/g of an all-gather's output over a group of g ranks.
#
# *Practice (not graded)*: Llama 7B on TP 4 x PP 4 x DP 3, rank 0. Set `practice_tp_calls`
# (TP all-reduces), `practice_tp_gb` (GB rank 0 sends in them) and `practice_dp_gather_gb`
# (GB rank 0 sends in DP all-gathers).

# %% [answer q3_practice]
### BEGIN SOLUTION
def step_traffic(shape, tp, pp, dp, tokens=4096):
    """(TP all-reduces, GB sent in them, GB sent in DP all-gathers) of rank 0, one step."""
    n = len(llama_shapes.stage_layers(shape.layers, pp, 0))
    calls = 7 * n + 1 if tp > 1 else 0
    tp_gb = calls * 2 * (tp - 1) / tp * tokens * shape.hidden * 2 / 1e9
    rows = math.ceil(shape.vocab // tp / dp) * shape.hidden     # the embedding's chunk
    root = rows if pp > 1 else 2 * rows + math.ceil(shape.hidden / dp)
    layers = stage_params(shape, tp, pp, dp, 0) - root
    dp_gb = (dp - 1) * 2 * (2 * layers + root) / 1e9            # all-gather output: dp chunks
    return calls, tp_gb, dp_gb


practice_tp_calls, practice_tp_gb, practice_dp_gather_gb = step_traffic(
    llama_shapes.shape("7B"), 4, 4, 3)
### END SOLUTION

# %%
checks.check_number("practice_tp_calls", practice_tp_calls, 57, mistakes=[
    (32, "4 per layer is the block plan's count (q, k, v share one input, as w1 and w3 do); "
         "the per_linear plan here all-reduces each column-parallel linear's input gradient "
         "on its own: 2 forward + 5 backward per layer, and the embedding"),
    (56, "the embedding's forward all-reduce is missing (its rows are split over TP)"),
])
checks.check_number("practice_tp_gb", practice_tp_gb, 2.868903936, unit="GB", rel=1e-6, mistakes=[
    (1.434451968, "a ring all-reduce sends 2(g-1)/g of the buffer, not (g-1)/g"),
    (5.737807872, "the activations are bf16 (2 bytes), not fp32"),
])
checks.check_number("practice_dp_gather_gb", practice_dp_gather_gb, 1.124240128, unit="GB",
                    rel=1e-6, mistakes=[
    (1.167936256, "the embedding (the root module's own weight) is gathered once, not twice: "
                  "FSDP2 keeps the root gathered from forward to backward"),
    (2.248480256, "the weights are gathered in bf16 (2 bytes), not fp32"),
])
print("practice Q3: right")

# %% [markdown]
# **Graded**: the same for rank 0 of your job `G.q3` (model name, TP, PP, DP): set
# `q3_tp_calls`, `q3_tp_gb` and `q3_dp_gather_gb`.

# %% [answer q3]
### BEGIN SOLUTION
q3_tp_calls, q3_tp_gb, q3_dp_gather_gb = step_traffic(llama_shapes.shape(G.q3[0]), *G.q3[1:])
### END SOLUTION

# %% [test q3_test points=3]
# Checks the types and rejects known wrong answers; the values are checked when graded.
_name, _tp, _pp, _dp = G.q3
_layers = len(llama_shapes.stage_layers(llama_shapes.shape(_name).layers, _pp, 0))
checks.check_number("q3_tp_calls", q3_tp_calls, variant=G.key("q3"), mistakes=[
    (4 * _layers, "4 per layer is the block plan's count; this question's plan is per_linear"),
])
checks.check_number("q3_tp_gb", q3_tp_gb, unit="GB", variant=G.key("q3"), rel=1e-6)
checks.check_number("q3_dp_gather_gb", q3_dp_gather_gb, unit="GB", variant=G.key("q3"),
                    rel=1e-6)
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q3_tp_calls", q3_tp_calls)
submit("q3_tp_gb", q3_tp_gb)
submit("q3_dp_gather_gb", q3_dp_gather_gb)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. What the simulation cannot tell you (2 points, graded by hand)
#
# Your Q1 and Q3 figures say what each rank of your job holds and sends. (a) Name two things
# that decide whether the job fits and how fast it trains that a fake process group cannot
# measure, and where in the course you would measure each. (b) Your Q1 rank holds its state
# with room to spare on an 80 GB GPU; give one reason the real job could still run out of
# memory.

# %% [manual q4_explain points=2]
# ### BEGIN SOLUTION
# (a) Time: how long each collective takes (bandwidth, latency, the topology TP and DP groups
# span), measured on real ranks (module 7: timing with synchronization, bus bandwidth);
# overlap: whether FSDP2's prefetch hides the all-gathers behind compute (module 9's buckets,
# the profiler's timeline); stragglers and failures (module 7's per-rank wait, module 12).
# (b) The simulation counts persistent state only: activations saved for backward (module 9:
# s b h (34 + 5 a s / h) per layer and microbatch, times the microbatches 1F1B keeps in
# flight), the gathered layer and the prefetched next one, communication buffers, the
# caching allocator's fragmentation (the peak from `torch.cuda.max_memory_allocated`).
#
# **Rubric** (2 points):
# * 1 point: two unmeasurable quantities (collective time, overlap, stragglers, real peaks),
#   each with where the course measures it.
# * 1 point: one real memory cost beyond persistent state (activations, gathered or prefetched
#   layers, buffers, fragmentation).
# * 0 points: says the simulation measures time or peak memory.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a11_at_scale.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a11_at_scale/a11_at_scale.ipynb`), the
# way your instructor asks. Outputs may be cleared: your instructor runs the whole notebook
# again, from the top, in a fresh kernel, to grade it, so first check that *Kernel > Restart
# Kernel and Run All Cells* meets no `NameError`. Learning on your own with the full
# repository? `make check A=a11_at_scale` grades your copy the same way.
