"""Reference answers and hidden tests (from ``solutions/``) run against the course's harnesses:
the reference passes, and typical wrong answers get feedback that names the mistake (from the
visible practice checks, or from the judge when grading: the pattern accepts either wording).

Instructor-only: it reads ``solutions/``, so the students' copy leaves it out.
"""

from __future__ import annotations

import nbformat
import pytest
import torch
import torch.distributed as dist

from conftest import ROOT
from course_utils.assess import checks
from course_utils.assess import variants
from course_utils.assess import a3_zero as zero
from course_utils.pipeline import runtime as pp


def _answer(assignment: str, grade_id: str, name: str):
    """The function ``name`` defined by answer cell ``grade_id`` of the reference solution,
    after the notebook's code cells before it (imports, earlier answers; not the tests)."""
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    scope: dict = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or (meta.get("grade") and not meta.get("solution")):
            continue
        exec(compile(cell.source, f"{assignment}:{meta.get('grade_id', 'setup')}", "exec"), scope)
        if meta.get("grade_id") == grade_id:
            return scope[name]
    raise LookupError(f"{assignment} has no answer cell {grade_id}")


@pytest.mark.parametrize("p", [2, 3])
def test_pipeline_answer_equals_the_example_weighted_reference(p):
    """a5 Q5's reference answer on the harness the hidden tests use: example weighting gives
    the full-batch loss and gradients; weighting each microbatch equally does not."""
    step = _answer("a5_pipeline", "q5", "pipeline_step")
    sizes = [4, 3, 2, 1]
    for seed in (0, 1):
        runs = pp.run_student_pipeline(step, p, seed, sizes, width=8, depth=6)
        loss, grads = pp.microbatch_reference(seed, sizes, 8, 6, p)
        full_loss, full_grads = pp.reference_step(seed, sum(sizes), 8, 6, p)
        assert loss == pytest.approx(full_loss, abs=1e-6)  # example weighting = full batch
        assert runs[-1]["loss"] == pytest.approx(loss, abs=1e-6)
        _, equal_w = pp.microbatch_reference(seed, sizes, 8, 6, p, weighting="microbatches")
        for rank in range(p):
            for got, want, full in zip(runs[rank]["grads"], grads[rank], full_grads[rank]):
                torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(want),
                                           atol=1e-6, rtol=1e-5)
                torch.testing.assert_close(torch.as_tensor(want), full, atol=1e-6, rtol=1e-5)
        # equal weights per microbatch is a different objective when the sizes differ
        assert any(not torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-5)
                   for a, b in zip(grads[-1], equal_w[-1]))


# ------------------------------------------------------------------------------ a3: ZeRO feedback


def _cell(grade_id: str) -> str:
    nb = nbformat.read(ROOT / "solutions" / "a3_zero" / "a3_zero.ipynb", as_version=4)
    [cell] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    return cell.source


_BASE = variants.givens("a3_zero", on=False)  # the base numbers (each student's: test_variant_*)


def _namespace() -> dict:
    return {"__name__": "__main__", "torch": torch, "dist": dist, "checks": checks, "zero": zero,
            "variants": variants, "G": _BASE}


def _run_test_cell(grade_id: str, ns: dict, key: str = "student-1") -> None:
    """Run a3's test cell ``grade_id`` in ``ns`` as grading does: the cell's code runs (the
    visible checks may fail there) on the hidden cases drawn for ``key``, its submissions cross
    as JSON, and the judge of ``authoring/judges/a3_zero.py`` decides; its message is raised
    as AssertionError. (The a3 judge takes no expected value from the reference run, so the
    cell's own submissions stand in for the reference's names.)"""
    import json
    import os
    from unittest import mock

    from grading import judge

    rules = judge.load("a3_zero")
    cases = judge.hidden_cases(rules, key)
    got = []
    sent = lambda name, value: got.append((name, json.loads(json.dumps(checks.encode(value)))))
    with mock.patch.object(checks, "submit", sent), \
            mock.patch.dict(os.environ, {"COURSE_HIDDEN_CASES": json.dumps(cases)}):
        exec(_cell(grade_id), ns)
    verdict = judge.judge_cell(rules, grade_id, got, got, None, cases.get(grade_id),
                               cases.get(grade_id), givens=_BASE)
    if not verdict.passed:
        raise AssertionError(verdict.message)


