"""Instructor-side grading for the course: nbgrader steps, integrity checks, reports.

* :mod:`grading.preprocessors` - nbgrader autograde preprocessors (a kernel that ignores the
  interrupt is restarted instead of failing the whole submission; stderr in a test cell is
  shown but no longer scores the cell 0).
* :mod:`grading.integrity` - the check that runs outside the student's kernel: re-judges every
  recorded check against the reference solution, notices checks that never ran, scans answer
  cells for tampering, and writes the per-assignment report.
* :mod:`grading.workflow` - release, collect, autograde (in parallel), feedback, export, report.
* :mod:`grading.synthetic` - synthetic submissions (correct, wrong, cheats) for tests/benchmarks.

Nothing here is imported by student kernels.
"""
