"""The five collectives data parallelism and ZeRO are built from, run once on real gloo ranks.

all_reduce, reduce, broadcast, all_gather and reduce_scatter: what each rank holds before and
after, a single-process reference for each, and one small matplotlib picture per collective.

Public API (other modules build on it):

* :data:`COLLECTIVES`: the five names, in teaching order.
* :func:`shard_sizes` / :func:`shard_bounds`: how a flat tensor of ``numel`` elements is split
  over ranks (the first ``numel % world_size`` ranks get one extra element, as ``tensor_split``).
* :func:`all_gather_flat` / :func:`reduce_scatter_flat`: gloo-safe all-gather and reduce-scatter
  of flat tensors, uneven shard sizes allowed (padded under the hood).
* :func:`example_inputs` / :func:`reference`: small readable per-rank inputs and the outputs a
  single process computes for them.
* :func:`collective_worker`, :func:`all_gather_worker`, :func:`reduce_scatter_worker`,
  :func:`hello`: workers for :func:`course_utils.launch.run`.
* :func:`run_collective`: run one collective on real ranks, return ``(before, after)``.
* :func:`draw_collective`: the picture (one row per rank, before -> after, cells coloured by
  the rank(s) their value came from).

Run a worker under torchrun::

    torchrun --standalone --nproc-per-node 2 -m course_utils.launch \
        course_utils.collectives.primitives:hello
    torchrun --standalone --nproc-per-node 3 -m course_utils.collectives.primitives
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.runtime import backend
from course_utils.runtime.validate import check_index, check_int, one_of

__all__ = ["COLLECTIVES", "REDUCE_OPS", "shard_sizes", "shard_bounds", "all_gather_flat",
           "reduce_scatter_flat", "example_inputs", "reference", "collective_worker",
           "all_gather_worker", "reduce_scatter_worker", "hello", "run_collective",
           "draw_collective", "provenance"]

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN}
_WORDS = {"all_reduce": "all-reduce", "reduce": "reduce", "broadcast": "broadcast",
          "all_gather": "all-gather", "reduce_scatter": "reduce-scatter"}
_SUMMARY = {
    "all_reduce": "every rank ends with the sum of all ranks' tensors",
    "reduce": "only the root ends with the sum; other ranks' buffers are scratch",
    "broadcast": "every rank ends with the root's tensor",
    "all_gather": "every rank ends with all ranks' shards, concatenated in rank order",
    "reduce_scatter": "rank r ends with shard r of the sum",
}


# ------------------------------------------------------------------------------ argument checks


def _check_flat(arg: str, tensor: Any) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{arg} must be a 1-D torch.Tensor; got {shape}")
    return tensor


# ------------------------------------------------------------------------------------ sharding


def shard_sizes(numel: int, world_size: int) -> list[int]:
    """Elements per rank when ``numel`` elements are split over ``world_size`` ranks
    (sum = numel)."""
    check_int("numel", numel, minimum=0)
    check_int("world_size", world_size)
    base, extra = divmod(numel, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def shard_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` element offsets of each rank's shard of a flat tensor of ``numel``."""
    bounds, start = [], 0
    for size in shard_sizes(numel, world_size):
        bounds.append((start, start + size))
        start += size
    return bounds


