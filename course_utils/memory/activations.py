"""Activation memory: what autograd keeps between forward and backward, predicted and measured.

The persistent-state tables of modules 1 and 3 count weights, gradients and optimizer state.
Training also keeps, from each forward pass until its backward, the tensors backward needs: the
*saved activations*. For a fixed model they grow with batch and sequence length: as s·b·h·L
(sequence, batch, width, layers), plus a·s²·b·L (heads) where attention's scores are stored.

* **Measured**: :func:`saved_bytes` runs a forward pass under
  ``torch.autograd.graph.saved_tensors_hooks`` and adds up the storage of every tensor autograd
  saves, each storage once (views of one buffer share it), parameters left out (they are state,
  counted elsewhere).
* **Predicted**: :func:`predicted_block_bytes` counts, tensor by tensor, what one block of
  :class:`course_utils.models.tiny_lm.TinyLM` saves (fp32, 4 bytes per element), and
  :func:`predicted_model_bytes` adds the embeddings, final norm, head and loss. The two agree
  to the byte (``tests/test_activations.py``).
* **Attention kernels**: ``attention="math"`` computes softmax(QK^T/sqrt(d)) V in plain ops
  (``SDPBackend.MATH``) and saves the (B, H, T, T) probabilities: the term quadratic in T.
  ``attention="fused"`` lets PyTorch pick its fused CPU kernel (flash attention), which saves
  the output and a (B, H, T) log-sum-exp instead and recomputes the probabilities in backward.
* **Recomputation** (activation checkpointing, ``torch.utils.checkpoint`` non-reentrant):
  ``recompute="full"`` keeps only each block's input and reruns the block in backward;
  ``recompute="attention"`` (selective) reruns only the attention core, the part whose saved
  bytes grow with T^2 but whose flops are cheap.
* **The published form** for a GPT layer in 16-bit with dropout (Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", Table 2):
  :func:`korthikanti_bytes`, with ``attention="fused"`` for today's fused kernels, which never
  store the a·s² attention matrix.
* **Today's blocks** (RMSNorm, grouped-query attention, SwiGLU, no biases, no dropout, fused
  attention): :class:`ModernBlock` runs one, :func:`modern_block_terms` predicts what it saves
  (in bytes, each tensor in its own dtype) and :func:`modern_constant` gives the bytes per
  s·b·h, the number that replaces the paper's 34.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from course_utils import style
from course_utils.models import tiny_lm
from course_utils.models.toy import seeded
from course_utils.runtime import clock as timing
from course_utils.runtime.validate import check_bool, check_int, one_of

__all__ = ["ATTENTIONS", "RECOMPUTES", "saved_bytes", "forward", "loss_and_grads", "make_inputs",
           "measured_block_bytes", "measured_model_bytes", "predicted_block_bytes",
           "predicted_model_bytes", "block_terms", "korthikanti_bytes", "NORMS",
           "ModernBlockConfig", "ModernBlock", "modern_block_terms", "measured_modern_bytes",
           "modern_constant", "LLAMA2_7B", "LLAMA3_8B", "step_time", "plot_bytes_vs_seq"]

ATTENTIONS = ("math", "fused")
RECOMPUTES = ("none", "attention", "full")
_FP32 = 4      # bytes per fp32 element: TinyLM runs in fp32 on CPU
_INT64 = 8     # bytes per token id


def _check_cfg(cfg: Any) -> tiny_lm.TinyLMConfig:
    if not isinstance(cfg, tiny_lm.TinyLMConfig):
        raise ValueError(f"cfg must be a tiny_lm.TinyLMConfig; got {type(cfg).__name__}")
    return cfg


def _check_shape(cfg: tiny_lm.TinyLMConfig, batch: Any, seq: Any) -> None:
    check_int("batch", batch)
    check_int("seq", seq)
    if seq > cfg.seq_len:
        raise ValueError(f"seq must be <= cfg.seq_len={cfg.seq_len}; got {seq}")


# ---------------------------------------------------------------------------- measurement


def saved_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = (),
                refs: dict[int, Any] | None = None) -> tuple[int, Any]:
    """Run ``fn()`` and return (bytes of the tensors autograd saved for backward, fn's result).

    Each storage is counted once, whole (a view saves its whole buffer); tensors whose storage is
    one of ``exclude``'s (the parameters) are left out. ``refs``: a dict filled with (a weak
    reference to one saved tensor, its storage's bytes) per counted storage, to see later which
    are still alive.
    """
    if not callable(fn):
        raise ValueError(f"fn must be a callable taking no arguments; got {type(fn).__name__}")
    if isinstance(exclude, torch.Tensor) or not hasattr(exclude, "__iter__"):
        raise ValueError(f"exclude must be an iterable of tensors (e.g. model.parameters()); "
                         f"got {type(exclude).__name__}")
    exclude = list(exclude)
    if not all(isinstance(t, torch.Tensor) for t in exclude):
        raise ValueError("exclude must hold only tensors (e.g. model.parameters()); got "
                         + ", ".join(sorted({type(t).__name__ for t in exclude})))
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in skip and key not in seen:
            seen[key] = storage.nbytes()
            if refs is not None:
                refs[key] = (weakref.ref(t), seen[key])
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    attention: str) -> torch.Tensor:
    """Causal softmax(q k^T / sqrt(d)) v, each (B, H, T, D/H), with the chosen kernel."""
    if attention == "math":
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _block_forward(block: nn.Module, x: torch.Tensor, recompute: str,
                   attention: str) -> torch.Tensor:
    """TinyLM's block forward (same ops, same weights), with optional recomputation."""
    b, t, d = x.shape                                                    # (B, T, D)
    h = block.n_heads
    q, k, v = block.qkv(block.ln1(x)).split(d, dim=-1)                   # 3 x (B, T, D)
    q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D/H)
    if recompute == "attention":
        a = checkpoint(_attention_core, q, k, v, attention, use_reentrant=False)
    else:
        a = _attention_core(q, k, v, attention)                          # (B, H, T, D/H)
    x = x + block.proj(a.transpose(1, 2).reshape(b, t, d))               # (B, T, D)
    return x + block.fc2(F.gelu(block.fc1(block.ln2(x))))               # (B, T, D)


