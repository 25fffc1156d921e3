"""Judge of a4_tensor_parallel: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.
"""

import torch

from course_utils.assess import checks

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q1": ["tensor_parallel.column_shard", "tensor_parallel.row_shard",
           "tensor_parallel.shard_range", "tensor_parallel.layer_plan"],
    "q2": ["tensor_parallel.layer_plan"],
    "q3": ["tensor_parallel.tp_comm_bytes", "tensor_parallel.ring_all_reduce_bytes_per_rank",
           "tensor_parallel.mlp_comm_to_compute", "collectives.cost.ring_bytes_per_rank",
           "tensor_parallel.layer_plan"],
    "q4": ["tensor_parallel.reduce_from_tp", "tensor_parallel.reference"],
}

CHOICES = ["all-reduce", "all-gather", "reduce-scatter", "none"]


def q1_test(got, ref):
    h, ffn, t, b, s = got.givens.q1
    checks.check_number("w1_local[0]", got["w1_local[0]"], h, mistakes=[
        (h // t, f"you split the rows of W1 (its input features); a column split keeps all "
                 f"h = {h} rows")])
    checks.check_number("w1_local[1]", got["w1_local[1]"], ffn // t, mistakes=[
        (ffn, f"each rank holds only ffn / t = {ffn // t} of W1's columns"),
        (h, f"a column split divides the ffn = {ffn} output features by t = {t}")])
    checks.check_number("w2_local[0]", got["w2_local[0]"], ffn // t, mistakes=[
        (ffn, f"a row split divides W2's ffn = {ffn} input rows by t = {t}"),
        (h, f"W2 is (ffn, h): its rows are the ffn = {ffn} hidden features")])
    checks.check_number("w2_local[1]", got["w2_local[1]"], h, mistakes=[
        (h // t, f"you split W2's columns; a row split keeps every one of the h = {h} output "
                 "features")])
    checks.check_number("partial_local[2]", got["partial_local[2]"], h, mistakes=[
        (h // t, "a row-parallel rank computes a partial SUM of the full output width h, not a "
                 "slice"),
        (ffn // t, f"the partial sum has the output width h = {h}, not the rank's input "
                   "width")])
    checks.check_number("partial_local[0]", got["partial_local[0]"], b)
    checks.check_number("partial_local[1]", got["partial_local[1]"], s)
    checks.check_number("dtensor_up_local[0]", got["dtensor_up_local[0]"], ffn // t, mistakes=[
        (h, f"nn.Linear stores weight as (out_features, in_features) = ({ffn}, {h}); "
            "ColwiseParallel shards that dim 0 (Shard(0)), so the local shard is W1's shard "
            "transposed"),
        (ffn, f"ColwiseParallel shards weight's dim 0 (the {ffn} output features), not dim 1")])
    checks.check_number("dtensor_up_local[1]", got["dtensor_up_local[1]"], h, mistakes=[
        (h // t, "ColwiseParallel keeps every input feature: it splits nn.Linear.weight's dim "
                 "0, not dim 1"),
        (ffn // t, f"nn.Linear.weight is (out, in): the local shard is ({ffn}/{t}, {h}), W1's "
                   "shard transposed")])


SUMS_FEATURES = ("column-parallel outputs are different features, not partial sums: adding them "
                 "mixes unrelated features")


