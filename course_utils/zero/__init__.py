"""Lecture 3, ZeRO and FSDP: sharding the optimizer state, then the gradients, then the weights.

Lecture 3 builds ZeRO stages 0-3 from collectives and measures them; lecture 10's 3-D trainer
uses ZeRO-1's wrapper (:mod:`~course_utils.zero.zero1`) and the gradient buffer
(:mod:`~course_utils.zero.grad_buffer`). Modules, lower to higher:

* :mod:`~course_utils.zero.sizes`: the stages' arithmetic (``STAGES``, ``STAGE_NAMES``,
  ``REDUCE_DTYPES``, ``LAYOUT``, ``unit_sizes``, ``shard_numel``, ``padded_state_bytes``,
  ``expected_comm_bytes``) and the argument checks the modules share.
* :mod:`~course_utils.zero.mlp`: the model and data every stage trains (``make_mlp``,
  ``make_batches``, ``mse_loss``).
* :mod:`~course_utils.zero.recording`: what a rank communicated (``CommLog``,
  ``SpyCollectives``).
* :mod:`~course_utils.zero.units`: one Linear layer's flat buffers (``FlatUnit``) and the bytes
  of the storages a rank holds (``storage_bytes``).
* :mod:`~course_utils.zero.engine`: the from-scratch engine, one rank of stage 0-3 (``ZeroDP``).
* :mod:`~course_utils.zero.training`: the training workers and the one-process reference
  (``train_worker``, ``all_stages_worker``, ``run_all_stages``, ``reference_train``,
  ``sum_rounding_error``, ``max_abs_diff``); its ``__main__`` demo is ``python -m
  course_utils.zero``.
* :mod:`~course_utils.zero.timeline`: a rank's memory over one step and its drawing
  (``TIMELINE_KINDS``, ``TIMELINE_KEY``, ``short_event``, ``timeline_peak``,
  ``draw_memory_timeline``, ``draw_memory_timelines``).
* :mod:`~course_utils.zero.zero3`: ZeRO-3 as a module wrapper, FSDP's form (``ShardedModule``).
* :mod:`~course_utils.zero.fsdp`: PyTorch's ``ZeroRedundancyOptimizer`` and FSDP2
  ``fully_shard`` measured beside the engine (``zero_redundancy_worker``, ``fsdp2_worker``,
  ``reference_adam``, ``reduce_dtype_worker``).
* :mod:`~course_utils.zero.grad_buffer`: contiguous fp32 gradients reduce-scattered by bucket
  during backward (``FlatLayout``, ``GradBuffer``).
* :mod:`~course_utils.zero.zero1`: ZeRO-1 as a wrapper of any ``torch.optim`` optimizer
  (``ShardedOptimizer``, ``bytes_sent_worker``).

Assignment a3's harness (``shard_step_harness``, ``run_shard_step``) is
:mod:`course_utils.assess.a3_zero`. The names below are those of the former
``course_utils.zero`` module.
"""

from course_utils import _aliases

# the names of the former course_utils.zero module
from course_utils.zero.sizes import (  # noqa: F401
    STAGES, STAGE_NAMES, REDUCE_DTYPES, LAYOUT, unit_sizes, shard_numel, padded_state_bytes,
    expected_comm_bytes,
)
from course_utils.zero.mlp import make_mlp, make_batches  # noqa: F401
from course_utils.zero.recording import CommLog  # noqa: F401
from course_utils.zero.engine import ZeroDP  # noqa: F401
from course_utils.zero.training import (  # noqa: F401
    train_worker, all_stages_worker, run_all_stages, reference_train, sum_rounding_error,
    max_abs_diff,
)
from course_utils.zero.timeline import (  # noqa: F401
    TIMELINE_KINDS, TIMELINE_KEY, short_event, timeline_peak, draw_memory_timeline,
    draw_memory_timelines,
)


def __getattr__(name: str):
    """Names that moved to another package (the assignment's harness, now in ``assess``)."""
    return _aliases.moved(__name__, name)
