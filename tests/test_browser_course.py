"""The course in a real JupyterLab (Debian's Chromium driven by Playwright).

1. ``notebooks/01_training_state.ipynb`` opened and run with Run > Run All Cells: every code cell
   finishes, no error output, each cell's printed text matches the committed (nbval-checked)
   output line by line, and the budget plot renders as a decoded PNG.
2. ``assignments/a1_training_state`` validated with the notebook toolbar's Validate button:
   the blank release, a notebook with the reference answers, and one with a known wrong answer;
   the dialog must report the failing tests (naming ``NotImplementedError``) for the first,
   success for the second, and name the misconception (never "Success") for the third.
3. The formgrader, opened from the Nbgrader menu in a JupyterLab whose folder is a copy of the
   course (its ``nbgrader_config.py``, ``solutions/``, ``assignments/``), with student data in a
   temporary ``$COURSE_DATA``: it lists the course's assignment and shows neither the
   "course id has not been set" nor the "exchange directory" warning.

Screenshots: ``test-artifacts/course-lecture-01.png``, ``course-validate-blank.png``,
``course-validate-solved.png``, ``course-formgrader.png``. Uses ``tests/jupyterlab_harness.py``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from jupyterlab_harness import (LabServer, MakeLab, error_outputs, lab_browser,  # noqa: F401
                                lab_page, open_notebook, require_chromium, run_all, screenshot)

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parent.parent
A1 = "a1_training_state"


class CourseLab(LabServer):
    """The harness's LabServer, with notebook windowing off (``LabServer(windowing=False)``:
    a lecture is longer than a page) and optionally the course's setup. With
    ``course=True`` the served folder gets a copy of ``nbgrader_config.py``, ``solutions/`` and
    ``assignments/`` before the server starts (the formgrader reads them at start-up).
    """

    def __init__(self, course: bool = False, **kwargs):
        super().__init__(windowing=False, **kwargs)
        self.course = course

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.course:
            root = self.base / "root"
            shutil.copy(ROOT / "nbgrader_config.py", root / "nbgrader_config.py")
            for folder in ("solutions", "assignments"):
                shutil.copytree(ROOT / folder / A1, root / folder / A1, dirs_exist_ok=True)
        return env


@pytest.fixture
def course_lab():
    """A fresh CourseLab; fails the test if a kernel or child survives its shutdown."""
    require_chromium()
    server = CourseLab()
    with server:
        yield server
    assert not server.survivors, f"processes survived the server's shutdown: {server.survivors}"


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_lecture_runs_with_outputs_and_plot(course_lab, lab_page):  # noqa: F811
    lab_server = course_lab
    page = lab_page
    src = ROOT / "notebooks" / "01_training_state.ipynb"
    path = lab_server.add_file(src)
    open_notebook(page, lab_server, path)
    run_all(page, timeout_s=240)
    assert error_outputs(page) == []

    stored = [c for c in nbformat.read(src, as_version=4).cells if c.cell_type == "code"]
    cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell")
    assert cells.count() == len(stored)
    for i, cell in enumerate(stored):
        if cell.source.startswith("# NBVAL_IGNORE_OUTPUT"):
            continue
        want = [_norm(line) for o in cell.outputs if o.output_type == "stream"
                for line in o.text.splitlines() if line.strip()]
        shown = _norm(cells.nth(i).locator(".jp-OutputArea").inner_text())
        missing = [line for line in want if line not in shown]
        assert not missing, f"code cell {i} does not show {missing[:3]}"

    # a widget's output also carries a PNG (what the site shows), but the live lab renders the
    # widget itself: figures as pictures, widgets as widgets
    widget = "application/vnd.jupyter.widget-view+json"
    plots = page.locator(".jp-OutputArea-output[data-mime-type='image/png'] img")
    plots.first.wait_for(timeout=60_000)
    assert plots.count() == sum(1 for c in stored for o in c.outputs
                                if "image/png" in o.get("data", {}) and widget not in o["data"])
    views = page.locator(".jp-OutputArea-output:has(.jupyter-widgets)")
    assert views.count() == sum(1 for c in stored for o in c.outputs
                                if widget in o.get("data", {}))
    assert plots.first.evaluate("i => i.complete && i.naturalWidth > 200")
    plots.first.scroll_into_view_if_needed()
    screenshot(page, "course-lecture-01")


def _solved_release() -> nbformat.NotebookNode:
    """The released a1 notebook with the reference answers typed into the answer cells."""
    from grading import synthetic

    [(case, files)] = [(c, f) for c, f in synthetic.cases_for(A1) if c.kind == "correct"]
    return files[f"{A1}.ipynb"]


def _validate(page, timeout_s: float = 180) -> str:
    """Press the toolbar's Validate button; returns the dialog's text (and closes it)."""
    page.get_by_role("button", name="Validate").first.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=30_000)
    body = dialog.locator(".jp-Dialog-body")
    # the dialog first says it is validating, then shows the result
    page.wait_for_function(
        "() => { const b = document.querySelector('.jp-Dialog .jp-Dialog-body');"
        " return b && /success|fail|error|tests/i.test(b.innerText)"
        " && !/^\\s*validating/i.test(b.innerText); }", timeout=timeout_s * 1000)
    return body.inner_text()


def test_validate_button_reports_failures_and_success(course_lab, lab_page):  # noqa: F811
    lab_server = course_lab
    page = lab_page
    blank = lab_server.add_file(ROOT / "assignments" / A1 / f"{A1}.ipynb", f"blank/{A1}.ipynb")
    solved_path = lab_server.root_dir / "solved" / f"{A1}.ipynb"
    solved_path.parent.mkdir(parents=True)
    nbformat.write(_solved_release(), solved_path)

    open_notebook(page, lab_server, blank)
    text = _validate(page)
    screenshot(page, "course-validate-blank")
    assert "NotImplementedError" in text, text
    assert "Success" not in text, text
    page.locator(".jp-Dialog").get_by_role("button").last.click()

    open_notebook(page, lab_server, f"solved/{A1}.ipynb")
    text = _validate(page)
    screenshot(page, "course-validate-solved")
    assert "Success" in text and "passes all the tests" in text, text
    page.locator(".jp-Dialog").get_by_role("button").last.click()

    # a known wrong answer (the 12-byte row of the table for Q1) never validates silently:
    # the visible test names the misconception without giving the right value
    wrong = _solved_release()
    for cell in wrong.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "q1_state_gb":
            cell.source += "\nq1_state_gb = 13e9 * 12 / 1e9"
    wrong_path = lab_server.root_dir / "wrong" / f"{A1}.ipynb"
    wrong_path.parent.mkdir(parents=True)
    nbformat.write(wrong, wrong_path)
    open_notebook(page, lab_server, f"wrong/{A1}.ipynb")
    text = _validate(page)
    screenshot(page, "course-validate-wrong")
    assert "Success" not in text and "q1_state_gb = 156" in text, text


def test_formgrader_opens_with_the_course_config(lab_page):  # noqa: F811
    require_chromium()
    page = lab_page
    data = Path(tempfile.mkdtemp(prefix="course-data-"))
    try:
        server = CourseLab(course=True, extra_env={"COURSE_DATA": str(data)})
        with server:
            # the gradebook knows the assignment, as after `scripts/grade.py release`
            out = subprocess.run([sys.executable, "-m", "nbgrader", "db", "assignment", "add",
                                  A1], cwd=server.root_dir, env=server.env(), capture_output=True,
                                 text=True, timeout=300)
            assert out.returncode == 0, out.stderr[-2000:]
            page.goto(server.url("lab"), wait_until="domcontentloaded", timeout=120_000)
            page.get_by_role("menuitem", name="Nbgrader").click(timeout=120_000)
            page.locator("li[data-command='nbgrader:open-formgrader']").click()
            frame = page.frame_locator("iframe").first
            frame.locator("text=" + A1).first.wait_for(timeout=120_000)
            assert frame.locator("#warning-course-id").count() == 0
            assert frame.locator("#warning-exchange").count() == 0
            assert frame.locator("text=Manage Assignments").count() >= 1
            screenshot(page, "course-formgrader")
        assert not server.survivors, server.survivors
    finally:
        shutil.rmtree(data, ignore_errors=True)


class WorkspaceLab(CourseLab):
    """JupyterLab as ``make lab`` opens it: on the student's workspace (``scripts/workspace.py``)
    with the student's Jupyter configuration (``jupyter/student``)."""

    def env(self) -> dict[str, str]:
        env = super().env()
        sys.path.insert(0, str(ROOT / "scripts"))
        try:
            import workspace
        finally:
            sys.path.pop(0)
        workspace.sync(self.base / "root")
        env["JUPYTER_CONFIG_PATH"] = str(ROOT / "jupyter" / "student")
        env["IPYTHONDIR"] = str(self.base / "root" / ".ipython")  # as scripts/lab.py sets it
        return env


