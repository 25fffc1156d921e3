"""The lectures' widgets: ipywidgets controls wired to the course's tested functions.

Each widget shows what one function of ``course_utils`` computes, the function the lecture
asserts, so a widget cannot drift from the formulas; :mod:`course_utils.widgets.base` is what
they share (one state drives the numbers and the figure, a readable message for a setting
that does not work, a static picture for pages without a kernel). One module per widget,
named after what it shows:

* :mod:`~course_utils.widgets.training_state` (module 1): bytes per parameter, GB and GiB,
  against device budgets;
* :mod:`~course_utils.widgets.ring_steps` (module 2): the collectives step by step, replayed
  from a real gloo run of the course's ring;
* :mod:`~course_utils.widgets.zero_shards` (module 3): which rank holds which shard under
  ZeRO 0-3, bytes per rank, the step's collectives;
* :mod:`~course_utils.widgets.tp_layout` (module 4): tensor-parallel splits, shapes per rank,
  the collective and its bytes;
* :mod:`~course_utils.widgets.pipeline_timeline` (module 5): pipeline schedules, bubble and
  activations in flight;
* :mod:`~course_utils.widgets.sharding` (module 8): a matmul's shardings on a JAX mesh and the
  collective the compiler inserts;
* :mod:`~course_utils.widgets.number_formats` and
  :mod:`~course_utils.widgets.activation_memory` (module 9);
* :mod:`~course_utils.widgets.step_time` (module 13): a step's time term by term for a plan,
  beside the same plan at the datasheet peak.

Importing this package loads nothing heavy: import the widget's own module.
"""
