"""TODO collectives."""

# the names of the former course_utils.collectives module
from course_utils.collectives.primitives import (  # noqa: F401
    COLLECTIVES, REDUCE_OPS, shard_sizes, shard_bounds, all_gather_flat, reduce_scatter_flat,
    example_inputs, reference, hello, collective_worker, all_gather_worker, reduce_scatter_worker,
    run_collective, provenance, draw_collective,
)
