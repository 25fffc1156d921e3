"""This machine's rates and links, measured on gloo ranks, and module 10's trainer predicted from
them on meshes they were not measured on (lecture 13, section 3).

:func:`calibration_worker` runs on ``w`` ranks at once (as many as the trainer's job will have,
so that they share the cores as the trainer's ranks do): the FLOP/s of each matmul shape the
trainer meets (the roofline's compute side, achieved, not peak), all-reduces over groups of
``g`` ranks at several sizes (fitted to alpha and beta, :func:`fit_link`), point-to-point sends,
and Adam's seconds per element. :func:`run_benchmark` gathers them for 1, 2 and 4 ranks in the
same launches that train module 10's trainer on the held-out meshes, before and after them (this
machine's speed drifts from minute to minute).
:func:`predict_trainer` turns a :class:`~course_utils.trainer3d.plan.Plan` into
:class:`~course_utils.step_time.terms.StepTerms` with them, plus one number measured on the
one-rank run (the calibration mesh): the time a block spends outside its matmuls
(LayerNorm, softmax, GELU, autograd's bookkeeping), per microbatch. :func:`compare` sets each
held-out mesh's prediction beside its measurement.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist

from course_utils.collectives.cost import RING_OPS, ring_factor, ring_steps, ring_time_s
from course_utils.runtime import validate
from course_utils.step_time.hardware import matmul_flops
from course_utils.step_time.terms import StepTerms, assemble

__all__ = ["CONFIG", "MESHES", "CALIBRATION_MESH", "BOUND", "CACHE", "SIZES", "trainer_plan",
           "block_matmuls", "calibration_worker", "fit_link", "benchmark_worker",
           "run_benchmark", "predict_trainer", "block_overhead", "compare", "miss_term",
           "format_comparison", "load", "save"]

CACHE = Path(__file__).resolve().parent.parent / "data" / "step_time_trainer.json"
"""The last run of ``benchmarks/step_time_trainer.py`` (what lecture 13 prints)."""

CALIBRATION_MESH = (1, 1, 1)
MESHES = ((2, 1, 1), (1, 2, 1), (1, 1, 2), (4, 1, 1), (1, 4, 1), (1, 1, 4), (2, 2, 1),
          (2, 1, 2), (1, 2, 2))
"""(dp, pp, tp) of the held-out meshes: the model never sees their measurements."""

BOUND = 0.35
"""The error the model states for module 10's trainer on this machine's held-out meshes
(|predicted / measured - 1|): ranks that share 2 cores make every rate depend on what the
others do, which a calibration can only average."""


def _config():
    from course_utils.models.tiny_lm import TinyLMConfig

    # wide enough that a microbatch's matmuls, not Python, take most of a step on one core
    return TinyLMConfig(vocab_size=256, seq_len=64, d_model=256, n_heads=8, n_layers=4,
                        d_ff=1024)


CONFIG = _config()


def trainer_plan(dp: int, pp: int, tp: int, steps: int = 6):
    """Module 10's plan on mesh (dp, pp, tp) with :data:`CONFIG`: 16 sequences, 4 microbatches."""
    from course_utils.trainer3d.plan import Plan

    return Plan(dp=dp, pp=pp, tp=tp, steps=steps, batch=16, m=4, cfg=CONFIG)


