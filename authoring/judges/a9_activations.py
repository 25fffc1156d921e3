"""Judge of a9_activations: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

Q3's modules and inputs are drawn per submission (``HIDDEN_CASES``): the bytes are compared with
``course_utils.memory.activations.saved_bytes`` on the same modules, rebuilt here from the same case;
the known wrong counts (every saved tensor counted, parameters included, elements instead of
bytes) are measured on them too.

Q5's step times are the student's own measurement on real ranks: the table must follow from
the submitted runs (checked to be ``overlap.timing_worker``'s), and the pick is judged against
that table, never against the reference's timings.
"""

import torch
from torch import nn

from course_utils.assess.checks import as_number, check_choice, check_number
from course_utils.data_parallel import overlap
from course_utils.memory import activations
from course_utils.models import tiny_lm

# Answers the student measures on their own ranks (Q5): judged against the student's own
# measurement, so there is no fixed value a lecture could give away.
MEASURED = {"q5_runs", "q5_step_ms", "q5_best"}

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q1": ["memory.activations.korthikanti_bytes", "memory.activations.predicted_block_bytes",
           "memory.activations.block_terms", "memory.activations.measured_block_bytes"],
    "q2": ["memory.activations.korthikanti_bytes"],
    "q3": ["memory.activations.saved_bytes", "memory.activations.measured_block_bytes",
           "memory.activations.measured_model_bytes"],
    "q5": ["data_parallel.overlap.measure_overlap"],
    "q6": ["memory.activations.korthikanti_bytes"],
}

Q2_RECOMPUTES = ["none", "selective", "full"]
Q4_CHOICES = ["nothing: bf16 master weights are enough", "keep an fp32 master copy of the weights",
              "scale the loss", "keep the gradients in fp32"]

