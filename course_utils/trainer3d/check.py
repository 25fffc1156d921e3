"""Checking module 10's 3-D trainer: the one-process run it must equal, and its predictions.

:func:`reference_train` trains ``tiny_lm.build(cfg, seed)`` on one process with
``torch.optim.Adam`` (and ``torch.nn.utils.clip_grad_norm_``) on the same global batches as
:func:`course_utils.trainer3d.train.run`; :func:`check_against_reference` compares each rank's
losses, first-step gradients, gradient norms and final weights with the slices
:func:`course_utils.trainer3d.stage_model.shard_state` cuts from it (within :data:`TOLERANCES`);
:func:`predicted_state_bytes` is a rank's persistent memory from the sizes alone;
:func:`flops_per_token` the model's FLOPs, from which :func:`throughput` gives tokens per second
and the model FLOPs utilisation (MFU). The tables the lecture prints are made here too.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from course_utils.mesh.grid import Mesh
from course_utils.trainer3d.stage_model import Stage, shard_state
from course_utils.models.tiny_lm import MarkovCorpus, TinyLMConfig, build
from course_utils.trainer3d.plan import Plan
from course_utils.trainer3d.comms import predicted_tp
from course_utils.zero.zero1 import FlatLayout

__all__ = ["reference_train", "order_drift", "noise_steps", "replica_losses", "TOLERANCES",
           "BF16_TOLERANCES", "check_against_reference", "predicted_state_bytes", "groups_table",
           "memory_table", "bucket_bytes", "comms_table", "tp_partial_numel",
           "predicted_tp_calls", "PARTS", "breakdown", "flops_per_token", "matmul_weights",
           "peak_flops", "peak_units", "throughput", "MESH_FOR_WORLD"]


@contextlib.contextmanager
def _one_thread():
    """torch on one thread while the block runs: a model this small gains nothing from more, and
    on a busy machine a second OpenMP thread waits for a core at every operation."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reference_train(plan: Plan, microbatches: int = 1, trace: Sequence[str] = ()
                    ) -> dict[str, Any]:
    """One process, whole model, whole global batch, ``torch.optim.Adam``: the same run.

    With ``plan.dtype == "bf16"`` the model computes in bf16 and Adam updates an fp32 copy
    (the trainer's policy, on one process). ``grads``: the first step's, after clipping.
    ``microbatches``: backward on that many slices of the batch, accumulated (the same run,
    summed in another order). ``trace``: names of parameters whose every clipped gradient and
    weight (the initial, then each step's) ``out["trace"][name]`` keeps."""
    with _one_thread():
        return _reference_train(plan, microbatches, trace)


def _reference_train(plan: Plan, microbatches: int, trace: Sequence[str]) -> dict[str, Any]:
    model = build(plan.cfg, plan.seed)
    bf16 = plan.dtype == "bf16"
    if bf16:
        model.to(torch.bfloat16)
    weights = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()] \
        if bf16 else list(model.parameters())
    opt = torch.optim.Adam(weights, lr=plan.lr, eps=plan.eps)
    corpus = MarkovCorpus(plan.cfg.vocab_size, seed=plan.seed)
    out: dict[str, Any] = {"losses": [], "grad_norms": []}
    names = [n for n, _ in model.named_parameters()]
    traced = {n: w for n, w in zip(names, weights) if n in trace}
    out["trace"] = {n: {"grads": [], "weights": [w.detach().clone()]} for n, w in traced.items()}
    for step in range(plan.steps):
        x, y = corpus.batch(step, plan.batch, plan.cfg.seq_len)
        loss = 0.0
        for xs, ys in zip(x.chunk(microbatches), y.chunk(microbatches)):
            logits = model(xs)                                                 # (b, T, V)
            part = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   ys.reshape(-1)) / microbatches
            part.backward()
            loss += part.item()
        if bf16:
            for w, p in zip(weights, model.parameters()):
                w.grad = p.grad.float()
        norm = None
        if plan.clip is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(weights, plan.clip))
        if step == 0:
            out["grads"] = {n: w.grad.detach().clone() for n, w in zip(names, weights)}
        opt.step()
        for n, w in traced.items():   # the clipped gradient the step used, the weight after it
            out["trace"][n]["grads"].append(w.grad.detach().clone())
            out["trace"][n]["weights"].append(w.detach().clone())
        if bf16:
            with torch.no_grad():
                for w, p in zip(weights, model.parameters()):
                    p.copy_(w)
        opt.zero_grad()
        model.zero_grad()
        out["losses"].append(loss)
        out["grad_norms"].append(norm)
    out["weights"] = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    return out


