"""Every assignment: release in sync and free of solutions; the reference passes its own tests;
an autograde round trip gives the blank release 0 (and, where graded in a kernel, the solution
full marks and a typical mistake partial marks); feedback names mistakes without showing hidden
tests.

The round trip is the shared autograde of ``conftest.graded`` (the same run the integrity tests
use): its ``unanswered`` student is the blank release, ``correct`` the reference (in a kernel on
``synthetic.KERNEL_EVERYTHING``; on values alone everywhere, after the reference's own run in
the sandbox: tests/test_grading_integrity.py) and ``typical_mistake`` a typical mistake
(``grading.synthetic.TYPICAL_MISTAKES``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from grading import judge, synthetic
from grading.synthetic import TYPICAL_MISTAKES

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = sorted(p.stem for p in (ROOT / "authoring" / "assignments").glob("*.py"))
pytestmark = pytest.mark.slow


def _normalized(path_or_nb) -> list:
    """What matters in a released notebook: cell types, sources, nbgrader/lock metadata."""
    nb = (json.loads(path_or_nb.read_text(encoding="utf-8")) if isinstance(path_or_nb, Path)
          else json.loads(nbformat.writes(path_or_nb)))
    keep = ("nbgrader", "deletable", "editable", "tags")
    return [nb["metadata"].get("kernelspec")] + [
        (c["cell_type"], "".join(c["source"]), {k: c["metadata"].get(k) for k in keep})
        for c in nb["cells"]]


def _hidden_lines(name: str) -> list[str]:
    """Lines of the solution notebook that only its solution and hidden-test regions contain."""
    src = (ROOT / "solutions" / name / f"{name}.ipynb").read_text(encoding="utf-8")
    nb = nbformat.reads(src, as_version=4)
    hidden, visible, inside = [], set(), False
    for cell in nb.cells:
        for line in cell.source.splitlines():
            tag = line.strip()
            if tag in ("### BEGIN HIDDEN TESTS", "### BEGIN SOLUTION"):
                inside = True
            elif tag in ("### END HIDDEN TESTS", "### END SOLUTION"):
                inside = False
            elif inside and len(tag) > 12:
                hidden.append(tag)
            elif not inside:
                visible.add(tag)
    return [line for line in hidden if line not in visible]


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_release_is_in_sync_with_solutions(name, graded, reference):
    """The committed release equals the one nbgrader generates from solutions/ now, its
    visible checks sealed from the reference run (``grading.visible``)."""
    from grading import visible

    committed = ROOT / "assignments" / name / f"{name}.ipynb"
    from grading import judge

    generated = nbformat.read(graded(name).release / f"{name}.ipynb", as_version=4)
    # (the committed sealed tables are checked, not made again: visible.committed_sealer)
    tables: dict = {}
    visible.seal_release(generated, reference(name)[f"{name}.ipynb"]["visible"],
                         set(getattr(judge.load(name), "MEASURED", set())),
                         sealer=visible.committed_sealer(nbformat.read(committed, as_version=4)),
                         assignment=name, tables=tables)
    assert _normalized(committed) == _normalized(generated), (
        f"assignments/{name} is out of date: run scripts/build_notebooks.py {name}")
    data = visible.SEALED_DIR / f"{name}.json"
    assert (data.read_text() if data.exists() else "") == (
        visible.tables_json(tables) if tables else ""), (
        f"{data.relative_to(ROOT)} is out of date: run scripts/build_notebooks.py {name}")


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_release_has_no_solutions_or_hidden_tests(name):
    text = (ROOT / "assignments" / name / f"{name}.ipynb").read_text(encoding="utf-8")
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    hidden = _hidden_lines(name)
    assert hidden, "the solution notebook should have solutions and hidden tests"
    released = {line.strip() for cell in nbformat.reads(text, as_version=4).cells
                for line in cell.source.splitlines()}
    leaked = [line for line in hidden if line in released]
    assert not leaked, f"hidden lines leaked into the release: {leaked[:3]}"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_reference_solution_passes_every_test(name, reference):
    """The solution runs with no error output, no test cell writes to stderr, every test cell
    submits values, and the judge passes every one (``reference_run`` raises otherwise)."""
    for notebook, run in reference(name).items():
        assert not run["problems"], f"{notebook}: {run['problems'][:3]}"
        assert run["submissions"] and all(run["submissions"].values()), (
            f"{notebook}: a test cell submitted nothing")


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_autograde_round_trip(name, graded):
    """blank release -> 0; solution -> full autograded marks, and a typical mistake -> partial
    marks with the mistake named in the feedback, where graded in a kernel; feedback hides
    hidden tests."""
    from nbgrader.api import Gradebook

    g = graded(name)
    data = g.data
    mistake = TYPICAL_MISTAKES.get(name)
    # (in a kernel on a1, which grades every kind there, and a typical mistake where its code
    # needs the notebook; elsewhere on values: test_each_value_submission_gets_what_it_deserves)
    right, typical = "correct" in g.cases, mistake and "typical_mistake" in g.cases
    assert right or synthetic.kernel_kinds(name) is not None
    with Gradebook(f"sqlite:///{data / 'gradebook.db'}") as gb:
        assignment = gb.find_assignment(name)
        auto_max = sum(c.max_score for nb in assignment.notebooks for c in nb.grade_cells
                       if not c.cell_type == "markdown")
        assert auto_max > 0
        bob = gb.find_submission(name, "unanswered")
        assert bob.code_score == 0, "a blank submission gained points"
        if right:
            alice = gb.find_submission(name, "correct")
            assert alice.code_score == pytest.approx(auto_max), "reference lost autograded points"
            assert alice.needs_manual_grade  # the explanation question waits for the instructor
        if typical:
            carol = gb.find_submission(name, "typical_mistake")
            assert 0 < carol.code_score < auto_max

    if typical:
        carol_html = (data / "feedback" / "typical_mistake" / name / f"{name}.html").read_text(
            "utf-8")
        assert mistake[2] in carol_html, "feedback does not name the mistake"
    if right:  # feedback before step 5 says so, and gives the automatic part
        page = (data / "feedback" / "correct" / name / f"{name}.html").read_text("utf-8")
        assert "Score: not graded yet /" in page and "written answers: not graded yet" in page
        assert f"Automatic score: {auto_max:.1f} / {auto_max:.1f}" in page
    html = (data / "feedback" / "unanswered" / name / f"{name}.html").read_text(encoding="utf-8")
    assert "NotImplementedError" in html
    # the blank release: every question reads "not answered" in the report (make check prints
    # it) and the feedback, never the error it caused (RankError, KeyError, NameError: issue 36)
    blank = g.results["unanswered"]
    assert blank.cells and all(c.message == judge.NOT_ANSWERED for c in blank.cells), [
        (c.grade_id, c.message) for c in blank.cells if c.message != judge.NOT_ANSWERED]
    assert html.count("NotAnswered: " + judge.NOT_ANSWERED) == len(blank.cells)
    assert "BEGIN HIDDEN TESTS" not in html
    plain = re.sub(r"<[^>]+>", "", html)
    leaked = [line for line in _hidden_lines(name) if line in plain and "check_" in line]
    assert not leaked, f"feedback shows hidden test code: {leaked[:3]}"


# ------------------------------------------------------------- graded answers are not in lectures

_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?(?![\w.])", re.IGNORECASE)

# Graded values that also appear in a lecture by coincidence, not as the answer to the same
# question: (assignment, submitted name, value) -> why it gives nothing away. Every entry must
# still match (test_no_graded_answer_is_shown_in_a_lecture fails on a stale one).
COINCIDENCES: dict[tuple[str, str, float], str] = {
    ("a1_training_state", "q3_state_gb", 182.0):
        "182 is a slice size in elements in lecture 3 (ZeRO with D = 3: [182, 352, 88])",
    ("a2_data_parallel", "global_mean_grad", 3.5):
        "3.5 is a per-rank bubble in lecture 5's interleaved schedule",
    ("a2_data_parallel", "w_new_0", 0.55):
        "0.55 is lecture 10's gradient-clipping norm (a setting of its run, not an SGD step)",
    ("a5_pipeline", "m_a", 161):
        "161 is lecture 11's count of TP all-reduces under the block plan (4 x 40 layers + 1), "
        "not a number of microbatches",
    ("a5_pipeline", "batch_a", 54):
        "54 is the days of Llama 3's pre-training in lecture 12 (419 interruptions in 54 days)",
    ("a11_at_scale", "q1_last_gb", 14.046178096):
        "one variant's last stage (70B on TP 4 x PP 6 x DP 3) rounds to 14.0, which lecture 2's "
        "collectives demo prints as a sum of small tensors (12.0, 14.0)",
    ("a8_jax_sharding", "w_bytes_2d", 614400):
        "614,400 is lecture 10's FLOPs per token (6N for its 102,400 parameters), not bytes",
    ("a12_checkpointing", "q1_rank_gb", 1.675):
        "1.68 s is lecture 13's pipeline bubble of Llama 3 405B on 8,192 H100s (seconds)",
    ("a6_device_mesh", "params_per_shard_b", 5.9375):
        "5.94 s is the step of lecture 13's widget at its opening plan (Llama 3 405B on 16,384 "
        "H100s)",
    ("a5_pipeline", "zb_bubble_ms", 76):
        "76.0 % is lecture 13's predicted MFU of Megatron-LM's 1T run and 76 % its "
        "leave-one-out miss on torchtitan's 8B run",
    ("a9_activations", "q6_tp_gb", 46.9762048):
        "47.0 % is Megatron-LM's published MFU of its 145.6B run, in lecture 13's table",
    **{("a4_tensor_parallel", name, 512): "ffn / t of the base numbers (4096 / 8); powers of "
       "two appear throughout the lectures as sizes (no other variant's shard is shown)"
       for name in ("w1_local[1]", "w2_local[0]", "dtensor_up_local[0]")},
}


def _distinctive(value: object) -> bool:
    """A graded number worth looking for: not a bool, not a small integer (a rank, a count of
    stages: such values occur everywhere and a student cannot copy them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not (float(value).is_integer() and abs(value) <= 16)


def _shows(text: str, value: float) -> bool:
    """Whether ``text`` writes ``value``: exactly, or rounded to 3 or more significant digits."""
    for token in _NUMBER.findall(text):
        plain = token.replace(",", "")
        try:
            number = float(plain)
        except ValueError:
            continue
        if number == value:
            return True
        if "." in plain and "e" not in plain.lower():
            digits = len(plain.lstrip("-").replace(".", "").lstrip("0"))
            if digits >= 3 and round(value, len(plain.split(".")[1])) == number:
                return True
    return False


def _lecture_texts() -> list[tuple[str, str]]:
    """(where, text) for every markdown cell and every output of every lecture notebook, except
    the outputs of measurements (cells tagged ``nbval-ignore-output``: timings that differ on
    every run, and ``course-measured``: one machine's timings read from a cached benchmark run;
    a match there is chance, not a printed answer)."""
    texts = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                texts.append((f"{path.stem} cell {i}", cell.source))
            if {"nbval-ignore-output", "course-measured"} & set(cell.metadata.get("tags", [])):
                continue
            for out in cell.get("outputs", []):
                text = out.get("text") or out.get("data", {}).get("text/plain", "")
                texts.append((f"{path.stem} cell {i} output", "".join(text)))
    return texts


def _numbers(givens) -> set[float]:
    """Every number among a variant's givens (flattened): an answer that is one of them (a4's
    shard keeps all h rows) is shown to the student in the question by design."""
    flat = [x for v in dict(givens).values() for x in (v if isinstance(v, tuple) else (v,))]
    return {float(x) for x in flat if isinstance(x, (int, float)) and not isinstance(x, bool)}


def _graded_values(name: str, reference) -> list[tuple[str, float]]:
    """``(submitted name, value)`` of every graded answer a student could copy: the reference's
    submissions and, where the numbers vary per student (issue 26), every variant's right
    values (the judge's, over every combination of the options). Left out: values that are
    one of the variant's own givens (the question shows them), values a student's
    function returns on hidden inputs (names with a call in them, the test cells whose inputs
    are drawn per submission, ``HIDDEN_CASES``), values the judge lists in ``MEASURED`` (each
    student's own timings), and values that are not distinctive."""
    from course_utils.assess import givens as assignment_givens
    from course_utils.assess import variants
    from grading import expected, judge

    rules = judge.load(name)
    measured = getattr(rules, "MEASURED", set())
    drawn = set(getattr(rules, "HIDDEN_CASES", {}))
    varies = name in assignment_givens.GIVENS
    base = _numbers(variants.base(name)) if varies else set()
    pairs = [(gid, n, v, base) for run in reference(name).values()
             for gid, subs in run["submissions"].items() for n, v in subs]
    if varies:
        for gid, g in expected.variant_tour(rules, name):
            pairs += [(gid, c["name"], c["expected"], _numbers(g))
                      for c in expected.checked(rules, gid, g)]
    out = []
    for gid, sub_name, value, givens in pairs:
        if ("(" in sub_name or gid in drawn or sub_name in measured or not _distinctive(value)
                or float(value) in givens or (sub_name, float(value)) in out):
            continue
        out.append((sub_name, float(value)))
    return out


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_no_graded_answer_is_shown_in_a_lecture(name, reference):
    """Every graded answer (:func:`_graded_values`: the reference's, and every variant's where
    the numbers vary per student) is absent from every lecture's text and outputs, unless
    listed in COINCIDENCES with why."""
    shown, used = [], set()
    texts = _lecture_texts()
    for sub_name, value in _graded_values(name, reference):
        where = [w for w, text in texts if _shows(text, value)]
        key = (name, sub_name, value)
        if where and key in COINCIDENCES:
            used.add(key)
        elif where:
            shown.append(f"{sub_name} = {value:g} is shown in {', '.join(where[:3])}")
    assert not shown, "graded answers a student can copy from a lecture:\n" + "\n".join(shown)
    stale = [k for k in COINCIDENCES if k[0] == name and k not in used]
    assert not stale, f"COINCIDENCES entries that no longer match anything: {stale}"


_SEALED_PIECE = re.compile(r"'[0-9a-f]+:?'")


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_no_graded_answer_is_shown_in_its_own_release(name, reference):
    """The same scan over the released assignment itself: no question's text, given or visible
    check shows a graded value of any question (one question's text once gave another's
    answers), unless listed in COINCIDENCES with why. The same values as the lecture scan."""
    nb = nbformat.read(ROOT / "assignments" / name / f"{name}.ipynb", as_version=4)
    # (the sealed mistakes' ciphers are hex, wrapped over several string literals: a piece such
    # as '66' is no number the student reads)
    texts = [(f"{name} cell {i}", _SEALED_PIECE.sub("''", cell.source))
             for i, cell in enumerate(nb.cells)]
    shown = []
    for sub_name, value in _graded_values(name, reference):
        if (name, sub_name, value) in COINCIDENCES:
            continue
        where = [w for w, text in texts if _shows(text, value)]
        if where:
            shown.append(f"{sub_name} = {value:g} is shown in {', '.join(where[:3])}")
    assert not shown, "graded answers a student can read in the assignment:\n" + "\n".join(shown)


def test_the_lecture_scan_finds_numbers_as_written():
    """The matcher behind test_no_graded_answer_is_shown_in_a_lecture."""
    assert _shows("ZeRO-2 per rank: 26.25 GB", 26.25)
    assert _shows("= 208 GB = 193.7 GiB", 193.71)
    assert _shows("idle 0.1579", 3 / 19)
    assert _shows("1,024 bytes", 1024)
    assert not _shows("0.12 s", 0.125)          # two digits: too coarse to count
    assert not _shows("layer 27b", 27) and not _shows("x3.5e9", 3.5)
    assert not _shows("280 GB", 28) and not _shows("v1.27", 27)
    assert _distinctive(27) and _distinctive(0.5) and not _distinctive(8) and not _distinctive(True)


# ------------------------------------------------------------------- a5 Q4's graded timelines

# What a5 Q4's graded timelines are: name -> (schedule, P, m, v). The question draws them from
# course_utils.pipeline.schedule; lecture 5 prints and draws other ones (P = 4, m = 8).
A5_Q4_TIMELINES = {"A": ("1f1b", 5, 7, 1), "B": ("gpipe", 5, 7, 1), "C": ("interleaved", 2, 4, 2)}


def _drawn_timelines(text: str) -> dict[str, list[list[str]]]:
    """Timeline name -> its cells, one list per rank, from text that writes ``Timeline X``
    headers and ``rank r | F0 ...`` rows; a timeline written in parts (halves) is joined."""
    timelines: dict[str, list[list[str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.removeprefix("#").strip()
        header = re.match(r"Timeline ([A-Z])\b", line)
        row = re.match(r"rank (\d+) \|(.*)$", line)
        if header:
            current = timelines.setdefault(header.group(1), [])
        elif row and current is not None:
            rank = int(row.group(1))
            while len(current) <= rank:
                current.append([])
            current[rank] += row.group(2).split()
    return timelines


def _rows(timeline_text: str) -> list[list[str]]:
    """The cells of each rank of a ``format_timeline`` chart."""
    return [line.split("|", 1)[1].split() for line in timeline_text.splitlines()]


def test_a5_graded_timelines_are_simulated_and_not_shown_in_lecture_5():
    """a5 Q4's graded timelines are what pipeline_schedule simulates for the stated schedule,
    P and m; the reference answers and the judge agree with the simulation; and no lecture
    prints any of them (lecture 5 prints its own 1F1B timeline, which a student could copy)."""
    from course_utils.pipeline import schedule as ps
    from grading import judge

    source = (ROOT / "authoring" / "assignments" / "a5_pipeline.py").read_text(encoding="utf-8")
    q4 = source[source.index("## Q4."):source.index("## Q5.")]
    graded_text = q4[q4.index("Now the graded question"):q4.index("[answer q4]")]
    assert "P = 5 stages and m = 7 microbatches in timelines A and B" in graded_text
    assert "P = 2\n# and m = 4 in timeline C" in graded_text
    drawn = _drawn_timelines(graded_text)
    assert sorted(drawn) == sorted(A5_Q4_TIMELINES)

    answer = q4[q4.index("[answer q4]"):q4.index("[test q4_test")]
    got = {}
    for name, (schedule, p, m, v) in A5_Q4_TIMELINES.items():
        timeline = ps.simulate(schedule, p=p, m=m, v=v)
        assert drawn[name] == _rows(ps.format_timeline(timeline)), (
            f"timeline {name} is not what pipeline_schedule simulates for {schedule}, P={p}, "
            f"m={m}, v={v}")
        assert f'schedule_{name.lower()} = "{schedule}"' in answer
        got[f"schedule_{name.lower()}"] = schedule
        peak = timeline.peak_activations()[0]
        if v == 1:  # the question asks for rank 0's peak in A and B
            assert peak.is_integer()
            assert f"peak_{name.lower()}_rank0 = {int(peak)}\n" in answer
            got[f"peak_{name.lower()}_rank0"] = int(peak)
        if name == "A":  # and which rank holds the most microbatches at its peak
            peaks = timeline.peak_activations()
            most = max(range(p), key=lambda r: peaks[r])
            assert f"most_activations_rank_a = {most}\n" in answer
            got["most_activations_rank_a"] = most
    judge.load("a5_pipeline").q4_test(got, got)  # the judge expects the simulated answers

    for where, text in _lecture_texts():
        for rows in _drawn_timelines("Timeline Z\n" + text).values():
            for name, graded in drawn.items():
                assert not any(row and row == g for row in rows for g in graded), (
                    f"a row of a5's graded timeline {name} is printed in {where}")


# (with the widgets' tests in spirit; here because it reads a5's graded timelines)
def test_pipeline_view_cannot_draw_a5s_graded_timelines():
    """a5 Q4's timelines A and B (P = 5, m = 7) are the same for every student, and Q7's
    pipelines have P = 5 or 7: the widget's stages stop short of them (timeline C,
    interleaved, asks only its schedule, which its chunk letters name)."""
    from course_utils.assess import variants
    from course_utils.widgets import pipeline_timeline

    w = pipeline_timeline.PipelineTimeline()
    for name, (schedule, p, m, v) in A5_Q4_TIMELINES.items():
        if schedule != "interleaved":
            assert p not in w.controls["stages"].options, name
    for q7 in variants.givens_of("a5_pipeline")["q7"].options:
        assert q7[0] not in w.controls["stages"].options
    with pytest.raises(ValueError, match="stages=5 is not one of the control's choices"):
        pipeline_timeline.PipelineTimeline(stages=5)
