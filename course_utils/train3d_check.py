"""Checking module 10's 3-D trainer: the one-process run it must equal, and its predictions.

:func:`reference_train` trains ``tiny_lm.build(cfg, seed)`` on one process with
``torch.optim.Adam`` on the same global batches as :func:`course_utils.train3d.run`;
:func:`check_against_reference` compares each rank's losses, first-step gradients and final
weights with the slices :func:`course_utils.stage_model.shard_state` cuts from it (within
:data:`TOLERANCES`); :func:`predicted_state_bytes` is a rank's persistent memory from the sizes
alone (module 1's bytes per parameter, module 3's ZeRO-1 shard). The tables the lecture prints
are made here too.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from course_utils import memory
from course_utils.mesh import Mesh
from course_utils.stage_model import shard_state, stage_blocks, stage_param_count
from course_utils.tiny_lm import MarkovCorpus, build
from course_utils.train3d import Plan, train_worker
from course_utils.zero import shard_numel

__all__ = ["reference_train", "replica_losses", "TOLERANCES", "check_against_reference",
           "compared_weight", "predicted_state_bytes", "predicted_comms", "groups_table",
           "memory_table", "PARTS", "breakdown", "MESH_FOR_WORLD", "torchrun_worker"]


def reference_train(plan: Plan) -> dict[str, Any]:
    """One process, whole model, whole global batch, ``torch.optim.Adam``: the same run."""
    model = build(plan.cfg, plan.seed)
    opt = torch.optim.Adam(model.parameters(), lr=plan.lr, eps=plan.eps)
    corpus = MarkovCorpus(plan.cfg.vocab_size, seed=plan.seed)
    losses, grads = [], {}
    for step in range(plan.steps):
        x, y = corpus.batch(step, plan.batch, plan.cfg.seq_len)
        logits = model(x)                                                      # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads,
            "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def replica_losses(plan: Plan, results: Sequence[dict[str, Any]]) -> list[float]:
    """The global batch's loss per step: the DP replicas' losses (last stage) averaged."""
    last = [r["losses"] for r in results if r["coords"][1] == plan.pp - 1 and r["coords"][2] == 0]
    return [sum(step) / len(last) for step in zip(*last)]


TOLERANCES = {"losses": (1e-5, 1e-5), "grads": (1e-4, 1e-6), "weights": (1e-4, 1e-4)}
"""(rtol, atol) per comparison. Weights get more room: Adam divides each gradient by its own
root mean square, so a rounding difference in a small gradient becomes a visible one in the
step; 1e-4 is 3 % of one step of ``lr = 3e-3``, and the run stays inside it for 20 steps."""


def check_against_reference(plan: Plan, results: Sequence[dict[str, Any]],
                            ref: dict[str, Any] | None = None) -> dict[str, float]:
    """Assert every rank's losses, first-step gradients and final weights equal the reference's
    slices (``torch.testing.assert_close`` within :data:`TOLERANCES`); returns the largest
    absolute differences found."""
    ref = ref or reference_train(plan)
    worst = {"loss": 0.0, "grads": 0.0, "weights": 0.0}
    losses = replica_losses(plan, results)
    rtol, atol = TOLERANCES["losses"]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref["losses"]),
                               rtol=rtol, atol=atol, msg=lambda s: f"losses: {s}")
    worst["loss"] = max(abs(a - b) for a, b in zip(losses, ref["losses"]))
    for r in results:
        dp_rank, pp_rank, tp_rank = r["coords"]
        for key in ("grads", "weights"):
            rtol, atol = TOLERANCES[key]
            want = shard_state(ref[key], plan.cfg, pp_rank, plan.pp, tp_rank, plan.tp)
            got = r[key]
            if sorted(got) != sorted(want):
                raise AssertionError(f"rank {r['coords']}: {key} names {sorted(got)} differ "
                                     f"from {sorted(want)}")
            for name, value in want.items():
                mine = torch.as_tensor(got[name])
                if key == "weights":
                    mine, value = compared_weight(name, mine), compared_weight(name, value)
                torch.testing.assert_close(
                    mine, value, rtol=rtol, atol=atol,
                    msg=lambda s, n=name: f"rank (dp, pp, tp) = {r['coords']}, {key} {n}: {s}")
                worst[key] = max(worst[key], float((mine - value).abs().max()))
    return worst


def compared_weight(name: str, value: torch.Tensor) -> torch.Tensor:
    """The part of weight ``name`` that is compared with the reference: all of it, except a
    q/k/v bias (a rank's slice or the whole, in thirds q | k | v), whose k third is left out.

    The key bias's gradient is zero in exact arithmetic: b_k adds q . b_k to every score of a
    query, and softmax ignores a shift shared by a row. What backward computes is rounding
    noise (about 1e-10 here), different in every summation order, and Adam divides it by its own
    square root: the "update" is up to ``lr`` per step in a direction set by the noise. So the
    key bias's weights are not compared (its gradients are: they are all tiny on both sides).
    """
    if not name.endswith("qkv.bias"):
        return value
    q, _k, v = value.chunk(3)
    return torch.cat([q, v])


def predicted_state_bytes(plan: Plan, pp_rank: int) -> dict[str, int]:
    """Persistent fp32 bytes of one rank of stage ``pp_rank``: weights, grads, Adam moments.

    n = :func:`~course_utils.stage_model.stage_param_count`; moments 8 ceil(n / dp) (ZeRO-1,
    module 3's ``zero_state_bytes(n, dp, 1, "fp32_adam")`` with the shard rounded up).
    """
    n = stage_param_count(plan.cfg, pp_rank, plan.pp, plan.tp)
    ideal = memory.zero_state_bytes(n, plan.dp, 1, "fp32_adam")
    shard = shard_numel(n, plan.dp)
    out = {"weights": int(ideal["weights"]), "grads": int(ideal["grads"]),
           "optimizer": 8 * shard}
    out["total"] = sum(out.values())
    return out


def predicted_comms(plan: Plan, pp_rank: int) -> dict[str, int]:
    """TP all-reduces one rank of stage ``pp_rank`` issues per step, and their bytes.

    Megatron's block: one all-reduce forward and one backward for attention, the same for the
    MLP, so 4 per block per microbatch, each of one microbatch's activations
    (b/m, T, D) in fp32. None when tp = 1.
    """
    blocks = len(stage_blocks(plan.cfg, pp_rank, plan.pp))
    calls = 4 * blocks * plan.m if plan.tp > 1 else 0
    return {"tp_all_reduces": calls,
            "tp_bytes": calls * plan.microbatch * plan.cfg.seq_len * plan.cfg.d_model * 4}


def groups_table(mesh: Mesh) -> str:
    """Each rank's coordinates, DP and TP groups and PP neighbours, read off the grid alone."""
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a course_utils.mesh.Mesh; got {type(mesh).__name__}")
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
    """Per rank: parameters held, and persistent bytes predicted from the sizes vs measured."""
    rows = ["rank  (dp, pp, tp)  params   weights    grads  moments   predicted    measured"]
    for rank, r in enumerate(results):
        pp_rank = r["coords"][1]
        want, got = predicted_state_bytes(plan, pp_rank), r["state_bytes"]
        n = stage_param_count(plan.cfg, pp_rank, plan.pp, plan.tp)
        rows.append(f"{rank:>4}  {r['coords']!s:>12}  {n:>6,}  {got['weights']:>8,} "
                    f"{got['grads']:>8,} {got['optimizer']:>8,}  {want['total']:>10,}  "
                    f"{got['total']:>10,}")
    return "\n".join(rows)


PARTS = ("compute", "tp", "pp_wait", "dp")
"""The step's parts: compute (the rest), TP all-reduces, waiting for a pipeline neighbour
(bubble included), DP (waiting for the last buckets, and ZeRO-1's all-gather)."""


def breakdown(results: Sequence[dict[str, Any]], skip: int = 1) -> list[dict[str, float]]:
    """Per rank, the median over steps (the first ``skip`` left out) of each part, in ms."""
    out = []
    for r in results:
        steps = r["times"][skip:] or r["times"]
        out.append({k: 1e3 * statistics.median(t[k] for t in steps) for k in ("step",) + PARTS})
    return out


MESH_FOR_WORLD = {8: (2, 2, 2), 4: (1, 2, 2), 2: (1, 2, 1)}
"""(dp, pp, tp) that :func:`torchrun_worker` uses for each job size."""


def torchrun_worker(rank: int, world_size: int, steps: int = 5) -> float:
    """Worker for torchrun: trains ``steps`` steps on the mesh :data:`MESH_FOR_WORLD` gives this
    job size (8 ranks: DP 2 x PP 2 x TP 2) and returns this rank's largest weight difference
    from its slice of the one-process run (which every rank computes itself)."""
    if world_size not in MESH_FOR_WORLD:
        raise ValueError(f"run with {sorted(MESH_FOR_WORLD)} ranks; got world_size={world_size}")
    dp, pp, tp = MESH_FOR_WORLD[world_size]
    plan = Plan(dp=dp, pp=pp, tp=tp, steps=steps)
    got = train_worker(rank, world_size, plan)
    _dp_rank, pp_rank, tp_rank = got["coords"]
    want = shard_state(reference_train(plan)["weights"], plan.cfg, pp_rank, plan.pp, tp_rank,
                       plan.tp)
    return max(float((compared_weight(k, torch.as_tensor(got["weights"][k]))
                      - compared_weight(k, v)).abs().max()) for k, v in want.items())


