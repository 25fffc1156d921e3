"""Lecture 5, pipeline parallelism: schedules, their bubble, real ranks, the backward split.

Lecture 5 cuts a model into stages, simulates and measures the schedules' idle time (GPipe,
1F1B, interleaved), then splits the backward into I and W for the zero-bubble schedules.
Modules, lower to higher:

* :mod:`~course_utils.pipeline.zero_bubble`: the B/W-split schedules' op orders and the papers'
  formulas (``SPLIT_SCHEDULES``, ``V_SCHEDULES``, ``split_order``, ``overlapped_pairs``,
  ``paper_bubble``, ``min_microbatches``, ``paper_bubble_fraction``,
  ``paper_peak_activations``, ``held_for_w``).
* :mod:`~course_utils.pipeline.schedule`: bubble formulas, batch accounting and the simulator
  (``bubble_fraction``, ``bubble_ratio``, ``interleaved_bubble_fraction``,
  ``min_microbatches``, ``effective_batch``, ``SCHEDULES``, ``Op``, ``Timeline``,
  ``schedule_order``, ``simulate``, ``format_timeline``, ``op_label``, ...).
* :mod:`~course_utils.pipeline.pictures`: timelines drawn (``op_color``, ``legend_handles``,
  ``draw_timeline``).
* :mod:`~course_utils.pipeline.backward_split`: I now, W later, by hand (``linear_input_grad``,
  ``linear_weight_grad``, ``full_backward``, ``autograd_split``, ``matmul_flops``,
  ``SplitStage``).
* :mod:`~course_utils.pipeline.runtime`: the pipeline on real ranks with send/recv and with
  ``torch.distributed.pipelining`` (``make_model``, ``make_batch``, ``split_stages``,
  ``stage_bounds``, ``pipeline_worker``, ``torch_pipeline_worker``, ``measure_bubble``,
  ``matmul_throughput``, ``run_student_pipeline``, ``microbatch_reference``, ``to_numpy``,
  ``hold_until``, ``MAX_OP_TIME_S``, ...).
* :mod:`~course_utils.pipeline.zero_bubble_runtime`: zero-bubble pipelines on real ranks
  (``split_pipeline_worker``, ``torch_split_worker``, ``measure_schedules``,
  ``post_validation_worker``, ``post_validation_reference``).
* :mod:`~course_utils.pipeline.fiw_times`: F, I and W of a transformer layer counted and timed,
  and what unequal times do to a bubble (``Layer``, ``layer_flops``, ``measure_fiw``,
  ``schedule_idle``, ``compare_rows``, ``compare_table``).
"""

