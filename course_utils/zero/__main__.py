"""``python -m course_utils.zero`` runs :mod:`course_utils.zero.training`."""

import runpy

runpy.run_module("course_utils.zero.training", run_name="__main__", alter_sys=True)
