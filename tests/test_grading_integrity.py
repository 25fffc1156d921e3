"""Grading integrity: every synthetic submission of every assignment gets the score it deserves.

Fast tests: the static tampering scan, the outside re-judging of recorded checks, the stderr and
feedback preprocessors, and the synthetic-submission builder for each assignment.

Slow tests (``@pytest.mark.slow``), per assignment: one parallel autograde of all synthetic
submissions (correct, wrong, wrong unit, raises, infinite loop, a loop that swallows
KeyboardInterrupt, edited/deleted test cells, an always-equal object, a lying float subclass,
monkeypatched ``math.isclose``/``sys.modules``/builtins, a shadowing ``course_utils/`` folder,
malformed JSON, a missing notebook, a correct answer that writes to stderr, an unanswered
notebook), then the integrity report and the feedback. Each case is checked against what it
deserves: correct answers never lose points to noise, wrong ones never gain, cheats are flagged
by the check that runs outside the kernel, and "could not be graded" is never a 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils.assess.checks import SUBMIT_MIME, check_number
from grading import class_report, integrity, judge, snippets, synthetic, workflow
from grading.filters import ShowOnlyErrorMessages, StderrToStdout

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = sorted(p.name for p in (ROOT / "solutions").iterdir()
                     if (p / f"{p.name}.ipynb").exists()
                     and (ROOT / "assignments" / p.name / f"{p.name}.ipynb").exists())
KINDS = ["correct", "wrong", "raises", "infinite_loop", "swallows_interrupt", "edited_tests",
         "deleted_tests", "fake_values", "patch_isclose", "patch_sys_modules",
         "patch_builtins", "shadow_course_utils", "malformed_json", "missing_notebook",
         "stderr_noise", "unanswered", "typical_mistake", "reads_solutions", "writes_library",
         "writes_course_data", "late_process", "huge_output", "memory_hog", "reads_expected",
         "rewrites_tests", "hidden_payload", "uses_helper"]


# ------------------------------------------------------------------------------ fast

_HELPERS = ["memory.zero_state_bytes", "pipeline_schedule.bubble_fraction"]


@pytest.mark.parametrize("code, setup, found", [
    ("x = memory.zero_state_bytes(7e9, 8, 2)['total'] / 1e9", "", ["memory.zero_state_bytes"]),
    ("from course_utils.memory.sizing import zero_state_bytes as z\nx = z(1, 2, 3)", "",
     ["memory.zero_state_bytes"]),
    ("import course_utils.pipeline.schedule as s\nx = s.bubble_fraction(4, 8)", "",
     ["pipeline_schedule.bubble_fraction"]),
    ("x = ps.bubble_fraction(4, 8)", "from course_utils import pipeline_schedule as ps",
     ["pipeline_schedule.bubble_fraction"]),
    ("import course_utils\nx = course_utils.memory.sizing.zero_state_bytes(1, 2, 3)", "",
     ["memory.zero_state_bytes"]),
    ("from course_utils.memory.sizing import *\nx = zero_state_bytes(1, 2, 3)", "",
     ["memory.zero_state_bytes"]),
    ("x = getattr(m, 'zero_state_bytes')(1, 2, 3)", "", ["memory.zero_state_bytes"]),
    ("x = (2 + 14 / 8) * 7", "", []),
    ("x = memory.to_gib(3)  # another helper", "", []),
    ("def bubble_fraction(p, m):\n    return (p - 1) / (m + p - 1)", "", []),
    ("x = ps.bubble_fraction(4, 8)", "", []),  # ps is not an alias of the course's module here
    ("from course_utils.widgets import zero_shards\nx = zero_shards.ZeroShards()", "",
     ["widgets.*"]),
    ("x = w.zero_shards.ZeroShards().state", "from course_utils import widgets as w",
     ["widgets.*"]),
    ("from course_utils.widgets.training_state import TrainingState as T\nx = T()", "",
     ["widgets.*"]),
    ("x = '*'", "", []),
    ("from course_utils import widgets", "", []),  # importing alone computes nothing
])
def test_helper_uses_sees_every_way_of_naming_a_helper(code, setup, found):
    assert integrity.helper_uses(code, _HELPERS + [integrity.WIDGETS], setup) == found


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_helpers_not_allowed_name_real_answers_and_helpers(name):
    """Each judge's HELPERS_NOT_ALLOWED names answer cells of its assignment and functions
    that exist, and the reference solution uses none of them."""
    import importlib

    rules = getattr(judge.load(name), "HELPERS_NOT_ALLOWED", None)
    assert rules, f"authoring/judges/{name}.py should say which helpers compute its answers"
    nb = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
    answers = {integrity._meta(c)["grade_id"]: c.source for c in nb.cells
               if integrity.is_answer_cell(c)}
    for gid, helpers in rules.items():
        assert gid in answers, f"{gid} is not an answer cell of {name}"
        for helper in helpers:
            module, _, fn = helper.rpartition(".")
            assert callable(getattr(importlib.import_module(f"course_utils.{module}"), fn, None)), helper
        assert integrity.helper_uses(answers[gid], helpers) == [], gid


@pytest.mark.parametrize("code, words", [
    ("import math\nmath.isclose = lambda *a, **k: True", "assigns to math.isclose"),
    ("import builtins\nbuiltins.abs = lambda x: 0", "assigns to builtins.abs"),
    ("import sys\nsys.modules['course_utils.assess.checks'] = None", "sys.modules"),
    ("import sys\nsys.path.insert(0, '.')", "sys.path.insert"),
    ("class F(float):\n    pass", "subclasses float"),
    ("class A:\n    def __eq__(self, o):\n        return True", "defines __eq__"),
    ("import importlib", "importlib"),
    ("from importlib import reload", "importlib"),
    ("import signal\nsignal.signal(2, signal.SIG_IGN)", "signal"),
    ("check_number = print", "rebinds check_number"),
    ("setattr(math, 'isclose', None)", "calls setattr on math"),
    ("__builtins__.abs = None", "__builtins__"),
    ("from IPython.display import publish_display_data\n"
     f"publish_display_data({{'{SUBMIT_MIME}': {{}}}})", "fake submission"),
    ("import os\nos.makedirs('course_utils')", "course_utils folder"),
    ("open('course_utils/assess/checks.py', 'w').write('x')", "course_utils folder"),
    ("import course_utils.assess.checks as c\nc.check_number = None", "assigns to c.check_number"),
])
def test_scan_flags_tampering(code, words):
    flags = integrity.scan_source(code)
    assert any(words in f for f in flags), flags


@pytest.mark.parametrize("code", [
    "q1 = 13e9 * 16 / 1e9",
    "import math\nx = math.sqrt(2) * 3",
    "def f(n):\n    total = 0\n    for i in range(n):\n        total += i\n    return total",
    "import torch\nt = torch.zeros(3)\nt[0] = 1.0",
    "from course_utils import launch\nres = launch.run(f, 2, timeout_s=30)",
    "class Plan:\n    def __init__(self, n):\n        self.n = n",
    "%time x = 1",
    "def broken(:",
])
def test_scan_leaves_honest_code_alone(code):
    assert integrity.scan_source(code) == []


def _rules(got, ref):
    """A judge function as authoring/judges/ files write them."""
    check_number("x", got["x"], 208.0, unit="GB", mistakes=[(208e9 / 2**30, "that is GiB")])


def test_judge_decides_from_values_and_the_reference():
    ref = [("x", 208.0)]
    assert judge.judge_cell(_rules, "t", [("x", 208.0)], ref).passed
    wrong = judge.judge_cell(_rules, "t", [("x", 193.715)], ref)
    assert not wrong.passed and "GiB" in wrong.message
    # a value the kernel could not send as data keeps its type's name, and is not a number
    lying = judge.judge_cell(_rules, "t", [("x", {"$type": "LyingFloat"})], ref)
    assert not lying.passed and "LyingFloat" in lying.message
    # nothing submitted, something extra, out of order, or an error in the kernel: not passed
    gone = judge.judge_cell(_rules, "t", [], ref)
    assert not gone.passed and "stopped before" in gone.message
    extra = judge.judge_cell(_rules, "t", [("x", 208.0), ("y", 1)], ref)
    assert not extra.passed and "should not" in extra.message
    err = judge.judge_cell(_rules, "t", [("x", 208.0)], ref, ("NameError", "name 'x'"))
    assert not err.passed and err.message == "NameError: name 'x'"
    # too much data, a judge function that cannot read the value, no judge at all
    huge = judge.judge_cell(_rules, "t", [("x", "y" * 3_000_000)], ref)
    assert not huge.passed and "larger than" in huge.message
    odd = judge.judge_cell(lambda got, ref: got["x"] + 1, "t", [("x", "text")], [("x", "t")])
    assert not odd.passed and "could not be judged" in odd.message
    assert "no judge" in judge.judge_cell(judge, "missing_test", [("x", 1)], ref).message


def test_an_unanswered_question_is_judged_not_answered():
    """The placeholder raised, in the kernel or on a rank, or a missing name while the answer
    cell still holds it: "not answered" (a3 Q4 and a10 Q7 said "RankError: rank 1 failed first:
    NotImplementedError", a3 Q5 "KeyError: 'activation_factor'"); a failed check, torch's own
    NotImplementedError, or a missing name in an answered cell keep their messages."""
    ref = [("x", 208.0)]
    stub = "# YOUR CODE HERE\nraise NotImplementedError()"
    cells = [{"cell_type": "code", "source": stub,
              "metadata": {"nbgrader": {"solution": True, "grade_id": "q5"}}},
             {"cell_type": "code", "source": "x = 1",
              "metadata": {"nbgrader": {"solution": True, "grade_id": "q6"}}},
             {"cell_type": "code", "source": "check(x)",
              "metadata": {"nbgrader": {"grade": True, "grade_id": "q5_test"}}}]
    assert judge.answer_source(cells, "q5_test") == stub
    assert judge.answer_source(cells, "q6_test") == "x = 1"
    assert judge.answer_source(cells, "q7_test") is None
    for error, answer in [(("NotImplementedError", ""), None),
                          (("RankError", "rank 1 failed first: NotImplementedError"), None),
                          (("KeyError", "'activation_factor'"), stub),
                          (("NameError", "name 'q4_diagnosis' is not defined"), stub),
                          (("RankError", "rank 1 failed first: NameError: name 'CopyToTP' is not "
                                         "defined"), stub)]:
        verdict = judge.judge_cell(_rules, "q5_test", [], ref, error, answer=answer)
        assert verdict.message == judge.NOT_ANSWERED == "not answered (its answer cell still " \
            "raises NotImplementedError)", (error, verdict.message)
        assert class_report.misconception(verdict.message)[:2] == (
            "not answered", "not answered (the cell still raises NotImplementedError)")
    for error, answer in [(("AssertionError", "x = 193.7: that is GiB"), stub),
                          (("NameError", "name 'x' is not defined"), "x = 1"),
                          (("RankError", "rank 0 failed first: NotImplementedError: Could not run "
                                         "'aten::add' with arguments from the 'Meta' backend"),
                           None),
                          (("KeyError", "'x'"), None)]:
        verdict = judge.judge_cell(_rules, "q5_test", [], ref, error, answer=answer)
        assert not verdict.passed and verdict.message != judge.NOT_ANSWERED, error
    # a function still holding the placeholder, run on hidden cases (a2 Q5 said "... failed on
    # 2 real ranks: rank 1 failed first: NotImplementedError"); torch's own, with a message, not
    def ran(message):
        def rules(got, ref):
            raise AssertionError(message)
        return rules

    for message, expected in [("f failed on 2 real ranks: rank 1 failed first: "
                               "NotImplementedError", judge.NOT_ANSWERED),
                              ("f failed on 2 real ranks: rank 1 failed first: "
                               "NotImplementedError: Could not run 'aten::add'", None)]:
        verdict = judge.judge_cell(ran(message), "q5_test", [("x", 1.0)], ref, None,
                                   answer=stub)
        assert not verdict.passed
        assert (verdict.message == judge.NOT_ANSWERED) == (expected is not None), verdict


def test_values_cross_as_data():
    """What a kernel submits is JSON; the judge rebuilds numbers, lists, dicts and tensors, and
    nothing else (an object arrives as a stand-in that only keeps its type's name)."""
    import json

    import numpy as np
    import torch

    from course_utils.assess.checks import encode

    class LyingFloat(float):
        def __eq__(self, other):
            return True

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.bfloat16)
    values = [3, 2.5, True, "all-reduce", None, [1, (2, 3)], {"a": 1}, np.float32(0.5), t,
              float("nan"), LyingFloat(1.0), object()]
    back = [judge.decode(json.loads(json.dumps(encode(v)))) for v in values]
    assert back[:8] == [3, 2.5, True, "all-reduce", None, [1, [2, 3]], {"a": 1}, 0.5]
    assert [type(v) for v in back[:3]] == [int, float, bool]
    assert back[8].dtype == torch.bfloat16 and torch.equal(back[8], t)
    assert back[9] != back[9]  # nan
    assert type(back[10]).__name__ == "LyingFloat" and not isinstance(back[10], float)
    assert type(back[11]).__name__ == "object" and not isinstance(back[11], (int, float))
    assert type(judge.decode({"$tensor": {"dtype": "os", "shape": [1], "data": [1]}})).__name__ \
        == "malformed tensor"


def _constants(tree) -> tuple[set[float], set[str]]:
    import ast

    nums, strs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                nums.add(float(node.value))
            elif isinstance(node.value, str):
                strs.add(node.value)
    return nums, strs


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_no_answer_reaches_the_kernel(name):
    """What a graded kernel runs of the tests (every test cell of ``solutions/``, hidden parts
    included) holds no judge message; hidden parts judge nothing (no assert, no check with an
    expected value) and submit values. Every test cell has its judge function."""
    import ast

    solution = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
    _, judge_strs = _constants(ast.parse((judge.JUDGES / f"{name}.py").read_text()))
    messages = {t for t in judge_strs if len(t) >= 40}  # the judge's feedback, not value names
    rules = judge.load(name)
    tests = [c for c in solution.cells if integrity.is_test_cell(c)]
    assert tests
    for cell in tests:
        gid = cell.metadata["nbgrader"]["grade_id"]
        assert callable(getattr(rules, gid, None)), f"{name}: no judge function for {gid}"
        source = integrity._python_source(cell.source)
        assert "submit(" in source, f"{gid} submits nothing: the judge would have nothing to judge"
        assert not [t for t in messages if t in source], f"{gid} contains the judge's messages"
        hidden = source.split("### BEGIN HIDDEN TESTS", 1)[-1] if "BEGIN HIDDEN" in source else ""
        assert hidden, f"{gid} has no hidden part"
        hidden_tree = ast.parse(integrity._python_source(hidden))
        # (visible parts may check practice cases with expected values: they are not graded,
        # and test_no_expected_value_is_in_the_kernels_code keeps the graded ones out)
        for node in ast.walk(hidden_tree):
            assert not isinstance(node, ast.Assert), f"{gid}: assert in hidden code"
        for node in ast.walk(hidden_tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                    node.func, "id", "")) in ("check_number", "check_choice", "check_sequence"):
                expected = node.args[2] if len(node.args) > 2 else next(
                    (k.value for k in node.keywords if k.arg == "expected"), None)
                assert expected is None or (isinstance(expected, ast.Constant)
                                            and expected.value is None), (
                    f"{gid}: a hidden check with an expected value runs in the kernel")
    judged = {n for n in dir(rules) if n.endswith("_test") and callable(getattr(rules, n))}
    assert judged <= {c.metadata["nbgrader"]["grade_id"] for c in tests}, "judge of no cell"