def test_make_lab_opens_lectures_and_assignments_without_instructor_menus(lab_page):  # noqa: F811
    require_chromium()
    page = lab_page
    server = WorkspaceLab()
    with server:
        page.goto(server.url("lab"), wait_until="domcontentloaded", timeout=120_000)
        listing = page.locator(".jp-DirListing-content")
        for name in ("lectures", "assignments", "START_HERE.md"):
            listing.get_by_text(name, exact=True).wait_for(timeout=120_000)
        listing.get_by_text("lectures", exact=True).dblclick()
        listing.get_by_text("01_training_state.ipynb", exact=True).wait_for(timeout=60_000)
        screenshot(page, "course-workspace-lectures")
        assert page.get_by_role("menuitem", name="Nbgrader").count() == 0  # instructor-only
        open_notebook(page, server, f"assignments/{A1}/{A1}.ipynb")
        # no Validate button (it said "Success!" on a lecture) and no formgrader behind it
        assert page.get_by_role("button", name="Validate").count() == 0
        screenshot(page, "course-workspace-assignment")
        import urllib.error
        import urllib.request

        for path in ("formgrader", "assignments", "validate_assignment"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(server.url(path), timeout=30)
            assert err.value.code == 404, (path, err.value.code)
    assert not server.survivors, server.survivors


def test_make_lab_first_opens_start_here_and_asks_nothing(lab_page, tmp_path):  # noqa: F811
    """The URL the first ``make lab`` prints opens START_HERE.md as a page (not its Markdown
    source), and no "official Jupyter news?" pop-up comes, with no setting of the student's own
    (the student configuration turns it off)."""
    require_chromium()
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import workspace
    finally:
        sys.path.pop(0)
    page = lab_page
    ws = tmp_path / "ws"
    workspace.sync(ws)
    with MakeLab(ws) as lab:
        page.goto(lab.url, wait_until="domcontentloaded", timeout=120_000)
        page.locator(".jp-RenderedMarkdown h1", has_text="Your workspace").wait_for(
            timeout=120_000)
        page.locator(".jp-DirListing-content").get_by_text("lectures", exact=True).wait_for(
            timeout=60_000)
        page.wait_for_timeout(6_000)  # (the news question comes a few seconds after loading)
        screenshot(page, "course-make-lab-first")
        assert page.get_by_text("Jupyter news").count() == 0
        assert page.locator(".jp-FileEditor").count() == 0  # a page, not the Markdown source
        lab.signal(15)
        lab.proc.wait(60)
    assert lab.survivors == []


def _answered(**sources: str) -> nbformat.NotebookNode:
    """The reference-answered a1 release with some answer cells replaced."""
    nb = _solved_release()
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in sources:
            cell.source = sources[gid]
    return nb


def _output_of(page, index: int) -> str:
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(
        index).locator(".jp-OutputArea").inner_text()


def _run_all_until_stopped(page, server, timeout_s: float = 240) -> None:
    """Run > Run All Cells, then wait until the kernel is idle and no cell runs: Run All stops
    at the first error, as it does for a student."""
    import time

    from jupyterlab_harness import prompts

    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells").first.click()
    deadline, quiet = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        got = prompts(page)
        busy = (not got or got[0] == "[ ]:" or "[*]:" in got
                or any(k.get("execution_state") != "idle" for k in server.kernels()))
        if busy:
            quiet = None
        elif quiet is None:
            quiet = time.monotonic()
        elif time.monotonic() - quiet > 2:
            return
        time.sleep(0.3)
    raise TimeoutError(f"the notebook did not settle within {timeout_s} s: {prompts(page)}")


def _reload(page) -> None:
    """File > Reload Notebook from Disk (accepting the "unsaved changes" question)."""
    page.get_by_role("menuitem", name="File", exact=True).click()
    page.get_by_role("menuitem", name="Reload Notebook from Disk").click()
    accept = page.locator(".jp-Dialog .jp-mod-accept")
    try:
        accept.wait_for(timeout=5_000)
        accept.click()
    except Exception:  # noqa: BLE001 - no dialog: nothing was unsaved
        pass
    page.wait_for_timeout(1_000)


def _run_cell(page, index: int, timeout_s: float = 120) -> str:
    """Click code cell ``index`` of the notebook in front, run it (Shift+Enter), wait for its
    prompt to show a number; returns its output text."""
    import time

    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + timeout_s
    while not re.fullmatch(r"\[\d+\]:", cell.locator(".jp-InputPrompt").inner_text().strip()):
        assert time.monotonic() < deadline, f"cell {index} did not finish"
        time.sleep(0.3)
    return cell.locator(".jp-OutputArea").inner_text()


def test_after_a_restart_a_helper_s_missing_name_says_which_cell_defines_it(lab_page):  # noqa: F811
    """a10 Q1's test cell run after a kernel restart (Kernel > Restart Kernel): its helper
    `_q1_practice` uses `capstone`, which the first code cell imports. One line names that
    cell as JupyterLab numbers it, markdown cells counted (it was a bare 'NameError: capstone'
    with a traceback: the hint came only for a name used in the cell itself; then "code cell
    1", which JupyterLab does not show: issue 50)."""
    require_chromium()
    page = lab_page
    server = WorkspaceLab()
    copy = Path("assignments") / "a10_capstone" / "a10_capstone.ipynb"
    with server:
        cells = nbformat.read(server.root_dir / copy, as_version=4).cells
        code = [c for c in cells if c.cell_type == "code"]
        first = next(n for n, c in enumerate(cells, 1) if c.cell_type == "code")
        q1 = next(i for i, c in enumerate(code)
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "q1_test")
        open_notebook(page, server, copy.as_posix())
        assert _run_cell(page, 0).strip() == ""              # the imports, capstone among them
        page.get_by_role("menuitem", name="Kernel", exact=True).click()
        page.get_by_role("menuitem", name="Restart Kernel…").click()
        page.locator(".jp-Dialog .jp-mod-accept").click()
        page.wait_for_timeout(2_000)
        from jupyterlab_harness import wait_kernel_ready

        wait_kernel_ready(page, server, copy.as_posix())
        out = _run_cell(page, q1)
        screenshot(page, "course-restart-hint")
        assert f"`capstone` is not defined in this kernel: cell {first} (`from course_utils." \
            "assess import a10_capstone as capstone" in out, out
        assert "Run All Above" in out and "Traceback" not in out
        assert len(out.strip().splitlines()) == 1, out
    assert not server.survivors, server.survivors


def test_a_student_works_through_an_assignment(lab_page):  # noqa: F811
    """As a student in `make lab`'s JupyterLab: a wrong-unit answer (GiB), then a typical
    mistake (the 12-byte row), each get the message that names them in one short block, no
    traceback (Run All stops there, as for a student); the right answers run to the end with
    no message; `make check` then grades the copy as the course's grading does and says the
    question is right."""
    require_chromium()
    page = lab_page
    server = WorkspaceLab()
    copy = Path("assignments") / A1 / f"{A1}.ipynb"
    with server:
        notebook = server.root_dir / copy
        cells = [c for c in _solved_release().cells if c.cell_type == "code"]
        tests = {c.metadata["nbgrader"]["grade_id"]: i for i, c in enumerate(cells)
                 if c.metadata.get("nbgrader", {}).get("grade")}
        nbformat.write(_answered(q1_state_gb="q1_state_gb = 13e9 * 16 / 2**30"), notebook)
        open_notebook(page, server, copy.as_posix())
        _run_all_until_stopped(page, server)
        q1 = _output_of(page, tests["q1_state_gb_test"])
        assert "GiB" in q1 and "Not right yet" in q1, q1
        assert "Traceback" not in q1 and "File " not in q1 and len(q1.strip().splitlines()) <= 2
        screenshot(page, "course-student-gib")

        nbformat.write(_answered(q3="q3_bytes_per_param = 12\nq3_state_gb = 13e9 * 12 / 1e9"),
                       notebook)
        _reload(page)
        _run_all_until_stopped(page, server)
        assert "Not right yet" not in _output_of(page, tests["q1_state_gb_test"])
        q3 = _output_of(page, tests["q3_test"])
        assert "Not right yet" in q3 and "Traceback" not in q3, q3
        screenshot(page, "course-student-mistake")

        nbformat.write(_solved_release(), notebook)  # the student fixes it
        _reload(page)
        _run_all_until_stopped(page, server)
        assert not any("Not right yet" in e or "Error" in e for e in error_outputs(page)), (
            error_outputs(page))
        screenshot(page, "course-student-right")
        check = subprocess.run([sys.executable, "scripts/grade.py", "check", A1, "--notebook",
                                str(notebook)], cwd=ROOT, capture_output=True, text=True,
                               timeout=600)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert "q1_state_gb_test (2/2): right" in check.stdout, check.stdout
    assert "WRONG" not in check.stdout, check.stdout
    assert not server.survivors, server.survivors