def _check_layers(layers: Any, n_layers: int) -> int:
    """How many blocks recomputation applies to: all of them when ``layers`` is None."""
    if layers is None:
        return n_layers
    check_int("layers", layers, 0)
    if layers > n_layers:
        raise ValueError(f"layers must be <= the model's n_layers={n_layers}; got {layers}")
    return layers


def forward(model: tiny_lm.TinyLM, tokens: torch.Tensor, recompute: str = "none",
            attention: str = "math", layers: int | None = None) -> torch.Tensor:
    """``model(tokens)`` -> logits (B, T, V), with a chosen attention kernel and recomputation
    applied to the first ``layers`` blocks (all when None: partial recomputation otherwise)."""
    if not isinstance(model, tiny_lm.TinyLM):
        raise ValueError(f"model must be a tiny_lm.TinyLM; got {type(model).__name__}")
    one_of("recompute", recompute, RECOMPUTES)
    one_of("attention", attention, ATTENTIONS)
    layers = _check_layers(layers, len(model.blocks))
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError("tokens must be a (batch, seq) int64 tensor")
    b, t = tokens.shape
    if t > model.cfg.seq_len:
        raise ValueError(f"tokens has {t} positions; model.cfg.seq_len is {model.cfg.seq_len}")
    x = model.tok(tokens) + model.pos(torch.arange(t, device=tokens.device))  # (B, T, D)
    for i, block in enumerate(model.blocks):
        mode = recompute if i < layers else "none"
        if mode == "full":
            x = checkpoint(_block_forward, block, x, "none", attention, use_reentrant=False)
        else:
            x = _block_forward(block, x, mode, attention)                  # (B, T, D)
    return model.head(model.ln_f(x))                                      # (B, T, V)


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_inputs(cfg: tiny_lm.TinyLMConfig, batch: int, seq: int,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and targets, each (batch, seq) int64, from ``seed``."""
    _check_shape(_check_cfg(cfg), batch, seq)
    check_int("seed", seed, 0)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(cfg.vocab_size, (batch, seq + 1), generator=g)     # (B, T+1)
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()          # two buffers, even at B = 1


def loss_and_grads(cfg: tiny_lm.TinyLMConfig, batch: int, seq: int, recompute: str = "none",
                   attention: str = "math", seed: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and every parameter's gradient of one step (weights and data from ``seed``)."""
    _check_shape(_check_cfg(cfg), batch, seq)
    check_int("seed", seed, 0)
    model = tiny_lm.build(cfg, seed)
    tokens, targets = make_inputs(cfg, batch, seq, seed)
    loss = _loss(forward(model, tokens, recompute, attention), targets)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def measured_block_bytes(cfg: tiny_lm.TinyLMConfig, batch: int, seq: int,
                         recompute: str = "none", attention: str = "math",
                         device: torch.device | str = "cpu") -> int:
    """Measured bytes one block saves for backward on a (batch, seq, d_model) fp32 input,
    with the block and input on ``device`` (the GPU check runs it on CUDA)."""
    _check_shape(_check_cfg(cfg), batch, seq)
    one_of("recompute", recompute, RECOMPUTES)
    one_of("attention", attention, ATTENTIONS)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device or its name ('cpu', 'cuda'); "
                         f"got {device!r}") from None
    block = tiny_lm.build(cfg, 0).blocks[0].to(device)
    x = torch.randn(batch, seq, cfg.d_model).to(device).requires_grad_(True)  # (B, T, D)
    if recompute == "full":
        run = lambda: checkpoint(_block_forward, block, x, "none", attention,  # noqa: E731
                                 use_reentrant=False)
    else:
        run = lambda: _block_forward(block, x, recompute, attention)  # noqa: E731
    n, _ = saved_bytes(run, exclude=block.parameters())
    return n


