"""ZeRO stages 0-3 built from collectives: shard optimizer state, then gradients, then weights.

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

Sharding uses flat buffers, one per ``nn.Linear`` (a *unit*, like an FSDP unit): the layer's n
weight and bias elements are flattened, padded with zeros to a multiple of D, and rank r owns
elements ``[r*S, (r+1)*S)`` with ``S = ceil(n / D)``. Padding is at most D - 1 elements a unit,
and the byte counts below include it.

Persistent bytes are *measured*: :meth:`ZeroDP.state_bytes` adds up the storages of the tensors
a rank really holds (each storage once). Communication is *logged*: every collective the engine
issues is recorded in a :class:`CommLog`, with the bytes a ring algorithm makes each rank send.

:class:`ZeroDP` is an engine: it owns the model, the loss and the optimizer. The same ZeRO-3 as
a module wrapper, with the loss, backward and any ``torch.optim`` optimizer left to the caller
(FSDP's form), is :class:`course_utils.zero.zero3.ShardedModule`.

Run one stage under torchrun (prints each rank's measured bytes)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.zero.stages
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_utils.runtime import backend
from course_utils.memory import sizing as memory

__all__ = ["STAGES", "STAGE_NAMES", "REDUCE_DTYPES", "make_mlp", "unit_sizes", "shard_numel",
           "make_batches", "padded_state_bytes", "expected_comm_bytes", "CommLog", "ZeroDP",
           "train_worker", "all_stages_worker", "run_all_stages", "reference_train", "max_abs_diff",
           "shard_step_harness", "run_shard_step", "TIMELINE_KINDS", "TIMELINE_KEY", "short_event",
           "timeline_peak", "draw_memory_timeline", "draw_memory_timelines", "sum_rounding_error"]

STAGES = (0, 1, 2, 3)
STAGE_NAMES = {0: "replicated DP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
REDUCE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
LAYOUT = memory.layout("mixed_adam16")  # 2 weights + 2 grads + 12 (master + moments)


# ------------------------------------------------------------------------------ argument checks


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return value


def _check_stage(stage: Any) -> int:
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}; got {stage!r}")
    return stage


def _check_sizes(sizes: Any) -> list[int]:
    if not isinstance(sizes, (list, tuple)) or len(sizes) < 2:
        raise ValueError(f"sizes must be a list of at least 2 layer widths; got {sizes!r}")
    for i, s in enumerate(sizes):
        _check_int(f"sizes[{i}]", s, 1)
    return list(sizes)


def _check_units(units: Any) -> list[int]:
    if not isinstance(units, (list, tuple)) or not units:
        raise ValueError(f"units must be a non-empty list of element counts; got {units!r}")
    for i, n in enumerate(units):
        _check_int(f"units[{i}]", n, 1)
    return list(units)


def _check_reduce_dtype(name: Any) -> torch.dtype:
    if name not in REDUCE_DTYPES:
        raise ValueError(f"reduce_dtype must be one of {list(REDUCE_DTYPES)}; got {name!r}")
    return REDUCE_DTYPES[name]


# ------------------------------------------------------------------------------ model and data


def make_mlp(sizes: Sequence[int], seed: int = 0) -> nn.Sequential:
    """bf16 MLP ``Linear(sizes[0], sizes[1]), Tanh, ..., Linear(sizes[-2], sizes[-1])``; same weights per seed."""
    sizes = _check_sizes(sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            if i:
                layers.append(nn.Tanh())
            layers.append(nn.Linear(fan_in, fan_out))
    return nn.Sequential(*layers).bfloat16()


def unit_sizes(sizes: Sequence[int]) -> list[int]:
    """Elements in each Linear unit of :func:`make_mlp` (weight + bias): ``[in*out + out, ...]``."""
    sizes = _check_sizes(sizes)
    return [fan_in * fan_out + fan_out for fan_in, fan_out in zip(sizes[:-1], sizes[1:])]


def shard_numel(n: int, dp: int) -> int:
    """Elements each of ``dp`` ranks owns of a flat buffer of ``n`` elements: ceil(n / dp)."""
    _check_int("n", n, 1)
    _check_int("dp", dp, 1)
    return -(-n // dp)


def make_batches(sizes: Sequence[int], seed: int, n_steps: int, dp: int,
                 micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random regression data: x (n_steps, dp, micro_batch, sizes[0]) bf16, y (..., sizes[-1]) fp32."""
    sizes = _check_sizes(sizes)
    for name, value in (("n_steps", n_steps), ("dp", dp), ("micro_batch", micro_batch)):
        _check_int(name, value, 1)
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(n_steps, dp, micro_batch, sizes[0], generator=g).bfloat16()
    y = torch.randn(n_steps, dp, micro_batch, sizes[-1], generator=g)
    return x, y


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), y)  # scalar fp32