def _group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def all_gather_flat(shard: torch.Tensor, sizes: Sequence[int] | None = None,
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's 1-D ``shard`` in rank order: returns shape (sum(sizes),).

    ``sizes[r]`` is rank r's shard length (default: all equal to this rank's). Uneven shards are
    padded to the longest, because gloo's all_gather needs equal sizes.
    """
    _check_flat("shard", shard)
    world_size = _group_size(group)
    if sizes is None:
        sizes = [shard.numel()] * world_size
    sizes = [int(s) for s in sizes]
    if len(sizes) != world_size or any(s < 0 for s in sizes):
        raise ValueError(f"sizes must list {world_size} non-negative shard lengths; got {sizes}")
    rank = dist.get_rank(group)
    if sizes[rank] != shard.numel():
        raise ValueError(f"sizes[{rank}] = {sizes[rank]} but this rank's shard has "
                         f"{shard.numel()} elements")
    longest = max(sizes) if sizes else 0
    padded = shard.new_zeros(longest)  # (longest,)
    padded[: shard.numel()] = shard
    gathered = shard.new_empty(world_size * longest)  # (world_size * longest,)
    dist.all_gather_single(gathered, padded, group=group)
    rows = gathered.view(world_size, longest)  # (world_size, longest)
    return torch.cat([rows[r, : sizes[r]] for r in range(world_size)])


def reduce_scatter_flat(full: torch.Tensor, op: str = "sum", sizes: Sequence[int] | None = None,
                        group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's shard of the element-wise reduction of every rank's 1-D ``full`` tensor.

    ``full`` has shape (N,), the same on every rank; the result has shape (sizes[rank],), with
    ``sizes`` defaulting to :func:`shard_sizes` (N, world_size). ``op``: sum, avg, max or min.
    """
    _check_flat("full", full)
    reduce_op = one_of("op", op, REDUCE_OPS)
    world_size = _group_size(group)
    if sizes is None:
        sizes = shard_sizes(full.numel(), world_size)
    sizes = [int(s) for s in sizes]
    if len(sizes) != world_size or any(s < 0 for s in sizes) or sum(sizes) != full.numel():
        raise ValueError(f"sizes must list {world_size} non-negative shard lengths summing to "
                         f"{full.numel()}; got {sizes}")
    longest = max(sizes)
    padded = full.new_zeros(world_size, longest)  # (world_size, longest)
    for r, piece in enumerate(torch.split(full, sizes)):
        padded[r, : sizes[r]] = piece
    out = full.new_empty(longest)  # (longest,)
    dist.reduce_scatter_single(out, padded.view(-1), op=reduce_op, group=group)
    return out[: sizes[dist.get_rank(group)]].clone()


# ------------------------------------------------------------------------- inputs and reference


def example_inputs(name: str, world_size: int, numel: int = 2) -> list[torch.Tensor]:
    """Readable per-rank inputs: rank r holds 10*r + 1, 10*r + 2, ... (the tens digit is the rank).

    Shape (numel,) per rank, except reduce_scatter: (numel * world_size,), so each rank's output
    shard has ``numel`` elements, mirroring all_gather.
    """
    one_of("name", name, COLLECTIVES)
    check_int("world_size", world_size)
    check_int("numel", numel)
    length = numel * world_size if name == "reduce_scatter" else numel
    return [torch.arange(1, length + 1, dtype=torch.float32) + 10 * r for r in range(world_size)]


def reference(name: str, inputs: Sequence[torch.Tensor], root: int = 0,
              op: str = "sum") -> list[torch.Tensor | None]:
    """What each rank should hold after the collective, computed in one process.

    ``inputs[r]`` is rank r's 1-D tensor. For ``reduce`` non-root entries are None (their buffers
    are scratch space afterwards). ``op`` applies to the reducing collectives.
    """
    one_of("name", name, COLLECTIVES)
    if not inputs:
        raise ValueError("inputs must hold one tensor per rank; got none")
    world_size = len(inputs)
    check_index("root", root, world_size)
    one_of("op", op, REDUCE_OPS)
    for r, t in enumerate(inputs):
        _check_flat(f"inputs[{r}]", t)
    if name in ("all_reduce", "reduce", "reduce_scatter"):
        if len({t.numel() for t in inputs}) != 1:
            raise ValueError(f"inputs must all have the same length for {name}")
        stacked = torch.stack(list(inputs))  # (world_size, N)
        combined = {"sum": stacked.sum(0), "avg": stacked.mean(0),
                    "max": stacked.max(0).values, "min": stacked.min(0).values}[op]  # (N,)
        if name == "all_reduce":
            return [combined.clone() for _ in range(world_size)]
        if name == "reduce":
            return [combined.clone() if r == root else None for r in range(world_size)]
        bounds = shard_bounds(combined.numel(), world_size)
        return [combined[a:b].clone() for a, b in bounds]
    if name == "broadcast":
        return [inputs[root].clone() for _ in range(world_size)]
    gathered = torch.cat(list(inputs))  # all_gather: (sum of lengths,)
    return [gathered.clone() for _ in range(world_size)]


# -------------------------------------------------------------------------------------- workers


def hello(rank: int, world_size: int) -> str:
    """Smallest worker: print and return a greeting; shows the process group is up."""
    backend = dist.get_backend()
    message = f"hello from rank {rank} of {world_size} ({backend})"
    print(message)
    return message


