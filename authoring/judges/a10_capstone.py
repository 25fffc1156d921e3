"""Judge of a10_capstone: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

Both questions are code run on real ranks. The judge recomputes one process's run of each
hidden case here (``course_utils.assess.a10_capstone.diagnose``: ``train3d_check.reference_train`` cut by
``stage_model.shard_state``) and compares every rank's losses, gradients, weights and the
communication it issued; the known mistakes are recomputed from the same seeds. Nothing the
kernel computed is taken as an expected value.

Part 2's fixes (Q4-Q8) are judged the same way: one process trains the same job here
(``course_utils.data_parallel.pitfalls.check``), and every rank's weights and what the program records (DDP's
all-reduces, the sampler's rows, the logged losses) must equal it; where they do not,
:func:`diagnose_fix` names the known mistake they show (``pitfalls.check`` itself, which the
kernel runs, describes symptoms only: naming the cause is what Q4-Q8's choices ask). The
diagnoses are choices.
"""

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor

from course_utils.assess import a10_capstone as capstone
from course_utils.assess.checks import check_choice
from course_utils.data_parallel import pitfalls
from course_utils.trainer3d import check as train3d_check

HELPERS_NOT_ALLOWED = {
    "q1": ["trainer3d.train.train_step", "trainer3d.train.train_worker", "trainer3d.train.run",
           "trainer3d.torch_parts.run", "trainer3d.torch_parts.run_both",
           "trainer3d.check.reference_train", "assess.a10_capstone.run_step",
           "data_parallel.overlap.BucketAllReduce", "zero.zero1.ShardedOptimizer",
           "zero.grad_buffer.GradBuffer", "models.tiny_lm.build", "trainer3d.stage_model.build_stage",
           "trainer3d.stage_model.shard_state", "pipeline.runtime.pipeline_worker"],
    "q2": ["tensor_parallel.copy_to_tp", "tensor_parallel.CopyToTensorParallel",
           "tensor_parallel.ColumnParallelLinear", "trainer3d.stage_model.TensorParallelBlock"],
    **{f"q{n}_fix": ["data_parallel.pitfalls.one_device", "data_parallel.pitfalls.sampler_order"]
       for n in range(4, 9)},
}



# Every rank of part 2 builds torch.optim.SGD or DDP, which import torch._dynamo first: 1.35 s
# per rank per launch under the light preload. The full preload imports it once per kernel: the
# reference notebook ran in 28 s instead of 68 s (load 2-5, 2 cores).
LAUNCH_PRELOAD = "full"


def _draw_q1(rng):
    """train_step's hidden runs, drawn per submission: (dp, pp, tp, seed, m) on 4 ranks, one
    axis of size 1 each, so each mesh tests a pair of axes together (PP x TP, DP x TP,
    DP x PP); m = 4 where dp = 2, so that a gradient D times and one m times too large are told
    apart."""
    seeds = rng.sample(range(10_000), 3)
    return [[1, 2, 2, seeds[0], rng.choice([2, 4])], [2, 1, 2, seeds[1], 4],
            [2, 2, 1, seeds[2], 4]]


def _draw_q2(rng):
    """f's hidden run: (seed, dp, tp): the probe with that seed (two TP groups side by side),
    then training on TP 4 (f does not depend on DP, which Q1 tests)."""
    return [[rng.randrange(10_000), 1, 4]]


def _draw_job(**fixed):
    """One hidden job of a part-2 program: a seed and 2 or 3 ranks, drawn per submission."""
    def draw(rng):
        return [dict(seed=rng.randrange(10_000), world_size=rng.choice([2, 3]), **fixed)]
    return draw


def _draw_accumulation(rng):
    """Gradient accumulation's hidden job: k microbatches of 2 rows, k never equal to the number
    of ranks (a step D times too large and one k times too large are told apart)."""
    world = rng.choice([2, 3])
    k = rng.choice([k for k in (2, 3, 4) if k != world])
    return [dict(seed=rng.randrange(10_000), world_size=world, accumulation=k, rows=2 * k)]


HIDDEN_CASES = {"q1_test": _draw_q1, "q2_test": _draw_q2,
                "q4_fix_test": _draw_job(), "q5_fix_test": _draw_job(ragged=True),
                "q6_fix_test": _draw_accumulation, "q7_fix_test": _draw_job(epochs=3),
                "q8_fix_test": _draw_job()}


def _results(value):
    """A submitted run as the list of per-rank dicts ``capstone.diagnose`` reads."""
    assert isinstance(value, list) and all(isinstance(r, dict) for r in value), (
        "the run did not hand over one result per rank")
    return value


def _plans(cases):
    """The plans of Q1's and Q2's hidden runs, ``cases`` as ``HIDDEN_CASES`` drew them."""
    return ([capstone.plan(dp, pp, tp, seed=seed, m=m)
             for dp, pp, tp, seed, m in cases.get("q1_test", [])]
            + [capstone.plan(dp, 1, tp, seed=seed, m=2)
               for seed, dp, tp in cases.get("q2_test", [])])


