"""Assignment a10's harness: a student's 3-D training step (or TP operator) on real ranks.

The student writes ``train_step(stage, g, inputs, targets, m, optimizer)`` (module 10's step,
without the library's buckets and with ZeRO-1's all-gather written by hand) and a TP operator
``f``. :func:`run_step` trains a small TinyLM (:data:`CFG`) with them on a real DP x PP x TP
mesh through :func:`course_utils.trainer3d.train.run`; :func:`submission` packs each rank's result as
plain data for the grader; :func:`diagnose` compares a run with one process (the loss of each
step, every rank's first gradients and final weights, and the communication each rank issued)
and raises AssertionError naming the mistake it recognises. The visible test runs it in the
kernel on a practice mesh; the judge runs the same function outside the kernel on hidden meshes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from course_utils.trainer3d import train as train3d
from course_utils.trainer3d.stage_model import shard_state
from course_utils.models.tiny_lm import MarkovCorpus, TinyLMConfig, build, shard_batch
from course_utils.trainer3d.check import TOLERANCES, reference_train, replica_losses
from course_utils.trainer3d.comms import predicted_tp

__all__ = ["CFG", "plan", "run_step", "submission", "diagnose", "f_probe_worker", "probe_f",
           "diagnose_f"]

CFG = TinyLMConfig(vocab_size=16, seq_len=8, d_model=16, n_heads=4, n_layers=2, d_ff=32)
"""The assignment's model: 5,136 parameters, so that every rank's tensors fit in a submission."""


ADAM_EPS = 1e-5
"""Adam's epsilon in a10's runs, not torch's 1e-8, so that the weights a run ends with are decided
by its gradients, not by their rounding. Adam's first step moves a weight by lr g / (|g| + eps):
where |g| is near eps, the rounding noise of a summation order (a few 1e-9 here: a DP replica's
microbatches summed, then the replicas, against one process's whole batch) swings it. With
eps = 1e-8, seed 62 on DP 2 x TP 2 (m = 4) has a gradient of 3.9e-9 whose step moved the weight
1.6e-4 apart from one process's, beyond the 1e-4 tolerance, in a right run (3 seeds in 100 did
so on that mesh). With 1e-5 an update moves at most lr / eps = 1e3 times a gradient's noise:
about 1e-6. (Module 10's trainer uses the same eps: ``train3d_check.TOLERANCES``.)"""


def plan(dp: int, pp: int, tp: int, seed: int, m: int = 2, steps: int = 2) -> train3d.Plan:
    """A run of :data:`CFG` on a dp x pp x tp mesh: 4 sequences per replica, ``m`` microbatches,
    Adam with ``lr = 1e-2`` and :data:`ADAM_EPS`; the plain stage (embedding and head whole, no
    sequence parallelism) and no clipping: what the student's step is given."""
    return train3d.Plan(dp=dp, pp=pp, tp=tp, steps=steps, batch=4 * dp, m=m, lr=1e-2,
                        eps=ADAM_EPS, seed=seed, cfg=CFG, vocab_parallel=False, sp=False,
                        clip=None)


def run_step(step_fn: Callable | None, p: train3d.Plan, f: Callable | None = None,
             timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Train ``p`` with a student's ``step_fn`` (None: the library's) and TP operator ``f``."""
    return train3d.run(p, timeout_s=timeout_s, step_fn=step_fn, f=f)


def submission(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's result as plain data (lists, numbers, numpy arrays) for ``checks.submit``."""
    keep = ("coords", "losses", "grads", "weights", "comms")
    return [{k: (list(r[k]) if k == "coords" else r[k]) for k in keep} for r in results]


def _t(x: Any) -> torch.Tensor:
    return torch.as_tensor(x).double()


def _close(a: Any, b: torch.Tensor, rtol: float, atol: float) -> bool:
    a = _t(a)
    return a.shape == b.shape and bool(torch.allclose(a, b.double(), rtol=rtol, atol=atol))


def _replica_grads(p: train3d.Plan, dp_rank: int) -> dict[str, torch.Tensor]:
    """One process's first-step gradients on replica ``dp_rank``'s rows alone (no DP average)."""
    model = build(p.cfg, p.seed)
    x, y = MarkovCorpus(p.cfg.vocab_size, seed=p.seed).batch(0, p.batch, p.cfg.seq_len)
    x, y = shard_batch(x, dp_rank, p.dp), shard_batch(y, dp_rank, p.dp)
    logits = model(x)                                                          # (b, T, V)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    return {n: q.grad.detach().clone() for n, q in model.named_parameters()}


def _grad_mistakes(p: train3d.Plan, coords: tuple, want: dict[str, torch.Tensor]):
    """(message, expected gradients of this rank) for each mistake the gradients can show."""
    dp_rank, pp_rank, tp_rank = coords
    scale = lambda k: {n: k * v for n, v in want.items()}  # noqa: E731
    out = []
    replica = _replica_grads(p, dp_rank)          # one process, this replica's rows only
    local = shard_state(replica, p.cfg, pp_rank, p.pp, tp_rank, p.tp)
    if p.dp > 1:
        out.append(("the gradients are D times too large: the all-reduce over the DP group sums "
                    "the replicas' gradients; divide by the DP size to get the mean", scale(p.dp)))
        out.append(("the gradients are this replica's own: they were never averaged over the DP "
                    "group (all-reduce each gradient over g.dp_group, then divide by its size)",
                    local))
    if p.tp > 1:
        shards = [shard_state(replica, p.cfg, pp_rank, p.pp, t, p.tp) for t in range(p.tp)]
        mixed = {n: sum(s[n] for s in shards) / p.tp for n in want}
        out.append(("the gradients were averaged over the TP group, not the DP group: the ranks "
                    "of g.tp_group hold different slices of the same replica", mixed))
    if p.m > 1:
        out.append(("the gradients are m times too large: each microbatch's mean loss must be "
                    "divided by m before backward, so the m backward passes add up to the "
                    "replica's mean", scale(p.m)))
    return out


def _check_comms(p: train3d.Plan, r: dict[str, Any]) -> None:
    dp_rank, pp_rank, _ = r["coords"]
    comms = r.get("comms") or {}
    want = predicted_tp(p.cfg, pp_rank, p.pp, p.tp, p.m, p.microbatch, False, False)["all_reduce"]
    got = comms.get("tp_all_reduces")
    assert not (isinstance(got, int) and got > want), (
        f"rank {tuple(r['coords'])} issued {got} all-reduces on its TP group in the first step; "
        f"its layers issue {want}: averaging the gradients belongs on g.dp_group")
    assert got == want, (
        f"rank {tuple(r['coords'])} issued {got} TP all-reduces in the first step, but running "
        f"its stage on each of the {p.m} microbatches, forward and backward, issues {want}: "
        "every rank must run its own stage on every microbatch")
    p2p = comms.get("calls") or {}
    neighbours = (pp_rank > 0) + (pp_rank < p.pp - 1)
    sends, recvs = p2p.get("send", 0), p2p.get("recv", 0)   # any form: send, isend, batch
    assert sends == recvs == p.m * neighbours, (
        f"rank {tuple(r['coords'])} sent {sends} and received {recvs} tensors in the first step; "
        f"a stage with {neighbours} pipeline neighbour(s) sends one activation or gradient per "
        f"microbatch to each and receives one from each: {p.m * neighbours}")


def _check_shape(p: train3d.Plan, results: Any, where: str) -> None:
    """Every rank's result has the fields a run returns, of the right kinds (a submission is
    read as untrusted data)."""
    assert isinstance(results, (list, tuple)) and len(results) == p.world_size, (
        f"{where}expected one result per rank ({p.world_size})")
    for r in results:
        assert isinstance(r, dict) and set(r) >= {"coords", "losses", "grads", "weights",
                                                  "comms"}, f"{where}a rank's result is incomplete"
        c = r["coords"]
        assert isinstance(c, (list, tuple)) and len(c) == 3 and all(
            type(v) is int for v in c), f"{where}a rank's coordinates are not 3 ints"
        assert isinstance(r["losses"], (list, tuple)) and len(r["losses"]) == p.steps and all(
            v is None or type(v) in (int, float) for v in r["losses"]), (
            f"{where}rank {tuple(c)}: expected {p.steps} losses (floats or None)")
        for key in ("grads", "weights"):
            assert isinstance(r[key], dict) and all(
                isinstance(v, (torch.Tensor, np.ndarray)) for v in r[key].values()), (
                f"{where}rank {tuple(c)}: its {key} are not tensors")
        assert isinstance(r["comms"], dict) and isinstance(r["comms"].get("calls"), dict), (
            f"{where}rank {tuple(c)}: its communication counts are missing")


def diagnose(p: train3d.Plan, results: Sequence[dict[str, Any]], label: str = "",
             reference: dict[str, Any] | None = None) -> None:
    """Raise AssertionError naming what is wrong with a run of ``p`` (nothing: it is right).
    ``reference``: ``reference_train(p)`` if already computed (the grader computes it while
    the kernel runs)."""
    where = f"{label}: " if label else ""
    _check_shape(p, results, where)
    ref = reference if reference is not None else reference_train(p)
    coords = sorted(tuple(r["coords"]) for r in results)
    assert coords == sorted((d, q, t) for d in range(p.dp) for q in range(p.pp)
                            for t in range(p.tp)), f"{where}the ranks' coordinates are wrong"
    for r in results:
        _, pp_rank, _ = r["coords"]
        last = pp_rank == p.pp - 1
        for step, loss in enumerate(r["losses"]):
            assert (loss is None) != last, (
                f"{where}rank {tuple(r['coords'])} returned {loss!r} at step {step + 1}: the "
                "last stage returns the replica's loss (a float), every other stage None")
    rtol, atol = TOLERANCES["grads"]
    by_stage_ok = {}
    for r in results:
        c = tuple(r["coords"])
        want = shard_state(ref["grads"], p.cfg, c[1], p.pp, c[2], p.tp)
        got = r["grads"]
        missing = sorted(set(want) - set(got))
        assert not missing, f"{where}rank {c}: no gradient for {missing[:3]} after the step"
        ok = all(_close(got[n], want[n], rtol, atol) for n in want)
        by_stage_ok.setdefault(c[1], []).append(ok)
        if ok:
            continue
        for message, wrong in _grad_mistakes(p, c, want):
            if all(_close(got[n], wrong[n], rtol, atol) for n in want):
                raise AssertionError(f"{where}rank {c}: {message}")
    for r in results:   # after the named mistakes: it also catches a step that skips the stage
        _check_comms(p, r)
    if not all(all(v) for v in by_stage_ok.values()):
        bad = sorted(s for s, v in by_stage_ok.items() if not all(v))
        if p.pp > 1 and all(by_stage_ok.get(p.pp - 1, [False])) and bad:
            raise AssertionError(
                f"{where}the last stage's gradients are right but stage {bad[0]}'s are not: the "
                "gradients that come back from the next stage are paired with the wrong "
                "microbatch (send and receive them in the order the next stage computes them, "
                "and backpropagate each through its own microbatch's output)")
        raise AssertionError(f"{where}the gradients of stage(s) {bad} differ from one process "
                             "training the whole model on the whole batch")
    rtol, atol = TOLERANCES["weights"]
    for r in results:
        c = tuple(r["coords"])
        want = shard_state(ref["weights"], p.cfg, c[1], p.pp, c[2], p.tp)
        for n, w in want.items():
            if not _close(r["weights"][n], w.double(), rtol, atol):
                raise AssertionError(
                    f"{where}rank {c}: the gradients are right but the weights after "
                    f"{p.steps} steps are not (e.g. {n}): each DP rank updates only its own "
                    "shard (optimizer.update_shard()); the shards must be all-gathered over the "
                    "DP group and loaded back (optimizer.load_gathered) every step")
    rtol, atol = TOLERANCES["losses"]
    losses = replica_losses(p, [dict(r, coords=tuple(r["coords"])) for r in results])
    for step, (a, b) in enumerate(zip(losses, ref["losses"])):
        if abs(a - b) > atol + rtol * abs(b):
            if p.m > 1 and abs(a - p.m * b) <= atol + rtol * abs(p.m * b):
                raise AssertionError(f"{where}the returned loss is the sum of the {p.m} "
                                     "microbatch losses; return the replica's mean loss")
            raise AssertionError(f"{where}the loss at step {step + 1} differs from one "
                                 "process's")


# ------------------------------------------------------------------------ the TP operator f


def f_probe_worker(rank: int, world_size: int, f: Callable, seed: int) -> dict[str, Any]:
    """Call ``f(x, tp_group)`` with two TP groups of ``world_size // 2`` ranks side by side: the
    same x within a group, a different upstream gradient on every rank."""
    import torch.distributed as dist

    from course_utils.runtime import backend

    half = world_size // 2
    groups = [backend.new_group(list(range(k * half, (k + 1) * half))) for k in range(2)]
    mine = rank // half
    gen = torch.Generator().manual_seed(seed + mine)
    x = torch.randn(2, 3, 4, generator=gen).requires_grad_(True)               # (B, T, D)
    upstream = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(seed + 100 + rank))
    y = f(x, groups[mine])
    y.backward(upstream)
    dist.barrier()
    return {"y": y.detach().numpy().copy(), "x_grad": x.grad.numpy().copy()}


