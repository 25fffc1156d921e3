"""Lecture 6, sequence, context and expert parallelism: split what tensor parallelism replicates.

Modules, lower to higher (Megatron sequence parallelism's operators g and g-bar,
``gather_from_sp`` and ``reduce_scatter_to_sp``, live in
:mod:`course_utils.tensor_parallel.conjugates`, beside TP's f and g, as in Megatron-LM):

* :mod:`~course_utils.sequence_parallel.block`: ``Block``, ``TensorParallelBlock``,
  ``SequenceParallelBlock``, ``sync_sequence_parallel_grads``, ``MODES``,
  ``check_block_sizes``: the transformer block with LayerNorms on this rank's tokens.
* :mod:`~course_utils.sequence_parallel.saved_bytes`: ``saved_terms``, ``layernorm_part``,
  ``predicted_saved_bytes``: the bytes saved for backward, predicted (lecture 9).
* :mod:`~course_utils.sequence_parallel.wire_bytes`: ``ring_bytes_sent``, ``comm_summary``,
  ``reduce_scatter_bytes``, ``reduce_scatter_bytes_worker``: bytes on the wire.
* :mod:`~course_utils.sequence_parallel.comparison`: ``compare``, ``SPComparison``, ``report``,
  ``reference``, ``sp_worker``, ``conjugate_worker``, ``Spec``, the torchrun ``demo``: TP+SP
  against one device and TP (lecture 9).
* :mod:`~course_utils.sequence_parallel.experts`: the all-to-all of expert parallelism (MoE)
  and Ulysses sequence/context parallelism.
"""

# the names of the former course_utils.sequence_parallel module
from course_utils.tensor_parallel.conjugates import (  # noqa: F401
    SEQ_DIM, GatherFromSequenceParallel, ReduceScatterToSequenceParallel, gather_from_sp,
    reduce_scatter_to_sp,
)
from course_utils.sequence_parallel.block import (  # noqa: F401
    MODES, Block, TensorParallelBlock, SequenceParallelBlock, sync_sequence_parallel_grads,
)
from course_utils.sequence_parallel.saved_bytes import (  # noqa: F401
    saved_terms, layernorm_part, predicted_saved_bytes,
)
from course_utils.sequence_parallel.wire_bytes import (  # noqa: F401
    ring_bytes_sent, comm_summary, reduce_scatter_bytes_worker, reduce_scatter_bytes,
)
from course_utils.sequence_parallel.comparison import (  # noqa: F401
    Spec, reference, sp_worker, SPComparison, compare, report, conjugate_worker, demo,
)
