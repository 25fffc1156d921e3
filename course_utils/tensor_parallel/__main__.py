"""``python -m course_utils.tensor_parallel`` runs :mod:`course_utils.tensor_parallel.layers`."""

import runpy

runpy.run_module("course_utils.tensor_parallel.layers", run_name="__main__", alter_sys=True)
