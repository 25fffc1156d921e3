"""benchmarks/gpu_check.py runs every line on CPU at small size: the same checks a GPU machine
runs at full size, on gloo ranks, with the predictions that are exact asserted exactly."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from course_utils.runtime import backend
from course_utils.pipeline import schedule as pipeline_schedule

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    report = _gpu_check().main(["--size", "small", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == report
    page = (tmp_path / "gpu_check.md").read_text()
    for title in ("1. Persistent state", "2. Activations", "3. All-reduce", "4. Pipeline bubble",
                  "5. Straggler", "6. Step time"):
        assert title in page
    state = report["state"]
    assert state["counted_bytes"] == state["predicted_bytes"] == 16 * state["n_params"]
    assert state["allocated_bytes"] is None and state["peak_bytes"] is None  # CPU: no allocator
    assert report["activations"]["measured_bytes"] == report["activations"]["predicted_bytes"]
    want = backend.resolve_backend("auto", 2)
    for name in ("allreduce", "bubble", "straggler"):
        assert report[name]["ranks"] == 2 and report[name]["backend"] == want
    for row in report["allreduce"]["rows"]:
        assert row["ring_s"] > 0 and row["library_s"] > 0
        assert row["ring_busbw_gbs"] == pytest.approx(row["bytes"] / row["ring_s"] / 1e9)
    for row in report["bubble"]["rows"]:
        assert row["formula"] == pipeline_schedule.bubble_fraction(2, row["m"])
        assert 0 <= row["measured"] < 1
    straggler = report["straggler"]
    assert straggler["fast_rank_wait_s"] >= 0.5 * straggler["delay_s"]  # it waits for the late one
    assert straggler["slow_rank_wait_s"] < straggler["fast_rank_wait_s"]
    step = report["step_time"]     # the compute term is a lower bound: the step is more than
    assert 0 < step["predicted_s"] and 0.05 < step["whole_step_share"] < 1.5  # its matmuls


def test_gpu_check_says_what_one_gpu_cannot_measure():
    gc = _gpu_check()
    assert "one GPU" in gc.check_bubble(gc.SIZES["small"], gpus=1)["skipped"]
    with pytest.raises(ValueError, match="size must be one of"):
        gc.run("huge")
