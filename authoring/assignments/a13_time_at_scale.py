# %% [markdown]
# # Assignment 13: Time a step at scale
#
# Lecture 13 predicted a training step term by term (the matmuls at the achieved rate, tensor
# parallelism's collectives, the pipeline's bubble, the data-parallel time that compute does
# not hide, the optimizer) and held the prediction against published runs. Here you compute
# those terms yourself for a plan drawn for you (Q1), choose the faster of two plans on the
# same GPUs (Q2), compute a run's MFU from its throughput (Q3), and explain where the model
# misses a published run (Q4, graded by hand).
#
# **What the tests tell you while you practise.** Each graded question has a practice twin
# that the cell after it checks fully. The graded numbers' visible tests check the type and
# reject known wrong answers without saying what the right one is. **Grading adds** your own
# numbers' values, judged against lecture 13's model (`course_utils.step_time`) itself.
#
# **Your own numbers.** Q1, Q2 and Q3 use jobs drawn for you (`G.q1`, `G.q2`, `G.q3`, in the
# table the next cell shows). Do not edit that cell.
#
# **Work the answers out yourself.** An answer (or an added cell) that calls the lecture's
# model, `transformer.predict`, `terms.assemble`, `published.rows` and its kin, or for Q3
# `transformer.flops_per_token`, is flagged for your instructor. You may use the pieces:
# `hardware.matmul_s` (one matmul's roofline), `transformer.param_count` and
# `transformer.matmul_params`, `cost.ring_time_s` (module 2's ring) and `schedule.simulate`
# (module 5's pipeline).

# %%
from course_utils.assess import checks, variants
from course_utils.collectives import cost
from course_utils.pipeline import schedule
from course_utils.step_time import hardware, published, transformer

MODELS = {"LLAMA3_8B": published.LLAMA3_8B, "LLAMA3_70B": published.LLAMA3_70B,
          "LLAMA3_405B": published.LLAMA3_405B}     # transformer.Arch, by the givens' names
