"""Judge of a10_capstone: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

Both questions are code run on real ranks. The judge recomputes one process's run of each
hidden case here (``course_utils.capstone.diagnose``: ``train3d_check.reference_train`` cut by
``stage_model.shard_state``) and compares every rank's losses, gradients, weights and the
communication it issued; the known mistakes are recomputed from the same seeds. Nothing the
kernel computed is taken as an expected value.
"""

from course_utils import capstone

HELPERS_NOT_ALLOWED = {
    "q1": ["train3d.train_step", "train3d.train_worker", "train3d.run", "train3d_torch.run",
           "train3d_check.reference_train", "capstone.run_step", "overlap.BucketAllReduce",
           "zero1.ShardedAdam", "tiny_lm.build", "stage_model.build_stage",
           "stage_model.shard_state", "pipeline_parallel.pipeline_worker"],
    "q2": ["tensor_parallel.copy_to_tp", "tensor_parallel.CopyToTensorParallel",
           "tensor_parallel.ColumnParallelLinear", "stage_model.TensorParallelBlock"],
}


def _draw_q1(rng):
    """train_step's hidden runs, drawn per submission: (dp, pp, tp, seed, m) on 4 ranks, one
    axis of size 1 each (the other two tested on their own); m = 4 where dp = 2, so that a
    gradient D times and one m times too large are told apart."""
    seeds = rng.sample(range(10_000), 3)
    return [[1, 2, 2, seeds[0], rng.choice([2, 4])], [2, 1, 2, seeds[1], 4],
            [2, 2, 1, seeds[2], 4]]


def _draw_q2(rng):
    """f's hidden run: (seed, dp, tp): the probe with that seed (two TP groups side by side),
    then training on TP 4 (f does not depend on DP, which Q1 tests)."""
    return [[rng.randrange(10_000), 1, 4]]


HIDDEN_CASES = {"q1_test": _draw_q1, "q2_test": _draw_q2}


def _results(value):
    """A submitted run as the list of per-rank dicts ``capstone.diagnose`` reads."""
    assert isinstance(value, list) and all(isinstance(r, dict) for r in value), (
        "the run did not hand over one result per rank")
    return value


def q1_test(got, ref):
    for number, (dp, pp, tp, seed, m) in enumerate(got.cases, 1):
        label = f"hidden case {number} (DP {dp} x PP {pp} x TP {tp})"
        capstone.diagnose(capstone.plan(dp, pp, tp, seed=seed, m=m),
                          _results(got[f"hidden case {number}"]), label=label)


def q2_test(got, ref):
    for number, (seed, dp, tp) in enumerate(got.cases, 1):
        label = f"hidden case {number}"
        capstone.diagnose_f(_results(got[f"{label} probe"]), seed, label=f"{label}, probe")
        capstone.diagnose(capstone.plan(dp, 1, tp, seed=seed, m=2),
                          _results(got[f"{label} run"]), label=f"{label}, DP {dp} x TP {tp}")
