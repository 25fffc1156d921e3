"""nbgrader preprocessors that keep one bad submission from costing more than its own points.

``nbgrader_config.py`` puts them into ``Autograde.sanitize_preprocessors`` and
``Autograde.autograde_preprocessors``:

* :class:`RecoveringExecute` replaces nbgrader's ``Execute``. **Every test cell is judged
  outside the kernel** (``grading.judge``): when it ends, its submitted values are judged against
  the reference solution's and its outputs are replaced by the verdict, so what nbgrader saves is
  the judge's score; the verdicts also go to the judge log. It also:

  - keeps outputs only up to a per-cell and a per-notebook byte budget *as they arrive*, drops
    widget traffic, and refuses outputs nested deeper than ``max_output_depth``; the grader's
    sockets refuse any single message over ``SandboxedKernelManager.max_message_mb``, and a
    channel that refused one is reconnected;
  - restarts a kernel that ignores the interrupt, dies, is killed by its memory limit, or sends
    something the grader cannot read (any exception while a cell runs), runs the cells before
    the bad one again (silently), gives the bad cell an error naming why, and goes on;
  - caps restarts (``max_recoveries``) and the whole submission's time (``max_submission_s``);
  - records each limit that fired (the report lists them) in the judge log;
  - gives the kernel this submission's hidden cases (``grading.judge.hidden_cases``).

  Kernels run in the sandbox of ``grading.sandbox``.

The preprocessors that rewrite a notebook without running it are in ``grading.filters``.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import zmq
from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute
from traitlets import Float, Int

from course_utils.assess.checks import SUBMIT_MIME
from grading import course, judge, reference
from grading.inert import one_line
from grading.relay import RELAY_NOTE
from grading.sandbox import SandboxedKernelManager, description

LIMIT_ENAME = "GradingLimit"  # the error name of a cell stopped by a limit (the report names it)
_OUTPUT_MESSAGES = {"stream", "display_data", "execute_result", "error", "update_display_data"}
_EFBIG = "[Errno 27] File too large"


CONTAINER_BYTES = 64  # what a kept list or object costs at least (an empty dict: 64 B + its node)


def payload_size(content, max_depth: int, limit: int | None = None) -> int | None:
    """What keeping a message's content costs, in bytes: its text (strings and keys), 8 per
    other value and ``CONTAINER_BYTES`` per list or object (490,000 empty objects are 31 MB,
    not 0.5); None if it is nested more than ``max_depth`` deep. With ``limit``, counting
    stops once the size passes it (the result is then just over ``limit``). Iterative, one
    iterator per level of nesting: neither a deep structure nor a wide one (15 million zeros)
    costs memory here."""
    total, stack = 0, [iter((content,))]
    while stack:
        if limit is not None and total > limit:
            return total
        obj = next(stack[-1], _END)
        if obj is _END:
            stack.pop()
            continue
        if isinstance(obj, str):
            total += len(obj)
        elif isinstance(obj, (dict, list)):
            if len(stack) > max_depth:
                return None
            total += CONTAINER_BYTES
            if isinstance(obj, dict):
                total += sum(len(k) for k in obj if isinstance(k, str))
                stack.append(iter(obj.values()))
            else:
                total += len(obj)
                stack.append(iter(obj))
        else:
            total += 8
    return total


_END = object()


def peak_rss() -> int:
    """This process's peak resident memory, bytes: Linux's ``VmHWM`` (``ru_maxrss`` would do
    elsewhere, but on Linux it keeps the peak of the process that forked this one before its
    ``exec``: a grader started from a 745 MB test process reported 745 MB)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    scale = 1 if os.uname().sysname == "Darwin" else 1024  # (bytes on macOS, KiB elsewhere)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _is_test(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _where(cell, index: int) -> str:
    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    return f"cell {gid}" if gid else f"cell {index + 1}"


