"""nbgrader feedback preprocessors: keep each failed check's message, drop everything else.

A traceback from a hidden test quotes the hidden test's code; the message of the
``AssertionError`` (written by ``course_utils.checks``) is what names the student's mistake.
The check records (``course_utils.checks.RECORD_MIME`` display outputs, which carry the expected
values for the verifier) are for the instructor only and never reach the feedback.
"""

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from course_utils.checks import RECORD_MIME


class ShowOnlyErrorMessages(Preprocessor):
    """Replace every error output's traceback with its one-line ``Name: message``; drop records."""

    enabled = Bool(True).tag(config=True)  # nbgrader registers preprocessors as not enabled

    def preprocess_cell(self, cell, resources, index):
        """Shorten tracebacks and remove check-record outputs from one cell."""
        kept = []
        for output in cell.get("outputs", []):
            if RECORD_MIME in output.get("data", {}):
                continue
            if output.get("output_type") == "error":
                message = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
                output["traceback"] = [message]
            kept.append(output)
        if "outputs" in cell:
            cell["outputs"] = kept
        return cell, resources
