"""The course's measurable claims, run on this machine's GPUs (or on CPU ranks at small size).

Five checks, each a prediction from the course beside a measurement:

1. **state**: one training step of a bf16 MLP in the 16-byte layout (``memory.MixedPrecisionAdam``):
   16 B/param predicted; storages counted; on CUDA also ``torch.cuda.memory_allocated`` after
   the step (persistent) and ``max_memory_allocated`` (peak, with the step's transients).
2. **activations**: what one TinyLM block saves for backward, module 9's formula vs saved-tensor
   hooks on the device.
3. **all-reduce**: the course's ring vs the library all-reduce (NCCL with 2+ GPUs), bus
   bandwidth 2(D - 1)/D x bytes / time.
4. **bubble**: the measured idle fraction of a GPipe step vs (P - 1)/(m + P - 1).
5. **straggler**: the wait a fast rank spends in the all-reduce when one rank is late.
6. **step time**: module 13's compute term, a Llama-style layer stack's forward and backward
   predicted from one matmul's measured rate (``step_time.transformer.predict`` on the
   device's achieved FLOP/s), beside the measured time; on an H100 the measured matmul rate
   beside the course's efficiency figure (794.5 of 989 TFLOP/s).

Checks 3-5 need one GPU per rank; with fewer than two GPUs they run on gloo CPU ranks and say
so, and with exactly one GPU the bubble (a GPU-only effect here) is marked skipped. Nothing is
downloaded: every model is built locally. Writes ``gpu_check.json`` and ``gpu_check.md``::

    .venv/bin/python benchmarks/gpu_check.py                      # full size (GPU machine)
    .venv/bin/python benchmarks/gpu_check.py --size small --out /tmp/check   # CPU, seconds
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from course_utils import launch  # noqa: E402
from course_utils.memory import activations  # noqa: E402
from course_utils.runtime import backend  # noqa: E402
from course_utils.data_parallel import replicas as data_parallel  # noqa: E402
from course_utils.memory import sizing as memory  # noqa: E402
from course_utils.pipeline import runtime as pipeline_parallel  # noqa: E402
from course_utils.collectives import ring as ring_allreduce  # noqa: E402
from course_utils.models import tiny_lm  # noqa: E402

# size -> settings; "full" is for a GPU machine (about 1.0e9 parameters: 16 GB of state)
SIZES: dict[str, dict[str, Any]] = {
    "small": {"mlp_widths": (64, 256, 64), "batch": 8,
              "block": dict(d_model=64, n_heads=4, d_ff=256), "act_batch": 2, "act_seq": 64,
              "allreduce_bytes": [1 << 20, 4 << 20], "repeats": 3,
              "bubble_ms": [2, 6], "bubble": dict(width=32, microbatch=8, op_time_s=0.005),
              "delay_s": 0.05,
              "step": dict(layers=2, hidden=256, ffn=768, heads=4, kv_heads=4, vocab=1000,
                           seq=256, batch=2)},
    "full": {"mlp_widths": (8192,) * 16, "batch": 8,
             "block": dict(d_model=2048, n_heads=16, d_ff=8192), "act_batch": 4, "act_seq": 2048,
             "allreduce_bytes": [16 << 20, 256 << 20, 1 << 30], "repeats": 5,
             "bubble_ms": [2, 8, 32], "bubble": dict(width=4096, microbatch=512, op_time_s=0.0),
             "delay_s": 0.2,
             "step": dict(layers=4, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256,
                          seq=4096, batch=1)},
}


def machine() -> dict[str, Any]:
    """What ran: torch, CUDA and NCCL versions, the devices, the CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpus else None,
            "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)],
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "python": platform.python_version()}


