"""Published training runs, predicted from their papers' hardware and plan (lecture 13).

Each :class:`Run` is a job as its paper describes it (model, mesh, batch, schedule, hardware), the
figure the paper publishes (TFLOP/s per GPU, MFU, seconds a step or tokens per second per GPU)
with its source, and what the paper does not say that the prediction had to assume.
:func:`rows` predicts each with :func:`course_utils.step_time.transformer.predict`, gives the
error, and the efficiency at which the model would meet the published figure: the achieved
share of peak the run's whole step (not one matmul) must have had. Every figure was read in its
source (the closing note of issue 49 lists where); none is from memory.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from course_utils.runtime import validate
from course_utils.step_time.hardware import A100, H100, Hardware
from course_utils.step_time.transformer import Arch, Job, Prediction, predict

__all__ = ["LLAMA3_405B", "LLAMA3_70B", "LLAMA3_8B", "GPT_1T", "GPT_145B", "MEGASCALE_175B",
           "H100_TITAN", "Run", "RUNS", "KINDS", "published_value", "closing_efficiency",
           "leave_one_out", "rows", "table"]

# Llama 3 (Llama Team 2024, arXiv 2407.21783 v3, Table 3); vocabulary as released (128,256)
LLAMA3_405B = replace(Arch.llama("405B"), name="Llama 3 405B")
LLAMA3_70B = Arch("Llama 3 70B", 80, 8192, 28672, 64, 8, 128256)
LLAMA3_8B = Arch("Llama 3 8B", 32, 4096, 14336, 32, 8, 128256)
# Narayanan et al. 2021 (arXiv 2104.04473), Table 1: GPT models, vocabulary 51,200
GPT_1T = Arch.gpt("GPT 1T", 128, 25600, 160, 51200)
GPT_145B = Arch.gpt("GPT 145.6B", 80, 12288, 96, 51200)
# MegaScale (Jiang et al. 2024, arXiv 2402.15627), Table 1: 175B, vocabulary 64,000
MEGASCALE_175B = Arch.gpt("GPT 175B (MegaScale)", 96, 12288, 128, 64000)
# torchtitan's benchmark machines: H100 with 96 GB HBM2e at 2.4 TB/s, capped at 500 W
H100_TITAN = H100.but(name="H100 96 GB, 500 W", mem_bytes_per_s=2.4e12)

KINDS = {"tflops_per_gpu": "TFLOP/s per GPU", "mfu": "MFU", "step_s": "s per step",
         "tokens_per_s_per_gpu": "tokens/s per GPU"}


@dataclass(frozen=True)
class Run:
    """A published run: its job and hardware, the paper's FLOP ``count`` (for TFLOP/s and MFU),
    the published figures ``{kind: value}`` (:data:`KINDS`), where they are, and what the
    prediction assumes that the paper does not say."""

    label: str
    job: Job
    hw: Hardware
    count: str
    published: dict[str, float]
    source: str
    assumed: str


RUNS = (
    Run("Llama 3 405B, 8,192 H100", Job(LLAMA3_405B, tp=8, pp=16, dp=64, global_batch=2048,
                                        seq=8192, schedule="interleaved", v=4), H100,
        "attention", {"tflops_per_gpu": 430, "mfu": 0.43},
        "arXiv 2407.21783 v3, Table 4, row 1 (TP 8, CP 1, PP 16, DP 64, 8,192 tokens, 32 "
        "sequences per DP group: 16M tokens)",
        "microbatch 1 sequence; v = 4 chunks a rank (the paper tunes it, unpublished); the "
        "paper cites PaLM for MFU: attention scores counted"),
    Run("Llama 3 405B, 16,384 H100", Job(LLAMA3_405B, tp=8, pp=16, dp=128, global_batch=2048,
                                         seq=8192, schedule="interleaved", v=4), H100,
        "attention", {"tflops_per_gpu": 400, "mfu": 0.41},
        "arXiv 2407.21783 v3, Table 4, row 2 (DP 128, 16 sequences per DP group)",
        "as row 1"),
    Run("Llama 3 405B, 16,384 H100, CP 16", Job(LLAMA3_405B, tp=8, cp=16, pp=16, dp=8,
                                                global_batch=128, seq=131072,
                                                schedule="interleaved", v=4), H100,
        "attention", {"tflops_per_gpu": 380, "mfu": 0.38},
        "arXiv 2407.21783 v3, Table 4, row 3 (CP 16, 131,072 tokens, DP 8; an earlier "
        "version printed DP 4)",
        "as row 1; every attention score computed (a causal kernel skips half of them)"),
    Run("Megatron GPT 1T, 3,072 A100", Job(GPT_1T, tp=8, pp=64, dp=6, global_batch=3072,
                                          seq=2048, schedule="interleaved", v=2,
                                          recompute="full", prefetch=False), A100,
        "megatron", {"tflops_per_gpu": 163, "mfu": 0.52},
        "arXiv 2104.04473, Table 1 (1008.0B: 128 layers, hidden 25,600, TP 8, PP 64, batch "
        "3,072, 163 TFLOP/s, 52 % of 312)",
        "microbatch 1; v = 2 (two layers a rank); full recomputation (their equation 3 "
        "counts it)"),
    Run("Megatron GPT 145.6B, 1,536 A100", Job(GPT_145B, tp=8, pp=8, dp=24, global_batch=2304,
                                              seq=2048, schedule="interleaved", v=2,
                                              recompute="full", prefetch=False), A100,
        "megatron", {"tflops_per_gpu": 148, "mfu": 0.47},
        "arXiv 2104.04473, Table 1 (145.6B: 80 layers, hidden 12,288, TP 8, PP 8, batch 2,304, "
        "148 TFLOP/s, 47 %)",
        "microbatch 1; v = 2; full recomputation"),
    Run("MegaScale 175B, 12,288 A100", Job(MEGASCALE_175B, tp=8, pp=8, dp=192,
                                          global_batch=6144, seq=2048, schedule="interleaved",
                                          v=6), A100,
        "attention", {"step_s": 6.34, "mfu": 0.552},
        "arXiv 2402.15627, Tables 1 and 2 (TP 8, PP 8, 6 interleaved stages, batch 6,144: "
        "6.34 s an iteration, 1,984.0k tokens/s, 55.2 % MFU)",
        "microbatch 1; a standard block (MegaScale's is parallel, with sliding-window "
        "attention and LAMB); no recomputation"),
    Run("torchtitan Llama 3 8B, 8 H100", Job(LLAMA3_8B, tp=1, pp=1, dp=8, global_batch=16,
                                            seq=8192, micro_batch=2, reshard=True), H100_TITAN,
        "6N", {"tokens_per_s_per_gpu": 5762},
        "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (b5bcd76), Table 1: "
        "FSDP 8, local batch 2, selective AC, eager: 5,762 tokens/s per GPU",
        "sequence 8,192 (the configs' default); selective recomputation taken as none"),
    Run("torchtitan Llama 3 70B, 256 H100", Job(LLAMA3_70B, tp=8, pp=1, dp=32,
                                               global_batch=512, seq=8192, micro_batch=16,
                                               recompute="full", reshard=True), H100_TITAN,
        "6N", {"tokens_per_s_per_gpu": 829},
        "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (b5bcd76), Table 4: "
        "FSDP 32, TP 8, local batch 16, full AC: 829 tokens/s per GPU",
        "sequence 8,192; the local batch as one microbatch"),
)


def published_value(p: Prediction, kind: str, count: str) -> float:
    """The prediction in the unit a paper published (:data:`KINDS`)."""
    validate.one_of("kind", kind, KINDS)
    if kind == "tflops_per_gpu":
        return p.tflops_per_gpu(count)
    if kind == "mfu":
        return p.mfu(count)
    if kind == "step_s":
        return p.step_s
    return p.tokens_per_s_per_gpu()


def closing_efficiency(run: Run, kind: str | None = None) -> float:
    """The share of peak at which the model meets the run's published figure. The step is
    nearly all compute, which scales as 1 / efficiency, so the fixed point ``e <- e x
    (published / predicted)`` (per second; the inverse for seconds) settles in a few rounds; a
    value above 1 means that even the peak is too slow."""
    kind = kind or next(iter(run.published))
    want, e = run.published[kind], run.hw.efficiency
    for _ in range(12):
        got = published_value(predict(run.job, run.hw.but(efficiency=min(e, 1.0))), kind,
                              run.count)
        ratio = got / want if kind == "step_s" else want / got
        if abs(ratio - 1) < 1e-4 or (e >= 1.0 and ratio > 1):
            break
        e *= ratio
    return e


def leave_one_out(runs: tuple[Run, ...] = RUNS,
                  closing: list[float] | None = None) -> list[dict[str, Any]]:
    """Each run predicted with the median closing efficiency of the *other* runs (its own
    published figure unused): the error the model makes on a run it was not fitted to.
    ``closing``: the runs' :func:`closing_efficiency` if already computed."""
    closing = closing or [closing_efficiency(r) for r in runs]
    out = []
    for i, run in enumerate(runs):
        others = sorted(c for j, c in enumerate(closing) if j != i)
        e = statistics.median(others)
        kind = next(iter(run.published))
        got = published_value(predict(run.job, run.hw.but(efficiency=min(e, 1.0))), kind,
                              run.count)
        out.append({"label": run.label, "kind": kind, "efficiency": e, "predicted": got,
                    "published": run.published[kind], "error": got / run.published[kind] - 1})
    return out


