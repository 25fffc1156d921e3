"""The from-scratch ZeRO engine: one data-parallel rank of stage 0-3, built from collectives.

Every rank of a data-parallel group trains the same small MLP on its own micro-batch, in the
lesson's 16-byte layout: bf16 weights and gradients for compute, an fp32 master copy and fp32
Adam moments for the update (2 + 2 + 4 + 8 bytes per parameter). The stage decides what each
rank keeps between steps:

=====  ==============  ==========================================================================
stage  name            per step
=====  ==============  ==========================================================================
0      replicated DP   all-reduce the gradients; every rank updates every parameter
1      ZeRO-1          reduce-scatter the gradients, update my shard, all-gather the weights
2      ZeRO-2          as ZeRO-1, but each layer's gradient is reduce-scattered as soon as
                       backward has produced it (a post-accumulate-grad hook) and then freed
3      ZeRO-3          weights sharded too: a layer is all-gathered for forward, again for
                       backward, and released each time; its gradient is reduce-scattered
=====  ==============  ==========================================================================

Sharding uses flat buffers, one per ``nn.Linear`` (a :class:`~course_utils.zero.units.FlatUnit`,
padded as :mod:`course_utils.zero.sizes` counts). Persistent bytes are *measured*:
:meth:`ZeroDP.state_bytes` adds up the storages of the tensors a rank really holds (each storage
once). Communication is *logged*: every collective the engine issues is recorded in a
:class:`~course_utils.zero.recording.CommLog`, with the bytes a ring algorithm makes each rank
send. Lecture 3 (ZeRO and FSDP); the workers that run it are in :mod:`course_utils.zero.training`.

:class:`ZeroDP` is an engine: it owns the model, the loss and the optimizer. The same ZeRO-3 as
a module wrapper, with the loss, backward and any ``torch.optim`` optimizer left to the caller
(FSDP's form), is :class:`course_utils.zero.zero3.ShardedModule`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_utils.runtime import validate
from course_utils.zero.mlp import mse_loss
from course_utils.zero.recording import CommLog
from course_utils.zero.sizes import REDUCE_DTYPES, check_stage
from course_utils.zero.units import FlatUnit, storage_bytes

__all__ = ["ZeroDP"]


class _GatheredLinear(torch.autograd.Function):
    """ZeRO-3 Linear: all-gather the layer for forward, again for backward, release after each."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, param_shard: torch.Tensor, unit: FlatUnit,
                engine: "ZeroDP") -> torch.Tensor:
        full = engine._gather_unit(unit, "forward")              # (P,) bf16
        weight, bias = unit.views(full)                           # (out, in), (out,)
        y = F.linear(x, weight, bias)                             # (B, out)
        del full, weight, bias                                    # really free the gathered layer
        engine._release_unit(unit, "forward")
        ctx.save_for_backward(x)
        ctx.unit, ctx.engine = unit, engine
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        (x,) = ctx.saved_tensors
        unit, engine = ctx.unit, ctx.engine
        full = engine._gather_unit(unit, "backward")
        weight, bias = (t.detach().requires_grad_(True) for t in unit.views(full))
        x_in = x.detach().requires_grad_(x.requires_grad)
        with torch.enable_grad():  # the layer's own backward, on the re-gathered weights
            y = F.linear(x_in, weight, bias)
            wanted = [weight, bias] + ([x_in] if x.requires_grad else [])
            grads = torch.autograd.grad(y, wanted, grad_y)
        flat_grad = torch.cat([grads[0].reshape(-1), grads[1]])  # (n,) bf16, unsharded
        grad_x = grads[2] if x.requires_grad else None            # (B, in)
        del grads
        engine._hold(("grad", unit.index), "unsharded grads", flat_grad)
        engine._mark(f"backward: grads of L{unit.index}")
        del y, weight, bias, full                                 # really free the gathered layer
        engine._release_unit(unit, "backward", mark=False)
        grad_shard = engine._reduce_scatter_grad(unit, flat_grad)  # (S,) bf16, mean over ranks
        del flat_grad
        engine._drop(("grad", unit.index))
        engine._mark(f"backward: reduce-scatter L{unit.index}")
        return grad_x, grad_shard, None, None