# ------------------------------------------------------------------------------ formulas


def padded_state_bytes(units: Sequence[int], dp: int, stage: int) -> dict[str, int]:
    """Persistent bytes per rank in the 16-byte layout, flat shards padded per unit.

    Sharded buffers hold ``sum(ceil(n_u / dp))`` elements per rank; replicated ones ``N``.
    Equals ``memory.zero_state_bytes(N, dp, stage)`` when every unit divides by ``dp``.
    Returns ``{"weights", "grads", "optimizer", "total"}`` in bytes.
    """
    units = _check_units(units)
    _check_int("dp", dp, 1)
    _check_stage(stage)
    n = sum(units)
    s = sum(shard_numel(u, dp) for u in units)
    out = {"weights": LAYOUT.weights * (s if stage >= 3 else n),
           "grads": LAYOUT.grads * (s if stage >= 2 else n),
           "optimizer": LAYOUT.optimizer_bucket * (s if stage >= 1 else n)}
    out["total"] = out["weights"] + out["grads"] + out["optimizer"]
    return out


def _ring_factor(op: str, dp: int) -> float:
    """Fraction of a collective's full buffer each rank sends under a ring algorithm."""
    return (2 if op == "all_reduce" else 1) * (dp - 1) / dp


def expected_comm_bytes(units: Sequence[int], dp: int, stage: int,
                        reduce_dtype: str = "bf16") -> dict[str, float]:
    """Bytes each rank sends per training step (ring algorithms), by collective, and their total.

    Stage 0: all-reduce of the N-element gradient, 2(D-1)/D x N x b_reduce. Stages 1-2:
    reduce-scatter of the gradient plus all-gather of the bf16 weights, (D-1)/D x P each.
    Stage 3: two all-gathers (forward, backward) plus a reduce-scatter. P = padded elements.
    """
    units = _check_units(units)
    _check_int("dp", dp, 1)
    _check_stage(stage)
    rb = _check_reduce_dtype(reduce_dtype).itemsize  # bytes per gradient element sent
    pb = LAYOUT.weights                               # bytes per bf16 weight element sent
    n = sum(units)
    padded = sum(shard_numel(u, dp) * dp for u in units)
    out = {"all_reduce": 0.0, "reduce_scatter": 0.0, "all_gather": 0.0}
    if stage == 0:
        out["all_reduce"] = _ring_factor("all_reduce", dp) * n * rb
    else:
        out["reduce_scatter"] = _ring_factor("reduce_scatter", dp) * padded * rb
        gathers = 2 if stage == 3 else 1
        out["all_gather"] = gathers * _ring_factor("all_gather", dp) * padded * pb
    out["total"] = out["all_reduce"] + out["reduce_scatter"] + out["all_gather"]
    return out


# ------------------------------------------------------------------------------ communication log


@dataclass
class CommLog:
    """Every collective one rank issued: ``(op, elements in the full buffer, bytes per element)``."""

    dp: int
    calls: list[tuple[str, int, int]] = field(default_factory=list)

    def record(self, op: str, numel: int, itemsize: int) -> None:
        """Log one collective over a full buffer of ``numel`` elements of ``itemsize`` bytes."""
        self.calls.append((op, int(numel), int(itemsize)))

    def clear(self) -> None:
        """Forget the calls logged so far."""
        self.calls.clear()

    def counts(self) -> dict[str, int]:
        """Number of calls per collective."""
        out = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
        for op, _, _ in self.calls:
            out[op] += 1
        return out

    def ring_bytes(self) -> dict[str, float]:
        """Bytes this rank sends for the logged calls under ring algorithms, per op and total."""
        out = {"all_reduce": 0.0, "reduce_scatter": 0.0, "all_gather": 0.0}
        for op, numel, itemsize in self.calls:
            out[op] += _ring_factor(op, self.dp) * numel * itemsize
        out["total"] = out["all_reduce"] + out["reduce_scatter"] + out["all_gather"]
        return out