def check_state(s: dict, dev: torch.device) -> dict[str, Any]:
    """Check 1: a bf16 MLP, one step of 16-byte mixed-precision Adam on ``dev``."""
    backend.reset_peak_memory(dev)
    base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    model = memory.tiny_mlp(s["mlp_widths"]).to(dev)
    opt = memory.MixedPrecisionAdam(model, lr=1e-4)
    n = sum(p.numel() for p in model.parameters())
    x = torch.randn(s["batch"], s["mlp_widths"][0]).to(dev, torch.bfloat16)   # (B, C_in)
    model(x).float().pow(2).mean().backward()
    opt.step()
    backend.synchronize(dev)
    counted = memory.count_state_bytes(model, opt)
    persistent = counted["weights"] + counted["grads"] + counted["master"] + counted["optimizer"]
    out = {"n_params": n, "predicted_bytes": memory.state_bytes(n, "mixed_adam16"),
           "counted_bytes": persistent, "adam_step_counters_bytes": counted["other"],
           "allocated_bytes": None, "peak_bytes": backend.peak_memory_bytes(dev)}
    if base is not None:
        out["allocated_bytes"] = torch.cuda.memory_allocated(dev) - base
        out["peak_bytes"] -= base
    del model, opt, x
    return out


def check_activations(s: dict, dev: torch.device) -> dict[str, Any]:
    """Check 2: bytes one block saves (math attention, no recomputation), formula vs hooks."""
    cfg = tiny_lm.TinyLMConfig(seq_len=s["act_seq"], **s["block"])
    b, t = s["act_batch"], s["act_seq"]
    return {"config": {"batch": b, "seq": t, **s["block"]},
            "predicted_bytes": activations.predicted_block_bytes(cfg, b, t),
            "measured_bytes": activations.measured_block_bytes(cfg, b, t, device=dev)}


def _ranks(gpus: int, most: int = 8) -> tuple[int, str]:
    """Ranks for the multi-rank checks and the backend they get: one per GPU, or 2 on gloo."""
    world = min(gpus, most) if gpus >= 2 else 2
    return world, backend.resolve_backend("auto", world)


def check_allreduce(s: dict, gpus: int) -> dict[str, Any]:
    """Check 3: median seconds of the ring and of the library all-reduce, and bus bandwidth."""
    world, name = _ranks(gpus)
    times = launch.run(ring_allreduce.bandwidth_worker, world, s["allreduce_bytes"], s["repeats"],
                       timeout_s=300, show_output=False)[0]
    rows = []
    for k, nbytes in enumerate(s["allreduce_bytes"]):
        bus = 2 * (world - 1) / world * nbytes
        rows.append({"bytes": nbytes, "ring_s": times["ring"][k], "library_s": times["gloo"][k],
                     "ring_busbw_gbs": bus / times["ring"][k] / 1e9,
                     "library_busbw_gbs": bus / times["gloo"][k] / 1e9})
    return {"ranks": world, "backend": name, "rows": rows}


def check_bubble(s: dict, gpus: int) -> dict[str, Any]:
    """Check 4: GPipe's measured idle fraction vs the formula, P = ranks."""
    if gpus == 1:
        return {"skipped": "one GPU: a pipeline needs a device per stage (run it on 2+ GPUs; "
                           "lecture 5 measures it on CPU ranks with emulated kernels)"}
    world, name = _ranks(gpus, most=4)
    rows = pipeline_parallel.measure_bubble(world, s["bubble_ms"], schedule="gpipe",
                                            steps=2, **s["bubble"])
    return {"ranks": world, "backend": name, "emulated_kernels": s["bubble"]["op_time_s"] > 0,
            "rows": [{"m": r["m"], "formula": r["formula"], "measured": r["measured"]}
                     for r in rows]}


def check_straggler(s: dict, gpus: int) -> dict[str, Any]:
    """Check 5: rank 1 is late by ``delay_s`` each step; rank 0's wait in the all-reduce."""
    world, name = _ranks(gpus)
    res = launch.run(data_parallel.straggler_worker, world, 1, s["delay_s"],
                     timeout_s=120, show_output=False)
    return {"ranks": world, "backend": name, "delay_s": s["delay_s"],
            "fast_rank_wait_s": res[0]["wait_s"], "slow_rank_wait_s": res[1]["wait_s"]}