def rows(runs: tuple[Run, ...] = RUNS) -> list[dict[str, Any]]:
    """Per run and published figure: predicted, published, error (predicted / published - 1),
    the terms (s) and the efficiency that would meet the run's first published figure."""
    out = []
    for run in runs:
        p = predict(run.job, run.hw)
        closing = closing_efficiency(run)
        for kind, value in run.published.items():
            got = published_value(p, kind, run.count)
            out.append({"label": run.label, "kind": kind, "predicted": got,
                        "published": value, "error": got / value - 1,
                        "terms": p.terms.as_dict(), "efficiency": run.hw.efficiency,
                        "closing": closing, "source": run.source,
                        "assumed": run.assumed, "count": run.count})
    return out


def table(rs: list[dict[str, Any]]) -> str:
    """The rows as text: run, figure, predicted, published, error, step's terms in shares,
    the efficiency that would meet the published figure."""
    head = (f"{'run':<36}{'figure':<17}{'predicted':>10}{'published':>10}{'error':>8}  "
            f"{'share: compute/tp/bubble/dp':<28}{'eff. needed':>11}")
    lines = [head, "-" * len(head)]
    for r in rs:
        t = r["terms"]
        shares = "/".join(f"{t[k] / t['total']:.2f}"
                          for k in ("compute", "tp", "bubble", "dp_exposed"))
        fmt = (lambda x: f"{100 * x:.1f} %") if r["kind"] == "mfu" else (
            lambda x: f"{x:,.2f}" if r["kind"] == "step_s" else f"{x:,.0f}")
        lines.append(f"{r['label']:<36}{KINDS[r['kind']]:<17}{fmt(r['predicted']):>10}"
                     f"{fmt(r['published']):>10}{100 * r['error']:>+7.0f}%  {shares:<28}"
                     f"{r['closing']:>11.2f}")
    return "\n".join(lines)
