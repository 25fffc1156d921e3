"""Synthetic submissions for any assignment: correct, wrong, and every cheat we know of.

Everything is derived from ``solutions/<a>/<nb>.ipynb`` (the reference answers) and
``assignments/<a>/<nb>.ipynb`` (what students receive), so a new assignment is covered without
writing anything. Per-assignment specifics (a typical wrong-unit answer) come from
:data:`UNIT_MISTAKES`; without an entry, wrong-unit answers are derived from the reference's
check records (an answer variable named in GB, such as ``zero2_gb``, gets the reference's value in GiB and
in bytes, and the judge's message for it).

:func:`build` writes the submissions and returns, per student, the :class:`Case` with the
score it deserves and what the outside check must report.
"""

from __future__ import annotations

import ast
import copy
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grading import copies, course, expected, judge, snippets
from grading.course import ROOT, _meta, is_answer_cell, is_test_cell, notebook_names

UNIT_MISTAKES, TYPICAL_MISTAKES, OWN_ATTACKS = (snippets.UNIT_MISTAKES, snippets.TYPICAL_MISTAKES,
                                              snippets.OWN_ATTACKS)


@dataclass
class Case:
    """One synthetic student and what grading must make of it."""

    student: str
    kind: str
    deserved: float | None          # verified autograded points; None: must not be graded
    status: str = "graded"          # expected status prefix ("graded" / "not graded")
    flags: list[str] = field(default_factory=list)   # substrings the report's flags must show
    feedback: list[str] = field(default_factory=list)  # substrings the feedback must show
    slow: bool = False              # costs a cell timeout
    side_effects: bool = False      # attacks files or processes outside its own notebook
    inbox: bool = False             # handed in through collect (an inbox), not written in place
    limits: list[str] = field(default_factory=list)  # substrings the report's LIMIT lines show


# ------------------------------------------------------------------------------ notebook model


def solution_code(source: str) -> str:
    """An answer cell's reference code with the ``### BEGIN/END SOLUTION`` lines removed."""
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def assigned_names(code: str) -> list[str]:
    """Top-level names an answer cell assigns or defines, in order."""
    names: list[str] = []
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return names
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name) and n.id not in names:
                    names.append(n.id)
    return names


@dataclass
class Model:
    """An assignment notebook seen as answers and the test cells that follow each one."""

    name: str                      # notebook file name
    release: nbformat.NotebookNode
    answers: dict[str, str]        # answer grade_id -> reference code
    tests_of: dict[str, list[str]]  # answer grade_id -> test grade_ids until the next answer
    points: dict[str, float]       # test grade_id -> points
    manual: dict[str, str] = field(default_factory=dict)  # written answers (markdown)

    @property
    def auto_max(self) -> float:
        return sum(self.points.values())

    def points_of(self, answer_id: str) -> float:
        return sum(self.points[t] for t in self.tests_of[answer_id])


def load(assignment: str) -> list[Model]:
    """The assignment's notebooks as :class:`Model` objects."""
    models = []
    for name in notebook_names(assignment):
        sol = nbformat.read(ROOT / "solutions" / assignment / name, as_version=4)
        rel = nbformat.read(ROOT / "assignments" / assignment / name, as_version=4)
        answers, tests_of, points, manual, current = {}, {}, {}, {}, None
        for cell in sol.cells:
            m = _meta(cell)
            if cell.cell_type == "markdown" and m.get("solution"):
                manual[m["grade_id"]] = solution_code(cell.source)
            if is_answer_cell(cell) and not m.get("grade"):
                current = m["grade_id"]
                answers[current] = solution_code(cell.source)
                tests_of[current] = []
            elif is_answer_cell(cell):  # an autograded answer cell that is also graded: rare
                current = m["grade_id"]
                answers[current] = solution_code(cell.source)
                tests_of[current] = []
            elif is_test_cell(cell):
                points[m["grade_id"]] = float(m.get("points", 0))
                if current is not None:
                    tests_of[current].append(m["grade_id"])
        models.append(Model(name, rel, answers, tests_of, points, manual))
    return models


def _apply(names: list[str], fn: str) -> str:
    return "".join(f"{n} = {fn}({n})\n" for n in names if not n.startswith("_"))


# ------------------------------------------------------------------------------ building