def measured_model_bytes(cfg: tiny_lm.TinyLMConfig, batch: int, seq: int,
                         recompute: str = "none", attention: str = "math",
                         layers: int | None = None) -> int:
    """Measured bytes the whole model and its loss save for backward on one (batch, seq) batch,
    recomputation applied to the first ``layers`` blocks (all when None)."""
    _check_shape(_check_cfg(cfg), batch, seq)
    _check_layers(layers, cfg.n_layers)
    model = tiny_lm.build(cfg, 0)
    tokens, targets = make_inputs(cfg, batch, seq, 0)
    n, _ = saved_bytes(lambda: _loss(forward(model, tokens, recompute, attention, layers),
                                     targets), exclude=model.parameters())
    return n


# ------------------------------------------------------------------------------ prediction


def block_terms(cfg: tiny_lm.TinyLMConfig, batch: int, seq: int, recompute: str = "none",
                attention: str = "math") -> dict[str, int]:
    """What one block saves, in elements, by tensor (B = batch, T = seq, D = d_model, F = d_ff,
    H = n_heads); every entry is fp32 (4 bytes per element)."""
    _check_shape(_check_cfg(cfg), batch, seq)
    one_of("recompute", recompute, RECOMPUTES)
    one_of("attention", attention, ATTENTIONS)
    btd, btf, bt, h = batch * seq * cfg.d_model, batch * seq * cfg.d_ff, batch * seq, cfg.n_heads
    if recompute == "full":
        return {"block input": btd}
    terms = {"block input (LayerNorm 1)": btd, "LayerNorm 1 mean, 1/std": 2 * bt,
             "LayerNorm 1 output (QKV matmul)": btd}
    if recompute == "attention":
        terms["Q, K, V (one buffer, recompute input)"] = 3 * btd
    elif attention == "math":
        terms["Q and K, scaled"] = 2 * btd
        # V is reshaped to (B*H, T, D/H) for the batched matmul: a copy, unless B = 1 or H = 1
        # make that reshape a view, which keeps the whole (B, T, 3D) QKV buffer alive
        if batch == 1 or h == 1:
            terms["V (a view: the whole QKV buffer)"] = 3 * btd
        else:
            terms["V"] = btd
        terms["softmax probabilities (B, H, T, T)"] = batch * h * seq * seq
    else:
        terms["Q, K, V (one buffer)"] = 3 * btd
        terms["log-sum-exp (B, H, T)"] = batch * h * seq
    # the attention output: the math kernel's is copied into (B, T, D) for the projection, a
    # fresh buffer; the fused kernel's output is already laid out so that copy is a view of it
    terms["attention output (proj input)"] = btd
    terms.update({"residual (LayerNorm 2 input)": btd, "LayerNorm 2 mean, 1/std": 2 * bt,
                  "LayerNorm 2 output (fc1 input)": btd, "GELU input (B, T, F)": btf,
                  "GELU output (fc2 input)": btf})
    return terms


def predicted_block_bytes(cfg: tiny_lm.TinyLMConfig, batch: int, seq: int,
                          recompute: str = "none", attention: str = "math") -> int:
    """Bytes one TinyLM block saves, from the sizes alone. With the math kernel and no
    recomputation: 4 (8BTD + 2BTF + 4BT + BHT^2)."""
    return _FP32 * sum(block_terms(cfg, batch, seq, recompute, attention).values())


