# %% [markdown]
# # Module 9: Activations, recomputation, overlap and precision
#
# Every "does it fit" answer so far counted persistent state: weights, gradients, optimizer
# state, 16 bytes per parameter in the lesson's layout, 112 GB for a 7B model. Training also
# keeps, from each forward pass until its backward pass, the tensors backward needs: the
# **saved activations**. For a fixed model they grow with batch size and sequence length (as
# s·b·h·L, plus a·s²·b·L where attention's scores are stored), while the state does not; for
# long sequences they rival it. This module
#
# 1. predicts, tensor by tensor, what one block of the course's transformer
#    (`course_utils.models.tiny_lm`) saves, and measures it on real runs to the byte;
# 2. sets that beside the published formula for a GPT layer and beside today's blocks
#    (fused attention, RMSNorm, grouped-query attention, SwiGLU), and evaluates both for 7B models;
# 3. trades memory for compute with activation checkpointing (recomputation), full and
#    selective, and checks that the loss and gradients do not change;
# 4. splits along the sequence, on real ranks, what tensor parallelism keeps whole on every
#    rank (sequence parallelism), and checks it against one device;
# 5. starts the data-parallel all-reduce by buckets during backward, times it on real ranks for
#    several bucket sizes, and checks it against DDP and one device;
# 6. shows on real tensors why the 16-byte layout keeps an fp32 master copy, why fp16 needs
#    loss scaling, and why gradients are summed in fp32.
#
# Helpers: `course_utils.memory.activations`, `course_utils.sequence_parallel`, `course_utils.data_parallel.overlap`
# and `course_utils.memory.precision`.

# %%
import matplotlib.pyplot as plt
import torch

from course_utils import memory, style, zero
from course_utils.memory import activations, precision
from course_utils.models import tiny_lm
from course_utils.widgets.activation_memory import ActivationMemory
from course_utils.widgets.number_formats import NumberFormats

style.use()
torch.set_num_threads(1)  # timings below: one thread, like one rank of several on a machine

# %% [markdown]
# ## 1. What one block saves
#
# `activations.saved_bytes(fn, exclude=...)` runs `fn` under
# `torch.autograd.graph.saved_tensors_hooks`: autograd hands every tensor it keeps for backward
# to a *pack* hook, which here records the size of the tensor's **storage** (its buffer), each
# storage once (a view saves its whole buffer, and two views of one buffer cost it once), the
# parameters left out (they are state, counted already).
#
# The block is TinyLM's: LayerNorm, a QKV matmul, causal attention, an output projection, a
# residual add, LayerNorm, an MLP with GELU, a residual add. Attention is computed with the
# *math* kernel (`SDPBackend.MATH`: softmax(QKᵀ/√d)·V in plain operations). With batch B,
# sequence length T, width D, MLP width F and H heads, everything fp32 (4 bytes), the block
# keeps:

# %%
cfg = tiny_lm.TinyLMConfig(seq_len=256)     # the default sizes: D=64, H=4, F=256, 2 blocks
B, T = 2, 64
terms = activations.block_terms(cfg, batch=B, seq=T)
for name, elements in terms.items():
    print(f"{name:<38}{elements:>9,} elements")
predicted = activations.predicted_block_bytes(cfg, batch=B, seq=T)
measured = activations.measured_block_bytes(cfg, batch=B, seq=T)
print(f"predicted {predicted:,} bytes   measured {measured:,} bytes")

# %% [markdown]
# Eight (B, T, D) tensors, two (B, T, F) for the MLP, four (B, T) LayerNorm statistics, and one
# (B, H, T, T) matrix of attention probabilities. Per block, in bytes:
#
# $$\text{saved} = 4\,(8BTD + 2BTF + 4BT + BHT^2).$$
#
# The last term is quadratic in T. The prediction is exact, not approximate, and it stays
# exact at other sizes (two cases depend on layout: with B = 1 or H = 1 the reshape of V is a
# view of the QKV output, so V keeps that whole buffer alive; `block_terms` says so, and the
# tests check it). The whole model adds the embeddings' token and position ids, the final
# LayerNorm, the head's input, the loss's log-softmax and targets:

# %%
seqs = [32, 64, 128, 256]
rows = {}
for b in (2, 4):
    for t in seqs:
        p = activations.predicted_model_bytes(cfg, batch=b, seq=t)
        m = activations.measured_model_bytes(cfg, batch=b, seq=t)
        rows[(b, t)] = (p, m)
        print(f"B={b} T={t:>3}: predicted {p:>10,} B  measured {m:>10,} B  "
              f"difference {m - p}")

# %% [markdown]
# Doubling T from 128 to 256 more than doubles the bytes: the (B, H, T, T) term quadruples.
# A *fused* attention kernel (flash attention; PyTorch's CPU kernel is picked by default when
# the math backend is not forced) never stores the T x T matrix: it keeps the output and a
# (B, H, T) log-sum-exp and recomputes the probabilities in backward. Its curve is a straight
# line:

# %%
curves = {k: [activations.predicted_model_bytes(cfg, batch=4, seq=t, attention=k) for t in seqs]
          for k in ("math", "fused")}
measured = {k: [activations.measured_model_bytes(cfg, batch=4, seq=t, attention=k) for t in seqs]
            for k in ("math", "fused")}
labels = {"math": "math attention", "fused": "fused attention"}
ax = activations.plot_bytes_vs_seq(seqs, {labels[k]: v for k, v in curves.items()},
                                   {labels[k]: v for k, v in measured.items()},
                                   title="TinyLM, 2 blocks, batch 4: saved for backward")
plt.tight_layout()
plt.show()
print("measured == predicted at every point:", all(curves[k] == measured[k] for k in curves))
for t in (128, 256):
    i = seqs.index(t)
    print(f"T={t}: math {curves['math'][i] / 1e6:.2f} MB, fused {curves['fused'][i] / 1e6:.2f} MB")