def order_drift(plan: Plan, microbatches: int = 4) -> dict[str, Any]:
    """How far apart two correct one-process runs of ``plan`` end that differ only in the order
    of a sum (the whole batch, against ``microbatches`` slices accumulated): the largest weight
    difference and where it is, and that weight's first-step gradient."""
    a, b = reference_train(plan), reference_train(plan, microbatches)
    worst = max(((float((a["weights"][n] - b["weights"][n]).abs().max()), n)
                 for n in a["weights"]), key=lambda t: t[0])
    diff, name = worst
    at = int((a["weights"][name] - b["weights"][name]).abs().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), a["weights"][name].shape))
    return {"weights": diff, "name": name, "index": index,
            "grad": float(a["grads"][name].flatten()[at])}


def noise_steps(plan: Plan) -> dict[str, torch.Tensor]:
    """Adam's steps on weights whose gradient is only rounding noise: each block's key bias (the
    middle third of ``qkv.bias``; its true gradient is 0, as softmax ignores a shift shared by a
    row of scores), as one process trains ``plan``: ``grads`` |gradient| and ``moves`` each
    step's |change of the weight| / lr, both (steps, weights)."""
    d, names = plan.cfg.d_model, [f"blocks.{i}.qkv.bias" for i in range(plan.cfg.n_layers)]
    trace = reference_train(plan, trace=names)["trace"]
    grads, weights = (torch.cat([torch.stack(trace[n][k])[:, d:2 * d] for n in names], 1)
                      for k in ("grads", "weights"))
    return {"grads": grads.abs(), "moves": weights.diff(dim=0).abs() / plan.lr}


def replica_losses(plan: Plan, results: Sequence[dict[str, Any]]) -> list[float]:
    """The global batch's loss per step: the DP replicas' losses (last stage) averaged."""
    last = [r["losses"] for r in results if r["coords"][1] == plan.pp - 1 and r["coords"][2] == 0]
    return [sum(step) / len(last) for step in zip(*last)]


TOLERANCES = {"losses": (1e-5, 1e-5), "grads": (1e-4, 1e-6), "weights": (1e-4, 1e-4)}
"""(rtol, atol) per comparison, fp32. They hold because Adam's eps (``Plan.eps``, 1e-5) is far
above the gradients' rounding noise. Adam moves a weight by about lr g / (|g| + eps) per step,
so where a gradient is near eps or below, the noise of a few 1e-9 that another summation order
(microbatches, replicas, TP's partial sums) puts on it decides the update. With eps = 1e-8
(torch's default), seed 6 of the lecture's plan has a first-step gradient of 1.4e-9 on
head.weight[30, 55], and two correct one-process runs that only sum in another order end 2.6e-4
apart there (:func:`order_drift`), beyond the 1e-4 tolerance; with eps = 1e-5 a step moves at
most lr / eps = 300 times a gradient's noise, and the same runs end 3e-7 apart."""

BF16_TOLERANCES = {"losses": (2e-2, 2e-2), "grads": (5e-2, 5e-3), "weights": (5e-2, 5e-2)}
"""(rtol, atol) of a bf16 run against the one-process bf16 reference: bf16 keeps 8 bits of
mantissa (a relative step of 2^-8 = 0.4 %), and TP's partial sums, the microbatches and the
replicas round at other places than one process does."""


def _close(got: Any, want: torch.Tensor, tol: tuple[float, float], what: str) -> float:
    got = torch.as_tensor(got).to(want.dtype)
    torch.testing.assert_close(got, want, rtol=tol[0], atol=tol[1], msg=lambda s: f"{what}: {s}")
    return float((got - want).abs().max()) if got.numel() else 0.0