# ------------------------------------------------------------------------------ the engine


def _storage_bytes(tensors: Sequence[torch.Tensor | None], seen: set) -> int:
    """Bytes of the distinct, non-empty storages behind ``tensors`` (each counted once)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


class _Unit:
    """One Linear layer's flat buffers on this rank."""

    def __init__(self, index: int, module: nn.Linear, dp: int):
        self.index = index
        self.module = module
        self.params = [module.weight, module.bias]
        self.shapes = [p.shape for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.n = sum(self.numels)
        self.shard = shard_numel(self.n, dp)
        self.padded = self.shard * dp
        self.flat_param: torch.Tensor | None = None   # (n,) bf16, stages 0-2
        self.flat_grad: torch.Tensor | None = None    # (n,) bf16, stages 0-1
        self.param_shard: torch.Tensor | None = None  # (S,) bf16, stage 3 (its .grad: (S,))
        self.grad_shard: torch.Tensor | None = None   # (S,) bf16, stage 2
        self.ready = 0                                # stage 2: params whose grad is ready
        self.master: torch.Tensor | None = None       # (S,) fp32 (stage 0: (n,))

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Weight (out, in) and bias (out,) as views of a flat buffer of >= n elements."""
        out, start = [], 0
        for shape, numel in zip(self.shapes, self.numels):
            out.append(flat[start:start + numel].view(shape))
            start += numel
        return out


class _GatheredLinear(torch.autograd.Function):
    """ZeRO-3 Linear: all-gather the layer for forward, again for backward, release after each."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, param_shard: torch.Tensor, unit: _Unit,
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
    (with bias), e.g. :func:`make_mlp`. At stage 2 a post-accumulate-grad hook reduce-scatters
    each layer during backward, as soon as its weight and bias gradients exist, and frees them,
    so at most one layer's full gradient exists at a time. ``reduce_dtype``: the dtype gradients
    are summed in ("bf16", as stored, or "fp32", what FSDP is often configured to use).
    ``prefetch`` (stage 3): start the next layer's all-gather before computing the current one.
    ``log``: a :class:`CommLog` to record collectives in. Call :meth:`step` with this rank's
    micro-batch.

    The engine takes the model over: its parameters become views of flat buffers (stages 0-2)
    or empty tensors (stage 3, where only slices remain); read them with :meth:`full_parameters`.
    """

    def __init__(self, model: nn.Module, stage: int, *, lr: float = 1e-2,
                 reduce_dtype: str = "bf16", prefetch: bool = False,
                 dp_group: dist.ProcessGroup | None = None, log: CommLog | None = None):
        _check_stage(stage)
        self.reduce_dtype = _check_reduce_dtype(reduce_dtype)
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
        self.units = [_Unit(i, m, self.dp) for i, m in
                      enumerate(m for m in model.children() if isinstance(m, nn.Linear))]
        if not self.units:
            raise ValueError("model has no nn.Linear layers to train")
        lo = self.dp_rank
        for unit in self.units:
            flat = torch.cat([p.detach().reshape(-1) for p in unit.params])  # (n,) bf16
            if stage == 0:
                unit.master = flat.float()                                     # (n,) fp32
            else:
                padded = torch.zeros(unit.padded, dtype=torch.bfloat16, device=self.device)        # (P,)
                padded[:unit.n] = flat
                mine = padded[lo * unit.shard:(lo + 1) * unit.shard]           # (S,)
                unit.master = mine.float()                                     # (S,) fp32
            if stage <= 2:
                unit.flat_param = flat.clone()
                for p, view in zip(unit.params, unit.views(unit.flat_param)):
                    p.data = view  # the module computes with views of the flat buffer
            if stage == 2:
                unit.grad_shard = torch.zeros(unit.shard, dtype=torch.bfloat16, device=self.device)  # (S,)
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

    def _start_gather(self, unit: _Unit) -> None:
        full = torch.empty(unit.padded, dtype=torch.bfloat16, device=self.device)                  # (P,)
        work = dist.all_gather_single(full, unit.param_shard.detach(), group=self.dp_group,
                                      async_op=True)
        self._log("all_gather", full)
        self._pending[unit.index] = (work, full)
        self._hold(("param", unit.index), "gathered weights", full)

    def _gather_unit(self, unit: _Unit, phase: str) -> torch.Tensor:
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

    def _release_unit(self, unit: _Unit, phase: str, mark: bool = True) -> None:
        self._drop(("param", unit.index))
        if mark:
            self._mark(f"{phase}: release L{unit.index}")

    def _reduce_scatter_grad(self, unit: _Unit,
                             grads: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """Mean over ranks of this rank's shard of a unit's gradient: (S,) bf16.

        ``grads``: the unit's gradient as one flat (n,) tensor, or as [weight (out, in),
        bias (out,)].
        """
        full = torch.zeros(unit.padded, dtype=self.reduce_dtype, device=self.device)                # (P,)
        if isinstance(grads, torch.Tensor):
            full[:unit.n] = grads
        else:
            for view, g in zip(unit.views(full), grads):
                view.copy_(g)
        shard = torch.empty(unit.shard, dtype=self.reduce_dtype, device=self.device)                # (S,)
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

    def _on_grad_ready(self, unit: _Unit) -> None:
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
                    unit.flat_grad = torch.zeros(unit.n, dtype=torch.bfloat16, device=self.device)  # (n,)
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
                full = torch.empty(unit.padded, dtype=torch.bfloat16, device=self.device)           # (P,)
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
        loss = _loss(self._forward(x), y)
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
        weights = _storage_bytes(params + shards, seen)
        grads = _storage_bytes([p.grad for p in params] + [u.grad_shard for u in self.units]
                               + [None if s is None else s.grad for s in shards], seen)
        masters = [u.master for u in self.units]
        moments, counters = [], []
        for state in self.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    (moments if value.dim() > 0 else counters).append(value)
        optimizer = _storage_bytes(masters + moments, seen)
        other = _storage_bytes(counters, seen)
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


# ------------------------------------------------------------------------------ workers


def train_worker(rank: int, world_size: int, stage: int, sizes: Sequence[int], seed: int = 0,
                 n_steps: int = 3, micro_batch: int = 4, lr: float = 1e-2,
                 reduce_dtype: str = "bf16", prefetch: bool = False,
                 record_timeline: bool = False) -> dict[str, Any]:
    """Train :func:`make_mlp` for ``n_steps`` under ZeRO ``stage`` on this dp rank.

    Returns losses (mean over ranks, per step), params (full, as fp32 numpy arrays: exact for
    bf16, and safe to return through a pipe), bytes (measured after the
    last step), comm (ring bytes and call counts of the last step), shards (elements per unit on
    this rank) and padding (zero elements per unit), timeline (last step, if recorded).
    """
    x, y = backend.to_device(make_batches(sizes, seed, n_steps, world_size, micro_batch))
    log = CommLog(world_size)
    engine = ZeroDP(make_mlp(sizes, seed).to(backend.device()), stage, lr=lr, reduce_dtype=reduce_dtype,
                    prefetch=prefetch, log=log)
    losses = []
    for step in range(n_steps):
        log.clear()
        if record_timeline and step == n_steps - 1:
            engine.timeline = []
        local = torch.tensor([engine.step(x[step, rank], y[step, rank])], dtype=torch.float64,
                             device=x.device)
        dist.all_reduce(local)  # for reporting only: not part of the algorithm, not logged
        losses.append(local.item() / world_size)
    params = [backend.to_cpu(p.float()).numpy() for p in engine.full_parameters()]
    return {"losses": losses, "params": params, "bytes": engine.state_bytes(),
            "comm": log.ring_bytes(), "comm_counts": log.counts(),
            "shards": [u.shard if stage else u.n for u in engine.units],
            "padding": [u.padded - u.n if stage else 0 for u in engine.units],
            "timeline": engine.timeline}


def all_stages_worker(rank: int, world_size: int, sizes: Sequence[int], seed: int = 0,
                      n_steps: int = 3, micro_batch: int = 4, lr: float = 1e-2,
                      reduce_dtype: str = "bf16") -> dict[Any, dict[str, Any]]:
    """:func:`train_worker` for stages 0-3 (2 and 3 with their memory timelines) and for ZeRO-3
    with prefetch (key ``"3+prefetch"``), one after another in the same process group."""
    out: dict[Any, dict[str, Any]] = {}
    for stage in STAGES:
        out[stage] = train_worker(rank, world_size, stage, sizes, seed, n_steps, micro_batch, lr,
                                  reduce_dtype, record_timeline=stage >= 2)
    out["3+prefetch"] = train_worker(rank, world_size, 3, sizes, seed, n_steps, micro_batch, lr,
                                     reduce_dtype, prefetch=True, record_timeline=True)
    return out


def run_all_stages(dp: int, sizes: Sequence[int], seed: int = 0, n_steps: int = 3,
                   micro_batch: int = 4, lr: float = 1e-2, reduce_dtype: str = "bf16",
                   timeout_s: float = 180.0) -> dict[Any, list[dict[str, Any]]]:
    """Launch :func:`all_stages_worker` on ``dp`` ranks; results as ``{stage: [rank 0, rank 1, ...]}``."""
    from course_utils import launch

    _check_int("dp", dp, 1)
    _check_sizes(sizes)
    _check_reduce_dtype(reduce_dtype)
    by_rank = launch.run(all_stages_worker, dp, list(sizes), seed, n_steps, micro_batch, lr,
                         reduce_dtype, timeout_s=timeout_s)
    return {key: [r[key] for r in by_rank] for key in by_rank[0]}


def reference_train(sizes: Sequence[int], seed: int = 0, n_steps: int = 3, dp: int = 2,
                    micro_batch: int = 4, lr: float = 1e-2,
                    reduce_dtype: str = "bf16") -> dict[str, Any]:
    """The unsharded single-process reference: one bf16 model, MixedPrecisionAdam, same data.

    Each step runs the ``dp`` micro-batches one after another, sums their bf16 gradients in
    ``reduce_dtype`` in rank order, divides by ``dp`` and rounds to bf16: data parallelism's
    mean gradient. Returns losses (per step, mean over micro-batches) and params.
    """
    reduce = _check_reduce_dtype(reduce_dtype)
    x, y = make_batches(sizes, seed, n_steps, dp, micro_batch)
    model = make_mlp(sizes, seed)
    opt = memory.MixedPrecisionAdam(model, lr=lr)
    params = list(model.parameters())
    losses = []
    for step in range(n_steps):
        total = [torch.zeros(p.shape, dtype=reduce) for p in params]
        step_losses = []
        for r in range(dp):
            opt.zero_grad()
            loss = _loss(model(x[step, r]), y[step, r])
            loss.backward()
            step_losses.append(loss.item())
            for acc, p in zip(total, params):
                acc += p.grad.to(reduce)
        for acc, p in zip(total, params):
            p.grad = (acc / dp).to(torch.bfloat16)
        opt.step()
        losses.append(sum(step_losses) / dp)
    return {"losses": losses, "params": [p.detach().clone() for p in params]}


def sum_rounding_error(n_ranks: int, reduce_dtype: str, numel: int = 4096,
                       seed: int = 0) -> float:
    """Relative error of a data-parallel mean gradient whose sum is taken in ``reduce_dtype``.

    ``n_ranks`` bf16 gradients (``numel`` standard-normal elements each, from ``seed``) are added
    one rank at a time in ``reduce_dtype``, as a ring adds partial sums (each addition rounds to
    that dtype), divided by ``n_ranks`` and rounded to bf16, the dtype the gradient is stored in.
    Returns mean |result - exact mean| / mean |exact mean|, the exact mean computed in float64.
    """
    _check_int("n_ranks", n_ranks, 1)
    _check_int("numel", numel, 1)
    reduce = _check_reduce_dtype(reduce_dtype)
    g = torch.randn(n_ranks, numel, generator=torch.Generator().manual_seed(seed)).bfloat16()
    total = torch.zeros(numel, dtype=reduce)                  # (numel,) the running partial sum
    exact = torch.zeros(numel, dtype=torch.float64)
    for row in g:                                             # rank by rank, in order
        total = total + row.to(reduce)
        exact = exact + row.double()
    mean = (total / n_ranks).to(torch.bfloat16).double()
    exact = exact / n_ranks
    return ((mean - exact).abs().mean() / exact.abs().mean()).item()


def max_abs_diff(params: Sequence[Any], reference: Sequence[torch.Tensor]) -> float:
    """Largest |a - b| over two lists of same-shaped parameters (tensors or numpy arrays)."""
    if len(params) != len(reference):
        raise ValueError(f"params and reference must have the same length; got "
                         f"{len(params)} and {len(reference)}")
    worst = 0.0
    for a, b in zip(params, reference):
        a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
        if a.shape != b.shape:
            raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
        worst = max(worst, (a - b).abs().max().item())
    return worst


# ------------------------------------------------------------------------------ pictures

TIMELINE_KINDS = ("persistent", "gathered weights", "unsharded grads")
_EVENT_CODES = {"gather": "g", "prefetch": "p", "release": "r", "grads of": "∇",
                "reduce-scatter": "rs"}
TIMELINE_KEY = ("g = gather, p = prefetch, r = release, ∇ = gradient computed, "
                "rs = reduce-scatter; the digit is the layer")


def _check_timeline(rows: Any) -> list[dict[str, Any]]:
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError("a timeline must be a non-empty list of rows (train_worker's "
                         "'timeline', recorded with record_timeline=True)")
    for row in rows:
        if not isinstance(row, dict) or "event" not in row or any(k not in row
                                                                  for k in TIMELINE_KINDS):
            raise ValueError(f"each timeline row needs 'event' and {list(TIMELINE_KINDS)}; "
                             f"got {row!r}")
    return list(rows)


def short_event(event: str) -> str:
    """A timeline event as a tick label: ``'backward: reduce-scatter L1'`` -> ``'rs1'``."""
    if event in ("step start", "loss"):
        return event.split()[-1]
    if event == "optimizer step":
        return "Adam"
    _, _, what = event.partition(": ")
    verb, _, layer = what.rpartition(" L")
    return _EVENT_CODES.get(verb, verb) + layer


def timeline_peak(rows: Sequence[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """``(index, row)`` of the event at which the rank holds the most bytes (the first such)."""
    totals = [sum(r[k] for k in TIMELINE_KINDS) for r in _check_timeline(rows)]
    i = totals.index(max(totals))
    return i, rows[i]


def draw_memory_timeline(rows: Sequence[dict[str, Any]], ax: Any = None, *,
                         title: str | None = None, bottom: float | None = None,
                         top: float | None = None) -> Any:
    """Draw one rank's ZeRO-2 or ZeRO-3 memory timeline: the bytes it holds after each event.

    ``rows`` is :func:`train_worker`'s ``timeline``. Stacked steps: persistent state (grey),
    gathered weights and unsharded gradients (the course's state colours), in kB (10³ bytes).
    The y-axis starts at ``bottom`` bytes (default: a little under the persistent state, so the
    per-layer gathers are not a thin band on a huge block; a break mark on the axis says so):
    the grey band is drawn from ``bottom`` up, so nothing plotted lies outside the axes.
    Forward and backward are shaded, each event is a tick (:func:`short_event`, key in
    :data:`TIMELINE_KEY`), and the peak is marked. Returns the Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from course_utils import style

    rows = _check_timeline(rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.4))
    n = len(rows)
    xs = list(range(n + 1))
    stacks = [[r[k] for r in rows] for k in TIMELINE_KINDS]
    stacks = [s + s[-1:] for s in stacks]  # step="post": the last level lasts to x = n
    colors = [style.STATE_COLORS["buffers"], style.STATE_COLORS["weights"],
              style.STATE_COLORS["grads"]]
    labels = ["persistent state", "gathered weights", "unsharded gradients"]
    persistent = min(r["persistent"] for r in rows)
    peak_i, peak = timeline_peak(rows)
    peak_total = sum(peak[k] for k in TIMELINE_KINDS)
    extra = max(peak_total - persistent, 1)
    bottom = persistent - 0.35 * extra if bottom is None else bottom
    top = peak_total + 0.45 * extra if top is None else top
    if not bottom <= persistent <= peak_total <= top:
        raise ValueError(f"bottom={bottom} and top={top} must satisfy bottom <= the persistent "
                         f"state ({persistent} B) and top >= the peak ({peak_total} B)")
    # Drawn in bytes above `bottom` (the axis break): the grey band is the persistent state
    # above the break, and the tick labels give the real bytes.
    stacks[0] = [v - bottom for v in stacks[0]]
    for phase in ("forward", "backward"):  # shading first: the stacks are drawn over it
        idx = [i for i, r in enumerate(rows) if r["event"].startswith(phase + ":")]
        if idx:
            ax.axvspan(idx[0], idx[-1] + 1, color=style.PHASE_COLORS[phase], alpha=0.10, lw=0)
            ax.text((idx[0] + idx[-1] + 1) / 2, top - bottom, phase, ha="center", va="top",
                    color=style.PHASE_COLORS[phase], fontsize=11)
    ax.stackplot(xs, *stacks, step="post", colors=colors, labels=labels)
    ax.set_xlim(0, n)
    ax.set_ylim(0, top - bottom)
    ticks = [t for t in MaxNLocator(nbins=5).tick_values(bottom, top) if bottom <= t <= top]
    ax.set_yticks([t - bottom for t in ticks], [f"{t / 1e3:g}" for t in ticks])
    if bottom < persistent:
        ax.text(0.2, (persistent - bottom) / 2, f"persistent state: {persistent:,} B",
                va="center", fontsize=10, color="0.15")
    ax.set_xticks([i + 0.5 for i in range(n)], [short_event(r["event"]) for r in rows],
                  fontsize=10)
    ax.tick_params(axis="x", length=0)
    ax.annotate(f"peak {peak_total:,} B", xy=(peak_i + 0.5, peak_total - bottom),
                xytext=(peak_i + 0.5 - 0.06 * n, peak_total - bottom + 0.22 * extra),
                ha="right", va="center", fontsize=10,
                arrowprops={"arrowstyle": "->", "color": "0.3"})
    # a break mark at the foot of the y-axis: it does not start at zero
    for y in (0.0, 0.025):
        ax.plot([-0.012, 0.012], [y, y + 0.03], transform=ax.transAxes, color="0.2", lw=1,
                clip_on=False)
    ax.set_ylabel("kB held by rank 0")
    if title:
        ax.set_title(title, loc="left")
    return ax