# %% [markdown]
# ## 2. The published formula, today's blocks, and the 7B model
#
# Korthikanti et al. (2022, *Reducing Activation Recomputation in Large Transformer Models*)
# count the same things for a GPT layer in 16-bit (2 bytes) with dropout, s tokens, batch b,
# hidden size h and a heads:
#
# $$\text{bytes per layer} = s\,b\,h\,\Bigl(34 + 5\,\frac{a\,s}{h}\Bigr).$$
#
# | part of a layer | what it keeps (16-bit; a dropout mask is 1 byte an element) | bytes per s·b·h |
# | --- | --- | --- |
# | attention | QKV input 2, Q and K 4, V 2, projection input 2, dropout mask 1 | 11 |
# | MLP | input 2, GELU input 8 and output 8 (4h wide), dropout mask 1 | 19 |
# | two LayerNorms | their inputs, 2 each | 4 |
# | **the (s, b, h)-sized tensors** | | **34** |
# | attention matrix, per head (a·s² per sequence) | softmax output 2, dropout mask 1, dropout output 2 | 5·a·s/h |
#
# TinyLM has no dropout and F = 4D: in 16-bit it would keep 32 s·b·h + 2 a·s²·b plus the
# LayerNorm statistics, the same structure without the masks.
#
# The 5as/h term is the attention matrix of an **unfused** kernel, the one the paper counts.
# A fused kernel keeps its output and a (b, a, s) fp32 log-sum-exp instead (section 1 measured
# that on this CPU: PyTorch's `scaled_dot_product_attention` picks its fused kernel unless the
# math backend is forced), so the term becomes 4·a·s·b bytes per layer. Fused is the case to
# plan with; `korthikanti_bytes(..., attention="fused")` counts it. For the lesson's 7B model
# (h = 4096, a = 32 heads, 32 layers) at s = 4096, b = 1:

# %%
seven_b = dict(s=4096, b=1, h=4096, a=32, layers=32)
state_gb = memory.state_bytes(7e9) / 1e9
for attention in ("fused", "math"):
    for mode in activations.RECOMPUTES:
        gb = activations.korthikanti_bytes(**seven_b, recompute=mode, attention=attention) / 1e9
        print(f"attention={attention:<6} recompute={mode:<10} activations {gb:7.2f} GB"
              f"   (state: {state_gb:.0f} GB)")
per_layer = activations.korthikanti_bytes(**seven_b) / 32
print(f"unfused, one layer: {per_layer / 1e9:.2f} GB, of which the a*s^2 term "
      f"{5 * 32 * 4096**2 / 1e9:.2f} GB")

# %% [markdown]
# With fused attention one 4096-token sequence keeps **18.27 GB** of activations (34 s·b·h per
# layer plus 16.8 MB of log-sum-exps), a sixth of the 112 GB of state. Selective
# recomputation of the attention core then saves only the log-sum-exps (18.25 GB): the fused
# kernel already recomputes the matrix in backward, so with it selective recomputation is
# redundant. The paper's unfused count stores the matrix: about 104 GB, more than an 80 GB
# device holds; the quadratic term is 82% of it (2.68 of 3.25 GB per layer). That is the case
# selective recomputation was designed for, and the one section 3 runs on TinyLM's math kernel.
#
# ### Today's blocks
#
# The 34 is a 2022 GPT layer: LayerNorm, GELU MLP 4h wide, dropout. Llama-style blocks have
# RMSNorm, no biases, no dropout, grouped-query attention (g key/value heads shared by the a
# query heads) and a SwiGLU MLP, down(SiLU(gate(x)) · up(x)), F wide.
# `activations.ModernBlock` is one such block; `modern_block_terms` lists what it saves, tensor
# by tensor, and `modern_constant` divides by s·b·h. With a fused RMSNorm (it keeps its input
# and 1/rms) and 16-bit values:
#
# $$\text{bytes per layer} = s\,b\,h\,\Bigl(12 + 4\,\frac{g}{a} + 8\,\frac{F}{h}\Bigr):$$
#
# the two norms' inputs and outputs 8, Q 2 and the attention output 2, K and V 4g/a, and four
# (s, b, F) tensors of the MLP: gate, up, SiLU(gate) and the product. The published
# configurations (Llama 2 7B: multi-head, F = 11008; Llama 3 8B: g = 8 of 32 heads,
# F = 14336), at s = 4096, b = 1, 32 layers:

# %%
sbh = 4096 * 4096
print(f"{'block':<34}{'bytes per s*b*h':>16}{'GB, 32 layers':>15}")
paper = activations.korthikanti_bytes(4096, 1, 4096, 32, recompute="attention") / sbh
print(f"{'GPT (paper), fused attention':<34}{paper:>16.2f}{paper * sbh * 32 / 1e9:>15.2f}")
for name, block in (("Llama 2 7B", activations.LLAMA2_7B), ("Llama 3 8B", activations.LLAMA3_8B)):
    for norm in activations.NORMS:
        c = activations.modern_constant(block, norm)
        print(f"{name + ', ' + norm + ' RMSNorm':<34}{c:>16.2f}{c * sbh * 32 / 1e9:>15.2f}")

# %% [markdown]
# Today's blocks keep **more** per s·b·h than the paper's 34, not less: dropping dropout saves
# 2, but SwiGLU's four F-wide tensors cost more than GELU's two 4h-wide ones (8F/h = 21.5 and
# 28, against 16), and grouped-query attention saves only on K and V (4 down to 1). (SwiGLU
# here runs as plain operations; a fused SwiGLU kernel that recomputes SiLU(gate) in backward
# keeps three of the four.) The "eager" rows are PyTorch's own `nn.RMSNorm` in bf16: it
# computes in fp32 and autograd keeps fp32 copies of its input and of the normalized input,
# 12 bytes per s·b·h more than a fused kernel. Every row leaves out the per-token statistics
# (1/rms and the log-sum-exps, 136 bytes per token per layer here: under 0.1%), as the paper
# leaves out its own. The counts are measured, not assumed, on small blocks of both kinds, in
# fp32 and bf16, with `saved_tensors_hooks` as in section 1 (the tests sweep more shapes):

# %%
small = activations.ModernBlockConfig(d_model=64, n_heads=4, kv_heads=2, d_ff=160)
for norm in activations.NORMS:
    for dtype in ("bf16", "fp32"):
        p = sum(activations.modern_block_terms(small, 2, 64, norm, dtype).values())
        m = activations.measured_modern_bytes(small, 2, 64, norm, dtype)
        print(f"norm={norm:<6} {dtype}: predicted {p:>8,} B  measured {m:>8,} B")
for name, n in activations.modern_block_terms(small, 2, 64, "eager", "bf16").items():
    if "RMSNorm 1" in name:
        print(f"  eager bf16, {name}: {n:,} B")

