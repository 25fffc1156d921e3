"""nbgrader autograde preprocessors that keep one bad cell from costing a whole submission.

``nbgrader_config.py`` puts them into ``Autograde.autograde_preprocessors``:

* :class:`RecoveringExecute` replaces nbgrader's ``Execute``. A cell that outlives
  ``Execute.timeout`` is interrupted as before; if the kernel ignores the interrupt (a loop that
  catches ``KeyboardInterrupt``) or dies (``os._exit`` in an answer), nbgrader would give up on
  the whole notebook and grade nothing. Here the kernel is restarted, the cells before the bad
  one are run again (silently, their outputs kept), the bad cell gets a ``CellTimeoutError`` /
  ``DeadKernelError`` output, and grading goes on with the next cell.
* :class:`StderrToStdout` moves stderr text in *test* cells to stdout before the grades are
  saved: nbgrader scores any test cell that wrote to stderr 0, so a correct student whose code
  logs a warning would lose the points. Errors are still errors (an ``error`` output).
"""

from __future__ import annotations

from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbconvert.preprocessors import Preprocessor
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute
from traitlets import Bool


class RecoveringExecute(Execute):
    """nbgrader's Execute, but a kernel stuck in (or killed by) one cell is restarted."""

    def preprocess(self, nb, resources=None, km=None):
        """Execute ``nb`` cell by cell (see :meth:`preprocess_cell`)."""
        self._skip: set[int] = set()
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        """Run one cell; on an unrecoverable timeout or a dead kernel restart and replay."""
        try:
            return super().preprocess_cell(cell, resources, index)
        except (CellTimeoutError, DeadKernelError) as err:
            dead = isinstance(err, DeadKernelError)
        self._skip.add(index)
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