def predicted_model_bytes(cfg: tiny_lm.TinyLMConfig, batch: int, seq: int,
                          recompute: str = "none", attention: str = "math",
                          layers: int | None = None) -> int:
    """Bytes the whole TinyLM and its loss save: n_layers blocks (recomputation applied to the
    first ``layers``, all when None) plus the embedding indices (token ids, positions), the
    final LayerNorm, the head input, log-softmax and targets."""
    layers = _check_layers(layers, _check_cfg(cfg).n_layers)
    blocks = (layers * predicted_block_bytes(cfg, batch, seq, recompute, attention)
              + (cfg.n_layers - layers) * predicted_block_bytes(cfg, batch, seq, "none", attention))
    bt, btd, v = batch * seq, batch * seq * cfg.d_model, cfg.vocab_size
    outside = (_INT64 * (bt + seq)                      # token ids, position ids
               + _FP32 * (btd + 2 * bt + btd)           # final LayerNorm input, stats, output
               + _FP32 * bt * v + _INT64 * bt           # log-softmax (B*T, V), targets
               + _FP32)                                 # the loss's total weight (a scalar)
    return blocks + outside


def korthikanti_bytes(s: int, b: int, h: int, a: int, layers: int = 1, recompute: str = "none",
                      tp: int = 1, sp: bool = False, attention: str = "math") -> float:
    """Activation bytes of a GPT transformer in 16-bit with dropout (Korthikanti et al. 2022,
    Table 2): s tokens, batch b, hidden h, a heads, tensor parallel ``tp``, sequence parallel
    ``sp``. No recomputation and tp = 1: s b h (34 + 5 a s / h) per layer; full recomputation:
    2 s b h (the layer's input), 2 s b h / t with SP (the input is split along the sequence).

    ``attention="math"`` is the paper's count, which stores the attention matrix (softmax output,
    dropout mask and output: 5 a s^2 b bytes). ``attention="fused"`` is a fused kernel (flash
    attention): it keeps its output and an fp32 log-sum-exp, 4 a s b bytes, instead, so that term
    becomes 4 a / h per s·b·h; selective recomputation then changes nothing but that term (the
    kernel already recomputes the matrix in backward)."""
    for name, value in (("s", s), ("b", b), ("h", h), ("a", a), ("layers", layers), ("tp", tp)):
        check_int(name, value)
    one_of("recompute", recompute, RECOMPUTES)
    one_of("attention", attention, ATTENTIONS)
    check_bool("sp", sp)
    if sp and tp == 1:
        raise ValueError("sp=True needs tp > 1 (sequence parallelism splits over the TP ranks)")
    sbh, t = s * b * h, tp
    # the attention scores, softmax, dropout mask and output; or a fused kernel's log-sum-exp
    quad = 5 * a * s / h if attention == "math" else 4 * a / h
    if recompute == "full":
        # only each layer's input is kept: 2 bytes a value, sequence-split over t with SP
        per_layer = 2 * sbh / t if sp else 2 * sbh
    elif recompute == "attention":
        per_layer = sbh * 34 / t if sp else sbh * (10 + 24 / t)
    else:
        per_layer = sbh * (34 + quad) / t if sp else sbh * (10 + 24 / t + quad / t)
    return float(layers * per_layer)


# ------------------------------------------------------------------------- today's blocks

NORMS = ("eager", "fused")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ModernBlockConfig:
    """A Llama-style block: width ``d_model``, ``n_heads`` query heads sharing ``kv_heads``
    key/value heads (grouped-query attention; ``kv_heads == n_heads`` is multi-head), a SwiGLU
    MLP ``d_ff`` wide, RMSNorm, no biases, no dropout, fused causal attention."""

    d_model: int = 64
    n_heads: int = 4
    kv_heads: int = 2
    d_ff: int = 160

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "kv_heads", "d_ff"):
            check_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads "
                             f"({self.n_heads})")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")


# published configurations (the models' config files): Llama 2 7B is multi-head attention,
# Llama 3 8B groups its 32 query heads over 8 key/value heads and has a wider MLP
LLAMA2_7B = ModernBlockConfig(d_model=4096, n_heads=32, kv_heads=32, d_ff=11008)
LLAMA3_8B = ModernBlockConfig(d_model=4096, n_heads=32, kv_heads=8, d_ff=14336)


