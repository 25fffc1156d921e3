"""Assignment a13 (time at scale) at the value level, on every variant of its givens: the
reference answers (``solutions/``) equal lecture 13's model (``step_time.transformer.predict``),
the notebook's rules are the model's (the bubble's closed form is what the simulator plays),
each typical mistake, computed here the way a student would make it, is named by the judge, and
no graded answer is a number lecture 13 prints.

Instructor-only: it reads ``solutions/`` and the judge.
"""

from __future__ import annotations

import functools
import itertools
import re

import nbformat
import pytest

from conftest import ROOT
from course_utils.assess import variants
from course_utils.collectives import cost
from course_utils.pipeline import schedule
from course_utils.step_time import hardware, published, terms, transformer
from grading import expected, judge

NAME = "a13_time_at_scale"
OPTIONS = variants.givens_of(NAME)


@functools.lru_cache(maxsize=None)
def _solution():
    """The solution's code cells run in order (answers, practice checks; not the test cells),
    with the base givens: its namespace (``step_terms``, ``mfu``, the answers), and the
    notebook. (Cached, not a module-scoped fixture: the file's tests share no worker.)"""
    nb = nbformat.read(ROOT / "solutions" / NAME / f"{NAME}.ipynb", as_version=4)
    scope: dict = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and not (meta.get("grade") and not meta.get("solution")):
            exec(compile(cell.source, f"{NAME}:{meta.get('grade_id')}", "exec"), scope)
    return scope, nb


@pytest.fixture
def rules():
    return judge.load(NAME)


@pytest.fixture
def notebook():
    return _solution()


def _got(values: dict, **givens) -> judge.Values:
    got = judge.Values(values.items())
    got.givens = variants.givens(NAME, on=False).replaced(**givens)
    return got


def _plan(option):
    model, device, tp, pp, dp, batch, seq = option
    return published.__dict__[model], getattr(hardware, device), tp, pp, dp, batch, seq


def _predict(a, hw, tp, pp, dp, batch, seq):
    return transformer.predict(transformer.Job(a, tp=tp, pp=pp, dp=dp, global_batch=batch,
                                               seq=seq), hw)


# ------------------------------------------------------------------ the rules are the model's


@pytest.mark.parametrize("option", OPTIONS["q1"].options, ids=str)
def test_reference_step_terms_equal_predict_and_pass_the_judge(option, notebook, rules):
    """The notebook's rules (its reference ``step_terms``) give predict()'s terms exactly, on
    every Q1 variant; the judge takes them."""
    scope, _ = notebook
    got = scope["step_terms"](*_plan(option))
    t = _predict(*_plan(option)).terms
    for term in terms.TERMS:
        assert got[term] == pytest.approx(getattr(t, term), rel=1e-9, abs=1e-15), term
    assert got["step"] == pytest.approx(t.total, rel=1e-9)
    rules.q1_test(_got({"q1_compute_s": got["compute"], "q1_tp_s": got["tp"],
                        "q1_bubble_s": got["bubble"], "q1_step_s": got["step"]}, q1=option), None)


