"""Lecture 4, tensor parallelism: one layer's matrices split over the ranks of a TP group.

Modules, lower to higher:

* :mod:`~course_utils.tensor_parallel.recording`: ``CommEvent``, ``record_comms``, ``log_comm``,
  ``spy_collectives``: the log of the collectives the operators issue.
* :mod:`~course_utils.tensor_parallel.sharding`: ``shard_range``, ``column_shard``,
  ``row_shard``, ``check_matrix``.
* :mod:`~course_utils.tensor_parallel.comms`: the wire-level collectives, logged:
  ``all_reduce``, ``all_gather_cat``, ``reduce_scatter_chunk``, ``own_slice_last``.
* :mod:`~course_utils.tensor_parallel.conjugates`: Megatron's f and g (``copy_to_tp``,
  ``reduce_from_tp``), ``gather_from_tp``, ``scatter_to_tp`` and their autograd functions;
  sequence parallelism's g and g-bar (``gather_from_sp``, ``reduce_scatter_to_sp``, ``SEQ_DIM``).
* :mod:`~course_utils.tensor_parallel.one_device`: ``MLP``, ``Attention``, ``KINDS``,
  ``layer_config``, ``build_layer``, ``check_split``, ``reference``: the single-device side.
* :mod:`~course_utils.tensor_parallel.layers`: ``ColumnParallelLinear``, ``RowParallelLinear``,
  ``TensorParallelMLP``, ``TensorParallelAttention``, the torchrun ``demo``.
* :mod:`~course_utils.tensor_parallel.comparison`: ``compare``, ``Comparison``,
  ``comparison_table``, ``tp_worker``, ``conjugate_worker``, ``Spec``: real ranks vs one device.
* :mod:`~course_utils.tensor_parallel.comm_cost`: ``tp_comm_bytes``, ``layer_plan``,
  ``LayerPlan``, ``PLAN_KINDS``, ``dtype_bytes``, ``ring_all_reduce_bytes_per_rank``,
  ``mlp_param_count``, ``format_comms``, ``mlp_comm_to_compute``: communication counted.
* :mod:`~course_utils.tensor_parallel.comm_timing`: ``time_comm_vs_matmul``: communication timed.
* :mod:`~course_utils.tensor_parallel.vocab`: the embedding, head and loss split by token id.
* :mod:`~course_utils.tensor_parallel.pictures`: the lecture's drawings.

Assignment a4's harness (``run_row_parallel``, ``row_parallel_harness``) is
:mod:`course_utils.assess.a4_tensor_parallel`.
"""

from course_utils import _aliases

# the names of the former course_utils.tensor_parallel module
from course_utils.tensor_parallel.recording import (  # noqa: F401
    CommEvent, record_comms, spy_collectives,
)
from course_utils.tensor_parallel.sharding import (  # noqa: F401
    shard_range, column_shard, row_shard,
)
from course_utils.tensor_parallel.conjugates import (  # noqa: F401
    CopyToTensorParallel, ReduceFromTensorParallel, GatherFromTensorParallel,
    ScatterToTensorParallel, copy_to_tp, reduce_from_tp, gather_from_tp, scatter_to_tp,
)
from course_utils.tensor_parallel.one_device import (  # noqa: F401
    MLP, Attention, KINDS, reference,
)
from course_utils.tensor_parallel.layers import (  # noqa: F401
    ColumnParallelLinear, RowParallelLinear, TensorParallelMLP, TensorParallelAttention, demo,
)
from course_utils.tensor_parallel.comparison import (  # noqa: F401
    Spec, tp_worker, conjugate_worker, Comparison, comparison_table, compare,
)
from course_utils.tensor_parallel.comm_cost import (  # noqa: F401
    dtype_bytes, ring_all_reduce_bytes_per_rank, tp_comm_bytes, LayerPlan, PLAN_KINDS, layer_plan,
    mlp_param_count, format_comms, mlp_comm_to_compute,
)
from course_utils.tensor_parallel.comm_timing import (  # noqa: F401
    time_comm_vs_matmul,
)


def __getattr__(name: str):
    """Names that moved to another package (the assignment's harness, now in ``assess``)."""
    return _aliases.moved(__name__, name)
