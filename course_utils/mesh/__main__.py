"""``python -m course_utils.mesh`` runs :mod:`course_utils.mesh.grid`."""

import runpy

runpy.run_module("course_utils.mesh.grid", run_name="__main__", alter_sys=True)