@pytest.mark.parametrize("answer, words", [
    (6.0, "ZeRO-3"), (96 / 16, "16N/D"), (17.25e9 / 2**30, "GiB"), (16.5, "forgot the gradients"),
    (28.5, "ZeRO-1"), (96.0, "replicated"), (5.25, "replicated bf16 weights"),
    (17.25e9, "bytes"), (20.0, "is not right"),
])
def test_q1_feedback_names_the_mistake(answer, words):
    ns = _namespace() | {"zero2_gb": answer}
    with pytest.raises(AssertionError, match=words):
        _run_test_cell("q1_test", ns)


@pytest.mark.parametrize("key", ["student-1", "student-2", "reference"])
def test_q1_to_q3_solution_passes(key):
    """On the hidden cases drawn for several submissions."""
    ns = _namespace()
    for cell in ("q1", "q2", "q3"):
        exec(_cell(cell), ns)
        _run_test_cell(f"{cell}_test", ns, key)
    assert ns["zero2_gb"] == pytest.approx(17.25) and ns["smallest_stage"] == 3


@pytest.mark.parametrize("wrong, words", [
    ("return (16 / dp if stage else 16) * n_params / 1e9", "stage.3 (figure|keeps)"),
    ("return (2 + 2 + 12 / dp if stage else 16) * n_params / 1e9", "stage.1 (figure|keeps)"),
    ("return [16, 4 + 12 / dp, 2 + 14 / dp, 16 / dp][stage] * n_params / 2**30", "GiB"),
    ("return [16, 4 + 8 / dp, 2 + 10 / dp, 12 / dp][stage] * n_params / 1e9", "master copy"),
])
def test_q2_feedback_names_the_mistake(wrong, words):
    ns = _namespace()
    exec("def zero_gb(n_params, dp, stage):\n    " + wrong, ns)
    with pytest.raises(AssertionError, match=words):
        _run_test_cell("q2_test", ns)


@pytest.mark.parametrize("answer, words", [(2, "reserve"), (1, "61.75|52 GB"), (0, "208"),
                                           (3.0, "should be an int")])
def test_q3_feedback_names_the_mistake(answer, words):
    ns = _namespace() | {"smallest_stage": answer}
    with pytest.raises(AssertionError, match=words):
        _run_test_cell("q3_test", ns)


_GOOD_Q4 = _cell("q4")


@pytest.mark.parametrize("edit, words", [
    (("grad /= world", "pass"), "SUM|summed"),
    (("(exp_avg_sq / (1 - beta2 ** step))", "(exp_avg_sq * 1.0)"), None),
    (("dist.reduce_scatter_single(grad, local_grad, op=dist.ReduceOp.SUM, group=dp_group)",
      "grad.copy_(local_grad.view(world, -1)[dist.get_rank(dp_group)])"), "no collective"),
    (("return master.to(torch.bfloat16)", "return master"), "bf16"),
])
def test_q4_feedback_on_real_ranks(edit, words):
    """Wrong student functions, run on real ranks by the hidden tests, get named feedback."""
    old, new = edit
    assert old in _GOOD_Q4
    ns = _namespace()
    exec(_GOOD_Q4.replace(old, new), ns)
    if words is None:  # forgot only v's bias correction: a plain mismatch, still caught
        with pytest.raises(AssertionError):
            _run_test_cell("q4_test", ns)
        return
    with pytest.raises(AssertionError, match=words):
        _run_test_cell("q4_test", ns)


def test_q4_names_missing_bias_correction_and_own_gradient():
    src = _GOOD_Q4
    no_bias = src.replace("(exp_avg_sq / (1 - beta2 ** step))", "(exp_avg_sq * 1.0)").replace(
        "value=-lr / (1 - beta1 ** step)", "value=-lr")
    ns = _namespace()
    exec(no_bias, ns)
    with pytest.raises(AssertionError, match="bias correction"):
        _run_test_cell("q4_test", ns)
    own = src.replace(
        "dist.reduce_scatter_single(grad, local_grad, op=dist.ReduceOp.SUM, group=dp_group)",
        "dist.all_reduce(torch.zeros(1), group=dp_group); "
        "grad.copy_(local_grad.view(world, -1)[dist.get_rank(dp_group)] * world)")
    ns = _namespace()
    exec(own, ns)
    with pytest.raises(AssertionError, match="own (gradient|local_grad)"):
        _run_test_cell("q4_test", ns)


# ------------------------------------------------------------------------------ a9: activations


