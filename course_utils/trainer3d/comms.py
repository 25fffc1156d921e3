"""What one step of module 10's 3-D trainer sends: planned, counted on the ranks, predicted.

* :func:`exchange_plan`: the pipeline's point-to-point traffic for one rank's 1F1B order.
  Before each operation the rank posts one ``batch_isend_irecv``: the send that the previous
  operation produced (an activation to ``pp_next_rank`` or a gradient to ``pp_prev_rank``)
  together with the receive this operation needs. In 1F1B's steady phase that pairs "send my
  activation, receive the gradient of an earlier microbatch" with the neighbour's mirror image,
  as picotron's ``bidirectional_pipeline_communicate`` does
  (``picotron/pipeline_parallel/pp_communications.py``); :func:`format_exchange` writes it out.
* :func:`count_comms`: every call a rank makes while a block runs (point-to-point, and each
  collective by group: "tp", "dp" or "other"), read from the course's collective recorder
  (:mod:`course_utils.collectives.recorder`).
* :func:`predicted_tp` / :func:`predicted_calls`: the same counts from the plan alone.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch.distributed as dist

from course_utils.collectives import recorder
from course_utils.pipeline.schedule import schedule_order
from course_utils.trainer3d.stage_model import stage_blocks

__all__ = ["exchange_plan", "format_exchange", "count_comms", "predicted_tp", "predicted_calls"]

Transfer = tuple[str, int, str]   # ("act" or "grad", microbatch, "prev" or "next")


Batch = tuple[list[Transfer], list[Transfer]]   # (sends, receives) posted together


def exchange_plan(pp_rank: int, pp_size: int, m: int
                  ) -> tuple[list[tuple[str, int, int]], list[Batch]]:
    """``(order, batches)``: the 1F1B order of stage ``pp_rank``, and before each of its
    operations (and once after the last) the (sends, receives) posted together."""
    order = schedule_order("1f1b", pp_size, m)[pp_rank]
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    batches: list[Batch] = [([], []) for _ in range(len(order) + 1)]
    for k, (kind, i, _) in enumerate(order):
        if kind == "F":
            if not first:
                batches[k][1].append(("act", i, "prev"))
            if not last:
                batches[k + 1][0].append(("act", i, "next"))
        else:
            if not last:
                batches[k][1].append(("grad", i, "next"))
            if not first:
                batches[k + 1][0].append(("grad", i, "prev"))
    return order, batches


def format_exchange(pp_rank: int, pp_size: int, m: int) -> str:
    """One line: the operations of stage ``pp_rank`` with each ``batch_isend_irecv`` between
    them, e.g. ``F1 [send a1, recv g0] B0`` (a: activation, g: gradient)."""
    order, batches = exchange_plan(pp_rank, pp_size, m)
    words = []
    for k in range(len(order) + 1):
        sends, recvs = batches[k]
        posted = [f"send {w[0]}{i}" for w, i, _ in sends] + [f"recv {w[0]}{i}" for w, i, _ in recvs]
        if posted:
            words.append("[" + ", ".join(posted) + "]")
        if k < len(order):
            words.append(f"{order[k][0]}{order[k][1]}")
    return " ".join(words)


_COUNTED = ("all_reduce", "all_gather", "all_gather_single", "all_to_all_single",
            "reduce_scatter_single", "broadcast")
"""The ``torch.distributed`` collectives :func:`count_comms` counts by group."""


@contextlib.contextmanager
def count_comms(groups: dict[str, Any]) -> Iterator[dict[str, int]]:
    """Count this process's calls while the block runs: ``send`` and ``recv`` (every message,
    whichever function posted it: ``send``/``recv``, ``isend``/``irecv``,
    ``batch_isend_irecv``), ``p2p_batches`` (calls of ``batch_isend_irecv``), and each call of
    a collective of :data:`_COUNTED` as ``"<name>_<group>"`` with the group named by ``groups``
    (``{"tp": tp_group, "dp": dp_group}``; others are "other"). A view of
    :func:`course_utils.collectives.recorder.listen` (the calls it traces)."""
    counts: dict[str, int] = {"send": 0, "recv": 0, "p2p_batches": 0}
    names = {(grp if grp is not None else dist.group.WORLD).group_name: name
             for name, grp in groups.items()}

    def per_message(call: recorder.Call) -> None:
        if call.op in ("send", "recv"):
            counts[call.op] += 1

    def per_function(call: recorder.Call) -> None:
        if call.api == "batch_isend_irecv":
            counts["p2p_batches"] += 1
        elif call.api in _COUNTED:
            key = f"{call.api}_{names.get(call.group_name, 'other')}"
            counts[key] = counts.get(key, 0) + 1
    once = recorder.once_per_api_call(per_function)

    def seen(call: recorder.Call) -> None:
        per_message(call)
        once(call)
    with recorder.listen(seen):
        yield counts


def predicted_tp(cfg, pp_rank: int, pp_size: int, tp: int, m: int, rows: int,
                 vocab_parallel: bool, sp: bool, elt: int = 4,
                 partial_numel: int = 0) -> dict[str, int]:
    """TP collectives one rank of stage ``pp_rank`` issues per step, by kind, and their bytes
    (of each result, as :func:`course_utils.tensor_parallel.recording.record_comms` logs them).

    ``rows``: a microbatch's sequences; ``elt``: bytes per activation element. Per block and
    microbatch: without SP, one all-reduce forward and one backward for attention, the same for
    the MLP (4, each of the whole (rows, T, D) activation); with SP, each becomes an all-gather
    of the activation and a reduce-scatter to its 1/t (8). Vocabulary parallelism adds the
    embedding's sum (an all-reduce, or with SP a reduce-scatter forward and an all-gather
    backward), the head's f (all-reduce backward; with SP the all-gather forward and
    reduce-scatter backward) and the loss's all-gather of three fp32 numbers per token. With SP,
    the ``partial_numel`` elements of :meth:`Stage.tp_partial`'s parameters in this rank's DP
    slices are all-reduced once per step (:class:`~course_utils.zero.grad_buffer.GradBuffer`).
    """
    out = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0, "bytes": 0}
    if tp == 1:
        return out
    tokens = rows * cfg.seq_len
    act = tokens * cfg.d_model * elt

    def add(kind: str, n: int, nbytes: int) -> None:
        out[kind] += n
        out["bytes"] += n * nbytes
    blocks = len(stage_blocks(cfg, pp_rank, pp_size))
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    if sp:
        add("all_gather", 4 * blocks * m, act)
        add("reduce_scatter", 4 * blocks * m, act // tp)
    else:
        add("all_reduce", 4 * blocks * m, act)
    if vocab_parallel and first:
        if sp:
            add("reduce_scatter", m, act // tp)
            add("all_gather", m, act)
        else:
            add("all_reduce", m, act)
    if vocab_parallel and last:
        if sp:
            add("all_gather", m, act)
            add("reduce_scatter", m, act // tp)
        else:
            add("all_reduce", m, act)
        add("all_gather", m, tp * 3 * 4 * tokens)
    if sp and partial_numel:   # the gradients of Stage.tp_partial() in my slices, once a step
        add("all_reduce", 1, 4 * partial_numel)
    return out


def predicted_calls(pp_rank: int, pp_size: int, m: int, n_buckets: int,
                    clip: bool) -> dict[str, int]:
    """Point-to-point and DP calls one rank issues per step: a send and a receive per
    microbatch to and from each neighbour; per DP bucket a reduce-scatter (gloo:
    ``all_to_all_single``) and an all-gather; the clipping norm's all-reduce over every rank."""
    neighbours = (pp_rank > 0) + (pp_rank < pp_size - 1)
    return {"send": m * neighbours, "recv": m * neighbours, "buckets": n_buckets,
            "norm": int(clip)}
