"""course_utils.runtime.backend: everything that differs between gloo (CPU) and NCCL (GPU), in one place,
and no other library module deciding a device for itself."""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.runtime import backend
from course_utils import measure

ROOT = Path(__file__).resolve().parents[1]


def test_no_library_module_hardcodes_a_device():
    """Workers take their device from backend.device(): no module but backend.py names the CPU or
    CUDA for a tensor, a mesh or a group (results leave a rank through backend.to_cpu)."""
    pattern = re.compile(r"\.cuda\(|\.cpu\(\)|device=\"(cpu|cuda)\"|torch\.device\(\"(cpu|cuda)\"\)"
                         r"|init_device_mesh\(\"(cpu|cuda)\"|new_group\([^)]*backend=")
    offenders = []
    for path in sorted((ROOT / "course_utils").rglob("*.py")):
        if path.name in ("backend.py", "checks.py"):  # checks.py compares answers in the kernel
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_every_demo_module_routes_its_launch_through_backend():
    """The device decision lives in backend: launch re-exports it, it is not a second copy."""
    assert launch.device is backend.device and launch.resolve_backend is backend.resolve_backend
    assert measure.synchronize is backend.synchronize


def test_to_device_and_to_cpu_walk_nested_results():
    Pair = collections.namedtuple("Pair", "a b")
    obj = {"x": torch.ones(2), "items": [torch.zeros(1), (torch.arange(3), "text")], "n": 3,
           "pair": Pair(1, 2)}
    moved = backend.to_device(obj, torch.device("cpu"))
    assert moved["n"] == 3 and moved["items"][1][1] == "text" and moved["pair"] == Pair(1, 2)
    torch.testing.assert_close(moved["items"][1][0], torch.arange(3))
    assert isinstance(moved["items"], list) and isinstance(moved["items"][1], tuple)
    back = backend.to_cpu(moved)
    assert back["x"] is obj["x"]  # already on the CPU: not copied
    assert backend.device().type == "cpu"  # outside a process group


def test_cpu_has_no_allocator_peak_and_nothing_to_synchronize():
    assert backend.peak_memory_bytes("cpu") is None
    backend.reset_peak_memory("cpu")
    backend.synchronize(torch.ones(1))
    for bad in (lambda: backend.synchronize(1.5), lambda: backend.peak_memory_bytes("gpu"),
                lambda: backend.reset_peak_memory([]), lambda: backend.to_device({}, "tpu0")):
        with pytest.raises(ValueError, match="device must be"):
            bad()
    assert backend.host_sees_collective_bytes() is None  # outside a process group


def test_new_group_rejects_a_bad_timeout():
    for bad in (0, -1, "60", True):
        with pytest.raises(ValueError, match="timeout_s must be a positive number"):
            backend.new_group([0], timeout_s=bad)


def test_differences_table_names_each_function_that_handles_a_row():
    table = backend.differences_table()
    assert table.splitlines()[0].split() == ["gloo", "(CPU)", "NCCL", "(GPU)", "handled", "by"]
    assert len(table.splitlines()) == 1 + len(backend.DIFFERENCES)
    for what, _, _, handlers in backend.DIFFERENCES:
        for handler in handlers.split(", "):
            assert handler in backend.__all__, handler
        assert what in table


def _gloo_facts(rank: int, world_size: int) -> dict:
    """On gloo: PREMUL_SUM is refused (so scaled_sum must scale first), scaled_sum gives the mean,
    the host sees the collective's bytes, and a backend.new_group works."""
    out = {}
    t = torch.tensor([1.0 + rank])
    try:
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        out["premul"] = "ran"
    except RuntimeError as exc:
        out["premul"] = str(exc)
    mean = torch.tensor([1.0 + rank, 10.0 * rank], dtype=torch.float64)
    backend.scaled_sum(mean, 1 / world_size)
    out["mean"] = mean.tolist()
    group = backend.new_group(timeout_s=30)
    s = torch.tensor([float(rank)])
    dist.all_reduce(s, group=group)
    out["group_sum"] = s.item()
    out["sees_bytes"] = backend.host_sees_collective_bytes()
    out["bytes_written"] = measure.bytes_written()
    return out


def test_gloo_differences_are_real_and_handled():
    results = launch.run(_gloo_facts, 2, backend="gloo", show_output=False)
    for r in results:
        assert "PREMUL_SUM" in r["premul"]  # the row in DIFFERENCES is true of this torch
        torch.testing.assert_close(torch.tensor(r["mean"], dtype=torch.float64),
                                   torch.tensor([1.5, 5.0], dtype=torch.float64))
        assert r["group_sum"] == 1.0
        assert r["sees_bytes"] is True and isinstance(r["bytes_written"], int)
    with pytest.raises(ValueError, match="factor must be a number"):
        backend.scaled_sum(torch.ones(1), "half")
