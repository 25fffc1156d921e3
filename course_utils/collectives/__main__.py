"""``python -m course_utils.collectives`` runs :mod:`course_utils.collectives.primitives`."""

import runpy

runpy.run_module("course_utils.collectives.primitives", run_name="__main__", alter_sys=True)
