"""TODO sequence_parallel."""

# the names of the former course_utils.sequence_parallel module
from course_utils.sequence_parallel.sequence import (  # noqa: F401
    MODES, SEQ_DIM, GatherFromSequenceParallel, ReduceScatterToSequenceParallel, gather_from_sp,
    reduce_scatter_bytes_worker, reduce_scatter_bytes, reduce_scatter_to_sp, Block,
    TensorParallelBlock, SequenceParallelBlock, sync_sequence_parallel_grads, Spec, reference,
    sp_worker, SPComparison, compare, saved_terms, layernorm_part, predicted_saved_bytes,
    ring_bytes_sent, comm_summary, report, conjugate_worker, demo,
)
