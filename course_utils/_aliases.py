"""The library's old flat module names, kept working: ``course_utils.zero1`` is
``course_utils.zero.zero1``, the same module object, so a student's notebook written against an
earlier release (``from course_utils import pipeline_schedule``, ``-m course_utils.reshard``) still
runs. Each old name is a row of :data:`OLD_NAMES`, each name that left its package one of
:data:`OLD_ATTRIBUTES` (``grading.names`` reads both tables to follow old names statically);
:func:`install` puts the finder on ``sys.meta_path``.

New code imports the new names; ``tests/test_old_names.py`` imports every old name a released
notebook of any earlier version used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

OLD_NAMES = {
    "activations": "memory.activations",
    "assignment_givens": "assess.givens",
    "backend": "runtime.backend",
    "backward_split": "pipeline.backward_split",
    "capstone": "assess.a10_capstone",
    "checkpoint3d": "checkpoint.trainer3d",
    "checkpoint_interval": "checkpoint.interval",
    "checks": "assess.checks",
    "expert_parallel": "sequence_parallel.experts",
    "fiw_times": "pipeline.fiw_times",
    "framework_compare": "jax_sharding.framework_compare",
    "fsdp": "zero.fsdp",
    "grad_buffer": "zero.grad_buffer",
    "llama_shapes": "models.llama_shapes",
    "lost_node": "checkpoint.lost_node",
    "lost_rank": "checkpoint.lost_rank",
    "messages": "assess.messages",
    "overlap": "data_parallel.overlap",
    "pipeline_parallel": "pipeline.runtime",
    "pipeline_pictures": "pipeline.pictures",
    "pipeline_schedule": "pipeline.schedule",
    "pitfalls": "data_parallel.pitfalls",
    "playground": "mesh.playground",
    "post_validation": "checkpoint.post_validation",
    "precision": "memory.precision",
    "reshard": "checkpoint.reshard",
    "resume_check": "assess.a12_checkpointing",
    "resume_demo": "checkpoint.resume_demo",
    "resume_job": "checkpoint.resume_job",
    "ring_allreduce": "collectives.ring",
    "ring_trace": "collectives.ring_trace",
    "scale_check": "scale.check",
    "scale_comms": "scale.comms",
    "scale_memory": "scale.memory",
    "scale_tables": "scale.tables",
    "stage_model": "trainer3d.stage_model",
    "tiny_lm": "models.tiny_lm",
    "tp_pictures": "tensor_parallel.pictures",
    "train3d": "trainer3d.train",
    "train3d_check": "trainer3d.check",
    "train3d_comms": "trainer3d.comms",
    "train3d_torch": "trainer3d.torch_parts",
    "validate": "runtime.validate",
    "variants": "assess.variants",
    "vocab_parallel": "tensor_parallel.vocab",
    "zero1": "zero.zero1",
    "zero3": "zero.zero3",
    "zero_bubble": "pipeline.zero_bubble",
    "zero_bubble_parallel": "pipeline.zero_bubble_runtime",
}

OLD_ATTRIBUTES = {
    "zero": {"run_shard_step": "assess.a3_zero", "shard_step_harness": "assess.a3_zero"},
    "tensor_parallel": {"run_row_parallel": "assess.a4_tensor_parallel",
                        "row_parallel_harness": "assess.a4_tensor_parallel"},
    "jax_sharding": {"row_parallel_harness": "assess.a8_jax_sharding"},
}
"""Names that left a package for another (an assignment's harness went to ``assess``):
package -> {name: the module that holds it now}. The package's ``__getattr__`` calls
:func:`moved`, so ``course_utils.zero.run_shard_step`` keeps working without ``zero`` importing
the higher ``assess`` package."""

_PREFIX = "course_utils."


class _OldName(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``course_utils.<old name>`` and answers with the module it is now."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname[len(_PREFIX):] if fullname.startswith(_PREFIX) else None
        if old not in OLD_NAMES:
            return None
        new = importlib.util.find_spec(_PREFIX + OLD_NAMES[old])
        return importlib.util.spec_from_loader(fullname, self, origin=new.origin)

    def create_module(self, spec):
        module = importlib.import_module(_PREFIX + OLD_NAMES[spec.name[len(_PREFIX):]])
        spec.loader_state = module.__spec__  # import sets __spec__ to the alias's: put it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname):
        """``python -m course_utils.<old name>`` runs the module under its new name's code."""
        new = _PREFIX + OLD_NAMES[fullname[len(_PREFIX):]]
        return importlib.util.find_spec(new).loader.get_code(new)


def moved(package: str, name: str):
    """``package.name`` for a name in :data:`OLD_ATTRIBUTES` (a package's ``__getattr__``)."""
    home = OLD_ATTRIBUTES.get(package[len(_PREFIX):], {}).get(name)
    if home is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PREFIX + home), name)


def install() -> None:
    """Put the old names' finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _OldName) for f in sys.meta_path):
        sys.meta_path.append(_OldName())
