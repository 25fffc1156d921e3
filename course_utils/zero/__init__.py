"""TODO zero."""

# the names of the former course_utils.zero module
from course_utils.zero.stages import (  # noqa: F401
    STAGES, STAGE_NAMES, REDUCE_DTYPES, LAYOUT, make_mlp, unit_sizes, shard_numel, make_batches,
    padded_state_bytes, expected_comm_bytes, CommLog, ZeroDP, train_worker, all_stages_worker,
    run_all_stages, reference_train, sum_rounding_error, max_abs_diff, TIMELINE_KINDS,
    TIMELINE_KEY, short_event, timeline_peak, draw_memory_timeline, draw_memory_timelines,
    shard_step_harness, run_shard_step,
)