# %% [markdown]
# **The output layer.** The loss keeps the log-softmax of the logits, (s·b, V) in fp32
# (TinyLM's `predicted_model_bytes` counts it, and the measurement of section 1 matched): with
# Llama 3's vocabulary of V = 128,256 tokens that is 4·s·V = 2.10 GB per 4096-token sequence,
# three layers' worth (one layer: 41 s·b·h = 0.69 GB), on the last pipeline stage only.
# Kernels that fuse the output projection with the loss and work through the tokens in chunks
# never hold it whole.

# %%
vocab = 128_256
print(f"log-softmax, s = 4096: {4 * 4096 * vocab / 1e9:.2f} GB; one Llama 3 8B layer: "
      f"{activations.modern_constant(activations.LLAMA3_8B) * sbh / 1e9:.2f} GB")

# %% [markdown]
# ## 3. Activation checkpointing: recompute instead of keep
#
# `torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False)` runs `fn` without
# saving its intermediates; backward reruns `fn` from its kept inputs to get them back. Two
# granularities (`activations.forward(model, tokens, recompute=...)`):
#
# * **full**: checkpoint every block. Each block keeps only its input, (B, T, D); backward
#   reruns the whole block forward (about one extra forward pass per step).
# * **selective** (`"attention"`): checkpoint only the attention core softmax(QKᵀ/√d)·V.
#   It keeps Q, K, V (one buffer) and drops the scaled Q and K, V's copy and the T x T
#   matrix, the part that grows with T² but costs few flops to recompute.
#
# Same model, B = 4, T = 256, math attention (with the fused kernel there is no T² term for
# selective recomputation to remove: section 2):

# %%
B, T = 4, 256
names = {"none": "no recomputation", "attention": "selective (attention)", "full": "full (blocks)"}
base_block = activations.predicted_block_bytes(cfg, batch=B, seq=T)
print(f"{'':<24}{'per block':>12}{'measured':>12}{'model':>12}{'saving':>8}")
for mode in activations.RECOMPUTES:
    block = activations.predicted_block_bytes(cfg, batch=B, seq=T, recompute=mode)
    block_m = activations.measured_block_bytes(cfg, batch=B, seq=T, recompute=mode)
    model_m = activations.measured_model_bytes(cfg, batch=B, seq=T, recompute=mode)
    print(f"{names[mode]:<24}{block / 1e6:>9.3f} MB{block_m / 1e6:>9.3f} MB"
          f"{model_m / 1e6:>9.3f} MB{1 - block / base_block:>8.0%}")

# %% [markdown]
# Selective recomputation removes half of each block's bytes at this length (the T² term and
# the scaled copies); full recomputation keeps 3% of them. The model column also holds what
# sits outside the blocks (embeddings, head, loss), which no block checkpoint touches.
#
# Recomputation must not change the result: the rerun forward uses the same weights and the
# same inputs. Loss and every gradient against the run without recomputation, over two seeds:

# %%
for seed in (0, 1):
    loss, grads = activations.loss_and_grads(cfg, batch=B, seq=T, recompute="none", seed=seed)
    for mode in ("attention", "full"):
        loss_r, grads_r = activations.loss_and_grads(cfg, batch=B, seq=T, recompute=mode,
                                                     seed=seed)
        diff = max((grads[n] - grads_r[n]).abs().max().item() for n in grads)
        print(f"seed {seed}, {names[mode]:<22} loss difference {loss_r - loss:.1e}  "
              f"largest gradient difference {diff:.1e}")

# %% [markdown]
# Identical, bit for bit. The price is time: one forward and backward step each way (one
# thread, median of five; these timings vary from run to run and are not compared by the
# tests):

# %%
# NBVAL_IGNORE_OUTPUT
times = {mode: activations.step_time(cfg, batch=B, seq=T, recompute=mode, repeats=5)
         for mode in activations.RECOMPUTES}
for mode, s in times.items():
    print(f"{names[mode]:<24}{1e3 * s:7.1f} ms per step  ({s / times['none']:.2f}x)")

# %% [markdown]
# Full recomputation reruns every forward: on a GPU, where a step is mostly matmuls, it costs
# about a third more time (forward is about a third of a step). Selective recomputation reruns
# only the attention core, a few percent of the flops. On this small CPU model, one thread,
# the ratios differ (attention is a larger share of the work here) and vary between runs.
#
# **Partial recomputation.** Between none and full there is every number of blocks in
# between: checkpoint only the first k of L blocks and keep the rest (Megatron's
# `--recompute-method block --recompute-num-layers k`). Each checkpointed block takes the same bytes off, so the budget can
# be met with the fewest recomputed blocks. `forward(..., recompute="full", layers=k)`, a
# 4-block TinyLM, B = 4, T = 256, math attention:

# %%
cfg4 = tiny_lm.TinyLMConfig(seq_len=256, n_layers=4)
for k in range(5):
    m = activations.measured_model_bytes(cfg4, batch=4, seq=256, recompute="full", layers=k)
    p = activations.predicted_model_bytes(cfg4, batch=4, seq=256, recompute="full", layers=k)
    print(f"{k} of 4 blocks recomputed: measured {m / 1e6:6.2f} MB  (predicted equal: {m == p})")

# %% [markdown]
# 8.14 MB less per recomputed block, from 34.43 MB (none) to 1.86 MB (all four).
#
# **Offloading** is the other trade: keep the saved tensors, but in host memory.
# `torch.autograd.graph.save_on_cpu(pin_memory=True)` is a `saved_tensors_hooks` context, the
# mechanism `saved_bytes` uses (its pack hook copies each saved tensor to pinned host memory,
# its unpack hook copies it back in backward: `torch/autograd/graph.py`, `class save_on_cpu`);
# the price is PCIe traffic, which overlaps compute only if the copies run on a stream of their
# own. On this CPU-only machine there is no device memory to save, so the course only shows
# that it is the same hook:

# %%
print("save_on_cpu is a saved_tensors_hooks:",
      issubclass(torch.autograd.graph.save_on_cpu, torch.autograd.graph.saved_tensors_hooks))