def _notebook(model: Model, codes: dict[str, str], drop_tests: bool = False,
              edit_tests: bool = False) -> nbformat.NotebookNode:
    nb = copy.deepcopy(model.release)
    cells = []
    for cell in nb.cells:
        gid = _meta(cell).get("grade_id")
        if gid in codes:
            cell.source = codes[gid]
        if is_test_cell(cell):
            if drop_tests:
                continue
            if edit_tests:
                cell.source = "None  # the tests are gone"
        cells.append(cell)
    nb.cells = cells
    return nb


def _answer_codes(model: Model, transform) -> dict[str, str]:
    return {gid: transform(gid, code) for gid, code in model.answers.items()}


def _first_answer(model: Model) -> str:
    """The first answer whose tests carry points (what the loop/raise cases break)."""
    return next(gid for gid in model.answers if model.points_of(gid) > 0)


# the same quantity in another unit: (student suffix, factor) per unit the check names
_CONVERSIONS = {"GB": [("unit_gib", 1e9 / 2**30), ("unit_bytes", 1e9)],
                "GiB": [("unit_gb", 2**30 / 1e9), ("unit_bytes", 2**30)],
                "bytes": [("unit_gb", 1e-9)],
                "ms": [("unit_seconds", 1e-3)],
                "s": [("unit_ms", 1e3)]}


def _unit_from_name(name: str) -> str:
    """A unit read from a variable name: ``zero2_gb``/``gb_a`` -> GB, ``q6_predicted_ms`` -> ms."""
    low = name.lower()
    for unit, tags in (("GB", ("gb",)), ("GiB", ("gib",)), ("ms", ("ms",)),
                       ("bytes", ("bytes",))):
        if any(low.endswith("_" + t) or low.startswith(t + "_") for t in tags):
            return unit
    return ""


def _unit_cases(assignment: str, model: Model, references: dict) -> list[tuple]:
    """(suffix, answer id, code, feedback words, answer name, factor) for wrong-unit answers of
    this assignment (name and factor None for an entry of :data:`UNIT_MISTAKES`)."""
    out = []
    owner = {n: gid for gid, code in model.answers.items() for n in assigned_names(code)}
    for suffix, var, code, words in UNIT_MISTAKES.get(assignment, []):
        if var in owner:
            out.append((suffix, owner[var], model.answers[owner[var]] + "\n" + code, words,
                        None, None))
    if out:
        return out
    run = references.get(model.name, {})
    for cell_id, subs in run.get("submissions", {}).items():  # generic: a variable with a unit
        for name, value in subs:
            unit = _unit_from_name(name)
            if unit not in _CONVERSIONS or name not in owner or type(value) not in (int, float):
                continue
            gid = owner[name]
            for suffix, factor in _CONVERSIONS[unit]:
                # the right value (for the student's own numbers) in the wrong unit; the
                # feedback names the variable and its wrong value: the visible test may reject
                # it before the judge does, in its own words
                out.append((suffix, gid, model.answers[gid] + f"\n{name} = {name} * {factor!r}",
                            f"{name} = ", name, factor))
            return out
    return out


# Attacks on the grader's own machinery: the sandbox, the limits, the interrupt, the restore of
# test cells, the judge living outside the kernel. The code they meet is the same whatever the
# assignment (nothing in it reads the assignment's answers or judge), so the test suite grades them
# on MECHANICS_ON: one assignment of numbers and one on real ranks. The other kinds (right, wrong,
# unit and typical mistakes, objects that lie to comparisons, a raising answer, helper use, blank,
# unreadable) meet each assignment's own judge and structure, and run on every assignment.
MECHANICS = frozenset({
    "infinite_loop", "swallows_interrupt", "edited_tests", "deleted_tests", "rewrites_tests",
    "patch_isclose", "patch_sys_modules", "patch_builtins", "shadow_course_utils",
    "reads_expected", "hidden_payload", "reads_solutions", "writes_library",
    "writes_course_data", "late_process", "huge_output", "memory_hog", "stderr_noise"})
# every kind on a1; on a2 (answers that launch real ranks) the kinds about processes and
# limits, which could meet rank processes: loops, interrupts, a process outliving its kernel,
# memory and output limits
MECHANICS_ON = {"a1_training_state": MECHANICS,
                "a2_data_parallel": frozenset({"swallows_interrupt", "late_process"})}

