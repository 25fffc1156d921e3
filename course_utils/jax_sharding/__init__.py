"""Lecture 8 (JAX): the course's parallelism plans in JAX, on 8 CPU devices of one process.

Declare a mesh and shardings, and the compiler inserts the collectives; or write the per-device
program with ``shard_map`` and name them.

Importing this package imports no JAX: its names load on first use (``js.make_mesh`` imports
the modules that hold it), so that a process can set ``XLA_FLAGS`` first. The modules, in the
order of the lecture:

* :mod:`~course_utils.jax_sharding.devices`: the one module that sets ``XLA_FLAGS`` (8 CPU
  devices) before ``import jax``; ``DEVICES``, ``DEVICE_FLAG``, ``with_device_flag``,
  ``require_devices``;
* :mod:`~course_utils.jax_sharding.shardings`: ``P``, ``make_mesh``, ``place``,
  ``shard_table``, ``bytes_per_device``, ``local_bytes``, ``global_bytes``, ``spec_entries``,
  ``draw_sharding`` (section 1);
* :mod:`~course_utils.jax_sharding.hlo`: the compiled program's collectives,
  ``COLLECTIVES``, ``Collective``, ``compiled_text``, ``collectives``, ``collective_names``,
  ``op_counts``, ``compile_plan``;
* :mod:`~course_utils.jax_sharding.mlp`: ``init_mlp``, ``mlp_apply``, ``mse``;
* :mod:`~course_utils.jax_sharding.data_parallel`: ``lesson_two_replicas``, ``dp_step_check``
  (section 2);
* :mod:`~course_utils.jax_sharding.layouts`: tensor parallelism, ``Layout``, ``LAYOUTS``,
  ``linear_inputs``, ``jit_linear``, ``shard_map_linear``, ``compare_layouts``,
  ``layout_table``, ``partitioner``, ``both_dims_on_one_axis`` (section 3);
* :mod:`~course_utils.jax_sharding.megatron`: ``constrained_mlp`` (section 3), ``mlp_2d``
  (section 5);
* :mod:`~course_utils.jax_sharding.ring`: ``ring_step``, ``ring_reduce_scatter`` (section 3);
* :mod:`~course_utils.jax_sharding.fsdp`: ``fsdp_state``, ``fsdp_memory`` (section 4);
* :mod:`~course_utils.jax_sharding.remat`: ``POLICIES``, ``saved_residuals`` (section 6);
* :mod:`~course_utils.jax_sharding.comm_cost`: ``RING_OPS``, ``ring_cost``, ``cost_table``,
  ``ACCELERATORS``, ``hides_behind_matmul`` (section 7);
* :mod:`~course_utils.jax_sharding.framework_compare`: the same training step in PyTorch and
  in JAX on a pinned workload (section 8; not re-exported: import the module).

Every public function checks its arguments before any JAX work: a bad one raises ValueError or
TypeError naming it and saying what is allowed.

Assignment a8's ``row_parallel_harness`` lives in :mod:`course_utils.assess.a8_jax_sharding`;
``course_utils.jax_sharding.row_parallel_harness`` still reaches it (the former module's name).
"""

import importlib

from course_utils import _aliases

# the modules that hold the former course_utils.jax_sharding module's names
FORMER = ("course_utils.jax_sharding.devices", "course_utils.jax_sharding.shardings",
          "course_utils.jax_sharding.hlo", "course_utils.jax_sharding.mlp",
          "course_utils.jax_sharding.data_parallel", "course_utils.jax_sharding.layouts",
          "course_utils.jax_sharding.megatron", "course_utils.jax_sharding.ring",
          "course_utils.jax_sharding.fsdp", "course_utils.jax_sharding.remat",
          "course_utils.jax_sharding.comm_cost")


def __getattr__(name: str):
    """The former module's names, loaded on first use: importing the package starts no JAX, so
    :mod:`~course_utils.jax_sharding.framework_compare` can set ``XLA_FLAGS`` first."""
    if not name.startswith("__"):
        for module in FORMER:
            found = importlib.import_module(module)
            if hasattr(found, name):
                return getattr(found, name)
    return _aliases.moved(__name__, name)  # a name that left the package (a8's harness)
