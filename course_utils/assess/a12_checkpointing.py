"""Assignment a12's harness: a student's save and resume of a sharded run, on real ranks.

The student writes ``save_checkpoint(trainer, path)`` and ``load_checkpoint(trainer, path)``
(which returns the step it resumes at) for a :class:`course_utils.checkpoint.resume_job.Trainer`.
:func:`run_case` runs them as a real interruption does: one job (``launch.run``) trains to
``save_at`` and saves; a **new** job (new processes: nothing survives in memory) builds a fresh
trainer, loads, and trains to the end. :func:`submission` packs what the new job loaded and how
it ended as plain data, and :func:`diagnose` compares it with one process running the whole job
rank by rank (``resume_job.reference_run``), naming the piece of state that was lost. The visible
test runs it in the kernel on a practice job; the judge runs the same function outside the kernel
on jobs drawn for each submission.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from typing import Any, Callable, Sequence

import numpy as np

from course_utils.checkpoint import resume_job

__all__ = ["job", "phase_worker", "run_case", "submission", "diagnose"]

TOLERANCE = {"losses": (1e-5, 1e-6), "weights": (1e-4, 1e-6)}
"""(rtol, atol) against one process: the ranks' gradients are averaged in another order."""


def job(world_size: int, seed: int, samples: int = 24, rows: int = 2, steps: int = 8) -> \
        resume_job.Job:
    """The assignment's job: ``resume_job.Job`` with these ranks, seed and data."""
    return resume_job.Job(world_size=world_size, seed=seed, samples=samples, rows=rows,
                          steps=steps)


def phase_worker(rank: int, world_size: int, job: resume_job.Job, path: str, save_at: int,
                 save_fn: Callable | None = None, load_fn: Callable | None = None) -> dict:
    """With ``save_fn``: a job that trains to ``save_at`` and calls ``save_fn(trainer, path)``.
    With ``load_fn``: a new job that calls ``load_fn(trainer, path)`` on a fresh trainer, records
    what it loaded, and trains to the end (the steps its trainer says are left)."""
    import warnings

    warnings.filterwarnings("ignore")
    trainer = resume_job.fresh(job, rank, world_size)
    if load_fn is None:
        losses = resume_job.train(trainer, save_at)
        save_fn(trainer, path)
        return {"losses": losses}
    resumed_at = load_fn(trainer, path)
    loaded = resume_job.snapshot(trainer)
    if type(trainer.step) is not int or trainer.step < 0:   # (at most job.steps more steps)
        trainer.step = 0
    losses = resume_job.train(trainer, job.steps)
    return {"resumed_at": resumed_at if type(resumed_at) is int else repr(resumed_at)[:80],
            "loaded": loaded, "losses": losses,
            "weights": resume_job.snapshot(trainer)["weights"]}


def run_case(save_fn: Callable, load_fn: Callable, job: resume_job.Job, save_at: int,
             timeout_s: float = 90.0) -> list[dict[str, Any]]:
    """Save at ``save_at`` in one job, resume in a new one; each rank's result of the second.
    The checkpoint folder is a temporary one, removed afterwards."""
    from course_utils import launch

    for name, fn in (("save_fn", save_fn), ("load_fn", load_fn)):
        if not callable(fn):
            raise ValueError(f"{name} must be a function; got {type(fn).__name__}")
    if not (isinstance(save_at, int) and 0 < save_at < job.steps):
        raise ValueError(f"save_at must be a step from 1 to {job.steps - 1}; got {save_at!r}")
    folder = tempfile.mkdtemp(prefix="course-a12-")
    path = f"{folder}/step_{save_at}"
    try:
        launch.run(functools.partial(phase_worker, job=job, path=path, save_at=save_at,
                                     save_fn=save_fn), job.world_size, timeout_s=timeout_s,
                   threads_per_rank=1, show_output=False)
        return launch.run(functools.partial(phase_worker, job=job, path=path, save_at=save_at,
                                            load_fn=load_fn), job.world_size,
                          timeout_s=timeout_s, threads_per_rank=1, show_output=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def submission(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's result as plain data for ``checks.submit``."""
    return [dict(r) for r in results]


# ------------------------------------------------------------------------------------ judging


def _close(a: Any, b: Any, tol: tuple[float, float]) -> bool:
    try:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=tol[0], atol=tol[1]))


def _check_shape(job: resume_job.Job, results: Any, where: str) -> None:
    assert isinstance(results, (list, tuple)) and len(results) == job.world_size, (
        f"{where}expected one result per rank ({job.world_size})")
    for r in results:
        assert isinstance(r, dict) and {"resumed_at", "loaded", "losses", "weights"} <= set(r), (
            f"{where}a rank's result is incomplete")
        loaded = r["loaded"]
        assert isinstance(loaded, dict) and isinstance(loaded.get("rng"), dict) and isinstance(
            loaded.get("weights"), dict) and isinstance(loaded.get("moments"), dict), (
            f"{where}a rank's loaded state is incomplete")
        assert isinstance(r["losses"], list) and all(type(v) is float for v in r["losses"]), (
            f"{where}a rank's losses are not floats")