# Where each kind is graded in the test suite (issue 35). A kernel shows what only a kernel can:
# the reference solution running (its own run, on every assignment: grading.reference) and the
# blank release graded, a typical mistake's own code, the attacks an assignment's questions
# invite (OWN_ATTACKS) and the grader's machinery (MECHANICS_ON). Every other kind's point is its
# values, the right answers ("correct": the reference's own values) among them: it is graded on
# values alone on every assignment (grading.valuegrade: the same judge, verdicts and report, no
# kernel), and, on KERNEL_EVERYTHING, in a kernel too (one assignment meets every path end to
# end, the right notebook's full marks in nbgrader's gradebook among them).
KERNEL_EVERYWHERE = frozenset({"unanswered"})
# A typical mistake is graded on values (its code run with the student's givens, outside a
# kernel) except where its code needs the notebook around it:
TYPICAL_IN_A_KERNEL = {"a7_measuring": "its code reads RUN_A, the table the notebook builds",
                       "a10_capstone": "its code is a training step run on ranks",
                       "a12_checkpointing": "its code saves and resumes a job on ranks"}
KERNEL_EVERYTHING = "a1_training_state"
VALUE_KINDS = ("correct", "wrong", "raises", "fake_values", "uses_helper", "honest_",
               "copies_peer", "typed_identity", "unit_")  # (a prefix: honest_1, unit_gib, ...)

# A class of 24 a1 submissions that meets every path of grading at once (right, wrong, unit and
# typical mistakes, cheats, attacks on the judge and on the course data, unreadable and missing
# notebooks, copied answers): benchmarks/grading_executors.py times the executors on it, and
# tests/test_slurm.py grades, both ways, the part of it that meets a Slurm task's surroundings.
EXECUTOR_CLASS = [
    "correct", "wrong", "unit_gib", "unit_bytes", "raises", "edited_tests", "deleted_tests",
    "fake_values", "patch_isclose", "patch_sys_modules", "patch_builtins", "shadow_course_utils",
    "malformed_json", "missing_notebook", "stderr_noise", "unanswered", "reads_expected",
    "hidden_payload", "uses_helper", "typical_mistake", "honest_1", "copies_peer",
    "typed_identity", "writes_course_data"]