def _run_on_this_rank(name: str, x: torch.Tensor, rank: int, world_size: int, root: int,
                      op: str, sizes: Sequence[int] | None = None) -> torch.Tensor:
    """Run collective ``name`` on this rank's 1-D input ``x``; return what the rank holds after."""
    if name == "all_reduce":
        y = x.clone()
        dist.all_reduce(y, op=REDUCE_OPS[op])
        return y
    if name == "reduce":
        y = x.clone()
        dist.reduce(y, dst=root, op=REDUCE_OPS[op])
        return y
    if name == "broadcast":
        y = x.clone()
        dist.broadcast(y, src=root)
        return y
    if name == "all_gather":
        return all_gather_flat(x, sizes=sizes)
    return reduce_scatter_flat(x, op=op)


def collective_worker(rank: int, world_size: int, name: str, inputs: Sequence[torch.Tensor],
                      root: int = 0, op: str = "sum") -> tuple[list[float], list[float]]:
    """Run collective ``name`` once; ``inputs[rank]`` is this rank's tensor.

    Returns ``(before, after)`` as lists of floats; prints one line per rank.
    """
    one_of("name", name, COLLECTIVES)
    x = backend.to_device(inputs[rank])
    sizes = [t.numel() for t in inputs] if name == "all_gather" else None
    y = _run_on_this_rank(name, x, rank, world_size, root, op, sizes)
    before, after = x.tolist(), y.tolist()
    note = " (scratch)" if name == "reduce" and rank != root else ""
    print(f"{name}: before {_fmt(before)} -> after {_fmt(after)}{note}")
    return before, after


def all_gather_worker(rank: int, world_size: int, shards: Sequence[torch.Tensor]) -> list[float]:
    """This rank contributes ``shards[rank]`` (1-D); returns the concatenation of all shards.

    Workers return plain lists: a tensor returned through the launcher can race its rank's exit.
    """
    return all_gather_flat(backend.to_device(shards[rank]),
                           sizes=[s.numel() for s in shards]).tolist()


def reduce_scatter_worker(rank: int, world_size: int, fulls: Sequence[torch.Tensor],
                          op: str = "sum") -> list[float]:
    """This rank contributes ``fulls[rank]`` (shape (N,)); returns its shard of the reduction."""
    return reduce_scatter_flat(backend.to_device(fulls[rank]), op=op).tolist()