# %% [markdown]
# **Measuring the real peak.** `saved_bytes` counts exactly what autograd keeps; the peak of a
# step also holds the gradients, the optimizer's temporaries and each operation's workspace.
# On a GPU, `torch.cuda.reset_peak_memory_stats()` and `torch.cuda.max_memory_allocated()` give
# the peak of the caching allocator, and `torch.cuda.memory._record_memory_history()` followed
# by `torch.cuda.memory._dump_snapshot("step.pickle")` (`torch/cuda/memory.py`) records every
# allocation with its stack, to be read at pytorch.org/memory_viz. On a GPU machine the
# course's `benchmarks/gpu_check.py` measures `measured_block_bytes` on CUDA and reads the
# allocator's peak beside module 1's state count.
#
# ## 4. Sequence parallelism: split what tensor parallelism replicates
#
# Module 4's tensor parallelism (TP) splits a block's matmuls over t ranks: each rank holds
# a slice of the heads and of the MLP features, so their saved tensors shrink by t. The rest
# of the block, the two LayerNorms, the residual adds and dropout, runs on the whole (b, s, h)
# activation on **every** rank: TP copies it, and so does what it saves. That is the **10 s·b·h**
# in Korthikanti et al.'s form with tensor parallelism,
#
# $$\text{bytes per layer} = s\,b\,h\,\Bigl(10 + \frac{24}{t} + 5\,\frac{a\,s}{h\,t}\Bigr):$$
#
# the LayerNorm inputs (4), the LayerNorm outputs that feed the QKV and MLP matmuls (4) and
# the two dropout masks (2), the same on all t ranks. LayerNorm, dropout and the residual add
# treat each token on its own, so they can run on a slice of the sequence, (b, s/t, h) per
# rank, with no communication at all. **Sequence parallelism** (SP, Korthikanti et al. 2022,
# section 4.2.2) does that, and swaps TP's two conjugates (module 4's f and g) for two others
# at the borders between "tokens split" and "heads or features split":
#
# | operator | forward | backward | placed |
# | --- | --- | --- | --- |
# | TP's f | identity | all-reduce | before the column-parallel linear (QKV, MLP up) |
# | TP's g | all-reduce | identity | after the row-parallel linear (output projection, MLP down) |
# | SP's g | all-gather along the sequence | reduce-scatter | where TP's f was |
# | SP's ḡ | reduce-scatter along the sequence | all-gather | where TP's g was |
#
# A ring all-reduce *is* a reduce-scatter followed by an all-gather, so the forward pass sends
# the same bytes as TP's. `sequence_parallel.compare` runs module 4's block (LayerNorm,
# attention, residual, LayerNorm, MLP, residual; no dropout, so that one device can be matched
# exactly) as TP and as TP + SP on 2 gloo ranks, counts what each rank saves with
# `activations.saved_bytes`, logs every collective, and checks every output and gradient
# against one device, over two seeds. (Its reduce-scatter is built from `all_to_all_single`:
# gloo's own `reduce_scatter_single` works, but sends what an all-reduce sends; the cell after
# the table measures both.)

# %%
from course_utils import sequence_parallel

sp_run = sequence_parallel.compare(tp_size=2, seeds=(0, 1), timeout_s=120)
print(sequence_parallel.report(sp_run))

# %% [markdown]
# | per rank, this block (fp32) | saved bytes | of which the LayerNorm part | forward sends | backward sends |
# | --- | --- | --- | --- | --- |
# | one device | 6,400 | 2,176 | | |
# | TP, t = 2 | 4,288 | 2,176 (whole on every rank) | 1,024 | 1,024 |
# | TP + SP, t = 2 | 3,200 (one device's / 2) | 1,088 | 1,024 | 1,536 |
#
# One device's 6,400 bytes are 4(8BTC + 2BTF + 4BT + BHT) with the fused CPU attention kernel.
# TP halves only the heads' and features' part; the LayerNorm part, 4BTC + 4BT elements (the
# two LayerNorms' inputs, outputs and statistics: Korthikanti's 10 s·b·h without the dropout
# masks, in fp32), stays whole on every rank until SP splits it. Predicted and measured agree to
# the byte. Backward sends more with SP because, as in Megatron, each rank keeps only its slice
# of the two LayerNorm outputs and all-gathers it again in backward for the weight gradients
# (in Megatron's `LinearWithGradAccumulationAndAsyncCommunication.backward` that all-gather
# runs during the input-gradient matmul, and the input gradient's reduce-scatter during the
# weight-gradient matmul). Keeping the gathered
# outputs instead costs their bytes and makes backward's bytes equal too:

# %%
kept = sequence_parallel.compare(tp_size=2, seeds=(0, 1), regather=False, timeout_s=120)
backward = sequence_parallel.comm_summary(kept.comms["sp"], 2)["backward"]
print(f"TP + SP, gathered LayerNorm outputs kept: {kept.saved_bytes['sp'][0]:,} bytes per rank")
print(f"backward ring sends {backward['ring_bytes']:,.0f} B; equal to one device: {kept.equal}")

# %% [markdown]
# Why build the reduce-scatter from an all-to-all? Each rank's bytes written to its sockets
# (`measure.bytes_written`), per form, as a fraction of the tensor reduced (4 MiB of fp32):

# %%
for t in (2, 4):
    sent = sequence_parallel.reduce_scatter_bytes(world_size=t)    # t real gloo ranks
    print(f"t = {t}: " + ", ".join(f"{name} {frac:.3f}" for name, frac in sent.items())
          + f"   (ring reduce-scatter: (t-1)/t = {(t - 1) / t:.3f})")

# %% [markdown]
# gloo's `reduce_scatter_single` sends 2(t-1)/t of the tensor, what an all-reduce of all of it
# sends, and then keeps one slice: twice a ring reduce-scatter's (t-1)/t. The all-to-all form
# sends each rank's chunk j straight to rank j, (t-1)/t, the ring's bytes, so TP + SP's forward
# matches TP's all-reduce byte for byte.

# %% [markdown]
# One more collective is needed: each rank's LayerNorm weights (and the biases added after
# ḡ) see only its tokens, so their gradients are summed over the TP ranks once per step, a few
# all-reduces of h values each, nothing next to the activations. For the 7B model of section 2
# with TP over t = 8 GPUs, Korthikanti's form gives per GPU (`korthikanti_bytes(..., tp=, sp=)`):