def block_matmuls(cfg, rows: int, tp: int) -> list[tuple[int, int, int, int]]:
    """(m, k, n, count) of one TinyLM block's forward matmuls on a TP rank, for a microbatch of
    ``rows`` sequences: qkv, the heads' scores and weighted values, the output projection, the
    MLP's two."""
    n, d, f, t = rows * cfg.seq_len, cfg.d_model, cfg.d_ff, cfg.seq_len
    heads = rows * cfg.n_heads // tp
    return [(n, d, 3 * d // tp, 1), (t, d // cfg.n_heads, t, heads),
            (t, t, d // cfg.n_heads, heads), (n, d // tp, d, 1), (n, d, f // tp, 1),
            (n, f // tp, d, 1)]


def _shapes(cfg, rows: int, tps: Sequence[int]) -> list[tuple[int, int, int]]:
    out = {(m, k, n) for tp in tps for m, k, n, _ in block_matmuls(cfg, rows, tp)}
    out |= {(rows * cfg.seq_len, cfg.d_model, cfg.vocab_size // tp) for tp in tps}   # the head
    return sorted(out)


def _median_time(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def calibration_worker(rank: int, world_size: int, shapes: Sequence[Sequence[int]],
                       sizes: Sequence[int], repeats: int = 15) -> dict[str, Any]:
    """One rank of a calibration job (every rank measures at once, sharing the cores):
    ``rates`` {shape: FLOP/s}, ``all_reduce`` {group size: [seconds per size]} over groups of
    consecutive ranks (all groups at once), ``p2p`` [seconds per size] between ranks 0 and 1
    (one way), ``adam_s_per_element``. Times are medians over ``repeats``, each all-reduce
    after a matmul of the trainer's size (so ranks arrive as they do in a step); the job's is the
    slowest rank's."""
    torch.manual_seed(rank)
    rates = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        # back to back for about 60 ms, so that every rank computes at once (as the trainer's
        # do) and shares the cores: one short matmul alone would find a core free
        loop = max(1, int(6e-2 * 5e10 / matmul_flops(m, k, n)))
        dist.barrier()
        rates[f"{m}x{k}x{n}"] = loop * matmul_flops(m, k, n) / _median_time(
            lambda: [a @ b for _ in range(loop)], 5)
    groups = {}
    for g in (2, 4):
        if g > world_size:
            continue
        mine = None
        for start in range(0, world_size - g + 1, g):
            group = dist.new_group(list(range(start, start + g)))
            if start <= rank < start + g:
                mine = group
        if mine is None:     # a rank left over when g does not divide the world
            continue
        times = []
        work = torch.randn(256, 256), torch.randn(256, 1024)
        for size in sizes:
            x = torch.zeros(max(1, size // 4))
            dist.barrier()
            samples = []
            for _ in range(repeats + 1):
                # a matmul first, as in the trainer: the peers reach the collective when their
                # compute ends, and on shared cores one may be waiting for a core
                work[0] @ work[1]
                t0 = time.perf_counter()
                dist.all_reduce(x, group=mine)
                samples.append(time.perf_counter() - t0)
            times.append(statistics.median(samples[1:]))
        groups[g] = times
    p2p = []
    if world_size > 1 and rank < 2:
        for size in sizes:
            x = torch.zeros(max(1, size // 4))
            peer = 1 - rank
            one = (lambda: (dist.send(x, peer), dist.recv(x, peer))) if rank == 0 else \
                (lambda: (dist.recv(x, peer), dist.send(x, peer)))
            p2p.append(_median_time(one, repeats) / 2)
    if world_size > 1:
        dist.barrier()
    p = torch.nn.Parameter(torch.randn(1 << 18))
    p.grad = torch.randn_like(p)
    adam = torch.optim.Adam([p], lr=1e-3, foreach=True)
    adam_s = _median_time(adam.step, repeats) / p.numel()
    return {"rates": rates, "all_reduce": groups, "p2p": p2p, "adam_s_per_element": adam_s}


def fit_link(sizes: Sequence[int], seconds: Sequence[float], group_size: int,
             op: str = "all_reduce") -> dict[str, float]:
    """Least-squares alpha (s a step) and beta (bytes/s) of ``T = steps x alpha + sent / beta``
    for a ring ``op`` over ``group_size`` ranks (:mod:`course_utils.collectives.cost`);
    ``group_size`` 1 with op ``"p2p"`` for a send (one step, every byte). Alpha and 1/beta are
    kept >= 0."""
    validate.check_ints("sizes", list(sizes), 0)
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError("sizes and seconds must be two lists of the same length >= 2")
    if op == "p2p":
        steps, factor = 1, 1.0
    else:
        validate.one_of("op", op, RING_OPS)
        steps, factor = ring_steps(op, group_size), ring_factor(op, group_size)
    x = torch.tensor([[steps, factor * s] for s in sizes], dtype=torch.float64)
    y = torch.tensor(list(seconds), dtype=torch.float64)
    alpha, inv_beta = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1).tolist()
    if inv_beta <= 0:     # bandwidth too high to see at these sizes: latency alone
        inv_beta = 1e-12
        alpha = float(y.mean()) / steps
    if alpha < 0:
        alpha = 0.0
        inv_beta = float((x[:, 1] * y).sum() / (x[:, 1] ** 2).sum())
    return {"alpha_s": alpha, "bytes_per_s": 1.0 / inv_beta}


def _combine(runs: list[list[dict[str, Any]]], sizes: Sequence[int]) -> dict[str, Any]:
    """One job size's calibration from one or more rounds of :func:`calibration_worker` (each a
    list by rank): per shape the slowest rank's rate, per size the slowest rank's time, both
    averaged over the rounds, then the links fitted."""
    def mean(xs):
        return sum(xs) / len(xs)

    first = runs[0]
    rates = {k: mean([min(r["rates"][k] for r in res) for res in runs]) for k in first[0]["rates"]}
    links = {}
    for g in first[0]["all_reduce"]:
        worst = [mean([max(r["all_reduce"][g][i] for r in res if g in r["all_reduce"])
                       for res in runs]) for i in range(len(sizes))]
        links[f"all_reduce_{g}"] = fit_link(sizes, worst, int(g))
    if first[0]["p2p"]:
        worst = [mean([max(r["p2p"][i] for r in res[:2]) for res in runs])
                 for i in range(len(sizes))]
        links["p2p"] = fit_link(sizes, worst, 1, "p2p")
    return {"rates": rates, "links": links, "adam_s_per_element":
            mean([max(r["adam_s_per_element"] for r in res) for res in runs])}


SIZES = (4, 4096, 65536, 262144, 1 << 20)
"""Bytes of the calibration's all-reduces and sends."""


def _all_shapes() -> list[tuple[int, int, int]]:
    shapes = []
    for rows in (4, 2, 1):            # a microbatch's sequences on DP 1, 2 and 4
        shapes += [s for s in _shapes(CONFIG, rows, (1, 2, 4)) if s not in shapes]
    return shapes


def benchmark_worker(rank: int, world_size: int, meshes: Sequence[tuple[int, int, int]],
                     steps: int, repeats: int) -> dict[str, Any]:
    """One rank of the benchmark's job of ``world_size`` ranks: calibrate, train module 10's
    trainer on each mesh of this size, calibrate again (the machine's speed drifts: the two
    calibrations bracket the runs they predict)."""
    from course_utils.trainer3d.train import train_worker

    before = calibration_worker(rank, world_size, _all_shapes(), SIZES, repeats)
    results = train_worker(rank, world_size, [trainer_plan(*m, steps=steps) for m in meshes])
    after = calibration_worker(rank, world_size, _all_shapes(), SIZES, repeats)
    return {"calibration": [before, after], "train": results}


def run_benchmark(meshes: Sequence[tuple[int, int, int]] = (CALIBRATION_MESH, *MESHES),
                  steps: int = 6, repeats: int = 15,
                  timeout_s: float = 300.0) -> tuple[dict[str, Any], dict[str, dict]]:
    """Calibration and measurement together, one launch per job size (1, 2 and 4 ranks): each
    launch calibrates, trains its meshes and calibrates again; returns the calibration (each
    size's two rounds averaged) and each mesh's measured step and parts (the slowest rank's
    medians, in seconds)."""
    from course_utils import launch
    from course_utils.trainer3d import check

    by_world: dict[int, list[tuple[int, int, int]]] = {}
    for mesh in meshes:
        by_world.setdefault(mesh[0] * mesh[1] * mesh[2], []).append(tuple(mesh))
    by_world.setdefault(1, [])
    cal: dict[str, Any] = {"sizes": list(SIZES), "by_world": {}}
    measured = {}
    for w, group in sorted(by_world.items()):
        res = launch.run(benchmark_worker, w, group, steps, repeats, timeout_s=timeout_s,
                         threads_per_rank=1, show_output=False)
        rounds = [[r["calibration"][i] for r in res] for i in range(2)]
        cal["by_world"][str(w)] = _combine(rounds, SIZES)
        for i, mesh in enumerate(group):
            worst = max(check.breakdown([r["train"][i] for r in res]), key=lambda b: b["step"])
            measured[_key(mesh)] = {k: v / 1e3 for k, v in worst.items()}
    return cal, measured


def _rate(c: dict[str, Any], m: int, k: int, n: int) -> float:
    key = f"{m}x{k}x{n}"
    if key not in c["rates"]:
        raise ValueError(f"the calibration has no matmul of shape {key}: run_benchmark() "
                         f"measures the shapes of trainer_plan's meshes")
    return c["rates"][key]


def _contention(cal: dict[str, Any], w: int) -> float:
    """How much slower a rank computes when ``w`` ranks compute at once on the shared cores:
    the median over the shapes of one rank's rate over that of each of ``w`` ranks."""
    one, many = cal["by_world"]["1"]["rates"], cal["by_world"][str(w)]["rates"]
    return statistics.median(one[k] / many[k] for k in one)


def _ring_s(link: dict[str, float], op: str, nbytes: float, g: int) -> float:
    """:func:`~course_utils.collectives.cost.ring_time_s` on a fitted link."""
    return ring_time_s(nbytes, g, link["alpha_s"], link["bytes_per_s"], op)


def _matmul_s(c: dict[str, Any], cfg, rows: int, tp: int, blocks: int, last: bool) -> float:
    """A microbatch's forward matmuls through a stage of ``blocks`` blocks (and the head)."""
    t = blocks * sum(count * matmul_flops(m, k, n) / _rate(c, m, k, n)
                     for m, k, n, count in block_matmuls(cfg, rows, tp))
    if last:
        head = (rows * cfg.seq_len, cfg.d_model, cfg.vocab_size // tp)
        t += matmul_flops(*head) / _rate(c, *head)
    return t


def predict_trainer(plan, cal: dict[str, Any], block_overhead_s: float = 0.0) -> StepTerms:
    """The step of module 10's trainer on ``plan`` from the calibration ``cal`` (this job size's
    rates and links) and the one-rank run's ``block_overhead_s`` (a block's time outside its
    matmuls, forward and backward of one microbatch, on one rank alone). Compute runs at one
    rank's rates slowed by the contention :func:`run_benchmark` measured with every rank busy, in
    the share of the time the ranks compute (not while they wait in a collective or in the
    bubble). The slowest stage sets the pipeline's pace
    (the others are taken equal to it); backward is twice forward's matmuls; the TP
    collectives are :func:`course_utils.trainer3d.comms.predicted_tp`'s, each costed with the
    ring model at the fitted alpha and beta; DP reduce-scatters hide behind the last
    microbatch's backward, ZeRO-1's all-gather and the clipping norm's all-reduce wait."""
    from course_utils.trainer3d.comms import predicted_tp
    from course_utils.trainer3d.stage_model import stage_blocks, stage_param_count

    cfg, w = plan.cfg, plan.world_size
    c = cal["by_world"].get(str(w))
    if c is None:
        raise ValueError(f"the calibration has no job of {w} ranks; it has "
                         f"{sorted(cal['by_world'])}")
    validate.check_real("block_overhead_s", block_overhead_s, 0, strict=False)
    rows, m, tp, pp, dp = plan.microbatch, plan.m, plan.tp, plan.pp, plan.dp
    one = cal["by_world"]["1"]
    stages = []
    for s in range(pp):
        blocks = len(stage_blocks(cfg, s, pp))
        mm = _matmul_s(one, cfg, rows, tp, blocks, s == pp - 1)
        tp_calls = predicted_tp(cfg, s, pp, tp, m, rows, plan.vocab_parallel, plan.sp)
        stages.append((3 * mm + blocks * block_overhead_s, tp_calls, s))
    alone, tp_calls, s_slow = max(stages, key=lambda x: x[0])    # fwd + bwd, one rank alone
    tp_s = 0.0
    if tp > 1:
        link = c["links"][f"all_reduce_{tp}"]
        calls = sum(tp_calls[k] for k in ("all_reduce", "all_gather", "reduce_scatter"))
        for k in ("all_reduce", "all_gather", "reduce_scatter"):
            if tp_calls[k]:
                tp_s += tp_calls[k] * _ring_s(link, k, tp_calls["bytes"] / calls, tp)
    # Ranks that share cores slow each other only while they compute: a rank waiting in a
    # collective or in the pipeline's bubble leaves its core to the others. The contention
    # measured with every rank busy is applied in the share of the step the ranks compute: m
    # of every m + p - 1 slots of 1F1B, and compute / (compute + TP collectives) of each slot
    # (a fixed point: compute's share depends on its slowed time).
    contention, fill = _contention(cal, w), m / (m + pp - 1)
    slow = contention
    for _ in range(20):
        compute = m * alone * slow
        slow = 1 + (contention - 1) * fill * compute / (compute + tp_s)
    forward, backward = alone * slow / 3, 2 * alone * slow / 3
    p2p = 0.0
    if pp > 1:
        seq = cfg.seq_len // (tp if plan.sp else 1)
        link = c["links"]["p2p"]
        p2p = link["alpha_s"] + rows * seq * cfg.d_model * 4 / link["bytes_per_s"]
    params = stage_param_count(cfg, s_slow, pp, tp, plan.vocab_parallel)
    dp_pairs = []
    if dp > 1:
        link = c["links"][f"all_reduce_{dp}"]
        dp_pairs += [(_ring_s(link, "reduce_scatter", 4 * params, dp), backward),
                     (_ring_s(link, "all_gather", 4 * params, dp), 0.0)]
    if w > 1 and plan.clip is not None:
        dp_pairs.append((_ring_s(c["links"][f"all_reduce_{w}"], "all_reduce", 4, w), 0.0))
    optimizer = params / dp * one["adam_s_per_element"] * slow
    return assemble(pp=pp, m=m, forward_s=forward, backward_s=backward,
                    tp_forward_s=tp_s / m / 2, tp_backward_s=tp_s / m / 2, p2p_s=p2p,
                    dp=tuple(dp_pairs), optimizer_s=optimizer)


def _key(mesh: Sequence[int]) -> str:
    return "dp{} pp{} tp{}".format(*mesh)


def block_overhead(cal: dict[str, Any], measured_one: dict[str, float]) -> float:
    """The one-rank run's compute beyond its predicted matmuls and optimizer, per block and
    microbatch (forward and backward): the model's one number fitted to the trainer."""
    plan = trainer_plan(*CALIBRATION_MESH)
    bare = predict_trainer(plan, cal, 0.0)
    rest = measured_one["compute"] - bare.compute - bare.optimizer
    return max(0.0, rest / (plan.m * plan.cfg.n_layers))


_PARTS = {"compute": ("compute", "optimizer"), "tp": ("tp",), "pp_wait": ("bubble",),
          "dp": ("dp_exposed",)}


def miss_term(pred: StepTerms, measured: dict[str, float]) -> tuple[str, float]:
    """The measured part whose prediction is furthest off, and by how much (s; + = predicted
    too long). Parts: compute (with the optimizer), tp, pp_wait (the bubble), dp."""
    d = pred.as_dict()
    gaps = {part: sum(d[t] for t in terms) - measured[part] for part, terms in _PARTS.items()}
    part = max(gaps, key=lambda p: abs(gaps[p]))
    return part, gaps[part]


def compare(cal: dict[str, Any], measured: dict[str, dict[str, float]],
            meshes: Sequence[tuple[int, int, int]] = MESHES) -> list[dict[str, Any]]:
    """Per held-out mesh: predicted terms and step, measured step and parts, error, and the
    part that explains most of the miss."""
    overhead = block_overhead(cal, measured[_key(CALIBRATION_MESH)])
    rows = []
    for mesh in meshes:
        pred = predict_trainer(trainer_plan(*mesh), cal, overhead)
        got = measured[_key(mesh)]
        part, gap = miss_term(pred, got)
        rows.append({"mesh": _key(mesh), "predicted": pred.as_dict(), "measured": got,
                     "error": pred.total / got["step"] - 1, "miss": part, "miss_s": gap})
    return rows


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """Predicted vs measured step (ms) per mesh, the error, and the part furthest off."""
    lines = [f"{'mesh':<15}{'predicted':>10}{'measured':>10}{'error':>8}   "
             f"{'pred. compute/tp/bubble/dp ms':<31}{'part furthest off':<22}"]
    for r in rows:
        p = r["predicted"]
        parts = "/".join(f"{1e3 * (p[a] + (p['optimizer'] if a == 'compute' else 0)):.0f}"
                         for a in ("compute", "tp", "bubble", "dp_exposed"))
        lines.append(f"{r['mesh']:<15}{1e3 * p['total']:>10.1f}{1e3 * r['measured']['step']:>10.1f}"
                     f"{100 * r['error']:>+7.0f}%   {parts:<31}{r['miss']} "
                     f"({1e3 * r['miss_s']:+.0f} ms)")
    return "\n".join(lines)


def save(data: dict[str, Any], path: Path = CACHE) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def load(path: Path = CACHE) -> dict[str, Any]:
    """The cached calibration and measurements (``benchmarks/step_time_trainer.py`` writes
    them): ``{"calibration", "measured", "machine"}``."""
    return json.loads(Path(path).read_text(encoding="utf-8"))
