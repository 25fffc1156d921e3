"""Judge of a12_checkpointing: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

Q1 and Q2 are judged on the student's own numbers (``got.givens``). Q3's save and resume run on
real ranks in the student's kernel, on a job drawn per submission (``HIDDEN_CASES``: 3
ranks, a seed, the data size, a save point in the middle of the second epoch); here the whole
job runs again in one process, rank by rank (``course_utils.assess.a12_checkpointing.diagnose``:
``resume_job.reference_run``), and the state the new job loaded and how it ended are compared
with it. Nothing the kernel computed is taken as an expected value.
"""

import math

from course_utils.assess import a12_checkpointing as resume_check
from course_utils.assess.checks import check_choice, check_number

HELPERS_NOT_ALLOWED = {
    "q2": ["checkpoint.interval.young_interval", "checkpoint.interval.waste",
           "checkpoint.interval.daly_interval"],
    "q3": ["checkpoint.save", "checkpoint.load", "checkpoint.state_to_save",
           "checkpoint.resume_demo.omission_worker", "checkpoint.resume_demo.resume_worker",
           "checkpoint.trainer3d.state_of"],
}

# The ranks build FSDP2 models and AdamW over DTensors, which import torch._dynamo first.
LAUNCH_PRELOAD = "full"


def _draw_q3(rng):
    """Q3's hidden job: (ranks, seed, samples, save_at) of an 8-step run of 2 rows per rank on
    3 ranks (the fewest the notebook does not show: its practice job has 2; every named mistake
    shows on 3, tests/test_reference_answers.py), saved in the middle of the second epoch (its
    epoch and its position both matter): 3, 4 or 5 steps an epoch."""
    ranks, samples = 3, rng.choice([18, 24, 30])
    per_epoch = samples // ranks // 2
    save_at = rng.choice(range(per_epoch + 1, min(2 * per_epoch, 8)))
    return [[ranks, rng.randrange(10_000), samples, save_at]]


HIDDEN_CASES = {"q3_test": _draw_q3}


def q1_test(got, ref):
    n, d, b = got.givens.q1
    total = 12 * n / 1e9
    check_number("q1_total_gb", got["q1_total_gb"], total, unit="GB", mistakes=[
        (16 * n / 1e9, "that counts 4 bytes of gradient per parameter: between two steps there "
                       "are none to save (fp32 weights 4 + Adam's moments 8 = 12 bytes)"),
        (2 * n / 1e9, "that is the bf16 copies, made afresh at each step: a resume needs the fp32 "
                      "weights and Adam's two moments"),
        (4 * n / 1e9, "that is the fp32 weights alone: without Adam's moments the optimizer "
                      "starts again"),
        (14 * n / 1e9, "the bf16 copies are not state: FSDP2 makes them from the fp32 shards"),
        (8 * n / 1e9, "that is Adam's moments alone: the fp32 weights are in the checkpoint too"),
        (total * 1e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes"),
        (total * 1e9, "that is bytes; give GB"),
    ])
    check_number("q1_rank_gb", got["q1_rank_gb"], total / d, unit="GB", mistakes=[
        (total, f"that is the whole checkpoint: each rank writes its own shards, 1/{d} of it"),
        (16 * n / d / 1e9, "that counts gradients: 12 bytes per parameter, over the ranks"),
        (total / (d - 1), f"the shards are split over all {d} ranks"),
        (total / d * 1e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes"),
        (total / d * 1e9, "that is bytes; give GB"),
    ])
    check_number("q1_save_s", got["q1_save_s"], total / d / b, unit="s", mistakes=[
        (total / b, "the ranks write at the same time, each its own shards: one rank's bytes "
                    "over one rank's bandwidth"),
        (total / d / b / d, "each rank writes its own bytes at its own B GB/s: do not divide by "
                            "D again"),
        (16 * n / d / 1e9 / b, "that counts gradients"),
    ])


def q2_test(got, ref):
    n, m, delta, restart = got.givens.q2
    mtbf_h = m / n
    mtbf_s = mtbf_h * 3600
    tau = math.sqrt(2 * delta * mtbf_s)
    check_number("q2_mtbf_h", got["q2_mtbf_h"], mtbf_h, unit="h", mistakes=[
        (float(m), f"that is one GPU's; the job stops when any of its {n:,} GPUs fails"),
        (m * n, "divide by the number of GPUs, not multiply: more GPUs fail more often"),
        (mtbf_s, "that is seconds; give hours"),
    ])
    check_number("q2_interval_min", got["q2_interval_min"], tau / 60, unit="min", mistakes=[
        (tau / math.sqrt(2) / 60, "that is sqrt(delta M): Young's interval is sqrt(2 delta M)"),
        (tau, "that is seconds; give minutes"),
        (math.sqrt(2 * delta * m * 3600) / 60, "M must be the job's mean time between failures, "
                                               "not one GPU's"),
        (math.sqrt(2 * delta * mtbf_h) / 60, "delta is in seconds and M in hours: put M in "
                                             "seconds first"),
        (tau / 60 - delta / 60, "that is Daly's first correction, sqrt(2 delta M) - delta: the "
                                "question asks for Young's interval"),
        ((tau * (1 + math.sqrt(delta / (2 * mtbf_s)) / 3 + delta / (2 * mtbf_s) / 9) - delta) / 60,
         "that is Daly's higher-order estimate (lecture 12): the question asks for Young's "
         "interval, sqrt(2 delta M)"),
    ])
    check_number("q2_lost", got["q2_lost"], delta / tau + (tau / 2 + restart) / mtbf_s, mistakes=[
        (delta / tau + tau / 2 / mtbf_s, "the restart is lost at every failure too: add R / M"),
        (delta / tau + (tau + restart) / mtbf_s, "a failure strikes on average halfway through an "
                                                 "interval: tau / 2 is redone, not tau"),
        (100 * (delta / tau + (tau / 2 + restart) / mtbf_s), "a fraction between 0 and 1, not a "
                                                             "percentage"),
    ])


def q3_test(got, ref):
    for number, (ranks, seed, samples, save_at) in enumerate(got.cases, 1):
        job = resume_check.job(ranks, seed=seed, samples=samples)
        resume_check.diagnose(job, save_at, got[f"hidden case {number}"],
                              label=f"hidden case {number} ({ranks} ranks, saved at step "
                                    f"{save_at})")


def q4_test(got, ref):
    check_choice("q4_outcome", got["q4_outcome"], "never-trains",
                 ["never-trains", "error", "right", "wrong-shards"], mistakes={
        "error": "nothing raises here: an optimizer skips a parameter that has no gradient; "
                 "ask which tensors this optimizer was given",
        "right": "the weights are loaded right; look at which tensors the optimizer was given "
                 "before fully_shard ran, and which ones the model computes with after",
        "wrong-shards": "fully_shard replaces every parameter by this rank's shard: no rank keeps "
                        "the whole model"})
