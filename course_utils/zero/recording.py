"""What a ZeRO rank communicated: a log of its collectives and a spy on ``torch.distributed``.

Both are views of the course's one recorder, :mod:`course_utils.collectives.recorder`.
:class:`CommLog` keeps every collective one rank of :class:`course_utils.zero.engine.ZeroDP`
issued, with the bytes a ring algorithm makes that rank send (its calls as the recorder's
:class:`~course_utils.collectives.recorder.Call`, whose ring bytes come from
:mod:`course_utils.collectives.cost`). :class:`SpyCollectives` records the name of every
``torch.distributed`` collective called inside a ``with`` block (the recorder's traced calls);
assignment 3's harness uses it to see which collectives a student's sharded step called.
Lecture 3 (ZeRO and FSDP).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from course_utils.collectives import recorder

__all__ = ["CommLog", "SpyCollectives"]

_OPS = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass
class CommLog:
    """Every collective one rank issued: ``(op, elements of the full buffer, bytes each)``."""

    dp: int
    calls: list[tuple[str, int, int]] = field(default_factory=list)

    def record(self, op: str, numel: int, itemsize: int) -> None:
        """Log one collective over a full buffer of ``numel`` elements of ``itemsize`` bytes."""
        self.calls.append((op, int(numel), int(itemsize)))

    def clear(self) -> None:
        """Forget the calls logged so far."""
        self.calls.clear()

    def as_calls(self) -> list[recorder.Call]:
        """The logged calls as the recorder's records, each over the ``dp`` ranks."""
        return [recorder.Call(op, "", self.dp, numel * itemsize, shape=(numel,))
                for op, numel, itemsize in self.calls]

    def counts(self) -> dict[str, int]:
        """Number of calls per collective."""
        out = dict.fromkeys(_OPS, 0)
        for call in self.as_calls():
            out[call.op] += 1
        return out

    def ring_bytes(self) -> dict[str, float]:
        """Bytes this rank sends for the logged calls under ring algorithms, per op and total."""
        out = dict.fromkeys(_OPS, 0.0)
        for call in self.as_calls():
            out[call.op] += call.sent_bytes
        out["total"] = out["all_reduce"] + out["reduce_scatter"] + out["all_gather"]
        return out


_SPIED = ("all_reduce", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
          "all_gather", "all_gather_single", "all_gather_into_tensor", "broadcast", "scatter")


class SpyCollectives:
    """Within ``with``, record the name of every ``torch.distributed`` collective called."""

    def __enter__(self) -> list[str]:
        self.calls: list[str] = []
        self._listening = contextlib.ExitStack()
        self._listening.enter_context(recorder.listen(recorder.once_per_api_call(self._seen)))
        return self.calls

    def _seen(self, call: recorder.Call) -> None:
        if call.api in _SPIED:
            self.calls.append(call.api)

    def __exit__(self, *exc: Any) -> None:
        self._listening.close()
