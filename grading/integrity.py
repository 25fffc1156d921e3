"""The grading package at a glance, for its callers (scripts, tests, notebooks of the guide).

Grading runs in stages, each a module that imports only the ones before it:

1. **collect** (``grading.workflow.collect``): what students sent, regular files only;
2. **run**: the reference solution (``grading.reference``) and each submission
   (``grading.preprocessors.RecoveringExecute`` in the sandbox of ``grading.sandbox``, with the
   kernel's cgroups of ``grading.cgroups``), the notebook rewritten by ``grading.filters``;
3. **judge** (``grading.judge``): every test cell decided outside the kernel, from values;
4. **verify** (``grading.verify``, ``grading.scan``, ``grading.digests``): each student's
   verified result, flags from scanning the code, results fixed when grading ends;
5. **report** (``grading.report``, ``grading.copies``, ``grading.class_report``): the files
   the instructor reads, copied-answer evidence among them.

``grading.course`` (folders, cells, the release) and ``grading.inert`` / ``grading.files``
(student text and files made harmless) are used by every stage. This module only gathers their
public names, so that ``integrity.report(...)`` keeps working; no grading module imports it.
"""

from __future__ import annotations

# (the private names: used by the tests)
from grading.copies import answer_space, matches, named_mistake
from grading.course import (MAX_NOTEBOOK_BYTES, ROOT, VARIANTS_ENV, _meta, data_dir,  # noqa: F401
                            givens_for, is_answer_cell, is_test_cell, notebook_names,
                            read_notebook, release_notebook, restore_metadata, variants_on,
                            visible_traces)
from grading.digests import (ResultsChanged, check_digests, graded_submissions,
                             not_graded_reasons, record_digests, record_not_graded,
                             submission_digest)
from grading.reference import (SOLUTIONS_CHECK_ENV, _environ, check_committed,  # noqa: F401
                               follows_the_givens, launch_preload, reference_cache_path,
                               reference_run, run_key, sandboxed_client, submissions_by_cell,
                               variant_traces)
from grading.report import copied_answers, render_text, report, verify_assignment
from grading.scan import (WIDGETS, _python_source, helper_uses, identity_flags, scan_files,  # noqa: F401
                          scan_notebook, scan_source, worked_as)
from grading.verify import (CellResult, StudentResult, _inert, collect_log, condense,  # noqa: F401
                            verify_cell, verify_student)

__all__ = ["CellResult", "MAX_NOTEBOOK_BYTES", "ROOT", "ResultsChanged", "SOLUTIONS_CHECK_ENV",
           "StudentResult", "VARIANTS_ENV", "answer_space", "check_committed",
           "check_digests", "collect_log", "condense", "copied_answers", "data_dir",
           "follows_the_givens", "givens_for", "graded_submissions", "helper_uses",
           "identity_flags", "is_answer_cell", "is_test_cell", "launch_preload", "matches",
           "named_mistake", "not_graded_reasons", "notebook_names", "read_notebook",
           "record_digests", "record_not_graded", "reference_cache_path", "reference_run",
           "release_notebook", "render_text", "report", "restore_metadata", "run_key",
           "sandboxed_client", "scan_files", "scan_notebook", "scan_source",
           "submission_digest", "submissions_by_cell", "variant_traces", "variants_on",
           "verify_assignment", "verify_cell", "verify_student", "visible_traces", "worked_as"]