def draw_memory_timelines(timelines: dict[str, Sequence[dict[str, Any]]],
                          width: float = 9.0) -> Any:
    """:func:`draw_memory_timeline` for each named timeline, stacked, on one y-scale, with one
    legend and the tick key. Returns the Figure."""
    import matplotlib.pyplot as plt

    if not isinstance(timelines, dict) or not timelines:
        raise ValueError("timelines must be a non-empty dict {title: timeline rows}")
    rows_all = [_check_timeline(rows) for rows in timelines.values()]
    persistent = min(r["persistent"] for rows in rows_all for r in rows)
    peak = max(sum(r[k] for k in TIMELINE_KINDS) for rows in rows_all for r in rows)
    extra = max(peak - persistent, 1)
    fig, axes = plt.subplots(len(timelines), 1, figsize=(width, 0.6 + 2.9 * len(timelines)),
                             squeeze=False)
    for ax, (title, rows) in zip(axes[:, 0], timelines.items()):
        draw_memory_timeline(rows, ax, title=title, bottom=persistent - 0.35 * extra,
                             top=peak + 0.45 * extra)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncols=len(labels), frameon=False)
    axes[-1, 0].set_xlabel(f"event ({TIMELINE_KEY})")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig


# ------------------------------------------------------------------------------ assignment harness