def q1_test(got, ref):
    h, a, n_layers, s, b = got.givens.q1_gpt
    sbh, attention = s * b * h, 5 * a * s / h
    right = sbh * (34 + attention) * n_layers / 1e9
    check_number("q1_gpt_gb", got["q1_gpt_gb"], right, unit="GB", mistakes=[
        (sbh * 34 * n_layers / 1e9, "that leaves out the attention term 5 a s / h: the "
                                    "attention scores, softmax and dropout grow with s^2 and "
                                    "are most of it."),
        (right / b, f"that is for one sequence: the micro-batch is b = {b}."),
        (right / n_layers, f"that is one layer; the model has {n_layers}."),
        (right * 1e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes."),
        (right * 1e9, "that is bytes; give GB."),
        (right * 2, "the formula already counts 16-bit values: do not double it."),
        (sbh * (34 + attention / 5) * n_layers / 1e9,
         "the attention term is 5 a s / h: softmax output (2 bytes), dropout mask (1) and "
         "dropout output (2) per score."),
    ])
    d, n_heads, f, batch, t = got.givens.q1_block
    btd, btf, bt, bhtt = batch * t * d, batch * t * f, batch * t, batch * n_heads * t * t
    elements = 8 * btd + 2 * btf + 4 * bt + bhtt
    check_number("q1_block_bytes", got["q1_block_bytes"], 4 * elements, unit="bytes", mistakes=[
        (4 * (elements - bhtt), "the attention probabilities (B, H, T, T) are missing: the "
                                "math kernel saves them."),
        (elements, "that counts elements; each fp32 element is 4 bytes."),
        (2 * elements, "TinyLM runs in fp32: 4 bytes per element, not 2."),
        (4 * (10 * btd + 4 * bt + bhtt),
         f"the MLP's two saved tensors are (B, T, F), F = {f}, not (B, T, D)."),
        (4 * (8 * btd + 2 * btf + bhtt),
         "the four (B, T) LayerNorm statistics (mean and 1/std of each LayerNorm) are missing."),
        (4 * (8 * btd + 2 * btf + 4 * bt + bhtt // n_heads),
         f"the attention matrix has one (T, T) block per head: B H T^2, H = {n_heads}."),
    ])


MICRO_BATCHES = (1, 2, 4, 8, 16)


def q2_test(got, ref):
    h, a, n_layers, s, budget = got.givens.q2
    per = {"none": s * h * (34 + 5 * a * s / h) * n_layers / 1e9,       # GB per sequence
           "selective": s * h * 34 * n_layers / 1e9, "full": s * h * 2 * n_layers / 1e9}

    def largest(gb):
        return max((m for m in MICRO_BATCHES if m * gb <= budget), default=0)

    answer = next(r for r in Q2_RECOMPUTES if per[r] <= budget)
    m = largest(per[answer])
    fits = f"one sequence keeps {per[answer]:.3g} GB with {answer!r}, under {budget:g} GB"
    mistakes = {}
    for r in Q2_RECOMPUTES:
        if Q2_RECOMPUTES.index(r) < Q2_RECOMPUTES.index(answer):
            mistakes[r] = (f"{r!r} does not fit: one sequence keeps {per[r]:.3g} GB with it, "
                           f"over the {budget:g} GB budget.")
        elif r != answer:
            mistakes[r] = (f"{r!r} fits, but {fits}: the rule takes the least recomputation "
                           "that fits first.")
    check_choice("q2_recompute", got["q2_recompute"], answer, Q2_RECOMPUTES, mistakes=mistakes)
    wrong = {}                      # micro-batch -> message; the first message for a value wins
    up = min((x for x in MICRO_BATCHES if x > m), default=None)
    if up is not None:
        wrong[up] = (f"{up} sequences with {answer!r} keep {up} x {per[answer]:.3g} = "
                     f"{up * per[answer]:.3g} GB: over {budget:g} GB.")
    if answer == "none":
        wrong.setdefault(largest(per["selective"]), (
            f"{largest(per['selective'])} sequences fit only if the attention term 5 a s / h = "
            f"{5 * a * s / h:g} is left out (34 s b h: {per['selective']:.3g} GB a sequence) or "
            f"with selective recomputation; without recomputation each sequence keeps "
            f"{per['none']:.3g} GB."))
    for r in Q2_RECOMPUTES[Q2_RECOMPUTES.index(answer) + 1:]:
        wrong.setdefault(largest(per[r]), (
            f"that is what {r!r} recomputation fits ({per[r]:.3g} GB a sequence), but the "
            f"rule puts less recomputation first: {answer!r} fits."))
    if m > 1:
        wrong.setdefault(1, f"one sequence fits, but so do {m}: take the largest that fits.")
    check_number("q2_micro_batch", got["q2_micro_batch"], m,
                 mistakes=[(v, msg) for v, msg in wrong.items() if v not in (0, m)])


class _ExpSquare(nn.Module):
    """exp(x)^2, as in the test cell: one storage saved three times."""

    def forward(self, x):
        y = x.exp()
        return y * y


def _draw_q3(rng):
    """saved_activation_bytes' hidden cases, drawn per submission: (kind, seed, input shape)
    for a TinyLM block, a LayerNorm-Linear-Tanh stack and exp(x)^2 in float64."""
    seeds = rng.sample(range(10_000), 3)
    return [["block", seeds[0], [rng.randint(1, 3), rng.choice([8, 16, 24, 32]), 64]],
            ["ln-linear-tanh", seeds[1], [rng.randint(2, 4), rng.randint(3, 9),
                                          rng.choice([8, 16, 24])]],
            ["exp-square", seeds[2], [rng.randint(3, 8), rng.randint(5, 12)]]]


HIDDEN_CASES = {"q3_test": _draw_q3}


def q3_case(kind, seed, shape):
    """(module, inputs) of one hidden case, built as the hidden test builds it."""
    torch.manual_seed(seed)
    if kind == "block":
        return (tiny_lm.build(tiny_lm.TinyLMConfig(), 0).blocks[0],
                (torch.randn(*shape, requires_grad=True),))
    if kind == "ln-linear-tanh":
        d = shape[-1]
        return (nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Tanh()),
                (torch.randn(*shape, requires_grad=True),))
    return _ExpSquare(), (torch.randn(*shape, dtype=torch.float64, requires_grad=True),)


def _variants(module, inputs):
    """Known wrong counts: every saved tensor's storage summed, parameters counted, elements."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    per_tensor, with_params, elements = [0], {}, {}

    def pack(t):
        storage = t.untyped_storage()
        with_params[storage.data_ptr()] = storage.nbytes()
        if storage.data_ptr() not in params:
            per_tensor[0] += storage.nbytes()
            elements[storage.data_ptr()] = storage.nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return per_tensor[0], sum(with_params.values()), sum(elements.values())


def q3_test(got, ref):
    for number, case in enumerate(got.cases, 1):
        module, inputs = q3_case(*case)
        key = f"saved_activation_bytes on hidden case {number}"
        kind = got[f"{key}: type"]
        if kind != "int":
            raise AssertionError(f"{key}: return a plain int (got {kind}).")
        per_tensor, with_params, elements = _variants(module, inputs)
        expected, _ = activations.saved_bytes(lambda: module(*inputs),
                                              exclude=module.parameters())
        mistakes = [(v, m) for v, m in [
            (per_tensor, "each saved tensor was counted, so a storage saved several times (or "
                         "through several views) was counted several times: count each "
                         "storage once."),
            (with_params, "the module's parameters are counted too: leave them out."),
            (elements, "that counts elements; return bytes (storage.nbytes())."),
        ] if v != expected]
        check_number(key, got[key], expected, unit="bytes", rel=0.0, mistakes=mistakes)


def q4_test(got, ref):
    check_choice("q4_fix", got["q4_fix"], "keep an fp32 master copy of the weights", Q4_CHOICES,
                 mistakes={
        "nothing: bf16 master weights are enough": "bf16 keeps 8 significant bits: next to 0.02 "
            "the gap between bf16 numbers is about 1.2e-4, so a step of 1e-5 is rounded away "
            "every time. An fp32 master copy adds the steps up; the 4 bytes per parameter are "
            "what the 16-byte layout pays for it.",
        "scale the loss": "the gradients are not zero, and bf16 has fp32's exponent range: loss "
                          "scaling is for fp16, whose small gradients flush to zero.",
        "keep the gradients in fp32": "fp32 gradients (the 18-byte layout) make sums over "
            "micro-batches and ranks more accurate, but the update is still added to a bf16 "
            "weight and rounded away: the weights cannot move.",
    })


# Q5: the student's own timings on real ranks (never compared with the reference's).
Q5_SIZES = [0.25, 1.0, 4.0, 25.0]
Q5_TOLERANCE = 0.02          # a size within 2% of the fastest step counts as the fastest
_Q5_KEYS = ("step_ms", "compute_ms", "comm_ms", "wait_ms")


def _q5_runs(runs):
    """The measured rows, checked to be ``overlap.timing_worker``'s on 2 ranks for Q5_SIZES."""
    sizes = overlap.param_sizes(overlap.make_mlp(width=256, depth=32))
    n_buckets = [len(overlap.bucket_assignment(sizes, mb)) for mb in Q5_SIZES]   # 32, 8, 2, 1
    if not isinstance(runs, list) or len(runs) != 2:
        raise AssertionError("q5_runs must be what launch.run returned for 2 ranks: run the "
                             "measuring cell as given, then answer from its q5_runs.")
    for r, run in enumerate(runs):
        if not isinstance(run, list) or len(run) != len(Q5_SIZES):
            raise AssertionError(f"q5_runs[{r}] must hold one row per size of Q5_SIZES.")
        for i, row in enumerate(run):
            if not isinstance(row, dict) or row.get("bucket_mb") != Q5_SIZES[i] \
                    or row.get("n_buckets") != n_buckets[i]:
                raise AssertionError(f"q5_runs[{r}][{i}] is not overlap.timing_worker's row "
                                     f"for {Q5_SIZES[i]} MiB: run the measuring cell as given.")
            for k in _Q5_KEYS:
                v = as_number(f"q5_runs[{r}][{i}][{k!r}]", row.get(k))
                if not 0 < v < 60_000:
                    raise AssertionError(f"q5_runs[{r}][{i}][{k!r}] = {v:g} ms is not a "
                                         "plausible median time of a step on real ranks.")
            if row["wait_ms"] > row["step_ms"]:
                raise AssertionError(f"q5_runs[{r}][{i}]: the wait is longer than the whole "
                                     "step, which contains it: not a real measurement.")
    return runs


def q5_test(got, ref):
    runs = _q5_runs(got["q5_runs"])
    column = {k: [max(run[i][k] for run in runs) for i in range(len(Q5_SIZES))]
              for k in _Q5_KEYS}                                   # the slowest rank, per size
    table = column["step_ms"]
    value = got["q5_step_ms"]
    if not isinstance(value, list) or len(value) != len(Q5_SIZES):
        raise AssertionError("q5_step_ms should be a list of one step time per size of "
                             "Q5_SIZES, in their order.")
    mine = [as_number(f"q5_step_ms[{i}]", v) for i, v in enumerate(value)]

    def same(a):
        return all(abs(x - y) <= 1e-6 * max(1.0, abs(y)) for x, y in zip(mine, a))

    if not same(table):
        for wrong, message in [
            ([runs[0][i]["step_ms"] for i in range(len(Q5_SIZES))],
             "that is rank 0's step time alone: a step ends when every rank has its averaged "
             "gradients, so the slowest rank's time decides (the largest of the ranks')."),
            ([sum(run[i]["step_ms"] for run in runs) / len(runs) for i in range(len(Q5_SIZES))],
             "that is the mean of the ranks: a step ends when the slowest rank is done, so "
             "take the largest of the ranks' step times."),
            ([min(run[i]["step_ms"] for run in runs) for i in range(len(Q5_SIZES))],
             "that is the fastest rank's time: the step ends with the slowest rank."),
            (column["comm_ms"], "that is the communication alone; the question is about the "
                                "whole step (step_ms)."),
            (column["wait_ms"], "that is the wait after backward, only the exposed part of "
                                "the communication; the question is about the whole step."),
        ]:
            if same(wrong):
                raise AssertionError(f"q5_step_ms: {message}")
        raise AssertionError("q5_step_ms does not match your q5_runs: per size, the step time "
                             "of the slowest rank (step_ms), in the order of Q5_SIZES.")
    best = as_number("q5_best", got["q5_best"])
    if best not in Q5_SIZES:
        raise AssertionError(f"q5_best = {best:g}: pick one of Q5_SIZES {Q5_SIZES}.")
    fastest = min(table)
    if table[Q5_SIZES.index(best)] <= fastest * (1 + Q5_TOLERANCE):
        return
    shown = f"q5_best = {best:g} MiB takes {table[Q5_SIZES.index(best)]:.1f} ms per step in " \
            f"your table, the fastest {fastest:.1f} ms"
    by_comm = Q5_SIZES[column["comm_ms"].index(min(column["comm_ms"]))]
    by_wait = Q5_SIZES[column["wait_ms"].index(min(column["wait_ms"]))]
    if best == by_comm:
        raise AssertionError(f"{shown}: you picked the least communication time. Communication "
                             "that overlaps backward costs nothing; pick by the whole step.")
    if best == by_wait:
        raise AssertionError(f"{shown}: you picked the shortest wait after backward. A short "
                             "wait can come with a slower backward (the all-reduces compete "
                             "with it): pick by the whole step.")
    if best == max(Q5_SIZES):
        raise AssertionError(f"{shown}: the largest bucket is one bucket for this 8 MiB model: "
                             "it starts only when backward ends, so nothing overlaps.")
    if best == min(Q5_SIZES):
        raise AssertionError(f"{shown}: the smallest buckets start earliest but pay the per-call "
                             "latency 32 times. Pick the fastest step of your table.")
    raise AssertionError(f"{shown}: pick the size with the fastest step of your table.")


def q6_test(got, ref):
    h, a, n_layers, s, t = got.givens.q6
    sbh, attention = s * 1 * h, 5 * a * s / h           # micro-batch 1
    tp_gb = sbh * (10 + 24 / t + attention / t) * n_layers / 1e9
    sp_gb = sbh * (34 + attention) / t * n_layers / 1e9
    one_gb = sbh * (34 + attention) * n_layers / 1e9
    check_number("q6_tp_gb", got["q6_tp_gb"], tp_gb, unit="GB", mistakes=[
        (sp_gb, "that divides the whole s b h (34 + 5 a s / h) by t, as if sp were on: "
                "tensor parallelism alone keeps the 10 s b h of LayerNorm and dropout "
                "activations whole on every GPU."),
        (one_gb, "that is one device's activations: tensor parallelism splits the 24 s b h "
                 "and the attention matrix by t."),
        (sbh * (10 + 24 / t + attention) * n_layers / 1e9,
         "the attention matrix is split by heads too: 5 a s / h is divided by t."),
        (tp_gb / n_layers, f"that is one layer; the model has {n_layers}."),
        (tp_gb * 1e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes."),
        (tp_gb * 1e9, "that is bytes; give GB."),
    ])
    check_number("q6_sp_gb", got["q6_sp_gb"], sp_gb, unit="GB", mistakes=[
        (tp_gb, "that is tensor parallelism alone: you forgot that sequence parallelism also "
                "splits the 10 s b h that TP replicates (LayerNorm inputs and outputs, "
                "dropout masks)."),
        (sbh * (34 + attention / t) / t * n_layers / 1e9,
         "you divided the attention term twice: it is split by heads (tensor parallelism) and "
         "not again by sequence parallelism; every term is divided by t once."),
        (one_gb, "that is one device's activations: divide by t."),
        (sp_gb / n_layers, f"that is one layer; the model has {n_layers}."),
        (sp_gb * 1e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes."),
        (sp_gb * 1e9, "that is bytes; give GB."),
    ])
