"""The device mesh and the playground that sizes a plan on it (lecture 6).

A job with several kinds of parallelism lays its ranks out on one grid whose axes are the
degrees (``dp x pp x tp``, the innermost axis on consecutive ranks, so on one node); the
playground sizes such a plan from its numbers alone: memory per device, bubble, batch and what
each axis sends.

* :mod:`~course_utils.mesh.grid`: the rank grid (:class:`~course_utils.mesh.grid.Mesh`, ``AXES``),
  its groups built by hand and by ``init_device_mesh`` (``hand_mesh_groups``,
  ``torch_mesh_groups``, ``axis_group``), the figure of one rank's groups
  (``draw_rank_groups``) and a 2-D DP x TP step checked against one device (``DpTpMLP``,
  ``dp_tp_batch``, ``reference_step``, ``dp_tp_step``, ``dp_tp_step_dtensor``, ``shard_of``,
  ``check_dp_tp``, ``torchrun_worker``). ``python -m course_utils.mesh`` runs its demo.
* :mod:`~course_utils.mesh.plan_costs`: what a TP x PP x DP plan costs (``plan``, ``Plan``,
  ``collectives``, ``first_stage``, ``gathered_layer_bytes``, ``OMITTED``, ``DEFAULTS``,
  ``RECOMPUTES``, ``TEACHING_NOTE``).
* :mod:`~course_utils.mesh.plan_view`: a plan's table, HTML and figure (``summary``,
  ``plan_html``, ``figure``).
* :mod:`~course_utils.mesh.playground`: the widget (``Playground``), with the names of the
  former ``course_utils.playground`` bound.

The package re-exports the names of the former ``course_utils.mesh`` module (below); import
the playground as ``from course_utils.mesh.playground import Playground``.
"""

# the names of the former course_utils.mesh module
from course_utils.mesh.grid import (  # noqa: F401
    AXES, Mesh, draw_rank_groups, torch_mesh_groups, hand_mesh_groups, axis_group, DpTpMLP,
    dp_tp_batch, reference_step, dp_tp_step, dp_tp_step_dtensor, shard_of, check_dp_tp,
    torchrun_worker,
)
