"""Saving and resuming a sharded run with ``torch.distributed.checkpoint`` (DCP), and refusing a
checkpoint that cannot resume it.

:func:`save` writes everything a :class:`course_utils.checkpoint.resume_job.Trainer` needs to go on
exactly: the sharded weights and AdamW's state (``get_state_dict``: DTensor shards, each rank writes
its own), the schedule, the data position (the sampler's epoch, the step in the epoch), the step,
and each rank's torch, NumPy and Python generators under a key of its own: DCP writes a key that
every rank saves **once** (it takes equal keys for a replicated value: ``dedup_save_plans`` in
``torch/distributed/checkpoint/_dedup_save_plans.py``), so one key for the generators would hand
every rank the same one. :func:`load` restores it, leaving out the pieces named in ``omit`` (lecture
12 measures what each one costs).

:func:`verify` reads a checkpoint folder before anything is loaded and raises
:class:`CheckpointError` naming what is wrong: a half-written folder (DCP writes ``.metadata``
last, after every rank's file, so a job killed while saving leaves none), a missing or cut
shard file (and the rank that wrote it), or a checkpoint of another model (a key or a shape
that differs). :func:`latest` finds the newest complete checkpoint in a folder of ``step_N``
checkpoints, skipping half-written ones.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch

__all__ = ["PRELOAD", "PIECES", "PER_RANK", "CheckpointError", "state_to_save", "save", "load",
           "verify",
           "latest", "step_folder", "file_bytes", "job_folder"]

PRELOAD = ("torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
           "course_utils.checkpoint.resume_job", "course_utils.checkpoint.dcp")
"""What ranks that save and load import: ``launch.preload(*PRELOAD)`` has the forkserver import
it once, before the first launch (each rank would pay ~0.7 s for DCP otherwise)."""

PIECES = ("weights", "optimizer", "schedule", "torch RNG", "NumPy RNG", "Python RNG",
          "sampler epoch", "position", "step")
"""What a checkpoint of a ``resume_job`` run holds; ``load(omit=...)`` takes any of them."""

PER_RANK = ("torch RNG", "NumPy RNG", "Python RNG")
"""The pieces saved per rank (under a key per rank): a run resumed on another number of ranks
leaves them out (``load(omit=PER_RANK)``); only a job whose draws do not depend on the rank
(``resume_job.Job(sampler="global", dropout=0.0)``) resumes the same run without them."""


class CheckpointError(ValueError):
    """A checkpoint that cannot resume this run; the message says what is wrong with it."""


def _rng_key(rank: int) -> str:
    return f"rng.rank{rank}"


def _generators() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def state_to_save(trainer, optimizer: bool = True) -> dict[str, Any]:
    """Collective: the state dict DCP saves for ``trainer`` (``optimizer=False``: without
    AdamW's state, which ``get_state_dict`` would otherwise create by stepping it once with
    zero gradients: ``_init_optim_state`` in ``torch/distributed/checkpoint/state_dict.py``)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer:
        model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    else:
        model_sd, optim_sd = get_model_state_dict(trainer.model), None
    state = {"model": model_sd, "schedule": trainer.scheduler.state_dict(),
             "data": {"epoch": int(trainer.sampler.epoch), "position": int(trainer.position)},
             "step": int(trainer.step), _rng_key(trainer.rank): _generators()}
    if optim_sd is not None:
        state["optim"] = optim_sd
    return state


def save(trainer, path: str | os.PathLike, async_group=None):
    """Collective: save ``trainer`` to the folder ``path``. ``async_group``: a gloo group of all
    ranks kept for checkpoints; with it, ``dcp.async_save`` copies the state and returns a
    future while a thread writes (its collectives on that group, never on the training one)."""
    import torch.distributed.checkpoint as dcp

    state = state_to_save(trainer)
    if async_group is None:
        dcp.save(state, checkpoint_id=str(path))
        return None
    return dcp.async_save(state, checkpoint_id=str(path), process_group=async_group)


