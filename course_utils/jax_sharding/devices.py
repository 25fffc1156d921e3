"""JAX's CPU devices: the one module that sets ``XLA_FLAGS`` before ``import jax``.

JAX sees one process with several devices. On a laptop those are CPU "devices" that XLA makes
when ``XLA_FLAGS`` contains ``--xla_force_host_platform_device_count=8`` at the moment JAX starts
its CPU backend (the first ``jax.devices()`` or computation; before the first ``import jax`` is
the safe point to have it set). Importing this module sets that count if JAX has not been
imported yet, and adds it if JAX has been imported but ``XLA_FLAGS`` names no count (the lazy
package: ``from course_utils import jax_sharding as js``, ``import jax``, then
``js.require_devices(8)``). A process that imported JAX with a count of its own keeps it
(:mod:`~course_utils.jax_sharding.framework_compare`'s JAX side: the workload's count).
:func:`require_devices` refuses, naming the fix, if JAX already started with fewer devices.
Every module of ``course_utils.jax_sharding`` that imports JAX imports this one first (see
``shared/notes/jax-on-cpu.md``).

Here: :data:`DEVICES` (lecture 8's count), :func:`with_device_flag`, :func:`require_devices`,
and :func:`check_devices` / :func:`on_one_device`, which the lecture's programs share.
Lecture 8 (JAX), its setup cell.
"""

from __future__ import annotations

import os
import sys
from typing import Any

DEVICES = 8  # the lecture's CPU devices
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def with_device_flag(flags: str, n: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with the host device count set to ``n``."""
    if not isinstance(flags, str):
        raise TypeError(f"flags must be a str (an XLA_FLAGS value); got {type(flags).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (the number of CPU devices); got {n!r}")
    kept = [f for f in flags.split() if not f.startswith(DEVICE_FLAG + "=")]
    return " ".join(kept + [f"{DEVICE_FLAG}={n}"])


# The flag only counts before JAX starts its CPU backend (after that, setting it is harmless).
_flags = os.environ.get("XLA_FLAGS", "")
if "jax" not in sys.modules or DEVICE_FLAG + "=" not in _flags:
    os.environ["XLA_FLAGS"] = with_device_flag(_flags, DEVICES)

import jax  # noqa: E402

from course_utils.runtime.validate import check_int  # noqa: E402

__all__ = ["DEVICES", "DEVICE_FLAG", "with_device_flag", "require_devices"]


def require_devices(n: int = DEVICES) -> list:
    """The first ``n`` CPU devices; a clear error if JAX started with fewer."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (the number of CPU devices); got {n!r}")
    devices = jax.devices("cpu")
    if len(devices) < n:
        raise RuntimeError(
            f"JAX has {len(devices)} CPU device(s), and {n} are needed. The device count is "
            f"fixed when JAX starts: XLA_FLAGS must contain {DEVICE_FLAG}={n} before the first "
            "`import jax` in this process (it was imported earlier without it). Restart the "
            "kernel and run the setup cell first (it sets XLA_FLAGS, then imports JAX).")
    return devices[:n]


def check_devices(devices: Any, name: str = "devices") -> int:
    """``devices`` if it is a device count from 1 to the CPU devices JAX has; else ValueError
    naming ``name``."""
    check_int(name, devices)
    have = len(jax.devices("cpu"))
    if devices > have:
        raise ValueError(f"{name} must be at most the {have} CPU devices JAX has; got {devices}")
    return devices


def on_one_device(*trees: Any) -> tuple:
    """``trees`` placed whole on CPU device 0 (where the one-device references run)."""
    return jax.device_put(trees, jax.devices("cpu")[0])