def _a9_judge():
    from grading import judge
    return judge.load("a9_activations")


def test_a9_reference_measurement_equals_the_library():
    """a9 Q3's reference answer counts what course_utils.memory.activations.saved_bytes counts, on
    the hidden cases and on TinyLM blocks with each kernel and recomputation."""
    from course_utils.memory import activations
    from course_utils.models import tiny_lm

    count = _answer("a9_activations", "q3", "saved_activation_bytes")
    rules = _a9_judge()
    for key in ("student-1", "student-2", "reference"):
        for case in judge_cases(rules, key):
            module, inputs = rules.q3_case(*case)
            want, _ = activations.saved_bytes(lambda: module(*inputs),
                                              exclude=module.parameters())
            assert count(module, inputs) == want
    cfg = tiny_lm.TinyLMConfig()
    block = tiny_lm.build(cfg, 0).blocks[0]
    for batch, seq in [(1, 8), (3, 32)]:
        x = torch.randn(batch, seq, cfg.d_model, requires_grad=True)
        assert count(block, (x,)) == activations.predicted_block_bytes(cfg, batch, seq,
                                                                      attention="fused")


def judge_cases(rules, key: str) -> list:
    """The cases a9 Q3's hidden test gets for the submission key ``key``."""
    from grading import judge

    return judge.hidden_cases(rules, key)["q3_test"]


def _a9_q3_submissions(count, key: str = "student-1"):
    """What the hidden test submits for a saved_activation_bytes built on ``count``, as judge
    values carrying their cases."""
    from grading import judge

    rules = _a9_judge()
    pairs = []
    for number, case in enumerate(judge_cases(rules, key), 1):
        module, inputs = rules.q3_case(*case)
        got = count(module, inputs)
        pairs += [(f"saved_activation_bytes on hidden case {number}", got),
                  (f"saved_activation_bytes on hidden case {number}: type", type(got).__name__)]
    out = judge.Values(pairs)
    out.cases = judge_cases(rules, key)
    return out


def _a9_counter(dedup=True, params=False, elements=False):
    """A saved_activation_bytes with (or without) each known mistake."""
    def count(module, inputs):
        skip = set() if params else {p.untyped_storage().data_ptr() for p in module.parameters()}
        seen, total = {}, [0]

        def pack(t):
            s = t.untyped_storage()
            if s.data_ptr() not in skip:
                size = s.nbytes() // t.element_size() if elements else s.nbytes()
                seen[s.data_ptr()] = size
                total[0] += size
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(*inputs)
        return int(sum(seen.values()) if dedup else total[0])
    return count


def test_a9_judge_q3_names_each_mistake():
    rules = _a9_judge()
    ref = _a9_q3_submissions(_answer("a9_activations", "q3", "saved_activation_bytes"))
    rules.q3_test(_a9_q3_submissions(_a9_counter()), ref)  # the right count passes
    for wrong, words in [(_a9_counter(dedup=False), "count each storage once"),
                         (_a9_counter(params=True), "parameters are counted"),
                         (_a9_counter(elements=True), "counts elements")]:
        with pytest.raises(AssertionError, match=words):
            rules.q3_test(_a9_q3_submissions(wrong), ref)
    floats = _a9_q3_submissions(lambda m, i: float(_a9_counter()(m, i)))
    with pytest.raises(AssertionError, match="plain int"):
        rules.q3_test(floats, ref)


def _a9_got(values: dict, **givens) -> "judge.Values":
    """Submitted values with the givens of a9 (the base numbers, where not given)."""
    from grading import judge

    got = judge.Values(values.items())
    got.givens = variants.givens("a9_activations", on=False).replaced(**givens)
    return got


