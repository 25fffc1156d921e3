"""``python -m course_utils.memory`` runs :mod:`course_utils.memory.sizing`."""

import runpy

runpy.run_module("course_utils.memory.sizing", run_name="__main__", alter_sys=True)