@pytest.mark.slow
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_no_expected_value_is_in_the_kernels_code(name, reference):
    """No number the reference solution submits (an expected value) is written in a test cell,
    unless the released question itself states it (an input such as 13e9 or 16)."""
    import ast

    release_text = (ROOT / "assignments" / name / f"{name}.ipynb").read_text()
    given = {float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e[+-]?\d+)?", release_text)}
    solution = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
    for nb_name, run in reference(name).items():
        for cell in solution.cells:
            if not integrity.is_test_cell(cell):
                continue
            gid = cell.metadata["nbgrader"]["grade_id"]
            answers = {float(v) for _, v in run["submissions"][gid]
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            secret = {x for x in answers - given if x != int(x) or abs(x) >= 100}
            nums, _ = _constants(ast.parse(integrity._python_source(cell.source)))
            assert not nums & secret, f"{gid} writes the expected values {nums & secret}"


def _test_cell(outputs, points=2):
    cell = nbformat.v4.new_code_cell("check_number('x', x)")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t",
                                 "points": points, "locked": True}
    cell.outputs = outputs
    return cell


def test_verify_cell_takes_the_judges_score_and_checks_nbgrader_agrees():
    passed = _test_cell([nbformat.v4.new_output("stream", name="stdout", text="passed\n")])
    ok = integrity.verify_cell(passed, judge.Verdict("t", True, ""))
    assert (ok.kernel_score, ok.score, ok.problems) == (2, 2, [])
    err = nbformat.v4.new_output("error", ename="AssertionError", evalue="x: GiB", traceback=[])
    fail = integrity.verify_cell(_test_cell([err]), judge.Verdict("t", False, "x: GiB"))
    assert (fail.kernel_score, fail.score, fail.problems, fail.message) == (0, 0, [], "x: GiB")
    # the notebook says passed but the judge did not (or never saw the cell): the judge wins
    lie = integrity.verify_cell(passed, judge.Verdict("t", False, "x: GiB"))
    assert lie.score == 0 and "nbgrader scored 2, the judge 0" in lie.problems[0]
    unseen = integrity.verify_cell(passed, None)
    assert unseen.score == 0 and "never saw" in unseen.problems[0]


