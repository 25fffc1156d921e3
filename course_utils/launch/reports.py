"""What the launcher reports: the ranks' output in rank order, and the errors of failed ranks.

A failed, dead or late rank raises one of these errors in the launching process (every lecture
that starts ranks, 2 to 12).

:class:`RankError` (a rank raised, died or failed to start) and :class:`LaunchTimeout` (ranks
still running when time ran out) are what :func:`course_utils.launch.launcher.run` raises;
:func:`rank_error` builds the former from a rank's report. :func:`read_logs`,
:func:`format_outputs` and :class:`LiveTail` read the ranks' captured output.
"""

from __future__ import annotations

import signal
from typing import Any, Sequence

__all__ = ["RankError", "LaunchTimeout", "rank_error", "describe_exit", "read_logs",
           "format_outputs", "LiveTail"]


class RankError(RuntimeError):
    """A rank failed: raised, died, or did not finish in time.

    Attributes: ``rank`` (the rank reported first), ``rank_traceback`` (its traceback text),
    ``outputs`` (each rank's captured stdout+stderr, rank order), ``failure`` (what the rank
    raised, as data: ``type``, ``message``, ``name`` (a NameError's), ``raised_in`` (the library
    whose code raised it, None for the student's own code) and ``frame`` (the student's innermost
    frame: file, line, function), or None); ``short`` (the head line and the student's frames:
    what a notebook shows, ``course_utils.assess.messages``).
    """

    def __init__(self, message: str, rank: int | None, rank_traceback: str, outputs: list[str],
                 failure: dict | None = None, short: str = ""):
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback
        self.outputs = outputs
        self.failure = failure
        self.short = short or message


class LaunchTimeout(RankError, TimeoutError):
    """Some ranks were still running when ``timeout_s`` ran out; they have been killed."""

    def __init__(self, message: str, ranks: list[int], stacks: str, outputs: list[str]):
        super().__init__(message, ranks[0] if ranks else None, stacks, outputs)
        self.ranks = ranks


def rank_error(rank: int, status: str, value: Any, exitcode: int | None,
               logs: list[str]) -> RankError:
    """The error for ``rank``'s failure: ``status`` "died" (the process ended with
    ``exitcode`` without reporting), else the rank's report ``value`` = (the student's
    traceback, the whole traceback, the failure as data). The message heads with the rank and
    the exception, then the student's traceback and every rank's output (``logs``)."""
    failure = None
    if status == "died":
        short = full = f"rank {rank} {describe_exit(exitcode)}."
        head = short
    else:
        short, full, failure = value
        head = f"rank {rank} failed first: {short.strip().splitlines()[-1]}"
    outputs = format_outputs(logs)
    mine = []  # the student's frames (a frame's line and its source line)
    for line in short.splitlines()[1:]:
        if not line.startswith("  "):
            break  # (the exception's own lines)
        if not line.startswith("  ... "):
            mine.append(line)
    return RankError(
        f"{head}\n--- rank {rank} traceback (library frames folded; the whole one "
        f"is in .rank_traceback) ---\n{short}"
        + (f"\n--- output of all ranks ---\n{outputs}" if outputs else ""),
        rank, full, logs, failure,
        "\n".join([head, *mine] + ([outputs] if outputs else [])))


def describe_exit(code: int | None) -> str:
    """How a rank process ended, from its exit code: "was killed by SIGKILL", ..."""
    if code is None:
        return "was still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without reporting a result"


def read_logs(paths: Sequence[str]) -> list[str]:
    """Each rank's log file as text ("" where it cannot be read)."""
    logs = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                logs.append(f.read())
        except OSError:
            logs.append("")
    return logs


def format_outputs(logs: Sequence[str]) -> str:
    """The ranks' output, each line prefixed ``[rank r]``, in rank order."""
    lines = []
    for rank, text in enumerate(logs):
        for line in text.splitlines():
            lines.append(f"[rank {rank}] {line}")
    return "\n".join(lines)


class LiveTail:
    """Print the complete lines a rank has written to its log since the last call."""

    def __init__(self, path: str, rank: int):
        self.path, self.rank, self.offset = path, rank, 0

    def print_new_lines(self, final: bool = False) -> None:
        """Print the new complete lines (``final``: the rest too), ``[rank r]`` prefixed."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        end = len(chunk) if final else chunk.rfind(b"\n") + 1
        if end <= 0:
            return
        self.offset += end
        text = chunk[:end].decode("utf-8", errors="replace")
        print("\n".join(f"[rank {self.rank}] {line}" for line in text.splitlines()), flush=True)
