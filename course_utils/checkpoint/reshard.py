"""Load-time resharding with DCP: save on one mesh, load on another, and the bytes each rank moves.

A two-layer MLP and AdamW's moments are saved from **DP 4** (FSDP2, ZeRO-3: every tensor split
by rows over 4 ranks) and loaded, on the same 4 ranks, into two other layouts:

* **DP 2 x TP 2**: DTensor tensor parallelism (the first layer column-parallel, the second
  row-parallel), then FSDP2 over the "dp" half of a 2 x 2 ``init_device_mesh``;
* **DP 4, ZeRO-1**: the weights whole on every rank (as in DDP), Adam's moments split by rows.

DCP stores each saved piece (one rank's chunk of one tensor) as one ``torch.save``d tensor. To
load, each rank asks for every saved piece that overlaps a piece it holds, reads **the whole
saved piece** and keeps the overlap (``FileSystemReader.read_data`` in
``torch/distributed/checkpoint/filesystem.py``: ``torch.load`` of the piece, then
``narrow_tensor_by_index``). So the bytes a rank reads follow from the two layouts alone
(:func:`predicted_bytes`), and :func:`reshard_worker` measures them: the size of each rank's
file for writes, the pieces its reader fetched for reads (:func:`counting_reader`).

Run under torchrun (4 ranks; with 2, the same on DP 2, DP 1 x TP 2 and ZeRO-1 on 2)::

    torchrun --standalone --nproc-per-node 4 -m course_utils.checkpoint.reshard
"""

from __future__ import annotations

import io
import math
import os
from typing import Any

import torch
from torch import nn

from course_utils.models.toy import toy_mlp
from course_utils.runtime import backend
from course_utils.runtime.validate import one_of

__all__ = ["LAYOUTS", "SIZES", "build", "boxes", "serialized_bytes", "predicted_bytes",
           "counting_reader", "reshard_worker", "table"]

SIZES = {"0.weight": (128, 32), "0.bias": (128,), "2.weight": (32, 128), "2.bias": (32,)}
"""The MLP's tensors (out, in): Linear(32, 128), ReLU, Linear(128, 32)."""

LAYOUTS = ("DP 4 (ZeRO-3)", "DP 2 x TP 2", "DP 4, ZeRO-1")


def build(seed: int = 0) -> nn.Sequential:
    """The MLP, seeded: Linear(32, 128), ReLU, Linear(128, 32)
    (:func:`course_utils.models.toy.toy_mlp`)."""
    return toy_mlp((32, 128, 32), seed=seed, activation="relu")


def _rows(n: int, parts: int, k: int) -> tuple[int, int]:
    size = math.ceil(n / parts)
    return min(k * size, n), min((k + 1) * size, n)


def boxes(layout: str, name: str, rank: int, world: int = 4) -> list[tuple[tuple[int, int], ...]]:
    """The pieces of tensor ``name`` (a weight or a moment of it) rank ``rank`` holds in
    ``layout`` on ``world`` ranks (the names say 4; "DP 2 x TP 2" is DP world/2 x TP 2): each a
    ((start, stop) per dimension) box of the whole tensor."""
    one_of("layout", layout, LAYOUTS)
    shape = SIZES[name.split(".exp_avg")[0]]
    whole = tuple((0, n) for n in shape)
    if layout == LAYOUTS[0]:
        return [(_rows(shape[0], world, rank),) + whole[1:]]
    if layout == LAYOUTS[2]:
        return [whole] if name.endswith("weight") or name.endswith("bias") else \
            [(_rows(shape[0], world, rank),) + whole[1:]]
    dp_size = world // 2
    dp, tp = divmod(rank, 2)                 # the (world/2) x 2 mesh, ("dp", "tp"), row-major
    param = name.split(".exp_avg")[0]
    if param.startswith("0."):               # column-parallel: rows split by TP, then by DP
        lo, hi = _rows(shape[0], 2, tp)
        start, stop = _rows(hi - lo, dp_size, dp)
        return [((lo + start, lo + stop),) + whole[1:]]
    rows = _rows(shape[0], dp_size, dp)      # row-parallel: columns by TP; rows by DP (FSDP2)
    if param == "2.weight":
        return [(rows, _rows(shape[1], 2, tp))]
    return [(rows,)]                         # its bias: whole on both TP ranks


def _key_names() -> list[str]:
    """Every tensor saved: each weight and its two Adam moments."""
    return [n for p in SIZES for n in (p, f"{p}.exp_avg", f"{p}.exp_avg_sq")]


def serialized_bytes(shape: tuple[int, ...]) -> int:
    """Bytes of one float32 piece of ``shape`` as DCP stores it (one ``torch.save``d tensor:
    the data plus about 1.5 KB of zip records)."""
    buffer = io.BytesIO()
    torch.save(torch.zeros(shape), buffer)
    return len(buffer.getvalue())


def _box_shape(box) -> tuple[int, ...]:
    return tuple(stop - start for start, stop in box)


def _overlaps(a, b) -> bool:
    return all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(a, b))


def predicted_bytes(layout: str, rank: int, world: int = 4) -> dict[str, int]:
    """From the layouts alone: the bytes rank ``rank`` writes when saving from DP ``world``,
    the saved pieces it fetches and their bytes when loading into ``layout`` (every saved piece
    that overlaps a piece it holds, whole), and the bytes it keeps."""
    written = sum(serialized_bytes(_box_shape(boxes(LAYOUTS[0], n, rank, world)[0]))
                  for n in _key_names() if math.prod(_box_shape(
                      boxes(LAYOUTS[0], n, rank, world)[0])))
    read = pieces = kept = 0
    for name in _key_names():
        saved = [boxes(LAYOUTS[0], name, r, world)[0] for r in range(world)]
        for mine in boxes(layout, name, rank, world):
            kept += 4 * math.prod(_box_shape(mine))
            for piece in saved:
                if _overlaps(mine, piece):
                    read += serialized_bytes(_box_shape(piece))
                    pieces += 1
    return {"written": written, "read": read, "pieces": pieces, "kept": kept}