def test_stderr_in_a_test_cell_no_longer_costs_the_cell():
    from nbgrader.utils import determine_grade

    cell = _test_cell([nbformat.v4.new_output("stream", name="stderr", text="UserWarning\n")])
    assert determine_grade(cell)[0] == 0  # what nbgrader would do
    StderrToStdout().preprocess_cell(cell, {}, 0)
    assert determine_grade(cell)[0] == 2
    err = _test_cell([nbformat.v4.new_output("error", ename="E", evalue="", traceback=[])])
    StderrToStdout().preprocess_cell(err, {}, 0)
    assert determine_grade(err)[0] == 0


def test_feedback_drops_submissions_and_tracebacks():
    err = nbformat.v4.new_output("error", ename="AssertionError", evalue="that is GiB",
                                 traceback=["submit('x', x)  # hidden"])
    sub = nbformat.v4.new_output("display_data", data={SUBMIT_MIME: {"name": "x", "value": 1},
                                                       "text/plain": ""})
    cell = _test_cell([sub, err])
    ShowOnlyErrorMessages().preprocess_cell(cell, {}, 0)
    assert cell.outputs == [err] and err.traceback == ["AssertionError: that is GiB"]


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_synthetic_submissions_cover_every_case(name):
    cases = synthetic.cases_for(name)
    kinds = [c.kind for c, _ in cases]
    assert set(KINDS) <= set(kinds), set(KINDS) - set(kinds)
    [model] = synthetic.load(name)
    assert model.auto_max > 0 and model.answers
    for case, files in cases:
        nb = files[model.name]
        if isinstance(nb, nbformat.NotebookNode):
            nbformat.validate(nb)


