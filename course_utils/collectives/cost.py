"""What a ring collective costs: the one home of the 2(g - 1)/g and (g - 1)/g factors and of
the alpha-beta time model (lecture 2; every later lecture that counts bytes or time reads it).

In a ring of ``g`` ranks each rank sends ``g - 1`` pieces of ``buffer / g`` for a reduce-scatter,
an all-gather or an all-to-all, and twice that for an all-reduce (a reduce-scatter, then an
all-gather). ``buffer`` is the all-reduce's tensor, the all-gather's output, the
reduce-scatter's input, the all-to-all's input. Each of the ``steps`` costs a latency
``alpha`` plus its bytes over the link's bandwidth ``beta`` (Hockney's model; Thakur,
Rabenseifner and Gropp 2005, section 4). A group of one sends nothing.
"""

from __future__ import annotations

from course_utils.runtime import validate

__all__ = ["RING_OPS", "ring_factor", "ring_steps", "ring_bytes", "ring_time_s",
           "ring_bytes_per_rank"]

RING_OPS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "all_to_all": 1}
"""Collective -> how many times ``(g - 1)/g`` of its buffer each rank sends."""


def ring_factor(op: str, group_size: int) -> float:
    """The share of the buffer each rank sends: 2(g - 1)/g for an all-reduce, (g - 1)/g for
    the others of :data:`RING_OPS`."""
    times = validate.one_of("op", op, RING_OPS)
    g = validate.check_int("group_size", group_size, 1)
    return times * ((g - 1) / g)


def ring_steps(op: str, group_size: int) -> int:
    """Sequential steps of the ring: 2(g - 1) for an all-reduce, g - 1 for the others."""
    times = validate.one_of("op", op, RING_OPS)
    return times * (validate.check_int("group_size", group_size, 1) - 1)


def ring_bytes(op: str, buffer_bytes: float, group_size: int) -> float:
    """Bytes one rank sends for ``op`` over ``group_size`` ranks on a buffer of
    ``buffer_bytes``."""
    validate.check_real("buffer_bytes", buffer_bytes, 0, strict=False)
    return ring_factor(op, group_size) * buffer_bytes


def ring_time_s(n_bytes: float, world_size: int, alpha_s: float,
                bandwidth_bytes_per_s: float, op: str = "all_reduce") -> float:
    """Seconds for one ring ``op`` on a buffer of ``n_bytes`` in the alpha-beta model::

        T = steps x alpha + ring_bytes / beta     (all-reduce: 2(D - 1) alpha + 2(D - 1)/D n / beta)

    The bandwidth term stays below 2n/beta for every D; the latency term grows linearly with D.
    ``ring_time_s(0, D, alpha, beta)`` is the latency term alone and ``ring_time_s(n, D, 0,
    beta)`` the bandwidth term alone. Left out: the additions' time and contention between
    links."""
    validate.check_real("n_bytes", n_bytes, 0, strict=False)
    validate.check_int("world_size", world_size, 1)
    validate.check_real("alpha_s", alpha_s, 0, strict=False)
    validate.check_real("bandwidth_bytes_per_s", bandwidth_bytes_per_s, 0)
    sent = ring_bytes(op, n_bytes, world_size)
    return ring_steps(op, world_size) * alpha_s + sent / bandwidth_bytes_per_s


def ring_bytes_per_rank(numel: int, world_size: int, element_size: int = 4) -> float:
    """Bytes each rank sends in a ring all-reduce of ``numel`` elements of ``element_size``
    bytes: 2(D - 1)/D x N x element size (the mean over ranks)."""
    validate.check_int("numel", numel, 0)
    validate.check_int("world_size", world_size, 1)
    validate.check_int("element_size", element_size, 1)
    return ring_bytes("all_reduce", numel * element_size, world_size)
