"""Shared test set-up: repository paths, slow marks, groups for parallel runs, and the one
autograde run per assignment that the grading tests share.

Parallel runs (``pytest -n 2 --dist loadgroup``, what ``make test`` does): tests that share
expensive state must run on one worker. xdist 3.8's own ``loadgroup`` cannot see
``xdist_group`` marks under pytest 9 (it renames ``item._nodeid``, which pytest 9 no longer
reads), so this file gives xdist a scheduler whose groups come from the test id
(:func:`group_of`):

* the cells of one notebook (nbval runs them in one kernel, in order): group = the notebook;
* the tests of one assignment in the grading files (:data:`_GRADING_FILES`; they share
  :func:`graded`, :func:`valued` and :func:`reference`): group = ``grading-<assignment>``;
* the tests of a file in :data:`SHARED_FILES` or :data:`HEAVY_FILES` (a module-scoped
  fixture): group = the file.

Everything else is dealt out test by test. Groups are queued heaviest first so the long ones
do not start last. On every worker, :func:`pytest_collection_modifyitems` checks that each test
that uses a shared fixture really is in a group, so a new shared fixture cannot silently split.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Kernels started by nbval/nbclient/nbgrader import the course's own course_utils first.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

# The reference solutions' runs, kept between test runs and keyed by content hash (solution,
# course_utils sources, Python/torch/kernel versions): a changed solution is run again.
REFERENCE_CACHE = ROOT / ".cache" / "reference"
# (everything that runs a reference without naming a cache, the report's copied-answer check
# among them, finds it there: grading.reference.CACHE_ENV)
os.environ["COURSE_REFERENCE_CACHE"] = str(REFERENCE_CACHE)
# Each reference run goes on its judge tour (grading.reference.judge_tour: 20 students'
# numbers, 2 more draws of the hidden inputs) in the same kernel: the tests judge what it
# recorded, no second kernel.
os.environ["COURSE_REFERENCE_TOUR"] = "1"

# Per-student numbers (course_utils.assess.variants): the tests see the base numbers whatever identity
# this machine has (a student's `make lab` records one, a hub sets its user), unless a test sets
# one itself; subprocesses (JupyterLab, nbgrader, make) inherit this.
for _var in ("COURSE_STUDENT", "JUPYTERHUB_USER"):
    os.environ.pop(_var, None)
os.environ["COURSE_IDENTITY_FILE"] = str(ROOT / ".cache" / "tests-have-no-identity")

# Files whose tests share a module-scoped fixture (a browser, a set of real-rank runs).
SHARED_FILES = {"tests/test_browser_course.py", "tests/test_browser_playground.py",
                "tests/test_browser_widgets.py", "tests/test_capstone.py",
                "tests/test_checkpoint.py", "tests/test_data_parallel.py", "tests/test_fsdp.py",
                "tests/test_grading_pages.py",
                "tests/test_jax_sharding.py", "tests/test_launch.py", "tests/test_measure.py",
                "tests/test_pipeline_parallel.py", "tests/test_sequence_parallel.py",
                "tests/test_site.py", "tests/test_train3d.py", "tests/test_zero.py",
                "tests/test_zero1.py"}
# Files whose shared fixture runs for minutes: queued first, with the grading groups.
HEAVY_FILES = {"tests/test_student_copy.py", "tests/test_hub.py", "tests/test_grading_host.py", "tests/test_slurm.py"}
# Heavy files that must not run at the same time: both bring up a one-node Slurm on this host
# (one slurmd per host), so they share a group (one worker, one after the other).
SAME_WORKER = {"tests/test_hub.py": "tests/test_slurm.py"}
_GRADING_FILES = {"tests/test_assignments.py", "tests/test_grading_integrity.py",
                  "tests/test_visible_checks.py", "tests/test_variant_grading.py"}
_ASSIGNMENT = re.compile(r"\[(a\d+_[a-z_]+?)(?:-|\])")
# Queue order for parallel runs (lower first): the long groups go out first.
_COST = {"heavy": 0, "grading": 0, "notebook": 1, "file": 2, "test": 3}


def group_of(nodeid: str) -> tuple[str, str]:
    """(kind, group) of a test id; kind "test" means the test is its own group."""
    path, _, rest = nodeid.partition("::")
    if path.endswith(".ipynb"):
        return "notebook", path
    if path in _GRADING_FILES:
        m = _ASSIGNMENT.search(rest)
        if m:
            return "grading", f"grading-{m.group(1)}"
    if path in HEAVY_FILES:
        return "heavy", SAME_WORKER.get(path, path)
    if path in SHARED_FILES:
        return "file", path
    return "test", nodeid


def _shares_state(item) -> bool:
    """Does the item use a module- or session-scoped fixture of the course's own tests?"""
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else []):
        for d in defs:  # (pytest's own session fixtures, such as tmp_path_factory, are fine)
            own = Path(inspect.getfile(d.func)).resolve().is_relative_to(ROOT / "tests")
            if own and d.scope in ("module", "package", "session"):
                return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    keyed = []
    for i, item in enumerate(items):
        if item.nodeid.endswith(".ipynb") or ".ipynb::" in item.nodeid:
            item.add_marker(pytest.mark.slow)
        kind, group = group_of(item.nodeid)
        if kind == "test" and _shares_state(item):
            raise pytest.UsageError(
                f"{item.nodeid} uses a shared fixture but has no group for parallel runs: "
                f"add its file to SHARED_FILES in tests/conftest.py")
        keyed.append(((_COST[kind], group if kind != "test" else "", i), item))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the same order on every worker
        items[:] = [item for _, item in sorted(keyed, key=lambda kv: kv[0])]


@pytest.hookimpl(optionalhook=True)  # (a run without xdist has no such hook)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: whole groups (see :func:`group_of`) go to one worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)[1]

    return GroupScheduling(config, log)


