"""nbgrader feedback preprocessor: keep each failed check's message, drop its traceback.

A traceback from a hidden test quotes the hidden test's code; the message of the
``AssertionError`` (written by ``course_utils.checks``) is what names the student's mistake.
"""

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool


class ShowOnlyErrorMessages(Preprocessor):
    """Replace every error output's traceback with its one-line ``Name: message``."""

    enabled = Bool(True).tag(config=True)  # nbgrader registers preprocessors as not enabled

    def preprocess_cell(self, cell, resources, index):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                message = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
                output["traceback"] = [message]
        return cell, resources
