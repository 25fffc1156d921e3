# %% [markdown]
# # Assignment 4: Tensor parallelism
#
# Lecture 4 split one layer's matrices across ranks and checked every output and gradient
# against one device. Here you work out the shapes, the collectives and the bytes yourself, and
# write a row-parallel linear layer that the tests run on real gloo ranks.
#
# **Notation** (as in the lecture): `Y = X @ W` with `X` of shape `(b, s, h_in)`, `W` of shape
# `(h_in, h_out)`. `nn.Linear` stores `W` transposed: its `weight` is `(h_out, h_in)`. `t` is the
# tensor-parallel degree. "Column-parallel" splits `W` by columns (output features),
# "row-parallel" by rows (input features). Shards are equal and contiguous, in rank order.
#
# Answer in the cells marked `YOUR CODE HERE` (delete the `raise NotImplementedError()` line),
# then run the cell below each one.
#
# **How to practise.** Before each graded question that asks for shapes, collectives or numbers
# (Q1 to Q3, Q5), a *practice* question (not graded) asks the same reasoning about another layer
# or model. Run the cell after your practice answer: it checks every value fully, and when one
# is wrong it names the misconception your answer reveals. Then answer the graded question.
#
# **What the test cells check.** The test cell after a graded answer of Q1 to Q3 or Q5 checks
# the types and rejects the known wrong answers that follow from the question alone (an unsplit
# matrix, the weights instead of the activations, ...), naming the misconception without ever
# saying what the right value is. For Q4 the test cell runs your `row_parallel_linear` on real
# ranks on small visible cases and checks everything: every rank's result against one device,
# the collectives you called and the group they ran on. Passing a test cell while practising
# does not mean a graded answer is right: when the assignment is graded, the values of your
# answers are checked, and your function runs on other, hidden cases (other shapes, seeds and
# group sizes).
#
# **Your own numbers.** Q1, Q3 and Q5 use numbers drawn for you (the table the next cell
# shows, `G`): your classmates have other ones, so their answers are wrong for you. They come
# from your identity (your JupyterHub user, the name `make lab` asked for once, or, when your
# instructor grades, your student id, whatever this notebook says). Do not edit that cell.
#
# **Work the answers out yourself.** Some `course_utils` helpers compute a graded answer
# outright (here, for example, `tensor_parallel.column_shard`). An answer that uses one is
# flagged for your instructor: the questions ask for the reasoning those helpers do.

# %%
import math

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.assess import checks, variants