class RecoveringExecute(Execute):
    """nbgrader's Execute, hardened: see the module doc."""

    max_recoveries = Int(3, config=True,
                         help="kernel restarts per submission before the rest is not run")
    max_submission_s = Float(600.0, config=True,
                             help="seconds for a whole submission, from its first kernel's "
                                  "start, before the rest is not run")
    max_cell_output_mb = Float(4.0, config=True,
                               help="output kept per cell as it arrives (MB)")
    max_notebook_output_mb = Float(20.0, config=True,
                                   help="output kept per notebook as it arrives, test cells' "
                                        "own budgets aside (MB)")
    max_output_depth = Int(64, config=True, help="deepest nesting of an output kept")

    def __init__(self, *args, **kwargs):
        # nbgrader's Execute passes AsyncKernelManager explicitly unless told otherwise
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    # ---------------------------------------------------------------- the notebook

    def preprocess(self, nb, resources=None, km=None):
        """Execute ``nb`` cell by cell (see :meth:`preprocess_cell`), judge its test cells and
        write the judge log."""
        self._skip: set[int] = set()
        self._recoveries = 0
        self._stopped: str | None = None
        self._deadline: float | None = None  # set when the first kernel is ready
        self._verdicts: list[judge.Verdict] = []
        self._limits: list[str] = []
        self._notebook_bytes = 0
        self._oom_seen = 0
        self._monitors: list = []
        self._setup_judge(nb, resources or {})
        started, cpu = time.monotonic(), time.process_time()
        try:
            out = super().preprocess(nb, resources, km)
        finally:
            self._unwatch()
        if self._log is not None:
            # what grading this notebook cost the grader itself (not the kernel): its CPU
            # seconds, and its process's peak memory so far
            judge.write_log(self._log, self._verdicts, description(), self._limits,
                            self._values, getattr(self._givens, "variant", None),
                            seconds=time.monotonic() - started,
                            grader={"cpu_s": round(time.process_time() - cpu, 2),
                                    "peak_mb": round(peak_rss() / 1e6, 1)})
        return out

    def _setup_judge(self, nb, resources: dict) -> None:
        """The judge module, the reference's submissions of this notebook and this submission's
        hidden cases (outside the kernel: the sandbox hides the course data from it)."""
        info = resources.get("nbgrader", {})
        assignment, notebook = info.get("assignment"), info.get("notebook")
        self._judge, self._reference, self._log = None, {}, None
        self._cases, self._ref_cases, self._givens, self._values = {}, {}, None, {}
        if not assignment or not notebook:
            return  # not an nbgrader autograde (a plain nbconvert run): nothing to judge
        data = course.data_dir()
        cache = os.environ.get("COURSE_REFERENCE_CACHE")
        run = reference.reference_run(assignment, data, cache=Path(cache) if cache else None)
        self._reference = run[f"{notebook}.ipynb"]["submissions"]
        self._judge = judge.load(assignment, fresh=True)
        self._ref_cases = judge.hidden_cases(self._judge, judge.REFERENCE_KEY)
        student = info.get("student")
        # the student's own numbers, drawn here from nbgrader's student id (issue 26)
        self._givens = course.givens_for(assignment, student)
        if student:
            self._log = judge.log_path(data, assignment, student, notebook)
            key = judge.submission_key(data, assignment, student,
                                       [c.get("source", "") for c in nb.cells])
            self._cases = judge.hidden_cases(self._judge, key)
            judge.prepare(self._judge, self._cases)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        if self._cases and hasattr(km, "hidden_cases"):
            import json

            km.hidden_cases = json.dumps(self._cases)
        if hasattr(km, "student"):  # the kernel draws the same numbers the judge uses
            km.student = getattr(self._givens, "student", None) or ""
        return km

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        if hasattr(self.km, "record_kernel"):  # (ready: no student code has run yet)
            self.km.record_kernel()
        if self._deadline is None:  # (a kernel's start under load is not the student's time)
            self._deadline = time.monotonic() + self.max_submission_s
        self._watch()
        return kc

    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    # ---------------------------------------------------------------- one cell

    def preprocess_cell(self, cell, resources, index):
        """Run one cell (:meth:`_run_cell`); if it is a test cell, judge it outside the kernel
        and replace its outputs with the verdict."""
        self._strays_ended = 0
        cell, resources = self._run_cell(cell, resources, index)
        ended = self._strays_ended
        if ended:  # what the cell started and left running, detached or not (issue 41)
            self._limit(cell, index, f"{ended} process{'es' if ended > 1 else ''} this cell "
                                     f"left running {'were' if ended > 1 else 'was'} ended "
                                     f"when it finished")
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and _EFBIG in str(output.get("evalue", "")):
                self._limit(cell, index, f"a file reached the file-size limit "
                                         f"({getattr(self.km, 'max_file_mb', 0):g} MiB)")
                break
        if self._judge is not None and _is_test(cell):
            gid = cell.metadata["nbgrader"]["grade_id"]
            error = judge.kernel_error(cell)
            got = judge.submissions(cell)
            verdict = judge.judge_cell(self._judge, gid, got, self._reference.get(gid, []),
                                       error, self._cases.get(gid), self._ref_cases.get(gid),
                                       self._givens, judge.answer_source(self.nb.cells, gid))
            self._verdicts.append(verdict)
            self._progress(verdict, error, cell.metadata["nbgrader"].get("points", 0))
            if not verdict.passed and error is None and gid not in self._cases:
                self._values[gid] = got  # for the report's copied-answer evidence
            if verdict.passed:
                cell.outputs = [new_output("stream", name="stdout", text=(
                    f"passed: {verdict.submitted} values judged by the grader\n"))]
            else:
                # the kernel's own error as it was (the student's code failed), else the judge's
                ename, evalue = error if error else ("AssertionError", verdict.message)
                if verdict.message == judge.NOT_ANSWERED:
                    ename, evalue = "NotAnswered", verdict.message
                cell.outputs = [new_output("error", ename=ename, evalue=evalue,
                                           traceback=[f"{ename}: {evalue}"])]
        return cell, resources

    def _progress(self, verdict, error, points: float) -> None:
        """``make check``: one line per question as it is judged, with its points (the
        release's: nbgrader has put its metadata back by now), to the file its caller reads
        (``COURSE_PROGRESS_FILE``; only the grader's own process writes it)."""
        path = os.environ.get("COURSE_PROGRESS_FILE")
        if not path:
            return
        what = "right" if verdict.passed else one_line(
            verdict.message or (error and f"{error[0]}: {error[1]}") or "not right", 300)
        try:
            with open(path, "a") as f:
                got = points if verdict.passed else 0
                f.write(f"  {verdict.grade_id} ({got:g}/{points:g}): {what}\n")
        except OSError:
            pass

    def _limit(self, cell, index: int, why: str) -> None:
        line = f"{_where(cell, index)}: {why}"
        if line not in self._limits:
            self._limits.append(line)

    def _limit_output(self, cell, why: str):
        cell.outputs = [new_output("error", ename=LIMIT_ENAME, evalue=why,
                                   traceback=[f"{LIMIT_ENAME}: {why}"])]
        return cell, self.resources

    def _run_cell(self, cell, resources, index):
        """Run one cell; on a timeout that the interrupt did not end, a dead kernel or any
        failure while handling its messages, restart the kernel and replay."""
        if cell.cell_type == "code" and self._stopped is None and self._deadline is not None \
                and time.monotonic() > self._deadline:
            self._stopped = (f"not run: the submission used its {self.max_submission_s:g} s "
                             f"grading time")
            self._limit(cell, index, f"the submission's grading time "
                                     f"({self.max_submission_s:g} s) ran out")
        if cell.cell_type == "code" and self._stopped is not None:
            self._skip.add(index)
            return self._limit_output(cell, self._stopped)
        self._cell_bytes, self._cell_dropped, self._cell_note = 0, 0, None
        try:
            result = super().preprocess_cell(cell, resources, index)
            failure = None
        except (CellTimeoutError, DeadKernelError) as err:
            failure = err
        except Exception as err:  # noqa: BLE001 - a message the grader could not read, ...
            failure = err
        # what the cell left running is ended first: 700 spinning processes in the kernel's own
        # cgroup would starve it, and the kernel would look as if it ignored the interrupt
        self._strays_ended = self.km.end_strays() if hasattr(self.km, "end_strays") else 0
        refused = self._refused_channels(wait_ms=300 if failure is not None else 0)
        if failure is None and not refused and self._timed_out(cell) and not self._responsive():
            # interrupted at the timeout, the kernel still does not answer: it caught the
            # interrupt (nbclient's own reply says only that the cell timed out)
            failure = CellTimeoutError("the kernel ignored the interrupt")
        if failure is None and not refused:
            return result
        if refused and not isinstance(failure, DeadKernelError) and self._kernel_alive():
            # a message over the size limit: the channel that refused it is reconnected, and
            # the kernel (and everything the cell did) goes on
            why = (f"this cell sent a message over {getattr(self.km, 'max_message_mb', 0):g} MiB; "
                   f"the grader dropped it, and what the cell printed after it")
            self._limit(cell, index, why)
            self._skip.add(index)  # (not replayed after a later restart)
            run_sync(self._async_fresh_client)()
            cell.outputs = [o for o in cell.get("outputs", [])] + [new_output(
                "error", ename=LIMIT_ENAME, evalue=why, traceback=[f"{LIMIT_ENAME}: {why}"])]
            return cell, self.resources
        return self._recover(cell, index, failure)

    def _recover(self, cell, index: int, failure: BaseException | None):
        self._skip.add(index)
        self._recoveries += 1
        oom = self.km.oom_kills() if hasattr(self.km, "oom_kills") else 0
        if isinstance(failure, DeadKernelError) and oom > self._oom_seen:
            ename, evalue = LIMIT_ENAME, (
                f"the memory limit ({getattr(self.km, 'memory_gb', 0):g} GiB, files in /tmp "
                f"included) stopped the kernel in this cell")
        elif isinstance(failure, DeadKernelError):
            ename, evalue = "DeadKernelError", "the kernel died while running this cell"
        elif isinstance(failure, CellTimeoutError):
            ename, evalue = "CellTimeoutError", (
                f"this cell ran longer than {self.timeout} s and did not stop when interrupted")
        else:
            ename, evalue = LIMIT_ENAME, (
                f"the grader could not read what this cell sent "
                f"({type(failure).__name__}); the kernel was restarted")
        self._oom_seen = oom
        if ename == LIMIT_ENAME:
            self._limit(cell, index, evalue)
        if self._recoveries > self.max_recoveries:
            self._stopped = (f"not run: the kernel had to be restarted more than "
                             f"{self.max_recoveries} times")
            self._limit(cell, index, f"the kernel was restarted {self.max_recoveries} times; "
                                     f"the cells after this one were not run")
            return self._limit_output(cell, self._stopped)
        self.log.warning("cell %d (%s): restarting the kernel and re-running the cells before it",
                         index, ename)
        try:
            run_sync(self._async_recover)(index)
        except Exception as err:  # noqa: BLE001 - a kernel that will not come back
            self._stopped = f"not run: the kernel could not be restarted ({type(err).__name__})"
            self._limit(cell, index, "the kernel could not be restarted; the cells after this "
                                     "one were not run")
            return self._limit_output(cell, self._stopped)
        cell.outputs = [new_output("error", ename=ename, evalue=evalue,
                                   traceback=[f"{ename}: {evalue}"])]
        return cell, self.resources

    @staticmethod
    def _timed_out(cell) -> bool:
        return any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError"
                   for o in cell.get("outputs", []))

    def _responsive(self, timeout_s: float = 5.0) -> bool:
        """Does the kernel answer a ``kernel_info`` request within ``timeout_s``?"""
        async def ask() -> bool:
            msg_id = self.kc.kernel_info()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    reply = await ensure_async(self.kc.shell_channel.get_msg(
                        timeout=max(0.05, deadline - time.monotonic())))
                except Exception:  # noqa: BLE001 - Empty: no answer in time
                    return False
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    return True
            return False

        try:
            return bool(run_sync(ask)())
        except Exception:  # noqa: BLE001
            return False

    def _kernel_alive(self) -> bool:
        try:
            return bool(run_sync(self.km.is_alive)())
        except Exception:  # noqa: BLE001
            return False

    async def _async_fresh_client(self) -> None:
        """A new client (new sockets) for the same kernel: a socket that refused an oversized
        message is closed by ZeroMQ for good."""
        self._unwatch()
        if self.kc is not None:
            self.kc.stop_channels()
        self.kc = self.km.client()
        await ensure_async(self.kc.start_channels())
        await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))
        self.kc.allow_stdin = False
        self._watch()

    async def _async_recover(self, index: int) -> None:
        await ensure_async(self.km.restart_kernel(now=True))
        await self._async_fresh_client()
        if hasattr(self.km, "record_kernel"):
            self.km.record_kernel()
        for j, cell in enumerate(self.nb.cells[:index]):
            if cell.cell_type != "code" or j in self._skip or not cell.source.strip():
                continue
            msg_id = self.kc.execute(cell.source, store_history=False, allow_stdin=False)
            await self.async_wait_for_reply(msg_id, cell)
        if self._refused_channels(wait_ms=100):  # a replayed cell's oversized message
            await self._async_fresh_client()

    # ---------------------------------------------------------------- channels

    def _watch(self) -> None:
        """Watch the client's sockets for disconnection (ZeroMQ's answer to a message over
        ``ZMQ_MAXMSGSIZE``)."""
        self._unwatch()
        for name in ("shell", "iopub", "stdin", "control"):
            channel = getattr(self.kc, f"_{name}_channel", None)
            if channel is None or getattr(channel, "socket", None) is None:
                continue
            monitor = channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._monitors.append((name, monitor, zmq.Socket.shadow(monitor.underlying)))

    def _unwatch(self) -> None:
        for _, monitor, _sync in getattr(self, "_monitors", []):
            try:
                monitor.close(linger=0)
            except Exception:  # noqa: BLE001
                pass
        self._monitors = []

    def _refused_channels(self, wait_ms: int = 0) -> list[str]:
        """Channels whose socket was disconnected since the last look (``wait_ms``: how long
        to wait for ZeroMQ's event after a failure)."""
        refused = []
        for name, _, sync in self._monitors:
            try:
                while sync.poll(wait_ms if not refused else 0):
                    sync.recv_multipart(zmq.NOBLOCK)
                    refused.append(name)
            except zmq.ZMQError:
                pass
        return refused

    # ---------------------------------------------------------------- outputs as they arrive

    def process_message(self, msg, cell, cell_index):
        """Keep an output only within the cell's and the notebook's budgets; widget messages
        are not kept (nothing is graded from them)."""
        kind = msg.get("msg_type", "")
        if kind.startswith("comm"):
            return None
        relayed = (msg.get("metadata") or {}).get(RELAY_NOTE) if kind == "stream" else None
        if isinstance(relayed, str):  # the kernel's relay dropped this cell's messages
            self._limit(cell, cell_index, one_line(relayed, 300))
        content = msg.get("content")
        if isinstance(content, dict) and "execution_count" in content:
            # the prompt is the grader's own count, whatever the kernel says (a page prints it)
            content["execution_count"] = self.code_cells_executed + 1
        if kind in _OUTPUT_MESSAGES:
            content = msg.get("content")
            size = payload_size(content, self.max_output_depth,
                                limit=int(self.max_cell_output_mb * 1e6))
            submission = kind == "display_data" and SUBMIT_MIME in (content or {}).get("data", {})
            cell_cap = int(self.max_cell_output_mb * 1e6)
            notebook_cap = int(self.max_notebook_output_mb * 1e6)
            if size is None:
                self._drop(cell, cell_index, 0, f"an output nested more than "
                                                f"{self.max_output_depth} deep")
                return None
            over_notebook = (not (submission and _is_test(cell))
                             and self._notebook_bytes + size > notebook_cap)
            if self._cell_bytes + size > cell_cap or over_notebook:
                self._drop(cell, cell_index, size,
                           f"more than {self.max_notebook_output_mb:g} MB of output in the "
                           f"notebook" if over_notebook else
                           f"more than {self.max_cell_output_mb:g} MB of output in one cell")
                return None
            self._cell_bytes += size
            if not (submission and _is_test(cell)):
                self._notebook_bytes += size
        return super().process_message(msg, cell, cell_index)

    def _drop(self, cell, index: int, size: int, why: str) -> None:
        if self._cell_note is None:
            self._cell_note = new_output("stream", name="stdout", text="")
            cell.outputs.append(self._cell_note)
            self._limit(cell, index, why)
        self._cell_dropped += size
        self._cell_note["text"] = (f"\n[{self._cell_dropped:,} bytes of output cut by the "
                                   f"grader: {why}]\n")


__all__ = ["LIMIT_ENAME", "RecoveringExecute", "payload_size"]
