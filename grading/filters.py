"""The nbgrader preprocessors that rewrite a submitted notebook (nothing here runs it).

``nbgrader_config.py`` puts them into the autograde and feedback steps:

* :class:`RestoreReleaseMetadata` (first sanitizer): every nbgrader field of every graded,
  answer and locked cell (grade, solution, locked, points, grade_id, checksum), and the cell's
  type, is put back from the release before nbgrader reads it; cells that claim nbgrader
  metadata the release does not have lose it. A test cell whose ``grade`` flag the student set
  to false is graded as released (the report flags the edit).
* :class:`LimitOutputBytes` cuts every kept output to ``max_bytes`` (a 50 MB print would
  otherwise become a 50 MB autograded notebook and feedback page).
* :class:`InertStudentContent` leaves only text and pictures in what a person will open
  (``grading.inert``); :class:`InertPage` does it again in every page nbconvert renders
  (``HTMLExporter.preprocessors``: the formgrader's and feedback's), whatever file it reads,
  and :class:`BoundPageText` bounds what such a page renders of a student's cells.
* :class:`StderrToStdout` moves stderr text in *test* cells to stdout before the grades are
  saved: nbgrader scores any test cell that wrote to stderr 0, so a correct student whose code
  logs a warning would lose the points. Errors are still errors (an ``error`` output).
* :class:`ShowOnlyErrorMessages` (feedback) keeps each error's one-line message and drops
  tracebacks and submission outputs.

Running the notebook is ``grading.preprocessors.RecoveringExecute``.
"""

from __future__ import annotations

import re

import nbformat
from nbconvert.preprocessors import Preprocessor
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Int

from course_utils.assess.checks import SUBMIT_MIME
from grading import course
from grading.inert import (PLAIN, PLAIN_NOTE, SAFE_IMAGES, drop_attachment_references,
                           inert_markdown, inert_output, is_base64, prompt_number)


def _is_test(cell) -> bool:
    return course.is_test_cell(cell)


class RestoreReleaseMetadata(NbGraderPreprocessor):
    """Sanitizer: nbgrader's metadata and cell types of every graded/answer/locked cell come
    from the committed release (``assignments/<a>/<notebook>.ipynb``), not from the student."""

    enabled = Bool(True).tag(config=True)

    def preprocess(self, nb, resources):
        info = resources.get("nbgrader", {})
        release = course.release_notebook(info.get("assignment"), info.get("notebook"))
        if release is not None:
            for change in course.restore_metadata(nb, release):
                self.log.warning("restored from the release: %s", change)
        return nb, resources


class InertStudentContent(Preprocessor):
    """Autograde and every page: every output made inert (:func:`inert_output`), every
    markdown cell that is not exactly one of the release's shown as text (:func:`inert_markdown`:
    a written answer, a cell the student added or edited; ``escape_markdown``), attachments kept
    only as base64 PNG/JPEG and references to the others removed, prompts numbers."""

    enabled = Bool(True).tag(config=True)  # nbgrader registers preprocessors as not enabled
    escape_markdown = True

    def preprocess(self, nb, resources):
        release = course.release_notebook(*_assignment_notebook(resources))
        self._course_markdown = {c.source for c in release.cells
                                 if c.cell_type == "markdown"} if release is not None else set()
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        """Make one cell inert."""
        if "outputs" in cell:
            cell["outputs"] = [nbformat.from_dict(inert_output(o, self.escape_markdown))
                               for o in cell.get("outputs", []) if isinstance(o, dict)]
        if "execution_count" in cell:
            cell["execution_count"] = prompt_number(cell.get("execution_count"))
        source = cell.get("source", "")
        source = source if isinstance(source, str) else "".join(source)
        if self.escape_markdown and cell.get("cell_type") == "markdown" and \
                source not in getattr(self, "_course_markdown", set()):
            source, _ = inert_markdown(source)
        safe = {}
        for name, bundle in (cell.get("attachments") or {}).items():
            images = {m: v for m, v in (bundle or {}).items()
                      if m in SAFE_IMAGES and is_base64(v)} if isinstance(bundle, dict) else {}
            if images and re.fullmatch(r"[\w.-]{1,100}", str(name)):
                safe[name] = images
        if "attachments" in cell:
            cell["attachments"] = nbformat.from_dict(safe)
        if cell.get("cell_type") == "markdown":
            source = drop_attachment_references(source, set(safe))
        cell["source"] = source
        return cell, resources


class InertPage(InertStudentContent):
    """The same, for a page (``HTMLExporter.preprocessors``: the formgrader's and feedback's),
    whatever notebook it renders; a written answer is not escaped again (autograde did, and
    :func:`grading.inert.safe_html` keeps any page's markdown to its allowlist)."""

    escape_markdown = False


def _assignment_notebook(resources) -> tuple[str | None, str | None]:
    """(assignment, notebook) of nbgrader's resources, or of the formgrader's page."""
    info = (resources or {}).get("nbgrader", {})
    return (info.get("assignment") or (resources or {}).get("assignment_id"),
            info.get("notebook") or (resources or {}).get("notebook_id"))