# %%
for mode in ("none", "attention"):
    tp_gb = activations.korthikanti_bytes(**seven_b, recompute=mode, tp=8) / 1e9
    sp_gb = activations.korthikanti_bytes(**seven_b, recompute=mode, tp=8, sp=True) / 1e9
    print(f"recompute={mode:<10} tp=8: {tp_gb:6.2f} GB per GPU   tp=8 + sp: {sp_gb:6.2f} GB")

# %% [markdown]
# Without recomputation SP takes 17.72 GB down to 13.02 GB per GPU: s·b·h (34 + 5as/h) / t,
# every term divided by t. With selective recomputation the attention matrix is gone and the
# replicated 10 s·b·h is most of what TP leaves (10 of 13 s·b·h per layer): SP divides it too,
# 6.98 GB down to 2.28 GB, 34 s·b·h / t. Selective recomputation plus sequence parallelism is
# the combination Korthikanti et al. recommend: next to the 104 GB one GPU would keep, each of
# the 8 keeps 2.28 GB, and no block is recomputed whole. (With fused attention the same split
# holds: the attention matrix was never stored, and SP leaves each GPU 34 s·b·h / t.)
#
# ### Try it: the activation calculator
#
# The calculator below is `korthikanti_bytes` for GPT-style models of 7B, 13B and 70B
# parameters, against the training state per GPU (16 B per parameter, split over the TP
# ranks), and plots every recomputation mode against the sequence length. It starts at
# section 2's 7B model, one 4096-token sequence, fused attention. **Predict, then move the
# controls:**
#
# 1. Double the sequence length to 8192. With the fused kernel, what do the activations become?
#    And with the math (unfused) kernel? Predict both before you switch.
# 2. At t = 8 with selective recomputation, SP took the 7B model from 6.98 to 2.28 GB per GPU
#    (math kernel). Is SP's saving larger or smaller without recomputation? Predict, then try.

# %%
ActivationMemory(model="7B", seq_len=4096, batch=1, attention="fused")

# %% [markdown]
# **Context parallelism is not sequence parallelism.** SP splits the sequence only where the
# work is token by token; attention, inside TP's region, still sees the whole sequence (the
# all-gather before QKV). Context parallelism (CP) splits attention too: each of c ranks keeps
# s/c tokens' Q, K and V through the whole layer, and the K, V blocks travel around a ring of
# the c ranks (ring attention: one point-to-point step per neighbour, module 8's `ppermute`),
# each rank merging the partial softmax results with the log-sum-exps a fused kernel keeps
# anyway. Every activation, the attention part included, shrinks by c; the price is c - 1
# steps of K and V per layer, which can travel while the previous block is computed.
#
# **Pipelines multiply it.** A pipeline stage keeps the activations of every micro-batch
# whose forward pass it has run and whose backward pass it has not. Module 5's simulator counts
# them (`Timeline.peak_activations`, in whole-stage micro-batches), p = 4 stages, m = 8
# micro-batches:

# %%
from course_utils.pipeline import schedule as pipeline_schedule

for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
    peaks = pipeline_schedule.simulate(name, p=4, m=8, v=v).peak_activations()
    print(f"{name:<12} v={v}: micro-batches held by stage 0..3: {peaks}")
print("Korthikanti's factor for stage 0, interleaved v = 2: p (1 + (p - 1) / (p v)) =",
      4 * (1 + 3 / (4 * 2)))

# %% [markdown]
# GPipe holds all m; 1F1B's first stage holds p, the last one 1. Stage 0 holds p micro-batches
# of L/p layers each, the activations of the **whole model for one micro-batch**, whatever p
# is: pipelining splits the weights p ways, not stage 0's activations. Interleaving (v chunks
# per rank) adds a factor 1 + (p - 1)/(p v), 5.5 instead of 4 here, as Korthikanti et al.
# (section 4.2.3) count it.
#
# ## 5. Overlap: all-reduce by buckets during backward
#
# A data-parallel step (Module 2) all-reduces the gradients after backward. But backward
# produces them last layer first: the last layer's gradient is final while backward still has
# every other layer to go, and the network sits idle. **Bucketing** starts the communication
# early. The gradients are grouped, in the order backward produces them (reverse parameter
# order), into buckets of about `bucket_mb` MiB. A hook on each parameter
# (`register_post_accumulate_grad_hook`, called once its `.grad` is final) counts down its
# bucket; when the bucket is complete, its gradients are copied into one flat buffer and
# `dist.all_reduce(flat, async_op=True)` starts. The call returns a *work handle* at once and
# backward goes on while the bucket travels. After backward: `work.wait()` on every handle,
# divide by D, copy back. That is `overlap.BucketAllReduce(model, bucket_mb=...)`; DDP does the
# same inside `DistributedDataParallel(model, bucket_cap_mb=...)`, with two differences shown on
# real DDP below: its first step all-reduces everything as one bucket and then rebuilds the
# buckets in the order the gradients became ready, and with `bucket_cap_mb` left unset its first
# bucket is capped at 1 MiB and the others at 25 MiB.
#
# The model: an MLP of 32 layers 256 wide, 8 MiB of fp32 gradients, each layer (weight and
# bias) just over 0.25 MiB. A bucket closes as soon as it holds at least its size:

# %%
from course_utils.data_parallel import overlap

mlp = overlap.make_mlp(width=256, depth=32)
sizes = overlap.param_sizes(mlp)                         # [(name, bytes)], parameter order
print(f"{len(sizes)} parameters, {sum(b for _, b in sizes) / 2**20:.2f} MiB of gradients")
for mb in overlap.BUCKET_SIZES:
    buckets = overlap.bucket_assignment(sizes, mb)       # names per bucket, backward's order
    print(f"{overlap.bucket_name(mb):>15}: {len(buckets):>2} bucket(s) of "
          f"{len(buckets[0]) // 2:>2} layer(s)")
print("the first 1 MiB bucket:", overlap.bucket_assignment(sizes, 1.0)[0])

# %% [markdown]
# Real DDP on 2 gloo ranks, its buckets read by a comm hook (`ddp.register_comm_hook`: the
# hook gets each bucket as DDP hands it over) over three steps, in bytes, with
# `static_graph=False` (the default) and `True`:

