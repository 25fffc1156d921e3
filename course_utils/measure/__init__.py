"""TODO measure."""

# the names of the former course_utils.measure module
from course_utils.measure.run import (  # noqa: F401
    GRAD_SCALINGS, ENGINES, OPTIMIZERS, PHASES, RunSpec, reference_gradients, reference_losses,
    clock, busy_reason, warn_if_busy, bytes_written, allreduce_gradients, dp_gradients, dp_train,
    dp_gradients_each, dp_train_each, allreduce_bytes_sent, ScalingReport, check_gradient_scaling,
    check_losses, predicted_allreduce_bytes, throughput, wait_fraction, summarize, profile_rows,
    format_table, profile_table, plot_step_breakdown, plot_loss_curves, demo,
)
