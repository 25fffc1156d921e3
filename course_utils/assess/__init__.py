"""What the assignments and the grader use: checks, messages, each student's numbers, harnesses.

Every lecture's assignment (lectures 1 to 13) and ``grading/`` read it:

* :mod:`~course_utils.assess.checks`: the checks of the test cells (``check_number``,
  ``check_choice``, ``check_sequence``, ``submit``, ``seal``, ...): in the student's kernel they
  check types and hand values to the grader; in the grader they judge them and name the
  misconception.
* :mod:`~course_utils.assess.messages`: how a failure reaches the student, one short block
  (``install``, ``show``); importing ``course_utils`` installs it.
* :mod:`~course_utils.assess.variants`: each student's own numbers (``identity``, ``givens``,
  ``Givens``, ``draw``, ``every_variant``), drawn from the options that
  :mod:`~course_utils.assess.givens` states for each assignment (``given``, ``GIVENS``,
  ``ACCELERATOR_GB``).
* one harness per assignment whose questions run a student's code (on real ranks, or on JAX's
  devices), named like its judge (``authoring/judges/<name>.py``):
  :mod:`~course_utils.assess.a3_zero`, :mod:`~course_utils.assess.a4_tensor_parallel`,
  :mod:`~course_utils.assess.a8_jax_sharding`, :mod:`~course_utils.assess.a10_capstone`
  (module 10's 3-D step), :mod:`~course_utils.assess.a12_checkpointing`.

Import the module you need (``from course_utils.assess import checks``). This package imports
nothing itself: importing ``course_utils`` loads :mod:`~course_utils.assess.messages`, so this
file stays light (no torch); the harnesses load torch when imported.
"""