ASSIGNMENT_FREE = {"malformed_json", "missing_notebook"}  # (the report's code, not a judge's)


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_every_synthetic_kind_is_graded_somewhere(name):
    """Nothing less exercised (issue 35): each kind of the assignment's synthetic class is
    graded in a kernel on it, or on values alone on it, or (the grader's machinery, an
    unreadable notebook: the same code whatever the assignment) in a kernel on
    ``synthetic.KERNEL_EVERYTHING``, with every kind there."""
    kinds = {c.kind for c, _ in synthetic.cases_for(name)}
    nowhere = [k for k in sorted(kinds) if not (
        _kernel(name, k) or synthetic.is_valued(name, k)
        or ((k in synthetic.MECHANICS or k in ASSIGNMENT_FREE)
            and _kernel(synthetic.KERNEL_EVERYTHING, k)))]
    assert nowhere == []
    assert synthetic.kernel_kinds(synthetic.KERNEL_EVERYTHING) is None


def test_reference_runs_are_cached_by_content(tmp_path):
    """A cached reference run is reused only while the files it was made from are unchanged."""
    import json

    a, b = tmp_path / "a.ipynb", tmp_path / "b.py"
    a.write_text("solution")
    b.write_text("helper")
    key = integrity.run_key(a, b)
    assert integrity.run_key(a, b) == key
    b.write_text("helper, edited")
    assert integrity.run_key(a, b) != key

    name = "a1_training_state"
    cache = tmp_path / "cache"
    path = integrity.reference_cache_path(name, f"{name}.ipynb", cache)
    assert path.parent == cache / name and integrity.run_key(
        ROOT / "solutions" / name / f"{name}.ipynb", judge.JUDGES / f"{name}.py",
        ROOT / "grading" / "judge.py", ROOT / "grading" / "reference.py",
        ROOT / "grading" / "course.py",
        *sorted((ROOT / "course_utils").rglob("*.py"))) in path.name
    fake = {"submissions": {"q1_test": []}, "max_cell_s": 1.5, "problems": []}
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(fake))
    assert integrity.reference_run(name, cache=cache, tour=False) == {f"{name}.ipynb": fake}
    # (not re-run); a run asked for with its judge tour is reused only if it holds one, made
    # of the release as it is (its leak scan ran the release's test cells)
    from grading import reference

    toured = dict(fake, tour={"students": {}, "draws": {}, "release": reference._release_digest(
        name, f"{name}.ipynb")})
    path.write_text(json.dumps(toured))
    assert integrity.reference_run(name, cache=cache, tour=True) == {f"{name}.ipynb": toured}
    stale = path.with_name(f"{name}.0123456789abcdef.json")
    path.rename(stale)  # what an edit to the solution or to course_utils leaves behind
    assert integrity.reference_cache_path(name, f"{name}.ipynb", cache) != stale


def test_each_assignment_says_what_its_ranks_preload(monkeypatch, tmp_path):
    """a10's ranks build optimizers and DDP (torch._dynamo: the full preload); the others keep
    the light one, read from the judge's source as the module says it (it is not imported);
    a judge that names anything else is refused."""
    assert integrity.launch_preload("a10_capstone") == "full"
    assert integrity.launch_preload("a1_training_state") == "light"
    for name in ASSIGNMENTS:
        assert integrity.launch_preload(name) == getattr(judge.load(name), "LAUNCH_PRELOAD",
                                                         "light"), name
    (tmp_path / "a1_training_state.py").write_text('LAUNCH_PRELOAD = "heavy"\n')
    monkeypatch.setattr(judge, "JUDGES", tmp_path)
    with pytest.raises(ValueError, match="LAUNCH_PRELOAD must be 'light' or 'full'"):
        integrity.launch_preload("a1_training_state")


def test_collect_accepts_both_layouts(tmp_path):
    src = tmp_path / "inbox"
    (src / "ann").mkdir(parents=True)
    shutil.copy(ROOT / "assignments" / "a1_training_state" / "a1_training_state.ipynb",
                src / "ann" / "a1_training_state.ipynb")
    (src / "ben" / "a1_training_state").mkdir(parents=True)
    shutil.copy(ROOT / "assignments" / "a1_training_state" / "a1_training_state.ipynb",
                src / "ben" / "a1_training_state" / "a1_training_state.ipynb")
    (src / "cat").mkdir()  # submitted nothing
    got = workflow.collect(src, "a1_training_state", data=tmp_path / "data")
    assert got == {"a1_training_state": ["ann", "ben"]}
    assert (tmp_path / "data/submitted/ann/a1_training_state/a1_training_state.ipynb").exists()
    with pytest.raises(ValueError, match="assignment must be"):
        workflow.collect(src, "a9_nope", data=tmp_path / "data")


# ------------------------------------------------------------------------------ slow


def _hidden_lines(name: str) -> list[str]:
    """Lines of the hidden tests (not of the reference answers, which students may match)."""
    nb = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
    lines, inside = [], False
    for cell in nb.cells:
        for line in cell.source.splitlines():
            tag = line.strip()
            if tag == "### BEGIN HIDDEN TESTS":
                inside = True
            elif tag == "### END HIDDEN TESTS":
                inside = False
            elif inside and len(tag) > 12:
                lines.append(tag)
    return lines


# in a kernel: what synthetic.kernel_kinds says (every kind on synthetic.KERNEL_EVERYTHING);
# on values alone: every kind whose point is its values, on every assignment
def _kernel(name: str, kind: str) -> bool:
    kinds = synthetic.kernel_kinds(name)
    return (kinds is None and (kind not in synthetic.MECHANICS
                               or kind in synthetic.mechanics_of(name))) or \
        (kinds is not None and kind in kinds)


