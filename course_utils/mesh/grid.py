"""A device mesh: ranks laid out on one grid whose axes are the parallelism degrees.

A job with independent axes uses ``dp x pp x tp`` devices. Rank numbers fill the grid in
row-major order, so the *last* axis varies fastest: with ``names=("dp", "pp", "tp")`` the ranks
of one TP group are consecutive, and consecutive ranks share a node. That is why the innermost
axis should be the one that talks most often (TP: collectives in every layer).

Hand-built here from a grid, then compared with what ``torch.distributed.device_mesh.
init_device_mesh`` builds on real ranks (:func:`torch_mesh_groups`), and used for a small 2-D
(DP x TP) training step checked against one device (:func:`dp_tp_step`).

Run the 2-D step under torchrun (the real launcher)::

    torchrun --standalone --nproc-per-node 4 -m course_utils.mesh.grid
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from course_utils.models.toy import seeded
from course_utils.runtime import backend
from course_utils.runtime.validate import check_int

__all__ = ["Mesh", "AXES", "axis_group", "torch_mesh_groups", "hand_mesh_groups", "dp_tp_batch",
           "DpTpMLP", "reference_step", "dp_tp_step", "dp_tp_step_dtensor"]

AXES = ("dp", "pp", "tp")  # the lesson's order, outermost to innermost (TP innermost)


def _check_sizes(sizes: Sequence[int], names: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes:
        raise ValueError(f"sizes must be a non-empty sequence of ints >= 1; got {sizes!r}")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"sizes must be ints >= 1 (one degree per axis); got {list(sizes)!r}")
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise ValueError(f"names must be a sequence of axis names; got {names!r}")
    if len(names) != len(sizes):
        raise ValueError(f"names must give one name per size: {len(sizes)} sizes "
                         f"{list(sizes)} but names={list(names)!r}")
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"names must be distinct non-empty strings; got {list(names)!r}")
    return tuple(sizes), tuple(names)


@dataclass(frozen=True)
class Mesh:
    """Ranks ``0 .. prod(sizes)-1`` laid out row-major on a grid with named axes (outer first)."""

    sizes: tuple[int, ...]
    names: tuple[str, ...] = AXES

    def __post_init__(self) -> None:
        sizes, names = _check_sizes(self.sizes, self.names)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "names", names)

    @classmethod
    def from_degrees(cls, order: Sequence[str] = AXES, **degrees: int) -> "Mesh":
        """``Mesh.from_degrees(dp=4, pp=2, tp=4)``; ``order`` lists the axes outermost first."""
        if sorted(order) != sorted(degrees):
            raise ValueError(f"order must name each axis of {sorted(degrees)} once; got {list(order)!r}")
        return cls(tuple(degrees[n] for n in order), tuple(order))

    @property
    def world_size(self) -> int:
        """Number of devices: the product of the degrees."""
        return math.prod(self.sizes)

    def size(self, axis: str) -> int:
        """Degree of one axis."""
        return self.sizes[self._axis(axis)]

    def grid(self) -> torch.Tensor:
        """The rank grid, shape ``sizes``: ``grid()[c0, c1, ...]`` is the rank at those coordinates."""
        return torch.arange(self.world_size).reshape(self.sizes)  # [*sizes]

    def _axis(self, axis: str) -> int:
        if axis not in self.names:
            raise ValueError(f"axis must be one of {list(self.names)}; got {axis!r}")
        return self.names.index(axis)

    def _rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int from 0 to {self.world_size - 1}; got {rank!r}")
        return rank

    def coords(self, rank: int) -> dict[str, int]:
        """``{axis: index}`` of ``rank``: repeated divmod, innermost axis first."""
        rest = self._rank(rank)
        out = {}
        for name, size in zip(reversed(self.names), reversed(self.sizes)):
            rest, out[name] = divmod(rest, size)
        return {name: out[name] for name in self.names}

    def rank_of(self, **coords: int) -> int:
        """The rank at ``coords`` (every axis given): ``sum(c_i * stride_i)``."""
        if sorted(coords) != sorted(self.names):
            raise ValueError(f"coords must give each axis of {list(self.names)}; got {sorted(coords)}")
        rank = 0
        for name, size in zip(self.names, self.sizes):
            c = coords[name]
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < size:
                raise ValueError(f"coords[{name!r}] must be an int from 0 to {size - 1}; got {c!r}")
            rank = rank * size + c
        return rank

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``: ranks that differ only in that coordinate, sorted."""
        dim = self._axis(axis)
        g = self.grid().movedim(dim, -1).reshape(-1, self.sizes[dim])  # [n_groups, size(axis)]
        return sorted(row.tolist() for row in g)

    def group(self, rank: int, axis: str) -> list[int]:
        """The group along ``axis`` that contains ``rank``."""
        self._rank(rank)
        return next(g for g in self.groups(axis) if rank in g)

    def node_of(self, rank: int, devices_per_node: int) -> int:
        """Node that holds ``rank`` when ranks fill nodes in order (rank // devices_per_node)."""
        check_int("devices_per_node", devices_per_node)
        return self._rank(rank) // devices_per_node

    def groups_crossing_nodes(self, axis: str, devices_per_node: int) -> list[list[int]]:
        """Groups along ``axis`` whose ranks sit on more than one node."""
        check_int("devices_per_node", devices_per_node)
        return [g for g in self.groups(axis)
                if len({r // devices_per_node for r in g}) > 1]

    def table(self) -> str:
        """One line per rank: ``rank  dp pp tp`` coordinates (for printing)."""
        width = max(4, len(str(self.world_size - 1)))
        head = "rank".rjust(width) + "".join(n.rjust(4) for n in self.names)
        rows = [str(r).rjust(width) + "".join(str(c).rjust(4) for c in self.coords(r).values())
                for r in range(self.world_size)]
        return "\n".join([head] + rows)


def draw_rank_groups(mesh: Mesh, rank: int, ax=None):
    """Figure: the mesh's ranks on a grid (rows: the first axis; columns: the other axes, the
    last one fastest), with ``rank``'s group along each axis in that axis's course colour
    (:data:`course_utils.style.AXIS_COLORS`). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    from course_utils import style

    mesh._rank(rank)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.55 * mesh.sizes[0] + 1.3), layout="constrained")
    rows = mesh.sizes[0] if len(mesh.sizes) > 1 else 1
    cols = mesh.world_size // rows
    colour_of = {}
    for axis in reversed(mesh.names):  # the innermost axis first in the legend
        for r in mesh.group(rank, axis):
            colour_of.setdefault(r, style.AXIS_COLORS.get(axis, "#999999"))
    for r in range(mesh.world_size):
        y, x = divmod(r, cols)
        mine = r == rank
        face = "white" if mine else colour_of.get(r, "#eeeeee")
        ax.add_patch(Rectangle((x + 0.05, y + 0.06), 0.9, 0.88, facecolor=face,
                               edgecolor="black" if mine else "none", linewidth=2.5))
        _ = ax.text(x + 0.5, y + 0.5, str(r), ha="center", va="center",
                    fontweight="bold" if mine else "normal",
                    color="white" if r in colour_of and not mine else "black")
    _ = ax.set_xlim(0, cols)
    _ = ax.set_ylim(rows, 0)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    last = mesh.names[-1] if len(mesh.sizes) > 1 else mesh.names[0]
    _ = ax.set_xticks([x + 0.5 for x in range(cols)],
                      [f"{last} {x % mesh.sizes[-1]}" for x in range(cols)])
    if len(mesh.sizes) > 1:
        _ = ax.set_yticks([y + 0.5 for y in range(rows)],
                          [f"{mesh.names[0]} {y}" for y in range(rows)])
    else:
        _ = ax.set_yticks([])
    block = mesh.sizes[-1]
    if len(mesh.sizes) > 2:  # the middle axes label blocks of columns, on top
        middle = mesh.names[1:-1]
        top = ax.secondary_xaxis("top")
        labels = []
        for b in range(cols // block):
            c = mesh.coords(b * block)
            labels.append(", ".join(f"{n} {c[n]}" for n in middle))
        _ = top.set_xticks([b * block + block / 2 for b in range(cols // block)], labels)
        top.tick_params(length=0)
        top.spines["top"].set_visible(False)
        for b in range(1, cols // block):
            ax.axvline(b * block, color="black", linewidth=1.5)
    handles = [Patch(facecolor="white", edgecolor="black", linewidth=2.5,
                     label=f"rank {rank}: " + ", ".join(f"{n} {c}" for n, c in
                                                       mesh.coords(rank).items()))]
    handles += [Patch(color=style.AXIS_COLORS.get(axis, "#999999"),
                      label=f"its {axis.upper()} group {mesh.group(rank, axis)}")
                for axis in reversed(mesh.names)]
    _ = ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5),
                  frameon=False)
    return ax.figure


# ----------------------------------------------------------------- the same mesh, built by torch


def torch_mesh_groups(rank: int, world_size: int, sizes: tuple[int, ...],
                      names: tuple[str, ...]) -> dict:
    """Worker: build ``init_device_mesh(device type, sizes)`` and report this rank's view of it.

    Returns ``{"coords": {axis: index}, "groups": {axis: [ranks of my group]},
    "mesh": grid as nested lists}`` as torch sees it.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(backend.device().type, tuple(sizes), mesh_dim_names=tuple(names))
    coordinate = mesh.get_coordinate()
    groups = {name: sorted(dist.get_process_group_ranks(mesh.get_group(name))) for name in names}
    return {"coords": dict(zip(names, coordinate)), "groups": groups,
            "mesh": mesh.mesh.tolist()}


def hand_mesh_groups(sizes: tuple[int, ...], names: tuple[str, ...]) -> list[dict]:
    """The same report as :func:`torch_mesh_groups`, for every rank, from :class:`Mesh` alone."""
    m = Mesh(tuple(sizes), tuple(names))
    return [{"coords": m.coords(r), "groups": {n: m.group(r, n) for n in m.names},
             "mesh": m.grid().tolist()} for r in range(m.world_size)]


def axis_group(mesh: Mesh, rank: int, axis: str, timeout_s: float = 60.0):
    """Collective: every rank creates every group along ``axis``; returns (my group, its ranks).

    ``dist.new_group`` must be called by all ranks, for every group, in the same order.
    """
    mine = mesh.group(rank, axis)
    handle = None
    for ranks in mesh.groups(axis):
        group = backend.new_group(ranks, timeout_s=timeout_s)
        if ranks == mine:
            handle = group
    return handle, mine


# ------------------------------------------------------------------- a 2-D job: DP x TP on 4 ranks

DIM, HIDDEN, BATCH = 8, 16, 8  # model width, hidden width (split over TP), global batch


class DpTpMLP(torch.nn.Module):
    """``down(relu(up(x)))``: the two-layer block tensor parallelism splits (Megatron MLP)."""

    def __init__(self, dim: int = DIM, hidden: int = HIDDEN):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))  # [B, dim] -> [B, hidden] -> [B, dim]


def dp_tp_batch(seed: int, batch: int = BATCH, dim: int = DIM) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch ``(x [batch, dim], y [batch, dim])`` for ``seed``."""
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(batch, dim, generator=g), torch.randn(batch, dim, generator=g)


def _model(seed: int) -> DpTpMLP:
    with seeded(seed):
        return DpTpMLP()


def reference_step(seed: int, lr: float = 0.1) -> dict[str, torch.Tensor]:
    """One SGD step of the whole model on the whole batch, on one device.

    Returns the loss, the gradients and the updated weights (names as in ``DpTpMLP``).
    """
    model = _model(seed)
    x, y = dp_tp_batch(seed)
    loss = torch.nn.functional.mse_loss(model(x), y)  # mean over the global batch
    loss.backward()
    out = {"loss": loss.detach()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            out[f"grad.{name}"] = p.grad.clone()
            out[f"new.{name}"] = p - lr * p.grad
    return out


def _dp_rows(dp_rank: int, dp: int, batch: int = BATCH) -> slice:
    """Rows of the global batch that DP rank ``dp_rank`` of ``dp`` takes (contiguous, nearly
    equal: when ``dp`` does not divide ``batch`` the slices differ by one example)."""
    if dp > batch:
        raise ValueError(f"dp must be at most the global batch of {batch} examples (every DP "
                         f"rank needs at least one); got dp={dp}")
    return slice(dp_rank * batch // dp, (dp_rank + 1) * batch // dp)


def _tp_slices(tp_rank: int, tp: int, hidden: int = HIDDEN) -> slice:
    if hidden % tp:
        raise ValueError(f"tp must divide the hidden width {hidden}; got tp={tp}")
    chunk = hidden // tp
    return slice(tp_rank * chunk, (tp_rank + 1) * chunk)


def dp_tp_step(rank: int, world_size: int, seed: int, dp: int, tp: int,
               lr: float = 0.1) -> dict[str, torch.Tensor]:
    """Worker: one SGD step with DP over batch halves and TP over the hidden width, by hand.

    Mesh ``(dp, tp)``: TP splits ``up`` by output columns and ``down`` by input rows, so each
    TP rank makes a partial ``[B/dp, dim]`` output that an all-reduce over ``tp_group`` sums.
    DP ranks see different slices of the batch. Each weights its mean loss by its share of the
    examples (``n_local / BATCH``), so an all-reduce *sum* over ``dp_group`` gives the gradient
    of the mean over the whole batch, also when ``dp`` does not divide it (dp = 3 gives slices
    of 2, 3 and 3; averaging the three means would weight the examples unequally: module 2's
    mean of means). Returns this rank's loss, gradient shards and updated weight shards.
    """
    import torch.distributed as dist

    if dp * tp != world_size:
        raise ValueError(f"dp x tp must equal world_size {world_size}; got dp={dp}, tp={tp}")
    mesh = Mesh((dp, tp), ("dp", "tp"))
    dp_group, _ = axis_group(mesh, rank, "dp")
    tp_group, _ = axis_group(mesh, rank, "tp")
    dp_rank, tp_rank = mesh.coords(rank)["dp"], mesh.coords(rank)["tp"]

    dev = backend.device()  # this rank's GPU under NCCL, else the CPU
    full = _model(seed)  # every rank builds the same model, then keeps its shard
    cols = _tp_slices(tp_rank, tp)

    def shard(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(dev, copy=True).requires_grad_()
    up_w = shard(full.up.weight[cols])                                 # [hidden/tp, dim]
    up_b = shard(full.up.bias[cols])                                   # [hidden/tp]
    down_w = shard(full.down.weight[:, cols])                          # [dim, hidden/tp]
    down_b = shard(full.down.bias)                                     # [dim], replicated over TP

    x, y = dp_tp_batch(seed)
    rows = _dp_rows(dp_rank, dp)
    x, y = x[rows].to(dev), y[rows].to(dev)                            # [n_local, dim]
    h = torch.relu(x @ up_w.T + up_b)                                  # [n_local, hidden/tp]
    partial = h @ down_w.T                                             # [n_local, dim], a TP partial sum
    out = _AllReduceSum.apply(partial, tp_group) + down_b              # [n_local, dim]
    share = (rows.stop - rows.start) / BATCH                           # my share of the examples
    loss = torch.nn.functional.mse_loss(out, y) * share                # my mean, weighted by count
    loss.backward()

    result = {}
    with torch.no_grad():
        for name, p in [("up.weight", up_w), ("up.bias", up_b), ("down.weight", down_w),
                        ("down.bias", down_b)]:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=dp_group)  # weighted sum = mean
            result[f"grad.{name}"] = p.grad.clone()
            result[f"new.{name}"] = p - lr * p.grad
        loss_sum = loss.detach().clone()
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM, group=dp_group)
    result["loss"] = loss_sum
    return _to_numpy(result)


def _to_numpy(result: dict[str, torch.Tensor]) -> dict:
    """Results travel back to the launcher as numpy arrays (pickled by value).

    A torch tensor is sent through a shared-memory file descriptor that can vanish when the
    rank exits first (seen: "Connection reset by peer" in 4 of 10 launches).
    """
    return {k: backend.to_cpu(v.detach()).numpy().copy() for k, v in result.items()}


class _AllReduceSum(torch.autograd.Function):
    """Forward: sum over the group. Backward: the gradient of a sum is passed through as is."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        import torch.distributed as dist

        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def dp_tp_step_dtensor(rank: int, world_size: int, seed: int, dp: int, tp: int,
                       lr: float = 0.1) -> dict[str, torch.Tensor]:
    """Worker: the same step with torch's API: ``init_device_mesh`` + ``parallelize_module``.

    TP: ``ColwiseParallel`` on ``up``, ``RowwiseParallel`` on ``down`` over ``mesh["tp"]``;
    DP: each rank's mean loss weighted by its share of the examples, gradients summed over
    ``mesh["dp"]``'s group (as in :func:`dp_tp_step`). Returns this rank's local shards (numpy).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    dev = backend.device()
    mesh = init_device_mesh(dev.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(_model(seed).to(dev), mesh["tp"],
                               {"up": ColwiseParallel(), "down": RowwiseParallel()})
    dp_rank = mesh.get_local_rank("dp")
    x, y = backend.to_device(dp_tp_batch(seed), dev)
    rows = _dp_rows(dp_rank, dp)
    share = (rows.stop - rows.start) / BATCH                      # my share of the examples
    loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows]) * share  # [n_local, dim] output
    loss.backward()
    result = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            grad = p.grad.to_local().clone()
            dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=mesh.get_group("dp"))
            result[f"grad.{name}"] = grad
            result[f"new.{name}"] = p.to_local() - lr * grad
        loss_sum = loss.detach().clone()
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM, group=mesh.get_group("dp"))
    result["loss"] = loss_sum
    return _to_numpy(result)


def shard_of(full: dict[str, torch.Tensor], tp_rank: int, tp: int) -> dict[str, torch.Tensor]:
    """The TP shard of a reference step's tensors that rank ``tp_rank`` should hold."""
    cols = _tp_slices(tp_rank, tp)
    out = {}
    for key, value in full.items():
        if key.endswith("up.weight") or key.endswith("up.bias"):
            out[key] = value[cols]
        elif key.endswith("down.weight"):
            out[key] = value[:, cols]
        else:
            out[key] = value
    return out


def check_dp_tp(seeds: Sequence[int] = (0, 1), dp: int = 2, tp: int = 2,
                timeout_s: float = 120.0) -> list[str]:
    """Run the hand-built and the DTensor DP x TP step on ``dp*tp`` ranks for each seed, assert
    both equal the one-device step (loss, gradient shards, updated shards); one line per seed."""
    from course_utils import launch

    lines = []
    for seed in seeds:
        ref = reference_step(seed)
        for fn in (dp_tp_step, dp_tp_step_dtensor):
            results = launch.run(functools.partial(fn, seed=seed, dp=dp, tp=tp), dp * tp,
                                 timeout_s=timeout_s)
            for rank, got in enumerate(results):
                want = shard_of(ref, Mesh((dp, tp), ("dp", "tp")).coords(rank)["tp"], tp)
                for key, value in want.items():
                    torch.testing.assert_close(torch.as_tensor(got[key]), value)
        lines.append(f"seed {seed}: loss {float(ref['loss']):.4f}; on all {dp * tp} ranks the "
                     "hand-built and the DTensor step equal one device (loss, grads, new weights)")
    return lines


def torchrun_worker(rank: int, world_size: int, seed: int = 0) -> float:
    """Worker for torchrun: one DP x TP step (dp = 2, tp = world_size / 2: TP inside a node, DP
    across two nodes) checked against the one-device step; returns this rank's largest
    difference from its shard of the reference (loss, gradients, new weights)."""
    if world_size % 2:
        raise ValueError(f"world_size must be even (dp = 2); got {world_size}")
    dp, tp = 2, world_size // 2
    got = dp_tp_step(rank, world_size, seed, dp, tp)
    want = shard_of(reference_step(seed), Mesh((dp, tp), ("dp", "tp")).coords(rank)["tp"], tp)
    return max(float((torch.as_tensor(got[k]) - v).abs().max()) for k, v in want.items())


__all__ += ["shard_of", "check_dp_tp", "draw_rank_groups", "torchrun_worker"]


if __name__ == "__main__":
    # one node:  torchrun --standalone --nproc-per-node 4 -m course_utils.mesh.grid
    # two nodes: torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \
    #                --rdzv-endpoint HOST:29500 -m course_utils.mesh.grid      (on each node)
    from course_utils import launch

    launch.torchrun_main(torchrun_worker)
