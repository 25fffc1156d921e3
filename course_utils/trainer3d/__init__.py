"""Lecture 10, the 3-D trainer: TinyLM trained on a DP x PP x TP mesh, checked against one process.

Lecture 10 puts lectures 2-5 together: each rank of a ``dp * pp * tp`` job builds only its
pipeline stage, split by tensor parallelism, and trains it with ZeRO-1 over its data-parallel
group; the run must equal one process's, and PyTorch's own parts must agree with it. Assignment
a10 (the capstone) grades it. Modules, lower to higher:

* :mod:`~course_utils.trainer3d.stage_model`: one rank's piece of TinyLM (``check_coords``,
  ``stage_blocks``, ``init_tensors``, ``shard_state``, ``TensorParallelBlock``, ``Stage``,
  ``build_stage``, ``stage_param_count``, ``full_name``, ``logits_loss``).
* :mod:`~course_utils.trainer3d.plan`: a run's plan (``Plan``, ``DTYPES``).
* :mod:`~course_utils.trainer3d.comms`: what one step sends, planned, counted and predicted
  (``exchange_plan``, ``format_exchange``, ``count_comms``, ``predicted_tp``,
  ``predicted_calls``).
* :mod:`~course_utils.trainer3d.check`: the one-process run it must equal and its predictions
  (``reference_train``, ``check_against_reference``, ``TOLERANCES``, ``replica_losses``,
  ``predicted_state_bytes``, ``groups_table``, ``memory_table``, ``comms_table``,
  ``throughput``, ``MESH_FOR_WORLD``, ...).
* :mod:`~course_utils.trainer3d.train`: the trainer on real ranks (``Groups``,
  ``build_groups``, ``Timer``, ``setup_rank``, ``train_step``, ``train_worker``, ``run``,
  ``torchrun_worker``).
* :mod:`~course_utils.trainer3d.torch_parts`: the same plan from PyTorch's parts
  (``init_device_mesh``, DTensor TP, ``pipelining``, FSDP2): ``qkv_for_tp``, ``torch_stage``,
  ``torch_train_worker``, ``run``, ``both_worker``, ``run_both``, ``full_weights``,
  ``check_against_reference``.
"""
