"""Lecture 7, measuring a run: verify the scaling first, then time, memory and collective waits.

The order matters. A run with a gradient-scaling bug can look healthy (its loss curve may even
match) and benchmarks as fast as a correct one, so:

1. **Verify**: gradients and losses from ``D`` ranks equal a single-process run on the same
   global batch (:func:`dp_gradients`, :func:`check_gradient_scaling`, :func:`check_losses`
   against :func:`reference_gradients`, :func:`reference_losses`).
2. **Measure** (:func:`dp_train` on every rank, :func:`summarize` after): per rank and per step,
   the time in each of the :data:`PHASES`, tokens/s, the bytes sent, state and peak memory.
3. **Profile** (``RunSpec(profile=True)``): ``torch.profiler`` on every rank, summarised by
   :func:`profile_rows` and :func:`profile_table`.

Modules:

* :mod:`~course_utils.measure.spec`: :class:`RunSpec` (``GRAD_SCALINGS``, ``ENGINES``,
  ``OPTIMIZERS``, ``PHASES``) and the single-process truth (:func:`reference_gradients`,
  :func:`reference_losses`);
* :mod:`~course_utils.measure.step`: the rank workers, the step timed by phase
  (:func:`dp_train`, :func:`dp_gradients`, :func:`dp_train_each`, :func:`dp_gradients_each`,
  :func:`allreduce_gradients`, :func:`allreduce_bytes_sent`);
* :mod:`~course_utils.measure.checks`: :class:`ScalingReport`, :func:`check_gradient_scaling`,
  :func:`check_losses`;
* :mod:`~course_utils.measure.summary`: :func:`summarize`, :func:`throughput`,
  :func:`wait_fraction`, :func:`predicted_allreduce_bytes`, :func:`format_table`;
* :mod:`~course_utils.measure.profile`: :func:`profile_rows`, :func:`profile_table`;
* :mod:`~course_utils.measure.plots`: :func:`plot_step_breakdown`, :func:`plot_loss_curves`;
* :mod:`~course_utils.measure.run`: :func:`demo`, the torchrun demo
  (``python -m course_utils.measure`` runs it).

The clock every timer reads and the load check (:func:`clock`, :func:`busy_reason`,
:func:`warn_if_busy`, :func:`bytes_written`) live in :mod:`course_utils.runtime.clock`,
:func:`synchronize` in :mod:`course_utils.runtime.backend`; they are re-exported here, as the
former ``course_utils.measure`` module had them.
"""

# the names of the former course_utils.measure module
from course_utils.measure.checks import (  # noqa: F401
    ScalingReport, check_gradient_scaling, check_losses,
)
from course_utils.measure.plots import plot_loss_curves, plot_step_breakdown  # noqa: F401
from course_utils.measure.profile import profile_rows, profile_table  # noqa: F401
from course_utils.measure.run import demo  # noqa: F401
from course_utils.measure.spec import (  # noqa: F401
    ENGINES, GRAD_SCALINGS, OPTIMIZERS, PHASES, RunSpec, reference_gradients, reference_losses,
)
from course_utils.measure.step import (  # noqa: F401
    allreduce_bytes_sent, allreduce_gradients, dp_gradients, dp_gradients_each, dp_train,
    dp_train_each,
)
from course_utils.measure.summary import (  # noqa: F401
    format_table, predicted_allreduce_bytes, summarize, throughput, wait_fraction,
)
from course_utils.runtime.backend import synchronize  # noqa: F401
from course_utils.runtime.clock import bytes_written, busy_reason, clock, warn_if_busy  # noqa: F401