def check_against_reference(plan: Plan, results: Sequence[dict[str, Any]],
                            ref: dict[str, Any] | None = None) -> dict[str, float]:
    """Assert that every last-stage rank's loss of every step (each TP rank of each replica:
    the replicas' mean equals the reference), the first step's gradient norm on every rank, and
    every rank's first-step gradients and final weights equal the reference's slices, within
    :data:`TOLERANCES` (:data:`BF16_TOLERANCES` for bf16); the other stages return no loss.
    Returns the largest absolute differences found."""
    ref = ref or reference_train(plan)
    tols = BF16_TOLERANCES if plan.dtype == "bf16" else TOLERANCES
    worst = {"loss": 0.0, "grads": 0.0, "weights": 0.0, "norm": 0.0}
    want_losses = torch.tensor(ref["losses"], dtype=torch.float64)
    by_replica: dict[int, list[list[float]]] = {}
    for r in results:
        dp_rank, pp_rank, tp_rank = r["coords"]
        if pp_rank != plan.pp - 1:
            assert all(v is None for v in r["losses"]), f"rank {r['coords']} returned a loss"
            continue
        by_replica.setdefault(dp_rank, []).append(r["losses"])
    for dp_rank, tp_losses in by_replica.items():   # the TP ranks of a replica agree exactly
        assert all(v == tp_losses[0] for v in tp_losses), f"replica {dp_rank}: TP ranks differ"
    mean = torch.tensor([sum(v) / len(v) for v in zip(*(t[0] for t in by_replica.values()))],
                        dtype=torch.float64)
    worst["loss"] = _close(mean, want_losses, tols["losses"], "losses")
    for r in results:
        where = f"rank (dp, pp, tp) = {r['coords']}"
        if plan.clip is not None:
            worst["norm"] = max(worst["norm"], _close(
                torch.tensor(r["grad_norms"][0]), torch.tensor(ref["grad_norms"][0]),
                tols["grads"], f"{where}, gradient norm"))
        _, pp_rank, tp_rank = r["coords"]
        for key in ("grads", "weights"):
            want = shard_state(ref[key], plan.cfg, pp_rank, plan.pp, tp_rank, plan.tp,
                               plan.vocab_parallel)
            if sorted(r[key]) != sorted(want):
                raise AssertionError(f"{where}: {key} names {sorted(r[key])} differ from "
                                     f"{sorted(want)}")
            for name, value in want.items():
                worst[key] = max(worst[key], _close(r[key][name], value.float(), tols[key],
                                                    f"{where}, {key} {name}"))
    return worst


def _meta_stage(plan: Plan, pp_rank: int) -> Stage:
    """A stage-``pp_rank`` rank's Stage on the meta device: its shapes, and no storage."""
    with torch.device("meta"):
        return Stage(plan.cfg, pp_rank, plan.pp, plan.tp, vocab_parallel=plan.vocab_parallel,
                     sp=plan.sp)


def _stage_numels(plan: Plan, pp_rank: int) -> list[int]:
    """Sizes of one rank's parameters in backward order, from the sizes alone."""
    return [p.numel() for p in _meta_stage(plan, pp_rank).parameters()][::-1]


def tp_partial_numel(plan: Plan, pp_rank: int, dp_rank: int) -> int:
    """Elements of the sequence-split parameters (``Stage.tp_partial``) in the DP slices of rank
    (dp_rank, pp_rank, any tp_rank): what its gradient buffer all-reduces over TP per step."""
    stage = _meta_stage(plan, pp_rank)
    params = list(stage.parameters())[::-1]
    partial = {id(p) for p in stage.tp_partial()}
    layout = FlatLayout([p.numel() for p in params], plan.dp, plan.bucket_numel)
    return sum(n for i, _, n in layout.pieces(dp_rank) if id(params[i]) in partial)


def predicted_tp_calls(plan: Plan, pp_rank: int, dp_rank: int) -> dict[str, int]:
    """:func:`course_utils.trainer3d.comms.predicted_tp` for one rank of ``plan``."""
    return predicted_tp(plan.cfg, pp_rank, plan.pp, plan.tp, plan.m, plan.microbatch,
                        plan.vocab_parallel, plan.sp, 2 if plan.dtype == "bf16" else 4,
                        tp_partial_numel(plan, pp_rank, dp_rank) if plan.tp > 1 else 0)


