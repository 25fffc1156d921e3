"""``python -m course_utils.launch package.module:function``: one rank of a torchrun job.

Runs that function (with the int arguments that follow) as one rank of the job
(:func:`course_utils.launch.torchrun.main`)."""

import sys

from course_utils import launch
from course_utils.launch import torchrun

if __name__ == "__main__":
    torchrun.main(sys.argv[1:], launch.__doc__)
