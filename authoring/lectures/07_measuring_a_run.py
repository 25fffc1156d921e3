# %% [markdown]
# # Module 7: Measuring a real run
#
# Verify first, then time, memory and waiting. The earlier modules predicted things: bytes of
# state per rank, bytes an all-reduce moves. This one trains a small transformer language model
# data-parallel on two real ranks and measures it. The order matters:
#
# 1. **Verify** that the distributed run computes what one process would: same loss, same
#    gradient. A scaling bug can look healthy and benchmarks just as fast as a correct run.
# 2. **Measure**, per rank: step time, throughput (tokens/s), memory, and time spent waiting
#    inside collectives. Then make one rank slow and see where the waiting goes.
# 3. **Profile** one run with `torch.profiler` and read its summary.
# 4. **Compare** the measurements with the course's predictions.
#
# Everything runs on CPU with the gloo backend, the ranks sharing this machine's cores (the cell
# after the imports says how many there are). Timings depend on the machine and on whatever else
# it runs, and on a small shared machine they can vary by 2x between runs, so cells that print
# times are not compared by the tests; the claims made about them are checked in
# `tests/test_measure.py`.

# %%
import functools
import os
import textwrap
from dataclasses import replace

import matplotlib.pyplot as plt
import torch

from course_utils import launch, measure, memory, style
from course_utils.models import tiny_lm
from course_utils.runtime import backend

style.use()
torch.set_num_threads(1)  # like each rank: with several ranks per machine, more threads contend

# %%
# NBVAL_IGNORE_OUTPUT
print(f"this machine: {os.cpu_count()} logical CPUs for 2 to 4 ranks, "
      f"{torch.get_num_threads()} torch thread per process")

# %% [markdown]
# ## The model and its data
#
# `tiny_lm.TinyLM` is GPT-shaped: token and position embeddings, two pre-norm transformer blocks
# (causal self-attention, then an MLP), a final LayerNorm and a linear head. Its text is made on
# the spot by a random Markov chain over 64 tokens, where each token has 4 likely successors, so
# nothing is downloaded. The chain gives the loss two landmarks: a model that knows nothing scores
# ln(64) nats/token, and no model can beat the chain's entropy rate.

# %%
cfg = tiny_lm.TinyLMConfig()
corpus = tiny_lm.MarkovCorpus(cfg.vocab_size, n_successors=4, seed=0)
model = tiny_lm.build(cfg, seed=0)
N = tiny_lm.count_params(model)
print(cfg)
print(f"parameters: {N:,} (from the sizes alone: {tiny_lm.predicted_param_count(cfg):,})")
print(f"loss floor (entropy rate): {corpus.entropy_rate():.3f} nats/token;  "
      f"knowing nothing: ln(64) = {tiny_lm.uniform_loss(cfg):.3f}")

# %% [markdown]
# Every run below uses a global batch of 16 sequences of 32 tokens (512 tokens per step) split
# evenly over the ranks. `MarkovCorpus.batch(step, ...)` is a pure function of the step, so both
# ranks build the same global batch and keep their own half: no data files, no sampler.

# %%
spec = measure.RunSpec(cfg=cfg, global_batch=16)
print("tokens per step:", spec.tokens_per_step())

# %% [markdown]
# ## 1. Verify first: does the distributed step equal the single-process step?
#
# The reference is one process computing the loss and gradient of the whole global batch. Each
# rank computes the mean loss of its half, backpropagates, and the ranks all-reduce their
# gradients. The SUM of two half-batch mean gradients is twice the full-batch mean gradient, so
# the correct reduction divides by D = 2.
#
# We run four variants on two ranks in one launch:
#
# * `manual, mean`: one flat `all_reduce(SUM)` of the gradients, then divide by D (correct);
# * `ddp, mean`: PyTorch's `DistributedDataParallel`, unchanged (correct);
# * `manual, sum`: the bug of never dividing by D;
# * `manual, double_mean`: the bug of dividing the loss by D by hand *and* averaging in the
#   reduction.

