"""ZeRO-3 as a module wrapper: any model's weight matrices sharded over DP.

Module 3's :class:`course_utils.zero.engine.ZeroDP` is an engine: it owns the model (an
``nn.Sequential`` of Linears), the loss and the optimizer, and runs the whole step. FSDP, and
CS336's systems assignment, put ZeRO-3 behind a module instead, and leave the loss, the
backward call and the optimizer to the caller. :class:`ShardedModule` is that form:

* **Sharding.** The layers are chosen by their parameters, not their class: every module that
  holds a parameter of two or more dimensions (a weight matrix: ``nn.Linear``,
  ``nn.Embedding``, a Linear of the model's own) has each of its own parameters flattened,
  padded with zeros to a multiple of D and cut in D equal pieces; rank r keeps piece r as an
  fp32 ``nn.Parameter`` under the parameter's own name, so ``wrapper.parameters()`` is what an
  outside optimizer (any ``torch.optim`` one) updates. Modules with vectors only (norms) stay
  whole on every rank, in fp32: their gradients are averaged over the group by
  :meth:`ShardedModule.finish_gradient_synchronization`. ``shard_types`` picks layers by class
  instead, and warns naming each weight matrix it leaves whole. A sharded parameter must be
  used inside its own module's forward (the gather runs there).
* **Forward.** A forward pre-hook all-gathers the layer's pieces (cast to ``compute_dtype``
  first, so the gather moves half the bytes in fp16) and hands the layer the whole weight; a
  forward hook takes it away again. Autograd would keep the whole weight alive until backward
  (a matmul saves its weight), so a saved-tensors hook stores a note instead and all-gathers
  the weight again when backward needs it: the memory of ZeRO-3, at the price of a second
  all-gather per layer.
* **Backward.** The gather's backward reduce-scatters the whole weight's gradient (in fp32,
  :func:`course_utils.runtime.backend.reduce_scatter_in_place`) and divides by D: each rank receives
  the mean of its own piece, the gradient its optimizer needs.

:meth:`ShardedModule.gather_full_params` returns every parameter whole (fp32), for checking.
``tests/test_zero.py`` trains a model of Embedding, RMSNorm and Linear layers with it against
one process, in fp32 and in fp16 compute, with SGD and AdamW.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_utils.runtime import backend

__all__ = ["ShardedModule"]


class _Sharded:
    """One sharded parameter: its shape and size, and this rank's fp32 piece."""

    def __init__(self, full: torch.Tensor, dp: int, rank: int, requires_grad: bool):
        self.shape, self.numel = full.shape, full.numel()
        self.size = -(-self.numel // dp)                  # elements per piece
        flat = torch.zeros(self.size * dp, dtype=torch.float32, device=full.device)
        flat[:self.numel] = full.detach().reshape(-1)
        self.piece = nn.Parameter(flat[rank * self.size:(rank + 1) * self.size].clone(),
                                  requires_grad=requires_grad)


class _Gather(torch.autograd.Function):
    """The whole weight from every rank's piece (forward); the mean of the whole gradient's
    piece r on rank r (backward)."""

    @staticmethod
    def forward(ctx, piece: torch.Tensor, owner: "ShardedModule", spec: _Sharded) -> torch.Tensor:
        ctx.owner, ctx.spec = owner, spec
        return owner._all_gather(piece, spec)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        owner, spec = ctx.owner, ctx.spec
        flat = torch.zeros(spec.size * owner.dp, dtype=torch.float32, device=grad.device)
        flat[:spec.numel] = grad.reshape(-1)
        backend.reduce_scatter_in_place(flat, owner.group)          # piece r of the sum
        r = owner.rank
        return flat[r * spec.size:(r + 1) * spec.size] / owner.dp, None, None


class ShardedModule(nn.Module):
    """``module`` with the parameters of its weight-matrix layers (or of its ``shard_types``
    layers) sharded over ``group`` (ZeRO-3); ``compute_dtype``: the dtype the sharded weights
    are gathered and used in (default: fp32).
    """

    def __init__(self, module: nn.Module, group: Any = None,
                 compute_dtype: torch.dtype | None = None,
                 shard_types: Sequence[type] | None = None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ValueError(f"module must be a torch.nn.Module; got {type(module).__name__}")
        if compute_dtype not in (None, torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"compute_dtype must be None, torch.float32, torch.float16 or "
                             f"torch.bfloat16; got {compute_dtype!r}")
        self.module, self.group = module, group
        self.compute_dtype = compute_dtype or torch.float32
        self.dp, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self._specs: dict[int, _Sharded] = {}              # id(original parameter) -> spec
        self._layers: list[tuple[nn.Module, str, _Sharded]] = []
        for layer in module.modules():
            own = dict(layer.named_parameters(recurse=False))
            if not self._shards(layer, own, shard_types):
                continue
            names = list(own)
            for name in names:
                p = layer._parameters[name]
                spec = self._specs.get(id(p)) or _Sharded(p, self.dp, self.rank, p.requires_grad)
                self._specs[id(p)] = spec
                layer._parameters[name] = spec.piece       # the module now holds its piece
                self._layers.append((layer, name, spec))
            if names:
                layer.register_forward_pre_hook(self._gather_layer)
                layer.register_forward_hook(self._release_layer)
        sharded = {id(s.piece) for s in self._specs.values()}
        self.replicated = [p for p in module.parameters() if id(p) not in sharded]
        self._live: dict[int, tuple[_Sharded, torch.Tensor]] = {}   # storage -> gathered
        self._gathered: list[weakref.ref] = []
        self.gathers = 0                                   # all-gathers issued (for checks)
        whole = [n for n, p in module.named_parameters() if id(p) not in sharded and p.dim() > 1]
        if whole:
            warnings.warn(f"ShardedModule keeps these weight matrices whole on every rank (not "
                          f"of shard_types): {', '.join(whole)}", stacklevel=2)

    @staticmethod
    def _shards(layer: nn.Module, own: dict[str, nn.Parameter],
                shard_types: Sequence[type] | None) -> bool:
        """Whether ``layer``'s own parameters are sharded: by class when ``shard_types`` is
        given, else when one of them is a matrix (or more dimensions)."""
        if shard_types is not None:
            return isinstance(layer, tuple(shard_types))
        return any(p.dim() > 1 for p in own.values())

    # ------------------------------------------------------------------ gather and release

    def _all_gather(self, piece: torch.Tensor, spec: _Sharded) -> torch.Tensor:
        mine = piece.detach().to(self.compute_dtype)
        flat = torch.empty(spec.size * self.dp, dtype=self.compute_dtype, device=piece.device)
        dist.all_gather_single(flat, mine, group=self.group)
        self.gathers += 1
        return flat[:spec.numel].view(spec.shape)

    def _gather_layer(self, layer: nn.Module, _inputs: Any) -> None:
        for owner, name, spec in self._layers:
            if owner is layer:
                full = _Gather.apply(layer._parameters.pop(name), self, spec)
                self._live[full.untyped_storage().data_ptr()] = (spec, full)
                self._gathered = [r for r in self._gathered if r() is not None]
                self._gathered.append(weakref.ref(full))
                setattr(layer, name, full)                 # a plain attribute while it runs

    def _release_layer(self, layer: nn.Module, _inputs: Any, _output: Any) -> None:
        for owner, name, spec in self._layers:
            if owner is layer:
                full = layer.__dict__.pop(name)
                self._live.pop(full.untyped_storage().data_ptr(), None)
                layer._parameters[name] = spec.piece

    def _pack(self, t: torch.Tensor) -> Any:
        hit = self._live.get(t.untyped_storage().data_ptr()) if t.device.type != "meta" else None
        if hit is None:
            return t
        return (hit[0], t.shape, t.stride(), t.storage_offset())   # a note, not the weight

    def _unpack(self, saved: Any) -> torch.Tensor:
        if isinstance(saved, torch.Tensor):
            return saved
        spec, shape, stride, offset = saved
        flat = self._all_gather(spec.piece, spec).reshape(-1)      # gathered again for backward
        return flat.as_strided(shape, stride, offset)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return self.module(*args, **kwargs)

    # ------------------------------------------------------------------ after backward

    def finish_gradient_synchronization(self) -> None:
        """Average the replicated parameters' gradients over the group (the sharded ones were
        reduce-scattered during backward)."""
        for p in self.replicated:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)
                p.grad.div_(self.dp)

    def gathered_alive(self) -> int:
        """How many all-gathered whole weights are still in memory (0 between steps)."""
        return sum(ref() is not None for ref in self._gathered)

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Collective: every parameter of ``module`` whole, in fp32, by name."""
        out = {}
        by_piece = {id(s.piece): s for s in self._specs.values()}
        for name, p in self.module.named_parameters():
            spec = by_piece.get(id(p))
            if spec is None:
                out[name] = p.detach().clone()
                continue
            flat = torch.empty(spec.size * self.dp, dtype=torch.float32, device=p.device)
            dist.all_gather_single(flat, p.detach(), group=self.group)
            out[name] = flat[:spec.numel].view(spec.shape).clone()
        return out
