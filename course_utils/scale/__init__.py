"""Lecture 11, training at scale: each rank's bytes and traffic, read from PyTorch itself.

Lecture 11 sizes whole jobs (Llama-shaped models over thousands of ranks) by simulating one
rank at a time in PyTorch's fake process group, and checks the simulation on real ranks.
Modules, lower to higher:

* :mod:`~course_utils.scale.memory`: a rank's persistent bytes from its sharded tensors
  (``STRATEGIES``, ``MESH_AXES``, ``mesh_coords``, ``shard_stage``, ``rank_state``,
  ``state_bytes``, ``course_zero``, ``course_formula``, ``stage_kinds``,
  ``representative_ranks``, ``job_table``).
* :mod:`~course_utils.scale.comms`: the collectives of one step, traced (``KINDS``,
  ``CollectiveLog``, ``one_step``, ``accumulate``, ``summarize``, ``axis_names``,
  ``trace_step``, ``course_comms``, ``sent_bytes``).
* :mod:`~course_utils.scale.check`: the simulation against real ranks (``real_rank_worker``,
  ``tp_plan_worker``, ``simulated``, ``compare``, ``check``).
* :mod:`~course_utils.scale.tables`: the lecture's tables (``LESSON``, ``PUBLISHED``,
  ``lesson_table``, ``draw_lesson``, ``comm_table``, ``plan_table``, ``step_table``,
  ``job_table``, ``rss_mb``, ...).
"""

