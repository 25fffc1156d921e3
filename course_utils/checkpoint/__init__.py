"""TODO checkpoint."""

# the names of the former course_utils.checkpoint module
from course_utils.checkpoint.dcp import (  # noqa: F401
    PRELOAD, PIECES, PER_RANK, CheckpointError, state_to_save, save, load, verify, step_folder,
    latest, file_bytes, job_folder,
)
