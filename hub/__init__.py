"""The class on a JupyterHub (issue 47; docs/instructor.md, "A class on JupyterHub").

Serves no lecture: it is the instructor's. ``scripts/hub.py`` is its command line.

* :mod:`hub.accounts`: one Unix account per roster student, first passwords;
* :mod:`hub.spawner`: ``CourseSpawner`` (this machine) and ``CourseSlurmSpawner`` (Slurm jobs):
  each student's server as their own user, in a sandbox, with limits;
* :mod:`hub.exchange`: nbgrader's exchange with safe modes, collect checked against the owner,
  feedback handed back;
* :mod:`hub.client`: a running hub driven as its users do (the tests, ``benchmarks/hub_load.py``);
* ``hub/jupyterhub_config.py``: JupyterHub's configuration (authenticator, spawner, services).
"""
