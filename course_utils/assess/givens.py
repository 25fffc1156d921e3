"""The givens of every assignment whose numbers vary per student, with the options their author
states (issue 26; drawn by :mod:`course_utils.assess.variants`).

Each given is one ``given(label, base, *others)`` (:func:`given`, defined here and bound in
:mod:`course_utils.assess.variants` too): the first option is the base, the lesson's own number
that everyone gets with variants off or without an identity; a tuple is drawn as one (numbers that
only make sense together). The options are realistic (model sizes of real models, device sizes of
accelerators a vendor sells (:data:`ACCELERATOR_GB`, checked by ``tests/test_variants.py``), D a
power of two or a common node multiple), and chosen so that every variant keeps the question's
known mistakes apart from its answer (``tests/test_variant_grading.py`` checks every combination
against the judge), and so that no variant's answer is printed in a lecture or in the assignment
itself (``tests/test_assignments.py`` scans them for every combination).

Questions whose givens stay fixed, and why:

* a2: Q5's function (hidden runs drawn per submission); Q6 (graded by hand).

* a1: the practice questions (3B, 4B, 5B): not graded, and their numbers lie outside the graded
  options. Q5's function runs on hidden cases drawn per submission already.
* a3: the practice questions; Q2's and Q4's functions (hidden cases drawn per submission);
  Q5's ``activation_factor`` (1 for every model: the point of the question).
* a5: the practice questions; Q4's timelines (three printed schedules, read as they are);
  Q5's pipeline step (hidden cases drawn per submission).
* a4: the practice questions; Q2's choices (what each layout needs does not depend on the
  sizes); Q4's function (hidden runs drawn per submission); Q6 (graded by hand); Q3's and Q5's
  ratios (4 and 1 for every model: the point of those parts).
* a6: the practice questions; Q1 (one rank's coordinates and groups in the lesson's mesh:
  Q2 and Q3 ask the same for hidden meshes drawn per submission); Q6 (graded by hand).
* a7: the practice questions; Q4's diagnoses (run A is the straggler, run B the
  communication-bound and run C the memory-bound run for everyone: their tables differ); Q7
  (each student's own timings); Q8 (graded by hand).
* a8: the practice questions; Q1's specs and Q2's collectives (a layout's collective does
  not depend on the sizes); Q3's function (hidden cases); Q4 (graded by hand).
* a11: the practice questions; Q2's function (hidden models and meshes drawn per submission).
* a12: the practice questions; Q3's save and resume (hidden jobs drawn per submission); Q4's
  choice (what an optimizer made before ``fully_shard`` does does not depend on the sizes); Q5
  (graded by hand).
* a13: the practice questions; Q4 (graded by hand: one published run's miss, the same for
  everyone).
* a9: the practice questions; Q3's function (hidden modules drawn per submission); Q4's
  diagnosis (one right choice whatever the learning rate and weights: other numbers would not
  change the answer to copy); Q5's bucket sizes (the student's own timings decide already);
  Q7 (an explanation, graded by hand).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Given", "given", "ACCELERATOR_GB", "DEVICE_GIVENS", "GIVENS", "a7_runs"]


@dataclass(frozen=True)
class Given:
    """One given's stated options, the base (the lesson's own number) first, and what it is."""

    label: str
    options: tuple


def given(label: str, *options: Any) -> Given:
    """A given drawn uniformly from ``options``, the author's stated list; the first option is
    the base, what everyone gets with variants off or without an identity."""
    if not isinstance(label, str) or not label:
        raise ValueError(f"label must say what the given is (a non-empty str); got {label!r}")
    if not options:
        raise ValueError(f"given {label!r} needs at least one option")
    if len(set(map(repr, options))) != len(options):
        raise ValueError(f"given {label!r} lists an option twice: {options!r}")
    return Given(label, tuple(options))


ACCELERATOR_GB = {
    16: "NVIDIA V100 16GB (nvidia.com/en-us/data-center/v100)",
    24: "NVIDIA L4, 24 GB GDDR6 (nvidia.com/en-us/data-center/l4)",
    32: "NVIDIA V100 32GB (nvidia.com/en-us/data-center/v100)",
    40: "NVIDIA A100 40GB (nvidia.com/en-us/data-center/a100)",
    48: "NVIDIA L40S, 48 GB GDDR6 (nvidia.com/en-us/data-center/l40s)",
    64: "AMD Instinct MI210, 64 GB HBM2e (amd.com/en/products/accelerators/instinct/mi200/"
        "mi210.html)",
    80: "NVIDIA A100 80GB, H100 SXM 80 GB (nvidia.com/en-us/data-center/h100)",
    94: "NVIDIA H100 NVL, 94 GB HBM3 (nvidia.com/en-us/data-center/h100)",
    96: "Intel Gaudi 2, 96 GB HBM2E (habana.ai/products/gaudi2)",
    128: "AMD Instinct MI250X, 128 GB HBM2e (amd.com/en/products/accelerators/instinct/mi200/"
         "mi250x.html)",
    141: "NVIDIA H200, 141 GB HBM3e (nvidia.com/en-us/data-center/h200)",
    192: "AMD Instinct MI300X, 192 GB HBM3 (amd.com/en/products/accelerators/instinct/mi300/"
         "mi300x.html)",
}
"""Memory of one accelerator, in GB as its vendor states it, and which products have it (with the
vendor's page). Every device size a question draws is one of these."""

DEVICE_GIVENS = {("a1_training_state", "q4"): 1, ("a3_zero", "q3"): 2}
"""``{(assignment, given): index of the device's GB in each option}``: the givens that name a
device (``tests/test_variants.py`` checks each option against :data:`ACCELERATOR_GB`)."""

GIVENS = {
    "a1_training_state": {
        # Q1-Q3: one model, the lesson's layout (Q1, Q2) and a layout built from the columns (Q3)
        "n_params": given("Q1-Q3: parameters N", 13e9, 11e9, 14e9, 15e9, 20e9, 27e9, 35e9, 40e9),
        # Q4: (parameters, device GB), each of the three outcomes of (16-byte fits, 12-byte
        # fits), every state at least 5 % away from the device size; devices that are sold
        "q4": given("Q4: (parameters N, device GB)", (6e9, 80), (5e9, 64), (3.5e9, 48),
                    (15e9, 192), (8e9, 141), (2e9, 40), (7e9, 80), (12e9, 96)),
    },
    "a2_data_parallel": {
        # Q1: (weights w, the three replicas' mean gradients, learning rate); D = 3 so that
        # "divided by 2, the lecture's D" stays a mistake of its own
        "q1": given("Q1: (weights w, three replicas' mean gradients, learning rate)",
                    ((2, 0), ((1, 5), (3, -1), (5, 2)), 0.5),
                    ((1, -1), ((2, 4), (6, -2), (1, 7)), 0.3),
                    ((0, 1), ((5, 2), (1, 6), (3, -2)), 0.4),
                    ((-1, 2), ((2, 2), (8, -1), (-1, 4)), 0.6),
                    ((2, 2), ((3, -3), (6, 3), (0, 9)), 0.25),
                    ((1, 0), ((9, 1), (-3, 4), (3, 1)), 0.15),
                    ((4, -2), ((1, 6), (2, -4), (6, 1)), 0.35),
                    ((3, 1), ((4, 2), (-2, 5), (7, 0)), 0.45)),
        # Q2: D > 2 (D - 1 and 1 apart), never the practice's 4
        "q2_ranks": given("Q2: ranks D", 8, 16, 32, 64, 6, 12, 24, 48),
        # Q3: (rank 0's two gradients, rank 1's example count and mean gradient)
        "q3": given("Q3: (rank 0's gradients g1, g2, rank 1's examples n, their mean m)",
                    (6, 10, 6, 2), (4, 12, 6, 3), (9, 5, 10, 1.5), (2, 14, 4, 7),
                    (7, 3, 8, 4.5), (1, 11, 10, 2.5), (3, 13, 5, 4), (5, 9, 12, 0.5),
                    (8, 2, 7, 3)),
        # Q4: (parameters N, ranks D), D > 2 so that the ring sends more than the buffer
        "q4": given("Q4: (parameters N, ranks D)", (1.5e9, 16), (2.7e9, 16), (1.3e9, 32),
                    (7e9, 64), (6.7e9, 24), (0.35e9, 12), (0.8e9, 6), (3.5e9, 48)),
    },
    "a3_zero": {
        # Q1: ZeRO-2 per GPU; never the lesson's 7B on 8 ranks (lecture 3's 26.25 GB)
        "q1": given("Q1: (parameters N, ranks D)", (6e9, 16), (3e9, 12), (12e9, 48), (8e9, 32),
                    (11e9, 12), (13e9, 24), (20e9, 64), (30e9, 48)),
        # Q3: (N, D, device GB, reserve GB): the smallest stage is 1, 2 or 3, every stage's
        # state at least 3.5 % away from what is left
        "q3": given("Q3: (parameters N, devices D, device GB, reserve GB)",
                    (13e9, 16, 40, 4), (6e9, 8, 40, 4), (20e9, 32, 80, 8), (30e9, 64, 80, 10),
                    (9e9, 16, 48, 8), (22e9, 64, 48, 6), (10e9, 8, 94, 6), (40e9, 64, 141, 16)),
        # Q5: (N, D, micro-batches m), D != m so that "per rank" and "per micro-batch" differ
        "q5": given("Q5: (parameters N, ranks D, micro-batches m)", (6e9, 12, 6), (4e9, 8, 4),
                    (18e9, 16, 8), (5e9, 32, 16), (2e9, 6, 3), (8e9, 24, 12), (3.5e9, 64, 4)),
    },
    "a4_tensor_parallel": {
        # Q1: (h, ffn, t, b, s) of real MLPs (ffn = 4h or a SwiGLU width), ffn / t != h so that
        # the shards' dims name their mistakes apart
        "q1": given("Q1: (hidden h, MLP width ffn, TP degree t, batch b, tokens s)",
                    (1024, 4096, 8, 2, 128), (4096, 11008, 8, 1, 512), (5120, 13824, 8, 2, 1024),
                    (2560, 10240, 16, 2, 128), (4096, 14336, 8, 1, 256), (2048, 5632, 4, 2, 256),
                    (3200, 8640, 4, 2, 128), (8192, 22016, 8, 1, 256)),
        # Q3: (L, h, t, b, s), ffn = 4h; t >= 4 so that the ring's 2 (t-1)/t is not 1, and
        # b s / h away from the ratios at which a count of weights equals an activation's
        # (8, 3, 2, 8 / t, ...: b s = 2h makes the MLP's weights four activations)
        "q3": given("Q3: (blocks L, hidden h, TP degree t, batch b, tokens s)",
                    (40, 5120, 8, 4, 2048), (48, 6144, 8, 1, 4096), (60, 6656, 4, 2, 2048),
                    (96, 12288, 8, 1, 1024), (40, 5120, 4, 8, 2048), (80, 8192, 4, 3, 2048),
                    (24, 2048, 4, 5, 1024), (96, 12288, 8, 1, 4096)),
        # Q5: (b, s, h, t)
        "q5": given("Q5: (batch b, tokens s, hidden h, TP degree t)", (8, 4096, 6144, 8),
                    (4, 4096, 5120, 8), (2, 8192, 4096, 4), (8, 2048, 8192, 8),
                    (1, 8192, 6144, 4), (4, 2048, 4096, 2), (16, 2048, 5120, 4),
                    (2, 4096, 12288, 8)),
    },
    "a5_pipeline": {
        # Q1: (P, m) of GPipe and of 1F1B, (P, m, v) of interleaved 1F1B
        "q1_gpipe": given("Q1: GPipe (stages P, microbatches m)", (8, 24), (4, 18), (6, 22),
                          (8, 34), (10, 44), (4, 36), (6, 52), (10, 26)),
        "q1_1f1b": given("Q1: 1F1B (stages P, microbatches m)", (6, 8), (4, 10), (3, 13),
                         (5, 11), (7, 15), (4, 22), (5, 7), (7, 20)),
        # m a multiple of P in every option: the course's simulator, Megatron-LM (by default)
        # and the interleaving paper's formula require it (tests/test_pipeline_schedule.py
        # runs every option through pipeline_schedule.simulate)
        "q1_interleaved": given("Q1: interleaved 1F1B (P, m, chunks v)", (4, 12, 3), (4, 16, 2),
                                (6, 18, 3), (8, 16, 4), (6, 24, 2), (4, 20, 4), (6, 12, 4),
                                (8, 8, 3)),
        # Q2: (P, target fraction); none but the base on a boundary where (P-1)/(m+P-1) equals
        # the target exactly (the practice question teaches that case)
        "q2_a": given("Q2: m_a's (stages P, target t)", (6, 0.08), (8, 0.06), (7, 0.09),
                      (6, 0.045), (12, 0.03), (24, 0.07), (9, 0.065), (14, 0.075)),
        "q2_b": given("Q2: m_b's (stages P, target t)", (8, 0.05), (6, 0.03), (10, 0.035),
                      (3, 0.03), (7, 0.035), (20, 0.09)),
        # Q3: (TP, PP, DP, examples per microbatch, microbatches): TP, PP, DP and the count all
        # differ, so that each wrong factor gives its own number
        "q3_a": given("Q3: batch_a's (TP, PP, DP, b, k accumulated)", (2, 4, 5, 3, 12),
                      (4, 2, 3, 5, 11), (4, 2, 7, 7, 11), (4, 3, 5, 7, 11), (2, 3, 6, 5, 13),
                      (2, 3, 7, 3, 11), (4, 8, 2, 5, 11), (2, 4, 3, 2, 9)),
        "q3_b": given("Q3: batch_b's (TP, PP, DP, b, m)", (8, 4, 2, 7, 12), (4, 2, 3, 7, 14),
                      (4, 2, 5, 7, 10), (4, 3, 5, 9, 16), (4, 6, 3, 5, 10), (2, 3, 5, 9, 14),
                      (2, 4, 3, 7, 16), (4, 3, 2, 9, 10)),
        # Q7: ZB-H1 with (P, m, F, B, W ms, rank r): B the whole backward, W its weight half;
        # W no longer than F or than B - W and m >= P, where Qi et al.'s formula is the
        # simulator's (tests/test_pipeline_schedule.py); P = 5 or 7, which lecture 5's widget
        # cannot draw; P - r, m and 1 apart; no bubble or fraction printed in a lecture
        "q7": given("Q7: ZB-H1 (stages P, microbatches m, F ms, B ms, W ms, rank r)",
                    (5, 10, 12, 23, 9, 3), (7, 14, 10, 21, 8, 2), (5, 12, 16, 31, 12, 1),
                    (7, 21, 9, 16, 6, 4), (5, 8, 14, 26, 11, 2), (7, 10, 12, 25, 10, 5),
                    (5, 11, 11, 20, 6, 2), (7, 11, 8, 15, 6, 4)),
    },
    "a6_device_mesh": {
        # Q4: (TP, PP, DP, parameters in billions), PP >= 2 so that "divided by TP only"
        # stays a mistake of its own, TP x PP != DP so that ZeRO-3 over every device is not
        # "DP counted twice"
        "q4": given("Q4: (TP, PP, DP, parameters N in billions)", (8, 2, 4, 78), (2, 2, 8, 26),
                    (8, 4, 2, 175), (4, 4, 2, 95), (8, 2, 8, 130), (2, 4, 4, 22), (8, 8, 2, 405),
                    (4, 2, 4, 47)),
        # Q5: plans A and B, each (parameters in billions, TP, PP, DP), ZeRO-1 on 80 GB: every
        # pair of outcomes, every state at least 10 % from 80 GB
        "q5": given("Q5: plans A and B, each (N in billions, TP, PP, DP)",
                    ((175, 8, 4, 4), (70, 4, 1, 8)), ((405, 8, 8, 4), (22, 1, 1, 16)),
                    ((130, 8, 1, 8), (34, 2, 2, 8)), ((405, 8, 2, 8), (38, 4, 1, 4)),
                    ((175, 8, 2, 8), (13, 1, 1, 32)), ((130, 4, 2, 4), (40, 2, 1, 8)),
                    ((70, 8, 1, 4), (65, 8, 1, 16)), ((405, 8, 4, 8), (22, 2, 1, 8))),
    },
    "a7_measuring": {
        # Q1: the gradient norm over the single process's, D = 4: summed (D) or averaged twice
        # (1/D)
        "q1": given("Q1: run A's gradient norm / one process's", 4.0, 0.25),
        # Q2, Q6 (and run B's wait, which the bytes explain): (parameters N, bus GB/s,
        # sequences per rank, tokens per sequence), every prediction of Q6 its own
        "job": given("the job: (parameters N, bus GB/s, BATCH_PER_RANK, SEQ_LEN)",
                     (1.4e9, 16.0, 16, 1024), (2.7e9, 25.0, 8, 2048), (1.1e9, 12.0, 16, 2048),
                     (0.95e9, 10.0, 32, 1024), (1.9e9, 24.0, 8, 4096), (3.0e9, 40.0, 4, 4096),
                     (2.2e9, 30.0, 16, 1024), (0.8e9, 7.5, 32, 2048)),
        # Q2, Q3, Q5: run A (the slow rank, the others' compute ms, the slow rank's compute ms)
        "run_a": given("run A: (slow rank, others' compute ms, slow rank's compute ms)",
                       (2, 250, 398), (0, 240, 372), (1, 262, 410), (3, 231, 355),
                       (1, 205, 330), (0, 270, 440), (3, 248, 390), (2, 222, 350)),
    },
    "a8_jax_sharding": {
        # Q2: (X rows b, in_features, out_features) of Y = X @ W.T on 8 devices, and the 2-D
        # weight (rows, cols) on the 2 x 4 mesh: every split dim divisible by its axis
        "q2": given("Q2: (batch b, in_features, out_features)", (96, 640, 1536),
                    (64, 512, 1280), (80, 768, 2304), (48, 1024, 2560), (112, 384, 1152),
                    (88, 896, 1792), (40, 1280, 640), (120, 576, 1664)),
        "q2_2d": given("Q2: the 2-D weight (rows, cols)", (768, 3072), (1024, 2560), (640, 1536),
                       (1536, 1024), (896, 2048), (640, 2816), (1280, 960), (384, 2816)),
    },
    "a9_activations": {
        # Q1 (a): a GPT config (hidden h, heads a, layers L, tokens s, micro-batch b); b >= 2
        # so that "one sequence" is a mistake of its own
        "q1_gpt": given("Q1 (a): GPT (hidden h, heads a, layers L, tokens s, micro-batch b)",
                        (5120, 40, 40, 4096, 2), (4096, 32, 32, 4096, 2), (4096, 32, 32, 2048, 4),
                        (5120, 40, 40, 2048, 4), (6144, 48, 44, 2048, 2), (2560, 32, 32, 4096, 4),
                        (3072, 24, 28, 8192, 2), (8192, 64, 80, 2048, 2), (6144, 48, 44, 4096, 3)),
        # Q1 (b): a TinyLM block (width D, heads H, MLP width F = 4D, batch B, tokens T); H >= 4
        # so that "one (T, T) block per head" stands apart, 16 D + H T small enough that the
        # LayerNorm statistics (16 B T bytes) are outside the tolerance; every one measured to
        # the byte (tests/test_reference_answers.py)
        "q1_block": given("Q1 (b): TinyLM block (width D, heads H, MLP width F, batch B, "
                          "tokens T)", (128, 8, 512, 4, 64), (64, 4, 256, 8, 32),
                          (96, 6, 384, 2, 48), (128, 4, 512, 2, 96), (48, 4, 192, 4, 80),
                          (64, 8, 256, 4, 96), (96, 8, 384, 4, 64), (80, 5, 320, 4, 80)),
        # Q2: (h, a, L, s, budget GB): the answers cover none, selective and full and
        # micro-batches of 1 to 8, every micro-batch's bytes at least 4 % from the budget
        "q2": given("Q2: (hidden h, heads a, layers L, tokens s, budget GB)",
                    (6144, 48, 44, 2048, 80), (4096, 32, 32, 4096, 80), (5120, 40, 40, 4096, 60),
                    (8192, 64, 80, 8192, 60), (5120, 40, 40, 8192, 40), (3072, 24, 28, 2048, 44),
                    (4096, 32, 32, 2048, 64), (2560, 32, 32, 4096, 40), (8192, 64, 80, 2048, 80)),
        # Q6: (h, a, L, s, t), micro-batch 1: every t divides a
        "q6": given("Q6: (hidden h, heads a, layers L, tokens s, tensor-parallel t)",
                    (5120, 40, 40, 2048, 8), (4096, 32, 32, 4096, 4), (4096, 32, 32, 2048, 8),
                    (8192, 64, 80, 2048, 8), (5120, 40, 40, 4096, 4), (2560, 32, 32, 4096, 2),
                    (3072, 24, 28, 8192, 4), (8192, 64, 80, 4096, 8), (6144, 48, 44, 4096, 4)),
    },
    "a11_at_scale": {
        # Q1, Q3: (model, TP, PP, DP), meshes the lecture does not show: DP that leaves padded
        # chunks, PP that does not divide the layers in most; Q3's TP > 1 (its all-reduces); no
        # answer a lecture prints (70B on TP 8 x PP 3 x DP 6 and 405B on TP 8 x PP 9 x DP 5 were
        # dropped: lectures 4 and 12 print 7.5156 and 18.283)
        "q1": given("Q1: (model, TP, PP, DP)", ("70B", 8, 3, 5), ("7B", 4, 3, 5),
                    ("70B", 4, 6, 3), ("7B", 2, 5, 6), ("70B", 8, 4, 12), ("405B", 8, 12, 10),
                    ("7B", 8, 3, 7), ("70B", 4, 3, 10)),
        "q3": given("Q3: (model, TP, PP, DP)", ("70B", 4, 5, 6), ("7B", 8, 6, 3),
                    ("405B", 8, 7, 3), ("7B", 2, 3, 12)),
    },
    "a12_checkpointing": {
        # Q1: (parameters N, ranks D, GB/s each rank writes): D > 2 so that "divided by D - 1"
        # and "divided by D twice" stay mistakes of their own; no answer a lecture prints
        "q1": given("Q1: (parameters N, ranks D, GB/s each rank writes)", (6.7e9, 48, 1.5),
                    (7.6e9, 96, 1.1), (13e9, 160, 2.0), (34e9, 192, 1.2), (2.7e9, 24, 0.8),
                    (46e9, 384, 2.5), (16.5e9, 80, 1.6), (23e9, 112, 1.4)),
        # Q2: (GPUs n, hours between one GPU's failures m, seconds a save stalls, seconds a
        # restart takes): job MTBFs of 2.9 to 13 hours, no interval a lecture prints (lecture
        # 12's Llama 3 figure among them)
        "q2": given("Q2: (GPUs n, hours between one GPU's failures m, save stall delta s, "
                    "restart R s)", (16384, 64000, 50, 480), (8192, 43000, 35, 300),
                    (4096, 53000, 110, 900), (24576, 86000, 65, 600), (3072, 27000, 22, 240),
                    (12288, 47000, 95, 420), (6144, 53000, 40, 360), (32768, 94000, 27, 330)),
    },
    "a13_time_at_scale": {
        # Q1: (model, device, TP, PP, DP, global batch, sequence), 1F1B, microbatch 1: the
        # microbatches m = batch / DP a multiple of PP (where the notebook's bubble rule is the
        # simulator's), TP x PP on both sides of a node (the sends between stages on NVLink or
        # on the network), TP 8 with some K and V projections memory-bound; no plan of Q2's, no
        # answer a lecture prints (tests/test_a13_time_at_scale.py)
        "q1": given("Q1: (model, device, TP, PP, DP, global batch, sequence)",
                    ("LLAMA3_70B", "H100", 8, 8, 8, 1024, 8192),
                    ("LLAMA3_8B", "H100", 2, 4, 32, 512, 8192),
                    ("LLAMA3_8B", "A100", 4, 2, 16, 512, 4096),
                    ("LLAMA3_70B", "A100", 8, 4, 8, 256, 4096),
                    ("LLAMA3_405B", "H100", 8, 16, 16, 1024, 8192),
                    ("LLAMA3_70B", "H100", 4, 8, 32, 1024, 4096),
                    ("LLAMA3_8B", "H100", 4, 2, 64, 1024, 4096),
                    ("LLAMA3_70B", "A100", 4, 4, 16, 512, 4096),
                    ("LLAMA3_405B", "A100", 8, 16, 8, 768, 4096)),
        # Q2: (model, device, sequence, global batch, plan A's and plan B's (TP, PP, DP)) on the
        # same GPUs, steps at least 5 % apart; in some the plan with less compute per rank (the
        # one with fewer memory-bound matmuls) is the slower one, in some their compute ties
        "q2": given("Q2: (model, device, sequence, global batch, plan A (TP, PP, DP), "
                    "plan B (TP, PP, DP))",
                    ("LLAMA3_70B", "H100", 8192, 512, (8, 4, 16), (4, 8, 16)),
                    ("LLAMA3_70B", "H100", 4096, 512, (2, 4, 64), (8, 4, 16)),
                    ("LLAMA3_70B", "A100", 4096, 256, (8, 8, 8), (4, 4, 32)),
                    ("LLAMA3_8B", "H100", 8192, 1024, (1, 4, 64), (4, 2, 32)),
                    ("LLAMA3_8B", "A100", 2048, 256, (4, 4, 16), (2, 2, 64)),
                    ("LLAMA3_405B", "H100", 8192, 2048, (8, 8, 64), (4, 16, 64)),
                    ("LLAMA3_8B", "H100", 4096, 256, (8, 2, 16), (2, 4, 32)),
                    ("LLAMA3_70B", "A100", 8192, 512, (8, 4, 32), (4, 8, 32))),
        # Q3: (model, device, sequence, tokens/s per GPU): torchtitan's published 70B figure
        # (the base) and runs of MFU 0.36 to 0.49 made up around it
        "q3": given("Q3: (model, device, sequence, tokens/s per GPU)",
                    ("LLAMA3_70B", "H100", 8192, 829), ("LLAMA3_8B", "A100", 4096, 2350),
                    ("LLAMA3_405B", "H100", 8192, 165), ("LLAMA3_70B", "A100", 4096, 330),
                    ("LLAMA3_8B", "H100", 4096, 6900), ("LLAMA3_70B", "H100", 4096, 1050),
                    ("LLAMA3_405B", "A100", 4096, 60), ("LLAMA3_8B", "H100", 8192, 6300)),
    },
}


def a7_runs(givens) -> tuple[dict, dict, dict]:
    """a7's measured runs A, B and C for a student's givens (4 ranks, ms and GB per rank, rank 0
    first): run A has one slow rank the others wait for, run B waits in its all-reduce about as
    long as the bytes take at the bus bandwidth (7.5 ms more), run C is at the device's memory.
    The base givens give the tables the lesson's numbers were written for."""
    # here, not at the top: importing the collectives package loads torch, and this module is
    # read by every notebook's first cell (variants.givens)
    from course_utils.collectives.cost import ring_bytes

    n_params, bus_gb_per_s, _, _ = givens["job"]
    slow, fast_ms, slow_ms = givens["run_a"]
    d = 4
    step_a, jitter = slow_ms + 14.0, iter([0.0, 2.0, -1.0])
    compute_a = [float(slow_ms) if r == slow else fast_ms + next(jitter) for r in range(d)]
    peak = iter([51.2, 51.3, 51.2])
    run_a = {"step_ms": step_a, "compute_ms": compute_a,
             "wait_ms": [step_a - c - 2.0 for c in compute_a],
             "peak_gb": [51.9 if r == slow else next(peak) for r in range(d)],
             "alloc_retries": [0] * d}
    ring_ms = ring_bytes("all_reduce", 2 * n_params, d) / (bus_gb_per_s * 1e9) * 1000
    wait_b = round(ring_ms + 7.5)
    run_b = {"step_ms": 140.0 + wait_b + 2.0, "compute_ms": [140.0, 141.0, 139.0, 140.0],
             "wait_ms": [float(wait_b), wait_b - 1.0, wait_b + 1.0, float(wait_b)],
             "peak_gb": [38.4, 38.5, 38.4, 38.6], "alloc_retries": [0] * d}
    run_c = {"step_ms": 412.0, "compute_ms": [384.0, 385.0, 383.0, 384.0],
             "wait_ms": [26.0, 25.0, 27.0, 26.0], "peak_gb": [79.2, 79.4, 79.1, 79.3],
             "alloc_retries": [37, 41, 35, 39]}
    return run_a, run_b, run_c