# %%
variants = [("manual", "mean"), ("ddp", "mean"), ("manual", "sum"), ("manual", "double_mean")]
specs = [replace(spec, engine=e, scaling=s) for e, s in variants]
ref = measure.reference_gradients(spec)
outs = launch.run(functools.partial(measure.dp_gradients_each, specs=specs), 2,
                  timeout_s=120, threads_per_rank=1)
rank0 = outs[0]
reports = [measure.check_gradient_scaling(out["grad"], ref["grad"], world_size=2)
           for out in rank0]
print(f"single process: loss {ref['loss']:.4f}, |grad| {ref['grad'].norm():.4f}")
rows = [{"variant": f"{engine}, {scaling}", "loss": out["loss"], "ratio": r.norm_ratio,
         "match": r.ok} for (engine, scaling), out, r in zip(variants, rank0, reports)]
print(measure.format_table(rows, digits=4, headers={"ratio": "|g| / |g_ref|"}))
for row, r in zip(rows, reports):
    if not r.ok:
        print(textwrap.fill(f"{row['variant']}: {r.diagnosis}", 90, subsequent_indent="    "))

# %% [markdown]
# The two correct variants match the single-process gradient element by element (the check uses
# `torch.allclose` with rtol 1e-4); the hand-written all-reduce and DDP agree with each other
# too. Both bugs keep the gradient's *direction* (cosine 1.0) and change only its length, by
# exactly D or 1/D, so the check can name them. Note that the **logged loss was right in all
# four runs**: the loss you print says nothing about how the gradient was scaled.
#
# Assert the equalities, as a test would:

# %%
torch.testing.assert_close(torch.from_numpy(rank0[0]["grad"]), ref["grad"], rtol=1e-4, atol=1e-6)
torch.testing.assert_close(torch.from_numpy(rank0[1]["grad"]), ref["grad"], rtol=1e-4, atol=1e-6)
torch.testing.assert_close(torch.from_numpy(outs[1][0]["grad"]), torch.from_numpy(rank0[0]["grad"]))
print("manual all-reduce == DDP == single process; rank 1 holds the same gradient as rank 0")

# %% [markdown]
# ### Can the loss curve catch a scaling bug?
#
# Train six steps with the "sum" bug and compare the loss curve with single-process training
# (the grey band), once with AdamW and once with plain SGD.

# %%
curve_specs = [replace(spec, steps=6, optimizer=o, lr=lr, scaling=s)
               for o, lr in (("adamw", 3e-3), ("sgd", 0.5)) for s in ("mean", "sum")]
runs = launch.run(functools.partial(measure.dp_train_each, specs=curve_specs), 2,
                  timeout_s=120, threads_per_rank=1)[0]
ref_curves = {s_.optimizer: measure.reference_losses(s_)  # one per optimizer: "sum" is a DP bug
              for s_ in curve_specs if s_.scaling == "mean"}
losses = {(s_.optimizer, s_.scaling): run["losses"] for s_, run in zip(curve_specs, runs)}
fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
for ax, opt, title in zip(axes, ("adamw", "sgd"), ("AdamW: the bug is invisible",
                                                   "SGD: the bug looks like progress")):
    measure.plot_loss_curves(ref_curves[opt], {"2 ranks, gradients averaged": losses[opt, "mean"],
                                               "2 ranks, summed (bug)": losses[opt, "sum"]},
                             title, ax=ax, ylabel=ax is axes[0])
_ = axes[0].legend(loc="lower left")
plt.show()
for opt, name in (("adamw", "AdamW"), ("sgd", "SGD")):
    mean_diff, sum_diff = (max(abs(a - b) for a, b in zip(losses[opt, s], ref_curves[opt]))
                           for s in ("mean", "sum"))
    print(f"{name:5s} max |loss - one process|: {mean_diff:.4f} averaged, {sum_diff:.4f} summed; "
          f"last loss {ref_curves[opt][-1]:.3f} one process, {losses[opt, 'sum'][-1]:.3f} summed")