DEVICES = {"H100": hardware.H100, "A100": hardware.A100}    # hardware.Hardware
G = variants.givens("a13_time_at_scale", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## The step, term by term (the rules of Q1 and Q2)
#
# A Llama-style decoder `a = MODELS[name]` (a `transformer.Arch`: `a.layers` L, `a.hidden` h,
# `a.ffn` f, `a.heads`, `a.kv_heads`, `a.head_dim`, `a.vocab` V) trains on TP x PP x DP GPUs,
# all one device `hw = DEVICES[name]` (`hw.peak_flops`, the datasheet's dense bf16 peak;
# `hw.efficiency`; `hw.achieved_flops` = peak x efficiency, the rate a large matmul reaches;
# `hw.mem_bytes_per_s`; `hw.intra`, NVLink inside a node of `hw.gpus_per_node` = 8 GPUs, and
# `hw.inter`, the network link of each GPU between nodes, each with `alpha_s` and
# `bytes_per_s`). A step takes a global batch of B sequences of s tokens in microbatches of one
# sequence: each DP replica runs m = B / DP microbatches through PP stages with 1F1B (m is a
# multiple of PP here). The ranks are laid out TP innermost, then PP, then DP, so a TP group
# stays in a node. The stages are equal, so every rank's step is the slowest rank's; all times
# are in seconds, for one rank.
#
# 1. **Compute.** One microbatch's forward through one layer on a TP rank is seven matmuls of
#    its n = s tokens, given as (rows, inner, columns): q (n, h, h/TP), k and v (n, h, kv/TP)
#    each, with kv = `kv_heads` x `head_dim`, o (n, h/TP, h), and the MLP's (n, h, f/TP) twice
#    and (n, f/TP, h). Each takes its roofline, `hardware.matmul_s(rows, inner, cols, hw)`: the
#    larger of its 2 x rows x inner x cols FLOPs at the achieved rate and its three bf16
#    matrices' bytes at the memory bandwidth (a narrow one can be memory-bound). The attention
#    scores add 4 s^2 h / TP FLOPs a layer (q k^T and the weighted sum of the values: every
#    score of the s x s matrix, none skipped for causality) at the achieved rate. The output
#    head is one more matmul, (n, h, V/TP); the embedding is a lookup (no FLOPs); norms,
#    softmax and elementwise work are left out. A stage holds L / PP layers and a PP-th of the
#    head: one microbatch's forward through it is F = (L x layer + head) / PP, its backward
#    B = 2F (the inputs' and the weights' gradients). **compute** = m (F + B).
# 2. **TP.** Per layer and microbatch, two all-reduces forward and two backward (Megatron's f
#    and g) of the microbatch's bf16 activation, s x h x 2 bytes, on `hw.intra`, none hidden.
#    A ring all-reduce over g ranks takes 2(g - 1) alpha + 2(g - 1)/g x bytes / beta
#    (`cost.ring_time_s(bytes, g, alpha, beta)`; 0 when TP = 1). One microbatch's TP time is
#    T = (L / PP) x 2 all-reduces forward, and as much backward. **tp** = m x 2T.
# 3. **Bubble.** A stage sends one activation (the same s x h x 2 bytes) to the next in
#    c = alpha + bytes / beta, on `hw.intra` when TP x PP <= 8 (the whole pipeline in one node)
#    and on `hw.inter` otherwise. With F' = F + T and B' = B + T a microbatch's forward and
#    backward and c each send between stages, 1F1B over p = PP stages takes, as module 5's
#    simulator plays it (`schedule.simulate("1f1b", p, m, backward_ratio=B'/F',
#    comm_time=c/F')` in units of F'), (m + p - 1)(F' + B') + 2c((p - 1) m / p + p - 2) when m
#    is a multiple of p: the sends hold up the steady state too, not only the fill and the
#    drain. The **bubble** is that span less the m (F' + B') the rank computes and
#    communicates: (p - 1)(F' + B') + 2c((p - 1) m / p + p - 2).
# 4. **DP.** A rank holds P / (TP x PP) of the parameters, P = `transformer.param_count(a)`
#    (the matmuls' weights, the embedding and the norms). Once a step their gradients are
#    reduce-scattered in fp32 (4 bytes a parameter) and the updated weights all-gathered in bf16
#    (2 bytes) over the DP ranks on `hw.inter`: a ring reduce-scatter or all-gather over g ranks
#    takes (g - 1) alpha + (g - 1)/g x bytes / beta (`cost.ring_time_s(bytes, g, alpha, beta,
#    "reduce_scatter")`, `"all_gather"`). The reduce-scatter runs behind the last microbatch's
#    backward compute B (module 9's buckets), the all-gather behind the first forward's F
#    (prefetched, as FSDP does): each adds only the part longer than its window,
#    max(0, time - window), the **DP exposed** time. The rest is hidden: not added.
# 5. **Optimizer.** AdamW reads and writes 30 bytes per parameter of the rank's shard,
#    P / (TP x PP x DP) parameters, at the memory bandwidth.
#
# **step** = compute + tp + bubble + DP exposed + optimizer.

# %% [markdown]
# ## Q1. One step, term by term (3 points)
#
# *Practice (not graded)*: Llama 3 70B (`MODELS["LLAMA3_70B"]`) on A100, TP 8 x PP 2 x DP 16,
# a global batch of 128 sequences of 4096 tokens. Write `step_terms(a, hw, tp, pp, dp, batch,
# seq)`, which returns a dict of the five terms (`"compute"`, `"tp"`, `"bubble"`,
# `"dp_exposed"`, `"optimizer"`) and their sum (`"step"`), and set `practice_compute_s`,
# `practice_tp_s`, `practice_bubble_s` and `practice_step_s`.

# %% [answer q1_practice]
### BEGIN SOLUTION
def step_terms(a, hw, tp, pp, dp, batch, seq):
    """One rank's step on TP x PP x DP, 1F1B, microbatches of one sequence: its terms and
    their sum, in seconds."""
    m, n = batch // dp, seq                       # microbatches of a replica; their tokens
    h, f, kv = a.hidden, a.ffn, a.kv_heads * a.head_dim
    shapes = [(n, h, h // tp), (n, h, kv // tp), (n, h, kv // tp), (n, h // tp, h),
              (n, h, f // tp), (n, h, f // tp), (n, f // tp, h)]
    layer = sum(hardware.matmul_s(*shape, hw) for shape in shapes)
    layer += 4 * seq * seq * h / tp / hw.achieved_flops       # the scores and their use
    head = hardware.matmul_s(n, h, a.vocab // tp, hw)
    forward = (a.layers * layer + head) / pp
    backward = 2 * forward
    act = n * h * 2                                            # one bf16 activation
    one = cost.ring_time_s(act, tp, hw.intra.alpha_s, hw.intra.bytes_per_s) if tp > 1 else 0.0
    tp_each = a.layers / pp * 2 * one                          # forward's, and backward's
    link = hw.intra if tp * pp <= hw.gpus_per_node else hw.inter
    c = link.alpha_s + act / link.bytes_per_s
    f_all, b_all = forward + tp_each, backward + tp_each
    bubble = (pp - 1) * (f_all + b_all) + 2 * c * ((pp - 1) * m / pp + pp - 2) if pp > 1 else 0.0
    shard = transformer.param_count(a) / (tp * pp)
    net = hw.inter
    rs = cost.ring_time_s(4 * shard, dp, net.alpha_s, net.bytes_per_s, "reduce_scatter")
    ag = cost.ring_time_s(2 * shard, dp, net.alpha_s, net.bytes_per_s, "all_gather")
    terms = {"compute": m * (forward + backward), "tp": m * 2 * tp_each, "bubble": bubble,
             "dp_exposed": max(0.0, rs - backward) + max(0.0, ag - forward),
             "optimizer": shard / dp * 30 / hw.mem_bytes_per_s}
    return {**terms, "step": sum(terms.values())}


practice = step_terms(MODELS["LLAMA3_70B"], DEVICES["A100"], 8, 2, 16, 128, 4096)
practice_compute_s, practice_tp_s = practice["compute"], practice["tp"]
practice_bubble_s, practice_step_s = practice["bubble"], practice["step"]
### END SOLUTION

# %%
checks.check_number("practice_compute_s", practice_compute_s, 3.39766728675, unit="s",
                    rel=1e-4, mistakes=[
    (2.96200366827, "that runs the matmuls at the datasheet peak (312 TFLOP/s): a matmul "
                    "reaches the achieved rate, hw.achieved_flops = peak x efficiency."),
    (3.19676971026, "that is 6N FLOPs a token: the attention scores (4 s^2 h / TP a layer "
                    "forward) are missing, and the embedding is a lookup, not a matmul."),
    (3.39235901404, "that puts every matmul on the FLOPs side of the roofline: at TP 8 the k "
                    "and v projections are 128 columns wide and memory-bound "
                    "(hardware.matmul_s takes the larger side)."),
    (1.13255576225, "that is the forward alone: the backward takes twice the forward."),
])
checks.check_number("practice_tp_s", practice_tp_s, 0.693435980255, unit="s", rel=1e-4,
                    mistakes=[
    (150323855360.0, "that is the bytes each rank sends: divide by the link's bandwidth."),
    (0.346717990128, "that is forward's two all-reduces a layer: backward has two more."),
])
checks.check_number("practice_bubble_s", practice_bubble_s, 0.533837529709, unit="s",
                    rel=1e-4, mistakes=[
    (0.511387908376, "the sends between stages are missing (c each, on the network here: "
                     "TP x PP = 16 GPUs is two nodes)."),
    (0.424708410844, "that is (p-1)(F+B) with compute alone: a microbatch's TP collectives "
                     "are part of its forward and backward, and the sends add to the bubble."),
    (0.517000313709, "that is (p-1)(F'+B'+2c): the sends hold up 1F1B's steady state too; "
                     "play it with schedule.simulate(..., comm_time=c / F') to see how much."),
])
checks.check_number("practice_step_s", practice_step_s, 5.23808689317, unit="s", rel=1e-4,
                    mistakes=[
    (5.66279530401, "that adds the DP time hidden behind compute as well: only max(0, time - "
                    "window) of each DP collective adds to the step."),
    (4.62899374401, "the DP time that compute does not hide is missing: the reduce-scatter "
                    "takes 0.69 s, the last backward 0.28 s."),
    (4.70424936346, "the bubble is missing."),
])
print("practice Q1: right")

# %% [markdown]
# **Graded**: your plan is `G.q1 = (model, device, TP, PP, DP, global batch, sequence)`. Set
# `q1_compute_s`, `q1_tp_s`, `q1_bubble_s` and `q1_step_s` (seconds, one rank, one step).

# %% [answer q1]
### BEGIN SOLUTION
model, device, tp, pp, dp, batch, seq = G.q1
q1 = step_terms(MODELS[model], DEVICES[device], tp, pp, dp, batch, seq)
q1_compute_s, q1_tp_s, q1_bubble_s, q1_step_s = q1["compute"], q1["tp"], q1["bubble"], q1["step"]
### END SOLUTION

# %% [test q1_test points=3]
# Checks the types and rejects known wrong answers; the values are checked when graded.
_model, _device, _tp, _pp, _dp, _batch, _seq = G.q1
_a, _hw = MODELS[_model], DEVICES[_device]
_tokens = _batch // _dp * _seq          # one replica's tokens a step, through the rank's stage
_act = _seq * _a.hidden * 2
checks.check_number("q1_compute_s", q1_compute_s, unit="s", variant=G.key("q1"), mistakes=[
    (_tokens * transformer.flops_per_token(_a, _seq) / (_tp * _pp * _hw.peak_flops),
     "at the datasheet peak: a matmul runs at the achieved rate."),
    (_tokens * transformer.flops_per_token(_a, _seq, "6N") / (_tp * _pp * _hw.achieved_flops),
     "6N FLOPs a token leave out the attention scores."),
])
checks.check_number("q1_tp_s", q1_tp_s, unit="s", variant=G.key("q1"), mistakes=[
    (_batch // _dp * _a.layers / _pp * 4 * cost.ring_bytes("all_reduce", _act, _tp),
     "bytes, not seconds: divide by the link's bandwidth."),
])
checks.check_number("q1_bubble_s", q1_bubble_s, unit="s", variant=G.key("q1"), mistakes=[
    ((_pp - 1) / (_batch // _dp + _pp - 1), "that is the bubble's share of the span, not "
                                            "its seconds."),
])
checks.check_number("q1_step_s", q1_step_s, unit="s", variant=G.key("q1"), mistakes=[
    (q1_compute_s, "a step is more than its compute."),
    (q1_compute_s + q1_tp_s, "the step leaves the bubble out."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q1_compute_s", q1_compute_s)
submit("q1_tp_s", q1_tp_s)
submit("q1_bubble_s", q1_bubble_s)
submit("q1_step_s", q1_step_s)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. The faster of two plans (3 points)
#
# Two plans for the same job on the same GPUs: which trains faster? Use Q1's rules (and your
# `step_terms`).
#
# *Practice (not graded)*: Llama 3 8B on H100, a global batch of 128 sequences of 8192 tokens
# on 128 GPUs: plan A is TP 1 x PP 2 x DP 64, plan B TP 4 x PP 4 x DP 8. Set
# `practice_step_a_s` and `practice_step_b_s` (each plan's step) and `practice_faster`
# (`"A"` or `"B"`).

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_step_a_s = step_terms(MODELS["LLAMA3_8B"], DEVICES["H100"], 1, 2, 64, 128,
                               8192)["step"]
practice_step_b_s = step_terms(MODELS["LLAMA3_8B"], DEVICES["H100"], 4, 4, 8, 128,
                               8192)["step"]
practice_faster = "A" if practice_step_a_s < practice_step_b_s else "B"
### END SOLUTION

# %%
checks.check_number("practice_step_a_s", practice_step_a_s, 1.10388443006, unit="s",
                    rel=1e-4, mistakes=[
    (0.597132898069, "that is plan A's compute alone."),
    (1.40245087909, "that adds the DP time that compute hides: with TP 1 a rank holds half "
                    "the model, and its gradients' reduce-scatter outlasts the last backward "
                    "by far, but the part inside the window is hidden."),
])
checks.check_number("practice_step_b_s", practice_step_b_s, 0.945404695031, unit="s",
                    rel=1e-4, mistakes=[
    (0.597353348825, "that is plan B's compute alone."),
    (0.765295148993, "the bubble is missing."),
])
checks.check_choice("practice_faster", practice_faster, "B", ["A", "B"], mistakes={
    "A": "plan A computes as much per rank, has no TP collectives and a smaller bubble, but "
         "its DP reduce-scatter of 1 / 2 of the model is exposed."})
print("practice Q2: right")

# %% [markdown]
# **Graded**: your two plans are `G.q2 = (model, device, sequence, global batch, plan A, plan
# B)`, each plan a (TP, PP, DP) on the same GPUs. Set `q2_step_a_s` and `q2_step_b_s` (seconds)
# and `q2_faster` (`"A"` or `"B"`).

# %% [answer q2]
### BEGIN SOLUTION
model, device, seq, batch, plan_a, plan_b = G.q2
q2_step_a_s = step_terms(MODELS[model], DEVICES[device], *plan_a, batch, seq)["step"]
q2_step_b_s = step_terms(MODELS[model], DEVICES[device], *plan_b, batch, seq)["step"]
q2_faster = "A" if q2_step_a_s < q2_step_b_s else "B"
### END SOLUTION

# %% [test q2_test points=3]
# Checks the types and rejects known wrong answers; the values are checked when graded.
_model, _device, _seq, _batch, _plan_a, _plan_b = G.q2
_a, _hw = MODELS[_model], DEVICES[_device]
_gpus = _plan_a[0] * _plan_a[1] * _plan_a[2]            # (plan B's as many)
checks.check_number("q2_step_a_s", q2_step_a_s, unit="s", variant=G.key("q2"), mistakes=[
    (_seq * _batch * transformer.flops_per_token(_a, _seq) / (_gpus * _hw.achieved_flops),
     "plan A's matmuls alone: the other terms add to them."),
])
checks.check_number("q2_step_b_s", q2_step_b_s, unit="s", variant=G.key("q2"), mistakes=[
    (_seq * _batch * transformer.flops_per_token(_a, _seq) / (_gpus * _hw.achieved_flops),
     "plan B's matmuls alone: the other terms add to them."),
])
checks.check_choice("q2_faster", q2_faster, None, ["A", "B"])
if (str(q2_faster).upper() == "A") != (checks.as_number("q2_step_a_s", q2_step_a_s)
                                        < checks.as_number("q2_step_b_s", q2_step_b_s)):
    raise checks.CheckFailed("q2_faster disagrees with your own q2_step_a_s and q2_step_b_s: "
                             "the faster plan is the one with the shorter step.")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q2_step_a_s", q2_step_a_s)
submit("q2_step_b_s", q2_step_b_s)
submit("q2_faster", q2_faster)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. A run's MFU (2 points)
#
# Model FLOPs utilization: the FLOPs per second per GPU that the model needs for the tokens
# the run trains, over the device's **datasheet peak** (`hw.peak_flops`; an MFU of 1 is the
# peak). Count a token's training FLOPs as lecture 13 does (Llama 3 and PaLM count them so):
# 6 x the weights that multiply activations (`transformer.matmul_params(a)`: every layer's
# projections and MLP, and the head; the embedding is a lookup) plus the attention scores and
# their use, 12 x L x s x h (forward and backward, every score). Give MFU as a fraction.
#
# *Practice (not graded)*: torchtitan trains Llama 3 8B on 8 H100 at 5,762 tokens per second
# per GPU, sequences of 8192 tokens (its benchmark of December 2024). Set `practice_mfu`.

# %% [answer q3_practice]
### BEGIN SOLUTION
def mfu(a, hw, seq, tokens_per_s):
    """MFU of a run of ``tokens_per_s`` per GPU, attention scores counted."""
    per_token = 6 * transformer.matmul_params(a) + 12 * a.layers * seq * a.hidden
    return tokens_per_s * per_token / hw.peak_flops


practice_mfu = mfu(MODELS["LLAMA3_8B"], DEVICES["H100"], 8192, 5762)
### END SOLUTION

# %%
checks.check_number("practice_mfu", practice_mfu, 0.337405314449, rel=1e-4, mistakes=[
    (0.280710001887, "that counts 6N a token: the attention scores are missing (12 L s h a "
                     "token, a fifth of this model's FLOPs at 8192 tokens)."),
    (0.420004853354, "that divides by the achieved rate: MFU is over the datasheet peak."),
    (33.7405314449, "that is a percentage: give a fraction."),
])
print("practice Q3: right")

# %% [markdown]
# **Graded**: your run is `G.q3 = (model, device, sequence, tokens/s per GPU)`. Set `q3_mfu`.

# %% [answer q3]
### BEGIN SOLUTION
model, device, seq, tokens_per_s = G.q3
q3_mfu = mfu(MODELS[model], DEVICES[device], seq, tokens_per_s)
### END SOLUTION

# %% [test q3_test points=2]
# Checks the type and rejects known wrong answers; the value is checked when graded.
_model, _device, _seq, _tokens_per_s = G.q3
_a, _hw = MODELS[_model], DEVICES[_device]
checks.check_number("q3_mfu", q3_mfu, variant=G.key("q3"), mistakes=[
    (_tokens_per_s * transformer.flops_per_token(_a, _seq, "6N") / _hw.peak_flops,
     "6N a token leaves the attention scores out."),
    (_tokens_per_s * transformer.flops_per_token(_a, _seq) / _hw.achieved_flops,
     "MFU is over the datasheet peak, not the achieved rate."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q3_mfu", q3_mfu)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Explain a miss (2 points, graded by hand)
#
# Lecture 13's table predicts Megatron-LM's 1T-parameter GPT on 3,072 A100 (Narayanan et al.
# 2021, Table 1: TP 8, PP 64, interleaved, full recomputation) at **237** TFLOP/s per GPU
# (76.0 % MFU); the paper published **163** (52 %), a miss of +46 %. The predicted step's terms
# are 88 % compute, 5 % TP, 7 % bubble and sends, 0 % exposed DP, and the model would meet the
# published figure at an efficiency of **0.58** (the A100's `efficiency` is 271.2 / 312 = 0.87).
# (a) Which term explains the miss, and why that one and not another (the bubble with its
# unpublished v, stragglers, overlap)? (b) What would you measure on the real run to confirm
# it?

# %% [manual q4_explain points=2]
# ### BEGIN SOLUTION
# (a) The compute term's rate, the kernel efficiency. Compute is 88 % of the predicted step, so
# only an error in it can move the step by 46 %: the bubble is 7 % (v = 2 chunks a rank is
# assumed, the paper does not say it; even a bubble twice as long adds 7 %), the exposed DP time
# is 0 % and TP 5 %, and a straggler or a lost overlap would have to add 40 % of a step on
# every step. The model runs every matmul at the best matmul's rate (0.87 of peak: the largest
# achievable, measured at the best shape), but the whole step reaches 0.58 of it: the
# attention kernels, softmax, norms, dropout and other elementwise work the model leaves out
# (memory-bound, and run again by the full recomputation), matmul shapes below the best one's
# efficiency, launch overheads and the optimizer.
# (b) Profile one step of one rank (the PyTorch profiler, Nsight Systems): the time in each
# kernel, the matmuls' achieved FLOP/s at their shapes against the best shape's, the time
# outside matmuls; and compare the ranks' step times (a straggler) and the idle time around
# the pipeline's sends (the bubble).
#
# **Rubric** (2 points):
# * 1 point: names the compute term's efficiency (the whole step's achieved share of peak, far
#   below the best matmul's) and rules out the others by their shares (bubble 7 %, DP 0 %, TP
#   5 %: none can give +46 %).
# * 1 point: a measurement that would confirm it: a profile of a step's kernels (time outside
#   the matmuls, the matmuls' achieved rate at the run's shapes), with the per-rank times for
#   stragglers or the pipeline's idle time for the bubble.
# * 0 points: blames the bubble, the DP or TP time alone, or "the model" without a term.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a13_time_at_scale.ipynb`**, with its
# name unchanged (in `make lab` it is `workspace/assignments/a13_time_at_scale/
# a13_time_at_scale.ipynb`), the way your instructor asks. Outputs may be cleared: your
# instructor runs the whole notebook again, from the top, in a fresh kernel, to grade it, so
# first check that *Kernel > Restart Kernel and Run All Cells* meets no `NameError`. Learning on
# your own with the full repository? `make check A=a13_time_at_scale` grades your copy the same
# way.
