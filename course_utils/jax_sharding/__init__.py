"""TODO jax_sharding."""

import importlib

FORMER = "course_utils.jax_sharding.plans"  # the former course_utils.jax_sharding module


def __getattr__(name: str):
    """The former module's names, loaded on first use: importing the package starts no JAX, so
    :mod:`~course_utils.jax_sharding.framework_compare` can set ``XLA_FLAGS`` first."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module(FORMER), name)
