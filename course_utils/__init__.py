"""Helper library for the Distributed Training & Parallelism course, one package per concern,
in the order the course meets them (each package's ``__init__`` names the lectures it serves):

* :mod:`~course_utils.runtime` (backend, argument checks), :mod:`~course_utils.launch` (ranks on
  this machine) and :mod:`~course_utils.style` (figures): what every lecture stands on;
* :mod:`~course_utils.memory` (1, 9), :mod:`~course_utils.collectives` (2),
  :mod:`~course_utils.data_parallel` (2, 10), :mod:`~course_utils.zero` (3),
  :mod:`~course_utils.tensor_parallel` (4), :mod:`~course_utils.pipeline` (5),
  :mod:`~course_utils.mesh` and :mod:`~course_utils.sequence_parallel` (6),
  :mod:`~course_utils.measure` (7), :mod:`~course_utils.jax_sharding` (8),
  :mod:`~course_utils.models` and :mod:`~course_utils.trainer3d` (10),
  :mod:`~course_utils.scale` (11), :mod:`~course_utils.checkpoint` (12),
  :mod:`~course_utils.step_time` (13);
* :mod:`~course_utils.widgets`: the lectures' interactive figures;
* :mod:`~course_utils.assess`: checks, messages, per-student givens and the assignments'
  harnesses, the only part of the library the grader imports.

Import what a lecture uses, e.g. ``from course_utils import launch, memory``. Importing this
package loads nothing heavy. The old flat names (``course_utils.zero1``) still work:
:mod:`course_utils._aliases`.
"""

__version__ = "0.1.0"

from course_utils import _aliases  # noqa: E402

_aliases.install()

# In a notebook: failed checks as one short block, a hint for names an earlier cell defines.
from course_utils.assess import messages as _messages  # noqa: E402

_messages.install()