GRADED_KINDS = [(name, kind) for name in ASSIGNMENTS
                for kind in [*KINDS, *synthetic.OWN_ATTACKS.get(name, {})] if _kernel(name, kind)]
VALUED_KINDS = [(name, kind) for name in ASSIGNMENTS for kind in
                ["correct", "wrong", "raises", "fake_values", "uses_helper", "typical_mistake"]]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), GRADED_KINDS)
def test_each_submission_gets_what_it_deserves(name, kind, graded):
    g = graded(name)
    cases, results, data = g.cases, g.results, g.data
    case, result = cases[kind], results[kind]
    if case.deserved is None:
        assert result.status.startswith(case.status), result.status
        assert result.score is None, "a submission that could not be graded got a score"
        return
    assert result.status == "graded", result.status
    detail = integrity.render_text(name, [result])
    assert result.score == pytest.approx(case.deserved), detail
    if kind in ("correct", "stderr_noise"):  # noise never costs a correct student points
        assert result.kernel_score == pytest.approx(result.max_score), detail
        assert not result.flags, detail
    for words in case.flags:
        assert any(words in f for f in result.flags), f"expected a flag with {words!r}:\n{detail}"
    html = data / "feedback" / kind / name / f"{name}.html"
    assert html.exists(), f"no feedback for {kind}"
    text = html.read_text(encoding="utf-8")
    for words in case.feedback:
        assert words in text, f"feedback of {kind} does not show {words!r}"
    shown = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", text))
    for cell in result.failed_cells:  # the judge's message for each failed cell
        import html as html_lib

        want = re.sub(r"\s+", " ", cell.message)[:40]
        assert want in shown or html_lib.escape(want, quote=False) in shown, (
            f"feedback of {kind} does not show {cell.message!r}")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), VALUED_KINDS)
def test_each_value_submission_gets_what_it_deserves(name, kind, valued):
    """The same kinds on values alone, on every assignment: the score they deserve, the flags
    they must raise, and each failed cell's message in the report."""
    g = valued(name)
    if kind not in g.cases:
        pytest.skip(f"{name} grades no {kind} on values (none named, or graded in a kernel)")
    case, result = g.cases[kind], g.results[kind]
    detail = integrity.render_text(name, [result])
    assert result.status == "graded" and result.score == pytest.approx(case.deserved), detail
    for words in case.flags:
        assert any(words in f for f in result.flags), f"expected a flag with {words!r}:\n{detail}"
    if kind == "correct":
        assert result.score == result.max_score and not result.flags, detail
    for words in case.feedback:  # a typical mistake: the judge names it
        assert any(words in c.message for c in result.failed_cells), (words, detail)
    text = (g.data / "reports" / f"{name}.txt").read_text()
    for cell in result.failed_cells:
        assert cell.message and cell.message[:40] in text, (kind, cell.message)


@pytest.mark.slow
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_attacks_on_the_grader_leave_no_trace(name, graded):
    """Run in the sandbox, the attacks change nothing outside their own folder, leave no
    process behind, and a 20 MB print does not become a 20 MB notebook or feedback page."""
    import psutil

    g = graded(name)
    assert g.changed == [], f"grading {name} changed files outside the submissions: {g.changed}"
    assert "sandboxed" in (g.data / "reports" / f"{name}.txt").read_text()
    assert set(g.cases) & synthetic.MECHANICS == synthetic.mechanics_of(name)
    if "huge_output" not in synthetic.mechanics_of(name):
        return
    # (this assignment's only: another worker may be grading another late_process right now)
    late = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
            if "course-late-process" in (p.info["cmdline"] or [])
            and str(g.data) in " ".join(p.info["cmdline"])]
    assert late == [], "a process started by a submission outlived its kernel"
    # (report() re-checks every autograded notebook's digest: had the late process changed its
    # results, the fixture's report would have raised ResultsChanged)
    auto = g.data / "autograded" / "huge_output" / name / f"{name}.ipynb"
    html = g.data / "feedback" / "huge_output" / name / f"{name}.html"
    assert auto.stat().st_size < 2_000_000 and html.stat().st_size < 2_000_000
    assert "cut by the grader" in auto.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_wrong_unit_answers_lose_exactly_that_question(name, valued, graded):
    """On values alone for every assignment (the report names the mistake); in a kernel where
    the unit mistakes are graded there too (the feedback page names it)."""
    for g, where in ((valued(name), "report"), (graded(name), "feedback")):
        cases, results, data = g.cases, g.results, g.data
        units = [k for k in cases if k.startswith("unit_")]
        if where == "report" and not units:
            pytest.skip(f"{name} has no GB/GiB check on an answer variable")
        for kind in units:
            case, result = cases[kind], results[kind]
            assert result.status == "graded" and result.score == pytest.approx(case.deserved), (
                integrity.render_text(name, [result]))
            text = ((data / "reports" / f"{name}.txt").read_text() if where == "report" else
                    (data / "feedback" / kind / name / f"{name}.html").read_text("utf-8"))
            words = case.feedback if where == "feedback" else \
                [c.message[:40] for c in result.failed_cells]
            for w in words:
                assert w in text, f"the {where} of {kind} does not name the mistake {w!r}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_feedback_never_shows_hidden_tests_or_submissions(name, graded):
    data = graded(name).data
    hidden = [line for line in _hidden_lines(name) if "submit(" in line]
    for html in (data / "feedback").glob(f"*/{name}/*.html"):
        text = html.read_text(encoding="utf-8")
        plain = re.sub(r"<[^>]+>", "", text)
        assert "BEGIN HIDDEN TESTS" not in text and SUBMIT_MIME not in text, html
        leaked = [line for line in hidden if line in plain]
        assert not leaked, f"{html} shows hidden test code: {leaked[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_report_files_keep_not_graded_apart(name, graded):
    import csv

    if synthetic.kernel_kinds(name) is not None:
        pytest.skip(f"the unreadable and missing notebooks are graded on "
                    f"{synthetic.KERNEL_EVERYTHING} (the report's code is the same for all)")
    data = graded(name).data
    rows = {r["student"]: r for r in csv.DictReader((data / "reports" / f"{name}.csv").open())}
    assert rows["malformed_json"]["score"] == "" and "not graded" in rows["malformed_json"]["status"]
    # (where the JSON ends, not nbformat's "does not appear to be JSON": issue 50)
    assert "truncated JSON: it ends at line 1, column 51" in rows["malformed_json"]["status"]
    assert rows["missing_notebook"]["score"] == ""
    assert rows["unanswered"]["score"] == "0" and rows["unanswered"]["status"] == "graded"
    if "patch_sys_modules" in synthetic.mechanics_of(name):
        assert rows["patch_sys_modules"]["flags"]
    text = (data / "reports" / f"{name}.txt").read_text()
    assert "missing_notebook: NOT GRADED" in text