# ------------------------------------------------------------------------------ grading


@dataclass
class GradedRun:
    """Every synthetic submission of one assignment, graded by one parallel autograde."""

    name: str
    cases: dict  # kind -> grading.synthetic.Case
    results: dict  # student -> grading.integrity.StudentResult
    data: Path  # its $COURSE_DATA: submitted/, autograded/, feedback/, gradebook.db, reports/
    run: object  # grading.workflow.AutogradeRun
    release: Path  # the release nbgrader generated from solutions/ while registering
    reference: dict  # grading.integrity.reference_run() of the solution
    changed: list  # files outside the submissions that grading changed (must stay empty)


def numbers_in(value) -> list[float]:
    """The numbers in a value: a number, or a list or tuple of them, nested (not bools)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in numbers_in(v)]
    return []


def _snapshot() -> dict[Path, str]:
    """SHA-256 of the files an attack on the grader would change: the course library, the
    repository's grading code and solutions, and the cached reference runs."""
    import hashlib

    paths = [*ROOT.glob("course_utils/**/*.py"), *ROOT.glob("grading/**/*.py"),
             *ROOT.glob("solutions/**/*.ipynb"),
             *ROOT.glob("authoring/**/*.py"), *REFERENCE_CACHE.glob("**/*.json"),
             ROOT / "nbgrader_config.py"]
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


@pytest.fixture(scope="session")
def reference():
    """``reference(name)``: the reference solution's run (see ``integrity.reference_run``)."""
    from grading import integrity

    return lambda name: integrity.reference_run(name, cache=REFERENCE_CACHE)


@pytest.fixture(scope="session")
def graded(tmp_path_factory):
    """``graded(name) -> GradedRun``, made once per assignment per test session.

    One autograde (2 workers; 1 for at most two submissions) grades, in sandboxed kernels, the kinds
    only a kernel can show (``synthetic.kernel_kinds``: the blank release, the typical
    mistake's own code, the assignment's own attacks, and the attacks on
    the grader's machinery where ``synthetic.MECHANICS_ON`` says; every kind on
    ``synthetic.KERNEL_EVERYTHING``); then feedback and the report. The kinds whose point is
    their values are graded by :func:`valued`. The tests of the grading files
    assert on the shared results.
    """
    from grading import integrity, synthetic, workflow

    runs: dict[str, GradedRun] = {}

    def get(name: str) -> GradedRun:
        if name in runs:
            return runs[name]
        data = tmp_path_factory.mktemp(f"grading-{name}")
        reference = integrity.reference_run(name, data, cache=REFERENCE_CACHE)
        cases = synthetic.build(name, data / "submitted", reference,
                                kinds=synthetic.kernel_kinds(name),
                                mechanics=synthetic.mechanics_of(name))
        # The loop cases cost one cell timeout each: short, but well above the reference's
        # slowest cell on a loaded machine.
        slowest = max(r["max_cell_s"] for r in reference.values())
        timeout = int(max(10, 4 * slowest + 5))
        release = data / "release"
        workflow.register(name, data, release_dir=release)
        before = _snapshot()
        order = [c.student for c in cases if c.slow] + [c.student for c in cases if not c.slow]
        # (one or two submissions: one nbgrader process grades them, one import of nbgrader
        # and the judge fewer; the suite is CPU-bound, and every larger class is graded by two)
        workers = 1 if len(cases) <= 2 else 2
        run = workflow.autograde(name, workers=workers, data=data, students=order,
                                 timeout=timeout, register_first=False,
                                 reference_cache=REFERENCE_CACHE)
        workflow.feedback(name, data=data)
        after = _snapshot()
        # changed or deleted files, and new files except reference runs (another worker may be
        # caching the reference of another assignment meanwhile)
        changed = sorted(str(p) for p in before if before[p] != after.get(p)) + sorted(
            str(p) for p in after if p not in before and not p.is_relative_to(REFERENCE_CACHE))
        results, csv_path = integrity.report(name, data)
        keep = ROOT / "test-artifacts" / "grading-reports"  # for CI to keep
        keep.mkdir(parents=True, exist_ok=True)
        for suffix in (".csv", ".txt"):
            shutil.copy(csv_path.with_suffix(suffix), keep / f"{name}{suffix}")
        runs[name] = GradedRun(name, {c.kind: c for c in cases},
                               {r.student: r for r in results}, data, run, release / name,
                               reference, changed)
        return runs[name]

    return get


@pytest.fixture(scope="session")
def valued(tmp_path_factory):
    """``valued(name) -> GradedRun``: the kinds whose point is their values (right, wrong, unit
    mistakes, a raising answer, objects that lie, a helper used, honest students on their own
    numbers, a copier, a typed identity), graded on values alone (``grading.valuegrade``: the
    same judge, verdicts and report as a kernel's run, no kernel), then the report. Seconds per
    assignment; ``run`` and ``release`` are None (no autograde ran)."""
    from grading import integrity, synthetic, valuegrade

    runs: dict[str, GradedRun] = {}

    def get(name: str) -> GradedRun:
        if name not in runs:
            data = tmp_path_factory.mktemp(f"valued-{name}")
            reference = integrity.reference_run(name, data, cache=REFERENCE_CACHE)
            cases = synthetic.value_cases(name, reference)
            [notebook] = integrity.notebook_names(name)
            valuegrade.grade(name, data, {c.student: (nb, v) for c, nb, v in cases},
                             reference[notebook]["submissions"])
            results, _ = integrity.report(name, data)
            runs[name] = GradedRun(name, {c.kind: c for c, _, _ in cases},
                                   {r.student: r for r in results}, data, None, None,
                                   reference, [])
        return runs[name]

    return get