# %% [markdown]
# Two lessons:
#
# * **With Adam the loss curve cannot see the bug.** Adam divides each gradient by the square
#   root of its own running average of squared gradients, so multiplying every gradient by 2
#   cancels (up to the tiny `eps`). The run trains "fine" but the gradients you would clip, log
#   or accumulate are wrong, and the bug will bite the day you switch optimizer, add gradient
#   clipping or change the world size.
# * **With SGD the bug looks like an improvement.** Summing instead of averaging doubles the
#   effective learning rate, and here the loss falls *faster*. Only the comparison with the
#   single-process run tells you it is a bug and not a better setting.
#
# So the check to run before any benchmark compares **gradients** against a single-process run
# on the same global batch, as `check_gradient_scaling` does.

# %% [markdown]
# ## 2. Measure a run
#
# `measure.dp_train` trains on every rank and times five phases of each step with
# `time.perf_counter` (read through `measure.clock`, see below): building the batch (`data`),
# `forward`, `backward`, `wait` (the time inside the gradient all-reduce) and `optimizer`. It
# also records the bytes the process wrote during the all-reduce (from `/proc/self/io`, which
# counts socket writes, so this is what gloo really sent), the persistent state bytes after the
# first step (`memory.count_state_bytes`) and, on the last step, the peak by category from
# torch's `MemTracker`. Rank 0 prints its progress as it trains (`live_rank=0`). The first
# step is a warm-up and is left out of the averages.
#
# A clock read before and after a call measures the call only if the call returns when its work
# is done. On CPU it does: torch computes on the calling thread, and `dist.all_reduce` on CPU
# tensors (gloo) returns once the reduced values are in place, so the two `perf_counter` readings
# around it enclose the whole collective. On GPUs it does not: CUDA kernels and NCCL collectives
# are queued on a stream, and the call returns as soon as the work is enqueued (torch's
# documentation: a synchronous collective on CUDA tensors is not guaranteed to be complete when
# it returns). `perf_counter` around an NCCL `all_reduce` measures little more than the launch,
# and the real wait lands in whatever next waits for the GPU. On CUDA, call
# `torch.cuda.synchronize()` before each clock reading, or time on the device with CUDA events
# (`torch.cuda.Event(enable_timing=True)`) or the profiler's CUDA activity. The course's timers
# read the clock through `measure.clock(device)`, which synchronizes first when `device` (or the
# tensor passed) is on CUDA and does nothing more than `perf_counter` on CPU;
# `tests/test_measure.py` checks both, and that every timer in `measure` uses it.
#
# Timing is one of several things that change between gloo ranks on CPUs and NCCL ranks on
# GPUs. The course handles all of them in one module, `course_utils.runtime.backend`; every demo
# worker goes through it, so the worker that runs here on gloo runs unchanged on a GPU machine
# (`launch.run` picks NCCL when there is one GPU per rank):

# %%
print(backend.differences_table())

# %%
run_spec = replace(spec, steps=10, log_every=3, track_memory=True)
results = launch.run(functools.partial(measure.dp_train, spec=run_spec), 2, timeout_s=120,
                     threads_per_rank=1, live_rank=0)
worst = measure.check_losses(results[0]["losses"], measure.reference_losses(run_spec), atol=1e-4)
print(f"verified: losses equal single-process training (max |diff| < 1e-4: {worst < 1e-4})")

# %% [markdown]
# `measure.summarize` gives one row per rank: mean milliseconds per phase and per step, this
# rank's throughput (its tokens / its step time), the global throughput (the global batch / the
# slowest rank's step time), and the fraction of the step spent inside the collective
# (`wait/step`). `idle` is the part of the wait spent waiting for the *other* rank: a rank's
# wait minus the smallest wait of any rank in the same step.