def test_a9_judge_numbers_and_choices_agree_with_the_library_in_every_variant():
    """For every option of Q1's and Q2's givens, the judge's right answers are the library's
    (``korthikanti_bytes``; the TinyLM block's bytes measured with saved-tensor hooks, so the
    formula of the question is exact for every variant), and the named mistakes are caught."""
    from course_utils.memory import activations
    from course_utils.models import tiny_lm

    rules = _a9_judge()
    table = variants.givens_of("a9_activations")
    for gpt, block in zip(table["q1_gpt"].options, table["q1_block"].options):
        h, a, n_layers, s, b = gpt
        d, n_heads, f, batch, t = block
        cfg = tiny_lm.TinyLMConfig(d_model=d, n_heads=n_heads, d_ff=f, seq_len=t)
        measured = activations.measured_block_bytes(cfg, batch, t)
        assert measured == activations.predicted_block_bytes(cfg, batch, t), block
        right = {"q1_gpt_gb": activations.korthikanti_bytes(s, b, h, a, n_layers) / 1e9,
                 "q1_block_bytes": measured}
        rules.q1_test(_a9_got(right, q1_gpt=gpt, q1_block=block), None)
        for wrong, words in [
                ({"q1_gpt_gb": s * b * h * 34 * n_layers / 1e9}, "leaves out the attention"),
                ({"q1_gpt_gb": right["q1_gpt_gb"] / b}, f"micro-batch is b = {b}"),
                ({"q1_block_bytes": measured - 4 * batch * n_heads * t * t}, "probabilities")]:
            with pytest.raises(AssertionError, match=words):
                rules.q1_test(_a9_got({**right, **wrong}, q1_gpt=gpt, q1_block=block), None)
    kinds = {"none": "none", "selective": "attention", "full": "full"}
    seen = set()
    for q2 in table["q2"].options:
        h, a, n_layers, s, budget = q2
        per = {r: activations.korthikanti_bytes(s, 1, h, a, n_layers, recompute=k) / 1e9
               for r, k in kinds.items()}
        recompute = next(r for r in kinds if per[r] <= budget)
        micro = max(m for m in (1, 2, 4, 8, 16) if m * per[recompute] <= budget)
        seen.add(recompute)
        got = {"q2_recompute": recompute, "q2_micro_batch": micro}
        rules.q2_test(_a9_got(got, q2=q2), None)
        for other in set(kinds) - {recompute}:
            with pytest.raises(AssertionError,
                               match="does not fit" if per[other] > budget else "fits, but"):
                rules.q2_test(_a9_got({**got, "q2_recompute": other}, q2=q2), None)
        with pytest.raises(AssertionError, match="over"):
            if micro < 16:
                rules.q2_test(_a9_got({**got, "q2_micro_batch": 2 * micro}, q2=q2), None)
            else:
                raise AssertionError("over: (16 is the largest option)")
        # every micro-batch's bytes keep clear of the budget (no variant decided by rounding)
        assert all(abs(m * gb - budget) > 0.04 * budget for gb in per.values()
                   for m in (1, 2, 4, 8, 16)), q2
    assert seen == set(kinds), seen     # the variants' answers cover all three choices
    rules.q4_test(_a9_got({"q4_fix": "keep an fp32 master copy of the weights"}), None)
    with pytest.raises(AssertionError, match="rounded away"):
        rules.q4_test(_a9_got({"q4_fix": "nothing: bf16 master weights are enough"}), None)


def test_a9_judge_q6_sequence_parallelism_in_every_variant():
    """Q6's expected values are the library's korthikanti_bytes with tp (and sp) for every
    option of its givens; each named misconception is recognised."""
    from course_utils.memory import activations

    rules = _a9_judge()
    for q6 in variants.givens_of("a9_activations")["q6"].options:
        h, a, n_layers, s, tp = q6
        cfg = dict(s=s, b=1, h=h, a=a, layers=n_layers, tp=tp)
        right = {"q6_tp_gb": activations.korthikanti_bytes(**cfg) / 1e9,
                 "q6_sp_gb": activations.korthikanti_bytes(**cfg, sp=True) / 1e9}
        rules.q6_test(_a9_got(right, q6=q6), None)
        sbh, att = s * h, 5 * a * s / h
        for wrong, words in [
                ({**right, "q6_sp_gb": right["q6_tp_gb"]}, "also splits the 10 s b h"),
                ({**right, "q6_sp_gb": sbh * (34 + att / tp) / tp * n_layers / 1e9},
                 "divided the attention term twice"),
                ({**right, "q6_tp_gb": right["q6_sp_gb"]}, "as if sp were on"),
                ({**right, "q6_tp_gb": sbh * (34 + att) * n_layers / 1e9}, "one device"),
                ({**right, "q6_tp_gb": right["q6_tp_gb"] * 1e9 / 2**30}, "GiB")]:
            with pytest.raises(AssertionError, match=words):
                rules.q6_test(_a9_got(wrong, q6=q6), None)


# a9 Q5: the bucket size, judged against the student's own timings (course_utils.data_parallel.overlap)


