"""Lecture 13, time at scale: a step's time predicted term by term, calibrated, and checked.

Module 11 counts each rank's bytes and collectives exactly; lecture 13 turns them into seconds.
The model is a roofline per matmul (compute at the *achieved* rate), tensor-parallel collectives
on the node's link, the pipeline's bubble from module 5's simulator, the data-parallel
collectives that compute does not hide (module 9's buckets, FSDP's prefetch), and the optimizer.
It is calibrated on this machine's gloo ranks and checked against module 10's trainer on meshes
it was not calibrated on, then it predicts published runs. Assignment a13 grades it. Modules,
lower to higher:

* :mod:`~course_utils.step_time.hardware`: a device and its links (``Link``, ``Hardware``,
  ``H100``, ``A100``, ``matmul_flops``, ``matmul_s``).
* :mod:`~course_utils.step_time.terms`: a step's terms and how they add up (``TERMS``,
  ``WORDS``, ``StepTerms``, ``assemble``, ``format_terms``).
* :mod:`~course_utils.step_time.transformer`: a transformer's step on a TP x CP x PP x DP mesh
  (``Arch``, ``Job``, ``predict``, ``Prediction``, ``flops_per_token``, ``FLOP_COUNTS``,
  ``param_count``, ``matmul_params``).
* :mod:`~course_utils.step_time.published`: published runs predicted, each figure with its
  source (``RUNS``, ``Run``, ``rows``, ``table``, ``closing_efficiency``, ``leave_one_out``).
* :mod:`~course_utils.step_time.calibrate`: this machine's rates and links measured on gloo
  ranks, and module 10's trainer predicted on held-out meshes and measured.
* :mod:`~course_utils.step_time.pictures`: the step as a stacked bar per term.
"""
