"""Sizing training state: bytes-per-parameter layouts, unit conversion, and counting real bytes.

Units: 1 GB = 10**9 bytes, 1 GiB = 2**30 bytes. The lesson's example is mixed-precision Adam at
16 bytes/parameter (ZeRO paper, section 3.1: 2 + 2 + 12 with K = 12 optimizer bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from course_utils import style
from course_utils.models.toy import toy_mlp
from course_utils.runtime import backend
from course_utils.runtime import validate

__all__ = ["Layout", "LAYOUTS", "GB", "GiB", "layout", "state_bytes", "to_gb", "to_gib",
           "format_bytes", "fits", "count_state_bytes", "MixedPrecisionAdam",
           "ZERO_STAGES", "zero_state_bytes", "tiny_mlp", "replica_state_bytes",
           "plot_layouts", "plot_state_vs_size"]

GB = 10**9
GiB = 2**30


@dataclass(frozen=True)
class Layout:
    """Persistent bytes per parameter, by what they hold."""

    name: str
    weights: int      # the copy the forward/backward pass reads
    grads: int        # the accumulated gradient
    master: int       # a higher-precision copy the optimizer updates (0: none)
    optimizer: int    # optimizer statistics (Adam: first and second moments)
    description: str = ""
    words: str = ""   # a few words for legends and tables ("mixed-precision Adam")

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.optimizer

    @property
    def label(self) -> str:
        """Words for a legend: ``mixed-precision Adam (16 B/param)``."""
        return f"{self.words or self.name.replace('_', ' ')} ({self.total} B/param)"

    @property
    def optimizer_bucket(self) -> int:
        """Bytes the ZeRO paper's stage 1 shards: master copy plus optimizer statistics."""
        return self.master + self.optimizer

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights, "grads": self.grads, "master": self.master,
                "optimizer": self.optimizer}


LAYOUTS: dict[str, Layout] = {
    layout_.name: layout_ for layout_ in [
        Layout("mixed_adam16", 2, 2, 4, 8,
               "bf16/fp16 weights and grads, fp32 master copy, fp32 Adam moments (the lesson's)",
               "mixed-precision Adam"),
        Layout("mixed_adam_fp32_grads", 2, 4, 4, 8,
               "as mixed_adam16 but gradients accumulated in fp32",
               "mixed-precision Adam, FP32 gradients"),
        Layout("bf16_adam_no_master", 2, 2, 0, 8,
               "bf16 weights updated directly (no master copy), fp32 Adam moments",
               "BF16 Adam, no master copy"),
        Layout("fp32_adam", 4, 4, 0, 8, "everything in fp32: weights, grads, Adam moments",
               "FP32 Adam"),
        Layout("fp32_sgd", 4, 4, 0, 0, "fp32 weights and grads, plain SGD (no state)",
               "FP32 SGD"),
    ]
}


def layout(name: str | Layout) -> Layout:
    """Look up a layout by name (or pass a :class:`Layout` through)."""
    return name if isinstance(name, Layout) else validate.one_of("layout", name, LAYOUTS)