# %%
ddp_runs = overlap.ddp_buckets((None, 1.0), steps=3, static_graph=(False, True))  # 2 gloo ranks
for name, steps in ddp_runs.items():
    print(f"{name:>29}: " + " | ".join(f"step {i + 1}: {len(b)} x {b[0] / 2**20:.2f} MiB"
                                       if len(set(b)) == 1 else
                                       f"step {i + 1}: " + " + ".join(f"{x / 2**20:.2f}" for x in b)
                                       + " MiB" for i, b in enumerate(steps)))
print("the course's 1 MiB buckets:", len(overlap.bucket_copy_bytes(sizes, 1.0)), "x",
      f"{overlap.bucket_copy_bytes(sizes, 1.0)[0] / 2**20:.2f} MiB")
print("first-bucket cap when bucket_cap_mb is unset:",
      torch.distributed._DEFAULT_FIRST_BUCKET_BYTES / 2**20, "MiB")

# %% [markdown]
# From its second step on, DDP with `bucket_cap_mb=1` all-reduces the same eight buckets as
# `BucketAllReduce(model, 1.0)` (a test checks the bytes), and its gradients equal one process's
# (`overlap.check_grads`). Left at its defaults, DDP makes two buckets of this model: the first
# closes once it holds 1 MiB (the last four layers), the second holds the other 7.03 MiB. The
# first step is one bucket because DDP does not bucket before it has seen the order in which
# gradients become ready (`BucketCapacityConfig.compute_bucket_size_limits` in
# `torch/nn/parallel/distributed.py`: "When static_graph or not finding unused params, disable
# initial bucketing"); it records that order during the first backward and rebuilds. With
# `static_graph=True` (a promise that the graph and the set of used parameters never change;
# in return DDP stops searching the graph for unused parameters every step and supports
# reentrant backward and checkpointing run more than once: its docstring, line 743 of that
# file) the rebuild comes
# one step later: two one-bucket steps above. The cost model and the timings below use the
# course's fixed caps.

# %% [markdown]
# When does the communication end? A cost model (`overlap.simulate`): backward takes 12 ms and
# produces the gradients at a steady rate; the all-reduce of a bucket takes a fixed latency
# (0.5 ms: the call, the handshakes) plus its bytes at 1 GB/s; the all-reduces run one at a
# time, in bucket order. The step ends when backward and the last all-reduce are both done:

# %%
grad_bytes = [b for _, b in sizes]
cost = dict(backward_s=12e-3, latency_s=0.5e-3, bytes_per_s=1e9)
timelines = {overlap.bucket_name(mb): overlap.simulate(grad_bytes, bucket_mb=mb, **cost)
             for mb in overlap.BUCKET_SIZES}
for name, s in timelines.items():
    left = sum(end > s["backward"][1] for _, end in s["comm"])   # all-reduces not done yet
    print(f"{name:>15}: step {1e3 * s['step_s']:5.1f} ms, waiting after backward "
          f"{1e3 * s['exposed_s']:4.1f} ms; {left:>2} of {len(s['comm']):>2} all-reduces "
          "unfinished when backward ends")
print("1 MiB, the last two all-reduces (ms):",
      [(round(1e3 * a, 2), round(1e3 * b, 2)) for a, b in timelines["1 MiB"]["comm"][-2:]])
ax = overlap.plot_timeline({k: timelines[k] for k in ("0.25 MiB", "1 MiB", "after backward")})
_ = ax.set_title("Cost model: backward 12 ms; an all-reduce 0.5 ms + bytes at 1 GB/s")
plt.tight_layout()
plt.show()

# %% [markdown]
# With one all-reduce after backward, all of the communication (8.9 ms) is waited for: 20.9 ms
# per step. With 1 MiB buckets the first all-reduce starts 1.5 ms into backward; when backward
# ends at 12 ms the seventh bucket's all-reduce is still running (until 12.37 ms) and the
# eighth, ready only now, queues behind it: 1.9 ms exposed, a step of 13.9 ms. Smaller is not
# better: 32 buckets of 0.25 MiB pay the latency 32 times, the all-reduces fall behind backward
# (17 of them are unfinished when it ends) and the step takes 24.8 ms, worse than no overlap
# at all. Larger is not better either: a bucket starts only
# when its last gradient exists, so 4 MiB buckets start halfway through backward (16.7 ms),
# and a 25 MiB cap (DDP's for every bucket after the first) is more than this whole model: one
# bucket, no overlap.
#
# **On real ranks.** `overlap.measure_overlap` runs `overlap.timing_worker` on 2 gloo ranks
# through `launch.run`. For each bucket size it times, per step, the whole step (forward,
# backward with the buckets starting from the hooks, the waits: averaged gradients in place),
# compute alone (the same forward and backward, hooks off), communication alone (the same
# buckets all-reduced with nothing else running) and the time blocked in `work.wait()` after
# backward: the exposed communication. The table shows the slowest rank's median of 5 steps,
# in ms. Perfect overlap would bring the step down toward max(compute, comm); without
# overlap it is compute + comm:

# %%
# NBVAL_IGNORE_OUTPUT
rows = overlap.measure_overlap(bucket_mbs=overlap.BUCKET_SIZES, world_size=2, steps=5)
print(overlap.format_table(rows))

# %% [markdown]
# How to read this table (its timings change from run to run; the tests never compare them):
#
# - **The overlap is real**: gloo runs the all-reduces on worker threads of its own, so the
#   *wait* column of the bucketed rows is shorter than "after backward"'s.
# - **But the step gains less than the wait suggests**: the two ranks and their gloo threads
#   share this machine's few cores, so communication takes cycles from backward (*step* minus
#   *wait* is backward's time with the all-reduces running: compare it with *compute*). On a
#   2-core machine the step is often close to *compute* + *comm*, and the best bucket size can
#   change from one run to the next.
# - **Where the bytes move without the compute cores** (NCCL on GPUs, below), the cost model's
#   picture is the closer one.
# - Assignment 9 asks you to pick the bucket size from your own measurement;
#   `benchmarks/overlap_buckets.py` prints the same table at other sizes.
#
# Overlap must not change the result. The hand-made buckets and DDP with the same
# `bucket_cap_mb`, against one process on the whole batch (2 ranks, two seeds, a smaller MLP of
# 3 layers 64 wide; 0.01 MiB is one bucket per layer):

# %%
for line in overlap.check_grads(seeds=(0, 1), bucket_mbs=(0.01, 0.02, None)):
    print(line)