def run_collective(name: str, world_size: int = 2, inputs: Sequence[torch.Tensor] | None = None,
                   root: int = 0, op: str = "sum", timeout_s: float = 60.0,
                   show_output: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run one collective on ``world_size`` real gloo ranks; return ``(before, after)`` by rank.

    ``inputs`` defaults to :func:`example_inputs`; the launcher prints each rank's line.
    """
    one_of("name", name, COLLECTIVES)
    check_int("world_size", world_size)
    check_index("root", root, world_size)
    one_of("op", op, REDUCE_OPS)
    if inputs is None:
        inputs = example_inputs(name, world_size)
    if len(inputs) != world_size:
        raise ValueError(f"inputs must hold world_size={world_size} tensors; got {len(inputs)}")
    for r, t in enumerate(inputs):
        _check_flat(f"inputs[{r}]", t)
    results = launch.run(collective_worker, world_size, name, list(inputs), root, op,
                         timeout_s=timeout_s, show_output=show_output)
    before = [torch.tensor(b) for b, _ in results]
    after = [torch.tensor(a) for _, a in results]
    return before, after


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


# -------------------------------------------------------------------------------------- picture


def provenance(name: str, before: Sequence[torch.Tensor],
               root: int = 0) -> list[list[tuple[int, ...]]]:
    """For each rank and each output element, the ranks whose input it came from.

    An empty tuple marks scratch (non-root ranks after ``reduce``).
    """
    one_of("name", name, COLLECTIVES)
    world_size = len(before)
    check_index("root", root, world_size)
    everyone = tuple(range(world_size))
    lengths = [int(t.numel()) for t in before]
    if name == "all_reduce":
        return [[everyone] * lengths[r] for r in range(world_size)]
    if name == "reduce":
        return [[everyone if r == root else ()] * lengths[r] for r in range(world_size)]
    if name == "broadcast":
        return [[(root,)] * lengths[root] for _ in range(world_size)]
    if name == "all_gather":
        row = [(src,) for src in range(world_size) for _ in range(lengths[src])]
        return [list(row) for _ in range(world_size)]
    sizes = shard_sizes(lengths[0], world_size)
    return [[everyone] * sizes[r] for r in range(world_size)]


def draw_collective(name: str, before: Sequence[torch.Tensor] | None = None,
                    after: Sequence[torch.Tensor | None] | None = None, *, world_size: int = 2,
                    root: int = 0, ax: Any = None, max_cells: int = 8) -> Any:
    """Draw one collective: a row per rank, its tensor before (left) and after (right).

    Each cell shows a value and is coloured by the rank it came from (rank r takes colour r of
    the active colour cycle, the course style's after :func:`course_utils.style.use`); a cell
    striped in several colours was reduced from those ranks; grey is scratch. The title names
    the collective in words ("all-reduce: ..."). ``before``/``after`` hold one 1-D
    tensor per rank (e.g. from :func:`run_collective`); if omitted, :func:`example_inputs` and
    :func:`reference` are drawn for ``world_size`` ranks. Rows longer than ``max_cells`` are cut
    with an ellipsis. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    one_of("name", name, COLLECTIVES)
    check_int("max_cells", max_cells, minimum=2)
    if before is None:
        check_int("world_size", world_size)
        before = example_inputs(name, world_size)
    world_size = len(before)
    if world_size < 1:
        raise ValueError("before must hold one 1-D tensor per rank; got none")
    check_index("root", root, world_size)
    for r, t in enumerate(before):
        _check_flat(f"before[{r}]", torch.as_tensor(t))
    if after is None:
        after = reference(name, [torch.as_tensor(t) for t in before], root=root)
    if len(after) != world_size:
        raise ValueError(f"after must hold {world_size} entries (one per rank); got {len(after)}")
    origin = provenance(name, before, root)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color") or ["#4c72b0", "#dd8452"]

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 * world_size + 1.0))
    left_width = min(max(int(torch.as_tensor(t).numel()) for t in before), max_cells)
    gap = 1.6
    right_x = left_width + gap

    def row(x0: float, y: float, values: list[float] | None,
            sources: list[tuple[int, ...]]) -> None:
        n = len(sources)
        shown = n if n <= max_cells else max_cells - 1
        for i in range(shown):
            src = sources[i]
            if not src or values is None:
                ax.add_patch(Rectangle((x0 + i, y), 1, 0.8, facecolor="0.88", edgecolor="0.4"))
            else:
                width = 1 / len(src)
                for k, s in enumerate(src):
                    ax.add_patch(Rectangle((x0 + i + k * width, y), width, 0.8, linewidth=0,
                                           facecolor=colors[s % len(colors)], alpha=0.45))
                ax.add_patch(Rectangle((x0 + i, y), 1, 0.8, fill=False, edgecolor="0.2"))
            text = "?" if values is None else f"{values[i]:.3g}"
            ax.text(x0 + i + 0.5, y + 0.4, text, ha="center", va="center", fontsize=10,
                    color="0.45" if not src else "black")
        if shown < n:
            ax.text(x0 + shown + 0.5, y + 0.4, "…", ha="center", va="center", fontsize=11)

    for r in range(world_size):
        y = world_size - 1 - r
        ax.text(-0.25, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=10)
        b = torch.as_tensor(before[r]).tolist()
        row(0, y, b, [(r,)] * len(b))
        a = after[r]
        a_values = None if a is None else torch.as_tensor(a).tolist()
        row(right_x, y, a_values, origin[r])
    ax.annotate("", xy=(right_x - 0.25, world_size / 2), xytext=(left_width + 0.25, world_size / 2),
                arrowprops={"arrowstyle": "->", "lw": 1.5})
    ax.text(left_width / 2, world_size + 0.05, "before", ha="center", va="bottom", fontsize=10)
    right_width = min(max(len(o) for o in origin), max_cells)
    ax.text(right_x + right_width / 2, world_size + 0.05, "after", ha="center", va="bottom",
            fontsize=10)
    _ = ax.set_xlim(-1.6, right_x + right_width + 0.2)
    _ = ax.set_ylim(-0.2, world_size + 0.6)
    _ = ax.set_title(f"{_WORDS[name]}: {_SUMMARY[name]}", fontsize=11)
    ax.set_axis_off()
    return ax


if __name__ == "__main__":
    # runs all_reduce on the example:
    # torchrun --standalone --nproc-per-node N -m course_utils.collectives.primitives
    import os

    _ws = int(os.environ.get("WORLD_SIZE", "2"))
    launch.torchrun_main(collective_worker, "all_reduce", example_inputs("all_reduce", _ws))