# %%
# NBVAL_IGNORE_OUTPUT
balanced = measure.summarize(results)
HEADERS = {"data_ms": "data", "forward_ms": "forward", "backward_ms": "backward",
           "wait_ms": "wait", "optimizer_ms": "optimizer", "step_ms": "step", "idle_ms": "idle",
           "tokens_per_s": "tokens/s", "wait_fraction": "wait/step"}
print("mean ms per step, tokens/s of this rank, fraction of the step spent waiting")
print(measure.format_table(balanced, ["rank", "data_ms", "forward_ms", "backward_ms", "wait_ms",
                                      "optimizer_ms", "step_ms", "idle_ms", "tokens_per_s",
                                      "wait_fraction"], headers=HEADERS))
print(f"global throughput: {balanced[0]['global_tokens_per_s']:,.0f} tokens/s "
      "(512 tokens / the slowest rank's step)")

# %% [markdown]
# Throughput is plain arithmetic on the step time: 512 tokens per step over the step's seconds.
# If a step takes 25 ms, the two ranks together process 512 / 0.025 = 20,480 tokens/s, each rank
# 256 / 0.025 = 10,240.

# %%
print(f"{measure.throughput(512, 0.025):,.0f} tokens/s globally, "
      f"{measure.throughput(256, 0.025):,.0f} per rank; "
      f"a 5 ms wait is {measure.wait_fraction(0.005, 0.025):.0%} of that step")

# %% [markdown]
# ### Memory: the prediction, the count, and the peak
#
# This run keeps everything in fp32 and uses AdamW: the `fp32_adam` layout of Module 1, 4 + 4 +
# 8 = 16 bytes per parameter. Counting the real tensors (each storage once) gives the same
# figure, plus AdamW's per-parameter `step` counters (4 bytes per parameter *tensor*, not per
# element, so a bytes-per-parameter layout leaves them out).

# %%
counted = results[0]["state_bytes"]
predicted = memory.state_bytes(N, "fp32_adam")
lay = memory.layout("fp32_adam")
print(f"{'':10s} {'predicted':>10s} {'counted':>10s}")
for key, per_param in (("weights", lay.weights), ("grads", lay.grads),
                       ("optimizer", lay.optimizer)):
    print(f"{key:10s} {N * per_param:>10,} {counted[key]:>10,}")
print(f"{'other':10s} {0:>10,} {counted['other']:>10,}   <- {len(list(model.parameters()))} "
      "step counters x 4 B")
print(f"{'total':10s} {predicted:>10,.0f} {counted['total']:>10,}")

# %% [markdown]
# Persistent state is not the peak. `MemTracker` (a private torch tool that works on CPU; the
# course pins torch) watches every allocation during the last step and reports the largest
# total it saw, split by what the bytes were:

# %%
# NBVAL_IGNORE_OUTPUT
peak = results[0]["peak_bytes"]
for key, value in peak.items():
    print(f"{key:11s} {value:>10,} B")
print(f"peak / persistent state = {peak['total'] / counted['total']:.1f}")

# %% [markdown]
# For this small model the saved activations (the batch's intermediate tensors kept for
# backward) are the largest item at the peak, bigger than weights, gradients and Adam state
# together, and the peak is more than twice the persistent state. A bar chart of persistent
# bytes is a lower bound, never a measured peak. (On a GPU, `torch.cuda.max_memory_allocated()`
# gives the peak directly; this notebook runs on CPU, where torch has no such counter.)
#
# ### ZeRO-1 on real ranks
#
# Module 3 predicted that ZeRO-1 leaves each of D ranks 1/D of the optimizer bucket. With
# `torch.distributed.optim.ZeroRedundancyOptimizer` (AdamW inside) on two ranks, the count is:

# %%
zero_spec = replace(spec, steps=2, optimizer="zero1_adamw")
zero_res = launch.run(functools.partial(measure.dp_train, spec=zero_spec), 2, timeout_s=120,
                      threads_per_rank=1)
zero_pred = memory.zero_state_bytes(N, dp=2, stage=1, layout_name="fp32_adam")["optimizer"]
for r in zero_res:
    print(f"rank {r['rank']}: Adam moments {r['state_bytes']['optimizer']:,} B "
          f"(predicted {zero_pred:,.0f}), step counters {r['state_bytes']['other']} B")