_PREPARED: dict[str, Future] = {}  # repr(plan) -> its one-process run, being computed


def prepare(cases):
    """Start the one-process runs Q1 and Q2 are judged against, one after another on a thread
    of their own: the grader calls this once it has drawn a submission's hidden cases, and
    they are computed while the kernel runs the notebook (2-3 s off a submission's grading)."""
    _PREPARED.clear()
    pool = ThreadPoolExecutor(1, thread_name_prefix="a10-reference")
    for p in _plans(cases):
        _PREPARED[repr(p)] = pool.submit(train3d_check.reference_train, p)
    pool.shutdown(wait=False)


def _diagnose(p, results, label):
    prepared = _PREPARED.get(repr(p))
    capstone.diagnose(p, results, label=label,
                      reference=prepared.result() if prepared is not None else None)


def q1_test(got, ref):
    for number, (dp, pp, tp, seed, m) in enumerate(got.cases, 1):
        label = f"hidden case {number} (DP {dp} x PP {pp} x TP {tp})"
        _diagnose(capstone.plan(dp, pp, tp, seed=seed, m=m), _results(got[f"hidden case {number}"]),
                  label)


def q2_test(got, ref):
    for number, (seed, dp, tp) in enumerate(got.cases, 1):
        label = f"hidden case {number}"
        capstone.diagnose_f(_results(got[f"{label} probe"]), seed, label=f"{label}, probe")
        _diagnose(capstone.plan(dp, 1, tp, seed=seed, m=2), _results(got[f"{label} run"]),
                  f"{label}, DP {dp} x TP {tp}")


# ------------------------------------------------------------------ part 2: debugging a broken run


def _scaled(job, factor, order=None):
    """One process's weights with every gradient ``factor`` times too large (= lr times it)."""
    return pitfalls.one_device(dataclasses.replace(job, lr=job.lr * factor), order=order)["weights"]


def _weight_mistakes(name, job, order):
    """(one process's weights as a mistake makes them, the message naming it), computed lazily,
    for the mistakes a fix of program ``name`` can still make."""
    d = job.world_size
    out = [(lambda: _scaled(job, d, order), "the gradients are the sum over the D replicas: D "
            "times their mean (divide by the DP size, or all-reduce with AVG)")]
    if name == "padded_sequences":
        out += [(lambda: pitfalls.one_device(job, normalise="ranks")["weights"],
                 "each rank averaged its own real tokens and the ranks' means were averaged: a "
                 "token on a rank with few real tokens counts more than one on a rank with many "
                 "(divide each rank's sum by the global batch's number of real tokens, then sum "
                 "the gradients)"),
                (lambda: pitfalls.one_device(dataclasses.replace(job, lr=job.lr * d),
                                             normalise="ranks")["weights"],
                 "each rank averaged its own real tokens and the ranks' means were summed"),
                (lambda: _scaled(job, 1 / d),
                 "the gradients are 1/D of the mean: each rank's loss was already divided by the "
                 "global number of real tokens, so the ranks' shares must be summed, not "
                 "averaged")]
    if name == "accumulation":
        out.append((lambda: _scaled(job, job.accumulation), "the gradients of the microbatches "
                    "add up in .grad: each microbatch's loss must be divided by their number"))
    return out


def _order_mistake(job, seen, rank):
    """The message naming how rank ``rank`` read its rows, if it is a known mistake."""
    order = pitfalls.sampler_order(job)[rank]
    per_epoch = len(order) // job.epochs
    if seen == order[:per_epoch] * job.epochs:
        return ("it read the same rows in the same order in every epoch: the sampler shuffles "
                "with seed + epoch, and its epoch must be set (set_epoch) at the start of each")
    if seen == order[:per_epoch] + order[:-per_epoch]:
        return ("it read each epoch's order one epoch late: set_epoch(epoch) must come before "
                "the epoch's rows are drawn")
    if seen == pitfalls.sampler_order(dataclasses.replace(job, seed=job.seed + rank))[rank]:
        return ("it shuffled with a seed of its own: each rank must take its share of one "
                "permutation, or within an epoch some rows are read twice and others never")
    return None


def _cause(name, job, results):
    """The message naming the known mistake a run shows, or None (results are untrusted)."""
    order = pitfalls.sampler_order(job) if name == "epochs" else None
    want = pitfalls.one_device(job, order=order)["weights"]
    for rank, r in enumerate(results if name == "epochs" else []):   # the rows read first:
        if r["seen"] != order[rank]:                                   # they decide the weights
            message = _order_mistake(job, r["seen"], rank)
            if message:
                return f"rank {rank}: {message}"
    for rank, r in enumerate(results):
        if not pitfalls.weights_match(r, want):
            for variant, message in _weight_mistakes(name, job, order):
                if pitfalls.weights_match(r, variant()):
                    return f"rank {rank}: {message}"
            return None
        if name == "accumulation" and r["all_reduces"] == [job.accumulation] * job.steps:
            return (f"rank {rank}: the weights are right, but DDP all-reduced the gradients "
                    "after every microbatch's backward; only the last of a step needs to "
                    "(run the others inside model.no_sync())")
    return None