def predicted_state_bytes(plan: Plan, pp_rank: int, dp_rank: int = 0) -> dict[str, int]:
    """Persistent bytes of rank (dp_rank, pp_rank, any tp_rank), from the sizes alone.

    The buffer holds the stage's n elements plus each bucket's padding to a multiple of D:
    weights (4 or 2 bytes each: fp32 or bf16) and fp32 gradients for all of it; this rank's
    slices (n_r elements, about n / D) get Adam's two fp32 moments, an fp32 master copy when the
    weights are bf16, and one 4-byte ``step`` counter per piece (:meth:`FlatLayout.pieces`).
    """
    layout = FlatLayout(_stage_numels(plan, pp_rank), plan.dp, plan.bucket_numel)
    owned, pieces = layout.owned(dp_rank), len(layout.pieces(dp_rank))
    bf16 = plan.dtype == "bf16"
    out = {"weights": (2 if bf16 else 4) * layout.total, "grads": 4 * layout.total,
           "master": 4 * owned if bf16 else 0, "optimizer": 8 * owned, "other": 4 * pieces}
    out["total"] = sum(out.values())
    return out


def groups_table(mesh: Mesh) -> str:
    """Each rank's coordinates, DP and TP groups and PP neighbours, read off the grid alone."""
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a course_utils.mesh.grid.Mesh; got {type(mesh).__name__}")
    rows = ["rank  (dp, pp, tp)  dp_group  tp_group  pp_prev_rank  pp_next_rank"]
    for rank in range(mesh.world_size):
        c = mesh.coords(rank)

        def neighbour(step: int) -> str:
            p = c["pp"] + step
            return str(mesh.rank_of(dp=c["dp"], pp=p, tp=c["tp"])) if 0 <= p < mesh.size("pp") \
                else "-"
        rows.append(f"{rank:>4}  {(c['dp'], c['pp'], c['tp'])!s:>12}  "
                    f"{mesh.group(rank, 'dp')!s:>8}  {mesh.group(rank, 'tp')!s:>8}  "
                    f"{neighbour(-1):>12}  {neighbour(+1):>12}")
    return "\n".join(rows)


def memory_table(plan: Plan, results: Sequence[dict[str, Any]]) -> str:
    """Per rank: persistent bytes by kind as measured, and the predicted and measured totals."""
    rows = ["rank  (dp, pp, tp)   weights    grads   master  moments  predicted   measured"]
    for rank, r in enumerate(results):
        dp_rank, pp_rank, _ = r["coords"]
        want, got = predicted_state_bytes(plan, pp_rank, dp_rank), r["state_bytes"]
        rows.append(f"{rank:>4}  {r['coords']!s:>12}  {got['weights']:>8,} {got['grads']:>8,} "
                    f"{got['master']:>8,} {got['optimizer']:>8,}  {want['total']:>9,}  "
                    f"{got['total']:>9,}")
    return "\n".join(rows)


def bucket_bytes(plan: Plan, pp_rank: int) -> list[int]:
    """fp32 gradient bytes of each DP bucket of a stage-``pp_rank`` rank, padding included (a
    bucket closes once it holds ``plan.bucket_mb`` MiB, so all but the last exceed it)."""
    layout = FlatLayout(_stage_numels(plan, pp_rank), plan.dp, plan.bucket_numel)
    return [4 * (hi - lo) for lo, hi in layout.buckets]


def comms_table(plan: Plan, results: Sequence[dict[str, Any]]) -> str:
    """Per rank, the first step's calls as counted on the rank, and whether the plan's prediction
    (:mod:`course_utils.trainer3d.comms`) says the same: TP collectives by kind and their bytes, the
    pipeline's sends, receives and ``batch_isend_irecv`` calls, DP's calls."""
    rows = ["rank  (dp, pp, tp)   TP: gather scatter reduce     bytes  predicted   send recv "
            "batches   DP: scatter gather"]
    for rank, r in enumerate(results):
        dp_rank, pp_rank, _ = r["coords"]
        want, got = predicted_tp_calls(plan, pp_rank, dp_rank), r["comms"]["tp"]
        calls = r["comms"]["calls"]
        same = all(got.get(k, 0) == want[k] for k in want)
        rs = calls.get("all_to_all_single_dp", 0) + calls.get("reduce_scatter_single_dp", 0)
        rows.append(f"{rank:>4}  {r['coords']!s:>12}  {got.get('all_gather', 0):>10} "
                    f"{got.get('reduce_scatter', 0):>7} {got.get('all_reduce', 0):>6} "
                    f"{got.get('bytes', 0):>9,}  {'yes' if same else 'NO':>9}  {calls['send']:>5} "
                    f"{calls['recv']:>4} {calls['p2p_batches']:>7}  {rs:>12} "
                    f"{calls.get('all_gather_single_dp', 0):>6}")
    return "\n".join(rows)