print("sum over ranks:", f"{sum(r['state_bytes']['optimizer'] for r in zero_res):,}",
      f"= {N:,} x 8 B: {sum(r['state_bytes']['optimizer'] for r in zero_res) == 8 * N}")

# %% [markdown]
# The total is exactly the unsharded 8 bytes/parameter, but the split is uneven: PyTorch's ZeRO
# assigns *whole parameters* to ranks (greedily, largest first), so the ideal N/D holds only on
# average. Training still matches plain AdamW (the loss check above covers `zero1_adamw` in the
# tests).
#
# ### Communication: bytes on the wire
#
# The course's prediction for a ring all-reduce of B bytes is that each rank sends
# 2(D-1)/D x B: (D-1)/D x B in the reduce-scatter half and as much again in the all-gather half.
# The gradients are N fp32 values. What the ranks really wrote during each step's all-reduce:

# %%
grad_bytes = 4 * N
sent = results[0]["steps"][-1]["bytes_sent"]
pred2 = measure.predicted_allreduce_bytes(grad_bytes, 2)
print(f"D=2: gradient {grad_bytes:,} B, predicted sent per rank {pred2:,.0f} B, "
      f"measured / predicted = {sent / pred2:.3f}")
four = launch.run(functools.partial(measure.allreduce_bytes_sent, n_elements=N), 4,
                  timeout_s=120, threads_per_rank=1)
pred4 = measure.predicted_allreduce_bytes(grad_bytes, 4)
print(f"D=4: predicted sent per rank {pred4:,.0f} B, measured / predicted = "
      f"{[round(r['bytes_sent'] / pred4, 3) for r in four]}")

# %% [markdown]
# gloo's all-reduce sends what the ring formula says, plus a few dozen bytes of header per
# message (under 0.3% here). Going from 2 to 4 ranks raises the bytes each rank sends by half
# (from 1x to 1.5x the gradient size), not by 2x: the per-rank volume approaches 2x the
# gradient and stays there however many ranks join.

# %% [markdown]
# ## 3. A straggler: where does the wait go?
#
# Now make rank 1 slow: it sleeps 100 ms inside its forward pass every step (think of a slower
# device, a noisy neighbour or a slow data loader). Nothing else changes.

# %%
slow_spec = replace(spec, steps=6, straggler_rank=1, straggler_delay_s=0.1)
slow = measure.summarize(launch.run(functools.partial(measure.dp_train, spec=slow_spec), 2,
                                    timeout_s=120, threads_per_rank=1))

# %%
# NBVAL_IGNORE_OUTPUT
print(measure.format_table(slow, ["rank", "forward_ms", "wait_ms", "idle_ms", "step_ms",
                                  "tokens_per_s", "wait_fraction"], headers=HEADERS))
fig, axes = plt.subplots(2, 1, figsize=(9, 4), sharex=True)
measure.plot_step_breakdown(balanced, "balanced", ax=axes[0])
measure.plot_step_breakdown(slow, "rank 1 sleeps 100 ms in forward", ax=axes[1], legend=False)
_ = axes[0].set_xlabel("")
fig.tight_layout()
plt.show()

# %% [markdown]
# The slow rank's own numbers look healthy: its wait is short, because by the time it reaches
# the all-reduce its peer is already there. The **fast** rank shows the problem, as about
# 100 ms of extra waiting inside the collective, and both ranks' step time (and so everyone's
# throughput) drops to the slow rank's pace. When you hunt a straggler, look for the rank that
# waits *least*; the ranks that wait most are the victims.

# %% [markdown]
# ## 4. The profiler's view
#
# `torch.profiler` records every operator. `dp_train(..., profile=True)` wraps each phase in a
# `record_function` label and profiles the steps after the warm-up; `measure.profile_rows`
# reduces the profile to milliseconds per step for the five phases, then the operators with the
# most self time; `measure.profile_table` sets the ranks side by side (the top three operators
# of each rank; `-` where an operator is not among a rank's top six). Here with the straggler
# again, so there is waiting to see:

