"""``python -m course_utils.sequence_parallel`` runs :mod:`course_utils.sequence_parallel.sequence`."""

import runpy

runpy.run_module("course_utils.sequence_parallel.sequence", run_name="__main__", alter_sys=True)
