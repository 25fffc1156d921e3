# %% [markdown]
# # Assignment 12: Checkpoints and resuming
#
# Lecture 12 measured what a checkpoint must hold, resumed a sharded run bit for bit, and
# timed what a lost rank costs. Here you size a checkpoint and its interval for a job of your
# own (Q1, Q2), write the save and the resume of a sharded run yourself (Q3), which the tests run
# on real gloo ranks against one process, and read two pitfalls (Q4, Q5).
#
# **Units**: 1 GB = 10^9 bytes. **Layout** (FSDP2 with mixed precision, as torchtitan trains):
# the parameters are stored in fp32 and sharded over the D ranks, each step computes in bf16
# copies that are thrown away; AdamW keeps two fp32 moments per parameter (and one step count
# per parameter tensor, a scalar every rank holds whole: too few bytes to count here). Between
# two steps the gradients are gone.
#
# **What the tests tell you while you practise.** Before each numeric or choice question there
# is a *Practice (not graded)* twin, which the cell after it checks fully. For the graded
# numbers and choices the visible test checks the type and rejects known wrong answers, without
# saying what the right one is. Q3's test runs your functions on a practice job and names the
# piece of state it finds lost. **Grading adds** your own numbers' values and Q3 on another
# job: 3 ranks, another seed, data size and save point, drawn for your submission.
#
# **Your own numbers.** Q1 and Q2 use numbers drawn for you (the table the next cell shows,
# `G`): your classmates have other ones, so their answers are wrong for you. They come from your
# identity (your JupyterHub user, the name `make lab` asked for once, or, when your instructor
# grades, your student id, whatever this notebook says). Do not edit that cell.
#
# **Work the answers out yourself.** `course_utils` has the lecture's versions (for example
# `checkpoint.save` and `checkpoint_interval.young_interval`); an answer that uses one is
# flagged for your instructor.

# %%
import math
import random

import numpy as np
import torch

from course_utils import checkpoint, launch
from course_utils.assess import a12_checkpointing as resume_check, checks, variants