def test_the_bubble_rule_is_what_the_simulator_plays():
    """The notebook's closed form, (p-1)(F'+B') + 2c((p-1) m / p + p - 2), is 1F1B's span less
    the work, as ``schedule.simulate`` plays it with sends between stages, for m a multiple of
    p, and every Q1 and Q2 plan has such an m."""
    for p, k, b, c in itertools.product((2, 3, 4, 8, 16), (1, 2, 5), (2.0, 2.2), (0.0, 0.03, 0.4)):
        m = k * p
        span = schedule.simulate("1f1b", p, m, backward_ratio=b, comm_time=c).makespan
        assert span - m * (1 + b) == pytest.approx(
            (p - 1) * (1 + b) + 2 * c * ((p - 1) * m / p + p - 2), rel=1e-12, abs=1e-12)
    plans = [(o[3], o[5] // o[4]) for o in OPTIONS["q1"].options]
    plans += [(plan[1], o[3] // plan[2]) for o in OPTIONS["q2"].options for plan in o[4:]]
    assert all(m % pp == 0 for pp, m in plans), plans


def test_q1_variants_meet_every_rule():
    """At least 8 variants; the sends between stages on NVLink in some and on the network in
    others; TP 1 nowhere (its collectives are a term); K and V projections memory-bound in some
    (the roofline's other side) and none in others; DP exposed and hidden both present."""
    options = OPTIONS["q1"].options
    assert len(options) >= 8 and len(set(options)) == len(options)
    inside = {o[2] * o[3] <= 8 for o in options}
    assert inside == {True, False}
    assert all(o[2] > 1 for o in options)
    bound = set()
    for o in options:
        a, hw, tp, *_ = _plan(o)
        kv = a.kv_heads * a.head_dim // tp
        n = o[6]
        bound.add(hardware.matmul_s(n, a.hidden, kv, hw)
                  > hardware.matmul_flops(n, a.hidden, kv) / hw.achieved_flops)
        t = _predict(*_plan(o)).terms
        assert t.dp_hidden > 0 and t.bubble > 0 and t.tp > 0
    assert bound == {True, False}


def test_q2_plans_share_their_gpus_and_differ_by_5_percent_and_compute_alone_misleads():
    """Each pair of plans runs on the same GPUs and their steps differ by 5 % or more; the
    answers are A and B both; in some variants the plan with less compute per rank is the
    slower (compute alone picks it), in others compute ties; the judge names that choice."""
    faster, misled, ties = set(), 0, 0
    for option in OPTIONS["q2"].options:
        model, device, seq, batch, plan_a, plan_b = option
        preds = [_predict(published.__dict__[model], getattr(hardware, device), *plan, batch, seq)
                 for plan in (plan_a, plan_b)]
        assert preds[0].job.gpus == preds[1].job.gpus, option
        steps = [p.terms.total for p in preds]
        assert max(steps) / min(steps) >= 1.05, option
        compute = [p.terms.compute for p in preds]
        right = "AB"[steps.index(min(steps))]
        faster.add(right)
        if abs(compute[0] - compute[1]) <= 1e-3 * max(compute):
            ties += 1
            continue
        if "AB"[compute.index(min(compute))] != right:
            misled += 1
    assert faster == {"A", "B"} and misled >= 2 and ties >= 1


@pytest.mark.parametrize("option", OPTIONS["q2"].options, ids=str)
def test_q2_reference_and_the_compute_alone_choice(option, notebook, rules):
    scope, _ = notebook
    model, device, seq, batch, plan_a, plan_b = option
    a, hw = published.__dict__[model], getattr(hardware, device)
    got = {f"q2_step_{k}_s": scope["step_terms"](a, hw, *plan, batch, seq)["step"]
           for k, plan in (("a", plan_a), ("b", plan_b))}
    right = "A" if got["q2_step_a_s"] < got["q2_step_b_s"] else "B"
    rules.q2_test(_got({**got, "q2_faster": right}, q2=option), None)
    wrong = "B" if right == "A" else "A"
    compute = {k: scope["step_terms"](a, hw, *plan, batch, seq)["compute"]
               for k, plan in (("A", plan_a), ("B", plan_b))}
    words = ("compute the same" if abs(compute["A"] - compute["B"]) <= 1e-3 * compute["A"]
             else "computes less" if compute[wrong] < compute[right] else "the longer")
    with pytest.raises(AssertionError, match=words):
        rules.q2_test(_got({**got, "q2_faster": wrong}, q2=option), None)
    # a step made of compute alone, and plan B's step given for plan A, are named
    with pytest.raises(AssertionError, match="compute alone"):
        rules.q2_test(_got({**got, "q2_step_a_s": compute["A"], "q2_faster": right}, q2=option),
                      None)
    with pytest.raises(AssertionError, match="plan B's step"):
        rules.q2_test(_got({**got, "q2_step_a_s": got["q2_step_b_s"], "q2_faster": right},
                           q2=option), None)


# ---------------------------------------------------------- each typical mistake named, Q1, Q3


def _student_mistakes(option, step_terms):
    """(answer name, wrong value, words the judge must say): each typical mistake computed the
    way a student makes it, not from the judge's list."""
    a, hw, tp, pp, dp, batch, seq = _plan(option)
    right = step_terms(a, hw, tp, pp, dp, batch, seq)
    peak = step_terms(a, hw.but(efficiency=1.0), tp, pp, dp, batch, seq)
    m, act = batch // dp, seq * a.hidden * 2
    six_n = m * seq * 6 * transformer.param_count(a) / (tp * pp) / hw.achieved_flops
    sent = m * a.layers / pp * 4 * cost.ring_bytes("all_reduce", act, tp)
    shard = transformer.param_count(a) / (tp * pp)
    dp_time = (cost.ring_time_s(4 * shard, dp, hw.inter.alpha_s, hw.inter.bytes_per_s,
                                "reduce_scatter")
               + cost.ring_time_s(2 * shard, dp, hw.inter.alpha_s, hw.inter.bytes_per_s,
                                  "all_gather"))
    return right, [
        ("q1_compute_s", peak["compute"], "datasheet peak"),
        ("q1_compute_s", six_n, "6N FLOPs a token"),
        ("q1_tp_s", sent, "bytes, not seconds"),
        ("q1_bubble_s", 0.0, "bubble is missing"),
        ("q1_step_s", right["step"] - right["bubble"], "leaves the pipeline bubble out"),
        ("q1_step_s", right["step"] - right["dp_exposed"] + dp_time, "compute hides"),
        ("q1_step_s", peak["step"], "datasheet peak"),
    ]


@pytest.mark.parametrize("option", OPTIONS["q1"].options, ids=str)
def test_q1_judge_names_each_typical_mistake(option, notebook, rules):
    scope, _ = notebook
    right, mistakes = _student_mistakes(option, scope["step_terms"])
    values = {"q1_compute_s": right["compute"], "q1_tp_s": right["tp"],
              "q1_bubble_s": right["bubble"], "q1_step_s": right["step"]}
    for name, wrong, words in mistakes:
        with pytest.raises(AssertionError, match=words):
            rules.q1_test(_got({**values, name: wrong}, q1=option), None)


@pytest.mark.parametrize("option", OPTIONS["q3"].options, ids=str)
def test_q3_reference_and_each_typical_mistake(option, notebook, rules):
    scope, _ = notebook
    model, device, seq, tokens_per_s = option
    a, hw = published.__dict__[model], getattr(hardware, device)
    right = scope["mfu"](a, hw, seq, tokens_per_s)
    assert right == pytest.approx(tokens_per_s * transformer.flops_per_token(a, seq)
                                  / hw.peak_flops, rel=1e-12)
    assert 0.3 < right < 0.6
    rules.q3_test(_got({"q3_mfu": right}, q3=option), None)
    for wrong, words in [(tokens_per_s * 6 * transformer.param_count(a) / hw.peak_flops, "6N"),
                         (right / hw.efficiency, "achieved rate"), (100 * right, "percentage")]:
        with pytest.raises(AssertionError, match=words):
            rules.q3_test(_got({"q3_mfu": wrong}, q3=option), None)


def test_the_typical_mistake_snippet_is_named_on_every_variant(rules):
    """The synthetic class's typical a13 student (grading/snippets.py: MFU with 6N) is told what
    it did, on every Q3 variant."""
    from grading.snippets import TYPICAL_MISTAKES

    gid, code, words = TYPICAL_MISTAKES[NAME]
    for option in OPTIONS["q3"].options:
        scope = {"G": variants.givens(NAME, on=False).replaced(q3=option)}
        exec(code, scope)
        with pytest.raises(AssertionError, match=words):
            rules.q3_test(_got({"q3_mfu": scope["q3_mfu"]}, q3=option), None)


# ------------------------------------------------------------------ what the student is shown


def test_q4_states_the_rows_figures(notebook):
    """Q4's figures are published.rows()'s for Megatron-LM's 1T run, as lecture 13's table
    prints them."""
    _, nb = notebook
    [run] = [r for r in published.RUNS if r.label.startswith("Megatron GPT 1T")]
    rows = published.rows((run,))
    text = next(c.source for c in nb.cells if c.cell_type == "markdown" and "## Q4" in c.source)
    tflops = next(r for r in rows if r["kind"] == "tflops_per_gpu")
    mfu = next(r for r in rows if r["kind"] == "mfu")
    t = tflops["terms"]
    shares = [round(100 * t[k] / t["total"]) for k in ("compute", "tp", "bubble", "dp_exposed")]
    for shown in (f"**{tflops['predicted']:.0f}**", f"**{tflops['published']:.0f}**",
                  f"{100 * mfu['predicted']:.1f} % MFU", f"({100 * mfu['published']:.0f} %)",
                  f"+{100 * tflops['error']:.0f} %", f"**{tflops['closing']:.2f}**",
                  "{} % compute, {} % TP, {} % bubble and sends, {} % exposed DP".format(*shares),
                  f"{run.hw.efficiency * run.hw.peak_flops / 1e12:.1f} / "
                  f"{run.hw.peak_flops / 1e12:.0f} = {run.hw.efficiency:.2f}"):
        assert shown in " ".join(text.split()), shown


def _lecture_13_texts() -> list[str]:
    """What lecture 13 prints that an answer could be copied from: the published runs' table
    and the predictions for Llama 3 405B (its terms, step, throughput, MFU)."""
    out = [published.table(published.rows())]
    for run in published.RUNS:
        if "405B" not in run.label:
            continue
        p = transformer.predict(run.job, run.hw)
        out.append(terms.format_terms(p.terms))
        out.append(f"step {p.step_s:.2f} s, {p.tflops_per_gpu():.0f} TFLOP/s per GPU, MFU "
                   f"{100 * p.mfu():.1f} %, {p.tokens_per_s_per_gpu():,.0f} tokens/s per GPU")
    return out


def test_no_graded_answer_is_a_number_lecture_13_or_another_lecture_prints(rules):
    """Every variant's right values (the judge's) against the texts lecture 13 prints and the
    committed lectures' text and outputs (tests/test_assignments.py's rule: exactly, or rounded
    to 3 or more significant digits). Q1's answers are not Q2's either."""
    from test_assignments import _distinctive, _lecture_texts, _shows

    texts = _lecture_13_texts() + [text for _, text in _lecture_texts()]
    shown = []
    answers = {}
    for gid, g in expected.variant_tour(rules, NAME):
        for call in expected.checked(rules, gid, g):
            value = call["expected"]
            if not _distinctive(value):
                continue
            answers.setdefault(gid, []).append(value)
            shown += [(gid, call["name"], value) for text in texts if _shows(text, value)]
    assert shown == []
    q1, q2 = answers["q1_test"], answers["q2_test"]
    assert not [(x, y) for x in q1 for y in q2 if abs(x - y) <= 1e-3 * max(x, y)]


def test_the_release_shows_no_model_call_and_the_helpers_are_flagged(rules):
    """The released notebook's code calls none of the helpers that compute an answer (the
    students may not either), and HELPERS_NOT_ALLOWED names predict for Q1 and Q2 and
    flops_per_token for Q3."""
    release = nbformat.read(ROOT / "assignments" / NAME / f"{NAME}.ipynb", as_version=4)
    code = "\n".join(c.source for c in release.cells if c.cell_type == "code")
    for helper in ("predict", "assemble", "rows(", "flops_per_token", "published_value"):
        assert helper not in code, helper
    assert re.search(r"transformer\.predict", " ".join(rules.HELPERS_NOT_ALLOWED["q1"]))
    assert "step_time.transformer.predict" in rules.HELPERS_NOT_ALLOWED["q2"]
    assert "step_time.transformer.flops_per_token" in rules.HELPERS_NOT_ALLOWED["q3"]
