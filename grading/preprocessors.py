"""nbgrader autograde preprocessors that keep one bad cell from costing a whole submission.

``nbgrader_config.py`` puts them into ``Autograde.autograde_preprocessors``:

* :class:`RecoveringExecute` replaces nbgrader's ``Execute``. **Every test cell is judged
  outside the kernel** (``grading.judge``): when it ends, its submitted values are judged against
  the reference solution's and its outputs are replaced by the verdict, so what nbgrader saves is
  the judge's score; the verdicts also go to the judge log. A cell that outlives
  ``Execute.timeout`` is interrupted as before; if the kernel ignores the interrupt (a loop that
  catches ``KeyboardInterrupt``) or dies (``os._exit`` in an answer), nbgrader would give up on
  the whole notebook and grade nothing. Here the kernel is restarted, the cells before the bad
  one are run again (silently, their outputs kept), the bad cell gets a ``CellTimeoutError`` /
  ``DeadKernelError`` output, and grading goes on with the next cell.
  Recoveries are capped (``max_recoveries``) and so is the whole submission's time
  (``max_submission_s``): past either, the remaining cells are not run and say why, so replays
  cannot make one submission take minutes. Kernels run in the sandbox of ``grading.sandbox``.
* :class:`StderrToStdout` moves stderr text in *test* cells to stdout before the grades are
  saved: nbgrader scores any test cell that wrote to stderr 0, so a correct student whose code
  logs a warning would lose the points. Errors are still errors (an ``error`` output).
* :class:`ShowOnlyErrorMessages` (feedback) keeps each error's one-line message and drops
  tracebacks and submission outputs.
* :class:`LimitOutputBytes` cuts every output to ``max_bytes`` (a 50 MB print would otherwise
  become a 50 MB autograded notebook and feedback page).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbconvert.preprocessors import Preprocessor
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute
from traitlets import Bool, Float, Int

from course_utils.checks import SUBMIT_MIME
from grading import judge
from grading.sandbox import SandboxedKernelManager, description

LIMIT_ENAME = "GradingLimit"  # the error name of a cell stopped by a limit (the report names it)


class RecoveringExecute(Execute):
    """nbgrader's Execute, but a kernel stuck in (or killed by) one cell is restarted."""

    max_recoveries = Int(3, config=True,
                         help="kernel restarts per submission before the rest is not run")
    max_submission_s = Float(600.0, config=True,
                             help="seconds for a whole submission before the rest is not run")

    def __init__(self, *args, **kwargs):
        # nbgrader's Execute passes AsyncKernelManager explicitly unless told otherwise
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, km=None):
        """Execute ``nb`` cell by cell (see :meth:`preprocess_cell`), judge its test cells and
        write the judge log."""
        self._skip: set[int] = set()
        self._recoveries = 0
        self._stopped: str | None = None
        self._deadline = time.monotonic() + self.max_submission_s
        self._verdicts: list[judge.Verdict] = []
        self._setup_judge(resources or {})
        out = super().preprocess(nb, resources, km)
        if self._log is not None:
            judge.write_log(self._log, self._verdicts, description())
        return out

    def _setup_judge(self, resources: dict) -> None:
        """The judge module and the reference's submissions of this notebook (outside the
        kernel: the sandbox hides the repository and the course data from it)."""
        from grading import integrity

        info = resources.get("nbgrader", {})
        assignment, notebook = info.get("assignment"), info.get("notebook")
        self._judge, self._reference, self._log = None, {}, None
        if not assignment or not notebook:
            return  # not an nbgrader autograde (a plain nbconvert run): nothing to judge
        data = integrity.data_dir()
        cache = os.environ.get("COURSE_REFERENCE_CACHE")
        run = integrity.reference_run(assignment, data, cache=Path(cache) if cache else None)
        self._reference = run[f"{notebook}.ipynb"]["submissions"]
        self._judge = judge.load(assignment)
        if info.get("student"):
            self._log = judge.log_path(data, assignment, info["student"], notebook)

    def preprocess_cell(self, cell, resources, index):
        """Run one cell (:meth:`_run_cell`); if it is a test cell, judge it outside the kernel
        and replace its outputs with the verdict."""
        cell, resources = self._run_cell(cell, resources, index)
        meta = cell.metadata.get("nbgrader", {})
        if (self._judge is not None and cell.cell_type == "code" and meta.get("grade")
                and not meta.get("solution")):
            gid = meta["grade_id"]
            error = judge.kernel_error(cell)
            verdict = judge.judge_cell(self._judge, gid, judge.submissions(cell),
                                       self._reference.get(gid, []), error)
            self._verdicts.append(verdict)
            if verdict.passed:
                cell.outputs = [new_output("stream", name="stdout", text=(
                    f"passed: {verdict.submitted} values judged by the grader\n"))]
            else:
                # the kernel's own error as it was (the student's code failed), else the judge's
                ename, evalue = error if error else ("AssertionError", verdict.message)
                cell.outputs = [new_output("error", ename=ename, evalue=evalue,
                                           traceback=[f"{ename}: {evalue}"])]
        return cell, resources

    def _limit_output(self, cell, why: str):
        cell.outputs = [new_output("error", ename=LIMIT_ENAME, evalue=why,
                                   traceback=[f"{LIMIT_ENAME}: {why}"])]
        return cell, self.resources

    def _run_cell(self, cell, resources, index):
        """Run one cell; on an unrecoverable timeout or a dead kernel restart and replay."""
        if cell.cell_type == "code" and self._stopped is None and time.monotonic() > self._deadline:
            self._stopped = (f"not run: the submission used its {self.max_submission_s:g} s "
                             f"grading time")
        if cell.cell_type == "code" and self._stopped is not None:
            self._skip.add(index)
            return self._limit_output(cell, self._stopped)
        try:
            return super().preprocess_cell(cell, resources, index)
        except (CellTimeoutError, DeadKernelError) as err:
            dead = isinstance(err, DeadKernelError)
        self._skip.add(index)
        self._recoveries += 1
        if self._recoveries > self.max_recoveries:
            self._stopped = (f"not run: the kernel had to be restarted more than "
                             f"{self.max_recoveries} times")
            return self._limit_output(cell, self._stopped)
        self.log.warning("cell %d %s: restarting the kernel and re-running the cells before it",
                         index, "killed the kernel" if dead else "ignored the interrupt")
        run_sync(self._async_recover)(index)
        if dead:
            ename, evalue = "DeadKernelError", "the kernel died while running this cell"
        else:
            ename, evalue = "CellTimeoutError", (
                f"this cell ran longer than {self.timeout} s and did not stop when interrupted")
        cell.outputs = [new_output("error", ename=ename, evalue=evalue,
                                   traceback=[f"{ename}: {evalue}"])]
        return cell, self.resources

    async def _async_recover(self, index: int) -> None:
        await ensure_async(self.km.restart_kernel(now=True))
        await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))
        for j, cell in enumerate(self.nb.cells[:index]):
            if cell.cell_type != "code" or j in self._skip or not cell.source.strip():
                continue
            msg_id = self.kc.execute(cell.source, store_history=False, allow_stdin=False)
            await self.async_wait_for_reply(msg_id, cell)


class StderrToStdout(Preprocessor):
    """In graded test cells, turn stderr stream outputs into stdout (errors stay errors)."""

    enabled = Bool(True).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        """Rename stderr streams of a graded, non-answer code cell to stdout."""
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
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