def _weights_message(job, ref, loaded, rank) -> str | None:
    """What is wrong with the weights a rank holds after loading, or None."""
    ok = {n: _close(loaded["weights"].get(n), w, TOLERANCE["weights"])
          for n, w in ref["weights"].items()}
    if all(ok.values()):
        return None
    initial = {n: p.detach().numpy() for n, p in resume_job.build_model(job).named_parameters()}
    if all(_close(loaded["weights"].get(n), initial[n], (0, 0)) for n in initial):
        return ("the weights are the new job's initial ones: the model's state was not loaded "
                "into the model (after dcp.load into get_state_dict's dict, set_state_dict "
                "puts it there)")
    rows0 = resume_job.shard_rows(ref["weights"]["0.weight"].shape[0], job.world_size)[0]
    mine = np.asarray(loaded["weights"].get("0.weight"))
    if mine.shape == ref["weights"]["0.weight"].shape and _close(
            mine[rows0[0]:rows0[1]], ref["weights"]["0.weight"][rows0[0]:rows0[1]],
            TOLERANCE["weights"]):
        return ("only rank 0's rows of the weights are right: each rank holds its own shard "
                "and must save it (every rank calls dcp.save, which writes each rank's shard)")
    return "the weights loaded are not the ones saved"


def _rng_message(ref_rng: list[dict], results: Sequence[dict]) -> str | None:
    names = {"torch": "torch's generator (dropout)", "numpy": "NumPy's generator (the input "
             "noise)", "python": "Python's generator (the masked feature)"}
    for kind, name in names.items():
        got = [r["loaded"]["rng"].get(kind) for r in results]
        want = [s[kind] for s in ref_rng]
        if got == want:
            continue
        if len(set(got)) == 1 and got[0] in want:
            return (f"every rank resumed with the same state of {name}: one rank's copy. DCP "
                    "writes a key that every rank saves only once (it takes it for a "
                    "replicated value): save each rank's generators under a key of its own")
        return (f"{name} was not restored on every rank: it restarted from the job's seed, so "
                "the next steps draw other numbers")
    return None


def diagnose(job: resume_job.Job, save_at: int, results: Any, label: str = "") -> None:
    """Raise AssertionError naming what is wrong with a resumed run (nothing: it is right)."""
    where = f"{label}: " if label else ""
    _check_shape(job, results, where)
    ref = resume_job.reference_run(job, at=save_at)
    at = ref["state_at"]
    for rank, r in enumerate(results):
        loaded = r["loaded"]
        message = _weights_message(job, at, loaded, rank)
        assert message is None, f"{where}rank {rank}: {message}"
        moments = loaded["moments"]
        if all(v is None or not np.any(np.asarray(v)) for v in moments.values()):
            raise AssertionError(
                f"{where}rank {rank}: Adam's moments are empty or zero after loading: the "
                "optimizer's state was not restored (it must be in the checkpoint; note that "
                "the optimizer has no state before its first step: get_state_dict makes it)")
        assert all(_close(moments.get(k), v, TOLERANCE["weights"]) for k, v in
                   at["moments"].items()), (
            f"{where}rank {rank}: Adam's moments differ from the saved ones")
        assert loaded["adam_steps"] == at["adam_steps"], (
            f"{where}rank {rank}: Adam's step count is {loaded['adam_steps']:g}, not "
            f"{at['adam_steps']:g}: its bias correction restarts (restore the optimizer's state "
            "whole)")
        assert loaded["schedule_step"] == at["schedule_step"], (
            f"{where}rank {rank}: the learning-rate schedule is at step "
            f"{loaded['schedule_step']}, not {at['schedule_step']}: it was not restored, so it "
            "warms up again (save and load the scheduler's state_dict)")
        assert loaded["epoch"] == at["epoch"], (
            f"{where}rank {rank}: the sampler is in epoch {loaded['epoch']}, not {at['epoch']}: "
            "it shuffles with seed + epoch, so it would read another epoch's order "
            "(sampler.set_epoch with the saved epoch)")
        assert loaded["position"] == at["position"], (
            f"{where}rank {rank}: the run resumes at step {loaded['position']} of its epoch, "
            f"not {at['position']}: rows would be read twice or skipped (restore the position)")
        assert loaded["step"] == at["step"], (
            f"{where}rank {rank}: the trainer's step is {loaded['step']}, not {at['step']}: the "
            "run would train the wrong number of steps (restore trainer.step)")
        assert r["resumed_at"] == save_at, (
            f"{where}rank {rank}: load_checkpoint returned {r['resumed_at']!r}; it must return "
            f"the step it resumes at, {save_at}")
    message = _rng_message(at["rng"], results)
    assert message is None, f"{where}{message}"
    for rank, r in enumerate(results):
        want = ref["losses"][save_at:]
        assert len(r["losses"]) == len(want) and _close(r["losses"], want, TOLERANCE["losses"]), (
            f"{where}rank {rank}: the resumed losses differ from one process's uninterrupted "
            "run, though the state it loaded looks right")
        assert all(_close(r["weights"].get(n), w, TOLERANCE["weights"])
                   for n, w in ref["weights"].items()), (
            f"{where}rank {rank}: the final weights differ from one process's uninterrupted run")