def cases_for(assignment: str, references: dict | None = None,
              prefix: str = "") -> list[tuple[Case, dict]]:
    """Every synthetic student of ``assignment``: (expectation, {notebook: NotebookNode or
    str (raw text) or None (missing)} plus ``"_files"``: extra files to put beside it).
    ``prefix``: what :func:`write` puts before each name (the class's peers are named by it)."""
    references = references or {}
    [model] = load(assignment)  # the course has one notebook per assignment
    full, name = model.auto_max, model.name
    out: list[tuple[Case, dict]] = []

    def add(kind, deserved, nb, **kw):
        files = kw.pop("files", {})
        out.append((Case(f"{kind}", kind, deserved, **kw), {name: nb, "_files": files}))

    correct = {**_answer_codes(model, lambda g, c: c), **model.manual}
    wrong = _answer_codes(model, lambda g, c: f"{c}\n{snippets.WRONG}\n{_apply(assigned_names(c), '_syn_wrong')}")
    first = _first_answer(model)
    lost = model.points_of(first)

    add("correct", full, _notebook(model, correct))
    add("wrong", 0.0, _notebook(model, wrong))
    for suffix, gid, code, words, _, _ in _unit_cases(assignment, model, references):
        add(suffix, full - model.points_of(gid), _notebook(model, {**correct, gid: code}),
            feedback=[words])
    add("raises", full - lost, _notebook(model, {**correct, first: "raise RuntimeError("
                                                 "'synthetic: the answer raises')\n" + correct[first]}))
    add("infinite_loop", full - lost, _notebook(model, {**correct, first: snippets.LOOP}), slow=True)
    add("swallows_interrupt", full - lost, _notebook(model, {**correct, first: snippets.SWALLOW}),
        slow=True)
    add("edited_tests", 0.0, _notebook(model, wrong, edit_tests=True), flags=["was edited"])
    add("deleted_tests", 0.0, _notebook(model, wrong, drop_tests=True), flags=["was deleted"])
    # values that lie to comparisons: the answer's own code runs first (so every name exists),
    # then its values are replaced, the graded answers taking turns between an object equal to
    # everything and a float subclass equal to everything (one kernel run, and every judge
    # function of the assignment meets one of the two)
    graded = [g for g in model.answers if model.points_of(g) > 0]
    fake = {g: (snippets.ALWAYS_EQUAL, snippets.LYING_FLOAT)[graded.index(g) % 2] if g in graded
            else snippets.ALWAYS_EQUAL for g in model.answers}
    add("fake_values", 0.0, _notebook(model, _answer_codes(
        model, lambda g, c: f"{c}\n{fake[g]}\n{_apply(assigned_names(c), '_syn_fake')}")),
        flags=["defines __eq__"] + (["subclasses float"] if len(graded) > 1 else []))
    add("patch_isclose", 0.0, _notebook(model, {g: snippets.PATCH_ISCLOSE + c for g, c in wrong.items()}),
        flags=["assigns to math.isclose"])
    add("patch_sys_modules", 0.0,
        _notebook(model, {g: c + "\n" + snippets.PATCH_SYS_MODULES for g, c in wrong.items()}),
        flags=["sys.modules"])
    add("patch_builtins", 0.0, _notebook(model, {g: snippets.PATCH_BUILTINS + c for g, c in wrong.items()}),
        flags=["builtins.abs"])
    add("shadow_course_utils", 0.0, _notebook(model, wrong), files=snippets.FAKE_PACKAGE,
        flags=["course_utils/ folder"])
    add("malformed_json", None, '{"cells": [{"cell_type": "code", "source": "x = 1"',
        status="not graded: " + name + " is not a valid notebook")
    add("missing_notebook", None, None, files={"my_answers.txt": "I forgot to upload it\n"},
        status=f"not graded: notebook {name} missing")
    add("stderr_noise", full, _notebook(model, {**model.manual, **_answer_codes(
        model, lambda g, c: f"{snippets.NOISY}\n{c}\n{_apply(assigned_names(c), '_syn_noisy')}")}))
    add("unanswered", 0.0, copy.deepcopy(model.release))
    # attacks on the grader: scored as the wrong answers they come with, no side effect
    for kind, attack in (("reads_solutions", snippets.READ_SOLUTIONS), ("writes_library", snippets.WRITE_LIBRARY),
                         ("writes_course_data", snippets.WRITE_DATA), ("late_process", snippets.LATE_PROCESS)):
        attack = attack.format(assignment=assignment, notebook=name)
        add(kind, 0.0, _notebook(model, {g: f"{c}\n{attack}" for g, c in wrong.items()}),
            side_effects=True)
    import base64
    payload = base64.b64encode(snippets.PATCH_SYS_MODULES.encode()).decode()
    for kind, attack in (("reads_expected", snippets.READS_EXPECTED), ("rewrites_tests", snippets.REWRITES_TESTS),
                         ("hidden_payload", snippets.HIDDEN_PAYLOAD.format(payload=payload))):
        add(kind, 0.0, _notebook(model, {g: f"{c}\n{attack}" for g, c in wrong.items()}))
    add("huge_output", full, _notebook(model, {**correct, first: snippets.HUGE_OUTPUT + correct[first]}))
    add("memory_hog", full - lost, _notebook(model, {**correct,
                                                     first: snippets.MEMORY_HOG + correct[first]}))
    not_allowed = getattr(judge.load(assignment), "HELPERS_NOT_ALLOWED", {})
    if not_allowed:  # a right answer that names a helper computing it: flagged, not penalised
        gid = next(g for g in correct if g in not_allowed)
        helper = not_allowed[gid][0]
        module, _, fn = helper.partition(".")
        add("uses_helper", full, _notebook(model, {**correct, gid: (
            f"{correct[gid]}\nfrom course_utils import {module} as _syn_mod\n"
            f"_syn_helper = _syn_mod.{fn}")}), flags=[f"uses course_utils.{helper}"])
    for kind, (codes, flags) in OWN_ATTACKS.get(assignment, {}).items():
        add(kind, full - sum(model.points_of(g) for g in codes),
            _notebook(model, {**correct, **codes}), flags=flags)
    if assignment in TYPICAL_MISTAKES:
        gid, code, words = TYPICAL_MISTAKES[assignment]
        add("typical_mistake", full - model.points_of(gid), _notebook(model, {**correct, gid: code}),
            feedback=[words])
    if course.givens_for(assignment, None) is not None:
        for case, files in _variant_cases(assignment, model, correct, references, prefix):
            add(case.kind, case.deserved, files, flags=case.flags)
    return out


# ------------------------------------------------------------------------------ the class

HONEST = 4  # students beyond "correct" whose own (right) answers meet their own numbers
PEER = "correct"  # whose answers the copiers hand in


