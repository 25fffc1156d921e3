"""What every lecture's helpers run on: the backend, the clock and the argument checks.

The lowest package of the library (every other one may import it; it imports none of them),
under every lecture. Modules:

* :mod:`~course_utils.runtime.backend`: what changes between gloo on CPUs and NCCL on GPUs
  (``resolve_backend``, ``init_process_group``, ``device``, ``to_device``, ``to_cpu``,
  ``synchronize``, ``scaled_sum``, ``peak_memory_bytes``, ``reset_peak_memory``,
  ``new_group``, ``reduce_scatter_in_place``, ``differences_table``, ``fake_job``, ...).
* :mod:`~course_utils.runtime.clock`: one clock for every timer (``clock``), the check that
  says when timings cannot be trusted (``busy_reason``, ``warn_if_busy``) and the bytes this
  process has written (``bytes_written``).
* :mod:`~course_utils.runtime.validate`: the argument checks, a ValueError naming the argument
  (``check_int``, ``check_real``, ``check_bool``, ``check_ints``, ``check_index``,
  ``one_of``).
"""

