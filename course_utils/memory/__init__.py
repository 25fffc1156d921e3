"""TODO memory."""

# the names of the former course_utils.memory module
from course_utils.memory.sizing import (  # noqa: F401
    GB, GiB, Layout, LAYOUTS, layout, state_bytes, to_gb, to_gib, format_bytes, fits,
    count_state_bytes, MixedPrecisionAdam, ZERO_STAGES, zero_state_bytes, tiny_mlp,
    replica_state_bytes, plot_layouts, plot_state_vs_size,
)
