"""TODO mesh."""

# the names of the former course_utils.mesh module
from course_utils.mesh.grid import (  # noqa: F401
    AXES, Mesh, draw_rank_groups, torch_mesh_groups, hand_mesh_groups, axis_group, DpTpMLP,
    dp_tp_batch, reference_step, dp_tp_step, dp_tp_step_dtensor, shard_of, check_dp_tp,
    torchrun_worker,
)