class ZeroDP:
    """One data-parallel rank of ZeRO ``stage`` (0-3) in the 16-byte layout, for a bf16 MLP.

    ``model``: an ``nn.Sequential`` whose parameters all belong to bf16 ``nn.Linear`` layers
    (with bias), e.g. :func:`~course_utils.zero.mlp.make_mlp`. At stage 2 a post-accumulate-grad
    hook reduce-scatters each layer during backward, as soon as its weight and bias gradients
    exist, and frees them, so at most one layer's full gradient exists at a time.
    ``reduce_dtype``: the dtype gradients are summed in ("bf16", as stored, or "fp32", what FSDP
    is often configured to use). ``prefetch`` (stage 3): start the next layer's all-gather before
    computing the current one. ``log``: a :class:`CommLog` to record collectives in. Call
    :meth:`step` with this rank's micro-batch.

    The engine takes the model over: its parameters become views of flat buffers (stages 0-2)
    or empty tensors (stage 3, where only slices remain); read them with :meth:`full_parameters`.
    """

    def __init__(self, model: nn.Module, stage: int, *, lr: float = 1e-2,
                 reduce_dtype: str = "bf16", prefetch: bool = False,
                 dp_group: dist.ProcessGroup | None = None, log: CommLog | None = None):
        check_stage(stage)
        self.reduce_dtype = validate.one_of("reduce_dtype", reduce_dtype, REDUCE_DTYPES)
        if not isinstance(model, nn.Sequential):
            raise ValueError(f"model must be an nn.Sequential of Linear layers and "
                             f"parameter-free modules; got {type(model).__name__}")
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
            raise ValueError(f"lr must be a positive number; got {lr!r}")
        if prefetch not in (True, False):
            raise ValueError(f"prefetch must be True or False; got {prefetch!r}")
        for name, module in model.named_children():
            has_params = any(True for _ in module.parameters())
            if has_params and not (isinstance(module, nn.Linear) and module.bias is not None):
                raise ValueError(f"model[{name}] is a {type(module).__name__}: only nn.Linear "
                                 "layers with bias may hold parameters")
            for p in module.parameters():
                if p.dtype != torch.bfloat16:
                    raise ValueError(f"model parameters must be bf16 (the 16-byte layout); "
                                     f"model[{name}] has {p.dtype}")
        self.model, self.stage, self.prefetch = model, stage, bool(prefetch)
        self.device = next(model.parameters(), torch.empty(0)).device  # buffers beside weights
        self.dp_group = dp_group
        self.dp = dist.get_world_size(dp_group)
        self.dp_rank = dist.get_rank(dp_group)
        self.log = log
        self.timeline: list[dict[str, Any]] | None = None  # set to [] to record the next step
        self._live: dict[Any, tuple[str, int]] = {}
        self._pending: dict[int, tuple[Any, torch.Tensor]] = {}
        self.units = [FlatUnit(i, m, self.dp) for i, m in
                      enumerate(m for m in model.children() if isinstance(m, nn.Linear))]
        if not self.units:
            raise ValueError("model has no nn.Linear layers to train")
        lo = self.dp_rank
        for unit in self.units:
            flat = torch.cat([p.detach().reshape(-1) for p in unit.params])  # (n,) bf16
            if stage == 0:
                unit.master = flat.float()                                     # (n,) fp32
            else:
                padded = torch.zeros(unit.padded, dtype=torch.bfloat16, device=self.device)  # (P,)
                padded[:unit.n] = flat
                mine = padded[lo * unit.shard:(lo + 1) * unit.shard]           # (S,)
                unit.master = mine.float()                                     # (S,) fp32
            if stage <= 2:
                unit.flat_param = flat.clone()
                for p, view in zip(unit.params, unit.views(unit.flat_param)):
                    p.data = view  # the module computes with views of the flat buffer
            if stage == 2:
                unit.grad_shard = torch.zeros(unit.shard, dtype=torch.bfloat16,
                                              device=self.device)  # (S,)
                for p in unit.params:  # reduce-scatter the unit as soon as its grads are ready
                    p.register_post_accumulate_grad_hook(
                        lambda _p, unit=unit: self._on_grad_ready(unit))
            elif stage == 3:
                unit.param_shard = mine.clone().requires_grad_(True)
                for p in unit.params:  # the full weights are gone: only shards remain
                    p.data = torch.empty(0, dtype=torch.bfloat16, device=self.device)
            unit.master.requires_grad_(True)
        self.optimizer = torch.optim.Adam([u.master for u in self.units], lr=lr)

    # -------------------------------------------------------------------- collectives

    def _log(self, op: str, t: torch.Tensor) -> None:
        if self.log is not None:
            self.log.record(op, t.numel(), t.element_size())

    def _start_gather(self, unit: FlatUnit) -> None:
        full = torch.empty(unit.padded, dtype=torch.bfloat16, device=self.device)  # (P,)
        work = dist.all_gather_single(full, unit.param_shard.detach(), group=self.dp_group,
                                      async_op=True)
        self._log("all_gather", full)
        self._pending[unit.index] = (work, full)
        self._hold(("param", unit.index), "gathered weights", full)

    def _gather_unit(self, unit: FlatUnit, phase: str) -> torch.Tensor:
        """All-gather one unit's bf16 weights (P,); with prefetch, also start the next unit's."""
        if unit.index not in self._pending:
            self._start_gather(unit)
        work, full = self._pending.pop(unit.index)
        work.wait()
        self._mark(f"{phase}: gather L{unit.index}")
        if self.prefetch:
            nxt = unit.index + (1 if phase == "forward" else -1)
            if 0 <= nxt < len(self.units) and nxt not in self._pending:
                self._start_gather(self.units[nxt])
                self._mark(f"{phase}: prefetch L{nxt}")
        return full

    def _release_unit(self, unit: FlatUnit, phase: str, mark: bool = True) -> None:
        self._drop(("param", unit.index))
        if mark:
            self._mark(f"{phase}: release L{unit.index}")

    def _reduce_scatter_grad(self, unit: FlatUnit,
                             grads: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """Mean over ranks of this rank's shard of a unit's gradient: (S,) bf16.

        ``grads``: the unit's gradient as one flat (n,) tensor, or as [weight (out, in),
        bias (out,)].
        """
        full = torch.zeros(unit.padded, dtype=self.reduce_dtype, device=self.device)  # (P,)
        if isinstance(grads, torch.Tensor):
            full[:unit.n] = grads
        else:
            for view, g in zip(unit.views(full), grads):
                view.copy_(g)
        shard = torch.empty(unit.shard, dtype=self.reduce_dtype, device=self.device)  # (S,)
        dist.reduce_scatter_single(shard, full, op=dist.ReduceOp.SUM, group=self.dp_group)
        self._log("reduce_scatter", full)
        return shard.div_(self.dp).to(torch.bfloat16)

    # -------------------------------------------------------------------- timeline

    def _hold(self, key: Any, kind: str, *tensors: torch.Tensor) -> None:
        storages = {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
                    for t in tensors}
        self._live[key] = (kind, sum(nbytes for _, nbytes in storages), storages)

    def _drop(self, key: Any) -> None:
        self._live.pop(key, None)

    def _mark(self, label: str) -> None:
        if self.timeline is None:
            return
        transient: set = set()  # held storages are counted under their kind, not as persistent
        for _, _, storages in self._live.values():
            transient |= storages
        row: dict[str, Any] = {"event": label,
                               "persistent": self._state_bytes(transient)["total"],
                               "gathered weights": 0, "unsharded grads": 0}
        for kind, nbytes, _ in self._live.values():
            row[kind] += nbytes
        self.timeline.append(row)

    # -------------------------------------------------------------------- one step

    def _on_grad_ready(self, unit: FlatUnit) -> None:
        """ZeRO-2, during backward: once a unit's weight and bias gradients both exist,
        reduce-scatter them into the unit's gradient shard and free them."""
        unit.ready += 1
        if unit.ready < len(unit.params):
            return
        grads = [p.grad for p in unit.params]                     # (out, in), (out,) bf16
        self._hold(("grad", unit.index), "unsharded grads", *grads)
        self._mark(f"backward: grads of L{unit.index}")
        unit.grad_shard.copy_(self._reduce_scatter_grad(unit, grads))  # (S,) bf16, the mean
        del grads
        for p in unit.params:  # the full gradient is gone before the next layer's exists
            p.grad = None
        self._drop(("grad", unit.index))
        self._mark(f"backward: reduce-scatter L{unit.index}")

    def _zero_grads(self) -> None:
        for unit in self.units:
            if self.stage == 2:
                unit.ready = 0  # no full gradient yet: backward creates it, the hook frees it
            elif self.stage <= 1:
                if unit.flat_grad is None:
                    unit.flat_grad = torch.zeros(unit.n, dtype=torch.bfloat16,
                                                 device=self.device)  # (n,)
                    for p, view in zip(unit.params, unit.views(unit.flat_grad)):
                        p.grad = view  # backward accumulates into the flat buffer in place
                else:
                    unit.flat_grad.zero_()
            elif unit.param_shard.grad is not None:
                unit.param_shard.grad.zero_()

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stage <= 2:
            return self.model(x)
        units = iter(self.units)
        for module in self.model.children():
            if isinstance(module, nn.Linear):
                unit = next(units)
                x = _GatheredLinear.apply(x, unit.param_shard, unit, self)
            else:
                x = module(x)
        return x

    def _reduce_gradients(self) -> None:
        for unit in reversed(self.units):  # the order backward produces them
            if self.stage == 0:
                buf = unit.flat_grad.to(self.reduce_dtype)  # in place when already bf16
                dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.dp_group)
                self._log("all_reduce", buf)
                unit.flat_grad.copy_(buf.div_(self.dp))
                unit.master.grad = unit.flat_grad.float()  # (n,) fp32, transient
                continue
            if self.stage == 1:
                grad_shard = self._reduce_scatter_grad(unit, unit.flat_grad)
            elif self.stage == 2:  # already reduce-scattered during backward, by the hook
                if unit.ready != len(unit.params):
                    raise RuntimeError(f"ZeRO-2: layer {unit.index} got no gradient in backward")
                grad_shard = unit.grad_shard
            else:
                grad_shard = unit.param_shard.grad
            unit.master.grad = grad_shard.float()  # (S,) fp32, transient

    @torch.no_grad()
    def _update(self) -> None:
        self.optimizer.step()
        for unit in self.units:
            new = unit.master.to(torch.bfloat16)  # round the fp32 master into bf16
            unit.master.grad = None
            if self.stage == 0:
                unit.flat_param.copy_(new)
            elif self.stage <= 2:
                full = torch.empty(unit.padded, dtype=torch.bfloat16, device=self.device)  # (P,)
                dist.all_gather_single(full, new, group=self.dp_group)
                self._log("all_gather", full)
                unit.flat_param.copy_(full[:unit.n])
            else:
                unit.param_shard.copy_(new)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One training step on this rank's micro-batch x (B, in) bf16, y (B, out); returns its loss."""
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2:
            raise ValueError(f"x must be a 2-D bf16 tensor (batch, features); got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
        self._zero_grads()
        self._mark("step start")
        loss = mse_loss(self._forward(x), y)
        self._mark("loss")
        loss.backward()
        self._reduce_gradients()
        self._update()
        self._mark("optimizer step")
        return loss.item()

    # -------------------------------------------------------------------- inspection

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds now: weights, grads, optimizer (master + moments), other, total.

        Measured from tensor storages, each counted once. ``other`` is Adam's per-tensor step
        counters (4 bytes each), which a bytes-per-parameter layout leaves out; ``total``
        excludes it.
        """
        return self._state_bytes(set())

    def _state_bytes(self, exclude: set) -> dict[str, int]:
        """:meth:`state_bytes`, leaving out the storages in ``exclude`` ((data_ptr, nbytes))."""
        seen: set = set(exclude)
        params = list(self.model.parameters())
        shards = [u.param_shard for u in self.units]
        weights = storage_bytes(params + shards, seen)
        grads = storage_bytes([p.grad for p in params] + [u.grad_shard for u in self.units]
                               + [None if s is None else s.grad for s in shards], seen)
        masters = [u.master for u in self.units]
        moments, counters = [], []
        for state in self.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    (moments if value.dim() > 0 else counters).append(value)
        optimizer = storage_bytes(masters + moments, seen)
        other = storage_bytes(counters, seen)
        return {"weights": weights, "grads": grads, "optimizer": optimizer, "other": other,
                "total": weights + grads + optimizer}

    def full_parameters(self) -> list[torch.Tensor]:
        """Every parameter at full size (bf16 copies, module order); gathers at stage 3, unlogged."""
        out = []
        for unit in self.units:
            if self.stage <= 2:
                out += [p.detach().clone() for p in unit.params]
            else:
                full = torch.empty(unit.padded, dtype=torch.bfloat16, device=self.device)
                dist.all_gather_single(full, unit.param_shard.detach(), group=self.dp_group)
                out += [v.clone() for v in unit.views(full)]
        return out