def counting_reader(path: str):
    """DCP's ``FileSystemReader`` for ``path``, counting the saved pieces it fetches:
    ``.bytes_read`` (their stored bytes) and ``.pieces``."""
    from torch.distributed.checkpoint import FileSystemReader

    class CountingReader(FileSystemReader):
        def read_data(self, plan, planner):
            for item in plan.items:
                self.bytes_read += self.storage_data[item.storage_index].length
                self.pieces += 1
            return super().read_data(plan, planner)

    reader = CountingReader(path)
    reader.bytes_read = reader.pieces = 0
    return reader


# ------------------------------------------------------------------------------------ the worker


def _flat_state(model: nn.Module, optimizer) -> dict[str, Any]:
    """{name: tensor} of every weight and moment (as DCP keys them here)."""
    state = {}
    for name, p in model.named_parameters():
        state[name] = p
        for key in ("exp_avg", "exp_avg_sq"):
            state[f"{name}.{key}"] = optimizer.state[p][key]
    return state


def _whole(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return backend.to_cpu(t.full_tensor().detach() if isinstance(t, DTensor) else t.detach())


def _loss(model: nn.Module) -> float:
    """The MLP's mean squared output on a fixed batch (forward only)."""
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(7))
    return float((model(backend.to_device(x)) ** 2).mean())


def reshard_worker(rank: int, world_size: int, path: str, steps: int = 2) -> dict[str, Any]:
    """Collective on 4 ranks (or any even number D: DP D, DP D/2 x TP 2, ZeRO-1 on D): train
    the MLP ``steps`` AdamW steps on DP 4 (FSDP2), save to ``path``, then load into DP 2 x TP 2
    and DP 4 ZeRO-1 models built from another seed.
    Returns, per layout: bytes written or read and pieces fetched, whether every whole weight
    and moment equals the saved one bit for bit, and the forward loss on a fixed batch."""
    import logging
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)  # (strided gathers)
    if world_size % 2:
        raise ValueError(f"world_size must be even (DP D/2 x TP 2); got {world_size}")
    dev = backend.device()
    dp4 = init_device_mesh(dev.type, (world_size,))
    model = build(0)
    fully_shard(model, mesh=dp4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        (model(torch.randn(4, 32, generator=gen).to(dev)) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    saved = _flat_state(model, opt)
    whole = {k: _whole(v).clone() for k, v in saved.items()}
    dcp.save(saved, checkpoint_id=path)
    out = {LAYOUTS[0]: {"written": os.path.getsize(os.path.join(path, f"__{rank}_0.distcp")),
                        "loss": _loss(model), "equal": True}}

    mesh = init_device_mesh(dev.type, (world_size // 2, 2), mesh_dim_names=("dp", "tp"))
    tp_model = build(1)                                     # other weights: all must be loaded
    parallelize_module(tp_model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(tp_model, mesh=mesh["dp"])
    tp_opt = torch.optim.AdamW(tp_model.parameters(), lr=1e-2)
    for p in tp_model.parameters():                         # Adam's moments, laid out as p
        tp_opt.state[p] = {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    zero1_model = build(2).to(dev)                          # ZeRO-1: whole weights, moments split
    zero1_state = {}
    for name, p in zero1_model.named_parameters():
        zero1_state[name] = p.data
        for key in ("exp_avg", "exp_avg_sq"):
            zero1_state[f"{name}.{key}"] = distribute_tensor(torch.zeros_like(p.data), dp4,
                                                             [Shard(0)])
    for layout, state, net in ((LAYOUTS[1], _flat_state(tp_model, tp_opt), tp_model),
                               (LAYOUTS[2], zero1_state, zero1_model)):
        reader = counting_reader(path)
        dcp.load(state, storage_reader=reader)
        equal = all(torch.equal(_whole(state[k]), whole[k]) for k in whole)
        out[layout] = {"read": reader.bytes_read, "pieces": reader.pieces, "equal": equal,
                       "loss": _loss(net)}
    return out


def table(results: list[dict[str, Any]]) -> str:
    """Bytes per rank on 4 ranks, predicted from the layouts and measured, as a text table."""
    lines = ["rank   writes (DP 4)        reads into DP 2 x TP 2     reads into DP 4, ZeRO-1",
             "       predicted measured   pieces predicted measured   pieces predicted measured"]
    for rank, r in enumerate(results):
        row = f"{rank:>4} {predicted_bytes(LAYOUTS[1], rank)['written']:>10,} " \
              f"{r[LAYOUTS[0]]['written']:>8,}"
        for layout in LAYOUTS[1:]:
            want = predicted_bytes(layout, rank)
            row += f"   {r[layout]['pieces']:>6} {want['read']:>9,} {r[layout]['read']:>8,}"
        lines.append(row)
    return "\n".join(lines)


def _torchrun_demo(rank: int, world_size: int) -> bool:
    """Save on DP D, load into both layouts; True when every byte count is as predicted."""
    from course_utils.checkpoint.dcp import job_folder

    with job_folder("course-reshard-") as folder:
        r = reshard_worker(rank, world_size, os.path.join(folder, "ckpt"))
        return all(r[lay]["read"] == predicted_bytes(lay, rank, world_size)["read"]
                   and r[lay]["equal"] for lay in LAYOUTS[1:])


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(_torchrun_demo)