def diagnose_fix(name, job, results, where=""):
    """Raise AssertionError naming what is wrong with a fix of program ``name`` run on ``job``:
    the cause where it is a known mistake, else ``pitfalls.check``'s symptom."""
    try:
        pitfalls.check(name, job, results)
    except AssertionError as symptom:
        try:
            cause = _cause(name, job, results)
        except Exception:  # noqa: BLE001 - a malformed result is named by its symptom
            cause = None
        raise AssertionError(f"{where}{cause or symptom}") from None


def _fix(name):
    def judge(got, ref):
        for number, case in enumerate(got.cases, 1):
            diagnose_fix(name, pitfalls.Job(**case), _results(got[f"hidden case {number}"]),
                         where=f"hidden case {number}: ")
    judge.__doc__ = f"Every rank of the fixed {name} on the hidden job equals one process."
    return judge


def q4_diagnosis_test(got, ref):
    check_choice("q4_diagnosis", got["q4_diagnosis"], "sum",
                 ["sum", "avg-default", "lr", "loss-mean"], mistakes={
        "avg-default": "the default op of dist.all_reduce is ReduceOp.SUM, on gloo and NCCL "
                       "alike: the gradients are summed once, never averaged",
        "lr": "a learning rate D times smaller would give the same numbers with SGD, but the "
              "program's fault is the gradient: D replicas' gradients summed are D times the "
              "mean that one process computes over the same global batch",
        "loss-mean": "each rank's mean loss is right: its gradients are then summed over the "
                     "D ranks, which is D times the global batch's mean; summing the loss would "
                     "make the step larger still"})


q4_fix_test = _fix("dp_by_hand")


def q5_diagnosis_test(got, ref):
    check_choice("q5_diagnosis", got["q5_diagnosis"], "mean-of-means",
                 ["mean-of-means", "padding", "avg-unsupported", "sum-op", "rows"], mistakes={
        "padding": "every position's loss is multiplied by the mask and only real tokens are "
                   "counted: padding adds nothing",
        "avg-unsupported": "gloo's AVG works on float tensors in torch 2.13: it is the sum "
                           "divided by D (the cell before this question shows it)",
        "sum-op": "a SUM of the ranks' means is D times their average, and still weights each "
                  "rank's mean equally, whatever its number of tokens",
        "rows": "every rank gets job.rows sequences; what differs is how many of their tokens "
                "are real"})


q5_fix_test = _fix("padded_sequences")


def q6_diagnosis_test(got, ref):
    check_choice("q6_diagnosis", got["q6_diagnosis"], "both", ["both", "scale", "sync", "ddp-avg"],
                 mistakes={
        "scale": "that is one of two faults: count the all-reduces per step in the demonstration "
                 "(one per microbatch)",
        "sync": "that is one of two faults: the weights differ from one process's too, since "
                "the microbatches' gradients add up in .grad",
        "ddp-avg": "DDP divides by the number of ranks only; the microbatches' gradients add up "
                   "in .grad, as in one process"})


q6_fix_test = _fix("accumulation")


def q7_diagnosis_test(got, ref):
    check_choice("q7_diagnosis", got["q7_diagnosis"], "set-epoch",
                 ["set-epoch", "rank-seed", "no-shuffle", "loader-shuffle"], mistakes={
        "rank-seed": "the ranks must shuffle with the same seed: each takes every D-th entry of "
                     "one permutation; with permutations of their own, some rows are read twice "
                     "in an epoch and others never",
        "no-shuffle": "the indices of one epoch are not in order: the sampler does shuffle, "
                      "only the same way every epoch",
        "loader-shuffle": "a DataLoader given a sampler refuses shuffle=True (ValueError): the "
                          "sampler decides the order"})


q7_fix_test = _fix("epochs")


def q8_diagnosis_test(got, ref):
    check_choice("q8_diagnosis", got["q8_diagnosis"], "order",
                 ["order", "slow", "group", "barrier"], mistakes={
        "slow": "both ranks are blocked in an all-reduce, each waiting for the other in a "
                "different group: waiting longer changes nothing",
        "group": "a second group over the same ranks is allowed (torch.distributed.new_group); "
                 "what matters is how each rank interleaves its blocking calls on the two "
                 "groups",
        "barrier": "a barrier is one more collective: rank 0 would still be waiting in the "
                   "metrics group, and the others in the barrier"})


q8_fix_test = _fix("loss_logging")