def _check_modern_cfg(cfg: Any) -> ModernBlockConfig:
    if not isinstance(cfg, ModernBlockConfig):
        raise ValueError(f"cfg must be an activations.ModernBlockConfig; got {type(cfg).__name__}")
    return cfg


class _FusedRMSNorm(torch.autograd.Function):
    """RMSNorm as one kernel would run it: saves its input and the (B, T, 1) fp32 1/rms only,
    and recomputes the normalized input in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)        # (B, T, 1) fp32
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd                                             # (B, T, D) fp32
        gw = grad.float() * weight.float()                                  # (B, T, D)
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dweight = (grad.float() * xhat).sum(dim=tuple(range(grad.dim() - 1)))
        return dx.to(x.dtype), dweight.to(weight.dtype), None


class ModernBlock(nn.Module):
    """One pre-norm Llama-style block (see :class:`ModernBlockConfig`) on (B, T, D) inputs.

    ``norm="eager"`` uses ``nn.RMSNorm`` (PyTorch's composite kernel, computed in fp32);
    ``norm="fused"`` a single autograd function that saves only its input and 1/rms."""

    def __init__(self, cfg: ModernBlockConfig, norm: str = "fused") -> None:
        super().__init__()
        self.cfg, self.norm = _check_modern_cfg(cfg), one_of("norm", norm, NORMS)
        d, hd = cfg.d_model, cfg.d_model // cfg.n_heads
        self.norm1, self.norm2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.wq = nn.Linear(d, d, bias=False)
        self.wkv = nn.Linear(d, 2 * cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.w_gate = nn.Linear(d, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(d, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, d, bias=False)

    def _rms(self, layer: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
        if self.norm == "eager":
            return layer(x)
        return _FusedRMSNorm.apply(x, layer.weight, layer.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b, t, d = x.shape                                                   # (B, T, D)
        hd = d // cfg.n_heads
        h = self._rms(self.norm1, x)                                        # (B, T, D)
        q = self.wq(h).view(b, t, cfg.n_heads, hd).transpose(1, 2)          # (B, H, T, D/H)
        k, v = self.wkv(h).view(b, t, 2, cfg.kv_heads, hd).permute(2, 0, 3, 1, 4)  # (B, G, T, D/H)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=cfg.kv_heads != cfg.n_heads)  # (B, H, T, D/H)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, d))                 # (B, T, D)
        h = self._rms(self.norm2, x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))      # (B, T, D)


def _check_modern(cfg: Any, norm: Any, dtype: Any) -> torch.dtype:
    _check_modern_cfg(cfg)
    one_of("norm", norm, NORMS)
    return _DTYPES[one_of("dtype", dtype, tuple(_DTYPES))]


def _modern_per_token(cfg: ModernBlockConfig, norm: str, dtype: str) -> dict[str, int]:
    """Bytes one token's activations cost in one :class:`ModernBlock`, by tensor."""
    e = _DTYPES[dtype].itemsize
    d, f, g, a = cfg.d_model, cfg.d_ff, cfg.kv_heads, cfg.n_heads
    terms: dict[str, int] = {}
    for i in (1, 2):
        if norm == "eager":   # nn.RMSNorm computes in fp32 and keeps fp32 copies for backward
            terms[f"RMSNorm {i} input (fp32)"] = _FP32 * d
            terms[f"RMSNorm {i} normalized input (fp32)"] = _FP32 * d
        else:
            terms[f"RMSNorm {i} input"] = e * d
        terms[f"RMSNorm {i} 1/rms (fp32)"] = _FP32
        terms[f"RMSNorm {i} output ({'QKV' if i == 1 else 'gate and up'} matmul input)"] = e * d
        if i == 1:
            terms["Q"] = e * d
            terms["K and V (one buffer)"] = e * 2 * d * g // a
            terms["attention log-sum-exp (fp32)"] = _FP32 * a
            terms["attention output (output projection input)"] = e * d
    terms.update({"gate (B, T, F)": e * f, "up (B, T, F)": e * f, "SiLU(gate)": e * f,
                  "SiLU(gate) * up (down projection input)": e * f})
    return terms


def modern_block_terms(cfg: ModernBlockConfig, batch: int, seq: int, norm: str = "fused",
                       dtype: str = "bf16") -> dict[str, int]:
    """What one :class:`ModernBlock` saves for backward on (batch, seq) tokens, in bytes by
    tensor (each in its own dtype: the statistics are fp32 whatever ``dtype`` is)."""
    _check_modern(cfg, norm, dtype)
    check_int("batch", batch)
    check_int("seq", seq)
    return {k: v * batch * seq for k, v in _modern_per_token(cfg, norm, dtype).items()}


def measured_modern_bytes(cfg: ModernBlockConfig, batch: int, seq: int, norm: str = "fused",
                          dtype: str = "bf16", seed: int = 0) -> int:
    """Measured bytes one :class:`ModernBlock` saves for backward on a (batch, seq, d_model)
    input of ``dtype`` (weights left out)."""
    torch_dtype = _check_modern(cfg, norm, dtype)
    check_int("batch", batch)
    check_int("seq", seq)
    check_int("seed", seed, 0)
    with seeded(seed):
        block = ModernBlock(cfg, norm).to(torch_dtype)
        x = torch.randn(batch, seq, cfg.d_model, dtype=torch_dtype, requires_grad=True)  # (B,T,D)
    n, _ = saved_bytes(lambda: block(x), exclude=block.parameters())
    return n


def modern_constant(cfg: ModernBlockConfig, norm: str = "fused", dtype: str = "bf16") -> float:
    """Bytes per s·b·h one :class:`ModernBlock` layer saves, the per-token statistics (1/rms,
    log-sum-exp) left out as the paper leaves out its own: the number beside the paper's 34.
    Fused norms, 16-bit: 12 + 4 g / a + 8 F / h."""
    _check_modern(cfg, norm, dtype)
    terms = _modern_per_token(cfg, norm, dtype)
    return sum(v for k, v in terms.items() if "1/rms" not in k and "log-sum-exp" not in k) \
        / cfg.d_model


# ------------------------------------------------------------------------------ timing


def step_time(cfg: tiny_lm.TinyLMConfig, batch: int, seq: int, recompute: str = "none",
              attention: str = "math", repeats: int = 5) -> float:
    """The fastest of ``repeats`` forward + backward steps, in seconds (a warm-up run first).

    The minimum, not the median: on a shared machine every other process only adds time, so the
    fastest run is the one closest to the step's own cost. Prints a note when the machine was
    busy while it ran (``timing.warn_if_busy``)."""

    _check_shape(_check_cfg(cfg), batch, seq)
    check_int("repeats", repeats)
    model = tiny_lm.build(cfg, 0)
    tokens, targets = make_inputs(cfg, batch, seq, 0)
    times, wall, cpu = [], 0.0, 0.0
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        start, start_cpu = time.perf_counter(), time.process_time()
        _loss(forward(model, tokens, recompute, attention), targets).backward()
        times.append(time.perf_counter() - start)
        wall, cpu = wall + times[-1], cpu + time.process_time() - start_cpu
    timing.warn_if_busy(f"recompute={recompute!r}", wall, cpu, torch.get_num_threads())
    return min(times[1:])


# ------------------------------------------------------------------------------ plots


def plot_bytes_vs_seq(seqs: list[int], curves: dict[str, list[float]],
                      measured: dict[str, list[float]] | None = None, ax: Any = None,
                      title: str = "") -> Any:
    """Predicted saved bytes (MB) against sequence length, one line per setting in ``curves``
    (label -> bytes), the values of ``measured`` as markers on top. Returns the axes."""
    import matplotlib.pyplot as plt

    measured = measured or {}
    lists = [seqs, *curves.values(), *measured.values()] if isinstance(curves, dict) and \
        isinstance(measured, dict) else []
    if not seqs or not curves or any(
            isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or len(v) != len(seqs)
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
            for v in lists) or not lists:
        raise ValueError("seqs, every curve and every measured list must be non-empty lists of "
                         "numbers of equal length (curves and measured: dicts label -> list)")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.8))
    colors = [style.STATE_COLORS[k] for k in ("master", "grads", "weights")]
    for i, (label, values) in enumerate(curves.items()):
        color = colors[i % len(colors)]
        ax.plot(seqs, [v / 1e6 for v in values], color=color, lw=2, label=f"{label} (predicted)")
        if label in measured:
            ax.plot(seqs, [v / 1e6 for v in measured[label]], ls="none", marker="o", ms=7,
                    mfc="none", mew=1.5, color=color, label=f"{label} (measured)")
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("saved for backward (MB)")
    ax.set_xlim(0, max(seqs) * 1.05)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    ax.legend(loc="upper left", frameon=False)
    if title:
        ax.set_title(title, loc="left")
    return ax