def _check_count(name: str, value: float, allow_zero: bool = True) -> None:
    """A count of bytes or parameters, inf allowed; the widgets show this message to students."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number; got {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        need = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be {need}; got {value!r}")


def state_bytes(n_params: float, layout_name: str | Layout = "mixed_adam16") -> float:
    """Persistent training-state bytes for ``n_params`` parameters: N x bytes/parameter."""
    _check_count("n_params", n_params)
    return n_params * layout(layout_name).total


def to_gb(n_bytes: float) -> float:
    """Bytes -> GB (10**9 bytes)."""
    _check_count("n_bytes", n_bytes)
    return n_bytes / GB


def to_gib(n_bytes: float) -> float:
    """Bytes -> GiB (2**30 bytes)."""
    _check_count("n_bytes", n_bytes)
    return n_bytes / GiB


def format_bytes(n_bytes: float, unit: str = "GB", digits: int = 2) -> str:
    """``112000000000 -> '112.00 GB'``; unit is one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB."""
    _check_count("n_bytes", n_bytes)
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    return f"{n_bytes / validate.one_of('unit', unit, scale):.{digits}f} {unit}"


def fits(n_bytes: float, device_gb: float) -> bool:
    """Does ``n_bytes`` of persistent state fit in a device of ``device_gb`` GB?"""
    _check_count("n_bytes", n_bytes)
    _check_count("device_gb", device_gb, allow_zero=False)
    return n_bytes <= device_gb * GB


# ------------------------------------------------------------------------- counting real bytes


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    """(address, bytes) of the memory behind ``t``; None if it has none: an empty storage, or a
    meta tensor's (``nbytes()`` gives the size it would take, but nothing is allocated)."""
    storage = t.untyped_storage()
    return (storage.data_ptr(), storage.nbytes()) \
        if storage.nbytes() and storage.device.type != "meta" else None


def _tally(tensors: Iterable[torch.Tensor], seen: set) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):  # DTensor: count this rank's shard
            t = t.to_local()
        key = _storage_key(t)
        if key is None or key in seen:
            continue
        seen.add(key)
        total += key[1]
    return total


def count_state_bytes(model: torch.nn.Module,
                      optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes the model's parameters, gradients and optimizer state really hold.

    Each storage is counted once (tied weights, views and shared gradient buffers are not
    double-counted; a parameter's ``main_grad``, an fp32 gradient kept beside a low-precision
    weight, counts as gradient); a meta tensor's not at all (it has a size, no memory). Returns
    ``{"weights", "grads", "master", "optimizer", "other", "total"}``:
    ``master`` counts fp32 copies a :class:`MixedPrecisionAdam` keeps; ``optimizer`` counts
    optimizer tensors shaped like a parameter (Adam's moments); ``other`` the rest (Adam's
    per-parameter ``step`` counters: 4 bytes each, which a bytes-per-parameter layout ignores).
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    seen: set = set()
    params = list(model.parameters())
    grads = [g for p in params for g in (p.grad, getattr(p, "main_grad", None))]
    out = {"weights": _tally(params, seen), "grads": _tally(grads, seen),
           "master": 0, "optimizer": 0, "other": 0}
    if optimizer is not None:
        inner = getattr(optimizer, "inner", optimizer)
        master = getattr(optimizer, "master_params", [])
        out["master"] = _tally(master, seen)
        for state in inner.state.values():
            for value in state.values():
                if not isinstance(value, torch.Tensor):
                    continue
                bucket = "optimizer" if value.dim() > 0 else "other"
                out[bucket] += _tally([value], seen)
    out["total"] = sum(out[k] for k in ("weights", "grads", "master", "optimizer", "other"))
    return out


class MixedPrecisionAdam:
    """Adam in the lesson's 16-byte layout: bf16 model, fp32 master weights and moments.

    The model's parameters (and so its gradients) are bf16. The optimizer keeps an fp32 master
    copy of each parameter and runs ``torch.optim.Adam`` on it; after each step the master
    values are rounded back into the bf16 weights. Persistent bytes per parameter:
    2 (bf16 weight) + 2 (bf16 grad) + 4 (fp32 master) + 8 (fp32 moments) = 16.
    """

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, **adam_kwargs):
        params = list(model.parameters())
        if not params:
            raise ValueError("model has no parameters")
        bad = [p.dtype for p in params if p.dtype not in (torch.bfloat16, torch.float16)]
        if bad:
            raise ValueError(f"model parameters must be bf16 or fp16 (call model.bfloat16()); "
                             f"found {bad[0]}")
        self.params = params
        self.master_params = [p.detach().float().clone().requires_grad_(True) for p in params]
        self.inner = torch.optim.Adam(self.master_params, lr=lr, **adam_kwargs)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master_params):
            m.grad = None if p.grad is None else p.grad.float()  # transient fp32 copy
        self.inner.step()
        for p, m in zip(self.params, self.master_params):
            p.copy_(m)  # round the fp32 master into the bf16 weight
            m.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


