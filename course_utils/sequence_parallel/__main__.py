"""``python -m course_utils.sequence_parallel`` runs the demo of
:mod:`course_utils.sequence_parallel.comparison`."""

import runpy

runpy.run_module("course_utils.sequence_parallel.comparison", run_name="__main__", alter_sys=True)