def _notebook(*sources):
    """A python3 notebook of code cells."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    return nb


@pytest.mark.slow
def test_a_kernel_that_ignores_the_interrupt_costs_only_its_cell(tmp_path):
    """RecoveringExecute: restart, replay the cells before, record the timeout, go on."""
    from grading.preprocessors import RecoveringExecute

    nb = _notebook("x = 41", snippets.SWALLOW, "x += 1\nprint(x)", "import os\nos._exit(1)",
                   "print(x + 1)")
    RecoveringExecute(timeout=3, startup_timeout=120).preprocess(
        nb, {"metadata": {"path": str(tmp_path)}})
    assert nb.cells[1].outputs[0]["ename"] == "CellTimeoutError"
    assert nb.cells[2].outputs[0]["text"] == "42\n"
    assert nb.cells[3].outputs[0]["ename"] == "DeadKernelError"
    assert nb.cells[4].outputs[0]["text"] == "43\n"  # cells 0 and 2 were replayed


@pytest.mark.slow
def test_kernel_restarts_and_submission_time_are_capped(tmp_path):
    """Replays cannot grow without bound: past max_recoveries, or past the submission's time,
    the remaining cells are not run and say why (the report shows it as the cell's message)."""
    from grading.preprocessors import LIMIT_ENAME, RecoveringExecute

    nb = _notebook("x = 1", snippets.SWALLOW, snippets.SWALLOW, "print(x)")
    RecoveringExecute(timeout=2, startup_timeout=120, max_recoveries=1).preprocess(
        nb, {"metadata": {"path": str(tmp_path)}})
    assert nb.cells[1].outputs[0]["ename"] == "CellTimeoutError"
    assert nb.cells[2].outputs[0]["ename"] == LIMIT_ENAME
    assert "restarted more than 1 times" in nb.cells[2].outputs[0]["evalue"]
    assert nb.cells[3].outputs[0]["ename"] == LIMIT_ENAME  # not run

    nb = _notebook("import time\ntime.sleep(1.5)", "print('late')")
    RecoveringExecute(timeout=10, startup_timeout=120, max_submission_s=1.0).preprocess(
        nb, {"metadata": {"path": str(tmp_path)}})
    assert nb.cells[0].outputs == []
    assert "grading time" in nb.cells[1].outputs[0]["evalue"]


@pytest.mark.slow
def test_a_thread_bomb_stops_at_the_task_limit(tmp_path):
    """A sandboxed kernel cannot start more than ``max_tasks`` processes and threads (where the
    machine has a pids cgroup: the report says whether it does); the cell fails, the kernel
    lives on, and its cgroup is gone afterwards."""
    from grading import cgroups, sandbox
    from grading.preprocessors import RecoveringExecute

    if not sandbox.has_pids_cgroup():
        pytest.skip("no writable pids cgroup on this machine (the report says so)")
    mine = f"{cgroups.CGROUP_PREFIX}{os.getpid()}-*"  # (other workers' kernels come and go)
    before = set(Path("/sys/fs/cgroup/pids").glob(mine))
    bomb = ("import threading, time\nthreads = []\nfor _ in range(400):\n"
            "    t = threading.Thread(target=time.sleep, args=(20,), daemon=True)\n"
            "    t.start()\n    threads.append(t)")
    nb = _notebook(bomb, "print(threading.active_count() <= 300)")
    executor = RecoveringExecute(timeout=60, startup_timeout=120)
    executor.kernel_manager_class = type("Small", (sandbox.SandboxedKernelManager,),
                                         {"max_tasks": sandbox.Int(200)})
    executor.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert nb.cells[0].outputs[0]["ename"] == "RuntimeError", nb.cells[0].outputs
    assert "can't start new thread" in nb.cells[0].outputs[0]["evalue"]
    assert nb.cells[1].outputs[0]["text"] == "True\n"
    assert set(Path("/sys/fs/cgroup/pids").glob(mine)) == before


def test_cgroups_left_by_a_killed_grader_are_swept():
    """A grading process killed at its time limit cannot remove its kernel's cgroups; the next
    kernel's start removes each empty group whose creator (the pid in its name) has ended, and
    no other: not a live creator's, not one with a process in it, not a recent unnamed one."""
    from grading import cgroups, sandbox

    if not sandbox.has_pids_cgroup():
        pytest.skip("no writable pids cgroup on this machine (the report says so)")
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()  # (one tree, or v1's pids tree)
    root = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/pids")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    orphan, busy = (root / f"{cgroups.CGROUP_PREFIX}{ended.pid}-test{i}" for i in (1, 2))
    live = root / f"{cgroups.CGROUP_PREFIX}{os.getpid()}-test3"
    legacy = root / f"{cgroups.CGROUP_PREFIX}0123456789ab"  # named before the pid was in it
    odd = root / f"{cgroups.CGROUP_PREFIX}{2**64}-test4"  # no pid can be that large
    for group in (orphan, busy, live, legacy, odd):
        group.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        cgroups.KernelCgroups(64, 2**30).remove()  # a new kernel's groups: the sweep runs first
        assert not orphan.exists()
        assert busy.exists() and live.exists() and legacy.exists() and odd.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        for group in (orphan, busy, live, legacy, odd):
            cgroups._rmdir(group)
    assert not busy.exists()


def test_output_is_cut_to_the_byte_limit():
    from grading.filters import LimitOutputBytes

    cell = nbformat.v4.new_code_cell("print(...)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 300),
                    nbformat.v4.new_output("execute_result", data={"text/plain": "y" * 300,
                                                                   "image/png": "z" * 300})]
    LimitOutputBytes(max_bytes=100).preprocess_cell(cell, {}, 0)
    assert cell.outputs[0]["text"].startswith("x" * 100) and "200 more characters" in (
        cell.outputs[0]["text"])
    assert len(cell.outputs[1]["data"]["text/plain"]) < 200
    assert "image/png" not in cell.outputs[1]["data"]


def test_report_refuses_results_changed_after_grading(tmp_path):
    name = "a1_training_state"
    auto = tmp_path / "autograded" / "ann" / name
    auto.mkdir(parents=True)
    nb = auto / f"{name}.ipynb"
    nb.write_text("{}")
    integrity.record_digests(name, ["ann"], tmp_path)
    assert integrity.check_digests(name, tmp_path)["students"]["ann"]
    nb.write_text('{"changed": true}')
    with pytest.raises(integrity.ResultsChanged, match="ann"):
        integrity.report(name, tmp_path)


def test_collect_discards_the_students_own_timestamp(tmp_path):
    src = tmp_path / "inbox" / "ann" / "a1_training_state"
    src.mkdir(parents=True)
    shutil.copy(ROOT / "assignments" / "a1_training_state" / "a1_training_state.ipynb", src)
    (src / "timestamp.txt").write_text("2000-01-01 00:00:00")  # "I was early"
    workflow.collect(tmp_path / "inbox", "a1_training_state", data=tmp_path / "data")
    got = tmp_path / "data" / "submitted" / "ann" / "a1_training_state"
    assert (got / "a1_training_state.ipynb").exists() and not (got / "timestamp.txt").exists()


def test_grading_refuses_to_run_unisolated_without_being_told(monkeypatch):
    from grading import sandbox

    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    monkeypatch.delenv(sandbox.SANDBOX_ENV, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable, match="COURSE_SANDBOX=off"):
        sandbox.require()
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "off")
    sandbox.require()  # allowed, and the report says so:
    assert "NOT ISOLATED" in sandbox.description()