# ------------------------------------------------------------------------------ ZeRO stages

ZERO_STAGES = (0, 1, 2, 3)


def zero_state_bytes(n_params: float, dp: int, stage: int,
                     layout_name: str | Layout = "mixed_adam16") -> dict[str, float]:
    """Persistent bytes per data-parallel rank under ZeRO ``stage`` (0 = replicated DP).

    Stage 1 shards the optimizer bucket (master copy + moments), stage 2 also the gradients,
    stage 3 also the weights (ZeRO paper, section 5.1). Returns ``{"weights", "grads",
    "optimizer", "total"}`` in bytes, with "optimizer" = master copy + optimizer statistics.
    Ideal sharding: N/D per rank, without padding.
    """
    _check_count("n_params", n_params)
    validate.check_int("dp", dp)  # data-parallel ranks
    validate.one_of("stage", stage, ZERO_STAGES)
    lay = layout(layout_name)
    out = {
        "weights": lay.weights / (dp if stage >= 3 else 1),
        "grads": lay.grads / (dp if stage >= 2 else 1),
        "optimizer": lay.optimizer_bucket / (dp if stage >= 1 else 1),
    }
    out = {k: v * n_params for k, v in out.items()}
    out["total"] = out["weights"] + out["grads"] + out["optimizer"]
    return out


# ------------------------------------------------------------------ a replica's state, measured


def tiny_mlp(widths: tuple[int, ...] = (64, 256, 64), seed: int = 0,
             dtype: torch.dtype = torch.bfloat16) -> torch.nn.Sequential:
    """A small MLP (Linear-GELU-...-Linear) with deterministic weights, for byte counting
    (:func:`course_utils.models.toy.toy_mlp`)."""
    widths = validate.check_ints("widths", widths, 1, min_len=2)
    return toy_mlp(widths, seed=seed, activation="gelu", dtype=dtype)


def replica_state_bytes(dp_rank: int, dp_size: int, widths: tuple[int, ...] = (64, 256, 64),
                        seed: int = 0) -> dict[str, int]:
    """Worker: one data-parallel step of a bf16 MLP with 16-byte Adam; return this rank's bytes.

    Every rank builds the same model, trains on its own batch, averages gradients with an
    all-reduce, and steps. Run with ``launch.run(replica_state_bytes, D)``.
    """
    import torch.distributed as dist

    dev = backend.device()  # this rank's GPU under NCCL, else the CPU
    model = tiny_mlp(widths, seed).to(dev)
    opt = MixedPrecisionAdam(model, lr=1e-3)
    g = torch.Generator().manual_seed(seed + 1000 + dp_rank)  # each rank's own examples
    x = torch.randn(8, widths[0], generator=g).to(dev, torch.bfloat16)  # (B, C_in)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
    opt.step()
    counts = count_state_bytes(model, opt)
    counts["n_params"] = sum(p.numel() for p in model.parameters())
    return counts


# ----------------------------------------------------------------------------------- figures

_PART_WORDS = {"weights": "weights", "grads": "gradients", "master": "FP32 master copy",
               "optimizer": "Adam moments"}