class _Layer(torch.nn.Module):
    """A Llama-style layer's matmuls and attention (norms left out, as the model leaves them)."""

    def __init__(self, h: int, f: int, heads: int, kv: int):
        super().__init__()
        lin = functools.partial(torch.nn.Linear, bias=False)
        self.heads, self.kv, self.hd = heads, kv, h // heads
        self.q, self.k, self.v, self.o = lin(h, h), lin(h, kv * self.hd), lin(h, kv * self.hd), \
            lin(h, h)
        self.w1, self.w3, self.w2 = lin(h, f), lin(h, f), lin(f, h)

    def forward(self, x):
        b, t, h = x.shape
        q = self.q(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
        return x + self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


def check_step_time(s: dict, dev: torch.device) -> dict[str, Any]:
    """Check 6: a layer stack's forward and backward, measured, against module 13's compute term
    at the rate one of its matmuls reaches on ``dev``."""
    from course_utils.step_time import hardware, transformer

    c = s["step"]
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    arch = transformer.Arch("check", c["layers"], c["hidden"], c["ffn"], c["heads"],
                            c["kv_heads"], c["vocab"])
    n = c["batch"] * c["seq"]

    def timed(fn, repeats=5):
        fn()
        best = float("inf")
        for _ in range(repeats):
            backend.synchronize(dev)
            t0 = time.perf_counter()
            fn()
            backend.synchronize(dev)
            best = min(best, time.perf_counter() - t0)
        return best

    a = torch.randn(n, c["hidden"], device=dev, dtype=dtype)
    w = torch.randn(c["hidden"], c["ffn"], device=dev, dtype=dtype)
    rate = hardware.matmul_flops(n, c["hidden"], c["ffn"]) / timed(lambda: a @ w)
    layers = torch.nn.Sequential(*[_Layer(c["hidden"], c["ffn"], c["heads"], c["kv_heads"])
                                   for _ in range(c["layers"])]).to(dev, dtype)
    head = torch.nn.Linear(c["hidden"], c["vocab"], bias=False).to(dev, dtype)
    x = torch.randn(c["batch"], c["seq"], c["hidden"], device=dev, dtype=dtype)

    def step():
        head(layers(x)).float().square().mean().backward()

    measured = timed(step, 3)
    hw = hardware.Hardware(str(dev), rate, 1e18, hardware.H100.intra, hardware.H100.inter)
    job = transformer.Job(arch, tp=1, pp=1, dp=1, global_batch=c["batch"],
                          micro_batch=c["batch"], seq=c["seq"])
    predicted = transformer.predict(job, hw).terms.compute
    out = {"config": c, "dtype": str(dtype), "matmul_flops_per_s": rate,
           "predicted_s": predicted, "measured_s": measured,
           "whole_step_share": predicted / measured}
    if dev.type == "cuda" and "H100" in torch.cuda.get_device_name(dev):
        out["h100_efficiency_measured"] = rate / hardware.H100.peak_flops
        out["h100_efficiency_course"] = hardware.H100.efficiency
    return out


def run(size: str = "full") -> dict[str, Any]:
    """Every check at ``size``; returns the report (machine, settings, one entry per check)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}; got {size!r}")
    s = SIZES[size]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    dev = torch.device("cuda", 0) if gpus else torch.device("cpu")
    report: dict[str, Any] = {"size": size, "machine": machine(), "device": str(dev)}
    checks = {"state": lambda: check_state(s, dev),
              "activations": lambda: check_activations(s, dev),
              "allreduce": lambda: check_allreduce(s, gpus),
              "bubble": lambda: check_bubble(s, gpus),
              "straggler": lambda: check_straggler(s, gpus),
              "step_time": lambda: check_step_time(s, dev)}
    for name, fn in checks.items():
        start = time.perf_counter()
        report[name] = fn()
        report[name]["seconds"] = round(time.perf_counter() - start, 2)
        print(f"{name}: done in {report[name]['seconds']} s", flush=True)
    return report


def _gb(n: float | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{int(n):,} B"


def markdown(r: dict[str, Any]) -> str:
    """The report as a Markdown page: machine, then one table per check."""
    m = r["machine"]
    lines = [f"# GPU check ({r['size']} size)", "",
             f"torch {m['torch']}, CUDA {m['cuda']}, NCCL {m['nccl']}; "
             f"GPUs: {', '.join(m['gpus']) or 'none'}; CPU: {m['cpu']} x {m['cpu_count']}", ""]
    st = r["state"]
    lines += ["## 1. Persistent state, 16-byte layout", "",
              "| parameters | predicted (16 B/param) | storages counted | allocated after step "
              "| peak during step |", "|---|---|---|---|---|",
              f"| {st['n_params']:,} | {_gb(st['predicted_bytes'])} | {_gb(st['counted_bytes'])} "
              f"| {_gb(st['allocated_bytes'])} | {_gb(st['peak_bytes'])} |", ""]
    a = r["activations"]
    lines += ["## 2. Activations saved by one block (math attention)", "",
              "| B, T, D, H, F | predicted | measured (saved-tensor hooks) |", "|---|---|---|",
              f"| {a['config']['batch']}, {a['config']['seq']}, {a['config']['d_model']}, "
              f"{a['config']['n_heads']}, {a['config']['d_ff']} | {a['predicted_bytes']:,} B "
              f"| {a['measured_bytes']:,} B |", ""]
    ar = r["allreduce"]
    lines += [f"## 3. All-reduce, {ar['ranks']} ranks ({ar['backend']})", "",
              "| bytes | ring | library | ring bus bw | library bus bw |", "|---|---|---|---|---|"]
    lines += [f"| {row['bytes']:,} | {1e3 * row['ring_s']:.2f} ms "
              f"| {1e3 * row['library_s']:.2f} ms | {row['ring_busbw_gbs']:.2f} GB/s "
              f"| {row['library_busbw_gbs']:.2f} GB/s |"
              for row in ar["rows"]]
    b = r["bubble"]
    lines += ["", "## 4. Pipeline bubble, GPipe", ""]
    if "skipped" in b:
        lines += [f"Skipped: {b['skipped']}."]
    else:
        lines += [f"{b['ranks']} stages ({b['backend']}"
                  + (", kernels emulated by timed sleeps" if b["emulated_kernels"] else "") + ")",
                  "", "| m | (P-1)/(m+P-1) | measured |", "|---|---|---|"]
        lines += [f"| {row['m']} | {row['formula']:.3f} | {row['measured']:.3f} |"
                  for row in b["rows"]]
    sg = r["straggler"]
    lines += ["", f"## 5. Straggler, {sg['ranks']} ranks ({sg['backend']})", "",
              "| injected delay | fast rank's wait | slow rank's wait |", "|---|---|---|",
              f"| {1e3 * sg['delay_s']:.0f} ms | {1e3 * sg['fast_rank_wait_s']:.1f} ms "
              f"| {1e3 * sg['slow_rank_wait_s']:.1f} ms |", ""]
    st = r["step_time"]
    lines += ["## 6. Step time, module 13's compute term", "",
              f"{st['config']['layers']} Llama-style layers, hidden {st['config']['hidden']}, "
              f"{st['config']['batch']} x {st['config']['seq']} tokens, {st['dtype']}"
              + ("" if r["device"].startswith("cuda") else " (CPU: no GPU here; module 13's "
                 "benchmarks/step_time_trainer.py checks the model on gloo ranks)"), "",
              "| one matmul's rate | predicted forward + backward | measured | predicted / "
              "measured |", "|---|---|---|---|",
              f"| {st['matmul_flops_per_s'] / 1e12:.2f} TFLOP/s | {1e3 * st['predicted_s']:.1f} "
              f"ms | {1e3 * st['measured_s']:.1f} ms | {st['whole_step_share']:.2f} |", ""]
    if "h100_efficiency_measured" in st:
        lines += [f"H100: the matmul reached {100 * st['h100_efficiency_measured']:.1f} % of "
                  f"989 TFLOP/s; the course assumes {100 * st['h100_efficiency_course']:.1f} %.",
                  ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", default="benchmarks/results",
                        help="folder for gpu_check.json and gpu_check.md")
    args = parser.parse_args(argv)
    report = run(args.size)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_check.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    page = markdown(report)
    with open(os.path.join(args.out, "gpu_check.md"), "w", encoding="utf-8") as f:
        f.write(page)
    print(page)
    return report


if __name__ == "__main__":
    main()