def _variant_cases(assignment: str, model: Model, correct: dict, references: dict,
                   prefix: str) -> list[tuple[Case, nbformat.NotebookNode]]:
    """The class of an assignment with per-student numbers (issue 26): honest students (the
    reference's code, which reads each student's own ``G``), a student who hands in
    :data:`PEER`'s right values typed in (``copies_peer``), and one who also worked the
    notebook under the peer's identity (``typed_identity``: the givens cell shows the peer's
    numbers). A copied answer scores 0 where the peer's numbers differ from the student's own,
    and the report names the peer; the identity typed is flagged."""
    from course_utils.assess import variants

    rules = judge.load(assignment)
    peer = prefix + PEER
    peer_right = expected.right_values(rules, variants.givens(assignment, student=peer))
    peer_values = {n: v for cell in peer_right.values() for n, v in cell.items()}
    indexed: dict[str, dict[int, object]] = {}  # a4's "w1_local[0]": a tuple answered whole
    for n, v in peer_values.items():
        m = re.fullmatch(r"(\w+)\[(\d+)\]", n)
        if m:
            indexed.setdefault(m.group(1), {})[int(m.group(2))] = v
    tuples = {n: tuple(ix[i] for i in range(len(ix))) for n, ix in indexed.items()
              if sorted(ix) == list(range(len(ix)))}
    pasted = {}
    for gid, code in model.answers.items():
        names = [n for n in assigned_names(code) if n in peer_values or n in tuples]
        pasted[gid] = code + "".join(
            f"\n{n} = {peer_values[n] if n in peer_values else tuples[n]!r}" for n in names)
    ref_subs = references.get(model.name, {}).get("submissions", {})
    peer_givens = variants.givens(assignment, student=peer)

    def copied(kind: str, extra_flags: list[str]) -> Case:
        own = variants.givens(assignment, student=prefix + kind)
        lost, flags, failed, passed = 0.0, list(extra_flags), {}, []
        for gid, right in peer_right.items():
            # (what the judge does not check, a8's compiled programs, stays the reference's)
            pairs = [(n, right.get(n, v)) for n, v in ref_subs.get(gid, [])]
            if not judge.judge_cell(rules, gid, pairs, pairs, givens=own).passed:
                lost += model.points[gid]
                failed[gid] = copies._pairs(ref_subs.get(gid, []), right)
            else:
                passed.append(gid)
        # whether the report names the peer: grading.copies's rule, on this copier and the peer
        found = copies.matches(assignment, {kind: (own, failed, passed),
                                            peer: (peer_givens, {}, list(peer_right))},
                               {g: [tuple(p) for p in v] for g, v in ref_subs.items()}
                               ) if ref_subs else {kind: []}
        if found[kind]:
            flags.append("the answers are what the numbers of ")
        return Case(kind, kind, model.auto_max - lost, flags=flags)

    out = [(Case(f"honest_{i}", f"honest_{i}", model.auto_max), _notebook(model, correct))
           for i in range(1, HONEST + 1)]
    out.append((copied("copies_peer", []), _notebook(model, {**correct, **pasted})))
    typed = _notebook(model, {**correct, **pasted})
    for cell in typed.cells:
        if cell.cell_type == "code" and variants.switch_of(cell.source) is not None:
            cell.execution_count = 1
            cell.outputs = [nbformat.v4.new_output(
                "execute_result", execution_count=1,
                data={"text/plain": repr(variants.givens(assignment, student=peer))})]
    out.append((copied("typed_identity", [f"worked with {peer}'s numbers"]), typed))
    return out


def write(cases: list[tuple[Case, dict]], submitted: Path, assignment: str,
          prefix: str = "") -> list[Case]:
    """Write each case as ``submitted/<prefix><student>/<assignment>/``; returns the cases."""
    written = []
    for case, files in cases:
        case = copy.copy(case)
        case.student = prefix + case.student
        target = submitted / case.student / assignment
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for rel, content in files.items():
            if rel == "_files":
                for extra, text in content.items():
                    (target / extra).parent.mkdir(parents=True, exist_ok=True)
                    (target / extra).write_text(text)
            elif content is None:
                continue
            elif isinstance(content, str):
                (target / rel).write_text(content)
            else:
                nbformat.write(content, target / rel)
        written.append(case)
    return written


def hand_in(cases: list[tuple[Case, dict]], data: Path, assignment: str) -> list[Case]:
    """Write each case where grading finds it: in ``data/submitted`` (:func:`write`), or, for a
    case handed in through collect (``Case.inbox``), into an inbox that
    :func:`grading.workflow.collect` copies from, as an instructor's collect does."""
    from grading import workflow

    inbox = data / "inbox"
    written = write([c for c in cases if not c[0].inbox], data / "submitted", assignment)
    through = write([c for c in cases if c[0].inbox], inbox, assignment)
    if through:
        workflow.collect(inbox, assignment, data)
        shutil.rmtree(inbox)
    return written + through