def plot_layouts(n_params: float = 7e9, names: Iterable[str] | None = None, ax=None):
    """Figure: each layout's bytes per parameter as a bar split into its parts (the course's
    state colours), with the state of an ``n_params`` model at the bar's end. Returns the
    figure."""
    import matplotlib.pyplot as plt

    _check_count("n_params", n_params, allow_zero=False)
    names = list(LAYOUTS) if names is None else list(names)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.55 * len(names) + 1.6), layout="constrained")
    in_legend: set[str] = set()
    widest = max(layout(n).total for n in names)
    for row, name in enumerate(names):
        lay, left = layout(name), 0
        for part, nbytes in lay.parts().items():
            if not nbytes:
                continue
            ax.barh(row, nbytes, left=left, height=0.62, color=style.STATE_COLORS[part],
                    label=None if part in in_legend else _PART_WORDS[part])
            in_legend.add(part)
            ax.text(left + nbytes / 2, row, str(nbytes), ha="center", va="center",
                    color="white", fontweight="bold")
            left += nbytes
        ax.text(left + 0.3, row, f"{lay.total} B/param: {state_bytes(n_params, name) / GB:.0f} GB",
                va="center")
    ax.set_yticks(range(len(names)), [layout(n).words or n for n in names])
    ax.invert_yaxis()
    ax.set_xlim(0, widest * 1.6)
    ax.set_xlabel("bytes per parameter")
    ax.set_title(f"Persistent state by layout (GB for a {n_params / 1e9:g}B-parameter model)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return ax.figure


def plot_state_vs_size(budgets_gb: dict[str, float],
                       names: Iterable[str] = ("mixed_adam16", "bf16_adam_no_master",
                                               "fp32_sgd"),
                       mark_params: float = 7e9, max_params: float = 16e9, ax=None):
    """Figure: persistent state (GB) against parameter count for each layout, the device
    ``budgets_gb`` (label -> GB) as horizontal lines labelled at the right, a dot where the
    first layout's state reaches each budget (the largest model that fits), and the state of a
    ``mark_params`` model in the first layout. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.transforms import blended_transform_factory

    names = list(names)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4.8), layout="constrained")
    b = 1e9
    top = max(state_bytes(max_params, names[0]) / GB, max(budgets_gb.values())) * 1.08
    right = blended_transform_factory(ax.transAxes, ax.transData)
    for text, gb in budgets_gb.items():
        ax.axhline(gb, color="#aaaaaa", lw=1, zorder=1)
        ax.text(1.01, gb, text, transform=right, va="center", color="#555555", clip_on=False)
    for name, dash in zip(names, ("-", "--", ":", "-.")):
        ax.plot([0, max_params / b], [0, state_bytes(max_params, name) / GB], dash, color="#333333",
                lw=2.2 if dash == "-" else 1.6, label=layout(name).label, zorder=3)
    fits_n = [gb * GB / layout(names[0]).total for gb in budgets_gb.values()]
    ax.plot([n / b for n in fits_n], list(budgets_gb.values()), "o", color="#333333", ms=6,
            zorder=4, label=f"largest model that fits ({layout(names[0]).total} B/param)")
    for n, gb in zip(fits_n, budgets_gb.values()):
        ax.annotate(f"{n / b:.1f}B", (n / b, gb), xytext=(-4, 3), textcoords="offset points",
                    ha="right", va="bottom")
    mark_gb = state_bytes(mark_params, names[0]) / GB
    ax.plot([mark_params / b] * 2, [0, mark_gb], color="black", lw=1, zorder=2)
    ax.plot([mark_params / b], [mark_gb], "D", color="black", ms=6, zorder=4)
    ax.annotate(f"{mark_params / b:g}B model: {mark_gb:.0f} GB", (mark_params / b, mark_gb),
                xytext=(-6, 4), textcoords="offset points", ha="right", va="bottom")
    ax.set_xlim(0, max_params / b)
    ax.set_ylim(0, top)
    ax.set_xlabel("parameters N (billions)")
    ax.set_ylabel("persistent state (GB)")
    ax.set_title("Training state grows linearly with N (before activations)")
    ax.legend(loc="upper left")
    return ax.figure


if __name__ == "__main__":
    # torchrun --standalone --nproc-per-node 2 -m course_utils.memory.sizing
    from course_utils.launch import torchrun_main

    torchrun_main(replica_state_bytes)


style.LABELS.update({name: spec.label for name, spec in LAYOUTS.items()})  # style.label's words