_SPIED = ("all_reduce", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
          "all_gather", "all_gather_single", "all_gather_into_tensor", "broadcast", "scatter")


class _SpyCollectives:
    """Within ``with``, record the name of every ``torch.distributed`` collective called."""

    def __enter__(self) -> list[str]:
        self.calls: list[str] = []
        self.saved = {}
        for name in _SPIED:
            original = getattr(dist, name, None)
            if original is None:
                continue
            self.saved[name] = original

            def spy(*args, _name=name, _original=original, **kwargs):
                self.calls.append(_name)
                return _original(*args, **kwargs)

            setattr(dist, name, spy)
        return self.calls

    def __exit__(self, *exc: Any) -> None:
        for name, original in self.saved.items():
            setattr(dist, name, original)


def shard_step_harness(rank: int, world_size: int, fn: Any, full_master: torch.Tensor,
                       local_grads: torch.Tensor, lr: float, betas: tuple[float, float],
                       eps: float) -> bytes:
    """Worker running a student's sharded Adam step on this dp rank, once per step.

    ``fn(local_grad, master, exp_avg, exp_avg_sq, step, lr, betas, eps, dp_group)``:
    local_grad (P,) fp32 is this rank's gradient of the whole flat buffer; master, exp_avg,
    exp_avg_sq (S,) fp32 are this rank's slices (S = P / world_size), to update in place; step
    counts from 1. ``full_master`` (P,) fp32; ``local_grads`` (n_steps, world_size, P).
    Returns, pickled, the slices after the last step, fn's return values and the collectives called.
    """
    import pickle

    padded = full_master.numel()
    if padded % world_size:
        raise ValueError(f"full_master has {padded} elements, not divisible by {world_size} ranks")
    s = padded // world_size
    full_master, local_grads = backend.to_device((full_master, local_grads))
    master = full_master[rank * s:(rank + 1) * s].clone()       # (S,) fp32
    exp_avg, exp_avg_sq = torch.zeros_like(master), torch.zeros_like(master)  # (S,) fp32
    returned = []
    with _SpyCollectives() as calls:
        for step in range(1, local_grads.shape[0] + 1):
            out = fn(local_grads[step - 1, rank].clone(), master, exp_avg, exp_avg_sq, step,
                     lr, betas, eps, None)
            if isinstance(out, torch.Tensor):
                out = out.detach().clone()
            returned.append(out)
    return pickle.dumps(backend.to_cpu({"master": master, "exp_avg": exp_avg,
                                        "exp_avg_sq": exp_avg_sq, "returned": returned,
                                        "calls": list(calls)}))


