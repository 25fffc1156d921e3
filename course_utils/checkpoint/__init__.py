"""Lecture 12, checkpointing and recovery: saving a sharded run, resuming it, losing ranks.

Lecture 12 saves and resumes with ``torch.distributed.checkpoint``, refuses a bad checkpoint,
reshards on load, chooses how often to save, and survives a lost rank and a lost node.
Modules:

* :mod:`~course_utils.checkpoint.dcp`: saving, loading and verifying (``PRELOAD``, ``PIECES``,
  ``PER_RANK``, ``CheckpointError``, ``state_to_save``, ``save``, ``load``, ``verify``,
  ``latest``, ``step_folder``, ``file_bytes``, ``job_folder``).
* :mod:`~course_utils.checkpoint.resume_job`: a small sharded run whose every piece of state
  is visible (``Job``, ``SAMPLERS``, ``GlobalSampler``, ``Trainer``, ``Schedule``, ``fresh``,
  ``train``, ``snapshot``, ``reference_run``, ``digest``, ``dataset``, ``build_model``).
* :mod:`~course_utils.checkpoint.resume_demo`: the resume experiments on real ranks
  (``omission_worker``, ``resume_worker``, ``resized_worker``, ``departures``,
  ``departure_table``, ``resized_runs``, ``resized_table``, ``same_bits``, ...).
* :mod:`~course_utils.checkpoint.reshard`: load-time resharding and the bytes moved
  (``LAYOUTS``, ``SIZES``, ``build``, ``boxes``, ``predicted_bytes``, ``reshard_worker``,
  ``table``, ...).
* :mod:`~course_utils.checkpoint.interval`: how often to save (``waste``, ``expected_waste``,
  ``young_interval``, ``daly_interval``, ``simulate``, ``save_cost_worker``,
  ``async_save_worker``).
* :mod:`~course_utils.checkpoint.post_validation`: AdamW's step rolled back (``AdamWState``,
  ``adamw_step``, ``adamw_rollback``, ``KeptCopy``, ``clip_coef``, ``adamw_reference``,
  ``post_validation_run``, ``WAYS``, ``POLICIES``).
* :mod:`~course_utils.checkpoint.trainer3d`: lecture 10's 3-D trainer saved and resumed
  (``state_of``, ``train_worker``, ``run``, ``same_run``).
* :mod:`~course_utils.checkpoint.lost_rank` and :mod:`~course_utils.checkpoint.lost_node`: a
  rank killed mid-run, a node lost, and the job resumed (``Plan``, ``run``, ...).

The names below are those of the former ``course_utils.checkpoint`` module.
"""


# the names of the former course_utils.checkpoint module
from course_utils.checkpoint.dcp import (  # noqa: F401
    PRELOAD, PIECES, PER_RANK, CheckpointError, state_to_save, save, load, verify, step_folder,
    latest, file_bytes, job_folder,
)