launch.preload(*checkpoint.PRELOAD)  # the ranks import DCP once
G = variants.givens("a12_checkpointing", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## Q1. How big is a checkpoint? (3 points)
#
# *Practice (not graded)*: a 1e9-parameter model trains on D = 8 ranks with the layout above.
# Its checkpoint holds what a resume needs of the model and the optimizer. How many GB is the
# whole checkpoint (`practice_total_gb`), how many GB does each rank write (`practice_rank_gb`),
# and how many seconds does the save take if every rank writes its own file at the same time at
# 0.5 GB/s (`practice_save_s`)? Take the storage as fast enough for all of them at once: at
# scale a save takes max(rank bytes / rank bandwidth, total bytes / the storage's aggregate
# bandwidth); Llama 3's storage sustained 2 TB/s, 7 TB/s at its peak (Llama Team 2024,
# section 3.3.1).

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_total_gb = 1e9 * (4 + 4 + 4) / 1e9
practice_rank_gb = practice_total_gb / 8
practice_save_s = practice_rank_gb / 0.5
### END SOLUTION

# %%
checks.check_number("practice_total_gb", practice_total_gb, 12.0, unit="GB", mistakes=[
    (16.0, "between two steps there are no gradients to save: 4 bytes of fp32 weight and 8 of "
           "Adam's moments per parameter."),
    (2.0, "the bf16 copies are made afresh at each step from the fp32 weights; the fp32 weights "
          "(and Adam's moments) are what a resume needs."),
    (4.0, "without Adam's two moments the optimizer restarts: they are in the checkpoint too."),
    (14.0, "the bf16 copies are not state: FSDP2 makes them from the fp32 shards at each step."),
    (12e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes."),
])
checks.check_number("practice_rank_gb", practice_rank_gb, 1.5, unit="GB", mistakes=[
    (12.0, "that is the whole checkpoint: each rank writes only its own shards, 1/D of it."),
    (2.0, "without gradients: 12 bytes per parameter, divided over the 8 ranks."),
])
checks.check_number("practice_save_s", practice_save_s, 3.0, unit="s", mistakes=[
    (24.0, "the ranks write at the same time, each its own file: the time is one rank's bytes "
           "over its bandwidth."),
])
print("practice Q1: right")

# %% [markdown]
# **Graded**: your model has N parameters, trains on D ranks with the same layout, and each
# rank writes at B GB/s, where `(N, D, B) = G.q1` (your numbers are in the table at the top).
# Set `q1_total_gb`, `q1_rank_gb` and `q1_save_s` as in the practice.

# %% [answer q1]
### BEGIN SOLUTION
n_params, ranks, write_gb_s = G.q1
q1_total_gb = 12 * n_params / 1e9
q1_rank_gb = q1_total_gb / ranks
q1_save_s = q1_rank_gb / write_gb_s
### END SOLUTION

# %% [test q1_test points=3]
# Checks the type and rejects known wrong answers; the values are checked when graded.
_n, _d, _b = G.q1
checks.check_number("q1_total_gb", q1_total_gb, unit="GB", variant=G.key("q1"), mistakes=[
    (16 * _n / 1e9, "between two steps there are no gradients to save."),
    (2 * _n / 1e9, "the bf16 copies are not what a resume needs."),
])
checks.check_number("q1_rank_gb", q1_rank_gb, unit="GB", variant=G.key("q1"), mistakes=[
    (12 * _n / 1e9, "each rank writes only its own shards."),
])
checks.check_number("q1_save_s", q1_save_s, unit="s", variant=G.key("q1"), mistakes=[
    (12 * _n / 1e9 / _b, "the ranks write at the same time, each its own shards."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q1_total_gb", q1_total_gb)
submit("q1_rank_gb", q1_rank_gb)
submit("q1_save_s", q1_save_s)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. How often to save? (3 points)
#
# Use the lecture's first-order model: failures at random at a constant rate, the job's mean
# time between failures M, a save stalls training for `delta` seconds, a restart costs R
# seconds. Young's interval is `sqrt(2 delta M)`; the time lost per second of training at an
# interval `tau` is `delta / tau + (tau / 2 + R) / M`. A job fails when any of its GPUs does:
# with n GPUs that each fail on average every m hours, independently and at a constant rate
# (exponential times between failures: the first of n such clocks runs out after m / n on
# average), M = m / n.
#
# *Practice (not graded)*: 1,000 GPUs, each failing every 20,000 hours on average; a save stalls
# 30 s; a restart takes 300 s. Set `practice_mtbf_h` (M, in hours), `practice_interval_min`
# (Young's interval, in minutes) and `practice_lost` (the time lost per second of training at
# that interval, a number between 0 and 1).

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_mtbf_h = 20_000 / 1_000
_tau = math.sqrt(2 * 30 * practice_mtbf_h * 3600)
practice_interval_min = _tau / 60
practice_lost = 30 / _tau + (_tau / 2 + 300) / (practice_mtbf_h * 3600)
### END SOLUTION

# %%
checks.check_number("practice_mtbf_h", practice_mtbf_h, 20.0, unit="h", mistakes=[
    (20_000.0, "that is one GPU's; the job stops when any of its 1,000 GPUs fails."),
    (20_000_000.0, "divide, not multiply: more GPUs fail more often."),
])
checks.check_number("practice_interval_min", practice_interval_min, 34.64101615137755,
                    unit="min", mistakes=[
    (24.49489742783178, "that is sqrt(delta M): Young's interval is sqrt(2 delta M)."),
    (2078.460969082653, "that is seconds; give minutes."),
    (1095.445115010332, "M is the job's mean time between failures (one GPU's divided by the "
                        "number of GPUs), not one GPU's."),
    (0.5773502691896258, "delta is in seconds and M in hours: convert M to seconds first."),
])
checks.check_number("practice_lost", practice_lost, 0.033034180126147956, mistakes=[
    (0.02886751345948129, "the restart is lost at every failure too: add R / M."),
    (0.0474679368558886, "a failure strikes on average halfway through an interval: tau / 2 "
                         "is redone, not tau."),
])
print("practice Q2: right")

# %% [markdown]
# **Graded**: your job runs on n GPUs that each fail every m hours on average, a save stalls
# it for `delta` seconds and a restart takes R seconds, where `(n, m, delta, R) = G.q2`. Set
# `q2_mtbf_h`, `q2_interval_min` and `q2_lost` as in the practice.

# %% [answer q2]
### BEGIN SOLUTION
gpus, gpu_mtbf_h, delta_s, restart_s = G.q2
q2_mtbf_h = gpu_mtbf_h / gpus
_tau = math.sqrt(2 * delta_s * q2_mtbf_h * 3600)
q2_interval_min = _tau / 60
q2_lost = delta_s / _tau + (_tau / 2 + restart_s) / (q2_mtbf_h * 3600)
### END SOLUTION

# %% [test q2_test points=3]
# Checks the type and rejects known wrong answers; the values are checked when graded.
_n, _m, _delta, _r = G.q2
_tau = math.sqrt(2 * _delta * _m / _n * 3600)
checks.check_number("q2_mtbf_h", q2_mtbf_h, unit="h", variant=G.key("q2"), mistakes=[
    (float(_m), "that is one GPU's mean time between failures, not the job's."),
])
checks.check_number("q2_interval_min", q2_interval_min, unit="min", variant=G.key("q2"),
                    mistakes=[
    (_tau / math.sqrt(2) / 60, "Young's interval is sqrt(2 delta M)."),
    (_tau, "that is seconds; give minutes."),
])
checks.check_number("q2_lost", q2_lost, variant=G.key("q2"), mistakes=[
    (_delta / _tau + _tau / 2 / (_m / _n * 3600), "the restart is lost at every failure too."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q2_mtbf_h", q2_mtbf_h)
submit("q2_interval_min", q2_interval_min)
submit("q2_lost", q2_lost)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Save and resume a sharded run (6 points)
#
# The run is lecture 12's (`course_utils.checkpoint.resume_job`). Each rank holds a `trainer` with
#
# * `trainer.model`: an MLP sharded by FSDP2 (`fully_shard`: its parameters are DTensor
#   shards) and `trainer.optimizer`: `torch.optim.AdamW` over them;
# * `trainer.scheduler`: a `LambdaLR` (warm-up, then decay), stepped after every step;
# * `trainer.sampler`: a `DistributedSampler` that shuffles with `seed + sampler.epoch`, and
#   `trainer.position`: the steps done in the current epoch;
# * `trainer.step`: the steps done; `trainer.rank`: this rank;
# * and each step draws from torch's generator (dropout), NumPy's global one (input noise) and
#   Python's `random` (a masked feature), each different on every rank.
#
# Write `training_state(trainer)`, the state dict both sides hand to DCP;
# `save_checkpoint(trainer, path)`, which every rank calls to save into the folder `path` with
# `torch.distributed.checkpoint` (DCP); and `load_checkpoint(trainer, path)`, which every
# rank of a **new job** calls on a fresh trainer (built, sharded and seeded as at step 0) and
# which must put it exactly where the saved one was, then return the step it resumes at (an
# int). The test saves at a step in the middle of an epoch, then starts new processes that load
# and train to the end: the losses and the final weights must equal one process running the
# whole job without a break.
#
# Useful: `dcp.save(state, checkpoint_id=path)` and `dcp.load(state, checkpoint_id=path)`
# (load fills the tensors of `state` in place and replaces its other values);
# `get_state_dict(model, optimizer)` and `set_state_dict(model, optimizer, model_state_dict=...,
# optim_state_dict=...)` from `torch.distributed.checkpoint.state_dict`; `torch.get_rng_state`,
# `np.random.get_state`, `random.getstate` and their `set` twins; `sampler.set_epoch`.

# %% [answer q3]
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def training_state(trainer):
    """The state dict that both functions hand to DCP: everything the rest of the run depends
    on, as this rank sees it."""
    ### BEGIN SOLUTION
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    return {"model": model_sd, "optim": optim_sd, "schedule": trainer.scheduler.state_dict(),
            "data": {"epoch": trainer.sampler.epoch, "position": trainer.position},
            "step": trainer.step,
            # each rank's generators under a key of its own: DCP keeps one copy of a key that
            # every rank saves
            f"rng.rank{trainer.rank}": {"torch": torch.get_rng_state(),
                                        "numpy": np.random.get_state(),
                                        "python": random.getstate()}}
    ### END SOLUTION


def save_checkpoint(trainer, path):
    """Save everything the rest of the run depends on, from every rank."""
    ### BEGIN SOLUTION
    dcp.save(training_state(trainer), checkpoint_id=path)
    ### END SOLUTION


def load_checkpoint(trainer, path):
    """Restore a fresh trainer from ``path``; return the step it resumes at."""
    ### BEGIN SOLUTION
    state = training_state(trainer)             # the structure to load into, this rank's keys
    dcp.load(state, checkpoint_id=path)
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    trainer.scheduler.load_state_dict(state["schedule"])
    trainer.sampler.set_epoch(state["data"]["epoch"])
    trainer.position, trainer.step = state["data"]["position"], state["step"]
    rng = state[f"rng.rank{trainer.rank}"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    return trainer.step
    ### END SOLUTION

# %% [test q3_test points=6]
# practice: 2 ranks, 4 steps an epoch, saved after step 5 (the middle of the second epoch)
_job = resume_check.job(2, seed=11, samples=16)
resume_check.diagnose(_job, 5, resume_check.run_case(save_checkpoint, load_checkpoint, _job, 5),
                      label="practice job")
print("Q3: the resumed run equals one process's uninterrupted run on the practice job")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _number, (_ranks, _seed, _samples, _save_at) in enumerate(hidden_cases("q3_test"), 1):
    _job = resume_check.job(_ranks, seed=_seed, samples=_samples)     # drawn per submission
    submit(f"hidden case {_number}", resume_check.submission(
        resume_check.run_case(save_checkpoint, load_checkpoint, _job, _save_at)))
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Loaded before wrapping (1 point)
#
# *Practice (not graded)*: a colleague resumes an FSDP2 run like this: build the model, call
# `fully_shard(model)`, make the AdamW optimizer over `model.parameters()`, load the checkpoint
# into the model and the optimizer with `dcp.load` (their state dicts from
# `get_state_dict`), and train. What happens? Set `practice_outcome` to one of
# `"never-trains"`, `"error"`, `"right"`, `"wrong-shards"` (the graded question's choices,
# below).

# %% [answer q4_practice]
### BEGIN SOLUTION
practice_outcome = "right"
### END SOLUTION

# %%
checks.check_choice("practice_outcome", practice_outcome, "right",
                    ["never-trains", "error", "right", "wrong-shards"], mistakes={
    "never-trains": "the optimizer is made after fully_shard here: the tensors it steps are "
                    "the sharded parameters the model computes with.",
    "error": "DCP loads into DTensor parameters and their optimizer state as they are: that is "
             "what it is for.",
    "wrong-shards": "fully_shard replaces every parameter by this rank's shard: no rank keeps "
                    "the whole model."})
print("practice Q4: right")

# %% [markdown]
# **Graded**: another colleague resumes an FSDP2 run like this: build the model, make the AdamW
# optimizer over `model.parameters()`, load the checkpoint into the whole model with `dcp.load`,
# then call `fully_shard(model)`, and train. What happens? Set `q4_outcome` to one of
#
# * `"never-trains"`: the loss stays where it was: the optimizer updates the tensors
#   `fully_shard` replaced, which no forward pass uses;
# * `"error"`: the first `optimizer.step()` raises, since the parameters are now DTensors;
# * `"right"`: it resumes correctly, only slower to load (every rank reads the whole model);
# * `"wrong-shards"`: each rank keeps the whole model, so the ranks' updates are added D times.

# %% [answer q4]
### BEGIN SOLUTION
q4_outcome = "never-trains"
### END SOLUTION

# %% [test q4_test points=1]
checks.check_choice("q4_outcome", q4_outcome, None,
                    ["never-trains", "error", "right", "wrong-shards"], mistakes={
    "wrong-shards": "fully_shard replaces every parameter by this rank's shard: no rank keeps the "
                    "whole model."})
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q4_outcome", q4_outcome)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. A resume on GPUs (2 points, graded by hand)
#
# Your Q3 code resumes a run on 64 GPUs. The first resumed losses equal the uninterrupted run's
# to 4 digits, then the two curves drift apart by about 1e-3 and stay close. (a) Name two causes
# that do not mean the checkpoint lost anything, and one setting that removes each. (b) How
# would you convince yourself the checkpoint is complete anyway, without a bit-exact run?

# %% [manual q5_explain points=2]
# ### BEGIN SOLUTION
# (a) Non-deterministic GPU kernels: atomics add in the order threads arrive (attention's
# backward: FlashAttention's deterministic=True backward, or torch.backends.cudnn.deterministic
# for SDPA's cuDNN path; on older PyTorch releases, cuBLAS's shared workspace:
# CUBLAS_WORKSPACE_CONFIG=:4096:8; index_add, scatter_add_:
# torch.use_deterministic_algorithms(True)); cuDNN autotuning picks another
# algorithm in the new process: torch.backends.cudnn.benchmark = False; NCCL may choose another
# algorithm, protocol or channel count on other nodes, so the all-reduce adds in another
# order: pin NCCL_ALGO and NCCL_PROTO (and the same topology). (b) Compare the state right
# after loading with the state saved (weights, moments, schedule, data position, step: they
# must be equal bit for bit, since loading does no arithmetic); or run the resume on
# CPU/gloo or with deterministic settings, where it must be bit-exact; or check that the drift
# is of the size two uninterrupted runs with the same seed show.
#
# **Rubric** (2 points):
# * 1 point: two real sources of run-to-run differences on GPUs (atomics / non-deterministic
#   kernels such as attention's backward or, on older PyTorch, cuBLAS's workspace,
#   autotuning, NCCL's reduction order), each with a setting that removes it. TF32 is not one
#   (it changes results against fp32, the same way every run).
# * 1 point: a check of completeness that does not need bit-exact training (compare the loaded
#   state with the saved state, or a deterministic rerun, or the size of run-to-run noise).
# * 0 points: blames a missing piece of state without evidence, or says GPUs cannot resume.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a12_checkpointing.ipynb`**, with its
# name unchanged (in `make lab` it is `workspace/assignments/a12_checkpointing/
# a12_checkpointing.ipynb`), the way your instructor asks. Outputs may be cleared: your
# instructor runs the whole notebook again, from the top, in a fresh kernel, to grade it, so
# first check that *Kernel > Restart Kernel and Run All Cells* meets no `NameError`. Learning on
# your own with the full repository? `make check A=a12_checkpointing` grades your copy the same
# way.