def load(trainer, path: str | os.PathLike, omit: Iterable[str] = ()) -> None:
    """Collective: resume ``trainer`` (a fresh one: ``resume_job.fresh``) from ``path``, every
    piece but those in ``omit`` (names from :data:`PIECES`). Checked first (:func:`verify`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (set_model_state_dict,
                                                         set_optimizer_state_dict)

    omit = set(omit)
    unknown = omit - set(PIECES)
    if unknown:
        raise ValueError(f"omit must name pieces from {PIECES}; got {sorted(unknown)}")
    state = state_to_save(trainer, optimizer="optimizer" not in omit)
    rng_key = _rng_key(trainer.rank)
    if set(PER_RANK) <= omit:       # (a rank of a larger job has no key of its own to read)
        del state[rng_key]
    elif not any(k.startswith(rng_key + ".") for k in verify(path).state_dict_metadata):
        raise CheckpointError(
            f"{Path(path).name} holds no generators of rank {trainer.rank}: it was saved by "
            f"fewer ranks. Resuming on another number of ranks leaves the per-rank generators "
            f"out (omit=checkpoint.PER_RANK); the run is the same only if no draw depends on "
            f"the rank (resume_job.Job(sampler='global', dropout=0.0))")
    verify(path, state)
    if "weights" in omit:           # (the model's state dict is the parameters themselves)
        del state["model"]
    dcp.load(state, checkpoint_id=str(path))
    if "weights" not in omit:
        set_model_state_dict(trainer.model, state["model"])
    if "optimizer" not in omit:
        set_optimizer_state_dict(trainer.model, trainer.optimizer, state["optim"])
    if "schedule" not in omit:
        trainer.scheduler.load_state_dict(state["schedule"])
    rng = state.get(rng_key, {})
    if "torch RNG" not in omit:
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng:
            torch.cuda.set_rng_state_all(rng["cuda"])
    if "NumPy RNG" not in omit:
        np.random.set_state(rng["numpy"])
    if "Python RNG" not in omit:
        random.setstate(rng["python"])
    if "sampler epoch" not in omit:
        trainer.sampler.set_epoch(state["data"]["epoch"])
    if "position" not in omit:
        trainer.position = state["data"]["position"]
    if "step" not in omit:
        trainer.step = state["step"]


# ----------------------------------------------------------------------------- checking a folder


def _flat_shapes(state: dict[str, Any], prefix: str = "") -> dict[str, tuple[int, ...] | None]:
    """``{dotted key: global shape}`` of a state dict as DCP flattens it (None: not a tensor)."""
    out: dict[str, tuple[int, ...] | None] = {}
    items = state.items() if isinstance(state, dict) else enumerate(state)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, dict) or (isinstance(value, list) and value and all(
                isinstance(v, (dict, list, torch.Tensor)) for v in value)):
            out.update(_flat_shapes(value, name + "."))
        else:
            out[name] = tuple(value.shape) if isinstance(value, torch.Tensor) else None
    return out


def verify(path: str | os.PathLike, state: dict[str, Any] | None = None) -> Any:
    """Check the DCP checkpoint in folder ``path`` before loading; return its metadata.

    Raises :class:`CheckpointError` naming the problem: no such folder; no ``.metadata`` (a
    half-written checkpoint: the job stopped while saving); a shard file missing or shorter
    than the metadata says (naming the file and the rank that wrote it); and, given the
    ``state`` dict a load would fill, a key the checkpoint lacks or a tensor whose shape
    differs (a checkpoint of another model). Reads only the metadata and file sizes.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"no checkpoint at {folder}: the folder does not exist")
    meta_path = folder / ".metadata"
    if not meta_path.is_file():
        shards = sorted(p.name for p in folder.glob("*.distcp"))
        raise CheckpointError(
            f"{folder.name} is half-written: it has no .metadata (DCP writes it last, once every "
            f"rank's file is complete), so the job stopped while saving; files present: "
            f"{shards or 'none'}. Resume from an earlier checkpoint.")
    try:
        with open(meta_path, "rb") as f:
            metadata = pickle.load(f)
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata is the same problem
        raise CheckpointError(f"{folder.name}/.metadata cannot be read ({type(exc).__name__}): "
                              "the checkpoint is damaged") from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0),
                                         info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = folder / name
        writer = re.match(r"__(\d+)_", name)
        who = f" (written by rank {writer.group(1)})" if writer else ""
        if not file.is_file():
            raise CheckpointError(f"{folder.name} is missing the shard file {name}{who}: the "
                                  "checkpoint lists tensors stored in it, so it cannot be "
                                  "loaded (a copy that left a file behind?)")
        if file.stat().st_size < size:
            raise CheckpointError(f"{folder.name}/{name}{who} has {file.stat().st_size:,} bytes; "
                                  f"the metadata says its pieces end at byte {size:,}: the file "
                                  "was cut short")
    if state is not None:
        saved = metadata.state_dict_metadata
        for key, shape in _flat_shapes(state).items():
            if key not in saved and not any(k.startswith(key + ".") for k in saved):
                raise CheckpointError(
                    f"{folder.name} has no {key!r}: it is not a checkpoint of this run (it "
                    f"holds {len(saved)} other keys, e.g. {sorted(saved)[:3]})")
            have = getattr(saved[key], "size", None)
            if shape is not None and have is not None and tuple(have) != shape:
                raise CheckpointError(
                    f"{folder.name} holds {key!r} with shape {tuple(have)}, this model's is "
                    f"{shape}: a checkpoint of another model")
    return metadata


def step_folder(root: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of ``step`` goes: ``root/step_000012``."""
    return Path(root) / f"step_{step:06d}"


def latest(root: str | os.PathLike) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root`` (``(step, folder)``), skipping folders
    :func:`verify` refuses; None when there is none (a job that must start from step 0)."""
    found = []
    for folder in Path(root).glob("step_*"):
        m = re.fullmatch(r"step_(\d+)", folder.name)
        if m:
            found.append((int(m.group(1)), folder))
    for step, folder in sorted(found, reverse=True):
        try:
            verify(folder)
        except CheckpointError:
            continue
        return step, folder
    return None


def file_bytes(path: str | os.PathLike) -> dict[str, int]:
    """``{file name: bytes}`` of a checkpoint folder (each rank's shard file and .metadata)."""
    return {p.name: p.stat().st_size for p in sorted(Path(path).iterdir()) if p.is_file()}


@contextlib.contextmanager
def job_folder(prefix: str = "course-ckpt-") -> Iterator[str]:
    """Collective (every rank of the default group): a temporary folder that rank 0 makes and
    every rank gets the path of (a torchrun demo's checkpoints); rank 0 removes it once every
    rank is done with it."""
    import shutil
    import tempfile

    import torch.distributed as dist

    folder = [tempfile.mkdtemp(prefix=prefix) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(folder)
    try:
        yield folder[0]
    finally:
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(folder[0], ignore_errors=True)
