"""Instructor-side grading for the course, in the order a submission meets it.

1. **collect** - :mod:`grading.workflow` (release, collect, autograde in parallel, feedback,
   export), or :mod:`grading.slurm_executor` / :mod:`grading.slurm` on a cluster;
2. **run** - :mod:`grading.reference` (the solution, run once), :mod:`grading.preprocessors`
   (each submission, cell by cell), :mod:`grading.sandbox` and :mod:`grading.cgroups` (the
   kernel's empty machine and its limits), :mod:`grading.filters` (what nbgrader's notebook
   keeps: the release's metadata, inert student content, bounded outputs);
3. **judge** - :mod:`grading.judge` (every test cell decided outside the kernel, from values)
   and :mod:`grading.expected` (what a judge expects, per variant);
4. **verify** - :mod:`grading.verify` (each student's result), :mod:`grading.scan` (what the
   code says), :mod:`grading.digests` (results fixed when grading ends);
5. **report** - :mod:`grading.report`, :mod:`grading.copies` (copied-answer evidence),
   :mod:`grading.class_report` (the class as a whole).

Under all of them: :mod:`grading.course` (folders, cells, the release), :mod:`grading.files`
and :mod:`grading.inert` (student files and text made harmless). Beside them:
:mod:`grading.visible` (the release's sealed visible checks), :mod:`grading.leaks`,
:mod:`grading.synthetic` and :mod:`grading.attacks` (synthetic students for the tests and
benchmarks). :mod:`grading.integrity` gathers the stages' public names for callers. No module
imports one that imports it back (``tests/test_grading_layout.py``); nothing here is imported
by student kernels.
"""