@pytest.mark.slow
def test_a_sandboxed_kernel_is_interrupted_not_restarted(tmp_path):
    """A busy loop in the sandbox stops with KeyboardInterrupt (the kernel keeps its state);
    only a kernel that ignores the interrupt is restarted."""
    from grading.preprocessors import RecoveringExecute

    nb = _notebook("x = 41", "while True:\n    pass", "print(x + 1)")
    RecoveringExecute(timeout=2, startup_timeout=120, interrupt_on_timeout=True).preprocess(
        nb, {"metadata": {"path": str(tmp_path)}})
    assert nb.cells[1].outputs[0]["ename"] == "KeyboardInterrupt"
    assert nb.cells[2].outputs[0]["text"] == "42\n"


_DRAWN = [a for a in ASSIGNMENTS if getattr(judge.load(a), "HIDDEN_CASES", None)]


@pytest.mark.slow
@pytest.mark.parametrize("name", _DRAWN)
def test_the_reference_passes_its_judge_on_every_draw(name, reference):
    """Hidden inputs drawn per submission (``HIDDEN_CASES``): the reference solution, run on
    its own draw, goes on to run its test cells again on the cases of two more keys (as two
    other students would get them: ``grading.reference.judge_tour``); each passes its judge on
    every draw, the three draws differ, and no submitted name carries them."""
    import json

    from grading import reference as ref_run

    rules = judge.load(name)
    keys = list(ref_run.TOUR_KEYS)
    draws = [judge.hidden_cases(rules, k) for k in keys]
    own = judge.hidden_cases(rules, judge.REFERENCE_KEY)
    for gid in rules.HIDDEN_CASES:
        assert len({json.dumps(d[gid]) for d in [own, *draws]}) == len(keys) + 1, (
            f"{gid}: the same cases")
    [run] = reference(name).values()
    toured = run["tour"]["draws"]
    assert list(toured) == keys
    for key, cases in zip(keys, draws):
        assert set(toured[key]) == set(rules.HIDDEN_CASES)
        for gid, (subs, error) in toured[key].items():
            # every submission submits the same names as the reference (the judge requires
            # it): a draw may change values and shapes, not the structure
            assert [n for n, _ in subs] == [n for n, _ in run["submissions"][gid]], (
                f"{name} {gid}: the cases of {key} change the names submitted")
            subs = [tuple(p) for p in subs]
            verdict = judge.judge_cell(rules, gid, subs, subs, error and tuple(error),
                                       cases[gid], cases[gid])
            assert verdict.passed, f"{name} {gid} on the cases of {key}: {verdict.message}"
            for n, _ in subs:  # names carry no inputs
                assert not any(json.dumps(x) in n for x in cases[gid] if x not in (0, 1)), n


# ------------------------------------------------------------------ a class with its own numbers

def _with_givens() -> list[str]:
    from course_utils.assess import givens as assignment_givens

    return sorted(assignment_givens.GIVENS)


@pytest.mark.slow
@pytest.mark.parametrize("name", _with_givens())
def test_a_class_graded_on_its_own_numbers(name, valued):
    """Issue 26, on the shared autograde of the synthetic class (distinct identities, so
    distinct numbers): every honest student gets full marks on their own numbers; the student
    who handed in a peer's right values loses each question where the numbers differ, and the
    report names the peer (informative answers); the student who worked the notebook under the
    peer's identity is graded on their own numbers and flagged; the grader drew each student's
    numbers itself (the judge log's variant is the student id's). On values alone (the kernel
    paths of the same class: a1, in the kernel run). Whether a copy is named follows the rule
    of ``grading.copies`` (tests/test_copy_evidence.py: simulated classes)."""
    g = valued(name)
    class_ = [s for s, r in g.results.items() if r.graded]
    own = {s: integrity.givens_for(name, s) for s in class_}
    assert len(class_) >= 9 and len({v.variant for v in own.values()}) >= 7
    for student in class_:
        log = judge.log_path(g.data, name, student, f"{name}.ipynb")
        if log.exists():
            assert judge.read_values(log)[0] == own[student].variant, student
    for student in ["correct"] + [f"honest_{i}" for i in range(1, synthetic.HONEST + 1)]:
        r = g.results[student]
        assert r.score == r.max_score and not r.flags, (student, r.failed_cells, r.flags)
    peer = synthetic.PEER
    for kind in ("copies_peer", "typed_identity"):
        r, case = g.results[kind], g.cases[kind]
        assert dict(own[kind]) != dict(own[peer])
        assert 0 <= r.score == case.deserved < r.max_score, (kind, r.score, case.deserved)
        copied = [f for f in r.flags if "the answers are what the numbers of" in f]
        expected = any("the answers are what the numbers of" in f for f in case.flags)
        assert bool(copied) == expected, (r.flags, case.flags)  # (grading.copies decides when)
        assert all(peer in f for f in copied), r.flags
        assert all("evidence of a copied answer, not a score" in f for f in copied)
    typed = g.results["typed_identity"].flags
    assert any(f"worked with {peer}'s numbers" in f and "graded on typed_identity's own" in f
               for f in typed), typed
    assert not any("worked with" in f for f in g.results["copies_peer"].flags)
    text = (g.data / "reports" / f"{name}.txt").read_text()
    assert f"worked with {peer}'s numbers" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", _with_givens())