def mechanics_of(assignment: str) -> frozenset:
    """The :data:`MECHANICS` kinds graded on ``assignment`` in the test suite."""
    return MECHANICS_ON.get(assignment, frozenset())


def is_value_kind(kind: str) -> bool:
    """Is ``kind`` one whose point is its values (:data:`VALUE_KINDS`)?"""
    return any(kind == k or (k.endswith("_") and kind.startswith(k)) for k in VALUE_KINDS)


def kernel_kinds(assignment: str) -> set[str] | None:
    """The kinds the suite grades in a kernel on ``assignment`` (None: every kind)."""
    if assignment == KERNEL_EVERYTHING:
        return None
    typical = {"typical_mistake"} if assignment in TYPICAL_IN_A_KERNEL else set()
    return set(KERNEL_EVERYWHERE | typical | mechanics_of(assignment)
               | set(OWN_ATTACKS.get(assignment, {})))


def is_valued(assignment: str, kind: str) -> bool:
    """Is ``kind`` graded on values alone on ``assignment`` (:func:`value_cases`)?"""
    return is_value_kind(kind) or (kind == "typical_mistake" and assignment in TYPICAL_MISTAKES
                                   and assignment not in TYPICAL_IN_A_KERNEL)


def value_cases(assignment: str, references: dict,
                prefix: str = "") -> list[tuple[Case, nbformat.NotebookNode, dict]]:
    """The kinds of :func:`cases_for` whose point is their values, each with the values its test
    cells would submit (``grading.valuegrade.values_for``): ``(case, notebook, values)``."""
    from course_utils.assess import variants
    from grading import valuegrade

    [model] = load(assignment)
    reference = references[model.name]["submissions"]
    first = _first_answer(model)
    units = {suffix: (name, factor) for suffix, _, _, _, name, factor
             in _unit_cases(assignment, model, references) if name is not None}
    peer = variants.givens(assignment, student=prefix + PEER) \
        if course.givens_for(assignment, None) is not None else None
    out = []
    for case, files in cases_for(assignment, references, prefix):
        if not is_valued(assignment, case.kind) or (case.kind.startswith("unit_")
                                                    and case.kind not in units):
            continue
        own = course.givens_for(assignment, prefix + case.kind)
        mistake = None
        if case.kind == "typical_mistake":
            gid, code, _ = TYPICAL_MISTAKES[assignment]
            mistake = (code, model.tests_of[gid])
        values = valuegrade.values_for(assignment, case.kind, own, reference,
                                       model.tests_of[first], peer_givens=peer,
                                       unit=units.get(case.kind), mistake=mistake)
        case = copy.copy(case)
        case.student = prefix + case.kind
        out.append((case, files[model.name], values))
    return out


def build(assignment: str, submitted: Path, references: dict | None = None,
          prefix: str = "", kinds: set[str] | None = None,
          mechanics: bool | frozenset = True) -> list[Case]:
    """Write the synthetic submissions of ``assignment`` (optionally only ``kinds``), with
    every :data:`MECHANICS` kind (``mechanics=True``), none (False) or those in the set given."""
    keep = MECHANICS if mechanics is True else (mechanics or frozenset())
    cases = [(c, f) for c, f in cases_for(assignment, references, prefix)
             if (kinds is None or c.kind in kinds) and (c.kind not in MECHANICS or c.kind in keep)]
    return write(cases, submitted, assignment, prefix)


def clone(assignment: str, submitted: Path, kind: str, n: int, references: dict | None = None,
          prefix: str = "s") -> list[str]:
    """``n`` students submitting the same synthetic ``kind`` (for benchmarks)."""
    [(case, files)] = [(c, f) for c, f in cases_for(assignment, references) if c.kind == kind]
    students = []
    for i in range(n):
        [w] = write([(case, files)], submitted, assignment, prefix=f"{prefix}{i:03d}_")
        students.append(w.student)
    return students


__all__ = ["Case", "EXECUTOR_CLASS", "KERNEL_EVERYTHING", "KERNEL_EVERYWHERE", "MECHANICS",
           "MECHANICS_ON", "VALUE_KINDS", "TYPICAL_IN_A_KERNEL", "is_value_kind", "is_valued",
           "kernel_kinds", "value_cases",
           "mechanics_of", "TYPICAL_MISTAKES", "OWN_ATTACKS", "UNIT_MISTAKES", "assigned_names",
           "build", "cases_for", "clone", "load", "solution_code", "write"]