def _q5_runs(step0, step1, comm=(30.0, 12.0, 10.0, 9.0), wait=(12.0, 3.0, 5.0, 11.0)):
    """Rows shaped like timing_worker's for a9's Q5_SIZES on 2 ranks."""
    sizes, n_buckets = [0.25, 1.0, 4.0, 25.0], [32, 8, 2, 1]
    return [[{"bucket_mb": mb, "n_buckets": n, "grad_mb": 8.03, "step_ms": s, "compute_ms": 19.0,
              "comm_ms": c, "wait_ms": w}
             for mb, n, s, c, w in zip(sizes, n_buckets, steps, comm, wait)]
            for steps in (step0, step1)]


def test_a9_q5_judge_takes_the_students_own_table():
    from grading import judge

    rules = judge.load("a9_activations")
    runs = _q5_runs([41.0, 31.0, 29.0, 36.0], [42.5, 30.5, 33.5, 36.5])
    table = [42.5, 31.0, 33.5, 36.5]                   # the slowest rank per size
    rules.q5_test({"q5_runs": runs, "q5_step_ms": table, "q5_best": 1.0}, {})
    tie = _q5_runs([41.0, 31.0, 31.5, 36.0], [42.5, 30.5, 31.2, 36.5])   # 31.5 within 2% of 31
    rules.q5_test({"q5_runs": tie, "q5_step_ms": [42.5, 31.0, 31.5, 36.5], "q5_best": 4.0}, {})
    for got, words in [
            ({"q5_step_ms": [41.0, 31.0, 29.0, 36.0], "q5_best": 4.0}, "rank 0's step time"),
            ({"q5_step_ms": [41.75, 30.75, 31.25, 36.25], "q5_best": 1.0}, "mean of the ranks"),
            ({"q5_step_ms": [30.0, 12.0, 10.0, 9.0], "q5_best": 25.0}, "communication alone"),
            ({"q5_step_ms": table, "q5_best": 25.0}, "least communication"),
            ({"q5_step_ms": table, "q5_best": 0.25}, "smallest buckets"),
            ({"q5_step_ms": table, "q5_best": 2.0}, "pick one of Q5_SIZES")]:
        with pytest.raises(AssertionError, match=words):
            rules.q5_test({"q5_runs": runs, **got}, {})
    # the largest bucket, when it is not also the least communication
    runs_c = _q5_runs([41.0, 31.0, 29.0, 36.0], [42.5, 30.5, 33.5, 36.5],
                      comm=(30.0, 8.0, 10.0, 9.0), wait=(12.0, 1.0, 5.0, 11.0))
    with pytest.raises(AssertionError, match="one bucket for this 8 MiB model"):
        rules.q5_test({"q5_runs": runs_c, "q5_step_ms": table, "q5_best": 25.0}, {})
    # the shortest wait, when it is not the fastest step
    with pytest.raises(AssertionError, match="shortest wait"):
        rules.q5_test({"q5_runs": _q5_runs([41.0, 31.0, 29.0, 36.0], [42.5, 30.5, 33.5, 36.5],
                                           wait=(12.0, 5.0, 3.0, 11.0)),
                       "q5_step_ms": table, "q5_best": 4.0}, {})


def test_a9_q5_judge_rejects_tables_not_from_real_ranks():
    from grading import judge

    rules = judge.load("a9_activations")
    runs = _q5_runs([41.0, 31.0, 29.0, 36.0], [42.5, 30.5, 33.5, 36.5])
    table = [42.5, 31.0, 33.5, 36.5]
    one_rank = runs[:1]
    wrong_buckets = [[dict(row, n_buckets=1) for row in run] for run in runs]
    negative = [[dict(row, comm_ms=-1.0) for row in run] for run in runs]
    wait_too_long = [[dict(row, wait_ms=row["step_ms"] + 5) for row in run] for run in runs]
    for bad, words in [(one_rank, "2 ranks"), (wrong_buckets, "timing_worker's row"),
                       (negative, "plausible"), (wait_too_long, "longer than the whole step")]:
        with pytest.raises(AssertionError, match=words):
            rules.q5_test({"q5_runs": bad, "q5_step_ms": table, "q5_best": 1.0}, {})