def test_copy_evidence_on_simulated_classes(name, reference):
    """Issue 35, on values alone: classes of 30 honest students, each making a mistake the judge
    names on a third of the questions, plus 10 students who hand in an honest classmate's
    values (one with other numbers): no honest student is named, and a copier who is named is
    named with the classmate copied (benchmarks/copy_evidence.py measures how many are);
    with slips the judge does not know on 15 % of the answers too, still no honest student."""
    from grading import copies

    ref = {g: p for run in reference(name).values() for g, p in run["submissions"].items()}
    named = 0
    for seed, unknown in ((0, 0.0), (1, 0.0), (2, 0.15)):
        students, copied_from = copies.simulate_class(name, ref, seed=seed, unknown_rate=unknown)
        found = copies.matches(name, students, ref)
        honest = [s for s, peer in copied_from.items() if peer is None]
        assert [s for s in honest if found[s]] == [], (seed, {s: found[s] for s in honest})
        for s, peer in copied_from.items():
            if peer is not None and found[s]:
                assert any(peer in peers for _, peers, _ in found[s]), (s, peer, found[s])
                named += 1
    if name != "a8_jax_sharding":  # (one question of numbers: a copy there is one match)
        assert named > 0


def test_a_named_mistake_of_ones_own_numbers_is_never_a_copy():
    """The issue's own case: a1 with N = 20e9 and the 12-byte mistake gives 240 GB, the right
    answer for N = 15e9: a mistake the judge names for the student's numbers, never compared."""
    from course_utils.assess import variants
    from grading import copies

    rules = judge.load("a1_training_state")
    g = variants.Givens("a1_training_state", {**variants.base("a1_training_state"),
                                              "n_params": 20e9}, "any")
    peer = g.replaced(n_params=15e9)
    pairs = [("q1_state_gb", 240.0)]
    assert copies.named_mistake(rules, "q1_state_gb_test", pairs, g)
    assert judge.judge_cell(rules, "q1_state_gb_test", pairs, pairs, givens=peer).passed



@pytest.mark.slow
@pytest.mark.parametrize("name", [synthetic.KERNEL_EVERYTHING])
def test_the_exports_keep_not_graded_apart_in_a_stable_order(name, graded):
    """Issue 36: every export says "not graded" (with why) where a student could not be graded,
    never 0, in the order of assignment and student; the LMS file leaves such a cell empty (and
    a cell whose written answers wait) and says why in its notes; the gradebook has every
    student's name (the formgrader listed "None, None")."""
    import csv

    from nbgrader.api import Gradebook

    from grading import exports

    g = graded(name)
    paths = exports.export(g.data)
    rows = list(csv.DictReader(paths["grades.csv"].open()))
    mine = [r for r in rows if r["assignment"] == g.name]
    assert [r["student_id"] for r in mine] == sorted(r["student_id"] for r in mine)
    bad = {r["student_id"]: r for r in mine}["malformed_json"]
    assert bad["score"] == "" and bad["status"].startswith("not graded: ")
    assert {r["student_id"]: r for r in mine}["correct"]["status"] == "graded"
    verified = {r["student"]: r for r in csv.DictReader(paths["grades_verified.csv"].open())}
    assert verified["malformed_json"]["score"] == "" and verified["correct"]["score"] == "10"
    lms = {r["SIS User ID"]: r for r in csv.DictReader(paths["grades_lms.csv"].open())}
    column = next(c for c in lms["correct"] if c.startswith(g.name))
    assert lms["malformed_json"][column] == "" and lms["correct"][column] == ""  # manual waits
    notes = {(r["student"], r["assignment"]): r["note"]
             for r in csv.DictReader(paths["grades_lms_notes.csv"].open())}
    assert notes[("malformed_json", g.name)].startswith("not graded: ")
    assert "written answers not graded yet" in notes[("correct", g.name)]
    if lms.get("unanswered", {}).get(column):  # a total with blank written answers: why (issue 50)
        assert "written answers left blank, counted 0" in notes[("unanswered", g.name)]
    with Gradebook(f"sqlite:///{g.data / 'gradebook.db'}") as gb:
        assert all(s.last_name == s.id for s in gb.students), [(s.id, s.last_name)
                                                               for s in gb.students]


@pytest.mark.slow
def test_make_check_prints_each_question_as_it_is_judged(tmp_path):
    """Issue 36: ``make check`` says each question's verdict while the notebook is still being
    graded, in the order of the notebook, then the result; the gradebook it registers is kept
    for the next check of the same release."""
    import time

    # the student's copy, with a cell of their own that takes 3 s after the first question's
    # test: verdicts streamed live arrive that far apart; read only at the end, in one burst
    # (arrival before the return alone would depend on how fast the later cells ran)
    nb = nbformat.read(ROOT / "solutions" / "a1_training_state" / "a1_training_state.ipynb", 4)
    first = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade"))
    nb.cells.insert(first + 1, nbformat.v4.new_code_cell("import time\ntime.sleep(3)"))
    copy = tmp_path / "a1_training_state.ipynb"
    nbformat.write(nb, copy)
    seen: list[tuple[float, str]] = []

    result = workflow.self_check("a1_training_state", copy,
                                 progress=lambda line: seen.append((time.monotonic(), line)))
    assert [line.split(" (")[0].strip() for _, line in seen] == [c.grade_id for c in result.cells]
    assert [line.strip() for _, line in seen] == [
        f"{c.grade_id} ({c.max_score:g}/{c.max_score:g}): right" for c in result.cells]
    assert seen[1][0] - seen[0][0] > 2  # (the first came while grading went on)
    assert list(workflow.CHECK_CACHE.glob("a1_training_state-*.db"))