PARTS = ("compute", "tp", "pp_wait", "dp")
"""The step's parts: compute (the rest), TP collectives, waiting on the pipeline (receives,
and the sends still in flight at the end: the bubble included), DP (waiting for the last
buckets, the norm's all-reduce and ZeRO-1's all-gathers)."""


def breakdown(results: Sequence[dict[str, Any]], skip: int = 1) -> list[dict[str, float]]:
    """Per rank, the median over steps (the first ``skip`` left out) of each part, in ms."""
    out = []
    for r in results:
        steps = r["times"][skip:] or r["times"]
        out.append({k: 1e3 * statistics.median(t[k] for t in steps) for k in ("step",) + PARTS})
    return out


def matmul_weights(cfg: TinyLMConfig) -> int:
    """Elements of the weights that multiply activations (every Linear's weight; not the
    embeddings, biases or LayerNorms): the N of 6N."""
    d = cfg.d_model
    return cfg.n_layers * (3 * d * d + d * d + 2 * d * cfg.d_ff) + d * cfg.vocab_size


def flops_per_token(cfg: TinyLMConfig) -> dict[str, int]:
    """Training FLOPs per token: ``6N + 12 L T d``.

    A matmul of an (a, b) by a (b, c) matrix is 2abc FLOPs, so forward costs 2N per token for
    the N weights of :func:`matmul_weights`, and backward twice that (the input's gradient and
    the weight's): 6N. Attention adds, per layer and token, q.k against T keys and the weighted
    sum of T values: 2 x 2Td forward, x 3 with backward: 12 L T d (every score computed,
    PaLM's count, Chowdhery et al. 2022, appendix B). LayerNorm, softmax and GELU are left out.
    """
    n = matmul_weights(cfg)
    attention = 12 * cfg.n_layers * cfg.seq_len * cfg.d_model
    return {"matmuls": 6 * n, "attention": attention, "total": 6 * n + attention}


def peak_flops(dtype: torch.dtype = torch.float32, n: int = 512, repeats: int = 5) -> float:
    """FLOP/s one thread of this machine's CPU reaches on an (n, n) matmul (the best of
    ``repeats``, torch on one thread): one core's peak, where no datasheet figure applies (on a
    GPU use the vendor's dense figure, e.g. 989.5e12 bf16 for an H100 SXM, as picotron does)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    best = math.inf
    with _one_thread():
        a @ b
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def peak_units(world_size: int, device: str = "cpu") -> int:
    """Devices of peak the run can use: a GPU per rank; on a CPU a core (:func:`peak_flops`) per
    rank of one thread (as :func:`train3d.run` starts them), up to the cores this process may run
    on (``os.sched_getaffinity``, else ``os.cpu_count()``): 8 ranks on 2 cores use 2, not 8."""
    if device != "cpu":
        return world_size
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(world_size, cores or 1)


def throughput(plan: Plan, results: Sequence[dict[str, Any]], peak: float,
               skip: int = 1) -> dict[str, float]:
    """Tokens per second of the run (the global batch over the median step of the slowest rank)
    and MFU: the FLOPs those tokens need per second, over what the hardware the run used could
    do: ``peak`` FLOP/s per unit times :func:`peak_units` (the ranks' device, from the results)."""
    step_s = max(b["step"] for b in breakdown(results, skip)) / 1e3
    tps = plan.batch * plan.cfg.seq_len / step_s
    units = peak_units(plan.world_size, results[0].get("device", "cpu"))
    return {"step_s": step_s, "tokens_per_s": tps, "units": units,
            "mfu": tps * flops_per_token(plan.cfg)["total"] / (units * peak)}


MESH_FOR_WORLD = {8: (2, 2, 2), 4: (1, 2, 2), 2: (1, 2, 1)}
"""(dp, pp, tp) that :func:`course_utils.trainer3d.train.torchrun_worker` uses for each job
size."""