def _count_every_tensor(module, inputs) -> int:
    """a9 Q3 done with a typical mistake: each saved tensor's storage counted each time it is
    saved (parameters left out)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    total = [0]

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return total[0]


def _with_the_weights(module, inputs) -> int:
    from course_utils.memory import activations
    return activations.saved_bytes(lambda: module(*inputs))[0]


@pytest.mark.parametrize("mistake, words", [
    (_with_the_weights, "counts the weights too"),
    (_count_every_tensor, "counts one storage three times"),
    (lambda m, i: _with_the_weights(m, i) and 32, "looks like elements"),  # 128 B / 4
])
def test_a9_q3_visible_check_names_each_mistake_it_lists(mistake, words):
    """Each message of a9 Q3's visible check fires for the mistake it names (a visible case's
    "with the weights" value was once 2,176 B where counting the weight gives 640: it never fired)."""
    nb = nbformat.read(ROOT / "assignments" / "a9_activations" / "a9_activations.ipynb",
                       as_version=4)
    [cell] = [c for c in nb.cells
              if c.metadata.get("nbgrader", {}).get("grade_id") == "q3_test"]
    from torch import nn
    ns = {"__name__": "__main__", "torch": torch, "nn": nn, "saved_activation_bytes": mistake}
    with pytest.raises(AssertionError, match=words):
        exec(cell.source, ns)


# --------------------------------------------------------------------------- a12: checkpointing


def _a12_right(job, save_at):
    """What a right resume of ``job`` from step ``save_at`` submits, rank by rank, built from one
    process's run (the state right after loading, the losses and weights it ends with)."""
    from course_utils.checkpoint import resume_job

    ref = resume_job.reference_run(job, at=save_at)
    at = ref["state_at"]
    return [{"resumed_at": save_at, "losses": list(ref["losses"][save_at:]),
             "weights": {k: v.copy() for k, v in ref["weights"].items()},
             "loaded": {"rank": rank, "weights": {k: v.copy() for k, v in at["weights"].items()},
                        "moments": {k: v.copy() for k, v in at["moments"].items()},
                        **{k: at[k] for k in ("adam_steps", "lr", "schedule_step", "epoch",
                                              "position", "step")},
                        "rng": dict(at["rng"][rank])}} for rank in range(job.world_size)]


def _a12_mistakes(job, save_at):
    """(how a submission goes wrong, words the judge must say) for each named mistake."""
    from course_utils.checkpoint import resume_job

    initial = {n: p.detach().numpy() for n, p in resume_job.build_model(job).named_parameters()}
    lo, hi = resume_job.shard_rows(job.hidden, job.world_size)[1]

    def weights_initial(r):
        r["loaded"]["weights"] = {k: v.copy() for k, v in initial.items()}

    def only_rank0(r):
        for name, w in r["loaded"]["weights"].items():
            if w.ndim and w.shape[0] == job.hidden:
                w[lo:hi] = initial[name][lo:hi]

    def set_loaded(**fields):
        return lambda r: r["loaded"].update(fields)

    def moments_zero(r):
        r["loaded"]["moments"] = {k: 0 * v for k, v in r["loaded"]["moments"].items()}

    def one_rng(r):
        r["loaded"]["rng"]["torch"] = "rank0's"

    return [(weights_initial, "initial ones: the model's state was not loaded"),
            (only_rank0, "only rank 0's rows"),
            (moments_zero, "the optimizer's state was not restored"),
            (set_loaded(adam_steps=1.0), "Adam's step count"),
            (set_loaded(schedule_step=0), "warms up again"),
            (set_loaded(epoch=0), "the sampler is in epoch 0"),
            (set_loaded(position=0), "restore the position"),
            (set_loaded(step=0), "restore trainer.step"),
            (lambda r: r.update(resumed_at=None), "must return the step it resumes at"),
            (lambda r: r["losses"].append(1.0), "differ from one process's uninterrupted run")]


def test_a12_hidden_jobs_are_3_ranks_saved_in_the_middle_of_the_second_epoch():
    """Q3's draws: 3 ranks (the practice job has 2), the checkpoint inside epoch 1 and not at
    its start (so the sampler's epoch and the position both matter), at least one step after
    it; the data size and save point vary."""
    import random

    from course_utils.assess import a12_checkpointing as resume_check
    from grading import judge

    rules = judge.load("a12_checkpointing")
    drawn = [rules.HIDDEN_CASES["q3_test"](random.Random(k))[0] for k in range(200)]
    for ranks, seed, samples, save_at in drawn:
        job = resume_check.job(ranks, seed=seed, samples=samples)
        epoch, position = divmod(save_at, job.steps_per_epoch)
        assert ranks == 3 and epoch == 1 and position > 0 and save_at < job.steps
    assert {(s, a) for _, _, s, a in drawn} == {(18, 4), (18, 5), (24, 5), (24, 6), (24, 7),
                                               (30, 6), (30, 7)}


