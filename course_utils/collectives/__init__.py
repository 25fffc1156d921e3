"""Collectives: what data parallelism and ZeRO are built from, what they cost on the wire and
how the course records them (lecture 2; the cost and the recorder serve lectures 2-11).

* :mod:`~course_utils.collectives.primitives`: the five collectives run once on real gloo ranks
  (``run_collective``, ``all_gather_flat``, ``reduce_scatter_flat``, ``draw_collective``);
* :mod:`~course_utils.collectives.ring`: ring all-reduce from point-to-point send/recv (a
  reduce-scatter, then an all-gather), checked against ``dist.all_reduce`` and timed;
* :mod:`~course_utils.collectives.ring_trace`: what each rank sends and holds at every step of
  the ring, recorded once on real ranks (the widget of lecture 2 replays it);
* :mod:`~course_utils.collectives.cost`: what a ring collective costs, the one home of its
  factors (``ring_factor``, ``ring_steps``, ``ring_bytes``, ``ring_time_s``);
* :mod:`~course_utils.collectives.recorder`: the course's one collective recorder (``record``,
  ``Call``, ``declare``, ``phase``); every other recorder is a view of it.

The package re-exports the names of the former ``course_utils.collectives`` module (below).
"""

# the names of the former course_utils.collectives module
from course_utils.collectives.primitives import (  # noqa: F401
    COLLECTIVES, REDUCE_OPS, shard_sizes, shard_bounds, all_gather_flat, reduce_scatter_flat,
    example_inputs, reference, hello, collective_worker, all_gather_worker, reduce_scatter_worker,
    run_collective, provenance, draw_collective,
)
