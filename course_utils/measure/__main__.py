"""``python -m course_utils.measure`` runs :mod:`course_utils.measure.run`."""

import runpy

runpy.run_module("course_utils.measure.run", run_name="__main__", alter_sys=True)
