"""Lectures 1 and 9, memory: the bytes of training state, precision, and activation memory.

Lecture 1 sizes a replica's persistent state and why mixed precision keeps what it keeps;
lecture 9 predicts and measures what autograd saves between forward and backward. Modules:

* :mod:`~course_utils.memory.sizing`: bytes-per-parameter layouts, units, counting real bytes
  (``Layout``, ``LAYOUTS``, ``layout``, ``state_bytes``, ``to_gb``, ``to_gib``,
  ``format_bytes``, ``fits``, ``count_state_bytes``, ``MixedPrecisionAdam``, ``ZERO_STAGES``,
  ``zero_state_bytes``, ``tiny_mlp``, ``replica_state_bytes``, ``plot_layouts``,
  ``plot_state_vs_size``); its ``__main__`` demo is ``python -m course_utils.memory``.
* :mod:`~course_utils.memory.precision`: bf16's gaps, loss scaling, fp8 casts, accumulation
  error (``DTYPES``, ``bf16_gap``, ``repeated_update``, ``fraction_lost``, ``loss_scaling``,
  ``clip_with_scaler``, ``fp8_cast_error``, ``FP8_DTYPES``, ``accumulation_error``,
  ``represent``, ``update_lost``).
* :mod:`~course_utils.memory.activations`: activation bytes predicted and measured, with
  recomputation (``saved_bytes``, ``forward``, ``loss_and_grads``, ``measured_block_bytes``,
  ``predicted_block_bytes``, ``korthikanti_bytes``, ``ModernBlock``, ``modern_block_terms``,
  ``step_time``, ``plot_bytes_vs_seq``, ...).

The names below are those of the former ``course_utils.memory`` module.
"""


# the names of the former course_utils.memory module
from course_utils.memory.sizing import (  # noqa: F401
    GB, GiB, Layout, LAYOUTS, layout, state_bytes, to_gb, to_gib, format_bytes, fits,
    count_state_bytes, MixedPrecisionAdam, ZERO_STAGES, zero_state_bytes, tiny_mlp,
    replica_state_bytes, plot_layouts, plot_state_vs_size,
)