G = variants.givens("a4_tensor_parallel", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# *Practice (not graded)*: a smaller MLP with `h = 768` and `ffn = 3072` (`W1` of shape
# `(h, ffn)`, `W2` of shape `(ffn, h)`) is split Megatron-style over `t = 2` ranks: `W1`
# column-parallel, `W2` row-parallel. Give each answer as a tuple of ints:
# `practice_w1_local` and `practice_w2_local` (one rank's shards, in the `Y = X @ W` layout),
# `practice_partial_local` (what one rank computes with its shard of `W2` for `b = 3`,
# `s = 64`, before any communication) and `practice_dtensor_up_local` (the shape of
# `up.weight.to_local()` for `up = nn.Linear(768, 3072)` parallelized with `ColwiseParallel()`
# on a mesh of 2 ranks). Then run the check below it.

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_w1_local = (768, 3072 // 2)
practice_w2_local = (3072 // 2, 768)
practice_partial_local = (3, 64, 768)
practice_dtensor_up_local = (3072 // 2, 768)
### END SOLUTION

# %%
def _check_practice_shape(name, value, expected, known, hint):
    """Practice check: value is the tuple expected; a known wrong shape names its mistake."""
    assert type(value) in (tuple, list), (
        f"{name} should be a tuple of ints, got {type(value).__name__}")
    shape = tuple(int(dim) for dim in value)
    if shape in known:
        raise AssertionError(f"{name} = {shape}: {known[shape]}")
    assert shape == expected, f"{name} = {shape} is not right. {hint}"


_check_practice_shape("practice_w1_local", practice_w1_local, (768, 1536), {
    (384, 3072): "that divides W1's 768 rows (its input features) by t: a row split. W1 is "
                 "column-parallel, so the split runs across its 3072 columns.",
    (768, 3072): "that is the whole of W1; each of the 2 ranks keeps only its own shard.",
    (1536, 768): "that is the nn.Linear layout (out, in); the question asks for the Y = X @ W "
                 "layout, where W1 is (h, ffn)."},
    "W1 is (768, 3072); a column split divides its output features among the 2 ranks.")
_check_practice_shape("practice_w2_local", practice_w2_local, (1536, 768), {
    (3072, 384): "that divides W2's 768 columns (its output features) by t: a column split. "
                 "W2 is row-parallel, so the split runs across its 3072 rows.",
    (3072, 768): "that is the whole of W2; each of the 2 ranks keeps only its own shard.",
    (768, 1536): "that is the nn.Linear layout (out, in); in the Y = X @ W layout W2 is "
                 "(ffn, h)."},
    "W2 is (3072, 768); a row split divides its input features among the 2 ranks.")
_check_practice_shape("practice_partial_local", practice_partial_local, (3, 64, 768), {
    (3, 64, 384): "a row-parallel rank does not own a slice of the output features: "
                  "(b, s, 1536) @ (1536, 768) gives a partial sum over the full width 768.",
    (3, 64, 1536): "1536 is the width of the rank's input slice (ffn / t); multiplying by its "
                   "(1536, 768) shard of W2 gives 768 output features.",
    (3, 64, 3072): "the rank only holds ffn / t = 1536 of the hidden features, and what it "
                   "computes has W2's output width, 768."},
    "multiply the shapes: (b, s, ffn / t) @ (ffn / t, h).")
_check_practice_shape("practice_dtensor_up_local", practice_dtensor_up_local, (1536, 768), {
    (768, 1536): "that is W1's shard in the Y = X @ W layout; nn.Linear.weight is stored as "
                 "(out_features, in_features) = (3072, 768), and to_local() returns a shard "
                 "of that tensor.",
    (3072, 384): "that splits weight's dim 1 (the 768 input features), as RowwiseParallel "
                 "does; ColwiseParallel splits the output features, weight's dim 0.",
    (3072, 768): "that is the whole weight; to_local() returns only this rank's shard."},
    "start from weight's shape (3072, 768) and split the output features among the 2 ranks.")
print("practice Q1: all four shapes are right.")

# %% [markdown]
# ## Q1. Shard shapes (3 points)
#
# A transformer MLP has `W1` of shape `(h, ffn)` and `W2` of shape `(ffn, h)`, split
# Megatron-style over `t` ranks: `W1` column-parallel, `W2` row-parallel, where
# `(h, ffn, t, b, s) = G.q1` (yours are in the table at the top). Give each answer as a tuple
# of ints.
#
# * `w1_local`: the shape of one rank's shard of `W1` (in the `Y = X @ W` layout above).
# * `w2_local`: the shape of one rank's shard of `W2`.
# * `partial_local`: the shape of the tensor one rank computes with its shard of `W2` for an
#   input batch of `b` sequences of `s` tokens, before any communication.
# * `dtensor_up_local`: the same `W1` as `up = nn.Linear(h, ffn)`, parallelized with
#   DTensor's `ColwiseParallel()` on a mesh of `t` ranks. The shape of `up.weight.to_local()`.

# %% [answer q1]
### BEGIN SOLUTION
h, ffn, t, b, s = G.q1
w1_local = (h, ffn // t)
w2_local = (ffn // t, h)
partial_local = (b, s, h)
dtensor_up_local = (ffn // t, h)
### END SOLUTION

# %% [test q1_test points=3]
# Tuples of ints, and none of these wrong shapes (the right ones are checked when graded).
_h, _ffn, _t, _b, _s = G.q1
KNOWN_WRONG_SHAPES = {
    "w1_local": {
        (_h // _t, _ffn): "that divides W1's rows (its input features) by t, which is a row "
                          "split; W1 is column-parallel.",
        (_h, _ffn): f"that is the whole of W1; each of the {_t} ranks keeps only a shard."},
    "w2_local": {
        (_ffn, _h // _t): "that divides W2's columns (its output features) by t, which is a "
                          "column split; W2 is row-parallel.",
        (_ffn, _h): f"that is the whole of W2; each of the {_t} ranks keeps only a shard."},
    "partial_local": {
        (_b, _s, _h // _t): "you divided the output width by t, as if the rank owned a slice of "
                            "the output features; W2 is row-parallel: multiply out the shapes "
                            "of the rank's input slice and its shard of W2."},
    "dtensor_up_local": {
        (_ffn, _h // _t): "that splits nn.Linear.weight's dim 1 (its in_features), which is "
                          "what RowwiseParallel does, not ColwiseParallel.",
        (_ffn, _h): "that is the whole weight; to_local() returns only this rank's shard."},
}
for name, value, length in (("w1_local", w1_local, 2), ("w2_local", w2_local, 2),
                            ("partial_local", partial_local, 3),
                            ("dtensor_up_local", dtensor_up_local, 2)):
    assert type(value) in (tuple, list), f"{name} should be a tuple of ints, got {type(value).__name__}"
    assert len(value) == length, f"{name} should have {length} entries, got {len(value)}"
    for i, dim in enumerate(value):
        checks.check_number(f"{name}[{i}]", dim)
    shape = tuple(int(dim) for dim in value)
    if shape in KNOWN_WRONG_SHAPES[name]:
        raise AssertionError(f"{name} = {shape}: {KNOWN_WRONG_SHAPES[name][shape]}")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("w1_local[0]", w1_local[0])
submit("w1_local[1]", w1_local[1])
submit("w2_local[0]", w2_local[0])
submit("w2_local[1]", w2_local[1])
submit("partial_local[2]", partial_local[2])
submit("partial_local[0]", partial_local[0])
submit("partial_local[1]", partial_local[1])
submit("dtensor_up_local[0]", dtensor_up_local[0])
submit("dtensor_up_local[1]", dtensor_up_local[1])
### END HIDDEN TESTS
None

# %% [markdown]
# *Practice (not graded)*: other layouts, same reasoning. Answer each with one of
# `"all-reduce"`, `"all-gather"`, `"reduce-scatter"`, `"none"`, then count:
#
# * `practice_row_then_gelu`: a row-parallel linear followed by an elementwise GELU whose
#   result every rank needs in full.
# * `practice_col_then_residual`: a column-parallel linear followed by a residual add `X + Y`
#   that needs the true `Y` on every rank.
# * `practice_row_input_grad`: in the backward pass of a row-parallel linear whose input came
#   from a column-parallel linear (rank `r` held only its slice `X_r` of the input features),
#   passing each rank's `dL/dX_r` back to that column-parallel layer, which needs only the
#   gradient of its own slice.
# * `practice_seq_to_col`: each rank holds `s/t` of the sequence positions (all features) of an
#   activation, and the next layer is column-parallel, needing the whole sequence on every rank.
# * `practice_naive_fwd_collectives`: an int. A colleague makes both linears of an MLP
#   (linear, GELU, linear) column-parallel, and all-gathers wherever the next operation needs
#   every feature, including the MLP's output. How many collectives does its forward pass issue?

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_row_then_gelu = "all-reduce"
practice_col_then_residual = "all-gather"
practice_row_input_grad = "none"
practice_seq_to_col = "all-gather"
practice_naive_fwd_collectives = 2
### END SOLUTION

# %%
COLLECTIVE_CHOICES = ["all-reduce", "all-gather", "reduce-scatter", "none"]
checks.check_choice("practice_row_then_gelu", practice_row_then_gelu, "all-reduce",
                    COLLECTIVE_CHOICES, mistakes={
    "none": "GELU is not linear: GELU(a) + GELU(b) is not GELU(a + b), so it cannot run on the "
            "ranks' partial sums; they must be added first.",
    "all-gather": "Every row-parallel rank holds a partial sum with Y's full shape; "
                  "concatenating partial sums does not give Y.",
    "reduce-scatter": "After a reduce-scatter each rank holds only a slice of Y, but here every "
                      "rank needs the GELU of all of it."})
checks.check_choice("practice_col_then_residual", practice_col_then_residual, "all-gather",
                    COLLECTIVE_CHOICES, mistakes={
    "all-reduce": "Column-parallel ranks hold different output features, not partial sums: "
                  "adding them would mix unrelated features.",
    "none": "Each rank has only h_out/t of Y's features; the residual add needs all of them.",
    "reduce-scatter": "There is nothing to add: the ranks hold different features, and a "
                      "reduce-scatter would leave each of them with even less."})
checks.check_choice("practice_row_input_grad", practice_row_input_grad, "none",
                    COLLECTIVE_CHOICES, mistakes={
    "all-reduce": "X_r met only this rank's rows W_r, so dL/dX_r = dL/dY @ W_r^T is already "
                  "the complete gradient of those input features: nothing is missing from it.",
    "all-gather": "The column-parallel layer before needs only the gradient of its own slice; "
                  "gathering the other ranks' slices only adds traffic.",
    "reduce-scatter": "Each rank's dL/dX_r is already complete for its own features; there is "
                      "no partial sum to add."})
checks.check_choice("practice_seq_to_col", practice_seq_to_col, "all-gather",
                    COLLECTIVE_CHOICES, mistakes={
    "all-reduce": "The ranks hold different sequence positions, not partial sums: adding "
                  "them would mix tokens.",
    "none": "Each rank holds only s/t of the positions, but the column-parallel matmul needs "
            "the whole sequence on every rank.",
    "reduce-scatter": "There is nothing to add, and a reduce-scatter leaves each rank with "
                      "less than it had, not the whole sequence."})
checks.check_number("practice_naive_fwd_collectives", practice_naive_fwd_collectives, 2,
                    mistakes=[
    (0, "column-parallel outputs are split by features: the second linear needs all of the "
        "GELU's features, and the MLP's output is needed whole."),
    (1, "there are two places that need every feature: the input of the second "
        "column-parallel linear, and the MLP's output (split again by that linear)."),
    (3, "GELU is elementwise: it runs on each rank's own features and needs no collective.")])
print("practice Q2: all five answers are right.")

# %% [markdown]
# ## Q2. Which collective combines the results? (3 points)
#
# For each situation, answer one of `"all-reduce"`, `"all-gather"`, `"reduce-scatter"`, `"none"`
# (the collective that must run on the layer's output, or `"none"` if the next operation can
# use the local results as they are). Then count the all-reduces of the Megatron MLP.
#
# * `a_col_then_gelu`: a column-parallel linear followed by an elementwise GELU.
# * `b_row_then_residual`: a row-parallel linear followed by a residual add `X + Y` that needs
#   the true `Y` on every rank.
# * `c_col_then_layernorm`: a column-parallel linear followed by a LayerNorm over all its
#   output features, on every rank.
# * `d_col_input_grad`: in the backward pass of a column-parallel linear whose input `X` was the
#   same on every rank, combining the ranks' `dL/dX` into the true input gradient.
# * `e_row_then_seq_split`: a row-parallel linear followed by an operation on which each rank
#   handles only `s/t` of the sequence positions (sequence parallelism).
# * `mlp_fwd_all_reduces`, `mlp_bwd_all_reduces`: ints, the all-reduces one Megatron MLP
#   (column-parallel, GELU, row-parallel) issues in its forward and in its backward pass.

# %% [answer q2]
### BEGIN SOLUTION
a_col_then_gelu = "none"
b_row_then_residual = "all-reduce"
c_col_then_layernorm = "all-gather"
d_col_input_grad = "all-reduce"
e_row_then_seq_split = "reduce-scatter"
mlp_fwd_all_reduces = 1
mlp_bwd_all_reduces = 1
### END SOLUTION

# %% [test q2_test points=3]
# Allowed choices, and none of these wrong ones (the right ones are checked when graded).
CHOICES = ["all-reduce", "all-gather", "reduce-scatter", "none"]
KNOWN_WRONG_CHOICES = {
    "a_col_then_gelu": {"all-reduce": "Column-parallel ranks hold different output features, "
                                      "not partial sums of the same ones: adding them mixes "
                                      "features."},
    "b_row_then_residual": {"all-gather": "Every row-parallel rank holds a tensor of Y's full "
                                          "shape: there is nothing to concatenate."},
    "c_col_then_layernorm": {"all-reduce": "A column-parallel output is split by features; "
                                           "adding the ranks' slices mixes unrelated features."},
    "d_col_input_grad": {"all-gather": "Every rank's dL/dX already has the full shape of X: "
                                       "concatenating them gives the wrong shape."},
    "e_row_then_seq_split": {"all-gather": "Row-parallel ranks hold partial sums, not slices "
                                           "of Y: concatenating them does not give Y."},
}
for name, known in KNOWN_WRONG_CHOICES.items():
    value = globals()[name]
    assert type(value) is str and value.lower() in CHOICES, f"{name} should be one of {CHOICES}, got {value!r}"
    checks.check_choice(name, value, None, CHOICES, mistakes=known)
checks.check_number("mlp_fwd_all_reduces", mlp_fwd_all_reduces, mistakes=[
    (2, "you counted a collective after each of the two linears: does the column-parallel "
        "output need combining before an elementwise GELU and a row-parallel linear?")])
checks.check_number("mlp_bwd_all_reduces", mlp_bwd_all_reduces, mistakes=[
    (0, "the backward pass communicates too: look for a gradient that each rank computes "
        "from its own hidden features only.")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("a_col_then_gelu", a_col_then_gelu)
submit("b_row_then_residual", b_row_then_residual)
submit("c_col_then_layernorm", c_col_then_layernorm)
submit("d_col_input_grad", d_col_input_grad)
submit("e_row_then_seq_split", e_row_then_seq_split)
submit("mlp_fwd_all_reduces", mlp_fwd_all_reduces)
submit("mlp_bwd_all_reduces", mlp_bwd_all_reduces)
### END HIDDEN TESTS
None

# %% [markdown]
# *Practice (not graded)*: a smaller model, `L = 24` blocks with `h = 2048` and an MLP with
# `ffn = 3h = 6144`, runs in fp16 (2 bytes per element) with TP degree `t = 4` on micro-batches
# of `b = 8` sequences of `s = 1024` tokens. Attention and MLP are split Megatron-style; count
# only the tensor-parallel all-reduces; 1 GB = 10^9 bytes. Give `practice_mlp_forward_bytes`
# (bytes of the tensor all-reduced in one MLP's forward pass), `practice_step_payload_gb` (GB
# all-reduced by all blocks for one micro-batch, forward and backward),
# `practice_ring_gb_per_rank` (GB each rank **sends** for it with a ring all-reduce) and
# `practice_naive_over_megatron` (how many times larger the all-gathered GELU output of `W1`
# is than the tensor of Megatron's forward all-reduce).

# %% [answer q3_practice]
### BEGIN SOLUTION
p_b, p_s, p_h, p_ffn, p_t, p_L = 8, 1024, 2048, 6144, 4, 24
practice_mlp_forward_bytes = p_b * p_s * p_h * 2
practice_step_payload_gb = p_L * 4 * practice_mlp_forward_bytes / 1e9
practice_ring_gb_per_rank = 2 * (p_t - 1) / p_t * practice_step_payload_gb
practice_naive_over_megatron = p_ffn / p_h
### END SOLUTION

# %%
checks.check_number("practice_mlp_forward_bytes", practice_mlp_forward_bytes, 8 * 1024 * 2048 * 2,
                    unit="bytes", mistakes=[
    (2 * 2048 * 6144 * 2, "that is the size of the MLP's two weight matrices: TP all-reduces "
                          "activations (b, s, h), never the weights."),
    (2 * 2048 * 6144 * 2 / 4, "that is one rank's shard of the MLP's weights: TP all-reduces "
                              "activations, not parameters."),
    (8 * 1024 * 2048 * 4, "fp16 has 2 bytes per element, not 4."),
    (8 * 1024 * 2048 * 2 / 4, "every rank holds a partial sum of the FULL (b, s, h) output; "
                              "the all-reduced tensor is not divided by t."),
    (8 * 1024 * 6144 * 2, "the all-reduce follows the row-parallel W2, whose output is h = 2048 "
                          "wide; the ffn-wide tensor never leaves its rank."),
])
checks.check_number("practice_step_payload_gb", practice_step_payload_gb,
                    24 * 4 * 8 * 1024 * 2048 * 2 / 1e9, unit="GB", mistakes=[
    (24 * 2 * 8 * 1024 * 2048 * 2 / 1e9, "you counted 2 all-reduces per block; each block has "
                                         "4: attention and MLP, each with one in the forward "
                                         "pass (g) and one in the backward pass (f)."),
    (24 * 8 * 1024 * 2048 * 2 / 1e9, "you counted 1 all-reduce per block; each has 4 (attention "
                                     "and MLP, forward and backward)."),
    (24 * 4 * 8 * 1024 * 2048 * 2 / 2**30, "that is GiB (2**30 bytes); the question asks for "
                                           "GB (10**9 bytes)."),
    (24 * 4 * 8 * 1024 * 2048 * 4 / 1e9, "fp16 has 2 bytes per element, not 4."),
    (4 * 8 * 1024 * 2048 * 2 / 1e9, "that is one block; the model has 24."),
])
checks.check_number("practice_ring_gb_per_rank", practice_ring_gb_per_rank,
                    1.5 * 24 * 4 * 8 * 1024 * 2048 * 2 / 1e9, unit="GB", mistakes=[
    (24 * 4 * 8 * 1024 * 2048 * 2 / 1e9, "that is the payload itself; in a ring all-reduce each "
                                         "rank sends 2 (t-1)/t times the payload."),
    (0.75 * 24 * 4 * 8 * 1024 * 2048 * 2 / 1e9, "(t-1)/t of the payload is only the "
                                                "reduce-scatter phase; the all-gather phase "
                                                "sends as much again."),
    (2 * 24 * 4 * 8 * 1024 * 2048 * 2 / 1e9, "2x the payload forgets that a rank never sends its "
                                             "own chunk to itself: the factor is 2 (t-1)/t."),
    (1.5 * 24 * 4 * 8 * 1024 * 2048 * 2 / 2**30, "that is GiB (2**30 bytes); the question asks "
                                                 "for GB (10**9 bytes)."),
])
checks.check_number("practice_naive_over_megatron", practice_naive_over_megatron, 3.0, mistakes=[
    (1.0, "the gathered GELU output is ffn = 6144 features wide; Megatron's all-reduce moves "
          "an h = 2048 wide tensor."),
    (1 / 3, "upside down: the all-gathered (b, s, ffn) tensor is the larger one."),
])
print("practice Q3: all four numbers are right.")

# %% [markdown]
# ## Q3. Bytes on the wire (3 points)
#
# A model has `L` transformer blocks of hidden size `h`, runs in bf16 (2 bytes per element)
# with TP degree `t`, and processes a micro-batch of `b` sequences of `s` tokens, where
# `(L, h, t, b, s) = G.q3`. Each block is attention plus an MLP with `ffn = 4h`, both split Megatron-style. Count only
# the tensor-parallel all-reduces. 1 GB = 10^9 bytes.
#
# * `mlp_forward_bytes`: the size in bytes of the tensor all-reduced in one MLP's forward pass.
# * `step_payload_gb`: the total size in GB of all tensors all-reduced by all `L` blocks for one
#   micro-batch, forward and backward.
# * `ring_gb_per_rank`: with a ring all-reduce, how many GB each rank **sends** for the same
#   micro-batch.
# * `naive_over_megatron`: a colleague instead all-gathers the GELU output of the
#   column-parallel `W1` so that every rank can run all of `W2`. How many times larger is the
#   all-gather's result than the tensor Megatron's forward all-reduce moves?

# %% [answer q3]
### BEGIN SOLUTION
L, h, t, b, s = G.q3
mlp_forward_bytes = b * s * h * 2
step_payload_gb = L * 4 * mlp_forward_bytes / 1e9
ring_gb_per_rank = 2 * (t - 1) / t * step_payload_gb
naive_over_megatron = (b * s * 4 * h * 2) / mlp_forward_bytes
### END SOLUTION

# %% [test q3_test points=3]
# Plain numbers, and none of these wrong answers (the right values are checked when graded).
_L, _h, _t, _b, _s = G.q3
checks.check_number("mlp_forward_bytes", mlp_forward_bytes, unit="bytes", variant=G.key("q3"),
                    mistakes=[
    (8 * _h * _h * 2, "that is the size of the MLP's weights (W1 and W2 in bf16): TP "
                      "all-reduces activations, never parameters."),
    (8 * _h * _h * 2 / _t, "that is one rank's shard of the MLP's weights: TP all-reduces "
                           "activations, never parameters."),
])
checks.check_number("step_payload_gb", step_payload_gb, unit="GB", variant=G.key("q3"),
                    mistakes=[
    (_L * 12 * _h * _h * 2 / 1e9, "that is the size of all blocks' parameters (12 h^2 per "
                                  "block): TP all-reduces activations, not weights."),
    (_L * 8 * _h * _h * 2 / 1e9, "that is the size of all MLPs' weights: TP all-reduces "
                                 "activations, not weights."),
])
checks.check_number("ring_gb_per_rank", ring_gb_per_rank, unit="GB", variant=G.key("q3"),
                    mistakes=[
    (checks.as_number("step_payload_gb", step_payload_gb),
     "that equals your step_payload_gb: in a ring all-reduce a rank does not send each "
     "payload byte exactly once; count what it sends in each phase."),
])
checks.check_number("naive_over_megatron", naive_over_megatron, variant=G.key("q3"), mistakes=[
    (1.0, "the two tensors are not the same size: compare the width of the GELU output with "
          "the width of the tensor Megatron all-reduces."),
    *([(float(_t), "the ratio does not depend on t: both are whole activations that every "
                   "rank ends up holding; compare their widths.")] if _t != 4 else []),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("mlp_forward_bytes", mlp_forward_bytes)
submit("step_payload_gb", step_payload_gb)
submit("ring_gb_per_rank", ring_gb_per_rank)
submit("naive_over_megatron", naive_over_megatron)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. A row-parallel linear on real ranks (4 points)
#
# Write `row_parallel_linear(x_local, w_local, bias, tp_group)`, run by every rank of one
# tensor-parallel group:
#
# * `x_local`: shape `(b, s, h_in / t)`, this rank's slice of the input features;
# * `w_local`: shape `(h_in / t, h_out)`, this rank's rows of `W`;
# * `bias`: shape `(h_out,)`, the same on every rank;
# * `tp_group`: the process group of this layer's ranks. It may be smaller than the world:
#   the tests also run two independent TP groups side by side (ranks `{0, 1}` and `{2, 3}`, each
#   with its own input), so pass it to every collective you call.
#
# Return the full `Y = X @ W + bias`, shape `(b, s, h_out)`, on every rank of the group. Use
# `torch.distributed` (imported as `dist`). The test cell runs your function on two small
# visible cases (one TP group of 2 ranks, then two TP groups of 2 side by side), compares every
# rank's result with `X @ W + bias` computed on one device, and checks which collectives you
# called and on which group; grading runs it on other, hidden cases.

# %% [answer q4]
def row_parallel_linear(x_local, w_local, bias, tp_group=None):
    """Row-parallel Y = X @ W + bias: (b, s, h_in/t) x (h_in/t, h_out) -> (b, s, h_out)."""
    ### BEGIN SOLUTION
    partial = x_local @ w_local               # (b, s, h_out): this rank's share of the sum
    dist.all_reduce(partial, group=tp_group)  # sum over the tp group
    return partial + bias                     # bias once, after the sum
    ### END SOLUTION

# %% [test q4_test points=4]
from course_utils.assess import a4_tensor_parallel as tp_harness


def _visible_case(label, tp_size, xs, w, bias):
    """Run row_parallel_linear on real ranks; check every rank against one device."""
    runs = tp_harness.run_row_parallel(row_parallel_linear, tp_size, xs, w, bias, timeout_s=50)
    called = [call for run in runs for call, _ in run["calls"]]
    group_sizes = sorted({size for run in runs for _, size in run["calls"]})
    assert called, (f"{label}: no collective was called. Rank r only sees its h_in/t input "
                    "features, so X_r @ W_r is one term of a sum over the group's ranks.")
    gathers = sorted({call for call in called if call.startswith("all_gather")})
    assert not gathers, (f"{label}: you called {gathers}. Row-parallel ranks each hold a "
                         "tensor of the full output shape (b, s, h_out) that must be summed "
                         "with the others, not concatenated.")
    assert group_sizes == [tp_size], (
        f"{label}: your collectives ran on groups of {group_sizes} ranks, but this layer's "
        f"tp_group has {tp_size}: pass group=tp_group to every collective.")
    for rank, run in enumerate(runs):
        y, x = run["y"], xs[rank // tp_size]
        expected = x @ w + bias                                  # one device: (b, s, h_out)
        assert isinstance(y, torch.Tensor), (
            f"{label}, rank {rank}: returned {type(y).__name__}, not a tensor")
        assert tuple(y.shape) == tuple(expected.shape), (
            f"{label}, rank {rank}: returned shape {tuple(y.shape)}; expected (b, s, h_out) = "
            f"{tuple(expected.shape)}")
        rows = slice(*tp_harness.shard_range(x.shape[-1], tp_size, rank % tp_size))
        if torch.allclose(y, x @ w + tp_size * bias, atol=1e-5):
            raise AssertionError(f"{label}, rank {rank}: every rank added the bias before the "
                                 f"sum, so Y holds it {tp_size} times. Add it once, after.")
        if torch.allclose(y, x[..., rows] @ w[rows] + bias, atol=1e-5):
            raise AssertionError(f"{label}, rank {rank}: Y is still this rank's own partial "
                                 "sum: the all-reduced result was not used (dist.all_reduce "
                                 "works in place on the tensor you pass it).")
        torch.testing.assert_close(y, expected, msg=lambda m, r=rank: (
            f"{label}, rank {r}: the result does not match X @ W + bias computed on one "
            f"device. {m}"))


gen = torch.Generator().manual_seed(1)
_visible_case("one tp group of 2", 2, [torch.randn(2, 3, 8, generator=gen)],
              torch.randn(8, 4, generator=gen), torch.randn(4, generator=gen))
gen = torch.Generator().manual_seed(2)
_visible_case("two tp groups of 2", 2, [torch.randn(1, 4, 6, generator=gen),
                                        torch.randn(1, 4, 6, generator=gen)],
              torch.randn(6, 3, generator=gen), torch.randn(3, generator=gen))
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit


def _submit_runs(label, tp_size, xs, w, bias):
    """Run the student's layer on real ranks; hand each rank's result and collectives over."""
    runs = tp_harness.run_row_parallel(row_parallel_linear, tp_size, xs, w, bias, timeout_s=50)
    submit(f"{label}: calls per rank", [run["calls"] for run in runs])
    submit(f"{label}: y per rank", [run["y"] for run in runs])


for _number, (_tp, _groups, _seed, _b, _s, _h_in, _h_out) in enumerate(
        hidden_cases("q4_test"), 1):  # drawn per submission: one X per TP group, then W, bias
    gen = torch.Generator().manual_seed(_seed)
    xs = [torch.randn(_b, _s, _h_in, generator=gen) for _ in range(_groups)]
    w, bias = torch.randn(_h_in, _h_out, generator=gen), torch.randn(_h_out, generator=gen)
    _submit_runs(f"hidden case {_number}", _tp, xs, w, bias)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. What TP does not split (2 points)
#
# Between its tensor-parallel regions a transformer block runs LayerNorm, dropout and the
# residual add on the whole `(b, s, h)` activation. Sizes in MB (10^6 bytes).
#
# *Practice (not graded)*: `b = 2`, `s = 1024`, `h = 4096`, bf16, TP degree `t = 4`.
#
# * `practice_ln_mb`: the MB of the first LayerNorm's input that each TP rank holds, with TP
#   alone (no sequence parallelism).
# * `practice_ln_mb_sp`: the same with Megatron sequence parallelism on the TP group.
# * `practice_sp_bytes_factor`: the bytes each rank sends per block with sequence parallelism
#   (reduce-scatters and all-gathers) divided by the bytes it sends with TP alone (all-reduces),
#   with ring collectives.

# %% [answer q5_practice]
### BEGIN SOLUTION
practice_ln_mb = 2 * 1024 * 4096 * 2 / 1e6
practice_ln_mb_sp = practice_ln_mb / 4
practice_sp_bytes_factor = 1.0
### END SOLUTION

# %%
checks.check_number("practice_ln_mb", practice_ln_mb, 2 * 1024 * 4096 * 2 / 1e6, unit="MB",
                    mistakes=[
    (2 * 1024 * 4096 * 2 / 4 / 1e6, "TP splits the matmuls' weights, not the activations "
                                    "between them: after g's all-reduce every rank holds the "
                                    "whole (b, s, h) tensor that LayerNorm reads"),
    (2 * 1024 * 4096 * 4 / 1e6, "bf16 has 2 bytes per element"),
    (2 * 1024 * 4096 * 2 / 2**20, "that is MiB; MB here is 10^6 bytes")])
checks.check_number("practice_ln_mb_sp", practice_ln_mb_sp, 2 * 1024 * 4096 * 2 / 4 / 1e6,
                    unit="MB", mistakes=[
    (2 * 1024 * 4096 * 2 / 1e6, "sequence parallelism splits exactly these activations: each "
                                "rank keeps s/t of the tokens between the TP regions")])
checks.check_number("practice_sp_bytes_factor", practice_sp_bytes_factor, 1.0, mistakes=[
    (2.0, "a ring all-reduce is itself a reduce-scatter followed by an all-gather: SP sends "
          "the same bytes, at other points of the block"),
    (0.5, "SP moves the same bytes as TP's all-reduce, only split into two collectives")])
print("practice Q5: all right")

# %% [markdown]
# Now the graded question: `(b, s, h, t) = G.q5` (batch, tokens, hidden size, TP degree), bf16.
#
# * `ln_mb`: the MB of the first LayerNorm's input that each TP rank holds, TP alone.
# * `ln_mb_sp`: the same with sequence parallelism on the TP group.
# * `sp_bytes_factor`: bytes sent per block with sequence parallelism over bytes sent with TP
#   alone (ring collectives).

# %% [answer q5]
### BEGIN SOLUTION
b, s, h, t = G.q5
ln_mb = b * s * h * 2 / 1e6
ln_mb_sp = ln_mb / t
sp_bytes_factor = 1.0
### END SOLUTION

# %% [test q5_test points=2]
# Checks the types and rejects known wrong answers; the values are checked when graded.
for _name in ("ln_mb", "ln_mb_sp", "sp_bytes_factor"):
    checks.check_number(_name, globals()[_name])
_b, _s, _h, _t = G.q5
checks.check_number("ln_mb", ln_mb, unit="MB", variant=G.key("q5"), mistakes=[
    (_b * _s * _h * 2 / _t / 1e6, "TP splits the weights of its matmuls, not the activations "
                                  "between them: LayerNorm reads the whole (b, s, h) tensor "
                                  "on every rank")])
checks.check_number("sp_bytes_factor", sp_bytes_factor, mistakes=[
    (2.0, "a ring all-reduce is itself a reduce-scatter followed by an all-gather")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("ln_mb", ln_mb)
submit("ln_mb_sp", ln_mb_sp)
submit("sp_bytes_factor", sp_bytes_factor)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. Where does TP go? (2 points, graded by hand)
#
# A cluster has nodes of 8 accelerators joined by fast links inside each node and a slower
# network between nodes. You are choosing between TP = 8 inside each node and TP = 16 across
# two nodes. In a few sentences: why is TP usually kept on the fastest links (use what you
# counted in Q3: what is communicated, how often, and can it be hidden behind computation)?
# And what would you measure before deciding, rather than trusting a bytes-over-bandwidth
# estimate?

# %% [manual q6_explain points=2]
# ### BEGIN SOLUTION
# TP all-reduces a full activation (b, s, h) four times per block per micro-batch (Q3: tens
# of GB sent per rank per micro-batch for such a model), and each all-reduce blocks the next
# matmul, so it sits on the critical path and can hardly be overlapped. Its size does not shrink
# as TP grows, while each rank's matmuls do, so the ratio of communication to compute rises
# with t and with slower links: on a link several times slower, the all-reduces can take longer
# than the matmuls. Data parallelism (gradients once per step, overlappable) and pipeline
# parallelism (one activation per stage boundary) tolerate the slower network better.
# Before deciding I would run both layouts on the real cluster and measure step time and tokens
# per second, the time spent waiting in collectives (profiler), the achieved all-reduce
# bandwidth and latency at the real message sizes, and peak memory, since latency, topology,
# contention, overlap and the efficiency of the smaller matmuls are not in the estimate.
#
# **Rubric** (2 points):
# * 1 point: says that TP all-reduces a full activation tensor of shape (b, s, h), four times
#   per block per micro-batch (two forward, two backward; Q3: about 23 GB sent per rank per
#   micro-batch), and that the next matmul needs the result, so it sits on the critical path
#   and can hardly be hidden behind computation; over the slower network between nodes the
#   all-reduces then take a large share of, or longer than, the matmuls.
# * 1 point: names at least two concrete things to measure with both layouts on the real
#   cluster, such as step time or tokens per second, the time spent in collectives (profiler),
#   the achieved all-reduce bandwidth and latency at the real message sizes, or peak memory;
#   and says why the estimate can be wrong (latency, topology, contention, overlap, smaller
#   matmuls running less efficiently).
# * 0 points: only "the network between nodes is slower", with nothing about what TP sends,
#   how often or why it cannot be overlapped (or DP's once-per-step gradient all-reduce
#   described instead), and nothing to measure beyond "benchmark it".
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a4_tensor_parallel.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a4_tensor_parallel/a4_tensor_parallel.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a4_tensor_parallel` grades your copy the same way.