def run_shard_step(fn: Any, full_master: torch.Tensor, local_grads: torch.Tensor,
                   lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                   eps: float = 1e-8, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Run :func:`shard_step_harness` on ``local_grads.shape[1]`` ranks; results in rank order."""
    import pickle

    from course_utils import launch

    if not callable(fn):
        raise ValueError(f"fn must be a function; got {type(fn).__name__}")
    if not isinstance(full_master, torch.Tensor) or full_master.dim() != 1:
        raise ValueError("full_master must be a 1-D fp32 tensor (the padded flat buffer)")
    if not isinstance(local_grads, torch.Tensor) or local_grads.dim() != 3 \
            or local_grads.shape[2] != full_master.numel():
        raise ValueError("local_grads must have shape (n_steps, world_size, full_master.numel())")
    world_size = local_grads.shape[1]
    blobs = launch.run(shard_step_harness, world_size, fn, full_master, local_grads, lr,
                       tuple(betas), eps, timeout_s=timeout_s, show_output=False)
    return [pickle.loads(b) for b in blobs]


def _torchrun_worker(rank: int, world_size: int) -> dict[str, int]:
    out = {}
    for stage in STAGES:
        result = train_worker(rank, world_size, stage, [16, 32, 32, 8], n_steps=2)
        out[STAGE_NAMES[stage]] = result["bytes"]["total"]
    return out


if __name__ == "__main__":
    # torchrun --standalone --nproc-per-node N -m course_utils.zero.stages
    from course_utils import launch

    launch.torchrun_main(_torchrun_worker)