@pytest.mark.parametrize("seed, samples, save_at", [(4, 24, 5), (9, 18, 4)])
def test_a12_judge_names_each_piece_of_state_lost(seed, samples, save_at):
    """a12 Q3's judge: a right resume passes; each mistake in the loaded state (or in how the run
    ended) is named, on 3-rank jobs as drawn."""
    import copy

    from course_utils.assess import a12_checkpointing as resume_check

    job = resume_check.job(3, seed=seed, samples=samples)
    right = _a12_right(job, save_at)
    resume_check.diagnose(job, save_at, right)
    for mistake, words in _a12_mistakes(job, save_at):
        wrong = copy.deepcopy(right)
        for r in wrong:
            mistake(r)
        with pytest.raises(AssertionError, match=words):
            resume_check.diagnose(job, save_at, wrong)


def test_a12_q2_judge_names_both_of_dalys_intervals():
    """Lecture 12 prints Daly's higher-order estimate beside Young's: a student who gives it (or
    Daly's first correction) for Young's interval is told which it is."""
    import math

    from course_utils.checkpoint import interval as checkpoint_interval
    from course_utils.assess import variants
    from grading import judge

    rules = judge.load("a12_checkpointing")
    g = variants.givens("a12_checkpointing", student="student001")
    n, m, delta, restart = g.q2
    mtbf_s = m / n * 3600
    tau = math.sqrt(2 * delta * mtbf_s)
    right = {"q2_mtbf_h": m / n, "q2_interval_min": tau / 60,
             "q2_lost": checkpoint_interval.waste(tau, delta, mtbf_s, restart)}
    rules.q2_test(_Got(right, givens=g), None)
    for wrong, words in [(checkpoint_interval.daly_interval(delta, mtbf_s), "higher-order"),
                         (tau - delta, "first correction")]:
        with pytest.raises(AssertionError, match=words):
            rules.q2_test(_Got({**right, "q2_interval_min": wrong / 60}, givens=g), None)


def test_a12_judge_tells_one_copy_of_the_generators_from_none():
    """Every rank with rank 0's generator (one key, which DCP writes once) is named apart from
    generators that were never restored."""
    import copy

    from course_utils.assess import a12_checkpointing as resume_check
    from course_utils.checkpoint import resume_job

    job = resume_check.job(3, seed=2)
    right = _a12_right(job, 5)
    same = copy.deepcopy(right)
    for r in same:
        r["loaded"]["rng"]["numpy"] = right[0]["loaded"]["rng"]["numpy"]
    with pytest.raises(AssertionError, match="same state of NumPy's generator.*key of its own"):
        resume_check.diagnose(job, 5, same)
    fresh = copy.deepcopy(right)
    for rank, r in enumerate(fresh):
        r["loaded"]["rng"]["python"] = resume_job.digest(("seeded", rank))
    with pytest.raises(AssertionError, match="Python's generator .* was not restored"):
        resume_check.diagnose(job, 5, fresh)


@pytest.mark.parametrize("answer, words", [("error", "nothing raises"),
                                           ("right", "which tensors the optimizer was given"),
                                           ("wrong-shards", "this rank's shard")])
def test_a12_q4_feedback_names_the_mistake(answer, words):
    """Each wrong choice's message names its misconception and gives no other choice's
    outcome away (issue 50: "right" said the model "never moves", which is the answer)."""
    from grading import judge

    rules = judge.load("a12_checkpointing")
    with pytest.raises(AssertionError, match=words) as said:
        rules.q4_test({"q4_outcome": answer}, None)
    assert "never" not in str(said.value) and "does not move" not in str(said.value)
    rules.q4_test({"q4_outcome": "never-trains"}, None)


# --------------------------------------------------------------------------- a11: at scale


class _Got(dict):
    """What a judge function receives: submitted values, the student's givens, hidden cases."""

    def __init__(self, values, givens=None, cases=None):
        super().__init__(values)
        self.givens, self.cases = givens, cases


