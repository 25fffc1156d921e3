"""TODO data_parallel."""

# the names of the former course_utils.data_parallel module
from course_utils.data_parallel.replicas import (  # noqa: F401
    LESSON_GRADS, LESSON_W0, LESSON_LR, NORMALIZATIONS, WEIGHTINGS, sgd_reference,
    two_replica_update_worker, normalization_worker, all_normalizations_worker, make_regression,
    split_by_counts, full_batch_train, weighted_train, least_squares_minimizer,
    unequal_batch_worker, make_mlp, make_batch, flat_params, train_single, dp_train_worker,
    dp_compare_worker, accumulation_worker, throughput_worker, straggler_worker,
)