# %%
# NBVAL_IGNORE_OUTPUT
prof_spec = replace(slow_spec, steps=3, profile=True)
prof_res = launch.run(functools.partial(measure.dp_train, spec=prof_spec), 2, timeout_s=120,
                      threads_per_rank=1, show_output=False)
print(measure.profile_table(prof_res, top=3))

# %% [markdown]
# How to read it:
#
# * The phase rows add up to the step; the operator rows show where compute goes (`aten::mm`,
#   `aten::addmm` for the linear layers, the attention kernels).
# * The gloo all-reduce runs on a background thread. The calling thread only hands it over
#   (`c10d::allreduce_`) and then **blocks** until it is done; that blocking is not an operator,
#   so it appears as self time of the `wait` region, not in any operator row. On the fast rank
#   `wait` is large; on the straggler `forward` is (its `time.sleep` is not an operator either).
#   With NCCL the calling thread does not wait for the collective: it runs as a GPU kernel, and
#   its time appears only in the GPU part of a profile (`ProfilerActivity.CUDA`).
# * Profiling itself costs time: compare the totals with the unprofiled run above.
#
# `prof.key_averages().table(...)` prints the full table; `prof.export_chrome_trace(path)` writes
# a timeline you can open in `chrome://tracing` or Perfetto.

# %% [markdown]
# ## 5. Predictions next to measurements
#
# | quantity | course's prediction | measured here |
# | --- | --- | --- |
# | persistent state, fp32 AdamW | 16 B x N = 1,766,400 B | 1,766,520 B (+ 120 B of `step` counters) |
# | ZeRO-1 Adam moments per rank, D = 2 | 8N / 2 = 441,600 B | 442,368 and 440,832 B (whole parameters per rank) |
# | all-reduce bytes sent per rank, D = 2 | 2(D-1)/D x 441,600 = 441,600 B | 1.001 x prediction |
# | all-reduce bytes sent per rank, D = 4 | 662,400 B | 1.003 x prediction |
# | loss, distributed vs single process | equal | equal within 1e-4 |
# | gradient, distributed vs single process | equal | equal (rtol 1e-4); bugs give x2 and x0.5 |
# | peak memory | persistent state is a lower bound | peak more than 2x the persistent state |
# | straggler | the step runs at the slowest rank's pace | the fast rank's wait grows by the delay |
#
# The pipeline bubble, (P-1)/(m+P-1), is measured against its prediction in Module 5.
#
# The figures in the first four rows are printed by the cells above and compared on every test
# run; the last rows are asserted in `tests/test_measure.py`.
#
# ## Checklist for a real run
#
# 1. Compare the loss *and the gradient* of one step with a single-process run on the same
#    global batch (a smaller model is fine). Do it again whenever the world size, the
#    accumulation steps or the loss normalization change.
# 2. Time each phase per rank; report tokens/s for the global batch, not per rank.
# 3. Measure time inside collectives per rank. Equal, large waits on every rank: the run is
#    communication-bound. One rank waiting much less than the others: it is the straggler. On
#    GPUs, synchronize before each clock reading (`measure.clock`) or use CUDA events: an NCCL
#    call returns once the collective is enqueued, not when it has finished.
# 4. Measure peak memory, not only persistent state.
# 5. Profile one or two steps, after a warm-up, to see which operators or waits dominate.

# %% [markdown]
# **Next**: assignment `a7_measuring` (in your workspace under `assignments/a7_measuring/`)
# practises reading a run's measurements: verify the scaling, compute throughput and wait
# fractions, find the straggler, and time a collective's wait yourself on real ranks. Module 8,
# `08_jax_sharding`, then builds the same plans in JAX, where the compiler inserts the
# collectives; module 10 puts every piece into one trainer and checks it this module's way.