def q2_test(got, ref):
    checks.check_choice("a_col_then_gelu", got["a_col_then_gelu"], "none", CHOICES, mistakes={
        "all-gather": "GELU is elementwise: each rank applies it to its own features; gathering "
                      "first only adds traffic",
        "all-reduce": SUMS_FEATURES})
    checks.check_choice("b_row_then_residual", got["b_row_then_residual"], "all-reduce", CHOICES,
                        mistakes={
        "all-gather": "an all-gather where an all-reduce is needed: row-parallel ranks hold "
                      "partial sums of the full output shape, which must be added, not "
                      "concatenated",
        "none": "each rank holds only a partial sum; the residual needs their sum",
        "reduce-scatter": "a reduce-scatter leaves each rank only a slice, but every rank needs "
                          "all of Y"})
    checks.check_choice("c_col_then_layernorm", got["c_col_then_layernorm"], "all-gather",
                        CHOICES, mistakes={
        "all-reduce": "an all-reduce where an all-gather is needed: " + SUMS_FEATURES,
        "none": "LayerNorm's mean and variance run over every feature; each rank has only "
                "h_out/t"})
    checks.check_choice("d_col_input_grad", got["d_col_input_grad"], "all-reduce", CHOICES,
                        mistakes={
        "all-gather": "each rank's dL/dX already has X's full shape but counts only its own "
                      "output features: the contributions are summed (f's backward), not "
                      "concatenated",
        "none": "each rank's dL/dX counts only its own output features; the true gradient is "
                "their sum"})
    checks.check_choice("e_row_then_seq_split", got["e_row_then_seq_split"], "reduce-scatter",
                        CHOICES, mistakes={
        "all-reduce": "the partial sums must be added, but each rank then needs only its s/t "
                      "positions: a reduce-scatter sends half as much",
        "all-gather": "row-parallel outputs are partial sums: they are added"})
    checks.check_number("mlp_fwd_all_reduces", got["mlp_fwd_all_reduces"], 1, mistakes=[
        (2, "the column-parallel output goes straight into the elementwise GELU and the "
            "row-parallel matmul: only the row-parallel output is all-reduced"),
        (0, "the row-parallel partial sums must be added: g all-reduces them")])
    checks.check_number("mlp_bwd_all_reduces", got["mlp_bwd_all_reduces"], 1, mistakes=[
        (0, "f's backward all-reduces dL/dX: each rank computed it from its own hidden features "
            "only"),
        (2, "g's backward is the identity; only f's backward communicates")])


def q3_test(got, ref):
    n_blocks, h, t, b, s = got.givens.q3
    fwd = b * s * h * 2                                   # one (b, s, h) bf16 activation
    weights = 8 * h * h * 2                               # W1 and W2 (ffn = 4h) in bf16
    checks.check_number("mlp_forward_bytes", got["mlp_forward_bytes"], fwd, unit="bytes",
                        mistakes=[
        (weights, "that is the MLP's weights (8 h^2 x 2 bytes): TP all-reduces activations "
                  "(b, s, h), not parameters"),
        (weights / t, "that is one rank's share of the weights: TP all-reduces activations, not "
                      "parameters"),
        (fwd * 2, "bf16 is 2 bytes per element, not 4"),
        (fwd / t, "the all-reduced tensor is the full (b, s, h) activation on every rank, "
                  "not 1/t of it"),
        (fwd * 4, "the all-reduce follows the row-parallel W2, whose output is h wide, not "
                  "ffn = 4h")])
    payload = n_blocks * 4 * fwd / 1e9
    checks.check_number("step_payload_gb", got["step_payload_gb"], payload, unit="GB",
                        mistakes=[
        (payload / 2, "a block issues 4 all-reduces per micro-batch: attention and MLP, "
                      "forward (g) and backward (f)"),
        (payload * 1e9 / 2**30, "that is GiB (2^30 bytes); the question asks for GB (10^9 "
                                "bytes)"),
        (n_blocks * 12 * h * h * 2 / 1e9, "that counts the blocks' parameters (12 h^2 per "
                                          "block): TP moves activations"),
        (payload * 2, "bf16 is 2 bytes per element, not 4"),
        (payload / 4, "a block has 4 all-reduces (2 forward, 2 backward), not 1")])
    ring = 2 * (t - 1) / t * payload
    checks.check_number("ring_gb_per_rank", got["ring_gb_per_rank"], ring, unit="GB",
                        mistakes=[
        (payload, "that is the payload; a ring all-reduce makes each rank send 2 (t-1)/t "
                  "times it"),
        (ring / 2, "(t-1)/t is only the reduce-scatter half of a ring all-reduce; the "
                   "all-gather half sends as much again"),
        (ring * 1e9 / 2**30, "that is GiB (2^30 bytes); the question asks for GB (10^9 "
                             "bytes)")])
    checks.check_number("naive_over_megatron", got["naive_over_megatron"], 4.0, mistakes=[
        (1.0, "the gathered GELU output is ffn = 4h wide; Megatron's all-reduce is h wide"),
        (0.25, "upside down: the all-gather result (b, s, 4h) is the larger one")])


def _draw_q4(rng):
    """row_parallel_linear's hidden runs, drawn per submission: (tp_size, TP groups, seed, b, s,
    h_in, h_out): two runs on one group of 2, one on a group of 4, one on two groups of 2 (each
    group its own input: a collective over the wrong group shows)."""
    seeds = rng.sample(range(10_000), 4)
    shape = lambda tp: [rng.randint(1, 3), rng.randint(2, 5), tp * rng.randint(2, 6),
                        rng.randint(3, 7)]
    return [[2, 1, seeds[0], *shape(2)], [2, 1, seeds[1], *shape(2)],
            [4, 1, seeds[2], *shape(4)], [2, 2, seeds[3], *shape(2)]]


