"""``python -m course_utils.data_parallel`` runs :mod:`course_utils.data_parallel.replicas`."""

import runpy

runpy.run_module("course_utils.data_parallel.replicas", run_name="__main__", alter_sys=True)
