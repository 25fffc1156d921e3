"""TODO tensor_parallel."""

# the names of the former course_utils.tensor_parallel module
from course_utils.tensor_parallel.layers import (  # noqa: F401
    CommEvent, record_comms, CopyToTensorParallel, ReduceFromTensorParallel,
    GatherFromTensorParallel, ScatterToTensorParallel, copy_to_tp, reduce_from_tp, gather_from_tp,
    scatter_to_tp, shard_range, column_shard, row_shard, ColumnParallelLinear, RowParallelLinear,
    MLP, TensorParallelMLP, Attention, TensorParallelAttention, KINDS, Spec, reference, tp_worker,
    conjugate_worker, Comparison, comparison_table, compare, dtype_bytes,
    ring_all_reduce_bytes_per_rank, tp_comm_bytes, LayerPlan, PLAN_KINDS, layer_plan,
    mlp_param_count, format_comms, mlp_comm_to_compute, time_comm_vs_matmul, spy_collectives,
    row_parallel_harness, run_row_parallel, demo,
)