HIDDEN_CASES = {"q4_test": _draw_q4}


def q4_inputs(tp_size, groups, seed, b, s, h_in, h_out):
    """The inputs of one hidden run (the hidden test builds them the same way): one X per TP
    group, then W and the bias."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(b, s, h_in, generator=gen) for _ in range(groups)]
    w, bias = torch.randn(h_in, h_out, generator=gen), torch.randn(h_out, generator=gen)
    return xs, w, bias


def _feedback(calls_per_rank, ys, xs, w, bias, tp_size):
    """Compare each rank with one device; name the likely mistake."""
    world_size = len(xs) * tp_size
    assert isinstance(calls_per_rank, list) and len(calls_per_rank) == world_size, (
        f"expected the collectives of {world_size} ranks")
    assert isinstance(ys, list) and len(ys) == world_size, (
        f"expected the results of {world_size} ranks")
    calls = [name for run in calls_per_rank for name, _ in run]
    sizes = {size for run in calls_per_rank for _, size in run}
    if not calls:
        raise AssertionError("no collective was called: each rank holds only a partial sum of "
                             "its input features; an all-reduce must add them")
    if any(str(name).startswith("all_gather") for name in calls):
        raise AssertionError("you called an all-gather where an all-reduce is needed: "
                             "row-parallel ranks hold partial sums of the full output, which "
                             "must be added, not concatenated")
    if sizes != {tp_size}:
        raise AssertionError(f"your collective ran on a group of {sorted(sizes)} ranks, but the "
                             f"layer's tp_group has {tp_size}: pass group=tp_group")
    for global_rank, y in enumerate(ys):
        dp_rank = global_rank // tp_size
        expected = xs[dp_rank] @ w + bias             # one device: (b, s, h_out)
        assert isinstance(y, torch.Tensor) and y.shape == expected.shape, (
            f"rank {global_rank}: expected a tensor of shape {tuple(expected.shape)}")
        if torch.allclose(y.double(), (xs[dp_rank] @ w + tp_size * bias).double(), atol=1e-5):
            raise AssertionError("the bias was added on every rank before the sum, so it is "
                                 f"counted {tp_size} times: add it once, after the all-reduce")
        torch.testing.assert_close(y, expected, msg=lambda m, r=global_rank: (
            f"rank {r}: Y differs from X @ W + bias on one device. {m}"))


def q4_test(got, ref):
    for number, case in enumerate(got.cases, 1):
        xs, w, bias = q4_inputs(*case)
        label = f"hidden case {number}"
        try:
            _feedback(got[f"{label}: calls per rank"], got[f"{label}: y per rank"], xs, w, bias,
                      case[0])
        except AssertionError as err:
            raise AssertionError(f"{label}: {err}") from None


def q5_test(got, ref):
    b, s, h, t = got.givens.q5
    full = b * s * h * 2 / 1e6
    checks.check_number("ln_mb", got["ln_mb"], full, unit="MB", mistakes=[
        (full / t, "tensor parallelism without sequence parallelism replicates the LayerNorm "
                   "and dropout activations: after g's all-reduce every rank holds the whole "
                   "(b, s, h) tensor, so nothing outside the matmuls is divided by t"),
        (full * 2, "bf16 has 2 bytes per element"),
        (full * 1e6 / 2**20, "that is MiB; MB here is 10^6 bytes"),
        (full * 1e6, "that is bytes; give MB")])
    checks.check_number("ln_mb_sp", got["ln_mb_sp"], full / t, unit="MB", mistakes=[
        (full, "sequence parallelism splits exactly these activations along the sequence: "
               "each rank keeps s/t tokens between the TP regions"),
        (full / t**2, f"only the sequence is split, over the t = {t} ranks of the TP group")])
    checks.check_number("sp_bytes_factor", got["sp_bytes_factor"], 1.0, mistakes=[
        (2.0, "a ring all-reduce is a reduce-scatter followed by an all-gather: sequence "
              "parallelism sends the same bytes, split into its two halves"),
        (0.5, "the reduce-scatter and the all-gather together move what the all-reduce moved"),
        *([(float(t), "the factor does not depend on t")] if t not in (1, 2) else [])])
