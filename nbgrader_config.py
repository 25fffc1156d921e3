"""nbgrader configuration for the course: run nbgrader from the repository root.

solutions/<assignment>/   nbgrader source (reference solutions + hidden tests)
assignments/<assignment>/ released student versions (committed)
Student data (submissions, autograded copies, feedback, gradebook, exchange) lives in
$COURSE_DATA (default: .course_data/ in the repo, ignored by git), never in git.
"""

import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (provided by nbgrader)

ROOT = Path(__file__).resolve().parent
DATA = Path(os.environ.get("COURSE_DATA", ROOT / ".course_data")).expanduser().resolve()
DATA.mkdir(parents=True, exist_ok=True)

# Grading kernels must import the course's own course_utils, never a folder a student
# submitted beside their notebook: PYTHONPATH comes before the kernel's working directory.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

# Grading kernels start the rank launcher's forkserver without DDP/FSDP/DTensor preloaded (the
# assignments' tests use plain collectives): about 1 s less per graded notebook.
os.environ.setdefault("COURSE_LAUNCH_PRELOAD", "light")

# The grading preprocessors (grading/) are imported by nbgrader from the repository root.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# nbgrader runs `alembic` (gradebook migrations) from PATH: find the one beside this Python.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

c.CourseDirectory.root = str(ROOT)
c.CourseDirectory.course_id = "dtp"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "assignments"
c.CourseDirectory.submitted_directory = str(DATA / "submitted")
c.CourseDirectory.autograded_directory = str(DATA / "autograded")
c.CourseDirectory.feedback_directory = str(DATA / "feedback")
c.CourseDirectory.solution_directory = str(DATA / "solution")
c.CourseDirectory.db_url = f"sqlite:///{DATA / 'gradebook.db'}"
# (COURSE_EXCHANGE: the class hub's formgrader names a folder that is not there, turning its
# Release/Collect buttons off: scripts/hub.py does those steps, with its checks)
if os.environ.get("COURSE_EXCHANGE"):
    c.Exchange.root = os.environ["COURSE_EXCHANGE"]
else:
    c.Exchange.root = str(DATA / "exchange")
    (DATA / "exchange").mkdir(parents=True, exist_ok=True)

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# A cell that runs longer than this is stopped and scored 0; later cells still run. A kernel that
# ignores the interrupt (or dies) is restarted and the earlier cells replayed (grading/), instead
# of nbgrader giving up on the whole submission. A test cell's stderr is shown as stdout: nbgrader
# would otherwise score a correct answer that logs a warning 0. Every test cell is then decided by
# the judge outside the kernel (grading/judge.py), which replaces the cell's outputs with its
# verdict: what SaveAutoGrades stores is the judge's score.
c.Execute.timeout = 60
c.Execute.interrupt_on_timeout = True
# Once the last cell has run, the kernel is killed, not asked to exit: a graceful exit runs its
# atexit hooks (torch's teardown, the ranks' forkserver) and took 2.5 s per submission, for
# nothing the grade reads; the sandbox then ends whatever is left in the kernel's cgroups.
c.Execute.shutdown_kernel = "immediate"
# Before anything else reads a submission, every nbgrader field of every graded, answer and
# locked cell is put back from the release (a test cell whose "grade" flag was set to false is
# graded as released; grading/preprocessors.py).
c.Autograde.sanitize_preprocessors = [
    "grading.filters.RestoreReleaseMetadata",
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "nbgrader.preprocessors.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.Autograde.autograde_preprocessors = [
    "grading.preprocessors.RecoveringExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "grading.filters.LimitOutputBytes",
    "grading.filters.InertStudentContent",
    "grading.filters.StderrToStdout",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# The autograded notebook keeps only the metadata later steps read (the kernel's timing marks and
# anything a student added go; collect has already dropped a submission's unknown metadata).
c.ClearMetadataPreprocessor.enabled = True
c.ClearMetadataPreprocessor.preserve_cell_metadata_mask = {"nbgrader", "tags"}
c.ClearMetadataPreprocessor.preserve_nb_metadata_mask = {"kernelspec", "language_info"}

# A student who deletes a test cell gets it back (and is graded by it).
c.OverwriteCells.add_missing_cells = True

# Autograde and feedback copy no file but the notebooks: nbgrader would otherwise copy every other
# file of the student's folder into the autograded folder and on into the feedback the student
# gets back (the kernels never see either folder: grading/sandbox.py).
if sys.argv[1:2] and sys.argv[1] in ("autograde", "generate_feedback"):
    c.CourseDirectory.ignore = ["*", ".*"]

# Student content is inert wherever a person opens it (issues 41, 51): the autograded notebook
# keeps only text and base64 PNG/JPEG outputs, and a written answer's HTML is shown as text
# (grading.filters.InertStudentContent above). Every page nbconvert renders (the formgrader's,
# which loads this file too, and feedback) makes the notebook it reads inert again (InertPage:
# whatever file that is), bounds what it renders of a student's cells (BoundPageText), renders
# markdown through grading.inert.markdown2html: nbconvert's renderer, then an allowlist on the
# rendered HTML (grading.inert.safe_html), and highlights code through
# grading.inert.highlight_code (and leaves links as safe_html left them:
# grading.inert.strip_files_prefix). nbconvert's own sanitizer is off: on the rendered cell it keeps
# bleach's twelve default tags and shows every heading and paragraph as literal tags (issue 50).
c.HTMLExporter.sanitize_html = False
c.HTMLExporter.preprocessors = ["grading.filters.InertPage", "grading.filters.BoundPageText"]
c.HTMLExporter.filters = {"markdown2html": "grading.inert.markdown2html",
                          "highlight_code": "grading.inert.highlight_code",
                          "strip_files_prefix": "grading.inert.strip_files_prefix"}

# Feedback shows the student's work and the judge's verdict on each test cell (the judge replaced
# the cell's outputs while grading), never hidden-test code or a traceback.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "grading.filters.MarkManualPending",
    "nbgrader.preprocessors.ClearHiddenTests",
    "grading.filters.ShowOnlyErrorMessages",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# Feedback made before the written answers are graded says so ("not graded yet"), and gives the
# automatic points apart (grading/templates/course_feedback; grading.filters.MarkManualPending).
# Only for generate_feedback: the formgrader's own page keeps its template.
if sys.argv[1:2] == ["generate_feedback"]:
    import nbgrader

    c.HTMLExporter.template_name = "course_feedback"
    c.HTMLExporter.template_file = "course_feedback.html.j2"
    c.HTMLExporter.extra_template_basedirs = [
        str(ROOT / "grading" / "templates"),
        str(Path(nbgrader.__file__).parent / "server_extensions" / "formgrader" / "templates")]
