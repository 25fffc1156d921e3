"""Lecture 2, data parallelism: replicas that average their gradients, overlap, and pitfalls.

Lecture 2 runs one update across replicas, where the averaging goes, gradient accumulation and
what limits scaling, then overlaps the all-reduce with backward; assignment a10 (part 2)
debugs five broken data-parallel programs. Modules:

* :mod:`~course_utils.data_parallel.replicas`: the lecture's workers beside the one-process
  computations they must equal (``sgd_reference``, ``two_replica_update_worker``,
  ``normalization_worker``, ``unequal_batch_worker``, ``make_mlp``, ``make_batch``,
  ``dp_train_worker``, ``accumulation_worker``, ``throughput_worker``, ``straggler_worker``,
  ...); its ``__main__`` demo is ``python -m course_utils.data_parallel``.
* :mod:`~course_utils.data_parallel.overlap`: bucketed all-reduces during backward
  (``BucketAllReduce``, ``bucket_assignment``, ``grads_worker``, ``check_grads``,
  ``ddp_buckets``, ``measure_overlap``, ``simulate``, ``plot_timeline``, ``make_mlp``, ...).
* :mod:`~course_utils.data_parallel.pitfalls`: a10's broken programs and their checks
  (``Job``, ``PROGRAMS``, ``JOBS``, ``run``, ``one_device``, ``check``, ``show``, ``demo``, ...).

The toy MLPs are :func:`course_utils.models.toy.toy_mlp`'s. The names below are those of the
former ``course_utils.data_parallel`` module.
"""


# the names of the former course_utils.data_parallel module
from course_utils.data_parallel.replicas import (  # noqa: F401
    LESSON_GRADS, LESSON_W0, LESSON_LR, NORMALIZATIONS, WEIGHTINGS, sgd_reference,
    two_replica_update_worker, normalization_worker, all_normalizations_worker, make_regression,
    split_by_counts, full_batch_train, weighted_train, least_squares_minimizer,
    unequal_batch_worker, make_mlp, make_batch, flat_params, train_single, dp_train_worker,
    dp_compare_worker, accumulation_worker, throughput_worker, straggler_worker,
)