# %% [markdown]
# **When overlap cannot help.**
#
# * *No independent work left.* The last bucket holds the first layers' gradients, the last
#   ones backward produces: nothing is left to compute while it travels, so its all-reduce is
#   always exposed. When communication takes longer than backward, the difference is exposed
#   too: overlap hides communication behind compute, it does not make it faster.
# * *Bucket size.* Too small, every call pays its latency (0.25 MiB above); too large, a bucket
#   starts late, and one bucket as large as the model is no overlap at all.
# * *Memory headroom.* Every bucket in flight holds a flat copy of its gradients
#   (`overlap.bucket_copy_bytes`): up to a second copy of all the gradients during backward, on
#   a device that may have no room left (DDP's `gradient_as_bucket_view=True` makes the
#   gradients views into its bucket buffers and saves that copy).
#
# **On GPUs.** NCCL runs every collective on a CUDA stream of its own, so the GPU can compute
# backward's kernels and move a bucket at the same time without the CPU threads gloo competes
# for here (NCCL's kernels still take some of the GPU's cores and memory bandwidth). The calls
# are asynchronous: `dist.all_reduce(..., async_op=True)` returns once the collective is
# enqueued, and `work.wait()` only makes the current stream wait for it, without blocking the
# host. A host clock around them measures nothing: synchronize first (`measure.clock(device)`,
# which every timer in `overlap` uses), or record CUDA events on the streams, or read the
# profiler's trace, where NCCL's kernels overlap backward's. Synchronizing drains NCCL's stream
# too, so on CUDA the wait column reads near 0 and the exposed communication is the step minus
# compute.

# %% [markdown]
# ## 6. Precision: what each byte of the layouts is for
#
# Module 1's layouts differ in precisions: 16 B/param (bf16 weights and gradients, fp32 master
# copy, fp32 Adam moments), 18 B/param (the same with fp32 gradients) and 12 B/param (no
# master copy). Each choice guards against a rounding you can watch on real tensors.
#
# **The master copy (16 vs 12 bytes).** bf16 keeps 8 significant bits: next to 1.0 the gap to
# the next number is 2⁻⁷. An update smaller than half the gap is rounded away, every time:

# %%
for name in ("mixed_adam16", "bf16_adam_no_master", "mixed_adam_fp32_grads"):
    print(f"{memory.layout(name).total} B/param: {memory.layout(name).description}")
print(f"bf16 gap at 1.0: {precision.bf16_gap(1.0)}, at 0.02: {precision.bf16_gap(0.02):.2e}")
result = precision.repeated_update(start=1.0, update=1e-3, steps=100)
print(", ".join(f"{k} {v:.4f}" for k, v in result.items()))

# %% [markdown]
# A hundred updates of 0.001 should move the weight to 1.1. Applied to the bf16 weight
# directly (the 12-byte layout), each is lost and the weight stays 1.0; applied to the fp32
# master copy they add up, and the bf16 copy made from it for the next forward is 1.1016, the
# bf16 number nearest 1.1. The same on a whole weight tensor (normal, std 0.02) with Adam-sized
# steps (about the learning rate):

# %%
for lr in (1e-3, 1e-4, 1e-5, 1e-6):
    print(f"update {lr:.0e}: {precision.fraction_lost(lr):6.1%} of the bf16 weights unchanged")

# %% [markdown]
# At a learning rate of 1e-5, common late in training, 84% of the weights would not move at
# all without the master copy. The 4 bytes per parameter buy updates that add up.
#
# **Try it: one number in every format.** The explorer below stores a value w in fp32, bf16,
# fp16 and fp8 (e4m3, e5m2) with torch's own casts, shows each format's bits, the gap to the
# next number, and whether an update u added to w (in fp32, rounded back, as the 12-byte
# layout adds it) survives (`precision.represent`, `precision.update_lost`; bf16's gap is
# `bf16_gap`'s). It starts at a typical weight, w = 0.02 (the std above), and an update of
# 0.001. **Predict, then move the controls:**
#
# 1. Lower u to 1e-5, the learning rate late in training. In which formats is the update lost
#    now? Half of each format's gap at 0.02 decides: work out bf16's from its gap at 1.0
#    (2⁻⁷), then type u.
# 2. Which of the five formats cannot store w = 1000 at all, and what does torch store
#    instead? Predict, then type it.

# %%
NumberFormats(value=0.02, update=1e-3)

# %% [markdown]
# **Loss scaling (fp16).** fp16 has bf16's two bytes but 5 exponent bits instead of 8: its
# smallest number is about 6e-8, so small gradients flush to zero. Here a loss computed in fp16
# has gradients of about 8e-9. `torch.amp.GradScaler` multiplies the loss by a scale (2¹⁶)
# before backward, so the fp16 gradients are 65536x larger, then divides the fp32 gradients by
# it (`unscale_`) and checks them for inf and nan before the step:

# %%
plain = precision.loss_scaling(init_scale=2.0**16)
print(f"mean |gradient| {plain['mean |gradient|']:.1e}; without scaling "
      f"{plain['zero without scaling']:.1%} of it is exactly zero")
print(f"with scale 2^16: max|error| / max|gradient| {plain['max relative error with scaling']:.1e}, "
      f"step taken: {plain['step taken']}, scale stays {plain['scale after']:.0f}")
big = precision.loss_scaling(init_scale=2.0**40)
print(f"with scale 2^40: step taken: {big['step taken']}, "
      f"scale after x {big['scale after'] / big['scale before']}")
scaler = torch.amp.GradScaler("cpu")                     # its defaults
print(f"GradScaler: init_scale {scaler.get_scale():.0f}, x {scaler.get_backoff_factor()} after "
      f"an inf/nan, x {scaler.get_growth_factor()} after {scaler.get_growth_interval()} "
      "steps in a row without one")