def probe_f(f: Callable, seed: int, world_size: int = 4, timeout_s: float = 60.0) -> list[dict]:
    """Run :func:`f_probe_worker` on real ranks."""
    import functools

    from course_utils import launch

    return launch.run(functools.partial(f_probe_worker, f=f, seed=seed), world_size,
                      timeout_s=timeout_s)


def diagnose_f(probe: Sequence[dict[str, Any]], seed: int, label: str = "") -> None:
    """Name what is wrong with an ``f`` from its :func:`probe_f` results (nothing: it is right).

    Right: forward returns x unchanged; backward gives x the sum of its TP group's upstream
    gradients (every rank of the group computed part of what depends on x).
    """
    where = f"{label}: " if label else ""
    world = len(probe)
    half = world // 2
    for rank, r in enumerate(probe):
        mine = rank // half
        x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(seed + mine)).double()
        ups = [torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(seed + 100 + q))
               .double() for q in range(world)]
        group = ups[mine * half:(mine + 1) * half]
        y, gx = _t(r["y"]), _t(r["x_grad"])
        if _close(y, half * x, 1e-5, 1e-6):
            raise AssertionError(f"{where}rank {rank}: f's forward all-reduces: the input of a "
                                 "column-parallel layer is already whole on every TP rank, so "
                                 "forward is the identity")
        assert _close(y, x, 1e-6, 1e-7), f"{where}rank {rank}: f's forward must return x unchanged"
        if _close(gx, ups[rank], 1e-5, 1e-6):
            raise AssertionError(
                f"{where}rank {rank}: x.grad is this rank's own upstream gradient: f's backward "
                "must all-reduce it over the TP group (each rank's heads or MLP slice "
                "contributes part of dLoss/dx)")
        if _close(gx, sum(group) / half, 1e-5, 1e-6):
            raise AssertionError(f"{where}rank {rank}: x.grad is the mean over the TP group; the "
                                 "contributions add up: sum them (the default all-reduce)")
        if _close(gx, sum(ups), 1e-5, 1e-6):
            raise AssertionError(f"{where}rank {rank}: x.grad sums the upstream gradients of all "
                                 f"{world} ranks: all-reduce over the tp_group f is given")
        assert _close(gx, sum(group), 1e-5, 1e-6), (
            f"{where}rank {rank}: x.grad is not the sum of its TP group's upstream gradients")