def test_a11_reference_rank_bytes_equals_the_simulation_on_every_kind_of_mesh():
    """a11's reference formula against PyTorch's sharding on the fake process group: padded
    chunks, uneven stages, PP = 1 (embedding and head on one stage), TP = 1."""
    from course_utils.models import llama_shapes
    from course_utils.scale import memory as scale_memory

    rank_bytes = _answer("a11_at_scale", "q2", "rank_bytes")
    for model, tp, pp, dp, stage in [("tiny", 2, 1, 3, 0), ("tiny", 1, 3, 5, 1), ("7B", 4, 3, 7, 2),
                                     ("70B", 8, 6, 5, 0), ("405B", 8, 16, 12, 15)]:
        want = scale_memory.rank_state(model, tp, pp, dp, stage * dp * tp)["total"]
        assert rank_bytes(llama_shapes.shape(model), tp, pp, dp, stage) == want


def test_a11_hidden_cases_are_meshes_the_model_can_take():
    import random

    from course_utils.models import llama_shapes
    from grading import judge

    rules = judge.load("a11_at_scale")
    for k in range(200):
        cases = rules.HIDDEN_CASES["q2_test"](random.Random(k))
        assert len(cases) == 3 and len({c[0] for c in cases}) == 3
        for model, tp, pp, dp, stage in cases:
            s = llama_shapes.shape(model)
            assert s.kv_heads % tp == 0 and pp <= s.layers and 0 <= stage < pp and dp > 1


def test_a11_judge_names_padding_norms_embedding_and_the_even_split():
    """Q2's judge on one hidden case: the right bytes pass; each typical mistake is named."""
    from course_utils.models import llama_shapes
    from grading import judge

    rules = judge.load("a11_at_scale")
    case = ["7B", 4, 3, 5, 0]
    right = rules._params(*case)
    name = "rank_bytes on hidden case 1"
    rules.q2_test(_Got({name: 16 * right}, cases=[case]), None)
    for flags, words in [(dict(pad=False), "not rounded up"), (dict(norms_whole=False), "whole"),
                         (dict(embedding=False), "embedding is missing"),
                         (dict(even=True), "everything split evenly")]:
        wrong = int(16 * rules._params(*case, **flags))
        with pytest.raises(AssertionError, match=words):
            rules.q2_test(_Got({name: wrong}, cases=[case]), None)
    last = ["7B", 4, 4, 5, 3]        # the last of 4 stages: 7 layers, 8 under the even split
    rules.q2_test(_Got({name: 16 * rules._params(*last)}, cases=[last]), None)
    with pytest.raises(AssertionError, match="layers alone evenly"):
        rules.q2_test(_Got({name: int(16 * rules._params(*last, split="even"))}, cases=[last]),
                      None)
    with pytest.raises(AssertionError, match="return an int"):
        rules.q2_test(_Got({name: 16.0 * right}, cases=[case]), None)
    assert llama_shapes.param_count("7B") > right


def test_a11_q3_judge_names_the_other_plans_count_and_the_root_gathered_twice():
    """A student who counts the block plan's all-reduces (Megatron's 4 a layer, with or
    without the embedding's) is told which plan that is, not only 'wrong'."""
    from course_utils.assess import variants
    from grading import judge

    rules = judge.load("a11_at_scale")
    g = variants.givens("a11_at_scale", student="student001")
    step = _answer("a11_at_scale", "q3_practice", "step_traffic")
    from course_utils.models import llama_shapes

    model, tp, pp, dp = g.q3
    calls, tp_gb, dp_gb = step(llama_shapes.shape(model), tp, pp, dp)
    right = {"q3_tp_calls": calls, "q3_tp_gb": tp_gb, "q3_dp_gather_gb": dp_gb}
    rules.q3_test(_Got(right, givens=g), None)
    n = len(llama_shapes.stage_layers(llama_shapes.shape(model).layers, pp, 0))
    root = (dp - 1) * 2 * -(-(llama_shapes.shape(model).vocab // tp) // dp) * \
        llama_shapes.shape(model).hidden / 1e9
    for key, value, words in [("q3_tp_calls", 4 * n, "block plan.*per_linear"),
                              ("q3_tp_calls", 4 * n + 1, "block plan.*per_linear"),
                              ("q3_tp_gb", tp_gb * (4 * n + 1) / calls, "block plan"),
                              ("q3_tp_gb", tp_gb / 2, "2\\(g-1\\)/g"),
                              ("q3_dp_gather_gb", dp_gb + root, "gathered once")]:
        with pytest.raises(AssertionError, match=words):
            rules.q3_test(_Got({**right, key: value}, givens=g), None)