# %% [markdown]
# Without scaling, 99.8% of the gradient is zero; scaled by 2¹⁶ the largest error is 0.04% of
# the largest gradient (max|error| / max|g|, against the fp32 gradient). Too large a scale
# overflows to inf: the scaler then skips that step and halves the scale. Halving alone would
# only ever shrink it; the scaler also doubles the scale after 2,000 steps in a row without an
# inf or nan (`growth_interval`), so the scale keeps probing upward and settles just below
# overflow. bf16 has fp32's exponent range, so bf16 training needs no loss scaling; its problem
# is resolution, the master copy's job.
#
# **Clip after `unscale_`.** A gradient-norm clip (`torch.nn.utils.clip_grad_norm_`) must see
# the true gradients. Between `scaler.scale(loss).backward()` and `scaler.step(opt)` they are
# still multiplied by the scale; PyTorch's AMP recipe calls `scaler.unscale_(opt)` first, then
# clips (`step` knows the gradients are unscaled already and does not divide again). Clipping
# to 1.0 a gradient of norm about 32, both orders, SGD with learning rate 1:

# %%
clip = precision.clip_with_scaler(max_norm=1.0, init_scale=2.0**16)
for order in ("after unscale_", "before unscale_"):
    print(f"clipped {order:<16}: the clip saw norm {clip['norm seen, clipped ' + order]:>12,.2f}, "
          f"the step's norm is {clip['step norm, clipped ' + order]:.2e}")

# %% [markdown]
# Clipped before `unscale_`, the clip saw 65,536 times the norm and shrank the gradient to 1.0;
# `unscale_` then divided it by 65,536 again: a step of 1.5e-5 instead of 1.0, with no error.
#
# **Summing gradients (18 vs 16 bytes).** Each addition of two bf16 numbers rounds to 8
# significant bits. Accumulating micro-batch gradients into a bf16 `.grad`, or all-reducing D
# ranks' gradients in bf16 (Module 3), rounds at every addition; an fp32 buffer rounds once at
# the end. Mean relative error of the mean gradient, against float64:

# %%
print(f"{'terms':>6}{'accumulated in bf16':>22}{'in fp32':>10}"
      f"{'reduced in bf16':>18}{'in fp32':>10}")
for n in (1, 8, 64):
    print(f"{n:>6}{precision.accumulation_error(n, 'bf16'):>22.1e}"
          f"{precision.accumulation_error(n, 'fp32'):>10.1e}"
          f"{zero.sum_rounding_error(n, 'bf16'):>18.1e}{zero.sum_rounding_error(n, 'fp32'):>10.1e}")

# %% [markdown]
# In fp32 the error stays at the one final rounding to bf16 (about 1.4e-3) however many terms
# are summed; in bf16 it grows with the number of terms, to about 5x (accumulation) and 6x
# (reduction) that at 64 terms. Keeping the gradients in fp32 costs 2 bytes per parameter more:
# that is the 18-byte row. Only reducing in fp32 (FSDP's `reduce_dtype=torch.float32` beside a
# bf16 `param_dtype`) is not free either: the reduce-scatter then sends fp32, twice bf16's
# bytes, through an fp32 buffer; and it removes the reduction's rounding only, not the
# accumulation's: micro-batches added into a bf16 `.grad` still round at every addition (the
# left columns).
#
# **fp8: one scale per tensor.** Training in fp8 (1 byte) goes further. `float8_e4m3fn` keeps 3
# fraction bits and covers about 2^-9 to 448; `float8_e5m2` 2 bits, up to 57,344. That range is
# too narrow for raw gradients or activations, so each tensor is multiplied by its own scale
# before the cast (here "current scaling": the largest fp8 value over the tensor's absolute
# maximum) and divided by it after. Gradient-sized values (normal, std 1e-3) rounded to e4m3
# and back:

# %%
for label, kw in (("no scale", dict(scaled=False)), ("per-tensor scale", dict(scaled=True)),
                  ("per-tensor scale, one value of 10", dict(outlier=10.0))):
    r = precision.fp8_cast_error(std=1e-3, fmt="e4m3", **kw)
    print(f"{label:<35}: {r['zero']:6.1%} became zero, mean relative error "
          f"{r['mean relative error']:.1%}")
print("float8_e4m3fn max", torch.finfo(torch.float8_e4m3fn).max,
      "| float8_e5m2 max", torch.finfo(torch.float8_e5m2).max)

# %% [markdown]
# Without a scale two thirds of the values flush to zero; with one, none do and the error is
# e4m3's own rounding (2.3% on average). One large value sets the scale for the whole tensor
# and pushes the small ones back toward zero (1.8% of them lost): why fp8 recipes keep the
# scale per tensor (or per block of a tensor) and keep the master weights, the optimizer and
# the sums in higher precision.
#
# ## Summary
#
# | what | predicted | measured |
# | --- | --- | --- |
# | TinyLM block, math attention | 4(8BTD + 2BTF + 4BT + BHT²) bytes | equal, to the byte |
# | 7B, s = 4096, b = 1, fused attention | 18.27 GB of activations (112 GB state) | (formula) |
# | the same, the paper's unfused count | 104.2 GB | (formula) |
# | Llama 2 7B / Llama 3 8B block, fused RMSNorm, 16-bit | 37.5 / 41 bytes per s·b·h (the paper's: 34) | equal on small blocks, to the byte |
# | selective / full recomputation, B = 4, T = 256 | 50% / 97% of a block's bytes saved | equal |
# | partial recomputation, k of 4 blocks | 8.14 MB less per block | equal |
# | 1F1B, p = 4: stage 0 | p micro-batches (interleaved, v = 2: 5.5) | simulator |
# | TP + SP, 2 ranks, module 4's block | one device's bytes / 2 per rank | equal, to the byte |
# | 7B, tp = 8, selective recomputation | 6.98 GB per GPU, 2.28 GB with SP | (formula) |
# | 1 MiB buckets, cost model (8 MiB, backward 12 ms) | step 13.9 ms (20.9 ms unbucketed) | gradients == DDP == one process |
# | bf16 master copy absent, lr 1e-5 | | 84% of weights never move |
# | fp16, no loss scaling | | 99.8% of gradients zero |
# | clip before `unscale_` (scale 2^16) | | step 1.5e-5 instead of 1.0 |
# | fp8 e4m3, no scale / per-tensor scale | | 67% zero / 2.3% mean error |

# %% [markdown]
# **Next**: assignment `a9_activations` (in your workspace under `assignments/a9_activations/`):
# activation bytes for a new configuration and per GPU with tensor and sequence parallelism,
# which recomputation and micro-batch size fit a memory budget, a function that measures what
# a module saves for backward, the bucket size with the fastest step from your own timings on
# real ranks, and which precision choice a training recipe needs.