class StderrToStdout(Preprocessor):
    """In graded test cells, turn stderr stream outputs into stdout (errors stay errors)."""

    enabled = Bool(True).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        """Rename stderr streams of a graded, non-answer code cell to stdout."""
        if _is_test(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream" and output.get("name") == "stderr":
                    output["name"] = "stdout"
        return cell, resources


class LimitOutputBytes(Preprocessor):
    """Cut each output of each cell to ``max_bytes`` of text (and drop oversized images)."""

    enabled = Bool(True).tag(config=True)
    max_bytes = Int(100_000, config=True, help="largest output kept, in bytes")

    def preprocess_cell(self, cell, resources, index):
        """Truncate long streams and text results; say how much was cut."""
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                output["text"] = self._cut(output.get("text", ""))
            for mime, value in list(output.get("data", {}).items()):
                if isinstance(value, str) and len(value) > self.max_bytes:
                    if mime.startswith("text/"):
                        output["data"][mime] = self._cut(value)
                    else:
                        del output["data"][mime]
            if output.get("output_type") == "error":
                output["evalue"] = self._cut(output.get("evalue", ""))
                output["traceback"] = [self._cut(t) for t in output.get("traceback", [])][:100]
        return cell, resources

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_bytes:
            return text
        return (text[:self.max_bytes]
                + f"\n[... {len(text) - self.max_bytes} more characters cut by the grader]\n")


class BoundPageText(Preprocessor):
    """Every page (``HTMLExporter.preprocessors``): what a page spends on the cells a student
    wrote (answer cells, added or edited cells: any cell whose text is not one of the
    release's) is bounded before it renders. Rendering is the cost: pygments spends 0.3-0.5 ms
    a token on code, and mistune's rules grow with the square of some texts' length (20,000
    ``[`` took 3.5 s, 270 kB of ``\\begin{a}`` 38 s). So a student's cells are rendered up to
    ``rendered_code_chars`` of code and ``rendered_markdown_chars`` of markdown per page (a cell
    over ``rendered_cell_chars`` never), and shown as plain text past that (linear time,
    nothing lost); each cell shows at most ``max_cell_chars`` and the page
    ``max_notebook_chars`` in all, the rest cut with a note saying how much."""

    enabled = Bool(True).tag(config=True)
    rendered_code_chars = Int(6_000, config=True, help="student code highlighted per page")
    rendered_markdown_chars = Int(20_000, config=True,
                                  help="student markdown rendered per page")
    rendered_cell_chars = Int(10_000, config=True, help="largest student cell rendered")
    max_cell_chars = Int(100_000, config=True, help="student text shown per cell")
    max_notebook_chars = Int(400_000, config=True, help="student text shown per page")

    def preprocess(self, nb, resources):
        release = course.release_notebook(*_assignment_notebook(resources))
        own = {c.source for c in release.cells} if release is not None else set()
        rendered = {"code": 0, "markdown": 0}
        shown = 0
        for cell in nb.cells:
            source = cell.get("source", "")
            source = source if isinstance(source, str) else "".join(source)
            kind = cell.get("cell_type")
            cell.get("metadata", {}).pop(PLAIN, None)  # (the grader's mark, never a student's)
            if source in own or kind not in rendered:
                continue
            if shown >= self.max_notebook_chars:
                source = (f"[{len(source):,} characters not shown: a page shows "
                          f"{self.max_notebook_chars:,} characters of a student's cells]")
            elif len(source) > min(self.max_cell_chars, self.max_notebook_chars - shown):
                keep = min(self.max_cell_chars, self.max_notebook_chars - shown)
                source = (source[:keep] + f"\n[... {len(source) - keep:,} more characters "
                                          f"cut by the grader]")
            shown += len(source)
            budget = self.rendered_code_chars if kind == "code" else \
                self.rendered_markdown_chars
            if len(source) > self.rendered_cell_chars or rendered[kind] + len(source) > budget:
                cell.setdefault("metadata", {})[PLAIN] = PLAIN_NOTE.format(
                    n=len(source), limit=budget)
            else:
                rendered[kind] += len(source)
            cell["source"] = source
        return nb, resources


class ShowOnlyErrorMessages(Preprocessor):
    """Feedback: every error output as its one line ``Name: message`` (no traceback, which would
    quote the test's code); no submission outputs (a student's own display of one included)."""

    enabled = Bool(True).tag(config=True)  # nbgrader registers preprocessors as not enabled

    def preprocess_cell(self, cell, resources, index):
        """Shorten tracebacks and drop submission outputs in one cell."""
        kept = []
        for output in cell.get("outputs", []):
            if SUBMIT_MIME in output.get("data", {}):
                continue
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
            kept.append(output)
        if "outputs" in cell:
            cell["outputs"] = kept
        return cell, resources


class MarkManualPending(NbGraderPreprocessor):
    """Feedback, after nbgrader's ``GetGrades``: each question graded by hand that the
    instructor has not graded yet is marked (``nbgrader.pending``), and the notebook's
    automatic points are kept apart from the manual ones (``resources["nbgrader"]``:
    ``auto_score``, ``auto_max``, ``manual_pending``), so the page (the ``course_feedback``
    template) says "not graded yet" instead of a 0 the instructor never gave."""

    enabled = Bool(True).tag(config=True)

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook

        info = resources["nbgrader"]
        auto_score = auto_max = pending = 0.0
        with Gradebook(info["db_url"]) as gb:
            for cell in nb.cells:
                meta = cell.get("metadata", {}).get("nbgrader", {})
                if not meta.get("grade"):
                    continue
                grade = gb.find_grade(meta["grade_id"], info["notebook"], info["assignment"],
                                      info["student"])
                if meta.get("solution") and grade.manual_score is None and \
                        grade.needs_manual_grade:
                    meta["pending"] = True
                    pending += float(grade.max_score or 0)
                elif not meta.get("solution"):
                    auto_score += float(grade.score or 0)
                    auto_max += float(grade.max_score or 0)
        info.update(auto_score=auto_score, auto_max=auto_max, manual_pending=pending)
        return nb, resources


__all__ = ["BoundPageText", "InertPage", "InertStudentContent", "LimitOutputBytes",
           "MarkManualPending",
           "RestoreReleaseMetadata", "ShowOnlyErrorMessages", "StderrToStdout"]
